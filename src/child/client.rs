//! The client side of a child connection: receives the child's notifications and routes a
//! call's progress and log messages to whoever is waiting for that call.
// Logging notifications are SEP-2577-deprecated but still forwarded for 2025-era clients.
#![allow(deprecated)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use rmcp::ErrorData;
use rmcp::model::SubscriptionFilter;
use rmcp::model::{
    ClientCapabilities, ClientInfo, Implementation, ListRootsResult,
    LoggingMessageNotificationParam, ProgressNotificationParam, ProgressToken,
};
use rmcp::model::{
    ClientResult, CreateMessageRequest, CreateMessageRequestParams, CreateMessageResult,
    ElicitRequest, ElicitRequestParams, ElicitResult, JsonRpcMessage, ServerNotification,
    ServerRequest,
};
use rmcp::service::RequestContext;
use rmcp::service::{NotificationContext, RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::{ClientHandler, Peer};
use tokio_util::sync::CancellationToken;

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
    /// No front call is in flight on this connection.
    pub const NO_CALLER: &str = "relay-no-caller";
    /// Calls of several sessions are in flight on this shared connection: the caller is unknown.
    pub const AMBIGUOUS: &str = "relay-ambiguous";
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
    /// A `notifications/message` the child sent while only this session had calls in flight.
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
/// serving it are never missed) and bound to the request's progress token right after rmcp
/// assigns it. Progress that arrives in between is parked (bounded) and replayed on bind.
///
/// Association rule (tenant-exact): progress goes by token. Logs and child→client requests carry
/// no association, so they go to the one session with calls in flight on this connection; with
/// several sessions in flight they are dropped (logs) or refused (requests) and counted, never
/// delivered to a guess.
#[derive(Default)]
pub struct Routes {
    inner: Mutex<RoutesInner>,
}

#[derive(Default)]
struct RoutesInner {
    next: u64,
    calls: HashMap<u64, Arc<dyn CallObserver>>,
    tokens: HashMap<ProgressToken, u64>,
    parked: VecDeque<ProgressNotificationParam>,
}

/// Progress notifications parked while their call is being bound.
const PARKED_MAX: usize = 64;

/// A registered call; dropping it unregisters the call.
pub struct RouteGuard {
    routes: Arc<Routes>,
    id: u64,
}

impl RouteGuard {
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
        }
    }
}

/// Who a child's unassociated message (log, request) belongs to.
pub enum Target {
    /// No call is in flight.
    Nobody,
    /// Exactly one session has calls in flight: its most recent call.
    One(Arc<dyn CallObserver>),
    /// Calls of several sessions are in flight.
    Ambiguous,
}

impl Routes {
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

    /// The owner of an unassociated message (see [`Routes`]).
    pub fn target(&self) -> Target {
        let Ok(inner) = self.inner.lock() else {
            return Target::Nobody;
        };
        let mut latest: Option<(u64, &Arc<dyn CallObserver>)> = None;
        let mut session = None;
        for (id, o) in &inner.calls {
            let s = o.session();
            match session {
                None => session = Some(s),
                Some(known) if known != s => return Target::Ambiguous,
                Some(_) => {}
            }
            if latest.is_none_or(|(l, _)| *id > l) {
                latest = Some((*id, o));
            }
        }
        match latest {
            Some((_, o)) => Target::One(o.clone()),
            None => Target::Nobody,
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
            routes: Arc::default(),
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
    /// the one calling session if its client declared the capability (with the relay timeout),
    /// else answered by graph-os (roots) or refused with a stable code. Runs on its own task per
    /// request (rmcp spawns request handlers), so other responses on the connection keep flowing.
    pub async fn relay(&self, request: ServerRequest) -> Result<ClientResult, ErrorData> {
        let Some(kind) = RelayKind::of(&request) else {
            return Err(ErrorData::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                "graph-os does not relay this request",
                None,
            ));
        };
        self.relay_to(self.routes.target(), kind, request).await
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
            Target::Nobody => refuse(
                relay_code::NO_CALLER,
                "no client call is in flight on this connection",
            ),
            Target::Ambiguous => refuse(
                relay_code::AMBIGUOUS,
                "calls of several sessions are in flight on this shared connection; use sessionIsolation: per-session",
            ),
        }
    }
}

impl ClientHandler for ChildClient {
    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        match self
            .relay(ServerRequest::CreateMessageRequest(
                CreateMessageRequest::new(params),
            ))
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
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        match self
            .relay(ServerRequest::ListRootsRequest(Default::default()))
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
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let defaults = form_defaults(&params);
        match self
            .relay(ServerRequest::ElicitRequest(ElicitRequest::new(params)))
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
}

impl<T> ObservedTransport<T> {
    /// Wraps `inner`, routing into `client`'s call routes.
    pub fn new(inner: T, client: &ChildClient) -> Self {
        ObservedTransport {
            inner,
            server: client.server.clone(),
            routes: client.routes.clone(),
            events: client.events.clone(),
        }
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
        let msg = self.inner.receive().await?;
        if let JsonRpcMessage::Notification(n) = &msg {
            match &n.notification {
                ServerNotification::ProgressNotification(p) => {
                    self.routes.progress(p.params.clone())
                }
                ServerNotification::ResourceUpdatedNotification(u) => {
                    if let Some(events) = &self.events {
                        events.resource_updated(&self.server, &u.params.uri);
                    }
                }
                ServerNotification::CustomNotification(c)
                    if c.method == crate::transport::task_marks::TASK_STATUS_NOTIFICATION =>
                {
                    if let (Some(events), Some(params)) = (&self.events, &c.params) {
                        events.task_status(&self.server, params.clone());
                    }
                }
                ServerNotification::LoggingMessageNotification(l) => match self.routes.target() {
                    Target::One(o) => o.log(l.params.clone()),
                    Target::Nobody => {
                        crate::telemetry::metrics().child_log_dropped(&self.server, "no-caller");
                        tracing::debug!(server = %self.server, "child log message with no call in flight");
                    }
                    Target::Ambiguous => {
                        crate::telemetry::metrics().child_log_dropped(&self.server, "ambiguous");
                        tracing::debug!(server = %self.server, "child log message dropped: calls of several sessions in flight");
                    }
                },
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

    #[tokio::test]
    async fn a_request_reaches_the_one_session_in_flight_and_no_other() {
        let client = ChildClient::new("s", None, RelayPolicy::default());
        let a = Seen::new(1, ALL);
        let _a1 = client.routes().begin(a.clone());
        let _a2 = client.routes().begin(a.clone());
        assert!(client.relay(elicit()).await.is_ok());
        assert_eq!(*a.relays.lock().unwrap(), 1);
        // A second session in flight on the shared connection: the caller is unknown.
        let b = Seen::new(2, ALL);
        let b1 = client.routes().begin(b.clone());
        let e = client.relay(elicit()).await.unwrap_err();
        assert_eq!(code_of(&e), relay_code::AMBIGUOUS);
        assert_eq!(
            (*a.relays.lock().unwrap(), *b.relays.lock().unwrap()),
            (1, 0)
        );
        drop(b1);
        assert!(client.relay(elicit()).await.is_ok());
        assert_eq!(*a.relays.lock().unwrap(), 2);
    }

    #[tokio::test]
    async fn without_the_capability_graph_os_answers_roots_itself_and_refuses_the_rest() {
        let mut policy = RelayPolicy::default();
        #[allow(deprecated)]
        policy
            .roots
            .push(rmcp::model::Root::new("file:///workspace"));
        let client = ChildClient::new("s", None, policy);
        let bare = Seen::new(1, ClientCaps::default());
        let _call = client.routes().begin(bare.clone());
        let roots = client
            .relay(ServerRequest::ListRootsRequest(Default::default()))
            .await
            .unwrap();
        let ClientResult::ListRootsResult(r) = roots else {
            panic!("roots expected")
        };
        #[allow(deprecated)]
        let uris: Vec<&str> = r.roots.iter().map(|r| r.uri.as_str()).collect();
        assert_eq!(uris, ["file:///workspace"]);
        let e = client.relay(elicit()).await.unwrap_err();
        assert_eq!(code_of(&e), relay_code::CAPABILITY_MISSING);
        assert_eq!(*bare.relays.lock().unwrap(), 0);
        // No call in flight at all (e.g. roots/list right after initialize).
        drop(_call);
        assert!(
            client
                .relay(ServerRequest::ListRootsRequest(Default::default()))
                .await
                .is_ok()
        );
        let e = client.relay(elicit()).await.unwrap_err();
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
        );
        let guard = client.routes().begin(Arc::new(Silent));
        let e = client.relay(elicit()).await.unwrap_err();
        assert_eq!(code_of(&e), relay_code::TIMEOUT);
        drop(guard);
        assert!(matches!(client.routes().target(), Target::Nobody));
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

    #[test]
    fn logs_go_to_the_single_session_in_flight_only() {
        let routes = Arc::new(Routes::default());
        let a = Seen::new(1, ALL);
        let b = Seen::new(2, ALL);
        let ga = routes.begin(a.clone());
        assert!(matches!(routes.target(), Target::One(o) if o.session() == 1));
        let gb = routes.begin(b.clone());
        assert!(matches!(routes.target(), Target::Ambiguous));
        drop(ga);
        assert!(matches!(routes.target(), Target::One(o) if o.session() == 2));
        drop(gb);
        assert!(matches!(routes.target(), Target::Nobody));
    }
}
