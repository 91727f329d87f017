// The gemv backend's tensor-core kernel (sm_80+): y[m, N] = epilogue(x[m,
// K] · W[N, K]ᵀ) for m ≤ 16 with mma.sync m16n8k16 (BF16 in, f32
// accumulators), weights in the packed layout of kernels/gemv/pack.c.
//
// Why tensor cores for a matrix-vector product. At m = 16 a weight feeds
// 16 FMAs: 16 f32 FMAs per 4-bit weight is four times what the FMA pipe
// of an H200 can issue at its memory bandwidth. An mma takes 8 or 16
// tokens for the cost of one, so what remains per weight is its decoding
// into BF16: a few bit operations per pair of weights (below). The same
// kernel serves m = 1, where the seven idle token columns cost nothing
// the memory does not already wait for.
//
// The weights as the A operand. Rows of W are the mma's M (16 rows a
// tile), tokens its N (8 a tile, two tiles at m > 8), K its K. A lane
// (g = lane / 4, t = lane % 4) holds, for every k-tile of 16, the A
// fragment of rows g and g + 8 at four k slots; kiln's packing puts k =
// 16j + 4t + s (j: the k-tile, s: 0..3) in those slots, so the lane's x
// values of a k-tile are 4 consecutive BF16 (one 8-byte load), and a
// k-tile covers 16 consecutive k: a 16- or 32-value block scale of a
// format is the scale of whole k-tiles.
//
// Atoms. 16 rows × 64 k, the unit of the packed stream: every lane reads
// its bytes of an atom as 16-byte pieces, the 32 lanes' pieces
// contiguous, so each load instruction of a warp reads 512 bytes in a
// row. Scales ride in a separate array, one small record per atom.
//
// Exactness. Every decoding below gives the format's value exactly in
// BF16 (the integer codes and FP8/FP4 magnitudes fit BF16's 8 significant
// bits). Block scales multiply the f32 partial product of the k-tiles they
// cover, per-tensor and per-row scales the final sum, and Q4_K's minimum
// comes in through the sum of x over its sub-block, itself an mma with an
// A of ones. Only the order of the f32 additions differs from the CPU
// reference.
//
// Work split. A warp owns RowTiles consecutive row tiles and a contiguous
// KSplit-th of the atoms; the block's KSplit warps that share row tiles
// add their sums through shared memory, and the first of them applies the
// epilogue. grid = ceil(ceil(N / 16) / (RowTiles · Warps / KSplit)).
#pragma once

#include "kiln/gemv.cuh"

namespace kiln {

// ------------------------------------------------------------ primitives

// (a & mask) | bits in one instruction: the magic-number decodings.
__device__ __forceinline__ u32 lop_and_or(u32 a, u32 mask, u32 bits)
{
    u32 d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(mask), "r"(bits));
    return d;
}

// a · b + c on BF16 pairs, rounded once: exact wherever the result is a
// BF16 value, which is the case for every use here.
__device__ __forceinline__ u32 bf2_fma(u32 a, u32 b, u32 c)
{
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// d = a · b + c, one m16n8k16 tile.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2],
                                         const float (&c)[4])
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
          "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

// The weight stream is read once: keep it out of L1.
__device__ __forceinline__ uint4 ld_stream(const u8 *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// 8 bytes global → shared, zero-filled when src_size is 0.
__device__ __forceinline__ void cp_async8(void *dst, const void *src, int src_size)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(
                     (u32)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(src_size));
}

__device__ __forceinline__ u32 word_of(const uint4 &v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// BF16 pair constants.
constexpr u32 bf2_one = 0x3F803F80u;
constexpr u32 bf2_neg_zero = 0x80008000u;
constexpr u32 bf2_magic = 0x43004300u; // 128: a 4-bit field in its mantissa reads 128 + q

__device__ __forceinline__ constexpr u32 bf2_splat(u32 bf16) { return bf16 | (bf16 << 16); }

// Register r of a k-tile's A fragment holds rows g + 8·(r & 1) at slots
// 2·(r >> 1) and 2·(r >> 1) + 1 (low and high half).

// 4-bit integer codes: nibble r + 4·half of the k-tile's word, read as
// 128 + q through the magic. No arithmetic: the kernel subtracts the 128
// (and a format's own offset) through the sum of x (the trait's offset()).
// BF16 has 7 mantissa bits, so each nibble is shifted down to bits 0..3.
__device__ __forceinline__ void decode_int4(u32 w, u32 (&a)[4])
{
#pragma unroll
    for (int r = 0; r < 4; r++)
        a[r] = lop_and_or(w >> (4 * r), 0x000F000Fu, bf2_magic);
}

// Small unsigned and signed integers to f32 without the conversion pipe
// (a quarter of the FMA rate): the integer in the mantissa of 2^23.
__device__ __forceinline__ float u8_to_f32(u32 v)
{
    return __uint_as_float(0x4B000000u | (v & 0xFFu)) - 8388608.0f;
}

__device__ __forceinline__ float s8_to_f32(u32 v)
{
    return __uint_as_float(0x4B000000u | ((v ^ 0x80u) & 0xFFu)) - 8388736.0f;
}

// E2M1: the 3-bit magnitude c and the sign s of each value sit where one
// shift and mask move c to BF16 bits 6..8 and s to bit 15 (registers 0..2:
// c at 6, 3, 0 and s 9 above it; register 3 from the bits left: c >> 1 at
// 10, c & 1 at 13, s at 14), 16 higher for the high half. As a BF16, c at
// bits 6..8 is the E2M1 value · 2^-126 (code 1, a subnormal, included);
// one multiply restores it. GGML's MXFP4 stores doubled values: Scale
// 2^127.
template <u32 Scale>
__device__ __forceinline__ void decode_e2m1(u32 w, u32 (&a)[4])
{
    constexpr u32 mask = 0x81C081C0u;
    u32 r3 = (w >> 3) & 0x01800180u;
    r3 = lop_and_or(w >> 7, 0x00400040u, r3);
    r3 = lop_and_or(w << 1, 0x80008000u, r3);
    const u32 raw[4] = { w & mask, (w << 3) & mask, (w << 6) & mask, r3 };
#pragma unroll
    for (int r = 0; r < 4; r++)
        a[r] = bf2_fma(raw[r], bf2_splat(Scale), bf2_neg_zero);
}

// E4M3 bytes, k-tile word pair (w0: registers 0 and 1, w1: 2 and 3):
// bytes 0 and 2 of a word are a register's low and high half, bytes 1
// and 3 the next register's. Sign to bit 15, exponent and mantissa to
// bits 4..10: the E4M3 value · 2^-120, subnormals included.
__device__ __forceinline__ void decode_e4m3_word(u32 w, u32 &lo_reg, u32 &hi_reg)
{
    constexpr u32 scale = bf2_splat(0x7B80u); // 2^120
    const u32 p0 = lop_and_or(w << 8, 0x80008000u, (w << 4) & 0x07F007F0u);
    const u32 p1 = lop_and_or(w, 0x80008000u, (w >> 4) & 0x07F007F0u);
    lo_reg = bf2_fma(p0, scale, bf2_neg_zero);
    hi_reg = bf2_fma(p1, scale, bf2_neg_zero);
}

// Q8_0 bytes hold u = q + 128, split into nibbles h, l: with H = 128 + h
// and L = 128 + l from the magic, 16·H − 2304 = 16h − 256 and q = L +
// (16h − 256), each step exact.
__device__ __forceinline__ void decode_q8_word(u32 w, u32 &lo_reg, u32 &hi_reg)
{
    constexpr u32 sixteen = bf2_splat(0x4180u), minus_2304 = bf2_splat(0xC510u);
    const u32 l0 = lop_and_or(w, 0x000F000Fu, bf2_magic);
    const u32 h0 = lop_and_or(w >> 4, 0x000F000Fu, bf2_magic);
    const u32 l1 = lop_and_or(w >> 8, 0x000F000Fu, bf2_magic);
    const u32 h1 = lop_and_or(w >> 12, 0x000F000Fu, bf2_magic);
    lo_reg = bf2_fma(l0, bf2_one, bf2_fma(h0, sixteen, minus_2304));
    hi_reg = bf2_fma(l1, bf2_one, bf2_fma(h1, sixteen, minus_2304));
}

// ------------------------------------------------------------- formats

// What a format's trait gives the kernel:
//   pieces        16-byte pieces of a lane's share of an atom
//   atom_bytes    bytes of an atom in the data array
//   batch         atoms a warp loads before it decodes them
//   block_tiles   k-tiles one block scale covers; 0: none (row scale only)
//   raw           one atom's registers: load_high() and load_scales() fill
//                 what the pieces do not, decode() turns k-tile j into an
//                 A fragment, scale() gives block b's scales of rows g, g + 8
//   row_scale     what multiplies row n's sum at the end
//   min_blocks    blocks per SM the registers are budgeted for (one token tile)
// Where a lane finds its scale records.
struct tc_scale_ptr {
    const u8 *rec; // this lane group's record of atom 0
    const u8 *sup; // its super-record of atom 0 (Q4_K, Q6_K)
};

template <int Pieces>
struct tc_raw {
    uint4 q[Pieces];
    u32 s[2];   // the atom's scale record
    u32 sup[2]; // the 256-value super-record (Q4_K, Q6_K)
    u32 qh[2];  // Q6_K's high bits
};

struct tc_base {
    static constexpr int pieces = 1, atom_bytes = 512, batch = 4, block_tiles = 0;
    static constexpr int min_blocks = 1; // __launch_bounds__: blocks per SM to fit
    static constexpr bool has_offset = false, has_min = false;
    using raw = tc_raw<1>;
    template <class R>
    static __device__ void load_high(const u8 *, int, R &)
    {
    }
    template <int N, int K>
    static __device__ tc_scale_ptr scale_ptr(const kiln_linear_args &, int, int)
    {
        return {};
    }
    template <class R>
    static __device__ void load_scales(const tc_scale_ptr &, int, R &)
    {
    }
    static __device__ float row_scale(const kiln_linear_args &, int) { return 1.0f; }
};

// Lane group g's scale record of atom 0 of row tile `tile` (Record
// bytes for rows g and g + 8, records atom-major), and its 256-value
// super-record after all the records (Q4_K, Q6_K).
template <int N, int K, int Record, int SuperRecord>
__device__ __forceinline__ tc_scale_ptr records_of(const kiln_linear_args &args, int tile, int g)
{
    constexpr i64 tiles = (N + 15) / 16;
    const u8 *s = static_cast<const u8 *>(args.w_scale);
    return { s + (i64)tile * (K / 64) * (8 * Record) + g * Record,
             s + tiles * (K / 64) * (8 * Record) + (i64)tile * (K / 256) * (8 * SuperRecord) +
                 g * SuperRecord };
}

template <class R>
__device__ __forceinline__ void record4(const tc_scale_ptr &p, int atom, R &r)
{
    r.s[0] = __ldg(reinterpret_cast<const u32 *>(p.rec + atom * 32));
}

template <class R>
__device__ __forceinline__ void record8(const tc_scale_ptr &p, int atom, R &r)
{
    const uint2 v = __ldg(reinterpret_cast<const uint2 *>(p.rec + atom * 64));
    r.s[0] = v.x, r.s[1] = v.y;
}

// Byte b of a record word as E8M0 (rows g and g + 8 at bytes b, b + 2).
template <float (*Decode)(u32)>
__device__ __forceinline__ void scales_e8m0(u32 s, int b, float (&out)[2])
{
    out[0] = Decode((s >> (8 * b)) & 0xFFu);
    out[1] = Decode((s >> (8 * b + 16)) & 0xFFu);
}

// Half b of each record word as f16 (rows g and g + 8).
__device__ __forceinline__ void scales_f16(const u32 (&s)[2], int b, float (&out)[2])
{
    out[0] = f16_to_f32((u16)(s[0] >> (16 * b)));
    out[1] = f16_to_f32((u16)(s[1] >> (16 * b)));
}

struct tc_bf16 : tc_base {
    static constexpr int pieces = 4, atom_bytes = 2048, batch = 1;
    using raw = tc_raw<4>;
    static __device__ void decode(const raw &r, int j, u32 (&a)[4])
    {
        a[0] = r.q[j].x, a[1] = r.q[j].y, a[2] = r.q[j].z, a[3] = r.q[j].w;
    }
};

struct tc_e4m3 : tc_base {
    static constexpr int pieces = 2, atom_bytes = 1024, batch = 2;
    using raw = tc_raw<2>;
    static __device__ void decode(const raw &r, int j, u32 (&a)[4])
    {
        const uint4 &p = r.q[j >> 1];
        decode_e4m3_word(word_of(p, (j & 1) * 2), a[0], a[1]);
        decode_e4m3_word(word_of(p, (j & 1) * 2 + 1), a[2], a[3]);
    }
};

struct tc_fp8 : tc_e4m3 {
    static __device__ float row_scale(const kiln_linear_args &a, int)
    {
        return *static_cast<const float *>(a.w_scale);
    }
};

struct tc_fp8_channel : tc_e4m3 {
    static __device__ float row_scale(const kiln_linear_args &a, int n)
    {
        return static_cast<const float *>(a.w_scale)[n];
    }
};

// One f32 per 128 × 128 in kiln's storage layout: an atom is inside one.
struct tc_fp8_block : tc_e4m3 {
    static constexpr int block_tiles = 4;
    template <int N, int K>
    static __device__ tc_scale_ptr scale_ptr(const kiln_linear_args &args, int tile, int)
    {
        constexpr int cols = (K + 127) / 128;
        return { reinterpret_cast<const u8 *>(static_cast<const float *>(args.w_scale) +
                                              (i64)(tile / 8) * cols),
                 nullptr };
    }
    static __device__ void load_scales(const tc_scale_ptr &p, int atom, raw &r)
    {
        r.s[0] = __float_as_uint(__ldg(reinterpret_cast<const float *>(p.rec) + atom / 2));
    }
    static __device__ void scale(const raw &r, int, float (&s)[2])
    {
        s[0] = s[1] = __uint_as_float(r.s[0]);
    }
};

// Record: E8M0 of (g, k-block 0), (g, 1), (g + 8, 0), (g + 8, 1).
struct tc_mxfp8 : tc_e4m3 {
    static constexpr int block_tiles = 2;
    template <int N, int K>
    static __device__ tc_scale_ptr scale_ptr(const kiln_linear_args &args, int tile, int g)
    {
        return records_of<N, K, 4, 0>(args, tile, g);
    }
    static __device__ void load_scales(const tc_scale_ptr &p, int atom, raw &r)
    {
        record4(p, atom, r);
    }
    static __device__ void scale(const raw &r, int b, float (&s)[2])
    {
        scales_e8m0<e8m0_to_f32>(r.s[0], b, s);
    }
};

// Record: f16 of (g, 0), (g, 1), then (g + 8, 0), (g + 8, 1).
struct tc_q8_0 : tc_e4m3 {
    static constexpr int block_tiles = 2;
    template <int N, int K>
    static __device__ tc_scale_ptr scale_ptr(const kiln_linear_args &args, int tile, int g)
    {
        return records_of<N, K, 8, 0>(args, tile, g);
    }
    static __device__ void load_scales(const tc_scale_ptr &p, int atom, raw &r)
    {
        record8(p, atom, r);
    }
    static __device__ void decode(const raw &r, int j, u32 (&a)[4])
    {
        const uint4 &p = r.q[j >> 1];
        decode_q8_word(word_of(p, (j & 1) * 2), a[0], a[1]);
        decode_q8_word(word_of(p, (j & 1) * 2 + 1), a[2], a[3]);
    }
    static __device__ void scale(const raw &r, int b, float (&s)[2]) { scales_f16(r.s, b, s); }
};

// Record as Q8_0's. The registers read 128 + q = (q − 8) + 136.
struct tc_q4_0 : tc_base {
    static constexpr int block_tiles = 2;
    static constexpr bool has_offset = true;
    template <int N, int K>
    static __device__ tc_scale_ptr scale_ptr(const kiln_linear_args &args, int tile, int g)
    {
        return records_of<N, K, 8, 0>(args, tile, g);
    }
    static __device__ void load_scales(const tc_scale_ptr &p, int atom, raw &r)
    {
        record8(p, atom, r);
    }
    static __device__ void decode(const raw &r, int j, u32 (&a)[4])
    {
        decode_int4(word_of(r.q[0], j), a);
    }
    static __device__ void offset(float (&o)[2]) { o[0] = o[1] = 136.0f; }
    static __device__ void scale(const raw &r, int b, float (&s)[2]) { scales_f16(r.s, b, s); }
};

// Record as MXFP8's. Scale: the power of two the E2M1 decoding restores.
template <u32 Scale, float (*Decode)(u32)>
struct tc_e2m1_32 : tc_base {
    static constexpr int block_tiles = 2;
    template <int N, int K>
    static __device__ tc_scale_ptr scale_ptr(const kiln_linear_args &args, int tile, int g)
    {
        return records_of<N, K, 4, 0>(args, tile, g);
    }
    static __device__ void load_scales(const tc_scale_ptr &p, int atom, raw &r)
    {
        record4(p, atom, r);
    }
    static __device__ void decode(const raw &r, int j, u32 (&a)[4])
    {
        decode_e2m1<Scale>(word_of(r.q[0], j), a);
    }
    static __device__ void scale(const raw &r, int b, float (&s)[2])
    {
        scales_e8m0<Decode>(r.s[0], b, s);
    }
};

using tc_mxfp4 = tc_e2m1_32<0x7E80u, e8m0_to_f32>;           // 2^126
using tc_ggml_mxfp4 = tc_e2m1_32<0x7F00u, e8m0_half_to_f32>; // 2^127: ggml's doubled values

// Record: the block scales of (g, k-tile 0..3), then (g + 8, 0..3), each
// re-encoded by the packer as f32 bits >> 20 less 110 << 3 (exponent and
// the 3 mantissa bits of the UE4M3 value, subnormals normalized): one
// shift and add to f32. A zero scale's block has zero codes.
struct tc_nvfp4 : tc_base {
    static constexpr int block_tiles = 1;
    template <int N, int K>
    static __device__ tc_scale_ptr scale_ptr(const kiln_linear_args &args, int tile, int g)
    {
        return records_of<N, K, 8, 0>(args, tile, g);
    }
    static __device__ void load_scales(const tc_scale_ptr &p, int atom, raw &r)
    {
        record8(p, atom, r);
    }
    static __device__ void decode(const raw &r, int j, u32 (&a)[4])
    {
        decode_e2m1<0x7E80u>(word_of(r.q[0], j), a);
    }
    static __device__ float code_to_f32(u32 c)
    {
        return __uint_as_float(((c & 0xFFu) << 20) + (110u << 23));
    }
    static __device__ void scale(const raw &r, int b, float (&s)[2])
    {
        s[0] = code_to_f32(r.s[0] >> (8 * b));
        s[1] = code_to_f32(r.s[1] >> (8 * b));
    }
    static __device__ float row_scale(const kiln_linear_args &a, int) { return *a.w_global; }
};

// Record: u8 scales of (g, sub-block 0), (g, 1), mins of (g, 0), (g, 1);
// then the same for g + 8. Super-record: f16 d, dmin of g, then of g + 8.
// The registers read 128 + q (decode_int4).
struct tc_q4_k : tc_base {
    static constexpr int block_tiles = 2, min_blocks = 2;
    static constexpr bool has_offset = true, has_min = true;
    template <int N, int K>
    static __device__ tc_scale_ptr scale_ptr(const kiln_linear_args &args, int tile, int g)
    {
        return records_of<N, K, 8, 8>(args, tile, g);
    }
    static __device__ void load_scales(const tc_scale_ptr &p, int atom, raw &r)
    {
        record8(p, atom, r);
        const uint2 d = __ldg(reinterpret_cast<const uint2 *>(p.sup + atom / 4 * 64));
        r.sup[0] = d.x, r.sup[1] = d.y;
    }
    static __device__ void decode(const raw &r, int j, u32 (&a)[4])
    {
        decode_int4(word_of(r.q[0], j), a);
    }
    static __device__ void offset(float (&o)[2]) { o[0] = o[1] = 128.0f; }
    static __device__ void scale(const raw &r, int b, float (&s)[2])
    {
        s[0] = f16_to_f32((u16)r.sup[0]) * u8_to_f32(r.s[0] >> (8 * b));
        s[1] = f16_to_f32((u16)r.sup[1]) * u8_to_f32(r.s[1] >> (8 * b));
    }
    static __device__ void minimum(const raw &r, int b, float (&m)[2])
    {
        m[0] = f16_to_f32((u16)(r.sup[0] >> 16)) * u8_to_f32(r.s[0] >> (8 * b + 16));
        m[1] = f16_to_f32((u16)(r.sup[1] >> 16)) * u8_to_f32(r.s[1] >> (8 * b + 16));
    }
};

// Data: the low 4 bits as Q4_0's nibbles (512 bytes an atom), then the
// high 2 bits, 8 bytes a lane: k-tile j, register r at bits
// 2·((j & 1)·4 + r) of word j >> 1 (16 higher for the high half). Record:
// int8 scales of (g, k-tile 0..3), then (g + 8, 0..3). Super-record: f16
// d of g, then of g + 8.
struct tc_q6_k : tc_base {
    static constexpr int atom_bytes = 768, batch = 2, block_tiles = 1;
    static __device__ void load_high(const u8 *atom, int lane, raw &r)
    {
        const uint2 v = __ldg(reinterpret_cast<const uint2 *>(atom + 512 + lane * 8));
        r.qh[0] = v.x, r.qh[1] = v.y;
    }
    template <int N, int K>
    static __device__ tc_scale_ptr scale_ptr(const kiln_linear_args &args, int tile, int g)
    {
        return records_of<N, K, 8, 4>(args, tile, g);
    }
    static __device__ void load_scales(const tc_scale_ptr &p, int atom, raw &r)
    {
        record8(p, atom, r);
        r.sup[0] = __ldg(reinterpret_cast<const u32 *>(p.sup + atom / 4 * 32));
    }
    static __device__ void decode(const raw &r, int j, u32 (&a)[4])
    {
        // 16·(128 + h) − 2208 = 16h − 160; q = (128 + l) + that = l + 16h − 32.
        constexpr u32 sixteen = bf2_splat(0x4180u), minus_2208 = bf2_splat(0xC50Au);
        const u32 w = word_of(r.q[0], j), hw = r.qh[j >> 1];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const u32 l = lop_and_or(w >> (4 * i), 0x000F000Fu, bf2_magic);
            const u32 h = lop_and_or(hw >> (2 * ((j & 1) * 4 + i)), 0x00030003u, bf2_magic);
            a[i] = bf2_fma(l, bf2_one, bf2_fma(h, sixteen, minus_2208));
        }
    }
    static __device__ void scale(const raw &r, int b, float (&s)[2])
    {
        const float d0 = f16_to_f32((u16)r.sup[0]), d1 = f16_to_f32((u16)(r.sup[0] >> 16));
        s[0] = d0 * s8_to_f32(r.s[0] >> (8 * b));
        s[1] = d1 * s8_to_f32(r.s[1] >> (8 * b));
    }
};

// --------------------------------------------------------------- kernel

template <int MaxM, int RowTiles, int Warps, int KSplit>
struct tc_shape {
    static_assert(MaxM == 8 || MaxM == 16, "one or two token tiles");
    static_assert(Warps % KSplit == 0, "k-split warps divide the block");
    static constexpr int token_tiles = MaxM / 8, row_tiles = RowTiles, warps = Warps;
    static constexpr int k_split = KSplit, threads = Warps * 32;
    static constexpr int row_warps = Warps / KSplit;
};

// Blocks per SM for __launch_bounds__: a format's wish holds for one token
// tile; two need the registers of a lower occupancy.
template <class F, class S>
struct tc_min_blocks {
    static constexpr int value = S::token_tiles == 1 ? F::min_blocks : 1;
};

// One atom of one row tile into the accumulators: decode each k-tile,
// mma it with every token tile, and bring block scales (and Q4_K's
// minimum) in once per block.
template <class F, int TT>
__device__ __forceinline__ void tc_atom(const typename F::raw &r, const u32 (&xb)[TT][4][2],
                                        float (&acc)[TT][4])
{
    if constexpr (F::block_tiles == 0) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            u32 a[4];
            F::decode(r, j, a);
#pragma unroll
            for (int n = 0; n < TT; n++)
                mma_bf16(acc[n], a, xb[n][j], acc[n]);
        }
    } else {
        constexpr int BT = F::block_tiles;
#pragma unroll
        for (int b = 0; b < 4 / BT; b++) {
            float part[TT][4] = {};
#pragma unroll
            for (int jj = 0; jj < BT; jj++) {
                u32 a[4];
                F::decode(r, b * BT + jj, a);
#pragma unroll
                for (int n = 0; n < TT; n++)
                    mma_bf16(part[n], a, xb[n][b * BT + jj], part[n]);
            }
            float s[2];
            F::scale(r, b, s);
            if constexpr (F::has_offset) {
                // x summed over the block's k-tiles: an mma with an A of ones.
                const u32 ones[4] = { bf2_one, bf2_one, bf2_one, bf2_one };
                float xs[TT][4] = {};
#pragma unroll
                for (int jj = 0; jj < BT; jj++)
#pragma unroll
                    for (int n = 0; n < TT; n++)
                        mma_bf16(xs[n], ones, xb[n][b * BT + jj], xs[n]);
                float o[2];
                F::offset(o);
                if constexpr (F::has_min) {
                    float m[2];
                    F::minimum(r, b, m);
#pragma unroll
                    for (int n = 0; n < TT; n++)
#pragma unroll
                        for (int c = 0; c < 4; c++)
                            acc[n][c] = fmaf(-m[c >> 1], xs[n][c], acc[n][c]);
                }
#pragma unroll
                for (int n = 0; n < TT; n++)
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        acc[n][c] =
                            fmaf(fmaf(-o[c >> 1], xs[n][c], part[n][c]), s[c >> 1], acc[n][c]);
            } else {
#pragma unroll
                for (int n = 0; n < TT; n++)
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        acc[n][c] = fmaf(part[n][c], s[c >> 1], acc[n][c]);
            }
        }
    }
}

// Dynamic shared memory: each warp's ring of two batches of x fragments,
// [stage][atom][token tile][k-tile][lane] × 8 bytes.
template <class F, class S>
struct tc_smem {
    static constexpr int per_warp = 2 * F::batch * S::token_tiles * 4 * 32;
    static constexpr int bytes = S::warps * per_warp * 8;
};

template <class F, class S, class Epilogue, int N, int K, int Smem>
__device__ __forceinline__ void gemv_tc(const kiln_linear_args &args)
{
    static_assert(Smem == tc_smem<F, S>::bytes, "the host's shared memory is the template's");
    static_assert(K % 64 == 0, "whole atoms");
    constexpr int atoms = K / 64, tiles = (N + 15) / 16, TT = S::token_tiles;
    constexpr int chunk = (atoms + S::k_split - 1) / S::k_split;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int slice = warp % S::k_split, row_warp = warp / S::k_split;
    const int tile0 = (blockIdx.x * S::row_warps + row_warp) * S::row_tiles;
    const int a_begin = slice * chunk;
    const int a_end = a_begin + chunk < atoms ? a_begin + chunk : atoms;
    const u16 *x = static_cast<const u16 *>(args.x);
    const u8 *w = static_cast<const u8 *>(args.w);

    float acc[S::row_tiles][TT][4] = {};

    // One batch of atoms' weights in registers, and its x fragments in the
    // warp's shared-memory ring: each lane copies the fragments it will
    // read (cp.async, zeros for tokens past m), so the copies hold no
    // registers while in flight and need no synchronization but their own.
    using batch = typename F::raw[S::row_tiles][F::batch];
    extern __shared__ uint2 tc_x[];
    uint2 *ring = tc_x + warp * tc_smem<F, S>::per_warp + lane;
    auto slot = [&](int stage, int u, int n, int j) -> uint2 & {
        return ring[(((stage * F::batch + u) * TT + n) * 4 + j) * 32];
    };
    // Per-warp bases, so that an atom's addresses are a base plus
    // constants. A row tile past N (the last block's) loads nothing; a
    // token past m copies zeros from row 0, which every bucket has.
    const u8 *wtile[S::row_tiles];
    tc_scale_ptr sp[S::row_tiles];
    bool tile_ok[S::row_tiles];
#pragma unroll
    for (int r = 0; r < S::row_tiles; r++) {
        tile_ok[r] = tile0 + r < tiles;
        const int tile = tile_ok[r] ? tile0 + r : tiles - 1;
        wtile[r] = w + (i64)tile * atoms * F::atom_bytes + lane * 16;
        sp[r] = F::template scale_ptr<N, K>(args, tile, g);
    }
    const u16 *xrow[TT];
    int xbytes[TT];
#pragma unroll
    for (int n = 0; n < TT; n++) {
        const bool live = g + 8 * n < args.m;
        xrow[n] = x + (live ? (i64)(g + 8 * n) * K : 0) + 4 * t;
        xbytes[n] = live ? 8 : 0;
    }

    auto load = [&](int a0, batch &b, int stage) {
#pragma unroll
        for (int u = 0; u < F::batch; u++) {
            const int a = a0 + u;
            if (a >= a_end)
                break;
#pragma unroll
            for (int r = 0; r < S::row_tiles; r++) {
                if (!tile_ok[r])
                    continue;
                const u8 *p = wtile[r] + a * F::atom_bytes;
#pragma unroll
                for (int i = 0; i < F::pieces; i++)
                    b[r][u].q[i] = ld_stream(p + i * 512);
                F::load_high(p - lane * 16, lane, b[r][u]);
                F::load_scales(sp[r], a, b[r][u]);
            }
#pragma unroll
            for (int n = 0; n < TT; n++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    cp_async8(&slot(stage, u, n, j), xrow[n] + a * 64 + 16 * j, xbytes[n]);
        }
        cp_async_commit();
    };
    auto consume = [&](int a0, const batch &b, int stage) {
        cp_async_wait<1>(); // this stage's x; the next stage's may fly
#pragma unroll
        for (int u = 0; u < F::batch; u++) {
            if (a0 + u >= a_end)
                break;
            u32 xb[TT][4][2];
#pragma unroll
            for (int n = 0; n < TT; n++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const uint2 v = slot(stage, u, n, j);
                    xb[n][j][0] = v.x, xb[n][j][1] = v.y;
                }
#pragma unroll
            for (int r = 0; r < S::row_tiles; r++)
                if (tile_ok[r])
                    tc_atom<F, TT>(b[r][u], xb, acc[r]);
        }
    };

    // Two batches in flight per warp: the next one's loads are issued
    // before this one is decoded.
    batch b0, b1;
    load(a_begin, b0, 0);
#pragma unroll 1
    for (int a0 = a_begin; a0 < a_end; a0 += 2 * F::batch) {
        load(a0 + F::batch, b1, 1);
        consume(a0, b0, 0);
        load(a0 + 2 * F::batch, b0, 0);
        consume(a0 + F::batch, b1, 1);
    }

    constexpr int held = S::row_tiles * TT * 4;
    if constexpr (S::k_split > 1) {
        // [warp][value][lane]: lanes store and load consecutive words.
        __shared__ float red[S::warps][held][32];
        if (slice != 0)
#pragma unroll
            for (int r = 0; r < S::row_tiles; r++)
#pragma unroll
                for (int n = 0; n < TT; n++)
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        red[warp][(r * TT + n) * 4 + c][lane] = acc[r][n][c];
        __syncthreads();
        if (slice != 0)
            return;
#pragma unroll
        for (int s = 1; s < S::k_split; s++)
#pragma unroll
            for (int r = 0; r < S::row_tiles; r++)
#pragma unroll
                for (int n = 0; n < TT; n++)
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        acc[r][n][c] += red[warp + s][(r * TT + n) * 4 + c][lane];
    }

#pragma unroll
    for (int r = 0; r < S::row_tiles; r++)
#pragma unroll
        for (int n = 0; n < TT; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int row = (tile0 + r) * 16 + g + 8 * (c >> 1);
                const int token = 8 * n + 2 * t + (c & 1);
                if (row < N && token < args.m)
                    gemv_store<Epilogue>(args, N, row, token,
                                         acc[r][n][c] * F::row_scale(args, row));
            }
}

} // namespace kiln
