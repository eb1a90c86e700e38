//! Every stable code graph-os answers with, by where it appears: the one list.
//!
//! `docs/error-codes.md` is generated from it ([`markdown`]; `tests/error_codes.rs` fails when
//! the file differs and rewrites it with `GRAPH_OS_UPDATE_DOCS=1`), and the same test fails when
//! the code produces a code-shaped string this list does not have, or this list has a code the
//! code never produces. The error enums keep their own `code()` (each next to its variants);
//! this list is what they may answer.
//!
//! Ground floor: imports nothing.

/// Where codes appear, and the codes that appear there.
pub struct Surface {
    /// Where, as the docs' first column says it.
    pub place: &'static str,
    /// The codes, each with an optional note (`""`: none).
    pub codes: &'static [(&'static str, &'static str)],
}

/// The codes by surface, in the docs' order.
pub const SURFACES: &[Surface] = &[
    Surface {
        place: "child state (`last_error.code`, find_tools `unavailable`)",
        codes: &[
            ("egress-denied", ""),
            ("dns-resolution-failed", ""),
            ("child-frame-too-large", ""),
            ("tls-certificate-invalid", ""),
            ("tls-client-certificate-refused", ""),
            ("tls-handshake-failed", ""),
            ("tls-profile-invalid", ""),
            ("child-spawn-failed", ""),
            (
                "child-isolation-failed",
                "a process-isolation step of a stdio child failed: [threat model](threat-model.md)",
            ),
            ("secret-unavailable", ""),
            (
                "secret-reference-invalid",
                "a reference that cannot be read as one",
            ),
            ("child-initialize-timeout", ""),
            ("child-initialize-failed", ""),
            ("catalog-probe-timeout", ""),
            ("catalog-too-many-items", ""),
            ("catalog-too-large", ""),
            ("catalog-too-deep", ""),
            ("catalog-collection-too-large", ""),
            ("catalog-list-failed", ""),
            ("catalog-item-invalid", ""),
            ("child-transport-closed", ""),
            ("child-exited", ""),
            ("restart-budget-exhausted", ""),
            ("schema-refresh-failed", ""),
            ("child-auth-failed", ""),
            ("child-starting", ""),
            ("child-restarting", ""),
            ("transport-unsupported", ""),
            (
                "drift-blocked",
                "the served digest of a child hidden by `driftPolicy: block` until approval",
            ),
        ],
    },
    Surface {
        place: "tool calls (tool error result; text starts with the code, `_meta[\"io.graph-os/error\"].code`)",
        codes: &[
            (
                "session-store-unavailable",
                "load/unload could not be written",
            ),
            ("authorization-denied", ""),
            ("request-out-of-bounds", ""),
            ("child-unavailable", ""),
            ("child-busy", ""),
            ("child-call-timeout", ""),
            ("child-circuit-open", ""),
            ("child-transport-closed", ""),
            ("call-cancelled", ""),
            ("tool-not-loaded", ""),
            (
                "drift-pending",
                "held by the drift guard; also a read-only call's crash retry",
            ),
            (
                "retry-tool-changed",
                "a read-only call died with its child and the restarted child's tool differs: not retried",
            ),
            ("child-sessions-exhausted", ""),
            ("child-session-connect-failed", ""),
            (
                "input-state-unknown",
                "a `requestState` no parked call here belongs to",
            ),
            ("input-required-in-dispatch", ""),
            (
                "child-error",
                "the child answered with its own JSON-RPC error, which is forwarded unchanged",
            ),
        ],
    },
    Surface {
        place: "other requests (JSON-RPC error `data.code`)",
        codes: &[
            ("authorization-denied", "-32003"),
            ("tool-not-found", "-32602 `Unknown tool: NAME`"),
            ("prompt-not-found", ""),
            ("resource-not-found", "-32002, with `data.uri`"),
            ("invalid-params", ""),
            (
                "already-initialized",
                "-32600: a second `initialize` in one session",
            ),
        ],
    },
    Surface {
        place: "task requests (JSON-RPC error `data.code`)",
        codes: &[
            ("task-not-found", "-32602"),
            ("task-id-invalid", "-32602"),
            ("task-epoch-changed", "-32602"),
            ("request-out-of-bounds", "-32602"),
            ("tasks-full", "-32602"),
            ("task-unsupported", "-32601"),
        ],
    },
    Surface {
        place: "client input a child asks for (JSON-RPC error `data.code`)",
        codes: &[
            (
                "input-parked-full",
                "too many calls wait for client input at once",
            ),
            (
                "input-rounds-exceeded",
                "the child asked for input more times than a call may",
            ),
            (
                "input-required-unsupported",
                "a 2025-era client can answer input only for tools/call",
            ),
        ],
    },
    Surface {
        place: "child→client requests graph-os refuses (JSON-RPC error -32001 to the child)",
        codes: &[
            ("relay-unassociated", ""),
            ("relay-no-caller", ""),
            ("client-capability-missing", ""),
            ("relay-timeout", ""),
            (
                "relay-input-failed",
                "a 2026 client's retry carried no or a malformed answer, or the call ended first",
            ),
        ],
    },
    Surface {
        place: "HTTP (`{\"code\"}` body)",
        codes: &[
            ("authentication-required", "401"),
            ("token-unknown", "401"),
            ("token-expired", "401"),
            ("token-not-yet-valid", "401"),
            ("token-signature-invalid", "401"),
            ("token-algorithm-not-allowed", "401"),
            ("token-key-unknown", "401"),
            ("token-audience-mismatch", "401"),
            ("token-issuer-mismatch", "401"),
            ("token-malformed", "401"),
            ("token-scope-insufficient", "403"),
            (
                "host-not-allowed",
                "403: the admin API from a `Host` that is not the gateway's own",
            ),
            (
                "session-not-found",
                "404; also for an `Mcp-Session-Id` that is not a session id (1–128 characters of `A-Za-z0-9-_`): it never reaches the store",
            ),
            ("server-not-in-fleet", "404"),
            ("drift-digest-mismatch", "409"),
            ("drift-approval-pinned", "409"),
            ("drift-guard-off", "409"),
            (
                "drift-approval-unrecorded",
                "500: the approval could not be written",
            ),
            ("request-body-timeout", "408"),
            ("request-body-too-slow", "408"),
            ("request-too-large", "413"),
            ("initialize-too-large", "413: its parameters over 64 KiB"),
            ("principal-sessions-exhausted", "429"),
            ("sessions-exhausted", "503 + `Retry-After: 1`"),
            ("session-store-unavailable", "503"),
            ("connections-exhausted", "503 + `Retry-After: 1`"),
            ("peer-connections-exhausted", "503 + `Retry-After: 1`"),
            (
                "authorization-server-unavailable",
                "503: the OAuth issuer's metadata or keys cannot be fetched",
            ),
            (
                "oauth-config-invalid",
                "503: the issuer's metadata is unusable for this configuration",
            ),
        ],
    },
    Surface {
        place: "catalog refresh and dispatch (`catalog_refresh`, `catalog_dispatch`, `POST /admin/refresh`: `code`)",
        codes: &[
            ("authorization-denied", ""),
            ("refresh-request-schema-mismatch", ""),
            ("config-revision-stale", ""),
            ("catalog-generation-stale", ""),
            ("catalog-digest-mismatch", ""),
            ("catalog-snapshot-incomplete", ""),
            ("refresh-deadline-exceeded", ""),
            ("reingestion-unreconciled", ""),
            ("replica-generation-divergent", ""),
            ("dispatcher-target-not-visible", ""),
        ],
    },
    Surface {
        place: "catalog items left out (`list_catalog` `skipped`, `multiplexer_status` `catalog_issues`; also the refusal of a request for them)",
        codes: &[
            ("name-conflict", ""),
            ("resource-conflict", ""),
            ("item-name-invalid", ""),
            ("name-reserved", ""),
            (
                "name-duplicate",
                "a child listing a key twice: its first is served",
            ),
            (
                "name-collision",
                "a skill whose resource is not its child's",
            ),
        ],
    },
    Surface {
        place: "skills left out (`list_catalog` `skipped`)",
        codes: &[
            ("skill-no-front-matter", ""),
            ("skill-front-matter-unterminated", ""),
            ("skill-missing-name", ""),
            ("skill-missing-description", ""),
            ("skill-name-invalid", ""),
            ("skill-description-too-long", ""),
            ("skill-read-failed", ""),
            ("skill-read-timeout", ""),
            ("skill-not-text", ""),
            ("skill-too-large", ""),
            (
                "skill-over-limit",
                "logged: the skills beyond a child's limit",
            ),
            (
                "skill-over-catalog-budget",
                "the catalog's skill bytes are spent",
            ),
        ],
    },
    Surface {
        place: "meta-tool input and answers",
        codes: &[
            ("request-out-of-bounds", ""),
            ("invalid-arguments", ""),
            ("server-not-in-fleet", ""),
            (
                "tool-not-in-catalog",
                "load_tools: no such tool for this caller",
            ),
            (
                "tool-disabled",
                "load_tools: the entry's `disabledTools` has it",
            ),
            (
                "fleet-graph-failed",
                "the fleet graph could not be read from the projection",
            ),
            (
                "discovery-failed",
                "find_tools: the ranking task died (a bug, logged)",
            ),
        ],
    },
    Surface {
        place: "discovery model tiers (`multiplexer_status` `discovery.tiers`)",
        codes: &[
            ("ready", ""),
            ("disabled", "`GRAPH_OS_RANKER`"),
            ("model-not-installed", ""),
            ("model-file-missing", ""),
            ("model-digest-mismatch", ""),
            ("model-load-failed", ""),
        ],
    },
    Surface {
        place: "config",
        codes: &[
            ("config-unreadable", "document-level"),
            ("config-invalid", "document-level"),
            (
                "egress-denied",
                "per entry: server + field + reason, which starts with the code where it has one",
            ),
            (
                "self-registration-refused",
                "the entry is graph-os itself: a listen address, or an `--allowed-host` / the `--oauth-audience` host on any port",
            ),
        ],
    },
    Surface {
        place: "startup (graph-os does not serve; the log line and exit status 1)",
        codes: &[
            (
                "process-isolation-failed",
                "graph-os could not make itself non-dumpable",
            ),
            (
                "invalid-setting",
                "a flag out of range, malformed or contradicting another (the message names it)",
            ),
            (
                "state-dir-unusable",
                "neither the state directory nor its fallback can be written",
            ),
            (
                "kubernetes-unavailable",
                "an McpFleet or a Lease store without a Kubernetes client",
            ),
            (
                "unauthenticated-exposure",
                "HTTP beyond loopback without a credential source or `--allow-unauthenticated`",
            ),
        ],
    },
];

/// Whether `code` is one of the stable codes.
pub fn is_code(code: &str) -> bool {
    SURFACES
        .iter()
        .any(|s| s.codes.iter().any(|(c, _)| *c == code))
}

/// `docs/error-codes.md`.
pub fn markdown() -> String {
    let mut out = String::from(
        "# Stable error codes\n\n\
         <!-- Generated from src/codes.rs by tests/error_codes.rs (GRAPH_OS_UPDATE_DOCS=1 rewrites it): edit the list there. -->\n\n\
         The codes graph-os answers with when it refuses or fails something, by where they appear.\n\n\
         | where | codes |\n|---|---|\n",
    );
    for surface in SURFACES {
        let codes: Vec<String> = surface
            .codes
            .iter()
            .map(|(code, note)| {
                if note.is_empty() {
                    format!("`{code}`")
                } else {
                    format!("`{code}` ({note})")
                }
            })
            .collect();
        out.push_str(&format!("| {} | {} |\n", surface.place, codes.join(", ")));
    }
    out.push_str(
        "\nAn unknown tool name is a JSON-RPC `-32602` error (`Unknown tool: NAME`); a child's own \
         JSON-RPC error is forwarded unchanged.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_kebab_case_and_listed_once_per_surface() {
        for s in SURFACES {
            let mut seen = std::collections::BTreeSet::new();
            for (code, _) in s.codes {
                assert!(seen.insert(*code), "{code} twice in {}", s.place);
                assert!(
                    code.split('-')
                        .all(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase())),
                    "{code} is not kebab-case"
                );
            }
        }
        assert!(is_code("child-busy") && !is_code("child-bussy"));
    }
}
