/* Internal: the GGML block quantizers of quant_ggml.c, quant_q2k_q3k.c and
 * quant_iq4.c and the integer group quantizers of quant_int.c, dispatched
 * by quant.c, and the helpers they share. */
#ifndef KILN_QUANT_H
#define KILN_QUANT_H

#include "kiln.h"

#include <math.h>
#include <stddef.h>

enum { KILN_QK = 32, KILN_QK_K = 256 };

/* Below this block maximum a K-quant or IQ4 sub-block counts as all zero. */
#define KILN_GROUP_MAX_EPS 1e-15f

/* An f16 field of a block, little-endian at any byte. */
static inline float kiln_quant_load_f16(const uint8_t *p)
{
    return kiln_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

static inline void kiln_quant_store_f16(uint8_t *p, float v)
{
    uint16_t h = kiln_f32_to_f16(v);
    p[0] = (uint8_t)(h & 0xFF);
    p[1] = (uint8_t)(h >> 8);
}

/* Blocks of `block` values in t, a run of them in row-major order. */
static inline size_t kiln_quant_blocks(const kiln_qtensor *t, int block)
{
    return (size_t)t->n * (size_t)t->k / (size_t)block;
}

/* Round to nearest, ties to even, as ggml's nearest_int (which adds
 * 1.5 * 2^23 and is exact only for |v| <= 2^22 - 1): the range is clamped
 * there, and NaN gives 0. */
static inline int kiln_quant_nearest_int(float v)
{
    const float lim = 4194303.0f;
    if (!(v == v))
        return 0;
    if (v > lim)
        v = lim;
    if (v < -lim)
        v = -lim;
    return (int)rintf(v);
}

static inline int kiln_quant_clamp(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ggml's make_qkx2_quants: fit x ≈ scale * L - the_min with L in [0, nmax]
 * by weighted least squares (absolute error when use_mad), trying nstep + 1
 * candidate inverse scales around nmax / (max - min) and keeping the best.
 * L and Laux hold n levels. Returns the scale. */
float kiln_quant_fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min,
                               uint8_t *Laux, float rmin, float rdelta, int nstep, int use_mad);

/* The GGML block formats; a GGML tensor is a run of independent blocks in
 * row-major order. */
void kiln_quant_q8_0_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_q8_0_dequantize(const kiln_qtensor *t, float *dst);
void kiln_quant_q4_0_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_q4_0_dequantize(const kiln_qtensor *t, float *dst);
void kiln_quant_q4_1_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_q4_1_dequantize(const kiln_qtensor *t, float *dst);
void kiln_quant_q5_0_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_q5_0_dequantize(const kiln_qtensor *t, float *dst);
void kiln_quant_q5_1_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_q5_1_dequantize(const kiln_qtensor *t, float *dst);
void kiln_quant_q4_k_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_q4_k_dequantize(const kiln_qtensor *t, float *dst);
/* Sub-block j's 6-bit scale and min from a Q4_K or Q5_K block's 12 packed
 * bytes. */
void kiln_quant_q4_k_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m);
void kiln_quant_q5_k_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_q5_k_dequantize(const kiln_qtensor *t, float *dst);
void kiln_quant_q6_k_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_q6_k_dequantize(const kiln_qtensor *t, float *dst);
void kiln_quant_ggml_mxfp4_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_ggml_mxfp4_dequantize(const kiln_qtensor *t, float *dst);
void kiln_quant_q2_k_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_q2_k_dequantize(const kiln_qtensor *t, float *dst);
void kiln_quant_q3_k_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_q3_k_dequantize(const kiln_qtensor *t, float *dst);
/* Sub-block j's 6-bit scale (0..63, stored with a bias of 32) from a Q3_K
 * block's 12 packed bytes. */
int kiln_quant_q3_k_scale(int j, const uint8_t *s);
void kiln_quant_iq4_nl_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_iq4_nl_dequantize(const kiln_qtensor *t, float *dst);
void kiln_quant_iq4_xs_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_iq4_xs_dequantize(const kiln_qtensor *t, float *dst);

/* The integer group formats (quant_int.c), all four: the table row says
 * the bits and whether zero points follow the scales. */
void kiln_quant_int_group_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_int_group_dequantize(const kiln_qtensor *t, float *dst);

#endif
