//! The forwarding hot path: `tools/call` of a loaded or eager tool with its arguments and its
//! result kept as raw JSON.
//!
//! The protocol layer decodes only the envelope of a `tools/call` ([`FastCall`]) and asks
//! [`Multiplexer::fast_target`] whether the call can take this path: it passes the same
//! admission pipeline as the typed path ([`super::pipeline`]), its arguments bounded on the raw
//! bytes. A call the hot path does not
//! take (any refusal, a run-token child, a tasks-extension offer, a 2026-07-28 front) gets
//! `None` and goes the typed way, which produces the refusal or serves it; nothing has been sent
//! or counted by then. [`Multiplexer::call_tool_fast`] then forwards it through the same call
//! route (progress, logs, child→client requests) and the child's same limits.

use std::sync::Arc;

use serde_json::value::RawValue;

use super::forward::{CallContext, ToolTarget};
use super::route::FrontRoute;
use super::{Caller, Multiplexer, MuxError};
use crate::child::{CallObserver, RawResult, RawToolCall};

/// A `tools/call` decoded only to its envelope.
#[derive(Debug, Clone)]
pub struct FastCall {
    /// The tool's front name.
    pub name: String,
    /// `arguments` exactly as sent.
    pub arguments: Option<Box<RawValue>>,
    /// The request's `_meta` to pass on (without the caller's progress token and the front's
    /// protocol envelope, as on the typed path).
    pub meta: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Where an accepted hot-path call goes.
pub struct FastTarget(ToolTarget);

impl Multiplexer {
    /// Whether `call` takes the hot path for `caller` (a 2025-era front unless `modern_front`),
    /// and where it goes; `None` sends it the typed way.
    pub fn fast_target(
        &self,
        caller: &Caller,
        call: &FastCall,
        modern_front: bool,
    ) -> Option<FastTarget> {
        // A 2026-07-28 front may be asked for input mid-call (parked calls, see `input`).
        if modern_front {
            return None;
        }
        // The same pipeline as the typed path, on the raw arguments; any refusal goes the typed
        // way, which answers it.
        let target = self
            .admit_call(&super::pipeline::Admission {
                caller,
                name: &call.name,
                arguments: super::pipeline::Arguments::Raw(call.arguments.as_deref()),
                entry: super::pipeline::Entry::Call,
            })
            .ok()?;
        let spec = target.child.spec();
        // A run token signs the arguments (typed); a tasks-extension offer may return a task.
        if spec.run_token.is_some()
            || (caller.caps.tasks && target.child.declares_tasks_extension())
        {
            return None;
        }
        Some(FastTarget(target))
    }

    /// Forwards a call [`Self::fast_target`] accepted, in the same span, route and limits as
    /// [`Self::call_tool`]; the child's `result` comes back raw.
    pub async fn call_tool_fast(
        &self,
        caller: &Caller,
        target: FastTarget,
        call: FastCall,
        cx: CallContext,
    ) -> Result<RawResult, MuxError> {
        use tracing::Instrument;
        let span = tracing::info_span!(
            "mcp.tools_call",
            otel.name = %format!("tools/call {}", call.name),
            mcp.method.name = "tools/call",
            gen_ai.tool.name = %call.name,
            error.type = tracing::field::Empty,
        );
        crate::telemetry::trace::set_parent_from_meta(&span, call.meta.as_ref());
        let retry = self.crash_retry(caller, &call.name, &target.0, false);
        let result = forward(caller, target.0, call, retry, cx)
            .instrument(span.clone())
            .await;
        if let Err(e) = &result {
            span.record("error.type", e.code());
            crate::telemetry::trace::fail(&span, e.code());
        }
        result
    }
}

async fn forward(
    caller: &Caller,
    target: ToolTarget,
    call: FastCall,
    retry: crate::child::Retry,
    cx: CallContext,
) -> Result<RawResult, MuxError> {
    let route = cx.sink.map(|sink| {
        FrontRoute::new(
            caller.session.id(),
            caller.caps,
            cx.progress_token,
            caller.session.log_level(),
            sink,
        )
    });
    let observer = route.clone().map(|r| r as Arc<dyn CallObserver>);
    let raw = RawToolCall {
        name: target.original,
        arguments: call.arguments,
        meta: call.meta,
    };
    let tag = caller.tag();
    let call = target
        .child
        .call_tool_raw(&raw, retry, observer, cx.ct.clone(), Some(&tag));
    let outcome = FrontRoute::run(route.as_ref(), &cx.ct, call).await;
    outcome.map_err(|error| MuxError::child(target.server, error))
}
