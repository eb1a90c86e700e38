//! Prints the McpFleet CustomResourceDefinition (YAML) to stdout: `cargo run --bin crdgen > crds/mcpfleet.yaml`.

fn main() {
    print!("{}", graph_os::kube::crd::crd_yaml());
}
