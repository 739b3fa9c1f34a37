//! The renter's spend cap (`gpux config set spend-cap CREDITS`): the most credits this
//! node's open leases may commit at once (their escrows, until each settles). A rent, group
//! order or bid fill whose worst case (its GPUs for its whole duration at its top price)
//! would take the open commitments past the cap is refused before any host is asked. Rents
//! still being matched count at their worst case until they end, so two at once cannot
//! both slip under it. The cap is kept in the store and holds across restarts.

use gpux_api::{ApiError, ErrorCode, RentRequest, SettingChange, Settings};
use gpux_lease::RenterPhase;
use gpux_protocol::{MicroCredits, money};

use super::Daemon;

/// The store's key for the cap (micro-credits, decimal).
const SPEND_CAP_KEY: &str = "spend-cap";

/// The most a lease of `gpus` GPUs for `duration_s` at `price` per GPU-hour can cost (its
/// escrow, before any workspace charge).
pub(super) fn worst_case(
    gpus: u16,
    duration_s: u32,
    price: MicroCredits,
) -> Result<MicroCredits, ApiError> {
    let seconds = u64::from(gpus) * u64::from(duration_s).max(money::MIN_BILLED_SECONDS);
    money::cost(seconds, price).map_err(|e| ApiError::bad_input(e.to_string()))
}

/// A rent request's worst case.
pub(super) fn worst_of(request: &RentRequest) -> Result<MicroCredits, ApiError> {
    let price = request
        .max_price
        .parse::<MicroCredits>()
        .map_err(|e| ApiError::bad_input(format!("--max-price: {e}")))?;
    worst_case(request.gpus, request.duration_s, price)
}

impl Daemon {
    /// The cap, if one is set (an unreadable value counts as none, with a word).
    pub(super) fn spend_cap(&self) -> Option<MicroCredits> {
        let bytes = self.state.config(SPEND_CAP_KEY).ok().flatten()?;
        let text = String::from_utf8_lossy(&bytes);
        if text.trim().is_empty() {
            return None;
        }
        match text.trim().parse::<u64>() {
            Ok(micro) => Some(MicroCredits(micro)),
            Err(e) => {
                tracing::warn!("the stored spend cap is unreadable ({e}); no cap applies");
                None
            }
        }
    }

    /// What this node's open leases commit: the escrows of its renter leases not yet
    /// settled, and the worst cases of rents still being matched.
    pub(super) fn committed(&self) -> u64 {
        self.renter
            .records()
            .iter()
            .filter(|(_, r)| r.phase != RenterPhase::Settled)
            .filter_map(|(_, r)| super::views::request_of(&r.request))
            .map(|request| request.escrow_amount.0)
            .fold(self.spend_pending, u64::saturating_add)
    }

    /// The settings the API reports.
    pub(super) fn settings(&self) -> Settings {
        Settings {
            spend_cap_micro: self.spend_cap().map(|c| c.0),
            committed_micro: self.committed(),
            host: self.host.as_ref().map(|h| h.live()),
        }
    }

    /// Changes one setting (`spend-cap`: credits, or `off`), stored and flushed.
    pub(super) fn change_setting(&mut self, change: &SettingChange) -> Result<Settings, ApiError> {
        let store_error = |e: crate::store::StoreError| {
            ApiError::new(ErrorCode::Internal, format!("storing the setting: {e}"))
        };
        match change.name.as_str() {
            "spend-cap" => {
                let value = change.value.trim();
                let stored = if value == "off" {
                    String::new()
                } else {
                    let cap = value.parse::<MicroCredits>().map_err(|e| {
                        ApiError::bad_input(format!("spend-cap {value}: {e}"))
                            .with_hint("credits (`250` or `12.5`), or `off`")
                    })?;
                    cap.0.to_string()
                };
                self.state
                    .set_config(SPEND_CAP_KEY, stored.as_bytes())
                    .map_err(store_error)?;
                Ok(self.settings())
            }
            name if super::host::LIVE_SETTINGS.contains(&name) => {
                let Some(host) = self.host.as_mut() else {
                    return Err(ApiError::bad_input(format!(
                        "{name} is a host's setting, and this node does not host"
                    ))
                    .with_hint("start the node with --host"));
                };
                // Published at the next paced publication (a second or two).
                host.change(name, &change.value)?;
                Ok(self.settings())
            }
            other => Err(ApiError::bad_input(format!("no setting named '{other}'"))
                .with_hint("settings: spend-cap; a host's: price, spot-floor, region, paused")),
        }
    }

    /// Refuses what could cost `worst` when the open commitments plus it pass the cap.
    pub(super) fn within_cap(&self, worst: MicroCredits) -> Result<(), ApiError> {
        let Some(cap) = self.spend_cap() else {
            return Ok(());
        };
        let committed = self.committed();
        if committed.saturating_add(worst.0) <= cap.0 {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorCode::Conflict,
            format!(
                "over the spend cap: this could cost up to {} credits, and open leases \
                 commit {} of the cap's {} credits",
                worst.amount_text(),
                MicroCredits(committed).amount_text(),
                cap.amount_text()
            ),
        )
        .with_hint("raise it with `gpux config set spend-cap CREDITS` (or `off`)"))
    }
}
