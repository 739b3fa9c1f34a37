//! The performance challenge: a seeded matrix product whose answer is cheap to check.
//!
//! The renter picks a random seed and a size `n`. Both sides derive two `n × n` matrices `A`
//! and `B` over the integers modulo the prime `p = 2^31 - 1` from the seed. The prover
//! computes `C = A·B mod p` and answers with a digest of `C`, a commitment (blake3) to every
//! row and its timing; the renter then receives `C` and checks it:
//!
//! - every row against its commitment and the whole against the digest;
//! - **Freivalds' algorithm**, `k` rounds: for a random `r ∈ {0,1}^n`, `A·(B·r) = C·r`. Each
//!   round costs `O(n²)` instead of the `O(n³)` product; a wrong `C` passes one round with
//!   probability at most 1/2, so `k` rounds leave an error of at most `2^-k`;
//! - **spot rows**: a few random rows of `C` recomputed directly (`O(n²)` each);
//! - **throughput**: `2n³` operations over the time the renter itself measured (never the
//!   prover's claim, which could be anything), against the model's reference throughput
//!   ([`crate::spec::GpuSpec::challenge_gops`]); the default policy passes at 90% or more.
//!
//! Exact arithmetic modulo a prime: no float tolerance to argue about. This module has the
//! CPU prover used everywhere (tests, the testnet); a GPU prover running inside the lease
//! container computes the same `C` from the same seed.

use std::time::Duration;

use gpux_protocol::ContentId;

/// The modulus: the Mersenne prime 2^31 - 1.
pub const P: u64 = (1 << 31) - 1;

/// A square matrix of residues modulo [`P`], row-major.
#[derive(Clone, PartialEq, Eq)]
pub struct Matrix {
    n: usize,
    data: Vec<u32>,
}

impl std::fmt::Debug for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Matrix({n}x{n})", n = self.n)
    }
}

impl Matrix {
    /// A matrix from its rows' entries, row-major (`n * n` of them, each below [`P`]);
    /// `None` otherwise (a prover's product as received).
    pub fn from_entries(n: usize, data: Vec<u32>) -> Option<Matrix> {
        let fits = n.checked_mul(n) == Some(data.len()) && data.iter().all(|v| u64::from(*v) < P);
        fits.then_some(Matrix { n, data })
    }

    /// The dimension.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &[u32] {
        &self.data[i * self.n..(i + 1) * self.n]
    }

    /// Element `(i, j)`.
    pub fn get(&self, i: usize, j: usize) -> u32 {
        self.data[i * self.n + j]
    }

    /// Sets element `(i, j)` (for tests that forge results).
    pub fn set(&mut self, i: usize, j: usize, value: u32) {
        self.data[i * self.n + j] = value % P as u32;
    }

    /// The little-endian bytes of row `i`.
    fn row_bytes(&self, i: usize) -> Vec<u8> {
        self.row(i).iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// blake3 of each row's little-endian bytes.
    pub fn row_commitments(&self) -> Vec<ContentId> {
        (0..self.n)
            .map(|i| ContentId::of(&self.row_bytes(i)))
            .collect()
    }

    /// blake3 of all rows in order.
    pub fn digest(&self) -> ContentId {
        let mut h = blake3::Hasher::new();
        for i in 0..self.n {
            h.update(&self.row_bytes(i));
        }
        ContentId(*h.finalize().as_bytes())
    }
}

fn reduce(x: u64) -> u64 {
    // x < 2^62: fold twice with 2^31 ≡ 1 (mod P).
    let x = (x & P) + (x >> 31);
    let x = (x & P) + (x >> 31);
    if x >= P { x - P } else { x }
}

/// The two matrices of a challenge, derived from the seed with blake3's XOF (domain-separated
/// by `n`), each entry a 64-bit draw reduced modulo [`P`].
pub fn matrices(seed: &[u8; 32], n: usize) -> (Matrix, Matrix) {
    let mut xof = blake3::Hasher::new_keyed(seed);
    xof.update(b"gpux challenge v1");
    xof.update(&(n as u64).to_le_bytes());
    let mut reader = xof.finalize_xof();
    let mut draw = || {
        let mut b = [0u8; 8];
        reader.fill(&mut b);
        (u64::from_le_bytes(b) % P) as u32
    };
    let a = Matrix {
        n,
        data: (0..n * n).map(|_| draw()).collect(),
    };
    let b = Matrix {
        n,
        data: (0..n * n).map(|_| draw()).collect(),
    };
    (a, b)
}

/// `A·B mod P`, the CPU prover's work (`2n³` operations), cache-friendly (i-k-j order,
/// with lazy reduction: up to 4 products of two 31-bit residues fit in 64 bits before
/// reducing).
pub fn multiply(a: &Matrix, b: &Matrix) -> Matrix {
    let n = a.n;
    let mut out = vec![0u32; n * n];
    let mut acc = vec![0u64; n];
    for i in 0..n {
        acc.iter_mut().for_each(|x| *x = 0);
        let arow = a.row(i);
        for (k, &aik) in arow.iter().enumerate() {
            let aik = u64::from(aik);
            let brow = b.row(k);
            for (x, &bkj) in acc.iter_mut().zip(brow) {
                *x += aik * u64::from(bkj);
            }
            if k % 3 == 2 {
                acc.iter_mut().for_each(|x| *x = reduce(*x));
            }
        }
        for (o, x) in out[i * n..(i + 1) * n].iter_mut().zip(&acc) {
            *o = reduce(*x) as u32;
        }
    }
    Matrix { n, data: out }
}

fn mat_vec(m: &Matrix, v: &[u64]) -> Vec<u64> {
    (0..m.n)
        .map(|i| {
            m.row(i)
                .iter()
                .zip(v)
                .fold(0u64, |acc, (&x, &y)| reduce(acc + u64::from(x) * y))
        })
        .collect()
}

/// The prover's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    /// `C = A·B mod P`.
    pub product: Matrix,
    /// `product.digest()`.
    pub digest: ContentId,
    /// `product.row_commitments()`.
    pub row_commitments: Vec<ContentId>,
    /// What the prover says the product took.
    pub elapsed: Duration,
}

/// The CPU prover.
pub fn prove_cpu(seed: &[u8; 32], n: usize) -> Proof {
    let (a, b) = matrices(seed, n);
    let started = std::time::Instant::now();
    let product = multiply(&a, &b);
    let elapsed = started.elapsed();
    Proof {
        digest: product.digest(),
        row_commitments: product.row_commitments(),
        product,
        elapsed,
    }
}

/// The verifier's policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// Freivalds rounds (error at most 2^-rounds).
    pub rounds: u32,
    /// Rows recomputed directly.
    pub spot_rows: usize,
    /// Least share of the reference throughput that passes (default 0.9).
    pub min_share: f64,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            rounds: 20,
            spot_rows: 4,
            min_share: 0.9,
        }
    }
}

/// Why a proof failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ChallengeError {
    /// The product has the wrong size.
    #[error("the product is {got}x{got}, expected {want}x{want}")]
    WrongSize {
        /// Expected n.
        want: usize,
        /// Received n.
        got: usize,
    },
    /// A row does not match its commitment, or the digest does not match.
    #[error("the product does not match the commitments (row {row:?})")]
    Commitment {
        /// The first row that does not match, or `None` for the digest.
        row: Option<usize>,
    },
    /// Freivalds' check failed: the product is wrong.
    #[error("the product is wrong (Freivalds round {round})")]
    Freivalds {
        /// The round that caught it.
        round: u32,
    },
    /// A spot-checked row is wrong.
    #[error("row {row} of the product is wrong")]
    SpotRow {
        /// The row.
        row: usize,
    },
    /// Correct, but slower than the policy allows.
    #[error("{achieved_gops:.1} Gop/s is {share:.0}% of the reference {reference_gops:.1} Gop/s (needs {min:.0}%)", share = achieved_gops / reference_gops * 100.0, min = min_share * 100.0)]
    TooSlow {
        /// Throughput achieved, by the verifier's clock.
        achieved_gops: f64,
        /// The model's reference.
        reference_gops: f64,
        /// The policy's minimum share.
        min_share: f64,
    },
}

/// A passed challenge.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// Throughput achieved, Gop/s, by the verifier's clock.
    pub achieved_gops: f64,
    /// Share of the reference.
    pub share_of_reference: f64,
}

/// Operations in an `n × n` product.
pub fn operations(n: usize) -> f64 {
    2.0 * (n as f64).powi(3)
}

/// Checks a proof for the challenge `(seed, n)`. `observed` is the time the verifier itself
/// measured between sending the challenge and receiving the answer; `reference_gops` the
/// model's reference throughput; `coins` seeds the verifier's private randomness (Freivalds
/// vectors and spot rows), which the prover must not know in advance.
pub fn verify(
    seed: &[u8; 32],
    n: usize,
    proof: &Proof,
    observed: Duration,
    reference_gops: f64,
    policy: &Policy,
    coins: &[u8; 32],
) -> Result<Verdict, ChallengeError> {
    let c = &proof.product;
    if c.n != n || proof.row_commitments.len() != n {
        return Err(ChallengeError::WrongSize { want: n, got: c.n });
    }
    if let Some(row) = c
        .row_commitments()
        .iter()
        .zip(&proof.row_commitments)
        .position(|(a, b)| a != b)
    {
        return Err(ChallengeError::Commitment { row: Some(row) });
    }
    if c.digest() != proof.digest {
        return Err(ChallengeError::Commitment { row: None });
    }
    let (a, b) = matrices(seed, n);
    let mut rng = blake3::Hasher::new_keyed(coins).finalize_xof();
    let mut bit_buf = vec![0u8; n.div_ceil(8)];
    for round in 0..policy.rounds {
        rng.fill(&mut bit_buf);
        let r: Vec<u64> = (0..n)
            .map(|j| u64::from((bit_buf[j / 8] >> (j % 8)) & 1))
            .collect();
        if mat_vec(&a, &mat_vec(&b, &r)) != mat_vec(c, &r) {
            return Err(ChallengeError::Freivalds { round });
        }
    }
    for _ in 0..policy.spot_rows.min(n) {
        let mut pick = [0u8; 8];
        rng.fill(&mut pick);
        let i = (u64::from_le_bytes(pick) % n as u64) as usize;
        let expected: Vec<u32> = (0..n)
            .map(|j| {
                (0..n).fold(0u64, |acc, k| {
                    reduce(acc + u64::from(a.get(i, k)) * u64::from(b.get(k, j)))
                }) as u32
            })
            .collect();
        if expected != c.row(i) {
            return Err(ChallengeError::SpotRow { row: i });
        }
    }
    let achieved_gops = operations(n) / observed.as_secs_f64().max(1e-9) / 1e9;
    let share = achieved_gops / reference_gops;
    if share < policy.min_share {
        return Err(ChallengeError::TooSlow {
            achieved_gops,
            reference_gops,
            min_share: policy.min_share,
        });
    }
    Ok(Verdict {
        achieved_gops,
        share_of_reference: share,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &Matrix, b: &Matrix) -> Matrix {
        let n = a.n;
        let mut data = vec![0u32; n * n];
        for i in 0..n {
            for j in 0..n {
                data[i * n + j] = (0..n).fold(0u64, |s, k| {
                    (s + u64::from(a.get(i, k)) * u64::from(b.get(k, j))) % P
                }) as u32;
            }
        }
        Matrix { n, data }
    }

    const FAST: f64 = 1e-6; // a reference any machine beats, for correctness-only tests

    #[test]
    fn the_fast_product_equals_the_definition() {
        for n in [1, 2, 3, 7, 33] {
            let (a, b) = matrices(&[n as u8; 32], n);
            assert_eq!(multiply(&a, &b), naive(&a, &b), "n={n}");
        }
        // Extreme residues exercise the lazy reduction.
        let n = 9;
        let max = Matrix {
            n,
            data: vec![(P - 1) as u32; n * n],
        };
        assert_eq!(multiply(&max, &max), naive(&max, &max));
    }

    #[test]
    fn a_correct_product_passes() {
        let seed = [5; 32];
        let proof = prove_cpu(&seed, 48);
        let verdict = verify(
            &seed,
            48,
            &proof,
            Duration::from_millis(1),
            FAST,
            &Policy::default(),
            &[9; 32],
        )
        .unwrap();
        assert!(verdict.achieved_gops > 0.0);
        // Derivation is deterministic and depends on seed and size.
        assert_eq!(matrices(&seed, 4), matrices(&seed, 4));
        assert_ne!(matrices(&seed, 4).0, matrices(&[6; 32], 4).0);
    }

    #[test]
    fn one_wrong_element_is_caught_with_probability_at_least_1_minus_2_pow_minus_k() {
        let seed = [7; 32];
        let n = 24;
        let honest = prove_cpu(&seed, n);
        for rounds in [1u32, 2, 4, 8] {
            let policy = Policy {
                rounds,
                spot_rows: 0,
                min_share: 0.0,
            };
            let trials = 400;
            let mut caught = 0;
            for t in 0..trials {
                let mut forged = honest.product.clone();
                let (i, j) = (t % n, (t * 7) % n);
                forged.set(i, j, forged.get(i, j) + 1);
                let proof = Proof {
                    digest: forged.digest(),
                    row_commitments: forged.row_commitments(),
                    product: forged,
                    elapsed: honest.elapsed,
                };
                let coins = *blake3::hash(&[rounds as u8, t as u8, (t >> 8) as u8]).as_bytes();
                if matches!(
                    verify(
                        &seed,
                        n,
                        &proof,
                        Duration::from_millis(1),
                        FAST,
                        &policy,
                        &coins
                    ),
                    Err(ChallengeError::Freivalds { .. })
                ) {
                    caught += 1;
                }
            }
            let rate = f64::from(caught) / trials as f64;
            let bound = 1.0 - 0.5f64.powi(rounds as i32);
            // Allow sampling noise of about 3 standard deviations below the bound.
            let slack = 3.0 * (bound * (1.0 - bound) / trials as f64).sqrt() + 0.01;
            assert!(
                rate >= bound - slack,
                "rounds={rounds}: caught {rate:.3}, bound {bound:.3}"
            );
        }
    }

    #[test]
    fn cheating_provers_are_caught() {
        let seed = [3; 32];
        let n = 32;
        let honest = prove_cpu(&seed, n);
        let policy = Policy::default();
        let check = |proof: &Proof| {
            verify(
                &seed,
                n,
                proof,
                Duration::from_millis(1),
                FAST,
                &policy,
                &[1; 32],
            )
        };
        // Skipping the work: zeros, committed honestly.
        let zeros = Matrix {
            n,
            data: vec![0; n * n],
        };
        let lazy = Proof {
            digest: zeros.digest(),
            row_commitments: zeros.row_commitments(),
            product: zeros,
            elapsed: honest.elapsed,
        };
        assert!(matches!(
            check(&lazy),
            Err(ChallengeError::Freivalds { .. })
        ));
        // Doing half the rows.
        let mut half = honest.product.clone();
        for i in n / 2..n {
            for j in 0..n {
                half.set(i, j, 0);
            }
        }
        let half = Proof {
            digest: half.digest(),
            row_commitments: half.row_commitments(),
            product: half,
            elapsed: honest.elapsed,
        };
        assert!(matches!(
            check(&half),
            Err(ChallengeError::Freivalds { .. })
        ));
        // The right product for another seed.
        let other = prove_cpu(&[4; 32], n);
        assert!(check(&other).is_err());
        // A product that does not match its commitments.
        let mut swapped = honest.clone();
        swapped.product.set(0, 0, swapped.product.get(0, 0) + 1);
        assert_eq!(
            check(&swapped),
            Err(ChallengeError::Commitment { row: Some(0) })
        );
        // Too slow for the reference.
        let slow = verify(
            &seed,
            n,
            &honest,
            Duration::from_secs(1),
            1000.0,
            &policy,
            &[1; 32],
        );
        assert!(matches!(slow, Err(ChallengeError::TooSlow { .. })));
    }
}
