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

/// Who may read a node's own pages (everything but `/healthz`, `/readyz`, `/metrics` and
/// the paths named public): they name players and addresses.
#[derive(Clone, Debug)]
pub enum Private {
    /// Anyone (dev mode without a token).
    Open,
    /// Whoever presents the token: `Authorization: Bearer <token>`, or `?token=<token>` in
    /// the URL for a browser.
    Token(Arc<str>),
    /// Nobody: no token is configured outside dev mode.
    Closed,
}

impl Private {
    /// `Token` if a token is given, else `Open` in dev mode and `Closed` otherwise.
    pub fn from_config(token: Option<&str>, dev: bool) -> Private {
        match token.filter(|t| !t.is_empty()) {
            Some(token) => Private::Token(Arc::from(token)),
            None if dev => Private::Open,
            None => Private::Closed,
        }
    }

    /// The token to present to another node's private pages, if any.
    pub fn token(&self) -> Option<&str> {
        match self {
            Private::Token(token) => Some(token),
            _ => None,
        }
    }
}

/// How the admin port guards a node's pages.
#[derive(Clone, Debug)]
pub struct Access {
    pub private: Private,
    /// Node pages anyone may read (the game's `/play` page).
    pub public: &'static [&'static str],
    /// Counts refused requests (`meridian_admin_refused_total`).
    refused: Arc<crate::metrics::Counter>,
}

impl Access {
    pub fn new(private: Private, public: &'static [&'static str], registry: &Registry) -> Access {
        let refused = registry.counter(
            "meridian_admin_refused_total",
            "Admin requests for private pages (players, addresses) refused: no or a wrong \
             bearer token, or no --admin-token configured outside dev mode.",
            &[],
        );
        Access { private, public, refused }
    }

    /// `None` if the request may read `path`, else the refusal's status and body.
    fn refuses(&self, path: &str, query: &str, head: &str) -> Option<(&'static str, String)> {
        if self.public.contains(&path) {
            return None;
        }
        let refusal = match &self.private {
            Private::Open => return None,
            Private::Token(token) => {
                let presented = bearer(head).or_else(|| query_token(query));
                if presented.is_some_and(|p| same(p.as_bytes(), token.as_bytes())) {
                    return None;
                }
                ("401 Unauthorized", "this page names players: send the node's admin token (Authorization: Bearer, or ?token=)\n")
            }
            Private::Closed => (
                "403 Forbidden",
                "this page names players: it is served only with --admin-token (MERIDIAN_ADMIN_TOKEN) set\n",
            ),
        };
        self.refused.inc();
        Some((refusal.0, refusal.1.to_string()))
    }
}

/// The token of an `Authorization: Bearer` header in a request head.
fn bearer(head: &str) -> Option<&str> {
    head.lines().skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        if !name.trim().eq_ignore_ascii_case("authorization") {
            return None;
        }
        let value = value.trim();
        let (scheme, token) = value.split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
    })
}

/// The `token` parameter of a query string.
fn query_token(query: &str) -> Option<&str> {
    query.split('&').find_map(|pair| pair.strip_prefix("token="))
}

/// Compares in time independent of where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// How long a client may take to send its request line, and how long the rest of its
/// request is drained after the answer.
const CLIENT_WITHIN: Duration = Duration::from_secs(2);
/// Longest request head (request line and headers) read; what is past it is not looked at
/// (a request line longer than this gets what the truncated line names, or a 404).
const REQUEST_HEAD_MAX: usize = 8 * 1024;

/// Serves the admin endpoints on `listener` until the task is dropped.
pub async fn serve_admin(listener: TcpListener, registry: Registry, readiness: Readiness) {
    let access = Access::new(Private::Closed, &[], &registry);
    serve_admin_with(listener, registry, readiness, Arc::new(|_: &str| None), access).await
}

/// [`serve_admin`] plus node-specific routes, guarded by `access`.
pub async fn serve_admin_with(
    listener: TcpListener,
    registry: Registry,
    readiness: Readiness,
    routes: Routes,
    access: Access,
) {
    crate::process::register(&registry);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let registry = registry.clone();
        let readiness = Arc::clone(&readiness);
        let routes = Arc::clone(&routes);
        tokio::spawn(answer(stream, registry, readiness, routes, access.clone()));
    }
}

async fn answer(
    mut stream: TcpStream,
    registry: Registry,
    readiness: Readiness,
    routes: Routes,
    access: Access,
) {
    let mut request = vec![0u8; REQUEST_HEAD_MAX];
    let mut filled = 0;
    // Read until the end of the head (the bearer token is a header), or as much of it as
    // fits; a client that sends a request line only (HTTP/0.9 style) is answered once the
    // line is complete and nothing more comes.
    while filled < request.len() && !request[..filled].windows(4).any(|w| w == b"\r\n\r\n") {
        let within = if request[..filled].contains(&b'\n') {
            Duration::from_millis(200)
        } else {
            CLIENT_WITHIN
        };
        match tokio::time::timeout(within, stream.read(&mut request[filled..])).await {
            Ok(Ok(n)) if n > 0 => filled += n,
            _ if request[..filled].contains(&b'\n') => break,
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&request[..filled]);
    let line = head.lines().next().unwrap_or("");
    let target = line.split_whitespace().nth(1).unwrap_or("/");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let (status, content_type, body) = match path {
        "/healthz" => ("200 OK", "text/plain", "ok\n".to_string()),
        "/readyz" => match readiness() {
            Ok(()) => ("200 OK", "text/plain", "ready\n".to_string()),
            Err(why) => ("503 Service Unavailable", "text/plain", format!("{why}\n")),
        },
        "/metrics" => ("200 OK", "text/plain; version=0.0.4", registry.render()),
        other => match routes(other) {
            Some(reply) => match access.refuses(other, query, &head) {
                Some((status, body)) => (status, "text/plain", body),
                None => {
                    let reply = reply.await;
                    ("200 OK", reply.content_type, reply.body)
                }
            },
            None => ("404 Not Found", "text/plain", "not found\n".to_string()),
        },
    };
    let challenge = if status.starts_with("401") { "www-authenticate: Bearer\r\n" } else { "" };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\
         {challenge}cache-control: no-store\r\nconnection: close\r\n\r\n",
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
        serve_as(Private::Open).await
    }

    async fn serve_as(private: Private) -> String {
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
        let routes: Routes = Arc::new(move |path: &str| match path {
            "/open" => Some(Box::pin(async { Reply::html("<p>all</p>".into()) }) as ReplyFuture),
            other => routes(other),
        });
        let access = Access::new(private, &["/open"], &registry);
        tokio::spawn(serve_admin_with(listener, registry, readiness, routes, access));
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
        assert!(metrics.contains("meridian_test_total 2\n"), "{metrics}");
        let missing = ask(&addr, "GET /nothing HTTP/1.0\r\n\r\n").await;
        assert!(missing.starts_with("HTTP/1.1 404 Not Found"), "{missing}");
        let garbage = ask(&addr, "\u{1}\u{2}\n").await;
        assert!(garbage.starts_with("HTTP/1.1 404"), "{garbage}");
    }

    /// Pages that name players need the node's admin token (a header, or the URL for a
    /// browser); without one configured outside dev mode nobody gets them. Probes,
    /// metrics and public pages stay open; refusals are counted.
    #[tokio::test]
    async fn private_pages_need_the_admin_token() {
        let addr = serve_as(Private::Token(Arc::from("s3cret"))).await;
        let asked = |request: &'static str| {
            let addr = addr.clone();
            async move { ask(&addr, request).await }
        };
        let none = asked("GET /page HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(none.starts_with("HTTP/1.1 401 Unauthorized\r\n"), "{none}");
        assert!(none.contains("www-authenticate: Bearer\r\n") && !none.contains("<p>hi"), "{none}");
        let wrong = asked("GET /page HTTP/1.1\r\nAuthorization: Bearer s3cre\r\n\r\n").await;
        assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
        let right =
            asked("GET /page HTTP/1.1\r\nHost: x\r\nauthorization: bearer s3cret\r\n\r\n").await;
        assert!(right.starts_with("HTTP/1.1 200 OK") && right.ends_with("<p>hi</p>"), "{right}");
        let browser = asked("GET /page?x=1&token=s3cret HTTP/1.1\r\n\r\n").await;
        assert!(browser.starts_with("HTTP/1.1 200 OK"), "{browser}");
        for open in ["/healthz", "/metrics", "/open"] {
            let request: &'static str = Box::leak(format!("GET {open} HTTP/1.0\r\n\r\n").into());
            let answer = asked(request).await;
            assert!(answer.starts_with("HTTP/1.1 200 OK"), "{open}: {answer}");
        }
        let metrics = asked("GET /metrics HTTP/1.0\r\n\r\n").await;
        assert!(metrics.contains("meridian_admin_refused_total 2\n"), "{metrics}");

        let closed = serve_as(Private::from_config(None, false)).await;
        let answer = ask(&closed, "GET /page HTTP/1.1\r\nAuthorization: Bearer x\r\n\r\n").await;
        assert!(
            answer.starts_with("HTTP/1.1 403 Forbidden") && answer.contains("--admin-token"),
            "{answer}"
        );
        assert!(matches!(Private::from_config(None, true), Private::Open));
        assert!(matches!(Private::from_config(Some(""), true), Private::Open));
    }
}
