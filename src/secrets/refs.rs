//! `MCP_FLEET_SECRET_REFS`: a JSON object mapping aliases to references, so a fleet entry's
//! `env://ALIAS` can be served by Vault or a Kubernetes Secret without changing the fleet file.
//!
//! Resolution of `env://ALIAS` (seed contract §15): a live environment variable `ALIAS` wins;
//! otherwise the mapping's reference (`env://OTHER` → that variable; `vault://…`,
//! `secret://…` → the backend); absent from both → `secret-unavailable`. A malformed mapping
//! is reported once at startup (never echoing a value) and makes every alias that would need
//! it fail closed (`secret-unavailable`), rather than silently ignoring it.
//!
//! Rules: a JSON object, duplicate keys refused, ≤ 512 entries; aliases match
//! `[A-Z][A-Z0-9_]{0,127}` (no whitespace); every value is one reference (`env://`, `vault://`,
//! `secret://`; no `${…}` templates, no literal text); vault/secret paths without `..`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::RwLock;

use serde::de::{Deserializer, MapAccess, Visitor};

use super::SecretValue;

/// The environment variable holding the mapping.
pub const ENV: &str = "MCP_FLEET_SECRET_REFS";
/// Most entries accepted.
pub const MAX_ENTRIES: usize = 512;

/// A validated mapping.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetRefs {
    map: BTreeMap<String, SecretValue>,
}

impl FleetRefs {
    /// Entries in the mapping.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the mapping is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The reference an alias maps to.
    pub fn get(&self, alias: &str) -> Option<&SecretValue> {
        self.map.get(alias)
    }
}

fn valid_alias(a: &str) -> bool {
    let mut b = a.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_uppercase())
        && a.len() <= 128
        && b.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_')
}

/// Entries in document order, duplicates kept (so they can be refused).
struct Entries(Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object mapping aliases to references")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Entries, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, serde_json::Value>()? {
                    if out.len() > MAX_ENTRIES {
                        return Err(serde::de::Error::custom("too many entries"));
                    }
                    out.push((k, v));
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Parses and validates a mapping. Errors name the alias (or position) and the rule, never a
/// value.
pub fn parse(text: &str) -> Result<FleetRefs, String> {
    let entries: Entries = serde_json::from_str(text).map_err(|e| {
        if e.is_syntax() || e.is_eof() {
            format!(
                "{ENV} is not valid JSON (line {}, column {})",
                e.line(),
                e.column()
            )
        } else {
            format!(
                "{ENV} must be a JSON object of alias → reference (at most {MAX_ENTRIES} entries)"
            )
        }
    })?;
    if entries.0.len() > MAX_ENTRIES {
        return Err(format!("{ENV} has more than {MAX_ENTRIES} entries"));
    }
    let mut map = BTreeMap::new();
    for (i, (alias, value)) in entries.0.into_iter().enumerate() {
        if !valid_alias(&alias) {
            return Err(format!(
                "{ENV} entry {i}: aliases must match [A-Z][A-Z0-9_]{{0,127}}"
            ));
        }
        if map.contains_key(&alias) {
            return Err(format!("{ENV}: alias {alias} appears twice"));
        }
        let Some(text) = value.as_str() else {
            return Err(format!(
                "{ENV}: the value of {alias} must be a string reference"
            ));
        };
        let parsed = SecretValue::parse(text).ok().filter(|v| {
            v.is_bare_reference() && (v.env_aliases().count() + v.externals().count()) == 1
        });
        let Some(reference) = parsed else {
            return Err(format!(
                "{ENV}: the value of {alias} must be one env://, vault:// or secret:// reference"
            ));
        };
        map.insert(alias, reference);
    }
    Ok(FleetRefs { map })
}

static REFS: RwLock<Option<Result<FleetRefs, String>>> = RwLock::new(None);

/// Installs a mapping (or the error that makes it unusable).
pub fn set(refs: Result<FleetRefs, String>) {
    if let Ok(mut r) = REFS.write() {
        *r = Some(refs);
    }
}

/// Reads and validates `MCP_FLEET_SECRET_REFS` once at startup. `Ok(0)` when unset.
pub fn init_from_env() -> Result<usize, String> {
    let Ok(text) = std::env::var(ENV) else {
        set(Ok(FleetRefs::default()));
        return Ok(0);
    };
    let parsed = parse(&text);
    let out = parsed.as_ref().map(FleetRefs::len).map_err(Clone::clone);
    set(parsed);
    out
}

/// What the mapping says about an alias.
#[derive(Debug, Clone, PartialEq)]
pub enum Mapped {
    /// Not mapped.
    Absent,
    /// The mapping is malformed: fail closed.
    Broken,
    /// Mapped to this reference.
    To(SecretValue),
}

/// Looks an alias up in the installed mapping.
pub fn mapped(alias: &str) -> Mapped {
    let Ok(guard) = REFS.read() else {
        return Mapped::Broken;
    };
    match guard.as_ref() {
        None => Mapped::Absent,
        Some(Err(_)) => Mapped::Broken,
        Some(Ok(refs)) => refs.get(alias).cloned().map_or(Mapped::Absent, Mapped::To),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_are_validated_without_echoing_values() {
        let ok = parse(
            r#"{"GH_TOKEN": "vault://kv/gh#token", "DB": "secret://mcp/db#pw", "X": "env://Y"}"#,
        )
        .unwrap();
        assert_eq!(ok.len(), 3);
        for (bad, needle) in [
            (r#"{"GH": "literal-CANARY"}"#, "one env://"),
            (r#"{"GH": "Bearer ${CANARY}"}"#, "one env://"),
            (r#"{"GH": "${CANARY}"}"#, "one env://"),
            (r#"{"gh": "env://A"}"#, "aliases must match"),
            (r#"{" GH": "env://A"}"#, "aliases must match"),
            (r#"{"GH": "env://A", "GH": "env://B"}"#, "twice"),
            (r#"{"GH": "vault://../CANARY"}"#, "one env://"),
            (r#"{"GH": 5}"#, "string reference"),
            (r#"["CANARY"]"#, "JSON object"),
            (r#"{"GH": "CANARY"#, "not valid JSON"),
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains(needle), "{bad}: {err}");
            assert!(!err.contains("CANARY"), "{bad}: {err}");
        }
    }
}
