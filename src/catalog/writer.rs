//! The port publication writes through: a durable projection of each candidate, acknowledged
//! exactly (implemented by [`crate::projection::SqliteProjection`]). Defined here, beside the
//! reconciler that needs it, so the catalog imports nothing above it.

use futures::future::BoxFuture;
use serde::Serialize;

use super::snapshot::Snapshot;

/// An exact acknowledgement of a projected candidate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ack {
    /// Generation written.
    pub generation: u64,
    /// Digest written.
    pub digest: String,
}

/// Writes candidates somewhere durable and acknowledges them.
pub trait ProjectionWriter: Send + Sync {
    /// Projects `snapshot` as `generation`; returns the acknowledgement after a durable commit.
    fn project(
        &self,
        generation: u64,
        snapshot: &Snapshot,
    ) -> BoxFuture<'static, Result<Ack, String>>;
    /// Removes a projected generation that was not published after all (its CAS failed).
    fn retract(&self, generation: u64, digest: &str) -> BoxFuture<'static, Result<(), String>>;
    /// Marks `(generation, digest)` published (its CAS succeeded) and drops every other
    /// candidate projected for that generation.
    fn confirm(&self, generation: u64, digest: &str) -> BoxFuture<'static, Result<(), String>>;
}
