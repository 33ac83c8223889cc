//! The topic registry: every topic's id, partition count and config overrides.
//!
//! Read-mostly metadata, shared by all shards behind a lock (it is never touched on the
//! record path: shards resolve a partition's owner from the name alone). Writes are rare
//! (create/delete topic) and durable before they are visible: the whole registry is
//! written to `<data>/spate-meta/topics.json` with write-temp, fsync, rename, fsync-dir.
//!
//! File format (version 1), JSON:
//! `{"version":1,"topics":{"<name>":{"id":"<uuid>","partitions":N,"configs":{"k":"v"}}}}`

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::TopicConfig;
use crate::model::limits;

const REGISTRY_VERSION: u32 = 1;
/// The registry file is small; anything bigger is not ours.
const REGISTRY_FILE_BYTES_MAX: u64 = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("topic {0:?} already exists")]
    TopicExists(String),
    #[error("topic {0:?} does not exist")]
    UnknownTopic(String),
    #[error("invalid topic name {0:?}: {1}")]
    InvalidName(String, &'static str),
    #[error("invalid partition count {0}")]
    InvalidPartitions(i32),
    #[error("registry i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("registry file corrupt: {0}")]
    Corrupt(String),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TopicMeta {
    pub id: uuid::Uuid,
    pub partitions: i32,
    pub configs: TopicConfig,
}

#[derive(Serialize, Deserialize)]
struct RegistryFile {
    version: u32,
    topics: BTreeMap<String, TopicMeta>,
}

#[derive(Debug)]
pub struct Registry {
    path: PathBuf,
    topics: BTreeMap<String, TopicMeta>,
}

/// Kafka's topic name rule: 1..=249 chars of [a-zA-Z0-9._-], not "." or "..".
pub fn validate_topic_name(name: &str) -> Result<(), RegistryError> {
    let bad = |why| Err(RegistryError::InvalidName(name.to_string(), why));
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > limits::topic_name_bytes_max {
        return bad("longer than 249 characters");
    }
    if name == "." || name == ".." {
        return bad("'.' and '..' are not allowed");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-') {
        return bad("only ASCII alphanumerics, '.', '_' and '-' are allowed");
    }
    Ok(())
}

impl Registry {
    pub fn open(data_dir: &Path) -> Result<Self, RegistryError> {
        let dir = data_dir.join("spate-meta");
        fs::create_dir_all(&dir)?;
        let path = dir.join("topics.json");
        let topics = match fs::metadata(&path) {
            Ok(m) => {
                if m.len() > REGISTRY_FILE_BYTES_MAX {
                    return Err(RegistryError::Corrupt(format!("{} is {} bytes", path.display(), m.len())));
                }
                let file: RegistryFile = serde_json::from_slice(&fs::read(&path)?)
                    .map_err(|e| RegistryError::Corrupt(format!("{}: {e}", path.display())))?;
                if file.version != REGISTRY_VERSION {
                    return Err(RegistryError::Corrupt(format!("unknown registry version {}", file.version)));
                }
                file.topics
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(e.into()),
        };
        Ok(Self { path, topics })
    }

    pub fn get(&self, name: &str) -> Option<&TopicMeta> {
        self.topics.get(name)
    }

    pub fn by_id(&self, id: uuid::Uuid) -> Option<(&String, &TopicMeta)> {
        self.topics.iter().find(|(_, m)| m.id == id)
    }

    pub fn topics(&self) -> impl Iterator<Item = (&String, &TopicMeta)> {
        self.topics.iter()
    }

    pub fn create(&mut self, name: &str, partitions: i32, configs: TopicConfig) -> Result<TopicMeta, RegistryError> {
        validate_topic_name(name)?;
        if !(1..=limits::topic_partitions_max).contains(&partitions) {
            return Err(RegistryError::InvalidPartitions(partitions));
        }
        if self.topics.contains_key(name) {
            return Err(RegistryError::TopicExists(name.to_string()));
        }
        let meta = TopicMeta { id: uuid::Uuid::new_v4(), partitions, configs };
        self.topics.insert(name.to_string(), meta.clone());
        if let Err(e) = self.persist() {
            self.topics.remove(name);
            return Err(e);
        }
        Ok(meta)
    }

    /// Replace a topic's config overrides, durably.
    pub fn set_configs(&mut self, name: &str, configs: TopicConfig) -> Result<TopicMeta, RegistryError> {
        let meta = self.topics.get_mut(name).ok_or_else(|| RegistryError::UnknownTopic(name.to_string()))?;
        let old = std::mem::replace(&mut meta.configs, configs);
        if let Err(e) = self.persist() {
            self.topics.get_mut(name).expect("present").configs = old;
            return Err(e);
        }
        Ok(self.topics[name].clone())
    }

    pub fn delete(&mut self, name: &str) -> Result<TopicMeta, RegistryError> {
        let meta = self.topics.remove(name).ok_or_else(|| RegistryError::UnknownTopic(name.to_string()))?;
        if let Err(e) = self.persist() {
            self.topics.insert(name.to_string(), meta);
            return Err(e);
        }
        Ok(meta)
    }

    fn persist(&self) -> Result<(), RegistryError> {
        let body = serde_json::to_vec_pretty(&RegistryFile { version: REGISTRY_VERSION, topics: self.topics.clone() })
            .map_err(|e| RegistryError::Corrupt(e.to_string()))?;
        let tmp = self.path.with_extension("json.tmp");
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&body)?;
        f.sync_all()?;
        fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_delete_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Registry::open(dir.path()).unwrap();
        let m = r.create("orders", 3, TopicConfig::default()).unwrap();
        assert!(matches!(r.create("orders", 1, TopicConfig::default()), Err(RegistryError::TopicExists(_))));
        assert!(matches!(r.create("bad name", 1, TopicConfig::default()), Err(RegistryError::InvalidName(..))));
        assert!(matches!(r.create("x", 0, TopicConfig::default()), Err(RegistryError::InvalidPartitions(0))));
        r.create("gone", 1, TopicConfig::default()).unwrap();
        r.delete("gone").unwrap();
        let r2 = Registry::open(dir.path()).unwrap();
        assert_eq!(r2.get("orders"), Some(&m));
        assert!(r2.get("gone").is_none());
    }
}
