/* The format table: one row per kiln_format, and the storage sizes derived
 * from it. Exact layouts are in FORMATS.md; adding a format is adding a row
 * here, its quantizer in quant.c and its tests. */
#include "core.h"

#include <stdint.h>
#include <string.h>

static const kiln_format_info format_table[] = {
    [KILN_FMT_F32] = {
        .name = "f32", .desc = "32-bit IEEE float",
        .block = 1, .block_bytes = 4, .k_multiple = 1, .bits_per_weight = 32.0,
        .scale_type = KILN_SCALE_NONE, .gguf_type = 0, .scale_desc = "none",
    },
    [KILN_FMT_F16] = {
        .name = "f16", .desc = "16-bit IEEE float",
        .block = 1, .block_bytes = 2, .k_multiple = 1, .bits_per_weight = 16.0,
        .scale_type = KILN_SCALE_NONE, .gguf_type = 1, .scale_desc = "none",
    },
    [KILN_FMT_BF16] = {
        .name = "bf16", .desc = "bfloat16",
        .block = 1, .block_bytes = 2, .k_multiple = 1, .bits_per_weight = 16.0,
        .scale_type = KILN_SCALE_NONE, .gguf_type = 30, .scale_desc = "none",
    },
    [KILN_FMT_FP8_TENSOR] = {
        .name = "fp8", .desc = "FP8 E4M3, one scale for the tensor",
        .block = 1, .block_bytes = 1, .k_multiple = 1, .bits_per_weight = 8.0,
        .scale_type = KILN_SCALE_F32, .scale_rows = 0, .scale_cols = 0,
        .gguf_type = -1, .scale_desc = "f32 per tensor",
    },
    [KILN_FMT_FP8_CHANNEL] = {
        .name = "fp8_channel", .desc = "FP8 E4M3, one scale per output row",
        .block = 1, .block_bytes = 1, .k_multiple = 1, .bits_per_weight = 8.0,
        .scale_type = KILN_SCALE_F32, .scale_rows = 1, .scale_cols = 0,
        .gguf_type = -1, .scale_desc = "f32 per row [N]",
    },
    [KILN_FMT_FP8_BLOCK] = {
        .name = "fp8_block", .desc = "FP8 E4M3, one scale per 128x128 tile (DeepSeek-V3)",
        .block = 1, .block_bytes = 1, .k_multiple = 1,
        .bits_per_weight = 8.0 + 32.0 / (128.0 * 128.0),
        .scale_type = KILN_SCALE_F32, .scale_rows = 128, .scale_cols = 128,
        .gguf_type = -1, .scale_desc = "f32 per 128x128 tile [ceil(N/128), ceil(K/128)]",
    },
    [KILN_FMT_MXFP8] = {
        .name = "mxfp8", .desc = "OCP MXFP8: 32 x E4M3 + E8M0 scale",
        .block = 32, .block_bytes = 32, .k_multiple = 32, .bits_per_weight = 8.25,
        .scale_type = KILN_SCALE_E8M0, .scale_rows = 1, .scale_cols = 32,
        .gguf_type = -1, .scale_desc = "e8m0 per 32 [N, K/32]",
    },
    [KILN_FMT_NVFP4] = {
        .name = "nvfp4", .desc = "NVFP4: 16 x E2M1 + UE4M3 scale, f32 global scale",
        .block = 16, .block_bytes = 8, .k_multiple = 16, .bits_per_weight = 4.5,
        .scale_type = KILN_SCALE_UE4M3, .scale_rows = 1, .scale_cols = 16,
        .has_global_scale = 1,
        .gguf_type = -1, .scale_desc = "ue4m3 per 16 [N, K/16] + f32 global",
    },
    [KILN_FMT_MXFP4] = {
        .name = "mxfp4", .desc = "OCP MXFP4: 32 x E2M1 + E8M0 scale",
        .block = 32, .block_bytes = 16, .k_multiple = 32, .bits_per_weight = 4.25,
        .scale_type = KILN_SCALE_E8M0, .scale_rows = 1, .scale_cols = 32,
        .gguf_type = -1, .scale_desc = "e8m0 per 32 [N, K/32]",
    },
    [KILN_FMT_Q8_0] = {
        .name = "q8_0", .desc = "GGML Q8_0: 32 x int8, f16 scale",
        .block = 32, .block_bytes = 34, .k_multiple = 32, .bits_per_weight = 8.5,
        .scale_type = KILN_SCALE_NONE, .gguf_type = 8, .scale_desc = "f16 per 32, inline",
    },
    [KILN_FMT_Q4_0] = {
        .name = "q4_0", .desc = "GGML Q4_0: 32 x 4-bit, f16 scale",
        .block = 32, .block_bytes = 18, .k_multiple = 32, .bits_per_weight = 4.5,
        .scale_type = KILN_SCALE_NONE, .gguf_type = 2, .scale_desc = "f16 per 32, inline",
    },
    [KILN_FMT_Q4_K] = {
        .name = "q4_k", .desc = "GGML Q4_K: 256 x 4-bit, 6-bit scales and mins per 32",
        .block = 256, .block_bytes = 144, .k_multiple = 256, .bits_per_weight = 4.5,
        .scale_type = KILN_SCALE_NONE, .gguf_type = 12,
        .scale_desc = "f16 d, dmin per 256 + 6-bit scale, min per 32, inline",
    },
    [KILN_FMT_Q6_K] = {
        .name = "q6_k", .desc = "GGML Q6_K: 256 x 6-bit, int8 scales per 16",
        .block = 256, .block_bytes = 210, .k_multiple = 256, .bits_per_weight = 6.5625,
        .scale_type = KILN_SCALE_NONE, .gguf_type = 14,
        .scale_desc = "f16 d per 256 + int8 scale per 16, inline",
    },
    [KILN_FMT_GGML_MXFP4] = {
        .name = "ggml_mxfp4", .desc = "GGML MXFP4: 32 x E2M1 + E8M0 scale, split halves",
        .block = 32, .block_bytes = 17, .k_multiple = 32, .bits_per_weight = 4.25,
        .scale_type = KILN_SCALE_NONE, .gguf_type = 39, .scale_desc = "e8m0 per 32, inline",
    },
    [KILN_FMT_Q5_0] = {
        .name = "q5_0", .desc = "GGML Q5_0: 32 x 5-bit, f16 scale",
        .block = 32, .block_bytes = 22, .k_multiple = 32, .bits_per_weight = 5.5,
        .scale_type = KILN_SCALE_NONE, .gguf_type = 6, .scale_desc = "f16 per 32, inline",
    },
    [KILN_FMT_Q5_1] = {
        .name = "q5_1", .desc = "GGML Q5_1: 32 x 5-bit, f16 scale and min",
        .block = 32, .block_bytes = 24, .k_multiple = 32, .bits_per_weight = 6.0,
        .scale_type = KILN_SCALE_NONE, .gguf_type = 7, .scale_desc = "f16 d, m per 32, inline",
    },
    [KILN_FMT_Q2_K] = {
        .name = "q2_k", .desc = "GGML Q2_K: 256 x 2-bit, 4-bit scales and mins per 16",
        .block = 256, .block_bytes = 84, .k_multiple = 256, .bits_per_weight = 2.625,
        .scale_type = KILN_SCALE_NONE, .gguf_type = 10,
        .scale_desc = "f16 d, dmin per 256 + 4-bit scale, min per 16, inline",
    },
    [KILN_FMT_Q3_K] = {
        .name = "q3_k", .desc = "GGML Q3_K: 256 x 3-bit, 6-bit scales per 16",
        .block = 256, .block_bytes = 110, .k_multiple = 256, .bits_per_weight = 3.4375,
        .scale_type = KILN_SCALE_NONE, .gguf_type = 11,
        .scale_desc = "f16 d per 256 + 6-bit scale per 16, inline",
    },
    [KILN_FMT_Q5_K] = {
        .name = "q5_k", .desc = "GGML Q5_K: 256 x 5-bit, 6-bit scales and mins per 32",
        .block = 256, .block_bytes = 176, .k_multiple = 256, .bits_per_weight = 5.5,
        .scale_type = KILN_SCALE_NONE, .gguf_type = 13,
        .scale_desc = "f16 d, dmin per 256 + 6-bit scale, min per 32, inline",
    },
    [KILN_FMT_IQ4_NL] = {
        .name = "iq4_nl", .desc = "GGML IQ4_NL: 32 x 4-bit non-linear codebook, f16 scale",
        .block = 32, .block_bytes = 18, .k_multiple = 32, .bits_per_weight = 4.5,
        .scale_type = KILN_SCALE_NONE, .gguf_type = 20, .scale_desc = "f16 per 32, inline",
    },
    [KILN_FMT_IQ4_XS] = {
        .name = "iq4_xs", .desc = "GGML IQ4_XS: 256 x 4-bit non-linear codebook, 6-bit scales per 32",
        .block = 256, .block_bytes = 136, .k_multiple = 256, .bits_per_weight = 4.25,
        .scale_type = KILN_SCALE_NONE, .gguf_type = 23,
        .scale_desc = "f16 d per 256 + 6-bit scale per 32, inline",
    },
    [KILN_FMT_Q4_1] = {
        .name = "q4_1", .desc = "GGML Q4_1: 32 x 4-bit, f16 scale and min",
        .block = 32, .block_bytes = 20, .k_multiple = 32, .bits_per_weight = 5.0,
        .scale_type = KILN_SCALE_NONE, .gguf_type = 3, .scale_desc = "f16 d, m per 32, inline",
    },
    /* compressed-tensors pack-quantized: the codes as weight_packed stores
     * them, in little-endian int32 words; scales per group of the weight. */
    [KILN_FMT_INT4_GROUP] = {
        .name = "int4_group", .desc = "int4 in int32 words, f32 scale per group",
        .block = 8, .block_bytes = 4, .k_multiple = 8, .bits_per_weight = 4.0,
        .scale_type = KILN_SCALE_F32, .scale_rows = 1, .scale_cols = 0, .grouped = 1,
        .gguf_type = -1, .scale_desc = "f32 per group [N, K/group]",
    },
    [KILN_FMT_INT4_GROUP_ZP] = {
        .name = "int4_group_zp", .desc = "int4 in int32 words, f32 scale and int8 zero point per group",
        .block = 8, .block_bytes = 4, .k_multiple = 8, .bits_per_weight = 4.0,
        .scale_type = KILN_SCALE_F32, .scale_rows = 1, .scale_cols = 0, .grouped = 1,
        .zero_point = 1,
        .gguf_type = -1, .scale_desc = "f32 per group [N, K/group], then int8 zero points [N, K/group]",
    },
    [KILN_FMT_INT8_GROUP] = {
        .name = "int8_group", .desc = "int8 in int32 words, f32 scale per group",
        .block = 4, .block_bytes = 4, .k_multiple = 4, .bits_per_weight = 8.0,
        .scale_type = KILN_SCALE_F32, .scale_rows = 1, .scale_cols = 0, .grouped = 1,
        .gguf_type = -1, .scale_desc = "f32 per group [N, K/group]",
    },
    [KILN_FMT_INT8_GROUP_ZP] = {
        .name = "int8_group_zp", .desc = "int8 in int32 words, f32 scale and int8 zero point per group",
        .block = 4, .block_bytes = 4, .k_multiple = 4, .bits_per_weight = 8.0,
        .scale_type = KILN_SCALE_F32, .scale_rows = 1, .scale_cols = 0, .grouped = 1,
        .zero_point = 1,
        .gguf_type = -1, .scale_desc = "f32 per group [N, K/group], then int8 zero points [N, K/group]",
    },
};
_Static_assert(KILN_ARRAY_LEN(format_table) == KILN_FMT_COUNT, "one row per kiln_format");

static const size_t scale_elem_bytes[] = {
    [KILN_SCALE_NONE] = 0,
    [KILN_SCALE_F32] = 4,
    [KILN_SCALE_E8M0] = 1,
    [KILN_SCALE_UE4M3] = 1,
};

const kiln_format_info *kiln_format_get(kiln_format fmt)
{
    if ((unsigned)fmt >= KILN_FMT_COUNT)
        return NULL;
    return &format_table[fmt];
}

kiln_status kiln_format_from_name(const char *name, kiln_format *out)
{
    if (!name || !out)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_format_from_name: name and out must not be NULL");
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        if (strcmp(format_table[f].name, name) == 0) {
            *out = (kiln_format)f;
            return KILN_OK;
        }
    }
    return kiln_fail(KILN_ERR_NOT_FOUND, "format \"%s\" does not exist", name);
}

/* The checks both size functions share: a known format, a positive shape,
 * K a multiple of the format's k_multiple. Messages name the format and the
 * shape so that a caller can prefix where it was (file, tensor). */
static kiln_status check_shape(kiln_format fmt, int64_t n, int64_t k, const void *out,
                               const kiln_format_info **info)
{
    const kiln_format_info *fi = kiln_format_get(fmt);
    if (!fi)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "format %d is not a kiln_format", (int)fmt);
    if (!out)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: the size out-parameter must not be NULL", fi->name);
    if (n <= 0 || k <= 0)
        return kiln_fail(KILN_ERR_SHAPE, "%s: shape [N=%lld, K=%lld] must be positive", fi->name,
                         (long long)n, (long long)k);
    if (k % fi->k_multiple != 0)
        return kiln_fail(KILN_ERR_SHAPE, "%s: K = %lld is not a multiple of %d", fi->name, (long long)k,
                         fi->k_multiple);
    *info = fi;
    return KILN_OK;
}

kiln_status kiln_format_data_bytes(kiln_format fmt, int64_t n, int64_t k, size_t *out)
{
    const kiln_format_info *fi = NULL;
    kiln_status st = check_shape(fmt, n, k, out, &fi);
    if (st != KILN_OK)
        return st;
    size_t row, total;
    if (!kiln_mul_size((size_t)(k / fi->block), (size_t)fi->block_bytes, &row) ||
        !kiln_mul_size(row, (size_t)n, &total))
        return kiln_fail(KILN_ERR_SHAPE, "%s: data of [N=%lld, K=%lld] overflows size_t", fi->name,
                         (long long)n, (long long)k);
    *out = total;
    return KILN_OK;
}

/* kiln_ceil_div's a + b - 1 would wrap for a near INT64_MAX. */
static int64_t ceil_div_nowrap(int64_t a, int64_t b) { return a / b + (a % b != 0); }

/* The scale bytes of [n, k] with cols values along K per scale (0: all K). */
static kiln_status scale_bytes(const kiln_format_info *fi, int64_t n, int64_t k, int64_t cols_per,
                               size_t *out)
{
    int64_t rows = fi->scale_rows ? ceil_div_nowrap(n, fi->scale_rows) : 1;
    int64_t cols = cols_per ? ceil_div_nowrap(k, cols_per) : 1;
    size_t elems, total, zero = 0;
    if (!kiln_mul_size((size_t)rows, (size_t)cols, &elems) ||
        !kiln_mul_size(elems, scale_elem_bytes[fi->scale_type], &total) ||
        (fi->zero_point && (zero = elems) > SIZE_MAX - total))
        return kiln_fail(KILN_ERR_SHAPE, "%s: scales of [N=%lld, K=%lld] overflow size_t", fi->name,
                         (long long)n, (long long)k);
    *out = total + zero;
    return KILN_OK;
}

kiln_status kiln_format_scale_bytes(kiln_format fmt, int64_t n, int64_t k, size_t *out)
{
    const kiln_format_info *fi = NULL;
    kiln_status st = check_shape(fmt, n, k, out, &fi);
    if (st != KILN_OK)
        return st;
    return scale_bytes(fi, n, k, fi->scale_cols, out);
}

/* A group shares one scale per chunk a kernel decodes only when it is a
 * whole number of blocks; compressed-tensors' groups (32, 64, 128, or all
 * of K) always are. */
kiln_status kiln_qtensor_scale_bytes(const kiln_qtensor *t, size_t *out)
{
    if (!t)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_qtensor_scale_bytes: the tensor must not be NULL");
    const kiln_format_info *fi = NULL;
    kiln_status st = check_shape(t->format, t->n, t->k, out, &fi);
    if (st != KILN_OK)
        return st;
    if (!fi->grouped)
        return scale_bytes(fi, t->n, t->k, fi->scale_cols, out);
    if (t->group < 0 || t->group % fi->block != 0 || (t->group && t->k % t->group != 0))
        return kiln_fail(KILN_ERR_SHAPE,
                         "%s: group %lld of [N=%lld, K=%lld] is not a multiple of %d that divides K "
                         "(or 0, one group per row)",
                         fi->name, (long long)t->group, (long long)t->n, (long long)t->k, fi->block);
    return scale_bytes(fi, t->n, t->k, t->group, out);
}
