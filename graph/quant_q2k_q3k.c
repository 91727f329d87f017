/* The GGML 2- and 3-bit K-quants, Q2_K and Q3_K: 256 values in sixteen
 * sub-blocks of 16, each with its own scale.
 *
 * As in quant_ggml.c, quantization follows ggml's quantize_row_*_ref
 * operation for operation in f32 (no importance weights), dequantization
 * follows dequantize_row_* and is bit-identical, and out-of-range
 * conversions ggml leaves undefined are clamped. Both formats pack four
 * 2-bit levels a byte: in each half of 128 values, byte l < 32 of the
 * half's 32 holds the levels of values l, l + 32, l + 64 and l + 96 at bits
 * 0, 2, 4 and 6. */
#include "core.h"
#include "graph/quant.h"

#include <math.h>
#include <string.h>

enum { QK_K = KILN_QK_K, Q2_K_BYTES = 84, Q3_K_BYTES = 110 };

static void pack_2bit(const uint8_t *L, uint8_t *qs)
{
    for (int j = 0; j < QK_K; j += 128, qs += 32)
        for (int l = 0; l < 32; l++)
            qs[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

/* The 2-bit level of value v (0..255) from qs. */
static int level_2bit(const uint8_t *qs, int v)
{
    return (qs[32 * (v / 128) + v % 32] >> (2 * ((v % 128) / 32))) & 3;
}

/* --------------------------------------------------------------- Q2_K */

/* Q2_K layout: scales[16] at 0 (sub-block j: scale in the low nibble, min
 * in the high), qs[64] at 16, f16 d at 80, f16 dmin at 82.
 * y = (d * sc) * q - dmin * m, q in [0, 3]. */
static void q2_k_quantize_block(const float *x, uint8_t *y)
{
    uint8_t L[QK_K], Laux[16];
    float weights[16], mins[QK_K / 16], scales[QK_K / 16];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 16; j++) {
        for (int l = 0; l < 16; l++)
            weights[l] = fabsf(x[16 * j + l]);
        scales[j] = kiln_quant_fit_scale_min(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f,
                                             15, 1);
        if (scales[j] > max_scale)
            max_scale = scales[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }

    /* ggml stores the rounded 4-bit codes unclamped: every scale and min is
     * at most its maximum, so the code is at most 15, and a negative fit
     * (a NaN input) is clamped here. */
    uint8_t *sc = y;
    memset(sc, 0, QK_K / 16);
    if (max_scale > 0) {
        float iscale = 15.0f / max_scale;
        for (int j = 0; j < QK_K / 16; j++)
            sc[j] = (uint8_t)kiln_quant_clamp(kiln_quant_nearest_int(iscale * scales[j]), 0, 15);
    }
    kiln_quant_store_f16(y + 80, max_scale > 0 ? max_scale / 15.0f : 0.0f);
    if (max_min > 0) {
        float iscale = 15.0f / max_min;
        for (int j = 0; j < QK_K / 16; j++)
            sc[j] |= (uint8_t)(kiln_quant_clamp(kiln_quant_nearest_int(iscale * mins[j]), 0, 15) << 4);
    }
    kiln_quant_store_f16(y + 82, max_min > 0 ? max_min / 15.0f : 0.0f);

    /* Requantize against the scales as stored; a sub-block whose stored
     * scale is 0 keeps the fit's levels. */
    for (int j = 0; j < QK_K / 16; j++) {
        const float d = kiln_quant_load_f16(y + 80) * (sc[j] & 0xF);
        if (d == 0.0f)
            continue;
        const float dm = kiln_quant_load_f16(y + 82) * (sc[j] >> 4);
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (uint8_t)kiln_quant_clamp(kiln_quant_nearest_int((x[16 * j + i] + dm) / d), 0, 3);
    }
    pack_2bit(L, y + 16);
}

void kiln_quant_q2_k_quantize(const float *src, kiln_qtensor *t)
{
    size_t nb = kiln_quant_blocks(t, QK_K);
    for (size_t b = 0; b < nb; b++)
        q2_k_quantize_block(src + b * QK_K, (uint8_t *)t->data + b * Q2_K_BYTES);
}

void kiln_quant_q2_k_dequantize(const kiln_qtensor *t, float *dst)
{
    size_t nb = kiln_quant_blocks(t, QK_K);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *y = (const uint8_t *)t->data + b * Q2_K_BYTES;
        const float d = kiln_quant_load_f16(y + 80), dmin = kiln_quant_load_f16(y + 82);
        float *out = dst + b * QK_K;
        for (int j = 0; j < QK_K / 16; j++) {
            const float dl = d * (y[j] & 0xF), ml = dmin * (y[j] >> 4);
            for (int i = 0; i < 16; i++)
                out[16 * j + i] = dl * level_2bit(y + 16, 16 * j + i) - ml;
        }
    }
}

/* --------------------------------------------------------------- Q3_K */

/* Q3_K layout: hmask[32] at 0, qs[64] at 32, scales[12] at 96, f16 d at
 * 108. Value v's level is its 2 bits in qs, less 4 unless bit v / 32 of
 * hmask[v % 32] is set: q in [-4, 3]. Sub-block j's 6-bit scale keeps its
 * low 4 bits in the low (j < 8) or high (j >= 8) nibble of scales[j % 8]
 * and its high 2 bits at bit 2 * (j / 4) of scales[8 + j % 4].
 * y = (d * (sc - 32)) * q. */
int kiln_quant_q3_k_scale(int j, const uint8_t *s)
{
    const int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
    return lo | ((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4;
}

/* ggml's make_q3_quants with do_rmse: a symmetric fit x ≈ scale * L, L in
 * [-nmax, nmax - 1], from -nmax / max (max: the signed element of largest
 * magnitude), then up to five rounds that move single levels where the
 * x²-weighted error falls. Levels come back offset by nmax. */
static float fit_scale_q3(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < KILN_GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = kiln_quant_clamp(kiln_quant_nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = kiln_quant_clamp(kiln_quant_nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        changed++;
                    }
                }
            }
        }
        if (!changed)
            break;
    }
    for (int i = 0; i < n; i++)
        L[i] = (int8_t)(L[i] + nmax);
    return sumlx / suml2;
}

static void q3_k_quantize_block(const float *x, uint8_t *y)
{
    int8_t L[QK_K];
    float scales[QK_K / 16];
    float max_scale = 0, amax = 0;
    for (int j = 0; j < QK_K / 16; j++) {
        scales[j] = fit_scale_q3(16, 4, x + 16 * j, L + 16 * j);
        if (fabsf(scales[j]) > amax) {
            amax = fabsf(scales[j]);
            max_scale = scales[j];
        }
    }

    uint8_t *s = y + 96;
    memset(s, 0, 12);
    if (max_scale != 0.0f) {
        float iscale = -32.0f / max_scale;
        for (int j = 0; j < QK_K / 16; j++) {
            int l = kiln_quant_clamp(kiln_quant_nearest_int(iscale * scales[j]), -32, 31) + 32;
            if (j < 8)
                s[j] = (uint8_t)(l & 0xF);
            else
                s[j - 8] |= (uint8_t)((l & 0xF) << 4);
            s[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
        }
        kiln_quant_store_f16(y + 108, 1 / iscale);
    } else {
        kiln_quant_store_f16(y + 108, 0.0f);
    }

    /* Requantize against the scales as stored; a sub-block whose stored
     * scale is 0 keeps the fit's levels. */
    for (int j = 0; j < QK_K / 16; j++) {
        const float d = kiln_quant_load_f16(y + 108) * (kiln_quant_q3_k_scale(j, s) - 32);
        if (d == 0.0f)
            continue;
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (int8_t)(kiln_quant_clamp(kiln_quant_nearest_int(x[16 * j + i] / d), -4, 3) + 4);
    }

    uint8_t *hmask = y, low[QK_K];
    memset(hmask, 0, 32);
    for (int v = 0; v < QK_K; v++) {
        if (L[v] > 3)
            hmask[v % 32] |= (uint8_t)(1u << (v / 32));
        low[v] = (uint8_t)(L[v] & 3);
    }
    pack_2bit(low, y + 32);
}

void kiln_quant_q3_k_quantize(const float *src, kiln_qtensor *t)
{
    size_t nb = kiln_quant_blocks(t, QK_K);
    for (size_t b = 0; b < nb; b++)
        q3_k_quantize_block(src + b * QK_K, (uint8_t *)t->data + b * Q3_K_BYTES);
}

void kiln_quant_q3_k_dequantize(const kiln_qtensor *t, float *dst)
{
    size_t nb = kiln_quant_blocks(t, QK_K);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *y = (const uint8_t *)t->data + b * Q3_K_BYTES;
        const float d = kiln_quant_load_f16(y + 108);
        float *out = dst + b * QK_K;
        for (int j = 0; j < QK_K / 16; j++) {
            const float dl = d * (kiln_quant_q3_k_scale(j, y + 96) - 32);
            for (int i = 0; i < 16; i++) {
                const int v = 16 * j + i;
                const int q = level_2bit(y + 32, v) - ((y[v % 32] >> (v / 32)) & 1 ? 0 : 4);
                out[v] = dl * q;
            }
        }
    }
}
