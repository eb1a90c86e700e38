//! The `graph-os` command line: parse, then hand over. `serve` (the default) turns its flags
//! into a `graph_os::gateway::Config` and runs `graph_os::gateway::run`; the other subcommands
//! are small programs of their own under `cli/`. Nothing here wires the gateway.

use std::process::ExitCode;

use clap::Parser;
use cli::{Cli, Command, print_admin, run_async};

mod cli;

fn main() -> ExitCode {
    // First of all, before any secret is read and before any child or helper process starts:
    // non-dumpable, so a child under this uid cannot read this process's environ or memory
    // (src/transport/isolation.rs, docs/threat-model.md). Serving without it is refused.
    if let Err(e) = graph_os::transport::isolation::harden_gateway() {
        eprintln!("graph-os: process-isolation-failed: prctl(PR_SET_DUMPABLE, 0): {e}");
        return ExitCode::FAILURE;
    }
    graph_os::memory::bound_allocator_retention();
    // The child reaper (src/transport/reaper.rs) is this binary started with a hidden argument.
    let mut raw = std::env::args();
    if raw.nth(1).as_deref() == Some(graph_os::transport::reaper::ARG) {
        return ExitCode::from(graph_os::transport::reaper::run(raw.next().as_deref()) as u8);
    }
    let cli = Cli::parse();
    match cli.command {
        None => cli::serve::serve(cli.serve),
        Some(Command::Serve(args)) => cli::serve::serve(*args),
        Some(Command::Validate { config, profile }) => cli::validate(config, &profile),
        Some(Command::Schema) => {
            print!("{}", graph_os::config::compat::file_schema_json());
            ExitCode::SUCCESS
        }
        Some(Command::Bench(args)) => {
            graph_os::telemetry::init("warn");
            run_async(cli::bench::run(args))
        }
        Some(Command::Doctor { config, profile }) => {
            let binary = cli::doctor::binary();
            // The fleet serve would read: --config, $GRAPH_OS_CONFIG, ./mcp_config.json, XDG.
            let fleet = match graph_os::config::resolve_config_path(config.as_deref()) {
                Some(path) => match profile.context() {
                    Ok(ctx) => cli::doctor::fleet(&path, &ctx),
                    Err(e) => {
                        println!("doctor: {e}");
                        ExitCode::FAILURE
                    }
                },
                None => ExitCode::SUCCESS,
            };
            if binary == ExitCode::SUCCESS {
                fleet
            } else {
                binary
            }
        }
        Some(Command::Approve {
            server,
            digest,
            url,
            token_env,
        }) => run_async(async move {
            let target = cli::admin::AdminTarget { url, token_env };
            let answer = target.approve(&server, &digest).await?;
            println!("{}", serde_json::to_string_pretty(&answer)?);
            Ok(())
        }),
        Some(Command::Status { admin }) => run_async(async move {
            let answer = admin.target().status().await?;
            print_admin(admin.json, &answer, cli::admin::status_table)
        }),
        Some(Command::Catalog { admin }) => run_async(async move {
            let answer = admin.target().catalog().await?;
            print_admin(admin.json, &answer, cli::admin::catalog_table)
        }),
        Some(Command::Refresh { deadline_ms, admin }) => run_async(async move {
            let answer = admin.target().refresh(deadline_ms).await?;
            print_admin(admin.json, &answer, cli::admin::refresh_line)
        }),
    }
}
