//! Sessions: one per 2025-era client session or 2026-era principal — its loaded set, what it
//! was last shown (the visible digest), how it is notified — and the registry that owns them
//! and their resource subscriptions ([`Sessions`]). A session is notified only when what it
//! sees changed.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use futures::future::BoxFuture;
use serde::Serialize;

use super::session_store;
use super::{CatalogView, Multiplexer, ToolEntry};

/// Outcome of a list_changed delivery attempt (never a delivery receipt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NotifyOutcome {
    /// Written to at least one open stream of the session.
    Sent,
    /// The session has no open stream to write to.
    NoStream,
    /// Writing failed (stream closed).
    Failed,
}

/// How a front session is told that its tool list changed.
pub trait SessionNotifier: Send + Sync {
    /// Sends `notifications/tools/list_changed` on the session's open streams.
    fn tools_changed(&self) -> BoxFuture<'static, NotifyOutcome>;
    /// Sends `notifications/resources/updated` for a resource the session subscribed to.
    fn resource_updated(&self, uri: String) -> BoxFuture<'static, NotifyOutcome>;
    /// Sends a 2025 `notifications/tasks/status` of one of the session's tasks.
    fn task_status(&self, _params: serde_json::Value) -> BoxFuture<'static, NotifyOutcome> {
        Box::pin(async { NotifyOutcome::NoStream })
    }
}

/// One client session (2025 era) or principal (2026 era).
pub struct Session {
    pub(super) id: u64,
    /// Dropped with the session: `per-session` child connections follow it.
    pub(super) alive: Arc<()>,
    pub(super) loaded: Mutex<BTreeSet<String>>,
    pub(super) visible_digest: Mutex<String>,
    pub(super) notifier: Arc<dyn SessionNotifier>,
    /// A list_changed that could not be written yet; sent on the session's next request.
    pub(super) pending: std::sync::atomic::AtomicBool,
    /// Lowest child log level delivered (`logging/setLevel`), as [`level_rank`].
    pub(super) log_level: std::sync::atomic::AtomicU8,
    /// Where the loaded set is kept (HTTP sessions and principals); `None`: this process only
    /// (stdio).
    pub(super) binding: Option<session_store::StoreBinding>,
}

/// The order of MCP logging levels (debug lowest).
#[allow(deprecated)]
pub fn level_rank(level: rmcp::model::LoggingLevel) -> u8 {
    use rmcp::model::LoggingLevel::*;
    match level {
        Debug => 0,
        Info => 1,
        Notice => 2,
        Warning => 3,
        Error => 4,
        Critical => 5,
        Alert => 6,
        Emergency => 7,
    }
}

impl Session {
    /// Session number (process-unique).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Exposed names this session loaded.
    pub fn loaded(&self) -> BTreeSet<String> {
        self.loaded.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Replaces the loaded set with the store's copy (read at the start of each request, so a
    /// change made through another replica is seen).
    pub fn set_loaded(&self, loaded: BTreeSet<String>) {
        if let Ok(mut l) = self.loaded.lock() {
            *l = loaded;
        }
    }

    /// A list change is waiting for this session (the store said so): sent on its next request.
    pub fn mark_pending(&self) {
        self.pending.store(true, Ordering::SeqCst);
    }

    /// Where this session's state is stored, if anywhere but this process.
    pub fn binding(&self) -> Option<&session_store::StoreBinding> {
        self.binding.as_ref()
    }

    /// Sets the lowest child log level this session receives.
    #[allow(deprecated)]
    pub fn set_log_level(&self, level: rmcp::model::LoggingLevel) {
        self.log_level.store(level_rank(level), Ordering::Relaxed);
    }

    /// The lowest child log level this session receives (debug until set).
    #[allow(deprecated)]
    pub fn log_level(&self) -> rmcp::model::LoggingLevel {
        use rmcp::model::LoggingLevel::*;
        [
            Debug, Info, Notice, Warning, Error, Critical, Alert, Emergency,
        ][self.log_level.load(Ordering::Relaxed).min(7) as usize]
    }

    /// This session at the child boundary, for calls of `principal` (see [`Caller::tag`]).
    pub fn tag(&self, principal: &str) -> crate::child::SessionTag {
        crate::child::SessionTag {
            id: self.id,
            alive: Arc::downgrade(&self.alive),
            principal: Arc::from(principal),
        }
    }
}

/// The sessions open in this process and their resource subscriptions. Owns its state: the
/// multiplexer reaches it only through these methods.
pub(super) struct Sessions {
    open: Mutex<Vec<Weak<Session>>>,
    next: AtomicU64,
    subscriptions: Mutex<HashMap<String, Vec<Weak<Session>>>>,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions {
            open: Mutex::new(Vec::new()),
            next: AtomicU64::new(1),
            subscriptions: Mutex::new(HashMap::new()),
        }
    }
}

impl Sessions {
    /// A process-unique session number.
    fn next_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Holds `session` (weakly: a session lives as long as its front holds it).
    fn add(&self, session: &Arc<Session>) {
        if let Ok(mut s) = self.open.lock() {
            s.retain(|w| w.strong_count() > 0);
            s.push(Arc::downgrade(session));
        }
    }

    /// The sessions still alive.
    pub(super) fn live(&self) -> Vec<Arc<Session>> {
        self.open
            .lock()
            .map(|s| s.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default()
    }

    /// How many sessions are alive.
    fn live_count(&self) -> usize {
        self.open
            .lock()
            .map(|s| s.iter().filter(|w| w.strong_count() > 0).count())
            .unwrap_or_default()
    }

    /// `session` follows `uri` (once, however often it subscribes).
    fn subscribe(&self, session: &Arc<Session>, uri: &str) {
        if let Ok(mut subs) = self.subscriptions.lock() {
            let list = subs.entry(uri.to_string()).or_default();
            list.retain(|w| {
                w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(session))
            });
            list.push(Arc::downgrade(session));
        }
    }

    /// `session` stops following `uri`; whether another live session still follows it.
    fn unsubscribe(&self, session: &Arc<Session>, uri: &str) -> bool {
        if let Ok(mut subs) = self.subscriptions.lock()
            && let Some(list) = subs.get_mut(uri)
        {
            list.retain(|w| {
                w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(session))
            });
            if list.is_empty() {
                subs.remove(uri);
                return false;
            }
            return true;
        }
        false
    }

    /// The live sessions following `uri`.
    pub(super) fn subscribers(&self, uri: &str) -> Vec<Arc<Session>> {
        self.subscriptions
            .lock()
            .map(|s| {
                s.get(uri)
                    .map(|v| v.iter().filter_map(Weak::upgrade).collect())
                    .unwrap_or_default()
            })
            .unwrap_or_default()
    }
}

impl Multiplexer {
    /// Records that `session` subscribed to `uri` (updates from the owning child reach it).
    pub(super) fn record_subscription(&self, session: &Arc<Session>, uri: &str) {
        self.sessions.subscribe(session, uri);
    }

    /// Removes `session`'s subscription to `uri`; whether another live session still follows it.
    pub(super) fn forget_subscription(&self, session: &Arc<Session>, uri: &str) -> bool {
        self.sessions.unsubscribe(session, uri)
    }

    /// Sessions and principals currently held (loaded sets in memory).
    pub fn live_session_count(&self) -> usize {
        self.sessions.live_count()
    }

    pub(super) fn live_sessions(&self) -> Vec<Arc<Session>> {
        self.sessions.live()
    }

    /// Registers a new session.
    pub fn open_session(&self, notifier: Arc<dyn SessionNotifier>) -> Arc<Session> {
        self.register_session(notifier, None, BTreeSet::new())
    }

    /// Registers a session whose state lives in a [`session_store::SessionStore`]: its loaded
    /// set starts as `loaded`, changes are written there first, and notifications travel
    /// through it to whichever replica holds the session's stream.
    pub fn open_stored_session(
        &self,
        binding: session_store::StoreBinding,
        loaded: BTreeSet<String>,
    ) -> Arc<Session> {
        let notifier = Arc::new(session_store::StoreNotifier(binding.clone()));
        self.register_session(notifier, Some(binding), loaded)
    }

    pub(super) fn register_session(
        &self,
        notifier: Arc<dyn SessionNotifier>,
        binding: Option<session_store::StoreBinding>,
        loaded: BTreeSet<String>,
    ) -> Arc<Session> {
        let session = Arc::new(Session {
            id: self.sessions.next_id(),
            alive: Arc::new(()),
            loaded: Mutex::new(loaded),
            visible_digest: Mutex::new(String::new()),
            notifier,
            pending: std::sync::atomic::AtomicBool::new(false),
            log_level: std::sync::atomic::AtomicU8::new(0),
            binding,
        });
        let digest = self.visible_digest(&session, &self.view());
        if let Ok(mut d) = session.visible_digest.lock() {
            *d = digest;
        }
        self.sessions.add(&session);
        session
    }

    /// Adopts the loaded set read from the session's store at the start of a request. The
    /// session is not notified: whoever changed the set did that.
    pub fn adopt_loaded(&self, session: &Session, loaded: BTreeSet<String>) {
        if session.loaded() == loaded {
            return;
        }
        session.set_loaded(loaded);
        let digest = self.visible_digest(session, &self.view());
        if let Ok(mut d) = session.visible_digest.lock() {
            *d = digest;
        }
    }

    /// Tools visible to a session: eager ones plus its loaded ones, sorted by name.
    pub fn visible_tools(&self, session: &Session) -> Vec<ToolEntry> {
        let view = self.view();
        let loaded = session.loaded();
        view.tools
            .values()
            .filter(|t| t.eager || loaded.contains(&t.name))
            .cloned()
            .collect()
    }

    pub(super) fn visible_digest(&self, session: &Session, view: &CatalogView) -> String {
        let loaded = session.loaded();
        let items: Vec<serde_json::Value> = view
            .tools
            .values()
            .filter(|t| t.eager || loaded.contains(&t.name))
            .map(|t| serde_json::to_value(&t.tool).unwrap_or_default())
            .collect();
        crate::digest::sha256_hex(
            crate::digest::canonical_json(&serde_json::Value::Array(items)).as_bytes(),
        )
    }

    /// Recomputes a session's visible digest; when it changed, notifies the session.
    pub async fn refresh_session(&self, session: &Session) -> Option<NotifyOutcome> {
        let digest = self.visible_digest(session, &self.view());
        let changed = match session.visible_digest.lock() {
            Ok(mut d) if *d != digest => {
                *d = digest;
                true
            }
            _ => false,
        };
        if !changed {
            return None;
        }
        let outcome = session.notifier.tools_changed().await;
        // A stored session's store keeps the pending flag for whichever replica serves the next
        // request; only an unreachable store leaves it to this replica.
        let keep_here = session.binding.is_none() || outcome == NotifyOutcome::Failed;
        if outcome != NotifyOutcome::Sent && keep_here {
            session.pending.store(true, Ordering::SeqCst);
        }
        Some(outcome)
    }

    /// Sends a list_changed that could not be written earlier (call at the start of a request).
    pub async fn deliver_pending(&self, session: &Session) {
        if session.pending.swap(false, Ordering::SeqCst) {
            let outcome = session.notifier.tools_changed().await;
            let keep_here = session.binding.is_none() || outcome == NotifyOutcome::Failed;
            if outcome != NotifyOutcome::Sent && keep_here {
                session.pending.store(true, Ordering::SeqCst);
            }
        }
    }
}
