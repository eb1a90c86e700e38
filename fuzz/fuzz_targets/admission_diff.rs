//! Differential: the same bytes through every reading the HTTP front makes of a `/mcp` POST body
//! and through rmcp's own decoder (`serde_json::from_slice::<ClientJsonRpcMessage>`, what rmcp's
//! streamable-HTTP service dispatches). Fails when they disagree on the method, the request id,
//! the tool name and arguments, or session-creating intent:
//! - admission (`server::envelope::intent`): decides the session caps and the `initialize` bound;
//! - the forwarding hot path (`server::hot_call_view`): serves a session's `tools/call` itself;
//! - the access log and front span (`server::http::observed_call`): name the method and tool.
#![no_main]

use graph_os::server::envelope::{Intent, intent};
use graph_os::server::hot_call_view;
use graph_os::server::http::observed_call;
use libfuzzer_sys::fuzz_target;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest};

fuzz_target!(|data: &[u8]| {
    let rmcp = serde_json::from_slice::<ClientJsonRpcMessage>(data).ok();
    let request = match &rmcp {
        Some(ClientJsonRpcMessage::Request(r)) => Some(r),
        _ => None,
    };

    // Admission: the same method, and `initialize` exactly when rmcp sees one.
    let admitted = intent(data);
    match (&admitted, request) {
        (Intent::Initialize { .. }, Some(r)) => {
            assert!(matches!(r.request, ClientRequest::InitializeRequest(_)))
        }
        (Intent::Request { method }, Some(r)) => {
            assert!(!matches!(r.request, ClientRequest::InitializeRequest(_)));
            assert_eq!(method, r.request.method());
        }
        (Intent::Other, None) => assert!(rmcp.is_some(), "Other but rmcp refused the bytes"),
        (Intent::Undecodable, None) => assert!(rmcp.is_none(), "Undecodable but rmcp decoded it"),
        (a, r) => panic!("admission read {a:?}, rmcp read {:?}", r.map(|r| r.request.method())),
    }

    // The hot path serves only what rmcp would dispatch as that very call.
    if let Some((id, name, arguments)) = hot_call_view(data) {
        let r = request.expect("the hot path served bytes rmcp refuses");
        let ClientRequest::CallToolRequest(call) = &r.request else {
            panic!("the hot path served a {} as tools/call", r.request.method());
        };
        let rmcp_id = serde_json::to_value(&r.id).expect("an id serializes").to_string();
        assert_eq!(id, rmcp_id, "request id");
        assert_eq!(name, call.params.name.as_ref(), "tool name");
        let ours: Option<serde_json::Value> =
            arguments.map(|a| serde_json::from_str(&a).expect("raw arguments are JSON"));
        let theirs = call.params.arguments.clone().map(serde_json::Value::Object);
        assert_eq!(ours, theirs, "arguments");
    }

    // The access log never names a method rmcp did not see.
    if let (Some(method), Some(r)) = (observed_call(data).0, request) {
        assert_eq!(method, r.request.method(), "access-log method");
    }
});
