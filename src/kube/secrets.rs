//! `secret://NAMESPACE/NAME#KEY` references resolved from Kubernetes Secrets at the child
//! boundary. Values are read when a child starts and handed only to that child's launch; they are
//! never cached, logged or written to status.
//!
//! The backend works whenever a Kubernetes client is available, not only under `--fleet
//! kube://…`: [`KubeSecrets::lazy`] builds the client on first use from the usual sources
//! (in-cluster service account, `KUBECONFIG`, `~/.kube/config`), so a ConfigMap-fed replica or a
//! gateway with `--generation-store kube://…` resolves `secret://` the same way. Without any
//! client configuration a reference fails closed (`secret-unavailable`).

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use tokio::sync::OnceCell;

use crate::secrets::SecretBackend;

/// Reads Secrets with the gateway's own service account (RBAC limits it to named Secrets).
pub struct KubeSecrets {
    client: std::sync::Arc<OnceCell<Client>>,
}

impl KubeSecrets {
    /// A backend using `client`.
    pub fn new(client: Client) -> Self {
        KubeSecrets {
            client: std::sync::Arc::new(OnceCell::new_with(Some(client))),
        }
    }

    /// A backend that builds its client on first use (`kube::Client::try_default`); while no
    /// client can be built, every reference is unavailable (and building is retried).
    pub fn lazy() -> Self {
        KubeSecrets {
            client: std::sync::Arc::new(OnceCell::new()),
        }
    }
}

async fn client_of(cell: &OnceCell<Client>) -> Option<Client> {
    cell.get_or_try_init(|| async {
        crate::net::crypto::install_crypto();
        Client::try_default().await.map_err(|e| {
            tracing::warn!(error = %e, "secret:// references need a Kubernetes client; none is configured");
        })
    })
    .await
    .ok()
    .cloned()
}

/// Splits `secret://NAMESPACE/NAME#KEY`.
pub fn parse(reference: &str) -> Option<(&str, &str, &str)> {
    let rest = reference.strip_prefix("secret://")?;
    let (path, key) = rest.split_once('#')?;
    let (namespace, name) = path.split_once('/')?;
    (!namespace.is_empty() && !name.is_empty() && !key.is_empty() && !name.contains('/'))
        .then_some((namespace, name, key))
}

impl SecretBackend for KubeSecrets {
    fn fetch(&self, reference: &str) -> BoxFuture<'static, Option<String>> {
        let cell = self.client.clone();
        let parsed = parse(reference)
            .map(|(ns, name, key)| (ns.to_string(), name.to_string(), key.to_string()));
        Box::pin(async move {
            let (namespace, name, key) = parsed?;
            let client = client_of(&cell).await?;
            let secret = match Api::<Secret>::namespaced(client, &namespace)
                .get(&name)
                .await
            {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(namespace = %namespace, secret = %name, error = %e, "secret reference unavailable");
                    return None;
                }
            };
            if let Some(v) = secret.data.as_ref().and_then(|d| d.get(&key)) {
                return String::from_utf8(v.0.clone()).ok();
            }
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(&key))
                .cloned()
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn references_parse() {
        assert_eq!(
            super::parse("secret://mcp/creds#token"),
            Some(("mcp", "creds", "token"))
        );
        for bad in [
            "secret://mcp#token",
            "secret://mcp/creds",
            "vault://a/b#c",
            "secret://a/b/c#d",
        ] {
            assert_eq!(super::parse(bad), None, "{bad}");
        }
    }
}
