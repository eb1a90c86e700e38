//! What the stdio front says and does around its client, with the real binary: it says it waits,
//! a client that leaves before `initialize` is not a failure, a signal stops it with a log line,
//! and HTTP-only flags are not silently ignored.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn gateway(dir: &std::path::Path, extra: &[&str]) -> Command {
    let fleet = dir.join("fleet.json");
    std::fs::write(&fleet, r#"{"mcpServers": {}}"#).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_graph-os"));
    cmd.arg("--config")
        .arg(&fleet)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args(extra)
        .env_clear()
        .env("HOME", dir)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    cmd
}

#[test]
fn a_client_that_leaves_before_initialize_is_no_failure_and_ignored_flags_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = gateway(dir.path(), &["--port", "9999"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for line in [
        "waiting for an MCP client on stdin (logs go to stderr)",
        "the stdio client left before initialize",
        "--host/--port apply to --transport streamable-http and are ignored with stdio",
    ] {
        assert!(stderr.contains(line), "{line}\n{stderr}");
    }
    assert!(!stderr.contains("ERROR"), "{stderr}");
}

#[test]
fn a_signal_stops_the_stdio_front_with_a_log_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = gateway(dir.path(), &[])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let line = lines.next().expect("a log line").unwrap();
        if line.contains("waiting for an MCP client on stdin") {
            break;
        }
        assert!(Instant::now() < deadline, "never waited for a client");
    }
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}: {rest:?}");
    assert!(
        rest.iter()
            .any(|l| l.contains("stopping: no client had initialized") && l.contains("SIGTERM")),
        "{rest:?}"
    );
}
