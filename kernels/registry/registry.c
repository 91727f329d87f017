/* The backends kiln builds and each format's priority list, best first.
 * Selection takes the first backend of a format's list whose capability
 * checks pass for the linear and bucket (codegen/select.c). */
#include "kernels/registry/backend.h"

/* Every format has kernels in all three backends; the lists differ in what
 * each backend takes (is_supported, can_implement), not in order:
 *   gemv   decode, buckets up to 16 tokens: bandwidth-bound, every format;
 *   wgmma  Hopper tensor cores (sm_90a), K in steps of 64;
 *   simt   the f32 fallback for any sm_75+ target and any shape. */
#define KILN_DECODE_TC_SIMT { "gemv", "wgmma", "simt", NULL }

static const kiln_registry default_registry = {
    .backends = { &kiln_backend_gemv, &kiln_backend_wgmma, &kiln_backend_simt },
    .n = 3,
    .priority = {
        [KILN_FMT_F32] = KILN_DECODE_TC_SIMT,
        [KILN_FMT_F16] = KILN_DECODE_TC_SIMT,
        [KILN_FMT_BF16] = KILN_DECODE_TC_SIMT,
        [KILN_FMT_FP8_TENSOR] = KILN_DECODE_TC_SIMT,
        [KILN_FMT_FP8_CHANNEL] = KILN_DECODE_TC_SIMT,
        [KILN_FMT_FP8_BLOCK] = KILN_DECODE_TC_SIMT,
        [KILN_FMT_MXFP8] = KILN_DECODE_TC_SIMT,
        [KILN_FMT_NVFP4] = KILN_DECODE_TC_SIMT,
        [KILN_FMT_MXFP4] = KILN_DECODE_TC_SIMT,
        [KILN_FMT_Q8_0] = KILN_DECODE_TC_SIMT,
        [KILN_FMT_Q4_0] = KILN_DECODE_TC_SIMT,
        [KILN_FMT_Q4_K] = KILN_DECODE_TC_SIMT,
        [KILN_FMT_Q6_K] = KILN_DECODE_TC_SIMT,
        [KILN_FMT_GGML_MXFP4] = KILN_DECODE_TC_SIMT,
    },
};

const kiln_registry *kiln_registry_default(void) { return &default_registry; }
