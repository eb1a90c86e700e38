//! Admission: the one gate every request to the child passes (typed path, raw hot path, task
//! requests): the child up, its breaker and the principal's closed, a slot of the principal's
//! share and then of the child's within the queue timeout; and settling the outcome with the
//! breaker.

use super::*;

/// A request holding a slot of the child's limiter (see [`ChildRuntime::admit`]).
pub(super) struct Admitted<'a> {
    pub(super) ticket: Ticket,
    /// The caller's principal, if known.
    pub(super) principal: Option<Arc<str>>,
    /// Its slot of the principal's share (released with the child's slot).
    pub(super) _share: Option<share::Share>,
    pub(super) _permit: tokio::sync::OwnedSemaphorePermit,
    pub(super) _guard: InFlightGuard<'a>,
    /// The connection generation when it was admitted.
    pub(super) generation: u64,
}

pub(super) struct InFlightGuard<'a>(&'a AtomicU64);

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ChildRuntime {
    /// Breaker state.
    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// Principals whose own breaker is open on this child (their own calls timed out).
    pub fn principal_breakers_open(&self) -> usize {
        self.breaker.open_principals()
    }

    /// Current load counters.
    pub fn load(&self) -> Load {
        Load {
            in_flight: self.in_flight.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Relaxed),
        }
    }

    /// Admits one request under the child's limits — the one admission of the typed path, the
    /// raw hot path and task requests: the child must be up (or settle within the queue
    /// timeout), its breaker and the principal's own closed, and within the queue timeout one
    /// of the principal's share of slots (`maxConcurrencyPerPrincipal`) and then one of the
    /// child's (`maxConcurrency`) free.
    pub(super) async fn admit(
        &self,
        ct: &CancellationToken,
        session: Option<&SessionTag>,
    ) -> Result<Admitted<'_>, CallError> {
        let server = self.spec.name.clone();
        let limits = &self.spec.limits;
        let principal = session.map(|s| s.principal.clone());
        let status = self.status();
        let status = match status.state {
            ChildState::Up => status,
            ChildState::Failed => {
                return Err(CallError::Unavailable {
                    server,
                    state: status.state,
                });
            }
            _ => {
                self.wait_settled(limits.queue_timeout.min(Duration::from_secs(5)))
                    .await
            }
        };
        if status.state != ChildState::Up {
            return Err(CallError::Unavailable {
                server,
                state: status.state,
            });
        }
        let Some(ticket) = self.breaker.admit(principal.as_deref()) else {
            return Err(CallError::CircuitOpen { server });
        };
        self.queued.fetch_add(1, Ordering::Relaxed);
        let wait = {
            use tracing::Instrument;
            let span = tracing::info_span!("queue_wait", server = %server);
            // The principal's share first: a principal at its cap waits for its own calls and
            // never takes a slot another principal could have.
            let share = self.share.clone();
            let limiter = self.limiter.clone();
            let principal = principal.clone();
            let slots = async move {
                let share = match &principal {
                    Some(p) => Some(share.acquire(p).await),
                    None => None,
                };
                limiter.acquire_owned().await.map(|permit| (share, permit))
            };
            tokio::time::timeout(limits.queue_timeout, slots).instrument(span)
        };
        let permit = tokio::select! {
            p = wait => p,
            _ = ct.cancelled() => {
                self.queued.fetch_sub(1, Ordering::Relaxed);
                self.breaker.neutral(ticket, principal.as_deref());
                return Err(CallError::Cancelled);
            }
        };
        self.queued.fetch_sub(1, Ordering::Relaxed);
        let Ok(Ok((share, permit))) = permit else {
            self.breaker.neutral(ticket, principal.as_deref());
            return Err(CallError::Busy {
                server,
                waited: limits.queue_timeout,
            });
        };
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(Admitted {
            ticket,
            principal,
            _share: share,
            _permit: permit,
            _guard: InFlightGuard(&self.in_flight),
            generation: status.connection_generation,
        })
    }

    /// Reports an admitted request's outcome to the breaker (timeouts and dead transports count
    /// as failures; the child's own errors as successes) and frees its slot.
    pub(super) fn settle<T>(&self, admitted: Admitted<'_>, outcome: &Result<T, CallError>) {
        let ticket = admitted.ticket;
        let principal = admitted.principal.as_deref();
        let failure = match outcome {
            Ok(_) | Err(CallError::Rpc(_)) => {
                self.breaker.success(ticket, principal);
                None
            }
            Err(CallError::Timeout { .. }) => Some(Failure::Timeout),
            Err(CallError::TransportClosed { .. }) => Some(Failure::Transport),
            Err(_) => {
                self.breaker.neutral(ticket, principal);
                None
            }
        };
        if let Some(failure) = failure {
            if self.breaker.failure(ticket, principal, failure) {
                tracing::warn!(server = %self.spec.name, "circuit breaker opened");
            } else if principal.is_some_and(|p| self.breaker.principal_open(p)) {
                // A principal's own slow calls: only its calls fail fast.
                tracing::debug!(server = %self.spec.name, "a principal's own breaker is open");
            }
        }
    }
}
