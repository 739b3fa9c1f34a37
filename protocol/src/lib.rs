//! The gpux wire protocol: node keys, the signed envelope, every message type, the GPU
//! family table, money, and the validation rules that need no network. No I/O here.
//!
//! Every promise in the exchange is a [`Signed<T>`] envelope. The only way to read one is to
//! verify it, which yields a [`Verified<T>`]: the type the rest of gpux accepts.
//!
//! ```
//! use gpux_protocol::{
//!     BoundedVec, Ext, Keypair, OfferWithdrawal, Signed, ContentId, Timestamp,
//! };
//!
//! let host = Keypair::from_seed(&[7; 32]);
//! let withdrawal = OfferWithdrawal {
//!     seq: 2,
//!     created_at: Timestamp(1_700_000_000_000),
//!     offer: ContentId([1; 32]),
//!     ext: Ext::new(),
//! };
//! let sent = Signed::sign(&host, withdrawal)?;
//!
//! // On the other side: framing, then strict verification.
//! let received = Signed::<OfferWithdrawal>::from_bytes(sent.as_bytes().to_vec())?;
//! let verified = received.verify()?;
//! assert_eq!(verified.signer(), host.public());
//! assert_eq!(verified.seq, 2);
//!
//! // Any flipped bit is refused.
//! let mut forged = sent.as_bytes().to_vec();
//! forged[40] ^= 1;
//! assert!(Signed::<OfferWithdrawal>::from_bytes(forged)?.verify().is_err());
//! # let _ = BoundedVec::<u8, 1>::empty();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod codec;
mod envelope;
pub mod family;
mod key;
pub mod ledger_wire;
pub mod messages;
pub mod money;
pub mod plane_wire;
mod types;
pub mod validate;

#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
#[cfg(any(test, feature = "test-util"))]
pub mod older;

pub use codec::{
    BodyError, BoundedBytes, BoundedString, BoundedVec, Ext, FrameError, LimitError,
    MAX_ENVELOPE_BYTES, MAX_EXT_FIELDS, MAX_EXT_VALUE_BYTES,
};
pub use envelope::{
    HEADER_LEN, MAGIC, Message, SIGNATURE_LEN, SignError, Signed, Verified, VerifyError, peek_kind,
    peek_signer, verify_batch,
};
pub use family::GpuFamily;
pub use key::{KeyError, Keypair, PeerId, PublicKey};
pub use messages::*;
pub use money::{
    MAX_DURATION_S, MAX_LEASE_VALUE, MAX_PRICE_PER_GPU_HOUR, MicroCredits, MoneyError,
};
pub use types::{
    ComputeCapability, ContentId, EscrowId, EvidenceTier, GpuUuid, ImageDigest, ParseError,
    Timestamp, Version, hex, unhex,
};
