//! The embedding engine: loaded models (one per dense tier), query embedding, and the
//! background worker that computes segment vectors off the request path.
//!
//! - Models load once per process. The static tier is in the binary; if it fails to load (or a
//!   higher tier is absent) the engine ranks with the tier below and logs one warning.
//! - `GRAPH_OS_RANKER=lexical|static|semantic` caps the tier (operators, tests).
//! - Vectors are computed by one background thread at a bounded duty cycle (it sleeps as long
//!   as it worked, so it takes at most half of one core), cached on disk under
//!   `<state dir>/discovery/vectors/<model id>/<server digest>.vec` keyed by the SHA-256 of each
//!   document's text, and installed into the segment when complete. A restart with an unchanged
//!   fleet reuses every vector; a changed child recomputes only its changed documents.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak, mpsc};
use std::time::{Duration, Instant};

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::embed::StaticModel;
use super::index::{Ranker, Segment, TIERS, Vectors};

/// A text → vector model.
pub trait Embedder: Send + Sync + std::fmt::Debug {
    /// Model id (cache key).
    fn id(&self) -> &str;
    /// Vector width.
    fn dim(&self) -> usize;
    /// One L2-normalized vector.
    fn encode(&self, text: &str) -> Vec<f32>;
}

impl Embedder for StaticModel {
    fn id(&self) -> &str {
        StaticModel::id(self)
    }
    fn dim(&self) -> usize {
        StaticModel::dim(self)
    }
    fn encode(&self, text: &str) -> Vec<f32> {
        StaticModel::encode(self, text)
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
}

/// Where and how vectors are produced.
#[derive(Debug, Clone, Default)]
pub struct EngineConfig {
    /// Disk cache root (`<state dir>/discovery/vectors`); none = no cache.
    pub cache_dir: Option<PathBuf>,
    /// Compute vectors on a background thread (false: synchronously in `schedule`).
    pub background: bool,
}

type Models = [Option<Arc<dyn Embedder>>; TIERS];

/// Loaded models plus the vector worker.
pub struct Engine {
    /// Set once the models are loaded (by the worker thread for a background engine, so a
    /// start never waits on it; until then the engine ranks lexically).
    models: OnceLock<Models>,
    config: EngineConfig,
    queue: Mutex<Option<mpsc::Sender<Weak<Segment>>>>,
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

fn load_models() -> Models {
    let cap = tier_cap();
    let stat: Option<Arc<dyn Embedder>> = if cap >= Ranker::Static {
        static_model().map(|m| m as Arc<dyn Embedder>)
    } else {
        None
    };
    [stat, None]
}

impl Engine {
    /// An engine with every model the tier cap allows and that loads. A background engine
    /// loads them on its worker thread; a foreground one now.
    pub fn new(config: EngineConfig) -> Arc<Engine> {
        let background = config.background;
        let engine = Arc::new(Engine {
            models: OnceLock::new(),
            config,
            queue: Mutex::new(None),
            stats: Arc::default(),
        });
        if !background {
            let _ = engine.models.set(load_models());
            return engine;
        }
        let (tx, rx) = mpsc::channel::<Weak<Segment>>();
        let weak = Arc::downgrade(&engine);
        let spawned = std::thread::Builder::new()
            .name("graph-os-vectors".into())
            .spawn(move || {
                let models = load_models();
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
                let _ = engine.models.set(load_models());
            }
        }
        engine
    }

    /// An engine with explicit models (tests, benchmark), computing vectors synchronously.
    pub fn with_models(models: Models, config: EngineConfig) -> Arc<Engine> {
        let e = Engine {
            models: OnceLock::new(),
            config: EngineConfig {
                background: false,
                ..config
            },
            queue: Mutex::new(None),
            stats: Arc::default(),
        };
        let _ = e.models.set(models);
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
        self.models.get()?.get(tier)?.as_ref()
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

    /// The query vector of a tier (`None` without that model).
    pub fn encode_query(&self, tier: usize, query: &str) -> Option<Vec<f32>> {
        Some(self.model(tier)?.encode(query))
    }

    /// Computes (or loads) every tier's vectors of `seg` now, on this thread.
    pub fn embed_now(&self, seg: &Segment) {
        for tier in 0..TIERS {
            if let Some(m) = self.model(tier)
                && seg.vectors(tier).is_none()
            {
                let v = self.vectors_for(seg, m.as_ref(), None);
                seg.set_vectors(tier, v);
            }
        }
    }

    /// Queues `seg` for the background worker (or embeds it now without one).
    pub fn schedule(self: &Arc<Self>, seg: &Arc<Segment>) {
        if seg.is_empty() {
            return;
        }
        let queue = self.queue.lock().ok().and_then(|q| q.clone());
        match queue {
            Some(tx) => {
                let _ = tx.send(Arc::downgrade(seg));
            }
            None => self.embed_now(seg),
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
    fn vectors_for(&self, seg: &Segment, model: &dyn Embedder, pace: Option<f64>) -> Vectors {
        let dim = model.dim();
        let file = self.cache_file(model.id(), &seg.server);
        let cached = file
            .as_deref()
            .and_then(|f| read_cache(f, dim).ok())
            .unwrap_or_default();
        let hashes: Vec<[u8; 8]> = seg.texts.iter().map(|t| text_hash(t)).collect();
        let mut data = vec![0f32; dim * seg.len()];
        let (mut reused, mut computed) = (0u64, 0u64);
        let mut chunk_start = Instant::now();
        for (i, (text, h)) in seg.texts.iter().zip(&hashes).enumerate() {
            let row = &mut data[i * dim..(i + 1) * dim];
            match cached.get(h) {
                Some(v) => {
                    row.copy_from_slice(v);
                    reused += 1;
                }
                None => {
                    row.copy_from_slice(&model.encode(text));
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
        let stale = cached.len() != seg.len();
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
            tracing::info!(server = %seg.server, model = model.id(), reused, computed, "discovery vectors ready");
        }
        Vectors {
            model: model.id().to_string(),
            dim,
            data,
        }
    }
}

/// CPU share of the worker while computing (it sleeps the rest).
const WORKER_SHARE: f64 = 0.5;

fn worker(engine: Weak<Engine>, rx: mpsc::Receiver<Weak<Segment>>) {
    while let Ok(seg) = rx.recv() {
        let (Some(engine), Some(seg)) = (engine.upgrade(), seg.upgrade()) else {
            continue; // superseded before its turn
        };
        for tier in 0..TIERS {
            if let Some(m) = engine.model(tier)
                && seg.vectors(tier).is_none()
            {
                let v = engine.vectors_for(&seg, m.as_ref(), Some(WORKER_SHARE));
                seg.set_vectors(tier, v);
            }
        }
    }
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
