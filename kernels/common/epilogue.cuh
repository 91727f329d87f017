// The epilogue every linear kernel applies to an output on its way out, in
// the CPU graph's order: v = acc (+ bias[n]); a gated FFN's up projection
// then takes v · silu(g[m, n]); a residual adds r[m, n]. g and r come
// through the one aux input (kiln_linear_args), so the two exclude each
// other. The kernel rounds the result to BF16 once when it stores it.
#pragma once

#include "kiln/elementwise.cuh"
#include "kiln/kiln_args.h"
#include "kiln/kiln_types.cuh"

namespace kiln {

template <bool Bias, bool Residual, bool SiluMul>
struct epilogue {
    static_assert(!(Residual && SiluMul), "residual and silu_mul share the aux input");
    static constexpr bool bias = Bias, residual = Residual, silu_mul = SiluMul;
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

} // namespace kiln
