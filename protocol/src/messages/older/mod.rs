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

/// Takes an older version's term `key` out of `ext`: a u64, little-endian (none: not
/// there; a value that is not 8 bytes does not read).
fn take_u64(ext: &mut crate::codec::Ext, key: u16) -> Result<Option<u64>, crate::codec::BodyError> {
    ext.remove(key)
        .map(|v| {
            <[u8; 8]>::try_from(v)
                .map(u64::from_le_bytes)
                .map_err(|_| unread("an older version's term is 8 bytes, little-endian"))
        })
        .transpose()
}

/// Takes an older version's cancellation fee schedule out of `ext` (none: empty).
fn take_fees(
    ext: &mut crate::codec::Ext,
    key: u16,
) -> Result<crate::CancelFees, crate::codec::BodyError> {
    ext.remove(key)
        .map(|v| {
            crate::CancelFees::from_bytes(&v)
                .map_err(|_| unread("a cancellation fee schedule that breaks its rules"))
        })
        .transpose()
        .map(Option::unwrap_or_default)
}
