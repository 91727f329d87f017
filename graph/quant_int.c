/* The integer group formats of compressed-tensors' pack-quantized
 * checkpoints (W4A16 and W8A16, GPTQ and AWQ style): CPU reference
 * quantization and dequantization.
 *
 * Codes are stored as compressed-tensors' pack_to_int32 writes them: the
 * signed code q in [-2^(b-1), 2^(b-1) - 1] plus 2^(b-1), an unsigned b-bit
 * field; element k of a row sits at bit b * k of the row read as one
 * little-endian bit string, which for b = 4 and 8 is bits 4 (k % 8) of word
 * k / 8, and byte k. A weight's scales are f32 [N, K / group] (one column
 * when the group is 0), then, for the _zp formats, int8 zero points in the
 * same order. w = (q - zp) * s, one f32 multiplication: q - zp is an
 * integer of at most 9 bits, so with a BF16 or F16 scale (what checkpoints
 * ship) the product is exact, the value compressed-tensors' dequantize
 * forms in the scale's dtype before that dtype rounds it; with an f32
 * scale it is rounded once, as compressed-tensors rounds it in f32.
 *
 * The quantizer is compressed-tensors' min-max observer and quantize, in
 * f32: symmetric s = max|x| / ((2^b - 1) / 2), zp = 0; asymmetric
 * s = (max(x, 0) - min(x, 0)) / (2^b - 1), zp = round(clamp(q_min - min / s));
 * a zero scale becomes f32's epsilon; q = round(clamp(x / s + zp, q_min,
 * q_max)), rounding half to even as torch.round does. A NaN element gets
 * the code of zero, q = zp. */
#include "core.h"
#include "graph/quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

typedef struct int_layout {
    int bits;
    int zero_point;
    int64_t group;  /* values per scale along K, never 0 here */
    int64_t groups; /* scales per row */
} int_layout;

static int_layout layout_of(const kiln_qtensor *t)
{
    const kiln_format_info *fi = kiln_format_get(t->format);
    int_layout l = {
        .bits = fi->block == 8 ? 4 : 8,
        .zero_point = fi->zero_point,
        .group = t->group ? t->group : t->k,
    };
    l.groups = t->k / l.group;
    return l;
}

static uint8_t *zero_points(const kiln_qtensor *t, const int_layout *l)
{
    return (uint8_t *)t->scale + (size_t)t->n * (size_t)l->groups * sizeof(float);
}

static int code_at(const uint8_t *row, int bits, int64_t k)
{
    if (bits == 8)
        return (int)row[k] - 128;
    return (int)((row[k / 2] >> (4 * (k & 1))) & 0xF) - 8;
}

static void code_put(uint8_t *row, int bits, int64_t k, int q)
{
    if (bits == 8) {
        row[k] = (uint8_t)(q + 128);
        return;
    }
    uint8_t *b = &row[k / 2];
    int shift = 4 * (int)(k & 1);
    *b = (uint8_t)((*b & ~(0xF << shift)) | ((q + 8) << shift));
}

static float clampf(float x, float lo, float hi) { return x < lo ? lo : x > hi ? hi : x; }

void kiln_quant_int_group_quantize(const float *src, kiln_qtensor *t)
{
    int_layout l = layout_of(t);
    float q_min = -(float)(1 << (l.bits - 1)), q_max = (float)((1 << (l.bits - 1)) - 1);
    float range = q_max - q_min;
    size_t row_bytes = (size_t)t->k * (size_t)l.bits / 8;
    for (int64_t n = 0; n < t->n; n++) {
        uint8_t *row = (uint8_t *)t->data + (size_t)n * row_bytes;
        for (int64_t g = 0; g < l.groups; g++) {
            const float *x = src + n * t->k + g * l.group;
            float mn = 0.0f, mx = 0.0f;
            for (int64_t i = 0; i < l.group; i++) {
                if (x[i] < mn)
                    mn = x[i];
                if (x[i] > mx)
                    mx = x[i];
            }
            float s, zp = 0.0f;
            if (l.zero_point) {
                s = (mx - mn) / range;
                if (s == 0.0f)
                    s = FLT_EPSILON;
                zp = nearbyintf(clampf(q_min - mn / s, q_min, q_max));
                if (isnan(zp)) /* an infinite range: inf / inf */
                    zp = 0.0f;
            } else {
                float amax = -mn > mx ? -mn : mx;
                s = amax / (range / 2.0f);
                if (s == 0.0f)
                    s = FLT_EPSILON;
            }
            size_t si = (size_t)n * (size_t)l.groups + (size_t)g;
            memcpy((uint8_t *)t->scale + si * sizeof s, &s, sizeof s);
            if (l.zero_point)
                zero_points(t, &l)[si] = (uint8_t)(int8_t)zp;
            for (int64_t i = 0; i < l.group; i++) {
                float v = x[i] / s + zp;
                int q = isnan(v) ? (int)zp : (int)nearbyintf(clampf(v, q_min, q_max));
                code_put(row, l.bits, g * l.group + i, q);
            }
        }
    }
}

void kiln_quant_int_group_dequantize(const kiln_qtensor *t, float *dst)
{
    int_layout l = layout_of(t);
    size_t row_bytes = (size_t)t->k * (size_t)l.bits / 8;
    for (int64_t n = 0; n < t->n; n++) {
        const uint8_t *row = (const uint8_t *)t->data + (size_t)n * row_bytes;
        for (int64_t g = 0; g < l.groups; g++) {
            size_t si = (size_t)n * (size_t)l.groups + (size_t)g;
            float s;
            memcpy(&s, (const uint8_t *)t->scale + si * sizeof s, sizeof s);
            int zp = l.zero_point ? (int)(int8_t)zero_points(t, &l)[si] : 0;
            for (int64_t i = 0; i < l.group; i++) {
                int64_t k = g * l.group + i;
                dst[n * t->k + k] = (float)(code_at(row, l.bits, k) - zp) * s;
            }
        }
    }
}
