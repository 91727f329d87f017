// Weight dequantization, one traits struct per kiln_format, named
// fmt_<the format's short name> (include/kiln.h's table): the emitter
// spells the type from the table, so a format without traits here fails
// to compile rather than decode wrongly.
//
// Storage is kiln's (graph/format.c, graph/quant.c, graph/quant_ggml.c):
// row n of W[N, K] is (K / block) * block_bytes bytes of data starting at
// n times that; separate scales are ceil(N / scale_rows) x
// ceil(K / scale_cols) elements, row-major; GGML blocks carry theirs
// inline. Every product is formed in the CPU reference's order and
// rounding (__fmul_rn where a multiply feeds an add, so no FMA contraction
// changes a bit), so a dequantized weight equals kiln_dequantize's.
//
// Each traits struct has:
//   block, block_bytes   as in the format table
//   chunk                elements one call decodes: a run along K that
//                        shares its scale reads (divides block)
//   load<K>(w, n, k0, out)   out[i] = W[n, k0 + i] for i < chunk, with k0
//                        a multiple of chunk and k0 + chunk <= K
#pragma once

#include "kiln/kiln_types.cuh"

namespace kiln {

// Where a weight lives on the device.
struct weight_view {
    const u8 *__restrict__ data;
    const u8 *__restrict__ scale; // the separate scale array, as bytes
    float global;                 // NVFP4's global scale; 1 elsewhere
};

template <int Block, int BlockBytes, int K>
__device__ __forceinline__ const u8 *row_of(const weight_view &w, int n)
{
    return w.data + (i64)n * ((K / Block) * BlockBytes);
}

__device__ __forceinline__ float scale_f32(const weight_view &w, i64 i)
{
    return reinterpret_cast<const float *>(w.scale)[i];
}

// ------------------------------------------------------------ plain types

struct fmt_f32 {
    static constexpr int block = 1, block_bytes = 4, chunk = 1;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        out[0] = reinterpret_cast<const float *>(row_of<block, block_bytes, K>(w, n))[k0];
    }
};

struct fmt_f16 {
    static constexpr int block = 1, block_bytes = 2, chunk = 1;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        const u16 *row = reinterpret_cast<const u16 *>(row_of<block, block_bytes, K>(w, n));
        out[0] = f16_to_f32(row[k0]);
    }
};

struct fmt_bf16 {
    static constexpr int block = 1, block_bytes = 2, chunk = 1;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        const u16 *row = reinterpret_cast<const u16 *>(row_of<block, block_bytes, K>(w, n));
        out[0] = bf16_to_f32(row[k0]);
    }
};

// ---------------------------------------------------------------- FP8

// w = e4m3 · s with s one f32 for the tensor, per row, or per 128x128 tile.
struct fmt_fp8 {
    static constexpr int block = 1, block_bytes = 1, chunk = 1;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        out[0] = e4m3_to_f32(row_of<block, block_bytes, K>(w, n)[k0]) * scale_f32(w, 0);
    }
};

struct fmt_fp8_channel {
    static constexpr int block = 1, block_bytes = 1, chunk = 1;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        out[0] = e4m3_to_f32(row_of<block, block_bytes, K>(w, n)[k0]) * scale_f32(w, n);
    }
};

struct fmt_fp8_block {
    static constexpr int block = 1, block_bytes = 1, chunk = 1;
    static constexpr int tile = 128;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        constexpr int tiles_k = (K + tile - 1) / tile;
        float s = scale_f32(w, (i64)(n / tile) * tiles_k + k0 / tile);
        out[0] = e4m3_to_f32(row_of<block, block_bytes, K>(w, n)[k0]) * s;
    }
};

// ------------------------------------------------------------- OCP MX

// 32 E4M3 per block, one E8M0 scale per block in a [N, K/32] array.
struct fmt_mxfp8 {
    static constexpr int block = 32, block_bytes = 32, chunk = 8;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        const u8 *q = row_of<block, block_bytes, K>(w, n) + k0;
        float x = e8m0_to_f32(w.scale[(i64)n * (K / block) + k0 / block]);
#pragma unroll
        for (int i = 0; i < chunk; i++)
            out[i] = x * e4m3_to_f32(q[i]);
    }
};

// 32 E2M1 per block, two per byte with the even element in the low nibble.
struct fmt_mxfp4 {
    static constexpr int block = 32, block_bytes = 16, chunk = 8;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        const u8 *q = row_of<block, block_bytes, K>(w, n) + k0 / 2;
        float x = e8m0_to_f32(w.scale[(i64)n * (K / block) + k0 / block]);
#pragma unroll
        for (int i = 0; i < chunk / 2; i++) {
            out[2 * i] = x * e2m1_to_f32(q[i] & 0xFu);
            out[2 * i + 1] = x * e2m1_to_f32(q[i] >> 4);
        }
    }
};

// ----------------------------------------------------------------- NVFP4

// 16 E2M1 per block, a UE4M3 scale per block in [N, K/16], times the f32
// global: d = float(scale) · global first, then e2m1 · d.
struct fmt_nvfp4 {
    static constexpr int block = 16, block_bytes = 8, chunk = 8;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        const u8 *q = row_of<block, block_bytes, K>(w, n) + k0 / 2;
        float d = ue4m3_to_f32(w.scale[(i64)n * (K / block) + k0 / block]) * w.global;
#pragma unroll
        for (int i = 0; i < chunk / 2; i++) {
            out[2 * i] = e2m1_to_f32(q[i] & 0xFu) * d;
            out[2 * i + 1] = e2m1_to_f32(q[i] >> 4) * d;
        }
    }
};

// ------------------------------------------------------------------- GGML

// The GGML split-half blocks of 32 (Q4_0, GGML MXFP4): element j < 16 is
// the low nibble of qs[j], element j + 16 its high nibble. A chunk of 8
// never straddles the halves.
template <int Chunk>
__device__ __forceinline__ void split_half_nibbles(const u8 *qs, int j0, u32 (&nib)[Chunk])
{
    const u8 *p = qs + (j0 & 15);
    int shift = j0 < 16 ? 0 : 4;
#pragma unroll
    for (int i = 0; i < Chunk; i++)
        nib[i] = (p[i] >> shift) & 0xFu;
}

// 32 values: f16 d; int8 qs[32]. y = q · d.
struct fmt_q8_0 {
    static constexpr int block = 32, block_bytes = 34, chunk = 8;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        const u8 *b = row_of<block, block_bytes, K>(w, n) + (k0 / block) * block_bytes;
        float d = f16_to_f32((u16)load_u16_bytes(b));
        const u8 *qs = b + 2 + k0 % block;
#pragma unroll
        for (int i = 0; i < chunk; i++)
            out[i] = (float)(i8)qs[i] * d;
    }
};

// 32 values: f16 d; uint8 qs[16], split halves. y = (q - 8) · d.
struct fmt_q4_0 {
    static constexpr int block = 32, block_bytes = 18, chunk = 8;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        const u8 *b = row_of<block, block_bytes, K>(w, n) + (k0 / block) * block_bytes;
        float d = f16_to_f32((u16)load_u16_bytes(b));
        u32 nib[chunk];
        split_half_nibbles<chunk>(b + 2, k0 % block, nib);
#pragma unroll
        for (int i = 0; i < chunk; i++)
            out[i] = (float)((int)nib[i] - 8) * d;
    }
};

// 32 values: f16 d; f16 m; uint8 qs[16], split halves. y = d·q + m.
struct fmt_q4_1 {
    static constexpr int block = 32, block_bytes = 20, chunk = 8;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        const u8 *b = row_of<block, block_bytes, K>(w, n) + (k0 / block) * block_bytes;
        float d = f16_to_f32((u16)load_u16_bytes(b));
        float m = f16_to_f32((u16)load_u16_bytes(b + 2));
        u32 nib[chunk];
        split_half_nibbles<chunk>(b + 4, k0 % block, nib);
#pragma unroll
        for (int i = 0; i < chunk; i++)
            out[i] = __fmul_rn((float)nib[i], d) + m;
    }
};

// 32 values: E8M0 e; uint8 qs[16], split halves. ggml doubles the E2M1
// table and halves the scale: y = (2 · e2m1) · 2^(e - 128), every product
// exact.
struct fmt_ggml_mxfp4 {
    static constexpr int block = 32, block_bytes = 17, chunk = 8;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        const u8 *b = row_of<block, block_bytes, K>(w, n) + (k0 / block) * block_bytes;
        float d = e8m0_half_to_f32(b[0]);
        u32 nib[chunk];
        split_half_nibbles<chunk>(b + 1, k0 % block, nib);
#pragma unroll
        for (int i = 0; i < chunk; i++)
            out[i] = (2.0f * e2m1_to_f32(nib[i])) * d;
    }
};

// Sub-block j's 6-bit scale and min from the 12 packed bytes s of a Q4_K
// or Q5_K block (ggml's get_scale_min_k4).
__device__ __forceinline__ void k4_scale_min(const u8 *s, int j, u32 &sc, u32 &m)
{
    if (j < 4) {
        sc = s[j] & 63u;
        m = s[j + 4] & 63u;
    } else {
        sc = (s[j + 4] & 0xFu) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// 256 values: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128
// bytes of nibbles. Sub-block j (32 values) has scale sc and min m
// (ggml's get_scale_min_k4); each 64 values use 32 bytes of qs, low
// nibbles for sub-block 2c, high for 2c + 1. y = (d·sc)·q − dmin·m.
struct fmt_q4_k {
    static constexpr int block = 256, block_bytes = 144, chunk = 16;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        const u8 *b = row_of<block, block_bytes, K>(w, n) + (k0 / block) * block_bytes;
        int p = k0 % block;
        int j = p / 32;
        u32 sc, m;
        k4_scale_min(b + 4, j, sc, m);
        float d1 = f16_to_f32((u16)load_u16_bytes(b)) * (float)sc;
        float m1 = f16_to_f32((u16)load_u16_bytes(b + 2)) * (float)m;
        const u8 *qs = b + 16 + 32 * (j / 2) + p % 32;
        int shift = (j & 1) * 4;
#pragma unroll
        for (int i = 0; i < chunk; i++)
            out[i] = __fmul_rn(d1, (float)((qs[i] >> shift) & 0xFu)) - m1;
    }
};

// 256 values: ql[128], qh[64], int8 scales[16], f16 d. Two halves of 128;
// in a half, quarter t (32 values) takes its low 4 bits from ql (bytes
// 0..31 for t = 0, 2, bytes 32..63 for t = 1, 3; low nibbles for t < 2,
// high for t >= 2) and its top 2 bits from qh bits 2t, 2t+1; each 16
// values share a scale. y = (d · sc) · (q − 32).
struct fmt_q6_k {
    static constexpr int block = 256, block_bytes = 210, chunk = 16;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        const u8 *b = row_of<block, block_bytes, K>(w, n) + (k0 / block) * block_bytes;
        int p = k0 % block;
        int half = p / 128, t = (p % 128) / 32, l0 = p % 32;
        const u8 *ql = b + 64 * half + 32 * (t & 1) + l0;
        const u8 *qh = b + 128 + 32 * half + l0;
        int lo_shift = t < 2 ? 0 : 4, hi_shift = 2 * t;
        float sc = (float)(i8)b[192 + 8 * half + l0 / 16 + 2 * t];
        float ds = f16_to_f32((u16)load_u16_bytes(b + 208)) * sc;
#pragma unroll
        for (int i = 0; i < chunk; i++) {
            int q = (int)(((ql[i] >> lo_shift) & 0xFu) | (((qh[i] >> hi_shift) & 3u) << 4)) - 32;
            out[i] = ds * (float)q;
        }
    }
};

// The fifth bits of Q5_0 / Q5_1: a little-endian u32 at any byte, bit j
// for element j.
__device__ __forceinline__ u32 load_u32_bytes(const u8 *p)
{
    return (u32)p[0] | (u32)p[1] << 8 | (u32)p[2] << 16 | (u32)p[3] << 24;
}

// 32 values: f16 d; u32 qh; uint8 qs[16], split halves; element j's fifth
// bit is bit j of qh. y = (q - 16) · d.
struct fmt_q5_0 {
    static constexpr int block = 32, block_bytes = 22, chunk = 8;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        const u8 *b = row_of<block, block_bytes, K>(w, n) + (k0 / block) * block_bytes;
        float d = f16_to_f32((u16)load_u16_bytes(b));
        const int j0 = k0 % block;
        u32 qh = load_u32_bytes(b + 2) >> j0;
        u32 nib[chunk];
        split_half_nibbles<chunk>(b + 6, j0, nib);
#pragma unroll
        for (int i = 0; i < chunk; i++)
            out[i] = (float)((int)(nib[i] | ((qh >> i) & 1u) << 4) - 16) * d;
    }
};

// 32 values: f16 d; f16 m; u32 qh; uint8 qs[16], as Q5_0. y = q · d + m.
struct fmt_q5_1 {
    static constexpr int block = 32, block_bytes = 24, chunk = 8;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        const u8 *b = row_of<block, block_bytes, K>(w, n) + (k0 / block) * block_bytes;
        float d = f16_to_f32((u16)load_u16_bytes(b));
        float m = f16_to_f32((u16)load_u16_bytes(b + 2));
        const int j0 = k0 % block;
        u32 qh = load_u32_bytes(b + 4) >> j0;
        u32 nib[chunk];
        split_half_nibbles<chunk>(b + 8, j0, nib);
#pragma unroll
        for (int i = 0; i < chunk; i++)
            out[i] = __fmul_rn((float)(nib[i] | ((qh >> i) & 1u) << 4), d) + m;
    }
};

// The 2-bit levels of Q2_K and Q3_K: in each half of 128 values, byte l of
// the half's 32 holds values l, l + 32, l + 64, l + 96 at bits 0, 2, 4, 6.
// A chunk of 16 lies in one run of 32.
__device__ __forceinline__ const u8 *two_bit_bytes(const u8 *qs, int p, int &shift)
{
    shift = 2 * ((p % 128) / 32);
    return qs + 32 * (p / 128) + p % 32;
}

// 256 values: uint8 scales[16] (scale low nibble, min high), qs[64], f16
// d, f16 dmin. Each 16 values share a scale and a min.
// y = (d·sc)·q − dmin·m.
struct fmt_q2_k {
    static constexpr int block = 256, block_bytes = 84, chunk = 16;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        const u8 *b = row_of<block, block_bytes, K>(w, n) + (k0 / block) * block_bytes;
        const int p = k0 % block;
        const u32 sc = b[p / 16];
        float dl = f16_to_f32((u16)load_u16_bytes(b + 80)) * (float)(sc & 0xFu);
        float ml = f16_to_f32((u16)load_u16_bytes(b + 82)) * (float)(sc >> 4);
        int shift;
        const u8 *q = two_bit_bytes(b + 16, p, shift);
#pragma unroll
        for (int i = 0; i < chunk; i++)
            out[i] = __fmul_rn(dl, (float)((q[i] >> shift) & 3u)) - ml;
    }
};

// 256 values: hmask[32], qs[64], 12 bytes of 6-bit scales, f16 d. Value
// v's level is its 2 bits less 4 unless bit v / 32 of hmask[v % 32] is
// set; sub-block j's scale keeps its low 4 bits in nibble j / 8 of
// scales[j % 8] and its high 2 bits at bit 2·(j / 4) of scales[8 + j % 4].
// y = (d·(sc − 32))·q.
struct fmt_q3_k {
    static constexpr int block = 256, block_bytes = 110, chunk = 16;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        const u8 *b = row_of<block, block_bytes, K>(w, n) + (k0 / block) * block_bytes;
        const int p = k0 % block, j = p / 16;
        const u8 *s = b + 96;
        const u32 sc = ((u32)(s[j % 8] >> (4 * (j / 8))) & 0xFu) |
                       (((u32)s[8 + j % 4] >> (2 * (j / 4))) & 3u) << 4;
        float dl = f16_to_f32((u16)load_u16_bytes(b + 108)) * (float)((int)sc - 32);
        int shift;
        const u8 *q = two_bit_bytes(b + 32, p, shift);
        const u8 *hm = b + p % 32;
        const int hbit = p / 32;
#pragma unroll
        for (int i = 0; i < chunk; i++) {
            int l = (int)((q[i] >> shift) & 3u) - (((hm[i] >> hbit) & 1u) ? 0 : 4);
            out[i] = dl * (float)l;
        }
    }
};

// 256 values: f16 d, f16 dmin, Q4_K's 12 bytes of 6-bit scales and mins,
// qh[32], qs[128]. As Q4_K, with the fifth bit of value v at bit v / 32 of
// qh[v % 32]. y = (d·sc)·q − dmin·m.
struct fmt_q5_k {
    static constexpr int block = 256, block_bytes = 176, chunk = 16;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        const u8 *b = row_of<block, block_bytes, K>(w, n) + (k0 / block) * block_bytes;
        int p = k0 % block;
        int j = p / 32;
        u32 sc, m;
        k4_scale_min(b + 4, j, sc, m);
        float d1 = f16_to_f32((u16)load_u16_bytes(b)) * (float)sc;
        float m1 = f16_to_f32((u16)load_u16_bytes(b + 2)) * (float)m;
        const u8 *qs = b + 48 + 32 * (j / 2) + p % 32;
        const u8 *qh = b + 16 + p % 32;
        int shift = (j & 1) * 4;
#pragma unroll
        for (int i = 0; i < chunk; i++) {
            u32 q = ((qs[i] >> shift) & 0xFu) | ((qh[i] >> j) & 1u) << 4;
            out[i] = __fmul_rn(d1, (float)q) - m1;
        }
    }
};

// ggml's kvalues_iq4nl, level i as the int8 in byte i % 4 of word i / 4:
// two byte permutes and a select, no table in memory.
__device__ __forceinline__ float iq4nl_value(u32 i)
{
    const u32 lo = __byte_perm(0xBFAD9881u, 0xF6EADDCFu, i & 7u);  // -127 -104 -83 -65 -49 -35 -22 -10
    const u32 hi = __byte_perm(0x26190D01u, 0x71594535u, i & 7u);  // 1 13 25 38 53 69 89 113
    return (float)(i8)(u8)((i & 8u) ? hi : lo);
}

// 32 values: f16 d; uint8 qs[16], split halves, each nibble a level of
// the codebook. y = d · kvalues[q].
struct fmt_iq4_nl {
    static constexpr int block = 32, block_bytes = 18, chunk = 8;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        const u8 *b = row_of<block, block_bytes, K>(w, n) + (k0 / block) * block_bytes;
        float d = f16_to_f32((u16)load_u16_bytes(b));
        u32 nib[chunk];
        split_half_nibbles<chunk>(b + 2, k0 % block, nib);
#pragma unroll
        for (int i = 0; i < chunk; i++)
            out[i] = d * iq4nl_value(nib[i]);
    }
};

// 256 values: f16 d; u16 scales_h; scales_l[4]; qs[128], blocks of 32 as
// IQ4_NL. Block ib's 6-bit scale keeps its low 4 bits in nibble ib % 2 of
// scales_l[ib / 2] and its high 2 bits at bit 2·ib of scales_h.
// y = (d·(ls − 32))·kvalues[q].
struct fmt_iq4_xs {
    static constexpr int block = 256, block_bytes = 136, chunk = 8;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        const u8 *b = row_of<block, block_bytes, K>(w, n) + (k0 / block) * block_bytes;
        const int p = k0 % block, ib = p / 32;
        const u32 ls = ((u32)(b[4 + ib / 2] >> (4 * (ib % 2))) & 0xFu) |
                       ((load_u16_bytes(b + 2) >> (2 * ib)) & 3u) << 4;
        float dl = f16_to_f32((u16)load_u16_bytes(b)) * (float)((int)ls - 32);
        u32 nib[chunk];
        split_half_nibbles<chunk>(b + 8 + 16 * ib, p % 32, nib);
#pragma unroll
        for (int i = 0; i < chunk; i++)
            out[i] = dl * iq4nl_value(nib[i]);
    }
};

// ------------------------------------------------------ integer groups

// compressed-tensors pack-quantized (graph/quant_int.c): element k of a
// row is the Bits-bit field at bit Bits·k of the row's int32 words, holding
// q + 2^(Bits−1); scales are f32 [N, K / group] (group 0: one per row), and
// for ZeroPoint int8 zero points [N, K / group] follow them. A chunk is one
// word and a group whole words, so a chunk has one scale. w = (q − zp) · s,
// one f32 multiplication as on the CPU.
template <int Bits, bool ZeroPoint, int Group, int N>
struct fmt_int_group {
    static_assert(Bits == 4 || Bits == 8, "int4 or int8");
    static constexpr int block = 32 / Bits, block_bytes = 4, chunk = 32 / Bits;
    template <int K>
    static __device__ void load(const weight_view &w, int n, int k0, float (&out)[chunk])
    {
        constexpr int group = Group ? Group : K;
        static_assert(group % chunk == 0 && K % group == 0, "groups are whole words dividing K");
        constexpr i64 groups = K / group;
        const i64 si = (i64)n * groups + k0 / group;
        const float s = scale_f32(w, si);
        int zp = 0;
        if constexpr (ZeroPoint)
            zp = (int)(i8)w.scale[(i64)N * groups * 4 + si];
        const u8 *q = row_of<block, block_bytes, K>(w, n) + k0 * Bits / 8;
        const u32 word = (u32)q[0] | (u32)q[1] << 8 | (u32)q[2] << 16 | (u32)q[3] << 24;
#pragma unroll
        for (int i = 0; i < chunk; i++) {
            const int code = (int)((word >> (Bits * i)) & ((1u << Bits) - 1)) - (1 << (Bits - 1));
            out[i] = (float)(code - zp) * s;
        }
    }
};

template <int Group, int N> struct fmt_int4_group : fmt_int_group<4, false, Group, N> {};
template <int Group, int N> struct fmt_int4_group_zp : fmt_int_group<4, true, Group, N> {};
template <int Group, int N> struct fmt_int8_group : fmt_int_group<8, false, Group, N> {};
template <int Group, int N> struct fmt_int8_group_zp : fmt_int_group<8, true, Group, N> {};

} // namespace kiln
