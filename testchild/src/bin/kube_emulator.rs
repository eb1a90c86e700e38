//! `graph-os-kube-emulator`: a small, stateful, in-memory emulator of the Kubernetes API server,
//! good enough for kube 5 clients (`Api::get/create/replace/patch/patch_status/delete/list`,
//! `kube::runtime::watcher` with list + watch, bookmarks, resume and 410 handling, `watch_object`).
//! Test-only; not part of the product.
//!
//! `graph-os-kube-emulator --port PORT` listens on 127.0.0.1 only (PORT 0 picks a free port),
//! prints exactly one line `listening on 127.0.0.1:PORT` on stdout, then serves plain HTTP/1.1
//! without TLS or authentication.
//!
//! Registered kinds (all namespaced):
//! - `mcpfleets`  graphos.dev/v1alpha1 `McpFleet` (status subresource)
//! - `leases`     coordination.k8s.io/v1 `Lease`
//! - `secrets`    v1 `Secret` (`stringData` is folded into base64 `data`)
//! - `configmaps` v1 `ConfigMap`
//!
//! Fault hooks and debugging endpoints (not part of any real API server):
//! - `POST /_emulator/fail-next` `{"method":"PUT","path_prefix":"/apis/coordination.k8s.io","status":500}`
//!   (optional `times`, `delay_ms`, `query_contains`, `reason`, `message`; an array of rules is
//!   accepted too): the next matching request(s) fail with that status. `DELETE` clears the rules.
//! - `POST /_emulator/expire-history`: drop the retained watch history (and bump the
//!   resourceVersion), so a watch resuming from an older resourceVersion gets one `ERROR` event
//!   with a 410 `Expired` Status. Also ends the open watch streams unless the body is
//!   `{"close_watches": false}`.
//! - `POST /_emulator/close-watches`: end every open watch stream (clients resume).
//! - `POST /_emulator/reset`: drop every object, the history, the fault rules and the request log.
//! - `GET /_emulator/objects`: dump of every stored object; `GET /_emulator/requests`: request log.
// Errors are full Kubernetes Status documents returned straight to HTTP; boxing them would only
// add noise to a test-only server.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use clap::Parser;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::{broadcast, mpsc};

/// Largest request body accepted.
const MAX_BODY: usize = 32 << 20;
/// First resourceVersion handed out is `INITIAL_RV + 1`.
const INITIAL_RV: u64 = 100;
/// Default watch timeout when the client sends none (kube 5 always sends 290).
const DEFAULT_WATCH_SECONDS: u64 = 290;
/// Request log entries kept for `GET /_emulator/requests`.
const REQUEST_LOG: usize = 2000;
/// Annotation that marks the end of the initial events of a streaming list.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";
/// Metadata fields only the server sets; client values are ignored on update.
const SERVER_FIELDS: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "generation",
    "resourceVersion",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

#[derive(Parser, Debug)]
#[command(
    name = "graph-os-kube-emulator",
    about = "In-memory Kubernetes API server emulator for kube 5 tests (127.0.0.1, plain HTTP)"
)]
struct Args {
    /// TCP port to listen on at 127.0.0.1 (0 = pick a free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Number of watch events retained for resuming watches (older ones answer 410 Expired).
    #[arg(long, default_value_t = 1000)]
    history: usize,
    /// Interval between BOOKMARK events on watches with allowWatchBookmarks=true, in ms.
    #[arg(long, default_value_t = 1000)]
    bookmark_interval_ms: u64,
    /// Upper bound applied to a watch's timeoutSeconds.
    #[arg(long, default_value_t = 600)]
    max_watch_seconds: u64,
    /// Log every request (method, URI, status) on stderr.
    #[arg(long)]
    log_requests: bool,
    /// Exit when stdin reaches end of file (lets a parent that dies take the emulator with it).
    #[arg(long)]
    exit_on_stdin_eof: bool,
}

// ---------------------------------------------------------------------------------------------
// Kinds
// ---------------------------------------------------------------------------------------------

/// One registered resource type.
#[derive(Debug)]
struct Kind {
    plural: &'static str,
    singular: &'static str,
    /// API group; empty for the core group (`/api/v1`).
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    namespaced: bool,
    /// Has a `/status` subresource: the main resource ignores `.status`, `/status` only changes it.
    status: bool,
}

const KINDS: &[Kind] = &[
    Kind {
        plural: "mcpfleets",
        singular: "mcpfleet",
        group: "graphos.dev",
        version: "v1alpha1",
        kind: "McpFleet",
        namespaced: true,
        status: true,
    },
    Kind {
        plural: "leases",
        singular: "lease",
        group: "coordination.k8s.io",
        version: "v1",
        kind: "Lease",
        namespaced: true,
        status: false,
    },
    Kind {
        plural: "secrets",
        singular: "secret",
        group: "",
        version: "v1",
        kind: "Secret",
        namespaced: true,
        status: false,
    },
    Kind {
        plural: "configmaps",
        singular: "configmap",
        group: "",
        version: "v1",
        kind: "ConfigMap",
        namespaced: true,
        status: false,
    },
];

impl Kind {
    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `leases.coordination.k8s.io`, `secrets`: how the API server names a resource in messages.
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    fn find(group: &str, version: &str, plural: &str) -> Option<&'static Kind> {
        KINDS
            .iter()
            .find(|k| k.group == group && k.version == version && k.plural == plural)
    }
}

// ---------------------------------------------------------------------------------------------
// Errors (Kubernetes `Status` objects)
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
struct ApiError {
    code: u16,
    reason: String,
    message: String,
    details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
        }
    }

    fn for_object(mut self, kind: &Kind, name: &str) -> Self {
        self.details = Some(json!({"name": name, "group": kind.group, "kind": kind.plural}));
        self
    }

    fn not_found(kind: &Kind, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", kind.qualified()),
        )
        .for_object(kind, name)
    }

    fn already_exists(kind: &Kind, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", kind.qualified()),
        )
        .for_object(kind, name)
    }

    fn conflict(kind: &Kind, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                kind.qualified()
            ),
        )
        .for_object(kind, name)
    }

    fn stale(kind: &Kind, name: &str) -> Self {
        Self::conflict(
            kind,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    fn invalid(kind: &Kind, name: &str, what: &str) -> Self {
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {what}", kind.qualified()),
        )
        .for_object(kind, name);
        if let Some(Value::Object(d)) = e.details.as_mut() {
            d.insert(
                "causes".into(),
                json!([{"reason": "FieldValueInvalid", "message": what}]),
            );
        }
        e
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    fn method_not_allowed(method: &Method) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        )
    }

    fn expired(requested: u64, floor: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({floor})"),
        )
    }

    fn status_json(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = json_response(self.code, &self.status_json());
        if self.code == 429 {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}

/// The `reason` the API server uses for a status code (fault injection).
fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

type ApiResult<T> = Result<T, ApiError>;

fn json_response(code: u16, v: &Value) -> Response {
    let mut resp = Response::new(Body::from(serde_json::to_vec(v).unwrap_or_default()));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// What a real API server answers for an unknown group or resource (a missing CRD): plain text.
fn plain_404() -> Response {
    let mut resp = Response::new(Body::from("404 page not found\n"));
    *resp.status_mut() = StatusCode::NOT_FOUND;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

// ---------------------------------------------------------------------------------------------
// Query strings and selectors
// ---------------------------------------------------------------------------------------------

fn percent_decode(s: &str, plus_is_space: bool) -> String {
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).map(|d| d as u8)
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' if plus_is_space => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Lenient query-string parsing: empty strings, leading `&` and repeated keys (last wins) are fine.
#[derive(Debug, Default)]
struct Query(BTreeMap<String, String>);

impl Query {
    fn parse(raw: &str) -> Self {
        let mut m = BTreeMap::new();
        for pair in raw.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            m.insert(percent_decode(k, true), percent_decode(v, true));
        }
        Self(m)
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1" | "True"))
    }

    fn dry_run(&self) -> bool {
        self.get("dryRun").is_some_and(|v| v == "All")
    }
}

#[derive(Debug, Clone)]
enum LabelReq {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

#[derive(Debug, Clone)]
struct FieldReq {
    path: String,
    eq: bool,
    value: String,
}

/// Which objects a list or watch returns.
#[derive(Debug, Clone, Default)]
struct Filter {
    /// `None` = every namespace (cluster-wide list of a namespaced kind).
    ns: Option<String>,
    labels: Vec<LabelReq>,
    fields: Vec<FieldReq>,
}

/// Split at commas outside parentheses (`a in (x,y),b=c`).
fn split_terms(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c);
            }
            ')' => {
                depth -= 1;
                cur.push(c);
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .collect()
}

fn parse_label_selector(s: &str) -> ApiResult<Vec<LabelReq>> {
    let bad = |t: &str| ApiError::bad_request(format!("unable to parse requirement: {t:?}"));
    let mut reqs = Vec::new();
    for t in split_terms(s) {
        let set_op = [" notin ", " in "]
            .iter()
            .find_map(|op| t.find(op).map(|i| (*op, i)));
        let req = if let Some(k) = t.strip_prefix('!') {
            LabelReq::NotExists(k.trim().to_string())
        } else if let Some((op, i)) = set_op {
            let key = t[..i].trim().to_string();
            let rest = t[i + op.len()..].trim();
            let inner = rest
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| bad(&t))?;
            let values = inner.split(',').map(|v| v.trim().to_string()).collect();
            if op == " in " {
                LabelReq::In(key, values)
            } else {
                LabelReq::NotIn(key, values)
            }
        } else if let Some((k, v)) = t.split_once("!=") {
            LabelReq::Ne(k.trim().to_string(), v.trim().to_string())
        } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
            LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
        } else {
            LabelReq::Exists(t.clone())
        };
        let key = match &req {
            LabelReq::Eq(k, _)
            | LabelReq::Ne(k, _)
            | LabelReq::Exists(k)
            | LabelReq::NotExists(k)
            | LabelReq::In(k, _)
            | LabelReq::NotIn(k, _) => k,
        };
        if key.is_empty() || key.contains(char::is_whitespace) {
            return Err(bad(&t));
        }
        reqs.push(req);
    }
    Ok(reqs)
}

fn parse_field_selector(s: &str) -> ApiResult<Vec<FieldReq>> {
    let mut reqs = Vec::new();
    for t in split_terms(s) {
        let (path, eq, value) = if let Some((k, v)) = t.split_once("!=") {
            (k, false, v)
        } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
            (k, true, v)
        } else {
            return Err(ApiError::bad_request(format!(
                "invalid selector: '{t}'; can't understand '{t}'"
            )));
        };
        reqs.push(FieldReq {
            path: path.trim().to_string(),
            eq,
            value: value.trim().to_string(),
        });
    }
    Ok(reqs)
}

/// The value at a dotted path (`metadata.name`, `spec.holderIdentity`) as a string ("" if absent).
fn field_string(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for part in path.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

impl Filter {
    fn from_query(ns: Option<&str>, q: &Query) -> ApiResult<Self> {
        Ok(Self {
            ns: ns.map(str::to_string),
            labels: match q.get("labelSelector") {
                Some(s) => parse_label_selector(s)?,
                None => Vec::new(),
            },
            fields: match q.get("fieldSelector") {
                Some(s) => parse_field_selector(s)?,
                None => Vec::new(),
            },
        })
    }

    fn matches(&self, ns: &str, obj: &Value) -> bool {
        if self.ns.as_deref().is_some_and(|want| want != ns) {
            return false;
        }
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        let labels_ok = self.labels.iter().all(|r| match r {
            LabelReq::Eq(k, v) => label(k) == Some(v.as_str()),
            LabelReq::Ne(k, v) => label(k) != Some(v.as_str()),
            LabelReq::Exists(k) => label(k).is_some(),
            LabelReq::NotExists(k) => label(k).is_none(),
            LabelReq::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::NotIn(k, vs) => !label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
        });
        labels_ok
            && self
                .fields
                .iter()
                .all(|f| (field_string(obj, &f.path) == f.value) == f.eq)
    }
}

// ---------------------------------------------------------------------------------------------
// Small helpers: time, ids, base64, JSON
// ---------------------------------------------------------------------------------------------

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m as u32, d as u32)
}

/// RFC 3339 UTC timestamp with second precision, like `metav1.Time`.
fn rfc3339(secs: u64) -> String {
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn base64(input: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn meta_str(obj: &Value, field: &str) -> Option<String> {
    obj.get("metadata")?
        .get(field)?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

fn parse_body(body: &[u8]) -> ApiResult<Value> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body of the request could not be decoded as JSON: {e}"
        ))
    })
}

fn into_object(v: Value) -> ApiResult<Map<String, Value>> {
    match v {
        Value::Object(m) => Ok(m),
        other => Err(ApiError::bad_request(format!(
            "the object must be a JSON object, got {}",
            match other {
                Value::Array(_) => "an array",
                Value::String(_) => "a string",
                Value::Null => "null",
                _ => "a scalar",
            }
        ))),
    }
}

/// `apiVersion` and `kind` in a body, when present, must name the endpoint's kind.
fn check_type_meta(kind: &Kind, obj: &Map<String, Value>) -> ApiResult<()> {
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && !av.is_empty()
        && av != kind.api_version()
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({})",
            kind.api_version()
        )));
    }
    if let Some(k) = obj.get("kind").and_then(Value::as_str)
        && !k.is_empty()
        && k != kind.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            kind.kind
        )));
    }
    Ok(())
}

/// RFC 1123 subdomain check, as the API server applies to `metadata.name`.
fn name_error(name: &str) -> Option<&'static str> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if name.len() > 253 {
        Some("must be no more than 253 characters")
    } else if !name.chars().all(ok_char)
        || !alnum(name.chars().next())
        || !alnum(name.chars().last())
    {
        Some(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
        )
    } else {
        None
    }
}

/// Everything except metadata, status and type meta: a change here bumps `metadata.generation`.
fn content_of(obj: &Map<String, Value>) -> Map<String, Value> {
    obj.iter()
        .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "status" | "apiVersion" | "kind"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Kind-specific defaulting: Secrets fold `stringData` into base64 `data` and default `type`.
fn normalize(kind: &Kind, obj: &mut Map<String, Value>) {
    if kind.plural == "secrets" {
        if let Some(Value::Object(sd)) = obj.remove("stringData") {
            let data = obj
                .entry("data")
                .or_insert_with(|| Value::Object(Map::new()));
            if !data.is_object() {
                *data = Value::Object(Map::new());
            }
            if let Some(d) = data.as_object_mut() {
                for (k, v) in sd {
                    let s = v.as_str().map(str::to_string).unwrap_or(v.to_string());
                    d.insert(k, Value::String(base64(s.as_bytes())));
                }
            }
        }
        obj.entry("type")
            .or_insert_with(|| Value::String("Opaque".into()));
    }
}

// ---------------------------------------------------------------------------------------------
// Patches
// ---------------------------------------------------------------------------------------------

/// RFC 7386 JSON merge patch. With `strategic`, `$`-directives of strategic merge are dropped.
fn merge_patch(target: &mut Value, patch: &Value, strategic: bool) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Some(t) = target.as_object_mut() else {
        return;
    };
    for (k, v) in p {
        if strategic && k.starts_with('$') {
            continue;
        }
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v, strategic);
        }
    }
}

fn pointer_tokens(ptr: &str) -> Result<Vec<String>, String> {
    if ptr.is_empty() {
        return Ok(Vec::new());
    }
    let rest = ptr
        .strip_prefix('/')
        .ok_or_else(|| format!("invalid JSON pointer {ptr:?}"))?;
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn pointer_get<'a>(doc: &'a Value, toks: &[String]) -> Option<&'a Value> {
    toks.iter().try_fold(doc, |cur, t| match cur {
        Value::Object(m) => m.get(t),
        Value::Array(a) => t.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

fn pointer_parent<'a>(doc: &'a mut Value, toks: &[String]) -> Result<&'a mut Value, String> {
    let mut cur = doc;
    for t in &toks[..toks.len().saturating_sub(1)] {
        cur = match cur {
            Value::Object(m) => m.get_mut(t),
            Value::Array(a) => t.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
            _ => None,
        }
        .ok_or_else(|| format!("path component {t:?} does not exist"))?;
    }
    Ok(cur)
}

fn json_add(doc: &mut Value, toks: &[String], value: Value) -> Result<(), String> {
    let Some(last) = toks.last() else {
        *doc = value;
        return Ok(());
    };
    match pointer_parent(doc, toks)? {
        Value::Object(m) => {
            m.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(a) => {
            let i = if last == "-" {
                a.len()
            } else {
                last.parse::<usize>()
                    .map_err(|_| format!("invalid array index {last:?}"))?
            };
            if i > a.len() {
                return Err(format!("array index {i} out of bounds"));
            }
            a.insert(i, value);
            Ok(())
        }
        _ => Err(format!("cannot add {last:?} to a scalar")),
    }
}

fn json_remove(doc: &mut Value, toks: &[String]) -> Result<Value, String> {
    let Some(last) = toks.last() else {
        return Err("cannot remove the whole document".into());
    };
    match pointer_parent(doc, toks)? {
        Value::Object(m) => m
            .remove(last)
            .ok_or_else(|| format!("key {last:?} does not exist")),
        Value::Array(a) => {
            let i = last
                .parse::<usize>()
                .map_err(|_| format!("invalid array index {last:?}"))?;
            if i >= a.len() {
                return Err(format!("array index {i} out of bounds"));
            }
            Ok(a.remove(i))
        }
        _ => Err(format!("cannot remove {last:?} from a scalar")),
    }
}

/// RFC 6902 JSON patch (add, remove, replace, move, copy, test). `Err((code, message))`.
fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), (u16, String)> {
    let ops = ops.as_array().ok_or((
        400,
        "a JSON patch must be an array of operations".to_string(),
    ))?;
    let invalid = |m: String| (422u16, m);
    for op in ops {
        let name = op.get("op").and_then(Value::as_str).unwrap_or("");
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or((400, format!("operation {op} has no path")))?;
        let toks = pointer_tokens(path).map_err(|e| (400, e))?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or((400, format!("operation {op} has no value")))
        };
        let from = || -> Result<Vec<String>, (u16, String)> {
            let f = op
                .get("from")
                .and_then(Value::as_str)
                .ok_or((400, format!("operation {op} has no from")))?;
            pointer_tokens(f).map_err(|e| (400, e))
        };
        match name {
            "add" => json_add(doc, &toks, value()?).map_err(invalid)?,
            "remove" => {
                json_remove(doc, &toks).map_err(invalid)?;
            }
            "replace" => {
                if pointer_get(doc, &toks).is_none() {
                    return Err(invalid(format!("replace: path {path:?} does not exist")));
                }
                let v = value()?;
                if toks.is_empty() {
                    *doc = v;
                } else {
                    json_remove(doc, &toks).map_err(invalid)?;
                    json_add(doc, &toks, v).map_err(invalid)?;
                }
            }
            "move" => {
                let v = json_remove(doc, &from()?).map_err(invalid)?;
                json_add(doc, &toks, v).map_err(invalid)?;
            }
            "copy" => {
                let v = pointer_get(doc, &from()?)
                    .cloned()
                    .ok_or_else(|| invalid("copy: from path does not exist".into()))?;
                json_add(doc, &toks, v).map_err(invalid)?;
            }
            "test" => {
                if pointer_get(doc, &toks) != Some(&value()?) {
                    return Err(invalid(format!("test failed for path {path:?}")));
                }
            }
            other => return Err((400, format!("unknown JSON patch operation {other:?}"))),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------------------------

/// One recorded change, kept for watch replay and broadcast to live watches.
#[derive(Debug)]
struct Event {
    rv: u64,
    kind: &'static Kind,
    ns: String,
    /// ADDED, MODIFIED or DELETED.
    etype: &'static str,
    object: Value,
    /// The object before a MODIFIED (decides ADDED/DELETED transitions for selector watches).
    old: Option<Value>,
}

#[derive(Debug, Clone)]
enum Signal {
    Event(Arc<Event>),
    /// End every open watch stream.
    CloseAll,
}

/// A fault-injection rule (`POST /_emulator/fail-next`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fault {
    method: Option<String>,
    path_prefix: Option<String>,
    query_contains: Option<String>,
    status: Option<u16>,
    times: Option<u32>,
    delay_ms: Option<u64>,
    reason: Option<String>,
    message: Option<String>,
}

impl Fault {
    fn matches(&self, method: &Method, path: &str, query: &str) -> bool {
        self.method
            .as_deref()
            .is_none_or(|m| m.eq_ignore_ascii_case(method.as_str()))
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|p| path.starts_with(p))
            && self
                .query_contains
                .as_deref()
                .is_none_or(|q| query.contains(q))
    }

    /// The failure to answer with; `None` = only delay, then serve normally.
    fn error(&self) -> Option<ApiError> {
        let code = match (self.status, self.delay_ms) {
            (Some(code), _) => code,
            (None, Some(_)) => return None,
            (None, None) => 500,
        };
        let reason = self.reason.clone().unwrap_or(reason_for(code).to_string());
        let message = self
            .message
            .clone()
            .unwrap_or(format!("injected failure ({code} {reason})"));
        let mut e = ApiError::new(code, &reason, message);
        if code == 429 {
            e.details = Some(json!({"retryAfterSeconds": 1}));
        }
        Some(e)
    }
}

type Key = (&'static str, String, String);

struct Store {
    rv: u64,
    /// Every event with rv > floor is retained in `history`.
    floor: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Arc<Event>>,
    history_cap: usize,
    tx: broadcast::Sender<Signal>,
    faults: Vec<Fault>,
    requests: VecDeque<Value>,
    rng: u64,
}

impl Store {
    fn new(history_cap: usize) -> Self {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9E37_79B9_7F4A_7C15)
            ^ u64::from(std::process::id()).rotate_left(32);
        Self {
            rv: INITIAL_RV,
            floor: 0,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            history_cap: history_cap.max(1),
            tx: broadcast::channel(8192).0,
            faults: Vec::new(),
            requests: VecDeque::new(),
            rng: seed | 1,
        }
    }

    fn rand(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn uid(&mut self) -> String {
        let a = self.rand();
        let b = self.rand();
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            ((b >> 48) & 0x3fff) | 0x8000,
            b & 0xffff_ffff_ffff
        )
    }

    fn name_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..5)
            .map(|_| ALPHABET[(self.rand() % ALPHABET.len() as u64) as usize] as char)
            .collect()
    }

    fn record(
        &mut self,
        kind: &'static Kind,
        ns: &str,
        etype: &'static str,
        object: Value,
        old: Option<Value>,
    ) {
        let ev = Arc::new(Event {
            rv: self.rv,
            kind,
            ns: ns.to_string(),
            etype,
            object,
            old,
        });
        self.history.push_back(ev.clone());
        while self.history.len() > self.history_cap {
            if let Some(e) = self.history.pop_front() {
                self.floor = e.rv;
            }
        }
        let _ = self.tx.send(Signal::Event(ev));
    }

    /// Forget the history: watches from any resourceVersion before now get 410 Expired.
    fn expire_history(&mut self) {
        self.rv += 1;
        self.floor = self.rv;
        self.history.clear();
    }

    fn create(
        &mut self,
        kind: &'static Kind,
        ns: &str,
        body: Value,
        path_name: Option<&str>,
        dry_run: bool,
    ) -> ApiResult<Value> {
        let mut obj = into_object(body)?;
        check_type_meta(kind, &obj)?;
        let mut meta = match obj.remove("metadata") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m,
            Some(_) => return Err(ApiError::bad_request("metadata must be an object")),
        };
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if let Some(p) = path_name {
            if name.is_empty() {
                name = p.to_string();
            } else if name != p {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({name}) does not match the name on the URL ({p})"
                )));
            }
        }
        if name.is_empty() {
            match meta.get("generateName").and_then(Value::as_str) {
                Some(g) if !g.is_empty() => name = format!("{g}{}", self.name_suffix()),
                _ => {
                    return Err(ApiError::invalid(
                        kind,
                        "",
                        "metadata.name: Required value: name or generateName is required",
                    ));
                }
            }
        }
        if let Some(why) = name_error(&name) {
            return Err(ApiError::invalid(
                kind,
                &name,
                &format!("metadata.name: Invalid value: \"{name}\": {why}"),
            ));
        }
        if kind.namespaced {
            if let Some(body_ns) = meta.get("namespace").and_then(Value::as_str)
                && !body_ns.is_empty()
                && body_ns != ns
            {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            meta.insert("namespace".into(), Value::String(ns.to_string()));
        } else {
            meta.remove("namespace");
        }
        let key: Key = (kind.plural, ns.to_string(), name.clone());
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(kind, &name));
        }
        for f in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            meta.remove(f);
        }
        meta.insert("name".into(), Value::String(name));
        meta.insert("uid".into(), Value::String(self.uid()));
        meta.insert(
            "creationTimestamp".into(),
            Value::String(rfc3339(now_secs())),
        );
        meta.insert("generation".into(), json!(1));
        obj.insert("apiVersion".into(), Value::String(kind.api_version()));
        obj.insert("kind".into(), Value::String(kind.kind.to_string()));
        if kind.status {
            obj.remove("status");
        }
        normalize(kind, &mut obj);
        obj.insert("metadata".into(), Value::Object(meta));
        let mut v = Value::Object(obj);
        if dry_run {
            return Ok(v);
        }
        self.rv += 1;
        v["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        self.objects.insert(key, v.clone());
        self.record(kind, ns, "ADDED", v.clone(), None);
        Ok(v)
    }

    /// Replace the stored object with `candidate` (a PUT body or a patched copy of the stored
    /// object). A non-empty `metadata.resourceVersion` in it is a precondition.
    fn update(
        &mut self,
        kind: &'static Kind,
        ns: &str,
        name: &str,
        candidate: Value,
        status_only: bool,
        dry_run: bool,
    ) -> ApiResult<Value> {
        let key: Key = (kind.plural, ns.to_string(), name.to_string());
        let old = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind, name))?;
        let old_obj = old.as_object().cloned().unwrap_or_default();
        if let Some(rv) = meta_str(&candidate, "resourceVersion")
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::stale(kind, name));
        }
        let cand = into_object(candidate)?;
        let result = if status_only {
            check_type_meta(kind, &cand)?;
            let mut r = old_obj.clone();
            match cand.get("status") {
                Some(s) if !s.is_null() => {
                    r.insert("status".into(), s.clone());
                }
                _ => {
                    r.remove("status");
                }
            }
            r
        } else {
            let mut r = cand;
            check_type_meta(kind, &r)?;
            let mut meta = match r.remove("metadata") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(m)) => m,
                Some(_) => return Err(ApiError::bad_request("metadata must be an object")),
            };
            let old_meta = old_obj
                .get("metadata")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            for f in SERVER_FIELDS {
                match old_meta.get(*f) {
                    Some(v) => meta.insert((*f).to_string(), v.clone()),
                    None => meta.remove(*f),
                };
            }
            r.insert("apiVersion".into(), Value::String(kind.api_version()));
            r.insert("kind".into(), Value::String(kind.kind.to_string()));
            if kind.status {
                match old_obj.get("status") {
                    Some(s) => r.insert("status".into(), s.clone()),
                    None => r.remove("status"),
                };
            }
            normalize(kind, &mut r);
            if content_of(&r) != content_of(&old_obj) {
                let generation = old_meta
                    .get("generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                meta.insert("generation".into(), json!(generation + 1));
            }
            r.insert("metadata".into(), Value::Object(meta));
            r
        };
        let mut result = Value::Object(result);
        if result == old || dry_run {
            // A no-op update keeps the resourceVersion and emits no event.
            return Ok(result);
        }
        self.rv += 1;
        result["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        self.objects.insert(key, result.clone());
        self.record(kind, ns, "MODIFIED", result.clone(), Some(old));
        Ok(result)
    }

    fn delete(
        &mut self,
        kind: &'static Kind,
        ns: &str,
        name: &str,
        preconditions: &Value,
        dry_run: bool,
    ) -> ApiResult<Value> {
        let key: Key = (kind.plural, ns.to_string(), name.to_string());
        let old = self
            .objects
            .get(&key)
            .ok_or_else(|| ApiError::not_found(kind, name))?;
        if let Some(want) = preconditions.get("resourceVersion").and_then(Value::as_str) {
            let have = meta_str(old, "resourceVersion").unwrap_or_default();
            if want != have {
                return Err(ApiError::conflict(
                    kind,
                    name,
                    &format!(
                        "the ResourceVersion in the precondition ({want}) does not match the ResourceVersion in record ({have}). The object might have been modified"
                    ),
                ));
            }
        }
        if let Some(want) = preconditions.get("uid").and_then(Value::as_str) {
            let have = meta_str(old, "uid").unwrap_or_default();
            if want != have {
                return Err(ApiError::conflict(
                    kind,
                    name,
                    &format!(
                        "the UID in the precondition ({want}) does not match the UID in record ({have}). The object might have been deleted and then recreated"
                    ),
                ));
            }
        }
        if dry_run {
            return Ok(old.clone());
        }
        let mut gone = self.objects.remove(&key).unwrap_or_default();
        self.rv += 1;
        gone["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        self.record(kind, ns, "DELETED", gone.clone(), None);
        Ok(gone)
    }

    fn matching(&self, kind: &Kind, filter: &Filter) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((plural, ns, _), obj)| *plural == kind.plural && filter.matches(ns, obj))
            .map(|(_, obj)| obj.clone())
            .collect()
    }

    fn list(&self, kind: &Kind, filter: &Filter) -> Value {
        json!({
            "apiVersion": kind.api_version(),
            "kind": format!("{}List", kind.kind),
            "metadata": {"resourceVersion": self.rv.to_string()},
            "items": self.matching(kind, filter),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Watch
// ---------------------------------------------------------------------------------------------

fn line(etype: &str, object: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": etype, "object": object})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

fn bookmark(kind: &Kind, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({INITIAL_EVENTS_END: "true"});
    }
    line(
        "BOOKMARK",
        &json!({"apiVersion": kind.api_version(), "kind": kind.kind, "metadata": meta}),
    )
}

/// How a recorded event looks to a watch with `filter` (objects entering or leaving the
/// selection become ADDED/DELETED, like the API server's watch cache does).
fn event_line(ev: &Event, kind: &Kind, filter: &Filter) -> Option<Bytes> {
    if ev.kind.plural != kind.plural {
        return None;
    }
    let now = filter.matches(&ev.ns, &ev.object);
    let etype = match ev.etype {
        "MODIFIED" => {
            let before = ev.old.as_ref().is_some_and(|o| filter.matches(&ev.ns, o));
            match (before, now) {
                (true, true) => "MODIFIED",
                (false, true) => "ADDED",
                (true, false) => "DELETED",
                (false, false) => return None,
            }
        }
        other if now => other,
        _ => return None,
    };
    Some(line(etype, &ev.object))
}

struct WatchPlan {
    kind: &'static Kind,
    filter: Filter,
    /// Lines sent before live events (synthetic ADDED, replay, initial-events-end, or 410).
    first: Vec<Bytes>,
    /// `None`: the stream ends after `first` (410 Expired).
    rx: Option<broadcast::Receiver<Signal>>,
    last_rv: u64,
    bookmarks: bool,
    bookmark_interval: Duration,
    timeout: Duration,
}

fn plan_watch(app: &App, kind: &'static Kind, filter: Filter, q: &Query) -> ApiResult<WatchPlan> {
    let timeout = match q.get("timeoutSeconds").and_then(|s| s.parse::<u64>().ok()) {
        Some(0) | None => DEFAULT_WATCH_SECONDS,
        Some(s) => s,
    }
    .min(app.cfg.max_watch_seconds);
    let requested = q.get("resourceVersion").unwrap_or("");
    let st = app.lock();
    let rx = st.tx.subscribe();
    let mut first = Vec::new();
    let current = |first: &mut Vec<Bytes>| {
        for obj in st.matching(kind, &filter) {
            first.push(line("ADDED", &obj));
        }
    };
    let mut rx = Some(rx);
    if q.flag("sendInitialEvents") {
        current(&mut first);
        first.push(bookmark(kind, st.rv, true));
    } else if requested.is_empty() || requested == "0" {
        current(&mut first);
    } else {
        let rv: u64 = requested.parse().map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion: Invalid value: {requested:?}: must be a non-negative integer"
            ))
        })?;
        if rv < st.floor {
            first.push(line(
                "ERROR",
                &ApiError::expired(rv, st.floor).status_json(),
            ));
            rx = None;
        } else {
            for ev in st.history.iter().filter(|e| e.rv > rv) {
                if let Some(l) = event_line(ev, kind, &filter) {
                    first.push(l);
                }
            }
        }
    }
    Ok(WatchPlan {
        kind,
        filter,
        first,
        rx,
        last_rv: st.rv,
        bookmarks: q.flag("allowWatchBookmarks"),
        bookmark_interval: app.cfg.bookmark_interval,
        timeout: Duration::from_secs(timeout),
    })
}

async fn run_watch(plan: WatchPlan, out: mpsc::Sender<Bytes>) {
    for l in plan.first {
        if out.send(l).await.is_err() {
            return;
        }
    }
    let Some(mut rx) = plan.rx else {
        return;
    };
    let mut last = plan.last_rv;
    let deadline = tokio::time::sleep(plan.timeout);
    tokio::pin!(deadline);
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + plan.bookmark_interval,
        plan.bookmark_interval,
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let next = tokio::select! {
            _ = &mut deadline => break,
            _ = out.closed() => break,
            _ = tick.tick(), if plan.bookmarks => Some(bookmark(plan.kind, last, false)),
            msg = rx.recv() => match msg {
                Ok(Signal::Event(ev)) => {
                    if ev.rv <= last {
                        continue;
                    }
                    // Every event (even one this watch filters out) moves the bookmark on.
                    last = ev.rv;
                    event_line(&ev, plan.kind, &plan.filter)
                }
                // Closed on request, or lagged behind: end the stream, the client resumes.
                Ok(Signal::CloseAll) | Err(_) => break,
            },
        };
        if let Some(l) = next
            && out.send(l).await.is_err()
        {
            break;
        }
    }
}

fn watch_response(plan: WatchPlan) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    tokio::spawn(run_watch(plan, tx));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<Bytes, Infallible>(b), rx))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

// ---------------------------------------------------------------------------------------------
// Application and routing
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct Config {
    history: usize,
    bookmark_interval: Duration,
    max_watch_seconds: u64,
    log_requests: bool,
}

struct App {
    store: Mutex<Store>,
    cfg: Config,
}

impl App {
    fn new(cfg: Config) -> Arc<Self> {
        Arc::new(Self {
            store: Mutex::new(Store::new(cfg.history)),
            cfg,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take_fault(&self, method: &Method, path: &str, query: &str) -> Option<Fault> {
        let mut st = self.lock();
        let i = st
            .faults
            .iter()
            .position(|f| f.matches(method, path, query))?;
        let f = st.faults[i].clone();
        match f.times {
            Some(n) if n > 1 => st.faults[i].times = Some(n - 1),
            _ => {
                st.faults.remove(i);
            }
        }
        Some(f)
    }

    fn log(&self, method: &Method, path: &str, query: &str, ctype: &str, status: StatusCode) {
        if self.cfg.log_requests {
            eprintln!("{method} {path}?{query} -> {}", status.as_u16());
        }
        let mut st = self.lock();
        if st.requests.len() >= REQUEST_LOG {
            st.requests.pop_front();
        }
        st.requests.push_back(json!({
            "method": method.as_str(),
            "path": path,
            "query": query,
            "contentType": ctype,
            "status": status.as_u16(),
        }));
    }
}

fn router(app: Arc<App>) -> Router {
    Router::new().fallback(handle).with_state(app)
}

async fn handle(State(app): State<Arc<App>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let method = parts.method;
    let path = parts.uri.path().to_string();
    let raw_query = parts.uri.query().unwrap_or("").to_string();
    let ctype = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => return ApiError::bad_request(format!("reading the body: {e}")).into_response(),
    };
    if path.starts_with("/_emulator") {
        return admin(&app, &method, &path, &body).unwrap_or_else(IntoResponse::into_response);
    }
    let fault = app.take_fault(&method, &path, &raw_query);
    if let Some(ms) = fault.as_ref().and_then(|f| f.delay_ms) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let resp = match fault.and_then(|f| f.error()) {
        Some(e) => e.into_response(),
        None => {
            let q = Query::parse(&raw_query);
            let req = Req {
                method: &method,
                q: &q,
                ctype: &ctype,
                body: &body,
            };
            route(&app, &path, &req).unwrap_or_else(IntoResponse::into_response)
        }
    };
    app.log(&method, &path, &raw_query, &ctype, resp.status());
    resp
}

/// The parts of a request the resource handlers need.
struct Req<'a> {
    method: &'a Method,
    q: &'a Query,
    ctype: &'a str,
    body: &'a [u8],
}

enum Target {
    /// `ns: None` = all namespaces (read-only).
    Collection { ns: Option<String> },
    Item {
        ns: String,
        name: String,
        status: bool,
    },
}

fn route(app: &App, path: &str, req: &Req<'_>) -> ApiResult<Response> {
    let segs: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| percent_decode(s, false))
        .collect();
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    let get_only = |v: Value| {
        if *req.method == Method::GET {
            Ok(json_response(200, &v))
        } else {
            Err(ApiError::method_not_allowed(req.method))
        }
    };
    match s.as_slice() {
        ["healthz" | "readyz" | "livez"] => {
            let mut resp = Response::new(Body::from("ok"));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            Ok(resp)
        }
        ["version"] => get_only(json!({
            "major": "1", "minor": "33", "gitVersion": "v1.33.0-graph-os-kube-emulator",
            "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
            "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24.0", "compiler": "gc",
            "platform": "linux/amd64",
        })),
        ["api"] => get_only(json!({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
        })),
        ["apis"] => get_only(api_groups()),
        ["api", "v1"] => get_only(api_resources("", "v1")),
        ["apis", g, v] if KINDS.iter().any(|k| k.group == *g && k.version == *v) => {
            get_only(api_resources(g, v))
        }
        ["api", "v1", rest @ ..] => resource(app, "", "v1", rest, req),
        ["apis", g, v, rest @ ..] if !g.is_empty() => resource(app, g, v, rest, req),
        _ => Ok(plain_404()),
    }
}

fn api_groups() -> Value {
    let mut groups: Vec<Value> = Vec::new();
    for k in KINDS.iter().filter(|k| !k.group.is_empty()) {
        if groups.iter().any(|g| g["name"] == k.group) {
            continue;
        }
        let gv = json!({"groupVersion": k.api_version(), "version": k.version});
        groups.push(json!({"name": k.group, "versions": [gv.clone()], "preferredVersion": gv}));
    }
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn api_resources(group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for k in KINDS
        .iter()
        .filter(|k| k.group == group && k.version == version)
    {
        resources.push(json!({
            "name": k.plural, "singularName": k.singular, "namespaced": k.namespaced,
            "kind": k.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        }));
        if k.status {
            resources.push(json!({
                "name": format!("{}/status", k.plural), "singularName": "",
                "namespaced": k.namespaced, "kind": k.kind, "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}

fn resource(
    app: &App,
    group: &str,
    version: &str,
    rest: &[&str],
    req: &Req<'_>,
) -> ApiResult<Response> {
    let find = |plural: &str, namespaced: bool| {
        Kind::find(group, version, plural).filter(|k| k.namespaced == namespaced)
    };
    let (kind, target) = match rest {
        ["namespaces", ns, plural] => (
            find(plural, true),
            Target::Collection {
                ns: Some(ns.to_string()),
            },
        ),
        ["namespaces", ns, plural, name] => (
            find(plural, true),
            Target::Item {
                ns: ns.to_string(),
                name: name.to_string(),
                status: false,
            },
        ),
        ["namespaces", ns, plural, name, "status"] => (
            find(plural, true).filter(|k| k.status),
            Target::Item {
                ns: ns.to_string(),
                name: name.to_string(),
                status: true,
            },
        ),
        [plural] => {
            let kind = Kind::find(group, version, plural);
            let ns = kind.filter(|k| !k.namespaced).map(|_| String::new());
            (kind, Target::Collection { ns })
        }
        [plural, name] => (
            find(plural, false),
            Target::Item {
                ns: String::new(),
                name: name.to_string(),
                status: false,
            },
        ),
        [plural, name, "status"] => (
            find(plural, false).filter(|k| k.status),
            Target::Item {
                ns: String::new(),
                name: name.to_string(),
                status: true,
            },
        ),
        _ => (None, Target::Collection { ns: None }),
    };
    let Some(kind) = kind else {
        return Ok(plain_404());
    };
    let m = req.method;
    let dry = req.q.dry_run();
    match target {
        Target::Collection { ns } if *m == Method::GET => {
            let filter = Filter::from_query(ns.as_deref(), req.q)?;
            if req.q.flag("watch") {
                Ok(watch_response(plan_watch(app, kind, filter, req.q)?))
            } else {
                Ok(json_response(200, &app.lock().list(kind, &filter)))
            }
        }
        Target::Collection { ns: Some(ns) } if *m == Method::POST => {
            let body = parse_body(req.body)?;
            let created = app.lock().create(kind, &ns, body, None, dry)?;
            Ok(json_response(201, &created))
        }
        Target::Collection { ns: Some(ns) } if *m == Method::DELETE => {
            let filter = Filter::from_query(Some(&ns), req.q)?;
            let mut st = app.lock();
            let mut items = Vec::new();
            for obj in st.matching(kind, &filter) {
                let name = meta_str(&obj, "name").unwrap_or_default();
                items.push(st.delete(kind, &ns, &name, &Value::Null, dry)?);
            }
            let list = json!({
                "apiVersion": kind.api_version(),
                "kind": format!("{}List", kind.kind),
                "metadata": {"resourceVersion": st.rv.to_string()},
                "items": items,
            });
            Ok(json_response(200, &list))
        }
        Target::Item { ns, name, .. } if *m == Method::GET => {
            let key: Key = (kind.plural, ns, name);
            match app.lock().objects.get(&key) {
                Some(obj) => Ok(json_response(200, obj)),
                None => Err(ApiError::not_found(kind, &key.2)),
            }
        }
        Target::Item { ns, name, status } if *m == Method::PUT => {
            replace(app, kind, &ns, &name, status, req)
        }
        Target::Item { ns, name, status } if *m == Method::PATCH => {
            patch(app, kind, &ns, &name, status, req)
        }
        Target::Item {
            ns,
            name,
            status: false,
        } if *m == Method::DELETE => {
            let opts = if req.body.iter().all(u8::is_ascii_whitespace) {
                Value::Null
            } else {
                parse_body(req.body)?
            };
            let dry = dry
                || opts
                    .get("dryRun")
                    .and_then(Value::as_array)
                    .is_some_and(|a| a.iter().any(|v| v == "All"));
            let pre = opts.get("preconditions").cloned().unwrap_or(Value::Null);
            let gone = app.lock().delete(kind, &ns, &name, &pre, dry)?;
            Ok(json_response(200, &gone))
        }
        _ => Err(ApiError::method_not_allowed(m)),
    }
}

fn replace(
    app: &App,
    kind: &'static Kind,
    ns: &str,
    name: &str,
    status: bool,
    req: &Req<'_>,
) -> ApiResult<Response> {
    let body = parse_body(req.body)?;
    if !body.is_object() {
        return Err(ApiError::bad_request("the object must be a JSON object"));
    }
    if let Some(n) = meta_str(&body, "name")
        && n != name
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        )));
    }
    if kind.namespaced
        && let Some(n) = meta_str(&body, "namespace")
        && n != ns
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let mut st = app.lock();
    if !st
        .objects
        .contains_key(&(kind.plural, ns.to_string(), name.to_string()))
    {
        return Err(ApiError::not_found(kind, name));
    }
    if meta_str(&body, "resourceVersion").is_none() {
        return Err(ApiError::invalid(
            kind,
            name,
            "metadata.resourceVersion: Invalid value: 0: must be specified for an update",
        ));
    }
    let updated = st.update(kind, ns, name, body, status, req.q.dry_run())?;
    Ok(json_response(200, &updated))
}

fn patch(
    app: &App,
    kind: &'static Kind,
    ns: &str,
    name: &str,
    status: bool,
    req: &Req<'_>,
) -> ApiResult<Response> {
    const MEDIA: &str = "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json";
    let p = parse_body(req.body)?;
    let dry = req.q.dry_run();
    let mut st = app.lock();
    let old = st
        .objects
        .get(&(kind.plural, ns.to_string(), name.to_string()))
        .cloned();
    let patched = match req.ctype {
        "application/apply-patch+yaml" => {
            if req.q.get("fieldManager").is_none_or(str::is_empty) {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                ));
            }
            if !p.is_object() {
                return Err(ApiError::bad_request(
                    "an apply patch must be a JSON object",
                ));
            }
            if let Some(n) = meta_str(&p, "name")
                && n != name
            {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
            match old {
                None if status => return Err(ApiError::not_found(kind, name)),
                None => {
                    let created = st.create(kind, ns, p, Some(name), dry)?;
                    return Ok(json_response(201, &created));
                }
                Some(mut obj) => {
                    merge_patch(&mut obj, &p, false);
                    obj
                }
            }
        }
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            let mut obj = old.ok_or_else(|| ApiError::not_found(kind, name))?;
            merge_patch(
                &mut obj,
                &p,
                req.ctype == "application/strategic-merge-patch+json",
            );
            obj
        }
        "application/json-patch+json" => {
            let mut obj = old.ok_or_else(|| ApiError::not_found(kind, name))?;
            json_patch(&mut obj, &p).map_err(|(code, msg)| match code {
                422 => ApiError::invalid(kind, name, &msg),
                _ => ApiError::bad_request(msg),
            })?;
            obj
        }
        other => {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format ({other:?}) - accepted media types include: {MEDIA}"
                ),
            ));
        }
    };
    let updated = st.update(kind, ns, name, patched, status, dry)?;
    Ok(json_response(200, &updated))
}

fn admin(app: &App, method: &Method, path: &str, body: &[u8]) -> ApiResult<Response> {
    let body_json = || -> ApiResult<Value> {
        if body.iter().all(u8::is_ascii_whitespace) {
            Ok(json!({}))
        } else {
            parse_body(body)
        }
    };
    let close_all = |st: &Store| {
        let _ = st.tx.send(Signal::CloseAll);
    };
    let ok = |v: Value| Ok(json_response(200, &v));
    match (method.as_str(), path.trim_end_matches('/')) {
        ("POST", "/_emulator/fail-next") => {
            let v = body_json()?;
            let rules: Vec<Fault> = match v {
                Value::Array(_) => serde_json::from_value(v),
                other => serde_json::from_value(other).map(|f| vec![f]),
            }
            .map_err(|e| ApiError::bad_request(format!("bad fault rule: {e}")))?;
            let mut st = app.lock();
            st.faults.extend(rules);
            ok(json!({"pending": st.faults.len()}))
        }
        ("DELETE", "/_emulator/fail-next") => {
            app.lock().faults.clear();
            ok(json!({"pending": 0}))
        }
        ("GET", "/_emulator/fail-next") => {
            let st = app.lock();
            let rules: Vec<Value> = st.faults.iter().map(|f| json!({
                "method": f.method, "path_prefix": f.path_prefix, "query_contains": f.query_contains,
                "status": f.status, "times": f.times, "delay_ms": f.delay_ms,
            })).collect();
            ok(json!({"pending": rules}))
        }
        ("POST", "/_emulator/expire-history") => {
            let close = body_json()?
                .get("close_watches")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            let mut st = app.lock();
            st.expire_history();
            if close {
                close_all(&st);
            }
            ok(json!({"resourceVersion": st.rv.to_string(), "floor": st.floor.to_string()}))
        }
        ("POST", "/_emulator/close-watches") => {
            close_all(&app.lock());
            ok(json!({"closed": true}))
        }
        ("POST", "/_emulator/reset") => {
            let mut st = app.lock();
            st.objects.clear();
            st.faults.clear();
            st.requests.clear();
            st.expire_history();
            close_all(&st);
            ok(json!({"resourceVersion": st.rv.to_string()}))
        }
        ("GET", "/_emulator/objects") => {
            let st = app.lock();
            let objects: Vec<Value> = st.objects.values().cloned().collect();
            ok(json!({
                "resourceVersion": st.rv.to_string(),
                "historyFloor": st.floor.to_string(),
                "historyLen": st.history.len(),
                "objects": objects,
            }))
        }
        ("GET", "/_emulator/requests") => {
            let st = app.lock();
            let log: Vec<Value> = st.requests.iter().cloned().collect();
            ok(json!({"requests": log}))
        }
        ("DELETE", "/_emulator/requests") => {
            app.lock().requests.clear();
            ok(json!({"requests": []}))
        }
        _ => Ok(plain_404()),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let app = App::new(Config {
        history: args.history,
        bookmark_interval: Duration::from_millis(args.bookmark_interval_ms.max(10)),
        max_watch_seconds: args.max_watch_seconds.max(1),
        log_requests: args.log_requests,
    });
    let listener =
        tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], args.port))).await?;
    let addr = listener.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on {addr}")?;
        out.flush()?;
    }
    if args.exit_on_stdin_eof {
        std::thread::spawn(|| {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            std::process::exit(0);
        });
    }
    axum::serve(listener, router(app)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio::net::TcpStream;

    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
    const FLEETS: &str = "/apis/graphos.dev/v1alpha1/namespaces/default/mcpfleets";
    const MERGE: &str = "application/merge-patch+json";

    async fn start_with(history: usize) -> SocketAddr {
        let app = App::new(Config {
            history,
            bookmark_interval: Duration::from_millis(200),
            max_watch_seconds: 60,
            log_requests: false,
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router(app)).await.unwrap() });
        addr
    }

    async fn start() -> SocketAddr {
        start_with(1000).await
    }

    /// One HTTP/1.0 request (the server closes the connection after the response).
    async fn call(
        addr: SocketAddr,
        method: &str,
        path: &str,
        ctype: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let body = body
            .map(|b| serde_json::to_vec(&b).unwrap())
            .unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(&body).await.unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.unwrap();
        let text = String::from_utf8_lossy(&buf).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        let v = serde_json::from_str(body).unwrap_or(Value::String(body.to_string()));
        (code, v)
    }

    async fn send(addr: SocketAddr, method: &str, path: &str, body: Value) -> (u16, Value) {
        call(addr, method, path, "application/json", Some(body)).await
    }

    async fn get(addr: SocketAddr, path: &str) -> (u16, Value) {
        call(addr, "GET", path, "application/json", None).await
    }

    /// Open a watch; events arrive on the returned channel until the stream ends.
    async fn watch(addr: SocketAddr, path: &str) -> mpsc::UnboundedReceiver<Value> {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let head = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        s.write_all(head.as_bytes()).await.unwrap();
        let mut r = BufReader::new(s);
        let mut l = String::new();
        r.read_line(&mut l).await.unwrap();
        assert!(l.contains(" 200 "), "watch answered {l}");
        loop {
            l.clear();
            r.read_line(&mut l).await.unwrap();
            if l.trim().is_empty() {
                break;
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = r.lines();
            while let Ok(Some(l)) = lines.next_line().await {
                if tx.send(serde_json::from_str::<Value>(&l).unwrap()).is_err() {
                    break;
                }
            }
        });
        rx
    }

    /// Next non-BOOKMARK event (None when the stream ended).
    async fn next_event(rx: &mut mpsc::UnboundedReceiver<Value>) -> Option<Value> {
        loop {
            let ev = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .expect("watch event timed out")?;
            if ev["type"] != "BOOKMARK" {
                return Some(ev);
            }
        }
    }

    fn lease(name: &str, holder: &str) -> Value {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": name, "labels": {"app": "graph-os"}},
               "spec": {"holderIdentity": holder}})
    }

    fn rv(v: &Value) -> String {
        v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string()
    }

    #[tokio::test]
    async fn crud_and_optimistic_concurrency() {
        let a = start().await;
        let (code, created) = send(a, "POST", &format!("{LEASES}?"), lease("l1", "x")).await;
        assert_eq!(code, 201, "{created}");
        assert_eq!(created["metadata"]["namespace"], "default");
        assert_eq!(created["metadata"]["generation"], 1);
        assert!(created["metadata"]["uid"].as_str().unwrap().len() == 36);
        assert!(
            created["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap()
                .ends_with('Z')
        );
        let rv1 = rv(&created);

        let (code, got) = get(a, &format!("{LEASES}/l1")).await;
        assert_eq!((code, rv(&got)), (200, rv1.clone()));

        let (code, st) = send(a, "POST", LEASES, lease("l1", "x")).await;
        assert_eq!((code, st["reason"].as_str()), (409, Some("AlreadyExists")));

        let (code, st) = get(a, &format!("{LEASES}/nope")).await;
        assert_eq!((code, st["reason"].as_str()), (404, Some("NotFound")));
        assert_eq!(st["kind"], "Status");
        assert_eq!(st["details"]["name"], "nope");

        let (code, st) = send(a, "POST", LEASES, json!({"metadata": {}})).await;
        assert_eq!((code, st["reason"].as_str()), (422, Some("Invalid")));

        let mut upd = got.clone();
        upd["spec"]["holderIdentity"] = json!("y");
        let (code, st) = send(a, "PUT", &format!("{LEASES}/l1"), {
            let mut u = upd.clone();
            u["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("resourceVersion");
            u
        })
        .await;
        assert_eq!((code, st["reason"].as_str()), (422, Some("Invalid")));
        assert!(st["message"].as_str().unwrap().contains(
            "leases.coordination.k8s.io \"l1\" is invalid: metadata.resourceVersion: Invalid value: 0: must be specified for an update"
        ));

        let (code, st) = send(a, "PUT", &format!("{LEASES}/l1"), {
            let mut u = upd.clone();
            u["metadata"]["resourceVersion"] = json!("1");
            u
        })
        .await;
        assert_eq!((code, st["reason"].as_str()), (409, Some("Conflict")));
        assert_eq!(st["code"], 409);

        let (code, replaced) = send(a, "PUT", &format!("{LEASES}/l1"), upd).await;
        assert_eq!(code, 200, "{replaced}");
        assert!(rv(&replaced).parse::<u64>().unwrap() > rv1.parse::<u64>().unwrap());
        assert_eq!(replaced["metadata"]["generation"], 2);

        // Identical update: same rv, no event.
        let (code, same) = send(a, "PUT", &format!("{LEASES}/l1"), replaced.clone()).await;
        assert_eq!((code, rv(&same)), (200, rv(&replaced)));

        // Merge patch with a stale rv precondition, then a good one.
        let (code, st) = call(
            a,
            "PATCH",
            &format!("{LEASES}/l1?"),
            MERGE,
            Some(json!({"metadata": {"resourceVersion": rv1}, "spec": {"holderIdentity": "z"}})),
        )
        .await;
        assert_eq!((code, st["reason"].as_str()), (409, Some("Conflict")));
        let (code, p) = call(
            a,
            "PATCH",
            &format!("{LEASES}/l1?"),
            MERGE,
            Some(
                json!({"metadata": {"resourceVersion": rv(&replaced), "annotations": {"g": "7"}},
                        "spec": {"holderIdentity": null, "leaseDurationSeconds": 5}}),
            ),
        )
        .await;
        assert_eq!(code, 200, "{p}");
        assert_eq!(p["metadata"]["annotations"]["g"], "7");
        assert_eq!(p["spec"], json!({"leaseDurationSeconds": 5}));

        // JSON patch with test + replace.
        let (code, p2) = call(
            a,
            "PATCH",
            &format!("{LEASES}/l1"),
            "application/json-patch+json",
            Some(json!([
                {"op": "test", "path": "/spec/leaseDurationSeconds", "value": 5},
                {"op": "replace", "path": "/spec/leaseDurationSeconds", "value": 6},
                {"op": "add", "path": "/metadata/annotations/a~1b", "value": "x"}
            ])),
        )
        .await;
        assert_eq!(code, 200, "{p2}");
        assert_eq!(p2["spec"]["leaseDurationSeconds"], 6);
        assert_eq!(p2["metadata"]["annotations"]["a/b"], "x");
        let (code, st) = call(
            a,
            "PATCH",
            &format!("{LEASES}/l1"),
            "application/json-patch+json",
            Some(json!([{"op": "test", "path": "/spec/leaseDurationSeconds", "value": 5}])),
        )
        .await;
        assert_eq!((code, st["reason"].as_str()), (422, Some("Invalid")));

        // PATCH of a missing object; unknown resource is a plain-text 404.
        let (code, st) = call(
            a,
            "PATCH",
            &format!("{LEASES}/nope"),
            MERGE,
            Some(json!({})),
        )
        .await;
        assert_eq!((code, st["reason"].as_str()), (404, Some("NotFound")));
        let (code, st) = get(a, "/apis/nope.dev/v1/namespaces/default/things").await;
        assert_eq!(code, 404);
        assert!(st.is_string());

        // Server-side apply: create if absent, then merge.
        let apply = "application/apply-patch+yaml";
        let (code, st) = call(
            a,
            "PATCH",
            &format!("{LEASES}/l2"),
            apply,
            Some(lease("l2", "a")),
        )
        .await;
        assert_eq!((code, st["reason"].as_str()), (422, Some("Invalid")));
        let path = format!("{LEASES}/l2?&fieldManager=t&force=true");
        let (code, c) = call(a, "PATCH", &path, apply, Some(lease("l2", "a"))).await;
        assert_eq!(code, 201, "{c}");
        let (code, c) = call(a, "PATCH", &path, apply, Some(lease("l2", "b"))).await;
        assert_eq!((code, &c["spec"]["holderIdentity"]), (200, &json!("b")));

        // Delete, then 404.
        let (code, d) = call(
            a,
            "DELETE",
            &format!("{LEASES}/l2?"),
            "application/json",
            Some(json!({})),
        )
        .await;
        assert_eq!((code, d["metadata"]["name"].as_str()), (200, Some("l2")));
        let (code, _) = call(
            a,
            "DELETE",
            &format!("{LEASES}/l2"),
            "application/json",
            None,
        )
        .await;
        assert_eq!(code, 404);
    }

    #[tokio::test]
    async fn list_watch_replay_selectors_and_410() {
        let a = start().await;
        send(a, "POST", LEASES, lease("a", "1")).await;
        send(a, "POST", LEASES, lease("b", "1")).await;
        let mut other = lease("c", "1");
        other["metadata"]["labels"] = json!({"app": "other"});
        send(a, "POST", LEASES, other).await;

        let (code, list) = get(a, &format!("{LEASES}?&limit=500")).await;
        assert_eq!(code, 200);
        assert_eq!(list["kind"], "LeaseList");
        assert_eq!(list["items"].as_array().unwrap().len(), 3);
        let list_rv = rv(&list);
        let (_, sel) = get(a, &format!("{LEASES}?labelSelector=app%3Dgraph-os")).await;
        assert_eq!(sel["items"].as_array().unwrap().len(), 2);
        let (_, sel) = get(a, &format!("{LEASES}?fieldSelector=metadata.name%3Db")).await;
        assert_eq!(sel["items"][0]["metadata"]["name"], "b");
        let (_, all) = get(a, "/apis/coordination.k8s.io/v1/leases").await;
        assert_eq!(all["items"].as_array().unwrap().len(), 3);

        // Changes after the list are replayed to a watch from the list's rv.
        call(
            a,
            "PATCH",
            &format!("{LEASES}/a"),
            MERGE,
            Some(json!({"spec": {"holderIdentity": "2"}})),
        )
        .await;
        send(a, "POST", LEASES, lease("d", "1")).await;
        let mut w = watch(
            a,
            &format!("{LEASES}?&watch=true&timeoutSeconds=2&allowWatchBookmarks=true&resourceVersion={list_rv}"),
        )
        .await;
        let e = next_event(&mut w).await.unwrap();
        assert_eq!(
            (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
            (Some("MODIFIED"), Some("a"))
        );
        let e = next_event(&mut w).await.unwrap();
        assert_eq!(
            (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
            (Some("ADDED"), Some("d"))
        );
        // Live event, a bookmark, then the stream ends at timeoutSeconds.
        call(
            a,
            "DELETE",
            &format!("{LEASES}/b"),
            "application/json",
            None,
        )
        .await;
        let e = next_event(&mut w).await.unwrap();
        assert_eq!(
            (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
            (Some("DELETED"), Some("b"))
        );
        let mut saw_bookmark = false;
        while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(5), w.recv()).await {
            saw_bookmark |=
                ev["type"] == "BOOKMARK" && ev["object"]["metadata"]["resourceVersion"].is_string();
        }
        assert!(saw_bookmark);

        // fieldSelector watch from rv=0: synthetic ADDED for `a`, then only `a`'s changes.
        let mut w = watch(
            a,
            &format!("{LEASES}?watch=true&fieldSelector=metadata.name%3Da&resourceVersion=0"),
        )
        .await;
        let e = next_event(&mut w).await.unwrap();
        assert_eq!(
            (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
            (Some("ADDED"), Some("a"))
        );
        call(
            a,
            "PATCH",
            &format!("{LEASES}/d"),
            MERGE,
            Some(json!({"spec": {"holderIdentity": "9"}})),
        )
        .await;
        call(
            a,
            "PATCH",
            &format!("{LEASES}/a"),
            MERGE,
            Some(json!({"spec": {"holderIdentity": "9"}})),
        )
        .await;
        let e = next_event(&mut w).await.unwrap();
        assert_eq!(
            (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
            (Some("MODIFIED"), Some("a"))
        );
        assert_eq!(e["object"]["spec"]["holderIdentity"], "9");

        // Streaming list: ADDED for each object, then the initial-events-end bookmark.
        let mut w = watch(a, &format!("{LEASES}?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=0")).await;
        let mut names = Vec::new();
        loop {
            let ev = tokio::time::timeout(Duration::from_secs(5), w.recv())
                .await
                .unwrap()
                .unwrap();
            if ev["type"] == "BOOKMARK" {
                assert_eq!(
                    ev["object"]["metadata"]["annotations"][INITIAL_EVENTS_END],
                    "true"
                );
                break;
            }
            names.push(
                ev["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
        }
        assert_eq!(names, ["a", "c", "d"]);

        // expire-history: the open watch ends and a resume from an old rv gets one ERROR 410.
        let (code, _) = send(a, "POST", "/_emulator/expire-history", json!({})).await;
        assert_eq!(code, 200);
        assert!(
            tokio::time::timeout(Duration::from_secs(5), async {
                while w.recv().await.is_some() {}
            })
            .await
            .is_ok()
        );
        let mut w = watch(
            a,
            &format!("{LEASES}?watch=true&allowWatchBookmarks=true&resourceVersion={list_rv}"),
        )
        .await;
        let e = next_event(&mut w).await.unwrap();
        assert_eq!(e["type"], "ERROR");
        assert_eq!(
            (e["object"]["code"].as_i64(), e["object"]["reason"].as_str()),
            (Some(410), Some("Expired"))
        );
        assert!(next_event(&mut w).await.is_none());
        // A fresh list's rv is watchable again.
        let (_, list) = get(a, LEASES).await;
        let mut w = watch(
            a,
            &format!("{LEASES}?watch=true&resourceVersion={}", rv(&list)),
        )
        .await;
        send(a, "POST", LEASES, lease("e", "1")).await;
        assert_eq!(next_event(&mut w).await.unwrap()["type"], "ADDED");
    }

    #[tokio::test]
    async fn history_cap_gives_410() {
        let a = start_with(2).await;
        let (_, first) = send(a, "POST", LEASES, lease("a", "1")).await;
        for h in ["2", "3", "4"] {
            call(
                a,
                "PATCH",
                &format!("{LEASES}/a"),
                MERGE,
                Some(json!({"spec": {"holderIdentity": h}})),
            )
            .await;
        }
        let mut w = watch(
            a,
            &format!("{LEASES}?watch=true&resourceVersion={}", rv(&first)),
        )
        .await;
        assert_eq!(next_event(&mut w).await.unwrap()["object"]["code"], 410);
    }

    #[tokio::test]
    async fn status_subresource_is_separate() {
        let a = start().await;
        let fleet = json!({"apiVersion": "graphos.dev/v1alpha1", "kind": "McpFleet",
                           "metadata": {"name": "f"}, "spec": {"replicas": 1}, "status": {"ready": true}});
        let (code, c) = send(a, "POST", FLEETS, fleet).await;
        assert_eq!(code, 201);
        assert!(c.get("status").is_none(), "status is dropped on create");

        let (code, p) = call(
            a,
            "PATCH",
            &format!("{FLEETS}/f/status"),
            MERGE,
            Some(json!({"status": {"observedGeneration": 1}, "spec": {"replicas": 9}})),
        )
        .await;
        assert_eq!(code, 200, "{p}");
        assert_eq!(p["status"]["observedGeneration"], 1);
        assert_eq!(
            (
                p["spec"]["replicas"].as_i64(),
                p["metadata"]["generation"].as_i64()
            ),
            (Some(1), Some(1))
        );

        let (code, p) = call(
            a,
            "PATCH",
            &format!("{FLEETS}/f"),
            MERGE,
            Some(json!({"status": {"observedGeneration": 5}, "spec": {"replicas": 2}})),
        )
        .await;
        assert_eq!(code, 200);
        assert_eq!(
            p["status"]["observedGeneration"], 1,
            "main resource ignores status"
        );
        assert_eq!(
            (
                p["spec"]["replicas"].as_i64(),
                p["metadata"]["generation"].as_i64()
            ),
            (Some(2), Some(2))
        );

        // SSA on /status, as a Controller would.
        let (code, p) = call(
            a,
            "PATCH",
            &format!("{FLEETS}/f/status?&fieldManager=op&force=true"),
            "application/apply-patch+yaml",
            Some(
                json!({"apiVersion": "graphos.dev/v1alpha1", "kind": "McpFleet",
                                         "status": {"observedGeneration": 2}}),
            ),
        )
        .await;
        assert_eq!(code, 200, "{p}");
        assert_eq!(
            (
                p["status"]["observedGeneration"].as_i64(),
                p["metadata"]["generation"].as_i64()
            ),
            (Some(2), Some(2))
        );

        // PUT on /status needs an rv and only changes status.
        let mut body = p.clone();
        body["status"] = json!({"observedGeneration": 3});
        body["spec"] = json!({"replicas": 100});
        let (code, p) = send(a, "PUT", &format!("{FLEETS}/f/status"), body).await;
        assert_eq!(code, 200);
        assert_eq!(
            (
                p["status"]["observedGeneration"].as_i64(),
                p["spec"]["replicas"].as_i64()
            ),
            (Some(3), Some(2))
        );

        // Leases have no status subresource; strategic merge is accepted as a merge patch.
        let (code, _) = get(a, &format!("{LEASES}/x/status")).await;
        assert_eq!(code, 404);
        send(a, "POST", LEASES, lease("x", "1")).await;
        let (code, p) = call(
            a,
            "PATCH",
            &format!("{LEASES}/x"),
            "application/strategic-merge-patch+json",
            Some(json!({"spec": {"leaseTransitions": 1}})),
        )
        .await;
        assert_eq!(
            (code, p["spec"]["leaseTransitions"].as_i64()),
            (200, Some(1))
        );

        // Secrets: core-group path, stringData folded into data.
        let (code, s) = send(
            a,
            "POST",
            "/api/v1/namespaces/default/secrets",
            json!({"metadata": {"name": "s"}, "stringData": {"k": "hello"}}),
        )
        .await;
        assert_eq!(code, 201);
        assert_eq!(
            (
                s["data"]["k"].as_str(),
                s["type"].as_str(),
                s["kind"].as_str()
            ),
            (Some("aGVsbG8="), Some("Opaque"), Some("Secret"))
        );
    }

    #[tokio::test]
    async fn fault_hooks() {
        let a = start().await;
        send(a, "POST", LEASES, lease("a", "1")).await;
        let (code, _) = send(
            a,
            "POST",
            "/_emulator/fail-next",
            json!({"method": "GET", "path_prefix": "/apis/coordination.k8s.io", "status": 500}),
        )
        .await;
        assert_eq!(code, 200);
        let (code, st) = get(a, &format!("{LEASES}/a")).await;
        assert_eq!((code, st["reason"].as_str()), (500, Some("InternalError")));
        let (code, _) = get(a, &format!("{LEASES}/a")).await;
        assert_eq!(code, 200, "fails only once");
        let (_, dump) = get(a, "/_emulator/objects").await;
        assert_eq!(dump["objects"].as_array().unwrap().len(), 1);
    }

    /// 6 writers × 50 compare-and-swap rounds on one Lease: every increment lands exactly once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_compare_and_swap() {
        let a = start().await;
        send(a, "POST", LEASES, lease("cas", "0")).await;
        let path = format!("{LEASES}/cas");
        let mut tasks = Vec::new();
        for w in 0..6 {
            let path = path.clone();
            tasks.push(tokio::spawn(async move {
                let mut conflicts = 0;
                for _ in 0..50 {
                    loop {
                        let (_, mut cur) = get(a, &path).await;
                        let n: u64 = cur["metadata"]["annotations"]["n"]
                            .as_str()
                            .unwrap_or("0")
                            .parse()
                            .unwrap();
                        cur["metadata"]["annotations"] = json!({"n": (n + 1).to_string()});
                        cur["spec"]["holderIdentity"] = json!(format!("w{w}"));
                        match send(a, "PUT", &path, cur).await {
                            (200, _) => break,
                            (409, st) => {
                                assert_eq!(st["reason"], "Conflict");
                                conflicts += 1;
                            }
                            other => panic!("{other:?}"),
                        }
                    }
                }
                conflicts
            }));
        }
        let mut conflicts = 0;
        for t in tasks {
            conflicts += t.await.unwrap();
        }
        let (_, cur) = get(a, &path).await;
        assert_eq!(
            cur["metadata"]["annotations"]["n"], "300",
            "conflicts seen: {conflicts}"
        );
    }

    #[test]
    fn helpers() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_767_225_599), "2025-12-31T23:59:59Z");
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        let q =
            Query::parse("&fieldSelector=metadata.name%3Dx&watch=true&&labelSelector=a+in+(b,c)");
        assert_eq!(q.get("fieldSelector"), Some("metadata.name=x"));
        assert!(q.flag("watch"));
        let f = Filter::from_query(None, &q).unwrap();
        let obj = json!({"metadata": {"name": "x", "labels": {"a": "c"}}});
        assert!(f.matches("ns", &obj));
        let sel = parse_label_selector("a!=b,!z,a").unwrap();
        assert!(
            Filter {
                labels: sel,
                ..Default::default()
            }
            .matches("", &obj)
        );
    }
}
