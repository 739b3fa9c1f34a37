//! The arithmetic of the tensor challenge: the seeded INT8 matrices, the exact INT32
//! product, the row hashes, and the renter's projections.
//!
//! Every entry is a pure function of the seed and its position (a counter-based generator:
//! splitmix64 over the position, keyed by blake3 of the seed), so a GPU kernel generates any
//! tile of `A` or `B` in place, in any layout, and the renter generates only what it checks.

use super::Shape;

/// splitmix64's increment (the golden ratio).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The derive-key context of a row's hash (a Merkle leaf).
pub const ROW_CONTEXT: &str = "gpux challenge 2026-12 tensor row";

/// splitmix64's output function.
pub fn mix(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Which matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// `A`, `m × k`, row-major.
    A = 1,
    /// `B`, `k × n`, row-major.
    B = 2,
}

/// The generator key of matrix `which` for the challenge `(seed, shape)`.
pub fn key(seed: &[u8; 32], shape: Shape, which: Which) -> u64 {
    let mut h = blake3::Hasher::new_keyed(seed);
    h.update(b"gpux challenge v2 tensor");
    h.update(&[which as u8]);
    for d in [shape.m, shape.k, shape.n] {
        h.update(&d.to_le_bytes());
    }
    let bytes = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&bytes.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// Word `w` of a matrix with generator `key`: its entries `8w .. 8w + 8` (row-major) are the
/// word's little-endian bytes read as `i8`.
pub fn word(key: u64, w: u64) -> u64 {
    mix(key.wrapping_add(w.wrapping_add(1).wrapping_mul(GOLDEN)))
}

/// Entries `start .. start + out.len()` (row-major) of the matrix with generator `key`;
/// `start` and the length are multiples of 8 (every dimension is a multiple of 64).
pub fn fill(key: u64, start: u64, out: &mut [i8]) {
    for (w, chunk) in out.chunks_exact_mut(8).enumerate() {
        let bytes = word(key, start / 8 + w as u64).to_le_bytes();
        for (e, b) in chunk.iter_mut().zip(bytes) {
            *e = b as i8;
        }
    }
}

/// Row `i` of `A`.
pub fn a_row(key_a: u64, shape: Shape, i: u32) -> Vec<i8> {
    let mut row = vec![0i8; shape.k as usize];
    fill(key_a, u64::from(i) * u64::from(shape.k), &mut row);
    row
}

/// The whole of `B`, row-major.
pub fn b_matrix(key_b: u64, shape: Shape) -> Vec<i8> {
    let mut b = vec![0i8; shape.k as usize * shape.n as usize];
    fill(key_b, 0, &mut b);
    b
}

/// Row `i` of `C = A·B`, given `A`'s row and all of `B`: exact in `i32` (the shape's `k`
/// is bounded so that no sum can overflow).
pub fn c_row(a_row: &[i8], b: &[i8], n: usize, out: &mut [i32]) {
    out.iter_mut().for_each(|x| *x = 0);
    for (&a, b_row) in a_row.iter().zip(b.chunks_exact(n)) {
        let a = i32::from(a);
        for (x, &b) in out.iter_mut().zip(b_row) {
            *x += a * i32::from(b);
        }
    }
}

/// A row's little-endian bytes.
pub fn row_bytes(row: &[i32]) -> Vec<u8> {
    row.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The hash of a row (its Merkle leaf).
pub fn row_hash(row_bytes: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key(ROW_CONTEXT);
    h.update(row_bytes);
    *h.finalize().as_bytes()
}

/// Entries of a projection vector lie in `0 .. 2^PROJECTION_BITS`: a wrong row survives
/// one projection with probability at most `2^-PROJECTION_BITS`.
pub const PROJECTION_BITS: u32 = 15;

/// `B·r` for each projection vector `r` (each `n` long, entries below
/// `2^PROJECTION_BITS`), generating `B` a row at a time (the renter never holds `B`):
/// `k·n` multiply-adds per vector, exact.
pub fn project_b(key_b: u64, shape: Shape, rs: &[Vec<i64>]) -> Vec<Vec<i64>> {
    let (k, n) = (shape.k as usize, shape.n as usize);
    // 256 products of at most 2^7 · 2^15 sum within an i32 (2^30): vectorised in i32,
    // carried in i64.
    let rs32: Vec<Vec<i32>> = rs
        .iter()
        .map(|r| r.iter().map(|&x| x as i32).collect())
        .collect();
    let mut out = vec![vec![0i64; k]; rs.len()];
    let mut row = vec![0i8; n];
    for kk in 0..k {
        fill(key_b, (kk * n) as u64, &mut row);
        for (r, y) in rs32.iter().zip(out.iter_mut()) {
            y[kk] = row
                .chunks(256)
                .zip(r.chunks(256))
                .map(|(b, r)| {
                    let s: i32 = b.iter().zip(r).map(|(&b, &r)| i32::from(b) * r).sum();
                    i64::from(s)
                })
                .sum();
        }
    }
    out
}

/// `x · y`, exact in `i64` within the shape's bounds.
pub fn dot<T: Copy + Into<i64>>(x: &[T], y: &[i64]) -> i64 {
    x.iter().zip(y).map(|(&a, &b)| a.into() * b).sum()
}
