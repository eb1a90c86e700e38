//! The Lease-backed generation store driven by kube's real client against the in-process API
//! emulator (`graph-os-kube-emulator`, a test-only binary of the testchild crate).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use graph_os::catalog::store::{
    Cas, GenerationRecord, GenerationStore, Heartbeat, cohort_check, now_ms,
};
use graph_os::kube::lease_store::LeaseStore;
use k8s_openapi::api::coordination::v1::Lease;

struct Emulator {
    child: Child,
    url: String,
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn emulator() -> Emulator {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_graph-os"))
        .with_file_name("graph-os-kube-emulator");
    assert!(
        bin.exists(),
        "{} is missing: run cargo build --workspace",
        bin.display()
    );
    let mut child = Command::new(bin)
        .args(["--port", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected: {line}"))
        .to_string();
    Emulator {
        child,
        url: format!("http://{addr}"),
    }
}

fn client(url: &str) -> kube::Client {
    kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap()
}

fn record(generation: u64, digest: &str, publisher: &str) -> GenerationRecord {
    GenerationRecord {
        generation,
        digest: digest.into(),
        config_revision: "c".into(),
        release_id: "r".into(),
        publisher: publisher.into(),
        updated_at: now_ms(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_publishers_never_publish_two_digests_for_one_generation() {
    let emu = emulator();
    let winners: Arc<Mutex<BTreeMap<u64, BTreeSet<String>>>> = Arc::default();
    let mut tasks = Vec::new();
    for p in 0..6 {
        let store = LeaseStore::new(
            kube::Api::<Lease>::namespaced(client(&emu.url), "mcp"),
            "fleet",
        );
        let winners = winners.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..200 {
                let current = store.read().await.unwrap();
                let next = current.as_ref().map_or(1, |r| r.generation + 1);
                let digest = format!("p{p}-r{round}");
                if store
                    .compare_and_swap(current, record(next, &digest, &format!("p{p}")))
                    .await
                    .unwrap()
                    == Cas::Swapped
                {
                    winners
                        .lock()
                        .unwrap()
                        .entry(next)
                        .or_default()
                        .insert(digest);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let winners = winners.lock().unwrap().clone();
    println!(
        "{} generations published by 6 publishers x 200 rounds",
        winners.len()
    );
    assert!(
        winners.len() >= 200,
        "at least one publisher wins every round it sees: {}",
        winners.len()
    );
    for (g, digests) in &winners {
        assert_eq!(digests.len(), 1, "generation {g}: {digests:?}");
    }
    let store = LeaseStore::new(
        kube::Api::<Lease>::namespaced(client(&emu.url), "mcp"),
        "fleet",
    );
    assert_eq!(
        store.read().await.unwrap().unwrap().generation as usize,
        winners.len()
    );
}

#[tokio::test]
async fn heartbeats_form_the_cohort() {
    let emu = emulator();
    let store = LeaseStore::new(
        kube::Api::<Lease>::namespaced(client(&emu.url), "mcp"),
        "fleet",
    );
    let beat = |replica: &str, config: &str| Heartbeat {
        replica: replica.into(),
        release_id: "r".into(),
        config_revision: config.into(),
        generation: 1,
        digest: "d".into(),
        renewed_at: now_ms(),
        ttl: 15,
    };
    store.heartbeat(beat("pod-a", "c")).await.unwrap();
    store.heartbeat(beat("pod-b", "c")).await.unwrap();
    store.heartbeat(beat("pod-b", "c")).await.unwrap(); // renewal replaces
    let replicas = store.replicas().await.unwrap();
    assert_eq!(
        replicas
            .iter()
            .map(|r| r.replica.as_str())
            .collect::<Vec<_>>(),
        ["pod-a", "pod-b"]
    );
    let current = record(1, "d", "pod-a");
    assert!(cohort_check("pod-a", "r", "c", Some(&current), &replicas, now_ms()).is_ok());
    store.heartbeat(beat("pod-c", "other")).await.unwrap();
    let replicas = store.replicas().await.unwrap();
    let err = cohort_check("pod-a", "r", "c", Some(&current), &replicas, now_ms()).unwrap_err();
    assert_eq!(err.replica, "pod-c");
}
