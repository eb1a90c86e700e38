//! Calling: one forwarded call's scaffolding ([`ChildRuntime::governed`], shared by the typed
//! path and the raw hot path), the attempt on a leased connection with its input rounds, the
//! read-only crash retry resolved again first, and the exchange with timeout and upstream
//! cancellation.

use super::*;

pub(super) async fn cancel_upstream(
    peer: &Peer<RoleClient>,
    id: rmcp::model::RequestId,
    reason: &str,
) {
    let _ = peer
        .notify_cancelled(rmcp::model::CancelledNotificationParam::new(
            Some(id),
            Some(reason.to_string()),
        ))
        .await;
}

impl ChildRuntime {
    /// Forwards one `tools/call` to the child under its limits: breaker, queue timeout,
    /// concurrency bound, call timeout. `observer` receives the call's progress, logs and
    /// child→client requests; `ct` cancels it (cancellation is sent upstream); `session` picks
    /// the session's own connection under `per-session` isolation. A call with a `retry` (a
    /// read-only tool) whose attempt dies with the transport is retried once on a new
    /// connection, after its resolution agrees (see [`Self::crash_retry`]).
    pub async fn call_tool(
        &self,
        params: CallToolRequestParams,
        retry: Retry,
        observer: Option<Arc<dyn CallObserver>>,
        ct: CancellationToken,
        session: Option<&SessionTag>,
    ) -> Result<CallToolResponse, CallError> {
        self.call_tool_offering(params, retry, observer, ct, session, false)
            .await
            .map(|(response, _)| response)
    }

    /// Whether a read-only call that lost its connection (of `generation`) may be retried:
    /// shared, once the next connection generation is up (within the child's start-up time,
    /// at most 45 s); per-session, at once (the dead connection is dropped and the retry opens
    /// a new one).
    pub(crate) async fn ready_for_retry(&self, per_session: bool, generation: u64) -> bool {
        if per_session {
            self.reap_sessions();
            return true;
        }
        let limits = &self.spec.limits;
        let recovery =
            (limits.initialization_timeout + limits.probe_timeout).min(Duration::from_secs(45));
        let mut rx = self.status.subscribe();
        tokio::time::timeout(
            recovery,
            rx.wait_for(|s| {
                s.state == ChildState::Failed
                    || (s.state == ChildState::Up && s.connection_generation > generation)
            }),
        )
        .await
        .is_ok_and(|r| r.is_ok_and(|s| s.state == ChildState::Up))
    }

    /// The one crash-retry decision of the typed path and the raw hot path: a call with a
    /// `retry` whose attempt died with the connection (`outcome`) is retried once the next
    /// connection is up ([`Self::ready_for_retry`]) and only if it resolves again, as a fresh
    /// call would, to the same unchanged tool ([`Reresolve`]): a tool the drift guard now holds,
    /// or whose schema changed, is never sent to the restarted child. Returns whether to retry;
    /// a refusal of the resolution replaces `outcome`.
    pub(super) async fn crash_retry<T>(
        &self,
        retry: &Retry,
        outcome: &mut Result<T, CallError>,
        per_session: bool,
        generation: u64,
    ) -> bool {
        let Some(check) = retry else {
            return false;
        };
        if !matches!(outcome, Err(CallError::TransportClosed { .. }))
            || !self.ready_for_retry(per_session, generation).await
        {
            return false;
        }
        match check.reresolve().await {
            Ok(()) => {
                tracing::info!(server = %self.spec.name, "retrying a read-only call on a new connection");
                true
            }
            Err(refusal) => {
                tracing::info!(server = %self.spec.name, code = refusal.code(), "a read-only call that died with the child is not retried");
                *outcome = Err(refusal);
                false
            }
        }
    }

    /// [`Self::call_tool`], where `offer_tasks` says the caller takes a task in answer (2026-07-28
    /// tasks extension): a connection that declares the extension is told so in the request's
    /// `clientCapabilities`, and may answer with a task, returned with the connection it lives
    /// on. Other connections are not told, and answer as for any caller.
    pub async fn call_tool_offering(
        &self,
        params: CallToolRequestParams,
        retry: Retry,
        observer: Option<Arc<dyn CallObserver>>,
        ct: CancellationToken,
        session: Option<&SessionTag>,
        offer_tasks: bool,
    ) -> Result<(CallToolResponse, Option<TaskConn>), CallError> {
        let tool = params.name.to_string();
        let code = |(response, _): &(CallToolResponse, Arc<Connection>)| match response {
            CallToolResponse::Complete(r) if r.is_error == Some(true) => "tool-error",
            CallToolResponse::InputRequired(_) => "input-required",
            CallToolResponse::Task(_) => "task",
            _ => "ok",
        };
        let attempt = || self.attempt(params.clone(), observer.clone(), &ct, session, offer_tasks);
        let (outcome, generation) = self
            .governed(&tool, &retry, &ct, session, code, attempt)
            .await;
        outcome.map(|(response, conn)| {
            let pin = matches!(response, CallToolResponse::Task(_))
                .then(|| TaskConn::new(&conn, generation));
            (response, pin)
        })
    }

    /// The one scaffolding of a forwarded call, whatever carries its bytes (the typed path and
    /// the raw hot path): the call span, admission ([`Self::admit`]), the attempt, the crash
    /// retry of a read-only call ([`Self::crash_retry`]), settling with the breaker
    /// ([`Self::settle`]), metrics. Returns the outcome and the connection generation it came
    /// from.
    pub(crate) async fn governed<T, F, Fut>(
        &self,
        tool: &str,
        retry: &Retry,
        ct: &CancellationToken,
        session: Option<&SessionTag>,
        code: impl Fn(&T) -> &'static str,
        attempt: F,
    ) -> (Result<T, CallError>, u64)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, CallError>>,
    {
        use tracing::Instrument;
        let started = Instant::now();
        let span = tracing::info_span!(
            "child.call",
            otel.name = %format!("call {}/{}", self.spec.name, tool),
            otel.kind = "client",
            server = %self.spec.name,
            tool = %tool,
            code = tracing::field::Empty,
        );
        let run = async {
            let admitted = match self.admit(ct, session).await {
                Ok(a) => a,
                Err(e) => return (Err(e), 0),
            };
            let mut generation = admitted.generation;
            let per_session =
                self.spec.isolation == SessionIsolation::PerSession && session.is_some();
            let mut outcome = attempt().await;
            if self
                .crash_retry(retry, &mut outcome, per_session, generation)
                .await
            {
                generation = self.status().connection_generation;
                outcome = attempt().await;
            }
            self.settle(admitted, &outcome);
            (outcome, generation)
        };
        let (outcome, generation) = run.instrument(span.clone()).await;
        let recorded = match &outcome {
            Ok(t) => code(t),
            Err(e) => e.code(),
        };
        self.record_call(&span, tool, started, recorded, outcome.as_ref().err());
        (outcome, generation)
    }

    /// Records a finished call: its span's code, the call and per-tool metrics, and a warning
    /// when the child failed it.
    pub(super) fn record_call(
        &self,
        span: &tracing::Span,
        tool: &str,
        started: Instant,
        code: &str,
        error: Option<&CallError>,
    ) {
        span.record("code", code);
        let elapsed = started.elapsed();
        let m = crate::telemetry::metrics();
        m.call(&self.spec.name, code, elapsed);
        m.tool_call(&self.spec.name, tool, code, elapsed);
        if let Some(e) = error {
            crate::telemetry::trace::fail(span, code);
            // The child failed the call (no answer in time, connection lost): worth a warning.
            // Refusals before the child (busy, open breaker, unavailable) are the caller's news.
            if matches!(
                e,
                CallError::Timeout { .. } | CallError::TransportClosed { .. }
            ) {
                tracing::warn!(
                    server = %self.spec.name,
                    tool = %tool,
                    code,
                    elapsed_ms = elapsed.as_millis() as u64,
                    error = %e,
                    "child call failed"
                );
            }
        }
    }

    /// One call on one connection; returns the answer and that connection.
    pub(super) async fn attempt(
        &self,
        mut params: CallToolRequestParams,
        observer: Option<Arc<dyn CallObserver>>,
        ct: &CancellationToken,
        session: Option<&SessionTag>,
        offer_tasks: bool,
    ) -> Result<(CallToolResponse, Arc<Connection>), CallError> {
        let lease = self.lease(session).await?;
        let conn = lease.conn.clone();
        // The extension is offered only where the caller takes tasks and the child declared it.
        let offered = offer_tasks && tasks::extension_declared(&conn);
        let options = || {
            if offered {
                tasks::offering_tasks()
            } else {
                PeerRequestOptions::no_options()
            }
        };
        let route = observer.clone().map(|o| lease.conn.routes.begin(o));
        // Traces: the child call span's context travels in `_meta` (SEP-414; HTTP transports
        // also send it as the `traceparent` header).
        if crate::telemetry::trace::enabled() {
            let meta = params.meta.get_or_insert_with(Default::default);
            crate::telemetry::trace::inject_meta(&mut meta.0.0);
        }
        // A 2026-07-28 child asks for client input with `input_required` results: graph-os
        // relays the input requests to a 2025 client and retries with its answers (bounded
        // rounds); a 2026 client gets the result itself and retries through graph-os.
        for _round in 0..=MAX_INPUT_ROUNDS {
            let request =
                ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(params.clone()));
            let input = match self
                .exchange(&lease.conn, request, options(), ct, route.as_ref())
                .await?
            {
                ServerResult::CallToolResult(r) => {
                    return Ok((CallToolResponse::Complete(r), conn));
                }
                // Only a caller that takes tasks was offered them; a task for another is a
                // child that does not follow the extension.
                ServerResult::CreateTaskResult(r) if offered => {
                    return Ok((CallToolResponse::Task(r), conn));
                }
                ServerResult::InputRequiredResult(r) => r,
                _ => {
                    return Err(CallError::Rpc(ErrorData::internal_error(
                        "child answered tools/call with an unexpected result type",
                        None,
                    )));
                }
            };
            let Some(caller) = observer.as_ref() else {
                return Err(CallError::Rpc(rmcp::model::ErrorData::new(
                    rmcp::model::ErrorCode(client::RELAY_REFUSED),
                    "the child asked for client input and no client is attached to this call",
                    Some(serde_json::json!({"code": client::relay_code::NO_CALLER})),
                )));
            };
            if caller.takes_input_required() {
                return Ok((CallToolResponse::InputRequired(input), conn));
            }
            let responses = match &input.input_requests {
                Some(requests) => Some(
                    self.client
                        .fulfil(caller, requests)
                        .await
                        .map_err(CallError::Rpc)?,
                ),
                None => None,
            };
            params.input_responses = responses;
            params.request_state = input.request_state;
        }
        Err(CallError::Rpc(ErrorData::internal_error(
            format!("the child asked for client input more than {MAX_INPUT_ROUNDS} times"),
            Some(serde_json::json!({"code": "input-rounds-exceeded"})),
        )))
    }

    /// Forwards a request that is not a tool call (prompts/get, resources/read, completion,
    /// subscriptions, setLevel) to the child, on the session's connection under `per-session`.
    pub async fn forward(
        &self,
        request: ClientRequest,
        ct: CancellationToken,
        session: Option<&SessionTag>,
    ) -> Result<ServerResult, CallError> {
        let server = self.spec.name.clone();
        let status = self.wait_settled(Duration::from_secs(5)).await;
        if status.state != ChildState::Up {
            return Err(CallError::Unavailable {
                server,
                state: status.state,
            });
        }
        if self.era() == Some(ChildEra::Modern) {
            match &request {
                ClientRequest::SubscribeRequest(r) => {
                    return self.listen_resource(r.params.uri.clone(), session).await;
                }
                ClientRequest::UnsubscribeRequest(r) => {
                    let listen = self
                        .resource_listens
                        .lock()
                        .ok()
                        .and_then(|mut m| m.remove(&r.params.uri));
                    if let Some(listen) = listen {
                        listen.stop.cancel();
                        // Bounded: a wedged connection does not hold the unsubscribe.
                        let _ = tokio::time::timeout(self.spec.limits.call_timeout, listen.closed)
                            .await;
                    }
                    return Ok(ServerResult::empty(()));
                }
                _ => {}
            }
        }
        let lease = match self.lease(session).await {
            Ok(l) => l,
            Err(CallError::TransportClosed { .. }) => {
                return Err(CallError::Unavailable {
                    server,
                    state: self.status().state,
                });
            }
            Err(e) => return Err(e),
        };
        self.exchange(
            &lease.conn,
            request,
            PeerRequestOptions::no_options(),
            &ct,
            None,
        )
        .await
    }

    /// Sends one request on `conn` and waits for its answer under the call timeout; a timeout or
    /// a cancelled `ct` is sent upstream as `notifications/cancelled`. With a `route`, the
    /// request's progress token and JSON-RPC id are bound to that call's observer as soon as
    /// rmcp assigns them: the one place a request becomes evidence of association (see
    /// [`client::Routes`]), for tool calls and task requests alike.
    pub(super) async fn exchange(
        &self,
        conn: &Connection,
        request: ClientRequest,
        options: PeerRequestOptions,
        ct: &CancellationToken,
        route: Option<&client::RouteGuard>,
    ) -> Result<ServerResult, CallError> {
        let server = self.spec.name.clone();
        let handle = conn
            .peer
            .send_request_with_option(request, options)
            .await
            .map_err(|_| CallError::TransportClosed {
                server: server.clone(),
            })?;
        if let Some(route) = route {
            route.bind(handle.progress_token.clone());
            route.bind_request(handle.id.clone());
        }
        let id = handle.id.clone();
        let timeout = self.spec.limits.call_timeout;
        tokio::select! {
            r = tokio::time::timeout(timeout, handle.await_response()) => match r {
                Err(_) => { cancel_upstream(&conn.peer, id, "graph-os call timeout").await; Err(CallError::Timeout { server, timeout }) }
                Ok(Ok(r)) => Ok(r),
                Ok(Err(ServiceError::McpError(e))) => Err(CallError::Rpc(e)),
                Ok(Err(_)) => Err(CallError::TransportClosed { server }),
            },
            _ = ct.cancelled() => { cancel_upstream(&conn.peer, id, "cancelled by the client").await; Err(CallError::Cancelled) }
        }
    }
}
