//! The McpFleet status writer. Only the replica that published the served generation writes;
//! it uses server-side apply with one field manager (`graph-os`) and skips writes whose only
//! difference would be timestamps, so there is no status churn.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};

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
    }
}

fn without_times(mut s: McpFleetStatus) -> McpFleetStatus {
    for c in &mut s.conditions {
        c.last_transition_time = String::new();
    }
    s
}

/// Keeps the McpFleet status current while this replica is the publisher.
pub fn spawn(client: Client, fleet: FleetRef, mux: Arc<Multiplexer>, observed: Arc<AtomicI64>) {
    tokio::spawn(async move {
        let api: Api<DynamicObject> = Api::namespaced_with(
            client,
            &fleet.namespace,
            &ApiResource::erase::<McpFleet>(&()),
        );
        // The last status written (with its transition times).
        let mut written: Option<McpFleetStatus> = None;
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        loop {
            tick.tick().await;
            if !mux.reconciler().is_publisher() {
                continue;
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
}
