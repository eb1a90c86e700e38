//! `graph-os-testchild`: a small MCP server over stdio used by graph-os tests and benchmarks.
//!
//! Tools: `add`, `echo`, `env_names`, `env_get`, `slow`, `hang`, `fail`, `progress`, `garbage`,
//! plus generated ones for catalog-bound tests. Fault modes are command-line switches.
#![allow(deprecated)]

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use rmcp::model::*;
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler, ServiceExt};
use serde_json::{Map, Value, json};

#[derive(Parser, Debug, Clone)]
#[command(about = "graph-os test child MCP server (stdio) with fault modes")]
struct Args {
    /// serverInfo name.
    #[arg(long, default_value = "graph-os-testchild")]
    name: String,
    /// Add N generated tools (`gen_0000`...).
    #[arg(long, default_value_t = 0)]
    tools: usize,
    /// Pad every generated tool's description with this many bytes.
    #[arg(long, default_value_t = 0)]
    pad_bytes: usize,
    /// Add a tool whose input schema nests this deep.
    #[arg(long)]
    deep: Option<usize>,
    /// Add a tool with a 100-character name.
    #[arg(long)]
    long_name: bool,
    /// Never answer `initialize`.
    #[arg(long)]
    hang_init: bool,
    /// Exit with status 3 before reading anything.
    #[arg(long)]
    exit_at_boot: bool,
    /// Exit (mid-call, without answering) on the Nth tool call.
    #[arg(long)]
    exit_after: Option<u64>,
    /// Print a non-JSON line on stdout before serving.
    #[arg(long)]
    garbage_at_boot: bool,
    /// Counter file: incremented at every start; `add`'s schema carries the count (schema changes on restart).
    #[arg(long)]
    schema_file: Option<PathBuf>,
    /// Extra tool name prefix for generated tools (collision tests).
    #[arg(long, default_value = "gen")]
    gen_prefix: String,
    /// Sleep this long before answering tools/list.
    #[arg(long, default_value_t = 0)]
    slow_list_ms: u64,
    /// The first call to this tool answers "Unknown tool" (a restart race as clients see it).
    #[arg(long)]
    unknown_once: Option<String>,
    /// Every tools/list advertises a different `echo` description (a catalog that keeps changing).
    #[arg(long)]
    vary_each_list: bool,
    /// Every tools/list advertises a different input schema for `add`.
    #[arg(long)]
    vary_add_schema: bool,
    /// prompts/list answers with an internal error (a family that cannot be listed).
    #[arg(long)]
    fail_prompts: bool,
}

#[derive(Clone)]
struct Child {
    args: Arc<Args>,
    calls: Arc<AtomicU64>,
    lists: Arc<AtomicU64>,
    unknown_served: Arc<std::sync::atomic::AtomicBool>,
    cancelled: Arc<AtomicU64>,
    schema_version: u64,
}

fn obj(v: Value) -> Arc<Map<String, Value>> {
    Arc::new(v.as_object().cloned().unwrap_or_default())
}

fn deep_schema(depth: usize) -> Value {
    let mut v = json!({"type": "string"});
    for _ in 0..depth {
        v = json!({"type": "object", "properties": {"x": v}});
    }
    v
}

impl Child {
    fn tools(&self) -> Vec<Tool> {
        let num = |d: &str| json!({"type": "number", "description": d});
        let mut add_desc = "Add two numbers and return their sum".to_string();
        if self.args.schema_file.is_some() {
            add_desc.push_str(&format!(" (schema version {})", self.schema_version));
        }
        let mut add_schema = json!({"type": "object", "properties": {"a": num("first addend"), "b": num("second addend")}, "required": ["a", "b"]});
        if self.args.schema_file.is_some() {
            add_schema["properties"][format!("v{}", self.schema_version)] =
                json!({"type": "string"});
        }
        let ro = || Some(ToolAnnotations::new().read_only(true));
        let mut tools = vec![
            Tool::new("add", add_desc, obj(add_schema)),
            Tool::new(
                "echo",
                "Echo the given text back",
                obj(
                    json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
                ),
            ),
            Tool::new(
                "env_names",
                "List the names of the environment variables this process sees",
                obj(json!({"type": "object"})),
            ),
            Tool::new(
                "env_get",
                "Return one environment variable of this process",
                obj(
                    json!({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}),
                ),
            ),
            Tool::new(
                "slow",
                "Sleep for ms milliseconds, then answer",
                obj(json!({"type": "object", "properties": {"ms": {"type": "integer"}}})),
            ),
            Tool::new("hang", "Never answer", obj(json!({"type": "object"}))),
            Tool::new(
                "fail",
                "Always return a tool error",
                obj(json!({"type": "object"})),
            ),
            Tool::new(
                "progress",
                "Send progress notifications and a log message, then answer",
                obj(json!({"type": "object", "properties": {"steps": {"type": "integer"}}})),
            ),
            Tool::new(
                "garbage",
                "Write a non-JSON line to stdout and never answer",
                obj(json!({"type": "object"})),
            ),
            Tool::new(
                "cancellations",
                "How many notifications/cancelled this child has received",
                obj(json!({"type": "object"})),
            ),
        ];
        tools[0].annotations = ro();
        tools[1].annotations = ro();
        for i in 0..self.args.tools {
            let desc = format!(
                "Generated tool number {i}{}",
                "x".repeat(self.args.pad_bytes)
            );
            tools.push(Tool::new(
                format!("{}_{i:04}", self.args.gen_prefix),
                desc,
                obj(json!({"type": "object"})),
            ));
        }
        if let Some(depth) = self.args.deep {
            tools.push(Tool::new(
                "deep",
                "A tool with a deeply nested schema",
                obj(json!({"type": "object", "properties": {"root": deep_schema(depth)}})),
            ));
        }
        if self.args.long_name {
            let name = format!("long_{}", "n".repeat(95));
            tools.push(Tool::new(
                name,
                "A tool with a 100-character name; answers 'long ok'",
                obj(json!({"type": "object"})),
            ));
        }
        tools
    }
}

fn text(s: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(s.into())])
}

impl ServerHandler for Child {
    fn get_info(&self) -> ServerConfig {
        let caps = ServerCapabilities::builder()
            .enable_tools()
            .enable_prompts()
            .enable_resources()
            .enable_logging()
            .build();
        let mut info = ServerConfig::new(caps);
        info.server_info = Implementation::new(self.args.name.clone(), env!("CARGO_PKG_VERSION"));
        info
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        if self.args.hang_init {
            std::future::pending::<()>().await;
        }
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        if self.args.slow_list_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.args.slow_list_ms)).await;
        }
        let mut tools = self.tools();
        let n = self.lists.fetch_add(1, Ordering::SeqCst);
        if self.args.vary_each_list {
            tools[1].description = Some(format!("Echo the given text back (listing {n})").into());
        }
        if self.args.vary_add_schema {
            let mut schema = (*tools[0].input_schema).clone();
            schema.insert("title".into(), json!(format!("add, listing {n}")));
            tools[0].input_schema = Arc::new(schema);
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.args.exit_after.is_some_and(|limit| n >= limit) {
            std::process::exit(4);
        }
        if self.args.unknown_once.as_deref() == Some(params.name.as_ref())
            && !self.unknown_served.swap(true, Ordering::SeqCst)
        {
            return Ok(CallToolResponse::Complete(CallToolResult::error(vec![
                ContentBlock::text(format!("Unknown tool: {}", params.name)),
            ])));
        }
        let args = params.arguments.clone().unwrap_or_default();
        let num = |k: &str| args.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        let result = match params.name.as_ref() {
            "add" => {
                let sum = num("a") + num("b");
                let shown = if sum.fract() == 0.0 {
                    format!("{}", sum as i64)
                } else {
                    sum.to_string()
                };
                text(shown)
            }
            "echo" => text(args.get("text").and_then(Value::as_str).unwrap_or_default()),
            "env_names" => {
                let mut names: Vec<String> = std::env::vars().map(|(k, _)| k).collect();
                names.sort();
                let mut r = text(names.join("\n"));
                r.structured_content = Some(json!({"names": names}));
                r
            }
            "env_get" => {
                let name = args.get("name").and_then(Value::as_str).unwrap_or_default();
                text(std::env::var(name).unwrap_or_else(|_| "<unset>".into()))
            }
            "slow" => {
                let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(100);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                text(format!("slept {ms} ms"))
            }
            "hang" => {
                std::future::pending::<()>().await;
                unreachable!()
            }
            "fail" => CallToolResult::error(vec![ContentBlock::text("this tool always fails")]),
            "progress" => {
                let steps = args.get("steps").and_then(Value::as_u64).unwrap_or(3);
                let token = params
                    .meta
                    .as_ref()
                    .and_then(|m| m.get_progress_token())
                    .or_else(|| context.meta.get_progress_token());
                let _ = context
                    .peer
                    .notify_logging_message(LoggingMessageNotificationParam::new(
                        LoggingLevel::Info,
                        json!("progress tool started"),
                    ))
                    .await;
                if let Some(token) = token {
                    for i in 1..=steps {
                        let _ = context
                            .peer
                            .notify_progress(
                                ProgressNotificationParam::new(token.clone(), i as f64)
                                    .with_total(steps as f64),
                            )
                            .await;
                    }
                }
                text(format!("{steps} steps done"))
            }
            "garbage" => {
                {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(b"this is not json {{{\n");
                    let _ = out.flush();
                }
                std::future::pending::<()>().await;
                unreachable!()
            }
            "cancellations" => text(self.cancelled.load(Ordering::SeqCst).to_string()),
            "deep" => text("deep ok"),
            name if name.starts_with("long_") => text("long ok"),
            name if name.starts_with(&format!("{}_", self.args.gen_prefix)) => {
                text(format!("{name} ok"))
            }
            other => {
                return Err(McpError::invalid_params(
                    format!("Unknown tool: {other}"),
                    None,
                ));
            }
        };
        Ok(CallToolResponse::Complete(result))
    }

    async fn on_cancelled(
        &self,
        _n: CancelledNotificationParam,
        _c: rmcp::service::NotificationContext<RoleServer>,
    ) {
        self.cancelled.fetch_add(1, Ordering::SeqCst);
    }

    async fn list_prompts(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        if self.args.fail_prompts {
            return Err(McpError::internal_error("prompts are broken", None));
        }
        let prompt = Prompt::new(
            "greet",
            Some("Greet someone by name"),
            Some(vec![PromptArgument::new("name").with_required(true)]),
        );
        Ok(ListPromptsResult::with_all_items(vec![prompt]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        if request.name != "greet" {
            return Err(McpError::invalid_params(
                format!("unknown prompt {}", request.name),
                None,
            ));
        }
        let who = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("world")
            .to_string();
        Ok(GetPromptResponse::Complete(GetPromptResult::new(vec![
            PromptMessage::new_text(Role::User, format!("Hello, {who}!")),
        ])))
    }

    async fn list_resources(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        Ok(ListResourcesResult::with_all_items(vec![Resource::new(
            "test://hello",
            "hello",
        )]))
    }

    async fn list_resource_templates(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new("test://items/{id}", "item"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let body = match request.uri.as_str() {
            "test://hello" => "hello from the test child".to_string(),
            uri if uri.starts_with("test://items/") => {
                format!("item {}", &uri["test://items/".len()..])
            }
            uri => {
                return Err(McpError::resource_not_found(
                    format!("no resource {uri}"),
                    None,
                ));
            }
        };
        Ok(ReadResourceResponse::Complete(ReadResourceResult::new(
            vec![ResourceContents::text(body, request.uri)],
        )))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.exit_at_boot {
        std::process::exit(3);
    }
    if args.garbage_at_boot {
        println!("garbage before the handshake");
    }
    let schema_version = match &args.schema_file {
        Some(path) => {
            let n = std::fs::read_to_string(path)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(0)
                + 1;
            std::fs::write(path, n.to_string())?;
            n
        }
        None => 0,
    };
    let child = Child {
        args: Arc::new(args),
        calls: Arc::new(AtomicU64::new(0)),
        cancelled: Arc::new(AtomicU64::new(0)),
        lists: Arc::new(AtomicU64::new(0)),
        unknown_served: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        schema_version,
    };
    let running = child.serve(rmcp::transport::stdio()).await?;
    running.waiting().await?;
    Ok(())
}
