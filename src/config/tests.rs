use super::*;
use serde_json::json;

fn fleet(doc: serde_json::Value) -> Fleet {
    validate_document(&doc, "test", &AdmissionContext::default())
}

fn fields(f: &Fleet, server: &str) -> Vec<String> {
    f.issues
        .iter()
        .filter(|i| i.server == server)
        .map(|i| i.field.clone())
        .collect()
}

#[test]
fn a_plain_mcp_servers_file_is_a_fleet_with_seed_defaults() {
    let f = fleet(json!({"mcpServers": {"a": {"command": "x", "args": ["--y"]}}}));
    assert!(f.issues.is_empty(), "{:?}", f.issues);
    let a = &f.children["a"];
    assert_eq!(a.limits.max_concurrency, 8);
    assert_eq!(a.limits.queue_timeout, Duration::from_secs(30));
    assert_eq!(a.limits.pool_size, 1);
    assert_eq!(a.limits.max_restarts, 5);
    assert_eq!(a.limits.restart_window, Duration::from_secs(300));
    assert_eq!(a.limits.breaker_threshold, 5);
    assert_eq!(a.limits.breaker_cooldown, Duration::from_secs(15));
    assert_eq!(a.limits.probe_timeout, Duration::from_secs(10));
    assert_eq!(a.expose, ExposeMode::Lazy);
}

#[test]
fn unknown_keys_are_named_and_only_that_entry_is_refused() {
    let f = fleet(
        json!({"mcpServers": {"bad": {"command": "x", "colour": 1}, "good": {"command": "y"}}}),
    );
    assert_eq!(fields(&f, "bad"), vec!["colour"]);
    assert!(f.children.contains_key("good"));
    assert_eq!(f.refused, vec!["bad"]);
}

#[test]
fn every_unknown_key_of_an_entry_is_named_once_whatever_its_value() {
    let f = fleet(json!({"mcpServers": {"s": {
        "command": "x", "colour": 1, "envv": {"A": "b"}, "auth": {"type": "run-token", "bogus": 1},
    }}}));
    let mut got = fields(&f, "s");
    got.sort();
    assert_eq!(got, vec!["auth.bogus", "colour", "envv"]);
}

#[test]
fn every_bound_is_enforced() {
    for (key, value) in [
        ("maxConcurrency", json!(0)),
        ("maxConcurrency", json!(129)),
        ("queueTimeout", json!(0)),
        ("queueTimeout", json!(301)),
        ("maxRestarts", json!(101)),
        ("breakerThreshold", json!(101)),
        ("breakerCooldown", json!(3601)),
        ("restartWindow", json!(86401)),
        ("probeTimeout", json!(301)),
        ("callTimeout", json!(0)),
        ("initializationTimeout", json!(-1)),
    ] {
        let f = fleet(json!({"mcpServers": {"s": {"command": "x", key: value}}}));
        assert_eq!(fields(&f, "s"), vec![key.to_string()], "{key}={value}");
    }
    let f = fleet(json!({"mcpServers": {"s": {"url": "https://a.example/mcp", "poolSize": 65}}}));
    assert_eq!(fields(&f, "s"), vec!["poolSize"]);
}

#[test]
fn inline_credentials_are_refused_and_references_accepted() {
    let f = fleet(json!({"mcpServers": {
        "inline": {"command": "x", "env": {"GITHUB_TOKEN": "ghp_abc"}},
        "hdr": {"url": "https://a.example/mcp", "headers": {"Authorization": "Bearer abc"}},
        "refs": {"command": "x", "env": {"GITHUB_TOKEN": "env://GH_TOKEN", "API_KEY": "${KEY}", "PLAIN": "ok"}},
        "tmpl": {"url": "https://a.example/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}},
    }}));
    assert_eq!(fields(&f, "inline"), vec!["env.GITHUB_TOKEN"]);
    assert_eq!(fields(&f, "hdr"), vec!["headers.Authorization"]);
    assert!(f.children.contains_key("refs") && f.children.contains_key("tmpl"));
    let text: String = f.issues.iter().map(|i| i.to_string()).collect();
    assert!(!text.contains("ghp_abc") && !text.contains("Bearer abc"));
}

#[test]
fn command_xor_url_and_url_policy() {
    let f = fleet(json!({"mcpServers": {
        "both": {"command": "x", "url": "https://a/mcp"},
        "neither": {"args": []},
        "plain": {"url": "http://example.com/mcp"},
        "local": {"url": "http://127.0.0.1:9/mcp"},
        "allowed": {"url": "http://intranet/mcp", "allowedPrivateHosts": ["intranet"]},
        "userinfo": {"url": "https://u:p@a.example/mcp"},
        "sse": {"url": "https://a.example/sse"},
    }}));
    assert_eq!(fields(&f, "both"), vec!["command"]);
    assert_eq!(fields(&f, "neither"), vec!["command"]);
    assert_eq!(fields(&f, "plain"), vec!["url"]);
    assert_eq!(fields(&f, "userinfo"), vec!["url"]);
    assert!(f.children.contains_key("local") && f.children.contains_key("allowed"));
    match &f.children["sse"].launch {
        Launch::Remote(r) => assert_eq!(r.transport, TransportKind::Sse),
        other => panic!("{other:?}"),
    }
}

#[test]
fn graph_os_never_registers_itself() {
    let ctx = AdmissionContext {
        self_addresses: vec!["127.0.0.1:8004".into()],
        ..Default::default()
    };
    let doc = json!({"mcpServers": {
        "graph-os": {"command": "graph-os"},
        "loop": {"url": "http://localhost:8004/mcp"},
        "other": {"url": "http://localhost:9000/mcp"},
    }});
    let f = validate_document(&doc, "t", &ctx);
    assert_eq!(f.refused, vec!["graph-os", "loop"]);
    assert!(f.children.contains_key("other"));
    assert!(
        f.issues
            .iter()
            .all(|i| i.reason.starts_with("self-registration-refused: ")),
        "{:?}",
        f.issues
    );
}

/// The hosts graph-os is reached by are graph-os on any port (its ingress on 443 in front of a
/// listener on 8004); its listen addresses only with their port.
#[test]
fn an_allowed_host_is_graph_os_on_any_port() {
    let ctx = AdmissionContext {
        self_addresses: vec![
            "0.0.0.0:8004".into(),
            "127.0.0.1:8004".into(),
            "[::1]:8004".into(),
        ],
        self_hosts: vec![
            "GW.example.test".into(),
            "ingress.example.test:8443".into(),
            "localhost".into(),
        ],
        ..Default::default()
    };
    let is_self = |u: &str| crate::config::points_at_self(&url::Url::parse(u).unwrap(), &ctx);
    assert!(is_self("https://gw.example.test/mcp"));
    assert!(is_self("https://gw.example.test.:443/mcp"));
    assert!(is_self("http://gw.example.test:8004/mcp"));
    assert!(is_self("https://ingress.example.test/mcp"));
    assert!(is_self("http://127.0.0.1:8004/mcp"));
    assert!(is_self("http://localhost:8004/mcp"));
    assert!(is_self("http://[::1]:8004/mcp"));
    assert!(!is_self("https://other.example.test/mcp"));
    assert!(!is_self("https://sub.gw.example.test/mcp"));
    // Another port on loopback is another local server, even with `localhost` allowed.
    assert!(!is_self("http://localhost:9000/mcp"));
    assert!(!is_self("http://127.0.0.1:9000/mcp"));
    let doc = json!({"mcpServers": {
        "ingress": {"url": "https://gw.example.test/mcp"},
        "elsewhere": {"url": "https://other.example.test/mcp"},
    }});
    let f = validate_document(&doc, "t", &ctx);
    assert_eq!(f.refused, vec!["ingress"]);
    assert!(f.children.contains_key("elsewhere"));
}

#[test]
fn disabled_entries_and_globs() {
    let f = fleet(json!({"mcpServers": {
        "off": {"command": "x", "disabled": true},
        "g": {"command": "x", "enabledTools": ["get_*", "add"], "disabledTools": ["get_secret*"]},
    }}));
    assert_eq!(f.disabled, vec!["off"]);
    let g = &f.children["g"];
    assert!(g.tool_enabled("get_sum") && g.tool_enabled("add"));
    assert!(!g.tool_enabled("get_secret_key") && !g.tool_enabled("echo"));
}

#[test]
fn yaml_documents_load_like_json() {
    let doc = parse_document(
        "mcpServers:\n  a:\n    command: x\n    expose: eager\n    prefix: ''\n",
        true,
    )
    .unwrap();
    let f = fleet(doc);
    assert!(f.issues.is_empty(), "{:?}", f.issues);
    assert_eq!(f.children["a"].expose, ExposeMode::Eager);
    assert_eq!(f.children["a"].prefix.as_deref(), Some(""));
}

#[test]
fn config_revision_depends_on_admitted_content_only() {
    let a = fleet(json!({"mcpServers": {"a": {"command": "x"}, "bad": {"nope": 1}}}));
    let b = fleet(json!({"mcpServers": {"a": {"command": "x"}}}));
    let c = fleet(json!({"mcpServers": {"a": {"command": "y"}}}));
    assert_eq!(a.revision, b.revision);
    assert_ne!(b.revision, c.revision);
}

#[test]
fn prefix_overrides_are_normalized() {
    assert_eq!(spec_normalize("Pin-It!"), "pin_it");
    assert_eq!(spec_normalize("averyveryverylongprefix"), "averyveryv");
}

fn spec_normalize(s: &str) -> String {
    super::spec::normalize_prefix(s)
}

#[test]
fn child_auth_takes_secrets_only_by_reference_and_names_every_bad_field() {
    let cc = |extra: serde_json::Value| {
        let mut auth = json!({"type": "oauth-client-credentials", "tokenUrl": "https://as.example/token",
                              "clientId": "gw", "clientSecret": "env://CC"});
        auth.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        auth
    };
    let f = fleet(json!({"mcpServers": {
        "ok": {"url": "https://mcp.example/mcp", "auth": cc(json!({"scope": "read"}))},
        "inline": {"url": "https://mcp.example/mcp", "auth": cc(json!({"clientSecret": "hunter2"}))},
        "stdio": {"command": "x", "auth": cc(json!({}))},
        "mixed": {"url": "https://mcp.example/mcp", "auth": cc(json!({"key": "env://K"}))},
        "both": {"url": "https://mcp.example/mcp", "auth": cc(json!({})), "headers": {"Authorization": "Bearer ${T}"}},
        "rt": {"command": "x", "auth": {"type": "run-token", "key": "env://K", "ttl": 30}},
        "rt-inline": {"command": "x", "auth": {"type": "run-token", "key": "literal-key", "ttl": 0}},
        "typo": {"command": "x", "auth": {"type": "run-token", "key": "env://K", "kee": 1}},
        "jwt": {"url": "https://mcp.example/mcp", "auth": {"type": "oauth-client-credentials", "clientId": "gw",
                "tokenEndpointAuth": "private_key_jwt", "privateKey": "env://PK", "keyId": "k1"}},
        "jwt-secret": {"url": "https://mcp.example/mcp", "auth": cc(json!({"tokenEndpointAuth": "private_key_jwt"}))},
        "jwt-inline": {"url": "https://mcp.example/mcp", "auth": {"type": "oauth-client-credentials", "clientId": "gw",
                "tokenEndpointAuth": "private_key_jwt", "privateKey": "-----BEGIN PRIVATE KEY-----"}},
        "kid-alone": {"url": "https://mcp.example/mcp", "auth": cc(json!({"keyId": "k1"}))},
    }}));
    assert!(fields(&f, "jwt").is_empty(), "{:?}", f.issues);
    let Launch::Remote(jwt) = &f.children["jwt"].launch else {
        panic!("remote")
    };
    let jwt = jwt.client_credentials.as_ref().unwrap();
    assert_eq!(jwt.method, crate::config::TokenEndpointAuth::PrivateKeyJwt);
    assert_eq!(jwt.key_id.as_deref(), Some("k1"));
    // private_key_jwt takes a privateKey reference, not a clientSecret; a keyId needs it.
    assert_eq!(
        fields(&f, "jwt-secret"),
        ["auth.clientSecret", "auth.privateKey"]
    );
    assert_eq!(fields(&f, "jwt-inline"), ["auth.privateKey"]);
    assert_eq!(fields(&f, "kid-alone"), ["auth.keyId"]);
    assert!(fields(&f, "ok").is_empty(), "{:?}", f.issues);
    let Launch::Remote(remote) = &f.children["ok"].launch else {
        panic!("remote")
    };
    let grant = remote.client_credentials.as_ref().unwrap();
    assert!(
        grant.method == crate::config::TokenEndpointAuth::ClientSecretBasic
            && grant.scope.as_deref() == Some("read")
    );
    assert_eq!(fields(&f, "inline"), ["auth.clientSecret"]);
    assert_eq!(fields(&f, "stdio"), ["auth.type"]);
    assert_eq!(fields(&f, "mixed"), ["auth.key"]);
    assert_eq!(fields(&f, "both"), ["headers.Authorization"]);
    assert!(fields(&f, "rt").is_empty());
    assert_eq!(
        f.children["rt"].run_token.as_ref().unwrap().ttl,
        Duration::from_secs(30)
    );
    assert_eq!(fields(&f, "rt-inline"), ["auth.key", "auth.ttl"]);
    assert!(!fields(&f, "typo").is_empty());
    for refused in ["inline", "stdio", "mixed", "both", "rt-inline", "typo"] {
        assert!(f.refused.contains(&refused.to_string()), "{refused}");
    }
    assert!(!format!("{:?}", f.issues).contains("hunter2"));
}

#[test]
fn an_approved_digest_must_be_a_catalog_digest() {
    let f = fleet(json!({"mcpServers": {
        "ok": {"command": "x", "driftPolicy": "hold", "approvedDigest": "AB".repeat(32)},
        "bad": {"command": "x", "driftPolicy": "block", "approvedDigest": "abc"},
    }}));
    assert!(fields(&f, "ok").is_empty());
    assert_eq!(
        f.children["ok"].approved_digest.as_deref(),
        Some("ab".repeat(32).as_str())
    );
    assert_eq!(f.children["ok"].drift_policy, Some(DriftPolicy::Hold));
    assert_eq!(fields(&f, "bad"), ["approvedDigest"]);
}

// ---------------------------------------------------------------------------------------------
// Fleet file compatibility (src/config/compat.rs): files written for other MCP clients drop in.
// ---------------------------------------------------------------------------------------------

/// Validates `doc` as if read from `file`, with `vars` as the whole environment.
fn fleet_at(doc: serde_json::Value, file: Option<&str>, vars: &[(&str, &str)]) -> Fleet {
    let vars: BTreeMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let env = move |k: &str| vars.get(k).cloned();
    let origin = compat::Origin {
        file: file.map(Path::new),
        env: &env,
    };
    validate_document_at(&doc, "test", origin, &AdmissionContext::default())
}

fn stdio(f: &Fleet, name: &str) -> StdioSpec {
    match &f.children[name].launch {
        Launch::Stdio(s) => s.clone(),
        other => panic!("{name}: {other:?}"),
    }
}

fn remote(f: &Fleet, name: &str) -> RemoteSpec {
    match &f.children[name].launch {
        Launch::Remote(r) => r.clone(),
        other => panic!("{name}: {other:?}"),
    }
}

fn paths(f: &Fleet) -> Vec<String> {
    f.issues.iter().map(|i| f.issue_path(i)).collect()
}

#[test]
fn vs_code_servers_with_types_are_a_fleet() {
    let f = fleet(json!({"servers": {
        "local": {"type": "stdio", "command": "x"},
        "web": {"type": "http", "url": "https://a.example/mcp"},
        "old": {"type": "sse", "url": "https://a.example/events"},
    }}));
    assert!(f.issues.is_empty(), "{:?}", f.issues);
    assert_eq!(f.servers_key, "servers");
    assert!(f.children["local"].is_stdio());
    assert_eq!(remote(&f, "web").transport, TransportKind::StreamableHttp);
    assert_eq!(remote(&f, "old").transport, TransportKind::Sse);
    // One of the two names, not both.
    let f =
        fleet(json!({"mcpServers": {"a": {"command": "x"}}, "servers": {"b": {"command": "y"}}}));
    assert_eq!(paths(&f), ["servers"]);
    assert!(f.children.contains_key("a") && !f.children.contains_key("b"));
}

#[test]
fn a_type_that_names_no_transport_or_contradicts_transport_is_refused() {
    let f = fleet(json!({"mcpServers": {
        "bad": {"type": "websocket", "url": "https://a.example/mcp"},
        "clash": {"type": "sse", "transport": "http", "url": "https://a.example/mcp"},
        "stdio-url": {"type": "stdio", "url": "https://a.example/mcp"},
    }}));
    assert_eq!(fields(&f, "bad"), ["type"]);
    assert_eq!(fields(&f, "clash").len(), 1);
    assert_eq!(fields(&f, "stdio-url"), ["transport"]);
}

#[test]
fn inputs_in_env_and_headers_stay_references_that_fail_closed_when_unset() {
    let doc = json!({
        "inputs": [{"type": "promptString", "id": "api-key", "description": "API key", "password": true}],
        "servers": {
            "s": {"type": "stdio", "command": "x", "env": {"API_KEY": "${input:api-key}"}},
            "r": {"type": "http", "url": "https://a.example/mcp", "headers": {"Authorization": "Bearer ${input:api-key}"}},
        },
    });
    for vars in [&[][..], &[("GRAPH_OS_INPUT_API_KEY", "s3cr3t-CANARY")][..]] {
        let f = fleet_at(doc.clone(), None, vars);
        assert!(f.issues.is_empty(), "{:?}", f.issues);
        // The declaration holds the reference, never the value (whether or not it is set).
        let key = &stdio(&f, "s").env["API_KEY"];
        assert_eq!(key.as_written(), "${GRAPH_OS_INPUT_API_KEY}");
        assert_eq!(
            remote(&f, "r").headers["Authorization"].as_written(),
            "Bearer ${GRAPH_OS_INPUT_API_KEY}"
        );
        assert!(!format!("{f:?}").contains("CANARY"));
        // Resolved when the child starts: missing → secret-unavailable for that child only.
        let lookup = |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        match key.resolve(&lookup) {
            Ok(v) => assert_eq!(v, "s3cr3t-CANARY"),
            Err(e) => {
                assert!(vars.is_empty());
                assert_eq!(e.code(), "secret-unavailable");
            }
        }
        // Validate says so (a warning, not a problem) when the variable is not set.
        assert_eq!(f.warnings.is_empty(), !vars.is_empty(), "{:?}", f.warnings);
    }
}

#[test]
fn an_input_must_be_declared_and_ids_map_to_one_variable() {
    assert_eq!(compat::input_env_name("api-key"), "GRAPH_OS_INPUT_API_KEY");
    assert_eq!(
        compat::input_env_name("gh.token2"),
        "GRAPH_OS_INPUT_GH_TOKEN2"
    );
    let f = fleet(json!({"inputs": [{"id": "a"}, {"id": "a"}, {"id": 5}],
        "servers": {"s": {"command": "x", "env": {"T": "${input:typo}"}}}}));
    assert_eq!(
        paths(&f),
        ["inputs[1].id", "inputs[2].id", "servers.s.env.T"]
    );
}

#[test]
fn inputs_in_arguments_expand_at_load_unless_they_are_passwords() {
    let doc = json!({
        "inputs": [{"id": "dir", "type": "promptString"}, {"id": "pw", "type": "promptString", "password": true}],
        "servers": {
            "dir": {"command": "x", "args": ["--root", "${input:dir}"]},
            "pw": {"command": "x", "args": ["--password=${input:pw}"]},
        },
    });
    let f = fleet_at(doc.clone(), None, &[("GRAPH_OS_INPUT_DIR", "/data")]);
    assert_eq!(stdio(&f, "dir").args, ["--root", "/data"]);
    assert_eq!(paths(&f), ["servers.pw.args[0]"]);
    // Unset: refused when the file is validated, with the stable code (never at start).
    let f = fleet_at(doc, None, &[]);
    let dir: Vec<_> = f.issues.iter().filter(|i| i.server == "dir").collect();
    assert_eq!(dir.len(), 1);
    assert!(dir[0].reason.starts_with("secret-unavailable"), "{dir:?}");
    assert!(dir[0].reason.contains("GRAPH_OS_INPUT_DIR"));
}

#[test]
fn jsonc_comments_trailing_commas_and_a_bom_are_accepted() {
    let text = "\u{feff}{\n  // a comment\n  \"mcpServers\": {\n    /* block\n       comment */\n    \"a\": {\"command\": \"x\", \"args\": [\"//not-a-comment\", \"/*nor*/\",],},\n  },\n}\n";
    let f = fleet(parse_document(text, false).unwrap());
    assert!(f.issues.is_empty(), "{:?}", f.issues);
    assert_eq!(stdio(&f, "a").args, ["//not-a-comment", "/*nor*/"]);
    let yaml = parse_document("\u{feff}mcpServers:\n  a:\n    command: x\n", true).unwrap();
    assert!(fleet(yaml).children.contains_key("a"));
}

#[test]
fn a_json_syntax_error_names_its_line_and_column_without_quoting_the_file() {
    let text = "{\n  \"mcpServers\": {\n    \"a\": {\"command\": \"x\" \"env\": {\"TOKEN\": \"ghp_CANARY\"}}\n  }\n}\n";
    let err = parse_document(text, false).unwrap_err();
    assert!(
        err.starts_with("invalid JSON at line 3, column 26"),
        "{err}"
    );
    assert!(!err.contains("CANARY"));
    let err = parse_document("{\n /* never closed", false).unwrap_err();
    assert!(err.contains("comment") || err.contains("line 2"), "{err}");
}

#[test]
fn variables_expand_in_command_args_url_and_cwd_at_load() {
    let doc = json!({"mcpServers": {
        "s": {"command": "${BIN_DIR}/server", "args": ["${HOME}/data", "${env:MODE}", "${LEVEL:-info}", "${EMPTY:-fallback}"],
              "cwd": "${HOME}"},
        "r": {"url": "${BASE:-https://a.example}/mcp"},
    }});
    let f = fleet_at(
        doc,
        None,
        &[
            ("BIN_DIR", "/opt/bin"),
            ("HOME", "/home/u"),
            ("MODE", "fast"),
            ("EMPTY", ""),
        ],
    );
    assert!(f.issues.is_empty(), "{:?}", f.issues);
    let s = stdio(&f, "s");
    assert_eq!(s.command, "/opt/bin/server");
    assert_eq!(s.args, ["/home/u/data", "fast", "info", "fallback"]);
    assert_eq!(s.cwd.as_deref(), Some(Path::new("/home/u")));
    assert_eq!(remote(&f, "r").url.as_str(), "https://a.example/mcp");
}

#[test]
fn a_missing_variable_refuses_the_entry_at_validate_naming_the_path() {
    let f = fleet_at(
        json!({"mcpServers": {
            "s": {"command": "x", "args": ["ok", "${NOPE}", "${ALSO_NOPE}"]},
            "r": {"url": "https://${HOST}/mcp"},
            "weird": {"command": "x", "args": ["${command:pick}", "${unterminated"]},
            "fine": {"command": "x"},
        }}),
        None,
        &[],
    );
    let mut p = paths(&f);
    p.sort();
    assert_eq!(
        p,
        [
            "mcpServers.r.url",
            "mcpServers.s.args[1]",
            "mcpServers.s.args[2]",
            "mcpServers.weird.args[0]",
            "mcpServers.weird.args[1]",
        ]
    );
    assert!(f.children.contains_key("fine"));
}

#[test]
fn credentials_are_never_expanded_into_args_or_urls() {
    let f = fleet_at(
        json!({"mcpServers": {
            "a": {"command": "x", "args": ["--token", "${GITHUB_TOKEN}"]},
            "u": {"url": "https://a.example/mcp?key=${API_KEY}"},
        }}),
        None,
        &[("GITHUB_TOKEN", "ghp_CANARY"), ("API_KEY", "sk-CANARY")],
    );
    assert_eq!(paths(&f), ["mcpServers.a.args[1]", "mcpServers.u.url"]);
    assert!(f.children.is_empty());
    assert!(!format!("{:?}", f.issues).contains("CANARY"));
}

#[test]
fn env_and_header_values_stay_references_and_defaults_apply_only_when_unset() {
    let doc = json!({"mcpServers": {
        "s": {"command": "x", "env": {"GITHUB_TOKEN": "${GH_TOKEN}", "LEVEL": "${LOG_LEVEL:-info}", "ALT": "${env:ALT_TOKEN}"}},
        "r": {"url": "https://a.example/mcp", "headers": {"Authorization": "Bearer ${API_KEY}", "X-Region": "${REGION:-eu}"}},
    }});
    let f = fleet_at(
        doc.clone(),
        None,
        &[("LOG_LEVEL", "debug"), ("GH_TOKEN", "CANARY")],
    );
    assert!(f.issues.is_empty(), "{:?}", f.issues);
    let s = stdio(&f, "s");
    assert_eq!(s.env["GITHUB_TOKEN"].as_written(), "${GH_TOKEN}");
    assert_eq!(s.env["LEVEL"].as_written(), "${LOG_LEVEL}");
    assert_eq!(s.env["ALT"].as_written(), "${ALT_TOKEN}");
    let r = remote(&f, "r");
    assert_eq!(r.headers["Authorization"].as_written(), "Bearer ${API_KEY}");
    assert_eq!(r.headers["X-Region"].as_written(), "eu");
    assert!(!format!("{f:?}").contains("CANARY"));
    // A default is literal text from the file: a sensitive name still needs a reference.
    let f = fleet_at(
        json!({"mcpServers": {"s": {"command": "x", "env": {"API_KEY": "${KEY:-sk-inline}"}}}}),
        None,
        &[],
    );
    assert_eq!(paths(&f), ["mcpServers.s.env.API_KEY"]);
}

#[test]
fn workspace_folder_is_the_project_of_a_vscode_or_cursor_file_else_its_directory() {
    let doc = json!({"servers": {"s": {"command": "x", "args": ["${workspaceFolder}/src", "${workspaceFolderBasename}"],
                                       "env": {"ROOT": "${workspaceFolder}"}}}});
    let f = fleet_at(doc.clone(), Some("/p/proj/.vscode/mcp.json"), &[]);
    assert!(f.issues.is_empty(), "{:?}", f.issues);
    assert_eq!(stdio(&f, "s").args, ["/p/proj/src", "proj"]);
    assert_eq!(stdio(&f, "s").env["ROOT"].as_written(), "/p/proj");
    let f = fleet_at(doc.clone(), Some("/p/proj/.cursor/mcp.json"), &[]);
    assert_eq!(stdio(&f, "s").args[0], "/p/proj/src");
    let f = fleet_at(doc.clone(), Some("/etc/graph-os/mcp_config.json"), &[]);
    assert_eq!(stdio(&f, "s").args[0], "/etc/graph-os/src");
    // No file (an McpFleet resource): rejected when validated, never at start.
    let f = fleet_at(doc, None, &[]);
    assert_eq!(
        paths(&f),
        [
            "servers.s.args[0]",
            "servers.s.args[1]",
            "servers.s.env.ROOT"
        ]
    );
}

#[test]
fn an_env_file_gives_its_variables_to_the_child_and_env_wins() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".env"),
        "# comment\nAPI_TOKEN=tok-CANARY\nexport MODE=\"from file\"\nLEVEL=file\n",
    )
    .unwrap();
    let file = dir.path().join("mcp.json");
    let doc = json!({"mcpServers": {
        "s": {"command": "x", "envFile": ".env", "env": {"LEVEL": "entry"}},
        "abs": {"command": "x", "envFile": "${workspaceFolder}/.env"},
        "missing": {"command": "x", "envFile": "nope.env"},
        "remote": {"url": "https://a.example/mcp", "envFile": ".env"},
    }});
    let f = fleet_at(doc, file.to_str(), &[]);
    let s = stdio(&f, "s");
    let lookup = |_: &str| None;
    let value = |k: &str| s.env[k].resolve(&lookup).unwrap();
    assert_eq!(value("API_TOKEN"), "tok-CANARY");
    assert_eq!(value("MODE"), "from file");
    assert_eq!(value("LEVEL"), "entry");
    assert!(f.children.contains_key("abs"));
    assert_eq!(
        paths(&f),
        ["mcpServers.missing.envFile", "mcpServers.remote.envFile"]
    );
    let text = format!("{:?} {:?}", f.issues, f.warnings);
    assert!(!text.contains("CANARY"), "{text}");
    // A line that does not parse is named by number only (it may hold a credential).
    std::fs::write(dir.path().join("bad.env"), "OK=1\nthis is tok-CANARY\n").unwrap();
    let f = fleet_at(
        json!({"mcpServers": {"s": {"command": "x", "envFile": "bad.env"}}}),
        file.to_str(),
        &[],
    );
    assert_eq!(paths(&f), ["mcpServers.s.envFile"]);
    assert!(f.issues[0].reason.contains("line 2"), "{:?}", f.issues);
    assert!(!format!("{:?}", f.issues).contains("CANARY"));
}

#[test]
fn windsurf_server_url_is_url() {
    let f = fleet(json!({"mcpServers": {
        "w": {"serverUrl": "https://a.example/mcp", "headers": {"Authorization": "Bearer ${env:W_TOKEN}"}},
        "g": {"httpUrl": "https://a.example/mcp"},
        "both": {"serverUrl": "https://a.example/mcp", "url": "https://b.example/mcp"},
    }}));
    assert_eq!(remote(&f, "w").url.as_str(), "https://a.example/mcp");
    assert_eq!(remote(&f, "g").transport, TransportKind::StreamableHttp);
    assert_eq!(fields(&f, "both"), ["serverUrl"]);
}

#[test]
fn server_names_are_normalized_deterministically_and_collisions_name_both() {
    assert_eq!(compat::normalize_server_name("github"), "github");
    assert_eq!(compat::normalize_server_name("My Server"), "My-Server");
    assert_eq!(compat::normalize_server_name("  a / b  "), "a-b");
    assert_eq!(compat::normalize_server_name("weird--name"), "weird--name");
    assert_eq!(compat::normalize_server_name("Café (beta)!"), "Caf-beta");
    assert_eq!(
        compat::normalize_server_name("日本"),
        compat::normalize_server_name("日本")
    );
    assert!(compat::normalize_server_name("日本").starts_with("server-"));
    let f = fleet(json!({"mcpServers": {
        "My Server": {"command": "x", "bogus": 1},
        "Other One": {"command": "x"},
        "a b": {"command": "x"},
        "a-b": {"command": "x"},
    }}));
    let other = &f.children["Other-One"];
    assert_eq!(other.display_name.as_deref(), Some("Other One"));
    // Issues name the entry as written.
    assert!(paths(&f).contains(&"mcpServers.My Server.bogus".to_string()));
    let clash: Vec<_> = f
        .issues
        .iter()
        .filter(|i| i.server.starts_with('a'))
        .collect();
    assert_eq!(clash.len(), 2, "{clash:?}");
    assert!(
        clash.iter().all(
            |i| i.reason.contains("'a-b'") && (i.reason.contains("'a b'") || i.server == "a b")
        )
    );
    assert!(f.refused.contains(&"a b".to_string()) && f.refused.contains(&"a-b".to_string()));
    assert!(f.warnings.iter().any(|w| w.reason.contains("'Other One'")));
}

#[test]
fn client_only_keys_are_accepted_with_a_warning_or_mapped_to_ours() {
    let f = fleet(json!({"mcpServers": {
        "cline": {"command": "x", "autoApprove": ["read"], "alwaysAllow": [], "disabled": false, "timeout": 60},
        "off": {"command": "x", "disabled": true},
        "also-off": {"command": "x", "enabled": false, "args": ["${UNSET_BUT_DISABLED}"]},
        "units": {"command": "x", "timeout": "1500ms"},
        "ms": {"command": "x", "timeout": 30000},
        "described": {"command": "x", "description": "Reads files"},
    }}));
    // (30000 seconds is out of bounds: the entry is refused, with a hint that it looks like ms.)
    assert!(
        paths(&f).iter().all(|p| p.starts_with("mcpServers.ms.")),
        "{:?}",
        f.issues
    );
    assert!(f.children.contains_key("cline"));
    assert_eq!(f.disabled, ["also-off", "off"]);
    assert_eq!(
        f.children["units"].limits.call_timeout,
        Duration::from_millis(1500)
    );
    assert_eq!(f.children["described"].hint.as_deref(), Some("Reads files"));
    let mut w: Vec<String> = f.warnings.iter().map(|w| f.issue_path(w)).collect();
    w.sort();
    assert_eq!(
        w,
        [
            "mcpServers.cline.alwaysAllow",
            "mcpServers.cline.autoApprove",
            "mcpServers.ms.timeout"
        ]
    );
}

#[test]
fn validate_lists_every_problem_of_an_entry_with_its_path() {
    let f = fleet(json!({"mcpServers": {
        "github": {"command": "x", "colour": 1, "size": 2, "shape": 3, "maxConcurrency": 0,
                   "env": {"TOKEN": "ghp_CANARY", "N": 5}},
        "typed": {"command": "x", "args": "not-a-list", "auth": {"type": "run-token", "key": "env://K", "kee": 1}},
    }}));
    let mut p = paths(&f);
    p.sort();
    assert_eq!(
        p,
        [
            "mcpServers.github.colour",
            "mcpServers.github.env.N",
            "mcpServers.github.maxConcurrency",
            "mcpServers.github.shape",
            "mcpServers.github.size",
            "mcpServers.typed.args",
            "mcpServers.typed.auth.kee",
        ]
    );
    let args = f.issues.iter().find(|i| i.field == "args").unwrap();
    assert!(args.reason.starts_with("wrong type"), "{args:?}");
    assert!(!format!("{:?}", f.issues).contains("CANARY"));
}

#[test]
fn a_schema_key_is_accepted_and_the_published_schema_knows_the_compatibility_keys() {
    let f = fleet(
        json!({"$schema": "https://example.invalid/mcp_config.schema.json", "mcpServers": {}}),
    );
    assert!(f.issues.is_empty());
    let schema: serde_json::Value = serde_json::from_str(&compat::file_schema_json()).unwrap();
    let entry = &schema["$defs"]["ServerSpec"]["properties"];
    for key in [
        "command",
        "serverUrl",
        "envFile",
        "type",
        "autoApprove",
        "timeout",
    ] {
        assert!(entry.get(key).is_some(), "{key}");
    }
    for key in ["$schema", "mcpServers", "servers", "inputs", "tlsProfiles"] {
        assert!(schema["properties"].get(key).is_some(), "{key}");
    }
}
