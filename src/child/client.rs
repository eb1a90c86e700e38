//! The client side of a child connection: receives the child's notifications and routes a
//! call's progress and log messages to whoever is waiting for that call.
// Logging notifications are SEP-2577-deprecated but still forwarded for 2025-era clients.
#![allow(deprecated)]

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use rmcp::ErrorData;
use rmcp::model::SubscriptionFilter;
use rmcp::model::{
    ClientCapabilities, ClientInfo, Implementation, ListRootsResult,
    LoggingMessageNotificationParam, ProgressNotificationParam, ProgressToken, RequestId,
};
use rmcp::model::{
    ClientResult, CreateMessageRequest, CreateMessageRequestParams, CreateMessageResult,
    ElicitRequest, ElicitRequestParams, ElicitResult, JsonRpcMessage, ServerNotification,
    ServerRequest,
};
use rmcp::service::{InboundStreamOrigin, RequestContext};
use rmcp::service::{NotificationContext, RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::{ClientHandler, Peer};
use tokio_util::sync::CancellationToken;

use crate::transport::http::LOG_ORIGIN_KEY;
use crate::wire::task_marks::RELATED_TASK;

/// What a front client declared it can answer (its `initialize` capabilities).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientCaps {
    /// `roots`.
    pub roots: bool,
    /// `sampling`.
    pub sampling: bool,
    /// `sampling.tools` (requests carrying `tools` / `toolChoice`).
    pub sampling_tools: bool,
    /// `sampling.context` (requests with `includeContext` other than `none`).
    pub sampling_context: bool,
    /// `elicitation.form` (an empty `elicitation` object means form).
    pub elicitation_form: bool,
    /// `elicitation.url`.
    pub elicitation_url: bool,
    /// The 2026-07-28 tasks extension (`extensions["io.modelcontextprotocol/tasks"]`): the
    /// client takes a task in answer to `tools/call`.
    pub tasks: bool,
}

impl ClientCaps {
    /// Reads the capabilities a 2025-era client declared.
    pub fn from_declared(c: &ClientCapabilities) -> Self {
        let sampling = c.sampling.as_ref();
        let elicitation = c.elicitation.as_ref();
        ClientCaps {
            roots: c.roots.is_some(),
            sampling: sampling.is_some(),
            sampling_tools: sampling.is_some_and(|s| s.tools.is_some()),
            sampling_context: sampling.is_some_and(|s| s.context.is_some()),
            elicitation_form: elicitation
                .is_some_and(|e| e.form.is_some() || (e.form.is_none() && e.url.is_none())),
            elicitation_url: elicitation.is_some_and(|e| e.url.is_some()),
            tasks: c.supports_tasks(),
        }
    }

    /// Whether a child's request of this kind may be relayed to the client.
    pub fn allows(&self, kind: RelayKind) -> bool {
        match kind {
            RelayKind::Roots => self.roots,
            RelayKind::Sampling { tools, context } => {
                self.sampling
                    && (!tools || self.sampling_tools)
                    && (!context || self.sampling_context)
            }
            RelayKind::Elicitation { url: false } => self.elicitation_form,
            RelayKind::Elicitation { url: true } => self.elicitation_url,
        }
    }
}

/// A request a child sends to the client, by the capability it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayKind {
    /// `roots/list`.
    Roots,
    /// `sampling/createMessage` (with tools / with context inclusion).
    Sampling {
        /// Carries `tools` or `toolChoice`.
        tools: bool,
        /// Asks for `includeContext` other than `none`.
        context: bool,
    },
    /// `elicitation/create` (URL mode or form mode).
    Elicitation {
        /// URL mode.
        url: bool,
    },
}

impl RelayKind {
    fn of(request: &ServerRequest) -> Option<Self> {
        match request {
            ServerRequest::ListRootsRequest(_) => Some(RelayKind::Roots),
            ServerRequest::CreateMessageRequest(r) => Some(RelayKind::Sampling {
                tools: r.params.tools.is_some() || r.params.tool_choice.is_some(),
                context: r
                    .params
                    .include_context
                    .as_ref()
                    .is_some_and(|c| !matches!(c, rmcp::model::ContextInclusion::None)),
            }),
            ServerRequest::ElicitRequest(r) => Some(RelayKind::Elicitation {
                url: matches!(r.params, ElicitRequestParams::UrlElicitationParams { .. }),
            }),
            _ => None,
        }
    }
}

/// The stable codes of a child→client request graph-os refuses (sent to the child as JSON-RPC
/// error data `{"code": …}`) and of child log lines it drops.
pub mod relay_code {
    /// No front call is in flight on this connection (or the call it names has ended).
    pub const NO_CALLER: &str = "relay-no-caller";
    /// A shared connection and no exact evidence of the calling session (no request stream
    /// association): the caller is unknown, so nobody is asked.
    pub const UNASSOCIATED: &str = "relay-unassociated";
    /// The calling client did not declare the capability this request needs.
    pub const CAPABILITY_MISSING: &str = "client-capability-missing";
    /// The client did not answer within the relay timeout.
    pub const TIMEOUT: &str = "relay-timeout";
}

/// The JSON-RPC error graph-os answers a refused child→client request with.
pub fn relay_refusal(code: &str, message: &str) -> ErrorData {
    ErrorData::new(
        rmcp::model::ErrorCode(RELAY_REFUSED),
        message.to_string(),
        Some(serde_json::json!({ "code": code })),
    )
}

/// JSON-RPC error code of a refused child→client request (implementation-defined range).
pub const RELAY_REFUSED: i32 = -32001;

/// Receives the notifications and requests that belong to one forwarded call.
///
/// Implemented by the multiplexer for each front call; the child side only routes. Every
/// method must return promptly: `progress` and `log` never block the child connection.
pub trait CallObserver: Send + Sync {
    /// The front session the call belongs to (routing key for child→client traffic).
    fn session(&self) -> u64;
    /// What the calling client can answer.
    fn caps(&self) -> ClientCaps;
    /// A `notifications/progress` for the call (token already rewritten to the caller's).
    fn progress(&self, params: ProgressNotificationParam);
    /// A `notifications/message` the child sent for this call (see [`Routes`] for the rule).
    fn log(&self, params: LoggingMessageNotificationParam);
    /// Relays a request the child sent while serving the call (sampling, elicitation, roots) to
    /// the client that made the call, and returns its answer.
    fn relay(&self, request: ServerRequest) -> BoxFuture<'static, Result<ClientResult, ErrorData>>;
    /// Whether the calling client takes `input_required` results itself (it speaks
    /// 2026-07-28): a 2026 child's input requests then go back to it unchanged, instead of
    /// being relayed as requests.
    fn takes_input_required(&self) -> bool {
        false
    }
}

/// Events of a child connection that are not tied to one call, delivered to the multiplexer.
pub trait ChildEvents: Send + Sync {
    /// The child sent `notifications/resources/updated` for `uri`.
    fn resource_updated(&self, server: &str, uri: &str);
    /// The child sent a 2025 `notifications/tasks/status` (its own task id inside).
    fn task_status(&self, _server: &str, _params: serde_json::Value) {}
}

/// Routes notifications and requests of in-flight calls to their observers.
///
/// A call is registered before its request is sent (so log messages the child emits while
/// serving it are never missed) and bound to the request's progress token and JSON-RPC id right
/// after rmcp assigns them. Progress (and stream-associated logs) that arrive in between are
/// parked (bounded) and replayed on bind.
///
/// Association rule (tenant-exact, one place: [`Routes::target`]): child traffic reaches a
/// session only on exact evidence.
/// - Progress goes by its progress token.
/// - Logs and child→client requests go to the call whose request stream they arrived on
///   (streamable HTTP: the POST response stream of that call's request — see [`Origin`]).
/// - A child→client request naming one of the child's tasks (`_meta` [`RELATED_TASK`], the
///   2025-11-25 `input_required` flow) goes to the call waiting on that task's result on this
///   connection: a child's task lives on the connection that created it, and only its owner's
///   `tasks/result` is bound to it (a child naming another task reaches that task's owner, whom
///   it already serves, and nobody else).
/// - On a connection that belongs to one session (a `per-session` connection, or any connection
///   of a gateway whose only front is one stdio client), they go to that session's latest call
///   in flight.
/// - Otherwise (a shared stdio or legacy-SSE connection, the standalone GET stream of a shared
///   HTTP connection) nothing tells whose they are: a log is dropped
///   (`graphos_child_logs_dropped_total{reason="unassociated"}`), a request refused to the
///   child with `relay-unassociated`. Never "the one session with a call in flight": a late log
///   of a call that ended would reach whoever calls next.
#[derive(Default)]
pub struct Routes {
    inner: Mutex<RoutesInner>,
    /// Every call on this connection is one session's (a `per-session` connection).
    dedicated: bool,
    /// Signalled on every bind (a relayed request waits for its call's id to be bound).
    bound: tokio::sync::Notify,
}

#[derive(Default)]
struct RoutesInner {
    next: u64,
    calls: HashMap<u64, Arc<dyn CallObserver>>,
    tokens: HashMap<ProgressToken, u64>,
    requests: HashMap<RequestId, u64>,
    /// A child's task id → the call waiting on that task's result (`tasks/result`).
    tasks: HashMap<String, u64>,
    parked: VecDeque<ProgressNotificationParam>,
    parked_logs: VecDeque<(RequestId, LoggingMessageNotificationParam)>,
}

/// Progress notifications (and stream-associated logs) parked while their call is being bound.
const PARKED_MAX: usize = 64;

/// How long a child's request naming a call's request stream waits for that call to be bound
/// (rmcp hands back the request id only after queueing the request).
const BIND_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Set when the gateway's only front is one stdio client: every child connection then belongs
/// to that one session.
static ONE_FRONT: AtomicBool = AtomicBool::new(false);

/// Declares that this process serves exactly one front session (a stdio front with no other
/// MCP or REST listener): child traffic on any connection is then that session's.
pub fn serve_one_front() {
    ONE_FRONT.store(true, Ordering::Relaxed);
}

/// The exact evidence a child's log or request carries about the call it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// It arrived on the response stream of the request with this JSON-RPC id (streamable HTTP).
    Request(RequestId),
    /// The transport cannot tell (stdio, legacy SSE) or it arrived on no request's stream.
    None,
}

impl Origin {
    /// The origin rmcp recorded on a child's request (streamable HTTP only).
    pub fn of_request(extensions: &rmcp::model::Extensions) -> Self {
        match extensions.get::<InboundStreamOrigin>() {
            Some(InboundStreamOrigin::OutboundRequest(id)) => Origin::Request(id.clone()),
            _ => Origin::None,
        }
    }
}

/// The child task a child's request names (`_meta` [`RELATED_TASK`] `.taskId`; rmcp moves a
/// request's `_meta` into its context before the handler runs).
pub fn related_task(meta: &rmcp::model::RequestMetaObject) -> Option<String> {
    meta.get(RELATED_TASK)?
        .get("taskId")?
        .as_str()
        .map(str::to_string)
}

/// Takes [`LOG_ORIGIN_KEY`] out of a log's `_meta` (always: it never reaches a client).
fn take_log_origin(params: &mut LoggingMessageNotificationParam) -> Option<RequestId> {
    let meta = params.meta.as_mut()?;
    let id = meta.0.remove(LOG_ORIGIN_KEY);
    if meta.0.is_empty() {
        params.meta = None;
    }
    serde_json::from_value(id?).ok()
}

/// A registered call; dropping it unregisters the call.
pub struct RouteGuard {
    routes: Arc<Routes>,
    id: u64,
}

impl RouteGuard {
    /// Binds the call to the JSON-RPC id rmcp assigned to its request (the stream association
    /// of streamable HTTP), replaying any log that arrived on that stream first.
    pub fn bind_request(&self, id: RequestId) {
        {
            let Ok(mut inner) = self.routes.inner.lock() else {
                return;
            };
            inner.requests.insert(id.clone(), self.id);
            let (mine, rest): (Vec<_>, Vec<_>) =
                inner.parked_logs.drain(..).partition(|(r, _)| *r == id);
            inner.parked_logs.extend(rest);
            if let Some(o) = inner.calls.get(&self.id) {
                for (_, l) in mine {
                    o.log(l);
                }
            }
        }
        self.routes.bound.notify_waiters();
    }

    /// Binds the call to one of the child's tasks: it waits on that task's result.
    pub fn bind_task(&self, child_task: &str) {
        if let Ok(mut inner) = self.routes.inner.lock() {
            inner.tasks.insert(child_task.to_string(), self.id);
        }
        self.routes.bound.notify_waiters();
    }

    /// Binds the call to the progress token rmcp assigned to its request, replaying any
    /// progress that arrived first.
    pub fn bind(&self, token: ProgressToken) {
        // Delivery happens under the lock so replayed and live progress keep their order.
        let Ok(mut inner) = self.routes.inner.lock() else {
            return;
        };
        inner.tokens.insert(token.clone(), self.id);
        let (mine, rest): (Vec<_>, Vec<_>) = inner
            .parked
            .drain(..)
            .partition(|p| p.progress_token == token);
        inner.parked.extend(rest);
        if let Some(o) = inner.calls.get(&self.id) {
            for p in mine {
                o.progress(p);
            }
        }
    }
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.routes.inner.lock() {
            inner.calls.remove(&self.id);
            let id = self.id;
            inner.tokens.retain(|_, v| *v != id);
            inner.requests.retain(|_, v| *v != id);
            inner.tasks.retain(|_, v| *v != id);
        }
    }
}

/// Who a child's log or request belongs to (see [`Routes`]).
pub enum Target {
    /// No call is in flight (on a connection of one session), or the named call has ended.
    Nobody,
    /// The call it belongs to.
    One(Arc<dyn CallObserver>),
    /// It names a request stream whose call is not bound yet.
    Unbound(RequestId),
    /// A shared connection and no exact evidence.
    Unassociated,
}

impl Routes {
    /// The routes of a connection that belongs to one session (`per-session`).
    pub fn dedicated() -> Self {
        Routes {
            dedicated: true,
            ..Routes::default()
        }
    }

    /// Registers an observer for a call about to be sent.
    pub fn begin(self: &Arc<Self>, observer: Arc<dyn CallObserver>) -> RouteGuard {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.next += 1;
        let id = inner.next;
        inner.calls.insert(id, observer);
        RouteGuard {
            routes: self.clone(),
            id,
        }
    }

    fn progress(&self, params: ProgressNotificationParam) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        match inner
            .tokens
            .get(&params.progress_token)
            .and_then(|id| inner.calls.get(id))
        {
            Some(o) => o.progress(params),
            None => {
                if inner.parked.len() >= PARKED_MAX {
                    inner.parked.pop_front();
                }
                inner.parked.push_back(params);
            }
        }
    }

    /// The owner of a child's log or request with this evidence: the association rule (see
    /// [`Routes`]), in one place.
    /// `related`: the child task a request names in `_meta` [`RELATED_TASK`].
    pub fn target(&self, origin: &Origin, related: Option<&str>) -> Target {
        let Ok(inner) = self.inner.lock() else {
            return Target::Nobody;
        };
        Self::target_in(&inner, origin, related, self.dedicated)
    }

    fn target_in(
        inner: &RoutesInner,
        origin: &Origin,
        related: Option<&str>,
        dedicated: bool,
    ) -> Target {
        if let Origin::Request(id) = origin
            && let Some(o) = inner.requests.get(id).and_then(|c| inner.calls.get(c))
        {
            return Target::One(o.clone());
        }
        if let Some(task) = related
            && let Some(o) = inner.tasks.get(task).and_then(|c| inner.calls.get(c))
        {
            return Target::One(o.clone());
        }
        if dedicated || ONE_FRONT.load(Ordering::Relaxed) {
            // One session's connection: its latest call in flight, whatever the stream.
            return match inner.calls.iter().max_by_key(|(id, _)| **id) {
                Some((_, o)) => Target::One(o.clone()),
                None => Target::Nobody,
            };
        }
        match origin {
            // Named by stream: its call is being bound, or has ended.
            Origin::Request(_) if inner.calls.is_empty() => Target::Nobody,
            Origin::Request(id) => Target::Unbound(id.clone()),
            Origin::None => Target::Unassociated,
        }
    }

    /// [`Routes::target`] for a request, waiting (bounded) for a call its stream names to be
    /// bound; a call never bound in that time has ended for it.
    pub async fn target_waiting(&self, origin: &Origin, related: Option<&str>) -> Target {
        let deadline = tokio::time::Instant::now() + BIND_WAIT;
        loop {
            let bound = self.bound.notified();
            tokio::pin!(bound);
            bound.as_mut().enable();
            match self.target(origin, related) {
                Target::Unbound(_) => {}
                t => return t,
            }
            if tokio::time::timeout_at(deadline, bound).await.is_err() {
                return Target::Nobody;
            }
        }
    }

    /// Routes a child's log line (its origin already taken out of `_meta`).
    fn log(&self, server: &str, origin: Origin, params: LoggingMessageNotificationParam) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let dropped = |reason: &str| {
            crate::telemetry::metrics().child_log_dropped(server, reason);
            tracing::debug!(server = %server, reason, "child log message dropped: no exact association to a session");
        };
        match Self::target_in(&inner, &origin, None, self.dedicated) {
            Target::One(o) => o.log(params),
            Target::Unbound(id) => {
                if inner.parked_logs.len() >= PARKED_MAX {
                    inner.parked_logs.pop_front();
                    crate::telemetry::metrics().child_log_dropped(server, "parked-overflow");
                }
                inner.parked_logs.push_back((id, params));
            }
            Target::Nobody => dropped("no-caller"),
            Target::Unassociated => dropped("unassociated"),
        }
    }
}

/// How graph-os answers child→client requests for one child.
#[derive(Debug, Clone)]
pub struct RelayPolicy {
    /// Roots graph-os answers `roots/list` with when no client can.
    pub roots: Vec<rmcp::model::Root>,
    /// How long a relayed request may wait for the client.
    pub timeout: std::time::Duration,
}

impl Default for RelayPolicy {
    fn default() -> Self {
        RelayPolicy {
            roots: Vec::new(),
            timeout: std::time::Duration::from_secs(120),
        }
    }
}

/// rmcp client handler for one child connection.
#[derive(Clone)]
pub struct ChildClient {
    server: Arc<str>,
    routes: Arc<Routes>,
    relist: Arc<tokio::sync::Notify>,
    events: Option<Arc<dyn ChildEvents>>,
    policy: Arc<RelayPolicy>,
    /// Why this client's connection failed or closed, when its transport knows.
    fault: crate::transport::Fault,
}

impl ChildClient {
    /// The transport fault cell of this client's connections.
    pub fn fault(&self) -> &crate::transport::Fault {
        &self.fault
    }

    /// A handler for the named server.
    pub fn new(server: &str, events: Option<Arc<dyn ChildEvents>>, policy: RelayPolicy) -> Self {
        ChildClient {
            server: server.into(),
            routes: Arc::default(),
            relist: Arc::default(),
            events,
            policy: Arc::new(policy),
            fault: Default::default(),
        }
    }

    /// A handler for another connection to the same server, with its own call routes (a
    /// `per-session` connection); its list changes are not followed (the catalog comes from
    /// the primary connection).
    pub fn sibling(&self) -> Self {
        ChildClient {
            server: self.server.clone(),
            routes: Arc::new(Routes::dedicated()),
            relist: Arc::default(),
            events: self.events.clone(),
            policy: self.policy.clone(),
            fault: Default::default(),
        }
    }

    /// Resolves when the child announced that its tools, prompts or resources changed.
    pub async fn relist_requested(&self) {
        self.relist.notified().await
    }

    /// Follows a 2026-07-28 child's list changes: its `subscriptions/listen` stream (list
    /// changes are never sent outside one in that era) triggers the same relisting as a 2025
    /// child's notifications. Runs until the stream ends or `stop` is cancelled.
    pub async fn follow_list_changes(&self, peer: Peer<RoleClient>, stop: CancellationToken) {
        let filter = SubscriptionFilter::builder()
            .tools_list_changed()
            .prompts_list_changed()
            .resources_list_changed()
            .build();
        let mut subscription = tokio::select! {
            s = peer.listen(filter) => match s {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(server = %self.server, error = %e, "the child takes no subscriptions/listen: its list changes are seen at refresh");
                    return;
                }
            },
            _ = stop.cancelled() => return,
        };
        if subscription.acknowledged() == &SubscriptionFilter::new() {
            tracing::debug!(server = %self.server, "the child announces no list changes");
            return;
        }
        loop {
            tokio::select! {
                n = subscription.next() => match n {
                    Ok(Some(
                        ServerNotification::ToolListChangedNotification(_)
                        | ServerNotification::PromptListChangedNotification(_)
                        | ServerNotification::ResourceListChangedNotification(_),
                    )) => self.relist.notify_one(),
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => return,
                },
                _ = stop.cancelled() => return,
            }
        }
    }

    /// The call routes of this child.
    pub fn routes(&self) -> &Arc<Routes> {
        &self.routes
    }

    /// graph-os's own answer to `roots/list`: the roots configured for this child.
    fn own_roots(&self) -> ClientResult {
        ClientResult::ListRootsResult(ListRootsResult::new(self.policy.roots.clone()))
    }

    /// Delivers a child→client request under the association rule (see [`Routes`]): relayed to
    /// the calling session if its client declared the capability (with the relay timeout),
    /// else answered by graph-os (roots) or refused with a stable code. Runs on its own task per
    /// request (rmcp spawns request handlers), so other responses on the connection keep flowing.
    /// `related`: the child task the request names (see [`related_task`]).
    pub async fn relay(
        &self,
        request: ServerRequest,
        origin: Origin,
        related: Option<String>,
    ) -> Result<ClientResult, ErrorData> {
        let Some(kind) = RelayKind::of(&request) else {
            return Err(ErrorData::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                "graph-os does not relay this request",
                None,
            ));
        };
        let target = self
            .routes
            .target_waiting(&origin, related.as_deref())
            .await;
        self.relay_to(target, kind, request).await
    }

    /// Fulfils the input requests of a 2026-07-28 child's `input_required` result by relaying
    /// each to the calling client (the call's own observer: no association guess), under the
    /// same capability checks, refusals and timeout as a relayed request. The answers come back
    /// keyed as asked, ready for the retry's `inputResponses`.
    pub async fn fulfil(
        &self,
        caller: &Arc<dyn CallObserver>,
        requests: &rmcp::model::InputRequests,
    ) -> Result<rmcp::model::InputResponses, ErrorData> {
        let mut responses = rmcp::model::InputResponses::new();
        for (key, input) in requests {
            let request = match input.clone() {
                rmcp::model::InputRequest::Elicitation(r) => ServerRequest::ElicitRequest(r),
                rmcp::model::InputRequest::CreateMessage(r) => {
                    ServerRequest::CreateMessageRequest(r)
                }
                rmcp::model::InputRequest::ListRoots(r) => ServerRequest::ListRootsRequest(r),
                _ => {
                    return Err(ErrorData::invalid_params(
                        "the child asked for an input graph-os cannot relay",
                        None,
                    ));
                }
            };
            let defaults = match &request {
                ServerRequest::ElicitRequest(r) => Some(form_defaults(&r.params)),
                _ => None,
            };
            let kind = RelayKind::of(&request).expect("input requests are relayable kinds");
            let answer = self
                .relay_to(Target::One(caller.clone()), kind, request)
                .await?;
            let answer = match (answer, defaults) {
                (ClientResult::ElicitResult(r), Some(d)) => {
                    serde_json::to_value(with_defaults(r, d))
                }
                (ClientResult::CreateMessageResult(r), _) => serde_json::to_value(r),
                (ClientResult::ListRootsResult(r), _) => serde_json::to_value(r),
                (other, _) => serde_json::to_value(other),
            }
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
            responses.insert(key.clone(), answer);
        }
        Ok(responses)
    }

    async fn relay_to(
        &self,
        target: Target,
        kind: RelayKind,
        request: ServerRequest,
    ) -> Result<ClientResult, ErrorData> {
        let refuse = |code: &str, message: &str| {
            crate::telemetry::metrics().relay_refused(&self.server, code);
            if kind == RelayKind::Roots {
                // Answering with the configured roots never tells the child anything about a
                // client; it is graph-os speaking for itself.
                return Ok(self.own_roots());
            }
            Err(relay_refusal(code, message))
        };
        match target {
            Target::One(o) if o.caps().allows(kind) => {
                match tokio::time::timeout(self.policy.timeout, o.relay(request)).await {
                    Ok(r) => r,
                    Err(_) => {
                        crate::telemetry::metrics()
                            .relay_refused(&self.server, relay_code::TIMEOUT);
                        Err(relay_refusal(
                            relay_code::TIMEOUT,
                            "the calling client did not answer within the relay timeout",
                        ))
                    }
                }
            }
            Target::One(_) => refuse(
                relay_code::CAPABILITY_MISSING,
                "the calling client did not declare the capability this request needs",
            ),
            Target::Nobody | Target::Unbound(_) => refuse(
                relay_code::NO_CALLER,
                "no client call this request belongs to is in flight",
            ),
            Target::Unassociated => refuse(
                relay_code::UNASSOCIATED,
                "nothing associates this request with one client session on this shared connection; send it on the calling request's stream (streamable HTTP) or use sessionIsolation: per-session",
            ),
        }
    }
}

impl ClientHandler for ChildClient {
    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        match self
            .relay(
                ServerRequest::CreateMessageRequest(CreateMessageRequest::new(params)),
                Origin::of_request(&context.extensions),
                related_task(&context.meta),
            )
            .await?
        {
            ClientResult::CreateMessageResult(r) => Ok(*r),
            _ => Err(ErrorData::internal_error(
                "the client answered sampling with another result",
                None,
            )),
        }
    }

    async fn list_roots(
        &self,
        context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        match self
            .relay(
                ServerRequest::ListRootsRequest(Default::default()),
                Origin::of_request(&context.extensions),
                related_task(&context.meta),
            )
            .await?
        {
            ClientResult::ListRootsResult(r) => Ok(r),
            _ => Err(ErrorData::internal_error(
                "the client answered roots/list with another result",
                None,
            )),
        }
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let defaults = form_defaults(&params);
        match self
            .relay(
                ServerRequest::ElicitRequest(ElicitRequest::new(params)),
                Origin::of_request(&context.extensions),
                related_task(&context.meta),
            )
            .await?
        {
            ClientResult::ElicitResult(r) => Ok(with_defaults(r, defaults)),
            _ => Err(ErrorData::internal_error(
                "the client answered elicitation with another result",
                None,
            )),
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.relist.notify_one();
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.relist.notify_one();
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.relist.notify_one();
    }

    fn get_info(&self) -> ClientInfo {
        let mut info = ClientInfo::new(
            offered_capabilities(),
            Implementation::new("graph-os", env!("CARGO_PKG_VERSION")),
        );
        // `initialize` belongs to the 2025 era: offer its newest version (2026-07-28 has no
        // initialize; the conformance suite's `initialize` scenario refuses it there).
        info.protocol_version = rmcp::model::ProtocolVersion::LATEST_WITH_INITIALIZE;
        info
    }
}

/// What graph-os offers every child as a client. It relays sampling, elicitation and roots to
/// the calling client, so it offers them all (server-everything then lists its 17 tools, not
/// 13). The 2026-07-28 tasks extension is not among them: it is offered per request, only for a
/// caller that declared it (see `ChildRuntime::call_tool_offering`).
pub fn offered_capabilities() -> ClientCapabilities {
    let mut caps = ClientCapabilities::builder()
        .enable_roots()
        .enable_roots_list_changed()
        .enable_sampling()
        .enable_elicitation()
        .build();
    // Form and URL elicitation both relay unchanged.
    caps.elicitation = serde_json::from_value(serde_json::json!({"form": {}, "url": {}})).ok();
    caps
}

/// Wraps a child transport so a call's progress and log notifications are routed in the order
/// the child sent them, before the call's response is handed to rmcp.
///
/// rmcp dispatches each incoming notification on its own task, so `ClientHandler::on_progress`
/// may run after the response it preceded (and after the call's route is gone). `receive` is
/// sequential, so routing here preserves the child's order.
pub struct ObservedTransport<T> {
    inner: T,
    server: Arc<str>,
    routes: Arc<Routes>,
    events: Option<Arc<dyn ChildEvents>>,
    /// The transport marks each log with its request stream ([`crate::transport::http::mark_log_origin`]): streamable
    /// HTTP through graph-os's client. Elsewhere the key is removed and never trusted.
    marks_origin: bool,
}

impl<T> ObservedTransport<T> {
    /// Wraps `inner`, routing into `client`'s call routes.
    pub fn new(inner: T, client: &ChildClient) -> Self {
        ObservedTransport {
            inner,
            server: client.server.clone(),
            routes: client.routes.clone(),
            events: client.events.clone(),
            marks_origin: false,
        }
    }

    /// The inner transport marks logs with their request stream (streamable HTTP).
    pub fn marking_origin(mut self) -> Self {
        self.marks_origin = true;
        self
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for ObservedTransport<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let mut msg = self.inner.receive().await?;
        if let JsonRpcMessage::Notification(n) = &mut msg {
            match &mut n.notification {
                ServerNotification::ProgressNotification(p) => {
                    self.routes.progress(p.params.clone())
                }
                ServerNotification::ResourceUpdatedNotification(u) => {
                    if let Some(events) = &self.events {
                        events.resource_updated(&self.server, &u.params.uri);
                    }
                }
                ServerNotification::CustomNotification(c)
                    if c.method == crate::wire::task_marks::TASK_STATUS_NOTIFICATION =>
                {
                    if let (Some(events), Some(params)) = (&self.events, &c.params) {
                        events.task_status(&self.server, params.clone());
                    }
                }
                ServerNotification::LoggingMessageNotification(l) => {
                    let origin = take_log_origin(&mut l.params)
                        .filter(|_| self.marks_origin)
                        .map_or(Origin::None, Origin::Request);
                    self.routes.log(&self.server, origin, l.params.clone());
                }
                _ => {}
            }
        }
        Some(msg)
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// The `default` of every property of a form elicitation's requested schema.
fn form_defaults(params: &ElicitRequestParams) -> serde_json::Map<String, serde_json::Value> {
    let ElicitRequestParams::FormElicitationParams {
        requested_schema, ..
    } = params
    else {
        return serde_json::Map::new();
    };
    let schema = serde_json::to_value(requested_schema).unwrap_or_default();
    schema
        .get("properties")
        .and_then(|p| p.as_object())
        .map(|props| {
            props
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.get("default")?.clone())))
                .collect()
        })
        .unwrap_or_default()
}

/// SEP-1034: an accepted form answer gets the schema's defaults for the fields it omits (graph-os
/// is the child's client; the front client may not apply them).
fn with_defaults(
    mut result: ElicitResult,
    defaults: serde_json::Map<String, serde_json::Value>,
) -> ElicitResult {
    if result.action != rmcp::model::ElicitationAction::Accept || defaults.is_empty() {
        return result;
    }
    let content = result
        .content
        .get_or_insert_with(|| serde_json::Value::Object(Default::default()));
    if let Some(obj) = content.as_object_mut() {
        for (k, v) in defaults {
            obj.entry(k).or_insert(v);
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::http::mark_log_origin;

    #[test]
    fn an_accepted_form_answer_gets_the_defaults_of_the_fields_it_omits() {
        let params: ElicitRequestParams = serde_json::from_value(serde_json::json!({
            "mode": "form", "message": "m",
            "requestedSchema": {"type": "object", "properties": {
                "name": {"type": "string", "default": "John Doe"},
                "age": {"type": "integer", "default": 30},
                "plain": {"type": "string"}}}
        }))
        .unwrap();
        let defaults = form_defaults(&params);
        let accepted: ElicitResult = serde_json::from_value(
            serde_json::json!({"action": "accept", "content": {"name": "Ada"}}),
        )
        .unwrap();
        let got = with_defaults(accepted, defaults.clone());
        assert_eq!(
            got.content.unwrap(),
            serde_json::json!({"name": "Ada", "age": 30})
        );
        let declined: ElicitResult =
            serde_json::from_value(serde_json::json!({"action": "decline"})).unwrap();
        assert!(with_defaults(declined, defaults).content.is_none());
    }

    /// An observer that records what it got and answers relays with an empty roots list.
    struct Seen {
        session: u64,
        caps: ClientCaps,
        logs: Mutex<Vec<String>>,
        relays: Mutex<u32>,
    }

    impl Seen {
        fn new(session: u64, caps: ClientCaps) -> Arc<Self> {
            Arc::new(Seen {
                session,
                caps,
                logs: Mutex::default(),
                relays: Mutex::default(),
            })
        }
    }

    impl CallObserver for Seen {
        fn session(&self) -> u64 {
            self.session
        }
        fn caps(&self) -> ClientCaps {
            self.caps
        }
        fn progress(&self, _params: ProgressNotificationParam) {}
        fn log(&self, params: LoggingMessageNotificationParam) {
            self.logs.lock().unwrap().push(params.data.to_string());
        }
        fn relay(
            &self,
            _request: ServerRequest,
        ) -> BoxFuture<'static, Result<ClientResult, ErrorData>> {
            *self.relays.lock().unwrap() += 1;
            Box::pin(async { Ok(ClientResult::ListRootsResult(ListRootsResult::new(vec![]))) })
        }
    }

    fn elicit() -> ServerRequest {
        let params: ElicitRequestParams = serde_json::from_value(serde_json::json!({
            "mode": "form", "message": "?", "requestedSchema": {"type": "object", "properties": {}}
        }))
        .unwrap();
        ServerRequest::ElicitRequest(ElicitRequest::new(params))
    }

    fn code_of(e: &ErrorData) -> String {
        e.data.as_ref().unwrap()["code"]
            .as_str()
            .unwrap()
            .to_string()
    }

    const ALL: ClientCaps = ClientCaps {
        roots: true,
        sampling: true,
        sampling_tools: true,
        sampling_context: true,
        elicitation_form: true,
        elicitation_url: true,
        tasks: false,
    };

    fn id(n: i64) -> RequestId {
        RequestId::Number(n)
    }

    #[tokio::test]
    async fn a_request_naming_a_task_reaches_only_the_call_waiting_on_that_tasks_result() {
        let client = ChildClient::new("s", None, RelayPolicy::default());
        let (alice, bob) = (Seen::new(1, ALL), Seen::new(2, ALL));
        let waiting = client.routes().begin(alice.clone());
        waiting.bind_task("child-task-a");
        let _other = client.routes().begin(bob.clone());
        // No stream evidence (stdio), but the child names Alice's task: Alice.
        let related = Some("child-task-a".to_string());
        assert!(client.relay(elicit(), Origin::None, related).await.is_ok());
        assert_eq!(*alice.relays.lock().unwrap(), 1);
        // A task nobody waits on is no evidence: refused, never Bob.
        let e = client
            .relay(elicit(), Origin::None, Some("child-task-b".into()))
            .await
            .unwrap_err();
        assert_eq!(code_of(&e), relay_code::UNASSOCIATED);
        // Once Alice's tasks/result ended, her task no longer names anyone.
        drop(waiting);
        let e = client
            .relay(elicit(), Origin::None, Some("child-task-a".into()))
            .await
            .unwrap_err();
        assert_eq!(code_of(&e), relay_code::UNASSOCIATED);
        assert_eq!(*bob.relays.lock().unwrap(), 0);
        // The meta key as a child sends it.
        let mut meta = rmcp::model::RequestMetaObject::new();
        meta.insert(RELATED_TASK.into(), serde_json::json!({"taskId": "t-1"}));
        assert_eq!(related_task(&meta).as_deref(), Some("t-1"));
    }

    #[tokio::test]
    async fn on_a_shared_connection_a_request_reaches_only_the_call_its_stream_names() {
        let client = ChildClient::new("s", None, RelayPolicy::default());
        let a = Seen::new(1, ALL);
        let a1 = client.routes().begin(a.clone());
        a1.bind_request(id(7));
        // Named by its stream: A's call.
        assert!(
            client
                .relay(elicit(), Origin::Request(id(7)), None)
                .await
                .is_ok()
        );
        assert_eq!(*a.relays.lock().unwrap(), 1);
        // No evidence: refused, even with only A in flight (it could be a late request of a
        // call of B's that has ended).
        let e = client
            .relay(elicit(), Origin::None, None)
            .await
            .unwrap_err();
        assert_eq!(code_of(&e), relay_code::UNASSOCIATED);
        // A late request on the stream of a call that ended, with B in flight: never B.
        let b = Seen::new(2, ALL);
        let b1 = client.routes().begin(b.clone());
        b1.bind_request(id(8));
        drop(a1);
        let e = client
            .relay(elicit(), Origin::Request(id(7)), None)
            .await
            .unwrap_err();
        assert_eq!(code_of(&e), relay_code::NO_CALLER);
        assert_eq!(
            (*a.relays.lock().unwrap(), *b.relays.lock().unwrap()),
            (1, 0)
        );
        // A request that arrives before its call is bound waits for the bind.
        let c = Seen::new(3, ALL);
        let c1 = client.routes().begin(c.clone());
        let relayed = {
            let client = client.clone();
            tokio::spawn(async move { client.relay(elicit(), Origin::Request(id(9)), None).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        c1.bind_request(id(9));
        assert!(relayed.await.unwrap().is_ok());
        assert_eq!(
            (*b.relays.lock().unwrap(), *c.relays.lock().unwrap()),
            (0, 1)
        );
    }

    #[tokio::test]
    async fn a_per_session_connection_relays_to_its_session() {
        let client = ChildClient::new("s", None, RelayPolicy::default()).sibling();
        let a = Seen::new(1, ALL);
        let a1 = client.routes().begin(a.clone());
        assert!(client.relay(elicit(), Origin::None, None).await.is_ok());
        assert_eq!(*a.relays.lock().unwrap(), 1);
        drop(a1);
        let e = client
            .relay(elicit(), Origin::None, None)
            .await
            .unwrap_err();
        assert_eq!(code_of(&e), relay_code::NO_CALLER);
    }

    #[tokio::test]
    async fn without_the_capability_graph_os_answers_roots_itself_and_refuses_the_rest() {
        let mut policy = RelayPolicy::default();
        #[allow(deprecated)]
        policy
            .roots
            .push(rmcp::model::Root::new("file:///workspace"));
        let client = ChildClient::new("s", None, policy).sibling();
        let bare = Seen::new(1, ClientCaps::default());
        let _call = client.routes().begin(bare.clone());
        let roots = client
            .relay(
                ServerRequest::ListRootsRequest(Default::default()),
                Origin::None,
                None,
            )
            .await
            .unwrap();
        let ClientResult::ListRootsResult(r) = roots else {
            panic!("roots expected")
        };
        #[allow(deprecated)]
        let uris: Vec<&str> = r.roots.iter().map(|r| r.uri.as_str()).collect();
        assert_eq!(uris, ["file:///workspace"]);
        let e = client
            .relay(elicit(), Origin::None, None)
            .await
            .unwrap_err();
        assert_eq!(code_of(&e), relay_code::CAPABILITY_MISSING);
        assert_eq!(*bare.relays.lock().unwrap(), 0);
        // No call in flight at all (e.g. roots/list right after initialize).
        drop(_call);
        assert!(
            client
                .relay(
                    ServerRequest::ListRootsRequest(Default::default()),
                    Origin::None,
                    None
                )
                .await
                .is_ok()
        );
        let e = client
            .relay(elicit(), Origin::None, None)
            .await
            .unwrap_err();
        assert_eq!(code_of(&e), relay_code::NO_CALLER);
    }

    #[tokio::test]
    async fn a_client_that_never_answers_times_out_without_holding_the_call() {
        struct Silent;
        impl CallObserver for Silent {
            fn session(&self) -> u64 {
                1
            }
            fn caps(&self) -> ClientCaps {
                ALL
            }
            fn progress(&self, _p: ProgressNotificationParam) {}
            fn log(&self, _p: LoggingMessageNotificationParam) {}
            fn relay(
                &self,
                _r: ServerRequest,
            ) -> BoxFuture<'static, Result<ClientResult, ErrorData>> {
                Box::pin(std::future::pending())
            }
        }
        let client = ChildClient::new(
            "s",
            None,
            RelayPolicy {
                roots: vec![],
                timeout: std::time::Duration::from_millis(50),
            },
        )
        .sibling();
        let guard = client.routes().begin(Arc::new(Silent));
        let e = client
            .relay(elicit(), Origin::None, None)
            .await
            .unwrap_err();
        assert_eq!(code_of(&e), relay_code::TIMEOUT);
        drop(guard);
        assert!(matches!(
            client.routes().target(&Origin::None, None),
            Target::Nobody
        ));
    }

    #[test]
    fn capabilities_gate_each_kind_of_request() {
        let form_only = ClientCaps::from_declared(
            &serde_json::from_value(serde_json::json!({"elicitation": {}, "sampling": {}}))
                .unwrap(),
        );
        assert!(form_only.allows(RelayKind::Elicitation { url: false }));
        assert!(!form_only.allows(RelayKind::Elicitation { url: true }));
        assert!(form_only.allows(RelayKind::Sampling {
            tools: false,
            context: false
        }));
        assert!(!form_only.allows(RelayKind::Sampling {
            tools: true,
            context: false
        }));
        assert!(!form_only.allows(RelayKind::Roots));
        let url = ClientCaps::from_declared(
            &serde_json::from_value(serde_json::json!({"elicitation": {"url": {}}})).unwrap(),
        );
        assert!(url.allows(RelayKind::Elicitation { url: true }));
        assert!(!url.allows(RelayKind::Elicitation { url: false }));
    }

    fn log(text: &str) -> LoggingMessageNotificationParam {
        LoggingMessageNotificationParam::new(
            rmcp::model::LoggingLevel::Info,
            serde_json::json!(text),
        )
    }

    #[test]
    fn a_log_reaches_only_the_call_its_stream_names() {
        let routes = Arc::new(Routes::default());
        let a = Seen::new(1, ALL);
        let b = Seen::new(2, ALL);
        let ga = routes.begin(a.clone());
        ga.bind_request(id(1));
        // No evidence on a shared connection: dropped, even with one session in flight.
        routes.log("s", Origin::None, log("alice-unassociated"));
        routes.log("s", Origin::Request(id(1)), log("alice-1"));
        // Alice's call ends; her late line (on her stream, or on none) never reaches Bob.
        drop(ga);
        let gb = routes.begin(b.clone());
        gb.bind_request(id(2));
        routes.log("s", Origin::Request(id(1)), log("alice-late"));
        routes.log("s", Origin::None, log("alice-late-unassociated"));
        // A line that arrives before its call is bound is replayed on bind.
        let gc = routes.begin(b.clone());
        routes.log("s", Origin::Request(id(3)), log("bob-early"));
        gc.bind_request(id(3));
        routes.log("s", Origin::Request(id(2)), log("bob-2"));
        assert_eq!(*a.logs.lock().unwrap(), ["\"alice-1\""]);
        assert_eq!(*b.logs.lock().unwrap(), ["\"bob-early\"", "\"bob-2\""]);
        drop((gb, gc));
        assert!(matches!(
            routes.target(&Origin::None, None),
            Target::Unassociated
        ));
        let dedicated = Routes::dedicated();
        assert!(matches!(
            dedicated.target(&Origin::None, None),
            Target::Nobody
        ));
        let _g = Arc::new(dedicated);
    }

    #[test]
    fn the_log_origin_mark_is_set_or_removed_and_never_forwarded() {
        let line = r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x","_meta":{"io.graph-os/origin-request":99,"k":1}}}"#;
        let set: serde_json::Value =
            serde_json::from_str(&mark_log_origin(line, Some(&id(4))).unwrap()).unwrap();
        assert_eq!(set["params"]["_meta"][LOG_ORIGIN_KEY], 4);
        assert_eq!(set["params"]["_meta"]["k"], 1);
        let removed: serde_json::Value =
            serde_json::from_str(&mark_log_origin(line, None).unwrap()).unwrap();
        assert!(removed["params"]["_meta"].get(LOG_ORIGIN_KEY).is_none());
        // Other messages are left alone.
        let other = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}"#;
        assert!(mark_log_origin(other, Some(&id(4))).is_none());
        let mut params: LoggingMessageNotificationParam =
            serde_json::from_value(set["params"].clone()).unwrap();
        assert_eq!(take_log_origin(&mut params), Some(id(4)));
        assert!(
            params
                .meta
                .as_ref()
                .is_some_and(|m| !m.0.contains_key(LOG_ORIGIN_KEY))
        );
    }
}
