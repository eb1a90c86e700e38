//! A client of a running gateway's admin API (`/api/mcp/...`), for the CLI's admin commands.
//!
//! The bearer token is read from an environment variable, never from the command line (where
//! `ps` would show it), and never printed.

use anyhow::{Context, bail};

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
                "set {} to a bearer token with the manage scope (the admin API refuses anonymous callers)",
                self.token_env
            ),
        }
    }

    /// POSTs `body` to `path` and returns the JSON answer; a non-2xx answer is an error carrying
    /// the gateway's `code`.
    pub async fn post(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> anyhow::Result<serde_json::Value> {
        crate::transport::crypto::install_crypto();
        let url = format!("{}{path}", self.url.trim_end_matches('/'));
        let response = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(130))
            .build()?
            .post(&url)
            .bearer_auth(self.token()?)
            .json(body)
            .send()
            .await
            .with_context(|| format!("cannot reach the gateway at {}", self.url))?;
        let status = response.status();
        let answer: serde_json::Value = response.json().await.unwrap_or_default();
        if !status.is_success() {
            let code = answer.get("code").and_then(|c| c.as_str()).unwrap_or("?");
            let message = answer.get("message").and_then(|c| c.as_str()).unwrap_or("");
            bail!("{status}: {code}: {message}");
        }
        Ok(answer)
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
