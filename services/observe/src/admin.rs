//! The admin HTTP port: `/healthz`, `/readyz`, `/metrics`, plus whatever pages a node adds
//! (a shard's `/players` and `/density`, a gateway's live map). Deliberately tiny (one
//! request per connection, `connection: close`): it serves probes, scrapes and an
//! operator's browser, not traffic.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::debug;

use crate::Registry;

/// Answers `/readyz`: `Ok(())` when ready, else the reason (sent as the 503 body).
pub type Readiness = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// What a node-specific route answers (always `200 OK`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub content_type: &'static str,
    pub body: String,
}

impl Reply {
    pub fn json(body: String) -> Self {
        Reply { content_type: "application/json", body }
    }

    pub fn html(body: String) -> Self {
        Reply { content_type: "text/html; charset=utf-8", body }
    }
}

/// A route's answer, computed on request.
pub type ReplyFuture = Pin<Box<dyn Future<Output = Reply> + Send>>;

/// Node-specific routes: `Some(answer)` for a path (query string removed) the node serves.
pub type Routes = Arc<dyn Fn(&str) -> Option<ReplyFuture> + Send + Sync>;

/// How long a client may take to send its request line, and how long the rest of its
/// request is drained after the answer.
const CLIENT_WITHIN: Duration = Duration::from_secs(2);
/// Longest request line read; longer ones get what the truncated line names (or a 404).
const REQUEST_LINE_MAX: usize = 1024;

/// Serves the admin endpoints on `listener` until the task is dropped.
pub async fn serve_admin(listener: TcpListener, registry: Registry, readiness: Readiness) {
    serve_admin_with(listener, registry, readiness, Arc::new(|_: &str| None)).await
}

/// [`serve_admin`] plus node-specific routes.
pub async fn serve_admin_with(
    listener: TcpListener,
    registry: Registry,
    readiness: Readiness,
    routes: Routes,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let registry = registry.clone();
        let readiness = Arc::clone(&readiness);
        let routes = Arc::clone(&routes);
        tokio::spawn(answer(stream, registry, readiness, routes));
    }
}

async fn answer(mut stream: TcpStream, registry: Registry, readiness: Readiness, routes: Routes) {
    let mut request = [0u8; REQUEST_LINE_MAX];
    let mut filled = 0;
    // Read until the end of the request line: nothing after it changes the answer.
    while filled < request.len() && !request[..filled].contains(&b'\n') {
        match tokio::time::timeout(CLIENT_WITHIN, stream.read(&mut request[filled..])).await {
            Ok(Ok(n)) if n > 0 => filled += n,
            _ => return,
        }
    }
    let line = String::from_utf8_lossy(&request[..filled]);
    let target = line.split_whitespace().nth(1).unwrap_or("/");
    let path = target.split('?').next().unwrap_or(target);
    let (status, content_type, body) = match path {
        "/healthz" => ("200 OK", "text/plain", "ok\n".to_string()),
        "/readyz" => match readiness() {
            Ok(()) => ("200 OK", "text/plain", "ready\n".to_string()),
            Err(why) => ("503 Service Unavailable", "text/plain", format!("{why}\n")),
        },
        "/metrics" => ("200 OK", "text/plain; version=0.0.4", registry.render()),
        other => match routes(other) {
            Some(reply) => {
                let reply = reply.await;
                ("200 OK", reply.content_type, reply.body)
            }
            None => ("404 Not Found", "text/plain", "not found\n".to_string()),
        },
    };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\
         cache-control: no-store\r\nconnection: close\r\n\r\n",
        body.len()
    );
    if let Err(error) = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    }
    .await
    {
        debug!(%error, "admin client went away");
        return;
    }
    // Read what is left of the request (a browser's headers) before closing: closing a
    // socket with unread input sends a reset, which can destroy the answer in flight.
    let mut rest = [0u8; 1024];
    let _ = tokio::time::timeout(CLIENT_WITHIN, async {
        while let Ok(n) = stream.read(&mut rest).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}
