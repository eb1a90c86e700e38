//! `graph-os bench discovery`: ranking quality on public tool-retrieval data and search latency
//! at fleet scale, through the same code find_tools uses ([`tool_doc`] → [`Index`] →
//! [`Index::search_mode`]).
//!
//! Each corpus becomes a catalog of MCP `Tool` descriptors (name, description, input schema)
//! served by one child (MetaTool, apibank, apigen, toolink) or one child per domain with the
//! domain as its `category` (gorilla-huggingface), with transparent names (prefix ""). Queries
//! are split once, deterministically (top bit of the FNV-1a of dataset, position and text; 1 = held-out):
//! parameters are tuned (`--tune`) on the dev half only and every table reports the held-out
//! half. Data is read at run time from `--data` (default `../shared/bench-data` beside the
//! repository), never committed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::Tool;
use serde_json::{Value, json};

use super::engine::{Embedder, Engine, EngineConfig};
use super::index::{BM25, Bm25Params, Doc, Index, LEXICAL_SHARE, Mode, Norm, tier_mode};
use super::legacy::{LegacyDoc, LegacyIndex, legacy_params};
use super::tool_doc;

/// Options of `graph-os bench discovery`.
#[derive(clap::Args, Debug, Clone)]
pub struct DiscoveryBenchArgs {
    /// Benchmark data directory (metatool/, toolret/). Default: ../shared/bench-data beside the
    /// repository, else ../shared/bench-data from the working directory.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Grid-search BM25F and fusion parameters on the dev half and print the best.
    #[arg(long)]
    pub tune: bool,
    /// Print, per dataset, the dev-half nDCG@10 of the static tier for each lexical share
    /// beside BM25F's (does the default tier beat BM25F on every set?).
    #[arg(long)]
    pub tune_static: bool,
    /// Catalog sizes for the latency benchmark (200 children each); 0 = skip.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    pub sizes: Vec<usize>,
    /// Queries per latency run.
    #[arg(long, default_value_t = 2000)]
    pub latency_queries: usize,
    /// At most this many held-out queries per dataset (0 = all).
    #[arg(long, default_value_t = 0)]
    pub max_queries: usize,
    /// Skip the quality tables (latency only).
    #[arg(long)]
    pub latency_only: bool,
    /// Installed models (the semantic tier). Default: as the gateway's `--models-dir`.
    #[arg(long, env = "GRAPH_OS_MODELS_DIR")]
    pub models_dir: Option<PathBuf>,
    /// Document-vector cache of the quality runs (reruns skip the semantic model's minutes of
    /// document embedding). Default: `$XDG_CACHE_HOME/graph-os/bench-vectors` (else
    /// `~/.cache/...`); `-` = none.
    #[arg(long)]
    pub vector_cache: Option<PathBuf>,
}

impl DiscoveryBenchArgs {
    fn models_dir(&self) -> Option<PathBuf> {
        self.models_dir
            .clone()
            .or_else(super::semantic::default_models_dir)
    }

    fn vector_cache(&self) -> Option<PathBuf> {
        match &self.vector_cache {
            Some(p) if p.as_os_str() == "-" => None,
            Some(p) => Some(p.clone()),
            None => std::env::var_os("XDG_CACHE_HOME")
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|d| d.join("graph-os").join("bench-vectors")),
        }
    }
}

/// One query with its relevant document keys.
#[derive(Debug, Clone)]
pub struct Query {
    /// Text.
    pub text: String,
    /// Relevant keys.
    pub relevant: Vec<String>,
    /// In the dev (tuning) half.
    pub dev: bool,
}

/// A corpus loaded as a catalog.
pub struct Dataset {
    /// Name.
    pub name: String,
    /// Documents built with [`tool_doc`].
    pub docs: Vec<Doc>,
    /// The old ranker's documents (same tools).
    pub legacy: Vec<LegacyDoc>,
    /// Queries.
    pub queries: Vec<Query>,
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// The fixed split: true = dev (tuning) half.
pub fn is_dev(dataset: &str, position: usize, text: &str) -> bool {
    fnv1a(format!("{dataset}\u{0}{position}\u{0}{text}").as_bytes()) >> 63 == 0
}

struct CatalogBuilder {
    name: String,
    docs: Vec<Doc>,
    legacy: Vec<LegacyDoc>,
}

impl CatalogBuilder {
    fn new(name: &str) -> Self {
        CatalogBuilder {
            name: name.into(),
            docs: Vec::new(),
            legacy: Vec::new(),
        }
    }

    /// Adds one tool the way a child's tools/list would carry it.
    fn tool(
        &mut self,
        key: &str,
        server: &str,
        category: &str,
        name: &str,
        description: &str,
        props: serde_json::Map<String, Value>,
    ) {
        let tool: Tool = match serde_json::from_value(json!({
            "name": name,
            "description": description,
            "inputSchema": {"type": "object", "properties": props},
        })) {
            Ok(t) => t,
            Err(_) => return,
        };
        let mut d = tool_doc(server, &[category], name, &tool);
        d.key = key.to_string();
        self.docs.push(d);
        self.legacy.push(LegacyDoc {
            key: key.to_string(),
            name: format!("{name} {server}"),
            description: description.to_string(),
            params: legacy_params(&tool.input_schema),
        });
    }

    fn finish(self, queries: Vec<Query>) -> Dataset {
        Dataset {
            name: self.name,
            docs: self.docs,
            legacy: self.legacy,
            queries,
        }
    }
}

fn read_json(path: &Path) -> anyhow::Result<Value> {
    let bytes = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("{}: {e} (pass --data DIR)", path.display()))?;
    Ok(serde_json::from_slice(&bytes)?)
}

/// RFC 4180 rows (quoted fields, doubled quotes).
fn csv_rows(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if quoted {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    field.push('"');
                    chars.next();
                } else {
                    quoted = false;
                }
            } else {
                field.push(c);
            }
        } else {
            match c {
                '"' => quoted = true,
                ',' => row.push(std::mem::take(&mut field)),
                '\n' => {
                    row.push(std::mem::take(&mut field));
                    rows.push(std::mem::take(&mut row));
                }
                '\r' => {}
                _ => field.push(c),
            }
        }
    }
    if !field.is_empty() || !row.is_empty() {
        row.push(field);
        rows.push(row);
    }
    rows
}

fn metatool(dir: &Path) -> anyhow::Result<(Dataset, Dataset)> {
    let des = read_json(&dir.join("metatool/plugin_des.json"))?;
    let mut cat = CatalogBuilder::new("metatool-single");
    for (name, d) in des.as_object().into_iter().flatten() {
        cat.tool(
            name,
            "metatool",
            "",
            name,
            d.as_str().unwrap_or_default(),
            Default::default(),
        );
    }
    let csv = std::fs::read_to_string(dir.join("metatool/all_clean_data.csv"))?;
    let single: Vec<Query> = csv_rows(&csv)
        .into_iter()
        .skip(1)
        .filter(|r| r.len() >= 2 && !r[0].is_empty())
        .enumerate()
        .map(|(i, r)| Query {
            dev: is_dev("metatool-single", i, &r[0]),
            text: r[0].clone(),
            relevant: vec![r[1].clone()],
        })
        .collect();
    let multi_json = read_json(&dir.join("metatool/multi_tool_query_golden.json"))?;
    let multi: Vec<Query> = multi_json
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, q)| {
            let text = q["query"].as_str().unwrap_or_default().to_string();
            Query {
                dev: is_dev("metatool-multi", i, &text),
                relevant: q["tool"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|t| t.as_str().map(String::from))
                    .collect(),
                text,
            }
        })
        .collect();
    let docs = cat.docs.clone();
    let legacy = cat.legacy.clone();
    let single = cat.finish(single);
    let multi = Dataset {
        name: "metatool-multi".into(),
        docs,
        legacy,
        queries: multi,
    };
    Ok((single, multi))
}

fn props_from_object(params: &Value) -> serde_json::Map<String, Value> {
    let mut props = serde_json::Map::new();
    match params {
        Value::Object(m) => {
            for (k, v) in m {
                let desc = v
                    .get("description")
                    .and_then(|d| d.as_str())
                    .unwrap_or_default();
                props.insert(k.clone(), json!({"type": "string", "description": desc}));
            }
        }
        Value::Array(items) => {
            for it in items {
                if let Some(name) = it.get("name").and_then(|n| n.as_str()) {
                    let desc = it
                        .get("description")
                        .and_then(|d| d.as_str())
                        .unwrap_or_default();
                    props.insert(name.into(), json!({"type": "string", "description": desc}));
                } else if let Some(name) = it.as_str() {
                    props.insert(name.into(), json!({"type": "string"}));
                }
            }
        }
        _ => {}
    }
    props
}

/// Parameter names of `def f(a, b=1, *args)` in a code block.
fn python_params(code: &str) -> serde_json::Map<String, Value> {
    let mut props = serde_json::Map::new();
    if let Some(start) = code.find("def ")
        && let Some(open) = code[start..].find('(')
        && let Some(close) = code[start + open..].find(')')
    {
        for p in code[start + open + 1..start + open + close].split(',') {
            let name = p
                .split([':', '='])
                .next()
                .unwrap_or_default()
                .trim()
                .trim_start_matches('*');
            if !name.is_empty() && name != "self" {
                props.insert(name.into(), json!({"type": "string"}));
            }
        }
    }
    props
}

fn toolret(dir: &Path, task: &str) -> anyhow::Result<Dataset> {
    let tools = read_json(&dir.join(format!("toolret/{task}/tools.json")))?;
    let mut cat = CatalogBuilder::new(task);
    let mut domains: BTreeMap<String, usize> = BTreeMap::new();
    for t in tools.as_array().into_iter().flatten() {
        let id = t["id"].as_str().unwrap_or_default();
        let doc = &t["documentation"];
        let name = doc["name"].as_str().unwrap_or_default();
        let description = doc["description"].as_str().unwrap_or_default();
        match task {
            "gorilla-huggingface" => {
                let domain = doc["domain"].as_str().unwrap_or_default().to_string();
                let n = domains.len();
                let idx = *domains.entry(domain.clone()).or_insert(n);
                let functionality = doc["functionality"].as_str().unwrap_or_default();
                cat.tool(
                    id,
                    &format!("huggingface-{idx}"),
                    &domain,
                    name,
                    &format!("{functionality}. {description}"),
                    props_from_object(&doc["api_arguments"]),
                );
            }
            "toolink" => cat.tool(
                id,
                "toolink",
                "",
                name,
                description,
                python_params(doc["func_description"].as_str().unwrap_or_default()),
            ),
            _ => cat.tool(
                id,
                task,
                "",
                name,
                description,
                props_from_object(&doc["parameters"]),
            ),
        }
    }
    let queries = read_json(&dir.join(format!("toolret/{task}/queries.json")))?;
    let queries = queries
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, q)| {
            let text = q["query"].as_str().unwrap_or_default().to_string();
            Query {
                dev: is_dev(task, i, &text),
                relevant: q["labels"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|l| l["relevance"].as_i64().unwrap_or(1) > 0)
                    .filter_map(|l| l["id"].as_str().map(String::from))
                    .collect(),
                text,
            }
        })
        .collect();
    Ok(cat.finish(queries))
}

/// Every corpus of the benchmark.
pub fn load_all(dir: &Path) -> anyhow::Result<Vec<Dataset>> {
    let (single, multi) = metatool(dir)?;
    let mut out = vec![single, multi];
    for task in ["apibank", "apigen", "gorilla-huggingface", "toolink"] {
        out.push(toolret(dir, task)?);
    }
    Ok(out)
}

/// Hit@1, Recall@5, nDCG@10, MRR (depth 100) of one ranking.
#[derive(Debug, Default, Clone, Copy)]
pub struct Metrics {
    /// Top result relevant.
    pub hit1: f64,
    /// Share of relevant documents in the top 5.
    pub recall5: f64,
    /// Binary-gain nDCG at 10.
    pub ndcg10: f64,
    /// Reciprocal rank of the first relevant document.
    pub mrr: f64,
}

impl Metrics {
    /// Metrics of `ranked` against `relevant`.
    pub fn of(ranked: &[String], relevant: &[String]) -> Metrics {
        let rel = |k: &String| relevant.contains(k);
        let hit1 = ranked.first().is_some_and(rel) as u8 as f64;
        let r = relevant.len().max(1) as f64;
        let recall5 = ranked.iter().take(5).filter(|k| rel(k)).count() as f64 / r;
        let dcg: f64 = ranked
            .iter()
            .take(10)
            .enumerate()
            .filter(|(_, k)| rel(k))
            .map(|(i, _)| 1.0 / (i as f64 + 2.0).log2())
            .sum();
        let idcg: f64 = (0..relevant.len().min(10))
            .map(|i| 1.0 / (i as f64 + 2.0).log2())
            .sum();
        let mrr = ranked
            .iter()
            .position(rel)
            .map_or(0.0, |p| 1.0 / (p as f64 + 1.0));
        Metrics {
            hit1,
            recall5,
            ndcg10: if idcg > 0.0 { dcg / idcg } else { 0.0 },
            mrr,
        }
    }

    fn add(&mut self, o: Metrics) {
        self.hit1 += o.hit1;
        self.recall5 += o.recall5;
        self.ndcg10 += o.ndcg10;
        self.mrr += o.mrr;
    }

    fn scaled(self, n: usize) -> Metrics {
        let n = n.max(1) as f64;
        Metrics {
            hit1: self.hit1 / n,
            recall5: self.recall5 / n,
            ndcg10: self.ndcg10 / n,
            mrr: self.mrr / n,
        }
    }
}

/// A ranking under test.
#[derive(Debug, Clone, Copy)]
pub enum Ranking {
    /// The BM25F graph-os shipped before (baseline).
    Legacy,
    /// A mode of the current index with BM25F parameters.
    Current(Mode, Bm25Params),
}

/// A loaded dataset with both indexes.
pub struct Prepared<'a> {
    /// The dataset.
    pub data: &'a Dataset,
    index: Index,
    legacy: LegacyIndex,
}

impl<'a> Prepared<'a> {
    /// Builds both indexes (vectors computed now).
    pub fn new(data: &'a Dataset, engine: &Arc<Engine>) -> Self {
        Prepared {
            data,
            index: Index::build_with(&data.docs, engine),
            legacy: LegacyIndex::build(&data.legacy),
        }
    }

    fn rank(&self, q: &str, r: Ranking) -> Vec<String> {
        match r {
            Ranking::Legacy => self
                .legacy
                .search(q, 100)
                .into_iter()
                .map(|(k, _)| k)
                .collect(),
            Ranking::Current(mode, p) => self
                .index
                .search_mode(q, 100, &|_| true, mode, &p)
                .hits
                .into_iter()
                .map(|h| h.key)
                .collect(),
        }
    }

    /// Mean metrics and mean latency over the chosen half (at most `max` queries, spread
    /// evenly over the file so every tool is represented; 0 = all).
    pub fn evaluate(&self, r: Ranking, dev: bool, max: usize) -> (Metrics, usize, Duration) {
        let half: Vec<&Query> = self.data.queries.iter().filter(|q| q.dev == dev).collect();
        let stride = if max > 0 {
            half.len().div_ceil(max).max(1)
        } else {
            1
        };
        let mut m = Metrics::default();
        let mut n = 0;
        let mut spent = Duration::ZERO;
        for q in half.into_iter().step_by(stride) {
            let t = Instant::now();
            let ranked = self.rank(&q.text, r);
            spent += t.elapsed();
            m.add(Metrics::of(&ranked, &q.relevant));
            n += 1;
        }
        (m.scaled(n), n, spent / n.max(1) as u32)
    }
}

fn default_data_dir() -> PathBuf {
    let beside_repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/bench-data");
    if beside_repo.is_dir() {
        beside_repo
    } else {
        PathBuf::from("../shared/bench-data")
    }
}

/// The rankers reported: baseline, each signal alone, each shipped tier (and the two-signal
/// semantic fusion the shipped three-signal one is compared with).
fn rankers(engine: &Engine) -> Vec<(&'static str, Ranking)> {
    let mut v = vec![
        ("bm25f (before)", Ranking::Legacy),
        ("bm25f", Ranking::Current(Mode::Lexical, BM25)),
    ];
    if engine.model(0).is_some() {
        v.push(("static alone", Ranking::Current(Mode::Dense(0), BM25)));
        v.push(("static tier", Ranking::Current(tier_mode(Some(0)), BM25)));
    }
    if engine.model(1).is_some() {
        v.push(("semantic alone", Ranking::Current(Mode::Dense(1), BM25)));
        v.push((
            "bm25f+semantic",
            Ranking::Current(
                Mode::Fused {
                    tier: 1,
                    lexical_share: LEXICAL_SHARE[1],
                    norm: super::index::NORM,
                },
                BM25,
            ),
        ));
        v.push(("semantic tier", Ranking::Current(tier_mode(Some(1)), BM25)));
    }
    v
}

/// Runs the benchmark.
pub fn run(args: DiscoveryBenchArgs) -> anyhow::Result<()> {
    // Every query is embedded once per tier and reused by every ranking compared.
    let engine = Engine::new(EngineConfig {
        cache_dir: args.vector_cache(),
        background: false,
        models_dir: args.models_dir(),
        query_memo: 1 << 17,
    });
    let tiers = engine.tier_report().unwrap_or_default();
    println!(
        "graph-os bench discovery — ranker available: {} (static: {}, semantic: {})",
        engine.best_ranker().as_str(),
        tiers[0],
        tiers[1]
    );
    if !args.latency_only {
        let dir = args.data.clone().unwrap_or_else(default_data_dir);
        let t = Instant::now();
        let data = load_all(&dir)?;
        let prepared: Vec<Prepared> = data.iter().map(|d| Prepared::new(d, &engine)).collect();
        println!(
            "loaded {} datasets from {} in {:.1} s (split: top bit of FNV-1a; tables = held-out half)",
            prepared.len(),
            dir.display(),
            t.elapsed().as_secs_f64()
        );
        if args.tune {
            tune(&prepared, &engine);
        }
        if args.tune_static {
            tune_static(&prepared);
        }
        quality(&prepared, &engine, args.max_queries);
    }
    for &n in args.sizes.iter().filter(|n| **n > 0) {
        latency(n, 200, args.latency_queries, &args, &engine)?;
    }
    Ok(())
}

fn quality(prepared: &[Prepared], engine: &Engine, max: usize) {
    let rankers = rankers(engine);
    println!();
    println!(
        "{:<22} {:<15} {:>6} {:>7} {:>7} {:>8} {:>7} {:>9}",
        "dataset", "ranker", "n", "Hit@1", "R@5", "nDCG@10", "MRR", "µs/query"
    );
    let mut means: Vec<(f64, f64)> = vec![(0.0, 0.0); rankers.len()];
    for p in prepared {
        for (i, (name, r)) in rankers.iter().enumerate() {
            let (m, n, lat) = p.evaluate(*r, false, max);
            means[i].0 += m.ndcg10;
            means[i].1 += m.recall5;
            println!(
                "{:<22} {:<15} {:>6} {:>7.3} {:>7.3} {:>8.3} {:>7.3} {:>9.1}",
                p.data.name,
                name,
                n,
                m.hit1,
                m.recall5,
                m.ndcg10,
                m.mrr,
                lat.as_secs_f64() * 1e6
            );
        }
    }
    println!();
    for (i, (name, _)) in rankers.iter().enumerate() {
        println!(
            "mean over {} datasets  {:<15} nDCG@10 {:.3}  R@5 {:.3}",
            prepared.len(),
            name,
            means[i].0 / prepared.len() as f64,
            means[i].1 / prepared.len() as f64
        );
    }
}

/// Mean dev nDCG@10 over datasets (at most `cap` dev queries each).
fn dev_objective(prepared: &[Prepared], r: Ranking, cap: usize) -> f64 {
    prepared
        .iter()
        .map(|p| p.evaluate(r, true, cap).0.ndcg10)
        .sum::<f64>()
        / prepared.len() as f64
}

fn tune(prepared: &[Prepared], engine: &Engine) {
    const CAP: usize = 1500;
    println!("\ntuning on the dev half (≤ {CAP} queries per dataset), objective: mean nDCG@10");
    let mut best = (
        dev_objective(prepared, Ranking::Current(Mode::Lexical, BM25), CAP),
        BM25,
    );
    println!("  shipped bm25f {:?}: {:.4}", BM25, best.0);
    for k1 in [0.9f32, 1.2, 1.6, 2.0] {
        for b in [0.4f32, 0.6, 0.75, 0.9] {
            for wn in [1.5f32, 2.0, 3.0, 4.0] {
                for ws in [0.5f32, 1.0] {
                    for wp in [0.3f32, 0.6, 1.0] {
                        let p = Bm25Params {
                            k1,
                            b,
                            weights: [wn, ws, 1.0, wp],
                        };
                        let s = dev_objective(prepared, Ranking::Current(Mode::Lexical, p), CAP);
                        if s > best.0 {
                            best = (s, p);
                        }
                    }
                }
            }
        }
    }
    println!("  best bm25f on dev: {:?}: {:.4}", best.1, best.0);
    tune_hybrid(prepared, engine, CAP);
    for tier in 0..super::engine::TIERS {
        if engine.model(tier).is_none() {
            continue;
        }
        let mut rows = Vec::new();
        for step in 0..=20 {
            let share = step as f32 / 20.0;
            let mut row = Vec::new();
            for norm in [Norm::MinMax, Norm::ZScore, Norm::MaxRaw] {
                let mode = Mode::Fused {
                    tier,
                    lexical_share: share,
                    norm,
                };
                row.push(dev_objective(prepared, Ranking::Current(mode, BM25), CAP));
                row.push(dev_objective(prepared, Ranking::Current(mode, best.1), CAP));
            }
            rows.push((share, row));
        }
        println!(
            "  tier {tier}: dev mean nDCG@10 per lexical_share × normalization (shipped bm25f / tuned bm25f)"
        );
        println!("  share   minmax          zscore          maxraw");
        for (share, r) in &rows {
            println!(
                "  {share:.2}   {:.4}/{:.4}   {:.4}/{:.4}   {:.4}/{:.4}",
                r[0], r[1], r[2], r[3], r[4], r[5]
            );
        }
    }
}

/// Per dataset: dev nDCG@10 of BM25F and of the static tier at each lexical share.
fn tune_static(prepared: &[Prepared]) {
    const CAP: usize = 1500;
    let names: Vec<&str> = prepared.iter().map(|p| p.data.name.as_str()).collect();
    println!(
        "\nstatic tier on the dev half, nDCG@10 per dataset ({})",
        names.join(", ")
    );
    let row = |r: Ranking| -> Vec<f64> {
        prepared
            .iter()
            .map(|p| p.evaluate(r, true, CAP).0.ndcg10)
            .collect()
    };
    let base = row(Ranking::Current(Mode::Lexical, BM25));
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.4}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!("  bm25f  {}", fmt(&base));
    for step in 10..=19 {
        let share = step as f32 / 20.0;
        let mode = Mode::Fused {
            tier: 0,
            lexical_share: share,
            norm: Norm::MinMax,
        };
        let v = row(Ranking::Current(mode, BM25));
        let worst = v
            .iter()
            .zip(&base)
            .map(|(a, b)| a - b)
            .fold(f64::INFINITY, f64::min);
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        println!(
            "  {share:.2}   {}   mean {mean:.4}  worst Δ {worst:+.4}",
            fmt(&v)
        );
    }
}

/// Dev-half grid of the three-signal fusion (lexical share × static share, min-max).
fn tune_hybrid(prepared: &[Prepared], engine: &Engine, cap: usize) {
    if engine.model(0).is_none() || engine.model(1).is_none() {
        return;
    }
    println!(
        "  bm25f+static+semantic: dev mean nDCG@10 per lexical share (rows) × static share (columns)"
    );
    let statics = [0.0f32, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3];
    println!("  lex   {}", statics.map(|x| format!("{x:>6.2}")).join(" "));
    let mut best = (0.0, 0.0, 0.0);
    for step in 4..=14 {
        let lexical_share = step as f32 / 20.0;
        let mut row = Vec::new();
        for static_share in statics {
            if lexical_share + static_share > 1.0 {
                row.push("     -".to_string());
                continue;
            }
            let mode = Mode::Hybrid {
                lexical_share,
                static_share,
                norm: Norm::MinMax,
            };
            let s = dev_objective(prepared, Ranking::Current(mode, BM25), cap);
            if s > best.0 {
                best = (s, lexical_share, static_share);
            }
            row.push(format!("{s:.4}"));
        }
        println!("  {lexical_share:.2}  {}", row.join(" "));
    }
    println!(
        "  best: lexical {:.2}, static {:.2}: {:.4}",
        best.1, best.2, best.0
    );
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len().saturating_sub(1))]
}

/// Synthetic fleet of `n` tools over `children` children built from the corpora's tools
/// (names made unique per copy), queried with the corpora's held-out queries.
fn latency(
    n: usize,
    children: usize,
    queries: usize,
    args: &DiscoveryBenchArgs,
    quality_engine: &Engine,
) -> anyhow::Result<()> {
    let dir = args.data.clone().unwrap_or_else(default_data_dir);
    let data = load_all(&dir)?;
    let pool: Vec<&Doc> = data
        .iter()
        .filter(|d| d.name != "metatool-multi")
        .flat_map(|d| d.docs.iter())
        .collect();
    let qs: Vec<&str> = data
        .iter()
        .flat_map(|d| d.queries.iter().filter(|q| !q.dev).take(queries / 4 + 1))
        .map(|q| q.text.as_str())
        .take(queries)
        .collect();
    let mut groups: Vec<(String, Vec<Doc>)> = (0..children)
        .map(|c| (format!("svc-{c:03}"), Vec::new()))
        .collect();
    for i in 0..n {
        let src = pool[i % pool.len()];
        let c = i % children;
        let server = groups[c].0.clone();
        let mut d = src.clone();
        d.key = format!("{server}__{}_{}", src.key, i / pool.len());
        d.server = server.clone();
        d.server_text = format!("{}. {}", super::text::spaced(&server), src.server_text);
        groups[c].1.push(d);
    }
    // No query memo: every timed query is embedded. Semantic document vectors are stand-ins
    // (hash-seeded unit vectors of the model's width): 100,000 real ones take the better part of
    // an hour on one core, and a dot product costs the same whatever the values; the query is
    // embedded by the real model.
    let semantic = quality_engine
        .model(1)
        .map(|m| Arc::new(StandInDocuments(m.clone())) as Arc<dyn Embedder>);
    let stand_in = semantic.is_some();
    let engine = Engine::with_models(
        [quality_engine.model(0).cloned(), semantic],
        EngineConfig::default(),
    );
    let t = Instant::now();
    let index = Index::default().update(groups.clone(), engine.clone());
    let build = t.elapsed();
    // One child's catalog changes: only its segment is rebuilt (and re-embedded).
    let mut changed = groups.clone();
    if let Some(d) = changed[7].1.first_mut() {
        d.description.push_str(" (changed)");
    }
    let t = Instant::now();
    let index2 = index.update(changed, engine.clone());
    let one = t.elapsed();
    let reused = index
        .segments()
        .iter()
        .zip(index2.segments())
        .filter(|(a, b)| Arc::ptr_eq(a, b))
        .count();
    println!(
        "\nlatency: {n} tools over {children} children; full index build {:.0} ms (vectors included{}); \
         one child changed: {:.1} ms, {reused}/{children} segments reused",
        build.as_secs_f64() * 1e3,
        if stand_in {
            "; semantic document vectors are stand-ins, queries embedded by the real model"
        } else {
            ""
        },
        one.as_secs_f64() * 1e3
    );
    let mut modes = vec![("bm25f (lexical tier)", tier_mode(None))];
    if engine.model(0).is_some() {
        modes.push(("static tier", tier_mode(Some(0))));
    }
    if engine.model(1).is_some() {
        modes.push(("semantic tier", tier_mode(Some(1))));
    }
    println!(
        "{:<22} {:>8} {:>9} {:>9} {:>9}",
        "ranker (k=8)", "queries", "p50_ms", "p99_ms", "max_ms"
    );
    for (name, mode) in modes {
        for q in qs.iter().take(50) {
            index.search_mode(q, 8, &|_| true, mode, &BM25);
        }
        let mut times: Vec<Duration> = qs
            .iter()
            .map(|q| {
                let t = Instant::now();
                let f = index.search_mode(q, 8, &|_| true, mode, &BM25);
                std::hint::black_box(f);
                t.elapsed()
            })
            .collect();
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{:<22} {:>8} {:>9.3} {:>9.3} {:>9.3}",
            name,
            times.len(),
            ms(percentile(&times, 0.5)),
            ms(percentile(&times, 0.99)),
            ms(*times.last().unwrap_or(&Duration::ZERO))
        );
    }
    Ok(())
}

/// The real model for queries, hash-seeded unit vectors of its width for documents (timing).
#[derive(Debug)]
struct StandInDocuments(Arc<dyn Embedder>);

impl Embedder for StandInDocuments {
    fn id(&self) -> &str {
        "stand-in"
    }
    fn dim(&self) -> usize {
        self.0.dim()
    }
    fn encode_query(&self, text: &str) -> Result<Vec<f32>, String> {
        self.0.encode_query(text)
    }
    fn encode_document(&self, text: &str) -> Result<Vec<f32>, String> {
        let mut x = fnv1a(text.as_bytes()) | 1;
        let mut v: Vec<f32> = (0..self.dim())
            .map(|_| {
                // xorshift64: deterministic, cheap.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        super::embed::normalize_l2(&mut v);
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_follow_their_definitions() {
        let k = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let m = Metrics::of(&k(&["x", "a", "y", "b"]), &k(&["a", "b"]));
        assert_eq!(m.hit1, 0.0);
        assert_eq!(m.recall5, 1.0);
        assert!((m.mrr - 0.5).abs() < 1e-9);
        let dcg = 1.0 / 3f64.log2() + 1.0 / 5f64.log2();
        let idcg = 1.0 + 1.0 / 3f64.log2();
        assert!((m.ndcg10 - dcg / idcg).abs() < 1e-9);
    }

    #[test]
    fn split_is_fixed_and_about_half() {
        let dev = (0..1000)
            .filter(|i| is_dev("t", *i, &format!("q{i}")))
            .count();
        assert!((400..600).contains(&dev));
        assert_eq!(is_dev("t", 3, "q3"), is_dev("t", 3, "q3"));
    }

    #[test]
    fn csv_handles_quotes() {
        let rows = csv_rows("Query,Tool\n\"a, \"\"b\"\"\",T\nc,U\n");
        assert_eq!(rows[1], vec!["a, \"b\"", "T"]);
        assert_eq!(rows[2], vec!["c", "U"]);
    }

    #[test]
    fn python_params_are_parsed() {
        let p = python_params("```python\ndef f(a, b=2, *args, c: int):\n```");
        let mut keys: Vec<String> = p.keys().cloned().collect();
        keys.sort();
        assert_eq!(keys, vec!["a", "args", "b", "c"]);
    }
}
