//! The forwarding hot path at the front: a 2025-era `tools/call` of a loaded or eager tool is
//! decoded only to its envelope, checked and forwarded by the multiplexer with its arguments
//! raw (`mux::fast`), and answered with the child's raw `result` spliced into the response.
//!
//! Everything else — every other method, a call the multiplexer declines (any refusal, a meta
//! tool, a task-augmented call, a `requestState` retry), a 2026-07-28 request — passes on to
//! rmcp's typed service unchanged, which serves or refuses it exactly as before. Progress, logs
//! and child→client requests of a hot-path call travel through the session's rmcp peer
//! ([`super::observer::PeerSink`]); only the final answer is written here, after the call's
//! route has drained, so it always follows them.
//!
//! - **stdio** ([`StdioFast`]): the tap sees each stdin line before rmcp (`MappedLines`), and
//!   every line to stdout goes through one [`FrontOut`] channel (rmcp's and the hot path's), so
//!   lines never interleave and keep the order they were produced in. `notifications/cancelled`
//!   for a hot-path call cancels it (upstream too) and is not passed on.
//! - **streamable HTTP** (`super::http`): see `hot_call` there.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use rmcp::Peer;
use rmcp::model::{NumberOrString, ProgressToken, RequestId};
use rmcp::service::RoleServer;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::io::AsyncWrite;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, PollSender};

use super::handler::GatewayHandler;
use super::observer::PeerSink;
use super::{meta_table, wire};
use crate::mux::RawResult;
use crate::mux::{CallContext, FastCall, Multiplexer, MuxError};
use crate::wire::needle::Needle;
use crate::wire::task_marks::Tapped;

/// A JSON-RPC message's envelope, its params left raw.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
}

/// `tools/call` params: the name and `_meta` decoded, the arguments raw; what the hot path
/// does not serve is only noticed.
#[derive(Deserialize)]
struct CallParams<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(default, rename = "_meta")]
    meta: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    task: Option<serde::de::IgnoredAny>,
    #[serde(default, rename = "requestState")]
    request_state: Option<serde::de::IgnoredAny>,
    #[serde(default, rename = "inputResponses")]
    input_responses: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct CancelParams<'a> {
    #[serde(borrow, rename = "requestId")]
    request_id: &'a RawValue,
}

/// A `tools/call` the hot path may serve: its id, the call, and the caller's progress token.
pub(super) struct Decoded {
    /// The request id, raw.
    pub id: Box<RawValue>,
    /// The call.
    pub call: FastCall,
    /// The caller's progress token.
    pub progress: Option<ProgressToken>,
}

/// Decodes a message if it is a `tools/call` the hot path may serve (2025-era, not a meta
/// tool, no task, no input round); `None` for anything else.
pub(super) fn decode_call(line: &[u8]) -> Option<Decoded> {
    static TOOLS_CALL: Needle = Needle::new(b"tools/call");
    if !TOOLS_CALL.found_in(line) {
        return None;
    }
    // Valid UTF-8 throughout, as rmcp's decoder requires: serde_json skips the fields this
    // envelope ignores without checking them (found by the admission_diff fuzz target).
    let line = std::str::from_utf8(line).ok()?;
    let env: Envelope = serde_json::from_str(line).ok()?;
    if env.jsonrpc.as_deref() != Some("2.0") || env.method.as_deref() != Some("tools/call") {
        return None;
    }
    // The id as rmcp reads it (`NumberOrString`: `1.0` is `1`, `1.5` no id at all), and only
    // when rmcp would write it back the same: the hot path echoes the raw id, rmcp its own
    // reading (found by fuzz/fuzz_targets/admission_diff.rs).
    let id = env.id?;
    let read: NumberOrString = serde_json::from_str(id.get()).ok()?;
    if serde_json::to_string(&read).ok()? != id.get() {
        return None;
    }
    let params: CallParams = serde_json::from_str(env.params?.get()).ok()?;
    // rmcp's `arguments` is an object (or absent / null): anything else is not a `tools/call`
    // rmcp would dispatch (it falls back to a custom request), so the hot path leaves it alone.
    if params
        .arguments
        .is_some_and(|a| a.get() != "null" && !a.get().starts_with('{'))
    {
        return None;
    }
    if params.task.is_some()
        || params.request_state.is_some()
        || params.input_responses.is_some()
        || meta_table::is_meta_tool(&params.name)
    {
        return None;
    }
    let mut meta = params.meta;
    // A 2026-07-28 request names its version in `_meta`: rmcp's era handling serves it.
    if meta
        .as_ref()
        .is_some_and(|m| m.contains_key("io.modelcontextprotocol/protocolVersion"))
    {
        return None;
    }
    let progress = meta
        .as_mut()
        .and_then(|m| m.remove("progressToken"))
        .and_then(|t| match t {
            serde_json::Value::String(s) => Some(NumberOrString::String(s.into())),
            serde_json::Value::Number(n) => n.as_i64().map(NumberOrString::Number),
            _ => None,
        })
        .map(ProgressToken);
    if let Some(m) = meta.as_mut() {
        m.retain(|k, _| !k.starts_with("io.modelcontextprotocol/"));
    }
    Some(Decoded {
        id: id.to_owned(),
        call: FastCall {
            name: params.name.into_owned(),
            arguments: params
                .arguments
                .filter(|a| a.get() != "null")
                .map(|a| a.to_owned()),
            meta: meta.filter(|m| !m.is_empty()),
        },
        progress,
    })
}

/// The hot path's reading of a message, for the differential fuzz target
/// (`fuzz/fuzz_targets/admission_diff.rs`): the request id (canonical), tool name and raw
/// arguments of a `tools/call` the hot path would serve itself; `None` where rmcp serves it.
pub fn hot_call_view(line: &[u8]) -> Option<(String, String, Option<String>)> {
    let d = decode_call(line)?;
    Some((
        canonical_id(&d.id)?,
        d.call.name,
        d.call.arguments.map(|a| a.get().to_string()),
    ))
}

/// The `requestId` of a `notifications/cancelled`, canonical; `None` for anything else.
fn cancelled_id(line: &[u8]) -> Option<String> {
    static CANCELLED: Needle = Needle::new(b"notifications/cancelled");
    if !CANCELLED.found_in(line) {
        return None;
    }
    let env: Envelope = serde_json::from_slice(line).ok()?;
    if env.method.as_deref() != Some("notifications/cancelled") || env.id.is_some() {
        return None;
    }
    let params: CancelParams = serde_json::from_str(env.params?.get()).ok()?;
    canonical_id(params.request_id)
}

/// A request id as one canonical string (a number or a string; anything else is no id).
fn canonical_id(id: &RawValue) -> Option<String> {
    match serde_json::from_str::<serde_json::Value>(id.get()).ok()? {
        v @ (serde_json::Value::Number(_) | serde_json::Value::String(_)) => Some(v.to_string()),
        _ => None,
    }
}

/// The JSON-RPC answer to a hot-path call: the child's raw result, or the refusal the typed
/// path would give (a tool-error result, or a JSON-RPC error).
pub(super) fn answer(id: &RawValue, outcome: Result<RawResult, MuxError>) -> Vec<u8> {
    let head = |out: &mut Vec<u8>| {
        out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
        out.extend_from_slice(id.get().as_bytes());
    };
    match outcome {
        Ok(r) => {
            let mut out = Vec::with_capacity(48 + id.get().len() + r.result.get().len());
            head(&mut out);
            out.extend_from_slice(br#","result":"#);
            out.extend_from_slice(r.result.get().as_bytes());
            out.push(b'}');
            out
        }
        Err(e) => {
            let mut out = Vec::new();
            head(&mut out);
            let tail = match wire::call_refusal(&e) {
                // A 2025-era answer: no `resultType` (rmcp leaves it out for these peers too).
                Ok(mut result) => {
                    result.result_type = None;
                    serde_json::to_string(&result).map(|r| format!(r#","result":{r}}}"#))
                }
                Err(error) => serde_json::to_string(&error).map(|e| format!(r#","error":{e}}}"#)),
            };
            match tail {
                Ok(tail) => out.extend_from_slice(tail.as_bytes()),
                Err(_) => out.extend_from_slice(
                    br#","error":{"code":-32603,"message":"the answer could not be encoded"}}"#,
                ),
            }
            out
        }
    }
}

/// The rmcp request id of a raw id (for relays tagged with the call they belong to).
pub(super) fn request_id(id: &RawValue) -> Option<RequestId> {
    serde_json::from_str(id.get()).ok()
}

/// Lines to the stdio client: rmcp's (through [`FrontOut::writer`]) and the hot path's, in the
/// order they are produced, written by one task.
#[derive(Clone)]
pub struct FrontOut {
    tx: mpsc::Sender<Vec<u8>>,
}

/// Lines queued for the client before writers wait.
const OUT_QUEUE: usize = 256;

impl FrontOut {
    /// A channel whose lines `pump` writes to the client (each through `map`).
    pub fn new() -> (FrontOut, mpsc::Receiver<Vec<u8>>) {
        let (tx, rx) = mpsc::channel(OUT_QUEUE);
        (FrontOut { tx }, rx)
    }

    /// Queues one complete line (newline included).
    pub async fn send(&self, line: Vec<u8>) -> Result<(), ()> {
        self.tx.send(line).await.map_err(|_| ())
    }

    /// rmcp's writer into this channel.
    pub fn writer(&self) -> OutWriter {
        OutWriter {
            tx: PollSender::new(self.tx.clone()),
            buf: Vec::new(),
        }
    }
}

/// rmcp's side of [`FrontOut`]: bytes are collected until a flush, and each complete message
/// is queued whole.
pub struct OutWriter {
    tx: PollSender<Vec<u8>>,
    buf: Vec<u8>,
}

impl AsyncWrite for OutWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while let Some(end) = memchr::memchr(b'\n', &this.buf) {
            std::task::ready!(this.tx.poll_reserve(cx))
                .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
            let rest = this.buf.split_off(end + 1);
            let line = std::mem::replace(&mut this.buf, rest);
            this.tx
                .send_item(line)
                .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.as_mut().poll_flush(cx))?;
        self.get_mut().tx.close();
        Poll::Ready(Ok(()))
    }
}

/// Writes queued lines to `to`, each through `map`; several queued lines go out in one write.
/// Ends when every sender is gone or a write fails.
pub async fn pump_out(
    mut rx: mpsc::Receiver<Vec<u8>>,
    mut to: impl AsyncWrite + Unpin,
    map: fn(&[u8]) -> Option<Vec<u8>>,
) {
    use tokio::io::AsyncWriteExt;
    let mut batch = Vec::new();
    while let Some(first) = rx.recv().await {
        batch.clear();
        let mut line = Some(first);
        while let Some(l) = line.take() {
            let body = l.strip_suffix(b"\n").unwrap_or(&l);
            match map(body) {
                Some(mapped) => {
                    batch.extend_from_slice(&mapped);
                    batch.push(b'\n');
                }
                None => batch.extend_from_slice(&l),
            }
            if batch.len() < 64 * 1024 {
                line = rx.try_recv().ok();
            }
        }
        if to.write_all(&batch).await.is_err() || to.flush().await.is_err() {
            break;
        }
        // One large answer must not pin its size for the session's life.
        batch.shrink_to(64 * 1024);
    }
}

/// The stdio front's hot path: taps stdin lines, serves the calls it takes.
pub struct StdioFast {
    mux: Arc<Multiplexer>,
    handler: GatewayHandler,
    /// The session's rmcp peer, once its handshake is done (none: everything goes to rmcp).
    peer: OnceLock<Peer<RoleServer>>,
    out: FrontOut,
    /// Hot-path calls in flight, by canonical request id.
    inflight: Mutex<HashMap<String, CancellationToken>>,
}

impl StdioFast {
    /// The hot path of the stdio session served by `handler`, answering through `out`.
    pub fn new(mux: Arc<Multiplexer>, handler: GatewayHandler, out: FrontOut) -> Arc<Self> {
        Arc::new(StdioFast {
            mux,
            handler,
            peer: OnceLock::new(),
            out,
            inflight: Mutex::default(),
        })
    }

    /// The session's handshake is done: calls may take the hot path from now on.
    pub fn ready(&self, peer: Peer<RoleServer>) {
        let _ = self.peer.set(peer);
    }

    /// Looks at one stdin line before rmcp: takes the calls it serves (and cancellations of
    /// them); everything else passes.
    pub fn tap(self: &Arc<Self>, line: &[u8]) -> Tapped {
        let Some(peer) = self.peer.get() else {
            return Tapped::Pass;
        };
        if let Some(id) = cancelled_id(line) {
            let ct = self
                .inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            return match ct {
                Some(ct) => {
                    ct.cancel();
                    Tapped::Taken
                }
                None => Tapped::Pass,
            };
        }
        let Some(decoded) = decode_call(line) else {
            return Tapped::Pass;
        };
        let Some(key) = canonical_id(&decoded.id) else {
            return Tapped::Pass;
        };
        let caller = self.handler.stdio_caller(peer);
        let Some(target) = self.mux.fast_target(&caller, &decoded.call, false) else {
            return Tapped::Pass;
        };
        let ct = CancellationToken::new();
        {
            let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            // A reused id of a call still in flight: the typed path owns that conflict.
            if inflight.contains_key(&key) {
                return Tapped::Pass;
            }
            inflight.insert(key.clone(), ct.clone());
        }
        let sink = request_id(&decoded.id).map(|front_id| {
            Arc::new(PeerSink::for_peer(peer.clone(), front_id)) as Arc<dyn crate::mux::FrontSink>
        });
        crate::telemetry::metrics().hot_call("stdio");
        let this = self.clone();
        tokio::spawn(async move {
            let cx = CallContext {
                ct,
                progress_token: decoded.progress,
                sink,
                tool: String::new(),
            };
            this.mux.deliver_pending(&caller.session).await;
            let outcome = this
                .mux
                .call_tool_fast(&caller, target, decoded.call, cx)
                .await;
            this.inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&key);
            let mut line = answer(&decoded.id, outcome);
            line.push(b'\n');
            let _ = this.out.send(line).await;
        });
        Tapped::Taken
    }
}

/// The HTTP hot path's answer to one call (`super::http` decides when to ask).
pub(super) mod http {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
    use axum::response::Response;
    use futures::future::BoxFuture;
    use rmcp::ErrorData;
    use rmcp::model::{ClientResult, ServerRequest};
    use tokio::sync::mpsc;
    use tokio_util::sync::CancellationToken;

    use super::{Decoded, answer, cancelled_id, canonical_id, decode_call};
    use crate::auth::Identity;
    use crate::mux::session_store::{Fetched, now_ms};
    use crate::mux::{CallContext, Caller, ClientCaps, FrontNote, FrontSink, Multiplexer};
    use crate::server::sessions::BoundedSessionManager;
    use crate::server::streams::{HeldSession, HotState, HttpFront};

    /// A hot-path answer already in its 2025 form (`super::http::admit` passes it on as is).
    #[derive(Clone, Copy)]
    pub struct Unmarked;

    /// The 2025-era protocol versions a session request may name in its header.
    const LEGACY_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

    /// What the hot path needs of the HTTP front.
    pub struct Hot<'a> {
        /// The multiplexer.
        pub mux: &'a Arc<Multiplexer>,
        /// The front's sessions.
        pub front: &'a HttpFront,
        /// rmcp's sessions (their idle timers).
        pub manager: &'a Arc<BoundedSessionManager>,
        /// The sessions' idle lifetime.
        pub idle: Duration,
    }

    /// `host[:port]` as rmcp compares it (brackets trimmed, lower case).
    fn authority(value: &str) -> Option<(String, Option<u16>)> {
        let a = axum::http::uri::Authority::try_from(value).ok()?;
        let host = a
            .host()
            .trim_matches('[')
            .trim_matches(']')
            .to_ascii_lowercase();
        Some((host, a.port_u16()))
    }

    /// A media type without its parameters.
    fn essence(v: &str) -> &str {
        v.split(';').next().unwrap_or("").trim()
    }

    /// The `Host` values rmcp accepts, parsed once (not per request).
    pub struct AllowedHosts {
        /// `None`: any host (rmcp's empty list).
        hosts: Option<Vec<(String, Option<u16>)>>,
    }

    impl AllowedHosts {
        /// rmcp's `allowed_hosts` list, compared the way rmcp compares it.
        pub fn new(allowed: &[String]) -> Self {
            if allowed.is_empty() {
                return Self { hosts: None };
            }
            let hosts = allowed
                .iter()
                .map(|a| a.trim())
                .filter(|a| !a.is_empty())
                .map(|a| {
                    authority(a).unwrap_or_else(|| {
                        (
                            a.trim_matches('[').trim_matches(']').to_ascii_lowercase(),
                            None,
                        )
                    })
                })
                .collect();
            Self { hosts: Some(hosts) }
        }

        fn admits(&self, host: &str, port: Option<u16>) -> bool {
            self.hosts.as_ref().is_none_or(|hosts| {
                hosts
                    .iter()
                    .any(|(h, p)| h.eq_ignore_ascii_case(host) && p.is_none_or(|p| port == Some(p)))
            })
        }
    }

    /// Whether rmcp's checks of a session POST would pass on these headers, judged
    /// conservatively: anything the hot path does not mirror exactly (an `Origin`, another
    /// `Mcp-*` header, an unusual version) sends the request to rmcp, which decides.
    /// Allocation-free: it runs on every forwarded call.
    pub fn headers_pass(headers: &HeaderMap, allowed: &AllowedHosts) -> bool {
        // DNS-rebinding protection: the same Host rule as rmcp; browsers' requests (which
        // carry an Origin) always take rmcp's path.
        if headers.contains_key(header::ORIGIN) {
            return false;
        }
        let Some(host) = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| axum::http::uri::Authority::try_from(h).ok())
        else {
            return false;
        };
        let name = host.host().trim_matches('[').trim_matches(']');
        if !allowed.admits(name, host.port_u16()) {
            return false;
        }
        let content_json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| essence(v).eq_ignore_ascii_case("application/json"));
        if !content_json {
            return false;
        }
        let (mut json, mut sse) = (false, false);
        for accepted in headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(essence)
        {
            json |= accepted.eq_ignore_ascii_case("application/json");
            sse |= accepted.eq_ignore_ascii_case("text/event-stream");
        }
        if !json || !sse {
            return false;
        }
        headers.iter().all(|(name, value)| {
            let name = name.as_str();
            if !name.starts_with("mcp-") || name == "mcp-session-id" {
                return true;
            }
            name == "mcp-protocol-version"
                && value
                    .to_str()
                    .is_ok_and(|v| LEGACY_VERSIONS.contains(&v.trim()))
        })
    }

    /// Progress and logs of a hot-path call, as SSE events of its response.
    struct HttpSink {
        tx: mpsc::Sender<Vec<u8>>,
    }

    fn event(json: &[u8]) -> Vec<u8> {
        let mut e = Vec::with_capacity(json.len() + 8);
        e.extend_from_slice(b"data: ");
        e.extend_from_slice(json);
        e.extend_from_slice(b"\n\n");
        e
    }

    impl FrontSink for HttpSink {
        fn send(&self, note: FrontNote) -> BoxFuture<'static, Result<(), ()>> {
            let (method, params) = match note {
                FrontNote::Progress(p) => ("notifications/progress", serde_json::to_value(p)),
                FrontNote::Log(l) => ("notifications/message", serde_json::to_value(l)),
            };
            let tx = self.tx.clone();
            Box::pin(async move {
                let params = params.map_err(|_| ())?;
                let json = serde_json::to_vec(&serde_json::json!({
                    "jsonrpc": "2.0", "method": method, "params": params,
                }))
                .map_err(|_| ())?;
                tx.send(event(&json)).await.map_err(|_| ())
            })
        }

        /// Never reached: the hot path serves only clients that declared no capability a
        /// child's request could be relayed to (graph-os answers those requests itself).
        fn relay(&self, _: ServerRequest) -> BoxFuture<'static, Result<ClientResult, ErrorData>> {
            Box::pin(async {
                Err(crate::mux::relay_refusal(
                    crate::mux::relay_code::CAPABILITY_MISSING,
                    "the calling client declared no capability for this request",
                ))
            })
        }

        fn closed(&self) -> bool {
            self.tx.is_closed()
        }
    }

    /// Serves a session's `tools/call` beside rmcp (or the cancellation of one it serves),
    /// or `None` (nothing done) when it is not one; then rmcp serves the request.
    pub async fn serve(
        hot: Hot<'_>,
        session_id: &str,
        identity: Identity,
        fetched: &Fetched,
        body: &[u8],
    ) -> Option<Response> {
        if let Some(id) = cancelled_id(body) {
            let held = hot.front.legacy_session(session_id)?;
            let ct = held
                .hot
                .inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id)?;
            ct.cancel();
            let mut accepted = Response::new(Body::empty());
            *accepted.status_mut() = StatusCode::ACCEPTED;
            return Some(accepted);
        }
        // A list change noticed while the session had no stream anywhere (its client opened no
        // GET stream) is sent on the session's next request: first on this call's event
        // stream. The store's fetch took it for this request; rmcp's typed path could send it
        // only on a GET stream, so a stream-less session declined here would keep it pending
        // forever (and never take the hot path).
        let pending = fetched.pending;
        let Decoded { id, call, progress } = decode_call(body)?;
        let key = canonical_id(&id)?;
        let HeldSession {
            front,
            peer,
            hot: state,
        } = hot.front.legacy_session(session_id)?;
        let mut caps = ClientCaps::from_declared(&peer.peer_info()?.capabilities);
        // A child's request for the client must travel on this call's rmcp stream.
        if caps.roots || caps.sampling || caps.elicitation_form || caps.elicitation_url {
            return None;
        }
        caps.tasks = false;
        hot.mux.adopt_loaded(&front.session, fetched.loaded.clone());
        let caller = Caller::new(identity, front.session.clone(), caps);
        let target = hot.mux.fast_target(&caller, &call, false)?;
        let ct = CancellationToken::new();
        {
            let mut inflight = state.inflight.lock().unwrap_or_else(|p| p.into_inner());
            // A reused id of a call still in flight: the typed path owns that conflict.
            if inflight.contains_key(&key) {
                return None;
            }
            inflight.insert(key.clone(), ct.clone());
        }
        touch(&hot, session_id, &state.touched);
        crate::telemetry::metrics().hot_call("http");
        let (tx, mut notes) = mpsc::channel::<Vec<u8>>(64);
        // The call's end drops its sink; were that the last sender, closing the channel would
        // wake this task (its receiver is polled below) while it runs, and tokio would then
        // hand the connection to another worker (a wake-up and a migration per call). A second
        // sender is kept until the receiver is gone.
        let held = tx.clone();
        // A client that goes away cancels the call (upstream too).
        let mut guard = Some(ct.clone().drop_guard());
        let mux = hot.mux.clone();
        let cx = CallContext {
            ct,
            progress_token: progress,
            sink: Some(Arc::new(HttpSink { tx }) as Arc<dyn FrontSink>),
            tool: String::new(),
        };
        let mut call = Box::pin(async move {
            let _done = Done(state, key);
            mux.deliver_pending(&caller.session).await;
            let outcome = mux.call_tool_fast(&caller, target, call, cx).await;
            answer(&id, outcome)
        });
        let mut queued = std::collections::VecDeque::new();
        if pending {
            queued.push_back(event(LIST_CHANGED));
        }
        let mut call = tokio::select! {
            biased;
            answered = &mut call => {
                // Notes the call wrote before it ended go first, on an event stream.
                while let Ok(note) = notes.try_recv() {
                    queued.push_back(note);
                }
                if let Some(g) = guard.take() {
                    g.disarm();
                }
                if queued.is_empty() {
                    drop(notes);
                    drop(held);
                    return Some(json_response(answered));
                }
                queued.push_back(event(&answered));
                None
            }
            note = notes.recv() => {
                // Progress or a log came first: an event stream (notes, then the result).
                queued.extend(note);
                Some(call)
            }
        };
        let stream = futures::stream::poll_fn(move |cx| {
            use std::task::Poll;
            let _ = (&guard, &held);
            loop {
                if let Some(frame) = queued.pop_front() {
                    return Poll::Ready(Some(Ok::<_, std::convert::Infallible>(frame)));
                }
                let Some(running) = call.as_mut() else {
                    return Poll::Ready(None);
                };
                if let Poll::Ready(Some(note)) = notes.poll_recv(cx) {
                    queued.push_back(note);
                    continue;
                }
                match running.as_mut().poll(cx) {
                    Poll::Ready(answered) => {
                        call = None;
                        // Notes written before the call ended go first.
                        while let Ok(note) = notes.try_recv() {
                            queued.push_back(note);
                        }
                        queued.push_back(event(&answered));
                    }
                    Poll::Pending => return Poll::Pending,
                }
            }
        });
        let mut response = Response::new(Body::from_stream(stream));
        let h = response.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        h.insert("x-accel-buffering", HeaderValue::from_static("no"));
        Some(response)
    }

    /// The notice a pending list change is delivered as.
    const LIST_CHANGED: &[u8] = br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#;

    /// Forgets an in-flight call when it ends (or its client is gone).
    struct Done(Arc<HotState>, String);

    impl Drop for Done {
        fn drop(&mut self) {
            self.0
                .inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&self.1);
        }
    }

    fn json_response(answered: Vec<u8>) -> Response {
        let body = crate::wire::task_marks::unmark_front_message(&answered).unwrap_or(answered);
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = StatusCode::OK;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response.extensions_mut().insert(Unmarked);
        response
    }

    /// Requests served beside rmcp do not reach the session's worker, whose idle timer would
    /// then end a busy session: it is reset with a no-op notification a few times per idle
    /// period.
    fn touch(hot: &Hot<'_>, session_id: &str, touched: &std::sync::atomic::AtomicU64) {
        let now = now_ms();
        let every = (hot.idle.as_millis() as u64 / 4).max(1);
        let last = touched.load(Ordering::Relaxed);
        if now.saturating_sub(last) < every
            || touched
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        use rmcp::transport::streamable_http_server::session::SessionManager;
        let manager = hot.manager.clone();
        let id: rmcp::transport::streamable_http_server::session::SessionId =
            session_id.to_string().into();
        tokio::spawn(async move {
            let note = rmcp::model::ClientNotification::CustomNotification(
                rmcp::model::CustomNotification::new(TOUCH_METHOD, None),
            );
            let message = rmcp::model::ClientJsonRpcMessage::notification(note);
            let _ = manager.accept_message(&id, message).await;
        });
    }

    /// The no-op notification that resets a session's idle timer.
    pub const TOUCH_METHOD: &str = "notifications/graph-os/touch";

    #[cfg(test)]
    mod tests {
        use super::*;

        fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.append(
                    axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            h
        }

        #[test]
        fn only_requests_rmcp_would_accept_take_the_hot_path() {
            let allowed = AllowedHosts::new(
                &["localhost", "127.0.0.1:8004", "[::1]", " "]
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>(),
            );
            let base = [
                ("host", "127.0.0.1:8004"),
                ("content-type", "application/json"),
                ("accept", "application/json, text/event-stream"),
                ("mcp-session-id", "abc"),
                ("mcp-protocol-version", "2025-11-25"),
            ];
            assert!(headers_pass(&headers(&base), &allowed));
            assert!(headers_pass(
                &headers(&[("host", "LOCALHOST:1"), base[1], base[2]]),
                &allowed
            ));
            assert!(headers_pass(
                &headers(&[("host", "[::1]:9"), base[1], base[2]]),
                &allowed
            ));
            for bad in [
                vec![("host", "127.0.0.1:9"), base[1], base[2]],
                vec![("host", "evil.example"), base[1], base[2]],
                vec![base[0], base[1], base[2], ("origin", "http://localhost:1")],
                vec![base[0], ("content-type", "text/plain"), base[2]],
                vec![base[0], base[1], ("accept", "application/json")],
                vec![
                    base[0],
                    base[1],
                    base[2],
                    ("mcp-protocol-version", "2026-07-28"),
                ],
                vec![base[0], base[1], base[2], ("mcp-method", "tools/call")],
                vec![base[1], base[2]],
            ] {
                assert!(!headers_pass(&headers(&bad), &allowed), "{bad:?}");
            }
            // rmcp's empty list admits any host; media types compare without case.
            let any = AllowedHosts::new(&[]);
            assert!(headers_pass(
                &headers(&[("host", "evil.example"), base[1], base[2]]),
                &any
            ));
            assert!(headers_pass(
                &headers(&[
                    base[0],
                    ("content-type", "Application/JSON; charset=utf-8"),
                    ("accept", "text/event-stream"),
                    ("accept", " application/json;q=1"),
                ]),
                &allowed
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_call_is_decoded_with_its_arguments_raw() {
        let d = decode_call(
            br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"tc__add","arguments":{"b": 2, "a":1},"_meta":{"progressToken":"p1","k":1,"io.modelcontextprotocol/x":2}}}"#,
        )
        .expect("decoded");
        assert_eq!(d.id.get(), "7");
        assert_eq!(d.call.name, "tc__add");
        assert_eq!(d.call.arguments.unwrap().get(), r#"{"b": 2, "a":1}"#);
        assert_eq!(
            d.progress,
            Some(ProgressToken(NumberOrString::String("p1".into())))
        );
        let meta = d.call.meta.unwrap();
        assert_eq!(
            meta.len(),
            1,
            "progress token and protocol keys are not passed on"
        );
        assert_eq!(meta["k"], 1);
    }

    #[test]
    fn what_the_hot_path_does_not_serve_passes() {
        for line in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#[..],
            br#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"a"}}"#,
            br#"{"id":1,"method":"tools/call","params":{"name":"a"}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","task":{}}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","requestState":"s"}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"find_tools","arguments":{}}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call""#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#,
        ] {
            assert!(decode_call(line).is_none(), "{}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn what_rmcp_would_not_dispatch_as_that_call_is_not_hot() {
        // Found by the admission_diff fuzz target: rmcp reads these differently (a custom
        // request, an id it writes back as `1`), so only rmcp may answer them.
        for line in [
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"tc__add","arguments":3}}"#,
            r#"{"jsonrpc":"2.0","id":1.0,"method":"tools/call","params":{"name":"tc__add","arguments":{}}}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":"tools/call","params":{"name":"tc__add"}}"#,
            r#"{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{"name":"tc__add"}}"#,
        ] {
            assert!(decode_call(line.as_bytes()).is_none(), "{line}");
        }
        let ok = r#"{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"tc__add","arguments":null}}"#;
        assert!(decode_call(ok.as_bytes()).is_some());
    }

    #[test]
    fn null_arguments_are_no_arguments() {
        let d = decode_call(
            br#"{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"a","arguments":null}}"#,
        )
        .unwrap();
        assert!(d.call.arguments.is_none());
        assert_eq!(canonical_id(&d.id).unwrap(), r#""x""#);
    }

    #[test]
    fn cancellations_name_the_request_canonically() {
        assert_eq!(
            cancelled_id(
                br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"r"}}"#
            )
            .as_deref(),
            Some("7")
        );
        assert_eq!(
            cancelled_id(
                br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId": "a"}}"#
            )
            .as_deref(),
            Some(r#""a""#)
        );
        assert!(cancelled_id(br#"{"jsonrpc":"2.0","method":"notifications/progress"}"#).is_none());
    }

    #[test]
    fn answers_splice_the_raw_result_or_give_the_typed_refusal() {
        let id = RawValue::from_string("\"r1\"".into()).unwrap();
        let ok = answer(
            &id,
            Ok(RawResult {
                result: RawValue::from_string(r#"{"content":[],"isError":false}"#.into()).unwrap(),
                is_error: false,
            }),
        );
        assert_eq!(
            std::str::from_utf8(&ok).unwrap(),
            r#"{"jsonrpc":"2.0","id":"r1","result":{"content":[],"isError":false}}"#
        );
        let refused = answer(&id, Err(MuxError::UnknownTool("nope".into())));
        let v: serde_json::Value = serde_json::from_slice(&refused).unwrap();
        assert_eq!(v["id"], "r1");
        assert!(v["error"]["code"].is_i64(), "{v}");
        let busy = answer(
            &id,
            Err(MuxError::child(
                "s",
                crate::mux::CallError::Busy {
                    server: "s".into(),
                    waited: std::time::Duration::from_secs(1),
                },
            )),
        );
        let v: serde_json::Value = serde_json::from_slice(&busy).unwrap();
        assert_eq!(v["result"]["isError"], true, "{v}");
        assert!(v["result"].get("resultType").is_none());
    }

    #[tokio::test]
    async fn rmcp_messages_and_hot_path_answers_keep_their_order() {
        use tokio::io::AsyncWriteExt;
        let (out, rx) = FrontOut::new();
        let mut w = out.writer();
        let (client, server) = tokio::io::duplex(1 << 20);
        let pump = tokio::spawn(pump_out(rx, server, |_| None));
        w.write_all(b"{\"a\":").await.unwrap();
        w.write_all(b"1}\n").await.unwrap();
        w.flush().await.unwrap();
        out.send(b"{\"b\":2}\n".to_vec()).await.unwrap();
        w.write_all(b"{\"c\":3}\n{\"d\":4}\n").await.unwrap();
        w.flush().await.unwrap();
        drop((w, out));
        pump.await.unwrap();
        let mut text = String::new();
        use tokio::io::AsyncReadExt;
        let mut client = client;
        client.read_to_string(&mut text).await.unwrap();
        assert_eq!(text, "{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n{\"d\":4}\n");
    }
}
