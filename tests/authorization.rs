//! The multiplexer's authorization decisions, as a specification: one real test child behind a
//! `Multiplexer`, callers of each scope on sessions with a fake notifier, and what each may see
//! and do. Nothing here goes through HTTP: these are the decisions the protocol layer relies on.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use graph_os::auth::{Identity, Scope};
use graph_os::config::{AdmissionContext, validate_document};
use graph_os::mux::{
    CallContext, Caller, ClientCaps, FindToolsArgs, LoadArgs, Multiplexer, MuxError, MuxSettings,
    NotifyOutcome, SessionNotifier,
};
use rmcp::model::{CallToolRequestParams, ReadResourceRequestParams};

/// Counts list_changed notifications; has no stream.
#[derive(Default)]
struct FakeNotifier(AtomicUsize);

impl SessionNotifier for FakeNotifier {
    fn tools_changed(&self) -> BoxFuture<'static, NotifyOutcome> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { NotifyOutcome::NoStream })
    }
    fn resource_updated(&self, _uri: String) -> BoxFuture<'static, NotifyOutcome> {
        Box::pin(async { NotifyOutcome::NoStream })
    }
}

fn testchild() -> String {
    std::path::Path::new(env!("CARGO_BIN_EXE_graph-os"))
        .with_file_name("graph-os-testchild")
        .display()
        .to_string()
}

async fn fleet() -> (Arc<Multiplexer>, tempfile::TempDir) {
    fleet_of(serde_json::json!({"mcpServers": {
        "open": {"command": testchild(), "prefix": "open"},
        "admin": {"command": testchild(), "requiredScopes": ["manage"], "prefix": "admin"},
        "eager": {"command": testchild(), "expose": "eager", "prefix": "eager"},
    }}))
    .await
}

async fn fleet_of(doc: serde_json::Value) -> (Arc<Multiplexer>, tempfile::TempDir) {
    let state = tempfile::tempdir().unwrap();
    let fleet = validate_document(&doc, "test", &AdmissionContext::default());
    assert!(fleet.issues.is_empty(), "{:?}", fleet.issues);
    let mux = Multiplexer::start(
        fleet,
        MuxSettings {
            state_dir: state.path().to_path_buf(),
            ..Default::default()
        },
    )
    .expect("the multiplexer starts");
    // Wait until every child lists its tools.
    for _ in 0..200 {
        if mux
            .children_overview()
            .iter()
            .all(|c| c.tools > 0 && c.state == graph_os::mux::ChildState::Up)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (mux, state)
}

fn caller(mux: &Multiplexer, scope: Scope) -> Caller {
    let identity = Identity::anonymous(format!("test-{scope:?}"), scope);
    Caller::new(
        identity,
        mux.open_session(Arc::new(FakeNotifier::default())),
        ClientCaps::default(),
    )
}

fn call(name: &str) -> CallToolRequestParams {
    let mut p = CallToolRequestParams::new(name.to_string());
    p.arguments = serde_json::json!({"a": 1, "b": 2}).as_object().cloned();
    p
}

fn denied<T: std::fmt::Debug>(r: Result<T, MuxError>) -> bool {
    matches!(r, Err(MuxError::Denied { .. }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_scope_gets_exactly_its_operations() {
    let (mux, _state) = fleet().await;
    let discover = caller(&mux, Scope::Discover);
    let delegate = caller(&mux, Scope::Delegate);
    let cx = CallContext::default;

    // discover: may look, may not reach a child.
    let found = mux
        .find_tools(
            &discover,
            FindToolsArgs {
                query: "add two numbers".into(),
                top_k: 50,
            },
        )
        .await
        .unwrap();
    assert!(found.results.iter().any(|r| r.name == "open__add"));
    assert!(denied(
        mux.load_tools(
            &discover,
            LoadArgs {
                tools: vec!["open__add".into()],
                servers: vec![]
            }
        )
        .await
    ));
    assert!(denied(
        mux.call_tool(&discover, call("eager__add"), cx()).await
    ));
    assert!(denied(
        mux.read_resource(
            &discover,
            ReadResourceRequestParams::new("test://hello"),
            cx()
        )
        .await
    ));
    assert!(mux.list_tools(&discover).unwrap().is_empty());

    // delegate: loads and calls; an unloaded lazy tool is "not loaded", an eager one is callable.
    assert!(matches!(
        mux.call_tool(&delegate, call("open__add"), cx()).await,
        Err(MuxError::NotLoaded { .. })
    ));
    let eager = mux
        .call_tool(&delegate, call("eager__add"), cx())
        .await
        .unwrap();
    assert_eq!(text_of(eager), "3");
    let loaded = mux
        .load_tools(
            &delegate,
            LoadArgs {
                tools: vec!["open__add".into()],
                servers: vec![],
            },
        )
        .await
        .unwrap();
    assert_eq!(loaded.loaded, ["open__add"]);
    assert!(
        mux.call_tool(&delegate, call("open__add"), cx())
            .await
            .is_ok()
    );
    // …and sees status, but is refused the admin operations.
    assert!(mux.status(&delegate).is_ok());
    let refused = mux
        .refresh(&delegate, serde_json::json!({}))
        .await
        .unwrap_err();
    assert_eq!(refused.code.as_str(), "authorization-denied");
    mux.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_scope_makes_a_child_invisible_and_unusable_below_it() {
    let (mux, _state) = fleet().await;
    let delegate = caller(&mux, Scope::Delegate);
    let manage = caller(&mux, Scope::Manage);
    let cx = CallContext::default;

    let seen = |c: &Caller| {
        let mux = mux.clone();
        let c = c.clone();
        async move {
            let found = mux
                .find_tools(
                    &c,
                    FindToolsArgs {
                        query: "add two numbers echo".into(),
                        top_k: 100,
                    },
                )
                .await
                .unwrap();
            let mut servers: Vec<String> = found.results.into_iter().map(|r| r.server).collect();
            servers.sort();
            servers.dedup();
            servers
        }
    };
    assert_eq!(seen(&delegate).await, ["eager", "open"]);
    assert_eq!(seen(&manage).await, ["admin", "eager", "open"]);
    let catalog = mux
        .list_catalog(&delegate, Default::default())
        .await
        .unwrap();
    assert_eq!(catalog["total_servers"], 2);
    assert!(
        !mux.status(&delegate).unwrap()["children"]
            .as_object()
            .unwrap()
            .contains_key("admin")
    );
    let prompts = mux.list_prompts(&delegate).await.unwrap();
    assert!(prompts.iter().all(|p| !p.name.starts_with("admin")));

    let load = mux
        .load_tools(
            &delegate,
            LoadArgs {
                tools: vec!["admin__add".into()],
                servers: vec!["admin".into()],
            },
        )
        .await
        .unwrap();
    // A hidden server is answered exactly as a missing one (no existence oracle).
    assert_eq!(load.failed["admin__add"].code, "tool-not-in-catalog");
    assert_eq!(load.failed["admin"].code, "server-not-in-fleet");
    assert!(denied(
        mux.call_tool(&delegate, call("admin__add"), cx()).await
    ));

    mux.load_tools(
        &manage,
        LoadArgs {
            tools: vec!["admin__add".into()],
            servers: vec![],
        },
    )
    .await
    .unwrap();
    let r = mux
        .call_tool(&manage, call("admin__add"), cx())
        .await
        .unwrap();
    assert_eq!(text_of(r), "3");
    mux.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hidden_childs_skills_are_neither_found_nor_readable_below_its_scope() {
    let (mux, _state) = fleet_of(serde_json::json!({"mcpServers": {
        "secret": {"command": testchild(), "args": ["--skills"], "requiredScopes": ["manage"]},
        "open": {"command": testchild()},
    }}))
    .await;
    let delegate = caller(&mux, Scope::Delegate);
    let manage = caller(&mux, Scope::Manage);
    let query = || FindToolsArgs {
        query: "write the release notes for a new version".into(),
        top_k: 100,
    };
    let uri = "skill://release-notes/SKILL.md";
    let below = mux.find_tools(&delegate, query()).await.unwrap();
    assert!(
        below
            .results
            .iter()
            .all(|r| r.kind == "tool" && r.server == "open")
    );
    assert!(matches!(
        mux.read_resource(
            &delegate,
            ReadResourceRequestParams::new(uri),
            CallContext::default()
        )
        .await,
        Err(MuxError::UnknownResource(_))
    ));
    let above = mux.find_tools(&manage, query()).await.unwrap();
    let top = &above.results[0];
    assert_eq!((top.kind, top.server.as_str()), ("skill", "secret"));
    assert_eq!(top.uri.as_deref(), Some(uri));
    let read = mux
        .read_resource(
            &manage,
            ReadResourceRequestParams::new(uri),
            CallContext::default(),
        )
        .await
        .unwrap();
    let rmcp::model::ReadResourceResponse::Complete(read) = read else {
        panic!("a complete read")
    };
    assert_eq!(read.contents.len(), 1);
    mux.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_child_the_caller_cannot_see_is_never_waited_for() {
    let (mux, _state) = fleet_of(serde_json::json!({"mcpServers": {
        "open": {"command": testchild()},
    }}))
    .await;
    // A second fleet version adds a hidden child that takes 3 s to initialize.
    let doc = serde_json::json!({"mcpServers": {
        "open": {"command": testchild()},
        "secret": {"command": testchild(), "args": ["--init-delay-ms", "3000"],
                   "requiredScopes": ["manage"]},
    }});
    mux.reload(Ok(validate_document(
        &doc,
        "test",
        &AdmissionContext::default(),
    )))
    .await
    .unwrap();
    let delegate = caller(&mux, Scope::Delegate);
    let started = std::time::Instant::now();
    let found = mux
        .find_tools(
            &delegate,
            FindToolsArgs {
                query: "the secret add tool".into(),
                top_k: 5,
            },
        )
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert!(found.waited_for.is_empty());
    assert!(!found.unavailable.contains_key("secret"));
    // The caller who may see it waits for it.
    let manage = caller(&mux, Scope::Manage);
    let found = mux
        .find_tools(
            &manage,
            FindToolsArgs {
                query: "the secret add tool".into(),
                top_k: 5,
            },
        )
        .await
        .unwrap();
    assert_eq!(found.waited_for, ["secret"]);
    assert_eq!(found.results[0].server, "secret");
    mux.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_arguments_never_reach_the_child() {
    let (mux, _state) = fleet().await;
    let delegate = caller(&mux, Scope::Delegate);
    let mut p = CallToolRequestParams::new("eager__echo".to_string());
    p.arguments = serde_json::json!({"text": "x".repeat(5 << 20)})
        .as_object()
        .cloned();
    let r = mux
        .call_tool(&delegate, p, CallContext::default())
        .await
        .unwrap_err();
    assert_eq!(r.code(), "request-out-of-bounds");
    let mut deep = serde_json::json!("leaf");
    for _ in 0..40 {
        deep = serde_json::json!({ "d": deep });
    }
    let mut p = CallToolRequestParams::new("eager__echo".to_string());
    p.arguments = serde_json::json!({ "text": deep }).as_object().cloned();
    let r = mux
        .call_tool(&delegate, p, CallContext::default())
        .await
        .unwrap_err();
    assert_eq!(r.code(), "request-out-of-bounds");
    mux.shutdown().await;
}

/// The text of a completed call.
fn text_of(r: rmcp::model::CallToolResponse) -> String {
    match r {
        rmcp::model::CallToolResponse::Complete(r) => r.content[0].as_text().unwrap().text.clone(),
        other => panic!("expected a complete result, got {other:?}"),
    }
}
