//! Immutable catalog snapshots and their canonical digest.
//!
//! A snapshot holds the four families (tools, prompts, resources, resource templates) plus the
//! skills of every child under the names graph-os exposes, and nothing else: the digest is
//! SHA-256 of the canonical JSON (sorted keys, no whitespace, ASCII) of `{release_id,
//! config_revision, children}` with children sorted by name and items by key. A child's
//! `skills` key is present only when it has skills, so the digests of fleets without skills are
//! what they were before skills were a family. Connection generations are not
//! part of it, so a reconnect that advertises the same content changes nothing.
//!
//! Memory is proportional to the catalog: every item is kept once as its canonical JSON
//! (`Arc<str>`, computed once), each child's part is an `Arc` that the next candidate reuses
//! when that child did not change, and the digest is streamed into the hasher rather than built
//! as one document.

use std::collections::BTreeMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::digest::{canonical_json, canonical_string};

/// One item: its canonical JSON, shared between snapshots.
pub type Item = Arc<str>;

/// The families of one child, each keyed (tools/prompts by exposed name, resources and skills by
/// URI, templates by URI template).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChildSnapshot {
    /// Tools by exposed name.
    pub tools: BTreeMap<String, Item>,
    /// Prompts by exposed name.
    pub prompts: BTreeMap<String, Item>,
    /// Resources by URI.
    pub resources: BTreeMap<String, Item>,
    /// Resource templates by URI template.
    pub resource_templates: BTreeMap<String, Item>,
    /// Skills by SKILL.md URI (omitted from the digest when empty).
    pub skills: BTreeMap<String, Item>,
    /// Set when the child could not contribute: its stable code (and then no items). Part of
    /// the digest, so a child's recovery is a new generation.
    pub unavailable: Option<String>,
    /// What this part was built from (catalog fingerprint, prefix, filters): lets the next
    /// candidate reuse it whole. Not part of the digest.
    pub source: Option<String>,
}

impl ChildSnapshot {
    fn family_mut(&mut self, family: Family) -> &mut BTreeMap<String, Item> {
        match family {
            Family::Tools => &mut self.tools,
            Family::Prompts => &mut self.prompts,
            Family::Resources => &mut self.resources,
            Family::ResourceTemplates => &mut self.resource_templates,
            Family::Skills => &mut self.skills,
        }
    }

    /// Streams this child's canonical JSON (keys in canonical order).
    fn hash_into(&self, h: &mut Sha256) {
        h.update(b"{");
        let families = [
            ("prompts", &self.prompts),
            ("resource_templates", &self.resource_templates),
            ("resources", &self.resources),
            ("skills", &self.skills),
            ("tools", &self.tools),
        ];
        let present = families
            .iter()
            .filter(|(name, items)| *name != "skills" || !items.is_empty());
        for (i, (name, items)) in present.enumerate() {
            if i > 0 {
                h.update(b",");
            }
            h.update(format!("\"{name}\":{{").as_bytes());
            for (j, (key, item)) in items.iter().enumerate() {
                if j > 0 {
                    h.update(b",");
                }
                h.update(canonical_string(key).as_bytes());
                h.update(b":");
                h.update(item.as_bytes());
            }
            h.update(b"}");
        }
        if let Some(code) = &self.unavailable {
            h.update(b",\"unavailable\":");
            h.update(canonical_string(code).as_bytes());
        }
        h.update(b"}");
    }
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
    /// Skills (`skill://…/SKILL.md` front matter).
    Skills,
}

/// A complete candidate or published snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// graph-os release that built it.
    pub release_id: String,
    /// Config revision it was built from.
    pub config_revision: String,
    /// Children by name.
    pub children: BTreeMap<String, Arc<ChildSnapshot>>,
    /// Content digest.
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
    reused: BTreeMap<String, Arc<ChildSnapshot>>,
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
        self.reused.remove(server);
        let child = self.children.entry(server.to_string()).or_default();
        *child = ChildSnapshot {
            unavailable: Some(code.to_string()),
            ..ChildSnapshot::default()
        };
        self
    }

    /// Takes a child's part whole from an earlier snapshot (it did not change).
    pub fn reuse(&mut self, server: &str, part: Arc<ChildSnapshot>) -> &mut Self {
        self.children.remove(server);
        self.reused.insert(server.to_string(), part);
        self
    }

    /// Sets what a child's part is built from (see [`ChildSnapshot::source`]).
    pub fn source(&mut self, server: &str, source: String) -> &mut Self {
        self.children.entry(server.to_string()).or_default().source = Some(source);
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
        self.canonical_item(server, family, key, canonical_json(&value).into())
    }

    /// Adds one item given as canonical JSON.
    pub fn canonical_item(
        &mut self,
        server: &str,
        family: Family,
        key: &str,
        item: Item,
    ) -> &mut Self {
        let child = self.children.entry(server.to_string()).or_default();
        if child.unavailable.is_some() {
            return self;
        }
        if key.is_empty() {
            self.error
                .get_or_insert_with(|| format!("{server}: an item has an empty key"));
        } else if child
            .family_mut(family)
            .insert(key.to_string(), item)
            .is_some()
        {
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
        let mut children: BTreeMap<String, Arc<ChildSnapshot>> = self
            .children
            .into_iter()
            .map(|(k, v)| (k, Arc::new(v)))
            .collect();
        children.extend(self.reused);
        let mut h = Sha256::new();
        h.update(b"{\"children\":{");
        for (i, (name, child)) in children.iter().enumerate() {
            if i > 0 {
                h.update(b",");
            }
            h.update(canonical_string(name).as_bytes());
            h.update(b":");
            child.hash_into(&mut h);
        }
        h.update(b"},\"config_revision\":");
        h.update(canonical_string(config_revision).as_bytes());
        h.update(b",\"release_id\":");
        h.update(canonical_string(release_id).as_bytes());
        h.update(b"}");
        Ok(Snapshot {
            release_id: release_id.into(),
            config_revision: config_revision.into(),
            children,
            digest: hex::encode(h.finalize()),
        })
    }
}

impl Snapshot {
    /// The tool descriptor (canonical JSON) of an exposed name, with its server; `None` when no
    /// child or more than one has it (a snapshot another replica wrote is not trusted to be
    /// conflict-free: ownership is never first-come by server order).
    pub fn tool(&self, name: &str) -> Option<(&str, &Item)> {
        let mut owners = self
            .children
            .iter()
            .filter_map(|(server, c)| c.tools.get(name).map(|t| (server.as_str(), t)));
        let first = owners.next()?;
        owners.next().is_none().then_some(first)
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
    fn the_streamed_digest_is_the_digest_of_the_canonical_document() {
        let mut b = SnapshotBuilder::default();
        b.item(
            "w",
            Family::Tools,
            "w__é",
            json!({"name": "w__é", "d": [1, null]}),
        )
        .item("w", Family::Resources, "u://x", json!({"uri": "u://x"}))
        .item(
            "w",
            Family::Skills,
            "skill://p/SKILL.md",
            json!({"uri": "skill://p/SKILL.md", "name": "p", "description": "d"}),
        )
        .unavailable("z", "child-starting")
        .child("a");
        let s = b.build("r\"1", "c").unwrap();
        let doc = json!({
            "release_id": "r\"1", "config_revision": "c",
            "children": {
                "a": {"tools": {}, "prompts": {}, "resources": {}, "resource_templates": {}},
                "w": {"tools": {"w__é": {"name": "w__é", "d": [1, null]}}, "prompts": {},
                      "resources": {"u://x": {"uri": "u://x"}}, "resource_templates": {},
                      "skills": {"skill://p/SKILL.md": {"uri": "skill://p/SKILL.md", "name": "p", "description": "d"}}},
                "z": {"tools": {}, "prompts": {}, "resources": {}, "resource_templates": {}, "unavailable": "child-starting"},
            }
        });
        assert_eq!(
            s.digest,
            crate::digest::sha256_hex(canonical_json(&doc).as_bytes())
        );
    }

    #[test]
    fn an_unchanged_child_is_reused_not_copied() {
        let mut a = SnapshotBuilder::default();
        a.item("s", Family::Tools, "s__x", json!({"name": "s__x"}));
        let a = a.build("r", "c").unwrap();
        let mut b = SnapshotBuilder::default();
        b.reuse("s", a.children["s"].clone());
        let b = b.build("r", "c").unwrap();
        assert_eq!(a.digest, b.digest);
        assert!(Arc::ptr_eq(&a.children["s"], &b.children["s"]));
    }

    #[test]
    fn a_tool_two_children_have_belongs_to_neither() {
        let mut b = SnapshotBuilder::default();
        b.item("a", Family::Tools, "x", json!({"name": "x"}))
            .item("b", Family::Tools, "x", json!({"name": "x"}))
            .item("b", Family::Tools, "y", json!({"name": "y"}));
        let s = b.build("r", "c").unwrap();
        assert!(s.tool("x").is_none());
        assert_eq!(s.tool("y").map(|(server, _)| server), Some("b"));
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
