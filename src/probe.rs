//! The bounded child-client boundary: connect (initialize) and list a child's catalog.
//!
//! Every child connection — the multiplexer's long-lived ones and one-shot metadata probes —
//! is opened through [`connect`] and listed through [`list_catalog`], so the same hard bounds
//! apply everywhere: initialization timeout, total probe deadline, items per family, aggregate
//! bytes, JSON depth and collection size. Exceeding a bound yields a stable category and keeps
//! nothing partial. A failed connection is an error, never an empty catalog. Prompts, resources
//! and templates are best-effort: "method not found" (or a capability the child does not
//! advertise) means "none"; any other failure of one of them (an error answer, a bound, the
//! deadline running out after the tools were listed) leaves that family out, recorded in
//! [`ChildCatalog::unavailable`] with its code, and never fails the child's tools. Only the
//! tools, or the connection closing, fail a probe.
//!
//! Skills are best effort in a stronger sense: after the four families, every listed resource
//! whose URI is `skill://<path>/SKILL.md` is read (`resources/read`, at most
//! [`ProbeBounds::max_skills`] of them, each at most [`ProbeBounds::max_skill_bytes`], all within
//! what is left of the probe deadline) and its front matter parsed
//! ([`crate::catalog::skill`]). A skill that cannot be read or parsed is left out (logged with a
//! stable reason code); it never fails the probe.
//!
//! Lists are fetched with raw requests rather than rmcp's cached `list_*` helpers: a probe must
//! see what the child says now, never a cached or stale-on-error answer.

use std::time::Duration;

use rmcp::model::{
    ClientRequest, ErrorCode, ListPromptsRequest, ListResourceTemplatesRequest,
    ListResourcesRequest, ListToolsRequest, PaginatedRequestParams, ReadResourceRequest,
    ReadResourceRequestParams, Resource, ResourceContents, ServerResult,
};
use rmcp::service::{
    ClientInitializeError, ClientLifecycleMode, ClientServiceExt, RoleClient, RunningService,
    ServiceError,
};
use rmcp::{Peer, Service};
use serde::Serialize;
use tokio::time::Instant;

use crate::catalog::skill::{self, Skill};
use crate::catalog::{ChildCatalog, FamilyError};

/// Hard bounds on what a child may advertise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeBounds {
    /// Items per family (tools, prompts, resources, templates).
    pub max_items_per_family: usize,
    /// Aggregate size: UTF-8 bytes of strings and keys plus 16 per scalar.
    pub max_total_bytes: usize,
    /// JSON nesting depth of any item.
    pub max_depth: usize,
    /// Entries in any one JSON object or array.
    pub max_collection: usize,
    /// Pages followed per family.
    pub max_pages: usize,
    /// Skills read per child: the first this many `skill://…/SKILL.md` resources by URI; the
    /// rest are left out (logged), never a failed probe.
    pub max_skills: usize,
    /// Largest SKILL.md read, in bytes; a larger one is left out (`skill-too-large`). Kept
    /// skills (URI, name, description) also count towards `max_total_bytes`.
    pub max_skill_bytes: usize,
}

impl Default for ProbeBounds {
    fn default() -> Self {
        ProbeBounds {
            max_items_per_family: 2048,
            max_total_bytes: 4 * 1024 * 1024,
            max_depth: 32,
            max_collection: 4096,
            max_pages: 256,
            max_skills: 64,
            max_skill_bytes: 64 * 1024,
        }
    }
}

/// Why a probe failed. Every variant has a stable [`ProbeError::code`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// `initialize` did not complete in time.
    #[error("initialize did not complete within {0:?}")]
    InitializeTimeout(Duration),
    /// `initialize` failed (transport closed, error answer, bad version).
    #[error("initialize failed: {0}")]
    Initialize(String),
    /// The whole probe did not finish before its deadline.
    #[error("catalog probe did not finish within {0:?}")]
    Timeout(Duration),
    /// A family has more items than allowed.
    #[error("{family} has more than {limit} items")]
    TooManyItems {
        /// Family name.
        family: &'static str,
        /// The bound.
        limit: usize,
    },
    /// The aggregate catalog is too large.
    #[error("catalog is larger than {0} bytes")]
    TooLarge(usize),
    /// An item nests deeper than allowed.
    #[error("{family} item nests deeper than {limit}")]
    TooDeep {
        /// Family name.
        family: &'static str,
        /// The bound.
        limit: usize,
    },
    /// An object or array in an item has too many entries.
    #[error("{family} item has a collection larger than {limit}")]
    CollectionTooLarge {
        /// Family name.
        family: &'static str,
        /// The bound.
        limit: usize,
    },
    /// A list request failed for a required family (tools) or with a non-"not found" error.
    #[error("{family} listing failed: {reason}")]
    ListFailed {
        /// Family name.
        family: &'static str,
        /// Sanitized reason.
        reason: String,
    },
    /// The connection closed during the probe.
    #[error("connection closed")]
    Closed,
    /// An item is malformed (empty or oversized name...).
    #[error("{family} item invalid: {reason}")]
    InvalidItem {
        /// Family name.
        family: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl ProbeError {
    /// Stable category code.
    pub fn code(&self) -> &'static str {
        match self {
            ProbeError::InitializeTimeout(_) => "child-initialize-timeout",
            ProbeError::Initialize(_) => "child-initialize-failed",
            ProbeError::Timeout(_) => "catalog-probe-timeout",
            ProbeError::TooManyItems { .. } => "catalog-too-many-items",
            ProbeError::TooLarge(_) => "catalog-too-large",
            ProbeError::TooDeep { .. } => "catalog-too-deep",
            ProbeError::CollectionTooLarge { .. } => "catalog-collection-too-large",
            ProbeError::ListFailed { .. } => "catalog-list-failed",
            ProbeError::Closed => "child-transport-closed",
            ProbeError::InvalidItem { .. } => "catalog-item-invalid",
        }
    }
}

/// Opens a child connection over `transport` within `timeout`: the `initialize` handshake
/// (2025 era) or `server/discover` (2026-07-28), as `lifecycle` says.
pub async fn connect<H, T, E, A>(
    handler: H,
    transport: T,
    lifecycle: ClientLifecycleMode,
    timeout: Duration,
) -> Result<RunningService<RoleClient, H>, ProbeError>
where
    H: Service<RoleClient>,
    T: rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
    A: 'static,
{
    // rmcp's connection span is a child of the span current when the connection starts, and
    // lives as long as the connection: under the caller's (probe connect) span it would keep
    // that span open until the connection ends (exported late, racing the final flush). The
    // connection starts on a task of its own, under no span; dropping this future aborts it.
    let open = tokio::spawn(tokio::time::timeout(
        timeout,
        ClientServiceExt::serve_with_lifecycle(handler, transport, lifecycle),
    ));
    let _abort = AbortOnDrop(open.abort_handle());
    match open.await {
        Err(e) => Err(ProbeError::Initialize(format!(
            "the connection task failed: {e}"
        ))),
        Ok(Err(_)) => Err(ProbeError::InitializeTimeout(timeout)),
        Ok(Ok(Err(e))) => Err(ProbeError::Initialize(init_reason(&e))),
        Ok(Ok(Ok(running))) => Ok(running),
    }
}

/// Aborts a task when dropped (a cancelled connect leaves no connection behind).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Longest reason kept from a child's error (clipped in the middle: the cause is at the end).
pub const MAX_REASON: usize = 512;

fn init_reason(e: &ClientInitializeError) -> String {
    let chain = crate::telemetry::redact::error_chain(e);
    crate::telemetry::redact::clip(&without_type_names(&chain), MAX_REASON)
}

/// rmcp names a transport by its Rust type (`Transport [a::B<c::D<…>>] error`): noise that
/// would crowd the cause out of a bounded message.
fn without_type_names(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("Transport [") {
        let Some(len) = rest[i..].find("] ") else {
            break;
        };
        out.push_str(&rest[..i]);
        out.push_str("Transport");
        rest = &rest[i + len + 1..];
    }
    out.push_str(rest);
    out
}

/// Lists all four families from a connected child under `deadline`, enforcing `bounds`, then
/// reads its skills (best effort) in whatever is left of `deadline`.
pub async fn list_catalog(
    peer: &Peer<RoleClient>,
    bounds: ProbeBounds,
    deadline: Duration,
) -> Result<ChildCatalog, ProbeError> {
    let end = Instant::now() + deadline;
    let mut budget = SizeBudget { used: 0, bounds };
    let mut catalog = list_inner(peer, bounds, &mut budget, end, deadline).await?;
    catalog.skills = read_skills(peer, &catalog.resources, bounds, &mut budget, end).await;
    Ok(catalog)
}

/// Why one skill was left out.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SkillSkipped {
    /// The SKILL.md URI.
    uri: String,
    /// Stable reason code (`skill-read-failed`, `skill-read-timeout`, `skill-not-text`,
    /// `skill-over-catalog-budget`, or a [`skill::SkillError`] code).
    code: &'static str,
}

/// Reads and parses the SKILL.md resources among `resources` (sorted by URI, at most
/// `bounds.max_skills`) until `end`. Never fails: what cannot be read or parsed is logged and
/// left out.
async fn read_skills(
    peer: &Peer<RoleClient>,
    resources: &[Resource],
    bounds: ProbeBounds,
    budget: &mut SizeBudget,
    end: Instant,
) -> Vec<Skill> {
    let mut uris: Vec<&str> = resources
        .iter()
        .map(|r| r.uri.as_str())
        .filter(|u| skill::is_skill_uri(u))
        .collect();
    uris.sort_unstable();
    uris.dedup();
    if uris.is_empty() {
        return Vec::new();
    }
    if uris.len() > bounds.max_skills {
        tracing::warn!(
            skills = uris.len(),
            limit = bounds.max_skills,
            reason = "skill-over-limit",
            "skills beyond the limit left out of the catalog"
        );
        uris.truncate(bounds.max_skills);
    }
    let mut skills = Vec::new();
    let mut skipped = Vec::new();
    for uri in uris {
        match read_skill(peer, uri, bounds.max_skill_bytes, end).await {
            Ok(s) => {
                let size = s.uri.len() + s.name.len() + s.description.len() + 48;
                if budget.used + size > bounds.max_total_bytes {
                    skipped.push(SkillSkipped {
                        uri: uri.to_string(),
                        code: "skill-over-catalog-budget",
                    });
                    continue;
                }
                budget.used += size;
                skills.push(s);
            }
            Err(code) => skipped.push(SkillSkipped {
                uri: uri.to_string(),
                code,
            }),
        }
    }
    for s in &skipped {
        tracing::warn!(uri = %s.uri, reason = s.code, "skill left out of the catalog");
    }
    tracing::debug!(
        skills = skills.len(),
        skipped = skipped.len(),
        "skills read"
    );
    skills
}

/// Reads one SKILL.md before `end` and parses its front matter; `Err` is the stable reason.
async fn read_skill(
    peer: &Peer<RoleClient>,
    uri: &str,
    max_bytes: usize,
    end: Instant,
) -> Result<Skill, &'static str> {
    if remaining(end).is_zero() {
        return Err("skill-read-timeout");
    }
    let request = ClientRequest::ReadResourceRequest(ReadResourceRequest::new(
        ReadResourceRequestParams::new(uri),
    ));
    let answer = match tokio::time::timeout(remaining(end), peer.send_request(request)).await {
        Err(_) => return Err("skill-read-timeout"),
        Ok(Err(e)) => {
            tracing::debug!(uri, error = %truncated(&e.to_string()), "skill read failed");
            return Err("skill-read-failed");
        }
        Ok(Ok(ServerResult::ReadResourceResult(r))) => r,
        Ok(Ok(_)) => return Err("skill-read-failed"),
    };
    let text = skill_text(&answer.contents, uri, max_bytes)?;
    skill::parse_skill(uri, &text, max_bytes).map_err(|e| e.code())
}

/// The SKILL.md text among a read's contents: the entry of `uri` (or the only one), as text
/// or as UTF-8 in a blob.
fn skill_text(
    contents: &[ResourceContents],
    uri: &str,
    max_bytes: usize,
) -> Result<String, &'static str> {
    let entry_uri = |c: &ResourceContents| match c {
        ResourceContents::TextResourceContents { uri, .. }
        | ResourceContents::BlobResourceContents { uri, .. } => Some(uri.clone()),
        _ => None,
    };
    let entry = contents
        .iter()
        .find(|c| entry_uri(c).as_deref() == Some(uri))
        .or(if contents.len() == 1 {
            contents.first()
        } else {
            None
        })
        .ok_or("skill-read-failed")?;
    match entry {
        ResourceContents::TextResourceContents { text, .. } => {
            if text.len() > max_bytes {
                return Err("skill-too-large");
            }
            Ok(text.clone())
        }
        ResourceContents::BlobResourceContents { blob, .. } => {
            // Base64 is 4/3 of the bytes: refuse before decoding what cannot fit.
            if blob.len() / 4 * 3 > max_bytes + 3 {
                return Err("skill-too-large");
            }
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(blob.trim())
                .map_err(|_| "skill-not-text")?;
            String::from_utf8(bytes).map_err(|_| "skill-not-text")
        }
        _ => Err("skill-not-text"),
    }
}

fn truncated(s: &str) -> String {
    let mut s = s.to_string();
    if s.len() > 300 {
        let mut end = 300;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// An optional family's listing: its items, or (for any failure but a closed connection) none,
/// recorded in `unavailable` and logged.
fn optional<T>(
    family: &'static str,
    listed: Result<Result<Vec<T>, ProbeError>, tokio::time::error::Elapsed>,
    deadline: Duration,
    unavailable: &mut std::collections::BTreeMap<String, FamilyError>,
) -> Result<Vec<T>, ProbeError> {
    let e = match listed {
        Ok(Ok(items)) => return Ok(items),
        Ok(Err(ProbeError::Closed)) => return Err(ProbeError::Closed),
        Ok(Err(e)) => e,
        Err(_) => ProbeError::Timeout(deadline),
    };
    tracing::warn!(family, code = e.code(), error = %e, "an optional family could not be listed; the child's tools are kept");
    unavailable.insert(
        family.to_string(),
        FamilyError {
            code: e.code().to_string(),
            message: crate::telemetry::redact::clip(&e.to_string(), MAX_REASON),
        },
    );
    Ok(Vec::new())
}

async fn list_inner(
    peer: &Peer<RoleClient>,
    bounds: ProbeBounds,
    budget: &mut SizeBudget,
    end: Instant,
    deadline: Duration,
) -> Result<ChildCatalog, ProbeError> {
    let caps = peer.peer_info().map(|i| i.capabilities.clone());
    let has_prompts = caps.as_ref().is_none_or(|c| c.prompts.is_some());
    let has_resources = caps.as_ref().is_none_or(|c| c.resources.is_some());
    let mut unavailable = std::collections::BTreeMap::new();

    let tools = tokio::time::timeout_at(
        end,
        paginate(
            peer,
            "tools",
            true,
            bounds,
            budget,
            |cursor| ClientRequest::ListToolsRequest(ListToolsRequest::with_param(page(cursor))),
            |r| match r {
                ServerResult::ListToolsResult(r) => Some((r.tools, r.next_cursor)),
                _ => None,
            },
        ),
    )
    .await
    .map_err(|_| ProbeError::Timeout(deadline))??;
    // Item names are not checked here: the view applies the name rule per item
    // (`catalog::naming::check_item_name`), so one bad name drops that item, not the child.
    let prompts = if has_prompts {
        let listed = tokio::time::timeout_at(end, async {
            let prompts = paginate(
                peer,
                "prompts",
                false,
                bounds,
                budget,
                |cursor| {
                    ClientRequest::ListPromptsRequest(ListPromptsRequest::with_param(page(cursor)))
                },
                |r| match r {
                    ServerResult::ListPromptsResult(r) => Some((r.prompts, r.next_cursor)),
                    _ => None,
                },
            )
            .await?;
            Ok::<_, ProbeError>(prompts)
        })
        .await;
        optional("prompts", listed, deadline, &mut unavailable)?
    } else {
        Vec::new()
    };
    let (resources, resource_templates) = if has_resources {
        let listed = tokio::time::timeout_at(
            end,
            paginate(
                peer,
                "resources",
                false,
                bounds,
                budget,
                |cursor| {
                    ClientRequest::ListResourcesRequest(ListResourcesRequest::with_param(page(
                        cursor,
                    )))
                },
                |r| match r {
                    ServerResult::ListResourcesResult(r) => Some((r.resources, r.next_cursor)),
                    _ => None,
                },
            ),
        )
        .await;
        let resources = optional("resources", listed, deadline, &mut unavailable)?;
        let listed = tokio::time::timeout_at(
            end,
            paginate(
                peer,
                "resourceTemplates",
                false,
                bounds,
                budget,
                |cursor| {
                    ClientRequest::ListResourceTemplatesRequest(
                        ListResourceTemplatesRequest::with_param(page(cursor)),
                    )
                },
                |r| match r {
                    ServerResult::ListResourceTemplatesResult(r) => {
                        Some((r.resource_templates, r.next_cursor))
                    }
                    _ => None,
                },
            ),
        )
        .await;
        let templates = optional("resourceTemplates", listed, deadline, &mut unavailable)?;
        (resources, templates)
    } else {
        (Vec::new(), Vec::new())
    };
    Ok(ChildCatalog {
        tools,
        prompts,
        resources,
        resource_templates,
        skills: Vec::new(),
        unavailable,
    })
}

fn page(cursor: Option<String>) -> PaginatedRequestParams {
    PaginatedRequestParams::default().with_cursor(cursor)
}

struct SizeBudget {
    used: usize,
    bounds: ProbeBounds,
}

impl SizeBudget {
    fn admit(&mut self, family: &'static str, value: &serde_json::Value) -> Result<(), ProbeError> {
        let mut stack = vec![(value, 1usize)];
        while let Some((v, depth)) = stack.pop() {
            if depth > self.bounds.max_depth {
                return Err(ProbeError::TooDeep {
                    family,
                    limit: self.bounds.max_depth,
                });
            }
            match v {
                serde_json::Value::Object(map) => {
                    if map.len() > self.bounds.max_collection {
                        return Err(ProbeError::CollectionTooLarge {
                            family,
                            limit: self.bounds.max_collection,
                        });
                    }
                    for (k, child) in map {
                        self.used += k.len();
                        stack.push((child, depth + 1));
                    }
                }
                serde_json::Value::Array(items) => {
                    if items.len() > self.bounds.max_collection {
                        return Err(ProbeError::CollectionTooLarge {
                            family,
                            limit: self.bounds.max_collection,
                        });
                    }
                    stack.extend(items.iter().map(|c| (c, depth + 1)));
                }
                serde_json::Value::String(s) => self.used += s.len(),
                _ => self.used += 16,
            }
            if self.used > self.bounds.max_total_bytes {
                return Err(ProbeError::TooLarge(self.bounds.max_total_bytes));
            }
        }
        Ok(())
    }
}

#[allow(clippy::too_many_arguments)]
async fn paginate<T: Serialize>(
    peer: &Peer<RoleClient>,
    family: &'static str,
    required: bool,
    bounds: ProbeBounds,
    budget: &mut SizeBudget,
    request: impl Fn(Option<String>) -> ClientRequest,
    extract: impl Fn(ServerResult) -> Option<(Vec<T>, Option<String>)>,
) -> Result<Vec<T>, ProbeError> {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    let mut seen = std::collections::HashSet::new();
    for _ in 0..bounds.max_pages {
        let answer = match peer.send_request(request(cursor.clone())).await {
            Ok(r) => r,
            Err(ServiceError::McpError(e))
                if !required && e.code == ErrorCode::METHOD_NOT_FOUND =>
            {
                return Ok(Vec::new());
            }
            Err(ServiceError::TransportClosed) | Err(ServiceError::TransportSend(_)) => {
                return Err(ProbeError::Closed);
            }
            Err(e) => {
                let reason = crate::telemetry::redact::clip(
                    &crate::telemetry::redact::error_chain(&e),
                    MAX_REASON,
                );
                return Err(ProbeError::ListFailed { family, reason });
            }
        };
        let Some((page_items, next)) = extract(answer) else {
            return Err(ProbeError::ListFailed {
                family,
                reason: "unexpected response type".into(),
            });
        };
        if items.len() + page_items.len() > bounds.max_items_per_family {
            return Err(ProbeError::TooManyItems {
                family,
                limit: bounds.max_items_per_family,
            });
        }
        for item in &page_items {
            let value = serde_json::to_value(item).map_err(|e| ProbeError::InvalidItem {
                family,
                reason: e.to_string(),
            })?;
            budget.admit(family, &value)?;
        }
        items.extend(page_items);
        match next {
            Some(c) if !c.is_empty() && seen.insert(c.clone()) => cursor = Some(c),
            _ => return Ok(items),
        }
    }
    Err(ProbeError::ListFailed {
        family,
        reason: format!("more than {} pages", bounds.max_pages),
    })
}

/// Time left until `deadline` (zero when past).
pub fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use rmcp::model::*;
    use rmcp::service::RequestContext;
    use rmcp::{ErrorData, RoleServer, ServerHandler};

    use super::*;

    /// What reading one resource answers.
    #[derive(Clone)]
    enum Body {
        Text(String),
        Blob(Vec<u8>),
        Error,
        Hang,
    }

    /// An in-process child serving one tool and the given resources.
    #[derive(Clone)]
    struct Child {
        resources: bool,
        files: Arc<BTreeMap<String, Body>>,
    }

    impl ServerHandler for Child {
        fn get_info(&self) -> ServerConfig {
            let caps = ServerCapabilities::builder().enable_tools();
            let caps = if self.resources {
                caps.enable_resources().build()
            } else {
                caps.build()
            };
            ServerConfig::new(caps)
        }

        async fn list_tools(
            &self,
            _r: Option<PaginatedRequestParams>,
            _c: RequestContext<RoleServer>,
        ) -> Result<ListToolsResult, ErrorData> {
            Ok(ListToolsResult::with_all_items(vec![Tool::new(
                "add",
                "Add two numbers",
                serde_json::Map::new(),
            )]))
        }

        async fn list_resources(
            &self,
            _r: Option<PaginatedRequestParams>,
            _c: RequestContext<RoleServer>,
        ) -> Result<ListResourcesResult, ErrorData> {
            if !self.resources {
                return Err(ErrorData::method_not_found::<ListResourcesRequestMethod>());
            }
            Ok(ListResourcesResult::with_all_items(
                self.files.keys().map(|u| Resource::new(u, "r")).collect(),
            ))
        }

        async fn read_resource(
            &self,
            request: ReadResourceRequestParams,
            _c: RequestContext<RoleServer>,
        ) -> Result<ReadResourceResponse, ErrorData> {
            let contents = match self.files.get(&request.uri) {
                Some(Body::Text(t)) => ResourceContents::text(t.clone(), request.uri),
                Some(Body::Blob(b)) => {
                    use base64::Engine as _;
                    ResourceContents::BlobResourceContents {
                        uri: request.uri,
                        mime_type: None,
                        blob: base64::engine::general_purpose::STANDARD.encode(b),
                        meta: None,
                    }
                }
                Some(Body::Hang) => std::future::pending().await,
                Some(Body::Error) | None => {
                    return Err(ErrorData::resource_not_found("no such resource", None));
                }
            };
            Ok(ReadResourceResponse::Complete(ReadResourceResult::new(
                vec![contents],
            )))
        }
    }

    fn md(name: &str, description: &str) -> Body {
        Body::Text(format!(
            "---\nname: {name}\ndescription: {description}\n---\n# {name}\n"
        ))
    }

    async fn probe(
        resources: bool,
        files: Vec<(&str, Body)>,
        bounds: ProbeBounds,
        deadline: Duration,
    ) -> Result<ChildCatalog, ProbeError> {
        let child = Child {
            resources,
            files: Arc::new(files.into_iter().map(|(u, b)| (u.to_string(), b)).collect()),
        };
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        tokio::spawn(async move {
            if let Ok(running) = rmcp::ServiceExt::serve(child, tokio::io::split(server_io)).await {
                let _ = running.waiting().await;
            }
        });
        let client = connect(
            (),
            tokio::io::split(client_io),
            ClientLifecycleMode::Initialize,
            Duration::from_secs(5),
        )
        .await
        .expect("initialize");
        list_catalog(client.peer(), bounds, deadline).await
    }

    const LONG: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn skill_md_resources_become_skills_and_other_resources_stay_resources() {
        let cat = probe(
            true,
            vec![
                ("skill://pdf/SKILL.md", md("pdf", "Fill PDF forms")),
                ("skill://pdf/references/forms.md", Body::Text("x".into())),
                ("test://hello", Body::Text("hello".into())),
                (
                    "skill://blob/SKILL.md",
                    Body::Blob(b"---\nname: blob\ndescription: As a blob\n---\n".to_vec()),
                ),
            ],
            ProbeBounds::default(),
            LONG,
        )
        .await
        .unwrap();
        assert_eq!(cat.resources.len(), 4);
        let skills: Vec<(&str, &str, &str)> = cat
            .skills
            .iter()
            .map(|s| (s.uri.as_str(), s.name.as_str(), s.description.as_str()))
            .collect();
        assert_eq!(
            skills,
            [
                ("skill://blob/SKILL.md", "blob", "As a blob"),
                ("skill://pdf/SKILL.md", "pdf", "Fill PDF forms"),
            ]
        );
    }

    #[tokio::test]
    async fn a_child_without_resources_probes_fine_with_no_skills() {
        let cat = probe(false, vec![], ProbeBounds::default(), LONG)
            .await
            .unwrap();
        assert_eq!(cat.tools.len(), 1);
        assert!(cat.resources.is_empty() && cat.skills.is_empty());
    }

    #[tokio::test]
    async fn skills_that_cannot_be_read_or_parsed_are_left_out_never_failing_the_probe() {
        let bounds = ProbeBounds {
            max_skill_bytes: 200,
            ..ProbeBounds::default()
        };
        let cat = probe(
            true,
            vec![
                ("skill://good/SKILL.md", md("good", "Works")),
                ("skill://error/SKILL.md", Body::Error),
                (
                    "skill://plain/SKILL.md",
                    Body::Text("# no front matter".into()),
                ),
                (
                    "skill://nodesc/SKILL.md",
                    Body::Text("---\nname: x\n---\n".into()),
                ),
                ("skill://big/SKILL.md", md("big", &"b".repeat(300))),
                (
                    "skill://binary/SKILL.md",
                    Body::Blob(vec![0xff, 0xfe, 0x00]),
                ),
            ],
            bounds,
            LONG,
        )
        .await
        .unwrap();
        let uris: Vec<&str> = cat.skills.iter().map(|s| s.uri.as_str()).collect();
        assert_eq!(uris, ["skill://good/SKILL.md"]);
        assert_eq!(cat.resources.len(), 6, "every resource is still listed");
    }

    #[tokio::test]
    async fn a_hanging_skill_read_costs_only_the_rest_of_the_deadline() {
        let started = Instant::now();
        let cat = probe(
            true,
            vec![
                ("skill://a-good/SKILL.md", md("a-good", "Read first")),
                ("skill://b-hang/SKILL.md", Body::Hang),
                ("skill://c-late/SKILL.md", md("c-late", "After the hang")),
            ],
            ProbeBounds::default(),
            Duration::from_millis(500),
        )
        .await
        .expect("a hanging skill never fails the probe");
        assert!(started.elapsed() < Duration::from_secs(3));
        let uris: Vec<&str> = cat.skills.iter().map(|s| s.uri.as_str()).collect();
        assert_eq!(uris, ["skill://a-good/SKILL.md"]);
        assert_eq!(cat.tools.len(), 1);
    }

    #[tokio::test]
    async fn at_most_max_skills_are_read_in_uri_order() {
        let bounds = ProbeBounds {
            max_skills: 2,
            ..ProbeBounds::default()
        };
        let cat = probe(
            true,
            vec![
                ("skill://c/SKILL.md", md("c", "three")),
                ("skill://a/SKILL.md", md("a", "one")),
                ("skill://b/SKILL.md", md("b", "two")),
            ],
            bounds,
            LONG,
        )
        .await
        .unwrap();
        let names: Vec<&str> = cat.skills.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[tokio::test]
    async fn kept_skills_count_towards_the_catalog_byte_bound() {
        // Room for the listing, not for the skill's description on top of it.
        let desc = "d".repeat(2000);
        let listing_only = probe(
            true,
            vec![("skill://big/SKILL.md", md("big", &desc))],
            ProbeBounds::default(),
            LONG,
        )
        .await
        .unwrap();
        assert_eq!(listing_only.skills.len(), 1);
        let bounds = ProbeBounds {
            max_total_bytes: 1500,
            ..ProbeBounds::default()
        };
        let cat = probe(
            true,
            vec![("skill://big/SKILL.md", md("big", &desc))],
            bounds,
            LONG,
        )
        .await
        .unwrap();
        assert_eq!(cat.resources.len(), 1);
        assert!(cat.skills.is_empty());
    }
}
