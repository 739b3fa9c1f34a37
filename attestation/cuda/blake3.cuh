// BLAKE3 for the challenge's hashes (gpux_attestation::challenge), in C that compiles both
// as CUDA (device code, through NVRTC) and as C++ on the host: attestation's tests compile
// it with the system's C++ compiler and check it against the blake3 crate.
//
// Only what the challenge hashes: inputs of whole 64-byte blocks (a row of the product is
// 4n bytes, n a multiple of 64; a fill block 1 KiB; a Merkle node 64 bytes), keyed with a
// derive-key context key (computed by the caller: blake3::hazmat::hash_derive_key_context),
// read as little-endian 32-bit words, as every GPU and x86 host stores them.

#ifndef GPUX_BLAKE3_CUH
#define GPUX_BLAKE3_CUH

#ifdef __CUDACC__
#define GPUX_HD __host__ __device__ __forceinline__
#else
#define GPUX_HD static inline
#endif

typedef unsigned int u32;
typedef unsigned long long u64;

#define B3_CHUNK_START 1u
#define B3_CHUNK_END 2u
#define B3_PARENT 4u
#define B3_ROOT 8u
#define B3_DERIVE_KEY_MATERIAL 64u
#define B3_CHUNK_BYTES 1024u
#define B3_BLOCK_BYTES 64u
// A row is at most 64 KiB (n <= 16,384): 64 chunks, a stack of at most 7 subtrees.
#define B3_MAX_DEPTH 8

GPUX_HD u32 b3_rotr(u32 x, u32 n) { return (x >> n) | (x << (32 - n)); }

GPUX_HD void b3_g(u32* s, int a, int b, int c, int d, u32 x, u32 y) {
    s[a] = s[a] + s[b] + x;
    s[d] = b3_rotr(s[d] ^ s[a], 16);
    s[c] = s[c] + s[d];
    s[b] = b3_rotr(s[b] ^ s[c], 12);
    s[a] = s[a] + s[b] + y;
    s[d] = b3_rotr(s[d] ^ s[a], 8);
    s[c] = s[c] + s[d];
    s[b] = b3_rotr(s[b] ^ s[c], 7);
}

// The compression function: `out` (8 words) is the chaining value of compressing the
// 64-byte block `m` into `cv` (`out` may be `cv`).
GPUX_HD void b3_compress(const u32* cv, const u32* block, u64 counter, u32 flags, u32* out) {
    u32 s[16] = {cv[0], cv[1], cv[2], cv[3], cv[4], cv[5], cv[6], cv[7],
                 0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
                 (u32)counter, (u32)(counter >> 32), B3_BLOCK_BYTES, flags};
    u32 m[16];
    for (int i = 0; i < 16; i++) m[i] = block[i];
    for (int round = 0; round < 7; round++) {
        b3_g(s, 0, 4, 8, 12, m[0], m[1]);
        b3_g(s, 1, 5, 9, 13, m[2], m[3]);
        b3_g(s, 2, 6, 10, 14, m[4], m[5]);
        b3_g(s, 3, 7, 11, 15, m[6], m[7]);
        b3_g(s, 0, 5, 10, 15, m[8], m[9]);
        b3_g(s, 1, 6, 11, 12, m[10], m[11]);
        b3_g(s, 2, 7, 8, 13, m[12], m[13]);
        b3_g(s, 3, 4, 9, 14, m[14], m[15]);
        // The message permutation.
        u32 p[16] = {m[2], m[6], m[3], m[10], m[7], m[0], m[4], m[13],
                     m[1], m[11], m[12], m[5], m[9], m[14], m[15], m[8]};
        for (int i = 0; i < 16; i++) m[i] = p[i];
    }
    for (int i = 0; i < 8; i++) out[i] = s[i] ^ s[i + 8];
}

// The chaining value of chunk `index` (`bytes`, a multiple of 64 up to 1 KiB, at `words`)
// under `key`; `root` when it is the input's only chunk (its output is then the hash).
GPUX_HD void b3_chunk(const u32* words, u32 bytes, u64 index, const u32* key, bool root,
                      u32* out) {
    u32 cv[8];
    for (int i = 0; i < 8; i++) cv[i] = key[i];
    u32 blocks = bytes / B3_BLOCK_BYTES;
    for (u32 b = 0; b < blocks; b++) {
        u32 flags = B3_DERIVE_KEY_MATERIAL;
        if (b == 0) flags |= B3_CHUNK_START;
        if (b + 1 == blocks) flags |= B3_CHUNK_END | (root ? B3_ROOT : 0u);
        b3_compress(cv, words + 16 * b, index, flags, cv);
    }
    for (int i = 0; i < 8; i++) out[i] = cv[i];
}

// A parent node's chaining value (or, with `root`, the hash) over two children's.
GPUX_HD void b3_parent(const u32* left, const u32* right, const u32* key, bool root,
                       u32* out) {
    u32 block[16];
    for (int i = 0; i < 8; i++) {
        block[i] = left[i];
        block[i + 8] = right[i];
    }
    b3_compress(key, block, 0, B3_DERIVE_KEY_MATERIAL | B3_PARENT | (root ? B3_ROOT : 0u),
                out);
}

// The hash of an input of `chunks` chunks (more than one) from their chaining values, in
// BLAKE3's tree: each finished subtree merged as soon as its sibling is (a stack), the
// last chunk joined from the right, the top parent the root.
GPUX_HD void b3_merge(const u32* cvs, u32 chunks, const u32* key, u32* out) {
    u32 stack[B3_MAX_DEPTH][8];
    int depth = 0;
    u32 cv[8];
    for (u32 c = 0; c + 1 < chunks; c++) {
        for (int i = 0; i < 8; i++) cv[i] = cvs[8 * c + i];
        for (u32 total = c + 1; (total & 1) == 0; total >>= 1) {
            depth--;
            b3_parent(stack[depth], cv, key, false, cv);
        }
        for (int i = 0; i < 8; i++) stack[depth][i] = cv[i];
        depth++;
    }
    for (int i = 0; i < 8; i++) cv[i] = cvs[8 * (chunks - 1) + i];
    while (depth > 0) {
        depth--;
        b3_parent(stack[depth], cv, key, depth == 0, cv);
    }
    for (int i = 0; i < 8; i++) out[i] = cv[i];
}

#endif
