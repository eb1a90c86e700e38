//! Fleet file compatibility, end to end through the real binary: the configuration files of
//! Claude Desktop, Claude Code, Cursor, VS Code, Windsurf and Cline (tests/fixtures/client-configs,
//! each written from its client's documentation, cited in the README there) validate with
//! `graph-os validate`, match the published JSON Schema, and never echo a secret. Serving them is
//! tests/python/test_config_compat.py. The published schema equals `graph-os schema` (drift test).

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixtures() -> PathBuf {
    root().join("tests/fixtures/client-configs")
}

fn testchild() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_graph-os")).with_file_name("graph-os-testchild")
}

/// Canaries standing in for credentials: they may reach a child, never graph-os's output.
const CANARIES: &[(&str, &str)] = &[
    ("GITHUB_PERSONAL_ACCESS_TOKEN", "ghp_CANARY_desktop_51d2"),
    ("API_KEY", "CANARY_claude_code_77a1"),
    ("CURSOR_REMOTE_TOKEN", "CANARY_cursor_3c9e"),
    ("WINDSURF_API_KEY", "CANARY_windsurf_aa02"),
    ("CLINE_API_KEY", "CANARY_cline_0b7d"),
    ("CLINE_REMOTE_TOKEN", "CANARY_cline_remote_e41f"),
];

/// `(path, admitted, disabled)` of every fixture.
const FILES: &[(&str, usize, usize)] = &[
    ("claude-desktop/claude_desktop_config.json", 2, 0),
    ("claude-code/.mcp.json", 2, 0),
    ("cursor/.cursor/mcp.json", 2, 0),
    ("vscode/.vscode/mcp.json", 2, 0),
    ("windsurf/mcp_config.json", 2, 0),
    ("cline/cline_mcp_settings.json", 3, 1),
];

fn validate(file: &Path, extra: &[(&str, &str)]) -> (bool, String, String) {
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_graph-os"))
        .args(["validate", "--config"])
        .arg(file)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("GRAPH_OS_TESTCHILD", testchild())
        .env("GRAPH_OS_TEST_HTTP_PORT", "9")
        .envs(CANARIES.iter().copied())
        .envs(extra.iter().copied())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_client_file_validates_unchanged_and_never_echoes_a_secret() {
    for (file, admitted, disabled) in FILES {
        let path = fixtures().join(file);
        let (ok, stdout, stderr) = validate(&path, &[("GRAPH_OS_INPUT_PERPLEXITY_KEY", "CANARY")]);
        assert!(ok, "{file}:\n{stdout}\n{stderr}");
        let summary =
            format!("{admitted} servers admitted, 0 refused, {disabled} disabled, 0 problems");
        assert!(stdout.contains(&summary), "{file}: {stdout}");
        for (_, canary) in CANARIES {
            assert!(
                !stdout.contains(canary) && !stderr.contains(canary),
                "{file}"
            );
        }
    }
}

#[test]
fn client_only_keys_are_warnings_on_stderr_not_problems() {
    let (ok, stdout, stderr) = validate(&fixtures().join("cline/cline_mcp_settings.json"), &[]);
    assert!(ok, "{stdout}{stderr}");
    for path in [
        "mcpServers.local-server.alwaysAllow",
        "mcpServers.with-type.autoApprove",
        "mcpServers.remote-server.alwaysAllow",
    ] {
        assert!(
            stderr.contains(&format!("warning: {path}: has no effect")),
            "{path}: {stderr}"
        );
    }
    assert!(!stdout.contains("warning"), "{stdout}");
}

#[test]
fn a_vs_code_file_without_its_input_validates_with_a_warning_naming_the_variable() {
    let (ok, stdout, stderr) = validate(&fixtures().join("vscode/.vscode/mcp.json"), &[]);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stderr.contains("warning: servers.Perplexity.env.PERPLEXITY_API_KEY")
            && stderr.contains("GRAPH_OS_INPUT_PERPLEXITY_KEY"),
        "{stderr}"
    );
}

#[test]
fn problems_name_every_path_and_a_syntax_error_its_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mcp.json");
    std::fs::write(
        &file,
        r#"{
  // three unknown keys, a type error and an inline credential: five lines
  "mcpServers": {
    "github": {"command": "x", "colour": 1, "size": 2, "shape": 3, "args": "no",
               "env": {"TOKEN": "ghp_CANARY_inline"}},
    "My Server": {"command": "x", "args": ["${NOT_SET_ANYWHERE_1f}"]},
  },
}"#,
    )
    .unwrap();
    let (ok, stdout, _) = validate(&file, &[]);
    assert!(!ok);
    for path in [
        "mcpServers.github.colour",
        "mcpServers.github.size",
        "mcpServers.github.shape",
        "mcpServers.github.args",
        "mcpServers.My Server.args[0]",
    ] {
        assert!(stdout.contains(&format!("(at {path})")), "{path}: {stdout}");
    }
    assert!(stdout.contains("0 servers admitted, 2 refused"), "{stdout}");
    assert!(!stdout.contains("ghp_CANARY_inline"));
    std::fs::write(
        &file,
        "{\n  \"mcpServers\": {\n    \"a\": {\"command\": \"x\",,}\n  }\n}\n",
    )
    .unwrap();
    let (ok, stdout, _) = validate(&file, &[]);
    assert!(!ok);
    assert!(
        stdout.contains("invalid JSON at line 3, column"),
        "{stdout}"
    );
}

#[test]
fn the_published_schema_is_what_graph_os_schema_prints() {
    let out = Command::new(env!("CARGO_BIN_EXE_graph-os"))
        .arg("schema")
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    let path = root().join("schema/mcp_config.schema.json");
    if std::env::var_os("UPDATE_SCHEMA").is_some() {
        std::fs::write(&path, &printed).unwrap();
    }
    let published = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        published == printed,
        "schema/mcp_config.schema.json drifted from the fleet file types: run `cargo run --bin graph-os -- schema > schema/mcp_config.schema.json` (or UPDATE_SCHEMA=1 cargo test --test config_compat)"
    );
}

#[test]
fn every_client_file_matches_the_published_schema_and_bad_ones_do_not() {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("schema/mcp_config.schema.json")).unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    for (file, _, _) in FILES {
        let text = std::fs::read_to_string(fixtures().join(file)).unwrap();
        let doc = graph_os::config::parse_document(&text, false).unwrap();
        let errors: Vec<String> = validator.iter_errors(&doc).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{file}: {errors:?}");
    }
    for bad in [
        serde_json::json!({"mcpServers": {"a": {"command": "x", "colour": 1}}}),
        serde_json::json!({"mcpServers": {"a": {"command": 5}}}),
        serde_json::json!({"nope": {}}),
    ] {
        assert!(!validator.is_valid(&bad), "{bad}");
    }
}

#[test]
fn messages_speak_json_suggest_the_nearest_key_and_take_one_duration_syntax() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mcp.json");
    std::fs::write(&file, r#"{"mcpServer": {"a": {"command": "x"}}}"#).unwrap();
    let (ok, stdout, _) = validate(&file, &[]);
    assert!(!ok);
    assert!(
        stdout.contains(
            "mcpServer: unknown top-level key (did you mean 'mcpServers'?) (at mcpServer)\n"
        ),
        "{stdout}"
    );
    assert!(
        stdout.ends_with(": 0 servers admitted, 0 refused, 0 disabled, 1 problem\n"),
        "{stdout}"
    );
    std::fs::write(
        &file,
        r#"{"mcpServers": {"a": {"command": "x", "maxConcurency": 3, "args": "x",
            "maxSessions": "many", "callTimeout": "30s", "queueTimeout": "soon", "colour": 1}}}"#,
    )
    .unwrap();
    let (ok, stdout, _) = validate(&file, &[]);
    assert!(!ok);
    for line in [
        "server 'a' field 'maxConcurency': unknown key 'maxConcurency' (did you mean 'maxConcurrency'?) (at mcpServers.a.maxConcurency)",
        "server 'a' field 'args': wrong type: expected a list (at mcpServers.a.args)",
        "server 'a' field 'maxSessions': wrong type: expected a whole number (at mcpServers.a.maxSessions)",
        "server 'a' field 'queueTimeout': expected seconds (a number) or a duration such as \"30s\", \"1500ms\", \"2m\" (at mcpServers.a.queueTimeout)",
        // Nothing near enough: no suggestion.
        "server 'a' field 'colour': unknown key 'colour' (at mcpServers.a.colour)",
    ] {
        assert!(stdout.contains(&format!("{line}\n")), "{line}\n{stdout}");
    }
    assert!(
        !stdout.contains("callTimeout"),
        "\"30s\" is a duration: {stdout}"
    );
    assert!(
        stdout.ends_with(": 0 servers admitted, 1 refused, 0 disabled, 5 problems\n"),
        "{stdout}"
    );
}

#[test]
fn doctor_checks_the_fleet_serve_would_read_and_a_read_error_says_its_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fleet.json");
    std::fs::write(
        &file,
        r#"{"mcpServers": {"a": {"command": "sh", "colour": 1}}}"#,
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_graph-os"))
        .arg("doctor")
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir.path())
        .env("GRAPH_OS_CONFIG", &file)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains("0 servers admitted, 1 refused, 0 disabled, 1 problem: NOT ready"),
        "{stdout}"
    );
    let missing = dir.path().join("missing.json");
    let out = Command::new(env!("CARGO_BIN_EXE_graph-os"))
        .args(["--transport", "stdio", "--config"])
        .arg(&missing)
        .env_clear()
        .env("HOME", dir.path())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let cause = "No such file or directory (os error 2)";
    assert_eq!(stderr.matches(cause).count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "cannot read fleet file {}: {cause}",
            missing.display()
        )),
        "{stderr}"
    );
}
