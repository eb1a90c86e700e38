//! Who is asking, and what they may do: the [`Caller`] every multiplexer operation takes, and
//! the one table of scopes per [`Operation`].
//!
//! Authorization is decided here and nowhere else: each `Multiplexer` method calls
//! [`Caller::authorize`] for its operation first, and [`Caller::sees`] for every child it would
//! show or reach (a child's `requiredScopes` make it invisible and unusable below that scope).

use std::sync::Arc;

use super::{MuxError, Session};
use crate::auth::{Identity, Scope};
use crate::child::ClientCaps;
use crate::config::ChildSpec;

/// Everything a front request can do, each with the scope it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `find_tools`.
    FindTools,
    /// `list_catalog`.
    ListCatalog,
    /// `multiplexer_status`.
    Status,
    /// `fleet_graph`.
    FleetGraph,
    /// `tools/list`, `prompts/list`, `resources/list`, `resources/templates/list`.
    List,
    /// `load_tools`.
    LoadTools,
    /// `unload_tools`.
    UnloadTools,
    /// `tools/call` of a loaded or eager tool.
    CallTool,
    /// `catalog_dispatch`.
    Dispatch,
    /// `prompts/get`.
    GetPrompt,
    /// `resources/read`.
    ReadResource,
    /// `completion/complete`.
    Complete,
    /// `resources/subscribe`.
    Subscribe,
    /// `resources/unsubscribe`.
    Unsubscribe,
    /// `catalog_refresh`.
    Refresh,
    /// Approving a child's changed catalog (drift guard).
    Approve,
    /// `logging/setLevel` for the caller's own session (filters the logs it receives).
    SetLevel,
    /// `logging/setLevel` applied to the children too (they are shared: an admin operation).
    SetChildLevel,
}

impl Operation {
    /// The scope this operation needs: discover ⊂ delegate ⊂ manage.
    pub fn scope(self) -> Scope {
        use Operation::*;
        match self {
            FindTools | ListCatalog | Status | FleetGraph | List | SetLevel => Scope::Discover,
            LoadTools | UnloadTools | CallTool | Dispatch | GetPrompt | ReadResource | Complete
            | Subscribe | Unsubscribe => Scope::Delegate,
            Refresh | Approve | SetChildLevel => Scope::Manage,
        }
    }

    /// The operation's name in errors and metrics.
    pub fn name(self) -> &'static str {
        use Operation::*;
        match self {
            FindTools => "find_tools",
            ListCatalog => "list_catalog",
            Status => "multiplexer_status",
            FleetGraph => "fleet_graph",
            List => "list",
            LoadTools => "load_tools",
            UnloadTools => "unload_tools",
            CallTool => "tools/call",
            Dispatch => "catalog_dispatch",
            GetPrompt => "prompts/get",
            ReadResource => "resources/read",
            Complete => "completion/complete",
            Subscribe => "resources/subscribe",
            Unsubscribe => "resources/unsubscribe",
            Refresh => "catalog_refresh",
            Approve => "approve",
            SetLevel => "logging/setLevel",
            SetChildLevel => "logging/setLevel (children)",
        }
    }
}

/// The caller of one front request: identity and scope, the session (2025 era) or principal
/// (2026 era) whose loaded set it uses, and what its client can answer.
#[derive(Clone)]
pub struct Caller {
    /// Who (never a secret).
    pub identity: Identity,
    /// Loaded set and notification streams.
    pub session: Arc<Session>,
    /// Capabilities the client declared (relays are sent only for these).
    pub caps: ClientCaps,
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("identity", &self.identity)
            .field("session", &self.session.id())
            .finish()
    }
}

impl Caller {
    /// A caller on `session`.
    pub fn new(identity: Identity, session: Arc<Session>, caps: ClientCaps) -> Self {
        Caller {
            identity,
            session,
            caps,
        }
    }

    /// The caller's session at the child boundary, with its principal (the identity subject:
    /// its fair share of a child's slots and its own breaker).
    pub fn tag(&self) -> crate::child::SessionTag {
        self.session.tag(&self.identity.subject)
    }

    /// The caller's scope.
    pub fn scope(&self) -> Scope {
        self.identity.scope
    }

    /// Refuses `op` unless the caller's scope covers it (counted in `/metrics`).
    pub fn authorize(&self, op: Operation) -> Result<(), MuxError> {
        if self.identity.scope >= op.scope() {
            return Ok(());
        }
        crate::telemetry::metrics().authorization_denied(op.name());
        Err(MuxError::Denied {
            operation: op.name(),
            need: op.scope(),
        })
    }

    /// Whether the caller may see and use a child (its `requiredScopes`).
    pub fn sees(&self, spec: &ChildSpec) -> bool {
        spec.required_scope.is_none_or(|s| self.identity.scope >= s)
    }

    /// Refuses `op` on a child the caller may not use.
    pub fn authorize_child(&self, op: Operation, spec: &ChildSpec) -> Result<(), MuxError> {
        if self.sees(spec) {
            return Ok(());
        }
        crate::telemetry::metrics().authorization_denied(op.name());
        Err(MuxError::Denied {
            operation: op.name(),
            need: spec.required_scope.unwrap_or(Scope::Manage),
        })
    }
}
