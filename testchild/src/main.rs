//! `graph-os-testchild`: a small MCP server (stdio, or streamable HTTP with `--http PORT`) used by
//! graph-os tests and benchmarks.
//!
//! Tools: `add`, `echo`, `env_names`, `env_get`, `slow`, `hang`, `fail`, `progress`, `garbage`,
//! `cancellations`, `elicit`, `sample`, `roots`, `log`, `flood`, `whoami`, plus generated ones for
//! catalog-bound tests. Fault modes are command-line switches; `--request-log PATH` records every
//! request and notification the child receives (one line each: `<method>` or `tools/call <tool>`).
//! `--skills` serves Skills-over-MCP resources (`skill://…/SKILL.md`), `--no-resources` drops the
//! resources capability, `--init-delay-ms` answers `initialize` late, `--extra-tool` adds tools.
//! `--era legacy|modern|both` picks the protocol eras served (default legacy: `server/discover`
//! is refused; modern: `initialize` is refused, elicitation goes through `input_required`
//! results, list changes and resource updates through `subscriptions/listen`); `grow` adds a
//! tool and announces the change, `touch` announces a resource update. `--tasks` declares the
//! 2026-07-28 tasks extension: `task_work` then answers a task to a caller that declared it
//! (`--lie-task-id` answers one with an id out of bounds instead).
#![allow(deprecated)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use clap::Parser;
use futures::Stream;
use rmcp::model::*;
use rmcp::service::{RequestContext, RoleServer, RxJsonRpcMessage, ServiceError, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{EventStore, ServerSseMessage};
use rmcp::transport::streamable_http_server::{
    RestoreOutcome, SessionId, SessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
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
    /// `echo`'s description is this file's content, read once at start (a description that
    /// changes on restart: drift tests).
    #[arg(long, value_name = "PATH")]
    describe_file: Option<PathBuf>,
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
    /// prompts/list answers after this many successful listings with an internal error (a family
    /// that lists at boot and fails later).
    #[arg(long)]
    fail_prompts_after: Option<u64>,
    /// Append one line per JSON-RPC request or notification received from the client
    /// (`<method>`, or `tools/call <tool>`), flushed immediately.
    #[arg(long, value_name = "PATH")]
    request_log: Option<PathBuf>,
    /// Serve MCP streamable HTTP (stateful sessions) on 127.0.0.1:PORT at `/mcp` instead of stdio.
    #[arg(long, value_name = "PORT")]
    http: Option<u16>,
    /// With --http: an extra accepted `Host` name (repeatable; loopback names always are).
    #[arg(long = "allowed-host")]
    allowed_hosts: Vec<String>,
    /// With --http: serve HTTPS with this PEM certificate chain (needs --tls-key).
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// With --http: the PEM private key of --tls-cert.
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// With --tls-cert: require a client certificate issued by this PEM CA (mTLS).
    #[arg(long)]
    tls_client_ca: Option<PathBuf>,
    /// Before serving, write one unterminated line of this many bytes to stdout (bounds tests).
    #[arg(long, value_name = "BYTES")]
    stdout_flood: Option<u64>,
    /// At start, write one line of this many bytes to stderr (newline only at its end), then serve.
    #[arg(long, value_name = "BYTES")]
    stderr_flood: Option<u64>,
    /// Exit with status 4 this many milliseconds after starting (a child that keeps crashing).
    #[arg(long, value_name = "MS")]
    exit_after_ms: Option<u64>,
    /// Also serve skills: `skill://release-notes/SKILL.md`, `skill://incident-triage/SKILL.md`
    /// and `skill://broken/SKILL.md` (no front matter: a gateway must leave it out).
    #[arg(long)]
    skills: bool,
    /// Advertise no resources capability (resources/list answers "method not found").
    #[arg(long)]
    no_resources: bool,
    /// Sleep this long before answering `initialize` (a child slow to start).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    init_delay_ms: u64,
    /// An extra tool `NAME=DESCRIPTION` (repeatable); calling it answers `NAME ok`.
    #[arg(long = "extra-tool", value_name = "NAME=DESCRIPTION")]
    extra_tools: Vec<String>,
    /// Which protocol eras to serve: `legacy` (default: 2025, `initialize` only — the child most
    /// servers are today, whose sampling, elicitation and roots are server→client requests),
    /// `modern` (2026-07-28: `server/discover` only) or `both`.
    #[arg(long, value_enum, default_value_t = Era::Legacy)]
    era: Era,
    /// Exit with status 5 when asked `server/discover` (a 2025 server that dies on an unknown
    /// method).
    #[arg(long)]
    exit_on_discover: bool,
    /// Declare the 2026-07-28 tasks extension and serve `tasks/get|update|cancel`.
    #[arg(long)]
    tasks: bool,
    /// With --tasks: `task_work` answers a task whose id is 600 bytes (a lying child).
    #[arg(long)]
    lie_task_id: bool,
    /// Serve `late {text, ms}`: answers at once, then `ms` later (outside any call) sends a log
    /// line `text` and an elicitation request; `late_seen` lists what those requests got back.
    #[arg(long)]
    late: bool,
}

/// What the late elicitation requests of `late` got back (process-wide).
static LATE_SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The protocol eras the child serves.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Era {
    Both,
    Legacy,
    Modern,
}

/// The `--skills` SKILL.md documents: (URI, text).
const SKILLS: &[(&str, &str)] = &[
    (
        "skill://release-notes/SKILL.md",
        "---\nname: release-notes\ndescription: Write release notes for a new version from the merged changes and the changelog.\n---\n# Release notes\n\n1. Collect the merged changes since the last tag.\n2. Group them by kind.\n",
    ),
    (
        "skill://incident-triage/SKILL.md",
        "---\r\nname: incident-triage\r\ndescription: >-\r\n  Triage a production incident: gather the logs,\r\n  page the on-call engineer and draft the postmortem.\r\n---\r\n# Incident triage\r\n",
    ),
    (
        "skill://broken/SKILL.md",
        "# A SKILL.md without front matter\n",
    ),
];

/// Writes `bytes` bytes of `fill` to `out` in 1 MiB chunks (no newline).
fn flood(out: &mut dyn Write, bytes: u64, fill: u8) {
    let chunk = vec![fill; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        if out.write_all(&chunk[..n]).is_err() {
            return;
        }
        left -= n as u64;
    }
    let _ = out.flush();
}

/// The `--request-log` file: one line per received request/notification, appended atomically.
struct RequestLog(Mutex<std::fs::File>);

impl RequestLog {
    fn open(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Self(Mutex::new(file)))
    }

    fn record(&self, message: &RxJsonRpcMessage<RoleServer>) {
        let mut line = match message {
            JsonRpcMessage::Request(r) => match &r.request {
                ClientRequest::CallToolRequest(call) => format!("tools/call {}", call.params.name),
                other => other.method().to_string(),
            },
            JsonRpcMessage::Notification(n) => serde_json::to_value(&n.notification)
                .ok()
                .and_then(|v| v.get("method").and_then(Value::as_str).map(str::to_string))
                .unwrap_or_else(|| "<unknown notification>".into()),
            _ => return,
        };
        line.push('\n');
        let mut file = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // One write of the whole line: O_APPEND keeps concurrent writers' lines whole.
        let _ = file.write_all(line.as_bytes());
        let _ = file.flush();
    }
}

/// A transport wrapper that records every message received from the client in the request log.
struct LoggedTransport<T> {
    inner: T,
    log: Option<Arc<RequestLog>>,
}

impl<T: Transport<RoleServer>> Transport<RoleServer> for LoggedTransport<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        let message = self.inner.receive().await;
        if let (Some(log), Some(message)) = (&self.log, &message) {
            log.record(message);
        }
        message
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// [`LocalSessionManager`] whose session transports are wrapped in [`LoggedTransport`].
struct LoggedSessions {
    inner: LocalSessionManager,
    log: Option<Arc<RequestLog>>,
}

impl LoggedSessions {
    fn wrap(
        &self,
        inner: <LocalSessionManager as SessionManager>::Transport,
    ) -> LoggedTransport<<LocalSessionManager as SessionManager>::Transport> {
        LoggedTransport {
            inner,
            log: self.log.clone(),
        }
    }
}

impl SessionManager for LoggedSessions {
    type Error = <LocalSessionManager as SessionManager>::Error;
    type Transport = LoggedTransport<<LocalSessionManager as SessionManager>::Transport>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let (id, transport) = self.inner.create_session().await?;
        Ok((id, self.wrap(transport)))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_stream(id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.resume(id, last_event_id).await
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        Ok(match self.inner.restore_session(id).await? {
            RestoreOutcome::Restored(transport) => RestoreOutcome::Restored(self.wrap(transport)),
            RestoreOutcome::AlreadyPresent => RestoreOutcome::AlreadyPresent,
            _ => RestoreOutcome::NotSupported,
        })
    }

    fn event_store(&self) -> Option<Arc<dyn EventStore>> {
        self.inner.event_store()
    }
}

#[derive(Clone)]
struct Child {
    args: Arc<Args>,
    calls: Arc<AtomicU64>,
    lists: Arc<AtomicU64>,
    prompt_lists: Arc<AtomicU64>,
    unknown_served: Arc<std::sync::atomic::AtomicBool>,
    cancelled: Arc<AtomicU64>,
    schema_version: u64,
    /// `echo`'s description from `--describe-file`.
    echo_description: Option<String>,
    /// Process-wide count of MCP connections (sessions) seen so far.
    conns: Arc<AtomicU64>,
    /// This connection's number, assigned from `conns` at `initialize` (or first use).
    conn: Arc<OnceLock<u64>>,
    /// Tools added by `grow` (process-wide).
    grown: Arc<Mutex<Vec<String>>>,
    /// Open `subscriptions/listen` streams (2026-07-28 list changes), process-wide.
    listeners: Arc<Mutex<Vec<rmcp::service::SubscriptionSink>>>,
    /// `--tasks`: the tasks `task_work` created (process-wide).
    tasks: rmcp::task_manager::TaskManager,
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
    /// The `--extra-tool` named `name`: its description.
    fn extra_tool(&self, name: &str) -> Option<&str> {
        self.args
            .extra_tools
            .iter()
            .filter_map(|t| t.split_once('='))
            .find(|(n, _)| *n == name)
            .map(|(_, d)| d)
    }

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
                self.echo_description
                    .clone()
                    .unwrap_or_else(|| "Echo the given text back".into()),
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
                "env_digest",
                "Return the SHA-256 (hex) of one environment variable's value",
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
                "task_work",
                "Work for ms milliseconds (as a task for a caller that takes tasks); with ask, first ask for `answer`",
                obj(json!({"type": "object", "properties": {
                    "ms": {"type": "integer"},
                    "ask": {"type": "boolean"},
                    "text": {"type": "string"}
                }})),
            ),
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
            Tool::new(
                "elicit",
                "Ask the client for input (elicitation/create, form mode, one string field `answer`)",
                obj(json!({"type": "object", "properties": {"message": {"type": "string"}}})),
            ),
            Tool::new(
                "sample",
                "Ask the client for an LLM completion (sampling/createMessage)",
                obj(json!({"type": "object", "properties": {"prompt": {"type": "string"}}})),
            ),
            Tool::new(
                "roots",
                "Ask the client for its roots (roots/list)",
                obj(json!({"type": "object"})),
            ),
            Tool::new(
                "log",
                "Emit count logging notifications (level info, data = text), interval_ms apart",
                obj(json!({"type": "object", "properties": {
                    "text": {"type": "string"},
                    "count": {"type": "integer"},
                    "interval_ms": {"type": "integer"}
                }, "required": ["text"]})),
            ),
            Tool::new(
                "flood",
                "Emit count progress notifications as fast as possible, then answer",
                obj(
                    json!({"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]}),
                ),
            ),
            Tool::new(
                "whoami",
                "Return this child's process id and MCP connection number",
                obj(json!({"type": "object"})),
            ),
            Tool::new(
                "touch",
                "Announce that a resource changed (notifications/resources/updated)",
                obj(json!({"type": "object", "properties": {"uri": {"type": "string"}}})),
            ),
            Tool::new(
                "grow",
                "Add a tool (grown_N) to this server's catalog and announce the list change",
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
        for (name, desc) in self
            .args
            .extra_tools
            .iter()
            .filter_map(|t| t.split_once('='))
        {
            tools.push(Tool::new(
                name.to_string(),
                desc.to_string(),
                obj(json!({"type": "object", "properties": {"title": {"type": "string", "description": "Title"}}})),
            ));
        }
        if self.args.late {
            tools.push(Tool::new(
                "late",
                "Answer at once; ms later, outside the call, log `text` and ask an elicitation",
                obj(json!({"type": "object", "properties": {
                    "text": {"type": "string"}, "ms": {"type": "integer"}
                }, "required": ["text"]})),
            ));
            tools.push(Tool::new(
                "late_seen",
                "What the late elicitation requests got back (JSON list)",
                obj(json!({"type": "object"})),
            ));
        }
        for name in self.grown.lock().expect("grown").iter() {
            tools.push(Tool::new(
                name.clone(),
                "A tool added at runtime by grow",
                obj(json!({"type": "object"})),
            ));
        }
        tools
    }
}

fn text(s: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(s.into())])
}

/// `<code> <message>` of a failed server-to-client request (`none <error>` without a JSON-RPC code).
fn peer_error(e: &ServiceError) -> String {
    match e {
        ServiceError::McpError(data) => format!("{} {}", data.code.0, data.message),
        other => format!("none {other}"),
    }
}

impl Child {
    /// A handler for a new MCP connection: shared counters, a fresh connection number.
    fn for_new_connection(&self) -> Self {
        Self {
            conn: Arc::new(OnceLock::new()),
            ..self.clone()
        }
    }

    fn conn_number(&self) -> u64 {
        *self
            .conn
            .get_or_init(|| self.conns.fetch_add(1, Ordering::SeqCst) + 1)
    }

    async fn elicit(&self, args: &JsonObject, context: &RequestContext<RoleServer>) -> String {
        let message = args
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("Please provide an answer");
        let params: ElicitRequestParams = match serde_json::from_value(json!({
            "mode": "form",
            "message": message,
            "requestedSchema": {"type": "object", "properties": {"answer": {"type": "string"}}}
        })) {
            Ok(p) => p,
            Err(e) => return format!("elicit-error: none {e}"),
        };
        match context.peer.create_elicitation(params).await {
            Ok(r) => elicited(&r),
            Err(e) => format!("elicit-error: {}", peer_error(&e)),
        }
    }

    /// `elicit` in a 2026-07-28 session: an `input_required` result asking for `answer`, then
    /// the answer from the retry's `inputResponses`.
    fn elicit_modern(&self, params: &CallToolRequestParams) -> CallToolResponse {
        if let Some(answer) = params
            .input_responses
            .as_ref()
            .and_then(|r| r.get("answer"))
        {
            return match serde_json::from_value::<ElicitResult>(answer.clone()) {
                Ok(r) => CallToolResponse::Complete(text(elicited(&r))),
                Err(e) => CallToolResponse::Complete(text(format!("elicit-error: none {e}"))),
            };
        }
        let message = params
            .arguments
            .as_ref()
            .and_then(|a| a.get("message"))
            .and_then(Value::as_str)
            .unwrap_or("Please provide an answer");
        let request: ElicitRequestParams = serde_json::from_value(json!({
            "mode": "form",
            "message": message,
            "requestedSchema": {"type": "object", "properties": {"answer": {"type": "string"}}}
        }))
        .expect("a valid elicitation");
        let mut requests = InputRequests::new();
        requests.insert(
            "answer".into(),
            InputRequest::Elicitation(ElicitRequest::new(request)),
        );
        CallToolResponse::InputRequired(InputRequiredResult::new(
            Some(requests),
            Some("elicit-1".into()),
        ))
    }

    /// `task_work`: for a caller that declared the tasks extension (and with `--tasks`), a task
    /// that asks for `answer` first when `ask`, then works `ms` and completes with
    /// `<text> after <ms> ms` (or the answer); cancellable. Otherwise the same work inline.
    async fn task_work(
        &self,
        args: &JsonObject,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(100);
        let ask = args.get("ask").and_then(Value::as_bool).unwrap_or(false);
        let said = args
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or("worked")
            .to_string();
        let takes_tasks = context
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks());
        if !(self.args.tasks && takes_tasks) {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            return CallToolResponse::Complete(text(format!("{said} after {ms} ms (inline)")));
        }
        if self.args.lie_task_id {
            let now = rmcp::task_manager::current_timestamp();
            let task = Task::new("x".repeat(600), TaskStatus::Working, now.clone(), now);
            return CallToolResponse::Task(CreateTaskResult::new(task));
        }
        let options = rmcp::task_manager::TaskOptions::new().with_poll_interval_ms(20);
        let task = self.tasks.spawn(options, move |ctx| {
            Box::pin(async move {
                use rmcp::task_manager::TaskExit;
                let mut said = said;
                if ask {
                    let request: ElicitRequestParams = serde_json::from_value(json!({
                        "mode": "form",
                        "message": "What should the task say?",
                        "requestedSchema": {"type": "object", "properties": {"answer": {"type": "string"}}}
                    }))
                    .expect("a valid elicitation");
                    let answer = ctx
                        .request_input("answer", InputRequest::Elicitation(ElicitRequest::new(request)))
                        .await?;
                    said = answer
                        .pointer("/content/answer")
                        .and_then(Value::as_str)
                        .unwrap_or("no answer")
                        .to_string();
                }
                tokio::select! {
                    _ = ctx.cancelled() => Err(TaskExit::Cancelled),
                    _ = tokio::time::sleep(Duration::from_millis(ms)) => {
                        Ok(text(format!("{said} after {ms} ms (task)")))
                    }
                }
            })
        });
        CallToolResponse::Task(CreateTaskResult::new(task))
    }

    /// `touch`: announces that a resource changed (2025: on the session; 2026-07-28: on the
    /// `subscriptions/listen` streams subscribed to it).
    async fn touch(&self, uri: &str, context: &RequestContext<RoleServer>) -> String {
        if modern(context) {
            let sinks: Vec<_> = self.listeners.lock().expect("listeners").clone();
            let mut sent = 0;
            for sink in sinks {
                if sink.notify_resource_updated(uri).await.is_ok() {
                    sent += 1;
                }
            }
            format!("touched {uri} ({sent} streams)")
        } else {
            let _ = context
                .peer
                .notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                .await;
            format!("touched {uri}")
        }
    }

    /// `grow`: adds a tool and announces the change (2025: a notification on the session;
    /// 2026-07-28: on every open `subscriptions/listen` stream).
    async fn grow(&self, context: &RequestContext<RoleServer>) -> String {
        let name = {
            let mut grown = self.grown.lock().expect("grown");
            let name = format!("grown_{}", grown.len() + 1);
            grown.push(name.clone());
            name
        };
        if modern(context) {
            let sinks: Vec<_> = self.listeners.lock().expect("listeners").clone();
            for sink in sinks {
                let _ = sink.notify_tool_list_changed().await;
            }
        } else {
            let _ = context.peer.notify_tool_list_changed().await;
        }
        format!("added {name}")
    }
}

/// Whether the request belongs to a 2026-07-28 (no `initialize`) session.
fn modern(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|v| !v.has_initialize())
}

fn elicited(r: &ElicitResult) -> String {
    format!(
        "elicited: {} {}",
        serde_json::to_value(&r.action)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| format!("{:?}", r.action)),
        serde_json::to_string(&r.content).unwrap_or_default()
    )
}

/// `late`: the log line and the elicitation are sent by a task of their own after the call
/// has answered (no request association: a late message as a shared child's clients see it).
fn late(args: &JsonObject, context: &RequestContext<RoleServer>) -> String {
    let data = args
        .get("text")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(300);
    let peer = context.peer.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        let _ = peer
            .notify_logging_message(LoggingMessageNotificationParam::new(
                LoggingLevel::Info,
                json!(data),
            ))
            .await;
        let params: Result<ElicitRequestParams, _> = serde_json::from_value(json!({
            "mode": "form", "message": format!("late {data}"),
            "requestedSchema": {"type": "object", "properties": {"answer": {"type": "string"}}}
        }));
        let seen = match params {
            Ok(p) => match peer.create_elicitation(p).await {
                Ok(r) => format!("{data}: {}", elicited(&r)),
                Err(e) => format!("{data}: elicit-error: {}", peer_error(&e)),
            },
            Err(e) => format!("{data}: elicit-error: none {e}"),
        };
        LATE_SEEN.lock().expect("late").push(seen);
    });
    format!("late {ms} ms")
}

impl Child {
    async fn sample(&self, args: &JsonObject, context: &RequestContext<RoleServer>) -> String {
        let prompt = args
            .get("prompt")
            .and_then(Value::as_str)
            .unwrap_or("Say hello");
        let params: CreateMessageRequestParams = match serde_json::from_value(json!({
            "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
            "maxTokens": 100
        })) {
            Ok(p) => p,
            Err(e) => return format!("sample-error: none {e}"),
        };
        match context.peer.create_message(params).await {
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
                format!("sampled: {said}")
            }
            Err(e) => format!("sample-error: {}", peer_error(&e)),
        }
    }

    async fn roots(&self, context: &RequestContext<RoleServer>) -> String {
        match context.peer.list_roots().await {
            Ok(r) => {
                let uris: Vec<&str> = r.roots.iter().map(|root| root.uri.as_str()).collect();
                format!(
                    "roots: {}",
                    serde_json::to_string(&uris).unwrap_or_default()
                )
            }
            Err(e) => format!("roots-error: {}", peer_error(&e)),
        }
    }

    async fn log(&self, args: &JsonObject, context: &RequestContext<RoleServer>) -> String {
        let data = args.get("text").and_then(Value::as_str).unwrap_or_default();
        let count = args.get("count").and_then(Value::as_u64).unwrap_or(1);
        let interval =
            Duration::from_millis(args.get("interval_ms").and_then(Value::as_u64).unwrap_or(0));
        let mut sent = 0u64;
        for i in 0..count {
            if i > 0 && !interval.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = context.ct.cancelled() => break,
                }
            }
            if context.ct.is_cancelled() {
                break;
            }
            if let Err(e) = context
                .peer
                .notify_logging_message(LoggingMessageNotificationParam::new(
                    LoggingLevel::Info,
                    json!(data),
                ))
                .await
            {
                return format!("log-error after {sent}: {e}");
            }
            sent += 1;
        }
        format!("logged {sent}")
    }

    async fn flood(
        &self,
        params: &CallToolRequestParams,
        args: &JsonObject,
        context: &RequestContext<RoleServer>,
    ) -> String {
        let count = args.get("count").and_then(Value::as_u64).unwrap_or(0);
        // Without a progress token from the caller the notifications still go out, under a
        // token nobody asked for (so a gateway's handling of unsolicited progress is testable).
        let token = params
            .meta
            .as_ref()
            .and_then(|m| m.get_progress_token())
            .or_else(|| context.meta.get_progress_token())
            .unwrap_or_else(|| ProgressToken(NumberOrString::String("flood-no-token".into())));
        let total = count as f64;
        // Up to 64 notifications in flight at once: the writer is kept busy instead of one
        // round trip per notification (a flood, not a conversation; order may vary slightly).
        use futures::StreamExt;
        let sent = std::sync::atomic::AtomicU64::new(0);
        let mut sends = futures::stream::iter(1..=count)
            .take_while(|_| std::future::ready(!context.ct.is_cancelled()))
            .map(|i| {
                let peer = context.peer.clone();
                let token = token.clone();
                async move {
                    peer.notify_progress(
                        ProgressNotificationParam::new(token, i as f64).with_total(total),
                    )
                    .await
                }
            })
            .buffer_unordered(64);
        while let Some(r) = sends.next().await {
            if let Err(e) = r {
                return format!("flood-error after {}: {e}", sent.into_inner());
            }
            sent.fetch_add(1, Ordering::Relaxed);
        }
        let sent = sent.into_inner();
        if sent < count {
            return format!("flood cancelled after {sent}");
        }
        format!("flooded {count}")
    }
}

impl ServerHandler for Child {
    fn get_info(&self) -> ServerConfig {
        let mut caps = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_prompts()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_logging()
            .enable_completions()
            .build();
        if self.args.no_resources {
            caps.resources = None;
        }
        if self.args.tasks {
            caps.extensions
                .get_or_insert_with(Default::default)
                .insert(TASKS_EXTENSION_ID.to_string(), Default::default());
        }
        let mut info = ServerConfig::new(caps);
        info.server_info = Implementation::new(self.args.name.clone(), env!("CARGO_PKG_VERSION"));
        info
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        if self.args.era == Era::Modern {
            return Err(McpError::invalid_request(
                "this server speaks 2026-07-28 only: use server/discover",
                None,
            ));
        }
        if self.args.hang_init {
            std::future::pending::<()>().await;
        }
        if self.args.init_delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.args.init_delay_ms)).await;
        }
        self.conn_number();
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn discover(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, McpError> {
        let _ = context;
        if self.args.exit_on_discover {
            std::process::exit(5);
        }
        if self.args.era == Era::Legacy {
            return Err(McpError::method_not_found::<DiscoverRequestMethod>());
        }
        if self.args.hang_init {
            std::future::pending::<()>().await;
        }
        if self.args.init_delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.args.init_delay_ms)).await;
        }
        Ok(DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            self.get_info(),
        ))
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.tools_list_changed = requested.tools_list_changed;
        accepted.resource_subscriptions = requested.resource_subscriptions.clone();
        Some(accepted)
    }

    async fn listen(&self, context: rmcp::service::SubscriptionContext) -> Result<(), McpError> {
        let sink = context.sink().clone();
        self.listeners.lock().expect("listeners").push(sink.clone());
        context.cancelled().await;
        self.listeners
            .lock()
            .expect("listeners")
            .retain(|s| s.id() != sink.id());
        Ok(())
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
            "env_digest" => {
                // The SHA-256 of a variable's value: proves what a secret resolved to without
                // the value ever crossing the gateway (canary tests).
                use sha2::Digest;
                let name = args.get("name").and_then(Value::as_str).unwrap_or_default();
                match std::env::var(name) {
                    Ok(v) => text(hex::encode(sha2::Sha256::digest(v.as_bytes()))),
                    Err(_) => text("<unset>"),
                }
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
            "elicit" if modern(&context) => return Ok(self.elicit_modern(&params)),
            "task_work" => return Ok(self.task_work(&args, &context).await),
            "elicit" => {
                let answer = self.elicit(&args, &context).await;
                // One progress step after the answer (a call that goes on once answered).
                let token = params
                    .meta
                    .as_ref()
                    .and_then(|m| m.get_progress_token())
                    .or_else(|| context.meta.get_progress_token());
                if let Some(token) = token {
                    let _ = context
                        .peer
                        .notify_progress(ProgressNotificationParam::new(token, 1.0).with_total(1.0))
                        .await;
                }
                text(answer)
            }
            "grow" => text(self.grow(&context).await),
            "touch" => {
                let uri = args.get("uri").and_then(Value::as_str).unwrap_or_default();
                text(self.touch(uri, &context).await)
            }
            name if self.grown.lock().expect("grown").iter().any(|g| g == name) => {
                text(format!("{name} ok"))
            }
            "sample" => text(self.sample(&args, &context).await),
            "roots" => text(self.roots(&context).await),
            "log" => text(self.log(&args, &context).await),
            "late" if self.args.late => text(late(&args, &context)),
            "late_seen" if self.args.late => {
                text(serde_json::to_string(&*LATE_SEEN.lock().expect("late")).unwrap_or_default())
            }
            "flood" => text(self.flood(&params, &args, &context).await),
            "whoami" => text(format!(
                "pid={} conn={}",
                std::process::id(),
                self.conn_number()
            )),
            "deep" => text("deep ok"),
            name if name.starts_with("long_") => text("long ok"),
            name if self.extra_tool(name).is_some() => text(format!("{name} ok")),
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

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        Ok(GetTaskResult::new(self.tasks.get_task(&request.task_id)?))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.tasks
            .update_task(&request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.tasks.cancel_task(&request.task_id)
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
        let listed = self.prompt_lists.fetch_add(1, Ordering::SeqCst);
        if self.args.fail_prompts || self.args.fail_prompts_after.is_some_and(|n| listed >= n) {
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
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        if request.name != "greet" {
            return Err(McpError::invalid_params(
                format!("unknown prompt {}", request.name),
                None,
            ));
        }
        let answered = request
            .input_responses
            .as_ref()
            .and_then(|r| r.get("name"))
            .and_then(|v| serde_json::from_value::<ElicitResult>(v.clone()).ok())
            .and_then(|r| r.content)
            .and_then(|c| c.get("answer").and_then(Value::as_str).map(str::to_string));
        let given = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("name"))
            .and_then(Value::as_str)
            .map(str::to_string);
        if modern(&context) && given.is_none() && answered.is_none() {
            // 2026-07-28: a greeting without a name asks the client for one.
            let ask: ElicitRequestParams = serde_json::from_value(json!({
                "mode": "form",
                "message": "Whom should I greet?",
                "requestedSchema": {"type": "object", "properties": {"answer": {"type": "string"}}}
            }))
            .expect("a valid elicitation");
            let mut requests = InputRequests::new();
            requests.insert(
                "name".into(),
                InputRequest::Elicitation(ElicitRequest::new(ask)),
            );
            return Ok(GetPromptResponse::InputRequired(InputRequiredResult::new(
                Some(requests),
                None,
            )));
        }
        let who = given.or(answered).unwrap_or_else(|| "world".to_string());
        Ok(GetPromptResponse::Complete(GetPromptResult::new(vec![
            PromptMessage::new_text(Role::User, format!("Hello, {who}!")),
        ])))
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        let values = match &request.r#ref {
            Reference::Prompt(p) if p.name == "greet" && request.argument.name == "name" => {
                ["alice", "bob", "carol"]
                    .iter()
                    .filter(|v| v.starts_with(request.argument.value.as_str()))
                    .map(|v| v.to_string())
                    .collect()
            }
            Reference::Resource(r)
                if r.uri == "test://items/{id}" && request.argument.name == "id" =>
            {
                ["17", "42", "420"]
                    .iter()
                    .filter(|v| v.starts_with(request.argument.value.as_str()))
                    .map(|v| v.to_string())
                    .collect()
            }
            _ => Vec::new(),
        };
        Ok(CompleteResult::new(
            CompletionInfo::new(values).unwrap_or_default(),
        ))
    }

    async fn subscribe(
        &self,
        _request: SubscribeRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        Ok(())
    }

    async fn unsubscribe(
        &self,
        _request: UnsubscribeRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        Ok(())
    }

    async fn list_resources(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        if self.args.no_resources {
            return Err(McpError::method_not_found::<ListResourcesRequestMethod>());
        }
        let mut resources = vec![Resource::new("test://hello", "hello")];
        if self.args.skills {
            for (uri, _) in SKILLS {
                let name = uri
                    .trim_start_matches("skill://")
                    .trim_end_matches("/SKILL.md");
                resources.push(Resource::new(*uri, name).with_mime_type("text/markdown"));
            }
        }
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn list_resource_templates(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        if self.args.no_resources {
            return Err(McpError::method_not_found::<
                ListResourceTemplatesRequestMethod,
            >());
        }
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new("test://items/{id}", "item"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let skill = SKILLS
            .iter()
            .find(|(uri, _)| self.args.skills && *uri == request.uri);
        let body = match request.uri.as_str() {
            _ if self.args.no_resources => {
                return Err(McpError::method_not_found::<ReadResourceRequestMethod>());
            }
            _ if skill.is_some() => skill.map(|(_, text)| text.to_string()).unwrap_or_default(),
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
    if let Some(ms) = args.exit_after_ms {
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(ms));
            std::process::exit(4);
        });
    }
    if let Some(bytes) = args.stderr_flood {
        std::thread::spawn(move || {
            let mut err = std::io::stderr().lock();
            flood(&mut err, bytes, b'x');
            let _ = err.write_all(b"\nstderr flood done\n");
        });
    }
    if let Some(bytes) = args.stdout_flood {
        flood(&mut std::io::stdout().lock(), bytes, b'a');
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
    let echo_description = args
        .describe_file
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string());
    let child = Child {
        args: Arc::new(args),
        calls: Arc::new(AtomicU64::new(0)),
        cancelled: Arc::new(AtomicU64::new(0)),
        lists: Arc::new(AtomicU64::new(0)),
        prompt_lists: Arc::new(AtomicU64::new(0)),
        unknown_served: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        schema_version,
        echo_description,
        conns: Arc::new(AtomicU64::new(0)),
        conn: Arc::new(OnceLock::new()),
        grown: Arc::default(),
        listeners: Arc::default(),
        tasks: Default::default(),
    };
    let log = match &child.args.request_log {
        Some(path) => Some(Arc::new(RequestLog::open(path)?)),
        None => None,
    };
    if let Some(port) = child.args.http {
        if child.args.tls_cert.is_some() {
            return serve_https(child, port, log).await;
        }
        return serve_http(child, port, log).await;
    }
    // Same newline-delimited JSON-RPC over stdin/stdout as `stdio()`, but driven by the
    // non-blocking pipe reactor when both are pipes (no blocking-pool hand-off per write:
    // about 2.5x the notification throughput `flood` needs), falling back to `stdio()` otherwise.
    let (stdin, stdout) = rmcp::transport::stdio_pipes();
    let transport = LoggedTransport {
        inner: AsyncRwTransport::new_server(stdin, stdout),
        log,
    };
    let running = child.serve(transport).await?;
    running.waiting().await?;
    Ok(())
}

fn loopback_hosts(port: u16) -> Vec<String> {
    ["localhost", "127.0.0.1", "::1", "[::1]"]
        .iter()
        .flat_map(|h| [h.to_string(), format!("{h}:{port}")])
        .collect()
}

/// `--http PORT`: streamable HTTP with stateful sessions on 127.0.0.1:PORT/mcp; every new session
/// gets its own handler (and connection number).
async fn serve_http(child: Child, port: u16, log: Option<Arc<RequestLog>>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    let app = mcp_app(child, addr.port(), log);
    eprintln!("graph-os-testchild listening on http://{addr}/mcp");
    // No Nagle: an SSE answer is several small writes, each else held for the peer's delayed ACK
    // (40 ms per call on Linux).
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).await?;
    Ok(())
}

/// The `/mcp` router of the HTTP modes.
fn mcp_app(child: Child, port: u16, log: Option<Arc<RequestLog>>) -> axum::Router {
    let mut hosts = loopback_hosts(port);
    for h in &child.args.allowed_hosts {
        hosts.push(h.clone());
        hosts.push(format!("{h}:{port}"));
    }
    let config = StreamableHttpServerConfig::default().with_allowed_hosts(hosts);
    let sessions = LoggedSessions {
        inner: LocalSessionManager::default(),
        log,
    };
    let service = StreamableHttpService::new(
        move || Ok(child.for_new_connection()),
        Arc::new(sessions),
        config,
    );
    axum::Router::new().route_service("/mcp", service)
}

/// `--http PORT --tls-cert … --tls-key … [--tls-client-ca …]`: the same over HTTPS (rustls),
/// requiring a client certificate from `--tls-client-ca` when given (mTLS).
async fn serve_https(child: Child, port: u16, log: Option<Arc<RequestLog>>) -> anyhow::Result<()> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = child.args.clone();
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(args.tls_cert.as_ref().expect("--tls-cert"))?
            .collect::<Result<_, _>>()?;
    let key = PrivateKeyDer::from_pem_file(
        args.tls_key
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("--tls-key is required"))?,
    )?;
    let builder = rustls::ServerConfig::builder();
    let config = match &args.tls_client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca)? {
                roots.add(c?)?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder(Arc::new(roots)).build()?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    }
    .with_single_cert(certs, key)?;
    let mut config = config;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    let app = mcp_app(child, addr.port(), log);
    eprintln!("graph-os-testchild listening on https://{addr}/mcp");
    loop {
        let (tcp, _) = listener.accept().await?;
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("graph-os-testchild: TLS handshake refused: {e}");
                    return;
                }
            };
            let service = hyper_util::service::TowerToHyperService::new(app);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await;
        });
    }
}
