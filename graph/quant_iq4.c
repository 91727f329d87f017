/* The GGML 4-bit non-linear formats, IQ4_NL and IQ4_XS: each nibble
 * indexes ggml's kvalues_iq4nl codebook of sixteen int8 levels, scaled per
 * 32 values.
 *
 * Quantization follows ggml's quantize_row_iq4_nl_ref and
 * quantize_row_iq4_xs_ref (quantize_row_iq4_nl_impl with no importance
 * weights): x²-weighted least-squares scales, in f32 and in ggml's order,
 * so the bytes are ggml's. Dequantization follows dequantize_row_iq4_* and
 * is bit-identical. In both, element j < 16 of a 32-value block is the
 * low nibble of qs[j] and element j + 16 its high nibble, as Q4_0. */
#include "core.h"
#include "graph/quant.h"

#include <math.h>
#include <string.h>

enum { QK = KILN_QK, QK_K = KILN_QK_K, IQ4_NL_BYTES = 18, IQ4_XS_BYTES = 136 };

/* ggml's kvalues_iq4nl, ascending. */
static const int8_t iq4_values[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };

/* ggml's best_index_int8: the index of the level nearest to x, the upper
 * one on a tie; NaN goes to the top level, as ggml's comparisons send it. */
static int nearest_level(float x)
{
    if (x <= iq4_values[0])
        return 0;
    if (!(x < iq4_values[15]))
        return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (x < iq4_values[mid])
            hi = mid;
        else
            lo = mid;
    }
    return x - iq4_values[hi - 1] < iq4_values[hi] - x ? hi - 1 : hi;
}

/* The least-squares scale of levels L for x, weighted by x². */
static float ls_scale(const float *x, const uint8_t *L, float *best)
{
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < QK; j++) {
        float q = iq4_values[L[j]];
        float w = x[j] * x[j];
        sumqx += w * q * x[j];
        sumq2 += w * q * q;
    }
    float d = sumqx / sumq2;
    *best = d * sumqx;
    return d;
}

/* The signed element of largest magnitude, and that magnitude. */
static float block_max(const float *x, float *amax)
{
    float max = 0;
    *amax = 0;
    for (int j = 0; j < QK; j++) {
        if (fabsf(x[j]) > *amax) {
            *amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

/* IQ4_XS's fit of one block of 32 (quantize_iq4_xs, ntry 7): levels of
 * x / d for d = max / 127, their least-squares scale, then inverse scales
 * (t - 127) / max for t in [-7, 7], keeping the scale of least
 * x²-weighted error. 0 for a block below KILN_GROUP_MAX_EPS. */
static float fit_block_search(const float *x)
{
    float amax, max = block_max(x, &amax);
    if (amax < KILN_GROUP_MAX_EPS)
        return 0.0f;
    uint8_t L[QK];
    float id = 1 / (-max / iq4_values[0]);
    for (int j = 0; j < QK; j++)
        L[j] = (uint8_t)nearest_level(id * x[j]);
    float best, d = ls_scale(x, L, &best);
    for (int itry = -7; itry <= 7; itry++) {
        id = (itry + iq4_values[0]) / max;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < QK; j++) {
            float q = iq4_values[nearest_level(id * x[j])];
            float w = x[j] * x[j];
            sumqx += w * q * x[j];
            sumq2 += w * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

/* The 16 bytes of a block of 32: levels of x * id, split halves. */
static void pack_block(const float *x, float id, uint8_t *qs)
{
    for (int j = 0; j < QK / 2; j++)
        qs[j] = (uint8_t)(nearest_level(id * x[j]) | (nearest_level(id * x[j + QK / 2]) << 4));
}

static void unpack_block(const uint8_t *qs, float d, float *out)
{
    for (int j = 0; j < QK / 2; j++) {
        out[j] = d * iq4_values[qs[j] & 0xF];
        out[j + QK / 2] = d * iq4_values[qs[j] >> 4];
    }
}

/* ------------------------------------------------------------- IQ4_NL */

/* 32 values: f16 d at 0, qs[16] at 2. y = d * kvalues[q].
 * quantize_row_iq4_nl_ref's fit (ntry -1): the levels of x / d0 for
 * d0 = max / -127 (the block's extreme takes level 0, -127), and the
 * least-squares scale of those levels, with no search and no
 * requantization. An all-zero block (d = 0) keeps the levels of the block
 * before it, as ggml's reused level buffer does; the first block's, which
 * ggml leaves undefined, are 0. */
void kiln_quant_iq4_nl_quantize(const float *src, kiln_qtensor *t)
{
    size_t nb = kiln_quant_blocks(t, QK);
    uint8_t L[QK] = { 0 };
    for (size_t b = 0; b < nb; b++) {
        const float *x = src + b * QK;
        uint8_t *y = (uint8_t *)t->data + b * IQ4_NL_BYTES;
        float amax, max = block_max(x, &amax), d = 0.0f;
        if (!(amax < KILN_GROUP_MAX_EPS)) {
            const float id = 1 / (max / iq4_values[0]);
            for (int j = 0; j < QK; j++)
                L[j] = (uint8_t)nearest_level(id * x[j]);
            float best;
            d = ls_scale(x, L, &best);
        }
        kiln_quant_store_f16(y, d);
        for (int j = 0; j < QK / 2; j++)
            y[2 + j] = (uint8_t)(L[j] | (L[j + QK / 2] << 4));
    }
}

void kiln_quant_iq4_nl_dequantize(const kiln_qtensor *t, float *dst)
{
    size_t nb = kiln_quant_blocks(t, QK);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *y = (const uint8_t *)t->data + b * IQ4_NL_BYTES;
        unpack_block(y + 2, kiln_quant_load_f16(y), dst + b * QK);
    }
}

/* ------------------------------------------------------------- IQ4_XS */

/* 256 values: f16 d at 0, u16 scales_h at 2, scales_l[4] at 4, qs[128] at
 * 8. Block ib's 6-bit scale ls keeps its low 4 bits in nibble ib % 2 of
 * scales_l[ib / 2] and its high 2 bits at bit 2 * ib of scales_h.
 * y = (d * (ls - 32)) * kvalues[q]. */
static int iq4_xs_scale(const uint8_t *y, int ib)
{
    const unsigned h = (unsigned)(y[2] | (y[3] << 8));
    return ((y[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (int)((h >> (2 * ib)) & 3) << 4;
}

/* d = -max_scale / 32 over the blocks' fits (max_scale: the signed fit of
 * largest magnitude), each block's scale rounded to l in [-32, 31], its
 * levels taken against d * l. */
static void iq4_xs_quantize_block(const float *x, uint8_t *y)
{
    float scales[QK_K / QK];
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < QK_K / QK; ib++) {
        scales[ib] = fit_block_search(x + QK * ib);
        if (fabsf(scales[ib]) > amax_scale) {
            amax_scale = fabsf(scales[ib]);
            max_scale = scales[ib];
        }
    }
    const float d = -max_scale / 32;
    kiln_quant_store_f16(y, d);
    const float id = d != 0.0f ? 1 / d : 0.0f;
    unsigned scales_h = 0;
    memset(y + 4, 0, QK_K / 64);
    for (int ib = 0; ib < QK_K / QK; ib++) {
        int l = kiln_quant_clamp(kiln_quant_nearest_int(id * scales[ib]), -32, 31);
        const float dl = d * l;
        pack_block(x + QK * ib, dl != 0.0f ? 1 / dl : 0.0f, y + 8 + 16 * ib);
        l += 32;
        y[4 + ib / 2] |= (uint8_t)((l & 0xF) << (4 * (ib % 2)));
        scales_h |= (unsigned)(l >> 4) << (2 * ib);
    }
    y[2] = (uint8_t)(scales_h & 0xFF);
    y[3] = (uint8_t)(scales_h >> 8);
}

void kiln_quant_iq4_xs_quantize(const float *src, kiln_qtensor *t)
{
    size_t nb = kiln_quant_blocks(t, QK_K);
    for (size_t b = 0; b < nb; b++)
        iq4_xs_quantize_block(src + b * QK_K, (uint8_t *)t->data + b * IQ4_XS_BYTES);
}

void kiln_quant_iq4_xs_dequantize(const kiln_qtensor *t, float *dst)
{
    size_t nb = kiln_quant_blocks(t, QK_K);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *y = (const uint8_t *)t->data + b * IQ4_XS_BYTES;
        const float d = kiln_quant_load_f16(y);
        for (int ib = 0; ib < QK_K / QK; ib++)
            unpack_block(y + 8 + 16 * ib, d * (iq4_xs_scale(y, ib) - 32), dst + b * QK_K + QK * ib);
    }
}
