//! The admin HTTP port: `/healthz`, `/readyz`, `/metrics`. Deliberately tiny (HTTP/1.0
//! style, one request per connection): it serves probes and scrapes, not traffic.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tracing::debug;

use crate::Registry;

/// Answers `/readyz`: `Ok(())` when ready, else the reason (sent as the 503 body).
pub type Readiness = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// A JSON body computed on request.
pub type JsonFuture = std::pin::Pin<Box<dyn std::future::Future<Output = String> + Send>>;

/// Node-specific JSON endpoints: `Some(body)` for a path the node serves.
pub type Routes = Arc<dyn Fn(&str) -> Option<JsonFuture> + Send + Sync>;

/// Serves the admin endpoints on `listener` until the task is dropped.
pub async fn serve_admin(listener: TcpListener, registry: Registry, readiness: Readiness) {
    serve_admin_with(listener, registry, readiness, Arc::new(|_: &str| None)).await
}

/// [`serve_admin`] plus node-specific JSON endpoints.
pub async fn serve_admin_with(
    listener: TcpListener,
    registry: Registry,
    readiness: Readiness,
    routes: Routes,
) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let registry = registry.clone();
        let readiness = Arc::clone(&readiness);
        let routes = Arc::clone(&routes);
        tokio::spawn(async move {
            let mut request = [0u8; 1024];
            let mut filled = 0;
            // Read until the end of the request line; admin clients send tiny requests.
            while filled < request.len() && !request[..filled].contains(&b'\n') {
                match tokio::time::timeout(
                    std::time::Duration::from_secs(2),
                    stream.read(&mut request[filled..]),
                )
                .await
                {
                    Ok(Ok(n)) if n > 0 => filled += n,
                    _ => return,
                }
            }
            let line = String::from_utf8_lossy(&request[..filled]);
            let path = line.split_whitespace().nth(1).unwrap_or("/");
            let (status, content_type, body) = match path {
                "/healthz" => ("200 OK", "text/plain", "ok\n".to_string()),
                "/readyz" => match readiness() {
                    Ok(()) => ("200 OK", "text/plain", "ready\n".to_string()),
                    Err(why) => ("503 Service Unavailable", "text/plain", format!("{why}\n")),
                },
                "/metrics" => ("200 OK", "text/plain; version=0.0.4", registry.render()),
                other => match routes(other) {
                    Some(body) => ("200 OK", "application/json", body.await),
                    None => ("404 Not Found", "text/plain", "not found\n".to_string()),
                },
            };
            let head = format!(
                "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
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
            }
        });
    }
}
