//! The fleet: one runtime per child, swapped whole on reload (entry by entry: added children
//! start, removed ones stop, changed ones restart, the rest are not touched), and what callers
//! may see of it (overviews, availability).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Serialize;

use super::{ChildState, Multiplexer, MuxEvents};
use crate::catalog::{self, naming};
use crate::child::{ChildEvents, ChildRuntime};
use crate::config::{ChildSpec, ConfigIssue, Fleet};

/// One child as the protocol layer may see it: state and counters, never the runtime.
#[derive(Debug, Clone, Serialize)]
pub struct ChildOverview {
    /// Server name.
    pub name: String,
    /// Lifecycle state.
    pub state: ChildState,
    /// Breaker state.
    pub breaker: crate::child::BreakerState,
    /// Calls holding a slot.
    pub in_flight: u64,
    /// Calls waiting for a slot.
    pub queued: u64,
    /// Tools in the served view.
    pub tools: usize,
    /// Open `per-session` connections.
    pub session_connections: usize,
}

/// Fleet facts kept for status and catalog answers.
#[derive(Debug, Clone, Serialize)]
pub struct FleetInfo {
    /// Where the fleet came from.
    pub source: String,
    /// Digest of the normalized declaration (references only, never secrets).
    pub config_revision: String,
    /// Config problems.
    pub issues: Vec<ConfigIssue>,
    /// Refused entries.
    pub refused: Vec<String>,
    /// Disabled entries.
    pub disabled: Vec<String>,
}

impl From<&Fleet> for FleetInfo {
    fn from(fleet: &Fleet) -> Self {
        FleetInfo {
            source: fleet.source.clone(),
            config_revision: fleet.revision.clone(),
            issues: fleet.issues.clone(),
            refused: fleet.refused.clone(),
            disabled: fleet.disabled.clone(),
        }
    }
}

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReloadReport {
    /// Servers started.
    pub added: Vec<String>,
    /// Servers stopped.
    pub removed: Vec<String>,
    /// Servers restarted with their new declaration.
    pub changed: Vec<String>,
    /// Servers whose new version was refused: they keep serving their previous version.
    pub kept: Vec<String>,
    /// New servers whose entry was refused (not started).
    pub refused: Vec<String>,
}

/// One consistent fleet: runtimes, prefixes and facts, swapped whole on reload.
pub struct FleetState {
    /// Child runtimes by name.
    pub children: BTreeMap<String, Arc<ChildRuntime>>,
    /// Prefix of every server.
    pub prefixes: BTreeMap<String, String>,
    /// Fleet facts.
    pub info: FleetInfo,
}

/// Whether a child can contribute to a snapshot (`None`) or why not.
pub(super) fn availability(status: &crate::child::ChildStatus) -> Option<String> {
    let code = |fallback: &str| {
        status
            .last_error
            .as_ref()
            .map_or_else(|| fallback.to_string(), |e| e.code.clone())
    };
    match status.state {
        ChildState::Failed => Some(code("child-unavailable")),
        _ if status.catalog.is_some() => None,
        ChildState::Restarting => Some(code("child-restarting")),
        _ => Some(code("child-starting")),
    }
}

/// Every child's live catalog with its fingerprint.
pub(super) fn served_catalogs(
    fleet: &FleetState,
) -> BTreeMap<String, (Arc<catalog::ChildCatalog>, String)> {
    fleet
        .children
        .iter()
        .filter_map(|(server, child)| {
            let status = child.status();
            Some((server.clone(), (status.catalog?, status.fingerprint?)))
        })
        .collect()
}

/// The fleet in force and the problems of the last reload. Owns its state: swapped whole, read
/// as one consistent snapshot.
pub(super) struct Members {
    current: std::sync::RwLock<Arc<FleetState>>,
    reload_error: std::sync::Mutex<Option<Vec<ConfigIssue>>>,
}

impl Default for Members {
    fn default() -> Self {
        Members {
            current: std::sync::RwLock::new(Arc::new(FleetState {
                children: BTreeMap::new(),
                prefixes: BTreeMap::new(),
                info: FleetInfo::from(&Fleet::empty("none")),
            })),
            reload_error: std::sync::Mutex::new(None),
        }
    }
}

impl Members {
    /// The fleet in force.
    pub(super) fn current(&self) -> Arc<FleetState> {
        self.current
            .read()
            .map(|f| f.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Puts `fleet` in force.
    pub(super) fn replace(&self, fleet: FleetState) {
        let mut f = self.current.write().unwrap_or_else(|p| p.into_inner());
        *f = Arc::new(fleet);
    }

    /// Records the problems of the last reload (`None`: it applied cleanly).
    fn set_reload_error(&self, issues: Option<Vec<ConfigIssue>>) {
        if let Ok(mut e) = self.reload_error.lock() {
            *e = issues;
        }
    }

    fn reload_error(&self) -> Option<Vec<ConfigIssue>> {
        self.reload_error.lock().ok().and_then(|e| e.clone())
    }
}

impl Multiplexer {
    /// Starts one child runtime and the task that folds its catalog changes into the view.
    pub(super) fn start_child(self: &Arc<Self>, spec: ChildSpec) -> Arc<ChildRuntime> {
        let events: Arc<dyn ChildEvents> = Arc::new(MuxEvents(Arc::downgrade(self)));
        let child = ChildRuntime::start_with(
            spec,
            self.settings.bounds,
            Some(events),
            self.settings.connector.0.clone(),
        );
        let weak = Arc::downgrade(self);
        let mut rx = child.subscribe();
        let republish = self.republish.clone();
        tokio::spawn(async move {
            let (mut last, mut available) = {
                let s = rx.borrow();
                (s.fingerprint.clone(), availability(&s).is_none())
            };
            while rx.changed().await.is_ok() {
                let (fp, now_available) = {
                    let s = rx.borrow_and_update();
                    (s.fingerprint.clone(), availability(&s).is_none())
                };
                if fp != last {
                    last = fp;
                    let Some(mux) = weak.upgrade() else { return };
                    mux.request_rebuild();
                }
                if now_available != available {
                    available = now_available;
                    republish.notify_one();
                }
            }
        });
        child
    }

    /// Applies a new fleet version entry by entry, like startup: valid entries apply (removed
    /// servers lose their tools and per-session loads first, added servers start, changed ones
    /// restart, untouched children are not touched); an entry refused in the new version keeps
    /// its previous version if it had one (and is not started if it is new). A document that
    /// cannot be used at all (`Err`) keeps the whole fleet. Problems are kept for status and
    /// metrics (`reload_error`), never for readiness.
    pub async fn reload(
        self: &Arc<Self>,
        update: Result<Fleet, Vec<ConfigIssue>>,
    ) -> Result<ReloadReport, Vec<ConfigIssue>> {
        let fleet = match update {
            Ok(f) => f,
            Err(issues) => {
                tracing::warn!(
                    problems = issues.len(),
                    "fleet document unusable; keeping the current fleet"
                );
                for issue in &issues {
                    tracing::warn!(server = %issue.server, field = %issue.field, "config problem: {}", issue.reason);
                }
                self.fleet.set_reload_error(Some(issues.clone()));
                crate::telemetry::metrics().fleet_reload("rejected", issues.len());
                return Err(issues);
            }
        };
        let old = self.fleet();
        let mut report = ReloadReport::default();
        // The declaration served from now on: the new valid entries, plus the previous version of
        // every entry the new version refuses.
        let mut effective = fleet.children.clone();
        for name in &fleet.refused {
            if let Some(rt) = old.children.get(name) {
                effective.insert(name.clone(), rt.spec().clone());
                report.kept.push(name.clone());
            } else {
                report.refused.push(name.clone());
            }
        }
        for issue in &fleet.issues {
            tracing::warn!(server = %issue.server, field = %issue.field, "config problem: {}", issue.reason);
        }
        let fleet = Fleet {
            children: effective,
            ..fleet
        };
        let mut children = BTreeMap::new();
        let mut keep = BTreeMap::new();
        for (name, spec) in &fleet.children {
            match old.children.get(name) {
                Some(rt) if rt.spec() == spec => {
                    children.insert(name.clone(), rt.clone());
                    if let Some(p) = old.prefixes.get(name) {
                        keep.insert(name.clone(), p.clone());
                    }
                }
                Some(_) => report.changed.push(name.clone()),
                None => report.added.push(name.clone()),
            }
        }
        report.removed = old
            .children
            .keys()
            .filter(|n| !fleet.children.contains_key(*n))
            .cloned()
            .collect();
        // Untouched servers keep their prefixes (and so their tool names) across reloads.
        let prefixes = naming::assign_prefixes_keeping(
            &fleet
                .children
                .iter()
                .map(|(n, c)| (n.clone(), c.prefix.clone()))
                .collect(),
            &keep,
        );
        for name in report.added.iter().chain(&report.changed) {
            children.insert(name.clone(), self.start_child(fleet.children[name].clone()));
        }
        // Per-session loads of removed servers go first, so no session keeps a dead name.
        let removed_names: BTreeSet<String> = {
            let view = self.view();
            view.tools
                .values()
                .filter(|t| report.removed.contains(&t.server))
                .map(|t| t.name.clone())
                .collect()
        };
        for s in self.live_sessions() {
            if let Ok(mut loaded) = s.loaded.lock() {
                loaded.retain(|n| !removed_names.contains(n));
            }
        }
        self.fleet.replace(FleetState {
            children,
            prefixes,
            info: FleetInfo::from(&fleet),
        });
        self.reconciler.declare(&fleet.revision);
        self.republish.notify_one();
        self.fleet
            .set_reload_error((!fleet.issues.is_empty()).then(|| fleet.issues.clone()));
        crate::telemetry::metrics().fleet_reload(
            if fleet.issues.is_empty() {
                "applied"
            } else {
                "partial"
            },
            fleet.issues.len(),
        );
        for name in report.removed.iter().chain(&report.changed) {
            if let Some(rt) = old.children.get(name) {
                rt.shutdown().await;
            }
            crate::telemetry::metrics().forget(name);
        }
        self.rebuild_view().await;
        tracing::info!(added = ?report.added, removed = ?report.removed, changed = ?report.changed, kept = ?report.kept, refused = ?report.refused, "fleet reloaded");
        Ok(report)
    }

    /// The problems of the last reload: refused entries, or a document that could not be used.
    pub fn reload_error(&self) -> Option<Vec<ConfigIssue>> {
        self.fleet.reload_error()
    }

    /// One child runtime (multiplexer-internal: every child operation is a method taking a
    /// [`Caller`]).
    pub(super) fn child(&self, server: &str) -> Option<Arc<ChildRuntime>> {
        self.fleet().children.get(server).cloned()
    }

    /// State and counters of every child, for metrics, readiness and draining.
    pub fn children_overview(&self) -> Vec<ChildOverview> {
        let view = self.view();
        self.fleet()
            .children
            .iter()
            .map(|(name, c)| {
                let load = c.load();
                ChildOverview {
                    name: name.clone(),
                    state: c.status().state,
                    breaker: c.breaker_state(),
                    in_flight: load.in_flight,
                    queued: load.queued,
                    tools: view.tools.values().filter(|t| &t.server == name).count(),
                    session_connections: c.session_connections(),
                }
            })
            .collect()
    }

    /// Waits, at most the discovery budget for the whole request, for the named children still
    /// starting (only requests that name a server wait; see [`Multiplexer::freshen`]).
    pub async fn settle(&self, servers: &[&str]) {
        if !servers.is_empty() {
            let fleet = self.fleet();
            let budget = self.settings.discovery_budget;
            let waits = fleet
                .children
                .iter()
                .filter(|(n, _)| servers.contains(&n.as_str()))
                .filter(|(_, c)| {
                    matches!(
                        c.status().state,
                        ChildState::Starting | ChildState::Restarting
                    )
                })
                .map(|(_, c)| c.wait_settled(budget));
            // One budget per request: the waits run together.
            let _ = tokio::time::timeout(budget, futures::future::join_all(waits)).await;
        }
        self.freshen().await;
    }

    /// Whether a child is available in the served snapshot but not now, or the reverse.
    pub(super) fn availability_drifted(&self) -> bool {
        let served = self.reconciler.served();
        let down = served.snapshot.unavailable();
        self.availability()
            .iter()
            .any(|(name, now)| now.is_some() != down.contains_key(name.as_str()))
    }

    /// Each child: `Some(code)` when it cannot contribute to a snapshot (failed, or never up
    /// yet); a child restarting with a served catalog still contributes it.
    pub fn availability(&self) -> BTreeMap<String, Option<String>> {
        self.fleet()
            .children
            .iter()
            .map(|(n, c)| (n.clone(), availability(&c.status())))
            .collect()
    }
}
