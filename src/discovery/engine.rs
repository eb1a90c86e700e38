//! The embedding engine: loaded models (one per dense tier), query embedding, and the
//! background worker that computes segment vectors off the request path.
//!
//! - Models load once per process. The static tier is in the binary; the semantic tier loads from
//!   the models directory when installed ([`super::semantic`]). A tier that is absent or fails
//!   to load leaves the engine ranking with the tier below: one warning for a model that is
//!   installed but broken, one info line for a tier that was never installed.
//! - `GRAPH_OS_RANKER=lexical|static|semantic` caps the tier (operators, tests).
//! - Vectors are computed by one background thread at a bounded duty cycle (it sleeps as long
//!   as it worked, so it takes at most half of one core), cached on disk under
//!   `<state dir>/discovery/vectors/<model id>/<server digest>.vec` keyed by the SHA-256 of each
//!   document's text, and installed into the segment when complete. A restart with an unchanged
//!   fleet reuses every vector; a changed child recomputes only its changed documents.
//! - The engine sees the index's segments only through [`Embeddable`] (the index depends on the
//!   engine, never the reverse).
//! - Query vectors are memoized (a bounded LRU per tier): agents repeat queries, and a semantic
//!   query costs milliseconds.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak, mpsc};
use std::time::{Duration, Instant};

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::embed::StaticModel;
use super::semantic::{self, LoadError, SemanticModel};

/// Dense tiers (static, semantic).
pub const TIERS: usize = 2;

/// Which ranking produced a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Ranker {
    /// BM25F only.
    Lexical,
    /// BM25F fused with the static embedding model.
    Static,
    /// BM25F fused with the transformer sentence model.
    Semantic,
}

impl Ranker {
    /// The dense tier slot of a ranker (none for lexical).
    pub fn tier(self) -> Option<usize> {
        match self {
            Ranker::Lexical => None,
            Ranker::Static => Some(0),
            Ranker::Semantic => Some(1),
        }
    }

    /// The ranker of a dense tier slot.
    pub fn of_tier(tier: usize) -> Ranker {
        if tier == 0 {
            Ranker::Static
        } else {
            Ranker::Semantic
        }
    }

    /// Stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Ranker::Lexical => "lexical",
            Ranker::Static => "static",
            Ranker::Semantic => "semantic",
        }
    }
}

/// A child's dense vectors for one model, contiguous (`dim` floats per document).
#[derive(Debug)]
pub struct Vectors {
    /// Model id.
    pub model: String,
    /// Width.
    pub dim: usize,
    /// `len × dim` floats, L2-normalized rows.
    pub data: Vec<f32>,
}

impl Vectors {
    /// Document `i`'s vector.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }
}

/// What the engine computes vectors for (the index's per-child segments).
pub trait Embeddable: Send + Sync {
    /// Owning server (the cache file's key).
    fn server(&self) -> &str;
    /// The dense text of every document, in document order.
    fn texts(&self) -> &[String];
    /// Whether a tier's vectors are installed.
    fn has_vectors(&self, tier: usize) -> bool;
    /// Installs a tier's vectors (`texts().len() × dim` floats).
    fn set_vectors(&self, tier: usize, v: Vectors);
}

/// A text → vector model.
pub trait Embedder: Send + Sync + std::fmt::Debug {
    /// Model id (cache key).
    fn id(&self) -> &str;
    /// Vector width.
    fn dim(&self) -> usize;
    /// A query's L2-normalized vector.
    fn encode_query(&self, text: &str) -> Result<Vec<f32>, String>;
    /// A document's L2-normalized vector (the background worker's).
    fn encode_document(&self, text: &str) -> Result<Vec<f32>, String> {
        self.encode_query(text)
    }
}

impl Embedder for StaticModel {
    fn id(&self) -> &str {
        StaticModel::id(self)
    }
    fn dim(&self) -> usize {
        StaticModel::dim(self)
    }
    fn encode_query(&self, text: &str) -> Result<Vec<f32>, String> {
        Ok(StaticModel::encode(self, text))
    }
}

impl Embedder for SemanticModel {
    fn id(&self) -> &str {
        semantic::MODEL_ID
    }
    fn dim(&self) -> usize {
        semantic::DIM
    }
    fn encode_query(&self, text: &str) -> Result<Vec<f32>, String> {
        SemanticModel::encode_query(self, text)
    }
    fn encode_document(&self, text: &str) -> Result<Vec<f32>, String> {
        SemanticModel::encode_document(self, text)
    }
}

/// Vector bookkeeping, shown in multiplexer_status.
#[derive(Debug, Default, Serialize)]
pub struct VectorStats {
    /// Document vectors taken from the disk cache.
    pub reused: AtomicU64,
    /// Document vectors computed.
    pub computed: AtomicU64,
    /// Segments whose vectors were installed.
    pub segments_ready: AtomicU64,
    /// Vectors that could not be computed (the segment stays lexical for that tier).
    pub failed: AtomicU64,
    /// Query vectors answered from the memo.
    pub query_memo_hits: AtomicU64,
}

/// Where and how vectors are produced.
#[derive(Debug, Clone, Default)]
pub struct EngineConfig {
    /// Disk cache root (`<state dir>/discovery/vectors`); none = no cache.
    pub cache_dir: Option<PathBuf>,
    /// Compute vectors on a background thread (false: synchronously in `schedule`).
    pub background: bool,
    /// Where installed models live (the semantic tier); none = the static tier at most.
    pub models_dir: Option<PathBuf>,
    /// Query vectors memoized per engine (0 = none; the gateway uses [`QUERY_MEMO`]).
    pub query_memo: usize,
}

/// One model per dense tier (`None`: absent or failed to load).
pub type Models = [Option<Arc<dyn Embedder>>; TIERS];

/// Per tier: `ready`, or the stable code of why the tier is not available.
pub type TierReport = [&'static str; TIERS];

type Job = Weak<dyn Embeddable>;

/// Query vectors the gateway memoizes (≤ 512 × (4 KB query + 1.5 KB vector)).
pub const QUERY_MEMO: usize = 512;

/// Loaded models plus the vector worker.
pub struct Engine {
    /// Set once the models are loaded (by the worker thread for a background engine, so a
    /// start never waits on it; until then the engine ranks lexically).
    models: OnceLock<(Models, TierReport)>,
    config: EngineConfig,
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    memo: Mutex<Memo>,
    /// Counters.
    pub stats: Arc<VectorStats>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("ranker", &self.best_ranker())
            .field("config", &self.config)
            .finish()
    }
}

/// The highest tier operators allow (`GRAPH_OS_RANKER`).
fn tier_cap() -> Ranker {
    match std::env::var("GRAPH_OS_RANKER").as_deref() {
        Ok("lexical") => Ranker::Lexical,
        Ok("static") => Ranker::Static,
        _ => Ranker::Semantic,
    }
}

/// The shipped static model, loaded once per process (`None`, with one warning, if it fails).
pub fn static_model() -> Option<Arc<StaticModel>> {
    static MODEL: OnceLock<Option<Arc<StaticModel>>> = OnceLock::new();
    MODEL
        .get_or_init(|| match StaticModel::shipped() {
            Ok(m) => Some(Arc::new(m)),
            Err(e) => {
                tracing::warn!(error = %e, "static embedding model failed to load; find_tools ranks lexically");
                None
            }
        })
        .clone()
}

/// The installed semantic model, loaded once per process (ONNX Runtime allows one environment
/// per process). The first directory asked for wins.
pub fn semantic_model(models_dir: &Path) -> Result<Arc<SemanticModel>, LoadError> {
    static MODEL: OnceLock<Result<Arc<SemanticModel>, LoadError>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let started = Instant::now();
            let m = SemanticModel::load(models_dir).map(Arc::new);
            match &m {
                Ok(_) => tracing::info!(
                    model = semantic::MODEL_ID,
                    ms = started.elapsed().as_millis() as u64,
                    "semantic discovery tier loaded"
                ),
                Err(e @ LoadError::NotInstalled(_)) => tracing::info!(
                    code = e.code(),
                    "semantic discovery tier not installed (scripts/install-semantic-model.py); find_tools ranks with the static tier"
                ),
                Err(e) => tracing::warn!(
                    code = e.code(),
                    error = %e,
                    "semantic discovery tier failed to load; find_tools ranks with the static tier"
                ),
            }
            m
        })
        .clone()
}

fn load_models(config: &EngineConfig) -> (Models, TierReport) {
    let cap = tier_cap();
    let mut report: TierReport = ["disabled"; TIERS];
    let stat: Option<Arc<dyn Embedder>> = if cap >= Ranker::Static {
        report[0] = "model-load-failed";
        static_model().map(|m| m as Arc<dyn Embedder>)
    } else {
        None
    };
    let sem: Option<Arc<dyn Embedder>> = match (&config.models_dir, cap >= Ranker::Semantic) {
        (_, false) => None,
        (None, true) => {
            report[1] = "model-not-installed";
            None
        }
        (Some(dir), true) => match semantic_model(dir) {
            Ok(m) => Some(m as Arc<dyn Embedder>),
            Err(e) => {
                report[1] = e.code();
                None
            }
        },
    };
    let models = [stat, sem];
    for (r, m) in report.iter_mut().zip(&models) {
        if m.is_some() {
            *r = "ready";
        }
    }
    (models, report)
}

impl Engine {
    /// An engine with every model the tier cap allows and that loads. A background engine
    /// loads them on its worker thread; a foreground one now.
    pub fn new(config: EngineConfig) -> Arc<Engine> {
        let background = config.background;
        let memo_size = config.query_memo;
        let engine = Arc::new(Engine {
            models: OnceLock::new(),
            config,
            queue: Mutex::new(None),
            memo: Mutex::new(memo(memo_size)),
            stats: Arc::default(),
        });
        if !background {
            let _ = engine.models.set(load_models(&engine.config));
            return engine;
        }
        let (tx, rx) = mpsc::channel::<Job>();
        let weak = Arc::downgrade(&engine);
        let config = engine.config.clone();
        let spawned = std::thread::Builder::new()
            .name("graph-os-vectors".into())
            .spawn(move || {
                let models = load_models(&config);
                if let Some(e) = weak.upgrade() {
                    let _ = e.models.set(models);
                }
                worker(weak, rx)
            });
        match spawned {
            Ok(_) => {
                if let Ok(mut q) = engine.queue.lock() {
                    *q = Some(tx);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "vector worker could not start; embedding on the caller");
                let _ = engine.models.set(load_models(&engine.config));
            }
        }
        engine
    }

    /// An engine with explicit models (tests, benchmark), computing vectors synchronously.
    pub fn with_models(models: Models, config: EngineConfig) -> Arc<Engine> {
        let e = Engine {
            models: OnceLock::new(),
            memo: Mutex::new(memo(config.query_memo)),
            config: EngineConfig {
                background: false,
                ..config
            },
            queue: Mutex::new(None),
            stats: Arc::default(),
        };
        let report = models
            .each_ref()
            .map(|m| if m.is_some() { "ready" } else { "disabled" });
        let _ = e.models.set((models, report));
        Arc::new(e)
    }

    /// One process-wide engine computing vectors synchronously without a cache.
    pub fn shared_foreground() -> Arc<Engine> {
        static E: OnceLock<Arc<Engine>> = OnceLock::new();
        E.get_or_init(|| Engine::new(EngineConfig::default()))
            .clone()
    }

    /// The model of a tier.
    pub fn model(&self, tier: usize) -> Option<&Arc<dyn Embedder>> {
        self.models.get()?.0.get(tier)?.as_ref()
    }

    /// Per tier, `ready` or why not (`None` while the models load).
    pub fn tier_report(&self) -> Option<TierReport> {
        self.models.get().map(|m| m.1)
    }

    /// Whether the models are loaded (a background engine loads them on its worker).
    pub fn ready(&self) -> bool {
        self.models.get().is_some()
    }

    /// The best tier with a loaded model.
    pub fn best_ranker(&self) -> Ranker {
        (0..TIERS)
            .rev()
            .find(|t| self.model(*t).is_some())
            .map_or(Ranker::Lexical, Ranker::of_tier)
    }

    /// The query vector of a tier (`None` without that model, or when encoding failed: the
    /// search then ranks lexically and says so).
    pub fn encode_query(&self, tier: usize, query: &str) -> Option<Arc<Vec<f32>>> {
        let model = self.model(tier)?;
        let key = (tier, query.to_string());
        if let Some(v) = self
            .memo
            .lock()
            .ok()
            .and_then(|mut m| m.as_mut()?.get(&key).cloned())
        {
            self.stats.query_memo_hits.fetch_add(1, Ordering::Relaxed);
            return Some(v);
        }
        match model.encode_query(query) {
            Ok(v) => {
                let v = Arc::new(v);
                if let Ok(mut m) = self.memo.lock()
                    && let Some(m) = m.as_mut()
                {
                    m.put(key, v.clone());
                }
                Some(v)
            }
            Err(e) => {
                tracing::warn!(model = model.id(), error = %e, "query embedding failed; ranking lexically");
                None
            }
        }
    }

    /// Computes (or loads) every tier's vectors of `seg` now, on this thread.
    pub fn embed_now(&self, seg: &dyn Embeddable) {
        self.embed(seg, None);
    }

    fn embed(&self, seg: &dyn Embeddable, pace: Option<f64>) {
        for tier in 0..TIERS {
            self.embed_tier(seg, tier, pace);
        }
    }

    /// Computes one tier's vectors of `seg` unless present; false when that tier has no model.
    fn embed_tier(&self, seg: &dyn Embeddable, tier: usize, pace: Option<f64>) -> bool {
        let Some(m) = self.model(tier) else {
            return false;
        };
        if seg.has_vectors(tier) {
            return true;
        }
        match self.vectors_for(seg, m.as_ref(), pace) {
            Ok(v) => seg.set_vectors(tier, v),
            Err(e) => {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(server = %seg.server(), model = m.id(), error = %e,
                    "discovery vectors not computed; that child ranks lexically in this tier");
            }
        }
        true
    }

    /// Queues `seg` for the background worker (or embeds it now without one).
    pub fn schedule<S: Embeddable + 'static>(self: &Arc<Self>, seg: &Arc<S>) {
        if seg.texts().is_empty() {
            return;
        }
        let queue = self.queue.lock().ok().and_then(|q| q.clone());
        match queue {
            Some(tx) => {
                let job: Arc<dyn Embeddable> = seg.clone();
                let _ = tx.send(Arc::downgrade(&job));
            }
            None => self.embed_now(seg.as_ref()),
        }
    }

    fn cache_file(&self, model: &str, server: &str) -> Option<PathBuf> {
        let dir = self.config.cache_dir.as_ref()?;
        let digest = hex::encode(Sha256::digest(server.as_bytes()));
        Some(
            dir.join(sanitize(model))
                .join(format!("{}.vec", &digest[..32])),
        )
    }

    /// The vectors of `seg` for `model`: cached rows reused, missing rows computed (with the
    /// duty-cycle pause between chunks when `pace` is given), the cache rewritten when it changed.
    fn vectors_for(
        &self,
        seg: &dyn Embeddable,
        model: &dyn Embedder,
        pace: Option<f64>,
    ) -> Result<Vectors, String> {
        let dim = model.dim();
        let file = self.cache_file(model.id(), seg.server());
        let cached = file
            .as_deref()
            .and_then(|f| read_cache(f, dim).ok())
            .unwrap_or_default();
        let texts = seg.texts();
        let hashes: Vec<[u8; 8]> = texts.iter().map(|t| text_hash(t)).collect();
        let mut data = vec![0f32; dim * texts.len()];
        let (mut reused, mut computed) = (0u64, 0u64);
        let mut chunk_start = Instant::now();
        for (i, (text, h)) in texts.iter().zip(&hashes).enumerate() {
            let row = &mut data[i * dim..(i + 1) * dim];
            match cached.get(h) {
                Some(v) => {
                    row.copy_from_slice(v);
                    reused += 1;
                }
                None => {
                    let v = model.encode_document(text)?;
                    if v.len() != dim {
                        return Err(format!("vector width {} ≠ {dim}", v.len()));
                    }
                    row.copy_from_slice(&v);
                    computed += 1;
                    if let Some(share) = pace
                        && computed % 32 == 0
                    {
                        let worked = chunk_start.elapsed().as_secs_f64();
                        std::thread::sleep(Duration::from_secs_f64(
                            (worked * (1.0 - share) / share).min(0.5),
                        ));
                        chunk_start = Instant::now();
                    }
                }
            }
        }
        let stale = cached.len() != texts.len();
        if let Some(f) = file.as_deref()
            && (computed > 0 || stale)
            && let Err(e) = write_cache(f, dim, &hashes, &data)
        {
            tracing::warn!(file = %f.display(), error = %e, "vector cache not written");
        }
        self.stats.reused.fetch_add(reused, Ordering::Relaxed);
        self.stats.computed.fetch_add(computed, Ordering::Relaxed);
        self.stats.segments_ready.fetch_add(1, Ordering::Relaxed);
        if self.config.cache_dir.is_some() {
            tracing::info!(server = %seg.server(), model = model.id(), reused, computed, "discovery vectors ready");
        }
        Ok(Vectors {
            model: model.id().to_string(),
            dim,
            data,
        })
    }
}

/// CPU share of the worker while computing (it sleeps the rest).
const WORKER_SHARE: f64 = 0.5;

/// The vector worker. Cheaper tiers go first across every queued segment (the static tier
/// covers a whole fleet in seconds); then the semantic tier one segment at a time, taking new
/// segments' static vectors between two segments.
fn worker(engine: Weak<Engine>, rx: mpsc::Receiver<Job>) {
    let mut queue: std::collections::VecDeque<Job> = Default::default();
    loop {
        if queue.is_empty() {
            match rx.recv() {
                Ok(job) => queue.push_back(job),
                Err(_) => return,
            }
        }
        queue.extend(rx.try_iter());
        let Some(engine) = engine.upgrade() else {
            return;
        };
        queue.retain(|j| j.strong_count() > 0); // superseded before their turn
        for job in &queue {
            if let Some(seg) = job.upgrade() {
                engine.embed_tier(seg.as_ref(), 0, Some(WORKER_SHARE));
            }
        }
        if let Some(seg) = queue.pop_front().and_then(|j| j.upgrade()) {
            for tier in 1..TIERS {
                engine.embed_tier(seg.as_ref(), tier, Some(WORKER_SHARE));
            }
        }
    }
}

type Memo = Option<lru::LruCache<(usize, String), Arc<Vec<f32>>>>;

fn memo(size: usize) -> Memo {
    std::num::NonZeroUsize::new(size).map(lru::LruCache::new)
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// First 8 bytes of the SHA-256 of a document's text.
pub fn text_hash(text: &str) -> [u8; 8] {
    let d = Sha256::digest(text.as_bytes());
    let mut h = [0u8; 8];
    h.copy_from_slice(&d[..8]);
    h
}

const MAGIC: &[u8; 8] = b"GOSVEC1\n";

fn read_cache(path: &Path, dim: usize) -> std::io::Result<HashMap<[u8; 8], Vec<f32>>> {
    let bytes = std::fs::read(path)?;
    let bad = || std::io::Error::other("vector cache malformed");
    if bytes.len() < 16 || &bytes[..8] != MAGIC {
        return Err(bad());
    }
    let d = u32::from_le_bytes(bytes[8..12].try_into().map_err(|_| bad())?) as usize;
    let n = u32::from_le_bytes(bytes[12..16].try_into().map_err(|_| bad())?) as usize;
    let rec = 8 + 4 * d;
    if d != dim || bytes.len() != 16 + n * rec {
        return Err(bad());
    }
    let mut out = HashMap::with_capacity(n);
    for r in bytes[16..].chunks_exact(rec) {
        let mut h = [0u8; 8];
        h.copy_from_slice(&r[..8]);
        let v = r[8..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        out.insert(h, v);
    }
    Ok(out)
}

fn write_cache(path: &Path, dim: usize, hashes: &[[u8; 8]], data: &[f32]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut buf = Vec::with_capacity(16 + hashes.len() * (8 + 4 * dim));
    buf.extend_from_slice(MAGIC);
    buf.extend_from_slice(&(dim as u32).to_le_bytes());
    buf.extend_from_slice(&(hashes.len() as u32).to_le_bytes());
    for (i, h) in hashes.iter().enumerate() {
        buf.extend_from_slice(h);
        for x in &data[i * dim..(i + 1) * dim] {
            buf.extend_from_slice(&x.to_le_bytes());
        }
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&buf)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}
