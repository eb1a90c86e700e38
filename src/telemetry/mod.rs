//! Logging, tracing and the Prometheus metrics registry.
//!
//! Logs always go to stderr: stdout belongs to the stdio MCP transport. They are text or JSON
//! lines ([`logs`]); an access log line per HTTP request is optional ([`access`]); traces are
//! exported over OTLP/HTTP when a collector is configured ([`trace`]). Error messages that can
//! reach a log or a status are built by [`redact`]: the whole `source()` chain, clipped in the
//! middle (the root cause is at the end), with a child's secret values replaced.
//!
//! Metrics are counted where things happen (child runtime) and gauges are refreshed from the
//! served multiplexer at scrape time, so `/metrics` never builds a second view of the fleet.
//! Labels carry server names, tool names, states and stable codes only — never arguments, URLs
//! with credentials or secrets. Per-tool series are capped ([`MAX_TOOL_SERIES`]).

pub mod access;
pub mod logs;
pub mod redact;
pub mod trace;

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub use logs::{LogFormat, Options, Telemetry, init, init_serve};

/// Most distinct `(server, tool)` label pairs the per-tool metrics keep; calls of further tools
/// are counted under `tool="_other"` of their server (one extra series per server).
pub const MAX_TOOL_SERIES: usize = 2_000;

/// The `tool` label of calls beyond [`MAX_TOOL_SERIES`].
pub const OTHER_TOOL: &str = "_other";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabel {
    server: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabel {
    server: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    server: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    server: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabel {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolCallLabel {
    server: String,
    tool: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabel {
    server: String,
    tool: String,
}

type HistogramFamily = Family<ServerLabel, Histogram, fn() -> Histogram>;
type ToolHistogramFamily = Family<ToolLabel, Histogram, fn() -> Histogram>;

/// The process-wide metrics.
pub struct Metrics {
    registry: Registry,
    calls: Family<CallLabel, Counter>,
    latency: HistogramFamily,
    tool_calls: Family<ToolCallLabel, Counter>,
    tool_latency: ToolHistogramFamily,
    /// The `(server, tool)` pairs admitted to the per-tool series (at most [`MAX_TOOL_SERIES`]).
    tool_series: Mutex<HashSet<(String, String)>>,
    restarts: Family<ServerLabel, Counter>,
    transitions: Family<StateLabel, Counter>,
    in_flight: Family<ServerLabel, Gauge>,
    queued: Family<ServerLabel, Gauge>,
    breaker_open: Family<ServerLabel, Gauge>,
    catalog_tools: Family<ServerLabel, Gauge>,
    up: Family<ServerLabel, Gauge>,
    relay_refused: Family<ReasonLabel, Counter>,
    tasks_created: Family<ServerLabel, Counter>,
    logs_dropped: Family<ReasonLabel, Counter>,
    notes_dropped: Family<KindLabel, Counter>,
    hot_calls: Family<KindLabel, Counter>,
    auth_refused: Family<KindLabel, Counter>,
    sessions_refused: Family<KindLabel, Counter>,
    http_refused: Family<RefusalLabel, Counter>,
    session_store_up: Family<KindLabel, Gauge>,
    denied: Family<KindLabel, Counter>,
    out_of_bounds: Family<ServerLabel, Counter>,
    reloads: Family<KindLabel, Counter>,
    config_problems: Gauge,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 18))
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("graphos");
        let m = Metrics {
            calls: Family::default(),
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            tool_calls: Family::default(),
            tool_latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            tool_series: Mutex::new(HashSet::new()),
            restarts: Family::default(),
            transitions: Family::default(),
            in_flight: Family::default(),
            queued: Family::default(),
            breaker_open: Family::default(),
            catalog_tools: Family::default(),
            up: Family::default(),
            relay_refused: Family::default(),
            tasks_created: Family::default(),
            logs_dropped: Family::default(),
            notes_dropped: Family::default(),
            hot_calls: Family::default(),
            auth_refused: Family::default(),
            sessions_refused: Family::default(),
            http_refused: Family::default(),
            session_store_up: Family::default(),
            denied: Family::default(),
            out_of_bounds: Family::default(),
            reloads: Family::default(),
            config_problems: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "child_calls",
            "Tool calls forwarded to a child, by outcome code",
            m.calls.clone(),
        );
        registry.register(
            "child_call_seconds",
            "Latency of tool calls forwarded to a child",
            m.latency.clone(),
        );
        registry.register(
            "tool_calls",
            "Tool calls forwarded to a child, by server, child tool name and outcome code \
             (at most 2000 server/tool pairs; further tools are counted as tool=\"_other\")",
            m.tool_calls.clone(),
        );
        registry.register(
            "tool_call_duration_seconds",
            "Latency of tool calls forwarded to a child, by server and child tool name (same cap)",
            m.tool_latency.clone(),
        );
        registry.register("child_restarts", "Child restarts", m.restarts.clone());
        registry.register(
            "child_state_transitions",
            "Child state transitions, by new state",
            m.transitions.clone(),
        );
        registry.register(
            "child_in_flight",
            "Calls holding a child slot",
            m.in_flight.clone(),
        );
        registry.register(
            "child_queued",
            "Calls waiting for a child slot",
            m.queued.clone(),
        );
        registry.register(
            "child_breaker_state",
            "Breaker state: 0 closed, 1 half-open, 2 open",
            m.breaker_open.clone(),
        );
        registry.register(
            "child_catalog_tools",
            "Tools a child exposes",
            m.catalog_tools.clone(),
        );
        registry.register("child_up", "1 when the child is up", m.up.clone());
        registry.register(
            "tasks_created",
            "Tasks (2025-11-25) created at a child through graph-os",
            m.tasks_created.clone(),
        );
        registry.register(
            "relay_refused",
            "Child-to-client requests graph-os answered itself or refused, by reason",
            m.relay_refused.clone(),
        );
        registry.register(
            "child_logs_dropped",
            "Child log messages not delivered because no single calling session was known",
            m.logs_dropped.clone(),
        );
        registry.register(
            "front_notes_dropped",
            "Per-call notifications dropped (log) or coalesced (progress) because the client read too slowly",
            m.notes_dropped.clone(),
        );
        registry.register(
            "hot_path_calls",
            "tools/call requests served on the forwarding hot path, by front (kind: stdio, http)",
            m.hot_calls.clone(),
        );
        registry.register(
            "auth_refused",
            "HTTP requests refused for their credential, by reason code",
            m.auth_refused.clone(),
        );
        registry.register(
            "sessions_refused",
            "New sessions or principals refused by a cap",
            m.sessions_refused.clone(),
        );
        registry.register(
            "http_refused",
            "HTTP connections and requests refused by the listener's bounds, by reason code \
             (connections-exhausted, peer-connections-exhausted, request-body-timeout, \
             request-body-too-slow)",
            m.http_refused.clone(),
        );
        registry.register(
            "session_store_up",
            "Whether the session store answers (1) or not (0), by kind (memory, redis)",
            m.session_store_up.clone(),
        );
        registry.register(
            "authorization_denied",
            "Requests refused for the caller's scope, by operation",
            m.denied.clone(),
        );
        registry.register(
            "fleet_reloads",
            "Fleet versions applied, by outcome (applied, partial: some entries refused, rejected: unusable document)",
            m.reloads.clone(),
        );
        registry.register(
            "config_problems",
            "Problems in the fleet version last read (refused entries and fields)",
            m.config_problems.clone(),
        );
        registry.register(
            "arguments_out_of_bounds",
            "Tool calls refused because their arguments exceeded the bounds",
            m.out_of_bounds.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Counts one forwarded call of `tool` (the child's own tool name) per tool, under the
    /// cardinality cap.
    pub fn tool_call(&self, server: &str, tool: &str, code: &str, elapsed: Duration) {
        let tool = self.tool_series_label(server, tool);
        self.tool_calls
            .get_or_create(&ToolCallLabel {
                server: server.into(),
                tool: tool.clone(),
                code: code.into(),
            })
            .inc();
        self.tool_latency
            .get_or_create(&ToolLabel {
                server: server.into(),
                tool,
            })
            .observe(elapsed.as_secs_f64());
    }

    /// `tool` while the pair is (or can become) one of the [`MAX_TOOL_SERIES`] admitted pairs,
    /// else [`OTHER_TOOL`].
    fn tool_series_label(&self, server: &str, tool: &str) -> String {
        let mut admitted = self.tool_series.lock().unwrap_or_else(|p| p.into_inner());
        let key = (server.to_string(), tool.to_string());
        if admitted.contains(&key) {
            return key.1;
        }
        if admitted.len() < MAX_TOOL_SERIES {
            admitted.insert(key.clone());
            return key.1;
        }
        OTHER_TOOL.to_string()
    }

    /// Counts one forwarded call.
    pub fn call(&self, server: &str, code: &str, elapsed: Duration) {
        self.calls
            .get_or_create(&CallLabel {
                server: server.into(),
                code: code.into(),
            })
            .inc();
        self.latency
            .get_or_create(&ServerLabel {
                server: server.into(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Counts one restart.
    pub fn restart(&self, server: &str) {
        self.restarts
            .get_or_create(&ServerLabel {
                server: server.into(),
            })
            .inc();
    }

    /// Counts one state transition.
    pub fn transition(&self, server: &str, state: impl std::fmt::Debug) {
        let state = format!("{state:?}").to_lowercase();
        self.transitions
            .get_or_create(&StateLabel {
                server: server.into(),
                state,
            })
            .inc();
    }

    /// A task created at a child through graph-os.
    pub fn task_created(&self, server: &str) {
        self.tasks_created
            .get_or_create(&ServerLabel {
                server: server.into(),
            })
            .inc();
    }

    /// A child→client request answered by graph-os or refused.
    pub fn relay_refused(&self, server: &str, reason: &str) {
        self.relay_refused
            .get_or_create(&ReasonLabel {
                server: server.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// A child log line dropped.
    pub fn child_log_dropped(&self, server: &str, reason: &str) {
        self.logs_dropped
            .get_or_create(&ReasonLabel {
                server: server.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// A per-call notification dropped or coalesced (`progress_coalesced`, `log_dropped`).
    pub fn note_dropped(&self, kind: &str) {
        self.notes_dropped
            .get_or_create(&KindLabel { kind: kind.into() })
            .inc();
    }

    /// A `tools/call` taken by the forwarding hot path at `front` (stdio, http).
    pub fn hot_call(&self, front: &'static str) {
        self.hot_calls
            .get_or_create(&KindLabel { kind: front.into() })
            .inc();
    }

    /// An HTTP request refused for its credential.
    pub fn auth_refused(&self, reason: &str) {
        self.auth_refused
            .get_or_create(&KindLabel {
                kind: reason.into(),
            })
            .inc();
    }

    /// A session or principal refused by a cap.
    pub fn session_refused(&self, reason: &str) {
        self.sessions_refused
            .get_or_create(&KindLabel {
                kind: reason.into(),
            })
            .inc();
    }

    /// An HTTP connection or request refused by the listener's bounds (`reason`: its code).
    pub fn http_refused(&self, reason: &str) {
        self.http_refused
            .get_or_create(&RefusalLabel {
                reason: reason.into(),
            })
            .inc();
    }

    /// Whether the session store answered its last command.
    pub fn session_store_up(&self, kind: &str, up: bool) {
        self.session_store_up
            .get_or_create(&KindLabel { kind: kind.into() })
            .set(up as i64);
    }

    /// A request refused for the caller's scope.
    pub fn authorization_denied(&self, operation: &str) {
        self.denied
            .get_or_create(&KindLabel {
                kind: operation.into(),
            })
            .inc();
    }

    /// A fleet version read: `applied`, `partial` or `rejected`, with its problem count.
    pub fn fleet_reload(&self, outcome: &str, problems: usize) {
        self.reloads
            .get_or_create(&KindLabel {
                kind: outcome.into(),
            })
            .inc();
        self.config_problems.set(problems as i64);
    }

    /// A tool call refused for its argument size or shape.
    pub fn arguments_out_of_bounds(&self, server: &str) {
        self.out_of_bounds
            .get_or_create(&ServerLabel {
                server: server.into(),
            })
            .inc();
    }

    /// Sets a child's gauges (called at scrape time from the served multiplexer).
    pub fn child_gauges(
        &self,
        server: &str,
        in_flight: u64,
        queued: u64,
        breaker: i64,
        tools: usize,
        up: bool,
    ) {
        let l = ServerLabel {
            server: server.into(),
        };
        self.in_flight.get_or_create(&l).set(in_flight as i64);
        self.queued.get_or_create(&l).set(queued as i64);
        self.breaker_open.get_or_create(&l).set(breaker);
        self.catalog_tools.get_or_create(&l).set(tools as i64);
        self.up.get_or_create(&l).set(up as i64);
    }

    /// Drops the series of a server that left the fleet.
    pub fn forget(&self, server: &str) {
        let l = ServerLabel {
            server: server.into(),
        };
        for f in [
            &self.in_flight,
            &self.queued,
            &self.breaker_open,
            &self.catalog_tools,
            &self.up,
        ] {
            f.remove(&l);
        }
    }

    /// Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The process-wide metrics registry.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_series_are_capped() {
        let m = Metrics::new();
        for i in 0..MAX_TOOL_SERIES {
            m.tool_call("s", &format!("t{i}"), "ok", Duration::from_millis(1));
        }
        m.tool_call("s", "one_too_many", "ok", Duration::from_millis(1));
        m.tool_call("s", "t0", "tool-error", Duration::from_millis(1));
        let text = m.encode();
        assert!(text.contains(r#"graphos_tool_calls_total{server="s",tool="_other",code="ok"} 1"#));
        assert!(
            text.contains(r#"graphos_tool_calls_total{server="s",tool="t0",code="tool-error"} 1"#)
        );
        assert!(!text.contains("one_too_many"));
        assert!(
            text.contains(r#"graphos_tool_call_duration_seconds_count{server="s",tool="t0"} 2"#)
        );
    }
}
