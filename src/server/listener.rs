//! The HTTP listener's connections: accepted sockets served as HTTP/1.1 by hyper, with
//! `TCP_NODELAY`, a bound on how long a client may take to send a request's headers, and a
//! graceful end.
//!
//! Written out rather than `axum::serve`: axum 0.8's `serve` gives hyper no timer, so hyper's
//! header-read timeout never applies and a client that sends a request's headers a byte at a
//! time (slowloris) holds its connection, a task and a file descriptor for as long as it likes.
//! An idle keep-alive connection is bounded the same way: hyper times out the wait for the next
//! request's headers too.
//!
//! A [`FrontDoor`] takes the requests it serves itself straight from the connection, past the
//! router: `/mcp` (every forwarded call) skips axum's routing and a middleware layer's boxing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::response::Response;
use futures::future::{BoxFuture, Either, FutureExt};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// How long a client may take to send a request's headers, from the connection's start or
/// the end of its previous response (then an idle keep-alive connection is closed).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a failed `accept` (out of file descriptors) pauses the loop.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

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
/// `header_read_timeout`: see [`HEADER_READ_TIMEOUT`].
pub async fn serve(
    listener: TcpListener,
    app: Router,
    door: Option<Arc<dyn FrontDoor>>,
    stop: CancellationToken,
    header_read_timeout: Duration,
) {
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .keep_alive(true);
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
        // SSE responses are written in small frames: Nagle's algorithm meeting the client's
        // delayed ACK cost ~40 ms per call.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        let app = app.clone();
        let door = door.clone();
        let connection = ConnectionId::new();
        let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
            let mut req = req.map(axum::body::Body::new);
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo::<SocketAddr>(peer));
            req.extensions_mut().insert(connection);
            match &door {
                Some(door) if door.takes(&req) => {
                    Either::Left(door.serve(req).map(Ok::<_, std::convert::Infallible>))
                }
                _ => Either::Right(app.clone().oneshot(req)),
            }
        });
        // A request body wakes the connection's own task (see `self_wake`).
        let conn = super::self_wake::SelfWakeCoalesced::new(
            graceful.watch(http.serve_connection(TokioIo::new(tcp), service)),
        );
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "HTTP connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
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
        tokio::spawn(serve(listener, app, None, stop.clone(), timeout));
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
            HEADER_READ_TIMEOUT,
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
        let server = tokio::spawn(serve(
            listener,
            app,
            None,
            stop.clone(),
            HEADER_READ_TIMEOUT,
        ));
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
