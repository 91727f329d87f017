// The wgmma backend's Hopper GEMM for weights whose values are the
// operand type itself: y[m, N] = epilogue(x[m, K] · W[N, K]ᵀ) with both
// operands brought into shared memory by the tensor memory accelerator and
// multiplied by warpgroup MMAs reading them from there. BF16 weights on
// BF16 activations; E4M3 weights (a scale for the tensor, each row, or
// each 128 × 128 block) on E4M3 activations the graph quantized before
// (a scale for each token, or each token's 128 of K).
//
// Warp specialization. A block is three warpgroups. The first is the
// producer: one thread of it issues the TMA copies of 128 bytes of K of
// x's BM rows and W's BN rows into a ring of Stages stages, each guarded
// by two mbarriers:
// `full` completes when a stage's bytes have landed (the copies count
// their bytes against it), `empty` when every consumer warp is done
// reading it. The other two warpgroups consume: each owns a 64 × WN part
// of the block's BM × BN tile (the two row halves when BM = 128, the
// two column halves when BM = 64) and issues four wgmma steps a stage
// (k16 BF16, k32 E4M3), reading both operands from shared memory. A BF16
// consumer releases a stage once the MMAs of the stage after it are
// issued and its own have completed (wgmma.wait_group 1), so one stage of
// MMAs is always queued; an E4M3 one waits for each stage's sum to
// promote it (tma_e4m3).
//
// Persistent tiles. grid.x is at most the blocks the device holds at once
// (the session clamps it, kiln_launch.persistent); block b takes tiles b,
// b + grid.x, ...
// in an order that walks GROUP row tiles down one column of tiles before
// moving right, so the blocks running at once share the W tiles of a
// column and the x tiles of a band in L2. The producer runs ahead into
// the next tile while the consumers store this one.
//
// Shared layout. TMA writes each operand tile with the 128-byte swizzle:
// row r's 128 bytes at r·128, its 16-byte chunk c at chunk c ^ (r % 8).
// That is wgmma's K-major SWIZZLE_128B canonical layout with 8-row groups
// 1024 bytes apart, so a descriptor of the tile's start (1024-aligned)
// with SBO = 1024 reads it, and MMA step j is the same descriptor 32·j
// bytes on.
//
// Bounds. x's map spans the bucket's rows and W's the N rows, both K
// columns: TMA fills boxes past any of them with zeros, so partial tiles
// and a last half stage of E4M3 (K a multiple of 64) need no code; their
// rows and columns are computed and never stored.
//
// Registers. A consumer holds WN / 2 f32 accumulators a thread, and an
// E4M3 one a stage sum as many again; at WN = 256 (128 accumulators) the
// producer gives its registers back with setmaxnreg so the consumers may
// hold 232.
//
// grid = (min(tiles, blocks the device holds)), block = 384 threads,
// dynamic shared memory tile::smem_bytes, two __grid_constant__ tensor
// maps after the args: x then W, both 2-D (K, rows), boxes of 128 bytes of
// K by BM and by BN rows, SWIZZLE_128B.
#pragma once

#include "kiln/epilogue.cuh"
#include "kiln/kiln_args.h"
#include "kiln/kiln_types.cuh"

namespace kiln {

// A CUtensorMap: 128 opaque bytes the driver encodes on the host.
struct alignas(64) tma_map {
    unsigned long long v[16];
};

// A stage holds 128 bytes of K of every row, the swizzle's span: 64 BF16
// or 128 E4M3 values, four MMA k-steps of 32 bytes either way.
template <int BM, int BN, int Stages>
struct tma_tile {
    static_assert(BM == 64 || BM == 128, "one or two consumer row halves of 64");
    static constexpr int bm = BM, bn = BN, row_bytes = 128, stages = Stages;
    static constexpr int consumers = 2, threads = 128 * (consumers + 1);
    // a consumer's columns: all of them, or half when the two split N
    static constexpr int wn = BM == 128 ? BN : BN / 2;
    static_assert(wn == 64 || wn == 128 || wn == 256, "wgmma has n64, n128 and n256 here");
    static constexpr int x_bytes = bm * row_bytes, w_bytes = bn * row_bytes;
    static constexpr int stage_bytes = x_bytes + w_bytes;
    // 1024 bytes of slack to align the tiles for the swizzle, then the
    // full and empty barriers
    static constexpr int smem_bytes = 1024 + stages * stage_bytes + 2 * stages * 8;
    // row tiles walked down a column before the next column
    static constexpr int group = 8;
};

// The operand types, each with its tma_mma specializations. E4M3 sums are
// promoted: the tensor cores add FP8 products with fewer bits than f32
// holds, so each stage's MMAs start a fresh sum that is then added to the
// f32 accumulators in registers (DeepGEMM's remedy), and a scale
// policy turns the integer-scaled sum into the output.
struct tma_bf16 {
    static constexpr int elem_bytes = 2;
    static constexpr bool promote = false;
    static constexpr bool atoms = false; // the weight's map: its rows (2-D)
};
// BF16 weights in gemv_tc's row-major atoms (tc_rows in kiln/tc.cuh), one
// device copy for decode and prefill: a 4-D map (64 values, 16 rows, K /
// 64 atoms, N / 16 row tiles) whose box of one atom of Tile::bn / 16 row
// tiles lands in shared memory as the 2-D map's box of bn rows does.
struct tma_bf16_atoms : tma_bf16 {
    static constexpr bool atoms = true;
};
struct tma_e4m3 {
    static constexpr int elem_bytes = 1;
    static constexpr bool promote = true;
    static constexpr bool atoms = false;
};
// FP8 weights in gemv_tc's row-major atoms of 16 rows × 64 bytes: a 4-D map
// (128 bytes: two rows, 8 of them, N / 16 row tiles, K / 64 atoms) whose
// box of Tile::bn / 16 row tiles of two atoms lands as two halves of K,
// each bn rows × 64 bytes, read by descriptors of the 64-byte swizzle
// (tma_w_desc). The copy swizzles 128-byte rows: chunk c of row q (of 8 a
// 1024-byte atom) to c ^ q, where the MMA reads chunk c of its row 2q + c
// / 4 at c ^ (q % 4); the atoms' rows 8 .. 15 lie swapped in pairs
// (kp_slot_of), which is the difference, c ^ 4 for q ≥ 4.
struct tma_e4m3_atoms : tma_e4m3 {
    static constexpr bool atoms = true;
};

// Scale policies. A promoted format's stage sum is multiplied by
// stage(s, row, col0) as it is added (per_stage: K-block scales), and the
// total by row(r) · col(c) before the epilogue.
struct tma_unscaled {
    static constexpr bool per_stage = false;
    __device__ __forceinline__ tma_unscaled(const kiln_linear_args &, int) {}
    __device__ __forceinline__ float stage(int, int, int) const { return 1.0f; }
    __device__ __forceinline__ float row(int) const { return 1.0f; }
    __device__ __forceinline__ float col(int) const { return 1.0f; }
};

// fp8-token activations (one f32 scale a row, stored byte by byte after
// the bucket's [m, K] codes) times an E4M3 weight with one f32 scale, or
// one a row of W (an output column).
template <bool PerChannel>
struct tma_token_scaled {
    static constexpr bool per_stage = false;
    __device__ __forceinline__ float stage(int, int, int) const { return 1.0f; }
    const u8 *x_scale;
    const float *w_scale;
    float tensor;
    __device__ __forceinline__ tma_token_scaled(const kiln_linear_args &args, int k)
        : x_scale(static_cast<const u8 *>(args.x) + (i64)args.m * k),
          w_scale(static_cast<const float *>(args.w_scale)),
          tensor(PerChannel ? 1.0f : *static_cast<const float *>(args.w_scale))
    {
    }
    __device__ __forceinline__ float row(int r) const
    {
        const u8 *p = x_scale + 4 * (i64)r;
        return __uint_as_float((u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) |
                               ((u32)p[3] << 24)) *
               tensor;
    }
    __device__ __forceinline__ float col(int c) const { return PerChannel ? w_scale[c] : 1.0f; }
};

// fp8-1x128 activations (an f32 scale per token per 128 of K, stored
// group-major after the bucket's [m, K] codes: 4-aligned, as m·K is a
// multiple of 64) times a block-FP8 weight (an f32 scale per 128 × 128
// tile, [ceil(N/128)][ceil(K/128)]). A stage is one 128 of K, and a
// consumer's columns lie in one 128-row block of W, so a stage sum takes
// one factor a row. Rows past the bucket read the last row's scale: they
// are computed and never stored.
struct tma_block_scaled {
    static constexpr bool per_stage = true;
    const float *x_scale;
    const float *w_scale;
    int m, kblocks;
    __device__ __forceinline__ tma_block_scaled(const kiln_linear_args &args, int k)
        : x_scale(reinterpret_cast<const float *>(static_cast<const u8 *>(args.x) +
                                                  (i64)args.m * k)),
          w_scale(static_cast<const float *>(args.w_scale)), m(args.m), kblocks((k + 127) / 128)
    {
    }
    __device__ __forceinline__ float stage(int s, int r, int col0) const
    {
        return x_scale[(i64)s * m + (r < m ? r : m - 1)] *
               w_scale[(i64)(col0 / 128) * kblocks + s];
    }
    __device__ __forceinline__ float row(int) const { return 1.0f; }
    __device__ __forceinline__ float col(int) const { return 1.0f; }
};

#define KILN_TMA_ACC8(d, i)                                                                       \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),   \
        "+f"(d[i + 6]), "+f"(d[i + 7])

// d[64 x 64] (+)= A · B: 32 accumulators a thread.
#define KILN_TMA_MMA_N64(instr, tail, d, a, b, scale_d)                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" instr " {"         \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "  \
                 "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "  \
                 "%24, %25, %26, %27, %28, %29, %30, %31"  \
                 "}, %32, %33, p" tail ";\n}\n"                                       \
                 : KILN_TMA_ACC8(d, 0), KILN_TMA_ACC8(d, 8), KILN_TMA_ACC8(d, 16),  \
                   KILN_TMA_ACC8(d, 24)  \
                 : "l"(a), "l"(b), "r"(scale_d))

// d[64 x 128] (+)= A · B: 64 accumulators a thread.
#define KILN_TMA_MMA_N128(instr, tail, d, a, b, scale_d)                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" instr " {"         \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "  \
                 "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "  \
                 "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "  \
                 "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "  \
                 "%60, %61, %62, %63"  \
                 "}, %64, %65, p" tail ";\n}\n"                                       \
                 : KILN_TMA_ACC8(d, 0), KILN_TMA_ACC8(d, 8), KILN_TMA_ACC8(d, 16),  \
                   KILN_TMA_ACC8(d, 24), KILN_TMA_ACC8(d, 32), KILN_TMA_ACC8(d, 40),  \
                   KILN_TMA_ACC8(d, 48), KILN_TMA_ACC8(d, 56)  \
                 : "l"(a), "l"(b), "r"(scale_d))

// d[64 x 256] (+)= A · B: 128 accumulators a thread.
#define KILN_TMA_MMA_N256(instr, tail, d, a, b, scale_d)                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" instr " {"         \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "  \
                 "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "  \
                 "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "  \
                 "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "  \
                 "%60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, "  \
                 "%72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, "  \
                 "%84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "  \
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, "  \
                 "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, "  \
                 "%120, %121, %122, %123, %124, %125, %126, %127"  \
                 "}, %128, %129, p" tail ";\n}\n"                                       \
                 : KILN_TMA_ACC8(d, 0), KILN_TMA_ACC8(d, 8), KILN_TMA_ACC8(d, 16),  \
                   KILN_TMA_ACC8(d, 24), KILN_TMA_ACC8(d, 32), KILN_TMA_ACC8(d, 40),  \
                   KILN_TMA_ACC8(d, 48), KILN_TMA_ACC8(d, 56), KILN_TMA_ACC8(d, 64),  \
                   KILN_TMA_ACC8(d, 72), KILN_TMA_ACC8(d, 80), KILN_TMA_ACC8(d, 88),  \
                   KILN_TMA_ACC8(d, 96), KILN_TMA_ACC8(d, 104), KILN_TMA_ACC8(d, 112),  \
                   KILN_TMA_ACC8(d, 120)  \
                 : "l"(a), "l"(b), "r"(scale_d))

// d[64 x N] (+)= A[64 x 16] · B[N x 16]ᵀ, both K-major in shared memory;
// scale_d 0 starts the sum.
template <class Op, int N>
struct tma_mma;

// BF16 takes k16 steps with the transpose immediates (none), E4M3 k32
// steps without them; both read 32 bytes of K a step.
#define KILN_TMA_MMA(Op, n, kind, tail)                                                           \
    template <>                                                                                   \
    struct tma_mma<Op, n> {                                                                       \
        static __device__ __forceinline__ void run(float (&d)[n / 2], unsigned long long a,      \
                                                   unsigned long long b, int scale_d)             \
        {                                                                                         \
            KILN_TMA_MMA_N##n("wgmma.mma_async.sync.aligned.m64n" #n kind, tail, d, a, b,        \
                              scale_d);                                                           \
        }                                                                                         \
    };

KILN_TMA_MMA(tma_bf16, 64, "k16.f32.bf16.bf16", ", 1, 1, 0, 0")
KILN_TMA_MMA(tma_bf16, 128, "k16.f32.bf16.bf16", ", 1, 1, 0, 0")
KILN_TMA_MMA(tma_bf16, 256, "k16.f32.bf16.bf16", ", 1, 1, 0, 0")
KILN_TMA_MMA(tma_e4m3, 64, "k32.f32.e4m3.e4m3", ", 1, 1")
KILN_TMA_MMA(tma_e4m3, 128, "k32.f32.e4m3.e4m3", ", 1, 1")

// Row-major atoms: the same tiles in shared memory, the same MMA.
template <int N>
struct tma_mma<tma_bf16_atoms, N> : tma_mma<tma_bf16, N> {
};
template <int N>
struct tma_mma<tma_e4m3_atoms, N> : tma_mma<tma_e4m3, N> {
};

#undef KILN_TMA_MMA
#undef KILN_TMA_MMA_N64
#undef KILN_TMA_MMA_N128
#undef KILN_TMA_MMA_N256
#undef KILN_TMA_ACC8

__device__ __forceinline__ u32 tma_smem_address(const void *p)
{
    return (u32)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void tma_bar_init(u32 bar, u32 count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void tma_bar_expect(u32 bar, u32 bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void tma_bar_arrive(u32 bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// Until the phase of parity `parity` of bar has completed.
__device__ __forceinline__ void tma_bar_wait(u32 bar, u32 parity)
{
    u32 done;
    do {
        asm volatile("{\n"
                     ".reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n"
                     "}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

// The box of map at (c0 along K, c1 rows) into dst, counted on bar.
__device__ __forceinline__ void tma_load(u32 dst, const tma_map &map, u32 bar, int c0, int c1)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
                 "l"(reinterpret_cast<unsigned long long>(&map)), "r"(bar), "r"(c0), "r"(c1)
                 : "memory");
}

// The same for a 3-D map: the box at coordinates (c0, c1, c2).
__device__ __forceinline__ void tma_load_3d(u32 dst, const tma_map &map, u32 bar, int c0, int c1,
                                            int c2)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(dst),
                 "l"(reinterpret_cast<unsigned long long>(&map)), "r"(bar), "r"(c0), "r"(c1),
                 "r"(c2)
                 : "memory");
}

// The same for a 4-D map: the box at coordinates (c0, c1, c2, c3).
__device__ __forceinline__ void tma_load_4d(u32 dst, const tma_map &map, u32 bar, int c0, int c1,
                                            int c2, int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(dst),
                 "l"(reinterpret_cast<unsigned long long>(&map)), "r"(bar), "r"(c0), "r"(c1),
                 "r"(c2), "r"(c3)
                 : "memory");
}

// The SWIZZLE_128B K-major descriptor of a tile at addr: start address,
// LBO 1 (unused by swizzled K-major layouts), SBO 1024 bytes, base offset
// 0 (the tile is 1024-aligned), layout 1 (128-byte swizzle).
__device__ __forceinline__ unsigned long long tma_desc(u32 addr)
{
    return (unsigned long long)((addr & 0x3FFFFu) >> 4) | (1ull << 16) |
           ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

// The same in the 64-byte swizzle: SBO 512 bytes (8 rows of 64), the tile
// 512-aligned, layout 2.
__device__ __forceinline__ unsigned long long tma_desc64(u32 addr)
{
    return (unsigned long long)((addr & 0x3FFFFu) >> 4) | (1ull << 16) |
           ((unsigned long long)(512 >> 4) << 32) | (2ull << 62);
}

// The weight's descriptor for k-step j (32 bytes of K) of the stage's tile
// at w, from column part_col: rows of 128 bytes, or FP8's atoms as two
// halves of Bn rows of 64 bytes (tma_e4m3_atoms).
template <class Op, int Bn>
__device__ __forceinline__ unsigned long long tma_w_desc(u32 w, int part_col, int j)
{
    if constexpr (Op::atoms && Op::elem_bytes == 1)
        return tma_desc64(w + (j / 2) * Bn * 64 + part_col * 64) + 2 * (j % 2);
    else
        return tma_desc(w + part_col * 128) + 2 * j;
}

// A ring's barriers, once per block before any warpgroup takes its role:
// each stage's `full` completes on the producer's one arrival and the
// bytes it expects, its `empty` on PerWarp arrivals of each consumer warp:
// one where the stage is read by wgmma alone, 32 (every lane) where lanes
// read it with loads of their own, so that each lane's reads are ordered
// before the producer's next copy into the stage.
template <int Stages, int Consumers, int PerWarp = 1>
__device__ __forceinline__ void tma_ring_init(u32 full_at, u32 empty_at)
{
    static_assert(PerWarp == 1 || PerWarp == 32, "one lane or every lane arrives");
    if (threadIdx.x == 0) {
        for (int s = 0; s < Stages; s++) {
            tma_bar_init(full_at + 8 * s, 1);
            tma_bar_init(empty_at + 8 * s, 4 * Consumers * PerWarp);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
}

template <int R>
__device__ __forceinline__ void tma_pin(float (&acc)[R])
{
#pragma unroll
    for (int i = 0; i < R; i++)
        asm volatile("" : "+f"(acc[i])::"memory");
}

// Tile t of a (rows × cols) grid of tiles, GROUP rows down a column at a
// time.
template <int Group>
__device__ __forceinline__ void tma_tile_at(int t, int rows, int cols, int &row, int &col)
{
    const int band = t / (Group * cols), first = band * Group;
    const int height = rows - first < Group ? rows - first : Group;
    const int in = t - band * Group * cols;
    row = first + in % height;
    col = in / height;
}

template <class Op, class Tile, class Scale, class Epilogue, int N, int K>
__device__ void tma_gemm(const kiln_linear_args &args, const tma_map &tx, const tma_map &tw)
{
    constexpr int bk = Tile::row_bytes / Op::elem_bytes; // K a stage
    static_assert(!Op::atoms || (Tile::row_bytes == 128 && Tile::bn % 16 == 0),
                  "128 bytes of atoms a row a stage, whole row tiles");
    static_assert(K % 64 == 0, "K is whole steps of 64; a last partial E4M3 stage reads zeros");
    static_assert(!Op::promote || Tile::wn <= 128, "the promoted sum needs a second set");
    constexpr int steps = (K + bk - 1) / bk, ksteps = Tile::row_bytes / 32;
    constexpr int col_tiles = (N + Tile::bn - 1) / Tile::bn;

    extern __shared__ u8 smem_raw[];
    const u32 raw = tma_smem_address(smem_raw);
    const u32 tiles_at = (raw + 1023) & ~1023u;
    const u32 full_at = tiles_at + Tile::stages * Tile::stage_bytes;
    const u32 empty_at = full_at + Tile::stages * 8;

    const int warpgroup = threadIdx.x / 128;
    const int m = args.m;
    const int row_tiles = (m + Tile::bm - 1) / Tile::bm;
    const int tiles = row_tiles * col_tiles;

    tma_ring_init<Tile::stages, Tile::consumers>(full_at, empty_at);

    if (warpgroup == 0) {
        if constexpr (Tile::wn == 256)
            asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (threadIdx.x != 0)
            return;
        int stage = 0;
        u32 phase = 0;
        for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
            int tr, tc;
            tma_tile_at<Tile::group>(t, row_tiles, col_tiles, tr, tc);
            for (int s = 0; s < steps; s++) {
                const u32 full = full_at + 8 * stage;
                tma_bar_wait(empty_at + 8 * stage, phase ^ 1);
                tma_bar_expect(full, Tile::stage_bytes);
                const u32 xs = tiles_at + stage * Tile::stage_bytes;
                tma_load(xs, tx, full, s * bk, tr * Tile::bm);
                if constexpr (Op::atoms && Op::elem_bytes == 1)
                    tma_load_4d(xs + Tile::x_bytes, tw, full, 0, 0, tc * (Tile::bn / 16), 2 * s);
                else if constexpr (Op::atoms)
                    tma_load_4d(xs + Tile::x_bytes, tw, full, 0, 0, s, tc * (Tile::bn / 16));
                else
                    tma_load(xs + Tile::x_bytes, tw, full, s * bk, tc * Tile::bn);
                if (++stage == Tile::stages) {
                    stage = 0;
                    phase ^= 1;
                }
            }
        }
        return;
    }

    if constexpr (Tile::wn == 256)
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int c = warpgroup - 1;
    const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
    // this consumer's part of the tile: rows and columns from its corner
    const int part_row = Tile::bm == 128 ? 64 * c : 0;
    const int part_col = Tile::bm == 128 ? 0 : Tile::wn * c;
    int stage = 0;
    u32 phase = 0;
    float acc[Tile::wn / 2];
    // the promoted formats' stage sum (unused by the others)
    float part[Op::promote ? Tile::wn / 2 : 1];
    const Scale scale(args, K);
    u16 *__restrict__ y = static_cast<u16 *>(args.y);
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        int tr, tc;
        tma_tile_at<Tile::group>(t, row_tiles, col_tiles, tr, tc);
#pragma unroll
        for (int i = 0; i < Tile::wn / 2; i++)
            acc[i] = 0.0f;
        // Accumulator (PTX ISA, wgmma D fragment): warp w holds rows
        // 16w..16w+15; lane l rows 16w + l/4 (+ 8), in each 8-column
        // group j the columns 8j + 2(l%4) and the next.
        const int row0 = tr * Tile::bm + part_row + 16 * warp + lane / 4;
        const int col0 = tc * Tile::bn + part_col + 2 * (lane % 4);
        int last = 0;
#pragma unroll 1
        for (int s = 0; s < steps; s++) {
            tma_bar_wait(full_at + 8 * stage, phase);
            const u32 xs = tiles_at + stage * Tile::stage_bytes;
            const unsigned long long a = tma_desc(xs + part_row * 128);
            const u32 w = xs + Tile::x_bytes;
            if constexpr (Op::promote) {
                float f[2] = { 1.0f, 1.0f };
                if constexpr (Scale::per_stage)
                    for (int h = 0; h < 2; h++)
                        f[h] = scale.stage(s, row0 + 8 * h, col0);
                tma_pin(part);
                asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
                for (int j = 0; j < ksteps; j++)
                    tma_mma<Op, Tile::wn>::run(part, a + 2 * j,
                                                tma_w_desc<Op, Tile::bn>(w, part_col, j), j > 0);
                asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
                asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
                tma_pin(part);
                if (lane == 0)
                    tma_bar_arrive(empty_at + 8 * stage);
#pragma unroll
                for (int i = 0; i < Tile::wn / 2; i++)
                    acc[i] += Scale::per_stage ? part[i] * f[(i / 2) % 2] : part[i];
            } else {
                tma_pin(acc);
                asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
                for (int j = 0; j < ksteps; j++)
                    tma_mma<Op, Tile::wn>::run(acc, a + 2 * j,
                                                tma_w_desc<Op, Tile::bn>(w, part_col, j), 1);
                asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
                asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
                tma_pin(acc);
                if (s > 0 && lane == 0)
                    tma_bar_arrive(empty_at + 8 * last);
            }
            last = stage;
            if (++stage == Tile::stages) {
                stage = 0;
                phase ^= 1;
            }
        }
        if constexpr (!Op::promote) {
            asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
            tma_pin(acc);
            if (lane == 0)
                tma_bar_arrive(empty_at + 8 * last);
        }

#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = row0 + 8 * h;
            if (row >= m)
                continue;
            const float rs = scale.row(row);
#pragma unroll
            for (int j = 0; j < Tile::wn / 8; j++) {
                const int col = col0 + 8 * j;
                epilogue_store_pair<Epilogue, N>(
                    args, y, row, col, acc[4 * j + 2 * h] * rs * scale.col(col < N ? col : 0),
                    acc[4 * j + 2 * h + 1] * rs * scale.col(col + 1 < N ? col + 1 : 0));
            }
        }
    }
}

} // namespace kiln
