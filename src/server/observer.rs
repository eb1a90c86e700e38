//! The call observer's protocol half: a [`FrontSink`] over the front session's rmcp peer.
//!
//! The multiplexer decides what reaches the client (and bounds it); this only writes
//! notifications to the peer and sends relayed requests on the originating call's stream.
// Logging notifications are SEP-2577-deprecated but still forwarded for 2025-era clients.
#![allow(deprecated)]

use futures::future::BoxFuture;
use rmcp::model::{ClientResult, RequestId, ServerRequest};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, Peer};

use crate::mux::{FrontNote, FrontSink};

/// Delivers one call's child→client traffic to the front client.
pub struct PeerSink {
    peer: Peer<RoleServer>,
    modern: bool,
    /// The front request this call serves: relayed requests travel on its stream.
    front_id: RequestId,
}

impl PeerSink {
    /// The sink of the request `ctx` is handling.
    pub fn new(ctx: &RequestContext<RoleServer>) -> Self {
        PeerSink {
            peer: ctx.peer.clone(),
            modern: super::era::is_modern(ctx),
            front_id: ctx.id.clone(),
        }
    }

    /// The sink of a 2025-era request `front_id` served beside rmcp (the hot path) on the
    /// session whose peer is `peer`.
    pub fn for_peer(peer: Peer<RoleServer>, front_id: RequestId) -> Self {
        PeerSink {
            peer,
            modern: false,
            front_id,
        }
    }
}

impl FrontSink for PeerSink {
    fn send(&self, note: FrontNote) -> BoxFuture<'static, Result<(), ()>> {
        let peer = self.peer.clone();
        Box::pin(async move {
            match note {
                FrontNote::Progress(p) => peer.notify_progress(p).await,
                FrontNote::Log(l) => peer.notify_logging_message(l).await,
            }
            .map_err(|_| ())
        })
    }

    fn relay(&self, request: ServerRequest) -> BoxFuture<'static, Result<ClientResult, McpError>> {
        let peer = self.peer.clone();
        let modern = self.modern;
        let front_id = self.front_id.clone();
        Box::pin(async move {
            if modern {
                // 2026-07-28 forbids server→client requests outside input-required results.
                return Err(crate::mux::relay_refusal(
                    crate::mux::relay_code::CAPABILITY_MISSING,
                    "the calling client speaks 2026-07-28; server-to-client requests are not relayed",
                ));
            }
            // Tag the request with the front call it belongs to, and send it from a fresh task:
            // rmcp would otherwise tag it with the child-side request being handled, and the
            // streamable HTTP server would deliver it on the wrong stream.
            let mut request = request;
            rmcp::model::GetExtensions::extensions_mut(&mut request)
                .insert(rmcp::service::OriginatingRequestId(front_id));
            let sent = tokio::spawn(async move { peer.send_request(request).await }).await;
            let Ok(sent) = sent else {
                return Err(McpError::internal_error("relay task failed", None));
            };
            match sent {
                Ok(r) => Ok(r),
                Err(rmcp::service::ServiceError::McpError(e)) => Err(e),
                Err(e) => Err(McpError::internal_error(
                    format!("relay to the client failed: {e}"),
                    None,
                )),
            }
        })
    }

    fn closed(&self) -> bool {
        self.peer.is_transport_closed()
    }

    fn takes_input_required(&self) -> bool {
        self.modern
    }
}

/// The request `_meta` to pass to a child: the caller's keys minus the progress token (graph-os
/// routes progress with its own token, see `child::client`) and minus the protocol envelope
/// (`io.modelcontextprotocol/*`), which belongs to the front connection's era.
pub fn relay_meta(
    params_meta: Option<rmcp::model::RequestMetaObject>,
    ctx: &RequestContext<RoleServer>,
) -> Option<rmcp::model::RequestMetaObject> {
    let mut meta = ctx.meta.clone();
    if let Some(extra) = params_meta {
        meta.extend(extra);
    }
    let drop: Vec<String> = meta
        .keys()
        .filter(|k| *k == "progressToken" || k.starts_with("io.modelcontextprotocol/"))
        .cloned()
        .collect();
    for k in drop {
        meta.remove(&k);
    }
    (!meta.is_empty()).then_some(meta)
}
