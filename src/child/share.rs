//! Fair share of one child between principals: a principal's calls in flight (or queued for a
//! slot) on a child are capped at `maxConcurrencyPerPrincipal` (default half of
//! `maxConcurrency`, at least 1), so another principal always finds a slot however many slow
//! calls one principal keeps open. Part of [`super::ChildRuntime::admit`], the one admission of
//! the typed path, the raw hot path and task requests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The per-principal bound of one child.
#[derive(Debug)]
pub(super) struct FairShare {
    cap: u32,
    /// Principals with a call admitted or waiting: their slots and how many calls hold or wait
    /// for one (the entry goes with the last).
    shares: Mutex<Shares>,
}

/// Each principal's slots and how many calls hold or wait for one.
type Shares = HashMap<Arc<str>, (Arc<Semaphore>, usize)>;

/// One principal's claim on its share, from the wait for a slot until the call ends; its
/// principal's entry is dropped with the last claim (also one that gave up waiting).
pub(super) struct Share {
    permit: Option<OwnedSemaphorePermit>,
    principal: Arc<str>,
    owner: Arc<FairShare>,
}

impl Drop for Share {
    fn drop(&mut self) {
        drop(self.permit.take());
        let mut shares = self.owner.lock();
        if let Some((_, users)) = shares.get_mut(&self.principal) {
            *users -= 1;
            if *users == 0 {
                shares.remove(&self.principal);
            }
        }
    }
}

impl FairShare {
    /// `cap` slots per principal (at least 1).
    pub(super) fn new(cap: u32) -> Arc<Self> {
        Arc::new(FairShare {
            cap: cap.max(1),
            shares: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shares> {
        self.shares.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for one of `principal`'s slots (the caller bounds the wait; dropping the future
    /// gives the claim up).
    pub(super) async fn acquire(self: &Arc<Self>, principal: &str) -> Share {
        let (mut share, semaphore) = {
            let mut shares = self.lock();
            let key = shares
                .get_key_value(principal)
                .map_or_else(|| Arc::from(principal), |(k, _)| k.clone());
            let cap = self.cap as usize;
            let entry = shares
                .entry(key.clone())
                .or_insert_with(|| (Arc::new(Semaphore::new(cap)), 0));
            entry.1 += 1;
            let semaphore = entry.0.clone();
            let share = Share {
                permit: None,
                principal: key,
                owner: self.clone(),
            };
            (share, semaphore)
        };
        // The semaphore is never closed.
        share.permit = semaphore.acquire_owned().await.ok();
        share
    }

    /// Principals holding or waiting for a slot.
    #[cfg(test)]
    fn principals(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_principal_gets_at_most_its_cap_and_others_are_not_held() {
        let share = FairShare::new(2);
        let a1 = share.acquire("a").await;
        let _a2 = share.acquire("a").await;
        // A third slot for "a" waits...
        let third = tokio::time::timeout(Duration::from_millis(50), share.acquire("a")).await;
        assert!(third.is_err(), "a third call of the same principal waits");
        // ...while "b" gets one at once.
        let b = tokio::time::timeout(Duration::from_millis(50), share.acquire("b")).await;
        assert!(b.is_ok());
        drop(b);
        drop(a1);
        let again = tokio::time::timeout(Duration::from_millis(50), share.acquire("a")).await;
        assert!(again.is_ok(), "a freed slot is the principal's again");
    }

    #[tokio::test]
    async fn entries_go_with_their_last_slot_and_with_abandoned_waits() {
        let share = FairShare::new(1);
        let a = share.acquire("a").await;
        assert_eq!(share.principals(), 1);
        let gave_up = tokio::time::timeout(Duration::from_millis(20), share.acquire("a")).await;
        assert!(gave_up.is_err());
        assert_eq!(share.principals(), 1, "the holder keeps its entry");
        drop(a);
        assert_eq!(share.principals(), 0, "no slot held, no waiter: no entry");
        let b = tokio::time::timeout(Duration::from_millis(20), share.acquire("b")).await;
        drop(b);
        assert_eq!(share.principals(), 0);
    }
}
