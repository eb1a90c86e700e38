//! The global `tracing` subscriber: the filter, text or JSON lines on stderr, and the OTLP trace
//! layer.
//!
//! `GRAPH_OS_LOG` (or `RUST_LOG`) sets the log filter (default `info,rmcp=warn,ort=warn`). JSON
//! lines (`--log-format json`) are one object per line: `timestamp`, `level`, `target`, the
//! event's fields (`message` included) at the top level and the current `span`. Exported spans
//! have their own filter (`graph_os` at info): a quieter log level does not thin the traces.
//!
//! Text lines escape every character a terminal or a log reader would act on or hide (see
//! [`needs_escape`]): the one formatter of every event's and span's fields does it, so a tool
//! name, method, server name or error carrying `\n`, ESC or a bidi override cannot forge a line,
//! move the cursor or reorder what is shown. JSON lines are escaped by the JSON encoder.

use std::borrow::Cow;
use std::fmt::Write as _;

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

/// Whether a character is escaped in text logs (and refused in display names): C0 controls,
/// DEL and C1 controls, zero-width characters and joiners, the byte-order mark, line and
/// paragraph separators, and the bidi marks, embeddings, overrides and isolates.
pub fn needs_escape(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{1f}'
        | '\u{7f}'..='\u{9f}'
        | '\u{ad}' // soft hyphen (invisible)
        | '\u{61c}' // Arabic letter mark
        | '\u{180e}' // Mongolian vowel separator
        | '\u{200b}'..='\u{200f}' // zero-width space/non-joiner/joiner, LRM, RLM
        | '\u{2028}'..='\u{202e}' // line/paragraph separators, bidi embeddings and overrides
        | '\u{2060}'..='\u{2064}' // word joiner, invisible operators
        | '\u{2066}'..='\u{2069}' // bidi isolates
        | '\u{feff}' // byte-order mark / zero-width no-break space
    )
}

/// `s` with every [`needs_escape`] character written as `\n`, `\r`, `\t` or `\u{XXXX}`
/// (borrowed when there is none): what text logs and status show of child- or client-controlled
/// text.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:04x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// The field formatter of text lines: the default `key=value` rendering, escaped (one place for
/// every event and span field, the message included).
#[derive(Debug, Default)]
pub struct EscapedFields(tracing_subscriber::fmt::format::DefaultFields);

impl<'w> tracing_subscriber::fmt::FormatFields<'w> for EscapedFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: tracing_subscriber::fmt::format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut raw = String::new();
        self.0.format_fields(
            tracing_subscriber::fmt::format::Writer::new(&mut raw),
            fields,
        )?;
        writer.write_str(&escape(&raw))
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
        LogFormat::Text => base
            .fmt_fields(EscapedFields::default())
            .with_filter(env_filter(default))
            .boxed(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_invisible_and_bidi_characters_are_escaped() {
        assert!(matches!(escape("tc__add"), Cow::Borrowed("tc__add")));
        assert_eq!(escape("a\nb\r\tc"), "a\\nb\\r\\tc");
        assert_eq!(escape("\u{1b}[31m"), "\\u{001b}[31m");
        assert_eq!(
            escape("x\u{7f}\u{85}\u{9b}"),
            "x\\u{007f}\\u{0085}\\u{009b}"
        );
        assert_eq!(escape("read_\u{202e}gpj.exe"), "read_\\u{202e}gpj.exe");
        assert_eq!(
            escape("a\u{200b}b\u{2066}\u{feff}"),
            "a\\u{200b}b\\u{2066}\\u{feff}"
        );
        // Printable non-ASCII text is kept as it is.
        assert_eq!(escape("café ö 日本"), "café ö 日本");
    }

    #[test]
    fn the_text_formatter_escapes_every_field() {
        use tracing_subscriber::layer::SubscriberExt;
        #[derive(Clone, Default)]
        struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .fmt_fields(EscapedFields::default());
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("call", server = %"s\u{1b}]0;x\u{7}");
            let _e = span.enter();
            tracing::info!(tool = %"evil\nFORGED line", method = ?"m\u{202e}", "msg \u{200b}{}", "\r");
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(out.lines().count(), 1, "{out}");
        assert!(out.contains("tool=evil\\nFORGED line"), "{out}");
        assert!(out.contains("s\\u{001b}]0;x\\u{0007}"), "{out}");
        assert!(
            !out.contains('\u{1b}') && !out.contains('\u{202e}') && !out.contains('\u{200b}'),
            "{out}"
        );
    }
}
