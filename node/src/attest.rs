//! `gpux attest`: probe the GPUs, sign what was read, and write a report; and
//! `gpux attest verify`: check such a report.
//!
//! A report is one JSON document holding both the signed envelope (base64, the exact bytes
//! that were signed) and its decoded content (UUIDs as text), so a person can read it and a
//! program can verify it:
//!
//! ```json
//! { "format": "gpux-attestation-report/1", "id": "...", "signer": "<hex>",
//!   "peer_id": "12D3KooW...", "envelope": "<base64>", "attestation": { ... },
//!   "plausibility": [ { "uuid": "GPU-...", "verdict": "plausible" } ] }
//! ```

use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use gpux_attestation::{Plausibility, Probe, ProbeError, check_gpu};
use gpux_protocol::validate::{RuleError, Rules};
use gpux_protocol::{Attestation, Keypair, Signed, Timestamp, Verified, VerifyError};

/// The report format tag.
pub const REPORT_FORMAT: &str = "gpux-attestation-report/1";

/// Why `attest` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AttestError {
    /// Probing failed (no driver, a driver error).
    #[error(transparent)]
    Probe(#[from] ProbeError),
    /// The probed facts could not be signed (a limit was exceeded).
    #[error("cannot sign the attestation: {0}")]
    Sign(#[from] gpux_protocol::SignError),
}

/// Probes through `nvml_lib` (default: the driver's library), signs with `key`.
pub fn attest(
    key: &Keypair,
    nvml_lib: Option<&Path>,
    now: Timestamp,
) -> Result<Verified<Attestation>, AttestError> {
    let probe = Probe::open(nvml_lib)?;
    let body = probe.attestation(now)?;
    Ok(Signed::sign(key, body)?)
}

fn verdict_json(p: &Plausibility, uuid: String) -> serde_json::Value {
    match p {
        Plausibility::Plausible => serde_json::json!({ "uuid": uuid, "verdict": "plausible" }),
        Plausibility::UnknownModel => {
            serde_json::json!({ "uuid": uuid, "verdict": "unknown-model" })
        }
        Plausibility::Implausible(why) => serde_json::json!({
            "uuid": uuid,
            "verdict": "implausible",
            "reasons": why.reasons,
            "looks_like": why.looks_like,
        }),
    }
}

/// The JSON report of a signed attestation.
pub fn report_json(att: &Verified<Attestation>) -> serde_json::Value {
    let plausibility: Vec<serde_json::Value> = att
        .gpus
        .iter()
        .map(|g| verdict_json(&check_gpu(g), g.uuid.to_string()))
        .collect();
    serde_json::json!({
        "format": REPORT_FORMAT,
        "id": att.id().to_string(),
        "signer": att.signer().to_string(),
        "peer_id": att.signer().peer_id().to_string(),
        "envelope": BASE64.encode(att.as_bytes()),
        "attestation": att.body(),
        "plausibility": plausibility,
    })
}

/// The report document, as parsed for verification.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ReportDoc {
    format: String,
    id: String,
    signer: String,
    peer_id: String,
    envelope: String,
    attestation: Box<serde_json::value::RawValue>,
    plausibility: serde_json::Value,
}

/// One check of `attest verify`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// Whether it passed.
    pub ok: bool,
    /// What was found.
    pub detail: String,
}

/// The outcome of verifying a report: every check, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportVerdict {
    /// The checks.
    pub checks: Vec<Check>,
}

impl ReportVerdict {
    /// True when every check passed.
    pub fn passed(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|c| c.ok)
    }

    fn push(&mut self, name: &'static str, ok: bool, detail: impl Into<String>) {
        self.checks.push(Check {
            name,
            ok,
            detail: detail.into(),
        });
    }
}

/// Verifies a report: it parses; the envelope decodes and its signature verifies strictly;
/// the decoded content in the document equals the signed one; it is fresh at `at`; every
/// GPU is plausible for its model.
pub fn verify_report(text: &str, at: Timestamp, rules: &Rules) -> ReportVerdict {
    let mut v = ReportVerdict { checks: Vec::new() };
    // A typed parse refuses unknown and duplicate keys at every level, so no part of the
    // document can say something other than what was signed.
    let doc: ReportDoc = match serde_json::from_str(text) {
        Ok(doc) => doc,
        Err(e) => {
            v.push(
                "format",
                false,
                format!("not a {REPORT_FORMAT} document: {e}"),
            );
            return v;
        }
    };
    if doc.format != REPORT_FORMAT {
        v.push(
            "format",
            false,
            format!("expected format {REPORT_FORMAT}, found {}", doc.format),
        );
        return v;
    }
    v.push("format", true, REPORT_FORMAT);
    let bytes = match BASE64.decode(&doc.envelope) {
        Ok(bytes) => bytes,
        Err(_) => {
            v.push("signature", false, "the envelope is not base64");
            return v;
        }
    };
    let verified: Result<Verified<Attestation>, VerifyError> =
        Signed::from_bytes(bytes).and_then(Signed::verify);
    let att = match verified {
        Ok(att) => {
            v.push(
                "signature",
                true,
                format!("valid, signed by {}", att.signer().peer_id()),
            );
            att
        }
        Err(e) => {
            v.push("signature", false, e.to_string());
            return v;
        }
    };
    // Everything the document shows must be what the envelope says: the decoded content
    // (typed, so duplicate keys are refused, and as JSON, so extra keys are too), the id, the
    // signer and peer id, and the plausibility verdicts.
    let expected = report_json(&att);
    let typed: Result<Attestation, _> = serde_json::from_str(doc.attestation.get());
    let as_value: Result<serde_json::Value, _> = serde_json::from_str(doc.attestation.get());
    let content_ok = matches!(&typed, Ok(t) if t == att.body())
        && matches!(&as_value, Ok(a) if *a == expected["attestation"]);
    let header_ok = doc.id == expected["id"]
        && doc.signer == expected["signer"]
        && doc.peer_id == expected["peer_id"]
        && doc.plausibility == expected["plausibility"];
    match (content_ok, header_ok) {
        (true, true) => v.push("content", true, "the document matches the signed envelope"),
        (false, _) => v.push(
            "content",
            false,
            "the decoded content differs from the signed envelope",
        ),
        (true, false) => v.push(
            "content",
            false,
            "the id, signer, peer id or plausibility shown differ from the signed envelope",
        ),
    }
    match rules.check_time(&att, at) {
        Ok(()) => v.push(
            "freshness",
            true,
            format!("created {}", format_time(att.created_at)),
        ),
        Err(e @ (RuleError::Stale { .. } | RuleError::FromTheFuture { .. })) => {
            v.push(
                "freshness",
                false,
                format!(
                    "{e} (created {}; use --at to verify an old report)",
                    format_time(att.created_at)
                ),
            );
        }
        Err(e) => v.push("freshness", false, e.to_string()),
    }
    for gpu in att.gpus.iter() {
        match check_gpu(gpu) {
            Plausibility::Plausible => v.push(
                "plausibility",
                true,
                format!("{} {}: plausible", gpu.uuid, gpu.name),
            ),
            Plausibility::UnknownModel => {
                v.push(
                    "plausibility",
                    true,
                    format!("{} {}: model not in the spec table", gpu.uuid, gpu.name),
                );
            }
            Plausibility::Implausible(why) => v.push("plausibility", false, why.to_string()),
        }
    }
    v
}

/// The first instant RFC 3339 cannot show (year 10000), unix ms.
const YEAR_10000_MS: u64 = 253_402_300_800_000;

/// A time as RFC 3339 (UTC, milliseconds); beyond year 9999, as raw milliseconds.
pub fn format_time(t: Timestamp) -> String {
    if t.0 >= YEAR_10000_MS {
        return format!("{} ms after 1970", t.0);
    }
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(t.0);
    humantime::format_rfc3339_millis(time).to_string()
}

/// Parses a time given on the command line: RFC 3339 (`2026-11-30T12:00:00Z`) or unix
/// milliseconds.
pub fn parse_time(text: &str) -> Result<Timestamp, String> {
    if let Ok(ms) = text.parse::<u64>() {
        // A bare date like 20261130 is not milliseconds; real ones have 12 or more digits.
        if ms < 100_000_000_000 {
            return Err(format!(
                "invalid time '{text}': unix milliseconds have 12 or more digits; or use RFC 3339 (2026-11-30T12:00:00Z)"
            ));
        }
        return Ok(Timestamp(ms));
    }
    let time = humantime::parse_rfc3339_weak(text).map_err(|e| {
        format!(
            "invalid time '{text}': {e}; use RFC 3339 (2026-11-30T12:00:00Z) or unix milliseconds"
        )
    })?;
    let ms = time
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| format!("invalid time '{text}': before 1970"))?
        .as_millis();
    u64::try_from(ms)
        .map(Timestamp)
        .map_err(|_| format!("invalid time '{text}': too far in the future"))
}

/// The current time.
pub fn now() -> Timestamp {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    Timestamp(u64::try_from(ms).unwrap_or(u64::MAX))
}
