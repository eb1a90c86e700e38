//! The stdio front's standard input and output, read and written on the runtime's I/O driver.
//!
//! `tokio::io::stdin()`/`stdout()` perform every read and write on the blocking thread pool:
//! one hand-off to a pool thread and one wake-up back per message, which profiling showed as
//! the largest single cost of a forwarded call over stdio (futex and eventfd wake-ups). MCP
//! clients start graph-os with pipes (Python's and Rust's SDKs) or Unix socket pairs (Node's
//! `child_process`, libuv), both of which epoll can watch: those are registered with the
//! reactor instead. Anything else (a terminal, a regular file) keeps tokio's blocking-pool
//! handles, which work on every kind of file.
//!
//! Registration sets `O_NONBLOCK` on the open file description, which is shared with whoever
//! else holds it. Standard output is therefore only registered when standard error is not the
//! same pipe or socket (`2>&1` would otherwise make our own log writes non-blocking), and both
//! flags are put back when the handles are dropped.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Standard input: a reactor-registered pipe or socket, else tokio's blocking-pool handle.
pub enum Stdin {
    /// A pipe or Unix socket registered with the reactor.
    Async(Reactor),
    /// Tokio's handle (blocking pool).
    Pool(tokio::io::Stdin),
}

/// Standard output: a reactor-registered pipe or socket, else tokio's blocking-pool handle.
pub enum Stdout {
    /// A pipe or Unix socket registered with the reactor.
    Async(Reactor),
    /// Tokio's handle (blocking pool).
    Pool(tokio::io::Stdout),
}

/// Standard input, registered with the reactor when it is a pipe or a Unix socket.
pub fn stdin() -> Stdin {
    match Reactor::register(io::stdin().as_fd(), None) {
        Some(r) => Stdin::Async(r),
        None => Stdin::Pool(tokio::io::stdin()),
    }
}

/// Standard output, registered with the reactor when it is a pipe or a Unix socket that
/// standard error does not share.
pub fn stdout() -> Stdout {
    match Reactor::register(io::stdout().as_fd(), Some(io::stderr().as_fd())) {
        Some(r) => Stdout::Async(r),
        None => Stdout::Pool(tokio::io::stdout()),
    }
}

/// A duplicate of a standard descriptor, non-blocking and watched by the reactor. Dropping it
/// restores the descriptor's blocking mode.
pub struct Reactor {
    fd: tokio::io::unix::AsyncFd<OwnedFd>,
    was_blocking: bool,
}

/// `(st_dev, st_ino)` of a pipe or socket; `None` for any other kind of file.
fn pipe_or_socket(fd: BorrowedFd<'_>) -> Option<(u64, u64)> {
    // SAFETY: fstat writes into the zeroed struct we own; the descriptor is borrowed and open.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    let kind = st.st_mode & libc::S_IFMT;
    (kind == libc::S_IFIFO || kind == libc::S_IFSOCK).then_some((st.st_dev, st.st_ino))
}

fn flags(fd: RawFd) -> Option<libc::c_int> {
    // SAFETY: F_GETFL on an open descriptor has no memory effects.
    let f = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    (f >= 0).then_some(f)
}

fn set_flags(fd: RawFd, f: libc::c_int) -> bool {
    // SAFETY: F_SETFL on an open descriptor has no memory effects.
    unsafe { libc::fcntl(fd, libc::F_SETFL, f) == 0 }
}

impl Reactor {
    fn register(fd: BorrowedFd<'_>, not_shared_with: Option<BorrowedFd<'_>>) -> Option<Reactor> {
        let id = pipe_or_socket(fd)?;
        if not_shared_with.and_then(pipe_or_socket) == Some(id) {
            return None;
        }
        let owned = fd.try_clone_to_owned().ok()?;
        let raw = owned.as_raw_fd();
        let f = flags(raw)?;
        let was_blocking = f & libc::O_NONBLOCK == 0;
        if was_blocking && !set_flags(raw, f | libc::O_NONBLOCK) {
            return None;
        }
        // SAFETY: `owned` is a descriptor of our own (a duplicate); nothing else replaces or
        // closes it while the `AsyncFd` holds it.
        match unsafe { tokio::io::unix::AsyncFd::register(owned) } {
            Ok(fd) => Some(Reactor { fd, was_blocking }),
            Err(_) => {
                if was_blocking {
                    set_flags(raw, f);
                }
                None
            }
        }
    }
}

impl Drop for Reactor {
    fn drop(&mut self) {
        let raw = self.fd.get_ref().as_raw_fd();
        if self.was_blocking
            && let Some(f) = flags(raw)
        {
            set_flags(raw, f & !libc::O_NONBLOCK);
        }
    }
}

fn last_error() -> io::Error {
    io::Error::last_os_error()
}

impl AsyncRead for Reactor {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = std::task::ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let result = guard.try_io(|fd| {
                // SAFETY: reads into the initialized, unfilled part of `buf`, which we own.
                let n = unsafe {
                    libc::read(
                        fd.get_ref().as_raw_fd(),
                        unfilled.as_mut_ptr().cast(),
                        unfilled.len(),
                    )
                };
                if n < 0 {
                    Err(last_error())
                } else {
                    Ok(n as usize)
                }
            });
            match result {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Reactor {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = std::task::ready!(self.fd.poll_write_ready(cx))?;
            let result = guard.try_io(|fd| {
                // SAFETY: writes from `data`, which is borrowed for the call.
                let n = unsafe {
                    libc::write(fd.get_ref().as_raw_fd(), data.as_ptr().cast(), data.len())
                };
                if n < 0 {
                    Err(last_error())
                } else {
                    Ok(n as usize)
                }
            });
            match result {
                Ok(Ok(n)) => return Poll::Ready(Ok(n)),
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Nothing is buffered here: every write went to the kernel.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Stdin {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stdin::Async(r) => Pin::new(r).poll_read(cx, buf),
            Stdin::Pool(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stdout {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stdout::Async(r) => Pin::new(r).poll_write(cx, data),
            Stdout::Pool(s) => Pin::new(s).poll_write(cx, data),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stdout::Async(r) => Pin::new(r).poll_flush(cx),
            Stdout::Pool(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stdout::Async(r) => Pin::new(r).poll_shutdown(cx),
            Stdout::Pool(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_pipe_is_read_and_written_on_the_reactor_and_its_mode_restored() {
        let (r, w) = std::io::pipe().unwrap();
        let (rfd, wfd): (OwnedFd, OwnedFd) = (r.into(), w.into());
        let mut reader = Reactor::register(rfd.as_fd(), None).expect("a pipe registers");
        let mut writer = Reactor::register(wfd.as_fd(), None).expect("a pipe registers");
        writer.write_all(b"hello\n").await.unwrap();
        let mut buf = [0u8; 6];
        reader.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hello\n");
        drop(reader);
        assert_eq!(flags(rfd.as_raw_fd()).unwrap() & libc::O_NONBLOCK, 0);
    }

    #[tokio::test]
    async fn output_sharing_a_pipe_with_stderr_stays_on_the_pool() {
        let (_r, w) = std::io::pipe().unwrap();
        let w: OwnedFd = w.into();
        let dup = w.try_clone().unwrap();
        assert!(Reactor::register(w.as_fd(), Some(dup.as_fd())).is_none());
        assert_eq!(flags(w.as_raw_fd()).unwrap() & libc::O_NONBLOCK, 0);
    }

    #[tokio::test]
    async fn a_regular_file_is_not_registered() {
        let f = tempfile::tempfile().unwrap();
        assert!(Reactor::register(f.as_fd(), None).is_none());
    }

    #[tokio::test]
    async fn a_socket_pair_registers() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut a = Reactor::register(a.as_fd(), None).expect("a socket registers");
        let mut b = Reactor::register(b.as_fd(), None).expect("a socket registers");
        a.write_all(b"x").await.unwrap();
        let mut one = [0u8; 1];
        b.read_exact(&mut one).await.unwrap();
        assert_eq!(&one, b"x");
    }
}
