//! stdio child processes: minimal environment, own process group, bounded stdout and stderr.
//!
//! Design note.
//! - **Process group.** Each child leads its own process group (`setpgid(0, 0)`), so wrappers
//!   such as `npx` or `sh -c "sleep 300 & exec server"` are stopped as a whole: closing the
//!   transport (stop, restart, reload, shutdown, or the child's own exit) sends SIGTERM to the
//!   group, waits up to the stop grace (default 5 s, [`set_stop_grace`]) for it to empty, then
//!   sends SIGKILL to whatever is left and reaps the leader (no zombies).
//! - **Gateway death.** The leader gets `PR_SET_PDEATHSIG(SIGKILL)`; grandchildren do not inherit
//!   it (and a non-dumpable child's exec clears it, see [`super::isolation`]), so the gateway also
//!   registers every group with a reaper process ([`super::reaper`]) that sweeps the registered
//!   groups when the gateway dies, even by SIGKILL.
//! - **Isolation.** Before exec the child is made unable to read the gateway's or its siblings'
//!   secrets where the platform allows ([`super::isolation`]); a step that fails fails the spawn
//!   with `child-isolation-failed`.
//! - **Environment.** Exactly the parent variables named in [`ENV_ALLOWLIST`], then the child's
//!   declared, resolved `env`.
//! - **One spawner thread.** The kernel delivers the death signal when the *thread* that forked
//!   the child exits, not the process. So children are forked only on one dedicated thread that
//!   lives as long as the process ([`launch`]): never on the blocking pool (its threads exit
//!   after 10 s idle, which killed every child ~10 s after it started), and never on the
//!   runtime's workers (fork+exec blocks them for milliseconds; with a hundred children starting
//!   at once, front requests queued behind it for 200-600 ms).
//! - **Bounded input.** stdout is read through [`BoundedLines`]: one JSON-RPC line over
//!   [`MAX_STDOUT_LINE`] ends the connection with `child-frame-too-large` (nothing larger is
//!   ever buffered). stderr is read in fixed chunks; at most [`STDERR_LINE_MAX`] bytes of a line
//!   are kept (logged at debug), the rest is discarded up to the newline.

use std::collections::BTreeMap;
use std::io;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use rmcp::service::{RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tokio::process::{Child, ChildStdout};

use super::raw_link::{LinkWriter, RawLink};
use super::{Fault, TransportError};
use crate::config::StdioSpec;
use crate::wire::task_marks::MappedLines;

/// The parent variables a stdio child inherits, by exact name (no prefixes: a prefix such as
/// `XDG_` also lets `XDG_SESSION_COOKIE` through). The one list: [`inherits`] decides with it,
/// `graph-os doctor` reports with it, docs/threat-model.md says why each name is here.
pub const ENV_ALLOWLIST: &[&str] = &[
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
];

/// Whether a stdio child inherits the parent variable `name` ([`ENV_ALLOWLIST`]).
pub fn inherits(name: &str) -> bool {
    ENV_ALLOWLIST.contains(&name)
}

/// Longest stderr line kept (bytes); the rest of a longer line is discarded.
pub const STDERR_LINE_MAX: usize = 4096;
/// Longest stdout line (one JSON-RPC message) accepted (bytes).
pub const MAX_STDOUT_LINE: usize = 8 * 1024 * 1024;
/// stderr is read in chunks of this size.
const STDERR_CHUNK: usize = 8192;

static STOP_GRACE_MS: AtomicU64 = AtomicU64::new(5000);

/// Sets how long a stopped child's process group has between SIGTERM and SIGKILL.
pub fn set_stop_grace(grace: Duration) {
    STOP_GRACE_MS.store(
        grace.as_millis().min(u64::MAX as u128) as u64,
        Ordering::Relaxed,
    );
}

/// The stop grace in force.
pub fn stop_grace() -> Duration {
    Duration::from_millis(STOP_GRACE_MS.load(Ordering::Relaxed))
}

/// The environment a child gets: allowlisted parent variables, then its declared, resolved env.
pub fn child_environment(
    spec: &StdioSpec,
    parent: impl IntoIterator<Item = (String, String)>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, String>, TransportError> {
    let mut env: BTreeMap<String, String> =
        parent.into_iter().filter(|(k, _)| inherits(k)).collect();
    for (key, value) in &spec.env {
        env.insert(key.clone(), value.resolve(lookup)?);
    }
    Ok(env)
}

/// A stdio child's MCP transport: newline-delimited JSON-RPC over its stdin/stdout, owning the
/// child's process group (terminated as a whole when the transport closes or is dropped).
pub struct StdioTransport {
    inner: AsyncRwTransport<RoleClient, MappedLines<BoundedLines<ChildStdout>>, LinkWriter>,
    group: Option<Group>,
    /// The forwarding hot path's raw requests beside rmcp (see `raw_link`).
    raw: RawLink,
    /// Set when the leader exited: what is still buffered on stdout is read until then.
    drain_until: Option<tokio::time::Instant>,
}

/// How long messages already written by a child that exited are still read.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(200);

impl std::fmt::Debug for StdioTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdioTransport")
            .field("pgid", &self.group.as_ref().map(|g| g.pgid))
            .finish()
    }
}

impl StdioTransport {
    /// The process group id (= the leader's pid) while the group is owned.
    pub fn pgid(&self) -> Option<i32> {
        self.group.as_ref().map(|g| g.pgid)
    }

    /// The raw request channel of this connection (the forwarding hot path).
    pub fn raw_link(&self) -> RawLink {
        self.raw.clone()
    }
}

impl Drop for StdioTransport {
    fn drop(&mut self) {
        self.raw.close();
        if let Some(group) = self.group.take() {
            group.terminate();
        }
    }
}

impl Transport<RoleClient> for StdioTransport {
    type Error = io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), io::Error>> + Send + 'static {
        self.inner.send(item)
    }

    /// Messages from the child's stdout. The connection ends when stdout closes **or** the
    /// leader exits: a grandchild that inherited stdout (`sh -c "sleep 300 & exec server"`)
    /// keeps the pipe open after the server died, and must not keep a dead child "up".
    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            let message = self.receive_inner().await;
            match &message {
                None => {
                    // The connection is over: raw requests still waiting fail now.
                    self.raw.close();
                }
                // A raw response's placeholder: everything before it has been received (and
                // routed), so the response is delivered now and rmcp never sees it.
                Some(rmcp::model::JsonRpcMessage::Notification(n))
                    if matches!(&n.notification, rmcp::model::ServerNotification::CustomNotification(c)
                        if RawLink::is_ready_method(&c.method)) =>
                {
                    self.raw.ready();
                    continue;
                }
                Some(_) => {}
            }
            return message;
        }
    }

    async fn close(&mut self) -> Result<(), io::Error> {
        self.raw.close();
        // stdin EOF first (the MCP stdio shutdown sequence), then the group.
        let closed = self.inner.close().await;
        if let Some(group) = self.group.take() {
            group.terminate();
        }
        closed
    }
}

impl StdioTransport {
    async fn receive_inner(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        if let Some(deadline) = self.drain_until {
            return tokio::time::timeout_at(deadline, self.inner.receive())
                .await
                .ok()
                .flatten();
        }
        let Some(group) = self.group.as_mut() else {
            return self.inner.receive().await;
        };
        tokio::select! {
            m = self.inner.receive() => m,
            _ = group.leader.wait() => {
                tracing::debug!(server = %group.server, pgid = group.pgid, "child process exited");
                let deadline = tokio::time::Instant::now() + DRAIN_AFTER_EXIT;
                self.drain_until = Some(deadline);
                tokio::time::timeout_at(deadline, self.inner.receive()).await.ok().flatten()
            }
        }
    }
}

/// A child process group: the leader and its pgid.
struct Group {
    pgid: i32,
    leader: Child,
    server: Arc<str>,
}

fn killpg(pgid: i32, signal: i32) -> bool {
    // SAFETY: killpg has no memory-safety preconditions; a positive pgid never targets the
    // caller's own group (the child left it with setpgid).
    pgid > 1 && unsafe { libc::killpg(pgid, signal) } == 0
}

impl Group {
    /// SIGTERM to the group now; then, in the background, wait up to the grace for it to
    /// empty, SIGKILL the rest and reap the leader.
    fn terminate(self) {
        let Group {
            pgid,
            mut leader,
            server,
        } = self;
        killpg(pgid, libc::SIGTERM);
        let grace = stop_grace();
        let finish = async move {
            let deadline = tokio::time::Instant::now() + grace;
            let mut reaped = false;
            loop {
                if !reaped {
                    reaped = matches!(leader.try_wait(), Ok(Some(_)) | Err(_));
                }
                if reaped && !killpg(pgid, 0) {
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    if killpg(pgid, libc::SIGKILL) {
                        tracing::info!(server = %server, pgid, "child process group killed after the stop grace");
                    }
                    if !reaped {
                        let _ = leader.wait().await;
                    }
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            super::reaper::unregister(pgid);
            tracing::debug!(server = %server, pgid, "child process group stopped");
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(finish);
            }
            Err(_) => {
                // No runtime (process exit): no grace, do not leave anything behind.
                killpg(pgid, libc::SIGKILL);
                super::reaper::unregister(pgid);
            }
        }
    }
}

type SpawnJob = Box<dyn FnOnce() + Send>;

/// The spawner thread's queue, started on first use. `None` only if the thread could not be
/// created (then children are forked on the calling worker thread, which lives as long as the
/// runtime).
fn spawner() -> Option<&'static std::sync::mpsc::Sender<SpawnJob>> {
    static SPAWNER: std::sync::OnceLock<Option<std::sync::mpsc::Sender<SpawnJob>>> =
        std::sync::OnceLock::new();
    SPAWNER
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<SpawnJob>();
            let started = std::thread::Builder::new()
                .name("graph-os-spawner".into())
                .spawn(move || {
                    // This thread must never end while children run: a panicking job is
                    // contained here (its caller sees a closed channel) and the loop goes on.
                    for job in rx {
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    }
                });
            match started {
                Ok(_) => Some(tx),
                Err(e) => {
                    tracing::warn!(error = %e, "no spawner thread: children are forked on runtime workers");
                    None
                }
            }
        })
        .as_ref()
}

/// [`spawn`] on the spawner thread (see the module note): the child's death signal is tied to a
/// thread that lives as long as the process, and fork+exec never blocks a runtime worker.
/// `lookup` resolves secret references (it runs on the spawner thread).
pub async fn launch<L>(
    server: String,
    spec: StdioSpec,
    lookup: L,
    fault: Fault,
) -> Result<StdioTransport, TransportError>
where
    L: Fn(&str) -> Option<String> + Send + 'static,
{
    let command = spec.command.clone();
    let handle = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: SpawnJob = Box::new(move || {
        // The pipes and the exit watcher register with the caller's runtime.
        let _entered = handle.enter();
        let _ = tx.send(spawn(&server, &spec, &lookup, &fault));
    });
    match spawner() {
        Some(queue) => {
            if let Err(std::sync::mpsc::SendError(job)) = queue.send(job) {
                job();
            }
        }
        None => job(),
    }
    rx.await.unwrap_or_else(|_| {
        Err(TransportError::Spawn {
            command,
            reason: "the spawner thread failed while starting the child".into(),
        })
    })
}

/// Spawns a stdio child in its own process group and returns its MCP transport. Its stderr is
/// drained into tracing at debug level in bounded lines; an oversized stdout line is recorded
/// in `fault` as `child-frame-too-large` and ends the connection.
pub fn spawn(
    server: &str,
    spec: &StdioSpec,
    lookup: &dyn Fn(&str) -> Option<String>,
    fault: &Fault,
) -> Result<StdioTransport, TransportError> {
    let env = child_environment(spec, std::env::vars(), lookup)?;
    // The child's stderr is logged: never with the secret values it was given.
    let mut redactor = crate::telemetry::redact::Redactor::default();
    for (name, value) in &spec.env {
        if value.is_reference()
            && let Some(resolved) = env.get(name.as_str())
        {
            redactor.add(resolved);
        }
    }
    let mut cmd = tokio::process::Command::new(&spec.command);
    cmd.args(&spec.args)
        .env_clear()
        .envs(&env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    if let Some(cwd) = &spec.cwd {
        cmd.current_dir(cwd);
    }
    // Process isolation (docs/threat-model.md): decided once from the gateway's credentials.
    let plan = super::isolation::plan();
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the forked child before exec and makes only async-signal-safe
    // system calls, without allocating (`isolation::apply_in_child`).
    unsafe {
        cmd.pre_exec(move || super::isolation::apply_in_child(plan, parent));
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| match super::isolation::decode_spawn_error(&e) {
            Some((step, os)) => TransportError::Isolation {
                command: spec.command.clone(),
                step: step.name(),
                reason: os.to_string(),
            },
            None => TransportError::Spawn {
                command: spec.command.clone(),
                reason: e.to_string(),
            },
        })?;
    let (Some(stdin), Some(stdout), stderr, Some(pid)) = (
        child.stdin.take(),
        child.stdout.take(),
        child.stderr.take(),
        child.id(),
    ) else {
        let _ = child.start_kill();
        return Err(TransportError::Spawn {
            command: spec.command.clone(),
            reason: "the child's stdio pipes are missing".into(),
        });
    };
    let pgid = pid as i32;
    super::reaper::register(pgid);
    if let Some(stderr) = stderr {
        tokio::spawn(drain_stderr(server.to_string(), stderr, redactor));
    }
    // 2025 task fields rmcp drops are kept as marks (see `task_marks`).
    // Raw responses of the forwarding hot path are taken before rmcp sees a line.
    let (raw, stdin) = RawLink::new(stdin);
    let tap = raw.clone();
    let stdout = MappedLines::new(
        BoundedLines::new(stdout, MAX_STDOUT_LINE, fault.clone()),
        crate::wire::task_marks::mark_child_message,
    )
    .with_tap(Arc::new(move |line: &[u8], ahead| tap.tap(line, ahead)));
    let inner = AsyncRwTransport::new_client(stdout, stdin).with_max_line_length(usize::MAX);
    Ok(StdioTransport {
        raw,
        inner,
        group: Some(Group {
            pgid,
            leader: child,
            server: server.into(),
        }),
        drain_until: None,
    })
}

/// Drains a child's stderr in fixed chunks: each line is logged (at most
/// [`STDERR_LINE_MAX`] bytes of it), the rest of a longer line is discarded.
async fn drain_stderr(
    server: String,
    mut stderr: impl AsyncRead + Unpin,
    redactor: crate::telemetry::redact::Redactor,
) {
    let mut chunk = vec![0u8; STDERR_CHUNK];
    let mut lines = StderrLines::default();
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        lines.feed(&chunk[..n], &mut |line, truncated| {
            let text = redactor.apply(&String::from_utf8_lossy(line));
            if truncated {
                tracing::debug!(target: "graph_os::child_stderr", server = %server, truncated = true, "{}", text.trim_end());
            } else {
                tracing::debug!(target: "graph_os::child_stderr", server = %server, "{}", text.trim_end());
            }
        });
    }
    lines.finish(&mut |line, truncated| {
        let text = redactor.apply(&String::from_utf8_lossy(line));
        tracing::debug!(target: "graph_os::child_stderr", server = %server, truncated, "{}", text.trim_end());
    });
}

/// Splits a byte stream into lines of at most [`STDERR_LINE_MAX`] bytes (the rest of a longer
/// line is dropped); its buffer never grows past the bound.
#[derive(Default)]
pub struct StderrLines {
    line: Vec<u8>,
    discarding: bool,
}

impl StderrLines {
    /// Feeds bytes; `emit(line, truncated)` gets every complete (or truncated) line.
    pub fn feed(&mut self, mut bytes: &[u8], emit: &mut dyn FnMut(&[u8], bool)) {
        while !bytes.is_empty() {
            let nl = bytes.iter().position(|b| *b == b'\n');
            let (segment, rest, ends) = match nl {
                Some(i) => (&bytes[..i], &bytes[i + 1..], true),
                None => (bytes, &bytes[bytes.len()..], false),
            };
            if !self.discarding {
                let room = STDERR_LINE_MAX - self.line.len();
                if segment.len() > room {
                    self.line.extend_from_slice(&segment[..room]);
                    emit(&self.line, true);
                    self.line.clear();
                    self.discarding = !ends;
                } else {
                    self.line.extend_from_slice(segment);
                    if ends {
                        emit(&self.line, false);
                        self.line.clear();
                    }
                }
            } else if ends {
                self.discarding = false;
            }
            bytes = rest;
        }
    }

    /// Emits what is left at end of stream.
    pub fn finish(&mut self, emit: &mut dyn FnMut(&[u8], bool)) {
        if !self.line.is_empty() {
            emit(&self.line, false);
            self.line.clear();
        }
    }

    /// Bytes buffered now (never more than [`STDERR_LINE_MAX`]).
    pub fn buffered(&self) -> usize {
        self.line.len()
    }
}

/// An `AsyncRead` that fails once a line (bytes since the last `\n`) exceeds `max`, recording
/// `child-frame-too-large` in its [`Fault`].
pub struct BoundedLines<R> {
    inner: R,
    max: usize,
    current: usize,
    fault: Fault,
    failed: bool,
}

impl<R> BoundedLines<R> {
    /// Wraps `inner`.
    pub fn new(inner: R, max: usize, fault: Fault) -> Self {
        BoundedLines {
            inner,
            max,
            current: 0,
            fault,
            failed: false,
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for BoundedLines<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let too_large = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "child-frame-too-large: a stdout line exceeded its bound",
            )
        };
        if this.failed {
            return Poll::Ready(Err(too_large()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let new = &buf.filled()[before..];
                let mut segments = new.split(|b| *b == b'\n');
                let first = segments.next().map_or(0, <[u8]>::len);
                let mut over = this.current.saturating_add(first) > this.max;
                let mut last = None;
                for segment in segments {
                    over |= segment.len() > this.max;
                    last = Some(segment.len());
                }
                this.current = match last {
                    Some(len) => len,
                    None => this.current.saturating_add(first),
                };
                if over {
                    this.current = usize::MAX;
                }
                if this.current > this.max {
                    // An error must not leave bytes behind in the caller's buffer.
                    buf.set_filled(before);
                    this.failed = true;
                    this.fault.record(
                        "child-frame-too-large",
                        format!(
                            "a stdout line (one JSON-RPC message) exceeded {} bytes",
                            this.max
                        ),
                    );
                    return Poll::Ready(Err(too_large()));
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::SecretValue;

    #[test]
    fn only_allowlisted_parent_variables_cross() {
        let spec = StdioSpec {
            command: "x".into(),
            args: vec![],
            env: [(
                "GITHUB_TOKEN".to_string(),
                SecretValue::parse("env://ALIAS").unwrap(),
            )]
            .into(),
            cwd: None,
        };
        let parent = [
            ("PATH", "/bin"),
            ("AWS_SECRET_ACCESS_KEY", "canary"),
            ("XDG_CONFIG_HOME", "/x"),
            ("XDG_SESSION_COOKIE", "cookie"),
            ("SSL_CERT_FILE", "/ca.pem"),
            ("SSL_CERT_EVIL", "evil"),
            ("LC_CTYPE_EXTRA", "x"),
            ("ALIAS", "resolved"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let env = child_environment(&spec, parent, &|k| {
            (k == "ALIAS").then(|| "resolved".into())
        })
        .unwrap();
        assert_eq!(env.get("PATH").map(String::as_str), Some("/bin"));
        assert_eq!(env.get("XDG_CONFIG_HOME").map(String::as_str), Some("/x"));
        assert_eq!(
            env.get("GITHUB_TOKEN").map(String::as_str),
            Some("resolved")
        );
        assert!(!env.contains_key("AWS_SECRET_ACCESS_KEY"));
        assert!(!env.contains_key("ALIAS"));
        // Exact names only: no prefix lets a neighbour through.
        assert_eq!(
            env.get("SSL_CERT_FILE").map(String::as_str),
            Some("/ca.pem")
        );
        for name in ["XDG_SESSION_COOKIE", "SSL_CERT_EVIL", "LC_CTYPE_EXTRA"] {
            assert!(!env.contains_key(name), "{name} crossed");
        }
        let names: Vec<&str> = env.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            ["GITHUB_TOKEN", "PATH", "SSL_CERT_FILE", "XDG_CONFIG_HOME"]
        );
    }

    #[test]
    fn a_missing_reference_fails_the_launch_closed() {
        let spec = StdioSpec {
            command: "x".into(),
            args: vec![],
            env: [("TOKEN".to_string(), SecretValue::parse("${NOPE}").unwrap())].into(),
            cwd: None,
        };
        let err = child_environment(&spec, [], &|_| None).unwrap_err();
        assert_eq!(err.code(), "secret-unavailable");
    }

    #[test]
    fn stderr_lines_keep_at_most_the_bound_and_skip_the_rest() {
        let mut lines = StderrLines::default();
        let mut seen: Vec<(usize, bool)> = vec![];
        let mut emit = |l: &[u8], t: bool| seen.push((l.len(), t));
        lines.feed(b"short\n", &mut emit);
        let big = vec![b'x'; 10_000];
        for _ in 0..100 {
            lines.feed(&big, &mut emit);
            assert!(lines.buffered() <= STDERR_LINE_MAX);
        }
        lines.feed(b"tail of the long line\nnext\n", &mut emit);
        assert_eq!(seen, vec![(5, false), (STDERR_LINE_MAX, true), (4, false)]);
    }

    #[tokio::test]
    async fn a_stdout_line_over_the_bound_fails_the_read() {
        let fault = Fault::default();
        let data = [b"{}\n".to_vec(), vec![b'a'; 100]].concat();
        let mut r = BoundedLines::new(&data[..], 50, fault.clone());
        let mut out = vec![];
        let err = tokio::io::AsyncReadExt::read_to_end(&mut r, &mut out)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert_eq!(fault.take().map(|f| f.0), Some("child-frame-too-large"));
        let ok = [b"{}\n".to_vec(), vec![b'a'; 50], b"\n".to_vec()].concat();
        let mut r = BoundedLines::new(&ok[..], 50, Fault::default());
        assert!(
            tokio::io::AsyncReadExt::read_to_end(&mut r, &mut vec![])
                .await
                .is_ok()
        );
    }

    /// A child must outlive the thread that happened to start it: the death signal follows the
    /// forking *thread*. The control shows the kernel rule (a child forked on a blocking-pool
    /// thread dies when that thread idles out); `launch` must not be subject to it.
    #[test]
    fn a_child_outlives_the_thread_that_started_it() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_keep_alive(Duration::from_millis(50))
            .enable_all()
            .build()
            .unwrap();
        let spec = StdioSpec {
            command: "sleep".into(),
            args: vec!["30".into()],
            env: Default::default(),
            cwd: None,
        };
        let alive = |t: &StdioTransport| {
            let pid = t.pgid().unwrap();
            // Signal 0 only checks; a killed leader is a zombie until reaped, so look at /proc.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat.rsplit(')').next().unwrap_or("").trim().chars().next();
            matches!(state, Some('S' | 'R' | 'D'))
        };
        rt.block_on(async {
            let (s, f) = (spec.clone(), Fault::default());
            let control = tokio::task::spawn_blocking(move || spawn("control", &s, &|_| None, &f))
                .await
                .unwrap()
                .unwrap();
            let launched = launch("launched".into(), spec, |_| None, Fault::default())
                .await
                .unwrap();
            assert!(alive(&launched));
            // The blocking pool's idle threads exit after 50 ms.
            tokio::time::sleep(Duration::from_millis(600)).await;
            // A non-dumpable child's exec clears its death signal (`isolation`): the control
            // shows the kernel rule only when children keep it.
            if super::super::isolation::plan().split_gid.is_none() {
                assert!(
                    !alive(&control),
                    "control: the kernel kills a child whose forking thread exited"
                );
            }
            assert!(
                alive(&launched),
                "a launched child died with the thread that forked it"
            );
        });
    }
}
