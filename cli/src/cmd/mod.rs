//! One module per group of commands; each only calls the libraries (mostly the node's API)
//! and prints.

pub(crate) mod console;
mod docker_login;
pub(crate) mod earnings;
pub(crate) mod estimate;
pub(crate) mod hosting;
mod jupyter;
pub(crate) mod lease;
pub(crate) mod market;
pub(crate) mod plane;
pub(crate) mod rent;
pub(crate) mod ssh;

pub(crate) use gpux_client::out;
pub(crate) use gpux_client::print::print_json;

/// `--env NAME=VALUE` options as a map.
pub(crate) fn parse_env(
    pairs: &[String],
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    use anyhow::Context;
    pairs
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .with_context(|| format!("--env {kv}: expected NAME=VALUE"))
        })
        .collect()
}

/// Runs `f`, a wait on the node, under a spinner with the time so far on standard error
/// (drawn only on a terminal: nothing when standard error is piped or redirected).
pub(crate) fn waiting<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    bar.set_message(what.to_string());
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let out = f();
    bar.finish_and_clear();
    out
}

/// A lease length on the command line: seconds, or a duration like `30m` or `2h`; more than
/// zero.
pub(crate) fn parse_duration(text: &str) -> Result<u32, String> {
    gpux_api::text::duration_s(text)
}

/// An amount of credits on the command line: more than zero.
pub(crate) fn parse_credits(text: &str) -> Result<String, String> {
    let amount = text
        .parse::<gpux_protocol::MicroCredits>()
        .map_err(|e| e.to_string())?;
    if amount.0 == 0 {
        return Err("must be more than zero".into());
    }
    Ok(text.to_string())
}

/// A unix time in milliseconds as UTC (RFC 3339, to the second).
pub(crate) fn utc_time(ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(at).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_durations_and_amounts_are_invalid_values() {
        assert_eq!(parse_duration("90"), Ok(90));
        assert_eq!(parse_duration("2m"), Ok(120));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("soon").is_err());
        assert!(parse_credits("0").is_err());
        assert!(parse_credits("0.000000").is_err());
        assert_eq!(parse_credits("1.5"), Ok("1.5".into()));
    }
}
