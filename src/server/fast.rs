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
use crate::child::RawResult;
use crate::mux::{CallContext, FastCall, Multiplexer, MuxError};
use crate::transport::task_marks::Tapped;

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
    memchr::memmem::find(line, b"tools/call")?;
    let env: Envelope = serde_json::from_slice(line).ok()?;
    if env.jsonrpc.as_deref() != Some("2.0") || env.method.as_deref() != Some("tools/call") {
        return None;
    }
    let id = env.id?;
    let params: CallParams = serde_json::from_str(env.params?.get()).ok()?;
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

/// The `requestId` of a `notifications/cancelled`, canonical; `None` for anything else.
fn cancelled_id(line: &[u8]) -> Option<String> {
    memchr::memmem::find(line, b"notifications/cancelled")?;
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
                crate::child::CallError::Busy {
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
