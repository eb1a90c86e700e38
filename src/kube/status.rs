//! The McpFleet status writer. One replica writes: the one that serves the published generation
//! and holds the short status Lease `<fleet>-status-writer` (renewed every tick, released on
//! shutdown; a replica that crashed loses it after one lease period and a follower takes over).
//! Writes use server-side apply with one field manager (`graph-os`) and skip writes whose only
//! difference would be timestamps, so there is no status churn.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use super::crd::{ChildStatusEntry, FleetCondition, McpFleet, McpFleetStatus};
use super::source::FleetRef;
use crate::child::ChildState;
use crate::mux::Multiplexer;

/// The field manager of every status write.
pub const FIELD_MANAGER: &str = "graph-os";

fn condition(
    type_: &str,
    on: bool,
    reason: &str,
    message: String,
    observed: i64,
) -> FleetCondition {
    FleetCondition {
        type_: type_.into(),
        status: if on { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        last_transition_time: String::new(),
        observed_generation: observed,
    }
}

/// The status this replica would report now (timestamps left empty).
pub fn compute(mux: &Multiplexer, observed: i64) -> McpFleetStatus {
    let fleet = mux.fleet();
    let view = mux.view();
    let served = mux.reconciler().served();
    let mut children = std::collections::BTreeMap::new();
    let (mut starting, mut failed) = (Vec::new(), Vec::new());
    for (name, child) in &fleet.children {
        let s = child.status();
        match s.state {
            ChildState::Starting | ChildState::Restarting => starting.push(name.clone()),
            ChildState::Failed => failed.push(name.clone()),
            ChildState::Up => {}
        }
        children.insert(
            name.clone(),
            ChildStatusEntry {
                state: format!("{:?}", s.state).to_lowercase(),
                tools: view.tools.values().filter(|t| &t.server == name).count() as u32,
                error_code: s.last_error.map(|e| e.code),
                drift: view.drift.get(name).map(|d| d.state.to_string()),
                pending_digest: view.drift.get(name).and_then(|d| d.pending_digest.clone()),
            },
        );
    }
    let reload = mux.reload_error();
    let degraded_reason = if reload.is_some() {
        "SpecRejected"
    } else if !failed.is_empty() {
        "ChildFailed"
    } else {
        "AsExpected"
    };
    let degraded_message = match &reload {
        Some(issues) => issues
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join("; "),
        None if !failed.is_empty() => format!("failed children: {}", failed.join(", ")),
        None => String::new(),
    };
    let ready = reload.is_none() && starting.is_empty() && failed.is_empty();
    McpFleetStatus {
        conditions: vec![
            condition(
                "Ready",
                ready,
                if ready {
                    "AllChildrenUp"
                } else {
                    "NotAllChildrenUp"
                },
                String::new(),
                observed,
            ),
            condition(
                "Degraded",
                reload.is_some() || !failed.is_empty(),
                degraded_reason,
                degraded_message,
                observed,
            ),
            condition(
                "Progressing",
                !starting.is_empty(),
                if starting.is_empty() {
                    "Settled"
                } else {
                    "ChildrenStarting"
                },
                starting.join(", "),
                observed,
            ),
        ],
        observed_generation: observed,
        catalog_generation: served.generation,
        snapshot_digest_short: served.snapshot.digest.chars().take(12).collect(),
        snapshot_digest: served.snapshot.digest.clone(),
        child_count: fleet.children.len() as u32,
        children,
        writer: Some(mux.reconciler().replica().to_string()),
    }
}

fn without_times(mut s: McpFleetStatus) -> McpFleetStatus {
    for c in &mut s.conditions {
        c.last_transition_time = String::new();
    }
    s
}

/// How long the status Lease is held without renewal.
pub const STATUS_LEASE: Duration = Duration::from_secs(10);

/// The status-writer Lease of one fleet, held by at most one live replica.
struct StatusLease {
    api: Api<Lease>,
    name: String,
    me: String,
}

impl StatusLease {
    /// Takes or renews the Lease; `false` when another live replica holds it.
    async fn hold(&self) -> Result<bool, kube::Error> {
        let now = k8s_openapi::jiff::Timestamp::now();
        let current = self.api.get_opt(&self.name).await?;
        if let Some(lease) = &current {
            let spec = lease.spec.clone().unwrap_or_default();
            let mine = spec.holder_identity.as_deref() == Some(self.me.as_str());
            let expired = match (spec.renew_time, spec.lease_duration_seconds) {
                (Some(MicroTime(renewed)), Some(secs)) => {
                    now.duration_since(renewed)
                        > k8s_openapi::jiff::SignedDuration::from_secs(secs as i64)
                }
                _ => true,
            };
            if !mine && spec.holder_identity.is_some() && !expired {
                return Ok(false);
            }
        }
        let mut lease = current.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..Default::default()
            },
            spec: None,
        });
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.me.as_str()) {
            spec.acquire_time = Some(MicroTime(now));
        }
        spec.holder_identity = Some(self.me.clone());
        spec.lease_duration_seconds = Some(STATUS_LEASE.as_secs() as i32);
        spec.renew_time = Some(MicroTime(now));
        let written = if lease.metadata.resource_version.is_some() {
            self.api
                .replace(&self.name, &PostParams::default(), &lease)
                .await
        } else {
            self.api.create(&PostParams::default(), &lease).await
        };
        match written {
            Ok(_) => Ok(true),
            // Someone else wrote first (409): not ours this round.
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up (only if held), so a follower takes over at once.
    async fn release(&self) {
        if let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await
            && let Some(spec) = lease.spec.as_mut()
            && spec.holder_identity.as_deref() == Some(self.me.as_str())
        {
            spec.holder_identity = None;
            spec.renew_time = None;
            let _ = self
                .api
                .replace(&self.name, &PostParams::default(), &lease)
                .await;
        }
    }
}

/// The running status writer; [`StatusWriter::stop`] releases the status Lease.
pub struct StatusWriter {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl StatusWriter {
    /// Stops writing and releases the status Lease (bounded: a few seconds at most).
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

/// Keeps the McpFleet status current while this replica serves the published generation and
/// holds the status Lease.
pub fn spawn(
    client: Client,
    fleet: FleetRef,
    mux: Arc<Multiplexer>,
    observed: Arc<AtomicI64>,
) -> StatusWriter {
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let task = tokio::spawn(async move {
        let lease = StatusLease {
            api: Api::namespaced(client.clone(), &fleet.namespace),
            name: format!("{}-status-writer", fleet.name),
            me: mux.reconciler().replica().to_string(),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(
            client,
            &fleet.namespace,
            &ApiResource::erase::<McpFleet>(&()),
        );
        // The last status written (with its transition times).
        let mut written: Option<McpFleetStatus> = None;
        let mut holding = false;
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stopped.cancelled() => {
                    if holding {
                        lease.release().await;
                    }
                    return;
                }
            }
            // Eligible: serving a published generation this replica can reproduce.
            let eligible =
                mux.reconciler().served().generation >= 1 && mux.follow_error().is_none();
            if !eligible {
                if holding {
                    lease.release().await;
                    holding = false;
                }
                continue;
            }
            match lease.hold().await {
                Ok(true) => {
                    if !holding {
                        tracing::info!(fleet = %fleet, "status writer: holding the status lease");
                        // A new writer writes at once, whatever the last writer wrote.
                        written = None;
                    }
                    holding = true;
                }
                Ok(false) => {
                    holding = false;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(fleet = %fleet, error = %e, "status lease unavailable");
                    holding = false;
                    continue;
                }
            }
            let mut status = compute(&mux, observed.load(Ordering::SeqCst));
            if written.clone().map(without_times).as_ref() == Some(&status) {
                continue;
            }
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            for c in &mut status.conditions {
                // A condition keeps its transition time while its status is unchanged.
                let prior = written
                    .as_ref()
                    .and_then(|w| w.conditions.iter().find(|p| p.type_ == c.type_));
                c.last_transition_time = match prior {
                    Some(p) if p.status == c.status => p.last_transition_time.clone(),
                    _ => now.clone(),
                };
            }
            let patch = serde_json::json!({"apiVersion": "graphos.dev/v1alpha1", "kind": "McpFleet", "status": status});
            match api
                .patch_status(
                    &fleet.name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&patch),
                )
                .await
            {
                Ok(_) => written = Some(status),
                Err(e) => tracing::warn!(fleet = %fleet, error = %e, "status write failed"),
            }
        }
    });
    StatusWriter { stop, task }
}
