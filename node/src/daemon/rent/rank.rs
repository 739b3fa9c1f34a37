//! Which candidates one round of a rent probes, and in what order it asks them. Pure.
//!
//! The book orders offers by price. A flood of fresh keys with cheap offers and no node
//! behind them would fill every round with hosts that cannot answer, so the round is drawn
//! by standing as well: hosts that served this renter or passed a challenge always get a
//! place in the round, and hosts that came in a burst of fresh keys from one relaying peer
//! only fill places that nobody else wants, and are asked last.

/// How a candidate host stands with this renter, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Standing {
    /// It served this renter before (an acknowledged receipt), or its offer's tier is
    /// challenged or attested.
    Proven,
    /// Nothing for or against it.
    Known,
    /// A fresh key that came in a burst from one relaying peer.
    Burst,
}

/// Offers a round looks at past its first `n` good candidates, for proven hosts further
/// down the book (a multiple of `n`).
const LOOK_PAST: usize = 4;

/// Whether `found` (in the book's order) holds enough for a round of `n`: `n` candidates
/// that are not from a burst, a look `LOOK_PAST` times as deep for proven ones, and every
/// host that served this renter found (`served_unfound` is how many are not; a flood ahead
/// of them in the book must not hide them).
pub(crate) fn enough<T>(found: &[(Standing, T)], n: usize, served_unfound: usize) -> bool {
    let good = found.iter().filter(|(s, _)| *s != Standing::Burst).count();
    good >= n && found.len() >= n * LOOK_PAST && served_unfound == 0
}

/// The round: the first `n` candidates not from a burst (in the book's order), every
/// proven one found past them, then candidates from a burst for the places left. They are
/// asked in the book's order, those from a burst last.
pub(crate) fn round<T>(found: Vec<(Standing, T)>, n: usize) -> Vec<T> {
    let mut good = 0;
    let mut burst = Vec::new();
    let mut chosen = Vec::new();
    for (standing, candidate) in found {
        match standing {
            Standing::Burst => burst.push(candidate),
            Standing::Proven => {
                good += 1;
                chosen.push(candidate);
            }
            Standing::Known if good < n => {
                good += 1;
                chosen.push(candidate);
            }
            Standing::Known => {}
        }
    }
    let left = n.saturating_sub(chosen.len());
    chosen.extend(burst.into_iter().take(left));
    chosen
}

#[cfg(test)]
mod tests {
    use super::{Standing, enough, round};

    #[test]
    fn a_burst_of_cheap_fresh_hosts_is_asked_last_and_proven_hosts_always_get_a_place() {
        use Standing::{Burst, Known, Proven};
        // A flood: 100 cheap hosts from a burst ahead of two honest ones in the book.
        let mut found: Vec<(Standing, usize)> = (0..100).map(|i| (Burst, i)).collect();
        found.push((Known, 100));
        found.push((Known, 101));
        assert!(!enough(&found, 4, 0));
        assert_eq!(round(found, 4), vec![100, 101, 0, 1]);
        // No flood: the book's order, and a proven host deep in the book joins the round.
        let mut found: Vec<(Standing, usize)> = (0..16).map(|i| (Known, i)).collect();
        found.push((Proven, 16));
        assert!(enough(&found, 4, 0));
        // A host that served the renter is looked for past that.
        assert!(!enough(&found[..16], 4, 1));
        assert_eq!(round(found, 4), vec![0, 1, 2, 3, 16]);
        // Only hosts from a burst: they are still tried.
        let found: Vec<(Standing, usize)> = (0..3).map(|i| (Burst, i)).collect();
        assert_eq!(round(found, 4), vec![0, 1, 2]);
    }
}
