//! Fleet file compatibility: the MCP configuration files people already have drop in.
//!
//! Everything here runs on the raw JSON value *before* an entry is validated into a
//! [`super::ChildSpec`]: client shapes are rewritten into the canonical `mcpServers` shape (the
//! McpFleet CRD's [`super::ServerSpec`] stays the one strict schema), placeholders are expanded or
//! kept as references, and client-only keys become warnings. The section "Fleet file
//! compatibility" of docs/configuration.md is the user-facing description of every rule below.
//!
//! - **Text.** JSONC: `//` and `/* */` comments and trailing commas are blanked in place by
//!   `json-strip-comments` (the leanest well-kept option: one dependency, memchr, already in the
//!   tree; blanking keeps offsets, so serde_json's line and column still point into the file as
//!   written). A UTF-8 byte order mark is dropped (JSON and YAML).
//! - **Documents.** VS Code's `servers` is an alias of `mcpServers`; its `inputs` array declares
//!   the ids `${input:ID}` may name. `$schema` is accepted and ignored.
//! - **Entries.** `serverUrl` (Windsurf) and `httpUrl` (Gemini CLI, streamable HTTP) are
//!   aliases of `url`; `type` / `transportType` (VS Code, Claude Code, Cursor, Cline) select the
//!   transport; `enabled: false` is `disabled: true`; `timeout` may be a string with a unit
//!   (`"30s"`, `"1500ms"`, `"2m"`); `envFile` (Cursor, VS Code) loads a dotenv file for a stdio
//!   child; `description` is the list_catalog `hint` when no hint is given; `autoApprove`,
//!   `alwaysAllow`, `trust`, `gallery`, `version` and `dev` are accepted with a warning (no effect).
//! - **Placeholders.** `${VAR}`, `${env:VAR}`, `${VAR:-default}`, `${input:ID}`,
//!   `${workspaceFolder}`, `${workspaceFolderBasename}`, `${userHome}`, `${pathSeparator}` and
//!   `${/}`. In `command`, `args`, `url`, `cwd` and `envFile` they are expanded when the file is
//!   loaded (a missing variable refuses the entry at validate time, never at start). Credentials
//!   never go there: a variable whose name looks sensitive and a `password` input are refused in
//!   those fields (process lists and transport logs show them). In `env` and `headers` values,
//!   variables and inputs stay *references* resolved when the child starts (`${input:ID}` becomes
//!   `${GRAPH_OS_INPUT_<ID>}`; missing → that child fails closed with `secret-unavailable`), so a
//!   resolved credential never enters the config, logs, errors or status.
//! - **Names.** A server name outside `[A-Za-z0-9_.-]{1,128}` is normalized: each run of other
//!   characters becomes one `-`, leading/trailing `-`, `_` and `.` are trimmed, case is kept, at
//!   most 128 bytes; a name with nothing left becomes `server-<8 hex of its SHA-256>`. The name as
//!   written is kept as the display name. Two names normalizing to one are both refused.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{ConfigIssue, issue};
use crate::secrets;

/// Environment variable prefix of VS Code `${input:ID}` values.
pub const INPUT_ENV_PREFIX: &str = "GRAPH_OS_INPUT_";
/// Largest `envFile` accepted (bytes).
pub const MAX_ENV_FILE_BYTES: u64 = 1024 * 1024;

/// Where a document came from, for what depends on it (`${workspaceFolder}`, `envFile`).
#[derive(Clone, Copy)]
pub struct Origin<'a> {
    /// The fleet file (`None`: no file, e.g. an McpFleet resource).
    pub file: Option<&'a Path>,
    /// Environment lookup (the gateway's own environment outside tests).
    pub env: &'a dyn Fn(&str) -> Option<String>,
}

/// The gateway's environment.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

impl Origin<'static> {
    /// No file, the process environment.
    pub fn none() -> Self {
        Origin {
            file: None,
            env: &process_env,
        }
    }
}

impl Origin<'_> {
    /// `${workspaceFolder}`: the parent of the file's directory when that directory is
    /// `.vscode` or `.cursor` (the project those clients open), else the file's directory.
    pub fn workspace_folder(&self) -> Option<PathBuf> {
        let file = self.file?;
        let file = std::path::absolute(file).unwrap_or_else(|_| file.to_path_buf());
        let dir = file.parent()?.to_path_buf();
        match dir.file_name().and_then(|n| n.to_str()) {
            Some(".vscode" | ".cursor") => dir.parent().map(Path::to_path_buf).or(Some(dir)),
            _ => Some(dir),
        }
    }

    fn file_dir(&self) -> Option<PathBuf> {
        let file = self.file?;
        let file = std::path::absolute(file).unwrap_or_else(|_| file.to_path_buf());
        file.parent().map(Path::to_path_buf)
    }
}

/// Drops a UTF-8 byte order mark.
pub fn strip_bom(text: &str) -> &str {
    text.strip_prefix('\u{feff}').unwrap_or(text)
}

/// Parses JSON with comments and trailing commas (JSONC). Errors give the line and column in
/// the file as written and never quote its content.
pub fn parse_jsonc(text: &str) -> Result<Value, String> {
    let mut text = strip_bom(text).to_string();
    if json_strip_comments::strip(&mut text).is_err() {
        return Err("invalid JSON: unterminated comment".into());
    }
    serde_json::from_str::<Value>(&text).map_err(|e| {
        let message = e.to_string();
        let message = message
            .rsplit_once(" at line ")
            .map_or(message.as_str(), |(m, _)| m)
            .to_string();
        format!(
            "invalid JSON at line {}, column {}: {message}",
            e.line(),
            e.column()
        )
    })
}

/// The deterministic server name of a key as written (see the module documentation).
pub fn normalize_server_name(raw: &str) -> String {
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if !raw.is_empty() && raw.len() <= 128 && raw.chars().all(valid) {
        return raw.to_string();
    }
    let mut out = String::new();
    let mut replaced = false;
    for c in raw.chars() {
        if valid(c) {
            if c == '-' && out.ends_with('-') {
                continue;
            }
            out.push(c);
            replaced = false;
        } else if !replaced {
            if !out.ends_with('-') {
                out.push('-');
            }
            replaced = true;
        }
    }
    let trimmed = out.trim_matches(['-', '_', '.']);
    let mut name: String = trimmed.chars().take(128).collect();
    name.truncate(name.trim_end_matches(['-', '_', '.']).len());
    if name.is_empty() {
        let digest = crate::digest::sha256_hex(raw.as_bytes());
        return format!("server-{}", &digest[..8]);
    }
    name
}

/// A VS Code `inputs` declaration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InputSpec {
    /// `promptString`, `pickString` or `command` (VS Code); graph-os reads every input from the
    /// environment variable `GRAPH_OS_INPUT_<ID>` (ID uppercased, other characters `_`).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The id `${input:ID}` names.
    pub id: String,
    /// Shown by VS Code when it prompts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A secret: never expanded into `command`, `args`, `url` or `cwd`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub password: bool,
    /// VS Code's default answer (not used by graph-os).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    /// `pickString` choices (not used by graph-os).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<Value>,
    /// `command` inputs: the VS Code command (not used by graph-os).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// `command` inputs: its arguments (not used by graph-os).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
}

/// The environment variable an `${input:ID}` reads: `GRAPH_OS_INPUT_` + ID uppercased with every
/// character outside `[A-Z0-9]` replaced by `_`.
pub fn input_env_name(id: &str) -> String {
    let tail: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("{INPUT_ENV_PREFIX}{tail}")
}

/// Declared inputs by id (`password` flag).
pub type Inputs = BTreeMap<String, bool>;

/// Validates the top-level `inputs` array.
pub fn parse_inputs(
    value: Option<&Value>,
    issues: &mut Vec<ConfigIssue>,
    warnings: &mut Vec<ConfigIssue>,
) -> Inputs {
    let mut out = Inputs::new();
    let Some(value) = value else {
        return out;
    };
    let Some(list) = value.as_array() else {
        issues.push(issue(
            "",
            "inputs",
            "wrong type: expected an array of input declarations",
        ));
        return out;
    };
    const KNOWN: &[&str] = &[
        "type",
        "id",
        "description",
        "password",
        "default",
        "options",
        "command",
        "args",
    ];
    for (i, item) in list.iter().enumerate() {
        let field = format!("inputs[{i}]");
        if let Some(obj) = item.as_object() {
            for key in obj.keys().filter(|k| !KNOWN.contains(&k.as_str())) {
                warnings.push(issue(
                    "",
                    &format!("{field}.{key}"),
                    "unknown input key ignored",
                ));
            }
        }
        match serde_json::from_value::<InputSpec>(item.clone()) {
            Ok(input) => {
                let ok = !input.id.is_empty()
                    && input.id.len() <= 128
                    && input
                        .id
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
                if !ok {
                    issues.push(issue(
                        "",
                        &format!("{field}.id"),
                        "input ids must match [A-Za-z0-9_.-]{1,128}",
                    ));
                } else if out.insert(input.id.clone(), input.password).is_some() {
                    issues.push(issue(
                        "",
                        &format!("{field}.id"),
                        &format!("input id '{}' is declared twice", input.id),
                    ));
                }
            }
            Err(e) => {
                let sub = item
                    .as_object()
                    .and_then(|o| {
                        ["id", "password", "type", "description", "default"]
                            .into_iter()
                            .find(|k| {
                                o.get(*k).is_none_or(|v| match *k {
                                    "password" => !v.is_boolean(),
                                    _ => !v.is_string(),
                                }) && (o.contains_key(*k) || *k == "id")
                            })
                    })
                    .map(|k| format!("{field}.{k}"))
                    .unwrap_or(field.clone());
                issues.push(issue("", &sub, &super::spec::describe_serde_error(&e)));
            }
        }
    }
    out
}

/// An entry rewritten into the canonical shape, with what compatibility found.
#[derive(Debug, Default)]
pub struct Prepared {
    /// The canonical entry, ready for [`super::ServerSpec`].
    pub entry: Value,
    /// Variables of `envFile` (literal values, given to the child only; never logged).
    pub env_file: Vec<(String, String)>,
}

/// One placeholder inside `${…}`.
enum Placeholder<'a> {
    Var {
        name: &'a str,
        default: Option<&'a str>,
    },
    Input(&'a str),
    Predefined(&'a str),
    Unsupported,
}

fn valid_var(name: &str) -> bool {
    let mut b = name.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

fn classify(inner: &str) -> Placeholder<'_> {
    match inner {
        "workspaceFolder" | "workspaceFolderBasename" | "userHome" | "pathSeparator" | "/" => {
            return Placeholder::Predefined(inner);
        }
        _ => {}
    }
    if let Some(id) = inner.strip_prefix("input:") {
        return Placeholder::Input(id);
    }
    let body = inner.strip_prefix("env:").unwrap_or(inner);
    let (name, default) = match body.split_once(":-") {
        Some((n, d)) => (n, Some(d)),
        None => (body, None),
    };
    if valid_var(name) {
        Placeholder::Var { name, default }
    } else {
        Placeholder::Unsupported
    }
}

/// Splits a string into literal text and `${…}` bodies; `Err` on an unterminated `${`.
fn pieces(raw: &str) -> Result<Vec<(bool, &str)>, ()> {
    let mut out = Vec::new();
    let mut rest = raw;
    while let Some(start) = rest.find("${") {
        let Some(len) = rest[start..].find('}') else {
            return Err(());
        };
        if start > 0 {
            out.push((false, &rest[..start]));
        }
        out.push((true, &rest[start + 2..start + len]));
        rest = &rest[start + len + 1..];
    }
    if !rest.is_empty() {
        out.push((false, rest));
    }
    Ok(out)
}

struct Expander<'a> {
    server: &'a str,
    origin: Origin<'a>,
    inputs: &'a Inputs,
}

impl Expander<'_> {
    fn predefined(&self, what: &str, field: &str, issues: &mut Vec<ConfigIssue>) -> Option<String> {
        let value = match what {
            "workspaceFolder" => self
                .origin
                .workspace_folder()
                .map(|p| p.display().to_string()),
            "workspaceFolderBasename" => self
                .origin
                .workspace_folder()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())),
            "userHome" => (self.origin.env)("HOME"),
            _ => Some(std::path::MAIN_SEPARATOR.to_string()),
        };
        if value.is_none() {
            let why = if what == "userHome" {
                "HOME is not set".to_string()
            } else {
                "the fleet did not come from a file".to_string()
            };
            issues.push(issue(
                self.server,
                field,
                &format!("${{{what}}} cannot be resolved: {why}"),
            ));
        }
        value
    }

    fn input_known(&self, id: &str, field: &str, issues: &mut Vec<ConfigIssue>) -> Option<bool> {
        match self.inputs.get(id) {
            Some(password) => Some(*password),
            None => {
                issues.push(issue(
                    self.server,
                    field,
                    &format!("${{input:{id}}} names no declaration in `inputs`"),
                ));
                None
            }
        }
    }

    /// A reference resolved when the child starts whose variable is not set now.
    fn unset_warning(&self, var: &str, what: &str, field: &str, warnings: &mut Vec<ConfigIssue>) {
        if (self.origin.env)(var).is_none() {
            warnings.push(issue(
                self.server,
                field,
                &format!(
                    "{what} is not set here: unless it is set where graph-os runs, this child fails closed with secret-unavailable"
                ),
            ));
        }
    }

    /// Expands every placeholder now (`command`, `args`, `url`, `cwd`, `envFile`).
    fn now(&self, raw: &str, field: &str, issues: &mut Vec<ConfigIssue>) -> Option<String> {
        let Ok(parts) = pieces(raw) else {
            issues.push(issue(self.server, field, "unterminated ${ placeholder"));
            return None;
        };
        let before = issues.len();
        let mut out = String::new();
        for (placeholder, text) in parts {
            if !placeholder {
                out.push_str(text);
                continue;
            }
            let credential = |what: &str| {
                format!(
                    "{what} looks like a credential and is not expanded into `{}` (process lists and logs show it): pass it in `env` (stdio) or `headers` (remote)",
                    field_root(field)
                )
            };
            match classify(text) {
                Placeholder::Predefined(what) => {
                    if let Some(v) = self.predefined(what, field, issues) {
                        out.push_str(&v);
                    }
                }
                Placeholder::Input(id) => {
                    let Some(password) = self.input_known(id, field, issues) else {
                        continue;
                    };
                    let var = input_env_name(id);
                    if password {
                        issues.push(issue(
                            self.server,
                            field,
                            &credential(&format!("${{input:{id}}} (a password input)")),
                        ));
                    } else if let Some(v) = (self.origin.env)(&var) {
                        out.push_str(&v);
                    } else {
                        issues.push(issue(
                            self.server,
                            field,
                            &format!("secret-unavailable: ${{input:{id}}} needs {var} to be set"),
                        ));
                    }
                }
                Placeholder::Var { name, default } => {
                    if secrets::is_sensitive_name(name) {
                        issues.push(issue(
                            self.server,
                            field,
                            &credential(&format!("${{{name}}}")),
                        ));
                        continue;
                    }
                    match ((self.origin.env)(name), default) {
                        (Some(v), Some(_)) if v.is_empty() => out.push_str(default.unwrap_or("")),
                        (Some(v), _) => out.push_str(&v),
                        (None, Some(d)) => out.push_str(d),
                        (None, None) => issues.push(issue(
                            self.server,
                            field,
                            &format!("${{{name}}} is not set (give a default with ${{{name}:-…}})"),
                        )),
                    }
                }
                Placeholder::Unsupported => issues.push(issue(
                    self.server,
                    field,
                    &format!("unsupported placeholder ${{{}}}", printable(text)),
                )),
            }
        }
        (issues.len() == before).then_some(out)
    }

    /// Rewrites an `env` / `headers` value: references stay references (resolved when the child
    /// starts), path placeholders are expanded.
    fn later(
        &self,
        raw: &str,
        field: &str,
        issues: &mut Vec<ConfigIssue>,
        warnings: &mut Vec<ConfigIssue>,
    ) -> Option<String> {
        let Ok(parts) = pieces(raw) else {
            // SecretValue::parse names the problem.
            return Some(raw.to_string());
        };
        let before = issues.len();
        let mut out = String::new();
        for (placeholder, text) in parts {
            if !placeholder {
                out.push_str(text);
                continue;
            }
            match classify(text) {
                Placeholder::Predefined(what) => {
                    if let Some(v) = self.predefined(what, field, issues) {
                        out.push_str(&v);
                    }
                }
                Placeholder::Input(id) => {
                    if self.input_known(id, field, issues).is_some() {
                        let var = input_env_name(id);
                        self.unset_warning(
                            &var,
                            &format!("${{input:{id}}} reads {var}, which"),
                            field,
                            warnings,
                        );
                        out.push_str(&format!("${{{var}}}"));
                    }
                }
                Placeholder::Var {
                    name,
                    default: None,
                } => {
                    self.unset_warning(name, &format!("${{{name}}}"), field, warnings);
                    out.push_str(&format!("${{{name}}}"));
                }
                Placeholder::Var {
                    name,
                    default: Some(d),
                } => {
                    // Set now: stays a reference; unset: the default written in the file.
                    if (self.origin.env)(name).is_some_and(|v| !v.is_empty()) {
                        out.push_str(&format!("${{{name}}}"));
                    } else {
                        out.push_str(d);
                    }
                }
                Placeholder::Unsupported => issues.push(issue(
                    self.server,
                    field,
                    &format!("unsupported placeholder ${{{}}}", printable(text)),
                )),
            }
        }
        (issues.len() == before).then_some(out)
    }
}

/// The top-level field of a path (`args[2]` → `args`).
fn field_root(field: &str) -> &str {
    field.split(['[', '.']).next().unwrap_or(field)
}

/// A placeholder body safe to echo: short, printable, and never a value (bodies are names).
fn printable(text: &str) -> String {
    let t: String = text.chars().filter(|c| !c.is_control()).take(64).collect();
    t
}

/// Keys client configurations carry that graph-os accepts without effect, and why.
const NO_EFFECT: &[(&str, &str)] = &[
    (
        "autoApprove",
        "has no effect: graph-os never prompts for tool approval (its clients approve calls; requiredScopes and disabledTools restrict them)",
    ),
    (
        "alwaysAllow",
        "has no effect: graph-os never prompts for tool approval (its clients approve calls; requiredScopes and disabledTools restrict them)",
    ),
    (
        "trust",
        "has no effect: graph-os never prompts for tool approval",
    ),
    ("gallery", "has no effect (VS Code gallery metadata)"),
    ("version", "has no effect (VS Code gallery metadata)"),
    ("dev", "has no effect (VS Code development mode)"),
];

fn transport_of(value: &Value) -> Option<&'static str> {
    match value.as_str()? {
        "stdio" => Some("stdio"),
        "http" | "streamable-http" | "streamableHttp" | "streamable_http" | "streamablehttp" => {
            Some("streamable-http")
        }
        "sse" => Some("sse"),
        _ => None,
    }
}

/// The duration fields besides `timeout` (which has its own milliseconds hint): each takes
/// seconds (a number) or a string with a unit, as `timeout` does.
const DURATION_KEYS: &[&str] = &[
    "initializationTimeout",
    "probeTimeout",
    "callTimeout",
    "queueTimeout",
    "restartWindow",
    "breakerCooldown",
    "sessionIdleTimeout",
    "relayTimeout",
];

/// What a duration field takes.
const DURATION_EXPECTED: &str =
    "expected seconds (a number) or a duration such as \"30s\", \"1500ms\", \"2m\"";

/// Seconds of a duration given as a string with a unit: `500ms`, `30s`, `2m`, `1h`, or a bare
/// number.
fn duration_seconds(text: &str) -> Option<f64> {
    let t = text.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num.trim().parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some(v * scale)
}

/// Rewrites one entry into the canonical shape. Problems go to `issues` (the entry is then
/// refused), keys without effect to `warnings`.
pub(super) fn prepare_entry(
    server: &str,
    entry: &Value,
    origin: Origin<'_>,
    inputs: &Inputs,
    issues: &mut Vec<ConfigIssue>,
    warnings: &mut Vec<ConfigIssue>,
) -> Prepared {
    let Some(obj) = entry.as_object() else {
        return Prepared {
            entry: entry.clone(),
            ..Default::default()
        };
    };
    let x = Expander {
        server,
        origin,
        inputs,
    };
    let mut out = Map::new();
    let mut transport: Option<(String, &'static str)> = None;
    let mut disabled: Option<(String, bool)> = None;
    let mut env_file: Option<String> = None;
    let url_keys: Vec<&str> = ["url", "serverUrl", "httpUrl"]
        .into_iter()
        .filter(|k| obj.contains_key(*k))
        .collect();
    for extra in url_keys.iter().skip(1) {
        issues.push(issue(
            server,
            extra,
            &format!(
                "both `{}` and `{extra}` give the URL; keep one",
                url_keys[0]
            ),
        ));
    }
    for (key, value) in obj {
        match key.as_str() {
            "serverUrl" | "httpUrl" | "url" => {
                if url_keys.first() != Some(&key.as_str()) {
                    continue;
                }
                if key == "httpUrl" && !obj.contains_key("type") && !obj.contains_key("transport") {
                    transport = Some((key.clone(), "streamable-http"));
                }
                out.insert("url".into(), value.clone());
            }
            "type" | "transportType" | "transport" => match transport_of(value) {
                Some(t) => {
                    if let Some((prev, other)) = &transport
                        && *other != t
                    {
                        issues.push(issue(
                            server,
                            key,
                            &format!("`{prev}` and `{key}` select different transports"),
                        ));
                    }
                    transport = Some((key.clone(), t));
                }
                None => issues.push(issue(
                    server,
                    key,
                    "unknown value: expected stdio, http (streamable-http, streamableHttp) or sse",
                )),
            },
            "enabled" | "disabled" => match value.as_bool() {
                Some(b) => {
                    let off = if key == "enabled" { !b } else { b };
                    if let Some((prev, other)) = &disabled
                        && *other != off
                    {
                        issues.push(issue(
                            server,
                            key,
                            &format!("`{prev}` and `{key}` disagree"),
                        ));
                    }
                    disabled = Some((key.clone(), off));
                }
                None => issues.push(issue(server, key, "wrong type: expected a boolean")),
            },
            "timeout" => match value {
                Value::String(s) => match duration_seconds(s) {
                    Some(secs) => {
                        out.insert(key.clone(), Value::from(secs));
                    }
                    None => issues.push(issue(server, key, DURATION_EXPECTED)),
                },
                _ => {
                    if let Some(n) = value.as_f64()
                        && n > 3600.0
                        && n.fract() == 0.0
                        && (n as u64).is_multiple_of(1000)
                    {
                        warnings.push(issue(
                            server,
                            key,
                            &format!(
                                "timeout is in seconds: {n} looks like milliseconds (write {} or \"{n}ms\")",
                                n / 1000.0
                            ),
                        ));
                    }
                    out.insert(key.clone(), value.clone());
                }
            },
            // One duration syntax for every timeout: seconds, or a string with a unit.
            k if DURATION_KEYS.contains(&k) => match value {
                Value::String(s) => match duration_seconds(s) {
                    Some(secs) => {
                        out.insert(key.clone(), Value::from(secs));
                    }
                    None => issues.push(issue(server, key, DURATION_EXPECTED)),
                },
                _ => {
                    out.insert(key.clone(), value.clone());
                }
            },
            "envFile" => match value.as_str() {
                Some(s) => env_file = Some(s.to_string()),
                None => issues.push(issue(server, key, "wrong type: expected a string")),
            },
            "description" => {
                if obj.contains_key("hint") {
                    warnings.push(issue(
                        server,
                        key,
                        "has no effect: `hint` is shown by list_catalog",
                    ));
                } else {
                    out.insert("hint".into(), value.clone());
                }
            }
            k => {
                if let Some((_, why)) = NO_EFFECT.iter().find(|(n, _)| *n == k) {
                    warnings.push(issue(server, key, why));
                } else {
                    out.insert(key.clone(), value.clone());
                }
            }
        }
    }
    if let Some((_, t)) = transport {
        out.insert("transport".into(), Value::from(t));
    }
    if let Some((_, off)) = disabled {
        out.insert("disabled".into(), Value::from(off));
    }
    if out.get("disabled").and_then(Value::as_bool) == Some(true) {
        // A disabled entry is not expanded (its variables need not be set).
        return Prepared {
            entry: Value::Object(out),
            ..Default::default()
        };
    }
    for key in ["command", "url", "cwd"] {
        if let Some(Value::String(s)) = out.get(key) {
            // On failure the value stays as written (the issue is reported once: the caller
            // drops later issues of a field this step already refused).
            if let Some(v) = x.now(s, key, issues) {
                out.insert(key.into(), Value::String(v));
            }
        }
    }
    if let Some(Value::Array(args)) = out.get("args") {
        let expanded: Vec<Value> = args
            .iter()
            .enumerate()
            .map(|(i, a)| match a {
                Value::String(s) => x
                    .now(s, &format!("args[{i}]"), issues)
                    .map_or_else(|| a.clone(), Value::String),
                other => other.clone(),
            })
            .collect();
        out.insert("args".into(), Value::Array(expanded));
    }
    for map in ["env", "headers"] {
        if let Some(Value::Object(m)) = out.get(map) {
            let rewritten: Map<String, Value> = m
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => (
                        k.clone(),
                        Value::String(
                            x.later(s, &format!("{map}.{k}"), issues, warnings)
                                .unwrap_or_else(|| s.clone()),
                        ),
                    ),
                    other => (k.clone(), other.clone()),
                })
                .collect();
            out.insert(map.into(), Value::Object(rewritten));
        }
    }
    let env_file = match env_file {
        None => Vec::new(),
        Some(_) if !obj.contains_key("command") => {
            issues.push(issue(
                server,
                "envFile",
                "applies to stdio children only (with `command`)",
            ));
            Vec::new()
        }
        Some(raw) => read_env_file(&x, &raw, issues),
    };
    Prepared {
        entry: Value::Object(out),
        env_file,
    }
}

/// Reads an `envFile`: dotenv syntax (`KEY=VALUE`, `export`, quotes, `#` comments), its path
/// relative to the fleet file's directory. Errors name the line and the variable, never a value.
fn read_env_file(
    x: &Expander<'_>,
    raw: &str,
    issues: &mut Vec<ConfigIssue>,
) -> Vec<(String, String)> {
    let server = x.server;
    let Some(expanded) = x.now(raw, "envFile", issues) else {
        return Vec::new();
    };
    let mut path = PathBuf::from(&expanded);
    if path.is_relative() {
        match x.origin.file_dir() {
            Some(dir) => path = dir.join(path),
            None => {
                issues.push(issue(
                    server,
                    "envFile",
                    "a relative path needs a fleet file to be relative to",
                ));
                return Vec::new();
            }
        }
    }
    let read = std::fs::metadata(&path).and_then(|m| {
        if m.len() > MAX_ENV_FILE_BYTES {
            Ok(None)
        } else {
            std::fs::read_to_string(&path).map(Some)
        }
    });
    let text = match read {
        Ok(Some(t)) => t,
        Ok(None) => {
            issues.push(issue(
                server,
                "envFile",
                &format!(
                    "{} is larger than {MAX_ENV_FILE_BYTES} bytes",
                    path.display()
                ),
            ));
            return Vec::new();
        }
        Err(e) => {
            issues.push(issue(
                server,
                "envFile",
                &format!("cannot read {}: {}", path.display(), e.kind()),
            ));
            return Vec::new();
        }
    };
    let mut out: Vec<(String, String)> = Vec::new();
    let mut seen = BTreeSet::new();
    for item in dotenvy::from_read_iter(strip_bom(&text).as_bytes()) {
        match item {
            Ok((key, value)) => {
                let valid = {
                    let mut b = key.bytes();
                    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
                        && key.len() <= 128
                        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
                };
                if !valid {
                    issues.push(issue(
                        server,
                        "envFile",
                        "a variable name does not match [A-Za-z_][A-Za-z0-9_]{0,127}",
                    ));
                } else if value.contains(['\0', '\r', '\n']) || value.len() > 65_536 {
                    issues.push(issue(
                        server,
                        "envFile",
                        &format!(
                            "the value of {key} contains NUL, CR or LF or is over 65536 bytes"
                        ),
                    ));
                } else if seen.insert(key.clone()) {
                    out.push((key, value));
                } else if let Some(slot) = out.iter_mut().find(|(k, _)| *k == key) {
                    // dotenv: the last assignment wins.
                    slot.1 = value;
                }
            }
            Err(dotenvy::Error::LineParse(line, index)) => {
                // The line itself may hold a credential: name its number only.
                let number = text
                    .lines()
                    .position(|l| l == line || l.trim() == line.trim())
                    .map_or_else(|| "?".to_string(), |n| (n + 1).to_string());
                issues.push(issue(
                    server,
                    "envFile",
                    &format!("line {number}, column {}: not KEY=VALUE", index + 1),
                ));
                return Vec::new();
            }
            Err(_) => {
                issues.push(issue(server, "envFile", "cannot be parsed"));
                return Vec::new();
            }
        }
    }
    if out.len() > 256 {
        issues.push(issue(server, "envFile", "more than 256 variables"));
        return Vec::new();
    }
    out
}

/// The fleet file as a whole, for `graph-os schema` (a file may hold more than an McpFleet's
/// strict `spec`: the compatibility keys above).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(
    title = "graph-os fleet file",
    description = "An MCP client configuration (Claude Desktop, Claude Code, Cursor, VS Code, Windsurf, Cline) with graph-os extensions. JSON with comments and trailing commas, or YAML."
)]
pub struct FleetFile {
    /// Any JSON Schema URL (ignored; lets editors complete the file).
    #[serde(rename = "$schema", default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// Servers by name (names outside `[A-Za-z0-9_.-]` are normalized; see the README).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mcp_servers: BTreeMap<String, super::ServerSpec>,
    /// VS Code's name for `mcpServers` (use one of the two).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub servers: BTreeMap<String, super::ServerSpec>,
    /// VS Code input declarations: `${input:ID}` reads `GRAPH_OS_INPUT_<ID>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<InputSpec>,
    /// Named TLS profiles an entry's `tlsProfile` refers to.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tls_profiles: BTreeMap<String, super::tls::TlsProfileSpec>,
}

/// Adds the compatibility keys to the entry schema (they are not part of the CRD).
fn file_schema_transform(schema: &mut schemars::Schema) {
    let Some(def) = schema
        .get_mut("$defs")
        .and_then(|d| d.get_mut("ServerSpec"))
        .and_then(|s| s.as_object_mut())
    else {
        return;
    };
    // A file entry has command or url (or an alias of url): not the CRD's CEL rule.
    def.remove("x-kubernetes-validations");
    let Some(props) = def.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    let transports = serde_json::json!({
        "type": "string",
        "enum": ["stdio", "streamable-http", "streamableHttp", "http", "sse"],
    });
    props.insert(
        "transport".into(),
        serde_json::json!({"description": "Transport: `stdio`, `streamable-http` (alias `http`, `streamableHttp`) or `sse`.", "anyOf": [transports.clone()]}),
    );
    let extra = serde_json::json!({
        "type": {"description": "Transport as VS Code, Claude Code, Cursor and Cline write it (alias of `transport`).", "anyOf": [transports.clone()]},
        "transportType": {"description": "Older Cline name of `type` (alias of `transport`).", "anyOf": [transports]},
        "serverUrl": {"description": "Windsurf's name of `url`.", "type": "string"},
        "httpUrl": {"description": "Gemini CLI's streamable HTTP `url`.", "type": "string"},
        "envFile": {"description": "A dotenv file whose variables are given to the stdio child (path relative to this file).", "type": "string"},
        "enabled": {"description": "`false` is `disabled: true`.", "type": "boolean"},
        "description": {"description": "Shown by list_catalog as the hint when `hint` is absent.", "type": "string"},
        "autoApprove": {"description": "Cline: accepted, no effect (graph-os never prompts for approval)."},
        "alwaysAllow": {"description": "Roo Code / Cline: accepted, no effect."},
        "trust": {"description": "Gemini CLI: accepted, no effect."},
        "gallery": {"description": "VS Code: accepted, no effect."},
        "version": {"description": "VS Code: accepted, no effect."},
        "dev": {"description": "VS Code: accepted, no effect."},
        "timeout": {"description": "Connect budget and default call timeout: seconds, or a string with a unit (\"30s\", \"1500ms\", \"2m\").", "anyOf": [{"type": "number", "format": "double"}, {"type": "string", "pattern": "^\\s*[0-9.]+\\s*(ms|s|m|h)?\\s*$"}]},
    });
    if let Value::Object(extra) = extra {
        props.extend(extra);
    }
    // Every duration takes the same syntax as `timeout` (see `DURATION_KEYS`).
    for key in DURATION_KEYS {
        if let Some(p) = props.get_mut(*key) {
            let description = p
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .trim_end_matches('.')
                .to_string();
            *p = serde_json::json!({
                "description": format!("{description}; or a string with a unit (\"30s\", \"1500ms\", \"2m\")."),
                "anyOf": [
                    {"type": "number", "format": "double"},
                    {"type": "string", "pattern": "^\\s*[0-9.]+\\s*(ms|s|m|h)?\\s*$"},
                    {"type": "null"}
                ]
            });
        }
    }
}

/// The JSON Schema of the fleet file (what `graph-os schema` prints and
/// `schema/mcp_config.schema.json` holds), pretty-printed with a final newline.
pub fn file_schema_json() -> String {
    let mut schema = schemars::schema_for!(FleetFile);
    // After generation: `$defs` exist only on the root schema.
    file_schema_transform(&mut schema);
    let mut text = serde_json::to_string_pretty(&schema).expect("a schema serializes");
    text.push('\n');
    text
}
