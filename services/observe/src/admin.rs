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

#[cfg(test)]
mod tests {
    use super::*;

    async fn serve() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let registry = Registry::default();
        registry.counter("meridian_test_total", "A test counter.", &[]).add(2);
        let readiness: Readiness = Arc::new(|| Err("not registered in etcd".into()));
        let routes: Routes = Arc::new(|path: &str| {
            let reply: ReplyFuture = match path {
                "/page" => Box::pin(async { Reply::html("<p>hi</p>".into()) }),
                _ => return None,
            };
            Some(reply)
        });
        tokio::spawn(serve_admin_with(listener, registry, readiness, routes));
        addr
    }

    /// Sends `request` as a browser would (all headers at once) and reads the whole answer.
    async fn ask(addr: &str, request: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test]
    async fn answers_probes_metrics_and_routes_with_their_content_types() {
        let addr = serve().await;
        let headers =
            "Host: x\r\nUser-Agent: a browser with a long header line\r\nAccept: */*\r\n\r\n";
        let page = ask(&addr, &format!("GET /page?t=1 HTTP/1.1\r\n{headers}")).await;
        assert!(page.starts_with("HTTP/1.1 200 OK\r\n"), "{page}");
        assert!(page.contains("content-type: text/html; charset=utf-8\r\n"), "{page}");
        assert!(page.ends_with("\r\n\r\n<p>hi</p>"), "{page}");
        let ready = ask(&addr, "GET /readyz HTTP/1.0\r\n\r\n").await;
        assert!(ready.starts_with("HTTP/1.1 503 Service Unavailable"), "{ready}");
        assert!(ready.ends_with("not registered in etcd\n"), "{ready}");
        let metrics = ask(&addr, "GET /metrics HTTP/1.0\r\n\r\n").await;
        assert!(metrics.ends_with("meridian_test_total 2\n"), "{metrics}");
        let missing = ask(&addr, "GET /nothing HTTP/1.0\r\n\r\n").await;
        assert!(missing.starts_with("HTTP/1.1 404 Not Found"), "{missing}");
        let garbage = ask(&addr, "\u{1}\u{2}\n").await;
        assert!(garbage.starts_with("HTTP/1.1 404"), "{garbage}");
    }
}
