//! The drift guard: a child's catalog is served only in a form someone approved.
//!
//! A child that changes a tool's description or schema after it was approved (a "rug pull") is
//! not served as it is now. Per child, `driftPolicy` decides what happens while the live catalog
//! differs from the approved one:
//! - `off` (default): the live catalog is served; nothing is recorded.
//! - `hold`: the last approved catalog stays served; a call reaches the child only when that
//!   tool's schema is unchanged (a tool whose schema changed or that disappeared answers
//!   `drift-pending`). With no approved content known (only a pinned digest), nothing is served.
//! - `block`: none of the child's items are served until approval.
//!
//! The approved digest is the child's catalog fingerprint ([`super::ChildCatalog::fingerprint`]).
//! It comes from the entry's `approvedDigest` (the fleet file or the McpFleet spec: every
//! replica agrees) or else from the [`ApprovalLedger`] in the state directory, which also keeps
//! the approved content so `hold` can serve it after a restart. A child seen for the first time
//! with neither is approved as it is (trust on first use), like an SSH host key.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::ChildCatalog;

/// What graph-os serves while a child's catalog differs from the approved one
/// (see this module).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum DriftPolicy {
    /// Serve the live catalog (default).
    #[default]
    Off,
    /// Keep serving the last approved catalog; calls reach only tools whose schema is unchanged.
    Hold,
    /// Serve none of the child's items until the change is approved.
    Block,
}

/// What changed between the approved and the live catalog, per tool (original names).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ToolDiff {
    /// Tools the live catalog has and the approved one does not.
    pub added: Vec<String>,
    /// Approved tools the live catalog no longer has.
    pub removed: Vec<String>,
    /// Tools whose title or description changed.
    pub description_changed: Vec<String>,
    /// Tools whose input or output schema (or annotations) changed.
    pub schema_changed: Vec<String>,
    /// Other families that changed (`prompts`, `resources`, `resource_templates`, `skills`).
    pub other_families_changed: Vec<&'static str>,
}

/// Compares two catalogs tool by tool.
pub fn diff(approved: &ChildCatalog, live: &ChildCatalog) -> ToolDiff {
    let by_name = |c: &ChildCatalog| -> BTreeMap<String, rmcp::model::Tool> {
        c.tools
            .iter()
            .map(|t| (t.name.to_string(), t.clone()))
            .collect()
    };
    let (old, new) = (by_name(approved), by_name(live));
    let mut d = ToolDiff::default();
    for (name, t) in &new {
        match old.get(name) {
            None => d.added.push(name.clone()),
            Some(o) => {
                if o.description != t.description || o.title != t.title {
                    d.description_changed.push(name.clone());
                }
                if schema_of(o) != schema_of(t) {
                    d.schema_changed.push(name.clone());
                }
            }
        }
    }
    d.removed = old
        .keys()
        .filter(|n| !new.contains_key(*n))
        .cloned()
        .collect();
    let family = |f: fn(&ChildCatalog) -> serde_json::Value| f(approved) != f(live);
    if family(|c| sorted(&c.prompts, |p| p.name.clone())) {
        d.other_families_changed.push("prompts");
    }
    if family(|c| sorted(&c.resources, |r| r.uri.clone())) {
        d.other_families_changed.push("resources");
    }
    if family(|c| sorted(&c.resource_templates, |r| r.uri_template.clone())) {
        d.other_families_changed.push("resource_templates");
    }
    if family(|c| sorted(&c.skills, |s| s.uri.clone())) {
        d.other_families_changed.push("skills");
    }
    d
}

/// What a call's safety depends on: the schemas and the behaviour hints.
fn schema_of(t: &rmcp::model::Tool) -> serde_json::Value {
    serde_json::json!([t.input_schema, t.output_schema, t.annotations])
}

fn sorted<T: Serialize>(items: &[T], key: impl Fn(&T) -> String) -> serde_json::Value {
    let mut v: Vec<(String, serde_json::Value)> = items
        .iter()
        .map(|i| (key(i), serde_json::to_value(i).unwrap_or_default()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    serde_json::to_value(v).unwrap_or_default()
}

/// The live catalog as the guard judges it when some optional family could not be listed this
/// time: that family is taken from the approved content (not listed is not removed), so a
/// transient listing error of prompts or resources neither shows as drift nor blocks the tools.
/// `None`: judge the live catalog as it is (every family listed, or no approved content).
pub fn with_approved_families(
    live: &ChildCatalog,
    approved: Option<&ChildCatalog>,
) -> Option<ChildCatalog> {
    let approved = approved.filter(|_| !live.unavailable.is_empty())?;
    let mut judged = live.clone();
    for family in live.unavailable.keys() {
        match family.as_str() {
            "prompts" => judged.prompts = approved.prompts.clone(),
            "resources" => {
                judged.resources = approved.resources.clone();
                judged.skills = approved.skills.clone();
            }
            "resourceTemplates" => {
                judged.resource_templates = approved.resource_templates.clone();
            }
            _ => {}
        }
    }
    judged.unavailable = approved.unavailable.clone();
    Some(judged)
}

/// An approved catalog: its digest and (when known) its content.
#[derive(Debug, Clone)]
pub struct Approved {
    /// The approved fingerprint.
    pub digest: String,
    /// The approved content, when this replica has seen it.
    pub catalog: Option<Arc<ChildCatalog>>,
}

/// What to serve for one child.
#[derive(Debug, Clone)]
pub enum Serve {
    /// The live catalog.
    Live,
    /// The approved catalog instead of the live one (`hold`).
    Approved(Arc<ChildCatalog>),
    /// Nothing (`block`, or `hold` without approved content).
    Nothing,
}

/// The guard's decision for one child.
#[derive(Debug, Clone)]
pub struct Decision {
    /// What to serve.
    pub serve: Serve,
    /// Record the live catalog as approved (first sight, or content of a pinned digest).
    pub record_live: bool,
    /// Served tools (original names) a call must not reach: their schema changed or they
    /// are gone from the live catalog.
    pub held: BTreeSet<String>,
    /// Status, `None` with the policy `off`.
    pub status: Option<DriftStatus>,
}

/// Drift state of one child, for status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DriftStatus {
    /// `approved` or `drift-pending`.
    pub state: &'static str,
    /// `hold` or `block`.
    pub policy: DriftPolicy,
    /// The approved digest (`None` before the child was first seen).
    pub approved_digest: Option<String>,
    /// Where the approval comes from: `pinned` (the entry's `approvedDigest`) or `recorded`.
    pub approved_by: &'static str,
    /// The live digest awaiting approval (drift-pending only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_digest: Option<String>,
    /// Per-tool changes (drift-pending with the approved content known).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<ToolDiff>,
}

/// Decides what to serve for one child: `policy` and `pinned` from its entry, `recorded` from the
/// ledger, `live` and `live_digest` from the child.
pub fn decide(
    policy: DriftPolicy,
    pinned: Option<&str>,
    recorded: Option<&Approved>,
    live: &ChildCatalog,
    live_digest: &str,
) -> Decision {
    let live_decision = |record_live, approved: Option<String>, by| Decision {
        serve: Serve::Live,
        record_live,
        held: BTreeSet::new(),
        status: (policy != DriftPolicy::Off).then_some(DriftStatus {
            state: "approved",
            policy,
            approved_digest: approved,
            approved_by: by,
            pending_digest: None,
            diff: None,
        }),
    };
    if policy == DriftPolicy::Off {
        return live_decision(false, None, "recorded");
    }
    // The pin is the authority; a recorded approval counts only without one, and its content
    // only when it is the content of the approved digest.
    let (approved, by) = match (pinned, recorded) {
        (Some(pin), _) => (Some(pin.to_string()), "pinned"),
        (None, Some(r)) => (Some(r.digest.clone()), "recorded"),
        (None, None) => (None, "recorded"),
    };
    let content = recorded
        .filter(|r| approved.as_deref() == Some(r.digest.as_str()))
        .and_then(|r| r.catalog.clone());
    let Some(approved) = approved else {
        return live_decision(true, Some(live_digest.to_string()), "recorded");
    };
    if approved == live_digest {
        return live_decision(content.is_none(), Some(approved), by);
    }
    let diff = content.as_ref().map(|c| diff(c, live));
    let mut held = BTreeSet::new();
    let serve = match (&content, policy) {
        (Some(c), DriftPolicy::Hold) => {
            let live_tools: HashMap<&str, &rmcp::model::Tool> =
                live.tools.iter().map(|t| (t.name.as_ref(), t)).collect();
            for t in &c.tools {
                let same = live_tools
                    .get(t.name.as_ref())
                    .is_some_and(|l| schema_of(l) == schema_of(t));
                if !same {
                    held.insert(t.name.to_string());
                }
            }
            Serve::Approved(c.clone())
        }
        _ => Serve::Nothing,
    };
    Decision {
        serve,
        record_live: false,
        held,
        status: Some(DriftStatus {
            state: "drift-pending",
            policy,
            approved_digest: Some(approved),
            approved_by: by,
            pending_digest: Some(live_digest.to_string()),
            diff,
        }),
    }
}

/// The approvals recorded in the state directory: one file per child
/// (`drift/<sha256(name)[..32]>.json`, written atomically), holding the approved digest and
/// content. A file whose content does not hash to its digest is ignored (and logged). Reads are
/// cached and revalidated by the file's modification time, so an approval another replica
/// sharing the state directory records is seen at this replica's next view rebuild.
pub struct ApprovalLedger {
    dir: Option<PathBuf>,
    cache: Mutex<HashMap<String, Cached>>,
    /// The pending digest last reported per child (a drift is logged once, not per rebuild).
    reported: Mutex<HashMap<String, String>>,
}

/// A ledger read: the file's modification time then, and what it held.
type Cached = (Option<std::time::SystemTime>, Option<Approved>);

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LedgerFile {
    server: String,
    digest: String,
    approved_at_ms: u64,
    catalog: ChildCatalog,
}

impl ApprovalLedger {
    /// A ledger under `state_dir/drift` (`None`: in memory only).
    pub fn new(state_dir: Option<PathBuf>) -> Self {
        ApprovalLedger {
            dir: state_dir.map(|d| d.join("drift")),
            cache: Mutex::new(HashMap::new()),
            reported: Mutex::new(HashMap::new()),
        }
    }

    fn path(&self, server: &str) -> Option<PathBuf> {
        let key = &crate::digest::sha256_hex(server.as_bytes())[..32];
        self.dir.as_ref().map(|d| d.join(format!("{key}.json")))
    }

    /// Whether `pending` is a new drift of `server` to report (false when it was reported).
    pub fn first_report(&self, server: &str, pending: &str) -> bool {
        let mut reported = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        reported
            .insert(server.to_string(), pending.to_string())
            .as_deref()
            != Some(pending)
    }

    /// The recorded approval of `server` (read again only when its file changed).
    pub fn get(&self, server: &str) -> Option<Approved> {
        let mtime = self
            .path(server)
            .and_then(|p| std::fs::metadata(p).ok())
            .and_then(|m| m.modified().ok());
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        match cache.get(server) {
            // In memory only (no state directory): the cache is the ledger.
            Some((_, approved)) if self.dir.is_none() => approved.clone(),
            Some((seen, approved)) if *seen == mtime => approved.clone(),
            _ => {
                let approved = self.read(server);
                cache.insert(server.to_string(), (mtime, approved.clone()));
                approved
            }
        }
    }

    fn read(&self, server: &str) -> Option<Approved> {
        let path = self.path(server)?;
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(server, path = %path.display(), error = %e, "drift: cannot read the recorded approval");
                return None;
            }
        };
        match serde_json::from_slice::<LedgerFile>(&bytes) {
            Ok(f) if f.server == server && f.catalog.fingerprint() == f.digest => Some(Approved {
                digest: f.digest,
                catalog: Some(Arc::new(f.catalog)),
            }),
            Ok(_) => {
                tracing::warn!(server, path = %path.display(), "drift: the recorded approval does not match its digest; ignored");
                None
            }
            Err(e) => {
                tracing::warn!(server, path = %path.display(), error = %e, "drift: the recorded approval is not readable; ignored");
                None
            }
        }
    }

    /// Records `catalog` (whose fingerprint is `digest`) as the approved catalog of `server`.
    pub fn record(
        &self,
        server: &str,
        digest: &str,
        catalog: Arc<ChildCatalog>,
    ) -> std::io::Result<()> {
        if let Some(path) = self.path(server) {
            let file = LedgerFile {
                server: server.to_string(),
                digest: digest.to_string(),
                approved_at_ms: super::store::now_ms(),
                catalog: (*catalog).clone(),
            };
            let bytes = serde_json::to_vec_pretty(&file).map_err(std::io::Error::other)?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(&tmp, &path)?;
        }
        let mtime = self
            .path(server)
            .and_then(|p| std::fs::metadata(p).ok())
            .and_then(|m| m.modified().ok());
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(
            server.to_string(),
            (
                mtime,
                Some(Approved {
                    digest: digest.to_string(),
                    catalog: Some(catalog),
                }),
            ),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::Tool;
    use serde_json::json;

    fn tool(name: &str, desc: &str, prop: &str) -> Tool {
        let schema = json!({"type": "object", "properties": {prop: {"type": "string"}}});
        Tool::new(
            name.to_string(),
            desc.to_string(),
            Arc::new(schema.as_object().cloned().unwrap()),
        )
    }

    fn cat(tools: Vec<Tool>) -> ChildCatalog {
        ChildCatalog {
            tools,
            ..Default::default()
        }
    }

    fn approved(c: &ChildCatalog) -> Approved {
        Approved {
            digest: c.fingerprint(),
            catalog: Some(Arc::new(c.clone())),
        }
    }

    #[test]
    fn the_diff_names_each_kind_of_change_per_tool() {
        let old = cat(vec![
            tool("a", "A", "x"),
            tool("b", "B", "x"),
            tool("c", "C", "x"),
        ]);
        let new = cat(vec![
            tool("a", "A changed", "x"),
            tool("b", "B", "y"),
            tool("d", "D", "x"),
        ]);
        let d = diff(&old, &new);
        assert_eq!(d.added, ["d"]);
        assert_eq!(d.removed, ["c"]);
        assert_eq!(d.description_changed, ["a"]);
        assert_eq!(d.schema_changed, ["b"]);
        assert!(d.other_families_changed.is_empty());
    }

    #[test]
    fn off_serves_the_live_catalog_and_records_nothing() {
        let live = cat(vec![tool("a", "A", "x")]);
        let d = decide(DriftPolicy::Off, None, None, &live, &live.fingerprint());
        assert!(matches!(d.serve, Serve::Live));
        assert!(!d.record_live && d.status.is_none());
    }

    #[test]
    fn a_child_seen_first_is_approved_as_it_is() {
        let live = cat(vec![tool("a", "A", "x")]);
        let d = decide(DriftPolicy::Hold, None, None, &live, &live.fingerprint());
        assert!(matches!(d.serve, Serve::Live));
        assert!(d.record_live);
        assert_eq!(d.status.unwrap().state, "approved");
    }

    #[test]
    fn hold_serves_the_approved_catalog_and_holds_tools_whose_schema_changed() {
        let old = cat(vec![tool("a", "A", "x"), tool("b", "B", "x")]);
        let live = cat(vec![tool("a", "A is now evil", "x"), tool("b", "B", "y")]);
        let d = decide(
            DriftPolicy::Hold,
            None,
            Some(&approved(&old)),
            &live,
            &live.fingerprint(),
        );
        let Serve::Approved(served) = &d.serve else {
            panic!("hold serves the approved catalog")
        };
        assert_eq!(served.tools[0].description.as_deref(), Some("A"));
        // `a` only changed its description: calls still reach it; `b` changed its schema.
        assert_eq!(d.held, BTreeSet::from(["b".to_string()]));
        let status = d.status.unwrap();
        assert_eq!(status.state, "drift-pending");
        assert_eq!(status.pending_digest.unwrap(), live.fingerprint());
        let diff = status.diff.unwrap();
        assert_eq!(diff.description_changed, ["a"]);
        assert_eq!(diff.schema_changed, ["b"]);
    }

    #[test]
    fn block_serves_nothing_until_approval() {
        let old = cat(vec![tool("a", "A", "x")]);
        let live = cat(vec![tool("a", "A changed", "x")]);
        let d = decide(
            DriftPolicy::Block,
            None,
            Some(&approved(&old)),
            &live,
            &live.fingerprint(),
        );
        assert!(matches!(d.serve, Serve::Nothing));
        assert_eq!(d.status.unwrap().state, "drift-pending");
    }

    #[test]
    fn a_pin_wins_over_the_record_and_without_its_content_hold_serves_nothing() {
        let old = cat(vec![tool("a", "A", "x")]);
        let live = cat(vec![tool("a", "A changed", "x")]);
        let pin = "0".repeat(64);
        let d = decide(
            DriftPolicy::Hold,
            Some(&pin),
            Some(&approved(&live)),
            &live,
            &live.fingerprint(),
        );
        assert!(matches!(d.serve, Serve::Nothing));
        let status = d.status.unwrap();
        assert_eq!(status.approved_by, "pinned");
        assert!(status.diff.is_none());
        // A pin equal to the live digest serves it and records its content.
        let d = decide(
            DriftPolicy::Hold,
            Some(&live.fingerprint()),
            Some(&approved(&old)),
            &live,
            &live.fingerprint(),
        );
        assert!(matches!(d.serve, Serve::Live) && d.record_live);
    }

    #[test]
    fn a_drift_is_reported_once_per_pending_digest() {
        let ledger = ApprovalLedger::new(None);
        assert!(ledger.first_report("s", "d1"));
        assert!(!ledger.first_report("s", "d1"));
        assert!(ledger.first_report("s", "d2"));
        assert!(ledger.first_report("t", "d2"));
    }

    #[test]
    fn the_ledger_reads_back_what_it_wrote_and_ignores_a_tampered_file() {
        let dir = std::env::temp_dir().join(format!("graph-os-drift-{}", std::process::id()));
        let live = Arc::new(cat(vec![tool("a", "A", "x")]));
        let ledger = ApprovalLedger::new(Some(dir.clone()));
        ledger
            .record("s", &live.fingerprint(), live.clone())
            .unwrap();
        let again = ApprovalLedger::new(Some(dir.clone()));
        let got = again.get("s").unwrap();
        assert_eq!(got.digest, live.fingerprint());
        assert_eq!(got.catalog.unwrap().as_ref(), live.as_ref());
        // A second replica's ledger over the same directory sees a later approval.
        let changed = Arc::new(cat(vec![tool("a", "A2", "x")]));
        std::thread::sleep(std::time::Duration::from_millis(20));
        ledger
            .record("s", &changed.fingerprint(), changed.clone())
            .unwrap();
        assert_eq!(again.get("s").unwrap().digest, changed.fingerprint());
        let path = again.path("s").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("\"A2\"", "\"B\"")).unwrap();
        assert!(ApprovalLedger::new(Some(dir.clone())).get("s").is_none());
        let _ = std::fs::remove_dir_all(dir);
    }
}
