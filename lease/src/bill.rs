//! Billing: what a span of work costs under a lease's terms.
//!
//! Per second, rounded down (in the renter's favour), with a minimum of
//! [`MIN_BILLED_SECONDS`](gpux_protocol::money::MIN_BILLED_SECONDS), never past the agreed
//! duration, at the agreed price. Spot leases have no minimum: the host may end them at any
//! time with a notice, and a minimum would let preemption farm minimums. Who ended a lease
//! pays for its end: the minimum is owed only once the renter's side ended it (its stop, its
//! workload's exit, the end of the time it asked for, its silence); a lease the host ends
//! (its shutdown, a failed container or GPU) pays the seconds that ran. So receipts sent
//! while a lease runs bill its runtime, and only the final receipt adds the minimum
//! (cumulative amounts never go down). Amounts are recomputed from cumulative GPU-seconds,
//! so rounding never accumulates. A workspace kept after the workload adds a fixed sum, its
//! size for the agreed retention at the agreed price per GiB-hour, owed from the first
//! receipt on (the host sets the disk aside from the acceptance).

use gpux_protocol::{LeaseKind, LeaseRequest, MicroCredits, Timestamp, money};

/// Billed GPU-seconds for `runtime_ms` of work on `gpus` GPUs under a lease of
/// `duration_s` seconds.
pub fn gpu_seconds(gpus: u64, duration_s: u32, runtime_ms: u64) -> u64 {
    let secs = money::billed_seconds((runtime_ms / 1000).min(u64::from(duration_s)));
    gpus.saturating_mul(secs)
}

/// Billed GPU-seconds for `runtime_ms` of work under `request`, the seconds that ran and
/// nothing more: never past the agreed duration, no minimum.
pub fn run_gpu_seconds(request: &LeaseRequest, runtime_ms: u64) -> u64 {
    let secs = (runtime_ms / 1000).min(u64::from(request.duration_s));
    (request.gpus.len() as u64).saturating_mul(secs)
}

/// Billed GPU-seconds for `runtime_ms` of work under `request` once its renter's side ended
/// it: with the minimum (for a spot lease, without it).
pub fn request_gpu_seconds(request: &LeaseRequest, runtime_ms: u64) -> u64 {
    if matches!(request.kind, LeaseKind::Spot) {
        return run_gpu_seconds(request, runtime_ms);
    }
    gpu_seconds(request.gpus.len() as u64, request.duration_s, runtime_ms)
}

/// The most GPU-seconds `whole_s` seconds of work can bill under `request`: the
/// minimum applies, except to spot leases.
pub fn most_gpu_seconds(request: &LeaseRequest, whole_s: u64) -> u64 {
    request_gpu_seconds(request, whole_s.saturating_mul(1000))
}

/// A reserved window's committed minimum in GPU-seconds (zero without one): billed at the
/// least once the renter stopped the window early.
pub fn committed_gpu_seconds(request: &LeaseRequest) -> u64 {
    let secs = request
        .committed_s()
        .unwrap_or(0)
        .min(u64::from(request.duration_s));
    (request.gpus.len() as u64).saturating_mul(secs)
}

/// What cancelling a reserved window at `at`, before its start, bills in GPU-seconds: the
/// share of its committed minimum its fee schedule sets for that lead (zero without a
/// schedule or a committed minimum, for any other kind of lease, and from the start on: a
/// window its host has not started by then owes nothing).
pub fn cancel_gpu_seconds(request: &LeaseRequest, at: Timestamp) -> u64 {
    let LeaseKind::Reserved { start, .. } = request.kind else {
        return 0;
    };
    if at >= start {
        return 0;
    }
    let fees = request.cancel_fees().unwrap_or_default();
    fees.fee_gpu_seconds(committed_gpu_seconds(request), start.ms_since(at))
}

/// The workspace's retention, a fixed sum of the terms (zero without a priced workspace;
/// a verified request's terms always parse).
pub fn retention(request: &LeaseRequest) -> MicroCredits {
    request.retention_charge().unwrap_or(MicroCredits::ZERO)
}

/// What is due once `gpu_seconds` are billed: their cost at the request's price, plus the
/// workspace's [`retention`] (saturating: an amount that overflows is refused by every
/// check downstream).
pub fn amount(request: &LeaseRequest, gpu_seconds: u64) -> MicroCredits {
    money::cost(gpu_seconds, request.price_per_gpu_hour)
        .and_then(|gpus| gpus.checked_add(retention(request)))
        .unwrap_or(MicroCredits(u64::MAX))
}

/// What the whole agreed duration costs.
pub fn full_amount(request: &LeaseRequest) -> MicroCredits {
    amount(request, request_gpu_seconds(request, u64::MAX))
}
