//! stdio child processes: minimal environment, process group, bounded stderr drain.

use std::collections::BTreeMap;
use std::process::Stdio;

use process_wrap::tokio::{CommandWrap, KillOnDrop, ProcessGroup};
use rmcp::transport::TokioChildProcess;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::TransportError;
use crate::config::StdioSpec;

/// Parent variables a stdio child inherits (DESIGN §9); everything else of the parent stays out.
pub const ENV_ALLOWLIST: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "NO_PROXY"];
/// Prefixes of parent variables a stdio child inherits.
pub const ENV_ALLOWLIST_PREFIXES: &[&str] = &["SSL_CERT_", "XDG_"];

/// Longest stderr line kept (bytes); longer lines are truncated.
const STDERR_LINE_MAX: usize = 4096;

/// The environment a child gets: allowlisted parent variables, then its declared, resolved env.
pub fn child_environment(
    spec: &StdioSpec,
    parent: impl IntoIterator<Item = (String, String)>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, String>, TransportError> {
    let mut env: BTreeMap<String, String> = parent
        .into_iter()
        .filter(|(k, _)| {
            ENV_ALLOWLIST.contains(&k.as_str())
                || ENV_ALLOWLIST_PREFIXES.iter().any(|p| k.starts_with(p))
        })
        .collect();
    for (key, value) in &spec.env {
        env.insert(key.clone(), value.resolve(lookup)?);
    }
    Ok(env)
}

/// Spawns a stdio child and returns its MCP transport. Its stderr is drained into tracing at
/// debug level, line by line, bounded per line.
pub fn spawn(
    server: &str,
    spec: &StdioSpec,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<TokioChildProcess, TransportError> {
    let env = child_environment(spec, std::env::vars(), lookup)?;
    let mut cmd = tokio::process::Command::new(&spec.command);
    cmd.args(&spec.args).env_clear().envs(&env);
    if let Some(cwd) = &spec.cwd {
        cmd.current_dir(cwd);
    }
    let mut wrap = CommandWrap::from(cmd);
    // A process group so wrappers like `npx` take their grandchildren down with them.
    wrap.wrap(ProcessGroup::leader()).wrap(KillOnDrop);
    let (proc, stderr) = TokioChildProcess::builder(wrap)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| TransportError::Spawn {
            command: spec.command.clone(),
            reason: e.to_string(),
        })?;
    if let Some(stderr) = stderr {
        let server = server.to_string();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        buf.truncate(STDERR_LINE_MAX);
                        let line = String::from_utf8_lossy(&buf);
                        tracing::debug!(target: "graph_os::child_stderr", server = %server, "{}", line.trim_end());
                    }
                }
            }
        });
    }
    Ok(proc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::SecretValue;

    #[test]
    fn only_allowlisted_parent_variables_cross() {
        let spec = StdioSpec {
            command: "x".into(),
            args: vec![],
            env: [(
                "GITHUB_TOKEN".to_string(),
                SecretValue::parse("env://ALIAS").unwrap(),
            )]
            .into(),
            cwd: None,
        };
        let parent = [
            ("PATH", "/bin"),
            ("AWS_SECRET_ACCESS_KEY", "canary"),
            ("XDG_CONFIG_HOME", "/x"),
            ("ALIAS", "resolved"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let env = child_environment(&spec, parent, &|k| {
            (k == "ALIAS").then(|| "resolved".into())
        })
        .unwrap();
        assert_eq!(env.get("PATH").map(String::as_str), Some("/bin"));
        assert_eq!(env.get("XDG_CONFIG_HOME").map(String::as_str), Some("/x"));
        assert_eq!(
            env.get("GITHUB_TOKEN").map(String::as_str),
            Some("resolved")
        );
        assert!(!env.contains_key("AWS_SECRET_ACCESS_KEY"));
        assert!(!env.contains_key("ALIAS"));
    }

    #[test]
    fn a_missing_reference_fails_the_launch_closed() {
        let spec = StdioSpec {
            command: "x".into(),
            args: vec![],
            env: [("TOKEN".to_string(), SecretValue::parse("${NOPE}").unwrap())].into(),
            cwd: None,
        };
        let err = child_environment(&spec, [], &|_| None).unwrap_err();
        assert_eq!(err.code(), "secret-unavailable");
    }
}
