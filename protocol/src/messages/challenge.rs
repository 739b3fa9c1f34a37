//! The performance challenge: a renter asks a host to compute a seeded matrix product and
//! checks the answer cheaply (Freivalds); see `gpux-attestation`.

use crate::codec::{BoundedVec, Ext};
use crate::envelope::Message;
use crate::key::PublicKey;
use crate::messages::{
    InvalidMessage, MessageKind, ensure_at_most, ensure_nonempty, ensure_nonzero,
};
use crate::types::{ContentId, GpuUuid, Timestamp};

/// The largest matrix dimension a challenge may ask for.
pub const MAX_CHALLENGE_N: usize = 4096;

/// A renter's challenge: compute the product of two `n × n` matrices derived from `seed`.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct ChallengeRequest {
    /// The host challenged.
    pub host: PublicKey,
    /// When.
    pub created_at: Timestamp,
    /// Seed of the matrices, chosen at random by the renter.
    pub seed: [u8; 32],
    /// Matrix dimension.
    pub n: u32,
    /// The GPU to run on, or any.
    pub gpu: Option<GpuUuid>,
    /// Extension fields.
    pub ext: Ext,
}

impl Message for ChallengeRequest {
    const KIND: MessageKind = MessageKind::ChallengeRequest;

    fn check(&self) -> Result<(), InvalidMessage> {
        ensure_nonzero("n", self.n.into())?;
        ensure_at_most("n", self.n.into(), MAX_CHALLENGE_N as u64)
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }
}

/// The host's answer: a digest of the product, a commitment to each row (so the renter can
/// spot-check rows), and the time the computation took.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct ChallengeResponse {
    /// Id of the challenge answered.
    pub request: ContentId,
    /// When.
    pub created_at: Timestamp,
    /// blake3 of the whole product.
    pub result_digest: ContentId,
    /// blake3 of each row, `n` of them.
    pub row_commitments: BoundedVec<ContentId, MAX_CHALLENGE_N>,
    /// Compute time, nanoseconds.
    pub elapsed_ns: u64,
    /// Extension fields.
    pub ext: Ext,
}

impl Message for ChallengeResponse {
    const KIND: MessageKind = MessageKind::ChallengeResponse;

    fn check(&self) -> Result<(), InvalidMessage> {
        ensure_nonempty("row_commitments", &self.row_commitments)?;
        ensure_nonzero("elapsed_ns", self.elapsed_ns)
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }
}
