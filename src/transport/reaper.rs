//! The child reaper: a small helper process (graph-os itself, run with [`ARG`]) that outlives
//! the gateway only to sweep its children's process groups when the gateway dies — also by
//! SIGKILL, when no code of the gateway runs any more.
//!
//! The gateway writes `+PGID` / `-PGID` lines to the reaper's stdin as stdio children start and
//! stop. When stdin reaches EOF (the gateway exited or was killed: the kernel closes the pipe),
//! the reaper sends SIGTERM to every group still registered, waits up to the stop grace for
//! them to empty, sends SIGKILL to what is left and exits. It ignores SIGINT/SIGTERM/SIGHUP
//! (a terminal's Ctrl-C reaches the whole foreground group) and runs in its own process group.
//! The child leaders also carry `PR_SET_PDEATHSIG(SIGKILL)`; the reaper is what takes their
//! grandchildren (which do not inherit it) along.
//!
//! Without a reaper (library use, tests) registration is a no-op and the parent-death signal
//! alone applies.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The hidden first argument that runs graph-os as the reaper.
pub const ARG: &str = "__graph-os-child-reaper";

static PIPE: Mutex<Option<std::process::ChildStdin>> = Mutex::new(None);

/// Starts the reaper (idempotent). `grace` is its SIGTERM→SIGKILL wait.
pub fn start(grace: Duration) -> std::io::Result<()> {
    let mut pipe = PIPE.lock().unwrap_or_else(|p| p.into_inner());
    if pipe.is_some() {
        return Ok(());
    }
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()?;
    let mut child = std::process::Command::new(exe)
        .arg(ARG)
        .arg(grace.as_millis().to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .env_clear()
        .process_group(0)
        .spawn()?;
    *pipe = child.stdin.take();
    // The reaper exits after the gateway; it is not waited for (init reaps it).
    std::mem::forget(child);
    Ok(())
}

fn send(line: &str) {
    let mut pipe = PIPE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = pipe.as_mut()
        && p.write_all(line.as_bytes()).is_err()
    {
        *pipe = None;
    }
}

/// Registers a child's process group for the sweep.
pub fn register(pgid: i32) {
    send(&format!("+{pgid}\n"));
}

/// Unregisters a group that has been stopped.
pub fn unregister(pgid: i32) {
    send(&format!("-{pgid}\n"));
}

fn group_alive(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::killpg(pgid, 0) == 0 }
}

/// The reaper's main: returns the process exit code.
pub fn run(grace_ms: Option<&str>) -> i32 {
    // SAFETY: installing SIG_IGN for these signals has no preconditions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let grace = Duration::from_millis(grace_ms.and_then(|g| g.parse().ok()).unwrap_or(5000));
    let mut groups: BTreeSet<i32> = BTreeSet::new();
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let (op, pgid) = line.split_at(line.len().min(1));
        let Ok(pgid) = pgid.parse::<i32>() else {
            continue;
        };
        if pgid <= 1 {
            continue;
        }
        match op {
            "+" => {
                groups.insert(pgid);
            }
            "-" => {
                groups.remove(&pgid);
            }
            _ => {}
        }
    }
    // The gateway is gone: sweep.
    let live: Vec<i32> = groups.into_iter().filter(|g| group_alive(*g)).collect();
    for g in &live {
        // SAFETY: plain signal delivery to a registered child group.
        unsafe { libc::killpg(*g, libc::SIGTERM) };
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && live.iter().any(|g| group_alive(*g)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    for g in &live {
        // SAFETY: as above.
        unsafe { libc::killpg(*g, libc::SIGKILL) };
    }
    0
}

/// Whether a reaper is running for this process.
pub fn running() -> bool {
    PIPE.lock().map(|p| p.is_some()).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    #[test]
    fn registration_without_a_reaper_is_a_no_op() {
        super::register(12345);
        super::unregister(12345);
        assert!(!super::running());
    }
}
