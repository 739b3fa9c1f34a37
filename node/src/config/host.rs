//! A host's settings (`host = true`): prices, the workspace and staging quotas, the share of
//! the machine leases get, and what it pulls from registries.

use std::path::Path;

use gpux_protocol::MicroCredits;

use super::{ConfigError, Effective, HostOptions, Options};

impl Effective {
    /// The host's settings, checked.
    pub(super) fn host_options(&self, data_dir: &Path) -> Result<HostOptions, ConfigError> {
        let o = &self.options;
        let d = Options::defaults();
        let images = o
            .images
            .iter()
            .flatten()
            .map(|i| {
                i.parse()
                    .map_err(|e| self.bad("images", format!("'{i}': {e}")))
            })
            .collect::<Result<_, _>>()?;
        let price = o.price.clone().or(d.price).unwrap_or_default();
        let disk_price = o.disk_price.clone().or(d.disk_price).unwrap_or_default();
        let quota = o.disk_quota.clone().or(d.disk_quota).unwrap_or_default();
        let disk_quota_bytes = quota
            .parse::<bytesize::ByteSize>()
            .map_err(|e| self.bad("disk_quota", format!("'{quota}': {e} (e.g. 64GiB)")))?
            .as_u64();
        let size = |name: &'static str, value: Option<String>| {
            let text = value.unwrap_or_default();
            text.parse::<bytesize::ByteSize>()
                .map(|b| b.as_u64())
                .map_err(|e| self.bad(name, format!("'{text}': {e} (e.g. 20GiB)")))
        };
        let max_image_bytes = size("max_image", o.max_image.clone().or(d.max_image))?;
        let stage_quota_bytes = size("stage_quota", o.stage_quota.clone().or(d.stage_quota))?;
        let fees = o.cancel_fees.clone().or(d.cancel_fees).unwrap_or_default();
        let cancel_fees = fees.parse().map_err(|e| {
            self.bad(
                "cancel_fees",
                format!("'{fees}': {e} (e.g. 24h:10%,1h:50%,10m:100%, or none)"),
            )
        })?;
        if o.cpus
            .is_some_and(|n| !(1..=u32::from(u16::MAX)).contains(&n))
        {
            return Err(self.bad("cpus", "must be between 1 and 65535"));
        }
        let memory_bytes = o
            .memory
            .clone()
            .map(|m| size("memory", Some(m)))
            .transpose()?;
        if memory_bytes.is_some_and(|m| m < 1 << 30) {
            return Err(self.bad("memory", "must be at least 1GiB"));
        }
        let pull_timeout = o.pull_timeout_s.or(d.pull_timeout_s).unwrap_or(1800);
        if !(1..=u64::from(u32::MAX)).contains(&pull_timeout) {
            return Err(self.bad("pull_timeout_s", "must be at least 1"));
        }
        let registries = o.pull_registries.clone().unwrap_or_default();
        let pulls = gpux_protocol::Pulls {
            max_bytes: if o.pull.or(d.pull).unwrap_or(true) {
                max_image_bytes
            } else {
                0
            },
            timeout_s: pull_timeout as u32,
            registries: gpux_protocol::BoundedVec::new(
                registries
                    .iter()
                    .map(|r| {
                        gpux_protocol::BoundedString::new(r.to_ascii_lowercase())
                            .map_err(|e| self.bad("pull_registries", format!("'{r}': {e}")))
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            )
            .map_err(|e| self.bad("pull_registries", e))?,
            cached: gpux_protocol::BoundedVec::empty(),
        };
        if pulls.max_bytes == 0 && !pulls.registries.is_empty() {
            return Err(self.bad(
                "pull_registries",
                "names registries for a host that pulls nothing (pull = false, or max_image = 0)",
            ));
        }
        pulls.check().map_err(|e| {
            self.bad(
                "pull_registries",
                format!("{e} (e.g. docker.io,ghcr.io,!evil.example)"),
            )
        })?;
        let pull_cache_bytes = size("pull_cache", o.pull_cache.clone().or(d.pull_cache))?;
        let price: MicroCredits = price
            .parse()
            .map_err(|e| self.bad("price", format!("'{price}': {e}")))?;
        if price.0 == 0 || price > gpux_protocol::MAX_PRICE_PER_GPU_HOUR {
            return Err(self.bad(
                "price",
                format!(
                    "{price} credits per GPU-hour: must be above 0 and at most {} (the protocol's bound)",
                    gpux_protocol::MAX_PRICE_PER_GPU_HOUR
                ),
            ));
        }
        let spot_floor: Option<MicroCredits> = o
            .spot_floor
            .as_ref()
            .map(|s| {
                s.parse()
                    .map_err(|e| self.bad("spot_floor", format!("'{s}': {e}")))
            })
            .transpose()?;
        if let Some(floor) = spot_floor.filter(|f| f.0 == 0 || *f > price) {
            return Err(self.bad(
                "spot_floor",
                format!("{floor}: must be above 0 and at most the price ({price})"),
            ));
        }
        let region = o.region.clone().unwrap_or_default();
        if !gpux_protocol::is_region(&region) {
            return Err(self.bad(
                "region",
                format!(
                    "'{region}': a token of 1 to 32 lower-case letters, digits and inner '-' (eu-west)"
                ),
            ));
        }
        let (min_duration_s, max_duration_s) = (
            o.min_duration_s.unwrap_or(60),
            o.max_duration_s.unwrap_or(86_400),
        );
        if min_duration_s == 0 || min_duration_s > max_duration_s {
            return Err(self.bad(
                "min_duration_s",
                format!("{min_duration_s}: must be above 0 and at most max_duration_s ({max_duration_s})"),
            ));
        }
        if max_duration_s > gpux_protocol::MAX_DURATION_S {
            return Err(self.bad(
                "max_duration_s",
                format!(
                    "{max_duration_s}: at most {} (366 days, the protocol's bound)",
                    gpux_protocol::MAX_DURATION_S
                ),
            ));
        }
        Ok(HostOptions {
            nvml_lib: o.nvml_lib.clone(),
            price,
            spot_floor,
            region,
            images,
            image_tags: Default::default(),
            min_duration_s,
            max_duration_s,
            offer_ttl_s: o.offer_ttl_s.unwrap_or(600),
            republish_s: o.republish_s.unwrap_or(120),
            fake_gpus: o.fake_gpus.unwrap_or(false),
            disk_quota_bytes,
            workspace_root: data_dir.join("workspaces"),
            max_retain_s: o.max_retain_s.or(d.max_retain_s).unwrap_or(3600),
            disk_price: disk_price
                .parse()
                .map_err(|e| self.bad("disk_price", format!("'{disk_price}': {e} (e.g. 0.01)")))?,
            max_image_bytes,
            stage_quota_bytes,
            cancel_fees,
            staging_root: data_dir.join("staging"),
            run_root: data_dir.join("run"),
            cpus: o.cpus,
            memory_bytes,
            machine: Default::default(),
            pulls,
            pull_cache_bytes,
        })
    }
}
