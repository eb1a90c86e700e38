//! Fleet documents (JSON and YAML) through parsing and validation: never a panic, every issue
//! renders, every admitted remote child's URL is one the URL model accepts again.
#![no_main]

use graph_os::config::{AdmissionContext, Launch, parse_document, urls, validate_document};
use graph_os::net::egress::{Allowlist, GatewayEgress};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let remote = AdmissionContext {
        egress: GatewayEgress {
            allow_loopback: false,
            allowed: Allowlist::default(),
        },
        ..Default::default()
    };
    for yaml in [false, true] {
        let Ok(doc) = parse_document(text, yaml) else {
            continue;
        };
        for ctx in [&AdmissionContext::default(), &remote] {
            let fleet = validate_document(&doc, "fuzz", ctx);
            for issue in &fleet.issues {
                let _ = issue.to_string();
            }
            for child in fleet.children.values() {
                if let Launch::Remote(r) = &child.launch {
                    let again = urls::parse_remote_url(r.url.as_str());
                    assert!(again.is_ok(), "an admitted URL no longer parses: {again:?}");
                }
                let _ = graph_os::config::attest::freshness_identity(child);
            }
        }
    }
});
