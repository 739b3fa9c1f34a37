//! A host's publication: the attestation re-signed, one offer per GPU model of the GPUs that
//! are free (each in its own slot), and withdrawals of slots whose GPUs are all leased.

use anyhow::Context;
use gpux_lease::HostBook;
use gpux_protocol::{
    Attestation, BoundedString, BoundedVec, ContentId, EvidenceTier, Ext, GpuFacts, GpuFamily,
    Keypair, Offer, OfferGpu, OfferWithdrawal, Signed, Timestamp, Verified,
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
        if let Some(att) = &self.attestation {
            messages.push((topics::ATTESTATIONS.to_string(), att.as_bytes().to_vec()));
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
/// per-signer gossip rate limit.
pub(crate) fn sign(
    key: &Keypair,
    att: &mut Verified<Attestation>,
    book: &mut HostBook,
    options: &HostOptions,
    policy: Ext,
    t: Timestamp,
) -> anyhow::Result<Published> {
    let mut body = att.body().clone();
    body.created_at = t;
    *att = Signed::sign(key, body).context("signing the attestation")?;
    let mut groups: Vec<Vec<&GpuFacts>> = Vec::new();
    for gpu in att.gpus.iter() {
        match groups.iter_mut().find(|g| {
            g.len() < gpux_protocol::MAX_OFFER_GPUS
                && g[0].name == gpu.name
                && g[0].memory_total_bytes == gpu.memory_total_bytes
                && g[0].compute_capability == gpu.compute_capability
        }) {
            Some(group) => group.push(gpu),
            None => groups.push(vec![gpu]),
        }
    }
    // GPUs leased now are not offered: each publication lists what is free, and a slot whose
    // GPUs are all leased is withdrawn until they come back.
    let busy = book.busy_gpus(t);
    let mut published = Published {
        attestation: Some(att.clone()),
        ..Published::default()
    };
    for (slot, group) in groups.iter().enumerate() {
        let group: Vec<_> = group.iter().filter(|g| !busy.contains(&g.uuid)).collect();
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
            .map(|g| OfferGpu {
                uuid: g.uuid,
                family: BoundedString::new(GpuFamily::classify(&g.name).key()).unwrap_or_default(),
                memory_bytes: g.memory_total_bytes,
                compute_capability: g.compute_capability,
                pcie_gen: g.pcie.max_gen.unwrap_or(0),
            })
            .collect();
        let offer = Offer {
            // Unix milliseconds plus the slot: grows across restarts without a counter.
            seq: t.0 * 64 + slot as u64,
            slot: slot as u16,
            created_at: t,
            expires_at: t.plus_secs(options.offer_ttl_s),
            attestation: att.id(),
            gpus: BoundedVec::new(gpus).map_err(|e| anyhow::anyhow!("{e}"))?,
            price_per_gpu_hour: options.price,
            spot_floor_per_gpu_hour: options.spot_floor,
            min_duration_s: options.min_duration_s,
            max_duration_s: options.max_duration_s,
            region: BoundedString::new(options.region.clone())
                .map_err(|e| anyhow::anyhow!("region: {e}"))?,
            tier: EvidenceTier::SelfReported,
            driver: att.driver_version.parse().unwrap_or_default(),
            cuda: att.cuda_driver_version.unwrap_or_default(),
            images: BoundedVec::new(options.images.clone())
                .map_err(|e| anyhow::anyhow!("images: {e}"))?,
            ext: policy.clone(),
        };
        let signed = Signed::sign(key, offer).context("signing an offer")?;
        let change = book.add_offer(signed.clone(), t);
        published.stored.extend(change.store);
        published.forgotten.extend(change.forget);
        published.offers.push(signed);
    }
    Ok(published)
}
