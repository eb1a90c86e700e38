//! `graph-os bench`: forwarding overhead, measured against a direct baseline in the same run.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rmcp::model::CallToolRequestParams;
use rmcp::service::RoleClient;
use rmcp::transport::TokioChildProcess;
use rmcp::{Peer, ServiceExt};

/// What to benchmark besides forwarding.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum BenchWhat {
    /// find_tools ranking: quality per dataset and ranker (held-out half), latency at scale.
    Discovery(graph_os::discovery::bench::DiscoveryBenchArgs),
}

/// Benchmark options.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// `discovery`: the ranking benchmark (default: the forwarding benchmark).
    #[command(subcommand)]
    what: Option<BenchWhat>,
    /// Sequential calls per path.
    #[arg(long, default_value_t = 1000)]
    calls: usize,
    /// Warm-up calls per path (not measured).
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// The test child binary (default: graph-os-testchild next to this binary).
    #[arg(long)]
    child: Option<PathBuf>,
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
    if let Some(BenchWhat::Discovery(d)) = args.what {
        return tokio::task::spawn_blocking(move || graph_os::discovery::bench::run(d)).await?;
    }
    let me = std::env::current_exe()?;
    let child = args
        .child
        .clone()
        .unwrap_or_else(|| me.with_file_name("graph-os-testchild"));
    anyhow::ensure!(
        child.exists(),
        "test child not found at {} (build it: cargo build -p graph-os-testchild)",
        child.display()
    );

    // Direct: our client → test child over stdio.
    let direct = ()
        .serve(TokioChildProcess::new(tokio::process::Command::new(
            &child,
        ))?)
        .await?;
    let d = measure(direct.peer(), "add", args.calls, args.warmup).await?;
    direct.cancel().await?;

    // Through graph-os: our client → graph-os (stdio) → test child (stdio), tool loaded eagerly.
    let dir = tempfile_dir()?;
    let cfg = dir.join("bench.json");
    std::fs::write(
        &cfg,
        serde_json::to_vec(&serde_json::json!({
            "mcpServers": {"bench": {"command": child, "expose": "eager", "prefix": ""}}
        }))?,
    )?;
    let spawn_at = Instant::now();
    let mut cmd = tokio::process::Command::new(&me);
    cmd.arg("--config").arg(&cfg).env("GRAPH_OS_LOG", "warn");
    let gw = ().serve(TokioChildProcess::new(cmd)?).await?;
    let init = spawn_at.elapsed();
    let ready_deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let tools = gw.peer().list_all_tools().await?;
        if tools.iter().any(|t| t.name == "add") {
            break;
        }
        anyhow::ensure!(
            Instant::now() < ready_deadline,
            "the test child never came up behind graph-os"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let g = measure(gw.peer(), "add", args.calls, args.warmup).await?;
    gw.cancel().await?;
    let _ = std::fs::remove_dir_all(&dir);

    let (dp50, dp99, gp50, gp99) = (
        percentile(&d, 0.5),
        percentile(&d, 0.99),
        percentile(&g, 0.5),
        percentile(&g, 0.99),
    );
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "forwarding benchmark: {} sequential tools/call per path (after {} warm-up)",
        args.calls, args.warmup
    );
    println!("path                 p50_ms   p99_ms");
    println!("direct (stdio)     {:>8.3} {:>8.3}", ms(dp50), ms(dp99));
    println!("graph-os (stdio)   {:>8.3} {:>8.3}", ms(gp50), ms(gp99));
    println!(
        "ratio gateway/direct: p50 {:.2}x  p99 {:.2}x",
        ms(gp50) / ms(dp50),
        ms(gp99) / ms(dp99)
    );
    println!(
        "added latency: p50 {:+.3} ms  p99 {:+.3} ms",
        ms(gp50) - ms(dp50),
        ms(gp99) - ms(dp99)
    );
    println!("graph-os spawn → initialize answered: {:.1} ms", ms(init));
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("graph-os-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
