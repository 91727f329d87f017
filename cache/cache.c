/* The LMDB side of the kernel cache: files, layers, lookups and stores. */
#include "cache/cache_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KILN_CACHE_DEFAULT_MAP ((size_t)64 << 20)

/* LMDB's codes are negative and errno values positive: the first are the
 * cache's own failures, the second the system's. */
kiln_status kiln_cache_mdb_fail(int rc, const char *path, const char *what)
{
    return kiln_fail(rc < 0 ? KILN_ERR_CACHE : KILN_ERR_IO, "%s: %s: %s (%d)", path, what,
                     mdb_strerror(rc), rc);
}

/* ------------------------------------------------------------ files */

/* Files with a lock file that this process has open. LMDB's locks are
 * fcntl() locks, which a process holds once per file: opening and closing
 * the same file a second time would drop the first handle's locks. */
static pthread_mutex_t open_files_lock = PTHREAD_MUTEX_INITIALIZER;
static kiln_cache_file *open_files;

void kiln_cache_file_close(kiln_cache_file *f)
{
    if (!f->env)
        return;
    if (f->locked) {
        pthread_mutex_lock(&open_files_lock);
        for (kiln_cache_file **p = &open_files; *p; p = &(*p)->next_open)
            if (*p == f) {
                *p = f->next_open;
                break;
            }
        pthread_mutex_unlock(&open_files_lock);
    }
    mdb_env_close(f->env);
    f->env = NULL;
}

static kiln_status file_env_open(kiln_cache_file *f, unsigned flags, size_t map_size)
{
    int rc = kiln_mdb_env_create(&f->env);
    if (rc)
        return kiln_cache_mdb_fail(rc, f->path, "create an LMDB environment");
    if (map_size)
        rc = kiln_mdb_env_set_mapsize(f->env, map_size);
    if (!rc)
        rc = kiln_mdb_env_open(f->env, f->path, flags | MDB_NOSUBDIR, 0644);
    if (!rc && !(flags & MDB_NOLOCK)) {
        int dead;
        rc = kiln_mdb_reader_check(f->env, &dead);
    }
    mdb_filehandle_t fd;
    struct stat st;
    if (!rc)
        rc = kiln_mdb_env_get_fd(f->env, &fd);
    if (!rc && fstat(fd, &st))
        rc = errno;
    if (rc) {
        mdb_env_close(f->env);
        f->env = NULL;
        return kiln_cache_mdb_fail(rc, f->path, "open");
    }
    f->dev = st.st_dev;
    f->ino = st.st_ino;
    return KILN_OK;
}

/* Begin a transaction. Another process may have grown the file past this
 * process's map; then LMDB says MDB_MAP_RESIZED and the map adopts the size
 * recorded in the file. */
kiln_status kiln_cache_file_begin(kiln_cache_file *f, unsigned flags, MDB_txn **txn,
                                  const char *what)
{
    if (f->damage)
        return kiln_fail(KILN_ERR_CACHE, "%s", f->damage);
    if (!f->env)
        return kiln_fail(KILN_ERR_STATE,
                         "%s: closed after its map could not grow; open the cache again",
                         f->path);
    int rc = kiln_mdb_txn_begin(f->env, NULL, flags, txn);
    for (int tries = 0; rc == MDB_MAP_RESIZED && tries < 8; tries++) {
        if ((rc = kiln_mdb_env_set_mapsize(f->env, 0))) {
            /* A failed remap leaves LMDB without a map: the file is unusable. */
            kiln_status st =
                kiln_cache_mdb_fail(rc, f->path, "adopt the map size another process set");
            kiln_cache_file_close(f);
            return st;
        }
        rc = kiln_mdb_txn_begin(f->env, NULL, flags, txn);
    }
    return rc ? kiln_cache_mdb_fail(rc, f->path, what) : KILN_OK;
}

/* The structural check of an existing file before LMDB maps it. A writable
 * file may be mid-commit in another process, which writes pages before the
 * meta page that names them: a failure is taken as damage only when it
 * repeats on a file that did not change meanwhile. */
static kiln_status file_check(const char *path, unsigned flags, kiln_cache_check *out)
{
    kiln_status st = kiln_cache_file_check(path, out);
    for (int tries = 0; st == KILN_ERR_CACHE && !(flags & MDB_NOLOCK) && tries < 3; tries++) {
        kiln_cache_check again;
        char first[1024];
        snprintf(first, sizeof first, "%s", kiln_last_error());
        st = kiln_cache_file_check(path, &again);
        if (st == KILN_ERR_CACHE && !strcmp(first, kiln_last_error()))
            break;
        *out = again;
    }
    return st;
}

kiln_status kiln_cache_file_open(kiln_cache_file *f, const char *path, unsigned flags,
                                 size_t map_size)
{
    struct stat st;
    kiln_cache_check chk = { 0 };
    f->path = kiln_strdup(path);
    if (!f->path)
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for the path", path);
    if (flags & MDB_RDONLY) {
        if (stat(path, &st))
            return kiln_fail(KILN_ERR_IO, "%s: %s", path, strerror(errno));
        if (!S_ISREG(st.st_mode))
            return kiln_fail(KILN_ERR_IO, "%s: not a regular file", path);
        if (st.st_size == 0)
            return kiln_fail(KILN_ERR_CACHE, "%s: damaged: an empty file, no kiln cache", path);
    }
    /* LMDB is handed only a file that passes (a missing writable file is
     * LMDB's to create). A read-only file is mapped at the size its pages
     * take, not the map size its meta page records. */
    kiln_status s = KILN_OK;
    if (!stat(path, &st) && (s = file_check(path, flags, &chk)) && !chk.not_lmdb)
        return s;
    s = KILN_OK;
    if ((flags & MDB_RDONLY) && chk.pages)
        map_size = (size_t)(chk.pages * chk.psize);
    f->locked = !(flags & MDB_NOLOCK);
    if (f->locked) {
        pthread_mutex_lock(&open_files_lock);
        if (!stat(path, &st))
            for (kiln_cache_file *o = open_files; o; o = o->next_open)
                if (o->pid == getpid() && o->dev == st.st_dev && o->ino == st.st_ino)
                    s = kiln_fail(KILN_ERR_STATE, "%s: this process has the cache open already",
                                  path);
    }
    if (!s)
        s = file_env_open(f, flags, map_size);
    if (f->locked) {
        if (!s) {
            f->pid = getpid();
            f->next_open = open_files;
            open_files = f;
        }
        pthread_mutex_unlock(&open_files_lock);
    }
    MDB_txn *txn;
    if (!s && !(s = kiln_cache_file_begin(f, MDB_RDONLY, &txn, "open the database"))) {
        int rc = kiln_mdb_dbi_open(txn, NULL, 0, &f->dbi);
        if (!rc)
            rc = kiln_mdb_txn_commit(txn);
        else
            kiln_mdb_txn_abort(txn);
        if (rc)
            s = kiln_cache_mdb_fail(rc, path, "open the database");
    }
    if (s)
        kiln_cache_file_close(f);
    return s;
}

/* Double the map. A failed resize leaves LMDB without a map: the file is
 * closed. */
static kiln_status file_grow(kiln_cache_file *f)
{
    MDB_envinfo info;
    int rc = kiln_mdb_env_info(f->env, &info);
    if (rc)
        return kiln_cache_mdb_fail(rc, f->path, "the map is full, and its size cannot be read");
    size_t next;
    rc = kiln_mul_size(info.me_mapsize, 2, &next) ? kiln_mdb_env_set_mapsize(f->env, next) : ENOMEM;
    if (!rc)
        return KILN_OK;
    kiln_fail(KILN_ERR_CACHE, "%s: the map is full at %zu bytes and cannot grow: %s (%d)", f->path,
              info.me_mapsize, mdb_strerror(rc), rc);
    kiln_cache_file_close(f);
    return KILN_ERR_CACHE;
}

kiln_status kiln_cache_file_write(kiln_cache_file *f, const char *what, kiln_cache_write_fn body,
                                  void *ctx)
{
    for (;;) {
        MDB_txn *txn;
        kiln_status st = kiln_cache_file_begin(f, 0, &txn, what);
        if (st)
            return st;
        int rc = 0;
        if (!(st = body(f, txn, ctx, &rc))) {
            if ((rc = kiln_mdb_txn_commit(txn)))
                st = kiln_cache_mdb_fail(rc, f->path, what);
        } else {
            kiln_mdb_txn_abort(txn);
        }
        if (rc != MDB_MAP_FULL)
            return st;
        if ((st = file_grow(f)))
            return st;
    }
}

/* Whether two intact records are one kernel: what a compiler of another
 * version would make of the same source under the same key. */
static bool same_kernel(const kiln_cache_record *a, const kiln_cache_record *b)
{
    return !strcmp(a->target, b->target) && !strcmp(a->entry, b->entry) &&
           !strcmp(a->signature, b->signature);
}

/* Another process storing the same key stored the same kernel, so
 * MDB_KEYEXIST is success. A corrupt record is replaced, and so is an
 * intact one of another kernel (a target or signature the key was not made
 * from), or the key would never heal. A record of another version is left
 * alone. */
kiln_status kiln_cache_file_put(kiln_cache_file *f, MDB_txn *txn, const uint8_t *key,
                                const void *val, size_t size, kiln_cache_put *result, int *rc_out)
{
    MDB_val k = { KILN_CACHE_KEY_BYTES, (void *)key }, v = { size, (void *)val };
    kiln_cache_record old, rec;
    int rc = kiln_mdb_put(txn, f->dbi, &k, &v, MDB_NOOVERWRITE);
    *result = KILN_CACHE_ADDED;
    if (rc == MDB_KEYEXIST) {
        kiln_status st = kiln_cache_record_decode(v.mv_data, v.mv_size, key, &old);
        if (st == KILN_ERR_UNSUPPORTED) {
            char hex[KILN_CACHE_KEY_HEX];
            kiln_cache_key_hex(key, hex);
            return kiln_fail(KILN_ERR_CACHE, "%s: key %s holds a record of version %u, which "
                             "this kiln leaves alone", f->path, hex, old.version);
        }
        if (st == KILN_OK && kiln_cache_record_decode(val, size, key, &rec) == KILN_OK &&
            same_kernel(&old, &rec)) {
            *result = KILN_CACHE_PRESENT;
            return KILN_OK;
        }
        v = (MDB_val){ size, (void *)val };
        rc = kiln_mdb_put(txn, f->dbi, &k, &v, 0);
        *result = KILN_CACHE_REPLACED;
    }
    return rc ? kiln_cache_body_fail(rc_out, rc, f, "store") : KILN_OK;
}

/* --------------------------------------------------------------- open */

kiln_status kiln_cache_default_path(char *buf, size_t size)
{
    if (!buf || !size)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kernel cache path: no buffer");
    kiln_env env;
    kiln_env_read(&env);
    const char *xdg = env.xdg_cache_home, *home = env.home;
    int n;
    if (env.cache)
        n = snprintf(buf, size, "%s", env.cache);
    else if (xdg && xdg[0] == '/')
        n = snprintf(buf, size, "%s/kiln/kernels.kiln", xdg);
    else if (home && home[0] == '/')
        n = snprintf(buf, size, "%s/.cache/kiln/kernels.kiln", home);
    else
        return kiln_fail(KILN_ERR_IO,
                         "no place for the kernel cache: set KILN_CACHE, XDG_CACHE_HOME or HOME");
    if (n < 0 || (size_t)n >= size)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kernel cache path: %d bytes do not fit in %zu", n,
                         size);
    return KILN_OK;
}

/* mkdir -p of the directories above path; the user's cache is private. */
static kiln_status make_parents(const char *path)
{
    char *dir = kiln_strdup(path);
    if (!dir)
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for the path", path);
    kiln_status st = KILN_OK;
    for (char *s = dir + 1; *s && !st; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(dir, 0700) && errno != EEXIST)
            st = kiln_fail(KILN_ERR_IO, "%s: cannot create directory %s: %s", path, dir,
                           strerror(errno));
        *s = '/';
    }
    free(dir);
    return st;
}

/* A layer whose file failed the structural check: kept in the list (its
 * path, its number) but never handed to LMDB, and reported. */
static kiln_status layer_damaged(kiln_cache *c, kiln_cache_file *f, kiln_status st)
{
    if (st != KILN_ERR_CACHE || !strstr(kiln_last_error(), ": damaged: "))
        return st;
    char *what = kiln_strdup(kiln_last_error());
    if (!what)
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for its damage report", f->path);
    f->damage = what;
    c->n_damaged++;
    if (c->on_corrupt) {
        char msg[1280];
        snprintf(msg, sizeof msg, "%s; the file is left out of the search and left as it is", what);
        c->on_corrupt(c->ctx, msg);
    }
    return KILN_OK;
}

kiln_status kiln_cache_open(const kiln_cache_options *opts, kiln_cache **out)
{
    kiln_cache_options o = opts ? *opts : (kiln_cache_options){ 0 };
    if (!out || o.n_shipped < 0 || (o.n_shipped && !o.shipped))
        return kiln_fail(KILN_ERR_INVALID_ARG, "cache open: bad options");
    for (int i = 0; i < o.n_shipped; i++)
        if (!o.shipped[i])
            return kiln_fail(KILN_ERR_INVALID_ARG, "cache open: shipped cache %d is NULL", i);
    kiln_cache *c = kiln_calloc(1, sizeof *c);
    if (c)
        c->files = kiln_calloc((size_t)o.n_shipped + 1, sizeof *c->files);
    if (!c || !c->files) {
        free(c);
        return kiln_fail(KILN_ERR_NOMEM, "cache open: out of memory");
    }
    c->writable = -1;
    c->on_corrupt = o.on_corrupt;
    c->ctx = o.ctx;
    kiln_status st = KILN_OK;
    for (int i = 0; i < o.n_shipped && !st; i++) {
        st = kiln_cache_file_open(&c->files[i], o.shipped[i], MDB_RDONLY | MDB_NOLOCK, 0);
        c->n_files++;
        if (st && !o.strict)
            st = layer_damaged(c, &c->files[i], st);
    }
    char fallback[4096];
    const char *path = o.path ? o.path : fallback;
    if (!st && !o.no_writable) {
        if (!o.path)
            st = kiln_cache_default_path(fallback, sizeof fallback);
        if (!st)
            st = make_parents(path);
        if (!st) {
            kiln_cache_file *f = &c->files[c->n_files];
            st = kiln_cache_file_open(f, path, 0, o.map_size ? o.map_size : KILN_CACHE_DEFAULT_MAP);
            c->writable = c->n_files++;
            if (st && !o.strict)
                st = layer_damaged(c, f, st);
        }
    }
    if (st) {
        kiln_cache_close(c);
        return st;
    }
    *out = c;
    return KILN_OK;
}

void kiln_cache_close(kiln_cache *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n_files; i++) {
        kiln_cache_file_close(&c->files[i]);
        free(c->files[i].path);
        free(c->files[i].damage);
        free(c->files[i].manifest);
    }
    free(c->files);
    free(c);
}

int kiln_cache_n_layers(const kiln_cache *c) { return c->n_files; }

const char *kiln_cache_layer_path(const kiln_cache *c, int layer)
{
    return layer >= 0 && layer < c->n_files ? c->files[layer].path : NULL;
}

int kiln_cache_writable_layer(const kiln_cache *c)
{
    return c->writable >= 0 && !c->files[c->writable].damage ? c->writable : -1;
}

const char *kiln_cache_layer_damage(const kiln_cache *c, int layer)
{
    return layer >= 0 && layer < c->n_files ? c->files[layer].damage : NULL;
}

size_t kiln_cache_corrupt_seen(const kiln_cache *c) { return c->corrupt_seen; }

kiln_status kiln_cache_writable_file(kiln_cache *c, const char *what, kiln_cache_file **out)
{
    if (!c)
        return kiln_fail(KILN_ERR_INVALID_ARG, "cache %s: no cache (NULL)", what);
    if (c->writable < 0)
        return kiln_fail(KILN_ERR_STATE, "cache %s: no writable cache is open", what);
    if (c->files[c->writable].damage)
        return kiln_fail(KILN_ERR_CACHE,
                         "cache %s: %s; `kiln cache salvage` copies its intact records to a new file",
                         what, c->files[c->writable].damage);
    *out = &c->files[c->writable];
    return KILN_OK;
}

/* ------------------------------------------------------ lookup, store */

/* A private copy of key's value in f, or *blob NULL when f has none. The
 * copy outlives the transaction, after which the page may be reused. */
static kiln_status file_get(kiln_cache_file *f, const uint8_t *key, void **blob, size_t *size)
{
    MDB_txn *txn;
    kiln_status st = kiln_cache_file_begin(f, MDB_RDONLY, &txn, "lookup");
    if (st)
        return st;
    MDB_val k = { KILN_CACHE_KEY_BYTES, (void *)key }, v;
    int rc = kiln_mdb_get(txn, f->dbi, &k, &v);
    *blob = NULL;
    if (!rc) {
        *blob = kiln_malloc(v.mv_size ? v.mv_size : 1);
        if (*blob) {
            memcpy(*blob, v.mv_data, v.mv_size);
            *size = v.mv_size;
        } else {
            st = kiln_fail(KILN_ERR_NOMEM, "%s: lookup: out of memory for %zu bytes", f->path,
                           v.mv_size);
        }
    } else if (rc != MDB_NOTFOUND) {
        st = kiln_cache_mdb_fail(rc, f->path, "lookup");
    }
    kiln_mdb_txn_abort(txn);
    return st;
}

kiln_status kiln_cache_lookup(kiln_cache *c, const uint8_t key[KILN_CACHE_KEY_BYTES],
                              const char *target, kiln_cache_hit *out)
{
    char hex[KILN_CACHE_KEY_HEX], passed[512] = "";
    kiln_cache_key_hex(key, hex);
    for (int i = 0; i < c->n_files; i++) {
        void *blob;
        size_t size;
        kiln_cache_record rec;
        if (c->files[i].damage)
            continue;
        kiln_status st = file_get(&c->files[i], key, &blob, &size);
        if (st)
            return st;
        if (!blob)
            continue;
        st = kiln_cache_record_decode(blob, size, key, &rec);
        if (!st && target && strcmp(rec.target, target))
            st = kiln_fail(KILN_ERR_CACHE, "a record of \"%s\" for %s, asked for %s", rec.signature,
                           rec.target, target);
        if (st) {
            free(blob);
            kiln_fail_prefix(st, "%s: key %s", c->files[i].path, hex);
            snprintf(passed, sizeof passed, "%s", kiln_last_error());
            if (st == KILN_ERR_CACHE)
                c->corrupt_seen++;
            if (c->on_corrupt)
                c->on_corrupt(c->ctx, passed);
            continue;
        }
        *out = (kiln_cache_hit){ .rec = rec, .layer = i, .blob = blob, .size = size };
        return KILN_OK;
    }
    if (passed[0])
        return kiln_fail(KILN_ERR_NOT_FOUND, "kernel %s: no intact record (passed over %s)", hex,
                         passed);
    return kiln_fail(KILN_ERR_NOT_FOUND, "kernel %s is not cached (%d cache files searched)",
                     hex, c->n_files);
}

void kiln_cache_hit_release(kiln_cache_hit *h)
{
    if (!h)
        return;
    free(h->blob);
    h->blob = NULL;
}

typedef struct store_ctx {
    const uint8_t *key;
    const uint8_t *val;
    size_t size;
    kiln_cache_put result;
} store_ctx;

static kiln_status store_body(kiln_cache_file *f, MDB_txn *txn, void *ctx, int *rc)
{
    store_ctx *s = ctx;
    return kiln_cache_file_put(f, txn, s->key, s->val, s->size, &s->result, rc);
}

kiln_status kiln_cache_store(kiln_cache *c, const uint8_t key[KILN_CACHE_KEY_BYTES],
                             const kiln_cache_record *rec, kiln_cache_put *result)
{
    kiln_cache_file *f = NULL;
    kiln_status st = kiln_cache_writable_file(c, "store", &f);
    if (st)
        return st;
    kiln_cache_record r = *rec;
    if (!r.created)
        r.created = (uint64_t)time(NULL);
    store_ctx s = { .key = key };
    uint8_t *val;
    if ((st = kiln_cache_record_encode(&r, key, &val, &s.size)))
        return st;
    s.val = val;
    st = kiln_cache_file_write(f, "store", store_body, &s);
    free(val);
    if (!st && result)
        *result = s.result;
    return st;
}

kiln_status kiln_cache_offline_miss(const kiln_cache *c, const char *signature,
                                    const uint8_t key[KILN_CACHE_KEY_BYTES])
{
    char hex[KILN_CACHE_KEY_HEX], searched[768] = "none", damaged[1536] = "";
    kiln_cache_key_hex(key, hex);
    size_t used = 0, dused = 0;
    for (int i = 0; c && i < c->n_files; i++) {
        const kiln_cache_file *f = &c->files[i];
        if (f->damage && dused < sizeof damaged) {
            int n = snprintf(damaged + dused, sizeof damaged - dused, "%s%s", dused ? "; " : "",
                             f->damage);
            dused += n > 0 ? (size_t)n : 0;
            continue;
        }
        if (used >= sizeof searched)
            continue;
        int n = snprintf(searched + used, sizeof searched - used, "%s%s", used ? ", " : "", f->path);
        used += n > 0 ? (size_t)n : 0;
    }
    /* A damaged file may well hold the kernel: the error is the file's. */
    if (dused)
        return kiln_fail(KILN_ERR_CACHE,
                         "offline, and kernel \"%s\" (key %s) is in no intact cache (searched: %s); "
                         "damaged, so left out: %s",
                         signature, hex, searched, damaged);
    return kiln_fail(KILN_ERR_OFFLINE_MISS,
                     "offline, and kernel \"%s\" (key %s) is in no cache (searched: %s); "
                     "compile it ahead of time with `kiln compile` and ship the cache",
                     signature, hex, searched);
}
