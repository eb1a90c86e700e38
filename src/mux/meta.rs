//! Meta-tool requests and answers: find_tools, list_catalog, load_tools, unload_tools,
//! multiplexer_status. Inputs reject unknown fields; every refusal carries a stable code.

use super::Refusal;
use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Caller, Multiplexer, MuxError, NotifyOutcome, Operation, Session};
use crate::child::{ChildState, ErrorInfo};
use crate::discovery;

/// `find_tools` input.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FindToolsArgs {
    /// What you want to do, in words (1..4096 characters).
    pub query: String,
    /// How many results (0..100; 0 = default 8).
    #[serde(default)]
    pub top_k: u32,
}

/// One `find_tools` result: a tool (`kind: "tool"`) or a skill (`kind: "skill"`). Fields that
/// belong to one kind only are absent from the other's rows.
#[derive(Debug, Clone, Serialize)]
pub struct FoundTool {
    /// `tool` or `skill`.
    pub kind: &'static str,
    /// Tools: the exposed name (pass it to load_tools, tools/call and catalog_dispatch).
    /// Skills: the front matter name.
    pub name: String,
    /// Owning server.
    pub server: String,
    /// Tools: the child's own name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// Skills: the SKILL.md URI; read it with `resources/read` through the gateway.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// Description.
    pub description: String,
    /// Relevance (fused BM25F + embeddings in 0..1, or BM25F when ranked lexically; 4 places).
    pub score: f64,
    /// Tools: the full input schema.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<serde_json::Value>,
    /// Tools: whether it is in this session's tool list (loaded or eager).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loaded: Option<bool>,
    /// Age in seconds (a float with one decimal) of the server's served catalog: the time since
    /// the gateway last listed it from the child (a listing that found it unchanged counts).
    pub staleness: f64,
}

/// `find_tools` answer.
#[derive(Debug, Clone, Serialize)]
pub struct FindToolsResult {
    /// The query.
    pub query: String,
    /// Number of results.
    pub count: usize,
    /// Ranked results.
    pub results: Vec<FoundTool>,
    /// The ranking used: `lexical`, `static` or `semantic`.
    pub ranker: &'static str,
    /// Servers that could not contribute: name → code.
    pub unavailable: BTreeMap<String, String>,
    /// Servers the query names that were still starting when it arrived: find_tools waited for
    /// them (at most the discovery budget for the whole request). Absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub waited_for: Vec<String>,
}

/// `list_catalog` input.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListCatalogArgs {
    /// Drill down into one server.
    #[serde(default)]
    pub server: Option<String>,
    /// Include tool names per server (default true).
    #[serde(default)]
    pub include_tools: Option<bool>,
}

/// `load_tools` / `unload_tools` input.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoadArgs {
    /// Exposed tool names (≤ 128).
    #[serde(default)]
    pub tools: Vec<String>,
    /// Server names: every enabled tool of each (≤ 32).
    #[serde(default)]
    pub servers: Vec<String>,
}

/// `load_tools` answer.
#[derive(Debug, Clone, Serialize)]
pub struct LoadResult {
    /// Names newly added to this session's tool list.
    pub loaded: Vec<String>,
    /// Names that were already there.
    pub already_loaded: Vec<String>,
    /// Requested names or servers that could not be loaded: name → reason.
    pub failed: BTreeMap<String, ErrorInfo>,
    /// Tools in this session's list now (eager included).
    pub session_total: usize,
    /// `tools/list_changed` outcome (`not_needed` when nothing changed).
    pub notification: NotificationState,
}

/// `unload_tools` answer.
#[derive(Debug, Clone, Serialize)]
pub struct UnloadResult {
    /// Names removed from this session's list.
    pub unloaded: Vec<String>,
    /// Requested names that were not loaded.
    pub not_loaded: Vec<String>,
    /// Tools in this session's list now.
    pub session_total: usize,
    /// `tools/list_changed` outcome.
    pub notification: NotificationState,
}

/// What happened to the list_changed notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NotificationState {
    /// Nothing changed, nothing sent.
    NotNeeded,
    /// Written to the session's open stream (not a delivery receipt).
    Sent,
    /// The session has no open stream; the client sees the change on its next tools/list.
    NoStream,
    /// Writing failed.
    Failed,
}

impl From<Option<NotifyOutcome>> for NotificationState {
    fn from(o: Option<NotifyOutcome>) -> Self {
        match o {
            None => NotificationState::NotNeeded,
            Some(NotifyOutcome::Sent) => NotificationState::Sent,
            Some(NotifyOutcome::NoStream) => NotificationState::NoStream,
            Some(NotifyOutcome::Failed) => NotificationState::Failed,
        }
    }
}

/// Why a child without a catalog cannot contribute: starting, or the failure that keeps it
/// down (a boot failure being retried keeps its own code).
fn unavailable_code(state: ChildState, err: Option<&ErrorInfo>) -> String {
    match (state, err) {
        (ChildState::Starting, _) => "child-starting".into(),
        (_, Some(e)) => e.code.clone(),
        (ChildState::Restarting, None) => "child-restarting".into(),
        _ => "child-unavailable".into(),
    }
}

/// The one answer for a server a caller may not name: hidden by `requiredScopes` or not in the
/// fleet, the caller cannot tell which.
fn server_not_in_fleet(server: &str) -> ErrorInfo {
    ErrorInfo {
        code: "server-not-in-fleet".into(),
        message: format!("'{server}' is not in the fleet"),
    }
}

/// Where the fleet came from (a file path, a Kubernetes object): for `manage` callers only; a
/// caller below sees `null` (no filesystem paths to callers who cannot change the fleet).
fn config_source(caller: &Caller, source: &str) -> serde_json::Value {
    if caller.identity.scope >= crate::auth::Scope::Manage {
        source.into()
    } else {
        serde_json::Value::Null
    }
}

impl Multiplexer {
    /// `find_tools`: ranked tools with full input schemas.
    pub async fn find_tools(
        &self,
        caller: &Caller,
        args: FindToolsArgs,
    ) -> Result<FindToolsResult, MuxError> {
        caller.authorize(Operation::FindTools)?;
        let session = &caller.session;
        let fleet = self.fleet();
        let len = args.query.chars().count();
        if !(1..=4096).contains(&len) {
            return Err(MuxError::bounds("query must be 1..4096 characters"));
        }
        if args.top_k > 100 {
            return Err(MuxError::bounds("top_k must be 0..100"));
        }
        let k = if args.top_k == 0 {
            self.settings.default_top_k
        } else {
            args.top_k as usize
        };
        // Domain-first: the servers the query names (among those this caller sees) that are
        // still starting are waited for, under one budget; nobody else delays the answer.
        let waited_for: Vec<String> = {
            let names: Vec<discovery::domain::ServerNames<'_>> = fleet
                .children
                .iter()
                .filter(|(_, c)| caller.sees(c.spec()))
                .map(|(name, c)| discovery::domain::ServerNames {
                    name,
                    prefix: fleet.prefixes.get(name).map_or("", String::as_str),
                    category: c.spec().category.as_deref(),
                    hint: c.spec().hint.as_deref(),
                })
                .collect();
            discovery::domain::named_servers(&names, &args.query)
                .into_iter()
                .filter(|n| {
                    fleet.children.get(*n).is_some_and(|c| {
                        matches!(
                            c.status().state,
                            ChildState::Starting | ChildState::Restarting
                        )
                    })
                })
                .map(str::to_string)
                .collect()
        };
        self.settle(&waited_for.iter().map(String::as_str).collect::<Vec<_>>())
            .await;
        let view = self.view();
        let loaded = session.loaded();
        let hidden = fleet.children.values().any(|c| !caller.sees(c.spec()));
        // Hidden children's segments are skipped by the index itself (neither results nor
        // collection statistics), so the caller's top k is exact.
        let visible: Option<std::collections::HashSet<String>> = hidden.then(|| {
            fleet
                .children
                .iter()
                .filter(|(_, c)| caller.sees(c.spec()))
                .map(|(n, _)| n.clone())
                .collect()
        });
        // Ranking is CPU work (a semantic query embedding takes milliseconds): off the async
        // workers, so other sessions' requests are not held behind it.
        let found = {
            let (view, query) = (view.clone(), args.query.clone());
            tokio::task::spawn_blocking(move || {
                view.index.search(&query, k, &|server: &str| {
                    visible.as_ref().is_none_or(|v| v.contains(server))
                })
            })
            .await
            .map_err(|e| {
                MuxError::refused(
                    Refusal::DiscoveryFailed,
                    format!("find_tools ranking failed: {e}"),
                )
            })?
        };
        let ranker = found.ranker.as_str();
        let now = tokio::time::Instant::now();
        let mut staleness = BTreeMap::new();
        let mut age = |server: &str| -> f64 {
            *staleness.entry(server.to_string()).or_insert_with(|| {
                fleet
                    .children
                    .get(server)
                    .and_then(|c| c.status().catalog_listed_at)
                    .map_or(0.0, |t| {
                        (now.saturating_duration_since(t).as_secs_f64() * 10.0).floor() / 10.0
                    })
            })
        };
        let results = found
            .hits
            .into_iter()
            .filter_map(|hit| {
                if hidden && !self.visible_to(caller, &hit.server) {
                    return None;
                }
                let score = (hit.score * 10_000.0).round() / 10_000.0;
                if let Some(t) = view.tools.get(&hit.key).filter(|t| t.server == hit.server) {
                    return Some(FoundTool {
                        kind: "tool",
                        name: t.name.clone(),
                        server: t.server.clone(),
                        tool: Some(t.original.clone()),
                        uri: None,
                        description: t
                            .tool
                            .description
                            .as_deref()
                            .unwrap_or_default()
                            .to_string(),
                        score,
                        input_schema: Some(serde_json::Value::Object(
                            (*t.tool.input_schema).clone(),
                        )),
                        loaded: Some(t.eager || loaded.contains(&t.name)),
                        staleness: age(&t.server),
                    });
                }
                let s = view
                    .skills
                    .get(&hit.key)
                    .filter(|s| s.server == hit.server)?;
                Some(FoundTool {
                    kind: "skill",
                    name: s.skill.name.clone(),
                    server: s.server.clone(),
                    tool: None,
                    uri: Some(s.skill.uri.clone()),
                    description: s.skill.description.clone(),
                    score,
                    input_schema: None,
                    loaded: None,
                    staleness: age(&s.server),
                })
            })
            .take(k)
            .collect::<Vec<_>>();
        let unavailable = fleet
            .children
            .iter()
            .filter(|(_, c)| caller.sees(c.spec()))
            .filter_map(|(n, c)| {
                let s = c.status();
                (s.state != ChildState::Up && s.catalog.is_none())
                    .then(|| (n.clone(), unavailable_code(s.state, s.last_error.as_ref())))
            })
            .collect();
        Ok(FindToolsResult {
            query: args.query,
            count: results.len(),
            results,
            ranker,
            unavailable,
            waited_for,
        })
    }

    /// `load_tools`: adds tools (or whole servers) to the session's tool list.
    pub async fn load_tools(
        &self,
        caller: &Caller,
        args: LoadArgs,
    ) -> Result<LoadResult, MuxError> {
        caller.authorize(Operation::LoadTools)?;
        let session = &caller.session;
        let fleet = self.fleet();
        if args.tools.len() > 128 || args.servers.len() > 32 {
            return Err(MuxError::bounds(
                "load_tools takes at most 128 tools and 32 servers",
            ));
        }
        // Only servers this caller may see are waited for: a hidden one answers as a missing
        // one, in what it says and in how long it takes to say it.
        let servers: Vec<String> = args
            .servers
            .iter()
            .cloned()
            .chain(args.tools.iter().filter_map(|t| self.server_of(t)))
            .filter(|s| self.visible_to(caller, s))
            .collect();
        self.settle(&servers.iter().map(String::as_str).collect::<Vec<_>>())
            .await;
        let view = self.view();
        let mut wanted = Vec::new();
        let mut failed = BTreeMap::new();
        for name in &args.tools {
            let shown = self
                .server_of(name)
                .is_none_or(|s| self.visible_to(caller, &s));
            if shown && view.tools.contains_key(name) {
                wanted.push(name.clone());
            } else {
                failed.insert(name.clone(), self.missing_reason(caller, name));
            }
        }
        for server in &args.servers {
            // A server hidden by `requiredScopes` and one not in the fleet get one answer.
            match fleet
                .children
                .get(server)
                .filter(|_| self.visible_to(caller, server))
            {
                None => {
                    failed.insert(server.clone(), server_not_in_fleet(server));
                }
                Some(c) => {
                    let s = c.status();
                    if s.catalog.is_none() {
                        failed.insert(
                            server.clone(),
                            ErrorInfo {
                                code: unavailable_code(s.state, s.last_error.as_ref()),
                                message: format!("server '{server}' is not serving"),
                            },
                        );
                        continue;
                    }
                    wanted.extend(
                        view.tools
                            .values()
                            .filter(|t| &t.server == server)
                            .map(|t| t.name.clone()),
                    );
                }
            }
        }
        let (mut loaded, mut already) = (Vec::new(), Vec::new());
        let current = session.loaded();
        for name in wanted {
            let eager = view.tools.get(&name).is_some_and(|t| t.eager);
            if eager || current.contains(&name) || loaded.contains(&name) {
                already.push(name);
            } else {
                loaded.push(name);
            }
        }
        self.change_loaded(session, loaded.clone(), Vec::new())
            .await?;
        already.sort();
        already.dedup();
        let notification = self.refresh_session(session).await.into();
        Ok(LoadResult {
            loaded,
            already_loaded: already,
            failed,
            session_total: self.visible_tools(session).len(),
            notification,
        })
    }

    /// `unload_tools`: removes tools (or every tool of servers) from the session's list.
    pub async fn unload_tools(
        &self,
        caller: &Caller,
        args: LoadArgs,
    ) -> Result<UnloadResult, MuxError> {
        caller.authorize(Operation::UnloadTools)?;
        let session = &caller.session;
        if args.tools.len() > 128 || args.servers.len() > 32 {
            return Err(MuxError::bounds(
                "unload_tools takes at most 128 tools and 32 servers",
            ));
        }
        let (mut unloaded, mut not_loaded) = (Vec::new(), Vec::new());
        let mut set = session.loaded();
        for name in &args.tools {
            if set.remove(name) {
                unloaded.push(name.clone())
            } else {
                not_loaded.push(name.clone())
            }
        }
        for server in &args.servers {
            let victims: Vec<String> = set
                .iter()
                .filter(|n| self.server_of(n).as_deref() == Some(server.as_str()))
                .cloned()
                .collect();
            for v in victims {
                set.remove(&v);
                unloaded.push(v);
            }
        }
        self.change_loaded(session, Vec::new(), unloaded.clone())
            .await?;
        let notification = self.refresh_session(session).await.into();
        Ok(UnloadResult {
            unloaded,
            not_loaded,
            session_total: self.visible_tools(session).len(),
            notification,
        })
    }

    /// Adds and removes loaded names: in the session's store first when it has one (atomically,
    /// so a change made meanwhile through another replica is kept), then in this process.
    async fn change_loaded(
        &self,
        session: &Session,
        add: Vec<String>,
        remove: Vec<String>,
    ) -> Result<(), MuxError> {
        if add.is_empty() && remove.is_empty() {
            return Ok(());
        }
        match session.binding() {
            Some(b) => {
                let set = b
                    .store
                    .change_loaded(&b.key, add, remove)
                    .await
                    .map_err(|e| {
                        MuxError::refused(Refusal::SessionStoreUnavailable, e.to_string())
                    })?;
                session.set_loaded(set);
            }
            None => {
                if let Ok(mut set) = session.loaded.lock() {
                    set.extend(add);
                    for r in &remove {
                        set.remove(r);
                    }
                }
            }
        }
        Ok(())
    }

    /// The server an exposed tool name belongs to (by the name table or by prefix).
    pub fn server_of(&self, name: &str) -> Option<String> {
        if let Some(t) = self.view().tools.get(name) {
            return Some(t.server.clone());
        }
        let (prefix, _) = name.split_once(crate::catalog::naming::SEPARATOR)?;
        self.fleet()
            .prefixes
            .iter()
            .find(|(_, p)| p.as_str() == prefix)
            .map(|(s, _)| s.clone())
    }

    /// Why a tool this caller named is not loadable. A tool of a server hidden from the caller
    /// is "not in the catalog", like one of a server that does not exist.
    fn missing_reason(&self, caller: &Caller, name: &str) -> ErrorInfo {
        let fleet = self.fleet();
        let view = self.view();
        let not_in_catalog = || ErrorInfo {
            code: "tool-not-in-catalog".into(),
            message: format!("'{name}' is not in the fleet catalog"),
        };
        if self
            .server_of(name)
            .is_some_and(|s| !self.visible_to(caller, &s))
        {
            return not_in_catalog();
        }
        if view
            .disabled
            .iter()
            .filter(|(server, _)| self.visible_to(caller, server))
            .any(|(_, v)| v.iter().any(|n| n == name))
        {
            return ErrorInfo {
                code: "tool-disabled".into(),
                message: "disabled by enabledTools/disabledTools".into(),
            };
        }
        if let Some(server) = self.server_of(name).as_deref()
            && let Some(c) = fleet.children.get(server)
        {
            let s = c.status();
            if s.state != ChildState::Up && s.catalog.is_none() {
                return ErrorInfo {
                    code: unavailable_code(s.state, s.last_error.as_ref()),
                    message: format!("server '{server}' is not serving"),
                };
            }
        }
        not_in_catalog()
    }

    /// Identity of the served catalog (from the reconciler).
    pub fn catalog_identity(&self) -> serde_json::Value {
        let served = self.reconciler().served();
        serde_json::json!({
            "served_instance_id": self.instance_id(),
            "release_id": env!("CARGO_PKG_VERSION"),
            "config_revision": self.fleet().info.config_revision,
            "catalog_generation": served.generation,
            "snapshot_digest": served.snapshot.digest,
            "replica_id": self.reconciler().replica(),
        })
    }

    /// `list_catalog`: identity plus one row per server (or a drill-down into one).
    pub async fn list_catalog(
        &self,
        caller: &Caller,
        args: ListCatalogArgs,
    ) -> Result<serde_json::Value, MuxError> {
        caller.authorize(Operation::ListCatalog)?;
        let session = &caller.session;
        let fleet = self.fleet();
        if args.server.as_ref().is_some_and(|s| s.len() > 128) {
            return Err(MuxError::bounds("server must be at most 128 characters"));
        }
        let include_tools = args.include_tools.unwrap_or(true);
        if include_tools {
            self.freshen().await;
        }
        let view = self.view();
        let loaded = session.loaded();
        let row = |name: &str| -> serde_json::Value {
            let c = &fleet.children[name];
            let s = c.status();
            let tools: Vec<&super::ToolEntry> =
                view.tools.values().filter(|t| t.server == name).collect();
            let disabled = view.disabled.get(name).cloned().unwrap_or_default();
            let mut row = serde_json::json!({
                "server": name,
                "prefix": fleet.prefixes.get(name),
                "state": s.state,
                "expose": c.spec().expose,
                "tool_count": tools.len() + disabled.len(),
                "enabled_count": tools.len(),
                "prompt_count": s.catalog.as_ref().map_or(0, |c| c.prompts.len()),
                "resource_count": s.catalog.as_ref().map_or(0, |c| c.resources.len()),
                "error": s.last_error,
            });
            if let Some(families) = unavailable_families(&s) {
                row["unavailable_families"] = families;
            }
            if let Some(cat) = &c.spec().category {
                row["category"] = cat.clone().into();
            }
            if let Some(hint) = &c.spec().hint {
                row["hint"] = hint.clone().into();
            }
            if include_tools {
                row["tools"] = tools
                    .iter()
                    .map(|t| {
                        serde_json::json!({
                            "name": t.name,
                            "tool": t.original,
                            "description": t.tool.description,
                            "loaded": t.eager || loaded.contains(&t.name),
                        })
                    })
                    .collect();
                row["disabled_tools"] = disabled.into();
            }
            row
        };
        let shown = |name: &str| {
            fleet
                .children
                .get(name)
                .is_some_and(|c| caller.sees(c.spec()))
        };
        if let Some(server) = &args.server {
            if !shown(server) {
                let e = server_not_in_fleet(server);
                return Err(MuxError::refused(Refusal::ServerNotInFleet, e.message));
            }
            return Ok(
                serde_json::json!({"catalog_identity": self.catalog_identity(), "server": row(server)}),
            );
        }
        let servers: Vec<serde_json::Value> = fleet
            .children
            .keys()
            .filter(|n| shown(n))
            .map(|n| row(n))
            .collect();
        let skipped: Vec<super::Skipped> = view
            .skipped
            .iter()
            .filter(|s| shown(&s.server))
            .map(|s| super::Skipped {
                with: s.with.iter().filter(|w| shown(w)).cloned().collect(),
                ..s.clone()
            })
            .collect();
        Ok(serde_json::json!({
            "catalog_identity": self.catalog_identity(),
            "total_servers": servers.len(),
            "total_tools": view.tools.values().filter(|t| shown(&t.server)).count(),
            "unavailable": self
                .availability()
                .into_iter()
                .filter_map(|(n, a)| a.filter(|_| shown(&n)).map(|code| (n, code)))
                .collect::<BTreeMap<_, _>>(),
            "servers": servers,
            "skipped": skipped,
            "config": {"source": config_source(caller, &fleet.info.source), "refused": fleet.info.refused, "disabled": fleet.info.disabled},
        }))
    }

    /// `multiplexer_status`: per-child runtime state of the children the caller may see.
    pub fn status(&self, caller: &Caller) -> Result<serde_json::Value, MuxError> {
        caller.authorize(Operation::Status)?;
        let mut status = self.status_for(|spec| caller.sees(spec));
        status["config_source"] = config_source(caller, &self.fleet().info.source);
        Ok(status)
    }

    /// Status of the children `shown` admits (the status writer and readiness see all).
    pub fn status_for(
        &self,
        shown: impl Fn(&crate::config::ChildSpec) -> bool,
    ) -> serde_json::Value {
        let fleet = self.fleet();
        let view = self.view();
        // One pass over the view (per child it would be children × tools: 1.7 s at 200 × 517).
        let mut tool_counts: std::collections::HashMap<&str, usize> =
            std::collections::HashMap::with_capacity(fleet.children.len());
        for tool in view.tools.values() {
            *tool_counts.entry(tool.server.as_str()).or_default() += 1;
        }
        let children: serde_json::Map<String, serde_json::Value> = fleet
            .children
            .iter()
            .filter(|(_, c)| shown(c.spec()))
            .map(|(n, c)| {
                let s = c.status();
                let load = c.load();
                (
                    n.clone(),
                    serde_json::json!({
                        "server": n,
                        "state": s.state,
                        "breaker": c.breaker_state(),
                        "principal_breakers_open": c.principal_breakers_open(),
                        "in_flight": load.in_flight,
                        "queued": load.queued,
                        "restarts": s.restarts,
                        "max_concurrency": c.spec().limits.max_concurrency,
                        "connection_generation": s.connection_generation,
                        "protocol": s.protocol,
                        "catalog_revision": s.fingerprint,
                        "tool_count": tool_counts.get(n.as_str()).copied().unwrap_or(0),
                        "session_connections": c.session_connections(),
                        "last_error": s.last_error,
                        "unavailable_families": unavailable_families(&s),
                        "drift": view.drift.get(n),
                        // Keyed opaque freshness identity of the declaration (src/secrets/attest.rs).
                        "declaration_identity": crate::config::attest::freshness_identity(c.spec()),
                    }),
                )
            })
            .collect();
        let visible = |server: &str| {
            server.is_empty() || fleet.children.get(server).is_none_or(|c| shown(c.spec()))
        };
        let issues: Vec<&crate::config::ConfigIssue> = fleet
            .info
            .issues
            .iter()
            .filter(|i| visible(&i.server))
            .collect();
        // Items the view leaves out (conflicts, invalid names): per visible child, the other
        // claimants of a conflict only when they are visible too.
        let catalog_issues: Vec<super::Skipped> = view
            .skipped
            .iter()
            .filter(|s| !s.server.is_empty() && visible(&s.server))
            .map(|s| super::Skipped {
                with: s.with.iter().filter(|w| visible(w)).cloned().collect(),
                ..s.clone()
            })
            .collect();
        serde_json::json!({
            "catalog_identity": self.catalog_identity(),
            "total_children": children.len(),
            "children": children,
            "sessions": self.live_session_count(),
            "parked_input_calls": self.parked.count(),
            "tasks_held": self.task_count(),
            "total_tools": tool_counts
                .iter()
                .filter(|(server, _)| visible(server))
                .map(|(_, n)| n)
                .sum::<usize>(),
            "ranker": view.index.ranker(),
            "discovery": view.index.status(),
            "config_issues": issues,
            "catalog_issues": catalog_issues,
            "config_source": fleet.info.source,
            "config_revision": fleet.info.config_revision,
            "reload_error": self.reload_error(),
        })
    }
}

/// The optional families (prompts, resources, templates) a child's served catalog could not
/// list, each with its code and reason (`None` when every family listed).
fn unavailable_families(s: &crate::child::ChildStatus) -> Option<serde_json::Value> {
    s.catalog
        .as_ref()
        .filter(|c| !c.unavailable.is_empty())
        .and_then(|c| serde_json::to_value(&c.unavailable).ok())
}

/// `fleet_graph` input: one question over the knowledge-graph projection.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FleetGraphArgs {
    /// Which servers provide items whose name or description mentions this text.
    #[serde(default)]
    pub servers_providing: Option<String>,
    /// What changed between two generations: `[from, to]`.
    #[serde(default)]
    pub diff: Option<(u64, u64)>,
}

impl Multiplexer {
    /// `fleet_graph`: servers providing a term (only servers the caller may see), or the diff
    /// between two generations (whole-fleet, so refused to a caller some child is hidden from).
    pub async fn fleet_graph(
        &self,
        caller: &Caller,
        args: FleetGraphArgs,
    ) -> Result<serde_json::Value, MuxError> {
        caller.authorize(Operation::FleetGraph)?;
        let fleet = self.fleet();
        if args.diff.is_some() {
            for c in fleet.children.values() {
                caller.authorize_child(Operation::FleetGraph, c.spec())?;
            }
        }
        let projection = self.projection().clone();
        let answer =
            tokio::task::spawn_blocking(move || match (args.servers_providing, args.diff) {
                (Some(term), None) if (1..=256).contains(&term.len()) => {
                    projection.servers_providing(&term)
                }
                (None, Some((from, to))) => projection.diff(from, to),
                _ => Err(
                    "ask exactly one question: servers_providing (1..256 chars) or diff [from, to]"
                        .into(),
                ),
            })
            .await
            .map_err(|e| MuxError::refused(Refusal::FleetGraphFailed, e.to_string()))?;
        let mut answer = answer.map_err(|m| MuxError::refused(Refusal::FleetGraphFailed, m))?;
        if let Some(servers) = answer.get_mut("servers").and_then(|s| s.as_object_mut()) {
            servers.retain(|name, _| {
                fleet
                    .children
                    .get(name)
                    .is_none_or(|c| caller.sees(c.spec()))
            });
        }
        Ok(answer)
    }
}
