// The gemv_tc backend's kernel (sm_80+): y[m, N] = epilogue(x[m,
// K] · W[N, K]ᵀ) for m ≤ 16 with mma.sync m16n8k16 (BF16 in, f32
// accumulators), weights in the packed layout of kernels/gemv/pack.c.
//
// Why tensor cores for a matrix-vector product. At m = 16 a weight feeds
// 16 FMAs: 16 f32 FMAs per 4-bit weight is four times what the FMA pipe
// of an H200 can issue at its memory bandwidth. An mma takes 8 or 16
// tokens for the cost of one, so what remains per weight is its decoding
// into BF16: a few bit operations per pair of weights (below). The same
// kernel serves m = 1, where the seven other token columns cost nothing
// the memory does not already wait for, and carry the sums of x that the
// integer formats' offsets need (tc_col_sums); the M classes below 8 (1,
// 2, 4) stage x only for the lane groups that hold a token.
//
// The weights as the A operand. Rows of W are the mma's M (16 rows a
// tile), tokens its N (8 a tile, two tiles at m > 8), K its K. A lane
// (g = lane / 4, t = lane % 4) holds, for every k-tile of 16, the A
// fragment of rows g and g + 8 at four k slots; kiln's packing puts k =
// 16j + 4t + s (j: the k-tile, s: 0..3) in those slots, so the lane's x
// values of a k-tile are 4 consecutive BF16 (one 8-byte load), and a
// k-tile covers 16 consecutive k: a 16- or 32-value block scale of a
// format is the scale of whole k-tiles. BF16's and FP8's atoms are
// row-major instead, read by ldmatrix (tc_rows): BF16 in mma's own k order,
// FP8 in the order above.
//
// Atoms. 16 rows × 64 k, the unit of the packed stream: every lane reads
// its bytes of an atom as 16-byte pieces, the 32 lanes' pieces
// contiguous, so each copy instruction of a warp reads 512 bytes in a
// row. Scales ride in a separate array, one small record per atom.
//
// The stream. Each warp runs its own ring of Stages stages in shared
// memory, each holding Batch atoms of every row tile it owns: pieces and
// units, copied with cp.async by the lane that will read them, and the
// scale records and x rows, which lanes share, copied by the warp in
// 16-byte chunks and read after a __syncwarp (x by lane where a format
// without records runs one token: tc_smem). Stages − 1 stages are in
// flight while one is decoded, without holding registers. The first
// Stages − 1 stages' weights are copied before the kernel waits for the
// one launched before it (grid_wait_dependency, kiln/kiln_types.cuh), so that
// on sm_90 they fly while that kernel drains; their x, which it may
// write, after.
//
// Exactness. Every decoding below gives the format's value exactly in
// BF16 (the integer codes and FP8/FP4 magnitudes fit BF16's 8 significant
// bits), or F16's 11 as the sum of two BF16 (two mma). Block scales
// multiply the f32 partial product of the k-tiles they cover, per-tensor
// and per-row scales the final sum. The integer codes of
// Q4_0, Q4_K and Q6_K read 128 + their unsigned code; the offset (136, 128,
// 160) leaves through the sum of x over the block, and Q4_K's minimum
// through the same sum. An mma of x with an A of −offset starts each block
// sum (once an atom, for all of a warp's row tiles) and one with an A of
// ones gives the minimum's; at one token (and at two for Q4_0, up to four
// for Q4_K) the token tile's eight columns hold copies of the tokens, so
// the sums of a stage's blocks come a block and token a column instead
// (tc_col_sums). Only the order of the f32 additions differs from the CPU
// reference.
//
// Work split. A warp owns RowTiles consecutive row tiles and a contiguous
// KSplit-th of the atoms (the slices differ by at most one atom, or by a
// stage where a stage's atoms share units: tc_super_stage); the block's
// KSplit warps that share row tiles add their sums through shared memory,
// and the first of them applies the epilogue. grid = ceil(ceil(N / 16) /
// (RowTiles · Warps / KSplit)).
#pragma once

#include "kiln/gemv.cuh"
#include "kiln/tc_format.h"

namespace kiln {

// ------------------------------------------------------------ primitives

template <bool V>
struct bool_constant {
    static constexpr bool value = V;
};

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

// Four 8×8 BF16 matrices shared → registers: lanes 8i .. 8i + 7 give the
// addresses of matrix i's rows (16 bytes each), and lane (g, t) receives
// row g's values 2t and 2t + 1 of each, matrix i in word i.
__device__ __forceinline__ uint4 ldsm_x4(const u8 *row)
{
    uint4 v;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"((u32)__cvta_generic_to_shared(row)));
    return v;
}

// w >> k (0 < k < 32) as the high word of a multiply: on the FMA pipe,
// which the decodings leave idle, rather than on the ALU pipe with their
// bit operations.
__device__ __forceinline__ u32 shr(u32 w, int k) { return __umulhi(w, 1u << (32 - k)); }

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
// 128 + q through the magic. No arithmetic: the kernel takes the 128 (and
// a format's own offset: the trait's offset) out through the sums of x.
// BF16 has 7 mantissa bits, so each nibble is shifted down to bits 0..3.
__device__ __forceinline__ void decode_int4(u32 w, u32 (&a)[4])
{
    a[0] = lop_and_or(w, 0x000F000Fu, bf2_magic);
#pragma unroll
    for (int r = 1; r < 4; r++)
        a[r] = lop_and_or(shr(w, 4 * r), 0x000F000Fu, bf2_magic);
}

// Small integers to f32 without the conversion pipe (a quarter of the FMA
// rate): 2^23 + u for byte `byte` of w as an unsigned integer u, the byte
// put in the mantissa of 2^23 by one permute.
__device__ __forceinline__ float u8_over_2p23(u32 w, int byte)
{
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | (u32)byte));
}

// d · u, rounded once as d · u is: one fma gives d · (2^23 + u) + nd, nd =
// −2^23 · d (exact), the caller's once per d.
__device__ __forceinline__ float mul_u8(u32 w, int byte, float d, float nd)
{
    return fmaf(u8_over_2p23(w, byte), d, nd);
}

// Byte `byte` of w, an int8 s stored as s + 128: one exact subtraction.
__device__ __forceinline__ float biased_s8(u32 w, int byte)
{
    return u8_over_2p23(w, byte) - 8388736.0f;
}

// E2M1: the 3-bit magnitude c and the sign s of each value sit where one
// shift and mask move c to BF16 bits 6..8 and s to bit 15 (registers 0..2:
// c at 6, 3, 0 and s 9 above it; register 3 from the bits left: c >> 1 at
// 10, c & 1 at 13, s at 14), 16 higher for the high half. As a BF16, c at
// bits 6..8 is the E2M1 value · 2^-126 (code 1, a subnormal, included);
// one multiply restores it. GGML's MXFP4 stores doubled values: Scale
// 2^127.
// e2m1_bits gives the BF16 pairs of the values · 2^-126; the multiply by
// a row's (mul[0], registers 0 and 2) and row g + 8's (mul[1]) pair may
// bring in a block scale with it.
__device__ __forceinline__ void e2m1_bits(u32 w, u32 (&raw)[4])
{
    constexpr u32 mask = 0x81C081C0u;
    u32 r3 = shr(w, 3) & 0x01800180u;
    r3 = lop_and_or(shr(w, 7), 0x00400040u, r3);
    r3 = lop_and_or(w << 1, 0x80008000u, r3);
    raw[0] = w & mask, raw[1] = (w << 3) & mask, raw[2] = (w << 6) & mask, raw[3] = r3;
}

template <u32 Scale>
__device__ __forceinline__ void decode_e2m1(u32 w, u32 (&a)[4])
{
    u32 raw[4];
    e2m1_bits(w, raw);
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
    const u32 p1 = lop_and_or(w, 0x80008000u, shr(w, 4) & 0x07F007F0u);
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
    const u32 h0 = lop_and_or(shr(w, 4), 0x000F000Fu, bf2_magic);
    const u32 l1 = lop_and_or(shr(w, 8), 0x000F000Fu, bf2_magic);
    const u32 h1 = lop_and_or(shr(w, 12), 0x000F000Fu, bf2_magic);
    lo_reg = bf2_fma(l0, bf2_one, bf2_fma(h0, sixteen, minus_2304));
    hi_reg = bf2_fma(l1, bf2_one, bf2_fma(h1, sixteen, minus_2304));
}

// ------------------------------------------------------------- formats

// What a format's trait gives the kernel. Its packed atom, as the host
// sizes it (its row of kiln/tc_format.h, which says more):
//   atom_bytes    bytes of an atom in the data array
//   pieces        16-byte pieces of a lane's share of an atom's data
//   units         8-byte words a lane stages beside its pieces per atom
//                 (stage() copies them, fetch() reads them and the record)
//   record        bytes of a lane group's scale record per atom (0, 4, 8):
//                 the records of a stage's atoms are contiguous in the scale
//                 array, and the warp copies them together
//   super_record  bytes of a lane group's record per 256 values (Q4_K, Q6_K)
// and how it decodes them:
//   unit_atoms    consecutive atoms that share the units stage() copies
//                 when `first` (all of them but Q6_K's high bits): fetch()
//                 reads the atom's own units and those of the stage's
//                 first atom (tc_super_stage)
//   block_tiles   k-tiles one block scale covers; 0: none (row scale only)
//   raw           one atom in registers: decode() turns k-tile j into an A
//                 fragment, scale() gives block b's scales of rows g, g + 8
//   row_scale     what multiplies row n's sum at the end
//   min_blocks    blocks per SM the registers are budgeted for (one token tile)
//   col_groups    tokens up to which the sums of x come from idle token
//                 columns (tc_col_sums)
//   two_terms     decode() gives a k-tile as two A fragments whose sum is
//                 the weights (F16), each mma'd with x
//   rows          an atom is its 16 rows in order, row_bytes each (BF16,
//                 FP8), the bytes wgmma's TMA kernel reads too (tc_rows)
//   x_mma         x in mma's k order (BF16's rows), not 16j + 4t + s
// Where a lane finds its scale records.
struct tc_scale_ptr {
    const u8 *rec; // the row tile's records of atom 0 (FP8 block: its scale row)
    const u8 *sup; // this lane group's super-record of atom 0 (Q4_K, Q6_K)
};

template <int Pieces>
struct tc_raw {
    uint4 q[Pieces];
    u32 s[2];   // the atom's scale record
    u32 sup[2]; // the 256-value super-record (Q4_K, Q6_K)
    u32 qh[2];  // Q6_K's high bits
};

// One unit (4 or 8 bytes) global → shared; zeros where !live.
template <int Bytes>
__device__ __forceinline__ void cp_unit(uint2 *dst, const void *src, bool live)
{
    static_assert(Bytes == 4 || Bytes == 8, "a unit or half of one");
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(
                     (u32)__cvta_generic_to_shared(dst)),
                 "l"(src), "n"(Bytes), "r"(live ? Bytes : 0));
}

// 16 bytes global → shared through L1 (x: every warp of the SM reads the
// same), zeros where !live.
__device__ __forceinline__ void cp_cached16(u8 *dst, const void *src, bool live)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(
                     (u32)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(live ? 16 : 0));
}

// A format's packed atom: a row of kiln/tc_format.h.
template <int Bytes, int Pieces, int Units, int Record, int Super, int Rows>
struct tc_packed_atom {
    static constexpr int atom_bytes = Bytes, pieces = Pieces, units = Units, record = Record;
    static constexpr int super_record = Super;
    static constexpr bool rows = Rows != 0;
    static constexpr int row_bytes = Bytes / 16;
    static constexpr bool x_mma = rows && Pieces == 4;
};

// tc_layout_<name>: the atom of the format whose short name is name.
#define KILN_TC_LAYOUT(fmt, name, bytes, pieces, units, record, super, rows)                   \
    using tc_layout_##name = tc_packed_atom<bytes, pieces, units, record, super, rows>;
KILN_TC_FORMATS(KILN_TC_LAYOUT)
#undef KILN_TC_LAYOUT

template <class Layout>
struct tc_base : Layout {
    static constexpr int block_tiles = 0;
    static constexpr int min_blocks = 1; // __launch_bounds__: blocks per SM to fit
    static constexpr bool has_offset = false, has_min = false;
    static constexpr int unit_atoms = 1;
    static constexpr int col_groups = 1; // tc_col_sums up to this many tokens
    static constexpr bool two_terms = false;
    using raw = tc_raw<Layout::pieces>;
    template <int N, int K>
    static __device__ tc_scale_ptr scale_ptr(const kiln_linear_args &, int, int)
    {
        return {};
    }
    static __device__ void stage(const tc_scale_ptr &, const u8 *, int, int, uint2 *, bool, bool)
    {
    }
    template <class R>
    static __device__ void fetch(const uint2 *, const uint2 *, const u8 *, R &)
    {
    }
    static __device__ float row_scale(const kiln_linear_args &, int) { return 1.0f; }
};

// Row tile `tile`'s scale records of atom 0 (Record bytes for rows g and
// g + 8 of each lane group g, records atom-major), and lane group g's
// 256-value super-record after all the records (Q4_K, Q6_K).
template <int N, int K, int Record, int SuperRecord>
__device__ __forceinline__ tc_scale_ptr records_of(const kiln_linear_args &args, int tile, int g)
{
    constexpr i64 tiles = (N + 15) / 16;
    const u8 *s = static_cast<const u8 *>(args.w_scale);
    return { s + (i64)tile * (K / 64) * (8 * Record),
             s + tiles * (K / 64) * (8 * Record) + (i64)tile * (K / 256) * (8 * SuperRecord) +
                 g * SuperRecord };
}

// A lane group's Record-byte scale record (4 or 8) from the stage.
template <int Record, class R>
__device__ __forceinline__ void read_record(const u8 *rec, R &r)
{
    if constexpr (Record == 8) {
        const uint2 v = *reinterpret_cast<const uint2 *>(rec);
        r.s[0] = v.x, r.s[1] = v.y;
    } else {
        r.s[0] = *reinterpret_cast<const u32 *>(rec);
    }
}

// A format whose scales are its scale records (4 or 8 bytes) alone.
template <class Layout>
struct tc_recorded : tc_base<Layout> {
    static_assert(Layout::record > 0 && Layout::super_record == 0, "records alone");
    template <int N, int K>
    static __device__ tc_scale_ptr scale_ptr(const kiln_linear_args &args, int tile, int g)
    {
        return records_of<N, K, Layout::record, 0>(args, tile, g);
    }
    template <class R>
    static __device__ void fetch(const uint2 *, const uint2 *, const u8 *rec, R &r)
    {
        read_record<Layout::record>(rec, r);
    }
};

// Byte b of a record word as the OCP scale 2^(E − 127) in three
// instructions: E to bits 16..23 (a permute), to 23..30 (a multiply), and
// E = 0's 2^-127 as a maximum. E = 255, NaN, reads +inf: the packer zeroes
// that block's codes (kiln_gemv_pack), and inf · 0 is the NaN its weights
// are.
__device__ __forceinline__ float e8m0_byte(u32 word, int b)
{
    const u32 at16 = __byte_perm(word, 0u, 0x4044u | (u32)b << 8);
    return __uint_as_float(max(at16 * 128u, 0x00400000u));
}

// Byte b of a record word as ggml's half scale 2^(E − 128), E = 255's
// 2^127 included, in four instructions: E to bits 16..23 (a permute), then
// the larger of E · 2^23 − 2^23, the normal scales, and (E + 1) · 2^21,
// which gives E = 0's and 1's subnormals 2^-128 and 2^-127 (bit for bit
// e8m0_half_to_f32 for every E).
__device__ __forceinline__ float e8m0_half_byte(u32 word, int b)
{
    const u32 at16 = __byte_perm(word, 0u, 0x4044u | (u32)b << 8);
    return __int_as_float(max((int)(at16 * 128u - 0x00800000u), (int)(at16 * 32u + 0x00200000u)));
}

// Half b of each record word as f16 (rows g and g + 8).
__device__ __forceinline__ void scales_f16(const u32 (&s)[2], int b, float (&out)[2])
{
    out[0] = f16_to_f32((u16)(s[0] >> (16 * b)));
    out[1] = f16_to_f32((u16)(s[1] >> (16 * b)));
}

// Row-major atoms (rows): the A fragment of k-tile j in q[j] (tc_rows).
struct tc_bf16 : tc_base<tc_layout_bf16> {
    static __device__ void decode(const raw &r, int j, u32 (&a)[4])
    {
        a[0] = r.q[j].x, a[1] = r.q[j].y, a[2] = r.q[j].z, a[3] = r.q[j].w;
    }
};

// F16 pairs as two BF16 pairs hi + lo, each exact: hi the sign, exponent
// and top 7 mantissa bits of each value (F16's 10 less 3), lo its low 3
// mantissa bits at their weight. Shifted down by 3 beside the sign, an
// F16 is a BF16 of the value · 2^-112 whose last 3 bits fell off (an F16
// subnormal a BF16 subnormal), and a multiply restores it. lo: the 3 bits
// as the top of the mantissa of the BF16 base with hi's exponent and sign,
// less that base, times 2^105 (2^112 less the 7 bits they moved up): an
// F16 subnormal's base is zero, and the bits read as BF16 subnormal
// mantissa bits. hi ≤ 65504 and lo hold 8 and 3 significant bits. F16 has
// 31 for infinities and NaN, which this reads as 2^16: kiln_gemv_pack
// refuses them.
__device__ __forceinline__ void decode_f16_word(u32 w, u32 &hi, u32 &lo)
{
    constexpr u32 up112 = bf2_splat(0x7780u), up105 = bf2_splat(0x7400u);
    const u32 p = lop_and_or(shr(w, 3), 0x0FFF0FFFu, w & 0x80008000u);
    const u32 base = p & 0x8F808F80u;
    hi = bf2_fma(p, up112, bf2_neg_zero);
    lo = bf2_fma(lop_and_or(w << 4, 0x00700070u, base), up105,
                 bf2_fma(base, up105 ^ bf2_neg_zero, bf2_neg_zero));
}

struct tc_f16 : tc_base<tc_layout_f16> {
    static constexpr bool two_terms = true;
    static __device__ void decode(const raw &r, int j, u32 (&hi)[4], u32 (&lo)[4])
    {
#pragma unroll
        for (int i = 0; i < 4; i++)
            decode_f16_word(word_of(r.q[j], i), hi[i], lo[i]);
    }
};

// Row-major atoms (rows) hold k-tile j's bytes of rows g and g + 8 in
// words 2(j & 1) and 2(j & 1) + 1 of q[j / 2] (tc_rows), interleaved here
// as the packed words are.
template <class Base>
struct tc_e4m3_of : Base {
    using raw = typename Base::raw;
    static __device__ void decode(const raw &r, int j, u32 (&a)[4])
    {
        const uint4 &p = r.q[j >> 1];
        u32 w0 = word_of(p, (j & 1) * 2), w1 = word_of(p, (j & 1) * 2 + 1);
        if constexpr (Base::rows) {
            const u32 g = w0, g8 = w1;
            w0 = __byte_perm(g, g8, 0x5140), w1 = __byte_perm(g, g8, 0x7362);
        }
        decode_e4m3_word(w0, a[0], a[1]);
        decode_e4m3_word(w1, a[2], a[3]);
    }
};

struct tc_fp8 : tc_e4m3_of<tc_base<tc_layout_fp8>> {
    static __device__ float row_scale(const kiln_linear_args &a, int)
    {
        return *static_cast<const float *>(a.w_scale);
    }
};

struct tc_fp8_channel : tc_e4m3_of<tc_base<tc_layout_fp8_channel>> {
    static __device__ float row_scale(const kiln_linear_args &a, int n)
    {
        return static_cast<const float *>(a.w_scale)[n];
    }
};

// One f32 per 128 × 128 in kiln's storage layout: an atom is inside one.
struct tc_fp8_block : tc_e4m3_of<tc_base<tc_layout_fp8_block>> {
    static constexpr int block_tiles = 4, unit_atoms = 2;
    template <int N, int K>
    static __device__ tc_scale_ptr scale_ptr(const kiln_linear_args &args, int tile, int)
    {
        constexpr int cols = (K + 127) / 128;
        return { reinterpret_cast<const u8 *>(static_cast<const float *>(args.w_scale) +
                                              (i64)(tile / 8) * cols),
                 nullptr };
    }
    static __device__ void stage(const tc_scale_ptr &p, const u8 *, int atom, int, uint2 *unit,
                                 bool live, bool first)
    {
        if (first)
            cp_unit<4>(unit, reinterpret_cast<const float *>(p.rec) + atom / 2, live);
    }
    static __device__ void fetch(const uint2 *, const uint2 *unit0, const u8 *, raw &r)
    {
        r.s[0] = unit0[0].x;
    }
    static __device__ void scale(const raw &r, int, float (&s)[2])
    {
        s[0] = s[1] = __uint_as_float(r.s[0]);
    }
};

// Record: E8M0 of (g, k-block 0), (g, 1), (g + 8, 0), (g + 8, 1).
struct tc_mxfp8 : tc_e4m3_of<tc_recorded<tc_layout_mxfp8>> {
    static constexpr int block_tiles = 2;
    static __device__ void scale(const raw &r, int b, float (&s)[2])
    {
        s[0] = e8m0_byte(r.s[0], b);
        s[1] = e8m0_byte(r.s[0], b + 2);
    }
};

// Record: f16 of (g, 0), (g, 1), then (g + 8, 0), (g + 8, 1).
struct tc_q8_0 : tc_e4m3_of<tc_recorded<tc_layout_q8_0>> {
    static constexpr int block_tiles = 2;
    static __device__ void decode(const raw &r, int j, u32 (&a)[4])
    {
        const uint4 &p = r.q[j >> 1];
        decode_q8_word(word_of(p, (j & 1) * 2), a[0], a[1]);
        decode_q8_word(word_of(p, (j & 1) * 2 + 1), a[2], a[3]);
    }
    static __device__ void scale(const raw &r, int b, float (&s)[2]) { scales_f16(r.s, b, s); }
};

// Record as Q8_0's. The registers read 128 + q = (q − 8) + 136: offset 136.
struct tc_q4_0 : tc_recorded<tc_layout_q4_0> {
    static constexpr int block_tiles = 2;
    static constexpr bool has_offset = true;
    static constexpr int col_groups = 2;
    static __device__ void decode(const raw &r, int j, u32 (&a)[4])
    {
        decode_int4(word_of(r.q[0], j), a);
    }
    static constexpr float offset = 136.0f;
    static __device__ void scale(const raw &r, int b, float (&s)[2]) { scales_f16(r.s, b, s); }
};

// Record as MXFP8's. Scale: the power of two the E2M1 decoding restores.
template <class Layout, u32 Scale>
struct tc_e2m1_32 : tc_recorded<Layout> {
    using raw = typename tc_recorded<Layout>::raw;
    static constexpr int block_tiles = 2;
    static __device__ void decode(const raw &r, int j, u32 (&a)[4])
    {
        decode_e2m1<Scale>(word_of(r.q[0], j), a);
    }
};

struct tc_mxfp4 : tc_e2m1_32<tc_layout_mxfp4, 0x7E80u> { // 2^126
    static __device__ void scale(const raw &r, int b, float (&s)[2])
    {
        s[0] = e8m0_byte(r.s[0], b);
        s[1] = e8m0_byte(r.s[0], b + 2);
    }
};

// ggml's doubled values (2^127), its half scale finite at E = 255.
struct tc_ggml_mxfp4 : tc_e2m1_32<tc_layout_ggml_mxfp4, 0x7F00u> {
    static __device__ void scale(const raw &r, int b, float (&s)[2])
    {
        s[0] = e8m0_half_byte(r.s[0], b);
        s[1] = e8m0_half_byte(r.s[0], b + 2);
    }
};

// Record: the block scales of (g, k-tile 0..3), then (g + 8, 0..3), each
// re-encoded by the packer as f32 bits >> 20 less 110 << 3 (exponent and
// the 3 mantissa bits of the UE4M3 value, subnormals normalized). A block
// is a k-tile, and its scale s multiplies the E2M1 bits in place of
// 2^126: the BF16 pair of s · 2^118 (at most 448 · 2^118, within BF16)
// gives each A value e2m1 · s · 2^-8, exact (2 and 4 significant bits),
// and the mma sums the blocks straight into the accumulators; 2^8 joins
// the global scale. A zero scale's block has zero codes.
struct tc_nvfp4 : tc_recorded<tc_layout_nvfp4> {
    // Byte b of a record word as that BF16 pair: the byte to bits 0..7 and
    // 16..23 (a byte permute), times 16 plus the biases (a multiply-add).
    static __device__ u32 scale_pair(u32 word, int b)
    {
        const u32 twice = __byte_perm(word, 0u, 0x4040u | (u32)b << 8 | (u32)b);
        return twice * 16u + bf2_splat((110u << 7) + (118u << 7));
    }
    static __device__ void decode(const raw &r, int j, u32 (&a)[4])
    {
        u32 bits[4];
        e2m1_bits(word_of(r.q[0], j), bits);
        const u32 mul[2] = { scale_pair(r.s[0], j), scale_pair(r.s[1], j) };
#pragma unroll
        for (int i = 0; i < 4; i++)
            a[i] = bf2_fma(bits[i], mul[i & 1], bf2_neg_zero);
    }
    static __device__ float row_scale(const kiln_linear_args &a, int)
    {
        return *a.w_global * 256.0f;
    }
};

// Record: u8 scales of (g, sub-block 0), (g, 1), mins of (g, 0), (g, 1);
// then the same for g + 8. Super-record: f16 d, dmin of g, then of g + 8.
// The registers read 128 + q (decode_int4).
struct tc_q4_k : tc_base<tc_layout_q4_k> {
    static constexpr int block_tiles = 2, min_blocks = 2;
    static constexpr bool has_offset = true, has_min = true;
    static constexpr int unit_atoms = 4; // a 256-value super-block
    static constexpr int col_groups = 4;
    template <int N, int K>
    static __device__ tc_scale_ptr scale_ptr(const kiln_linear_args &args, int tile, int g)
    {
        return records_of<N, K, record, super_record>(args, tile, g);
    }
    static __device__ void stage(const tc_scale_ptr &p, const u8 *, int atom, int, uint2 *unit,
                                 bool live, bool first)
    {
        if (first)
            cp_unit<super_record>(unit, p.sup + atom / 4 * (8 * super_record), live);
    }
    static __device__ void fetch(const uint2 *, const uint2 *unit0, const u8 *rec, raw &r)
    {
        read_record<record>(rec, r);
        const uint2 d = unit0[0];
        r.sup[0] = d.x, r.sup[1] = d.y;
    }
    static __device__ void decode(const raw &r, int j, u32 (&a)[4])
    {
        decode_int4(word_of(r.q[0], j), a);
    }
    static constexpr float offset = 128.0f;
    // Rows g and g + 8: the f16 half `half` of the super-record (d, dmin)
    // times byte `byte` of the record (scale, min). The atom's blocks
    // share d, dmin and their −2^23 multiples.
    static __device__ void times_u8(const raw &r, int half, int byte, float (&out)[2])
    {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const float d = f16_to_f32((u16)(r.sup[i] >> (16 * half)));
            out[i] = mul_u8(r.s[i], byte, d, d * -8388608.0f);
        }
    }
    static __device__ void scale(const raw &r, int b, float (&s)[2]) { times_u8(r, 0, b, s); }
    static __device__ void minimum(const raw &r, int b, float (&m)[2]) { times_u8(r, 1, 2 + b, m); }
};

// Data: the low 4 bits as Q4_0's nibbles (512 bytes an atom), then the
// high 2 bits, 8 bytes a lane: k-tile j, register r at bits
// 2·((j & 1)·4 + r) of word j >> 1 (16 higher for the high half). Record:
// the int8 scales of (g, k-tile 0..3), then (g + 8, 0..3), each stored as
// s + 128. Super-record: f16 d of g, then of g + 8. Units: the high bits
// and the super-record. The registers read 128 + u, u = q + 32 the 6-bit
// code: offset 160.
struct tc_q6_k : tc_base<tc_layout_q6_k> {
    static constexpr int block_tiles = 1;
    static constexpr int unit_atoms = 4; // its super-record; the high bits are the atom's
    static constexpr bool has_offset = true;
    static constexpr float offset = 160.0f;
    template <int N, int K>
    static __device__ tc_scale_ptr scale_ptr(const kiln_linear_args &args, int tile, int g)
    {
        return records_of<N, K, record, super_record>(args, tile, g);
    }
    static __device__ void stage(const tc_scale_ptr &p, const u8 *atom, int a, int lane,
                                 uint2 *unit, bool live, bool first)
    {
        cp_unit<8>(unit, atom + pieces * 512 + lane * 8, live);
        if (first)
            cp_unit<super_record>(unit + 32, p.sup + a / 4 * (8 * super_record), live);
    }
    static __device__ void fetch(const uint2 *unit, const uint2 *unit0, const u8 *rec, raw &r)
    {
        read_record<record>(rec, r);
        const uint2 h = unit[0];
        r.qh[0] = h.x, r.qh[1] = h.y, r.sup[0] = unit0[32].x;
    }
    static __device__ void decode(const raw &r, int j, u32 (&a)[4])
    {
        // The high bits to bits 4, 5 beside the magic, then the low ones
        // below them: the 6-bit code in the mantissa, 7 bits wide.
        const u32 w = word_of(r.q[0], j), hw = r.qh[j >> 1];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int hs = 2 * ((j & 1) * 4 + i);
            const u32 h = hs < 4 ? hw << (4 - hs) : hs > 4 ? shr(hw, hs - 4) : hw;
            const u32 hm = lop_and_or(h, 0x00300030u, bf2_magic);
            a[i] = lop_and_or(i ? shr(w, 4 * i) : w, 0x000F000Fu, hm);
        }
    }
    static __device__ void scale(const raw &r, int b, float (&s)[2])
    {
        const float d0 = f16_to_f32((u16)r.sup[0]), d1 = f16_to_f32((u16)(r.sup[0] >> 16));
        s[0] = d0 * biased_s8(r.s[0], b);
        s[1] = d1 * biased_s8(r.s[1], b);
    }
};

// --------------------------------------------------------------- kernel

// MaxM tokens in one token tile of 8 (the lane groups g < MaxM hold x;
// the others' B fragments are zeros) or two (MaxM = 16). RowTiles row
// tiles of 16 a warp, KSplit warps sharing them, each warp streaming
// Batch atoms a stage through a ring of Stages stages.
template <int MaxM, int RowTiles, int Warps, int KSplit, int Batch, int Stages>
struct tc_shape {
    static_assert(MaxM == 1 || MaxM == 2 || MaxM == 4 || MaxM == 8 || MaxM == 16,
                  "a power of two up to two token tiles");
    static_assert(Warps % KSplit == 0, "k-split warps divide the block");
    static_assert(Batch >= 1 && Stages >= 2, "a stage in flight while one is read");
    static constexpr int token_tiles = MaxM > 8 ? 2 : 1, groups = MaxM < 8 ? MaxM : 8;
    static constexpr int row_tiles = RowTiles, warps = Warps, k_split = KSplit;
    static constexpr int batch = Batch, stages = Stages;
    static constexpr int threads = Warps * 32, row_warps = Warps / KSplit;
    // Accumulator values c of a token tile hold tokens 2t + (c & 1): at
    // one token the odd ones hold none, and are neither scaled nor stored.
    static constexpr int col_step = MaxM == 1 ? 2 : 1;
};

// Whether a stage's atoms share units: a format whose shared units (Q4_K's
// and Q6_K's 256-value super-record, FP8 block's 128-column scale) hold
// for F::unit_atoms atoms, at a stage of several atoms that divide them.
// The warps' slices of K then start on whole stages, so that a stage lies
// in one group, and its atoms read the shared units its first atom
// copies, which the compiler converts once a stage instead of once an
// atom.
template <class F, class S>
struct tc_super_stage {
    static constexpr bool value =
        F::unit_atoms > 1 && S::batch > 1 && F::unit_atoms % S::batch == 0;
};

// Blocks per SM for __launch_bounds__: a format's wish holds for one token
// tile; two need the registers of a lower occupancy.
template <class F, class S>
struct tc_min_blocks {
    static constexpr int value = S::token_tiles == 1 ? F::min_blocks : 1;
};

// Row-major atoms (F::rows): an atom is its 16 rows in order, RB bytes
// each (BF16: 128, FP8: 64, its rows 8 .. 15 swapped in pairs), so lane
// l's piece i is 16-byte chunk (16l mod RB) / 16 of row (512i + 16l) / RB
// in memory. The stage holds chunk c of
// row R at c ^ (R % 8) (RB 128) or c ^ (R / 2 % 4) (RB 64): the 8 rows a
// phase of a copy or of an ldmatrix touches fall on 8 different bank
// groups. ldmatrix.x4 reads k-tiles in one instruction, lane l addressing
// matrix l / 8: rows 8(l / 8 % 2) + l % 8, chunk 2j + l / 16. For BF16
// that is k-tile j's A fragment; for FP8, k-tiles 2j and 2j + 1 of rows g
// and g + 8, values 4t .. 4t + 3 a word, the k order of the other formats
// (tc_e4m3_of). BF16's k order is the weight's own (F::x_mma), so x's B
// fragment of k-tile j is a token's values 16j + 2t, + 1 and those 8 higher:
// copied by lane as two 4-byte pieces at one token (tc_smem's x_by_lane),
// read by ldmatrix.x4 from the x rows, two k-tiles an instruction,
// otherwise; those rows then take 16 bytes of padding, not 32 (a row
// stride of 16 mod 128: 8 rows on 8 bank groups). wgmma's TMA kernel
// reads the same atoms as 128-byte rows of its swizzled tiles (FP8: two
// rows of 64 each, the swap making the 128-byte swizzle of the copy the
// 64-byte one of the MMA), so BF16 and FP8 keep one device copy; read
// straight from the storage layout, 128 or 256 bytes of each row a stage,
// decoding lost up to 9 %.
template <int RB>
struct tc_rows {
    static __device__ __forceinline__ int swizzle(int row)
    {
        return RB == 128 ? row & 7 : (row >> 1) & 3;
    }
    // Where lane l's piece i lands in the atom's bytes, less i · 512 (odd:
    // i & 1).
    static __device__ __forceinline__ int stage_at(int lane, int odd)
    {
        const int at = odd * 512 + lane * 16, row = at / RB;
        return row * RB + ((at % RB / 16) ^ swizzle(row)) * 16 - odd * 512;
    }
    // Lane l's row address in the atom for ldmatrix.x4 j: FP8's rows 8 ..
    // 15 lie swapped in pairs (R ^ 1), so that wgmma's TMA map reads
    // 128-byte rows (tma_e4m3_atoms).
    static __device__ __forceinline__ int frag_at(int lane, int j)
    {
        const int row = (lane >> 3 & 1) * 8 + (lane & 7), at = RB == 64 ? row ^ (row >> 3) : row;
        return at * RB + (((2 * j + (lane >> 4)) ^ swizzle(at)) * 16);
    }
};

// Dynamic shared memory: each warp's ring of stages, a stage holding its
// atoms' pieces [atom][row tile][piece][lane] × 16 bytes, their units
// [atom][row tile][unit][lane] × 8, the row tiles' scale records [row
// tile][atom][lane group] × record, and x. A format with scale records
// copies x by warp, like the records: a row per token of the lane groups
// holding x, [token tile][group] × (the atoms' 64 values, 32 bytes of
// padding so that a warp's reads of 8 bytes a lane are free of bank
// conflicts; 16 in mma order: tc_rows). One without (BF16, FP8) at one token
// has each lane copy the x fragments it reads, [atom][token tile][k-tile]
// [lane of the groups] × 8, which costs such a short stage less than the
// warp's copies and their reads; from two tokens on the warp copies are
// as fast or faster, but for BF16's atoms, which copy by lane up to two
// tokens.
template <class F, class S>
struct tc_smem {
    static constexpr bool x_by_lane =
        F::record == 0 && (S::groups == 1 || (F::x_mma && S::groups == 2));
    static constexpr int pieces = S::batch * S::row_tiles * F::pieces * 512;
    static constexpr int units = S::batch * S::row_tiles * F::units * 256;
    static constexpr int records = S::row_tiles * S::batch * 8 * F::record;
    static constexpr int x_row = S::batch * 128 + (F::x_mma ? 16 : 32);
    static constexpr int x = x_by_lane ? S::batch * S::token_tiles * 4 * S::groups * 32
                                       : S::token_tiles * S::groups * x_row;
    static constexpr int stage = pieces + units + records + x;
    static constexpr int per_warp = S::stages * stage;
    static constexpr int bytes = S::warps * per_warp;
    static_assert(S::batch * 8 * F::record <= 512, "a row tile's records in one copy a lane");
};

// Per block of an atom's k-tiles, what every row tile's block sum needs
// from x alone, so the warp's row tiles share it: −offset · Σ x, an mma
// of x with an A of −offset, which starts the block's sum (the codes read
// 128 + q); and for Q4_K's minimum Σ x, an mma with an A of ones.
template <class F, int TT>
struct tc_xblocks {
    static constexpr int blocks = F::block_tiles ? 4 / F::block_tiles : 1;
    float off[F::has_offset ? blocks : 1][TT][4];
    float sum[F::has_min ? blocks : 1][TT][4];
};

// d = Σ over the BT k-tiles of a block of an mma of a with x's B
// fragments b[0 .. BT − 1].
template <int BT>
__device__ __forceinline__ void mma_block(float (&d)[4], const u32 (&a)[4], const u32 (*b)[2])
{
    const float zero[4] = {};
    mma_bf16(d, a, b[0], zero);
#pragma unroll
    for (int jj = 1; jj < BT; jj++)
        mma_bf16(d, a, b[jj], d);
}

template <class F, int TT>
__device__ __forceinline__ void tc_xsums(const u32 (&xb)[TT][4][2], const u32 (&neg)[4],
                                         const u32 (&ones)[4], tc_xblocks<F, TT> &xs)
{
    constexpr int BT = F::block_tiles;
#pragma unroll
    for (int b = 0; b < tc_xblocks<F, TT>::blocks; b++)
#pragma unroll
        for (int n = 0; n < TT; n++) {
            if constexpr (F::has_offset)
                mma_block<BT>(xs.off[b][n], neg, &xb[n][b * BT]);
            if constexpr (F::has_min)
                mma_block<BT>(xs.sum[b][n], ones, &xb[n][b * BT]);
        }
}

// Below 8 tokens (one token tile of G lane groups' rows, the other groups
// reading copies of them), the sums of x over a stage's blocks can come
// from the columns: lane group g supplies token g % G of block g / G of a
// round of 8 / G blocks, and column n of an mma of x with an A of ones
// (or of −offset: tc_col_sums_neg) gives that block's sum for that token,
// its k-tile jj in the jj-th of the block's k-tiles mma: eight blocks a
// round at one token, in two mma for Q4_0 and Q4_K and one for Q6_K's
// 16-value blocks. Lane t holds columns 2t and 2t + 1, tokens (2t + e) %
// G (e = 0, 1, the parity of the column), and takes each of its blocks'
// sums from the lane holding it; at one token only e = 0. Past one token
// a lane takes twice the sums, and its blocks' sums start from them in
// four values where tc_xsums starts them in the mma, so a format takes
// them up to its col_groups tokens, as far as they are faster: Q4_K to
// 4 tokens, Q4_0 to 2, Q6_K at one. From 8 tokens on, tc_xsums serve
// every row tile of a warp.
template <class F, class S>
struct tc_col_sums {
    static constexpr bool value = S::token_tiles == 1 && S::groups <= F::col_groups &&
                                  (F::has_offset || F::has_min);
    static constexpr int blocks = F::block_tiles ? S::batch * 4 / F::block_tiles : 1;
};

// Whether the column sums are −offset · Σ x, which start a block's mma:
// a format with an offset and no minimum, past one token. At one token
// (CS = 2) two multiply-adds a block bring the offset in for less than
// the four values of an mma's start.
template <class F, int CS>
struct tc_col_sums_neg {
    static constexpr bool value = F::has_offset && !F::has_min && CS == 1;
};

// x_lane: the stage's x row (of token g % G) at this lane's 4 values of
// k-tile 0; a: the A of ones or of −offset (tc_col_sums_neg).
template <class F, class S>
__device__ __forceinline__ void tc_stage_sums(const u8 *x_lane, const u32 (&a)[4], int g, int t,
                                              float (&sum)[tc_col_sums<F, S>::blocks][2])
{
    constexpr int BT = F::block_tiles, blocks = tc_col_sums<F, S>::blocks;
    constexpr int G = S::groups, per = 8 / G;
#pragma unroll
    for (int b0 = 0; b0 < blocks; b0 += per) {
        // Lane groups past the stage's blocks add up a block again, unread.
        const int n = b0 + g / G < blocks ? b0 + g / G : b0;
        float c[4] = {};
#pragma unroll
        for (int jj = 0; jj < BT; jj++) {
            const uint2 v = *reinterpret_cast<const uint2 *>(x_lane + 32 * (n * BT + jj));
            const u32 b[2] = { v.x, v.y };
            mma_bf16(c, a, b, c);
        }
#pragma unroll
        for (int b = b0; b < blocks && b < b0 + per; b++) {
            if constexpr (G == 1) {
                sum[b][0] = __shfl_sync(~0u, c[b & 1], (b - b0) >> 1);
            } else {
                // column (b − b0) · G + (2t + e) % G, of parity e
#pragma unroll
                for (int e = 0; e < 2; e++)
                    sum[b][e] = __shfl_sync(~0u, c[e], ((b - b0) * G + (2 * t + e) % G) >> 1);
            }
        }
    }
}

// One atom of one row tile into the accumulators: decode each k-tile,
// mma it with every token tile, and bring block scales (and the offset
// and minimum through the x sums) in once per block. Values c of a token
// tile step by CS (S::col_step). Cols: the block sums are the atom's
// entries of tc_stage_sums (col[block][parity of the column]), not xs.
template <class F, int TT, int CS, bool Cols>
__device__ __forceinline__ void tc_atom(const typename F::raw &r, const u32 (&xb)[TT][4][2],
                                        const tc_xblocks<F, TT> &xs, const float (*col)[2],
                                        float (&acc)[TT][4])
{
    if constexpr (F::two_terms) {
        static_assert(F::block_tiles == 0, "a row scale only");
#pragma unroll
        for (int j = 0; j < 4; j++) {
            u32 hi[4], lo[4];
            F::decode(r, j, hi, lo);
#pragma unroll
            for (int n = 0; n < TT; n++) {
                mma_bf16(acc[n], hi, xb[n][j], acc[n]);
                mma_bf16(acc[n], lo, xb[n][j], acc[n]);
            }
        }
    } else if constexpr (F::block_tiles == 0) {
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
            float part[TT][4];
#pragma unroll
            for (int jj = 0; jj < BT; jj++) {
                u32 a[4];
                F::decode(r, b * BT + jj, a);
#pragma unroll
                for (int n = 0; n < TT; n++) {
                    // The block's sum starts from −offset · Σ x, or zero.
                    float from[4] = {};
                    if constexpr (F::has_offset && !Cols)
#pragma unroll
                        for (int c = 0; c < 4; c++)
                            from[c] = xs.off[b][n][c];
                    if constexpr (Cols && tc_col_sums_neg<F, CS>::value)
#pragma unroll
                        for (int c = 0; c < 4; c++)
                            from[c] = col[b][c & 1];
                    mma_bf16(part[n], a, xb[n][b * BT + jj], jj ? part[n] : from);
                }
            }
            if constexpr (F::has_offset && Cols && !tc_col_sums_neg<F, CS>::value)
#pragma unroll
                for (int n = 0; n < TT; n++)
#pragma unroll
                    for (int c = 0; c < 4; c += CS)
                        part[n][c] = fmaf(col[b][c & 1], -F::offset, part[n][c]);
            float s[2];
            F::scale(r, b, s);
            if constexpr (F::has_min) {
                float m[2];
                F::minimum(r, b, m);
#pragma unroll
                for (int n = 0; n < TT; n++)
#pragma unroll
                    for (int c = 0; c < 4; c += CS)
                        acc[n][c] =
                            fmaf(-m[c >> 1], Cols ? col[b][c & 1] : xs.sum[b][n][c], acc[n][c]);
            }
#pragma unroll
            for (int n = 0; n < TT; n++)
#pragma unroll
                for (int c = 0; c < 4; c += CS)
                    acc[n][c] = fmaf(part[n][c], s[c >> 1], acc[n][c]);
        }
    }
}

template <class F, class S, class Epilogue, int N, int K, int Smem>
__device__ __forceinline__ void gemv_tc(const kiln_linear_args &args)
{
    using L = tc_smem<F, S>;
    static_assert(Smem == L::bytes, "the host's shared memory is the template's");
    static_assert(K % 64 == 0, "whole atoms");
    static_assert(!F::rows || (F::record == 0 && F::units == 0 && !F::has_offset &&
                               !F::has_min && !F::two_terms && F::pieces * 512 == F::atom_bytes),
                  "a format in rows is its values alone");
    using Rows = tc_rows<F::rows ? F::row_bytes : 128>;
    // The gate epilogue: the warp's row tiles alternate, even ones of the
    // gate projection (w2), odd ones of this linear's (w), the same rows:
    // every x fragment staged feeds both, and the product leaves at once.
    constexpr bool Gate = Epilogue::gate;
    static_assert(!Gate || S::row_tiles % 2 == 0, "a gate tile beside each up tile");
    constexpr int atoms = K / 64, tiles = (N + 15) / 16 * (Gate ? 2 : 1), TT = S::token_tiles;
    constexpr int RT = S::row_tiles, B = S::batch, ST = S::stages;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int slice = warp % S::k_split, row_warp = warp / S::k_split;
    // The slices of K differ by at most one atom, or where a stage's atoms
    // share units, start on whole stages and differ by at most one (the
    // last takes what K leaves past them). Where the slices are whole
    // stages, the compiler sees it, and drops the short stage's path.
    constexpr int per = tc_super_stage<F, S>::value ? B : 1, groups = atoms / per;
    constexpr int rest = atoms % per;
    const int a_begin = slice * groups / S::k_split * per,
              a_end = (slice + 1) * groups / S::k_split * per +
                      (rest && slice == S::k_split - 1 ? rest : 0);
    const int tile0 = (blockIdx.x * S::row_warps + row_warp) * RT;
    const u16 *x = static_cast<const u16 *>(args.x);
    kiln_linear_args gate = args;
    if constexpr (Gate)
        gate.w = args.w2, gate.w_scale = args.w2_scale, gate.w_global = args.w2_global;

    // The warp's ring. Each lane copies its pieces and units; the records
    // and x, shared by lanes, are copied by the warp together in 16-byte
    // chunks (x by lane for a format without records at one token: see
    // tc_smem). A stage is read after the lanes' waits and, where lanes
    // read each other's copies, a __syncwarp; it is written again only
    // after the next one. ST − 1 stages are in flight while one is read,
    // without holding registers.
    extern __shared__ uint4 tc_ring[];
    u8 *const ring = reinterpret_cast<u8 *>(tc_ring) + warp * L::per_warp;

    // Per-lane bases. A row tile past N (the last block's) streams the
    // last tile again and stores nothing; a token past m, and an atom past
    // the slice, copy zeros.
    const u8 *wtile[RT];
    tc_scale_ptr sp[RT];
#pragma unroll
    for (int r = 0; r < RT; r++) {
        const int at = tile0 + r < tiles ? tile0 + r : tiles - 1, tile = Gate ? at >> 1 : at;
        const kiln_linear_args &wa = Gate && r % 2 == 0 ? gate : args;
        wtile[r] = static_cast<const u8 *>(wa.w) + (i64)tile * atoms * F::atom_bytes + lane * 16;
        sp[r] = F::template scale_ptr<N, K>(wa, tile, g);
    }
    const int piece_at[2] = { Rows::stage_at(lane, 0), Rows::stage_at(lane, 1) };
    const bool holds_x = S::groups == 8 || g < S::groups;
    // The lane groups past the tokens read a copied row too, group g %
    // groups's: their mma columns are tokens never stored, and an
    // unpredicated read needs no zeros.
    const int x_group = g % S::groups, x_lane = lane % (S::groups * 4);
    // Where a lane copies its own x fragments (L::x_by_lane): its token's
    // row, or row 0 for a token past m (copying zeros).
    const u16 *xlane[TT];
    bool xlive[TT];
#pragma unroll
    for (int n = 0; n < TT; n++) {
        xlive[n] = holds_x && g + 8 * n < args.m;
        xlane[n] = x + (xlive[n] ? (i64)(g + 8 * n) * K : 0) + (F::x_mma ? 2 : 4) * t;
    }

    // Stage `stage` ← atoms a0 .. a0 + B − 1: the weights' pieces, units
    // and records where Weights, x where X. A whole batch in the slice
    // addresses its atoms from a0 with constant offsets; the last one of a
    // slice may stop short (Full false), its atoms past the slice copying
    // zeros from a_begin.
    auto copy = [&](auto full, auto weights, auto xs, int stage, int a0) {
        constexpr bool Full = decltype(full)::value, Weights = decltype(weights)::value;
        constexpr bool X = decltype(xs)::value;
        u8 *st = ring + stage * L::stage;
        const i64 at0 = (i64)a0 * F::atom_bytes;
        if constexpr (Weights) {
#pragma unroll
            for (int u = 0; u < B; u++) {
                const bool live = Full || a0 + u < a_end;
                const int a = Full || live ? a0 + u : a_begin;
#pragma unroll
                for (int r = 0; r < RT; r++) {
                    // A whole batch's atoms at constant offsets from the first.
                    const u8 *p = Full ? wtile[r] + at0 + u * F::atom_bytes
                                       : wtile[r] + (i64)a * F::atom_bytes;
                    u8 *const atom = st + (u * RT + r) * F::pieces * 512;
#pragma unroll
                    for (int i = 0; i < F::pieces; i++)
                        cp_async<16>(atom + i * 512 + (F::rows ? piece_at[i & 1] : lane * 16),
                                     p + i * 512, live ? 16 : 0);
                    // Units the stage's atoms share: the first one's.
                    F::stage(sp[r], p - lane * 16, a, lane,
                             reinterpret_cast<uint2 *>(st + L::pieces +
                                                       (u * RT + r) * F::units * 256) +
                                 lane,
                             live, !tc_super_stage<F, S>::value || u == 0);
                }
            }
        }
        if constexpr (Weights && F::record > 0) {
            constexpr int chunks = B * 8 * F::record / 16; // a row tile's, one a lane
            if (lane < chunks) {
                const int atom = a0 + lane * 16 / (8 * F::record);
                const bool live = Full || atom < a_end;
#pragma unroll
                for (int r = 0; r < RT; r++)
                    cp_async<16>(st + L::pieces + L::units + r * B * 8 * F::record + lane * 16,
                                 sp[r].rec + (live ? (i64)a0 * 8 * F::record + lane * 16 : 0),
                                 live ? 16 : 0);
            }
        }
        if constexpr (!X)
            return;
        if constexpr (L::x_by_lane) {
#pragma unroll
            for (int u = 0; u < B; u++) {
                const bool live = Full || a0 + u < a_end;
                const int a = Full || live ? a0 + u : a_begin;
                if (holds_x)
#pragma unroll
                    for (int n = 0; n < TT; n++)
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            u8 *const dst = st + L::pieces + L::units +
                                            ((u * TT + n) * 4 + j) * S::groups * 32 + 8 * lane;
                            const u16 *const src = xlane[n] + a * 64 + 16 * j;
                            const bool on = live && xlive[n];
                            if constexpr (F::x_mma) {
                                // values 2t, 2t + 1 and the two 8 higher (tc_rows)
                                cp_async<4>(dst, reinterpret_cast<const u8 *>(src), on ? 4 : 0);
                                cp_async<4>(dst + 4, reinterpret_cast<const u8 *>(src + 8),
                                            on ? 4 : 0);
                            } else {
                                cp_unit<8>(reinterpret_cast<uint2 *>(dst), src, on);
                            }
                        }
            }
            return;
        }
        constexpr int row_chunks = B * 8, x_chunks = TT * S::groups * row_chunks;
#pragma unroll
        for (int c0 = 0; c0 < x_chunks; c0 += 32) {
            const int c = c0 + lane;
            if (x_chunks % 32 == 0 || c < x_chunks) {
                const int row = c / row_chunks, col = c % row_chunks;
                const int token = row / S::groups * 8 + row % S::groups;
                const bool live = token < args.m && (Full || a0 + col / 8 < a_end);
                cp_cached16(st + L::pieces + L::units + L::records + row * L::x_row + col * 16,
                            x + (live ? (i64)token * K + a0 * 64 + col * 8 : 0), live);
            }
        }
    };
    auto issue = [&](auto weights, auto xs, int stage, int a0) {
        if (a0 + B <= a_end)
            copy(bool_constant<true>{}, weights, xs, stage, a0);
        else if (a0 < a_end)
            copy(bool_constant<false>{}, weights, xs, stage, a0);
    };
    constexpr bool_constant<true> yes{};
    constexpr bool_constant<false> no{};

    // The A operands of −offset and of ones, four registers each built
    // once. Each adds a zero the compiler cannot see (m < 2^24): four
    // equal constants it would fold into one register, and copy into a
    // quad for every mma.
    using C = tc_col_sums<F, S>;
    u32 neg[4] = {}, ones[4] = {};
    if constexpr (F::has_offset || F::has_min) {
        u32 neg_bits = 0;
        if constexpr (F::has_offset)
            neg_bits = bf2_splat(f32_to_bf16(-F::offset));
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const u32 zero = (u32)args.m >> (24 + i);
            neg[i] = neg_bits + zero;
            ones[i] = bf2_one + zero;
        }
    }

    int frag_at[F::pieces];
#pragma unroll
    for (int j = 0; j < F::pieces; j++)
        frag_at[j] = Rows::frag_at(lane, j);

    float acc[RT][TT][4] = {};
    auto consume = [&](int stage) {
        const u8 *st = ring + stage * L::stage;
        const u8 *xs_row = st + L::pieces + L::units + L::records + x_group * L::x_row + 8 * t;
        // ldmatrix's rows of x (tc_rows): lane l gives token l % 8's
        // (the group's copy past the groups) chunk l / 8 of a k-tile pair.
        const u8 *x_ld = st + L::pieces + L::units + L::records +
                         (lane & 7) % S::groups * L::x_row + 16 * (lane >> 3);
        float col[C::blocks][2];
        if constexpr (C::value) {
            static_assert(!L::x_by_lane, "the stage's x row, copied by the warp");
            if constexpr (tc_col_sums_neg<F, S::col_step>::value)
                tc_stage_sums<F, S>(xs_row, neg, g, t, col);
            else
                tc_stage_sums<F, S>(xs_row, ones, g, t, col);
        }
#pragma unroll
        for (int u = 0; u < B; u++) {
            u32 xb[TT][4][2];
            if constexpr (F::x_mma && !L::x_by_lane) {
#pragma unroll
                for (int n = 0; n < TT; n++)
#pragma unroll
                    for (int jp = 0; jp < 2; jp++) {
                        const uint4 v =
                            ldsm_x4(x_ld + n * S::groups * L::x_row + u * 128 + 64 * jp);
                        xb[n][2 * jp][0] = v.x, xb[n][2 * jp][1] = v.y;
                        xb[n][2 * jp + 1][0] = v.z, xb[n][2 * jp + 1][1] = v.w;
                    }
            } else {
#pragma unroll
                for (int n = 0; n < TT; n++)
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const uint2 v =
                            L::x_by_lane
                                ? reinterpret_cast<const uint2 *>(
                                      st + L::pieces + L::units +
                                      ((u * TT + n) * 4 + j) * S::groups * 32)[x_lane]
                                : *reinterpret_cast<const uint2 *>(
                                      xs_row + n * S::groups * L::x_row + u * 128 + 32 * j);
                        xb[n][j][0] = v.x, xb[n][j][1] = v.y;
                    }
            }
            tc_xblocks<F, TT> xs;
            if constexpr (!C::value)
                tc_xsums<F, TT>(xb, neg, ones, xs);
#pragma unroll
            for (int r = 0; r < RT; r++) {
                typename F::raw raw;
                const u8 *const atom = st + (u * RT + r) * F::pieces * 512;
#pragma unroll
                for (int i = 0; i < F::pieces; i++)
                    raw.q[i] = F::rows ? ldsm_x4(atom + frag_at[i])
                                       : reinterpret_cast<const uint4 *>(atom + i * 512)[lane];
                const uint2 *units = reinterpret_cast<const uint2 *>(st + L::pieces) + lane;
                const int first = tc_super_stage<F, S>::value ? 0 : u;
                F::fetch(units + (u * RT + r) * F::units * 32,
                         units + (first * RT + r) * F::units * 32,
                         st + L::pieces + L::units + (r * B + u) * 8 * F::record + g * F::record,
                         raw);
                tc_atom<F, TT, S::col_step, C::value>(
                    raw, xb, xs, C::value ? col + u * C::blocks / B : col, acc[r]);
            }
        }
    };

    // The rows' final scales, loaded before the stream: loaded at the end,
    // where they are used, every warp would finish waiting for them (FP8
    // per-channel scales come from DRAM). Formats without one fold 1.
    float row_scales[RT][2];
#pragma unroll
    for (int r = 0; r < RT; r++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = (Gate ? (tile0 + r) >> 1 : tile0 + r) * 16 + g + 8 * h;
            row_scales[r][h] =
                F::row_scale(Gate && r % 2 == 0 ? gate : args, row < N ? row : N - 1);
        }

    // The first ST − 1 stages' weights fly before the kernel launched
    // before this one has finished (grid_wait_dependency); their x, which
    // that kernel may write, after. The first stage is read once all of
    // them have landed.
    grid_launch_dependents();
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        issue(yes, no, s, a_begin + s * B);
        cp_async_commit();
    }
    grid_wait_dependency();
#pragma unroll
    for (int s = 0; s < ST - 1; s++)
        issue(no, yes, s, a_begin + s * B);
    cp_async_commit();
    cp_async_wait<0>();
    const int chunks = (a_end - a_begin + B - 1) / B;
#pragma unroll 1
    for (int c = 0; c < chunks; c += ST) {
#pragma unroll
        for (int s = 0; s < ST; s++) {
            if (c + s >= chunks)
                break;
            cp_async_wait<ST - 2>(); // this lane's copies of stage s have landed
            // wait_group covers only the calling lane's copies: the warp
            // meets so every lane's have (lanes read x rows, records and
            // units other lanes copied), and so stage s − 1 is read before
            // the issue below overwrites it.
            __syncwarp();
            issue(yes, yes, (s + ST - 1) % ST, a_begin + (c + s + ST - 1) * B);
            cp_async_commit();
            consume(s);
        }
    }
    cp_async_wait<0>();

    // The k-split warps' sums meet in shared memory; the first slice's
    // warp applies the epilogue. Values c step by CS (S::col_step).
    constexpr int held = RT * TT * 4, CS = S::col_step;
    if constexpr (S::k_split > 1) {
        // [warp][value][lane]: lanes store and load consecutive words. The
        // host counts these bytes (tc_red in kernels/gemv/tc.c).
        __shared__ float red[S::warps][held][32];
        float *const v = &acc[0][0][0];
        if (slice != 0)
#pragma unroll
            for (int i = 0; i < held; i += CS)
                red[warp][i][lane] = v[i];
        __syncthreads();
        if (slice != 0)
            return;
#pragma unroll
        for (int s = 1; s < S::k_split; s++)
#pragma unroll
            for (int i = 0; i < held; i += CS)
                v[i] += red[warp + s][i][lane];
    }

    if constexpr (Gate) {
        // The gate rounded to BF16, as the graph's gate tensor is.
#pragma unroll
        for (int r = 0; r < RT; r += 2)
#pragma unroll
            for (int n = 0; n < TT; n++)
#pragma unroll
                for (int c = 0; c < 4; c += CS) {
                    const int row = (tile0 + r) / 2 * 16 + g + 8 * (c >> 1);
                    const int token = 8 * n + 2 * t + (c & 1);
                    const float gv = bf16_to_f32(f32_to_bf16(acc[r][n][c] * row_scales[r][c >> 1]));
                    if (row < N && token < args.m)
                        gemv_store<epilogue<false, false, false>>(
                            args, N, row, token,
                            silu_mul(acc[r + 1][n][c] * row_scales[r + 1][c >> 1], gv));
                }
    } else {
#pragma unroll
        for (int r = 0; r < RT; r++)
#pragma unroll
            for (int n = 0; n < TT; n++)
#pragma unroll
                for (int c = 0; c < 4; c += CS) {
                    const int row = (tile0 + r) * 16 + g + 8 * (c >> 1);
                    const int token = 8 * n + 2 * t + (c & 1);
                    if (row < N && token < args.m)
                        gemv_store<Epilogue>(args, N, row, token,
                                             acc[r][n][c] * row_scales[r][c >> 1]);
                }
    }
}

} // namespace kiln
