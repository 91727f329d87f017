/* graph/quant_int.c: the integer group formats. Codes decode as
 * compressed-tensors packs them, scales and zero points apply per group
 * along K, the quantizer puts every value on its group's grid, and the
 * group itself is checked wherever a size is derived from it. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"
#include "testutil.h"

typedef struct ibuf {
    kiln_qtensor t;
    size_t data_bytes, scale_bytes;
} ibuf;

static ibuf ibuf_new(kiln_format f, int64_t n, int64_t k, int64_t group)
{
    ibuf b = { .t = { .format = f, .n = n, .k = k, .group = group } };
    cr_assert_eq(kiln_format_data_bytes(f, n, k, &b.data_bytes), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_qtensor_scale_bytes(&b.t, &b.scale_bytes), KILN_OK, "%s", kiln_last_error());
    b.t.data = malloc(b.data_bytes);
    b.t.scale = malloc(b.scale_bytes);
    cr_assert(b.t.data && b.t.scale);
    memset(b.t.data, 0xA5, b.data_bytes);
    memset(b.t.scale, 0xA5, b.scale_bytes);
    return b;
}

static void ibuf_free(ibuf *b)
{
    free(b->t.data);
    free(b->t.scale);
}

static float scale_at(const ibuf *b, size_t i)
{
    float s;
    memcpy(&s, (const uint8_t *)b->t.scale + 4 * i, sizeof s);
    return s;
}

static void scale_put(ibuf *b, size_t i, float s) { memcpy((uint8_t *)b->t.scale + 4 * i, &s, sizeof s); }

static int8_t *zero_points(const ibuf *b, int64_t groups)
{
    return (int8_t *)b->t.scale + (size_t)b->t.n * (size_t)groups * 4;
}

/* One int32 word of eight int4 codes, element i at bits 4i, little-endian:
 * compressed-tensors' pack_to_int32 of q = {-8, -7, ..., -1} is
 * 0x76543210, stored 10 32 54 76. */
Test(quant_int, int4_words_decode_as_compressed_tensors_packs_them)
{
    ibuf b = ibuf_new(KILN_FMT_INT4_GROUP, 1, 16, 8);
    const uint8_t words[8] = { 0x10, 0x32, 0x54, 0x76, 0xFE, 0xDC, 0xBA, 0x98 };
    memcpy(b.t.data, words, sizeof words);
    scale_put(&b, 0, 0.5f);
    scale_put(&b, 1, -2.0f);
    float y[16];
    cr_assert_eq(kiln_dequantize(&b.t, y), KILN_OK, "%s", kiln_last_error());
    for (int i = 0; i < 8; i++)
        cr_assert_eq(y[i], 0.5f * (float)(i - 8), "element %d: %g", i, y[i]);
    const int hi[8] = { 14, 15, 12, 13, 10, 11, 8, 9 }; /* 0xFE: low nibble first */
    for (int i = 0; i < 8; i++)
        cr_assert_eq(y[8 + i], -2.0f * (float)(hi[i] - 8), "element %d: %g", 8 + i, y[8 + i]);
    ibuf_free(&b);
}

/* int8: byte k is element k, q + 128; the zero point of each group after
 * the scales, w = (q - zp) * s. */
Test(quant_int, int8_zero_points_follow_the_scales)
{
    ibuf b = ibuf_new(KILN_FMT_INT8_GROUP_ZP, 2, 8, 4);
    const uint8_t codes[16] = { 0, 127, 128, 255, 130, 130, 130, 130,
                                1, 2, 3, 4, 200, 100, 50, 25 };
    memcpy(b.t.data, codes, sizeof codes);
    const float s[4] = { 1.0f, 0.25f, 3.0f, 0.125f };
    const int8_t zp[4] = { 0, 2, -128, 127 };
    for (int i = 0; i < 4; i++)
        scale_put(&b, (size_t)i, s[i]);
    memcpy(zero_points(&b, 2), zp, sizeof zp);
    cr_assert_eq(b.scale_bytes, 4 * 4 + 4);
    float y[16];
    cr_assert_eq(kiln_dequantize(&b.t, y), KILN_OK, "%s", kiln_last_error());
    for (int i = 0; i < 16; i++) {
        int g = i / 4;
        float want = (float)((int)codes[i] - 128 - zp[g]) * s[g];
        cr_assert_eq(y[i], want, "element %d: %g, want %g", i, y[i], want);
    }
    ibuf_free(&b);
}

/* Every value is the nearest point of its group's grid s (q - zp), q in
 * the code range, for groups along K and one group per row, odd N. */
static void round_trip(kiln_format f, int64_t n, int64_t k, int64_t group, uint64_t seed)
{
    const kiln_format_info *fi = kiln_format_get(f);
    int bits = fi->block == 8 ? 4 : 8, half = 1 << (bits - 1);
    int64_t g = group ? group : k, groups = k / g;
    kt_rng rng = kt_rng_new(seed);
    float *x = malloc((size_t)(n * k) * sizeof *x), *y = malloc((size_t)(n * k) * sizeof *y);
    cr_assert(x && y);
    kt_fill_normal(&rng, x, (size_t)(n * k), 0.05f);
    for (int64_t i = 0; i < n * k; i += 37)
        x[i] += 0.3f; /* groups whose range is not centred on zero */
    ibuf b = ibuf_new(f, n, k, group);
    cr_assert_eq(kiln_quantize(x, &b.t), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_dequantize(&b.t, y), KILN_OK, "%s", kiln_last_error());
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < groups; j++) {
            size_t si = (size_t)(r * groups + j);
            double s = scale_at(&b, si), zp = fi->zero_point ? zero_points(&b, groups)[si] : 0;
            cr_assert(s > 0, "%s group %zu: scale %g", fi->name, si, s);
            for (int64_t i = r * k + j * g; i < r * k + (j + 1) * g; i++) {
                double best = INFINITY;
                for (int q = -half; q < half; q++)
                    best = fmin(best, fabs(x[i] - (q - zp) * s));
                cr_assert(fabs((double)y[i] - x[i]) <= best + 1e-6 * (s + fabs(x[i])),
                          "%s group %lld [%lld]: %a -> %a, the grid's nearest is %a away", fi->name,
                          (long long)group, (long long)i, x[i], y[i], best);
            }
        }
    ibuf_free(&b);
    free(x);
    free(y);
}

Test(quant_int, every_value_is_nearest_on_its_group_grid)
{
    static const kiln_format fmts[] = { KILN_FMT_INT4_GROUP, KILN_FMT_INT4_GROUP_ZP,
                                        KILN_FMT_INT8_GROUP, KILN_FMT_INT8_GROUP_ZP };
    static const int64_t groups[] = { 0, 32, 64, 128 };
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
        for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
            round_trip(fmts[f], 13, 256, groups[g], 7 + f * 10 + g);
    round_trip(KILN_FMT_INT4_GROUP_ZP, 3, 24, 8, 99); /* the smallest int4 group */
    round_trip(KILN_FMT_INT8_GROUP, 5, 12, 4, 98);    /* the smallest int8 group */
}

/* The asymmetric grid covers [min, max] of each group, zero included: the
 * ends of a group come back within half a step. */
Test(quant_int, asymmetric_groups_span_their_range)
{
    float x[64];
    for (int i = 0; i < 64; i++)
        x[i] = 1.0f + (float)i / 16.0f; /* all positive: the grid starts at 0 */
    ibuf b = ibuf_new(KILN_FMT_INT4_GROUP_ZP, 1, 64, 32);
    cr_assert_eq(kiln_quantize(x, &b.t), KILN_OK);
    float y[64];
    cr_assert_eq(kiln_dequantize(&b.t, y), KILN_OK);
    for (int j = 0; j < 2; j++) {
        float s = scale_at(&b, (size_t)j);
        cr_assert_eq(zero_points(&b, 2)[j], -8, "group %d: min(x, 0) = 0 sits on code -8", j);
        cr_assert(fabsf(y[32 * j + 31] - x[32 * j + 31]) <= s / 2 * 1.0001f, "group %d", j);
    }
    ibuf_free(&b);
}

/* A group that is not a multiple of the block, does not divide K or is
 * negative is a shape error naming the format, from every entry point. */
Test(quant_int, bad_groups_are_shape_errors_naming_the_format)
{
    static const struct {
        kiln_format f;
        int64_t k, group;
    } bad[] = {
        { KILN_FMT_INT4_GROUP, 64, 12 },   /* not whole words */
        { KILN_FMT_INT4_GROUP_ZP, 96, 64 }, /* does not divide K */
        { KILN_FMT_INT8_GROUP, 64, -4 },
        { KILN_FMT_INT8_GROUP_ZP, 64, 6 },
    };
    uint8_t buf[1024] = { 0 };
    float x[2 * 96] = { 0 }, y[2 * 96];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *name = kiln_format_get(bad[i].f)->name;
        kiln_qtensor t = { .format = bad[i].f, .n = 2, .k = bad[i].k, .data = buf, .scale = buf,
                           .group = bad[i].group };
        size_t bytes;
        cr_assert_eq(kiln_qtensor_scale_bytes(&t, &bytes), KILN_ERR_SHAPE, "%s group %lld", name,
                     (long long)bad[i].group);
        cr_assert(strstr(kiln_last_error(), name), "%s", kiln_last_error());
        cr_assert_eq(kiln_quantize(x, &t), KILN_ERR_SHAPE);
        cr_assert(strstr(kiln_last_error(), "kiln_quantize"), "%s", kiln_last_error());
        cr_assert_eq(kiln_dequantize(&t, y), KILN_ERR_SHAPE);
        kiln_graph *g;
        kiln_tensor *w;
        cr_assert_eq(kiln_graph_create(&g), KILN_OK);
        cr_assert_eq(kiln_graph_weight(g, "w", &t, &w), KILN_ERR_SHAPE);
        cr_assert(strstr(kiln_last_error(), name), "%s", kiln_last_error());
        kiln_graph_destroy(g);
    }
    cr_assert_eq(kiln_qtensor_scale_bytes(NULL, NULL), KILN_ERR_INVALID_ARG);
}

/* Scale bytes: 4 per group, and a byte more with zero points; the group
 * of the other formats is ignored, and kiln_format_scale_bytes is group 0. */
Test(quant_int, scale_bytes_follow_the_group)
{
    kiln_qtensor t = { .format = KILN_FMT_INT4_GROUP, .n = 3, .k = 256, .group = 64 };
    size_t b;
    cr_assert_eq(kiln_qtensor_scale_bytes(&t, &b), KILN_OK);
    cr_assert_eq(b, 3 * 4 * 4);
    t.format = KILN_FMT_INT4_GROUP_ZP;
    cr_assert_eq(kiln_qtensor_scale_bytes(&t, &b), KILN_OK);
    cr_assert_eq(b, 3 * 4 * 5);
    t.group = 0;
    cr_assert_eq(kiln_qtensor_scale_bytes(&t, &b), KILN_OK);
    cr_assert_eq(b, 3 * 5);
    cr_assert_eq(kiln_format_scale_bytes(KILN_FMT_INT8_GROUP_ZP, 3, 256, &b), KILN_OK);
    cr_assert_eq(b, 3 * 5);
    t = (kiln_qtensor){ .format = KILN_FMT_MXFP4, .n = 3, .k = 256, .group = 12 };
    cr_assert_eq(kiln_qtensor_scale_bytes(&t, &b), KILN_OK);
    cr_assert_eq(b, 3 * 8);
    cr_assert_eq(kiln_format_data_bytes(KILN_FMT_INT4_GROUP, 3, 256, &b), KILN_OK);
    cr_assert_eq(b, 3 * 128);
    cr_assert_eq(kiln_format_data_bytes(KILN_FMT_INT8_GROUP, 3, 12, &b), KILN_OK);
    cr_assert_eq(b, 3 * 12);
    cr_assert_eq(kiln_format_data_bytes(KILN_FMT_INT4_GROUP, 3, 12, &b), KILN_ERR_SHAPE,
                 "int4 rows are whole int32 words");
}
