// The epilogue every linear kernel applies to an output on its way out, in
// the CPU graph's order: v = acc (+ bias[n]); a gated FFN's up projection
// then takes v · silu(g[m, n]); a residual adds r[m, n]. g and r come
// through the one aux input (kiln_linear_args), so the two exclude each
// other. The kernel rounds the result to BF16 once when it stores it.
// With Gate (only with SiluMul, kernels that opt in), the kernel computes
// g itself from the gate projection's weight and applies the product
// before the store; aux is not read.
#pragma once

#include "kiln/elementwise.cuh"
#include "kiln/kiln_args.h"
#include "kiln/kiln_types.cuh"

namespace kiln {

template <bool Bias, bool Residual, bool SiluMul, bool Gate = false>
struct epilogue {
    static_assert(!(Residual && SiluMul), "residual and silu_mul share the aux input");
    static_assert(!Gate || (SiluMul && !Bias), "the gate comes with silu_mul, without a bias");
    static constexpr bool bias = Bias, residual = Residual, silu_mul = SiluMul, gate = Gate;
};

// The epilogue of output (m, n) of y[m, N], at = m·N + n, on its value v.
template <class Epilogue>
__device__ __forceinline__ float epilogue_apply(const kiln_linear_args &args, float v, int n,
                                                i64 at)
{
    const u16 *__restrict__ aux = static_cast<const u16 *>(args.aux);
    if constexpr (Epilogue::bias)
        v += args.bias[n];
    if constexpr (Epilogue::silu_mul)
        v = silu_mul(v, bf16_to_f32(aux[at]));
    if constexpr (Epilogue::residual)
        v += bf16_to_f32(aux[at]);
    return v;
}

// The epilogue of outputs (row, col) and (row, col + 1) of y[m, N], col
// even, on their f32 values v0 and v1, stored as BF16: as one 4-byte pair
// when N is even (the pair is then whole or absent, and aligned), else
// each column within N on its own. The tensor-core kernels' accumulator
// fragments hold such pairs.
template <class Epilogue, int N>
__device__ __forceinline__ void epilogue_store_pair(const kiln_linear_args &args, u16 *y, int row,
                                                    int col, float v0, float v1)
{
    const i64 at = (i64)row * N + col;
    if constexpr (N % 2 == 0) {
        if (col < N)
            *reinterpret_cast<u32 *>(y + at) =
                (u32)f32_to_bf16(epilogue_apply<Epilogue>(args, v0, col, at)) |
                ((u32)f32_to_bf16(epilogue_apply<Epilogue>(args, v1, col + 1, at + 1)) << 16);
    } else {
        if (col < N)
            y[at] = f32_to_bf16(epilogue_apply<Epilogue>(args, v0, col, at));
        if (col + 1 < N)
            y[at + 1] = f32_to_bf16(epilogue_apply<Epilogue>(args, v1, col + 1, at + 1));
    }
}

} // namespace kiln
