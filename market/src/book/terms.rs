//! What an offer in the book says beyond what search indexes: its images, kept
//! workspaces, machine share, registry pulls, cancellation fees, family and MIG profile, as
//! a rent needs them once it picked the offer.

use gpux_protocol::{ContentId, GpuFamily, ImageDigest, MicroCredits, Share};

use super::OrderBook;

impl OrderBook {
    /// The images an offer lists.
    pub fn offer_images(&self, offer: &ContentId) -> Option<&[ImageDigest]> {
        self.by_id
            .get(offer)
            .and_then(|&i| self.entry(i))
            .map(|e| &e.images[..])
    }

    /// What an offer says of kept workspaces: the price per GiB-hour and the longest it keeps
    /// one (when it says).
    pub fn offer_retention(&self, offer: &ContentId) -> Option<(MicroCredits, Option<u64>)> {
        let e = self.by_id.get(offer).and_then(|&i| self.entry(i))?;
        Some((MicroCredits(e.disk_price), e.max_retain_s))
    }

    /// What of its host's machine goes with each GPU of an offer (`None` for an unknown
    /// offer).
    pub fn offer_share(&self, offer: &ContentId) -> Option<Share> {
        let e = self.by_id.get(offer).and_then(|&i| self.entry(i))?;
        Some(e.share)
    }

    /// What an offer's host pulls from registries, and has cached (`None` for an unknown
    /// offer).
    pub fn offer_pulls(&self, offer: &ContentId) -> Option<gpux_protocol::Pulls> {
        let e = self.by_id.get(offer).and_then(|&i| self.entry(i))?;
        use gpux_protocol::{BoundedString, BoundedVec};
        // (Each was a bounded string of the offer when it was verified.)
        Some(gpux_protocol::Pulls {
            max_bytes: e.pull_bytes,
            timeout_s: e.pull_timeout_s,
            registries: BoundedVec::new(
                e.pull_registries
                    .iter()
                    .map(|r| BoundedString::new(&**r).unwrap_or_default())
                    .collect(),
            )
            .unwrap_or_default(),
            cached: BoundedVec::new(
                e.cached
                    .iter()
                    .map(|&i| BoundedString::new(self.images.name(i)).unwrap_or_default())
                    .collect(),
            )
            .unwrap_or_default(),
        })
    }

    /// The cancellation fee schedule an offer publishes for reserved windows (`None` for
    /// an unknown offer; empty: free).
    pub fn offer_cancel_fees(&self, offer: &ContentId) -> Option<gpux_protocol::CancelFees> {
        let e = self.by_id.get(offer).and_then(|&i| self.entry(i))?;
        Some(e.cancel_fees.clone())
    }

    /// Whether an offer stands on more than its host's word: a challenge passed, or
    /// confidential-computing attestation.
    pub fn offer_challenged(&self, offer: &ContentId) -> bool {
        self.by_id
            .get(offer)
            .and_then(|&i| self.entry(i))
            .is_some_and(|e| {
                u64::from(e.tier) >= crate::query::tier_key(gpux_protocol::EvidenceTier::Challenged)
            })
    }

    /// The GPU family of an offer (its first GPU's).
    pub fn offer_family(&self, offer: &ContentId) -> Option<GpuFamily> {
        let e = self.by_id.get(offer).and_then(|&i| self.entry(i))?;
        Some(e.family)
    }

    /// The memory of each of an offer's GPUs (or MIG slices), GB.
    pub fn offer_vram_gb(&self, offer: &ContentId) -> Option<u16> {
        let e = self.by_id.get(offer).and_then(|&i| self.entry(i))?;
        Some(e.vram_gb)
    }

    /// The MIG profile of an offer of slices (`None` for whole GPUs or an unknown offer).
    pub fn offer_mig_profile(&self, offer: &ContentId) -> Option<&str> {
        let e = self.by_id.get(offer).and_then(|&i| self.entry(i))?;
        e.mig_profile.as_deref()
    }

    /// The image an offer lists under a tag matching `pattern` (see
    /// [`crate::query::tag_matches`]), if any.
    pub fn offer_image_tagged(&self, offer: &ContentId, pattern: &str) -> Option<ImageDigest> {
        let e = self.by_id.get(offer).and_then(|&i| self.entry(i))?;
        e.tags
            .iter()
            .find(|(_, t)| crate::query::tag_matches(pattern, t))
            .map(|(d, _)| *d)
    }
}
