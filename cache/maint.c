/* What `kiln cache` runs on a cache: iteration, verify, stat, gc, rm,
 * merge and export. */
#include "cache/cache_impl.h"
#include "core/tuning.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static kiln_status layer_file(kiln_cache *c, int layer, kiln_cache_file **out)
{
    if (!c)
        return kiln_fail(KILN_ERR_INVALID_ARG, "cache layer %d: no cache (NULL)", layer);
    if (layer < 0 || layer >= c->n_files)
        return kiln_fail(KILN_ERR_INVALID_ARG, "cache layer %d: there are %d", layer,
                         c->n_files);
    *out = &c->files[layer];
    return KILN_OK;
}

/* ------------------------------------------------------- iteration */

/* Fill e from one stored pair; problem says what is wrong with it. */
static void entry_check(const kiln_cache_file *f, const MDB_val *k, const MDB_val *v,
                        kiln_cache_entry *e)
{
    char hex[KILN_CACHE_KEY_HEX];
    e->key_size = k->mv_size;
    e->size = v->mv_size;
    e->problem = "";
    if (k->mv_size != KILN_CACHE_KEY_BYTES) {
        e->status = kiln_fail(KILN_ERR_CACHE, "%s: a key of %zu bytes is not a kiln key",
                              f->path, k->mv_size);
    } else {
        memcpy(e->key, k->mv_data, KILN_CACHE_KEY_BYTES);
        kiln_cache_key_hex(e->key, hex);
        if ((e->status = kiln_cache_record_decode(v->mv_data, v->mv_size, e->key, &e->rec)))
            kiln_fail_prefix(e->status, "%s: key %s", f->path, hex);
    }
    if (e->status)
        e->problem = kiln_last_error();
}

static kiln_status file_foreach(kiln_cache_file *f, int layer, kiln_cache_visit_fn fn, void *ctx)
{
    MDB_txn *txn;
    MDB_cursor *cur;
    kiln_status st = kiln_cache_file_begin(f, MDB_RDONLY, &txn, "read");
    if (st)
        return st;
    int rc = kiln_mdb_cursor_open(txn, f->dbi, &cur);
    if (rc) {
        kiln_mdb_txn_abort(txn);
        return kiln_cache_mdb_fail(rc, f->path, "read");
    }
    MDB_val k, v;
    while (!st && !(rc = kiln_mdb_cursor_get(cur, &k, &v, MDB_NEXT))) {
        if (kiln_cache_is_named(&k))
            continue;
        kiln_cache_entry e = { .layer = layer };
        entry_check(f, &k, &v, &e);
        st = fn(ctx, &e);
    }
    if (!st && rc != MDB_NOTFOUND)
        st = kiln_cache_mdb_fail(rc, f->path, "read");
    mdb_cursor_close(cur);
    kiln_mdb_txn_abort(txn);
    return st;
}

kiln_status kiln_cache_foreach(kiln_cache *c, int layer, kiln_cache_visit_fn fn, void *ctx)
{
    if (!fn)
        return kiln_fail(KILN_ERR_INVALID_ARG, "cache layer %d: no visitor (NULL)", layer);
    kiln_cache_file *f = NULL;
    kiln_status st = layer_file(c, layer, &f);
    return st ? st : file_foreach(f, layer, fn, ctx);
}

typedef struct verify_ctx {
    kiln_cache_visit_fn on_bad;
    void *ctx;
    size_t entries, bad;
} verify_ctx;

static kiln_status verify_visit(void *ctx, const kiln_cache_entry *e)
{
    verify_ctx *v = ctx;
    v->entries++;
    if (e->status != KILN_ERR_CACHE)
        return KILN_OK;
    v->bad++;
    return v->on_bad ? v->on_bad(v->ctx, e) : KILN_OK;
}

kiln_status kiln_cache_verify(kiln_cache *c, int layer, kiln_cache_visit_fn on_bad, void *ctx,
                              size_t *n_entries, size_t *n_bad)
{
    verify_ctx v = { .on_bad = on_bad, .ctx = ctx };
    kiln_status st = kiln_cache_foreach(c, layer, verify_visit, &v);
    if (st)
        return st;
    if (n_entries)
        *n_entries = v.entries;
    if (n_bad)
        *n_bad = v.bad;
    return KILN_OK;
}

static kiln_status tally_add(kiln_cache_tally **t, int *n, const char *name, uint64_t bytes)
{
    int i = 0;
    while (i < *n && strcmp((*t)[i].name, name))
        i++;
    if (i == *n) {
        kiln_cache_tally *grown = kiln_realloc(*t, (size_t)(*n + 1) * sizeof *grown);
        if (!grown)
            return kiln_fail(KILN_ERR_NOMEM, "cache stat: out of memory for the tallies");
        *t = grown;
        grown[i] = (kiln_cache_tally){ .name = kiln_strdup(name) };
        if (!grown[i].name)
            return kiln_fail(KILN_ERR_NOMEM, "cache stat: out of memory for the tallies");
        (*n)++;
    }
    (*t)[i].entries++;
    (*t)[i].bytes += bytes;
    return KILN_OK;
}

static kiln_status stat_visit(void *ctx, const kiln_cache_entry *e)
{
    kiln_cache_stats *s = ctx;
    s->entries++;
    s->bytes += e->size;
    if (e->status == KILN_ERR_UNSUPPORTED)
        s->other_versions++;
    if (e->status == KILN_ERR_CACHE)
        s->bad++;
    if (e->status)
        return KILN_OK;
    s->cubin_bytes += e->rec.cubin_size;
    if (!s->oldest || e->rec.created < s->oldest)
        s->oldest = e->rec.created;
    if (e->rec.created > s->newest)
        s->newest = e->rec.created;
    kiln_status st = tally_add(&s->by_target, &s->n_targets, e->rec.target, e->size);
    return st ? st : tally_add(&s->by_kind, &s->n_kinds, e->rec.kind, e->size);
}

kiln_status kiln_cache_stat(kiln_cache *c, int layer, kiln_cache_stats *out)
{
    if (!out)
        return kiln_fail(KILN_ERR_INVALID_ARG, "cache stat: out is NULL");
    kiln_cache_stats s = { 0 };
    kiln_status st = kiln_cache_foreach(c, layer, stat_visit, &s);
    if (st) {
        kiln_cache_stats_free(&s);
        return st;
    }
    const kiln_cache_file *f = &c->files[layer];
    MDB_envinfo info;
    struct stat fs;
    int rc = kiln_mdb_env_info(f->env, &info);
    if (rc) {
        kiln_cache_stats_free(&s);
        return kiln_cache_mdb_fail(rc, f->path, "stat");
    }
    s.map_bytes = info.me_mapsize;
    if (!stat(f->path, &fs))
        s.file_bytes = (uint64_t)fs.st_size;
    *out = s;
    return KILN_OK;
}

void kiln_cache_stats_free(kiln_cache_stats *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_targets; i++)
        free(s->by_target[i].name);
    for (int i = 0; i < s->n_kinds; i++)
        free(s->by_kind[i].name);
    free(s->by_target);
    free(s->by_kind);
    *s = (kiln_cache_stats){ 0 };
}

/* -------------------------------------------------------- gc, rm */

typedef struct gc_ctx {
    const kiln_cache_gc_options *o;
    int layer;
    uint64_t now;
    size_t removed;
    uint64_t bytes;
} gc_ctx;

static bool gc_drops(const gc_ctx *g, const kiln_cache_entry *e)
{
    const kiln_cache_record *r = &e->rec;
    if (e->status == KILN_ERR_UNSUPPORTED)
        return g->o->version && r->version == g->o->version;
    if (e->status)
        return g->o->corrupt;
    if (g->o->version == KILN_CACHE_RECORD_VERSION)
        return true;
    if (g->o->compiler && strcmp(r->compiler, g->o->compiler))
        return true;
    return g->o->max_age_s && g->now > r->created && g->now - r->created > g->o->max_age_s;
}

/* One entry gc removes, or would remove on a dry run: counted, and shown
 * to on_remove, whose refusal ends the gc with nothing removed. */
static kiln_status gc_take(gc_ctx *g, const kiln_cache_entry *e)
{
    if (!gc_drops(g, e))
        return KILN_OK;
    g->removed++;
    g->bytes += e->size;
    return g->o->on_remove ? g->o->on_remove(g->o->ctx, e) : KILN_OK;
}

static kiln_status gc_visit(void *ctx, const kiln_cache_entry *e)
{
    return gc_take(ctx, e);
}

static kiln_status gc_body(kiln_cache_file *f, MDB_txn *txn, void *ctx, int *rc_out)
{
    gc_ctx *g = ctx;
    MDB_cursor *cur;
    MDB_val k, v;
    g->removed = 0;
    g->bytes = 0;
    int rc = kiln_mdb_cursor_open(txn, f->dbi, &cur);
    if (rc)
        return kiln_cache_body_fail(rc_out, rc, f, "gc");
    kiln_status st = KILN_OK;
    while (!(rc = kiln_mdb_cursor_get(cur, &k, &v, MDB_NEXT))) {
        if (kiln_cache_is_named(&k))
            continue;
        kiln_cache_entry e = { .layer = g->layer };
        entry_check(f, &k, &v, &e);
        size_t before = g->removed;
        if ((st = gc_take(g, &e)))
            break;
        if (g->removed != before && (rc = kiln_mdb_cursor_del(cur, 0)))
            break;
    }
    mdb_cursor_close(cur);
    if (st)
        return st;
    return rc == MDB_NOTFOUND ? KILN_OK : kiln_cache_body_fail(rc_out, rc, f, "gc");
}

kiln_status kiln_cache_gc(kiln_cache *c, const kiln_cache_gc_options *o, size_t *removed,
                          uint64_t *bytes)
{
    if (!o)
        return kiln_fail(KILN_ERR_INVALID_ARG, "cache gc: no options (NULL): what to remove?");
    kiln_cache_file *f = NULL;
    kiln_status st = kiln_cache_writable_file(c, "gc", &f);
    if (st)
        return st;
    gc_ctx g = { .o = o, .layer = c->writable, .now = (uint64_t)time(NULL) };
    st = o->dry_run ? file_foreach(f, c->writable, gc_visit, &g)
                    : kiln_cache_file_write(f, "gc", gc_body, &g);
    if (st)
        return st;
    if (removed)
        *removed = g.removed;
    if (bytes)
        *bytes = g.bytes;
    return KILN_OK;
}

typedef struct rm_ctx {
    uint8_t prefix[KILN_CACHE_KEY_BYTES];
    int nibbles; /* 0: every key */
    size_t removed;
} rm_ctx;

static bool rm_matches(const rm_ctx *r, const MDB_val *k)
{
    const uint8_t *key = k->mv_data;
    int whole = r->nibbles / 2;
    if (k->mv_size * 2 < (size_t)r->nibbles || memcmp(key, r->prefix, (size_t)whole))
        return false;
    return r->nibbles % 2 == 0 || (key[whole] >> 4) == (r->prefix[whole] >> 4);
}

/* Keys sort bytewise, so those with a prefix are one run from the first key
 * at or after it. */
static kiln_status rm_body(kiln_cache_file *f, MDB_txn *txn, void *ctx, int *rc_out)
{
    rm_ctx *r = ctx;
    MDB_cursor *cur;
    MDB_stat ms;
    r->removed = 0;
    int rc;
    if (!r->nibbles) {
        if (!(rc = kiln_mdb_stat(txn, f->dbi, &ms)) && !(rc = kiln_mdb_drop(txn, f->dbi, 0)))
            r->removed = ms.ms_entries;
        return rc ? kiln_cache_body_fail(rc_out, rc, f, "rm") : KILN_OK;
    }
    if ((rc = kiln_mdb_cursor_open(txn, f->dbi, &cur)))
        return kiln_cache_body_fail(rc_out, rc, f, "rm");
    MDB_val k = { (size_t)(r->nibbles + 1) / 2, r->prefix }, v;
    rc = kiln_mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
    while (!rc && rm_matches(r, &k)) {
        if ((rc = kiln_mdb_cursor_del(cur, 0)))
            break;
        r->removed++;
        rc = kiln_mdb_cursor_get(cur, &k, &v, MDB_NEXT);
    }
    mdb_cursor_close(cur);
    return rc && rc != MDB_NOTFOUND ? kiln_cache_body_fail(rc_out, rc, f, "rm") : KILN_OK;
}

static kiln_status rm_run(kiln_cache *c, rm_ctx *r, size_t *removed)
{
    kiln_cache_file *f = NULL;
    kiln_status st = kiln_cache_writable_file(c, "rm", &f);
    if (!st)
        st = kiln_cache_file_write(f, "rm", rm_body, r);
    if (!st && removed)
        *removed = r->removed;
    return st;
}

kiln_status kiln_cache_rm(kiln_cache *c, const char *hex_prefix, size_t *removed)
{
    rm_ctx r = { 0 };
    kiln_status st = kiln_cache_key_parse(hex_prefix, r.prefix, &r.nibbles);
    return st ? st : rm_run(c, &r, removed);
}

kiln_status kiln_cache_rm_all(kiln_cache *c, size_t *removed)
{
    rm_ctx r = { 0 };
    return rm_run(c, &r, removed);
}

/* ------------------------------------------------------ merge, export */

typedef struct merge_ctx {
    kiln_cache_file *src;
    kiln_tuning *tuning; /* the source's tuning table */
    kiln_cache_merge_result res;
} merge_ctx;

static kiln_status merge_body(kiln_cache_file *f, MDB_txn *txn, void *ctx, int *rc_out)
{
    merge_ctx *m = ctx;
    MDB_txn *stxn;
    MDB_cursor *cur;
    MDB_val k, v;
    kiln_cache_record r;
    kiln_cache_put put;
    size_t *const count[] = {
        [KILN_CACHE_ADDED] = &m->res.added,
        [KILN_CACHE_PRESENT] = &m->res.present,
        [KILN_CACHE_REPLACED] = &m->res.replaced,
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(count); i++)
        *count[i] = 0;
    kiln_status st = kiln_cache_file_begin(m->src, MDB_RDONLY, &stxn, "merge");
    if (st)
        return st;
    int rc = kiln_mdb_cursor_open(stxn, m->src->dbi, &cur);
    if (rc) {
        kiln_mdb_txn_abort(stxn);
        return kiln_cache_mdb_fail(rc, m->src->path, "merge");
    }
    m->res.other = 0;
    while (!st && !(rc = kiln_mdb_cursor_get(cur, &k, &v, MDB_NEXT))) {
        kiln_status rs = k.mv_size != KILN_CACHE_KEY_BYTES
                             ? KILN_ERR_CACHE
                             : kiln_cache_record_decode(v.mv_data, v.mv_size, k.mv_data, &r);
        m->res.other += rs == KILN_ERR_UNSUPPORTED;
        if (rs)
            continue;
        if (!(st = kiln_cache_file_put(f, txn, k.mv_data, v.mv_data, v.mv_size, &put, rc_out)))
            (*count[put])++;
    }
    if (!st && rc != MDB_NOTFOUND)
        st = kiln_cache_mdb_fail(rc, m->src->path, "merge");
    mdb_cursor_close(cur);
    kiln_mdb_txn_abort(stxn);
    /* the source's tuning entries the writable cache does not hold */
    if (!st && kiln_tuning_n(m->tuning))
        st = kiln_cache_tuning_put(f, txn, m->tuning, 0, rc_out);
    return st;
}

kiln_status kiln_cache_merge(kiln_cache *c, const char *src, kiln_cache_visit_fn on_bad,
                             void *ctx, kiln_cache_merge_result *out)
{
    if (!src)
        return kiln_fail(KILN_ERR_INVALID_ARG, "cache merge: no source file (NULL)");
    kiln_cache_file *f, s = { 0 };
    kiln_status st = kiln_cache_writable_file(c, "merge", &f);
    if (st)
        return st;
    if (!(st = kiln_cache_file_open(&s, src, MDB_RDONLY | MDB_NOLOCK, 0)) && s.dev == f->dev &&
        s.ino == f->ino)
        st = kiln_fail(KILN_ERR_INVALID_ARG, "merge %s: it is the writable cache itself", src);
    /* Bad source records are reported by a pass of their own, because the
     * copy below may run more than once. */
    verify_ctx v = { .on_bad = on_bad, .ctx = ctx };
    merge_ctx m = { .src = &s };
    if (!st)
        st = file_foreach(&s, -1, verify_visit, &v);
    /* A damaged tuning table is left out as a bad record is. */
    if (!st && !(st = kiln_tuning_create(&m.tuning)) &&
        (st = kiln_cache_file_tuning(&s, m.tuning)) == KILN_ERR_MALFORMED) {
        v.bad++;
        if (on_bad)
            on_bad(ctx, &(kiln_cache_entry){ .layer = -1, .status = KILN_ERR_CACHE,
                                             .problem = kiln_last_error() });
        kiln_clear_error();
        st = KILN_OK;
    }
    if (!st)
        st = kiln_cache_file_write(f, "merge", merge_body, &m);
    kiln_tuning_destroy(m.tuning);
    kiln_cache_file_close(&s);
    free(s.path);
    if (!st && out) {
        *out = m.res;
        out->bad = v.bad;
    }
    return st;
}

typedef struct export_ctx {
    kiln_cache *c;
    const uint8_t (*keys)[KILN_CACHE_KEY_BYTES];
    size_t n_keys;
    const char *manifest;
    const kiln_tuning *tuning;
} export_ctx;

static kiln_status export_body(kiln_cache_file *f, MDB_txn *txn, void *ctx, int *rc_out)
{
    export_ctx *x = ctx;
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < x->n_keys && !st; i++) {
        kiln_cache_hit hit;
        kiln_cache_put put;
        if ((st = kiln_cache_lookup(x->c, x->keys[i], NULL, &hit)))
            return st;
        st = kiln_cache_file_put(f, txn, x->keys[i], hit.blob, hit.size, &put, rc_out);
        kiln_cache_hit_release(&hit);
    }
    if (!st && x->manifest)
        st = kiln_cache_manifest_put(f, txn, x->manifest, rc_out);
    if (!st)
        st = kiln_cache_tuning_put(f, txn, x->tuning, 1, rc_out);
    return st;
}

/* Write a new cache file at path through body: written beside path, then
 * renamed into place, so a failure leaves no file behind. map is the
 * initial map size. */
static kiln_status new_file_write(const char *path, int overwrite, size_t map, const char *what,
                                  kiln_cache_write_fn body, void *ctx)
{
    struct stat fs;
    if (!overwrite && !lstat(path, &fs))
        return kiln_fail(KILN_ERR_IO, "%s exists; %s replaces a file only when asked to", path,
                         what);
    /* Only a regular file is replaced: renaming over a device node or a
     * link would destroy what the name stood for. */
    if (overwrite && !lstat(path, &fs) && !S_ISREG(fs.st_mode))
        return kiln_fail(KILN_ERR_IO, "%s is not a regular file; %s replaces only a regular file",
                         path, what);
    size_t len = strlen(path);
    char *tmp = kiln_malloc(len + sizeof ".XXXXXX");
    if (!tmp)
        return kiln_fail(KILN_ERR_NOMEM, "%s to %s: out of memory", what, path);
    memcpy(tmp, path, len);
    memcpy(tmp + len, ".XXXXXX", sizeof ".XXXXXX");
    int fd = mkstemp(tmp);
    if (fd < 0) {
        kiln_status st = kiln_fail(KILN_ERR_IO, "%s to %s: cannot create a file beside it: %s",
                                   what, path, strerror(errno));
        free(tmp);
        return st;
    }
    /* A shipped cache is read by the service's user, not only the builder. */
    (void)fchmod(fd, 0644);
    close(fd);
    /* The new file is this process's alone until it is renamed into place:
     * no lock file. */
    kiln_cache_file out = { 0 };
    kiln_status st = kiln_cache_file_open(&out, tmp, MDB_NOLOCK, map);
    if (!st)
        st = kiln_cache_file_write(&out, what, body, ctx);
    kiln_cache_file_close(&out);
    /* The temporary name is gone with the file: name the one asked for. */
    if (st)
        kiln_fail_prefix(st, "%s to %s", what, path);
    /* link() refuses an existing name atomically, which rename() would
     * replace; either way the temporary name goes. */
    if (!st && (overwrite ? rename(tmp, path) : link(tmp, path)))
        st = kiln_fail(KILN_ERR_IO, "%s to %s: %s", what, path, strerror(errno));
    unlink(tmp);
    free(out.path);
    free(tmp);
    return st;
}

kiln_status kiln_cache_export_keys(kiln_cache *c, const uint8_t (*keys)[KILN_CACHE_KEY_BYTES],
                                   size_t n_keys, const char *path, int overwrite,
                                   const char *manifest, const kiln_tuning *tuning)
{
    /* The new file must not replace a file this process has mapped. Room
     * for everything the layers hold means the map rarely has to grow,
     * which would run every lookup again. */
    struct stat fs, ps;
    size_t map = (size_t)1 << 20;
    bool exists = !stat(path, &ps);
    for (int i = 0; i < c->n_files; i++) {
        if (stat(c->files[i].path, &fs))
            continue;
        if (exists && fs.st_dev == ps.st_dev && fs.st_ino == ps.st_ino)
            return kiln_fail(KILN_ERR_INVALID_ARG, "%s is the %s cache %s, which export reads",
                             path, i == c->writable ? "writable" : "shipped", c->files[i].path);
        map += (size_t)fs.st_size;
    }
    export_ctx x = { .c = c, .keys = keys, .n_keys = n_keys, .manifest = manifest,
                     .tuning = tuning };
    return new_file_write(path, overwrite, map, "export", export_body, &x);
}

/* ------------------------------------------------------------ salvage */

typedef struct salvage_ctx {
    const char *src;
    kiln_cache_file *f;
    MDB_txn *txn;
    int *rc_out;
    kiln_cache_salvage_result res;
} salvage_ctx;

/* A named value the scan found (a manifest, a tuning table): the first
 * intact one of its key is kept. A damaged one, or a second that differs
 * from it (a stale copy on a freed page), is counted bad; an identical
 * copy is a duplicate. */
static kiln_status salvage_named(salvage_ctx *x, const uint8_t *key, size_t key_size,
                                 const uint8_t *val, size_t size)
{
    if (kiln_cache_named_check(x->src, key, key_size, val, size)) {
        kiln_clear_error();
        x->res.bad++;
        return KILN_OK;
    }
    MDB_val k = { key_size, (void *)key }, v = { size, (void *)val };
    int rc = kiln_mdb_put(x->txn, x->f->dbi, &k, &v, MDB_NOOVERWRITE);
    if (rc == MDB_KEYEXIST) {
        if (v.mv_size == size && !memcmp(v.mv_data, val, size))
            x->res.duplicates++;
        else
            x->res.bad++;
        return KILN_OK;
    }
    if (!rc && key_size == strlen(KILN_CACHE_TUNING_KEY))
        x->res.tuning = 1;
    else if (!rc)
        x->res.manifest = 1;
    return rc ? kiln_cache_body_fail(x->rc_out, rc, x->f, "salvage") : KILN_OK;
}

/* One pair the scan found: kept when it is an intact record, of this
 * version or a readable older one; of two intact records under one key
 * (a stale copy on a freed page, say), the later made. */
static kiln_status salvage_pair(void *ctx, const uint8_t *key, size_t key_size,
                                const uint8_t *val, size_t size)
{
    salvage_ctx *x = ctx;
    if (key_size != KILN_CACHE_KEY_BYTES)
        return salvage_named(x, key, key_size, val, size);
    kiln_cache_record r, old;
    kiln_status st = kiln_cache_record_decode(val, size, key, &r);
    if (st == KILN_ERR_UNSUPPORTED && !r.signature) {
        x->res.other++;
        return KILN_OK;
    }
    if (st && st != KILN_ERR_UNSUPPORTED) {
        x->res.bad++;
        return KILN_OK;
    }
    MDB_val k = { KILN_CACHE_KEY_BYTES, (void *)key }, v = { size, (void *)val };
    int rc = kiln_mdb_put(x->txn, x->f->dbi, &k, &v, MDB_NOOVERWRITE);
    if (rc == MDB_KEYEXIST) {
        x->res.duplicates++;
        kiln_status ost = kiln_cache_record_decode(v.mv_data, v.mv_size, key, &old);
        if ((ost != KILN_OK && ost != KILN_ERR_UNSUPPORTED) || old.created >= r.created)
            return KILN_OK;
        v = (MDB_val){ size, (void *)val };
        rc = kiln_mdb_put(x->txn, x->f->dbi, &k, &v, 0);
    } else if (!rc) {
        x->res.records++;
    }
    return rc ? kiln_cache_body_fail(x->rc_out, rc, x->f, "salvage") : KILN_OK;
}

static kiln_status salvage_body(kiln_cache_file *f, MDB_txn *txn, void *ctx, int *rc_out)
{
    salvage_ctx *x = ctx;
    x->f = f;
    x->txn = txn;
    x->rc_out = rc_out;
    x->res = (kiln_cache_salvage_result){ 0 };
    return kiln_cache_file_scan(x->src, salvage_pair, x);
}

kiln_status kiln_cache_salvage(const char *src, const char *dst, int overwrite,
                               kiln_cache_salvage_result *out)
{
    if (!src || !dst)
        return kiln_fail(KILN_ERR_INVALID_ARG, "salvage: no %s file (NULL)",
                         !src ? "source" : "output");
    struct stat ss, ds;
    if (stat(src, &ss))
        return kiln_fail(KILN_ERR_IO, "salvage %s: %s", src, strerror(errno));
    if (!S_ISREG(ss.st_mode))
        return kiln_fail(KILN_ERR_IO, "salvage %s: not a regular file", src);
    if (!stat(dst, &ds) && ds.st_dev == ss.st_dev && ds.st_ino == ss.st_ino)
        return kiln_fail(KILN_ERR_INVALID_ARG, "salvage %s: the output is the file itself", src);
    salvage_ctx x = { .src = src };
    kiln_status st = new_file_write(dst, overwrite, (size_t)ss.st_size + ((size_t)1 << 20),
                                    "salvage", salvage_body, &x);
    if (!st && out)
        *out = x.res;
    return st;
}
