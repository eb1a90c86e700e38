//! The MCP face of graph-os: meta tools, loaded-tool forwarders, prompts and resources.
//!
//! One [`GatewayHandler`] per front session. It owns the session's notification streams
//! (the 2025-era session peer and any 2026-era `subscriptions/listen` sinks) and delegates all
//! catalog and child work to the [`Multiplexer`].
// Logging notifications are SEP-2577-deprecated but still forwarded for 2025-era clients.
#![allow(deprecated)]

pub mod auth;
pub mod era;
pub mod http;
pub mod rest;

use std::sync::{Arc, Mutex, OnceLock};

use futures::future::BoxFuture;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, ClientRequest,
    CompleteRequestParams, CompleteResult, ContentBlock as Content, ErrorCode, GetPromptRequest,
    GetPromptRequestParams, GetPromptResponse, Implementation, InitializeRequestParams,
    InitializeResult, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, LoggingMessageNotificationParam, PaginatedRequestParams,
    ProgressNotificationParam, ReadResourceRequest, ReadResourceRequestParams,
    ReadResourceResponse, Reference, ServerCapabilities, ServerInfo, ServerResult,
    SetLevelRequestParams, SubscribeRequestParams, SubscriptionFilter, Tool,
    UnsubscribeRequestParams,
};
use rmcp::service::{RequestContext, RoleServer, SubscriptionContext, SubscriptionSink};
use rmcp::{ErrorData as McpError, Peer, ServerHandler};
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::child::{CallError, CallObserver};
use crate::mux::{
    self, FindToolsArgs, ListCatalogArgs, LoadArgs, MetaError, Multiplexer, NotifyOutcome, Session,
    SessionNotifier,
};

/// Key under `_meta` carrying graph-os error details on tool-error results.
pub const ERROR_META_KEY: &str = "io.graph-os/error";

const INSTRUCTIONS: &str = "graph-os fronts a fleet of MCP servers. Use find_tools to search the fleet \
(results include full input schemas), load_tools to add tools to your tool list, call them, and \
unload_tools when done. list_catalog shows every server; multiplexer_status shows child health.";

/// The session's notification streams.
#[derive(Default)]
pub struct FrontStreams {
    legacy: OnceLock<Peer<RoleServer>>,
    subscriptions: Mutex<Vec<SubscriptionSink>>,
}

impl SessionNotifier for FrontStreams {
    fn resource_updated(&self, uri: String) -> BoxFuture<'static, NotifyOutcome> {
        let legacy = self.legacy.get().cloned();
        let subs: Vec<SubscriptionSink> = self
            .subscriptions
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        Box::pin(async move {
            let params = rmcp::model::ResourceUpdatedNotificationParam::new(uri);
            let mut outcome = NotifyOutcome::NoStream;
            if let Some(peer) = legacy.filter(|p| !p.is_transport_closed()) {
                outcome = match peer.notify_resource_updated(params.clone()).await {
                    Ok(()) => NotifyOutcome::Sent,
                    Err(_) => NotifyOutcome::Failed,
                };
            }
            for sink in subs {
                if sink
                    .notify_resource_updated(params.uri.clone())
                    .await
                    .is_ok()
                {
                    outcome = NotifyOutcome::Sent;
                }
            }
            outcome
        })
    }

    fn tools_changed(&self) -> BoxFuture<'static, NotifyOutcome> {
        let legacy = self.legacy.get().cloned();
        let subs: Vec<SubscriptionSink> = self
            .subscriptions
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        Box::pin(async move {
            let mut outcome = NotifyOutcome::NoStream;
            if let Some(peer) = legacy.filter(|p| !p.is_transport_closed()) {
                outcome = match peer.notify_tool_list_changed().await {
                    Ok(()) => NotifyOutcome::Sent,
                    Err(_) => NotifyOutcome::Failed,
                };
            }
            for sink in subs {
                match sink.notify_tool_list_changed().await {
                    Ok(()) => outcome = NotifyOutcome::Sent,
                    Err(_) if outcome == NotifyOutcome::NoStream => outcome = NotifyOutcome::Failed,
                    Err(_) => {}
                }
            }
            outcome
        })
    }
}

/// One front session: its loaded set (in the multiplexer) and its notification streams.
#[derive(Clone)]
pub struct FrontSession {
    session: Arc<Session>,
    streams: Arc<FrontStreams>,
}

impl FrontSession {
    fn open(mux: &Multiplexer) -> Self {
        let streams = Arc::new(FrontStreams::default());
        FrontSession {
            session: mux.open_session(streams.clone()),
            streams,
        }
    }
}

/// 2026-07-28 front sessions, keyed by principal.
///
/// The 2026-07-28 era has no protocol sessions, so loaded sets are keyed by who is asking.
/// Until bearer authentication arrives the rule is: a bearer token's digest when the request
/// carries `Authorization: Bearer …`; else the client-supplied `Mcp-Principal` header (≤ 128
/// chars); else the client's IP address (clients commonly open a new connection per request,
/// so anonymous clients on one host share a loaded set); else one shared anonymous principal.
/// Idle principals are forgotten after [`PRINCIPAL_IDLE`].
#[derive(Default)]
pub struct Principals {
    sessions: Mutex<std::collections::HashMap<String, (FrontSession, std::time::Instant)>>,
}

/// How long an unused principal keeps its loaded set.
pub const PRINCIPAL_IDLE: std::time::Duration = std::time::Duration::from_secs(3600);

impl Principals {
    fn get(&self, mux: &Multiplexer, key: String) -> FrontSession {
        let mut map = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        map.retain(|_, (_, used)| now.duration_since(*used) < PRINCIPAL_IDLE);
        let entry = map
            .entry(key)
            .or_insert_with(|| (FrontSession::open(mux), now));
        entry.1 = now;
        entry.0.clone()
    }
}

/// The principal key of a 2026-era HTTP request (see [`Principals`]); never contains a secret.
pub fn principal_key(parts: &::http::request::Parts) -> String {
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(token) = header("authorization").and_then(|v| v.strip_prefix("Bearer ")) {
        return format!(
            "bearer:{}",
            &crate::catalog::sha256_hex(token.as_bytes())[..32]
        );
    }
    if let Some(handle) = header("mcp-principal").filter(|h| !h.is_empty() && h.len() <= 128) {
        return format!("handle:{handle}");
    }
    if let Some(axum::extract::ConnectInfo(addr)) = parts
        .extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
    {
        // Clients commonly open a connection per request, so the address (not the port) is the
        // most stable anonymous identity: anonymous clients on one host share a loaded set.
        return format!("addr:{}", addr.ip());
    }
    "anonymous".into()
}

/// The rmcp server handler for one front session (2025 era) or one request (2026 era over HTTP,
/// where the session is looked up by principal).
#[derive(Clone)]
pub struct GatewayHandler {
    mux: Arc<Multiplexer>,
    own: Arc<OnceLock<FrontSession>>,
    principals: Option<Arc<Principals>>,
    tokens: Arc<auth::Tokens>,
}

impl GatewayHandler {
    /// A new front session on `mux` (stdio, or one streamable HTTP session).
    pub fn new(mux: Arc<Multiplexer>) -> Self {
        GatewayHandler {
            mux,
            own: Arc::default(),
            principals: None,
            tokens: Arc::default(),
        }
    }

    /// A handler that keys 2026-era requests by principal (streamable HTTP).
    pub fn with_principals(
        mux: Arc<Multiplexer>,
        principals: Arc<Principals>,
        tokens: Arc<auth::Tokens>,
    ) -> Self {
        GatewayHandler {
            mux,
            own: Arc::default(),
            principals: Some(principals),
            tokens,
        }
    }

    /// The caller's scope: stdio is the trusted local user; HTTP callers by bearer token.
    fn scope(&self, ctx: &RequestContext<RoleServer>) -> auth::Scope {
        if self.principals.is_none() {
            return auth::Scope::Manage;
        }
        let header = ctx
            .extensions
            .get::<::http::request::Parts>()
            .and_then(|p| p.headers.get("authorization"))
            .and_then(|v| v.to_str().ok());
        self.tokens
            .scope_of_header(header)
            .unwrap_or(if self.tokens.is_empty() {
                auth::Scope::Delegate
            } else {
                auth::Scope::Discover
            })
    }

    /// The multiplexer behind this session.
    pub fn mux(&self) -> &Arc<Multiplexer> {
        &self.mux
    }

    /// The session a request belongs to.
    fn front(&self, ctx: &RequestContext<RoleServer>) -> FrontSession {
        if is_modern(ctx)
            && let Some(principals) = &self.principals
            && let Some(parts) = ctx.extensions.get::<::http::request::Parts>()
        {
            return principals.get(&self.mux, principal_key(parts));
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
}

fn schema<T: JsonSchema + 'static>() -> Arc<serde_json::Map<String, serde_json::Value>> {
    rmcp::handler::server::common::schema_for_type::<T>()
}

#[derive(JsonSchema, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

fn denied() -> crate::catalog::reconciler::Refusal {
    crate::catalog::reconciler::Refusal::new(
        crate::catalog::reconciler::ContractCode::AuthorizationDenied,
        "scope required",
    )
}

/// A contract refusal as a tool result: `isError` with the payload as structured content.
fn contract_result(e: &crate::mux::ContractError) -> CallToolResult {
    let mut r = structured(e);
    r.is_error = Some(true);
    r
}

/// `fleet_graph` input: one question over the knowledge-graph projection.
#[derive(Debug, Clone, serde::Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FleetGraphArgs {
    /// Which servers provide items whose name or description mentions this text.
    #[serde(default)]
    pub servers_providing: Option<String>,
    /// What changed between two generations: `[from, to]`.
    #[serde(default)]
    pub diff: Option<(u64, u64)>,
}

async fn fleet_graph(
    mux: &Multiplexer,
    args: FleetGraphArgs,
) -> Result<serde_json::Value, MetaError> {
    let projection = mux.projection().clone();
    let answer = tokio::task::spawn_blocking(move || match (args.servers_providing, args.diff) {
        (Some(term), None) if (1..=256).contains(&term.len()) => {
            projection.servers_providing(&term)
        }
        (None, Some((from, to))) => projection.diff(from, to),
        _ => Err(
            "ask exactly one question: servers_providing (1..256 chars) or diff [from, to]".into(),
        ),
    })
    .await
    .map_err(|e| MetaError {
        code: "fleet-graph-failed",
        message: e.to_string(),
    })?;
    answer.map_err(|message| MetaError {
        code: "fleet-graph-failed",
        message,
    })
}

/// The meta tools graph-os serves itself.
pub fn meta_tools() -> Vec<Tool> {
    let ro = || Some(rmcp::model::ToolAnnotations::new().read_only(true));
    let mut find = Tool::new(
        "find_tools",
        "Search every server in the fleet for tools matching a task description. Returns ranked tools with \
         their full input schemas; call load_tools with a name to add it to your tool list.",
        schema::<FindToolsArgs>(),
    );
    find.annotations = ro();
    let mut list = Tool::new(
        "list_catalog",
        "List the servers in the fleet with their state, prefix and tools; pass server to drill into one.",
        schema::<ListCatalogArgs>(),
    );
    list.annotations = ro();
    let load = Tool::new(
        "load_tools",
        "Add tools (exposed names from find_tools) or every tool of whole servers to your tool list.",
        schema::<LoadArgs>(),
    );
    let unload = Tool::new(
        "unload_tools",
        "Remove tools or servers from your tool list.",
        schema::<LoadArgs>(),
    );
    let mut status = Tool::new(
        "multiplexer_status",
        "Health of every child server: state, breaker, in-flight and queued calls, restarts, last error code.",
        schema::<NoArgs>(),
    );
    status.annotations = ro();
    let refresh = Tool::new(
        "catalog_refresh",
        "Admin: re-probe every child under one deadline and publish a new catalog generation if the content \
         changed. Requires the served config revision, generation and digest (from list_catalog).",
        schema::<crate::mux::RefreshRequest>(),
    );
    let dispatch = Tool::new(
        "catalog_dispatch",
        "Call any tool of the catalog without loading it, bound to the exact generation and digest you resolved \
         its name against (from list_catalog).",
        schema::<crate::mux::DispatchRequest>(),
    );
    let mut graph = Tool::new(
        "fleet_graph",
        "Ask the fleet knowledge graph: which servers provide X, or what changed between two generations.",
        schema::<FleetGraphArgs>(),
    );
    graph.annotations = ro();
    vec![find, list, load, unload, status, refresh, dispatch, graph]
}

fn parse_args<T: DeserializeOwned>(params: &CallToolRequestParams) -> Result<T, MetaError> {
    let value = serde_json::Value::Object(params.arguments.clone().unwrap_or_default());
    serde_json::from_value(value).map_err(|e| MetaError {
        code: "invalid-arguments",
        message: e.to_string(),
    })
}

fn structured<T: Serialize>(value: &T) -> CallToolResult {
    let value = serde_json::to_value(value).unwrap_or_default();
    let text = serde_json::to_string_pretty(&value).unwrap_or_default();
    let mut result = CallToolResult::success(vec![Content::text(text)]);
    result.structured_content = Some(value);
    result
}

/// A tool-error result carrying a stable code in text and `_meta`.
pub fn error_result(code: &str, message: &str, server: Option<&str>) -> CallToolResult {
    let mut result = CallToolResult::error(vec![Content::text(format!("{code}: {message}"))]);
    let mut meta = rmcp::model::MetaObject::new();
    meta.insert(
        ERROR_META_KEY.into(),
        serde_json::json!({"code": code, "message": message, "server": server}),
    );
    result.meta = Some(meta);
    result
}

fn meta_outcome<T: Serialize>(r: Result<T, MetaError>) -> CallToolResult {
    match r {
        Ok(v) => structured(&v),
        Err(e) => error_result(e.code, &e.message, None),
    }
}

/// Forwards a call's progress and log notifications to the front session, in order.
struct FrontObserver {
    tx: mpsc::UnboundedSender<FrontNote>,
    token: Option<rmcp::model::ProgressToken>,
    peer: Peer<RoleServer>,
    modern: bool,
    /// The front request this call serves: relayed requests travel on its stream.
    front_id: rmcp::model::RequestId,
}

enum FrontNote {
    Progress(ProgressNotificationParam),
    Log(LoggingMessageNotificationParam),
}

impl CallObserver for FrontObserver {
    fn progress(&self, mut params: ProgressNotificationParam) {
        if let Some(token) = &self.token {
            params.progress_token = token.clone();
            let _ = self.tx.send(FrontNote::Progress(params));
        }
    }
    fn log(&self, params: LoggingMessageNotificationParam) {
        let _ = self.tx.send(FrontNote::Log(params));
    }
    fn relay(
        &self,
        request: rmcp::model::ServerRequest,
    ) -> BoxFuture<'static, Result<rmcp::model::ClientResult, McpError>> {
        let peer = self.peer.clone();
        let modern = self.modern;
        let front_id = self.front_id.clone();
        Box::pin(async move {
            if modern {
                // 2026-07-28 forbids server→client requests outside input-required results.
                return Err(McpError::invalid_request(
                    "the calling client speaks 2026-07-28; server-to-client requests are not relayed",
                    None,
                ));
            }
            // Tag the request with the front call it belongs to, and send it from a fresh task:
            // rmcp would otherwise tag it with the child-side request being handled, and the
            // streamable HTTP server would deliver it on the wrong stream.
            let mut request = request;
            rmcp::model::GetExtensions::extensions_mut(&mut request)
                .insert(rmcp::service::OriginatingRequestId(front_id));
            let sent = tokio::spawn(async move { peer.send_request(request).await }).await;
            let Ok(sent) = sent else {
                return Err(McpError::internal_error("relay task failed", None));
            };
            match sent {
                Ok(r) => Ok(r),
                Err(rmcp::service::ServiceError::McpError(e)) => Err(e),
                Err(e) => Err(McpError::internal_error(
                    format!("relay to the client failed: {e}"),
                    None,
                )),
            }
        })
    }
}

#[allow(deprecated)]
fn spawn_forwarder(
    peer: Peer<RoleServer>,
    mut rx: mpsc::UnboundedReceiver<FrontNote>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(note) = rx.recv().await {
            let _ = match note {
                FrontNote::Progress(p) => peer.notify_progress(p).await,
                FrontNote::Log(l) => peer.notify_logging_message(l).await,
            };
        }
    })
}

fn call_error_result(e: &CallError, server: &str) -> Result<CallToolResponse, McpError> {
    match e {
        CallError::Rpc(err) => Err(err.clone()),
        other => Ok(CallToolResponse::Complete(error_result(
            other.code(),
            &other.to_string(),
            Some(server),
        ))),
    }
}

fn call_error_rpc(e: CallError) -> McpError {
    match e {
        CallError::Rpc(err) => err,
        other => McpError::internal_error(
            other.to_string(),
            Some(serde_json::json!({"code": other.code()})),
        ),
    }
}

/// The request `_meta` to pass to a child: the caller's keys minus the progress token (graph-os
/// routes progress with its own token, see `child::client`) and minus the protocol envelope
/// (`io.modelcontextprotocol/*`), which belongs to the front connection's era.
fn relay_meta(
    params_meta: Option<rmcp::model::RequestMetaObject>,
    ctx: &RequestContext<RoleServer>,
) -> Option<rmcp::model::RequestMetaObject> {
    let mut meta = ctx.meta.clone();
    if let Some(extra) = params_meta {
        meta.extend(extra);
    }
    let drop: Vec<String> = meta
        .keys()
        .filter(|k| *k == "progressToken" || k.starts_with("io.modelcontextprotocol/"))
        .cloned()
        .collect();
    for k in drop {
        meta.remove(&k);
    }
    (!meta.is_empty()).then_some(meta)
}

fn is_modern(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.protocol_version().is_some_and(|v| !v.has_initialize())
}

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
        info.server_info = Implementation::new("graph-os", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(INSTRUCTIONS.into());
        info
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        context.peer.set_peer_info(request.clone());
        let _ = self
            .front(&context)
            .streams
            .legacy
            .set(context.peer.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let front = self.front(&context);
        let mut tools = meta_tools();
        tools.extend(
            self.mux
                .visible_tools(&front.session)
                .into_iter()
                .map(|t| t.tool),
        );
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
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let front = self.front(&context);
        self.mux.deliver_pending(&front.session).await;
        let result = match params.name.as_ref() {
            "find_tools" => match parse_args::<FindToolsArgs>(&params) {
                Ok(a) => meta_outcome(self.mux.find_tools(&front.session, a).await),
                Err(e) => meta_outcome::<()>(Err(e)),
            },
            "list_catalog" => match parse_args::<ListCatalogArgs>(&params) {
                Ok(a) => meta_outcome(self.mux.list_catalog(&front.session, a).await),
                Err(e) => meta_outcome::<()>(Err(e)),
            },
            "load_tools" => match parse_args::<LoadArgs>(&params) {
                Ok(a) => meta_outcome(self.mux.load_tools(&front.session, a).await),
                Err(e) => meta_outcome::<()>(Err(e)),
            },
            "unload_tools" => match parse_args::<LoadArgs>(&params) {
                Ok(a) => meta_outcome(self.mux.unload_tools(&front.session, a).await),
                Err(e) => meta_outcome::<()>(Err(e)),
            },
            "catalog_refresh" => {
                let raw = serde_json::Value::Object(params.arguments.clone().unwrap_or_default());
                if self.scope(&context) < auth::Scope::Manage {
                    let request_id = raw
                        .get("request_id")
                        .and_then(|v| v.as_str())
                        .unwrap_or_default();
                    contract_result(&self.mux.contract_error(request_id, &denied()))
                } else {
                    match self.mux.refresh(raw).await {
                        Ok(r) => structured(&r),
                        Err(e) => contract_result(&e),
                    }
                }
            }
            "catalog_dispatch" => {
                let raw = serde_json::Value::Object(params.arguments.clone().unwrap_or_default());
                if self.scope(&context) < auth::Scope::Delegate {
                    contract_result(&self.mux.contract_error("", &denied()))
                } else {
                    match self.mux.dispatch(raw, context.ct.clone()).await {
                        Ok(r) => era::call_result(r),
                        Err(e) => contract_result(&e),
                    }
                }
            }
            "fleet_graph" => match parse_args::<FleetGraphArgs>(&params) {
                Ok(a) => meta_outcome(fleet_graph(&self.mux, a).await),
                Err(e) => meta_outcome::<()>(Err(e)),
            },
            "multiplexer_status" => match parse_args::<NoArgs>(&params) {
                Ok(_) => structured(&self.mux.status()),
                Err(e) => meta_outcome::<()>(Err(e)),
            },
            name => return self.forward_call(name.to_string(), params, context).await,
        };
        Ok(CallToolResponse::Complete(result))
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        self.mux.settle(&[]).await;
        Ok(ListPromptsResult::with_all_items(
            self.mux
                .view()
                .prompts
                .values()
                .map(|p| p.prompt.clone())
                .collect(),
        ))
    }

    async fn get_prompt(
        &self,
        mut request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let view = self.mux.view();
        let Some(entry) = view.prompts.get(&request.name) else {
            return Err(McpError::invalid_params(
                format!("unknown prompt '{}'", request.name),
                None,
            ));
        };
        request.name = entry.original.clone();
        let req = ClientRequest::GetPromptRequest(GetPromptRequest::new(request));
        match self
            .forward_to(&entry.server, req, &context, McpError::invalid_params)
            .await?
        {
            ServerResult::GetPromptResult(r) => {
                Ok(GetPromptResponse::Complete(era::prompt_result(r)))
            }
            _ => Err(unexpected("prompts/get")),
        }
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        self.mux.settle(&[]).await;
        Ok(ListResourcesResult::with_all_items(
            self.mux
                .view()
                .resources
                .values()
                .map(|(_, r)| r.clone())
                .collect(),
        ))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        self.mux.settle(&[]).await;
        Ok(ListResourceTemplatesResult::with_all_items(
            self.mux
                .view()
                .templates
                .iter()
                .map(|(_, t)| t.clone())
                .collect(),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let view = self.mux.view();
        let Some(server) = view.resource_owner(&request.uri).map(str::to_string) else {
            return Err(McpError::resource_not_found(
                format!("no server provides '{}'", request.uri),
                None,
            ));
        };
        let req = ClientRequest::ReadResourceRequest(ReadResourceRequest::new(request));
        match self
            .forward_to(&server, req, &context, McpError::resource_not_found)
            .await?
        {
            ServerResult::ReadResourceResult(r) => {
                Ok(ReadResourceResponse::Complete(era::resource_result(r)))
            }
            _ => Err(unexpected("resources/read")),
        }
    }

    async fn complete(
        &self,
        mut request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        let view = self.mux.view();
        let server = match &mut request.r#ref {
            Reference::Prompt(p) => {
                let Some(entry) = view.prompts.get(&p.name) else {
                    return Err(McpError::invalid_params(
                        format!("unknown prompt '{}'", p.name),
                        None,
                    ));
                };
                p.name = entry.original.clone();
                entry.server.clone()
            }
            Reference::Resource(r) => match view
                .templates
                .iter()
                .find(|(_, t)| t.uri_template == r.uri)
                .map(|(s, _)| s.clone())
                .or_else(|| view.resource_owner(&r.uri).map(str::to_string))
            {
                Some(s) => s,
                None => {
                    return Err(McpError::invalid_params(
                        format!("no server provides '{}'", r.uri),
                        None,
                    ));
                }
            },
            _ => {
                return Err(McpError::invalid_params(
                    "unsupported completion reference",
                    None,
                ));
            }
        };
        let req = ClientRequest::CompleteRequest(rmcp::model::CompleteRequest::new(request));
        match self
            .forward_to(&server, req, &context, McpError::invalid_params)
            .await?
        {
            ServerResult::CompleteResult(r) => Ok(r),
            _ => Err(unexpected("completion/complete")),
        }
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        // The level applies to every child serving this gateway (children are shared).
        let children: Vec<_> = self.mux.fleet().children.values().cloned().collect();
        for child in children {
            if child.status().state == crate::child::ChildState::Up {
                let req = ClientRequest::SetLevelRequest(rmcp::model::SetLevelRequest::new(
                    request.clone(),
                ));
                if let Err(e) = child.forward(req, context.ct.clone()).await {
                    tracing::debug!(server = child.name(), error = %e, "child did not accept logging/setLevel");
                }
            }
        }
        Ok(())
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let server = self
            .mux
            .view()
            .resource_owner(&request.uri)
            .map(str::to_string);
        let Some(child) = server.and_then(|s| self.mux.child(&s)) else {
            return Err(McpError::resource_not_found(
                format!("no server provides '{}'", request.uri),
                None,
            ));
        };
        let uri = request.uri.clone();
        match child
            .forward(
                ClientRequest::SubscribeRequest(rmcp::model::SubscribeRequest::new(request)),
                context.ct.clone(),
            )
            .await
        {
            Ok(_) => {
                self.mux.subscribe(&self.front(&context).session, &uri);
                Ok(())
            }
            Err(e) => Err(call_error_rpc(e)),
        }
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.mux
            .unsubscribe(&self.front(&context).session, &request.uri);
        let server = self
            .mux
            .view()
            .resource_owner(&request.uri)
            .map(str::to_string);
        let Some(child) = server.and_then(|s| self.mux.child(&s)) else {
            return Err(McpError::resource_not_found(
                format!("no server provides '{}'", request.uri),
                None,
            ));
        };
        child
            .forward(
                ClientRequest::UnsubscribeRequest(rmcp::model::UnsubscribeRequest::new(request)),
                context.ct.clone(),
            )
            .await
            .map(|_| ())
            .map_err(call_error_rpc)
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.tools_list_changed = requested.tools_list_changed;
        Some(accepted)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let sink = context.sink().clone();
        let id = sink.id().clone();
        let front = self.front(context.request_context());
        let streams = front.streams.clone();
        if let Ok(mut subs) = streams.subscriptions.lock() {
            subs.push(sink);
        }
        // rmcp acknowledges the listen before this handler runs: a change that happened in
        // between found no stream and is delivered now.
        self.mux.deliver_pending(&front.session).await;
        context.cancelled().await;
        if let Ok(mut subs) = streams.subscriptions.lock() {
            subs.retain(|s| s.id() != &id);
        }
        Ok(())
    }
}

/// The error for a child answering a request with the wrong result type.
fn unexpected(method: &str) -> McpError {
    McpError::internal_error(
        format!("child answered {method} with an unexpected result"),
        None,
    )
}

impl GatewayHandler {
    /// Forwards a non-tool request to `server`'s child; a child JSON-RPC error comes back unchanged.
    /// `missing` builds the error when the server left the fleet since the lookup.
    async fn forward_to(
        &self,
        server: &str,
        request: ClientRequest,
        context: &RequestContext<RoleServer>,
        missing: fn(String, Option<serde_json::Value>) -> McpError,
    ) -> Result<ServerResult, McpError> {
        let Some(child) = self.mux.child(server) else {
            return Err(missing(format!("server '{server}' left the fleet"), None));
        };
        child
            .forward(request, context.ct.clone())
            .await
            .map_err(call_error_rpc)
    }

    async fn forward_call(
        &self,
        name: String,
        mut params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let view = self.mux.view();
        let Some(entry) = view.tools.get(&name) else {
            return Err(McpError::new(
                ErrorCode::INVALID_PARAMS,
                format!("Unknown tool: {name}"),
                None,
            ));
        };
        if !entry.eager && !self.front(&context).session.loaded().contains(&name) {
            return Ok(CallToolResponse::Complete(error_result(
                "tool-not-loaded",
                &format!(
                    "'{name}' is in the catalog but not loaded in this session; call load_tools first"
                ),
                Some(&entry.server),
            )));
        }
        let Some(child) = self.mux.child(&entry.server) else {
            return Ok(CallToolResponse::Complete(error_result(
                "child-unavailable",
                "the server left the fleet",
                Some(&entry.server),
            )));
        };
        // rmcp moves the request's `_meta` into the context; look in both places.
        let token = params
            .meta
            .as_ref()
            .and_then(|m| m.get_progress_token())
            .or_else(|| context.meta.get_progress_token());
        let (tx, rx) = mpsc::unbounded_channel();
        let forwarder = spawn_forwarder(context.peer.clone(), rx);
        let observer: Arc<dyn CallObserver> = Arc::new(FrontObserver {
            tx,
            token,
            peer: context.peer.clone(),
            modern: is_modern(&context),
            front_id: context.id.clone(),
        });
        params.name = entry.original.clone().into();
        params.meta = relay_meta(params.meta.take(), &context);
        let read_only = entry
            .tool
            .annotations
            .as_ref()
            .and_then(|a| a.read_only_hint)
            .unwrap_or(false);
        let outcome = child
            .call_tool(params, read_only, Some(observer), context.ct.clone())
            .await;
        // Every notification of the call is queued to the client before its result.
        let _ = forwarder.await;
        match outcome {
            Ok(r) => Ok(CallToolResponse::Complete(era::call_result(r))),
            Err(e) => call_error_result(&e, &entry.server),
        }
    }
}

/// Serves MCP on stdin/stdout until the client disconnects.
pub async fn serve_stdio(mux: Arc<Multiplexer>) -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    let handler = GatewayHandler::new(mux.clone());
    let running = handler.serve(rmcp::transport::stdio()).await?;
    let reason = running.waiting().await;
    tracing::info!(?reason, "stdio client disconnected");
    mux.shutdown().await;
    Ok(())
}

#[doc(hidden)]
pub use mux::META_TOOLS;
