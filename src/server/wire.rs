//! The one wire mapping of graph-os errors: multiplexer errors ([`MuxError`]), child call
//! errors ([`CallError`]) and contract refusals ([`ContractError`]) to JSON-RPC errors,
//! tool-error results and HTTP statuses. Every refusal carries its stable code (in JSON-RPC
//! `data.code`, in the tool result's text and `_meta`, in the REST body).

use axum::http::StatusCode;
use rmcp::ErrorData as McpError;
use rmcp::model::{CallToolResult, ContentBlock, ErrorCode};

use crate::mux::CallError;
use crate::mux::Refusal;
use crate::mux::{ContractError, MuxError};

/// Key under `_meta` carrying graph-os error details on tool-error results.
pub const ERROR_META_KEY: &str = "io.graph-os/error";

/// JSON-RPC error code of an authorization refusal (implementation-defined server range).
pub const AUTHORIZATION_DENIED: i32 = -32003;

/// A tool-error result carrying a stable code in text and `_meta`.
pub fn error_result(code: &str, message: &str, server: Option<&str>) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(format!("{code}: {message}"))]);
    let mut meta = rmcp::model::MetaObject::new();
    meta.insert(
        ERROR_META_KEY.into(),
        serde_json::json!({"code": code, "message": message, "server": server}),
    );
    result.meta = Some(meta);
    result
}

/// A refused or failed `tools/call`: unknown tools and the child's own JSON-RPC errors are
/// JSON-RPC errors (the latter unchanged); everything else is a tool-error result with the code.
pub fn call_refusal(e: &MuxError) -> Result<CallToolResult, McpError> {
    if let Some(err) = child_rpc(e) {
        return Err(err.clone());
    }
    match e {
        MuxError::UnknownTool(_) => Err(rpc_error(e.clone())),
        other => Ok(error_result(other.code(), &other.message(), other.server())),
    }
}

/// The child's own JSON-RPC error, if that is what `e` is.
fn child_rpc(e: &MuxError) -> Option<&McpError> {
    match e {
        MuxError::Child { error, .. } => match &**error {
            CallError::Rpc(err) => Some(err),
            _ => None,
        },
        _ => None,
    }
}

/// A meta-tool refusal as a tool-error result.
pub fn meta_refusal(e: &MuxError) -> CallToolResult {
    error_result(e.code(), &e.message(), e.server())
}

/// A refused or failed non-tool request as a JSON-RPC error (a child's own error unchanged).
pub fn rpc_error(e: MuxError) -> McpError {
    if let Some(err) = child_rpc(&e) {
        return err.clone();
    }
    let data = |e: &MuxError| {
        Some(serde_json::json!({
            "code": e.code(),
            "server": e.server(),
        }))
    };
    match &e {
        MuxError::Denied { .. } => {
            McpError::new(ErrorCode(AUTHORIZATION_DENIED), e.to_string(), data(&e))
        }
        // SEP-2164: the unknown URI in `data.uri`.
        MuxError::UnknownResource(uri) => McpError::resource_not_found(
            e.to_string(),
            Some(serde_json::json!({"code": e.code(), "server": e.server(), "uri": uri})),
        ),
        MuxError::UnknownTool(_)
        | MuxError::UnknownPrompt(_)
        | MuxError::InvalidParams(_)
        | MuxError::OutOfBounds { .. }
        | MuxError::NotLoaded { .. }
        | MuxError::Refused { .. }
        | MuxError::RetryRefused { .. }
        | MuxError::StageRefused { .. } => McpError::invalid_params(e.message(), data(&e)),
        MuxError::ServerLeft(_) | MuxError::Child { .. } => {
            McpError::internal_error(e.to_string(), data(&e))
        }
    }
}

/// A refused task request: a tool or child without task support is "method not found" (as
/// SEP-1686 asks of `taskSupport: forbidden`), an unknown id "invalid params"; the rest as
/// [`rpc_error`]. The stable code is in `data.code`.
pub fn task_error(e: MuxError) -> McpError {
    let unsupported = match &e {
        MuxError::Refused { why, .. } => *why == Refusal::TaskUnsupported,
        MuxError::Child { error, .. } => matches!(**error, CallError::TaskUnsupported { .. }),
        _ => false,
    };
    if unsupported {
        return McpError::new(
            ErrorCode::METHOD_NOT_FOUND,
            e.message(),
            Some(serde_json::json!({"code": "task-unsupported", "server": e.server()})),
        );
    }
    if let MuxError::Child { error, .. } = &e
        && matches!(**error, CallError::TaskEpochChanged { .. })
    {
        return McpError::invalid_params(
            e.to_string(),
            Some(serde_json::json!({"code": "task-epoch-changed", "server": e.server()})),
        );
    }
    rpc_error(e)
}

/// HTTP status of a multiplexer refusal on the REST API.
pub fn http_status(e: &MuxError) -> StatusCode {
    match e {
        MuxError::Denied { .. } => StatusCode::FORBIDDEN,
        MuxError::Refused {
            why: Refusal::ServerNotInFleet,
            ..
        }
        | MuxError::UnknownTool(_)
        | MuxError::UnknownPrompt(_)
        | MuxError::UnknownResource(_) => StatusCode::NOT_FOUND,
        MuxError::Refused {
            why:
                Refusal::DriftDigestMismatch | Refusal::DriftGuardOff | Refusal::DriftApprovalPinned,
            ..
        } => StatusCode::CONFLICT,
        MuxError::Refused {
            why: Refusal::DriftApprovalUnrecorded,
            ..
        } => StatusCode::INTERNAL_SERVER_ERROR,
        MuxError::OutOfBounds { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        MuxError::Child { .. } | MuxError::ServerLeft(_) => StatusCode::BAD_GATEWAY,
        _ => StatusCode::BAD_REQUEST,
    }
}

/// HTTP status of a contract refusal on the REST API.
pub fn contract_status(e: &ContractError) -> StatusCode {
    match e.code {
        crate::catalog::reconciler::ContractCode::AuthorizationDenied => StatusCode::FORBIDDEN,
        _ => StatusCode::CONFLICT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Scope;

    #[test]
    fn an_unknown_resource_names_its_uri() {
        let e = rpc_error(MuxError::UnknownResource("test://nowhere".into()));
        assert_eq!(e.code, ErrorCode::RESOURCE_NOT_FOUND);
        let data = e.data.unwrap();
        assert_eq!(data["uri"], "test://nowhere");
        assert_eq!(data["code"], "resource-not-found");
    }

    #[test]
    fn every_refusal_keeps_its_stable_code_on_the_wire() {
        let denied = MuxError::Denied {
            operation: "tools/call",
            need: Scope::Delegate,
        };
        let rpc = rpc_error(denied.clone());
        assert_eq!(rpc.code.0, AUTHORIZATION_DENIED);
        assert_eq!(rpc.data.unwrap()["code"], "authorization-denied");
        let result = call_refusal(&denied).unwrap();
        assert_eq!(result.is_error, Some(true));
        assert_eq!(
            result.meta.unwrap()[ERROR_META_KEY]["code"],
            "authorization-denied"
        );
        assert_eq!(http_status(&denied), StatusCode::FORBIDDEN);
        // Unknown tools stay JSON-RPC invalid params; a child's own error passes unchanged.
        let unknown = call_refusal(&MuxError::UnknownTool("x".into())).unwrap_err();
        assert_eq!(unknown.code, ErrorCode::INVALID_PARAMS);
        let child = McpError::new(ErrorCode(-32099), "child says no", None);
        let passed =
            call_refusal(&MuxError::child("s", CallError::Rpc(child.clone()))).unwrap_err();
        assert_eq!(passed, child);
        let oob = call_refusal(&MuxError::bounds("too big")).unwrap();
        assert!(
            oob.content[0]
                .as_text()
                .unwrap()
                .text
                .starts_with("request-out-of-bounds:")
        );
    }
}
