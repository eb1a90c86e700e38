//! One admission pipeline for every way a call reaches a child (`graph_os::mux::pipeline`): a
//! stage a deployment adds refuses on the typed path, the hot path and `catalog_dispatch` alike,
//! and a call it lets through is served on each of them. A real test child behind a
//! `Multiplexer`; no HTTP.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use graph_os::auth::{Identity, Scope};
use graph_os::config::{AdmissionContext, validate_document};
use graph_os::mux::pipeline::{Admission, CallStage, Destination, Entry, Stages};
use graph_os::mux::{
    CallContext, Caller, ClientCaps, Dispatched, FastCall, Multiplexer, MuxError, MuxSettings,
    NotifyOutcome, SessionNotifier,
};
use rmcp::model::{CallToolRequestParams, CallToolResponse, GetTaskParams};

struct Quiet;

impl SessionNotifier for Quiet {
    fn tools_changed(&self) -> BoxFuture<'static, NotifyOutcome> {
        Box::pin(async { NotifyOutcome::NoStream })
    }
    fn resource_updated(&self, _uri: String) -> BoxFuture<'static, NotifyOutcome> {
        Box::pin(async { NotifyOutcome::NoStream })
    }
}

/// Refuses every call of the child's `add`, whatever its exposed name or path.
struct NoAdding;

impl CallStage for NoAdding {
    fn name(&self) -> &'static str {
        "no-adding"
    }
    fn check(&self, call: &Admission<'_>, to: Destination<'_>) -> Result<(), MuxError> {
        assert!(!call.name.is_empty() && to.server == "tc");
        if to.original == "add" {
            return Err(MuxError::stage(
                "no-adding",
                "refused-by-stage",
                "no adding here",
            ));
        }
        Ok(())
    }
}

fn testchild() -> String {
    std::path::Path::new(env!("CARGO_BIN_EXE_graph-os"))
        .with_file_name("graph-os-testchild")
        .display()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_stage_refuses_on_every_path_and_lets_the_rest_through() {
    let state = tempfile::tempdir().unwrap();
    let doc = serde_json::json!({"mcpServers": {"tc": {"command": testchild(), "prefix": "tc", "expose": "eager"}}});
    let fleet = validate_document(&doc, "test", &AdmissionContext::default());
    let mux = Multiplexer::start(
        fleet,
        MuxSettings {
            state_dir: state.path().to_path_buf(),
            stages: Stages(vec![Arc::new(NoAdding)]),
            ..Default::default()
        },
    )
    .expect("the multiplexer starts");
    let mut identity = serde_json::Value::Null;
    for _ in 0..200 {
        identity = mux.catalog_identity();
        if identity["catalog_generation"].as_u64() >= Some(1)
            && mux.children_overview().iter().all(|c| c.tools > 0)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let caller = Caller::new(
        Identity::anonymous("pipeline", Scope::Delegate),
        mux.open_session(Arc::new(Quiet)),
        ClientCaps::default(),
    );
    let args = serde_json::json!({"a": 1, "b": 2, "text": "hi"});
    let typed = |name: &str| {
        let mut p = CallToolRequestParams::new(name.to_string());
        p.arguments = args.as_object().cloned();
        p
    };
    let hot = |name: &str| FastCall {
        name: name.into(),
        arguments: Some(serde_json::value::to_raw_value(&args).unwrap()),
        meta: None,
    };
    let dispatch = |name: &str| {
        serde_json::json!({
            "tool_name": name, "arguments": args,
            "expected_catalog_generation": identity["catalog_generation"],
            "expected_snapshot_digest": identity["snapshot_digest"],
        })
    };

    // Refused on the typed path, not taken by the hot path (whose refusals go the typed way,
    // which answers them), refused by catalog_dispatch: the child never sees it.
    let refused = mux
        .call_tool(&caller, typed("tc__add"), CallContext::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), "refused-by-stage");
    assert!(mux.fast_target(&caller, &hot("tc__add"), false).is_none());
    match mux
        .dispatch(&caller, dispatch("tc__add"), CallContext::default())
        .await
    {
        Ok(Dispatched::Failed(e)) => assert_eq!(e.code(), "refused-by-stage"),
        Ok(Dispatched::Result(r)) => panic!("dispatched past the stage: {r:?}"),
        Err(e) => panic!("contract error instead of the stage's refusal: {e:?}"),
    }

    // A call the stage lets through is served on each path.
    assert!(
        mux.call_tool(&caller, typed("tc__echo"), CallContext::default())
            .await
            .is_ok()
    );
    assert!(mux.fast_target(&caller, &hot("tc__echo"), false).is_some());
    assert!(matches!(
        mux.dispatch(&caller, dispatch("tc__echo"), CallContext::default())
            .await,
        Ok(Dispatched::Result(_))
    ));
    mux.shutdown().await;
}

/// Lets task creation through and refuses every request that follows a task, recording what it
/// saw of each.
#[derive(Default)]
struct NoFollowUps(std::sync::Mutex<Vec<(Entry, String, String)>>);

impl CallStage for NoFollowUps {
    fn name(&self) -> &'static str {
        "no-follow-ups"
    }
    fn check(&self, call: &Admission<'_>, to: Destination<'_>) -> Result<(), MuxError> {
        self.0
            .lock()
            .unwrap()
            .push((call.entry, call.name.to_string(), to.original.to_string()));
        if call.entry == Entry::TaskFollowUp {
            return Err(MuxError::stage(
                "no-follow-ups",
                "refused-by-stage",
                "no follow-ups",
            ));
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_requests_that_follow_a_task_pass_the_deployment_stages_too() {
    let state = tempfile::tempdir().unwrap();
    let doc = serde_json::json!({"mcpServers": {"tc": {
        "command": testchild(), "args": ["--tasks"], "prefix": "tc", "expose": "eager"
    }}});
    let fleet = validate_document(&doc, "test", &AdmissionContext::default());
    let stage = Arc::new(NoFollowUps::default());
    let mux = Multiplexer::start(
        fleet,
        MuxSettings {
            state_dir: state.path().to_path_buf(),
            stages: Stages(vec![stage.clone()]),
            ..Default::default()
        },
    )
    .expect("the multiplexer starts");
    for _ in 0..200 {
        if mux.children_overview().iter().all(|c| c.tools > 0) && mux.tasks_extension() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let caller = Caller::new(
        Identity::anonymous("pipeline", Scope::Delegate),
        mux.open_session(Arc::new(Quiet)),
        ClientCaps {
            tasks: true,
            ..ClientCaps::default()
        },
    );
    let mut params = CallToolRequestParams::new("tc__task_work");
    params.arguments = serde_json::json!({"ms": 200}).as_object().cloned();
    let created = mux
        .call_tool(&caller, params, CallContext::default())
        .await
        .expect("the stage lets the creation through");
    let CallToolResponse::Task(created) = created else {
        panic!("no task: {created:?}");
    };
    let refused = mux
        .task_ext_get(
            &caller,
            GetTaskParams::new(created.task.task_id.clone()),
            CallContext::default(),
        )
        .await
        .expect_err("the follow-up is refused by the stage");
    assert_eq!(refused.code(), "refused-by-stage");
    let seen = stage.0.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            (Entry::Call, "tc__task_work".into(), "task_work".into()),
            (
                Entry::TaskFollowUp,
                "tc__task_work".into(),
                "task_work".into()
            ),
        ]
    );
    mux.shutdown().await;
}
