//! Evaluating query clauses against book entries (and, for pruning, against buckets).

use gpux_protocol::GpuFamily;

use super::{Bucket, Entry, Interner, OrderBook};
use crate::query::{Clause, CompareOp, Field, Value};

/// The facts of an entry at the moment of a query.
pub(crate) struct Facts<'a> {
    pub(crate) entry: &'a Entry,
    pub(crate) free: u64,
    pub(crate) reliability: u64,
    pub(crate) region: &'a str,
    /// The book's cached image names.
    pub(crate) images: &'a Interner,
}

fn compare(op: CompareOp, actual: u64, wanted: u64) -> bool {
    match op {
        CompareOp::Eq | CompareOp::In => actual == wanted,
        CompareOp::Ne | CompareOp::NotIn => actual != wanted,
        CompareOp::Lt => actual < wanted,
        CompareOp::Le => actual <= wanted,
        CompareOp::Gt => actual > wanted,
        CompareOp::Ge => actual >= wanted,
    }
}

/// `region=eu` matches `eu` and `eu-*`.
pub(crate) fn region_matches(actual: &str, wanted: &str) -> bool {
    actual == wanted
        || (actual.starts_with(wanted) && actual.as_bytes().get(wanted.len()) == Some(&b'-'))
}

/// Whether a clause holds, given a per-value test: `=` and `in` need one value to hold,
/// `!=` and `notin` need none to.
fn holds(clause: &Clause, mut test: impl FnMut(&Value) -> bool) -> bool {
    match clause.op {
        CompareOp::Ne | CompareOp::NotIn => !clause.values.iter().any(&mut test),
        CompareOp::Eq | CompareOp::In => clause.values.iter().any(&mut test),
        _ => clause.values.iter().all(test),
    }
}

fn number(clause: &Clause, actual: u64) -> bool {
    let op = match clause.op {
        // `!=`/`notin` are handled by `holds` negating equality.
        CompareOp::Ne | CompareOp::NotIn => CompareOp::Eq,
        op => op,
    };
    holds(
        clause,
        |v| matches!(v, Value::Number(n) if compare(op, actual, *n)),
    )
}

/// Whether `clause` holds for the entry.
pub(crate) fn clause_holds(clause: &Clause, f: &Facts<'_>) -> bool {
    let e = f.entry;
    match clause.field {
        Field::Gpu => holds(
            clause,
            |v| matches!(v, Value::Family(fam) if *fam == e.family),
        ),
        Field::Vram => number(clause, u64::from(e.vram_gb)),
        Field::Count => number(clause, f.free),
        Field::Price => number(clause, e.price),
        Field::Cc => number(clause, u64::from(e.cc)),
        Field::PcieGen => number(clause, u64::from(e.pcie_gen)),
        Field::Reliability => number(clause, f.reliability),
        Field::Tier => number(clause, u64::from(e.tier)),
        Field::Driver => number(clause, e.driver),
        Field::Cuda => number(clause, e.cuda),
        Field::Region => holds(
            clause,
            |v| matches!(v, Value::Region(r) if region_matches(f.region, r)),
        ),
        Field::Spot => holds(
            clause,
            |v| matches!(v, Value::Bool(b) if *b == e.spot_floor.is_some()),
        ),
        Field::Mig => holds(
            clause,
            |v| matches!(v, Value::Bool(b) if *b == e.mig_profile.is_some()),
        ),
        Field::Host => holds(clause, |v| matches!(v, Value::Host(h) if *h == e.host_key)),
        Field::Image => holds(clause, |v| match v {
            Value::Image(d) => e.images.contains(d),
            Value::ImageTag(p) => {
                e.tags.iter().any(|(_, t)| crate::query::tag_matches(p, t))
                    || e.cached
                        .iter()
                        .any(|&i| crate::query::tag_matches(p, f.images.name(i)))
            }
            _ => false,
        }),
        Field::Disk => number(clause, e.disk_bytes / 1_000_000_000),
        Field::DiskPrice => number(clause, e.disk_price),
        Field::Stage => number(clause, e.stage_bytes / 1_000_000_000),
        Field::Pull => number(clause, e.pull_bytes / 1_000_000_000),
        Field::Cpu => number(clause, u64::from(e.share.cpu_millis)),
        Field::Ram => number(clause, e.share.memory_bytes / 1_000_000_000),
        Field::DiskSpeed => number(clause, u64::from(e.disk_write_mbps)),
        Field::InetUp => number(clause, u64::from(e.net_up_mbps)),
        Field::InetDown => number(clause, u64::from(e.net_down_mbps)),
    }
}

/// Whether an entry could pass `clause` judging only by its bucket (family, vram, region,
/// tier); other fields cannot rule a bucket out.
pub(crate) fn bucket_may_pass(clause: &Clause, bucket: &Bucket, regions: &Interner) -> bool {
    let k = &bucket.key;
    match clause.field {
        Field::Gpu => holds(
            clause,
            |v| matches!(v, Value::Family(fam) if *fam == k.family),
        ),
        Field::Vram => number(clause, u64::from(k.vram_gb)),
        Field::Tier => number(clause, u64::from(k.tier)),
        Field::Region => {
            let region = regions.name(k.region);
            holds(
                clause,
                |v| matches!(v, Value::Region(r) if region_matches(region, r)),
            )
        }
        _ => true,
    }
}

/// The families a query allows, when a `gpu=`/`gpu in` clause narrows them.
pub(crate) fn allowed_families(clauses: &[Clause]) -> Option<Vec<GpuFamily>> {
    let mut allowed: Option<Vec<GpuFamily>> = None;
    for c in clauses
        .iter()
        .filter(|c| c.field == Field::Gpu && matches!(c.op, CompareOp::Eq | CompareOp::In))
    {
        let these: Vec<GpuFamily> = c
            .values
            .iter()
            .filter_map(|v| {
                if let Value::Family(f) = v {
                    Some(*f)
                } else {
                    None
                }
            })
            .collect();
        allowed = Some(match allowed {
            None => these,
            Some(prev) => prev.into_iter().filter(|f| these.contains(f)).collect(),
        });
    }
    // `gpu in [h100,H100]` names one family once: each bucket must be merged once.
    allowed.map(|mut families| {
        families.sort_unstable();
        families.dedup();
        families
    })
}

/// The inclusive price range the clauses allow (micro-credits).
pub(crate) fn price_bounds(clauses: &[Clause]) -> (u64, u64) {
    let (mut lo, mut hi) = (0u64, u64::MAX);
    for c in clauses.iter().filter(|c| c.field == Field::Price) {
        for v in &c.values {
            let Value::Number(n) = *v else { continue };
            match c.op {
                CompareOp::Lt => hi = hi.min(n.saturating_sub(1)),
                CompareOp::Le => hi = hi.min(n),
                CompareOp::Gt => lo = lo.max(n.saturating_add(1)),
                CompareOp::Ge => lo = lo.max(n),
                CompareOp::Eq if c.values.len() == 1 => {
                    lo = lo.max(n);
                    hi = hi.min(n);
                }
                _ => {}
            }
        }
    }
    (lo, hi)
}

impl Facts<'_> {
    pub(crate) fn new<'a>(book: &'a OrderBook, entry: &'a Entry, now: u64) -> Facts<'a> {
        Facts {
            entry,
            free: u64::from(book.free_at(entry, now)),
            reliability: u64::from(book.hosts.reliability(entry.host)),
            region: book.regions.name(entry.region),
            images: &book.images,
        }
    }
}
