//! Legacy HTTP+SSE client transport (MCP 2024-11-05 style), written here because rmcp ships
//! only a streamable HTTP client.
//!
//! Protocol: `GET` the SSE URL; the first `endpoint` event names the URL to `POST` JSON-RPC
//! messages to (resolved against the SSE URL and required to stay on the same origin); every
//! `message` event carries one JSON-RPC message from the server. When the stream drops, it is
//! reopened with `Last-Event-ID` (bounded attempts with backoff); when that fails the transport
//! ends and the child runtime's supervisor takes over.
//!
//! The stream is decoded by the bounded [`super::sse_decode`] decoder: a line over
//! [`MAX_LINE_BYTES`] or an event over [`MAX_EVENT_BYTES`] drops the connection at once (no
//! reconnect) with `child-frame-too-large`, so a child cannot make the gateway buffer more than
//! that. The connection is prepared by the egress policy (resolved once, pinned); the
//! `endpoint` URL must stay on the same origin and carry no user info.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use http::{HeaderName, HeaderValue};
use rmcp::service::{RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::sse_decode::{DecodeError, Decoder};
use super::{Fault, TransportError};
use crate::config::RemoteSpec;

/// Reconnect attempts after the event stream drops.
const RECONNECT_ATTEMPTS: u32 = 5;
use super::sse_decode::{MAX_EVENT_BYTES, MAX_LINE_BYTES};

/// Errors of the SSE transport.
#[derive(Debug, thiserror::Error)]
pub enum SseError {
    /// The POST endpoint never arrived or the stream ended.
    #[error("SSE transport closed")]
    Closed,
    /// An HTTP request failed.
    #[error("SSE transport HTTP error: {0}")]
    Http(String),
}

/// A client transport to a legacy SSE server.
pub struct SseTransport {
    http: reqwest::Client,
    headers: Arc<HashMap<HeaderName, HeaderValue>>,
    endpoint: watch::Receiver<Option<String>>,
    incoming: mpsc::Receiver<RxJsonRpcMessage<RoleClient>>,
    stop: CancellationToken,
    fault: Fault,
}

impl Drop for SseTransport {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn same_origin(a: &reqwest::Url, b: &reqwest::Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// Opens the SSE stream of a remote child (egress-checked, pinned); why it ends early (a frame
/// over its bound, an egress or TLS refusal) is recorded in `fault`.
pub async fn connect(
    spec: &RemoteSpec,
    lookup: &(dyn Fn(&str) -> Option<String> + Sync),
    fault: &Fault,
) -> Result<SseTransport, TransportError> {
    let prepared = super::http::prepare(spec, lookup).await?;
    let http = prepared.client;
    let headers = Arc::new(prepared.headers);
    let url = prepared.url;
    let (endpoint_tx, endpoint) = watch::channel(None);
    let (tx, incoming) = mpsc::channel(256);
    let stop = CancellationToken::new();
    tokio::spawn(read_loop(
        http.clone(),
        headers.clone(),
        url,
        endpoint_tx,
        tx,
        stop.clone(),
        fault.clone(),
    ));
    Ok(SseTransport {
        http,
        headers,
        endpoint,
        incoming,
        stop,
        fault: fault.clone(),
    })
}

async fn read_loop(
    http: reqwest::Client,
    headers: Arc<HashMap<HeaderName, HeaderValue>>,
    url: reqwest::Url,
    endpoint_tx: watch::Sender<Option<String>>,
    tx: mpsc::Sender<RxJsonRpcMessage<RoleClient>>,
    stop: CancellationToken,
    fault: Fault,
) {
    let mut last_event_id: Option<String> = None;
    let mut failures = 0u32;
    let mut retry = Duration::from_millis(500);
    loop {
        let mut req = http
            .get(url.clone())
            .header(http::header::ACCEPT, "text/event-stream");
        for (k, v) in headers.iter() {
            req = req.header(k, v);
        }
        if let Some(id) = &last_event_id {
            req = req.header("Last-Event-ID", id);
        }
        let response = tokio::select! {
            r = req.send() => r,
            _ = stop.cancelled() => return,
        };
        match response {
            Ok(resp) if resp.status().is_success() => {
                failures = 0;
                let mut body = resp.bytes_stream();
                let mut decoder = Decoder::new(MAX_LINE_BYTES, MAX_EVENT_BYTES);
                let mut events = Vec::new();
                loop {
                    let next = tokio::select! {
                        c = body.next() => c,
                        _ = stop.cancelled() => return,
                    };
                    let chunk = match next {
                        Some(Ok(c)) => c,
                        Some(Err(e)) => {
                            fault.record_error(&e);
                            break;
                        }
                        None => break,
                    };
                    if let Err(e) = decoder.feed(&chunk, &mut events) {
                        let what = match e {
                            DecodeError::LineTooLong(_) => "line",
                            DecodeError::EventTooLarge(_) => "event",
                        };
                        tracing::warn!(url = %url, bound = what, "SSE frame over its bound: dropping the connection");
                        fault.record("child-frame-too-large", e.to_string());
                        return;
                    }
                    if let Some(ms) = decoder.take_retry() {
                        retry = Duration::from_millis(ms.clamp(100, 30_000));
                    }
                    for event in events.drain(..) {
                        if let Some(id) = event.id {
                            last_event_id = Some(id);
                        }
                        let data = event.data;
                        match event.event.as_deref() {
                            Some("endpoint") => match url.join(data.trim()) {
                                Ok(ep)
                                    if same_origin(&ep, &url)
                                        && ep.username().is_empty()
                                        && ep.password().is_none() =>
                                {
                                    let _ = endpoint_tx.send(Some(ep.to_string()));
                                }
                                _ => {
                                    tracing::warn!(url = %url, "SSE endpoint event names another origin (or user info); refusing it");
                                    fault.record(
                                        "egress-denied",
                                        "egress-denied: the SSE endpoint event names another origin than the SSE URL",
                                    );
                                    return;
                                }
                            },
                            None | Some("message") => {
                                match serde_json::from_str::<RxJsonRpcMessage<RoleClient>>(&data) {
                                    Ok(msg) => {
                                        if tx.send(msg).await.is_err() {
                                            return;
                                        }
                                    }
                                    Err(e) => {
                                        tracing::debug!(url = %url, error = %e, "SSE message is not JSON-RPC; skipped")
                                    }
                                }
                            }
                            Some(_) => {}
                        }
                    }
                }
            }
            Ok(resp) => tracing::warn!(url = %url, status = %resp.status(), "SSE stream refused"),
            Err(e) => {
                fault.record_error(&e);
                if fault.is_set() {
                    tracing::warn!(url = %url, error = %e, "SSE stream refused by policy or TLS");
                    return;
                }
                tracing::warn!(url = %url, error = %crate::telemetry::redact::error_chain(&e), "SSE stream failed")
            }
        }
        failures += 1;
        if failures > RECONNECT_ATTEMPTS {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(retry * failures) => {}
            _ = stop.cancelled() => return,
        }
    }
}

impl Transport<RoleClient> for SseTransport {
    type Error = SseError;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), SseError>> + Send + 'static {
        let http = self.http.clone();
        let headers = self.headers.clone();
        let mut endpoint = self.endpoint.clone();
        let stop = self.stop.clone();
        let fault = self.fault.clone();
        async move {
            let url = tokio::select! {
                r = tokio::time::timeout(Duration::from_secs(30), endpoint.wait_for(Option::is_some)) => match r {
                    Ok(Ok(u)) => u.clone().unwrap_or_default(),
                    _ => return Err(SseError::Closed),
                },
                _ = stop.cancelled() => return Err(SseError::Closed),
            };
            let mut req = http.post(url).json(&item);
            for (k, v) in headers.iter() {
                req = req.header(k, v);
            }
            for (k, v) in super::http::trace_headers(&item) {
                req = req.header(k, v);
            }
            let resp = req.send().await.map_err(|e| {
                fault.record_error(&e);
                SseError::Http(e.to_string())
            })?;
            if !resp.status().is_success() {
                return Err(SseError::Http(format!("POST answered {}", resp.status())));
            }
            Ok(())
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        tokio::select! {
            m = self.incoming.recv() => m,
            _ = self.stop.cancelled() => None,
        }
    }

    async fn close(&mut self) -> Result<(), SseError> {
        self.stop.cancel();
        Ok(())
    }
}
