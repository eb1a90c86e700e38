//! A future polled again at once when it wakes itself during its own poll, instead of having its
//! task rescheduled.
//!
//! Why: hyper's request-body channel wakes the connection's own task when the handler takes the
//! body (the dispatcher registered its waker to send it, and the wake comes after the sender is
//! gone). tokio reschedules a task woken while it runs as a yield, and a yield wakes an idle
//! worker thread to steal it: a futex wake-up and a thread hop on every POST. Measured on the
//! HTTP front's forwarded `tools/call`: 4.8 context switches per call instead of 2, and 237
//! instead of 145 µs of CPU. tokio and hyper offer no switch for this, so the connection future
//! is wrapped here.
//!
//! Fairness is kept: a future that keeps waking itself (hyper yields this way after 16 rounds of
//! work) is re-polled at most [`MAX_REPOLLS`] times, then its task yields as before.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

/// Immediate re-polls of one wrapped poll before the task yields to the scheduler.
pub const MAX_REPOLLS: usize = 4;

const IDLE: u8 = 0;
const POLLING: u8 = 1;
const WOKEN: u8 = 2;

/// The waker the wrapped future sees: a wake while it is polled is noted (the poll loop polls
/// it again); any other wake goes to the task's own waker.
struct Shared {
    state: AtomicU8,
    task: AtomicWaker,
}

impl Wake for Shared {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        loop {
            match self.state.load(Ordering::Acquire) {
                POLLING => {
                    if self
                        .state
                        .compare_exchange(POLLING, WOKEN, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        return;
                    }
                }
                WOKEN => return,
                _ => {
                    self.task.wake();
                    return;
                }
            }
        }
    }
}

/// `inner`, re-polled in place when it wakes itself (see the module docs).
pub struct SelfWakeCoalesced<F> {
    inner: Pin<Box<F>>,
    shared: Arc<Shared>,
    waker: Waker,
}

impl<F: Future> SelfWakeCoalesced<F> {
    /// Wraps `inner` (boxed once: a connection's future, not a request's).
    pub fn new(inner: F) -> Self {
        let shared = Arc::new(Shared {
            state: AtomicU8::new(IDLE),
            task: AtomicWaker::new(),
        });
        Self {
            inner: Box::pin(inner),
            waker: Waker::from(shared.clone()),
            shared,
        }
    }
}

impl<F: Future> Future for SelfWakeCoalesced<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        this.shared.task.register(cx.waker());
        let mut inner_cx = Context::from_waker(&this.waker);
        for _ in 0..=MAX_REPOLLS {
            this.shared.state.store(POLLING, Ordering::Release);
            if let Poll::Ready(out) = this.inner.as_mut().poll(&mut inner_cx) {
                this.shared.state.store(IDLE, Ordering::Release);
                return Poll::Ready(out);
            }
            if this
                .shared
                .state
                .compare_exchange(POLLING, IDLE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Poll::Pending;
            }
            // Woken during its own poll: poll it again now.
        }
        this.shared.state.store(IDLE, Ordering::Release);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts the wakes of the task's own waker.
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Wakes itself `wakes` times, once per poll, then is ready; counts its polls.
    struct WakesItself {
        wakes: usize,
        polls: usize,
    }
    impl Future for WakesItself {
        type Output = usize;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.wakes == 0 {
                return Poll::Ready(self.polls);
            }
            self.wakes -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    fn task() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        (count, waker)
    }

    #[test]
    fn a_wake_during_its_own_poll_polls_it_again_without_waking_the_task() {
        let (count, waker) = task();
        let mut f = SelfWakeCoalesced::new(WakesItself { wakes: 1, polls: 0 });
        let out = Pin::new(&mut f).poll(&mut Context::from_waker(&waker));
        assert_eq!(out, Poll::Ready(2));
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_future_that_keeps_waking_itself_still_yields_to_the_scheduler() {
        let (count, waker) = task();
        let mut f = SelfWakeCoalesced::new(WakesItself {
            wakes: usize::MAX,
            polls: 0,
        });
        let out = Pin::new(&mut f).poll(&mut Context::from_waker(&waker));
        assert!(out.is_pending());
        assert_eq!(f.inner.polls, MAX_REPOLLS + 1);
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "the task was not woken to yield"
        );
    }

    #[tokio::test]
    async fn a_wake_from_elsewhere_while_it_waits_wakes_the_task() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let waiting = tokio::spawn(SelfWakeCoalesced::new(rx));
        tokio::task::yield_now().await;
        std::thread::spawn(move || tx.send(7))
            .join()
            .unwrap()
            .unwrap();
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("the task was never woken")
            .unwrap();
        assert_eq!(got, Ok(7));
    }
}
