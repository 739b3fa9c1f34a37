//! Room in the kernel's ARP table for a large isolated run.
//!
//! The IPv4 neighbour table is one table for every network namespace, and its hard limit,
//! `net.ipv4.neigh.default.gc_thresh3` (1024 by default), counts the entries of all of them.
//! Every namespace of a run keeps an entry for each peer it talks to, so a run of n nodes
//! needs about n² entries: at 40 nodes the kernel logs `neighbor table overflow` and the
//! namespaces that came last cannot resolve anyone (their dials hang in `SYN-SENT`). A run
//! that needs more raises the limits for its duration and puts them back at its end, unless
//! something else changed them meanwhile (then it leaves them as they are).

use anyhow::Context;

/// Where the kernel keeps the three thresholds (`gc_thresh1..3`).
const DIR: &str = "/proc/sys/net/ipv4/neigh/default";

/// Entries left for the machine's own use (Docker, the host's network) besides the run's.
const HEADROOM: u64 = 1024;

/// Limits a run raised, to put back.
#[derive(Debug)]
pub(crate) struct Raised {
    previous: [u64; 3],
    set: [u64; 3],
}

fn path(i: usize) -> String {
    format!("{DIR}/gc_thresh{}", i + 1)
}

fn read() -> anyhow::Result<[u64; 3]> {
    let mut out = [0u64; 3];
    for (i, v) in out.iter_mut().enumerate() {
        let text =
            std::fs::read_to_string(path(i)).with_context(|| format!("reading {}", path(i)))?;
        *v = text
            .trim()
            .parse()
            .with_context(|| format!("{}: {text:?} is not a number", path(i)))?;
    }
    Ok(out)
}

fn write(values: [u64; 3]) -> anyhow::Result<()> {
    // The kernel wants thresh1 <= thresh2 <= thresh3 at all times: raise the top first.
    for i in (0..3).rev() {
        std::fs::write(path(i), values[i].to_string())
            .with_context(|| format!("writing {}", path(i)))?;
    }
    Ok(())
}

/// The limits a run of `namespaces` needs: the soft limit (`gc_thresh2`, over which the
/// kernel collects stale entries after 5 s) at the run's n² entries plus headroom, the hard
/// one at twice that.
pub(crate) fn needed(namespaces: usize) -> [u64; 2] {
    let n = namespaces as u64;
    let soft = n * (n + 2) + HEADROOM;
    [soft, 2 * soft]
}

/// Raises the limits when a run of `namespaces` needs more than they allow; `None` when
/// they are enough already.
pub(crate) fn make_room(namespaces: usize) -> anyhow::Result<Option<Raised>> {
    let previous = read()?;
    let [soft, hard] = needed(namespaces);
    if previous[2] >= hard {
        return Ok(None);
    }
    let set = [previous[0], previous[1].max(soft), hard];
    write(set)?;
    Ok(Some(Raised { previous, set }))
}

impl Raised {
    /// What changed, for the run's progress.
    pub(crate) fn describe(&self) -> String {
        format!(
            "the kernel's ARP table (one for every namespace) raised from {} to {} entries for the run",
            self.previous[2], self.set[2]
        )
    }

    /// Puts the previous limits back, if they are still the ones this run set.
    pub(crate) fn restore(&self) -> anyhow::Result<()> {
        if read()? != self.set {
            return Ok(());
        }
        // Lowering: the bottom first, so thresh1 <= thresh2 <= thresh3 holds throughout.
        for i in 0..3 {
            std::fs::write(path(i), self.previous[i].to_string())
                .with_context(|| format!("writing {}", path(i)))?;
        }
        Ok(())
    }
}
