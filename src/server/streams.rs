//! Notification streams of front sessions, and the 2026-era principals table.
//!
//! A 2025-era session has one peer (its GET stream, or stdio); a 2026-era principal has any
//! number of `subscriptions/listen` sinks. [`FrontStreams`] implements the multiplexer's
//! [`SessionNotifier`] over both. HTTP sessions keep their state in the [`SessionStore`] and are
//! notified through it: the [`StreamRegistry`] delivers the store's notices to the streams this
//! replica holds, whichever replica made the change.

use std::collections::{BTreeSet, HashMap};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::mux::session_store::{Notice, SessionKey, SessionStore, StoreBinding};

use futures::future::BoxFuture;
use rmcp::Peer;
use rmcp::service::{RoleServer, SubscriptionSink};

use crate::mux::{Multiplexer, NotifyOutcome, Session, SessionNotifier};

/// The session's notification streams.
#[derive(Default)]
pub struct FrontStreams {
    pub(super) legacy: OnceLock<Peer<RoleServer>>,
    pub(super) subscriptions: Mutex<Vec<SubscriptionSink>>,
}

impl FrontStreams {
    fn sinks(&self) -> Vec<SubscriptionSink> {
        self.subscriptions
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }
}

impl SessionNotifier for FrontStreams {
    fn task_status(&self, params: serde_json::Value) -> BoxFuture<'static, NotifyOutcome> {
        // 2025-era tasks: the session's own connection (stdio, or its GET stream over HTTP).
        let legacy = self.legacy.get().cloned();
        Box::pin(async move {
            let Some(peer) = legacy.filter(|p| !p.is_transport_closed()) else {
                return NotifyOutcome::NoStream;
            };
            let note = rmcp::model::ServerNotification::CustomNotification(
                rmcp::model::CustomNotification::new(
                    crate::wire::task_marks::TASK_STATUS_NOTIFICATION,
                    Some(params),
                ),
            );
            match peer.send_notification(note).await {
                Ok(()) => NotifyOutcome::Sent,
                Err(_) => NotifyOutcome::Failed,
            }
        })
    }

    fn resource_updated(&self, uri: String) -> BoxFuture<'static, NotifyOutcome> {
        let legacy = self.legacy.get().cloned();
        let subs = self.sinks();
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
        let subs = self.sinks();
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
    /// The multiplexer's session.
    pub session: Arc<Session>,
    /// Its streams.
    pub streams: Arc<FrontStreams>,
}

impl FrontSession {
    /// Registers a new session with the multiplexer.
    pub fn open(mux: &Multiplexer) -> Self {
        let streams = Arc::new(FrontStreams::default());
        FrontSession {
            session: mux.open_session(streams.clone()),
            streams,
        }
    }

    /// Registers a session whose state lives in the HTTP front's store under `key`, starting
    /// from the loaded set read there.
    pub fn open_stored(
        mux: &Multiplexer,
        front: &HttpFront,
        key: SessionKey,
        loaded: BTreeSet<String>,
    ) -> Self {
        let streams = Arc::new(FrontStreams::default());
        front.registry.register(&key, &streams);
        let binding = StoreBinding {
            store: front.store.clone(),
            key,
        };
        FrontSession {
            session: mux.open_stored_session(binding, loaded),
            streams,
        }
    }
}

/// The streams of stored sessions on this replica, by key.
#[derive(Default)]
pub struct StreamRegistry {
    map: Mutex<HashMap<SessionKey, Weak<FrontStreams>>>,
}

impl StreamRegistry {
    /// Registers the streams of `key` (a later registration replaces an earlier one).
    pub fn register(&self, key: &SessionKey, streams: &Arc<FrontStreams>) {
        if let Ok(mut m) = self.map.lock() {
            m.retain(|_, w| w.strong_count() > 0);
            m.insert(key.clone(), Arc::downgrade(streams));
        }
    }

    fn get(&self, key: &SessionKey) -> Option<Arc<FrontStreams>> {
        self.map.lock().ok()?.get(key).and_then(Weak::upgrade)
    }

    /// Delivers the store's notices to the streams held here, until the store is dropped.
    pub fn deliver(self: &Arc<Self>, store: &Arc<dyn SessionStore>) {
        let mut notices = store.notices();
        let registry = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let (key, notice) = match notices.recv().await {
                    Ok(n) => n,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "session notices dropped: delivery fell behind");
                        continue;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                };
                let Some(registry) = registry.upgrade() else {
                    return;
                };
                let Some(streams) = registry.get(&key) else {
                    continue;
                };
                match notice {
                    Notice::ToolsChanged => streams.tools_changed().await,
                    Notice::ResourceUpdated(uri) => streams.resource_updated(uri).await,
                    Notice::TaskStatus(params) => streams.task_status(params).await,
                };
            }
        });
    }
}

/// The HTTP front's shared state: principals, the session store and this replica's streams.
pub struct HttpFront {
    /// 2026-era principals held here.
    pub principals: Principals,
    /// Where session and principal state lives.
    pub store: Arc<dyn SessionStore>,
    /// Streams held here, for the store's notices.
    pub registry: Arc<StreamRegistry>,
    /// 2025-era sessions whose handler runs here, by session id (the forwarding hot path
    /// serves their calls beside rmcp: see `fast`).
    legacy: Mutex<HashMap<String, LegacyEntry>>,
}

/// A 2025-era session held here: weak, so an ended session is simply gone.
struct LegacyEntry {
    session: Weak<Session>,
    streams: Weak<FrontStreams>,
    hot: Arc<HotState>,
}

/// What the hot path keeps per 2025-era session.
#[derive(Default)]
pub struct HotState {
    /// When the hot path last reset rmcp's idle timer of the session (ms since the epoch).
    pub touched: std::sync::atomic::AtomicU64,
    /// Hot-path calls in flight, by canonical request id (for `notifications/cancelled`).
    pub inflight: Mutex<HashMap<String, tokio_util::sync::CancellationToken>>,
}

/// A 2025-era session held here, as the hot path sees it.
pub struct HeldSession {
    /// The session.
    pub front: FrontSession,
    /// Its rmcp peer (declared capabilities).
    pub peer: Peer<RoleServer>,
    /// Its hot-path state.
    pub hot: Arc<HotState>,
}

impl HttpFront {
    /// The front over `store`, delivering its notices.
    pub fn new(store: Arc<dyn SessionStore>, max_principals: usize) -> Arc<Self> {
        let registry = Arc::new(StreamRegistry::default());
        registry.deliver(&store);
        Arc::new(HttpFront {
            principals: Principals::with_cap(max_principals),
            store,
            registry,
            legacy: Mutex::default(),
        })
    }

    /// Records the handler's session `id` (see [`Self::legacy_session`]).
    pub fn register_legacy(&self, id: &str, front: &FrontSession) {
        let Ok(mut m) = self.legacy.lock() else {
            return;
        };
        m.retain(|_, e| e.session.strong_count() > 0);
        m.insert(
            id.to_string(),
            LegacyEntry {
                session: Arc::downgrade(&front.session),
                streams: Arc::downgrade(&front.streams),
                hot: Arc::new(HotState {
                    touched: std::sync::atomic::AtomicU64::new(crate::mux::session_store::now_ms()),
                    inflight: Mutex::default(),
                }),
            },
        );
    }

    /// The 2025-era session `id` whose handler runs here; `None` when it is not held here
    /// (yet) or has ended.
    pub fn legacy_session(&self, id: &str) -> Option<HeldSession> {
        let m = self.legacy.lock().ok()?;
        let e = m.get(id)?;
        let front = FrontSession {
            session: e.session.upgrade()?,
            streams: e.streams.upgrade()?,
        };
        let peer = front.streams.legacy.get()?.clone();
        if peer.is_transport_closed() {
            return None;
        }
        Some(HeldSession {
            front,
            peer,
            hot: e.hot.clone(),
        })
    }
}

/// Default number of 2026-era principals whose loaded sets are kept.
pub const DEFAULT_MAX_PRINCIPALS: usize = 10_000;

/// How long an unused principal keeps its loaded set.
pub const PRINCIPAL_IDLE: Duration = Duration::from_secs(3600);

/// 2026-07-28 front sessions, keyed by principal.
///
/// The 2026-07-28 era has no protocol sessions, so loaded sets are keyed by who is asking: the
/// authenticated identity's subject (see `server::http` for how the identity is established).
/// At most `cap` principals are kept (least recently used evicted first, counted in
/// `graphos_sessions_refused_total{kind="principal_evicted"}`); an unused principal is
/// forgotten after [`PRINCIPAL_IDLE`].
pub struct Principals {
    sessions: Mutex<lru::LruCache<String, (FrontSession, Instant)>>,
}

impl Default for Principals {
    fn default() -> Self {
        Principals::with_cap(DEFAULT_MAX_PRINCIPALS)
    }
}

impl Principals {
    /// A table keeping at most `cap` principals.
    pub fn with_cap(cap: usize) -> Self {
        let cap = NonZeroUsize::new(cap.max(1)).unwrap_or(NonZeroUsize::MIN);
        Principals {
            sessions: Mutex::new(lru::LruCache::new(cap)),
        }
    }

    /// The session of principal `key`, opened by `open` on first use.
    pub fn get(&self, key: &str, open: impl FnOnce() -> FrontSession) -> FrontSession {
        let mut map = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        // Expire idle principals from the cold end.
        while map
            .peek_lru()
            .is_some_and(|(_, (_, used))| now.duration_since(*used) >= PRINCIPAL_IDLE)
        {
            map.pop_lru();
        }
        if let Some((front, used)) = map.get_mut(key) {
            *used = now;
            return front.clone();
        }
        let front = open();
        if map.push(key.to_string(), (front.clone(), now)).is_some() {
            crate::telemetry::metrics().session_refused("principal_evicted");
        }
        front
    }

    /// Principals held.
    pub fn len(&self) -> usize {
        self.sessions.lock().map(|m| m.len()).unwrap_or_default()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
