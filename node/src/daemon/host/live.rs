//! Changes to a running host: its price, spot floor and region, and pausing it. Each is
//! stored (flushed) and kept over `config.toml`'s at the next start, and the offers are
//! signed again at once with a new sequence number; leases already agreed keep the terms
//! both sides signed. A paused host withdraws every offer and refuses new leases while its
//! running leases go on; a draining host (`drain-until`) offers and takes only leases that
//! end by then, so the machine is free at a time its owner chose.

use gpux_api::{ApiError, ErrorCode, HostLive};
use gpux_protocol::MicroCredits;

use super::HostRole;

/// The settings changed here, by the name `gpux host set` and `POST /v1/settings` use.
/// (`failed-gpus` takes only the empty value: `gpux host check` clears the GPUs withheld for
/// a fault once it reads every GPU well.)
pub(crate) const NAMES: [&str; 9] = [
    "price",
    "spot-floor",
    "region",
    "cancel-fees",
    "cpus",
    "memory",
    "paused",
    "drain-until",
    "failed-gpus",
];

/// Where a change is stored: `host-live/<name>`.
fn key(name: &str) -> String {
    format!("host-live/{name}")
}

/// What a value means for `name` (validated as `config.toml`'s would be), on a host priced
/// `price` with the spot floor `floor`.
enum Change {
    Price(MicroCredits),
    SpotFloor(Option<MicroCredits>),
    Region(String),
    Paused(bool),
    /// Leases must end by then (unix ms); `None`: no drain.
    DrainUntil(Option<gpux_protocol::Timestamp>),
    CancelFees(gpux_protocol::CancelFees),
    /// Threads given to leases (`None`: every thread).
    Cpus(Option<u32>),
    /// Memory given to leases, bytes (`None`: all but what the host keeps).
    Memory(Option<u64>),
}

fn parse(
    name: &str,
    value: &str,
    (price_now, floor_now): (MicroCredits, Option<MicroCredits>),
) -> Result<Change, String> {
    let value = value.trim();
    let credits = |v: &str| v.parse::<MicroCredits>().map_err(|e| format!("'{v}': {e}"));
    match name {
        "price" => {
            let price = credits(value)?;
            if price.0 == 0 || price > gpux_protocol::MAX_PRICE_PER_GPU_HOUR {
                return Err(format!(
                    "{price} credits per GPU-hour: must be above 0 and at most {} (the \
                     protocol's bound)",
                    gpux_protocol::MAX_PRICE_PER_GPU_HOUR
                ));
            }
            if let Some(floor) = floor_now.filter(|f| *f > price) {
                return Err(format!(
                    "{price}: under the spot floor ({floor}); lower the floor first"
                ));
            }
            Ok(Change::Price(price))
        }
        "spot-floor" if value == "off" => Ok(Change::SpotFloor(None)),
        "spot-floor" => {
            let floor = credits(value)?;
            if floor.0 == 0 || floor > price_now {
                return Err(format!(
                    "{floor}: must be above 0 and at most the price ({price_now}), or `off`"
                ));
            }
            Ok(Change::SpotFloor(Some(floor)))
        }
        "region" => {
            if !gpux_protocol::is_region(value) {
                return Err(format!(
                    "'{value}': a token of 1 to 32 lower-case letters, digits and '-' (eu-west)"
                ));
            }
            Ok(Change::Region(value.to_string()))
        }
        "cancel-fees" => value
            .parse::<gpux_protocol::CancelFees>()
            .map(Change::CancelFees)
            .map_err(|e| format!("'{value}': {e} (e.g. 24h:10%,1h:50%,10m:100%, or none)")),
        "cpus" if value == "all" => Ok(Change::Cpus(None)),
        "cpus" => value
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=65_535).contains(n))
            .map(|n| Change::Cpus(Some(n)))
            .ok_or_else(|| format!("'{value}': threads from 1 to 65535, or `all`")),
        "memory" if value == "all" => Ok(Change::Memory(None)),
        "memory" => value
            .parse::<bytesize::ByteSize>()
            .ok()
            .map(|b| b.as_u64())
            .filter(|b| *b >= 1 << 30)
            .map(|b| Change::Memory(Some(b)))
            .ok_or_else(|| format!("'{value}': a size of at least 1 GiB (e.g. 48GiB), or `all`")),
        "drain-until" if value == "off" => Ok(Change::DrainUntil(None)),
        "drain-until" => value
            .parse::<u64>()
            .map(|ms| Change::DrainUntil(Some(gpux_protocol::Timestamp(ms))))
            .map_err(|_| format!("'{value}': a time in unix milliseconds, or `off`")),
        "paused" => match value {
            "true" => Ok(Change::Paused(true)),
            "false" => Ok(Change::Paused(false)),
            other => Err(format!("'{other}': true or false")),
        },
        other => Err(format!("no host setting named '{other}'")),
    }
}

impl HostRole {
    /// At start: the changes made while an earlier run of this node ran, over
    /// `config.toml`'s values (each said in the log). A stored value that no longer reads
    /// is skipped, with a word.
    pub(crate) fn apply_stored_changes(&mut self) {
        for name in NAMES.into_iter().filter(|n| *n != "failed-gpus") {
            let stored = match self.state.config(&key(name)) {
                Ok(Some(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!("host setting {name}: cannot read its stored change: {e}");
                    continue;
                }
            };
            match parse(name, &stored, self.prices()) {
                Ok(change) => {
                    self.apply_change(change);
                    tracing::info!(
                        "host setting {name} = {stored} (set with `gpux host set`; over config.toml)"
                    );
                }
                Err(e) => tracing::warn!("host setting {name}: the stored change {e}; skipped"),
            }
        }
    }

    fn prices(&self) -> (MicroCredits, Option<MicroCredits>) {
        (self.options.price, self.options.spot_floor)
    }

    fn apply_change(&mut self, change: Change) {
        match change {
            Change::Price(price) => self.options.price = price,
            Change::SpotFloor(floor) => self.options.spot_floor = floor,
            Change::Region(region) => self.options.region = region,
            Change::Paused(paused) => {
                let mut w = self.book.withheld().clone();
                w.paused = paused;
                self.book.set_withheld(w);
            }
            Change::CancelFees(fees) => self.options.cancel_fees = fees,
            Change::Cpus(cpus) => {
                self.options.cpus = cpus;
                self.options
                    .machine
                    .set_given(self.options.cpus, self.options.memory_bytes);
            }
            Change::Memory(memory) => {
                self.options.memory_bytes = memory;
                self.options
                    .machine
                    .set_given(self.options.cpus, self.options.memory_bytes);
            }
            Change::DrainUntil(until) => {
                let mut w = self.book.withheld().clone();
                w.drain_until = until;
                self.book.set_withheld(w);
            }
        }
    }

    /// Changes `name` to `value`: validated, stored (flushed), applied; the caller
    /// publishes the offers again.
    pub(crate) fn change(&mut self, name: &str, value: &str) -> Result<HostLive, ApiError> {
        if name == "failed-gpus" {
            if !value.trim().is_empty() {
                return Err(ApiError::bad_input(
                    "failed-gpus: only the empty value, which offers the failed GPUs again",
                )
                .with_hint("`gpux host check` clears them once it reads every GPU well"));
            }
            self.clear_failed_gpus()?;
            return Ok(self.live());
        }
        let change = parse(name, value, self.prices()).map_err(|e| {
            ApiError::bad_input(format!("{name}: {e}"))
                .with_hint(
                    "host settings: price, spot-floor (or off), region, cancel-fees, cpus, memory, paused, drain-until (unix ms or off)",
                )
        })?;
        self.state
            .set_config(&key(name), value.trim().as_bytes())
            .map_err(|e| ApiError::new(ErrorCode::Internal, format!("storing {name}: {e}")))?;
        self.apply_change(change);
        self.publish_pending = true;
        Ok(self.live())
    }

    /// When the last lease this host holds ends by its terms (`None`: it holds none).
    fn free_at(&self) -> Option<gpux_protocol::Timestamp> {
        self.leases
            .values()
            .filter(|l| l.holds_gpus())
            .map(|l| l.deadline())
            .max()
    }

    /// The settings as they are now.
    pub(crate) fn live(&self) -> HostLive {
        HostLive {
            price: self.options.price.amount_text(),
            spot_floor: self.options.spot_floor.map(|f| f.amount_text()),
            region: self.options.region.clone(),
            cancel_fees: self.options.cancel_fees.to_string(),
            cpus: self.options.cpus,
            memory_bytes: self.options.memory_bytes,
            paused: self.book.withheld().paused,
            failed_gpus: self
                .book
                .withheld()
                .failed
                .iter()
                .map(ToString::to_string)
                .collect(),
            drain_until: self.book.withheld().drain_until.map(|t| t.0),
            free_at: self.free_at().map(|t| t.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const O: (MicroCredits, Option<MicroCredits>) =
        (MicroCredits(2_000_000), Some(MicroCredits(1_000_000)));

    #[test]
    fn changes_are_checked_as_the_config_file_s_values_are() {
        assert!(matches!(
            parse("price", "1.75", O),
            Ok(Change::Price(MicroCredits(1_750_000)))
        ));
        for bad in ["0", "-1", "20000", "abc", "0.5"] {
            assert!(parse("price", bad, O).is_err(), "price {bad}");
        }
        assert!(matches!(
            parse("spot-floor", "off", O),
            Ok(Change::SpotFloor(None))
        ));
        assert!(parse("spot-floor", "3", O).is_err(), "over the price");
        assert!(matches!(
            parse("region", "eu-west", O),
            Ok(Change::Region(_))
        ));
        for bad in ["", "EU", "eu west", "-eu", &"x".repeat(33)] {
            assert!(parse("region", bad, O).is_err(), "region {bad:?}");
        }
        assert!(matches!(
            parse("paused", "true", O),
            Ok(Change::Paused(true))
        ));
        assert!(parse("paused", "yes", O).is_err());
        assert!(parse("disk-price", "1", O).is_err());
        assert!(matches!(
            parse("cancel-fees", "1h:50%", O),
            Ok(Change::CancelFees(_))
        ));
        assert!(parse("cancel-fees", "soon", O).is_err());
        assert!(matches!(parse("cpus", "4", O), Ok(Change::Cpus(Some(4)))));
        assert!(matches!(parse("cpus", "all", O), Ok(Change::Cpus(None))));
        assert!(parse("cpus", "0", O).is_err());
        assert!(matches!(
            parse("memory", "48GiB", O),
            Ok(Change::Memory(Some(51_539_607_552)))
        ));
        assert!(parse("memory", "100MiB", O).is_err());
    }
}
