//! Gossip topic names (plain strings, `IdentTopic`), one per GPU family for offers.

use gpux_protocol::GpuFamily;
use libp2p::gossipsub::IdentTopic;

/// Attestations.
pub const ATTESTATIONS: &str = "gpux/attestations/1";
/// Standing bids.
pub const BIDS: &str = "gpux/bids/1";

/// The offer topic of a family key (`gpux/offers/1/h100`).
pub fn offers(family_key: &str) -> IdentTopic {
    IdentTopic::new(format!("gpux/offers/1/{family_key}"))
}

/// The family key of an offer topic, if it is one.
pub fn offer_family(topic: &str) -> Option<&str> {
    topic.strip_prefix("gpux/offers/1/")
}

/// Every topic the network uses: attestations, bids, and the offers of every family.
pub fn all() -> Vec<IdentTopic> {
    let mut topics = vec![IdentTopic::new(ATTESTATIONS), IdentTopic::new(BIDS)];
    topics.extend(GpuFamily::all().map(|f| offers(f.key())));
    topics
}
