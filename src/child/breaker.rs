//! Circuit breaker: consecutive transport failures or timeouts open it; after the cooldown it
//! admits exactly one probe call (half-open); that call's success closes it, its failure
//! re-opens it. Tool-level errors, child JSON-RPC errors, busy rejections (the child's bound or
//! the principal's own share) and cancellations never count. A threshold of 0 disables the
//! breaker.
//!
//! Fair share: a run of timeouts that all belong to one principal (its own slow calls) opens
//! that principal's breaker only — its calls fail fast with `child-circuit-open` for the
//! cooldown, after which one more timeout re-opens it — never the child's breaker for everyone.
//! The child's breaker opens on a run that includes a dead connection, or timeouts of more than
//! one principal (or of calls no principal is known for).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
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
    /// The single half-open probe of a principal's own breaker.
    PrincipalProbe,
}

/// What failed a call, for the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The connection died: the child's failure, whoever called.
    Transport,
    /// No answer within the call timeout: a wedged child, or a slow call of one principal.
    Timeout,
}

/// Whose failures make up the current run of consecutive failures.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Run {
    /// No failure yet.
    Empty,
    /// Timeouts of this principal only.
    One(Arc<str>),
    /// A dead connection, or timeouts of several principals (or of an unknown one).
    Wide,
}

/// One principal's own run of timeouts.
#[derive(Debug)]
struct Trip {
    failures: u32,
    opened_at: Option<Instant>,
    probe_in_flight: bool,
}

/// Most principals whose timeouts are tracked at once (the oldest closed runs go first).
const MAX_TRIPS: usize = 4096;

#[derive(Debug)]
struct Inner {
    failures: u32,
    run: Run,
    opened_at: Option<Instant>,
    probe_in_flight: bool,
    trips: HashMap<Arc<str>, Trip>,
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
                run: Run::Empty,
                opened_at: None,
                probe_in_flight: false,
                trips: HashMap::new(),
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

    /// Admits a call of `principal`, or refuses it while open (or while the half-open probe is
    /// in flight), or while the principal's own breaker is open.
    pub fn admit(&self, principal: Option<&str>) -> Option<Ticket> {
        if self.threshold == 0 {
            return Some(Ticket::Normal);
        }
        let mut inner = self.lock();
        // The principal's own breaker: open, or half-open with its one probe in flight.
        let trip_probe = match principal.and_then(|p| inner.trips.get(p)) {
            Some(Trip {
                opened_at: Some(at),
                probe_in_flight,
                ..
            }) => {
                if at.elapsed() < self.cooldown || *probe_in_flight {
                    return None;
                }
                true
            }
            _ => false,
        };
        let ticket = match inner.opened_at {
            None => Some(Ticket::Normal),
            Some(at) if at.elapsed() >= self.cooldown && !inner.probe_in_flight => {
                inner.probe_in_flight = true;
                Some(Ticket::Probe)
            }
            Some(_) => None,
        };
        if trip_probe
            && ticket == Some(Ticket::Normal)
            && let Some(trip) = principal.and_then(|p| inner.trips.get_mut(p))
        {
            trip.probe_in_flight = true;
            return Some(Ticket::PrincipalProbe);
        }
        ticket
    }

    /// The call of `principal` reached the child and got an answer (tool errors included).
    pub fn success(&self, ticket: Ticket, principal: Option<&str>) {
        let mut inner = self.lock();
        if let Some(p) = principal {
            inner.trips.remove(p);
        }
        if ticket == Ticket::Probe || inner.opened_at.is_none() {
            inner.failures = 0;
            inner.run = Run::Empty;
            inner.opened_at = None;
            inner.probe_in_flight = false;
        }
    }

    /// The call of `principal` failed (`what`). Returns true if this opened the child's
    /// breaker (a principal's own breaker opening returns false).
    pub fn failure(&self, ticket: Ticket, principal: Option<&str>, what: Failure) -> bool {
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
        inner.run = match (what, principal, &inner.run) {
            (Failure::Timeout, Some(p), Run::Empty) => Run::One(Arc::from(p)),
            (Failure::Timeout, Some(p), Run::One(q)) if **q == *p => Run::One(q.clone()),
            _ => Run::Wide,
        };
        if let (Failure::Timeout, Some(p)) = (what, principal) {
            self.trip(&mut inner, p);
        } else if ticket == Ticket::PrincipalProbe
            && let Some(trip) = principal.and_then(|p| inner.trips.get_mut(p))
        {
            trip.probe_in_flight = false;
        }
        if inner.failures >= self.threshold && inner.run == Run::Wide {
            inner.opened_at = Some(Instant::now());
            return true;
        }
        false
    }

    /// Counts a timeout against `principal`'s own breaker.
    fn trip(&self, inner: &mut Inner, principal: &str) {
        if inner.trips.len() >= MAX_TRIPS && !inner.trips.contains_key(principal) {
            inner.trips.retain(|_, t| t.opened_at.is_some());
            if inner.trips.len() >= MAX_TRIPS {
                return;
            }
        }
        let threshold = self.threshold;
        let trip = inner.trips.entry(Arc::from(principal)).or_insert(Trip {
            failures: 0,
            opened_at: None,
            probe_in_flight: false,
        });
        trip.failures += 1;
        if trip.failures >= threshold {
            // Its half-open probe's timeout re-opens it at once.
            trip.failures = threshold - 1;
            trip.opened_at = Some(Instant::now());
            trip.probe_in_flight = false;
        }
    }

    /// Whether `principal`'s own breaker is open now.
    pub fn principal_open(&self, principal: &str) -> bool {
        self.lock()
            .trips
            .get(principal)
            .and_then(|t| t.opened_at)
            .is_some_and(|at| at.elapsed() < self.cooldown)
    }

    /// Principals whose own breaker is open now.
    pub fn open_principals(&self) -> usize {
        self.lock()
            .trips
            .values()
            .filter(|t| t.opened_at.is_some_and(|at| at.elapsed() < self.cooldown))
            .count()
    }

    /// The call ended without a verdict (busy, cancelled): a probe slot is handed back.
    pub fn neutral(&self, ticket: Ticket, principal: Option<&str>) {
        let mut inner = self.lock();
        match ticket {
            Ticket::Probe => inner.probe_in_flight = false,
            Ticket::PrincipalProbe => {
                if let Some(trip) = principal.and_then(|p| inner.trips.get_mut(p)) {
                    trip.probe_in_flight = false;
                }
            }
            Ticket::Normal => {}
        }
    }

    /// A fresh connection generation came up: close the breaker.
    pub fn reset(&self) {
        let mut inner = self.lock();
        inner.failures = 0;
        inner.run = Run::Empty;
        inner.opened_at = None;
        inner.probe_in_flight = false;
        inner.trips.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn opens_after_threshold_and_admits_one_probe_after_cooldown() {
        let b = Breaker::new(2, Duration::from_secs(1));
        let t = b.admit(None).unwrap();
        assert!(!b.failure(t, None, Failure::Timeout));
        let t = b.admit(None).unwrap();
        assert!(b.failure(t, None, Failure::Transport));
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.admit(None).is_none());
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(b.state(), BreakerState::HalfOpen);
        let probe = b.admit(None).unwrap();
        assert_eq!(probe, Ticket::Probe);
        assert!(b.admit(None).is_none(), "only one probe while half-open");
        b.success(probe, None);
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.admit(None), Some(Ticket::Normal));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_reopens_and_successes_reset_the_count() {
        let b = Breaker::new(2, Duration::from_secs(1));
        b.failure(Ticket::Normal, None, Failure::Transport);
        b.success(Ticket::Normal, None);
        b.failure(Ticket::Normal, None, Failure::Transport);
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "success resets consecutive failures"
        );
        b.failure(Ticket::Normal, None, Failure::Transport);
        tokio::time::advance(Duration::from_secs(2)).await;
        let probe = b.admit(None).unwrap();
        assert!(b.failure(probe, None, Failure::Transport));
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn threshold_zero_disables_it() {
        let b = Breaker::new(0, Duration::from_secs(1));
        for _ in 0..10 {
            b.failure(Ticket::Normal, Some("p"), Failure::Timeout);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.admit(Some("p")).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn one_principals_timeouts_open_only_its_own_breaker() {
        let b = Breaker::new(3, Duration::from_secs(1));
        for _ in 0..10 {
            let t = b.admit(Some("noisy")).unwrap_or(Ticket::Normal);
            assert!(!b.failure(t, Some("noisy"), Failure::Timeout));
        }
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "the child's breaker stays closed"
        );
        assert!(
            b.admit(Some("noisy")).is_none(),
            "the noisy principal fails fast"
        );
        assert!(b.principal_open("noisy"));
        assert_eq!(b.admit(Some("victim")), Some(Ticket::Normal));
        // After the cooldown one call is let through (the probe); its timeout re-opens at once.
        tokio::time::advance(Duration::from_millis(1001)).await;
        let t = b.admit(Some("noisy")).unwrap();
        assert_eq!(t, Ticket::PrincipalProbe);
        assert!(b.admit(Some("noisy")).is_none(), "one probe at a time");
        b.failure(t, Some("noisy"), Failure::Timeout);
        assert!(b.admit(Some("noisy")).is_none());
        // Its success closes it.
        tokio::time::advance(Duration::from_millis(1001)).await;
        let t = b.admit(Some("noisy")).unwrap();
        b.success(t, Some("noisy"));
        assert!(!b.principal_open("noisy"));
        assert_eq!(b.open_principals(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn timeouts_of_several_principals_or_dead_connections_open_it_for_everyone() {
        let b = Breaker::new(3, Duration::from_secs(1));
        b.failure(Ticket::Normal, Some("a"), Failure::Timeout);
        b.failure(Ticket::Normal, Some("a"), Failure::Timeout);
        assert!(b.failure(Ticket::Normal, Some("b"), Failure::Timeout));
        assert_eq!(b.state(), BreakerState::Open);
        let b = Breaker::new(2, Duration::from_secs(1));
        b.failure(Ticket::Normal, Some("a"), Failure::Timeout);
        assert!(b.failure(Ticket::Normal, Some("a"), Failure::Transport));
        let b = Breaker::new(2, Duration::from_secs(1));
        b.failure(Ticket::Normal, None, Failure::Timeout);
        assert!(b.failure(Ticket::Normal, None, Failure::Timeout));
    }
}
