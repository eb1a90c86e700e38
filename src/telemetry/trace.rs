//! OpenTelemetry traces over OTLP/HTTP (protobuf), and W3C trace-context propagation.
//!
//! Tracing is on when a collector is named: `--otlp-endpoint URL` (a base URL; `/v1/traces` is
//! appended unless it is there) or the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_ENDPOINT`; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it
//! off. The SDK reads the other standard variables (`OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_TRACES_SAMPLER`,
//! `OTEL_BSP_*`). Spans go through a batch processor, exported with the gateway's own reqwest
//! client (rustls) on the serving runtime, and are flushed by [`super::Telemetry::shutdown`].
//!
//! Spans: one per front request (`POST /mcp` over HTTP; over stdio the multiplexer's
//! `tools/call <tool>` span is the root), the child call (`call <server>/<tool>`) as its
//! child, the wait for a child slot (`queue_wait`) and child probes (`probe <server>`).
//! Context travels the way MCP defines it (SEP-414): `params._meta.traceparent` /
//! `tracestate` of a request. An incoming `traceparent` header on `/mcp` (or the request's own
//! `_meta.traceparent`) becomes the parent; calls to children carry the child call span's
//! context in `_meta`, and HTTP children also as a `traceparent` header. With tracing off
//! nothing is read, written or changed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `_meta` keys (and HTTP headers) of W3C trace context.
pub const TRACEPARENT: &str = "traceparent";
/// See [`TRACEPARENT`].
pub const TRACESTATE: &str = "tracestate";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported (a collector is configured).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The collector URL of `--otlp-endpoint` (a base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT`).
fn traces_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_string()
    } else {
        format!("{base}/v1/traces")
    }
}

fn env_set(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.trim().is_empty())
}

/// Whether the environment or the flag asks for traces.
fn wanted(endpoint: Option<&str>) -> bool {
    if std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return false;
    }
    if std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.trim().eq_ignore_ascii_case("none")) {
        return false;
    }
    endpoint.is_some_and(|e| !e.trim().is_empty())
        || env_set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        || env_set("OTEL_EXPORTER_OTLP_ENDPOINT")
}

/// The OTLP exporter's HTTP client: the gateway's reqwest (rustls), each export run as a task
/// on the serving runtime (the SDK's batch processor runs on its own thread, without one).
#[derive(Debug)]
struct Exporting {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

/// Largest collector answer read (an OTLP answer is a few bytes; a partial-success message more).
const MAX_COLLECTOR_ANSWER: usize = 1 << 20;

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Exporting {
    async fn send_bytes(
        &self,
        request: http::Request<opentelemetry_http::Bytes>,
    ) -> Result<http::Response<opentelemetry_http::Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.clone();
        let task = self.runtime.spawn(async move {
            let (parts, body) = request.into_parts();
            let mut answer = client
                .request(parts.method, parts.uri.to_string())
                .headers(parts.headers)
                .body(body)
                .send()
                .await?;
            let status = answer.status();
            let headers = answer.headers().clone();
            let mut body = Vec::new();
            while let Some(chunk) = answer.chunk().await? {
                if body.len() + chunk.len() > MAX_COLLECTOR_ANSWER {
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            let mut response = http::Response::new(opentelemetry_http::Bytes::from(body));
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            Ok::<_, reqwest::Error>(response)
        });
        match task.await {
            Ok(r) => r.map_err(|e| Box::new(e) as opentelemetry_http::HttpError),
            Err(e) => Err(Box::new(e)),
        }
    }
}

/// The tracer provider and the `tracing` layer that feeds it, when traces are wanted. Must be
/// called on the serving runtime.
pub(super) fn build(
    endpoint: Option<&str>,
) -> Result<Option<(SdkTracerProvider, opentelemetry_sdk::trace::Tracer)>, String> {
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    if !wanted(endpoint) {
        return Ok(None);
    }
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|_| "traces need the serving runtime (internal error)".to_string())?;
    crate::net::crypto::install_crypto();
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| format!("OTLP client: {e}"))?;
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_http_client(Exporting { client, runtime });
    if let Some(e) = endpoint.filter(|e| !e.trim().is_empty()) {
        exporter = exporter.with_endpoint(traces_url(e.trim()));
    }
    let exporter = exporter
        .build()
        .map_err(|e| format!("OTLP exporter: {e}"))?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    let named = env_set("OTEL_SERVICE_NAME")
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| a.contains("service.name="));
    if !named {
        resource = resource.with_service_name("graph-os");
    }
    let resource = resource
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("graph-os");
    ENABLED.store(true, Ordering::Relaxed);
    Ok(Some((provider, tracer)))
}

/// The remote parent named by `traceparent` / `tracestate` values, if valid.
fn remote(traceparent: &str, tracestate: Option<&str>) -> Option<opentelemetry::Context> {
    let mut carrier = HashMap::new();
    carrier.insert(TRACEPARENT.to_string(), traceparent.to_string());
    if let Some(s) = tracestate {
        carrier.insert(TRACESTATE.to_string(), s.to_string());
    }
    let cx = TraceContextPropagator::new().extract(&carrier);
    cx.span().span_context().is_valid().then_some(cx)
}

/// Makes `span` a child of the caller's trace (`traceparent`, `tracestate`), when tracing is on
/// and the value is valid. Returns whether it did.
pub fn set_remote_parent(
    span: &tracing::Span,
    traceparent: Option<&str>,
    tracestate: Option<&str>,
) -> bool {
    if !enabled() {
        return false;
    }
    match traceparent.and_then(|tp| remote(tp, tracestate)) {
        Some(cx) => span.set_parent(cx).is_ok(),
        None => false,
    }
}

/// Makes `span` a child of the trace a request's `_meta` names (SEP-414).
pub fn set_parent_from_meta(
    span: &tracing::Span,
    meta: Option<&serde_json::Map<String, serde_json::Value>>,
) {
    let Some(meta) = meta else { return };
    let get = |k: &str| meta.get(k).and_then(|v| v.as_str());
    set_remote_parent(span, get(TRACEPARENT), get(TRACESTATE));
}

/// The W3C `traceparent` (and `tracestate`) of `span`, when tracing is on and the span is
/// exported.
pub fn context_of(span: &tracing::Span) -> Option<(String, Option<String>)> {
    if !enabled() {
        return None;
    }
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    let parent = carrier.remove(TRACEPARENT)?;
    Some((parent, carrier.remove(TRACESTATE).filter(|s| !s.is_empty())))
}

/// Writes the current span's context into a request's `_meta` (replacing a caller's), when
/// tracing is on.
pub fn inject_meta(meta: &mut serde_json::Map<String, serde_json::Value>) {
    if let Some((parent, state)) = context_of(&tracing::Span::current()) {
        meta.insert(TRACEPARENT.into(), parent.into());
        match state {
            Some(s) => meta.insert(TRACESTATE.into(), s.into()),
            None => meta.remove(TRACESTATE),
        };
    }
}

/// Marks `span` failed with a stable code (`otel.status_code = ERROR`).
pub fn fail(span: &tracing::Span, code: &str) {
    if enabled() {
        span.set_status(opentelemetry::trace::Status::error(code.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_base_urls() {
        assert_eq!(traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            traces_url("http://c:4318/v1/traces"),
            "http://c:4318/v1/traces"
        );
    }

    #[test]
    fn a_valid_traceparent_is_a_remote_parent() {
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let cx = remote(tp, None).expect("valid");
        assert_eq!(
            cx.span().span_context().trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert!(remote("00-zz-yy-01", None).is_none());
    }
}
