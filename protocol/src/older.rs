//! Envelopes of older message versions, signed as a build that spoke them would have
//! (feature `test-util` only): for the tests that show this build still reads them, as a
//! host upgraded mid-lease finds them in its store. Never enabled in a node.

use crate::envelope::{MAGIC, Message};
use crate::key::Keypair;
use crate::messages::{LeaseAccept, LeaseRequest, Offer, UsageReceipt};

/// `receipt` as a version 1 `UsageReceipt` envelope signed by `key`: its workspace charge
/// in ext key 1 (none when zero), as version 1 carried it.
pub fn usage_receipt_v1(key: &Keypair, receipt: &UsageReceipt) -> Vec<u8> {
    let body = crate::messages::usage_receipt_v1_body(receipt);
    envelope(key, UsageReceipt::KIND.code(), 1, &body)
}

/// `accept` as a version 1 `LeaseAccept` envelope signed by `key`: its terms in ext keys 1
/// to 4 (the start only when it has one), as version 1 carried them.
pub fn lease_accept_v1(key: &Keypair, accept: &LeaseAccept) -> Vec<u8> {
    let body = crate::messages::lease_accept_v1_body(accept);
    envelope(key, LeaseAccept::KIND.code(), 1, &body)
}

/// `request` as a version 4 `LeaseRequest` envelope signed by `key`: its terms in ext keys
/// 1 to 8 (each only when set), as version 4 carried them.
pub fn lease_request_v4(key: &Keypair, request: &LeaseRequest) -> Vec<u8> {
    let body = crate::messages::lease_request_v4_body(request);
    envelope(key, LeaseRequest::KIND.code(), 4, &body)
}

/// `offer` as a version 4 `Offer` envelope signed by `key`: its terms in ext keys 1 to 8
/// (each only when set), as version 4 carried them.
pub fn offer_v4(key: &Keypair, offer: &Offer) -> Vec<u8> {
    let body = crate::messages::offer_v4_body(offer);
    envelope(key, Offer::KIND.code(), 4, &body)
}

fn envelope(key: &Keypair, kind: u8, version: u8, body: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(38 + body.len() + 64);
    bytes.extend_from_slice(&MAGIC);
    bytes.push(kind);
    bytes.push(version);
    bytes.extend_from_slice(&key.public().0);
    bytes.extend_from_slice(body);
    let signature = key.sign_raw(&bytes);
    bytes.extend_from_slice(&signature);
    bytes
}
