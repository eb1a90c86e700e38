//! The multiplexer's fleet, view and session rules as specifications without a process: every
//! child is an in-memory MCP child (`child::memory`) reached through the connector seam.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;

use super::{Multiplexer, MuxSettings, NotifyOutcome, SessionNotifier};
use crate::child::connector::SharedConnector;
use crate::child::memory::{Memory, Script};
use crate::config::{AdmissionContext, Fleet, validate_document};

/// Counts the `tools/list_changed` notifications a session gets.
#[derive(Default)]
struct Recorder(AtomicU64);

impl SessionNotifier for Recorder {
    fn tools_changed(&self) -> BoxFuture<'static, NotifyOutcome> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { NotifyOutcome::Sent })
    }
    fn resource_updated(&self, _uri: String) -> BoxFuture<'static, NotifyOutcome> {
        Box::pin(async { NotifyOutcome::NoStream })
    }
}

fn fleet(entries: serde_json::Value) -> Fleet {
    let doc = serde_json::json!({ "mcpServers": entries });
    let fleet = validate_document(&doc, "spec", &AdmissionContext::default());
    assert!(fleet.issues.is_empty(), "{:?}", fleet.issues);
    fleet
}

fn entry(name: &str) -> serde_json::Value {
    serde_json::json!({"command": "in-memory", "prefix": name})
}

const TOOLS: &[(&str, &str)] = &[("echo", "answers"), ("crash", "kills its instance")];

async fn start(
    fleet: Fleet,
    scripts: &[(&str, &Arc<Script>)],
    state: &tempfile::TempDir,
) -> Arc<Multiplexer> {
    let mux = Multiplexer::start(
        fleet,
        MuxSettings {
            state_dir: state.path().to_path_buf(),
            connector: SharedConnector(Arc::new(Memory::new(scripts.iter().copied()))),
            ..MuxSettings::default()
        },
    )
    .expect("starts");
    let names: Vec<&str> = scripts.iter().map(|(n, _)| *n).collect();
    until(&mux, |m| {
        let view = m.view();
        names
            .iter()
            .all(|n| view.tools.contains_key(&format!("{n}__echo")))
    })
    .await;
    mux
}

/// Waits (at most 20 s) until `what` holds, freshening the view between looks.
async fn until(mux: &Multiplexer, what: impl Fn(&Multiplexer) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !what(mux) {
        assert!(tokio::time::Instant::now() < deadline, "not in time");
        mux.freshen().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn dials(script: &Script) -> u64 {
    script.dials.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_change_on_recovery_notifies_only_the_sessions_that_see_the_tool() {
    let (a, b) = (Script::new(TOOLS), Script::new(TOOLS));
    let state = tempfile::tempdir().unwrap();
    let mux = start(
        fleet(serde_json::json!({"a": entry("a"), "b": entry("b")})),
        &[("a", &a), ("b", &b)],
        &state,
    )
    .await;
    let sees_a = Arc::new(Recorder::default());
    let sees_b = Arc::new(Recorder::default());
    let sees_nothing = Arc::new(Recorder::default());
    let s1 = mux.open_session(sees_a.clone());
    let s2 = mux.open_session(sees_b.clone());
    let _s3 = mux.open_session(sees_nothing.clone());
    mux.adopt_loaded(&s1, BTreeSet::from(["a__echo".to_string()]));
    mux.adopt_loaded(&s2, BTreeSet::from(["b__echo".to_string()]));
    // `a` dies and comes back with a different schema of the tool session 1 loaded.
    a.set_tools(&[("echo", "answers, differently now"), ("crash", "kills")]);
    a.crash();
    until(&mux, |m| {
        m.view()
            .tools
            .get("a__echo")
            .is_some_and(|t| t.tool.description.as_deref() == Some("answers, differently now"))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(sees_a.0.load(Ordering::SeqCst) >= 1, "session 1 is told");
    assert_eq!(
        sees_b.0.load(Ordering::SeqCst),
        0,
        "session 2 sees no change"
    );
    assert_eq!(
        sees_nothing.0.load(Ordering::SeqCst),
        0,
        "session 3 loaded nothing"
    );
    assert_eq!(dials(&b), 1, "b was not touched");
    mux.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_starts_the_added_stops_the_removed_restarts_the_changed_and_leaves_the_rest() {
    let (a, b, c) = (Script::new(TOOLS), Script::new(TOOLS), Script::new(TOOLS));
    let state = tempfile::tempdir().unwrap();
    let scripts = [("a", &a), ("b", &b), ("c", &c)];
    let mux = Multiplexer::start(
        fleet(serde_json::json!({"a": entry("a"), "b": entry("b")})),
        MuxSettings {
            state_dir: state.path().to_path_buf(),
            connector: SharedConnector(Arc::new(Memory::new(scripts))),
            ..MuxSettings::default()
        },
    )
    .expect("starts");
    until(&mux, |m| {
        let v = m.view();
        v.tools.contains_key("a__echo") && v.tools.contains_key("b__echo")
    })
    .await;
    let report = mux
        .reload(Ok(fleet(
            serde_json::json!({"a": entry("a"), "c": entry("c")}),
        )))
        .await
        .expect("applies");
    assert_eq!(report.added, ["c"]);
    assert_eq!(report.removed, ["b"]);
    assert!(report.changed.is_empty(), "{report:?}");
    until(&mux, |m| {
        let v = m.view();
        v.tools.contains_key("c__echo") && !v.tools.contains_key("b__echo")
    })
    .await;
    let names: Vec<String> = mux
        .children_overview()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["a", "c"]);
    assert_eq!(
        (dials(&a), dials(&c)),
        (1, 1),
        "a untouched, c started once"
    );
    // A changed declaration restarts its child, and only it.
    let mut changed = entry("a");
    changed["callTimeout"] = serde_json::json!(5);
    let report = mux
        .reload(Ok(fleet(
            serde_json::json!({"a": changed, "c": entry("c")}),
        )))
        .await
        .expect("applies");
    assert_eq!(report.changed, ["a"]);
    until(&mux, |_| dials(&a) == 2).await;
    assert_eq!(dials(&c), 1);
    // An unusable version keeps the fleet.
    assert!(mux.reload(Err(Vec::new())).await.is_err());
    assert_eq!(mux.children_overview().len(), 2);
    mux.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_two_servers_claim_is_served_by_neither_until_one_leaves() {
    let (a, b) = (Script::new(TOOLS), Script::new(&[("echo", "another echo")]));
    let state = tempfile::tempdir().unwrap();
    let transparent = |_: &str| serde_json::json!({"command": "in-memory", "prefix": ""});
    let mux = Multiplexer::start(
        fleet(serde_json::json!({"a": transparent("a"), "b": transparent("b")})),
        MuxSettings {
            state_dir: state.path().to_path_buf(),
            connector: SharedConnector(Arc::new(Memory::new([("a", &a), ("b", &b)]))),
            ..MuxSettings::default()
        },
    )
    .expect("starts");
    until(&mux, |m| {
        m.view().fingerprints.len() == 2 && m.view().tools.contains_key("crash")
    })
    .await;
    let view = mux.view();
    assert!(!view.tools.contains_key("echo"), "neither serves it");
    let mut skipped: Vec<(&str, &str)> = view
        .skipped
        .iter()
        .filter(|s| s.original == "echo")
        .map(|s| (s.server.as_str(), s.code))
        .collect();
    skipped.sort();
    assert_eq!(skipped, [("a", "name-conflict"), ("b", "name-conflict")]);
    // One claimant leaves: the other serves the name.
    mux.reload(Ok(fleet(serde_json::json!({"a": transparent("a")}))))
        .await
        .expect("applies");
    until(&mux, |m| m.view().tools.contains_key("echo")).await;
    assert_eq!(mux.view().tools["echo"].server, "a");
    mux.shutdown().await;
}

/// A multiplexer over one in-memory child `a` (entry `entry`), caught the moment the child is
/// up — before the view builder, which coalesces for 20 ms, folds it in — as a client told "up"
/// by multiplexer_status would ask at once; and a caller.
async fn caught_up(
    entry: serde_json::Value,
    a: &Arc<Script>,
    state: &tempfile::TempDir,
) -> (Arc<Multiplexer>, super::Caller) {
    let mux = Multiplexer::start(
        fleet(serde_json::json!({ "a": entry })),
        MuxSettings {
            state_dir: state.path().to_path_buf(),
            connector: SharedConnector(Arc::new(Memory::new([("a", a)]))),
            ..MuxSettings::default()
        },
    )
    .expect("starts");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while mux
        .children_overview()
        .iter()
        .any(|c| c.state != super::ChildState::Up)
    {
        assert!(tokio::time::Instant::now() < deadline, "never up");
        tokio::task::yield_now().await;
    }
    let caller = super::Caller::new(
        crate::auth::Identity::anonymous("spec", crate::auth::Scope::Delegate),
        mux.open_session(Arc::new(Recorder::default())),
        crate::child::ClientCaps::default(),
    );
    (mux, caller)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_is_found_as_soon_as_its_child_is_up() {
    let (a, state) = (Script::new(TOOLS), tempfile::tempdir().unwrap());
    let (mux, caller) = caught_up(entry("a"), &a, &state).await;
    let got = mux
        .get_prompt(
            &caller,
            rmcp::model::GetPromptRequestParams::new("a__greet"),
            super::CallContext::default(),
        )
        .await
        .expect("the prompt of a child that is up");
    let rmcp::model::GetPromptResponse::Complete(got) = got else {
        panic!("no prompt: {got:?}");
    };
    let text = serde_json::to_string(&got.messages).unwrap();
    assert!(text.contains("hello from greet"), "{text}");
    mux.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eager_tool_is_callable_as_soon_as_its_child_is_up() {
    let (a, state) = (Script::new(TOOLS), tempfile::tempdir().unwrap());
    let mut eager = entry("a");
    eager["expose"] = serde_json::json!("eager");
    let (mux, caller) = caught_up(eager, &a, &state).await;
    let answer = mux
        .call_tool(
            &caller,
            rmcp::model::CallToolRequestParams::new("a__echo"),
            super::CallContext::default(),
        )
        .await
        .expect("the eager tool of a child that is up");
    let rmcp::model::CallToolResponse::Complete(answer) = answer else {
        panic!("no result: {answer:?}");
    };
    let text = serde_json::to_string(&answer).unwrap();
    assert!(text.contains("instance 1"), "{text}");
    mux.shutdown().await;
}
