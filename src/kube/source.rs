//! The McpFleet as a fleet source: `--fleet kube://NAMESPACE/NAME` watches one McpFleet with
//! kube's watcher and yields every version of its spec, validated exactly like a fleet file, so
//! the same hot-reload diff applies. A deleted or unreadable resource is reported, never applied.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::mpsc;

use super::crd::McpFleet;
use crate::config::{AdmissionContext, ConfigIssue, Fleet, validate_document};

/// `kube://NAMESPACE/NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetRef {
    /// Namespace of the McpFleet.
    pub namespace: String,
    /// Name of the McpFleet.
    pub name: String,
}

impl std::str::FromStr for FleetRef {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let rest = s
            .strip_prefix("kube://")
            .ok_or("a fleet reference looks like kube://NAMESPACE/NAME")?;
        let (namespace, name) = rest
            .split_once('/')
            .ok_or("a fleet reference looks like kube://NAMESPACE/NAME")?;
        let dns = |x: &str| {
            !x.is_empty()
                && x.len() <= 253
                && x.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        };
        if !dns(namespace) || !dns(name) {
            return Err("namespace and name must be DNS names".into());
        }
        Ok(FleetRef {
            namespace: namespace.into(),
            name: name.into(),
        })
    }
}

impl std::fmt::Display for FleetRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "kube://{}/{}", self.namespace, self.name)
    }
}

/// One version of the watched McpFleet.
pub type Update = Result<Fleet, Vec<ConfigIssue>>;

/// Watches the McpFleet; every version is sent validated. `observed` tracks the
/// `metadata.generation` of the last version seen (for `status.observedGeneration`).
pub fn watch(
    client: Client,
    fleet: FleetRef,
    ctx: AdmissionContext,
    observed: Arc<AtomicI64>,
) -> mpsc::UnboundedReceiver<Update> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        // Untyped on purpose: a spec the typed struct would refuse must still arrive, be validated
        // like a file and be reported, rather than stall the watch.
        let api: Api<DynamicObject> = Api::namespaced_with(
            client,
            &fleet.namespace,
            &ApiResource::erase::<McpFleet>(&()),
        );
        let mut stream = watcher::watch_object(api, &fleet.name)
            .default_backoff()
            .boxed();
        let source = fleet.to_string();
        while let Some(event) = stream.next().await {
            let update = match event {
                Ok(Some(obj)) => {
                    observed.store(obj.metadata.generation.unwrap_or(0), Ordering::SeqCst);
                    let spec = obj
                        .data
                        .get("spec")
                        .cloned()
                        .unwrap_or_else(|| serde_json::json!({}));
                    // Problems travel inside the fleet: bad entries are refused one by one (the
                    // multiplexer decides, as for files); a missing object keeps the whole fleet.
                    Ok(validate_document(&spec, &source, &ctx))
                }
                Ok(None) => Err(vec![issue(&format!("McpFleet {source} does not exist"))]),
                Err(e) => {
                    tracing::warn!(source = %source, error = %e, "McpFleet watch error; retrying");
                    continue;
                }
            };
            if tx.send(update).is_err() {
                return;
            }
        }
    });
    rx
}

fn issue(reason: &str) -> ConfigIssue {
    ConfigIssue {
        server: String::new(),
        field: String::new(),
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleet_references_parse_strictly() {
        assert_eq!(
            "kube://mcp/default".parse::<FleetRef>().unwrap(),
            FleetRef {
                namespace: "mcp".into(),
                name: "default".into()
            }
        );
        for bad in ["kube://mcp", "http://x/y", "kube://Bad/x", "kube:///x"] {
            assert!(bad.parse::<FleetRef>().is_err(), "{bad}");
        }
    }
}
