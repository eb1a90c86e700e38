//! Immutable catalog snapshots and their canonical digest.
//!
//! A snapshot holds the four families (tools, prompts, resources, resource templates) of every
//! child under the names graph-os exposes, and nothing else: the digest is SHA-256 of the
//! canonical JSON (sorted keys, no whitespace, ASCII) of `{release_id, config_revision,
//! children}` with children sorted by name and items by key. Connection generations are not
//! part of it, so a reconnect that advertises the same content changes nothing.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{canonical_json, sha256_hex};

/// The four families of one child, each keyed (tools/prompts by exposed name, resources by URI,
/// templates by URI template).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ChildSnapshot {
    /// Tools by exposed name.
    pub tools: BTreeMap<String, serde_json::Value>,
    /// Prompts by exposed name.
    pub prompts: BTreeMap<String, serde_json::Value>,
    /// Resources by URI.
    pub resources: BTreeMap<String, serde_json::Value>,
    /// Resource templates by URI template.
    pub resource_templates: BTreeMap<String, serde_json::Value>,
    /// Set when the child could not contribute: its stable code (and then no items). Part of
    /// the digest, so a child's recovery is a new generation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

/// One family of items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// tools/list.
    Tools,
    /// prompts/list.
    Prompts,
    /// resources/list.
    Resources,
    /// resources/templates/list.
    ResourceTemplates,
}

/// A complete candidate or published snapshot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Snapshot {
    /// graph-os release that built it.
    pub release_id: String,
    /// Config revision it was built from.
    pub config_revision: String,
    /// Children by name.
    pub children: BTreeMap<String, ChildSnapshot>,
    /// Content digest.
    #[serde(skip)]
    pub digest: String,
}

/// Why a candidate is not a valid snapshot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("snapshot incomplete: {0}")]
pub struct Incomplete(pub String);

/// Accumulates items into a snapshot, rejecting empty and duplicate keys.
#[derive(Debug, Default)]
pub struct SnapshotBuilder {
    children: BTreeMap<String, ChildSnapshot>,
    error: Option<String>,
}

impl SnapshotBuilder {
    /// Declares a child (so a child with no items still appears).
    pub fn child(&mut self, server: &str) -> &mut Self {
        self.children.entry(server.to_string()).or_default();
        self
    }

    /// Records that a child could not contribute (its stable code); it has no items.
    pub fn unavailable(&mut self, server: &str, code: &str) -> &mut Self {
        let child = self.children.entry(server.to_string()).or_default();
        *child = ChildSnapshot {
            unavailable: Some(code.to_string()),
            ..ChildSnapshot::default()
        };
        self
    }

    /// Adds one item (ignored for a child marked unavailable).
    pub fn item(
        &mut self,
        server: &str,
        family: Family,
        key: &str,
        value: serde_json::Value,
    ) -> &mut Self {
        let child = self.children.entry(server.to_string()).or_default();
        if child.unavailable.is_some() {
            return self;
        }
        let map = match family {
            Family::Tools => &mut child.tools,
            Family::Prompts => &mut child.prompts,
            Family::Resources => &mut child.resources,
            Family::ResourceTemplates => &mut child.resource_templates,
        };
        if key.is_empty() {
            self.error
                .get_or_insert_with(|| format!("{server}: an item has an empty key"));
        } else if map.insert(key.to_string(), value).is_some() {
            self.error
                .get_or_insert_with(|| format!("{server}: duplicate key {key}"));
        }
        self
    }

    /// Finishes the snapshot and computes its digest.
    pub fn build(self, release_id: &str, config_revision: &str) -> Result<Snapshot, Incomplete> {
        if let Some(e) = self.error {
            return Err(Incomplete(e));
        }
        let mut snapshot = Snapshot {
            release_id: release_id.into(),
            config_revision: config_revision.into(),
            children: self.children,
            digest: String::new(),
        };
        let doc = serde_json::to_value(&snapshot).map_err(|e| Incomplete(e.to_string()))?;
        snapshot.digest = sha256_hex(canonical_json(&doc).as_bytes());
        Ok(snapshot)
    }
}

impl Snapshot {
    /// The tool descriptor of an exposed name, with its server.
    pub fn tool(&self, name: &str) -> Option<(&str, &serde_json::Value)> {
        self.children
            .iter()
            .find_map(|(server, c)| c.tools.get(name).map(|t| (server.as_str(), t)))
    }

    /// The children marked unavailable, with their codes.
    pub fn unavailable(&self) -> BTreeMap<&str, &str> {
        self.children
            .iter()
            .filter_map(|(n, c)| c.unavailable.as_deref().map(|code| (n.as_str(), code)))
            .collect()
    }

    /// Number of tools.
    pub fn tool_count(&self) -> usize {
        self.children.values().map(|c| c.tools.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn digest_is_order_independent_and_content_only() {
        let mut a = SnapshotBuilder::default();
        a.item("s", Family::Tools, "s__x", json!({"name": "s__x"}))
            .item("s", Family::Tools, "s__y", json!({"name": "s__y"}));
        let mut b = SnapshotBuilder::default();
        b.item("s", Family::Tools, "s__y", json!({"name": "s__y"}))
            .item("s", Family::Tools, "s__x", json!({"name": "s__x"}));
        let (a, b) = (a.build("r", "c").unwrap(), b.build("r", "c").unwrap());
        assert_eq!(a.digest, b.digest);
        assert_eq!(a.digest.len(), 64);
        let mut c = SnapshotBuilder::default();
        c.item(
            "s",
            Family::Tools,
            "s__x",
            json!({"name": "s__x", "description": "changed"}),
        );
        c.item("s", Family::Tools, "s__y", json!({"name": "s__y"}));
        assert_ne!(c.build("r", "c").unwrap().digest, a.digest);
        let mut d = SnapshotBuilder::default();
        d.item("s", Family::Tools, "s__x", json!({"name": "s__x"}))
            .item("s", Family::Tools, "s__y", json!({"name": "s__y"}));
        assert_ne!(
            d.build("r", "c2").unwrap().digest,
            a.digest,
            "config revision is part of the identity"
        );
    }

    #[test]
    fn an_unavailable_child_is_an_explicit_entry_in_the_digest() {
        let build = |down: bool| {
            let mut b = SnapshotBuilder::default();
            b.item("ok", Family::Tools, "ok__x", json!({"name": "ok__x"}));
            if down {
                b.unavailable("bad", "child-spawn-failed");
            } else {
                b.item("bad", Family::Tools, "bad__y", json!({"name": "bad__y"}));
            }
            b.build("r", "c").unwrap()
        };
        let (down, up) = (build(true), build(false));
        assert_ne!(down.digest, up.digest, "recovery is a new digest");
        assert_eq!(down.unavailable().get("bad"), Some(&"child-spawn-failed"));
        assert!(down.children["bad"].tools.is_empty());
        // Items added for an unavailable child are ignored.
        let mut b = SnapshotBuilder::default();
        b.unavailable("bad", "x")
            .item("bad", Family::Tools, "bad__y", json!({}));
        assert!(b.build("r", "c").unwrap().children["bad"].tools.is_empty());
    }

    #[test]
    fn duplicate_and_empty_keys_are_incomplete() {
        let mut a = SnapshotBuilder::default();
        a.item("s", Family::Resources, "u", json!(1))
            .item("s", Family::Resources, "u", json!(2));
        assert!(a.build("r", "c").is_err());
        let mut b = SnapshotBuilder::default();
        b.item("s", Family::Prompts, "", json!(1));
        assert!(b.build("r", "c").is_err());
    }
}
