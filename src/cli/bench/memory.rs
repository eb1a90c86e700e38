//! `graph-os bench memory`: resident memory (VmRSS) of a graph-os HTTP front whose fleet catalogs
//! N tools, and what idle sessions and their loaded tools add on top.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};

use super::throughput::RpcSession;
use super::{bench_token, http_gateway, session_caps, tempfile_dir, test_child};

/// Options of `bench memory`.
#[derive(clap::Args, Debug, Clone)]
pub struct MemoryBenchArgs {
    /// Generated tools in the fleet, one graph-os process per size (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "0,10000,100000")]
    tools: Vec<usize>,
    /// Idle HTTP sessions held open at once (cumulative steps, comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "0,1000")]
    sessions: Vec<usize>,
    /// Tools each session then loads (load_tools), for the per-loaded-tool figure.
    #[arg(long, default_value_t = 10)]
    loaded: usize,
    /// Tools in the fleet for the session measurements.
    #[arg(long, default_value_t = 10_000)]
    session_tools: usize,
    /// Generated tools per test child (a child may advertise at most 2048 tools in all).
    #[arg(long, default_value_t = 2000)]
    per_child: usize,
    /// Bytes of padding in every generated tool's description (about 1 KB of JSON per tool).
    /// A child's catalog may be at most 4 MiB: keep per-child × (pad + ~100) under it.
    #[arg(long, default_value_t = 1000)]
    pad_bytes: usize,
    /// Seconds to wait after the catalog is published (or sessions are opened) before reading RSS.
    #[arg(long, default_value_t = 2.0)]
    settle: f64,
    /// The test child binary (default: graph-os-testchild next to this binary).
    #[arg(long)]
    child: Option<PathBuf>,
}

/// VmRSS of `pid`, KiB.
fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or_else(|| anyhow::anyhow!("no VmRSS for {pid}"))?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("bad VmRSS line: {line}"))?
        .parse()?)
}

/// A graph-os front over a fleet of test children with `tools` generated tools in all.
struct Gateway {
    proc: tokio::process::Child,
    url: String,
    children: usize,
    cataloged: u64,
    /// From spawn to every tool in the served catalog.
    published: Duration,
    /// From spawn to every discovery vector computed.
    indexed: Duration,
    /// Exposed names of the generated tools.
    names: Vec<String>,
}

impl Gateway {
    fn pid(&self) -> anyhow::Result<u32> {
        self.proc
            .id()
            .ok_or_else(|| anyhow::anyhow!("graph-os exited"))
    }
}

#[allow(clippy::too_many_arguments)]
async fn gateway(
    me: &Path,
    child: &Path,
    dir: &Path,
    token: &str,
    tools: usize,
    args: &MemoryBenchArgs,
    extra: &[&str],
) -> anyhow::Result<Gateway> {
    let children = tools.div_ceil(args.per_child.max(1)).max(1);
    let mut servers = serde_json::Map::new();
    let mut names = Vec::with_capacity(tools);
    for i in 0..children {
        let n = tools / children + usize::from(i < tools % children);
        let prefix = format!("m{i}");
        names.extend((0..n).map(|j| format!("{prefix}__gen_{j:04}")));
        servers.insert(
            format!("mem{i}"),
            json!({
                "command": child,
                "args": ["--tools", n.to_string(), "--pad-bytes", args.pad_bytes.to_string()],
                "prefix": prefix,
                "expose": "lazy",
            }),
        );
    }
    let cfg = dir.join(format!("memory-{tools}.json"));
    std::fs::write(&cfg, serde_json::to_vec(&json!({"mcpServers": servers}))?)?;
    let state = dir.join(format!("state-{tools}"));
    let state = state.to_string_lossy().into_owned();
    // No semantic model (an installed one would dominate): the static tier is in the binary.
    let models = dir.join("no-models").to_string_lossy().into_owned();
    let started = Instant::now();
    let (proc, port) = http_gateway(
        me,
        &cfg,
        token,
        &[extra, &["--state-dir", &state, "--models-dir", &models]].concat(),
    )
    .await?;
    // Published: every child up and its tools in the served catalog.
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut published = None;
    let cataloged = loop {
        let status: Value = http
            .get(format!("http://127.0.0.1:{port}/api/mcp/status"))
            .bearer_auth(token)
            .send()
            .await?
            .json()
            .await?;
        let up = status["children"]
            .as_object()
            .is_some_and(|c| c.len() == children && c.values().all(|c| c["state"] == "up"));
        if let Some((name, c)) = status["children"]
            .as_object()
            .and_then(|c| c.iter().find(|(_, c)| c["state"] == "failed"))
        {
            anyhow::bail!("child {name} failed: {}", c["last_error"]);
        }
        let total = status["total_tools"].as_u64().unwrap_or(0);
        if up && total >= tools as u64 && published.is_none() {
            published = Some(started.elapsed());
        }
        // Indexed: the discovery vectors are computed in the background after publication.
        let d = &status["discovery"];
        if published.is_some() && d["vectors_pending"] == 0 && d["models_loading"] == false {
            break total;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the catalog of {tools} tools was not published and indexed within 300 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    Ok(Gateway {
        proc,
        url: format!("http://127.0.0.1:{port}/mcp"),
        children,
        cataloged,
        published: published.unwrap_or_default(),
        indexed: started.elapsed(),
        names,
    })
}

/// Sessions measured on one gateway: (label, sessions, RSS KiB).
type SessionRows = Vec<(String, usize, u64)>;

/// Opens idle sessions in steps up to each of `args.sessions`, reading RSS at each, then loads
/// `args.loaded` tools in every session and reads it again.
async fn sessions(
    gw: &Gateway,
    token: &str,
    args: &MemoryBenchArgs,
) -> anyhow::Result<(SessionRows, Vec<RpcSession>)> {
    let settle = Duration::from_secs_f64(args.settle);
    let http = reqwest::Client::new();
    let mut steps = args.sessions.clone();
    steps.sort_unstable();
    steps.dedup();
    let mut open: Vec<RpcSession> = Vec::new();
    let mut rows = Vec::new();
    for &s in &steps {
        let more = s.saturating_sub(open.len());
        let opened: Vec<anyhow::Result<RpcSession>> = futures::stream::iter(0..more)
            .map(|_| RpcSession::open(http.clone(), &gw.url, Some(token)))
            .buffer_unordered(32)
            .collect()
            .await;
        for o in opened {
            open.push(o?);
        }
        tokio::time::sleep(settle).await;
        rows.push((format!("{s} idle"), s, rss_kib(gw.pid()?)?));
    }
    if args.loaded > 0 && !open.is_empty() && !gw.names.is_empty() {
        let names = &gw.names;
        let want = args.loaded;
        let loads: Vec<anyhow::Result<()>> = futures::stream::iter(open.iter_mut().enumerate())
            .map(|(j, s)| async move {
                let tools: Vec<&String> = (0..want)
                    .map(|q| &names[(j * want + q) % names.len()])
                    .collect();
                let r = s.call_tool("load_tools", json!({"tools": tools})).await?;
                let n = r["structuredContent"]["loaded"]
                    .as_array()
                    .map_or(0, Vec::len);
                anyhow::ensure!(n == want, "load_tools loaded {n} of {want}: {r}");
                Ok(())
            })
            .buffer_unordered(32)
            .collect()
            .await;
        for l in loads {
            l?;
        }
        tokio::time::sleep(settle).await;
        rows.push((
            format!("{} × {want} loaded", open.len()),
            open.len(),
            rss_kib(gw.pid()?)?,
        ));
    }
    Ok((rows, open))
}

/// Runs `bench memory` and prints RSS per catalog size and per session.
pub async fn run(args: MemoryBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=2000).contains(&args.per_child),
        "--per-child must be 1..2000 (a child may advertise at most 2048 tools)"
    );
    let me = std::env::current_exe()?;
    let child = test_child(&me, args.child.as_deref())?;
    graph_os::net::crypto::install_crypto();
    let dir = tempfile_dir()?.join("memory");
    std::fs::create_dir_all(&dir)?;
    let token = bench_token()?;
    // The front's defaults (1000 sessions open, 100 per principal, idle 300 s) would refuse or
    // close the sessions held here: all come from one token.
    let most = args.sessions.iter().copied().max().unwrap_or(0);
    let mut extra = session_caps(most);
    extra.extend(["--session-idle-timeout".to_string(), "3600".to_string()]);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let settle = Duration::from_secs_f64(args.settle);
    let outcome = async {
        let mut sizes = args.tools.clone();
        sizes.sort_unstable();
        sizes.dedup();
        let mut tool_rows = Vec::new();
        let mut session_rows = None;
        let measure_sessions = most > 0 || args.sessions.contains(&0);
        for &n in &sizes {
            let mut gw = gateway(&me, &child, &dir, &token, n, &args, &extra).await?;
            tokio::time::sleep(settle).await;
            let rss = rss_kib(gw.pid()?)?;
            tool_rows.push((n, gw.children, gw.cataloged, rss, gw.published, gw.indexed));
            if n == args.session_tools && measure_sessions {
                let (rows, open) = sessions(&gw, &token, &args).await?;
                session_rows = Some(rows);
                drop(open);
            }
            let _ = gw.proc.kill().await;
        }
        if session_rows.is_none() && measure_sessions {
            let mut gw =
                gateway(&me, &child, &dir, &token, args.session_tools, &args, &extra).await?;
            let (rows, open) = sessions(&gw, &token, &args).await?;
            session_rows = Some(rows);
            drop(open);
            let _ = gw.proc.kill().await;
        }
        anyhow::Ok((tool_rows, session_rows.unwrap_or_default()))
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    let (tool_rows, session_rows) = outcome?;

    let mb = |k: u64| k as f64 / 1024.0;
    println!(
        "memory benchmark: VmRSS of graph-os (HTTP front, memory session store, static discovery tier) {} s after the catalog is published and its discovery vectors computed",
        args.settle
    );
    println!(
        "fleet: test children over stdio, lazy, ≤{} generated tools each, descriptions padded by {} B (children's own memory not counted)",
        args.per_child, args.pad_bytes
    );
    println!(
        "{:>8} {:>9} {:>10} {:>9} {:>9} {:>11} {:>9}",
        "tools", "children", "cataloged", "RSS_MB", "KB/tool", "published_s", "indexed_s"
    );
    let base = tool_rows.first().map(|r| (r.2, r.3));
    for (n, children, cataloged, rss, published, indexed) in &tool_rows {
        let per_tool = match base {
            Some((c0, r0)) if *cataloged > c0 => {
                format!("{:.2}", (*rss as f64 - r0 as f64) / (cataloged - c0) as f64)
            }
            _ => "-".into(),
        };
        println!(
            "{n:>8} {children:>9} {cataloged:>10} {:>9.1} {per_tool:>9} {:>11.1} {:>9.1}",
            mb(*rss),
            published.as_secs_f64(),
            indexed.as_secs_f64()
        );
    }
    if !session_rows.is_empty() {
        println!(
            "sessions on the {}-tool fleet (initialize + initialized, held open, no GET stream):",
            args.session_tools
        );
        println!("{:<24} {:>9} {:>12}", "sessions", "RSS_MB", "KB/session");
        let (r0, s0) = (session_rows[0].2, session_rows[0].1);
        let idle_top = session_rows
            .iter()
            .rfind(|r| r.0.ends_with("idle"))
            .map(|r| r.2);
        for (label, s, rss) in &session_rows {
            let per = if *s > s0 {
                format!("{:.2}", (*rss as f64 - r0 as f64) / (s - s0) as f64)
            } else {
                "-".into()
            };
            println!("{label:<24} {:>9.1} {per:>12}", mb(*rss));
        }
        if let (Some(last), Some(idle)) = (session_rows.last(), idle_top)
            && last.0.ends_with("loaded")
            && last.1 > 0
        {
            println!(
                "per loaded tool: {:.3} KB ({} sessions × {} tools)",
                (last.2 as f64 - idle as f64) / (last.1 * args.loaded) as f64,
                last.1,
                args.loaded
            );
        }
    }
    Ok(())
}
