//! The child runtime's isolation rules as specifications, each built without a process: the
//! runtime reaches an in-memory MCP child (`child::memory`) through the connector seam.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::model::{CallToolRequestParams, CallToolResponse};
use tokio_util::sync::CancellationToken;

use super::memory::{Memory, Script};
use super::{BreakerState, CallError, ChildRuntime, ChildState};
use super::{Reresolve, Retry, SessionTag};
use crate::config::{AdmissionContext, ChildSpec, validate_document};
use crate::probe::ProbeBounds;

/// A child spec with the runtime's default limits, then `limits` applied.
fn spec(limits: impl FnOnce(&mut ChildSpec)) -> ChildSpec {
    let doc = serde_json::json!({"mcpServers": {"mem": {"command": "in-memory"}}});
    let fleet = validate_document(&doc, "spec", &AdmissionContext::default());
    let (_, mut spec) = fleet.children.into_iter().next().expect("admitted");
    limits(&mut spec);
    spec
}

async fn start(script: &Arc<Script>, limits: impl FnOnce(&mut ChildSpec)) -> Arc<ChildRuntime> {
    let rt = ChildRuntime::start_with(
        spec(limits),
        ProbeBounds::default(),
        None,
        Arc::new(Memory::new([("mem", script)])),
    );
    let status = rt.wait_settled(Duration::from_secs(10)).await;
    assert_eq!(status.state, ChildState::Up, "{:?}", status.last_error);
    rt
}

async fn call(
    rt: &ChildRuntime,
    tool: &str,
    retry: Retry,
    ct: CancellationToken,
    session: Option<&SessionTag>,
) -> Result<String, CallError> {
    let params = CallToolRequestParams::new(tool.to_string());
    match rt.call_tool(params, retry, None, ct, session).await? {
        CallToolResponse::Complete(r) => Ok(r
            .content
            .first()
            .and_then(|c| c.as_text())
            .map(|t| t.text.clone())
            .unwrap_or_default()),
        other => panic!("unexpected answer {other:?}"),
    }
}

fn principal(name: &str) -> (SessionTag, Arc<()>) {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let alive = Arc::new(());
    (
        SessionTag {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            alive: Arc::downgrade(&alive),
            principal: Arc::from(name),
        },
        alive,
    )
}

/// Counts resolutions and answers each with `answer`.
struct Resolution {
    count: AtomicU64,
    refuse: bool,
}

impl Reresolve for Resolution {
    fn reresolve(&self) -> BoxFuture<'_, Result<(), CallError>> {
        self.count.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            if self.refuse {
                Err(CallError::Refused {
                    code: "drift-pending",
                    message: "the recovered child's catalog is held".into(),
                })
            } else {
                Ok(())
            }
        })
    }
}

fn resolution(refuse: bool) -> Arc<Resolution> {
    Arc::new(Resolution {
        count: AtomicU64::new(0),
        refuse,
    })
}

async fn wait_for(rt: &ChildRuntime, what: impl Fn(&super::ChildStatus) -> bool) {
    let mut rx = rt.subscribe();
    tokio::time::timeout(Duration::from_secs(20), rx.wait_for(|s| what(s)))
        .await
        .expect("in time")
        .expect("runtime alive");
}

const TOOLS: &[(&str, &str)] = &[
    ("echo", "answers"),
    ("hang", "never answers"),
    ("slow", "answers late"),
    ("crash", "kills its instance"),
    ("crash-first", "kills the first instance"),
];

#[tokio::test]
async fn a_call_that_waits_longer_than_the_queue_timeout_for_a_slot_is_refused_busy() {
    let script = Script::new(TOOLS);
    let rt = start(&script, |s| {
        s.limits.max_concurrency = 1;
        s.limits.queue_timeout = Duration::from_millis(100);
    })
    .await;
    let holder = CancellationToken::new();
    let held = {
        let (rt, ct) = (rt.clone(), holder.clone());
        tokio::spawn(async move { call(&rt, "hang", None, ct, None).await })
    };
    while rt.load().in_flight == 0 {
        tokio::task::yield_now().await;
    }
    let refused = call(&rt, "echo", None, CancellationToken::new(), None).await;
    assert!(
        matches!(refused, Err(CallError::Busy { .. })),
        "{refused:?}"
    );
    assert_eq!(refused.unwrap_err().code(), "child-busy");
    assert_eq!(rt.load().queued, 0, "the refused call left the queue");
    assert!(
        !script.calls().iter().any(|(_, t)| t == "echo"),
        "nothing was sent to the child"
    );
    // The slot frees when the holder ends; the next call is served.
    holder.cancel();
    assert!(matches!(held.await.unwrap(), Err(CallError::Cancelled)));
    assert_eq!(
        call(&rt, "echo", None, CancellationToken::new(), None)
            .await
            .unwrap(),
        "instance 1"
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn a_principal_at_its_share_waits_for_its_own_calls_while_another_principal_is_served() {
    let script = Script::new(TOOLS);
    let rt = start(&script, |s| {
        s.limits.max_concurrency = 2;
        s.limits.max_concurrency_per_principal = 1;
        s.limits.queue_timeout = Duration::from_millis(150);
    })
    .await;
    let (alice, _a) = principal("alice");
    let (alice_again, _a2) = principal("alice");
    let (bob, _b) = principal("bob");
    let holder = CancellationToken::new();
    let held = {
        let (rt, ct, tag) = (rt.clone(), holder.clone(), alice.clone());
        tokio::spawn(async move { call(&rt, "hang", None, ct, Some(&tag)).await })
    };
    while rt.load().in_flight == 0 {
        tokio::task::yield_now().await;
    }
    // Alice's second session shares her principal's share: it waits, then is refused …
    let refused = call(
        &rt,
        "echo",
        None,
        CancellationToken::new(),
        Some(&alice_again),
    )
    .await;
    assert!(
        matches!(refused, Err(CallError::Busy { .. })),
        "{refused:?}"
    );
    // … while the child's other slot serves Bob at once.
    let served = call(&rt, "echo", None, CancellationToken::new(), Some(&bob)).await;
    assert_eq!(served.unwrap(), "instance 1");
    holder.cancel();
    let _ = held.await;
    rt.shutdown().await;
}

#[tokio::test]
async fn consecutive_timeouts_open_the_breaker_and_after_the_cooldown_one_probe_decides() {
    let script = Script::new(TOOLS);
    let rt = start(&script, |s| {
        s.limits.breaker_threshold = 2;
        s.limits.breaker_cooldown = Duration::from_millis(300);
        s.limits.call_timeout = Duration::from_millis(100);
    })
    .await;
    for _ in 0..2 {
        let r = call(&rt, "slow", None, CancellationToken::new(), None).await;
        assert!(matches!(r, Err(CallError::Timeout { .. })), "{r:?}");
    }
    assert_eq!(rt.breaker_state(), BreakerState::Open);
    let sent = script.calls().len();
    let r = call(&rt, "echo", None, CancellationToken::new(), None).await;
    assert_eq!(r.unwrap_err().code(), "child-circuit-open");
    assert_eq!(script.calls().len(), sent, "an open breaker sends nothing");
    // Half-open after the cooldown: the probe fails, the breaker opens again.
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(rt.breaker_state(), BreakerState::HalfOpen);
    let r = call(&rt, "slow", None, CancellationToken::new(), None).await;
    assert!(matches!(r, Err(CallError::Timeout { .. })), "{r:?}");
    assert_eq!(rt.breaker_state(), BreakerState::Open);
    // Half-open again: a successful probe closes it.
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(rt.breaker_state(), BreakerState::HalfOpen);
    assert_eq!(
        call(&rt, "echo", None, CancellationToken::new(), None)
            .await
            .unwrap(),
        "instance 1"
    );
    assert_eq!(rt.breaker_state(), BreakerState::Closed);
    rt.shutdown().await;
}

#[tokio::test]
async fn a_child_that_keeps_dying_exhausts_its_restart_budget_and_fails_closed() {
    let script = Script::new(TOOLS);
    let rt = start(&script, |s| {
        s.limits.max_restarts = 2;
        s.limits.restart_window = Duration::from_secs(60);
    })
    .await;
    for generation in 1..=3 {
        wait_for(&rt, |s| {
            s.state == ChildState::Up && s.connection_generation == generation
        })
        .await;
        script.crash();
    }
    wait_for(&rt, |s| s.state == ChildState::Failed).await;
    let status = rt.status();
    assert_eq!(status.restarts, 2);
    assert_eq!(
        status.last_error.map(|e| e.code).as_deref(),
        Some("restart-budget-exhausted")
    );
    assert_eq!(script.dials.load(Ordering::SeqCst), 3, "no fourth start");
    let r = call(&rt, "echo", None, CancellationToken::new(), None).await;
    assert_eq!(r.unwrap_err().code(), "child-unavailable");
    rt.shutdown().await;
}

#[tokio::test]
async fn a_child_that_cannot_start_is_retried_within_the_budget_then_keeps_its_own_error() {
    let script = Script::new(TOOLS);
    script.refuse.store(true, Ordering::SeqCst);
    let rt = ChildRuntime::start_with(
        spec(|s| s.limits.max_restarts = 1),
        ProbeBounds::default(),
        None,
        Arc::new(Memory::new([("mem", &script)])),
    );
    wait_for(&rt, |s| s.state == ChildState::Failed).await;
    let status = rt.status();
    let error = status.last_error.expect("an error");
    assert_eq!(
        error.code, "child-initialize-failed",
        "the boot failure's own code"
    );
    assert!(
        error.message.contains("gave up after 2 attempts"),
        "{}",
        error.message
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn a_read_only_call_that_died_with_its_child_is_retried_once_after_resolving_again() {
    let script = Script::new(TOOLS);
    let rt = start(&script, |_| {}).await;
    let check = resolution(false);
    let retry: Retry = Some(check.clone());
    let answer = call(&rt, "crash-first", retry, CancellationToken::new(), None).await;
    assert_eq!(
        answer.unwrap(),
        "instance 2",
        "answered by the restarted child"
    );
    assert_eq!(check.count.load(Ordering::SeqCst), 1, "resolved once");
    assert_eq!(
        script.calls(),
        [
            (1, "crash-first".to_string()),
            (2, "crash-first".to_string())
        ]
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn a_read_only_call_is_retried_at_most_once() {
    let script = Script::new(TOOLS);
    let rt = start(&script, |_| {}).await;
    let check = resolution(false);
    let answer = call(
        &rt,
        "crash",
        Some(check.clone()),
        CancellationToken::new(),
        None,
    )
    .await;
    assert_eq!(answer.unwrap_err().code(), "child-transport-closed");
    assert_eq!(check.count.load(Ordering::SeqCst), 1);
    assert_eq!(script.calls().len(), 2, "the first attempt and one retry");
    rt.shutdown().await;
}

#[tokio::test]
async fn a_retry_its_resolution_refuses_is_not_sent_and_answers_with_the_refusal() {
    let script = Script::new(TOOLS);
    let rt = start(&script, |_| {}).await;
    let check = resolution(true);
    let answer = call(
        &rt,
        "crash-first",
        Some(check.clone()),
        CancellationToken::new(),
        None,
    )
    .await;
    assert_eq!(answer.unwrap_err().code(), "drift-pending");
    assert_eq!(check.count.load(Ordering::SeqCst), 1);
    assert_eq!(script.calls(), [(1, "crash-first".to_string())]);
    rt.shutdown().await;
}

#[tokio::test]
async fn a_call_that_is_not_read_only_is_never_retried() {
    let script = Script::new(TOOLS);
    let rt = start(&script, |_| {}).await;
    let answer = call(&rt, "crash-first", None, CancellationToken::new(), None).await;
    assert_eq!(answer.unwrap_err().code(), "child-transport-closed");
    // The child restarts on its own, but the call is not sent again.
    wait_for(&rt, |s| {
        s.state == ChildState::Up && s.connection_generation == 2
    })
    .await;
    assert_eq!(script.calls(), [(1, "crash-first".to_string())]);
    rt.shutdown().await;
}

#[tokio::test]
async fn a_recovered_child_publishes_its_changed_catalog_before_it_takes_calls() {
    let script = Script::new(TOOLS);
    let rt = start(&script, |_| {}).await;
    let before = rt.status().fingerprint.clone();
    script.set_tools(&[("echo", "answers, differently now")]);
    script.crash();
    let mut rx = rt.subscribe();
    let up = tokio::time::timeout(
        Duration::from_secs(20),
        rx.wait_for(|s| s.state == ChildState::Up && s.connection_generation == 2),
    )
    .await
    .unwrap()
    .unwrap()
    .clone();
    // The first status that says "up" on the new connection already carries the new catalog.
    let catalog = up.catalog.expect("a catalog");
    let tools: Vec<_> = catalog.tools.iter().map(|t| t.name.to_string()).collect();
    assert_eq!(tools, ["echo"]);
    assert_ne!(up.fingerprint, before);
    rt.shutdown().await;
}
