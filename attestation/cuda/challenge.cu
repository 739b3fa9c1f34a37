// The performance challenge's GPU kernels (gpux_attestation::challenge), in CUDA C.
//
// Compiled ahead of time to PTX by `scripts/ptx` (NVRTC from NVIDIA's
// nvidia-cuda-nvrtc-cu12 wheel, no GPU and no CUDA toolkit needed) for sm_75, sm_80 and
// sm_90; the PTX is committed and loaded at run time through the driver API, so a host
// needs only the NVIDIA driver. CI compiles this file again and checks the PTX is the same.
//
// Every definition here must match the CPU's in attestation/src/challenge/ bit for bit:
// the generator (tensor.rs: splitmix64 over positions), the product (exact i8 x i8 -> i32)
// and the fill (fill.rs: lanes of 128-word blocks in 16 slices, seven butterfly rounds).
// The hashes (row and block leaves, Merkle levels) are BLAKE3 in derive-key mode
// (blake3.cuh), as the CPU computes them with the blake3 crate.
// Not yet run on a GPU: scripts/gpu-check is where it is first checked against the CPU.

#include <mma.h>

#include "blake3.cuh"

#define GOLDEN 0x9E3779B97F4A7C15ULL
#define BLOCK_WORDS 128
#define SLICES 16

__device__ __forceinline__ u64 mix(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// Word `w` of a matrix with generator `key` (tensor.rs `word`).
__device__ __forceinline__ u64 word(u64 key, u64 w) {
    return mix(key + (w + 1) * GOLDEN);
}

// Entry `idx` (row-major) of a matrix with generator `key`: byte idx % 8 of word idx / 8.
__device__ __forceinline__ signed char entry(u64 key, u64 idx) {
    return (signed char)((word(key, idx >> 3) >> (8 * (idx & 7))) & 0xff);
}

// `entries` entries of A (m x k, row-major) from word `first` on (row i starts at word
// i * k / 8) into `a`.
extern "C" __global__ void gen_a(signed char* a, u64 key, u64 first, u64 entries) {
    u64 w = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (w * 8 >= entries) return;
    u64 v = word(key, first + w);
    for (int b = 0; b < 8; b++) a[w * 8 + b] = (signed char)((v >> (8 * b)) & 0xff);
}

// B (k x n, row-major in the generator's order) into `bt`, transposed: bt[j * k + kk] =
// B[kk][j], so that each product is a dot product over contiguous memory.
extern "C" __global__ void gen_bt(signed char* bt, u64 key, unsigned k, unsigned n) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (u64)k * n) return;
    u64 j = t / k, kk = t % k;
    bt[t] = entry(key, kk * n + j);
}

// C = A * B on the tensor cores (WMMA, 16 x 16 x 16 tiles of i8 summed in i32): one warp
// per 16 x 16 tile of C; m, n, k are multiples of 64. A is row-major (lda = k); bt is B
// transposed, read as B column-major (ldb = k); C is row-major (ldc = n).
extern "C" __global__ void product(const signed char* a, const signed char* bt, int* c,
                                   unsigned m, unsigned n, unsigned k) {
    using namespace nvcuda;
    unsigned warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    unsigned tiles_n = n / 16;
    unsigned ti = warp / tiles_n, tj = warp % tiles_n;
    if (ti >= m / 16) return;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, signed char, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, signed char, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, int> acc;
    wmma::fill_fragment(acc, 0);
    for (unsigned kk = 0; kk < k; kk += 16) {
        wmma::load_matrix_sync(fa, a + (u64)ti * 16 * k + kk, k);
        wmma::load_matrix_sync(fb, bt + (u64)tj * 16 * k + kk, k);
        wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c + (u64)ti * 16 * n + tj * 16, acc, n, wmma::mem_row_major);
}

// Block j (0 or 1) of `lane` from the seed (fill.rs `first_block`), word i.
__device__ __forceinline__ u64 first_word(u64 key, unsigned lane, unsigned j, unsigned i) {
    u64 base = (((u64)lane << 1) | (j & 1)) << 7;
    return word(key, base | i);
}

__device__ __forceinline__ u64 rotl(u64 x, unsigned r) {
    r &= 63;
    return r == 0 ? x : (x << r) | (x >> (64 - r));
}

// One slice of the fill (fill.rs `fill_slice`): one warp per lane, each thread holding
// words 4t .. 4t + 3 of a block. Blocks of the slices before are all written (a launch per
// slice). `mem` holds lane after lane, `blocks` blocks of 128 words each.
extern "C" __global__ void fill_slice(u64* mem, u64 key, unsigned lanes, unsigned blocks,
                                      unsigned start, unsigned kept) {
    unsigned lane = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    unsigned t = threadIdx.x % 32;
    if (lane >= lanes) return;
    unsigned slice_len = blocks / SLICES;
    unsigned slice = start / slice_len;
    u64* own = mem + (u64)lane * blocks * BLOCK_WORDS;
    u64 prev[4];
    if (start > 0) {
        for (int s = 0; s < 4; s++) prev[s] = own[(u64)(start - 1) * BLOCK_WORDS + 4 * t + s];
    }
    for (unsigned j = start; j < start + slice_len; j++) {
        u64 x[4];
        if (j < 2) {
            for (int s = 0; s < 4; s++) x[s] = first_word(key, lane, j, 4 * t + s);
        } else {
            // The reference, read from the predecessor's words 0 and 1 (thread 0's).
            u64 w0 = __shfl_sync(0xffffffffu, prev[0], 0);
            u64 w1 = __shfl_sync(0xffffffffu, prev[1], 0);
            unsigned other = slice == 0 ? lane : (unsigned)(w1 % lanes);
            unsigned span = other == lane ? j - 1 : slice * slice_len;
            unsigned idx = (unsigned)(w0 % span);
            const u64* r = mem + ((u64)other * blocks + idx) * BLOCK_WORDS + 4 * t;
            u64 in[4];
            for (int s = 0; s < 4; s++) {
                in[s] = prev[s] ^ r[s];
                x[s] = in[s];
            }
            for (unsigned round = 0; round < 7; round++) {
                u64 partner[4];
                if (round < 2) {
                    for (int s = 0; s < 4; s++) partner[s] = x[s ^ (1 << round)];
                } else {
                    for (int s = 0; s < 4; s++)
                        partner[s] = __shfl_xor_sync(0xffffffffu, x[s], 1 << (round - 2));
                }
                for (int s = 0; s < 4; s++) x[s] = mix(x[s] + rotl(partner[s], 7 + 8 * round));
            }
            for (int s = 0; s < 4; s++) x[s] ^= in[s];
        }
        u64* out = own + (u64)j * BLOCK_WORDS + 4 * t;
        for (int s = 0; s < 4; s++) {
            out[s] = j < kept ? x[s] : 0;
            prev[s] = out[s];
        }
    }
}

// Copies a context key (8 words) out of global memory.
__device__ __forceinline__ void load_key(const u32* key, u32* k) {
    for (int i = 0; i < 8; i++) k[i] = key[i];
}

// The chaining value of every chunk of `rows` rows of `c` (n values each, 4n bytes): one
// thread per chunk, into `cvs` (8 words each, row after row). A row of one chunk is hashed
// whole here (its chunk is the root).
extern "C" __global__ void hash_row_chunks(const int* c, unsigned rows, unsigned n,
                                           const u32* key, u32* cvs) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned row_bytes = 4 * n;
    unsigned chunks = (row_bytes + B3_CHUNK_BYTES - 1) / B3_CHUNK_BYTES;
    if (t >= (u64)rows * chunks) return;
    u64 r = t / chunks;
    unsigned chunk = (unsigned)(t % chunks);
    unsigned bytes = min(B3_CHUNK_BYTES, row_bytes - chunk * B3_CHUNK_BYTES);
    const u32* words = (const u32*)(c + r * n) + chunk * (B3_CHUNK_BYTES / 4);
    u32 k[8];
    load_key(key, k);
    b3_chunk(words, bytes, chunk, k, chunks == 1, cvs + 8 * t);
}

// Each row's hash (its Merkle leaf) from its chunks' chaining values: one thread per row,
// into `leaves` from leaf `first` on.
extern "C" __global__ void hash_rows(const u32* cvs, unsigned rows, unsigned n,
                                     const u32* key, u32* leaves, u64 first) {
    u64 r = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    unsigned chunks = (4 * n + B3_CHUNK_BYTES - 1) / B3_CHUNK_BYTES;
    u32* out = leaves + 8 * (first + r);
    const u32* own = cvs + 8 * r * chunks;
    if (chunks == 1) {
        for (int i = 0; i < 8; i++) out[i] = own[i];
        return;
    }
    u32 k[8];
    load_key(key, k);
    b3_merge(own, chunks, k, out);
}

// Each fill block's hash (one chunk: 1 KiB): one thread per block.
extern "C" __global__ void hash_blocks(const u64* mem, u64 count, const u32* key,
                                       u32* leaves) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= count) return;
    u32 k[8];
    load_key(key, k);
    b3_chunk((const u32*)(mem + t * BLOCK_WORDS), B3_CHUNK_BYTES, 0, k, true, leaves + 8 * t);
}

// One level of a Merkle tree (merkle.rs): node i of the level above is the hash of nodes
// 2i and 2i + 1 below, `pad` (the level's padding subtree) where 2i + 1 is past the end.
extern "C" __global__ void merkle_level(const u32* below, u64 below_count, const u32* pad,
                                        const u32* key, u32* above) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (below_count + 1) / 2) return;
    u32 block[16];
    const u32* right = 2 * i + 1 < below_count ? below + 8 * (2 * i + 1) : pad;
    for (int w = 0; w < 8; w++) {
        block[w] = below[8 * 2 * i + w];
        block[w + 8] = right[w];
    }
    u32 k[8];
    load_key(key, k);
    b3_chunk(block, 64, 0, k, true, above + 8 * i);
}
