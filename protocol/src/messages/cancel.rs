//! A reserved window's cancellation fee schedule: what a renter that cancels the window
//! before its start pays, as a share of the window's committed minimum
//! ([`LeaseTerms::committed_s`](crate::LeaseTerms::committed_s)). The host publishes it in
//! its offers ([`OfferTerms::cancel_fees`](crate::OfferTerms::cancel_fees)) and the renter signs
//! it into the request ([`LeaseTerms::cancel_fees`](crate::LeaseTerms::cancel_fees)), so
//! neither can change it later.
//!
//! Text form, as hosts configure it: `24h:10%,1h:50%,10m:100%` (cancelled less than 24 h
//! before the start: 10% of the committed minimum; less than 1 h: 50%; less than 10 min:
//! all of it; earlier: nothing). `none` is the empty schedule: cancelling is free.

use std::fmt;
use std::str::FromStr;

use crate::messages::InvalidMessage;

/// The most steps a schedule has.
pub const MAX_FEE_TIERS: usize = 8;
/// One step's bytes on the wire: `within_s` (u32 little-endian), then `percent` (u8).
const TIER_BYTES: usize = 5;

/// One step of a schedule: a window cancelled less than `within_s` seconds before its start
/// pays `percent` of its committed minimum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeeTier {
    /// How close to the start the step begins, seconds (non-zero).
    pub within_s: u32,
    /// The share of the committed minimum it costs, 0 to 100.
    pub percent: u8,
}

/// A cancellation fee schedule: steps from the farthest to the closest, each at least as
/// dear as the one before (a later cancellation never pays less).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CancelFees {
    tiers: Vec<FeeTier>,
}

fn bad(reason: &'static str) -> InvalidMessage {
    InvalidMessage::Malformed {
        field: "ext",
        reason,
    }
}

impl CancelFees {
    /// A schedule of `tiers`, in any order: at most [`MAX_FEE_TIERS`], distinct non-zero
    /// `within_s`, percents at most 100 and never lower closer to the start.
    pub fn new(mut tiers: Vec<FeeTier>) -> Result<Self, InvalidMessage> {
        tiers.sort_by_key(|t| std::cmp::Reverse(t.within_s));
        Self::checked(tiers)
    }

    fn checked(tiers: Vec<FeeTier>) -> Result<Self, InvalidMessage> {
        if tiers.len() > MAX_FEE_TIERS {
            return Err(bad("cancellation fees: at most 8 steps"));
        }
        if tiers.iter().any(|t| t.within_s == 0 || t.percent > 100) {
            return Err(bad(
                "cancellation fees: each step starts before the window and costs 0 to 100%",
            ));
        }
        for pair in tiers.windows(2) {
            if pair[1].within_s >= pair[0].within_s {
                return Err(bad(
                    "cancellation fees: steps from the farthest to the closest, each once",
                ));
            }
            if pair[1].percent < pair[0].percent {
                return Err(bad(
                    "cancellation fees: a later cancellation never pays a smaller share",
                ));
            }
        }
        Ok(Self { tiers })
    }

    /// Reads the wire form: whole 5-byte steps, farthest first (the only encoding of a
    /// schedule, so equal schedules have equal bytes).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, InvalidMessage> {
        if !bytes.len().is_multiple_of(TIER_BYTES) {
            return Err(bad("cancellation fees: whole steps of 5 bytes"));
        }
        let tiers = bytes
            .chunks_exact(TIER_BYTES)
            .map(|s| FeeTier {
                within_s: u32::from_le_bytes([s[0], s[1], s[2], s[3]]),
                percent: s[4],
            })
            .collect();
        Self::checked(tiers)
    }

    /// The wire form (empty for the empty schedule).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.tiers
            .iter()
            .flat_map(|t| {
                let mut s = t.within_s.to_le_bytes().to_vec();
                s.push(t.percent);
                s
            })
            .collect()
    }

    /// The steps, farthest first.
    pub fn tiers(&self) -> &[FeeTier] {
        &self.tiers
    }

    /// Whether cancelling is free at any time.
    pub fn is_free(&self) -> bool {
        self.tiers.iter().all(|t| t.percent == 0)
    }

    /// The share of the committed minimum a cancellation `lead_ms` before the start costs,
    /// percent (the closest step the lead is within; 0 before every step).
    pub fn percent(&self, lead_ms: u64) -> u8 {
        self.tiers
            .iter()
            .filter(|t| lead_ms < u64::from(t.within_s) * 1000)
            .map(|t| t.percent)
            .max()
            .unwrap_or(0)
    }

    /// What a cancellation `lead_ms` before the start bills, GPU-seconds, for a window whose
    /// committed minimum is `committed_gpu_seconds` (rounded down, in the renter's favour).
    pub fn fee_gpu_seconds(&self, committed_gpu_seconds: u64, lead_ms: u64) -> u64 {
        let fee = u128::from(committed_gpu_seconds) * u128::from(self.percent(lead_ms)) / 100;
        u64::try_from(fee).unwrap_or(u64::MAX)
    }
}

fn span_text(s: u32) -> String {
    match s {
        s if s.is_multiple_of(86_400) => format!("{}d", s / 86_400),
        s if s.is_multiple_of(3_600) => format!("{}h", s / 3_600),
        s if s.is_multiple_of(60) => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

impl fmt::Display for CancelFees {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.tiers.is_empty() {
            return f.write_str("none");
        }
        let steps: Vec<String> = self
            .tiers
            .iter()
            .map(|t| format!("{}:{}%", span_text(t.within_s), t.percent))
            .collect();
        f.write_str(&steps.join(","))
    }
}

impl FromStr for CancelFees {
    type Err = String;

    /// Parses `24h:10%,1h:50%,10m:100%` (units `s`, `m`, `h`, `d`; the `%` optional) or
    /// `none`.
    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() || text == "none" {
            return Ok(Self::default());
        }
        let step = |part: &str| -> Option<FeeTier> {
            let (span, percent) = part.trim().split_once(':')?;
            let span = span.trim();
            let unit = match span.chars().last()? {
                's' => 1,
                'm' => 60,
                'h' => 3_600,
                'd' => 86_400,
                _ => return None,
            };
            let n: u32 = span[..span.len() - 1].parse().ok()?;
            let percent = percent.trim();
            let percent = percent.strip_suffix('%').unwrap_or(percent);
            Some(FeeTier {
                within_s: n.checked_mul(unit)?,
                percent: percent.trim().parse().ok()?,
            })
        };
        let tiers = text
            .split(',')
            .map(|part| {
                step(part).ok_or_else(|| {
                    format!(
                        "'{}': expected SPAN:PERCENT such as 1h:50% (spans in s, m, h or d)",
                        part.trim()
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(tiers).map_err(|e| e.to_string())
    }
}

/// On the wire, a schedule is its bytes ([`CancelFees::to_bytes`]) as a length-prefixed
/// byte string; a schedule that breaks its rules does not decode.
impl bincode::Encode for CancelFees {
    fn encode<E: bincode::enc::Encoder>(
        &self,
        encoder: &mut E,
    ) -> Result<(), bincode::error::EncodeError> {
        crate::BoundedBytes::<{ MAX_FEE_TIERS * TIER_BYTES }>::new(self.to_bytes())
            .map_err(|e| bincode::error::EncodeError::OtherString(e.to_string()))?
            .encode(encoder)
    }
}

impl<Ctx> bincode::Decode<Ctx> for CancelFees {
    fn decode<D: bincode::de::Decoder<Context = Ctx>>(
        decoder: &mut D,
    ) -> Result<Self, bincode::error::DecodeError> {
        let bytes: crate::BoundedBytes<{ MAX_FEE_TIERS * TIER_BYTES }> =
            bincode::Decode::decode(decoder)?;
        Self::from_bytes(&bytes).map_err(|_| {
            bincode::error::DecodeError::Other("a cancellation fee schedule that breaks its rules")
        })
    }
}

impl<'de, Ctx> bincode::BorrowDecode<'de, Ctx> for CancelFees {
    fn borrow_decode<D: bincode::de::BorrowDecoder<'de, Context = Ctx>>(
        decoder: &mut D,
    ) -> Result<Self, bincode::error::DecodeError> {
        bincode::Decode::decode(decoder)
    }
}

/// In JSON (the local API), a schedule is its text (`1h:50%,10m:100%`, or `none`).
impl serde::Serialize for CancelFees {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for CancelFees {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_reads_and_writes_its_text_and_bytes() {
        let fees: CancelFees = "10m:100%, 24h:10%,1h:50".parse().unwrap();
        assert_eq!(fees.to_string(), "1d:10%,1h:50%,10m:100%");
        assert_eq!(CancelFees::from_bytes(&fees.to_bytes()).unwrap(), fees);
        assert_eq!("none".parse::<CancelFees>().unwrap(), CancelFees::default());
        assert!(CancelFees::default().to_bytes().is_empty());
    }

    #[test]
    fn the_share_grows_as_the_start_comes_closer() {
        let fees: CancelFees = "1h:50%,10m:100%".parse().unwrap();
        assert_eq!(fees.percent(3_600_000), 0);
        assert_eq!(fees.percent(3_599_999), 50);
        assert_eq!(fees.percent(600_000), 50);
        assert_eq!(fees.percent(599_999), 100);
        assert_eq!(fees.percent(0), 100);
        assert_eq!(fees.fee_gpu_seconds(3, 1_000_000), 1, "rounded down");
        assert_eq!(fees.fee_gpu_seconds(3, 0), 3);
        assert!(!fees.is_free());
        assert!("1h:0%".parse::<CancelFees>().unwrap().is_free());
    }

    #[test]
    fn bad_schedules_are_refused() {
        for text in [
            "1h:50%,10m:20%",
            "1h:101%",
            "0s:10%",
            "1h:5%,60m:6%",
            "1x:5%",
            "1h",
        ] {
            assert!(text.parse::<CancelFees>().is_err(), "{text}");
        }
        let nine = (1..=9)
            .map(|i| format!("{i}m:10%"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(nine.parse::<CancelFees>().is_err());
        // Bytes out of order, or not whole steps.
        let near_first = [
            60u32.to_le_bytes().as_slice(),
            &[10],
            &3600u32.to_le_bytes(),
            &[20],
        ]
        .concat();
        assert!(CancelFees::from_bytes(&near_first).is_err());
        assert!(CancelFees::from_bytes(&[1, 0, 0]).is_err());
    }
}
