// The wgmma backend: y[m, N] = epilogue(x[m, K] · W[N, K]ᵀ) on Hopper's
// warpgroup tensor cores (sm_90a), BF16 operands and f32 accumulators. Any
// kiln weight format is dequantized to BF16 in the main loop, so W4A16 and
// W8A16 run at BF16 tensor-core speed with the weights read once.
//
// A block is one warpgroup (128 threads) and computes a 64 x BN tile of y
// walking K in steps of 64. Each step stages x[64, 64] and W[BN, 64] in
// shared memory as BF16, then issues four wgmma.mma_async m64nBNk16 (one
// per 16 along K) reading both operands from shared memory. Two stages:
// while the tensor cores work on one, the threads load and dequantize the
// next step into the other.
//
// Shared layout: both operands are K-major without swizzle, in PTX's
// canonical form ((8, m), (8, 2k)) : ((16 B, SBO), (2 B, LBO)). A "core
// matrix" is 8 rows x 16 bytes (8 BF16 along K), 128 contiguous bytes.
// Within a tile of R rows x 64 K, the core matrix of rows 8g..8g+7 and
// K 8c..8c+7 starts at byte g·1024 + c·128, so
//   leading byte offset (next core matrix along K)  LBO = 128
//   stride byte offset  (next 8 rows)                SBO = 1024
// and the k16 step s of a tile starts at byte 256·s. Threads store 16-byte
// pieces; the eight threads of a quarter-warp take the eight rows of one
// core matrix, so each 128-bit store phase covers all 32 banks once.
//
// Ordering: the pieces are generic-proxy stores and wgmma reads through
// the async proxy, so every writer fences (fence.proxy.async.shared::cta)
// before the barrier that publishes a stage. A stage is written again only
// after wgmma.wait_group 0 and a barrier, so no read of it is in flight.
//
// Accumulators (PTX ISA, wgmma .m64nNk16 D fragment): warp w of the group
// holds rows 16w..16w+15; lane l holds rows 16w + l/4 and 16w + l/4 + 8,
// and in each 8-column group j the columns 8j + 2(l%4) and 8j + 2(l%4) + 1:
//   acc[4j + 0] (r, c)   acc[4j + 1] (r, c + 1)
//   acc[4j + 2] (r + 8, c)   acc[4j + 3] (r + 8, c + 1)
// Rows past args.m and columns past N are computed on zeros and never
// stored.
//
// x rows (and BF16 weight rows) are read 16 bytes at a time: K is a
// multiple of 64 and the runtime's arena and weight buffers are 256-byte
// aligned.
//
// grid = (ceil(N / BN), ceil(m / 64)), block = 128 threads, dynamic shared
// memory tile::smem_bytes.
#pragma once

#include "kiln/dequant.cuh"
#include "kiln/epilogue.cuh"
#include "kiln/kiln_args.h"
#include "kiln/simt.cuh"

namespace kiln {

template <int BN>
struct wgmma_tile {
    static_assert(BN == 64 || BN == 128, "wgmma_mma has instructions for n64 and n128");
    static constexpr int bm = 64, bn = BN, bk = 64, threads = 128, stages = 2;
    static constexpr int x_bytes = bm * bk * 2, w_bytes = bn * bk * 2;
    static constexpr int stage_bytes = x_bytes + w_bytes;
    static constexpr int smem_bytes = stages * stage_bytes;
};

// Sixteen bytes moved as one access.
struct alignas(16) wgmma_piece {
    u32 v[4];
};

// Byte offset of the 16-byte piece of row r, K 8c..8c+7 in a tile.
__device__ __forceinline__ u32 wgmma_piece_at(int r, int c)
{
    return (u32)((r >> 3) * 1024 + c * 128 + (r & 7) * 16);
}

__device__ __forceinline__ u32 wgmma_pack_bf16x2(float lo, float hi)
{
    return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16);
}

__device__ __forceinline__ u32 wgmma_smem_address(const void *p)
{
    u32 a;
    asm("{ .reg .u64 g; cvta.to.shared.u64 g, %1; cvt.u32.u64 %0, g; }" : "=r"(a) : "l"(p));
    return a;
}

// The shared-memory matrix descriptor: start address, LBO and SBO in
// units of 16 bytes (bits 0-13, 16-29, 32-45), base offset 0 (bits 49-51)
// and layout 0, no swizzle (bits 62-63).
__device__ __forceinline__ unsigned long long wgmma_desc(u32 addr)
{
    constexpr unsigned long long lbo = 128 >> 4, sbo = 1024 >> 4;
    return (unsigned long long)((addr & 0x3FFFFu) >> 4) | (lbo << 16) | (sbo << 32);
}

__device__ __forceinline__ void wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

__device__ __forceinline__ void wgmma_wait_all()
{
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}

__device__ __forceinline__ void wgmma_fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Pins the accumulators in place around the asynchronous MMAs: the
// compiler may move no read or write of them across this point.
template <int R>
__device__ __forceinline__ void wgmma_pin(float (&acc)[R])
{
#pragma unroll
    for (int i = 0; i < R; i++)
        asm volatile("" : "+f"(acc[i])::"memory");
}

#define KILN_ACC8(i)                                                                              \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),   \
        "+f"(d[i + 6]), "+f"(d[i + 7])

// d[64 x BN] += A[64 x 16] · B[BN x 16]ᵀ, both K-major in shared memory
// (imm-trans-a = imm-trans-b = 0), scale-d true, no negation.
template <int BN>
struct wgmma_mma;

template <>
struct wgmma_mma<64> {
    static __device__ __forceinline__ void run(float (&d)[32], unsigned long long a,
                                               unsigned long long b)
    {
        asm volatile("{\n"
                     ".reg .pred p;\n"
                     "setp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
                     "%31}, %32, %33, p, 1, 1, 0, 0;\n"
                     "}\n"
                     : KILN_ACC8(0), KILN_ACC8(8), KILN_ACC8(16), KILN_ACC8(24)
                     : "l"(a), "l"(b), "r"(1));
    }
};

template <>
struct wgmma_mma<128> {
    static __device__ __forceinline__ void run(float (&d)[64], unsigned long long a,
                                               unsigned long long b)
    {
        asm volatile("{\n"
                     ".reg .pred p;\n"
                     "setp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
                     "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
                     "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, "
                     "%61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n"
                     "}\n"
                     : KILN_ACC8(0), KILN_ACC8(8), KILN_ACC8(16), KILN_ACC8(24), KILN_ACC8(32),
                       KILN_ACC8(40), KILN_ACC8(48), KILN_ACC8(56)
                     : "l"(a), "l"(b), "r"(1));
    }
};

#undef KILN_ACC8

// One weight unit: G = max(8, chunk) consecutive elements of row n from
// k0, as G / 8 pieces of BF16. Formats decode through their traits; BF16
// weights are copied as they are (decoding and re-encoding a BF16 value
// gives its bits back).
template <class Format, int K>
struct wgmma_weight_unit {
    static constexpr int g = Format::chunk > 8 ? Format::chunk : 8;
    static __device__ __forceinline__ void load(const weight_view &w, int n, int k0,
                                                wgmma_piece (&out)[g / 8])
    {
        float v[g];
#pragma unroll
        for (int c = 0; c < g / Format::chunk; c++) {
            float part[Format::chunk];
            Format::template load<K>(w, n, k0 + c * Format::chunk, part);
#pragma unroll
            for (int i = 0; i < Format::chunk; i++)
                v[c * Format::chunk + i] = part[i];
        }
#pragma unroll
        for (int p = 0; p < g / 8; p++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                out[p].v[i] = wgmma_pack_bf16x2(v[8 * p + 2 * i], v[8 * p + 2 * i + 1]);
    }
};

template <int K>
struct wgmma_weight_unit<fmt_bf16, K> {
    static constexpr int g = 8;
    static __device__ __forceinline__ void load(const weight_view &w, int n, int k0,
                                                wgmma_piece (&out)[1])
    {
        out[0] = *reinterpret_cast<const wgmma_piece *>(
            row_of<fmt_bf16::block, fmt_bf16::block_bytes, K>(w, n) + (i64)k0 * 2);
    }
};

// Stage K step k0 of x (rows m0.., zeros past m) and W (rows n0.., zeros
// past N) into one stage's tiles.
template <class Format, class Tile, int N, int K>
__device__ __forceinline__ void wgmma_stage_load(u8 *xs, u8 *ws, const u16 *__restrict__ x,
                                                 const weight_view &w, int m, int m0, int n0,
                                                 int k0)
{
    constexpr int x_pieces = Tile::bm * Tile::bk / 8;
#pragma unroll
    for (int i = 0; i < x_pieces / Tile::threads; i++) {
        // Eight rows of one core matrix per quarter-warp; a warp reads 64
        // contiguous bytes of each of eight rows.
        const int p = threadIdx.x + i * Tile::threads;
        const int r = (p / 64) * 8 + p % 8, c = (p / 8) % 8;
        const int gm = m0 + r;
        wgmma_piece v = {};
        if (gm < m)
            v = *reinterpret_cast<const wgmma_piece *>(x + (i64)gm * K + k0 + c * 8);
        *reinterpret_cast<wgmma_piece *>(xs + wgmma_piece_at(r, c)) = v;
    }

    using unit = wgmma_weight_unit<Format, K>;
    constexpr int units_per_row = Tile::bk / unit::g;
    constexpr int units = Tile::bn * units_per_row;
    static_assert(units % Tile::threads == 0, "every thread loads the same number of units");
#pragma unroll
    for (int i = 0; i < units / Tile::threads; i++) {
        const int u = threadIdx.x + i * Tile::threads;
        const int r = (u / (8 * units_per_row)) * 8 + u % 8;
        const int c0 = ((u / 8) % units_per_row) * (unit::g / 8);
        const int gn = n0 + r;
        wgmma_piece v[unit::g / 8] = {};
        if (gn < N)
            unit::load(w, gn, k0 + c0 * 8, v);
#pragma unroll
        for (int p = 0; p < unit::g / 8; p++)
            *reinterpret_cast<wgmma_piece *>(ws + wgmma_piece_at(r, c0 + p)) = v[p];
    }
}

template <class Format, class Tile, class Epilogue, int N, int K>
__device__ void wgmma_gemm(const kiln_linear_args &args)
{
    static_assert(K % Tile::bk == 0, "K is whole steps of 64");
    static_assert(Tile::bk % Format::chunk == 0, "a format chunk never straddles two K steps");
    static_assert(K % Format::block == 0, "K is whole blocks of the format");
    constexpr int steps = K / Tile::bk;
    constexpr int k16 = Tile::bk / 16;

    extern __shared__ __align__(128) u8 smem[];
    const int m = args.m;
    const int m0 = blockIdx.y * Tile::bm, n0 = blockIdx.x * Tile::bn;
    const u16 *__restrict__ x = static_cast<const u16 *>(args.x);
    const weight_view w = { static_cast<const u8 *>(args.w), static_cast<const u8 *>(args.w_scale),
                            args.w_global ? *args.w_global : 1.0f };
    const u32 base = wgmma_smem_address(smem);

    float acc[Tile::bn / 2];
#pragma unroll
    for (int i = 0; i < Tile::bn / 2; i++)
        acc[i] = 0.0f;

    wgmma_stage_load<Format, Tile, N, K>(smem, smem + Tile::x_bytes, x, w, m, m0, n0, 0);
    wgmma_fence_proxy_async();
    __syncthreads();

#pragma unroll 1
    for (int s = 0; s < steps; s++) {
        const int stage = s & 1;
        const u32 xa = base + stage * Tile::stage_bytes, wa = xa + Tile::x_bytes;
        wgmma_pin(acc);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < k16; j++)
            wgmma_mma<Tile::bn>::run(acc, wgmma_desc(xa + 256 * j), wgmma_desc(wa + 256 * j));
        wgmma_commit();
        if (s + 1 < steps) {
            u8 *next = smem + (stage ^ 1) * Tile::stage_bytes;
            wgmma_stage_load<Format, Tile, N, K>(next, next + Tile::x_bytes, x, w, m, m0, n0,
                                                 (s + 1) * Tile::bk);
            wgmma_fence_proxy_async();
        }
        wgmma_wait_all();
        wgmma_pin(acc);
        __syncthreads();
    }

    u16 *__restrict__ y = static_cast<u16 *>(args.y);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = m0 + 16 * warp + lane / 4 + 8 * h;
        if (row >= m)
            continue;
#pragma unroll
        for (int j = 0; j < Tile::bn / 8; j++)
            epilogue_store_pair<Epilogue, N>(args, y, row, n0 + 8 * j + 2 * (lane % 4),
                                             acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
    }
}

} // namespace kiln
