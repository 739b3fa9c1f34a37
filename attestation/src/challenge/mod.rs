//! The performance challenge: a seeded INT8 matrix product, computed on the GPU's tensor
//! cores, that the renter checks from a few rows.
//!
//! The renter picks a random seed and a shape `m × k × n`. Both sides derive `A` (`m × k`)
//! and `B` (`k × n`), entries in `i8`, from the seed ([`tensor`]). The prover computes the
//! exact product `C = A·B` in `i32` (`k ≤ 65,536`, so `|C| ≤ k · 2^14 < 2^31`: no overflow,
//! no float tolerance), hashes each row and answers with the Merkle root over the row hashes
//! ([`merkle`]): the renter's clock stops there. Only then does the renter pick
//! [`Policy::rows`] distinct rows at random, and the prover opens each with its Merkle path.
//! The renter checks:
//!
//! - each opened row against the root (the prover committed to it before it knew the pick);
//! - each row's values with [`Policy::projections`] random projections: for `r` with
//!   entries in `0 .. 2^15`, `C[i]·r = A[i]·(B·r)`, exact in `i64`. `B·r` costs the renter
//!   `k·n` multiply-adds once (it generates `B` a word at a time and never holds it), each
//!   row then `k + n`; a wrong row survives a projection with probability at most 2^-15;
//! - the rate: `2mkn` operations over the time the renter itself measured, against the
//!   model's reference ([`crate::spec::GpuSpec::challenge_gops`]); 90% or more passes.
//!
//! **The bound.** A prover that committed to wrong values (or to nothing worth the name) in a
//! fraction `f` of the rows passes only if no picked row is one of them, or each wrong picked
//! row survives every projection: at most `(1 - f)^s + s · 2^-(15·p)` for `s` picked rows and
//! `p` projections; with the default `s = 128`, `p = 2`, a prover that skipped 10% of the
//! rows passes with probability at most `1.5 · 10^-6`. The renter downloads `s` rows of `4n`
//! bytes and their paths, whatever `m`: a challenge that loads an H100 for a second
//! (`m ≈ 1.9 · 10^6`, `k = 32,768`, `n = 8,192`) costs it 4.1 MiB and `k·n·p` multiply-adds.
//!
//! This module has the CPU prover used for fake GPUs (tests, the testnet); the CUDA prover
//! computes the same rows from the same seed.

pub mod cuda;
pub mod fill;
pub mod gpu;
pub mod local;
pub mod merkle;
pub mod tensor;

use std::time::{Duration, Instant};

use gpux_protocol::{MAX_CHALLENGE_K, MAX_CHALLENGE_M, MAX_CHALLENGE_N};
use merkle::Hash;

/// Every dimension is a multiple of this (whole tensor-core tiles, whole generator words).
pub const ALIGN: u32 = 64;

/// A challenge's shape: `A` is `m × k`, `B` is `k × n`, `C` is `m × n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Rows of `A` and `C`.
    pub m: u32,
    /// Columns of `A`, rows of `B` (the length of each sum).
    pub k: u32,
    /// Columns of `B` and `C`.
    pub n: u32,
}

impl Shape {
    /// A shape, if each dimension is a positive multiple of [`ALIGN`] within the protocol's
    /// maxima.
    pub fn new(m: u32, k: u32, n: u32) -> Result<Shape, ChallengeError> {
        let fits = |d: u32, max: u32| d > 0 && d.is_multiple_of(ALIGN) && d <= max;
        if fits(m, MAX_CHALLENGE_M) && fits(k, MAX_CHALLENGE_K) && fits(n, MAX_CHALLENGE_N) {
            Ok(Shape { m, k, n })
        } else {
            Err(ChallengeError::Shape(format!(
                "{m} x {k} x {n}: each a positive multiple of {ALIGN}, at most {MAX_CHALLENGE_M} x {MAX_CHALLENGE_K} x {MAX_CHALLENGE_N}"
            )))
        }
    }

    /// The operations of the product (a multiply and an add per term): `2mkn`.
    pub fn operations(&self) -> f64 {
        2.0 * f64::from(self.m) * f64::from(self.k) * f64::from(self.n)
    }

    /// What the renter downloads when the prover opens `rows` rows: each row's `4n` bytes
    /// and its Merkle path.
    pub fn opened_bytes(&self, rows: usize) -> usize {
        rows.min(self.m as usize) * (4 * self.n as usize + 32 * merkle::depth(self.m as usize))
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} x {} x {}", self.m, self.k, self.n)
    }
}

/// The shape whose product at `reference_gops` lasts at least `at_least`: `k` and `n` by
/// the class of the rate (a CPU, a small GPU, a large one; the renter's cost grows with
/// `k·n`), `m` as many rows as the time needs (at least one [`ALIGN`]).
pub fn shape_for(reference_gops: f64, at_least: Duration) -> Shape {
    let (k, n) = if reference_gops < 2_000.0 {
        (1_024, 256)
    } else if reference_gops < 100_000.0 {
        (8_192, 2_048)
    } else {
        (32_768, 8_192)
    };
    let per_row = 2.0 * f64::from(k) * f64::from(n);
    let rows = (reference_gops.max(0.0) * 1e9 * at_least.as_secs_f64() / per_row).ceil();
    let m = (rows.clamp(1.0, f64::from(MAX_CHALLENGE_M)) as u32).div_ceil(ALIGN) * ALIGN;
    Shape {
        m: m.min(MAX_CHALLENGE_M),
        k,
        n,
    }
}

/// A row the prover opened: its index, its values, its Merkle path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// The row's index.
    pub index: u32,
    /// `C[index]`, `n` values.
    pub row: Vec<i32>,
    /// Siblings from the row's leaf to the root.
    pub path: Vec<Hash>,
}

/// The CPU prover's product, committed: what it answers before the pick, and what it opens
/// after.
#[derive(Debug, Clone)]
pub struct Committed {
    /// The challenge's shape.
    pub shape: Shape,
    /// The Merkle root over the row hashes.
    pub root: Hash,
    /// What the product, the hashes and the tree took.
    pub elapsed: Duration,
    product: Vec<i32>,
    tree: merkle::Tree,
}

impl Committed {
    /// Opens `rows` (each below `m`; others are skipped).
    pub fn open(&self, rows: &[u32]) -> Vec<Opened> {
        let n = self.shape.n as usize;
        rows.iter()
            .filter(|&&i| i < self.shape.m)
            .map(|&i| Opened {
                index: i,
                row: self.product[i as usize * n..(i as usize + 1) * n].to_vec(),
                path: self.tree.path(i as usize),
            })
            .collect()
    }

    /// Replaces row `i`'s values and recommits (for tests of cheating provers).
    pub fn forge(&mut self, rows: &[u32], forge: impl Fn(&mut [i32])) {
        let n = self.shape.n as usize;
        for &i in rows {
            forge(&mut self.product[i as usize * n..(i as usize + 1) * n]);
        }
        let (root, tree) = commit(&self.product, n);
        self.root = root;
        self.tree = tree;
    }
}

fn commit(product: &[i32], n: usize) -> (Hash, merkle::Tree) {
    let leaves = product
        .chunks_exact(n)
        .map(|row| tensor::row_hash(&tensor::row_bytes(row)))
        .collect();
    let tree = merkle::Tree::new(leaves);
    (tree.root(), tree)
}

/// The CPU prover: the whole product on every core, its row hashes and their tree.
pub fn prove_cpu(seed: &[u8; 32], shape: Shape) -> Committed {
    let started = Instant::now();
    let (m, n) = (shape.m as usize, shape.n as usize);
    let key_a = tensor::key(seed, shape, tensor::Which::A);
    let b = tensor::b_matrix(tensor::key(seed, shape, tensor::Which::B), shape);
    let mut product = vec![0i32; m * n];
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let rows_each = m.div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for (part, chunk) in product.chunks_mut(rows_each * n).enumerate() {
            let b = &b;
            scope.spawn(move || {
                for (r, out) in chunk.chunks_exact_mut(n).enumerate() {
                    let i = (part * rows_each + r) as u32;
                    tensor::c_row(&tensor::a_row(key_a, shape, i), b, n, out);
                }
            });
        }
    });
    let (root, tree) = commit(&product, n);
    Committed {
        shape,
        root,
        elapsed: started.elapsed(),
        product,
        tree,
    }
}

/// The verifier's policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// Rows the renter picks and checks (all of them when `m` is smaller).
    pub rows: usize,
    /// Random projections each picked row must satisfy.
    pub projections: usize,
    /// Least share of the reference throughput that passes (default 0.9).
    pub min_share: f64,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            rows: 128,
            projections: 2,
            min_share: 0.9,
        }
    }
}

impl Policy {
    /// The most a prover whose rows are wrong in a fraction `f` can pass with: no picked
    /// row among them, or every wrong picked row surviving every projection.
    pub fn pass_bound(&self, f: f64) -> f64 {
        let s = self.rows as f64;
        let survive = 2f64.powi(-((tensor::PROJECTION_BITS as usize * self.projections) as i32));
        (1.0 - f).powf(s) + s * survive
    }
}

/// Why a proof failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ChallengeError {
    /// The shape is not one a challenge may have.
    #[error("not a challenge shape: {0}")]
    Shape(String),
    /// The prover did not open the rows picked, in order.
    #[error("the prover opened {got} rows, not the {want} picked")]
    Unopened {
        /// Rows picked.
        want: usize,
        /// Rows opened as picked.
        got: usize,
    },
    /// An opened row does not match the committed root.
    #[error("row {row} is not the one committed")]
    Commitment {
        /// The row.
        row: u32,
    },
    /// An opened row's values are wrong.
    #[error("row {row} of the product is wrong")]
    WrongRow {
        /// The row.
        row: u32,
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

fn coin_stream(coins: &[u8; 32], purpose: &[u8]) -> blake3::OutputReader {
    let mut h = blake3::Hasher::new_keyed(coins);
    h.update(b"gpux challenge v2 coins ");
    h.update(purpose);
    h.finalize_xof()
}

fn draw(reader: &mut blake3::OutputReader) -> u64 {
    let mut b = [0u8; 8];
    reader.fill(&mut b);
    u64::from_le_bytes(b)
}

/// The rows the renter checks: `policy.rows` distinct rows below `m` drawn with `coins`
/// (every row when `m` is smaller), ascending. The renter sends them after the commitment.
pub fn pick_rows(coins: &[u8; 32], m: u32, policy: &Policy) -> Vec<u32> {
    let want = policy.rows.min(m as usize);
    let mut reader = coin_stream(coins, b"rows");
    let mut picked = std::collections::BTreeSet::new();
    while picked.len() < want {
        picked.insert((draw(&mut reader) % u64::from(m)) as u32);
    }
    picked.into_iter().collect()
}

/// A time the renter measured by its own clock, and the model's reference rate it is held
/// against (Gop/s for the product, GB/s for the fill).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timed {
    /// From sending the challenge (or the previous commitment) to receiving the commitment.
    pub observed: Duration,
    /// The claimed model's reference rate.
    pub reference: f64,
}

/// Checks the rows opened for the challenge `(seed, shape)` against the committed `root`.
/// `coins` are the renter's private randomness (the same that picked the rows, and the
/// projections); `timed` the time the renter itself measured between sending the
/// challenge and receiving the root, against the model's reference throughput.
pub fn verify(
    seed: &[u8; 32],
    shape: Shape,
    root: &Hash,
    opened: &[Opened],
    timed: Timed,
    policy: &Policy,
    coins: &[u8; 32],
) -> Result<Verdict, ChallengeError> {
    let Timed {
        observed,
        reference: reference_gops,
    } = timed;
    let picked = pick_rows(coins, shape.m, policy);
    let in_order = opened
        .iter()
        .zip(&picked)
        .take_while(|(o, i)| o.index == **i && o.row.len() == shape.n as usize)
        .count();
    if in_order != picked.len() || opened.len() != picked.len() {
        return Err(ChallengeError::Unopened {
            want: picked.len(),
            got: in_order,
        });
    }
    for o in opened {
        let leaf = tensor::row_hash(&tensor::row_bytes(&o.row));
        if !merkle::holds(root, shape.m as usize, o.index as usize, &leaf, &o.path) {
            return Err(ChallengeError::Commitment { row: o.index });
        }
    }
    let mut reader = coin_stream(coins, b"projections");
    let rs: Vec<Vec<i64>> = (0..policy.projections)
        .map(|_| {
            (0..shape.n)
                .map(|_| (draw(&mut reader) >> (64 - tensor::PROJECTION_BITS)) as i64)
                .collect()
        })
        .collect();
    let key_a = tensor::key(seed, shape, tensor::Which::A);
    let ys = tensor::project_b(tensor::key(seed, shape, tensor::Which::B), shape, &rs);
    for o in opened {
        let a = tensor::a_row(key_a, shape, o.index);
        let wrong = rs
            .iter()
            .zip(&ys)
            .any(|(r, y)| tensor::dot(&o.row, r) != tensor::dot(&a, y));
        if wrong {
            return Err(ChallengeError::WrongRow { row: o.index });
        }
    }
    let achieved_gops = shape.operations() / observed.as_secs_f64().max(1e-9) / 1e9;
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
mod tests;
