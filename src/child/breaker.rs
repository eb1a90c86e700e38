//! Circuit breaker: consecutive transport failures or timeouts open it; after the cooldown it
//! admits exactly one probe call (half-open); that call's success closes it, its failure
//! re-opens it. Tool-level errors, child JSON-RPC errors, busy rejections and cancellations
//! never count. A threshold of 0 disables the breaker.

use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// Breaker state as reported by multiplexer_status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    /// Calls flow.
    Closed,
    /// Calls fail fast with `child-circuit-open`.
    Open,
    /// The cooldown passed: the next call is admitted as the probe.
    HalfOpen,
}

/// How a call was admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ticket {
    /// A normal call.
    Normal,
    /// The single half-open probe.
    Probe,
}

#[derive(Debug)]
struct Inner {
    failures: u32,
    opened_at: Option<Instant>,
    probe_in_flight: bool,
}

/// One child's breaker.
#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    cooldown: Duration,
    inner: Mutex<Inner>,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(threshold: u32, cooldown: Duration) -> Self {
        Breaker {
            threshold,
            cooldown,
            inner: Mutex::new(Inner {
                failures: 0,
                opened_at: None,
                probe_in_flight: false,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Current state.
    pub fn state(&self) -> BreakerState {
        let inner = self.lock();
        match inner.opened_at {
            None => BreakerState::Closed,
            Some(at) if at.elapsed() >= self.cooldown => BreakerState::HalfOpen,
            Some(_) => BreakerState::Open,
        }
    }

    /// Admits a call, or refuses it while open (or while the half-open probe is in flight).
    pub fn admit(&self) -> Option<Ticket> {
        if self.threshold == 0 {
            return Some(Ticket::Normal);
        }
        let mut inner = self.lock();
        match inner.opened_at {
            None => Some(Ticket::Normal),
            Some(at) if at.elapsed() >= self.cooldown && !inner.probe_in_flight => {
                inner.probe_in_flight = true;
                Some(Ticket::Probe)
            }
            Some(_) => None,
        }
    }

    /// The call reached the child and got an answer (tool errors included).
    pub fn success(&self, ticket: Ticket) {
        let mut inner = self.lock();
        if ticket == Ticket::Probe || inner.opened_at.is_none() {
            inner.failures = 0;
            inner.opened_at = None;
            inner.probe_in_flight = false;
        }
    }

    /// The call failed with a transport failure or a timeout. Returns true if this opened it.
    pub fn failure(&self, ticket: Ticket) -> bool {
        if self.threshold == 0 {
            return false;
        }
        let mut inner = self.lock();
        if ticket == Ticket::Probe {
            inner.probe_in_flight = false;
            inner.opened_at = Some(Instant::now());
            return true;
        }
        if inner.opened_at.is_some() {
            return false;
        }
        inner.failures += 1;
        if inner.failures >= self.threshold {
            inner.opened_at = Some(Instant::now());
            return true;
        }
        false
    }

    /// The call ended without a verdict (busy, cancelled): a probe slot is handed back.
    pub fn neutral(&self, ticket: Ticket) {
        if ticket == Ticket::Probe {
            self.lock().probe_in_flight = false;
        }
    }

    /// A fresh connection generation came up: close the breaker.
    pub fn reset(&self) {
        let mut inner = self.lock();
        inner.failures = 0;
        inner.opened_at = None;
        inner.probe_in_flight = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn opens_after_threshold_and_admits_one_probe_after_cooldown() {
        let b = Breaker::new(2, Duration::from_secs(1));
        let t = b.admit().unwrap();
        assert!(!b.failure(t));
        let t = b.admit().unwrap();
        assert!(b.failure(t));
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.admit().is_none());
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(b.state(), BreakerState::HalfOpen);
        let probe = b.admit().unwrap();
        assert_eq!(probe, Ticket::Probe);
        assert!(b.admit().is_none(), "only one probe while half-open");
        b.success(probe);
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.admit(), Some(Ticket::Normal));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_reopens_and_successes_reset_the_count() {
        let b = Breaker::new(2, Duration::from_secs(1));
        b.failure(Ticket::Normal);
        b.success(Ticket::Normal);
        b.failure(Ticket::Normal);
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "success resets consecutive failures"
        );
        b.failure(Ticket::Normal);
        tokio::time::advance(Duration::from_secs(2)).await;
        let probe = b.admit().unwrap();
        assert!(b.failure(probe));
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn threshold_zero_disables_it() {
        let b = Breaker::new(0, Duration::from_secs(1));
        for _ in 0..10 {
            b.failure(Ticket::Normal);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.admit().is_some());
    }
}
