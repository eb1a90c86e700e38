//! `graph-os-conformance-fixture`: the MCP server the official conformance suite
//! (`@modelcontextprotocol/conformance` 0.1.16, `server` mode) expects to find behind a URL.
//!
//! It exposes exactly the names the scenarios call (14 tools, 3 resources + 1 template,
//! 4 prompts, completion, logging, subscriptions, progress, sampling and elicitation
//! round-trips), like the reference `everything-server.ts` of the conformance repository.
//! It is a 2025-era server (the suite's scenarios are 2025-11-25): `server/discover` is
//! refused, so a client that probes the 2026 era first falls back to `initialize`; its
//! sampling and elicitation are server→client requests.
//!
//! - no arguments: MCP over stdio (a child behind graph-os);
//! - `--http PORT`: streamable HTTP at `http://127.0.0.1:PORT/mcp` (PORT 0 picks a free port;
//!   the bound address is printed on stderr). Host and Origin are validated: only loopback
//!   names are accepted, a foreign `Host` or `Origin` gets 403 (DNS-rebinding protection).
#![allow(deprecated)]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use rmcp::model::*;
use rmcp::service::{ElicitationMode, RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, ServerHandler, ServiceExt};
use serde_json::{Map, Value, json};

/// A 1x1 red PNG.
const PNG_1X1: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";
/// A tiny WAV file (8 silent 8-bit mono samples at 8 kHz).
const WAV_TINY: &str = "UklGRiwAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQgAAACAgICAgICAgA==";

const STATIC_TEXT: &str = "This is the content of the static text resource.";
const WATCHED_TEXT: &str = "This is a watched resource (subscribe to test://watched-resource).";

#[derive(Parser, Debug)]
#[command(about = "MCP conformance fixture server (stdio, or streamable HTTP with --http PORT)")]
struct Args {
    /// Serve streamable HTTP at http://127.0.0.1:PORT/mcp instead of stdio (0 = any free port).
    #[arg(long, value_name = "PORT")]
    http: Option<u16>,
}

/// One MCP session's handler (the HTTP transport builds one per session).
#[derive(Clone, Default)]
struct Fixture {
    /// Minimum severity of `notifications/message` this session wants (`logging/setLevel`).
    level: Arc<Mutex<Option<LoggingLevel>>>,
    /// URIs this session subscribed to (`resources/subscribe`).
    subscriptions: Arc<Mutex<HashSet<String>>>,
}

fn obj(v: Value) -> Arc<Map<String, Value>> {
    Arc::new(v.as_object().cloned().unwrap_or_default())
}

fn no_args() -> Arc<Map<String, Value>> {
    obj(json!({"type": "object", "properties": {}}))
}

fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

fn text(s: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(s.into())])
}

fn tool_error(s: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(s.into())])
}

fn tools() -> Vec<Tool> {
    let string_arg = |name: &str, desc: &str| {
        obj(json!({
            "type": "object",
            "properties": {name: {"type": "string", "description": desc}},
            "required": [name]
        }))
    };
    vec![
        Tool::new(
            "test_simple_text",
            "Tests simple text content response",
            no_args(),
        ),
        Tool::new(
            "test_image_content",
            "Tests image content response",
            no_args(),
        ),
        Tool::new(
            "test_audio_content",
            "Tests audio content response",
            no_args(),
        ),
        Tool::new(
            "test_embedded_resource",
            "Tests embedded resource content response",
            no_args(),
        ),
        Tool::new(
            "test_multiple_content_types",
            "Tests response with multiple content types (text, image, resource)",
            no_args(),
        ),
        Tool::new(
            "test_tool_with_logging",
            "Tests tool that emits log messages during execution",
            no_args(),
        ),
        Tool::new(
            "test_tool_with_progress",
            "Tests tool that reports progress notifications",
            no_args(),
        ),
        Tool::new(
            "test_error_handling",
            "Tests error response handling",
            no_args(),
        ),
        Tool::new(
            "test_sampling",
            "Tests server-initiated sampling (LLM completion request)",
            string_arg("prompt", "The prompt to send to the LLM"),
        ),
        Tool::new(
            "test_elicitation",
            "Tests server-initiated elicitation (user input request)",
            string_arg("message", "The message to show the user"),
        ),
        Tool::new(
            "test_elicitation_sep1034_defaults",
            "Tests elicitation with default values per SEP-1034",
            no_args(),
        ),
        Tool::new(
            "test_elicitation_sep1330_enums",
            "Tests elicitation with enum schema improvements per SEP-1330",
            no_args(),
        ),
        Tool::new(
            "json_schema_2020_12_tool",
            "Tool with JSON Schema 2020-12 features",
            obj(json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "$defs": {
                    "address": {
                        "type": "object",
                        "properties": {
                            "street": {"type": "string"},
                            "city": {"type": "string"}
                        }
                    }
                },
                "properties": {
                    "name": {"type": "string"},
                    "address": {"$ref": "#/$defs/address"}
                },
                "additionalProperties": false
            })),
        ),
        Tool::new(
            "test_reconnection",
            "Tests SSE stream reconnection (SEP-1699): answers after a short delay",
            no_args(),
        ),
    ]
}

fn prompts() -> Vec<Prompt> {
    let arg = |name: &str, desc: &str| {
        PromptArgument::new(name)
            .with_description(desc)
            .with_required(true)
    };
    vec![
        Prompt::new(
            "test_simple_prompt",
            Some("A simple prompt without arguments"),
            None,
        ),
        Prompt::new(
            "test_prompt_with_arguments",
            Some("A prompt with required arguments"),
            Some(vec![
                arg("arg1", "First test argument"),
                arg("arg2", "Second test argument"),
            ]),
        ),
        Prompt::new(
            "test_prompt_with_embedded_resource",
            Some("A prompt that includes an embedded resource"),
            Some(vec![arg("resourceUri", "URI of the resource to embed")]),
        ),
        Prompt::new(
            "test_prompt_with_image",
            Some("A prompt that includes image content"),
            None,
        ),
    ]
}

/// Builds `elicitation/create` params from the wire JSON of a requested schema.
fn elicit_params(message: &str, schema: Value) -> Result<ElicitRequestParams, McpError> {
    serde_json::from_value(json!({"mode": "form", "message": message, "requestedSchema": schema}))
        .map_err(|e| McpError::internal_error(format!("bad elicitation schema: {e}"), None))
}

impl Fixture {
    async fn log(&self, ctx: &RequestContext<RoleServer>, level: LoggingLevel, msg: &str) {
        let min = self.level.lock().unwrap().unwrap_or(LoggingLevel::Debug);
        if severity(level) < severity(min) {
            return;
        }
        let _ = ctx
            .peer
            .notify_logging_message(
                LoggingMessageNotificationParam::new(level, json!(msg))
                    .with_logger("conformance-fixture"),
            )
            .await;
    }

    async fn elicit(
        &self,
        ctx: &RequestContext<RoleServer>,
        message: &str,
        schema: Value,
    ) -> Result<Result<ElicitResult, String>, McpError> {
        if !ctx
            .peer
            .supported_elicitation_modes()
            .contains(&ElicitationMode::Form)
        {
            return Ok(Err(
                "the client does not support elicitation (no elicitation capability)".into(),
            ));
        }
        let params = elicit_params(message, schema)?;
        Ok(ctx
            .peer
            .create_elicitation(params)
            .await
            .map_err(|e| format!("elicitation failed: {e}")))
    }

    async fn run_tool(
        &self,
        params: &CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let args = params.arguments.clone().unwrap_or_default();
        let arg = |k: &str| {
            args.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let result = match params.name.as_ref() {
            "test_simple_text" => text("This is a simple text response for testing."),
            "test_image_content" => {
                CallToolResult::success(vec![ContentBlock::image(PNG_1X1, "image/png")])
            }
            "test_audio_content" => {
                CallToolResult::success(vec![ContentBlock::audio(WAV_TINY, "audio/wav")])
            }
            "test_embedded_resource" => CallToolResult::success(vec![ContentBlock::resource(
                ResourceContents::text(
                    "This is an embedded resource content.",
                    "test://embedded-resource",
                )
                .with_mime_type("text/plain"),
            )]),
            "test_multiple_content_types" => CallToolResult::success(vec![
                ContentBlock::text("Multiple content types test:"),
                ContentBlock::image(PNG_1X1, "image/png"),
                ContentBlock::resource(
                    ResourceContents::text(
                        r#"{"test":"data","value":123}"#,
                        "test://mixed-content-resource",
                    )
                    .with_mime_type("application/json"),
                ),
            ]),
            "test_tool_with_logging" => {
                self.log(ctx, LoggingLevel::Info, "Tool execution started")
                    .await;
                tokio::time::sleep(Duration::from_millis(50)).await;
                self.log(ctx, LoggingLevel::Info, "Tool processing data")
                    .await;
                tokio::time::sleep(Duration::from_millis(50)).await;
                self.log(ctx, LoggingLevel::Info, "Tool execution completed")
                    .await;
                text("Tool with logging executed successfully")
            }
            "test_tool_with_progress" => {
                let token = params
                    .meta
                    .as_ref()
                    .and_then(|m| m.get_progress_token())
                    .or_else(|| ctx.meta.get_progress_token());
                for (i, progress) in [0.0, 50.0, 100.0].into_iter().enumerate() {
                    if i > 0 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    if let Some(token) = &token {
                        let _ = ctx
                            .peer
                            .notify_progress(
                                ProgressNotificationParam::new(token.clone(), progress)
                                    .with_total(100.0)
                                    .with_message(format!("Completed step {}", i + 1)),
                            )
                            .await;
                    }
                }
                text("Tool with progress executed successfully")
            }
            "test_error_handling" => {
                tool_error("This tool intentionally returns an error for testing")
            }
            "test_sampling" => {
                let supports = ctx
                    .peer
                    .peer_info()
                    .is_some_and(|i| i.capabilities.sampling.is_some());
                if !supports {
                    return Ok(tool_error(
                        "the client does not support sampling (no sampling capability)",
                    ));
                }
                let request: CreateMessageRequestParams = serde_json::from_value(json!({
                    "messages": [{"role": "user", "content": {"type": "text", "text": arg("prompt")}}],
                    "maxTokens": 100
                }))
                .map_err(|e| McpError::internal_error(e.to_string(), None))?;
                match ctx.peer.create_message(request).await {
                    Ok(answer) => {
                        let v = serde_json::to_value(&answer).unwrap_or_default();
                        let said = match &v["content"] {
                            Value::Array(items) => items
                                .iter()
                                .filter_map(|c| c["text"].as_str())
                                .collect::<Vec<_>>()
                                .join(""),
                            c => c["text"].as_str().unwrap_or_default().to_string(),
                        };
                        text(format!("LLM response: {said}"))
                    }
                    Err(e) => tool_error(format!("sampling failed: {e}")),
                }
            }
            "test_elicitation" => {
                let schema = json!({
                    "type": "object",
                    "properties": {
                        "username": {"type": "string", "description": "User's response"},
                        "email": {"type": "string", "description": "User's email address"}
                    },
                    "required": ["username", "email"]
                });
                match self.elicit(ctx, &arg("message"), schema).await? {
                    Ok(r) => text(format!(
                        "User response: action={}, content={}",
                        action_name(&r),
                        r.content.clone().unwrap_or(json!({}))
                    )),
                    Err(e) => tool_error(e),
                }
            }
            "test_elicitation_sep1034_defaults" => {
                let schema = json!({
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "description": "User name", "default": "John Doe"},
                        "age": {"type": "integer", "description": "User age", "default": 30},
                        "score": {"type": "number", "description": "User score", "default": 95.5},
                        "status": {
                            "type": "string",
                            "description": "User status",
                            "enum": ["active", "inactive", "pending"],
                            "default": "active"
                        },
                        "verified": {"type": "boolean", "description": "Verification status", "default": true}
                    },
                    "required": []
                });
                match self
                    .elicit(
                        ctx,
                        "Please review and update the form fields with defaults",
                        schema,
                    )
                    .await?
                {
                    Ok(r) => text(format!(
                        "Elicitation completed: action={}, content={}",
                        action_name(&r),
                        r.content.clone().unwrap_or(json!({}))
                    )),
                    Err(e) => tool_error(e),
                }
            }
            "test_elicitation_sep1330_enums" => {
                let schema = json!({
                    "type": "object",
                    "properties": {
                        "untitledSingle": {
                            "type": "string",
                            "description": "Choose an option",
                            "enum": ["option1", "option2", "option3"]
                        },
                        "titledSingle": {
                            "type": "string",
                            "description": "Choose a titled option",
                            "oneOf": [
                                {"const": "value1", "title": "First Option"},
                                {"const": "value2", "title": "Second Option"},
                                {"const": "value3", "title": "Third Option"}
                            ]
                        },
                        "legacyEnum": {
                            "type": "string",
                            "description": "Choose a legacy option",
                            "enum": ["opt1", "opt2", "opt3"],
                            "enumNames": ["Option One", "Option Two", "Option Three"]
                        },
                        "untitledMulti": {
                            "type": "array",
                            "description": "Choose multiple options",
                            "items": {"type": "string", "enum": ["option1", "option2", "option3"]}
                        },
                        "titledMulti": {
                            "type": "array",
                            "description": "Choose multiple titled options",
                            "items": {
                                "anyOf": [
                                    {"const": "value1", "title": "First Choice"},
                                    {"const": "value2", "title": "Second Choice"},
                                    {"const": "value3", "title": "Third Choice"}
                                ]
                            }
                        }
                    },
                    "required": []
                });
                match self
                    .elicit(ctx, "Please select options from the enum fields", schema)
                    .await?
                {
                    Ok(r) => text(format!(
                        "Elicitation completed: action={}, content={}",
                        action_name(&r),
                        r.content.clone().unwrap_or(json!({}))
                    )),
                    Err(e) => tool_error(e),
                }
            }
            "json_schema_2020_12_tool" => text(format!(
                "JSON Schema 2020-12 tool called with: {}",
                Value::Object(args.clone())
            )),
            "test_reconnection" => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                text("Reconnection test completed successfully")
            }
            other => {
                return Err(McpError::invalid_params(
                    format!("Unknown tool: {other}"),
                    None,
                ));
            }
        };
        Ok(result)
    }
}

fn action_name(r: &ElicitResult) -> String {
    serde_json::to_value(&r.action)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{:?}", r.action).to_lowercase())
}

impl ServerHandler for Fixture {
    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, McpError> {
        Err(McpError::method_not_found::<DiscoverRequestMethod>())
    }

    fn get_info(&self) -> ServerConfig {
        let caps = ServerCapabilities::builder()
            .enable_logging()
            .enable_completions()
            .enable_prompts()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_tools()
            .build();
        let mut info = ServerConfig::new(caps);
        info.server_info = Implementation::new("mcp-conformance-test-server", "1.0.0");
        info
    }

    async fn list_tools(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let result = self.run_tool(&params, &context).await?;
        Ok(CallToolResponse::Complete(result))
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        *self.level.lock().unwrap() = Some(request.level);
        Ok(())
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        let candidates: &[&str] = match (&request.r#ref, request.argument.name.as_str()) {
            (Reference::Prompt(p), "arg1") if p.name == "test_prompt_with_arguments" => {
                &["paris", "park", "party", "test1", "test2"]
            }
            (Reference::Prompt(p), "arg2") if p.name == "test_prompt_with_arguments" => {
                &["value1", "value2", "value3"]
            }
            (Reference::Resource(_), "id") => &["1", "2", "3", "123"],
            _ => &[],
        };
        let values: Vec<String> = candidates
            .iter()
            .filter(|c| c.starts_with(request.argument.value.as_str()))
            .map(|c| c.to_string())
            .collect();
        let mut info =
            CompletionInfo::new(values.clone()).map_err(|e| McpError::internal_error(e, None))?;
        info.total = Some(values.len() as u32);
        info.has_more = Some(false);
        Ok(CompleteResult::new(info))
    }

    async fn list_prompts(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        Ok(ListPromptsResult::with_all_items(prompts()))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let arg = |k: &str| {
            request
                .arguments
                .as_ref()
                .and_then(|a| a.get(k))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let messages = match request.name.as_str() {
            "test_simple_prompt" => vec![PromptMessage::new_text(
                Role::User,
                "This is a simple prompt for testing.",
            )],
            "test_prompt_with_arguments" => {
                let (Some(a1), Some(a2)) = (arg("arg1"), arg("arg2")) else {
                    return Err(McpError::invalid_params(
                        "test_prompt_with_arguments requires arg1 and arg2",
                        None,
                    ));
                };
                vec![PromptMessage::new_text(
                    Role::User,
                    format!("Prompt with arguments: arg1='{a1}', arg2='{a2}'"),
                )]
            }
            "test_prompt_with_embedded_resource" => {
                let Some(uri) = arg("resourceUri") else {
                    return Err(McpError::invalid_params(
                        "test_prompt_with_embedded_resource requires resourceUri",
                        None,
                    ));
                };
                vec![
                    PromptMessage::new(
                        Role::User,
                        ContentBlock::resource(
                            ResourceContents::text("Embedded resource content for testing.", uri)
                                .with_mime_type("text/plain"),
                        ),
                    ),
                    PromptMessage::new_text(
                        Role::User,
                        "Please process the embedded resource above.",
                    ),
                ]
            }
            "test_prompt_with_image" => vec![
                PromptMessage::new(Role::User, ContentBlock::image(PNG_1X1, "image/png")),
                PromptMessage::new_text(Role::User, "Please analyze the image above."),
            ],
            other => {
                return Err(McpError::invalid_params(
                    format!("unknown prompt {other}"),
                    None,
                ));
            }
        };
        Ok(GetPromptResponse::Complete(GetPromptResult::new(messages)))
    }

    async fn list_resources(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        Ok(ListResourcesResult::with_all_items(vec![
            Resource::new("test://static-text", "Static Text Resource")
                .with_description("A static text resource for testing")
                .with_mime_type("text/plain"),
            Resource::new("test://static-binary", "Static Binary Resource")
                .with_description("A static binary resource (image) for testing")
                .with_mime_type("image/png"),
            Resource::new("test://watched-resource", "Watched Resource")
                .with_description("A resource that can be subscribed to")
                .with_mime_type("text/plain"),
        ]))
    }

    async fn list_resource_templates(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new("test://template/{id}/data", "Resource Template")
                .with_description("A resource template with parameter substitution")
                .with_mime_type("application/json"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let uri = request.uri.as_str();
        let contents = match uri {
            "test://static-text" => {
                ResourceContents::text(STATIC_TEXT, uri).with_mime_type("text/plain")
            }
            "test://static-binary" => {
                ResourceContents::blob(PNG_1X1, uri).with_mime_type("image/png")
            }
            "test://watched-resource" => {
                ResourceContents::text(WATCHED_TEXT, uri).with_mime_type("text/plain")
            }
            _ => match uri
                .strip_prefix("test://template/")
                .and_then(|rest| rest.strip_suffix("/data"))
                .filter(|id| !id.is_empty() && !id.contains('/'))
            {
                Some(id) => ResourceContents::text(
                    json!({"id": id, "templateTest": true, "data": format!("Data for ID: {id}")})
                        .to_string(),
                    uri,
                )
                .with_mime_type("application/json"),
                None => {
                    return Err(McpError::resource_not_found(
                        format!("Resource not found: {uri}"),
                        Some(json!({"uri": uri})),
                    ));
                }
            },
        };
        Ok(ReadResourceResponse::Complete(ReadResourceResult::new(
            vec![contents],
        )))
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.subscriptions.lock().unwrap().insert(request.uri);
        Ok(())
    }

    /// 2026-07-28: resource subscriptions are `subscriptions/listen` streams.
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.resource_subscriptions = requested.resource_subscriptions.clone();
        Some(accepted)
    }

    async fn listen(&self, context: rmcp::service::SubscriptionContext) -> Result<(), McpError> {
        let uris = context
            .accepted()
            .resource_subscriptions
            .clone()
            .unwrap_or_default();
        self.subscriptions
            .lock()
            .unwrap()
            .extend(uris.iter().cloned());
        context.cancelled().await;
        let mut subs = self.subscriptions.lock().unwrap();
        for uri in &uris {
            subs.remove(uri);
        }
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.subscriptions.lock().unwrap().remove(&request.uri);
        Ok(())
    }
}

fn loopback_hosts(port: u16) -> Vec<String> {
    ["localhost", "127.0.0.1", "::1", "[::1]"]
        .iter()
        .flat_map(|h| [h.to_string(), format!("{h}:{port}")])
        .collect()
}

async fn serve_http(port: u16) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(loopback_hosts(addr.port()))
        .with_allowed_origins(["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"]);
    let service = StreamableHttpService::new(
        || Ok(Fixture::default()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let app = axum::Router::new().route_service("/mcp", service);
    eprintln!("graph-os-conformance-fixture listening on http://{addr}/mcp");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Diagnostics on stderr (stdout is the MCP channel in stdio mode); RUST_LOG overrides.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    match args.http {
        Some(port) => serve_http(port).await,
        None => {
            let running = Fixture::default().serve(rmcp::transport::stdio()).await?;
            running.waiting().await?;
            Ok(())
        }
    }
}
