//! Raw JSON-RPC clients for `graph-os bench`: the same minimal client work over stdio (one line
//! out, lines in until the answer) and over HTTP (`throughput::RpcSession`, one keep-alive
//! connection), so the HTTP front is compared with the stdio front without either client's
//! library cost in the ratio.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::throughput::RpcSession;

/// One MCP session over a child process's stdio, as a raw line client.
pub(super) struct LineSession {
    _child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: BufReader<tokio::process::ChildStdout>,
    next: u64,
    line: String,
}

impl LineSession {
    /// Starts `program` and opens a 2025-06-18 session with it.
    pub(super) async fn open(cmd: &mut tokio::process::Command) -> anyhow::Result<Self> {
        let mut child = cmd
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            anyhow::bail!("the child's pipes are missing");
        };
        let mut s = LineSession {
            _child: child,
            stdin,
            stdout: BufReader::new(stdout),
            next: 0,
            line: String::new(),
        };
        s.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "graph-os-bench", "version": "0"}}),
        )
        .await?;
        s.stdin
            .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
            .await?;
        Ok(s)
    }

    /// Sends one request and reads lines until its answer; returns its `result`.
    pub(super) async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.next += 1;
        let id = self.next;
        let mut out = serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )?;
        out.push(b'\n');
        self.stdin.write_all(&out).await?;
        loop {
            self.line.clear();
            let n = self.stdout.read_line(&mut self.line).await?;
            anyhow::ensure!(n > 0, "{method}: the server closed its stdout");
            let msg: Value =
                serde_json::from_str(&self.line).with_context(|| format!("{method}: not JSON"))?;
            if msg.get("method").is_none() && msg["id"] == json!(id) {
                if let Some(e) = msg.get("error") {
                    anyhow::bail!("{method}: {e}");
                }
                return Ok(msg["result"].clone());
            }
        }
    }
}

/// A raw client over either transport.
pub(super) enum RawClient {
    /// stdio.
    Line(Box<LineSession>),
    /// streamable HTTP, one keep-alive connection (reqwest).
    Http(RpcSession),
    /// streamable HTTP, one keep-alive connection, HTTP/1.1 by hand.
    Wire(WireSession),
}

impl RawClient {
    async fn call(&mut self, tool: &str, args: &Value) -> anyhow::Result<Value> {
        let params = json!({"name": tool, "arguments": args});
        let r = match self {
            RawClient::Line(s) => s.request("tools/call", params).await?,
            RawClient::Http(s) => s.request("tools/call", params).await?,
            RawClient::Wire(s) => s.request("tools/call", params).await?,
        };
        anyhow::ensure!(r["isError"] != json!(true), "{tool} failed: {r}");
        Ok(r)
    }

    /// Lists tools until `tool` is there (the child comes up behind the gateway).
    pub(super) async fn wait_for_tool(&mut self, tool: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let listed = match self {
                RawClient::Line(s) => s.request("tools/list", json!({})).await?,
                RawClient::Http(s) => s.request("tools/list", json!({})).await?,
                RawClient::Wire(s) => s.request("tools/list", json!({})).await?,
            };
            if listed["tools"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["name"] == tool))
            {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "{tool} never appeared");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `calls` sequential calls of `tool`, timed one by one.
    pub(super) async fn measure(
        &mut self,
        tool: &str,
        calls: usize,
    ) -> anyhow::Result<Vec<Duration>> {
        let args = json!({"a": 2, "b": 3});
        let mut times = Vec::with_capacity(calls);
        for _ in 0..calls {
            let t = Instant::now();
            self.call(tool, &args).await?;
            times.push(t.elapsed());
        }
        Ok(times)
    }
}

/// One MCP session over streamable HTTP on one keep-alive TCP connection, with HTTP/1.1
/// written and read by hand (`httparse` for the head): as little client work per request as
/// [`LineSession`] does over stdio, so the two fronts are compared on their own cost.
pub(super) struct WireSession {
    stream: tokio::net::TcpStream,
    head: String,
    token: Option<String>,
    session: Option<String>,
    next: u64,
    buf: Vec<u8>,
}

impl WireSession {
    /// Connects to `http://127.0.0.1:{port}/mcp` and opens a 2025-06-18 session.
    pub(super) async fn open(port: u16, token: Option<&str>) -> anyhow::Result<Self> {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true)?;
        let mut s = WireSession {
            stream,
            head: format!("127.0.0.1:{port}"),
            token: token.map(str::to_string),
            session: None,
            next: 0,
            buf: Vec::with_capacity(16 << 10),
        };
        s.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "graph-os-bench", "version": "0"}}),
        )
        .await?;
        s.send(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .await?;
        s.read_response().await?;
        Ok(s)
    }

    async fn send(&mut self, body: &[u8]) -> anyhow::Result<()> {
        use std::fmt::Write;
        let mut req = String::with_capacity(256);
        write!(
            req,
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
            self.head,
            body.len()
        )?;
        if let Some(t) = &self.token {
            write!(req, "Authorization: Bearer {t}\r\n")?;
        }
        if let Some(id) = &self.session {
            write!(
                req,
                "Mcp-Session-Id: {id}\r\nMcp-Protocol-Version: 2025-06-18\r\n"
            )?;
        }
        req.push_str("\r\n");
        let mut out = req.into_bytes();
        out.extend_from_slice(body);
        self.stream.write_all(&out).await?;
        Ok(())
    }

    /// Reads one response: its status and body (de-chunked).
    async fn read_response(&mut self) -> anyhow::Result<(u16, Vec<u8>)> {
        use tokio::io::AsyncReadExt;
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut resp = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(head_len) = resp.parse(&self.buf)? {
                let status = resp.code.unwrap_or(0);
                let mut length = None;
                let mut chunked = false;
                for h in resp.headers.iter() {
                    if h.name.eq_ignore_ascii_case("content-length") {
                        length = std::str::from_utf8(h.value)?.trim().parse::<usize>().ok();
                    } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                        chunked = h.value.eq_ignore_ascii_case(b"chunked");
                    } else if h.name.eq_ignore_ascii_case("mcp-session-id") {
                        self.session = Some(std::str::from_utf8(h.value)?.to_string());
                    }
                }
                self.buf.drain(..head_len);
                let body = if chunked {
                    self.read_chunked().await?
                } else {
                    let n = length.unwrap_or(0);
                    while self.buf.len() < n {
                        self.fill().await?;
                    }
                    self.buf.drain(..n).collect()
                };
                return Ok((status, body));
            }
            let mut chunk = [0u8; 8192];
            let n = self.stream.read(&mut chunk).await?;
            anyhow::ensure!(n > 0, "the server closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    async fn fill(&mut self) -> anyhow::Result<()> {
        use tokio::io::AsyncReadExt;
        let mut chunk = [0u8; 8192];
        let n = self.stream.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "the server closed the connection");
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    async fn read_chunked(&mut self) -> anyhow::Result<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                self.fill().await?;
            };
            let size = usize::from_str_radix(
                std::str::from_utf8(&self.buf[..line_end])?
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .trim(),
                16,
            )?;
            self.buf.drain(..line_end + 2);
            while self.buf.len() < size + 2 {
                self.fill().await?;
            }
            body.extend(self.buf.drain(..size));
            self.buf.drain(..2);
            if size == 0 {
                return Ok(body);
            }
        }
    }

    /// Sends one request and returns its `result` (JSON or SSE answers).
    pub(super) async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.next += 1;
        let id = self.next;
        let body = serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )?;
        self.send(&body).await?;
        let (status, body) = self.read_response().await?;
        anyhow::ensure!(
            (200..300).contains(&status),
            "{method}: HTTP {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(300)])
        );
        let msg: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(_) => super::throughput::sse_answer(&body, id)
                .with_context(|| format!("{method}: no answer in the stream"))?,
        };
        if let Some(e) = msg.get("error") {
            anyhow::bail!("{method}: {e}");
        }
        Ok(msg["result"].clone())
    }
}
