/* The backends kiln builds and each format's priority list, best first.
 * Selection takes the first backend of a format's list whose capability
 * checks pass for the linear and bucket (codegen/select.c).
 *
 *   gemv_tc  decode, buckets up to 16 tokens, on tensor cores (sm_80+):
 *            every format exact in BF16, K in whole atoms of 64;
 *   gemv     decode in f32 FMA, every format and sm_75+: what gemv_tc
 *            leaves (F32, the formats without a packed layout, sm_75, K of
 *            part atoms);
 *   wgmma_tc Hopper prefill (sm_90a) from gemv_tc's packed layout, the
 *            weight decoded into the register operand: the 4-bit formats
 *            whose decoding is exact in BF16 (NVFP4, MXFP4, GGML MXFP4),
 *            the integer GGML formats rounded to BF16 (Q8_0, Q4_0, Q4_K,
 *            Q6_K), MXFP8, and F16 rounded to BF16 (as wgmma rounds it),
 *            where it is several times the dequantizing wgmma kernel (F16:
 *            ten times at 128 tokens) and keeps one weight copy for decode
 *            and prefill;
 *   wgmma    Hopper tensor cores (sm_90a), K in steps of 64: prefill, and
 *            decode that neither gemv kernel takes; the TMA kernel of
 *            BF16 and FP8 per-tensor and per-channel reads gemv_tc's
 *            packed atoms, which are row-major for them, so they keep one
 *            copy too;
 *   simt     the f32 fallback for any sm_75+ target and any shape.
 *
 * gemv_tc has no kernel for F32 (its values are not exact in BF16), so
 * F32's list does not name it. The GGML formats Q5_0, Q5_1, Q2_K, Q3_K,
 * Q5_K, IQ4_NL, IQ4_XS and Q4_1 have no packed layout yet: gemv decodes
 * them from the storage layout, and the dequantizing wgmma takes prefill.
 * So do the integer groups. */
#include "kernels/registry/backend.h"

#define KILN_DECODE_TC { "gemv_tc", "gemv", "wgmma", "simt", NULL }
#define KILN_DEQUANT { "gemv", "wgmma", "simt", NULL }
#define KILN_ONE_COPY { "gemv_tc", "wgmma_tc", "gemv", "wgmma", "simt", NULL }

static const kiln_registry default_registry = {
    .backends = { &kiln_backend_gemv_tc, &kiln_backend_gemv, &kiln_backend_wgmma,
                  &kiln_backend_wgmma_tc, &kiln_backend_simt },
    .n = 5,
    .priority = {
        [KILN_FMT_F32] = { "gemv", "wgmma", "simt", NULL },
        [KILN_FMT_F16] = KILN_ONE_COPY,
        [KILN_FMT_BF16] = KILN_DECODE_TC,
        [KILN_FMT_FP8_TENSOR] = KILN_DECODE_TC,
        [KILN_FMT_FP8_CHANNEL] = KILN_DECODE_TC,
        [KILN_FMT_FP8_BLOCK] = KILN_DECODE_TC,
        [KILN_FMT_MXFP8] = KILN_ONE_COPY,
        [KILN_FMT_NVFP4] = KILN_ONE_COPY,
        [KILN_FMT_MXFP4] = KILN_ONE_COPY,
        [KILN_FMT_Q8_0] = KILN_ONE_COPY,
        [KILN_FMT_Q4_0] = KILN_ONE_COPY,
        [KILN_FMT_Q4_K] = KILN_ONE_COPY,
        [KILN_FMT_Q6_K] = KILN_ONE_COPY,
        [KILN_FMT_GGML_MXFP4] = KILN_ONE_COPY,
        [KILN_FMT_Q5_0] = KILN_DEQUANT,
        [KILN_FMT_Q5_1] = KILN_DEQUANT,
        [KILN_FMT_Q2_K] = KILN_DEQUANT,
        [KILN_FMT_Q3_K] = KILN_DEQUANT,
        [KILN_FMT_Q5_K] = KILN_DEQUANT,
        [KILN_FMT_IQ4_NL] = KILN_DEQUANT,
        [KILN_FMT_IQ4_XS] = KILN_DEQUANT,
        [KILN_FMT_Q4_1] = KILN_DEQUANT,
        [KILN_FMT_INT4_GROUP] = KILN_DEQUANT,
        [KILN_FMT_INT4_GROUP_ZP] = KILN_DEQUANT,
        [KILN_FMT_INT8_GROUP] = KILN_DEQUANT,
        [KILN_FMT_INT8_GROUP_ZP] = KILN_DEQUANT,
    },
};

const kiln_registry *kiln_registry_default(void) { return &default_registry; }
