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

enum {
    KILN_CACHE_KEY_BYTES = 16,
    KILN_CACHE_KEY_HEX = 2 * KILN_CACHE_KEY_BYTES + 1, /* with the NUL */
};

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

/* Lowercase hex of a key, NUL-terminated. */
void kiln_cache_key_hex(const uint8_t key[KILN_CACHE_KEY_BYTES], char out[KILN_CACHE_KEY_HEX]);

/* Parse a hex key prefix of 1 to 32 digits (either case): its nibbles go to
 * the front of key (the rest is zero) and their count to *n_nibbles. A full
 * key is a prefix of 32 nibbles. KILN_ERR_INVALID_ARG for anything else. */
kiln_status kiln_cache_key_parse(const char *hex, uint8_t key[KILN_CACHE_KEY_BYTES],
                                 int *n_nibbles);

/* ------------------------------------------------------------ records */

/* A record's fields. Decoded strings and cubin point into the decoded
 * buffer. */
typedef struct kiln_cache_record {
    const char *compiler;  /* "nvrtc 13.0" */
    const char *entry;     /* the kernel function's name */
    const char *target;    /* "sm_90a" */
    const char *kind;      /* the backend that generated it ("wgmma") or an
                              auxiliary kernel's family ("quant", "op") */
    const char *signature; /* the kernel's signature text */
    uint32_t threads;      /* threads per block */
    uint32_t smem;         /* dynamic shared memory per block, bytes */
    uint64_t created;      /* unix seconds */
    const uint8_t *cubin;
    uint64_t cubin_size;
    uint64_t cubin_hash;   /* XXH3-64 of the cubin; computed by encode */
    uint32_t version;      /* set by decode; encode writes KILN_CACHE_RECORD_VERSION */
    const char *schema;    /* set by decode; encode writes KILN_CACHE_SCHEMA */
} kiln_cache_record;

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

typedef struct kiln_cache kiln_cache;

typedef struct kiln_cache_options {
    const char *const *shipped; /* read-only caches, searched first, in order */
    int n_shipped;
    const char *path;  /* the writable cache; NULL: kiln_cache_default_path */
    int no_writable;   /* open no writable cache (read-only deployment) */
    size_t map_size;   /* initial map of the writable cache; 0: 64 MiB. The
                          map grows when full; the file holds only what is
                          written. */
    /* A file whose structure is damaged (truncated; a page number, node or
     * overflow count LMDB would misread: see kiln_cache_file_check) is
     * never handed to LMDB. 0: it is treated as absent: reported through
     * on_corrupt, skipped by lookups, named by kiln_cache_layer_damage and
     * by the error of an offline miss; a damaged writable file is neither
     * written nor removed, and kiln_cache_writable_layer is -1. 1:
     * kiln_cache_open fails with KILN_ERR_CACHE naming it. */
    int strict;
    /* Called with a message naming the file, the key and the signature for
     * every corrupt record a lookup skips, and naming the file for every
     * damaged file left out. NULL: counted only. */
    void (*on_corrupt)(void *ctx, const char *message);
    void *ctx;
} kiln_cache_options;

/* The writable cache's path when none is given: $KILN_CACHE, else
 * $XDG_CACHE_HOME/kiln/kernels.kiln, else $HOME/.cache/kiln/kernels.kiln
 * (empty or relative XDG_CACHE_HOME and HOME are ignored). KILN_ERR_IO when
 * none is set; KILN_ERR_INVALID_ARG when buf is too small. */
kiln_status kiln_cache_default_path(char *buf, size_t size);

/* Open the layers (opts may be NULL: the default writable cache only).
 * The writable cache and its parent directories are created when absent;
 * reader slots left by dead processes are cleared. Errors name the file:
 * KILN_ERR_IO when a file is missing (shipped), cannot be created or
 * opened; KILN_ERR_CACHE when it is not an LMDB file or (with strict) its
 * structure is damaged; KILN_ERR_STATE when this process has the writable
 * file open already. */
kiln_status kiln_cache_open(const kiln_cache_options *opts, kiln_cache **out);
void kiln_cache_close(kiln_cache *c);

/* Layers are numbered in search order: shipped caches first, then the
 * writable one. kiln_cache_writable_layer gives its number, or -1. */
int kiln_cache_n_layers(const kiln_cache *c);
const char *kiln_cache_layer_path(const kiln_cache *c, int layer);
int kiln_cache_writable_layer(const kiln_cache *c);
/* Why a layer's file was left out ("<path>: damaged: <what>"), or NULL
 * when it is in use. */
const char *kiln_cache_layer_damage(const kiln_cache *c, int layer);

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
 * message says when a record was passed over); KILN_ERR_CACHE when LMDB
 * fails. */
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
 * key holds a record of another version (left alone), LMDB fails or the
 * map cannot grow (LMDB is left without a map then: the
 * writable file is closed, and later calls that reach it give
 * KILN_ERR_STATE). */
kiln_status kiln_cache_store(kiln_cache *c, const uint8_t key[KILN_CACHE_KEY_BYTES],
                             const kiln_cache_record *rec, kiln_cache_put *result);

/* The KILN_ERR_OFFLINE_MISS of a kernel no layer holds: names the
 * signature, the key and the caches searched. c may be NULL (none). When a
 * layer was left out as damaged, the kernel may be in it: KILN_ERR_CACHE,
 * naming the damaged files. */
kiln_status kiln_cache_offline_miss(const kiln_cache *c, const char *signature,
                                    const uint8_t key[KILN_CACHE_KEY_BYTES]);

/* ---------------------------------------------------------- maintenance */

/* One stored entry as iteration sees it, with the status of
 * kiln_cache_record_decode: KILN_OK, KILN_ERR_UNSUPPORTED (a record of
 * another version: rec.version says which, and a version 1 record's fields
 * are set) or KILN_ERR_CACHE (corrupt: rec is unset). problem says why
 * when it is not KILN_OK, naming the file and the key. Pointers are valid
 * during the callback only. */
typedef struct kiln_cache_entry {
    uint8_t key[KILN_CACHE_KEY_BYTES]; /* zero when the stored key is not 16 bytes */
    size_t key_size;
    int layer;                         /* -1: the source of a merge */
    size_t size;                       /* the value's bytes */
    kiln_status status;
    const char *problem;
    kiln_cache_record rec;
} kiln_cache_entry;

/* A visitor; any status but KILN_OK stops the iteration and is returned.
 * It must not call back into the cache. */
typedef kiln_status (*kiln_cache_visit_fn)(void *ctx, const kiln_cache_entry *e);

/* Visit every entry of a layer in key order. */
kiln_status kiln_cache_foreach(kiln_cache *c, int layer, kiln_cache_visit_fn fn, void *ctx);

/* Check every record of a layer: *n_entries and *n_bad (either may be
 * NULL) count them, on_bad (may be NULL) sees each bad (corrupt) one.
 * Records of another version are entries, not bad. A layer whose file is
 * damaged is KILN_ERR_CACHE with kiln_cache_layer_damage's message. */
kiln_status kiln_cache_verify(kiln_cache *c, int layer, kiln_cache_visit_fn on_bad, void *ctx,
                              size_t *n_entries, size_t *n_bad);

typedef struct kiln_cache_tally {
    char *name;
    size_t entries;
    uint64_t bytes; /* values, headers included */
} kiln_cache_tally;

typedef struct kiln_cache_stats {
    size_t entries, bad;
    size_t other_versions; /* records of another version, left alone; not bad */
    uint64_t bytes;        /* all values */
    uint64_t cubin_bytes;  /* cubins of intact records */
    uint64_t file_bytes;   /* the file on disk */
    uint64_t map_bytes;    /* the current map */
    uint64_t oldest, newest; /* created, intact records; 0 when none */
    kiln_cache_tally *by_target, *by_kind; /* intact records, by first appearance */
    int n_targets, n_kinds;
} kiln_cache_stats;

/* Totals of a layer; release with kiln_cache_stats_free. */
kiln_status kiln_cache_stat(kiln_cache *c, int layer, kiln_cache_stats *out);
void kiln_cache_stats_free(kiln_cache_stats *s);

typedef struct kiln_cache_gc_options {
    const char *compiler; /* remove records made by any other compiler; NULL: keep all */
    uint64_t max_age_s;   /* remove records created longer ago than this; 0: no limit */
    int corrupt;          /* remove records that fail validation (not those of
                             another version) */
    uint32_t version;     /* remove records of this record version; 0: none. Nothing
                             else removes a record of another version */
} kiln_cache_gc_options;

/* Remove from the writable cache what o (not NULL) selects, in one
 * transaction. *removed and *bytes (either may be NULL) say how much went.
 * KILN_ERR_STATE when there is no writable cache. */
kiln_status kiln_cache_gc(kiln_cache *c, const kiln_cache_gc_options *o, size_t *removed,
                          uint64_t *bytes);

/* Remove the writable cache's keys that start with a hex prefix (see
 * kiln_cache_key_parse), or all of them. *removed may be NULL.
 * KILN_ERR_INVALID_ARG for a bad prefix; KILN_ERR_STATE without a writable
 * cache. */
kiln_status kiln_cache_rm(kiln_cache *c, const char *hex_prefix, size_t *removed);
kiln_status kiln_cache_rm_all(kiln_cache *c, size_t *removed);

typedef struct kiln_cache_merge_result {
    size_t added, present, replaced; /* as kiln_cache_put */
    size_t bad;                      /* corrupt records of the source, left out */
    size_t other;                    /* records of another version, left out */
} kiln_cache_merge_result;

/* Copy every intact record of this version (bound to its key) of the cache
 * file src into the writable cache, keeping records it already holds
 * intact, in one transaction. The source
 * is opened like a shipped cache and must not be written meanwhile; on_bad
 * (may be NULL) sees each of its corrupt records. out may be NULL.
 * KILN_ERR_IO / KILN_ERR_CACHE for src as kiln_cache_open;
 * KILN_ERR_INVALID_ARG when src is the writable cache itself. */
kiln_status kiln_cache_merge(kiln_cache *c, const char *src, kiln_cache_visit_fn on_bad,
                             void *ctx, kiln_cache_merge_result *out);

/* Write a new cache file at path holding exactly the given keys, each taken
 * from the first layer with an intact record: the file to ship. It is
 * written beside path and renamed into place, so a failure leaves no file
 * behind. KILN_ERR_IO when path exists and overwrite is 0;
 * KILN_ERR_NOT_FOUND, naming the key, when no layer holds one. */
kiln_status kiln_cache_export(kiln_cache *c, const uint8_t (*keys)[KILN_CACHE_KEY_BYTES],
                              size_t n_keys, const char *path, int overwrite);

typedef struct kiln_cache_salvage_result {
    size_t records;    /* intact records written */
    size_t bad;        /* pairs that were not intact records, left out */
    size_t other;      /* records of a version kiln cannot check, left out */
    size_t duplicates; /* intact records of a key already found (the later made is kept) */
} kiln_cache_salvage_result;

/* Write a new cache file at dst holding every intact record that can be
 * found in the file src, whatever its structure: every page is searched for
 * records' nodes without the tree (kiln_cache_file_scan), and each record
 * is checked against its key, so a record whose own bytes are whole is
 * found. Records of this version and readable
 * older ones are copied; of a key found twice, the later made. Records
 * removed from src before its damage may come back. dst is written beside
 * its name and renamed into place; out may be NULL. KILN_ERR_IO when src
 * cannot be read, or dst exists and overwrite is 0; KILN_ERR_INVALID_ARG
 * when dst is src. */
kiln_status kiln_cache_salvage(const char *src, const char *dst, int overwrite,
                               kiln_cache_salvage_result *out);

#endif
