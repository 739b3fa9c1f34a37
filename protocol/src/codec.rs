//! The one bincode configuration of the wire, and the bounded containers that every message
//! is built from.
//!
//! Every collection on the wire has a count limit that is checked while decoding, before any
//! element is read or any memory is reserved; every string and byte field has a byte limit.
//! Together with the per-kind envelope size limit this bounds what a decoder can be made to do.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;

use bincode::de::read::Reader;
use bincode::de::{Decode, Decoder};
use bincode::enc::{Encode, Encoder};
use bincode::error::{DecodeError, EncodeError};

/// The largest envelope of any kind, in bytes. Each kind has its own, smaller limit
/// ([`crate::MessageKind::max_bytes`]); this one also caps bincode's allocation budget.
pub const MAX_ENVELOPE_BYTES: usize = 256 * 1024;

/// The wire's bincode configuration: little endian, variable-length integers, and a byte
/// limit equal to [`MAX_ENVELOPE_BYTES`]. It is the only configuration used anywhere.
pub(crate) type WireConfig = bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<MAX_ENVELOPE_BYTES>,
>;

/// The wire configuration (see [`WireConfig`]).
pub(crate) const fn wire_config() -> WireConfig {
    bincode::config::standard().with_limit::<MAX_ENVELOPE_BYTES>()
}

/// Encodes a value with the wire configuration.
pub(crate) fn encode<T: Encode>(value: &T) -> Result<Vec<u8>, EncodeError> {
    bincode::encode_to_vec(value, wire_config())
}

/// Decodes a value with the wire configuration, requiring that every byte is consumed and that
/// the encoding is canonical (re-encoding the value gives back exactly the input).
pub(crate) fn decode_exact<T: Encode + Decode<()>>(bytes: &[u8]) -> Result<T, BodyError> {
    let (value, used): (T, usize) =
        bincode::decode_from_slice(bytes, wire_config()).map_err(BodyError::Decode)?;
    if used != bytes.len() {
        return Err(BodyError::TrailingBytes {
            unread: bytes.len() - used,
        });
    }
    // bincode accepts several encodings of one value (a varint may be padded). Requiring the
    // canonical form makes an envelope's id a function of its content.
    if encodes_to(&value, bytes, wire_config()) {
        Ok(value)
    } else {
        Err(BodyError::NonCanonical)
    }
}

/// A bincode writer that compares what is written with the bytes it holds, in order,
/// instead of keeping it.
struct SameBytes<'a> {
    rest: &'a [u8],
}

impl bincode::enc::write::Writer for SameBytes<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), EncodeError> {
        match self.rest.split_at_checked(bytes.len()) {
            Some((head, tail)) if head == bytes => {
                self.rest = tail;
                Ok(())
            }
            _ => Err(EncodeError::Other("not the same bytes")),
        }
    }
}

/// Whether `value` encodes to exactly `bytes`: its canonical form, checked without writing
/// a second copy (a file frame's quarter megabyte is compared, not copied again).
fn encodes_to<T: Encode, C: bincode::config::Config>(value: &T, bytes: &[u8], config: C) -> bool {
    let mut same = SameBytes { rest: bytes };
    bincode::encode_into_writer(value, &mut same, config).is_ok() && same.rest.is_empty()
}

/// A frame (of a stream protocol, not an envelope) that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Larger than the protocol's frame limit.
    #[error("a frame of {0} bytes exceeds the protocol's limit")]
    TooLarge(usize),
    /// Not bincode of the expected type.
    #[error("undecodable frame: {0}")]
    Undecodable(String),
    /// Bytes left after the value.
    #[error("{0} trailing bytes after a frame")]
    Trailing(usize),
    /// Not the one encoding of its value (bincode reads varints written longer than
    /// needed): a frame has exactly one spelling.
    #[error("a frame not in its canonical encoding")]
    NonCanonical,
}

/// Encodes a frame with bincode's standard configuration (little-endian varints).
pub(crate) fn encode_frame<T: Encode>(value: &T) -> Vec<u8> {
    // Encoding plain values into a Vec cannot fail.
    bincode::encode_to_vec(value, bincode::config::standard()).unwrap_or_default()
}

/// Decodes a frame of at most `LIMIT` bytes: every byte consumed, canonical.
pub(crate) fn decode_frame<T: Decode<()> + Encode, const LIMIT: usize>(
    bytes: &[u8],
) -> Result<T, FrameError> {
    if bytes.len() > LIMIT {
        return Err(FrameError::TooLarge(bytes.len()));
    }
    let (value, used) =
        bincode::decode_from_slice(bytes, bincode::config::standard().with_limit::<LIMIT>())
            .map_err(|e| FrameError::Undecodable(e.to_string()))?;
    if used != bytes.len() {
        return Err(FrameError::Trailing(bytes.len() - used));
    }
    if !encodes_to(&value, bytes, bincode::config::standard()) {
        return Err(FrameError::NonCanonical);
    }
    Ok(value)
}

/// Why a body failed to decode.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// bincode could not decode the bytes (bad tag, bad UTF-8, a limit exceeded, too short...).
    #[error("{0}")]
    Decode(DecodeError),
    /// The body decoded but left bytes unread.
    #[error("{unread} trailing bytes after the body")]
    TrailingBytes {
        /// How many bytes were left.
        unread: usize,
    },
    /// The body decoded but is not in canonical form.
    #[error("non-canonical encoding")]
    NonCanonical,
}

/// Reads a length prefix and refuses it if it exceeds `max`.
fn decode_len<D: Decoder>(
    decoder: &mut D,
    max: usize,
    what: &'static str,
) -> Result<usize, DecodeError> {
    let len = u64::decode(decoder)?;
    match usize::try_from(len) {
        Ok(len) if len <= max => Ok(len),
        _ => Err(DecodeError::OtherString(format!(
            "{what} of length {len} exceeds the limit of {max}"
        ))),
    }
}

/// The error returned when a bounded container would exceed its limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} has {len} items (or bytes); the limit is {max}")]
pub struct LimitError {
    /// What was too long ("list", "string", "bytes", "ext").
    pub what: &'static str,
    /// Its length.
    pub len: usize,
    /// The limit.
    pub max: usize,
}

/// A `Vec<T>` of at most `N` elements. It encodes exactly like a `Vec<T>`.
#[derive(
    Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(
    try_from = "Vec<T>",
    into = "Vec<T>",
    bound(serialize = "T: Clone + serde::Serialize")
)]
pub struct BoundedVec<T, const N: usize>(Vec<T>);

impl<T, const N: usize> BoundedVec<T, N> {
    /// The limit, `N`.
    pub const MAX: usize = N;

    /// Wraps `items`, or fails if there are more than `N`.
    pub fn new(items: Vec<T>) -> Result<Self, LimitError> {
        if items.len() > N {
            return Err(LimitError {
                what: "list",
                len: items.len(),
                max: N,
            });
        }
        Ok(Self(items))
    }

    /// An empty list.
    pub const fn empty() -> Self {
        Self(Vec::new())
    }

    /// The elements.
    pub fn into_inner(self) -> Vec<T> {
        self.0
    }
}

impl<T, const N: usize> Deref for BoundedVec<T, N> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T: fmt::Debug, const N: usize> fmt::Debug for BoundedVec<T, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<T, const N: usize> TryFrom<Vec<T>> for BoundedVec<T, N> {
    type Error = LimitError;
    fn try_from(items: Vec<T>) -> Result<Self, LimitError> {
        Self::new(items)
    }
}

impl<T, const N: usize> From<BoundedVec<T, N>> for Vec<T> {
    fn from(v: BoundedVec<T, N>) -> Vec<T> {
        v.0
    }
}

impl<T: Encode, const N: usize> Encode for BoundedVec<T, N> {
    fn encode<E: Encoder>(&self, encoder: &mut E) -> Result<(), EncodeError> {
        self.0.encode(encoder)
    }
}

impl<Ctx, T: Decode<Ctx>, const N: usize> Decode<Ctx> for BoundedVec<T, N> {
    fn decode<D: Decoder<Context = Ctx>>(decoder: &mut D) -> Result<Self, DecodeError> {
        let len = decode_len(decoder, N, "list")?;
        decoder.claim_container_read::<T>(len)?;
        let mut items = Vec::with_capacity(len);
        for _ in 0..len {
            // The claim above charged size_of::<T>() per element; each element's own decode
            // charges what it really reads, so give the estimate back (as bincode's Vec does).
            decoder.unclaim_bytes_read(std::mem::size_of::<T>());
            items.push(T::decode(decoder)?);
        }
        Ok(Self(items))
    }
}
impl<'de, Ctx, T: Decode<Ctx>, const N: usize> bincode::BorrowDecode<'de, Ctx>
    for BoundedVec<T, N>
{
    fn borrow_decode<D: bincode::de::BorrowDecoder<'de, Context = Ctx>>(
        decoder: &mut D,
    ) -> Result<Self, DecodeError> {
        Self::decode(decoder)
    }
}

/// A UTF-8 string of at most `N` bytes. It encodes exactly like a `String`.
#[derive(
    Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct BoundedString<const N: usize>(String);

impl<const N: usize> BoundedString<N> {
    /// The limit in bytes, `N`.
    pub const MAX: usize = N;

    /// Wraps `s`, or fails if it is longer than `N` bytes.
    pub fn new(s: impl Into<String>) -> Result<Self, LimitError> {
        let s = s.into();
        if s.len() > N {
            return Err(LimitError {
                what: "string",
                len: s.len(),
                max: N,
            });
        }
        Ok(Self(s))
    }

    /// The empty string.
    pub const fn empty() -> Self {
        Self(String::new())
    }

    /// The string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<const N: usize> Deref for BoundedString<N> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<const N: usize> fmt::Debug for BoundedString<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<const N: usize> fmt::Display for BoundedString<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<const N: usize> TryFrom<String> for BoundedString<N> {
    type Error = LimitError;
    fn try_from(s: String) -> Result<Self, LimitError> {
        Self::new(s)
    }
}

impl<const N: usize> TryFrom<&str> for BoundedString<N> {
    type Error = LimitError;
    fn try_from(s: &str) -> Result<Self, LimitError> {
        Self::new(s)
    }
}

impl<const N: usize> From<BoundedString<N>> for String {
    fn from(s: BoundedString<N>) -> String {
        s.0
    }
}

impl<const N: usize> Encode for BoundedString<N> {
    fn encode<E: Encoder>(&self, encoder: &mut E) -> Result<(), EncodeError> {
        self.0.encode(encoder)
    }
}

impl<Ctx, const N: usize> Decode<Ctx> for BoundedString<N> {
    fn decode<D: Decoder<Context = Ctx>>(decoder: &mut D) -> Result<Self, DecodeError> {
        let bytes = decode_raw_bytes(decoder, N, "string")?;
        String::from_utf8(bytes)
            .map(Self)
            .map_err(|e| DecodeError::Utf8 {
                inner: e.utf8_error(),
            })
    }
}
impl<'de, Ctx, const N: usize> bincode::BorrowDecode<'de, Ctx> for BoundedString<N> {
    fn borrow_decode<D: bincode::de::BorrowDecoder<'de, Context = Ctx>>(
        decoder: &mut D,
    ) -> Result<Self, DecodeError> {
        Self::decode(decoder)
    }
}

fn decode_raw_bytes<D: Decoder>(
    decoder: &mut D,
    max: usize,
    what: &'static str,
) -> Result<Vec<u8>, DecodeError> {
    let len = decode_len(decoder, max, what)?;
    decoder.claim_bytes_read(len)?;
    let mut bytes = vec![0u8; len];
    decoder.reader().read(&mut bytes)?;
    Ok(bytes)
}

/// At most `N` opaque bytes. It encodes exactly like a `Vec<u8>`; in JSON it is a hex string.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct BoundedBytes<const N: usize>(Vec<u8>);

impl<const N: usize> BoundedBytes<N> {
    /// The limit in bytes, `N`.
    pub const MAX: usize = N;

    /// Wraps `bytes`, or fails if there are more than `N`.
    pub fn new(bytes: Vec<u8>) -> Result<Self, LimitError> {
        if bytes.len() > N {
            return Err(LimitError {
                what: "bytes",
                len: bytes.len(),
                max: N,
            });
        }
        Ok(Self(bytes))
    }

    /// The bytes.
    pub fn into_inner(self) -> Vec<u8> {
        self.0
    }
}

impl<const N: usize> Deref for BoundedBytes<N> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl<const N: usize> fmt::Debug for BoundedBytes<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes: {}", self.0.len(), crate::types::hex(&self.0))
    }
}

impl<const N: usize> Encode for BoundedBytes<N> {
    fn encode<E: Encoder>(&self, encoder: &mut E) -> Result<(), EncodeError> {
        self.0.encode(encoder)
    }
}

impl<Ctx, const N: usize> Decode<Ctx> for BoundedBytes<N> {
    fn decode<D: Decoder<Context = Ctx>>(decoder: &mut D) -> Result<Self, DecodeError> {
        decode_raw_bytes(decoder, N, "bytes").map(Self)
    }
}
impl<'de, Ctx, const N: usize> bincode::BorrowDecode<'de, Ctx> for BoundedBytes<N> {
    fn borrow_decode<D: bincode::de::BorrowDecoder<'de, Context = Ctx>>(
        decoder: &mut D,
    ) -> Result<Self, DecodeError> {
        Self::decode(decoder)
    }
}

impl<const N: usize> serde::Serialize for BoundedBytes<N> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::types::hex(&self.0))
    }
}

impl<'de, const N: usize> serde::Deserialize<'de> for BoundedBytes<N> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let bytes = crate::types::unhex(&text).map_err(serde::de::Error::custom)?;
        Self::new(bytes).map_err(serde::de::Error::custom)
    }
}

/// The most extension fields a message may carry.
pub const MAX_EXT_FIELDS: usize = 16;
/// The largest value of one extension field, in bytes.
pub const MAX_EXT_VALUE_BYTES: usize = 1024;

/// The extension map that ends every signed body: optional fields added by later revisions of
/// the same message version, keyed by a field number. Keys are strictly ascending on the wire.
/// Empty today; a reader ignores keys it does not know.
#[derive(Clone, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "BTreeMap<u16, BoundedBytes<MAX_EXT_VALUE_BYTES>>")]
pub struct Ext(BTreeMap<u16, BoundedBytes<MAX_EXT_VALUE_BYTES>>);

impl Ext {
    /// No extension fields.
    pub const fn new() -> Self {
        Self(BTreeMap::new())
    }

    /// Sets field `key`, or fails if the map would exceed [`MAX_EXT_FIELDS`] or the value
    /// [`MAX_EXT_VALUE_BYTES`].
    pub fn insert(&mut self, key: u16, value: Vec<u8>) -> Result<(), LimitError> {
        let value = BoundedBytes::new(value)?;
        if !self.0.contains_key(&key) && self.0.len() >= MAX_EXT_FIELDS {
            return Err(LimitError {
                what: "ext",
                len: self.0.len() + 1,
                max: MAX_EXT_FIELDS,
            });
        }
        self.0.insert(key, value);
        Ok(())
    }

    /// The value of field `key`, if present.
    pub fn get(&self, key: u16) -> Option<&[u8]> {
        self.0.get(&key).map(|v| &v[..])
    }

    /// Takes field `key` out, if present.
    pub fn remove(&mut self, key: u16) -> Option<Vec<u8>> {
        self.0.remove(&key).map(|v| v.to_vec())
    }

    /// True when no field is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl TryFrom<BTreeMap<u16, BoundedBytes<MAX_EXT_VALUE_BYTES>>> for Ext {
    type Error = LimitError;
    fn try_from(map: BTreeMap<u16, BoundedBytes<MAX_EXT_VALUE_BYTES>>) -> Result<Self, LimitError> {
        if map.len() > MAX_EXT_FIELDS {
            return Err(LimitError {
                what: "ext",
                len: map.len(),
                max: MAX_EXT_FIELDS,
            });
        }
        Ok(Self(map))
    }
}

impl Encode for Ext {
    fn encode<E: Encoder>(&self, encoder: &mut E) -> Result<(), EncodeError> {
        self.0.encode(encoder)
    }
}

impl<Ctx> Decode<Ctx> for Ext {
    fn decode<D: Decoder<Context = Ctx>>(decoder: &mut D) -> Result<Self, DecodeError> {
        let len = decode_len(decoder, MAX_EXT_FIELDS, "ext")?;
        let mut map = BTreeMap::new();
        let mut previous: Option<u16> = None;
        for _ in 0..len {
            let key = u16::decode(decoder)?;
            if previous.is_some_and(|p| key <= p) {
                return Err(DecodeError::Other("ext keys must be strictly ascending"));
            }
            previous = Some(key);
            let value = BoundedBytes::<MAX_EXT_VALUE_BYTES>::decode(decoder)?;
            map.insert(key, value);
        }
        Ok(Self(map))
    }
}
bincode::impl_borrow_decode!(Ext);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_vec_refuses_a_long_length_prefix_before_reading() {
        // A length prefix of 17 for a BoundedVec<u8, 16>: refused without reading elements.
        let bytes = encode(&vec![0u8; 17]).unwrap();
        let err = bincode::decode_from_slice::<BoundedVec<u8, 16>, _>(&bytes, wire_config());
        assert!(err.is_err());
        let ok = encode(&vec![0u8; 16]).unwrap();
        let (v, _) =
            bincode::decode_from_slice::<BoundedVec<u8, 16>, _>(&ok, wire_config()).unwrap();
        assert_eq!(v.len(), 16);
    }

    #[test]
    fn huge_length_prefix_does_not_allocate() {
        // u64::MAX as a varint length: must fail fast on the limit, not try to allocate.
        let mut bytes = vec![253u8];
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(
            bincode::decode_from_slice::<BoundedVec<u64, 16>, _>(&bytes, wire_config()).is_err()
        );
        assert!(bincode::decode_from_slice::<BoundedString<16>, _>(&bytes, wire_config()).is_err());
        assert!(bincode::decode_from_slice::<BoundedBytes<16>, _>(&bytes, wire_config()).is_err());
    }

    #[test]
    fn bounded_string_checks_utf8_and_length() {
        assert!(BoundedString::<3>::new("abcd").is_err());
        let bad = encode(&vec![0xffu8, 0xfe]).unwrap();
        assert!(bincode::decode_from_slice::<BoundedString<8>, _>(&bad, wire_config()).is_err());
    }

    #[test]
    fn ext_keys_must_ascend() {
        let mut ext = Ext::new();
        ext.insert(2, vec![1]).unwrap();
        ext.insert(1, vec![2]).unwrap();
        let bytes = encode(&ext).unwrap();
        let back: Ext = decode_exact(&bytes).unwrap();
        assert_eq!(back, ext);
        // Hand-made map with keys 2 then 1.
        let bad = [2u8, 2, 1, 1, 1, 1, 2];
        assert!(decode_exact::<Ext>(&bad).is_err());
    }

    #[test]
    fn a_frame_is_compared_with_its_one_encoding() {
        let data = vec![7u8; 300];
        let bytes = encode_frame(&data);
        assert_eq!(decode_frame::<Vec<u8>, 1024>(&bytes).unwrap(), data);
        // Its length written long: 300 as a u32 varint (252, ...) instead of a u16 (251, ...).
        let mut padded = vec![252u8];
        padded.extend(300u32.to_le_bytes());
        padded.extend(&data);
        assert!(matches!(
            decode_frame::<Vec<u8>, 1024>(&padded),
            Err(FrameError::NonCanonical)
        ));
        // The comparison: the same bytes, one byte off, one short, one more.
        let standard = bincode::config::standard();
        assert!(encodes_to(&data, &bytes, standard));
        let mut off = bytes.clone();
        *off.last_mut().unwrap() = 8;
        assert!(!encodes_to(&data, &off, standard));
        assert!(!encodes_to(&data, &bytes[..bytes.len() - 1], standard));
        let mut long = bytes.clone();
        long.push(0);
        assert!(!encodes_to(&data, &long, standard));
    }

    #[test]
    fn non_canonical_varint_is_refused() {
        // 5 encoded as a padded u16 varint (251, 5, 0) instead of the single byte 5.
        assert_eq!(decode_exact::<u64>(&[5]).unwrap(), 5);
        assert!(matches!(
            decode_exact::<u64>(&[251, 5, 0]),
            Err(BodyError::NonCanonical)
        ));
        assert!(matches!(
            decode_exact::<u64>(&[5, 0]),
            Err(BodyError::TrailingBytes { unread: 1 })
        ));
    }
}
