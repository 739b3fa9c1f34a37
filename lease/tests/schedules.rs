//! Running a workflow machine's simulator over many seeds (`rent.rs`, `resume.rs`,
//! `stage.rs`): each schedule either keeps the rule or fails with why and its trace.

/// A schedule that broke the rule: its seed, why, its trace.
pub(crate) type Failure = (u64, String, Vec<String>);

/// Runs `run` for every seed, counting into one `C`.
pub(crate) fn run_all<C: Default>(
    seeds: std::ops::Range<u64>,
    run: impl Fn(u64, &mut C) -> Result<(), (String, Vec<String>)>,
) -> (Vec<Failure>, C) {
    let mut counts = C::default();
    let mut failures = Vec::new();
    for seed in seeds {
        if let Err((why, trace)) = run(seed, &mut counts) {
            failures.push((seed, why, trace));
        }
    }
    (failures, counts)
}

/// Prints what `n` schedules of `what` counted and fails with the first broken one's trace.
pub(crate) fn none_failed<C: std::fmt::Debug>(
    what: &str,
    n: u64,
    failures: &[Failure],
    counts: &C,
) {
    println!(
        "{what} simulator: {n} schedules: {counts:?}; {} failed",
        failures.len()
    );
    if let Some((seed, why, trace)) = failures.first() {
        for line in trace {
            println!("  {line}");
        }
        panic!(
            "{what} schedule {seed} broke the rule: {why} ({} failed)",
            failures.len()
        );
    }
}
