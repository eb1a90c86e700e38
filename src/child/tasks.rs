//! Task requests toward a child (2025-11-25 Tasks, SEP-1686, and the 2026-07-28
//! `io.modelcontextprotocol/tasks` extension, SEP-2663).
//!
//! A child's task lives on the connection that created it: [`TaskConn`] pins that connection,
//! and every later request of the task goes to it, or fails with
//! [`CallError::TaskEpochChanged`] once it is gone (a new connection does not know the task).
//! Each request passes the child's breaker, limiter and timeouts like a tool call; `tasks/result`
//! carries the caller's observer, so the child's requests for the client while it waits (the
//! `input_required` flow) are relayed to that caller.
//!
//! A 2026-07-28 child is offered the extension per request, in the request's
//! `clientCapabilities` (the only place that era declares client capabilities), and only for a
//! caller that declared it: a child never answers a task to a caller that cannot follow it.

use std::sync::{Arc, Weak};

use rmcp::model::{
    ClientRequest, ExtensionCapabilities, RequestMetaObject, ServerResult, TASKS_EXTENSION_ID,
};
use rmcp::service::PeerRequestOptions;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::client::offered_capabilities;
use super::{CallError, CallObserver, ChildRuntime, Connection, SessionTag};
use crate::wire::task_marks::TASKS_MARK;

/// The child connection a task was created on.
#[derive(Clone)]
pub struct TaskConn {
    conn: Weak<Connection>,
    /// The child's connection generation at creation (shown in status, compared on use).
    pub generation: u64,
}

impl std::fmt::Debug for TaskConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskConn")
            .field("generation", &self.generation)
            .field("live", &self.live().is_some())
            .finish()
    }
}

impl TaskConn {
    /// A pin to `conn`, opened at connection `generation`.
    pub(super) fn new(conn: &Arc<Connection>, generation: u64) -> Self {
        TaskConn {
            conn: Arc::downgrade(conn),
            generation,
        }
    }

    /// A pin to no connection (its tasks fail with `task-epoch-changed`): for tests.
    #[cfg(test)]
    pub(crate) fn gone(generation: u64) -> Self {
        TaskConn {
            conn: Weak::new(),
            generation,
        }
    }

    fn live(&self) -> Option<Arc<Connection>> {
        self.conn
            .upgrade()
            .filter(|c| !c.peer.is_transport_closed())
    }
}

/// What a child connection declared of 2025 tasks (`capabilities.tasks`).
fn declared(conn: &Connection) -> Option<Value> {
    conn.peer
        .peer_info()?
        .capabilities
        .experimental
        .as_ref()?
        .get(TASKS_MARK)
        .map(|o| Value::Object(o.clone()))
}

/// Whether a child connection declared the 2026-07-28 tasks extension.
pub(super) fn extension_declared(conn: &Connection) -> bool {
    conn.peer
        .peer_info()
        .is_some_and(|i| i.capabilities.supports_tasks())
}

/// Request options offering a 2026-07-28 child the tasks extension: what graph-os always
/// offers, plus the extension, as the request's `clientCapabilities` (they replace rmcp's
/// connection-wide ones for this request only).
pub(super) fn offering_tasks() -> PeerRequestOptions {
    let mut caps = offered_capabilities();
    caps.extensions
        .get_or_insert_with(ExtensionCapabilities::new)
        .insert(TASKS_EXTENSION_ID.to_string(), Default::default());
    let mut meta = RequestMetaObject::new();
    meta.set_client_capabilities(caps);
    PeerRequestOptions::no_options().with_meta(meta)
}

/// What a task request needs a child connection to have declared.
#[derive(Clone, Copy, Debug)]
pub enum TaskNeed<'a> {
    /// A path in the 2025-11-25 `capabilities.tasks` (e.g. `["requests","tools","call"]`).
    Legacy(&'a [&'a str]),
    /// The 2026-07-28 tasks extension.
    Extension,
}

impl TaskNeed<'_> {
    fn met_by(&self, conn: &Connection) -> bool {
        match self {
            TaskNeed::Legacy(path) => declared(conn).is_some_and(|d| covers(&d, path)),
            TaskNeed::Extension => extension_declared(conn),
        }
    }

    /// The need as named in a `task-unsupported` error.
    pub fn name(&self) -> String {
        match self {
            TaskNeed::Legacy(path) => path.join("."),
            TaskNeed::Extension => TASKS_EXTENSION_ID.to_string(),
        }
    }
}

/// Whether a declared `capabilities.tasks` covers `path` (e.g. `["requests","tools","call"]`).
pub fn covers(declared: &Value, path: &[&str]) -> bool {
    let mut at = declared;
    for key in path {
        match at.get(key) {
            Some(v) => at = v,
            None => return false,
        }
    }
    at.is_object()
}

impl ChildRuntime {
    /// The child's declared 2025 `capabilities.tasks`, from a live connection.
    pub async fn tasks_capability(&self) -> Option<Value> {
        let conn = self.pick().await?;
        declared(&conn)
    }

    /// Sends one task request to the child under its limits. With `pin` it goes to the task's
    /// own connection (re-checking that it still declares `need`); without, to the connection
    /// the caller's calls use, which must declare `need`. Returns the child's answer and the
    /// connection it came from. `task`: the child's task the request waits on, so the child's
    /// requests naming it reach `observer` (see [`super::client::Routes`]).
    #[allow(clippy::too_many_arguments)]
    pub async fn task_request(
        &self,
        pin: Option<&TaskConn>,
        need: TaskNeed<'_>,
        request: ClientRequest,
        task: Option<&str>,
        observer: Option<Arc<dyn CallObserver>>,
        ct: CancellationToken,
        session: Option<&SessionTag>,
    ) -> Result<(ServerResult, TaskConn), CallError> {
        let server = self.spec.name.clone();
        let admitted = self.admit(&ct, session).await?;
        // A refusal after admission still settles the breaker ticket and frees the slot.
        let refuse = |admitted, e: CallError| {
            self.settle(admitted, &Err::<(), _>(e.clone()));
            Err(e)
        };
        let (conn, generation) = match pin {
            Some(pin) => match pin.live() {
                Some(c) => (c, pin.generation),
                None => return refuse(admitted, CallError::TaskEpochChanged { server }),
            },
            None => {
                let generation = admitted.generation;
                match self.lease(session).await {
                    Ok(l) => (l.conn.clone(), generation),
                    Err(e) => return refuse(admitted, e),
                }
            }
        };
        if !need.met_by(&conn) {
            let need = need.name();
            return refuse(admitted, CallError::TaskUnsupported { server, need });
        }
        let options = match need {
            TaskNeed::Extension => offering_tasks(),
            TaskNeed::Legacy(_) => PeerRequestOptions::no_options(),
        };
        let route = observer.map(|o| conn.routes.begin(o));
        if let (Some(route), Some(task)) = (&route, task) {
            route.bind_task(task);
        }
        let outcome = self
            .exchange(&conn, request, options, &ct, route.as_ref())
            .await;
        drop(route);
        self.settle(admitted, &outcome);
        outcome.map(|r| (r, TaskConn::new(&conn, generation)))
    }
}

#[cfg(test)]
mod tests {
    use super::{TaskNeed, covers, offering_tasks};
    use rmcp::model::TASKS_EXTENSION_ID;
    use serde_json::json;

    #[test]
    fn a_declared_capability_covers_only_what_it_names() {
        let d = json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}});
        assert!(covers(&d, &["requests", "tools", "call"]));
        assert!(covers(&d, &["cancel"]));
        assert!(covers(&d, &[]));
        assert!(!covers(&d, &["requests", "sampling", "createMessage"]));
        assert!(!covers(&json!({"list": true}), &["list"]));
    }

    #[test]
    fn offering_tasks_declares_the_extension_beside_what_graph_os_always_offers() {
        let options = offering_tasks();
        let caps = options
            .meta
            .expect("meta")
            .client_capabilities()
            .expect("clientCapabilities");
        assert!(caps.supports_tasks());
        assert!(caps.sampling.is_some() && caps.elicitation.is_some() && caps.roots.is_some());
        // Connection-wide, the extension is never offered.
        assert!(!super::offered_capabilities().supports_tasks());
    }

    #[test]
    fn a_task_need_is_named_as_the_child_would_declare_it() {
        assert_eq!(
            TaskNeed::Legacy(&["requests", "tools", "call"]).name(),
            "requests.tools.call"
        );
        assert_eq!(TaskNeed::Extension.name(), TASKS_EXTENSION_ID);
    }
}
