//! Where front-session state lives: the [`SessionStore`] (like the catalog's `GenerationStore`,
//! a core trait the runtime implements).
//!
//! A store holds, per 2025-era HTTP session (key `s:<session id>`) and per 2026-era principal
//! (key `p:<digest of the subject>`): the principal it is bound to, the client's `initialize`
//! parameters (protocol version, capabilities, client info), the loaded set and the times it
//! was created and last seen. Records expire after the idle timeout and never hold a secret.
//! The store also carries notifications between replicas: a change that must reach a session is
//! [`SessionStore::notify`]d and delivered by whichever replica holds one of its streams
//! ([`SessionStore::hold`]); with no stream anywhere it stays pending until the session's next
//! request.
//!
//! [`MemoryStore`] serves one process (the default); the Redis/Valkey store in
//! `crate::session_redis` serves several replicas. There is no fallback between them: when the
//! configured store is unreachable, requests that need it are refused
//! (`session-store-unavailable`), never served from a replica's private copy.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::{NotifyOutcome, SessionNotifier};

/// A store operation's future.
pub type StoreFuture<'a, T> = BoxFuture<'a, Result<T, SessionStoreError>>;

/// The store key of a session or principal.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SessionKey(String);

/// Whether `id` has the form of a session id graph-os (or rmcp) assigns: 1 to 128 characters of
/// the base64url alphabet and `-` (graph-os's ids: 43 base64url characters; rmcp's: a UUID).
pub fn valid_session_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl SessionKey {
    /// A 2025-era session, by its `Mcp-Session-Id`; `None` when `id` is not a session id (the
    /// one check every id from a client passes before any store sees it: a value such as
    /// `<id>:loaded` would otherwise name another key of the store).
    pub fn session(id: &str) -> Option<Self> {
        valid_session_id(id).then(|| SessionKey(format!("s:{id}")))
    }

    /// A 2026-era principal, by its subject (digested: keys are listed by operators).
    pub fn principal(subject: &str) -> Self {
        let digest = crate::digest::sha256_hex(subject.as_bytes());
        SessionKey(format!("p:{}", &digest[..32]))
    }

    /// Whether this is a 2026-era principal.
    pub fn is_principal(&self) -> bool {
        self.0.starts_with("p:")
    }

    /// The key as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A key read back from the store or the bus (`s:…` or `p:…`, ≤ 256 bytes).
    pub fn parse(raw: &str) -> Option<Self> {
        ((raw.starts_with("s:") || raw.starts_with("p:")) && raw.len() <= 256)
            .then(|| SessionKey(raw.to_string()))
    }
}

/// What a store keeps about a session or principal (never a secret: the principal is the
/// identity's subject, `token:<digest>` or `oauth:<issuer digest>:<sub>`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// The identity subject the session is bound to.
    pub principal: String,
    /// The protocol version the client asked for (2025 era).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
    /// The client's `initialize` parameters (capabilities, client info), replayed when another
    /// replica restores the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<serde_json::Value>,
    /// Milliseconds since the epoch.
    pub created_ms: u64,
    /// Milliseconds since the epoch of the last request.
    #[serde(default)]
    pub last_seen_ms: u64,
}

/// A record as read by a request: the record, the loaded set, and whether a notification is
/// waiting for the session (taken by this read).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fetched {
    /// The record.
    pub record: SessionRecord,
    /// Exposed tool names loaded.
    pub loaded: BTreeSet<String>,
    /// A list change no stream received yet.
    pub pending: bool,
}

/// A notification for one session, delivered by the replica holding its stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Notice {
    /// `notifications/tools/list_changed`.
    ToolsChanged,
    /// `notifications/resources/updated` for a subscribed URI.
    ResourceUpdated(String),
    /// A 2025 `notifications/tasks/status` of one of the session's tasks (graph-os's id).
    TaskStatus(serde_json::Value),
}

/// The store could not be used (unreachable, timed out, refused the command, or answered
/// something unreadable). The message never carries a credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("session store unavailable: {0}")]
pub struct SessionStoreError(pub String);

impl SessionStoreError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        "session-store-unavailable"
    }
}

/// Where session and principal state lives (see the module note).
pub trait SessionStore: Send + Sync {
    /// `memory` or `redis`.
    fn kind(&self) -> &'static str;
    /// Creates `key` unless it exists; returns whether it was created.
    fn create(&self, key: &SessionKey, record: &SessionRecord) -> StoreFuture<'_, bool>;
    /// Reads `key` for a request: extends its lifetime, records the request time and takes the
    /// pending flag. `None`: no such session (expired or never created).
    fn fetch(&self, key: &SessionKey) -> StoreFuture<'_, Option<Fetched>>;
    /// Reads `key` without touching it.
    fn read(&self, key: &SessionKey) -> StoreFuture<'_, Option<SessionRecord>>;
    /// Adds and removes loaded names atomically (two replicas changing one set lose nothing);
    /// returns the resulting set.
    fn change_loaded(
        &self,
        key: &SessionKey,
        add: Vec<String>,
        remove: Vec<String>,
    ) -> StoreFuture<'_, BTreeSet<String>>;
    /// Forgets `key` (the client ended the session).
    fn remove(&self, key: &SessionKey) -> StoreFuture<'_, ()>;
    /// Sends `notice` to the replica(s) holding a stream of `key`; `false` when none does (it is
    /// then kept pending for the session's next request).
    fn notify(&self, key: &SessionKey, notice: Notice) -> StoreFuture<'_, bool>;
    /// This replica opened (`true`) or closed (`false`) a stream of `key`.
    fn hold(&self, key: &SessionKey, holding: bool) -> StoreFuture<'_, ()>;
    /// Notices addressed to streams this replica holds.
    fn notices(&self) -> tokio::sync::broadcast::Receiver<(SessionKey, Notice)>;
    /// `Err` while the store is known to be unreachable (for readiness and status).
    fn health(&self) -> Result<(), String>;
}

/// A session's place in the store: the multiplexer writes its loaded set there.
#[derive(Clone)]
pub struct StoreBinding {
    /// The store.
    pub store: Arc<dyn SessionStore>,
    /// The session's key.
    pub key: SessionKey,
}

/// Notifies a stored session through the store, so the replica holding its stream delivers.
pub struct StoreNotifier(pub StoreBinding);

fn outcome(r: Result<bool, SessionStoreError>) -> NotifyOutcome {
    match r {
        Ok(true) => NotifyOutcome::Sent,
        Ok(false) => NotifyOutcome::NoStream,
        Err(e) => {
            tracing::warn!(error = %e, "notification not sent: session store unavailable");
            NotifyOutcome::Failed
        }
    }
}

impl SessionNotifier for StoreNotifier {
    fn tools_changed(&self) -> BoxFuture<'static, NotifyOutcome> {
        let b = self.0.clone();
        Box::pin(async move { outcome(b.store.notify(&b.key, Notice::ToolsChanged).await) })
    }

    fn resource_updated(&self, uri: String) -> BoxFuture<'static, NotifyOutcome> {
        let b = self.0.clone();
        Box::pin(async move { outcome(b.store.notify(&b.key, Notice::ResourceUpdated(uri)).await) })
    }

    fn task_status(&self, params: serde_json::Value) -> BoxFuture<'static, NotifyOutcome> {
        let b = self.0.clone();
        Box::pin(async move { outcome(b.store.notify(&b.key, Notice::TaskStatus(params)).await) })
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// How long records live without requests.
#[derive(Debug, Clone, Copy)]
pub struct StoreTtl {
    /// 2025-era sessions (the session idle timeout).
    pub session: Duration,
    /// 2026-era principals.
    pub principal: Duration,
}

impl StoreTtl {
    /// The lifetime of `key`.
    pub fn of(&self, key: &SessionKey) -> Duration {
        if key.is_principal() {
            self.principal
        } else {
            self.session
        }
    }
}

struct Entry {
    record: SessionRecord,
    loaded: BTreeSet<String>,
    pending: bool,
    expires: Instant,
}

struct Memory {
    sessions: HashMap<SessionKey, Entry>,
    /// Principals, least recently used first out when the cap is reached.
    principals: lru::LruCache<SessionKey, Entry>,
    holders: HashMap<SessionKey, usize>,
}

impl Memory {
    fn get_mut(&mut self, key: &SessionKey) -> Option<&mut Entry> {
        if key.is_principal() {
            self.principals.get_mut(key)
        } else {
            self.sessions.get_mut(key)
        }
    }

    fn get(&self, key: &SessionKey) -> Option<&Entry> {
        if key.is_principal() {
            self.principals.peek(key)
        } else {
            self.sessions.get(key)
        }
    }

    fn insert(&mut self, key: SessionKey, entry: Entry) {
        if key.is_principal() {
            if self.principals.push(key, entry).is_some() {
                crate::telemetry::metrics().session_refused("principal_evicted");
            }
        } else {
            self.sessions.insert(key, entry);
        }
    }

    fn remove(&mut self, key: &SessionKey) {
        if key.is_principal() {
            self.principals.pop(key);
        } else {
            self.sessions.remove(key);
        }
    }
}

/// The in-process store: one replica (or several multiplexers in one test process). Sessions
/// are bounded by the HTTP front's session caps; principals by `max_principals` (least
/// recently used evicted, like the front's principals table).
pub struct MemoryStore {
    ttl: StoreTtl,
    inner: Mutex<Memory>,
    bus: tokio::sync::broadcast::Sender<(SessionKey, Notice)>,
}

impl MemoryStore {
    /// A store whose records live `ttl` without requests, holding at most `max_principals`
    /// principals.
    pub fn new(ttl: StoreTtl, max_principals: usize) -> Arc<Self> {
        let cap = std::num::NonZeroUsize::new(max_principals.max(1))
            .unwrap_or(std::num::NonZeroUsize::MIN);
        Arc::new(MemoryStore {
            ttl,
            inner: Mutex::new(Memory {
                sessions: HashMap::new(),
                principals: lru::LruCache::new(cap),
                holders: HashMap::new(),
            }),
            bus: tokio::sync::broadcast::channel(1024).0,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records held now (expired sessions dropped).
    pub fn len(&self) -> usize {
        let mut m = self.lock();
        let now = Instant::now();
        m.sessions.retain(|_, e| e.expires > now);
        m.sessions.len() + m.principals.len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn ready<'a, T: Send + 'a>(v: T) -> StoreFuture<'a, T> {
    Box::pin(std::future::ready(Ok(v)))
}

impl SessionStore for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn create(&self, key: &SessionKey, record: &SessionRecord) -> StoreFuture<'_, bool> {
        let mut m = self.lock();
        let now = Instant::now();
        let held = m.holders.contains_key(key);
        let live = m.get(key).is_some_and(|e| e.expires > now || held);
        if !live {
            // Expired sessions are swept when a new one is created (bounded by the caps).
            m.sessions.retain(|_, e| e.expires > now);
            m.insert(
                key.clone(),
                Entry {
                    record: record.clone(),
                    loaded: BTreeSet::new(),
                    pending: false,
                    expires: now + self.ttl.of(key),
                },
            );
        }
        ready(!live)
    }

    fn fetch(&self, key: &SessionKey) -> StoreFuture<'_, Option<Fetched>> {
        let mut m = self.lock();
        let now = Instant::now();
        let ttl = self.ttl.of(key);
        // A session whose stream is open stays alive between requests.
        let held = m.holders.contains_key(key);
        let fetched = match m.get_mut(key) {
            Some(e) if e.expires > now || held => {
                e.expires = now + ttl;
                e.record.last_seen_ms = now_ms();
                Some(Fetched {
                    record: e.record.clone(),
                    loaded: e.loaded.clone(),
                    pending: std::mem::take(&mut e.pending),
                })
            }
            Some(_) => {
                m.remove(key);
                None
            }
            None => None,
        };
        ready(fetched)
    }

    fn read(&self, key: &SessionKey) -> StoreFuture<'_, Option<SessionRecord>> {
        let m = self.lock();
        let now = Instant::now();
        let held = m.holders.contains_key(key);
        ready(
            m.get(key)
                .filter(|e| e.expires > now || held)
                .map(|e| e.record.clone()),
        )
    }

    fn change_loaded(
        &self,
        key: &SessionKey,
        add: Vec<String>,
        remove: Vec<String>,
    ) -> StoreFuture<'_, BTreeSet<String>> {
        let mut m = self.lock();
        let now = Instant::now();
        let ttl = self.ttl.of(key);
        if m.get(key).is_none() {
            m.insert(
                key.clone(),
                Entry {
                    record: SessionRecord::default(),
                    loaded: BTreeSet::new(),
                    pending: false,
                    expires: now + ttl,
                },
            );
        }
        let Some(e) = m.get_mut(key) else {
            return ready(BTreeSet::new());
        };
        e.loaded.extend(add);
        for r in &remove {
            e.loaded.remove(r);
        }
        e.expires = now + ttl;
        ready(e.loaded.clone())
    }

    fn remove(&self, key: &SessionKey) -> StoreFuture<'_, ()> {
        self.lock().remove(key);
        ready(())
    }

    fn notify(&self, key: &SessionKey, notice: Notice) -> StoreFuture<'_, bool> {
        let mut m = self.lock();
        let held = m.holders.get(key).copied().unwrap_or(0) > 0;
        if held {
            let _ = self.bus.send((key.clone(), notice));
        } else if let Some(e) = m.get_mut(key) {
            e.pending = true;
        }
        ready(held)
    }

    fn hold(&self, key: &SessionKey, holding: bool) -> StoreFuture<'_, ()> {
        let mut m = self.lock();
        let n = m.holders.entry(key.clone()).or_default();
        if holding {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.holders.remove(key);
            }
        }
        ready(())
    }

    fn notices(&self) -> tokio::sync::broadcast::Receiver<(SessionKey, Notice)> {
        self.bus.subscribe()
    }

    fn health(&self) -> Result<(), String> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> Arc<MemoryStore> {
        MemoryStore::new(
            StoreTtl {
                session: Duration::from_secs(60),
                principal: Duration::from_secs(60),
            },
            3,
        )
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[tokio::test]
    async fn a_record_is_created_once_and_read_back_with_its_loaded_set() {
        let s = store();
        let key = SessionKey::session("abc").unwrap();
        let rec = SessionRecord {
            principal: "token:1".into(),
            created_ms: 1,
            ..Default::default()
        };
        assert!(s.create(&key, &rec).await.unwrap());
        assert!(!s.create(&key, &rec).await.unwrap(), "never overwritten");
        s.change_loaded(&key, names(&["a__x"]), vec![])
            .await
            .unwrap();
        let f = s.fetch(&key).await.unwrap().unwrap();
        assert_eq!(f.record.principal, "token:1");
        assert_eq!(f.loaded, BTreeSet::from(["a__x".to_string()]));
        assert!(
            s.fetch(&SessionKey::session("other").unwrap())
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn concurrent_changes_to_one_loaded_set_lose_nothing() {
        let s = store();
        let key = SessionKey::principal("token:abc");
        let mut tasks = Vec::new();
        for i in 0..50 {
            let s = s.clone();
            let key = key.clone();
            tasks.push(tokio::spawn(async move {
                s.change_loaded(&key, vec![format!("t{i}")], vec![])
                    .await
                    .unwrap()
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let set = s.change_loaded(&key, vec![], names(&["t0"])).await.unwrap();
        assert_eq!(set.len(), 49);
    }

    #[tokio::test]
    async fn a_notice_reaches_a_holder_else_waits_for_the_next_request() {
        let s = store();
        let key = SessionKey::session("abc").unwrap();
        s.create(&key, &SessionRecord::default()).await.unwrap();
        let mut rx = s.notices();
        assert!(!s.notify(&key, Notice::ToolsChanged).await.unwrap());
        assert!(s.fetch(&key).await.unwrap().unwrap().pending);
        assert!(!s.fetch(&key).await.unwrap().unwrap().pending, "taken once");
        s.hold(&key, true).await.unwrap();
        assert!(s.notify(&key, Notice::ToolsChanged).await.unwrap());
        assert_eq!(
            rx.recv().await.unwrap(),
            (key.clone(), Notice::ToolsChanged)
        );
        s.hold(&key, false).await.unwrap();
        assert!(!s.notify(&key, Notice::ToolsChanged).await.unwrap());
    }

    #[tokio::test]
    async fn principals_beyond_the_cap_evict_the_least_recently_used() {
        let s = store();
        for p in ["a", "b", "c"] {
            s.create(&SessionKey::principal(p), &SessionRecord::default())
                .await
                .unwrap();
        }
        s.fetch(&SessionKey::principal("a")).await.unwrap();
        s.create(&SessionKey::principal("d"), &SessionRecord::default())
            .await
            .unwrap();
        assert_eq!(s.len(), 3);
        assert!(s.read(&SessionKey::principal("b")).await.unwrap().is_none());
        assert!(s.read(&SessionKey::principal("a")).await.unwrap().is_some());
    }

    #[test]
    fn principal_keys_digest_the_subject() {
        let k = SessionKey::principal("oauth:abc:alice@example.com");
        assert!(k.is_principal() && !k.as_str().contains("alice"));
        assert_eq!(SessionKey::parse(k.as_str()), Some(k));
        assert_eq!(SessionKey::parse("x:1"), None);
    }
}
