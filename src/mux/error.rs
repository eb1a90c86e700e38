//! The multiplexer's error enum: every refusal of a front request has one variant and one
//! stable code. The wire mapping (JSON-RPC error, tool-error result, HTTP status) lives in
//! `server::wire`; the multiplexer never builds protocol errors itself.

use crate::auth::Scope;
use crate::child::CallError;

/// Why the multiplexer could not start (a typed startup error: `main` prints it and exits).
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// Neither the state directory nor the fallback under the temporary directory is usable.
    #[error(
        "no usable state directory: {dir} ({reason}), nor the fallback {fallback} ({fallback_reason}); give a writable --state-dir"
    )]
    StateDir {
        /// The configured state directory.
        dir: String,
        /// Why it cannot be used.
        reason: String,
        /// The fallback tried.
        fallback: String,
        /// Why the fallback cannot be used.
        fallback_reason: String,
    },
}

/// Why the multiplexer refused or failed a front request.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MuxError {
    /// The caller's scope does not cover the operation (or the child's `requiredScopes`).
    #[error("{operation} needs the {} scope", need.as_str())]
    Denied {
        /// What was refused.
        operation: &'static str,
        /// The scope it needs.
        need: Scope,
    },
    /// No visible tool has this name.
    #[error("Unknown tool: {0}")]
    UnknownTool(String),
    /// No visible prompt has this name.
    #[error("unknown prompt '{0}'")]
    UnknownPrompt(String),
    /// No visible server provides this resource URI.
    #[error("no server provides '{0}'")]
    UnknownResource(String),
    /// The request is malformed in a way the protocol calls invalid params.
    #[error("{0}")]
    InvalidParams(String),
    /// The tool is in the catalog but not in this session's tool list.
    #[error("'{name}' is in the catalog but not loaded in this session; call load_tools first")]
    NotLoaded {
        /// Exposed name.
        name: String,
        /// Owning server.
        server: String,
    },
    /// A bound on the request was exceeded; nothing was sent to a child.
    #[error("{message}")]
    OutOfBounds {
        /// The child it was meant for.
        server: Option<String>,
        /// Which bound.
        message: String,
    },
    /// The server left the fleet between lookup and call.
    #[error("server '{0}' left the fleet")]
    ServerLeft(String),
    /// The child call failed (or the child answered with a JSON-RPC error).
    #[error("{error}")]
    Child {
        /// Server name.
        server: String,
        /// What happened.
        error: Box<CallError>,
    },
    /// A meta-tool refusal with its own stable code.
    #[error("{code}: {message}")]
    Refused {
        /// Stable code.
        code: &'static str,
        /// Human-readable reason.
        message: String,
    },
}

impl MuxError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            MuxError::Denied { .. } => "authorization-denied",
            MuxError::UnknownTool(_) => "tool-not-found",
            MuxError::UnknownPrompt(_) => "prompt-not-found",
            MuxError::UnknownResource(_) => "resource-not-found",
            MuxError::InvalidParams(_) => "invalid-params",
            MuxError::NotLoaded { .. } => "tool-not-loaded",
            MuxError::OutOfBounds { .. } => "request-out-of-bounds",
            MuxError::ServerLeft(_) => "child-unavailable",
            MuxError::Child { error, .. } => error.code(),
            MuxError::Refused { code, .. } => code,
        }
    }

    /// The server the error concerns, if any.
    pub fn server(&self) -> Option<&str> {
        match self {
            MuxError::NotLoaded { server, .. } | MuxError::Child { server, .. } => Some(server),
            MuxError::OutOfBounds { server, .. } => server.as_deref(),
            MuxError::ServerLeft(server) => Some(server),
            _ => None,
        }
    }

    /// The message without the code prefix.
    pub fn message(&self) -> String {
        match self {
            MuxError::Refused { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }

    /// A meta-tool refusal.
    pub fn refused(code: &'static str, message: impl Into<String>) -> Self {
        MuxError::Refused {
            code,
            message: message.into(),
        }
    }

    /// A child call failure (a crash retry's refusal is the refusal a fresh call gets).
    pub fn child(server: impl Into<String>, error: CallError) -> Self {
        if let CallError::Refused { code, message } = error {
            return MuxError::Refused { code, message };
        }
        MuxError::Child {
            server: server.into(),
            error: Box::new(error),
        }
    }

    /// A request bound exceeded.
    pub fn bounds(message: impl Into<String>) -> Self {
        MuxError::OutOfBounds {
            server: None,
            message: message.into(),
        }
    }
}
