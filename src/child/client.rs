//! The client side of a child connection: receives the child's notifications and routes a
//! call's progress and log messages to whoever is waiting for that call.
// Logging notifications are SEP-2577-deprecated but still forwarded for 2025-era clients.
#![allow(deprecated)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use rmcp::ClientHandler;
use rmcp::ErrorData;
use rmcp::model::{
    ClientCapabilities, ClientInfo, Implementation, LoggingMessageNotificationParam,
    ProgressNotificationParam, ProgressToken,
};
use rmcp::model::{
    ClientResult, CreateMessageRequest, CreateMessageRequestParams, CreateMessageResult,
    ElicitRequest, ElicitRequestParams, ElicitResult, JsonRpcMessage, ListRootsResult,
    ServerNotification, ServerRequest,
};
use rmcp::service::RequestContext;
use rmcp::service::{NotificationContext, RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;

/// Receives the notifications that belong to one forwarded call.
pub trait CallObserver: Send + Sync {
    /// A `notifications/progress` for the call (token already rewritten to the caller's).
    fn progress(&self, params: ProgressNotificationParam);
    /// A `notifications/message` the child sent while the call was in flight.
    fn log(&self, params: LoggingMessageNotificationParam);
    /// Relays a request the child sent while serving the call (sampling, elicitation, roots) to
    /// the client that made the call, and returns its answer.
    fn relay(&self, request: ServerRequest) -> BoxFuture<'static, Result<ClientResult, ErrorData>>;
}

/// Events of a child connection that are not tied to one call, delivered to the multiplexer.
pub trait ChildEvents: Send + Sync {
    /// The child sent `notifications/resources/updated` for `uri`.
    fn resource_updated(&self, server: &str, uri: &str);
}

/// Routes notifications of in-flight calls to their observers.
///
/// A call is registered before its request is sent (so log messages the child emits while
/// serving it are never missed) and bound to the request's progress token right after rmcp
/// assigns it. Progress that arrives in between is parked (bounded) and replayed on bind.
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

    /// The most recently started call still in flight.
    fn latest(&self) -> Option<Arc<dyn CallObserver>> {
        let inner = self.inner.lock().ok()?;
        inner
            .calls
            .iter()
            .max_by_key(|(id, _)| **id)
            .map(|(_, o)| o.clone())
    }

    fn all(&self) -> Vec<Arc<dyn CallObserver>> {
        self.inner
            .lock()
            .map(|m| m.calls.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// rmcp client handler for one child connection.
#[derive(Clone)]
pub struct ChildClient {
    server: Arc<str>,
    routes: Arc<Routes>,
    relist: Arc<tokio::sync::Notify>,
    events: Option<Arc<dyn ChildEvents>>,
}

impl ChildClient {
    /// A handler for the named server.
    pub fn new(server: &str, events: Option<Arc<dyn ChildEvents>>) -> Self {
        ChildClient {
            server: server.into(),
            routes: Arc::default(),
            relist: Arc::default(),
            events,
        }
    }

    /// Resolves when the child announced that its tools, prompts or resources changed.
    pub async fn relist_requested(&self) {
        self.relist.notified().await
    }

    /// The call routes of this child.
    pub fn routes(&self) -> &Arc<Routes> {
        &self.routes
    }
}

impl ChildClient {
    /// Relays a child→client request to the client of the most recent call in flight on this
    /// child (stdio and shared connections carry no finer association).
    async fn relay(&self, request: ServerRequest) -> Result<ClientResult, ErrorData> {
        match self.routes.latest() {
            Some(observer) => observer.relay(request).await,
            None => Err(ErrorData::invalid_request(
                "graph-os has no client call in flight on this server to relay the request to",
                None,
            )),
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
        match self
            .relay(ServerRequest::ElicitRequest(ElicitRequest::new(params)))
            .await?
        {
            ClientResult::ElicitResult(r) => Ok(r),
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
        // graph-os relays sampling, elicitation and roots to the calling client, so it offers
        // them to every child (server-everything then lists its 17 tools, not 13).
        let mut caps = ClientCapabilities::builder()
            .enable_roots()
            .enable_roots_list_changed()
            .enable_sampling()
            .enable_elicitation()
            .build();
        // Form and URL elicitation both relay unchanged.
        caps.elicitation = serde_json::from_value(serde_json::json!({"form": {}, "url": {}})).ok();
        ClientInfo::new(
            caps,
            Implementation::new("graph-os", env!("CARGO_PKG_VERSION")),
        )
    }
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
                ServerNotification::LoggingMessageNotification(l) => {
                    let observers = self.routes.all();
                    if observers.is_empty() {
                        tracing::debug!(server = %self.server, "child log message with no call in flight");
                    }
                    for o in observers {
                        o.log(l.params.clone());
                    }
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
