//! Error messages fit for a log line or a status field: the whole cause chain, bounded without
//! losing the root cause, and free of a child's secret values.
//!
//! An error's `Display` is often only its outermost layer ("error sending request for url …");
//! what an operator needs ("Connection refused (os error 111)") is at the end of its
//! `source()` chain. [`error_chain`] joins the chain (skipping a layer whose text its parent
//! already shows), [`clip`] bounds a message by cutting from the middle, keeping its head and
//! its tail, and [`Redactor`] replaces known secret values before anything is logged or stored.

/// The text that stands for a removed secret value.
pub const REDACTED: &str = "[redacted]";

/// Shortest secret value a [`Redactor`] replaces: shorter ones ("1", "on") would turn ordinary
/// words into noise and are no credential.
pub const MIN_SECRET_LEN: usize = 4;

/// `err` and its `source()` chain, outermost first, joined with ": ". A source whose text the
/// message so far already contains is skipped (many errors print their source themselves).
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    let mut depth = 0;
    while let Some(e) = cur {
        depth += 1;
        if depth > 16 {
            break;
        }
        let text = e.to_string();
        if !text.is_empty() && !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = e.source();
    }
    out
}

/// `s` bounded to about `max` bytes: a longer one keeps its first and last parts around " … "
/// (the root cause of a chain is at its end). Cuts fall on character boundaries.
pub fn clip(s: &str, max: usize) -> String {
    const MARK: &str = " … ";
    if s.len() <= max {
        return s.to_string();
    }
    let budget = max.saturating_sub(MARK.len());
    let mut head = budget / 3;
    while !s.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = s.len() - (budget - head);
    while !s.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}{MARK}{}", &s[..head], &s[tail..])
}

/// The secret values of one child (resolved env and header references, client secrets): each is
/// replaced by [`REDACTED`] in any text passed through [`Redactor::apply`].
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    values: Vec<String>,
}

impl Redactor {
    /// Adds a resolved secret value, and the last word of a value of several words (the token
    /// of `Bearer <token>` also appears alone; the scheme word is no secret).
    pub fn add(&mut self, value: &str) {
        let mut push = |v: &str| {
            let v = v.trim();
            if v.len() >= MIN_SECRET_LEN && !self.values.iter().any(|known| known == v) {
                self.values.push(v.to_string());
            }
        };
        push(value);
        if let Some((_, last)) = value.trim().rsplit_once(char::is_whitespace) {
            push(last);
        }
        // Longest first: a value that contains another is replaced whole.
        self.values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    }

    /// Whether no value is known.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `text` with every known value replaced.
    pub fn apply(&self, text: &str) -> String {
        let mut out = text.to_string();
        for v in &self.values {
            if out.contains(v.as_str()) {
                out = out.replace(v.as_str(), REDACTED);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);
    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn the_chain_ends_with_the_root_cause() {
        let e = Layer(
            "error sending request",
            Some(Box::new(Layer(
                "client error (Connect)",
                Some(Box::new(Layer("Connection refused (os error 111)", None))),
            ))),
        );
        assert_eq!(
            error_chain(&e),
            "error sending request: client error (Connect): Connection refused (os error 111)"
        );
    }

    #[test]
    fn clipping_keeps_head_and_tail() {
        let long = format!(
            "initialize failed: {}: Connection refused",
            "x".repeat(1000)
        );
        let c = clip(&long, 300);
        assert!(c.len() <= 300, "{}", c.len());
        assert!(c.starts_with("initialize failed"));
        assert!(c.ends_with("Connection refused"));
        assert_eq!(clip("short", 300), "short");
        let wide = "é".repeat(400);
        assert!(clip(&wide, 101).len() <= 101);
    }

    #[test]
    fn secrets_are_replaced() {
        let mut r = Redactor::default();
        r.add("Bearer s3cr3t-token");
        r.add("ab");
        assert_eq!(
            r.apply("auth Bearer s3cr3t-token, again s3cr3t-token, ab"),
            "auth [redacted], again [redacted], ab"
        );
    }
}
