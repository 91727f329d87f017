/* Internal to the GGUF reader: what the container (gguf.c: header, tensor
 * infos, data placement, the kiln_model) and the metadata (gguf_meta.c:
 * values, lookup, summaries) share. */
#ifndef KILN_GGUF_IMPL_H
#define KILN_GGUF_IMPL_H

#include "graph/gguf.h"

typedef struct kiln_gguf_kv {
    char *key;
    size_t at; /* file offset of the key, for messages */
    kiln_gguf_value value;
} kiln_gguf_kv;

/* A GGUF model's impl: the mapping and the metadata that points into it. */
typedef struct kiln_gguf_impl {
    void *map;
    size_t map_size;
    uint64_t dev, ino; /* the file mapped */
    kiln_gguf_kv *kv; /* file order */
    size_t n_kv;
    kiln_gguf_kv **by_key;
} kiln_gguf_impl;

/* The impl of a model gguf.c opened, or NULL for any other model (or NULL). */
const kiln_gguf_impl *kiln_gguf_impl_of(const struct kiln_model *m);

/* ------------------------------------------------------------- the parser */

/* A cursor over the mapped file. Every read checks the bytes left first. */
typedef struct kiln_gguf_parser {
    const char *path;
    const uint8_t *base;
    size_t size;
    size_t pos;
    char where[160]; /* "key 'general.name'", "tensor 'output.weight'" or "" */
} kiln_gguf_parser;

static inline size_t kiln_gguf_left(const kiln_gguf_parser *p) { return p->size - p->pos; }

/* The n-byte little-endian unsigned integer at b. */
static inline uint64_t kiln_gguf_le(const uint8_t *b, size_t n)
{
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;)
        v = v << 8 | b[i];
    return v;
}

/* Fails with "<path>: <where>: <what> (at byte offset at)". */
kiln_status kiln_gguf_fail(const kiln_gguf_parser *p, kiln_status st, size_t at, const char *fmt, ...)
    KILN_PRINTF(4, 5);
kiln_status kiln_gguf_nomem(const kiln_gguf_parser *p);
/* Sets p->where to "<kind> '<name>'", the name cut short and made printable. */
void kiln_gguf_where(kiln_gguf_parser *p, const char *kind, const char *name, size_t len);
/* KILN_ERR_MALFORMED unless n bytes are left. */
kiln_status kiln_gguf_need(const kiln_gguf_parser *p, size_t n, const char *what);
/* An n-byte little-endian unsigned integer, a uint32, a length-prefixed
 * string (a view into the mapping); each advances the cursor. */
kiln_status kiln_gguf_read_uint(kiln_gguf_parser *p, size_t n, const char *what, uint64_t *out);
kiln_status kiln_gguf_read_u32(kiln_gguf_parser *p, const char *what, uint32_t *out);
kiln_status kiln_gguf_read_str(kiln_gguf_parser *p, const char *what, const char **ptr, size_t *len);

/* ----------------------------------------------------------- the metadata */

/* Reads n_kv key-value pairs into impl: keys unique and NUL-free, values
 * checked. On failure impl holds what was read, for kiln_gguf_kvs_free. */
kiln_status kiln_gguf_read_kvs(kiln_gguf_parser *p, kiln_gguf_impl *impl, uint64_t n_kv);
/* Frees impl's keys, values and both orders of them; not the mapping. */
void kiln_gguf_kvs_free(kiln_gguf_impl *impl);
/* The pair behind key, or NULL. */
const kiln_gguf_kv *kiln_gguf_find(const kiln_gguf_impl *impl, const char *key);

#endif
