/* GGUF metadata: the key-value pairs parsed into values (views into the
 * mapping), their lookup by key, and their one-line rendering. Like the
 * container (gguf.c), every length and count is checked against the bytes
 * left before it is used. */
#include "graph/gguf_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The limit from docs/gguf.md. */
#define GGUF_MAX_KEY 65535

/* ------------------------------------------------------------ value types */

typedef enum gguf_kind {
    GGUF_KIND_UNSIGNED,
    GGUF_KIND_SIGNED,
    GGUF_KIND_FLOAT,
    GGUF_KIND_BOOL,
    GGUF_KIND_STRING,
    GGUF_KIND_ARRAY,
} gguf_kind;

typedef struct gguf_value_type {
    const char *name;
    gguf_kind kind;
    size_t size;      /* bytes of a scalar; 0 for strings and arrays */
    size_t min_bytes; /* smallest encoding: bounds an array's element count */
} gguf_value_type;

static const gguf_value_type gguf_value_types[] = {
    [KILN_GGUF_UINT8] = {"uint8", GGUF_KIND_UNSIGNED, 1, 1},
    [KILN_GGUF_INT8] = {"int8", GGUF_KIND_SIGNED, 1, 1},
    [KILN_GGUF_UINT16] = {"uint16", GGUF_KIND_UNSIGNED, 2, 2},
    [KILN_GGUF_INT16] = {"int16", GGUF_KIND_SIGNED, 2, 2},
    [KILN_GGUF_UINT32] = {"uint32", GGUF_KIND_UNSIGNED, 4, 4},
    [KILN_GGUF_INT32] = {"int32", GGUF_KIND_SIGNED, 4, 4},
    [KILN_GGUF_FLOAT32] = {"float32", GGUF_KIND_FLOAT, 4, 4},
    [KILN_GGUF_BOOL] = {"bool", GGUF_KIND_BOOL, 1, 1},
    [KILN_GGUF_STRING] = {"string", GGUF_KIND_STRING, 0, 8},
    [KILN_GGUF_ARRAY] = {"array", GGUF_KIND_ARRAY, 0, 12},
    [KILN_GGUF_UINT64] = {"uint64", GGUF_KIND_UNSIGNED, 8, 8},
    [KILN_GGUF_INT64] = {"int64", GGUF_KIND_SIGNED, 8, 8},
    [KILN_GGUF_FLOAT64] = {"float64", GGUF_KIND_FLOAT, 8, 8},
};
_Static_assert(KILN_ARRAY_LEN(gguf_value_types) == KILN_GGUF_TYPE_COUNT, "one row per value type");

const char *kiln_gguf_type_name(kiln_gguf_type type)
{
    if ((unsigned)type >= KILN_GGUF_TYPE_COUNT)
        return "?";
    return gguf_value_types[type].name;
}

/* ---------------------------------------------------------------- storage */

static void gguf_value_free(kiln_gguf_value *v)
{
    if (v->type != KILN_GGUF_ARRAY || !v->arr.items)
        return;
    kiln_gguf_value *items = (kiln_gguf_value *)v->arr.items;
    if (v->arr.type == KILN_GGUF_ARRAY)
        for (size_t i = 0; i < v->arr.n; i++)
            gguf_value_free(&items[i]);
    free(items);
}

void kiln_gguf_kvs_free(kiln_gguf_impl *impl)
{
    for (size_t i = 0; i < impl->n_kv; i++) {
        free(impl->kv[i].key);
        gguf_value_free(&impl->kv[i].value);
    }
    free(impl->kv);
    free(impl->by_key);
}

static int gguf_kv_cmp(const void *a, const void *b)
{
    return strcmp((*(kiln_gguf_kv *const *)a)->key, (*(kiln_gguf_kv *const *)b)->key);
}

const kiln_gguf_kv *kiln_gguf_find(const kiln_gguf_impl *impl, const char *key)
{
    if (impl->n_kv == 0)
        return NULL;
    kiln_gguf_kv probe = {.key = (char *)key};
    const kiln_gguf_kv *pp = &probe;
    kiln_gguf_kv **hit = bsearch(&pp, impl->by_key, impl->n_kv, sizeof *impl->by_key, gguf_kv_cmp);
    return hit ? *hit : NULL;
}

/* ---------------------------------------------------------------- reading */

static kiln_status gguf_read_type(kiln_gguf_parser *p, const char *what, kiln_gguf_type *out)
{
    size_t at = p->pos;
    uint32_t t;
    kiln_status st = kiln_gguf_read_u32(p, what, &t);
    if (st != KILN_OK)
        return st;
    if (t >= KILN_GGUF_TYPE_COUNT)
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, at, "unknown %s %u", what, t);
    *out = (kiln_gguf_type)t;
    return KILN_OK;
}

static void gguf_decode_scalar(kiln_gguf_type type, const uint8_t *b, kiln_gguf_value *out)
{
    const gguf_value_type *vt = &gguf_value_types[type];
    uint64_t bits = kiln_gguf_le(b, vt->size);
    out->type = type;
    switch (vt->kind) {
    case GGUF_KIND_UNSIGNED:
    case GGUF_KIND_BOOL:
        out->u = bits;
        break;
    case GGUF_KIND_SIGNED:
        if (vt->size < 8 && (bits >> (vt->size * 8 - 1) & 1))
            bits |= ~(uint64_t)0 << (vt->size * 8);
        memcpy(&out->i, &bits, sizeof bits);
        break;
    case GGUF_KIND_FLOAT:
        if (vt->size == 4) {
            uint32_t b32 = (uint32_t)bits;
            float f;
            memcpy(&f, &b32, sizeof f);
            out->f = f;
        } else {
            memcpy(&out->f, &bits, sizeof bits);
        }
        break;
    case GGUF_KIND_STRING:
    case GGUF_KIND_ARRAY:
        assert(!"not a scalar type");
        break;
    }
}

static kiln_status gguf_read_value(kiln_gguf_parser *p, kiln_gguf_type type, int depth,
                                   kiln_gguf_value *out);

static kiln_status gguf_read_array(kiln_gguf_parser *p, int depth, kiln_gguf_value *out)
{
    size_t at = p->pos;
    if (depth >= KILN_GGUF_MAX_DEPTH)
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, at, "arrays nested deeper than %d levels",
                              KILN_GGUF_MAX_DEPTH);
    kiln_gguf_type et = KILN_GGUF_UINT8;
    kiln_status st = gguf_read_type(p, "array element type", &et);
    if (st != KILN_OK)
        return st;
    size_t count_at = p->pos;
    uint64_t n;
    if ((st = kiln_gguf_read_uint(p, 8, "array count", &n)) != KILN_OK)
        return st;
    const gguf_value_type *vt = &gguf_value_types[et];
    if (n > kiln_gguf_left(p) / vt->min_bytes)
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, count_at,
                              "array of %llu %s elements does not fit in the %zu bytes left",
                              (unsigned long long)n, vt->name, kiln_gguf_left(p));
    out->arr.type = et;
    out->arr.n = (size_t)n;
    if (vt->size) {
        const uint8_t *raw = p->base + p->pos;
        if (vt->kind == GGUF_KIND_BOOL)
            for (size_t i = 0; i < n; i++)
                if (raw[i] > 1)
                    return kiln_gguf_fail(p, KILN_ERR_MALFORMED, p->pos + i,
                                          "array element %zu: bool value %u is neither 0 nor 1", i, raw[i]);
        out->arr.raw = raw;
        p->pos += (size_t)n * vt->size;
        return KILN_OK;
    }
    if (n == 0)
        return KILN_OK;
    kiln_gguf_value *items = kiln_calloc((size_t)n, sizeof *items);
    if (!items)
        return kiln_gguf_nomem(p);
    out->arr.items = items;
    for (size_t i = 0; i < n; i++)
        if ((st = gguf_read_value(p, et, depth + 1, &items[i])) != KILN_OK)
            return st;
    return KILN_OK;
}

/* Reads one value of the given type; on failure *out may hold a partly read
 * array, which gguf_value_free releases. */
static kiln_status gguf_read_value(kiln_gguf_parser *p, kiln_gguf_type type, int depth,
                                   kiln_gguf_value *out)
{
    const gguf_value_type *vt = &gguf_value_types[type];
    out->type = type;
    if (vt->kind == GGUF_KIND_STRING)
        return kiln_gguf_read_str(p, "string", &out->str.ptr, &out->str.len);
    if (vt->kind == GGUF_KIND_ARRAY)
        return gguf_read_array(p, depth, out);
    kiln_status st = kiln_gguf_need(p, vt->size, vt->name);
    if (st != KILN_OK)
        return st;
    if (vt->kind == GGUF_KIND_BOOL && p->base[p->pos] > 1)
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, p->pos, "bool value %u is neither 0 nor 1",
                              p->base[p->pos]);
    gguf_decode_scalar(type, p->base + p->pos, out);
    p->pos += vt->size;
    return KILN_OK;
}

kiln_status kiln_gguf_read_kvs(kiln_gguf_parser *p, kiln_gguf_impl *impl, uint64_t n_kv)
{
    kiln_status st;
    if (n_kv == 0)
        return KILN_OK;
    impl->kv = kiln_calloc((size_t)n_kv, sizeof *impl->kv);
    impl->by_key = kiln_calloc((size_t)n_kv, sizeof *impl->by_key);
    if (!impl->kv || !impl->by_key)
        return kiln_gguf_nomem(p);
    for (size_t i = 0; i < n_kv; i++) {
        kiln_gguf_kv *kv = &impl->kv[i];
        size_t at = p->pos;
        const char *key;
        size_t len;
        snprintf(p->where, sizeof p->where, "key #%zu", i);
        if ((st = kiln_gguf_read_str(p, "key", &key, &len)) != KILN_OK)
            return st;
        if (len == 0)
            return kiln_gguf_fail(p, KILN_ERR_MALFORMED, at, "empty key");
        if (len > GGUF_MAX_KEY)
            return kiln_gguf_fail(p, KILN_ERR_MALFORMED, at, "key is %zu bytes long, the limit is %d", len,
                                  GGUF_MAX_KEY);
        if (memchr(key, '\0', len))
            return kiln_gguf_fail(p, KILN_ERR_MALFORMED, at, "key contains a NUL byte");
        kiln_gguf_where(p, "key", key, len);
        if (!(kv->key = kiln_malloc(len + 1)))
            return kiln_gguf_nomem(p);
        memcpy(kv->key, key, len);
        kv->key[len] = '\0';
        kv->at = at;
        impl->n_kv = i + 1;
        impl->by_key[i] = kv;
        kiln_gguf_type type = KILN_GGUF_UINT8;
        if ((st = gguf_read_type(p, "value type", &type)) != KILN_OK)
            return st;
        if ((st = gguf_read_value(p, type, 0, &kv->value)) != KILN_OK)
            return st;
    }
    qsort(impl->by_key, impl->n_kv, sizeof *impl->by_key, gguf_kv_cmp);
    for (size_t i = 1; i < impl->n_kv; i++) {
        const kiln_gguf_kv *a = impl->by_key[i - 1], *b = impl->by_key[i];
        if (strcmp(a->key, b->key) == 0) {
            kiln_gguf_where(p, "key", a->key, strlen(a->key));
            return kiln_gguf_fail(p, KILN_ERR_MALFORMED, a->at > b->at ? a->at : b->at,
                                  "duplicate key (first at byte offset %zu)", a->at < b->at ? a->at : b->at);
        }
    }
    p->where[0] = '\0';
    return KILN_OK;
}

/* ----------------------------------------------------------------- lookup */

const kiln_gguf_value *kiln_gguf_get(const kiln_model *m, const char *key)
{
    const kiln_gguf_impl *impl = kiln_gguf_impl_of(m);
    if (!impl || !key)
        return NULL;
    const kiln_gguf_kv *kv = kiln_gguf_find(impl, key);
    return kv ? &kv->value : NULL;
}

/* The pair behind key, or NOT_FOUND with a message. */
static kiln_status gguf_lookup(const kiln_model *m, const char *key, const kiln_gguf_kv **out)
{
    const kiln_gguf_impl *impl = kiln_gguf_impl_of(m);
    const kiln_gguf_kv *kv = impl && key ? kiln_gguf_find(impl, key) : NULL;
    if (!kv)
        return kiln_fail(KILN_ERR_NOT_FOUND, "%s: no metadata key '%s'", m ? m->path : "?",
                         key ? key : "(null)");
    *out = kv;
    return KILN_OK;
}

static kiln_status gguf_wrong_type(const kiln_model *m, const kiln_gguf_kv *kv, const char *expected)
{
    return kiln_fail(KILN_ERR_MALFORMED, "%s: key '%s': expected %s, found %s (at byte offset %zu)",
                     m->path, kv->key, expected, kiln_gguf_type_name(kv->value.type), kv->at);
}

kiln_status kiln_gguf_get_int(const kiln_model *m, const char *key, int64_t *out)
{
    const kiln_gguf_kv *kv = NULL;
    kiln_status st = gguf_lookup(m, key, &kv);
    if (st != KILN_OK)
        return st;
    gguf_kind kind = gguf_value_types[kv->value.type].kind;
    if (kind == GGUF_KIND_SIGNED) {
        *out = kv->value.i;
        return KILN_OK;
    }
    if (kind != GGUF_KIND_UNSIGNED)
        return gguf_wrong_type(m, kv, "an integer");
    if (kv->value.u > INT64_MAX)
        return kiln_fail(KILN_ERR_MALFORMED, "%s: key '%s': %llu does not fit an int64 (at byte offset %zu)",
                         m->path, kv->key, (unsigned long long)kv->value.u, kv->at);
    *out = (int64_t)kv->value.u;
    return KILN_OK;
}

kiln_status kiln_gguf_get_float(const kiln_model *m, const char *key, double *out)
{
    const kiln_gguf_kv *kv = NULL;
    kiln_status st = gguf_lookup(m, key, &kv);
    if (st != KILN_OK)
        return st;
    if (gguf_value_types[kv->value.type].kind != GGUF_KIND_FLOAT)
        return gguf_wrong_type(m, kv, "a float");
    *out = kv->value.f;
    return KILN_OK;
}

kiln_status kiln_gguf_get_str(const kiln_model *m, const char *key, const char **ptr, size_t *len)
{
    const kiln_gguf_kv *kv = NULL;
    kiln_status st = gguf_lookup(m, key, &kv);
    if (st != KILN_OK)
        return st;
    if (kv->value.type != KILN_GGUF_STRING)
        return gguf_wrong_type(m, kv, "a string");
    *ptr = kv->value.str.ptr;
    *len = kv->value.str.len;
    return KILN_OK;
}

kiln_status kiln_gguf_array_at(const kiln_gguf_value *arr, size_t i, kiln_gguf_value *out)
{
    if (!arr || !out || arr->type != KILN_GGUF_ARRAY)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_gguf_array_at: not an array value");
    if (i >= arr->arr.n)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_gguf_array_at: index %zu out of range (%zu items)",
                         i, arr->arr.n);
    const gguf_value_type *vt = &gguf_value_types[arr->arr.type];
    if (vt->size)
        gguf_decode_scalar(arr->arr.type, arr->arr.raw + i * vt->size, out);
    else
        *out = arr->arr.items[i];
    return KILN_OK;
}

int kiln_gguf_n_kv(const kiln_model *m)
{
    const kiln_gguf_impl *impl = kiln_gguf_impl_of(m);
    return impl ? (int)impl->n_kv : 0;
}

const char *kiln_gguf_kv_at(const kiln_model *m, int i, const kiln_gguf_value **value)
{
    const kiln_gguf_impl *impl = kiln_gguf_impl_of(m);
    if (!impl || i < 0 || (size_t)i >= impl->n_kv)
        return NULL;
    if (value)
        *value = &impl->kv[i].value;
    return impl->kv[i].key;
}

/* ---------------------------------------------------------------- summary */

typedef struct gguf_text {
    char *buf;
    size_t size, len;
} gguf_text;

static void gguf_put(gguf_text *t, const char *fmt, ...) KILN_PRINTF(2, 3);
static void gguf_put(gguf_text *t, const char *fmt, ...)
{
    if (t->len + 1 >= t->size)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf + t->len, t->size - t->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        t->len = t->len + (size_t)n < t->size ? t->len + (size_t)n : t->size - 1;
}

#define GGUF_SUMMARY_STR_MAX 64

static void gguf_put_value(gguf_text *t, const kiln_gguf_value *v, int max_items)
{
    switch (gguf_value_types[v->type].kind) {
    case GGUF_KIND_UNSIGNED:
        gguf_put(t, "%llu", (unsigned long long)v->u);
        break;
    case GGUF_KIND_SIGNED:
        gguf_put(t, "%lld", (long long)v->i);
        break;
    case GGUF_KIND_FLOAT:
        gguf_put(t, v->type == KILN_GGUF_FLOAT32 ? "%.9g" : "%.17g", v->f);
        break;
    case GGUF_KIND_BOOL:
        gguf_put(t, "%s", v->u ? "true" : "false");
        break;
    case GGUF_KIND_STRING: {
        size_t n = v->str.len < GGUF_SUMMARY_STR_MAX ? v->str.len : GGUF_SUMMARY_STR_MAX;
        gguf_put(t, "\"");
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)v->str.ptr[i];
            if (c == '"' || c == '\\')
                gguf_put(t, "\\%c", c);
            else if (c < 0x20 || c == 0x7f)
                gguf_put(t, "\\x%02x", c);
            else
                gguf_put(t, "%c", c);
        }
        gguf_put(t, "%s", n < v->str.len ? "\"..." : "\"");
        break;
    }
    case GGUF_KIND_ARRAY: {
        gguf_put(t, "array<%s>[%zu] [", kiln_gguf_type_name(v->arr.type), v->arr.n);
        size_t shown = max_items < 0 ? 0 : (size_t)max_items;
        if (shown > v->arr.n)
            shown = v->arr.n;
        for (size_t i = 0; i < shown; i++) {
            kiln_gguf_value item;
            kiln_gguf_array_at(v, i, &item);
            gguf_put(t, "%s", i ? ", " : "");
            gguf_put_value(t, &item, max_items);
        }
        gguf_put(t, "%s", shown < v->arr.n ? (shown ? ", ...]" : "...]") : "]");
        break;
    }
    }
}

char *kiln_gguf_value_summary(const kiln_gguf_value *v, int max_items, char *buf, size_t size)
{
    if (!buf || size == 0)
        return buf;
    gguf_text t = {.buf = buf, .size = size};
    buf[0] = '\0';
    if (v)
        gguf_put_value(&t, v, max_items);
    return buf;
}
