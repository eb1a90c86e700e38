//! The three scopes of graph-os callers, ordered: `discover` ⊂ `delegate` ⊂ `manage`. A leaf
//! module: the fleet configuration (`requiredScopes`) and the authentication layer both name it.

use serde::Serialize;

/// What a caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// find_tools, list_catalog, multiplexer_status, fleet_graph.
    Discover,
    /// load/unload/call tools, catalog_dispatch.
    Delegate,
    /// catalog_refresh, logging/setLevel.
    Manage,
}

impl Scope {
    /// The scope's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Discover => "discover",
            Scope::Delegate => "delegate",
            Scope::Manage => "manage",
        }
    }
}

impl std::str::FromStr for Scope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "discover" => Ok(Scope::Discover),
            "delegate" => Ok(Scope::Delegate),
            "manage" => Ok(Scope::Manage),
            other => Err(format!(
                "unknown scope '{other}' (discover, delegate, manage)"
            )),
        }
    }
}
