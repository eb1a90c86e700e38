//! The Kubernetes [`GenerationStore`]: the generation record lives in a
//! `coordination.k8s.io/v1` Lease `<fleet>-catalog-generation`, each replica's heartbeat in a Lease
//! `<fleet>-replica-<prefix of the replica id>-<hash of the whole id>` (labelled
//! `graphos.dev/fleet=<fleet>`, `graphos.dev/role=replica`).
//!
//! Design note: publishing generation N+1 exactly once is a compare-and-swap, not leader election,
//! so this is a small CAS on `metadata.resourceVersion` (GET, check the record, PUT with the read
//! resourceVersion; 409 → read again) rather than kube-lease-manager, whose server-side-apply
//! ownership model answers "who leads", not "was the record still G when I wrote G+1". The cohort
//! rule is the same as the file store's ([`crate::catalog::store::cohort_check`]).

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::{ListParams, PostParams};

use crate::catalog::store::{Cas, GenerationRecord, GenerationStore, Heartbeat, StoreError};

const RECORD_ANNOTATION: &str = "graphos.dev/generation-record";
const HEARTBEAT_ANNOTATION: &str = "graphos.dev/heartbeat";
const FLEET_LABEL: &str = "graphos.dev/fleet";
const ROLE_LABEL: &str = "graphos.dev/role";

/// Generation record and heartbeats in Leases of one namespace.
#[derive(Clone)]
pub struct LeaseStore {
    api: Api<Lease>,
    fleet: String,
}

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// The heartbeat Lease of a replica: a readable prefix of its id plus a hash of the whole id,
/// so replicas whose ids share a long prefix (pods of one ReplicaSet with a long fullname) never
/// share a Lease. DNS-1123 safe.
pub fn replica_lease_name(fleet: &str, replica: &str) -> String {
    let digest = crate::digest::sha256_hex(replica.as_bytes());
    let mut short = dns_label(replica);
    short.truncate(20);
    let short = short.trim_matches('-');
    if short.is_empty() {
        format!("{fleet}-replica-{}", &digest[..12])
    } else {
        format!("{fleet}-replica-{short}-{}", &digest[..12])
    }
}

/// A DNS-1123 label from a replica id.
fn dns_label(s: &str) -> String {
    let mut out: String = s
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    out.truncate(40);
    out.trim_matches('-').to_string()
}

impl LeaseStore {
    /// A store for `fleet` in the Leases of `api`'s namespace.
    pub fn new(api: Api<Lease>, fleet: &str) -> Self {
        LeaseStore {
            api,
            fleet: fleet.to_string(),
        }
    }

    fn record_name(&self) -> String {
        format!("{}-catalog-generation", self.fleet)
    }

    fn labels(&self, role: &str) -> BTreeMap<String, String> {
        [
            (FLEET_LABEL.to_string(), self.fleet.clone()),
            (ROLE_LABEL.to_string(), role.to_string()),
        ]
        .into()
    }

    fn record_of(lease: &Lease) -> Result<Option<GenerationRecord>, StoreError> {
        match lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RECORD_ANNOTATION))
        {
            None => Ok(None),
            Some(json) => serde_json::from_str(json)
                .map(Some)
                .map_err(|e| err(format!("corrupt generation record: {e}"))),
        }
    }

    async fn cas(
        &self,
        expected: Option<GenerationRecord>,
        new: GenerationRecord,
    ) -> Result<Cas, StoreError> {
        let same = |a: &Option<GenerationRecord>, b: &Option<GenerationRecord>| match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => a.generation == b.generation && a.digest == b.digest,
            _ => false,
        };
        let annotation = serde_json::to_string(&new).map_err(err)?;
        loop {
            let current = self.api.get_opt(&self.record_name()).await.map_err(err)?;
            let record = current.as_ref().map(Self::record_of).transpose()?.flatten();
            if !same(&record, &expected) {
                return Ok(Cas::Conflict(record));
            }
            let publisher = new.publisher.clone();
            let outcome = self
                .write(
                    &self.record_name(),
                    current,
                    "generation",
                    RECORD_ANNOTATION,
                    &annotation,
                    |spec| {
                        spec.holder_identity = Some(publisher.clone());
                        spec.acquire_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
                    },
                )
                .await;
            match outcome {
                Ok(()) => return Ok(Cas::Swapped),
                // Someone wrote in between (or created first): read again and re-check.
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(err(e)),
            }
        }
    }

    /// Creates the Lease (when `current` is `None`) or replaces `current`, setting one annotation
    /// and editing the spec. A replace carries the read resourceVersion, so a concurrent write
    /// makes it a 409 for the caller to handle.
    async fn write(
        &self,
        name: &str,
        current: Option<Lease>,
        role: &str,
        key: &str,
        value: &str,
        edit: impl Fn(&mut LeaseSpec),
    ) -> Result<(), kube::Error> {
        let exists = current.is_some();
        let mut lease = current.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(self.labels(role)),
                ..Default::default()
            },
            spec: None,
        });
        lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(key.into(), value.into());
        edit(lease.spec.get_or_insert_with(Default::default));
        if exists {
            self.api
                .replace(name, &PostParams::default(), &lease)
                .await
                .map(|_| ())
        } else {
            self.api
                .create(&PostParams::default(), &lease)
                .await
                .map(|_| ())
        }
    }

    async fn beat(&self, beat: Heartbeat) -> Result<(), StoreError> {
        let name = replica_lease_name(&self.fleet, &beat.replica);
        let annotation = serde_json::to_string(&beat).map_err(err)?;
        let renew = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        for _ in 0..5 {
            let current = self.api.get_opt(&name).await.map_err(err)?;
            let result = self
                .write(
                    &name,
                    current,
                    "replica",
                    HEARTBEAT_ANNOTATION,
                    &annotation,
                    |spec| {
                        spec.holder_identity = Some(beat.replica.clone());
                        spec.lease_duration_seconds = Some(beat.ttl as i32);
                        spec.renew_time = renew.clone();
                    },
                )
                .await;
            match result {
                Ok(()) => return Ok(()),
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(err(e)),
            }
        }
        Err(err("heartbeat kept conflicting"))
    }

    async fn list_replicas(&self) -> Result<Vec<Heartbeat>, StoreError> {
        let selector = format!("{FLEET_LABEL}={},{ROLE_LABEL}=replica", self.fleet);
        let leases = self
            .api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(err)?;
        let mut out: Vec<Heartbeat> = leases
            .items
            .iter()
            .filter_map(|l| l.metadata.annotations.as_ref()?.get(HEARTBEAT_ANNOTATION))
            .filter_map(|json| serde_json::from_str(json).ok())
            .collect();
        out.sort_by(|a, b| a.replica.cmp(&b.replica));
        Ok(out)
    }
}

impl GenerationStore for LeaseStore {
    fn read(&self) -> BoxFuture<'_, Result<Option<GenerationRecord>, StoreError>> {
        Box::pin(async move {
            let lease = self.api.get_opt(&self.record_name()).await.map_err(err)?;
            Ok(lease.as_ref().map(Self::record_of).transpose()?.flatten())
        })
    }

    fn compare_and_swap(
        &self,
        expected: Option<GenerationRecord>,
        new: GenerationRecord,
    ) -> BoxFuture<'_, Result<Cas, StoreError>> {
        Box::pin(self.cas(expected, new))
    }

    fn heartbeat(&self, beat: Heartbeat) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.beat(beat))
    }

    fn replicas(&self) -> BoxFuture<'_, Result<Vec<Heartbeat>, StoreError>> {
        Box::pin(self.list_replicas())
    }

    fn leave(&self, replica: &str) -> BoxFuture<'_, Result<(), StoreError>> {
        let name = replica_lease_name(&self.fleet, replica);
        Box::pin(async move {
            match self.api.delete(&name, &Default::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                Err(e) => Err(err(e)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_sharing_a_long_prefix_get_separate_leases() {
        let a = "graph-os-production-gateway-7d9f8c6b5-zz-abcde";
        let b = "graph-os-production-gateway-7d9f8c6b5-zz-fghij";
        assert_eq!(a[..40], b[..40]);
        let (na, nb) = (replica_lease_name("f", a), replica_lease_name("f", b));
        assert_ne!(na, nb);
        for n in [&na, &nb] {
            assert!(
                n.len() <= 63
                    && n.bytes()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'),
                "{n}"
            );
        }
        assert_eq!(na, replica_lease_name("f", a), "stable");
    }
}
