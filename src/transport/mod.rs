//! Child transports. stdio children are spawned here with a minimal environment; remote
//! transports (streamable HTTP, SSE) and the egress policy live beside it.

pub mod http;
pub mod sse;
pub mod stdio;

/// Why a transport could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A secret reference needed by the launch could not be resolved.
    #[error(transparent)]
    Secret(#[from] crate::secrets::SecretError),
    /// The process could not be spawned (missing executable, permissions...).
    #[error("cannot start '{command}': {reason}")]
    Spawn {
        /// The executable (never its environment).
        command: String,
        /// OS reason.
        reason: String,
    },
    /// This transport kind is not available in this build.
    #[error("transport {0} is not supported yet")]
    Unsupported(&'static str),
}

impl TransportError {
    /// Stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            TransportError::Secret(e) => e.code(),
            TransportError::Spawn { .. } => "child-spawn-failed",
            TransportError::Unsupported(_) => "transport-unsupported",
        }
    }
}
