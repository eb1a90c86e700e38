//! Kubernetes: the McpFleet custom resource (its `spec` is the same fleet declaration as the
//! file), and — growing here — the watcher source, the Lease-backed generation store and the
//! status writer.

pub mod crd;
pub mod lease_store;
pub mod secrets;
pub mod source;
pub mod status;
