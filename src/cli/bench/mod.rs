//! `graph-os bench`: forwarding overhead, measured against a direct baseline in the same run.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rmcp::model::CallToolRequestParams;
use rmcp::service::RoleClient;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{Peer, ServiceExt};

mod memory;
mod raw;
mod throughput;

/// What to benchmark besides forwarding.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum BenchWhat {
    /// find_tools ranking: quality per dataset and ranker (held-out half), latency at scale.
    Discovery(graph_os::discovery::bench::DiscoveryBenchArgs),
    /// Per-request cost of the Redis session store against the memory store: tools/call of a
    /// loaded tool through one HTTP replica each, alternating rounds, p50/p99 and the ratio.
    Sessions(SessionsBenchArgs),
    /// calls/s and p50/p99 under 1, 8, 64 concurrent HTTP sessions: direct to the test child's
    /// HTTP server, through graph-os to a stdio child and to a pooled HTTP child.
    Throughput(throughput::ThroughputBenchArgs),
    /// VmRSS of graph-os per cataloged tool, per idle HTTP session and per loaded tool.
    Memory(memory::MemoryBenchArgs),
}

/// Options of `bench sessions`.
#[derive(clap::Args, Debug, Clone)]
pub struct SessionsBenchArgs {
    /// Measured calls per store (split over the rounds).
    #[arg(long, default_value_t = 2000)]
    calls: usize,
    /// Alternating rounds (memory, redis, memory, ...): noise on a shared machine hits both.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// An existing Redis/Valkey to use (default: a redis-server this benchmark starts on a free
    /// loopback port and stops).
    #[arg(long)]
    redis_url: Option<String>,
    /// The redis-server binary started when no --redis-url is given.
    #[arg(long, default_value = "redis-server")]
    redis_server: PathBuf,
    /// The test child binary (default: graph-os-testchild next to this binary).
    #[arg(long)]
    child: Option<PathBuf>,
}

/// Benchmark options.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// `discovery`: the ranking benchmark (default: the forwarding benchmark).
    #[command(subcommand)]
    what: Option<BenchWhat>,
    /// Sequential calls per path (split over the rounds).
    #[arg(long, default_value_t = 1000)]
    calls: usize,
    /// Warm-up calls per path (not measured).
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// Alternating rounds: each runs every path for calls/rounds calls, so noise on a shared
    /// machine hits all paths alike.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// The test child binary (default: graph-os-testchild next to this binary).
    #[arg(long)]
    child: Option<PathBuf>,
    /// Also write the numbers as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Exit non-zero if the stdio front's p50 exceeds this multiple of the byte relay's p50
    /// (the gross-regression guard).
    #[arg(long)]
    max_relay_ratio: Option<f64>,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

async fn measure(
    peer: &Peer<RoleClient>,
    tool: &str,
    calls: usize,
    warmup: usize,
) -> anyhow::Result<Vec<Duration>> {
    let args = serde_json::json!({"a": 2, "b": 3}).as_object().cloned();
    for _ in 0..warmup {
        peer.call_tool(
            CallToolRequestParams::new(tool.to_string()).with_arguments_opt(args.clone()),
        )
        .await?;
    }
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        let r = peer
            .call_tool(
                CallToolRequestParams::new(tool.to_string()).with_arguments_opt(args.clone()),
            )
            .await?;
        times.push(t.elapsed());
        anyhow::ensure!(r.is_error != Some(true), "call failed: {r:?}");
    }
    times.sort();
    Ok(times)
}

trait WithArgs {
    fn with_arguments_opt(self, args: Option<serde_json::Map<String, serde_json::Value>>) -> Self;
}
impl WithArgs for CallToolRequestParams {
    fn with_arguments_opt(
        mut self,
        args: Option<serde_json::Map<String, serde_json::Value>>,
    ) -> Self {
        self.arguments = args;
        self
    }
}

/// Runs the benchmark and prints p50/p99 for each path and the ratios.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.what {
        Some(BenchWhat::Discovery(d)) => {
            return tokio::task::spawn_blocking(move || graph_os::discovery::bench::run(d)).await?;
        }
        Some(BenchWhat::Sessions(s)) => return run_sessions(s).await,
        Some(BenchWhat::Throughput(t)) => return throughput::run(t).await,
        Some(BenchWhat::Memory(m)) => return memory::run(m).await,
        None => {}
    }
    let me = std::env::current_exe()?;
    let child = test_child(&me, args.child.as_deref())?;
    let relay = me.with_file_name("graph-os-byte-relay");
    anyhow::ensure!(
        relay.exists(),
        "byte relay not found at {} (build it: cargo build -p graph-os-testchild)",
        relay.display()
    );
    graph_os::net::crypto::install_crypto();

    // The test child's own streamable-HTTP server: measured directly and as the HTTP child behind
    // graph-os (each client gets its own session).
    let child_port = free_port()?;
    let _http_child = tokio::process::Command::new(&child)
        .arg("--http")
        .arg(child_port.to_string())
        .kill_on_drop(true)
        .stdout(std::process::Stdio::null())
        .spawn()?;
    let child_url = format!("http://127.0.0.1:{child_port}/mcp");
    wait_listening(child_port).await?;

    let dir = tempfile_dir()?;
    let fleet = |name: &str, entry: serde_json::Value| -> anyhow::Result<PathBuf> {
        let mut entry = entry;
        entry["expose"] = "eager".into();
        entry["prefix"] = "".into();
        let path = dir.join(name);
        std::fs::write(
            &path,
            serde_json::to_vec(&serde_json::json!({"mcpServers": {"bench": entry}}))?,
        )?;
        Ok(path)
    };
    let stdio_cfg = fleet("bench.json", serde_json::json!({"command": child}))?;
    let http_cfg = fleet("bench-http.json", serde_json::json!({"url": child_url}))?;
    // A throwaway token for this run (loopback only); the value never leaves this process and
    // the gateways it starts (it is passed by environment).
    let token = bench_token()?;

    // Every connection is opened once, up front; gateway processes live in `procs` until the end.
    type Client = rmcp::service::RunningService<RoleClient, ()>;
    let mut paths: Vec<(&str, &str, Client)> = Vec::new();
    let mut procs = Vec::new();
    let mut front_ports = Vec::new();
    let stdio = |program: &std::path::Path, args: &[&std::ffi::OsStr]| {
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args).env("GRAPH_OS_LOG", "warn");
        TokioChildProcess::new(cmd)
    };
    let http = |port: u16, token: Option<&str>| {
        let mut config =
            StreamableHttpClientTransportConfig::with_uri(format!("http://127.0.0.1:{port}/mcp"));
        if let Some(t) = token {
            config = config.auth_header(t.to_string());
        }
        StreamableHttpClientTransport::from_config(config)
    };
    let c = child.as_os_str();
    paths.push((
        "direct",
        "direct (stdio child)",
        ().serve(stdio(&child, &[])?).await?,
    ));
    let relayed = ().serve(stdio(&relay, &[c])?).await?;
    paths.push(("relay", "byte relay → stdio child", relayed));
    let spawn_at = Instant::now();
    let gw = ().serve(stdio(&me, &["--config".as_ref(), stdio_cfg.as_os_str()])?);
    let gw = gw.await?;
    let init = spawn_at.elapsed();
    paths.push(("stdio_front", "graph-os stdio front → stdio child", gw));
    let gw = ().serve(stdio(&me, &["--config".as_ref(), http_cfg.as_os_str()])?);
    let gw = gw.await?;
    paths.push((
        "stdio_front_http_child",
        "graph-os stdio front → HTTP child",
        gw,
    ));
    let direct_http = ().serve(http(child_port, None)).await?;
    paths.push((
        "child_http",
        "direct (the child's HTTP server)",
        direct_http,
    ));
    for (id, label, cfg) in [
        (
            "http_front",
            "graph-os HTTP front → stdio child",
            &stdio_cfg,
        ),
        (
            "http_front_http_child",
            "graph-os HTTP front → HTTP child",
            &http_cfg,
        ),
    ] {
        let (front, port) = http_gateway(&me, cfg, &token, &[]).await?;
        procs.push(front);
        paths.push((id, label, ().serve(http(port, Some(&token))).await?));
        front_ports.push(port);
    }
    // The same minimal JSON-RPC client over stdio and HTTP: the transports' own cost, without
    // either client library's (the HTTP front/stdio front acceptance ratio).
    let line = |program: &std::path::Path, args: &[&std::ffi::OsStr]| {
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args).env("GRAPH_OS_LOG", "warn");
        cmd
    };
    let mut raw_paths: Vec<(&str, &str, raw::RawClient)> = vec![
        (
            "raw_direct",
            "raw client: direct (stdio child)",
            raw::RawClient::Line(Box::new(
                raw::LineSession::open(&mut line(&child, &[])).await?,
            )),
        ),
        (
            "raw_stdio_front",
            "raw client: graph-os stdio front",
            raw::RawClient::Line(Box::new(
                raw::LineSession::open(&mut line(
                    &me,
                    &["--config".as_ref(), stdio_cfg.as_os_str()],
                ))
                .await?,
            )),
        ),
        (
            "raw_child_http",
            "raw client: the child's HTTP server",
            raw::RawClient::Http(
                throughput::RpcSession::open(throughput::connection()?, &child_url, None).await?,
            ),
        ),
        (
            "wire_child_http",
            "wire client: the child's HTTP server",
            raw::RawClient::Wire(raw::WireSession::open(child_port, None).await?),
        ),
        (
            "wire_http_front",
            "wire client: graph-os HTTP front",
            raw::RawClient::Wire(raw::WireSession::open(front_ports[0], Some(&token)).await?),
        ),
        (
            "raw_http_front",
            "raw client: graph-os HTTP front",
            raw::RawClient::Http(
                throughput::RpcSession::open(
                    throughput::connection()?,
                    &format!("http://127.0.0.1:{}/mcp", front_ports[0]),
                    Some(&token),
                )
                .await?,
            ),
        ),
    ];

    for (_, _, peer) in &paths {
        wait_for_tool(peer.peer(), "add").await?;
        measure(peer.peer(), "add", args.warmup, 0).await?;
    }
    for (_, _, client) in &mut raw_paths {
        client.wait_for_tool("add").await?;
        client.measure("add", args.warmup).await?;
    }
    let rounds = args.rounds.max(1);
    let per_round = (args.calls / rounds).max(1);
    let mut times = vec![Vec::new(); paths.len() + raw_paths.len()];
    for _ in 0..rounds {
        for ((_, _, peer), t) in paths.iter().zip(&mut times) {
            t.extend(measure(peer.peer(), "add", per_round, 0).await?);
        }
        for ((_, _, client), t) in raw_paths.iter_mut().zip(&mut times[paths.len()..]) {
            t.extend(client.measure("add", per_round).await?);
        }
    }
    let ids: Vec<(&str, &str)> = paths
        .iter()
        .map(|(id, label, _)| (*id, *label))
        .chain(raw_paths.iter().map(|(id, label, _)| (*id, *label)))
        .collect();
    drop(raw_paths);
    for (_, _, peer) in paths {
        let _ = peer.cancel().await;
    }
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);

    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut p = std::collections::BTreeMap::new();
    for ((id, _), t) in ids.iter().zip(&mut times) {
        t.sort();
        p.insert(*id, (ms(percentile(t, 0.5)), ms(percentile(t, 0.99))));
    }
    let ratio = |a: &str, b: &str| (p[a].0 / p[b].0, p[a].1 / p[b].1);
    let ratios = [
        ("stdio_front/relay", "stdio front/byte relay (headline)"),
        (
            "stdio_front_http_child/child_http",
            "stdio front→HTTP child/child's HTTP server",
        ),
        ("http_front/stdio_front", "HTTP front/stdio front"),
        (
            "raw_http_front/raw_stdio_front",
            "HTTP front/stdio front (raw clients)",
        ),
        (
            "raw_http_front/raw_child_http",
            "HTTP front/child's HTTP server (raw clients)",
        ),
        (
            "raw_stdio_front/raw_direct",
            "stdio front/direct (raw clients)",
        ),
        (
            "wire_http_front/raw_stdio_front",
            "HTTP front/stdio front (wire clients)",
        ),
        (
            "wire_http_front/wire_child_http",
            "HTTP front/child's HTTP server (wire clients)",
        ),
        (
            "http_front/child_http",
            "HTTP front→stdio child/child's HTTP server",
        ),
        (
            "http_front_http_child/child_http",
            "HTTP front→HTTP child/child's HTTP server",
        ),
        ("stdio_front/direct", "graph-os stdio front/direct"),
        ("relay/direct", "byte relay/direct"),
    ]
    .map(|(key, label)| {
        let (a, b) = key.split_once('/').unwrap_or((key, key));
        (key, label, ratio(a, b))
    });
    println!(
        "forwarding benchmark: {} sequential tools/call per path in {rounds} alternating rounds (after {} warm-up)",
        per_round * rounds,
        args.warmup
    );
    println!("{:<44} {:>8} {:>8}", "path", "p50_ms", "p99_ms");
    for (id, label) in &ids {
        let (p50, p99) = p[id];
        println!("{label:<44} {p50:>8.3} {p99:>8.3}");
    }
    for (_, label, (r50, r99)) in &ratios {
        println!(
            "ratio {:<44} p50 {r50:.2}x  p99 {r99:.2}x",
            format!("{label}:")
        );
    }
    let added = |a: &str, b: &str| (p[a].0 - p[b].0, p[a].1 - p[b].1);
    for (label, (a50, a99)) in [
        ("stdio front", added("stdio_front", "direct")),
        ("stdio front vs relay", added("stdio_front", "relay")),
    ] {
        println!("added latency ({label}): p50 {a50:+.3} ms  p99 {a99:+.3} ms");
    }
    println!("graph-os spawn → initialize answered: {:.1} ms", ms(init));

    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "calls_per_path": per_round * rounds,
            "rounds": rounds,
            "warmup": args.warmup,
            "paths": ids.iter().map(|(id, label)| (id.to_string(), serde_json::json!({
                "label": label, "p50_ms": p[id].0, "p99_ms": p[id].1,
            }))).collect::<serde_json::Map<_, _>>(),
            "ratios": ratios.iter().map(|(key, _, (r50, r99))| (key.to_string(), serde_json::json!({
                "p50": r50, "p99": r99,
            }))).collect::<serde_json::Map<_, _>>(),
            "init_ms": ms(init),
        });
        std::fs::write(path, serde_json::to_vec_pretty(&json)?)
            .map_err(|e| anyhow::anyhow!("--json {}: {e}", path.display()))?;
    }
    if let Some(max) = args.max_relay_ratio {
        let (r50, _) = ratios[0].2;
        anyhow::ensure!(
            r50 <= max,
            "forwarding regression: graph-os stdio front p50 is {r50:.2}x the byte relay's \
             (--max-relay-ratio {max}): {:.3} ms vs {:.3} ms",
            p["stdio_front"].0,
            p["relay"].0
        );
    }
    Ok(())
}

/// Starts graph-os's HTTP front on a free port over `cfg` with a delegate `token` (the value is
/// passed by environment, never on the command line), killed on drop; returns it and its port.
async fn http_gateway(
    me: &std::path::Path,
    cfg: &std::path::Path,
    token: &str,
    extra: &[&str],
) -> anyhow::Result<(tokio::process::Child, u16)> {
    let port = free_port()?;
    let child = tokio::process::Command::new(me)
        .args([
            "--transport",
            "streamable-http",
            "--port",
            &port.to_string(),
        ])
        .arg("--config")
        .arg(cfg)
        .args(["--token", "delegate=env://GRAPH_OS_BENCH_TOKEN"])
        .args(extra)
        .env("GRAPH_OS_BENCH_TOKEN", token)
        .env("GRAPH_OS_LOG", "warn")
        .kill_on_drop(true)
        .stdout(std::process::Stdio::null())
        .spawn()?;
    wait_listening(port).await?;
    Ok((child, port))
}

/// A graph-os HTTP replica for `bench sessions`, killed on drop.
struct Replica {
    _proc: tokio::process::Child,
    peer: rmcp::service::RunningService<RoleClient, ()>,
}

async fn replica(
    me: &std::path::Path,
    cfg: &std::path::Path,
    token: &str,
    store: &str,
) -> anyhow::Result<Replica> {
    let kind = if store == "memory" { "memory" } else { "redis" };
    let state = cfg.with_file_name(format!("state-{kind}"));
    let state = state.to_string_lossy().into_owned();
    let (proc, port) = http_gateway(
        me,
        cfg,
        token,
        &["--session-store", store, "--state-dir", &state],
    )
    .await?;
    let config =
        StreamableHttpClientTransportConfig::with_uri(format!("http://127.0.0.1:{port}/mcp"))
            .auth_header(token.to_string());
    let peer = ().serve(StreamableHttpClientTransport::from_config(config)).await?;
    // The tool is not eager: load it, as a client of a large fleet would.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = peer
            .call_tool(
                CallToolRequestParams::new("load_tools")
                    .with_arguments_opt(serde_json::json!({"tools": ["add"]}).as_object().cloned()),
            )
            .await?;
        let loaded = r.structured_content.as_ref().is_some_and(|v| {
            v["loaded"] == serde_json::json!(["add"])
                || v["already_loaded"] == serde_json::json!(["add"])
        });
        if loaded {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the test child never came up: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(Replica { _proc: proc, peer })
}

/// `bench sessions`: tools/call through a replica on the memory store and one on Redis.
async fn run_sessions(args: SessionsBenchArgs) -> anyhow::Result<()> {
    let me = std::env::current_exe()?;
    let child = test_child(&me, args.child.as_deref())?;
    graph_os::net::crypto::install_crypto();
    let dir = tempfile_dir()?;
    let cfg = dir.join("sessions.json");
    std::fs::write(
        &cfg,
        serde_json::to_vec(&serde_json::json!({
            "mcpServers": {"bench": {"command": child, "prefix": ""}}
        }))?,
    )?;
    let mut redis_proc = None;
    let url = match &args.redis_url {
        Some(u) => u.clone(),
        None => {
            let port = free_port()?;
            redis_proc = Some(
                tokio::process::Command::new(&args.redis_server)
                    .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--save", "", "--appendonly", "no"])
                    .kill_on_drop(true)
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .map_err(|e| {
                        anyhow::anyhow!(
                            "{}: {e} (install redis-server)",
                            args.redis_server.display()
                        )
                    })?,
            );
            wait_listening(port).await?;
            format!("redis://127.0.0.1:{port}")
        }
    };
    let token = bench_token()?;
    let memory = replica(&me, &cfg, &token, "memory").await?;
    let redis = replica(&me, &cfg, &token, &url).await?;
    let rounds = args.rounds.max(1);
    let per_round = (args.calls / rounds).max(1);
    let (mut m, mut r) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        m.extend(measure(memory.peer.peer(), "add", per_round, 10).await?);
        r.extend(measure(redis.peer.peer(), "add", per_round, 10).await?);
    }
    m.sort();
    r.sort();
    for Replica { _proc, peer } in [memory, redis] {
        let _ = peer.cancel().await;
        drop(_proc);
    }
    drop(redis_proc);
    let _ = std::fs::remove_dir_all(&dir);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let p = |t: &[Duration]| (ms(percentile(t, 0.5)), ms(percentile(t, 0.99)));
    let ((mp50, mp99), (rp50, rp99)) = (p(&m), p(&r));
    println!(
        "session store benchmark: {} tools/call of a loaded tool per store over HTTP (one keep-alive connection, {rounds} alternating rounds)",
        m.len()
    );
    println!("store                          p50_ms   p99_ms");
    println!("memory                       {mp50:>8.3} {mp99:>8.3}");
    println!("redis                        {rp50:>8.3} {rp99:>8.3}");
    println!(
        "ratio redis/memory:          p50 {:.2}x  p99 {:.2}x",
        rp50 / mp50,
        rp99 / mp99
    );
    println!(
        "added per request (redis):   p50 {:+.3} ms  p99 {:+.3} ms",
        rp50 - mp50,
        rp99 - mp99
    );
    Ok(())
}

/// The test child: `given`, else graph-os-testchild beside this binary.
fn test_child(me: &std::path::Path, given: Option<&std::path::Path>) -> anyhow::Result<PathBuf> {
    let child = given
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(|| me.with_file_name("graph-os-testchild"));
    anyhow::ensure!(
        child.exists(),
        "test child not found at {} (build it: cargo build -p graph-os-testchild)",
        child.display()
    );
    Ok(child)
}

/// Lists until `tool` is visible (the child comes up behind the gateway).
async fn wait_for_tool(peer: &Peer<RoleClient>, tool: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if peer.list_all_tools().await?.iter().any(|t| t.name == tool) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the test child never came up behind graph-os"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A throwaway delegate token for one run (loopback only): it reaches the gateways it starts by
/// environment, never argv, and is never printed.
fn bench_token() -> anyhow::Result<String> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    Ok(format!("bench-{:032x}-{}", nanos, std::process::id()))
}

/// Gateway flags that let one bench token hold `sessions` sessions (the front's defaults: 1000
/// open, 100 per principal), with room for the bench's own helper sessions.
fn session_caps(sessions: usize) -> Vec<String> {
    let cap = (sessions + 16).max(1000).to_string();
    [
        "--max-sessions",
        cap.as_str(),
        "--max-sessions-per-principal",
        cap.as_str(),
    ]
    .map(str::to_string)
    .to_vec()
}

/// A port that was free a moment ago.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Waits until something accepts on `port`.
async fn wait_listening(port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        anyhow::ensure!(Instant::now() < deadline, "nothing listens on {port}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("graph-os-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
