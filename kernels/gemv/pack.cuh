// The gemv_tc packed layout written on the device: the weight goes up in
// kiln's storage layout and this kernel writes what the host packer
// (kernels/gemv/pack.c) writes, through the same functions
// (kiln/pack_core.h). One warp an atom of a 16-row tile: lane l writes its
// share of the atom's data, lanes 0..15 the scale records of rows g + 8h.
// Then every thread copies a stride of a scale array the layout keeps as
// it is, and looks at a stride of the values the layout cannot carry,
// lowering *bad to the first it finds.
#pragma once

#include "kiln/kiln_args.h"
#include "kiln/pack_core.h"

namespace kiln {

template <int CLS, int REC, int CODES, int CHECK, int BYTES, int PIECES, int RECORD, int SUPER>
__device__ __forceinline__ void pack_weight(const kiln_pack_args &a)
{
    const kp_format f = { CLS, REC, CODES, CHECK, BYTES, PIECES, RECORD, SUPER };
    const kp_src q = { (const kp_u8 *)a.w, (const kp_u8 *)a.w_scale, a.n, a.k };
    const kp_i64 atoms = a.k / KP_ATOM, items = (a.n + KP_TILE - 1) / KP_TILE * atoms;
    const int lane = threadIdx.x % 32, warps = KILN_PACK_THREADS / 32;
    const kp_i64 stride = (kp_i64)gridDim.x * warps;
    for (kp_i64 i = (kp_i64)blockIdx.x * warps + threadIdx.x / 32; i < items; i += stride) {
        const kp_i64 r = i / atoms, at = i % atoms;
        kp_pack_lane(&q, &f, r, at, lane, (kp_u8 *)a.out + i * BYTES);
        if (RECORD && lane < 16)
            kp_pack_record(&q, &f, r, at, lane % 8, lane / 8, (kp_u8 *)a.out_scale);
    }
    const kp_i64 first = (kp_i64)blockIdx.x * KILN_PACK_THREADS + threadIdx.x;
    const kp_i64 all = (kp_i64)gridDim.x * KILN_PACK_THREADS;
    if (!RECORD)
        for (kp_i64 i = first; i < a.scale_bytes; i += all)
            ((kp_u8 *)a.out_scale)[i] = q.scale[i];
    if (CHECK == KP_CHECK_NONE)
        return;
    const kp_i64 count = kp_check_count(&q, CHECK);
    for (kp_i64 i = first; i < count; i += all)
        if (kp_unpackable(&q, CHECK, i))
            atomicMin(a.bad, (unsigned long long)i);
}

} // namespace kiln
