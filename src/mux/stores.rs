//! What the multiplexer keeps beyond its own life, opened before it starts (by the composition
//! root, `gateway::build`, or by [`Multiplexer::start`] for the state directory alone): the
//! catalog generation record, the knowledge-graph projection and the drift approvals.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Multiplexer, StartupError};
use crate::catalog::store::{FileStore, GenerationStore};
use crate::projection::SqliteProjection;

/// The multiplexer's stores.
pub struct Stores {
    /// The catalog generation record and replica heartbeats (a file store in the state
    /// directory, or Leases).
    pub generations: Arc<dyn GenerationStore>,
    /// The knowledge-graph projection.
    pub projection: SqliteProjection,
    /// Where approved catalogs are recorded (the directory actually used).
    pub approvals: PathBuf,
}

impl Stores {
    /// The stores of `state_dir`; when it cannot be used, of a fallback under the temporary
    /// directory (logged); when neither can, a typed startup error.
    pub fn open(state_dir: &Path) -> Result<Stores, StartupError> {
        let (store, dir) = match FileStore::open(state_dir) {
            Ok(store) => (store, state_dir.to_path_buf()),
            Err(e) => {
                let tmp =
                    std::env::temp_dir().join(format!("graph-os-state-{}", std::process::id()));
                tracing::error!(dir = %state_dir.display(), error = %e, fallback = %tmp.display(), "state directory unusable");
                let fallback = FileStore::open(&tmp).map_err(|f| StartupError::StateDir {
                    dir: state_dir.display().to_string(),
                    reason: e.to_string(),
                    fallback: tmp.display().to_string(),
                    fallback_reason: f.to_string(),
                })?;
                (fallback, tmp)
            }
        };
        Ok(Stores {
            generations: Arc::new(store),
            projection: SqliteProjection::new(dir.join("projection.sqlite")),
            approvals: dir,
        })
    }

    /// The same stores with the generation record kept in `generations` (e.g. Leases).
    pub fn with_generations(self, generations: Arc<dyn GenerationStore>) -> Stores {
        Stores {
            generations,
            ..self
        }
    }
}

impl Multiplexer {
    /// Starts every child of `fleet` in the background and returns at once, with its stores
    /// in the state directory of `settings`.
    pub fn start(
        fleet: crate::config::Fleet,
        settings: super::MuxSettings,
    ) -> Result<Arc<Self>, StartupError> {
        let stores = Stores::open(&settings.state_dir)?;
        Ok(Self::start_with(fleet, settings, stores))
    }
}
