/* CPU reference quantization and dequantization, one row of function
 * pointers per format. This file holds the plain, FP8, OCP MX and NVFP4
 * formats; the GGML block formats live in quant_ggml.c, the integer group
 * formats in quant_int.c.
 *
 * Buffers are caller memory that may come straight from a file mapping, so
 * multi-byte elements (f32 scales, f16/bf16 values) are moved with memcpy and
 * never dereferenced through a cast pointer: nothing is assumed aligned.
 * Multi-byte values are little-endian, as in GGUF and safetensors.
 *
 * Non-finite inputs never cause undefined behaviour: block maxima skip NaN,
 * and every conversion to a narrow type is defined for NaN and ±inf
 * (elem.c). A block or tensor whose maximum is zero gets a finite scale and
 * zero codes, never a division by zero. */
#include "core.h"
#include "graph/quant.h"

#include <math.h>
#include <string.h>

/* Both run after kiln_quantize / kiln_dequantize have checked the
 * descriptor, the shape and every pointer the format needs. */
typedef struct quant_ops {
    void (*quantize)(const float *src, kiln_qtensor *t);
    void (*dequantize)(const kiln_qtensor *t, float *dst);
} quant_ops;

static float load_f32(const void *base, size_t i)
{
    float v;
    memcpy(&v, (const unsigned char *)base + i * sizeof v, sizeof v);
    return v;
}

static void store_f32(void *base, size_t i, float v)
{
    memcpy((unsigned char *)base + i * sizeof v, &v, sizeof v);
}

static uint16_t load_u16(const void *base, size_t i)
{
    const unsigned char *p = (const unsigned char *)base + 2 * i;
    return (uint16_t)(p[0] | (p[1] << 8));
}

static void store_u16(void *base, size_t i, uint16_t v)
{
    unsigned char *p = (unsigned char *)base + 2 * i;
    p[0] = (unsigned char)(v & 0xFF);
    p[1] = (unsigned char)(v >> 8);
}

static size_t n_elems(const kiln_qtensor *t) { return (size_t)t->n * (size_t)t->k; }

/* Largest |x| over a strided 2-D window; NaN is skipped (the comparison is
 * false), so a NaN element cannot poison the scale of its neighbours. */
static float amax_2d(const float *src, int64_t ld, int64_t r0, int64_t r1, int64_t c0, int64_t c1)
{
    float amax = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t c = c0; c < c1; c++) {
            float a = fabsf(src[r * ld + c]);
            if (a > amax)
                amax = a;
        }
    }
    return amax;
}

static float amax_1d(const float *x, int n) { return amax_2d(x, n, 0, 1, 0, n); }

/* ------------------------------------------------------------ plain types */

static void f32_quantize(const float *src, kiln_qtensor *t) { memcpy(t->data, src, n_elems(t) * sizeof(float)); }

static void f32_dequantize(const kiln_qtensor *t, float *dst) { memcpy(dst, t->data, n_elems(t) * sizeof(float)); }

static void f16_quantize(const float *src, kiln_qtensor *t)
{
    for (size_t i = 0; i < n_elems(t); i++)
        store_u16(t->data, i, kiln_f32_to_f16(src[i]));
}

static void f16_dequantize(const kiln_qtensor *t, float *dst)
{
    for (size_t i = 0; i < n_elems(t); i++)
        dst[i] = kiln_f16_to_f32(load_u16(t->data, i));
}

static void bf16_quantize(const float *src, kiln_qtensor *t)
{
    for (size_t i = 0; i < n_elems(t); i++)
        store_u16(t->data, i, kiln_f32_to_bf16(src[i]));
}

static void bf16_dequantize(const kiln_qtensor *t, float *dst)
{
    for (size_t i = 0; i < n_elems(t); i++)
        dst[i] = kiln_bf16_to_f32(load_u16(t->data, i));
}

/* -------------------------------------------------------------------- FP8 */

/* ModelOpt and DeepSeek-V3: s = amax / 448, q = e4m3(x / s) (a division,
 * not a multiplication by 1/s: the two differ in the last bit), w = q * s.
 * An all-zero window keeps s = 0 and stores the zeros (signs kept) as they
 * are, so that dequantization gives them back exactly. */
static float fp8_scale(float amax) { return amax / 448.0f; }

static void fp8_quantize_window(const float *src, int64_t ld, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                                float s, uint8_t *q)
{
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t c = c0; c < c1; c++) {
            float x = src[r * ld + c];
            q[r * ld + c] = kiln_f32_to_e4m3(s > 0.0f ? x / s : x);
        }
    }
}

static void fp8_dequantize_window(const uint8_t *q, int64_t ld, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                                  float s, float *dst)
{
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++)
            dst[r * ld + c] = kiln_e4m3_to_f32(q[r * ld + c]) * s;
}

static void fp8_tensor_quantize(const float *src, kiln_qtensor *t)
{
    float s = fp8_scale(amax_2d(src, t->k, 0, t->n, 0, t->k));
    store_f32(t->scale, 0, s);
    fp8_quantize_window(src, t->k, 0, t->n, 0, t->k, s, t->data);
}

static void fp8_tensor_dequantize(const kiln_qtensor *t, float *dst)
{
    fp8_dequantize_window(t->data, t->k, 0, t->n, 0, t->k, load_f32(t->scale, 0), dst);
}

static void fp8_channel_quantize(const float *src, kiln_qtensor *t)
{
    for (int64_t r = 0; r < t->n; r++) {
        float s = fp8_scale(amax_2d(src, t->k, r, r + 1, 0, t->k));
        store_f32(t->scale, (size_t)r, s);
        fp8_quantize_window(src, t->k, r, r + 1, 0, t->k, s, t->data);
    }
}

static void fp8_channel_dequantize(const kiln_qtensor *t, float *dst)
{
    for (int64_t r = 0; r < t->n; r++)
        fp8_dequantize_window(t->data, t->k, r, r + 1, 0, t->k, load_f32(t->scale, (size_t)r), dst);
}

enum { FP8_TILE = 128 };

static int64_t tile_end(int64_t start, int64_t limit)
{
    return start + FP8_TILE < limit ? start + FP8_TILE : limit;
}

/* Edge tiles are partial: ceil(N/128) x ceil(K/128) scales, each over the
 * elements its tile actually covers. */
static void fp8_block_quantize(const float *src, kiln_qtensor *t)
{
    int64_t tiles_k = kiln_ceil_div(t->k, FP8_TILE);
    for (int64_t r0 = 0; r0 < t->n; r0 += FP8_TILE) {
        for (int64_t c0 = 0; c0 < t->k; c0 += FP8_TILE) {
            int64_t r1 = tile_end(r0, t->n), c1 = tile_end(c0, t->k);
            float s = fp8_scale(amax_2d(src, t->k, r0, r1, c0, c1));
            store_f32(t->scale, (size_t)((r0 / FP8_TILE) * tiles_k + c0 / FP8_TILE), s);
            fp8_quantize_window(src, t->k, r0, r1, c0, c1, s, t->data);
        }
    }
}

static void fp8_block_dequantize(const kiln_qtensor *t, float *dst)
{
    int64_t tiles_k = kiln_ceil_div(t->k, FP8_TILE);
    for (int64_t r0 = 0; r0 < t->n; r0 += FP8_TILE) {
        for (int64_t c0 = 0; c0 < t->k; c0 += FP8_TILE) {
            float s = load_f32(t->scale, (size_t)((r0 / FP8_TILE) * tiles_k + c0 / FP8_TILE));
            fp8_dequantize_window(t->data, t->k, r0, tile_end(r0, t->n), c0, tile_end(c0, t->k), s, dst);
        }
    }
}

/* ----------------------------------------------------------------- OCP MX */

enum { MX_BLOCK = 32 };

/* OCP MX v1.0: X = 2^(floor(log2(amax)) - emax_elem), elements satfinite
 * RNE of x / X. floor(log2) is taken from the exponent field (ilogbf), exact
 * for every finite amax including subnormals. The E8M0 code is clamped to
 * [0, 254]: below 2^-127 X cannot go, and 0xFF is NaN. An all-zero block
 * gets code 0, like ggml's MXFP4. */
static uint8_t mx_scale_code(float amax, int emax_elem)
{
    if (!(amax > 0.0f))
        return 0;
    long e = isinf(amax) ? 254 : (long)ilogbf(amax) - emax_elem + 127;
    if (e < 0)
        e = 0;
    if (e > 254)
        e = 254;
    return (uint8_t)e;
}

static void mxfp8_quantize(const float *src, kiln_qtensor *t)
{
    uint8_t *q = t->data, *sc = t->scale;
    size_t nb = n_elems(t) / MX_BLOCK;
    for (size_t b = 0; b < nb; b++) {
        const float *x = src + b * MX_BLOCK;
        sc[b] = mx_scale_code(amax_1d(x, MX_BLOCK), 8);
        float X = kiln_e8m0_to_f32(sc[b]);
        for (int j = 0; j < MX_BLOCK; j++)
            q[b * MX_BLOCK + j] = kiln_f32_to_e4m3(x[j] / X);
    }
}

static void mxfp8_dequantize(const kiln_qtensor *t, float *dst)
{
    const uint8_t *q = t->data, *sc = t->scale;
    size_t nb = n_elems(t) / MX_BLOCK;
    for (size_t b = 0; b < nb; b++) {
        float X = kiln_e8m0_to_f32(sc[b]);
        for (int j = 0; j < MX_BLOCK; j++)
            dst[b * MX_BLOCK + j] = X * kiln_e4m3_to_f32(q[b * MX_BLOCK + j]);
    }
}

/* Two E2M1 per byte, the even element in the low nibble. */
static void mxfp4_quantize(const float *src, kiln_qtensor *t)
{
    uint8_t *q = t->data, *sc = t->scale;
    size_t nb = n_elems(t) / MX_BLOCK;
    for (size_t b = 0; b < nb; b++) {
        const float *x = src + b * MX_BLOCK;
        sc[b] = mx_scale_code(amax_1d(x, MX_BLOCK), 2);
        float X = kiln_e8m0_to_f32(sc[b]);
        for (int j = 0; j < MX_BLOCK; j += 2) {
            uint8_t lo = kiln_f32_to_e2m1(x[j] / X), hi = kiln_f32_to_e2m1(x[j + 1] / X);
            q[(b * MX_BLOCK + j) / 2] = (uint8_t)(lo | (hi << 4));
        }
    }
}

static void mxfp4_dequantize(const kiln_qtensor *t, float *dst)
{
    const uint8_t *q = t->data, *sc = t->scale;
    size_t nb = n_elems(t) / MX_BLOCK;
    for (size_t b = 0; b < nb; b++) {
        float X = kiln_e8m0_to_f32(sc[b]);
        for (int j = 0; j < MX_BLOCK; j += 2) {
            uint8_t byte = q[(b * MX_BLOCK + j) / 2];
            dst[b * MX_BLOCK + j] = X * kiln_e2m1_to_f32(byte & 0xF);
            dst[b * MX_BLOCK + j + 1] = X * kiln_e2m1_to_f32(byte >> 4);
        }
    }
}

/* ------------------------------------------------------------------ NVFP4 */

enum { NVFP4_BLOCK = 16 };

/* ModelOpt's NVFP4QTensor, operation for operation in f32:
 *   global g = amax(tensor) / (6 * 448)
 *   block  s = ue4m3(amax(block) / (6 * g)), 1.0 where that quotient is 0
 *   value  q = e2m1(x / (float(s) * g)),  w = e2m1 * (float(s) * g).
 * Elements round to nearest even, as cvt.rn.satfinite.e2m1x2 and
 * TensorRT-LLM's fp4_quantize do; ModelOpt's PyTorch fallback instead sends
 * the exact ties 2.5 and 3.5 to 3, the only inputs where the two differ.
 * When the decoded block scale is zero (a block far below the tensor's
 * maximum, or an all-zero tensor) every element is stored as +0: any code
 * would dequantize to zero. */
static void nvfp4_quantize(const float *src, kiln_qtensor *t)
{
    uint8_t *q = t->data, *sc = t->scale;
    float g = amax_2d(src, t->k, 0, t->n, 0, t->k) / (6.0f * 448.0f);
    t->global_scale = g;
    size_t nb = n_elems(t) / NVFP4_BLOCK;
    for (size_t b = 0; b < nb; b++) {
        const float *x = src + b * NVFP4_BLOCK;
        float amax = amax_1d(x, NVFP4_BLOCK);
        float s = amax > 0.0f ? amax / (6.0f * g) : 0.0f;
        sc[b] = kiln_f32_to_e4m3(s == 0.0f ? 1.0f : s);
        float d = kiln_e4m3_to_f32(sc[b]) * g;
        for (int j = 0; j < NVFP4_BLOCK; j += 2) {
            uint8_t lo = d > 0.0f ? kiln_f32_to_e2m1(x[j] / d) : 0;
            uint8_t hi = d > 0.0f ? kiln_f32_to_e2m1(x[j + 1] / d) : 0;
            q[(b * NVFP4_BLOCK + j) / 2] = (uint8_t)(lo | (hi << 4));
        }
    }
}

static void nvfp4_dequantize(const kiln_qtensor *t, float *dst)
{
    const uint8_t *q = t->data, *sc = t->scale;
    size_t nb = n_elems(t) / NVFP4_BLOCK;
    for (size_t b = 0; b < nb; b++) {
        float d = kiln_e4m3_to_f32(sc[b]) * t->global_scale;
        for (int j = 0; j < NVFP4_BLOCK; j += 2) {
            uint8_t byte = q[(b * NVFP4_BLOCK + j) / 2];
            dst[b * NVFP4_BLOCK + j] = kiln_e2m1_to_f32(byte & 0xF) * d;
            dst[b * NVFP4_BLOCK + j + 1] = kiln_e2m1_to_f32(byte >> 4) * d;
        }
    }
}

/* --------------------------------------------------------------- dispatch */

static const quant_ops quant_table[] = {
    [KILN_FMT_F32] = { f32_quantize, f32_dequantize },
    [KILN_FMT_F16] = { f16_quantize, f16_dequantize },
    [KILN_FMT_BF16] = { bf16_quantize, bf16_dequantize },
    [KILN_FMT_FP8_TENSOR] = { fp8_tensor_quantize, fp8_tensor_dequantize },
    [KILN_FMT_FP8_CHANNEL] = { fp8_channel_quantize, fp8_channel_dequantize },
    [KILN_FMT_FP8_BLOCK] = { fp8_block_quantize, fp8_block_dequantize },
    [KILN_FMT_MXFP8] = { mxfp8_quantize, mxfp8_dequantize },
    [KILN_FMT_NVFP4] = { nvfp4_quantize, nvfp4_dequantize },
    [KILN_FMT_MXFP4] = { mxfp4_quantize, mxfp4_dequantize },
    [KILN_FMT_Q8_0] = { kiln_quant_q8_0_quantize, kiln_quant_q8_0_dequantize },
    [KILN_FMT_Q4_0] = { kiln_quant_q4_0_quantize, kiln_quant_q4_0_dequantize },
    [KILN_FMT_Q4_K] = { kiln_quant_q4_k_quantize, kiln_quant_q4_k_dequantize },
    [KILN_FMT_Q6_K] = { kiln_quant_q6_k_quantize, kiln_quant_q6_k_dequantize },
    [KILN_FMT_GGML_MXFP4] = { kiln_quant_ggml_mxfp4_quantize, kiln_quant_ggml_mxfp4_dequantize },
    [KILN_FMT_Q5_0] = { kiln_quant_q5_0_quantize, kiln_quant_q5_0_dequantize },
    [KILN_FMT_Q5_1] = { kiln_quant_q5_1_quantize, kiln_quant_q5_1_dequantize },
    [KILN_FMT_Q2_K] = { kiln_quant_q2_k_quantize, kiln_quant_q2_k_dequantize },
    [KILN_FMT_Q3_K] = { kiln_quant_q3_k_quantize, kiln_quant_q3_k_dequantize },
    [KILN_FMT_Q5_K] = { kiln_quant_q5_k_quantize, kiln_quant_q5_k_dequantize },
    [KILN_FMT_IQ4_NL] = { kiln_quant_iq4_nl_quantize, kiln_quant_iq4_nl_dequantize },
    [KILN_FMT_IQ4_XS] = { kiln_quant_iq4_xs_quantize, kiln_quant_iq4_xs_dequantize },
    [KILN_FMT_Q4_1] = { kiln_quant_q4_1_quantize, kiln_quant_q4_1_dequantize },
    [KILN_FMT_INT4_GROUP] = { kiln_quant_int_group_quantize, kiln_quant_int_group_dequantize },
    [KILN_FMT_INT4_GROUP_ZP] = { kiln_quant_int_group_quantize, kiln_quant_int_group_dequantize },
    [KILN_FMT_INT8_GROUP] = { kiln_quant_int_group_quantize, kiln_quant_int_group_dequantize },
    [KILN_FMT_INT8_GROUP_ZP] = { kiln_quant_int_group_quantize, kiln_quant_int_group_dequantize },
};
_Static_assert(KILN_ARRAY_LEN(quant_table) == KILN_FMT_COUNT, "one quant_ops row per kiln_format");

/* Everything both directions need: a descriptor of a known format, a shape
 * the format accepts, the f32 side and the data (and scale) pointers. */
static kiln_status check_qtensor(const char *fn, const kiln_qtensor *t, const float *f32_side,
                                 const char *f32_name)
{
    if (!t)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: the tensor descriptor must not be NULL", fn);
    const kiln_format_info *fi = kiln_format_get(t->format);
    if (!fi)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: format %d is not a kiln_format", fn, (int)t->format);
    size_t bytes, elems;
    kiln_status st = kiln_format_data_bytes(t->format, t->n, t->k, &bytes);
    if (st == KILN_OK)
        st = kiln_qtensor_scale_bytes(t, &bytes);
    if (st != KILN_OK)
        return kiln_fail_prefix(st, "%s", fn);
    if (!kiln_mul_size((size_t)t->n, (size_t)t->k, &elems) || !kiln_mul_size(elems, sizeof(float), &bytes))
        return kiln_fail(KILN_ERR_SHAPE, "%s: %s: %s of [N=%lld, K=%lld] floats overflows size_t", fn, fi->name,
                         f32_name, (long long)t->n, (long long)t->k);
    if (!f32_side)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: %s: %s must not be NULL", fn, fi->name, f32_name);
    if (!t->data)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: %s: data must not be NULL", fn, fi->name);
    if (fi->scale_type != KILN_SCALE_NONE && !t->scale)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: %s: scale must not be NULL (%s)", fn, fi->name,
                         fi->scale_desc);
    return KILN_OK;
}

kiln_status kiln_quantize(const float *src, kiln_qtensor *t)
{
    kiln_status st = check_qtensor("kiln_quantize", t, src, "src");
    if (st != KILN_OK)
        return st;
    quant_table[t->format].quantize(src, t);
    return KILN_OK;
}

kiln_status kiln_dequantize(const kiln_qtensor *t, float *dst)
{
    kiln_status st = check_qtensor("kiln_dequantize", t, dst, "dst");
    if (st != KILN_OK)
        return st;
    quant_table[t->format].dequantize(t, dst);
    return KILN_OK;
}
