//! A host's publication: the attestation re-signed, one offer per GPU model of the GPUs that
//! are free (each in its own slot; MIG instances in slots of their own, one per profile),
//! and withdrawals of slots whose GPUs are all leased.

use anyhow::Context;
use gpux_lease::HostBook;
use gpux_protocol::{
    Attestation, BoundedString, BoundedVec, ContentId, EvidenceTier, Ext, GpuFacts, GpuFamily,
    GpuUuid, Keypair, MicroCredits, MigInstance, Offer, OfferGpu, OfferTerms, OfferWithdrawal,
    Signed, Timestamp, Verified,
};

use crate::daemon::HostOptions;
use crate::p2p::{Client, topics};

/// What one publication sends, and what it changes in the store.
#[derive(Debug, Default)]
pub(crate) struct Published {
    /// The attestation, freshly signed.
    pub(crate) attestation: Option<Verified<Attestation>>,
    /// The offers.
    pub(crate) offers: Vec<Verified<Offer>>,
    /// The withdrawals.
    pub(crate) withdrawals: Vec<Verified<OfferWithdrawal>>,
    /// Own offers to store.
    pub(crate) stored: Vec<(ContentId, Vec<u8>)>,
    /// Own offers to forget.
    pub(crate) forgotten: Vec<ContentId>,
    /// The topic of each withdrawal.
    withdrawal_families: Vec<String>,
}

impl Published {
    /// Publishes everything, from a task of its own (with no peer yet publishing fails; the
    /// next tick or the next subscriber retries).
    pub(crate) fn send(&self, net: &Client) {
        let mut messages = Vec::new();
        // The attestation goes on the topic of each family offered (before the offers, which
        // peers drop until they have it).
        if let Some(att) = &self.attestation {
            let families: std::collections::BTreeSet<&str> =
                self.offers.iter().map(|o| o.topic_family()).collect();
            for family in families {
                messages.push((
                    topics::attestations(family).to_string(),
                    att.as_bytes().to_vec(),
                ));
            }
        }
        for offer in &self.offers {
            messages.push((
                topics::offers(offer.topic_family()).to_string(),
                offer.as_bytes().to_vec(),
            ));
        }
        for (w, topic) in self.withdrawals.iter().zip(&self.withdrawal_families) {
            messages.push((topic.clone(), w.as_bytes().to_vec()));
        }
        let net = net.clone();
        tokio::spawn(async move {
            for (topic, data) in messages {
                let _ = net.publish(topic, data).await;
            }
        });
    }
}

/// Signs a publication at `t`. The attestation is re-signed with every publication: a new
/// message, so peers that joined since receive it (they ignore offers whose attestation they
/// have not seen). Publications are paced by the caller, which keeps a host well under the
/// per-signer gossip rate limit. An offer listing a device in `challenged` (a renter's
/// passed challenge that this node holds, on the ledger's records of a paid lease) claims
/// the `challenged` tier; renters check the claim against the results they hold.
pub(crate) fn sign(
    key: &Keypair,
    att: &mut Verified<Attestation>,
    book: &mut HostBook,
    options: &HostOptions,
    (policy, challenged): (OfferTerms, &std::collections::BTreeSet<GpuUuid>),
    t: Timestamp,
) -> anyhow::Result<Published> {
    // What the host keeps off the market (`gpux host pause|drain`, failed GPUs).
    let withheld = book.withheld().clone();
    // A draining host offers leases that end by its drain time; once none of its minimum
    // duration fits, it offers nothing.
    let max_duration_s = match withheld.drain_until {
        Some(until) => options
            .max_duration_s
            .min(u32::try_from(until.ms_since(t) / 1000).unwrap_or(u32::MAX)),
        None => options.max_duration_s,
    };
    let paused = withheld.paused || max_duration_s < options.min_duration_s.max(1);
    let mut body = att.body().clone();
    body.created_at = t;
    *att = Signed::sign(key, body).context("signing the attestation")?;
    // A GPU and its MIG instances are one piece of hardware: the book keeps a lease on
    // one from overlapping a lease on the other.
    book.set_mig_layout(
        att.gpus
            .iter()
            .flat_map(|g| mig_instances(g).iter().map(move |i| (g.uuid, i.uuid))),
    );
    let mut groups: Vec<Vec<Unit<'_>>> = Vec::new();
    let units = att
        .gpus
        .iter()
        .map(|g| Unit {
            gpu: g,
            slice: None,
        })
        .chain(att.gpus.iter().flat_map(|g| {
            mig_instances(g).iter().map(move |i| Unit {
                gpu: g,
                slice: Some(i),
            })
        }));
    for unit in units {
        match groups
            .iter_mut()
            .find(|g| g.len() < gpux_protocol::MAX_OFFER_GPUS && g[0].same_model(&unit))
        {
            Some(group) => group.push(unit),
            None => groups.push(vec![unit]),
        }
    }
    // GPUs leased now are not offered: each publication lists what is free (or under a spot
    // lease, which an on-demand lease may preempt), and a slot whose GPUs are all leased is
    // withdrawn until they come back.
    let busy = book.unoffered_gpus(t);
    let mut published = Published {
        attestation: Some(att.clone()),
        ..Published::default()
    };
    for (slot, group) in groups.iter().enumerate() {
        // A paused host offers nothing: every slot is withdrawn; a failed GPU (or a slice
        // of one) is withheld until it is checked.
        let group: Vec<_> = group
            .iter()
            .filter(|g| {
                !paused && !busy.contains(&g.uuid()) && !withheld.failed.contains(&g.gpu.uuid)
            })
            .collect();
        if group.is_empty() {
            if let Some(old) = book.retire_slot(slot as u16) {
                let body = OfferWithdrawal {
                    seq: t.0 * 64 + slot as u64,
                    created_at: t,
                    offer: old.id(),
                    ext: Ext::new(),
                };
                let w = Signed::sign(key, body).context("signing a withdrawal")?;
                published.forgotten.push(old.id());
                published
                    .withdrawal_families
                    .push(topics::offers(old.topic_family()).to_string());
                published.withdrawals.push(w);
            }
            continue;
        }
        let gpus = group
            .iter()
            .map(|u| OfferGpu {
                uuid: u.uuid(),
                family: BoundedString::new(GpuFamily::classify(&u.gpu.name).key())
                    .unwrap_or_default(),
                memory_bytes: u.memory(),
                compute_capability: u.gpu.compute_capability,
                pcie_gen: u.gpu.pcie.max_gen.unwrap_or(0),
            })
            .collect();
        // Windows booked ahead on these GPUs, the earliest first: renters leave them alone.
        let mut booked: Vec<(u8, Timestamp, Timestamp)> = group
            .iter()
            .enumerate()
            .flat_map(|(i, g)| {
                book.booked_ahead(&g.uuid(), t)
                    .into_iter()
                    .map(move |(start, end)| (i as u8, start, end))
            })
            .collect();
        booked.sort_by_key(|&(i, start, _)| (start, i));
        let mut terms = policy.clone();
        // Slices are priced by their share of the GPU's compute.
        let (mut price, mut spot_floor) = (options.price, options.spot_floor);
        if let Some(slice) = group[0].slice {
            terms.mig_profile = BoundedString::new(slice.profile.clone()).ok();
            price = slice_price(price, group[0]);
            spot_floor = spot_floor.map(|p| slice_price(p, group[0]));
        }
        terms.booked = Offer::booked_windows(&booked);
        let offer = Offer {
            // Unix milliseconds plus the slot: grows across restarts without a counter.
            seq: t.0 * 64 + slot as u64,
            slot: slot as u16,
            created_at: t,
            expires_at: t.plus_secs(options.offer_ttl_s),
            attestation: att.id(),
            gpus: BoundedVec::new(gpus).map_err(|e| anyhow::anyhow!("{e}"))?,
            price_per_gpu_hour: price,
            spot_floor_per_gpu_hour: spot_floor,
            min_duration_s: options.min_duration_s,
            max_duration_s,
            region: BoundedString::new(options.region.clone())
                .map_err(|e| anyhow::anyhow!("region: {e}"))?,
            tier: if group.iter().any(|u| challenged.contains(&u.uuid())) {
                EvidenceTier::Challenged
            } else {
                EvidenceTier::SelfReported
            },
            driver: att.driver_version.parse().unwrap_or_default(),
            cuda: att.cuda_driver_version.unwrap_or_default(),
            images: BoundedVec::new(options.images.clone())
                .map_err(|e| anyhow::anyhow!("images: {e}"))?,
            machine: options.machine.for_offer(
                att.gpus.len(),
                GpuFamily::classify(&group[0].gpu.name),
                group[0].slice.map(|s| s.profile.as_str()),
            ),
            pulls: options.pulls.clone(),
            terms,
            ext: Ext::new(),
        };
        let signed = sign_with_tags(key, offer, options)?;
        let change = book.add_offer(signed.clone(), t);
        published.stored.extend(change.store);
        published.forgotten.extend(change.forget);
        published.offers.push(signed);
    }
    Ok(published)
}

/// One unit a host offers: a whole GPU, or one MIG instance of it.
#[derive(Debug, Clone, Copy)]
struct Unit<'a> {
    gpu: &'a GpuFacts,
    slice: Option<&'a MigInstance>,
}

impl Unit<'_> {
    fn uuid(&self) -> GpuUuid {
        self.slice.map_or(self.gpu.uuid, |s| s.uuid)
    }

    fn memory(&self) -> u64 {
        self.slice
            .map_or(self.gpu.memory_total_bytes, |s| s.memory_total_bytes)
    }

    /// Whether one offer may list both: the same model and memory, and for slices the same
    /// profile.
    fn same_model(&self, other: &Unit<'_>) -> bool {
        self.gpu.name == other.gpu.name
            && self.memory() == other.memory()
            && self.gpu.compute_capability == other.gpu.compute_capability
            && self.slice.map(|s| &s.profile) == other.slice.map(|s| &s.profile)
    }
}

/// The MIG instances of `gpu` that are offered (none unless MIG is on).
pub(super) fn mig_instances(gpu: &GpuFacts) -> &[MigInstance] {
    match &gpu.mig {
        Some(m) if m.enabled => &m.instances,
        _ => &[],
    }
}

/// A whole-GPU price scaled to a slice's share of the GPU's compute (its profile's slices
/// over the family's, 7 when the family table does not say), at least one micro-credit.
fn slice_price(price: MicroCredits, unit: &Unit<'_>) -> MicroCredits {
    let Some(slice) = unit.slice else {
        return price;
    };
    let (n, of) = GpuFamily::classify(&unit.gpu.name)
        .mig_share(&slice.profile)
        .unwrap_or((1, 7));
    MicroCredits((price.0 * u64::from(n) / u64::from(of)).max(1))
}

/// Offers stay under this many bytes, signed: image tags that would not fit are left out.
pub(crate) const MAX_OFFER_BYTES: usize = 1024;

/// Signs `offer` with the tags of its images (`OfferTerms::image_tags`), as many as fit in
/// [`MAX_OFFER_BYTES`], the last ones left out first; then, when even without tags it does
/// not fit, with fewer of its cached images (the least recently used left out first).
fn sign_with_tags(
    key: &Keypair,
    offer: Offer,
    options: &HostOptions,
) -> anyhow::Result<Verified<Offer>> {
    let mut lines: Vec<Vec<String>> = offer
        .images
        .iter()
        .map(|i| options.image_tags.get(i).cloned().unwrap_or_default())
        .collect();
    let mut cached = offer.pulls.cached.to_vec();
    loop {
        while lines.last().is_some_and(Vec::is_empty) {
            lines.pop();
        }
        let tags = lines
            .iter()
            .map(|l| {
                let tags = l
                    .iter()
                    .filter_map(|t| BoundedString::new(t.clone()).ok())
                    .take(gpux_protocol::MAX_IMAGE_TAGS)
                    .collect();
                BoundedVec::new(tags).unwrap_or_default()
            })
            .collect();
        let body = Offer {
            terms: OfferTerms {
                image_tags: BoundedVec::new(tags).unwrap_or_default(),
                ..offer.terms.clone()
            },
            pulls: gpux_protocol::Pulls {
                cached: BoundedVec::new(cached.clone()).map_err(|e| anyhow::anyhow!("{e}"))?,
                ..offer.pulls.clone()
            },
            ..offer.clone()
        };
        let signed = Signed::sign(key, body).context("signing an offer")?;
        if signed.as_bytes().len() <= MAX_OFFER_BYTES || (lines.is_empty() && cached.is_empty()) {
            return Ok(signed);
        }
        if lines.is_empty() {
            cached.pop();
        } else {
            drop_last_tag(&mut lines);
        }
    }
}

fn drop_last_tag(lines: &mut [Vec<String>]) {
    if let Some(line) = lines.iter_mut().rev().find(|l| !l.is_empty()) {
        line.pop();
    }
}

impl super::HostRole {
    /// What this host's offers say of its workspaces (the largest it gives now, and the
    /// longest it keeps one after its lease; nothing when it offers none), of renters'
    /// images (the largest it stages; nothing when it stages none) and of cancelling a
    /// reserved window (its fee schedule).
    fn offer_policy(&self) -> OfferTerms {
        let mut terms = OfferTerms {
            cancel_fees: self.options.cancel_fees.clone(),
            max_image_bytes: self
                .options
                .max_image_bytes
                .min(self.options.stage_quota_bytes),
            ..OfferTerms::default()
        };
        if self.options.disk_quota_bytes > 0 {
            terms.workspace_bytes = self.workspace_free();
            terms.max_retain_s = Some(self.options.max_retain_s);
            terms.workspace_price = self.options.disk_price;
        }
        terms
    }

    /// The families of the GPUs this host shares (from its attestation).
    pub(crate) fn families(&self) -> std::collections::BTreeSet<gpux_protocol::GpuFamily> {
        self.attestation
            .iter()
            .flat_map(|a| a.gpus.iter())
            .map(|g| gpux_protocol::GpuFamily::classify(&g.name))
            .collect()
    }

    /// The machine this host gives its leases (shared with what measures it).
    pub(crate) fn machine(&self) -> crate::machine::MachineFacts {
        self.options.machine.clone()
    }

    /// Signs fresh offers of the free GPUs and the attestation, to publish.
    pub(crate) fn publish_offers(&mut self, t: Timestamp) -> anyhow::Result<Published> {
        self.last_publish = t;
        self.publish_pending = false;
        let policy = self.offer_policy();
        // The cache as it stands: offers list its images, most recently used first (as many
        // as fit; see `offers::sign`).
        if self.options.pulls.max_bytes > 0 {
            let listed: Vec<BoundedString<128>> = self
                .pull_cache
                .listed()
                .into_iter()
                .filter_map(|r| BoundedString::new(r).ok())
                .filter(|r| gpux_protocol::is_image_tag(r))
                .take(gpux_protocol::MAX_CACHED_IMAGES)
                .collect();
            self.options.pulls.cached = gpux_protocol::BoundedVec::new(listed).unwrap_or_default();
        }
        let Some(att) = self.attestation.as_mut() else {
            return Ok(Published::default());
        };
        let published = sign(
            &self.key,
            att,
            &mut self.book,
            &self.options,
            (policy, &self.challenged),
            t,
        )?;
        for (id, bytes) in &published.stored {
            if let Err(e) = self.state.save_own_offer(id, bytes) {
                // Published all the same; a restart republishes from the GPUs it finds.
                tracing::error!("offer {}: cannot store it: {e}", id.short());
            }
        }
        for id in &published.forgotten {
            if let Err(e) = self.state.remove_own_offer(id) {
                tracing::error!("offer {}: cannot forget it: {e}", id.short());
            }
        }
        Ok(published)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpux_protocol::{ImageDigest, MicroCredits};
    use gpux_testkit as kit;

    fn options(images: usize, tag_len: usize) -> HostOptions {
        let images: Vec<ImageDigest> = (0..images).map(|i| ImageDigest([i as u8; 32])).collect();
        let image_tags = images
            .iter()
            .enumerate()
            .map(|(i, d)| (*d, vec![format!("{i}{}:latest", "x".repeat(tag_len))]))
            .collect();
        HostOptions {
            nvml_lib: None,
            price: MicroCredits(1_000_000),
            spot_floor: None,
            region: "eu".into(),
            images,
            image_tags,
            min_duration_s: 60,
            max_duration_s: 3600,
            offer_ttl_s: 600,
            republish_s: 120,
            fake_gpus: true,
            disk_quota_bytes: 0,
            workspace_root: "/nonexistent".into(),
            max_retain_s: 3600,
            disk_price: MicroCredits::ZERO,
            max_image_bytes: 1 << 30,
            stage_quota_bytes: 1 << 30,
            cancel_fees: Default::default(),
            staging_root: "/nonexistent".into(),
            run_root: "/nonexistent".into(),
            cpus: Some(8),
            memory_bytes: Some(64 << 30),
            machine: crate::machine::MachineFacts::read(Some(8), Some(64 << 30)),
            pulls: gpux_protocol::Pulls::default(),
            pull_cache_bytes: 0,
        }
    }

    fn offer(options: &HostOptions) -> Offer {
        Offer {
            expires_at: Timestamp(2_000),
            attestation: ContentId([9; 32]),
            price_per_gpu_hour: options.price,
            min_duration_s: 60,
            max_duration_s: 3600,
            images: kit::list(options.images.clone()),
            machine: options
                .machine
                .for_offer(1, GpuFamily::classify("NVIDIA L4"), None),
            pulls: options.pulls.clone(),
            ..kit::offer(
                Timestamp(1_000),
                [kit::offer_gpu(kit::gpu(1), "l4", 24 << 30, (8, 9))],
            )
        }
    }

    #[test]
    fn a_slice_costs_its_share_of_the_gpus_compute() {
        let gpu = |name: &str| kit::gpu_facts(0, name, 80 << 30, (8, 0));
        let slice = |profile: &str| MigInstance {
            uuid: GpuUuid::Mig([2; 16]),
            profile: BoundedString::new(profile).unwrap(),
            memory_total_bytes: 10 << 30,
        };
        let price = MicroCredits(3_600_000);
        let (a100, a30) = (gpu("NVIDIA A100-SXM4-80GB"), gpu("NVIDIA A30"));
        let (one, three, two) = (slice("1g.10gb"), slice("3g.40gb"), slice("2g.12gb"));
        let unit = |gpu, slice| Unit {
            gpu,
            slice: Some(slice),
        };
        assert_eq!(slice_price(price, &unit(&a100, &one)).0, 3_600_000 / 7);
        assert_eq!(
            slice_price(price, &unit(&a100, &three)).0,
            3_600_000 * 3 / 7
        );
        // An A30 cuts into 4.
        assert_eq!(slice_price(price, &unit(&a30, &two)).0, 1_800_000);
        // A whole GPU keeps its price.
        let whole = Unit {
            gpu: &a100,
            slice: None,
        };
        assert_eq!(slice_price(price, &whole), price);
    }

    #[test]
    fn offers_list_tags_and_stay_under_a_kibibyte() {
        let key = Keypair::from_seed(&[3; 32]);
        // Short tags: every one is listed, each with its image.
        let few = options(2, 8);
        let signed = sign_with_tags(&key, offer(&few), &few).unwrap();
        let tags = signed.image_tags();
        assert_eq!(tags.len(), 2);
        assert_eq!(
            tags[1],
            (ImageDigest([1; 32]), format!("1{}:latest", "x".repeat(8)))
        );
        // Eight images with long tags: the last tags are left out, the offer fits.
        let many = options(8, 100);
        let signed = sign_with_tags(&key, offer(&many), &many).unwrap();
        assert!(
            signed.as_bytes().len() <= MAX_OFFER_BYTES,
            "{}",
            signed.as_bytes().len()
        );
        let tags = signed.image_tags();
        assert!(!tags.is_empty() && tags.len() < 8, "{tags:?}");
        assert_eq!(tags[0].0, ImageDigest([0; 32]));
    }

    #[test]
    fn an_offer_lists_sixteen_cached_images_in_a_kibibyte_and_leaves_out_the_oldest_past_it() {
        let key = Keypair::from_seed(&[3; 32]);
        let mut options = options(1, 8);
        let cached = |names: &[String]| {
            BoundedVec::new(
                names
                    .iter()
                    .map(|n| BoundedString::new(n.as_str()).unwrap())
                    .collect(),
            )
            .unwrap()
        };
        // Sixteen real-world names, most recent first.
        let names: Vec<String> = [
            "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
            "pytorch/pytorch:2.4.1-cuda12.1-cudnn9-devel",
            "vllm/vllm-openai:v0.6.4",
            "nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04",
            "nvcr.io/nvidia/pytorch:24.10-py3",
            "tensorflow/tensorflow:2.18.0-gpu",
            "huggingface/transformers-pytorch-gpu:4.41.2",
            "ghcr.io/huggingface/text-generation-inference:2.4",
            "jupyter/pytorch-notebook:cuda12-2024-10-07",
            "python:3.12-slim",
            "ubuntu:24.04",
            "rocker/ml-verse:4.4",
            "ollama/ollama:0.4.2",
            "nvidia/cuda:12.6.2-devel-ubuntu24.04",
            "lmsysorg/sglang:v0.3.6-cu124",
            "ghcr.io/ggerganov/llama.cpp:server-cuda",
        ]
        .map(String::from)
        .to_vec();
        options.pulls = gpux_protocol::Pulls {
            max_bytes: 40 << 30,
            timeout_s: 1800,
            registries: BoundedVec::empty(),
            cached: cached(&names),
        };
        let signed = sign_with_tags(&key, offer(&options), &options).unwrap();
        assert!(
            signed.as_bytes().len() <= MAX_OFFER_BYTES,
            "{}",
            signed.as_bytes().len()
        );
        assert_eq!(signed.pulls.cached.len(), 16);
        // Names twice as long: the offer still fits, listing the most recent ones.
        let long: Vec<String> = names.iter().map(|n| format!("{n}-{n}")).take(16).collect();
        let long: Vec<String> = long
            .into_iter()
            .map(|n| n.chars().take(120).collect())
            .collect();
        options.pulls.cached = cached(&long);
        let signed = sign_with_tags(&key, offer(&options), &options).unwrap();
        assert!(
            signed.as_bytes().len() <= MAX_OFFER_BYTES,
            "{}",
            signed.as_bytes().len()
        );
        let listed = signed.pulls.cached.len();
        assert!((1..16).contains(&listed), "{listed}");
        assert_eq!(signed.pulls.cached[0].as_str(), long[0]);
    }
}
