//! Meta-tool argument parsing through the real entry point (`server::meta_table::call`) on a
//! running (empty-fleet) multiplexer: any tool name and any JSON arguments give a result or a
//! stable error, never a panic.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use graph_os::auth::Identity;
use graph_os::child::ClientCaps;
use graph_os::config::Fleet;
use graph_os::mux::{CallContext, Caller, Multiplexer, MuxSettings, NotifyOutcome, SessionNotifier};
use libfuzzer_sys::fuzz_target;
use rmcp::model::CallToolRequestParams;

struct Quiet;
impl SessionNotifier for Quiet {
    fn tools_changed(&self) -> BoxFuture<'static, NotifyOutcome> {
        Box::pin(async { NotifyOutcome::NoStream })
    }
    fn resource_updated(&self, _uri: String) -> BoxFuture<'static, NotifyOutcome> {
        Box::pin(async { NotifyOutcome::NoStream })
    }
}

struct World {
    rt: tokio::runtime::Runtime,
    mux: Arc<Multiplexer>,
    caller: Caller,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let state = std::env::temp_dir().join(format!("graph-os-fuzz-meta-{}", std::process::id()));
        let mux = rt.block_on(async {
            Multiplexer::start(
                Fleet::empty("fuzz"),
                MuxSettings {
                    state_dir: state,
                    ..Default::default()
                },
            )
            .expect("the multiplexer starts")
        });
        let caller = Caller::new(Identity::local(), mux.open_session(Arc::new(Quiet)), ClientCaps::default());
        World { rt, mux, caller }
    })
}

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let names = graph_os::server::META_TOOLS;
    let name = names[usize::from(data[0]) % names.len()];
    let Ok(args) = serde_json::from_slice::<serde_json::Value>(&data[1..]) else {
        return;
    };
    let mut params = CallToolRequestParams::new(name.to_string());
    params.arguments = args.as_object().cloned();
    let w = world();
    let outcome = w.rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(5),
            graph_os::server::meta_table::call(&w.mux, &w.caller, &params, CallContext::default()),
        )
        .await
    });
    let result = outcome.expect("a meta tool took longer than 5 s").expect("a meta tool name");
    let _ = serde_json::to_string(&result);
});
