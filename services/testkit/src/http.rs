//! A minimal HTTP/1.0 GET for the admin ports (`/healthz`, `/readyz`, `/metrics`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{bail, Context};

/// GETs `path` from `addr` and returns the status code and the body.
///
/// HTTP/1.0 so the server answers without chunked encoding and closes the connection, which
/// is how we know the body is complete.
pub fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    http_get_within(addr, path, Duration::from_secs(5))
}

/// [`http_get`], failing if connecting, sending or reading any part takes longer than
/// `timeout` (a probe's timeout: the chart's are 2 s).
pub fn http_get_within(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> anyhow::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("connecting to admin port {addr} for GET {path}"))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    // One write, so a server that reads the request in one go sees all of it.
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .with_context(|| format!("sending GET {path} to {addr}"))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .with_context(|| format!("reading the answer to GET {path} from {addr}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status_line = head.lines().next().unwrap_or("");
    let mut parts = status_line.split_whitespace();
    let code = match (parts.next(), parts.next().map(str::parse::<u16>)) {
        (Some(version), Some(Ok(code))) if version.starts_with("HTTP/") => code,
        _ => bail!("GET {path} on {addr}: not an HTTP answer: {status_line:?}"),
    };
    Ok((code, body.to_string()))
}
