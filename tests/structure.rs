//! Architecture guards (docs/architecture.md): the protocol layer (`src/server`) performs no child I/O —
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
fn the_module_roots_stay_thin() {
    // A module root declares its parts and the few types that tie them; the work lives in the
    // parts (the multiplexer's: fleet, view, sessions, generations, forward, meta, tasks, …).
    for root in ["src/server/mod.rs", "src/mux/mod.rs"] {
        let text =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(root)).unwrap();
        let lines = text.lines().count();
        assert!(lines <= 400, "{root} has {lines} lines");
    }
}

/// The library's top-level modules (a folder or a file under `src/`), each with the other
/// top-level modules its code imports (`crate::…`; comments and `#[cfg(test)] mod tests` left out:
/// a unit test may wire a real neighbour from above).
fn module_imports() -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>
{
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let modules: Vec<String> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').to_string())
        .collect();
    let mut graph = std::collections::BTreeMap::new();
    for m in &modules {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(m);
        let files = if dir.is_dir() {
            sources(&format!("src/{m}"))
        } else {
            let path = dir.with_extension("rs");
            let text = std::fs::read_to_string(&path).unwrap();
            vec![(path, text)]
        };
        let mut edges = std::collections::BTreeMap::new();
        for (path, text) in files {
            let text = match text.find("#[cfg(test)]\nmod tests") {
                Some(at) => &text[..at],
                None => &text[..],
            };
            for (n, line) in code(text) {
                for (at, _) in line.match_indices("crate::") {
                    let rest = &line[at + "crate::".len()..];
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if name != *m && modules.contains(&name) {
                        let at = path
                            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                            .unwrap_or(&path);
                        edges
                            .entry(name)
                            .or_insert_with(|| format!("{}:{n}", at.display()));
                    }
                }
            }
        }
        graph.insert(m.clone(), edges);
    }
    graph
}

#[test]
fn no_two_top_level_modules_import_each_other_even_through_others() {
    let graph = module_imports();
    // A cycle exists iff some module reaches itself; report each one once, with where each step is.
    let mut cycles = Vec::new();
    for start in graph.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = std::collections::BTreeSet::new();
        while let Some((at, path)) = stack.pop() {
            for next in graph[&at].keys() {
                if next == start {
                    let steps: Vec<String> = path
                        .iter()
                        .zip(path.iter().skip(1).chain(std::iter::once(start)))
                        .map(|(a, b)| format!("{a} -> {b} ({})", graph[a][b]))
                        .collect();
                    cycles.push(steps.join("; "));
                } else if next > start && seen.insert(next.clone()) {
                    let mut p = path.clone();
                    p.push(next.clone());
                    stack.push((next.clone(), p));
                }
            }
        }
    }
    assert!(
        cycles.is_empty(),
        "module cycles (docs/architecture.md: layers):\n{}",
        cycles.join("\n")
    );
}

#[test]
fn the_ground_floor_imports_nothing_of_the_crate() {
    let graph = module_imports();
    for floor in ["codes", "digest", "memory", "net", "wire"] {
        assert!(
            graph[floor].is_empty(),
            "{floor} is the ground floor and imports {:?}",
            graph[floor]
        );
    }
}

#[test]
fn the_multiplexer_is_implemented_only_in_its_module() {
    let mut hits = Vec::new();
    for (path, text) in sources("src") {
        if path.starts_with(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/mux")) {
            continue;
        }
        for (n, line) in code(&text) {
            let line = line.trim_start();
            if line.starts_with("impl") && line.contains("Multiplexer") && line.contains('{') {
                hits.push(format!("{}:{n}: {line}", path.display()));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "impl Multiplexer outside src/mux:\n{}",
        hits.join("\n")
    );
}

#[test]
fn the_gateway_is_built_in_one_place_on_top() {
    // Nothing in the library imports the composition root …
    let graph = module_imports();
    let importers: Vec<String> = graph
        .iter()
        .filter(|(m, edges)| *m != "gateway" && edges.contains_key("gateway"))
        .map(|(m, edges)| format!("{m} ({})", edges["gateway"]))
        .collect();
    assert!(
        importers.is_empty(),
        "the library imports gateway: {importers:?}"
    );
    // … and the binary's entry point only parses and hands over.
    let main =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/main.rs")).unwrap();
    let lines = main.lines().count();
    assert!(lines <= 300, "src/main.rs has {lines} lines");
    for wiring in [
        "Multiplexer::start",
        "HttpOptions",
        "serve_stdio",
        "kube::Client",
    ] {
        assert!(
            !main.contains(wiring),
            "src/main.rs wires the gateway itself ({wiring})"
        );
    }
}
