//! `graph-os-byte-relay PROGRAM [ARGS...]`: a zero-parse stdio relay for `graph-os bench`.
//!
//! Spawns PROGRAM with piped stdin/stdout (stderr inherited) and copies our stdin to its stdin and
//! its stdout to our stdout byte for byte, flushing after every read: no framing, no parsing, no
//! buffering beyond one read. It is the physical limit of one extra stdio hop (two pipes, two
//! context switches), the floor any stdio gateway's forwarding is compared against. It exits with
//! the child's status once the child's stdout closes; our stdin closing closes the child's stdin.

use std::io::{Read, Write};
use std::process::{Command, ExitCode, Stdio};

/// Copies `from` to `to`, one read at a time, flushing after each.
fn pump(mut from: impl Read, mut to: impl Write) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
        to.flush()?;
    }
}

fn main() -> ExitCode {
    let mut argv = std::env::args_os().skip(1);
    let Some(program) = argv.next() else {
        eprintln!("usage: graph-os-byte-relay PROGRAM [ARGS...]");
        return ExitCode::from(2);
    };
    let mut child = match Command::new(&program)
        .args(argv)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("graph-os-byte-relay: {}: {e}", program.to_string_lossy());
            return ExitCode::from(127);
        }
    };
    let (Some(child_in), Some(child_out)) = (child.stdin.take(), child.stdout.take()) else {
        eprintln!("graph-os-byte-relay: the child's pipes are missing");
        return ExitCode::from(1);
    };
    // Our stdin → the child's stdin; EOF (or an error) drops the pipe, closing the child's stdin.
    std::thread::spawn(move || pump(std::io::stdin().lock(), child_in));
    // The child's stdout → our stdout, on this thread; if our stdout breaks, stop the child.
    if pump(child_out, std::io::stdout().lock()).is_err() {
        let _ = child.kill();
    }
    match child.wait() {
        Ok(status) => {
            #[cfg(unix)]
            if let Some(sig) = std::os::unix::process::ExitStatusExt::signal(&status) {
                return ExitCode::from((128 + sig).clamp(0, 255) as u8);
            }
            ExitCode::from(status.code().unwrap_or(1).clamp(0, 255) as u8)
        }
        Err(e) => {
            eprintln!("graph-os-byte-relay: waiting for the child: {e}");
            ExitCode::from(1)
        }
    }
}
