//! The command line: flags parsed into what the library takes ([`graph_os::gateway::Config`]
//! for `serve`), the subcommands' own small programs (validate, doctor, bench, the admin
//! client's printing), and the async runtime they run on. Nothing here wires the gateway.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use graph_os::config::{self, AdmissionContext};

pub mod admin;
pub mod bench;
pub mod doctor;
pub mod serve;

pub use serve::ServeArgs;

/// graph-os: an MCP fleet gateway with progressive tool discovery.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve MCP (the default when no subcommand is given).
    Serve(Box<ServeArgs>),
    /// Validate a fleet file: print every problem (server, field, reason); exit 1 if any.
    Validate {
        /// Fleet file (JSON or YAML `mcpServers`).
        #[arg(long, short)]
        config: Option<PathBuf>,
        #[command(flatten)]
        profile: ProfileArgs,
    },
    /// Print the JSON Schema of the fleet file (published as schema/mcp_config.schema.json;
    /// point a file's `$schema` at it for editor completion).
    Schema,
    /// Benchmarks: forwarding (N sequential tools/call, direct vs through graph-os) or
    /// `bench discovery` (find_tools ranking quality and latency).
    Bench(bench::BenchArgs),
    /// Self-check of the binary (protocol floor, config schema, CRD generation); with --config
    /// also of a fleet file: validation, each stdio `command` found on PATH, each remote URL
    /// against the egress policy, the variables each child would get (names only). Exits 1 on
    /// any failure.
    Doctor {
        /// Fleet file to check.
        #[arg(long, short)]
        config: Option<PathBuf>,
        #[command(flatten)]
        profile: ProfileArgs,
    },
    /// Approve a child's changed catalog on a running gateway (drift guard): the digest is the
    /// `pending_digest` of the child's `drift` status. Publishes a new catalog generation.
    Approve {
        /// Server name.
        server: String,
        /// The pending catalog digest (64 hex digits).
        digest: String,
        /// The gateway's base URL.
        #[arg(long, env = "GRAPH_OS_URL", default_value = "http://127.0.0.1:8004")]
        url: String,
        /// Environment variable holding a bearer token with the manage scope.
        #[arg(long, default_value = "GRAPH_OS_TOKEN")]
        token_env: String,
    },
    /// A running gateway's children (state, breaker, in-flight, restarts, tools, last error) and
    /// catalog identity, from its admin API (discover scope).
    Status {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// A running gateway's catalog identity and one row per server (discover scope).
    Catalog {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Re-lists every child of a running gateway and publishes a new catalog generation when
    /// something changed (manage scope).
    Refresh {
        /// Deadline for probing every child, milliseconds (1..120000).
        #[arg(long, default_value_t = 30_000)]
        deadline_ms: u64,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// The listen profile a fleet file is checked for (validate, doctor).
#[derive(clap::Args, Debug, Clone)]
pub struct ProfileArgs {
    /// Check for a gateway that does not listen on loopback only: loopback child URLs then need
    /// allowedPrivateHosts (the default checks for the local profile).
    #[arg(long)]
    remote_profile: bool,
    /// Gateway-level egress allow-list, as for serve.
    #[arg(
        long = "allowed-private-host",
        env = "GRAPH_OS_ALLOWED_PRIVATE_HOSTS",
        value_delimiter = ','
    )]
    allowed_private_hosts: Vec<String>,
}

impl ProfileArgs {
    /// The admission context of this profile; a bad allow-list entry is an error to print.
    pub fn context(&self) -> Result<AdmissionContext, String> {
        let allowed = graph_os::net::egress::Allowlist::parse(&self.allowed_private_hosts)
            .map_err(|e| format!("--allowed-private-host: {e}"))?;
        Ok(AdmissionContext {
            egress: graph_os::net::egress::GatewayEgress {
                allow_loopback: !self.remote_profile,
                allowed,
            },
            ..Default::default()
        })
    }
}

/// Where a running gateway's admin API is, for the admin commands.
#[derive(clap::Args, Debug, Clone)]
pub struct AdminArgs {
    /// The gateway's base URL (its HTTP listener, or --admin-addr of a stdio gateway).
    #[arg(long, env = "GRAPH_OS_URL", default_value = "http://127.0.0.1:8004")]
    pub url: String,
    /// Environment variable holding a bearer token (never passed on the command line).
    #[arg(long, default_value = "GRAPH_OS_TOKEN")]
    pub token_env: String,
    /// Print the gateway's JSON answer instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl AdminArgs {
    pub fn target(&self) -> admin::AdminTarget {
        admin::AdminTarget {
            url: self.url.clone(),
            token_env: self.token_env.clone(),
        }
    }
}

/// Prints an admin answer as JSON or as the table `text` makes of it.
pub fn print_admin(
    json: bool,
    answer: &serde_json::Value,
    text: fn(&serde_json::Value) -> String,
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(answer)?);
    } else {
        print!("{}", text(answer));
    }
    Ok(())
}

/// Runs `fut` on a multi-threaded runtime: an error is printed once (unless already logged).
pub fn run_async(fut: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("graph-os: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(fut) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<Reported>() => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("graph-os: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// An error already logged through tracing: `run_async` does not print it a second time.
#[derive(Debug)]
pub struct Reported(anyhow::Error);

impl Reported {
    /// Marks `e` as logged.
    pub fn wrap(e: anyhow::Error) -> anyhow::Error {
        anyhow::Error::new(Reported(e))
    }
}

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for Reported {}

pub fn validate(path: Option<PathBuf>, profile: &ProfileArgs) -> ExitCode {
    let Some(path) = config::resolve_config_path(path.as_deref()) else {
        eprintln!("graph-os validate: no fleet file found (pass --config PATH)");
        return ExitCode::FAILURE;
    };
    let ctx = match profile.context() {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("graph-os validate: {e}");
            return ExitCode::FAILURE;
        }
    };
    match config::load_file(&path, &ctx) {
        Err(e) => {
            println!("{}: {e}", e.code());
            ExitCode::FAILURE
        }
        Ok(fleet) => {
            // Every problem on its own line, with its path in the document as written
            // (`mcpServers.github.env.TOKEN`); warnings (not fatal) after them, on stderr.
            for issue in &fleet.issues {
                println!("{issue} (at {})", fleet.issue_path(issue));
            }
            for warning in &fleet.warnings {
                eprintln!("warning: {}: {}", fleet.issue_path(warning), warning.reason);
            }
            println!("{}: {}", path.display(), fleet.summary());
            if fleet.issues.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
