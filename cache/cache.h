/* The kernel cache: compiled kernels (cubins) in LMDB files, found by a key
 * derived from everything that determines the binary.
 *
 * Key. XXH3-128 in canonical (big-endian) form over four length-prefixed
 * fields, each a u64 little-endian byte count followed by the bytes:
 * KILN_CACHE_SCHEMA, the target ("sm_90a"), the compile options, the full
 * generated source, whose header names the digest of the embedded templates
 * it includes (kiln_emit_templates_digest). The length prefixes make field
 * boundaries part of the hash ("ab"+"c" and "a"+"bc" differ). The compiler
 * version is not in the key: a deployment box looks kernels up without
 * NVRTC, so it could not compute one.
 *
 * Value. A record, every integer little-endian:
 *     0  "KLNR"                       magic
 *     4  u32 record version           KILN_CACHE_RECORD_VERSION
 *     8  u32 header size              offset of the cubin
 *    12  u32 threads per block
 *    16  u32 dynamic shared memory bytes
 *    20  u64 created                  unix seconds
 *    28  u64 cubin size
 *    36  u64 XXH3-64 of the cubin
 *    44  six strings, each u32 length + bytes + NUL: schema
 *        (KILN_CACHE_SCHEMA), compiler, entry, target, kind, signature
 *     .  u64 XXH3-64 of the record's 16-byte key followed by every header
 *        byte before this checksum
 *     .  the cubin (header size + cubin size = the value's size), an ELF
 *        for the target (EM_CUDA, the target's sm in e_flags)
 * The two checksums cover every byte, so a record that changed on disk is
 * caught whichever byte changed; every length is checked against the
 * value's size before it is used. The header checksum also covers the key
 * the record is stored under: a record moved to another key, or under a
 * damaged key, fails it. A record that fails any check is never returned as
 * a hit.
 *
 * Versions. A record version changes with the layout, and
 * KILN_CACHE_SCHEMA with it, so the keys of two versions never meet and
 * two kiln versions can share a cache. Records of another version are left
 * alone: never served, not corrupt, removed only when asked for by
 * version. Version 1 (this layout without the schema string, its header
 * checksum over the header alone) is still read for what ls and verify
 * show of it.
 *
 * Layers. Zero or more shipped caches, opened read-only without a lock file
 * (MDB_RDONLY|MDB_NOLOCK, so they work on read-only media and never change),
 * are searched first, in order; then the one writable user cache. A shipped
 * cache must not be written while it is open. The writable cache takes
 * short write transactions; other processes may use it at the same time.
 *
 * A kiln_cache is used by one thread at a time. A process opens a given
 * writable cache file once (LMDB's rule: a second open and close in the same
 * process would drop the first one's locks); a second open is refused. */
#ifndef KILN_CACHE_H
#define KILN_CACHE_H

#include "core.h"

#include <stdint.h>

#define KILN_CACHE_SCHEMA "kiln-cache-2"
#define KILN_CACHE_RECORD_VERSION 2u

/* --------------------------------------------------------------- keys */

/* The key of a kernel. target and options are NUL-terminated (options may
 * be ""); source holds source_len bytes. KILN_ERR_INVALID_ARG for a NULL
 * argument, an empty target or an empty source. */
kiln_status kiln_cache_key(const char *target, const char *options, const char *source,
                           size_t source_len, uint8_t key[KILN_CACHE_KEY_BYTES]);

/* One field of an XXH3-128 digest, as the key's fields are hashed: its u64
 * little-endian length, then its n bytes. Every digest a key depends on
 * (the key itself, the templates' digest of codegen/templates.c) hashes
 * its fields through this one function. */
struct XXH3_state_s;
void kiln_cache_key_field(struct XXH3_state_s *s, const void *p, size_t n);

/* ------------------------------------------------------------ records */

/* Encode r, bound to key, into a new buffer (*out, free()'d by the caller)
 * of *size bytes. r->cubin_hash, version and schema are ignored.
 * KILN_ERR_INVALID_ARG when a string is NULL, the entry or the cubin is
 * empty, threads is 0, the cubin is not an ELF for the target, or the
 * record would exceed the 4 GiB an LMDB value can hold. */
kiln_status kiln_cache_record_encode(const kiln_cache_record *r,
                                     const uint8_t key[KILN_CACHE_KEY_BYTES], uint8_t **out,
                                     size_t *size);

/* Decode and validate the record of size bytes stored under key; out points
 * into buf. KILN_OK for an intact record of this version and schema, bound
 * to key, whose cubin is an ELF for its target. KILN_ERR_UNSUPPORTED for an
 * intact record of another version: out->version says which, and a version
 * 1 record's fields are set (a record of an unknown version is intact as
 * far as kiln can tell: one whose version field alone was damaged is
 * corrupt). KILN_ERR_CACHE, saying what is wrong and naming the signature
 * when it is readable, for anything else. */
kiln_status kiln_cache_record_decode(const void *buf, size_t size,
                                     const uint8_t key[KILN_CACHE_KEY_BYTES],
                                     kiln_cache_record *out);

/* Whether cubin is an ELF for target ("sm_90a"): a 64-bit little-endian
 * ELF of machine EM_CUDA whose e_flags name the target's sm. KILN_OK or
 * KILN_ERR_CACHE saying what it is instead. */
kiln_status kiln_cache_cubin_check(const uint8_t *cubin, uint64_t size, const char *target);

/* -------------------------------------------------------------- caches */

/* The cache handle and its maintenance (kiln_cache_open, foreach, verify,
 * stat, gc, rm, merge, salvage) are public: include/kiln.h. */

/* Corrupt records skipped by lookups since open. */
size_t kiln_cache_corrupt_seen(const kiln_cache *c);

/* A found kernel: rec points into blob, a private copy (size bytes) that
 * stays valid until kiln_cache_hit_release. */
typedef struct kiln_cache_hit {
    kiln_cache_record rec;
    int layer;
    void *blob;
    size_t size;
} kiln_cache_hit;

/* Find key in the layers, first intact record wins: one of this version
 * and schema, bound to key, and for target (NULL: any target). A record
 * that is corrupt, of another target or of another version is reported
 * (on_corrupt; kiln_cache_corrupt_seen counts the corrupt ones) and passed
 * over; a corrupt record or one of another target in the writable cache is
 * replaced by the next store of its key. KILN_ERR_NOT_FOUND on a miss (the
 * message says when a record was passed over); KILN_ERR_CACHE or
 * KILN_ERR_IO (kiln.h) when LMDB fails. */
kiln_status kiln_cache_lookup(kiln_cache *c, const uint8_t key[KILN_CACHE_KEY_BYTES],
                              const char *target, kiln_cache_hit *out);
void kiln_cache_hit_release(kiln_cache_hit *h);

/* What a store did. */
typedef enum kiln_cache_put {
    KILN_CACHE_ADDED = 0,
    KILN_CACHE_PRESENT,  /* an intact record of the same kernel had the key (another
                            process won the race) */
    KILN_CACHE_REPLACED, /* a corrupt record, or one of another kernel, had the key */
} kiln_cache_put;

/* Store rec under key in the writable cache (rec->created 0: now). result
 * may be NULL. KILN_ERR_STATE when there is no writable cache;
 * KILN_ERR_INVALID_ARG as kiln_cache_record_encode; KILN_ERR_CACHE when the
 * key holds a record of another version (left alone) or the map cannot
 * grow (LMDB is left without a map then: the writable file is closed, and
 * later calls that reach it give KILN_ERR_STATE); KILN_ERR_CACHE or
 * KILN_ERR_IO (kiln.h) when LMDB fails. */
kiln_status kiln_cache_store(kiln_cache *c, const uint8_t key[KILN_CACHE_KEY_BYTES],
                             const kiln_cache_record *rec, kiln_cache_put *result);

/* The KILN_ERR_OFFLINE_MISS of a kernel no layer holds: names the
 * signature, the key and the caches searched. c may be NULL (none). When a
 * layer was left out as damaged, the kernel may be in it: KILN_ERR_CACHE,
 * naming the damaged files. */
kiln_status kiln_cache_offline_miss(const kiln_cache *c, const char *signature,
                                    const uint8_t key[KILN_CACHE_KEY_BYTES]);

/* For tests: hook(ctx, site, call) runs before every LMDB call of the
 * cache that returns a status (site "cache/cache.c:236", call "mdb_put"),
 * on the thread that makes it; a nonzero return is the code that call
 * fails with instead of running (an LMDB code or an errno value), failed
 * as LMDB fails it (cache/mdb.c). NULL removes it. Set it while no other
 * thread is inside kiln and no transaction is open. */
typedef int (*kiln_cache_mdb_hook)(void *ctx, const char *site, const char *call);
void kiln_cache_set_mdb_hook(kiln_cache_mdb_hook hook, void *ctx);

/* ---------------------------------------------------------- maintenance */

/* Write a new cache file at path holding exactly the given keys, each taken
 * from the first layer with an intact record: the file to ship. It is
 * written beside path and renamed into place, so a failure leaves no file
 * behind. KILN_ERR_IO when path exists and overwrite is 0;
 * KILN_ERR_NOT_FOUND, naming the key, when no layer holds one;
 * KILN_ERR_INVALID_ARG when path is one of c's files, which the export
 * reads. manifest (may be NULL) is stored as the file's manifest
 * (kiln_cache_manifest), tuning (may be NULL) as its tuning table
 * (kiln_cache_tuning). */
kiln_status kiln_cache_export_keys(kiln_cache *c, const uint8_t (*keys)[KILN_CACHE_KEY_BYTES],
                                   size_t n_keys, const char *path, int overwrite,
                                   const char *manifest, const kiln_tuning *tuning);

/* The n low bytes of v at p, little-endian, and back: the byte order of
 * every multi-byte field the cache stores. */
static inline void kiln_cache_put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t kiln_cache_get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

#endif
