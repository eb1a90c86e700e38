//! The rmcp server handler: protocol glue only. Each request becomes a [`Caller`] (identity from
//! the HTTP layer or the local user on stdio, the session or principal, the client's declared
//! capabilities) and one multiplexer call; results are translated for the front's era and
//! errors mapped by [`super::wire`].
// Logging, roots and resources/subscribe are SEP-2577-deprecated but still served to 2025-era peers.
#![allow(deprecated)]

use std::sync::{Arc, OnceLock};

use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CompleteRequestParams, CompleteResult,
    GetPromptRequestParams, GetPromptResponse, Implementation, InitializeRequestParams,
    InitializeResult, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse,
    ServerCapabilities, ServerInfo, SetLevelRequestParams, SubscribeRequestParams,
    SubscriptionFilter, UnsubscribeRequestParams,
};
use rmcp::model::{
    CancelTaskParams, CustomRequest, CustomResult, ErrorCode, GetTaskParams, GetTaskResult,
    UpdateTaskParams,
};
use rmcp::service::{RequestContext, RoleServer, SubscriptionContext};
use rmcp::{ErrorData as McpError, ServerHandler};
use serde_json::Value;

use super::era::is_modern;
use super::observer::{PeerSink, relay_meta};
use super::streams::{FrontSession, HttpFront};
use super::{era, meta_table, wire};
use crate::auth::{Identity, Scope};
use crate::mux::session_store::{Fetched, SessionKey};
use crate::mux::{CallContext, Caller, ClientCaps, Multiplexer};
use rmcp::service::NotificationContext;
use rmcp::transport::streamable_http_server::SessionRestoreMarker;

const INSTRUCTIONS: &str = "graph-os fronts a fleet of MCP servers. Use find_tools to search the fleet \
(results include full input schemas), load_tools to add tools to your tool list, call them, and \
unload_tools when done. list_catalog shows every server; multiplexer_status shows child health.";

/// The rmcp server handler for one front session (stdio, or one 2025-era HTTP session) — and for
/// 2026-era HTTP requests, which carry no session and are keyed by principal.
#[derive(Clone)]
pub struct GatewayHandler {
    mux: Arc<Multiplexer>,
    own: Arc<OnceLock<FrontSession>>,
    /// Set for streamable HTTP: callers are identified by the HTTP layer and sessions are kept
    /// in its store.
    http: Option<Arc<HttpFront>>,
    /// Set by this session's one `initialize` (rmcp makes a handler per session).
    handshake: Arc<std::sync::atomic::AtomicBool>,
}

/// The 2025-era session a request or notification belongs to: the session rmcp is restoring,
/// else the request's `Mcp-Session-Id`.
fn session_id(ext: &rmcp::model::Extensions) -> Option<String> {
    if let Some(marker) = ext.get::<SessionRestoreMarker>() {
        return Some(marker.id.to_string());
    }
    ext.get::<::http::request::Parts>()
        .and_then(|p| p.headers.get("mcp-session-id"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// The session state the HTTP layer read from the store for this request.
fn fetched(ext: &rmcp::model::Extensions) -> Option<&Fetched> {
    ext.get::<::http::request::Parts>()
        .and_then(|p| p.extensions.get::<Fetched>())
}

impl GatewayHandler {
    /// A front session on `mux` whose caller is the trusted local user (stdio).
    pub fn new(mux: Arc<Multiplexer>) -> Self {
        GatewayHandler {
            handshake: Default::default(),
            mux,
            own: Arc::default(),
            http: None,
        }
    }

    /// A handler for streamable HTTP: callers come from the HTTP layer's authentication,
    /// sessions and principals live in `http`'s store.
    pub fn for_http(mux: Arc<Multiplexer>, http: Arc<HttpFront>) -> Self {
        GatewayHandler {
            handshake: Default::default(),
            mux,
            own: Arc::default(),
            http: Some(http),
        }
    }

    /// The multiplexer behind this session.
    pub fn mux(&self) -> &Arc<Multiplexer> {
        &self.mux
    }

    /// Who is asking: the local user on stdio; over HTTP the identity the authentication layer
    /// attached to the request (a request without one is the least-privileged anonymous caller).
    fn identity(&self, ctx: &RequestContext<RoleServer>) -> Identity {
        if self.http.is_none() {
            return Identity::local();
        }
        match ctx
            .extensions
            .get::<::http::request::Parts>()
            .and_then(|p| p.extensions.get::<Identity>())
        {
            Some(id) => id.clone(),
            None => {
                tracing::warn!(
                    "HTTP request without an authenticated identity; treating it as anonymous discover"
                );
                Identity::anonymous("anonymous", Scope::Discover)
            }
        }
    }

    /// Brings a stored session up to date with the store's copy read for this request.
    fn apply(&self, front: &FrontSession, fetched: Option<&Fetched>) {
        let Some(f) = fetched else { return };
        self.mux.adopt_loaded(&front.session, f.loaded.clone());
        if f.pending {
            front.session.mark_pending();
            let (mux, session) = (self.mux.clone(), front.session.clone());
            tokio::spawn(async move { mux.deliver_pending(&session).await });
        }
    }

    /// The stored 2025-era session `id` of this handler, opened (and made known to the hot
    /// path) on first use.
    fn legacy_front(&self, http: &Arc<HttpFront>, id: &str) -> FrontSession {
        self.own
            .get_or_init(|| {
                // Admission let only well-formed ids through (`SessionKey::session`).
                let key = SessionKey::session(id).unwrap_or_else(|| SessionKey::principal(id));
                let front = FrontSession::open_stored(&self.mux, http, key, Default::default());
                http.register_legacy(id, &front);
                front
            })
            .clone()
    }

    /// The session a request belongs to.
    fn front(&self, ctx: &RequestContext<RoleServer>, identity: &Identity) -> FrontSession {
        if let Some(http) = &self.http {
            if is_modern(ctx) {
                let key = SessionKey::principal(&identity.subject);
                let front = http.principals.get(&identity.subject, || {
                    FrontSession::open_stored(&self.mux, http, key, Default::default())
                });
                self.apply(&front, fetched(&ctx.extensions));
                return front;
            }
            if let Some(id) = session_id(&ctx.extensions) {
                let front = self.legacy_front(http, &id);
                self.apply(&front, fetched(&ctx.extensions));
                let _ = front.streams.legacy.set(ctx.peer.clone());
                return front;
            }
        }
        let front = self
            .own
            .get_or_init(|| FrontSession::open(&self.mux))
            .clone();
        if ctx
            .peer
            .peer_info()
            .is_some_and(|i| i.protocol_version.has_initialize())
        {
            let _ = front.streams.legacy.set(ctx.peer.clone());
        }
        front
    }

    /// The caller of a request.
    fn caller(&self, ctx: &RequestContext<RoleServer>) -> Caller {
        let identity = self.identity(ctx);
        let front = self.front(ctx, &identity);
        // 2026-07-28 clients declare their capabilities per request; they are asked for input
        // with `input_required` results, never with server→client requests (see `observer`).
        let caps = if is_modern(ctx) {
            ctx.client_capabilities()
                .map(|c| ClientCaps::from_declared(&c))
                .unwrap_or_default()
        } else {
            let mut caps = ctx
                .peer
                .peer_info()
                .map(|i| ClientCaps::from_declared(&i.capabilities))
                .unwrap_or_default();
            // A 2025 session has the 2025 tasks, never the extension's.
            caps.tasks = false;
            caps
        };
        Caller::new(identity, front.session, caps)
    }

    /// The caller of a hot-path request on the stdio session whose rmcp peer is `peer` (the
    /// same session, identity and declared capabilities as [`Self::caller`] gives its typed
    /// requests).
    pub(super) fn stdio_caller(&self, peer: &rmcp::Peer<RoleServer>) -> Caller {
        let front = self
            .own
            .get_or_init(|| FrontSession::open(&self.mux))
            .clone();
        let info = peer.peer_info();
        if info
            .as_ref()
            .is_some_and(|i| i.protocol_version.has_initialize())
        {
            let _ = front.streams.legacy.set(peer.clone());
        }
        let mut caps = info
            .map(|i| ClientCaps::from_declared(&i.capabilities))
            .unwrap_or_default();
        caps.tasks = false;
        Caller::new(Identity::local(), front.session, caps)
    }

    fn context(ctx: &RequestContext<RoleServer>) -> CallContext {
        CallContext {
            ct: ctx.ct.clone(),
            progress_token: ctx.meta.get_progress_token(),
            sink: None,
            tool: String::new(),
        }
    }
}

/// A change of the caller's own tool list that no stream of its session carried (a 2026-07-28
/// client without `subscriptions/listen`, a 2025 session without a GET stream: the result says
/// `"notification": "no_stream"`) is announced on the response stream of the request that caused
/// it. That is where clients that cache `tools/list` listen for it: pydantic-ai's `MCPToolset`
/// and FastMCP's client, whose 2026 mode expects a server to notify only while it handles a
/// request. A session whose stream carried it gets it once, there.
async fn announce_on_request_stream(
    result: &rmcp::model::CallToolResult,
    context: &RequestContext<RoleServer>,
) {
    let undelivered = result
        .structured_content
        .as_ref()
        .and_then(|s| s.get("notification"))
        .and_then(serde_json::Value::as_str)
        .is_some_and(|n| n == "no_stream" || n == "failed");
    if undelivered && let Err(e) = context.peer.notify_tool_list_changed().await {
        tracing::debug!(error = %e, "list_changed on the request's stream not sent");
    }
}

/// Most resource URIs one `subscriptions/listen` stream may follow.
const MAX_LISTEN_RESOURCES: usize = 64;

impl ServerHandler for GatewayHandler {
    fn get_info(&self) -> ServerInfo {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_prompts()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_completions()
            .enable_logging()
            .build();
        let mut info = ServerInfo::new(capabilities);
        // The 2026-07-28 tasks extension, while a child declares it (rmcp consults this on
        // every task request; 2025 sessions get the 2025 tasks in `initialize` instead).
        if self.mux.tasks_extension() {
            info.capabilities
                .extensions
                .get_or_insert_with(Default::default)
                .insert(rmcp::model::TASKS_EXTENSION_ID.into(), Default::default());
        }
        info.server_info = Implementation::new("graph-os", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(INSTRUCTIONS.into());
        info
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        // One handshake per session (stdio connection or HTTP session): a second `initialize`
        // would re-negotiate a live session outside admission's bounds.
        if self
            .handshake
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return Err(McpError::invalid_request(
                "the session is already initialized",
                Some(serde_json::json!({"code": "already-initialized"})),
            ));
        }
        context.peer.set_peer_info(request.clone());
        // Over HTTP the session is known once rmcp assigned its id (`on_initialized`).
        if self.http.is_none() {
            let identity = self.identity(&context);
            let _ = self
                .front(&context, &identity)
                .streams
                .legacy
                .set(context.peer.clone());
        }
        let mut result = self.negotiate_initialize(&request)?;
        if let Some(extensions) = result.capabilities.extensions.as_mut() {
            extensions.remove(rmcp::model::TASKS_EXTENSION_ID);
        }
        // 2025-11-25 tasks: declared when a child declares them (marked: rmcp has no
        // `capabilities.tasks`; the front transport unmarks it, see `wire::task_marks`).
        if let Some(tasks) = self.mux.tasks_capability().await
            && let Value::Object(tasks) = tasks
        {
            result
                .capabilities
                .experimental
                .get_or_insert_with(Default::default)
                .insert(crate::wire::task_marks::TASKS_MARK.into(), tasks);
        }
        Ok(result)
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        // A session created here, or restored from the store on this replica (rmcp replays its
        // handshake): register its streams so notices reach a GET stream opened here.
        if let Some(http) = &self.http
            && let Some(id) = session_id(&context.extensions)
        {
            let front = self.legacy_front(http, &id);
            self.apply(&front, fetched(&context.extensions));
            let _ = front.streams.legacy.set(context.peer.clone());
        }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let caller = self.caller(&context);
        let mut tools = meta_table::meta_tools();
        tools.extend(self.mux.list_tools(&caller).map_err(wire::rpc_error)?);
        let mut result = ListToolsResult::with_all_items(tools);
        if is_modern(&context) {
            // Loaded sets differ per principal: never shared, never stale.
            result.ttl_ms = Some(0);
            result.cache_scope = Some(CacheScope::Private);
        }
        Ok(result)
    }

    async fn call_tool(
        &self,
        mut params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let caller = self.caller(&context);
        self.mux.deliver_pending(&caller.session).await;
        // rmcp moves the request's `_meta` into the context; look in both places.
        let token = params
            .meta
            .as_ref()
            .and_then(|m| m.get_progress_token())
            .or_else(|| context.meta.get_progress_token());
        let cx = CallContext {
            ct: context.ct.clone(),
            progress_token: token,
            sink: Some(Arc::new(PeerSink::new(&context))),
            tool: String::new(),
        };
        if let Some(result) = meta_table::call(&self.mux, &caller, &params, cx.clone()).await {
            announce_on_request_stream(&result, &context).await;
            return Ok(CallToolResponse::Complete(result));
        }
        params.meta = relay_meta(params.meta.take(), &context);
        match self.mux.call_tool(&caller, params, cx).await {
            Ok(CallToolResponse::Complete(r)) => {
                Ok(CallToolResponse::Complete(era::call_result(r)))
            }
            Ok(other) => Ok(other),
            Err(e) => wire::call_refusal(&e).map(CallToolResponse::Complete),
        }
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let caller = self.caller(&context);
        let prompts = self
            .mux
            .list_prompts(&caller)
            .await
            .map_err(wire::rpc_error)?;
        Ok(era::complete(ListPromptsResult::with_all_items(prompts)))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let caller = self.caller(&context);
        let r = self
            .mux
            .get_prompt(&caller, request, Self::context(&context))
            .await
            .map_err(wire::rpc_error)?;
        era::prompt_response(r, is_modern(&context))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let caller = self.caller(&context);
        let resources = self
            .mux
            .list_resources(&caller)
            .await
            .map_err(wire::rpc_error)?;
        Ok(era::complete(ListResourcesResult::with_all_items(
            resources,
        )))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let caller = self.caller(&context);
        let templates = self
            .mux
            .list_resource_templates(&caller)
            .await
            .map_err(wire::rpc_error)?;
        Ok(era::complete(ListResourceTemplatesResult::with_all_items(
            templates,
        )))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let caller = self.caller(&context);
        let r = self
            .mux
            .read_resource(&caller, request, Self::context(&context))
            .await
            .map_err(wire::rpc_error)?;
        era::resource_response(r, is_modern(&context))
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        let caller = self.caller(&context);
        self.mux
            .complete(&caller, request, Self::context(&context))
            .await
            .map(era::complete)
            .map_err(wire::rpc_error)
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = self.caller(&context);
        self.mux
            .set_level(&caller, request, Self::context(&context))
            .await
            .map_err(wire::rpc_error)
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = self.caller(&context);
        self.mux
            .subscribe(&caller, request, Self::context(&context))
            .await
            .map_err(wire::rpc_error)
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = self.caller(&context);
        self.mux
            .unsubscribe(&caller, request, Self::context(&context))
            .await
            .map_err(wire::rpc_error)
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.tools_list_changed = requested.tools_list_changed;
        // Resource subscriptions: URIs some child serves (the caller's right to each is checked
        // when the stream opens; one it may not subscribe to gets no updates).
        let uris: Vec<String> = requested
            .resource_subscriptions
            .iter()
            .flatten()
            .filter(|u| self.mux.serves_resource(u))
            .take(MAX_LISTEN_RESOURCES)
            .cloned()
            .collect();
        accepted.resource_subscriptions = (!uris.is_empty()).then_some(uris);
        Some(accepted)
    }

    /// 2025-11-25 task requests, renamed beneath rmcp into `graph-os/tasks/…` methods (see
    /// `wire::task_marks`). 2026-07-28 clients use the tasks extension (`get_task`,
    /// `update_task`, `cancel_task`); their `graph-os/…` requests are not found.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        let CustomRequest { method, params, .. } = request;
        // The client's own method name (a renamed task request is named as it was sent).
        let not_found = || {
            let sent = match method.as_str() {
                crate::wire::task_marks::CALL_METHOD => "tools/call",
                m => m
                    .strip_prefix(crate::wire::task_marks::METHOD_PREFIX)
                    .unwrap_or(m),
            };
            McpError::new(ErrorCode::METHOD_NOT_FOUND, sent.to_string(), None)
        };
        if !method.starts_with(crate::wire::task_marks::METHOD_PREFIX) || is_modern(&context) {
            return Err(not_found());
        }
        let caller = self.caller(&context);
        let params = params.unwrap_or_else(|| Value::Object(Default::default()));
        let mut cx = Self::context(&context);
        let outcome = match method.as_str() {
            crate::wire::task_marks::CALL_METHOD => {
                self.mux.deliver_pending(&caller.session).await;
                let mut params = params;
                if let Some(p) = params.as_object_mut()
                    && let Some(Value::Object(meta)) = p.remove("_meta")
                {
                    let meta: rmcp::model::RequestMetaObject =
                        serde_json::from_value(Value::Object(meta)).unwrap_or_default();
                    if let Some(meta) = relay_meta(Some(meta), &context) {
                        p.insert(
                            "_meta".into(),
                            serde_json::to_value(meta).unwrap_or_default(),
                        );
                    }
                }
                self.mux.call_tool_task(&caller, params, cx).await
            }
            "graph-os/tasks/get" => self.mux.task_get(&caller, params, cx).await,
            "graph-os/tasks/result" => {
                cx.sink = Some(Arc::new(PeerSink::new(&context)));
                self.mux.task_result(&caller, params, cx).await
            }
            "graph-os/tasks/list" => self.mux.task_list(&caller, params, cx).await,
            "graph-os/tasks/cancel" => self.mux.task_cancel(&caller, params, cx).await,
            _ => return Err(not_found()),
        };
        outcome.map(CustomResult).map_err(wire::task_error)
    }

    /// `tasks/get` of the 2026-07-28 tasks extension (rmcp has checked that the client
    /// declared it and that graph-os does).
    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let caller = self.caller(&context);
        self.mux
            .task_ext_get(&caller, request, Self::context(&context))
            .await
            .map_err(wire::task_error)
    }

    /// `tasks/update` of the tasks extension.
    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = self.caller(&context);
        self.mux
            .task_ext_update(&caller, request, Self::context(&context))
            .await
            .map_err(wire::task_error)
    }

    /// `tasks/cancel` of the tasks extension.
    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = self.caller(&context);
        self.mux
            .task_ext_cancel(&caller, request, Self::context(&context))
            .await
            .map_err(wire::task_error)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let sink = context.sink().clone();
        let id = sink.id().clone();
        let identity = self.identity(context.request_context());
        let front = self.front(context.request_context(), &identity);
        let streams = front.streams.clone();
        if let Ok(mut subs) = streams.subscriptions.lock() {
            subs.push(sink);
        }
        // This replica now holds a stream of the principal: the store routes its notices here.
        let binding = front.session.binding().cloned();
        if let Some(b) = &binding
            && let Err(e) = b.store.hold(&b.key, true).await
        {
            tracing::warn!(error = %e, "subscription stream not registered with the session store");
        }
        // rmcp acknowledges the listen before this handler runs: a change that happened in
        // between found no stream and is delivered now.
        self.mux.deliver_pending(&front.session).await;
        // Resource subscriptions go through the multiplexer as `resources/subscribe` does for a
        // 2025 client (authorized, forwarded to the owning child); the updates reach this stream.
        let caller = self.caller(context.request_context());
        let mut subscribed = Vec::new();
        for uri in context.accepted().resource_subscriptions.iter().flatten() {
            let request = rmcp::model::SubscribeRequestParams::new(uri.clone());
            let cx = Self::context(context.request_context());
            match self.mux.subscribe(&caller, request, cx).await {
                Ok(()) => subscribed.push(uri.clone()),
                Err(e) => tracing::info!(code = e.code(), "resource subscription not opened"),
            }
        }
        context.cancelled().await;
        for uri in subscribed {
            let request = rmcp::model::UnsubscribeRequestParams::new(uri);
            let cx = Self::context(context.request_context());
            let _ = self.mux.unsubscribe(&caller, request, cx).await;
        }
        if let Ok(mut subs) = streams.subscriptions.lock() {
            subs.retain(|s| s.id() != &id);
        }
        if let Some(b) = &binding {
            let _ = b.store.hold(&b.key, false).await;
        }
        Ok(())
    }
}
