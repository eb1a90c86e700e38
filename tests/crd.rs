//! The McpFleet CRD: generated file in sync, example resources valid against its schema.

use std::path::PathBuf;

use graph_os::kube::crd::{McpFleet, crd_yaml};
use serde_json::{Value, json};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn committed_crd_matches_the_types() {
    let path = root().join("crds/mcpfleet.yaml");
    let generated = crd_yaml();
    if std::env::var_os("UPDATE_CRDS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "crds/mcpfleet.yaml drifted from the McpFleet types: run `cargo run --bin crdgen > crds/mcpfleet.yaml` (or UPDATE_CRDS=1 cargo test)"
    );
}

/// Rewrites the CRD's structural schema so a JSON-Schema validator behaves like the API server
/// with strict field validation (nullable → null allowed; unknown fields rejected).
fn strict(schema: &mut Value) {
    if let Value::Object(map) = schema {
        if map.remove("nullable") == Some(Value::Bool(true))
            && let Some(Value::String(t)) = map.get("type").cloned()
        {
            map.insert("type".into(), json!([t, "null"]));
        }
        map.remove("x-kubernetes-validations");
        if map.contains_key("properties")
            && !map.contains_key("x-kubernetes-preserve-unknown-fields")
        {
            map.entry("additionalProperties")
                .or_insert(Value::Bool(false));
        }
        for v in map.values_mut() {
            strict(v);
        }
    } else if let Value::Array(items) = schema {
        items.iter_mut().for_each(strict);
    }
}

fn validator() -> jsonschema::Validator {
    let crd: Value = serde_json::to_value(<McpFleet as kube::CustomResourceExt>::crd()).unwrap();
    let mut schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone();
    strict(&mut schema);
    schema["properties"]["apiVersion"] = json!({"const": "graphos.dev/v1alpha1"});
    schema["properties"]["kind"] = json!({"const": "McpFleet"});
    schema["properties"]["metadata"] = json!({"type": "object", "required": ["name"]});
    schema["required"] = json!(["apiVersion", "kind", "metadata", "spec"]);
    jsonschema::validator_for(&schema).unwrap()
}

fn errors(doc: &Value) -> Vec<String> {
    validator()
        .iter_errors(doc)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

fn load(path: &str) -> Value {
    let text = std::fs::read_to_string(root().join(path)).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

#[test]
fn example_fleets_are_valid_resources_and_valid_fleets() {
    let dir = root().join("deploy/examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let doc = load(path.strip_prefix(root()).unwrap().to_str().unwrap());
        assert_eq!(errors(&doc), Vec::<String>::new(), "{}", path.display());
        let typed: McpFleet = serde_json::from_value(doc.clone()).unwrap();
        // The spec is a fleet file: the gateway's own validation agrees.
        let fleet = graph_os::config::validate_document(
            &serde_json::to_value(&typed.spec).unwrap(),
            "example",
            &Default::default(),
        );
        assert!(
            fleet.issues.is_empty(),
            "{}: {:?}",
            path.display(),
            fleet.issues
        );
        seen += 1;
    }
    assert!(seen > 0, "no examples under deploy/examples");
}

#[test]
fn a_bad_resource_is_rejected_with_the_path_of_the_problem() {
    let errs = errors(&load("tests/fixtures/bad-mcpfleet.yaml"));
    assert!(
        errs.iter()
            .any(|e| e.starts_with("/spec/mcpServers/typo") && e.contains("maxConcurency")),
        "{errs:?}"
    );
}
