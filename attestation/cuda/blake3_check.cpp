// Runs the CUDA kernels' BLAKE3 (blake3.cuh) on the host, as the kernels use it: a chaining
// value per chunk, then the merge. attestation's tests compile this with the system's C++
// compiler and compare its answers with the blake3 crate's.
//
// Input, a line per hash: the context key (64 hex digits) and the data (hex, a whole number
// of 64-byte blocks, at most 64 KiB). Output, a line per hash: the hash (64 hex digits).

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "blake3.cuh"

static std::vector<u32> words_of(const std::string& hex) {
    std::vector<u32> words(hex.size() / 8, 0);
    for (size_t i = 0; i < hex.size() / 2; i++) {
        u32 byte = (u32)std::stoul(hex.substr(2 * i, 2), nullptr, 16);
        words[i / 4] |= byte << (8 * (i % 4));
    }
    return words;
}

int main() {
    std::string key_hex, data_hex;
    while (std::cin >> key_hex >> data_hex) {
        std::vector<u32> key = words_of(key_hex), data = words_of(data_hex);
        u32 bytes = (u32)data.size() * 4;
        if (key.size() != 8 || bytes == 0 || bytes % B3_BLOCK_BYTES != 0 || bytes > 65536) {
            std::fprintf(stderr, "not a key and a whole number of blocks up to 64 KiB\n");
            return 2;
        }
        u32 chunks = (bytes + B3_CHUNK_BYTES - 1) / B3_CHUNK_BYTES;
        std::vector<u32> cvs(8 * chunks);
        for (u32 c = 0; c < chunks; c++) {
            u32 len = bytes - c * B3_CHUNK_BYTES;
            if (len > B3_CHUNK_BYTES) len = B3_CHUNK_BYTES;
            b3_chunk(data.data() + c * (B3_CHUNK_BYTES / 4), len, c, key.data(), chunks == 1,
                     cvs.data() + 8 * c);
        }
        u32 out[8];
        if (chunks == 1) {
            for (int i = 0; i < 8; i++) out[i] = cvs[i];
        } else {
            b3_merge(cvs.data(), chunks, key.data(), out);
        }
        for (int i = 0; i < 32; i++) std::printf("%02x", (out[i / 4] >> (8 * (i % 4))) & 0xff);
        std::printf("\n");
    }
    return 0;
}
