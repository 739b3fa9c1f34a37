//! Every message of the protocol. Each is a body that travels in a signed envelope
//! ([`crate::Signed`]); each ends with an [`Ext`](crate::Ext) map so optional fields can be
//! added later without a new version.
//!
//! | kind | code | signed by | limit |
//! |---|---|---|---|
//! | [`Attestation`] | 1 | host | 64 KiB |
//! | [`Offer`] | 2 | host | 4 KiB |
//! | [`OfferWithdrawal`] | 3 | host | 512 B |
//! | [`Bid`] | 4 | renter | 4 KiB |
//! | [`LeaseRequest`] | 5 | renter | 32 KiB |
//! | [`LeaseAccept`] | 6 | host | 512 B |
//! | [`LeaseReject`] | 7 | host | 1 KiB |
//! | [`LeaseEnd`] | 8 | either | 1 KiB |
//! | [`PreemptionNotice`] | 9 | host | 512 B |
//! | [`UsageReceipt`] | 10 | host | 1 KiB |
//! | [`ReceiptAck`] | 11 | renter | 512 B |
//! | [`ChallengeRequest`] | 12 | renter | 512 B |
//! | [`ChallengeResponse`] | 13 | host | 1 KiB |
//! | [`LogChunk`] | 14 | host | 66 KiB |
//! | [`EscrowLock`] | 15 | renter | 1 KiB |
//! | [`Redeem`] | 16 | host | 4 KiB |
//! | [`Release`] | 17 | either | 512 B |
//! | [`LedgerRecord`] | 18 | ledger | 1 KiB |
//! | [`ChallengeResult`] | 19 | challenger | 8 KiB |
//! | [`LeaseCommit`] | 20 | renter | 512 B |
//! | [`FaucetGrant`] | 21 | the ledger's faucet | 512 B |
//! | [`BidWithdrawal`] | 22 | renter | 512 B |

use std::collections::BTreeSet;
use std::fmt;

use crate::envelope::{Sealed, Signed, Verified, VerifyError, peek_kind};
use crate::money::MoneyError;
use crate::types::Timestamp;

mod attestation;
mod cancel;
mod challenge;
mod lease;
mod ledger;
mod market;
mod older;
mod usage;
#[cfg(any(test, feature = "test-util"))]
pub(crate) use older::lease::{lease_accept_v1_body, lease_request_v4_body};
#[cfg(any(test, feature = "test-util"))]
pub(crate) use older::market::offer_v4_body;
#[cfg(any(test, feature = "test-util"))]
pub(crate) use older::usage::usage_receipt_v1_body;

pub use attestation::{
    Attestation, EccFacts, GpuFacts, MAX_ATTESTED_GPUS, MAX_MIG_INSTANCES, MAX_MIG_PROFILE,
    MigFacts, MigInstance, PcieFacts, mig_compute_slices, mig_profile_gb,
};
pub use cancel::{CancelFees, FeeTier, MAX_FEE_TIERS};
pub use challenge::{
    ChallengeRequest, ChallengeResponse, ChallengeResult, ChallengeVerdict, MAX_CHALLENGE_K,
    MAX_CHALLENGE_M, MAX_CHALLENGE_N, MAX_FILL_BLOCKS, MAX_FILL_LANES, MAX_RESULT_RESPONSE,
};
pub use lease::{
    DEFAULT_RETAIN_S, EXT_REJECT_FREE_GPUS, EndReason, EnvVar, LeaseAccept, LeaseCommit, LeaseEnd,
    LeaseKind, LeaseReject, LeaseRequest, LeaseTerms, MAX_COMMIT_WAIT_MS, MAX_LEASE_ARGS,
    MAX_LEASE_ENV, MAX_LEASE_PIDS, MAX_PREEMPTOR_BYTES, MAX_SSH_KEY_BYTES, MAX_SSH_KEYS,
    PreemptionNotice, RejectReason, ResourceLimits, SSH_KEY_TYPES, decode_gpus, encode_gpus,
    is_ssh_public_key, reject_free_gpus,
};
pub use ledger::{
    EXT_LOCK_HOLD_UNTIL, EXT_RECORD_VOUCHER_PAID, EXT_RELEASE_ACK, EXT_RELEASE_END, EscrowLock,
    FaucetGrant, LeaseOutcome, LedgerEntry, LedgerRecord, Redeem, Release,
};
pub use market::{
    Bid, BidWithdrawal, BookedWindow, MAX_BID_GPUS, MAX_BID_SLOTS, MAX_CACHED_IMAGES,
    MAX_IMAGE_TAG_BYTES, MAX_IMAGE_TAGS, MAX_OFFER_BOOKED, MAX_OFFER_GPUS, MAX_OFFER_IMAGES,
    MAX_PULL_REGISTRIES, MAX_QUERY_BYTES, Machine, Offer, OfferGpu, OfferTerms, OfferWithdrawal,
    Pulls, Share, is_image_tag, is_region,
};
pub use usage::{LogChunk, LogStream, MAX_LOG_CHUNK_BYTES, ReceiptAck, UsageReceipt, UsageSummary};

const KIB: usize = 1024;

macro_rules! message_kinds {
    ($( $ty:ident = $code:literal, version $ver:literal $(reads $($old:literal),+)?, max $max:expr; )+) => {
        /// The kind of a signed message: its code and version in the envelope header.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[non_exhaustive]
        pub enum MessageKind {
            $(
                #[doc = concat!("[`", stringify!($ty), "`]")]
                $ty = $code,
            )+
        }

        impl MessageKind {
            /// Every kind, by code.
            pub const ALL: &'static [MessageKind] = &[$(MessageKind::$ty),+];

            /// The code in the envelope header (byte 4).
            pub const fn code(self) -> u8 {
                self as u8
            }

            /// The kind with this code.
            pub const fn from_code(code: u8) -> Option<Self> {
                match code {
                    $($code => Some(Self::$ty),)+
                    _ => None,
                }
            }

            /// The version of this kind that this build speaks (byte 5 of the header).
            pub const fn version(self) -> u8 {
                match self {
                    $(Self::$ty => $ver,)+
                }
            }

            /// Whether this build reads envelopes of this kind at `version`: the one it
            /// speaks, or an older one still decoded ([`crate::Message::decode_older`]).
            pub const fn reads(self, version: u8) -> bool {
                match self {
                    $(Self::$ty => version == $ver $($(|| version == $old)+)?,)+
                }
            }

            /// The largest envelope of this kind, in bytes.
            pub const fn max_bytes(self) -> usize {
                match self {
                    $(Self::$ty => $max,)+
                }
            }

            /// The type name.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Self::$ty => stringify!($ty),)+
                }
            }
        }

        $(impl Sealed for $ty {})+

        /// An envelope of any kind, framing checked, nothing verified.
        #[derive(Debug, Clone)]
        #[non_exhaustive]
        pub enum AnySigned {
            $(
                #[doc = concat!("A signed [`", stringify!($ty), "`].")]
                $ty(Signed<$ty>),
            )+
        }

        /// A verified message of any kind.
        #[derive(Debug, Clone)]
        #[non_exhaustive]
        pub enum AnyVerified {
            $(
                #[doc = concat!("A verified [`", stringify!($ty), "`].")]
                $ty(Verified<$ty>),
            )+
        }

        impl AnySigned {
            /// Reads the kind from the header and checks the framing.
            pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, VerifyError> {
                match peek_kind(&bytes)? {
                    $(MessageKind::$ty => Signed::from_bytes(bytes).map(Self::$ty),)+
                }
            }

            /// Verifies whichever kind it is.
            pub fn verify(self) -> Result<AnyVerified, VerifyError> {
                match self {
                    $(Self::$ty(s) => s.verify().map(AnyVerified::$ty),)+
                }
            }

            /// Decodes the body without checking the signature: only for fuzzing decoders.
            #[cfg(any(test, feature = "fuzzing"))]
            pub(crate) fn decode_unverified(&self) -> Result<(), VerifyError> {
                match self {
                    $(Self::$ty(s) => s.decode_body_unverified().map(drop),)+
                }
            }
        }

        /// Feeds `data` as a body of `kind` to [`crate::fuzzing::body`].
        #[cfg(any(test, feature = "fuzzing"))]
        pub(crate) fn fuzz_body(kind: MessageKind, data: &[u8]) -> bool {
            match kind {
                $(MessageKind::$ty => crate::fuzzing::body::<$ty>(data),)+
            }
        }

        impl AnyVerified {
            /// The kind.
            pub fn kind(&self) -> MessageKind {
                match self {
                    $(Self::$ty(_) => MessageKind::$ty,)+
                }
            }
        }
    };
}

message_kinds! {
    Attestation = 1, version 2, max 64 * KIB;
    Offer = 2, version 5 reads 4, max 4 * KIB;
    OfferWithdrawal = 3, version 1, max 512;
    Bid = 4, version 2, max 4 * KIB;
    LeaseRequest = 5, version 5 reads 4, max 32 * KIB;
    LeaseAccept = 6, version 2 reads 1, max 512;
    LeaseReject = 7, version 1, max KIB;
    LeaseEnd = 8, version 1, max KIB;
    PreemptionNotice = 9, version 2, max 34 * KIB;
    UsageReceipt = 10, version 2 reads 1, max KIB;
    ReceiptAck = 11, version 1, max 512;
    ChallengeRequest = 12, version 3, max 512;
    ChallengeResponse = 13, version 2, max KIB;
    LogChunk = 14, version 1, max 66 * KIB;
    EscrowLock = 15, version 1, max KIB;
    Redeem = 16, version 1, max 4 * KIB;
    Release = 17, version 1, max 512;
    LedgerRecord = 18, version 1, max KIB;
    ChallengeResult = 19, version 2, max 8 * KIB;
    LeaseCommit = 20, version 1, max 512;
    FaucetGrant = 21, version 1, max 512;
    BidWithdrawal = 22, version 1, max 512;
}

impl fmt::Display for MessageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A structural rule a message body breaks. Each rule is its own variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidMessage {
    /// A list that must not be empty is.
    #[error("{field} is empty")]
    Empty {
        /// The field.
        field: &'static str,
    },
    /// A number that must be positive is zero.
    #[error("{field} must not be zero")]
    Zero {
        /// The field.
        field: &'static str,
    },
    /// A list names the same item twice.
    #[error("{field} lists {item} twice")]
    Duplicate {
        /// The field.
        field: &'static str,
        /// The repeated item.
        item: String,
    },
    /// Two times are out of order.
    #[error("{later} ({later_at}) must be after {earlier} ({earlier_at})")]
    TimesOutOfOrder {
        /// The field that must come first.
        earlier: &'static str,
        /// Its value.
        earlier_at: Timestamp,
        /// The field that must come later.
        later: &'static str,
        /// Its value.
        later_at: Timestamp,
    },
    /// A number exceeds what is allowed.
    #[error("{field} is {value}, above the limit of {max}")]
    AboveLimit {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The limit.
        max: u64,
    },
    /// A number is below what is required.
    #[error("{field} is {value}, below the minimum of {min}")]
    BelowMinimum {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The minimum.
        min: u64,
    },
    /// A text field has the wrong form.
    #[error("{field} is malformed: {reason}")]
    Malformed {
        /// The field.
        field: &'static str,
        /// What form it must have.
        reason: &'static str,
    },
    /// Two fields of one message contradict each other.
    #[error("{field} is inconsistent: {reason}")]
    Inconsistent {
        /// The field.
        field: &'static str,
        /// The contradiction.
        reason: &'static str,
    },
    /// An amount computation overflowed.
    #[error(transparent)]
    Money(#[from] MoneyError),
}

pub(crate) fn ensure_nonempty<T>(field: &'static str, items: &[T]) -> Result<(), InvalidMessage> {
    if items.is_empty() {
        return Err(InvalidMessage::Empty { field });
    }
    Ok(())
}

pub(crate) fn ensure_nonzero(field: &'static str, value: u64) -> Result<(), InvalidMessage> {
    if value == 0 {
        return Err(InvalidMessage::Zero { field });
    }
    Ok(())
}

/// The protocol's bounds on what a lease may cost ([`crate::money::MAX_PRICE_PER_GPU_HOUR`],
/// [`crate::money::MAX_DURATION_S`], [`crate::money::MAX_LEASE_VALUE`]): a price, a
/// duration, and `gpus` GPUs at that price for that long.
pub(crate) fn ensure_sane_terms(
    price_field: &'static str,
    price: crate::MicroCredits,
    duration_s: u32,
    gpus: u64,
) -> Result<(), InvalidMessage> {
    use crate::money::{MAX_DURATION_S, MAX_LEASE_VALUE, MAX_PRICE_PER_GPU_HOUR};
    ensure_at_most(price_field, price.0, MAX_PRICE_PER_GPU_HOUR.0)?;
    ensure_at_most("duration_s", duration_s.into(), MAX_DURATION_S.into())?;
    // At most 10^10 micro per GPU-hour, 366 days and 2^16 GPUs: this cannot overflow.
    let value = u128::from(gpus) * u128::from(price.0) * u128::from(duration_s) / 3600;
    ensure_at_most(
        "value (gpus x price x duration)",
        u64::try_from(value).unwrap_or(u64::MAX),
        MAX_LEASE_VALUE.0,
    )
}

pub(crate) fn ensure_at_most(
    field: &'static str,
    value: u64,
    max: u64,
) -> Result<(), InvalidMessage> {
    if value > max {
        return Err(InvalidMessage::AboveLimit { field, value, max });
    }
    Ok(())
}

pub(crate) fn ensure_after(
    earlier: &'static str,
    earlier_at: Timestamp,
    later: &'static str,
    later_at: Timestamp,
) -> Result<(), InvalidMessage> {
    if later_at <= earlier_at {
        return Err(InvalidMessage::TimesOutOfOrder {
            earlier,
            earlier_at,
            later,
            later_at,
        });
    }
    Ok(())
}

pub(crate) fn ensure_unique<T: Ord + fmt::Display>(
    field: &'static str,
    items: impl IntoIterator<Item = T>,
) -> Result<(), InvalidMessage> {
    let mut seen = BTreeSet::new();
    for item in items {
        if seen.contains(&item) {
            return Err(InvalidMessage::Duplicate {
                field,
                item: item.to_string(),
            });
        }
        seen.insert(item);
    }
    Ok(())
}

/// A lower-case token: `[a-z0-9-]`, not empty, not starting or ending with `-`.
/// Used for family keys and regions, which also appear in topics and queries.
/// Its length limit is the field's `BoundedString` size, already enforced by decoding.
pub(crate) fn ensure_token(field: &'static str, text: &str) -> Result<(), InvalidMessage> {
    let ok = !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !text.starts_with('-')
        && !text.ends_with('-');
    if !ok {
        return Err(InvalidMessage::Malformed {
            field,
            reason: "expected a-z, 0-9 and inner '-' only",
        });
    }
    Ok(())
}
