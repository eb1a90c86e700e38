//! The admin REST API (`/api/mcp/*`): the exact twins of list_catalog, multiplexer_status,
//! catalog_refresh and catalog_dispatch over the served multiplexer, plus its OpenAPI document.
//!
//! Every route but the OpenAPI document needs a credential (a `--token SCOPE=REF` static token or
//! an OAuth access token; anonymous access never applies here): no or unknown credential → 401,
//! too small a scope → 403 — both decided from the headers before any body is read (the
//! [`authenticate`] layer, then the [`Granted`] parts extractor ahead of each handler's body
//! extractor) — and a contract refusal → 409 with the same payload the MCP tool returns.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::future::BoxFuture;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::auth::{CredentialKind, Credentials, Identity, Scope};
use crate::mux::{
    CallContext, Caller, ClientCaps, Dispatched, ListCatalogArgs, Multiplexer, NotifyOutcome,
    Session, SessionNotifier,
};

/// The notifier of callers without a stream (REST, the status page).
pub(super) struct NoStream;

impl SessionNotifier for NoStream {
    fn tools_changed(&self) -> BoxFuture<'static, NotifyOutcome> {
        Box::pin(async { NotifyOutcome::NoStream })
    }
    fn resource_updated(&self, _uri: String) -> BoxFuture<'static, NotifyOutcome> {
        Box::pin(async { NotifyOutcome::NoStream })
    }
}

/// What an admin handler (REST, the status page) needs to authorize its request: the headers,
/// and the access line's note (present when `--access-log` or traces are on) that learns the
/// principal's digest.
pub(super) struct Asker {
    pub(super) headers: HeaderMap,
    note: Option<crate::telemetry::access::RequestNote>,
}

impl Asker {
    /// The viewer of an operator page (the status page, `/metrics`): the Host must be a
    /// loopback name or an `--allowed-host` (DNS rebinding), and the caller must hold the
    /// discover scope under `/mcp`'s policy — a verified credential, or anonymous where anonymous
    /// access is granted. One anonymous exception is refused here: with a credential source
    /// configured, `--anonymous-scope` admits anonymous MCP callers, never operator pages (they
    /// name every child, hidden ones included). The local development profile (no credential
    /// source, loopback) keeps them open.
    pub(super) async fn viewer(
        &self,
        hosts: &[String],
        credentials: &Credentials,
    ) -> Result<Identity, (StatusCode, &'static str)> {
        let host = self
            .headers
            .get(axum::http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        if !hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
            return Err((StatusCode::FORBIDDEN, "host-not-allowed"));
        }
        let authorization = self
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let identity = credentials
            .authenticate(authorization, || "operator-page".to_string())
            .await
            .map_err(|f| (StatusCode::UNAUTHORIZED, f.code))?;
        if credentials.configured() && identity.kind == CredentialKind::Anonymous {
            return Err((StatusCode::UNAUTHORIZED, "authentication-required"));
        }
        self.authenticated(&identity.subject);
        if identity.scope < Scope::Discover {
            return Err((StatusCode::FORBIDDEN, "authorization-denied"));
        }
        Ok(identity)
    }

    /// Records the authenticated subject on the request's access line (as its digest).
    pub(super) fn authenticated(&self, subject: &str) {
        if let Some(note) = &self.note {
            note.principal(subject);
        }
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Asker {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Asker {
            headers: parts.headers.clone(),
            note: parts.extensions.get().cloned(),
        })
    }
}

#[derive(Clone)]
struct Rest {
    mux: Arc<Multiplexer>,
    credentials: Arc<Credentials>,
    /// REST callers have no session: this one never loads anything.
    session: Arc<Session>,
}

fn json(status: StatusCode, body: &impl serde::Serialize) -> Response {
    (
        status,
        axum::Json(serde_json::to_value(body).unwrap_or_default()),
    )
        .into_response()
}

fn problem(status: StatusCode, code: &str) -> Response {
    json(status, &serde_json::json!({"code": code}))
}

/// Authenticates every REST request from its headers, before any handler runs and so before
/// any body is read (the one place the REST API checks credentials): a verified credential
/// (fail closed: with no credential source configured every request is refused) travels to
/// the handler as [`Authenticated`]; anything else is answered 401 at once, the body unread
/// (the listener closes the connection after such an answer).
async fn authenticate(
    State(rest): State<Rest>,
    asker: Asker,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let header = asker
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    let identity = if rest.credentials.configured() {
        rest.credentials.authenticate(header, String::new).await
    } else {
        Err(crate::auth::AuthFailure {
            status: 401,
            code: "authentication-required",
            challenge: String::new(),
        })
    };
    let identity = match identity {
        Ok(identity) if identity.kind != CredentialKind::Anonymous => identity,
        Ok(_) => {
            crate::telemetry::metrics().auth_refused("authentication-required");
            return problem(StatusCode::UNAUTHORIZED, "authentication-required");
        }
        Err(f) => {
            crate::telemetry::metrics().auth_refused(f.code);
            return problem(StatusCode::UNAUTHORIZED, f.code);
        }
    };
    asker.authenticated(&identity.subject);
    req.extensions_mut().insert(Authenticated(identity));
    next.run(req).await
}

/// The identity [`authenticate`] established for this request.
#[derive(Clone)]
struct Authenticated(Identity);

/// The least scope a REST route needs.
trait Need {
    const SCOPE: Scope;
}

struct Discover;
struct Delegate;
struct Manage;

impl Need for Discover {
    const SCOPE: Scope = Scope::Discover;
}
impl Need for Delegate {
    const SCOPE: Scope = Scope::Delegate;
}
impl Need for Manage {
    const SCOPE: Scope = Scope::Manage;
}

/// The caller of a REST request whose authenticated scope is at least `N`'s. A parts
/// extractor: it runs before a handler's body extractor, so a too small scope (403) reads no
/// body either.
struct Granted<N>(Caller, std::marker::PhantomData<N>);

impl<N: Need> axum::extract::FromRequestParts<Rest> for Granted<N> {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        rest: &Rest,
    ) -> Result<Self, Self::Rejection> {
        // Fail closed: a route reached without `authenticate` has no caller.
        let Some(Authenticated(identity)) = parts.extensions.remove::<Authenticated>() else {
            return Err(problem(StatusCode::UNAUTHORIZED, "authentication-required"));
        };
        if identity.scope < N::SCOPE {
            return Err(problem(StatusCode::FORBIDDEN, "authorization-denied"));
        }
        Ok(Granted(
            Caller::new(identity, rest.session.clone(), ClientCaps::default()),
            std::marker::PhantomData,
        ))
    }
}

/// The `/api/mcp` router: every route but the OpenAPI document behind [`authenticate`].
pub fn router(mux: Arc<Multiplexer>, credentials: Arc<Credentials>) -> Router {
    let session = mux.open_session(Arc::new(NoStream));
    let rest = Rest {
        mux,
        credentials,
        session,
    };
    Router::new()
        .route("/api/mcp/catalog", get(catalog))
        .route("/api/mcp/status", get(status))
        .route("/api/mcp/catalog/refresh", post(refresh))
        .route("/api/mcp/dispatch", post(dispatch))
        .route("/api/mcp/servers/{name}/approve", post(approve))
        .route_layer(axum::middleware::from_fn_with_state(
            rest.clone(),
            authenticate,
        ))
        .with_state(rest)
        .route(
            "/api/mcp/openapi.json",
            get(|| async { axum::Json(openapi()) }),
        )
}

#[derive(Deserialize)]
struct CatalogQuery {
    server: Option<String>,
    include_tools: Option<bool>,
}

async fn catalog(
    State(rest): State<Rest>,
    Granted(caller, _): Granted<Discover>,
    Query(q): Query<CatalogQuery>,
) -> Response {
    let args = ListCatalogArgs {
        server: q.server,
        include_tools: q.include_tools,
    };
    match rest.mux.list_catalog(&caller, args).await {
        Ok(v) => json(StatusCode::OK, &v),
        Err(e) => mux_error(&e),
    }
}

async fn status(State(rest): State<Rest>, Granted(caller, _): Granted<Discover>) -> Response {
    match rest.mux.status(&caller) {
        Ok(v) => json(StatusCode::OK, &v),
        Err(e) => mux_error(&e),
    }
}

fn mux_error(e: &crate::mux::MuxError) -> Response {
    json(
        super::wire::http_status(e),
        &serde_json::json!({"code": e.code(), "message": e.message()}),
    )
}

fn body_json(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body).unwrap_or(serde_json::Value::Null)
}

async fn refresh(
    State(rest): State<Rest>,
    Granted(caller, _): Granted<Manage>,
    body: axum::body::Bytes,
) -> Response {
    match rest.mux.refresh(&caller, body_json(&body)).await {
        Ok(r) => json(StatusCode::OK, &r),
        Err(e) => json(super::wire::contract_status(&e), &e),
    }
}

async fn dispatch(
    State(rest): State<Rest>,
    Granted(caller, _): Granted<Delegate>,
    body: axum::body::Bytes,
) -> Response {
    let cx = CallContext {
        ct: CancellationToken::new(),
        ..CallContext::default()
    };
    match rest.mux.dispatch(&caller, body_json(&body), cx).await {
        Ok(Dispatched::Result(r)) => json(StatusCode::OK, &super::era::call_result(r)),
        Ok(Dispatched::Failed(e)) => json(StatusCode::OK, &super::wire::meta_refusal(&e)),
        Err(e) => json(super::wire::contract_status(&e), &e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApproveBody {
    digest: String,
}

/// `POST /api/mcp/servers/{name}/approve {"digest"}` (scope manage): approves the child's changed
/// catalog (the pending digest its drift status shows) and publishes a new generation.
async fn approve(
    State(rest): State<Rest>,
    Granted(caller, _): Granted<Manage>,
    axum::extract::Path(name): axum::extract::Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let Ok(req) = serde_json::from_slice::<ApproveBody>(&body) else {
        return json(
            StatusCode::BAD_REQUEST,
            &serde_json::json!({"code": "invalid-params", "message": "expected {\"digest\": \"<64 hex digits>\"}"}),
        );
    };
    match rest.mux.approve(&caller, &name, &req.digest).await {
        Ok(v) => json(StatusCode::OK, &v),
        Err(e) => mux_error(&e),
    }
}

/// The OpenAPI 3.1 document of the admin API.
pub fn openapi() -> serde_json::Value {
    let schema = |v: serde_json::Map<String, serde_json::Value>| serde_json::Value::Object(v);
    let refresh = schema(
        (*rmcp::handler::server::common::schema_for_type::<crate::mux::RefreshRequest>()).clone(),
    );
    let dispatch = schema(
        (*rmcp::handler::server::common::schema_for_type::<crate::mux::DispatchRequest>()).clone(),
    );
    let error = serde_json::json!({
        "type": "object",
        "required": ["request_id", "code", "retryable", "catalog_generation", "snapshot_digest"],
        "properties": {
            "request_id": {"type": "string"},
            "code": {"type": "string", "enum": [
                "authorization-denied", "refresh-request-schema-mismatch", "config-revision-stale",
                "catalog-generation-stale", "catalog-digest-mismatch", "catalog-snapshot-incomplete",
                "refresh-deadline-exceeded", "reingestion-unreconciled", "replica-generation-divergent",
                "dispatcher-target-not-visible"]},
            "retryable": {"type": "boolean"},
            "catalog_generation": {"type": "integer", "minimum": 0},
            "snapshot_digest": {"type": "string"}
        }
    });
    let auth = serde_json::json!({
        "401": {"description": "no or unknown bearer token"},
        "403": {"description": "the token's scope is too small"}
    });
    let with = |extra: serde_json::Value| {
        let mut m = auth.as_object().cloned().unwrap_or_default();
        m.extend(extra.as_object().cloned().unwrap_or_default());
        serde_json::Value::Object(m)
    };
    let obj = serde_json::json!({"type": "object"});
    serde_json::json!({
        "openapi": "3.1.0",
        "info": {"title": "graph-os admin API", "version": env!("CARGO_PKG_VERSION")},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"RefreshRequest": refresh, "DispatchRequest": dispatch, "ContractError": error}
        },
        "security": [{"bearer": []}],
        "paths": {
            "/api/mcp/catalog": {"get": {
                "summary": "list_catalog (scope discover)",
                "parameters": [
                    {"name": "server", "in": "query", "required": false, "schema": {"type": "string"}},
                    {"name": "include_tools", "in": "query", "required": false, "schema": {"type": "boolean"}}
                ],
                "responses": with(serde_json::json!({
                    "200": {"description": "catalog", "content": {"application/json": {"schema": obj}}},
                    "404": {"description": "unknown server"}
                }))
            }},
            "/api/mcp/status": {"get": {
                "summary": "multiplexer_status (scope discover)",
                "responses": with(serde_json::json!({"200": {"description": "status", "content": {"application/json": {"schema": obj}}}}))
            }},
            "/api/mcp/catalog/refresh": {"post": {
                "summary": "catalog_refresh (scope manage)",
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RefreshRequest"}}}},
                "responses": with(serde_json::json!({
                    "200": {"description": "published (or unchanged)", "content": {"application/json": {"schema": obj}}},
                    "409": {"description": "contract refusal", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ContractError"}}}}
                }))
            }},
            "/api/mcp/servers/{name}/approve": {"post": {
                "summary": "approve a child's changed catalog (drift guard; scope manage)",
                "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}],
                "requestBody": {"required": true, "content": {"application/json": {"schema": {
                    "type": "object", "required": ["digest"], "additionalProperties": false,
                    "properties": {"digest": {"type": "string", "pattern": "^[0-9a-fA-F]{64}$"}}}}}},
                "responses": with(serde_json::json!({
                    "200": {"description": "approved; a new generation published", "content": {"application/json": {"schema": obj}}},
                    "404": {"description": "unknown server"},
                    "409": {"description": "drift-digest-mismatch, drift-guard-off or drift-approval-pinned"}
                }))
            }},
            "/api/mcp/dispatch": {"post": {
                "summary": "catalog_dispatch (scope delegate)",
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DispatchRequest"}}}},
                "responses": with(serde_json::json!({
                    "200": {"description": "the child's CallToolResult", "content": {"application/json": {"schema": obj}}},
                    "409": {"description": "contract refusal", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ContractError"}}}}
                }))
            }}
        }
    })
}
