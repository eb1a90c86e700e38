//! Architecture guards (DESIGN.md §1): the protocol layer (`src/server`) performs no child I/O —
//! every child operation is a `Multiplexer` method taking a `Caller` — and the multiplexer never
//! imports the protocol layer. These read the sources, so a violation fails here before review.

use std::path::{Path, PathBuf};

fn sources(dir: &str) -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                out.push((path, text));
            }
        }
    }
    assert!(!out.is_empty(), "no sources under {dir}");
    out
}

/// Code lines only: comments and doc comments may name anything.
fn code(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(i, l)| (i + 1, l))
}

#[test]
fn the_protocol_layer_never_reaches_a_child() {
    // What child I/O looks like from outside `mux`: the runtime type, the fleet's runtimes, the
    // runtime's own forwarding methods, the mux's internal child lookup, child routes.
    let forbidden = [
        "ChildRuntime",
        "crate::child::",
        "graph_os::child::",
        ".fleet()",
        ".child(",
        "call_tool_inner",
        "::Routes",
        "connection_generation",
    ];
    let mut hits = Vec::new();
    for (path, text) in sources("src/server") {
        for (n, line) in code(&text) {
            for f in forbidden {
                // `crate::child::relay_*` names the stable relay codes, not a runtime.
                if line.contains(f) && !line.contains("crate::child::relay_") {
                    hits.push(format!("{}:{n}: {}", path.display(), line.trim()));
                }
            }
        }
    }
    assert!(
        hits.is_empty(),
        "src/server reaches into children:\n{}",
        hits.join("\n")
    );
}

#[test]
fn the_multiplexer_does_not_import_the_protocol_layer() {
    let mut hits = Vec::new();
    for (path, text) in sources("src/mux") {
        for (n, line) in code(&text) {
            if line.contains("crate::server") || line.contains("super::super::server") {
                hits.push(format!("{}:{n}: {}", path.display(), line.trim()));
            }
        }
    }
    for dir in [
        "src/child",
        "src/catalog",
        "src/config",
        "src/auth",
        "src/transport",
    ] {
        for (path, text) in sources(dir) {
            for (n, line) in code(&text) {
                if line.contains("crate::server") || line.contains("crate::mux") {
                    hits.push(format!("{}:{n}: {}", path.display(), line.trim()));
                }
            }
        }
    }
    assert!(hits.is_empty(), "upward imports:\n{}", hits.join("\n"));
}

#[test]
fn the_server_module_root_stays_thin() {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/server/mod.rs"))
            .unwrap();
    let lines = text.lines().count();
    assert!(lines <= 400, "src/server/mod.rs has {lines} lines");
}
