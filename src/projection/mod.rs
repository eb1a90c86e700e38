//! The source-sync projection: each published candidate is written into an embedded knowledge
//! graph (SQLite in the state directory) — nodes for servers, tools, prompts, resources and
//! templates, edges server→item — and acknowledged only after a durable commit. It never
//! decides a candidate; the reconciler publishes only when the acknowledgement matches exactly.
//!
//! The database is opened per operation so a broken state directory surfaces as a failed
//! acknowledgement (and nothing is published) rather than a stale handle.
//!
//! Rows are keyed by (generation, digest) and marked published only when the reconciler's
//! compare-and-swap succeeded ([`ProjectionWriter::confirm`]): a candidate projected but never
//! published (a crash between projection and CAS, a failed retract) neither blocks a later
//! candidate for the same generation nor answers a question — questions are answered from the
//! published generation only.

use std::path::{Path, PathBuf};

use futures::future::BoxFuture;
use rusqlite::{Connection, params};

use crate::catalog::snapshot::Snapshot;
use crate::catalog::writer::{Ack, ProjectionWriter};

/// The one field of an item the graph indexes besides its body.
#[derive(serde::Deserialize)]
struct Described {
    #[serde(default)]
    description: Option<String>,
}

/// The embedded SQLite knowledge graph.
#[derive(Debug, Clone)]
pub struct SqliteProjection {
    path: PathBuf,
}

// Version 2 of the schema (keyed by generation and digest); version-1 tables, if any, are left
// alone (the projection is derived data).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS kg_generations (generation INTEGER NOT NULL, digest TEXT NOT NULL, committed_at INTEGER NOT NULL,
    published INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (generation, digest));
CREATE TABLE IF NOT EXISTS kg_nodes (generation INTEGER NOT NULL, digest TEXT NOT NULL, id TEXT NOT NULL, kind TEXT NOT NULL,
    server TEXT NOT NULL, name TEXT NOT NULL, description TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (generation, digest, id));
CREATE TABLE IF NOT EXISTS kg_edges (generation INTEGER NOT NULL, digest TEXT NOT NULL, src TEXT NOT NULL, dst TEXT NOT NULL,
    kind TEXT NOT NULL);
";

impl SqliteProjection {
    /// A projection stored at `path` (created on first use).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SqliteProjection { path: path.into() }
    }

    /// Where the database lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open(&self) -> Result<Connection, String> {
        let conn = Connection::open(&self.path).map_err(|e| format!("open projection: {e}"))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(|e| e.to_string())?;
        conn.execute_batch(SCHEMA)
            .map_err(|e| format!("projection schema: {e}"))?;
        Ok(conn)
    }

    fn project_sync(&self, generation: u64, snapshot: &Snapshot) -> Result<Ack, String> {
        let mut conn = self.open()?;
        let tx = conn.transaction().map_err(|e| e.to_string())?;
        let g = generation as i64;
        let d = snapshot.digest.as_str();
        let exists = tx
            .query_row(
                "SELECT 1 FROM kg_generations WHERE generation = ?1 AND digest = ?2",
                params![g, d],
                |_| Ok(()),
            )
            .is_ok();
        if exists {
            return Ok(Ack {
                generation,
                digest: d.to_string(),
            });
        }
        {
            let mut node = tx
                .prepare("INSERT INTO kg_nodes VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)")
                .map_err(|e| e.to_string())?;
            let mut edge = tx
                .prepare("INSERT INTO kg_edges VALUES (?1, ?2, ?3, ?4, 'provides')")
                .map_err(|e| e.to_string())?;
            for (server, child) in &snapshot.children {
                let sid = format!("server:{server}");
                node.execute(params![g, d, sid, "server", server, server, "", "{}"])
                    .map_err(|e| e.to_string())?;
                let families = [
                    ("tool", &child.tools),
                    ("prompt", &child.prompts),
                    ("resource", &child.resources),
                    ("resource_template", &child.resource_templates),
                    ("skill", &child.skills),
                ];
                for (kind, items) in families {
                    for (key, body) in items {
                        // Tool and prompt names are unique fleet-wide; URIs per server only.
                        let id = if matches!(kind, "tool" | "prompt") {
                            format!("{kind}:{key}")
                        } else {
                            format!("{kind}:{server}:{key}")
                        };
                        // Items are canonical JSON: only the description is read back out.
                        let description = serde_json::from_str::<Described>(body)
                            .ok()
                            .and_then(|d| d.description)
                            .unwrap_or_default();
                        node.execute(params![g, d, id, kind, server, key, description, &**body])
                            .map_err(|e| e.to_string())?;
                        edge.execute(params![g, d, sid, id])
                            .map_err(|e| e.to_string())?;
                    }
                }
            }
        }
        tx.execute(
            "INSERT INTO kg_generations VALUES (?1, ?2, ?3, 0)",
            params![g, d, crate::catalog::store::now_ms() as i64],
        )
        .map_err(|e| e.to_string())?;
        tx.commit().map_err(|e| format!("projection commit: {e}"))?;
        Ok(Ack {
            generation,
            digest: d.to_string(),
        })
    }

    fn confirm_sync(&self, generation: u64, digest: &str) -> Result<(), String> {
        let mut conn = self.open()?;
        let tx = conn.transaction().map_err(|e| e.to_string())?;
        let g = generation as i64;
        let n = tx
            .execute(
                "UPDATE kg_generations SET published = 1 WHERE generation = ?1 AND digest = ?2",
                params![g, digest],
            )
            .map_err(|e| e.to_string())?;
        if n != 1 {
            return Err(format!(
                "generation {generation} was not projected with that digest"
            ));
        }
        for table in ["kg_nodes", "kg_edges", "kg_generations"] {
            tx.execute(
                &format!("DELETE FROM {table} WHERE generation = ?1 AND digest != ?2"),
                params![g, digest],
            )
            .map_err(|e| e.to_string())?;
        }
        tx.commit().map_err(|e| e.to_string())
    }

    /// The newest published generation and digest.
    pub fn latest(&self) -> Result<Option<Ack>, String> {
        let conn = self.open()?;
        Ok(conn
            .query_row(
                "SELECT generation, digest FROM kg_generations WHERE published = 1 \
                 ORDER BY generation DESC LIMIT 1",
                [],
                |r| {
                    Ok(Ack {
                        generation: r.get::<_, i64>(0)? as u64,
                        digest: r.get(1)?,
                    })
                },
            )
            .ok())
    }

    /// Servers whose items (in the newest generation) mention `term` in name or description.
    pub fn servers_providing(&self, term: &str) -> Result<serde_json::Value, String> {
        let conn = self.open()?;
        let Some(latest) = self.latest()? else {
            return Ok(serde_json::json!({"generation": null, "servers": {}}));
        };
        let pattern = format!("%{}%", term.replace(['%', '_'], ""));
        let mut stmt = conn
            .prepare(
                "SELECT server, id FROM kg_nodes WHERE generation = ?1 AND digest = ?2 \
                 AND kind != 'server' AND (name LIKE ?3 OR description LIKE ?3) ORDER BY server, id",
            )
            .map_err(|e| e.to_string())?;
        let rows = stmt
            .query_map(
                params![latest.generation as i64, latest.digest, pattern],
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)),
            )
            .map_err(|e| e.to_string())?;
        let mut servers = serde_json::Map::new();
        for row in rows {
            let (server, id) = row.map_err(|e| e.to_string())?;
            if let Some(list) = servers
                .entry(server)
                .or_insert_with(|| serde_json::json!([]))
                .as_array_mut()
            {
                list.push(id.into());
            }
        }
        Ok(serde_json::json!({"generation": latest.generation, "servers": servers}))
    }

    /// What changed between two projected generations: added, removed and changed item ids.
    pub fn diff(&self, from: u64, to: u64) -> Result<serde_json::Value, String> {
        let conn = self.open()?;
        let load = |g: u64| -> Result<std::collections::BTreeMap<String, String>, String> {
            let mut stmt = conn
                .prepare(
                    "SELECT n.id, n.body FROM kg_nodes n JOIN kg_generations g \
                     ON n.generation = g.generation AND n.digest = g.digest \
                     WHERE n.generation = ?1 AND g.published = 1",
                )
                .map_err(|e| e.to_string())?;
            let rows = stmt
                .query_map(params![g as i64], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
                })
                .map_err(|e| e.to_string())?;
            rows.collect::<Result<_, _>>().map_err(|e| e.to_string())
        };
        let known = |g: u64| -> bool {
            conn.query_row(
                "SELECT 1 FROM kg_generations WHERE generation = ?1 AND published = 1",
                params![g as i64],
                |_| Ok(()),
            )
            .is_ok()
        };
        for g in [from, to] {
            if !known(g) {
                return Err(format!("generation {g} is not in the projection"));
            }
        }
        let (a, b) = (load(from)?, load(to)?);
        let added: Vec<&String> = b.keys().filter(|k| !a.contains_key(*k)).collect();
        let removed: Vec<&String> = a.keys().filter(|k| !b.contains_key(*k)).collect();
        let changed: Vec<&String> = b
            .iter()
            .filter(|(k, v)| a.get(*k).is_some_and(|old| old != *v))
            .map(|(k, _)| k)
            .collect();
        Ok(
            serde_json::json!({"from": from, "to": to, "added": added, "removed": removed, "changed": changed}),
        )
    }
}

impl SqliteProjection {
    fn retract_sync(&self, generation: u64, digest: &str) -> Result<(), String> {
        let mut conn = self.open()?;
        let tx = conn.transaction().map_err(|e| e.to_string())?;
        let g = generation as i64;
        // Only an unpublished candidate can be taken back.
        let n = tx
            .execute(
                "DELETE FROM kg_generations WHERE generation = ?1 AND digest = ?2 AND published = 0",
                params![g, digest],
            )
            .map_err(|e| e.to_string())?;
        if n == 1 {
            for table in ["kg_nodes", "kg_edges"] {
                tx.execute(
                    &format!("DELETE FROM {table} WHERE generation = ?1 AND digest = ?2"),
                    params![g, digest],
                )
                .map_err(|e| e.to_string())?;
            }
        }
        tx.commit().map_err(|e| e.to_string())
    }
}

impl ProjectionWriter for SqliteProjection {
    fn confirm(&self, generation: u64, digest: &str) -> BoxFuture<'static, Result<(), String>> {
        let me = self.clone();
        let digest = digest.to_string();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || me.confirm_sync(generation, &digest))
                .await
                .map_err(|e| e.to_string())?
        })
    }
    fn retract(&self, generation: u64, digest: &str) -> BoxFuture<'static, Result<(), String>> {
        let me = self.clone();
        let digest = digest.to_string();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || me.retract_sync(generation, &digest))
                .await
                .map_err(|e| e.to_string())?
        })
    }
    fn project(
        &self,
        generation: u64,
        snapshot: &Snapshot,
    ) -> BoxFuture<'static, Result<Ack, String>> {
        let me = self.clone();
        let snapshot = snapshot.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || me.project_sync(generation, &snapshot))
                .await
                .map_err(|e| e.to_string())?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::snapshot::{Family, SnapshotBuilder};
    use serde_json::json;

    fn snap(desc: &str) -> Snapshot {
        let mut b = SnapshotBuilder::default();
        b.item(
            "weather",
            Family::Tools,
            "weat__forecast",
            json!({"name": "weat__forecast", "description": desc}),
        );
        b.item(
            "weather",
            Family::Tools,
            "weat__alerts",
            json!({"name": "weat__alerts", "description": "storm alerts"}),
        );
        b.build("r", "c").unwrap()
    }

    #[tokio::test]
    async fn projects_acknowledges_exactly_and_answers_questions() {
        let dir = tempfile::tempdir().unwrap();
        let p = SqliteProjection::new(dir.path().join("kg.sqlite"));
        let s1 = snap("daily forecast");
        assert_eq!(
            p.project(1, &s1).await.unwrap(),
            Ack {
                generation: 1,
                digest: s1.digest.clone()
            }
        );
        assert_eq!(
            p.project(1, &s1).await.unwrap().digest,
            s1.digest,
            "idempotent"
        );
        // Not published yet: nothing answers from it.
        assert_eq!(p.latest().unwrap(), None);
        p.confirm(1, &s1.digest).await.unwrap();
        let s2 = snap("hourly forecast");
        p.project(2, &s2).await.unwrap();
        p.confirm(2, &s2.digest).await.unwrap();
        let who = p.servers_providing("storm").unwrap();
        assert_eq!(who["servers"]["weather"], json!(["tool:weat__alerts"]));
        let diff = p.diff(1, 2).unwrap();
        assert_eq!(diff["changed"], json!(["tool:weat__forecast"]));
        assert_eq!(diff["added"], json!([]));
        assert!(p.diff(1, 9).is_err());
    }

    #[tokio::test]
    async fn a_stale_unpublished_candidate_never_blocks_or_answers() {
        let dir = tempfile::tempdir().unwrap();
        let p = SqliteProjection::new(dir.path().join("kg.sqlite"));
        let s1 = snap("daily forecast");
        p.project(1, &s1).await.unwrap();
        p.confirm(1, &s1.digest).await.unwrap();
        // A crash between projection and CAS leaves generation 2 projected, unpublished.
        let stale = snap("stale text");
        p.project(2, &stale).await.unwrap();
        assert_eq!(
            p.latest().unwrap().unwrap().generation,
            1,
            "answers the published one"
        );
        assert!(
            p.servers_providing("stale").unwrap()["servers"]
                .as_object()
                .unwrap()
                .is_empty()
        );
        // The next candidate for generation 2 projects beside it and, once published, replaces it.
        let next = snap("hourly forecast");
        p.project(2, &next).await.unwrap();
        p.confirm(2, &next.digest).await.unwrap();
        assert_eq!(p.latest().unwrap().unwrap().digest, next.digest);
        assert!(p.retract(2, &next.digest).await.is_ok());
        assert_eq!(
            p.latest().unwrap().unwrap().digest,
            next.digest,
            "a published row is never retracted"
        );
        assert!(
            p.confirm(2, &stale.digest).await.is_err(),
            "the stale candidate is gone"
        );
    }
}
