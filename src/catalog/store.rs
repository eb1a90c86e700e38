//! Generation records: where the published catalog generation lives and how replicas agree.
//!
//! Design note: a [`GenerationStore`] holds one [`GenerationRecord`] (generation, digest, config
//! revision, release, publisher) changed only by compare-and-swap, plus one [`Heartbeat`] per
//! replica saying what it serves. The embedded [`FileStore`] keeps both in a state directory
//! (a lock file + atomic rename makes CAS safe across processes on one machine); the Kubernetes
//! store keeps them in Leases. The cohort rule ([`cohort_check`]) is shared by both.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

/// The published catalog generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerationRecord {
    /// Catalog generation (≥ 1 once anything was published).
    pub generation: u64,
    /// SHA-256 of the snapshot content.
    pub digest: String,
    /// Config revision the snapshot was built from.
    pub config_revision: String,
    /// Release of the publisher.
    pub release_id: String,
    /// Replica that published it.
    pub publisher: String,
    /// Unix milliseconds of publication.
    pub updated_at: u64,
}

/// What one replica serves, renewed periodically.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    /// Replica id.
    pub replica: String,
    /// Its release.
    pub release_id: String,
    /// The config revision it runs (not necessarily the one of the generation it serves).
    pub config_revision: String,
    /// The generation it serves.
    pub generation: u64,
    /// The digest it serves.
    pub digest: String,
    /// Unix milliseconds of the last renewal.
    pub renewed_at: u64,
    /// Seconds after `renewed_at` the heartbeat stays live.
    pub ttl: u64,
}

impl Heartbeat {
    /// Whether the heartbeat is live at `now_ms`.
    pub fn live(&self, now_ms: u64) -> bool {
        now_ms
            <= self
                .renewed_at
                .saturating_add(self.ttl.saturating_mul(1000))
    }
}

/// Outcome of a compare-and-swap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cas {
    /// The record was replaced.
    Swapped,
    /// The stored record was not the expected one; here is what is stored now.
    Conflict(Option<GenerationRecord>),
}

/// Store failures (I/O, corrupt data, API errors).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("generation store: {0}")]
pub struct StoreError(pub String);

/// Where generation records and replica heartbeats live.
pub trait GenerationStore: Send + Sync {
    /// The current record, if any.
    fn read(&self) -> BoxFuture<'_, Result<Option<GenerationRecord>, StoreError>>;
    /// Replaces the record if the stored one equals `expected` (by generation and digest).
    fn compare_and_swap(
        &self,
        expected: Option<GenerationRecord>,
        new: GenerationRecord,
    ) -> BoxFuture<'_, Result<Cas, StoreError>>;
    /// Writes this replica's heartbeat.
    fn heartbeat(&self, beat: Heartbeat) -> BoxFuture<'_, Result<(), StoreError>>;
    /// Every replica's heartbeat (live or not).
    fn replicas(&self) -> BoxFuture<'_, Result<Vec<Heartbeat>, StoreError>>;
    /// Withdraws this replica's heartbeat (a graceful shutdown: the cohort does not wait for it
    /// to expire before a restarted gateway with another declaration may publish).
    fn leave(&self, replica: &str) -> BoxFuture<'_, Result<(), StoreError>>;
}

/// Why the cohort refuses a publication.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("replica {replica} diverges: {reason}")]
pub struct Divergence {
    /// The diverging replica.
    pub replica: String,
    /// What differs.
    pub reason: String,
}

/// The cohort rule: every *other live* replica must run the same release and config revision,
/// and must not serve a different digest for the current generation.
pub fn cohort_check(
    me: &str,
    release_id: &str,
    config_revision: &str,
    current: Option<&GenerationRecord>,
    replicas: &[Heartbeat],
    now_ms: u64,
) -> Result<(), Divergence> {
    for r in replicas
        .iter()
        .filter(|r| r.replica != me && r.live(now_ms))
    {
        let diverge = |reason: String| Divergence {
            replica: r.replica.clone(),
            reason,
        };
        if r.release_id != release_id {
            return Err(diverge(format!(
                "runs release {} (this replica: {release_id})",
                r.release_id
            )));
        }
        if r.config_revision != config_revision {
            return Err(diverge("serves another config revision".into()));
        }
        if let Some(cur) = current
            && r.generation == cur.generation
            && r.digest != cur.digest
        {
            return Err(diverge(format!(
                "serves another digest for generation {}",
                cur.generation
            )));
        }
    }
    Ok(())
}

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The embedded store: `generation.json` and `replicas/<id>.json` in a state directory.
/// CAS holds an exclusive lock on `generation.lock` and replaces the record by atomic rename,
/// so several processes on one machine can share it.
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: PathBuf,
}

fn io(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!(
        "tmp.{}.{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&tmp, bytes)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn valid_replica_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 253
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

impl FileStore {
    /// Opens (creating) the store in `dir`.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let dir = dir.into();
        std::fs::create_dir_all(dir.join("replicas")).map_err(io)?;
        Ok(FileStore { dir })
    }

    fn record_path(&self) -> PathBuf {
        self.dir.join("generation.json")
    }

    fn read_sync(&self) -> Result<Option<GenerationRecord>, StoreError> {
        match std::fs::read(self.record_path()) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| StoreError(format!("corrupt generation record: {e}"))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(e)),
        }
    }

    fn cas_sync(
        &self,
        expected: Option<GenerationRecord>,
        new: GenerationRecord,
    ) -> Result<Cas, StoreError> {
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join("generation.lock"))
            .map_err(io)?;
        lock.lock().map_err(io)?;
        let current = self.read_sync()?;
        let same = |a: &Option<GenerationRecord>, b: &Option<GenerationRecord>| match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => a.generation == b.generation && a.digest == b.digest,
            _ => false,
        };
        let outcome = if same(&current, &expected) {
            let bytes = serde_json::to_vec_pretty(&new).map_err(io)?;
            write_atomic(&self.record_path(), &bytes).map_err(io)?;
            Cas::Swapped
        } else {
            Cas::Conflict(current)
        };
        lock.unlock().map_err(io)?;
        Ok(outcome)
    }
}

impl GenerationStore for FileStore {
    fn read(&self) -> BoxFuture<'_, Result<Option<GenerationRecord>, StoreError>> {
        let me = self.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || me.read_sync())
                .await
                .map_err(io)?
        })
    }

    fn compare_and_swap(
        &self,
        expected: Option<GenerationRecord>,
        new: GenerationRecord,
    ) -> BoxFuture<'_, Result<Cas, StoreError>> {
        let me = self.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || me.cas_sync(expected, new))
                .await
                .map_err(io)?
        })
    }

    fn heartbeat(&self, beat: Heartbeat) -> BoxFuture<'_, Result<(), StoreError>> {
        let path = self
            .dir
            .join("replicas")
            .join(format!("{}.json", beat.replica));
        Box::pin(async move {
            if !valid_replica_id(&beat.replica) {
                return Err(StoreError(format!("invalid replica id {:?}", beat.replica)));
            }
            let bytes = serde_json::to_vec_pretty(&beat).map_err(io)?;
            tokio::task::spawn_blocking(move || write_atomic(&path, &bytes))
                .await
                .map_err(io)?
                .map_err(io)
        })
    }

    fn leave(&self, replica: &str) -> BoxFuture<'_, Result<(), StoreError>> {
        let path = self.dir.join("replicas").join(format!("{replica}.json"));
        let valid = valid_replica_id(replica);
        Box::pin(async move {
            if !valid {
                return Ok(());
            }
            match tokio::fs::remove_file(&path).await {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(e)),
                _ => Ok(()),
            }
        })
    }

    fn replicas(&self) -> BoxFuture<'_, Result<Vec<Heartbeat>, StoreError>> {
        let dir = self.dir.join("replicas");
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let mut out = Vec::new();
                for entry in std::fs::read_dir(&dir).map_err(io)? {
                    let path = entry.map_err(io)?.path();
                    if path.extension().and_then(|e| e.to_str()) != Some("json") {
                        continue;
                    }
                    // A heartbeat being replaced may be missing for an instant; skip unreadable ones.
                    if let Ok(bytes) = std::fs::read(&path)
                        && let Ok(beat) = serde_json::from_slice::<Heartbeat>(&bytes)
                    {
                        out.push(beat);
                    }
                }
                out.sort_by(|a, b| a.replica.cmp(&b.replica));
                Ok(out)
            })
            .await
            .map_err(io)?
        })
    }
}

/// Default heartbeat time-to-live.
pub const HEARTBEAT_TTL: Duration = Duration::from_secs(15);

#[cfg(test)]
mod tests {
    use super::*;

    fn record(generation: u64, digest: &str) -> GenerationRecord {
        GenerationRecord {
            generation,
            digest: digest.into(),
            config_revision: "c".into(),
            release_id: "r".into(),
            publisher: "p".into(),
            updated_at: 1,
        }
    }

    #[tokio::test]
    async fn cas_replaces_only_the_expected_record() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(dir.path()).unwrap();
        assert_eq!(store.read().await.unwrap(), None);
        assert_eq!(
            store.compare_and_swap(None, record(1, "a")).await.unwrap(),
            Cas::Swapped
        );
        assert_eq!(
            store.compare_and_swap(None, record(1, "b")).await.unwrap(),
            Cas::Conflict(Some(record(1, "a")))
        );
        assert_eq!(
            store
                .compare_and_swap(Some(record(1, "a")), record(2, "b"))
                .await
                .unwrap(),
            Cas::Swapped
        );
        assert_eq!(store.read().await.unwrap(), Some(record(2, "b")));
    }

    #[test]
    fn concurrent_processes_never_publish_two_digests_for_one_generation() {
        // Threads stand in for processes here (the lock is per open file description, so threads
        // contend exactly like processes); the multi-process test drives real graph-os binaries.
        let dir = tempfile::tempdir().unwrap();
        let winners = std::sync::Mutex::new(std::collections::BTreeMap::<
            u64,
            std::collections::BTreeSet<String>,
        >::new());
        std::thread::scope(|s| {
            for t in 0..6 {
                let store = FileStore::open(dir.path()).unwrap();
                let winners = &winners;
                s.spawn(move || {
                    for round in 0..200 {
                        let current = store.read_sync().unwrap();
                        let next = current.as_ref().map_or(1, |r| r.generation + 1);
                        let digest = format!("d{t}-{round}");
                        if store.cas_sync(current, record(next, &digest)).unwrap() == Cas::Swapped {
                            winners
                                .lock()
                                .unwrap()
                                .entry(next)
                                .or_default()
                                .insert(digest);
                        }
                    }
                });
            }
        });
        let winners = winners.into_inner().unwrap();
        assert!(!winners.is_empty());
        for (generation, digests) in &winners {
            assert_eq!(
                digests.len(),
                1,
                "generation {generation} published {digests:?}"
            );
        }
        let last = FileStore::open(dir.path())
            .unwrap()
            .read_sync()
            .unwrap()
            .unwrap();
        assert_eq!(last.generation as usize, winners.len());
    }

    #[test]
    fn cohort_rejects_other_release_config_or_digest_and_ignores_stale_replicas() {
        let cur = record(3, "d");
        let beat =
            |replica: &str, release: &str, config: &str, generation, digest: &str, renewed_at| {
                Heartbeat {
                    replica: replica.into(),
                    release_id: release.into(),
                    config_revision: config.into(),
                    generation,
                    digest: digest.into(),
                    renewed_at,
                    ttl: 15,
                }
            };
        let now = 100_000;
        let ok = |beats: &[Heartbeat]| cohort_check("me", "r", "c", Some(&cur), beats, now).is_ok();
        assert!(ok(&[beat("a", "r", "c", 3, "d", now)]));
        assert!(!ok(&[beat("a", "r2", "c", 3, "d", now)]), "other release");
        assert!(
            !ok(&[beat("a", "r", "c2", 3, "d", now)]),
            "other config revision"
        );
        assert!(
            !ok(&[beat("a", "r", "c", 3, "x", now)]),
            "other digest for the current generation"
        );
        assert!(
            ok(&[beat("a", "r", "c", 2, "x", now)]),
            "an older generation is fine"
        );
        assert!(
            ok(&[beat("a", "r2", "c", 3, "d", 1)]),
            "stale heartbeats are ignored"
        );
        assert!(
            ok(&[beat("me", "r2", "c", 3, "d", now)]),
            "this replica is not its own cohort"
        );
    }
}
