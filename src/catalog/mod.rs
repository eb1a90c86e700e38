//! The fleet catalog: what each child advertises (four families plus skills), the names graph-os
//! exposes, and canonical digests of content.
//!
//! Generations, the reconciler and the generation store build on these types; this module is
//! the only place that decides names and digests.

pub mod drift;
pub mod naming;
pub mod reconciler;
pub mod skill;
pub mod snapshot;
pub mod store;
pub mod writer;

use rmcp::model::{Prompt, Resource, ResourceTemplate, Tool};
use serde::{Deserialize, Serialize};

use crate::digest::{canonical_json, sha256_hex};
pub use skill::Skill;

/// What one child advertises: tools, prompts, resources and resource templates, plus the skills
/// read from its `skill://…/SKILL.md` resources.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChildCatalog {
    /// `tools/list`.
    pub tools: Vec<Tool>,
    /// `prompts/list` (empty when the child has none).
    pub prompts: Vec<Prompt>,
    /// `resources/list`.
    pub resources: Vec<Resource>,
    /// `resources/templates/list`.
    pub resource_templates: Vec<ResourceTemplate>,
    /// Skills: the front matter of each `skill://…/SKILL.md` resource that could be read
    /// (best effort; see [`crate::probe`]).
    pub skills: Vec<Skill>,
    /// Optional families (`prompts`, `resources`, `resourceTemplates`) the child could not list
    /// this time, with why: best effort, never a failed probe (their items are empty here).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub unavailable: std::collections::BTreeMap<String, FamilyError>,
}

/// Why an optional family could not be listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FamilyError {
    /// Stable code (`catalog-list-failed`, `catalog-probe-timeout`, a bound's code...).
    pub code: String,
    /// Sanitized, bounded reason.
    pub message: String,
}

impl ChildCatalog {
    /// SHA-256 over the canonical JSON of the content (items sorted by their key). `skills`
    /// is part of it only when the child has any, so the fingerprint of a child without skills
    /// is what it was before skills existed.
    pub fn fingerprint(&self) -> String {
        let mut tools: Vec<_> = self
            .tools
            .iter()
            .map(|t| (t.name.to_string(), to_value(t)))
            .collect();
        tools.sort_by(|a, b| a.0.cmp(&b.0));
        let mut prompts: Vec<_> = self
            .prompts
            .iter()
            .map(|p| (p.name.clone(), to_value(p)))
            .collect();
        prompts.sort_by(|a, b| a.0.cmp(&b.0));
        let mut resources: Vec<_> = self
            .resources
            .iter()
            .map(|r| (r.uri.clone(), to_value(r)))
            .collect();
        resources.sort_by(|a, b| a.0.cmp(&b.0));
        let mut templates: Vec<_> = self
            .resource_templates
            .iter()
            .map(|r| (r.uri_template.clone(), to_value(r)))
            .collect();
        templates.sort_by(|a, b| a.0.cmp(&b.0));
        let strip =
            |v: Vec<(String, serde_json::Value)>| v.into_iter().map(|(_, v)| v).collect::<Vec<_>>();
        let mut doc = serde_json::json!({
            "tools": strip(tools),
            "prompts": strip(prompts),
            "resources": strip(resources),
            "resourceTemplates": strip(templates),
        });
        if !self.unavailable.is_empty() {
            // A family that could not be listed is not a family that lists nothing.
            doc["unavailable"] = self.unavailable.keys().cloned().collect::<Vec<_>>().into();
        }
        if !self.skills.is_empty() {
            let mut skills: Vec<_> = self
                .skills
                .iter()
                .map(|s| (s.uri.clone(), to_value(s)))
                .collect();
            skills.sort_by(|a, b| a.0.cmp(&b.0));
            doc["skills"] = strip(skills).into();
        }
        sha256_hex(canonical_json(&doc).as_bytes())
    }
}

fn to_value<T: Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_ignores_item_order() {
        let t1 = Tool::new("a", "x", serde_json::Map::new());
        let t2 = Tool::new("b", "y", serde_json::Map::new());
        let c1 = ChildCatalog {
            tools: vec![t1.clone(), t2.clone()],
            ..Default::default()
        };
        let c2 = ChildCatalog {
            tools: vec![t2, t1],
            ..Default::default()
        };
        assert_eq!(c1.fingerprint(), c2.fingerprint());
        assert_ne!(c1.fingerprint(), ChildCatalog::default().fingerprint());
    }

    #[test]
    fn skills_change_the_fingerprint_and_no_skills_keep_the_old_one() {
        let plain = ChildCatalog::default();
        // The fingerprint of an empty catalog as computed before skills were a family.
        let before = sha256_hex(
            canonical_json(&serde_json::json!({
                "tools": [], "prompts": [], "resources": [], "resourceTemplates": []
            }))
            .as_bytes(),
        );
        assert_eq!(plain.fingerprint(), before);
        let skill = |uri: &str| Skill {
            uri: uri.into(),
            name: "n".into(),
            description: "d".into(),
        };
        let with = ChildCatalog {
            skills: vec![skill("skill://a/SKILL.md"), skill("skill://b/SKILL.md")],
            ..Default::default()
        };
        let reversed = ChildCatalog {
            skills: vec![skill("skill://b/SKILL.md"), skill("skill://a/SKILL.md")],
            ..Default::default()
        };
        assert_ne!(with.fingerprint(), before);
        assert_eq!(with.fingerprint(), reversed.fingerprint());
    }
}
