//! Bounds on 2025-era HTTP sessions: a global cap, a per-principal cap, an idle lifetime, and
//! each session bound to the principal that opened it.
//!
//! [`SessionLedger`] is the one place that counts. The HTTP layer reserves a slot before an
//! `initialize` reaches rmcp (refusing with 503 or 429 and `Retry-After` when full) and commits
//! it to the session id rmcp assigns; [`BoundedSessionManager`] wraps rmcp's in-memory session
//! manager and reports every session's end (DELETE, idle expiry, client gone) to the ledger.
//! A request naming a session owned by another principal is answered as if the session did not
//! exist.
//!
//! Session ids are 256 random bits (base64url). A session created on another replica is
//! restored here from the session store by rmcp (its `initialize` replayed); it counts here
//! like any other and is bound to the principal the store recorded. A GET stream opened here is
//! registered with the store, so notices for the session are routed to this replica.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::WorkerTransport;
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, LocalSessionWorker, SessionConfig,
};
use rmcp::transport::streamable_http_server::session::{
    RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
};

use crate::mux::session_store::{SessionKey, SessionStore};

/// How long a completed request stream stays resumable.
pub const COMPLETED_STREAM_TTL: Duration = Duration::from_secs(10);

/// Limits on 2025-era sessions.
#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    /// Sessions open at once, all principals together.
    pub max_sessions: usize,
    /// Sessions open at once for one principal.
    pub max_per_principal: usize,
    /// A session without requests for this long is closed.
    pub idle: Duration,
    /// A session must complete `initialize` within this long.
    pub init_timeout: Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            max_sessions: 1000,
            max_per_principal: 100,
            idle: Duration::from_secs(300),
            init_timeout: Duration::from_secs(10),
        }
    }
}

/// Why a new session was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The global cap is reached (HTTP 503).
    Global,
    /// The principal's cap is reached (HTTP 429).
    Principal,
}

#[derive(Default)]
struct Ledger {
    /// Live sessions and their principal.
    owners: HashMap<String, String>,
    /// The key each live session counts against (its principal, or for an anonymous caller
    /// the key its caps are kept under: see `http::anonymous`).
    counted: HashMap<String, String>,
    /// Live sessions per cap key.
    per_principal: HashMap<String, usize>,
    /// Sessions rmcp created that are not bound to a principal yet.
    unbound: HashSet<String>,
    /// Admitted `initialize` requests still in flight, per principal.
    reserved: HashMap<String, usize>,
    reserved_total: usize,
}

/// Counts sessions per principal (see the module note).
pub struct SessionLedger {
    limits: SessionLimits,
    inner: Mutex<Ledger>,
}

/// An admitted `initialize`; dropping it without [`Reservation::commit`] releases the slot.
pub struct Reservation {
    ledger: Arc<SessionLedger>,
    principal: String,
    done: bool,
}

impl Reservation {
    /// Binds the slot to the session rmcp created (`None`: no session was created), owned by
    /// the principal it was reserved for.
    pub fn commit(self, session: Option<&str>) {
        let owner = self.principal.clone();
        self.commit_to(session, &owner);
    }

    /// Binds the slot to the session rmcp created, owned by `owner` and still counted against
    /// the key it was reserved under (an anonymous caller's own session principal, counted
    /// against its address).
    pub fn commit_to(mut self, session: Option<&str>, owner: &str) {
        self.done = true;
        let mut l = self.ledger.lock();
        release(&mut l, &self.principal);
        if let Some(id) = session
            && l.unbound.remove(id)
        {
            l.owners.insert(id.to_string(), owner.to_string());
            l.counted.insert(id.to_string(), self.principal.clone());
            *l.per_principal.entry(self.principal.clone()).or_default() += 1;
        }
    }
}

fn release(l: &mut Ledger, principal: &str) {
    l.reserved_total = l.reserved_total.saturating_sub(1);
    if let Some(n) = l.reserved.get_mut(principal) {
        *n -= 1;
        if *n == 0 {
            l.reserved.remove(principal);
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.done {
            release(&mut self.ledger.lock(), &self.principal);
        }
    }
}

impl SessionLedger {
    /// A ledger enforcing `limits`.
    pub fn new(limits: SessionLimits) -> Arc<Self> {
        Arc::new(SessionLedger {
            limits,
            inner: Mutex::new(Ledger::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The limits in force.
    pub fn limits(&self) -> SessionLimits {
        self.limits
    }

    /// Admits a new session for `principal`, or says which cap is full.
    pub fn reserve(self: &Arc<Self>, principal: &str) -> Result<Reservation, Full> {
        let mut l = self.lock();
        let live = l.owners.len() + l.unbound.len();
        if live + l.reserved_total >= self.limits.max_sessions {
            return Err(Full::Global);
        }
        let mine = l.per_principal.get(principal).copied().unwrap_or(0)
            + l.reserved.get(principal).copied().unwrap_or(0);
        if mine >= self.limits.max_per_principal {
            return Err(Full::Principal);
        }
        l.reserved_total += 1;
        *l.reserved.entry(principal.to_string()).or_default() += 1;
        Ok(Reservation {
            ledger: self.clone(),
            principal: principal.to_string(),
            done: false,
        })
    }

    /// The principal that opened `session`, if it is live and bound.
    pub fn owner(&self, session: &str) -> Option<String> {
        self.lock().owners.get(session).cloned()
    }

    /// Sessions open now.
    pub fn open(&self) -> usize {
        let l = self.lock();
        l.owners.len() + l.unbound.len()
    }

    /// Binds a session restored from the store (or any not yet bound) to `principal`.
    pub fn adopt(&self, session: &str, principal: &str) {
        let mut l = self.lock();
        if l.unbound.remove(session) {
            l.owners.insert(session.to_string(), principal.to_string());
            l.counted.insert(session.to_string(), principal.to_string());
            *l.per_principal.entry(principal.to_string()).or_default() += 1;
        }
    }

    fn created(&self, session: &str) {
        self.lock().unbound.insert(session.to_string());
    }

    fn closed(&self, session: &str) {
        let mut l = self.lock();
        l.unbound.remove(session);
        l.owners.remove(session);
        if let Some(principal) = l.counted.remove(session)
            && let Some(n) = l.per_principal.get_mut(&principal)
        {
            *n -= 1;
            if *n == 0 {
                l.per_principal.remove(&principal);
            }
        }
    }
}

/// rmcp's in-memory session manager, reporting session lifetimes to the ledger and GET streams
/// to the session store.
pub struct BoundedSessionManager {
    inner: LocalSessionManager,
    ledger: Arc<SessionLedger>,
    store: Arc<dyn SessionStore>,
}

tokio::task_local! {
    /// Sessions the request being served may still create: one per admitted `initialize`.
    static ADMITTED: std::cell::Cell<u8>;
}

/// Runs `fut` (rmcp serving one admitted request) with `permits` session creations allowed:
/// 1 for an `initialize` admission reserved a slot for, 0 for anything else. rmcp creates a
/// session only inside [`SessionManager::create_session`], which takes a permit or refuses, so a
/// request admission did not count can never open a session (see `envelope`).
pub async fn with_admission<F: std::future::Future>(permits: u8, fut: F) -> F::Output {
    ADMITTED.scope(std::cell::Cell::new(permits), fut).await
}

/// Takes this request's session permit, if it has one.
fn take_permit() -> bool {
    ADMITTED
        .try_with(|p| {
            let n = p.get();
            p.set(n.saturating_sub(1));
            n > 0
        })
        .unwrap_or(false)
}

/// A new session id: 256 bits from the system's CSPRNG, base64url (rmcp's own ids are UUIDv4,
/// 122 random bits).
fn new_session_id() -> Result<SessionId, LocalSessionManagerError> {
    use base64::Engine;
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| LocalSessionManagerError::SessionNotFound("no randomness".into()))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(bytes)
        .into())
}

/// Releases this replica's claim on a session's stream when the stream ends.
struct Hold {
    store: Arc<dyn SessionStore>,
    key: Option<SessionKey>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let (store, Some(key)) = (self.store.clone(), self.key.clone()) else {
            return;
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = store.hold(&key, false).await;
            });
        }
    }
}

impl BoundedSessionManager {
    /// Sessions expire after `limits.idle` without requests; GET streams are registered with
    /// `store`.
    pub fn new(ledger: Arc<SessionLedger>, store: Arc<dyn SessionStore>) -> Self {
        let limits = ledger.limits();
        let mut inner = LocalSessionManager::default();
        let mut config = SessionConfig::default();
        config.keep_alive = Some(limits.idle);
        config.init_timeout = Some(limits.init_timeout);
        // rmcp keeps each completed call's response stream for late resumption; memory grows with
        // the call rate times this window (60 s by default measured at ~100 KB per busy session),
        // so keep it short: a client resuming a finished stream more than 10 s later re-asks.
        config.completed_cache_ttl = COMPLETED_STREAM_TTL;
        inner.session_config = config;
        BoundedSessionManager {
            inner,
            ledger,
            store,
        }
    }

    /// Claims `id`'s notices for this replica while `stream` lives.
    async fn held<S>(
        &self,
        id: &SessionId,
        stream: S,
    ) -> impl Stream<Item = ServerSseMessage> + Send + Sync + 'static
    where
        S: Stream<Item = ServerSseMessage> + Send + Sync + 'static,
    {
        let key = SessionKey::session(id);
        if let Some(key) = &key
            && let Err(e) = self.store.hold(key, true).await
        {
            tracing::warn!(error = %e, "stream not registered with the session store");
        }
        let hold = Hold {
            store: self.store.clone(),
            key,
        };
        stream.map(move |m| {
            let _ = &hold;
            m
        })
    }
}

impl SessionManager for BoundedSessionManager {
    type Error = LocalSessionManagerError;
    type Transport = WorkerTransport<LocalSessionWorker>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        if !take_permit() {
            // Admission reserves a slot for every `initialize` it sees; rmcp asking for a session
            // without one means the two read the request differently. Refuse, loudly.
            tracing::error!("session creation refused: the request was not admitted as initialize");
            crate::telemetry::metrics().session_refused("not-admitted");
            return Err(LocalSessionManagerError::SessionNotFound(
                "session-not-admitted".into(),
            ));
        }
        // rmcp's restore path creates a session under a given id: ours, with more entropy.
        for _ in 0..4 {
            let id = new_session_id()?;
            if let RestoreOutcome::Restored(transport) =
                self.inner.restore_session(id.clone()).await?
            {
                self.ledger.created(&id);
                return Ok((id, transport));
            }
        }
        let (id, transport) = self.inner.create_session().await?;
        self.ledger.created(&id);
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        // Local only: the session lives on in the store for the other replicas (a client's
        // DELETE removes it there through rmcp's store hook).
        let r = self.inner.close_session(id).await;
        self.ledger.closed(id);
        r
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_stream(id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let stream = self.inner.create_standalone_stream(id).await?;
        Ok(self.held(id, stream).await)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let stream = self.inner.resume(id, last_event_id).await?;
        Ok(self.held(id, stream).await)
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        let outcome = self.inner.restore_session(id.clone()).await?;
        if matches!(outcome, RestoreOutcome::Restored(_)) {
            self.ledger.created(&id);
        }
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(max: usize, per: usize) -> Arc<SessionLedger> {
        SessionLedger::new(SessionLimits {
            max_sessions: max,
            max_per_principal: per,
            ..SessionLimits::default()
        })
    }

    #[test]
    fn caps_count_reservations_and_live_sessions_per_principal() {
        let l = ledger(3, 2);
        let a1 = l.reserve("alice").unwrap();
        let a2 = l.reserve("alice").unwrap();
        assert_eq!(l.reserve("alice").err(), Some(Full::Principal));
        l.created("s1");
        a1.commit(Some("s1"));
        a2.commit(None); // initialize failed: the slot is released
        assert_eq!(l.owner("s1").as_deref(), Some("alice"));
        let b = l.reserve("bob").unwrap();
        let a3 = l.reserve("alice").unwrap();
        assert_eq!(l.reserve("carol").err(), Some(Full::Global));
        drop(b);
        drop(a3);
        l.closed("s1");
        assert_eq!(l.owner("s1"), None);
        assert_eq!(l.open(), 0);
        assert!(l.reserve("alice").is_ok());
    }

    #[test]
    fn a_session_closed_before_commit_is_never_bound() {
        let l = ledger(10, 10);
        let r = l.reserve("alice").unwrap();
        l.created("s1");
        l.closed("s1");
        r.commit(Some("s1"));
        assert_eq!(l.owner("s1"), None);
        assert_eq!(l.open(), 0);
    }
}
