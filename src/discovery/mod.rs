//! Tool search for `find_tools`: a field-weighted BM25 index over exposed names, descriptions
//! and parameter names/descriptions.
//!
//! Written here rather than pulled from a search crate: the corpus is small (thousands of
//! tools), rebuilt on every catalog change, and BM25F over three fields is ~100 lines; a full
//! text-search engine would dominate the dependency tree and build time.

use std::collections::HashMap;

/// One searchable document.
#[derive(Debug, Clone)]
pub struct Doc {
    /// Exposed name (the key returned by searches).
    pub key: String,
    /// Name text (original and exposed).
    pub name: String,
    /// Description.
    pub description: String,
    /// Parameter names and descriptions.
    pub params: String,
}

const FIELD_WEIGHTS: [f64; 3] = [3.0, 1.0, 0.6];
const K1: f64 = 1.2;
const B: f64 = 0.75;

const STOP: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "how", "i", "in", "is", "it",
    "me", "my", "of", "on", "or", "please", "that", "the", "this", "to", "use", "want", "what",
    "with", "you", "your", "can",
];

/// Lowercased word tokens: split on non-alphanumerics and camelCase humps, stop words removed,
/// light plural folding (`numbers` → `number`).
pub fn tokenize(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut prev_lower = false;
    let flush = |cur: &mut String, out: &mut Vec<String>| {
        if !cur.is_empty() {
            let t = std::mem::take(cur).to_lowercase();
            if !STOP.contains(&t.as_str()) {
                out.push(stem(&t));
            }
        }
    };
    for c in text.chars() {
        if c.is_alphanumeric() {
            if c.is_uppercase() && prev_lower {
                flush(&mut cur, &mut out);
            }
            prev_lower = c.is_lowercase() || c.is_ascii_digit();
            cur.push(c);
        } else {
            flush(&mut cur, &mut out);
            prev_lower = false;
        }
    }
    flush(&mut cur, &mut out);
    out
}

fn stem(t: &str) -> String {
    if t.len() > 4 && t.ends_with("ies") {
        return format!("{}y", &t[..t.len() - 3]);
    }
    if t.len() > 3 && t.ends_with('s') && !t.ends_with("ss") && !t.ends_with("us") {
        return t[..t.len() - 1].to_string();
    }
    t.to_string()
}

/// Per-document term frequencies and lengths, one entry per field.
type FieldStats = ([HashMap<String, u32>; 3], [usize; 3]);

/// An immutable BM25F index.
#[derive(Debug, Default)]
pub struct Index {
    docs: Vec<(String, FieldStats)>,
    avg_len: [f64; 3],
    df: HashMap<String, usize>,
}

/// One search hit.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    /// Document key.
    pub key: String,
    /// BM25F score (> 0).
    pub score: f64,
}

impl Index {
    /// Builds an index over `docs`.
    pub fn build(docs: &[Doc]) -> Index {
        let mut index = Index::default();
        let mut totals = [0usize; 3];
        for d in docs {
            let fields = [
                tokenize(&d.name),
                tokenize(&d.description),
                tokenize(&d.params),
            ];
            let mut tf: [HashMap<String, u32>; 3] = Default::default();
            let mut lens = [0usize; 3];
            let mut seen = std::collections::HashSet::new();
            for (i, toks) in fields.iter().enumerate() {
                lens[i] = toks.len();
                totals[i] += toks.len();
                for t in toks {
                    *tf[i].entry(t.clone()).or_default() += 1;
                    if seen.insert(t.clone()) {
                        *index.df.entry(t.clone()).or_default() += 1;
                    }
                }
            }
            index.docs.push((d.key.clone(), (tf, lens)));
        }
        let n = docs.len().max(1) as f64;
        index.avg_len = totals.map(|t| (t as f64 / n).max(1.0));
        index
    }

    /// Number of documents.
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    /// Top `k` documents for `query`, best first; ties broken by key for determinism.
    pub fn search(&self, query: &str, k: usize) -> Vec<Hit> {
        let mut terms = tokenize(query);
        terms.sort();
        terms.dedup();
        let n = self.docs.len() as f64;
        let mut hits: Vec<Hit> = self
            .docs
            .iter()
            .filter_map(|(key, (tf, lens))| {
                let mut score = 0.0;
                for t in &terms {
                    let df = *self.df.get(t).unwrap_or(&0) as f64;
                    if df == 0.0 {
                        continue;
                    }
                    let idf = ((n - df + 0.5) / (df + 0.5) + 1.0).ln();
                    let mut weighted_tf = 0.0;
                    for f in 0..3 {
                        let raw = *tf[f].get(t).unwrap_or(&0) as f64;
                        if raw > 0.0 {
                            weighted_tf += FIELD_WEIGHTS[f] * raw
                                / (1.0 - B + B * lens[f] as f64 / self.avg_len[f]);
                        }
                    }
                    score += idf * weighted_tf / (K1 + weighted_tf);
                }
                (score > 0.0).then(|| Hit {
                    key: key.clone(),
                    score,
                })
            })
            .collect();
        hits.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.key.cmp(&b.key)));
        hits.truncate(k);
        hits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(key: &str, desc: &str, params: &str) -> Doc {
        Doc {
            key: key.into(),
            name: key.into(),
            description: desc.into(),
            params: params.into(),
        }
    }

    #[test]
    fn tokenizer_splits_humps_and_folds_plurals() {
        assert_eq!(tokenize("getSum of Numbers"), vec!["get", "sum", "number"]);
        assert_eq!(
            tokenize("ev__get-tiny-image"),
            vec!["ev", "get", "tiny", "image"]
        );
    }

    #[test]
    fn ranks_the_matching_tool_first() {
        let idx = Index::build(&[
            doc(
                "ev__echo",
                "Echoes back the input",
                "message Message to echo",
            ),
            doc(
                "ev__get-sum",
                "Returns the sum of two numbers",
                "a First number b Second number",
            ),
            doc("ev__get-tiny-image", "Returns a tiny image", ""),
        ]);
        let hits = idx.search("add two numbers", 3);
        assert_eq!(hits[0].key, "ev__get-sum");
        assert!(idx.search("zzz", 3).is_empty());
    }
}
