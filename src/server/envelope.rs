//! What admission knows of a `/mcp` POST body without a session: decoded once, by rmcp's own
//! decoder, over exactly the bytes rmcp is handed.
//!
//! Admission decides on session-creating intent (the session caps, the `initialize` size bound,
//! the store record) and rmcp decides whether to create a session. A cheaper peek (a borrowed
//! `&str` method) once read `"initiali\u007ae"` as no method at all while rmcp decoded
//! `initialize` and created an unbounded, unrecorded session. Two decoders of the same bytes can
//! disagree (escapes, duplicate keys, non-string methods, batches); one cannot. So the intent is
//! `serde_json::from_slice::<ClientJsonRpcMessage>` — the call rmcp's streamable-HTTP service
//! makes (`expect_json`) — and nothing else. The cost is one typed decode of a session-less
//! request (an `initialize`, a `server/discover`, or a 2026-era request), never of a session's
//! call on the forwarding path.
//!
//! Behind this, by construction: rmcp can only create a session while an admitted reservation
//! is in scope ([`super::sessions::with_admission`]), so a future misreading here still cannot
//! open a session that admission did not count.

use rmcp::model::{ClientJsonRpcMessage, ClientRequest};

/// What a session-less POST body asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Intent {
    /// `initialize`: creates a session. `params` is kept in the session store so another
    /// replica can replay the handshake.
    Initialize { params: serde_json::Value },
    /// Any other request, by its method (`server/discover`, or a 2026-era request).
    Request { method: String },
    /// A notification, response or error (no session is created for it).
    Other,
    /// Not a JSON-RPC message rmcp accepts (rmcp answers it with its own refusal).
    Undecodable,
}

impl Intent {
    /// The request's method, if it is a request.
    pub fn method(&self) -> Option<&str> {
        match self {
            Intent::Initialize { .. } => Some("initialize"),
            Intent::Request { method } => Some(method),
            Intent::Other | Intent::Undecodable => None,
        }
    }
}

/// The intent of `bytes`, decoded as rmcp decodes them.
pub fn intent(bytes: &[u8]) -> Intent {
    match serde_json::from_slice::<ClientJsonRpcMessage>(bytes) {
        Ok(ClientJsonRpcMessage::Request(req)) => match &req.request {
            ClientRequest::InitializeRequest(init) => Intent::Initialize {
                params: serde_json::to_value(&init.params).unwrap_or(serde_json::Value::Null),
            },
            other => Intent::Request {
                method: other.method().to_string(),
            },
        },
        Ok(_) => Intent::Other,
        Err(_) => Intent::Undecodable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init(method: &str) -> Vec<u8> {
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"c","version":"1"}}}}}}"#
        )
        .into_bytes()
    }

    #[test]
    fn an_escaped_method_is_the_method_it_spells() {
        assert!(matches!(
            intent(&init(r"initiali\u007ae")),
            Intent::Initialize { .. }
        ));
        assert!(matches!(
            intent(&init("initialize")),
            Intent::Initialize { .. }
        ));
    }

    #[test]
    fn a_duplicated_method_key_is_what_rmcp_makes_of_it() {
        let body = br#"{"jsonrpc":"2.0","id":1,"method":"ping","method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#;
        let rmcp = serde_json::from_slice::<ClientJsonRpcMessage>(body).ok();
        let ours = intent(body);
        match rmcp {
            Some(ClientJsonRpcMessage::Request(r)) => {
                assert_eq!(ours.method(), Some(r.request.method()))
            }
            Some(_) => assert_eq!(ours, Intent::Other),
            None => assert_eq!(ours, Intent::Undecodable),
        }
    }

    #[test]
    fn non_requests_and_garbage_create_nothing() {
        assert_eq!(
            intent(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Intent::Other
        );
        assert_eq!(
            intent(br#"{"jsonrpc":"2.0","id":1,"method":7}"#),
            Intent::Undecodable
        );
        assert_eq!(intent(b"[]"), Intent::Undecodable);
        assert_eq!(intent(b"not json"), Intent::Undecodable);
    }
}
