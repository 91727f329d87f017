/* GGUF v2/v3 reader, the container: the header, the tensor infos, where the
 * data lies, and the kiln_model they make (the metadata is gguf_meta.c's).
 * The file is mapped read-only and parsed front to back; metadata values and
 * tensor data stay in the mapping (views, no copies).
 *
 * Every count, length, offset and size comes from an untrusted file, so each
 * is checked against the bytes actually left before it is used. Counts are
 * bounded by the smallest encoding of what they count, which keeps every
 * allocation within a small multiple of the file size. */
#include "graph/gguf_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_DEFAULT_ALIGNMENT 32
/* ggml refuses larger alignments too: real files use 32 to 4096, and a huge
 * one can only serve to push data out of reach. */
#define GGUF_MAX_ALIGNMENT (1u << 20)
/* Limits from docs/gguf.md. */
#define GGUF_MAX_NAME 64
#define GGUF_MAX_DIMS 4
/* The smallest encodings of a key-value pair (key length, 1-byte key, type,
 * uint8 value) and of a tensor info (name length, 1-byte name, n_dims, one
 * dimension, type, offset): they bound n_kv and n_tensors by the file size. */
#define GGUF_MIN_KV_BYTES (8 + 1 + 4 + 1)
#define GGUF_MIN_TENSOR_BYTES (8 + 1 + 4 + 8 + 4 + 8)

/* ----------------------------------------------------------- tensor types */

/* ggml's tensor types by id (ggml.h, ggml-common.h). Removed types keep
 * their name so an error can say what the file meant. Q8_1 is 36 bytes as
 * ggml-common.h asserts; gguf-py's table still says 40. */
#define GGUF_TENSOR_TYPE_COUNT 42
static const kiln_gguf_tensor_type gguf_tensor_types[] = {
    [0] = {"F32", 1, 4},
    [1] = {"F16", 1, 2},
    [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},
    [4] = {"Q4_2", 0, 0},
    [5] = {"Q4_3", 0, 0},
    [6] = {"Q5_0", 32, 22},
    [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},
    [9] = {"Q8_1", 32, 36},
    [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},
    [12] = {"Q4_K", 256, 144},
    [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},
    [15] = {"Q8_K", 256, 292},
    [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74},
    [18] = {"IQ3_XXS", 256, 98},
    [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},
    [21] = {"IQ3_S", 256, 110},
    [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136},
    [24] = {"I8", 1, 1},
    [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},
    [27] = {"I64", 1, 8},
    [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},
    [30] = {"BF16", 1, 2},
    [31] = {"Q4_0_4_4", 0, 0},
    [32] = {"Q4_0_4_8", 0, 0},
    [33] = {"Q4_0_8_8", 0, 0},
    [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},
    [36] = {"IQ4_NL_4_4", 0, 0},
    [37] = {"IQ4_NL_4_8", 0, 0},
    [38] = {"IQ4_NL_8_8", 0, 0},
    [39] = {"MXFP4", 32, 17},
    [40] = {"NVFP4", 64, 36},
    [41] = {"Q1_0", 128, 18},
};
_Static_assert(KILN_ARRAY_LEN(gguf_tensor_types) == GGUF_TENSOR_TYPE_COUNT,
               "one row per GGML type id");

const kiln_gguf_tensor_type *kiln_gguf_tensor_type_get(uint32_t id)
{
    if (id >= GGUF_TENSOR_TYPE_COUNT)
        return NULL;
    return &gguf_tensor_types[id];
}

/* The kiln format stored as GGML type id, from kiln's own format table. */
static bool gguf_kiln_format(uint32_t id, kiln_format *out)
{
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        const kiln_format_info *info = kiln_format_get((kiln_format)f);
        if (info && info->gguf_type >= 0 && (uint32_t)info->gguf_type == id) {
            *out = (kiln_format)f;
            return true;
        }
    }
    return false;
}

/* Why a tensor of GGML type id cannot be used, listing the types that can. */
static void gguf_why_unsupported(uint32_t id, char *buf, size_t size)
{
    size_t len = (size_t)snprintf(buf, size, "GGML type %u has no kiln format (kiln reads", id);
    const char *sep = " ";
    for (int f = 0; f < KILN_FMT_COUNT && len < size; f++) {
        const kiln_format_info *info = kiln_format_get((kiln_format)f);
        if (!info || info->gguf_type < 0)
            continue;
        len += (size_t)snprintf(buf + len, size - len, "%s%s", sep,
                                gguf_tensor_types[info->gguf_type].name);
        sep = ", ";
    }
    if (len < size)
        snprintf(buf + len, size - len, ")");
}

/* -------------------------------------------------------------- the model */

static void gguf_impl_free(void *opaque)
{
    kiln_gguf_impl *impl = opaque;
    if (!impl)
        return;
    kiln_gguf_kvs_free(impl);
    if (impl->map)
        munmap(impl->map, impl->map_size);
    free(impl);
}

/* Frees a model that never reached the caller, the way kiln_model_close
 * frees one that did. */
static void gguf_model_discard(kiln_model *m)
{
    for (int i = 0; i < m->n_tensors; i++) {
        free(m->tensors[i].name);
        free(m->tensors[i].type_name);
        free(m->tensors[i].why);
    }
    free(m->tensors);
    free(m->path);
    free(m->container);
    gguf_impl_free(m->impl);
    free(m);
}

const kiln_gguf_impl *kiln_gguf_impl_of(const kiln_model *m)
{
    return m && m->impl_free == gguf_impl_free ? m->impl : NULL;
}

/* ------------------------------------------------------------- the parser */

kiln_status kiln_gguf_fail(const kiln_gguf_parser *p, kiln_status st, size_t at, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return kiln_fail(st, "%s: %s%s%s (at byte offset %zu)", p->path, p->where,
                     p->where[0] ? ": " : "", what, at);
}

kiln_status kiln_gguf_nomem(const kiln_gguf_parser *p)
{
    return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory while reading GGUF", p->path);
}

/* Names in messages come from the file: cut them short and keep control
 * bytes out of the terminal. */
void kiln_gguf_where(kiln_gguf_parser *p, const char *kind, const char *name, size_t len)
{
    char clean[96];
    size_t n = len < sizeof clean - 4 ? len : sizeof clean - 4;
    for (size_t i = 0; i < n; i++)
        clean[i] = name[i] >= 0x20 && name[i] < 0x7f ? name[i] : '?';
    clean[n] = '\0';
    if (n < len)
        strcat(clean, "...");
    snprintf(p->where, sizeof p->where, "%s '%s'", kind, clean);
}

kiln_status kiln_gguf_need(const kiln_gguf_parser *p, size_t n, const char *what)
{
    if (n > kiln_gguf_left(p))
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, p->pos, "truncated: %s needs %zu bytes, %zu left",
                              what, n, kiln_gguf_left(p));
    return KILN_OK;
}

kiln_status kiln_gguf_read_uint(kiln_gguf_parser *p, size_t n, const char *what, uint64_t *out)
{
    kiln_status st = kiln_gguf_need(p, n, what);
    if (st != KILN_OK)
        return st;
    *out = kiln_gguf_le(p->base + p->pos, n);
    p->pos += n;
    return KILN_OK;
}

kiln_status kiln_gguf_read_u32(kiln_gguf_parser *p, const char *what, uint32_t *out)
{
    uint64_t v;
    kiln_status st = kiln_gguf_read_uint(p, 4, what, &v);
    if (st == KILN_OK)
        *out = (uint32_t)v;
    return st;
}

kiln_status kiln_gguf_read_str(kiln_gguf_parser *p, const char *what, const char **ptr, size_t *len)
{
    size_t at = p->pos;
    uint64_t n;
    kiln_status st = kiln_gguf_read_uint(p, 8, what, &n);
    if (st != KILN_OK)
        return st;
    if (n > kiln_gguf_left(p))
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, at, "%s length %llu exceeds the %zu bytes left", what,
                              (unsigned long long)n, kiln_gguf_left(p));
    *ptr = (const char *)p->base + p->pos;
    *len = (size_t)n;
    p->pos += (size_t)n;
    return KILN_OK;
}

static kiln_status gguf_read_alignment(kiln_gguf_parser *p, const kiln_gguf_impl *impl, size_t *out)
{
    *out = GGUF_DEFAULT_ALIGNMENT;
    const kiln_gguf_kv *kv = kiln_gguf_find(impl, "general.alignment");
    if (!kv)
        return KILN_OK;
    kiln_gguf_where(p, "key", kv->key, strlen(kv->key));
    if (kv->value.type != KILN_GGUF_UINT32)
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, kv->at, "must be uint32, not %s",
                              kiln_gguf_type_name(kv->value.type));
    uint64_t a = kv->value.u;
    if (a == 0 || (a & (a - 1)) != 0)
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, kv->at, "alignment %llu is not a power of two",
                              (unsigned long long)a);
    if (a > GGUF_MAX_ALIGNMENT)
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, kv->at, "alignment %llu is above the limit %u",
                              (unsigned long long)a, GGUF_MAX_ALIGNMENT);
    p->where[0] = '\0';
    *out = (size_t)a;
    return KILN_OK;
}

/* Where each tensor's record sits in the file, for the checks that need all
 * records (ranges, overlaps, duplicate names) and their messages. */
typedef struct gguf_tensor_rec {
    const kiln_model_tensor *t;
    uint64_t offset;  /* from the start of the data section */
    size_t name_at;   /* file offset of the record */
    size_t offset_at; /* file offset of its data offset field */
} gguf_tensor_rec;

static kiln_status gguf_read_tensor(kiln_gguf_parser *p, size_t alignment, size_t index,
                                    kiln_model_tensor *t, gguf_tensor_rec *rec)
{
    kiln_status st;
    const char *name;
    size_t len, at = p->pos;
    snprintf(p->where, sizeof p->where, "tensor #%zu", index);
    if ((st = kiln_gguf_read_str(p, "tensor name", &name, &len)) != KILN_OK)
        return st;
    if (len == 0)
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, at, "empty tensor name");
    if (len > GGUF_MAX_NAME)
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, at, "tensor name is %zu bytes long, the limit is %d",
                              len, GGUF_MAX_NAME);
    if (memchr(name, '\0', len))
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, at, "tensor name contains a NUL byte");
    kiln_gguf_where(p, "tensor", name, len);
    if (!(t->name = kiln_malloc(len + 1)))
        return kiln_gguf_nomem(p);
    memcpy(t->name, name, len);
    t->name[len] = '\0';
    rec->t = t;
    rec->name_at = at;

    at = p->pos;
    uint32_t n_dims;
    if ((st = kiln_gguf_read_u32(p, "n_dims", &n_dims)) != KILN_OK)
        return st;
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, at, "n_dims %u is not in 1..%d", n_dims,
                              GGUF_MAX_DIMS);
    t->n_dims = (int)n_dims;
    int64_t nelem = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        uint64_t ne = 1;
        at = p->pos;
        if (d < (int)n_dims && (st = kiln_gguf_read_uint(p, 8, "dimension", &ne)) != KILN_OK)
            return st;
        if (ne == 0 || ne > INT64_MAX)
            return kiln_gguf_fail(p, KILN_ERR_MALFORMED, at, "dimension %d is %llu, not in 1..2^63-1", d,
                                  (unsigned long long)ne);
        t->ne[d] = (int64_t)ne;
        if (__builtin_mul_overflow(nelem, t->ne[d], &nelem))
            return kiln_gguf_fail(p, KILN_ERR_MALFORMED, at,
                                  "the element count overflows at dimension %d (%lld)", d, (long long)ne);
    }

    at = p->pos;
    uint32_t id;
    if ((st = kiln_gguf_read_u32(p, "tensor type", &id)) != KILN_OK)
        return st;
    const kiln_gguf_tensor_type *tt = kiln_gguf_tensor_type_get(id);
    if (!tt)
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, at, "unknown tensor type id %u", id);
    if (tt->block == 0)
        return kiln_gguf_fail(p, KILN_ERR_UNSUPPORTED, at,
                              "type %u (%s) has been removed from GGUF; its layout is unknown", id,
                              tt->name);
    if (t->ne[0] % tt->block != 0)
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, at,
                              "type %s needs ne[0] to be a multiple of %d, but ne[0] is %lld", tt->name,
                              tt->block, (long long)t->ne[0]);
    size_t row_bytes = (size_t)(t->ne[0] / tt->block) * (size_t)tt->type_size;
    size_t bytes = row_bytes;
    for (int d = 1; d < GGUF_MAX_DIMS; d++)
        if (!kiln_mul_size(bytes, (size_t)t->ne[d], &bytes))
            return kiln_gguf_fail(p, KILN_ERR_MALFORMED, at, "the size in bytes overflows");
    t->bytes = bytes;
    if (!(t->type_name = kiln_strdup(tt->name)))
        return kiln_gguf_nomem(p);

    at = p->pos;
    if ((st = kiln_gguf_read_uint(p, 8, "tensor data offset", &rec->offset)) != KILN_OK)
        return st;
    if (rec->offset % alignment != 0)
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, at,
                              "data offset %llu is not a multiple of the alignment %zu",
                              (unsigned long long)rec->offset, alignment);
    rec->offset_at = at;

    kiln_format fmt;
    t->qt.n = t->ne[1] * t->ne[2] * t->ne[3];
    t->qt.k = t->ne[0];
    if (gguf_kiln_format(id, &fmt)) {
        const kiln_format_info *fi = kiln_format_get(fmt);
        assert(fi->block == tt->block && fi->block_bytes == tt->type_size);
        (void)fi;
        t->supported = 1;
        t->qt.format = fmt;
        t->qt.global_scale = 1.0f;
    } else {
        char why[256];
        gguf_why_unsupported(id, why, sizeof why);
        t->qt.format = KILN_FMT_COUNT;
        if (!(t->why = kiln_strdup(why)))
            return kiln_gguf_nomem(p);
    }
    p->where[0] = '\0';
    return KILN_OK;
}

static int gguf_rec_by_offset(const void *a, const void *b)
{
    uint64_t x = ((const gguf_tensor_rec *)a)->offset, y = ((const gguf_tensor_rec *)b)->offset;
    return (x > y) - (x < y);
}

static int gguf_rec_by_name(const void *a, const void *b)
{
    return strcmp(((const gguf_tensor_rec *)a)->t->name, ((const gguf_tensor_rec *)b)->t->name);
}

/* Every tensor lies inside the file, none overlaps another, no name repeats;
 * then point the supported ones into the mapping. */
static kiln_status gguf_place_tensors(kiln_gguf_parser *p, kiln_model *m, gguf_tensor_rec *recs,
                                      size_t data_start)
{
    size_t n = (size_t)m->n_tensors;
    for (size_t i = 0; i < n; i++) {
        const kiln_model_tensor *t = recs[i].t;
        size_t end;
        if (recs[i].offset > p->size || !kiln_add_size(data_start, (size_t)recs[i].offset, &end) ||
            !kiln_add_size(end, t->bytes, &end) || end > p->size) {
            kiln_gguf_where(p, "tensor", t->name, strlen(t->name));
            return kiln_gguf_fail(p, KILN_ERR_MALFORMED, recs[i].offset_at,
                                  "data (offset %llu, %zu bytes, data section at %zu) runs past the end of "
                                  "the file (%zu bytes)",
                                  (unsigned long long)recs[i].offset, t->bytes, data_start, p->size);
        }
    }
    for (size_t i = 0; i < n; i++) {
        kiln_model_tensor *t = &m->tensors[i];
        if (t->supported)
            t->qt.data = (void *)(p->base + data_start + recs[i].offset);
    }
    qsort(recs, n, sizeof *recs, gguf_rec_by_offset);
    for (size_t i = 1; i < n; i++) {
        const gguf_tensor_rec *a = &recs[i - 1], *b = &recs[i];
        if (a->offset + a->t->bytes > b->offset) {
            kiln_gguf_where(p, "tensor", b->t->name, strlen(b->t->name));
            return kiln_gguf_fail(p, KILN_ERR_MALFORMED, b->offset_at,
                                  "data at offset %llu overlaps tensor '%s' (offset %llu, %zu bytes)",
                                  (unsigned long long)b->offset, a->t->name,
                                  (unsigned long long)a->offset, a->t->bytes);
        }
    }
    qsort(recs, n, sizeof *recs, gguf_rec_by_name);
    for (size_t i = 1; i < n; i++) {
        const gguf_tensor_rec *a = &recs[i - 1], *b = &recs[i];
        if (strcmp(a->t->name, b->t->name) == 0) {
            kiln_gguf_where(p, "tensor", a->t->name, strlen(a->t->name));
            return kiln_gguf_fail(p, KILN_ERR_MALFORMED, a->name_at > b->name_at ? a->name_at : b->name_at,
                                  "duplicate tensor name (first at byte offset %zu)",
                                  a->name_at < b->name_at ? a->name_at : b->name_at);
        }
    }
    p->where[0] = '\0';
    return KILN_OK;
}

/* ------------------------------------------------------- hyper-parameters */

static const struct {
    const char *suffix; /* after "<arch>." */
    size_t offset;      /* of an int64_t in kiln_model_hparams */
} gguf_hparam_ints[] = {
    {"block_count", offsetof(kiln_model_hparams, n_layers)},
    {"embedding_length", offsetof(kiln_model_hparams, d_model)},
    {"feed_forward_length", offsetof(kiln_model_hparams, d_ffn)},
    {"attention.head_count", offsetof(kiln_model_hparams, n_heads)},
    {"attention.head_count_kv", offsetof(kiln_model_hparams, n_kv_heads)},
    {"context_length", offsetof(kiln_model_hparams, ctx)},
    {"vocab_size", offsetof(kiln_model_hparams, vocab)},
};

/* A count the file may give; 0 when absent. Some architectures give a list
 * with one value per layer instead of one number: that leaves it 0 too. */
static kiln_status gguf_hparam_count(const kiln_model *m, const char *key, int64_t *out)
{
    const kiln_gguf_value *v = kiln_gguf_get(m, key);
    if (!v || v->type == KILN_GGUF_ARRAY)
        return KILN_OK;
    kiln_status st = kiln_gguf_get_int(m, key, out);
    if (st == KILN_OK && *out < 0)
        return kiln_fail(KILN_ERR_MALFORMED, "%s: key '%s': %lld is negative (at byte offset %zu)",
                         m->path, key, (long long)*out, kiln_gguf_find(m->impl, key)->at);
    return st;
}

static kiln_status gguf_read_hparams(kiln_model *m)
{
    kiln_model_hparams *hp = &m->hp;
    const char *arch;
    size_t len;
    kiln_status st = kiln_gguf_get_str(m, "general.architecture", &arch, &len);
    if (st == KILN_ERR_NOT_FOUND)
        return KILN_OK;
    if (st != KILN_OK)
        return st;
    if (len == 0 || len >= sizeof hp->arch || memchr(arch, '\0', len))
        return kiln_fail(KILN_ERR_MALFORMED,
                         "%s: key 'general.architecture': not a name of 1..%zu characters "
                         "(at byte offset %zu)",
                         m->path, sizeof hp->arch - 1, kiln_gguf_find(m->impl, "general.architecture")->at);
    memcpy(hp->arch, arch, len);
    hp->arch[len] = '\0';

    char key[sizeof hp->arch + 48];
    for (size_t i = 0; i < KILN_ARRAY_LEN(gguf_hparam_ints); i++) {
        snprintf(key, sizeof key, "%s.%s", hp->arch, gguf_hparam_ints[i].suffix);
        int64_t *dst = (int64_t *)((char *)hp + gguf_hparam_ints[i].offset);
        if ((st = gguf_hparam_count(m, key, dst)) != KILN_OK)
            return st;
    }
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", hp->arch);
    double eps;
    st = kiln_gguf_get_float(m, key, &eps);
    if (st == KILN_OK) {
        hp->rms_eps = (float)eps;
        hp->has_rms_eps = 1;
    }
    else if (st != KILN_ERR_NOT_FOUND)
        return st;
    if (hp->vocab == 0) {
        const kiln_gguf_value *tokens = kiln_gguf_get(m, "tokenizer.ggml.tokens");
        if (tokens && tokens->type != KILN_GGUF_ARRAY)
            return kiln_fail(KILN_ERR_MALFORMED,
                             "%s: key 'tokenizer.ggml.tokens': must be an array, not %s "
                             "(at byte offset %zu)",
                             m->path, kiln_gguf_type_name(tokens->type),
                             kiln_gguf_find(m->impl, "tokenizer.ggml.tokens")->at);
        if (tokens)
            hp->vocab = (int64_t)tokens->arr.n;
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------- opening */

static kiln_status gguf_read_header(kiln_gguf_parser *p, uint32_t *version, uint64_t *n_tensors,
                                    uint64_t *n_kv)
{
    kiln_status st;
    if (p->size < 4 || memcmp(p->base, "GGUF", 4) != 0)
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, 0, "not a GGUF file (no \"GGUF\" magic)");
    p->pos = 4;
    if ((st = kiln_gguf_read_u32(p, "version", version)) != KILN_OK)
        return st;
    uint32_t swapped = __builtin_bswap32(*version);
    if (*version >= 0x10000 && swapped >= 1 && swapped <= 3)
        return kiln_gguf_fail(p, KILN_ERR_UNSUPPORTED, 4, "big-endian GGUF (version %u) is not supported",
                              swapped);
    if (*version != 2 && *version != 3)
        return kiln_gguf_fail(p, KILN_ERR_UNSUPPORTED, 4,
                              "GGUF version %u is not supported (only versions 2 and 3)", *version);
    size_t at = p->pos;
    if ((st = kiln_gguf_read_uint(p, 8, "tensor count", n_tensors)) != KILN_OK)
        return st;
    size_t kv_at = p->pos;
    if ((st = kiln_gguf_read_uint(p, 8, "metadata count", n_kv)) != KILN_OK)
        return st;
    size_t left = kiln_gguf_left(p);
    if (*n_tensors > left / GGUF_MIN_TENSOR_BYTES || *n_tensors > INT32_MAX)
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, at,
                              "%llu tensors cannot fit in the %zu bytes left",
                              (unsigned long long)*n_tensors, left);
    if (*n_kv > left / GGUF_MIN_KV_BYTES || *n_kv > INT32_MAX)
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, kv_at,
                              "%llu metadata pairs cannot fit in the %zu bytes left",
                              (unsigned long long)*n_kv, left);
    if (*n_tensors * GGUF_MIN_TENSOR_BYTES + *n_kv * GGUF_MIN_KV_BYTES > left)
        return kiln_gguf_fail(p, KILN_ERR_MALFORMED, at,
                              "%llu tensors and %llu metadata pairs cannot fit in the %zu bytes left",
                              (unsigned long long)*n_tensors, (unsigned long long)*n_kv, left);
    return KILN_OK;
}

static kiln_status gguf_parse(kiln_gguf_parser *p, kiln_model *m, kiln_gguf_impl *impl)
{
    uint32_t version = 0;
    uint64_t n_tensors = 0, n_kv = 0;
    kiln_status st = gguf_read_header(p, &version, &n_tensors, &n_kv);
    if (st != KILN_OK)
        return st;
    char container[16];
    snprintf(container, sizeof container, "gguf v%u", version);
    if (!(m->container = kiln_strdup(container)))
        return kiln_gguf_nomem(p);
    if ((st = kiln_gguf_read_kvs(p, impl, n_kv)) != KILN_OK)
        return st;
    size_t alignment;
    if ((st = gguf_read_alignment(p, impl, &alignment)) != KILN_OK)
        return st;
    if ((st = gguf_read_hparams(m)) != KILN_OK)
        return st;
    if (n_tensors == 0)
        return KILN_OK;

    m->tensors = kiln_calloc((size_t)n_tensors, sizeof *m->tensors);
    gguf_tensor_rec *recs = kiln_calloc((size_t)n_tensors, sizeof *recs);
    if (!m->tensors || !recs) {
        free(recs);
        return kiln_gguf_nomem(p);
    }
    for (size_t i = 0; i < n_tensors && st == KILN_OK; i++) {
        m->n_tensors = (int)i + 1;
        st = gguf_read_tensor(p, alignment, i, &m->tensors[i], &recs[i]);
    }
    /* The data section starts at the next multiple of the alignment; the
     * alignment is at most 1 MiB, so this cannot overflow. */
    size_t data_start = (p->pos + alignment - 1) / alignment * alignment;
    if (st == KILN_OK)
        st = gguf_place_tensors(p, m, recs, data_start);
    free(recs);
    return st;
}

static kiln_status gguf_map(const char *path, kiln_gguf_impl *impl)
{
    int fd;
    void **map = &impl->map;
    size_t *size = &impl->map_size;
    kiln_status st = kiln_file_open_regular(path, &fd, size);
    if (st != KILN_OK)
        return st;
    struct stat sb;
    if (fstat(fd, &sb) == 0)
        impl->dev = (uint64_t)sb.st_dev, impl->ino = (uint64_t)sb.st_ino;
    if (*size == 0)
        st = kiln_fail(KILN_ERR_MALFORMED, "%s: empty file, not GGUF (at byte offset 0)", path);
    if (st == KILN_OK) {
        *map = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (*map == MAP_FAILED) {
            *map = NULL;
            st = kiln_fail(KILN_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
        }
    }
    close(fd);
    return st;
}

static void gguf_file_of(const kiln_model *m, const void *p, size_t bytes, kiln_file_span *out)
{
    const kiln_gguf_impl *impl = m->impl;
    uintptr_t base = (uintptr_t)impl->map, at = (uintptr_t)p;
    if (!base || at < base || at - base > impl->map_size || bytes > impl->map_size - (at - base))
        return;
    *out = (kiln_file_span){ m->path, at - base, impl->dev, impl->ino };
}

kiln_status kiln_gguf_open(const char *path, kiln_model **out)
{
    if (!path || !out)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_gguf_open: path and out must not be NULL");
    kiln_model *m = kiln_calloc(1, sizeof *m);
    kiln_gguf_impl *impl = kiln_calloc(1, sizeof *impl);
    if (!m || !impl || !(m->path = kiln_strdup(path))) {
        free(m ? m->path : NULL);
        free(m);
        free(impl);
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory while reading GGUF", path);
    }
    m->impl = impl;
    m->impl_free = gguf_impl_free;
    m->impl_file_of = gguf_file_of;
    kiln_status st = gguf_map(path, impl);
    if (st == KILN_OK) {
        kiln_gguf_parser p = {.path = path, .base = impl->map, .size = impl->map_size};
        st = gguf_parse(&p, m, impl);
    }
    if (st != KILN_OK) {
        gguf_model_discard(m);
        return st;
    }
    *out = m;
    return KILN_OK;
}
