//! Sessions shared by replicas, as a specification of the multiplexer's side: two multiplexers
//! (two replicas, each with its own real test child) over one session store. A session's
//! loaded set is written to the store first and read from it by whichever replica serves the
//! next request; notifications go to the replica holding the session's stream; a store that
//! does not answer refuses the change and leaves the session as it was.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use graph_os::auth::{Identity, Scope};
use graph_os::config::{AdmissionContext, validate_document};
use graph_os::mux::session_store::{
    Fetched, MemoryStore, Notice, SessionKey, SessionRecord, SessionStore, SessionStoreError,
    StoreBinding, StoreFuture, StoreTtl,
};
use graph_os::mux::{
    CallContext, Caller, ClientCaps, LoadArgs, Multiplexer, MuxSettings, NotificationState,
};
use rmcp::model::CallToolRequestParams;

fn testchild() -> String {
    std::path::Path::new(env!("CARGO_BIN_EXE_graph-os"))
        .with_file_name("graph-os-testchild")
        .display()
        .to_string()
}

/// One replica: a multiplexer with one test child (`tc`).
async fn replica() -> (Arc<Multiplexer>, tempfile::TempDir) {
    let state = tempfile::tempdir().unwrap();
    let doc = serde_json::json!({"mcpServers": {"tc": {"command": testchild(), "prefix": "tc"}}});
    let fleet = validate_document(&doc, "test", &AdmissionContext::default());
    let mux = Multiplexer::start(
        fleet,
        MuxSettings {
            state_dir: state.path().to_path_buf(),
            ..Default::default()
        },
    )
    .expect("the multiplexer starts");
    for _ in 0..200 {
        if mux.children_overview().iter().all(|c| c.tools > 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (mux, state)
}

fn shared_store() -> Arc<MemoryStore> {
    MemoryStore::new(
        StoreTtl {
            session: Duration::from_secs(60),
            principal: Duration::from_secs(60),
        },
        100,
    )
}

/// The caller of a request on `mux` for the stored session `key`, its loaded set read from the
/// store as the HTTP layer does at the start of every request.
async fn caller(mux: &Multiplexer, store: &Arc<MemoryStore>, key: &SessionKey) -> Caller {
    let loaded = store
        .fetch(key)
        .await
        .unwrap()
        .map(|f| f.loaded)
        .unwrap_or_default();
    let binding = StoreBinding {
        store: store.clone() as Arc<dyn SessionStore>,
        key: key.clone(),
    };
    Caller::new(
        Identity::anonymous("alice", Scope::Delegate),
        mux.open_stored_session(binding, loaded),
        ClientCaps::default(),
    )
}

fn load(tools: &[&str]) -> LoadArgs {
    LoadArgs {
        tools: tools.iter().map(|t| t.to_string()).collect(),
        servers: vec![],
    }
}

fn visible(mux: &Multiplexer, c: &Caller) -> BTreeSet<String> {
    mux.visible_tools(&c.session)
        .into_iter()
        .map(|t| t.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_loaded_through_one_replica_is_visible_and_callable_on_the_other() {
    let ((a, _sa), (b, _sb)) = (replica().await, replica().await);
    let store = shared_store();
    let key = SessionKey::session("s1").unwrap();
    store.create(&key, &SessionRecord::default()).await.unwrap();

    let on_a = caller(&a, &store, &key).await;
    let r = a.load_tools(&on_a, load(&["tc__add"])).await.unwrap();
    assert_eq!(r.loaded, vec!["tc__add".to_string()]);

    let on_b = caller(&b, &store, &key).await;
    assert!(visible(&b, &on_b).contains("tc__add"));
    let mut call = CallToolRequestParams::new("tc__add");
    call.arguments = serde_json::json!({"a": 2, "b": 3}).as_object().cloned();
    let result = b
        .call_tool(&on_b, call, CallContext::default())
        .await
        .unwrap();
    let rmcp::model::CallToolResponse::Complete(result) = result else {
        panic!("a complete result")
    };
    assert_eq!(result.content[0].as_text().unwrap().text, "5");

    // Unloaded through B: A's next request sees it gone.
    b.unload_tools(&on_b, load(&["tc__add"])).await.unwrap();
    let on_a = caller(&a, &store, &key).await;
    assert!(!visible(&a, &on_a).contains("tc__add"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_loads_through_two_replicas_into_one_principal_both_land() {
    let ((a, _sa), (b, _sb)) = (replica().await, replica().await);
    let store = shared_store();
    let key = SessionKey::principal("token:alice");
    store.create(&key, &SessionRecord::default()).await.unwrap();
    for _ in 0..20 {
        // Both read the same (empty) set, then load different tools at once.
        let (on_a, on_b) = (
            caller(&a, &store, &key).await,
            caller(&b, &store, &key).await,
        );
        let (ra, rb) = tokio::join!(
            a.load_tools(&on_a, load(&["tc__add"])),
            b.load_tools(&on_b, load(&["tc__echo"]))
        );
        ra.unwrap();
        rb.unwrap();
        let loaded = store.fetch(&key).await.unwrap().unwrap().loaded;
        assert!(
            loaded.contains("tc__add") && loaded.contains("tc__echo"),
            "{loaded:?}"
        );
        let (on_a, on_b) = (
            caller(&a, &store, &key).await,
            caller(&b, &store, &key).await,
        );
        let (ra, rb) = tokio::join!(
            a.unload_tools(&on_a, load(&["tc__add"])),
            b.unload_tools(&on_b, load(&["tc__echo"]))
        );
        ra.unwrap();
        rb.unwrap();
        assert!(store.fetch(&key).await.unwrap().unwrap().loaded.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_change_goes_to_the_replica_holding_the_stream_else_waits() {
    let (a, _sa) = replica().await;
    let store = shared_store();
    let key = SessionKey::session("s2").unwrap();
    store.create(&key, &SessionRecord::default()).await.unwrap();
    let on_a = caller(&a, &store, &key).await;

    // No replica holds a stream: the change waits for the session's next request.
    let r = a.load_tools(&on_a, load(&["tc__add"])).await.unwrap();
    assert_eq!(r.notification, NotificationState::NoStream);
    assert!(store.fetch(&key).await.unwrap().unwrap().pending);

    // Replica B holds the session's GET stream: it is told.
    let mut notices = store.notices();
    store.hold(&key, true).await.unwrap();
    a.load_tools(&on_a, load(&["tc__echo"])).await.unwrap();
    let (to, notice) = tokio::time::timeout(Duration::from_secs(5), notices.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((to, notice), (key.clone(), Notice::ToolsChanged));
    assert!(!store.fetch(&key).await.unwrap().unwrap().pending);
}

/// A store that never answers.
struct Down;

fn down<'a, T: Send + 'a>() -> StoreFuture<'a, T> {
    Box::pin(async { Err(SessionStoreError("connection refused".into())) })
}

impl SessionStore for Down {
    fn kind(&self) -> &'static str {
        "redis"
    }
    fn create(&self, _: &SessionKey, _: &SessionRecord) -> StoreFuture<'_, bool> {
        down()
    }
    fn fetch(&self, _: &SessionKey) -> StoreFuture<'_, Option<Fetched>> {
        down()
    }
    fn read(&self, _: &SessionKey) -> StoreFuture<'_, Option<SessionRecord>> {
        down()
    }
    fn change_loaded(
        &self,
        _: &SessionKey,
        _: Vec<String>,
        _: Vec<String>,
    ) -> StoreFuture<'_, BTreeSet<String>> {
        down()
    }
    fn remove(&self, _: &SessionKey) -> StoreFuture<'_, ()> {
        down()
    }
    fn notify(&self, _: &SessionKey, _: Notice) -> StoreFuture<'_, bool> {
        down()
    }
    fn hold(&self, _: &SessionKey, _: bool) -> StoreFuture<'_, ()> {
        down()
    }
    fn notices(&self) -> tokio::sync::broadcast::Receiver<(SessionKey, Notice)> {
        tokio::sync::broadcast::channel(1).1
    }
    fn health(&self) -> Result<(), String> {
        Err("connection refused".into())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_does_not_answer_refuses_the_change_and_keeps_the_session_as_it_was() {
    let (a, _sa) = replica().await;
    let binding = StoreBinding {
        store: Arc::new(Down),
        key: SessionKey::session("s3").unwrap(),
    };
    let on_a = Caller::new(
        Identity::anonymous("alice", Scope::Delegate),
        a.open_stored_session(binding, BTreeSet::new()),
        ClientCaps::default(),
    );
    let err = a.load_tools(&on_a, load(&["tc__add"])).await.unwrap_err();
    assert_eq!(err.code(), "session-store-unavailable");
    assert!(
        on_a.session.loaded().is_empty(),
        "no private copy diverges from the store"
    );
}
