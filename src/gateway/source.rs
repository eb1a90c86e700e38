//! Where the fleet comes from (a file or an McpFleet), where its generation record lives
//! (the state directory or Leases), and the one reload loop that applies every later version
//! whichever source sent it.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;

use tokio::sync::mpsc::UnboundedReceiver;

use super::{BuildError, Config, setting};
use crate::config::{self, AdmissionContext, ConfigIssue, Fleet};
use crate::kube::lease_store::LeaseStore;
use crate::kube::source::FleetRef;
use crate::mux::{Multiplexer, MuxSettings, Stores};

/// Where the fleet comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FleetSpec {
    /// A fleet file, watched for hot reloads. `None`: `$GRAPH_OS_CONFIG`, `./mcp_config.json`,
    /// then the XDG config directory's; none found: an empty fleet.
    File(Option<PathBuf>),
    /// The McpFleet `kube://NAMESPACE/NAME`, watched; generations and heartbeats in its
    /// namespace's Leases.
    McpFleet(String),
}

/// A fleet version, or why it cannot be used at all (both sources send these).
type Update = Result<Fleet, Vec<ConfigIssue>>;

/// A source opened: its first version and what the reload loop and the store need.
pub(super) struct Opened {
    /// The first fleet version.
    pub initial: Fleet,
    /// The fleet file being served (keys the default state directory), if any.
    pub config_path: Option<PathBuf>,
    kind: Kind,
}

enum Kind {
    File {
        ctx_path: Option<PathBuf>,
        leases: Option<LeaseStore>,
    },
    McpFleet {
        client: ::kube::Client,
        fleet: FleetRef,
        updates: UnboundedReceiver<Update>,
        observed: Arc<AtomicI64>,
    },
}

/// A running source: the reload loop, the file watcher, the McpFleet status writer.
pub(super) struct Running {
    reload: Option<tokio::task::JoinHandle<()>>,
    _watcher: Option<notify::RecommendedWatcher>,
    status_writer: Option<crate::kube::status::StatusWriter>,
}

impl Running {
    /// Stops applying versions and hands the status Lease over at once instead of letting it
    /// expire.
    pub(super) async fn stop(self) {
        if let Some(reload) = self.reload {
            reload.abort();
        }
        if let Some(writer) = self.status_writer {
            writer.stop().await;
        }
    }
}

async fn kube_client() -> Result<::kube::Client, BuildError> {
    crate::net::crypto::install_crypto();
    ::kube::Client::try_default()
        .await
        .map_err(|e| BuildError::Kubernetes(e.to_string()))
}

fn lease_store(client: ::kube::Client, at: &FleetRef) -> LeaseStore {
    LeaseStore::new(::kube::Api::namespaced(client, &at.namespace), &at.name)
}

/// Opens the source and reads its first version.
pub(super) async fn open(config: &Config, ctx: &AdmissionContext) -> Result<Opened, BuildError> {
    match &config.fleet {
        FleetSpec::McpFleet(reference) => {
            let fleet: FleetRef = reference.parse().map_err(|e| setting("--fleet", e))?;
            let client = kube_client().await?;
            crate::secrets::set_backend(Arc::new(crate::kube::secrets::KubeSecrets::new(
                client.clone(),
            )));
            let observed = Arc::new(AtomicI64::new(0));
            let mut updates = crate::kube::source::watch(
                client.clone(),
                fleet.clone(),
                ctx.clone(),
                observed.clone(),
            );
            let initial = match tokio::time::timeout(
                std::time::Duration::from_secs(30),
                updates.recv(),
            )
            .await
            {
                Ok(Some(Ok(f))) => f,
                Ok(Some(Err(issues))) => Fleet {
                    issues,
                    ..Fleet::empty(fleet.to_string())
                },
                _ => {
                    tracing::warn!(fleet = %fleet, "no McpFleet version within 30 s: serving an empty fleet until it arrives");
                    Fleet::empty(fleet.to_string())
                }
            };
            Ok(Opened {
                initial,
                config_path: None,
                kind: Kind::McpFleet {
                    client,
                    fleet,
                    updates,
                    observed,
                },
            })
        }
        FleetSpec::File(path) => {
            let initial = match config::resolve_config_path(path.as_deref()) {
                Some(p) => config::load_file(&p, ctx)?,
                None => {
                    tracing::warn!(
                        "no fleet file found (--config, $GRAPH_OS_CONFIG, ./mcp_config.json, XDG config dir): serving an empty fleet"
                    );
                    Fleet::empty("none")
                }
            };
            let leases = match &config.generation_store {
                Some(r) => {
                    let at: FleetRef = r.parse().map_err(|e| setting("--generation-store", e))?;
                    Some(lease_store(kube_client().await?, &at))
                }
                None => None,
            };
            let config_path = config::resolve_config_path(path.as_deref()).filter(|p| p.is_file());
            Ok(Opened {
                initial,
                config_path: config_path.clone(),
                kind: Kind::File {
                    ctx_path: config_path,
                    leases,
                },
            })
        }
    }
}

impl Opened {
    /// Starts the multiplexer on the first version and the reload loop on the later ones.
    pub(super) fn start(
        self,
        settings: MuxSettings,
        ctx: AdmissionContext,
    ) -> Result<(Arc<Multiplexer>, Running), BuildError> {
        match self.kind {
            Kind::McpFleet {
                client,
                fleet,
                updates,
                observed,
            } => {
                let stores = Stores::open(&settings.state_dir)?
                    .with_generations(Arc::new(lease_store(client.clone(), &fleet)));
                let mux = Multiplexer::start_with(self.initial, settings, stores);
                let reload = reload_loop(mux.clone(), updates);
                let writer = crate::kube::status::spawn(client, fleet, mux.clone(), observed);
                Ok((
                    mux,
                    Running {
                        reload: Some(reload),
                        _watcher: None,
                        status_writer: Some(writer),
                    },
                ))
            }
            Kind::File { ctx_path, leases } => {
                let mut stores = Stores::open(&settings.state_dir)?;
                if let Some(leases) = leases {
                    stores = stores.with_generations(Arc::new(leases));
                }
                let mux = Multiplexer::start_with(self.initial, settings, stores);
                // Hot reload: the watcher lives as long as the source runs.
                let (watcher, reload) = match &ctx_path {
                    Some(path) => match config::watch::watch(path, ctx) {
                        Ok((watcher, updates)) => {
                            (Some(watcher), Some(reload_loop(mux.clone(), updates)))
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot watch the fleet file; hot reload is off");
                            (None, None)
                        }
                    },
                    None => (None, None),
                };
                Ok((
                    mux,
                    Running {
                        reload,
                        _watcher: watcher,
                        status_writer: None,
                    },
                ))
            }
        }
    }
}

/// The one reload loop: every version either source sends is applied by
/// [`Multiplexer::reload`] (which keeps the fleet on an unusable version and records why).
fn reload_loop(
    mux: Arc<Multiplexer>,
    mut updates: UnboundedReceiver<Update>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(update) = updates.recv().await {
            let _ = mux.reload(update).await;
        }
    })
}
