/* The cache's insides shared by its files: LMDB files, the layered handle,
 * and the transaction helpers. */
#ifndef KILN_CACHE_IMPL_H
#define KILN_CACHE_IMPL_H

#include "cache/cache.h"

#include <lmdb.h>
#include <sys/types.h>

/* LMDB's calls that return a status, each through kiln_mdb_<call>
 * (cache/mdb.c), which runs LMDB's own unless the test hook
 * (kiln_cache_set_mdb_hook) fails it. The cache never calls one of them
 * directly; mdb_txn_abort goes through kiln_mdb_txn_abort, which ends a
 * transaction as the gate sees it. Each call site passes its "file:line",
 * the name the hook sees. */
#define kiln_mdb_env_create(env) kiln_mdb_env_create_at((env), KILN_SITE)
#define kiln_mdb_env_set_mapsize(env, size) kiln_mdb_env_set_mapsize_at((env), (size), KILN_SITE)
#define kiln_mdb_env_open(env, path, flags, mode) \
    kiln_mdb_env_open_at((env), (path), (flags), (mode), KILN_SITE)
#define kiln_mdb_reader_check(env, dead) kiln_mdb_reader_check_at((env), (dead), KILN_SITE)
#define kiln_mdb_env_get_fd(env, fd) kiln_mdb_env_get_fd_at((env), (fd), KILN_SITE)
#define kiln_mdb_env_info(env, info) kiln_mdb_env_info_at((env), (info), KILN_SITE)
#define kiln_mdb_txn_begin(env, parent, flags, txn) \
    kiln_mdb_txn_begin_at((env), (parent), (flags), (txn), KILN_SITE)
#define kiln_mdb_txn_commit(txn) kiln_mdb_txn_commit_at((txn), KILN_SITE)
#define kiln_mdb_dbi_open(txn, name, flags, dbi) \
    kiln_mdb_dbi_open_at((txn), (name), (flags), (dbi), KILN_SITE)
#define kiln_mdb_get(txn, dbi, key, val) kiln_mdb_get_at((txn), (dbi), (key), (val), KILN_SITE)
#define kiln_mdb_put(txn, dbi, key, val, flags) \
    kiln_mdb_put_at((txn), (dbi), (key), (val), (flags), KILN_SITE)
#define kiln_mdb_stat(txn, dbi, stat) kiln_mdb_stat_at((txn), (dbi), (stat), KILN_SITE)
#define kiln_mdb_drop(txn, dbi, del) kiln_mdb_drop_at((txn), (dbi), (del), KILN_SITE)
#define kiln_mdb_cursor_open(txn, dbi, cur) kiln_mdb_cursor_open_at((txn), (dbi), (cur), KILN_SITE)
#define kiln_mdb_cursor_get(cur, key, val, op) \
    kiln_mdb_cursor_get_at((cur), (key), (val), (op), KILN_SITE)
#define kiln_mdb_cursor_del(cur, flags) kiln_mdb_cursor_del_at((cur), (flags), KILN_SITE)
int kiln_mdb_env_create_at(MDB_env **env, const char *site);
int kiln_mdb_env_set_mapsize_at(MDB_env *env, size_t size, const char *site);
int kiln_mdb_env_open_at(MDB_env *env, const char *path, unsigned flags, mdb_mode_t mode,
                         const char *site);
int kiln_mdb_reader_check_at(MDB_env *env, int *dead, const char *site);
int kiln_mdb_env_get_fd_at(MDB_env *env, mdb_filehandle_t *fd, const char *site);
int kiln_mdb_env_info_at(MDB_env *env, MDB_envinfo *info, const char *site);
int kiln_mdb_txn_begin_at(MDB_env *env, MDB_txn *parent, unsigned flags, MDB_txn **txn,
                          const char *site);
int kiln_mdb_txn_commit_at(MDB_txn *txn, const char *site);
void kiln_mdb_txn_abort(MDB_txn *txn);
int kiln_mdb_dbi_open_at(MDB_txn *txn, const char *name, unsigned flags, MDB_dbi *dbi,
                         const char *site);
int kiln_mdb_get_at(MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *val, const char *site);
int kiln_mdb_put_at(MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *val, unsigned flags,
                    const char *site);
int kiln_mdb_stat_at(MDB_txn *txn, MDB_dbi dbi, MDB_stat *stat, const char *site);
int kiln_mdb_drop_at(MDB_txn *txn, MDB_dbi dbi, int del, const char *site);
int kiln_mdb_cursor_open_at(MDB_txn *txn, MDB_dbi dbi, MDB_cursor **cur, const char *site);
int kiln_mdb_cursor_get_at(MDB_cursor *cur, MDB_val *key, MDB_val *val, MDB_cursor_op op,
                           const char *site);
int kiln_mdb_cursor_del_at(MDB_cursor *cur, unsigned flags, const char *site);

/* One LMDB file. */
typedef struct kiln_cache_file {
    MDB_env *env; /* NULL once closed (a map that could not grow) */
    MDB_dbi dbi;
    char *path;
    char *damage; /* the structural check's message when the file failed it: never opened */
    char *manifest; /* its manifest's text once read (cache/manifest.c), else NULL */
    dev_t dev;
    ino_t ino;
    int locked;   /* has a lock file: on the process's list of open files */
    pid_t pid;    /* the process that opened it (a forked child inherits the list) */
    struct kiln_cache_file *next_open;
} kiln_cache_file;

struct kiln_cache {
    kiln_cache_file *files; /* the layers, in search order */
    int n_files;
    int writable;           /* its layer, or -1 */
    int n_damaged;          /* layers left out because their files are damaged */
    size_t corrupt_seen;
    void (*on_corrupt)(void *ctx, const char *message);
    void *ctx;
};

/* The keys of the named values (cache/manifest.c): an exported file's
 * manifest and a file's tuning table. No record's, whose keys are 16
 * bytes. Iteration and gc pass them over. */
#define KILN_CACHE_MANIFEST_KEY "kiln-manifest"
#define KILN_CACHE_TUNING_KEY "kiln-tuning"
bool kiln_cache_is_named(const MDB_val *k);
/* Whether the size bytes at p are an intact value of this version for the
 * named key (a tuning table's text must parse too): KILN_OK, else
 * KILN_ERR_CACHE or KILN_ERR_UNSUPPORTED as kiln_cache_manifest_check. */
kiln_status kiln_cache_named_check(const char *path, const uint8_t *key, size_t key_size,
                                   const uint8_t *p, size_t size);
/* Store t's entries as f's tuning table in txn, merged with the table f
 * holds: t's replace its entries where replace is set, else f's stay. A
 * damaged table in f is KILN_ERR_CACHE. Nothing is written for an empty
 * t. */
/* Merge f's tuning table into into, into's entries kept where both hold
 * one. KILN_ERR_MALFORMED, naming f, for a damaged table. */
kiln_status kiln_cache_file_tuning(kiln_cache_file *f, kiln_tuning *into);
kiln_status kiln_cache_tuning_put(kiln_cache_file *f, MDB_txn *txn, const kiln_tuning *t,
                                  int replace, int *rc_out);
/* Whether the size bytes at p are an intact manifest value of this
 * version: KILN_OK, else KILN_ERR_CACHE (no header, checksum, a NUL) or
 * KILN_ERR_UNSUPPORTED (another version), naming path. */
kiln_status kiln_cache_manifest_check(const char *path, const uint8_t *p, size_t size);
/* Store json as f's manifest in txn (an export's). */
kiln_status kiln_cache_manifest_put(kiln_cache_file *f, MDB_txn *txn, const char *json,
                                    int *rc_out);

/* An LMDB or system failure rc of what on path, as a status: LMDB's codes
 * (negative) give KILN_ERR_CACHE, errno values KILN_ERR_IO. */
kiln_status kiln_cache_mdb_fail(int rc, const char *path, const char *what);

/* Open path into a zeroed f: MDB_RDONLY|MDB_NOLOCK for a read-only layer,
 * 0 for a writable one with a lock file, MDB_NOLOCK for a new file no other
 * process knows of. map_size 0 takes the size the file records. On failure
 * f->path (when set) is still the caller's to free. */
kiln_status kiln_cache_file_open(kiln_cache_file *f, const char *path, unsigned flags,
                                 size_t map_size);
/* Close the environment; f->path stays. Accepts a closed file. */
void kiln_cache_file_close(kiln_cache_file *f);

/* Begin a transaction on f (flags: 0 or MDB_RDONLY). */
kiln_status kiln_cache_file_begin(kiln_cache_file *f, unsigned flags, MDB_txn **txn,
                                  const char *what);

/* The body of a write transaction. An LMDB failure goes through
 * kiln_cache_body_fail, which leaves its code in *rc. */
typedef kiln_status (*kiln_cache_write_fn)(kiln_cache_file *f, MDB_txn *txn, void *ctx, int *rc);

static inline kiln_status kiln_cache_body_fail(int *rc_out, int rc, const kiln_cache_file *f,
                                               const char *what)
{
    *rc_out = rc;
    return kiln_cache_mdb_fail(rc, f->path, what);
}

/* Run body in a write transaction and commit. When the map fills up the
 * transaction is dropped, the map doubled and the body run again, so a body
 * must start from scratch each time. */
kiln_status kiln_cache_file_write(kiln_cache_file *f, const char *what, kiln_cache_write_fn body,
                                  void *ctx);

/* Put an encoded record under key inside txn unless an intact record holds
 * it already; *result says which. */
kiln_status kiln_cache_file_put(kiln_cache_file *f, MDB_txn *txn, const uint8_t *key,
                                const void *val, size_t size, kiln_cache_put *result, int *rc);

/* ------------------------------------------------------ lmdbfile.c */

/* What the structural check found in a sound file. */
typedef struct kiln_cache_check {
    uint64_t txnid;   /* of the meta page LMDB uses; 0 for an empty file too */
    size_t psize;     /* page size; 0 for an empty file (LMDB makes a new one) */
    uint64_t pages;   /* pages in use: the meta page's last page + 1 */
    uint64_t records; /* entries of the records' tree */
    int not_lmdb;     /* failed: neither meta page is LMDB's (no damage of an LMDB file) */
} kiln_cache_check;

/* Check path's structure as LMDB will read it, with pread and without
 * following a number before it is checked (lmdbfile.c says what is
 * checked). An empty file passes (LMDB writes its meta pages). Never maps
 * the file. A file with no meta page at all fails with not_lmdb set: LMDB
 * itself refuses such a file before it maps anything. KILN_ERR_CACHE "<path>: damaged: <what and where>" for a file
 * LMDB would misread; KILN_ERR_IO when it cannot be opened or read;
 * KILN_ERR_NOMEM. */
kiln_status kiln_cache_file_check(const char *path, kiln_cache_check *out);

/* Every key/value pair found in path that may be a record or a named
 * value: a node of kiln's key size at any even offset of any page, whose
 * value (in the page or in the overflow run the node names) starts with a
 * record's magic, or a node of a named value's key (manifest, tuning
 * table) whose value starts with its magic (key_size tells which). No
 * page header, offset array or tree is consulted, so a record whose own
 * node and bytes are whole is found whatever else is damaged; so are
 * records on pages freed earlier (a record removed before may be found, and
 * a key more than once), and a candidate may be no record at all: the
 * caller checks each against its key. Values are valid during the call
 * only; a status other than KILN_OK from fn stops the scan and is
 * returned. */
typedef kiln_status (*kiln_cache_scan_fn)(void *ctx, const uint8_t *key, size_t key_size,
                                          const uint8_t *val, size_t size);
kiln_status kiln_cache_file_scan(const char *path, kiln_cache_scan_fn fn, void *ctx);

/* The writable layer, or KILN_ERR_STATE naming the operation. */
kiln_status kiln_cache_writable_file(kiln_cache *c, const char *what, kiln_cache_file **out);

#endif
