//! Turns at a host's costly services (staging an image, pulling one): a few at once for
//! everyone, one at a time per renter, and a burst of starts per renter, then one a minute.
//! A renter that makes identities still waits for the shared turns.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use gpux_protocol::PublicKey;
use gpux_protocol::plane_wire::PlaneRefusal;
use tokio::sync::Semaphore;

use crate::attest::now;
use crate::budget::Bucket;

/// Starts a renter may make in a burst (then one a minute).
pub(crate) const STARTS_BURST: f64 = 10.0;
/// Renters remembered with nothing under way, at most (then only those busy are kept).
const REMEMBERED: usize = 4096;

/// A renter's turns now, and its start budget.
#[derive(Debug, Clone, Copy)]
struct RenterUse {
    running: usize,
    starts: Bucket,
}

/// The turns of one service.
#[derive(Clone)]
pub(crate) struct Turns {
    all: Arc<Semaphore>,
    renters: Arc<Mutex<BTreeMap<PublicKey, RenterUse>>>,
}

/// A renter's turn; given back when dropped.
pub(crate) struct Turn {
    renter: PublicKey,
    renters: Arc<Mutex<BTreeMap<PublicKey, RenterUse>>>,
    _all: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut renters = self.renters.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(u) = renters.get_mut(&self.renter) {
            u.running = u.running.saturating_sub(1);
        }
    }
}

impl Turns {
    /// `at_once` turns for everyone together.
    pub(crate) fn new(at_once: usize) -> Self {
        Turns {
            all: Arc::new(Semaphore::new(at_once)),
            renters: Arc::default(),
        }
    }

    /// A turn for `renter` at `what` (`staging`, `pull`), or why not.
    pub(crate) fn take(
        &self,
        renter: PublicKey,
        what: &str,
    ) -> Result<Turn, (PlaneRefusal, String)> {
        let busy = |d: String| (PlaneRefusal::Busy, d);
        let all = self.all.clone().try_acquire_owned().map_err(|_| {
            busy(format!(
                "this host has too many {what}s under way; try again shortly"
            ))
        })?;
        let mut renters = self.renters.lock().unwrap_or_else(|p| p.into_inner());
        let t = now().0;
        let usage = renters.entry(renter).or_insert(RenterUse {
            running: 0,
            starts: Bucket::full(STARTS_BURST, t),
        });
        if usage.running > 0 {
            return Err(busy(format!("you have a {what} under way here already")));
        }
        if !usage.starts.take(1.0 / 60.0, STARTS_BURST, t) {
            return Err(busy(format!(
                "you started too many {what}s here; try again in a minute"
            )));
        }
        usage.running += 1;
        if renters.len() > REMEMBERED {
            renters.retain(|_, u| u.running > 0);
        }
        Ok(Turn {
            renter,
            renters: self.renters.clone(),
            _all: all,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_turn_per_renter_and_a_few_for_everyone() {
        let turns = Turns::new(2);
        let (a, b, c) = (PublicKey([1; 32]), PublicKey([2; 32]), PublicKey([3; 32]));
        let first = turns.take(a, "pull").unwrap();
        assert!(turns.take(a, "pull").err().unwrap().1.contains("under way"));
        let _second = turns.take(b, "pull").unwrap();
        assert!(turns.take(c, "pull").err().unwrap().1.contains("too many"));
        drop(first);
        assert!(turns.take(c, "pull").is_ok());
    }
}
