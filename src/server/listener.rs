//! The HTTP listener's connections: accepted sockets served as HTTP/1.1 by hyper, with
//! `TCP_NODELAY`, caps on concurrent connections, a bound on how long a client may take to send
//! a request's headers and then its body, and a graceful end.
//!
//! Written out rather than `axum::serve`: axum 0.8's `serve` gives hyper no timer, so hyper's
//! header-read timeout never applies and a client that sends a request's headers a byte at a
//! time (slowloris) holds its connection, a task and a file descriptor for as long as it likes.
//! An idle keep-alive connection is bounded the same way: hyper times out the wait for the next
//! request's headers too.
//!
//! Every bound on what a client's connection can make the gateway hold lives here, once, for
//! every route (`/mcp`, the REST API, the admin endpoints and anything added later):
//! - **connections**: at most [`Limits::max_connections`] at once, and
//!   [`Limits::max_connections_per_ip`] per peer address; one more is answered with a minimal
//!   `503` + `Retry-After` written on the accepted socket, which is then closed (hyper never
//!   sees it);
//! - **request bodies**: every body is wrapped ([`BodyDeadline`]): once its handler starts
//!   reading it, the whole body must arrive within a deadline and, after a grace period, at a
//!   minimum average rate; a body that does not is ended with an error, and the request is
//!   answered `408` whatever its handler made of that error (a handler collecting a body holds
//!   what has arrived: a stalled client must not hold it for ever);
//! - **unread bodies**: a response sent before its request's body was read to the end (a 401
//!   answered from the headers, a 413) carries `Connection: close`, and the connection is closed
//!   after it: the rest of the body is never read.
//!
//! A [`FrontDoor`] takes the requests it serves itself straight from the connection, past the
//! router: `/mcp` (every forwarded call) skips axum's routing and a middleware layer's boxing.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::future::{BoxFuture, Either, FutureExt};
use hyper::body::{Body, Frame, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// How long a client may take to send a request's headers, from the connection's start or
/// the end of its previous response (then an idle keep-alive connection is closed).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Default [`BodyDeadline::timeout`]: a whole request body within 60 s.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(60);

/// Default [`BodyDeadline::min_rate`]: 32 KiB/s on average, after the grace period.
pub const DEFAULT_BODY_MIN_RATE: u64 = 32 << 10;

/// Default [`BodyDeadline::grace`].
pub const DEFAULT_BODY_GRACE: Duration = Duration::from_secs(10);

/// Default [`Limits::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// Default [`Limits::max_connections_per_ip`].
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 1024;

/// How long a failed `accept` (out of file descriptors) pauses the loop.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The 503 code of a connection over [`Limits::max_connections`].
pub const CONNECTIONS_EXHAUSTED: &str = "connections-exhausted";
/// The 503 code of a connection over [`Limits::max_connections_per_ip`].
pub const PEER_CONNECTIONS_EXHAUSTED: &str = "peer-connections-exhausted";
/// The 408 code of a body not complete within [`BodyDeadline::timeout`].
pub const BODY_TIMEOUT: &str = "request-body-timeout";
/// The 408 code of a body slower than [`BodyDeadline::min_rate`] after the grace period.
pub const BODY_TOO_SLOW: &str = "request-body-too-slow";

/// How long a request body may take to arrive, counted from the first time its handler reads
/// it (a body nobody reads holds nothing but the kernel's socket buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyDeadline {
    /// The whole body within this long (zero: no deadline).
    pub timeout: Duration,
    /// Bytes per second the body must average once `grace` has passed: at `grace + t` seconds
    /// at least `min_rate × t` bytes have arrived (each `min_rate` bytes buy one more second,
    /// as Apache's `mod_reqtimeout`; 0: no minimum).
    pub min_rate: u64,
    /// See `min_rate`.
    pub grace: Duration,
}

impl Default for BodyDeadline {
    fn default() -> Self {
        BodyDeadline {
            timeout: DEFAULT_BODY_TIMEOUT,
            min_rate: DEFAULT_BODY_MIN_RATE,
            grace: DEFAULT_BODY_GRACE,
        }
    }
}

impl BodyDeadline {
    /// When a body started at `started` that has brought `received` bytes is late, and which
    /// bound that is (`None`: never).
    fn due(&self, started: Instant, received: u64) -> Option<(Instant, &'static str)> {
        let whole = (!self.timeout.is_zero()).then(|| (started + self.timeout, BODY_TIMEOUT));
        let rate = (self.min_rate > 0).then(|| {
            let bought = Duration::from_secs_f64(received as f64 / self.min_rate as f64);
            (
                started
                    + self
                        .grace
                        .saturating_add(bought.min(Duration::from_secs(1 << 32))),
                BODY_TOO_SLOW,
            )
        });
        match (whole, rate) {
            (Some(w), Some(r)) => Some(if r.0 < w.0 { r } else { w }),
            (w, r) => w.or(r),
        }
    }
}

/// The bounds the listener enforces on every connection and request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// See [`HEADER_READ_TIMEOUT`].
    pub header_read_timeout: Duration,
    /// Request bodies' deadline and minimum rate.
    pub body: BodyDeadline,
    /// Connections open at once, all peers (0: no cap).
    pub max_connections: usize,
    /// Connections open at once from one peer IP address (0: no cap). Behind a proxy or an
    /// ingress controller the peer is the proxy.
    pub max_connections_per_ip: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: HEADER_READ_TIMEOUT,
            body: BodyDeadline::default(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_ip: DEFAULT_MAX_CONNECTIONS_PER_IP,
        }
    }
}

/// Requests served past the router. It sees a request exactly as the router would (the peer
/// address in its `ConnectInfo` extension).
pub trait FrontDoor: Send + Sync {
    /// Whether this door serves `req` (else the router does).
    fn takes(&self, req: &axum::extract::Request) -> bool;
    /// The response to a request it takes.
    fn serve(&self, req: axum::extract::Request) -> BoxFuture<'static, Response>;
}

/// Serves `app` (and `door`, first) on `listener` until `stop` is cancelled, then waits for
/// the open connections to finish their requests (the caller bounds that wait).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    door: Option<Arc<dyn FrontDoor>>,
    stop: CancellationToken,
    limits: Limits,
) {
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    let open = Arc::new(Connections::new(&limits));
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting an HTTP connection failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        let slot = match open.admit(peer.ip()) {
            Ok(slot) => slot,
            Err(code) => {
                refuse(tcp, code);
                continue;
            }
        };
        // SSE responses are written in small frames: Nagle's algorithm meeting the client's
        // delayed ACK cost ~40 ms per call.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        let app = app.clone();
        let door = door.clone();
        let connection = ConnectionId::new();
        let body_deadline = limits.body;
        let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
            let (parts, body) = req.into_parts();
            let body = WatchedBody::new(body, body_deadline);
            let watch = body.state.clone();
            let mut req = axum::extract::Request::from_parts(parts, axum::body::Body::new(body));
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo::<SocketAddr>(peer));
            req.extensions_mut().insert(connection);
            let response = match &door {
                Some(door) if door.takes(&req) => Either::Left(door.serve(req)),
                _ => Either::Right(
                    app.clone()
                        .oneshot(req)
                        .map(|r| r.unwrap_or_else(|e: std::convert::Infallible| match e {})),
                ),
            };
            response.map(move |r| Ok::<_, std::convert::Infallible>(watch.finish(r)))
        });
        // A request body wakes the connection's own task (see `self_wake`).
        let conn = super::self_wake::SelfWakeCoalesced::new(
            graceful.watch(http.serve_connection(TokioIo::new(tcp), service)),
        );
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "HTTP connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// The connections open now, all peers and per peer address.
struct Connections {
    max: usize,
    max_per_ip: usize,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// One admitted connection's place in [`Connections`] (given back when dropped).
struct Slot {
    open: Arc<Connections>,
    ip: IpAddr,
}

impl Connections {
    fn new(limits: &Limits) -> Self {
        Connections {
            max: limits.max_connections,
            max_per_ip: limits.max_connections_per_ip,
            open: Mutex::new((0, HashMap::new())),
        }
    }

    /// A place for one more connection from `ip`, or the code of the cap it would exceed.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Slot, &'static str> {
        // `::ffff:a.b.c.d` is the IPv4 peer a.b.c.d (a dual-stack listener).
        let ip = ip.to_canonical();
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let (total, per_ip) = &mut *open;
        if self.max > 0 && *total >= self.max {
            return Err(CONNECTIONS_EXHAUSTED);
        }
        let mine = per_ip.entry(ip).or_insert(0);
        if self.max_per_ip > 0 && *mine >= self.max_per_ip {
            return Err(PEER_CONNECTIONS_EXHAUSTED);
        }
        *mine += 1;
        *total += 1;
        Ok(Slot {
            open: self.clone(),
            ip,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.open.lock().unwrap_or_else(|e| e.into_inner());
        let (total, per_ip) = &mut *open;
        *total = total.saturating_sub(1);
        if let Some(mine) = per_ip.get_mut(&self.ip) {
            *mine = mine.saturating_sub(1);
            if *mine == 0 {
                per_ip.remove(&self.ip);
            }
        }
    }
}

/// Answers a connection over a cap with a minimal `503` (`{"code"}`, `Retry-After: 1`,
/// `Connection: close`) written on the accepted socket, and closes it. Never waits: the socket
/// is non-blocking and a fresh socket's send buffer takes the few bytes at once (if not, the
/// client just sees the close).
fn refuse(tcp: TcpStream, code: &'static str) {
    use std::io::{Read, Write};
    crate::telemetry::metrics().http_refused(code);
    tracing::debug!(code, "HTTP connection refused");
    // Written with the plain socket: tokio's `try_write` would not even try before the
    // reactor has seen the new socket writable.
    let Ok(tcp) = tcp.into_std() else {
        return;
    };
    let body = format!("{{\"code\":\"{code}\"}}");
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = (&tcp).write(answer.as_bytes());
    let _ = tcp.shutdown(std::net::Shutdown::Write);
    // Whatever the client already sent is read and dropped (non-blocking), so that closing
    // does not answer it with a reset that may discard the 503.
    let mut sink = [0u8; 4096];
    for _ in 0..16 {
        match (&tcp).read(&mut sink) {
            Ok(n) if n > 0 => continue,
            _ => break,
        }
    }
}

/// A request body not yet read to its end.
const READING: u8 = 0;
/// Read to its end (or empty from the start).
const ENDED: u8 = 1;
/// Ended by [`BodyDeadline::timeout`].
const TIMED_OUT: u8 = 2;
/// Ended by [`BodyDeadline::min_rate`].
const TOO_SLOW: u8 = 3;

/// What became of one request's body, seen by the connection when the response is sent.
struct BodyWatch(AtomicU8);

impl BodyWatch {
    /// The response to send: `408` with the bound's code when the body was ended by its
    /// deadline (whatever the handler answered to the error), `Connection: close` when the
    /// body was not read to its end.
    fn finish(&self, mut response: Response) -> Response {
        let code = match self.0.load(Ordering::Acquire) {
            ENDED => return response,
            TIMED_OUT => BODY_TIMEOUT,
            TOO_SLOW => BODY_TOO_SLOW,
            _ => {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                return response;
            }
        };
        crate::telemetry::metrics().http_refused(code);
        let mut response = (
            StatusCode::REQUEST_TIMEOUT,
            axum::Json(serde_json::json!({ "code": code })),
        )
            .into_response();
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        response
    }
}

/// A request body under a [`BodyDeadline`] (see the module docs).
struct WatchedBody<B> {
    inner: B,
    deadline: BodyDeadline,
    state: Arc<BodyWatch>,
    /// When the handler first read the body.
    started: Option<Instant>,
    received: u64,
    /// Wakes the reader at the deadline (made the first time the body waits for the client).
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// A body ended by its deadline (the handler sees it as a read error).
#[derive(Debug)]
struct BodyLate(&'static str);

impl std::fmt::Display for BodyLate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for BodyLate {}

impl<B> WatchedBody<B>
where
    B: Body + Unpin,
{
    fn new(inner: B, deadline: BodyDeadline) -> Self {
        let state = if inner.is_end_stream() {
            ENDED
        } else {
            READING
        };
        WatchedBody {
            inner,
            deadline,
            state: Arc::new(BodyWatch(AtomicU8::new(state))),
            started: None,
            received: 0,
            timer: None,
        }
    }

    /// Ends the body by its deadline: `code` says which bound.
    fn late(&mut self, code: &'static str) -> Poll<Option<Result<Frame<B::Data>, BoxError>>> {
        let state = if code == BODY_TIMEOUT {
            TIMED_OUT
        } else {
            TOO_SLOW
        };
        self.state.0.store(state, Ordering::Release);
        self.timer = None;
        tracing::debug!(
            code,
            received = self.received,
            "request body ended by its deadline"
        );
        Poll::Ready(Some(Err(Box::new(BodyLate(code)))))
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<B> Body for WatchedBody<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        use hyper::body::Buf;
        let this = self.get_mut();
        match this.state.0.load(Ordering::Acquire) {
            READING => {}
            ENDED => return Poll::Ready(None),
            TIMED_OUT => return Poll::Ready(Some(Err(Box::new(BodyLate(BODY_TIMEOUT))))),
            _ => return Poll::Ready(Some(Err(Box::new(BodyLate(BODY_TOO_SLOW))))),
        }
        let started = *this.started.get_or_insert_with(Instant::now);
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.received += data.remaining() as u64;
                }
                if this.inner.is_end_stream() {
                    this.state.0.store(ENDED, Ordering::Release);
                    this.timer = None;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                this.state.0.store(ENDED, Ordering::Release);
                this.timer = None;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Pending => {
                let Some((at, code)) = this.deadline.due(started, this.received) else {
                    return Poll::Pending;
                };
                if Instant::now() >= at {
                    return this.late(code);
                }
                let timer = match &mut this.timer {
                    Some(timer) => {
                        if timer.deadline() != at {
                            timer.as_mut().reset(at);
                        }
                        timer
                    }
                    None => this.timer.insert(Box::pin(tokio::time::sleep_until(at))),
                };
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => this.late(code),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.state.0.load(Ordering::Acquire) == ENDED
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn started(timeout: Duration) -> (SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route(
            "/",
            axum::routing::get(
                |axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>| async move {
                    format!("hello {}", peer.ip())
                },
            ),
        );
        let stop = CancellationToken::new();
        let limits = Limits {
            header_read_timeout: timeout,
            ..Limits::default()
        };
        tokio::spawn(serve(listener, app, None, stop.clone(), limits));
        (addr, stop)
    }

    /// One GET on a kept-alive connection; the response as text (small: one read).
    async fn get(tcp: &mut tokio::net::TcpStream, path: &str) -> String {
        tcp.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut buf = vec![0u8; 1024];
        let n = tcp.read(&mut buf).await.unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[tokio::test]
    async fn requests_are_served_with_the_peer_address_on_a_kept_alive_connection() {
        let (addr, stop) = started(Duration::from_secs(5)).await;
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        for _ in 0..2 {
            let text = get(&mut tcp, "/").await;
            assert!(text.starts_with("HTTP/1.1 200"), "{text}");
            assert!(text.ends_with("hello 127.0.0.1"), "{text}");
        }
        stop.cancel();
    }

    #[tokio::test]
    async fn the_front_door_serves_what_it_takes_and_hands_back_the_rest() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/", axum::routing::get(|| async { "router" }));
        struct Door;
        impl FrontDoor for Door {
            fn takes(&self, req: &axum::extract::Request) -> bool {
                req.uri().path() == "/door"
            }
            fn serve(&self, req: axum::extract::Request) -> BoxFuture<'static, Response> {
                let peer = req
                    .extensions()
                    .get::<axum::extract::ConnectInfo<SocketAddr>>()
                    .map(|c| c.0.ip().to_string());
                Box::pin(async move {
                    Response::new(axum::body::Body::from(format!(
                        "door {}",
                        peer.unwrap_or_default()
                    )))
                })
            }
        }
        let door: Arc<dyn FrontDoor> = Arc::new(Door);
        let stop = CancellationToken::new();
        tokio::spawn(serve(
            listener,
            app,
            Some(door),
            stop.clone(),
            Limits::default(),
        ));
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        for (path, body) in [
            ("/door", "door 127.0.0.1"),
            ("/", "router"),
            ("/door", "door 127.0.0.1"),
        ] {
            let text = get(&mut tcp, path).await;
            assert!(text.starts_with("HTTP/1.1 200"), "{text}");
            assert!(text.ends_with(body), "{path}: {text}");
        }
        stop.cancel();
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_headers_is_disconnected() {
        let (addr, stop) = started(Duration::from_millis(300)).await;
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let mut buf = vec![0u8; 1024];
        // hyper answers 408 (or closes); either way the connection ends, well before 5 s.
        let ended = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match tcp.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => continue,
                }
            }
        })
        .await;
        assert!(ended.is_ok(), "the slow client still holds its connection");
        stop.cancel();
    }

    /// A server whose `POST /read` collects its body and `POST /refuse` answers 401 at once.
    async fn started_with(limits: Limits) -> (SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new()
            .route(
                "/read",
                axum::routing::post(
                    |body: axum::body::Bytes| async move { format!("{}", body.len()) },
                ),
            )
            .route(
                "/refuse",
                axum::routing::post(|| async { StatusCode::UNAUTHORIZED }),
            )
            .route("/", axum::routing::get(|| async { "hello" }));
        let stop = CancellationToken::new();
        tokio::spawn(serve(listener, app, None, stop.clone(), limits));
        (addr, stop)
    }

    /// Everything the server sends until it closes the connection (at most 5 s).
    async fn until_closed(tcp: &mut tokio::net::TcpStream) -> String {
        let mut all = Vec::new();
        let mut buf = vec![0u8; 4096];
        let read = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match tcp.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => all.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        assert!(read.is_ok(), "the connection stayed open");
        String::from_utf8_lossy(&all).into_owned()
    }

    #[test]
    fn the_body_deadline_is_the_earlier_of_the_whole_and_the_rate_bound() {
        let t0 = Instant::now();
        let d = BodyDeadline {
            timeout: Duration::from_secs(60),
            min_rate: 1000,
            grace: Duration::from_secs(10),
        };
        assert_eq!(
            d.due(t0, 0),
            Some((t0 + Duration::from_secs(10), BODY_TOO_SLOW))
        );
        assert_eq!(
            d.due(t0, 5000),
            Some((t0 + Duration::from_secs(15), BODY_TOO_SLOW))
        );
        assert_eq!(
            d.due(t0, 1 << 30),
            Some((t0 + Duration::from_secs(60), BODY_TIMEOUT))
        );
        let off = BodyDeadline {
            timeout: Duration::ZERO,
            min_rate: 0,
            grace: Duration::ZERO,
        };
        assert_eq!(off.due(t0, 0), None);
    }

    #[tokio::test]
    async fn a_stalled_body_is_answered_408_at_its_deadline() {
        let (addr, stop) = started_with(Limits {
            body: BodyDeadline {
                timeout: Duration::from_millis(400),
                min_rate: 0,
                grace: Duration::ZERO,
            },
            ..Limits::default()
        })
        .await;
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let text = until_closed(&mut tcp).await;
        assert!(started.elapsed() >= Duration::from_millis(350), "{text}");
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(text.contains("connection: close"), "{text}");
        assert!(
            text.ends_with(r#"{"code":"request-body-timeout"}"#),
            "{text}"
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn a_body_under_the_minimum_rate_is_answered_408_after_the_grace() {
        let (addr, stop) = started_with(Limits {
            body: BodyDeadline {
                timeout: Duration::from_secs(30),
                min_rate: 1000,
                grace: Duration::from_millis(200),
            },
            ..Limits::default()
        })
        .await;
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
            .await
            .unwrap();
        let text = until_closed(&mut tcp).await;
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(
            text.ends_with(r#"{"code":"request-body-too-slow"}"#),
            "{text}"
        );
        // A body that arrives in time is served, and its connection kept.
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        for _ in 0..2 {
            tcp.write_all(
                b"POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789",
            )
            .await
            .unwrap();
            let mut buf = vec![0u8; 1024];
            let n = tcp.read(&mut buf).await.unwrap();
            let text = String::from_utf8_lossy(&buf[..n]);
            assert!(
                text.starts_with("HTTP/1.1 200") && text.ends_with("10"),
                "{text}"
            );
            assert!(!text.contains("connection: close"), "{text}");
        }
        stop.cancel();
    }

    #[tokio::test]
    async fn an_answer_before_the_body_is_read_closes_the_connection() {
        let (addr, stop) = started_with(Limits::default()).await;
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n0123")
            .await
            .unwrap();
        let text = until_closed(&mut tcp).await;
        assert!(text.starts_with("HTTP/1.1 401"), "{text}");
        assert!(text.contains("connection: close"), "{text}");
        stop.cancel();
    }

    #[tokio::test]
    async fn connections_over_the_caps_get_503_on_the_socket() {
        let (addr, stop) = started_with(Limits {
            max_connections: 2,
            max_connections_per_ip: 1,
            ..Limits::default()
        })
        .await;
        let mut first = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(get(&mut first, "/").await.starts_with("HTTP/1.1 200"));
        let mut second = tokio::net::TcpStream::connect(addr).await.unwrap();
        let text = until_closed(&mut second).await;
        assert!(text.starts_with("HTTP/1.1 503"), "{text}");
        assert!(text.contains("retry-after: 1"), "{text}");
        assert!(
            text.ends_with(r#"{"code":"peer-connections-exhausted"}"#),
            "{text}"
        );
        // Another address (127.0.0.2 is loopback too) is under its own cap, then the global one.
        let from = |ip: &str| {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(format!("{ip}:0").parse().unwrap()).unwrap();
            socket.connect(addr)
        };
        let mut other = from("127.0.0.2").await.unwrap();
        assert!(get(&mut other, "/").await.starts_with("HTTP/1.1 200"));
        let mut third = from("127.0.0.3").await.unwrap();
        let text = until_closed(&mut third).await;
        assert!(
            text.ends_with(r#"{"code":"connections-exhausted"}"#),
            "{text}"
        );
        // A closed connection gives its place back.
        drop(first);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            // Admitted: nothing is written to it (refused: the 503 at once).
            let mut again = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut buf = [0u8; 256];
            let read = tokio::time::timeout(Duration::from_millis(300), again.read(&mut buf));
            if read.await.is_err() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the place was not given back"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.cancel();
    }

    #[tokio::test]
    async fn the_end_stops_accepting_and_waits_for_open_requests() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (entered_tx, entered) = tokio::sync::oneshot::channel::<()>();
        let entered_tx = std::sync::Arc::new(std::sync::Mutex::new(Some(entered_tx)));
        let app = Router::new().route(
            "/slow",
            axum::routing::get(move || {
                if let Some(tx) = entered_tx.lock().unwrap().take() {
                    let _ = tx.send(());
                }
                async {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    "done"
                }
            }),
        );
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(listener, app, None, stop.clone(), Limits::default()));
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        entered.await.unwrap();
        stop.cancel();
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).await.unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("done"),
            "{answer}"
        );
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the server ended once its requests were answered")
            .unwrap();
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "no longer accepting"
        );
    }
}

/// One accepted connection, for its requests: 128 random bits, never reused (an address and
/// port are: a later connection could inherit state keyed by them). Anonymous session-less
/// callers are keyed by it (see `http::anonymous_subject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionId(pub u128);

impl ConnectionId {
    /// A new id.
    pub(super) fn new() -> Self {
        use ring::rand::SecureRandom;
        let mut bytes = [0u8; 16];
        // The system CSPRNG does not fail on Linux once booted; a zero id would only make
        // connections share an anonymous key, so fall back to a process-unique counter.
        if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
            static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            bytes[..8].copy_from_slice(&n.to_le_bytes());
        }
        ConnectionId(u128::from_le_bytes(bytes))
    }
}
