//! Protocol-era bridging for results relayed from a child to the front client.
//!
//! A 2025-era child omits `resultType`; the spec says an absent field means `"complete"`, but a
//! 2026-07-28 client requires it on the wire. Relayed results are therefore normalized to carry
//! it explicitly; rmcp strips it again for fronts that negotiated an older version, so each side
//! sees its own era.

use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolResult, CompleteResult, GetPromptResponse, GetPromptResult, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, ReadResourceResponse,
    ReadResourceResult, ResultType, ServerResult,
};
use rmcp::service::{RequestContext, RoleServer};

/// Whether the request was made in the 2026-07-28 era (no `initialize`).
pub fn is_modern(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.protocol_version().is_some_and(|v| !v.has_initialize())
}

/// A result that carries the 2026-07-28 `resultType` discriminator.
///
/// The one rule for every result graph-os answers a front with (relayed from a child or its
/// own): it goes out through [`complete`], which fills an absent `resultType` with
/// `"complete"`. rmcp strips it again for fronts of an older era, so each side sees its own.
pub trait Discriminated {
    /// The result's `resultType` field.
    fn result_type(&mut self) -> &mut Option<ResultType>;
}

macro_rules! discriminated {
    ($($t:ty),* $(,)?) => {$(
        impl Discriminated for $t {
            fn result_type(&mut self) -> &mut Option<ResultType> {
                &mut self.result_type
            }
        }
    )*};
}

// Every result type the handler answers with that carries the field (rmcp's
// `ServerResult::strip_result_type_for_legacy_peer` lists the same ones).
discriminated!(
    CallToolResult,
    GetPromptResult,
    ReadResourceResult,
    CompleteResult,
    ListToolsResult,
    ListPromptsResult,
    ListResourcesResult,
    ListResourceTemplatesResult,
);

/// Normalizes a result for the front: an absent `resultType` (a 2025-era child's answer)
/// becomes `"complete"`; a present one (`input_required`, `task`) is kept.
pub fn complete<T: Discriminated>(mut r: T) -> T {
    r.result_type().get_or_insert(ResultType::COMPLETE);
    r
}

/// [`complete`] over any [`ServerResult`]: results without the field (empty results of ping,
/// logging/setLevel, subscribe) pass unchanged; rmcp serializes those without one in every era.
pub fn complete_any(r: ServerResult) -> ServerResult {
    match r {
        ServerResult::CallToolResult(r) => ServerResult::CallToolResult(complete(r)),
        ServerResult::GetPromptResult(r) => ServerResult::GetPromptResult(complete(r)),
        ServerResult::ReadResourceResult(r) => ServerResult::ReadResourceResult(complete(r)),
        ServerResult::CompleteResult(r) => ServerResult::CompleteResult(complete(r)),
        ServerResult::ListToolsResult(r) => ServerResult::ListToolsResult(complete(r)),
        ServerResult::ListPromptsResult(r) => ServerResult::ListPromptsResult(complete(r)),
        ServerResult::ListResourcesResult(r) => ServerResult::ListResourcesResult(complete(r)),
        ServerResult::ListResourceTemplatesResult(r) => {
            ServerResult::ListResourceTemplatesResult(complete(r))
        }
        other => other,
    }
}

/// Normalizes a relayed tool result.
pub fn call_result(r: CallToolResult) -> CallToolResult {
    complete(r)
}

/// Normalizes a relayed prompt result.
pub fn prompt_result(r: GetPromptResult) -> GetPromptResult {
    complete(r)
}

/// Normalizes a relayed resource read.
pub fn resource_result(r: ReadResourceResult) -> ReadResourceResult {
    complete(r)
}

/// A 2026-07-28 child's `input_required` answer to prompts/get or resources/read: a 2026 client
/// gets it (and retries through graph-os); a 2025 client cannot, and graph-os relays client
/// input for tools/call only.
fn input_unsupported(method: &str) -> McpError {
    McpError::new(
        rmcp::model::ErrorCode(crate::mux::RELAY_REFUSED),
        format!(
            "the child asked for client input on {method}; a 2025-era client can answer that only for tools/call"
        ),
        Some(serde_json::json!({"code": "input-required-unsupported"})),
    )
}

/// Normalizes a relayed prompts/get answer for the front's era.
pub fn prompt_response(r: GetPromptResponse, modern: bool) -> Result<GetPromptResponse, McpError> {
    match r {
        GetPromptResponse::Complete(r) => Ok(GetPromptResponse::Complete(prompt_result(r))),
        GetPromptResponse::InputRequired(_) if !modern => Err(input_unsupported("prompts/get")),
        other => Ok(other),
    }
}

/// Normalizes a relayed resources/read answer for the front's era.
pub fn resource_response(
    r: ReadResourceResponse,
    modern: bool,
) -> Result<ReadResourceResponse, McpError> {
    match r {
        ReadResourceResponse::Complete(r) => Ok(ReadResourceResponse::Complete(resource_result(r))),
        ReadResourceResponse::InputRequired(_) if !modern => {
            Err(input_unsupported("resources/read"))
        }
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every result a 2025-era child can answer that reaches a 2026-07-28 client, as the child
    /// sends it (no `resultType`): after [`complete_any`] each carries `"complete"` where the
    /// type has the field, and the empty results (ping, logging/setLevel, subscribe) stay empty.
    #[test]
    fn every_2025_result_reaches_a_2026_front_discriminated() {
        fn v<T: serde::de::DeserializeOwned>(wire: serde_json::Value) -> T {
            serde_json::from_value(wire).unwrap()
        }
        let text = json!([{"type": "text", "text": "5"}]);
        let with_field = [
            (
                "tools/call",
                ServerResult::CallToolResult(v(json!({"content": text}))),
            ),
            (
                "prompts/get",
                ServerResult::GetPromptResult(v(
                    json!({"messages": [{"role": "user", "content": text[0]}]}),
                )),
            ),
            (
                "resources/read",
                ServerResult::ReadResourceResult(v(
                    json!({"contents": [{"uri": "test://x", "text": "x"}]}),
                )),
            ),
            (
                "completion/complete",
                ServerResult::CompleteResult(v(
                    json!({"completion": {"values": ["alice"], "hasMore": false}}),
                )),
            ),
            (
                "tools/list",
                ServerResult::ListToolsResult(v(json!({"tools": []}))),
            ),
            (
                "prompts/list",
                ServerResult::ListPromptsResult(v(json!({"prompts": []}))),
            ),
            (
                "resources/list",
                ServerResult::ListResourcesResult(v(json!({"resources": []}))),
            ),
            (
                "resources/templates/list",
                ServerResult::ListResourceTemplatesResult(v(
                    json!({"resourceTemplates": [{"uriTemplate": "test://items/{id}", "name": "item"}]}),
                )),
            ),
        ];
        for (method, parsed) in with_field {
            let before = serde_json::to_value(&parsed).unwrap();
            assert!(before.get("resultType").is_none(), "{method}: {before}");
            let out = serde_json::to_value(complete_any(parsed)).unwrap();
            assert_eq!(out["resultType"], "complete", "{method}: {out}");
        }
        for (method, wire) in [("ping", json!({})), ("logging/setLevel", json!({}))] {
            let parsed: ServerResult = serde_json::from_value(wire).unwrap();
            let out = serde_json::to_value(complete_any(parsed)).unwrap();
            assert!(out.get("resultType").is_none(), "{method}: {out}");
        }
        // A discriminator that means something is kept.
        let mut task: CallToolResult = serde_json::from_value(json!({"content": []})).unwrap();
        task.result_type = Some(ResultType::INPUT_REQUIRED);
        assert_eq!(complete(task).result_type, Some(ResultType::INPUT_REQUIRED));
    }
}
