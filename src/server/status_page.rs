//! The status page at `GET /`: server-rendered HTML over the served multiplexer, for a person.
//!
//! It shows what `multiplexer_status` and `list_catalog` show the same caller (children, breaker,
//! queues, restarts, the catalog generation and digest, drift, config problems) and a search box
//! over `find_tools` (`GET /?q=…`). No script, no external asset: one document with inline CSS,
//! refreshed by `<meta http-equiv="refresh">` while no search is shown, and a Content-Security-
//! Policy that forbids everything else. Authentication is the `/mcp` policy with the discover
//! scope (an `Authorization: Bearer` header, or the anonymous policy); the Host header must be a
//! loopback name or an `--allowed-host`, as on `/mcp`, so a DNS-rebinding page cannot read it.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;

use crate::auth::Credentials;
use crate::mux::{Caller, ClientCaps, FindToolsArgs, Multiplexer, Session};

#[derive(Clone)]
struct Page {
    mux: Arc<Multiplexer>,
    credentials: Arc<Credentials>,
    session: Arc<Session>,
    hosts: Arc<Vec<String>>,
}

/// Seconds between two automatic reloads of the page.
const REFRESH_SECONDS: u32 = 10;

/// The `/` router; `hosts` are the Host header values accepted (as for `/mcp`).
pub fn router(mux: Arc<Multiplexer>, credentials: Arc<Credentials>, hosts: Vec<String>) -> Router {
    let session = mux.open_session(Arc::new(super::rest::NoStream));
    Router::new().route("/", get(page)).with_state(Page {
        mux,
        credentials,
        session,
        hosts: Arc::new(hosts),
    })
}

#[derive(Deserialize)]
struct PageQuery {
    q: Option<String>,
}

fn html(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

fn refusal(status: StatusCode, code: &str) -> Response {
    html(
        status,
        format!(
            "<!doctype html><meta charset=utf-8><title>graph-os</title><p>graph-os status: <code>{}</code></p>\n",
            esc(code)
        ),
    )
}

async fn page(
    State(p): State<Page>,
    asker: super::rest::Asker,
    Query(q): Query<PageQuery>,
) -> Response {
    let identity = match asker.viewer(&p.hosts, &p.credentials).await {
        Ok(i) => i,
        Err((status, code)) => return refusal(status, code),
    };
    let caller = Caller::new(identity, p.session.clone(), ClientCaps::default());
    let status = match p.mux.status(&caller) {
        Ok(s) => s,
        Err(e) => return refusal(super::wire::http_status(&e), e.code()),
    };
    let query = q.q.map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    let found = match &query {
        Some(query) => Some(
            p.mux
                .find_tools(
                    &caller,
                    FindToolsArgs {
                        query: query.clone(),
                        top_k: 20,
                    },
                )
                .await
                .map_err(|e| e.code().to_string()),
        ),
        None => None,
    };
    html(StatusCode::OK, render(&status, query.as_deref(), found))
}

/// HTML-escapes text for element content and double-quoted attributes.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => String::new(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1b1b1b}\
h1{font-size:1.4em;margin:0 0 .3em}h2{font-size:1.1em;margin:1.4em 0 .4em}\
table{border-collapse:collapse;width:100%}th,td{border-bottom:1px solid #ddd;padding:.3em .5em;text-align:left;vertical-align:top}\
th{background:#f3f3f3}code{font-size:.92em}.up{color:#11700f}.failed,.open{color:#b00020}.starting,.restarting,.half_open{color:#9a6700}\
.id{color:#555}.err{color:#b00020}form{margin:.6em 0}input[type=search]{width:28em;padding:.3em}";

/// The whole document for `status` (a `multiplexer_status` answer) and an optional search.
fn render(
    status: &serde_json::Value,
    query: Option<&str>,
    found: Option<Result<crate::mux::FindToolsResult, String>>,
) -> String {
    let mut o = String::with_capacity(16 << 10);
    let id = &status["catalog_identity"];
    let _ = write!(
        o,
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>graph-os status</title>"
    );
    if query.is_none() {
        let _ = write!(o, "<meta http-equiv=refresh content={REFRESH_SECONDS}>");
    }
    let _ = write!(o, "<style>{STYLE}</style></head><body><h1>graph-os</h1>");
    let _ = write!(
        o,
        "<p class=id>release <code>{}</code> · replica <code>{}</code> · catalog generation <b id=generation>{}</b> · digest <code id=digest title=\"{}\">{}</code> · config revision <code>{}</code> · {} sessions · {} tools</p>",
        esc(&text(&id["release_id"])),
        esc(&text(&id["replica_id"])),
        esc(&text(&id["catalog_generation"])),
        esc(&text(&id["snapshot_digest"])),
        esc(text(&id["snapshot_digest"]).get(..16).unwrap_or("")),
        esc(&text(&id["config_revision"])),
        esc(&text(&status["sessions"])),
        esc(&text(&status["total_tools"])),
    );
    if let Some(e) = status.get("reload_error").filter(|e| !e.is_null()) {
        let _ = write!(o, "<p class=err>reload refused: {}</p>", esc(&text(e)));
    }
    let _ = write!(
        o,
        "<form method=get action=\"/\"><input type=search name=q maxlength=4096 placeholder=\"find tools: what do you want to do?\" value=\"{}\"> <button type=submit>find_tools</button></form>",
        esc(query.unwrap_or(""))
    );
    match found {
        Some(Ok(found)) => {
            let _ = write!(
                o,
                "<h2>find_tools: {} results ({})</h2><table id=found><tr><th>name</th><th>server</th><th>kind</th><th>score</th><th>description</th></tr>",
                found.count,
                esc(found.ranker)
            );
            for r in &found.results {
                let _ = write!(
                    o,
                    "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{:.4}</td><td>{}</td></tr>",
                    esc(&r.name),
                    esc(&r.server),
                    esc(r.kind),
                    r.score,
                    esc(&r.description)
                );
            }
            o.push_str("</table>");
            if !found.unavailable.is_empty() {
                let list: Vec<String> = found
                    .unavailable
                    .iter()
                    .map(|(s, c)| format!("{} ({})", esc(s), esc(c)))
                    .collect();
                let _ = write!(o, "<p>unavailable: {}</p>", list.join(", "));
            }
        }
        Some(Err(code)) => {
            let _ = write!(
                o,
                "<p class=err>find_tools: <code>{}</code></p>",
                esc(&code)
            );
        }
        None => {}
    }
    let _ = write!(
        o,
        "<h2>Children ({})</h2><table id=children><tr><th>server</th><th>state</th><th>breaker</th><th>in flight</th><th>queued</th><th>max</th><th>restarts</th><th>tools</th><th>protocol</th><th>drift</th><th>last error</th></tr>",
        esc(&text(&status["total_children"]))
    );
    if let Some(children) = status["children"].as_object() {
        for (name, c) in children {
            let state = text(&c["state"]);
            let breaker = text(&c["breaker"]);
            let drift = match &c["drift"] {
                serde_json::Value::Null => String::new(),
                d => d
                    .get("pending_digest")
                    .map(|p| format!("pending {}", text(p).get(..12).unwrap_or("")))
                    .unwrap_or_else(|| "approved".into()),
            };
            let last_error = match &c["last_error"] {
                serde_json::Value::Null => String::new(),
                e => {
                    let code = text(&e["code"]);
                    let message = text(&e["message"]);
                    if message.is_empty() {
                        code
                    } else {
                        format!("{code}: {message}")
                    }
                }
            };
            let _ = write!(
                o,
                "<tr data-server=\"{n}\"><td><b>{n}</b></td><td class=\"{s}\">{s}</td><td class=\"{b}\">{b}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=err>{}</td></tr>",
                esc(&text(&c["in_flight"])),
                esc(&text(&c["queued"])),
                esc(&text(&c["max_concurrency"])),
                esc(&text(&c["restarts"])),
                esc(&text(&c["tool_count"])),
                esc(&text(&c["protocol"])),
                esc(&drift),
                esc(&last_error),
                n = esc(name),
                s = esc(&state),
                b = esc(&breaker),
            );
        }
    }
    o.push_str("</table>");
    let issues = status["config_issues"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let _ = write!(o, "<h2>Config problems ({})</h2>", issues.len());
    if !issues.is_empty() {
        o.push_str("<table id=issues><tr><th>server</th><th>field</th><th>reason</th></tr>");
        for i in &issues {
            let _ = write!(
                o,
                "<tr><td>{}</td><td><code>{}</code></td><td>{}</td></tr>",
                esc(&text(&i["server"])),
                esc(&text(&i["field"])),
                esc(&text(&i["reason"]))
            );
        }
        o.push_str("</table>");
    }
    let _ = writeln!(
        o,
        "<p class=id>source <code>{}</code>; reloads every {REFRESH_SECONDS} s without a search. JSON: <code>GET /api/mcp/status</code>, <code>graph-os status</code>.</p></body></html>",
        esc(&text(&status["config_source"]))
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_names_errors_and_queries_is_escaped() {
        let status = serde_json::json!({
            "catalog_identity": {"catalog_generation": 3, "snapshot_digest": "ab".repeat(32)},
            "total_children": 1,
            "children": {"<x>": {"state": "failed", "breaker": "open",
                "last_error": {"code": "child-spawn-failed", "message": "<script>alert(1)</script>"}}},
            "config_issues": [{"server": "s", "field": "\"f\"", "reason": "<b>"}],
        });
        let page = render(&status, Some("\"><script>"), Some(Err("x".into())));
        assert!(!page.contains("<script>"), "{page}");
        assert!(page.contains("&lt;x&gt;"));
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(page.contains("value=\"&quot;&gt;&lt;script&gt;\""));
        assert!(
            !page.contains("http-equiv=refresh"),
            "no reload while a search is shown"
        );
    }

    #[test]
    fn the_page_lists_every_child_with_its_state_and_the_catalog_identity() {
        let status = serde_json::json!({
            "catalog_identity": {"catalog_generation": 7, "snapshot_digest": "cd".repeat(32)},
            "total_children": 2,
            "children": {"a": {"state": "up", "breaker": "closed", "tool_count": 4},
                         "b": {"state": "failed", "breaker": "open"}},
            "config_issues": [],
        });
        let page = render(&status, None, None);
        assert!(page.contains("data-server=\"a\"") && page.contains("data-server=\"b\""));
        assert!(page.contains("<b id=generation>7</b>"));
        assert!(page.contains(&"cd".repeat(32)));
        assert!(page.contains("http-equiv=refresh"));
    }
}
