//! The memory challenge: a data-dependent, memory-hard fill of the claimed memory, committed
//! with a Merkle root and checked at blocks the renter picks afterwards.
//!
//! The memory is `lanes` lanes of `blocks` blocks of 1 KiB (128 words), each lane cut into
//! [`SLICES`] slices. In each lane the first two blocks come from the seed; every later block
//! `j` is [`compress`]`(B[j-1], R)`, where the reference `R` is read from `B[j-1]`: in the
//! first slice an earlier block of the same lane; after it, a block of any lane, from the
//! slices every lane has finished (or an earlier block of its own lane) -- uniform, and
//! unknown until `B[j-1]` exists. All lanes fill a slice at once (a GPU runs one lane per
//! warp and synchronises between slices), and each slice can refer to everything filled
//! before it, so the earlier slices of every lane must all be held: a device cannot fill the
//! lanes a batch at a time. A device that holds every block reads one block and writes one
//! per step: the fill is bound by memory bandwidth, and the renter times it.
//!
//! A device with less memory than it claims cannot hold every block. It can drop blocks and
//! recompute them when a later block refers to one (each recomputation needs its own
//! predecessor and reference, dropped too with the same odds), spill them over PCIe to host
//! memory (tens of GB/s against the TB/s of HBM), or commit to blocks it never computed. The
//! first two show in the time; the last in the check: the renter picks
//! [`FillPolicy::blocks`] blocks after the commitment and the prover opens each with its
//! predecessor and its reference; a block that is not `compress` of the two opened beside it
//! fails. A prover that committed wrong blocks in a fraction `g` of the memory passes with
//! probability at most `(1 - g)^s` for `s` picked blocks.

use super::merkle::{self, Hash};
use super::tensor::mix;

/// Words in a block.
pub const BLOCK_WORDS: usize = 128;
/// Bytes in a block.
pub const BLOCK_BYTES: u64 = 8 * BLOCK_WORDS as u64;
/// Slices per lane: the points where every lane's earlier blocks become referable.
pub const SLICES: u32 = 16;
/// The derive-key context of a block's hash (a Merkle leaf).
pub const BLOCK_CONTEXT: &str = "gpux challenge 2026-12 fill block";

/// A block of the fill.
pub type Block = [u64; BLOCK_WORDS];

/// The fill's shape: `lanes` lanes of `blocks` blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FillShape {
    /// Independent lanes.
    pub lanes: u32,
    /// Blocks in each lane: a multiple of [`SLICES`], at least two slices.
    pub blocks: u32,
}

impl FillShape {
    /// The memory filled, bytes.
    pub fn bytes(&self) -> u64 {
        u64::from(self.lanes) * u64::from(self.blocks) * BLOCK_BYTES
    }

    /// The memory traffic of the fill, bytes: each block written once and one earlier block
    /// read for it (its predecessor is still in registers).
    pub fn traffic(&self) -> f64 {
        2.0 * self.bytes() as f64
    }

    /// A fill shape, if `lanes` ≥ 1 and `blocks` a multiple of [`SLICES`], at least two
    /// slices, and the whole at most `max_bytes`.
    pub fn new(lanes: u32, blocks: u32, max_bytes: u64) -> Option<FillShape> {
        let shape = FillShape { lanes, blocks };
        let fits = lanes >= 1
            && blocks >= 2 * SLICES
            && blocks.is_multiple_of(SLICES)
            && shape.bytes() <= max_bytes;
        fits.then_some(shape)
    }

    /// The shape that fills about `bytes` (at least two slices of one lane): one lane per MiB,
    /// at most 8,192 lanes (a GPU's resident warps), whole slices.
    pub fn for_bytes(bytes: u64) -> FillShape {
        let lanes = (bytes >> 20).clamp(1, 8_192) as u32;
        let per_lane = bytes / BLOCK_BYTES / u64::from(lanes);
        let blocks = (per_lane / u64::from(SLICES) * u64::from(SLICES)).max(u64::from(2 * SLICES));
        FillShape {
            lanes,
            blocks: u32::try_from(blocks).unwrap_or(u32::MAX / SLICES * SLICES),
        }
    }

    fn slice_len(&self) -> u32 {
        self.blocks / SLICES
    }

    fn leaf(&self, lane: u32, j: u32) -> usize {
        lane as usize * self.blocks as usize + j as usize
    }

    fn leaves(&self) -> usize {
        self.lanes as usize * self.blocks as usize
    }
}

/// The fill's generator key for a challenge's seed.
pub fn key(seed: &[u8; 32], shape: FillShape) -> u64 {
    let mut h = blake3::Hasher::new_keyed(seed);
    h.update(b"gpux challenge v2 fill");
    h.update(&shape.lanes.to_le_bytes());
    h.update(&shape.blocks.to_le_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&h.finalize().as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// Block `j` (0 or 1) of `lane`, from the seed.
pub fn first_block(key: u64, lane: u32, j: u32) -> Block {
    let base = ((u64::from(lane) << 1) | u64::from(j & 1)) << 7;
    std::array::from_fn(|i| super::tensor::word(key, base | i as u64))
}

/// The block that block `j ≥ 2` of `lane` refers to, `(lane, index)`: read from its
/// predecessor. In the first slice, an earlier block of the lane; after it, a lane drawn
/// from the predecessor's second word and, in another lane, a block of the slices finished
/// before `j`'s, in its own lane an earlier block.
pub fn reference(shape: FillShape, lane: u32, j: u32, prev: &Block) -> (u32, u32) {
    let slice = j / shape.slice_len();
    let other = if slice == 0 {
        lane
    } else {
        (prev[1] % u64::from(shape.lanes)) as u32
    };
    let span = if other == lane {
        j.max(2) - 1
    } else {
        slice * shape.slice_len()
    };
    (other, (prev[0] % u64::from(span)) as u32)
}

fn mix_pair(a: u64, b: u64, round: u32) -> u64 {
    let v = a.wrapping_add(b.rotate_left(7 + 8 * round));
    mix(v)
}

/// A block from its predecessor and its reference: their XOR through seven butterfly
/// rounds (round `t` mixes word `i` with word `i ^ 2^t`, so every output word depends on
/// every input word), XORed with both inputs. A GPU warp holds a block as 32 threads of 4
/// words: rounds 0 and 1 stay within a thread, the others are one shuffle each.
pub fn compress(prev: &Block, reference: &Block) -> Block {
    let mut x: Block = std::array::from_fn(|i| prev[i] ^ reference[i]);
    for round in 0..7u32 {
        let bit = 1usize << round;
        x = std::array::from_fn(|i| mix_pair(x[i], x[i ^ bit], round));
    }
    std::array::from_fn(|i| x[i] ^ prev[i] ^ reference[i])
}

/// A block's hash (its Merkle leaf).
pub fn block_hash(block: &Block) -> Hash {
    let mut h = blake3::Hasher::new_derive_key(BLOCK_CONTEXT);
    for w in block {
        h.update(&w.to_le_bytes());
    }
    *h.finalize().as_bytes()
}

/// A block the prover opened: where it is, its words, its Merkle path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenedBlock {
    /// The lane.
    pub lane: u32,
    /// The block's index in its lane.
    pub index: u32,
    /// Its words.
    pub block: Block,
    /// Siblings from its leaf to the root.
    pub path: Vec<Hash>,
}

/// A picked block opened with what it was computed from: the block, its predecessor, its
/// reference.
pub type Opening = [OpenedBlock; 3];

/// The CPU prover's fill, committed.
#[derive(Debug, Clone)]
pub struct Filled {
    /// The fill's shape.
    pub shape: FillShape,
    /// The Merkle root over every block's hash, lane by lane.
    pub root: Hash,
    /// What the fill, the hashes and the tree took.
    pub elapsed: std::time::Duration,
    memory: Vec<Block>,
    tree: merkle::Tree,
}

/// The CPU prover's fill of `shape` on every core, keeping at most `holds` bytes: a device
/// that holds less than the fill (a disguise) keeps the first blocks of each lane and
/// commits zeros for the rest, computing later blocks from what it has.
pub fn fill_cpu(seed: &[u8; 32], shape: FillShape, holds: u64) -> Filled {
    let started = std::time::Instant::now();
    let key = key(seed, shape);
    let kept =
        (holds / BLOCK_BYTES / u64::from(shape.lanes.max(1))).min(u64::from(shape.blocks)) as u32;
    let mut memory = vec![[0u64; BLOCK_WORDS]; shape.leaves()];
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    for slice in 0..SLICES {
        fill_slice(
            key,
            shape,
            slice * shape.slice_len(),
            kept,
            &mut memory,
            threads,
        );
    }
    let leaves = memory.iter().map(block_hash).collect();
    let tree = merkle::Tree::new(leaves);
    Filled {
        shape,
        root: tree.root(),
        elapsed: started.elapsed(),
        memory,
        tree,
    }
}

/// Every lane's blocks `start .. start + slice_len` at once, on `threads` threads: each lane
/// writes its own slice and reads the slices every lane finished before it.
fn fill_slice(
    key: u64,
    shape: FillShape,
    start: u32,
    kept: u32,
    memory: &mut [Block],
    threads: usize,
) {
    let end = start + shape.slice_len();
    let mut before: Vec<&[Block]> = Vec::with_capacity(shape.lanes as usize);
    let mut current: Vec<&mut [Block]> = Vec::with_capacity(shape.lanes as usize);
    for lane in memory.chunks_exact_mut(shape.blocks as usize) {
        let (done, rest) = lane.split_at_mut(start as usize);
        before.push(done);
        current.push(&mut rest[..(end - start) as usize]);
    }
    let before = &before;
    let lanes_each = current.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|scope| {
        for (part, group) in current.chunks_mut(lanes_each).enumerate() {
            scope.spawn(move || {
                for (i, slice) in group.iter_mut().enumerate() {
                    let lane = (part * lanes_each + i) as u32;
                    let read = |slice: &[Block], (l, idx): (u32, u32)| {
                        if l == lane && idx >= start {
                            slice[(idx - start) as usize]
                        } else {
                            before[l as usize][idx as usize]
                        }
                    };
                    for j in start..end {
                        let block = if j < 2 {
                            first_block(key, lane, j)
                        } else {
                            let prev = read(slice, (lane, j - 1));
                            let refd = read(slice, reference(shape, lane, j, &prev));
                            compress(&prev, &refd)
                        };
                        slice[(j - start) as usize] =
                            if j < kept { block } else { [0; BLOCK_WORDS] };
                    }
                }
            });
        }
    });
}

impl Filled {
    fn opened(&self, lane: u32, index: u32) -> OpenedBlock {
        let leaf = self.shape.leaf(lane, index);
        OpenedBlock {
            lane,
            index,
            block: self.memory[leaf],
            path: self.tree.path(leaf),
        }
    }

    /// Opens each picked block with its predecessor and its reference (picks outside the
    /// shape are skipped).
    pub fn open(&self, picks: &[(u32, u32)]) -> Vec<Opening> {
        picks
            .iter()
            .filter(|(lane, j)| *lane < self.shape.lanes && (2..self.shape.blocks).contains(j))
            .map(|&(lane, j)| {
                let prev = self.opened(lane, j - 1);
                let (rl, ri) = reference(self.shape, lane, j, &prev.block);
                [self.opened(lane, j), prev, self.opened(rl, ri)]
            })
            .collect()
    }
}

/// The fill's verifier policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FillPolicy {
    /// Blocks picked and checked.
    pub blocks: usize,
    /// Least share of the reference bandwidth that passes.
    pub min_share: f64,
}

impl Default for FillPolicy {
    fn default() -> Self {
        Self {
            blocks: 64,
            min_share: 0.9,
        }
    }
}

/// The blocks the renter checks: `policy.blocks` distinct `(lane, index)` with index ≥ 2,
/// drawn with `coins`, in order.
pub fn pick_blocks(coins: &[u8; 32], shape: FillShape, policy: &FillPolicy) -> Vec<(u32, u32)> {
    let mut h = blake3::Hasher::new_keyed(coins);
    h.update(b"gpux challenge v2 coins fill");
    let mut reader = h.finalize_xof();
    let later = u64::from(shape.blocks.saturating_sub(2));
    let want = (policy.blocks as u64).min(u64::from(shape.lanes) * later) as usize;
    let mut picked = std::collections::BTreeSet::new();
    while picked.len() < want {
        let mut b = [0u8; 16];
        reader.fill(&mut b);
        let lane = (u64::from_le_bytes(b[..8].try_into().unwrap_or_default())
            % u64::from(shape.lanes)) as u32;
        let j = 2 + (u64::from_le_bytes(b[8..].try_into().unwrap_or_default()) % later) as u32;
        picked.insert((lane, j));
    }
    picked.into_iter().collect()
}

/// Why a fill failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum FillError {
    /// The prover did not open the blocks picked, with their inputs.
    #[error("the prover opened {got} of the {want} blocks picked, with their inputs")]
    Unopened {
        /// Blocks picked.
        want: usize,
        /// Opened as picked.
        got: usize,
    },
    /// An opened block is not the one committed.
    #[error("block {index} of lane {lane} is not the one committed")]
    Commitment {
        /// The lane.
        lane: u32,
        /// The block.
        index: u32,
    },
    /// A block is not what its inputs make: the memory was not filled.
    #[error("block {index} of lane {lane} is wrong: the claimed memory was not filled")]
    WrongBlock {
        /// The lane.
        lane: u32,
        /// The block.
        index: u32,
    },
    /// Correct, but slower than the policy allows.
    #[error("{achieved_gbs:.1} GB/s is {share:.0}% of the reference {reference_gbs:.1} GB/s (needs {min:.0}%)", share = achieved_gbs / reference_gbs * 100.0, min = min_share * 100.0)]
    TooSlow {
        /// Bandwidth achieved, by the verifier's clock.
        achieved_gbs: f64,
        /// The model's reference.
        reference_gbs: f64,
        /// The policy's minimum share.
        min_share: f64,
    },
}

/// Checks the openings of the fill `(seed, shape)` against `root`; `timed` is the fill's
/// time by the renter's clock against the model's reference bandwidth (GB/s). The achieved
/// bandwidth on success.
pub fn verify_fill(
    seed: &[u8; 32],
    shape: FillShape,
    root: &Hash,
    openings: &[Opening],
    timed: super::Timed,
    policy: &FillPolicy,
    coins: &[u8; 32],
) -> Result<f64, FillError> {
    let super::Timed {
        observed,
        reference: reference_gbs,
    } = timed;
    let picked = pick_blocks(coins, shape, policy);
    let key = key(seed, shape);
    let as_picked = openings
        .iter()
        .zip(&picked)
        .take_while(|([b, p, r], (lane, j))| {
            b.lane == *lane
                && b.index == *j
                && p.lane == *lane
                && p.index == j - 1
                && (r.lane, r.index) == reference(shape, *lane, *j, &p.block)
        })
        .count();
    if as_picked != picked.len() || openings.len() != picked.len() {
        return Err(FillError::Unopened {
            want: picked.len(),
            got: as_picked,
        });
    }
    for opening in openings {
        for o in opening {
            let leaf = shape.leaf(o.lane, o.index);
            if !merkle::holds(root, shape.leaves(), leaf, &block_hash(&o.block), &o.path) {
                return Err(FillError::Commitment {
                    lane: o.lane,
                    index: o.index,
                });
            }
            if o.index < 2 && o.block != first_block(key, o.lane, o.index) {
                return Err(FillError::WrongBlock {
                    lane: o.lane,
                    index: o.index,
                });
            }
        }
        let [block, prev, reference] = opening;
        if block.block != compress(&prev.block, &reference.block) {
            return Err(FillError::WrongBlock {
                lane: block.lane,
                index: block.index,
            });
        }
    }
    let achieved_gbs = shape.traffic() / observed.as_secs_f64().max(1e-9) / 1e9;
    if achieved_gbs < policy.min_share * reference_gbs {
        return Err(FillError::TooSlow {
            achieved_gbs,
            reference_gbs,
            min_share: policy.min_share,
        });
    }
    Ok(achieved_gbs)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAST: crate::challenge::Timed = crate::challenge::Timed {
        observed: std::time::Duration::from_millis(1),
        reference: 1e-9,
    };

    const SHAPE: FillShape = FillShape {
        lanes: 8,
        blocks: 256,
    };

    fn seed(i: u64) -> [u8; 32] {
        *blake3::hash(&i.to_le_bytes()).as_bytes()
    }

    fn check(seed: &[u8; 32], filled: &Filled, coins: &[u8; 32]) -> Result<f64, FillError> {
        let policy = FillPolicy::default();
        let openings = filled.open(&pick_blocks(coins, filled.shape, &policy));
        verify_fill(
            seed,
            filled.shape,
            &filled.root,
            &openings,
            FAST,
            &policy,
            coins,
        )
    }

    #[test]
    fn every_word_of_a_block_depends_on_every_word_of_its_inputs() {
        let a = first_block(1, 0, 0);
        let b = first_block(1, 0, 1);
        let out = compress(&a, &b);
        for i in [0, 5, 64, 127] {
            let mut a2 = a;
            a2[i] ^= 1;
            let changed = compress(&a2, &b);
            assert!(
                out.iter().zip(&changed).all(|(x, y)| x != y),
                "flipping word {i}"
            );
        }
        assert_ne!(first_block(1, 0, 0), first_block(1, 1, 0));
        assert_ne!(first_block(1, 0, 0), first_block(2, 0, 0));
    }

    #[test]
    fn an_honest_fill_passes_and_is_what_its_definition_says() {
        let sd = seed(1);
        let filled = fill_cpu(&sd, SHAPE, u64::MAX);
        assert_eq!(filled.shape.bytes(), 8 * 256 * 1024);
        for i in 0..20 {
            check(&sd, &filled, &seed(100 + i)).unwrap();
        }
        // The definition, sequentially: slice by slice, lane by lane.
        let key = key(&sd, SHAPE);
        let mut mem = vec![vec![[0u64; BLOCK_WORDS]; 256]; 8];
        let mut crossed = 0;
        for slice in 0..SLICES {
            for lane in 0..8u32 {
                for j in slice * 16..(slice + 1) * 16 {
                    mem[lane as usize][j as usize] = if j < 2 {
                        first_block(key, lane, j)
                    } else {
                        let prev = mem[lane as usize][j as usize - 1];
                        let (rl, ri) = reference(SHAPE, lane, j, &prev);
                        assert!(ri < j - 1 || (rl != lane && ri < slice * 16));
                        crossed += usize::from(rl != lane);
                        compress(&prev, &mem[rl as usize][ri as usize])
                    };
                }
            }
        }
        for lane in 0..8u32 {
            assert_eq!(filled.opened(lane, 255).block, mem[lane as usize][255]);
        }
        // After the first slice, most references land in other lanes.
        assert!(crossed > 8 * 240 * 6 / 10, "{crossed}");
        // Too slow for the reference.
        let policy = FillPolicy::default();
        let coins = seed(5);
        let openings = filled.open(&pick_blocks(&coins, SHAPE, &policy));
        let slow = verify_fill(
            &sd,
            SHAPE,
            &filled.root,
            &openings,
            super::super::Timed {
                observed: std::time::Duration::from_secs(10),
                reference: 100.0,
            },
            &policy,
            &coins,
        );
        assert!(matches!(slow, Err(FillError::TooSlow { .. })), "{slow:?}");
    }

    #[test]
    fn a_device_holding_60_percent_of_the_fill_is_caught_every_time() {
        for run in 0..200u64 {
            let sd = seed(run);
            let filled = fill_cpu(&sd, SHAPE, SHAPE.bytes() * 6 / 10);
            let verdict = check(&sd, &filled, &seed(run + 10_000));
            assert!(
                matches!(verdict, Err(FillError::WrongBlock { .. })),
                "run {run}: {verdict:?}"
            );
        }
        // The bound: 64 blocks, 40% of them wrong.
        assert!(0.6f64.powi(FillPolicy::default().blocks as i32) < 1e-14);
    }

    #[test]
    fn a_forged_block_and_a_wrong_opening_are_refused() {
        let sd = seed(2);
        let coins = seed(3);
        let policy = FillPolicy::default();
        let honest = fill_cpu(&sd, SHAPE, u64::MAX);
        let picks = pick_blocks(&coins, SHAPE, &policy);
        // A block changed after the commitment.
        let mut openings = honest.open(&picks);
        openings[3][0].block[9] ^= 1;
        let got = verify_fill(&sd, SHAPE, &honest.root, &openings, FAST, &policy, &coins);
        assert!(matches!(got, Err(FillError::Commitment { .. })), "{got:?}");
        // A reference other than the one the predecessor names.
        let mut openings = honest.open(&picks);
        let (lane, j) = picks[0];
        let refd = openings[0][2].clone();
        openings[0][2] = honest.opened(refd.lane, (refd.index + 1) % (j - 1));
        let got = verify_fill(&sd, SHAPE, &honest.root, &openings, FAST, &policy, &coins);
        assert!(matches!(got, Err(FillError::Unopened { .. })), "{got:?}");
        // A forged block, committed: its inputs do not make it.
        let mut forged = honest.clone();
        let leaf = SHAPE.leaf(lane, j);
        forged.memory[leaf][0] ^= 1;
        forged.tree = merkle::Tree::new(forged.memory.iter().map(block_hash).collect());
        forged.root = forged.tree.root();
        let got = check(&sd, &forged, &coins);
        assert_eq!(got, Err(FillError::WrongBlock { lane, index: j }));
    }
}
