//! Wire marks for what rmcp does not model of 2025-11-25 Tasks (SEP-1686).
//!
//! rmcp 3.11 models only the 2026-07-28 tasks extension: it drops a 2025 server's
//! `capabilities.tasks` and a tool's `execution` while parsing, and a 2025 client's task
//! requests (`tasks/get|result|list|cancel`, task-augmented `tools/call`) never reach a handler
//! in their 2025 shape. graph-os keeps them with marks, rewritten on the raw JSON lines beneath
//! rmcp (written here rather than forking rmcp: a few fields, checked with a substring search
//! before anything is parsed, so other messages pass untouched):
//!
//! - **child → graph-os** ([`mark_child_message`]): `capabilities.tasks` is kept under
//!   `capabilities.experimental["io.graph-os/tasks"]`, a tool's `execution` under its
//!   `_meta["io.graph-os/execution"]` (so it travels with the catalog and its digest).
//! - **client → graph-os** ([`mark_front_request`]): the task requests are renamed into the
//!   `graph-os/tasks/…` custom methods the handler serves.
//! - **graph-os → client** ([`unmark_front_message`]): the marks become the 2025 fields again.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use serde_json::Value;

use super::needle::Needle;
use tokio::io::{AsyncRead, ReadBuf};

/// `capabilities.experimental` key carrying a child's (or graph-os's) 2025 `capabilities.tasks`.
pub const TASKS_MARK: &str = "io.graph-os/tasks";
/// `_meta` key of the task a message relates to (2025-11-25 Tasks).
pub const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";
/// Tool `_meta` key carrying the tool's 2025 `execution` (`taskSupport`).
pub const EXECUTION_MARK: &str = "io.graph-os/execution";
/// Prefix of the custom methods a 2025 task request is renamed into.
pub const METHOD_PREFIX: &str = "graph-os/";
/// The 2025-11-25 task status notification.
pub const TASK_STATUS_NOTIFICATION: &str = "notifications/tasks/status";
/// The custom method of a task-augmented `tools/call`.
pub const CALL_METHOD: &str = "graph-os/tasks/call";

static TASKS_KEY: Needle = Needle::new(b"\"tasks\"");
static EXECUTION_KEY: Needle = Needle::new(b"\"execution\"");
static TASKS_METHOD: Needle = Needle::new(b"tasks/");
static TASK_KEY: Needle = Needle::new(b"\"task\"");
static MARK: Needle = Needle::new(b"io.graph-os/");

/// A child's response line with `capabilities.tasks` or tool `execution` marked; `None` when
/// nothing needs marking (the line is passed on unchanged).
pub fn mark_child_message(line: &[u8]) -> Option<Vec<u8>> {
    if !TASKS_KEY.found_in(line) && !EXECUTION_KEY.found_in(line) {
        return None;
    }
    let mut msg: Value = serde_json::from_slice(line).ok()?;
    let result = msg.get_mut("result")?.as_object_mut()?;
    let mut changed = false;
    if let Some(caps) = result
        .get_mut("capabilities")
        .and_then(Value::as_object_mut)
        && let Some(tasks) = caps.get("tasks").filter(|t| t.is_object()).cloned()
    {
        let experimental = caps
            .entry("experimental")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(e) = experimental.as_object_mut() {
            e.insert(TASKS_MARK.into(), tasks);
            changed = true;
        }
    }
    if let Some(tools) = result.get_mut("tools").and_then(Value::as_array_mut) {
        for tool in tools.iter_mut().filter_map(Value::as_object_mut) {
            let Some(execution) = tool.get("execution").filter(|e| e.is_object()).cloned() else {
                continue;
            };
            let meta = tool
                .entry("_meta")
                .or_insert_with(|| Value::Object(Default::default()));
            if let Some(m) = meta.as_object_mut() {
                m.insert(EXECUTION_MARK.into(), execution);
                changed = true;
            }
        }
    }
    changed.then(|| serde_json::to_vec(&msg).ok()).flatten()
}

/// A client's request line with its 2025 task request renamed into a `graph-os/tasks/…`
/// method; `None` when it is not one.
pub fn mark_front_request(line: &[u8]) -> Option<Vec<u8>> {
    if !TASKS_METHOD.found_in(line) && !TASK_KEY.found_in(line) {
        return None;
    }
    let mut msg: Value = serde_json::from_slice(line).ok()?;
    mark_front_value(&mut msg).then(|| serde_json::to_vec(&msg).ok())?
}

/// [`mark_front_request`] on a parsed message (the HTTP front parses bodies once).
pub fn mark_front_value(msg: &mut Value) -> bool {
    let Some(obj) = msg.as_object_mut() else {
        return false;
    };
    if obj.get("id").is_none() {
        return false;
    }
    // A 2026-07-28 request (its `_meta` names its version) is rmcp's own: that era has no
    // 2025 task requests.
    if obj
        .get("params")
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get("io.modelcontextprotocol/protocolVersion"))
        .is_some()
    {
        return false;
    }
    let renamed = match obj.get("method").and_then(Value::as_str) {
        Some("tools/call")
            if obj
                .get("params")
                .and_then(|p| p.get("task"))
                .is_some_and(Value::is_object) =>
        {
            CALL_METHOD.to_string()
        }
        Some(m @ ("tasks/get" | "tasks/result" | "tasks/list" | "tasks/cancel")) => {
            format!("{METHOD_PREFIX}{m}")
        }
        _ => return false,
    };
    obj.insert("method".into(), Value::String(renamed));
    true
}

/// A line graph-os sends a 2025 client with its marks turned back into `capabilities.tasks`
/// and tool `execution`; `None` when it carries none.
/// Whether `bytes` may hold a task mark (nothing to unmark otherwise).
pub fn may_hold_marks(bytes: &[u8]) -> bool {
    MARK.found_in(bytes)
}

pub fn unmark_front_message(line: &[u8]) -> Option<Vec<u8>> {
    if !MARK.found_in(line) {
        return None;
    }
    let mut msg: Value = serde_json::from_slice(line).ok()?;
    let result = msg.get_mut("result")?.as_object_mut()?;
    let mut changed = false;
    if let Some(caps) = result
        .get_mut("capabilities")
        .and_then(Value::as_object_mut)
    {
        let tasks = caps
            .get_mut("experimental")
            .and_then(Value::as_object_mut)
            .and_then(|e| e.remove(TASKS_MARK));
        if let Some(tasks) = tasks {
            if caps
                .get("experimental")
                .and_then(Value::as_object)
                .is_some_and(|e| e.is_empty())
            {
                caps.remove("experimental");
            }
            caps.insert("tasks".into(), tasks);
            changed = true;
        }
    }
    if let Some(tools) = result.get_mut("tools").and_then(Value::as_array_mut) {
        for tool in tools.iter_mut().filter_map(Value::as_object_mut) {
            let execution = tool
                .get_mut("_meta")
                .and_then(Value::as_object_mut)
                .and_then(|m| m.remove(EXECUTION_MARK));
            if let Some(execution) = execution {
                if tool
                    .get("_meta")
                    .and_then(Value::as_object)
                    .is_some_and(|m| m.is_empty())
                {
                    tool.remove("_meta");
                }
                tool.insert("execution".into(), execution);
                changed = true;
            }
        }
    }
    changed.then(|| serde_json::to_vec(&msg).ok()).flatten()
}

/// A consumer of complete lines (see [`MappedLines::with_tap`]). Its second argument says
/// whether lines are held ahead of this one (read, not yet handed to the reader); `false`
/// means every earlier line has been handed out.
pub type LineTap = std::sync::Arc<dyn Fn(&[u8], bool) -> Tapped + Send + Sync>;

/// What a [`LineTap`] did with a line.
#[derive(Debug, PartialEq, Eq)]
pub enum Tapped {
    /// Not its own: the line goes on (through `map`).
    Pass,
    /// Taken: nothing goes on.
    Taken,
    /// Taken, and this line goes on in its place (unmapped).
    Replaced(Vec<u8>),
}

/// Capacity of handed-out lines kept between reads.
const RETAINED_OUT: usize = 64 * 1024;

/// An `AsyncRead` of newline-delimited JSON whose complete lines pass through `map` (a line it
/// returns `Some` for is replaced). Lines are held until complete: the reader beneath bounds
/// them (`BoundedLines` for a child; the front's request bound for stdin).
pub struct MappedLines<R> {
    inner: R,
    map: fn(&[u8]) -> Option<Vec<u8>>,
    /// Sees each complete line first and may take it (the forwarding hot path's raw responses
    /// and requests, see `transport::raw_link` and `server::fast`).
    tap: Option<LineTap>,
    /// Bytes read but not yet part of a complete line.
    partial: Vec<u8>,
    /// Complete (mapped) lines not yet handed out, from `out_pos`.
    out: Vec<u8>,
    out_pos: usize,
    eof: bool,
    /// Longest line held (bytes); a longer one fails the stream.
    max: usize,
}

impl<R> MappedLines<R> {
    /// Wraps `inner`, passing each line through `map`.
    pub fn new(inner: R, map: fn(&[u8]) -> Option<Vec<u8>>) -> Self {
        MappedLines {
            inner,
            map,
            tap: None,
            partial: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            eof: false,
            max: usize::MAX,
        }
    }

    /// Offers every complete line to `tap` before `map`; lines it takes are not passed on.
    pub fn with_tap(mut self, tap: LineTap) -> Self {
        self.tap = Some(tap);
        self
    }

    /// Fails the stream once a line exceeds `max` bytes (nothing longer is held).
    pub fn with_max_line(mut self, max: usize) -> Self {
        self.max = max;
        self
    }

    fn take_lines(&mut self) {
        let Some(last) = memchr::memrchr(b'\n', &self.partial) else {
            return;
        };
        let rest = self.partial.split_off(last + 1);
        let complete = std::mem::replace(&mut self.partial, rest);
        if self.out_pos >= self.out.len() {
            self.out.clear();
            // One large message (a catalog of thousands of tools) must not pin its size for the
            // connection's life: memory per child stays at the common case (bench memory).
            self.out.shrink_to(RETAINED_OUT);
            self.out_pos = 0;
        }
        for line in complete.split_inclusive(|b| *b == b'\n') {
            let body = line.strip_suffix(b"\n").unwrap_or(line);
            let ahead = self.out_pos < self.out.len();
            match self
                .tap
                .as_ref()
                .map_or(Tapped::Pass, |tap| tap(body, ahead))
            {
                Tapped::Pass => {}
                Tapped::Taken => continue,
                Tapped::Replaced(other) => {
                    self.out.extend_from_slice(&other);
                    self.out.push(b'\n');
                    continue;
                }
            }
            match (self.map)(body) {
                Some(mapped) => {
                    self.out.extend_from_slice(&mapped);
                    self.out.push(b'\n');
                }
                None => self.out.extend_from_slice(line),
            }
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for MappedLines<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.out_pos < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.out_pos);
                buf.put_slice(&this.out[this.out_pos..this.out_pos + n]);
                this.out_pos += n;
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // A last line without a newline is passed on as it is.
                let rest = std::mem::take(&mut this.partial);
                if rest.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                this.out = rest;
                this.out_pos = 0;
                continue;
            }
            let mut chunk = [0u8; 16 * 1024];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) => {
                    let filled = read.filled();
                    if filled.is_empty() {
                        this.eof = true;
                    } else {
                        this.partial.extend_from_slice(filled);
                        this.take_lines();
                        if this.partial.len() > this.max {
                            this.partial = Vec::new();
                            return Poll::Ready(Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!("a line exceeded {} bytes", this.max),
                            )));
                        }
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::io::AsyncReadExt;

    fn to_value(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn a_childs_task_capability_and_tool_execution_survive_as_marks_and_come_back() {
        let init = json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-11-25",
            "capabilities":{"tools":{},"tasks":{"list":{},"cancel":{},"requests":{"tools":{"call":{}}}}},
            "serverInfo":{"name":"x","version":"1"}}});
        let marked = to_value(&mark_child_message(init.to_string().as_bytes()).unwrap());
        assert_eq!(
            marked["result"]["capabilities"]["experimental"][TASKS_MARK]["requests"]["tools"]["call"],
            json!({})
        );
        let back = to_value(&unmark_front_message(&serde_json::to_vec(&marked).unwrap()).unwrap());
        assert!(back["result"]["capabilities"].get("experimental").is_none());
        assert_eq!(back["result"]["capabilities"]["tasks"]["list"], json!({}));

        let list = json!({"jsonrpc":"2.0","id":1,"result":{"tools":[
            {"name":"slow","inputSchema":{"type":"object"},"execution":{"taskSupport":"required"}},
            {"name":"quick","inputSchema":{"type":"object"}}]}});
        let marked = to_value(&mark_child_message(list.to_string().as_bytes()).unwrap());
        assert_eq!(
            marked["result"]["tools"][0]["_meta"][EXECUTION_MARK]["taskSupport"],
            "required"
        );
        assert!(marked["result"]["tools"][1].get("_meta").is_none());
        let back = to_value(&unmark_front_message(&serde_json::to_vec(&marked).unwrap()).unwrap());
        assert_eq!(
            back["result"]["tools"][0]["execution"]["taskSupport"],
            "required"
        );
        assert!(back["result"]["tools"][0].get("_meta").is_none());
    }

    #[test]
    fn lines_without_task_fields_pass_unchanged() {
        let call =
            br#"{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"tasks"}]}}"#;
        assert!(mark_child_message(call).is_none());
        assert!(unmark_front_message(call).is_none());
        assert!(
            mark_front_request(
                br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"}}"#
            )
            .is_none()
        );
        // A notification is never renamed (only requests have answers to route).
        assert!(
            mark_front_request(br#"{"jsonrpc":"2.0","method":"tasks/get","params":{}}"#).is_none()
        );
    }

    #[test]
    fn a_clients_task_requests_become_the_graph_os_methods() {
        let call = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","task":{"ttl":1000}}}"#;
        assert_eq!(
            to_value(&mark_front_request(call).unwrap())["method"],
            CALL_METHOD
        );
        for m in ["tasks/get", "tasks/result", "tasks/list", "tasks/cancel"] {
            let line =
                format!(r#"{{"jsonrpc":"2.0","id":"x","method":"{m}","params":{{"taskId":"t"}}}}"#);
            let renamed = to_value(&mark_front_request(line.as_bytes()).unwrap());
            assert_eq!(renamed["method"], format!("graph-os/{m}"));
            assert_eq!(renamed["params"]["taskId"], "t");
        }
        // 2026-07-28 requests are rmcp's own.
        let modern = br#"{"jsonrpc":"2.0","id":3,"method":"tasks/get","params":{"taskId":"t","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        assert!(mark_front_request(modern).is_none());
        assert!(
            mark_front_request(br#"{"jsonrpc":"2.0","id":2,"method":"tasks/update","params":{}}"#)
                .is_none()
        );
    }

    #[tokio::test]
    async fn mapped_lines_rewrite_whole_lines_across_reads() {
        let list = json!({"jsonrpc":"2.0","id":1,"result":{"tools":[
            {"name":"slow","inputSchema":{},"execution":{"taskSupport":"optional"}}]}})
        .to_string();
        let input = format!("{{\"a\":1}}\n{list}\n{{\"b\":2}}");
        // One byte per read: lines are still rewritten whole.
        let (mut w, r) = tokio::io::duplex(1);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            w.write_all(input.as_bytes()).await.unwrap();
        });
        let mut out = String::new();
        MappedLines::new(r, mark_child_message)
            .read_to_string(&mut out)
            .await
            .unwrap();
        writer.await.unwrap();
        let lines: Vec<&str> = out.split('\n').collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], "{\"a\":1}");
        assert_eq!(
            to_value(lines[1].as_bytes())["result"]["tools"][0]["_meta"][EXECUTION_MARK]["taskSupport"],
            "optional"
        );
        assert_eq!(lines[2], "{\"b\":2}");
    }

    #[tokio::test]
    async fn a_tap_knows_whether_lines_are_held_ahead_of_the_one_it_sees() {
        use std::sync::Arc;
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let tap: LineTap = {
            let seen = seen.clone();
            Arc::new(move |line: &[u8], ahead| {
                seen.lock()
                    .unwrap()
                    .push((String::from_utf8_lossy(line).into_owned(), ahead));
                if line == b"taken" {
                    Tapped::Taken
                } else {
                    Tapped::Pass
                }
            })
        };
        let (mut w, r) = tokio::io::duplex(1024);
        // Read the way rmcp's transport reads: through a BufReader, a line at a time.
        let mut reader = BufReader::new(MappedLines::new(r, mark_child_message).with_tap(tap));
        // Three lines in one read: the first has nothing ahead, the later ones have.
        w.write_all(b"{\"a\":1}\ntaken\n{\"b\":2}\n").await.unwrap();
        let mut line = String::new();
        reader.read_line(&mut line).await.unwrap();
        assert_eq!(line, "{\"a\":1}\n");
        line.clear();
        reader.read_line(&mut line).await.unwrap();
        assert_eq!(line, "{\"b\":2}\n");
        // Everything handed out and read: the next line has nothing ahead.
        w.write_all(b"taken\n{\"c\":3}\n").await.unwrap();
        line.clear();
        reader.read_line(&mut line).await.unwrap();
        assert_eq!(line, "{\"c\":3}\n");
        let seen: Vec<bool> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, ahead)| *ahead)
            .collect();
        assert_eq!(seen, [false, true, true, false, false]);
    }

    #[tokio::test]
    async fn a_large_line_does_not_pin_its_buffer_once_handed_out() {
        use tokio::io::AsyncWriteExt;
        let big = format!("{{\"pad\":\"{}\"}}\n", "x".repeat(2 * 1024 * 1024));
        let (mut w, r) = tokio::io::duplex(64 * 1024);
        let mut lines = MappedLines::new(r, mark_child_message);
        let (big_len, writer) = (
            big.len(),
            tokio::spawn(async move {
                w.write_all(big.as_bytes()).await.unwrap();
                w
            }),
        );
        let mut got = 0;
        let mut buf = vec![0u8; 64 * 1024];
        while got < big_len {
            got += lines.read(&mut buf).await.unwrap();
        }
        assert_eq!(got, big_len);
        assert!(
            lines.out.capacity() >= big_len,
            "the large line was held whole"
        );
        let mut w = writer.await.unwrap();
        w.write_all(b"{\"b\":2}\n").await.unwrap();
        let n = lines.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"{\"b\":2}\n");
        assert!(
            lines.out.capacity() <= RETAINED_OUT,
            "{}",
            lines.out.capacity()
        );
    }
}
