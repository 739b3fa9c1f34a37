//! The host's cache of images pulled from registries without credentials ([`PullCache`]):
//! which references it pulled, their images and sizes, and when each was last used; on
//! disk, so a restarted host still lists and evicts them. Offers list the cached references,
//! most recently used first, so renters can ask for hosts where an image is warm. The cache
//! is bounded: past its quota the least recently used images no one holds are erased.
//!
//! An image pulled with credentials is a renter's private image: it never enters the cache
//! (it is held for its renter as a staged image is, and erased after its lease).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use gpux_protocol::ImageDigest;

/// The record of cached images, in the staging root.
const RECORD: &str = "pulled.json";

/// One cached reference.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Cached {
    /// Docker's short form (`ubuntu:24.04`).
    pub(crate) reference: String,
    pub(crate) image: ImageDigest,
    pub(crate) bytes: u64,
    /// Last pulled (or run) at, unix ms.
    pub(crate) used_ms: u64,
}

/// The host's cache of pulled public images.
#[derive(Debug, Clone)]
pub(crate) struct PullCache {
    entries: Arc<Mutex<Vec<Cached>>>,
    file: PathBuf,
    quota_bytes: u64,
}

impl PullCache {
    /// The record under `root` (created if missing), bounded to `quota_bytes`. A record that
    /// does not read stops the host, as the staged images' does.
    pub(crate) fn open(root: &Path, quota_bytes: u64) -> anyhow::Result<Self> {
        use anyhow::Context;
        std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
        let file = root.join(RECORD);
        let entries = match std::fs::read(&file) {
            Ok(bytes) => serde_json::from_slice(&bytes).with_context(|| {
                format!(
                    "{} is damaged; move it away to start without it (its images stay in \
                     Docker until removed by hand)",
                    file.display()
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
        };
        Ok(Self {
            entries: Arc::new(Mutex::new(entries)),
            file,
            quota_bytes,
        })
    }

    fn change<T>(&self, f: impl FnOnce(&mut Vec<Cached>) -> T) -> T {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let out = f(&mut entries);
        entries.sort_by(|a, b| {
            b.used_ms
                .cmp(&a.used_ms)
                .then(a.reference.cmp(&b.reference))
        });
        let text = serde_json::to_string_pretty(&*entries).unwrap_or_else(|_| "[]".into());
        if let Err(e) = crate::store::write_atomic(&self.file, &text) {
            tracing::error!("cannot write {}: {e}", self.file.display());
        }
        out
    }

    /// `reference` was pulled (or run) at `now`: it is `image`, of `bytes`.
    pub(crate) fn touch(&self, reference: &str, image: ImageDigest, bytes: u64, now: u64) {
        self.change(|entries| {
            entries.retain(|e| e.reference != reference);
            entries.push(Cached {
                reference: reference.to_string(),
                image,
                bytes,
                used_ms: now,
            });
        });
    }

    /// The cached references, most recently used first.
    pub(crate) fn listed(&self) -> Vec<String> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.iter().map(|e| e.reference.clone()).collect()
    }

    /// The cached images.
    pub(crate) fn images(&self) -> BTreeSet<ImageDigest> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.iter().map(|e| e.image).collect()
    }

    /// Whether `image` is cached.
    pub(crate) fn has(&self, image: &ImageDigest) -> bool {
        self.images().contains(image)
    }

    /// The images to erase to bring the cache within its quota, least recently used first,
    /// leaving those `kept` says are in use. Each leaves the record once erased
    /// ([`Self::forget`]): one Docker cannot erase yet (a container still uses it) stays.
    pub(crate) fn evict(&self, kept: impl Fn(&ImageDigest) -> bool) -> Vec<ImageDigest> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        {
            // Each image once: its size, and when any of its references was last used.
            let mut images: BTreeMap<ImageDigest, (u64, u64)> = BTreeMap::new();
            for e in entries.iter() {
                let slot = images.entry(e.image).or_insert((0, 0));
                *slot = (slot.0.max(e.bytes), slot.1.max(e.used_ms));
            }
            let mut total: u64 = images.values().map(|(b, _)| b).sum();
            let mut oldest: Vec<(u64, ImageDigest, u64)> = images
                .iter()
                .map(|(image, (bytes, used))| (*used, *image, *bytes))
                .collect();
            oldest.sort();
            let mut gone = Vec::new();
            for (_, image, bytes) in oldest {
                if total <= self.quota_bytes {
                    break;
                }
                if kept(&image) {
                    continue;
                }
                total = total.saturating_sub(bytes);
                gone.push(image);
            }
            gone
        }
    }

    /// `image` was erased: it leaves the record.
    pub(crate) fn forget(&self, image: &ImageDigest) {
        self.change(|entries| entries.retain(|e| e.image != *image));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_images_no_one_holds_go_first_and_the_record_survives() {
        let dir = tempfile::tempdir().unwrap();
        let cache = PullCache::open(dir.path(), 100).unwrap();
        let (a, b, c) = (
            ImageDigest([1; 32]),
            ImageDigest([2; 32]),
            ImageDigest([3; 32]),
        );
        cache.touch("a:1", a, 40, 1_000);
        cache.touch("b:1", b, 40, 2_000);
        // Two references of one image count it once.
        cache.touch("b:latest", b, 40, 2_500);
        cache.touch("c:1", c, 40, 3_000);
        assert_eq!(cache.listed(), ["c:1", "b:latest", "b:1", "a:1"]);
        // 120 bytes of 100: the oldest, a, goes; unless held, then the next oldest. It
        // stays listed until it is erased.
        assert_eq!(cache.evict(|i| *i == a), [b]);
        assert_eq!(cache.listed(), ["c:1", "b:latest", "b:1", "a:1"]);
        cache.forget(&b);
        assert_eq!(cache.listed(), ["c:1", "a:1"]);
        assert!(cache.evict(|_| false).is_empty(), "within its quota now");
        // Used again: it moves to the front.
        cache.touch("a:1", a, 40, 4_000);
        let again = PullCache::open(dir.path(), 100).unwrap();
        assert_eq!(again.listed(), ["a:1", "c:1"]);
        assert!(again.has(&c) && !again.has(&b));
        std::fs::write(dir.path().join(RECORD), "{not json").unwrap();
        assert!(PullCache::open(dir.path(), 100).is_err());
    }
}
