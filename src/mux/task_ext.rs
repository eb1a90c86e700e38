//! The 2026-07-28 tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663) through the
//! gateway.
//!
//! A 2026 caller that declares the extension in its request's client capabilities may get a
//! task in answer to `tools/call`: graph-os offers the extension to the tool's child only then,
//! and only when the child's connection declared it. The child's task is registered in the same
//! [`TaskTable`](super::tasks::TaskTable) as 2025 tasks, under an opaque graph-os id mapped to
//! (child, the connection the task lives on, the child's task id, the caller), and
//! `tasks/get|update|cancel` are routed by that id. The rules are those of 2025 tasks:
//!
//! - **Scoped to the caller and to the era**: another caller's id, or a 2025 task's id, is not
//!   found (the extension has no `tasks/list` and no `tasks/result`: the result comes inline in
//!   `tasks/get`).
//! - **Bound to a connection**: `tasks/get` is retried once when it died with the transport,
//!   after re-checking the connection and its declaration; `tasks/update` and `tasks/cancel`
//!   are never replayed, and fail closed with `task-epoch-changed` once the connection is gone.
//! - **Bounded before routing**: `taskId` and `inputResponses` (see `tasks`).
//! - **Through the child's limits**: every request passes its breaker, limiter and timeouts.
//!
//! Input the task needs (`input_required`) travels as the extension defines it: the child's
//! `inputRequests` in `tasks/get`, the caller's `inputResponses` in `tasks/update`, both
//! unchanged. Task status notifications (`notifications/tasks`) are not relayed: rmcp routes
//! none through `subscriptions/listen` yet, so 2026 callers poll `tasks/get`.
//!
//! A 2025 caller is never offered the extension (its tasks are the 2025 ones), and a 2025
//! child's tasks are not served to 2026 callers: their calls of such a tool run as plain calls.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, CancelTaskRequest, ClientRequest,
    GetTaskParams, GetTaskRequest, GetTaskResult, ServerResult, UpdateTaskParams,
    UpdateTaskRequest,
};

use super::forward::{CallContext, ToolTarget, sign_run_token};
use super::tasks::{MAX_TASK_AGE, TASK_ID_PREFIX, TaskEntry, bounded_task_id, owner};
use super::{Caller, Multiplexer, MuxError};
use crate::child::{CallError, TaskNeed};

/// A child answer of the wrong kind for a task request.
fn unexpected(server: &str, what: &str) -> MuxError {
    MuxError::child(
        server,
        CallError::Rpc(rmcp::ErrorData::internal_error(
            format!("the child answered {what} with an unexpected result type"),
            None,
        )),
    )
}

impl Multiplexer {
    /// Whether graph-os declares the tasks extension to 2026 callers: a child's newest
    /// connection declared it.
    pub fn tasks_extension(&self) -> bool {
        self.fleet()
            .children
            .values()
            .any(|c| c.declares_tasks_extension())
    }

    /// `tools/call` of a checked target for a caller that takes a task in answer: a task the
    /// child creates is registered and returned under graph-os's id.
    pub(super) async fn call_offering_task(
        &self,
        caller: &Caller,
        target: ToolTarget,
        mut params: CallToolRequestParams,
        cx: CallContext,
    ) -> Result<CallToolResponse, MuxError> {
        let server = target.server.clone();
        let cx_tool = cx.tool.clone();
        let retry = self.crash_retry(caller, &cx.tool, &target, false);
        sign_run_token(caller, &target.child, &mut params)
            .map_err(|e| MuxError::child(&server, e))?;
        let (response, pin) = self
            .call_routed(caller, &target.child, params, retry, cx, true)
            .await
            .map_err(|e| MuxError::child(&server, e))?;
        let CallToolResponse::Task(mut created) = response else {
            return Ok(response);
        };
        // A task comes back with the connection it lives on.
        let Some(conn) = pin else {
            return Err(unexpected(&server, "tools/call"));
        };
        let child_task = std::mem::take(&mut created.task.task_id);
        if bounded_task_id(&child_task).is_err() {
            return Err(unexpected(&server, "tools/call (a task id out of bounds)"));
        }
        let id = format!("{TASK_ID_PREFIX}{}", super::input::random_hex());
        // `ttlMs` null is unlimited: graph-os keeps a task at most `MAX_TASK_AGE`.
        let keep = created.task.ttl_ms.map_or(MAX_TASK_AGE, |ms| {
            Duration::from_millis(ms).min(MAX_TASK_AGE) + Duration::from_secs(60)
        });
        let held = self.tasks.insert(
            id.clone(),
            TaskEntry {
                owner: owner(caller),
                tool: super::tasks::TaskTool {
                    name: cx_tool.clone(),
                    original: target.original.clone(),
                    read_only: target.read_only,
                },
                server: server.clone(),
                child_task: child_task.clone(),
                conn: conn.clone(),
                session: Arc::downgrade(&caller.session),
                created: Instant::now(),
                keep,
                last: Default::default(),
                extension: true,
            },
        );
        if let Err(full) = held {
            // No one could follow the task: it is cancelled at the child (best effort).
            let child = target.child.clone();
            tokio::spawn(async move {
                let cancel = ClientRequest::CancelTaskRequest(CancelTaskRequest::new(
                    CancelTaskParams::new(child_task),
                ));
                let ct = tokio_util::sync::CancellationToken::new();
                let outcome = child
                    .task_request(
                        Some(&conn),
                        TaskNeed::Extension,
                        cancel,
                        None,
                        None,
                        ct,
                        None,
                    )
                    .await;
                tracing::debug!(ok = outcome.is_ok(), "unheld task cancelled at its child");
            });
            return Err(full);
        }
        crate::telemetry::metrics().task_created(&server);
        created.task.task_id = id;
        Ok(CallToolResponse::Task(created))
    }

    /// `tasks/get` of the extension: the task as its child reports it, under graph-os's id
    /// (its `inputRequests` and its result or error inline, unchanged).
    pub async fn task_ext_get(
        &self,
        caller: &Caller,
        params: GetTaskParams,
        cx: CallContext,
    ) -> Result<GetTaskResult, MuxError> {
        let id = bounded_task_id(&params.task_id)?;
        let request = |child_task: &str| {
            ClientRequest::GetTaskRequest(GetTaskRequest::new(GetTaskParams::new(child_task)))
        };
        let (server, _, answer) = self
            .to_task(caller, &id, TaskNeed::Extension, &request, None, &cx, true)
            .await?;
        let ServerResult::GetTaskResult(mut result) = answer else {
            return Err(unexpected(&server, "tasks/get"));
        };
        result.task.task.task_id = id;
        Ok(result)
    }

    /// `tasks/update`: the caller's `inputResponses` (bounded first) to the task's child.
    /// Never replayed on another connection.
    pub async fn task_ext_update(
        &self,
        caller: &Caller,
        params: UpdateTaskParams,
        cx: CallContext,
    ) -> Result<(), MuxError> {
        let id = bounded_task_id(&params.task_id)?;
        let responses = serde_json::to_value(&params.input_responses)
            .map_err(|e| MuxError::InvalidParams(format!("inputResponses: {e}")))?;
        super::tasks::check_input_responses(&serde_json::json!({"inputResponses": responses}))?;
        let request = |child_task: &str| {
            ClientRequest::UpdateTaskRequest(UpdateTaskRequest::new(UpdateTaskParams::new(
                child_task,
                params.input_responses.clone(),
            )))
        };
        self.acknowledged(caller, &id, &request, "tasks/update", cx)
            .await
    }

    /// `tasks/cancel`: never replayed on another connection.
    pub async fn task_ext_cancel(
        &self,
        caller: &Caller,
        params: CancelTaskParams,
        cx: CallContext,
    ) -> Result<(), MuxError> {
        let id = bounded_task_id(&params.task_id)?;
        let request = |child_task: &str| {
            ClientRequest::CancelTaskRequest(CancelTaskRequest::new(CancelTaskParams::new(
                child_task,
            )))
        };
        self.acknowledged(caller, &id, &request, "tasks/cancel", cx)
            .await
    }

    /// Sends `tasks/update` or `tasks/cancel` (`what`) once, never replayed, and takes the
    /// child's acknowledgement.
    async fn acknowledged(
        &self,
        caller: &Caller,
        id: &str,
        request: &(dyn Fn(&str) -> ClientRequest + Sync),
        what: &str,
        cx: CallContext,
    ) -> Result<(), MuxError> {
        let (server, _, answer) = self
            .to_task(caller, id, TaskNeed::Extension, request, None, &cx, false)
            .await?;
        match answer {
            ServerResult::TaskAckResult(_) | ServerResult::EmptyResult(_) => Ok(()),
            _ => Err(unexpected(&server, what)),
        }
    }
}
