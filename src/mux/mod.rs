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
mod forward;
mod generations;
mod input;
mod meta;
pub mod pipeline;
pub mod route;
pub mod session_store;
#[cfg(test)]
mod specs;
mod task_ext;
mod tasks;
mod view;

pub use bounds::check_arguments;
pub use caller::{Caller, Operation};
pub use error::{MuxError, Refusal, StartupError};
pub use fast::{FastCall, FastTarget};
pub use forward::CallContext;
pub use generations::*;
pub use meta::*;
pub use route::{FrontNote, FrontSink};
pub use tasks::{MAX_TASK_ID_BYTES, TASK_ID_PREFIX, TaskTable, input_limits};
use view::build_view;
pub use view::{Conflicts, NAME_CONFLICT, RESOURCE_CONFLICT};

pub use crate::auth::{CredentialKind, Identity, Scope};
pub use crate::child::{
    BreakerState, CallError, ChildState, ClientCaps, ErrorInfo, RELAY_REFUSED, RawResult,
    relay_code, relay_refusal,
};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::model::{Prompt, ResourceTemplate, Tool};
use serde::Serialize;

use crate::catalog::{self, naming};
use crate::child::{ChildEvents, ChildRuntime};
use crate::config::{ChildSpec, ConfigIssue, ExposeMode, Fleet};
use crate::discovery;
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

/// A tool as exposed by graph-os.
#[derive(Debug, Clone)]
pub struct ToolEntry {
    /// The one exposed name.
    pub name: String,
    /// Owning server.
    pub server: String,
    /// The child's own name for it.
    pub original: String,
    /// The descriptor with the exposed name.
    pub tool: Tool,
    /// Whether its server is `expose: eager`.
    pub eager: bool,
    /// Served from an approved catalog while the child's live schema of it differs (or the
    /// child no longer has it): calls are refused with `drift-pending`.
    pub held: bool,
}

/// A prompt as exposed by graph-os.
#[derive(Debug, Clone)]
pub struct PromptEntry {
    /// Owning server.
    pub server: String,
    /// The child's own name for it.
    pub original: String,
    /// The descriptor with the exposed name.
    pub prompt: Prompt,
}

/// A skill as exposed by graph-os (read it with `resources/read` of its URI).
#[derive(Debug, Clone)]
pub struct SkillEntry {
    /// Owning server.
    pub server: String,
    /// URI, name and description.
    pub skill: catalog::Skill,
}

/// An item left out of the view, and why (`list_catalog` `skipped`, `multiplexer_status`
/// `catalog_issues`).
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    /// Owning server.
    pub server: String,
    /// `tool`, `prompt`, `resource`, `resource_template` or `skill`.
    pub family: &'static str,
    /// Original name (URI for resources, templates and skills), escaped
    /// ([`crate::telemetry::logs::escape`]).
    pub original: String,
    /// Stable reason code (`name-conflict`, `resource-conflict`, `item-name-invalid`,
    /// `name-reserved`, `name-duplicate`, `name-collision`).
    pub code: &'static str,
    /// Why the name is invalid (`item-name-invalid`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// The other servers claiming the same key (conflicts).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub with: Vec<String>,
}

/// The immutable exposed catalog.
#[derive(Debug, Default)]
pub struct CatalogView {
    /// Enabled tools by exposed name.
    pub tools: BTreeMap<String, ToolEntry>,
    /// Disabled tools (by config globs) per server: exposed names.
    pub disabled: BTreeMap<String, Vec<String>>,
    /// Prompts by exposed name.
    pub prompts: BTreeMap<String, PromptEntry>,
    /// Resources: URI → (server, descriptor).
    pub resources: BTreeMap<String, (String, rmcp::model::Resource)>,
    /// Resource templates with their owner.
    pub templates: Vec<(String, ResourceTemplate)>,
    /// Skills by SKILL.md URI (each also a resource of its server in `resources`).
    pub skills: BTreeMap<String, SkillEntry>,
    /// Items not exposed (conflicts, invalid and reserved names).
    pub skipped: Vec<Skipped>,
    /// Keys several children claim: served by none (see `view`).
    pub conflicts: Conflicts,
    /// Non-empty prefixes and their servers: each owns the names `<prefix>__…`.
    pub namespaces: BTreeMap<String, String>,
    /// Search index over `tools` and `skills`.
    pub index: discovery::Index,
    /// The child catalog fingerprints this view was built from.
    pub fingerprints: BTreeMap<String, String>,
    /// Per server: a digest of what its part of a snapshot is built from (catalog fingerprint
    /// and the exact keys it exposes after prefixes, filters and collisions), so an unchanged
    /// part is reused by the next candidate.
    pub sources: BTreeMap<String, String>,
    /// Drift state of the children under a drift policy.
    pub drift: BTreeMap<String, catalog::drift::DriftStatus>,
}

/// Outcome of a list_changed delivery attempt (never a delivery receipt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NotifyOutcome {
    /// Written to at least one open stream of the session.
    Sent,
    /// The session has no open stream to write to.
    NoStream,
    /// Writing failed (stream closed).
    Failed,
}

/// How a front session is told that its tool list changed.
pub trait SessionNotifier: Send + Sync {
    /// Sends `notifications/tools/list_changed` on the session's open streams.
    fn tools_changed(&self) -> BoxFuture<'static, NotifyOutcome>;
    /// Sends `notifications/resources/updated` for a resource the session subscribed to.
    fn resource_updated(&self, uri: String) -> BoxFuture<'static, NotifyOutcome>;
    /// Sends a 2025 `notifications/tasks/status` of one of the session's tasks.
    fn task_status(&self, _params: serde_json::Value) -> BoxFuture<'static, NotifyOutcome> {
        Box::pin(async { NotifyOutcome::NoStream })
    }
}

/// Delivers child connection events to the multiplexer without keeping it alive.
struct MuxEvents(Weak<Multiplexer>);

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
        let subscribers: Vec<Arc<Session>> = mux
            .subscriptions
            .lock()
            .map(|s| {
                s.get(uri)
                    .map(|v| v.iter().filter_map(Weak::upgrade).collect())
                    .unwrap_or_default()
            })
            .unwrap_or_default();
        let uri = uri.to_string();
        tokio::spawn(async move {
            for s in subscribers {
                s.notifier.resource_updated(uri.clone()).await;
            }
        });
    }
}

/// One client session (2025 era) or principal (2026 era).
pub struct Session {
    id: u64,
    /// Dropped with the session: `per-session` child connections follow it.
    alive: Arc<()>,
    loaded: Mutex<BTreeSet<String>>,
    visible_digest: Mutex<String>,
    notifier: Arc<dyn SessionNotifier>,
    /// A list_changed that could not be written yet; sent on the session's next request.
    pending: std::sync::atomic::AtomicBool,
    /// Lowest child log level delivered (`logging/setLevel`), as [`level_rank`].
    log_level: std::sync::atomic::AtomicU8,
    /// Where the loaded set is kept (HTTP sessions and principals); `None`: this process only
    /// (stdio).
    binding: Option<session_store::StoreBinding>,
}

/// The order of MCP logging levels (debug lowest).
#[allow(deprecated)]
pub fn level_rank(level: rmcp::model::LoggingLevel) -> u8 {
    use rmcp::model::LoggingLevel::*;
    match level {
        Debug => 0,
        Info => 1,
        Notice => 2,
        Warning => 3,
        Error => 4,
        Critical => 5,
        Alert => 6,
        Emergency => 7,
    }
}

impl Session {
    /// Session number (process-unique).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Exposed names this session loaded.
    pub fn loaded(&self) -> BTreeSet<String> {
        self.loaded.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Replaces the loaded set with the store's copy (read at the start of each request, so a
    /// change made through another replica is seen).
    pub fn set_loaded(&self, loaded: BTreeSet<String>) {
        if let Ok(mut l) = self.loaded.lock() {
            *l = loaded;
        }
    }

    /// A list change is waiting for this session (the store said so): sent on its next request.
    pub fn mark_pending(&self) {
        self.pending.store(true, Ordering::SeqCst);
    }

    /// Where this session's state is stored, if anywhere but this process.
    pub fn binding(&self) -> Option<&session_store::StoreBinding> {
        self.binding.as_ref()
    }

    /// Sets the lowest child log level this session receives.
    #[allow(deprecated)]
    pub fn set_log_level(&self, level: rmcp::model::LoggingLevel) {
        self.log_level.store(level_rank(level), Ordering::Relaxed);
    }

    /// The lowest child log level this session receives (debug until set).
    #[allow(deprecated)]
    pub fn log_level(&self) -> rmcp::model::LoggingLevel {
        use rmcp::model::LoggingLevel::*;
        [
            Debug, Info, Notice, Warning, Error, Critical, Alert, Emergency,
        ][self.log_level.load(Ordering::Relaxed).min(7) as usize]
    }

    /// This session at the child boundary, for calls of `principal` (see [`Caller::tag`]).
    pub fn tag(&self, principal: &str) -> crate::child::SessionTag {
        crate::child::SessionTag {
            id: self.id,
            alive: Arc::downgrade(&self.alive),
            principal: Arc::from(principal),
        }
    }
}

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

/// One consistent fleet: runtimes, prefixes and facts, swapped whole on reload.
pub struct FleetState {
    /// Child runtimes by name.
    pub children: BTreeMap<String, Arc<ChildRuntime>>,
    /// Prefix of every server.
    pub prefixes: BTreeMap<String, String>,
    /// Fleet facts.
    pub info: FleetInfo,
}

/// The multiplexer.
pub struct Multiplexer {
    /// Itself, for work that outlives a borrow (a read-only call's crash retry resolves again).
    me: Weak<Multiplexer>,
    fleet: RwLock<Arc<FleetState>>,
    reload_error: Mutex<Option<Vec<ConfigIssue>>>,
    settings: MuxSettings,
    view: RwLock<Arc<CatalogView>>,
    sessions: Mutex<Vec<Weak<Session>>>,
    next_session: AtomicU64,
    instance_id: String,
    rebuild: tokio::sync::Mutex<()>,
    subscriptions: Mutex<std::collections::HashMap<String, Vec<Weak<Session>>>>,
    reconciler: Arc<crate::catalog::reconciler::Reconciler>,
    retry_budget: RetryBudget,
    follow_error: Mutex<Option<String>>,
    projection: crate::projection::SqliteProjection,
    /// Wakes the generation task when a child's availability may have changed.
    republish: Arc<tokio::sync::Notify>,
    /// Wakes the view builder: a burst of catalog changes (a fleet starting, a refresh being
    /// adopted) is folded into one rebuild instead of one per child.
    rebuild_wanted: Arc<tokio::sync::Notify>,
    /// Approved catalogs of the children under a drift policy.
    approvals: catalog::drift::ApprovalLedger,
    /// Calls of 2026-07-28 clients parked on client input (see `input`).
    parked: input::ParkedCalls,
    /// Tasks graph-os issued (2025-11-25 Tasks, see `tasks`).
    tasks: tasks::TaskTable,
}

impl Multiplexer {
    /// Starts every child of `fleet` in the background and returns at once.
    pub fn start(fleet: Fleet, settings: MuxSettings) -> Result<Arc<Self>, StartupError> {
        Self::start_with_store(fleet, settings, None)
    }

    /// Like [`Multiplexer::start`], with the generation record kept in `store` (e.g. Leases)
    /// instead of the state directory's file store.
    pub fn start_with_store(
        fleet: Fleet,
        settings: MuxSettings,
        store: Option<Arc<dyn crate::catalog::store::GenerationStore>>,
    ) -> Result<Arc<Self>, StartupError> {
        let custom_store = store;
        let state_dir = settings.state_dir.clone();
        let (store, projection) = match crate::catalog::store::FileStore::open(&state_dir) {
            Ok(store) => (
                store,
                crate::projection::SqliteProjection::new(state_dir.join("projection.sqlite")),
            ),
            Err(e) => {
                let tmp =
                    std::env::temp_dir().join(format!("graph-os-state-{}", std::process::id()));
                tracing::error!(dir = %state_dir.display(), error = %e, fallback = %tmp.display(), "state directory unusable");
                let fallback = crate::catalog::store::FileStore::open(&tmp).map_err(|f| {
                    StartupError::StateDir {
                        dir: state_dir.display().to_string(),
                        reason: e.to_string(),
                        fallback: tmp.display().to_string(),
                        fallback_reason: f.to_string(),
                    }
                })?;
                (
                    fallback,
                    crate::projection::SqliteProjection::new(tmp.join("projection.sqlite")),
                )
            }
        };
        let store: Arc<dyn crate::catalog::store::GenerationStore> = match custom_store {
            Some(custom) => custom,
            None => Arc::new(store),
        };
        let writer: Arc<dyn crate::catalog::writer::ProjectionWriter> =
            Arc::new(projection.clone());
        let replica_id = settings.replica_id.clone();
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mux = Arc::new_cyclic(|me| Multiplexer {
            me: me.clone(),
            fleet: RwLock::new(Arc::new(FleetState {
                children: BTreeMap::new(),
                prefixes: BTreeMap::new(),
                info: FleetInfo::from(&Fleet::empty("none")),
            })),
            reload_error: Mutex::new(None),
            settings,
            view: RwLock::new(Arc::default()),
            sessions: Mutex::new(Vec::new()),
            next_session: AtomicU64::new(1),
            rebuild: tokio::sync::Mutex::new(()),
            subscriptions: Mutex::new(std::collections::HashMap::new()),
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
            rebuild_wanted: Arc::default(),
            approvals: catalog::drift::ApprovalLedger::new(Some(state_dir.clone())),
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
        if let Ok(mut f) = mux.fleet.write() {
            *f = Arc::new(FleetState {
                children,
                prefixes,
                info: FleetInfo::from(&fleet),
            });
        }
        mux.spawn_generation_tasks();
        mux.spawn_view_builder();
        Ok(mux)
    }

    /// The task that rebuilds the view when children's catalogs change, coalescing bursts.
    fn spawn_view_builder(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let wanted = self.rebuild_wanted.clone();
        tokio::spawn(async move {
            loop {
                wanted.notified().await;
                // Let the rest of a burst arrive; requests during the rebuild leave one permit.
                tokio::time::sleep(Duration::from_millis(20)).await;
                let Some(mux) = weak.upgrade() else { return };
                mux.rebuild_view().await;
                release_free_memory();
            }
        });
    }

    /// Asks for the view to be rebuilt soon (coalesced with other requests).
    fn request_rebuild(&self) {
        self.rebuild_wanted.notify_one();
    }

    /// Background work for catalog generations: the startup publication (after at most
    /// [`STARTUP_SETTLE`], with children still starting marked unavailable), a republication
    /// whenever a child's availability differs from the served snapshot (recovery or failure is
    /// a new generation), the heartbeat, and following generations other replicas publish.
    fn spawn_generation_tasks(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let trigger = self.republish.clone();
        tokio::spawn(async move {
            if let Some(mux) = weak.upgrade() {
                let children: Vec<_> = mux.fleet().children.values().cloned().collect();
                let starting = children.iter().map(|c| {
                    let mut rx = c.subscribe();
                    async move {
                        let _ = rx.wait_for(|s| s.state != ChildState::Starting).await;
                    }
                });
                let _ =
                    tokio::time::timeout(STARTUP_SETTLE, futures::future::join_all(starting)).await;
                match mux.publish_current().await {
                    Ok(p) => tracing::info!(
                        generation = p.generation,
                        changed = p.changed,
                        "startup reconciliation"
                    ),
                    Err(r) => {
                        tracing::warn!(code = r.code.as_str(), detail = %r.detail, "startup reconciliation refused")
                    }
                }
                // Join the cohort at once (adopting a published generation writes no heartbeat).
                if let Err(e) = mux.reconciler.heartbeat().await {
                    tracing::warn!(error = %e, "heartbeat failed");
                }
            }
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            let mut rebuilt_for_failure = false;
            loop {
                let republish = tokio::select! {
                    _ = tick.tick() => false,
                    _ = trigger.notified() => true,
                };
                let Some(mux) = weak.upgrade() else { return };
                if republish {
                    // Let a burst of state changes settle into one generation.
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    if mux.availability_drifted() || mux.reconciler.declaration_unpublished().await
                    {
                        if let Err(r) = mux.publish_current().await {
                            tracing::warn!(code = r.code.as_str(), detail = %r.detail, "republication refused");
                        }
                        let _ = mux.reconciler.heartbeat().await;
                    }
                    continue;
                }
                if let Err(e) = mux.reconciler.heartbeat().await {
                    tracing::warn!(error = %e, "heartbeat failed");
                }
                let outcome = mux.reconciler.follow(|| mux.current_candidate().ok()).await;
                let failed = outcome.is_err();
                if let Ok(mut f) = mux.follow_error.lock() {
                    *f = outcome.err();
                }
                if failed && !rebuilt_for_failure {
                    // Another replica may have published what a fresh view reproduces (e.g. an
                    // approval recorded in the shared state directory): rebuild once for the
                    // next tick, not on every tick while the divergence lasts.
                    mux.rebuild_view().await;
                }
                rebuilt_for_failure = failed;
                // A reloaded declaration nobody published yet (its first attempt was refused
                // while other replicas still ran the previous one): retry until one replica
                // publishes it and the others follow.
                if mux.reconciler.declaration_unpublished().await
                    && let Err(r) = mux.publish_current().await
                {
                    tracing::debug!(code = r.code.as_str(), detail = %r.detail, "publication of the reloaded declaration refused");
                }
            }
        });
    }

    /// Whether a child is available in the served snapshot but not now, or the reverse.
    fn availability_drifted(&self) -> bool {
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

    /// The candidate of what is served now (no probing), reusing the served snapshot's parts
    /// of children that did not change.
    fn current_candidate(
        &self,
    ) -> Result<crate::catalog::snapshot::Snapshot, crate::catalog::reconciler::Refusal> {
        let fleet = self.fleet();
        let served = self.reconciler.served();
        generations::candidate(
            &self.view(),
            self.availability().into_iter(),
            &fleet.info.config_revision,
            Some(&served.snapshot),
        )
    }

    /// Publishes what is served now (startup, recovery and failure of children).
    pub async fn publish_current(
        &self,
    ) -> Result<crate::catalog::reconciler::Published, crate::catalog::reconciler::Refusal> {
        self.freshen().await;
        let candidate = self.current_candidate()?;
        let published = self.reconciler.publish(candidate).await;
        release_free_memory();
        published
    }

    /// The knowledge-graph projection (read side, for `fleet_graph`).
    pub fn projection(&self) -> &crate::projection::SqliteProjection {
        &self.projection
    }

    /// Why this replica cannot serve the recorded generation, if it cannot.
    pub fn follow_error(&self) -> Option<String> {
        self.follow_error.lock().ok().and_then(|f| f.clone())
    }

    /// Starts one child runtime and the task that folds its catalog changes into the view.
    fn start_child(self: &Arc<Self>, spec: ChildSpec) -> Arc<ChildRuntime> {
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
                if let Ok(mut e) = self.reload_error.lock() {
                    *e = Some(issues.clone());
                }
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
        if let Ok(mut f) = self.fleet.write() {
            *f = Arc::new(FleetState {
                children,
                prefixes,
                info: FleetInfo::from(&fleet),
            });
        }
        self.reconciler.declare(&fleet.revision);
        self.republish.notify_one();
        if let Ok(mut e) = self.reload_error.lock() {
            *e = (!fleet.issues.is_empty()).then(|| fleet.issues.clone());
        }
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
        self.reload_error.lock().ok().and_then(|e| e.clone())
    }

    /// Records that `session` subscribed to `uri` (updates from the owning child reach it).
    fn record_subscription(&self, session: &Arc<Session>, uri: &str) {
        if let Ok(mut subs) = self.subscriptions.lock() {
            let list = subs.entry(uri.to_string()).or_default();
            list.retain(|w| {
                w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(session))
            });
            list.push(Arc::downgrade(session));
        }
    }

    /// Removes `session`'s subscription to `uri`; whether another live session still follows it.
    fn forget_subscription(&self, session: &Arc<Session>, uri: &str) -> bool {
        if let Ok(mut subs) = self.subscriptions.lock()
            && let Some(list) = subs.get_mut(uri)
        {
            list.retain(|w| {
                w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(session))
            });
            if list.is_empty() {
                subs.remove(uri);
                return false;
            }
            return true;
        }
        false
    }

    /// Sessions and principals currently held (loaded sets in memory).
    pub fn live_session_count(&self) -> usize {
        self.sessions
            .lock()
            .map(|s| s.iter().filter(|w| w.strong_count() > 0).count())
            .unwrap_or_default()
    }

    fn live_sessions(&self) -> Vec<Arc<Session>> {
        self.sessions
            .lock()
            .map(|s| s.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default()
    }

    /// The served view.
    pub fn view(&self) -> Arc<CatalogView> {
        self.view.read().map(|v| v.clone()).unwrap_or_default()
    }

    /// The served fleet (runtimes included: for the multiplexer and the status writer only;
    /// the protocol layer uses [`Multiplexer::children_overview`]).
    pub(crate) fn fleet(&self) -> Arc<FleetState> {
        self.fleet
            .read()
            .map(|f| f.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// One child runtime (multiplexer-internal: every child operation is a method taking a
    /// [`Caller`]).
    fn child(&self, server: &str) -> Option<Arc<ChildRuntime>> {
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

    /// Registers a new session.
    pub fn open_session(&self, notifier: Arc<dyn SessionNotifier>) -> Arc<Session> {
        self.register_session(notifier, None, BTreeSet::new())
    }

    /// Registers a session whose state lives in a [`session_store::SessionStore`]: its loaded
    /// set starts as `loaded`, changes are written there first, and notifications travel
    /// through it to whichever replica holds the session's stream.
    pub fn open_stored_session(
        &self,
        binding: session_store::StoreBinding,
        loaded: BTreeSet<String>,
    ) -> Arc<Session> {
        let notifier = Arc::new(session_store::StoreNotifier(binding.clone()));
        self.register_session(notifier, Some(binding), loaded)
    }

    fn register_session(
        &self,
        notifier: Arc<dyn SessionNotifier>,
        binding: Option<session_store::StoreBinding>,
        loaded: BTreeSet<String>,
    ) -> Arc<Session> {
        let session = Arc::new(Session {
            id: self.next_session.fetch_add(1, Ordering::Relaxed),
            alive: Arc::new(()),
            loaded: Mutex::new(loaded),
            visible_digest: Mutex::new(String::new()),
            notifier,
            pending: std::sync::atomic::AtomicBool::new(false),
            log_level: std::sync::atomic::AtomicU8::new(0),
            binding,
        });
        let digest = self.visible_digest(&session, &self.view());
        if let Ok(mut d) = session.visible_digest.lock() {
            *d = digest;
        }
        if let Ok(mut s) = self.sessions.lock() {
            s.retain(|w| w.strong_count() > 0);
            s.push(Arc::downgrade(&session));
        }
        session
    }

    /// Adopts the loaded set read from the session's store at the start of a request. The
    /// session is not notified: whoever changed the set did that.
    pub fn adopt_loaded(&self, session: &Session, loaded: BTreeSet<String>) {
        if session.loaded() == loaded {
            return;
        }
        session.set_loaded(loaded);
        let digest = self.visible_digest(session, &self.view());
        if let Ok(mut d) = session.visible_digest.lock() {
            *d = digest;
        }
    }

    /// Tools visible to a session: eager ones plus its loaded ones, sorted by name.
    pub fn visible_tools(&self, session: &Session) -> Vec<ToolEntry> {
        let view = self.view();
        let loaded = session.loaded();
        view.tools
            .values()
            .filter(|t| t.eager || loaded.contains(&t.name))
            .cloned()
            .collect()
    }

    fn visible_digest(&self, session: &Session, view: &CatalogView) -> String {
        let loaded = session.loaded();
        let items: Vec<serde_json::Value> = view
            .tools
            .values()
            .filter(|t| t.eager || loaded.contains(&t.name))
            .map(|t| serde_json::to_value(&t.tool).unwrap_or_default())
            .collect();
        crate::digest::sha256_hex(
            crate::digest::canonical_json(&serde_json::Value::Array(items)).as_bytes(),
        )
    }

    /// Recomputes a session's visible digest; when it changed, notifies the session.
    pub async fn refresh_session(&self, session: &Session) -> Option<NotifyOutcome> {
        let digest = self.visible_digest(session, &self.view());
        let changed = match session.visible_digest.lock() {
            Ok(mut d) if *d != digest => {
                *d = digest;
                true
            }
            _ => false,
        };
        if !changed {
            return None;
        }
        let outcome = session.notifier.tools_changed().await;
        // A stored session's store keeps the pending flag for whichever replica serves the next
        // request; only an unreachable store leaves it to this replica.
        let keep_here = session.binding.is_none() || outcome == NotifyOutcome::Failed;
        if outcome != NotifyOutcome::Sent && keep_here {
            session.pending.store(true, Ordering::SeqCst);
        }
        Some(outcome)
    }

    /// Sends a list_changed that could not be written earlier (call at the start of a request).
    pub async fn deliver_pending(&self, session: &Session) {
        if session.pending.swap(false, Ordering::SeqCst) {
            let outcome = session.notifier.tools_changed().await;
            let keep_here = session.binding.is_none() || outcome == NotifyOutcome::Failed;
            if outcome != NotifyOutcome::Sent && keep_here {
                session.pending.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Rebuilds the exposed view from every child's served catalog and notifies the sessions
    /// whose visible tools changed.
    pub async fn rebuild_view(&self) {
        let fleet = self.fleet();
        let _serialized = self.rebuild.lock().await;
        let catalogs = self.guard(&fleet, served_catalogs(&fleet));
        let previous = self.view();
        // Unchanged children keep their index segment (postings and vectors); changed ones are
        // re-indexed and their vectors computed in the background.
        let engine = previous.index.engine().cloned().unwrap_or_else(|| {
            discovery::Engine::new(discovery::EngineConfig {
                cache_dir: Some(self.settings.state_dir.join("discovery").join("vectors")),
                background: true,
                models_dir: self.settings.models_dir.clone(),
                query_memo: discovery::engine::QUERY_MEMO,
            })
        });
        // Building a view (and its index) is CPU work proportional to the catalog: off the
        // async workers, so requests keep being answered while a large fleet comes up.
        let built = tokio::task::spawn_blocking(move || {
            let (mut view, docs) = build_view(&fleet, &catalogs, true);
            view.index = previous.index.update(docs, engine);
            view
        })
        .await;
        let view = match built {
            Ok(view) => Arc::new(view),
            Err(e) => {
                tracing::error!(error = %e, "view rebuild failed; keeping the current view");
                return;
            }
        };
        if let Ok(mut v) = self.view.write() {
            *v = view;
        }
        let sessions: Vec<Arc<Session>> = self
            .sessions
            .lock()
            .map(|s| s.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        for s in sessions {
            self.refresh_session(&s).await;
        }
    }

    /// Folds a child that just came up into the view if its watcher has not yet (never waits
    /// for a child: discovery answers from what is ready).
    pub async fn freshen(&self) {
        let fleet = self.fleet();
        let view = self.view();
        if fleet
            .children
            .iter()
            .any(|(n, c)| c.status().fingerprint.as_ref() != view.fingerprints.get(n))
        {
            self.rebuild_view().await;
        }
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

/// Whether a child can contribute to a snapshot (`None`) or why not.
fn availability(status: &crate::child::ChildStatus) -> Option<String> {
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
fn served_catalogs(fleet: &FleetState) -> BTreeMap<String, (Arc<catalog::ChildCatalog>, String)> {
    fleet
        .children
        .iter()
        .filter_map(|(server, child)| {
            let status = child.status();
            Some((server.clone(), (status.catalog?, status.fingerprint?)))
        })
        .collect()
}
