//! Gossip topic names (plain strings, `IdentTopic`). The market is sharded by GPU family:
//! each family has an offer topic and an attestation topic, and a node subscribes to those of
//! the families it follows (every family unless `--market-families` names some). Bids and
//! challenge results, which are few, travel on one topic each.

use std::collections::BTreeSet;

use gpux_protocol::GpuFamily;
use libp2p::gossipsub::IdentTopic;

/// Standing bids.
pub const BIDS: &str = "gpux/bids/1";
/// Passed performance challenges' results (one per challenge).
pub const CHALLENGES: &str = "gpux/challenges/1";

/// The offer topic of a family key (`gpux/offers/1/h100`).
pub fn offers(family_key: &str) -> IdentTopic {
    IdentTopic::new(format!("gpux/offers/1/{family_key}"))
}

/// The family key of an offer topic, if it is one.
pub fn offer_family(topic: &str) -> Option<&str> {
    topic.strip_prefix("gpux/offers/1/")
}

/// The attestation topic of a family key (`gpux/attestations/1/h100`): a host publishes its
/// attestation on the topic of each family it offers.
pub fn attestations(family_key: &str) -> IdentTopic {
    IdentTopic::new(format!("gpux/attestations/1/{family_key}"))
}

/// The family key of an attestation topic, if it is one.
pub fn attestation_family(topic: &str) -> Option<&str> {
    topic.strip_prefix("gpux/attestations/1/")
}

/// Every topic the network uses.
pub fn all() -> Vec<IdentTopic> {
    subscribed(None)
}

/// The topics of a node following `families` (`None`: every family).
pub fn subscribed(families: Option<&BTreeSet<GpuFamily>>) -> Vec<IdentTopic> {
    let mut topics = vec![IdentTopic::new(BIDS), IdentTopic::new(CHALLENGES)];
    for family in GpuFamily::all().filter(|f| families.is_none_or(|set| set.contains(f))) {
        topics.push(offers(family.key()));
        topics.push(attestations(family.key()));
    }
    topics
}
