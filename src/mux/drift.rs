//! The drift guard in the multiplexer: what each child's part of the view is built from
//! ([`crate::catalog::drift`] decides), and approvals.

use super::Refusal;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::catalog::ChildCatalog;
use crate::catalog::drift::{self, DriftStatus, Serve};
use crate::config::DriftPolicy;

use super::caller::{Caller, Operation};
use super::{FleetState, Multiplexer, MuxError};

/// One child's part of the view after the drift guard.
pub(super) struct Guarded {
    /// What is served (live, approved, or empty).
    pub catalog: Arc<ChildCatalog>,
    /// The child's live fingerprint (what the view is current with).
    pub live_digest: String,
    /// A digest of what is served (the live or approved fingerprint, or a block marker).
    pub served_digest: String,
    /// Served tools (original names) whose calls are refused.
    pub held: BTreeSet<String>,
    /// Drift state (`None` with the policy `off`).
    pub status: Option<DriftStatus>,
}

impl Multiplexer {
    /// The drift policy in force for a child: its entry's, else the gateway default.
    pub fn drift_policy(&self, spec: &crate::config::ChildSpec) -> DriftPolicy {
        spec.drift_policy.unwrap_or(self.settings.drift_policy)
    }

    /// Applies every child's drift policy to its live catalog (and records first sightings).
    pub(super) fn guard(
        &self,
        fleet: &FleetState,
        live: BTreeMap<String, (Arc<ChildCatalog>, String)>,
    ) -> BTreeMap<String, Guarded> {
        live.into_iter()
            .map(|(server, (catalog, digest))| {
                let Some(child) = fleet.children.get(&server) else {
                    return (server, passthrough(catalog, digest));
                };
                let spec = child.spec();
                let policy = self.drift_policy(spec);
                if policy == DriftPolicy::Off {
                    return (server, passthrough(catalog, digest));
                }
                let recorded = self.approvals.get(&server);
                // A family the child could not list this time is judged as approved.
                let filled = drift::with_approved_families(
                    &catalog,
                    recorded.as_ref().and_then(|r| r.catalog.as_deref()),
                );
                let (judged, judged_digest) = match &filled {
                    Some(c) => (c, c.fingerprint()),
                    None => (&*catalog, digest.clone()),
                };
                let decision = drift::decide(
                    policy,
                    spec.approved_digest.as_deref(),
                    recorded.as_ref(),
                    judged,
                    &judged_digest,
                );
                if decision.record_live {
                    match self.approvals.record(&server, &digest, catalog.clone()) {
                        Ok(()) => tracing::info!(server, digest, "drift: catalog approved on first sight"),
                        Err(e) => tracing::warn!(server, error = %e, "drift: cannot record the approved catalog"),
                    }
                }
                if let Some(s) = decision.status.as_ref().filter(|s| {
                    s.state != "approved"
                        && self
                            .approvals
                            .first_report(&server, s.pending_digest.as_deref().unwrap_or(""))
                }) {
                    tracing::warn!(
                        server,
                        policy = ?s.policy,
                        approved = s.approved_digest.as_deref().unwrap_or(""),
                        pending = s.pending_digest.as_deref().unwrap_or(""),
                        "drift: the child's catalog differs from the approved one"
                    );
                }
                // The approved content hashes to the approved digest (checked when read).
                let approved = decision
                    .status
                    .as_ref()
                    .and_then(|s| s.approved_digest.clone());
                let (served, served_digest) = match decision.serve {
                    Serve::Live => (catalog, digest.clone()),
                    Serve::Approved(c) => (c, approved.unwrap_or_default()),
                    Serve::Nothing => (Arc::new(ChildCatalog::default()), "drift-blocked".into()),
                };
                (
                    server,
                    Guarded {
                        catalog: served,
                        live_digest: digest,
                        served_digest,
                        held: decision.held,
                        status: decision.status,
                    },
                )
            })
            .collect()
    }

    /// Approves `server`'s live catalog (scope manage): `digest` must be the pending digest
    /// status shows. Records it, rebuilds the view and publishes a new catalog generation.
    pub async fn approve(
        &self,
        caller: &Caller,
        server: &str,
        digest: &str,
    ) -> Result<serde_json::Value, MuxError> {
        caller.authorize(Operation::Approve)?;
        let fleet = self.fleet();
        let Some(child) = fleet.children.get(server).filter(|c| caller.sees(c.spec())) else {
            return Err(MuxError::refused(
                Refusal::ServerNotInFleet,
                format!("'{server}' is not in the catalog"),
            ));
        };
        let spec = child.spec();
        if self.drift_policy(spec) == DriftPolicy::Off {
            return Err(MuxError::refused(
                Refusal::DriftGuardOff,
                format!("'{server}' has driftPolicy off: there is nothing to approve"),
            ));
        }
        if spec.approved_digest.is_some() {
            return Err(MuxError::refused(
                Refusal::DriftApprovalPinned,
                format!("'{server}' pins approvedDigest in the fleet: change the entry to approve"),
            ));
        }
        let status = child.status();
        let (Some(catalog), Some(live)) = (status.catalog, status.fingerprint) else {
            return Err(MuxError::refused(
                Refusal::NothingToApprove,
                format!("'{server}' has no catalog to approve yet"),
            ));
        };
        if !digest.eq_ignore_ascii_case(&live) {
            return Err(MuxError::refused(
                Refusal::DriftDigestMismatch,
                format!("the live catalog digest of '{server}' is {live}, not the one approved"),
            ));
        }
        self.approvals
            .record(server, &live, catalog)
            .map_err(|e| MuxError::refused(Refusal::DriftApprovalUnrecorded, e.to_string()))?;
        tracing::info!(server, digest = %live, "drift: catalog approved");
        self.rebuild_view().await;
        let published = self.publish_current().await;
        let mut answer = serde_json::json!({
            "server": server,
            "approved_digest": live,
        });
        match published {
            Ok(p) => {
                answer["catalog_generation"] = p.generation.into();
                answer["snapshot_digest"] = p.digest.into();
                answer["published"] = p.changed.into();
            }
            Err(r) => {
                answer["published"] = false.into();
                answer["publication_refused"] = r.code.as_str().into();
            }
        }
        Ok(answer)
    }
}

fn passthrough(catalog: Arc<ChildCatalog>, digest: String) -> Guarded {
    Guarded {
        catalog,
        served_digest: digest.clone(),
        live_digest: digest,
        held: BTreeSet::new(),
        status: None,
    }
}
