//! `graph-os bench throughput`: calls/s and p50/p99 under N concurrent sessions, direct to the
//! test child's HTTP server and through graph-os's HTTP front, all in the same run with the same
//! client code (a raw JSON-RPC client per session, each on its own keep-alive connection).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use super::{
    bench_token, free_port, http_gateway, percentile, session_caps, tempfile_dir, test_child,
    wait_listening,
};

/// Options of `bench throughput`.
#[derive(clap::Args, Debug, Clone)]
pub struct ThroughputBenchArgs {
    /// Concurrent sessions per step (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    sessions: Vec<usize>,
    /// Measured seconds per target and step.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Warm-up seconds before each measurement (calls made, not counted).
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// `poolSize` of the HTTP child behind graph-os.
    #[arg(long, default_value_t = 4)]
    pool_size: u32,
    /// `maxConcurrency` of the children behind graph-os (default: the fleet default, 8).
    #[arg(long)]
    max_concurrency: Option<u32>,
    /// The test child binary (default: graph-os-testchild next to this binary).
    #[arg(long)]
    child: Option<PathBuf>,
}

/// The protocol version this client asks for.
const PROTOCOL: &str = "2025-06-18";

/// One MCP session over streamable HTTP, as a raw JSON-RPC client (initialize, initialized,
/// then requests carrying `Mcp-Session-Id`). Responses may be JSON or SSE.
pub(super) struct RpcSession {
    http: reqwest::Client,
    url: String,
    token: Option<String>,
    id: Option<String>,
    protocol: String,
    next: u64,
}

impl RpcSession {
    /// Opens a session at `url` (initialize + notifications/initialized) over `http`.
    pub(super) async fn open(
        http: reqwest::Client,
        url: &str,
        token: Option<&str>,
    ) -> anyhow::Result<Self> {
        let mut s = RpcSession {
            http,
            url: url.to_string(),
            token: token.map(str::to_string),
            id: None,
            protocol: PROTOCOL.to_string(),
            next: 0,
        };
        let init = s
            .request(
                "initialize",
                json!({
                    "protocolVersion": PROTOCOL,
                    "capabilities": {},
                    "clientInfo": {"name": "graph-os-bench", "version": "0"},
                }),
            )
            .await?;
        if let Some(v) = init["protocolVersion"].as_str() {
            s.protocol = v.to_string();
        }
        let resp = s
            .post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .send()
            .await?;
        let status = resp.status();
        resp.bytes().await?;
        anyhow::ensure!(
            status.is_success(),
            "notifications/initialized: HTTP {status}"
        );
        Ok(s)
    }

    fn post(&self, body: &Value) -> reqwest::RequestBuilder {
        let mut r = self
            .http
            .post(&self.url)
            .header(
                reqwest::header::ACCEPT,
                "application/json, text/event-stream",
            )
            .json(body);
        if let Some(t) = &self.token {
            r = r.bearer_auth(t);
        }
        if let Some(id) = &self.id {
            r = r
                .header("mcp-session-id", id)
                .header("mcp-protocol-version", &self.protocol);
        }
        r
    }

    /// Sends one request and returns its `result` (an `error` answer is an error).
    pub(super) async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.next += 1;
        let id = self.next;
        let resp = self
            .post(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .send()
            .await
            .with_context(|| format!("{method}: request failed"))?;
        let status = resp.status();
        if self.id.is_none()
            && let Some(v) = resp.headers().get("mcp-session-id")
        {
            self.id = Some(v.to_str()?.to_string());
        }
        let sse = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let body = resp.bytes().await?;
        anyhow::ensure!(
            status.is_success(),
            "{method}: HTTP {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(300)])
        );
        let msg = if sse {
            sse_response(&body, id).with_context(|| format!("{method}: no answer in the stream"))?
        } else {
            serde_json::from_slice(&body)?
        };
        if let Some(e) = msg.get("error") {
            anyhow::bail!("{method}: {e}");
        }
        Ok(msg["result"].clone())
    }

    /// `tools/call`; a result with `isError` is an error.
    pub(super) async fn call_tool(&mut self, name: &str, args: Value) -> anyhow::Result<Value> {
        let r = self
            .request("tools/call", json!({"name": name, "arguments": args}))
            .await?;
        anyhow::ensure!(r["isError"] != json!(true), "{name} failed: {r}");
        Ok(r)
    }

    /// Ends the session (DELETE); errors are ignored.
    pub(super) async fn close(self) {
        let Some(id) = &self.id else { return };
        let mut r = self.http.delete(&self.url).header("mcp-session-id", id);
        if let Some(t) = &self.token {
            r = r.bearer_auth(t);
        }
        if let Ok(resp) = r.send().await {
            let _ = resp.bytes().await;
        }
    }
}

/// The JSON-RPC answer to `id` among the events of an SSE body.
pub(super) fn sse_answer(body: &[u8], id: u64) -> Option<Value> {
    sse_response(body, id)
}

fn sse_response(body: &[u8], id: u64) -> Option<Value> {
    let text = String::from_utf8_lossy(body);
    let mut data = String::new();
    let mut found = None;
    let mut flush = |data: &mut String| {
        if found.is_none()
            && let Ok(v) = serde_json::from_str::<Value>(data)
            && v["id"] == json!(id)
        {
            found = Some(v);
        }
        data.clear();
    };
    for line in text.lines() {
        if line.is_empty() {
            flush(&mut data);
        } else if let Some(d) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(d.strip_prefix(' ').unwrap_or(d));
        }
    }
    flush(&mut data);
    found
}

/// A client with its own connection pool: one keep-alive connection per session.
pub(super) fn connection() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .tcp_nodelay(true)
        .build()?)
}

/// Where the load goes.
struct Target {
    label: String,
    url: String,
    token: Option<String>,
}

/// One step's figures.
struct Figures {
    calls_per_s: f64,
    p50: Duration,
    p99: Duration,
}

/// Lists until `tool` is visible at `target` (the child comes up behind the gateway).
async fn wait_for_tool(target: &Target, tool: &str) -> anyhow::Result<()> {
    let mut s = RpcSession::open(connection()?, &target.url, target.token.as_deref()).await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = s.request("tools/list", json!({})).await?;
        let seen = r["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["name"] == tool));
        if seen {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{}: {tool} never became visible",
            target.label
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.close().await;
    Ok(())
}

/// `n` sessions loop `add` at `target`: warm-up, then `seconds` measured.
async fn step(target: &Target, n: usize, warmup: f64, seconds: f64) -> anyhow::Result<Figures> {
    let mut opening = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (url, token) = (target.url.clone(), target.token.clone());
        opening.spawn(async move { RpcSession::open(connection()?, &url, token.as_deref()).await });
    }
    let mut sessions = Vec::with_capacity(n);
    while let Some(s) = opening.join_next().await {
        sessions.push(s??);
    }
    let start = Instant::now() + Duration::from_secs_f64(warmup);
    let end = start + Duration::from_secs_f64(seconds);
    let mut running = tokio::task::JoinSet::new();
    for mut s in sessions {
        running.spawn(async move {
            let (mut done, mut times) = (0u64, Vec::new());
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                s.call_tool("add", json!({"a": 2, "b": 3})).await?;
                let t1 = Instant::now();
                if t1 >= start && t1 <= end {
                    done += 1;
                    if t0 >= start {
                        times.push(t1 - t0);
                    }
                }
            }
            anyhow::Ok((done, times, s))
        });
    }
    let (mut done, mut times, mut sessions) = (0, Vec::new(), Vec::new());
    while let Some(r) = running.join_next().await {
        let (d, t, s) = r??;
        done += d;
        times.extend(t);
        sessions.push(s);
    }
    for s in sessions {
        s.close().await;
    }
    anyhow::ensure!(!times.is_empty(), "{}: no call completed", target.label);
    times.sort();
    Ok(Figures {
        calls_per_s: done as f64 / seconds,
        p50: percentile(&times, 0.5),
        p99: percentile(&times, 0.99),
    })
}

/// Runs `bench throughput` and prints the table and the gateway/direct ratios.
pub async fn run(args: ThroughputBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.seconds > 0.0 && args.warmup >= 0.0,
        "--seconds must be > 0"
    );
    let me = std::env::current_exe()?;
    let child = test_child(&me, args.child.as_deref())?;
    graph_os::net::crypto::install_crypto();
    let dir = tempfile_dir()?.join("throughput");
    std::fs::create_dir_all(&dir)?;

    let child_port = free_port()?;
    let mut http_child = tokio::process::Command::new(&child)
        .arg("--http")
        .arg(child_port.to_string())
        .kill_on_drop(true)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let child_url = format!("http://127.0.0.1:{child_port}/mcp");
    wait_listening(child_port).await?;

    // Eager with an empty prefix: `add` is callable as is. Loopback URLs are admitted because
    // the front listens on loopback only (the local profile).
    let fleet = |name: &str, mut entry: Value| -> anyhow::Result<PathBuf> {
        entry["expose"] = "eager".into();
        entry["prefix"] = "".into();
        if let Some(m) = args.max_concurrency {
            entry["maxConcurrency"] = m.into();
        }
        // One principal drives every connection: it may use all of the child's slots.
        entry["maxConcurrencyPerPrincipal"] = args.max_concurrency.unwrap_or(8).into();
        let path = dir.join(name);
        std::fs::write(
            &path,
            serde_json::to_vec(&json!({"mcpServers": {"bench": entry}}))?,
        )?;
        Ok(path)
    };
    let stdio_cfg = fleet("stdio.json", json!({"command": child}))?;
    let http_cfg = fleet(
        "http.json",
        json!({"url": child_url, "transport": "streamable-http", "poolSize": args.pool_size}),
    )?;
    // A throwaway token for this run (loopback only), passed to the gateways by environment.
    let token = bench_token()?;
    // 64 sessions stay under the front's defaults (1000 open, 100 per principal); raise both
    // for larger steps.
    let most = args.sessions.iter().copied().max().unwrap_or(0);
    let caps = if most + 2 > 100 {
        session_caps(most)
    } else {
        Vec::new()
    };
    let caps: Vec<&str> = caps.iter().map(String::as_str).collect();
    let caps = caps.as_slice();
    let state = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let (s_state, h_state) = (state("state-stdio"), state("state-http"));
    let (mut gw_stdio, stdio_port) = http_gateway(
        &me,
        &stdio_cfg,
        &token,
        &[caps, &["--state-dir", &s_state]].concat(),
    )
    .await?;
    let (mut gw_http, http_port) = http_gateway(
        &me,
        &http_cfg,
        &token,
        &[caps, &["--state-dir", &h_state]].concat(),
    )
    .await?;
    let targets = [
        Target {
            label: "direct (child's HTTP server)".into(),
            url: child_url.clone(),
            token: None,
        },
        Target {
            label: "graph-os HTTP → stdio child".into(),
            url: format!("http://127.0.0.1:{stdio_port}/mcp"),
            token: Some(token.clone()),
        },
        Target {
            label: format!("graph-os HTTP → HTTP child (pool {})", args.pool_size),
            url: format!("http://127.0.0.1:{http_port}/mcp"),
            token: Some(token.clone()),
        },
    ];
    let outcome = async {
        for t in &targets {
            wait_for_tool(t, "add").await?;
        }
        let mut rows = Vec::new();
        for &n in &args.sessions {
            let mut per = Vec::new();
            for t in &targets {
                per.push(step(t, n.max(1), args.warmup, args.seconds).await?);
            }
            rows.push((n.max(1), per));
        }
        anyhow::Ok(rows)
    }
    .await;
    let _ = gw_stdio.kill().await;
    let _ = gw_http.kill().await;
    let _ = http_child.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
    let rows = outcome?;

    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "throughput benchmark: tools/call add, N sessions each on its own keep-alive connection, {} s measured after {} s warm-up per step",
        args.seconds, args.warmup
    );
    match args.max_concurrency {
        Some(m) => println!("children behind graph-os: maxConcurrency {m}"),
        None => println!("children behind graph-os: maxConcurrency default (8)"),
    }
    println!(
        "{:<40} {:>8} {:>10} {:>8} {:>8}",
        "target", "sessions", "calls/s", "p50_ms", "p99_ms"
    );
    for (n, per) in &rows {
        for (t, f) in targets.iter().zip(per) {
            println!(
                "{:<40} {n:>8} {:>10.1} {:>8.3} {:>8.3}",
                t.label,
                f.calls_per_s,
                ms(f.p50),
                ms(f.p99)
            );
        }
    }
    println!("ratio gateway/direct calls/s:");
    println!(
        "{:>8} {:>16} {:>22}",
        "sessions", "→ stdio child", "→ HTTP child (pool)"
    );
    for (n, per) in &rows {
        let d = per[0].calls_per_s;
        println!(
            "{n:>8} {:>15.2}x {:>21.2}x",
            per[1].calls_per_s / d,
            per[2].calls_per_s / d
        );
    }
    Ok(())
}
