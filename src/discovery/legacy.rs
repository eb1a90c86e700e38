//! The BM25F ranker graph-os shipped before hybrid ranking, kept verbatim (three fields, plural
//! folding, the old document text) as the benchmark's baseline. Not used by find_tools.

use std::collections::HashMap;

/// One document of the old index.
#[derive(Debug, Clone)]
pub struct LegacyDoc {
    /// Key.
    pub key: String,
    /// `"{tool name} {server}"`.
    pub name: String,
    /// Description.
    pub description: String,
    /// `"{param} {description} "…`.
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

fn tokenize(text: &str) -> Vec<String> {
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

type FieldStats = ([HashMap<String, u32>; 3], [usize; 3]);

/// The old whole-corpus BM25F index (scores every document).
#[derive(Debug, Default)]
pub struct LegacyIndex {
    docs: Vec<(String, FieldStats)>,
    avg_len: [f64; 3],
    df: HashMap<String, usize>,
}

impl LegacyIndex {
    /// Builds the index.
    pub fn build(docs: &[LegacyDoc]) -> LegacyIndex {
        let mut index = LegacyIndex::default();
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

    /// Top `k` keys with scores.
    pub fn search(&self, query: &str, k: usize) -> Vec<(String, f64)> {
        let mut terms = tokenize(query);
        terms.sort();
        terms.dedup();
        let n = self.docs.len() as f64;
        let mut hits: Vec<(String, f64)> = self
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
                (score > 0.0).then(|| (key.clone(), score))
            })
            .collect();
        hits.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        hits.truncate(k);
        hits
    }
}

/// The old parameter text: `"{name} {description} "` per property.
pub fn legacy_params(schema: &serde_json::Map<String, serde_json::Value>) -> String {
    let mut out = String::new();
    if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
        for (k, v) in props {
            out.push_str(k);
            out.push(' ');
            if let Some(d) = v.get("description").and_then(|d| d.as_str()) {
                out.push_str(d);
                out.push(' ');
            }
        }
    }
    out
}
