// The aux kernels of a plan: elementwise ops, rms_norm and the activation
// quantizers of the kiln_act schemes, plus the activation functions the
// GEMM epilogues share. Arithmetic is f32 in the CPU executor's order
// (runtime/cpu.c), inputs and outputs BF16, the output rounded to nearest
// even once. The layouts of quantized activations are in kiln_args.h.
//
// Every row kernel runs one block of KILN_ROW_THREADS per row (grid.x =
// m): rows are independent, and a row of a model's width is a few KiB,
// which a block streams with coalesced strides. The fp8-tensor amax pass
// alone runs KILN_QUANT_AMAX_PARTS blocks over the whole tensor.
#pragma once

#include "kiln/kiln_args.h"
#include "kiln/kiln_types.cuh"

namespace kiln {

constexpr int row_threads = KILN_ROW_THREADS;
static_assert(row_threads % 32 == 0 && row_threads <= 1024, "whole warps, one block");

// ----------------------------------------------------- activation functions

// x · sigmoid(x), with IEEE expf and division as in the CPU executor.
__device__ __forceinline__ float silu(float x)
{
    return x / (1.0f + expf(-x));
}

// The fused gated-FFN epilogue: up · silu(gate).
__device__ __forceinline__ float silu_mul(float up, float gate)
{
    return up * silu(gate);
}

// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), GPT-2's and ggml's form.
__device__ __forceinline__ float gelu(float x)
{
    const float c = 0.7978845608028654f;
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

// ------------------------------------------------------------- reductions

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}

__device__ __forceinline__ double warp_sum(double v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

// The block-wide max over row_threads threads, returned to all of them:
// every warp folds the per-warp results itself, so none waits on a
// broadcast.
// fmaxf drops NaN, so a NaN element cannot poison its row's scale (as the
// CPU reference's amax skips NaN).
__device__ __forceinline__ float block_max(float v)
{
    __shared__ float part[row_threads / 32];
    v = warp_max(v);
    if (threadIdx.x % 32 == 0)
        part[threadIdx.x / 32] = v;
    __syncthreads();
    v = threadIdx.x % 32 < row_threads / 32 ? part[threadIdx.x % 32] : 0.0f;
    v = warp_max(v);
    __syncthreads(); // part is reused by the next call
    return v;
}

__device__ __forceinline__ double block_sum(double v)
{
    __shared__ double part[row_threads / 32];
    v = warp_sum(v);
    if (threadIdx.x % 32 == 0)
        part[threadIdx.x / 32] = v;
    __syncthreads();
    v = threadIdx.x % 32 < row_threads / 32 ? part[threadIdx.x % 32] : 0.0;
    v = warp_sum(v);
    __syncthreads();
    return v;
}

// ------------------------------------------------------- elementwise ops

struct add_fn {
    static __device__ float apply(float a, float b) { return a + b; }
};
struct mul_fn {
    static __device__ float apply(float a, float b) { return a * b; }
};
struct silu_fn {
    static __device__ float apply(float a, float) { return silu(a); }
};
struct gelu_fn {
    static __device__ float apply(float a, float) { return gelu(a); }
};

// y = Fn(a, b) over one row per block; unary ops ignore b (NULL).
template <class Fn, bool Binary, int Width>
__device__ void elementwise(const kiln_op_args &args)
{
    const i64 row = (i64)blockIdx.x * Width;
    const u16 *a = static_cast<const u16 *>(args.a) + row;
    const u16 *b = Binary ? static_cast<const u16 *>(args.b) + row : nullptr;
    u16 *y = static_cast<u16 *>(args.y) + row;
    for (int i = threadIdx.x; i < Width; i += row_threads) {
        float bv = Binary ? bf16_to_f32(b[i]) : 0.0f;
        y[i] = f32_to_bf16(Fn::apply(bf16_to_f32(a[i]), bv));
    }
}

// y = x · (1 / sqrt(mean(x²) + eps)) · weight. The sum of squares is
// taken in double, as the CPU reference takes it: Width terms of one sign
// would cost an f32 sum about log2(Width) bits.
template <int Width>
__device__ void rms_norm(const kiln_op_args &args)
{
    const i64 row = (i64)blockIdx.x * Width;
    const u16 *x = static_cast<const u16 *>(args.a) + row;
    u16 *y = static_cast<u16 *>(args.y) + row;
    double ss = 0.0;
    for (int i = threadIdx.x; i < Width; i += row_threads) {
        double v = bf16_to_f32(x[i]);
        ss += v * v;
    }
    ss = block_sum(ss);
    const float scale = (float)(1.0 / sqrt(ss / Width + (double)args.eps));
    for (int i = threadIdx.x; i < Width; i += row_threads)
        y[i] = f32_to_bf16(bf16_to_f32(x[i]) * scale * args.weight[i]);
}

// ------------------------------------------------ activation quantization

// f32 scales of quantized activations start at byte m·k (any alignment).
__device__ __forceinline__ void store_f32_bytes(u8 *p, float v)
{
    u32 u = __float_as_uint(v);
    p[0] = (u8)u;
    p[1] = (u8)(u >> 8);
    p[2] = (u8)(u >> 16);
    p[3] = (u8)(u >> 24);
}

// E4M3 with s = amax / 448 (a division, as the CPU quantizers divide);
// s = 0 (an all-zero run) stores the values as they are, zeros.
__device__ __forceinline__ u8 fp8_quantize(float x, float s)
{
    return f32_to_e4m3(s > 0.0f ? x / s : x);
}

// amax over [begin, end) of a row, across the block.
__device__ __forceinline__ float row_amax(const u16 *x, int begin, int end)
{
    float amax = 0.0f;
    for (int i = begin + threadIdx.x; i < end; i += row_threads)
        amax = fmaxf(amax, fabsf(bf16_to_f32(x[i])));
    return block_max(amax);
}

// fp8-token: one f32 scale per row, after the [m, K] codes.
template <int K>
__device__ void quant_fp8_token(const kiln_quant_args &args)
{
    const i64 row = (i64)blockIdx.x * K;
    const u16 *x = static_cast<const u16 *>(args.x) + row;
    u8 *q = static_cast<u8 *>(args.q);
    float s = row_amax(x, 0, K) / 448.0f;
    for (int i = threadIdx.x; i < K; i += row_threads)
        q[row + i] = fp8_quantize(bf16_to_f32(x[i]), s);
    if (threadIdx.x == 0)
        store_f32_bytes(q + (i64)args.m * K + 4 * (i64)blockIdx.x, s);
}

// Groups of G along K, one warp per group, G / 32 values per lane; the
// last group of a K that G does not divide is partial.
//   Mx = false: fp8-1x128, f32 s = amax / 448, scales [groups][m]
//   Mx = true:  mxfp8-1x32, E8M0 X = 2^(floor(log2 amax) − 8), [m][groups]
template <int K, int G, bool Mx>
__device__ void quant_fp8_groups(const kiln_quant_args &args)
{
    static_assert(G % 32 == 0, "a group is whole warps' worth of lanes");
    constexpr int groups = (K + G - 1) / G;
    constexpr int warps = row_threads / 32;
    const int lane = threadIdx.x % 32;
    const i64 row = (i64)blockIdx.x * K;
    const u16 *x = static_cast<const u16 *>(args.x) + row;
    u8 *q = static_cast<u8 *>(args.q);
    u8 *scales = q + (i64)args.m * K;
    for (int g = threadIdx.x / 32; g < groups; g += warps) {
        float v[G / 32];
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < G / 32; i++) {
            int k = g * G + i * 32 + lane;
            v[i] = k < K ? bf16_to_f32(x[k]) : 0.0f;
            amax = fmaxf(amax, fabsf(v[i]));
        }
        amax = warp_max(amax);
        float s;
        if (Mx) {
            u8 code = mx_scale_code(amax, 8);
            s = e8m0_to_f32(code);
            if (lane == 0)
                scales[(i64)blockIdx.x * groups + g] = code;
        } else {
            s = amax / 448.0f;
            if (lane == 0)
                store_f32_bytes(scales + 4 * ((i64)g * args.m + blockIdx.x), s);
        }
#pragma unroll
        for (int i = 0; i < G / 32; i++) {
            int k = g * G + i * 32 + lane;
            if (k < K)
                q[row + k] = Mx ? f32_to_e4m3(v[i] / s) : fp8_quantize(v[i], s);
        }
    }
}

// The static schemes: the checkpoint's input scale s, read from *args.scale,
// for every token, x_q = e4m3(x / s) (saturating at ±448, as the clamp
// does), divided as the CPU reference divides.
//   fp8-static: the codes, and s as every row's f32 scale (the fp8-token
//               layout, which the FP8 GEMMs read);
//   bf16-qdq:   bf16(x_q · s), for the kernels that read BF16.
template <int K>
__device__ void quant_fp8_static(const kiln_quant_args &args)
{
    const i64 row = (i64)blockIdx.x * K;
    const u16 *x = static_cast<const u16 *>(args.x) + row;
    u8 *q = static_cast<u8 *>(args.q);
    const float s = *args.scale;
    for (int i = threadIdx.x; i < K; i += row_threads)
        q[row + i] = f32_to_e4m3(bf16_to_f32(x[i]) / s);
    if (threadIdx.x == 0)
        store_f32_bytes(q + (i64)args.m * K + 4 * (i64)blockIdx.x, s);
}

template <int K>
__device__ void quant_bf16_qdq(const kiln_quant_args &args)
{
    const i64 row = (i64)blockIdx.x * K;
    const u16 *x = static_cast<const u16 *>(args.x) + row;
    u16 *y = static_cast<u16 *>(args.q) + row;
    const float s = *args.scale;
    for (int i = threadIdx.x; i < K; i += row_threads)
        y[i] = f32_to_bf16(e4m3_to_f32(f32_to_e4m3(bf16_to_f32(x[i]) / s)) * s);
}

// bf16-tc: each 16 values of K as the gemv_tc packing orders its k slots
// (kiln/wgmma_tc.cuh): MMA position 2t + (s & 1) + 8(s >> 1) holds k =
// 4t + s, so of the 16 values' eight pairs, positions 0..3 hold pairs 0,
// 2, 4, 6 and positions 4..7 pairs 1, 3, 5, 7. A thread moves 16 values.
template <int K>
__device__ void quant_bf16_tc(const kiln_quant_args &args)
{
    static_assert(K % 16 == 0, "whole groups of 16");
    const i64 row = (i64)blockIdx.x * K;
    const uint4 *x = reinterpret_cast<const uint4 *>(static_cast<const u16 *>(args.x) + row);
    uint4 *y = reinterpret_cast<uint4 *>(static_cast<u16 *>(args.q) + row);
    for (int i = threadIdx.x; i < K / 16; i += row_threads) {
        const uint4 lo = x[2 * i], hi = x[2 * i + 1];
        y[2 * i] = make_uint4(lo.x, lo.z, hi.x, hi.z);
        y[2 * i + 1] = make_uint4(lo.y, lo.w, hi.y, hi.w);
    }
}

// fp8-tensor, first kernel: KILN_QUANT_AMAX_PARTS blocks stride over all
// m·K values; block b writes its amax to partial[b].
template <int K>
__device__ void quant_fp8_tensor_amax(const kiln_quant_args &args)
{
    const i64 total = (i64)args.m * K;
    const u16 *x = static_cast<const u16 *>(args.x);
    float amax = 0.0f;
    for (i64 i = (i64)blockIdx.x * row_threads + threadIdx.x; i < total;
         i += (i64)KILN_QUANT_AMAX_PARTS * row_threads)
        amax = fmaxf(amax, fabsf(bf16_to_f32(x[i])));
    amax = block_max(amax);
    if (threadIdx.x == 0)
        args.partial[blockIdx.x] = amax;
}

// fp8-tensor, second kernel: every row block folds the partials itself
// (64 floats), so no block waits on another; block 0 publishes the scale.
template <int K>
__device__ void quant_fp8_tensor(const kiln_quant_args &args)
{
    static_assert(KILN_QUANT_AMAX_PARTS <= row_threads, "one partial per thread");
    float p = threadIdx.x < KILN_QUANT_AMAX_PARTS ? args.partial[threadIdx.x] : 0.0f;
    const float s = block_max(p) / 448.0f;
    if (blockIdx.x == 0 && threadIdx.x == 0)
        *args.scale = s;
    const i64 row = (i64)blockIdx.x * K;
    const u16 *x = static_cast<const u16 *>(args.x) + row;
    u8 *q = static_cast<u8 *>(args.q) + row;
    for (int i = threadIdx.x; i < K; i += row_threads)
        q[i] = fp8_quantize(bf16_to_f32(x[i]), s);
}

} // namespace kiln
