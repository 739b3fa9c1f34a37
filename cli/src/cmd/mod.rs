//! One module per group of commands; each only calls the libraries (mostly the node's API)
//! and prints.

pub(crate) mod attest;
pub(crate) mod console;
mod docker_login;
pub(crate) mod earnings;
pub(crate) mod estimate;
pub(crate) mod host;
pub(crate) mod host_measure;
pub(crate) mod hosting;
pub(crate) mod install;
mod jupyter;
pub(crate) mod lease;
pub(crate) mod market;
pub(crate) mod node;
pub(crate) mod plane;
pub(crate) mod rent;
pub(crate) mod ssh;
pub(crate) mod testnet;

use std::io::Write;

/// Writes a line to standard output, returning the I/O error instead of panicking (a
/// closed pipe, a full disk): `main` turns a closed pipe into a quiet exit.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}
pub(crate) use out;

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

/// Prints a value as pretty JSON.
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

pub(crate) fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.write_all(b"\n")?;
    Ok(())
}

/// A lease length on the command line: seconds, or a duration like `30m` or `2h`; more than
/// zero.
pub(crate) fn parse_duration(text: &str) -> Result<u32, String> {
    gpux_api::text::duration_s(text)
}

/// A short time on the command line (`50ms`, `0.2s`, or plain milliseconds), in ms, at
/// most 10 s.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    let ms = match text.parse::<u64>() {
        Ok(ms) => ms,
        Err(_) => humantime::parse_duration(text)
            .map_err(|_| format!("'{text}': use a time like 50ms or 0.2s"))?
            .as_millis() as u64,
    };
    if ms > 10_000 {
        return Err(format!("'{text}': at most 10s"));
    }
    Ok(ms)
}

/// A partition scenario on the command line (`all`: every one).
pub(crate) fn parse_partition(
    text: &str,
) -> Result<Vec<gpux_testnet::partitions::Scenario>, String> {
    match text.trim() {
        "all" => Ok(gpux_testnet::partitions::Scenario::ALL.to_vec()),
        one => Ok(vec![one.parse()?]),
    }
}

/// A percentage on the command line (`1%` or `1`), from 0 to 100.
pub(crate) fn parse_percent(text: &str) -> Result<f64, String> {
    let pct: f64 = text
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("'{text}': use a percentage like 1% or 0.5"))?;
    if !(0.0..=100.0).contains(&pct) {
        return Err(format!("'{text}': a percentage from 0 to 100"));
    }
    Ok(pct)
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
