//! The multiplexer: the only owner of child runtimes, the exposed-name table, per-session
//! loaded sets and the meta-tool behaviour behind them.
//!
//! Design note: the exposed catalog is an immutable [`CatalogView`] rebuilt whenever a child's
//! catalog changes and swapped in one step; readers clone an `Arc` and never see a half-built
//! view. A session's visible tools are `eager tools ∪ (loaded ∩ view)`; a session is notified
//! (`tools/list_changed`) exactly when that set (names or schemas) changes.

mod bounds;
mod caller;
mod drift;
mod error;
mod fast;
mod fleet;
mod forward;
mod generations;
mod input;
mod meta;
pub mod pipeline;
pub mod route;
pub mod session_store;
mod sessions;
#[cfg(test)]
mod specs;
mod stores;
mod task_ext;
mod tasks;
mod view;

pub use bounds::check_arguments;
pub use caller::{Caller, Operation};
pub use error::{MuxError, Refusal, StartupError};
pub use fast::{FastCall, FastTarget};
use fleet::served_catalogs;
pub use fleet::{ChildOverview, FleetInfo, FleetState, ReloadReport};
pub use forward::CallContext;
pub use generations::*;
pub use meta::*;
pub use route::{FrontNote, FrontSink};
pub use sessions::{NotifyOutcome, Session, SessionNotifier, level_rank};
pub use stores::Stores;
pub use tasks::{MAX_TASK_ID_BYTES, TASK_ID_PREFIX, TaskTable, input_limits};
use view::build_view;
pub use view::{CatalogView, PromptEntry, SkillEntry, Skipped, ToolEntry};
pub use view::{Conflicts, NAME_CONFLICT, RESOURCE_CONFLICT};

pub use crate::auth::{CredentialKind, Identity, Scope};
pub use crate::child::{
    BreakerState, CallError, ChildState, ClientCaps, ErrorInfo, RELAY_REFUSED, RawResult,
    relay_code, relay_refusal,
};

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::catalog::{self, naming};
use crate::child::ChildEvents;
use crate::config::{ExposeMode, Fleet};
use crate::probe::ProbeBounds;

/// Names of the meta tools; child tools can never shadow them.
pub const META_TOOLS: &[&str] = &[
    "find_tools",
    "list_catalog",
    "load_tools",
    "unload_tools",
    "multiplexer_status",
    "catalog_refresh",
    "catalog_dispatch",
    "fleet_graph",
];

/// Delivers child connection events to the multiplexer without keeping it alive.
pub(super) struct MuxEvents(pub(super) Weak<Multiplexer>);

impl ChildEvents for MuxEvents {
    fn task_status(&self, server: &str, params: serde_json::Value) {
        if let Some(mux) = self.0.upgrade() {
            tasks::deliver_status(&mux.tasks, server, params);
        }
    }

    fn resource_updated(&self, server: &str, uri: &str) {
        let Some(mux) = self.0.upgrade() else { return };
        // Only the URI's owner (or, for a URI no child lists, the transparent child) speaks for
        // it: another child's update of it is dropped.
        let owner = match mux.view().resource_route(uri) {
            Ok(Some(owner)) => owner == server,
            Ok(None) => {
                let fleet = mux.fleet();
                fleet.prefixes.get(server).is_some_and(|p| p.is_empty())
                    && fleet
                        .children
                        .get(server)
                        .is_some_and(|c| c.spec().expose == ExposeMode::Eager)
            }
            Err(_) => false,
        };
        if !owner {
            tracing::debug!(server, uri = %uri, "resource update from a child that does not own the URI dropped");
            return;
        }
        let subscribers = mux.sessions.subscribers(uri);
        let uri = uri.to_string();
        tokio::spawn(async move {
            for s in subscribers {
                s.notifier.resource_updated(uri.clone()).await;
            }
        });
    }
}

fn unreachable_empty() -> crate::catalog::snapshot::Snapshot {
    // An empty builder cannot fail; keep a well-formed value regardless.
    crate::catalog::snapshot::SnapshotBuilder::default()
        .build("", "")
        .unwrap_or(crate::catalog::snapshot::Snapshot {
            release_id: String::new(),
            config_revision: String::new(),
            children: BTreeMap::new(),
            digest: String::new(),
        })
}

/// Settings of the multiplexer itself.
#[derive(Debug, Clone)]
pub struct MuxSettings {
    /// Interactive discovery budget (find_tools / load_tools wait this long for starting children).
    pub discovery_budget: Duration,
    /// Default `top_k` of find_tools.
    pub default_top_k: usize,
    /// Probe bounds for every child.
    pub bounds: ProbeBounds,
    /// State directory (generation record, replica heartbeats, projection).
    pub state_dir: std::path::PathBuf,
    /// This replica's id.
    pub replica_id: String,
    /// Installed discovery models (none: the static tier at most).
    pub models_dir: Option<std::path::PathBuf>,
    /// Drift policy of entries that set none (`off` by default).
    pub drift_policy: crate::config::DriftPolicy,
    /// Checks every forwarded call passes after the built-in ones (see [`pipeline`]).
    pub stages: pipeline::Stages,
    /// How children are reached: the real transports, or an in-memory child in specs.
    pub connector: crate::child::connector::SharedConnector,
}

impl Default for MuxSettings {
    fn default() -> Self {
        MuxSettings {
            discovery_budget: Duration::from_secs(5),
            default_top_k: 8,
            bounds: ProbeBounds::default(),
            state_dir: std::env::temp_dir().join(format!("graph-os-state-{}", std::process::id())),
            replica_id: format!("pid-{}", std::process::id()),
            models_dir: None,
            drift_policy: crate::config::DriftPolicy::Off,
            stages: pipeline::Stages::default(),
            connector: Default::default(),
        }
    }
}

/// The multiplexer.
pub struct Multiplexer {
    /// Itself, for work that outlives a borrow (a read-only call's crash retry resolves again).
    me: Weak<Multiplexer>,
    /// The fleet in force (see `fleet`).
    fleet: fleet::Members,
    settings: MuxSettings,
    /// The exposed catalog view and its rebuilds (see `view`).
    view: view::ViewState,
    sessions: sessions::Sessions,
    instance_id: String,
    reconciler: Arc<crate::catalog::reconciler::Reconciler>,
    retry_budget: RetryBudget,
    follow_error: Mutex<Option<String>>,
    projection: crate::projection::SqliteProjection,
    /// Wakes the generation task when a child's availability may have changed.
    republish: Arc<tokio::sync::Notify>,
    /// Approved catalogs of the children under a drift policy.
    approvals: catalog::drift::ApprovalLedger,
    /// Calls of 2026-07-28 clients parked on client input (see `input`).
    parked: input::ParkedCalls,
    /// Tasks graph-os issued (2025-11-25 Tasks, see `tasks`).
    tasks: tasks::TaskTable,
}

impl Multiplexer {
    /// Starts every child of `fleet` in the background and returns at once, keeping what
    /// outlives it in `stores` (see [`Stores`]).
    pub fn start_with(fleet: Fleet, settings: MuxSettings, stores: Stores) -> Arc<Self> {
        let Stores {
            generations: store,
            projection,
            approvals,
        } = stores;
        let writer: Arc<dyn crate::catalog::writer::ProjectionWriter> =
            Arc::new(projection.clone());
        let replica_id = settings.replica_id.clone();
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mux = Arc::new_cyclic(|me| Multiplexer {
            me: me.clone(),
            fleet: fleet::Members::default(),
            settings,
            view: view::ViewState::default(),
            sessions: sessions::Sessions::default(),
            reconciler: Arc::new(crate::catalog::reconciler::Reconciler::new(
                store,
                writer,
                replica_id,
                generations::candidate(
                    &CatalogView::default(),
                    fleet
                        .children
                        .keys()
                        .map(|k| (k.clone(), Some("child-starting".to_string()))),
                    &fleet.revision,
                    None,
                )
                .unwrap_or_else(|_| unreachable_empty()),
            )),
            retry_budget: RetryBudget::default(),
            parked: input::ParkedCalls::default(),
            tasks: tasks::TaskTable::default(),
            follow_error: Mutex::new(None),
            projection,
            republish: Arc::default(),
            approvals: catalog::drift::ApprovalLedger::new(Some(approvals)),
            instance_id: format!(
                "graph-os:{}",
                &crate::digest::sha256_hex(format!("{}:{nonce}", std::process::id()).as_bytes())
                    [..32]
            ),
        });
        let prefixes = naming::assign_prefixes(
            &fleet
                .children
                .iter()
                .map(|(n, c)| (n.clone(), c.prefix.clone()))
                .collect(),
        );
        let children = fleet
            .children
            .values()
            .map(|spec| (spec.name.clone(), mux.start_child(spec.clone())))
            .collect();
        mux.fleet.replace(FleetState {
            children,
            prefixes,
            info: FleetInfo::from(&fleet),
        });
        mux.spawn_generation_tasks();
        mux.spawn_view_builder();
        mux
    }

    /// The knowledge-graph projection (read side, for `fleet_graph`).
    pub fn projection(&self) -> &crate::projection::SqliteProjection {
        &self.projection
    }

    /// Why this replica cannot serve the recorded generation, if it cannot.
    pub fn follow_error(&self) -> Option<String> {
        self.follow_error.lock().ok().and_then(|f| f.clone())
    }

    /// The served fleet (runtimes included: for the multiplexer and the status writer only;
    /// the protocol layer uses [`Multiplexer::children_overview`]).
    pub(crate) fn fleet(&self) -> Arc<FleetState> {
        self.fleet.current()
    }

    /// Stops every child.
    ///
    /// The replica leaves the cohort first: stopping children changes their availability, and
    /// a leaving replica must neither publish that nor be waited for by the others.
    pub async fn shutdown(&self) {
        if let Err(e) = self.reconciler.leave().await {
            tracing::warn!(error = %e, "could not withdraw this replica's heartbeat");
        }
        let fleet = self.fleet();
        futures::future::join_all(fleet.children.values().map(|c| c.shutdown())).await;
    }

    /// Process-unique identity of this gateway instance.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// Settings in force.
    pub fn settings(&self) -> &MuxSettings {
        &self.settings
    }
}

pub(crate) use crate::memory::release_free_memory;

/// How long the startup publication waits for children still starting.
pub const STARTUP_SETTLE: Duration = Duration::from_secs(5);
