//! Calls parked on client input: a 2025-era child asks the client something (elicitation,
//! sampling, roots) while serving the call of a 2026-07-28 client.
//!
//! 2026-07-28 has no server→client requests; its mechanism for server input is the
//! `input_required` result (SEP-2322, multi round-trip requests). graph-os keeps the child's call
//! running, answers the front request with `input_required` (the child's request as the one
//! input request, keyed [`INPUT_KEY`]; an opaque handle as `requestState`), and resumes the
//! parked call when the client retries `tools/call` with the answer. The handle is random
//! (128 bits), bound to the caller and the tool, expires with the child's relay timeout, and
//! lives in this process only: a retry that reaches another replica, comes from another caller
//! or names another tool is refused with `input-state-unknown`, and nothing reaches the child.
//!
//! rmcp has no such bridge (its client drives input rounds toward a 2026 server, its server
//! refuses server→client requests toward a 2026 client), so it is written here.
// Sampling and roots are SEP-2577-deprecated but still asked for by 2025-era children.
#![allow(deprecated)]

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rmcp::ErrorData;
use rmcp::model::{
    CallToolResponse, ClientResult, CreateMessageResult, ElicitResult, InputRequest, InputRequests,
    InputRequiredResult, InputResponses, ListRootsResult, ServerRequest,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::route::{Ask, FrontRoute};
use crate::child::CallError;

/// Prefix of the `requestState` handles graph-os issues.
pub const STATE_PREFIX: &str = "graph-os.input.";

/// The key of the one input request in an `input_required` result graph-os issues.
pub const INPUT_KEY: &str = "graph-os";

/// Most calls parked at once (per process); beyond it a child's request is refused.
pub const MAX_PARKED: usize = 1024;

/// A call in flight toward a 2025 child on behalf of a 2026 client.
pub(super) struct Inflight {
    /// The child call.
    pub call: JoinHandle<Result<CallToolResponse, crate::child::CallError>>,
    /// Requests the child sends the client while serving it.
    pub asks: mpsc::Receiver<Ask>,
    /// Cancels the child call (it outlives the front request that started it).
    pub call_ct: CancellationToken,
    /// The call's route (progress, logs) and its drain task.
    pub route: std::sync::Arc<FrontRoute>,
    /// The drain task of `route`.
    pub drain: JoinHandle<()>,
    /// The child's name.
    pub server: String,
    /// How long the child waits for an answer (its relay timeout).
    pub ttl: Duration,
}

/// An [`Inflight`] call waiting for the client's answer to `request`.
pub(super) struct Parked {
    inflight: Inflight,
    request: ServerRequest,
    reply: oneshot::Sender<Result<ClientResult, ErrorData>>,
    owner: String,
    tool: String,
    at: Instant,
}

/// The calls parked in this process.
#[derive(Default)]
pub struct ParkedCalls {
    inner: Mutex<HashMap<String, Parked>>,
}

impl ParkedCalls {
    /// Parks `inflight` until the client answers `request`; returns the `input_required` result
    /// for the client, or the refusal for the child when too many calls are parked.
    pub(super) fn park(
        &self,
        inflight: Inflight,
        (request, reply): Ask,
        owner: String,
        tool: String,
        ttl: Duration,
    ) -> Result<CallToolResponse, CallError> {
        let Some(input) = as_input(&request) else {
            let _ = reply.send(Err(refusal("graph-os does not relay this request")));
            return Err(CallError::Rpc(ErrorData::internal_error(
                "the child asked for an input graph-os cannot relay",
                None,
            )));
        };
        let handle = format!("{STATE_PREFIX}{}", random_hex());
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        // Expired entries are dropped (their child calls were answered with a relay timeout).
        map.retain(|_, p| {
            let live = p.at.elapsed() < ttl;
            if !live {
                p.inflight.call_ct.cancel();
            }
            live
        });
        if map.len() >= MAX_PARKED {
            drop(map);
            let _ = reply.send(Err(refusal("too many calls wait for client input")));
            inflight.call_ct.cancel();
            return Err(CallError::Rpc(ErrorData::internal_error(
                "too many calls wait for client input",
                Some(serde_json::json!({"code": "input-parked-full"})),
            )));
        }
        map.insert(
            handle.clone(),
            Parked {
                inflight,
                request,
                reply,
                owner,
                tool,
                at: Instant::now(),
            },
        );
        let mut requests = InputRequests::new();
        requests.insert(INPUT_KEY.into(), input);
        Ok(CallToolResponse::InputRequired(InputRequiredResult::new(
            Some(requests),
            Some(handle),
        )))
    }

    /// Takes the call parked under `handle` for `owner` and `tool` and hands it the client's
    /// answer from `responses`; `None` when no such call is parked here.
    pub(super) fn resume(
        &self,
        handle: &str,
        owner: &str,
        tool: &str,
        responses: Option<&InputResponses>,
    ) -> Option<Inflight> {
        let parked = {
            let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            match map.get(handle) {
                Some(p) if p.owner == owner && p.tool == tool => map.remove(handle)?,
                _ => return None,
            }
        };
        let answer = responses
            .and_then(|r| r.get(INPUT_KEY))
            .ok_or_else(|| refusal("the client retried without an answer"))
            .and_then(|v| answer_of(&parked.request, v.clone()));
        let _ = parked.reply.send(answer);
        Some(parked.inflight)
    }

    /// Calls parked now.
    pub(super) fn count(&self) -> usize {
        self.inner.lock().map(|m| m.len()).unwrap_or(0)
    }
}

/// The 2026 form of a child's request.
fn as_input(request: &ServerRequest) -> Option<InputRequest> {
    match request.clone() {
        ServerRequest::ElicitRequest(r) => Some(InputRequest::Elicitation(r)),
        ServerRequest::CreateMessageRequest(r) => Some(InputRequest::CreateMessage(r)),
        ServerRequest::ListRootsRequest(r) => Some(InputRequest::ListRoots(r)),
        _ => None,
    }
}

/// The client's answer as the result the child's request expects.
fn answer_of(request: &ServerRequest, value: serde_json::Value) -> Result<ClientResult, ErrorData> {
    let bad = |e: serde_json::Error| refusal(&format!("the client's answer is malformed: {e}"));
    Ok(match request {
        ServerRequest::ElicitRequest(_) => {
            ClientResult::ElicitResult(serde_json::from_value::<ElicitResult>(value).map_err(bad)?)
        }
        ServerRequest::CreateMessageRequest(_) => ClientResult::CreateMessageResult(Box::new(
            serde_json::from_value::<CreateMessageResult>(value).map_err(bad)?,
        )),
        ServerRequest::ListRootsRequest(_) => ClientResult::ListRootsResult(
            serde_json::from_value::<ListRootsResult>(value).map_err(bad)?,
        ),
        _ => return Err(refusal("graph-os does not relay this request")),
    })
}

fn refusal(message: &str) -> ErrorData {
    crate::child::relay_refusal("relay-input-failed", message)
}

pub(super) fn random_hex() -> String {
    let mut bytes = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .expect("the system random source works");
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::future::BoxFuture;
    use serde_json::json;

    use super::*;
    use crate::mux::FrontSink;

    struct NoSink;
    impl FrontSink for NoSink {
        fn send(&self, _note: crate::mux::FrontNote) -> BoxFuture<'static, Result<(), ()>> {
            Box::pin(async { Ok(()) })
        }
        fn relay(&self, _r: ServerRequest) -> BoxFuture<'static, Result<ClientResult, ErrorData>> {
            Box::pin(async { Err(ErrorData::internal_error("no client", None)) })
        }
        fn closed(&self) -> bool {
            false
        }
    }

    fn inflight() -> Inflight {
        let (_tx, asks) = mpsc::channel(1);
        Inflight {
            call: tokio::spawn(std::future::pending()),
            asks,
            call_ct: CancellationToken::new(),
            route: FrontRoute::new(
                1,
                Default::default(),
                None,
                rmcp::model::LoggingLevel::Debug,
                Arc::new(NoSink),
            ),
            drain: tokio::spawn(async {}),
            server: "tc".into(),
            ttl: Duration::from_secs(60),
        }
    }

    fn elicit() -> ServerRequest {
        ServerRequest::ElicitRequest(rmcp::model::ElicitRequest::new(
            serde_json::from_value(json!({
                "mode": "form",
                "message": "colour?",
                "requestedSchema": {"type": "object", "properties": {"answer": {"type": "string"}}}
            }))
            .unwrap(),
        ))
    }

    fn state_of(r: CallToolResponse) -> String {
        let CallToolResponse::InputRequired(r) = r else {
            panic!("an input_required result")
        };
        assert!(matches!(
            r.input_requests.as_ref().and_then(|i| i.get(INPUT_KEY)),
            Some(InputRequest::Elicitation(_))
        ));
        r.request_state.expect("a handle")
    }

    fn answer(text: &str) -> InputResponses {
        [(
            INPUT_KEY.to_string(),
            json!({"action": "accept", "content": {"answer": text}}),
        )]
        .into()
    }

    #[tokio::test]
    async fn a_parked_call_resumes_only_for_its_owner_and_tool_and_only_once() {
        let parked = ParkedCalls::default();
        let (reply, replied) = oneshot::channel();
        let ttl = Duration::from_secs(60);
        let r = parked.park(
            inflight(),
            (elicit(), reply),
            "alice#1".into(),
            "tc__elicit".into(),
            ttl,
        );
        let state = state_of(r.unwrap());
        assert!(state.starts_with(STATE_PREFIX));
        assert_eq!(state.len(), STATE_PREFIX.len() + 32, "128 random bits");

        let a = answer("teal");
        assert!(
            parked
                .resume(&state, "mallory#2", "tc__elicit", Some(&a))
                .is_none()
        );
        assert!(
            parked
                .resume(&state, "alice#1", "tc__echo", Some(&a))
                .is_none()
        );
        assert!(
            parked
                .resume("graph-os.input.00", "alice#1", "tc__elicit", Some(&a))
                .is_none()
        );
        assert_eq!(parked.count(), 1, "refused retries leave the call parked");

        let resumed = parked.resume(&state, "alice#1", "tc__elicit", Some(&a));
        assert_eq!(resumed.map(|i| i.server), Some("tc".to_string()));
        let Ok(ClientResult::ElicitResult(r)) = replied.await.unwrap() else {
            panic!("the child's request gets the client's answer")
        };
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"action": "accept", "content": {"answer": "teal"}})
        );
        assert!(
            parked
                .resume(&state, "alice#1", "tc__elicit", Some(&a))
                .is_none()
        );
        assert_eq!(parked.count(), 0);
    }

    #[tokio::test]
    async fn a_retry_without_an_answer_refuses_the_childs_request_with_a_stable_code() {
        let parked = ParkedCalls::default();
        let (reply, replied) = oneshot::channel();
        let ttl = Duration::from_secs(60);
        let r = parked.park(
            inflight(),
            (elicit(), reply),
            "alice#1".into(),
            "t".into(),
            ttl,
        );
        let state = state_of(r.unwrap());
        assert!(parked.resume(&state, "alice#1", "t", None).is_some());
        let e = replied.await.unwrap().unwrap_err();
        assert_eq!(e.data, Some(json!({"code": "relay-input-failed"})));
    }

    #[tokio::test]
    async fn expired_calls_are_cancelled_when_the_next_one_parks() {
        let parked = ParkedCalls::default();
        let first = inflight();
        let first_ct = first.call_ct.clone();
        let (reply, _r1) = oneshot::channel();
        parked
            .park(
                first,
                (elicit(), reply),
                "a#1".into(),
                "t".into(),
                Duration::ZERO,
            )
            .unwrap();
        let (reply, _r2) = oneshot::channel();
        parked
            .park(
                inflight(),
                (elicit(), reply),
                "a#1".into(),
                "t".into(),
                Duration::ZERO,
            )
            .unwrap();
        assert!(
            first_ct.is_cancelled(),
            "the expired call's child request is cancelled"
        );
        assert_eq!(parked.count(), 1);
    }
}
