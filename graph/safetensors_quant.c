/* The quantization conventions of Hugging Face checkpoints: the settings in
 * quantization_config (or hf_quant_config.json), and the joining of each
 * quantized weight with its scale tensors into one kiln weight. The
 * container (safetensors.c) has already checked every tensor's dtype, shape
 * and bytes; what is checked here is how the tensors fit together. */
#include "graph/safetensors_impl.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The only FP8 block and NVFP4 group kiln's formats define. */
#define ST_FP8_BLOCK 128
#define ST_NVFP4_GROUP 16
#define ST_MXFP4_BLOCK 32

/* The two spellings of gpt-oss's MXFP4 pair: Hugging Face's and the original
 * checkpoint's. */
static const struct st_mx_suffix {
    const char *blocks, *scales;
} st_mx_suffixes[] = {
    { "_blocks", "_scales" },
    { ".blocks", ".scales" },
};

/* Mark slot unusable and say why (replacing an earlier reason). */
static kiln_status st_refuse(kiln_st_slot *s, const char *fmt, ...) KILN_PRINTF(2, 3);
static kiln_status st_refuse(kiln_st_slot *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *why = kiln_st_vstrdupf(fmt, ap);
    va_end(ap);
    if (!why)
        return kiln_st_nomem();
    free(s->t.why);
    s->t.why = why;
    s->t.supported = 0;
    return KILN_OK;
}

static void st_shape_str(const kiln_st_slot *s, char *buf, size_t len)
{
    size_t at = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < s->rank && i < KILN_ST_MAX_DIMS && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%" PRId64, i ? ", " : "", s->shape[i]);
    if (at < len)
        snprintf(buf + at, len - at, "]");
}

static int64_t st_numel(const kiln_st_slot *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->rank && i < KILN_ST_MAX_DIMS; i++)
        n *= s->shape[i];
    return n;
}

/* ceil(a / b) without the overflow of (a + b - 1) / b. */
static int64_t st_ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

/* ------------------------------------------------- quantization settings */

kiln_status kiln_st_parse_quant(kiln_st_loader *L, const char *file, const json_t *q)
{
    if (!json_is_object(q))
        return kiln_fail(KILN_ERR_MALFORMED, "%s: the quantization settings are not a JSON object", file);
    const json_t *method = json_object_get(q, "quant_method");
    const json_t *algo = json_object_get(q, "quant_algo");
    if ((method && !json_is_string(method)) || (algo && !json_is_string(algo)))
        return kiln_fail(KILN_ERR_MALFORMED, "%s: quant_method / quant_algo is not a string", file);
    if (method && !strcasecmp(json_string_value(method), "compressed-tensors"))
        return kiln_st_ct_parse(L, file, q);
    if (method && !strcasecmp(json_string_value(method), "fp8")) {
        const json_t *scheme = json_object_get(q, "activation_scheme");
        if (scheme && !json_is_null(scheme) &&
            (!json_is_string(scheme) || (strcmp(json_string_value(scheme), "static") &&
                                         strcmp(json_string_value(scheme), "dynamic"))))
            return kiln_fail(KILN_ERR_MALFORMED,
                             "%s: activation_scheme is not \"static\" or \"dynamic\"", file);
        if (json_is_string(scheme) && !strcmp(json_string_value(scheme), "static")) {
            L->q.act_static = 1;
            snprintf(L->q.act_static_why, sizeof L->q.act_static_why,
                     "activation_scheme \"static\" in %s", file);
        }
        const json_t *wbs = json_object_get(q, "weight_block_size");
        if (wbs && !json_is_null(wbs)) {
            const json_t *r = json_array_get(wbs, 0), *c = json_array_get(wbs, 1);
            if (json_array_size(wbs) != 2 || !json_is_integer(r) || !json_is_integer(c) ||
                json_integer_value(r) <= 0 || json_integer_value(c) <= 0)
                return kiln_fail(KILN_ERR_MALFORMED, "%s: weight_block_size is not [rows, cols]", file);
            L->q.block_rows = json_integer_value(r);
            L->q.block_cols = json_integer_value(c);
        }
    }
    L->q.mxfp8 = algo && !strcasecmp(json_string_value(algo), "MXFP8");
    /* ModelOpt's FP8 quantizes activations with a calibrated scale. */
    if (algo && !strcasecmp(json_string_value(algo), "FP8")) {
        L->q.act_static = 1;
        snprintf(L->q.act_static_why, sizeof L->q.act_static_why,
                 "quant_algo \"FP8\" (ModelOpt: static activations) in %s", file);
    }
    if (algo && !strcasecmp(json_string_value(algo), "NVFP4")) {
        const json_t *g = json_object_get(q, "group_size");
        if (g && !json_is_null(g)) {
            if (!json_is_integer(g) || json_integer_value(g) <= 0)
                return kiln_fail(KILN_ERR_MALFORMED, "%s: group_size is not a positive integer", file);
            L->q.nvfp4_group = json_integer_value(g);
        }
    }
    return KILN_OK;
}

/* ------------------------------------------------- quantization conventions */

/* *i is the slot of tensor base + suffix, or -1 when there is none. */
static kiln_status st_find(const kiln_st_loader *L, const char *base, const char *suffix, int *i)
{
    char *name = kiln_st_strdupf("%s%s", base, suffix);
    if (!name)
        return kiln_st_nomem();
    const json_t *at = json_object_get(L->names, name);
    free(name);
    *i = at ? (int)json_integer_value(at) : -1;
    return KILN_OK;
}

static int st_is_scalar(const kiln_st_slot *s) { return s->rank <= 1 && st_numel(s) == 1; }

/* A pointer a reader may load elements of `align` bytes through. safetensors
 * guarantees no alignment, so a tensor at an odd offset is copied once into
 * memory the model owns. */
static kiln_status st_aligned(kiln_st_loader *L, const kiln_st_slot *s, size_t align, void **out)
{
    if ((uintptr_t)s->data % align == 0 || s->t.bytes == 0) {
        *out = (void *)s->data;
        return KILN_OK;
    }
    kiln_st_impl *impl = L->impl;
    void *copy = kiln_malloc(s->t.bytes);
    if (!copy ||
        !kiln_st_grow((void **)&impl->owned, &impl->cap_owned, impl->n_owned + 1, sizeof *impl->owned)) {
        free(copy);
        return kiln_st_nomem();
    }
    memcpy(copy, s->data, s->t.bytes);
    impl->owned[impl->n_owned++] = copy;
    *out = copy;
    return KILN_OK;
}

/* A weight's scales as kiln's format stores them: where, how many bytes,
 * and the tensor they came from (for messages). */
typedef struct st_scales {
    const void *data;
    size_t bytes;
    const kiln_st_slot *from;
} st_scales;

/* The scales of s as they are stored: byte scales (E8M0, UE4M3) need no
 * alignment, and an F32 scale was classified as a plain tensor first, which
 * already gave it an aligned address. */
static st_scales st_scales_as_stored(const kiln_st_slot *s)
{
    const void *p = s->dtype == KILN_ST_F32 ? s->t.qt.data : (const void *)s->data;
    return (st_scales){ .data = p, .bytes = s->t.bytes, .from = s };
}

/* Scales of a format whose scales are F32, from s in whichever dtype the
 * checkpoint ships them: F32 as stored; BF16, F16 and E8M0 (F8_E8M0) into
 * an F32 copy the model owns. Every BF16, F16 and E8M0 value is an F32
 * value (E8M0 0x00 is 2^-127, an F32 subnormal; 0xFF is NaN), so no
 * conversion rounds. 0 in *ok, with w refused, for any other dtype. */
static kiln_status st_scales_f32(kiln_st_loader *L, kiln_st_slot *w, const kiln_st_slot *s,
                                 st_scales *out, int *ok)
{
    *ok = 1;
    if (s->dtype == KILN_ST_F32) {
        *out = st_scales_as_stored(s);
        return KILN_OK;
    }
    if (s->dtype != KILN_ST_BF16 && s->dtype != KILN_ST_F16 && s->dtype != KILN_ST_F8_E8M0) {
        *ok = 0;
        return st_refuse(w, "scale %s is %s: kiln reads these scales as F32, BF16, F16 or F8_E8M0",
                         s->t.name, s->t.type_name);
    }
    size_t n = s->dtype == KILN_ST_F8_E8M0 ? s->t.bytes : s->t.bytes / 2, bytes;
    kiln_st_impl *impl = L->impl;
    if (!kiln_mul_size(n ? n : 1, sizeof(float), &bytes))
        return kiln_st_nomem();
    float *f = kiln_malloc(bytes);
    if (!f || !kiln_st_grow((void **)&impl->owned, &impl->cap_owned, impl->n_owned + 1,
                            sizeof *impl->owned)) {
        free(f);
        return kiln_st_nomem();
    }
    impl->owned[impl->n_owned++] = f;
    if (s->dtype == KILN_ST_F8_E8M0) {
        for (size_t i = 0; i < n; i++)
            f[i] = kiln_e8m0_to_f32(s->data[i]);
    } else if (n) {
        /* A BF16 or F16 tensor was classified as a plain one, aligned. */
        kiln_qtensor q = s->t.qt;
        q.n = 1;
        q.k = (int64_t)n;
        kiln_status st = kiln_dequantize(&q, f);
        if (st)
            return kiln_fail_prefix(st, "%s: tensor %s", s->file, s->t.name);
    }
    *out = (st_scales){ .data = f, .bytes = n * sizeof(float), .from = s };
    return KILN_OK;
}

/* Make w a usable weight of format fmt, [n, k] with its scales (in groups
 * of group along K, for a grouped format), unless kiln's format table
 * refuses the shape (a K its blocks do not divide, an empty tensor). */
static kiln_status st_set_weight_group(kiln_st_slot *w, kiln_format fmt, int64_t n, int64_t k,
                                       int64_t group, st_scales sc, float global)
{
    size_t data_bytes = 0, scale_bytes = 0;
    const kiln_format_info *fi = kiln_format_get(fmt);
    kiln_qtensor q = { .format = fmt, .n = n, .k = k, .group = group };
    kiln_status fst = kiln_format_data_bytes(fmt, n, k, &data_bytes);
    if (!fst)
        fst = kiln_qtensor_scale_bytes(&q, &scale_bytes);
    if (fst)
        return st_refuse(w, "%s [%" PRId64 ", %" PRId64 "]: %s", fi->name, n, k, kiln_last_error());
    /* The callers matched the shapes to the checkpoint convention, which for
     * these formats is kiln's own layout byte for byte; the bytes are
     * compared all the same, because a weight whose shape promises more
     * than the file holds would be read past its end. */
    if (data_bytes != w->t.bytes || scale_bytes != sc.bytes)
        return kiln_fail(KILN_ERR_MALFORMED,
                         "%s: tensor %s: %s [%" PRId64 ", %" PRId64 "] needs %zu data and %zu scale "
                         "bytes, the file holds %zu (%s) and %zu (%s)",
                         w->file, w->t.name, fi->name, n, k, data_bytes, scale_bytes, w->t.bytes,
                         w->t.name, sc.bytes, sc.from->t.name);
    w->t.qt = (kiln_qtensor){
        .format = fmt, .n = n, .k = k, .data = (void *)w->data, .scale = (void *)sc.data,
        .global_scale = global, .group = group
    };
    /* The logical [N, K], not the packed bytes (NVFP4 stores K/2 columns). */
    w->t.ne[0] = k;
    w->t.ne[1] = n;
    w->t.supported = 1;
    free(w->t.why);
    w->t.why = NULL;
    return KILN_OK;
}

static kiln_status st_set_weight(kiln_st_slot *w, kiln_format fmt, int64_t n, int64_t k,
                                 st_scales sc, float global)
{
    return st_set_weight_group(w, fmt, n, k, 0, sc, global);
}

static kiln_status st_shape_error(const kiln_st_slot *w, const kiln_st_slot *s, const char *expect)
{
    char ws[128], ss[128];
    st_shape_str(w, ws, sizeof ws);
    st_shape_str(s, ss, sizeof ss);
    return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: %s %s does not fit weight %s %s: expected %s",
                     s->file, s->t.name, s->t.type_name, ss, w->t.name, ws, expect);
}

static int st_is_e8m0(const kiln_st_slot *s)
{
    return s->dtype == KILN_ST_F8_E8M0 || s->dtype == KILN_ST_U8;
}

/* MXFP8 (ModelOpt): weight F8_E4M3 [N, K] with weight_scale E8M0 [N, K/32],
 * stored as F8_E8M0 or as U8; kiln's MXFP8 keeps the E8M0 bytes as they
 * are. */
static kiln_status st_join_mxfp8(kiln_st_slot *w, kiln_st_slot *s)
{
    int64_t n = w->shape[0], k = w->shape[1];
    if (s->rank != 2 || s->shape[0] != n || k % ST_MXFP4_BLOCK ||
        s->shape[1] != k / ST_MXFP4_BLOCK)
        return st_shape_error(w, s, "[N, K/32] with K a multiple of 32");
    kiln_status st = st_refuse(s, "the scales of MXFP8 weight %s", w->t.name);
    return st ? st : st_set_weight(w, KILN_FMT_MXFP8, n, k, st_scales_as_stored(s), 0);
}

/* The static activation scale of FP8 weight w (base.input_scale), which
 * the settings require: one F32, BF16 or F16 number, read exactly. Zero,
 * negative and non-finite scales are refused whatever allow_nonfinite
 * says: the scale is the grid the activations are quantized on, so the
 * linear computes nothing meaningful with it, and leaving it out would
 * run another model. Where the settings say dynamic activations, an
 * input_scale beside the weight is not read (as vLLM and transformers do:
 * the config decides), and stays listed as a plain tensor. */
static kiln_status st_join_input_scale(kiln_st_loader *L, int wi, const char *base)
{
    int ii = -1;
    kiln_status st = st_find(L, base, ".input_scale", &ii);
    kiln_st_slot *w = &L->v[wi];
    if (st || !L->q.act_static || !w->t.supported)
        return st;
    if (ii < 0)
        return kiln_fail(KILN_ERR_MALFORMED,
                         "%s: linear %s: %s, but there is no tensor %s.input_scale", w->file, base,
                         L->q.act_static_why, base);
    const kiln_st_slot *s = &L->v[ii];
    if (s->dtype != KILN_ST_F32 && s->dtype != KILN_ST_BF16 && s->dtype != KILN_ST_F16)
        return kiln_fail(KILN_ERR_MALFORMED,
                         "%s: tensor %s: %s; a static activation scale is F32, BF16 or F16",
                         s->file, s->t.name, s->t.type_name);
    if (!st_is_scalar(s)) {
        char shape[128];
        st_shape_str(s, shape, sizeof shape);
        return kiln_fail(KILN_ERR_MALFORMED,
                         "%s: tensor %s: shape %s; a static activation scale is one number "
                         "([] or [1]) for linear %s", s->file, s->t.name, shape, base);
    }
    float v;
    if (s->dtype == KILN_ST_F32) {
        memcpy(&v, s->data, sizeof v);
    } else {
        uint16_t h;
        memcpy(&h, s->data, sizeof h);
        v = s->dtype == KILN_ST_BF16 ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h);
    }
    if (!(v > 0.0f) || !isfinite(v * 448.0f))
        return kiln_fail(KILN_ERR_MALFORMED,
                         "%s: tensor %s: %g; a static activation scale must be positive, "
                         "finite and at most %g (448 times it must be finite)", s->file,
                         s->t.name, (double)v, (double)(FLT_MAX / 448.0f));
    w->t.input_scale = v;
    return KILN_OK;
}

/* FP8: weight F8_E4M3 [N, K] with weight_scale (scalar, [N] or [N, 1]; or,
 * when the settings say block or the shape can only be one, [ceil(N/128),
 * ceil(K/128)] as compressed-tensors writes it) or with weight_scale_inv
 * [ceil(N/128), ceil(K/128)]; scales F32, BF16, F16 or F8_E8M0 (UE8M0
 * block scales), read as F32. An E8M0 weight_scale of [N, K/32] is MXFP8. */
static kiln_status st_join_fp8_weight(kiln_st_loader *L, int wi, const char *base)
{
    int si = -1, bi = -1;
    kiln_status st = st_find(L, base, ".weight_scale", &si);
    if (!st)
        st = st_find(L, base, ".weight_scale_inv", &bi);
    if (st)
        return st;
    kiln_st_slot *w = &L->v[wi];
    if (si >= 0 && bi >= 0)
        return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: has both %s and %s", w->file, w->t.name,
                         L->v[si].t.name, L->v[bi].t.name);
    if (si < 0 && bi < 0)
        return st_refuse(w, "F8_E4M3 weight without weight_scale or weight_scale_inv");
    kiln_st_slot *s = &L->v[si >= 0 ? si : bi];
    if (w->rank != 2)
        return st_refuse(w, "F8_E4M3 weight of rank %d: kiln's weights are 2-D", w->rank);
    int64_t n = w->shape[0], k = w->shape[1];
    int64_t br = L->q.block_rows ? L->q.block_rows : ST_FP8_BLOCK;
    int64_t bc = L->q.block_cols ? L->q.block_cols : ST_FP8_BLOCK;
    int tiles = s->rank == 2 && s->shape[0] == st_ceil_div(n, br) &&
                s->shape[1] == st_ceil_div(k, bc);
    int channel = (s->rank == 1 && s->shape[0] == n) ||
                  (s->rank == 2 && s->shape[0] == n && s->shape[1] == 1);
    int mx_shape = s->rank == 2 && s->shape[0] == n && k % ST_MXFP4_BLOCK == 0 &&
                   s->shape[1] == k / ST_MXFP4_BLOCK;
    if (si >= 0 && st_is_e8m0(s) && (L->q.mxfp8 || (!L->q.block_rows && mx_shape)))
        return st_join_mxfp8(w, s);
    st_scales sc;
    int ok;
    if ((st = st_scales_f32(L, w, s, &sc, &ok)) || !ok)
        return st;
    int block = bi >= 0 || (L->q.block_rows ? tiles : tiles && !channel && !st_is_scalar(s));
    if (!block) {
        if (st_is_scalar(s))
            return st_set_weight(w, KILN_FMT_FP8_TENSOR, n, k, sc, 0);
        if (channel)
            return st_set_weight(w, KILN_FMT_FP8_CHANNEL, n, k, sc, 0);
        return st_shape_error(w, s, "[], [1], [N] or [N, 1]");
    }
    if (!tiles) {
        char expect[96];
        snprintf(expect, sizeof expect,
                 "[ceil(N/%" PRId64 "), ceil(K/%" PRId64 ")] = [%" PRId64 ", %" PRId64 "]", br, bc,
                 st_ceil_div(n, br), st_ceil_div(k, bc));
        return st_shape_error(w, s, expect);
    }
    if (br != ST_FP8_BLOCK || bc != ST_FP8_BLOCK)
        return st_refuse(w, "weight_block_size [%" PRId64 ", %" PRId64 "]: kiln's block FP8 is 128x128", br,
                         bc);
    return st_set_weight(w, KILN_FMT_FP8_BLOCK, n, k, sc, 0);
}

/* An FP8 weight and, where the settings say so, its static activation
 * scale. */
static kiln_status st_join_fp8(kiln_st_loader *L, int wi, const char *base)
{
    kiln_status st = st_join_fp8_weight(L, wi, base);
    return st ? st : st_join_input_scale(L, wi, base);
}

/* ModelOpt NVFP4: weight U8 [N, K/2], weight_scale F8_E4M3 [N, K/16],
 * weight_scale_2 f32 scalar (the global scale). */
static kiln_status st_join_nvfp4(kiln_st_loader *L, int wi, const char *base)
{
    int si = -1, gi = -1;
    kiln_status st = st_find(L, base, ".weight_scale", &si);
    if (!st)
        st = st_find(L, base, ".weight_scale_2", &gi);
    if (st)
        return st;
    kiln_st_slot *w = &L->v[wi];
    if (si < 0)
        return KILN_OK;
    kiln_st_slot *s = &L->v[si];
    if (s->dtype != KILN_ST_F8_E4M3)
        return st_refuse(w, "U8 weight with a %s weight_scale: no convention kiln knows", s->t.type_name);
    if (gi < 0)
        return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: NVFP4 weight with %s but no weight_scale_2",
                         w->file, w->t.name, s->t.name);
    const kiln_st_slot *g = &L->v[gi];
    if ((g->dtype != KILN_ST_F32 && g->dtype != KILN_ST_BF16 && g->dtype != KILN_ST_F16) ||
        !st_is_scalar(g))
        return kiln_fail(KILN_ERR_MALFORMED,
                         "%s: tensor %s: global scale of NVFP4 weight %s is not an F32, BF16 "
                         "or F16 scalar", g->file, g->t.name, w->t.name);
    if (w->rank != 2)
        return st_refuse(w, "NVFP4 weight of rank %d: kiln's weights are 2-D", w->rank);
    int64_t group = L->q.nvfp4_group ? L->q.nvfp4_group : ST_NVFP4_GROUP;
    int64_t n = w->shape[0], k;
    if (__builtin_mul_overflow(w->shape[1], 2, &k) || k % group || s->rank != 2 || s->shape[0] != n ||
        s->shape[1] != k / group) {
        char expect[96];
        snprintf(expect, sizeof expect, "[N, K/%" PRId64 "] with K = 2 x %" PRId64 " a multiple of %" PRId64,
                 group, w->shape[1], group);
        return st_shape_error(w, s, expect);
    }
    st = st_refuse(s, "the block scales of NVFP4 weight %s", w->t.name);
    if (st)
        return st;
    if (group != ST_NVFP4_GROUP)
        return st_refuse(w, "NVFP4 group_size %" PRId64 ": kiln's NVFP4 groups are 16", group);
    /* Exact: a BF16 or F16 global scale is an F32 value. */
    float global;
    if (g->dtype == KILN_ST_F32) {
        memcpy(&global, g->data, sizeof global);
    } else {
        uint16_t h;
        memcpy(&h, g->data, sizeof h);
        global = g->dtype == KILN_ST_BF16 ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h);
    }
    return st_set_weight(w, KILN_FMT_NVFP4, n, k, st_scales_as_stored(s), global);
}

/* gpt-oss MXFP4: X_blocks U8 [..., N, K/32, 16] and X_scales E8M0 [..., N,
 * K/32], stored as U8 or F8_E8M0, become weight X. Row n of the blocks,
 * flattened, is kiln's MXFP4 data row:
 * 16 bytes per 32 elements, the even element in the low nibble (the OCP order,
 * which gpt-oss's reference dequantization also uses). */
static kiln_status st_join_mxfp4(kiln_st_loader *L, int bi, const char *base, const char *scale_suffix)
{
    int si = -1;
    kiln_status st = st_find(L, base, scale_suffix, &si);
    if (st)
        return st;
    const kiln_st_slot *b = &L->v[bi];
    if (si < 0 || b->rank > KILN_ST_MAX_DIMS)
        return KILN_OK;
    const kiln_st_slot *s = &L->v[si];
    if (b->dtype != KILN_ST_U8 || !st_is_e8m0(s))
        return KILN_OK;
    int fits = (b->rank == 3 || b->rank == 4) && s->rank == b->rank - 1 && b->shape[b->rank - 1] == 16;
    for (int i = 0; fits && i < s->rank; i++)
        fits = s->shape[i] == b->shape[i];
    if (!fits)
        return st_shape_error(b, s, "blocks [..., N, K/32, 16] with scales [..., N, K/32]");
    if (json_object_get(L->names, base)) {
        const kiln_st_slot *x = &L->v[json_integer_value(json_object_get(L->names, base))];
        return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: MXFP4 weight %s is also stored as tensor %s",
                         b->file, b->t.name, base, x->t.name);
    }
    int64_t e = b->rank == 4 ? b->shape[0] : 1, n = b->shape[b->rank - 3], k;
    if (__builtin_mul_overflow(b->shape[b->rank - 2], ST_MXFP4_BLOCK, &k))
        return st_shape_error(b, s, "K = 32 x groups to fit in 64 bits");

    if (!kiln_st_grow((void **)&L->v, &L->cap, L->n + 1, sizeof *L->v))
        return kiln_st_nomem();
    b = &L->v[bi];
    s = &L->v[si];
    /* A stack of one expert is a plain weight; any other count, none
     * included, keeps its expert dimension. */
    kiln_st_slot x = {
        .dtype = KILN_ST_U8, .rank = e != 1 ? 3 : 2, .data = b->data, .file = b->file, .insert_before = bi
    };
    x.t.name = kiln_strdup(base);
    x.t.type_name = kiln_strdup(b->t.type_name);
    /* json_object_set_new takes ix, even when it fails; nothing else does. */
    json_t *ix = x.t.name && x.t.type_name ? json_integer(L->n) : NULL;
    if (!x.t.name || !x.t.type_name || !ix || json_object_set_new(L->names, base, ix)) {
        kiln_st_tensor_free(&x.t);
        return kiln_st_nomem();
    }
    x.t.n_dims = x.rank;
    x.t.ne[0] = k;
    x.t.ne[1] = n;
    x.t.ne[2] = e;
    x.t.ne[3] = 1;
    x.t.bytes = b->t.bytes;
    L->v[L->n++] = x;
    kiln_st_slot *xs = &L->v[L->n - 1];
    st = st_refuse(&L->v[bi], "the blocks of MXFP4 weight %s", base);
    if (!st)
        st = st_refuse(&L->v[si], "the scales of MXFP4 weight %s", base);
    if (st)
        return st;
    if (e == 0)
        return st_refuse(xs, "a stack of 0 experts [0, %" PRId64 ", %" PRId64 "] holds no weight", n, k);
    if (e > 1)
        return st_refuse(
            xs, "expert tensors are 3-D: [%" PRId64 ", %" PRId64 ", %" PRId64 "], kiln's weights are 2-D", e,
            n, k);
    return st_set_weight(xs, KILN_FMT_MXFP4, n, k, st_scales_as_stored(&L->v[si]), 0);
}

/* Element i of an I64 or I32 tensor. */
static int64_t st_int_at(const kiln_st_slot *s, int64_t i)
{
    if (s->dtype == KILN_ST_I64) {
        int64_t v;
        memcpy(&v, s->data + 8 * i, sizeof v);
        return v;
    }
    int32_t v;
    memcpy(&v, s->data + 4 * i, sizeof v);
    return v;
}

/* Scale i of an F32, BF16 or F16 tensor, exactly. */
static float st_float_at(const kiln_st_slot *s, size_t i)
{
    if (s->dtype == KILN_ST_F32) {
        float f;
        memcpy(&f, s->data + 4 * i, sizeof f);
        return f;
    }
    uint16_t h = (uint16_t)(s->data[2 * i] | s->data[2 * i + 1] << 8);
    return s->dtype == KILN_ST_BF16 ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h);
}

/* A new slot named name, listed just before slot before, for a weight
 * joined from stored tensors; *out is its index. */
static kiln_status st_add_joined(kiln_st_loader *L, const char *name, int before, kiln_st_dtype dtype,
                                 int *out)
{
    const kiln_st_slot *b = &L->v[before];
    if (json_object_get(L->names, name)) {
        const kiln_st_slot *x = &L->v[json_integer_value(json_object_get(L->names, name))];
        return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: weight %s is also stored as tensor %s",
                         b->file, b->t.name, name, x->t.name);
    }
    if (!kiln_st_grow((void **)&L->v, &L->cap, L->n + 1, sizeof *L->v))
        return kiln_st_nomem();
    b = &L->v[before];
    kiln_st_slot x = { .dtype = dtype, .rank = 2, .data = b->data, .file = b->file,
                       .insert_before = before };
    x.t.name = kiln_strdup(name);
    x.t.type_name = kiln_strdup(b->t.type_name);
    /* json_object_set_new takes ix, even when it fails; nothing else does. */
    json_t *ix = x.t.name && x.t.type_name ? json_integer(L->n) : NULL;
    if (!x.t.name || !x.t.type_name || !ix || json_object_set_new(L->names, name, ix)) {
        kiln_st_tensor_free(&x.t);
        return kiln_st_nomem();
    }
    x.t.n_dims = 2;
    x.t.ne[2] = x.t.ne[3] = 1;
    x.t.bytes = b->t.bytes;
    L->v[L->n] = x;
    *out = L->n++;
    return KILN_OK;
}

/* compressed-tensors pack-quantized, int4 or int8 (sc, the scheme of
 * module): weight_packed I32 [N, K * bits / 32] (kiln's data as it is
 * stored), weight_shape I64 or I32 [2] = [N, K], weight_scale F32, BF16 or
 * F16 [N, G] with G = K / group_size (1 per channel, and where group_size
 * is at least K), and when asymmetric weight_zero_point: I32
 * [ceil(N * bits / 32), G], the codes packed along N as pack_to_int32 packs
 * them with packed_dim 0, or I8 [N, G] unpacked, as compressed-tensors
 * stored it before it packed zero points. They become weight module.weight
 * with kiln's scale array: the scales in f32, then the zero points in int8. */
static kiln_status st_join_int(kiln_st_loader *L, int wi, const char *module,
                               const kiln_st_ct_scheme *sc)
{
    int si = -1, zi = -1, hi = -1, gi = -1;
    kiln_status st = st_find(L, module, ".weight_scale", &si);
    if (!st)
        st = st_find(L, module, ".weight_zero_point", &zi);
    if (!st)
        st = st_find(L, module, ".weight_shape", &hi);
    if (!st)
        st = st_find(L, module, ".weight_g_idx", &gi);
    if (st)
        return st;
    kiln_st_slot *w = &L->v[wi];
    const int bits = sc->int_bits, per_word = 32 / bits, half = 1 << (bits - 1);
    char ws[128];
    st_shape_str(w, ws, sizeof ws);
    if (gi >= 0)
        return st_refuse(w, "tensor %s: act-order weights (weight_g_idx) are not applied by kiln",
                         L->v[gi].t.name);
    if (w->dtype != KILN_ST_I32 || w->rank != 2)
        return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: %s %s: pack-quantized codes are I32 "
                         "[N, K * %d / 32]", w->file, w->t.name, w->t.type_name, ws, bits);
    if (si < 0)
        return kiln_fail(KILN_ERR_MALFORMED,
                         "%s: tensor %s: pack-quantized weight without %s.weight_scale", w->file,
                         w->t.name, module);
    if (sc->int_zero_point && zi < 0)
        return kiln_fail(KILN_ERR_MALFORMED,
                         "%s: tensor %s: the config says symmetric: false, but there is no "
                         "%s.weight_zero_point", w->file, w->t.name, module);
    int64_t n = w->shape[0], words = w->shape[1], k;
    if (hi >= 0) {
        const kiln_st_slot *h = &L->v[hi];
        if ((h->dtype != KILN_ST_I64 && h->dtype != KILN_ST_I32) || h->rank != 1 || h->shape[0] != 2)
            return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: %s of rank %d: weight_shape is "
                             "[N, K] in I64 or I32", h->file, h->t.name, h->t.type_name, h->rank);
        k = st_int_at(h, 1);
        if (st_int_at(h, 0) != n || k <= 0 || k > INT64_MAX / bits ||
            st_ceil_div(k * bits, 32) != words)
            return kiln_fail(KILN_ERR_MALFORMED,
                             "%s: tensor %s: weight_shape [%" PRId64 ", %" PRId64 "] does not fit "
                             "weight_packed %s %s, which holds [N, ceil(K * %d / 32)]",
                             h->file, h->t.name, st_int_at(h, 0), st_int_at(h, 1), w->t.name, ws, bits);
    } else if (__builtin_mul_overflow(words, per_word, &k)) {
        return st_shape_error(w, w, "[N, K * bits / 32] with K to fit in 64 bits");
    }
    int zp = sc->int_zero_point;
    kiln_format fmt = bits == 4 ? (zp ? KILN_FMT_INT4_GROUP_ZP : KILN_FMT_INT4_GROUP)
                                : (zp ? KILN_FMT_INT8_GROUP_ZP : KILN_FMT_INT8_GROUP);
    const kiln_format_info *fi = kiln_format_get(fmt);
    int64_t group = sc->int_group, groups = 1;
    if (group > 0 && group < k) {
        if (k % group)
            return kiln_fail(KILN_ERR_MALFORMED,
                             "%s: tensor %s: group_size %" PRId64 " does not divide K = %" PRId64,
                             w->file, w->t.name, group, k);
        groups = k / group;
    } else {
        group = 0;
    }
    kiln_st_slot *s = &L->v[si];
    if (!(s->rank == 2 && s->shape[0] == n && s->shape[1] == groups) &&
        !(groups == 1 && s->rank == 1 && s->shape[0] == n)) {
        char expect[96];
        snprintf(expect, sizeof expect, "[N, K / group_size] = [%" PRId64 ", %" PRId64 "]", n, groups);
        return st_shape_error(w, s, expect);
    }
    if (s->dtype != KILN_ST_F32 && s->dtype != KILN_ST_BF16 && s->dtype != KILN_ST_F16)
        return st_refuse(w, "scale %s is %s: kiln reads these scales as F32, BF16 or F16", s->t.name,
                         s->t.type_name);
    if (k % per_word)
        return st_refuse(w, "%s: K = %" PRId64 " is not a multiple of %d, so its rows do not fill "
                         "whole int32 words", fi->name, k, per_word);
    if (group % fi->block)
        return st_refuse(w, "%s: group_size %" PRId64 " is not a multiple of %d", fi->name, group,
                         fi->block);
    const kiln_st_slot *z = zi >= 0 && zp ? &L->v[zi] : NULL;
    int packed_zp = z && z->dtype == KILN_ST_I32 && z->rank == 2 &&
                    z->shape[0] == st_ceil_div(n, per_word) && z->shape[1] == groups;
    if (z && !packed_zp && !(z->dtype == KILN_ST_I8 && z->rank == 2 && z->shape[0] == n &&
                             z->shape[1] == groups)) {
        char expect[128];
        snprintf(expect, sizeof expect,
                 "I32 [ceil(N / %d), %" PRId64 "] packed along N, or I8 [N, %" PRId64 "]", per_word,
                 groups, groups);
        return st_shape_error(w, z, expect);
    }
    size_t count = (size_t)n * (size_t)groups, bytes;
    if (!kiln_mul_size(count, sizeof(float) + (zp ? 1 : 0), &bytes))
        return st_shape_error(w, s, "a scale array that fits in memory");
    kiln_st_impl *impl = L->impl;
    uint8_t *buf = kiln_malloc(bytes ? bytes : 1);
    if (!buf || !kiln_st_grow((void **)&impl->owned, &impl->cap_owned, impl->n_owned + 1,
                              sizeof *impl->owned)) {
        free(buf);
        return kiln_st_nomem();
    }
    impl->owned[impl->n_owned++] = buf;
    for (size_t i = 0; i < count; i++) {
        float f = st_float_at(s, i);
        memcpy(buf + i * sizeof f, &f, sizeof f);
    }
    for (int64_t r = 0; z && r < n; r++) {
        for (int64_t g = 0; g < groups; g++) {
            int v;
            if (packed_zp) {
                size_t at = 4 * (size_t)((r / per_word) * groups + g);
                uint32_t word = (uint32_t)z->data[at] | (uint32_t)z->data[at + 1] << 8 |
                                (uint32_t)z->data[at + 2] << 16 | (uint32_t)z->data[at + 3] << 24;
                v = (int)((word >> (bits * (r % per_word))) & ((1u << bits) - 1)) - half;
            } else {
                v = (int8_t)z->data[r * groups + g];
                if (v < -half || v >= half)
                    return kiln_fail(KILN_ERR_MALFORMED,
                                     "%s: tensor %s: zero point %" PRId64 " is %d, outside int%d's "
                                     "[%d, %d]", z->file, z->t.name, r * groups + g, v, bits, -half,
                                     half - 1);
            }
            buf[count * sizeof(float) + (size_t)(r * groups + g)] = (uint8_t)(int8_t)v;
        }
    }
    char *name = kiln_st_strdupf("%s.weight", module);
    int xi = -1;
    if (!name)
        return kiln_st_nomem();
    st = st_add_joined(L, name, wi, KILN_ST_I32, &xi);
    free(name);
    const int parts[] = { wi, si, zi, hi };
    for (size_t i = 0; !st && i < KILN_ARRAY_LEN(parts); i++)
        if (parts[i] >= 0)
            st = st_refuse(&L->v[parts[i]], "part of %s weight %s", fi->name, L->v[xi].t.name);
    if (st)
        return st;
    return st_set_weight_group(&L->v[xi], fmt, n, k, group,
                               (st_scales){ .data = buf, .bytes = bytes, .from = &L->v[si] }, 0);
}

/* Every stored tensor on its own: plain float types are usable as they are;
 * the rest wait for a convention to claim them. */
static kiln_status st_classify(kiln_st_loader *L, kiln_st_slot *s)
{
    if (s->dtype == KILN_ST_DTYPE_COUNT)
        return st_refuse(s, "dtype %s is not a safetensors dtype kiln knows", s->t.type_name);
    const kiln_st_dtype_info *d = &kiln_st_dtypes[s->dtype];
    if (s->rank > KILN_ST_MAX_DIMS)
        return st_refuse(s, "rank %d: kiln's tensors have at most 4 dims", s->rank);
    if (!d->raw)
        return st_refuse(s, "dtype %s is not supported", d->name);
    if (!d->plain)
        return st_refuse(s, "%s tensor outside any quantization convention kiln recognises", d->name);
    int64_t k = s->rank ? s->shape[s->rank - 1] : 1, n = 1;
    for (int i = 0; i + 1 < s->rank; i++)
        n *= s->shape[i];
    void *data = NULL;
    kiln_status st = st_aligned(L, s, (size_t)d->bits / 8, &data);
    if (st)
        return st;
    s->t.supported = 1;
    s->t.qt = (kiln_qtensor){ .format = d->format, .n = n, .k = k, .data = data };
    return KILN_OK;
}

/* A compressed-tensors checkpoint: the weight of module under the scheme
 * its config gives it. A scheme kiln has no format for refuses the weight
 * (and its weight_packed) with the config field that asks for it. */
static kiln_status st_join_ct(kiln_st_loader *L, int wi, const char *module, int *handled)
{
    kiln_st_ct_scheme sc;
    kiln_st_slot *w = &L->v[wi];
    kiln_status st = kiln_st_ct_lookup(L, module, &sc);
    *handled = 1;
    if (st)
        return st;
    if (sc.kind == KILN_ST_CT_UNSUPPORTED)
        return st_refuse(w, "%s", sc.why);
    if (sc.kind == KILN_ST_CT_INT && kiln_st_ends_with(w->t.name, ".weight_packed"))
        return st_join_int(L, wi, module, &sc);
    if (w->dtype != KILN_ST_F8_E4M3 || !kiln_st_ends_with(w->t.name, ".weight")) {
        *handled = 0;
        return KILN_OK;
    }
    if (sc.kind == KILN_ST_CT_IGNORED)
        return kiln_fail(KILN_ERR_MALFORMED,
                         "%s: tensor %s is F8_E4M3, but quantization_config.ignore in %s lists "
                         "module %s as left unquantized", w->file, w->t.name, L->ct_file, module);
    kiln_st_quant keep = L->q;
    L->q.block_rows = sc.block_rows;
    L->q.block_cols = sc.block_cols;
    L->q.mxfp8 = sc.mxfp8;
    L->q.act_static = sc.act_static;
    snprintf(L->q.act_static_why, sizeof L->q.act_static_why,
             "quantization_config.config_groups.%s.input_activations.dynamic is false in %s",
             sc.group, L->ct_file);
    st = st_join_fp8(L, wi, module);
    L->q = keep;
    return st;
}

kiln_status kiln_st_join_all(kiln_st_loader *L)
{
    kiln_status st = KILN_OK;
    for (int i = 0; i < L->n && !st; i++)
        st = st_classify(L, &L->v[i]);
    L->n_stored = L->n;
    for (int i = 0; i < L->n_stored && !st; i++) {
        const char *name = L->v[i].t.name;
        size_t len = strlen(name);
        char *base = NULL;
        static const char *ct_suffixes[] = { ".weight", ".weight_packed" };
        /* A float tensor is stored as it is used, whatever a group targets. */
        int stored_quantized = L->v[i].dtype == KILN_ST_DTYPE_COUNT ||
                               !kiln_st_dtypes[L->v[i].dtype].plain;
        for (size_t j = 0; j < KILN_ARRAY_LEN(ct_suffixes) && L->ct && stored_quantized && !base;
             j++) {
            if (!kiln_st_ends_with(name, ct_suffixes[j]))
                continue;
            if (!(base = kiln_strndup(name, len - strlen(ct_suffixes[j]))))
                return kiln_st_nomem();
            int handled;
            st = st_join_ct(L, i, base, &handled);
            if (!handled) {
                free(base);
                base = NULL;
                break;
            }
        }
        if (!base && kiln_st_ends_with(name, ".weight") &&
            (L->v[i].dtype == KILN_ST_F8_E4M3 || L->v[i].dtype == KILN_ST_U8)) {
            if (!(base = kiln_strndup(name, len - strlen(".weight"))))
                return kiln_st_nomem();
            st = L->v[i].dtype == KILN_ST_F8_E4M3 ? st_join_fp8(L, i, base) : st_join_nvfp4(L, i, base);
        }
        for (size_t j = 0; j < KILN_ARRAY_LEN(st_mx_suffixes) && !base; j++) {
            if (!kiln_st_ends_with(name, st_mx_suffixes[j].blocks))
                continue;
            if (!(base = kiln_strndup(name, len - strlen(st_mx_suffixes[j].blocks))))
                return kiln_st_nomem();
            st = st_join_mxfp4(L, i, base, st_mx_suffixes[j].scales);
        }
        free(base);
    }
    return st;
}
