// The gemv backend: y[m, N] = epilogue(x[m, K] · W[N, K]ᵀ) for a few
// tokens (m ≤ 16), BF16 activations, every kiln weight format read in its
// storage layout, f32 FMA.
//
// Why this shape. At m ≤ 16 a linear reads each weight byte once and does
// at most 2·16 flops with it, so its time is its weight bytes over the
// memory bandwidth: the kernel exists to keep enough bytes in flight and
// to spend few instructions per byte. On an H200 (~4.2 TB/s, 132 SMs at
// ~2 GHz) an SM receives ~16 bytes a clock and issues 128 thread
// instructions a clock, so a 4-bit format has ~4 instructions per weight,
// decode and FMA included, and an 8-bit one ~8.
//
// Work split. A warp owns Rows consecutive output rows and walks K with
// all 32 lanes side by side; KSplit warps may share a row group, each
// taking every KSplit-th stage of K (small N), reduced through shared
// memory at the end. The block's warps share one f32 copy of x.
//
// Weight stream. Each warp streams its rows through a private ring of
// Stages shared-memory slots with 16-byte cp.async copies (sm_80+), so
// Stages - 1 stages are in flight while one is decoded and the registers
// hold none of them. A stage is 32·Units lane units of one row: 16 bytes
// (32 for f32) of the plain and FP8/FP4 formats, a whole block of the
// 32-value GGML formats, an eighth of a 256-value K-quant or IQ4_XS block. Its copy is the
// 16-byte-aligned cover of its bytes, taken in order across the lanes, so
// every copy instruction of a warp reads 512 contiguous bytes, whatever
// the format's block size; the GGML blocks (17 to 210 bytes) then sit at
// a known misalignment in the slot and are read with funnel shifts. The
// separate scale arrays (MX, NVFP4, block FP8, the integer groups' scales
// and zero points) ride in the same slot, copied as the 4-byte-aligned
// cover of the stage's scales.
//
// Activations. x[m, tile] is converted to f32 once per block into shared
// memory, 4 floats of padding every 32 so that lanes reading runs 32
// values apart hit distinct banks. K is walked in tiles of TileK values
// (one tile when x fits the budget the host chose): between tiles the
// block synchronizes and refills x, while the weight ring keeps streaming.
//
// Decoding (gemv_formats.cuh). A lane turns a run of 8 weights into f32
// with a few bit operations per pair. A block scale multiplies the
// partial dot product of the runs it covers once, not every weight; a
// per-tensor or per-row scale, and the exact power of two a decoding left
// out, multiply the final sum. An offset (the K-quants' minimum, Q4_1's
// and Q5_1's m) comes in through the sum of x over the runs it covers,
// kept beside the x tile. Every product is an
// exact reordering of the CPU reference's; only the summation order
// differs.
//
// grid = ceil(N / (Warps / KSplit · Rows)), block = 32·Warps threads,
// dynamic shared memory = gemv_layout::total (the host computes the same
// number and passes it as Smem, which is checked here).
#pragma once

#include "kiln/epilogue.cuh"
#include "kiln/gemv_formats.cuh"
#include "kiln/kiln_args.h"
#include "kiln/kiln_types.cuh"

namespace kiln {

template <int MaxM, int Rows, int Warps, int KSplit, int Units, int Stages, int TileK,
          int MinBlocks>
struct gemv_shape {
    static_assert(MaxM >= 1 && MaxM <= 16 && (MaxM & (MaxM - 1)) == 0, "m class 1, 2, 4, 8, 16");
    static_assert(Rows >= 1 && (Rows & (Rows - 1)) == 0, "rows per warp: a power of two");
    static_assert(KSplit >= 1 && Warps % KSplit == 0, "k-split warps divide the block");
    static_assert(Stages >= 2, "one stage decoded while another lands");
    static constexpr int max_m = MaxM, rows = Rows, warps = Warps, k_split = KSplit;
    static constexpr int units = Units, stages = Stages, tile_k = TileK;
    static constexpr int threads = Warps * 32;
    // Blocks per SM the registers are budgeted for (__launch_bounds__):
    // left alone, the compiler hoists the x loads of every m and spends
    // occupancy the weight stream needs.
    static constexpr int min_blocks = MinBlocks;
    static constexpr int groups = Warps / KSplit; // row groups per block
    static constexpr int block_rows = groups * Rows;
};

// y[m, n] = epilogue(out), out being the row's scaled sum.
template <class Epilogue>
__device__ __forceinline__ void gemv_store(const kiln_linear_args &args, int N, int n, int m,
                                           float out)
{
    const i64 at = (i64)m * N + n;
    static_cast<u16 *>(args.y)[at] = f32_to_bf16(epilogue_apply<Epilogue>(args, out, n, at));
}

// ---------------------------------------------------------- copies

// 16 or 4 bytes global → shared, the bytes past src_size zero-filled
// (the tail of a tensor whose size is not a multiple of the copy).
// sm_80+ copies asynchronously (cp.async, completed by
// cp_async_wait); older parts load and store in place.
template <int Bytes>
__device__ __forceinline__ void cp_async(u8 *dst, const u8 *src, int src_size)
{
    static_assert(Bytes == 16 || Bytes == 4, "cp.async sizes kiln uses");
#if __CUDA_ARCH__ >= 800
    const u32 to = (u32)__cvta_generic_to_shared(dst);
    if (Bytes == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(to), "l"(src),
                     "r"(src_size));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(to), "l"(src),
                     "r"(src_size));
#else
    if (src_size == Bytes) {
        if (Bytes == 16)
            *reinterpret_cast<uint4 *>(dst) = __ldg(reinterpret_cast<const uint4 *>(src));
        else
            *reinterpret_cast<u32 *>(dst) = __ldg(reinterpret_cast<const u32 *>(src));
    } else {
        for (int i = 0; i < Bytes; i++)
            dst[i] = i < src_size ? src[i] : (u8)0;
    }
#endif
}

__device__ __forceinline__ void cp_async_commit()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::);
#endif
}

// Wait until at most Pending of this thread's groups are in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(Pending));
#endif
}

// ---------------------------------------------------------- layout

constexpr int gemv_round16(int v) { return (v + 15) / 16 * 16; }

// Shared memory of one block, in bytes and in this order: the f32 x tile
// [MaxM][x_ld], an offset format's run sums of x [MaxM][TileK / 8], one ring per warp
// [Stages][Rows][slot], the k-split partials [Warps][Rows · MaxM].
template <class F, class S>
struct gemv_layout {
    static constexpr int stage_k = 32 * S::units * F::unit; // values per row per stage
    static constexpr int stage_bytes = stage_k / F::storage::block * F::storage::block_bytes;
    // Unaligned streams: up to 15 bytes of cover before the stage and the
    // funnel reads' word past its end.
    static constexpr int data_area = gemv_round16(stage_bytes + (F::aligned ? 0 : 32));
    // The 4-byte cover of the scales: up to 3 bytes before, 3 after.
    static constexpr int scale_area =
        F::scale_cols ? gemv_round16((stage_k + F::scale_cols - 1) / F::scale_cols * F::scale_elem + 8)
                      : 0;
    // The zero points' 4-byte cover: a byte a scale.
    static constexpr int zp_area =
        F::zero_points ? gemv_round16((stage_k + F::scale_cols - 1) / F::scale_cols + 8) : 0;
    static constexpr int slot = data_area + scale_area + zp_area;
    static constexpr int x_ld = S::tile_k + S::tile_k / 8;
    static constexpr int x_bytes = S::max_m * x_ld * 4;
    static constexpr int xsum_bytes = F::offset ? S::max_m * (S::tile_k / 8) * 4 : 0;
    static constexpr int ring_bytes = S::warps * S::stages * S::rows * slot;
    static constexpr int red_bytes = S::k_split > 1 ? S::warps * S::rows * S::max_m * 4 : 0;
    static constexpr int total = x_bytes + xsum_bytes + ring_bytes + red_bytes;
    static_assert(S::tile_k % 32 == 0, "x rows stay 16-byte aligned with their padding");
};

// ---------------------------------------------------------- reduction

// Sum P per-lane values over the warp, scattered: each step sends the half
// a lane gives away and keeps the other, so P ≥ 32 values cost P - 1
// shuffles, not 5·P. Afterwards lane l holds element l·(P/32) + i in v[i]
// (P ≥ 32), or element l / (32/P) in v[0], every lane of its group alike.
template <int Live, int Offset, int P>
__device__ __forceinline__ void gemv_reduce_scatter(float (&v)[P], int lane)
{
    if constexpr (Offset > 0) {
        if constexpr (Live > 1) {
            constexpr int half = Live / 2;
            const bool upper = (lane & Offset) != 0;
#pragma unroll
            for (int i = 0; i < half; i++) {
                const float send = upper ? v[i] : v[i + half];
                const float keep = upper ? v[i + half] : v[i];
                v[i] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, Offset);
            }
            gemv_reduce_scatter<half, Offset / 2>(v, lane);
        } else {
            v[0] += __shfl_xor_sync(0xFFFFFFFFu, v[0], Offset);
            gemv_reduce_scatter<1, Offset / 2>(v, lane);
        }
    }
}

// ---------------------------------------------------------- the kernel

template <class F, class S, class Epilogue, int N, int K, int Smem>
__device__ void gemv(const kiln_linear_args &args)
{
    using L = gemv_layout<F, S>;
    static_assert(L::total == Smem, "the host's shared-memory size is this layout's");
    static_assert(K % F::unit == 0 && K % F::storage::block == 0, "K is whole units");
    constexpr int row_bytes = K / F::storage::block * F::storage::block_bytes;
    static_assert(!F::aligned || (row_bytes % 16 == 0 && L::stage_bytes % 16 == 0),
                  "aligned streams start every row and stage on 16 bytes");
    // One tile holds all of K (tile_k >= K, a stage may be longer than K),
    // or tiles are whole stages of every k-split warp.
    constexpr int tiles = (K + S::tile_k - 1) / S::tile_k;
    constexpr int step = L::stage_k * S::k_split;
    static_assert(tiles == 1 || S::tile_k % step == 0, "a tile is whole stages of every slice");
    constexpr int stages_per_tile = tiles == 1 ? (K + step - 1) / step : S::tile_k / step;
    constexpr int n_stages = tiles * stages_per_tile;
    constexpr int P = S::rows * S::max_m;

    extern __shared__ __align__(16) u8 smem[];
    float *xs = reinterpret_cast<float *>(smem);
    float *xsum = reinterpret_cast<float *>(smem + L::x_bytes);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = warp / S::k_split, slice = warp % S::k_split;
    u8 *ring = smem + L::x_bytes + L::xsum_bytes + warp * (S::stages * S::rows * L::slot);
    float *red = reinterpret_cast<float *>(smem + L::x_bytes + L::xsum_bytes + L::ring_bytes);

    const u8 *w = static_cast<const u8 *>(args.w);
    const u8 *ws = static_cast<const u8 *>(args.w_scale);
    const int n0 = (blockIdx.x * S::groups + group) * S::rows;
    // Rows past N stream row N - 1 again and are never stored: the loop
    // stays uniform across the warp.
    int rown[S::rows];
#pragma unroll
    for (int r = 0; r < S::rows; r++)
        rown[r] = n0 + r < N ? n0 + r : N - 1;

    // Where stage k0 of row n starts in global memory, as byte offsets
    // of the data and of its scales.
    auto data_at = [](int n, int k0) -> i64 {
        return (i64)n * row_bytes + k0 / F::storage::block * F::storage::block_bytes;
    };
    constexpr int scale_per_row = F::scale_cols ? (K + F::scale_cols - 1) / F::scale_cols : 1;
    auto scale_at = [](int n, int k0) -> i64 {
        if constexpr (F::scale_cols != 0)
            return ((i64)(n / F::scale_rows) * scale_per_row + k0 / F::scale_cols) * F::scale_elem;
        else
            return 0;
    };
    // An integer group's zero point: int8 [N, K / group] after the scales.
    auto zp_at = [](int n, int k0) -> i64 {
        if constexpr (F::zero_points)
            return (i64)N * scale_per_row * F::scale_elem + (i64)n * scale_per_row +
                   k0 / F::scale_cols;
        else
            return 0;
    };

    auto issue = [&](int j) {
        const int k0 = (slice + j * S::k_split) * L::stage_k;
        if (j < n_stages && k0 < K) {
            u8 *slot = ring + (j % S::stages) * S::rows * L::slot;
            const int kend = K < k0 + L::stage_k ? K : k0 + L::stage_k;
            const int len = (kend - k0) / F::storage::block * F::storage::block_bytes;
#pragma unroll
            for (int r = 0; r < S::rows; r++) {
                u8 *dst = slot + r * L::slot;
                const i64 at = data_at(rown[r], k0);
                if constexpr (F::aligned) {
#pragma unroll
                    for (int c = lane; c < L::stage_bytes / 16; c += 32)
                        if (16 * c < len)
                            cp_async<16>(dst + 16 * c, w + at + 16 * c, 16);
                } else {
                    constexpr i64 end = (i64)N * row_bytes;
                    const int mis = (int)(at & 15);
                    const i64 from = at - mis;
                    const int chunks = (mis + len + 15) / 16;
#pragma unroll
                    for (int c = lane; c < L::data_area / 16; c += 32)
                        if (c < chunks) {
                            const i64 src = from + 16 * c;
                            cp_async<16>(dst + 16 * c, w + src, end - src < 16 ? (int)(end - src) : 16);
                        }
                }
                if constexpr (F::scale_cols != 0) {
                    constexpr i64 end = (i64)((N + F::scale_rows - 1) / F::scale_rows) *
                                        scale_per_row * F::scale_elem;
                    const i64 sat = scale_at(rown[r], k0);
                    const int mis = (int)(sat & 3);
                    const int count = (kend - k0 + F::scale_cols - 1) / F::scale_cols * F::scale_elem;
                    const int words = (mis + count + 3) / 4;
#pragma unroll
                    for (int c = lane; c < L::scale_area / 4; c += 32)
                        if (c < words) {
                            const i64 src = sat - mis + 4 * c;
                            cp_async<4>(dst + L::data_area + 4 * c, ws + src,
                                        end - src < 4 ? (int)(end - src) : 4);
                        }
                }
                if constexpr (F::zero_points) {
                    constexpr i64 first = (i64)N * scale_per_row * F::scale_elem;
                    constexpr i64 end = first + (i64)N * scale_per_row;
                    const i64 zat = zp_at(rown[r], k0);
                    const int mis = (int)(zat & 3);
                    const int words = (mis + (kend - k0 + F::scale_cols - 1) / F::scale_cols + 3) / 4;
#pragma unroll
                    for (int c = lane; c < L::zp_area / 4; c += 32)
                        if (c < words) {
                            const i64 src = zat - mis + 4 * c;
                            cp_async<4>(dst + L::data_area + L::scale_area + 4 * c, ws + src,
                                        end - src < 4 ? (int)(end - src) : 4);
                        }
                }
            }
        }
        cp_async_commit();
    };

    // x[m, tile t] → f32 in shared memory, zeros past m and K; Q4_K also
    // keeps the sum of every run of 8.
    auto load_x = [&](int t) {
        constexpr int runs = S::tile_k / 8, total = S::max_m * runs;
        const u16 *x = static_cast<const u16 *>(args.x);
#pragma unroll
        for (int base = 0; base < total; base += S::threads) {
            const int idx = base + threadIdx.x;
            if (total % S::threads == 0 || idx < total) {
                const int m = idx / runs, c = idx % runs, k = t * S::tile_k + 8 * c;
                uint4 v = make_uint4(0, 0, 0, 0);
                if (m < args.m && k < K)
                    v = __ldg(reinterpret_cast<const uint4 *>(x + (i64)m * K + k));
                const u32 p[4] = { v.x, v.y, v.z, v.w };
                float f[8];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    f[2 * i] = __uint_as_float(p[i] << 16);
                    f[2 * i + 1] = __uint_as_float(p[i] & 0xFFFF0000u);
                }
                float4 *dst = reinterpret_cast<float4 *>(xs + m * L::x_ld + 8 * c + (c >> 2) * 4);
                dst[0] = make_float4(f[0], f[1], f[2], f[3]);
                dst[1] = make_float4(f[4], f[5], f[6], f[7]);
                if constexpr (F::offset) {
                    float sum = 0.0f;
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        sum += f[i];
                    xsum[m * runs + c] = sum;
                }
            }
        }
    };

    float acc[S::rows][S::max_m];
#pragma unroll
    for (int r = 0; r < S::rows; r++)
#pragma unroll
        for (int m = 0; m < S::max_m; m++)
            acc[r][m] = 0.0f;

    // A scale group's partial dot products, and Q4_K's sum of x over it.
    static_assert(F::runs % F::group == 0, "scale groups are whole runs of a unit");
    float part[S::rows][S::max_m], xgroup[S::max_m];

    // Decode stage j (at k0, kl within the tile) from its slot and FMA.
    auto consume = [&](int j, int k0, int kl) {
        const u8 *slot = ring + (j % S::stages) * S::rows * L::slot;
        const u8 *data[S::rows];
        const u8 *scales[S::rows];
        const u8 *zps[S::rows];
#pragma unroll
        for (int r = 0; r < S::rows; r++) {
            data[r] = slot + r * L::slot + (F::aligned ? 0 : (int)(data_at(rown[r], k0) & 15));
            scales[r] = slot + r * L::slot + L::data_area + (int)(scale_at(rown[r], k0) & 3);
            zps[r] = slot + r * L::slot + L::data_area + L::scale_area +
                     (int)(zp_at(rown[r], k0) & 3);
        }
        (void)zps;
#pragma unroll
        for (int i = 0; i < S::units; i++) {
            const int u = lane + 32 * i;
            if (k0 + F::unit_k(u) >= K)
                continue;
            // Small tiles unroll the runs so that decoding shared by the
            // runs of a unit (a scale pair, a header) is done once; large
            // ones keep one run's weights live at a time.
#pragma unroll(P <= 8 ? F::runs : 1)
            for (int q = 0; q < F::runs; q++) {
                const bool first = q % F::group == 0, last = q % F::group == F::group - 1;
                float wv[S::rows][8], sc[S::rows], off[S::rows];
#pragma unroll
                for (int r = 0; r < S::rows; r++) {
                    if constexpr (F::zero_points)
                        F::run_zp(data[r], scales[r], zps[r], u, q, wv[r], sc[r], off[r]);
                    else
                        F::run(data[r], scales[r], u, q, wv[r], sc[r], off[r]);
                }
                // kl is a multiple of 32: a stage starts on a multiple of
                // 256 values and a tile is a multiple of 32.
                const gemv_at at = F::run_at(u, q);
                const int g32 = kl / 32 + at.group;
                const float *xp = xs + 36 * g32 + at.offset;
#pragma unroll
                for (int m = 0; m < S::max_m; m++) {
                    const float4 a = *reinterpret_cast<const float4 *>(xp + m * L::x_ld);
                    const float4 b = *reinterpret_cast<const float4 *>(xp + m * L::x_ld + 4);
                    const float xv[8] = { a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w };
                    if constexpr (F::offset) {
                        const float xrun = xsum[m * (S::tile_k / 8) + 4 * g32 + at.offset / 8];
                        xgroup[m] = first ? xrun : xgroup[m] + xrun;
                    }
#pragma unroll
                    for (int r = 0; r < S::rows; r++) {
                        if constexpr (F::run_scale) {
                            float p = first ? xv[0] * wv[r][0] : fmaf(xv[0], wv[r][0], part[r][m]);
#pragma unroll
                            for (int e = 1; e < 8; e++)
                                p = fmaf(xv[e], wv[r][e], p);
                            part[r][m] = p;
                            if (last) {
                                acc[r][m] = fmaf(p, sc[r], acc[r][m]);
                                if constexpr (F::offset)
                                    acc[r][m] = fmaf(off[r], xgroup[m], acc[r][m]);
                            }
                        } else {
#pragma unroll
                            for (int e = 0; e < 8; e++)
                                acc[r][m] = fmaf(xv[e], wv[r][e], acc[r][m]);
                        }
                    }
                }
            }
        }
    };

#pragma unroll
    for (int j = 0; j < S::stages - 1; j++)
        issue(j);
#pragma unroll 1
    for (int t = 0; t < tiles; t++) {
        if (t > 0)
            __syncthreads(); // every warp is done with tile t - 1
        load_x(t);
        __syncthreads();
#pragma unroll 1
        for (int i = 0; i < stages_per_tile; i++) {
            const int j = t * stages_per_tile + i;
            issue(j + S::stages - 1);
            cp_async_wait<S::stages - 1>();
            __syncwarp(); // the lanes' copies of stage j are visible to all
            const int k0 = (slice + j * S::k_split) * L::stage_k;
            if (k0 < K)
                consume(j, k0, k0 - t * S::tile_k);
            __syncwarp(); // slot j is read before a later issue refills it
        }
    }

    float v[P];
#pragma unroll
    for (int r = 0; r < S::rows; r++)
#pragma unroll
        for (int m = 0; m < S::max_m; m++)
            v[r * S::max_m + m] = acc[r][m];
    gemv_reduce_scatter<P, 16>(v, lane);
    // Lane l holds `held` elements; below 32 elements, `spread` lanes
    // share one and the first of them stores it.
    constexpr int held = P >= 32 ? P / 32 : 1, spread = P >= 32 ? 1 : 32 / P;
    const bool holder = lane % spread == 0;
    auto element = [&](int i) { return P >= 32 ? lane * held + i : lane / spread; };

    auto store = [&](int g, int e, float sum) {
        const int r = e / S::max_m, m = e % S::max_m;
        const int n = (blockIdx.x * S::groups + g) * S::rows + r;
        if (n >= N || m >= args.m)
            return;
        gemv_store<Epilogue>(args, N, n, m, sum * F::factor * F::row_scale(args, n));
    };

    if constexpr (S::k_split == 1) {
        if (holder)
#pragma unroll
            for (int i = 0; i < held; i++)
                store(group, element(i), v[i]);
    } else {
        if (holder)
#pragma unroll
            for (int i = 0; i < held; i++)
                red[warp * P + element(i)] = v[i];
        __syncthreads();
        for (int idx = threadIdx.x; idx < S::groups * P; idx += S::threads) {
            const int g = idx / P, e = idx % P;
            float sum = 0.0f;
#pragma unroll
            for (int s = 0; s < S::k_split; s++)
                sum += red[(g * S::k_split + s) * P + e];
            store(g, e, sum);
        }
    }
}

} // namespace kiln
