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

/// The values a scope (or group/role) claim grants, each compared whole against the scope map.
///
/// The one rule for reading a claim (RFC 6749 §3.3): a string is a list delimited by U+0020
/// SPACE only, so a value holding any other whitespace (`"x\u{a0}manage"`, `"x\tmanage"`) stays
/// one value and matches nothing; an array's string elements are values as they are (a group
/// named `"waitlist mcp-admins"` is that group, never `mcp-admins`). Other JSON types grant
/// nothing.
pub fn claim_values(claim: Option<&serde_json::Value>) -> Vec<&str> {
    match claim {
        Some(serde_json::Value::String(s)) => s.split(' ').filter(|v| !v.is_empty()).collect(),
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .filter_map(serde_json::Value::as_str)
            .filter(|v| !v.is_empty())
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether `value` may name a scope in the scope map: non-empty, no whitespace or control
/// character (so it matches the same whole value in a string claim and an array claim).
pub fn is_map_value(value: &str) -> bool {
    !value.is_empty() && !value.chars().any(|c| c.is_whitespace() || c.is_control())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn claims_split_on_space_only_and_array_elements_stay_whole() {
        let v = json!("discover  manage");
        assert_eq!(claim_values(Some(&v)), ["discover", "manage"]);
        for whole in [
            "x\u{a0}manage",
            "x\tmanage",
            "x\nmanage",
            "x\u{2003}manage",
            "x\u{3000}manage",
        ] {
            let v = json!(whole);
            assert_eq!(claim_values(Some(&v)), [whole], "{whole:?}");
        }
        let v = json!(["waitlist mcp-admins", "a\u{a0}b", "", 7, "delegate"]);
        assert_eq!(
            claim_values(Some(&v)),
            ["waitlist mcp-admins", "a\u{a0}b", "delegate"]
        );
        assert!(claim_values(Some(&json!({"manage": true}))).is_empty());
        assert!(claim_values(None).is_empty());
        assert!(is_map_value("mcp-admins"));
        for bad in ["", "a b", "a\u{a0}b", "a\tb", "a\u{1}b"] {
            assert!(!is_map_value(bad), "{bad:?}");
        }
    }
}
