//! The meta tools graph-os serves itself: their descriptors and the table from tool name to
//! multiplexer method (argument parsing is protocol glue; every decision is the multiplexer's).

use std::sync::Arc;

use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, Tool};
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::wire;
use crate::mux::{
    CallContext, Caller, Dispatched, FindToolsArgs, FleetGraphArgs, ListCatalogArgs, LoadArgs,
    Multiplexer, MuxError,
};

/// Names of the meta tools; child tools can never shadow them.
pub use crate::mux::META_TOOLS;

fn schema<T: JsonSchema + 'static>() -> Arc<serde_json::Map<String, serde_json::Value>> {
    rmcp::handler::server::common::schema_for_type::<T>()
}

#[derive(JsonSchema, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

/// The meta tools' descriptors, in [`META_TOOLS`] order.
pub fn meta_tools() -> Vec<Tool> {
    let ro = || Some(rmcp::model::ToolAnnotations::new().read_only(true));
    let mut find = Tool::new(
        "find_tools",
        "Search every server in the fleet for tools and skills matching a task description. Returns one \
         ranked list: tools with their full input schemas (call load_tools with a name to add it to your \
         tool list) and skills (kind \"skill\": read its uri with resources/read for the instructions).",
        schema::<FindToolsArgs>(),
    );
    find.annotations = ro();
    let mut list = Tool::new(
        "list_catalog",
        "List the servers in the fleet with their state, prefix and tools; pass server to drill into one.",
        schema::<ListCatalogArgs>(),
    );
    list.annotations = ro();
    let load = Tool::new(
        "load_tools",
        "Add tools (exposed names from find_tools) or every tool of whole servers to your tool list.",
        schema::<LoadArgs>(),
    );
    let unload = Tool::new(
        "unload_tools",
        "Remove tools or servers from your tool list.",
        schema::<LoadArgs>(),
    );
    let mut status = Tool::new(
        "multiplexer_status",
        "Health of every child server: state, breaker, in-flight and queued calls, restarts, last error code.",
        schema::<NoArgs>(),
    );
    status.annotations = ro();
    let refresh = Tool::new(
        "catalog_refresh",
        "Admin: re-probe every child under one deadline and publish a new catalog generation if the content \
         changed. Requires the served config revision, generation and digest (from list_catalog).",
        schema::<crate::mux::RefreshRequest>(),
    );
    let dispatch = Tool::new(
        "catalog_dispatch",
        "Call any tool of the catalog without loading it, bound to the exact generation and digest you resolved \
         its name against (from list_catalog).",
        schema::<crate::mux::DispatchRequest>(),
    );
    let mut graph = Tool::new(
        "fleet_graph",
        "Ask the fleet knowledge graph: which servers provide X, or what changed between two generations.",
        schema::<FleetGraphArgs>(),
    );
    graph.annotations = ro();
    vec![find, list, load, unload, status, refresh, dispatch, graph]
}

fn parse_args<T: DeserializeOwned>(params: &CallToolRequestParams) -> Result<T, MuxError> {
    let value = serde_json::Value::Object(params.arguments.clone().unwrap_or_default());
    serde_json::from_value(value)
        .map_err(|e| MuxError::refused(crate::mux::Refusal::InvalidArguments, e.to_string()))
}

/// A structured tool result: pretty JSON text plus `structuredContent`.
pub fn structured<T: Serialize>(value: &T) -> CallToolResult {
    let value = serde_json::to_value(value).unwrap_or_default();
    let text = serde_json::to_string_pretty(&value).unwrap_or_default();
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(value);
    result
}

fn outcome<T: Serialize>(r: Result<T, MuxError>) -> CallToolResult {
    match r {
        Ok(v) => structured(&v),
        Err(e) => wire::meta_refusal(&e),
    }
}

/// A contract refusal as a tool result: `isError` with the payload as structured content.
fn contract_result(e: &crate::mux::ContractError) -> CallToolResult {
    let mut r = structured(e);
    r.is_error = Some(true);
    r
}

/// Whether `name` is a meta tool (served here, never forwarded).
pub fn is_meta_tool(name: &str) -> bool {
    META_TOOLS.contains(&name)
}

/// Runs meta tool `params.name` for `caller`; `None` when the name is not a meta tool.
pub async fn call(
    mux: &Multiplexer,
    caller: &Caller,
    params: &CallToolRequestParams,
    cx: CallContext,
) -> Option<CallToolResult> {
    let raw = || serde_json::Value::Object(params.arguments.clone().unwrap_or_default());
    Some(match params.name.as_ref() {
        "find_tools" => match parse_args::<FindToolsArgs>(params) {
            Ok(a) => outcome(mux.find_tools(caller, a).await),
            Err(e) => outcome::<()>(Err(e)),
        },
        "list_catalog" => match parse_args::<ListCatalogArgs>(params) {
            Ok(a) => outcome(mux.list_catalog(caller, a).await),
            Err(e) => outcome::<()>(Err(e)),
        },
        "load_tools" => match parse_args::<LoadArgs>(params) {
            Ok(a) => outcome(mux.load_tools(caller, a).await),
            Err(e) => outcome::<()>(Err(e)),
        },
        "unload_tools" => match parse_args::<LoadArgs>(params) {
            Ok(a) => outcome(mux.unload_tools(caller, a).await),
            Err(e) => outcome::<()>(Err(e)),
        },
        "multiplexer_status" => match parse_args::<NoArgs>(params) {
            Ok(_) => outcome(mux.status(caller)),
            Err(e) => outcome::<()>(Err(e)),
        },
        "fleet_graph" => match parse_args::<FleetGraphArgs>(params) {
            Ok(a) => outcome(mux.fleet_graph(caller, a).await),
            Err(e) => outcome::<()>(Err(e)),
        },
        "catalog_refresh" => match mux.refresh(caller, raw()).await {
            Ok(r) => structured(&r),
            Err(e) => contract_result(&e),
        },
        "catalog_dispatch" => match mux.dispatch(caller, raw(), cx).await {
            Ok(Dispatched::Result(r)) => super::era::call_result(r),
            Ok(Dispatched::Failed(e)) => wire::meta_refusal(&e),
            Err(e) => contract_result(&e),
        },
        _ => return None,
    })
}
