//! The forwarding hot path at the child: a `tools/call` whose arguments and result stay raw
//! JSON.
//!
//! Everything that makes a call safe is the same as on the typed path ([`ChildRuntime::admit`]:
//! state, breaker, queue timeout, the principal's share and the concurrency bound; the lease:
//! pool or per-session connection; the call timeout with cancellation sent upstream; the crash
//! retry of a read-only call, resolved again first ([`ChildRuntime::crash_retry`]); the call's
//! route for progress, logs and child→client requests; metrics and the
//! call span). Only the bytes differ: on a connection with a raw channel (a 2025-era stdio child,
//! see `transport::raw_link`) the request is written as one line built around the caller's raw
//! arguments and the child's `result` comes back unparsed; on any other connection the call
//! takes the typed path and its result is serialized once.

use std::sync::Arc;

use rmcp::ErrorData;
use rmcp::model::{CallToolResponse, NumberOrString, ProgressToken};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::{CallError, CallObserver, ChildRuntime, Connection, Retry, SessionTag};
use crate::transport::raw_link::{ID_PREFIX, RawLink};

/// A `tools/call` with raw arguments (the hot path).
#[derive(Debug, Clone)]
pub struct RawToolCall {
    /// The child's own name of the tool.
    pub name: String,
    /// `arguments` exactly as the caller sent them (an object), if any.
    pub arguments: Option<Box<RawValue>>,
    /// `_meta` keys passed to the child (the caller's, minus its progress token and the
    /// front's protocol envelope).
    pub meta: Option<serde_json::Map<String, serde_json::Value>>,
}

/// A child's answer to a raw call: its `result` object, unparsed, and whether it is a tool
/// error (`isError: true`).
#[derive(Debug)]
pub struct RawResult {
    /// The `result` object.
    pub result: Box<RawValue>,
    /// `isError` of the result.
    pub is_error: bool,
}

/// What the hot path needs to know of a result without parsing its content.
#[derive(Deserialize)]
struct Shape<'a> {
    #[serde(default)]
    content: Option<serde::de::IgnoredAny>,
    #[serde(default, rename = "structuredContent")]
    structured: Option<serde::de::IgnoredAny>,
    #[serde(default, rename = "isError")]
    is_error: Option<bool>,
    #[serde(borrow, default, rename = "resultType")]
    result_type: Option<std::borrow::Cow<'a, str>>,
}

/// A JSON-RPC response line, its result left raw.
#[derive(Deserialize)]
struct Response<'a> {
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<ErrorData>,
}

fn unexpected(what: &str) -> CallError {
    CallError::Rpc(ErrorData::internal_error(
        format!("child answered tools/call with {what}"),
        None,
    ))
}

/// Checks a `result` is a complete `CallToolResult` and reads `isError`.
pub(crate) fn shape(result: &RawValue) -> Result<bool, CallError> {
    let shape: Shape = serde_json::from_str(result.get())
        .map_err(|_| unexpected("a result that is not an object"))?;
    if shape
        .result_type
        .as_deref()
        .is_some_and(|t| t != "complete")
    {
        return Err(unexpected("an unexpected result type"));
    }
    if shape.content.is_none() && shape.structured.is_none() {
        return Err(unexpected("a result without content"));
    }
    Ok(shape.is_error == Some(true))
}

/// The child's answer line: its raw result, or its JSON-RPC error.
fn parse_response(line: &[u8]) -> Result<RawResult, CallError> {
    let response: Response =
        serde_json::from_slice(line).map_err(|_| unexpected("a response that is not JSON-RPC"))?;
    if let Some(error) = response.error {
        return Err(CallError::Rpc(error));
    }
    let Some(result) = response.result else {
        return Err(unexpected("neither a result nor an error"));
    };
    let is_error = shape(result)?;
    Ok(RawResult {
        result: result.to_owned(),
        is_error,
    })
}

/// The request line of a raw call (`id` and progress token: `id_json`).
fn request_line(id_json: &str, call: &RawToolCall) -> Result<Vec<u8>, CallError> {
    let mut meta = call.meta.clone().unwrap_or_default();
    if crate::telemetry::trace::enabled() {
        crate::telemetry::trace::inject_meta(&mut meta);
    }
    let name = serde_json::to_string(&call.name).map_err(|e| unexpected(&e.to_string()))?;
    let meta = serde_json::to_string(&meta).map_err(|e| unexpected(&e.to_string()))?;
    let arguments = call.arguments.as_deref().map(RawValue::get);
    let mut line = Vec::with_capacity(
        96 + id_json.len() * 2 + name.len() + meta.len() + arguments.map_or(0, str::len),
    );
    line.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    line.extend_from_slice(id_json.as_bytes());
    line.extend_from_slice(br#","method":"tools/call","params":{"name":"#);
    line.extend_from_slice(name.as_bytes());
    if let Some(arguments) = arguments {
        line.extend_from_slice(br#","arguments":"#);
        line.extend_from_slice(arguments.as_bytes());
    }
    // The progress token is the request id: the call's route is bound to it.
    line.extend_from_slice(br#","_meta":{"progressToken":"#);
    line.extend_from_slice(id_json.as_bytes());
    if meta.len() > 2 {
        line.push(b',');
        line.extend_from_slice(&meta.as_bytes()[1..]);
    } else {
        line.push(b'}');
    }
    line.extend_from_slice(b"}}\n");
    Ok(line)
}

/// `notifications/cancelled` for a raw request.
async fn cancel_raw(link: &RawLink, id_json: &str, reason: &str) {
    let line = format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id_json},"reason":{}}}}}"#,
        serde_json::Value::String(reason.to_string())
    );
    let mut line = line.into_bytes();
    line.push(b'\n');
    let _ = link.send(&line).await;
}

impl ChildRuntime {
    /// Forwards one `tools/call` with raw arguments under the child's limits (see the module
    /// documentation): the same admission, lease, timeout, cancellation, retry, routing and
    /// telemetry as [`Self::call_tool`].
    pub async fn call_tool_raw(
        &self,
        call: &RawToolCall,
        retry: Retry,
        observer: Option<Arc<dyn CallObserver>>,
        ct: CancellationToken,
        session: Option<&SessionTag>,
    ) -> Result<RawResult, CallError> {
        let code = |r: &RawResult| if r.is_error { "tool-error" } else { "ok" };
        let attempt = || self.attempt_raw(call, observer.clone(), &ct, session);
        self.governed(&call.name, &retry, &ct, session, code, attempt)
            .await
            .0
    }

    /// One raw call on one connection.
    async fn attempt_raw(
        &self,
        call: &RawToolCall,
        observer: Option<Arc<dyn CallObserver>>,
        ct: &CancellationToken,
        session: Option<&SessionTag>,
    ) -> Result<RawResult, CallError> {
        let lease = self.lease(session).await?;
        match lease.conn.raw.clone().filter(RawLink::is_open) {
            Some(link) => {
                self.exchange_raw(&lease.conn, &link, call, observer, ct)
                    .await
            }
            None => {
                drop(lease);
                self.attempt_typed(call, observer, ct, session).await
            }
        }
    }

    /// The raw exchange: one line out, the child's answer line back.
    async fn exchange_raw(
        &self,
        conn: &Connection,
        link: &RawLink,
        call: &RawToolCall,
        observer: Option<Arc<dyn CallObserver>>,
        ct: &CancellationToken,
    ) -> Result<RawResult, CallError> {
        let server = || self.spec.name.clone();
        let timeout = self.spec.limits.call_timeout;
        let Some(mut pending) = link.register() else {
            return Err(CallError::TransportClosed { server: server() });
        };
        // Registered before the request is written: nothing the child sends for it is missed.
        let route = observer.map(|o| conn.routes.begin(o));
        if let Some(route) = &route {
            let token = format!("{ID_PREFIX}{}", pending.number);
            route.bind(ProgressToken(NumberOrString::String(token.into())));
        }
        let line = request_line(&pending.id_json, call)?;
        if link.send(&line).await.is_err() {
            return Err(CallError::TransportClosed { server: server() });
        }
        let answered = tokio::select! {
            r = tokio::time::timeout(timeout, &mut pending.response) => r,
            _ = ct.cancelled() => {
                cancel_raw(link, &pending.id_json, "cancelled by the client").await;
                return Err(CallError::Cancelled);
            }
        };
        match answered {
            Err(_) => {
                cancel_raw(link, &pending.id_json, "graph-os call timeout").await;
                Err(CallError::Timeout {
                    server: server(),
                    timeout,
                })
            }
            Ok(Err(_)) => Err(CallError::TransportClosed { server: server() }),
            Ok(Ok(line)) => parse_response(&line),
        }
    }

    /// A connection without a raw channel (a remote child, a 2026-07-28 child): the typed
    /// call, its result serialized once.
    async fn attempt_typed(
        &self,
        call: &RawToolCall,
        observer: Option<Arc<dyn CallObserver>>,
        ct: &CancellationToken,
        session: Option<&SessionTag>,
    ) -> Result<RawResult, CallError> {
        let mut params = rmcp::model::CallToolRequestParams::new(call.name.clone());
        if let Some(arguments) = &call.arguments {
            let arguments = serde_json::from_str(arguments.get())
                .map_err(|_| unexpected("arguments that are not an object"))?;
            params.arguments = Some(arguments);
        }
        if let Some(meta) = &call.meta {
            let m = params.meta.get_or_insert_with(Default::default);
            for (k, v) in meta {
                m.insert(k.clone(), v.clone());
            }
        }
        let (response, _) = self.attempt(params, observer, ct, session, false).await?;
        let CallToolResponse::Complete(result) = response else {
            return Err(unexpected("an unexpected result type"));
        };
        let is_error = result.is_error == Some(true);
        let result = serde_json::value::to_raw_value(&result)
            .map_err(|e| CallError::Rpc(ErrorData::internal_error(e.to_string(), None)))?;
        Ok(RawResult { result, is_error })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_string()).unwrap()
    }

    #[test]
    fn the_request_line_keeps_the_arguments_byte_for_byte() {
        let call = RawToolCall {
            name: "add".into(),
            arguments: Some(raw(r#"{"b": 2,  "a":1.50}"#)),
            meta: Some(serde_json::json!({"k": "v"}).as_object().cloned().unwrap()),
        };
        let line = request_line(r#""graph-os-raw-7""#, &call).unwrap();
        let text = std::str::from_utf8(&line).unwrap();
        assert!(text.ends_with('\n'));
        assert!(
            text.contains(r#""arguments":{"b": 2,  "a":1.50}"#),
            "{text}"
        );
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(v["id"], "graph-os-raw-7");
        assert_eq!(v["method"], "tools/call");
        assert_eq!(v["params"]["name"], "add");
        assert_eq!(v["params"]["_meta"]["progressToken"], "graph-os-raw-7");
        assert_eq!(v["params"]["_meta"]["k"], "v");
    }

    #[test]
    fn a_call_without_arguments_or_meta_is_valid_json_rpc() {
        let call = RawToolCall {
            name: "na\"me".into(),
            arguments: None,
            meta: None,
        };
        let line = request_line("\"graph-os-raw-1\"", &call).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["params"]["name"], "na\"me");
        assert!(v["params"].get("arguments").is_none());
    }

    #[test]
    fn results_pass_unparsed_and_lies_are_refused() {
        let ok = parse_response(
            br#"{"jsonrpc":"2.0","id":"graph-os-raw-1","result":{"content":[{"type":"text","text":"3"}],"isError":false}}"#,
        )
        .unwrap();
        assert_eq!(
            ok.result.get(),
            r#"{"content":[{"type":"text","text":"3"}],"isError":false}"#
        );
        assert!(!ok.is_error);
        let tool_error =
            parse_response(br#"{"jsonrpc":"2.0","id":"x","result":{"content":[],"isError":true}}"#)
                .unwrap();
        assert!(tool_error.is_error);
        for lie in [
            &br#"{"jsonrpc":"2.0","id":"x","result":42}"#[..],
            br#"{"jsonrpc":"2.0","id":"x","result":{"tasks":[]}}"#,
            br#"{"jsonrpc":"2.0","id":"x","result":{"content":[],"resultType":"input_required"}}"#,
            br#"{"jsonrpc":"2.0","id":"x"}"#,
        ] {
            assert!(
                matches!(parse_response(lie), Err(CallError::Rpc(_))),
                "{}",
                String::from_utf8_lossy(lie)
            );
        }
        let err = parse_response(
            br#"{"jsonrpc":"2.0","id":"x","error":{"code":-32602,"message":"Unknown tool"}}"#,
        );
        assert!(matches!(err, Err(CallError::Rpc(e)) if e.code.0 == -32602));
    }
}
