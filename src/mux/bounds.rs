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
    };
    for (k, v) in args {
        walk.string(k)?;
        walk.bytes += 2;
        walk.value(v, 1)?;
    }
    Ok(())
}

struct Walk<'a> {
    limits: &'a ArgumentLimits,
    bytes: u64,
    items: u64,
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
}
