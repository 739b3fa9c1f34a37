//! The performance challenge: a renter asks a host to compute a seeded matrix product and
//! checks the answer cheaply (Freivalds); see `gpux-attestation`.

use crate::codec::{BoundedBytes, BoundedVec, Ext};
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

/// The largest host answer a [`ChallengeResult`] may carry (a challenge of `n` ≤ 1,024).
pub const MAX_RESULT_RESPONSE: usize = 40 * 1024;

/// What the challenger concluded.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ChallengeVerdict {
    /// The answer checked out; the host ran at this fraction of the GPU's nominal speed
    /// (per mille).
    Passed {
        /// Measured speed against the nominal, per mille (1000 = as fast as rated).
        speed_permille: u16,
    },
    /// The answer was wrong or late.
    Failed,
}

/// A challenger's signed account of one performance challenge of a host: its own request
/// (the seed), the host's signed answer, the verdict, and the ledger's records showing that
/// the challenger had a settled, paid lease with that host (an escrow it locked to the
/// host, and a redemption from it), so that a challenged tier costs a real payment to earn.
/// Gossiped on the attestations topic; nodes derive an offer's `challenged` tier from it.
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
pub struct ChallengeResult {
    /// The host challenged.
    pub host: PublicKey,
    /// The host's attestation the challenged GPUs appear in.
    pub attestation: ContentId,
    /// The challenger's signed [`ChallengeRequest`] (its seed).
    pub request: BoundedBytes<512>,
    /// The host's signed [`ChallengeResponse`] (its answer commitment).
    pub response: BoundedBytes<MAX_RESULT_RESPONSE>,
    /// The verdict.
    pub verdict: ChallengeVerdict,
    /// The ledger's signed record of the escrow the challenger locked to the host.
    pub locked: BoundedBytes<1024>,
    /// The ledger's signed record of a redemption from that escrow (the host was paid).
    pub paid: BoundedBytes<1024>,
    /// When.
    pub created_at: Timestamp,
    /// Extension fields.
    pub ext: Ext,
}

impl Message for ChallengeResult {
    const KIND: MessageKind = MessageKind::ChallengeResult;

    fn check(&self) -> Result<(), InvalidMessage> {
        ensure_nonempty("request", &self.request)?;
        ensure_nonempty("response", &self.response)?;
        if let ChallengeVerdict::Passed { speed_permille } = self.verdict {
            ensure_at_most("verdict.speed_permille", speed_permille.into(), 10_000)?;
        }
        Ok(())
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }
}
