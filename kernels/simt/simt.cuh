// The simt backend: y[m, N] = epilogue(x[m, K] · W[N, K]ᵀ) with BF16
// activations, any kiln weight format dequantized to f32 in shared memory,
// and f32 FMA tiles. It needs nothing newer than sm_75 and is the fallback
// every format has; tensor-core backends take over where they can.
//
// A block computes a BM x BN tile of y, walking K in steps of BK: it
// stages x[BM, BK] (BF16 → f32) and W[BN, BK] (dequantized, a format chunk
// per thread per step) in shared memory, K-major, then each thread
// accumulates TM x TN outputs. A thread's rows and columns are strided by
// the thread grid (row ty + i·BM/TM, column tx + j·BN/TN), so a warp's
// shared reads are consecutive words or broadcasts and its stores of y
// are coalesced. Each output is one f32 sum in K order; the epilogue
// rounds to BF16 once.
//
// grid = (ceil(N / BN), ceil(m / BM)), block = BM/TM · BN/TN threads, no
// dynamic shared memory (BK·(BM + BN + 2) floats, static).
#pragma once

#include "kiln/dequant.cuh"
#include "kiln/epilogue.cuh"
#include "kiln/kiln_args.h"

namespace kiln {

template <int BM, int BN, int BK, int TM, int TN>
struct simt_tile {
    static_assert(BM % TM == 0 && BN % TN == 0, "thread tiles divide the block tile");
    static constexpr int bm = BM, bn = BN, bk = BK, tm = TM, tn = TN;
    static constexpr int threads_m = BM / TM, threads_n = BN / TN;
    static constexpr int threads = threads_m * threads_n;
};

template <class Format, class Tile, class Epilogue, int N, int K>
__device__ void simt_gemm(const kiln_linear_args &args)
{
    static_assert(Tile::bk % Format::chunk == 0, "a format chunk never straddles two K steps");
    static_assert(K % Format::block == 0, "K is whole blocks of the format");
    // One float of padding per shared row: the transposing stores of both
    // tiles (consecutive threads, consecutive k) then land in distinct banks.
    __shared__ float xs[Tile::bk][Tile::bm + 1];
    __shared__ float ws[Tile::bk][Tile::bn + 1];

    const int m = args.m;
    const int m0 = blockIdx.y * Tile::bm, n0 = blockIdx.x * Tile::bn;
    const int tx = threadIdx.x % Tile::threads_n, ty = threadIdx.x / Tile::threads_n;
    const u16 *__restrict__ x = static_cast<const u16 *>(args.x);
    const weight_view w = { static_cast<const u8 *>(args.w), static_cast<const u8 *>(args.w_scale),
                            args.w_global ? *args.w_global : 1.0f };

    float acc[Tile::tm][Tile::tn] = {};
    constexpr int chunks_per_row = Tile::bk / Format::chunk;

#pragma unroll 1
    for (int k0 = 0; k0 < K; k0 += Tile::bk) {
        for (int c = threadIdx.x; c < Tile::bm * Tile::bk; c += Tile::threads) {
            const int r = c / Tile::bk, kk = c % Tile::bk;
            const int gm = m0 + r, gk = k0 + kk;
            xs[kk][r] = gm < m && gk < K ? bf16_to_f32(x[(i64)gm * K + gk]) : 0.0f;
        }
        for (int c = threadIdx.x; c < Tile::bn * chunks_per_row; c += Tile::threads) {
            const int r = c / chunks_per_row, kk = (c % chunks_per_row) * Format::chunk;
            const int gn = n0 + r, gk = k0 + kk;
            float v[Format::chunk];
            if (gn < N && gk < K) {
                Format::template load<K>(w, gn, gk, v);
            } else {
#pragma unroll
                for (int i = 0; i < Format::chunk; i++)
                    v[i] = 0.0f;
            }
#pragma unroll
            for (int i = 0; i < Format::chunk; i++)
                ws[kk + i][r] = v[i];
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < Tile::bk; kk++) {
            float a[Tile::tm], b[Tile::tn];
#pragma unroll
            for (int i = 0; i < Tile::tm; i++)
                a[i] = xs[kk][ty + i * Tile::threads_m];
#pragma unroll
            for (int j = 0; j < Tile::tn; j++)
                b[j] = ws[kk][tx + j * Tile::threads_n];
#pragma unroll
            for (int i = 0; i < Tile::tm; i++)
#pragma unroll
                for (int j = 0; j < Tile::tn; j++)
                    acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }

    u16 *__restrict__ y = static_cast<u16 *>(args.y);
#pragma unroll
    for (int i = 0; i < Tile::tm; i++) {
        const int row = m0 + ty + i * Tile::threads_m;
        if (row >= m)
            continue;
#pragma unroll
        for (int j = 0; j < Tile::tn; j++) {
            const int col = n0 + tx + j * Tile::threads_n;
            if (col >= N)
                continue;
            const i64 at = (i64)row * N + col;
            y[at] = f32_to_bf16(epilogue_apply<Epilogue>(args, acc[i][j], col, at));
        }
    }
}

} // namespace kiln
