//! Trust boundary II at the config boundary: one URL model, egress rules named at validation,
//! TLS profile references, and no value ever echoed by an error.

use graph_os::config::{AdmissionContext, Fleet, validate_document};
use graph_os::net::egress::{Allowlist, GatewayEgress};
use serde_json::json;

fn fleet(doc: serde_json::Value) -> Fleet {
    validate_document(&doc, "test", &AdmissionContext::default())
}

fn remote_profile() -> AdmissionContext {
    AdmissionContext {
        egress: GatewayEgress {
            allow_loopback: false,
            allowed: Allowlist::default(),
        },
        ..Default::default()
    }
}

fn reasons(f: &Fleet, server: &str) -> String {
    f.issues
        .iter()
        .filter(|i| i.server == server)
        .map(|i| format!("{}: {}", i.field, i.reason))
        .collect::<Vec<_>>()
        .join(" | ")
}

#[test]
fn validate_refuses_the_issue_urls_naming_the_rule() {
    let f = fleet(json!({"mcpServers": {
        "backslash": {"url": "http://127.0.0.1\\.localhost:1/mcp"},
        "pct": {"url": "http://10.1.2.3%2e/"},
        "userinfo": {"url": "http://user@10.0.0.1/"},
        "metadata": {"url": "https://169.254.169.254/mcp"},
        "private": {"url": "https://10.0.0.5/mcp"},
        "cgnat": {"url": "https://100.64.1.1/mcp"},
        "ula": {"url": "https://[fd00::1]/mcp"},
        "mapped": {"url": "https://[::ffff:a9fe:a9fe]/mcp"},
        "empty": {"url": "https:///mcp"},
        "ftp": {"url": "ftp://a.example/mcp"},
        "ok": {"url": "https://a.example/mcp"},
    }}));
    for (server, needle) in [
        ("backslash", "backslash"),
        ("pct", "percent-encoded"),
        ("userinfo", "user info"),
        ("metadata", "link-local"),
        ("private", "RFC 1918"),
        ("cgnat", "carrier-grade NAT"),
        ("ula", "unique local"),
        ("mapped", "link-local"),
        ("empty", "no host"),
        ("ftp", "http:// or https://"),
    ] {
        let r = reasons(&f, server);
        assert!(r.starts_with("url: "), "{server}: {r}");
        assert!(r.contains(needle), "{server}: {r}");
    }
    assert!(reasons(&f, "metadata").contains("egress-denied"));
    assert_eq!(f.children.keys().collect::<Vec<_>>(), vec!["ok"]);
}

#[test]
fn loopback_needs_the_local_profile_or_an_allow_list() {
    let doc = json!({"mcpServers": {
        "lo": {"url": "https://127.0.0.1:9/mcp"},
        "plain": {"url": "http://127.0.0.1:9/mcp"},
        "name": {"url": "https://localhost:9/mcp"},
        "listed": {"url": "http://127.0.0.1:9/mcp", "allowedPrivateHosts": ["127.0.0.1"]},
        "cidr": {"url": "https://10.2.3.4/mcp", "allowedPrivateHosts": ["10.0.0.0/8"]},
        "badlist": {"url": "https://a.example/mcp", "allowedPrivateHosts": ["not a host"]},
    }});
    let local = validate_document(&doc, "t", &AdmissionContext::default());
    for s in ["lo", "plain", "name", "listed", "cidr"] {
        assert!(
            local.children.contains_key(s),
            "{s}: {}",
            reasons(&local, s)
        );
    }
    assert!(reasons(&local, "badlist").starts_with("allowedPrivateHosts: "));
    let remote = validate_document(&doc, "t", &remote_profile());
    for s in ["lo", "plain", "name"] {
        assert!(
            reasons(&remote, s).contains("loopback"),
            "{s}: {}",
            reasons(&remote, s)
        );
    }
    assert!(remote.children.contains_key("listed") && remote.children.contains_key("cidr"));
    let gateway_list = AdmissionContext {
        egress: GatewayEgress {
            allow_loopback: false,
            allowed: Allowlist::parse(&["127.0.0.1", "localhost"]).unwrap(),
        },
        ..Default::default()
    };
    let listed = validate_document(&doc, "t", &gateway_list);
    for s in ["lo", "plain", "name"] {
        assert!(
            listed.children.contains_key(s),
            "{s}: {}",
            reasons(&listed, s)
        );
    }
}

#[test]
fn tls_profiles_must_exist_and_apply_to_https_children() {
    let f = fleet(json!({
        "tlsProfiles": {"internal": {"minVersion": "1.3"}},
        "mcpServers": {
            "unknown": {"url": "https://a.example/mcp", "tlsProfile": "no-such-profile"},
            "plain": {"url": "http://127.0.0.1:9/mcp", "tlsProfile": "internal"},
            "stdio": {"command": "x", "tlsProfile": "internal"},
            "good": {"url": "https://a.example/mcp", "tlsProfile": "internal"},
        }
    }));
    assert!(
        reasons(&f, "unknown")
            .contains("tlsProfile: names no profile in tlsProfiles (known: internal)")
    );
    assert!(reasons(&f, "plain").contains("https://"));
    assert!(reasons(&f, "stdio").contains("remote children only"));
    assert!(f.children.contains_key("good"));
    let before = fleet(json!({"mcpServers": {"good": {"url": "https://a.example/mcp"}}}));
    assert_ne!(
        before.revision, f.revision,
        "profiles are part of the config revision"
    );
}

#[test]
fn errors_never_echo_values() {
    let f = fleet(json!({"mcpServers": {
        "envstr": {"command": "x", "env": "GITHUB_TOKEN=ghp_CANARY1"},
        "envnum": {"command": "x", "env": {"DB_PASSWORD": 12345678}},
        "args": {"command": "x", "args": "ghp_CANARY2"},
        "expose": {"command": "x", "expose": "ghp_CANARY3"},
        "glued": {"command": "x", "env": {"API_KEY": "sk-inline${HOME}"}},
        "two": {"command": "x", "env": {"API_KEY": "${A}${B}"}},
        "after": {"command": "x", "env": {"API_KEY": "${A}-ghp_CANARY4"}},
        "entry": "GITHUB_TOKEN=ghp_CANARY5",
        "bearer": {"url": "https://a.example/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}},
    }}));
    let text: String = f.issues.iter().map(|i| i.to_string() + "\n").collect();
    for canary in ["CANARY", "12345678", "sk-inline"] {
        assert!(!text.contains(canary), "{canary} in:\n{text}");
    }
    assert_eq!(reasons(&f, "envstr"), "env: wrong type: expected an object");
    assert_eq!(
        reasons(&f, "envnum"),
        "env.DB_PASSWORD: wrong type: expected a string"
    );
    assert!(reasons(&f, "args").starts_with("args: wrong type"));
    assert!(reasons(&f, "expose").starts_with("expose: unknown value: expected `lazy` or `eager`"));
    for s in ["glued", "two", "after"] {
        assert!(
            reasons(&f, s).contains("inline credential refused"),
            "{s}: {}",
            reasons(&f, s)
        );
    }
    assert_eq!(reasons(&f, "entry"), ": the entry must be an object");
    assert!(f.children.contains_key("bearer"));
}
