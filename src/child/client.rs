//! The client side of a child connection: receives the child's notifications and routes a
//! call's progress and log messages to whoever is waiting for that call.
// Logging notifications are SEP-2577-deprecated but still forwarded for 2025-era clients.
#![allow(deprecated)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use rmcp::ClientHandler;
use rmcp::model::{
    ClientCapabilities, ClientInfo, Implementation, LoggingMessageNotificationParam, NumberOrString,
    ProgressNotificationParam, ProgressToken,
};
use rmcp::service::{NotificationContext, RoleClient};

/// Receives the notifications that belong to one forwarded call.
pub trait CallObserver: Send + Sync {
    /// A `notifications/progress` for the call (token already rewritten to the caller's).
    fn progress(&self, params: ProgressNotificationParam);
    /// A `notifications/message` the child sent while the call was in flight.
    fn log(&self, params: LoggingMessageNotificationParam);
}

/// Routes notifications of in-flight calls by the progress token graph-os assigned.
#[derive(Default)]
pub struct Routes {
    next: AtomicI64,
    active: Mutex<HashMap<i64, Arc<dyn CallObserver>>>,
}

/// A registered route; dropping it unregisters the call.
pub struct RouteGuard {
    routes: Arc<Routes>,
    id: i64,
}

impl RouteGuard {
    /// The progress token sent to the child for this call.
    pub fn token(&self) -> ProgressToken {
        ProgressToken(NumberOrString::String(format!("graph-os-{}", self.id).into()))
    }
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        if let Ok(mut m) = self.routes.active.lock() {
            m.remove(&self.id);
        }
    }
}

impl Routes {
    /// Registers an observer for one call.
    pub fn register(self: &Arc<Self>, observer: Arc<dyn CallObserver>) -> RouteGuard {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut m) = self.active.lock() {
            m.insert(id, observer);
        }
        RouteGuard { routes: self.clone(), id }
    }

    fn by_token(&self, token: &ProgressToken) -> Option<Arc<dyn CallObserver>> {
        let NumberOrString::String(s) = &token.0 else { return None };
        let id: i64 = s.strip_prefix("graph-os-")?.parse().ok()?;
        self.active.lock().ok()?.get(&id).cloned()
    }

    fn all(&self) -> Vec<Arc<dyn CallObserver>> {
        self.active.lock().map(|m| m.values().cloned().collect()).unwrap_or_default()
    }
}

/// rmcp client handler for one child connection.
#[derive(Clone)]
pub struct ChildClient {
    server: Arc<str>,
    routes: Arc<Routes>,
}

impl ChildClient {
    /// A handler for the named server.
    pub fn new(server: &str) -> Self {
        ChildClient { server: server.into(), routes: Arc::default() }
    }

    /// The call routes of this child.
    pub fn routes(&self) -> &Arc<Routes> {
        &self.routes
    }
}

impl ClientHandler for ChildClient {
    fn get_info(&self) -> ClientInfo {
        ClientInfo::new(
            ClientCapabilities::default(),
            Implementation::new("graph-os", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        if let Some(observer) = self.routes.by_token(&params.progress_token) {
            observer.progress(params);
        }
    }

    async fn on_logging_message(&self, params: LoggingMessageNotificationParam, _context: NotificationContext<RoleClient>) {
        let observers = self.routes.all();
        if observers.is_empty() {
            tracing::debug!(server = %self.server, level = ?params.level, "child log message with no call in flight");
        }
        for o in observers {
            o.log(params.clone());
        }
    }
}
