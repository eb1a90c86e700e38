//! Bounds on forwarded tool-call arguments, checked before anything is sent to a child.
//!
//! One walk over the value measures depth, the number of JSON values, the longest string and an
//! upper estimate of the serialized size (strings and keys counted as their byte length plus
//! quotes, escapes ignored; scalars by their printed width), stopping at the first bound exceeded.

use crate::config::ArgumentLimits;

/// Checks `args` against `limits`; the error names the bound exceeded (never a value).
pub fn check_arguments(
    args: &serde_json::Map<String, serde_json::Value>,
    limits: &ArgumentLimits,
) -> Result<(), String> {
    let mut walk = Walk {
        limits,
        bytes: 2,
        items: 1,
        failure: None,
    };
    for (k, v) in args {
        walk.string(k)?;
        walk.bytes += 2;
        walk.value(v, 1)?;
    }
    Ok(())
}

/// [`check_arguments`] on raw JSON (the hot path), without building the value: the same walk,
/// the same estimate and the same messages, over serde's events. Arguments that are not a JSON
/// object are refused like an over-deep value would be: the typed path cannot take them either.
pub fn check_raw_arguments(
    args: &serde_json::value::RawValue,
    limits: &ArgumentLimits,
) -> Result<(), String> {
    use serde::de::DeserializeSeed;
    let mut walk = Walk {
        limits,
        bytes: 2,
        items: 1,
        failure: None,
    };
    let mut de = serde_json::Deserializer::from_str(args.get());
    let walked = RawSeed {
        walk: &mut walk,
        depth: 0,
    }
    .deserialize(&mut de);
    match (walked, walk.failure) {
        (Ok(()), _) => Ok(()),
        // The bound that stopped the walk, in the value walk's words.
        (Err(_), Some(message)) => Err(message),
        (Err(_), None) => Err("arguments are not a JSON object".to_string()),
    }
}

/// Keeps the first failure's message and stops serde's walk.
fn stop<E: serde::de::Error>(walk: &mut Walk<'_>, checked: Result<(), String>) -> Result<(), E> {
    checked.map_err(|message| {
        walk.failure.get_or_insert(message);
        E::custom("argument bound exceeded")
    })
}

/// One value of the raw walk at `depth` (0: the arguments object itself).
struct RawSeed<'w, 'a> {
    walk: &'w mut Walk<'a>,
    depth: u32,
}

impl<'de> serde::de::DeserializeSeed<'de> for RawSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for RawSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        self.scalar(5)
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        self.scalar(24)
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
        self.scalar(24)
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        self.scalar(24)
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.scalar(4)
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        self.top_level()?;
        let checked = self.depth_ok().and_then(|()| self.walk.string(v));
        stop(self.walk, checked)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.top_level()?;
        let entered = self.enter();
        stop(self.walk, entered)?;
        while seq
            .next_element_seed(BytePlus {
                walk: &mut *self.walk,
                depth: self.depth + 1,
            })?
            .is_some()
        {}
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        if self.depth > 0 {
            let entered = self.enter();
            stop(self.walk, entered)?;
        }
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let checked = self.walk.string(&key);
            stop(self.walk, checked)?;
            self.walk.bytes += 2;
            map.next_value_seed(RawSeed {
                walk: &mut *self.walk,
                depth: self.depth + 1,
            })?;
        }
        Ok(())
    }
}

impl RawSeed<'_, '_> {
    /// Only an object is a valid `arguments` value.
    fn top_level<E: serde::de::Error>(&self) -> Result<(), E> {
        if self.depth == 0 {
            return Err(E::invalid_type(
                serde::de::Unexpected::Other("non-object"),
                &"an object",
            ));
        }
        Ok(())
    }

    fn scalar<E: serde::de::Error>(self, bytes: u64) -> Result<(), E> {
        self.top_level()?;
        let checked = self.depth_ok().and_then(|()| self.walk.add(bytes));
        stop(self.walk, checked)
    }

    fn depth_ok(&self) -> Result<(), String> {
        if self.depth > self.walk.limits.max_depth {
            return Err(format!(
                "arguments nest deeper than {}",
                self.walk.limits.max_depth
            ));
        }
        Ok(())
    }

    /// An array or a nested object: its depth, then its own item (2 bytes).
    fn enter(&mut self) -> Result<(), String> {
        self.depth_ok()?;
        self.walk.add(2)
    }
}

/// An array element: one separator byte, then the value.
struct BytePlus<'w, 'a> {
    walk: &'w mut Walk<'a>,
    depth: u32,
}

impl<'de> serde::de::DeserializeSeed<'de> for BytePlus<'_, '_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.walk.bytes += 1;
        RawSeed {
            walk: self.walk,
            depth: self.depth,
        }
        .deserialize(d)
    }
}

struct Walk<'a> {
    limits: &'a ArgumentLimits,
    bytes: u64,
    items: u64,
    /// The raw walk's first failure (serde's error carries a position, not our words).
    failure: Option<String>,
}

impl Walk<'_> {
    fn add(&mut self, bytes: u64) -> Result<(), String> {
        self.bytes += bytes;
        self.items += 1;
        if self.items > self.limits.max_items {
            return Err(format!(
                "arguments hold more than {} JSON values",
                self.limits.max_items
            ));
        }
        if self.bytes > self.limits.max_bytes {
            return Err(format!(
                "arguments are larger than {} bytes",
                self.limits.max_bytes
            ));
        }
        Ok(())
    }

    fn string(&mut self, s: &str) -> Result<(), String> {
        if s.len() as u64 > self.limits.max_string_bytes {
            return Err(format!(
                "an argument string is longer than {} bytes",
                self.limits.max_string_bytes
            ));
        }
        self.add(s.len() as u64 + 2)
    }

    fn value(&mut self, v: &serde_json::Value, depth: u32) -> Result<(), String> {
        if depth > self.limits.max_depth {
            return Err(format!(
                "arguments nest deeper than {}",
                self.limits.max_depth
            ));
        }
        match v {
            serde_json::Value::Null => self.add(4),
            serde_json::Value::Bool(_) => self.add(5),
            serde_json::Value::Number(_) => self.add(24),
            serde_json::Value::String(s) => self.string(s),
            serde_json::Value::Array(items) => {
                self.add(2)?;
                for item in items {
                    self.bytes += 1;
                    self.value(item, depth + 1)?;
                }
                Ok(())
            }
            serde_json::Value::Object(map) => {
                self.add(2)?;
                for (k, item) in map {
                    self.string(k)?;
                    self.bytes += 2;
                    self.value(item, depth + 1)?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn file_contents_within_the_default_bounds_pass() {
        let text = "x".repeat(3 << 20);
        assert!(
            check_arguments(
                &args(json!({"path": "a.txt", "content": text})),
                &ArgumentLimits::default()
            )
            .is_ok()
        );
    }

    #[test]
    fn each_bound_is_enforced_and_named() {
        let l = ArgumentLimits {
            max_bytes: 1000,
            max_depth: 3,
            max_items: 10,
            max_string_bytes: 100,
        };
        let e = check_arguments(&args(json!({"s": "y".repeat(101)})), &l).unwrap_err();
        assert!(e.contains("longer than 100 bytes"), "{e}");
        let e = check_arguments(&args(json!({"a": {"b": {"c": {"d": 1}}}})), &l).unwrap_err();
        assert!(e.contains("deeper than 3"), "{e}");
        let e = check_arguments(&args(json!({"l": [1,2,3,4,5,6,7,8,9,10]})), &l).unwrap_err();
        assert!(e.contains("more than 10 JSON values"), "{e}");
        let many: Vec<String> = (0..11).map(|_| "z".repeat(99)).collect();
        let roomy = ArgumentLimits {
            max_items: 1000,
            ..l
        };
        let e = check_arguments(&args(json!({"l": many})), &roomy).unwrap_err();
        assert!(e.contains("larger than 1000 bytes"), "{e}");
        assert!(check_arguments(&args(json!({"a": {"b": [1, "two"]}})), &l).is_ok());
    }

    fn raw(v: &serde_json::Value) -> Box<serde_json::value::RawValue> {
        serde_json::value::to_raw_value(v).unwrap()
    }

    #[test]
    fn the_raw_walk_agrees_with_the_value_walk() {
        let l = ArgumentLimits {
            max_bytes: 1000,
            max_depth: 3,
            max_items: 10,
            max_string_bytes: 100,
        };
        let many: Vec<String> = (0..11).map(|_| "z".repeat(99)).collect();
        let roomy = ArgumentLimits {
            max_items: 1000,
            ..l
        };
        let cases = [
            (json!({"s": "y".repeat(101)}), l),
            (json!({"s": "y".repeat(100)}), l),
            (json!({"a": {"b": {"c": {"d": 1}}}}), l),
            (json!({"a": {"b": {"c": 1}}}), l),
            (json!({"a": [[[[1]]]]}), l),
            (json!({"a": [[[1]]]}), l),
            (json!({"l": [1,2,3,4,5,6,7,8,9,10]}), l),
            (json!({"l": [1,2,3,4,5,6,7,8]}), l),
            (json!({"l": many}), roomy),
            (json!({"a": {"b": [1, "two", null, true, 2.5, -3]}}), l),
            (json!({}), l),
            (json!({"esc": "\n\u{e9}\"".repeat(30)}), l),
        ];
        for (value, limits) in cases {
            let typed = check_arguments(value.as_object().unwrap(), &limits);
            let raw_checked = check_raw_arguments(&raw(&value), &limits);
            assert_eq!(typed, raw_checked, "{value}");
        }
    }

    #[test]
    fn raw_arguments_must_be_an_object() {
        let l = ArgumentLimits::default();
        for v in [json!([1]), json!("s"), json!(1), json!(null)] {
            assert!(check_raw_arguments(&raw(&v), &l).is_err(), "{v}");
        }
    }
}
