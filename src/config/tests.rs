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
