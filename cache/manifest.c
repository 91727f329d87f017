/* The named values a cache file holds beside its records, under keys no
 * record can have (records are keyed by 16 bytes): an exported file's
 * manifest, what the file was made for, as JSON; and the tuning table
 * (core/tuning.c's text), the variants `kiln tune` measured. Value,
 * integers little-endian:
 *     0  magic                  "KLNM" (manifest), "KLNT" (tuning)
 *     4  u32 version            1
 *     8  u64 XXH3-64 of the text
 *    16  the text, no NUL
 * A cache file is untrusted input: the text is checked against its
 * checksum and parsed by the reader, never trusted to be well formed. */
#include "cache/cache_impl.h"
#include "core/tuning.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

enum { NAMED_HEADER = 16, NAMED_VERSION = 1 };

/* Larger than any manifest or tuning table of a real plan (a key is 35
 * bytes of JSON, a tuning entry a line). */
#define NAMED_MAX ((size_t)64 << 20)

typedef struct named_kind {
    const char *key, *magic, *what;
} named_kind;

static const named_kind manifest_kind = { KILN_CACHE_MANIFEST_KEY, "KLNM", "manifest" };
static const named_kind tuning_kind = { KILN_CACHE_TUNING_KEY, "KLNT", "tuning table" };

static bool key_is(const MDB_val *k, const char *name)
{
    return k->mv_size == strlen(name) && !memcmp(k->mv_data, name, k->mv_size);
}

bool kiln_cache_is_named(const MDB_val *k)
{
    return key_is(k, KILN_CACHE_MANIFEST_KEY) || key_is(k, KILN_CACHE_TUNING_KEY);
}

static kiln_status named_put(const named_kind *kind, kiln_cache_file *f, MDB_txn *txn,
                             const char *text, size_t n, int *rc_out)
{
    if (n > NAMED_MAX)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: a %s of %zu bytes is too large", f->path,
                         kind->what, n);
    uint8_t *val = kiln_malloc(NAMED_HEADER + n);
    if (!val)
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for the %s", f->path, kind->what);
    memcpy(val, kind->magic, 4);
    kiln_cache_put_le(val + 4, NAMED_VERSION, 4);
    kiln_cache_put_le(val + 8, XXH3_64bits(text, n), 8);
    memcpy(val + NAMED_HEADER, text, n);
    MDB_val k = { strlen(kind->key), (void *)kind->key };
    MDB_val v = { NAMED_HEADER + n, val };
    int rc = kiln_mdb_put(txn, f->dbi, &k, &v, 0);
    free(val);
    return rc ? kiln_cache_body_fail(rc_out, rc, f, kind->what) : KILN_OK;
}

static kiln_status named_check(const named_kind *kind, const char *path, const uint8_t *p,
                               size_t size)
{
    size_t n = size - NAMED_HEADER;
    if (size < NAMED_HEADER || memcmp(p, kind->magic, 4))
        return kiln_fail(KILN_ERR_CACHE, "%s: the %s is damaged (no header)", path, kind->what);
    if (kiln_cache_get_le(p + 4, 4) != NAMED_VERSION)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: %s version %u, not %d", path, kind->what,
                         (unsigned)kiln_cache_get_le(p + 4, 4), NAMED_VERSION);
    if (n > NAMED_MAX || kiln_cache_get_le(p + 8, 8) != XXH3_64bits(p + NAMED_HEADER, n))
        return kiln_fail(KILN_ERR_CACHE, "%s: the %s is damaged (checksum)", path, kind->what);
    if (memchr(p + NAMED_HEADER, '\0', n))
        return kiln_fail(KILN_ERR_CACHE, "%s: the %s holds a NUL", path, kind->what);
    return KILN_OK;
}

kiln_status kiln_cache_manifest_put(kiln_cache_file *f, MDB_txn *txn, const char *json,
                                    int *rc_out)
{
    return named_put(&manifest_kind, f, txn, json, strlen(json), rc_out);
}

kiln_status kiln_cache_manifest_check(const char *path, const uint8_t *p, size_t size)
{
    return named_check(&manifest_kind, path, p, size);
}

kiln_status kiln_cache_named_check(const char *path, const uint8_t *key, size_t key_size,
                                   const uint8_t *p, size_t size)
{
    MDB_val k = { key_size, (void *)key };
    if (key_is(&k, KILN_CACHE_TUNING_KEY)) {
        kiln_status st = named_check(&tuning_kind, path, p, size);
        if (st)
            return st;
        /* the text must parse too: a table the reader refuses is as lost */
        kiln_tuning *t;
        if ((st = kiln_tuning_create(&t)))
            return st;
        st = kiln_tuning_parse(t, (const char *)p + NAMED_HEADER, size - NAMED_HEADER, path);
        kiln_tuning_destroy(t);
        return st == KILN_ERR_MALFORMED ? KILN_ERR_CACHE : st;
    }
    return named_check(&manifest_kind, path, p, size);
}

/* KILN_ERR_MALFORMED with the reason the table was refused for, and what
 * mends it. */
static kiln_status damaged_table(void)
{
    char why[1024];
    snprintf(why, sizeof why, "%s", kiln_last_error());
    return kiln_fail(KILN_ERR_MALFORMED, "%s (kiln cache salvage drops it)", why);
}

/* Merge f's tuning table (when it has one) into t in txn, its entries
 * replacing t's where replace is set. A damaged or unparsable table is
 * KILN_ERR_MALFORMED naming the file (an LMDB failure is KILN_ERR_CACHE
 * or KILN_ERR_IO). */
static kiln_status tuning_read(kiln_cache_file *f, MDB_txn *txn, kiln_tuning *t, int replace,
                               int *rc_out)
{
    MDB_val k = { strlen(KILN_CACHE_TUNING_KEY), (void *)KILN_CACHE_TUNING_KEY }, v;
    int rc = kiln_mdb_get(txn, f->dbi, &k, &v);
    if (rc == MDB_NOTFOUND)
        return KILN_OK;
    if (rc)
        return rc_out ? kiln_cache_body_fail(rc_out, rc, f, "read the tuning table")
                      : kiln_cache_mdb_fail(rc, f->path, "read the tuning table");
    kiln_status st = named_check(&tuning_kind, f->path, v.mv_data, v.mv_size);
    if (st)
        return damaged_table();
    kiln_tuning *read;
    if ((st = kiln_tuning_create(&read)))
        return st;
    st = kiln_tuning_parse(read, (const char *)v.mv_data + NAMED_HEADER, v.mv_size - NAMED_HEADER,
                           f->path);
    if (st == KILN_ERR_MALFORMED)
        st = damaged_table();
    if (!st)
        st = kiln_tuning_merge(t, read, replace);
    kiln_tuning_destroy(read);
    return st;
}

kiln_status kiln_cache_tuning_put(kiln_cache_file *f, MDB_txn *txn, const kiln_tuning *t,
                                  int replace, int *rc_out)
{
    if (!kiln_tuning_n(t))
        return KILN_OK;
    kiln_tuning *all;
    kiln_status st = kiln_tuning_create(&all);
    if (st)
        return st;
    char *text = NULL;
    size_t n = 0;
    if (!(st = kiln_tuning_merge(all, t, 1)) &&
        (st = tuning_read(f, txn, all, !replace, rc_out)) == KILN_ERR_MALFORMED)
        st = KILN_ERR_CACHE;
    if (!st && !(st = kiln_tuning_text(all, &text, &n)))
        st = named_put(&tuning_kind, f, txn, text, n, rc_out);
    free(text);
    kiln_tuning_destroy(all);
    return st;
}

kiln_status kiln_cache_file_tuning(kiln_cache_file *f, kiln_tuning *into)
{
    MDB_txn *txn;
    kiln_status st = kiln_cache_file_begin(f, MDB_RDONLY, &txn, "read the tuning table");
    if (st)
        return st;
    st = tuning_read(f, txn, into, 0, NULL);
    kiln_mdb_txn_abort(txn);
    return st;
}

kiln_status kiln_cache_layer_tuning(kiln_cache *c, int layer, kiln_tuning *into)
{
    if (!c || !into || layer < 0 || layer >= c->n_files)
        return kiln_fail(KILN_ERR_INVALID_ARG, "cache tuning: layer %d of %d", layer,
                         c ? c->n_files : 0);
    kiln_cache_file *f = &c->files[layer];
    if (f->damage)
        return kiln_fail(KILN_ERR_CACHE, "%s", f->damage);
    if (!f->env)
        return kiln_fail(KILN_ERR_CACHE, "%s: closed after a failure", f->path);
    kiln_status st = kiln_cache_file_tuning(f, into);
    return st == KILN_ERR_MALFORMED ? KILN_ERR_CACHE : st;
}

kiln_status kiln_cache_tuning(kiln_cache *c, kiln_tuning *into)
{
    if (!c || !into)
        return kiln_fail(KILN_ERR_INVALID_ARG, "cache tuning: the cache and the table are required");
    kiln_status st = KILN_OK;
    for (int i = 0; i < c->n_files && !st; i++)
        if (!c->files[i].damage && c->files[i].env)
            st = kiln_cache_file_tuning(&c->files[i], into);
    return st == KILN_ERR_MALFORMED ? KILN_ERR_CACHE : st;
}

typedef struct tuning_store_ctx {
    const kiln_tuning *t;
} tuning_store_ctx;

static kiln_status tuning_store_body(kiln_cache_file *f, MDB_txn *txn, void *ctx, int *rc_out)
{
    return kiln_cache_tuning_put(f, txn, ((tuning_store_ctx *)ctx)->t, 1, rc_out);
}

kiln_status kiln_cache_store_tuning(kiln_cache *c, const kiln_tuning *t)
{
    if (!c || !t)
        return kiln_fail(KILN_ERR_INVALID_ARG, "cache tuning: the cache and the table are required");
    kiln_cache_file *f;
    kiln_status st = kiln_cache_writable_file(c, "store a tuning table", &f);
    if (st)
        return st;
    tuning_store_ctx x = { t };
    return kiln_cache_file_write(f, "store the tuning table", tuning_store_body, &x);
}

kiln_status kiln_cache_manifest(kiln_cache *c, int layer, const char **json)
{
    if (!c || !json || layer < 0 || layer >= c->n_files)
        return kiln_fail(KILN_ERR_INVALID_ARG, "cache manifest: layer %d of %d", layer,
                         c ? c->n_files : 0);
    kiln_cache_file *f = &c->files[layer];
    if (f->manifest) {
        *json = f->manifest;
        return KILN_OK;
    }
    if (f->damage)
        return kiln_fail(KILN_ERR_CACHE, "%s", f->damage);
    MDB_txn *txn;
    kiln_status st = kiln_cache_file_begin(f, MDB_RDONLY, &txn, "read the manifest");
    if (st)
        return st;
    MDB_val k = { strlen(KILN_CACHE_MANIFEST_KEY), (void *)KILN_CACHE_MANIFEST_KEY }, v;
    int rc = kiln_mdb_get(txn, f->dbi, &k, &v);
    if (rc == MDB_NOTFOUND) {
        st = kiln_fail(KILN_ERR_NOT_FOUND, "%s has no manifest (only kiln cache export writes "
                       "one)", f->path);
    } else if (rc) {
        st = kiln_cache_mdb_fail(rc, f->path, "read the manifest");
    } else if (!(st = kiln_cache_manifest_check(f->path, v.mv_data, v.mv_size)) &&
               !(f->manifest = kiln_strndup((const char *)v.mv_data + NAMED_HEADER,
                                            v.mv_size - NAMED_HEADER))) {
        st = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for the manifest", f->path);
    }
    kiln_mdb_txn_abort(txn);
    if (st) {
        free(f->manifest);
        f->manifest = NULL;
        return st;
    }
    *json = f->manifest;
    return KILN_OK;
}
