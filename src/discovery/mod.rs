//! Tool search for `find_tools`: BM25F fused with dense embeddings, in tiers.
//!
//! - [`text`]: lexical analysis (word splitting, stop words, Porter stemmer).
//! - [`index`]: per-child segments (postings + vectors), BM25F, dense search, fusion.
//! - [`embed`]: the static tier (potion-base-2M, in the binary) and its WordPiece tokenizer.
//! - [`semantic`]: the semantic tier (all-MiniLM-L6-v2 int8 on ONNX Runtime), when installed.
//! - [`engine`]: tiers and rankers, loaded models, query embedding, background vectors with a
//!   disk cache (it sees segments only through [`engine::Embeddable`]).
//! - [`bench`]: `graph-os bench discovery` (ranking quality and latency).
//! - [`domain`]: which configured servers a query names (domain-first waiting).
//!
//! Documents are tools ([`tool_doc`]) and skills ([`skill_doc`]) in the same index, so
//! find_tools ranks both in one list.
//!
//! Written here rather than pulled from a search crate: BM25F over four fields, a 64-d lookup
//! table and exact dot products are a few hundred lines; a text-search engine would dominate the
//! dependency tree and build time. The one ML runtime (`ort`) is loaded at run time, only for the
//! semantic tier.

pub mod bench;
pub mod domain;
pub mod embed;
pub mod engine;
pub mod index;
pub mod legacy;
pub mod semantic;
pub mod text;

pub use engine::{Engine, EngineConfig, Ranker};
pub use index::{
    BM25, Bm25Params, Doc, Found, Hit, Index, LEXICAL_SHARE, Mode, NORM, Norm, Segment,
};
pub use text::tokenize;

use rmcp::model::Tool;

use crate::catalog::Skill;

/// The search document of a tool: exposed name split into words (plus the child's own name
/// when the prefix hides it), server name with category and hint, description, and parameter
/// names with their descriptions.
pub fn tool_doc(server: &str, server_meta: &[&str], exposed: &str, tool: &Tool) -> Doc {
    let mut name = text::spaced(exposed);
    let original = text::spaced(&tool.name);
    if !name.ends_with(&original) {
        name.push(' ');
        name.push_str(&original);
    }
    Doc {
        key: exposed.to_string(),
        server: server.to_string(),
        name,
        server_text: server_text(server, server_meta),
        description: tool.description.as_deref().unwrap_or_default().to_string(),
        params: param_text(&tool.input_schema),
    }
}

/// The search document of a skill: keyed by its SKILL.md URI (a `skill://` URI is never an
/// exposed tool name; the view drops a skill whose URI is one), its name split into words
/// (plus the URI's skill path when it differs), server name with category and hint, and the
/// front matter description. Skills have no parameters.
pub fn skill_doc(server: &str, server_meta: &[&str], skill: &Skill) -> Doc {
    let mut name = text::spaced(&skill.name);
    if let Some(path) = crate::catalog::skill::skill_path(&skill.uri) {
        let path = text::spaced(path);
        if path != name {
            name.push(' ');
            name.push_str(&path);
        }
    }
    Doc {
        key: skill.uri.clone(),
        server: server.to_string(),
        name,
        server_text: server_text(server, server_meta),
        description: skill.description.clone(),
        params: String::new(),
    }
}

fn server_text(server: &str, server_meta: &[&str]) -> String {
    let mut out = text::spaced(server);
    for m in server_meta {
        if !m.is_empty() {
            out.push_str(". ");
            out.push_str(m);
        }
    }
    out
}

/// Parameter names (split into words) and descriptions of an input schema, as search text.
pub fn param_text(schema: &serde_json::Map<String, serde_json::Value>) -> String {
    let mut out = String::new();
    if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
        for (k, v) in props {
            if !out.is_empty() {
                out.push_str("; ");
            }
            out.push_str(&text::spaced(k));
            if let Some(d) = v.get("description").and_then(|d| d.as_str()) {
                out.push_str(": ");
                out.push_str(d);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(key: &str, desc: &str, params: &str) -> Doc {
        Doc {
            key: key.into(),
            server: "ev".into(),
            name: text::spaced(key),
            server_text: "ev".into(),
            description: desc.into(),
            params: params.into(),
        }
    }

    fn all(_: &str) -> bool {
        true
    }

    #[test]
    fn ranks_the_matching_tool_first_in_every_mode() {
        let idx = Index::build(&[
            doc(
                "ev__echo",
                "Echoes back the input",
                "message: Message to echo",
            ),
            doc(
                "ev__get-sum",
                "Returns the sum of two numbers",
                "a: First number; b: Second number",
            ),
            doc("ev__get-tiny-image", "Returns a tiny image", ""),
        ]);
        assert_eq!(idx.ranker(), Ranker::Static);
        let found = idx.search("add two numbers", 3, &all);
        assert_eq!(found.ranker, Ranker::Static);
        assert_eq!(found.hits[0].key, "ev__get-sum");
        let lex = idx.search_mode("add two numbers", 3, &all, Mode::Lexical, &BM25);
        assert_eq!(lex.hits[0].key, "ev__get-sum");
        assert_eq!(lex.ranker, Ranker::Lexical);
        assert!(
            idx.search_mode("zzz", 3, &all, Mode::Lexical, &BM25)
                .hits
                .is_empty()
        );
        let dense = idx.search_mode("picture", 3, &all, Mode::Dense(0), &BM25);
        assert_eq!(dense.hits[0].key, "ev__get-tiny-image");
    }

    #[test]
    fn hidden_servers_neither_appear_nor_shift_scores() {
        let mut a = doc("a__weather", "Current weather for a city", "");
        a.server = "a".into();
        let mut b = doc("b__weather_alerts", "Weather alerts for a region", "");
        b.server = "b".into();
        let mut c = doc("c__stocks", "Stock quotes", "");
        c.server = "c".into();
        let both = Index::build(&[a.clone(), b, c.clone()]);
        let only_a = Index::build(&[a, c]);
        let not_b = |s: &str| s != "b";
        let x = both.search("weather", 5, &not_b);
        let y = only_a.search("weather", 5, &all);
        assert!(x.hits.iter().all(|h| h.server != "b"));
        assert_eq!(x.hits, y.hits);
    }

    #[test]
    fn unchanged_children_keep_their_segment() {
        let engine = Engine::new(EngineConfig::default());
        let idx = Index::default();
        let group = |s: &str, d: &str| {
            (
                s.to_string(),
                vec![{
                    let mut x = doc(&format!("{s}__t"), d, "");
                    x.server = s.into();
                    x
                }],
            )
        };
        let one = idx.update(
            vec![group("a", "alpha"), group("b", "beta")],
            engine.clone(),
        );
        let two = one.update(vec![group("a", "alpha"), group("b", "gamma")], engine);
        assert!(Arc::ptr_eq(&one.segments()[0], &two.segments()[0]));
        assert!(!Arc::ptr_eq(&one.segments()[1], &two.segments()[1]));
        assert!(two.segments()[0].vectors(0).is_some());
    }

    use std::sync::Arc;

    #[test]
    fn a_query_naming_a_server_ranks_its_tool_over_look_alikes() {
        let tool = |name: &str, desc: &str| -> Tool {
            serde_json::from_value(serde_json::json!({
                "name": name, "description": desc,
                "inputSchema": {"type": "object", "properties": {
                    "title": {"type": "string", "description": "Title of the merge request"}}}
            }))
            .unwrap()
        };
        let docs = vec![
            tool_doc(
                "github",
                &["vcs"],
                "gh__create_merge_request",
                &tool(
                    "create_merge_request",
                    "Create a merge request (pull request) to merge a branch",
                ),
            ),
            tool_doc(
                "gitlab",
                &["vcs"],
                "gl__create_mr",
                &tool("create_mr", "Open an MR for a branch"),
            ),
            tool_doc(
                "jira",
                &[],
                "jira__create_issue",
                &tool("create_issue", "Create an issue"),
            ),
        ];
        let idx = Index::build(&docs);
        let top =
            |q: &str, mode: Mode| idx.search_mode(q, 3, &all, mode, &BM25).hits[0].key.clone();
        for mode in [Mode::Lexical, idx.best_mode()] {
            assert_eq!(
                top("open a merge request in GitLab", mode),
                "gl__create_mr",
                "{mode:?}"
            );
            assert_eq!(
                top("open a merge request on github", mode),
                "gh__create_merge_request"
            );
        }
    }

    #[test]
    fn tool_doc_has_every_field() {
        let tool: Tool = serde_json::from_value(serde_json::json!({
            "name": "create_merge_request",
            "description": "Open a merge request",
            "inputSchema": {"type": "object", "properties": {
                "sourceBranch": {"type": "string", "description": "Branch to merge"}}}
        }))
        .unwrap();
        let d = tool_doc(
            "gitlab",
            &["vcs", "GitLab API"],
            "gl__create_merge_request",
            &tool,
        );
        assert_eq!(d.name, "gl create merge request");
        assert_eq!(d.server_text, "gitlab. vcs. GitLab API");
        assert_eq!(d.params, "source Branch: Branch to merge");
        assert_eq!(d.key, "gl__create_merge_request");
    }

    #[test]
    fn skill_doc_is_keyed_by_uri_and_searchable_by_name_and_description() {
        let skill = Skill {
            uri: "skill://pdf-forms/SKILL.md".into(),
            name: "pdf-forms".into(),
            description: "Fill in PDF forms and flatten them".into(),
        };
        let d = skill_doc("docs", &["documents"], &skill);
        assert_eq!(d.key, "skill://pdf-forms/SKILL.md");
        assert_eq!(d.name, "pdf forms");
        assert_eq!(d.server_text, "docs. documents");
        assert_eq!(d.description, "Fill in PDF forms and flatten them");
        assert!(d.params.is_empty());
        let renamed = skill_doc(
            "docs",
            &[],
            &Skill {
                name: "Form filler".into(),
                ..skill.clone()
            },
        );
        assert_eq!(renamed.name, "Form filler pdf forms");
        // Skills and tools rank in one list.
        let add = tool_doc(
            "calc",
            &[],
            "calc__add",
            &Tool::new("add", "Add two numbers", serde_json::Map::new()),
        );
        let idx = Index::build(&[add, d]);
        let hits = idx.search("fill a pdf form", 2, &all).hits;
        assert_eq!(hits[0].key, "skill://pdf-forms/SKILL.md");
        assert_eq!(
            idx.search("add two numbers", 2, &all).hits[0].key,
            "calc__add"
        );
    }
}
