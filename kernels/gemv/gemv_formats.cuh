// The gemv backend's weight decoding: one traits struct per kiln_format,
// named gemv_<the format's short name>, that turns a run of 8 weights of
// a lane's unit into f32, reading the stage a warp copied into shared
// memory (kernels/gemv/gemv.cuh streams it; the layout is kiln's storage
// layout, graph/format.c).
//
// The budget is a few instructions per weight (4-bit formats get about 4
// on an H200, decode and FMA together), so values are built with bit
// operations on pairs: nibbles and E2M1 codes become f16 pairs (E2M1 by
// placing s.ee.m in an f16 whose subnormals give exactly code · 2^-14;
// unsigned integers as the f16 1024 + code), E4M3 pairs use
// cvt.rn.f16x2.e4m3x2 on sm_89+, bytes become f32 through 2^23 + byte.
// Every value is exact; scales are left to the kernel, which multiplies
// partial sums by them (see the traits' fields below).
#pragma once

#include "kiln/dequant.cuh"
#include "kiln/gemv_format.h"
#include "kiln/kiln_args.h"
#include "kiln/kiln_types.cuh"

namespace kiln {

// ----------------------------------------------------- shared-memory reads

__device__ __forceinline__ u32 smem_u32(const u8 *p)
{
    return *reinterpret_cast<const u32 *>(p);
}

__device__ __forceinline__ u32 smem_u16(const u8 *p)
{
    return *reinterpret_cast<const u16 *>(p);
}

// Eight bytes from any byte of shared memory: three aligned words, two
// funnel shifts. The GGML blocks sit at odd or even offsets.
__device__ __forceinline__ void smem_u32x2(const u8 *p, u32 &lo, u32 &hi)
{
    const u32 mis = (u32)reinterpret_cast<unsigned long long>(p) & 3u;
    const u32 *q = reinterpret_cast<const u32 *>(p - mis);
    const u32 w0 = q[0], w1 = q[1], w2 = q[2];
    lo = __funnelshift_r(w0, w1, mis * 8);
    hi = __funnelshift_r(w1, w2, mis * 8);
}

// ---------------------------------------------------------- conversions

__device__ __forceinline__ void f16x2_to_f32(u32 h, float &lo, float &hi)
{
    asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;}"
        : "=f"(lo), "=f"(hi)
        : "r"(h));
}

__device__ __forceinline__ u32 hsub2(u32 a, u32 b)
{
    u32 d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// Two 4-bit codes at bits 0-3 and 16-19 of p (other bits ignored) as
// floats. E2M1: s.ee.m placed at f16 bits 15 and 11..9 is exactly
// e2m1 · 2^-14 (codes 0 and 1 land on f16 zero and subnormal), so the
// caller owes a factor 2^14.
struct e2m1_pair {
    static constexpr float factor = 16384.0f;
    static __device__ __forceinline__ void decode(u32 p, float &lo, float &hi)
    {
        f16x2_to_f32(((p & 0x00070007u) << 9) | ((p & 0x00080008u) << 12), lo, hi);
    }
};

// Unsigned nibbles minus Bias, exactly: the f16 1024 + code, less 1024 + Bias.
template <u32 Bias>
struct int4_pair {
    static constexpr float factor = 1.0f;
    static __device__ __forceinline__ void decode(u32 p, float &lo, float &hi)
    {
        const u32 biased = (0x6400u + Bias) * 0x10001u;
        f16x2_to_f32(hsub2((p & 0x000F000Fu) | 0x64006400u, biased), lo, hi);
    }
};

// Eight codes, code i in nibble i of w (E2M1 pairs, the even element low).
template <class Pair>
__device__ __forceinline__ void nib8_packed(u32 w, float (&out)[8])
{
#pragma unroll
    for (int j = 0; j < 4; j++)
        Pair::decode(w >> (4 * j), out[j], out[j + 4]);
}

// Eight codes, code i in the nibble at bit sh of byte i of (w0, w1): the
// GGML split-half blocks, low nibbles for the first 16 values.
template <class Pair>
__device__ __forceinline__ void nib8_split(u32 w0, u32 w1, int sh, float (&out)[8])
{
    Pair::decode(w0 >> sh, out[0], out[2]);
    Pair::decode(w0 >> (sh + 8), out[1], out[3]);
    Pair::decode(w1 >> sh, out[4], out[6]);
    Pair::decode(w1 >> (sh + 8), out[5], out[7]);
}

// Four unsigned bytes b as b - bias, exactly: the f32 2^23 + b less
// 2^23 + bias.
__device__ __forceinline__ void bytes4(u32 w, float bias, float *out)
{
#pragma unroll
    for (int i = 0; i < 4; i++)
        out[i] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7650u | (u32)i)) -
                 (8388608.0f + bias);
}

// Four bits of b (bits 0-3) spread to bit 0 of bytes 0-3: each bit k of
// b lands at 8k, and no two products share a bit.
__device__ __forceinline__ u32 bits4_to_bytes(u32 b)
{
    return ((b & 0xFu) * 0x00204081u) & 0x01010101u;
}

// Four IQ4 codes, code i in the low nibble of byte i of c (the high
// nibbles clear), as ggml's kvalues_iq4nl levels, int8 in the same bytes:
// the codes as four selector nibbles of a byte permute over each half of
// the table, and bit 3 of each code picks the half.
__device__ __forceinline__ u32 iq4_levels4(u32 c)
{
    const u32 sel = __byte_perm(c | (c >> 4), 0u, 0x0020u) & 0x7777u;
    const u32 lo = __byte_perm(0xBFAD9881u, 0xF6EADDCFu, sel); // -127 -104 -83 -65 -49 -35 -22 -10
    const u32 hi = __byte_perm(0x26190D01u, 0x71594535u, sel); // 1 13 25 38 53 69 89 113
    const u32 upper = ((c >> 3) & 0x01010101u) * 0xFFu;
    return (hi & upper) | (lo & ~upper);
}

// Eight IQ4 codes at the nibble at bit sh of the bytes of (w0, w1) as
// their levels.
__device__ __forceinline__ void iq4_levels8(u32 w0, u32 w1, int sh, float (&out)[8])
{
    bytes4(iq4_levels4((w0 >> sh) & 0x0F0F0F0Fu) ^ 0x80808080u, 128.0f, out);
    bytes4(iq4_levels4((w1 >> sh) & 0x0F0F0F0Fu) ^ 0x80808080u, 128.0f, out + 4);
}

// Two E4M3 codes (the low byte first) as floats; NaN stays NaN.
__device__ __forceinline__ void e4m3x2(u32 pair, float &lo, float &hi)
{
#if __CUDA_ARCH__ >= 890
    u32 h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((u16)pair));
    f16x2_to_f32(h, lo, hi);
#else
    lo = e4m3_to_f32(pair & 0xFFu);
    hi = e4m3_to_f32((pair >> 8) & 0xFFu);
#endif
}

__device__ __forceinline__ void e4m3x8(u32 w0, u32 w1, float (&out)[8])
{
    e4m3x2(w0, out[0], out[1]);
    e4m3x2(w0 >> 16, out[2], out[3]);
    e4m3x2(w1, out[4], out[5]);
    e4m3x2(w1 >> 16, out[6], out[7]);
}

// ---------------------------------------------------------- format traits
//
// One per kiln_format, named gemv_<the format's short name>. Each has
// its stream, as the host sizes it (its row of kiln/gemv_format.h, which
// says more):
//   unit                values one lane decodes per unit
//   aligned             every unit's bytes start 16-byte aligned in every
//                       row
//   scale_rows/cols/elem  the separate scale array the stream copies:
//                       one elem-byte scale per scale_rows x scale_cols
//                       (cols 0: none in the stream)
//   offset              whether a run has an offset b (w = v·s + b, b
//                       being Q4_K's minimum)
// and its decoding:
//   storage             the dequant.cuh traits (block, block_bytes)
//   runs                the unit's runs of 8 values
//   run_scale           whether a run has a scale s
//   group               consecutive runs of a unit that share s and b: the
//                       scale multiplies their joint partial sum once
//   factor              the exact power of two the decoding leaves out
//                       (w = v·s·factor), applied to the row's sum
//   unit_k(u)           where unit u's block starts, in values from the
//                       stage start (the unit exists when that is < K)
//   run_at(u, q)        where run q of unit u starts: 32·group + offset
//                       values from the stage start, offset < 32 (the x
//                       tile pads every 32 values, so the split keeps its
//                       addressing to a multiply-add the compiler hoists)
//   row_scale(args, n)  what multiplies row n's sum (per tensor / row)
//   run(d, s, u, q, w, scale, offset)  decode run q of unit u from the
//                       stage's data d and scales s in shared memory

// Where a run of 8 starts: 32·group + offset values into the stage.
struct gemv_at {
    int group, offset;
};

// A format's stream: a row of kiln/gemv_format.h.
// ZeroPoints: the stream also copies an int8 zero point per scale, from
// the array that follows every row's scales (the integer groups).
template <int Unit, int Aligned, int ScaleRows, int ScaleCols, int ScaleElem, int Offset,
          bool ZeroPoints = false>
struct gemv_stream {
    static constexpr int unit = Unit;
    static constexpr bool aligned = Aligned != 0, offset = Offset != 0, zero_points = ZeroPoints;
    static constexpr int scale_rows = ScaleRows, scale_cols = ScaleCols, scale_elem = ScaleElem;
};

// gemv_stream_<name>: the stream of the format whose short name is name.
#define KILN_GEMV_STREAM(fmt, name, unit, aligned, scale_rows, scale_cols, scale_elem, offset)  \
    using gemv_stream_##name =                                                                 \
        gemv_stream<unit, aligned, scale_rows, scale_cols, scale_elem, offset>;
KILN_GEMV_FORMATS(KILN_GEMV_STREAM)
#undef KILN_GEMV_STREAM

template <class Stream>
struct gemv_plain : Stream {
    static constexpr bool run_scale = false;
    static constexpr int group = 1;
    static constexpr float factor = 1.0f;
    static __device__ float row_scale(const kiln_linear_args &, int) { return 1.0f; }
};

// The 16-bit and f32 formats: 8 values a unit, one run.
template <class Stream>
struct gemv_words : gemv_plain<Stream> {
    static_assert(Stream::unit == 8 && Stream::aligned, "16 or 32 bytes a unit");
    static constexpr int runs = 1;
    static __device__ int unit_k(int u) { return 8 * u; }
    static __device__ gemv_at run_at(int u, int) { return { u / 4, 8 * (u % 4) }; }
};

struct gemv_f32 : gemv_words<gemv_stream_f32> {
    using storage = fmt_f32;
    static __device__ void run(const u8 *d, const u8 *, int u, int, float (&w)[8], float &,
                               float &)
    {
        const uint4 a = *reinterpret_cast<const uint4 *>(d + 32 * u);
        const uint4 b = *reinterpret_cast<const uint4 *>(d + 32 * u + 16);
        const u32 v[8] = { a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w };
#pragma unroll
        for (int i = 0; i < 8; i++)
            w[i] = __uint_as_float(v[i]);
    }
};

struct gemv_f16 : gemv_words<gemv_stream_f16> {
    using storage = fmt_f16;
    static __device__ void run(const u8 *d, const u8 *, int u, int, float (&w)[8], float &,
                               float &)
    {
        const uint4 a = *reinterpret_cast<const uint4 *>(d + 16 * u);
        f16x2_to_f32(a.x, w[0], w[1]);
        f16x2_to_f32(a.y, w[2], w[3]);
        f16x2_to_f32(a.z, w[4], w[5]);
        f16x2_to_f32(a.w, w[6], w[7]);
    }
};

struct gemv_bf16 : gemv_words<gemv_stream_bf16> {
    using storage = fmt_bf16;
    static __device__ void run(const u8 *d, const u8 *, int u, int, float (&w)[8], float &,
                               float &)
    {
        const uint4 a = *reinterpret_cast<const uint4 *>(d + 16 * u);
        const u32 v[4] = { a.x, a.y, a.z, a.w };
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w[2 * i] = __uint_as_float(v[i] << 16);
            w[2 * i + 1] = __uint_as_float(v[i] & 0xFFFF0000u);
        }
    }
};

// E4M3 rows, 16 values a unit; the scale is per tensor or per row and
// multiplies the final sum.
template <class Stream>
struct gemv_e4m3_rows : gemv_plain<Stream> {
    static_assert(Stream::unit == 16 && Stream::aligned, "16 bytes a unit");
    static constexpr int runs = 2;
    static __device__ int unit_k(int u) { return 16 * u; }
    static __device__ gemv_at run_at(int u, int q) { return { u / 2, 16 * (u % 2) + 8 * q }; }
    static __device__ void values(const u8 *d, int u, int q, float (&w)[8])
    {
        e4m3x8(smem_u32(d + 16 * u + 8 * q), smem_u32(d + 16 * u + 8 * q + 4), w);
    }
    static __device__ void run(const u8 *d, const u8 *, int u, int q, float (&w)[8], float &,
                               float &)
    {
        values(d, u, q, w);
    }
};

struct gemv_fp8 : gemv_e4m3_rows<gemv_stream_fp8> {
    using storage = fmt_fp8;
    static __device__ float row_scale(const kiln_linear_args &a, int)
    {
        return static_cast<const float *>(a.w_scale)[0];
    }
};

struct gemv_fp8_channel : gemv_e4m3_rows<gemv_stream_fp8_channel> {
    using storage = fmt_fp8_channel;
    static __device__ float row_scale(const kiln_linear_args &a, int n)
    {
        return static_cast<const float *>(a.w_scale)[n];
    }
};

// One f32 scale per 128 x 128 tile: a unit of 16 values lies in one.
struct gemv_fp8_block : gemv_e4m3_rows<gemv_stream_fp8_block> {
    using storage = fmt_fp8_block;
    static constexpr bool run_scale = true;
    static constexpr int group = 2;
    static __device__ void run(const u8 *d, const u8 *s, int u, int q, float (&w)[8],
                               float &scale, float &)
    {
        values(d, u, q, w);
        scale = __uint_as_float(smem_u32(s + 4 * (u / 8)));
    }
};

// 32 E4M3 per block, E8M0 scale [N, K/32]; a unit is half a block.
struct gemv_mxfp8 : gemv_e4m3_rows<gemv_stream_mxfp8> {
    using storage = fmt_mxfp8;
    static constexpr bool run_scale = true;
    static constexpr int group = 2;
    static __device__ void run(const u8 *d, const u8 *s, int u, int q, float (&w)[8],
                               float &scale, float &)
    {
        values(d, u, q, w);
        scale = e8m0_to_f32(s[u / 2]);
    }
};

// E2M1 pairs in 16-byte units of 32 values, code i in nibble i of word q.
template <class Stream>
struct gemv_e2m1_units : gemv_plain<Stream> {
    static_assert(Stream::unit == 32 && Stream::aligned, "16 bytes a unit");
    static constexpr bool run_scale = true;
    static constexpr float factor = e2m1_pair::factor;
    static constexpr int runs = 4;
    static __device__ int unit_k(int u) { return 32 * u; }
    static __device__ gemv_at run_at(int u, int q) { return { u, 8 * q }; }
    static __device__ void values(const u8 *d, int u, int q, float (&w)[8])
    {
        nib8_packed<e2m1_pair>(smem_u32(d + 16 * u + 4 * q), w);
    }
};

// 32 E2M1 per block, E8M0 scale [N, K/32]: a unit is a block.
struct gemv_mxfp4 : gemv_e2m1_units<gemv_stream_mxfp4> {
    using storage = fmt_mxfp4;
    static constexpr int group = 4;
    static __device__ void run(const u8 *d, const u8 *s, int u, int q, float (&w)[8],
                               float &scale, float &)
    {
        values(d, u, q, w);
        scale = e8m0_to_f32(s[u]);
    }
};

// 16 E2M1 per block, UE4M3 scale [N, K/16], f32 global per tensor: a unit
// is two blocks, whose two scales decode as one pair.
struct gemv_nvfp4 : gemv_e2m1_units<gemv_stream_nvfp4> {
    using storage = fmt_nvfp4;
    static constexpr int group = 2;
    static __device__ float row_scale(const kiln_linear_args &a, int) { return *a.w_global; }
    static __device__ void run(const u8 *d, const u8 *s, int u, int q, float (&w)[8],
                               float &scale, float &)
    {
        values(d, u, q, w);
        float s0, s1;
        e4m3x2(smem_u16(s + 2 * u), s0, s1);
        scale = q < 2 ? s0 : s1;
    }
};

// The GGML blocks of 32 values with an inline scale: a unit is a block at
// any even (Q8_0, Q4_0) or any (GGML MXFP4) byte offset.
template <class Stream>
struct gemv_ggml32 : gemv_plain<Stream> {
    static_assert(Stream::unit == 32 && !Stream::aligned, "a block a unit, at any byte");
    static constexpr bool run_scale = true;
    static constexpr int runs = 4, group = 4;
    static __device__ int unit_k(int u) { return 32 * u; }
    static __device__ gemv_at run_at(int u, int q) { return { u, 8 * q }; }
};

// f16 d; int8 qs[32]. y = d · q.
struct gemv_q8_0 : gemv_ggml32<gemv_stream_q8_0> {
    using storage = fmt_q8_0;
    static __device__ void run(const u8 *d, const u8 *, int u, int q, float (&w)[8],
                               float &scale, float &)
    {
        const u8 *b = d + 34 * u;
        u32 lo, hi;
        smem_u32x2(b + 2 + 8 * q, lo, hi);
        bytes4(lo ^ 0x80808080u, 128.0f, w);
        bytes4(hi ^ 0x80808080u, 128.0f, w + 4);
        scale = f16_to_f32((u16)smem_u16(b));
    }
};

// f16 d; uint8 qs[16], split halves. y = d · (q - 8).
struct gemv_q4_0 : gemv_ggml32<gemv_stream_q4_0> {
    using storage = fmt_q4_0;
    static __device__ void run(const u8 *d, const u8 *, int u, int q, float (&w)[8],
                               float &scale, float &)
    {
        const u8 *b = d + 18 * u;
        u32 lo, hi;
        smem_u32x2(b + 2 + 8 * (q & 1), lo, hi);
        nib8_split<int4_pair<8>>(lo, hi, 4 * (q >> 1), w);
        scale = f16_to_f32((u16)smem_u16(b));
    }
};

// E8M0 e; uint8 qs[16], split halves. y = e2m1 · 2 · 2^(e - 128), ggml's
// doubled table and half scale.
struct gemv_ggml_mxfp4 : gemv_ggml32<gemv_stream_ggml_mxfp4> {
    using storage = fmt_ggml_mxfp4;
    static constexpr float factor = 2.0f * e2m1_pair::factor;
    static __device__ void run(const u8 *d, const u8 *, int u, int q, float (&w)[8],
                               float &scale, float &)
    {
        const u8 *b = d + 17 * u;
        u32 lo, hi;
        smem_u32x2(b + 1 + 8 * (q & 1), lo, hi);
        nib8_split<e2m1_pair>(lo, hi, 4 * (q >> 1), w);
        scale = e8m0_half_to_f32(b[0]);
    }
};

// f16 d; f16 m; uint8 qs[16], split halves (20 bytes: blocks 4-byte
// aligned). y = d·q + m: the run scale d and the offset m.
struct gemv_q4_1 : gemv_ggml32<gemv_stream_q4_1> {
    static_assert(offset, "the block's m through the sums of x");
    using storage = fmt_q4_1;
    static __device__ void run(const u8 *d, const u8 *, int u, int q, float (&w)[8],
                               float &scale, float &offset_)
    {
        const u8 *b = d + 20 * u;
        const u8 *qs = b + 4 + 8 * (q & 1);
        nib8_split<int4_pair<0>>(smem_u32(qs), smem_u32(qs + 4), 4 * (q >> 1), w);
        const u32 dm = smem_u32(b);
        scale = f16_to_f32((u16)dm);
        offset_ = f16_to_f32((u16)(dm >> 16));
    }
};

// The 5-bit codes of run q of a Q5_0 / Q5_1 block: nibbles of qs (split
// halves) at the run's 8 bytes, fifth bits from byte q of qh.
__device__ __forceinline__ void gemv_q5_codes(const u8 *qs, u32 qh_byte, int q, u32 &c0, u32 &c1)
{
    u32 lo, hi;
    smem_u32x2(qs + 8 * (q & 1), lo, hi);
    const int sh = 4 * (q >> 1);
    c0 = ((lo >> sh) & 0x0F0F0F0Fu) | bits4_to_bytes(qh_byte) << 4;
    c1 = ((hi >> sh) & 0x0F0F0F0Fu) | bits4_to_bytes(qh_byte >> 4) << 4;
}

// f16 d; u32 qh; uint8 qs[16], split halves; value v's fifth bit is bit
// v of qh (22 bytes, even offsets). y = d·(q − 16).
struct gemv_q5_0 : gemv_ggml32<gemv_stream_q5_0> {
    using storage = fmt_q5_0;
    static __device__ void run(const u8 *d, const u8 *, int u, int q, float (&w)[8],
                               float &scale, float &)
    {
        const u8 *b = d + 22 * u;
        u32 c0, c1;
        gemv_q5_codes(b + 6, b[2 + q], q, c0, c1);
        bytes4(c0, 16.0f, w);
        bytes4(c1, 16.0f, w + 4);
        scale = f16_to_f32((u16)smem_u16(b));
    }
};

// f16 d; f16 m; u32 qh; uint8 qs[16], as Q5_0 (24 bytes: blocks 8-byte
// aligned). y = d·q + m: the run scale d and the offset m.
struct gemv_q5_1 : gemv_ggml32<gemv_stream_q5_1> {
    static_assert(offset, "the block's m through the sums of x");
    using storage = fmt_q5_1;
    static __device__ void run(const u8 *d, const u8 *, int u, int q, float (&w)[8],
                               float &scale, float &offset_)
    {
        const u8 *b = d + 24 * u;
        u32 c0, c1;
        gemv_q5_codes(b + 8, b[4 + q], q, c0, c1);
        bytes4(c0, 0.0f, w);
        bytes4(c1, 0.0f, w + 4);
        const u32 dm = smem_u32(b);
        scale = f16_to_f32((u16)dm);
        offset_ = f16_to_f32((u16)(dm >> 16));
    }
};

// f16 d; uint8 qs[16], split halves, each nibble a level of ggml's
// codebook (18 bytes, even offsets). y = d·kvalues[q].
struct gemv_iq4_nl : gemv_ggml32<gemv_stream_iq4_nl> {
    using storage = fmt_iq4_nl;
    static __device__ void run(const u8 *d, const u8 *, int u, int q, float (&w)[8],
                               float &scale, float &)
    {
        const u8 *b = d + 18 * u;
        u32 lo, hi;
        smem_u32x2(b + 2 + 8 * (q & 1), lo, hi);
        iq4_levels8(lo, hi, 4 * (q >> 1), w);
        scale = f16_to_f32((u16)smem_u16(b));
    }
};

// The 256-value blocks read a sub-block of 32 a unit: unit u is sub-block
// p = u % 8 of block u / 8, run q its values 8q .. 8q + 7.
template <class Stream>
struct gemv_k_sub32 : gemv_plain<Stream> {
    static_assert(Stream::unit == 32 && !Stream::aligned, "a sub-block a unit, blocks at any even byte");
    static constexpr bool run_scale = true;
    static constexpr int runs = 4;
    static __device__ int unit_k(int u) { return 256 * (u / 8); }
    static __device__ gemv_at run_at(int u, int q) { return { u, 8 * q }; }
};

// 256 values: f16 d; u16 scales_h; scales_l[4]; qs[128], sub-blocks of 32
// as IQ4_NL (136 bytes: blocks 8-byte aligned). Sub-block p's 6-bit scale
// keeps its low 4 bits in nibble p % 2 of scales_l[p / 2] and its high 2
// at bit 2p of scales_h. y = (d·(ls − 32))·kvalues[q].
struct gemv_iq4_xs : gemv_k_sub32<gemv_stream_iq4_xs> {
    using storage = fmt_iq4_xs;
    static constexpr int group = 4;
    static __device__ void run(const u8 *d, const u8 *, int u, int q, float (&w)[8],
                               float &scale, float &)
    {
        const u8 *b = d + 136 * (u / 8);
        const int p = u % 8;
        const u8 *qs = b + 8 + 16 * p + 8 * (q & 1);
        iq4_levels8(smem_u32(qs), smem_u32(qs + 4), 4 * (q >> 1), w);
        const u32 ls = ((u32)(b[4 + p / 2] >> (4 * (p % 2))) & 0xFu) |
                       ((smem_u16(b + 2) >> (2 * p)) & 3u) << 4;
        scale = f16_to_f32((u16)smem_u16(b)) * (float)((int)ls - 32);
    }
};

// The 2-bit levels of Q2_K and Q3_K, run q of sub-block p: in half p / 4,
// byte l of its 32 holds position l of quarters 0-3 at bits 0, 2, 4, 6.
__device__ __forceinline__ u32 two_bits4(const u8 *qs, int p, int q, int i)
{
    u32 lo, hi;
    smem_u32x2(qs + 32 * (p / 4) + 8 * q, lo, hi);
    return (((i ? hi : lo) >> (2 * (p % 4))) & 0x03030303u);
}

// 256 values: uint8 scales[16] (scale low nibble, min high), qs[64], f16
// d, f16 dmin (84 bytes: blocks 4-byte aligned); 16 values share a scale
// and a min. y = (d·sc)·q − dmin·m: a run scale and an offset a pair of
// runs.
struct gemv_q2_k : gemv_k_sub32<gemv_stream_q2_k> {
    static_assert(offset, "the minimum through the sums of x");
    using storage = fmt_q2_k;
    static constexpr int group = 2;
    static __device__ void run(const u8 *d, const u8 *, int u, int q, float (&w)[8],
                               float &scale, float &offset_)
    {
        const u8 *b = d + 84 * (u / 8);
        const int p = u % 8;
        bytes4(two_bits4(b + 16, p, q, 0), 0.0f, w);
        bytes4(two_bits4(b + 16, p, q, 1), 0.0f, w + 4);
        const u32 sc = b[2 * p + q / 2], dm = smem_u32(b + 80);
        scale = f16_to_f32((u16)dm) * (float)(sc & 0xFu);
        offset_ = -(f16_to_f32((u16)(dm >> 16)) * (float)(sc >> 4));
    }
};

// 256 values: hmask[32], qs[64], 12 bytes of 6-bit scales, f16 d (110
// bytes, even offsets); 16 values share a scale. Position l of sub-block p
// is its 2 bits less 4 unless bit p of hmask[l] is set; scale j keeps its
// low 4 bits in nibble j / 8 of scales[j % 8] and its high 2 at bit
// 2·(j / 4) of scales[8 + j % 4]. y = (d·(sc − 32))·level.
struct gemv_q3_k : gemv_k_sub32<gemv_stream_q3_k> {
    using storage = fmt_q3_k;
    static constexpr int group = 2;
    static __device__ void run(const u8 *d, const u8 *, int u, int q, float (&w)[8],
                               float &scale, float &)
    {
        const u8 *b = d + 110 * (u / 8);
        const int p = u % 8, j = 2 * p + q / 2;
        u32 hm0, hm1;
        smem_u32x2(b + 8 * q, hm0, hm1);
        bytes4(two_bits4(b + 32, p, q, 0) | ((hm0 >> p) & 0x01010101u) << 2, 4.0f, w);
        bytes4(two_bits4(b + 32, p, q, 1) | ((hm1 >> p) & 0x01010101u) << 2, 4.0f, w + 4);
        const u8 *s = b + 96;
        const u32 sc = ((u32)(s[j % 8] >> (4 * (j / 8))) & 0xFu) |
                       (((u32)s[8 + j % 4] >> (2 * (j / 4))) & 3u) << 4;
        scale = f16_to_f32((u16)smem_u16(b + 108)) * (float)((int)sc - 32);
    }
};

// The run scale d·sc and offset −dmin·m of sub-block j of a Q4_K or Q5_K
// block at b (16-byte aligned): ggml's get_scale_min_k4, branch-free
// (lanes of a warp take different halves of the table), from one 16-byte
// read of the header.
__device__ __forceinline__ void k4_run_scale(const u8 *b, int j, float &scale, float &offset)
{
    const uint4 h = *reinterpret_cast<const uint4 *>(b);
    const u32 lo = __byte_perm(h.y, h.z, 0x0040u + 0x11u * (u32)(j & 3)); // s[j'], s[j'+4]
    const u32 hi = __byte_perm(h.w, 0u, (u32)(j & 3));                   // s[j'+8]
    const u32 sc_lo = lo & 63u, m_lo = (lo >> 8) & 63u;
    const u32 sc_hi = (hi & 0xFu) | ((lo >> 2) & 0x30u);
    const u32 m_hi = ((hi >> 4) & 0xFu) | ((lo >> 10) & 0x30u);
    const u32 sc = j < 4 ? sc_lo : sc_hi, m = j < 4 ? m_lo : m_hi;
    scale = f16_to_f32((u16)h.x) * (float)sc;
    offset = -(f16_to_f32((u16)(h.x >> 16)) * (float)m);
}

// 256 values: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128
// bytes of nibbles (144 bytes: every block is 16-byte aligned). Unit u is
// part p = u % 8 of block u / 8: 16 bytes of qs whose low nibbles are 16
// values of sub-block 2c and high nibbles 16 of sub-block 2c + 1 (c = p/2).
// y = (d·sc)·q − dmin·m: the run scale d·sc and the offset −dmin·m.
struct gemv_q4_k : gemv_plain<gemv_stream_q4_k> {
    static_assert(unit == 32 && aligned && offset, "an eighth of a 16-byte-aligned block");
    using storage = fmt_q4_k;
    static constexpr bool run_scale = true;
    static constexpr int runs = 4, group = 2;
    static __device__ int unit_k(int u) { return 256 * (u / 8); }
    static __device__ gemv_at run_at(int u, int q)
    {
        const int p = u % 8;
        return { 8 * (u / 8) + 2 * (p / 2) + q / 2, 16 * (p % 2) + 8 * (q % 2) };
    }
    static __device__ void run(const u8 *d, const u8 *, int u, int q, float (&w)[8],
                               float &scale, float &offset_)
    {
        const u8 *b = d + 144 * (u / 8);
        const int p = u % 8, c = p / 2;
        const u8 *qs = b + 16 + 32 * c + 16 * (p % 2) + 8 * (q % 2);
        nib8_split<int4_pair<0>>(smem_u32(qs), smem_u32(qs + 4), 4 * (q / 2), w);
        k4_run_scale(b, 2 * c + q / 2, scale, offset_);
    }
};

// 256 values: f16 d, f16 dmin, Q4_K's 12 bytes of scales and mins, qh[32],
// qs[128] (176 bytes: every block is 16-byte aligned). Units and runs as
// Q4_K's; the fifth bit of position l of sub-block j is bit j of qh[l].
// y = (d·sc)·q − dmin·m.
struct gemv_q5_k : gemv_plain<gemv_stream_q5_k> {
    static_assert(unit == 32 && aligned && offset, "an eighth of a 16-byte-aligned block");
    using storage = fmt_q5_k;
    static constexpr bool run_scale = true;
    static constexpr int runs = 4, group = 2;
    static __device__ int unit_k(int u) { return 256 * (u / 8); }
    static __device__ gemv_at run_at(int u, int q) { return gemv_q4_k::run_at(u, q); }
    static __device__ void run(const u8 *d, const u8 *, int u, int q, float (&w)[8],
                               float &scale, float &offset_)
    {
        const u8 *b = d + 176 * (u / 8);
        const int p = u % 8, c = p / 2, j = 2 * c + q / 2;
        const int l0 = 16 * (p % 2) + 8 * (q % 2);
        const u8 *qs = b + 48 + 32 * c + l0;
        const int sh = 4 * (q / 2);
        const u32 q0 = ((smem_u32(qs) >> sh) & 0x0F0F0F0Fu) |
                       (((smem_u32(b + 16 + l0) >> j) & 0x01010101u) << 4);
        const u32 q1 = ((smem_u32(qs + 4) >> sh) & 0x0F0F0F0Fu) |
                       (((smem_u32(b + 20 + l0) >> j) & 0x01010101u) << 4);
        bytes4(q0, 0.0f, w);
        bytes4(q1, 0.0f, w + 4);
        k4_run_scale(b, j, scale, offset_);
    }
};

// 256 values: ql[128], qh[64], int8 scales[16], f16 d (210 bytes, even
// offsets). Unit u is part p = u % 8 of block u / 8: half h = p / 4, lanes
// l = 8·(p % 4) .. +8 of each quarter t of the half (run t). The 6-bit q
// is a nibble of ql and two bits of qh; y = (d·sc)·(q − 32).
struct gemv_q6_k : gemv_plain<gemv_stream_q6_k> {
    static_assert(unit == 32 && !aligned, "an eighth of a block at any even byte");
    using storage = fmt_q6_k;
    static constexpr bool run_scale = true;
    static constexpr int runs = 4;
    static __device__ int unit_k(int u) { return 256 * (u / 8); }
    static __device__ gemv_at run_at(int u, int q)
    {
        const int p = u % 8;
        return { 8 * (u / 8) + 4 * (p / 4) + q, 8 * (p % 4) };
    }
    static __device__ void run(const u8 *d, const u8 *, int u, int q, float (&w)[8],
                               float &scale, float &)
    {
        const u8 *b = d + 210 * (u / 8);
        const int p = u % 8, h = p / 4, l0 = 8 * (p % 4);
        u32 ql0, ql1, qh0, qh1;
        smem_u32x2(b + 64 * h + 32 * (q & 1) + l0, ql0, ql1);
        smem_u32x2(b + 128 + 32 * h + l0, qh0, qh1);
        const int ls = 4 * (q >> 1), hs = 2 * q;
        const u32 q0 = ((ql0 >> ls) & 0x0F0F0F0Fu) | (((qh0 >> hs) & 0x03030303u) << 4);
        const u32 q1 = ((ql1 >> ls) & 0x0F0F0F0Fu) | (((qh1 >> hs) & 0x03030303u) << 4);
        bytes4(q0, 32.0f, w);
        bytes4(q1, 32.0f, w + 4);
        const float sc = (float)(i8)b[192 + 8 * h + l0 / 16 + 2 * q];
        scale = f16_to_f32((u16)smem_u16(b + 208)) * sc;
    }
};

// compressed-tensors pack-quantized: Bits-bit fields of the row's int32
// words holding q + 2^(Bits−1), f32 scales [N, K / Group] (Group 0: one a
// row, multiplying the final sum), and with ZeroPoint int8 zero points
// [N, K / Group] after them (along K only), subtracted from the codes
// exactly as the CPU does. A unit is 16 bytes (32 int4 or 16 int8
// values), a group whole units of a stage.
template <int Bits, int Group, bool ZeroPoint>
struct gemv_int_group
    : gemv_plain<gemv_stream<128 / Bits, 1, Group ? 1 : 0, Group, Group ? 4 : 0, 0, ZeroPoint>> {
    static_assert(Bits == 4 || Bits == 8, "int4 or int8");
    static_assert(Group % (128 / Bits) == 0, "a group is whole units");
    static_assert(!ZeroPoint || Group != 0, "zero points along K");
    using storage = fmt_int_group<Bits, ZeroPoint, Group, 1>;
    static constexpr bool run_scale = Group != 0;
    static constexpr int runs = 16 / Bits, group = runs;
    static __device__ int unit_k(int u) { return (128 / Bits) * u; }
    static __device__ gemv_at run_at(int u, int q)
    {
        if constexpr (Bits == 4)
            return { u, 8 * q };
        else
            return { u / 2, 16 * (u % 2) + 8 * q };
    }
    static __device__ float row_scale(const kiln_linear_args &a, int n)
    {
        if constexpr (Group == 0)
            return static_cast<const float *>(a.w_scale)[n];
        else
            return 1.0f;
    }
    static __device__ void run(const u8 *d, const u8 *s, int u, int q, float (&w)[8],
                               float &scale, float &)
    {
        if constexpr (Bits == 4) {
            nib8_packed<int4_pair<8>>(smem_u32(d + 16 * u + 4 * q), w);
        } else {
            bytes4(smem_u32(d + 16 * u + 8 * q), 128.0f, w);
            bytes4(smem_u32(d + 16 * u + 8 * q + 4), 128.0f, w + 4);
        }
        if constexpr (Group != 0)
            scale = __uint_as_float(smem_u32(s + 4 * (unit_k(u) / Group)));
    }
    // The same less the group's zero point z (staged beside the scales).
    static __device__ void run_zp(const u8 *d, const u8 *s, const u8 *z, int u, int q,
                                  float (&w)[8], float &scale, float &offset)
    {
        run(d, s, u, q, w, scale, offset);
        const float zp = (float)(i8)z[unit_k(u) / Group];
#pragma unroll
        for (int i = 0; i < 8; i++)
            w[i] -= zp;
    }
};

template <int Group, int N>
using gemv_int4_group = gemv_int_group<4, Group, false>;
template <int Group, int N>
using gemv_int4_group_zp = gemv_int_group<4, Group, true>;
template <int Group, int N>
using gemv_int8_group = gemv_int_group<8, Group, false>;
template <int Group, int N>
using gemv_int8_group_zp = gemv_int_group<8, Group, true>;

} // namespace kiln
