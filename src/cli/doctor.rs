//! `graph-os doctor --config FILE`: what would happen if this fleet were served here — without
//! starting anything. Validation problems, each stdio `command` looked up on PATH (children
//! inherit PATH), each remote URL checked against the egress policy (statically, then by one DNS
//! resolution), and the variables each stdio child would get: names only, never a value.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use graph_os::config::{self, AdmissionContext, Launch};
use graph_os::net::egress::Policy;
use graph_os::transport::stdio;

/// Where `command` resolves: a path (relative to `cwd` when given) or the first executable match
/// on `path`. `None`: not found or not executable.
pub fn resolve_command(command: &str, cwd: Option<&Path>, path: Option<&str>) -> Option<PathBuf> {
    let executable = |p: &Path| {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        }
        #[cfg(not(unix))]
        {
            p.is_file()
        }
    };
    if command.contains('/') {
        let p = match cwd {
            Some(dir) if Path::new(command).is_relative() => dir.join(command),
            _ => PathBuf::from(command),
        };
        return executable(&p).then_some(p);
    }
    std::env::split_paths(path?)
        .map(|dir| dir.join(command))
        .find(|p| executable(p))
}

/// The references among `values` (env or header values) that this process's environment cannot
/// resolve, as written (`${NAME}`, `env://NAME`): names, never values. `vault://` / `secret://`
/// references (served by a backend) and `env://` aliases while `MCP_FLEET_SECRET_REFS` may map
/// them are not checked here.
fn unresolved<'a>(values: impl Iterator<Item = &'a graph_os::secrets::SecretValue>) -> Vec<String> {
    use graph_os::secrets::{SecretError, process_env, refs};
    let mapping = std::env::var_os(refs::ENV).is_some();
    let mut missing: Vec<String> = values
        .filter(|v| v.externals().next().is_none())
        .filter(|v| !(mapping && v.env_aliases().next().is_some()))
        .filter_map(|v| match v.resolve(&process_env) {
            Err(SecretError::Unavailable { reference }) => Some(reference),
            _ => None,
        })
        .collect();
    missing.sort();
    missing.dedup();
    missing
}

/// Checks the fleet at `path` for the profile `ctx`; prints one line per finding; exit 1 when
/// anything would fail.
pub fn fleet(path: &Path, ctx: &AdmissionContext) -> ExitCode {
    let egress = &ctx.egress;
    let fleet = match config::load_file(path, ctx) {
        Ok(f) => f,
        Err(e) => {
            println!("doctor: {}: {}: {e}", path.display(), e.code());
            return ExitCode::FAILURE;
        }
    };
    let mut failed = !fleet.issues.is_empty();
    for issue in &fleet.issues {
        println!("problem: {issue}");
    }
    // The same warnings `validate` prints (client-only keys, normalized names, references not set).
    for warning in &fleet.warnings {
        println!("warning: {}: {}", fleet.issue_path(warning), warning.reason);
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            println!("doctor: no async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let parent_path = std::env::var("PATH").ok();
    for (name, spec) in &fleet.children {
        let (kind, missing) = match &spec.launch {
            Launch::Stdio(s) => ("env", unresolved(s.env.values())),
            Launch::Remote(r) => ("headers", unresolved(r.headers.values())),
        };
        if !missing.is_empty() {
            failed = true;
            println!(
                "{name}: {kind}: {} not set here: the child would fail with secret-unavailable",
                missing.join(", ")
            );
        }
        match &spec.launch {
            Launch::Stdio(stdio) => {
                match resolve_command(&stdio.command, stdio.cwd.as_deref(), parent_path.as_deref())
                {
                    Some(found) => println!(
                        "{name}: stdio: command {:?} found at {}",
                        stdio.command,
                        found.display()
                    ),
                    None => {
                        failed = true;
                        println!(
                            "{name}: stdio: command {:?} MISSING (not an executable on PATH{}): the child would fail with child-spawn-failed",
                            stdio.command,
                            if stdio.command.contains('/') {
                                " or at that path"
                            } else {
                                ""
                            }
                        );
                    }
                }
                let mut inherited: Vec<String> = std::env::vars_os()
                    .filter_map(|(k, _)| k.into_string().ok())
                    .filter(|k| stdio::inherits(k))
                    .filter(|k| !stdio.env.contains_key(k))
                    .collect();
                inherited.sort();
                let own: Vec<&str> = stdio.env.keys().map(String::as_str).collect();
                println!(
                    "{name}: env: declared [{}]; inherited [{}]",
                    own.join(", "),
                    inherited.join(", ")
                );
            }
            Launch::Remote(remote) => {
                let policy = Policy::with(egress, &remote.allowed_private_hosts);
                let verdict = match policy.check_static(&remote.url) {
                    Err(denied) => Err(denied.code().to_string()),
                    Ok(()) => rt.block_on(async {
                        match tokio::time::timeout(
                            Duration::from_secs(5),
                            policy.resolve(&remote.url),
                        )
                        .await
                        {
                            Ok(Ok(_)) => Ok(()),
                            Ok(Err(e)) => Err(e.code().to_string()),
                            Err(_) => Err("dns-timeout".to_string()),
                        }
                    }),
                };
                let host = graph_os::net::egress::url_host(&remote.url);
                match verdict {
                    Ok(()) => println!(
                        "{name}: {:?}: host {host} allowed by the egress policy",
                        remote.transport
                    ),
                    Err(code) => {
                        failed = true;
                        println!(
                            "{name}: {:?}: host {host} REFUSED: {code}",
                            remote.transport
                        );
                    }
                }
                let headers: Vec<&str> = remote.headers.keys().map(String::as_str).collect();
                println!("{name}: headers: [{}]", headers.join(", "));
            }
        }
    }
    println!(
        "stdio children inherit exactly: {}",
        stdio::ENV_ALLOWLIST.join(" ")
    );
    println!("isolation: {}", graph_os::transport::isolation::describe());
    println!(
        "{}: {}: {}",
        path.display(),
        fleet.summary(),
        if failed { "NOT ready" } else { "ready" }
    );
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Checks that this build can serve: the MCP protocol versions it needs, the fleet schema and
/// validation on known documents, the MCP face and the McpFleet CRD. Run by the Dockerfile.
pub fn binary() -> ExitCode {
    use graph_os::config::Fleet;
    use graph_os::mux::{Multiplexer, MuxSettings};
    use graph_os::server::GatewayHandler;
    use rmcp::ServerHandler;
    let mut failures = Vec::new();
    let versions: Vec<String> = rmcp::model::ProtocolVersion::KNOWN_VERSIONS
        .iter()
        .map(|v| v.to_string())
        .collect();
    for needed in ["2025-06-18", "2025-11-25", "2026-07-28"] {
        if !versions.iter().any(|v| v == needed) {
            failures.push(format!(
                "protocol {needed} is not supported by this build (have {versions:?})"
            ));
        }
    }
    let good = serde_json::json!({"mcpServers": {"a": {"command": "x", "env": {"API_TOKEN": "env://A"}}, "b": {"url": "https://b.example/mcp"}}});
    let fleet = config::validate_document(&good, "doctor", &AdmissionContext::default());
    if !fleet.issues.is_empty() || fleet.children.len() != 2 {
        failures.push(format!(
            "fleet validation rejects a known-good document: {:?}",
            fleet.issues
        ));
    }
    let bad =
        serde_json::json!({"mcpServers": {"a": {"command": "x", "env": {"API_TOKEN": "literal"}}}});
    if config::validate_document(&bad, "doctor", &AdmissionContext::default())
        .issues
        .is_empty()
    {
        failures.push("fleet validation admits an inline credential".into());
    }
    if !graph_os::kube::crd::crd_yaml().contains("mcpfleets.graphos.dev") {
        failures.push("the McpFleet CRD does not generate".into());
    }
    let state = std::env::temp_dir().join(format!("graph-os-doctor-{}", std::process::id()));
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(async {
            let settings = MuxSettings {
                state_dir: state.clone(),
                ..Default::default()
            };
            let mux = match Multiplexer::start(Fleet::empty("doctor"), settings) {
                Ok(mux) => mux,
                Err(e) => {
                    failures.push(e.to_string());
                    return;
                }
            };
            let info = GatewayHandler::new(mux.clone()).get_info();
            if info.capabilities.tools.is_none() {
                failures.push("the MCP face advertises no tools capability".into());
            }
            mux.shutdown().await;
        }),
        Err(e) => failures.push(format!("no async runtime: {e}")),
    }
    let _ = std::fs::remove_dir_all(&state);
    if failures.is_empty() {
        println!(
            "graph-os {}: ok (protocols {})",
            env!("CARGO_PKG_VERSION"),
            versions.join(", ")
        );
        ExitCode::SUCCESS
    } else {
        for f in &failures {
            println!("doctor: {f}");
        }
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_is_found_on_path_or_reported_missing() {
        let path = std::env::var("PATH").unwrap_or_default();
        assert!(resolve_command("sh", None, Some(&path)).is_some());
        assert!(resolve_command("graph-os-no-such-command-xyz", None, Some(&path)).is_none());
        assert!(
            resolve_command("sh", None, None).is_none(),
            "no PATH: nothing resolves"
        );
        assert!(resolve_command("/bin/sh", None, None).is_some());
        assert!(resolve_command("./sh", Some(Path::new("/bin")), None).is_some());
        // Not executable: a plain file is not a command.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("notexec"), "x").unwrap();
        assert!(resolve_command("notexec", None, dir.path().to_str()).is_none());
    }
}
