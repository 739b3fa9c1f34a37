//! Which images renters staged on this host ([`StagedImages`]): for whom, until when, and
//! which leases run them; on disk, so a restarted host still erases them. A staged image
//! no lease names expires after [`UNUSED_TTL_MS`]; one a lease ran is erased when the lease
//! ends, or kept [`CACHE_TTL_MS`] for the same renter when the lease's cache-image term asks
//! for it. Images the host had before are never erased.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use gpux_protocol::{ContentId, ImageDigest, PublicKey};

use crate::attest::now;
use crate::executor::Executor;

/// How long a staged image no lease names is kept, ms.
pub(crate) const UNUSED_TTL_MS: u64 = 30 * 60 * 1000;
/// How long a cached image outlives its lease, ms.
pub(crate) const CACHE_TTL_MS: u64 = 24 * 3600 * 1000;
/// How long an image that could not be erased waits before the next try, ms.
const RETRY_ERASE_MS: u64 = 30_000;
/// The record of staged images, in the staging root.
const RECORD: &str = "staged.json";
/// The "renter" of a hold that only waits for its image to be erased (no renter has the key
/// of zeros' signatures; such a hold is never offered, never counted, and soon swept).
const ERASING: PublicKey = PublicKey([0; 32]);

/// One renter's hold on a staged image.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Hold {
    pub(crate) image: ImageDigest,
    pub(crate) renter: PublicKey,
    /// The image's layers and config, bytes (counted against the staging quota).
    pub(crate) bytes: u64,
    /// Leases that run it, each with its cache-image term.
    pub(crate) leases: BTreeMap<ContentId, bool>,
    /// Kept until then at least (unix ms), with no lease.
    pub(crate) until_ms: u64,
    /// The host had the image before it was staged: it is never erased.
    pub(crate) host_image: bool,
}

/// Which images renters staged on this host, for whom, and until when; on disk (written
/// whole, atomically, at every change) so a restarted host still erases them.
#[derive(Debug, Clone)]
pub(crate) struct StagedImages {
    holds: Arc<Mutex<Vec<Hold>>>,
    file: PathBuf,
}

impl StagedImages {
    /// The record under `root` (created if missing). A record that does not read stops the
    /// host: starting without it would leave renters' images behind, or offer them.
    pub(crate) fn open(root: &Path) -> anyhow::Result<Self> {
        use anyhow::Context;
        std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
        let file = root.join(RECORD);
        let holds = match std::fs::read(&file) {
            Ok(bytes) => serde_json::from_slice(&bytes).with_context(|| {
                format!(
                    "{} is damaged; move it away to start without it (the images it records \
                     stay in Docker until removed by hand)",
                    file.display()
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
        };
        Ok(Self {
            holds: Arc::new(Mutex::new(holds)),
            file,
        })
    }

    fn change<T>(&self, f: impl FnOnce(&mut Vec<Hold>) -> T) -> T {
        let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        let out = f(&mut holds);
        let text = serde_json::to_string_pretty(&*holds).unwrap_or_else(|_| "[]".into());
        if let Err(e) = crate::store::write_atomic(&self.file, &text) {
            tracing::error!("cannot write {}: {e}", self.file.display());
        }
        out
    }

    fn read<T>(&self, f: impl FnOnce(&[Hold]) -> T) -> T {
        f(&self.holds.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Whether `renter` holds `image` here (staged it, and it has not expired).
    pub(crate) fn held(&self, image: &ImageDigest, renter: &PublicKey) -> bool {
        self.read(|h| h.iter().any(|h| h.image == *image && h.renter == *renter))
    }

    pub(crate) fn add(&self, hold: Hold) {
        self.change(|holds| {
            match holds
                .iter_mut()
                .find(|h| h.image == hold.image && h.renter == hold.renter)
            {
                Some(h) => h.until_ms = h.until_ms.max(hold.until_ms),
                None => holds.push(hold),
            }
        });
    }

    /// A lease of `renter` runs `image`: it is kept while the lease lasts (and no longer
    /// for not being used).
    pub(crate) fn attach(
        &self,
        image: &ImageDigest,
        renter: &PublicKey,
        lease: ContentId,
        cache: bool,
    ) {
        self.change(|holds| {
            if let Some(h) = holds
                .iter_mut()
                .find(|h| h.image == *image && h.renter == *renter)
            {
                // From now on the lease keeps it, and its end decides how much longer.
                h.leases.insert(lease, cache);
                h.until_ms = 0;
            }
        });
    }

    /// The leases for which `open` is false have ended at `now` (unix ms): each hold they
    /// kept lasts until `now`, or a day longer when the lease asked to cache its image.
    pub(crate) fn release(&self, open: impl Fn(&ContentId) -> bool, now: u64) {
        self.change(|holds| {
            for h in holds.iter_mut() {
                let ended: Vec<(ContentId, bool)> = h
                    .leases
                    .iter()
                    .filter(|(l, _)| !open(l))
                    .map(|(l, c)| (*l, *c))
                    .collect();
                for (lease, cache) in ended {
                    h.leases.remove(&lease);
                    let keep = if cache { now + CACHE_TTL_MS } else { now };
                    h.until_ms = h.until_ms.max(keep);
                }
            }
        });
    }

    /// Drops the holds that expired by `now`; returns the images no hold keeps any more and
    /// that were not the host's own: to erase.
    pub(crate) fn take_expired(&self, now: u64) -> Vec<ImageDigest> {
        self.change(|holds| {
            let (gone, kept): (Vec<Hold>, Vec<Hold>) = std::mem::take(holds)
                .into_iter()
                .partition(|h| h.leases.is_empty() && h.until_ms <= now);
            *holds = kept;
            let mut erase: Vec<ImageDigest> = gone
                .iter()
                .filter(|g| !g.host_image && !holds.iter().any(|h| h.image == g.image))
                .map(|g| g.image)
                .collect();
            erase.sort();
            erase.dedup();
            erase
        })
    }

    /// Images renters staged (not the host's own): never offered, and never counted as
    /// layers another renter may skip.
    pub(crate) fn renter_images(&self) -> BTreeSet<ImageDigest> {
        self.read(|h| {
            h.iter()
                .filter(|h| !h.host_image)
                .map(|h| h.image)
                .collect()
        })
    }

    /// Images held for other renters than `renter` only.
    pub(crate) fn foreign(&self, renter: &PublicKey) -> BTreeSet<ImageDigest> {
        let own: BTreeSet<ImageDigest> = self.read(|h| {
            h.iter()
                .filter(|h| h.renter == *renter)
                .map(|h| h.image)
                .collect()
        });
        self.renter_images()
            .into_iter()
            .filter(|i| !own.contains(i))
            .collect()
    }

    /// Whether anyone holds `image`.
    pub(crate) fn any_hold(&self, image: &ImageDigest) -> bool {
        self.read(|h| h.iter().any(|h| h.image == *image))
    }

    /// How many renters' holds there are.
    pub(crate) fn len(&self) -> usize {
        self.read(|h| h.iter().filter(|h| h.renter != ERASING).count())
    }

    /// Makes room for one more hold when renters hold `max` already: the hold that no lease
    /// runs and that would expire first is dropped (its image erased at the next sweep
    /// when no one else holds it). False when every hold is in use by a lease.
    ///
    /// Refusing new stagings once the table is full would let anyone who makes identities
    /// fill it with tiny images and keep every other renter out; dropping the stalest
    /// unused hold instead means a flood has to outpace the stagings themselves (a few at
    /// once, each loaded by Docker) to push out a hold staged moments before its lease.
    pub(crate) fn make_room(&self, max: usize) -> bool {
        if self.len() < max {
            return true;
        }
        self.change(|holds| {
            let Some(at) = holds
                .iter()
                .enumerate()
                .filter(|(_, h)| h.renter != ERASING && h.leases.is_empty())
                .min_by_key(|(_, h)| h.until_ms)
                .map(|(i, _)| i)
            else {
                return false;
            };
            let gone = holds.remove(at);
            tracing::info!(
                "dropped the staged image {} of renter {} to make room",
                gone.image,
                gone.renter
            );
            if !gone.host_image && !holds.iter().any(|h| h.image == gone.image) {
                holds.push(Hold {
                    renter: ERASING,
                    bytes: 0,
                    until_ms: 0,
                    ..gone
                });
            }
            true
        })
    }

    /// The disk renters' images take, bytes (each image once).
    pub(crate) fn bytes(&self) -> u64 {
        self.read(|h| {
            let mut seen = BTreeMap::new();
            for h in h.iter().filter(|h| !h.host_image) {
                let bytes = seen.entry(h.image).or_insert(0);
                *bytes = h.bytes.max(*bytes);
            }
            seen.values().sum()
        })
    }

    /// Erases the images whose holds expired by now.
    pub(crate) async fn erase_expired(&self, exec: &Executor) {
        for image in self.take_expired(now().0) {
            match exec.remove_image(&image).await {
                Ok(()) => tracing::info!("erased staged image {image}"),
                Err(e) => {
                    // In use still (its container is being removed): try again soon.
                    tracing::warn!("cannot erase staged image {image} yet: {e}");
                    self.add(Hold {
                        image,
                        renter: ERASING,
                        bytes: 0,
                        leases: BTreeMap::new(),
                        until_ms: now().0 + RETRY_ERASE_MS,
                        host_image: false,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(image: u8, renter: u8, host_image: bool) -> Hold {
        Hold {
            image: ImageDigest([image; 32]),
            renter: PublicKey([renter; 32]),
            bytes: 100,
            leases: BTreeMap::new(),
            until_ms: 1_000,
            host_image,
        }
    }

    #[test]
    fn holds_expire_into_erasures_and_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let staged = StagedImages::open(dir.path()).unwrap();
        staged.add(hold(1, 1, false));
        staged.add(hold(1, 2, false));
        staged.add(hold(2, 1, true));
        staged.add(hold(3, 1, false));
        let (a, b) = (PublicKey([1; 32]), PublicKey([2; 32]));
        assert!(staged.held(&ImageDigest([1; 32]), &b));
        assert!(!staged.held(&ImageDigest([3; 32]), &b));
        // Image 3 is the first renter's: the second may not skip its layers.
        assert_eq!(staged.foreign(&b), BTreeSet::from([ImageDigest([3; 32])]));
        assert_eq!(staged.bytes(), 200);

        // A lease of renter 1 runs image 3, caching it; another runs image 1, not caching.
        let (l3, l1) = (ContentId([3; 32]), ContentId([1; 32]));
        staged.attach(&ImageDigest([3; 32]), &a, l3, true);
        staged.attach(&ImageDigest([1; 32]), &a, l1, false);
        assert_eq!(staged.take_expired(5_000), Vec::<ImageDigest>::new());
        // Image 2 was the host's own: its hold went, the image stays.
        assert!(!staged.held(&ImageDigest([2; 32]), &a));

        // Restarted: the record is read back.
        let staged = StagedImages::open(dir.path()).unwrap();
        staged.release(|_| false, 10_000);
        // Image 1's last hold (renter 2's expired before) ends with its lease.
        let erased = staged.take_expired(10_000);
        assert_eq!(erased, vec![ImageDigest([1; 32])]);
        // Image 3 is cached a day for renter 1 only.
        assert!(staged.held(&ImageDigest([3; 32]), &a));
        assert_eq!(staged.take_expired(10_000 + CACHE_TTL_MS - 1), vec![]);
        assert_eq!(
            staged.take_expired(10_000 + CACHE_TTL_MS),
            vec![ImageDigest([3; 32])]
        );

        std::fs::write(dir.path().join(RECORD), b"{not json").unwrap();
        let err = StagedImages::open(dir.path()).unwrap_err();
        assert!(format!("{err:#}").contains("damaged"), "{err:#}");
    }

    #[test]
    fn a_full_table_drops_the_stalest_unused_hold_and_never_one_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let staged = StagedImages::open(dir.path()).unwrap();
        let until = |image: u8, renter: u8, until_ms| Hold {
            until_ms,
            ..hold(image, renter, false)
        };
        staged.add(until(1, 1, 5_000));
        staged.add(until(2, 2, 3_000));
        staged.add(until(2, 3, 4_000));
        staged.add(until(4, 4, 1_000));
        staged.attach(
            &ImageDigest([4; 32]),
            &PublicKey([4; 32]),
            ContentId([4; 32]),
            false,
        );
        assert!(staged.make_room(5));
        assert_eq!(staged.len(), 4);
        // Full: renter 2's hold would expire first of those no lease runs; image 2 is
        // renter 3's too, so nothing is erased.
        assert!(staged.make_room(4));
        assert_eq!(staged.len(), 3);
        assert!(!staged.held(&ImageDigest([2; 32]), &PublicKey([2; 32])));
        assert!(staged.held(&ImageDigest([2; 32]), &PublicKey([3; 32])));
        assert_eq!(staged.take_expired(0), vec![]);
        // Then renter 3's: image 2 goes at the next sweep, and the pending erasure is not
        // counted as a hold.
        assert!(staged.make_room(3));
        assert_eq!(staged.len(), 2);
        assert_eq!(staged.take_expired(0), vec![ImageDigest([2; 32])]);
        // Then renter 1's; renter 4's image runs in a lease and is never dropped.
        assert!(staged.make_room(2));
        assert!(!staged.make_room(1));
        assert!(staged.held(&ImageDigest([4; 32]), &PublicKey([4; 32])));
    }
}
