//! The signed envelope.
//!
//! Wire layout of every signed message (all of it is what the envelope id hashes):
//!
//! ```text
//! offset  size  field
//! 0       4     magic "GPUX"
//! 4       1     kind     (MessageKind code)          } the domain-separation tag:
//! 5       1     version  (the kind's version)        } "GPUX" || kind || version
//! 6       32    signer   (ed25519 public key)
//! 38      n     body     (bincode 2, wire config, canonical, every byte consumed)
//! 38+n    64    ed25519 signature over bytes [0 .. 38+n)
//! ```
//!
//! The signature covers the tag, the signer and the body exactly as received, so nothing is
//! re-encoded before checking it. Validity is `verify_strict`; batch verification is an
//! optimisation applied only to signatures that pass the weak-key filter
//! ([`verify_batch`]).

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::OnceLock;

use bincode::{Decode, Encode};
use ed25519_dalek::{Signature, VerifyingKey};

use crate::codec::{self, BodyError};
use crate::key::{KeyError, Keypair, PublicKey};
use crate::messages::{InvalidMessage, MessageKind};
use crate::types::{ContentId, Timestamp};

/// The first four bytes of every envelope.
pub const MAGIC: [u8; 4] = *b"GPUX";
/// Bytes before the body: magic, kind, version, signer.
pub const HEADER_LEN: usize = 38;
/// Bytes of the trailing signature.
pub const SIGNATURE_LEN: usize = 64;

mod sealed {
    #[allow(unreachable_pub)]
    pub trait Sealed {}
}
pub(crate) use sealed::Sealed;

/// A message body that travels in a signed envelope. Implemented by every type in
/// [`crate::messages`] and by nothing else.
pub trait Message: Sized + Clone + fmt::Debug + Encode + Decode<()> + Sealed {
    /// The kind code and version written in the envelope.
    const KIND: MessageKind;

    /// Structural checks that need neither a clock nor other messages: non-empty lists,
    /// unique GPUs, ordered times, consistent amounts. Run on every verify and every sign.
    fn check(&self) -> Result<(), InvalidMessage>;

    /// When the signer made the message.
    fn created_at(&self) -> Timestamp;

    /// When the message stops being valid, for kinds that expire.
    fn expires_at(&self) -> Option<Timestamp> {
        None
    }

    /// The signer's sequence number, for kinds where a newer message replaces an older one.
    fn seq(&self) -> Option<u64> {
        None
    }

    /// Decodes a body of an older `version` of this kind that this build still reads
    /// ([`MessageKind::reads`]) into today's type; the signature stays over the bytes
    /// received. Kinds that read no older version keep the default, which refuses.
    fn decode_older(version: u8, body: &[u8]) -> Result<Self, BodyError> {
        let _ = body;
        Err(BodyError::Decode(bincode::error::DecodeError::OtherString(
            format!("{} version {version} has no decoder", Self::KIND),
        )))
    }
}

/// Why an envelope was refused. Each cause is its own variant.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// Shorter than a header and a signature.
    #[error("envelope of {len} bytes is too short")]
    TooShort {
        /// Its length.
        len: usize,
    },
    /// Longer than the kind allows.
    #[error("{kind} envelope of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// The kind named in the envelope.
        kind: MessageKind,
        /// Its length.
        len: usize,
        /// The kind's limit.
        max: usize,
    },
    /// Does not start with `GPUX`.
    #[error("not a gpux envelope (bad magic)")]
    BadMagic,
    /// An unknown kind code.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// A valid envelope of another kind than the one expected.
    #[error("expected a {expected} envelope, found {found}")]
    WrongKind {
        /// What the caller asked for.
        expected: MessageKind,
        /// What the envelope says.
        found: MessageKind,
    },
    /// A version of the kind this build does not speak.
    #[error("{kind} version {version} is not supported (this build speaks version {supported})")]
    UnsupportedVersion {
        /// The kind.
        kind: MessageKind,
        /// The version in the envelope.
        version: u8,
        /// The version this build speaks.
        supported: u8,
    },
    /// The signer's key is not usable.
    #[error("signer key refused: {0}")]
    Key(#[from] KeyError),
    /// The signature does not verify (strictly) for the signer, tag and body.
    #[error("bad signature")]
    BadSignature,
    /// The body failed to decode (garbage, limits, trailing bytes, non-canonical).
    #[error("{kind} body: {source}")]
    Body {
        /// The kind.
        kind: MessageKind,
        /// What went wrong.
        source: BodyError,
    },
    /// The body decoded but breaks a structural rule.
    #[error("{kind}: {source}")]
    Invalid {
        /// The kind.
        kind: MessageKind,
        /// The rule broken.
        source: InvalidMessage,
    },
}

/// Why a message could not be signed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SignError {
    /// The body breaks a structural rule.
    #[error("{kind}: {source}")]
    Invalid {
        /// The kind.
        kind: MessageKind,
        /// The rule broken.
        source: InvalidMessage,
    },
    /// The envelope would exceed the kind's size limit.
    #[error("{kind} envelope of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// The kind.
        kind: MessageKind,
        /// The length it would have.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// bincode refused to encode the body.
    #[error("encoding failed: {0}")]
    Encode(#[from] bincode::error::EncodeError),
}

/// Reads the kind of an envelope and checks its framing (length, magic, version, size limit)
/// without verifying anything.
pub fn peek_kind(bytes: &[u8]) -> Result<MessageKind, VerifyError> {
    if bytes.len() < HEADER_LEN + SIGNATURE_LEN {
        return Err(VerifyError::TooShort { len: bytes.len() });
    }
    if bytes[..4] != MAGIC {
        return Err(VerifyError::BadMagic);
    }
    let kind = MessageKind::from_code(bytes[4]).ok_or(VerifyError::UnknownKind(bytes[4]))?;
    if !kind.reads(bytes[5]) {
        return Err(VerifyError::UnsupportedVersion {
            kind,
            version: bytes[5],
            supported: kind.version(),
        });
    }
    if bytes.len() > kind.max_bytes() {
        return Err(VerifyError::TooLarge {
            kind,
            len: bytes.len(),
            max: kind.max_bytes(),
        });
    }
    Ok(kind)
}

/// An envelope of kind `T` as received: framing checked, nothing verified. The only way to
/// its content is [`Signed::verify`] (or [`verify_batch`]), which yields a [`Verified`].
#[derive(Clone, PartialEq, Eq)]
pub struct Signed<T> {
    bytes: Vec<u8>,
    _kind: PhantomData<fn() -> T>,
}

impl<T: Message> Signed<T> {
    /// Checks the framing of `bytes` (length, magic, kind, version, size limit).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, VerifyError> {
        let kind = peek_kind(&bytes)?;
        if kind != T::KIND {
            return Err(VerifyError::WrongKind {
                expected: T::KIND,
                found: kind,
            });
        }
        Ok(Self {
            bytes,
            _kind: PhantomData,
        })
    }

    /// Encodes, checks and signs `body` with `keypair`. A body that breaks a structural rule
    /// or a size limit cannot be signed.
    pub fn sign(keypair: &Keypair, body: T) -> Result<Verified<T>, SignError> {
        body.check().map_err(|source| SignError::Invalid {
            kind: T::KIND,
            source,
        })?;
        let encoded = codec::encode(&body)?;
        let len = HEADER_LEN + encoded.len() + SIGNATURE_LEN;
        if len > T::KIND.max_bytes() {
            return Err(SignError::TooLarge {
                kind: T::KIND,
                len,
                max: T::KIND.max_bytes(),
            });
        }
        let signer = keypair.public();
        let mut bytes = Vec::with_capacity(len);
        bytes.extend_from_slice(&MAGIC);
        bytes.push(T::KIND.code());
        bytes.push(T::KIND.version());
        bytes.extend_from_slice(&signer.0);
        bytes.extend_from_slice(&encoded);
        let signature = keypair.sign_raw(&bytes);
        bytes.extend_from_slice(&signature);
        let id = ContentId::of(&bytes);
        Ok(Verified {
            bytes,
            body,
            signer,
            id,
        })
    }

    /// The exact bytes received.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The signer the envelope claims (not yet verified).
    pub fn claimed_signer(&self) -> PublicKey {
        PublicKey(header_signer(&self.bytes))
    }

    /// The envelope id: blake3 of the exact bytes.
    pub fn id(&self) -> ContentId {
        ContentId::of(&self.bytes)
    }

    fn signed_part(&self) -> &[u8] {
        &self.bytes[..self.bytes.len() - SIGNATURE_LEN]
    }

    fn signature_bytes(&self) -> [u8; 64] {
        let mut sig = [0u8; 64];
        sig.copy_from_slice(&self.bytes[self.bytes.len() - SIGNATURE_LEN..]);
        sig
    }

    /// Decodes and structurally checks the body (every byte consumed, canonical form).
    fn decode_body(&self) -> Result<T, VerifyError> {
        let body_bytes = &self.bytes[HEADER_LEN..self.bytes.len() - SIGNATURE_LEN];
        let version = self.bytes[5];
        let body: T = if version == T::KIND.version() {
            codec::decode_exact(body_bytes)
        } else {
            T::decode_older(version, body_bytes)
        }
        .map_err(|source| VerifyError::Body {
            kind: T::KIND,
            source,
        })?;
        body.check().map_err(|source| VerifyError::Invalid {
            kind: T::KIND,
            source,
        })?;
        Ok(body)
    }

    /// Verifies the envelope: the body decodes (cheap checks first, so garbage costs little),
    /// then the signature verifies with `verify_strict` over the bytes as received.
    pub fn verify(self) -> Result<Verified<T>, VerifyError> {
        let body = self.decode_body()?;
        let signer = self.claimed_signer();
        let key = signer.to_verifying_key()?;
        let signature = Signature::from_bytes(&self.signature_bytes());
        key.verify_strict(self.signed_part(), &signature)
            .map_err(|_| VerifyError::BadSignature)?;
        let id = self.id();
        Ok(Verified {
            bytes: self.bytes,
            body,
            signer,
            id,
        })
    }

    /// Decodes the body without checking the signature. Only for fuzzing the decoders.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn decode_body_unverified(&self) -> Result<T, VerifyError> {
        self.decode_body()
    }
}

/// The signer an envelope names, after [`peek_kind`]'s framing checks, without verifying
/// anything: for budgets that must judge a message before paying for its verification.
pub fn peek_signer(bytes: &[u8]) -> Result<PublicKey, VerifyError> {
    peek_kind(bytes)?;
    Ok(PublicKey(header_signer(bytes)))
}

fn header_signer(bytes: &[u8]) -> [u8; 32] {
    let mut key = [0u8; 32];
    key.copy_from_slice(&bytes[6..HEADER_LEN]);
    key
}

impl<T: Message> fmt::Debug for Signed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Signed<{}>({} bytes, unverified)",
            T::KIND,
            self.bytes.len()
        )
    }
}

/// A message whose signature verified strictly and whose body decoded and passed the
/// structural checks. Only [`Signed::verify`], [`verify_batch`] and [`Signed::sign`] make
/// one, so code that takes a `Verified<T>` never sees unverified data.
#[derive(Clone, PartialEq, Eq)]
pub struct Verified<T> {
    bytes: Vec<u8>,
    body: T,
    signer: PublicKey,
    id: ContentId,
}

impl<T: Message> Verified<T> {
    /// Who signed it.
    pub fn signer(&self) -> PublicKey {
        self.signer
    }

    /// The envelope id (blake3 of the exact bytes).
    pub fn id(&self) -> ContentId {
        self.id
    }

    /// The exact envelope bytes, to forward or store.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The body.
    pub fn body(&self) -> &T {
        &self.body
    }

    /// The envelope bytes and the body.
    pub fn into_parts(self) -> (Vec<u8>, T) {
        (self.bytes, self.body)
    }
}

impl<T> Deref for Verified<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.body
    }
}

impl<T: Message> fmt::Debug for Verified<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verified")
            .field("id", &self.id)
            .field("signer", &self.signer)
            .field("body", &self.body)
            .finish()
    }
}

/// Encodings of the eight small-order points, with either sign bit.
fn small_order_encodings() -> &'static [[u8; 32]; 16] {
    static TABLE: OnceLock<[[u8; 32]; 16]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = [[0u8; 32]; 16];
        for (i, point) in curve25519_dalek::constants::EIGHT_TORSION
            .iter()
            .enumerate()
        {
            let bytes = point.compress().to_bytes();
            table[2 * i] = bytes;
            table[2 * i + 1] = bytes;
            table[2 * i + 1][31] ^= 0x80;
        }
        table
    })
}

/// True when the low 255 bits of `r` encode a field element `y >= p = 2^255 - 19`.
pub(crate) fn is_non_canonical_y(r: &[u8; 32]) -> bool {
    r[31] & 0x7f == 0x7f && r[1..31].iter().all(|&b| b == 0xff) && r[0] >= 0xed
}

/// The weak-key filter in front of batch verification. It refuses a signer key of small
/// order, an `R` whose encoding is not canonical and an `R` of small order: exactly the
/// inputs `verify_strict` rejects before its equation. These are byte comparisons; no point
/// is decompressed. Signatures refused here are decided by `verify_strict` alone.
///
/// What remains different: the batch equation is cofactorless with random 128-bit
/// coefficients, so a signature whose `R` was deliberately offset by a small-order point
/// (something only the key's owner can produce) may pass a batch yet fail `verify_strict`.
/// It gains its signer nothing it could not get by signing honestly; where every party must
/// reach the same verdict (the ledger), gpux verifies one by one.
fn passes_weak_key_filter(key: &VerifyingKey, signature: &[u8; 64]) -> bool {
    if key.is_weak() {
        return false;
    }
    let mut r = [0u8; 32];
    r.copy_from_slice(&signature[..32]);
    !is_non_canonical_y(&r) && !small_order_encodings().contains(&r)
}

/// Verifies many envelopes of one kind: bodies are decoded one by one, then every signature
/// that passes the weak-key filter is checked in one batch (about twice as fast per
/// signature as one by one). If the batch fails, each of its members is checked alone with
/// `verify_strict`. The verdicts equal [`Signed::verify`]'s for every honestly made
/// signature; the one known difference (a signer's own small-order-offset `R`, see
/// `passes_weak_key_filter`) is why consensus-critical code (the ledger) verifies one by one.
pub fn verify_batch<T: Message>(items: Vec<Signed<T>>) -> Vec<Result<Verified<T>, VerifyError>> {
    struct Pending<T> {
        index: usize,
        key: VerifyingKey,
        signature: Signature,
        signed: Signed<T>,
        body: T,
    }
    let mut results: Vec<Option<Result<Verified<T>, VerifyError>>> =
        Vec::with_capacity(items.len());
    let mut batch: Vec<Pending<T>> = Vec::with_capacity(items.len());
    // Hosts sign many offers: parse each distinct key once per call.
    let mut keys: BTreeMap<PublicKey, Result<VerifyingKey, KeyError>> = BTreeMap::new();
    for (index, signed) in items.into_iter().enumerate() {
        results.push(None);
        let prepared = signed.decode_body().and_then(|body| {
            let signer = signed.claimed_signer();
            let key = *keys
                .entry(signer)
                .or_insert_with(|| signer.to_verifying_key());
            Ok((key?, body))
        });
        let (key, body) = match prepared {
            Ok(p) => p,
            Err(e) => {
                results[index] = Some(Err(e));
                continue;
            }
        };
        let sig_bytes = signed.signature_bytes();
        if !passes_weak_key_filter(&key, &sig_bytes) {
            // verify_strict decides these alone (and will refuse them).
            results[index] = Some(signed.verify());
            continue;
        }
        batch.push(Pending {
            index,
            key,
            signature: Signature::from_bytes(&sig_bytes),
            signed,
            body,
        });
    }
    let batch_ok = !batch.is_empty() && {
        let messages: Vec<&[u8]> = batch.iter().map(|p| p.signed.signed_part()).collect();
        let signatures: Vec<Signature> = batch.iter().map(|p| p.signature).collect();
        let keys: Vec<VerifyingKey> = batch.iter().map(|p| p.key).collect();
        ed25519_dalek::verify_batch(&messages, &signatures, &keys).is_ok()
    };
    for p in batch {
        let verdict = if batch_ok {
            let signer = p.signed.claimed_signer();
            let id = p.signed.id();
            Ok(Verified {
                bytes: p.signed.bytes,
                body: p.body,
                signer,
                id,
            })
        } else {
            p.signed.verify()
        };
        results[p.index] = Some(verdict);
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or(Err(VerifyError::BadSignature)))
        .collect()
}
