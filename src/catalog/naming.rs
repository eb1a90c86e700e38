//! Exposed names: deterministic server prefixes and `<prefix>__<name>` tool/prompt names.
//!
//! One name per item everywhere (find_tools, list_catalog, load_tools, tools/list, dispatch).

use std::collections::{BTreeMap, BTreeSet};

use crate::digest::sha256_hex;

/// Longest exposed name.
pub const MAX_NAME_LEN: usize = 64;
/// Separator between prefix and original name.
pub const SEPARATOR: &str = "__";

const NOISE: &[&str] = &[
    "mcp", "server", "agent", "api", "service", "srv", "tool", "tools",
];

/// Splits on non-alphanumerics and camelCase humps, lowercased.
fn tokens(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    for chunk in name
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|c| !c.is_empty())
    {
        let chars: Vec<char> = chunk.chars().collect();
        let mut cur = String::new();
        for (i, &c) in chars.iter().enumerate() {
            let hump = i > 0
                && c.is_ascii_uppercase()
                && (chars[i - 1].is_ascii_lowercase()
                    || (chars[i - 1].is_ascii_uppercase()
                        && chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase())));
            if hump && !cur.is_empty() {
                out.push(std::mem::take(&mut cur).to_ascii_lowercase());
            }
            cur.push(c);
        }
        if !cur.is_empty() {
            out.push(cur.to_ascii_lowercase());
        }
    }
    out
}

fn is_versionish(token: &str) -> bool {
    // ^[a-z]{0,4}\d+[a-z0-9]*$
    let letters = token.chars().take_while(|c| c.is_ascii_lowercase()).count();
    letters <= 4
        && token[letters..].starts_with(|c: char| c.is_ascii_digit())
        && token.chars().all(|c| c.is_ascii_alphanumeric())
}

/// The preferred prefix derived from a server name.
pub fn auto_prefix(server: &str) -> String {
    let all = tokens(server);
    let kept: Vec<String> = all
        .iter()
        .filter(|t| !NOISE.contains(&t.as_str()))
        .cloned()
        .collect();
    let toks = if kept.is_empty() { all } else { kept };
    if toks.is_empty() {
        return "mcp".into();
    }
    if toks.len() >= 2 && is_versionish(toks.last().unwrap()) {
        let initials: String = toks[..toks.len() - 1]
            .iter()
            .filter_map(|t| t.chars().next())
            .collect();
        return format!("{initials}_{}", toks.last().unwrap());
    }
    if toks.len() >= 2 {
        let acronym: String = toks
            .iter()
            .filter_map(|t| t.chars().next())
            .take(5)
            .collect();
        if acronym.len() >= 2 {
            return acronym;
        }
    }
    toks[0].chars().take(4).collect()
}

fn stem(server: &str) -> String {
    let s: String = server
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    s.trim_matches('_').to_string()
}

/// Assigns every server a prefix, deterministically: servers are taken in sorted order, the
/// first claimant keeps its preferred prefix (override or derived), later ones take the shortest
/// unused longer stem of their name, then `base2`, `base3`... An empty override (transparent)
/// claims nothing.
pub fn assign_prefixes(servers: &BTreeMap<String, Option<String>>) -> BTreeMap<String, String> {
    assign_prefixes_keeping(servers, &BTreeMap::new())
}

/// Like [`assign_prefixes`], but servers in `keep` retain the prefix they already have (used on
/// hot reload so untouched children keep their tool names); the rest are assigned around them.
pub fn assign_prefixes_keeping(
    servers: &BTreeMap<String, Option<String>>,
    keep: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = keep
        .iter()
        .filter(|(n, _)| servers.contains_key(*n))
        .map(|(n, p)| (n.clone(), p.clone()))
        .collect();
    let mut used: BTreeSet<String> = out.values().filter(|p| !p.is_empty()).cloned().collect();
    let servers: BTreeMap<String, Option<String>> = servers
        .iter()
        .filter(|(n, _)| !out.contains_key(*n))
        .map(|(n, o)| (n.clone(), o.clone()))
        .collect();
    // Explicit non-empty overrides claim first so a derived prefix never steals one.
    let ordered = servers
        .iter()
        .filter(|(_, o)| o.as_deref().is_some_and(|p| !p.is_empty()))
        .chain(
            servers
                .iter()
                .filter(|(_, o)| o.as_deref().is_none_or(str::is_empty)),
        );
    for (name, over) in ordered {
        if over.as_deref() == Some("") {
            out.insert(name.clone(), String::new());
            continue;
        }
        let base = over.clone().unwrap_or_else(|| auto_prefix(name));
        let chosen = if used.contains(&base) {
            let st = stem(name);
            (base.len() + 1..=st.len())
                .map(|n| st[..n].trim_end_matches('_').to_string())
                .find(|c| !c.is_empty() && !used.contains(c))
                .unwrap_or_else(|| {
                    (2..)
                        .map(|i| format!("{base}{i}"))
                        .find(|c| !used.contains(c))
                        .unwrap()
                })
        } else {
            base
        };
        used.insert(chosen.clone());
        out.insert(name.clone(), chosen);
    }
    out
}

/// Longest item name a child may list (the MCP 2025-11-25 tool-name guidance: 1..128).
pub const MAX_ITEM_NAME_LEN: usize = 128;

/// Stable code of an item left out because of its name or URI.
pub const ITEM_NAME_INVALID: &str = "item-name-invalid";

/// The name rule of tools and prompts (the keys clients call): 1..128 characters, each an ASCII
/// letter or digit, `_`, `-`, `.` or `/` (the MCP 2025-11-25 tool-name guidance). Strict ASCII
/// refuses by construction every control, invisible, bidi and confusable character (a Cyrillic
/// `а` in an otherwise Latin name): what a person reads is what is called. `Err` says why.
pub fn check_item_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("the name is empty");
    }
    if name.len() > MAX_ITEM_NAME_LEN {
        return Err("the name is longer than 128 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/'))
    {
        return Err("names use only ASCII letters, digits, '_', '-', '.' and '/'");
    }
    Ok(())
}

/// The rule of text a client shows but does not call by (resource and template names) and of
/// resource URIs: no control, invisible or bidi character ([`crate::telemetry::logs::needs_escape`]),
/// at most 1024 bytes; a URI (`uri: true`) is also non-empty and without whitespace.
pub fn check_display_text(text: &str, uri: bool) -> Result<(), &'static str> {
    if text.len() > 1024 {
        return Err("longer than 1024 bytes");
    }
    if text.chars().any(crate::telemetry::logs::needs_escape) {
        return Err("contains a control, invisible or bidi character");
    }
    if uri && (text.is_empty() || text.chars().any(char::is_whitespace)) {
        return Err("a URI is non-empty and has no whitespace");
    }
    Ok(())
}

/// The exposed name of an item: `<prefix>__<original>` (or `<original>` for an empty prefix),
/// at most 64 chars: longer names are truncated and get a short hash of the full name.
pub fn exposed_name(prefix: &str, original: &str) -> String {
    let full = if prefix.is_empty() {
        original.to_string()
    } else {
        format!("{prefix}{SEPARATOR}{original}")
    };
    if full.len() <= MAX_NAME_LEN {
        return full;
    }
    let hash = &sha256_hex(full.as_bytes())[..8];
    let mut cut = MAX_NAME_LEN - hash.len() - 1;
    while !full.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}_{hash}", &full[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_prefix_vectors() {
        for (name, want) in [
            ("systems-manager-mcp-edge101", "sm_edge101"),
            ("graph-os", "go"),
            ("repository-manager-mcp", "rm"),
            ("some-random-mcp-server", "sr"),
            ("NotionMCP", "noti"),
            ("weather-api", "weat"),
            ("container-manager-mcp", "cm"),
            ("mcp", "mcp"),
        ] {
            assert_eq!(auto_prefix(name), want, "{name}");
        }
    }

    #[test]
    fn collisions_resolve_deterministically_in_any_order() {
        let a: BTreeMap<String, Option<String>> = [
            ("weather-api", None),
            ("weather-service", None),
            ("weather", None),
        ]
        .map(|(k, v)| (k.to_string(), v))
        .into();
        let p = assign_prefixes(&a);
        assert_eq!(p["weather"], "weat");
        assert_eq!(p["weather-api"], "weath");
        assert_eq!(p["weather-service"], "weathe");
        let values: BTreeSet<_> = p.values().collect();
        assert_eq!(values.len(), 3, "{p:?}");
        // BTreeMap input is order-independent by construction; re-run gives the same answer.
        assert_eq!(assign_prefixes(&a), p);
    }

    #[test]
    fn overrides_win_and_empty_is_transparent() {
        let a: BTreeMap<String, Option<String>> = [
            ("alpha", Some("be".to_string())),
            ("beta-echo", None),
            ("t", Some(String::new())),
        ]
        .map(|(k, v)| (k.to_string(), v))
        .into();
        let p = assign_prefixes(&a);
        assert_eq!(p["alpha"], "be");
        assert_ne!(p["beta-echo"], "be");
        assert_eq!(p["t"], "");
    }

    #[test]
    fn item_names_follow_the_mcp_tool_name_rule() {
        let (longest, too_long) = ("x".repeat(128), "x".repeat(129));
        for ok in ["add", "get-file", "a.b/c_D9", longest.as_str()] {
            assert_eq!(check_item_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            too_long.as_str(),
            "evil\nname",
            "tab\tname",
            "esc\u{1b}[2J",
            "del\u{7f}",
            "c1\u{85}",
            "read_\u{202e}gpj.exe",
            "zero\u{200b}width",
            "iso\u{2066}late",
            // Cyrillic 'а' (U+0430) in an otherwise Latin name.
            "re\u{430}d_file",
            "with space",
            "caf\u{e9}",
        ] {
            assert!(check_item_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn display_text_refuses_control_invisible_and_bidi_characters() {
        assert_eq!(check_display_text("Project Files ö", false), Ok(()));
        assert_eq!(check_display_text("test://items/{id}", true), Ok(()));
        assert!(check_display_text("a\u{202e}b", false).is_err());
        assert!(check_display_text("a\nb", false).is_err());
        assert!(check_display_text("", true).is_err());
        assert!(check_display_text("a b", true).is_err());
    }

    #[test]
    fn long_names_are_truncated_with_a_hash() {
        let original = "x".repeat(100);
        let n = exposed_name("ab", &original);
        assert!(n.len() <= MAX_NAME_LEN);
        assert_ne!(n, exposed_name("ab", &"x".repeat(99)));
        assert_eq!(exposed_name("ab", "tool"), "ab__tool");
        assert_eq!(exposed_name("", "tool"), "tool");
    }
}
