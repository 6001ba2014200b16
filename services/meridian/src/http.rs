//! The smallest HTTP client: GET a path on a node's admin port.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// GET `path` on `addr`; the status code, if the node answered within a second.
pub async fn status(addr: &str, path: &str) -> Option<u16> {
    let connect = tokio::net::TcpStream::connect(addr);
    let mut stream = tokio::time::timeout(Duration::from_secs(1), connect).await.ok()?.ok()?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes()).await.ok()?;
    let mut response = Vec::new();
    let read = stream.read_to_end(&mut response);
    tokio::time::timeout(Duration::from_secs(1), read).await.ok()?.ok()?;
    let head = String::from_utf8_lossy(&response);
    head.split_whitespace().nth(1)?.parse().ok()
}
