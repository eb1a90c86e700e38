//! The composition root (`graph_os::gateway`): the gateway `graph-os serve` runs is built here
//! from a plain `Config`, the way `main.rs` builds it — a real test child, a real fleet file
//! watched for reloads, a real state directory; no command line.

use std::time::Duration;

use graph_os::gateway::{self, BuildError, Config, FleetSpec, Front};

fn testchild() -> String {
    std::path::Path::new(env!("CARGO_BIN_EXE_graph-os"))
        .with_file_name("graph-os-testchild")
        .display()
        .to_string()
}

fn fleet_doc(names: &[&str]) -> String {
    let servers: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .map(|n| {
            (
                n.to_string(),
                serde_json::json!({"command": testchild(), "prefix": n, "expose": "eager"}),
            )
        })
        .collect();
    serde_json::json!({ "mcpServers": servers }).to_string()
}

fn config(dir: &std::path::Path, fleet: &std::path::Path) -> Config {
    Config {
        fleet: FleetSpec::File(Some(fleet.to_path_buf())),
        state_dir: Some(dir.join("state")),
        replica_id: Some("test-replica".into()),
        ..Config::default()
    }
}

async fn names(gw: &gateway::Gateway) -> Vec<String> {
    gw.mux()
        .children_overview()
        .into_iter()
        .map(|c| c.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_is_built_from_a_plain_config_and_reloads_its_fleet_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mcp_config.json");
    std::fs::write(&file, fleet_doc(&["one"])).unwrap();
    let gw = gateway::build(config(dir.path(), &file))
        .await
        .expect("builds");
    assert_eq!(names(&gw).await, ["one"]);
    assert!(
        dir.path().join("state").is_dir(),
        "the configured state directory is used"
    );
    // The one reload loop applies the file's next version.
    std::fs::write(&file, fleet_doc(&["one", "two"])).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while names(&gw).await != ["one", "two"] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reload was not applied: {:?}",
            names(&gw).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // An unusable version keeps the fleet.
    std::fs::write(&file, "{ not json").unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(names(&gw).await, ["one", "two"]);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_state_directory_that_cannot_be_used_is_a_typed_startup_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mcp_config.json");
    std::fs::write(&file, fleet_doc(&[])).unwrap();
    // The configured directory is under a regular file, and so is the fallback this process
    // would use (`<tmp>/graph-os-state-<pid>`).
    let blocker = dir.path().join("a-file");
    std::fs::write(&blocker, "x").unwrap();
    let fallback = std::env::temp_dir().join(format!("graph-os-state-{}", std::process::id()));
    std::fs::write(&fallback, "x").unwrap();
    let built = gateway::build(Config {
        state_dir: Some(blocker.join("state")),
        ..config(dir.path(), &file)
    })
    .await;
    std::fs::remove_file(&fallback).unwrap();
    let err = built.err().expect("refused");
    assert!(matches!(err, BuildError::Startup(_)), "{err:?}");
    assert_eq!(err.code(), "state-dir-unusable");
    assert!(err.to_string().contains("--state-dir"), "{err}");
}

#[tokio::test]
async fn bad_settings_are_refused_before_anything_starts_with_the_flag_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mcp_config.json");
    std::fs::write(&file, fleet_doc(&["one"])).unwrap();
    let base = config(dir.path(), &file);
    let cases: Vec<(Config, &str, &str)> = vec![
        (
            Config {
                discovery_budget: 0.0,
                ..base.clone()
            },
            "invalid-setting",
            "--discovery-budget",
        ),
        (
            Config {
                trust: gateway::TrustConfig {
                    child_stop_grace: 601.0,
                    ..Default::default()
                },
                ..base.clone()
            },
            "invalid-setting",
            "--child-stop-grace",
        ),
        (
            Config {
                auth: gateway::AuthConfig {
                    oauth_issuer: Some("https://issuer.example".into()),
                    ..Default::default()
                },
                ..base.clone()
            },
            "invalid-setting",
            "--oauth-audience",
        ),
        (
            Config {
                front: Front::StreamableHttp,
                http: gateway::HttpConfig {
                    host: "0.0.0.0".into(),
                    ..Default::default()
                },
                ..base.clone()
            },
            "unauthenticated-exposure",
            "--allow-unauthenticated",
        ),
        (
            Config {
                front: Front::StreamableHttp,
                session_store: gateway::SessionStoreConfig {
                    url: "redis://user:pw@127.0.0.1:1".into(),
                    ..Default::default()
                },
                ..base.clone()
            },
            "invalid-setting",
            "--session-store-password",
        ),
        (
            Config {
                fleet: FleetSpec::File(Some(dir.path().join("missing.json"))),
                ..base.clone()
            },
            "config-unreadable",
            "missing.json",
        ),
    ];
    for (config, code, names) in cases {
        let err = gateway::build(config).await.err().expect("refused");
        assert_eq!(err.code(), code, "{err}");
        let text = err.to_string();
        assert!(text.contains(names), "{text}");
        assert!(!text.contains("pw@"), "no secret in the error: {text}");
    }
    // Nothing was started: no state written by the refused builds.
    assert!(!dir.path().join("state").exists());
}

#[tokio::test]
async fn a_port_in_use_is_refused_with_the_address_and_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mcp_config.json");
    std::fs::write(&file, fleet_doc(&[])).unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let gw = gateway::build(Config {
        front: Front::StreamableHttp,
        http: gateway::HttpConfig {
            port,
            ..Default::default()
        },
        ..config(dir.path(), &file)
    })
    .await
    .expect("builds");
    let err = gw.serve().await.expect_err("the port is taken");
    let text = format!("{err:#}");
    assert!(
        text.starts_with(&format!("cannot listen on 127.0.0.1:{port}: ")),
        "{text}"
    );
    assert!(
        text.ends_with("another process listens there: stop it or choose another (--host/--port)"),
        "{text}"
    );
}
