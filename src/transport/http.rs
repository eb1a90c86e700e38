//! Remote child transports over HTTP: MCP streamable HTTP (rmcp's client) and legacy SSE
//! (see [`super::sse`]).
//!
//! Every remote connection is prepared by [`prepare`]: the URL (parsed once, at config load) is
//! checked and its host resolved once by the egress policy ([`crate::net::egress`]), the connection's
//! HTTP client is pinned to the admitted addresses, uses rustls with the entry's TLS profile
//! ([`crate::net::tls`]), never follows redirects and ignores proxies from the environment.

use std::collections::HashMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, RequestId};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};

use super::client_credentials::{AUTH_FAILED, TokenSource};
use super::{Fault, TransportError};
use crate::config::RemoteSpec;
use crate::net::egress::{self, Policy};

/// The gateway's shared egress HTTP client (OAuth/JWKS): the gateway-level egress policy (its
/// resolver and connector guard check every connection), no redirects, no proxy.
pub fn client() -> Result<reqwest::Client, TransportError> {
    egress::client(Policy::gateway(), None, None).map_err(|reason| TransportError::Spawn {
        command: "http client".into(),
        reason,
    })
}

/// A remote child connection ready to be opened: the URL to request, the pinned client and the
/// resolved headers.
pub struct Prepared {
    /// The URL requests go to (the spec's URL, with the TLS profile's server name as host when
    /// it overrides it).
    pub url: url::Url,
    /// The pinned egress client.
    pub client: reqwest::Client,
    /// Resolved headers (sensitive ones marked so).
    pub headers: HashMap<HeaderName, HeaderValue>,
}

/// Checks and resolves the destination once, builds the pinned client with the entry's TLS
/// profile and resolves the headers (secret references resolve here, at the boundary).
pub async fn prepare(
    spec: &RemoteSpec,
    lookup: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<Prepared, TransportError> {
    let headers = resolve_headers(spec, lookup)?;
    let policy = Policy::with(&egress::gateway(), &spec.allowed_private_hosts);
    let mut pinned = policy.resolve(&spec.url).await?;
    let mut url = spec.url.clone();
    let tls = match &spec.tls {
        None => None,
        Some(profile) => {
            let key = profile
                .client_key
                .as_ref()
                .map(|k| k.resolve_material(lookup))
                .transpose()?;
            if let Some(name) = &profile.server_name {
                url.set_host(Some(name)).map_err(|_| TransportError::Tls {
                    profile: profile.name.clone(),
                    reason: "serverName is not a valid host".into(),
                })?;
                pinned.host = name.to_ascii_lowercase();
            }
            Some(crate::net::tls::client_config(
                &profile.trust(),
                key.as_deref(),
            )?)
        }
    };
    tracing::debug!(host = %pinned.host, addrs = ?pinned.addrs, "egress admitted and pinned");
    let client =
        egress::client(policy, Some(&pinned), tls).map_err(|reason| TransportError::Spawn {
            command: "http client".into(),
            reason,
        })?;
    Ok(Prepared {
        url,
        client,
        headers,
    })
}

/// Resolves a remote child's declared headers (secret references resolve here, at the boundary).
pub fn resolve_headers(
    spec: &RemoteSpec,
    lookup: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<HashMap<HeaderName, HeaderValue>, TransportError> {
    let mut out = HashMap::new();
    for (name, value) in &spec.headers {
        let resolved = value.resolve(lookup)?;
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| TransportError::Spawn {
            command: egress::url_host(&spec.url),
            reason: format!("bad header name {name}"),
        })?;
        let mut value = HeaderValue::from_str(&resolved).map_err(|_| TransportError::Spawn {
            command: egress::url_host(&spec.url),
            reason: format!("bad value for header {name}"),
        })?;
        if crate::secrets::is_sensitive_name(name.as_str()) {
            value.set_sensitive(true);
        }
        out.insert(name, value);
    }
    Ok(out)
}

/// Opens a streamable HTTP transport to a remote child. Egress refusals and TLS failures of
/// its requests are recorded in `fault` (so the child fails with that code).
pub async fn streamable(
    spec: &RemoteSpec,
    lookup: &(dyn Fn(&str) -> Option<String> + Sync),
    fault: &Fault,
    run_token_header: bool,
) -> Result<StreamableHttpClientTransport<Recording>, TransportError> {
    let prepared = prepare(spec, lookup).await?;
    // The same frame bound as stdio and legacy SSE children (rmcp enforces both while reading).
    let config = StreamableHttpClientTransportConfig::with_uri(prepared.url.to_string())
        .custom_headers(prepared.headers)
        .max_sse_event_size(super::sse_decode::MAX_EVENT_BYTES)
        .max_json_response_size(super::sse_decode::MAX_EVENT_BYTES);
    let tokens = match &spec.client_credentials {
        None => None,
        Some(grant) => Some(Arc::new(token_source(spec, grant, lookup).await?)),
    };
    Ok(StreamableHttpClientTransport::with_client(
        Recording {
            inner: prepared.client,
            fault: fault.clone(),
            tokens,
            run_token_header,
        },
        config,
    ))
}

/// The child's client credentials grant, with a first token fetched now (so a wrong secret or
/// an unreachable token endpoint fails the child before any request reaches it). The token
/// endpoint goes through the egress policy (with the entry's `allowedPrivateHosts`).
async fn token_source(
    spec: &RemoteSpec,
    grant: &crate::config::ClientCredentials,
    lookup: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<TokenSource, TransportError> {
    // A PEM private key is multi-line key material; a secret goes in a header or form field.
    let secret = if grant.method == crate::config::TokenEndpointAuth::PrivateKeyJwt {
        grant.client_secret.resolve_material(lookup)?
    } else {
        grant.client_secret.resolve(lookup)?
    };
    let policy = Policy::with(&egress::gateway(), &spec.allowed_private_hosts);
    let client = egress::client(policy, None, None).map_err(|reason| TransportError::Spawn {
        command: "token endpoint client".into(),
        reason,
    })?;
    let endpoint = match &grant.token_url {
        Some(u) => super::client_credentials::TokenEndpoint {
            token_url: u.clone(),
            issuer: None,
        },
        None => super::client_credentials::discover_token_url(&client, &spec.url).await?,
    };
    let source = TokenSource::new(grant.clone(), endpoint, secret, client);
    source.token().await?;
    Ok(source)
}

/// The W3C trace-context headers of a message: a `tools/call` whose `_meta` carries
/// `traceparent` (and `tracestate`) gets them as HTTP headers too (graph-os writes them there
/// when traces are exported, see `telemetry::trace`).
pub fn trace_headers(message: &ClientJsonRpcMessage) -> Vec<(HeaderName, HeaderValue)> {
    use crate::telemetry::trace::{TRACEPARENT, TRACESTATE};
    let mut out = Vec::new();
    if let rmcp::model::JsonRpcMessage::Request(r) = message
        && let rmcp::model::ClientRequest::CallToolRequest(call) = &r.request
        && let Some(meta) = call.params.meta.as_ref()
    {
        for key in [TRACEPARENT, TRACESTATE] {
            if let Some(v) = meta.get(key).and_then(|v| v.as_str())
                && let Ok(v) = HeaderValue::from_str(v)
            {
                out.push((HeaderName::from_static(key), v));
            }
        }
    }
    out
}

/// rmcp's reqwest client, recording egress and TLS failures of its requests into a [`Fault`],
/// and authenticating every request with the child's client credentials token when it has one.
#[derive(Clone)]
pub struct Recording {
    inner: reqwest::Client,
    fault: Fault,
    tokens: Option<Arc<TokenSource>>,
    /// Copy a call's run token (`_meta`) into the `Graph-Os-Run-Token` header.
    run_token_header: bool,
}

impl Recording {
    /// `custom_headers` plus the run-token header of `message`, when it carries one.
    fn with_run_token(
        &self,
        message: &ClientJsonRpcMessage,
        mut headers: HashMap<HeaderName, HeaderValue>,
    ) -> HashMap<HeaderName, HeaderValue> {
        if self.run_token_header
            && let rmcp::model::JsonRpcMessage::Request(r) = message
            && let rmcp::model::ClientRequest::CallToolRequest(call) = &r.request
            && let Some(token) = call
                .params
                .meta
                .as_ref()
                .and_then(|m| m.get(crate::auth::run_token::META_KEY))
                .and_then(|t| t.as_str())
            && let Ok(mut value) = HeaderValue::from_str(token)
        {
            value.set_sensitive(true);
            headers.insert(
                HeaderName::from_static(crate::auth::run_token::HEADER),
                value,
            );
        }
        headers.extend(trace_headers(message));
        headers
    }

    /// The bearer token of a request: the client credentials token when configured (a failure
    /// to get one fails the request, never sends it without), else what rmcp passed.
    async fn auth(
        &self,
        given: Option<String>,
    ) -> Result<Option<String>, StreamableHttpError<reqwest::Error>> {
        let Some(tokens) = &self.tokens else {
            return Ok(given);
        };
        match tokens.token().await {
            Ok(token) => Ok(Some(token)),
            Err(e) => {
                self.fault.record(AUTH_FAILED, e.to_string());
                Err(StreamableHttpError::UnexpectedServerResponse(
                    e.to_string().into(),
                ))
            }
        }
    }

    async fn note<T>(
        &self,
        r: Result<T, StreamableHttpError<reqwest::Error>>,
    ) -> Result<T, StreamableHttpError<reqwest::Error>> {
        match &r {
            Err(StreamableHttpError::Client(e)) => self.fault.record_error(e),
            Err(
                StreamableHttpError::AuthRequired(_) | StreamableHttpError::InsufficientScope(_),
            ) => {
                if let Some(tokens) = &self.tokens {
                    // The child refused the token: fail closed, and fetch a new one next time.
                    tokens.invalidate().await;
                    self.fault.record(
                        AUTH_FAILED,
                        "the child refused the client credentials token",
                    );
                }
            }
            _ => {}
        }
        r
    }
}

type Sse = BoxStream<'static, Result<sse_stream::Sse, SseError>>;

/// A POST answer with the 2025 task fields rmcp drops kept as marks (see `task_marks`): each
/// SSE event's data is one JSON-RPC message. (A plain JSON answer arrives already parsed by
/// rmcp; servers that answer task requests in JSON mode lose them.)
///
/// Each child log line on the stream is also marked with the request whose POST stream carried
/// it (`origin`): the exact association of logs to calls (`child::client::Routes`).
fn marked(r: StreamableHttpPostResponse, origin: Option<RequestId>) -> StreamableHttpPostResponse {
    use futures::StreamExt;
    match r {
        StreamableHttpPostResponse::Sse(stream, session) => StreamableHttpPostResponse::Sse(
            stream
                .map(move |event| {
                    event.map(|mut sse| {
                        let mapped = sse.data.as_deref().and_then(|d| {
                            crate::wire::task_marks::mark_child_message(d.as_bytes())
                        });
                        if let Some(m) = mapped.and_then(|m| String::from_utf8(m).ok()) {
                            sse.data = Some(m);
                        }
                        origin_marked(sse, origin.as_ref())
                    })
                })
                .boxed(),
            session,
        ),
        other => other,
    }
}

/// The `_meta` key under which graph-os's streamable-HTTP client records, on a child's
/// `notifications/message`, the id of the request whose response stream carried it. Set (or
/// removed) by graph-os on every such message it receives over streamable HTTP, removed from
/// every message before it is forwarded: a child cannot forge it.
pub const LOG_ORIGIN_KEY: &str = "io.graph-os/origin-request";

/// Rewrites one SSE event's data from a child's streamable-HTTP stream: a
/// `notifications/message` gets [`LOG_ORIGIN_KEY`] set to `origin` (the request whose POST
/// stream carried it) or removed (`None`: the standalone GET stream). `None` when the data is
/// left as it is.
pub fn mark_log_origin(data: &str, origin: Option<&RequestId>) -> Option<String> {
    if !data.contains("notifications/message") && !data.contains(LOG_ORIGIN_KEY) {
        return None;
    }
    let mut msg: serde_json::Value = serde_json::from_str(data).ok()?;
    if msg.get("method").and_then(|m| m.as_str()) != Some("notifications/message") {
        return None;
    }
    let params = msg.get_mut("params")?.as_object_mut()?;
    let meta = params
        .entry("_meta")
        .or_insert_with(|| serde_json::Value::Object(Default::default()))
        .as_object_mut()?;
    meta.remove(LOG_ORIGIN_KEY);
    if let Some(id) = origin {
        meta.insert(LOG_ORIGIN_KEY.into(), serde_json::to_value(id).ok()?);
    } else if meta.is_empty() {
        params.remove("_meta");
    }
    serde_json::to_string(&msg).ok()
}

/// One SSE event with its log line's origin set (a POST stream) or removed (the GET stream).
fn origin_marked(mut sse: sse_stream::Sse, origin: Option<&RequestId>) -> sse_stream::Sse {
    if let Some(m) = sse.data.as_deref().and_then(|d| mark_log_origin(d, origin)) {
        sse.data = Some(m);
    }
    sse
}

/// The standalone GET stream: its log lines belong to no request (any origin a child wrote is
/// removed).
fn unassociated(
    r: Result<Sse, StreamableHttpError<reqwest::Error>>,
) -> Result<Sse, StreamableHttpError<reqwest::Error>> {
    use futures::StreamExt;
    r.map(|stream| {
        stream
            .map(|event| event.map(|sse| origin_marked(sse, None)))
            .boxed()
    })
}

/// The id of the request a POST carries (its response stream is that request's).
fn request_id(message: &ClientJsonRpcMessage) -> Option<RequestId> {
    match message {
        ClientJsonRpcMessage::Request(r) => Some(r.id.clone()),
        _ => None,
    }
}

impl StreamableHttpClient for Recording {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>> {
        let auth_header = self.auth(auth_header).await?;
        let custom_headers = self.with_run_token(&message, custom_headers);
        let origin = request_id(&message);
        let r = self
            .inner
            .post_message(uri, message, session_id, auth_header, custom_headers)
            .await;
        self.note(r).await.map(|r| marked(r, origin))
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>> {
        let auth_header = self.auth(auth_header).await?;
        let custom_headers = self.with_run_token(&message, custom_headers);
        let origin = request_id(&message);
        let r = self
            .inner
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        self.note(r).await.map(|r| marked(r, origin))
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>> {
        let auth_header = self.auth(auth_header).await?;
        let custom_headers = self.with_run_token(&message, custom_headers);
        let origin = request_id(&message);
        let r = self
            .inner
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await;
        self.note(r).await.map(|r| marked(r, origin))
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<reqwest::Error>> {
        let auth_header = self.auth(auth_header).await?;
        let r = self
            .inner
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await;
        self.note(r).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<Sse, StreamableHttpError<reqwest::Error>> {
        let auth_header = self.auth(auth_header).await?;
        let r = self
            .inner
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await;
        unassociated(self.note(r).await)
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<Sse, StreamableHttpError<reqwest::Error>> {
        let auth_header = self.auth(auth_header).await?;
        let r = self
            .inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        unassociated(self.note(r).await)
    }
}
