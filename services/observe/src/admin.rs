//! The admin HTTP port: `/healthz`, `/readyz`, `/metrics`, plus whatever pages a node adds
//! (a shard's `/players` and `/density`, a gateway's live map). It serves probes, scrapes
//! and an operator's browser, not traffic: HTTP/1.1 with keep-alive on hyper (the HTTP
//! stack tonic already brings in), GET and HEAD only, every request and client bounded (see
//! the limits below), since it faces whatever can reach the port.
//!
//! Probes must be answered whatever other clients do: every connection holds a place at a
//! [`Gate`] (at most [`CONNECTIONS_PER_ADDRESS`] from one address, [`CONNECTIONS_MAX`] in
//! all), and when the port is full a new connection takes the place of the oldest one not
//! being answered at that moment (a slow or idle client, never a request in progress), so
//! a kubelet probe that sends its request at once is answered however many half-sent heads
//! are held open.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tracing::debug;

use crate::gate::{Gate, GateLimits, Pass};
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
    /// `authorization` is the request's `Authorization` header, if it has one.
    fn refuses(
        &self,
        path: &str,
        query: &str,
        authorization: Option<&str>,
    ) -> Option<(StatusCode, &'static str)> {
        if self.public.contains(&path) {
            return None;
        }
        let refusal = match &self.private {
            Private::Open => return None,
            Private::Token(token) => {
                let presented = authorization.and_then(bearer).or_else(|| query_token(query));
                if presented.is_some_and(|p| same(p.as_bytes(), token.as_bytes())) {
                    return None;
                }
                (StatusCode::UNAUTHORIZED, "this page names players: send the node's admin token (Authorization: Bearer, or ?token=)\n")
            }
            Private::Closed => (
                StatusCode::FORBIDDEN,
                "this page names players: it is served only with --admin-token (MERIDIAN_ADMIN_TOKEN) set\n",
            ),
        };
        self.refused.inc();
        Some(refusal)
    }
}

/// The token of an `Authorization: Bearer <token>` header value.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The `token` parameter of a query string.
fn query_token(query: &str) -> Option<&str> {
    query.split('&').find_map(|pair| pair.strip_prefix("token="))
}

/// Compares in time independent of where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// How long a client may take to send a request's head (request line and headers), counted
/// from when the connection is ready for it: a new connection, or one kept alive after an
/// answer. So it is also how long an idle kept-alive connection stays open.
pub const REQUEST_HEAD_WITHIN: Duration = Duration::from_secs(10);
/// The most a request head may hold, in bytes (hyper's smallest read buffer); past it the
/// client gets 431 and the connection is closed.
pub const REQUEST_HEAD_MAX: usize = 8 * 1024;
/// The most headers a request may carry (a browser sends about 15); past it, 431.
pub const REQUEST_HEADERS_MAX: usize = 64;
/// How long one connection may live, however busy: a client that stops reading its answer
/// holds it no longer than this. It is then closed after the answer in flight (given 5 s).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(300);
/// Connections served at once. A new one past it takes the place of the oldest connection
/// not being answered (closed without a word); none at all is refused (closed at once).
pub const CONNECTIONS_MAX: usize = 256;
/// Connections served at once from one address (an IPv6 /64): more are closed at once.
/// A browser opens 6, a Prometheus scrape and a kubelet probe one each.
pub const CONNECTIONS_PER_ADDRESS: usize = 32;

/// What every connection's requests are answered from.
struct Admin {
    registry: Registry,
    readiness: Readiness,
    routes: Routes,
    access: Access,
    limits: Limits,
}

/// The bounds on clients (the constants above; tests shorten the times).
#[derive(Debug, Clone, Copy)]
struct Limits {
    head_within: Duration,
    lifetime: Duration,
    gate: GateLimits,
}

const LIMITS: Limits = Limits {
    head_within: REQUEST_HEAD_WITHIN,
    lifetime: CONNECTION_LIFETIME,
    gate: GateLimits { per_address: CONNECTIONS_PER_ADDRESS, max: CONNECTIONS_MAX },
};

/// Serves the admin endpoints on `listener` until the task is dropped.
pub async fn serve_admin(listener: TcpListener, registry: Registry, readiness: Readiness) {
    let access = Access::new(Private::Closed, &[], &registry);
    serve_admin_with(listener, registry, readiness, Arc::new(|_: &str| None), access).await
}

/// [`serve_admin`] plus node-specific routes, guarded by `access`. The process metrics and
/// `meridian_build_info` are added to `registry` here.
pub async fn serve_admin_with(
    listener: TcpListener,
    registry: Registry,
    readiness: Readiness,
    routes: Routes,
    access: Access,
) {
    serve_admin_within(listener, registry, readiness, routes, access, LIMITS).await
}

async fn serve_admin_within(
    listener: TcpListener,
    registry: Registry,
    readiness: Readiness,
    routes: Routes,
    access: Access,
    limits: Limits,
) {
    crate::process::register(&registry);
    let gate = Gate::new("admin", limits.gate, &registry);
    let admin = Arc::new(Admin { registry, readiness, routes, access, limits });
    loop {
        // Accepted at once, whatever is open: a connection left in the backlog would wait
        // behind every slow client, which is what the gate is there to prevent.
        let (stream, from) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors or memory: try again a little later, not in a spin.
                debug!(%error, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(pass) = gate.admit(from.ip()) else {
            debug!(%from, "admin connection refused: its address holds its share");
            continue;
        };
        tokio::spawn(serve_connection(stream, Arc::clone(&admin), pass));
    }
}

async fn serve_connection(stream: TcpStream, admin: Arc<Admin>, pass: Pass) {
    let limits = admin.limits;
    let pass = Arc::new(pass);
    let answering = Arc::clone(&pass);
    let service = hyper::service::service_fn(move |request| {
        let (admin, pass) = (Arc::clone(&admin), Arc::clone(&answering));
        async move {
            // Not evicted while answering: a newcomer takes an idle connection's place.
            pass.busy(true);
            let answer = answer(&admin, request).await;
            pass.busy(false);
            Ok::<_, Infallible>(answer)
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.head_within)
        .max_buf_size(REQUEST_HEAD_MAX)
        .max_headers(REQUEST_HEADERS_MAX)
        .keep_alive(true);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let outcome = tokio::select! {
        outcome = connection.as_mut() => outcome,
        () = pass.evicted() => {
            debug!("admin connection closed: the port is full and it was the oldest idle one");
            return;
        }
        _ = tokio::time::sleep(limits.lifetime) => {
            connection.as_mut().graceful_shutdown();
            match tokio::time::timeout(Duration::from_secs(5), connection.as_mut()).await {
                Ok(outcome) => outcome,
                Err(_) => return,
            }
        }
    };
    if let Err(error) = outcome {
        if error.is_timeout() {
            // No whole request head in time (a slow client, or a kept-alive one idle).
            pass.deadline_passed();
        }
        debug!(%error, "admin connection ended");
    }
}

/// A plain-text answer.
fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    reply(status, "text/plain; charset=utf-8", body.into())
}

fn reply(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Answers one request. HEAD gets GET's headers (its `content-length` too) and no body:
/// hyper leaves the body out.
async fn answer<B>(admin: &Admin, request: Request<B>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut refused = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
        refused.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return refused;
    }
    let path = request.uri().path();
    let query = request.uri().query().unwrap_or("");
    match path {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" => match (admin.readiness)() {
            Ok(()) => text(StatusCode::OK, "ready\n"),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        },
        "/metrics" => {
            let body = Bytes::from(admin.registry.render());
            reply(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", body)
        }
        other => match (admin.routes)(other) {
            Some(page) => {
                let authorization = request
                    .headers()
                    .get(header::AUTHORIZATION)
                    .and_then(|value| value.to_str().ok());
                match admin.access.refuses(other, query, authorization) {
                    Some((status, why)) => {
                        let mut refused = text(status, why);
                        if status == StatusCode::UNAUTHORIZED {
                            let challenge = HeaderValue::from_static("Bearer");
                            refused.headers_mut().insert(header::WWW_AUTHENTICATE, challenge);
                        }
                        refused
                    }
                    None => {
                        let page = page.await;
                        reply(StatusCode::OK, page.content_type, Bytes::from(page.body))
                    }
                }
            }
            None => text(StatusCode::NOT_FOUND, "not found\n"),
        },
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// How long a test waits for any answer.
    const ANSWER_WITHIN: Duration = Duration::from_secs(5);

    async fn serve() -> String {
        serve_as(Private::Open, LIMITS).await
    }

    async fn serve_as(private: Private, limits: Limits) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let registry = Registry::default();
        registry.counter("meridian_test_total", "A test counter.", &[]).add(2);
        let readiness: Readiness = Arc::new(|| Err("not registered in etcd".into()));
        let routes: Routes = Arc::new(|path: &str| {
            let reply: ReplyFuture = match path {
                "/page" => Box::pin(async { Reply::html("<p>hi</p>".into()) }),
                "/open" => Box::pin(async { Reply::html("<p>all</p>".into()) }),
                _ => return None,
            };
            Some(reply)
        });
        let access = Access::new(private, &["/open"], &registry);
        tokio::spawn(serve_admin_within(listener, registry, readiness, routes, access, limits));
        addr
    }

    /// One answer as read off the wire.
    #[derive(Debug)]
    struct Answer {
        status: u16,
        /// The status line and headers, header names lowercased.
        head: String,
        body: String,
    }

    impl Answer {
        fn header(&self, name: &str) -> Option<&str> {
            self.head.lines().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                key.eq_ignore_ascii_case(name).then(|| value.trim())
            })
        }
    }

    /// A client connection that reads answers one at a time, by their `content-length`.
    struct Client {
        stream: TcpStream,
        unread: Vec<u8>,
    }

    impl Client {
        async fn connect(addr: &str) -> Client {
            Client { stream: TcpStream::connect(addr).await.unwrap(), unread: Vec::new() }
        }

        async fn send(&mut self, request: &str) {
            self.stream.write_all(request.as_bytes()).await.unwrap();
        }

        /// Reads more bytes; false at the end of the stream (or a reset).
        async fn fill(&mut self) -> bool {
            let mut buffer = [0u8; 4096];
            match tokio::time::timeout(ANSWER_WITHIN, self.stream.read(&mut buffer)).await {
                Ok(Ok(n)) if n > 0 => {
                    self.unread.extend_from_slice(&buffer[..n]);
                    true
                }
                Ok(_) => false,
                Err(_) => panic!("no answer within {ANSWER_WITHIN:?}"),
            }
        }

        /// The next answer; `head_only` for the answer to a HEAD (no body follows).
        async fn answer(&mut self, head_only: bool) -> Answer {
            let end = loop {
                if let Some(at) = self.unread.windows(4).position(|w| w == b"\r\n\r\n") {
                    break at + 4;
                }
                assert!(self.fill().await, "closed before a whole head: {:?}", self.unread);
            };
            let head = String::from_utf8(self.unread.drain(..end).collect()).unwrap();
            let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
            let mut answer = Answer { status, head, body: String::new() };
            let length: usize = answer.header("content-length").map_or(0, |l| l.parse().unwrap());
            let length = if head_only { 0 } else { length };
            while self.unread.len() < length {
                assert!(self.fill().await, "closed before the whole body");
            }
            answer.body = String::from_utf8(self.unread.drain(..length).collect()).unwrap();
            answer
        }

        /// Whether the server closes the connection (within the wait) with nothing more sent.
        async fn closed(&mut self) -> bool {
            !self.fill().await && self.unread.is_empty()
        }
    }

    /// One request on a connection of its own.
    async fn ask(addr: &str, request: &str) -> Answer {
        let mut client = Client::connect(addr).await;
        client.send(request).await;
        client.answer(request.starts_with("HEAD")).await
    }

    #[tokio::test]
    async fn answers_probes_metrics_and_routes_with_their_content_types() {
        let addr = serve().await;
        let headers =
            "Host: x\r\nUser-Agent: a browser with a long header line\r\nAccept: */*\r\n\r\n";
        let page = ask(&addr, &format!("GET /page?t=1 HTTP/1.1\r\n{headers}")).await;
        assert_eq!((page.status, page.body.as_str()), (200, "<p>hi</p>"), "{page:?}");
        assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"), "{page:?}");
        assert_eq!(page.header("cache-control"), Some("no-store"), "{page:?}");
        let ready = ask(&addr, "GET /readyz HTTP/1.0\r\n\r\n").await;
        assert_eq!((ready.status, ready.body.as_str()), (503, "not registered in etcd\n"));
        let metrics = ask(&addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(metrics.body.contains("meridian_test_total 2\n"), "{metrics:?}");
        assert!(metrics.body.contains("meridian_build_info{"), "{metrics:?}");
        let version = metrics.header("content-type").unwrap();
        assert!(version.starts_with("text/plain; version=0.0.4"), "{metrics:?}");
        let missing = ask(&addr, "GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(missing.status, 404, "{missing:?}");
        let garbage = ask(&addr, "\u{1}\u{2}\r\n\r\n").await;
        assert_eq!(garbage.status, 400, "{garbage:?}");
    }

    /// Two requests (and a third) on one connection: an HTTP/1.1 client keeps it.
    #[tokio::test]
    async fn keeps_the_connection_alive_between_requests() {
        let addr = serve().await;
        let mut client = Client::connect(&addr).await;
        client.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let first = client.answer(false).await;
        assert_eq!((first.status, first.body.as_str()), (200, "ok\n"), "{first:?}");
        assert_ne!(first.header("connection"), Some("close"), "{first:?}");
        client.send("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let second = client.answer(false).await;
        assert!(second.status == 200 && second.body.contains("meridian_test_total 2"));
        // Pipelined: both answered in order.
        client.send("GET /page HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n").await;
        assert_eq!(client.answer(false).await.body, "<p>hi</p>");
        assert_eq!(client.answer(false).await.body, "ok\n");
        // A client that asks to close is answered, then closed.
        client.send("GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n").await;
        assert_eq!(client.answer(false).await.status, 200);
        assert!(client.closed().await, "closed after `connection: close`");
    }

    /// HEAD: GET's status and headers (its length too), no body; the next answer on the
    /// connection starts right after the head.
    #[tokio::test]
    async fn head_gets_the_headers_and_no_body() {
        let addr = serve().await;
        let mut client = Client::connect(&addr).await;
        client.send("HEAD /page HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let head = client.answer(true).await;
        assert_eq!(head.status, 200, "{head:?}");
        assert_eq!(head.header("content-length"), Some("9"), "{head:?}");
        assert_eq!(head.header("content-type"), Some("text/html; charset=utf-8"));
        client.send("HEAD /readyz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(client.answer(true).await.status, 503);
        client.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let after = client.answer(false).await;
        assert_eq!((after.status, after.body.as_str()), (200, "ok\n"), "{after:?}");
    }

    #[tokio::test]
    async fn other_methods_are_refused_with_allow() {
        let addr = serve().await;
        for method in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
            let request =
                format!("{method} /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
            let answer = ask(&addr, &request).await;
            assert_eq!(answer.status, 405, "{method}: {answer:?}");
            assert_eq!(answer.header("allow"), Some("GET, HEAD"), "{method}: {answer:?}");
        }
        // Refused before the route runs: a private page says 405, not 401 or its content.
        let post = ask(&addr, "POST /page HTTP/1.1\r\nContent-Length: 0\r\n\r\n").await;
        assert_eq!(post.status, 405, "{post:?}");
    }

    /// A head past the size limit gets 431; a client that does not finish its head in time
    /// is closed; an idle kept-alive connection too.
    #[tokio::test]
    async fn bounds_request_heads_and_slow_clients() {
        let limits = Limits { head_within: Duration::from_millis(300), ..LIMITS };
        let addr = serve_as(Private::Open, limits).await;
        let big =
            format!("GET /healthz HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(REQUEST_HEAD_MAX));
        assert_eq!(ask(&addr, &big).await.status, 431);
        let many: String = (0..=REQUEST_HEADERS_MAX).map(|i| format!("X-{i}: 1\r\n")).collect();
        let many = ask(&addr, &format!("GET /healthz HTTP/1.1\r\n{many}\r\n")).await;
        assert_eq!(many.status, 431, "{many:?}");

        let mut slow = Client::connect(&addr).await;
        slow.send("GET /healthz HTTP/1.1\r\nHost: x\r\n").await;
        assert!(slow.closed().await, "a head never finished");
        let metrics = ask(&addr, "GET /metrics HTTP/1.0\r\n\r\n").await;
        let counted =
            "meridian_untrusted_connections_closed_total{port=\"admin\",reason=\"deadline\"} 1\n";
        assert!(metrics.body.contains(counted), "{metrics:?}");
        let mut idle = Client::connect(&addr).await;
        idle.send("GET /healthz HTTP/1.1\r\n\r\n").await;
        assert_eq!(idle.answer(false).await.status, 200);
        assert!(idle.closed().await, "an idle kept-alive connection");
    }

    /// A connection from `ip` (127.x.y.z: every loopback address is this host's).
    async fn connect_from(addr: &str, ip: &str) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{ip}:0").parse().unwrap()).unwrap();
        socket.connect(addr.parse().unwrap()).await.unwrap()
    }

    /// Slow clients holding every place (half a head each, from several addresses) keep no
    /// probe out: one address gets its share and no more, and a probe takes the place of
    /// the oldest slow client.
    #[tokio::test]
    async fn probes_are_answered_whatever_slow_clients_hold() {
        let limits = Limits { gate: GateLimits { per_address: 4, max: 8 }, ..LIMITS };
        let addr = serve_as(Private::Open, limits).await;
        let mut slow = Vec::new();
        for ip in ["127.0.0.2", "127.0.0.3"] {
            for _ in 0..4 {
                let mut stream = connect_from(&addr, ip).await;
                stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.unwrap();
                slow.push(Client { stream, unread: Vec::new() });
            }
        }
        let mut fifth = Client { stream: connect_from(&addr, "127.0.0.2").await, unread: vec![] };
        assert!(fifth.closed().await, "a fifth connection from one address is closed at once");
        // Each probe keeps its connection (and so its place): each takes the place of the
        // oldest slow client, not of the probes before it.
        let mut probes = Vec::new();
        for round in 0..3 {
            let mut probe = Client::connect(&addr).await;
            probe.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
            let answer = probe.answer(false).await;
            assert_eq!((answer.status, answer.body.as_str()), (200, "ok\n"), "round {round}");
            probes.push(probe);
        }
        for (n, client) in slow.iter_mut().take(3).enumerate() {
            assert!(client.closed().await, "slow client {n} evicted");
        }
        let mut scrape = Client::connect(&addr).await;
        scrape.send("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let metrics = scrape.answer(false).await;
        let counted = |reason: &str| {
            format!(
                "meridian_untrusted_connections_closed_total{{port=\"admin\",reason=\"{reason}\"}}"
            )
        };
        assert!(metrics.body.contains(&format!("{} 1\n", counted("per_address"))), "{metrics:?}");
        // The /metrics request took a fourth place.
        assert!(metrics.body.contains(&format!("{} 4\n", counted("evicted"))), "{metrics:?}");
    }

    /// Pages that name players need the node's admin token (a header, or the URL for a
    /// browser); without one configured outside dev mode nobody gets them. Probes,
    /// metrics and public pages stay open; refusals are counted.
    #[tokio::test]
    async fn private_pages_need_the_admin_token() {
        let addr = serve_as(Private::Token(Arc::from("s3cret")), LIMITS).await;
        let none = ask(&addr, "GET /page HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(none.status, 401, "{none:?}");
        assert_eq!(none.header("www-authenticate"), Some("Bearer"), "{none:?}");
        assert!(!none.body.contains("<p>hi"), "{none:?}");
        let wrong = ask(&addr, "GET /page HTTP/1.1\r\nAuthorization: Bearer s3cre\r\n\r\n").await;
        assert_eq!(wrong.status, 401, "{wrong:?}");
        let right =
            ask(&addr, "GET /page HTTP/1.1\r\nHost: x\r\nauthorization: bearer s3cret\r\n\r\n")
                .await;
        assert_eq!((right.status, right.body.as_str()), (200, "<p>hi</p>"), "{right:?}");
        let browser = ask(&addr, "GET /page?x=1&token=s3cret HTTP/1.1\r\n\r\n").await;
        assert_eq!(browser.status, 200, "{browser:?}");
        let head = ask(&addr, "HEAD /page HTTP/1.1\r\n\r\n").await;
        assert_eq!(head.status, 401, "HEAD is guarded as GET: {head:?}");
        for open in ["/healthz", "/metrics", "/open"] {
            let answer = ask(&addr, &format!("GET {open} HTTP/1.0\r\n\r\n")).await;
            assert_eq!(answer.status, 200, "{open}: {answer:?}");
        }
        let metrics = ask(&addr, "GET /metrics HTTP/1.0\r\n\r\n").await;
        assert!(metrics.body.contains("meridian_admin_refused_total 3\n"), "{metrics:?}");

        let closed = serve_as(Private::from_config(None, false), LIMITS).await;
        let answer = ask(&closed, "GET /page HTTP/1.1\r\nAuthorization: Bearer x\r\n\r\n").await;
        assert_eq!(answer.status, 403, "{answer:?}");
        assert!(answer.body.contains("--admin-token"), "{answer:?}");
        assert!(matches!(Private::from_config(None, true), Private::Open));
        assert!(matches!(Private::from_config(Some(""), true), Private::Open));
    }
}
