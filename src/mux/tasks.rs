//! Native 2025-11-25 Tasks (SEP-1686) through the gateway.
//!
//! A task-augmented `tools/call` goes to a child whose connection declares
//! `capabilities.tasks.requests.tools.call` and whose tool declares `execution.taskSupport`
//! `optional` or `required`. graph-os answers with its own opaque task id, mapped to (child,
//! the connection the task lives on, the child's task id, the caller); `tasks/get|result|list|
//! cancel` are routed by that id to the owner's child and connection. Rules:
//!
//! - **Scoped to the caller**: another caller's id is not found; `tasks/list` lists only the
//!   caller's tasks, across children.
//! - **Bound to a connection**: a task lives on the child connection that created it.
//!   `tasks/get` and `tasks/result` are retried once when the request died with the transport,
//!   after re-checking that connection and its capability; `tasks/cancel` is never replayed.
//!   Once that connection is gone every request fails closed with `task-epoch-changed`.
//! - **Bounded before routing**: `taskId` (non-blank, trimmed, no control characters, at most
//!   [`MAX_TASK_ID_BYTES`]) and `inputResponses` ([`input_limits`]) are checked before a child
//!   sees anything; refusals name the bound, never the content.
//! - **Through the child's limits**: every request passes its breaker, limiter and timeouts.
//! - **Relayed back**: `notifications/tasks/status` go to the session that created the task,
//!   with graph-os's id; the child's requests for the client while `tasks/result` waits (the
//!   `input_required` flow) are relayed to that caller, their related-task id rewritten.
// Task relays forward a child's (SEP-2577-deprecated) log notifications like any call's.
#![allow(deprecated)]

use super::Refusal;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestParams, ClientResult, LoggingMessageNotificationParam,
    ProgressNotificationParam, ServerRequest, ServerResult,
};
use serde_json::{Value, json};

use super::forward::{CallContext, sign_run_token};
use super::pipeline::{Admission, Arguments, Destination, Entry};
use super::route::FrontRoute;
use super::{Caller, Multiplexer, MuxError, Operation, Session};
use crate::child::{CallError, CallObserver, ClientCaps, TaskConn, TaskNeed};
use crate::config::ArgumentLimits;
use crate::wire::task_marks::EXECUTION_MARK;

/// Prefix of the task ids graph-os issues.
pub const TASK_ID_PREFIX: &str = "graph-os-task-";
/// Longest accepted `taskId`, in UTF-8 bytes.
pub const MAX_TASK_ID_BYTES: usize = 512;
/// Tasks one caller may hold at once.
pub const MAX_TASKS_PER_CALLER: usize = 256;
/// Tasks the gateway holds at once.
pub const MAX_TASKS: usize = 16_384;
/// How long a task is kept when the child gave it no `ttl` (and the most any `ttl` keeps it).
pub const MAX_TASK_AGE: Duration = Duration::from_secs(24 * 3600);
pub use crate::wire::task_marks::RELATED_TASK;

/// Bounds of `inputResponses`: 64 KiB, 4,096 values, depth 24, 16 KiB per string.
pub fn input_limits() -> ArgumentLimits {
    ArgumentLimits {
        max_bytes: 64 * 1024,
        max_depth: 24,
        max_items: 4096,
        max_string_bytes: 16 * 1024,
    }
}

/// The tool a task came from: what deployment stages see of its follow-up requests.
#[derive(Clone, Debug, Default)]
pub(super) struct TaskTool {
    /// The exposed name.
    pub name: String,
    /// The child's own name.
    pub original: String,
    /// Declared read-only.
    pub read_only: bool,
}

/// A task found for its owner: where it lives and what it came from.
pub(super) struct Found {
    pub server: String,
    pub child_task: String,
    pub conn: TaskConn,
    pub last: serde_json::Map<String, Value>,
    pub tool: TaskTool,
}

/// One task graph-os issued.
pub(super) struct TaskEntry {
    pub owner: String,
    /// The tool that created it.
    pub tool: TaskTool,
    pub server: String,
    pub child_task: String,
    pub conn: TaskConn,
    pub session: Weak<Session>,
    pub created: Instant,
    pub keep: Duration,
    /// The task's last known fields (2025 `Task` shape, graph-os's id; empty for the extension).
    pub last: serde_json::Map<String, Value>,
    /// A task of the 2026-07-28 tasks extension (see `task_ext`): only its requests reach it.
    pub extension: bool,
}

#[derive(Default)]
struct TableInner {
    tasks: HashMap<String, TaskEntry>,
    /// (server, child task id) → graph-os id.
    by_child: HashMap<(String, String), String>,
    /// Status notifications that arrived before their task's creation answer (bounded).
    early: std::collections::VecDeque<(String, Value)>,
}

/// Early status notifications held (see `TableInner::early`).
const EARLY_MAX: usize = 64;

/// The task ids graph-os issued (see the module note).
#[derive(Default)]
pub struct TaskTable {
    inner: Mutex<TableInner>,
}

impl TaskTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, TableInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn prune(inner: &mut TableInner) {
        let expired: Vec<String> = inner
            .tasks
            .iter()
            .filter(|(_, t)| t.created.elapsed() > t.keep)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            if let Some(t) = inner.tasks.remove(&id) {
                inner.by_child.remove(&(t.server, t.child_task));
            }
        }
    }

    /// Registers a task; returns the status notifications of it that came before.
    pub(super) fn insert(&self, id: String, entry: TaskEntry) -> Result<Vec<Value>, MuxError> {
        let mut inner = self.lock();
        Self::prune(&mut inner);
        let mine = inner
            .tasks
            .values()
            .filter(|t| t.owner == entry.owner)
            .count();
        if mine >= MAX_TASKS_PER_CALLER || inner.tasks.len() >= MAX_TASKS {
            return Err(MuxError::refused(
                Refusal::TasksFull,
                format!(
                    "at most {MAX_TASKS_PER_CALLER} tasks per caller ({MAX_TASKS} in all) are held; let some expire"
                ),
            ));
        }
        inner
            .by_child
            .insert((entry.server.clone(), entry.child_task.clone()), id.clone());
        let (mine, rest): (Vec<_>, Vec<_>) = inner.early.drain(..).partition(|(server, p)| {
            *server == entry.server
                && p.get("taskId").and_then(Value::as_str) == Some(entry.child_task.as_str())
        });
        inner.early.extend(rest);
        inner.tasks.insert(id, entry);
        Ok(mine.into_iter().map(|(_, p)| p).collect())
    }

    /// The caller's task `id` of the era asked for (a 2025 task is not found by a 2026 request,
    /// and back): (server, child task id, connection, last known fields).
    pub(super) fn find(&self, owner: &str, id: &str, extension: bool) -> Option<Found> {
        let mut inner = self.lock();
        Self::prune(&mut inner);
        let mine = |t: &&TaskEntry| t.owner == owner && t.extension == extension;
        inner.tasks.get(id).filter(mine).map(|t| Found {
            server: t.server.clone(),
            child_task: t.child_task.clone(),
            conn: t.conn.clone(),
            last: t.last.clone(),
            tool: t.tool.clone(),
        })
    }

    fn remember(&self, id: &str, last: &serde_json::Map<String, Value>) {
        if let Some(t) = self.lock().tasks.get_mut(id) {
            t.last = last.clone();
        }
    }

    fn owned_by(&self, owner: &str) -> Vec<String> {
        let mut inner = self.lock();
        Self::prune(&mut inner);
        let mut ids: Vec<(Instant, String)> = inner
            .tasks
            .iter()
            .filter(|(_, t)| t.owner == owner && !t.extension)
            .map(|(id, t)| (t.created, id.clone()))
            .collect();
        ids.sort();
        ids.into_iter().map(|(_, id)| id).collect()
    }

    /// Tasks held (for status).
    pub fn len(&self) -> usize {
        self.lock().tasks.len()
    }

    /// Whether no task is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A child's status notification, for the session that created the task: graph-os's id in
    /// place of the child's. `None` for a task graph-os did not issue.
    fn status_note(&self, server: &str, mut params: Value) -> Option<(Arc<Session>, Value)> {
        let child_task = params.get("taskId")?.as_str()?.to_string();
        let mut inner = self.lock();
        let Some(id) = inner
            .by_child
            .get(&(server.to_string(), child_task))
            .cloned()
        else {
            // Its creation answer may still be on the way.
            if inner.early.len() >= EARLY_MAX {
                inner.early.pop_front();
            }
            inner.early.push_back((server.to_string(), params));
            return None;
        };
        let entry = inner.tasks.get_mut(&id)?;
        params["taskId"] = Value::String(id.clone());
        if let Some(fields) = params.as_object() {
            for (k, v) in fields {
                if k != "_meta" {
                    entry.last.insert(k.clone(), v.clone());
                }
            }
        }
        Some((entry.session.upgrade()?, params))
    }
}

/// The trimmed `taskId` of task request params, after the bounds (module note).
pub fn task_id(params: &Value) -> Result<String, MuxError> {
    let Some(raw) = params.get("taskId") else {
        return Err(invalid_id("taskId is required"));
    };
    let Some(raw) = raw.as_str() else {
        return Err(invalid_id("taskId must be a string"));
    };
    let id = bounded_task_id(raw)?;
    check_input_responses(params)?;
    Ok(id)
}

fn invalid_id(message: &str) -> MuxError {
    MuxError::refused(Refusal::TaskIdInvalid, message.to_string())
}

/// A `taskId`, trimmed, within the bounds (non-blank, no control characters, at most
/// [`MAX_TASK_ID_BYTES`]).
pub fn bounded_task_id(raw: &str) -> Result<String, MuxError> {
    let invalid = invalid_id;
    let id = raw.trim();
    if id.is_empty() {
        return Err(invalid("taskId is blank"));
    }
    if id.len() > MAX_TASK_ID_BYTES {
        return Err(invalid(&format!(
            "taskId is longer than {MAX_TASK_ID_BYTES} bytes"
        )));
    }
    if id.chars().any(char::is_control) {
        return Err(invalid("taskId holds a control character"));
    }
    Ok(id.to_string())
}

/// `inputResponses`, when present, must be an object within [`input_limits`].
pub fn check_input_responses(params: &Value) -> Result<(), MuxError> {
    match params.get("inputResponses") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(map)) => super::bounds::check_arguments(map, &input_limits())
            .map_err(|m| MuxError::bounds(format!("inputResponses: {m}"))),
        Some(_) => Err(MuxError::InvalidParams(
            "inputResponses must be an object".into(),
        )),
    }
}

pub(super) fn not_found() -> MuxError {
    MuxError::refused(
        Refusal::TaskNotFound,
        "no task with this id belongs to the caller",
    )
}

/// Any child answer as JSON (rmcp parses 2025 task results into its nearest type).
fn answer_json(result: ServerResult) -> serde_json::Map<String, Value> {
    match serde_json::to_value(result) {
        Ok(Value::Object(m)) => m,
        _ => Default::default(),
    }
}

/// A child's task fields in the 2025 `Task` shape under graph-os's id, completed from what is
/// known of the task (rmcp reads a 2025 `tasks/get` answer without `ttl`/`pollInterval`).
fn task_fields(
    id: &str,
    answer: &serde_json::Map<String, Value>,
    last: &serde_json::Map<String, Value>,
) -> serde_json::Map<String, Value> {
    let mut task = last.clone();
    let renamed = [("ttlMs", "ttl"), ("pollIntervalMs", "pollInterval")];
    for (k, v) in answer {
        let k = renamed
            .iter()
            .find(|(from, _)| from == k)
            .map_or(k.as_str(), |(_, to)| to);
        if matches!(
            k,
            "status" | "statusMessage" | "createdAt" | "lastUpdatedAt" | "ttl" | "pollInterval"
        ) && !(v.is_null() && task.contains_key(k))
        {
            task.insert(k.to_string(), v.clone());
        }
    }
    task.insert("taskId".into(), Value::String(id.to_string()));
    task
}

/// Rewrites `_meta[related-task].taskId` from the child's id to graph-os's.
fn relate(value: &mut Value, id: &str) {
    if let Some(related) = value
        .get_mut("_meta")
        .and_then(|m| m.get_mut(RELATED_TASK))
        .and_then(Value::as_object_mut)
    {
        related.insert("taskId".into(), Value::String(id.to_string()));
    }
}

/// The caller's observer for `tasks/result`: relayed requests carry graph-os's task id.
struct TaskRelay {
    route: Arc<FrontRoute>,
    id: String,
}

impl CallObserver for TaskRelay {
    fn session(&self) -> u64 {
        self.route.session()
    }
    fn caps(&self) -> ClientCaps {
        self.route.caps()
    }
    fn progress(&self, params: ProgressNotificationParam) {
        self.route.progress(params)
    }
    fn log(&self, params: LoggingMessageNotificationParam) {
        self.route.log(params)
    }
    fn relay(
        &self,
        mut request: ServerRequest,
    ) -> BoxFuture<'static, Result<ClientResult, ErrorData>> {
        // The request belongs to the caller's task: its related-task id is graph-os's.
        rmcp::model::GetMeta::get_meta_mut(&mut request)
            .insert(RELATED_TASK.into(), json!({"taskId": self.id}));
        self.route.relay(request)
    }
}

/// A 2025 task request of the child's task id.
fn legacy(method: &'static str) -> impl Fn(&str) -> rmcp::model::ClientRequest + Sync {
    move |child_task| custom(method, json!({"taskId": child_task}))
}

/// A 2025 task request (rmcp has no 2025 task types: a custom request of that method).
fn custom(method: &str, params: Value) -> rmcp::model::ClientRequest {
    rmcp::model::ClientRequest::CustomRequest(rmcp::model::CustomRequest::new(
        method.to_string(),
        Some(params),
    ))
}

pub(super) fn owner(caller: &Caller) -> String {
    caller.identity.subject.clone()
}

impl Multiplexer {
    /// graph-os's own 2025 `capabilities.tasks`: declared when a child declares tasks for
    /// tools/call, or while a child has not connected yet (clients initialize as the gateway
    /// starts, before its children are up; a tool that turns out not to support tasks is then
    /// refused with `task-unsupported`).
    pub async fn tasks_capability(&self) -> Option<Value> {
        let children: Vec<_> = self.fleet().children.values().cloned().collect();
        let mut declare = false;
        for child in children {
            if let Some(d) = child.tasks_capability().await
                && crate::child::tasks_cover(&d, &["requests", "tools", "call"])
            {
                declare = true;
                break;
            }
            declare |= child.era().is_none();
        }
        declare.then(|| json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}))
    }

    /// Task-augmented `tools/call` (`params` as the client sent them, `task` included).
    pub async fn call_tool_task(
        &self,
        caller: &Caller,
        params: Value,
        cx: CallContext,
    ) -> Result<Value, MuxError> {
        caller.authorize(Operation::CallTool)?;
        let task = params
            .get("task")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let mut typed: CallToolRequestParams = serde_json::from_value(params)
            .map_err(|e| MuxError::InvalidParams(format!("tools/call params: {e}")))?;
        let name = typed.name.to_string();
        let target = self
            .tool_target(caller, &name, typed.arguments.as_ref())
            .await?;
        let support = target
            .tool
            .as_ref()
            .and_then(|t| t.meta.as_ref())
            .and_then(|m| m.get(EXECUTION_MARK))
            .and_then(|e| e.get("taskSupport"))
            .and_then(Value::as_str)
            .unwrap_or("forbidden");
        if target.tool.is_some() && support != "optional" && support != "required" {
            return Err(MuxError::refused(
                Refusal::TaskUnsupported,
                format!("tool '{name}' does not support task execution (taskSupport {support})"),
            ));
        }
        typed.name = target.original.clone().into();
        sign_run_token(caller, &target.child, &mut typed)
            .map_err(|e| MuxError::child(&target.server, e))?;
        let mut raw =
            serde_json::to_value(&typed).map_err(|e| MuxError::InvalidParams(e.to_string()))?;
        // Only the 2025 `task` fields travel (`ttl`); graph-os's own bound applies.
        let mut sent_task = serde_json::Map::new();
        if let Some(ttl) = task.get("ttl").and_then(Value::as_u64) {
            sent_task.insert(
                "ttl".into(),
                json!(ttl.min(MAX_TASK_AGE.as_millis() as u64)),
            );
        }
        raw["task"] = Value::Object(sent_task);
        let tag = caller.tag();
        let (answer, conn) = target
            .child
            .task_request(
                None,
                TaskNeed::Legacy(&["requests", "tools", "call"]),
                custom("tools/call", raw),
                None,
                None,
                cx.ct.clone(),
                Some(&tag),
            )
            .await
            .map_err(|e| MuxError::child(&target.server, e))?;
        let mut answer = answer_json(answer);
        let Some(child_task) = answer
            .get("task")
            .and_then(|t| t.get("taskId"))
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            // The child ran the call without a task (taskSupport optional): its result as is.
            return Ok(Value::Object(answer));
        };
        let id = format!("{TASK_ID_PREFIX}{}", super::input::random_hex());
        let child_fields = answer
            .get("task")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let fields = task_fields(&id, &child_fields, &Default::default());
        let keep = fields
            .get("ttl")
            .and_then(Value::as_u64)
            .map_or(MAX_TASK_AGE, |ms| {
                Duration::from_millis(ms).min(MAX_TASK_AGE) + Duration::from_secs(60)
            });
        let early = self.tasks.insert(
            id.clone(),
            TaskEntry {
                owner: owner(caller),
                tool: TaskTool {
                    name: name.clone(),
                    original: target.original.clone(),
                    read_only: target.read_only,
                },
                server: target.server.clone(),
                child_task,
                conn,
                session: Arc::downgrade(&caller.session),
                created: Instant::now(),
                keep,
                last: fields.clone(),
                extension: false,
            },
        )?;
        crate::telemetry::metrics().task_created(&target.server);
        for params in early {
            deliver_status(&self.tasks, &target.server, params);
        }
        answer.insert("task".into(), Value::Object(fields));
        Ok(Value::Object(answer))
    }

    /// Sends a task request for the caller's task `id` to its child (on its connection):
    /// `request` builds it from the child's task id. `retry`: once more when the request died
    /// with the transport (get/result only: never a cancel or an update).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn to_task(
        &self,
        caller: &Caller,
        id: &str,
        need: TaskNeed<'_>,
        request: &(dyn Fn(&str) -> rmcp::model::ClientRequest + Sync),
        observer: Option<Arc<dyn CallObserver>>,
        cx: &CallContext,
        retry: bool,
    ) -> Result<(String, serde_json::Map<String, Value>, ServerResult), MuxError> {
        caller.authorize(Operation::CallTool)?;
        let extension = matches!(need, TaskNeed::Extension);
        let Found {
            server,
            child_task,
            conn,
            last,
            tool,
        } = self
            .tasks
            .find(&owner(caller), id, extension)
            .ok_or_else(not_found)?;
        // The deployment's stages see every request that reaches the task's child.
        self.run_stages(
            &Admission {
                caller,
                name: &tool.name,
                arguments: Arguments::Checked,
                entry: Entry::TaskFollowUp,
            },
            Destination {
                server: &server,
                original: &tool.original,
                read_only: tool.read_only,
            },
        )?;
        let child = self.reach(caller, Operation::CallTool, &server)?;
        let tag = caller.tag();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let outcome = child
                .task_request(
                    Some(&conn),
                    need,
                    request(&child_task),
                    Some(&child_task),
                    observer.clone(),
                    cx.ct.clone(),
                    Some(&tag),
                )
                .await;
            match outcome {
                Ok((answer, _)) => return Ok((server, last, answer)),
                Err(CallError::TransportClosed { .. }) if retry && attempt == 1 => {
                    tracing::info!(server = %server, "task request died with the transport; retrying once on its connection");
                }
                Err(e) => return Err(MuxError::child(&server, e)),
            }
        }
    }

    /// `tasks/get`.
    pub async fn task_get(
        &self,
        caller: &Caller,
        params: Value,
        cx: CallContext,
    ) -> Result<Value, MuxError> {
        let id = task_id(&params)?;
        let (_, last, answer) = self
            .to_task(
                caller,
                &id,
                TaskNeed::Legacy(&[]),
                &legacy("tasks/get"),
                None,
                &cx,
                true,
            )
            .await?;
        let fields = task_fields(&id, &answer_json(answer), &last);
        self.tasks.remember(&id, &fields);
        Ok(Value::Object(fields))
    }

    /// `tasks/result`: waits for the task's result; the child's requests for the client in the
    /// meantime reach the caller.
    pub async fn task_result(
        &self,
        caller: &Caller,
        params: Value,
        cx: CallContext,
    ) -> Result<Value, MuxError> {
        let id = task_id(&params)?;
        let route = cx.sink.clone().map(|sink| {
            FrontRoute::new(
                caller.session.id(),
                caller.caps,
                cx.progress_token.clone(),
                caller.session.log_level(),
                sink,
            )
        });
        let observer = route.clone().map(|route| {
            Arc::new(TaskRelay {
                route,
                id: id.clone(),
            }) as Arc<dyn CallObserver>
        });
        let method = legacy("tasks/result");
        let call = self.to_task(
            caller,
            &id,
            TaskNeed::Legacy(&[]),
            &method,
            observer,
            &cx,
            true,
        );
        let outcome = FrontRoute::run(route.as_ref(), &cx.ct, call).await;
        let (_, _, answer) = outcome?;
        let mut answer = Value::Object(answer_json(answer));
        relate(&mut answer, &id);
        Ok(answer)
    }

    /// `tasks/cancel`: never replayed on another connection.
    pub async fn task_cancel(
        &self,
        caller: &Caller,
        params: Value,
        cx: CallContext,
    ) -> Result<Value, MuxError> {
        let id = task_id(&params)?;
        let (_, last, answer) = self
            .to_task(
                caller,
                &id,
                TaskNeed::Legacy(&["cancel"]),
                &legacy("tasks/cancel"),
                None,
                &cx,
                false,
            )
            .await?;
        let mut fields = task_fields(&id, &answer_json(answer), &last);
        // An acknowledgement without fields still means cancelled (the spec's answer is the task).
        if !fields.contains_key("status") || fields.get("status") == last.get("status") {
            fields
                .entry("status")
                .or_insert_with(|| Value::String("cancelled".into()));
        }
        self.tasks.remember(&id, &fields);
        Ok(Value::Object(fields))
    }

    /// `tasks/list`: the caller's tasks, across children, each as its child reports it now
    /// (a task its child no longer knows is left out).
    pub async fn task_list(
        &self,
        caller: &Caller,
        params: Value,
        cx: CallContext,
    ) -> Result<Value, MuxError> {
        caller.authorize(Operation::CallTool)?;
        check_input_responses(&params)?;
        let ids = self.tasks.owned_by(&owner(caller));
        let polls = ids.iter().map(|id| {
            let cx = cx.clone();
            async move { self.task_get(caller, json!({"taskId": id}), cx).await.ok() }
        });
        let tasks: Vec<Value> = futures::future::join_all(polls)
            .await
            .into_iter()
            .flatten()
            .collect();
        Ok(json!({"tasks": tasks}))
    }

    /// Tasks graph-os holds.
    pub fn task_count(&self) -> usize {
        self.tasks.len()
    }
}

/// Delivers a child's task status notification (see [`TaskTable::status_note`]).
pub(super) fn deliver_status(table: &TaskTable, server: &str, params: Value) {
    let Some((session, params)) = table.status_note(server, params) else {
        tracing::debug!(server, "task status for no task graph-os holds (yet)");
        return;
    };
    tokio::spawn(async move {
        let outcome = session.notifier.task_status(params).await;
        tracing::debug!(?outcome, "task status notification");
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(owner: &str, child_task: &str, keep: Duration) -> TaskEntry {
        TaskEntry {
            owner: owner.into(),
            tool: TaskTool::default(),
            server: "ev".into(),
            child_task: child_task.into(),
            conn: TaskConn::gone(1),
            session: Weak::new(),
            created: Instant::now(),
            keep,
            last: Default::default(),
            extension: false,
        }
    }

    #[test]
    fn a_task_exists_only_for_its_caller() {
        let table = TaskTable::default();
        table
            .insert("g1".into(), entry("alice", "c1", MAX_TASK_AGE))
            .unwrap();
        assert!(table.find("alice", "g1", false).is_some());
        assert!(
            table.find("bob", "g1", false).is_none(),
            "another caller's id is not found"
        );
        assert!(
            table.find("alice", "c1", false).is_none(),
            "the child's own id is not an id"
        );
        assert_eq!(table.owned_by("alice"), vec!["g1".to_string()]);
        assert!(table.owned_by("bob").is_empty());
    }

    #[test]
    fn a_task_exists_only_in_its_era() {
        let table = TaskTable::default();
        table
            .insert("old".into(), entry("alice", "c1", MAX_TASK_AGE))
            .unwrap();
        let mut modern = entry("alice", "c2", MAX_TASK_AGE);
        modern.extension = true;
        table.insert("new".into(), modern).unwrap();
        assert!(table.find("alice", "old", false).is_some());
        assert!(
            table.find("alice", "old", true).is_none(),
            "a 2025 task is not found by the extension"
        );
        assert!(table.find("alice", "new", true).is_some());
        assert!(
            table.find("alice", "new", false).is_none(),
            "an extension task is not found by 2025 requests"
        );
        assert_eq!(
            table.owned_by("alice"),
            vec!["old".to_string()],
            "2025 tasks/list shows only 2025 tasks"
        );
    }

    #[test]
    fn expired_tasks_are_forgotten_and_each_caller_is_bounded() {
        let table = TaskTable::default();
        table
            .insert("old".into(), entry("alice", "c0", Duration::ZERO))
            .unwrap();
        std::thread::sleep(Duration::from_millis(2));
        assert!(table.find("alice", "old", false).is_none());
        for i in 0..MAX_TASKS_PER_CALLER {
            table
                .insert(
                    format!("g{i}"),
                    entry("alice", &format!("c{i}"), MAX_TASK_AGE),
                )
                .unwrap();
        }
        let full = table
            .insert("one-more".into(), entry("alice", "cx", MAX_TASK_AGE))
            .unwrap_err();
        assert_eq!(full.code(), "tasks-full");
        assert!(
            table
                .insert("bobs".into(), entry("bob", "cb", MAX_TASK_AGE))
                .is_ok()
        );
    }

    #[test]
    fn a_status_that_beats_the_creation_answer_is_held_for_it() {
        let table = TaskTable::default();
        let note = json!({"taskId": "c1", "status": "working"});
        assert!(table.status_note("ev", note.clone()).is_none());
        let early = table
            .insert("g1".into(), entry("alice", "c1", MAX_TASK_AGE))
            .unwrap();
        assert_eq!(early, vec![note]);
        // Another child's task with the same child id is not this one.
        assert!(
            table
                .status_note("other", json!({"taskId": "c1"}))
                .is_none()
        );
    }

    #[test]
    fn task_ids_are_bounded_before_routing() {
        let code = |v: Value| task_id(&v).unwrap_err().code();
        assert_eq!(task_id(&json!({"taskId": "  t-1  "})).unwrap(), "t-1");
        assert_eq!(code(json!({})), "task-id-invalid");
        assert_eq!(code(json!({"taskId": 7})), "task-id-invalid");
        assert_eq!(code(json!({"taskId": "   "})), "task-id-invalid");
        assert_eq!(code(json!({"taskId": "a\u{7}b"})), "task-id-invalid");
        assert_eq!(code(json!({"taskId": "x".repeat(513)})), "task-id-invalid");
        assert!(
            task_id(&json!({"taskId": "é".repeat(256)})).is_ok(),
            "512 bytes"
        );
        assert_eq!(code(json!({"taskId": "é".repeat(257)})), "task-id-invalid");
    }

    #[test]
    fn input_responses_are_bounded_without_echoing_them() {
        let ok = json!({"taskId": "t", "inputResponses": {"a": {"action": "accept"}}});
        assert!(task_id(&ok).is_ok());
        let secret = "s".repeat(16 * 1024 + 1);
        let long = json!({"taskId": "t", "inputResponses": {"a": secret}});
        let e = task_id(&long).unwrap_err();
        assert_eq!(e.code(), "request-out-of-bounds");
        assert!(!e.message().contains("sss"));
        let many: serde_json::Map<String, Value> =
            (0..4097).map(|i| (i.to_string(), json!(1))).collect();
        assert_eq!(
            task_id(&json!({"taskId": "t", "inputResponses": many}))
                .unwrap_err()
                .code(),
            "request-out-of-bounds"
        );
        let mut deep = json!(1);
        for _ in 0..25 {
            deep = json!([deep]);
        }
        assert_eq!(
            task_id(&json!({"taskId": "t", "inputResponses": {"d": deep}}))
                .unwrap_err()
                .code(),
            "request-out-of-bounds"
        );
        let big: serde_json::Map<String, Value> = (0..8)
            .map(|i| (i.to_string(), json!("x".repeat(9000))))
            .collect();
        assert_eq!(
            task_id(&json!({"taskId": "t", "inputResponses": big}))
                .unwrap_err()
                .code(),
            "request-out-of-bounds"
        );
        assert_eq!(
            task_id(&json!({"taskId": "t", "inputResponses": [1]}))
                .unwrap_err()
                .code(),
            "invalid-params"
        );
    }

    #[test]
    fn a_childs_task_fields_take_graph_os_id_and_keep_what_rmcp_dropped() {
        let last: serde_json::Map<String, Value> = serde_json::from_value(json!({
            "taskId": "g", "status": "working", "createdAt": "c", "lastUpdatedAt": "u",
            "ttl": 300000, "pollInterval": 1000}))
        .unwrap();
        let answer: serde_json::Map<String, Value> = serde_json::from_value(json!({
            "taskId": "child-1", "status": "input_required", "statusMessage": "asking",
            "createdAt": "c", "lastUpdatedAt": "u2", "ttlMs": null, "resultType": "complete"}))
        .unwrap();
        let t = task_fields("g", &answer, &last);
        assert_eq!(t["taskId"], "g");
        assert_eq!(t["status"], "input_required");
        assert_eq!(t["statusMessage"], "asking");
        assert_eq!(t["lastUpdatedAt"], "u2");
        assert_eq!(
            t["ttl"], 300000,
            "a null from rmcp's parse does not erase the known ttl"
        );
        assert_eq!(t["pollInterval"], 1000);
        assert!(!t.contains_key("resultType"));
    }

    #[test]
    fn related_task_ids_are_rewritten_to_graph_os_ids() {
        let mut v = json!({"content": [], "_meta": {RELATED_TASK: {"taskId": "child-1"}}});
        relate(&mut v, "graph-os-task-x");
        assert_eq!(v["_meta"][RELATED_TASK]["taskId"], "graph-os-task-x");
        let mut plain = json!({"content": []});
        relate(&mut plain, "g");
        assert!(plain.get("_meta").is_none());
    }
}
