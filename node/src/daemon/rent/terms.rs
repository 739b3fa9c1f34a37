//! The lease terms a rent asks of one offer: the workspace kept after the workload, for as
//! long as the renter asked (or the default, shortened to what the offer keeps), at the
//! offer's price; and, for a reserved window with a committed minimum, the offer's
//! cancellation fees.

use gpux_protocol::{CancelFees, LeaseTerms, MicroCredits, money};

use super::Workload;

/// A candidate's lease terms: those to sign, and what the kept workspace costs.
#[derive(Clone)]
pub(super) struct Terms {
    pub(super) terms: LeaseTerms,
    pub(super) charge: MicroCredits,
    pub(super) retention: Option<gpux_api::Retention>,
}

impl Workload {
    /// The terms to ask of an offer that prices a kept workspace at `price` per GiB-hour and
    /// keeps one at most `max_retain_s`: the workspace kept as long as the renter asked (or
    /// the default, shortened to the offer's longest), at the offer's price. Always stated,
    /// so what is paid never rests on a default.
    pub(super) fn terms_for(
        &self,
        (price, max_retain_s): (MicroCredits, Option<u64>),
        cancel_fees: &CancelFees,
    ) -> Result<Terms, String> {
        let mut terms = self.terms.clone();
        // A window the renter commits to signs the offer's cancellation fees, unchanged.
        if terms.committed_s > 0 {
            terms.cancel_fees = cancel_fees.clone();
        }
        let Some(bytes) = terms.workspace_bytes else {
            return Ok(Terms {
                terms,
                charge: MicroCredits::ZERO,
                retention: None,
            });
        };
        let retain_s = match (terms.retain_s, max_retain_s) {
            (Some(asked), Some(max)) if asked > max => {
                return Err(format!(
                    "keeps a workspace at most {max} s after the workload (--retain asks {asked} s)"
                ));
            }
            (Some(asked), _) => asked,
            (None, max) => gpux_protocol::DEFAULT_RETAIN_S.min(max.unwrap_or(u64::MAX)),
        };
        let charge = money::storage_cost(bytes, retain_s, price).map_err(|e| e.to_string())?;
        terms.retain_s = Some(retain_s);
        terms.workspace_price = price;
        Ok(Terms {
            terms,
            charge,
            retention: Some(gpux_api::Retention {
                retain_s,
                price_per_gib_hour: price.amount_text(),
                charge: charge.amount_text(),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(disk: Option<u64>, retain: Option<u64>) -> Workload {
        Workload {
            terms: LeaseTerms {
                workspace_bytes: disk,
                retain_s: retain,
                ..LeaseTerms::default()
            },
            ..Workload::default()
        }
    }

    #[test]
    fn the_retention_is_stated_priced_and_within_what_the_offer_keeps() {
        let price = MicroCredits(100_000);
        // No workspace: nothing kept, nothing added.
        let none = workload(None, None)
            .terms_for((price, Some(60)), &CancelFees::default())
            .unwrap();
        assert_eq!((none.charge, none.retention), (MicroCredits::ZERO, None));
        assert_eq!(none.terms.retain_s, None);
        // The default 10 minutes, shortened to the offer's 5, and stated.
        let short = workload(Some(4 << 30), None)
            .terms_for((price, Some(300)), &CancelFees::default())
            .unwrap();
        assert_eq!(short.terms.retain_s, Some(300));
        assert_eq!(short.terms.workspace_price, MicroCredits(100_000));
        // 4 GiB for 5 minutes at 0.10 credits per GiB-hour.
        assert_eq!(short.charge, MicroCredits(33_333));
        assert_eq!(short.retention.unwrap().charge, "0.033333");
        // What the renter asked, when the offer keeps it that long; refused otherwise.
        let asked = workload(Some(4 << 30), Some(1800))
            .terms_for((price, Some(3600)), &CancelFees::default())
            .unwrap();
        assert_eq!(asked.charge, MicroCredits(200_000));
        let err = workload(Some(4 << 30), Some(1800))
            .terms_for((price, Some(900)), &CancelFees::default())
            .err()
            .unwrap();
        assert!(err.contains("at most 900 s"), "{err}");
        // A free retention carries no price term.
        let free = workload(Some(4 << 30), Some(60))
            .terms_for((MicroCredits::ZERO, None), &CancelFees::default())
            .unwrap();
        assert_eq!(free.terms.workspace_price, MicroCredits::ZERO);
        assert_eq!(free.charge, MicroCredits::ZERO);
    }

    #[test]
    fn a_committed_window_signs_the_offers_cancellation_fees_and_only_then() {
        let fees: CancelFees = "1h:50%,10m:100%".parse().unwrap();
        let mut committed = workload(None, None);
        committed.terms.committed_s = 600;
        let terms = committed
            .terms_for((MicroCredits::ZERO, None), &fees)
            .unwrap();
        assert_eq!(terms.terms.cancel_fees, fees);
        // Without a committed minimum there is nothing to take a share of.
        let plain = workload(None, None)
            .terms_for((MicroCredits::ZERO, None), &fees)
            .unwrap();
        assert!(plain.terms.cancel_fees.tiers().is_empty());
    }
}
