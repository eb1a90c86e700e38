//! The seam between a child runtime's rules and the way it reaches its child: a [`Connector`]
//! opens one MCP connection for a child. [`Transports`] is the real one (a stdio process,
//! streamable HTTP, legacy SSE); a test gives the runtime an in-memory one, so the runtime's
//! rules (admission, fair share, breaker, restart budget, read-only retry, schema swap) are
//! specified without a process (`child::specs`).
//!
//! What a connection needs but the transport does not decide stays in the runtime: secret
//! material is resolved before the dial, the era is learned and the status published after it.

use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::model::ProtocolVersion;
use rmcp::service::{ClientLifecycleMode, RoleClient, RunningService};

use super::{ChildClient, ChildEra, ErrorInfo, ObservedTransport};
use crate::config::material::Material;
use crate::config::{ChildSpec, Launch, TransportKind};
use crate::probe::{self, ProbeError};
use crate::transport::{self, Fault, TransportError};

/// What one dial is given.
pub struct Dial<'a> {
    /// The child's declaration.
    pub spec: &'a ChildSpec,
    /// The connection's client side (relays, routes, notifications).
    pub client: ChildClient,
    /// The child's secret material, resolved at the child boundary for this connection.
    pub material: Material,
    /// Where the transport records why a connection failed or ended.
    pub fault: Fault,
    /// The child's era, once learned (`None`: probe it).
    pub era: Option<ChildEra>,
    /// Deadline of the MCP handshake.
    pub timeout: Duration,
}

/// A dialed connection: rmcp's service (or why the handshake failed) and, for a stdio child,
/// the raw request channel of the forwarding hot path.
pub struct Dialed {
    /// The running client service.
    pub running: Result<RunningService<RoleClient, ChildClient>, ProbeError>,
    /// The raw request channel beside rmcp.
    pub raw: Option<crate::transport::raw_link::RawLink>,
}

/// Opens one connection for a child.
pub trait Connector: Send + Sync + 'static {
    /// Opens a connection; `Err` when the transport could not be opened at all (spawn, egress,
    /// TLS), `Ok` with the handshake's own outcome otherwise.
    fn dial<'a>(&'a self, dial: Dial<'a>) -> BoxFuture<'a, Result<Dialed, ErrorInfo>>;
}

/// A shared connector, as settings hold it (the real transports by default).
#[derive(Clone)]
pub struct SharedConnector(pub std::sync::Arc<dyn Connector>);

impl Default for SharedConnector {
    fn default() -> Self {
        SharedConnector(std::sync::Arc::new(Transports))
    }
}

impl std::fmt::Debug for SharedConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connector")
    }
}

/// The real transports: a stdio process, streamable HTTP (probing the era when unknown), SSE.
pub struct Transports;

impl Connector for Transports {
    fn dial<'a>(&'a self, dial: Dial<'a>) -> BoxFuture<'a, Result<Dialed, ErrorInfo>> {
        Box::pin(dial_transport(dial))
    }
}

async fn dial_transport(dial: Dial<'_>) -> Result<Dialed, ErrorInfo> {
    let Dial {
        spec,
        client,
        material,
        fault,
        era: known,
        timeout,
    } = dial;
    let mut raw = None;
    let err = |e: TransportError| ErrorInfo::new(e.code(), e.to_string());
    let modern = || ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    let running = match &spec.launch {
        Launch::Stdio(stdio) => {
            // Forked on the spawner thread (transport/stdio.rs explains why).
            let lookup = move |name: &str| material.lookup()(name);
            let t =
                transport::stdio::launch(spec.name.clone(), stdio.clone(), lookup, fault.clone())
                    .await
                    .map_err(err)?;
            raw = Some(t.raw_link());
            // Unknown era: rmcp probes `server/discover` and falls back to `initialize` on
            // the same process when the child answers it with a JSON-RPC error.
            let lifecycle = match known {
                Some(ChildEra::Legacy) => ClientLifecycleMode::Initialize,
                Some(ChildEra::Modern) => modern(),
                None => ClientLifecycleMode::Auto {
                    preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                    legacy_version: Some(ProtocolVersion::LATEST_WITH_INITIALIZE),
                },
            };
            probe::connect(
                client.clone(),
                ObservedTransport::new(t, &client),
                lifecycle,
                timeout,
            )
            .await
        }
        Launch::Remote(remote) => match remote.transport {
            // The legacy SSE transport belongs to the 2024/2025 era.
            TransportKind::Sse => {
                let t = transport::sse::connect(remote, &material.lookup(), &fault)
                    .await
                    .map_err(err)?;
                probe::connect(
                    client.clone(),
                    ObservedTransport::new(t, &client),
                    ClientLifecycleMode::Initialize,
                    timeout,
                )
                .await
            }
            _ => {
                let open = |lifecycle: ClientLifecycleMode| async {
                    let t = transport::http::streamable(
                        remote,
                        &material.lookup(),
                        &fault,
                        spec.run_token.is_some(),
                    )
                    .await
                    .map_err(err)?;
                    Ok::<_, ErrorInfo>(
                        probe::connect(
                            client.clone(),
                            ObservedTransport::new(t, &client).marking_origin(),
                            lifecycle,
                            timeout,
                        )
                        .await,
                    )
                };
                match known {
                    Some(ChildEra::Legacy) => open(ClientLifecycleMode::Initialize).await?,
                    Some(ChildEra::Modern) => open(modern()).await?,
                    None => match open(modern()).await? {
                        Ok(r) => Ok(r),
                        // A 2025-era HTTP server answers a session-less `server/discover`
                        // with an HTTP error, not a JSON-RPC one: rmcp cannot fall back on
                        // that transport, so a fresh one opens with `initialize`. A fault the
                        // transport recorded (egress, TLS, auth) is not an era question.
                        Err(e) => match fault.take() {
                            Some((code, message)) => {
                                return Err(ErrorInfo::new(code, message));
                            }
                            None => {
                                tracing::debug!(server = %spec.name, error = %e, "server/discover refused; opening with initialize");
                                open(ClientLifecycleMode::Initialize).await?
                            }
                        },
                    },
                }
            }
        },
    };
    Ok(Dialed { running, raw })
}
