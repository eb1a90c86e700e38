//! The one path from a front request to a child: tool calls of loaded and eager tools, prompts,
//! resources and templates, completion, subscriptions and logging level. Every method takes the
//! [`Caller`], authorizes the operation and the child, applies the request bounds, and only then
//! reaches the child runtime (on the session's own connection under `per-session` isolation).
// Logging, roots and resources/subscribe are SEP-2577-deprecated but still served to 2025-era peers.
#![allow(deprecated)]

use super::Refusal;
use std::sync::{Arc, Weak};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientRequest, CompleteRequestParams, CompleteResult,
    GetPromptRequestParams, GetPromptResponse, ProgressToken, Prompt, ReadResourceRequestParams,
    ReadResourceResponse, Reference, Resource, ResourceTemplate, ServerResult,
    SetLevelRequestParams, SubscribeRequestParams, Tool, UnsubscribeRequestParams,
};
use tokio_util::sync::CancellationToken;

use super::input::Inflight;
use super::route::{FrontRoute, FrontSink};
use super::{Caller, Multiplexer, MuxError, Operation};
use crate::child::{CallError, CallObserver, ChildRuntime, ChildState, Reresolve, Retry};

/// Where a checked `tools/call` goes (see `Multiplexer::tool_target`).
pub(super) struct ToolTarget {
    pub child: Arc<ChildRuntime>,
    pub server: String,
    /// The child's own name of the tool.
    pub original: String,
    pub read_only: bool,
    /// The catalog entry (none for a name forwarded to the transparent child).
    pub tool: Option<Tool>,
}

/// What a forwarded request carries besides its parameters.
#[derive(Clone, Default)]
pub struct CallContext {
    /// Cancelled when the front request is cancelled (sent upstream as `notifications/cancelled`).
    pub ct: CancellationToken,
    /// The caller's progress token, if it asked for progress.
    pub progress_token: Option<ProgressToken>,
    /// Where the call's progress, logs and child→client requests go (none: dropped/refused).
    pub sink: Option<Arc<dyn FrontSink>>,
    /// The tool's front name (set by the multiplexer: what a parked call is bound to).
    pub tool: String,
}

impl Multiplexer {
    /// The runtime of a child the caller may use for `op`.
    pub(super) fn reach(
        &self,
        caller: &Caller,
        op: Operation,
        server: &str,
    ) -> Result<Arc<ChildRuntime>, MuxError> {
        let child = self
            .child(server)
            .ok_or_else(|| MuxError::ServerLeft(server.to_string()))?;
        caller.authorize_child(op, child.spec())?;
        Ok(child)
    }

    /// Whether the caller may see `server`'s items.
    pub(super) fn visible_to(&self, caller: &Caller, server: &str) -> bool {
        self.child(server).is_some_and(|c| caller.sees(c.spec()))
    }

    /// `tools/list`: the meta tools are added by the protocol layer; this is the caller's
    /// eager and loaded tools, without children it may not see (and without eager tools for a
    /// caller that may not call them).
    pub fn list_tools(&self, caller: &Caller) -> Result<Vec<Tool>, MuxError> {
        caller.authorize(Operation::List)?;
        let may_call = caller.authorize(Operation::CallTool).is_ok();
        Ok(self
            .visible_tools(&caller.session)
            .into_iter()
            .filter(|t| may_call && self.visible_to(caller, &t.server))
            .map(|t| t.tool)
            .collect())
    }

    /// `tools/call` of a loaded or eager tool, in its own span: the front request's over stdio,
    /// a child of the HTTP request's (or of the caller's `_meta.traceparent`, SEP-414).
    pub async fn call_tool(
        &self,
        caller: &Caller,
        params: CallToolRequestParams,
        cx: CallContext,
    ) -> Result<CallToolResponse, MuxError> {
        use tracing::Instrument;
        let span = tracing::info_span!(
            "mcp.tools_call",
            otel.name = %format!("tools/call {}", params.name),
            mcp.method.name = "tools/call",
            gen_ai.tool.name = %params.name,
            error.type = tracing::field::Empty,
        );
        crate::telemetry::trace::set_parent_from_meta(&span, params.meta.as_ref().map(|m| &m.0.0));
        let result = self
            .call_tool_spanned(caller, params, cx)
            .instrument(span.clone())
            .await;
        if let Err(e) = &result {
            span.record("error.type", e.code());
            crate::telemetry::trace::fail(&span, e.code());
        }
        result
    }

    async fn call_tool_spanned(
        &self,
        caller: &Caller,
        mut params: CallToolRequestParams,
        mut cx: CallContext,
    ) -> Result<CallToolResponse, MuxError> {
        caller.authorize(Operation::CallTool)?;
        if let Some(handle) = params
            .request_state
            .as_deref()
            .filter(|s| s.starts_with(super::input::STATE_PREFIX))
        {
            let handle = handle.to_string();
            return self.resume_parked(caller, &params, &handle, cx).await;
        }
        let name = params.name.to_string();
        cx.tool = name.clone();
        let target = self
            .tool_target(caller, &name, params.arguments.as_ref())
            .await?;
        params.name = target.original.clone().into();
        if caller.caps.tasks && target.child.declares_tasks_extension() {
            return self.call_offering_task(caller, target, params, cx).await;
        }
        let retry = self.crash_retry(caller, &name, &target, false);
        self.call_child(caller, &target.child, params, retry, cx)
            .await
            .map_err(|error| MuxError::child(target.server, error))
    }

    /// Where a `tools/call` of `name` goes, after every check that precedes the child: the
    /// tool is visible, loaded (or eager) and not held by the drift guard, the caller may reach
    /// its child, and the arguments are within the child's bounds. A name the view does not list
    /// goes unchanged to the transparent child, if there is one (`tool` is then unknown).
    pub(super) async fn tool_target(
        &self,
        caller: &Caller,
        name: &str,
        arguments: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<ToolTarget, MuxError> {
        let admission = super::pipeline::Admission {
            caller,
            name,
            arguments: super::pipeline::Arguments::Map(arguments),
            entry: super::pipeline::Entry::Call,
        };
        let target = match self.admit_call(&admission) {
            // A child that came up a moment ago may not be in the view yet: fold it in, once.
            Err(MuxError::UnknownTool(_)) => {
                self.freshen().await;
                self.admit_call(&admission)
            }
            target => target,
        };
        super::pipeline::counted(target)
    }

    /// The one resolution of an exposed tool name against the served view: visible, loaded
    /// (unless `need_loaded` is false: `catalog_dispatch`), not held by the drift guard, its
    /// child reachable by the caller. Fresh calls and crash retries both use it.
    pub(super) fn resolve(
        &self,
        caller: &Caller,
        name: &str,
        need_loaded: bool,
    ) -> Result<ToolTarget, MuxError> {
        let view = self.view();
        // The view decides ownership: a conflicted name, a name in a prefix's namespace or one
        // breaking the name rule is refused here and never reaches the transparent child.
        let target = match view.tool_route(name)? {
            Some(entry) => {
                let child = self.reach(caller, Operation::CallTool, &entry.server)?;
                if need_loaded && !entry.eager && !caller.session.loaded().contains(name) {
                    return Err(MuxError::NotLoaded {
                        name: name.to_string(),
                        server: entry.server.clone(),
                    });
                }
                if entry.held {
                    return Err(held(&entry.server, name));
                }
                let read_only = entry
                    .tool
                    .annotations
                    .as_ref()
                    .and_then(|a| a.read_only_hint)
                    .unwrap_or(false);
                ToolTarget {
                    child,
                    server: entry.server.clone(),
                    original: entry.original.clone(),
                    read_only,
                    tool: Some(entry.tool.clone()),
                }
            }
            None => {
                drop(view);
                // `enabledTools` / `disabledTools` still apply: a filtered name is never forwarded.
                let Some(server) = self
                    .transparent_child(caller)
                    .filter(|s| self.child(s).is_some_and(|c| c.spec().tool_enabled(name)))
                else {
                    return Err(MuxError::UnknownTool(name.to_string()));
                };
                ToolTarget {
                    child: self.reach(caller, Operation::CallTool, &server)?,
                    server,
                    original: name.to_string(),
                    read_only: false,
                    tool: None,
                }
            }
        };
        Ok(target)
    }

    /// The one transparent child (`prefix: ""`, `expose: eager`) the caller may see, when the
    /// fleet has exactly one: names and URIs graph-os does not list go to it unchanged, so its
    /// own answer (or error) reaches the client as if there were no gateway.
    fn transparent_child(&self, caller: &Caller) -> Option<String> {
        let fleet = self.fleet();
        let mut transparent = fleet.children.iter().filter(|(name, c)| {
            c.spec().expose == crate::config::ExposeMode::Eager
                && fleet.prefixes.get(*name).is_some_and(|p| p.is_empty())
        });
        let (name, child) = transparent.next()?;
        if transparent.next().is_some() || !caller.sees(child.spec()) {
            return None;
        }
        // A child whose catalog awaits approval (drift guard) gets nothing it did not list.
        if self
            .view()
            .drift
            .get(name)
            .is_some_and(|d| d.state != "approved")
        {
            return None;
        }
        Some(name.clone())
    }

    /// The crash retry of a call of `name` resolved to `target`: a read-only tool's call that
    /// dies with its child is retried on the restarted child only after it resolves again, as a
    /// fresh call would, to the same unchanged tool (see [`Resolution`]). `None`: not retried.
    /// `dispatch`: a `catalog_dispatch` call (the tool need not be loaded).
    pub(super) fn crash_retry(
        &self,
        caller: &Caller,
        name: &str,
        target: &ToolTarget,
        dispatch: bool,
    ) -> Retry {
        let tool = target.tool.clone().filter(|_| target.read_only)?;
        let resolution: Arc<dyn Reresolve> = Arc::new(Resolution {
            mux: self.me.clone(),
            caller: caller.clone(),
            name: name.to_string(),
            child: target.child.clone(),
            server: target.server.clone(),
            original: target.original.clone(),
            tool,
            dispatch,
        });
        Some(resolution)
    }

    /// Calls a child tool with the caller's route for child→client traffic, and writes every
    /// queued notification before returning the result.
    pub(super) async fn call_child(
        &self,
        caller: &Caller,
        child: &Arc<ChildRuntime>,
        mut params: CallToolRequestParams,
        retry: Retry,
        cx: CallContext,
    ) -> Result<CallToolResponse, crate::child::CallError> {
        sign_run_token(caller, child, &mut params)?;
        // `catalog_dispatch` (no front tool name) cannot carry an input round: not parkable.
        if let Some(sink) = cx.sink.clone()
            && !cx.tool.is_empty()
            && sink.takes_input_required()
            && child.era() == Some(crate::child::ChildEra::Legacy)
        {
            // A 2025 child may ask a 2026 client something mid-call: the call runs on its own
            // task so it can be parked on an `input_required` answer (see `input`).
            let (asks, asked) = tokio::sync::mpsc::channel(1);
            let route = FrontRoute::asking(
                caller.session.id(),
                caller.caps,
                cx.progress_token.clone(),
                caller.session.log_level(),
                sink,
                asks,
            );
            let call_ct = CancellationToken::new();
            let drain = route.spawn_drain(call_ct.clone());
            let observer = route.clone() as Arc<dyn CallObserver>;
            let tag = caller.tag();
            let call = tokio::spawn({
                use tracing::Instrument;
                let (child, call_ct) = (child.clone(), call_ct.clone());
                async move {
                    child
                        .call_tool(params, retry, Some(observer), call_ct, Some(&tag))
                        .await
                }
                .instrument(tracing::Span::current())
            });
            let inflight = Inflight {
                call,
                asks: asked,
                call_ct,
                route,
                drain,
                server: child.spec().name.clone(),
                ttl: child.spec().limits.relay_timeout,
            };
            return self.drive(caller, inflight, cx.tool, cx.ct).await;
        }
        self.call_routed(caller, child, params, retry, cx, false)
            .await
            .map(|(response, _)| response)
    }

    /// A call with the caller's route for child→client traffic, which is drained before the
    /// answer returns. `offer_tasks`: the caller takes a 2026-07-28 task in answer (the task's
    /// connection comes back with it).
    pub(super) async fn call_routed(
        &self,
        caller: &Caller,
        child: &Arc<ChildRuntime>,
        params: CallToolRequestParams,
        retry: Retry,
        cx: CallContext,
        offer_tasks: bool,
    ) -> Result<(CallToolResponse, Option<crate::child::TaskConn>), crate::child::CallError> {
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
        let tag = caller.tag();
        let call = child.call_tool_offering(
            params,
            retry,
            observer,
            cx.ct.clone(),
            Some(&tag),
            offer_tasks,
        );
        FrontRoute::run(route.as_ref(), &cx.ct, call).await
    }

    /// Runs a parkable call (see [`super::input`]) until it completes, asks the client
    /// something (then it is parked and the client gets `input_required`), or `ct` cancels it.
    async fn drive(
        &self,
        caller: &Caller,
        mut inflight: Inflight,
        tool: String,
        ct: CancellationToken,
    ) -> Result<CallToolResponse, crate::child::CallError> {
        let mut asking = true;
        loop {
            tokio::select! {
                r = &mut inflight.call => {
                    inflight.route.finish();
                    tokio::select! {
                        _ = &mut inflight.drain => {}
                        _ = ct.cancelled() => {}
                    }
                    return r.unwrap_or_else(|_| {
                        Err(crate::child::CallError::Rpc(rmcp::ErrorData::internal_error(
                            "the call task failed",
                            None,
                        )))
                    });
                }
                ask = inflight.asks.recv(), if asking => match ask {
                    Some(ask) => {
                        let ttl = inflight.ttl;
                        return self.parked.park(inflight, ask, owner_of(caller), tool, ttl);
                    }
                    None => asking = false,
                },
                _ = ct.cancelled() => {
                    inflight.call_ct.cancel();
                    return Err(crate::child::CallError::Cancelled);
                }
            }
        }
    }

    /// A retry carrying the answer to a parked call's question: resumes that call.
    pub(super) async fn resume_parked(
        &self,
        caller: &Caller,
        params: &CallToolRequestParams,
        handle: &str,
        cx: CallContext,
    ) -> Result<CallToolResponse, MuxError> {
        let Some(inflight) = self.parked.resume(
            handle,
            &owner_of(caller),
            &params.name,
            params.input_responses.as_ref(),
        ) else {
            return Err(MuxError::refused(
                Refusal::InputStateUnknown,
                "no call waits for this requestState here (it expired, belongs to another caller or tool, or was issued by another replica)",
            ));
        };
        let server = inflight.server.clone();
        if let Some(sink) = cx.sink.clone() {
            inflight.route.redirect(sink, cx.progress_token.clone());
        }
        self.drive(caller, inflight, params.name.to_string(), cx.ct)
            .await
            .map_err(|error| MuxError::child(server, error))
    }

    /// Forwards one non-tool request to `server` for `caller`.
    async fn forward(
        &self,
        caller: &Caller,
        op: Operation,
        server: &str,
        request: ClientRequest,
        cx: &CallContext,
    ) -> Result<ServerResult, MuxError> {
        let child = self.reach(caller, op, server)?;
        child
            .forward(request, cx.ct.clone(), Some(&caller.tag()))
            .await
            .map_err(|error| MuxError::child(server, error))
    }

    /// `prompts/list`: prompts of the children the caller may see.
    pub async fn list_prompts(&self, caller: &Caller) -> Result<Vec<Prompt>, MuxError> {
        caller.authorize(Operation::List)?;
        self.freshen().await;
        Ok(self
            .view()
            .prompts
            .values()
            .filter(|p| self.visible_to(caller, &p.server))
            .map(|p| p.prompt.clone())
            .collect())
    }

    /// `resources/list`: resources of the children the caller may see.
    pub async fn list_resources(&self, caller: &Caller) -> Result<Vec<Resource>, MuxError> {
        caller.authorize(Operation::List)?;
        self.freshen().await;
        Ok(self
            .view()
            .resources
            .values()
            .filter(|(s, _)| self.visible_to(caller, s))
            .map(|(_, r)| r.clone())
            .collect())
    }

    /// `resources/templates/list`: templates of the children the caller may see.
    pub async fn list_resource_templates(
        &self,
        caller: &Caller,
    ) -> Result<Vec<ResourceTemplate>, MuxError> {
        caller.authorize(Operation::List)?;
        self.freshen().await;
        Ok(self
            .view()
            .templates
            .iter()
            .filter(|(s, _)| self.visible_to(caller, s))
            .map(|(_, t)| t.clone())
            .collect())
    }

    /// `prompts/get` (exposed name → the child's own name).
    pub async fn get_prompt(
        &self,
        caller: &Caller,
        mut request: GetPromptRequestParams,
        cx: CallContext,
    ) -> Result<GetPromptResponse, MuxError> {
        caller.authorize(Operation::GetPrompt)?;
        // A child that came up a moment ago is in the view before its name is looked up.
        self.freshen().await;
        let view = self.view();
        let Some(entry) = view
            .prompt_route(&request.name)?
            .filter(|p| self.visible_to(caller, &p.server))
        else {
            drop(view);
            let Some(server) = self.transparent_child(caller) else {
                return Err(MuxError::UnknownPrompt(request.name));
            };
            let req = ClientRequest::GetPromptRequest(rmcp::model::GetPromptRequest::new(request));
            return match self
                .forward(caller, Operation::GetPrompt, &server, req, &cx)
                .await?
            {
                ServerResult::GetPromptResult(r) => Ok(GetPromptResponse::Complete(r)),
                ServerResult::InputRequiredResult(r) => Ok(GetPromptResponse::InputRequired(r)),
                _ => Err(unexpected(&server, "prompts/get")),
            };
        };
        request.name = entry.original.clone();
        let server = entry.server.clone();
        drop(view);
        let req = ClientRequest::GetPromptRequest(rmcp::model::GetPromptRequest::new(request));
        match self
            .forward(caller, Operation::GetPrompt, &server, req, &cx)
            .await?
        {
            ServerResult::GetPromptResult(r) => Ok(GetPromptResponse::Complete(r)),
            // A 2026-07-28 child asking for input: for the protocol layer to pass on or refuse.
            ServerResult::InputRequiredResult(r) => Ok(GetPromptResponse::InputRequired(r)),
            _ => Err(unexpected(&server, "prompts/get")),
        }
    }

    /// Whether some child serves `uri` (a listed resource or template, or a transparent child):
    /// what a 2026 client's `subscriptions/listen` may ask to follow.
    pub fn serves_resource(&self, uri: &str) -> bool {
        match self.view().resource_route(uri) {
            Ok(Some(_)) => return true,
            Err(_) => return false,
            Ok(None) => {}
        }
        let fleet = self.fleet();
        fleet.children.iter().any(|(name, c)| {
            c.spec().expose == crate::config::ExposeMode::Eager
                && fleet.prefixes.get(name).is_some_and(|p| p.is_empty())
        })
    }

    /// The server owning a resource URI, among the children the caller may see (a URI the
    /// view refuses, e.g. one two children list, goes to none).
    fn resource_server(&self, caller: &Caller, uri: &str) -> Result<String, MuxError> {
        let view = self.view();
        view.resource_route(uri)?
            .filter(|s| self.visible_to(caller, s))
            .map(str::to_string)
            .or_else(|| self.transparent_child(caller))
            .ok_or_else(|| MuxError::UnknownResource(uri.to_string()))
    }

    /// `resources/read`, routed to the resource's owner.
    pub async fn read_resource(
        &self,
        caller: &Caller,
        request: ReadResourceRequestParams,
        cx: CallContext,
    ) -> Result<ReadResourceResponse, MuxError> {
        caller.authorize(Operation::ReadResource)?;
        // A child that came up a moment ago is in the view before its name is looked up.
        self.freshen().await;
        let server = self.resource_server(caller, &request.uri)?;
        let req =
            ClientRequest::ReadResourceRequest(rmcp::model::ReadResourceRequest::new(request));
        match self
            .forward(caller, Operation::ReadResource, &server, req, &cx)
            .await?
        {
            ServerResult::ReadResourceResult(r) => Ok(ReadResourceResponse::Complete(r)),
            ServerResult::InputRequiredResult(r) => Ok(ReadResourceResponse::InputRequired(r)),
            _ => Err(unexpected(&server, "resources/read")),
        }
    }

    /// `completion/complete` for a prompt or resource-template reference.
    pub async fn complete(
        &self,
        caller: &Caller,
        mut request: CompleteRequestParams,
        cx: CallContext,
    ) -> Result<CompleteResult, MuxError> {
        caller.authorize(Operation::Complete)?;
        // A child that came up a moment ago is in the view before its name is looked up.
        self.freshen().await;
        let view = self.view();
        let server = match &mut request.r#ref {
            Reference::Prompt(p) => {
                match view
                    .prompt_route(&p.name)?
                    .filter(|e| self.visible_to(caller, &e.server))
                {
                    Some(entry) => {
                        p.name = entry.original.clone();
                        entry.server.clone()
                    }
                    None => match self.transparent_child(caller) {
                        Some(server) => server,
                        None => return Err(MuxError::UnknownPrompt(p.name.clone())),
                    },
                }
            }
            Reference::Resource(r) => match view
                .template_route(&r.uri)?
                .map(str::to_string)
                .filter(|s| self.visible_to(caller, s))
                .or_else(|| self.transparent_child(caller))
            {
                Some(s) => s,
                None => return Err(MuxError::UnknownResource(r.uri.clone())),
            },
            _ => {
                return Err(MuxError::InvalidParams(
                    "unsupported completion reference".into(),
                ));
            }
        };
        drop(view);
        let req = ClientRequest::CompleteRequest(rmcp::model::CompleteRequest::new(request));
        match self
            .forward(caller, Operation::Complete, &server, req, &cx)
            .await?
        {
            ServerResult::CompleteResult(r) => Ok(r),
            _ => Err(unexpected(&server, "completion/complete")),
        }
    }

    /// `resources/subscribe`: forwarded to the owner; its updates then reach this session.
    pub async fn subscribe(
        &self,
        caller: &Caller,
        request: SubscribeRequestParams,
        cx: CallContext,
    ) -> Result<(), MuxError> {
        caller.authorize(Operation::Subscribe)?;
        // A child that came up a moment ago is in the view before its name is looked up.
        self.freshen().await;
        let server = self.resource_server(caller, &request.uri)?;
        let uri = request.uri.clone();
        let req = ClientRequest::SubscribeRequest(rmcp::model::SubscribeRequest::new(request));
        self.forward(caller, Operation::Subscribe, &server, req, &cx)
            .await?;
        self.record_subscription(&caller.session, &uri);
        Ok(())
    }

    /// `resources/unsubscribe`.
    pub async fn unsubscribe(
        &self,
        caller: &Caller,
        request: UnsubscribeRequestParams,
        cx: CallContext,
    ) -> Result<(), MuxError> {
        caller.authorize(Operation::Unsubscribe)?;
        let followed = self.forget_subscription(&caller.session, &request.uri);
        let server = self.resource_server(caller, &request.uri)?;
        // A child holds one subscription per URI for every session (a 2026-07-28 child's
        // listen stream; a shared 2025 connection), except a per-session 2025 child's own
        // connection: another session still following the URI keeps it.
        let own_connection = self.fleet().children.get(&server).is_some_and(|c| {
            c.spec().isolation == crate::config::SessionIsolation::PerSession
                && c.era() != Some(crate::child::ChildEra::Modern)
        });
        if followed && !own_connection {
            return Ok(());
        }
        let req = ClientRequest::UnsubscribeRequest(rmcp::model::UnsubscribeRequest::new(request));
        self.forward(caller, Operation::Unsubscribe, &server, req, &cx)
            .await
            .map(|_| ())
    }

    /// `logging/setLevel`: sets the lowest level of child log messages this session receives;
    /// for a manage caller it is also applied to every child that is up (children are shared; a
    /// child that refuses it is logged, not an error).
    pub async fn set_level(
        &self,
        caller: &Caller,
        request: SetLevelRequestParams,
        cx: CallContext,
    ) -> Result<(), MuxError> {
        caller.authorize(Operation::SetLevel)?;
        caller.session.set_log_level(request.level);
        if caller.scope() < Operation::SetChildLevel.scope() {
            return Ok(());
        }
        let children: Vec<_> = self.fleet().children.values().cloned().collect();
        for child in children {
            if child.status().state != ChildState::Up || !caller.sees(child.spec()) {
                continue;
            }
            let req =
                ClientRequest::SetLevelRequest(rmcp::model::SetLevelRequest::new(request.clone()));
            if let Err(e) = child.forward(req, cx.ct.clone(), Some(&caller.tag())).await {
                tracing::debug!(server = child.name(), error = %e, "child did not accept logging/setLevel");
            }
        }
        Ok(())
    }
}

/// A read-only call's crash retry, resolved again against the served view once its child came
/// back (see [`Reresolve`]): the recovered catalog is folded into the view first, then the
/// exposed name goes through the same resolution as a fresh call (a tool the drift guard holds
/// answers `drift-pending`; a tool gone, unloaded or out of reach answers as a fresh call would),
/// and the tool must be the one the call was resolved to: same child runtime, same name, still
/// read-only, the same descriptor (schema and annotations) — else `retry-tool-changed`.
struct Resolution {
    mux: Weak<Multiplexer>,
    caller: Caller,
    /// The exposed name.
    name: String,
    child: Arc<ChildRuntime>,
    server: String,
    original: String,
    /// The descriptor the call was resolved to (exposed name).
    tool: Tool,
    dispatch: bool,
}

impl Reresolve for Resolution {
    fn reresolve(&self) -> futures::future::BoxFuture<'_, Result<(), CallError>> {
        Box::pin(async move {
            let refused = |e: MuxError| CallError::Refused {
                code: e.code(),
                message: e.message(),
            };
            let Some(mux) = self.mux.upgrade() else {
                return Err(refused(MuxError::ServerLeft(self.server.clone())));
            };
            mux.freshen().await;
            // The same pipeline as the first attempt (the arguments are unchanged).
            let entry = if self.dispatch {
                super::pipeline::Entry::Dispatch
            } else {
                super::pipeline::Entry::Call
            };
            let target = mux
                .admit_call(&super::pipeline::Admission {
                    caller: &self.caller,
                    name: &self.name,
                    arguments: super::pipeline::Arguments::Checked,
                    entry,
                })
                .map_err(refused)?;
            let same = Arc::ptr_eq(&target.child, &self.child)
                && target.original == self.original
                && target.read_only
                && target.tool.as_ref() == Some(&self.tool);
            if !same {
                return Err(CallError::Refused {
                    code: RETRY_TOOL_CHANGED,
                    message: format!(
                        "the call of '{}' died with '{}', whose restarted process serves a changed '{}': not retried",
                        self.name, self.server, self.original
                    ),
                });
            }
            Ok(())
        })
    }
}

/// A read-only call died with its child and the restarted child's tool differs: not retried.
pub const RETRY_TOOL_CHANGED: &str = "retry-tool-changed";

fn unexpected(server: &str, method: &str) -> MuxError {
    MuxError::child(
        server,
        crate::child::CallError::Rpc(rmcp::ErrorData::internal_error(
            format!("child answered {method} with an unexpected result"),
            None,
        )),
    )
}

/// The refusal of a call to a tool the drift guard holds (its live schema is not the approved one).
/// Who a parked call belongs to: the caller's subject on its session.
/// `auth: run-token`: signs the caller's identity for this call into the request `_meta` (a
/// child that asked for run tokens never gets a call without one).
pub(super) fn sign_run_token(
    caller: &Caller,
    child: &ChildRuntime,
    params: &mut CallToolRequestParams,
) -> Result<(), crate::child::CallError> {
    if let Some(run_token) = &child.spec().run_token {
        // A child that asked for run tokens never gets a call without one.
        let Some(key) = child.run_token_key() else {
            return Err(crate::child::CallError::Unavailable {
                server: child.spec().name.clone(),
                state: child.status().state,
            });
        };
        let arguments = serde_json::Value::Object(params.arguments.clone().unwrap_or_default());
        let claims = crate::auth::run_token::Claims::for_call(
            &caller.identity,
            &child.spec().name,
            &params.name,
            &arguments,
            run_token.ttl,
        );
        let token = crate::auth::run_token::sign(&key, &claims);
        params
            .meta
            .get_or_insert_with(Default::default)
            .insert(crate::auth::run_token::META_KEY.into(), token.into());
    }
    Ok(())
}

fn owner_of(caller: &Caller) -> String {
    format!("{}#{}", caller.identity.subject, caller.session.id())
}

/// `catalog_dispatch` of a tool whose 2026-07-28 child asked a 2026-07-28 client for input: a
/// meta tool's result cannot carry an `input_required` round, so the tool must be loaded and
/// called directly.
pub(super) fn input_required_in_dispatch(server: &str) -> MuxError {
    MuxError::refused(
        Refusal::InputRequiredInDispatch,
        format!(
            "a tool of '{server}' asked for client input; load it and call it directly to answer"
        ),
    )
}

pub(super) fn held(server: &str, name: &str) -> MuxError {
    MuxError::refused(
        Refusal::DriftPending,
        format!(
            "'{name}' changed on '{server}' since it was approved; an admin must approve the change"
        ),
    )
}
