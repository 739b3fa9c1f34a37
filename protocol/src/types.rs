//! Small value types shared by the messages: times, content ids, GPU UUIDs, image digests,
//! escrow ids, compute capabilities, versions and evidence tiers.

use std::fmt;
use std::str::FromStr;

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        // Writing to a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Parses hex (either case) into bytes.
pub fn unhex(text: &str) -> Result<Vec<u8>, ParseError> {
    let digits = text.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return Err(ParseError::new("hex", text, "an odd number of digits"));
    }
    digits
        .chunks(2)
        .map(|pair| {
            let hi = (pair[0] as char).to_digit(16);
            let lo = (pair[1] as char).to_digit(16);
            match (hi, lo) {
                (Some(h), Some(l)) => Ok((h * 16 + l) as u8),
                _ => Err(ParseError::new(
                    "hex",
                    text,
                    "a character that is not a hex digit",
                )),
            }
        })
        .collect()
}

fn unhex_array<const N: usize>(what: &'static str, text: &str) -> Result<[u8; N], ParseError> {
    let bytes = unhex(text).map_err(|e| ParseError::new(what, text, e.reason))?;
    bytes
        .try_into()
        .map_err(|_| ParseError::new(what, text, "the wrong length"))
}

/// A value given as text could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} '{input}': {reason}")]
pub struct ParseError {
    /// What was being parsed.
    pub what: &'static str,
    /// The input (shortened to 80 characters).
    pub input: String,
    /// Why it was refused.
    pub reason: &'static str,
}

impl ParseError {
    pub(crate) fn new(what: &'static str, input: &str, reason: &'static str) -> Self {
        Self {
            what,
            input: input.chars().take(80).collect(),
            reason,
        }
    }
}

/// Implements serde through `Display` and `FromStr`, so JSON shows the readable form.
macro_rules! serde_via_str {
    ($ty:ty) => {
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}
pub(crate) use serde_via_str;

/// A point in time: milliseconds since the Unix epoch (UTC). Every time on the wire is one.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// `ms` milliseconds later, saturating.
    pub const fn plus_ms(self, ms: u64) -> Self {
        Self(self.0.saturating_add(ms))
    }

    /// `secs` seconds later, saturating.
    pub const fn plus_secs(self, secs: u64) -> Self {
        self.plus_ms(secs.saturating_mul(1000))
    }

    /// Milliseconds from `earlier` to `self`, or 0 if `earlier` is later.
    pub const fn ms_since(self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:03}s", self.0 / 1000, self.0 % 1000)
    }
}

/// The blake3 hash of an envelope's exact bytes: the id of a signed message. An offer's id is
/// its `OfferId`; a `LeaseRequest`'s id is the lease id.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, bincode::Encode, bincode::Decode)]
pub struct ContentId(pub [u8; 32]);

impl ContentId {
    /// The blake3 hash of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(*blake3::hash(bytes).as_bytes())
    }

    /// A short form for tables and logs: the first 8 bytes in hex.
    pub fn short(&self) -> String {
        hex(&self.0[..8])
    }
}

impl fmt::Display for ContentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0))
    }
}

impl fmt::Debug for ContentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ContentId({})", self.short())
    }
}

impl FromStr for ContentId {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        unhex_array("content id", s).map(Self)
    }
}
serde_via_str!(ContentId);

/// A GPU device as NVML names it: a whole GPU (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`) or
/// one MIG instance of a GPU (`MIG-` and a UUID of the same form, as drivers since R470 print
/// it), held as its kind and 16 bytes. On the wire the kind comes first (0 GPU, 1 MIG), so a
/// reader never takes a slice for a whole GPU.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, bincode::Encode, bincode::Decode)]
pub enum GpuUuid {
    /// A whole GPU.
    Gpu([u8; 16]),
    /// A MIG instance (a slice of a GPU).
    Mig([u8; 16]),
}

impl GpuUuid {
    /// The 16 bytes of the UUID.
    pub const fn bytes(&self) -> &[u8; 16] {
        match self {
            GpuUuid::Gpu(b) | GpuUuid::Mig(b) => b,
        }
    }

    /// Whether this names a MIG instance.
    pub const fn is_mig(&self) -> bool {
        matches!(self, GpuUuid::Mig(_))
    }
}

impl fmt::Display for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = hex(self.bytes());
        let prefix = if self.is_mig() { "MIG" } else { "GPU" };
        write!(
            f,
            "{prefix}-{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        )
    }
}

impl fmt::Debug for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for GpuUuid {
    type Err = ParseError;
    /// Accepts `GPU-` or `MIG-` followed by a UUID in 8-4-4-4-12 form (either case). The
    /// MIG form of drivers before R470 (`MIG-GPU-.../gi/ci`) is refused.
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let (mig, rest) = if let Some(rest) = s.strip_prefix("GPU-") {
            (false, rest)
        } else if let Some(rest) = s.strip_prefix("MIG-") {
            if rest.starts_with("GPU-") {
                return Err(ParseError::new(
                    "GPU UUID",
                    s,
                    "this is the MIG naming of drivers before R470; gpux needs R470 or later",
                ));
            }
            (true, rest)
        } else {
            return Err(ParseError::new(
                "GPU UUID",
                s,
                "it starts with neither 'GPU-' nor 'MIG-'",
            ));
        };
        let groups: Vec<&str> = rest.split('-').collect();
        let lens: Vec<usize> = groups.iter().map(|g| g.len()).collect();
        if lens != [8, 4, 4, 4, 12] {
            return Err(ParseError::new(
                "GPU UUID",
                s,
                "expected GPU- or MIG- and 8-4-4-4-12 hex digits",
            ));
        }
        let bytes = unhex_array("GPU UUID", &groups.concat())?;
        Ok(if mig {
            GpuUuid::Mig(bytes)
        } else {
            GpuUuid::Gpu(bytes)
        })
    }
}
serde_via_str!(GpuUuid);

/// A container image's content digest (`sha256:<64 hex>`), as Docker reports it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, bincode::Encode, bincode::Decode)]
pub struct ImageDigest(pub [u8; 32]);

impl fmt::Display for ImageDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", hex(&self.0))
    }
}

impl fmt::Debug for ImageDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", hex(&self.0[..8]))
    }
}

impl FromStr for ImageDigest {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let rest = s.strip_prefix("sha256:").ok_or_else(|| {
            ParseError::new("image digest", s, "it does not start with 'sha256:'")
        })?;
        unhex_array("image digest", rest).map(Self)
    }
}
serde_via_str!(ImageDigest);

/// An escrow's id, chosen at random by the renter and named in its `LeaseRequest`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, bincode::Encode, bincode::Decode)]
pub struct EscrowId(pub [u8; 16]);

impl fmt::Display for EscrowId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0))
    }
}

impl fmt::Debug for EscrowId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EscrowId({self})")
    }
}

impl FromStr for EscrowId {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        unhex_array("escrow id", s).map(Self)
    }
}
serde_via_str!(EscrowId);

/// A CUDA compute capability such as 9.0 (Hopper) or 8.6 (GA10x).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, bincode::Encode, bincode::Decode,
)]
pub struct ComputeCapability {
    /// Major version.
    pub major: u8,
    /// Minor version.
    pub minor: u8,
}

impl ComputeCapability {
    /// `major.minor`.
    pub const fn new(major: u8, minor: u8) -> Self {
        Self { major, minor }
    }
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl FromStr for ComputeCapability {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let (major, minor) = s.split_once('.').unwrap_or((s, "0"));
        match (major.parse(), minor.parse()) {
            (Ok(major), Ok(minor)) => Ok(Self { major, minor }),
            _ => Err(ParseError::new(
                "compute capability",
                s,
                "expected MAJOR.MINOR, e.g. 9.0",
            )),
        }
    }
}
serde_via_str!(ComputeCapability);

/// A dotted version such as a driver's `550.54.15` or CUDA's `12.4` (patch 0).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    bincode::Encode,
    bincode::Decode,
)]
pub struct Version {
    /// Major.
    pub major: u16,
    /// Minor.
    pub minor: u16,
    /// Patch.
    pub patch: u16,
}

impl Version {
    /// A version.
    pub const fn new(major: u16, minor: u16, patch: u16) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.patch == 0 {
            write!(f, "{}.{}", self.major, self.minor)
        } else {
            write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
        }
    }
}

impl FromStr for Version {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let mut parts = [0u16; 3];
        let fields: Vec<&str> = s.split('.').collect();
        if fields.is_empty() || fields.len() > 3 {
            return Err(ParseError::new(
                "version",
                s,
                "expected MAJOR[.MINOR[.PATCH]]",
            ));
        }
        for (slot, field) in parts.iter_mut().zip(&fields) {
            *slot = field
                .parse()
                .map_err(|_| ParseError::new("version", s, "expected MAJOR[.MINOR[.PATCH]]"))?;
        }
        Ok(Self::new(parts[0], parts[1], parts[2]))
    }
}
serde_via_str!(Version);

/// How strongly a host's GPU claims are backed, weakest first (so `tier >= challenged` works).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, bincode::Encode, bincode::Decode,
)]
pub enum EvidenceTier {
    /// NVML facts read by the host and signed by it.
    SelfReported,
    /// The host passed a renter's performance challenge.
    Challenged,
    /// An NVIDIA confidential-computing attestation report was verified.
    CcAttested,
}

impl EvidenceTier {
    /// Every tier, weakest first.
    pub const ALL: [EvidenceTier; 3] = [Self::SelfReported, Self::Challenged, Self::CcAttested];

    /// The name used in queries and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Self::SelfReported => "self-reported",
            Self::Challenged => "challenged",
            Self::CcAttested => "cc-attested",
        }
    }
}

impl fmt::Display for EvidenceTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EvidenceTier {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                ParseError::new(
                    "evidence tier",
                    s,
                    "expected self-reported, challenged or cc-attested",
                )
            })
    }
}
serde_via_str!(EvidenceTier);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_uuid_round_trips_and_refuses_garbage() {
        let text = "GPU-8f6c1c2a-3b4d-4e5f-9a0b-1c2d3e4f5a6b";
        let uuid: GpuUuid = text.parse().unwrap();
        assert_eq!(uuid.to_string(), text);
        assert_eq!(
            "GPU-8F6C1C2A-3B4D-4E5F-9A0B-1C2D3E4F5A6B"
                .parse::<GpuUuid>()
                .unwrap(),
            uuid
        );
        // A MIG instance: same bytes, another device, never equal to the whole GPU.
        let mig: GpuUuid = "MIG-8f6c1c2a-3b4d-4e5f-9a0b-1c2d3e4f5a6b".parse().unwrap();
        assert!(mig.is_mig() && !uuid.is_mig());
        assert_eq!(mig.bytes(), uuid.bytes());
        assert_ne!(mig, uuid);
        assert_eq!(mig.to_string(), "MIG-8f6c1c2a-3b4d-4e5f-9a0b-1c2d3e4f5a6b");
        let wire = crate::codec::encode(&mig).unwrap();
        assert_eq!(wire[0], 1, "the kind comes first");
        assert_eq!(crate::codec::decode_exact::<GpuUuid>(&wire).unwrap(), mig);
        for bad in [
            "",
            "GPU-",
            "MIG-GPU-8f6c1c2a-3b4d-4e5f-9a0b-1c2d3e4f5a6b/1/0",
            "mig-8f6c1c2a-3b4d-4e5f-9a0b-1c2d3e4f5a6b",
            "8f6c1c2a-3b4d-4e5f-9a0b-1c2d3e4f5a6b",
            "GPU-8f6c1c2a3b4d4e5f9a0b1c2d3e4f5a6b",
            "GPU-zf6c1c2a-3b4d-4e5f-9a0b-1c2d3e4f5a6b",
        ] {
            assert!(bad.parse::<GpuUuid>().is_err(), "{bad}");
        }
    }

    #[test]
    fn digests_versions_and_tiers_parse() {
        let d: ImageDigest = format!("sha256:{}", "ab".repeat(32)).parse().unwrap();
        assert_eq!(d.0, [0xab; 32]);
        assert!("sha256:abc".parse::<ImageDigest>().is_err());
        assert_eq!(
            "550.54.15".parse::<Version>().unwrap(),
            Version::new(550, 54, 15)
        );
        assert_eq!("12.4".parse::<Version>().unwrap().to_string(), "12.4");
        assert!("12.x".parse::<Version>().is_err());
        assert_eq!(
            "8.6".parse::<ComputeCapability>().unwrap(),
            ComputeCapability::new(8, 6)
        );
        assert!(EvidenceTier::Challenged > EvidenceTier::SelfReported);
        assert_eq!(
            "CC-attested".parse::<EvidenceTier>().unwrap(),
            EvidenceTier::CcAttested
        );
    }

    #[test]
    fn hex_round_trips() {
        assert_eq!(
            unhex(&hex(&[0, 1, 254, 255])).unwrap(),
            vec![0, 1, 254, 255]
        );
        assert!(unhex("0g").is_err());
        assert!(unhex("abc").is_err());
    }
}
