//! The stable codes have one list (`graph_os::codes`): `docs/error-codes.md` is generated from
//! it, and the code may produce no code-shaped string that is not on it (nor may the list hold a
//! code nothing produces). Reads the sources, like `tests/structure.rs`.
//!
//! `GRAPH_OS_UPDATE_DOCS=1 cargo test --test error_codes` rewrites the docs page.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Kebab-case strings in the code that are not codes, by what they are.
const NOT_CODES: &[(&str, &[&str])] = &[
    (
        "HTTP header names and values",
        &[
            "mcp-session-id",
            "mcp-protocol-version",
            "content-type",
            "content-length",
            "transfer-encoding",
            "proxy-connection",
            "x-accel-buffering",
            "no-cache",
            "no-store",
            "no-referrer",
        ],
    ),
    (
        "well-known paths and schema keys",
        &[
            "oauth-protected-resource",
            "oauth-authorization-server",
            "openid-configuration",
            "x-kubernetes-validations",
        ],
    ),
    (
        "names: the product, a transport, a naming rule, helper processes, files, span fields",
        &[
            "graph-os",
            "streamable-http",
            "kebab-case",
            "graph-os-run-token",
            "graph-os-spawner",
            "graph-os-vectors",
            "graph-os-replica",
            "no-config",
            "mcp-method",
            "mcp-principal",
            "operator-page",
        ],
    ),
    (
        "flag names in messages",
        &[
            "allowed-host",
            "allowed-origin",
            "allowed-private-host",
            "oauth-scope-map",
            "session-store",
        ],
    ),
    (
        "metric and log labels (reasons and outcomes, not answers)",
        &[
            "tool-error",
            "input-required",
            "parked-overflow",
            "no-caller",
            "not-admitted",
            "session-not-admitted",
            "session-id-invalid",
            "session-principal-mismatch",
            "secret-material-rebound",
            "dns-timeout",
        ],
    ),
    (
        "values that are not errors",
        &[
            // What a credential contributes to the attestation digest.
            "credential-present",
            // serde's description of an unexpected value.
            "non-object",
        ],
    ),
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Code lines of the library and the binary: comments, unit tests (`#[cfg(test)] mod tests`
/// and `tests.rs` files) and benchmark code (its data sets' names) left out.
fn code_lines() -> Vec<(PathBuf, usize, String)> {
    let mut out = Vec::new();
    let mut stack = vec![root().join("src")];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if path.is_dir() {
                if name != "bench" {
                    stack.push(path);
                }
                continue;
            }
            // `codes.rs` is the list itself, not a place that produces a code.
            if !name.ends_with(".rs")
                || name == "tests.rs"
                || name == "bench.rs"
                || path == root().join("src/codes.rs")
                || test_only(&path)
            {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let text = match text.find("#[cfg(test)]\nmod tests") {
                Some(at) => &text[..at],
                None => &text[..],
            };
            for (n, line) in text.lines().enumerate() {
                if !line.trim_start().starts_with("//") {
                    out.push((path.clone(), n + 1, line.to_string()));
                }
            }
        }
    }
    out
}

/// Whether the module in `path` is declared `#[cfg(test)]` by its parent (`mod.rs` beside it).
fn test_only(path: &Path) -> bool {
    let stem = path.file_stem().unwrap().to_string_lossy();
    let Ok(parent) = std::fs::read_to_string(path.with_file_name("mod.rs")) else {
        return false;
    };
    ["mod", "pub(crate) mod", "pub mod"]
        .iter()
        .any(|decl| parent.contains(&format!("#[cfg(test)]\n{decl} {stem};")))
}

/// Every `"kebab-case"` string literal of the code, with where it first appears.
fn kebab_literals() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (path, n, line) in code_lines() {
        for piece in line.split('"').skip(1).step_by(2) {
            let words: Vec<&str> = piece.split('-').collect();
            if words.len() > 1
                && words.iter().all(|w| {
                    !w.is_empty()
                        && w.bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                        && w.as_bytes()[0].is_ascii_lowercase()
                })
            {
                out.entry(piece.to_string()).or_insert_with(|| {
                    let at = path.strip_prefix(root()).unwrap_or(&path);
                    format!("{}:{n}", at.display())
                });
            }
        }
    }
    out
}

#[test]
fn the_docs_page_is_generated_from_the_list() {
    let path = root().join("docs/error-codes.md");
    let generated = graph_os::codes::markdown();
    if std::env::var_os("GRAPH_OS_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap();
    assert!(
        on_disk == generated,
        "docs/error-codes.md differs from src/codes.rs: run GRAPH_OS_UPDATE_DOCS=1 cargo test --test error_codes"
    );
}

#[test]
fn the_code_produces_no_code_the_list_does_not_have() {
    let not_codes: BTreeSet<&str> = NOT_CODES
        .iter()
        .flat_map(|(_, c)| c.iter().copied())
        .collect();
    let unlisted: Vec<String> = kebab_literals()
        .into_iter()
        .filter(|(s, _)| !graph_os::codes::is_code(s) && !not_codes.contains(s.as_str()))
        .map(|(s, at)| format!("{s} ({at})"))
        .collect();
    assert!(
        unlisted.is_empty(),
        "code-shaped strings on no list: add each to src/codes.rs (a code) or to NOT_CODES here \
         (with what it is):\n{}",
        unlisted.join("\n")
    );
}

#[test]
fn every_listed_code_is_produced_somewhere() {
    let code: String = code_lines().into_iter().map(|(_, _, l)| l + "\n").collect();
    let mut stale = Vec::new();
    for surface in graph_os::codes::SURFACES {
        for (c, _) in surface.codes {
            if !code.contains(c) {
                stale.push(format!("{c} ({})", surface.place));
            }
        }
    }
    for (what, strings) in NOT_CODES {
        for s in *strings {
            if !code.contains(&format!("\"{s}\"")) {
                stale.push(format!("{s} (NOT_CODES: {what})"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "listed but never produced:\n{}",
        stale.join("\n")
    );
}
