//! Hot reload of a fleet file: watches the file's directory (editors replace files by rename;
//! a Kubernetes ConfigMap volume swaps its `..data` symlink), reacts only to changes
//! (create, modify, rename, remove — never to reads), debounces bursts of events, and yields a
//! new version only when the file's content digest changed: each as a validated [`Fleet`] (or
//! the reason it could not be read). Applying it is the multiplexer's job.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::{AdmissionContext, ConfigIssue, Fleet, load_file};

/// Quiet time after the last file event before the file is read.
pub const DEBOUNCE: Duration = Duration::from_millis(250);

/// Each changed version of the watched file: the validated fleet, or why it is unreadable.
pub type Updates = mpsc::UnboundedReceiver<Result<Fleet, Vec<ConfigIssue>>>;

/// The digest of what `path` resolves to now (`None`: unreadable).
fn content_digest(path: &Path) -> Option<String> {
    std::fs::read(path)
        .ok()
        .map(|b| crate::digest::sha256_hex(&b))
}

/// Whether an event can change what `name` (in the watched directory) reads as.
fn relevant(event: &notify::Event, name: &std::ffi::OsStr) -> bool {
    if matches!(event.kind, EventKind::Access(_) | EventKind::Other) {
        return false;
    }
    event.paths.iter().any(|p| {
        p.file_name().is_some_and(|n| {
            // `..data` / `..data_tmp` / `..2024_…`: the ConfigMap volume's atomic swap.
            n == name || n.to_string_lossy().starts_with("..")
        })
    })
}

/// Watches `path`; every settled change of its content sends the file's new version,
/// validated. The returned watcher must be kept alive for events to flow.
pub fn watch(
    path: &Path,
    ctx: AdmissionContext,
) -> notify::Result<(notify::RecommendedWatcher, Updates)> {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let dir = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    let (raw_tx, mut raw_rx) = mpsc::unbounded_channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event
            && relevant(&event, &name)
        {
            let _ = raw_tx.send(());
        }
    })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let mut last = content_digest(&path);
    tokio::spawn(async move {
        while raw_rx.recv().await.is_some() {
            // Debounce: wait until no event arrived for DEBOUNCE.
            loop {
                match tokio::time::timeout(DEBOUNCE, raw_rx.recv()).await {
                    Ok(Some(())) => continue,
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
            let now = content_digest(&path);
            if now.is_some() && now == last {
                continue;
            }
            last = now;
            let loaded = load_file(&path, &ctx).map_err(|e| {
                vec![ConfigIssue {
                    server: String::new(),
                    field: String::new(),
                    reason: format!("{}: {e}", e.code()),
                }]
            });
            if tx.send(loaded).is_err() {
                return;
            }
        }
    });
    Ok((watcher, rx))
}
