//! The `McpFleet` custom resource (`graphos.dev/v1alpha1`, namespaced, short name `fleet`).
//!
//! `spec` is [`FleetSpec`]: exactly the `mcpServers` document a fleet file holds, so one
//! schema (derived with schemars) serves the file and the CRD. `status` is written by the
//! replica that published a generation.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::ServerSpec;

/// The fleet: MCP servers by name (`[A-Za-z0-9_.-]{1,128}`).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "graphos.dev",
    version = "v1alpha1",
    kind = "McpFleet",
    namespaced,
    status = "McpFleetStatus",
    shortname = "fleet",
    category = "mcp",
    doc = "A fleet of MCP servers served by graph-os",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Generation","type":"integer","jsonPath":".status.catalogGeneration"}"#,
    printcolumn = r#"{"name":"Digest","type":"string","jsonPath":".status.snapshotDigestShort"}"#,
    printcolumn = r#"{"name":"Children","type":"integer","jsonPath":".status.childCount"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = transport_aliases)]
pub struct FleetSpec {
    /// Servers by name, in the ecosystem's `mcpServers` format plus graph-os extensions.
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, ServerSpec>,
    /// Named TLS profiles an entry's `tlsProfile` refers to.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tls_profiles: BTreeMap<String, crate::config::tls::TlsProfileSpec>,
}

/// Every value a fleet file accepts for an entry's `transport` (the canonical names and their
/// serde aliases on [`crate::config::TransportKind`]). schemars lists only the canonical names, so
/// the API server would refuse `transport: http` in an McpFleet that the same document as a file
/// accepts; the tests below keep this list and the type in step.
pub const TRANSPORT_VALUES: [&str; 5] =
    ["stdio", "streamable-http", "streamableHttp", "http", "sse"];

/// Rewrites each entry's `transport` property to the full accepted set (see [`TRANSPORT_VALUES`]).
fn transport_aliases(schema: &mut schemars::Schema) {
    let Some(entry) = schema
        .get_mut("properties")
        .and_then(|p| p.get_mut("mcpServers"))
        .and_then(|m| m.get_mut("additionalProperties"))
        .and_then(|e| e.get_mut("properties"))
        .and_then(|p| p.as_object_mut())
    else {
        return;
    };
    let Some(transport) = entry.get_mut("transport") else {
        return;
    };
    let description = transport
        .get("description")
        .cloned()
        .unwrap_or_else(|| "Transport.".into());
    *transport = serde_json::json!({
        "description": description,
        "type": "string",
        "enum": TRANSPORT_VALUES,
        "nullable": true,
    });
    // The file also takes the key `type` for it (serde alias), as other mcpServers documents write it.
    entry.insert(
        "type".into(),
        serde_json::json!({
            "description": "Alias of `transport` (the key other mcpServers documents use); set one of the two.",
            "type": "string",
            "enum": TRANSPORT_VALUES,
            "nullable": true,
        }),
    );
    let rules = schema
        .get_mut("properties")
        .and_then(|p| p.get_mut("mcpServers"))
        .and_then(|m| m.get_mut("additionalProperties"))
        .and_then(|e| e.as_object_mut())
        .map(|e| {
            e.entry("x-kubernetes-validations")
                .or_insert_with(|| serde_json::json!([]))
        })
        .and_then(|r| r.as_array_mut());
    if let Some(rules) = rules {
        rules.push(serde_json::json!({
            "rule": "!(has(self.transport) && has(self.type))",
            "message": "set transport or its alias type, not both",
        }));
    }
}

/// One condition (Ready, Degraded, Progressing).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetCondition {
    /// Condition type.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// CamelCase reason.
    pub reason: String,
    /// Human-readable message (never a secret).
    pub message: String,
    /// When `status` last changed (RFC 3339).
    pub last_transition_time: String,
    /// The `metadata.generation` this condition was computed for.
    pub observed_generation: i64,
}

/// One child's state as published.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChildStatusEntry {
    /// `starting`, `up`, `restarting` or `failed`.
    pub state: String,
    /// Tools it exposes.
    pub tools: u32,
    /// Last error code, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    /// Drift guard state (`approved` or `drift-pending`) under a drift policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<String>,
    /// With `drift-pending`: the live catalog digest to approve (set it as the entry's
    /// `approvedDigest` in the spec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_digest: Option<String>,
}

/// What the publishing replica reports.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct McpFleetStatus {
    /// Ready, Degraded and Progressing.
    #[serde(default)]
    pub conditions: Vec<FleetCondition>,
    /// The `metadata.generation` last acted on.
    #[serde(default)]
    pub observed_generation: i64,
    /// Published catalog generation.
    #[serde(default)]
    pub catalog_generation: u64,
    /// Published snapshot digest.
    #[serde(default)]
    pub snapshot_digest: String,
    /// First 12 hex digits of the digest (for `kubectl get`).
    #[serde(default)]
    pub snapshot_digest_short: String,
    /// Number of children.
    #[serde(default)]
    pub child_count: u32,
    /// Per-child state.
    #[serde(default)]
    pub children: BTreeMap<String, ChildStatusEntry>,
    /// The replica that wrote this status (the holder of the status Lease).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer: Option<String>,
}

/// The CRD as YAML, exactly as `crdgen` writes it to `crds/mcpfleet.yaml`.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    let crd = McpFleet::crd();
    format!(
        "# Generated by `cargo run --bin crdgen`; do not edit. A test fails when this file drifts.\n{}",
        serde_saphyr::to_string(&crd).unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TransportKind;

    #[test]
    fn transport_values_are_exactly_what_the_file_accepts() {
        for value in TRANSPORT_VALUES {
            serde_json::from_value::<TransportKind>(serde_json::json!(value))
                .unwrap_or_else(|e| panic!("{value}: {e}"));
        }
        // Every canonical name schemars derives is listed too.
        let derived = serde_json::to_string(&schemars::schema_for!(TransportKind)).unwrap();
        for canonical in ["stdio", "streamable-http", "sse"] {
            assert!(derived.contains(&format!("\"{canonical}\"")), "{derived}");
            assert!(TRANSPORT_VALUES.contains(&canonical));
        }
        let yaml = crd_yaml();
        for value in TRANSPORT_VALUES {
            assert!(
                yaml.contains(&format!("- {value}\n")),
                "{value} missing from the CRD enum"
            );
        }
    }
}
