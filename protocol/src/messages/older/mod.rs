//! The older versions of message kinds that this build still reads (docs/protocol.md,
//! section 10): the lease records and the ledger's vouchers hold signed bytes, so a node
//! upgraded in the middle of a lease reopens envelopes of the versions before. Each older
//! body decodes with its own fields into today's type, what it carried in `ext` read into
//! the typed fields; the signature and the id stay those of the bytes received.
//!
//! Each file also encodes today's messages as the older version did, for
//! [`crate::older`] (the tests' signer of older versions).

pub(crate) mod lease;
pub(crate) mod market;
pub(crate) mod usage;

/// A body of an older version that does not read: `why`.
fn unread(why: &'static str) -> crate::codec::BodyError {
    crate::codec::BodyError::Decode(bincode::error::DecodeError::Other(why))
}
