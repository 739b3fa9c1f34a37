//! The performance challenge: a renter asks a host to compute a seeded INT8 matrix product,
//! the host commits to its rows, and the renter checks a few rows it picks afterwards; see
//! `gpux_attestation::challenge`.

use crate::codec::{BoundedBytes, Ext};
use crate::envelope::Message;
use crate::key::PublicKey;
use crate::messages::{
    InvalidMessage, MessageKind, ensure_at_most, ensure_nonempty, ensure_nonzero,
};
use crate::types::{ContentId, GpuUuid, Timestamp};

/// The most rows of `A` (and of the product) a challenge may ask for.
pub const MAX_CHALLENGE_M: u32 = 1 << 24;
/// The longest sum a challenge may ask for: `k · 2^14` must fit an `i32`.
pub const MAX_CHALLENGE_K: u32 = 1 << 16;
/// The most columns of `B` (and of the product) a challenge may ask for.
pub const MAX_CHALLENGE_N: u32 = 1 << 14;

/// The most lanes a challenge's memory fill may have.
pub const MAX_FILL_LANES: u32 = 1 << 16;
/// The most 1 KiB blocks in one lane of a fill.
pub const MAX_FILL_BLOCKS: u32 = 1 << 24;

/// A renter's challenge: fill `fill_lanes × fill_blocks` KiB of memory from `seed` (a
/// memory-hard fill: its size and bandwidth), then compute the product of the `m × k` and
/// `k × n` INT8 matrices derived from `seed` (tensor throughput), committing to each.
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
    /// Rows of `A` and of the product.
    pub m: u32,
    /// Columns of `A`, rows of `B`.
    pub k: u32,
    /// Columns of `B` and of the product.
    pub n: u32,
    /// Lanes of the memory fill (0: no fill).
    pub fill_lanes: u32,
    /// 1 KiB blocks in each lane of the fill (0: no fill).
    pub fill_blocks: u32,
    /// The GPU to run on, or any.
    pub gpu: Option<GpuUuid>,
    /// Extension fields.
    pub ext: Ext,
}

impl Message for ChallengeRequest {
    const KIND: MessageKind = MessageKind::ChallengeRequest;

    fn check(&self) -> Result<(), InvalidMessage> {
        for (field, value, max) in [
            ("m", self.m, MAX_CHALLENGE_M),
            ("k", self.k, MAX_CHALLENGE_K),
            ("n", self.n, MAX_CHALLENGE_N),
        ] {
            ensure_nonzero(field, value.into())?;
            ensure_at_most(field, value.into(), max.into())?;
        }
        if self.fill_lanes > 0 || self.fill_blocks > 0 {
            ensure_nonzero("fill_lanes", self.fill_lanes.into())?;
            ensure_nonzero("fill_blocks", self.fill_blocks.into())?;
            ensure_at_most("fill_lanes", self.fill_lanes.into(), MAX_FILL_LANES.into())?;
            ensure_at_most(
                "fill_blocks",
                self.fill_blocks.into(),
                MAX_FILL_BLOCKS.into(),
            )?;
        }
        Ok(())
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }
}

/// The host's answer: the Merkle root over its product's row hashes (it opens the rows the
/// renter picks afterwards, each with its path), and the time the computation took.
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
    /// The Merkle root over the product's `m` row hashes.
    pub rows_root: ContentId,
    /// The Merkle root over the fill's blocks, lane by lane (`None`: no fill asked).
    pub fill_root: Option<ContentId>,
    /// Compute time, nanoseconds.
    pub elapsed_ns: u64,
    /// Extension fields.
    pub ext: Ext,
}

impl Message for ChallengeResponse {
    const KIND: MessageKind = MessageKind::ChallengeResponse;

    fn check(&self) -> Result<(), InvalidMessage> {
        ensure_nonzero("elapsed_ns", self.elapsed_ns)
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }
}

/// The largest host answer a [`ChallengeResult`] may carry.
pub const MAX_RESULT_RESPONSE: usize = 1024;

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
