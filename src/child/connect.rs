//! Connecting: the connection pool of a shared child, one connection per session for
//! `per-session` isolation (opened on first use, reaped when idle or when the session is gone),
//! secret material resolved at the child boundary, the era learned at the first connection. The
//! dial itself goes through the runtime's [`super::connector::Connector`].

use super::*;

/// The secret values of a child's launch, resolved as its transport resolves them: every env
/// value or header that is a reference, the client secret and the run-token key. Values that do
/// not resolve are not secrets anyone holds.
pub(super) fn secret_redactor(
    spec: &ChildSpec,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> crate::telemetry::redact::Redactor {
    let mut values: Vec<&crate::secrets::SecretValue> = match &spec.launch {
        Launch::Stdio(s) => s.env.values().collect(),
        Launch::Remote(r) => {
            let mut v: Vec<_> = r.headers.values().collect();
            if let Some(grant) = &r.client_credentials {
                v.push(&grant.client_secret);
            }
            v
        }
    };
    if let Some(run_token) = &spec.run_token {
        values.push(&run_token.key);
    }
    let mut redactor = crate::telemetry::redact::Redactor::default();
    for v in values.into_iter().filter(|v| v.is_reference()) {
        if let Ok(resolved) = v.resolve_material(lookup) {
            redactor.add(&resolved);
        }
    }
    redactor
}

pub(super) fn probe_error(e: ProbeError) -> ErrorInfo {
    ErrorInfo::new(e.code(), e.to_string())
}

impl ChildRuntime {
    /// The connection a call of `session` uses: the shared pool (round-robin), or with
    /// `per-session` isolation the session's own connection, opened on first use.
    pub(super) async fn lease(&self, session: Option<&SessionTag>) -> Result<Lease, CallError> {
        let server = || self.spec.name.clone();
        let tag = match (self.spec.isolation, session) {
            (SessionIsolation::PerSession, Some(tag)) => tag,
            _ => {
                return self
                    .pick()
                    .await
                    .map(|conn| Lease {
                        conn,
                        session: None,
                    })
                    .ok_or_else(|| CallError::TransportClosed { server: server() });
            }
        };
        let slot = {
            let mut map = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(slot) = map.get(&tag.id) {
                slot.clone()
            } else {
                if map.len() >= self.spec.limits.max_sessions as usize {
                    drop(map);
                    self.reap_sessions();
                    map = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
                }
                if map.len() >= self.spec.limits.max_sessions as usize {
                    return Err(CallError::SessionsExhausted {
                        server: server(),
                        max: self.spec.limits.max_sessions,
                    });
                }
                map.entry(tag.id).or_default().clone()
            }
        };
        let opened = slot
            .get_or_try_init(|| self.open_session_conn(tag.alive.clone()))
            .await;
        let conn = match opened {
            Ok(c) if !c.stop.is_cancelled() => c.clone(),
            other => {
                if let Ok(mut map) = self.sessions.lock()
                    && map.get(&tag.id).is_some_and(|s| Arc::ptr_eq(s, &slot))
                {
                    map.remove(&tag.id);
                }
                return Err(match other {
                    Err(e) => CallError::SessionConnect {
                        server: server(),
                        code: e.code,
                    },
                    Ok(_) => CallError::TransportClosed { server: server() },
                });
            }
        };
        conn.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(Lease {
            conn: conn.conn.clone(),
            session: Some(conn),
        })
    }

    /// Opens one session's own connection and the task that closes it when stopped.
    pub(super) async fn open_session_conn(
        &self,
        alive: std::sync::Weak<()>,
    ) -> Result<Arc<SessionConn>, ErrorInfo> {
        let client = self.client.sibling();
        let Opened { running, raw } = self.connect_with(client.clone()).await?;
        let stop = self.shutdown.child_token();
        let conn = Arc::new(SessionConn {
            conn: Arc::new(Connection {
                peer: running.peer().clone(),
                routes: client.routes().clone(),
                raw,
            }),
            alive,
            last_used: std::sync::Mutex::new(Instant::now()),
            in_flight: AtomicU64::new(0),
            stop: stop.clone(),
        });
        let server = self.spec.name.clone();
        tokio::spawn(async move {
            let token = running.cancellation_token();
            let waiting = running.waiting();
            tokio::pin!(waiting);
            tokio::select! {
                _ = &mut waiting => {}
                _ = stop.cancelled() => {
                    token.cancel();
                    let _ = waiting.await;
                }
            }
            stop.cancel();
            tracing::debug!(server = %server, "per-session connection closed");
        });
        tracing::debug!(server = %self.spec.name, "per-session connection opened");
        Ok(conn)
    }

    pub(super) async fn connect_one(&self) -> Result<Opened, ErrorInfo> {
        self.connect_with(self.client.clone()).await
    }

    pub(super) async fn connect_with(&self, client: ChildClient) -> Result<Opened, ErrorInfo> {
        // Secrets (env, vault://, secret://, MCP_FLEET_SECRET_REFS) are materialized here, at the
        // child boundary, bound to this declaration (src/secrets/material.rs).
        let material = crate::config::material::materialize(&self.spec).await;
        // A failure's message reaches logs and status: never with this child's secret values.
        let redactor = secret_redactor(&self.spec, &material.lookup());
        self.open_connection(client, material).await.map_err(|e| {
            let message =
                crate::telemetry::redact::clip(&redactor.apply(&e.message), probe::MAX_REASON);
            ErrorInfo { message, ..e }
        })
    }

    pub(super) async fn open_connection(
        &self,
        client: ChildClient,
        material: crate::config::material::Material,
    ) -> Result<Opened, ErrorInfo> {
        let timeout = self.spec.limits.initialization_timeout;
        if let Some(run_token) = &self.spec.run_token {
            let key = run_token
                .key
                .resolve_material(&material.lookup())
                .map_err(|e| ErrorInfo::new(e.code(), e.to_string()))?;
            if key.len() < crate::auth::run_token::MIN_KEY_BYTES {
                return Err(ErrorInfo::new(
                    crate::transport::client_credentials::AUTH_FAILED,
                    format!(
                        "the run-token key is shorter than {} bytes",
                        crate::auth::run_token::MIN_KEY_BYTES
                    ),
                ));
            }
            if let Ok(mut k) = self.run_token_key.lock() {
                *k = Some(Arc::from(key.into_bytes()));
            }
        }
        // Why a connection fails or ends, when the transport knows (frame bound, egress, TLS).
        let fault = client.fault().clone();
        let _ = fault.take();
        let _ = fault.take_cause();
        let known = self.era().or_else(|| {
            (self.unlearned_failures.load(Ordering::Relaxed) % 2 == 1).then_some(ChildEra::Legacy)
        });
        let dialed = self
            .connector
            .dial(connector::Dial {
                spec: &self.spec,
                client: client.clone(),
                material,
                fault: fault.clone(),
                era: known,
                timeout,
            })
            .await?;
        let raw = dialed.raw;
        let running = dialed.running.map_err(|e| {
            if self.era().is_none() {
                self.unlearned_failures.fetch_add(1, Ordering::Relaxed);
            }
            match fault.take() {
                Some((code, message)) => ErrorInfo::new(code, message),
                // rmcp's error ends at "error sending request": the transport kept the cause.
                None => match fault.take_cause() {
                    Some(cause) => ErrorInfo::new(e.code(), format!("{e}: {cause}")),
                    None => probe_error(e),
                },
            }
        })?;
        let protocol = running
            .peer()
            .peer_info()
            .map(|i| i.protocol_version.clone());
        let era = match &protocol {
            Some(v) if !v.has_initialize() => ChildEra::Modern,
            _ => ChildEra::Legacy,
        };
        if let Ok(mut known) = self.era.lock()
            && known.is_none()
        {
            tracing::info!(server = %self.spec.name, protocol = ?protocol.as_ref().map(|v| v.as_str().to_string()), "child protocol era learned");
            *known = Some(era);
        }
        let protocol = protocol.map(|v| v.as_str().to_string());
        let tasks_extension = running
            .peer()
            .peer_info()
            .is_some_and(|i| i.capabilities.supports_tasks());
        self.status.send_modify(|s| {
            s.protocol = protocol;
            s.tasks_extension = tasks_extension;
        });
        // The raw channel serves 2025-era connections only: a 2026-07-28 child's results may
        // be input rounds, which take the typed path.
        let raw = raw.filter(|_| era == ChildEra::Legacy);
        Ok(Opened { running, raw })
    }

    /// The era of this child's connections, once learned.
    pub fn era(&self) -> Option<ChildEra> {
        self.era.lock().ok().and_then(|e| *e)
    }

    /// The run-token key (`auth: run-token`), once a connection resolved it.
    pub fn run_token_key(&self) -> Option<Arc<[u8]>> {
        self.run_token_key.lock().ok().and_then(|k| k.clone())
    }

    /// Opens the connection pool: one for stdio, `poolSize` for remote children.
    pub(super) async fn connect(&self) -> Result<Vec<Opened>, ErrorInfo> {
        let size = if self.spec.is_stdio() {
            1
        } else {
            self.spec.limits.pool_size.max(1) as usize
        };
        let mut pool = Vec::with_capacity(size);
        for _ in 0..size {
            match self.connect_one().await {
                Ok(r) => pool.push(r),
                Err(e) => {
                    for r in pool {
                        let _ = r.running.cancel().await;
                    }
                    return Err(e);
                }
            }
        }
        Ok(pool)
    }

    /// The next pool connection, round-robin.
    pub(super) async fn pick(&self) -> Option<Arc<Connection>> {
        let conns = self.conns.lock().await;
        if conns.is_empty() {
            return None;
        }
        let i = self.next_conn.fetch_add(1, Ordering::Relaxed) as usize % conns.len();
        Some(conns[i].clone())
    }

    /// Closes `per-session` connections whose session is gone or that sat idle past
    /// `sessionIdleTimeout`. Returns how many were closed.
    pub fn reap_sessions(&self) -> usize {
        let idle = self.spec.limits.session_idle_timeout;
        let Ok(mut map) = self.sessions.lock() else {
            return 0;
        };
        let before = map.len();
        map.retain(|_, slot| match slot.get() {
            // Still connecting: keep.
            None => true,
            Some(s) => {
                let dead = s.alive.strong_count() == 0
                    || s.stop.is_cancelled()
                    || (s.in_flight.load(Ordering::Relaxed) == 0 && s.idle_for() >= idle);
                if dead {
                    s.stop.cancel();
                }
                !dead
            }
        });
        before - map.len()
    }

    /// Open `per-session` connections.
    pub fn session_connections(&self) -> usize {
        self.sessions
            .lock()
            .map(|m| m.values().filter(|s| s.get().is_some()).count())
            .unwrap_or(0)
    }
}
