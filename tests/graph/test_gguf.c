/* graph/gguf.c: GGUF files are built here byte by byte, valid ones and
 * every kind of broken one, and read back. */
#include "graph/gguf.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* ------------------------------------------------------------- the writer */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        cr_assert_not_null(b->p);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_le(buf *b, uint64_t v, size_t n)
{
    uint8_t x[8];
    for (size_t i = 0; i < n; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    put(b, x, n);
}

static void put_u8(buf *b, uint8_t v) { put_le(b, v, 1); }
static void put_u32(buf *b, uint32_t v) { put_le(b, v, 4); }
static void put_u64(buf *b, uint64_t v) { put_le(b, v, 8); }

static void put_f32(buf *b, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    put_u32(b, u);
}

static void put_f64(buf *b, double f)
{
    uint64_t u;
    memcpy(&u, &f, 8);
    put_u64(b, u);
}

static void put_strn(buf *b, const char *s, size_t n)
{
    put_u64(b, n);
    put(b, s, n);
}

static void put_str(buf *b, const char *s) { put_strn(b, s, strlen(s)); }

static void put_header(buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    put(b, "GGUF", 4);
    put_u32(b, version);
    put_u64(b, n_tensors);
    put_u64(b, n_kv);
}

/* A key and its value type; the caller writes the value. */
static void put_key(buf *b, const char *key, kiln_gguf_type type)
{
    put_str(b, key);
    put_u32(b, type);
}

static void put_kv_u32(buf *b, const char *key, uint32_t v)
{
    put_key(b, key, KILN_GGUF_UINT32);
    put_u32(b, v);
}

static void put_kv_str(buf *b, const char *key, const char *v)
{
    put_key(b, key, KILN_GGUF_STRING);
    put_str(b, v);
}

static void put_tensor_info(buf *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                            uint32_t type, uint64_t offset)
{
    put_str(b, name);
    put_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        put_u64(b, ne[d]);
    put_u32(b, type);
    put_u64(b, offset);
}

static void pad_to(buf *b, size_t align)
{
    while (b->n % align)
        put_u8(b, 0);
}

static void put_random(buf *b, kt_rng *r, size_t n)
{
    for (size_t i = 0; i < n; i++)
        put_u8(b, (uint8_t)kt_next(r));
}

static char file_path[256];

static kiln_status open_buf(const buf *b, kiln_model **out)
{
    if (!file_path[0]) {
        const char *dir = getenv("TMPDIR");
        snprintf(file_path, sizeof file_path, "%s/kiln-test-gguf-XXXXXX", dir && dir[0] ? dir : "/tmp");
        int fd = mkstemp(file_path);
        cr_assert_geq(fd, 0);
        close(fd);
    }
    FILE *f = fopen(file_path, "wb");
    cr_assert_not_null(f);
    if (b->n)
        cr_assert_eq(fwrite(b->p, 1, b->n, f), b->n);
    fclose(f);
    kiln_clear_error();
    return kiln_gguf_open(file_path, out);
}

static void cleanup(void)
{
    if (file_path[0])
        unlink(file_path);
}

/* Opening b fails with status want and a message that starts with the
 * file's path and holds every given fragment. */
static void expect_fail(const buf *b, kiln_status want, ...)
{
    kiln_model *m = (kiln_model *)(uintptr_t)0x1;
    kiln_status st = open_buf(b, &m);
    const char *msg = kiln_last_error();
    cr_assert_eq(st, want, "status %s, want %s: %s", kiln_strerror(st), kiln_strerror(want), msg);
    cr_assert_eq(m, (kiln_model *)(uintptr_t)0x1, "out must stay untouched on failure");
    cr_assert_eq(strncmp(msg, file_path, strlen(file_path)), 0, "message: %s", msg);
    va_list ap;
    va_start(ap, want);
    for (const char *frag; (frag = va_arg(ap, const char *));)
        cr_assert_not_null(strstr(msg, frag), "'%s' not in: %s", frag, msg);
    va_end(ap);
}

/* The last error starts with the file's path and holds frag. */
static void expect_file_error(const char *frag)
{
    const char *msg = kiln_last_error();
    cr_assert_eq(strncmp(msg, file_path, strlen(file_path)), 0, "message: %s", msg);
    cr_assert_not_null(strstr(msg, frag), "'%s' not in: %s", frag, msg);
}

/* -------------------------------------------------------- the valid model */

#define T_K 64
enum { TY_F32 = 0, TY_Q4_0 = 2, TY_Q8_0 = 8, TY_Q4_K = 12, TY_Q6_K = 14, TY_IQ3_S = 21,
       TY_BF16 = 30, TY_MXFP4 = 39 };

/* Where a piece of the valid model sits, for tests that break that piece. */
typedef struct layout {
    size_t n_tensors_at, n_kv_at;
    size_t data_start;
    size_t tensor_at[3];     /* each tensor info */
    size_t offset_field[3];  /* each tensor's data offset field */
    size_t data_at[3];       /* each tensor's data in the file */
    size_t bytes[3];
} layout;

/* A Llama-ish file: architecture keys, a token list, and three tensors
 * (Q8_0 [64 x 3], F32 [64], IQ3_S [256 x 1]) whose last byte is the last
 * byte of the file, so that every shorter prefix is invalid. */
static void make_model(buf *b, uint32_t version, uint32_t alignment, kt_rng *r, layout *lay)
{
    layout l = {0};
    const int n_kv = 10 + (alignment != 0);
    put(b, "GGUF", 4);
    put_u32(b, version);
    l.n_tensors_at = b->n;
    put_u64(b, 3);
    l.n_kv_at = b->n;
    put_u64(b, (uint64_t)n_kv);
    put_kv_str(b, "general.architecture", "llama");
    if (alignment)
        put_kv_u32(b, "general.alignment", alignment);
    put_kv_u32(b, "llama.block_count", 2);
    put_key(b, "llama.embedding_length", KILN_GGUF_UINT64);
    put_u64(b, T_K);
    put_key(b, "llama.feed_forward_length", KILN_GGUF_INT32);
    put_u32(b, 3 * T_K);
    put_kv_u32(b, "llama.attention.head_count", 4);
    put_key(b, "llama.attention.head_count_kv", KILN_GGUF_UINT16);
    put_le(b, 2, 2);
    put_kv_u32(b, "llama.context_length", 4096);
    put_key(b, "llama.attention.layer_norm_rms_epsilon", KILN_GGUF_FLOAT32);
    put_f32(b, 1e-5f);
    put_key(b, "tokenizer.ggml.tokens", KILN_GGUF_ARRAY);
    put_u32(b, KILN_GGUF_STRING);
    put_u64(b, 5);
    const char *tokens[] = {"<unk>", "<s>", "</s>", "a", "b"};
    for (int i = 0; i < 5; i++)
        put_str(b, tokens[i]);
    put_kv_str(b, "general.name", "tiny");

    size_t align = alignment ? alignment : 32;
    l.bytes[0] = (T_K / 32) * 34 * 3;
    l.bytes[1] = T_K * 4;
    l.bytes[2] = 110;
    uint64_t off[3];
    off[0] = 0;
    off[1] = (l.bytes[0] + align - 1) / align * align;
    off[2] = (off[1] + l.bytes[1] + align - 1) / align * align;
    const char *names[3] = {"blk.0.ffn_up.weight", "blk.0.attn_norm.weight", "blk.0.ffn_down.weight"};
    const uint64_t ne[3][2] = {{T_K, 3}, {T_K, 1}, {256, 1}};
    const uint32_t types[3] = {TY_Q8_0, TY_F32, TY_IQ3_S};
    const uint32_t dims[3] = {2, 1, 2};
    for (int i = 0; i < 3; i++) {
        l.tensor_at[i] = b->n;
        put_tensor_info(b, names[i], dims[i], ne[i], types[i], off[i]);
        l.offset_field[i] = b->n - 8;
    }
    pad_to(b, align);
    l.data_start = b->n;
    for (int i = 0; i < 3; i++) {
        while (b->n < l.data_start + off[i])
            put_u8(b, 0);
        l.data_at[i] = b->n;
        put_random(b, r, l.bytes[i]);
    }
    if (lay)
        *lay = l;
}

static void check_model(const kiln_model *m, const buf *b, const layout *l, uint32_t version)
{
    char container[16];
    snprintf(container, sizeof container, "gguf v%u", version);
    cr_assert_str_eq(m->container, container);
    cr_assert_str_eq(m->path, file_path);
    cr_assert_str_eq(m->hp.arch, "llama");
    cr_assert_eq(m->hp.n_layers, 2);
    cr_assert_eq(m->hp.d_model, T_K);
    cr_assert_eq(m->hp.d_ffn, 3 * T_K);
    cr_assert_eq(m->hp.n_heads, 4);
    cr_assert_eq(m->hp.n_kv_heads, 2);
    cr_assert_eq(m->hp.ctx, 4096);
    cr_assert_eq(m->hp.vocab, 5);
    cr_assert_eq(m->hp.rms_eps, 1e-5f);

    cr_assert_eq(m->n_tensors, 3);
    const kiln_model_tensor *t = m->tensors;
    cr_assert_str_eq(t[0].name, "blk.0.ffn_up.weight");
    cr_assert_str_eq(t[0].type_name, "Q8_0");
    cr_assert_eq(t[0].supported, 1);
    cr_assert_eq(t[0].n_dims, 2);
    cr_assert_eq(t[0].ne[0], T_K);
    cr_assert_eq(t[0].ne[1], 3);
    cr_assert_eq(t[0].ne[2], 1);
    cr_assert_eq(t[0].qt.format, KILN_FMT_Q8_0);
    cr_assert_eq(t[0].qt.k, T_K);
    cr_assert_eq(t[0].qt.n, 3);
    cr_assert_null(t[0].qt.scale);
    cr_assert_null(t[0].why);

    cr_assert_str_eq(t[1].type_name, "F32");
    cr_assert_eq(t[1].n_dims, 1);
    cr_assert_eq(t[1].qt.format, KILN_FMT_F32);
    cr_assert_eq(t[1].qt.k, T_K);
    cr_assert_eq(t[1].qt.n, 1);

    cr_assert_str_eq(t[2].name, "blk.0.ffn_down.weight");
    cr_assert_str_eq(t[2].type_name, "IQ3_S");
    cr_assert_eq(t[2].supported, 0);
    cr_assert_not_null(t[2].why);
    cr_assert_str_eq(t[2].why, "GGML type 21 has no kiln format (kiln reads F32, F16, BF16, "
                               "Q8_0, Q4_0, Q4_K, Q6_K, MXFP4, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, "
                               "IQ4_NL, IQ4_XS, Q4_1)");
    cr_assert_null(t[2].qt.data);

    for (int i = 0; i < 3; i++) {
        cr_assert_eq(t[i].bytes, l->bytes[i]);
        if (!t[i].supported)
            continue;
        /* The data is the file's own bytes, seen through the mapping. */
        cr_assert_eq(memcmp(t[i].qt.data, b->p + l->data_at[i], l->bytes[i]), 0);
        size_t want;
        cr_assert_eq(kiln_format_data_bytes(t[i].qt.format, t[i].qt.n, t[i].qt.k, &want), KILN_OK);
        cr_assert_eq(want, t[i].bytes);
    }
}

static void open_valid(uint32_t version, uint32_t alignment)
{
    kt_rng r = kt_rng_new(version * 100 + alignment);
    buf b = {0};
    layout l;
    make_model(&b, version, alignment, &r, &l);
    kiln_model *m = NULL;
    kiln_status st = open_buf(&b, &m);
    cr_assert_eq(st, KILN_OK, "%s", kiln_last_error());
    check_model(m, &b, &l, version);
    if (alignment)
        cr_assert_eq(l.data_start % alignment, 0);
    kiln_model_close(m);
    free(b.p);
}

TestSuite(gguf, .fini = cleanup);

Test(gguf, opens_v3) { open_valid(3, 0); }
Test(gguf, opens_v2) { open_valid(2, 0); }
Test(gguf, alignment_64) { open_valid(3, 64); }
Test(gguf, alignment_4096) { open_valid(3, 4096); }
Test(gguf, alignment_1) { open_valid(3, 1); }

Test(gguf, lists_metadata_in_file_order)
{
    kt_rng r = kt_rng_new(7);
    buf b = {0};
    make_model(&b, 3, 0, &r, NULL);
    kiln_model *m;
    cr_assert_eq(open_buf(&b, &m), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_gguf_n_kv(m), 10);
    const kiln_gguf_value *v = NULL;
    cr_assert_str_eq(kiln_gguf_kv_at(m, 0, &v), "general.architecture");
    cr_assert_eq(v->type, KILN_GGUF_STRING);
    cr_assert_str_eq(kiln_gguf_kv_at(m, 9, NULL), "general.name");
    cr_assert_null(kiln_gguf_kv_at(m, 10, &v));
    cr_assert_null(kiln_gguf_kv_at(m, -1, &v));
    /* Every key listed is found by lookup, with the same value. */
    for (int i = 0; i < kiln_gguf_n_kv(m); i++) {
        const char *key = kiln_gguf_kv_at(m, i, &v);
        cr_assert_eq(kiln_gguf_get(m, key), v, "%s", key);
    }
    cr_assert_null(kiln_gguf_get(m, "general.missing"));
    cr_assert_null(kiln_gguf_get(m, NULL));
    kiln_model_close(m);
    free(b.p);
}

/* A model not read from GGUF has no GGUF metadata. */
static void other_impl_free(void *p) { (void)p; }

Test(gguf, other_containers_have_no_metadata)
{
    kiln_model other = {.path = "x.safetensors", .impl_free = other_impl_free};
    cr_assert_null(kiln_gguf_get(&other, "general.architecture"));
    cr_assert_eq(kiln_gguf_n_kv(&other), 0);
    cr_assert_null(kiln_gguf_kv_at(&other, 0, NULL));
    cr_assert_eq(kiln_gguf_n_kv(NULL), 0);
    const char *key;
    char text[16];
    cr_assert_eq(kiln_model_n_metadata(&other), 0);
    cr_assert_eq(kiln_model_metadata_at(&other, 0, 3, &key, text, sizeof text),
                 KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "x.safetensors: metadata index 0 of 0"), "%s",
              kiln_last_error());
    int64_t i;
    cr_assert_eq(kiln_gguf_get_int(&other, "a", &i), KILN_ERR_NOT_FOUND);
    cr_assert(strstr(kiln_last_error(), "x.safetensors: no metadata key 'a'"), "%s", kiln_last_error());
}

Test(gguf, open_rejects_null_arguments)
{
    kiln_model *m;
    cr_assert_eq(kiln_gguf_open(NULL, &m), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_gguf_open("x.gguf", NULL), KILN_ERR_INVALID_ARG);
}

/* ----------------------------------------------------- every value type */

static void put_nested(buf *b, int levels)
{
    /* levels arrays deep, the innermost holding one int8 */
    for (int i = 1; i < levels; i++) {
        put_u32(b, KILN_GGUF_ARRAY);
        put_u64(b, 1);
    }
    put_u32(b, KILN_GGUF_INT8);
    put_u64(b, 1);
    put_u8(b, 0xfe);
}

static void make_all_types(buf *b)
{
    put_header(b, 3, 0, 20);
    put_key(b, "t.u8", KILN_GGUF_UINT8);
    put_u8(b, 0xff);
    put_key(b, "t.i8", KILN_GGUF_INT8);
    put_u8(b, 0x80);
    put_key(b, "t.u16", KILN_GGUF_UINT16);
    put_le(b, 0xfffe, 2);
    put_key(b, "t.i16", KILN_GGUF_INT16);
    put_le(b, 0x8000, 2);
    put_key(b, "t.u32", KILN_GGUF_UINT32);
    put_u32(b, 0xfffffffd);
    put_key(b, "t.i32", KILN_GGUF_INT32);
    put_u32(b, 0x80000000u);
    put_key(b, "t.f32", KILN_GGUF_FLOAT32);
    put_f32(b, -1.5e-7f);
    put_key(b, "t.bool", KILN_GGUF_BOOL);
    put_u8(b, 1);
    put_key(b, "t.str", KILN_GGUF_STRING);
    put_strn(b, "a\0b\"\n", 5);
    put_key(b, "t.u64", KILN_GGUF_UINT64);
    put_u64(b, UINT64_MAX);
    put_key(b, "t.i64", KILN_GGUF_INT64);
    put_u64(b, (uint64_t)INT64_MIN);
    put_key(b, "t.f64", KILN_GGUF_FLOAT64);
    put_f64(b, 3.141592653589793);
    put_key(b, "t.empty_str", KILN_GGUF_STRING);
    put_u64(b, 0);
    put_key(b, "t.arr_i16", KILN_GGUF_ARRAY);
    put_u32(b, KILN_GGUF_INT16);
    put_u64(b, 3);
    put_le(b, 1, 2);
    put_le(b, 0xffff, 2);
    put_le(b, 0x7fff, 2);
    put_key(b, "t.arr_str", KILN_GGUF_ARRAY);
    put_u32(b, KILN_GGUF_STRING);
    put_u64(b, 3);
    put_str(b, "x");
    put_str(b, "");
    put_str(b, "zzz");
    /* [[1.0, 2.0], ["s"], [[true]], []] */
    put_key(b, "t.arr_arr", KILN_GGUF_ARRAY);
    put_u32(b, KILN_GGUF_ARRAY);
    put_u64(b, 4);
    put_u32(b, KILN_GGUF_FLOAT64);
    put_u64(b, 2);
    put_f64(b, 1.0);
    put_f64(b, 2.0);
    put_u32(b, KILN_GGUF_STRING);
    put_u64(b, 1);
    put_str(b, "s");
    put_u32(b, KILN_GGUF_ARRAY);
    put_u64(b, 1);
    put_u32(b, KILN_GGUF_BOOL);
    put_u64(b, 1);
    put_u8(b, 1);
    put_u32(b, KILN_GGUF_UINT32);
    put_u64(b, 0);
    put_key(b, "t.arr_empty", KILN_GGUF_ARRAY);
    put_u32(b, KILN_GGUF_STRING);
    put_u64(b, 0);
    put_key(b, "t.arr_bool", KILN_GGUF_ARRAY);
    put_u32(b, KILN_GGUF_BOOL);
    put_u64(b, 2);
    put_u8(b, 0);
    put_u8(b, 1);
    put_key(b, "t.deepest", KILN_GGUF_ARRAY);
    put_nested(b, KILN_GGUF_MAX_DEPTH);
    put_key(b, "t.arr_f32", KILN_GGUF_ARRAY);
    put_u32(b, KILN_GGUF_FLOAT32);
    put_u64(b, 2);
    put_f32(b, 0.25f);
    put_f32(b, -8.0f);
}

static const kiln_gguf_value *get(const kiln_model *m, const char *key, kiln_gguf_type type)
{
    const kiln_gguf_value *v = kiln_gguf_get(m, key);
    cr_assert_not_null(v, "%s", key);
    cr_assert_eq(v->type, type, "%s: type %s", key, kiln_gguf_type_name(v->type));
    return v;
}

static kiln_gguf_value at(const kiln_gguf_value *arr, size_t i)
{
    kiln_gguf_value v;
    cr_assert_eq(kiln_gguf_array_at(arr, i, &v), KILN_OK, "%s", kiln_last_error());
    return v;
}

Test(gguf, every_value_type_round_trips)
{
    buf b = {0};
    make_all_types(&b);
    kiln_model *m;
    cr_assert_eq(open_buf(&b, &m), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(m->n_tensors, 0);
    cr_assert_str_eq(m->hp.arch, "");
    cr_assert_eq(get(m, "t.u8", KILN_GGUF_UINT8)->u, 0xff);
    cr_assert_eq(get(m, "t.i8", KILN_GGUF_INT8)->i, -128);
    cr_assert_eq(get(m, "t.u16", KILN_GGUF_UINT16)->u, 0xfffe);
    cr_assert_eq(get(m, "t.i16", KILN_GGUF_INT16)->i, -32768);
    cr_assert_eq(get(m, "t.u32", KILN_GGUF_UINT32)->u, 0xfffffffd);
    cr_assert_eq(get(m, "t.i32", KILN_GGUF_INT32)->i, INT32_MIN);
    cr_assert_eq(get(m, "t.f32", KILN_GGUF_FLOAT32)->f, (double)-1.5e-7f);
    cr_assert_eq(get(m, "t.bool", KILN_GGUF_BOOL)->u, 1);
    const kiln_gguf_value *s = get(m, "t.str", KILN_GGUF_STRING);
    cr_assert_eq(s->str.len, 5);
    cr_assert_eq(memcmp(s->str.ptr, "a\0b\"\n", 5), 0);
    cr_assert_eq(get(m, "t.u64", KILN_GGUF_UINT64)->u, UINT64_MAX);
    cr_assert_eq(get(m, "t.i64", KILN_GGUF_INT64)->i, INT64_MIN);
    cr_assert_eq(get(m, "t.f64", KILN_GGUF_FLOAT64)->f, 3.141592653589793);
    cr_assert_eq(get(m, "t.empty_str", KILN_GGUF_STRING)->str.len, 0);

    const kiln_gguf_value *a = get(m, "t.arr_i16", KILN_GGUF_ARRAY);
    cr_assert_eq(a->arr.type, KILN_GGUF_INT16);
    cr_assert_eq(a->arr.n, 3);
    cr_assert_eq(at(a, 0).i, 1);
    cr_assert_eq(at(a, 1).i, -1);
    cr_assert_eq(at(a, 2).i, 32767);
    cr_assert_eq(at(a, 2).type, KILN_GGUF_INT16);

    a = get(m, "t.arr_str", KILN_GGUF_ARRAY);
    cr_assert_eq(a->arr.type, KILN_GGUF_STRING);
    cr_assert_eq(a->arr.n, 3);
    cr_assert_eq(at(a, 0).str.len, 1);
    cr_assert_eq(at(a, 0).str.ptr[0], 'x');
    cr_assert_eq(at(a, 1).str.len, 0);
    cr_assert_eq(memcmp(at(a, 2).str.ptr, "zzz", 3), 0);

    a = get(m, "t.arr_arr", KILN_GGUF_ARRAY);
    cr_assert_eq(a->arr.type, KILN_GGUF_ARRAY);
    cr_assert_eq(a->arr.n, 4);
    kiln_gguf_value e = at(a, 0);
    cr_assert_eq(e.arr.type, KILN_GGUF_FLOAT64);
    cr_assert_eq(at(&e, 1).f, 2.0);
    e = at(a, 1);
    cr_assert_eq(e.arr.type, KILN_GGUF_STRING);
    cr_assert_eq(at(&e, 0).str.ptr[0], 's');
    e = at(a, 2);
    kiln_gguf_value inner = at(&e, 0);
    cr_assert_eq(inner.arr.type, KILN_GGUF_BOOL);
    cr_assert_eq(at(&inner, 0).u, 1);
    e = at(a, 3);
    cr_assert_eq(e.arr.type, KILN_GGUF_UINT32);
    cr_assert_eq(e.arr.n, 0);

    cr_assert_eq(get(m, "t.arr_empty", KILN_GGUF_ARRAY)->arr.n, 0);
    a = get(m, "t.arr_bool", KILN_GGUF_ARRAY);
    cr_assert_eq(at(a, 0).u, 0);
    cr_assert_eq(at(a, 1).u, 1);
    a = get(m, "t.arr_f32", KILN_GGUF_ARRAY);
    cr_assert_eq(at(a, 1).f, -8.0);

    e = *get(m, "t.deepest", KILN_GGUF_ARRAY);
    for (int d = 1; d < KILN_GGUF_MAX_DEPTH; d++)
        e = at(&e, 0);
    cr_assert_eq(e.arr.type, KILN_GGUF_INT8);
    cr_assert_eq(at(&e, 0).i, -2);

    /* Out of range and not an array. */
    kiln_gguf_value out;
    cr_assert_eq(kiln_gguf_array_at(a, 2, &out), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_gguf_array_at(get(m, "t.u8", KILN_GGUF_UINT8), 0, &out),
                 KILN_ERR_INVALID_ARG);
    kiln_model_close(m);
    free(b.p);
}

Test(gguf, typed_getters)
{
    buf b = {0};
    make_all_types(&b);
    kiln_model *m;
    cr_assert_eq(open_buf(&b, &m), KILN_OK, "%s", kiln_last_error());
    int64_t i;
    double f;
    const char *s;
    size_t len;
    cr_assert_eq(kiln_gguf_get_int(m, "t.i8", &i), KILN_OK);
    cr_assert_eq(i, -128);
    cr_assert_eq(kiln_gguf_get_int(m, "t.u32", &i), KILN_OK);
    cr_assert_eq(i, 0xfffffffd);
    cr_assert_eq(kiln_gguf_get_int(m, "t.i64", &i), KILN_OK);
    cr_assert_eq(i, INT64_MIN);
    cr_assert_eq(kiln_gguf_get_int(m, "t.u64", &i), KILN_ERR_MALFORMED);
    cr_assert_not_null(strstr(kiln_last_error(), "t.u64"));
    cr_assert_eq(kiln_gguf_get_int(m, "t.f32", &i), KILN_ERR_MALFORMED);
    cr_assert_not_null(strstr(kiln_last_error(), "expected an integer, found float32"));
    cr_assert_eq(kiln_gguf_get_int(m, "t.bool", &i), KILN_ERR_MALFORMED);
    expect_file_error(": key 't.bool': expected an integer, found bool");
    cr_assert_eq(kiln_gguf_get_int(m, "t.nope", &i), KILN_ERR_NOT_FOUND);
    cr_assert_not_null(strstr(kiln_last_error(), "t.nope"));
    cr_assert_eq(kiln_gguf_get_float(m, "t.f64", &f), KILN_OK);
    cr_assert_eq(f, 3.141592653589793);
    cr_assert_eq(kiln_gguf_get_float(m, "t.u8", &f), KILN_ERR_MALFORMED);
    expect_file_error(": key 't.u8': expected a float, found uint8");
    cr_assert_eq(kiln_gguf_get_float(m, "t.nope", &f), KILN_ERR_NOT_FOUND);
    expect_file_error(": no metadata key 't.nope'");
    cr_assert_eq(kiln_gguf_get_str(m, "t.str", &s, &len), KILN_OK);
    cr_assert_eq(len, 5);
    cr_assert_eq(kiln_gguf_get_str(m, "t.arr_str", &s, &len), KILN_ERR_MALFORMED);
    cr_assert_not_null(strstr(kiln_last_error(), "expected a string, found array"));
    cr_assert_eq(kiln_gguf_get_str(m, "t.nope", &s, &len), KILN_ERR_NOT_FOUND);
    expect_file_error(": no metadata key 't.nope'");
    kiln_model_close(m);
    free(b.p);
}

static const char *summary(const kiln_model *m, const char *key, int max_items)
{
    static char text[256];
    return kiln_gguf_value_summary(kiln_gguf_get(m, key), max_items, text, sizeof text);
}

Test(gguf, summaries)
{
    buf b = {0};
    make_all_types(&b);
    kiln_model *m;
    cr_assert_eq(open_buf(&b, &m), KILN_OK, "%s", kiln_last_error());
    cr_assert_str_eq(summary(m, "t.u8", 3), "255");
    cr_assert_str_eq(summary(m, "t.i64", 3), "-9223372036854775808");
    cr_assert_str_eq(summary(m, "t.bool", 3), "true");
    cr_assert_str_eq(summary(m, "t.f64", 3), "3.1415926535897931");
    cr_assert_str_eq(summary(m, "t.str", 3), "\"a\\x00b\\\"\\x0a\"");
    cr_assert_str_eq(summary(m, "t.arr_str", 2), "array<string>[3] [\"x\", \"\", ...]");
    cr_assert_str_eq(summary(m, "t.arr_str", 3), "array<string>[3] [\"x\", \"\", \"zzz\"]");
    cr_assert_str_eq(summary(m, "t.arr_i16", 0), "array<int16>[3] [...]");
    cr_assert_str_eq(summary(m, "t.arr_arr", 1), "array<array>[4] [array<float64>[2] [1, ...], ...]");
    cr_assert_str_eq(summary(m, "t.arr_empty", 4), "array<string>[0] []");
    char small[8];
    kiln_gguf_value_summary(kiln_gguf_get(m, "t.arr_str"), 3, small, sizeof small);
    cr_assert_str_eq(small, "array<s");
    cr_assert_str_eq(kiln_gguf_value_summary(NULL, 3, small, sizeof small), "");
    cr_assert_str_eq(kiln_gguf_type_name(KILN_GGUF_FLOAT64), "float64");
    cr_assert_str_eq(kiln_gguf_type_name(KILN_GGUF_TYPE_COUNT), "?");
    kiln_model_close(m);
    free(b.p);
}

/* kiln.h's listing: the same keys in the same order, each value as the
 * one-line summary; errors name the file. */
Test(gguf, public_metadata_listing)
{
    buf b = {0};
    make_all_types(&b);
    kiln_model *m;
    cr_assert_eq(open_buf(&b, &m), KILN_OK, "%s", kiln_last_error());
    int n = kiln_model_n_metadata(m);
    cr_assert_eq(n, kiln_gguf_n_kv(m));
    cr_assert_gt(n, 0);
    for (int i = 0; i < n; i++) {
        const kiln_gguf_value *v;
        const char *key = NULL, *want = kiln_gguf_kv_at(m, i, &v);
        char text[256], expect[256];
        cr_assert_eq(kiln_model_metadata_at(m, i, 2, &key, text, sizeof text), KILN_OK, "%s",
                     kiln_last_error());
        cr_assert_eq(key, want, "%d", i);
        cr_assert_str_eq(text, kiln_gguf_value_summary(v, 2, expect, sizeof expect), "%s", key);
    }
    const char *key = "unset";
    char small[8];
    cr_assert_eq(kiln_model_metadata_at(m, n - 1, 3, &key, small, sizeof small), KILN_OK);
    cr_assert_eq(strlen(small), sizeof small - 1, "cut to fit: %s", small);
    key = "unset";
    cr_assert_eq(kiln_model_metadata_at(m, n, 3, &key, small, sizeof small), KILN_ERR_INVALID_ARG);
    cr_assert_str_eq(key, "unset");
    expect_file_error(": metadata index");
    cr_assert_eq(kiln_model_metadata_at(m, -1, 3, &key, small, sizeof small), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_model_metadata_at(m, 0, 3, NULL, small, sizeof small), KILN_ERR_INVALID_ARG);
    expect_file_error(": metadata t.");
    cr_assert_eq(kiln_model_metadata_at(m, 0, 3, &key, NULL, 8), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_model_metadata_at(m, 0, 3, &key, small, 0), KILN_ERR_INVALID_ARG);
    cr_assert_str_eq(key, "unset");
    kiln_model_close(m);
    free(b.p);
}

Test(gguf, long_strings_are_cut_in_summaries)
{
    buf b = {0};
    char s[100];
    memset(s, 'q', sizeof s);
    put_header(&b, 3, 0, 1);
    put_key(&b, "k", KILN_GGUF_STRING);
    put_strn(&b, s, sizeof s);
    kiln_model *m;
    cr_assert_eq(open_buf(&b, &m), KILN_OK, "%s", kiln_last_error());
    const char *text = summary(m, "k", 3);
    cr_assert_eq(strlen(text), 1 + 64 + 4, "%s", text);
    cr_assert_str_eq(text + 65, "\"...");
    kiln_model_close(m);
    free(b.p);
}

/* --------------------------------------------------- hyper-parameters */

Test(gguf, hparams_prefer_vocab_size_and_skip_per_layer_lists)
{
    buf b = {0};
    put_header(&b, 3, 0, 5);
    put_kv_str(&b, "general.architecture", "qwen2");
    put_kv_u32(&b, "qwen2.vocab_size", 151936);
    put_key(&b, "tokenizer.ggml.tokens", KILN_GGUF_ARRAY);
    put_u32(&b, KILN_GGUF_STRING);
    put_u64(&b, 1);
    put_str(&b, "t");
    put_key(&b, "qwen2.attention.head_count", KILN_GGUF_ARRAY);
    put_u32(&b, KILN_GGUF_UINT32);
    put_u64(&b, 2);
    put_u32(&b, 8);
    put_u32(&b, 16);
    put_key(&b, "qwen2.attention.layer_norm_rms_epsilon", KILN_GGUF_FLOAT64);
    put_f64(&b, 1e-6);
    kiln_model *m;
    cr_assert_eq(open_buf(&b, &m), KILN_OK, "%s", kiln_last_error());
    cr_assert_str_eq(m->hp.arch, "qwen2");
    cr_assert_eq(m->hp.vocab, 151936);
    cr_assert_eq(m->hp.n_heads, 0);
    cr_assert_eq(m->hp.n_layers, 0);
    cr_assert_eq(m->hp.rms_eps, 1e-6f);
    kiln_model_close(m);
    free(b.p);
}

static void bad_hparam(const char *key, kiln_gguf_type type, uint64_t value, const char *frag)
{
    buf b = {0};
    bool is_arch = strcmp(key, "general.architecture") == 0;
    put_header(&b, 3, 0, is_arch ? 1 : 2);
    if (!is_arch)
        put_kv_str(&b, "general.architecture", "llama");
    size_t at = b.n;
    put_key(&b, key, type);
    put_le(&b, value, type == KILN_GGUF_STRING ? 8 : type == KILN_GGUF_INT8 ? 1 : 8);
    char where[128], offset[48];
    snprintf(where, sizeof where, "key '%s'", key);
    snprintf(offset, sizeof offset, "(at byte offset %zu)", at);
    expect_fail(&b, KILN_ERR_MALFORMED, where, frag, offset, NULL);
    free(b.p);
}

Test(gguf, hparams_of_the_wrong_type)
{
    bad_hparam("llama.block_count", KILN_GGUF_STRING, 0, "expected an integer, found string");
    bad_hparam("llama.embedding_length", KILN_GGUF_INT8, 0xff, "-1 is negative");
    bad_hparam("llama.context_length", KILN_GGUF_UINT64, UINT64_MAX, "does not fit an int64");
    bad_hparam("llama.attention.layer_norm_rms_epsilon", KILN_GGUF_UINT64, 1,
               "expected a float, found uint64");
    bad_hparam("tokenizer.ggml.tokens", KILN_GGUF_UINT64, 1, "must be an array, not uint64");
    bad_hparam("general.architecture", KILN_GGUF_UINT64, 1, "expected a string");
}

Test(gguf, architecture_must_be_a_short_name)
{
    char arch[80];
    memset(arch, 'a', sizeof arch - 1);
    arch[sizeof arch - 1] = '\0';
    buf b = {0};
    put_header(&b, 3, 0, 1);
    put_kv_str(&b, "general.architecture", arch);
    expect_fail(&b, KILN_ERR_MALFORMED, "key 'general.architecture'", "(at byte offset 24)", NULL);
    free(b.p);
    b = (buf){0};
    put_header(&b, 3, 0, 1);
    put_kv_str(&b, "general.architecture", "");
    expect_fail(&b, KILN_ERR_MALFORMED, "general.architecture", NULL);
    free(b.p);
}

/* --------------------------------------------------------- broken files */

static void truncate_everywhere(uint32_t version, uint32_t alignment)
{
    kt_rng r = kt_rng_new(11 + version);
    buf b = {0};
    make_model(&b, version, alignment, &r, NULL);
    size_t full = b.n;
    for (size_t len = 0; len < full; len++) {
        b.n = len;
        kiln_model *m = NULL;
        kiln_status st = open_buf(&b, &m);
        cr_assert_eq(st, KILN_ERR_MALFORMED, "prefix of %zu bytes: %s: %s", len, kiln_strerror(st),
                     kiln_last_error());
        cr_assert_null(m);
        cr_assert_eq(strncmp(kiln_last_error(), file_path, strlen(file_path)), 0);
        cr_assert_not_null(strstr(kiln_last_error(), "(at byte offset "), "%s", kiln_last_error());
    }
    b.n = full;
    kiln_model *m;
    cr_assert_eq(open_buf(&b, &m), KILN_OK, "%s", kiln_last_error());
    kiln_model_close(m);
    free(b.p);
}

Test(gguf, truncated_at_every_byte_v3) { truncate_everywhere(3, 0); }
Test(gguf, truncated_at_every_byte_v2_aligned_64) { truncate_everywhere(2, 64); }

Test(gguf, truncation_names_what_is_missing)
{
    kt_rng r = kt_rng_new(12);
    buf b = {0};
    layout l;
    make_model(&b, 3, 0, &r, &l);
    b.n = l.tensor_at[1] + 8 + 3;
    expect_fail(&b, KILN_ERR_MALFORMED, "tensor #1",
                "tensor name length 22 exceeds the 3 bytes left", NULL);
    b.n = l.data_at[2] + 5;
    char off[48];
    snprintf(off, sizeof off, "(at byte offset %zu)", l.offset_field[2]);
    expect_fail(&b, KILN_ERR_MALFORMED, "tensor 'blk.0.ffn_down.weight'", "runs past the end", off,
                NULL);
    free(b.p);
}

Test(gguf, not_gguf)
{
    buf b = {0};
    put(&b, "GGML", 4);
    put_u32(&b, 3);
    expect_fail(&b, KILN_ERR_MALFORMED, "not a GGUF file", "(at byte offset 0)", NULL);
    free(b.p);
}

Test(gguf, empty_file)
{
    buf b = {0};
    expect_fail(&b, KILN_ERR_MALFORMED, "empty file", NULL);
}

Test(gguf, versions)
{
    buf b = {0};
    put_header(&b, 1, 0, 0);
    expect_fail(&b, KILN_ERR_UNSUPPORTED, "GGUF version 1 is not supported", "(at byte offset 4)",
                NULL);
    free(b.p);
    b = (buf){0};
    put_header(&b, 4, 0, 0);
    expect_fail(&b, KILN_ERR_UNSUPPORTED, "GGUF version 4 is not supported", NULL);
    free(b.p);
    b = (buf){0};
    put_header(&b, 0, 0, 0);
    expect_fail(&b, KILN_ERR_UNSUPPORTED, "GGUF version 0", NULL);
    free(b.p);
    b = (buf){0};
    put_header(&b, 0x03000000u, 0, 0);
    expect_fail(&b, KILN_ERR_UNSUPPORTED, "big-endian", NULL);
    free(b.p);
}

Test(gguf, missing_and_unreadable_paths)
{
    kiln_model *m = NULL;
    cr_assert_eq(kiln_gguf_open("/nonexistent/dir/model.gguf", &m), KILN_ERR_IO);
    cr_assert_not_null(strstr(kiln_last_error(), "/nonexistent/dir/model.gguf: cannot open"));
    cr_assert_eq(kiln_gguf_open(".", &m), KILN_ERR_IO);
    cr_assert_not_null(strstr(kiln_last_error(), "not a regular file"));
    cr_assert_null(m);
}

/* A FIFO is refused without waiting for a writer, through the reader
 * and through kiln_model_open; a dangling link is named as one. */
Test(gguf, fifos_and_dangling_links_are_named, .timeout = 20)
{
    char dir[] = "/tmp/kiln-gguf-XXXXXX", fifo[64], link[64];
    cr_assert(mkdtemp(dir));
    snprintf(fifo, sizeof fifo, "%s/fifo.gguf", dir);
    snprintf(link, sizeof link, "%s/link.gguf", dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    cr_assert_eq(symlink("gone.gguf", link), 0);
    kiln_model *m = NULL;
    cr_assert_eq(kiln_gguf_open(fifo, &m), KILN_ERR_IO);
    cr_assert(strstr(kiln_last_error(), "fifo.gguf: not a regular file"), "%s", kiln_last_error());
    cr_assert_eq(kiln_model_open(fifo, &m), KILN_ERR_IO);
    cr_assert(strstr(kiln_last_error(), "fifo.gguf: not a regular file"), "%s", kiln_last_error());
    cr_assert_eq(kiln_model_open(link, &m), KILN_ERR_IO);
    cr_assert(strstr(kiln_last_error(), "link.gguf: a symbolic link to gone.gguf, which does not "
                                        "exist"), "%s", kiln_last_error());
    cr_assert_null(m);
    unlink(fifo);
    unlink(link);
    rmdir(dir);
}

Test(gguf, absurd_counts)
{
    buf b = {0};
    put_header(&b, 3, 1ull << 62, 0);
    expect_fail(&b, KILN_ERR_MALFORMED, "4611686018427387904 tensors cannot fit",
                "(at byte offset 8)", NULL);
    free(b.p);
    b = (buf){0};
    put_header(&b, 3, 0, 1ull << 62);
    expect_fail(&b, KILN_ERR_MALFORMED, "metadata pairs cannot fit", "(at byte offset 16)", NULL);
    free(b.p);
    /* Each count fits on its own, not both together. */
    b = (buf){0};
    put_header(&b, 3, 1, 2);
    put_kv_u32(&b, "a", 1);
    put_kv_u32(&b, "b", 2);
    expect_fail(&b, KILN_ERR_MALFORMED, "1 tensors and 2 metadata pairs cannot fit", NULL);
    free(b.p);
}

Test(gguf, absurd_string_lengths)
{
    buf b = {0};
    put_header(&b, 3, 0, 1);
    put_u64(&b, 1ull << 63);
    put(&b, "general.name", 12);
    put_u32(&b, KILN_GGUF_UINT8);
    put_u8(&b, 0);
    expect_fail(&b, KILN_ERR_MALFORMED, "key #0", "key length 9223372036854775808 exceeds",
                "(at byte offset 24)", NULL);
    free(b.p);
    b = (buf){0};
    put_header(&b, 3, 0, 1);
    put_key(&b, "general.name", KILN_GGUF_STRING);
    put_u64(&b, UINT64_MAX);
    put(&b, "abcdefgh", 8);
    expect_fail(&b, KILN_ERR_MALFORMED, "key 'general.name'", "string length 18446744073709551615",
                "(at byte offset 48)", NULL);
    free(b.p);
}

Test(gguf, absurd_array_counts)
{
    const kiln_gguf_type types[] = {KILN_GGUF_UINT8, KILN_GGUF_FLOAT64, KILN_GGUF_STRING,
                                    KILN_GGUF_ARRAY};
    for (size_t i = 0; i < KILN_ARRAY_LEN(types); i++) {
        buf b = {0};
        put_header(&b, 3, 0, 1);
        put_key(&b, "k", KILN_GGUF_ARRAY);
        put_u32(&b, types[i]);
        put_u64(&b, 1ull << 61);
        put_u64(&b, 0);
        put_u64(&b, 0);
        expect_fail(&b, KILN_ERR_MALFORMED, "key 'k'", "array of 2305843009213693952",
                    "(at byte offset 41)", NULL);
        free(b.p);
    }
}

Test(gguf, bad_value_types)
{
    buf b = {0};
    put_header(&b, 3, 0, 1);
    put_key(&b, "k", 13);
    put_u64(&b, 0);
    expect_fail(&b, KILN_ERR_MALFORMED, "key 'k'", "unknown value type 13", "(at byte offset 33)",
                NULL);
    free(b.p);
    b = (buf){0};
    put_header(&b, 3, 0, 1);
    put_key(&b, "k", KILN_GGUF_ARRAY);
    put_u32(&b, 0xffffffffu);
    put_u64(&b, 0);
    expect_fail(&b, KILN_ERR_MALFORMED, "unknown array element type 4294967295", NULL);
    free(b.p);
}

Test(gguf, bools_are_0_or_1)
{
    buf b = {0};
    put_header(&b, 3, 0, 1);
    put_key(&b, "k", KILN_GGUF_BOOL);
    put_u8(&b, 2);
    expect_fail(&b, KILN_ERR_MALFORMED, "key 'k'", "bool value 2", "(at byte offset 37)", NULL);
    free(b.p);
    b = (buf){0};
    put_header(&b, 3, 0, 1);
    put_key(&b, "k", KILN_GGUF_ARRAY);
    put_u32(&b, KILN_GGUF_BOOL);
    put_u64(&b, 3);
    put_u8(&b, 1);
    put_u8(&b, 0);
    put_u8(&b, 7);
    expect_fail(&b, KILN_ERR_MALFORMED, "array element 2: bool value 7", "(at byte offset 51)",
                NULL);
    free(b.p);
}

Test(gguf, arrays_nested_too_deep)
{
    buf b = {0};
    put_header(&b, 3, 0, 1);
    put_key(&b, "k", KILN_GGUF_ARRAY);
    put_nested(&b, KILN_GGUF_MAX_DEPTH + 1);
    expect_fail(&b, KILN_ERR_MALFORMED, "key 'k'", "nested deeper than 8", NULL);
    free(b.p);
}

Test(gguf, bad_keys)
{
    buf b = {0};
    put_header(&b, 3, 0, 1);
    put_kv_u32(&b, "", 1);
    expect_fail(&b, KILN_ERR_MALFORMED, "key #0", "empty key", NULL);
    free(b.p);
    b = (buf){0};
    put_header(&b, 3, 0, 1);
    put_strn(&b, "a\0b", 3);
    put_u32(&b, KILN_GGUF_UINT8);
    put_u8(&b, 0);
    expect_fail(&b, KILN_ERR_MALFORMED, "key #0", "NUL byte", NULL);
    free(b.p);
    b = (buf){0};
    char *key = malloc(65536);
    memset(key, 'k', 65536);
    put_header(&b, 3, 0, 1);
    put_strn(&b, key, 65536);
    put_u32(&b, KILN_GGUF_UINT8);
    put_u8(&b, 0);
    expect_fail(&b, KILN_ERR_MALFORMED, "key is 65536 bytes long", NULL);
    free(key);
    free(b.p);
}

Test(gguf, duplicate_keys)
{
    buf b = {0};
    put_header(&b, 3, 0, 3);
    put_kv_u32(&b, "b.x", 1);
    put_kv_u32(&b, "a.y", 2);
    size_t second = b.n;
    put_kv_u32(&b, "b.x", 3);
    char off[48];
    snprintf(off, sizeof off, "(at byte offset %zu)", second);
    expect_fail(&b, KILN_ERR_MALFORMED, "key 'b.x'", "duplicate key (first at byte offset 24)", off,
                NULL);
    free(b.p);
}

Test(gguf, key_names_are_made_printable)
{
    buf b = {0};
    put_header(&b, 3, 0, 1);
    put_key(&b, "evil\x1b[2Jkey", KILN_GGUF_BOOL);
    put_u8(&b, 9);
    expect_fail(&b, KILN_ERR_MALFORMED, "key 'evil?[2Jkey'", NULL);
    free(b.p);
}

static void bad_alignment(kiln_gguf_type type, uint64_t value, const char *frag)
{
    buf b = {0};
    put_header(&b, 3, 0, 1);
    put_key(&b, "general.alignment", type);
    put_le(&b, value, type == KILN_GGUF_UINT32 ? 4 : 8);
    expect_fail(&b, KILN_ERR_MALFORMED, "key 'general.alignment'", frag, "(at byte offset 24)",
                NULL);
    free(b.p);
}

Test(gguf, bad_alignments)
{
    bad_alignment(KILN_GGUF_UINT32, 0, "alignment 0 is not a power of two");
    bad_alignment(KILN_GGUF_UINT32, 48, "alignment 48 is not a power of two");
    bad_alignment(KILN_GGUF_UINT32, 1u << 21, "above the limit");
    bad_alignment(KILN_GGUF_UINT64, 32, "must be uint32, not uint64");
}

Test(gguf, misaligned_tensor_offset)
{
    kt_rng r = kt_rng_new(13);
    buf b = {0};
    layout l;
    make_model(&b, 3, 64, &r, &l);
    uint64_t off = 96;
    memcpy(b.p + l.offset_field[1], &off, 8);
    char at_off[48];
    snprintf(at_off, sizeof at_off, "(at byte offset %zu)", l.offset_field[1]);
    expect_fail(&b, KILN_ERR_MALFORMED, "tensor 'blk.0.attn_norm.weight'",
                "data offset 96 is not a multiple of the alignment 64", at_off, NULL);
    free(b.p);
}

/* One tensor, its info written by the caller's values, its data sized for a
 * 64 x 2 F32 tensor. */
static void one_tensor(buf *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                       uint32_t type, uint64_t offset)
{
    kt_rng r = kt_rng_new(14);
    put_header(b, 3, 1, 0);
    put_tensor_info(b, name, n_dims, ne, type, offset);
    pad_to(b, 32);
    put_random(b, &r, 512);
}

static void bad_tensor(const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                       uint64_t offset, kiln_status want, const char *frag)
{
    buf b = {0};
    one_tensor(&b, name, n_dims, ne, type, offset);
    /* A name that cannot be used is not quoted: the index says which. */
    char where[96] = "tensor #0";
    if (name[0] && strlen(name) <= 64)
        snprintf(where, sizeof where, "tensor '%s'", name);
    expect_fail(&b, want, where, frag, "(at byte offset ", NULL);
    free(b.p);
}

Test(gguf, one_tensor_is_fine)
{
    buf b = {0};
    const uint64_t ne[] = {64, 2};
    one_tensor(&b, "w", 2, ne, TY_F32, 0);
    kiln_model *m;
    cr_assert_eq(open_buf(&b, &m), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(m->n_tensors, 1);
    cr_assert_eq(m->tensors[0].bytes, 512);
    /* 24 bytes of header and 41 of tensor info, padded to 96. */
    cr_assert_eq(memcmp(m->tensors[0].qt.data, b.p + 96, 512), 0);
    kiln_model_close(m);
    free(b.p);
}

Test(gguf, bad_tensor_infos)
{
    const uint64_t ne[] = {64, 2, 1, 1, 1};
    bad_tensor("w", 5, ne, TY_F32, 0, KILN_ERR_MALFORMED, "n_dims 5 is not in 1..4");
    bad_tensor("w", 0, ne, TY_F32, 0, KILN_ERR_MALFORMED, "n_dims 0 is not in 1..4");
    const uint64_t zero[] = {64, 0};
    bad_tensor("w", 2, zero, TY_F32, 0, KILN_ERR_MALFORMED, "dimension 1 is 0");
    const uint64_t huge[] = {1ull << 63, 1};
    bad_tensor("w", 2, huge, TY_F32, 0, KILN_ERR_MALFORMED, "dimension 0 is 9223372036854775808");
    const uint64_t overflow[] = {1ull << 32, 1ull << 31};
    bad_tensor("w", 2, overflow, TY_F32, 0, KILN_ERR_MALFORMED,
               "the element count overflows at dimension 1");
    const uint64_t big_bytes[] = {1ull << 31, 1ull << 31};
    bad_tensor("w", 2, big_bytes, 28 /* F64 */, 0, KILN_ERR_MALFORMED,
               "the size in bytes overflows");
    bad_tensor("w", 2, ne, 42, 0, KILN_ERR_MALFORMED, "unknown tensor type id 42");
    bad_tensor("w", 2, ne, 0xffffffffu, 0, KILN_ERR_MALFORMED, "unknown tensor type id 4294967295");
    bad_tensor("w", 2, ne, 31, 0, KILN_ERR_UNSUPPORTED, "type 31 (Q4_0_4_4) has been removed");
    const uint64_t odd[] = {48, 2};
    bad_tensor("w", 2, odd, TY_Q8_0, 0, KILN_ERR_MALFORMED,
               "type Q8_0 needs ne[0] to be a multiple of 32, but ne[0] is 48");
    bad_tensor("", 2, ne, TY_F32, 0, KILN_ERR_MALFORMED, "empty tensor name");
    bad_tensor("w", 2, ne, TY_F32, 512, KILN_ERR_MALFORMED, "runs past the end of the file");
    bad_tensor("w", 2, ne, TY_F32, UINT64_MAX - 31, KILN_ERR_MALFORMED,
               "runs past the end of the file");
    /* 2^64 - 8 bytes: the end of the data overflows. */
    const uint64_t almost_all[] = {(1ull << 61) - 1};
    bad_tensor("w", 1, almost_all, 28 /* F64 */, 0, KILN_ERR_MALFORMED,
               "runs past the end of the file");
    char long_name[66];
    memset(long_name, 'n', 65);
    long_name[65] = '\0';
    bad_tensor(long_name, 2, ne, TY_F32, 0, KILN_ERR_MALFORMED,
               "tensor name is 65 bytes long, the limit is 64");
}

/* The GGML types read since Q5_0 (6), Q5_1 (7), Q2_K (10), Q3_K (11), Q5_K
 * (13), IQ4_NL (20), IQ4_XS (23) and Q4_1 (3): a row that is not whole
 * blocks, and data past the end of the file, are refused naming the tensor
 * and type. */
Test(gguf, later_ggml_types_refuse_part_blocks_and_truncated_data)
{
    static const uint32_t ids[] = { 6, 7, 10, 11, 13, 20, 23, 3 };
    for (size_t i = 0; i < KILN_ARRAY_LEN(ids); i++) {
        const kiln_gguf_tensor_type *tt = kiln_gguf_tensor_type_get(ids[i]);
        char frag[128];
        const uint64_t half[] = {(uint64_t)tt->block / 2, 2};
        snprintf(frag, sizeof frag, "type %s needs ne[0] to be a multiple of %d, but ne[0] is %d",
                 tt->name, tt->block, tt->block / 2);
        bad_tensor("blk.0.ffn_up.weight", 2, half, ids[i], 0, KILN_ERR_MALFORMED, frag);
        /* one_tensor writes 512 bytes of data: one row more than fits */
        const uint64_t rows[] = {(uint64_t)tt->block, 512 / (uint64_t)tt->type_size + 1};
        bad_tensor("blk.0.ffn_up.weight", 2, rows, ids[i], 0, KILN_ERR_MALFORMED,
                   "runs past the end of the file");
    }
}

Test(gguf, tensor_name_with_nul)
{
    buf b = {0};
    put_header(&b, 3, 1, 0);
    put_strn(&b, "a\0b", 3);
    put_u32(&b, 1);
    put_u64(&b, 64);
    put_u32(&b, TY_F32);
    put_u64(&b, 0);
    pad_to(&b, 32);
    for (int i = 0; i < 256; i++)
        put_u8(&b, 1);
    expect_fail(&b, KILN_ERR_MALFORMED, "tensor #0", "NUL byte", NULL);
    free(b.p);
}

/* Two F32 tensors of 64 x 2 (512 bytes) at the given offsets. */
static void two_tensors(buf *b, const char *a, uint64_t off_a, const char *c, uint64_t off_c,
                        size_t data_bytes)
{
    kt_rng r = kt_rng_new(15);
    const uint64_t ne[] = {64, 2};
    put_header(b, 3, 2, 0);
    put_tensor_info(b, a, 2, ne, TY_F32, off_a);
    put_tensor_info(b, c, 2, ne, TY_F32, off_c);
    pad_to(b, 32);
    put_random(b, &r, data_bytes);
}

Test(gguf, overlapping_tensors)
{
    buf b = {0};
    two_tensors(&b, "first", 480, "second", 0, 1024);
    expect_fail(&b, KILN_ERR_MALFORMED, "tensor 'first'", "overlaps tensor 'second'", NULL);
    free(b.p);
    b = (buf){0};
    two_tensors(&b, "first", 0, "second", 0, 512);
    expect_fail(&b, KILN_ERR_MALFORMED, "overlaps tensor", NULL);
    free(b.p);
    /* Back to back, in reverse file order, is fine. */
    b = (buf){0};
    two_tensors(&b, "first", 512, "second", 0, 1024);
    kiln_model *m;
    cr_assert_eq(open_buf(&b, &m), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq((const uint8_t *)m->tensors[0].qt.data - (const uint8_t *)m->tensors[1].qt.data,
                 512);
    kiln_model_close(m);
    free(b.p);
}

Test(gguf, duplicate_tensor_names)
{
    buf b = {0};
    two_tensors(&b, "same", 0, "same", 512, 1024);
    expect_fail(&b, KILN_ERR_MALFORMED, "tensor 'same'", "duplicate tensor name", NULL);
    free(b.p);
}

Test(gguf, supported_types_map_to_kiln_formats)
{
    /* Every kiln format with a GGML id reads as that format; the block
     * layouts of both tables agree. */
    int seen = 0;
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        const kiln_format_info *fi = kiln_format_get((kiln_format)f);
        if (fi->gguf_type < 0)
            continue;
        const kiln_gguf_tensor_type *tt = kiln_gguf_tensor_type_get((uint32_t)fi->gguf_type);
        cr_assert_not_null(tt);
        cr_assert_eq(tt->block, fi->block, "%s", tt->name);
        cr_assert_eq(tt->type_size, fi->block_bytes, "%s", tt->name);
        buf b = {0};
        const uint64_t ne[] = {(uint64_t)tt->block * 2, 3};
        put_header(&b, 3, 1, 0);
        put_tensor_info(&b, "w", 2, ne, (uint32_t)fi->gguf_type, 0);
        pad_to(&b, 32);
        kt_rng r = kt_rng_new(16);
        put_random(&b, &r, (size_t)tt->type_size * 2 * 3);
        kiln_model *m;
        cr_assert_eq(open_buf(&b, &m), KILN_OK, "%s", kiln_last_error());
        cr_assert_eq(m->tensors[0].supported, 1);
        cr_assert_eq(m->tensors[0].qt.format, (kiln_format)f);
        cr_assert_str_eq(m->tensors[0].type_name, tt->name);
        kiln_model_close(m);
        free(b.p);
        seen++;
    }
    cr_assert_eq(seen, 16);
    cr_assert_null(kiln_gguf_tensor_type_get(42));
    cr_assert_str_eq(kiln_gguf_tensor_type_get(39)->name, "MXFP4");
}

Test(gguf, higher_dims_flatten_into_rows)
{
    kt_rng r = kt_rng_new(17);
    buf b = {0};
    const uint64_t ne[] = {32, 2, 3, 2};
    put_header(&b, 3, 1, 0);
    put_tensor_info(&b, "experts", 4, ne, TY_Q4_0, 0);
    pad_to(&b, 32);
    put_random(&b, &r, 18 * 12);
    kiln_model *m;
    cr_assert_eq(open_buf(&b, &m), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(m->tensors[0].n_dims, 4);
    cr_assert_eq(m->tensors[0].ne[3], 2);
    cr_assert_eq(m->tensors[0].qt.n, 12);
    cr_assert_eq(m->tensors[0].qt.k, 32);
    cr_assert_eq(m->tensors[0].bytes, 18 * 12);
    kiln_model_close(m);
    free(b.p);
}

Test(gguf, unsupported_types_open_and_say_why)
{
    static const struct {
        uint32_t id;
        const char *name;
    } types[] = {{22, "IQ2_S"}, {9, "Q8_1"},  {15, "Q8_K"}, {16, "IQ2_XXS"}, {17, "IQ2_XS"},
                 {21, "IQ3_S"}, {24, "I8"},  {27, "I64"},  {28, "F64"},  {29, "IQ1_M"},
                 {34, "TQ1_0"}, {40, "NVFP4"}, {41, "Q1_0"}};
    for (size_t i = 0; i < KILN_ARRAY_LEN(types); i++) {
        const kiln_gguf_tensor_type *tt = kiln_gguf_tensor_type_get(types[i].id);
        buf b = {0};
        const uint64_t ne[] = {(uint64_t)tt->block, 2};
        put_header(&b, 3, 1, 0);
        put_tensor_info(&b, "w", 2, ne, types[i].id, 0);
        pad_to(&b, 32);
        kt_rng r = kt_rng_new(18);
        put_random(&b, &r, (size_t)tt->type_size * 2);
        kiln_model *m;
        cr_assert_eq(open_buf(&b, &m), KILN_OK, "%s", kiln_last_error());
        cr_assert_eq(m->tensors[0].supported, 0);
        cr_assert_str_eq(m->tensors[0].type_name, types[i].name);
        char why[64];
        snprintf(why, sizeof why, "GGML type %u has no kiln format (kiln reads F32", types[i].id);
        cr_assert_eq(strncmp(m->tensors[0].why, why, strlen(why)), 0, "%s", m->tensors[0].why);
        kiln_model_close(m);
        free(b.p);
    }
}

/* ASan reserves terabytes of address space up front, so an address-space
 * limit only works in the plain build. */
#if !defined(__SANITIZE_ADDRESS__)
Test(gguf, out_of_memory_is_an_error)
{
    /* 2^20 empty strings: an 8 MiB file whose string views need 40 MiB. */
    buf b = {0};
    const size_t n = 1u << 20;
    put_header(&b, 3, 0, 1);
    put_key(&b, "tokenizer.ggml.tokens", KILN_GGUF_ARRAY);
    put_u32(&b, KILN_GGUF_STRING);
    put_u64(&b, n);
    uint8_t *zeros = calloc(n, 8);
    put(&b, zeros, n * 8);
    free(zeros);
    FILE *statm = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    cr_assert_eq(fscanf(statm, "%lu", &pages), 1);
    fclose(statm);
    /* Room for the mapping and small allocations, not for the views. */
    rlim_t limit = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + 24u * 1024 * 1024;
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_AS, &rl), 0);
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > limit)
        rl.rlim_cur = limit;
    cr_assert_eq(setrlimit(RLIMIT_AS, &rl), 0);
    expect_fail(&b, KILN_ERR_NOMEM, "out of memory", NULL);
}
#endif
