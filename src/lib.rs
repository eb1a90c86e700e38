//! graph-os: a Kubernetes-native MCP fleet gateway.
//!
//! [`gateway`] builds the whole from a plain `Config`. Data flows client → [`server`] →
//! [`mux`] / [`catalog`] → [`child`] → [`probe`] / [`transport`] → [`net`], never backwards:
//! `docs/architecture.md` has the layers (guarded by `tests/structure.rs`) and where each rule
//! lives.

pub mod auth;
pub mod catalog;
pub mod child;
pub mod codes;
pub mod config;
pub mod digest;
pub mod discovery;
pub mod gateway;
pub mod kube;
pub mod memory;
pub mod mux;
pub mod net;
pub mod probe;
pub mod projection;
pub mod secrets;
pub mod server;
pub mod session_redis;
pub mod telemetry;
pub mod transport;
pub mod wire;
