/* The GGML block formats: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K and GGML
 * MXFP4 (Q2_K and Q3_K are in quant_q2k_q3k.c, IQ4_NL and IQ4_XS in
 * quant_iq4.c).
 *
 * Quantization follows ggml's quantize_row_*_ref (ggml-quants.c) operation
 * for operation in f32, in the same order, so that a file written by kiln
 * is byte-identical to one written by ggml / gguf-py (the oracle test checks
 * Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and MXFP4 against gguf-py). Dequantization follows
 * dequantize_row_* and is bit-identical for every block, including the
 * product order (d * sc) * q where ggml has it.
 *
 * Blocks are addressed by byte offset, not through structs, so the layout
 * is exactly FORMATS.md's with no padding assumptions, and f16 fields are
 * read little-endian. A tensor is a run of independent blocks in row-major
 * order (K is a multiple of the block), so each function walks blocks.
 *
 * ggml leaves some inputs undefined (float-to-integer conversions out of
 * range for NaN, ±inf or extreme ratios). Here they are clamped instead;
 * for finite, non-degenerate inputs the results are ggml's. */
#include "core.h"
#include "graph/quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

enum { QK = KILN_QK, QK_K = KILN_QK_K };
enum {
    Q8_0_BYTES = 34, Q4_0_BYTES = 18, Q4_1_BYTES = 20, Q5_0_BYTES = 22, Q5_1_BYTES = 24, Q4_K_BYTES = 144,
    Q5_K_BYTES = 176, Q6_K_BYTES = 210, MXFP4_BYTES = 17
};

/* A stored byte read as two's-complement int8 without an
 * implementation-defined conversion. */
static int as_i8(uint8_t b) { return (int)b - ((b & 0x80) << 1); }

/* --------------------------------------------------------------- Q8_0 */

/* d = amax / 127, q = roundf(x / d) computed as x * (1 / d), half away from
 * zero; the stored d is f16(d) while q used the unrounded d. */
void kiln_quant_q8_0_quantize(const float *src, kiln_qtensor *t)
{
    size_t nb = kiln_quant_blocks(t, QK);
    for (size_t b = 0; b < nb; b++) {
        const float *x = src + b * QK;
        uint8_t *y = (uint8_t *)t->data + b * Q8_0_BYTES;
        float amax = 0.0f;
        for (int j = 0; j < QK; j++)
            amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
        const float d = amax / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        kiln_quant_store_f16(y, d);
        for (int j = 0; j < QK; j++) {
            float r = roundf(x[j] * id);
            int q = r == r ? (r > 127.0f ? 127 : r < -128.0f ? -128 : (int)r) : 0;
            y[2 + j] = (uint8_t)(q & 0xFF);
        }
    }
}

void kiln_quant_q8_0_dequantize(const kiln_qtensor *t, float *dst)
{
    size_t nb = kiln_quant_blocks(t, QK);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *y = (const uint8_t *)t->data + b * Q8_0_BYTES;
        const float d = kiln_quant_load_f16(y);
        for (int j = 0; j < QK; j++)
            dst[b * QK + j] = (float)as_i8(y[2 + j]) * d;
    }
}

/* --------------------------------------------------------------- Q4_0 */

/* The symmetric fit of Q4_0 and Q5_0 over a block of QK: d = max / -half
 * where max is the signed element of largest magnitude (the first one on
 * ties), so that element maps to level 0 exactly; f16 d stored at y. The
 * result is 1 / d (0 for a block of zeros). */
static float sym_fit(const float *x, int half, uint8_t *y)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    const float d = max / (float)-half;
    kiln_quant_store_f16(y, d);
    return d != 0.0f ? 1.0f / d : 0.0f;
}

/* sym_fit on 16 levels: the other side reaches q = 16 and is clipped to
 * 15. q = min(15, trunc(x / d + 8.5)). Element j < 16 is the low nibble of
 * qs[j], element j + 16 its high one. */
void kiln_quant_q4_0_quantize(const float *src, kiln_qtensor *t)
{
    size_t nb = kiln_quant_blocks(t, QK);
    for (size_t b = 0; b < nb; b++) {
        const float *x = src + b * QK;
        uint8_t *y = (uint8_t *)t->data + b * Q4_0_BYTES;
        const float id = sym_fit(x, 8, y);
        for (int j = 0; j < QK / 2; j++) {
            uint8_t q[2];
            for (int h = 0; h < 2; h++) {
                float v = x[j + h * QK / 2] * id + 8.5f;
                q[h] = (uint8_t)(v >= 15.0f ? 15 : v > 0.0f ? (int)v : 0);
            }
            y[2 + j] = (uint8_t)(q[0] | (q[1] << 4));
        }
    }
}

void kiln_quant_q4_0_dequantize(const kiln_qtensor *t, float *dst)
{
    size_t nb = kiln_quant_blocks(t, QK);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *y = (const uint8_t *)t->data + b * Q4_0_BYTES;
        const float d = kiln_quant_load_f16(y);
        for (int j = 0; j < QK / 2; j++) {
            dst[b * QK + j] = (float)((y[2 + j] & 0x0F) - 8) * d;
            dst[b * QK + j + QK / 2] = (float)((y[2 + j] >> 4) - 8) * d;
        }
    }
}

/* --------------------------------------------------------------- Q4_1 */

/* The affine fit of Q4_1 and Q5_1 over a block of QK: d = (max - min) /
 * top, m = min, stored as f16 d at y and f16 m at y + 2; *min gets m
 * unrounded, and the result is 1 / d (0 for a constant block). */
static float affine_fit(const float *x, int top, uint8_t *y, float *min)
{
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < QK; j++) {
        if (x[j] < lo)
            lo = x[j];
        if (x[j] > hi)
            hi = x[j];
    }
    const float d = (hi - lo) / (float)top;
    kiln_quant_store_f16(y, d);
    kiln_quant_store_f16(y + 2, lo);
    *min = lo;
    return d != 0.0f ? 1.0f / d : 0.0f;
}

/* An affine fit on 16 levels: f16 d at 0, f16 m at 2, qs[16] at 4 (nibbles
 * as Q4_0). d = (max - min) / 15, m = min, q = trunc((x - min) / d + 0.5)
 * clamped to 15 (ggml's MIN(15, (int8_t)v); v >= 0 for finite input, and
 * NaN gives 0 here), y = d * q + m. */
void kiln_quant_q4_1_quantize(const float *src, kiln_qtensor *t)
{
    size_t nb = kiln_quant_blocks(t, QK);
    for (size_t b = 0; b < nb; b++) {
        const float *x = src + b * QK;
        uint8_t *y = (uint8_t *)t->data + b * Q4_1_BYTES;
        float min, id = affine_fit(x, 15, y, &min);
        for (int j = 0; j < QK / 2; j++) {
            uint8_t q[2];
            for (int h = 0; h < 2; h++) {
                float v = (x[j + h * QK / 2] - min) * id + 0.5f;
                q[h] = (uint8_t)(v >= 15.0f ? 15 : v > 0.0f ? (int)v : 0);
            }
            y[4 + j] = (uint8_t)(q[0] | (q[1] << 4));
        }
    }
}

void kiln_quant_q4_1_dequantize(const kiln_qtensor *t, float *dst)
{
    size_t nb = kiln_quant_blocks(t, QK);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *y = (const uint8_t *)t->data + b * Q4_1_BYTES;
        const float d = kiln_quant_load_f16(y), m = kiln_quant_load_f16(y + 2);
        for (int j = 0; j < QK / 2; j++) {
            dst[b * QK + j] = (float)(y[4 + j] & 0x0F) * d + m;
            dst[b * QK + j + QK / 2] = (float)(y[4 + j] >> 4) * d + m;
        }
    }
}

/* --------------------------------------------------------- Q5_0, Q5_1 */

/* Q5_0: f16 d at 0, qh[4] at 2 (one little-endian u32), qs[16] at 6;
 * Q5_1 puts f16 m at 2 and shifts the rest by 2. Element j < 16 is the low
 * nibble of qs[j] and element j + 16 its high nibble, as Q4_0; the fifth
 * bit of element j is bit j of qh. */
static uint32_t load_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void pack_5bit(const uint8_t *q, uint8_t *qh, uint8_t *qs)
{
    uint32_t h = 0;
    for (int j = 0; j < QK / 2; j++) {
        qs[j] = (uint8_t)((q[j] & 0xF) | ((q[j + QK / 2] & 0xF) << 4));
        h |= (uint32_t)(q[j] >> 4) << j | (uint32_t)(q[j + QK / 2] >> 4) << (j + QK / 2);
    }
    for (int i = 0; i < 4; i++)
        qh[i] = (uint8_t)(h >> (8 * i));
}

/* The level of element j from qh (as a u32) and qs. */
static int level_5bit(uint32_t h, const uint8_t *qs, int j)
{
    const int nib = j < QK / 2 ? qs[j] & 0xF : qs[j - QK / 2] >> 4;
    return nib | (int)((h >> j) & 1) << 4;
}

/* Truncation of v to a level in [0, 31], ggml's MIN(31, (int8_t)v) for the
 * v >= 0 its scales give; NaN and negative v give 0. */
static uint8_t trunc_level(float v) { return (uint8_t)(v >= 31.0f ? 31 : v > 0.0f ? (int)v : 0); }

/* sym_fit on 32 levels: d = max / -16, q = min(31, trunc(x / d + 16.5)),
 * y = d * (q - 16). */
void kiln_quant_q5_0_quantize(const float *src, kiln_qtensor *t)
{
    size_t nb = kiln_quant_blocks(t, QK);
    for (size_t b = 0; b < nb; b++) {
        const float *x = src + b * QK;
        uint8_t *y = (uint8_t *)t->data + b * Q5_0_BYTES;
        const float id = sym_fit(x, 16, y);
        uint8_t q[QK];
        for (int j = 0; j < QK; j++)
            q[j] = trunc_level(x[j] * id + 16.5f);
        pack_5bit(q, y + 2, y + 6);
    }
}

void kiln_quant_q5_0_dequantize(const kiln_qtensor *t, float *dst)
{
    size_t nb = kiln_quant_blocks(t, QK);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *y = (const uint8_t *)t->data + b * Q5_0_BYTES;
        const float d = kiln_quant_load_f16(y);
        const uint32_t h = load_u32(y + 2);
        for (int j = 0; j < QK; j++)
            dst[b * QK + j] = (float)(level_5bit(h, y + 6, j) - 16) * d;
    }
}

/* An affine fit: d = (max - min) / 31, m = min, q = trunc((x - min) / d +
 * 0.5) clamped to 31 (gguf-py clips, ggml's ref never exceeds it for
 * finite input), y = d * q + m. */
void kiln_quant_q5_1_quantize(const float *src, kiln_qtensor *t)
{
    size_t nb = kiln_quant_blocks(t, QK);
    for (size_t b = 0; b < nb; b++) {
        const float *x = src + b * QK;
        uint8_t *y = (uint8_t *)t->data + b * Q5_1_BYTES;
        float min, id = affine_fit(x, 31, y, &min);
        uint8_t q[QK];
        for (int j = 0; j < QK; j++)
            q[j] = trunc_level((x[j] - min) * id + 0.5f);
        pack_5bit(q, y + 4, y + 8);
    }
}

void kiln_quant_q5_1_dequantize(const kiln_qtensor *t, float *dst)
{
    size_t nb = kiln_quant_blocks(t, QK);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *y = (const uint8_t *)t->data + b * Q5_1_BYTES;
        const float d = kiln_quant_load_f16(y), m = kiln_quant_load_f16(y + 2);
        const uint32_t h = load_u32(y + 4);
        for (int j = 0; j < QK; j++)
            dst[b * QK + j] = (float)level_5bit(h, y + 8, j) * d + m;
    }
}

/* ---------------------------------------------------------- GGML MXFP4 */

/* E2M1 values doubled, the table ggml indexes with a nibble. */
static const int8_t mxfp4_kvalues[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };

/* ggml's half scale 2^(e-128): doubling the E2M1 table and halving the
 * scale keeps every product exact, and e = 0xFF is 2^127, not NaN. */
static float e8m0_half(uint8_t e)
{
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The code whose value is nearest to x; the first in table order on ties,
 * which sends ties toward the smaller magnitude, and NaN to code 0. */
static uint8_t mxfp4_best_index(float x, float d)
{
    int best = 0;
    float best_err = fabsf(mxfp4_kvalues[0] * d - x);
    for (int i = 1; i < 16; i++) {
        float err = fabsf(mxfp4_kvalues[i] * d - x);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return (uint8_t)best;
}

/* e = floor(log2f(amax)) - 2 + 127 with ggml's log2f, not the exact
 * exponent: for amax just below a power of two log2f may round up, and the
 * code must be ggml's. Out of the E8M0 range (amax < 2^-125 or ±inf, where
 * ggml's conversion is undefined) the code is clamped to [0, 254]. */
static uint8_t mxfp4_scale_code(float amax)
{
    if (!(amax > 0.0f))
        return 0;
    float e = floorf(log2f(amax)) - 2 + 127;
    return (uint8_t)(e < 0.0f ? 0 : e > 254.0f ? 254 : (int)e);
}

void kiln_quant_ggml_mxfp4_quantize(const float *src, kiln_qtensor *t)
{
    size_t nb = kiln_quant_blocks(t, QK);
    for (size_t b = 0; b < nb; b++) {
        const float *x = src + b * QK;
        uint8_t *y = (uint8_t *)t->data + b * MXFP4_BYTES;
        float amax = 0.0f;
        for (int j = 0; j < QK; j++)
            if (amax < fabsf(x[j]))
                amax = fabsf(x[j]);
        y[0] = mxfp4_scale_code(amax);
        const float d = e8m0_half(y[0]);
        for (int j = 0; j < QK / 2; j++)
            y[1 + j] = (uint8_t)(mxfp4_best_index(x[j], d) | (mxfp4_best_index(x[j + QK / 2], d) << 4));
    }
}

void kiln_quant_ggml_mxfp4_dequantize(const kiln_qtensor *t, float *dst)
{
    size_t nb = kiln_quant_blocks(t, QK);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *y = (const uint8_t *)t->data + b * MXFP4_BYTES;
        const float d = e8m0_half(y[0]);
        for (int j = 0; j < QK / 2; j++) {
            dst[b * QK + j] = mxfp4_kvalues[y[1 + j] & 0x0F] * d;
            dst[b * QK + j + QK / 2] = mxfp4_kvalues[y[1 + j] >> 4] * d;
        }
    }
}

/* --------------------------------------------------------------- Q4_K */

/* Q4_K layout: f16 d at 0, f16 dmin at 2, 12 bytes of packed 6-bit scales
 * and mins at 4, 128 bytes of nibbles at 16. Sub-block j < 4 keeps its
 * scale and min in the low 6 bits of bytes j and j + 4; sub-block j >= 4
 * splits them: low 4 bits in the nibbles of byte j + 4, high 2 bits in the
 * top bits of bytes j - 4 (scale) and j (min). */
void kiln_quant_q4_k_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

float kiln_quant_fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min,
                               uint8_t *Laux, float rmin, float rdelta, int nstep, int use_mad)
{
    float min = x[0], max = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min)
            min = x[i];
        if (x[i] > max)
            max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0)
        min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.0f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)kiln_quant_clamp(kiln_quant_nearest_int(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * L[i] + min - x[i];
        best_error += w[i] * (use_mad ? fabsf(diff) : diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = kiln_quant_clamp(kiln_quant_nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                cur_error += w[i] * (use_mad ? fabsf(diff) : diff * diff);
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* What Q4_K and Q5_K share: eight sub-blocks of 32 fitted with levels in
 * [0, nmax] (make_qkx2_quants with ggml's rmin and nstep for the format),
 * f16 d and dmin at y, the 6-bit scales and mins packed at y + 4, and the
 * levels L requantized against the scales as stored (f16, 6 bits). A
 * sub-block whose stored scale is 0 keeps the fit's levels: they
 * dequantize to -dmin * m whatever they are. */
static void k_scale_min_block(const float *x, int nmax, float rmin, int nstep, uint8_t *y, uint8_t *L)
{
    uint8_t Laux[32];
    float weights[32], mins[QK_K / 32], scales[QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++)
            sum_x2 += xs[l] * xs[l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++)
            weights[l] = av_x + fabsf(xs[l]);
        scales[j] = kiln_quant_fit_scale_min(32, nmax, xs, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f,
                                             nstep, 0);
        if (scales[j] > max_scale)
            max_scale = scales[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }

    uint8_t *s = y + 4;
    memset(s, 0, 12);
    float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    for (int j = 0; j < QK_K / 32; j++) {
        /* ggml stores nearest_int into a uint8_t before clamping: a negative
         * fit wraps modulo 256 and then clamps to 63, and so does this. */
        uint8_t ls = (uint8_t)kiln_quant_nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)kiln_quant_nearest_int(inv_min * mins[j]);
        ls = ls < 63 ? ls : 63;
        lm = lm < 63 ? lm : 63;
        if (j < 4) {
            s[j] = ls;
            s[j + 4] = lm;
        } else {
            s[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            s[j - 4] |= (uint8_t)((ls >> 4) << 6);
            s[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    kiln_quant_store_f16(y, max_scale / 63.0f);
    kiln_quant_store_f16(y + 2, max_min / 63.0f);

    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        kiln_quant_q4_k_scale_min(j, s, &sc, &m);
        const float d = kiln_quant_load_f16(y) * sc;
        if (d == 0.0f)
            continue;
        const float dm = kiln_quant_load_f16(y + 2) * m;
        for (int i = 0; i < 32; i++)
            L[32 * j + i] = (uint8_t)kiln_quant_clamp(kiln_quant_nearest_int((x[32 * j + i] + dm) / d), 0, nmax);
    }
}

static void q4_k_quantize_block(const float *x, uint8_t *y)
{
    uint8_t L[QK_K];
    k_scale_min_block(x, 15, -1.0f, 20, y, L);
    uint8_t *q = y + 16;
    for (int j = 0; j < QK_K; j += 64, q += 32)
        for (int l = 0; l < 32; l++)
            q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
}

void kiln_quant_q4_k_quantize(const float *src, kiln_qtensor *t)
{
    size_t nb = kiln_quant_blocks(t, QK_K);
    for (size_t b = 0; b < nb; b++)
        q4_k_quantize_block(src + b * QK_K, (uint8_t *)t->data + b * Q4_K_BYTES);
}

/* Each 64 values use 32 bytes of qs: low nibbles are the first 32
 * (sub-block 2c), high nibbles the next 32 (sub-block 2c + 1). */
void kiln_quant_q4_k_dequantize(const kiln_qtensor *t, float *dst)
{
    size_t nb = kiln_quant_blocks(t, QK_K);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *y = (const uint8_t *)t->data + b * Q4_K_BYTES;
        const float d = kiln_quant_load_f16(y), dmin = kiln_quant_load_f16(y + 2);
        const uint8_t *q = y + 16;
        float *out = dst + b * QK_K;
        for (int c = 0; c < 4; c++, q += 32, out += 64) {
            uint8_t sc, m;
            kiln_quant_q4_k_scale_min(2 * c, y + 4, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            kiln_quant_q4_k_scale_min(2 * c + 1, y + 4, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++)
                out[l] = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++)
                out[32 + l] = d2 * (q[l] >> 4) - m2;
        }
    }
}

/* --------------------------------------------------------------- Q5_K */

/* Q5_K layout: f16 d at 0, f16 dmin at 2, the 12 bytes of Q4_K's scales
 * and mins at 4, qh[32] at 16, qs[128] at 48. Value v of chunk c = v / 64
 * (sub-block g = v / 32) takes its low 4 bits from qs[32c + v % 32] (low
 * nibble for even g, high for odd) and its fifth bit from bit g of
 * qh[v % 32]. y = (d * sc) * q - dmin * m, q in [0, 31]. */
static void q5_k_quantize_block(const float *x, uint8_t *y)
{
    uint8_t L[QK_K];
    k_scale_min_block(x, 31, -0.5f, 15, y, L);
    uint8_t *qh = y + 16, *ql = y + 48;
    memset(qh, 0, 32);
    for (int c = 0; c < 4; c++, ql += 32) {
        for (int l = 0; l < 32; l++) {
            const int l1 = L[64 * c + l], l2 = L[64 * c + l + 32];
            qh[l] |= (uint8_t)(((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1)));
            ql[l] = (uint8_t)((l1 & 0xF) | ((l2 & 0xF) << 4));
        }
    }
}

void kiln_quant_q5_k_quantize(const float *src, kiln_qtensor *t)
{
    size_t nb = kiln_quant_blocks(t, QK_K);
    for (size_t b = 0; b < nb; b++)
        q5_k_quantize_block(src + b * QK_K, (uint8_t *)t->data + b * Q5_K_BYTES);
}

void kiln_quant_q5_k_dequantize(const kiln_qtensor *t, float *dst)
{
    size_t nb = kiln_quant_blocks(t, QK_K);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *y = (const uint8_t *)t->data + b * Q5_K_BYTES;
        const float d = kiln_quant_load_f16(y), dmin = kiln_quant_load_f16(y + 2);
        const uint8_t *qh = y + 16, *ql = y + 48;
        float *out = dst + b * QK_K;
        for (int c = 0; c < 4; c++, ql += 32, out += 64) {
            uint8_t sc, m;
            kiln_quant_q4_k_scale_min(2 * c, y + 4, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            kiln_quant_q4_k_scale_min(2 * c + 1, y + 4, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++)
                out[l] = d1 * ((ql[l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4)) - m1;
            for (int l = 0; l < 32; l++)
                out[32 + l] = d2 * ((ql[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4)) - m2;
        }
    }
}

/* --------------------------------------------------------------- Q6_K */

/* ggml's make_qx_quants with rmse_type 1 and no importance weights: a
 * symmetric fit x ≈ scale * (L - nmax), L in [0, 2 nmax - 1], weighted by
 * x², trying 18 inverse scales around -nmax / max (max: the signed element
 * of largest magnitude). */
static float fit_scale_symmetric(int n, int nmax, const float *x, int8_t *L)
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
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = kiln_quant_clamp(kiln_quant_nearest_int(iscale * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + kiln_quant_clamp(kiln_quant_nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q6_K layout: ql[128] at 0, qh[64] at 128, int8 scales[16] at 192, f16 d at
 * 208. Per 128 values (two halves), with l < 32: ql[l] holds the low
 * nibbles of values l (low) and l + 64 (high), ql[l + 32] those of l + 32
 * and l + 96, and qh[l] their top two bits in the order l, l+32, l+64, l+96. */
static void q6_k_quantize_block(const float *x, uint8_t *y)
{
    int8_t L[QK_K];
    float scales[QK_K / 16];
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < QK_K / 16; ib++) {
        scales[ib] = fit_scale_symmetric(16, 32, x + 16 * ib, L + 16 * ib);
        if (fabsf(scales[ib]) > max_abs_scale) {
            max_abs_scale = fabsf(scales[ib]);
            max_scale = scales[ib];
        }
    }
    if (max_abs_scale < KILN_GROUP_MAX_EPS) {
        memset(y, 0, Q6_K_BYTES);
        return;
    }

    int8_t *sc = (int8_t *)(y + 192);
    float iscale = -128.0f / max_scale;
    kiln_quant_store_f16(y + 208, 1 / iscale);
    for (int ib = 0; ib < QK_K / 16; ib++) {
        int l = kiln_quant_nearest_int(iscale * scales[ib]);
        sc[ib] = (int8_t)(l < 127 ? l : 127);
    }

    for (int j = 0; j < QK_K / 16; j++) {
        const float d = kiln_quant_load_f16(y + 208) * sc[j];
        if (d == 0.0f)
            continue;
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (int8_t)(kiln_quant_clamp(kiln_quant_nearest_int(x[16 * j + i] / d), -32, 31) + 32);
    }

    uint8_t *ql = y, *qh = y + 128;
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
        for (int l = 0; l < 32; l++) {
            const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
            ql[l] = (uint8_t)((q1 & 0xF) | ((q3 & 0xF) << 4));
            ql[l + 32] = (uint8_t)((q2 & 0xF) | ((q4 & 0xF) << 4));
            qh[l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
        }
    }
}

void kiln_quant_q6_k_quantize(const float *src, kiln_qtensor *t)
{
    size_t nb = kiln_quant_blocks(t, QK_K);
    for (size_t b = 0; b < nb; b++)
        q6_k_quantize_block(src + b * QK_K, (uint8_t *)t->data + b * Q6_K_BYTES);
}

void kiln_quant_q6_k_dequantize(const kiln_qtensor *t, float *dst)
{
    size_t nb = kiln_quant_blocks(t, QK_K);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *y = (const uint8_t *)t->data + b * Q6_K_BYTES;
        const float d = kiln_quant_load_f16(y + 208);
        const uint8_t *ql = y, *qh = y + 128;
        const int8_t *sc = (const int8_t *)(y + 192);
        float *out = dst + b * QK_K;
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, out += 128) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                out[l] = d * sc[is] * q1;
                out[l + 32] = d * sc[is + 2] * q2;
                out[l + 64] = d * sc[is + 4] * q3;
                out[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}
