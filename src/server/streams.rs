//! Notification streams of front sessions, and the 2026-era principals table.
//!
//! A 2025-era session has one peer (its GET stream, or stdio); a 2026-era principal has any
//! number of `subscriptions/listen` sinks. [`FrontStreams`] implements the multiplexer's
//! [`SessionNotifier`] over both.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

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

    /// The session of principal `key`, created on first use.
    pub fn get(&self, mux: &Multiplexer, key: &str) -> FrontSession {
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
        let front = FrontSession::open(mux);
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
