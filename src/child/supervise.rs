//! Supervising: connect, list the catalog, publish it before the connection generation takes
//! calls, follow list changes, and on a crash restart with exponential backoff within the
//! restart budget (a boot failure is retried the same way; `maxRestarts: 0` fails at once).

use super::connect::probe_error;
use super::*;

/// Restart backoff: 0.5 s doubling to 30 s, with ×U(0.5, 1.5) jitter.
pub fn backoff(attempt: u32) -> Duration {
    let base = (0.5f64 * 2f64.powi(attempt.min(16) as i32)).min(30.0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let jitter = 0.5 + (nanos % 1000) as f64 / 1000.0;
    Duration::from_secs_f64(base * jitter)
}

impl ChildRuntime {
    pub(super) fn transition(&self, state: ChildState, error: Option<ErrorInfo>) {
        let reason = error.as_ref().map_or("ok", |e| e.code.as_str()).to_string();
        tracing::info!(server = %self.spec.name, state = ?state, reason = %reason, "child state");
        if let (ChildState::Failed, Some(e)) = (state, &error) {
            tracing::warn!(server = %self.spec.name, code = %e.code, error = %e.message, "child failed");
        }
        crate::telemetry::metrics().transition(&self.spec.name, state);
        self.status.send_modify(|s| {
            s.state = state;
            if error.is_some() || state == ChildState::Up {
                s.last_error = error;
            }
        });
    }

    /// Publishes a freshly listed catalog; an identical one changes nothing but the time it
    /// was last confirmed (watchers are not woken for that).
    pub(super) fn publish_catalog(&self, catalog: impl Into<Arc<ChildCatalog>>) {
        let catalog: Arc<ChildCatalog> = catalog.into();
        let fingerprint = catalog.fingerprint();
        self.status.send_if_modified(|s| {
            s.catalog_listed_at = Some(Instant::now());
            if s.fingerprint.as_deref() == Some(fingerprint.as_str()) {
                return false;
            }
            tracing::info!(server = %self.spec.name, tools = catalog.tools.len(), skills = catalog.skills.len(), "child catalog changed");
            s.catalog = Some(catalog);
            s.fingerprint = Some(fingerprint);
            true
        });
    }

    pub(super) async fn supervise(self: Arc<Self>) {
        let mut restarts: VecDeque<Instant> = VecDeque::new();
        let mut attempt = 0u32;
        let mut ever_up = false;
        // The failure that kept the child from ever coming up (reported if the budget runs out).
        let mut boot_error: Option<ErrorInfo> = None;
        let limits = self.spec.limits.clone();
        loop {
            let connected = {
                use tracing::Instrument;
                let span = tracing::info_span!(
                    "child.probe",
                    otel.name = %format!("probe {}", self.spec.name),
                    server = %self.spec.name,
                    step = "connect",
                    attempt,
                );
                tokio::select! {
                    r = self.connect().instrument(span) => r,
                    _ = self.shutdown.cancelled() => return,
                }
            };
            // A failure before the child ever came up is retried like a crash (same backoff and
            // budget), so a dependency that starts later is picked up; a missing command waits
            // longer between attempts.
            let mut slow = false;
            match connected {
                Err(err) => {
                    slow = err.code == "child-spawn-failed";
                    tracing::warn!(
                        server = %self.spec.name,
                        code = %err.code,
                        attempt,
                        error = %err.message,
                        "child connection failed"
                    );
                    if !ever_up {
                        boot_error = Some(err.clone());
                    }
                    self.status.send_modify(|s| s.last_error = Some(err));
                }
                Ok(pool) => 'up: {
                    let peer = pool[0].running.peer().clone();
                    let peers: Vec<_> = pool
                        .iter()
                        .map(|r| (r.running.peer().clone(), r.raw.clone()))
                        .collect();
                    // One task per pool member: it reports the member closing, and stops it when
                    // this generation ends.
                    let generation = CancellationToken::new();
                    let (closed_tx, mut closed_rx) = tokio::sync::mpsc::channel::<()>(pool.len());
                    for Opened { running, .. } in pool {
                        let token = running.cancellation_token();
                        let (generation, closed_tx) = (generation.clone(), closed_tx.clone());
                        tokio::spawn(async move {
                            let waiting = running.waiting();
                            tokio::pin!(waiting);
                            tokio::select! {
                                _ = &mut waiting => {}
                                _ = generation.cancelled() => {
                                    token.cancel();
                                    let _ = waiting.await;
                                }
                            }
                            let _ = closed_tx.send(()).await;
                        });
                    }
                    if self.era() == Some(ChildEra::Modern) {
                        let (client, peer, stop) =
                            (self.client.clone(), peer.clone(), generation.clone());
                        tokio::spawn(async move { client.follow_list_changes(peer, stop).await });
                    }
                    let stop_all = || generation.cancel();
                    let listing = {
                        use tracing::Instrument;
                        let span = tracing::info_span!(
                            "child.probe",
                            otel.name = %format!("probe {}", self.spec.name),
                            server = %self.spec.name,
                            step = "list",
                            attempt,
                        );
                        probe::list_catalog(&peer, self.bounds, limits.probe_timeout)
                            .instrument(span)
                    };
                    let listed = tokio::select! {
                        r = listing => r,
                        _ = self.shutdown.cancelled() => { stop_all(); return }
                    };
                    let catalog = match listed {
                        Ok(c) => c,
                        Err(e) if !ever_up => {
                            // Listing failed at boot: retried like a boot failure.
                            stop_all();
                            let err = probe_error(e);
                            boot_error = Some(err.clone());
                            self.status.send_modify(|s| s.last_error = Some(err));
                            break 'up;
                        }
                        Err(e) => {
                            // Keep the prior catalog (and its names) but fail the child closed.
                            stop_all();
                            self.transition(
                                ChildState::Failed,
                                Some(ErrorInfo::new(
                                    "schema-refresh-failed",
                                    format!("relisting after reconnect failed: {e}"),
                                )),
                            );
                            return;
                        }
                    };
                    attempt = 0;
                    ever_up = true;
                    boot_error = None;
                    // The replacement catalog is published before the new generation takes calls.
                    self.publish_catalog(catalog);
                    *self.conns.lock().await = peers
                        .into_iter()
                        .map(|(peer, raw)| {
                            Arc::new(Connection {
                                peer,
                                routes: self.client.routes().clone(),
                                raw,
                            })
                        })
                        .collect();
                    self.breaker.reset();
                    self.status.send_modify(|s| s.connection_generation += 1);
                    self.transition(ChildState::Up, None);
                    // Any pool member closing ends this generation.
                    loop {
                        tokio::select! {
                            _ = closed_rx.recv() => break,
                            _ = self.client.relist_requested() => {
                                match probe::list_catalog(&peer, self.bounds, limits.probe_timeout).await {
                                    Ok(c) => self.publish_catalog(c),
                                    Err(e) => {
                                        self.conns.lock().await.clear();
                                        stop_all();
                                        self.transition(
                                            ChildState::Failed,
                                            Some(ErrorInfo::new("schema-refresh-failed", format!("relisting after list_changed failed: {e}"))),
                                        );
                                        return;
                                    }
                                }
                            }
                            _ = self.shutdown.cancelled() => {
                                stop_all();
                                return;
                            }
                        }
                    }
                    stop_all();
                    self.conns.lock().await.clear();
                    // A transport fault (e.g. child-frame-too-large) names why it closed.
                    let closed = match self.client.fault().take() {
                        Some((code, message)) => ErrorInfo::new(code, message),
                        None => ErrorInfo::new("child-exited", "the child's connection closed"),
                    };
                    tracing::warn!(
                        server = %self.spec.name,
                        code = %closed.code,
                        error = %closed.message,
                        "child connection lost"
                    );
                    self.status.send_modify(|s| s.last_error = Some(closed));
                }
            }
            if self.shutdown.is_cancelled() {
                return;
            }
            // Restart budget: at most max_restarts within restart_window.
            let now = Instant::now();
            while restarts
                .front()
                .is_some_and(|t| now.duration_since(*t) > limits.restart_window)
            {
                restarts.pop_front();
            }
            if restarts.len() as u32 >= limits.max_restarts {
                let failure = match boot_error.take() {
                    // Never came up: keep the boot failure's own code.
                    Some(e) if limits.max_restarts == 0 => e,
                    Some(e) => ErrorInfo::new(
                        &e.code,
                        format!(
                            "{} (gave up after {} attempts)",
                            e.message,
                            restarts.len() + 1
                        ),
                    ),
                    None => {
                        let prior = self
                            .status()
                            .last_error
                            .map(|e| e.message)
                            .unwrap_or_default();
                        ErrorInfo::new("restart-budget-exhausted", prior)
                    }
                };
                crate::memory::release_free_memory();
                self.transition(ChildState::Failed, Some(failure));
                return;
            }
            // The dropped connection's buffers (up to a frame bound) go back to the OS.
            crate::memory::release_free_memory();
            restarts.push_back(now);
            self.status.send_modify(|s| s.restarts += 1);
            crate::telemetry::metrics().restart(&self.spec.name);
            self.transition(ChildState::Restarting, None);
            let mut backoff = backoff(attempt);
            if slow {
                backoff = backoff.max(Duration::from_secs(5));
            }
            attempt += 1;
            let after = self.status().last_error.map(|e| e.code).unwrap_or_default();
            tracing::info!(server = %self.spec.name, backoff_ms = backoff.as_millis() as u64, after = %after, "child restart scheduled");
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    /// Lists the child's catalog again on its live connection under `deadline` and publishes it
    /// (an identical catalog changes nothing). Fails if the child is not up or any family fails.
    pub async fn relist(&self, deadline: Duration) -> Result<u64, ErrorInfo> {
        let (catalog, generation) = self.probe_catalog(deadline).await?;
        self.adopt_catalog(catalog, generation);
        Ok(generation)
    }

    /// Lists the child's catalog on its live connection under `deadline` without serving it (a
    /// refresh candidate is built beside the served view); returns the catalog and the
    /// connection generation it was listed on.
    pub async fn probe_catalog(
        &self,
        deadline: Duration,
    ) -> Result<(Arc<ChildCatalog>, u64), ErrorInfo> {
        let status = self.status();
        if status.state != ChildState::Up {
            return Err(ErrorInfo::new(
                "child-unavailable",
                format!("server '{}' is {:?}", self.spec.name, status.state),
            ));
        }
        let Some(conn) = self.pick().await else {
            return Err(ErrorInfo::new(
                "child-unavailable",
                format!("server '{}' has no connection", self.spec.name),
            ));
        };
        let catalog = probe::list_catalog(&conn.peer, self.bounds, deadline)
            .await
            .map_err(probe_error)?;
        Ok((Arc::new(catalog), status.connection_generation))
    }

    /// Serves a catalog from [`Self::probe_catalog`] unless the connection changed since (a
    /// newer connection listed its own). Returns whether it was adopted.
    pub fn adopt_catalog(&self, catalog: Arc<ChildCatalog>, generation: u64) -> bool {
        if self.status().connection_generation != generation {
            return false;
        }
        self.publish_catalog(catalog);
        true
    }
}
