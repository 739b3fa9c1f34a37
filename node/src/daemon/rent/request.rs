//! A rent request from the API, checked and turned into what the rent needs: the bid to
//! match, the image to run, and the workload with its signed terms.

use gpux_api::{ApiError, RentRequest};
use gpux_market::BidSpec;
use gpux_market::query::Query;
use gpux_protocol::{BoundedString, EnvVar, ImageDigest, LeaseKind, LeaseTerms, MicroCredits};

use super::{ImageChoice, Workload};

fn bad(what: &str) -> impl Fn(String) -> ApiError + '_ {
    move |e| ApiError::bad_input(format!("{what}: {e}"))
}

/// The most directories a resume carries by name.
const MAX_CARRIED: usize = 16;

/// What a resume of `request` moves: its `--carry` directories under `/workspace` (checked:
/// no `..`, no empty parts, none inside another), or `[""]`, the whole workspace.
pub(crate) fn carried(request: &RentRequest) -> Result<Vec<String>, ApiError> {
    if request.carry.len() > MAX_CARRIED {
        return Err(bad("--carry")(format!(
            "{} directories: at most {MAX_CARRIED}",
            request.carry.len()
        )));
    }
    let mut dirs: Vec<String> = Vec::new();
    for given in &request.carry {
        let dir = given
            .strip_prefix("/workspace/")
            .unwrap_or(given)
            .trim_end_matches('/');
        if dir.is_empty()
            || dir.starts_with('/')
            || dir
                .split('/')
                .any(|p| p.is_empty() || p == "." || p == "..")
        {
            return Err(bad("--carry")(format!(
                "'{given}' is not a directory under /workspace"
            )));
        }
        let inside = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}/"));
        if let Some(other) = dirs.iter().find(|d| inside(dir, d) || inside(d, dir)) {
            return Err(bad("--carry")(format!(
                "'{dir}' and '{other}' overlap: name each directory once"
            )));
        }
        dirs.push(dir.to_string());
    }
    if dirs.is_empty() {
        dirs.push(String::new());
    }
    Ok(dirs)
}

/// Checks and converts a rent request.
pub(crate) fn parse(request: &RentRequest) -> Result<(BidSpec, ImageChoice, Workload), ApiError> {
    if request.gpus == 0 {
        return Err(ApiError::bad_input("--gpus must be at least 1"));
    }
    if request.spread || request.best_effort {
        return Err(bad("--spread")(
            "a group order is placed by POST /v1/groups, not /v1/rent".into(),
        ));
    }
    if request.duration_s == 0 {
        return Err(ApiError::bad_input("--duration must be at least 1 s"));
    }
    // A workspace narrows the market to hosts that say they can give one that large now.
    let mut text = match request.disk_bytes {
        Some(bytes) => format!("{} disk>={}", request.query, bytes.div_ceil(1_000_000_000)),
        None => request.query.clone(),
    };
    // CPU and memory asked for narrow the market to hosts whose share is that large.
    if let Some(millis) = request.cpu_millis {
        if millis == 0 {
            return Err(ApiError::bad_input("--cpus must be more than 0"));
        }
        let per_gpu = millis.div_ceil(u32::from(request.gpus));
        text.push_str(&format!(" cpu>={}.{:03}", per_gpu / 1000, per_gpu % 1000));
    }
    if let Some(bytes) = request.memory_bytes {
        if bytes < MIN_MEMORY_BYTES {
            return Err(ApiError::bad_input(format!(
                "--memory must be at least {} MiB",
                MIN_MEMORY_BYTES >> 20
            )));
        }
        text.push_str(&format!(
            " ram>={}",
            bytes / u64::from(request.gpus) / 1_000_000_000
        ));
    }
    if let Some(shm) = request.shm_bytes
        && let Some(memory) = request.memory_bytes
        && shm > memory
    {
        return Err(ApiError::bad_input(
            "--shm is part of the lease's memory: at most --memory",
        ));
    }
    let image = match (&request.image, &request.image_archive) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_input(
                "give --image or --image-archive, not both",
            ));
        }
        (None, Some(path)) => ImageChoice::Archive(path.into()),
        (Some(reference), None) => match reference.parse::<ImageDigest>() {
            // Only hosts that list it.
            Ok(digest) => {
                text.push_str(&format!(" image={digest}"));
                ImageChoice::Host(digest)
            }
            Err(_) if reference.starts_with("sha256:") => {
                return Err(bad("--image")(format!(
                    "'{reference}' is not an image digest (sha256:<64 hex digits>)"
                )));
            }
            Err(_) => ImageChoice::Local(reference.clone()),
        },
        (None, None) => ImageChoice::Any,
    };
    if request.cache_image && !matches!(image, ImageChoice::Local(_) | ImageChoice::Archive(_)) {
        return Err(bad("--cache-image")(
            "keeps a staged image: give --image NAME or --image-archive FILE".into(),
        ));
    }
    let query = Query::parse(&text).map_err(|e| bad("query")(e.to_string()))?;
    let max_price = request
        .max_price
        .parse::<MicroCredits>()
        .map_err(|e| bad("--max-price")(e.to_string()))?;
    let env = request
        .env
        .iter()
        .map(|(name, value)| {
            Ok(EnvVar {
                name: BoundedString::new(name.clone()).map_err(|e| bad(name)(e.to_string()))?,
                value: BoundedString::new(value.clone()).map_err(|e| bad(name)(e.to_string()))?,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let command = request
        .command
        .iter()
        .map(|a| BoundedString::new(a.clone()).map_err(|e| bad("command")(e.to_string())))
        .collect::<Result<Vec<_>, ApiError>>()?;
    let (kind, duration_s) = match (request.spot, request.window) {
        (true, Some(_)) => {
            return Err(bad("--spot")(
                "a spot lease has no reserved window: give --spot or --start/--end".into(),
            ));
        }
        (true, None) => (LeaseKind::Spot, request.duration_s),
        (false, None) => (LeaseKind::OnDemand, request.duration_s),
        (false, Some((start, end))) => {
            let whole = end > start && (end - start) % 1000 == 0;
            let duration_s = u32::try_from((end - start) / 1000).ok().filter(|_| whole);
            let Some(duration_s) = duration_s else {
                return Err(bad("--end")(
                    "a reserved window ends a whole number of seconds after it starts".into(),
                ));
            };
            let kind = LeaseKind::Reserved {
                start: gpux_protocol::Timestamp(start),
                end: gpux_protocol::Timestamp(end),
            };
            (kind, duration_s)
        }
    };
    let spec = BidSpec {
        query,
        gpus: request.gpus,
        max_price,
        duration_s,
        kind,
        allow_spread: false,
    };
    let mut terms = LeaseTerms::default();
    if let Some(bytes) = request.disk_bytes {
        if bytes < crate::executor::MIN_WORKSPACE_BYTES {
            return Err(bad("--disk")(format!(
                "a workspace has at least {} MiB",
                crate::executor::MIN_WORKSPACE_BYTES >> 20
            )));
        }
        terms.workspace_bytes = Some(bytes);
    }
    if let Some(retain) = request.retain_s {
        if request.disk_bytes.is_none() {
            return Err(bad("--retain")("keeps a workspace: give --disk too".into()));
        }
        terms.retain_s = Some(retain);
    }
    // A challenge runs on a held lease: held a minute unless the renter asked longer.
    let hold = match (request.hold_s, request.challenge) {
        (None, true) => Some(60),
        (hold, _) => hold,
    };
    if let Some(hold) = hold {
        let max_s = gpux_protocol::MAX_COMMIT_WAIT_MS / 1000;
        if hold == 0 || hold > max_s {
            return Err(bad("--hold")(format!(
                "a lease holds its GPUs for 1 to {max_s} s before its commit"
            )));
        }
        terms.commit_wait_ms = Some(hold * 1000);
    }
    if request.resume {
        if !request.spot {
            return Err(bad("--resume")(
                "resumes a spot lease after a preemption: give --spot too".into(),
            ));
        }
        if request.disk_bytes.is_none() {
            return Err(bad("--resume")(
                "moves the workspace: give --disk too".into(),
            ));
        }
    } else if !request.carry.is_empty() || request.resume_timeout_s.is_some() {
        return Err(bad("--carry")(
            "says how a lease resumes: give --resume too".into(),
        ));
    }
    carried(request)?;
    if let Some(committed) = request.committed_s {
        if request.window.is_none() {
            return Err(bad("--committed")(
                "is a reserved window's minimum: give --start and --end too".into(),
            ));
        }
        if committed > u64::from(duration_s) {
            return Err(bad("--committed")(format!(
                "{committed} s is longer than the window ({duration_s} s)"
            )));
        }
        terms.committed_s = committed;
    }
    if let Some(group) = &request.group {
        let id = gpux_protocol::unhex(group)
            .ok()
            .and_then(|b| <[u8; 16]>::try_from(b).ok())
            .ok_or_else(|| bad("group")(format!("'{group}' is not 32 hex digits")))?;
        terms.group = Some(id);
    }
    if request.cache_image {
        terms.cache_image = true;
    }
    if request.ssh_keys.len() > gpux_protocol::MAX_SSH_KEYS {
        return Err(bad("--ssh")(format!(
            "a lease takes at most {} keys",
            gpux_protocol::MAX_SSH_KEYS
        )));
    }
    let ssh_keys = request
        .ssh_keys
        .iter()
        .map(|k| {
            let k = k.trim();
            if !gpux_protocol::is_ssh_public_key(k) {
                return Err(bad("--ssh")(format!(
                    "'{}' is not an OpenSSH public key (TYPE BASE64 [COMMENT], as in ~/.ssh/id_ed25519.pub)",
                    k.chars().take(40).collect::<String>()
                )));
            }
            BoundedString::new(k).map_err(|e| bad("--ssh")(e.to_string()))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let workload = Workload {
        command,
        ssh_keys,
        env,
        network: request.network,
        terms,
        challenge: request.challenge,
        challenge_every: match request.challenge_every_s {
            Some(0) => return Err(bad("--challenge-every")("must be more than 0 s".into())),
            every => every.map(std::time::Duration::from_secs),
        },
        own_hold: request.hold_s.is_some(),
        resources: Resources {
            cpu_millis: request.cpu_millis,
            memory_bytes: request.memory_bytes,
            shm_bytes: request.shm_bytes,
        },
    };
    Ok((spec, image, workload))
}

/// The least memory a lease may ask for.
const MIN_MEMORY_BYTES: u64 = 64 << 20;

/// What a renter asked of CPU, memory and `/dev/shm` (each `None`: the default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Resources {
    pub(crate) cpu_millis: Option<u32>,
    pub(crate) memory_bytes: Option<u64>,
    pub(crate) shm_bytes: Option<u64>,
}

impl Resources {
    /// The limits of a lease of `gpus` GPUs on an offer whose share per GPU is `share`: what
    /// was asked, else the GPUs' whole share; an error when more was asked than the share.
    pub(crate) fn limits(
        &self,
        share: gpux_protocol::Share,
        gpus: usize,
    ) -> Result<gpux_protocol::ResourceLimits, String> {
        let all = share.times(gpus);
        let cpu = self.cpu_millis.unwrap_or(all.cpu_millis);
        let memory = self.memory_bytes.unwrap_or(all.memory_bytes);
        if cpu > all.cpu_millis || memory > all.memory_bytes {
            return Err(format!(
                "its share for {gpus} GPU(s) is {:.1} CPUs and {}, less than asked",
                f64::from(all.cpu_millis) / 1000.0,
                bytesize::ByteSize(all.memory_bytes).display().iec()
            ));
        }
        let mut limits = gpux_protocol::ResourceLimits::sized(cpu, memory);
        if let Some(shm) = self.shm_bytes {
            if shm > memory {
                return Err(format!(
                    "--shm {} is more than the lease's memory",
                    bytesize::ByteSize(shm).display().iec()
                ));
            }
            limits.shm_bytes = shm;
        }
        Ok(limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spot(disk: Option<u64>) -> RentRequest {
        RentRequest {
            query: "gpu=l4".into(),
            gpus: 1,
            max_price: "1".into(),
            duration_s: 60,
            spot: true,
            disk_bytes: disk,
            resume: true,
            ..RentRequest::default()
        }
    }

    fn refusal(request: &RentRequest) -> String {
        parse(request).expect_err("refused").message
    }

    #[test]
    fn a_resume_needs_a_spot_lease_with_a_workspace_and_carries_directories_inside_it() {
        let ok = spot(Some(64 << 20));
        assert!(parse(&ok).is_ok());
        assert!(refusal(&spot(None)).contains("--disk"));
        let on_demand = RentRequest {
            spot: false,
            ..ok.clone()
        };
        assert!(refusal(&on_demand).contains("--spot"));
        // Nothing named: the whole workspace moves.
        assert_eq!(carried(&ok).unwrap(), [""]);
        for (dir, fine) in [
            ("/workspace/ckpt/", Some("ckpt")),
            ("runs/a", Some("runs/a")),
            ("../etc", None),
            ("/etc", None),
            ("a//b", None),
            ("", None),
        ] {
            let request = RentRequest {
                carry: vec![dir.into()],
                ..ok.clone()
            };
            match fine {
                Some(want) => assert_eq!(carried(&request).unwrap(), [want]),
                None => assert!(refusal(&request).contains("--carry"), "{dir}"),
            }
        }
        let two = |a: &str, b: &str| RentRequest {
            carry: vec![a.into(), b.into()],
            ..ok.clone()
        };
        assert_eq!(carried(&two("data", "ckpt")).unwrap(), ["data", "ckpt"]);
        assert!(refusal(&two("data", "data/set")).contains("overlap"));
        assert!(refusal(&two("data/set/", "/workspace/data")).contains("overlap"));
        let stray = RentRequest {
            resume: false,
            carry: vec!["ckpt".into()],
            ..ok
        };
        assert!(refusal(&stray).contains("--resume"));
    }

    #[test]
    fn a_hold_is_a_signed_term_of_one_second_to_five_minutes() {
        let held = |s| RentRequest {
            resume: false,
            hold_s: Some(s),
            ..spot(None)
        };
        let (_, _, workload) = parse(&held(120)).unwrap();
        assert_eq!(workload.terms.commit_wait_ms, Some(120_000));
        assert!(refusal(&held(0)).contains("--hold"));
        assert!(refusal(&held(301)).contains("--hold"));
    }

    #[test]
    fn a_committed_minimum_is_a_reserved_windows_term_within_the_window() {
        let window = |committed| RentRequest {
            window: Some((1_000_000, 1_600_000)),
            committed_s: Some(committed),
            ..spot(None)
        };
        let reserved = |committed| RentRequest {
            spot: false,
            resume: false,
            ..window(committed)
        };
        let (_, _, workload) = parse(&reserved(300)).unwrap();
        assert_eq!(workload.terms.committed_s, 300);
        assert!(refusal(&reserved(601)).contains("longer than the window"));
        let on_demand = RentRequest {
            window: None,
            ..reserved(300)
        };
        assert!(refusal(&on_demand).contains("--start"));
    }
}
