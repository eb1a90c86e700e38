//! A client of a running gateway's admin API (`/api/mcp/...`), for the CLI's admin commands.
//!
//! The bearer token is read from an environment variable, never from the command line (where
//! `ps` would show it), and never printed.

use anyhow::{Context, bail};

/// What to do about a refusal whose answer carries no message (the catalog contract's errors
/// carry a code and whether a retry may help).
fn refusal_hint(code: &str, answer: &serde_json::Value) -> String {
    match code {
        "authorization-denied" => {
            "the token's scope is too small: status and catalog need discover, refresh and approve need manage".into()
        }
        _ if answer.get("retryable").and_then(|r| r.as_bool()) == Some(true) => {
            "the catalog moved on meanwhile; run the command again".into()
        }
        _ => "see docs/error-codes.md".into(),
    }
}

/// A refresh answer as one line: the generation served and whether it changed.
pub fn refresh_line(answer: &serde_json::Value) -> String {
    let generation = answer
        .get("catalog_generation")
        .and_then(|g| g.as_u64())
        .unwrap_or_default();
    let digest = answer
        .get("snapshot_digest")
        .and_then(|d| d.as_str())
        .unwrap_or_default();
    let changed = answer.get("changed").and_then(|c| c.as_bool()) == Some(true);
    format!(
        "catalog generation {generation} ({}), snapshot {}\n",
        if changed { "published" } else { "unchanged" },
        digest.get(..16).unwrap_or(digest)
    )
}

/// Where the gateway is and which credential to present.
#[derive(Debug, Clone)]
pub struct AdminTarget {
    /// Base URL, e.g. `http://127.0.0.1:8004`.
    pub url: String,
    /// Name of the environment variable holding the bearer token.
    pub token_env: String,
}

impl AdminTarget {
    fn token(&self) -> anyhow::Result<String> {
        match std::env::var(&self.token_env) {
            Ok(t) if !t.trim().is_empty() => Ok(t.trim().to_string()),
            _ => bail!(
                "set {} to a bearer token (discover scope to read, manage to refresh or approve; the admin API refuses anonymous callers)",
                self.token_env
            ),
        }
    }

    /// One request to `path` (a POST of `body` when given, else a GET); returns the JSON answer.
    /// A non-2xx answer is an error carrying the gateway's `code` and message.
    async fn request(
        &self,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> anyhow::Result<serde_json::Value> {
        graph_os::net::crypto::install_crypto();
        let url = format!("{}{path}", self.url.trim_end_matches('/'));
        // A refresh may probe every child for up to its 120 s deadline.
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(130))
            .build()?;
        let request = match body {
            Some(body) => client.post(&url).json(body),
            None => client.get(&url),
        };
        let response = request
            .bearer_auth(self.token()?)
            .send()
            .await
            .with_context(|| format!("cannot reach the gateway at {}", self.url))?;
        let status = response.status();
        let answer: serde_json::Value = response.json().await.unwrap_or_default();
        if !status.is_success() {
            let code = answer.get("code").and_then(|c| c.as_str()).unwrap_or("?");
            let message = answer
                .get("message")
                .and_then(|c| c.as_str())
                .filter(|m| !m.is_empty())
                .map(str::to_string)
                .unwrap_or_else(|| refusal_hint(code, &answer));
            bail!("{status}: {code}: {message}");
        }
        Ok(answer)
    }

    /// POSTs `body` to `path` (see [`AdminTarget::request`]).
    pub async fn post(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> anyhow::Result<serde_json::Value> {
        self.request(path, Some(body)).await
    }

    /// GETs `path` (see [`AdminTarget::request`]).
    pub async fn get(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        self.request(path, None).await
    }

    /// `multiplexer_status` of the running gateway.
    pub async fn status(&self) -> anyhow::Result<serde_json::Value> {
        self.get("/api/mcp/status").await
    }

    /// `list_catalog` (without tool rows) of the running gateway.
    pub async fn catalog(&self) -> anyhow::Result<serde_json::Value> {
        self.get("/api/mcp/catalog?include_tools=false").await
    }

    /// `catalog_refresh` against the identity the gateway serves now (read first), so the
    /// refresh is refused as stale if another admin published in between.
    pub async fn refresh(&self, deadline_ms: u64) -> anyhow::Result<serde_json::Value> {
        let catalog = self.catalog().await?;
        let id = catalog.get("catalog_identity").unwrap_or(&catalog);
        let field = |k: &str| id.get(k).cloned().unwrap_or_default();
        let request_id = format!(
            "cli-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or_default()
        );
        self.post(
            "/api/mcp/catalog/refresh",
            &serde_json::json!({
                "request_id": request_id,
                "expected_config_revision": field("config_revision"),
                "expected_catalog_generation": field("catalog_generation"),
                "expected_snapshot_digest": field("snapshot_digest"),
                "deadline_ms": deadline_ms,
            }),
        )
        .await
    }

    /// Approves `server`'s pending catalog `digest` (drift guard).
    pub async fn approve(&self, server: &str, digest: &str) -> anyhow::Result<serde_json::Value> {
        let path = format!(
            "/api/mcp/servers/{}/approve",
            url::form_urlencoded::byte_serialize(server.as_bytes()).collect::<String>()
        );
        self.post(&path, &serde_json::json!({"digest": digest}))
            .await
    }
}

fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "-".into(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Lays `rows` out under `head` in columns (the last column is not padded).
fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let n = cells.len();
        let mut out = String::new();
        for (i, (c, w)) in cells.into_iter().zip(&widths).enumerate() {
            if i + 1 == n {
                out.push_str(&c);
            } else {
                out.push_str(&format!("{c:<w$}  "));
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(head.iter().map(|h| h.to_string()).collect());
    for row in rows {
        out.push_str(&line(row.clone()));
    }
    out
}

/// The catalog identity as one line.
fn identity_line(id: &serde_json::Value) -> String {
    format!(
        "catalog generation {} digest {} config revision {} replica {} release {}\n",
        cell(&id["catalog_generation"]),
        cell(&id["snapshot_digest"]),
        cell(&id["config_revision"]),
        cell(&id["replica_id"]),
        cell(&id["release_id"]),
    )
}

/// `graph-os status` as text: the identity, a table of children, then config problems.
pub fn status_table(status: &serde_json::Value) -> String {
    let mut out = identity_line(&status["catalog_identity"]);
    let mut rows = Vec::new();
    if let Some(children) = status["children"].as_object() {
        for (name, c) in children {
            let error = match &c["last_error"] {
                serde_json::Value::Null => "-".to_string(),
                e => {
                    let code = cell(&e["code"]);
                    match e["message"].as_str() {
                        Some(m) if !m.is_empty() => format!("{code}: {m}"),
                        _ => code,
                    }
                }
            };
            rows.push(vec![
                name.clone(),
                cell(&c["state"]),
                cell(&c["breaker"]),
                format!("{}/{}", cell(&c["in_flight"]), cell(&c["max_concurrency"])),
                cell(&c["queued"]),
                cell(&c["restarts"]),
                cell(&c["tool_count"]),
                cell(&c["protocol"]),
                error,
            ]);
        }
    }
    out.push_str(&table(
        &[
            "SERVER",
            "STATE",
            "BREAKER",
            "IN-FLIGHT",
            "QUEUED",
            "RESTARTS",
            "TOOLS",
            "PROTOCOL",
            "LAST ERROR",
        ],
        &rows,
    ));
    out.push_str(&format!(
        "{} children, {} tools, {} sessions\n",
        cell(&status["total_children"]),
        cell(&status["total_tools"]),
        cell(&status["sessions"]),
    ));
    if let Some(issues) = status["config_issues"].as_array().filter(|i| !i.is_empty()) {
        out.push_str("config problems:\n");
        for i in issues {
            out.push_str(&format!(
                "  {} {}: {}\n",
                cell(&i["server"]),
                cell(&i["field"]),
                cell(&i["reason"])
            ));
        }
    }
    if let Some(e) = status.get("reload_error").filter(|e| !e.is_null()) {
        out.push_str(&format!("reload refused: {}\n", cell(e)));
    }
    out
}

/// `graph-os catalog` as text: the identity and one row per server.
pub fn catalog_table(catalog: &serde_json::Value) -> String {
    let mut out = identity_line(&catalog["catalog_identity"]);
    let mut rows = Vec::new();
    if let Some(servers) = catalog["servers"].as_array() {
        for s in servers {
            rows.push(vec![
                cell(&s["server"]),
                cell(&s["prefix"]),
                cell(&s["state"]),
                cell(&s["expose"]),
                cell(&s["tool_count"]),
                cell(&s["error"]["code"]),
            ]);
        }
    }
    out.push_str(&table(
        &["SERVER", "PREFIX", "STATE", "EXPOSE", "TOOLS", "ERROR"],
        &rows,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_table_has_a_row_per_child_and_keeps_the_whole_error() {
        let status = serde_json::json!({
            "catalog_identity": {"catalog_generation": 2, "snapshot_digest": "ab"},
            "total_children": 2, "total_tools": 3, "sessions": 0,
            "children": {
                "alpha": {"state": "up", "breaker": "closed", "in_flight": 0, "max_concurrency": 8,
                          "queued": 0, "restarts": 0, "tool_count": 3, "protocol": "2025-11-25"},
                "beta": {"state": "failed", "breaker": "open", "restarts": 4,
                         "last_error": {"code": "child-spawn-failed", "message": "Connection refused (os error 111)"}},
            },
            "config_issues": [{"server": "gamma", "field": "url", "reason": "bad"}],
        });
        let t = status_table(&status);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("generation 2"));
        assert!(lines[1].starts_with("SERVER"));
        assert!(lines[2].starts_with("alpha") && lines[2].contains("0/8"));
        assert!(
            lines[3].starts_with("beta")
                && lines[3].ends_with("child-spawn-failed: Connection refused (os error 111)")
        );
        assert!(t.contains("gamma url: bad"));
    }
}
