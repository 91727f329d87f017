#include <criterion/criterion.h>
#include <dirent.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graph/safetensors.h"
#include "testutil.h"

/* ------------------------------------------------------------ file builder */

/* A safetensors file under construction: header entries as JSON text, the
 * data section as bytes. Offsets are assigned in the order of the calls. */
typedef struct stb {
    char hdr[32768];
    size_t hlen;
    uint8_t data[1 << 17];
    size_t dlen;
} stb;

static stb *stb_new(void)
{
    stb *b = calloc(1, sizeof *b);
    cr_assert(b);
    return b;
}

static void stb_entry(stb *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (b->hlen)
        b->hdr[b->hlen++] = ',';
    int n = vsnprintf(b->hdr + b->hlen, sizeof b->hdr - b->hlen, fmt, ap);
    va_end(ap);
    cr_assert(n > 0 && (size_t)n < sizeof b->hdr - b->hlen);
    b->hlen += (size_t)n;
}

/* Append a tensor whose data_offsets cover `n` new bytes. */
static void stb_tensor(stb *b, const char *name, const char *dtype, const char *shape, const void *bytes,
                       size_t n)
{
    cr_assert(b->dlen + n <= sizeof b->data);
    stb_entry(b, "\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}", name, dtype, shape,
              b->dlen, b->dlen + n);
    memcpy(b->data + b->dlen, bytes, n);
    b->dlen += n;
}

/* The file's bytes; `pad` spaces after the JSON shift the data section, which
 * is how a test puts a tensor at an address its element type cannot use. */
static uint8_t *stb_bytes(const stb *b, size_t pad, size_t *len)
{
    size_t hl = b->hlen + 2 + pad;
    *len = 8 + hl + b->dlen;
    uint8_t *f = malloc(*len);
    cr_assert(f);
    for (int i = 0; i < 8; i++)
        f[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    f[8] = '{';
    memcpy(f + 9, b->hdr, b->hlen);
    f[9 + b->hlen] = '}';
    memset(f + 10 + b->hlen, ' ', pad);
    memcpy(f + 8 + hl, b->data, b->dlen);
    return f;
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

static void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

static void stb_write(const stb *b, const char *path, size_t pad)
{
    size_t len;
    uint8_t *f = stb_bytes(b, pad, &len);
    write_bytes(path, f, len);
    free(f);
}

/* With the data section at a multiple of 8 in the file (so the tensors'
 * addresses in the mapping follow their offsets). */
static void stb_write_aligned(const stb *b, const char *path)
{
    stb_write(b, path, (8 - (10 + b->hlen) % 8) % 8);
}

/* ---------------------------------------------------------- test scaffold */

static char g_dir[64];

static void dir_setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/kiln-st-XXXXXX");
    cr_assert(mkdtemp(g_dir));
}

static void dir_teardown(void)
{
    DIR *d = opendir(g_dir);
    if (!d)
        return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(g_dir);
}

TestSuite(safetensors, .init = dir_setup, .fini = dir_teardown);

/* A path in the test's directory (one of a few rotating buffers). */
static const char *in_dir(const char *name)
{
    static char buf[4][512];
    static int at;
    char *p = buf[at++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", g_dir, name);
    return p;
}

static kiln_model *open_ok(const char *path)
{
    kiln_model *m = NULL;
    kiln_status st = kiln_safetensors_open(path, &m);
    cr_assert_eq(st, KILN_OK, "%s: %s", kiln_strerror(st), kiln_last_error());
    cr_assert(m);
    return m;
}

/* Opening fails with `want`, and the message holds every string given
 * (a NULL ends the list). */
static void open_fails(const char *path, kiln_status want, ...)
{
    kiln_model *m = (kiln_model *)&m;
    kiln_status st = kiln_safetensors_open(path, &m);
    cr_assert_eq(st, want, "got %s: %s", kiln_strerror(st), kiln_last_error());
    cr_assert_eq(m, (kiln_model *)&m, "out untouched on failure");
    va_list ap;
    va_start(ap, want);
    for (const char *s; (s = va_arg(ap, const char *));)
        cr_assert(strstr(kiln_last_error(), s), "message \"%s\" lacks \"%s\"", kiln_last_error(), s);
    va_end(ap);
}

static const kiln_model_tensor *find(const kiln_model *m, const char *name)
{
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name))
            return &m->tensors[i];
    cr_assert_fail("no tensor %s", name);
    return NULL;
}

static int index_of(const kiln_model *m, const char *name) { return (int)(find(m, name) - m->tensors); }

static void random_bytes(kt_rng *r, uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)kt_next(r);
}

/* E4M3 codes that are finite (0x7F and 0xFF are NaN). */
static void random_e4m3(kt_rng *r, uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        p[i] = (uint8_t)kt_next(r);
        if ((p[i] & 0x7F) == 0x7F)
            p[i] ^= 1;
    }
}

static void random_f32(kt_rng *r, float *p, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        p[i] = kt_uniform(r, lo, hi);
}

static float *dequantize(const kiln_qtensor *qt)
{
    float *out = malloc(sizeof(float) * (size_t)(qt->n * qt->k));
    cr_assert(out);
    kiln_status st = kiln_dequantize(qt, out);
    cr_assert_eq(st, KILN_OK, "%s", kiln_last_error());
    return out;
}

/* ----------------------------------------------------------------- valid */

Test(safetensors, single_file_lists_tensors_in_storage_order)
{
    kt_rng r = kt_rng_new(1);
    float w[6];
    uint16_t h[4], bf[4];
    int64_t ids[3] = { 7, -1, 1 << 20 };
    random_f32(&r, w, 6, -2, 2);
    for (int i = 0; i < 4; i++) {
        h[i] = kiln_f32_to_f16(kt_normal(&r));
        bf[i] = kiln_f32_to_bf16(kt_normal(&r));
    }
    stb *b = stb_new();
    stb_entry(b, "\"__metadata__\":{\"format\":\"pt\"}");
    stb_tensor(b, "z.half", "F16", "[4]", h, sizeof h);
    stb_tensor(b, "a.weight", "F32", "[2, 3]", w, sizeof w);
    stb_tensor(b, "m.bf16", "BF16", "[1, 2, 2]", bf, sizeof bf);
    stb_tensor(b, "ids", "I64", "[3]", ids, sizeof ids);
    stb_write(b, in_dir("one.safetensors"), 6);
    free(b);

    kiln_model *m = open_ok(in_dir("one.safetensors"));
    cr_assert_str_eq(m->container, "safetensors");
    cr_assert_str_eq(m->path, in_dir("one.safetensors"));
    cr_assert_str_eq(m->hp.arch, "");
    cr_assert_eq(m->hp.n_layers, 0);
    cr_assert_eq(m->n_tensors, 4);
    const char *order[] = { "z.half", "a.weight", "m.bf16", "ids" };
    for (int i = 0; i < 4; i++)
        cr_assert_str_eq(m->tensors[i].name, order[i]);

    const kiln_model_tensor *a = find(m, "a.weight");
    cr_assert(a->supported);
    cr_assert_str_eq(a->type_name, "F32");
    cr_assert_eq(a->qt.format, KILN_FMT_F32);
    cr_assert_eq(a->n_dims, 2);
    cr_assert_eq(a->ne[0], 3);
    cr_assert_eq(a->ne[1], 2);
    cr_assert_eq(a->ne[2], 1);
    cr_assert_eq(a->qt.n, 2);
    cr_assert_eq(a->qt.k, 3);
    cr_assert_eq(a->bytes, sizeof w);
    cr_assert_eq(memcmp(a->qt.data, w, sizeof w), 0);

    const kiln_model_tensor *z = find(m, "z.half");
    cr_assert_eq(z->qt.format, KILN_FMT_F16);
    cr_assert_eq(z->n_dims, 1);
    cr_assert_eq(z->qt.n, 1);
    cr_assert_eq(z->qt.k, 4);
    cr_assert_eq(memcmp(z->qt.data, h, sizeof h), 0);

    const kiln_model_tensor *mb = find(m, "m.bf16");
    cr_assert_eq(mb->qt.format, KILN_FMT_BF16);
    cr_assert_eq(mb->n_dims, 3);
    cr_assert_eq(mb->ne[0], 2);
    cr_assert_eq(mb->ne[1], 2);
    cr_assert_eq(mb->ne[2], 1);
    cr_assert_eq(mb->qt.n, 2);
    cr_assert_eq(mb->qt.k, 2);

    const kiln_model_tensor *ids_t = find(m, "ids");
    cr_assert_not(ids_t->supported);
    cr_assert_str_eq(ids_t->type_name, "I64");
    cr_assert(strstr(ids_t->why, "I64"), "%s", ids_t->why);
    kiln_model_close(m);
}

Test(safetensors, directory_reads_config_json)
{
    float w[4] = { 1, 2, 3, 4 };
    stb *b = stb_new();
    stb_tensor(b, "w", "F32", "[2, 2]", w, sizeof w);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    write_text(in_dir("config.json"),
               "{\"architectures\": [\"LlamaForCausalLM\"], \"num_hidden_layers\": 2, \"hidden_size\": 64,\n"
               " \"intermediate_size\": 160, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,\n"
               " \"vocab_size\": 1000, \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-05,\n"
               " \"torch_dtype\": \"bfloat16\", \"rope_scaling\": null}");

    kiln_model *m = open_ok(g_dir);
    cr_assert_str_eq(m->hp.arch, "LlamaForCausalLM");
    cr_assert_eq(m->hp.n_layers, 2);
    cr_assert_eq(m->hp.d_model, 64);
    cr_assert_eq(m->hp.d_ffn, 160);
    cr_assert_eq(m->hp.n_heads, 4);
    cr_assert_eq(m->hp.n_kv_heads, 2);
    cr_assert_eq(m->hp.vocab, 1000);
    cr_assert_eq(m->hp.ctx, 4096);
    cr_assert_float_eq(m->hp.rms_eps, 1e-5f, 1e-12);
    cr_assert_eq(m->n_tensors, 1);
    kiln_model_close(m);

    /* The file itself finds its directory's config.json too. */
    m = open_ok(in_dir("model.safetensors"));
    cr_assert_eq(m->hp.d_model, 64);
    kiln_model_close(m);
}

static void write_two_shards(void)
{
    float a[2] = { 1, 2 }, c[3] = { 3, 4, 5 };
    uint16_t bb[2] = { 0x3f80, 0x4000 };
    stb *b = stb_new();
    stb_tensor(b, "layers.0.a", "F32", "[2]", a, sizeof a);
    stb_tensor(b, "layers.0.b", "BF16", "[2]", bb, sizeof bb);
    stb_write(b, in_dir("model-00001-of-00002.safetensors"), 0);
    free(b);
    b = stb_new();
    stb_tensor(b, "layers.1.c", "F32", "[3]", c, sizeof c);
    stb_write(b, in_dir("model-00002-of-00002.safetensors"), 0);
    free(b);
}

Test(safetensors, sharded_index_maps_each_shard_once)
{
    write_two_shards();
    write_text(in_dir("model.safetensors.index.json"),
               "{\"metadata\": {\"total_size\": 20}, \"weight_map\": {\n"
               "  \"layers.0.a\": \"model-00001-of-00002.safetensors\",\n"
               "  \"layers.1.c\": \"model-00002-of-00002.safetensors\",\n"
               "  \"layers.0.b\": \"model-00001-of-00002.safetensors\"}}");
    write_text(in_dir("config.json"), "{\"num_hidden_layers\": 2}");
    kiln_model *m = open_ok(g_dir);
    cr_assert_str_eq(m->container, "safetensors (2 shards)");
    cr_assert_eq(m->hp.n_layers, 2);
    cr_assert_eq(m->n_tensors, 3);
    cr_assert_str_eq(m->tensors[0].name, "layers.0.a");
    cr_assert_str_eq(m->tensors[1].name, "layers.0.b");
    cr_assert_str_eq(m->tensors[2].name, "layers.1.c");
    cr_assert_eq(((const float *)find(m, "layers.1.c")->qt.data)[2], 5.0f);
    kiln_model_close(m);

    m = open_ok(in_dir("model.safetensors.index.json"));
    cr_assert_eq(m->n_tensors, 3);
    kiln_model_close(m);
}

Test(safetensors, misaligned_tensors_are_copied_to_aligned_memory)
{
    kt_rng r = kt_rng_new(2);
    uint8_t one = 1;
    float w[8], scale[4];
    uint8_t q[4 * 16];
    random_f32(&r, w, 8, -1, 1);
    random_f32(&r, scale, 4, 0.01f, 1);
    random_e4m3(&r, q, sizeof q);
    stb *b = stb_new();
    stb_tensor(b, "odd", "U8", "[1]", &one, 1);
    stb_tensor(b, "w", "F32", "[2, 4]", w, sizeof w);
    stb_tensor(b, "x.weight", "F8_E4M3", "[4, 16]", q, sizeof q);
    stb_tensor(b, "y", "U8", "[1]", &one, 1);
    stb_tensor(b, "x.weight_scale", "F32", "[4]", scale, sizeof scale);
    stb_write_aligned(b, in_dir("m.safetensors"));
    free(b);

    kiln_model *m = open_ok(in_dir("m.safetensors"));
    const kiln_model_tensor *t = find(m, "w");
    cr_assert_eq((uintptr_t)t->qt.data % 4, 0);
    cr_assert_eq(memcmp(t->qt.data, w, sizeof w), 0);
    const kiln_model_tensor *x = find(m, "x.weight");
    cr_assert(x->supported, "%s", x->why);
    cr_assert_eq(x->qt.format, KILN_FMT_FP8_CHANNEL);
    cr_assert_eq((uintptr_t)x->qt.scale % 4, 0);
    cr_assert_eq(memcmp(x->qt.scale, scale, sizeof scale), 0);
    float *d = dequantize(&x->qt);
    for (int i = 0; i < 64; i++)
        cr_assert_eq(d[i], kiln_e4m3_to_f32(q[i]) * scale[i / 16], "element %d", i);
    free(d);
    kiln_model_close(m);
}

/* --------------------------------------------------- quantized conventions */

Test(safetensors, fp8_per_tensor_with_input_scale)
{
    kt_rng r = kt_rng_new(3);
    uint8_t q[8 * 32];
    float s = kt_uniform(&r, 0.001f, 0.1f), in = kt_uniform(&r, 0.01f, 1);
    random_e4m3(&r, q, sizeof q);
    stb *b = stb_new();
    stb_tensor(b, "l.weight", "F8_E4M3", "[8, 32]", q, sizeof q);
    stb_tensor(b, "l.weight_scale", "F32", "[]", &s, 4);
    stb_tensor(b, "l.input_scale", "F32", "[1]", &in, 4);
    stb_write(b, in_dir("model.safetensors"), 2);
    free(b);
    write_text(in_dir("config.json"), "{\"quantization_config\": {\"quant_method\": \"fp8\","
                                      " \"activation_scheme\": \"static\"}}");

    kiln_model *m = open_ok(g_dir);
    cr_assert_eq(m->n_tensors, 3);
    const kiln_model_tensor *w = find(m, "l.weight");
    cr_assert(w->supported, "%s", w->why);
    cr_assert_str_eq(w->type_name, "F8_E4M3");
    cr_assert_eq(w->qt.format, KILN_FMT_FP8_TENSOR);
    cr_assert_eq(w->qt.n, 8);
    cr_assert_eq(w->qt.k, 32);
    cr_assert_eq(*(const float *)w->qt.scale, s);
    cr_assert_eq(memcmp(w->qt.data, q, sizeof q), 0);
    float *d = dequantize(&w->qt);
    for (int i = 0; i < 8 * 32; i++)
        cr_assert_eq(d[i], kiln_e4m3_to_f32(q[i]) * s, "element %d", i);
    free(d);
    const kiln_model_tensor *is = find(m, "l.input_scale");
    cr_assert(is->supported);
    cr_assert_eq(is->qt.format, KILN_FMT_F32);
    cr_assert_eq(*(const float *)is->qt.data, in);
    cr_assert_eq(w->input_scale, in, "activation_scheme static: the weight carries it");
    cr_assert(find(m, "l.weight_scale")->supported);
    kiln_model_close(m);

    /* The config decides: with dynamic activations it is not read. */
    write_text(in_dir("config.json"), "{\"quantization_config\": {\"quant_method\": \"fp8\","
                                      " \"activation_scheme\": \"dynamic\"}}");
    m = open_ok(g_dir);
    cr_assert_eq(find(m, "l.weight")->input_scale, 0.0f);
    cr_assert(find(m, "l.input_scale")->supported, "still listed as a plain tensor");
    kiln_model_close(m);
    write_text(in_dir("config.json"), "{\"quantization_config\": {\"quant_method\": \"fp8\","
                                      " \"activation_scheme\": \"per-token\"}}");
    open_fails(g_dir, KILN_ERR_MALFORMED, "config.json", "activation_scheme", NULL);
}

/* One FP8 linear l [4, 32] with input_scale of dtype and shape as given,
 * under config (config.json, or hf_quant_config.json when modelopt). */
static void write_static_fp8(const char *dtype, const char *shape, const void *in, size_t in_bytes,
                             const char *config, int modelopt)
{
    static uint8_t q[4 * 32];
    float s = 0.03125f;
    for (size_t i = 0; i < sizeof q; i++)
        q[i] = (uint8_t)(i * 7 % 0x7E);
    stb *b = stb_new();
    stb_tensor(b, "model.layers.0.mlp.up_proj.weight", "F8_E4M3", "[4, 32]", q, sizeof q);
    stb_tensor(b, "model.layers.0.mlp.up_proj.weight_scale", "F32", "[]", &s, 4);
    if (dtype)
        stb_tensor(b, "model.layers.0.mlp.up_proj.input_scale", dtype, shape, in, in_bytes);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    remove(in_dir("config.json"));
    remove(in_dir("hf_quant_config.json"));
    write_text(in_dir(modelopt ? "hf_quant_config.json" : "config.json"), config);
}

#define FP8_STATIC "{\"quantization_config\": {\"quant_method\": \"fp8\", " \
                   "\"activation_scheme\": \"static\"}}"
#define MODELOPT_FP8 "{\"producer\": {\"name\": \"modelopt\"}, \"quantization\": " \
                     "{\"quant_algo\": \"FP8\", \"kv_cache_quant_algo\": null}}"
#define CT_STATIC(dynamic)                                                                          \
    "{\"quantization_config\": {\"quant_method\": \"compressed-tensors\", "                   \
    "\"format\": \"float-quantized\", \"config_groups\": {\"group_0\": {\"targets\": "      \
    "[\"Linear\"], \"weights\": {\"num_bits\": 8, \"type\": \"float\", "                   \
    "\"symmetric\": true, \"strategy\": \"tensor\", \"dynamic\": false}, "                   \
    "\"input_activations\": {\"num_bits\": 8, \"type\": \"float\", \"symmetric\": true, "  \
    "\"strategy\": \"tensor\", \"dynamic\": " dynamic "}}}, \"ignore\": [\"lm_head\"]}}"

/* The three conventions that say static activations, each with the scale
 * in F32, BF16 and F16: read exactly onto the weight. */
Test(safetensors, static_input_scale_of_every_convention_and_dtype)
{
    static const struct {
        const char *config;
        int modelopt;
    } conv[] = { { FP8_STATIC, 0 }, { MODELOPT_FP8, 1 }, { CT_STATIC("false"), 0 } };
    const float f32 = 0.0123456789f;
    const uint16_t bf16 = kiln_f32_to_bf16(0.0371f), f16 = kiln_f32_to_f16(0.0371f);
    for (size_t c = 0; c < KILN_ARRAY_LEN(conv); c++) {
        const struct {
            const char *dtype, *shape;
            const void *p;
            size_t bytes;
            float want;
        } in[] = {
            { "F32", "[]", &f32, 4, f32 },
            { "F32", "[1]", &f32, 4, f32 },
            { "BF16", "[1]", &bf16, 2, kiln_bf16_to_f32(bf16) },
            { "F16", "[]", &f16, 2, kiln_f16_to_f32(f16) },
        };
        for (size_t i = 0; i < KILN_ARRAY_LEN(in); i++) {
            write_static_fp8(in[i].dtype, in[i].shape, in[i].p, in[i].bytes, conv[c].config,
                             conv[c].modelopt);
            kiln_model *m = open_ok(g_dir);
            const kiln_model_tensor *w = find(m, "model.layers.0.mlp.up_proj.weight");
            cr_assert(w->supported, "%s", w->why);
            cr_assert_eq(w->qt.format, KILN_FMT_FP8_TENSOR);
            cr_assert_eq(w->input_scale, in[i].want, "convention %zu, %s %s: %g", c, in[i].dtype,
                         in[i].shape, (double)w->input_scale);
            kiln_model_close(m);
        }
    }
    /* compressed-tensors with dynamic activations: a stray scale is not read. */
    write_static_fp8("F32", "[]", &f32, 4, CT_STATIC("true"), 0);
    kiln_model *m = open_ok(g_dir);
    cr_assert_eq(find(m, "model.layers.0.mlp.up_proj.weight")->input_scale, 0.0f);
    kiln_model_close(m);
}

/* A static scheme without its scale, or with one that is no scale:
 * refused naming the linear or the tensor, whatever allow_nonfinite says. */
Test(safetensors, static_input_scale_refusals)
{
    for (int modelopt = 0; modelopt < 2; modelopt++) {
        write_static_fp8(NULL, NULL, NULL, 0, modelopt ? MODELOPT_FP8 : FP8_STATIC, modelopt);
        open_fails(g_dir, KILN_ERR_MALFORMED, "linear model.layers.0.mlp.up_proj",
                   modelopt ? "quant_algo \"FP8\"" : "activation_scheme \"static\"",
                   "no tensor model.layers.0.mlp.up_proj.input_scale", NULL);
    }
    write_static_fp8(NULL, NULL, NULL, 0, CT_STATIC("false"), 0);
    open_fails(g_dir, KILN_ERR_MALFORMED, "linear model.layers.0.mlp.up_proj",
               "config_groups.group_0.input_activations.dynamic is false", NULL);

    const float vals[] = { NAN, INFINITY, -INFINITY, 0.0f, -0.0f, -0.5f, FLT_MAX, 1e37f };
    for (size_t i = 0; i < KILN_ARRAY_LEN(vals); i++) {
        write_static_fp8("F32", "[]", &vals[i], 4, FP8_STATIC, 0);
        open_fails(g_dir, KILN_ERR_MALFORMED, "tensor model.layers.0.mlp.up_proj.input_scale",
                   "a static activation scale must be positive, finite", NULL);
        kiln_model *m = (kiln_model *)&m;
        const kiln_model_options allow = { .allow_nonfinite = 1 };
        cr_assert_eq(kiln_model_open_with(g_dir, &allow, &m), KILN_ERR_MALFORMED,
                     "--allow-nonfinite does not make %g a scale", (double)vals[i]);
    }
    const uint16_t bf16_nan = 0x7FC0;
    write_static_fp8("BF16", "[1]", &bf16_nan, 2, CT_STATIC("false"), 0);
    open_fails(g_dir, KILN_ERR_MALFORMED, "tensor model.layers.0.mlp.up_proj.input_scale", NULL);

    const float two[2] = { 0.5f, 0.25f };
    write_static_fp8("F32", "[2]", two, 8, FP8_STATIC, 0);
    open_fails(g_dir, KILN_ERR_MALFORMED, "tensor model.layers.0.mlp.up_proj.input_scale",
               "shape [2]", "one number", NULL);
    write_static_fp8("F32", "[1, 1]", two, 4, FP8_STATIC, 0);
    open_fails(g_dir, KILN_ERR_MALFORMED, "shape [1, 1]", NULL);
    write_static_fp8("F32", "[0]", two, 0, FP8_STATIC, 0);
    open_fails(g_dir, KILN_ERR_MALFORMED, "shape [0]", NULL);
    const uint8_t e4m3 = 0x38;
    write_static_fp8("F8_E4M3", "[]", &e4m3, 1, FP8_STATIC, 0);
    open_fails(g_dir, KILN_ERR_MALFORMED, "tensor model.layers.0.mlp.up_proj.input_scale",
               "F8_E4M3", "F32, BF16 or F16", NULL);

    /* A dynamic scheme never reads it: a NaN there is only the plain
     * tensor check's business, which --allow-nonfinite lifts. */
    write_static_fp8("F32", "[]", &vals[0], 4,
                     "{\"quantization_config\": {\"quant_method\": \"fp8\"}}", 0);
    kiln_model *m = NULL;
    cr_assert_eq(kiln_model_open(g_dir, &m), KILN_ERR_MALFORMED, "%s", kiln_last_error());
    cr_assert(strstr(kiln_last_error(), "--allow-nonfinite"), "%s", kiln_last_error());
    const kiln_model_options allow = { .allow_nonfinite = 1 };
    cr_assert_eq(kiln_model_open_with(g_dir, &allow, &m), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(find(m, "model.layers.0.mlp.up_proj.weight")->input_scale, 0.0f);
    kiln_model_close(m);
}

Test(safetensors, fp8_per_channel_as_n_or_n_by_1)
{
    kt_rng r = kt_rng_new(4);
    uint8_t q[3 * 16];
    float s[3];
    random_e4m3(&r, q, sizeof q);
    random_f32(&r, s, 3, 0.01f, 0.5f);
    stb *b = stb_new();
    stb_tensor(b, "a.weight", "F8_E4M3", "[3, 16]", q, sizeof q);
    stb_tensor(b, "a.weight_scale", "F32", "[3]", s, sizeof s);
    stb_tensor(b, "b.weight", "F8_E4M3", "[3, 16]", q, sizeof q);
    stb_tensor(b, "b.weight_scale", "F32", "[3, 1]", s, sizeof s);
    stb_write(b, in_dir("m.safetensors"), 0);
    free(b);
    kiln_model *m = open_ok(in_dir("m.safetensors"));
    for (int t = 0; t < 2; t++) {
        const kiln_model_tensor *w = find(m, t ? "b.weight" : "a.weight");
        cr_assert(w->supported, "%s", w->why);
        cr_assert_eq(w->qt.format, KILN_FMT_FP8_CHANNEL);
        float *d = dequantize(&w->qt);
        for (int i = 0; i < 48; i++)
            cr_assert_eq(d[i], kiln_e4m3_to_f32(q[i]) * s[i / 16]);
        free(d);
    }
    kiln_model_close(m);
}

/* A scale s as the dtype under test stores it: 2 bytes of BF16 or F16, or 1
 * of E8M0; *f is the value kiln must read (every one of these is exact in
 * F32). */
static size_t scale_as(const char *dtype, kt_rng *r, uint8_t *out, float *f)
{
    float v = kt_uniform(r, 0.001f, 0.5f);
    if (!strcmp(dtype, "F8_E8M0")) {
        out[0] = (uint8_t)(100 + kt_next(r) % 40);
        *f = kiln_e8m0_to_f32(out[0]);
        return 1;
    }
    uint16_t h = !strcmp(dtype, "BF16") ? kiln_f32_to_bf16(v) : kiln_f32_to_f16(v);
    memcpy(out, &h, 2);
    *f = !strcmp(dtype, "BF16") ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h);
    return 2;
}

/* FP8 scales in the dtypes checkpoints ship them in, per tensor, per channel
 * and per 128x128 tile (weight_scale_inv, and weight_scale as
 * compressed-tensors names it), read as the F32 value of each. */
Test(safetensors, fp8_scales_in_bf16_f16_and_e8m0_are_read_exactly)
{
    static const char *dtypes[] = { "BF16", "F16", "F8_E8M0" };
    kt_rng r = kt_rng_new(31);
    enum { N = 130, K = 160 };
    uint8_t *q = malloc(N * K);
    random_e4m3(&r, q, N * K);
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
        uint8_t st[2], sc[N * 2], sb[4 * 2];
        float ft, fc[N], fb[4];
        size_t e = scale_as(dtypes[d], &r, st, &ft);
        for (int i = 0; i < N; i++)
            scale_as(dtypes[d], &r, sc + i * e, &fc[i]);
        for (int i = 0; i < 4; i++)
            scale_as(dtypes[d], &r, sb + i * e, &fb[i]);
        stb *b = stb_new();
        stb_tensor(b, "t.weight", "F8_E4M3", "[130, 160]", q, N * K);
        stb_tensor(b, "t.weight_scale", dtypes[d], "[1]", st, e);
        stb_tensor(b, "c.weight", "F8_E4M3", "[130, 160]", q, N * K);
        stb_tensor(b, "c.weight_scale", dtypes[d], "[130, 1]", sc, N * e);
        stb_tensor(b, "b.weight", "F8_E4M3", "[130, 160]", q, N * K);
        stb_tensor(b, "b.weight_scale_inv", dtypes[d], "[2, 2]", sb, 4 * e);
        stb_tensor(b, "ct.weight", "F8_E4M3", "[130, 160]", q, N * K);
        stb_tensor(b, "ct.weight_scale", dtypes[d], "[2, 2]", sb, 4 * e);
        stb_write(b, in_dir("model.safetensors"), 1);
        free(b);
        kiln_model *m = open_ok(g_dir);
        struct {
            const char *name;
            kiln_format fmt;
        } want[] = { { "t.weight", KILN_FMT_FP8_TENSOR }, { "c.weight", KILN_FMT_FP8_CHANNEL },
                     { "b.weight", KILN_FMT_FP8_BLOCK }, { "ct.weight", KILN_FMT_FP8_BLOCK } };
        for (size_t t = 0; t < sizeof want / sizeof want[0]; t++) {
            const kiln_model_tensor *w = find(m, want[t].name);
            cr_assert(w->supported, "%s %s: %s", dtypes[d], want[t].name, w->why);
            cr_assert_eq(w->qt.format, want[t].fmt, "%s %s", dtypes[d], want[t].name);
            cr_assert_eq((uintptr_t)w->qt.scale % 4, 0, "F32 scales are aligned");
            float *y = dequantize(&w->qt);
            for (int i = 0; i < N * K; i++) {
                int n = i / K, k = i % K;
                float s = t == 0 ? ft : t == 1 ? fc[n] : fb[(n / 128) * 2 + k / 128];
                cr_assert_eq(y[i], kiln_e4m3_to_f32(q[i]) * s, "%s %s element %d", dtypes[d],
                             want[t].name, i);
            }
            free(y);
        }
        kiln_model_close(m);
    }
    free(q);
}

/* ModelOpt MXFP8: E8M0 scales per 32 along K, stored as F8_E8M0 or U8, kept
 * as the bytes kiln's MXFP8 format holds; hf_quant_config.json's quant_algo
 * MXFP8 decides where the shape alone could not (K = 32: [N, 1]). */
Test(safetensors, modelopt_mxfp8_with_e8m0_or_u8_scales)
{
    kt_rng r = kt_rng_new(32);
    enum { N = 6, K = 96 };
    uint8_t q[N * K], sc[N * 3];
    random_e4m3(&r, q, sizeof q);
    for (size_t i = 0; i < sizeof sc; i++)
        sc[i] = (uint8_t)(115 + kt_next(&r) % 20);
    stb *b = stb_new();
    stb_tensor(b, "e.weight", "F8_E4M3", "[6, 96]", q, sizeof q);
    stb_tensor(b, "e.weight_scale", "F8_E8M0", "[6, 3]", sc, sizeof sc);
    stb_tensor(b, "u.weight", "F8_E4M3", "[6, 96]", q, sizeof q);
    stb_tensor(b, "u.weight_scale", "U8", "[6, 3]", sc, sizeof sc);
    stb_tensor(b, "k32.weight", "F8_E4M3", "[6, 32]", q, N * 32);
    stb_tensor(b, "k32.weight_scale", "F8_E8M0", "[6, 1]", sc, N);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    write_text(in_dir("hf_quant_config.json"),
               "{\"producer\": {\"name\": \"modelopt\"}, \"quantization\": {\"quant_algo\": "
               "\"MXFP8\", \"exclude_modules\": [\"lm_head\"]}}");
    kiln_model *m = open_ok(g_dir);
    const char *names[] = { "e.weight", "u.weight", "k32.weight" };
    for (int t = 0; t < 3; t++) {
        const kiln_model_tensor *w = find(m, names[t]);
        cr_assert(w->supported, "%s: %s", names[t], w->why);
        cr_assert_eq(w->qt.format, KILN_FMT_MXFP8, "%s", names[t]);
        float *y = dequantize(&w->qt);
        int64_t k = w->qt.k;
        for (int64_t i = 0; i < N * k; i++)
            cr_assert_eq(y[i], kiln_e4m3_to_f32(q[i]) * kiln_e8m0_to_f32(sc[i / 32]),
                         "%s element %lld", names[t], (long long)i);
        free(y);
    }
    const kiln_model_tensor *s = find(m, "e.weight_scale");
    cr_assert_not(s->supported);
    cr_assert(strstr(s->why, "the scales of MXFP8 weight e.weight"), "%s", s->why);
    kiln_model_close(m);

    /* Without the setting, an E8M0 [N, 1] scale of a K = 32 weight reads as
     * MXFP8 too: per-channel E8M0 scales are an F32 format's, [N] or a K
     * that is not 32. A wrong shape names both tensors. */
    remove(in_dir("hf_quant_config.json"));
    b = stb_new();
    stb_tensor(b, "k32.weight", "F8_E4M3", "[6, 32]", q, N * 32);
    stb_tensor(b, "k32.weight_scale", "F8_E8M0", "[6, 1]", sc, N);
    stb_tensor(b, "ch.weight", "F8_E4M3", "[6, 64]", q, N * 64);
    stb_tensor(b, "ch.weight_scale", "F8_E8M0", "[6]", sc, N);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    m = open_ok(g_dir);
    cr_assert_eq(find(m, "k32.weight")->qt.format, KILN_FMT_MXFP8);
    cr_assert_eq(find(m, "ch.weight")->qt.format, KILN_FMT_FP8_CHANNEL);
    kiln_model_close(m);
    b = stb_new();
    stb_tensor(b, "x.weight", "F8_E4M3", "[6, 96]", q, sizeof q);
    stb_tensor(b, "x.weight_scale", "U8", "[6, 2]", sc, 12);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    write_text(in_dir("hf_quant_config.json"), "{\"quantization\": {\"quant_algo\": \"MXFP8\"}}");
    open_fails(g_dir, KILN_ERR_MALFORMED, "tensor x.weight_scale: U8 [6, 2] does not fit weight "
               "x.weight [6, 96]", "[N, K/32]", NULL);
}

/* gpt-oss-style MXFP4 scales stored as F8_E8M0 rather than U8; an NVFP4
 * global scale stored as BF16. */
Test(safetensors, mxfp4_e8m0_scales_and_bf16_nvfp4_global)
{
    uint8_t blocks[2 * 16], scales[2] = { 126, 129 }, nq[2 * 8], nsc[2] = { 0x38, 0x40 };
    for (int i = 0; i < 32; i++)
        blocks[i] = (uint8_t)(i * 37);
    for (int i = 0; i < 16; i++)
        nq[i] = (uint8_t)(i * 53);
    uint16_t g = kiln_f32_to_bf16(0.375f);
    stb *b = stb_new();
    stb_tensor(b, "m.down_proj_blocks", "U8", "[2, 1, 16]", blocks, sizeof blocks);
    stb_tensor(b, "m.down_proj_scales", "F8_E8M0", "[2, 1]", scales, sizeof scales);
    stb_tensor(b, "p.weight", "U8", "[2, 8]", nq, sizeof nq);
    stb_tensor(b, "p.weight_scale", "F8_E4M3", "[2, 1]", nsc, sizeof nsc);
    stb_tensor(b, "p.weight_scale_2", "BF16", "[]", &g, 2);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    kiln_model *m = open_ok(g_dir);
    const kiln_model_tensor *w = find(m, "m.down_proj");
    cr_assert(w->supported, "%s", w->why);
    cr_assert_eq(w->qt.format, KILN_FMT_MXFP4);
    float *y = dequantize(&w->qt);
    for (int i = 0; i < 64; i++) {
        uint8_t nib = i % 2 ? blocks[i / 2] >> 4 : blocks[i / 2] & 0xF;
        cr_assert_eq(y[i], kiln_e2m1_to_f32(nib) * kiln_e8m0_to_f32(scales[i / 32]));
    }
    free(y);
    const kiln_model_tensor *p = find(m, "p.weight");
    cr_assert(p->supported, "%s", p->why);
    cr_assert_eq(p->qt.format, KILN_FMT_NVFP4);
    cr_assert_eq(p->qt.global_scale, 0.375f);
    kiln_model_close(m);
}

/* compressed-tensors' quantization_config as llm-compressor writes it
 * (FP8_BLOCK on the MLP, FP8_DYNAMIC elsewhere, lm_head left out). */
#define CT_ARGS(strategy, block)                                                                \
    "{\"num_bits\": 8, \"type\": \"float\", \"symmetric\": true, \"group_size\": null,"        \
    " \"strategy\": \"" strategy "\", \"block_structure\": " block ", \"dynamic\": false,"       \
    " \"actorder\": null, \"observer\": \"minmax\", \"observer_kwargs\": {}}"
#define CT_CONFIG(ignore)                                                                       \
    "{\"architectures\": [\"LlamaForCausalLM\"], \"quantization_config\": {"                   \
    "\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\","                \
    " \"quantization_status\": \"compressed\", \"ignore\": " ignore ","                         \
    " \"kv_cache_scheme\": null, \"sparsity_config\": {}, \"config_groups\": {"               \
    "\"group_0\": {\"targets\": [\"re:.*mlp.*\"], \"weights\": " CT_ARGS("block", "[128, 128]") \
    ", \"input_activations\": {\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"group\","  \
    " \"group_size\": 128, \"dynamic\": true, \"symmetric\": true},"                           \
    " \"output_activations\": null, \"format\": \"float-quantized\"},"                         \
    "\"group_1\": {\"targets\": [\"Linear\"], \"weights\": " CT_ARGS("channel", "null")         \
    ", \"input_activations\": {\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"token\","  \
    " \"dynamic\": true, \"symmetric\": true}}}}}"

Test(safetensors, compressed_tensors_fp8_groups_and_ignore)
{
    kt_rng r = kt_rng_new(33);
    enum { N = 130, K = 128 };
    uint8_t *q = malloc(N * K);
    uint16_t ch[N], blk[2], head[4 * 8];
    random_e4m3(&r, q, N * K);
    for (int i = 0; i < N; i++)
        ch[i] = kiln_f32_to_bf16(kt_uniform(&r, 0.001f, 0.1f));
    for (int i = 0; i < 2; i++)
        blk[i] = kiln_f32_to_bf16(kt_uniform(&r, 0.001f, 0.1f));
    for (int i = 0; i < 32; i++)
        head[i] = kiln_f32_to_bf16(kt_uniform(&r, -1, 1));
    stb *b = stb_new();
    stb_tensor(b, "model.layers.0.mlp.up_proj.weight", "F8_E4M3", "[130, 128]", q, N * K);
    stb_tensor(b, "model.layers.0.mlp.up_proj.weight_scale", "BF16", "[2, 1]", blk, 4);
    stb_tensor(b, "model.layers.0.self_attn.o_proj.weight", "F8_E4M3", "[130, 128]", q, N * K);
    stb_tensor(b, "model.layers.0.self_attn.o_proj.weight_scale", "BF16", "[130, 1]", ch, 2 * N);
    stb_tensor(b, "lm_head.weight", "BF16", "[4, 8]", head, sizeof head);
    stb_tensor(b, "model.norm.weight", "BF16", "[8]", head, 16);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    write_text(in_dir("config.json"), CT_CONFIG("[\"lm_head\"]"));
    kiln_model *m = open_ok(g_dir);
    const kiln_model_tensor *up = find(m, "model.layers.0.mlp.up_proj.weight");
    const kiln_model_tensor *o = find(m, "model.layers.0.self_attn.o_proj.weight");
    cr_assert(up->supported && o->supported, "%s %s", up->why, o->why);
    cr_assert_eq(up->qt.format, KILN_FMT_FP8_BLOCK, "[2, 1] is the 128x128 tiles of group_0");
    cr_assert_eq(o->qt.format, KILN_FMT_FP8_CHANNEL);
    float *yu = dequantize(&up->qt), *yo = dequantize(&o->qt);
    for (int i = 0; i < N * K; i++) {
        cr_assert_eq(yu[i], kiln_e4m3_to_f32(q[i]) * kiln_bf16_to_f32(blk[i / K / 128]));
        cr_assert_eq(yo[i], kiln_e4m3_to_f32(q[i]) * kiln_bf16_to_f32(ch[i / K]));
    }
    free(yu);
    free(yo);
    cr_assert(find(m, "lm_head.weight")->supported);
    cr_assert(find(m, "model.norm.weight")->supported, "a float tensor \"Linear\" targets is "
              "used as stored");
    kiln_model_close(m);

    /* A module the ignore list leaves unquantized must not be stored in FP8. */
    write_text(in_dir("config.json"), CT_CONFIG("[\"lm_head\", \"re:.*self_attn.o_proj$\"]"));
    open_fails(g_dir, KILN_ERR_MALFORMED,
               "tensor model.layers.0.self_attn.o_proj.weight is F8_E4M3, but "
               "quantization_config.ignore in ",
               "config.json lists module model.layers.0.self_attn.o_proj", NULL);
    free(q);
}

/* The schemes kiln has no format for: the weights are listed unsupported,
 * saying which config field asks for what. */
Test(safetensors, compressed_tensors_schemes_without_a_format_are_refused_by_field)
{
    int32_t packed[4 * 16] = { 0 };
    uint16_t sc[4 * 1] = { 0x3c00, 0x3c00, 0x3c00, 0x3c00 };
    int64_t shape[2] = { 4, 128 };
    static const struct {
        const char *weights, *format, *why;
    } cases[] = {
        { "{\"num_bits\": 3, \"type\": \"int\", \"symmetric\": true, \"strategy\": \"group\","
          " \"group_size\": 128}", "pack-quantized",
          "config_groups.group_0.weights: int3 group 128 (pack-quantized): num_bits 3: kiln's "
          "integer formats are int4 and int8" },
        { "{\"num_bits\": 4, \"type\": \"int\", \"symmetric\": true, \"strategy\": \"group\","
          " \"group_size\": 128, \"actorder\": \"group\"}", "pack-quantized",
          "int4 group 128 (pack-quantized): actorder group: act-order weights need weight_g_idx" },
        { "{\"num_bits\": 4, \"type\": \"int\", \"symmetric\": true, \"strategy\": \"group\","
          " \"group_size\": 128, \"dynamic\": true}", "pack-quantized",
          "int4 group 128 (pack-quantized): dynamic: weights quantized at run time" },
        { "{\"num_bits\": 4, \"type\": \"int\", \"symmetric\": true, \"strategy\": \"tensor\"}",
          "pack-quantized", "int4 tensor (pack-quantized): strategy tensor: kiln's integer formats "
          "are per group or per channel" },
        { "{\"num_bits\": 8, \"type\": \"int\", \"symmetric\": true, \"strategy\": \"channel\"}",
          "int-quantized", "int8 channel (int-quantized): format \"int-quantized\": kiln reads "
          "integer weights as pack-quantized writes them" },
        { "{\"num_bits\": 4, \"type\": \"float\", \"symmetric\": true, \"strategy\":"
          " \"tensor_group\", \"group_size\": 16, \"dynamic\": false}", "nvfp4-pack-quantized",
          "float4 tensor_group 16 (nvfp4-pack-quantized): compressed-tensors' NVFP4 stores "
          "weight_global_scale" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        stb *b = stb_new();
        stb_tensor(b, "model.layers.0.self_attn.q_proj.weight_packed", "I32", "[4, 16]", packed,
                   sizeof packed);
        stb_tensor(b, "model.layers.0.self_attn.q_proj.weight_scale", "F16", "[4, 1]", sc,
                   sizeof sc);
        stb_tensor(b, "model.layers.0.self_attn.q_proj.weight_shape", "I64", "[2]", shape,
                   sizeof shape);
        stb_write(b, in_dir("model.safetensors"), 0);
        free(b);
        char cfg[1024];
        snprintf(cfg, sizeof cfg,
                 "{\"num_hidden_layers\": 1, \"quantization_config\": {\"quant_method\":"
                 " \"compressed-tensors\", \"format\": \"%s\", \"ignore\": [\"lm_head\"],"
                 " \"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"weights\": %s,"
                 " \"input_activations\": null}}}}", cases[i].format, cases[i].weights);
        write_text(in_dir("config.json"), cfg);
        kiln_model *m = open_ok(g_dir);
        const kiln_model_tensor *w = find(m, "model.layers.0.self_attn.q_proj.weight_packed");
        cr_assert_not(w->supported);
        cr_assert(strstr(w->why, cases[i].why), "%s", w->why);
        kiln_graph *g;
        cr_assert_eq(kiln_graph_create(&g), KILN_OK);
        cr_assert_eq(kiln_model_build_linears(m, g, 0), KILN_ERR_UNSUPPORTED);
        cr_assert(strstr(kiln_last_error(), "tensor model.layers.0.self_attn.q_proj.weight_packed"),
                  "%s", kiln_last_error());
        cr_assert(strstr(kiln_last_error(), cases[i].why), "%s", kiln_last_error());
        kiln_graph_destroy(g);
        kiln_model_close(m);
    }
}

/* compressed-tensors W4A16 with zero points: weight_packed, weight_shape,
 * weight_scale and weight_zero_point become one int4_group_zp weight named
 * .weight, listed before its parts, which are listed as parts of it;
 * actorder "weight" changes calibration only and is read. A weight_g_idx
 * tensor (act order in groups) refuses the weight naming it. */
static void write_w4a16(int with_g_idx)
{
    /* Row r: codes 0..15 (q = -8..7) twice over its 16 columns, per row
     * groups of 8: a scale and a zero point each. */
    uint8_t packed[4 * 8];
    for (int r = 0; r < 4; r++)
        for (int b = 0; b < 8; b++)
            packed[8 * r + b] = (uint8_t)((2 * b % 16) | ((2 * b + 1) % 16) << 4);
    uint16_t scale[4 * 2];
    for (int i = 0; i < 8; i++)
        scale[i] = kiln_f32_to_bf16(0.25f * (float)(i + 1));
    int64_t shape[2] = { 4, 16 };
    /* zero points (n, g) = n - g - 1, packed along N: word [0][g] holds
     * rows 0..3 at bits 4n, offset by 8 */
    int32_t zp[2];
    for (int g = 0; g < 2; g++) {
        uint32_t w = 0;
        for (int n = 0; n < 4; n++)
            w |= (uint32_t)(n - g - 1 + 8) << (4 * n);
        zp[g] = (int32_t)w;
    }
    int32_t g_idx[16] = { 0 };
    stb *b = stb_new();
    stb_tensor(b, "model.layers.0.mlp.up_proj.weight_packed", "I32", "[4, 2]", packed, sizeof packed);
    stb_tensor(b, "model.layers.0.mlp.up_proj.weight_scale", "BF16", "[4, 2]", scale, sizeof scale);
    stb_tensor(b, "model.layers.0.mlp.up_proj.weight_shape", "I64", "[2]", shape, sizeof shape);
    stb_tensor(b, "model.layers.0.mlp.up_proj.weight_zero_point", "I32", "[1, 2]", zp, sizeof zp);
    if (with_g_idx)
        stb_tensor(b, "model.layers.0.mlp.up_proj.weight_g_idx", "I32", "[16]", g_idx, sizeof g_idx);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    write_text(in_dir("config.json"),
               "{\"num_hidden_layers\": 1, \"quantization_config\": {\"quant_method\":"
               " \"compressed-tensors\", \"format\": \"pack-quantized\", \"config_groups\":"
               " {\"group_0\": {\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4,"
               " \"type\": \"int\", \"symmetric\": false, \"strategy\": \"group\","
               " \"group_size\": 8, \"actorder\": \"weight\"}}}}}");
}

Test(safetensors, compressed_tensors_w4a16_becomes_one_int4_group_zp_weight)
{
    write_w4a16(0);
    kiln_model *m = open_ok(g_dir);
    const kiln_model_tensor *w = find(m, "model.layers.0.mlp.up_proj.weight");
    cr_assert(w->supported, "%s", w->why ? w->why : "");
    cr_assert_eq(w->qt.format, KILN_FMT_INT4_GROUP_ZP);
    cr_assert_eq(w->qt.n, 4);
    cr_assert_eq(w->qt.k, 16);
    cr_assert_eq(w->qt.group, 8);
    cr_assert_eq(index_of(m, "model.layers.0.mlp.up_proj.weight") + 1,
                 index_of(m, "model.layers.0.mlp.up_proj.weight_packed"));
    const kiln_model_tensor *p = find(m, "model.layers.0.mlp.up_proj.weight_zero_point");
    cr_assert_not(p->supported);
    cr_assert(strstr(p->why, "part of int4_group_zp weight model.layers.0.mlp.up_proj.weight"),
              "%s", p->why);
    float y[4 * 16];
    cr_assert_eq(kiln_dequantize(&w->qt, y), KILN_OK, "%s", kiln_last_error());
    for (int n = 0; n < 4; n++)
        for (int k = 0; k < 16; k++) {
            int g = k / 8, q = k - 8, zp = n - g - 1;
            float want = (float)(q - zp) * 0.25f * (float)(2 * n + g + 1);
            cr_assert_eq(y[16 * n + k], want, "[%d, %d]: %g, want %g", n, k, y[16 * n + k], want);
        }
    kiln_model_close(m);
}

Test(safetensors, compressed_tensors_g_idx_refuses_the_weight_naming_it)
{
    write_w4a16(1);
    kiln_model *m = open_ok(g_dir);
    const kiln_model_tensor *w = find(m, "model.layers.0.mlp.up_proj.weight_packed");
    cr_assert_not(w->supported);
    cr_assert(strstr(w->why, "tensor model.layers.0.mlp.up_proj.weight_g_idx: act-order"), "%s",
              w->why);
    kiln_model_close(m);
}

#define PATTERNS_4 "\"re:a\", \"re:b\", \"re:c\", \"re:d\""
#define PATTERNS_16 PATTERNS_4 ", " PATTERNS_4 ", " PATTERNS_4 ", " PATTERNS_4
#define PATTERNS_64 PATTERNS_16 ", " PATTERNS_16 ", " PATTERNS_16 ", " PATTERNS_16
#define PATTERNS_257 PATTERNS_64 ", " PATTERNS_64 ", " PATTERNS_64 ", " PATTERNS_64 ", \"re:e\""

Test(safetensors, compressed_tensors_config_errors_name_the_field)
{
    uint16_t x = 0;
    stb *b = stb_new();
    stb_tensor(b, "x", "BF16", "[1]", &x, 2);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    static const struct {
        const char *q, *what;
    } bad[] = {
        { "\"config_groups\": []", "quantization_config.config_groups is not an object" },
        { "\"config_groups\": {\"g\": 1}", "quantization_config.config_groups.g is not an object" },
        { "\"config_groups\": {\"g\": {\"targets\": \"Linear\"}}",
          "quantization_config.config_groups.g.targets is not a list of strings" },
        { "\"config_groups\": {\"g\": {\"weights\": {\"num_bits\": \"8\"}}}",
          "quantization_config.config_groups.g.weights.num_bits is not a positive integer" },
        { "\"config_groups\": {\"g\": {\"weights\": {\"strategy\": 3}}}",
          "quantization_config.config_groups.g.weights.strategy is not a string" },
        { "\"config_groups\": {\"g\": {\"weights\": {\"block_structure\": [128]}}}",
          "quantization_config.config_groups.g.weights.block_structure is not [rows, cols]" },
        { "\"config_groups\": {\"g\": {\"input_activations\": {\"dynamic\": 1}}}",
          "quantization_config.config_groups.g.input_activations.dynamic is not a boolean" },
        { "\"config_groups\": {}, \"ignore\": [1]", "quantization_config.ignore is not a list" },
        { "\"config_groups\": {}, \"format\": 7", "quantization_config.format is not a string" },
        { "\"config_groups\": {}, \"ignore\": [" PATTERNS_257 "]",
          "more than 256 \"re:\" patterns" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cfg[4096];
        snprintf(cfg, sizeof cfg,
                 "{\"quantization_config\": {\"quant_method\": \"compressed-tensors\", %s}}",
                 bad[i].q);
        write_text(in_dir("config.json"), cfg);
        open_fails(g_dir, KILN_ERR_MALFORMED, "config.json: ", bad[i].what, NULL);
    }
}

/* N = 130 and K = 260 leave partial tiles on both edges: scales [2, 3]. */
static void write_fp8_block(kt_rng *r, const char *scale_shape, size_t n_scales, uint8_t *q, float *s)
{
    random_e4m3(r, q, 130 * 260);
    random_f32(r, s, n_scales, 0.001f, 0.01f);
    stb *b = stb_new();
    stb_tensor(b, "mlp.down_proj.weight", "F8_E4M3", "[130, 260]", q, 130 * 260);
    stb_tensor(b, "mlp.down_proj.weight_scale_inv", "F32", scale_shape, s, n_scales * 4);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
}

Test(safetensors, fp8_block_128)
{
    kt_rng r = kt_rng_new(5);
    uint8_t *q = malloc(130 * 260);
    float s[6];
    write_fp8_block(&r, "[2, 3]", 6, q, s);
    write_text(in_dir("config.json"),
               "{\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\","
               " \"weight_block_size\": [128, 128], \"activation_scheme\": \"dynamic\"}}");
    kiln_model *m = open_ok(g_dir);
    const kiln_model_tensor *w = find(m, "mlp.down_proj.weight");
    cr_assert(w->supported, "%s", w->why);
    cr_assert_eq(w->qt.format, KILN_FMT_FP8_BLOCK);
    cr_assert_eq(w->qt.n, 130);
    cr_assert_eq(w->qt.k, 260);
    float *d = dequantize(&w->qt);
    for (int n = 0; n < 130; n++)
        for (int k = 0; k < 260; k++)
            cr_assert_eq(d[n * 260 + k], kiln_e4m3_to_f32(q[n * 260 + k]) * s[(n / 128) * 3 + k / 128]);
    free(d);
    kiln_model_close(m);

    /* Without config.json the tensors alone say it. */
    unlink(in_dir("config.json"));
    m = open_ok(g_dir);
    cr_assert_eq(find(m, "mlp.down_proj.weight")->qt.format, KILN_FMT_FP8_BLOCK);
    kiln_model_close(m);
    free(q);
}

Test(safetensors, fp8_block_of_another_size_is_unsupported)
{
    kt_rng r = kt_rng_new(6);
    uint8_t *q = malloc(130 * 260);
    float s[3 * 5];
    write_fp8_block(&r, "[3, 5]", 15, q, s);
    write_text(in_dir("config.json"),
               "{\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [64, 64]}}");
    kiln_model *m = open_ok(g_dir);
    const kiln_model_tensor *w = find(m, "mlp.down_proj.weight");
    cr_assert_not(w->supported);
    cr_assert(strstr(w->why, "weight_block_size [64, 64]"), "%s", w->why);
    kiln_model_close(m);

    /* The same scales against the default 128x128 tiles do not fit. */
    unlink(in_dir("config.json"));
    open_fails(g_dir, KILN_ERR_MALFORMED, "model.safetensors", "tensor mlp.down_proj.weight_scale_inv",
               "mlp.down_proj.weight", "[2, 3]", NULL);
    free(q);
}

/* A NaN scale is refused by index wherever it lies: in a word of eight the
 * scan tests at once, or in the tail after the last whole word; NVFP4's
 * UE4M3 scales (0x7F, 0xFF), MXFP4's E8M0 (0xFF), FP8 block's F32. */
Test(safetensors, nonfinite_scales_are_found_at_every_index)
{
    kt_rng r = kt_rng_new(31);
    uint8_t nq[8 * 40], nsc[8 * 5], blocks[2 * 21 * 16], esc[2 * 21];
    random_bytes(&r, nq, sizeof nq);
    random_bytes(&r, blocks, sizeof blocks);
    for (size_t bad = 0; bad < sizeof nsc + sizeof esc; bad++) {
        for (size_t i = 0; i < sizeof nsc; i++)
            nsc[i] = (uint8_t)(kt_next(&r) % 0x7F);
        for (size_t i = 0; i < sizeof esc; i++)
            esc[i] = (uint8_t)(100 + kt_next(&r) % 50);
        int nv = bad < sizeof nsc;
        size_t at = nv ? bad : bad - sizeof nsc;
        if (nv)
            nsc[at] = at % 2 ? 0xFF : 0x7F;
        else
            esc[at] = 0xFF;
        float g = 0.25f;
        stb *b = stb_new();
        stb_tensor(b, "p.weight", "U8", "[8, 40]", nq, sizeof nq);
        stb_tensor(b, "p.weight_scale", "F8_E4M3", "[8, 5]", nsc, sizeof nsc);
        stb_tensor(b, "p.weight_scale_2", "F32", "[]", &g, 4);
        stb_tensor(b, "m.down_proj_blocks", "U8", "[2, 21, 16]", blocks, sizeof blocks);
        stb_tensor(b, "m.down_proj_scales", "F8_E8M0", "[2, 21]", esc, sizeof esc);
        stb_write(b, in_dir("model.safetensors"), 0);
        free(b);
        char want[64];
        snprintf(want, sizeof want, "tensor %s: scale %zu is NaN", nv ? "p.weight" : "m.down_proj", at);
        kiln_model *m = NULL;
        cr_assert_eq(kiln_model_open(g_dir, &m), KILN_ERR_MALFORMED, "%s", want);
        cr_assert(strstr(kiln_last_error(), want), "\"%s\" lacks \"%s\"", kiln_last_error(), want);
        const kiln_model_options allow = { .allow_nonfinite = 1 };
        cr_assert_eq(kiln_model_open_with(g_dir, &allow, &m), KILN_OK, "%s", kiln_last_error());
        kiln_model_close(m);
    }

    uint8_t *q = malloc(130 * 260);
    float s[6];
    const float nonfinite[] = { NAN, INFINITY, -INFINITY };
    for (int bad = 0; bad < 6; bad++) {
        random_e4m3(&r, q, 130 * 260);
        random_f32(&r, s, 6, 0.001f, 0.01f);
        s[bad] = nonfinite[bad % 3];
        stb *b = stb_new();
        stb_tensor(b, "mlp.down_proj.weight", "F8_E4M3", "[130, 260]", q, 130 * 260);
        stb_tensor(b, "mlp.down_proj.weight_scale_inv", "F32", "[2, 3]", s, sizeof s);
        stb_write(b, in_dir("model.safetensors"), 0);
        free(b);
        char want[80];
        snprintf(want, sizeof want, "tensor mlp.down_proj.weight: scale %d is %s", bad,
                 bad % 3 == 0 ? "NaN" : bad % 3 == 1 ? "+inf" : "-inf");
        kiln_model *m = NULL;
        cr_assert_eq(kiln_model_open(g_dir, &m), KILN_ERR_MALFORMED, "%s", want);
        cr_assert(strstr(kiln_last_error(), want), "\"%s\" lacks \"%s\"", kiln_last_error(), want);
    }
    free(q);
}

/* ModelOpt NVFP4: N = 4, K = 64. */
static void write_nvfp4(kt_rng *r, uint8_t *q, uint8_t *sc, float *g, const char *scale_shape)
{
    random_bytes(r, q, 4 * 32);
    for (int i = 0; i < 16; i++)
        sc[i] = (uint8_t)(kt_next(r) % 0x7E); /* positive, finite: a UE4M3 scale */
    *g = kt_uniform(r, 0.001f, 0.01f);
    float in = 0.5f;
    stb *b = stb_new();
    stb_tensor(b, "mlp.up_proj.weight", "U8", "[4, 32]", q, 4 * 32);
    stb_tensor(b, "mlp.up_proj.weight_scale", "F8_E4M3", scale_shape, sc, 16);
    stb_tensor(b, "mlp.up_proj.weight_scale_2", "F32", "[]", g, 4);
    stb_tensor(b, "mlp.up_proj.input_scale", "F32", "[]", &in, 4);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
}

static void check_nvfp4(const kiln_model *m, const uint8_t *q, const uint8_t *sc, float g)
{
    const kiln_model_tensor *w = find(m, "mlp.up_proj.weight");
    cr_assert(w->supported, "%s", w->why);
    cr_assert_eq(w->qt.format, KILN_FMT_NVFP4);
    cr_assert_eq(w->qt.n, 4);
    cr_assert_eq(w->qt.k, 64);
    cr_assert_eq(w->ne[0], 64, "ne[0] is K, not the stored byte count");
    cr_assert_eq(w->qt.global_scale, g);
    float *d = dequantize(&w->qt);
    for (int i = 0; i < 4 * 64; i++) {
        uint8_t nib = i % 2 ? q[i / 2] >> 4 : q[i / 2] & 0xF;
        cr_assert_eq(d[i], kiln_e2m1_to_f32(nib) * (kiln_e4m3_to_f32(sc[i / 16]) * g), "element %d", i);
    }
    free(d);
    const kiln_model_tensor *s = find(m, "mlp.up_proj.weight_scale");
    cr_assert_not(s->supported);
    cr_assert(strstr(s->why, "mlp.up_proj.weight"), "%s", s->why);
}

Test(safetensors, modelopt_nvfp4_from_config_json)
{
    kt_rng r = kt_rng_new(7);
    uint8_t q[128], sc[16];
    float g;
    write_nvfp4(&r, q, sc, &g, "[4, 4]");
    write_text(in_dir("config.json"), "{\"quantization_config\": {\"quant_method\": \"modelopt\","
                                      " \"quant_algo\": \"NVFP4\", \"group_size\": 16}}");
    kiln_model *m = open_ok(g_dir);
    check_nvfp4(m, q, sc, g);
    kiln_model_close(m);
}

Test(safetensors, modelopt_nvfp4_from_hf_quant_config)
{
    kt_rng r = kt_rng_new(8);
    uint8_t q[128], sc[16];
    float g;
    write_nvfp4(&r, q, sc, &g, "[4, 4]");
    write_text(in_dir("config.json"), "{\"architectures\": [\"LlamaForCausalLM\"]}");
    write_text(in_dir("hf_quant_config.json"),
               "{\"producer\": {\"name\": \"modelopt\", \"version\": \"0.19.0\"},\n"
               " \"quantization\": {\"quant_algo\": \"NVFP4\", \"kv_cache_quant_algo\": null,"
               " \"group_size\": 16, \"exclude_modules\": [\"lm_head\"]}}");
    kiln_model *m = open_ok(g_dir);
    check_nvfp4(m, q, sc, g);
    kiln_model_close(m);

    write_text(in_dir("hf_quant_config.json"),
               "{\"quantization\": {\"quant_algo\": \"NVFP4\", \"group_size\": 32}}");
    /* With groups of 32 the scales would be [4, 2]. */
    write_nvfp4(&r, q, sc, &g, "[4, 2, 2]");
    open_fails(g_dir, KILN_ERR_MALFORMED, "tensor mlp.up_proj.weight_scale", "mlp.up_proj.weight", NULL);
}

Test(safetensors, nvfp4_group_other_than_16_is_unsupported)
{
    kt_rng r = kt_rng_new(9);
    uint8_t q[4 * 64], sc[16];
    float g;
    random_bytes(&r, q, sizeof q);
    random_bytes(&r, sc, sizeof sc);
    g = 1;
    stb *b = stb_new();
    stb_tensor(b, "p.weight", "U8", "[4, 64]", q, sizeof q);
    stb_tensor(b, "p.weight_scale", "F8_E4M3", "[4, 4]", sc, 16); /* K = 128, group 32 */
    stb_tensor(b, "p.weight_scale_2", "F32", "[1]", &g, 4);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    write_text(in_dir("config.json"), "{\"quantization_config\": {\"quant_method\": \"modelopt\","
                                      " \"quant_algo\": \"NVFP4\", \"group_size\": 32}}");
    kiln_model *m = open_ok(g_dir);
    const kiln_model_tensor *w = find(m, "p.weight");
    cr_assert_not(w->supported);
    cr_assert(strstr(w->why, "group_size 32"), "%s", w->why);
    kiln_model_close(m);
}

Test(safetensors, mxfp4_blocks_and_scales_join_under_the_base_name)
{
    kt_rng r = kt_rng_new(10);
    enum { N = 3, G = 2 };
    uint8_t blocks[N * G * 16], scales[N * G], bias[2] = { 1, 2 };
    random_bytes(&r, blocks, sizeof blocks);
    for (int i = 0; i < N * G; i++)
        scales[i] = (uint8_t)(110 + kt_next(&r) % 30);
    stb *b = stb_new();
    stb_tensor(b, "model.layers.0.mlp.experts.down_proj_bias", "U8", "[2]", bias, 2);
    stb_tensor(b, "model.layers.0.mlp.experts.down_proj_blocks", "U8", "[3, 2, 16]", blocks, sizeof blocks);
    stb_tensor(b, "model.layers.0.mlp.experts.down_proj_scales", "U8", "[3, 2]", scales, sizeof scales);
    stb_tensor(b, "model.layers.0.mlp.experts.gate_up_proj_blocks", "U8", "[1, 3, 2, 16]", blocks,
               sizeof blocks);
    stb_tensor(b, "model.layers.0.mlp.experts.gate_up_proj_scales", "U8", "[1, 3, 2]", scales, sizeof scales);
    stb_tensor(b, "block.0.mlp.mlp1_weight.blocks", "U8", "[3, 1, 16]", blocks, N * 16);
    stb_tensor(b, "block.0.mlp.mlp1_weight.scales", "U8", "[3, 1]", scales, N);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    write_text(in_dir("config.json"), "{\"architectures\": [\"GptOssForCausalLM\"],"
                                      " \"quantization_config\": {\"quant_method\": \"mxfp4\"}}");
    kiln_model *m = open_ok(g_dir);
    cr_assert_eq(m->n_tensors, 10);
    const char *bases[] = { "model.layers.0.mlp.experts.down_proj",
                            "model.layers.0.mlp.experts.gate_up_proj" };
    for (int t = 0; t < 2; t++) {
        const kiln_model_tensor *w = find(m, bases[t]);
        cr_assert(w->supported, "%s", w->why);
        cr_assert_eq(w->qt.format, KILN_FMT_MXFP4);
        cr_assert_eq(w->qt.n, N);
        cr_assert_eq(w->qt.k, G * 32);
        cr_assert_eq(w->n_dims, 2);
        cr_assert_eq(w->ne[0], G * 32);
        cr_assert_eq(w->ne[1], N);
        char blocks_name[128];
        snprintf(blocks_name, sizeof blocks_name, "%s_blocks", bases[t]);
        cr_assert_eq(index_of(m, bases[t]) + 1, index_of(m, blocks_name), "listed just before its blocks");
        cr_assert_not(find(m, blocks_name)->supported);
        float *d = dequantize(&w->qt);
        for (int i = 0; i < N * G * 32; i++) {
            uint8_t nib = i % 2 ? blocks[i / 2] >> 4 : blocks[i / 2] & 0xF;
            cr_assert_eq(d[i], kiln_e2m1_to_f32(nib) * kiln_e8m0_to_f32(scales[i / 32]), "element %d", i);
        }
        free(d);
    }
    const kiln_model_tensor *o = find(m, "block.0.mlp.mlp1_weight");
    cr_assert_eq(o->qt.format, KILN_FMT_MXFP4);
    cr_assert_eq(o->qt.k, 32);
    cr_assert_str_eq(m->tensors[0].name, "model.layers.0.mlp.experts.down_proj_bias");
    kiln_model_close(m);
}

Test(safetensors, mxfp4_expert_stacks_are_listed_unsupported)
{
    kt_rng r = kt_rng_new(11);
    uint8_t blocks[2 * 4 * 3 * 16], scales[2 * 4 * 3];
    random_bytes(&r, blocks, sizeof blocks);
    random_bytes(&r, scales, sizeof scales);
    stb *b = stb_new();
    stb_tensor(b, "e.gate_up_proj_blocks", "U8", "[2, 4, 3, 16]", blocks, sizeof blocks);
    stb_tensor(b, "e.gate_up_proj_scales", "U8", "[2, 4, 3]", scales, sizeof scales);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    kiln_model *m = open_ok(g_dir);
    const kiln_model_tensor *w = find(m, "e.gate_up_proj");
    cr_assert_not(w->supported);
    cr_assert(strstr(w->why, "expert tensors are 3-D"), "%s", w->why);
    cr_assert_eq(w->n_dims, 3);
    cr_assert_eq(w->ne[0], 96);
    cr_assert_eq(w->ne[1], 4);
    cr_assert_eq(w->ne[2], 2);
    kiln_model_close(m);
}

Test(safetensors, tensors_outside_conventions_say_why)
{
    uint8_t q[16] = { 1 }, big[5 * 2] = { 0 };
    uint8_t one = 1;
    stb *b = stb_new();
    stb_tensor(b, "lone.weight", "F8_E4M3", "[2, 8]", q, 16);
    stb_tensor(b, "i8s.weight", "F8_E4M3", "[2, 8]", q, 16);
    stb_tensor(b, "i8s.weight_scale", "I8", "[]", &one, 1);
    stb_tensor(b, "cube.weight", "F8_E4M3", "[2, 2, 4]", q, 16);
    stb_tensor(b, "cube.weight_scale", "F32", "[1]", "\0\0\x80\x3f", 4);
    stb_tensor(b, "i8", "I8", "[16]", q, 16);
    stb_tensor(b, "r5", "F16", "[1, 1, 1, 1, 5]", big, 10);
    stb_tensor(b, "e5", "F8_E5M2", "[2]", q, 2);
    stb_tensor(b, "new", "F7_FUTURE", "[3]", q, 3);
    stb_tensor(b, "nib", "F4", "[4]", q, 2);
    stb_tensor(b, "empty", "F32", "[0, 3]", q, 0);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    kiln_model *m = open_ok(g_dir);
    struct {
        const char *name, *why;
    } want[] = {
        { "lone.weight", "without weight_scale" },
        { "i8s.weight", "scale i8s.weight_scale is I8: kiln reads these scales as F32, BF16, F16 "
                        "or F8_E8M0" },
        { "cube.weight", "rank 3" },
        { "i8", "outside any quantization convention" },
        { "r5", "rank 5" },
        { "e5", "F8_E5M2 is not supported" },
        { "new", "F7_FUTURE" },
        { "nib", "F4 is not supported" },
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const kiln_model_tensor *t = find(m, want[i].name);
        cr_assert_not(t->supported, "%s", want[i].name);
        cr_assert(t->why && strstr(t->why, want[i].why), "%s: %s", want[i].name, t->why);
    }
    const kiln_model_tensor *r5 = find(m, "r5");
    cr_assert_eq(r5->n_dims, 4);
    cr_assert_eq(r5->ne[0], 5);
    const kiln_model_tensor *e = find(m, "empty");
    cr_assert(e->supported);
    cr_assert_eq(e->bytes, 0);
    kiln_model_close(m);
}

/* -------------------------------------------------------------- malformed */

static uint8_t *small_valid_file(size_t *len)
{
    float w[4] = { 1, -2, 3, -4 };
    uint8_t q[32];
    float s = 0.5f;
    memset(q, 0x38, sizeof q);
    stb *b = stb_new();
    stb_entry(b, "\"__metadata__\":{\"format\":\"pt\"}");
    stb_tensor(b, "n.weight", "F32", "[4]", w, sizeof w);
    stb_tensor(b, "l.weight", "F8_E4M3", "[2, 16]", q, sizeof q);
    stb_tensor(b, "l.weight_scale", "F32", "[]", &s, 4);
    uint8_t *f = stb_bytes(b, 3, len);
    free(b);
    return f;
}

Test(safetensors, truncation_at_every_byte_fails_cleanly)
{
    size_t len;
    uint8_t *f = small_valid_file(&len);
    const char *p = in_dir("t.safetensors");
    write_bytes(p, f, len);
    kiln_model *m = open_ok(p);
    cr_assert_eq(m->n_tensors, 3);
    kiln_model_close(m);
    for (size_t cut = 0; cut < len; cut++) {
        write_bytes(p, f, cut);
        m = NULL;
        kiln_status st = kiln_safetensors_open(p, &m);
        cr_assert_eq(st, KILN_ERR_MALFORMED, "cut at %zu: %s", cut, kiln_last_error());
        cr_assert_null(m);
        cr_assert(strstr(kiln_last_error(), "t.safetensors"), "cut at %zu: %s", cut, kiln_last_error());
    }
    free(f);
}

static void write_header(const char *path, uint64_t hlen, const char *json, size_t data_bytes)
{
    size_t jl = strlen(json);
    uint8_t *f = calloc(1, 8 + jl + data_bytes);
    for (int i = 0; i < 8; i++)
        f[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(f + 8, json, jl);
    write_bytes(path, f, 8 + jl + data_bytes);
    free(f);
}

/* A one-off header with a correct length and `data_bytes` zero bytes of data. */
static void write_json(const char *json, size_t data_bytes)
{
    write_header(in_dir("model.safetensors"), strlen(json), json, data_bytes);
}

Test(safetensors, header_length_absurd_or_past_the_end)
{
    write_header(in_dir("model.safetensors"), (uint64_t)1 << 40, "{}", 0);
    open_fails(g_dir, KILN_ERR_MALFORMED, "model.safetensors", "exceeds", NULL);
    write_header(in_dir("model.safetensors"), 100 * 1000 * 1000 + 1, "{}", 0);
    open_fails(g_dir, KILN_ERR_MALFORMED, "exceeds", NULL);
    write_header(in_dir("model.safetensors"), 3, "{}", 0);
    open_fails(g_dir, KILN_ERR_MALFORMED, "model.safetensors", "past the end", NULL);
    write_bytes(in_dir("model.safetensors"), "\x02\0\0", 3);
    open_fails(g_dir, KILN_ERR_MALFORMED, "shorter than the 8-byte header length", NULL);
}

/* A FIFO or a dangling symbolic link where a model, its config or a shard
 * should be is refused by name at once: nothing waits for a writer. */
Test(safetensors, fifos_and_dangling_links_are_named, .timeout = 20)
{
    write_json("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4);
    cr_assert_eq(mkfifo(in_dir("config.json"), 0600), 0);
    open_fails(g_dir, KILN_ERR_IO, "config.json: not a regular file", NULL);
    unlink(in_dir("config.json"));
    cr_assert_eq(symlink("gone.json", in_dir("config.json")), 0);
    open_fails(g_dir, KILN_ERR_IO, "config.json: a symbolic link to gone.json, which does not exist",
               NULL);
    unlink(in_dir("config.json"));
    kiln_model_close(open_ok(g_dir)); /* without them, it opens */

    unlink(in_dir("model.safetensors"));
    cr_assert_eq(mkfifo(in_dir("model.safetensors"), 0600), 0);
    open_fails(g_dir, KILN_ERR_IO, "model.safetensors: not a regular file", NULL);
    open_fails(in_dir("model.safetensors"), KILN_ERR_IO, "not a regular file", NULL);
    unlink(in_dir("model.safetensors"));
    cr_assert_eq(symlink("elsewhere.safetensors", in_dir("model.safetensors")), 0);
    open_fails(g_dir, KILN_ERR_IO, "model.safetensors: a symbolic link to elsewhere.safetensors",
               NULL);
    open_fails(in_dir("model.safetensors"), KILN_ERR_IO, "which does not exist", NULL);
    unlink(in_dir("model.safetensors"));

    /* a shard named by the index */
    cr_assert_eq(mkfifo(in_dir("shard-1.safetensors"), 0600), 0);
    static const char index[] = "{\"weight_map\":{\"a\":\"shard-1.safetensors\"}}";
    write_bytes(in_dir("model.safetensors.index.json"), index, strlen(index));
    open_fails(g_dir, KILN_ERR_IO, "shard-1.safetensors: not a regular file", NULL);
    unlink(in_dir("shard-1.safetensors"));
}

/* A header that holds more than a tensor table can (a long array, deep
 * nesting) is refused from its bytes, before a JSON parse that would
 * spend memory in proportion to it. */
Test(safetensors, hostile_headers_are_refused_before_parsing)
{
    enum { VALUES = 4 * 1000 * 1000 };
    static const char head[] = "{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1],\"shape\":[";
    size_t n = sizeof head - 1 + 2 * (size_t)VALUES + 3;
    char *json = malloc(n + 1);
    cr_assert(json);
    memcpy(json, head, sizeof head - 1);
    char *p = json + sizeof head - 1;
    for (int i = 0; i < VALUES; i++, p += 2)
        memcpy(p, i ? ",1" : " 1", 2);
    memcpy(p, "]}}", 4);
    write_header(in_dir("model.safetensors"), strlen(json), json, 1);
    free(json);
    open_fails(g_dir, KILN_ERR_MALFORMED, "model.safetensors: header array of more than 64 values",
               NULL);
    write_json("{\"a\":{\"dtype\":{\"x\":[[1]]}}}", 0);
    open_fails(g_dir, KILN_ERR_MALFORMED, "header nests deeper than a tensor table", NULL);
    /* brackets and commas inside strings are text */
    write_json("{\"__metadata__\":{\"note\":\"[[[{{,,,\\\"]]\"},"
               "\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
               4);
    kiln_model_close(open_ok(g_dir));
}

Test(safetensors, header_must_be_a_json_object)
{
    write_json("{\"a\": ", 0);
    open_fails(g_dir, KILN_ERR_MALFORMED, "model.safetensors", "header JSON, line 1 column", NULL);
    write_json("[1, 2]", 0);
    open_fails(g_dir, KILN_ERR_MALFORMED, "model.safetensors", "header is not a JSON object", NULL);
    write_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}} x", 4);
    open_fails(g_dir, KILN_ERR_MALFORMED, "header JSON", NULL);
    write_json("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
               "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
               2);
    open_fails(g_dir, KILN_ERR_MALFORMED, "model.safetensors", "duplicate", NULL);
    write_json("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    open_fails(g_dir, KILN_ERR_MALFORMED, "duplicate", NULL);
    write_json("{\"__metadata__\":{\"n\":1}}", 0);
    open_fails(g_dir, KILN_ERR_MALFORMED, "__metadata__", "\"n\"", NULL);
    write_json("{\"__metadata__\":[]}", 0);
    open_fails(g_dir, KILN_ERR_MALFORMED, "__metadata__ is not a JSON object", NULL);
    /* Padding after the object, as the reference writer emits, is fine. */
    write_json("{}        ", 0);
    kiln_model *m = open_ok(g_dir);
    cr_assert_eq(m->n_tensors, 0);
    kiln_model_close(m);
}

Test(safetensors, tensor_entries_are_checked)
{
    struct {
        const char *json;
        const char *what;
    } bad[] = {
        { "{\"w\":3}", "entry is not a JSON object" },
        { "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}}",
          "unknown key \"extra\"" },
        { "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", "no dtype" },
        { "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", "no shape" },
        { "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", "no data_offsets" },
        { "{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", "dtype is not a string" },
        { "{\"w\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", "shape is not an array" },
        { "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", "shape entry 0" },
        { "{\"w\":{\"dtype\":\"F32\",\"shape\":[1, 1.5],\"data_offsets\":[0,4]}}", "shape entry 1" },
        { "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,4]}}", "shape entry 0" },
        { "{\"w\":{\"dtype\":\"U8\",\"shape\":[4611686018427387904, 4611686018427387904, 0],"
          "\"data_offsets\":[0,0]}}",
          "overflows" },
        { "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", "not [begin, end]" },
        { "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", "data_offsets[1]" },
        { "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]}}", "data_offsets[1]" },
        { "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", "end 0 is before begin 4" },
        { "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}",
          "past the 8-byte data section" },
        { "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}",
          "span 8 bytes, F32 x 3 elements is 12" },
        { "{\"w\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,8]}}",
          "span 8 bytes, F64 x 2 elements is 16" },
        { "{\"w\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", "do not fill whole bytes" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_json(bad[i].json, 8);
        open_fails(g_dir, KILN_ERR_MALFORMED, "model.safetensors: tensor w: ", bad[i].what, NULL);
    }
}

Test(safetensors, overlapping_tensors_are_refused)
{
    write_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               12);
    open_fails(g_dir, KILN_ERR_MALFORMED, "model.safetensors: tensor b", "overlap tensor a", NULL);
    /* A tensor nested inside a long one is caught even after a short one. */
    write_json("{\"a\":{\"dtype\":\"U8\",\"shape\":[10],\"data_offsets\":[0,10]},"
               "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
               "\"c\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[6,8]}}",
               10);
    open_fails(g_dir, KILN_ERR_MALFORMED, "tensor b", "overlap tensor a", NULL);
    /* Touching is not overlapping; a gap is allowed. */
    write_json("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]},"
               "\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[9,10]}}",
               10);
    kiln_model *m = open_ok(g_dir);
    cr_assert_eq(m->n_tensors, 3);
    kiln_model_close(m);
}

Test(safetensors, paths_that_hold_no_model)
{
    open_fails(g_dir, KILN_ERR_NOT_FOUND, "model.safetensors.index.json", NULL);
    open_fails(in_dir("absent.safetensors"), KILN_ERR_IO, "absent.safetensors", NULL);
    mkdir(in_dir("model.safetensors"), 0700);
    open_fails(g_dir, KILN_ERR_IO, "not a regular file", NULL);
    rmdir(in_dir("model.safetensors"));
    kiln_model *m;
    cr_assert_eq(kiln_safetensors_open(NULL, &m), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_safetensors_open(g_dir, NULL), KILN_ERR_INVALID_ARG);
}

Test(safetensors, index_errors_name_the_shard_and_tensor)
{
    write_two_shards();
    const char *ix = in_dir("model.safetensors.index.json");
    write_text(ix, "{\"weight_map\": {\"layers.0.a\": \"model-00001-of-00002.safetensors\","
                   " \"layers.2.x\": \"model-00003-of-00003.safetensors\"}}");
    open_fails(g_dir, KILN_ERR_IO, "model.safetensors.index.json: tensor layers.2.x",
               "model-00003-of-00003.safetensors", "cannot open", NULL);
    write_text(ix, "{\"weight_map\": {\"layers.0.a\": \"model-00001-of-00002.safetensors\","
                   " \"layers.9.z\": \"model-00002-of-00002.safetensors\"}}");
    open_fails(g_dir, KILN_ERR_MALFORMED, "tensor layers.9.z: not found in shard model-00002-of-00002", NULL);
    write_text(ix, "{\"weight_map\": {\"layers.0.a\": \"model-00001-of-00002.safetensors\","
                   " \"layers.1.c\": \"model-00001-of-00002.safetensors\","
                   " \"layers.0.b\": \"model-00002-of-00002.safetensors\"}}");
    open_fails(g_dir, KILN_ERR_MALFORMED,
               "tensor layers.1.c: listed in shard model-00001-of-00002.safetensors", NULL);
    write_text(ix, "{\"weight_map\": {\"layers.0.a\": \"../model-00001-of-00002.safetensors\"}}");
    open_fails(g_dir, KILN_ERR_MALFORMED, "tensor layers.0.a: shard is not a file name", NULL);
    write_text(ix, "{\"weight_map\": {\"layers.0.a\": 1}}");
    open_fails(g_dir, KILN_ERR_MALFORMED, "tensor layers.0.a: shard is not a file name", NULL);
    write_text(ix, "{\"metadata\": {}}");
    open_fails(g_dir, KILN_ERR_MALFORMED, "model.safetensors.index.json: no weight_map", NULL);
    write_text(ix, "{\"weight_map\": {\"a\": \"x\", \"a\": \"y\"}}");
    open_fails(g_dir, KILN_ERR_MALFORMED, "model.safetensors.index.json: line 1", "duplicate", NULL);
    write_text(ix, "[]");
    open_fails(g_dir, KILN_ERR_MALFORMED, "model.safetensors.index.json: not a JSON object", NULL);

    /* The same tensor in two shards. */
    float a[2] = { 1, 2 };
    stb *b = stb_new();
    stb_tensor(b, "layers.0.a", "F32", "[2]", a, sizeof a);
    stb_write(b, in_dir("model-00002-of-00002.safetensors"), 0);
    free(b);
    write_text(ix, "{\"weight_map\": {\"layers.0.a\": \"model-00001-of-00002.safetensors\","
                   " \"layers.1.c\": \"model-00002-of-00002.safetensors\"}}");
    open_fails(g_dir, KILN_ERR_MALFORMED, "model-00002-of-00002.safetensors: tensor layers.0.a: stored twice",
               NULL);
    unlink(ix);
    open_fails(ix, KILN_ERR_IO, "model.safetensors.index.json", NULL);
}

Test(safetensors, config_json_errors_name_the_file_and_place)
{
    float w = 1;
    stb *b = stb_new();
    stb_tensor(b, "w", "F32", "[1]", &w, 4);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    struct {
        const char *json, *what;
    } bad[] = {
        { "{\"hidden_size\": 64,\n \"vocab_size\": }", "config.json: line 2 column" },
        { "{\"a\": 1, \"a\": 2}", "duplicate" },
        { "[1]", "config.json: not a JSON object" },
        { "{\"hidden_size\": \"64\"}", "config.json: hidden_size is not a non-negative integer" },
        { "{\"num_hidden_layers\": -2}", "num_hidden_layers is not a non-negative integer" },
        { "{\"rms_norm_eps\": \"small\"}", "rms_norm_eps" },
        { "{\"architectures\": \"Llama\"}", "architectures is not an array of strings" },
        { "{\"architectures\": [3]}", "architectures is not an array of strings" },
        { "{\"quantization_config\": 3}", "quantization settings are not a JSON object" },
        { "{\"quantization_config\": {\"quant_method\": 8}}", "quant_method / quant_algo is not a string" },
        { "{\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [128]}}",
          "weight_block_size is not [rows, cols]" },
        { "{\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [0, 128]}}",
          "weight_block_size" },
        { "{\"quantization_config\": {\"quant_algo\": \"NVFP4\", \"group_size\": \"16\"}}",
          "group_size is not a positive integer" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(in_dir("config.json"), bad[i].json);
        open_fails(g_dir, KILN_ERR_MALFORMED, "config.json", bad[i].what, NULL);
    }
    write_text(in_dir("config.json"), "{}");
    write_text(in_dir("hf_quant_config.json"), "{\"producer\": {}}");
    open_fails(g_dir, KILN_ERR_MALFORMED, "hf_quant_config.json: no quantization object", NULL);
    write_text(in_dir("hf_quant_config.json"),
               "{\"quantization\": {\"quant_algo\": \"NVFP4\",\n\"group_size\": 0}}");
    open_fails(g_dir, KILN_ERR_MALFORMED, "hf_quant_config.json: group_size", NULL);
}

Test(safetensors, weight_and_scale_shapes_must_agree)
{
    uint8_t q[4 * 32] = { 0 };
    float s[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
    struct {
        const char *scale_name, *scale_dtype, *scale_shape;
        size_t scale_bytes;
        const char *what;
    } bad[] = {
        { "x.weight_scale", "F32", "[5]", 20,
          "tensor x.weight_scale: F32 [5] does not fit weight x.weight [4, 32]" },
        { "x.weight_scale", "F32", "[4, 2]", 32, "expected [], [1], [N] or [N, 1]" },
        { "x.weight_scale", "F32", "[2, 1]", 8, "x.weight_scale" },
        { "x.weight_scale_inv", "F32", "[1, 2]", 8,
          "tensor x.weight_scale_inv: F32 [1, 2] does not fit weight x.weight" },
        { "x.weight_scale_inv", "F32", "[1]", 4, "[ceil(N/128), ceil(K/128)] = [1, 1]" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        stb *b = stb_new();
        stb_tensor(b, "x.weight", "F8_E4M3", "[4, 32]", q, sizeof q);
        stb_tensor(b, bad[i].scale_name, bad[i].scale_dtype, bad[i].scale_shape, s, bad[i].scale_bytes);
        stb_write(b, in_dir("model.safetensors"), 0);
        free(b);
        open_fails(g_dir, KILN_ERR_MALFORMED, "model.safetensors", bad[i].what, NULL);
    }

    stb *b = stb_new();
    stb_tensor(b, "x.weight", "F8_E4M3", "[4, 32]", q, sizeof q);
    stb_tensor(b, "x.weight_scale", "F32", "[]", s, 4);
    stb_tensor(b, "x.weight_scale_inv", "F32", "[1, 1]", s, 4);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    open_fails(g_dir, KILN_ERR_MALFORMED, "tensor x.weight: has both x.weight_scale and x.weight_scale_inv",
               NULL);
}

Test(safetensors, nvfp4_parts_must_agree)
{
    uint8_t q[4 * 32] = { 0 }, sc[16] = { 0 };
    float g = 1;
    struct {
        const char *scale_shape, *g_dtype, *g_shape;
        int with_g;
        const char *what;
    } bad[] = {
        { "[4, 2, 2]", "F32", "[]", 1,
          "tensor p.weight_scale: F8_E4M3 [4, 2, 2] does not fit weight p.weight [4, 32]" },
        { "[2, 8]", "F32", "[]", 1, "[N, K/16]" },
        { "[4, 4]", "F32", "[]", 0,
          "tensor p.weight: NVFP4 weight with p.weight_scale but no weight_scale_2" },
        { "[4, 4]", "F32", "[2]", 1,
          "tensor p.weight_scale_2: global scale of NVFP4 weight p.weight is not an F32, BF16 or "
          "F16 scalar" },
        { "[4, 4]", "I32", "[]", 1, "p.weight_scale_2" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        stb *b = stb_new();
        stb_tensor(b, "p.weight", "U8", "[4, 32]", q, sizeof q);
        stb_tensor(b, "p.weight_scale", "F8_E4M3", bad[i].scale_shape, sc, 16);
        float g2[2] = { g, g };
        if (bad[i].with_g)
            stb_tensor(b, "p.weight_scale_2", bad[i].g_dtype, bad[i].g_shape, g2,
                       strcmp(bad[i].g_shape, "[2]") ? 4 : 8);
        stb_write(b, in_dir("model.safetensors"), 0);
        free(b);
        open_fails(g_dir, KILN_ERR_MALFORMED, "model.safetensors", bad[i].what, NULL);
    }
    /* A U8 weight beside an F32 weight_scale is no convention: listed, not joined. */
    stb *b = stb_new();
    stb_tensor(b, "p.weight", "U8", "[4, 32]", q, sizeof q);
    stb_tensor(b, "p.weight_scale", "F32", "[]", &g, 4);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    kiln_model *m = open_ok(g_dir);
    cr_assert_not(find(m, "p.weight")->supported);
    cr_assert(strstr(find(m, "p.weight")->why, "F32 weight_scale"), "%s", find(m, "p.weight")->why);
    kiln_model_close(m);
}

Test(safetensors, mxfp4_parts_must_agree)
{
    uint8_t blocks[4 * 2 * 16] = { 0 }, scales[16] = { 0 };
    struct {
        const char *bshape, *sshape;
        size_t bbytes, sbytes;
    } bad[] = {
        { "[4, 2, 16]", "[4, 1]", 128, 4 },    { "[4, 2, 16]", "[2, 4]", 128, 8 },
        { "[4, 4, 8]", "[4, 4]", 128, 16 },    { "[8, 16]", "[8]", 128, 8 },
        { "[1, 4, 2, 16]", "[4, 2]", 128, 8 },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        stb *b = stb_new();
        stb_tensor(b, "m.down_proj_blocks", "U8", bad[i].bshape, blocks, bad[i].bbytes);
        stb_tensor(b, "m.down_proj_scales", "U8", bad[i].sshape, scales, bad[i].sbytes);
        stb_write(b, in_dir("model.safetensors"), 0);
        free(b);
        open_fails(g_dir, KILN_ERR_MALFORMED, "model.safetensors: tensor m.down_proj_scales",
                   "does not fit weight m.down_proj_blocks", "[..., N, K/32, 16]", NULL);
    }
    stb *b = stb_new();
    stb_tensor(b, "m.down_proj", "U8", "[1]", scales, 1);
    stb_tensor(b, "m.down_proj_blocks", "U8", "[4, 2, 16]", blocks, 128);
    stb_tensor(b, "m.down_proj_scales", "U8", "[4, 2]", scales, 8);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    open_fails(g_dir, KILN_ERR_MALFORMED,
               "tensor m.down_proj_blocks: MXFP4 weight m.down_proj is also stored", NULL);
}

Test(safetensors, shapes_kiln_formats_refuse_are_listed_unsupported)
{
    uint8_t q[2 * 2 * 8] = { 0 }, sc[4] = { 0 };
    float one = 1;
    stb *b = stb_new();
    stb_tensor(b, "empty.weight", "F8_E4M3", "[0, 16]", q, 0);
    stb_tensor(b, "empty.weight_scale", "F32", "[]", &one, 4);
    stb_tensor(b, "cube.weight", "U8", "[2, 2, 8]", q, sizeof q);
    stb_tensor(b, "cube.weight_scale", "F8_E4M3", "[2, 2]", sc, sizeof sc);
    stb_tensor(b, "cube.weight_scale_2", "F32", "[]", &one, 4);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    kiln_model *m = open_ok(g_dir);
    const kiln_model_tensor *e = find(m, "empty.weight");
    cr_assert_not(e->supported);
    cr_assert(strstr(e->why, "fp8 [0, 16]: "), "%s", e->why);
    const kiln_model_tensor *c = find(m, "cube.weight");
    cr_assert_not(c->supported);
    cr_assert(strstr(c->why, "NVFP4 weight of rank 3"), "%s", c->why);
    kiln_model_close(m);

    /* Empty MXFP4 blocks whose K would not fit in 64 bits. */
    b = stb_new();
    stb_tensor(b, "x_blocks", "U8", "[0, 288230376151711744, 16]", q, 0);
    stb_tensor(b, "x_scales", "U8", "[0, 288230376151711744]", q, 0);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    open_fails(g_dir, KILN_ERR_MALFORMED, "tensor x_scales", "K = 32 x groups to fit in 64 bits", NULL);
}

Test(safetensors, oversized_json_files_are_refused_unread)
{
    float w = 1;
    stb *b = stb_new();
    stb_tensor(b, "w", "F32", "[1]", &w, 4);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    /* Sparse: the reader must refuse it from its size alone. */
    FILE *f = fopen(in_dir("config.json"), "wb");
    cr_assert(f);
    cr_assert_eq(ftruncate(fileno(f), 100 * 1000 * 1000 + 1), 0);
    fclose(f);
    open_fails(g_dir, KILN_ERR_MALFORMED, "config.json: 100000001 bytes", NULL);
}

/* Every way a quantized weight can hold no bytes: each is listed, refused by
 * name, and never handed out as a weight whose shape promises more bytes
 * than are behind it. A gpt-oss pair of 0 experts once became an N x K
 * weight over 0 bytes. */
Test(safetensors, zero_byte_weights_of_every_kind_are_refused_by_name)
{
    uint8_t z[1] = { 0 };
    float one = 1;
    static const struct {
        const char *name, *why;
    } want[] = {
        { "gptoss.down_proj", "a stack of 0 experts [0, 4, 64] holds no weight" },
        { "rows.down_proj", "mxfp4 [0, 64]" },
        { "groups.down_proj", "mxfp4 [4, 0]" },
        { "fp8.weight", "fp8 [0, 16]" },
        { "fp8k.weight", "fp8_channel [4, 0]" },
        { "nvfp4.weight", "nvfp4 [0, 32]" },
    };
    stb *b = stb_new();
    stb_tensor(b, "gptoss.down_proj_blocks", "U8", "[0, 4, 2, 16]", z, 0);
    stb_tensor(b, "gptoss.down_proj_scales", "U8", "[0, 4, 2]", z, 0);
    stb_tensor(b, "rows.down_proj_blocks", "U8", "[0, 2, 16]", z, 0);
    stb_tensor(b, "rows.down_proj_scales", "U8", "[0, 2]", z, 0);
    stb_tensor(b, "groups.down_proj_blocks", "U8", "[4, 0, 16]", z, 0);
    stb_tensor(b, "groups.down_proj_scales", "U8", "[4, 0]", z, 0);
    stb_tensor(b, "fp8.weight", "F8_E4M3", "[0, 16]", z, 0);
    stb_tensor(b, "fp8.weight_scale", "F32", "[]", &one, 4);
    stb_tensor(b, "fp8k.weight", "F8_E4M3", "[4, 0]", z, 0);
    stb_tensor(b, "fp8k.weight_scale", "F32", "[4]", (float[4]){ 1, 1, 1, 1 }, 16);
    stb_tensor(b, "nvfp4.weight", "U8", "[0, 16]", z, 0);
    stb_tensor(b, "nvfp4.weight_scale", "F8_E4M3", "[0, 2]", z, 0);
    stb_tensor(b, "nvfp4.weight_scale_2", "F32", "[]", &one, 4);
    stb_write(b, in_dir("model.safetensors"), 0);
    free(b);
    kiln_model *m = open_ok(g_dir);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const kiln_model_tensor *t = find(m, want[i].name);
        cr_assert_not(t->supported, "%s", want[i].name);
        cr_assert_eq(t->bytes, 0, "%s", want[i].name);
        cr_assert(t->why && strstr(t->why, want[i].why), "%s: %s", want[i].name, t->why);
        kiln_qtensor q;
        cr_assert_eq(kiln_model_weight(m, want[i].name, &q), KILN_ERR_UNSUPPORTED);
        cr_assert(strstr(kiln_last_error(), want[i].name), "%s", kiln_last_error());
    }
    const kiln_model_tensor *g = find(m, "gptoss.down_proj");
    cr_assert_eq(g->n_dims, 3);
    cr_assert_eq(g->ne[2], 0);
    /* Whatever is usable agrees with its format about its bytes. */
    for (int i = 0; i < m->n_tensors; i++) {
        const kiln_model_tensor *t = &m->tensors[i];
        size_t bytes;
        if (t->supported && t->qt.format != KILN_FMT_F32)
            cr_assert(kiln_format_data_bytes(t->qt.format, t->qt.n, t->qt.k, &bytes) == KILN_OK &&
                          bytes == t->bytes,
                      "%s", t->name);
    }
    kiln_model_close(m);
}

/* Phi-3 keeps its gate and up projections in one tensor, gate_up_proj:
 * the FFN built from it runs exactly as the one built from the two
 * halves stored apart; FP8 per-channel scales are split with the rows.
 * An odd number of rows is refused naming the tensor. */
Test(safetensors, phi3_gate_up_proj_is_split_in_halves)
{
    enum { D = 64, F = 128, M = 3 };
    kt_rng r = kt_rng_new(7);
    static uint8_t gate[F * D], up[F * D], both[2 * F * D];
    static float down[D * F], norm[D], sg[F], su[F], sboth[2 * F], x[M * D], y[2][M * D];
    random_e4m3(&r, gate, sizeof gate);
    random_e4m3(&r, up, sizeof up);
    random_f32(&r, sg, F, 0.001f, 0.01f);
    random_f32(&r, su, F, 0.001f, 0.01f);
    random_f32(&r, down, D * F, -0.1f, 0.1f);
    random_f32(&r, norm, D, 0.5f, 1.5f);
    random_f32(&r, x, M * D, -1.0f, 1.0f);
    memcpy(both, gate, sizeof gate);
    memcpy(both + sizeof gate, up, sizeof up);
    memcpy(sboth, sg, sizeof sg);
    memcpy(sboth + F, su, sizeof su);
    static const char *const files[] = { "split.safetensors", "fused.safetensors" };
    for (int fused = 0; fused < 2; fused++) {
        stb *b = stb_new();
        if (fused) {
            stb_tensor(b, "model.layers.0.mlp.gate_up_proj.weight", "F8_E4M3", "[256, 64]", both,
                       sizeof both);
            stb_tensor(b, "model.layers.0.mlp.gate_up_proj.weight_scale", "F32", "[256, 1]",
                       sboth, sizeof sboth);
        } else {
            stb_tensor(b, "model.layers.0.mlp.gate_proj.weight", "F8_E4M3", "[128, 64]", gate,
                       sizeof gate);
            stb_tensor(b, "model.layers.0.mlp.gate_proj.weight_scale", "F32", "[128, 1]", sg,
                       sizeof sg);
            stb_tensor(b, "model.layers.0.mlp.up_proj.weight", "F8_E4M3", "[128, 64]", up,
                       sizeof up);
            stb_tensor(b, "model.layers.0.mlp.up_proj.weight_scale", "F32", "[128, 1]", su,
                       sizeof su);
        }
        stb_tensor(b, "model.layers.0.mlp.down_proj.weight", "F32", "[64, 128]", down,
                   sizeof down);
        stb_tensor(b, "model.layers.0.post_attention_layernorm.weight", "F32", "[64]", norm,
                   sizeof norm);
        stb_write(b, in_dir(files[fused]), 0);
        free(b);
    }
    write_text(in_dir("config.json"),
               "{\"architectures\": [\"Phi3ForCausalLM\"], \"num_hidden_layers\": 1, "
               "\"hidden_size\": 64, \"quantization_config\": {\"quant_method\": \"fp8\", "
               "\"weight_block_size\": null}}");
    for (int fused = 0; fused < 2; fused++) {
        kiln_model *m = open_ok(in_dir(files[fused]));
        kiln_graph *g;
        cr_assert_eq(kiln_graph_create(&g), KILN_OK);
        cr_assert_eq(kiln_model_build_ffn(m, g, 0), KILN_OK, "%s", kiln_last_error());
        if (fused) {
            const kiln_tensor *h = kiln_graph_find(g, "model.layers.0.mlp.gate_up_proj.weight:up");
            cr_assert(h && h->weight.n == F && h->weight.k == D);
            cr_assert_eq(h->weight.format, KILN_FMT_FP8_CHANNEL);
        }
        kiln_cpu *cpu;
        cr_assert_eq(kiln_cpu_create(g, &(kiln_cpu_options){ .threads = 1 }, &cpu), KILN_OK);
        const float *in[] = { x };
        float *out[] = { y[fused] };
        cr_assert_eq(kiln_cpu_run(cpu, M, in, out), KILN_OK, "%s", kiln_last_error());
        kiln_cpu_destroy(cpu);
        kiln_graph_destroy(g);
        kiln_model_close(m);
    }
    cr_assert_eq(memcmp(y[0], y[1], sizeof y[0]), 0, "the fused tensor's halves run otherwise");

    stb *b = stb_new();
    stb_tensor(b, "model.layers.0.mlp.gate_up_proj.weight", "F32", "[3, 64]", down,
               3 * D * sizeof(float));
    stb_tensor(b, "model.layers.0.mlp.down_proj.weight", "F32", "[64, 128]", down, sizeof down);
    stb_tensor(b, "model.layers.0.post_attention_layernorm.weight", "F32", "[64]", norm,
               sizeof norm);
    stb_write(b, in_dir("odd.safetensors"), 0);
    free(b);
    kiln_model *m = open_ok(in_dir("odd.safetensors"));
    kiln_graph *g;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    cr_assert_eq(kiln_model_build_ffn(m, g, 0), KILN_ERR_SHAPE);
    cr_assert(strstr(kiln_last_error(), "gate_up_proj.weight") &&
                  strstr(kiln_last_error(), "even number of rows"),
              "%s", kiln_last_error());
    kiln_graph_destroy(g);
    kiln_model_close(m);

    /* 128x128 block FP8 of 128 rows: the halves would cut a block of
     * scales, refused naming the tensor. */
    static uint8_t block[128 * D];
    random_e4m3(&r, block, sizeof block);
    b = stb_new();
    stb_tensor(b, "model.layers.0.mlp.gate_up_proj.weight", "F8_E4M3", "[128, 64]", block,
               sizeof block);
    stb_tensor(b, "model.layers.0.mlp.gate_up_proj.weight_scale_inv", "F32", "[1, 1]", sg, 4);
    stb_tensor(b, "model.layers.0.mlp.down_proj.weight", "F32", "[64, 64]", down,
               (size_t)D * D * sizeof(float));
    stb_tensor(b, "model.layers.0.post_attention_layernorm.weight", "F32", "[64]", norm,
               sizeof norm);
    stb_write(b, in_dir("block.safetensors"), 0);
    free(b);
    write_text(in_dir("config.json"),
               "{\"architectures\": [\"Phi3ForCausalLM\"], \"num_hidden_layers\": 1, "
               "\"hidden_size\": 64, \"quantization_config\": {\"quant_method\": \"fp8\", "
               "\"weight_block_size\": [128, 128]}}");
    m = open_ok(in_dir("block.safetensors"));
    cr_assert_eq(find(m, "model.layers.0.mlp.gate_up_proj.weight")->qt.format, KILN_FMT_FP8_BLOCK);
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    cr_assert_eq(kiln_model_build_ffn(m, g, 0), KILN_ERR_SHAPE);
    cr_assert(strstr(kiln_last_error(), "gate_up_proj.weight") &&
                  strstr(kiln_last_error(), "inside a block of 128 rows"),
              "%s", kiln_last_error());
    kiln_graph_destroy(g);
    kiln_model_close(m);
}
