//! catalog_refresh and catalog_dispatch: the multiplexer's side of catalog generations.
//!
//! The multiplexer probes its children and builds the candidate from the exposed view (so the
//! snapshot uses the one name every other surface uses); the [`Reconciler`] decides and
//! publishes. Wire types reject unknown fields; every refusal is a payload with a stable code.

use super::{ChildState, STARTUP_SETTLE};
use crate::memory::release_free_memory;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{CatalogView, Multiplexer};
use crate::catalog::reconciler::{ContractCode, Reconciler, Refusal};
use crate::catalog::snapshot::{Family, Snapshot, SnapshotBuilder};
use crate::child::CallError;
use crate::digest::{canonical_json, sha256_hex};

/// `catalog_refresh` / `POST /api/mcp/catalog/refresh` request.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RefreshRequest {
    /// Caller's id for this request (`[A-Za-z0-9_.:-]{1,256}`).
    pub request_id: String,
    /// The config revision the caller believes is served.
    pub expected_config_revision: String,
    /// The catalog generation the caller believes is served.
    pub expected_catalog_generation: u64,
    /// The snapshot digest the caller believes is served (64 hex).
    pub expected_snapshot_digest: String,
    /// Deadline for probing every child (1..120000 ms).
    pub deadline_ms: u64,
}

/// Successful refresh.
#[derive(Debug, Clone, Serialize)]
pub struct RefreshResult {
    /// Echo of the request id.
    pub request_id: String,
    /// This gateway process.
    pub served_instance_id: String,
    /// graph-os release.
    pub release_id: String,
    /// Served config revision.
    pub config_revision: String,
    /// Served generation.
    pub catalog_generation: u64,
    /// Served digest.
    pub snapshot_digest: String,
    /// Whether the served identity changed.
    pub changed: bool,
    /// `reconciled` when the projection acknowledged this generation.
    pub reingestion_state: &'static str,
    /// Digest over the identity and the projection acknowledgement (null when unchanged).
    pub reconciliation_receipt_digest: Option<String>,
}

/// A refused refresh or dispatch, returned as a payload.
#[derive(Debug, Clone, Serialize)]
pub struct ContractError {
    /// Echo of the request id (empty when the request could not be read).
    pub request_id: String,
    /// Stable code.
    pub code: ContractCode,
    /// Whether retrying may succeed.
    pub retryable: bool,
    /// Served generation.
    pub catalog_generation: u64,
    /// Served digest.
    pub snapshot_digest: String,
}

/// `catalog_dispatch` / `POST /api/mcp/dispatch` request.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DispatchRequest {
    /// Exposed tool name.
    pub tool_name: String,
    /// Tool arguments.
    pub arguments: serde_json::Map<String, serde_json::Value>,
    /// Generation the caller resolved the name against.
    pub expected_catalog_generation: u64,
    /// Digest the caller resolved the name against.
    pub expected_snapshot_digest: String,
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn valid_request_id(s: &str) -> bool {
    (1..=256).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
}

/// Unknown-tool retries allowed per (server, connection generation).
pub const UNKNOWN_TOOL_RETRY_BUDGET: u32 = 3;

/// Per-(server, generation) unknown-tool retry counts.
#[derive(Default)]
pub struct RetryBudget(std::sync::Mutex<HashMap<(String, u64), u32>>);

impl RetryBudget {
    fn take(&self, server: &str, generation: u64) -> bool {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry((server.to_string(), generation)).or_default();
        if *n >= UNKNOWN_TOOL_RETRY_BUDGET {
            return false;
        }
        *n += 1;
        true
    }
}

/// What a dispatch that passed the contract checks produced.
#[derive(Debug)]
pub enum Dispatched {
    /// The child's result (possibly a tool error).
    Result(CallToolResult),
    /// The call failed before or at the child (a stable code, not a contract refusal).
    Failed(super::MuxError),
}

fn denied() -> Refusal {
    Refusal::new(ContractCode::AuthorizationDenied, "scope required")
}

/// A snapshot candidate of the exposed view: every admitted child, each either with its items
/// or marked unavailable with its code (`servers`: name → `Some(code)` when unavailable). A
/// child whose part of `previous` was built from the same source is reused, not rebuilt.
pub fn candidate(
    view: &CatalogView,
    servers: impl Iterator<Item = (String, Option<String>)>,
    config_revision: &str,
    previous: Option<&Snapshot>,
) -> Result<Snapshot, Refusal> {
    let mut b = SnapshotBuilder::default();
    let mut reused = std::collections::HashSet::new();
    for (s, unavailable) in servers {
        if let Some(code) = unavailable {
            b.unavailable(&s, &code);
            continue;
        }
        let source = view.sources.get(&s);
        match previous.and_then(|p| p.children.get(&s)) {
            Some(part) if source.is_some() && part.source.as_ref() == source => {
                b.reuse(&s, part.clone());
                reused.insert(s);
            }
            _ => {
                b.child(&s);
                if let Some(source) = source {
                    b.source(&s, source.clone());
                }
            }
        }
    }
    let fresh = |server: &str| !reused.contains(server);
    for t in view.tools.values().filter(|t| fresh(&t.server)) {
        b.item(&t.server, Family::Tools, &t.name, val(&t.tool));
    }
    for (name, p) in view.prompts.iter().filter(|(_, p)| fresh(&p.server)) {
        b.item(&p.server, Family::Prompts, name, val(&p.prompt));
    }
    for (uri, (server, r)) in view.resources.iter().filter(|(_, (s, _))| fresh(s)) {
        b.item(server, Family::Resources, uri, val(r));
    }
    for (server, t) in view.templates.iter().filter(|(s, _)| fresh(s)) {
        b.item(server, Family::ResourceTemplates, &t.uri_template, val(t));
    }
    for (uri, sk) in view.skills.iter().filter(|(_, s)| fresh(&s.server)) {
        b.item(&sk.server, Family::Skills, uri, val(&sk.skill));
    }
    b.build(env!("CARGO_PKG_VERSION"), config_revision)
        .map_err(|e| Refusal::new(ContractCode::CatalogSnapshotIncomplete, e.to_string()))
}

fn val<T: Serialize>(x: &T) -> serde_json::Value {
    serde_json::to_value(x).unwrap_or(serde_json::Value::Null)
}

impl Multiplexer {
    /// The reconciler of this gateway.
    pub fn reconciler(&self) -> &Arc<Reconciler> {
        &self.reconciler
    }

    /// The payload of a refusal, with the served identity.
    pub fn contract_error(&self, request_id: &str, refusal: &Refusal) -> ContractError {
        tracing::warn!(request_id, code = refusal.code.as_str(), detail = %refusal.detail, "catalog contract refusal");
        let served = self.reconciler.served();
        ContractError {
            request_id: request_id.into(),
            code: refusal.code,
            retryable: refusal.code.retryable(),
            catalog_generation: served.generation,
            snapshot_digest: served.snapshot.digest.clone(),
        }
    }

    /// The refresh: probes every child expected to answer (up now) under one `deadline`, builds
    /// the candidate beside the served view, and hands it to the reconciler. A child that fails
    /// its probe rejects the candidate; a child already unavailable is carried as unavailable,
    /// one restarting with its served catalog. Nothing a probe finds is visible to sessions
    /// before the candidate is published; a refused refresh changes nothing.
    pub async fn reconcile(
        &self,
        deadline: Duration,
    ) -> Result<crate::catalog::reconciler::Published, Refusal> {
        let fleet = self.fleet();
        let expected: Vec<_> = fleet
            .children
            .values()
            .filter(|c| c.status().state == crate::child::ChildState::Up)
            .cloned()
            .collect();
        let probes = expected
            .iter()
            .map(|c| async move { (c.name().to_string(), c.probe_catalog(deadline).await) });
        let results = tokio::time::timeout(deadline, futures::future::join_all(probes))
            .await
            .map_err(|_| {
                Refusal::new(
                    ContractCode::RefreshDeadlineExceeded,
                    format!("probing did not finish within {deadline:?}"),
                )
            })?;
        if results
            .iter()
            .any(|(_, r)| r.as_ref().is_err_and(|e| e.code == "catalog-probe-timeout"))
        {
            return Err(Refusal::new(
                ContractCode::RefreshDeadlineExceeded,
                format!("a child did not list within {deadline:?}"),
            ));
        }
        if let Some((server, Err(e))) = results.iter().find(|(_, r)| r.is_err()) {
            return Err(Refusal::new(
                ContractCode::CatalogSnapshotIncomplete,
                format!("{server}: {}: {}", e.code, e.message),
            ));
        }
        // An optional family that could not be listed keeps the child serving its tools, but
        // an explicit refresh does not publish a candidate missing it.
        if let Some((server, family, e)) = results.iter().find_map(|(n, r)| {
            let (catalog, _) = r.as_ref().ok()?;
            let (family, e) = catalog.unavailable.iter().next()?;
            Some((n, family, e))
        }) {
            return Err(Refusal::new(
                ContractCode::CatalogSnapshotIncomplete,
                format!("{server}: {family} unavailable: {}: {}", e.code, e.message),
            ));
        }
        let probed: HashMap<String, (Arc<crate::catalog::ChildCatalog>, u64)> = results
            .into_iter()
            .filter_map(|(n, r)| r.ok().map(|c| (n, c)))
            .collect();
        // The candidate view: probed catalogs for the children that answered, the served ones
        // for the rest (unavailable children contribute a marker only).
        let mut catalogs = super::served_catalogs(&fleet);
        for (name, (catalog, _)) in &probed {
            let fp = catalog.fingerprint();
            catalogs.insert(name.clone(), (catalog.clone(), fp));
        }
        let (view, _) = super::build_view(&fleet, &self.guard(&fleet, catalogs), false);
        let availability = self.availability();
        let served = self.reconciler().served();
        let candidate = candidate(
            &view,
            availability.into_iter().map(|(n, a)| {
                let a = if probed.contains_key(&n) { None } else { a };
                (n, a)
            }),
            &fleet.info.config_revision,
            Some(&served.snapshot),
        )?;
        drop(served);
        drop(view);
        let published = self.reconciler.publish(candidate).await;
        let Ok(published) = published else {
            drop(probed);
            super::release_free_memory();
            return published;
        };
        // Published: the probed catalogs become the served ones, in one view swap.
        for (name, (catalog, generation)) in probed {
            if let Some(c) = fleet.children.get(&name) {
                c.adopt_catalog(catalog, generation);
            }
        }
        self.rebuild_view().await;
        super::release_free_memory();
        Ok(published)
    }

    /// `catalog_refresh` (scope manage).
    pub async fn refresh(
        &self,
        caller: &super::Caller,
        raw: serde_json::Value,
    ) -> Result<RefreshResult, ContractError> {
        let request_id = raw
            .get("request_id")
            .and_then(|v| v.as_str())
            .filter(|s| valid_request_id(s))
            .unwrap_or_default()
            .to_string();
        if caller.authorize(super::Operation::Refresh).is_err() {
            return Err(self.contract_error(&request_id, &denied()));
        }
        let schema =
            |detail: String| Refusal::new(ContractCode::RefreshRequestSchemaMismatch, detail);
        let req: RefreshRequest = serde_json::from_value(raw)
            .map_err(|e| self.contract_error(&request_id, &schema(e.to_string())))?;
        if !valid_request_id(&req.request_id)
            || !(1..=128).contains(&req.expected_config_revision.len())
            || !is_hex64(&req.expected_snapshot_digest)
            || !(1..=120_000).contains(&req.deadline_ms)
        {
            return Err(
                self.contract_error(&request_id, &schema("a field is outside its bounds".into()))
            );
        }
        let fleet = self.fleet();
        let served = self.reconciler.served();
        let stale = if req.expected_config_revision != fleet.info.config_revision {
            Some(Refusal::new(
                ContractCode::ConfigRevisionStale,
                "expected config revision is not served",
            ))
        } else if req.expected_catalog_generation != served.generation {
            Some(Refusal::new(
                ContractCode::CatalogGenerationStale,
                "expected generation is not served",
            ))
        } else if req.expected_snapshot_digest != served.snapshot.digest {
            Some(Refusal::new(
                ContractCode::CatalogDigestMismatch,
                "expected digest is not served",
            ))
        } else {
            None
        };
        if let Some(r) = stale {
            return Err(self.contract_error(&req.request_id, &r));
        }
        let published = self
            .reconcile(Duration::from_millis(req.deadline_ms))
            .await
            .map_err(|r| self.contract_error(&req.request_id, &r))?;
        let served = self.reconciler.served();
        Ok(RefreshResult {
            request_id: req.request_id,
            served_instance_id: self.instance_id().to_string(),
            release_id: env!("CARGO_PKG_VERSION").into(),
            config_revision: served.snapshot.config_revision.clone(),
            catalog_generation: published.generation,
            snapshot_digest: published.digest,
            changed: published.changed,
            reingestion_state: "reconciled",
            reconciliation_receipt_digest: published.receipt,
        })
    }

    /// `catalog_dispatch` (scope delegate): calls a tool resolved against the exact generation
    /// and digest named. A child failure is a [`Dispatched::Failed`], not a contract refusal.
    pub async fn dispatch(
        &self,
        caller: &super::Caller,
        raw: serde_json::Value,
        cx: super::CallContext,
    ) -> Result<Dispatched, ContractError> {
        if caller.authorize(super::Operation::Dispatch).is_err() {
            return Err(self.contract_error("", &denied()));
        }
        let schema =
            |detail: String| Refusal::new(ContractCode::RefreshRequestSchemaMismatch, detail);
        let req: DispatchRequest = serde_json::from_value(raw)
            .map_err(|e| self.contract_error("", &schema(e.to_string())))?;
        if req.tool_name.is_empty() || !is_hex64(&req.expected_snapshot_digest) {
            return Err(self.contract_error(
                "",
                &schema("tool_name or expected_snapshot_digest is malformed".into()),
            ));
        }
        let served = self.reconciler.served();
        if req.expected_catalog_generation != served.generation {
            return Err(self.contract_error(
                "",
                &Refusal::new(
                    ContractCode::CatalogGenerationStale,
                    "generation not served",
                ),
            ));
        }
        if req.expected_snapshot_digest != served.snapshot.digest {
            return Err(self.contract_error(
                "",
                &Refusal::new(ContractCode::CatalogDigestMismatch, "digest not served"),
            ));
        }
        let not_visible = |detail: &str| {
            self.contract_error(
                "",
                &Refusal::new(ContractCode::DispatcherTargetNotVisible, detail),
            )
        };
        let Some((server, descriptor)) = served.snapshot.tool(&req.tool_name) else {
            return Err(not_visible("tool is not in the snapshot"));
        };
        let view = self.view();
        let Some(entry) = view
            .tools
            .get(&req.tool_name)
            .filter(|t| t.server == server)
        else {
            return Err(not_visible("live route no longer matches the snapshot"));
        };
        let Some(child) = self.child(server) else {
            return Err(not_visible("server left the fleet"));
        };
        if caller
            .authorize_child(super::Operation::Dispatch, child.spec())
            .is_err()
        {
            return Err(self.contract_error("", &denied()));
        }
        if entry.held {
            return Ok(Dispatched::Failed(super::forward::held(
                server,
                &req.tool_name,
            )));
        }
        if let Err(message) =
            super::bounds::check_arguments(&req.arguments, &child.spec().argument_limits)
        {
            crate::telemetry::metrics().arguments_out_of_bounds(server);
            return Ok(Dispatched::Failed(super::MuxError::OutOfBounds {
                server: Some(server.to_string()),
                message,
            }));
        }
        let read_only = entry
            .tool
            .annotations
            .as_ref()
            .and_then(|a| a.read_only_hint)
            .unwrap_or(false);
        let schema_of = |v: &serde_json::Value| v.get("inputSchema").map(canonical_json);
        let snapshot_schema = serde_json::from_str::<serde_json::Value>(descriptor)
            .ok()
            .and_then(|v| schema_of(&v));
        let mut params = CallToolRequestParams::new(entry.original.clone());
        params.arguments = Some(req.arguments);
        let failed = |e: CallError| Dispatched::Failed(super::MuxError::child(server, e));
        let target = super::forward::ToolTarget {
            child: child.clone(),
            server: server.to_string(),
            original: entry.original.clone(),
            read_only,
            tool: Some(entry.tool.clone()),
        };
        // Stages 1-3 of the pipeline answer above with the contract's codes; a deployment's own
        // stages run here as on every other path.
        let admission = super::pipeline::Admission {
            caller,
            name: &req.tool_name,
            arguments: super::pipeline::Arguments::Map(params.arguments.as_ref()),
            entry: super::pipeline::Entry::Dispatch,
        };
        if let Err(refused) = self.deployment_stages(&admission, &target) {
            return Ok(Dispatched::Failed(refused));
        }
        let call = |params: CallToolRequestParams| {
            let child = child.clone();
            let cx = cx.clone();
            let retry = self.crash_retry(caller, &req.tool_name, &target, true);
            async move { self.call_child(caller, &child, params, retry, cx).await }
        };
        // A meta tool's result cannot carry an input round (None: refused).
        let complete = |r: rmcp::model::CallToolResponse| match r {
            rmcp::model::CallToolResponse::Complete(r) => Some(r),
            _ => None,
        };
        let refused = || Dispatched::Failed(super::forward::input_required_in_dispatch(server));
        let result = match call(params.clone()).await.map(complete) {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(refused()),
            Err(CallError::Rpc(e))
                if read_only && e.message.to_lowercase().contains("unknown tool") =>
            {
                CallToolResult::error(vec![rmcp::model::ContentBlock::text(e.message.to_string())])
            }
            Err(e) => return Ok(failed(e)),
        };
        let unknown = result.is_error == Some(true)
            && result.content.iter().any(|c| {
                c.as_text()
                    .is_some_and(|t| t.text.to_lowercase().contains("unknown tool"))
            });
        if !(unknown && read_only) {
            return Ok(Dispatched::Result(result));
        }
        // A read-only tool in the snapshot that its child calls unknown: relist the same
        // connection generation once and retry once if the descriptor is unchanged.
        let generation = child.status().connection_generation;
        if !self.retry_budget.take(server, generation) {
            return Ok(Dispatched::Result(result));
        }
        let Ok(relisted_generation) = child.relist(Duration::from_secs(10)).await else {
            return Ok(Dispatched::Result(result));
        };
        if relisted_generation != generation {
            return Ok(Dispatched::Result(result));
        }
        self.rebuild_view().await;
        let view = self.view();
        let same = view
            .tools
            .get(&req.tool_name)
            .filter(|t| t.server == server)
            .map(|t| schema_of(&serde_json::to_value(&t.tool).unwrap_or_default()))
            .is_some_and(|s| s == snapshot_schema);
        if !same {
            return Ok(Dispatched::Result(result));
        }
        tracing::info!(server, tool = %req.tool_name, "retrying a read-only dispatch after an unknown-tool answer");
        match call(params).await.map(complete) {
            Ok(Some(r)) => Ok(Dispatched::Result(r)),
            Ok(None) => Ok(refused()),
            Err(e) => Ok(failed(e)),
        }
    }

    /// A receipt-style digest of arbitrary JSON (used for REST/MCP parity tests).
    pub fn digest_of(value: &serde_json::Value) -> String {
        sha256_hex(canonical_json(value).as_bytes())
    }
}

impl Multiplexer {
    /// Background work for catalog generations: the startup publication (after at most
    /// [`STARTUP_SETTLE`], with children still starting marked unavailable), a republication
    /// whenever a child's availability differs from the served snapshot (recovery or failure is
    /// a new generation), the heartbeat, and following generations other replicas publish.
    pub(super) fn spawn_generation_tasks(self: &Arc<Self>) {
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

    /// The candidate of what is served now (no probing), reusing the served snapshot's parts
    /// of children that did not change.
    pub(super) fn current_candidate(
        &self,
    ) -> Result<crate::catalog::snapshot::Snapshot, crate::catalog::reconciler::Refusal> {
        let fleet = self.fleet();
        let served = self.reconciler.served();
        candidate(
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
}
