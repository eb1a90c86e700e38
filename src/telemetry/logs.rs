//! The global `tracing` subscriber: the filter, text or JSON lines on stderr, and the OTLP trace
//! layer.
//!
//! `GRAPH_OS_LOG` (or `RUST_LOG`) sets the log filter (default `info,rmcp=warn,ort=warn`). JSON
//! lines (`--log-format json`) are one object per line: `timestamp`, `level`, `target`, the
//! event's fields (`message` included) at the top level and the current `span`. Exported spans
//! have their own filter (`graph_os` at info): a quieter log level does not thin the traces.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// How log lines are written on stderr.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (for log collectors; the container image's default).
    Json,
}

/// What [`init_serve`] sets up.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Default filter directive when `GRAPH_OS_LOG`/`RUST_LOG` are unset (`info`).
    pub default_level: String,
    /// Line format.
    pub format: LogFormat,
    /// One line per HTTP request (target `graph_os::access`).
    pub access_log: bool,
    /// OTLP/HTTP collector base URL (`OTEL_EXPORTER_OTLP_*` also apply).
    pub otlp_endpoint: Option<String>,
}

/// The installed telemetry: flush it with [`Telemetry::shutdown`] before the process exits.
#[must_use = "call shutdown() to flush buffered spans"]
pub struct Telemetry {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn tracing(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports the spans still buffered and stops the exporter (bounded: 5 s).
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        let flushed = tokio::task::spawn_blocking(move || {
            provider.shutdown_with_timeout(std::time::Duration::from_secs(5))
        })
        .await;
        match flushed {
            Ok(Ok(())) => tracing::debug!("spans flushed"),
            Ok(Err(e)) => eprintln!("graph-os: flushing spans failed: {e}"),
            Err(e) => eprintln!("graph-os: flushing spans failed: {e}"),
        }
    }
}

fn env_filter(default: &str) -> EnvFilter {
    std::env::var("GRAPH_OS_LOG")
        .ok()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new(format!("{default},rmcp=warn,ort=warn")))
}

type Boxed = Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>;

fn fmt_layer(format: LogFormat, default: &str) -> Boxed {
    let base = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false);
    match format {
        LogFormat::Text => base.with_filter(env_filter(default)).boxed(),
        LogFormat::Json => base
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_filter(env_filter(default))
            .boxed(),
    }
}

/// Installs a text-line subscriber with `default` as the default filter (commands other than
/// serve).
pub fn init(default: &str) {
    let _ = tracing_subscriber::registry()
        .with(vec![fmt_layer(LogFormat::Text, default)])
        .try_init();
}

/// Installs the serving subscriber: log format, access log, and (when a collector is
/// configured) the OTLP exporter. Call it on the serving runtime. A collector that cannot be
/// configured is reported and tracing stays off; the gateway serves regardless.
pub fn init_serve(opts: &Options) -> Telemetry {
    let default = if opts.default_level.is_empty() {
        "info"
    } else {
        opts.default_level.as_str()
    };
    super::access::set_enabled(opts.access_log);
    let mut layers: Vec<Boxed> = vec![fmt_layer(opts.format, default)];
    let (provider, problem) = match super::trace::build(opts.otlp_endpoint.as_deref()) {
        Ok(Some((provider, tracer))) => {
            let spans = Targets::new().with_target("graph_os", tracing::Level::INFO);
            layers.push(
                tracing_opentelemetry::layer()
                    .with_tracer(tracer)
                    .with_filter(spans)
                    .boxed(),
            );
            (Some(provider), None)
        }
        Ok(None) => (None, None),
        Err(e) => (None, Some(e)),
    };
    let _ = tracing_subscriber::registry().with(layers).try_init();
    if let Some(e) = problem {
        tracing::warn!(error = %e, "traces are off: the OTLP exporter could not be set up");
    } else if provider.is_some() {
        tracing::info!(endpoint = ?opts.otlp_endpoint, "exporting traces over OTLP/HTTP");
    }
    Telemetry { provider }
}
