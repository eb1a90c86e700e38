//! Building the exposed view, and the one answer to "who owns this name or URI" that every
//! route asks (`tools/call` typed and hot path, `prompts/get`, `resources/read`, subscribe,
//! completion, and the transparent child's fallback).
//!
//! Ownership is never first-come. An item is exposed only when exactly one child claims its key
//! (a tool's or prompt's exposed name, a resource's URI, a template's URI template); a key two
//! or more children claim is a conflict (`name-conflict`, `resource-conflict`): served by none,
//! listed in `list_catalog` `skipped` and `multiplexer_status` `catalog_issues`, and refused on
//! every route — never forwarded to the transparent child either. A prefix owns its namespace:
//! a transparent child's (`prefix: ""`) name `gh__x`, where `gh` is another child's prefix, is a
//! `name-conflict` whether or not `gh` lists `x` right now. Declared precedences: a listed
//! resource URI wins over templates; among templates the longest literal prefix wins, a tie
//! between children is a conflict.
//!
//! Names follow one rule per item (`catalog::naming::check_item_name`): a tool or prompt whose
//! name breaks it, or a resource or template with a control, invisible or bidi character in its
//! URI or name (`check_display_text`), is left out alone (`item-name-invalid`, shown escaped);
//! the child's other items are served.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{Prompt, Resource, ResourceTemplate, Tool};
use serde::Serialize;
use sha2::Digest as _;

use super::{
    ExposeMode, FleetState, META_TOOLS, Multiplexer, MuxError, Refusal, drift, served_catalogs,
};
use crate::catalog::{self, naming};
use crate::discovery;
use crate::memory::release_free_memory;
use crate::telemetry::logs::escape;

/// Code of an exposed tool or prompt name claimed by more than one child.
pub const NAME_CONFLICT: &str = "name-conflict";
/// Code of a resource URI or URI template listed by more than one child.
pub const RESOURCE_CONFLICT: &str = "resource-conflict";

/// Keys served by no child because several claim them, with their claimants.
#[derive(Debug, Default)]
pub struct Conflicts {
    /// Exposed tool names.
    pub tools: BTreeMap<String, BTreeSet<String>>,
    /// Exposed prompt names.
    pub prompts: BTreeMap<String, BTreeSet<String>>,
    /// Resource URIs.
    pub resources: BTreeMap<String, BTreeSet<String>>,
    /// Resource URI templates.
    pub templates: BTreeMap<String, BTreeSet<String>>,
}

fn conflict(why: Refusal, what: &str, key: &str, servers: usize) -> MuxError {
    MuxError::refused(
        why,
        format!(
            "{what} '{}' is claimed by {servers} servers, so none serves it (see list_catalog skipped)",
            escape(key)
        ),
    )
}

impl CatalogView {
    /// The servers whose prefix's namespace (`<prefix>__…`) holds `name` (a prefix may itself
    /// contain `__`, so every split is tried).
    fn namespace_owners<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        name.match_indices(naming::SEPARATOR)
            .filter_map(|(i, _)| self.namespaces.get(&name[..i]).map(String::as_str))
    }

    /// An unlisted tool or prompt name: `Err` when no child may be given it (a conflict, a name
    /// in a prefixed child's namespace, a name breaking the name rule), else `Ok` (the
    /// transparent child may take it).
    fn unlisted_name(
        &self,
        name: &str,
        conflicts: &BTreeMap<String, BTreeSet<String>>,
        what: &str,
        unknown: impl Fn() -> MuxError,
    ) -> Result<(), MuxError> {
        if let Some(servers) = conflicts.get(name) {
            return Err(conflict(Refusal::NameConflict, what, name, servers.len()));
        }
        if let Err(reason) = naming::check_item_name(name) {
            return Err(MuxError::refused(
                Refusal::ItemNameInvalid,
                format!("'{}' is not a valid {what} name: {reason}", escape(name)),
            ));
        }
        if self.namespace_owners(name).next().is_some() {
            return Err(unknown());
        }
        Ok(())
    }

    /// Where a `tools/call` of `name` goes: its entry, `Ok(None)` for an unlisted name the
    /// transparent child may take, or the refusal.
    pub fn tool_route(&self, name: &str) -> Result<Option<&ToolEntry>, MuxError> {
        if let Some(entry) = self.tools.get(name) {
            return Ok(Some(entry));
        }
        self.unlisted_name(name, &self.conflicts.tools, "tool", || {
            MuxError::UnknownTool(name.to_string())
        })?;
        Ok(None)
    }

    /// Where a `prompts/get` (or a prompt completion) of `name` goes, like [`Self::tool_route`].
    pub fn prompt_route(&self, name: &str) -> Result<Option<&PromptEntry>, MuxError> {
        if let Some(entry) = self.prompts.get(name) {
            return Ok(Some(entry));
        }
        self.unlisted_name(name, &self.conflicts.prompts, "prompt", || {
            MuxError::UnknownPrompt(name.to_string())
        })?;
        Ok(None)
    }

    /// The server owning a resource URI: the child listing it, else the child whose template
    /// has the longest literal prefix matching it; `Ok(None)` when none does (the transparent
    /// child may take it); `Err` for a conflicted URI or a tie between children's templates.
    pub fn resource_route(&self, uri: &str) -> Result<Option<&str>, MuxError> {
        if let Some(servers) = self.conflicts.resources.get(uri) {
            return Err(conflict(
                Refusal::ResourceConflict,
                "resource",
                uri,
                servers.len(),
            ));
        }
        if let Some((server, _)) = self.resources.get(uri) {
            return Ok(Some(server));
        }
        // Conflicted templates still take part (as no one's): a URI they match best is refused.
        let served = self
            .templates
            .iter()
            .map(|(server, t)| (t.uri_template.as_str(), Some(server.as_str())));
        let conflicted = self.conflicts.templates.keys().map(|t| (t.as_str(), None));
        let mut best: Option<(usize, BTreeSet<Option<&str>>)> = None;
        for (template, owner) in served.chain(conflicted) {
            let lit = template.split('{').next().unwrap_or_default();
            if lit.is_empty() || !uri.starts_with(lit) {
                continue;
            }
            match &mut best {
                Some((len, owners)) if *len == lit.len() => {
                    owners.insert(owner);
                }
                Some((len, _)) if *len > lit.len() => {}
                _ => best = Some((lit.len(), BTreeSet::from([owner]))),
            }
        }
        match best {
            None => {
                if let Err(reason) = naming::check_display_text(uri, true) {
                    return Err(MuxError::refused(
                        Refusal::ItemNameInvalid,
                        format!("'{}' is not a valid resource URI: {reason}", escape(uri)),
                    ));
                }
                Ok(None)
            }
            Some((_, owners)) => match owners.into_iter().collect::<Vec<_>>().as_slice() {
                [Some(server)] => Ok(Some(server)),
                many => Err(conflict(
                    Refusal::ResourceConflict,
                    "resource",
                    uri,
                    many.len().max(2),
                )),
            },
        }
    }

    /// The server of a completion's resource reference: a template given by its exact URI
    /// template, else as [`Self::resource_route`].
    pub fn template_route(&self, uri: &str) -> Result<Option<&str>, MuxError> {
        if let Some(servers) = self.conflicts.templates.get(uri) {
            return Err(conflict(
                Refusal::ResourceConflict,
                "resource template",
                uri,
                servers.len(),
            ));
        }
        if let Some((server, _)) = self.templates.iter().find(|(_, t)| t.uri_template == uri) {
            return Ok(Some(server));
        }
        self.resource_route(uri)
    }
}

/// One child's items that passed its own filters and the name rule, before ownership.
struct Part<'a> {
    server: &'a str,
    eager: bool,
    held: &'a BTreeSet<String>,
    meta: [String; 2],
    tools: Vec<(String, &'a Tool)>,
    prompts: Vec<(String, &'a Prompt)>,
    resources: Vec<&'a Resource>,
    templates: Vec<&'a ResourceTemplate>,
    skills: Vec<&'a catalog::Skill>,
    hasher: sha2::Sha256,
    docs: Vec<discovery::Doc>,
}

fn skipped(server: &str, family: &'static str, original: &str, code: &'static str) -> Skipped {
    Skipped {
        server: server.to_string(),
        family,
        original: escape(original).into_owned(),
        code,
        reason: None,
        with: Vec::new(),
    }
}

/// The entry of an item whose key several servers claim (`None`: it is uncontested).
fn conflicted(
    server: &str,
    family: &'static str,
    original: &str,
    code: &'static str,
    claimants: Option<&BTreeSet<String>>,
) -> Option<Skipped> {
    claimants.map(|servers| Skipped {
        with: servers.iter().filter(|s| *s != server).cloned().collect(),
        ..skipped(server, family, original, code)
    })
}

fn claim<'k>(claims: &mut BTreeMap<&'k str, BTreeSet<&'k str>>, key: &'k str, server: &'k str) {
    claims.entry(key).or_default().insert(server);
}

/// The exposed view of `catalogs` under `fleet`'s prefixes and filters (the one naming and the
/// one ownership of every surface), and with `with_docs` the search documents of every child
/// (the served view is indexed; candidates need none).
pub(super) fn build_view(
    fleet: &FleetState,
    catalogs: &BTreeMap<String, drift::Guarded>,
    with_docs: bool,
) -> (CatalogView, Vec<(String, Vec<discovery::Doc>)>) {
    let mut view = CatalogView {
        namespaces: fleet
            .prefixes
            .iter()
            .filter(|(_, p)| !p.is_empty())
            .map(|(s, p)| (p.clone(), s.clone()))
            .collect(),
        ..CatalogView::default()
    };
    // 1. Each child's items after its own filters and the name rule.
    let mut parts: Vec<Part<'_>> = Vec::new();
    for (server, child) in &fleet.children {
        let Some(guarded) = catalogs.get(server) else {
            continue;
        };
        let cat = &guarded.catalog;
        view.fingerprints
            .insert(server.clone(), guarded.live_digest.clone());
        if let Some(status) = &guarded.status {
            view.drift.insert(server.clone(), status.clone());
        }
        let mut hasher = sha2::Sha256::new();
        hasher.update(guarded.served_digest.as_bytes());
        for held in &guarded.held {
            hasher.update(format!("h:{held}\n").as_bytes());
        }
        let prefix = fleet.prefixes.get(server).cloned().unwrap_or_default();
        let spec = child.spec();
        let invalid = |family, original: &str, reason| Skipped {
            reason: Some(reason),
            ..skipped(server, family, original, naming::ITEM_NAME_INVALID)
        };
        let mut part = Part {
            server,
            eager: spec.expose == ExposeMode::Eager,
            held: &guarded.held,
            meta: [
                spec.category.clone().unwrap_or_default(),
                spec.hint.clone().unwrap_or_default(),
            ],
            tools: Vec::new(),
            prompts: Vec::new(),
            resources: Vec::new(),
            templates: Vec::new(),
            skills: Vec::new(),
            hasher,
            docs: Vec::new(),
        };
        let mut tools: Vec<&Tool> = cat.tools.iter().collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        for t in tools {
            if let Err(reason) = naming::check_item_name(&t.name) {
                view.skipped.push(invalid("tool", &t.name, reason));
                continue;
            }
            let name = naming::exposed_name(&prefix, &t.name);
            if META_TOOLS.contains(&name.as_str()) {
                view.skipped
                    .push(skipped(server, "tool", &t.name, "name-reserved"));
                continue;
            }
            if !spec.tool_enabled(&t.name) {
                view.disabled.entry(server.clone()).or_default().push(name);
                continue;
            }
            part.tools.push((name, t));
        }
        for p in &cat.prompts {
            if let Err(reason) = naming::check_item_name(&p.name) {
                view.skipped.push(invalid("prompt", &p.name, reason));
                continue;
            }
            part.prompts
                .push((naming::exposed_name(&prefix, &p.name), p));
        }
        for r in &cat.resources {
            match naming::check_display_text(&r.uri, true)
                .and_then(|()| naming::check_display_text(&r.name, false))
            {
                Ok(()) => part.resources.push(r),
                Err(reason) => view.skipped.push(invalid("resource", &r.uri, reason)),
            }
        }
        for t in &cat.resource_templates {
            match naming::check_display_text(&t.uri_template, true)
                .and_then(|()| naming::check_display_text(&t.name, false))
            {
                Ok(()) => part.templates.push(t),
                Err(reason) => {
                    view.skipped
                        .push(invalid("resource_template", &t.uri_template, reason))
                }
            }
        }
        let mut skills: Vec<&catalog::Skill> = cat.skills.iter().collect();
        skills.sort_by(|a, b| a.uri.cmp(&b.uri));
        part.skills = skills;
        parts.push(part);
    }

    // 2. Who claims what. A transparent child's name in a prefix's namespace is claimed by that
    // prefix's child too, listed or not.
    let mut tool_claims = BTreeMap::new();
    let mut prompt_claims = BTreeMap::new();
    let mut resource_claims = BTreeMap::new();
    let mut template_claims = BTreeMap::new();
    for part in &parts {
        for (name, _) in &part.tools {
            claim(&mut tool_claims, name, part.server);
            for owner in view.namespace_owners(name) {
                claim(&mut tool_claims, name, owner);
            }
        }
        for (name, _) in &part.prompts {
            claim(&mut prompt_claims, name, part.server);
            for owner in view.namespace_owners(name) {
                claim(&mut prompt_claims, name, owner);
            }
        }
        for r in &part.resources {
            claim(&mut resource_claims, &r.uri, part.server);
        }
        for t in &part.templates {
            claim(&mut template_claims, &t.uri_template, part.server);
        }
    }
    let contested =
        |claims: &BTreeMap<&str, BTreeSet<&str>>| -> BTreeMap<String, BTreeSet<String>> {
            claims
                .iter()
                .filter(|(_, servers)| servers.len() > 1)
                .map(|(k, s)| (k.to_string(), s.iter().map(|s| s.to_string()).collect()))
                .collect()
        };
    view.conflicts = Conflicts {
        tools: contested(&tool_claims),
        prompts: contested(&prompt_claims),
        resources: contested(&resource_claims),
        templates: contested(&template_claims),
    };

    // 3. What each child serves: the keys it alone claims.
    for part in &mut parts {
        let server = part.server.to_string();
        for (name, t) in std::mem::take(&mut part.tools) {
            if let Some(s) = conflicted(
                &server,
                "tool",
                &t.name,
                NAME_CONFLICT,
                view.conflicts.tools.get(&name),
            ) {
                view.skipped.push(s);
                continue;
            }
            if view.tools.contains_key(&name) {
                // The same child listing a name twice: its first listing is served.
                view.skipped
                    .push(skipped(&server, "tool", &t.name, "name-duplicate"));
                continue;
            }
            let mut tool = t.clone();
            tool.name = name.clone().into();
            part.hasher.update(format!("t:{name}\n").as_bytes());
            if with_docs {
                let meta = [part.meta[0].as_str(), part.meta[1].as_str()];
                part.docs
                    .push(discovery::tool_doc(&server, &meta, &name, t));
            }
            view.tools.insert(
                name.clone(),
                ToolEntry {
                    name,
                    server: server.clone(),
                    original: t.name.to_string(),
                    tool,
                    eager: part.eager,
                    held: part.held.contains(t.name.as_ref()),
                },
            );
        }
        for (name, p) in std::mem::take(&mut part.prompts) {
            if let Some(s) = conflicted(
                &server,
                "prompt",
                &p.name,
                NAME_CONFLICT,
                view.conflicts.prompts.get(&name),
            ) {
                view.skipped.push(s);
                continue;
            }
            if view.prompts.contains_key(&name) {
                view.skipped
                    .push(skipped(&server, "prompt", &p.name, "name-duplicate"));
                continue;
            }
            let mut prompt = p.clone();
            prompt.name = name.clone();
            part.hasher.update(format!("p:{name}\n").as_bytes());
            view.prompts.insert(
                name,
                PromptEntry {
                    server: server.clone(),
                    original: p.name.clone(),
                    prompt,
                },
            );
        }
        for r in std::mem::take(&mut part.resources) {
            if let Some(s) = conflicted(
                &server,
                "resource",
                &r.uri,
                RESOURCE_CONFLICT,
                view.conflicts.resources.get(&r.uri),
            ) {
                view.skipped.push(s);
                continue;
            }
            if view.resources.contains_key(&r.uri) {
                view.skipped
                    .push(skipped(&server, "resource", &r.uri, "name-duplicate"));
                continue;
            }
            part.hasher.update(format!("r:{}\n", r.uri).as_bytes());
            view.resources
                .insert(r.uri.clone(), (server.clone(), r.clone()));
        }
        for t in std::mem::take(&mut part.templates) {
            if let Some(s) = conflicted(
                &server,
                "resource_template",
                &t.uri_template,
                RESOURCE_CONFLICT,
                view.conflicts.templates.get(&t.uri_template),
            ) {
                view.skipped.push(s);
                continue;
            }
            if view
                .templates
                .iter()
                .any(|(_, have)| have.uri_template == t.uri_template)
            {
                view.skipped.push(skipped(
                    &server,
                    "resource_template",
                    &t.uri_template,
                    "name-duplicate",
                ));
                continue;
            }
            part.hasher
                .update(format!("m:{}\n", t.uri_template).as_bytes());
            view.templates.push((server.clone(), t.clone()));
        }
    }

    // 4. Skills, once every tool and resource has its owner: a skill is served through its
    // resource, so one whose resource this child does not own, or that equals an exposed tool
    // name (a search key), is left out.
    let mut docs = Vec::new();
    for mut part in parts {
        let server = part.server.to_string();
        for sk in std::mem::take(&mut part.skills) {
            let owned = view
                .resources
                .get(&sk.uri)
                .is_some_and(|(owner, _)| *owner == server);
            if !owned || view.skills.contains_key(&sk.uri) || view.tools.contains_key(&sk.uri) {
                let code = if view.conflicts.resources.contains_key(&sk.uri) {
                    RESOURCE_CONFLICT
                } else {
                    "name-collision"
                };
                view.skipped.push(skipped(&server, "skill", &sk.uri, code));
                continue;
            }
            part.hasher.update(format!("s:{}\n", sk.uri).as_bytes());
            if with_docs {
                let meta = [part.meta[0].as_str(), part.meta[1].as_str()];
                part.docs.push(discovery::skill_doc(&server, &meta, sk));
            }
            view.skills.insert(
                sk.uri.clone(),
                SkillEntry {
                    server: server.clone(),
                    skill: sk.clone(),
                },
            );
        }
        view.sources
            .insert(server.clone(), hex::encode(part.hasher.finalize()));
        if with_docs {
            docs.push((server, part.docs));
        }
    }
    (view, docs)
}

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

/// The exposed catalog view in force and what serializes and wakes its rebuilds. Owns its
/// state: the view is replaced whole, never edited.
#[derive(Default)]
pub(super) struct ViewState {
    current: std::sync::RwLock<Arc<CatalogView>>,
    /// One rebuild at a time.
    rebuild: tokio::sync::Mutex<()>,
    /// Wakes the view builder: a burst of catalog changes (a fleet starting, a refresh being
    /// adopted) is folded into one rebuild instead of one per child.
    wanted: Arc<tokio::sync::Notify>,
}

impl ViewState {
    fn current(&self) -> Arc<CatalogView> {
        self.current.read().map(|v| v.clone()).unwrap_or_default()
    }

    fn replace(&self, view: Arc<CatalogView>) {
        let mut v = self.current.write().unwrap_or_else(|p| p.into_inner());
        *v = view;
    }
}

impl Multiplexer {
    /// The task that rebuilds the view when children's catalogs change, coalescing bursts.
    pub(super) fn spawn_view_builder(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let wanted = self.view.wanted.clone();
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
    pub(super) fn request_rebuild(&self) {
        self.view.wanted.notify_one();
    }

    /// The served view.
    pub fn view(&self) -> Arc<CatalogView> {
        self.view.current()
    }

    /// Rebuilds the exposed view from every child's served catalog and notifies the sessions
    /// whose visible tools changed.
    pub async fn rebuild_view(&self) {
        let fleet = self.fleet();
        let _serialized = self.view.rebuild.lock().await;
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
        self.view.replace(view);
        for s in self.sessions.live() {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn view() -> CatalogView {
        let mut v = CatalogView {
            namespaces: [("gh".to_string(), "github".to_string())].into(),
            ..CatalogView::default()
        };
        v.resources.insert(
            "notes://a".into(),
            ("notes".into(), Resource::new("notes://a", "a")),
        );
        v.templates
            .push(("files".into(), ResourceTemplate::new("file:///{path}", "f")));
        v.templates.push((
            "docs".into(),
            ResourceTemplate::new("file:///docs/{path}", "d"),
        ));
        v.templates.push((
            "other".into(),
            ResourceTemplate::new("file:///docs/{name}.md", "o"),
        ));
        v.conflicts.resources.insert(
            "gh://issues".into(),
            ["aaa-notes".to_string(), "github".to_string()].into(),
        );
        v.conflicts.tools.insert(
            "gh__create_issue".into(),
            ["github".to_string(), "t".to_string()].into(),
        );
        v.conflicts.templates.insert(
            "mem://{key}".into(),
            ["a".to_string(), "b".to_string()].into(),
        );
        v
    }

    pub(super) fn code<T: std::fmt::Debug>(r: Result<T, MuxError>) -> &'static str {
        r.err().map(|e| e.code()).unwrap_or("ok")
    }

    #[test]
    pub(super) fn conflicted_keys_are_refused_never_forwarded() {
        let v = view();
        assert_eq!(code(v.tool_route("gh__create_issue")), NAME_CONFLICT);
        assert_eq!(code(v.resource_route("gh://issues")), RESOURCE_CONFLICT);
        assert_eq!(code(v.resource_route("mem://x")), RESOURCE_CONFLICT);
        assert_eq!(code(v.template_route("mem://{key}")), RESOURCE_CONFLICT);
        // A name in a prefix's namespace the prefix's child does not list is unknown (not the
        // transparent child's).
        assert_eq!(code(v.tool_route("gh__delete_repo")), "tool-not-found");
        assert_eq!(code(v.prompt_route("gh__p")), "prompt-not-found");
        // Names breaking the rule are refused before any forwarding.
        assert_eq!(
            code(v.tool_route("read_\u{202e}gpj.exe")),
            naming::ITEM_NAME_INVALID
        );
        // Unlisted, valid, outside every namespace: the transparent child may take it.
        assert!(matches!(v.tool_route("gen_0042"), Ok(None)));
        assert!(matches!(v.resource_route("test://unlisted"), Ok(None)));
    }

    #[test]
    pub(super) fn resource_owners_follow_the_declared_precedence() {
        let v = view();
        assert_eq!(v.resource_route("notes://a").unwrap(), Some("notes"));
        assert_eq!(v.resource_route("file:///etc/x").unwrap(), Some("files"));
        // Longest literal prefix wins; equal literal prefixes of two children are a conflict.
        assert_eq!(
            code(v.resource_route("file:///docs/readme")),
            RESOURCE_CONFLICT
        );
        assert_eq!(
            v.template_route("file:///{path}").unwrap(),
            Some("files"),
            "a template named by its exact URI template"
        );
    }
}
