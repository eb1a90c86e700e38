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
    /// A refusal of the multiplexer's own, with its message (the code is the kind's).
    #[error("{}: {message}", why.code())]
    Refused {
        /// What kind of refusal.
        why: Refusal,
        /// Human-readable reason.
        message: String,
    },
    /// A deployment stage of the call pipeline ([`super::pipeline::CallStage`]) refused the call
    /// with its own stable code.
    #[error("{code}: {message}")]
    StageRefused {
        /// The stage's name.
        stage: &'static str,
        /// The stage's stable code.
        code: &'static str,
        /// Human-readable reason.
        message: String,
    },
    /// A read-only call's crash retry that its resolution refused: the code a fresh call got
    /// (carried through the child runtime, which cannot name this enum). Nothing was sent.
    #[error("{code}: {message}")]
    RetryRefused {
        /// The fresh call's stable code.
        code: &'static str,
        /// Human-readable reason.
        message: String,
    },
}

/// The multiplexer's own refusals that carry nothing but a message: each a stable code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No visible server has this name.
    ServerNotInFleet,
    /// Approving a child whose drift policy is off.
    DriftGuardOff,
    /// Approving a child whose fleet entry pins `approvedDigest`.
    DriftApprovalPinned,
    /// Approving a child that has no catalog yet.
    NothingToApprove,
    /// The approved digest is not the live one.
    DriftDigestMismatch,
    /// The approval could not be written.
    DriftApprovalUnrecorded,
    /// The tool changed since it was approved (drift guard `hold`).
    DriftPending,
    /// `catalog_dispatch` of a tool whose child asked for client input.
    InputRequiredInDispatch,
    /// A `requestState` no parked call here belongs to.
    InputStateUnknown,
    /// A name claimed by more than one server.
    NameConflict,
    /// A resource URI claimed by more than one server.
    ResourceConflict,
    /// A name or URI no child may expose.
    ItemNameInvalid,
    /// find_tools' ranking task died.
    DiscoveryFailed,
    /// The fleet graph could not be read.
    FleetGraphFailed,
    /// Too many tasks held.
    TasksFull,
    /// No task with this id belongs to the caller.
    TaskNotFound,
    /// The tool or child does not do tasks.
    TaskUnsupported,
    /// A malformed `taskId`.
    TaskIdInvalid,
    /// A meta tool's arguments do not parse.
    InvalidArguments,
    /// The session store could not be written.
    SessionStoreUnavailable,
}

impl Refusal {
    /// Stable code.
    pub fn code(self) -> &'static str {
        match self {
            Refusal::ServerNotInFleet => "server-not-in-fleet",
            Refusal::DriftGuardOff => "drift-guard-off",
            Refusal::DriftApprovalPinned => "drift-approval-pinned",
            Refusal::NothingToApprove => "child-unavailable",
            Refusal::DriftDigestMismatch => "drift-digest-mismatch",
            Refusal::DriftApprovalUnrecorded => "drift-approval-unrecorded",
            Refusal::DriftPending => "drift-pending",
            Refusal::InputRequiredInDispatch => "input-required-in-dispatch",
            Refusal::InputStateUnknown => "input-state-unknown",
            Refusal::NameConflict => "name-conflict",
            Refusal::ResourceConflict => "resource-conflict",
            Refusal::ItemNameInvalid => "item-name-invalid",
            Refusal::DiscoveryFailed => "discovery-failed",
            Refusal::FleetGraphFailed => "fleet-graph-failed",
            Refusal::TasksFull => "tasks-full",
            Refusal::TaskNotFound => "task-not-found",
            Refusal::TaskUnsupported => "task-unsupported",
            Refusal::TaskIdInvalid => "task-id-invalid",
            Refusal::InvalidArguments => "invalid-arguments",
            Refusal::SessionStoreUnavailable => "session-store-unavailable",
        }
    }
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
            MuxError::Refused { why, .. } => why.code(),
            MuxError::RetryRefused { code, .. } | MuxError::StageRefused { code, .. } => code,
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
            MuxError::Refused { message, .. }
            | MuxError::RetryRefused { message, .. }
            | MuxError::StageRefused { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }

    /// A refusal of the multiplexer's own.
    pub fn refused(why: Refusal, message: impl Into<String>) -> Self {
        MuxError::Refused {
            why,
            message: message.into(),
        }
    }

    /// A deployment stage's refusal.
    pub fn stage(stage: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        MuxError::StageRefused {
            stage,
            code,
            message: message.into(),
        }
    }

    /// A child call failure (a crash retry's refusal is the refusal a fresh call gets).
    pub fn child(server: impl Into<String>, error: CallError) -> Self {
        if let CallError::Refused { code, message } = error {
            return MuxError::RetryRefused { code, message };
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
