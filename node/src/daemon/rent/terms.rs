//! The lease terms a rent asks of one offer: the workspace kept after the workload, for as
//! long as the renter asked (or the default, shortened to what the offer keeps), at the
//! offer's price; and, for a reserved window with a committed minimum, the offer's
//! cancellation fees.

use gpux_protocol::{CancelFees, Ext, MicroCredits, money};

use super::Workload;

/// A candidate's lease terms: the ext fields to sign, and what the kept workspace costs.
#[derive(Clone)]
pub(super) struct Terms {
    pub(super) ext: Ext,
    pub(super) charge: MicroCredits,
    pub(super) retention: Option<gpux_api::Retention>,
}

fn term_u64(ext: &Ext, key: u16) -> Option<u64> {
    ext.get(key)
        .and_then(|v| <[u8; 8]>::try_from(v).ok())
        .map(u64::from_le_bytes)
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
        let mut ext = self.terms.clone();
        // A window the renter commits to signs the offer's cancellation fees, unchanged.
        if term_u64(&ext, gpux_protocol::EXT_COMMITTED_S).is_some_and(|c| c > 0)
            && !cancel_fees.tiers().is_empty()
        {
            ext.insert(gpux_protocol::EXT_CANCEL_FEES, cancel_fees.to_bytes())
                .map_err(|e| e.to_string())?;
        }
        let Some(bytes) = term_u64(&ext, gpux_protocol::EXT_WORKSPACE_BYTES) else {
            return Ok(Terms {
                ext,
                charge: MicroCredits::ZERO,
                retention: None,
            });
        };
        let retain_s = match (term_u64(&ext, gpux_protocol::EXT_RETAIN_S), max_retain_s) {
            (Some(asked), Some(max)) if asked > max => {
                return Err(format!(
                    "keeps a workspace at most {max} s after the workload (--retain asks {asked} s)"
                ));
            }
            (Some(asked), _) => asked,
            (None, max) => gpux_protocol::DEFAULT_RETAIN_S.min(max.unwrap_or(u64::MAX)),
        };
        let charge = money::storage_cost(bytes, retain_s, price).map_err(|e| e.to_string())?;
        ext.insert(gpux_protocol::EXT_RETAIN_S, retain_s.to_le_bytes().to_vec())
            .map_err(|e| e.to_string())?;
        if price > MicroCredits::ZERO {
            ext.insert(
                gpux_protocol::EXT_WORKSPACE_PRICE,
                price.0.to_le_bytes().to_vec(),
            )
            .map_err(|e| e.to_string())?;
        }
        Ok(Terms {
            ext,
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
        let mut terms = Ext::new();
        for (key, value) in [
            (gpux_protocol::EXT_WORKSPACE_BYTES, disk),
            (gpux_protocol::EXT_RETAIN_S, retain),
        ] {
            if let Some(v) = value {
                terms.insert(key, v.to_le_bytes().to_vec()).unwrap();
            }
        }
        Workload {
            terms,
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
        assert!(none.ext.get(gpux_protocol::EXT_RETAIN_S).is_none());
        // The default 10 minutes, shortened to the offer's 5, and stated.
        let short = workload(Some(4 << 30), None)
            .terms_for((price, Some(300)), &CancelFees::default())
            .unwrap();
        assert_eq!(term_u64(&short.ext, gpux_protocol::EXT_RETAIN_S), Some(300));
        assert_eq!(
            term_u64(&short.ext, gpux_protocol::EXT_WORKSPACE_PRICE),
            Some(100_000)
        );
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
        assert!(free.ext.get(gpux_protocol::EXT_WORKSPACE_PRICE).is_none());
        assert_eq!(free.charge, MicroCredits::ZERO);
    }

    #[test]
    fn a_committed_window_signs_the_offers_cancellation_fees_and_only_then() {
        let fees: CancelFees = "1h:50%,10m:100%".parse().unwrap();
        let mut committed = workload(None, None);
        committed
            .terms
            .insert(
                gpux_protocol::EXT_COMMITTED_S,
                600u64.to_le_bytes().to_vec(),
            )
            .unwrap();
        let terms = committed
            .terms_for((MicroCredits::ZERO, None), &fees)
            .unwrap();
        assert_eq!(
            terms.ext.get(gpux_protocol::EXT_CANCEL_FEES),
            Some(fees.to_bytes().as_slice())
        );
        // Without a committed minimum there is nothing to take a share of.
        let plain = workload(None, None)
            .terms_for((MicroCredits::ZERO, None), &fees)
            .unwrap();
        assert!(plain.ext.get(gpux_protocol::EXT_CANCEL_FEES).is_none());
    }
}
