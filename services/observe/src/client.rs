//! The smallest HTTP client, for one node reading another's admin port (`meridian status`
//! asking shards for `/readyz`, a gateway's live map asking shards for `/density`).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest admin answer read; a bigger one is cut off and parsed as far as it goes.
const ANSWER_MAX: u64 = 4 << 20;

/// GETs `path` from `addr` (host:port); the status code and the body, if the node answered
/// within `within`.
pub async fn admin_get(addr: &str, path: &str, within: Duration) -> Option<(u16, String)> {
    admin_get_as(addr, path, within, None).await
}

/// [`admin_get`] of a private page, presenting the cluster's admin token.
pub async fn admin_get_as(
    addr: &str,
    path: &str,
    within: Duration,
    token: Option<&str>,
) -> Option<(u16, String)> {
    let authorization =
        token.map(|token| format!("authorization: Bearer {token}\r\n")).unwrap_or_default();
    tokio::time::timeout(within, async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        // HTTP/1.0: the answer ends where the connection does.
        let request = format!("GET {path} HTTP/1.0\r\n{authorization}\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.take(ANSWER_MAX).read_to_end(&mut response).await.ok()?;
        let text = String::from_utf8_lossy(&response);
        let (head, body) = text.split_once("\r\n\r\n")?;
        let code = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, body.to_string()))
    })
    .await
    .ok()
    .flatten()
}
