/* The gate every LMDB call of the cache that returns a status passes
 * through (cache_impl.h), so that a test can fail any one of them
 * (kiln_cache_set_mdb_hook) and prove the error path behind it.
 *
 * A call the hook fails does not run, and fails as LMDB fails it: a failed
 * mdb_txn_commit has freed its transaction (the commit aborts it); a
 * transaction one of whose calls failed refuses every later call with
 * MDB_BAD_TXN and, a write transaction, its commit too (aborting it), so
 * it must be aborted (mdb.c marks it MDB_TXN_ERROR); a failed
 * mdb_env_open leaves the environment to mdb_env_close, a failed
 * mdb_txn_begin or mdb_cursor_open hands out nothing. */
#include "cache/cache_impl.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

/* Written only while no other thread is inside kiln (cache.h). */
static kiln_cache_mdb_hook mdb_hook;
static void *mdb_hook_ctx;

/* The transactions begun while the hook is set, until they end: whether
 * each is read-only and whether one of its calls failed. The cache holds
 * two at once at most (a merge reads its source inside its write). */
enum { TXN_MAX = 8 };
static pthread_mutex_t txns_lock = PTHREAD_MUTEX_INITIALIZER;
static struct txn_state {
    MDB_txn *txn;
    bool rdonly, failed;
} txns[TXN_MAX];

void kiln_cache_set_mdb_hook(kiln_cache_mdb_hook hook, void *ctx)
{
    pthread_mutex_lock(&txns_lock);
    memset(txns, 0, sizeof txns);
    mdb_hook = hook;
    mdb_hook_ctx = ctx;
    pthread_mutex_unlock(&txns_lock);
}

static int hook_says(const char *site, const char *call)
{
    return mdb_hook ? mdb_hook(mdb_hook_ctx, site, call) : 0;
}

/* Called with txns_lock held. */
static struct txn_state *txn_find(const MDB_txn *txn)
{
    for (int i = 0; i < TXN_MAX; i++)
        if (txns[i].txn == txn)
            return &txns[i];
    return NULL;
}

static void txn_track(MDB_txn *txn, bool rdonly)
{
    pthread_mutex_lock(&txns_lock);
    struct txn_state *t = txn_find(NULL);
    assert(t && "more transactions open at once than the cache ever holds");
    if (t)
        *t = (struct txn_state){ .txn = txn, .rdonly = rdonly };
    pthread_mutex_unlock(&txns_lock);
}

/* Forget txn; *failed_write says whether it was a write transaction one
 * of whose calls failed. */
static void txn_end(MDB_txn *txn, bool *failed_write)
{
    pthread_mutex_lock(&txns_lock);
    struct txn_state *t = txn_find(txn);
    if (failed_write)
        *failed_write = t && t->failed && !t->rdonly;
    if (t)
        *t = (struct txn_state){ 0 };
    pthread_mutex_unlock(&txns_lock);
}

/* A call inside txn: refused when the transaction failed before, else
 * failed when the hook says so, which fails the transaction. */
static int txn_call(MDB_txn *txn, const char *site, const char *call)
{
    if (!mdb_hook)
        return 0;
    pthread_mutex_lock(&txns_lock);
    struct txn_state *t = txn_find(txn);
    bool failed = t && t->failed;
    pthread_mutex_unlock(&txns_lock);
    if (failed)
        return MDB_BAD_TXN;
    int rc = hook_says(site, call);
    if (rc) {
        pthread_mutex_lock(&txns_lock);
        if ((t = txn_find(txn)))
            t->failed = true;
        pthread_mutex_unlock(&txns_lock);
    }
    return rc;
}

/* ------------------------------------------------------- environments */

int kiln_mdb_env_create_at(MDB_env **env, const char *site)
{
    int rc = hook_says(site, "mdb_env_create");
    return rc ? rc : mdb_env_create(env);
}

int kiln_mdb_env_set_mapsize_at(MDB_env *env, size_t size, const char *site)
{
    int rc = hook_says(site, "mdb_env_set_mapsize");
    return rc ? rc : mdb_env_set_mapsize(env, size);
}

int kiln_mdb_env_open_at(MDB_env *env, const char *path, unsigned flags, mdb_mode_t mode,
                         const char *site)
{
    int rc = hook_says(site, "mdb_env_open");
    return rc ? rc : mdb_env_open(env, path, flags, mode);
}

int kiln_mdb_reader_check_at(MDB_env *env, int *dead, const char *site)
{
    int rc = hook_says(site, "mdb_reader_check");
    return rc ? rc : mdb_reader_check(env, dead);
}

int kiln_mdb_env_get_fd_at(MDB_env *env, mdb_filehandle_t *fd, const char *site)
{
    int rc = hook_says(site, "mdb_env_get_fd");
    return rc ? rc : mdb_env_get_fd(env, fd);
}

int kiln_mdb_env_info_at(MDB_env *env, MDB_envinfo *info, const char *site)
{
    int rc = hook_says(site, "mdb_env_info");
    return rc ? rc : mdb_env_info(env, info);
}

/* ------------------------------------------------------- transactions */

int kiln_mdb_txn_begin_at(MDB_env *env, MDB_txn *parent, unsigned flags, MDB_txn **txn,
                          const char *site)
{
    int rc = hook_says(site, "mdb_txn_begin");
    if (rc)
        return rc;
    if (!(rc = mdb_txn_begin(env, parent, flags, txn)) && mdb_hook)
        txn_track(*txn, flags & MDB_RDONLY);
    return rc;
}

int kiln_mdb_txn_commit_at(MDB_txn *txn, const char *site)
{
    bool failed_write = false;
    int rc = 0;
    if (mdb_hook) {
        txn_end(txn, &failed_write);
        rc = failed_write ? MDB_BAD_TXN : hook_says(site, "mdb_txn_commit");
    }
    if (!rc)
        return mdb_txn_commit(txn);
    mdb_txn_abort(txn);
    return rc;
}

void kiln_mdb_txn_abort(MDB_txn *txn)
{
    if (mdb_hook)
        txn_end(txn, NULL);
    mdb_txn_abort(txn);
}

/* ----------------------------------------------- calls in a transaction */

int kiln_mdb_dbi_open_at(MDB_txn *txn, const char *name, unsigned flags, MDB_dbi *dbi,
                         const char *site)
{
    int rc = txn_call(txn, site, "mdb_dbi_open");
    return rc ? rc : mdb_dbi_open(txn, name, flags, dbi);
}

int kiln_mdb_get_at(MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *val, const char *site)
{
    int rc = txn_call(txn, site, "mdb_get");
    return rc ? rc : mdb_get(txn, dbi, key, val);
}

int kiln_mdb_put_at(MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *val, unsigned flags,
                    const char *site)
{
    int rc = txn_call(txn, site, "mdb_put");
    return rc ? rc : mdb_put(txn, dbi, key, val, flags);
}

int kiln_mdb_stat_at(MDB_txn *txn, MDB_dbi dbi, MDB_stat *stat, const char *site)
{
    int rc = txn_call(txn, site, "mdb_stat");
    return rc ? rc : mdb_stat(txn, dbi, stat);
}

int kiln_mdb_drop_at(MDB_txn *txn, MDB_dbi dbi, int del, const char *site)
{
    int rc = txn_call(txn, site, "mdb_drop");
    return rc ? rc : mdb_drop(txn, dbi, del);
}

int kiln_mdb_cursor_open_at(MDB_txn *txn, MDB_dbi dbi, MDB_cursor **cur, const char *site)
{
    int rc = txn_call(txn, site, "mdb_cursor_open");
    return rc ? rc : mdb_cursor_open(txn, dbi, cur);
}

int kiln_mdb_cursor_get_at(MDB_cursor *cur, MDB_val *key, MDB_val *val, MDB_cursor_op op,
                           const char *site)
{
    int rc = txn_call(mdb_cursor_txn(cur), site, "mdb_cursor_get");
    return rc ? rc : mdb_cursor_get(cur, key, val, op);
}

int kiln_mdb_cursor_del_at(MDB_cursor *cur, unsigned flags, const char *site)
{
    int rc = txn_call(mdb_cursor_txn(cur), site, "mdb_cursor_del");
    return rc ? rc : mdb_cursor_del(cur, flags);
}
