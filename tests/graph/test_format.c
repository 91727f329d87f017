/* The format table and the storage sizes derived from it (graph/format.c). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kiln.h"

/* What FORMATS.md says about each format, written out independently of the
 * table so that a changed row is caught. */
static const struct {
    kiln_format fmt;
    const char *name;
    int block, block_bytes;
    double bits;
    kiln_scale_type scale_type;
    int scale_rows, scale_cols, has_global, gguf_type;
} expect[] = {
    { KILN_FMT_F32, "f32", 1, 4, 32.0, KILN_SCALE_NONE, 0, 0, 0, 0 },
    { KILN_FMT_F16, "f16", 1, 2, 16.0, KILN_SCALE_NONE, 0, 0, 0, 1 },
    { KILN_FMT_BF16, "bf16", 1, 2, 16.0, KILN_SCALE_NONE, 0, 0, 0, 30 },
    { KILN_FMT_FP8_TENSOR, "fp8", 1, 1, 8.0, KILN_SCALE_F32, 0, 0, 0, -1 },
    { KILN_FMT_FP8_CHANNEL, "fp8_channel", 1, 1, 8.0, KILN_SCALE_F32, 1, 0, 0, -1 },
    { KILN_FMT_FP8_BLOCK, "fp8_block", 1, 1, 8.0 + 32.0 / 16384.0, KILN_SCALE_F32, 128, 128, 0, -1 },
    { KILN_FMT_MXFP8, "mxfp8", 32, 32, 8.25, KILN_SCALE_E8M0, 1, 32, 0, -1 },
    { KILN_FMT_NVFP4, "nvfp4", 16, 8, 4.5, KILN_SCALE_UE4M3, 1, 16, 1, -1 },
    { KILN_FMT_MXFP4, "mxfp4", 32, 16, 4.25, KILN_SCALE_E8M0, 1, 32, 0, -1 },
    { KILN_FMT_Q8_0, "q8_0", 32, 34, 8.5, KILN_SCALE_NONE, 0, 0, 0, 8 },
    { KILN_FMT_Q4_0, "q4_0", 32, 18, 4.5, KILN_SCALE_NONE, 0, 0, 0, 2 },
    { KILN_FMT_Q4_K, "q4_k", 256, 144, 4.5, KILN_SCALE_NONE, 0, 0, 0, 12 },
    { KILN_FMT_Q6_K, "q6_k", 256, 210, 6.5625, KILN_SCALE_NONE, 0, 0, 0, 14 },
    { KILN_FMT_GGML_MXFP4, "ggml_mxfp4", 32, 17, 4.25, KILN_SCALE_NONE, 0, 0, 0, 39 },
    { KILN_FMT_Q5_0, "q5_0", 32, 22, 5.5, KILN_SCALE_NONE, 0, 0, 0, 6 },
    { KILN_FMT_Q5_1, "q5_1", 32, 24, 6.0, KILN_SCALE_NONE, 0, 0, 0, 7 },
    { KILN_FMT_Q2_K, "q2_k", 256, 84, 2.625, KILN_SCALE_NONE, 0, 0, 0, 10 },
    { KILN_FMT_Q3_K, "q3_k", 256, 110, 3.4375, KILN_SCALE_NONE, 0, 0, 0, 11 },
    { KILN_FMT_Q5_K, "q5_k", 256, 176, 5.5, KILN_SCALE_NONE, 0, 0, 0, 13 },
    { KILN_FMT_IQ4_NL, "iq4_nl", 32, 18, 4.5, KILN_SCALE_NONE, 0, 0, 0, 20 },
    { KILN_FMT_IQ4_XS, "iq4_xs", 256, 136, 4.25, KILN_SCALE_NONE, 0, 0, 0, 23 },
    { KILN_FMT_Q4_1, "q4_1", 32, 20, 5.0, KILN_SCALE_NONE, 0, 0, 0, 3 },
    { KILN_FMT_INT4_GROUP, "int4_group", 8, 4, 4.0, KILN_SCALE_F32, 1, 0, 0, -1 },
    { KILN_FMT_INT4_GROUP_ZP, "int4_group_zp", 8, 4, 4.0, KILN_SCALE_F32, 1, 0, 0, -1 },
    { KILN_FMT_INT8_GROUP, "int8_group", 4, 4, 8.0, KILN_SCALE_F32, 1, 0, 0, -1 },
    { KILN_FMT_INT8_GROUP_ZP, "int8_group_zp", 4, 4, 8.0, KILN_SCALE_F32, 1, 0, 0, -1 },
};

Test(format, every_row_matches_formats_md)
{
    cr_assert_eq(sizeof expect / sizeof expect[0], KILN_FMT_COUNT, "one expectation per format");
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
        const kiln_format_info *fi = kiln_format_get(expect[i].fmt);
        cr_assert_not_null(fi);
        cr_assert_str_eq(fi->name, expect[i].name);
        cr_assert(fi->desc && fi->desc[0], "%s has a description", fi->name);
        cr_assert(fi->scale_desc && fi->scale_desc[0], "%s describes its scales", fi->name);
        cr_assert_eq(fi->block, expect[i].block, "%s block", fi->name);
        cr_assert_eq(fi->block_bytes, expect[i].block_bytes, "%s block_bytes", fi->name);
        cr_assert_eq(fi->k_multiple, expect[i].block, "%s: K must be a whole number of blocks", fi->name);
        cr_assert_eq(fi->bits_per_weight, expect[i].bits, "%s bits per weight %g", fi->name, fi->bits_per_weight);
        cr_assert_eq(fi->scale_type, expect[i].scale_type, "%s scale type", fi->name);
        cr_assert_eq(fi->scale_rows, expect[i].scale_rows, "%s scale rows", fi->name);
        cr_assert_eq(fi->scale_cols, expect[i].scale_cols, "%s scale cols", fi->name);
        cr_assert_eq(fi->has_global_scale, expect[i].has_global, "%s global scale", fi->name);
        cr_assert_eq(fi->gguf_type, expect[i].gguf_type, "%s gguf type", fi->name);
    }
}

/* bits_per_weight is data plus separate scales, for a large tensor. */
Test(format, bits_per_weight_is_data_plus_scales)
{
    const double scale_bits[] = { [KILN_SCALE_NONE] = 0, [KILN_SCALE_F32] = 32, [KILN_SCALE_E8M0] = 8,
                                  [KILN_SCALE_UE4M3] = 8 };
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        const kiln_format_info *fi = kiln_format_get((kiln_format)f);
        double data = 8.0 * fi->block_bytes / fi->block;
        double per = (fi->scale_rows ? fi->scale_rows : INFINITY) * (fi->scale_cols ? fi->scale_cols : INFINITY);
        double want = data + scale_bits[fi->scale_type] / per;
        cr_assert(fabs(fi->bits_per_weight - want) < 1e-12, "%s: %g, want %g", fi->name, fi->bits_per_weight, want);
    }
}

Test(format, names_are_unique_and_look_up_both_ways)
{
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        kiln_format got = KILN_FMT_COUNT;
        const char *name = kiln_format_get((kiln_format)f)->name;
        cr_assert_eq(kiln_format_from_name(name, &got), KILN_OK, "%s", name);
        cr_assert_eq((int)got, f, "%s maps back to its own row", name);
    }
}

Test(format, out_of_range_formats_have_no_row)
{
    cr_assert_null(kiln_format_get(KILN_FMT_COUNT));
    cr_assert_null(kiln_format_get((kiln_format)-1));
    cr_assert_null(kiln_format_get((kiln_format)1000));
}

Test(format, unknown_name_is_not_found_and_named)
{
    kiln_format got = KILN_FMT_Q4_K;
    cr_assert_eq(kiln_format_from_name("q8_1", &got), KILN_ERR_NOT_FOUND);
    cr_assert(strstr(kiln_last_error(), "q8_1"), "%s", kiln_last_error());
    cr_assert_eq(got, KILN_FMT_Q4_K, "out untouched on failure");
    cr_assert_eq(kiln_format_from_name("Q4_K", &got), KILN_ERR_NOT_FOUND, "names are lower case");
    cr_assert_eq(kiln_format_from_name("", &got), KILN_ERR_NOT_FOUND);
    cr_assert_eq(kiln_format_from_name(NULL, &got), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_format_from_name("f32", NULL), KILN_ERR_INVALID_ARG);
}

static size_t data_bytes(kiln_format f, int64_t n, int64_t k)
{
    size_t b = 0;
    cr_assert_eq(kiln_format_data_bytes(f, n, k, &b), KILN_OK, "%s", kiln_last_error());
    return b;
}

static size_t scale_bytes(kiln_format f, int64_t n, int64_t k)
{
    size_t b = 0;
    cr_assert_eq(kiln_format_scale_bytes(f, n, k, &b), KILN_OK, "%s", kiln_last_error());
    return b;
}

Test(format, data_bytes_of_each_layout)
{
    cr_assert_eq(data_bytes(KILN_FMT_F32, 3, 5), 60);
    cr_assert_eq(data_bytes(KILN_FMT_BF16, 3, 5), 30);
    cr_assert_eq(data_bytes(KILN_FMT_FP8_BLOCK, 130, 200), 26000);
    cr_assert_eq(data_bytes(KILN_FMT_MXFP8, 2, 64), 128);
    cr_assert_eq(data_bytes(KILN_FMT_NVFP4, 2, 32), 32);
    cr_assert_eq(data_bytes(KILN_FMT_MXFP4, 3, 64), 96);
    cr_assert_eq(data_bytes(KILN_FMT_Q8_0, 2, 64), 2 * 2 * 34);
    cr_assert_eq(data_bytes(KILN_FMT_Q4_0, 1, 4096), 128 * 18);
    cr_assert_eq(data_bytes(KILN_FMT_Q4_K, 3, 512), 3 * 2 * 144);
    cr_assert_eq(data_bytes(KILN_FMT_Q6_K, 1, 256), 210);
    cr_assert_eq(data_bytes(KILN_FMT_GGML_MXFP4, 4, 32), 4 * 17);
}

Test(format, scale_bytes_of_each_granularity)
{
    cr_assert_eq(scale_bytes(KILN_FMT_F16, 7, 64), 0, "no separate scales");
    cr_assert_eq(scale_bytes(KILN_FMT_Q4_K, 7, 256), 0, "GGML scales are inline");
    cr_assert_eq(scale_bytes(KILN_FMT_FP8_TENSOR, 7, 64), 4, "one f32 for the tensor");
    cr_assert_eq(scale_bytes(KILN_FMT_FP8_CHANNEL, 7, 64), 28, "one f32 per row");
    cr_assert_eq(scale_bytes(KILN_FMT_FP8_BLOCK, 128, 128), 4);
    cr_assert_eq(scale_bytes(KILN_FMT_FP8_BLOCK, 130, 200), 2 * 2 * 4, "partial tiles round up");
    cr_assert_eq(scale_bytes(KILN_FMT_FP8_BLOCK, 129, 257), 2 * 3 * 4);
    cr_assert_eq(scale_bytes(KILN_FMT_FP8_BLOCK, 1, 1), 4);
    cr_assert_eq(scale_bytes(KILN_FMT_MXFP8, 3, 64), 6);
    cr_assert_eq(scale_bytes(KILN_FMT_MXFP4, 3, 96), 9);
    cr_assert_eq(scale_bytes(KILN_FMT_NVFP4, 3, 64), 12);
}

Test(format, k_breaking_the_block_rule_is_a_shape_error_naming_format_and_k)
{
    size_t b = 12345;
    cr_assert_eq(kiln_format_data_bytes(KILN_FMT_Q4_K, 4, 100, &b), KILN_ERR_SHAPE);
    cr_assert(strstr(kiln_last_error(), "q4_k") && strstr(kiln_last_error(), "K = 100"), "%s", kiln_last_error());
    cr_assert_eq(b, 12345, "out untouched on failure");
    cr_assert_eq(kiln_format_scale_bytes(KILN_FMT_NVFP4, 4, 24, &b), KILN_ERR_SHAPE);
    cr_assert(strstr(kiln_last_error(), "nvfp4") && strstr(kiln_last_error(), "K = 24"), "%s", kiln_last_error());
    cr_assert_eq(kiln_format_data_bytes(KILN_FMT_MXFP8, 1, 48, &b), KILN_ERR_SHAPE);
    cr_assert(strstr(kiln_last_error(), "mxfp8"), "%s", kiln_last_error());
}

Test(format, non_positive_shapes_are_shape_errors)
{
    size_t b;
    const int64_t bad[][2] = { { 0, 32 }, { -1, 32 }, { 4, 0 }, { 4, -32 } };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(kiln_format_data_bytes(KILN_FMT_Q8_0, bad[i][0], bad[i][1], &b), KILN_ERR_SHAPE);
        cr_assert(strstr(kiln_last_error(), "q8_0"), "%s", kiln_last_error());
        cr_assert_eq(kiln_format_scale_bytes(KILN_FMT_FP8_BLOCK, bad[i][0], bad[i][1], &b), KILN_ERR_SHAPE);
        cr_assert(strstr(kiln_last_error(), "fp8_block"), "%s", kiln_last_error());
    }
}

Test(format, sizes_that_overflow_are_shape_errors)
{
    size_t b;
    cr_assert_eq(kiln_format_data_bytes(KILN_FMT_F32, INT64_MAX / 2, INT64_MAX / 2, &b), KILN_ERR_SHAPE);
    cr_assert(strstr(kiln_last_error(), "overflow"), "%s", kiln_last_error());
    cr_assert_eq(kiln_format_data_bytes(KILN_FMT_F32, 1, INT64_MAX, &b), KILN_ERR_SHAPE, "K * 4 bytes");
    cr_assert_eq(kiln_format_scale_bytes(KILN_FMT_FP8_CHANNEL, INT64_MAX, 1, &b), KILN_ERR_SHAPE);
    cr_assert(strstr(kiln_last_error(), "fp8_channel"), "%s", kiln_last_error());
    cr_assert_eq(kiln_format_scale_bytes(KILN_FMT_FP8_BLOCK, INT64_MAX, INT64_MAX, &b), KILN_ERR_SHAPE,
                 "ceil(N/128) * ceil(K/128) tiles");
    cr_assert_eq(kiln_format_scale_bytes(KILN_FMT_FP8_TENSOR, INT64_MAX, INT64_MAX, &b), KILN_OK,
                 "one scale, whatever the shape");
    cr_assert_eq(b, 4);
}

Test(format, unknown_format_and_null_out_are_rejected)
{
    size_t b;
    cr_assert_eq(kiln_format_data_bytes(KILN_FMT_COUNT, 1, 32, &b), KILN_ERR_UNSUPPORTED);
    char count_text[32];
    snprintf(count_text, sizeof count_text, "format %d", (int)KILN_FMT_COUNT);
    cr_assert(strstr(kiln_last_error(), count_text), "%s", kiln_last_error());
    cr_assert_eq(kiln_format_scale_bytes((kiln_format)-3, 1, 32, &b), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "format -3"), "%s", kiln_last_error());
    cr_assert_eq(kiln_format_data_bytes(KILN_FMT_Q8_0, 1, 32, NULL), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "q8_0"), "%s", kiln_last_error());
    cr_assert_eq(kiln_format_scale_bytes(KILN_FMT_MXFP4, 1, 32, NULL), KILN_ERR_INVALID_ARG);
}
