// The wgmma_tc backend's Hopper GEMM: y[m, N] = epilogue(x[m, K] · W[N,
// K]ᵀ) with the weight as the register operand of the warpgroup MMAs,
// decoded from the gemv_tc packed layout (kernels/gemv/pack.h), the one
// device copy the decode kernel reads too.
//
// Roles. The rows of W are the MMA's M (64 a consumer warpgroup, 128 a
// block, or 64 where the two consumers split K: wtc_tile), the tokens its
// N (BT a tile), K its K. A warp of a consumer
// owns one 16-row tile of the packed layout: lane l's 16-byte piece of
// an atom is, k-tile by k-tile, the A fragment of an m16n8k16 MMA, which
// is also what wgmma takes from a warp's registers for its 16 rows. The
// format's trait of kiln/tc.cuh decodes it to BF16 in registers, its
// block scales folded in where that is exact (NVFP4's E4M3 and the OCP
// and GGML powers of two: E2M1 times either needs at most 5 of BF16's 8
// significant bits); a per-tensor or per-row scale multiplies the sums.
// The integer GGML formats (Q8_0, Q4_0, Q4_K, Q6_K) have weights of up to
// 24 significant bits: each is computed in f32 as the CPU dequantizer
// computes it and rounded once to BF16 (wtc_decode); F16's 11 are rounded
// once to BF16 too, as the dequantizing wgmma kernel rounds them (the
// decode kernels take F16 exactly, as two BF16 terms).
//
// Activations. The packing puts k = 16j + 4t + s of k-tile j in lane t's
// slot s, whose MMA position is 2t + (s & 1) + 8(s >> 1). x therefore
// arrives permuted the same way within every 16 values of K: the
// bf16-tc activation scheme, written by the quantization step before
// the linear (quant_bf16_tc). TMA brings BT rows × 128 bytes of K (one
// atom) into shared memory with the 128-byte swizzle, the B operand's
// K-major layout, as in kiln/tma.cuh.
//
// Pipeline. A block is three warpgroups. One thread of the first copies
// each stage (an atom of K) by TMA: x, the block's row tiles' atoms, their
// scale records and super-records, a copy each (3-D maps over the packed
// arrays: 8-byte words of an atom, atoms, row tiles), all counted on the
// stage's `full` mbarrier (a box past the last row tile reads zeros and
// counts whole); a copy costs the TMA unit about the same whatever its
// size, so a stage is at most four;
// each consumer warp arrives on `empty` once its MMAs of the stage are
// done. A consumer decodes a stage, issues its MMAs and waits for them
// before it decodes the next (wgmma reads A registers asynchronously, and
// ptxas serializes MMAs whose registers are written while one is in
// flight); the two consumers' warps share the SM's quarters, so one's
// MMAs run while the other decodes. Where the consumers split K, each
// owns every other slot of an even ring (consumer c the slots of parity
// c), and the second's sums join the first's in shared memory before the
// epilogue. Owning slots, not steps of K, keeps a consumer's waits on a
// `full` barrier to consecutive phases: had consecutive fills of a slot
// gone to different consumers, one could wait for a phase two ahead of
// the barrier's, whose parity reads as already complete.
//
// Persistent tiles, walked as kiln/tma.cuh walks them: GROUP token tiles
// down a column of weight tiles, so that the blocks running together
// read one column's weights from L2.
//
// Epilogue. A thread's accumulators hold rows g and g + 8 of its warp's
// 16 (outputs n) at pairs of tokens; one exchange with the lane of row
// g ± 1 gives it two adjacent outputs of one token, stored as a BF16
// pair through kiln/epilogue.cuh.
//
// grid = (min(tiles, blocks the device holds)), block = 384 threads,
// dynamic shared memory wtc_tile::smem_bytes, __grid_constant__ tensor
// maps after the args: x (bf16-tc), 2-D (K, m), boxes of 64 values by BT
// rows, SWIZZLE_128B; the packed data, 3-D (atom_bytes / 8, K / 64, row
// tiles) of 8-byte words, boxes of one atom by the block's row tiles; for
// a format with records, its records (record, K / 64, row tiles) and with
// super-records those (super_record, K / 256, row tiles, past the
// records), boxes the same way.
#pragma once

#include "kiln/tc.cuh"
#include "kiln/tma.cuh"

namespace kiln {

// A stage is one atom of K (64 values): BT rows of x (128 bytes each),
// the block's row tiles' atoms and their scale records. Split 1: the two
// consumers own 64 rows each of a block's 128 and read every stage.
// Split 2: they share a block's 64 rows and take alternate stages, and
// the second hands its sums to the first through shared memory at the
// end of a tile: twice the blocks where 128-row blocks leave SMs idle.
template <class F, int BT, int Stages, int Split>
struct wtc_tile {
    static_assert(BT == 64 || BT == 128 || BT == 256, "wgmma has n64, n128 and n256 here");
    static_assert(Split == 1 || Split == 2, "K split between the two consumers or not");
    static_assert(Stages >= 2 && (Split == 1 || Stages % 2 == 0),
                  "a ring of two stages or more; split: each consumer owns half of it");
    static constexpr int bt = BT, bw = 128 / Split, stages = Stages, consumers = 2;
    static constexpr int split = Split, readers = consumers / Split; // consumers a stage
    static constexpr int threads = 128 * (consumers + 1);
    static constexpr int row_tiles = bw / 16;
    static constexpr int x_bytes = BT * 128;
    static constexpr int w_bytes = row_tiles * F::atom_bytes;
    static constexpr int rec_bytes = row_tiles * 8 * F::record;
    static constexpr int sup_bytes = row_tiles * 8 * F::super_record;
    static_assert(w_bytes % 128 == 0 && rec_bytes % 128 == 0 && sup_bytes % 128 == 0,
                  "TMA destinations 128-byte aligned");
    // The second consumer's sums of a tile (Split 2): BT / 2 a thread.
    static constexpr int red_bytes = Split == 2 ? 128 * (BT / 2) * 4 : 0;
    // x tiles first (1024-aligned for the swizzle), then the atoms, the
    // records, the super-records, the sums, the full and empty barriers;
    // 1024 bytes of slack to align.
    static constexpr int x_at = 0;
    static constexpr int w_at = stages * x_bytes;
    static constexpr int rec_at = w_at + stages * w_bytes;
    static constexpr int sup_at = rec_at + stages * rec_bytes;
    static constexpr int red_at = sup_at + stages * sup_bytes;
    static constexpr int bar_at = red_at + red_bytes;
    static_assert(w_at % 128 == 0 && rec_at % 128 == 0 && sup_at % 128 == 0,
                  "TMA destinations 128-byte aligned");
    static constexpr int smem_bytes = 1024 + bar_at + 2 * stages * 8;
    static constexpr int group = 8;
};

template <class A, class B>
struct wtc_same {
    static constexpr bool value = false;
};
template <class A>
struct wtc_same<A, A> {
    static constexpr bool value = true;
};
template <class F, class... Fs>
struct wtc_one_of {
    static constexpr bool value = (wtc_same<F, Fs>::value || ...);
};

// The formats whose A fragments are exact: NVFP4 with its E4M3 block
// scale, the E2M1 formats with their powers of two, E4M3 with MXFP8's
// powers of two. BF16's and FP8 per-tensor and per-channel atoms are
// row-major (tc_rows), read by wgmma's TMA kernel instead.
template <class F>
using wtc_exact = wtc_one_of<F, tc_nvfp4, tc_mxfp4, tc_ggml_mxfp4, tc_mxfp8>;

// The integer GGML formats, whose weights need more than BF16's 8
// significant bits: their A fragments are the weights rounded once to
// BF16, to nearest even.
template <class F>
using wtc_rounded = wtc_one_of<F, tc_q8_0, tc_q4_0, tc_q4_k, tc_q6_k>;

// F16, whose packed pairs sit where BF16's do: each value rounded once to
// BF16, to nearest even (F16 to f32 is exact).
template <class F>
using wtc_f16 = wtc_same<F, tc_f16>;

// f32 of the low and high half of a BF16 pair; the pair of BF16 nearest
// to lo, hi (one rounding each, to nearest even).
__device__ __forceinline__ float bf2_low(u32 p) { return __uint_as_float(p << 16); }
__device__ __forceinline__ float bf2_high(u32 p) { return __uint_as_float(p & 0xFFFF0000u); }
__device__ __forceinline__ u32 bf2_round(float lo, float hi)
{
    u32 d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// A format's A fragment of k-tile j. The exact formats' decodings that
// leave a block scale for the sums (block_tiles > 0) are taken here only
// where that scale is a power of two (folded: BF16 bits of an f32 power
// of two are its top half, subnormals and infinity included). The
// rounded formats' codes (exact BF16, 128 + q for those with an offset)
// become their weights in f32 as the CPU dequantizer computes them:
// (code − offset) · scale in one fma, exact (a code of at most 8
// significant bits times a scale of at most 19 — Q4_0's, Q8_0's f16 d,
// Q4_K's d times a 6-bit scale, Q6_K's d times an int8 — fits f32; the
// offset times the scale is exact too), then Q4_K's minimum subtracted
// with the dequantizer's one rounding; and each is rounded to BF16.
template <class F>
struct wtc_decode {
    static_assert(wtc_exact<F>::value || wtc_rounded<F>::value || wtc_f16<F>::value,
                  "a format with an A fragment of one BF16 term");
    template <class R>
    static __device__ __forceinline__ void run(const R &r, int j, u32 (&a)[4])
    {
        if constexpr (wtc_f16<F>::value) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const u32 w = word_of(r.q[j], i);
                a[i] = bf2_round(f16_to_f32((u16)w), f16_to_f32((u16)(w >> 16)));
            }
            return;
        } else {
            F::decode(r, j, a);
        }
        if constexpr (wtc_exact<F>::value && F::block_tiles > 0) {
            float s[2];
            F::scale(r, j / F::block_tiles, s);
            const u32 pair[2] = { bf2_splat(__float_as_uint(s[0]) >> 16),
                                  bf2_splat(__float_as_uint(s[1]) >> 16) };
#pragma unroll
            for (int i = 0; i < 4; i++)
                a[i] = bf2_fma(a[i], pair[i & 1], bf2_neg_zero);
        } else if constexpr (wtc_rounded<F>::value) {
            float s[2], zero[2] = { 0.0f, 0.0f }, m[2] = { 0.0f, 0.0f };
            F::scale(r, j / F::block_tiles, s);
            if constexpr (F::has_offset)
                zero[0] = -F::offset * s[0], zero[1] = -F::offset * s[1];
            if constexpr (F::has_min)
                F::minimum(r, j / F::block_tiles, m);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float lo = fmaf(bf2_low(a[i]), s[i & 1], zero[i & 1]);
                float hi = fmaf(bf2_high(a[i]), s[i & 1], zero[i & 1]);
                if constexpr (F::has_min)
                    lo -= m[i & 1], hi -= m[i & 1];
                a[i] = bf2_round(lo, hi);
            }
        }
    }
};

#define KILN_WTC_ACC8(d, i)                                                                       \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),   \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define KILN_WTC_A(a) "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3])

// d[64 x N] += A[64 x 16] (registers) · B[N x 16]ᵀ (K-major in shared
// memory, descriptor b); scale_d 0 starts the sum.
template <int N>
struct wtc_mma;

template <>
struct wtc_mma<64> {
    static __device__ __forceinline__ void run(float (&d)[32], const u32 (&a)[4],
                                               unsigned long long b, int scale_d)
    {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
                     "%31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                     : KILN_WTC_ACC8(d, 0), KILN_WTC_ACC8(d, 8), KILN_WTC_ACC8(d, 16),
                       KILN_WTC_ACC8(d, 24)
                     : KILN_WTC_A(a), "l"(b), "r"(scale_d));
    }
};

template <>
struct wtc_mma<128> {
    static __device__ __forceinline__ void run(float (&d)[64], const u32 (&a)[4],
                                               unsigned long long b, int scale_d)
    {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
                     "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
                     "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, "
                     "%61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                     : KILN_WTC_ACC8(d, 0), KILN_WTC_ACC8(d, 8), KILN_WTC_ACC8(d, 16),
                       KILN_WTC_ACC8(d, 24), KILN_WTC_ACC8(d, 32), KILN_WTC_ACC8(d, 40),
                       KILN_WTC_ACC8(d, 48), KILN_WTC_ACC8(d, 56)
                     : KILN_WTC_A(a), "l"(b), "r"(scale_d));
    }
};

template <>
struct wtc_mma<256> {
    static __device__ __forceinline__ void run(float (&d)[128], const u32 (&a)[4],
                                               unsigned long long b, int scale_d)
    {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
                     "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
                     "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, "
                     "%61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, "
                     "%76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, "
                     "%91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, "
                     "%105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, "
                     "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
                     "{%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
                     : KILN_WTC_ACC8(d, 0), KILN_WTC_ACC8(d, 8), KILN_WTC_ACC8(d, 16),
                       KILN_WTC_ACC8(d, 24), KILN_WTC_ACC8(d, 32), KILN_WTC_ACC8(d, 40),
                       KILN_WTC_ACC8(d, 48), KILN_WTC_ACC8(d, 56), KILN_WTC_ACC8(d, 64),
                       KILN_WTC_ACC8(d, 72), KILN_WTC_ACC8(d, 80), KILN_WTC_ACC8(d, 88),
                       KILN_WTC_ACC8(d, 96), KILN_WTC_ACC8(d, 104), KILN_WTC_ACC8(d, 112),
                       KILN_WTC_ACC8(d, 120)
                     : KILN_WTC_A(a), "l"(b), "r"(scale_d));
    }
};

#undef KILN_WTC_A
#undef KILN_WTC_ACC8

__device__ __forceinline__ const u8 *wtc_generic(u32 smem)
{
    return reinterpret_cast<const u8 *>(__cvta_shared_to_generic(smem));
}

// A stage's A fragments: four k-tiles of a warp's row tile. A lane reads
// its pieces of the atom, the 8 bytes an atom holds for it past them
// (Q6_K's high bits), its lane group's scale record and super-record.
template <class F, class Tile>
__device__ __forceinline__ void wtc_decode_stage(u32 smem_w, u32 smem_rec, u32 smem_sup, int tile,
                                                 int lane, u32 (&a)[4][4])
{
    typename F::raw r;
    const u8 *w = wtc_generic(smem_w + tile * F::atom_bytes);
#pragma unroll
    for (int p = 0; p < F::pieces; p++)
        r.q[p] = *reinterpret_cast<const uint4 *>(w + 512 * p + 16 * lane);
    if constexpr (F::atom_bytes > 512 * F::pieces) {
        static_assert(F::atom_bytes == 512 * F::pieces + 256, "8 bytes a lane past the pieces");
        const uint2 h = *reinterpret_cast<const uint2 *>(w + 512 * F::pieces + 8 * lane);
        r.qh[0] = h.x, r.qh[1] = h.y;
    }
    if constexpr (F::record > 0)
        read_record<F::record>(
            wtc_generic(smem_rec + tile * 8 * F::record + lane / 4 * F::record), r);
    if constexpr (F::super_record > 0) {
        const u8 *sup =
            wtc_generic(smem_sup + tile * 8 * F::super_record + lane / 4 * F::super_record);
        if constexpr (F::super_record == 8) {
            const uint2 v = *reinterpret_cast<const uint2 *>(sup);
            r.sup[0] = v.x, r.sup[1] = v.y;
        } else {
            static_assert(F::super_record == 4, "a super-record of 4 or 8 bytes");
            r.sup[0] = *reinterpret_cast<const u32 *>(sup);
        }
    }
#pragma unroll
    for (int j = 0; j < 4; j++)
        wtc_decode<F>::run(r, j, a[j]);
}

// One stage's MMAs: four k16 steps over the x tile at xs.
template <int BT>
__device__ __forceinline__ void wtc_mma_stage(float (&acc)[BT / 2], const u32 (&a)[4][4], u32 xs)
{
    const unsigned long long b = tma_desc(xs);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int j = 0; j < 4; j++)
        wtc_mma<BT>::run(acc, a[j], b + 2 * j, 1);
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

template <class F, class Tile, class Epilogue, int N, int K>
__device__ void wtc_gemm(const kiln_linear_args &args, const tma_map &tx, const tma_map &tw,
                         const tma_map *trec, const tma_map *tsup)
{
    static_assert(!F::two_terms || wtc_f16<F>::value, "an A fragment of one term");
    static_assert(!F::rows, "a lane's pieces are its fragments, not rows");
    static_assert(K % 64 == 0, "K is whole atoms");
    static_assert(F::super_record == 0 || K % 256 == 0, "K is whole super-blocks");
    constexpr int steps = K / 64;
    constexpr int BT = Tile::bt;
    constexpr int col_tiles = (N + Tile::bw - 1) / Tile::bw;

    extern __shared__ u8 smem_raw[];
    const u32 raw = tma_smem_address(smem_raw);
    const u32 base = (raw + 1023) & ~1023u;
    const u32 full_at = base + Tile::bar_at;
    const u32 empty_at = full_at + Tile::stages * 8;

    const int warpgroup = threadIdx.x / 128;
    const int m = args.m;
    const int token_tiles = (m + BT - 1) / BT;
    const int tiles = token_tiles * col_tiles;

    // Every consumer lane reads its atoms and records with loads of its
    // own, so every lane of each consumer reading a stage releases it.
    tma_ring_init<Tile::stages, Tile::readers, 32>(full_at, empty_at);

    if (warpgroup == 0) {
        if constexpr (BT == 256)
            asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (threadIdx.x != 0)
            return;
        int stage = 0;
        u32 phase = 0;
        for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
            int tt, tc;
            tma_tile_at<Tile::group>(t, token_tiles, col_tiles, tt, tc);
            const int tile0 = tc * Tile::row_tiles;
            for (int s = 0; s < steps; s++) {
                const u32 full = full_at + 8 * stage;
                tma_bar_wait(empty_at + 8 * stage, phase ^ 1);
                tma_bar_expect(full, Tile::x_bytes + Tile::w_bytes + Tile::rec_bytes +
                                         Tile::sup_bytes);
                tma_load(base + Tile::x_at + stage * Tile::x_bytes, tx, full, s * 64, tt * BT);
                tma_load_3d(base + Tile::w_at + stage * Tile::w_bytes, tw, full, 0, s, tile0);
                if constexpr (F::record > 0)
                    tma_load_3d(base + Tile::rec_at + stage * Tile::rec_bytes, *trec, full, 0, s,
                                tile0);
                if constexpr (F::super_record > 0)
                    tma_load_3d(base + Tile::sup_at + stage * Tile::sup_bytes, *tsup, full, 0,
                                s / 4, tile0);
                if (++stage == Tile::stages) {
                    stage = 0;
                    phase ^= 1;
                }
            }
        }
        return;
    }

    if constexpr (BT == 256)
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int c = warpgroup - 1;
    const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
    const int tile_in = Tile::split == 1 ? 4 * c + warp : warp; // this warp's row tile
    float *const red = reinterpret_cast<float *>(__cvta_shared_to_generic(base + Tile::red_at));
    bool first = true; // Split 2: the second consumer's first tile
    (void)red, (void)first;
    int stage = 0;
    u32 phase = 0;
    float acc[BT / 2];
    u32 a[4][4];
    u16 *__restrict__ y = static_cast<u16 *>(args.y);
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        int tt, tc;
        tma_tile_at<Tile::group>(t, token_tiles, col_tiles, tt, tc);
#pragma unroll
        for (int i = 0; i < BT / 2; i++)
            acc[i] = 0.0f;
        // A stage's MMAs complete before the next stage decodes: ptxas
        // serializes MMAs whose register operands are written while any
        // MMA is in flight. The other consumer's MMAs keep the tensor
        // cores busy meanwhile (its warps share the SM's quarters).
        // Split 2: consumer c takes the steps that land in its slots.
#pragma unroll 1
        for (int s = 0; s < steps; s++) {
            if (Tile::split == 2 && (stage & 1) != c) {
                if (++stage == Tile::stages) {
                    stage = 0;
                    phase ^= 1;
                }
                continue;
            }
            tma_bar_wait(full_at + 8 * stage, phase);
            wtc_decode_stage<F, Tile>(base + Tile::w_at + stage * Tile::w_bytes,
                                      base + Tile::rec_at + stage * Tile::rec_bytes,
                                      base + Tile::sup_at + stage * Tile::sup_bytes, tile_in,
                                      lane, a);
            tma_pin(acc);
            wtc_mma_stage<BT>(acc, a, base + Tile::x_at + stage * Tile::x_bytes);
            asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
            tma_pin(acc);
            tma_bar_arrive(empty_at + 8 * stage);
            if (++stage == Tile::stages) {
                stage = 0;
                phase ^= 1;
            }
        }

        // Split 2: the second consumer's sums to the first, thread for
        // thread, through `red`. Named barrier 1: written; 2: read, the
        // buffer free for the next tile's (the first consumer arrives
        // only where there is one, so that no arrival is left over).
        if constexpr (Tile::split == 2) {
            const int tid = threadIdx.x % 128;
            if (c == 1) {
                if (!first)
                    asm volatile("bar.sync 2, 256;" ::: "memory");
                first = false;
#pragma unroll
                for (int i = 0; i < BT / 2; i++)
                    red[i * 128 + tid] = acc[i];
                asm volatile("bar.arrive 1, 256;" ::: "memory");
                continue;
            }
            asm volatile("bar.sync 1, 256;" ::: "memory");
#pragma unroll
            for (int i = 0; i < BT / 2; i++)
                acc[i] += red[i * 128 + tid];
            if (t + (int)gridDim.x < tiles)
                asm volatile("bar.arrive 2, 256;" ::: "memory");
        }

        // Accumulator i: row (output) g + 8·((i >> 1) & 1) of the warp's
        // 16, token 8·(i >> 2) + 2t + (i & 1). Lanes of even g trade
        // their odd token for the even token of row g + 1 (lane + 4).
        const int g = lane / 4, tq = lane % 4, odd = g & 1;
        const int n_base = tc * Tile::bw + 16 * tile_in + (g & ~1);
#pragma unroll
        for (int i = 0; i < BT / 2; i += 2) {
            const float give = odd ? acc[i] : acc[i + 1];
            const float got = __shfl_xor_sync(0xFFFFFFFFu, give, 4);
            const float lo = odd ? got : acc[i], hi = odd ? acc[i + 1] : got;
            const int n = n_base + 8 * ((i >> 1) & 1);
            const int token = tt * BT + 8 * (i >> 2) + 2 * tq + odd;
            if (token < m && n < N)
                epilogue_store_pair<Epilogue, N>(args, y, token, n, lo * F::row_scale(args, n),
                                                 hi * F::row_scale(args, n + 1 < N ? n + 1 : n));
        }
    }
}

} // namespace kiln
