//! JSON-RPC frame handling on the HTTP front: any body, method and header combination on `/mcp`
//! (the real router: admission, body bound, rmcp's streamable HTTP service, the gateway handler)
//! gives an HTTP answer, never a panic or a hang.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use axum::Router;
use graph_os::config::Fleet;
use graph_os::mux::{Multiplexer, MuxSettings};
use graph_os::server::http::{HttpOptions, mcp_router, session_store};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

struct World {
    rt: tokio::runtime::Runtime,
    router: Router,
    session: std::sync::Mutex<Option<String>>,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let state = std::env::temp_dir().join(format!("graph-os-fuzz-http-{}", std::process::id()));
        let router = rt.block_on(async {
            let mux = Multiplexer::start(
                Fleet::empty("fuzz"),
                MuxSettings {
                    state_dir: state,
                    ..Default::default()
                },
            )
            .expect("the multiplexer starts");
            let opts = HttpOptions {
                max_request_bytes: 1 << 20,
                ..HttpOptions::new("127.0.0.1:8004".parse().unwrap())
            };
            let store = session_store(&opts);
            // The router (admission in front of rmcp's service); the listener's front door
            // runs the same admission.
            let (router, _door) = mcp_router(
                mux,
                &opts,
                store,
                tokio_util::sync::CancellationToken::new(),
                tokio_util::sync::CancellationToken::new(),
            );
            router
        });
        World {
            rt,
            router,
            session: std::sync::Mutex::new(None),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let flags = data[0];
    let body = data[1..].to_vec();
    let w = world();
    let method = match flags & 3 {
        0 | 1 => http::Method::POST,
        2 => http::Method::GET,
        _ => http::Method::DELETE,
    };
    let mut req = http::Request::builder()
        .method(method)
        .uri("/mcp")
        .header(http::header::HOST, if flags & 4 == 0 { "127.0.0.1:8004" } else { "evil.example" });
    if flags & 8 == 0 {
        req = req.header(http::header::CONTENT_TYPE, "application/json");
    }
    req = req.header(
        http::header::ACCEPT,
        if flags & 16 == 0 { "application/json, text/event-stream" } else { "text/event-stream" },
    );
    if flags & 32 != 0 {
        req = req.header("mcp-protocol-version", if flags & 64 == 0 { "2025-11-25" } else { "2026-07-28" });
    }
    if flags & 128 != 0
        && let Some(id) = w.session.lock().unwrap().clone()
    {
        req = req.header("mcp-session-id", id);
    }
    let req = req.body(axum::body::Body::from(body)).unwrap();
    let router = w.router.clone();
    w.rt.block_on(async {
        let resp = tokio::time::timeout(Duration::from_secs(5), router.oneshot(req))
            .await
            .expect("the front did not answer within 5 s")
            .expect("infallible");
        if let Some(id) = resp.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()) {
            *w.session.lock().unwrap() = Some(id.to_string());
        }
        // Streams may stay open (SSE): read what comes within a short time, bounded.
        let mut body = resp.into_body();
        let mut read = 0usize;
        let _ = tokio::time::timeout(Duration::from_millis(200), async {
            while let Some(Ok(frame)) = body.frame().await {
                if let Some(d) = frame.data_ref() {
                    read += d.len();
                    if read > 4 << 20 {
                        break;
                    }
                }
            }
        })
        .await;
    });
});
