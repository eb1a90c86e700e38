//! The reconciler: the only authority for published snapshots, generations and digests.
//!
//! Publication is all-or-nothing: the caller hands over a complete candidate (already probed
//! under one deadline and validated); the reconciler asks the projection writer for an exact
//! acknowledgement, checks the replica cohort, compare-and-swaps the generation record, and
//! only then swaps the served snapshot. Unchanged content keeps the generation; changed content
//! advances it by exactly one. Any failure leaves the served identity and the record untouched.

use std::sync::{Arc, RwLock};

use serde::Serialize;

use super::snapshot::Snapshot;
use super::store::{
    Cas, GenerationRecord, GenerationStore, HEARTBEAT_TTL, Heartbeat, cohort_check, now_ms,
};
use super::writer::ProjectionWriter;
use crate::digest::{canonical_json, sha256_hex};

/// Stable contract codes of refresh and dispatch (one closed set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ContractCode {
    /// The caller lacks the scope.
    AuthorizationDenied,
    /// The request does not match the schema.
    RefreshRequestSchemaMismatch,
    /// The expected config revision is not the served one.
    ConfigRevisionStale,
    /// The expected generation is not the served one (or a CAS lost to another digest).
    CatalogGenerationStale,
    /// The expected digest is not the served one.
    CatalogDigestMismatch,
    /// A child is unavailable or a family could not be listed.
    CatalogSnapshotIncomplete,
    /// Probing did not finish before the deadline.
    RefreshDeadlineExceeded,
    /// The projection did not acknowledge exactly this candidate.
    ReingestionUnreconciled,
    /// A live replica diverges (release, config revision, or digest for the current generation).
    ReplicaGenerationDivergent,
    /// The dispatch target is not in the named snapshot (or its live route moved).
    DispatcherTargetNotVisible,
}

impl ContractCode {
    /// Whether retrying the same request may succeed.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ContractCode::CatalogSnapshotIncomplete
                | ContractCode::RefreshDeadlineExceeded
                | ContractCode::ReingestionUnreconciled
                | ContractCode::ReplicaGenerationDivergent
        )
    }

    /// The code as a string.
    pub fn as_str(self) -> &'static str {
        match self {
            ContractCode::AuthorizationDenied => "authorization-denied",
            ContractCode::RefreshRequestSchemaMismatch => "refresh-request-schema-mismatch",
            ContractCode::ConfigRevisionStale => "config-revision-stale",
            ContractCode::CatalogGenerationStale => "catalog-generation-stale",
            ContractCode::CatalogDigestMismatch => "catalog-digest-mismatch",
            ContractCode::CatalogSnapshotIncomplete => "catalog-snapshot-incomplete",
            ContractCode::RefreshDeadlineExceeded => "refresh-deadline-exceeded",
            ContractCode::ReingestionUnreconciled => "reingestion-unreconciled",
            ContractCode::ReplicaGenerationDivergent => "replica-generation-divergent",
            ContractCode::DispatcherTargetNotVisible => "dispatcher-target-not-visible",
        }
    }
}

/// A refusal with its code and a secret-free detail (logged, not returned).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {detail}", code.as_str())]
pub struct Refusal {
    /// Stable code.
    pub code: ContractCode,
    /// What happened.
    pub detail: String,
}

impl Refusal {
    /// A refusal.
    pub fn new(code: ContractCode, detail: impl Into<String>) -> Self {
        Refusal {
            code,
            detail: detail.into(),
        }
    }
}

/// The served generation.
#[derive(Debug, Clone)]
pub struct Served {
    /// Catalog generation (0 = nothing published yet).
    pub generation: u64,
    /// The snapshot.
    pub snapshot: Arc<Snapshot>,
}

/// What a publication did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// Generation served now.
    pub generation: u64,
    /// Digest served now.
    pub digest: String,
    /// Whether the served identity changed.
    pub changed: bool,
    /// SHA-256 over the identity and the projection acknowledgement (`None` when unchanged).
    pub receipt: Option<String>,
}

/// The reconciler of one replica.
pub struct Reconciler {
    store: Arc<dyn GenerationStore>,
    writer: Arc<dyn ProjectionWriter>,
    replica: String,
    release_id: String,
    served: RwLock<Served>,
    publish: tokio::sync::Mutex<()>,
    /// The generation this replica last published itself.
    published: std::sync::atomic::AtomicU64,
    /// The config revision this replica runs (what it would publish), reported in heartbeats:
    /// the cohort agrees on what replicas *run*, so replicas that all reloaded the same
    /// declaration can publish it even while each still serves the previous generation.
    declared: RwLock<String>,
    /// Whether this replica left the cohort (graceful shutdown). Held while a heartbeat is
    /// written, so a heartbeat racing the withdrawal cannot bring a leaving replica back: the
    /// others would wait for it, or refuse to publish, until its heartbeat expired.
    left: tokio::sync::Mutex<bool>,
}

impl Reconciler {
    /// A reconciler serving `initial` as generation 0 until something is published or adopted.
    pub fn new(
        store: Arc<dyn GenerationStore>,
        writer: Arc<dyn ProjectionWriter>,
        replica: String,
        initial: Snapshot,
    ) -> Self {
        Reconciler {
            store,
            writer,
            replica,
            release_id: env!("CARGO_PKG_VERSION").into(),
            declared: RwLock::new(initial.config_revision.clone()),
            served: RwLock::new(Served {
                generation: 0,
                snapshot: Arc::new(initial),
            }),
            publish: tokio::sync::Mutex::new(()),
            published: std::sync::atomic::AtomicU64::new(0),
            left: tokio::sync::Mutex::new(false),
        }
    }

    /// The served generation and snapshot.
    pub fn served(&self) -> Served {
        self.served
            .read()
            .map(|s| s.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// This replica's id.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// This replica's release.
    pub fn release_id(&self) -> &str {
        &self.release_id
    }

    fn serve(&self, generation: u64, snapshot: Snapshot) {
        if let Ok(mut s) = self.served.write() {
            *s = Served {
                generation,
                snapshot: Arc::new(snapshot),
            };
        }
    }

    /// Records the config revision this replica runs from now on (startup and every reload).
    pub fn declare(&self, config_revision: &str) {
        if let Ok(mut d) = self.declared.write() {
            config_revision.clone_into(&mut d);
        }
    }

    /// The config revision this replica runs.
    pub fn declared(&self) -> String {
        self.declared
            .read()
            .map(|d| d.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Whether this replica should publish its declaration itself: it serves another config
    /// revision than it runs, and no replica has published the one it runs yet (when one has,
    /// following adopts it, or reports why it cannot).
    ///
    /// Generation 0 (nothing published or adopted yet) counts as unpublished whatever revision
    /// its placeholder snapshot carries: a startup publication refused while a predecessor's
    /// heartbeat was still live is retried, not abandoned.
    pub async fn declaration_unpublished(&self) -> bool {
        let declared = self.declared();
        let served = self.served();
        if served.generation > 0 && served.snapshot.config_revision == declared {
            return false;
        }
        match self.store.read().await {
            Ok(Some(r)) => r.config_revision != declared,
            Ok(None) => true,
            Err(_) => false,
        }
    }

    /// Withdraws this replica's heartbeat for good (graceful shutdown): no later heartbeat or
    /// publication of this replica reaches the store.
    pub async fn leave(&self) -> Result<(), String> {
        let mut left = self.left.lock().await;
        *left = true;
        self.store
            .leave(&self.replica)
            .await
            .map_err(|e| e.to_string())
    }

    /// Writes this replica's heartbeat: the release and config revision it runs, and the
    /// generation and digest it serves.
    pub async fn heartbeat(&self) -> Result<(), String> {
        let left = self.left.lock().await;
        if *left {
            return Ok(());
        }
        let served = self.served();
        self.store
            .heartbeat(Heartbeat {
                replica: self.replica.clone(),
                release_id: self.release_id.clone(),
                config_revision: self.declared(),
                generation: served.generation,
                digest: served.snapshot.digest.clone(),
                renewed_at: now_ms(),
                ttl: HEARTBEAT_TTL.as_secs(),
            })
            .await
            .map_err(|e| e.to_string())
    }

    /// Follows the record: a newer generation whose digest the candidate reproduces is
    /// adopted. The candidate is built (by `candidate`) only when the record moved. Returns the
    /// reason when the record names content this replica cannot reproduce.
    pub async fn follow(&self, candidate: impl FnOnce() -> Option<Snapshot>) -> Result<(), String> {
        let _guard = self.publish.lock().await;
        let record = self.store.read().await.map_err(|e| e.to_string())?;
        let served = self.served();
        match record {
            Some(r)
                if r.generation > served.generation
                    || (r.generation == served.generation
                        && r.digest != served.snapshot.digest) =>
            {
                let Some(candidate) = candidate() else {
                    return Err("no candidate could be built".into());
                };
                if r.digest == candidate.digest {
                    self.serve(r.generation, candidate);
                    Ok(())
                } else {
                    Err(format!(
                        "generation {} was published with content this replica cannot reproduce",
                        r.generation
                    ))
                }
            }
            _ => Ok(()),
        }
    }

    /// Publishes a complete, validated candidate.
    pub async fn publish(&self, candidate: Snapshot) -> Result<Published, Refusal> {
        let _guard = self.publish.lock().await;
        if *self.left.lock().await {
            return Err(Refusal::new(
                ContractCode::ReplicaGenerationDivergent,
                "this replica left the cohort (shutting down)",
            ));
        }
        let served = self.served();
        let record = self
            .store
            .read()
            .await
            .map_err(|e| Refusal::new(ContractCode::ReingestionUnreconciled, e.to_string()))?;
        let recorded_generation = record.as_ref().map_or(0, |r| r.generation);
        if candidate.digest == served.snapshot.digest && served.generation >= recorded_generation {
            return Ok(Published {
                generation: served.generation,
                digest: served.snapshot.digest.clone(),
                changed: false,
                receipt: None,
            });
        }
        if let Some(r) = &record
            && r.digest == candidate.digest
        {
            // Another replica already published exactly this content: adopt it.
            let generation = r.generation;
            self.serve(generation, candidate);
            return Ok(Published {
                generation,
                digest: r.digest.clone(),
                changed: true,
                receipt: None,
            });
        }
        let next = recorded_generation.max(served.generation) + 1;
        // The cohort is checked before anything is written, so a refused candidate leaves the
        // projection untouched.
        let replicas =
            self.store.replicas().await.map_err(|e| {
                Refusal::new(ContractCode::ReplicaGenerationDivergent, e.to_string())
            })?;
        cohort_check(
            &self.replica,
            &self.release_id,
            &candidate.config_revision,
            record.as_ref(),
            &replicas,
            now_ms(),
        )
        .map_err(|d| Refusal::new(ContractCode::ReplicaGenerationDivergent, d.to_string()))?;
        let ack = self
            .writer
            .project(next, &candidate)
            .await
            .map_err(|e| Refusal::new(ContractCode::ReingestionUnreconciled, e))?;
        if ack.generation != next || ack.digest != candidate.digest {
            return Err(Refusal::new(
                ContractCode::ReingestionUnreconciled,
                "the projection acknowledged another candidate",
            ));
        }
        let new = GenerationRecord {
            generation: next,
            digest: candidate.digest.clone(),
            config_revision: candidate.config_revision.clone(),
            release_id: self.release_id.clone(),
            publisher: self.replica.clone(),
            updated_at: now_ms(),
        };
        let cas = self.store.compare_and_swap(record, new).await;
        let published_by_someone = match &cas {
            Ok(Cas::Swapped) => true,
            // Another replica won with exactly this content: the projected rows are its too.
            Ok(Cas::Conflict(Some(current))) => {
                current.generation == next && current.digest == candidate.digest
            }
            _ => false,
        };
        if !published_by_someone {
            // Not published: take the projected generation back out.
            if let Err(e) = self.writer.retract(next, &candidate.digest).await {
                tracing::warn!(generation = next, error = %e, "could not retract an unpublished projection");
            }
        }
        match cas {
            Ok(Cas::Swapped) => {}
            Ok(Cas::Conflict(Some(current))) if current.digest == candidate.digest => {
                let generation = current.generation;
                self.serve(generation, candidate);
                return Ok(Published {
                    generation,
                    digest: current.digest,
                    changed: true,
                    receipt: None,
                });
            }
            Ok(Cas::Conflict(_)) => {
                return Err(Refusal::new(
                    ContractCode::CatalogGenerationStale,
                    "another replica published first",
                ));
            }
            Err(e) => {
                return Err(Refusal::new(
                    ContractCode::ReingestionUnreconciled,
                    e.to_string(),
                ));
            }
        }
        let digest = candidate.digest.clone();
        if let Err(e) = self.writer.confirm(next, &digest).await {
            // Published all the same (the record is the authority); questions keep answering
            // from the last confirmed generation until the next publication.
            tracing::warn!(generation = next, error = %e, "could not mark the projection published");
        }
        let receipt = sha256_hex(
            canonical_json(&serde_json::json!({
                "identity": {"release_id": self.release_id, "config_revision": candidate.config_revision, "catalog_generation": next, "snapshot_digest": digest},
                "writer_result": {"status": "ok", "catalog_generation": ack.generation, "snapshot_digest": ack.digest},
            }))
            .as_bytes(),
        );
        self.serve(next, candidate);
        self.published
            .store(next, std::sync::atomic::Ordering::SeqCst);
        let _ = self.heartbeat().await;
        tracing::info!(generation = next, digest = %digest, "catalog generation published");
        Ok(Published {
            generation: next,
            digest,
            changed: true,
            receipt: Some(receipt),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::snapshot::{Family, SnapshotBuilder};
    use crate::catalog::store::{FileStore, StoreError};
    use crate::projection::SqliteProjection;
    use futures::future::BoxFuture;

    fn snapshot(config_revision: &str, tool: &str) -> Snapshot {
        let mut b = SnapshotBuilder::default();
        b.item("s", Family::Tools, tool, serde_json::json!({"name": tool}));
        b.build("test-release", config_revision).unwrap()
    }

    fn replica(
        store: Arc<dyn GenerationStore>,
        dir: &std::path::Path,
        id: &str,
        config_revision: &str,
    ) -> Reconciler {
        let writer = Arc::new(SqliteProjection::new(dir.join(format!("{id}.sqlite"))));
        Reconciler::new(store, writer, id.into(), snapshot(config_revision, "t0"))
    }

    #[tokio::test]
    async fn a_startup_publication_refused_by_a_live_predecessor_stays_due_until_it_publishes() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn GenerationStore> = Arc::new(FileStore::open(dir.path()).unwrap());
        // A predecessor killed without leaving: its heartbeat (another revision) is still live.
        let killed = replica(store.clone(), dir.path(), "killed", "c1");
        killed.heartbeat().await.unwrap();
        let new = replica(store.clone(), dir.path(), "new", "c2");
        let refused = new.publish(snapshot("c2", "t1")).await.unwrap_err();
        assert_eq!(refused.code, ContractCode::ReplicaGenerationDivergent);
        // Serving its placeholder (generation 0, already carrying c2), it still owes a publication.
        assert_eq!(new.served().generation, 0);
        assert!(new.declaration_unpublished().await);
        store.leave("killed").await.unwrap(); // the heartbeat expired
        assert_eq!(
            new.publish(snapshot("c2", "t1")).await.unwrap().generation,
            1
        );
        assert!(!new.declaration_unpublished().await);
    }

    #[tokio::test]
    async fn a_replica_that_left_is_never_waited_for_even_when_a_heartbeat_races_its_leaving() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn GenerationStore> = Arc::new(FileStore::open(dir.path()).unwrap());
        let old = replica(store.clone(), dir.path(), "old", "c1");
        old.heartbeat().await.unwrap();
        old.leave().await.unwrap();
        // A tick of its background loop after the withdrawal writes nothing...
        old.heartbeat().await.unwrap();
        assert!(store.replicas().await.unwrap().is_empty());
        // ...and it publishes nothing any more.
        let refused = old.publish(snapshot("c1", "t1")).await.unwrap_err();
        assert_eq!(refused.code, ContractCode::ReplicaGenerationDivergent);
        // Its successor, declaring another revision over the same state, publishes at once.
        let new = replica(store.clone(), dir.path(), "new", "c2");
        assert_eq!(
            new.publish(snapshot("c2", "t1")).await.unwrap().generation,
            1
        );
    }

    #[tokio::test]
    async fn replicas_that_all_reloaded_publish_the_new_declaration_while_serving_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn GenerationStore> = Arc::new(FileStore::open(dir.path()).unwrap());
        let a = replica(store.clone(), dir.path(), "a", "c1");
        let b = replica(store.clone(), dir.path(), "b", "c1");
        a.heartbeat().await.unwrap();
        b.heartbeat().await.unwrap();
        assert_eq!(a.publish(snapshot("c1", "t1")).await.unwrap().generation, 1);
        b.follow(|| Some(snapshot("c1", "t1"))).await.unwrap();

        // Only `a` reloaded: the cohort refuses its declaration.
        a.declare("c2");
        a.heartbeat().await.unwrap();
        assert!(a.declaration_unpublished().await);
        let refused = a.publish(snapshot("c2", "t2")).await.unwrap_err();
        assert_eq!(refused.code, ContractCode::ReplicaGenerationDivergent);
        assert_eq!(a.served().generation, 1);

        // `b` reloaded too, still serving generation 1 of c1: the declaration publishes.
        b.declare("c2");
        b.heartbeat().await.unwrap();
        assert_eq!(b.served().snapshot.config_revision, "c1");
        let published = a.publish(snapshot("c2", "t2")).await.unwrap();
        assert_eq!(published.generation, 2);
        assert!(!a.declaration_unpublished().await);
        // `b` need not publish it itself: following adopts it.
        assert!(!b.declaration_unpublished().await);
        b.follow(|| Some(snapshot("c2", "t2"))).await.unwrap();
        assert_eq!(b.served().generation, 2);
    }

    /// A store where another replica wins every compare-and-swap with the same content.
    struct RaceLost(FileStore);

    impl GenerationStore for RaceLost {
        fn read(&self) -> BoxFuture<'_, Result<Option<GenerationRecord>, StoreError>> {
            self.0.read()
        }
        fn compare_and_swap(
            &self,
            expected: Option<GenerationRecord>,
            new: GenerationRecord,
        ) -> BoxFuture<'_, Result<Cas, StoreError>> {
            Box::pin(async move {
                let winner = GenerationRecord {
                    publisher: "winner".into(),
                    ..new
                };
                self.0.compare_and_swap(expected, winner.clone()).await?;
                Ok(Cas::Conflict(Some(winner)))
            })
        }
        fn heartbeat(&self, beat: Heartbeat) -> BoxFuture<'_, Result<(), StoreError>> {
            self.0.heartbeat(beat)
        }
        fn replicas(&self) -> BoxFuture<'_, Result<Vec<Heartbeat>, StoreError>> {
            self.0.replicas()
        }
        fn leave(&self, replica: &str) -> BoxFuture<'_, Result<(), StoreError>> {
            self.0.leave(replica)
        }
    }

    #[tokio::test]
    async fn losing_a_race_to_identical_content_keeps_the_shared_projection() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn GenerationStore> =
            Arc::new(RaceLost(FileStore::open(dir.path()).unwrap()));
        let writer = Arc::new(SqliteProjection::new(dir.path().join("shared.sqlite")));
        let r = Reconciler::new(store, writer.clone(), "loser".into(), snapshot("c1", "t0"));
        let candidate = snapshot("c1", "t1");
        let digest = candidate.digest.clone();
        let adopted = r.publish(candidate).await.unwrap();
        assert_eq!((adopted.generation, adopted.changed), (1, true));
        // The winner's confirmation still finds the rows both replicas projected.
        writer.confirm(1, &digest).await.unwrap();
        assert_eq!(writer.latest().unwrap().map(|a| a.generation), Some(1));
    }
}
