/* The load-time check of a model's values: a NaN or an infinity in a scale,
 * a global scale, a norm weight, a bias, a scalar (input_scale) or
 * rms_norm_eps reaches every output
 * it touches, so a file holding one is refused naming the first, unless the
 * caller allows it (kiln_model_options.allow_nonfinite). The weights' own
 * elements are not read: a scale multiplies a whole block of them. */
#include "model_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Where the f16 scales of a GGML block lie (ggml-common.h): their byte
 * offsets in the block, up to two (d, and dmin where the type has one). */
static const struct {
    kiln_format fmt;
    int n, at[2];
} ggml_scales[] = {
    { KILN_FMT_Q8_0, 1, { 0 } },
    { KILN_FMT_Q4_0, 1, { 0 } },
    { KILN_FMT_Q4_K, 2, { 0, 2 } },
    { KILN_FMT_Q6_K, 1, { 208 } },
    { KILN_FMT_Q5_0, 1, { 0 } },
    { KILN_FMT_Q5_1, 2, { 0, 2 } },
    { KILN_FMT_Q2_K, 2, { 80, 82 } },
    { KILN_FMT_Q3_K, 1, { 108 } },
    { KILN_FMT_Q5_K, 2, { 0, 2 } },
    { KILN_FMT_IQ4_NL, 1, { 0 } },
    { KILN_FMT_IQ4_XS, 1, { 0 } },
    { KILN_FMT_Q4_1, 2, { 0, 2 } },
};

static int f16_finite(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return (h & 0x7C00) != 0x7C00;
}

static float elem_f32(kiln_format fmt, const uint8_t *p, int64_t i)
{
    if (fmt == KILN_FMT_F32) {
        float f;
        memcpy(&f, p + 4 * i, sizeof f);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, sizeof h);
    return fmt == KILN_FMT_BF16 ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h);
}

static kiln_status check_fail(const kiln_model *m, const kiln_model_tensor *t, const char *what,
                              int64_t index, float v)
{
    return kiln_fail(KILN_ERR_MALFORMED,
                     "%s: tensor %s: %s %lld is %s (--allow-nonfinite skips this check)", m->path,
                     t->name, what, (long long)index, isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf");
}

/* The first of n bytes with (b & mask) == mask, or n: the non-finite codes
 * of E4M3 (NaN: x1111111, mask 0x7F) and E8M0 (NaN: 0xFF, mask 0xFF). A
 * 4-bit model carries hundreds of MB of scales, so eight bytes are tested
 * at once: in ~(w | ~mask) such a byte is zero, and (v - 0x01..) & ~v &
 * 0x80.. is nonzero exactly when some byte of v is. */
static size_t first_byte(const uint8_t *s, size_t n, uint8_t mask)
{
    const uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
    const uint64_t fill = ones * (uint8_t)~mask;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, sizeof w);
        uint64_t v = ~(w | fill);
        if ((v - ones) & ~v & highs)
            break;
    }
    for (; i < n; i++)
        if ((s[i] & mask) == mask)
            return i;
    return n;
}

/* The first of n f32 values whose exponent is all ones (inf or NaN), or n. */
static size_t first_nonfinite_f32(const uint8_t *s, size_t n)
{
    for (size_t at = 0; at < n; at += 1024) {
        size_t end = n - at < 1024 ? n : at + 1024;
        unsigned bad = 0;
        for (size_t i = at; i < end; i++) {
            uint32_t u;
            memcpy(&u, s + 4 * i, sizeof u);
            bad |= (u & 0x7F800000u) == 0x7F800000u;
        }
        if (bad)
            for (size_t i = at; i < end; i++)
                if (!isfinite(elem_f32(KILN_FMT_F32, s, (int64_t)i)))
                    return i;
    }
    return n;
}

static kiln_status check_scales(const kiln_model *m, const kiln_model_tensor *t)
{
    const kiln_qtensor *q = &t->qt;
    const kiln_format_info *fi = kiln_format_get(q->format);
    size_t bytes = 0;
    if (fi->has_global_scale && !isfinite(q->global_scale))
        return check_fail(m, t, "global scale", 0, q->global_scale);
    if (fi->scale_type != KILN_SCALE_NONE && q->scale &&
        kiln_qtensor_scale_bytes(q, &bytes) == KILN_OK) {
        const uint8_t *s = q->scale;
        /* Zero points (one byte per scale) follow the scales: not scales. */
        size_t n = bytes / ((fi->scale_type == KILN_SCALE_F32 ? 4 : 1) + (fi->zero_point ? 1 : 0));
        size_t i = fi->scale_type == KILN_SCALE_F32    ? first_nonfinite_f32(s, n)
                   : fi->scale_type == KILN_SCALE_E8M0 ? first_byte(s, n, 0xFF)
                                                       : first_byte(s, n, 0x7F);
        if (i < n) {
            float v = fi->scale_type == KILN_SCALE_F32    ? elem_f32(KILN_FMT_F32, s, (int64_t)i)
                      : fi->scale_type == KILN_SCALE_E8M0 ? kiln_e8m0_to_f32(s[i])
                                                          : kiln_e4m3_to_f32(s[i]);
            return check_fail(m, t, "scale", (int64_t)i, v);
        }
    }
    for (size_t g = 0; g < KILN_ARRAY_LEN(ggml_scales); g++) {
        if (ggml_scales[g].fmt != q->format)
            continue;
        int64_t blocks = q->n * (q->k / fi->block);
        const uint8_t *d = q->data;
        for (int64_t b = 0; b < blocks; b++)
            for (int j = 0; j < ggml_scales[g].n; j++) {
                const uint8_t *p = d + b * fi->block_bytes + ggml_scales[g].at[j];
                if (!f16_finite(p))
                    return check_fail(m, t, j ? "block min scale (dmin) of block" :
                                      "block scale (d) of block", b, kiln_f16_to_f32(
                                          (uint16_t)(p[0] | p[1] << 8)));
            }
    }
    return KILN_OK;
}

kiln_status kiln_model_check_values(const kiln_model *m)
{
    const kiln_model_hparams *hp = &m->hp;
    if (hp->has_rms_eps && !(isfinite(hp->rms_eps) && hp->rms_eps >= 0))
        return kiln_fail(KILN_ERR_MALFORMED,
                         "%s: rms_norm_eps is %g, not a finite non-negative number "
                         "(--allow-nonfinite skips this check)", m->path, hp->rms_eps);
    for (int i = 0; i < m->n_tensors; i++) {
        const kiln_model_tensor *t = &m->tensors[i];
        if (!t->supported)
            continue;
        kiln_status st = check_scales(m, t);
        if (st)
            return st;
        kiln_format f = t->qt.format;
        if (t->n_dims > 1 || (f != KILN_FMT_F32 && f != KILN_FMT_F16 && f != KILN_FMT_BF16))
            continue;
        for (int64_t e = 0; e < t->qt.n * t->qt.k; e++) {
            float v = elem_f32(f, t->qt.data, e);
            if (!isfinite(v))
                return check_fail(m, t, "element", e, v);
        }
    }
    return KILN_OK;
}
