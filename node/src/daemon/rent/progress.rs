//! Where rents under way stand, by the name their caller gave (`RentRequest::progress`), for
//! `GET /v1/rent/progress/{name}`: `gpux rent` shows a pull's bytes, rate and time left from
//! it while its own request waits for the lease to run.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use gpux_api::RentProgress;

/// Rents followed at once, at most (the oldest are forgotten first).
const MAX_FOLLOWED: usize = 256;
/// How long a finished rent's last state is kept, ms.
const KEPT_MS: u64 = 10 * 60 * 1000;

/// The progress of rents under way.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProgressBoard(Arc<Mutex<BTreeMap<String, (RentProgress, u64)>>>);

/// One rent's place on the board (a rent without a name has none: its updates go nowhere).
#[derive(Debug, Clone, Default)]
pub(crate) struct ProgressSlot {
    board: Option<ProgressBoard>,
    name: String,
}

/// Whether `name` may name a rent: 16 to 64 ASCII letters and digits (a random name, so
/// that another local caller cannot guess it; the API is token-protected anyway).
pub(crate) fn valid_name(name: &str) -> bool {
    (16..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric())
}

impl ProgressBoard {
    /// The slot of the rent called `name` (none for `None`).
    pub(crate) fn slot(&self, name: Option<&str>) -> ProgressSlot {
        ProgressSlot {
            board: name.map(|_| self.clone()),
            name: name.unwrap_or_default().to_string(),
        }
    }

    /// Where the rent called `name` stands.
    pub(crate) fn get(&self, name: &str) -> Option<RentProgress> {
        let board = self.0.lock().unwrap_or_else(|p| p.into_inner());
        board.get(name).map(|(p, _)| p.clone())
    }

    fn put(&self, name: &str, progress: RentProgress, now: u64) {
        let mut board = self.0.lock().unwrap_or_else(|p| p.into_inner());
        board.retain(|_, (p, at)| p.phase != "done" || now.saturating_sub(*at) < KEPT_MS);
        if board.len() >= MAX_FOLLOWED && !board.contains_key(name) {
            let oldest = board
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                board.remove(&oldest);
            }
        }
        board.insert(name.to_string(), (progress, now));
    }
}

impl ProgressSlot {
    /// The rent stands at `progress` now.
    pub(crate) fn set(&self, progress: RentProgress) {
        if let Some(board) = &self.board {
            board.put(&self.name, progress, crate::attest::now().0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_rent_is_followed_and_an_unnamed_one_is_not() {
        let board = ProgressBoard::default();
        let name = "a".repeat(32);
        board.slot(Some(&name)).set(RentProgress {
            phase: "pulling".into(),
            done: 5,
            total: 10,
            ..RentProgress::default()
        });
        board.slot(None).set(RentProgress::default());
        assert_eq!(board.get(&name).unwrap().done, 5);
        assert_eq!(board.0.lock().unwrap().len(), 1);
        assert!(valid_name(&name));
        assert!(!valid_name("short") && !valid_name(&"a/".repeat(10)));
    }
}
