//! Task requests toward a child (2025-11-25 Tasks, SEP-1686).
//!
//! A child's task lives on the connection that created it: [`TaskConn`] pins that connection,
//! and every later request of the task goes to it, or fails with
//! [`CallError::TaskEpochChanged`] once it is gone (a new connection does not know the task).
//! Each request passes the child's breaker, limiter and timeouts like a tool call; `tasks/result`
//! carries the caller's observer, so the child's requests for the client while it waits (the
//! `input_required` flow) are relayed to that caller.

use std::sync::{Arc, Weak};

use rmcp::model::{ClientRequest, CustomRequest, ServerResult};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{CallError, CallObserver, ChildRuntime, Connection, SessionTag};
use crate::transport::task_marks::TASKS_MARK;

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

    /// Sends one task request (`method` with raw `params`) to the child under its limits. With
    /// `pin` it goes to the task's own connection (re-checking that it still declares `need`);
    /// without, to the connection the caller's calls use, which must declare `need`. Returns the
    /// child's answer and the connection it came from.
    #[allow(clippy::too_many_arguments)]
    pub async fn task_request(
        &self,
        pin: Option<&TaskConn>,
        need: &[&str],
        method: &str,
        params: Value,
        observer: Option<Arc<dyn CallObserver>>,
        ct: CancellationToken,
        session: Option<&SessionTag>,
    ) -> Result<(ServerResult, TaskConn), CallError> {
        let server = self.spec.name.clone();
        let admitted = self.admit(&ct).await?;
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
        if !declared(&conn).is_some_and(|d| covers(&d, need)) {
            let need = need.join(".");
            return refuse(admitted, CallError::TaskUnsupported { server, need });
        }
        let route = observer.map(|o| conn.routes.begin(o));
        let request =
            ClientRequest::CustomRequest(CustomRequest::new(method.to_string(), Some(params)));
        let outcome = self.exchange(&conn, request, &ct).await;
        drop(route);
        self.settle(admitted, &outcome);
        outcome.map(|r| {
            (
                r,
                TaskConn {
                    conn: Arc::downgrade(&conn),
                    generation,
                },
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::covers;
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
}
