//! Child transports. stdio children are spawned here with a minimal environment, in their own
//! process group; remote transports (streamable HTTP, SSE) go through the egress policy
//! ([`crate::net::egress`]) and named TLS profiles ([`crate::net::tls`]). Child input is bounded while it streams
//! (stdout lines, stderr lines, SSE lines and events: [`sse_decode`]).

pub mod client_credentials;
pub mod http;
pub mod isolation;
pub mod raw_link;
pub mod reaper;
pub mod sse;
pub mod sse_decode;
pub mod stdio;

use std::sync::{Arc, Mutex};

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
    /// A process-isolation step failed in the forked child (`transport::isolation`): the child
    /// was not started rather than started less isolated.
    #[error("cannot start '{command}': process isolation failed at {step}: {reason}")]
    Isolation {
        /// The executable (never its environment).
        command: String,
        /// The system call that failed.
        step: &'static str,
        /// OS reason.
        reason: String,
    },
    /// This transport kind is not available in this build.
    #[error("transport {0} is not supported yet")]
    Unsupported(&'static str),
    /// The egress policy refused the destination, or its name did not resolve.
    #[error(transparent)]
    Egress(#[from] crate::net::egress::EgressError),
    /// No access token could be obtained for the child (`auth`).
    #[error(transparent)]
    Auth(#[from] client_credentials::AuthFailure),
    /// A TLS profile could not be applied (bad client key...).
    #[error("TLS profile '{profile}': {reason}")]
    Tls {
        /// Profile name.
        profile: String,
        /// What is wrong (never key material).
        reason: String,
    },
}

impl From<crate::net::tls::TlsError> for TransportError {
    fn from(e: crate::net::tls::TlsError) -> Self {
        TransportError::Tls {
            profile: e.profile,
            reason: e.reason,
        }
    }
}

impl TransportError {
    /// Stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            TransportError::Secret(e) => e.code(),
            TransportError::Spawn { .. } => "child-spawn-failed",
            TransportError::Isolation { .. } => "child-isolation-failed",
            TransportError::Unsupported(_) => "transport-unsupported",
            TransportError::Egress(e) => e.code(),
            TransportError::Tls { .. } => "tls-profile-invalid",
            TransportError::Auth(_) => client_credentials::AUTH_FAILED,
        }
    }
}

/// Why a child connection ended or failed, when the transport knows better than "closed": a
/// frame over its bound, an egress refusal, a TLS failure. The first fault recorded wins; the
/// child runtime reads it to give the failure its stable code.
/// Beside it, the cause of the newest failed HTTP request (its whole error chain): the
/// "Connection refused" under rmcp's "error sending request", which rmcp's own error drops.
#[derive(Debug, Clone, Default)]
pub struct Fault(
    Arc<Mutex<Option<(&'static str, String)>>>,
    Arc<Mutex<Option<String>>>,
);

impl Fault {
    /// Records a fault unless one is recorded already.
    pub fn record(&self, code: &'static str, message: impl Into<String>) {
        if let Ok(mut f) = self.0.lock()
            && f.is_none()
        {
            *f = Some((code, message.into()));
        }
    }

    /// Takes the recorded fault.
    pub fn take(&self) -> Option<(&'static str, String)> {
        self.0.lock().ok().and_then(|mut f| f.take())
    }

    /// Whether a fault is recorded.
    pub fn is_set(&self) -> bool {
        self.0.lock().map(|f| f.is_some()).unwrap_or(false)
    }

    /// Records the fault an HTTP error stands for (egress refusal, TLS failure), if any, and
    /// the error's chain as the newest cause.
    pub fn record_error(&self, err: &(dyn std::error::Error + 'static)) {
        if let Some((code, message)) = crate::net::classify_error(err) {
            self.record(code, message);
        }
        if let Ok(mut c) = self.1.lock() {
            *c = Some(crate::telemetry::redact::error_chain(err));
        }
    }

    /// Takes the newest recorded cause (see [`Fault::record_error`]).
    pub fn take_cause(&self) -> Option<String> {
        self.1.lock().ok().and_then(|mut c| c.take())
    }
}
