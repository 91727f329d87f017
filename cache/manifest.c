/* The manifest of an exported cache file: what the file was made for, as
 * JSON, stored beside the records under a key no record can have (records
 * are keyed by 16 bytes). Value, integers little-endian:
 *     0  "KLNM"                 magic
 *     4  u32 manifest version   1
 *     8  u64 XXH3-64 of the text
 *    16  the JSON text, no NUL
 * A cache file is untrusted input: the text is checked against its
 * checksum and parsed by the reader, never trusted to be JSON. */
#include "cache/cache_impl.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

enum { MANIFEST_HEADER = 16, MANIFEST_VERSION = 1 };

/* Larger than any manifest of a real plan (a key is 35 bytes of JSON). */
#define MANIFEST_MAX ((size_t)64 << 20)

bool kiln_cache_is_manifest(const MDB_val *k)
{
    return k->mv_size == sizeof KILN_CACHE_MANIFEST_KEY - 1 &&
           !memcmp(k->mv_data, KILN_CACHE_MANIFEST_KEY, k->mv_size);
}


kiln_status kiln_cache_manifest_put(kiln_cache_file *f, MDB_txn *txn, const char *json,
                                    int *rc_out)
{
    size_t n = strlen(json);
    if (n > MANIFEST_MAX)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: a manifest of %zu bytes is too large",
                         f->path, n);
    uint8_t *val = kiln_malloc(MANIFEST_HEADER + n);
    if (!val)
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for the manifest", f->path);
    memcpy(val, "KLNM", 4);
    kiln_cache_put_le(val + 4, MANIFEST_VERSION, 4);
    kiln_cache_put_le(val + 8, XXH3_64bits(json, n), 8);
    memcpy(val + MANIFEST_HEADER, json, n);
    MDB_val k = { sizeof KILN_CACHE_MANIFEST_KEY - 1, (void *)KILN_CACHE_MANIFEST_KEY };
    MDB_val v = { MANIFEST_HEADER + n, val };
    int rc = kiln_mdb_put(txn, f->dbi, &k, &v, 0);
    free(val);
    return rc ? kiln_cache_body_fail(rc_out, rc, f, "manifest") : KILN_OK;
}

kiln_status kiln_cache_manifest_check(const char *path, const uint8_t *p, size_t size)
{
    size_t n = size - MANIFEST_HEADER;
    if (size < MANIFEST_HEADER || memcmp(p, "KLNM", 4))
        return kiln_fail(KILN_ERR_CACHE, "%s: the manifest is damaged (no header)", path);
    if (kiln_cache_get_le(p + 4, 4) != MANIFEST_VERSION)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: manifest version %u, not %d", path,
                         (unsigned)kiln_cache_get_le(p + 4, 4), MANIFEST_VERSION);
    if (n > MANIFEST_MAX || kiln_cache_get_le(p + 8, 8) != XXH3_64bits(p + MANIFEST_HEADER, n))
        return kiln_fail(KILN_ERR_CACHE, "%s: the manifest is damaged (checksum)", path);
    if (memchr(p + MANIFEST_HEADER, '\0', n))
        return kiln_fail(KILN_ERR_CACHE, "%s: the manifest holds a NUL", path);
    return KILN_OK;
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
    MDB_val k = { sizeof KILN_CACHE_MANIFEST_KEY - 1, (void *)KILN_CACHE_MANIFEST_KEY }, v;
    int rc = kiln_mdb_get(txn, f->dbi, &k, &v);
    if (rc == MDB_NOTFOUND) {
        st = kiln_fail(KILN_ERR_NOT_FOUND, "%s has no manifest (only kiln cache export writes "
                       "one)", f->path);
    } else if (rc) {
        st = kiln_cache_mdb_fail(rc, f->path, "read the manifest");
    } else if (!(st = kiln_cache_manifest_check(f->path, v.mv_data, v.mv_size)) &&
               !(f->manifest = kiln_strndup((const char *)v.mv_data + MANIFEST_HEADER,
                                            v.mv_size - MANIFEST_HEADER))) {
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
