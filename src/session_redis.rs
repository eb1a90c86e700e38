//! The Redis/Valkey [`SessionStore`]: replicas behind one Service share sessions, loaded sets
//! and notifications through it.
//!
//! Layout (every key under a prefix, `graphos:` by default; `K` is a [`SessionKey`]):
//! - `K` — hash: `record` (the [`SessionRecord`] as JSON) and `last_seen_ms`;
//! - `K:loaded` — set of loaded tool names (SADD/SREM: concurrent changes from two replicas
//!   both land);
//! - `K:pending` — a list change no stream received yet;
//! - `K:holders` — sorted set of replicas holding a stream of `K`, scored by expiry (a replica
//!   refreshes its entries every few seconds, so a killed replica's entries lapse);
//! - channel `notices` — `{"key": K, "notice": …}` for the replicas holding streams.
//!
//! Every multi-step operation is one Lua script (atomic, one round trip; Redis ≥ 6 and Valkey
//! run them). Records expire with the idle timeout (PEXPIRE on every request). Nothing secret
//! is written: records carry the principal's subject and the client's `initialize` parameters.
//! Errors are redacted (the URL and password never reach a log or a response).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, Script};
use futures::StreamExt;

use crate::mux::session_store::{
    Fetched, Notice, SessionKey, SessionRecord, SessionStore, SessionStoreError, StoreFuture,
    StoreTtl, now_ms,
};

/// How long a replica's claim on a stream lasts without a refresh.
const HOLD_TTL: Duration = Duration::from_secs(20);
/// How often claims are refreshed and the store is pinged.
const HEARTBEAT: Duration = Duration::from_secs(5);
/// Bound on one store command (a request waits at most this long before a 503).
const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);
/// Largest notice read from the bus.
const MAX_NOTICE_BYTES: usize = 64 << 10;

const FETCH: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HSET', KEYS[1], 'last_seen_ms', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
local pending = redis.call('GET', KEYS[3])
if pending then redis.call('DEL', KEYS[3]) end
return {redis.call('HGET', KEYS[1], 'record') or '', redis.call('SMEMBERS', KEYS[2]), pending and 1 or 0}
";

const CREATE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'record', ARGV[1], 'last_seen_ms', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
";

const CHANGE: &str = r"
local n = tonumber(ARGV[2])
for i = 3, 2 + n do redis.call('SADD', KEYS[1], ARGV[i]) end
for i = 3 + n, #ARGV do redis.call('SREM', KEYS[1], ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return redis.call('SMEMBERS', KEYS[1])
";

const NOTIFY: &str = r"
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) > 0 then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[4])
return 0
";

/// How to reach the store (the URL is resolved from a secret reference by the caller and never
/// printed).
#[derive(Clone)]
pub struct RedisConfig {
    /// `redis://[user@]host[:port][/db]` or `rediss://…` (password separately, or in a URL that
    /// came from a secret reference).
    pub url: String,
    /// The password, resolved (from `--session-store-password`).
    pub password: Option<String>,
    /// TLS material (PEM) for `rediss://`: root CAs replacing the system roots, client
    /// certificate and key for mTLS.
    pub tls: Option<::redis::TlsCertificates>,
    /// Key prefix.
    pub prefix: String,
    /// This replica's id (its name in stream claims).
    pub replica: String,
    /// Record lifetimes.
    pub ttl: StoreTtl,
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("prefix", &self.prefix)
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

struct Scripts {
    fetch: Script,
    create: Script,
    change: Script,
    notify: Script,
}

/// The Redis/Valkey session store (see the module note).
pub struct RedisSessionStore {
    conn: ConnectionManager,
    prefix: String,
    channel: String,
    replica: String,
    ttl: StoreTtl,
    scripts: Scripts,
    bus: tokio::sync::broadcast::Sender<(SessionKey, Notice)>,
    held: Mutex<HashMap<SessionKey, usize>>,
    health: Mutex<Result<(), String>>,
    /// Strings never to print (the URL, the password).
    redact: Vec<String>,
}

/// A store error without secrets: the client's message with the URL and password removed.
fn redacted(redact: &[String], e: &::redis::RedisError) -> SessionStoreError {
    let what = if e.is_timeout() {
        "timed out".to_string()
    } else if e.is_connection_refusal() {
        "connection refused".to_string()
    } else {
        let mut m = e.to_string();
        for s in redact.iter().filter(|s| !s.is_empty()) {
            m = m.replace(s.as_str(), "***");
        }
        m.chars().take(300).collect()
    };
    SessionStoreError(what)
}

impl RedisSessionStore {
    /// A store over `config`. Connects lazily: the gateway starts while the store is down and
    /// refuses what needs it until it answers.
    pub fn open(config: RedisConfig) -> Result<Arc<Self>, SessionStoreError> {
        let redact: Vec<String> = [Some(config.url.clone()), config.password.clone()]
            .into_iter()
            .flatten()
            .collect();
        let mut info = ::redis::IntoConnectionInfo::into_connection_info(config.url.as_str())
            .map_err(|_| SessionStoreError("not a redis:// or rediss:// URL (redacted)".into()))?;
        if let Some(p) = &config.password {
            let redis = info.redis_settings().clone().set_password(p.clone());
            info = info.set_redis_settings(redis);
        }
        let client = match &config.tls {
            Some(tls) => Client::build_with_tls(info, tls.clone()),
            None => Client::open(info),
        }
        .map_err(|e| redacted(&redact, &e))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(COMMAND_TIMEOUT))
            .set_response_timeout(Some(COMMAND_TIMEOUT))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(2));
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), manager_config)
            .map_err(|e| redacted(&redact, &e))?;
        let store = Arc::new(RedisSessionStore {
            conn,
            channel: format!("{}notices", config.prefix),
            prefix: config.prefix,
            replica: config.replica,
            ttl: config.ttl,
            scripts: Scripts {
                fetch: Script::new(FETCH),
                create: Script::new(CREATE),
                change: Script::new(CHANGE),
                notify: Script::new(NOTIFY),
            },
            bus: tokio::sync::broadcast::channel(1024).0,
            held: Mutex::default(),
            health: Mutex::new(Err("not connected yet".into())),
            redact,
        });
        tokio::spawn(listen(Arc::downgrade(&store), client));
        tokio::spawn(heartbeat(Arc::downgrade(&store)));
        Ok(store)
    }

    fn k(&self, key: &SessionKey, suffix: &str) -> String {
        format!("{}{}{}", self.prefix, key.as_str(), suffix)
    }

    fn ttl_ms(&self, key: &SessionKey) -> u64 {
        self.ttl.of(key).as_millis() as u64
    }

    /// Records the outcome of a command for readiness.
    fn seen<T>(&self, r: ::redis::RedisResult<T>) -> Result<T, SessionStoreError> {
        let out = r.map_err(|e| redacted(&self.redact, &e));
        let health = out.as_ref().map(|_| ()).map_err(|e| e.0.clone());
        if let Ok(mut h) = self.health.lock() {
            if h.is_ok() && health.is_err() {
                tracing::warn!(
                    error = health.as_ref().err().map(String::as_str).unwrap_or(""),
                    "session store unreachable"
                );
            } else if h.is_err() && health.is_ok() {
                tracing::info!("session store reachable");
            }
            *h = health;
        }
        out
    }

    async fn claim(&self, keys: Vec<SessionKey>) -> Result<(), SessionStoreError> {
        if keys.is_empty() {
            return Ok(());
        }
        let expiry = now_ms() + HOLD_TTL.as_millis() as u64;
        let mut pipe = ::redis::pipe();
        for key in &keys {
            let holders = self.k(key, ":holders");
            pipe.zadd(&holders, &self.replica, expiry).ignore();
            pipe.pexpire(&holders, 2 * HOLD_TTL.as_millis() as i64)
                .ignore();
            // A session whose stream is open stays alive between requests.
            let ttl = self.ttl_ms(key) as i64;
            pipe.pexpire(self.k(key, ""), ttl).ignore();
            pipe.pexpire(self.k(key, ":loaded"), ttl).ignore();
        }
        let mut conn = self.conn.clone();
        self.seen(pipe.query_async::<()>(&mut conn).await)
    }
}

/// A notice as published on the channel.
#[derive(serde::Deserialize)]
struct Wire {
    key: String,
    notice: Notice,
}

/// Receives notices from the channel (reconnecting while the store is down; notices published
/// meanwhile are lost, which costs a client at most one list_changed).
async fn listen(store: Weak<RedisSessionStore>, client: Client) {
    loop {
        let Some(channel) = store.upgrade().map(|s| s.channel.clone()) else {
            return;
        };
        let connected =
            tokio::time::timeout(Duration::from_secs(2), client.get_async_pubsub()).await;
        if let Ok(Ok(mut pubsub)) = connected
            && pubsub.subscribe(&channel).await.is_ok()
        {
            let mut messages = pubsub.on_message();
            while let Some(msg) = messages.next().await {
                let Some(s) = store.upgrade() else { return };
                let bytes = msg.get_payload_bytes();
                if bytes.len() > MAX_NOTICE_BYTES {
                    continue;
                }
                if let Ok(w) = serde_json::from_slice::<Wire>(bytes)
                    && let Some(key) = SessionKey::parse(&w.key)
                {
                    let _ = s.bus.send((key, w.notice));
                }
            }
        }
        if store.upgrade().is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Pings the store and refreshes this replica's stream claims.
async fn heartbeat(store: Weak<RedisSessionStore>) {
    loop {
        let Some(s) = store.upgrade() else { return };
        let held: Vec<SessionKey> = s
            .held
            .lock()
            .map(|h| h.keys().cloned().collect())
            .unwrap_or_default();
        if held.is_empty() {
            let mut conn = s.conn.clone();
            let _ = s.seen(::redis::cmd("PING").query_async::<String>(&mut conn).await);
        } else {
            let _ = s.claim(held).await;
        }
        drop(s);
        tokio::time::sleep(HEARTBEAT).await;
    }
}

impl SessionStore for RedisSessionStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn create(&self, key: &SessionKey, record: &SessionRecord) -> StoreFuture<'_, bool> {
        let (k, ttl) = (self.k(key, ""), self.ttl_ms(key));
        let json = serde_json::to_string(record).unwrap_or_default();
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let r = self
                .scripts
                .create
                .key(k)
                .arg(json)
                .arg(ttl)
                .arg(now_ms())
                .invoke_async::<i64>(&mut conn)
                .await;
            Ok(self.seen(r)? == 1)
        })
    }

    fn fetch(&self, key: &SessionKey) -> StoreFuture<'_, Option<Fetched>> {
        let (rec, loaded, pending) = (
            self.k(key, ""),
            self.k(key, ":loaded"),
            self.k(key, ":pending"),
        );
        let ttl = self.ttl_ms(key);
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let r = self
                .scripts
                .fetch
                .key(rec)
                .key(loaded)
                .key(pending)
                .arg(ttl)
                .arg(now_ms())
                .invoke_async::<Option<(String, Vec<String>, i64)>>(&mut conn)
                .await;
            let Some((json, loaded, pending)) = self.seen(r)? else {
                return Ok(None);
            };
            let record: SessionRecord = serde_json::from_str(&json)
                .map_err(|_| SessionStoreError("unreadable session record".into()))?;
            Ok(Some(Fetched {
                record,
                loaded: loaded.into_iter().collect(),
                pending: pending == 1,
            }))
        })
    }

    fn read(&self, key: &SessionKey) -> StoreFuture<'_, Option<SessionRecord>> {
        let k = self.k(key, "");
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let r = ::redis::cmd("HGET")
                .arg(k)
                .arg("record")
                .query_async::<Option<String>>(&mut conn)
                .await;
            match self.seen(r)? {
                None => Ok(None),
                Some(json) => serde_json::from_str(&json)
                    .map(Some)
                    .map_err(|_| SessionStoreError("unreadable session record".into())),
            }
        })
    }

    fn change_loaded(
        &self,
        key: &SessionKey,
        add: Vec<String>,
        remove: Vec<String>,
    ) -> StoreFuture<'_, BTreeSet<String>> {
        let (loaded, rec, ttl) = (self.k(key, ":loaded"), self.k(key, ""), self.ttl_ms(key));
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let mut inv = self.scripts.change.key(loaded);
            inv.key(rec).arg(ttl).arg(add.len());
            for a in &add {
                inv.arg(a);
            }
            for r in &remove {
                inv.arg(r);
            }
            let r = inv.invoke_async::<Vec<String>>(&mut conn).await;
            Ok(self.seen(r)?.into_iter().collect())
        })
    }

    fn remove(&self, key: &SessionKey) -> StoreFuture<'_, ()> {
        let keys = [
            self.k(key, ""),
            self.k(key, ":loaded"),
            self.k(key, ":pending"),
            self.k(key, ":holders"),
        ];
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let r = ::redis::cmd("DEL")
                .arg(&keys[..])
                .query_async::<i64>(&mut conn)
                .await;
            self.seen(r).map(|_| ())
        })
    }

    fn notify(&self, key: &SessionKey, notice: Notice) -> StoreFuture<'_, bool> {
        let (holders, pending, ttl) = (
            self.k(key, ":holders"),
            self.k(key, ":pending"),
            self.ttl_ms(key),
        );
        let message = serde_json::json!({"key": key.as_str(), "notice": notice}).to_string();
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let r = self
                .scripts
                .notify
                .key(holders)
                .key(pending)
                .arg(now_ms())
                .arg(&self.channel)
                .arg(message)
                .arg(ttl)
                .invoke_async::<i64>(&mut conn)
                .await;
            Ok(self.seen(r)? == 1)
        })
    }

    fn hold(&self, key: &SessionKey, holding: bool) -> StoreFuture<'_, ()> {
        let key = key.clone();
        Box::pin(async move {
            let (first, last) = {
                let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
                let n = held.entry(key.clone()).or_default();
                let before = *n;
                if holding {
                    *n += 1;
                } else {
                    *n = n.saturating_sub(1);
                }
                let after = *n;
                if after == 0 {
                    held.remove(&key);
                }
                (before == 0 && after > 0, before > 0 && after == 0)
            };
            if first {
                self.claim(vec![key]).await?;
            } else if last {
                let mut conn = self.conn.clone();
                let r = ::redis::cmd("ZREM")
                    .arg(self.k(&key, ":holders"))
                    .arg(&self.replica)
                    .query_async::<i64>(&mut conn)
                    .await;
                self.seen(r)?;
            }
            Ok(())
        })
    }

    fn notices(&self) -> tokio::sync::broadcast::Receiver<(SessionKey, Notice)> {
        self.bus.subscribe()
    }

    fn health(&self) -> Result<(), String> {
        self.health
            .lock()
            .map(|h| h.clone())
            .unwrap_or_else(|_| Err("poisoned".into()))
    }
}
