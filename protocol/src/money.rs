//! Money: integer micro-credits, parsed exactly from decimal text, with checked arithmetic.
//!
//! 1 credit = 1,000,000 micro-credits. There is no floating point anywhere near money.
//! Prices are per GPU-hour; [`cost`] turns GPU-seconds and a price into an amount.

use std::fmt;
use std::str::FromStr;

/// Micro-credits in one credit.
pub const MICROS_PER_CREDIT: u64 = 1_000_000;
/// Seconds in an hour, the unit prices are quoted in.
pub const SECONDS_PER_HOUR: u64 = 3600;
/// The shortest time billed for any lease, in seconds: per-second billing with a one-minute
/// minimum.
pub const MIN_BILLED_SECONDS: u64 = 60;

/// The highest price per GPU-hour any message may carry: 10,000 credits. Far above any real
/// GPU's price (an H100 rents for a few credits an hour at market rates), low enough that no
/// price can overflow an estimate, a cost or an escrow. A message above it is invalid.
pub const MAX_PRICE_PER_GPU_HOUR: MicroCredits = MicroCredits(10_000 * MICROS_PER_CREDIT);
/// The longest lease (or offered maximum, or bid) any message may name: 366 days, seconds.
pub const MAX_DURATION_S: u32 = 366 * 24 * 3600;
/// The most one lease or bid may be worth at its price: GPUs x price x duration at most 100
/// million credits (an 8-GPU lease at 1,000 credits an hour for a year is 70 million).
pub const MAX_LEASE_VALUE: MicroCredits = MicroCredits(100_000_000 * MICROS_PER_CREDIT);

/// An amount of money in micro-credits.
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
pub struct MicroCredits(pub u64);

/// A money operation or parse that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MoneyError {
    /// The result does not fit in 64 bits of micro-credits.
    #[error("amount overflows (more than 18446744073709.551615 credits)")]
    Overflow,
    /// A subtraction would go below zero.
    #[error("amount would be negative")]
    Negative,
    /// Text that is not an amount.
    #[error(
        "invalid amount '{input}': {reason}; expected a decimal number of credits such as 2.10 or 0.000001"
    )]
    Malformed {
        /// The input (shortened).
        input: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// More than six decimal places that are not zero: smaller than one micro-credit.
    #[error("invalid amount '{input}': finer than one micro-credit (at most 6 decimal places)")]
    TooPrecise {
        /// The input (shortened).
        input: String,
    },
}

impl MicroCredits {
    /// Zero.
    pub const ZERO: Self = Self(0);

    /// `credits` whole credits.
    pub const fn from_credits(credits: u64) -> Result<Self, MoneyError> {
        match credits.checked_mul(MICROS_PER_CREDIT) {
            Some(m) => Ok(Self(m)),
            None => Err(MoneyError::Overflow),
        }
    }

    /// The amount in micro-credits.
    pub const fn micros(self) -> u64 {
        self.0
    }

    /// `self + other`, or [`MoneyError::Overflow`].
    pub fn checked_add(self, other: Self) -> Result<Self, MoneyError> {
        self.0
            .checked_add(other.0)
            .map(Self)
            .ok_or(MoneyError::Overflow)
    }

    /// `self - other`, or [`MoneyError::Negative`].
    pub fn checked_sub(self, other: Self) -> Result<Self, MoneyError> {
        self.0
            .checked_sub(other.0)
            .map(Self)
            .ok_or(MoneyError::Negative)
    }

    /// `self * n`, or [`MoneyError::Overflow`].
    pub fn checked_mul(self, n: u64) -> Result<Self, MoneyError> {
        self.0.checked_mul(n).map(Self).ok_or(MoneyError::Overflow)
    }
}

/// The cost of `gpu_seconds` GPU-seconds at `price_per_gpu_hour`.
///
/// **Rounding rule**: the exact product `price × gpu_seconds / 3600` is rounded *down* to
/// the micro-credit. Receipts are cumulative and always recomputed from the cumulative
/// GPU-seconds, so rounding never accumulates: over a whole lease the renter is charged less
/// than the exact amount by under one micro-credit. The product is taken in 128 bits, so only
/// a result above `u64::MAX` micro-credits is an overflow.
pub fn cost(
    gpu_seconds: u64,
    price_per_gpu_hour: MicroCredits,
) -> Result<MicroCredits, MoneyError> {
    let exact = u128::from(price_per_gpu_hour.0) * u128::from(gpu_seconds);
    u64::try_from(exact / u128::from(SECONDS_PER_HOUR))
        .map(MicroCredits)
        .map_err(|_| MoneyError::Overflow)
}

/// Bytes in a GiB, the unit workspaces are priced in.
pub const BYTES_PER_GIB: u64 = 1 << 30;

/// What keeping `bytes` of disk for `seconds` costs at `price_per_gib_hour` (a kept
/// workspace). The same rounding rule as [`cost`]: the exact product
/// `price × bytes × seconds / (2^30 × 3600)` is rounded down to the micro-credit; only a
/// product beyond 128 bits, or a result above `u64::MAX`, is an overflow.
pub fn storage_cost(
    bytes: u64,
    seconds: u64,
    price_per_gib_hour: MicroCredits,
) -> Result<MicroCredits, MoneyError> {
    let exact = u128::from(price_per_gib_hour.0)
        .checked_mul(u128::from(bytes))
        .and_then(|v| v.checked_mul(u128::from(seconds)))
        .ok_or(MoneyError::Overflow)?;
    let per = u128::from(BYTES_PER_GIB) * u128::from(SECONDS_PER_HOUR);
    u64::try_from(exact / per)
        .map(MicroCredits)
        .map_err(|_| MoneyError::Overflow)
}

/// Seconds billed for a lease that has run `runtime_s` seconds: per second, minimum
/// [`MIN_BILLED_SECONDS`].
pub const fn billed_seconds(runtime_s: u64) -> u64 {
    if runtime_s < MIN_BILLED_SECONDS {
        MIN_BILLED_SECONDS
    } else {
        runtime_s
    }
}

impl FromStr for MicroCredits {
    type Err = MoneyError;

    /// Parses `DIGITS[.DIGITS]` credits exactly: `2.10` is 2,100,000 micro-credits and
    /// `0.000001` is 1. No sign, exponent, separators or spaces. Decimal places beyond the
    /// sixth must be zeros.
    fn from_str(s: &str) -> Result<Self, MoneyError> {
        let malformed = |reason| MoneyError::Malformed {
            input: s.chars().take(40).collect(),
            reason,
        };
        let (whole, frac) = match s.split_once('.') {
            Some((w, f)) => (w, Some(f)),
            None => (s, None),
        };
        if whole.is_empty() {
            return Err(malformed("it has no digits before the decimal point"));
        }
        if !whole.bytes().all(|b| b.is_ascii_digit()) {
            return Err(malformed("it is not a plain decimal number"));
        }
        let mut micros: u64 = 0;
        for b in whole.bytes() {
            micros = micros
                .checked_mul(10)
                .and_then(|m| m.checked_add(u64::from(b - b'0')))
                .ok_or(MoneyError::Overflow)?;
        }
        micros = micros
            .checked_mul(MICROS_PER_CREDIT)
            .ok_or(MoneyError::Overflow)?;
        if let Some(frac) = frac {
            if frac.is_empty() {
                return Err(malformed("it has no digits after the decimal point"));
            }
            if !frac.bytes().all(|b| b.is_ascii_digit()) {
                return Err(malformed("it is not a plain decimal number"));
            }
            let (kept, rest) = frac.split_at(frac.len().min(6));
            if rest.bytes().any(|b| b != b'0') {
                return Err(MoneyError::TooPrecise {
                    input: s.chars().take(40).collect(),
                });
            }
            let mut part: u64 = 0;
            for b in kept.bytes() {
                part = part * 10 + u64::from(b - b'0');
            }
            for _ in kept.len()..6 {
                part *= 10;
            }
            micros = micros.checked_add(part).ok_or(MoneyError::Overflow)?;
        }
        Ok(Self(micros))
    }
}

impl fmt::Display for MicroCredits {
    /// `2.10 credits`, `0.000001 credits`: whole credits, then the fraction with trailing
    /// zeros trimmed down to two places.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} credits", self.amount_text())
    }
}

impl MicroCredits {
    /// The amount as a plain decimal (`2.10`), as [`FromStr`] accepts it; no unit.
    pub fn amount_text(&self) -> String {
        let whole = self.0 / MICROS_PER_CREDIT;
        let frac = format!("{:06}", self.0 % MICROS_PER_CREDIT);
        let trimmed = frac.trim_end_matches('0');
        let shown = if trimmed.len() < 2 {
            &frac[..2]
        } else {
            trimmed
        };
        format!("{whole}.{shown}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<MicroCredits, MoneyError> {
        s.parse()
    }

    #[test]
    fn parses_exactly() {
        assert_eq!(p("2.10").unwrap(), MicroCredits(2_100_000));
        assert_eq!(p("0.000001").unwrap(), MicroCredits(1));
        assert_eq!(p("0").unwrap(), MicroCredits(0));
        assert_eq!(p("7").unwrap(), MicroCredits(7_000_000));
        assert_eq!(p("1.5000000").unwrap(), MicroCredits(1_500_000));
        assert_eq!(p("18446744073709.551615").unwrap(), MicroCredits(u64::MAX));
        // 0.1 + 0.2 is exactly 0.3 here.
        let sum = p("0.1").unwrap().checked_add(p("0.2").unwrap()).unwrap();
        assert_eq!(sum, p("0.3").unwrap());
    }

    #[test]
    fn refuses_malformed_and_overflowing_text() {
        for bad in [
            "", ".5", "5.", "-1", "+1", "1e3", "1,000", " 1", "1 ", "0x10", "1.2.3", "abc", "1.-5",
        ] {
            assert!(
                matches!(p(bad), Err(MoneyError::Malformed { .. })),
                "{bad:?}: {:?}",
                p(bad)
            );
        }
        assert!(matches!(p("0.0000001"), Err(MoneyError::TooPrecise { .. })));
        assert_eq!(p("18446744073709.551616"), Err(MoneyError::Overflow));
        assert_eq!(p("18446744073710"), Err(MoneyError::Overflow));
        assert_eq!(p("99999999999999999999999"), Err(MoneyError::Overflow));
    }

    #[test]
    fn arithmetic_is_checked() {
        let max = MicroCredits(u64::MAX);
        assert_eq!(max.checked_add(MicroCredits(1)), Err(MoneyError::Overflow));
        assert_eq!(
            MicroCredits(1).checked_sub(MicroCredits(2)),
            Err(MoneyError::Negative)
        );
        assert_eq!(max.checked_mul(2), Err(MoneyError::Overflow));
        assert_eq!(MicroCredits(3).checked_mul(4), Ok(MicroCredits(12)));
        assert_eq!(
            MicroCredits::from_credits(u64::MAX),
            Err(MoneyError::Overflow)
        );
    }

    #[test]
    fn displays_with_units() {
        assert_eq!(MicroCredits(2_100_000).to_string(), "2.10 credits");
        assert_eq!(MicroCredits(1).to_string(), "0.000001 credits");
        assert_eq!(MicroCredits(0).to_string(), "0.00 credits");
        assert_eq!(MicroCredits(1_234_500).to_string(), "1.2345 credits");
        for m in [0, 1, 10, 999_999, 1_000_000, 2_100_000, u64::MAX] {
            assert_eq!(p(&MicroCredits(m).amount_text()).unwrap(), MicroCredits(m));
        }
    }

    #[test]
    fn storage_costs_per_gib_hour_rounded_down() {
        // 1 credit per GiB-hour: 4 GiB for 30 minutes is 2 credits.
        let credit = MicroCredits(1_000_000);
        assert_eq!(
            storage_cost(4 << 30, 1800, credit).unwrap(),
            MicroCredits(2_000_000)
        );
        // 1 MiB for 1 s: 1e6 / 1024 / 3600 = 0.27... rounds down to 0.
        assert_eq!(storage_cost(1 << 20, 1, credit).unwrap(), MicroCredits(0));
        assert_eq!(storage_cost(0, 3600, credit).unwrap(), MicroCredits::ZERO);
        // No wrap-around: a product beyond 128 bits, or a sum beyond u64, is refused.
        assert_eq!(
            storage_cost(u64::MAX, u64::MAX, MicroCredits(u64::MAX)),
            Err(MoneyError::Overflow)
        );
        assert_eq!(
            storage_cost(u64::MAX, 3600 << 30, credit),
            Err(MoneyError::Overflow)
        );
    }

    #[test]
    fn cost_rounds_down_to_the_micro_credit() {
        // 2.50 credits per GPU-hour for one hour on 2 GPUs: exactly 5 credits.
        assert_eq!(
            cost(7200, p("2.5").unwrap()).unwrap(),
            MicroCredits(5_000_000)
        );
        // 1 micro-credit per GPU-hour for 3599 GPU-seconds: 0.9997... rounds down to 0.
        assert_eq!(cost(3599, MicroCredits(1)).unwrap(), MicroCredits(0));
        assert_eq!(cost(3600, MicroCredits(1)).unwrap(), MicroCredits(1));
        // 1 credit/h for 1 s = 277.77... micro-credits -> 277.
        assert_eq!(cost(1, MicroCredits(1_000_000)).unwrap(), MicroCredits(277));
        // Cumulative: never more than one micro-credit below the exact total.
        let price = MicroCredits(1_234_567);
        for secs in [1u64, 59, 60, 61, 3599, 86_400] {
            let c = cost(secs, price).unwrap().0 as u128;
            let exact_x3600 = price.0 as u128 * secs as u128;
            assert!(c * 3600 <= exact_x3600 && exact_x3600 < (c + 1) * 3600);
        }
        // The product is taken in 128 bits; only the result can overflow.
        assert_eq!(
            cost(3600, MicroCredits(u64::MAX)).unwrap(),
            MicroCredits(u64::MAX)
        );
        assert_eq!(
            cost(3601, MicroCredits(u64::MAX)),
            Err(MoneyError::Overflow)
        );
    }

    #[test]
    fn billing_minimum_is_one_minute() {
        assert_eq!(billed_seconds(0), 60);
        assert_eq!(billed_seconds(59), 60);
        assert_eq!(billed_seconds(61), 61);
    }
}
