//! An in-memory MCP child for specifications without a process: the runtime reaches it through
//! the [`Connector`] seam (a duplex pipe and rmcp on both ends, the protocol exactly as on a pipe
//! to a child process). Every dial starts a fresh server instance, as a restart starts a fresh
//! process; a test kills an instance to crash the child, changes its tools, or refuses dials.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    GetPromptRequestParams, GetPromptResponse, GetPromptResult, ListPromptsResult, ListToolsResult,
    PaginatedRequestParams, Prompt, PromptMessage, Role, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{ClientLifecycleMode, RequestContext, RoleServer};
use rmcp::{ServerHandler, ServiceExt};
use tokio_util::sync::CancellationToken;

use super::connector::{Connector, Dial, Dialed};
use super::{ErrorInfo, ObservedTransport};
use crate::probe;

/// What the in-memory child does, shared by all its instances (one per connection).
#[derive(Default)]
pub(crate) struct Script {
    /// The tools the next listing returns: (name, description).
    pub(crate) tools: Mutex<Vec<(String, String)>>,
    /// Instances started so far (the current one is this number).
    pub(crate) dials: AtomicU64,
    /// Every call an instance received: (instance, tool).
    pub(crate) calls: Mutex<Vec<(u64, String)>>,
    /// Stops the current instance (its pipe closes, as a dying process's does).
    pub(crate) kill: Mutex<CancellationToken>,
    /// Refuse dials (the child cannot be started).
    pub(crate) refuse: AtomicBool,
}

impl Script {
    pub(crate) fn new(tools: &[(&str, &str)]) -> Arc<Self> {
        let script = Script::default();
        script.set_tools(tools);
        Arc::new(script)
    }

    pub(crate) fn set_tools(&self, tools: &[(&str, &str)]) {
        *self.tools.lock().unwrap() = tools
            .iter()
            .map(|(n, d)| (n.to_string(), d.to_string()))
            .collect();
    }

    pub(crate) fn crash(&self) {
        self.kill.lock().unwrap().cancel();
    }

    pub(crate) fn calls(&self) -> Vec<(u64, String)> {
        self.calls.lock().unwrap().clone()
    }
}

/// One instance of the in-memory child. Its tools: `echo` answers with the instance number;
/// `hang` never answers; `slow` answers after 10 s; `crash` kills this instance;
/// `crash-first` kills the first instance and answers on the others.
struct Instance {
    script: Arc<Script>,
    number: u64,
    kill: CancellationToken,
}

impl ServerHandler for Instance {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_prompts()
                .build(),
        )
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Ok(ListPromptsResult::with_all_items(vec![Prompt::new(
            "greet",
            Some("says hello"),
            None,
        )]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        Ok(GetPromptResponse::Complete(GetPromptResult::new(vec![
            PromptMessage::new_text(
                Role::Assistant,
                format!("hello from {} (instance {})", request.name, self.number),
            ),
        ])))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = self
            .script
            .tools
            .lock()
            .unwrap()
            .iter()
            .map(|(n, d)| Tool::new(n.clone(), d.clone(), serde_json::Map::new()))
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let tool = params.name.to_string();
        self.script
            .calls
            .lock()
            .unwrap()
            .push((self.number, tool.clone()));
        match tool.as_str() {
            "hang" => std::future::pending::<()>().await,
            "slow" => tokio::time::sleep(Duration::from_secs(10)).await,
            "crash" => {
                self.kill.cancel();
                std::future::pending::<()>().await;
            }
            "crash-first" if self.number == 1 => {
                self.kill.cancel();
                std::future::pending::<()>().await;
            }
            _ => {}
        }
        Ok(CallToolResponse::Complete(CallToolResult::success(vec![
            ContentBlock::text(format!("instance {}", self.number)),
        ])))
    }
}

/// Opens a pipe to a fresh instance of the scripted child of the dialed name.
pub(crate) struct Memory(HashMap<String, Arc<Script>>);

impl Memory {
    /// Scripted children by server name.
    pub(crate) fn new<'a>(children: impl IntoIterator<Item = (&'a str, &'a Arc<Script>)>) -> Self {
        Memory(
            children
                .into_iter()
                .map(|(n, s)| (n.to_string(), s.clone()))
                .collect(),
        )
    }
}

impl Connector for Memory {
    fn dial<'a>(&'a self, dial: Dial<'a>) -> BoxFuture<'a, Result<Dialed, ErrorInfo>> {
        Box::pin(async move {
            let Some(script) = self.0.get(&dial.spec.name) else {
                return Err(ErrorInfo::new(
                    "child-spawn-failed",
                    "no such in-memory child",
                ));
            };
            if script.refuse.load(Ordering::SeqCst) {
                return Err(ErrorInfo::new("child-initialize-failed", "refused"));
            }
            let number = script.dials.fetch_add(1, Ordering::SeqCst) + 1;
            let kill = CancellationToken::new();
            *script.kill.lock().unwrap() = kill.clone();
            let instance = Instance {
                script: script.clone(),
                number,
                kill: kill.clone(),
            };
            let (near, far) = tokio::io::duplex(1 << 16);
            tokio::spawn(async move {
                let Ok(running) = instance.serve(tokio::io::split(far)).await else {
                    return;
                };
                let token = running.cancellation_token();
                let waiting = running.waiting();
                tokio::pin!(waiting);
                tokio::select! {
                    _ = &mut waiting => {}
                    _ = kill.cancelled() => {
                        token.cancel();
                        let _ = waiting.await;
                    }
                }
            });
            let (read, write) = tokio::io::split(near);
            let transport = rmcp::transport::async_rw::AsyncRwTransport::new_client(read, write);
            let running = probe::connect(
                dial.client.clone(),
                ObservedTransport::new(transport, &dial.client),
                ClientLifecycleMode::Initialize,
                dial.timeout,
            )
            .await;
            Ok(Dialed { running, raw: None })
        })
    }
}
