//! The search index: one immutable [`Segment`] per child (lexical postings + dense vectors),
//! searched together.
//!
//! - Lexical: BM25F over four fields (name words, server/category/hint, description,
//!   parameters). Only documents in the postings of a query term are scored. Collection
//!   statistics (N, df, average field lengths) are summed at query time over the segments the
//!   caller may see, so a hidden child neither contributes results nor shifts scores, and a
//!   segment never has to be rebuilt when another child changes.
//! - Dense: exact dot products over each segment's contiguous, L2-normalized f32 vectors.
//! - Fusion: min-max normalization of each signal over the candidate set (top
//!   [`CANDIDATES`] of each signal), then a weighted sum. A document whose segment has no vectors
//!   yet is ranked by its normalized lexical score alone: ranked lexically, never hidden.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, OnceLock};

use sha2::{Digest, Sha256};

use super::engine::{Embeddable, Engine, Ranker, TIERS, Vectors};
use super::text::tokenize;

/// Lexical fields.
pub const FIELDS: usize = 4;
/// Candidates taken from each signal before fusion (independent of `k`, so the benchmark's
/// depth-100 rankings are the ones find_tools cuts at its `top_k`).
pub const CANDIDATES: usize = 100;

/// BM25F parameters (query-time: changing them needs no re-indexing).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bm25Params {
    /// Term-frequency saturation.
    pub k1: f32,
    /// Length normalization.
    pub b: f32,
    /// Field weights: name, server, description, parameters.
    pub weights: [f32; FIELDS],
}

/// Shipped BM25F parameters: the best of a 384-point grid on the benchmark's dev half (`graph-os
/// bench discovery --tune`; mean dev nDCG@10 0.540 vs 0.534 for the previous k1 1.2, b 0.75,
/// name weight 3).
pub const BM25: Bm25Params = Bm25Params {
    k1: 2.0,
    b: 0.4,
    weights: [2.0, 1.0, 1.0, 0.6],
};

/// Fusion weights, the lexical share of BM25F fused with one dense tier, tuned on the dev half.
/// Static: 0.65, the dev mean optimum (`--tune`; flat within 0.003 from 0.55 to 0.75), which
/// also beats BM25F on every dev set (worst +0.0019, `--tune-static`). Tried: 0.80, the share
/// with the largest worst-case dev gain (+0.0061): on the held-out half it lowered the mean
/// nDCG@10 by 0.006 and still lost on gorilla-huggingface (−0.003 vs −0.007), so not shipped.
/// Semantic alone with BM25F: 0.40 (0.35–0.45 within 0.0005); the semantic tier ships the
/// three-signal [`HYBRID_SHARES`] instead.
pub const LEXICAL_SHARE: [f32; TIERS] = [0.65, 0.40];

/// The semantic tier: BM25F, static and semantic fused with these lexical and static shares (the
/// semantic model gets the rest, 0.45). Dev-half optimum of a 0.20–0.70 × 0–0.30 grid: mean
/// nDCG@10 0.5993 vs 0.5905 for the best two-signal fusion (the plateau spans 0.30–0.35 ×
/// 0.15–0.20 within 0.002).
pub const HYBRID_SHARES: (f32, f32) = (0.35, 0.20);

/// How each signal's scores are put on a common scale before the weighted sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Norm {
    /// `(x - min) / (max - min)` over the candidates.
    MinMax,
    /// `(x - mean) / stddev` over the candidates.
    ZScore,
    /// Lexical `x / max`; dense the raw cosine.
    MaxRaw,
}

/// Shipped normalization: min-max (z-score was within 0.002 on the dev half, raw cosine lower).
pub const NORM: Norm = Norm::MinMax;

/// How to rank (the benchmark compares them; find_tools uses [`Index::best_mode`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// BM25F alone.
    Lexical,
    /// One dense tier alone.
    Dense(usize),
    /// BM25F fused with a dense tier, `lexical_share` of the weight on BM25F.
    Fused {
        /// Dense tier slot.
        tier: usize,
        /// Weight of the lexical signal (the dense one gets the rest).
        lexical_share: f32,
        /// Score normalization.
        norm: Norm,
    },
    /// BM25F, the static tier and the semantic tier fused: `lexical_share` and `static_share`
    /// of the weight, the semantic tier the rest.
    Hybrid {
        /// Weight of the lexical signal.
        lexical_share: f32,
        /// Weight of the static tier.
        static_share: f32,
        /// Score normalization.
        norm: Norm,
    },
}

/// One searchable document (a tool or a skill).
#[derive(Debug, Clone, Default)]
pub struct Doc {
    /// Key returned by searches (the exposed name).
    pub key: String,
    /// Owning server (the segment).
    pub server: String,
    /// Name words.
    pub name: String,
    /// Server name, category and hint.
    pub server_text: String,
    /// Description.
    pub description: String,
    /// Parameter names and descriptions.
    pub params: String,
}

impl Doc {
    fn fields(&self) -> [&str; FIELDS] {
        [
            &self.name,
            &self.server_text,
            &self.description,
            &self.params,
        ]
    }

    /// The text the dense models embed.
    pub fn dense_text(&self) -> String {
        let mut s = String::with_capacity(
            self.name.len()
                + self.server_text.len()
                + self.description.len()
                + self.params.len()
                + 8,
        );
        for part in self.fields() {
            if !part.trim().is_empty() {
                if !s.is_empty() {
                    s.push_str(". ");
                }
                s.push_str(part.trim());
            }
        }
        s
    }
}

/// One search hit.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    /// Document key.
    pub key: String,
    /// Owning server.
    pub server: String,
    /// Relevance (fused: 0..1; lexical alone: BM25F; dense alone: cosine).
    pub score: f64,
}

/// A search answer.
#[derive(Debug, Clone)]
pub struct Found {
    /// Best first.
    pub hits: Vec<Hit>,
    /// The ranking that produced them.
    pub ranker: Ranker,
}

#[derive(Debug, Clone, Copy)]
struct Posting {
    doc: u32,
    tf: [u16; FIELDS],
}

/// The immutable index of one child's documents.
#[derive(Debug)]
pub struct Segment {
    /// Owning server.
    pub server: String,
    /// SHA-256 of the documents (reused across rebuilds when unchanged).
    pub content: String,
    keys: Vec<String>,
    lens: Vec<[u16; FIELDS]>,
    totals: [u64; FIELDS],
    postings: HashMap<Box<str>, Vec<Posting>>,
    /// Dense text of every document (what the vectors are computed from).
    pub(crate) texts: Vec<String>,
    /// Words that name this server in a query (server name words and the name prefix).
    name_terms: Vec<String>,
    vectors: [OnceLock<Arc<Vectors>>; TIERS],
}

/// Words too generic to name a server.
const GENERIC: &[&str] = &[
    "mcp", "server", "api", "tool", "servic", "app", "client", "local",
];

fn name_terms(server: &str, docs: &[Doc]) -> Vec<String> {
    let mut terms = tokenize(&super::text::spaced(server));
    if let Some((prefix, _)) = docs.first().and_then(|d| d.key.split_once("__")) {
        terms.extend(tokenize(prefix));
    }
    terms.retain(|t| {
        t.len() >= 3 && !t.bytes().all(|b| b.is_ascii_digit()) && !GENERIC.contains(&t.as_str())
    });
    terms.sort();
    terms.dedup();
    terms
}

/// Score added (fused, 0..1 scale) to the documents of a server the query names; lexical
/// scores are multiplied by `1 + DOMAIN_BOOST` instead.
pub const DOMAIN_BOOST: f32 = 0.3;
/// Each named server contributes its own best documents to the candidates (so a server the
/// query names is consulted even when its tools are outside the global top candidates).
const DOMAIN_CANDIDATES: usize = 10;

/// Which visible segments the query names: a query word equal to one of the segment's name
/// words, where that word names at most a quarter of the visible servers (at least one).
fn named_segments(segs: &[&Arc<Segment>], query: &str) -> Vec<bool> {
    let q: std::collections::HashSet<String> = tokenize(query).into_iter().collect();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for s in segs {
        for t in &s.name_terms {
            *count.entry(t.as_str()).or_default() += 1;
        }
    }
    let limit = (segs.len() / 4).max(1);
    segs.iter()
        .map(|s| {
            s.name_terms
                .iter()
                .any(|t| q.contains(t) && count.get(t.as_str()).is_some_and(|c| *c <= limit))
        })
        .collect()
}

/// SHA-256 over the documents' keys and fields.
pub fn content_hash(docs: &[Doc]) -> String {
    let mut h = Sha256::new();
    for d in docs {
        h.update(d.key.as_bytes());
        for f in d.fields() {
            h.update([0]);
            h.update(f.as_bytes());
        }
        h.update([1]);
    }
    hex::encode(h.finalize())
}

impl Segment {
    /// Indexes `docs` of `server` (lexically; vectors arrive later through [`Segment::set_vectors`]).
    pub fn new(server: &str, docs: &[Doc]) -> Segment {
        let mut postings: HashMap<Box<str>, Vec<Posting>> = HashMap::new();
        let mut lens = Vec::with_capacity(docs.len());
        let mut totals = [0u64; FIELDS];
        for (i, d) in docs.iter().enumerate() {
            let mut tf: HashMap<String, [u16; FIELDS]> = HashMap::new();
            let mut len = [0u16; FIELDS];
            for (f, text) in d.fields().iter().enumerate() {
                let toks = tokenize(text);
                len[f] = toks.len().min(u16::MAX as usize) as u16;
                totals[f] += len[f] as u64;
                for t in toks {
                    let e = tf.entry(t).or_default();
                    e[f] = e[f].saturating_add(1);
                }
            }
            lens.push(len);
            for (t, tf) in tf {
                postings
                    .entry(t.into_boxed_str())
                    .or_default()
                    .push(Posting { doc: i as u32, tf });
            }
        }
        for p in postings.values_mut() {
            p.sort_by_key(|p| p.doc);
        }
        Segment {
            server: server.to_string(),
            content: content_hash(docs),
            keys: docs.iter().map(|d| d.key.clone()).collect(),
            lens,
            totals,
            postings,
            texts: docs.iter().map(Doc::dense_text).collect(),
            name_terms: name_terms(server, docs),
            vectors: Default::default(),
        }
    }

    /// Number of documents.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the segment is empty.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The vectors of a tier, when computed.
    pub fn vectors(&self, tier: usize) -> Option<&Arc<Vectors>> {
        self.vectors.get(tier)?.get()
    }

    /// Installs a tier's vectors (once; later calls are ignored).
    pub fn set_vectors(&self, tier: usize, v: Vectors) {
        if v.data.len() == v.dim * self.len()
            && let Some(slot) = self.vectors.get(tier)
        {
            let _ = slot.set(Arc::new(v));
        }
    }
}

impl Embeddable for Segment {
    fn server(&self) -> &str {
        &self.server
    }
    fn texts(&self) -> &[String] {
        &self.texts
    }
    fn has_vectors(&self, tier: usize) -> bool {
        self.vectors(tier).is_some()
    }
    fn set_vectors(&self, tier: usize, v: Vectors) {
        Segment::set_vectors(self, tier, v)
    }
}

/// Total order on f32 scores for the heap.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Score(f32);
impl Eq for Score {}
impl PartialOrd for Score {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Score {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

/// (segment, document) address.
type Addr = (u32, u32);

/// Keeps the `k` best (score, address); ties go to the lower address (server, then name order).
struct TopK {
    k: usize,
    heap: BinaryHeap<Reverse<(Score, Reverse<Addr>)>>,
}

impl TopK {
    fn new(k: usize) -> TopK {
        TopK {
            k,
            heap: BinaryHeap::with_capacity(k + 1),
        }
    }

    fn push(&mut self, score: f32, at: Addr) {
        if self.k == 0 {
            return;
        }
        let item = Reverse((Score(score), Reverse(at)));
        if self.heap.len() < self.k {
            self.heap.push(item);
        } else if let Some(min) = self.heap.peek()
            && item < *min
        {
            self.heap.pop();
            self.heap.push(item);
        }
    }

    /// Best first.
    fn into_sorted(self) -> Vec<(f32, Addr)> {
        let mut v: Vec<(f32, Addr)> = self
            .heap
            .into_iter()
            .map(|Reverse((s, Reverse(a)))| (s.0, a))
            .collect();
        v.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        v
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Four accumulators so the compiler vectorizes the 64-wide rows.
    let mut acc = [0f32; 4];
    let chunks = a.len() / 4;
    for i in 0..chunks {
        for j in 0..4 {
            acc[j] += a[i * 4 + j] * b[i * 4 + j];
        }
    }
    let mut s = acc[0] + acc[1] + acc[2] + acc[3];
    for i in chunks * 4..a.len() {
        s += a[i] * b[i];
    }
    s
}

/// The shipped ranking of a tier: BM25F alone, BM25F + static, or BM25F + static + semantic.
pub fn tier_mode(tier: Option<usize>) -> Mode {
    match tier {
        None => Mode::Lexical,
        Some(0) => Mode::Fused {
            tier: 0,
            lexical_share: LEXICAL_SHARE[0],
            norm: NORM,
        },
        Some(_) => Mode::Hybrid {
            lexical_share: HYBRID_SHARES.0,
            static_share: HYBRID_SHARES.1,
            norm: NORM,
        },
    }
}

/// The search index over every child's segment.
#[derive(Debug, Clone, Default)]
pub struct Index {
    segments: Vec<Arc<Segment>>,
    engine: Option<Arc<Engine>>,
}

impl Index {
    /// An index over `segments` (sorted by server), embedding queries with `engine`.
    pub fn from_segments(mut segments: Vec<Arc<Segment>>, engine: Option<Arc<Engine>>) -> Index {
        segments.sort_by(|a, b| a.server.cmp(&b.server));
        Index { segments, engine }
    }

    /// Builds an index over `docs` and computes their vectors now (tests and the benchmark).
    pub fn build(docs: &[Doc]) -> Index {
        let engine = Engine::shared_foreground();
        Self::build_with(docs, &engine)
    }

    /// Like [`Index::build`] with a given engine (vectors computed synchronously).
    pub fn build_with(docs: &[Doc], engine: &Arc<Engine>) -> Index {
        let mut by_server: std::collections::BTreeMap<&str, Vec<Doc>> = Default::default();
        for d in docs {
            by_server.entry(&d.server).or_default().push(d.clone());
        }
        let segments = by_server
            .into_iter()
            .map(|(s, docs)| {
                let seg = Arc::new(Segment::new(s, &docs));
                engine.embed_now(seg.as_ref());
                seg
            })
            .collect();
        Index::from_segments(segments, Some(engine.clone()))
    }

    /// The next index after a catalog change: segments whose documents are unchanged are
    /// reused as they are (with their vectors); changed or new children get a new segment
    /// whose vectors the engine computes in the background.
    pub fn update(&self, groups: Vec<(String, Vec<Doc>)>, engine: Arc<Engine>) -> Index {
        let old: HashMap<&str, &Arc<Segment>> = self
            .segments
            .iter()
            .map(|s| (s.server.as_str(), s))
            .collect();
        let mut segments = Vec::with_capacity(groups.len());
        for (server, docs) in groups {
            let content = content_hash(&docs);
            match old.get(server.as_str()) {
                Some(seg) if seg.content == content => segments.push((*seg).clone()),
                _ => {
                    let seg = Arc::new(Segment::new(&server, &docs));
                    engine.schedule(&seg);
                    segments.push(seg);
                }
            }
        }
        Index::from_segments(segments, Some(engine))
    }

    /// The engine this index embeds queries with.
    pub fn engine(&self) -> Option<&Arc<Engine>> {
        self.engine.as_ref()
    }

    /// The segments (sorted by server).
    pub fn segments(&self) -> &[Arc<Segment>] {
        &self.segments
    }

    /// Number of documents.
    pub fn len(&self) -> usize {
        self.segments.iter().map(|s| s.len()).sum()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The best ranker this index can use (the engine's best loaded model).
    pub fn ranker(&self) -> Ranker {
        self.engine
            .as_ref()
            .map_or(Ranker::Lexical, |e| e.best_ranker())
    }

    /// Segments whose vectors for the best tier are not computed yet.
    pub fn pending_segments(&self) -> usize {
        match self.ranker().tier() {
            None => 0,
            Some(t) => self
                .segments
                .iter()
                .filter(|s| !s.is_empty() && s.vectors(t).is_none())
                .count(),
        }
    }

    /// Discovery facts for multiplexer_status: ranker, model, per-tier state, vectors
    /// pending/reused/computed.
    pub fn status(&self) -> serde_json::Value {
        let ranker = self.ranker();
        let model = ranker
            .tier()
            .and_then(|t| self.engine.as_ref()?.model(t))
            .map(|m| m.id().to_string());
        let stats = self.engine.as_ref().map(|e| e.stats.clone());
        let load = |f: fn(&super::engine::VectorStats) -> u64| stats.as_deref().map_or(0, f);
        let tiers = self.engine.as_ref().and_then(|e| e.tier_report());
        serde_json::json!({
            "ranker": ranker,
            "serving": self.serving_mode(&|_| true).0,
            "model": model,
            "models_loading": self.engine.as_ref().is_some_and(|e| !e.ready()),
            "tiers": tiers.map(|t| serde_json::json!({"static": t[0], "semantic": t[1]})),
            "segments": self.segments.len(),
            "documents": self.len(),
            "vectors_pending": self.pending_segments(),
            "vectors_reused": load(|s| s.reused.load(std::sync::atomic::Ordering::Relaxed)),
            "vectors_computed": load(|s| s.computed.load(std::sync::atomic::Ordering::Relaxed)),
            "vectors_failed": load(|s| s.failed.load(std::sync::atomic::Ordering::Relaxed)),
            "query_memo_hits": load(|s| s.query_memo_hits.load(std::sync::atomic::Ordering::Relaxed)),
        })
    }

    /// The shipped ranking with the best available tier.
    pub fn best_mode(&self) -> Mode {
        tier_mode(self.ranker().tier())
    }

    /// The ranking a search over the `visible` servers uses now: the best loaded tier whose
    /// vectors every visible segment has; while the best tier's vectors are still being
    /// computed, the tier below when it is complete (so a fleet gaining the semantic tier keeps
    /// its static ranking meanwhile); else the best tier, with the segments that lack vectors
    /// ranked lexically.
    pub fn serving_mode(&self, visible: &dyn Fn(&str) -> bool) -> (Ranker, Mode) {
        let best = self.ranker();
        let Some(engine) = self.engine.as_ref() else {
            return (Ranker::Lexical, Mode::Lexical);
        };
        let complete = |tier: usize| {
            self.segments
                .iter()
                .filter(|s| !s.is_empty() && visible(&s.server))
                .all(|s| s.vectors(tier).is_some())
        };
        let Some(top) = best.tier() else {
            return (Ranker::Lexical, Mode::Lexical);
        };
        let tier = (0..=top)
            .rev()
            .find(|t| engine.model(*t).is_some() && complete(*t))
            .unwrap_or(top);
        (Ranker::of_tier(tier), tier_mode(Some(tier)))
    }

    /// Top `k` documents of the servers `visible` admits, with the shipped ranking.
    pub fn search(&self, query: &str, k: usize, visible: &dyn Fn(&str) -> bool) -> Found {
        let (_, mode) = self.serving_mode(visible);
        self.search_mode(query, k, visible, mode, &BM25)
    }

    /// Top `k` with an explicit ranking (the benchmark compares rankings with this).
    pub fn search_mode(
        &self,
        query: &str,
        k: usize,
        visible: &dyn Fn(&str) -> bool,
        mode: Mode,
        bm25: &Bm25Params,
    ) -> Found {
        let segs: Vec<&Arc<Segment>> = self
            .segments
            .iter()
            .filter(|s| !s.is_empty() && visible(&s.server))
            .collect();
        // (tier, weight) of every dense signal of the mode, and the lexical weight.
        let (lexical_share, norm, signals): (f32, Norm, Vec<(usize, f32)>) = match mode {
            Mode::Lexical => (1.0, NORM, Vec::new()),
            Mode::Dense(t) => (0.0, NORM, vec![(t, 1.0)]),
            Mode::Fused {
                tier,
                lexical_share,
                norm,
            } => (lexical_share, norm, vec![(tier, 1.0 - lexical_share)]),
            Mode::Hybrid {
                lexical_share,
                static_share,
                norm,
            } => (
                lexical_share,
                norm,
                vec![(0, static_share), (1, 1.0 - lexical_share - static_share)],
            ),
        };
        let vectors: Vec<(usize, f32, Arc<Vec<f32>>)> = signals
            .iter()
            .filter_map(|(t, w)| {
                let qv = self.engine.as_ref()?.encode_query(*t, query)?;
                Some((*t, *w, qv))
            })
            .collect();
        let dense: Vec<Signal> = vectors
            .iter()
            .map(|(tier, weight, qv)| Signal {
                tier: *tier,
                weight: *weight,
                qv,
            })
            .collect();
        let (ranked, ranker) = match mode {
            Mode::Dense(t) => match dense.first() {
                Some(d) => (dense_top(&segs, t, d.qv, k, &|_| true), Ranker::of_tier(t)),
                None => (Vec::new(), Ranker::Lexical),
            },
            Mode::Fused { .. } | Mode::Hybrid { .. } if !dense.is_empty() => {
                let lex = lexical_scores(&segs, query, bm25);
                let named = named_segments(&segs, query);
                fuse(&segs, &lex, &named, &dense, (lexical_share, norm), k)
            }
            _ => {
                let mut lex = lexical_scores(&segs, query, bm25);
                for (scores, named) in lex.iter_mut().zip(named_segments(&segs, query)) {
                    if named {
                        scores.iter_mut().for_each(|x| *x *= 1.0 + DOMAIN_BOOST);
                    }
                }
                (lexical_top(&lex, k, &|_| true), Ranker::Lexical)
            }
        };
        Found {
            hits: ranked
                .into_iter()
                .map(|(score, (s, d))| {
                    let seg = segs[s as usize];
                    Hit {
                        key: seg.keys[d as usize].clone(),
                        server: seg.server.clone(),
                        score: score as f64,
                    }
                })
                .collect(),
            ranker,
        }
    }
}

/// BM25F scores per visible segment (an empty vector for a segment no query term reaches).
fn lexical_scores(segs: &[&Arc<Segment>], query: &str, p: &Bm25Params) -> Vec<Vec<f32>> {
    let mut terms = tokenize(query);
    terms.sort();
    terms.dedup();
    let n: f64 = segs.iter().map(|s| s.len() as f64).sum();
    let mut avg = [1f32; FIELDS];
    for (f, a) in avg.iter_mut().enumerate() {
        let total: u64 = segs.iter().map(|s| s.totals[f]).sum();
        *a = ((total as f64 / n.max(1.0)) as f32).max(1.0);
    }
    let mut scores: Vec<Vec<f32>> = vec![Vec::new(); segs.len()];
    for t in &terms {
        let lists: Vec<Option<&Vec<Posting>>> =
            segs.iter().map(|s| s.postings.get(t.as_str())).collect();
        let df: f64 = lists.iter().flatten().map(|l| l.len() as f64).sum();
        if df == 0.0 {
            continue;
        }
        let idf = ((n - df + 0.5) / (df + 0.5) + 1.0).ln() as f32;
        for (si, list) in lists.iter().enumerate() {
            let Some(list) = list else { continue };
            let seg = segs[si];
            let acc = &mut scores[si];
            if acc.is_empty() {
                acc.resize(seg.len(), 0.0);
            }
            for post in *list {
                let lens = &seg.lens[post.doc as usize];
                let mut wtf = 0f32;
                for f in 0..FIELDS {
                    if post.tf[f] > 0 {
                        let norm = 1.0 - p.b + p.b * lens[f] as f32 / avg[f];
                        wtf += p.weights[f] * post.tf[f] as f32 / norm;
                    }
                }
                acc[post.doc as usize] += idf * wtf / (p.k1 + wtf);
            }
        }
    }
    scores
}

fn lexical_top(lex: &[Vec<f32>], k: usize, only: &dyn Fn(usize) -> bool) -> Vec<(f32, Addr)> {
    let mut top = TopK::new(k);
    for (s, scores) in lex.iter().enumerate() {
        if !only(s) {
            continue;
        }
        for (d, &x) in scores.iter().enumerate() {
            if x > 0.0 {
                top.push(x, (s as u32, d as u32));
            }
        }
    }
    top.into_sorted()
}

fn dense_top(
    segs: &[&Arc<Segment>],
    tier: usize,
    qv: &[f32],
    k: usize,
    only: &dyn Fn(usize) -> bool,
) -> Vec<(f32, Addr)> {
    let mut top = TopK::new(k);
    for (s, seg) in segs.iter().enumerate() {
        if !only(s) {
            continue;
        }
        let Some(v) = seg.vectors(tier) else { continue };
        if v.dim != qv.len() {
            continue;
        }
        for d in 0..seg.len() {
            top.push(dot(qv, v.row(d)), (s as u32, d as u32));
        }
    }
    top.into_sorted()
}

/// An affine map `x → (x - shift) / spread` fitted to one signal's candidate scores.
struct Scale {
    shift: f32,
    spread: f32,
}

impl Scale {
    fn of(xs: &[f32], method: Norm, dense: bool) -> Scale {
        let (lo, hi) = xs
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), x| {
                (lo.min(*x), hi.max(*x))
            });
        let unit = |shift: f32, spread: f32| Scale {
            shift,
            spread: if spread > 1e-9 { spread } else { 1.0 },
        };
        if xs.is_empty() {
            return unit(0.0, 1.0);
        }
        match method {
            Norm::MinMax => unit(lo, hi - lo),
            Norm::ZScore => {
                let n = xs.len() as f32;
                let mean = xs.iter().sum::<f32>() / n;
                let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / n;
                unit(mean, var.sqrt())
            }
            Norm::MaxRaw if dense => unit(0.0, 1.0),
            Norm::MaxRaw => unit(0.0, hi),
        }
    }

    fn apply(&self, x: f32) -> f32 {
        (x - self.shift) / self.spread
    }
}

/// One dense signal of a fusion: its tier, weight and query vector.
struct Signal<'a> {
    tier: usize,
    weight: f32,
    qv: &'a [f32],
}

/// Fuses BM25F with the dense signals: each normalized over the candidates (every signal's top
/// [`CANDIDATES`], plus each named server's best), then a weighted sum over the signals a
/// document has (a document whose segment lacks a tier's vectors is ranked by the others,
/// reweighted, so lexically when it has none). The ranker is the highest tier that scored.
fn fuse(
    segs: &[&Arc<Segment>],
    lex: &[Vec<f32>],
    named: &[bool],
    dense: &[Signal],
    (lexical_share, method): (f32, Norm),
    k: usize,
) -> (Vec<(f32, Addr)>, Ranker) {
    let all = |_: usize| true;
    let mut cands: Vec<Addr> = lexical_top(lex, CANDIDATES, &all)
        .into_iter()
        .map(|(_, a)| a)
        .collect();
    for d in dense {
        cands.extend(
            dense_top(segs, d.tier, d.qv, CANDIDATES, &all)
                .into_iter()
                .map(|(_, a)| a),
        );
    }
    if named.iter().any(|n| *n) {
        let only = |s: usize| named[s];
        cands.extend(
            lexical_top(lex, DOMAIN_CANDIDATES, &only)
                .into_iter()
                .map(|(_, a)| a),
        );
        for d in dense {
            cands.extend(
                dense_top(segs, d.tier, d.qv, DOMAIN_CANDIDATES, &only)
                    .into_iter()
                    .map(|(_, a)| a),
            );
        }
    }
    cands.sort_unstable();
    cands.dedup();
    let lexical: Vec<f32> = cands
        .iter()
        .map(|(s, d)| lex[*s as usize].get(*d as usize).copied().unwrap_or(0.0))
        .collect();
    // Per signal, per candidate: the cosine when the segment has that tier's vectors.
    let cosines: Vec<Vec<Option<f32>>> = dense
        .iter()
        .map(|sig| {
            cands
                .iter()
                .map(|(s, d)| {
                    segs[*s as usize]
                        .vectors(sig.tier)
                        .filter(|v| v.dim == sig.qv.len())
                        .map(|v| dot(sig.qv, v.row(*d as usize)))
                })
                .collect()
        })
        .collect();
    let ls = Scale::of(&lexical, method, false);
    let scales: Vec<Scale> = cosines
        .iter()
        .map(|c| {
            Scale::of(
                &c.iter().flatten().copied().collect::<Vec<_>>(),
                method,
                true,
            )
        })
        .collect();
    let mut top_tier: Option<usize> = None;
    let mut top = TopK::new(k);
    for (i, at) in cands.iter().enumerate() {
        let mut num = lexical_share * ls.apply(lexical[i]);
        let mut den = lexical_share;
        for ((sig, c), scale) in dense.iter().zip(&cosines).zip(&scales) {
            if let Some(v) = c[i] {
                num += sig.weight * scale.apply(v);
                den += sig.weight;
                top_tier = top_tier.max(Some(sig.tier));
            }
        }
        let mut score = if den > 0.0 { num / den } else { 0.0 };
        if named[at.0 as usize] {
            score += DOMAIN_BOOST;
        }
        top.push(score, *at);
    }
    let ranker = top_tier.map_or(Ranker::Lexical, Ranker::of_tier);
    (top.into_sorted(), ranker)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::engine::{Embedder, EngineConfig};

    /// A stand-in semantic model: a 2-d vector per text, "money" words along one axis.
    #[derive(Debug)]
    struct Toy;
    impl Embedder for Toy {
        fn id(&self) -> &str {
            "toy"
        }
        fn dim(&self) -> usize {
            2
        }
        fn encode_query(&self, text: &str) -> Result<Vec<f32>, String> {
            let money = ["pay", "invoice", "bill", "money"]
                .iter()
                .any(|w| text.to_lowercase().contains(w));
            Ok(if money {
                vec![1.0, 0.0]
            } else {
                vec![0.0, 1.0]
            })
        }
    }

    fn doc(server: &str, name: &str, description: &str) -> Doc {
        Doc {
            key: format!("{server}__{name}"),
            server: server.into(),
            name: name.into(),
            server_text: server.into(),
            description: description.into(),
            params: String::new(),
        }
    }

    fn engine() -> Arc<Engine> {
        let stat = crate::discovery::engine::static_model().map(|m| m as Arc<dyn Embedder>);
        Engine::with_models([stat, Some(Arc::new(Toy))], EngineConfig::default())
    }

    #[test]
    fn the_semantic_tier_serves_only_once_every_visible_child_has_its_vectors() {
        let engine = engine();
        let billing = Arc::new(Segment::new(
            "billing",
            &[doc("billing", "settle", "Settle an invoice")],
        ));
        engine.embed_now(billing.as_ref());
        let weather = Arc::new(Segment::new(
            "weather",
            &[doc("weather", "forecast", "Weather forecast")],
        ));
        // Only the static tier for `weather` so far (its semantic vectors are still computing).
        let static_only = engine.model(0).unwrap().encode_query("x").unwrap().len();
        weather.set_vectors(
            0,
            Vectors {
                model: "potion-base-2M".into(),
                dim: static_only,
                data: engine
                    .model(0)
                    .unwrap()
                    .encode_document(&weather.texts[0])
                    .unwrap(),
            },
        );
        let idx = Index::from_segments(vec![billing, weather.clone()], Some(engine.clone()));
        assert_eq!(idx.ranker(), Ranker::Semantic);
        // While one visible child lacks semantic vectors, the static ranking serves everyone.
        assert_eq!(idx.serving_mode(&|_| true).0, Ranker::Static);
        assert_eq!(idx.search("weather", 5, &|_| true).ranker, Ranker::Static);
        // A caller who cannot see that child is served semantically already.
        let billing_only = |s: &str| s == "billing";
        assert_eq!(idx.serving_mode(&billing_only).0, Ranker::Semantic);
        // Forced to the semantic tier, the child without its vectors is ranked by the signals
        // it has (reweighted), never hidden.
        let found = idx.search_mode("weather forecast", 5, &|_| true, tier_mode(Some(1)), &BM25);
        assert_eq!(found.ranker, Ranker::Semantic);
        assert_eq!(found.hits[0].key, "weather__forecast", "{:?}", found.hits);
        engine.embed_now(weather.as_ref());
        assert_eq!(idx.serving_mode(&|_| true).0, Ranker::Semantic);
    }

    #[test]
    fn the_semantic_signal_finds_what_words_alone_miss() {
        let engine = engine();
        let idx = Index::build_with(
            &[
                doc("billing", "settle", "Settle an invoice"),
                doc("weather", "forecast", "Weather forecast"),
            ],
            &engine,
        );
        // "pay" appears in no document: BM25F finds nothing, the semantic signal finds billing.
        let lexical = idx.search_mode("pay", 2, &|_| true, Mode::Lexical, &BM25);
        assert!(lexical.hits.is_empty());
        let found = idx.search("pay", 2, &|_| true);
        assert_eq!(found.ranker, Ranker::Semantic);
        assert_eq!(found.hits[0].key, "billing__settle");
    }
}
