/* The LMDB sweep (tests/util/fault.h) over the kernel cache: every LMDB
 * call each operation reaches, failed in turn with a full map, a full
 * disk, an I/O error and a full reader table (a commit that fails so is a
 * failed commit), on a fresh copy of a seeded cache. The operations: open
 * of a shipped and a writable cache, store, lookup, ls, verify, stat, gc,
 * rm, rm of everything, merge, export, salvage, a lookup and a store after
 * another process grew the file past this one's map, kiln_compile with
 * the fake NVRTC (kernels cached and compiled), and a build of cached
 * kernels. After every run the writable cache opens, verifies with no bad
 * record and holds every record it was seeded with, byte for byte; after
 * a failed operation that is one write transaction, those and nothing
 * else; after one that succeeded, the records the run that failed nothing
 * left. The shipped cache and the merge source are unchanged; an export or
 * a salvage that failed left no file behind. The last test says that the
 * sweeps fail every LMDB call of cache/, and that cache/ calls LMDB
 * through its gate only. */
#include "codegen/compile.h"
#include "fault.h"
#include "tests/cache/fake_record.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Records 0-4 seed the writable cache (4 made by an older compiler, for
 * gc), with the kernels of the shared model's one-token plan; 5 and 6 the
 * shipped one; 2 and 7 the file merged in. 8 is stored by a run; the other
 * process stores GROWN records of its own. */
enum { REC_COUNT = 9, GROWN = 24 };

typedef struct lmdb_ctx lmdb_ctx;

typedef struct lmdb_op {
    const char *name;
    /* k: the shipped and the writable cache, opened before the run; NULL
     * when the operation opens what it uses. */
    kiln_status (*run)(lmdb_ctx *c, kiln_cache *k, kt_digest *d);
    int opens;
    int atomic;  /* one write transaction, or none: a failed run changes nothing */
    int output;  /* records it writes to c->out */
} lmdb_op;

struct lmdb_ctx {
    kt_made rec[REC_COUNT], grown[GROWN];
    char pristine[128], shipped[128], merged[128], stale[128];
    char run_dir[128], writable[160], lock[160], out[160];
    kt_records seeded, shipped_recs, merged_recs;
    kt_records after;   /* the writable cache after the run that failed nothing */
    int have_after;
    kt_model m;
    kiln_graph *g;
    kiln_target t;
    kiln_plan *plan;    /* one token: the kernels seeded */
    kiln_cache *k;
    const lmdb_op *op;
};

static const int64_t one[] = { 1 }, more[] = { 1, 64 };

/* ------------------------------------------------------------ the ops */

static kiln_status op_open(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    (void)k;
    const char *shipped[] = { c->shipped };
    kiln_status st = kiln_cache_open(
        &(kiln_cache_options){ .shipped = shipped, .n_shipped = 1, .path = c->writable }, &k);
    if (st)
        return st;
    kt_dig_int(d, kiln_cache_n_layers(k));
    kt_dig_int(d, kiln_cache_writable_layer(k));
    kiln_cache_close(k);
    return KILN_OK;
}

/* Record 1's kernel stored under record 0's key: another kernel holds
 * the key, so it is replaced. */
static kiln_status op_replace(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    kiln_cache_put put;
    kiln_status st = kiln_cache_store(k, c->rec[0].key, &c->rec[1].rec, &put);
    kt_dig_int(d, put);
    return st;
}

static kiln_status op_store(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    kiln_cache_put put;
    kiln_status st = kiln_cache_store(k, c->rec[0].key, &c->rec[0].rec, &put);
    if (st)
        return st;
    kt_dig_int(d, put);
    if ((st = kiln_cache_store(k, c->rec[8].key, &c->rec[8].rec, &put)))
        return st;
    kt_dig_int(d, put);
    return KILN_OK;
}

/* Records of the writable layer (0, 3 on overflow pages), of the shipped
 * one (5), and a miss. */
static kiln_status op_lookup(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    static const int which[] = { 0, 3, 5 };
    kiln_cache_hit h;
    kiln_status st;
    for (size_t i = 0; i < KILN_ARRAY_LEN(which); i++) {
        if ((st = kiln_cache_lookup(k, c->rec[which[i]].key, "sm_90a", &h)))
            return st;
        kt_dig_int(d, h.layer);
        kt_dig(d, h.blob, h.size);
        kiln_cache_hit_release(&h);
    }
    st = kiln_cache_lookup(k, c->rec[8].key, "sm_90a", &h);
    if (st == KILN_OK)
        kiln_cache_hit_release(&h);
    return st == KILN_ERR_NOT_FOUND ? KILN_OK : st ? st : kiln_fail(KILN_ERR_STATE, "record 8 found");
}

static kiln_status dig_entry(void *ctx, const kiln_cache_entry *e)
{
    kt_dig(ctx, e->key, sizeof e->key);
    kt_dig_int(ctx, e->status);
    kt_dig_int(ctx, (int64_t)e->size);
    return KILN_OK;
}

static kiln_status op_ls(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    (void)c;
    kiln_status st = KILN_OK;
    for (int i = 0; i < kiln_cache_n_layers(k) && !st; i++)
        st = kiln_cache_foreach(k, i, dig_entry, d);
    return st;
}

static kiln_status op_verify(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    (void)c;
    size_t entries, bad;
    kiln_status st = kiln_cache_verify(k, kiln_cache_writable_layer(k), NULL, NULL, &entries, &bad);
    kt_dig_int(d, (int64_t)entries);
    kt_dig_int(d, (int64_t)bad);
    return st;
}

static kiln_status op_stat(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    (void)c;
    for (int i = 0; i < kiln_cache_n_layers(k); i++) {
        kiln_cache_stats s;
        kiln_status st = kiln_cache_stat(k, i, &s);
        if (st)
            return st;
        kt_dig_int(d, (int64_t)s.entries);
        kt_dig_int(d, (int64_t)s.bytes);
        for (int j = 0; j < s.n_kinds; j++)
            kt_dig_str(d, s.by_kind[j].name);
        kiln_cache_stats_free(&s);
    }
    return KILN_OK;
}

/* Removes record 4, made by the older compiler. */
static kiln_status op_gc(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    (void)c;
    size_t removed;
    kiln_cache_gc_options o = { .compiler = "nvrtc 13.0" };
    kiln_status st = kiln_cache_gc(k, &o, &removed, NULL);
    kt_dig_int(d, (int64_t)removed);
    return st;
}

static kiln_status op_rm(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    char hex[KILN_CACHE_KEY_HEX];
    kiln_cache_key_hex(c->rec[2].key, hex);
    hex[7] = '\0';
    size_t removed;
    kiln_status st = kiln_cache_rm(k, hex, &removed);
    kt_dig_int(d, (int64_t)removed);
    return st;
}

static kiln_status op_rm_all(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    (void)c;
    size_t removed;
    kiln_status st = kiln_cache_rm_all(k, &removed);
    kt_dig_int(d, (int64_t)removed);
    return st;
}

static kiln_status op_merge(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    kiln_cache_merge_result r;
    kiln_status st = kiln_cache_merge(k, c->merged, NULL, NULL, &r);
    if (!st)
        kt_dig(d, &r, sizeof r);
    return st;
}

/* A tuning table of one entry, for bucket b. */
static kiln_tuning *tuning_of(int64_t b)
{
    kiln_tuning *t;
    cr_assert_eq(kiln_tuning_create(&t), KILN_OK);
    kiln_tuning_entry e = { .signature = "linear backend=wgmma variant=* format=bf16 n=64 k=64",
                            .bucket = b, .variant = "bm64bn128", .us = 2, .heuristic = "bm64bn64",
                            .heuristic_us = 3 };
    cr_assert_eq(kiln_tuning_set(t, &e), KILN_OK, "%s", kiln_last_error());
    return t;
}

static kiln_status op_export(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    (void)d;
    uint8_t keys[2][KILN_CACHE_KEY_BYTES];
    memcpy(keys[0], c->rec[0].key, sizeof keys[0]);
    memcpy(keys[1], c->rec[5].key, sizeof keys[1]);
    kiln_tuning *t = tuning_of(64);
    kiln_status st = kiln_cache_export_keys(k, (const uint8_t(*)[KILN_CACHE_KEY_BYTES])keys, 2,
                                            c->out, 0, "{}", t);
    kiln_tuning_destroy(t);
    return st;
}

/* The tuning tables of both layers, merged. */
static kiln_status op_tuning(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    (void)c;
    kiln_tuning *t;
    kiln_status st = kiln_tuning_create(&t);
    if (!st && !(st = kiln_cache_tuning(k, t)))
        kt_dig_int(d, kiln_tuning_n(t));
    kiln_tuning_destroy(t);
    return st;
}

/* An entry added to the writable layer's table. */
static kiln_status op_store_tuning(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    (void)c;
    (void)d;
    kiln_tuning *t = tuning_of(256);
    kiln_status st = kiln_cache_store_tuning(k, t);
    kiln_tuning_destroy(t);
    return st;
}

/* The shipped layer's manifest. */
static kiln_status op_manifest(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    (void)c;
    const char *json;
    kiln_status st = kiln_cache_manifest(k, 0, &json);
    if (!st)
        kt_dig(d, json, strlen(json));
    return st;
}

/* The source holds two intact records under one key, the older on pages
 * freed since, and a manifest: the newer record and the manifest are
 * kept. */
static kiln_status op_salvage(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    (void)k;
    kiln_cache_salvage_result r;
    kiln_status st = kiln_cache_salvage(c->stale, c->out, 0, &r);
    if (!st)
        kt_dig(d, &r, sizeof r);
    return st;
}

/* This process maps the file at the size of what it holds; another
 * process then stores more, so this one's next transaction finds the file
 * past its map (MDB_MAP_RESIZED) and adopts the size the file records. */
static kiln_status op_grown(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    (void)k;
    kiln_cache_options o = { .path = c->writable, .map_size = 4096 };
    kiln_status st = kiln_cache_open(&o, &k);
    if (st)
        return st;
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        kiln_cache *other;
        kiln_cache_set_mdb_hook(NULL, NULL);
        kiln_alloc_set_hook(NULL, NULL);
        st = kiln_cache_open(&(kiln_cache_options){ .path = c->writable }, &other);
        for (int i = 0; i < GROWN && !st; i++)
            st = kiln_cache_store(other, c->grown[i].key, &c->grown[i].rec, NULL);
        kiln_cache_close(other);
        _exit(st ? 1 : 0);
    }
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "the other process failed to store");
    kiln_cache_hit h;
    if (!(st = kiln_cache_lookup(k, c->grown[GROWN - 1].key, "sm_90a", &h))) {
        kt_dig(d, h.blob, h.size);
        kiln_cache_hit_release(&h);
        st = kiln_cache_store(k, c->rec[8].key, &c->rec[8].rec, NULL);
    }
    kiln_cache_close(k);
    return st;
}

/* Stores into a map no larger than the file: LMDB finds it full, and the
 * map grows as the stores go on. */
static kiln_status op_full(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    (void)d;
    kiln_cache_options o = { .path = c->writable, .map_size = 4096 };
    kiln_status st = kiln_cache_open(&o, &k);
    for (int i = 0; i < GROWN && !st; i++)
        st = kiln_cache_store(k, c->grown[i].key, &c->grown[i].rec, NULL);
    kiln_cache_close(k);
    return st;
}

/* The seeded kernels cached, the 64-token bucket's compiled by the fake
 * NVRTC and stored. */
static kiln_status op_compile(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    (void)k;
    kiln_compile_options o = { .cache = { .path = c->writable }, .quiet = 1, .jobs = 1,
                               .plan = { .capture = more, .n_capture = 2 } };
    kiln_compile_result r;
    kiln_status st = kiln_compile(c->g, &c->t, &o, &r);
    if (!st) {
        kt_dig_int(d, r.signatures);
        kt_dig_int(d, r.cached);
        kt_dig_int(d, r.compiled);
    }
    return st;
}

/* What a session does: every kernel of the plan found, with its cubin. */
static kiln_status op_build(lmdb_ctx *c, kiln_cache *k, kt_digest *d)
{
    kiln_build b;
    kiln_status st = kiln_build_plan(c->plan, k, &(kiln_build_options){ .offline = 1, .quiet = 1 }, &b);
    if (st)
        return st;
    for (int i = 0; i < b.n; i++)
        kt_dig(d, b.kernels[i].cubin, b.kernels[i].cubin_size);
    kiln_build_free(&b);
    return KILN_OK;
}

static const lmdb_op ops[] = {
    { "open", op_open, .opens = 1, .atomic = 1 },
    { "store", op_store, .atomic = 1 },
    { "replace", op_replace, .atomic = 1 },
    { "lookup", op_lookup, .atomic = 1 },
    { "ls", op_ls, .atomic = 1 },
    { "verify", op_verify, .atomic = 1 },
    { "stat", op_stat, .atomic = 1 },
    { "gc", op_gc, .atomic = 1 },
    { "rm", op_rm, .atomic = 1 },
    { "rm_all", op_rm_all, .atomic = 1 },
    { "merge", op_merge, .atomic = 1 },
    { "export", op_export, .atomic = 1, .output = 2 },
    { "tuning", op_tuning, .atomic = 1 },
    { "store_tuning", op_store_tuning, .atomic = 1 },
    { "manifest", op_manifest, .atomic = 1 },
    { "salvage", op_salvage, .opens = 1, .atomic = 1, .output = 1 },
    { "grown", op_grown, .opens = 1 },
    { "full", op_full, .opens = 1 },
    { "compile", op_compile, .opens = 1 },
    { "build", op_build, .atomic = 1 },
};

/* ------------------------------------------------------- the scenario */

static void lmdb_reset(void *ctx)
{
    lmdb_ctx *c = ctx;
    kt_copy_file(c->pristine, c->writable);
    unlink(c->lock);
    unlink(c->out);
    if (c->op->opens)
        return;
    const char *shipped[] = { c->shipped };
    cr_assert_eq(kiln_cache_open(&(kiln_cache_options){ .shipped = shipped, .n_shipped = 1,
                                                        .path = c->writable },
                                 &c->k),
                 KILN_OK, "%s", kiln_last_error());
}

static kiln_status lmdb_run(void *ctx, kt_digest *d)
{
    lmdb_ctx *c = ctx;
    kiln_status st = c->op->run(c, c->k, d);
    kiln_cache_close(c->k);
    c->k = NULL;
    return st;
}

/* Whether r holds pair's key; whole: and its value, byte for byte. */
static int holds(const kt_records *r, const kt_buf *pair, int whole)
{
    for (size_t i = 0; i < r->n; i++)
        if (whole ? r->pair[i].n == pair->n && !memcmp(r->pair[i].p, pair->p, pair->n)
                  : !memcmp(r->pair[i].p, pair->p, KILN_CACHE_KEY_BYTES))
            return 1;
    return 0;
}

static void lmdb_check(void *ctx, kiln_status st)
{
    lmdb_ctx *c = ctx;
    char to[200];
    snprintf(to, sizeof to, "%s to %s: ", c->op->name, c->out);
    cr_assert(!st || !c->op->output || strstr(kiln_last_error(), to),
              "%s: the message does not name the file asked for (\"%s\"): %s", kt_sweep_now(), to,
              kiln_last_error());
    kt_cache_intact(c->writable, 0, 0);
    kt_records have;
    kt_records_read(c->writable, &have);
    if (!c->have_after) {
        c->after = have;
        c->have_after = 1;
        have = (kt_records){ 0 };
    } else if (st) {
        kt_records_within(&c->seeded, &have, c->op->atomic, "the writable cache");
    } else {
        /* The keys the run that failed nothing left, and each seeded record
         * it left as it was, byte for byte (a record stored anew holds the
         * time it was made). */
        cr_assert_eq(have.n, c->after.n, "%s: the writable cache holds %zu records, not %zu",
                     kt_sweep_now(), have.n, c->after.n);
        for (size_t i = 0; i < c->after.n; i++)
            cr_assert(holds(&have, &c->after.pair[i], 0), "%s: record %zu is missing", kt_sweep_now(),
                      i);
        kt_records kept = { 0 };
        kept.pair = calloc(c->seeded.n + 1, sizeof *kept.pair);
        for (size_t i = 0; i < c->seeded.n; i++)
            if (holds(&c->after, &c->seeded.pair[i], 1))
                kept.pair[kept.n++] = c->seeded.pair[i];
        kt_records_within(&kept, &have, 0, "the writable cache");
        free(kept.pair);
    }
    kt_records_free(&have);
    kt_records_read(c->shipped, &have);
    kt_records_within(&c->shipped_recs, &have, 1, "the shipped cache");
    kt_records_free(&have);
    kt_records_read(c->merged, &have);
    kt_records_within(&c->merged_recs, &have, 1, "the merge source");
    kt_records_free(&have);
    if (c->op->output && !st)
        kt_cache_intact(c->out, 1, (size_t)c->op->output);
    DIR *dir = opendir(c->run_dir);
    cr_assert_not_null(dir);
    for (struct dirent *e; (e = readdir(dir));) {
        const char *n = e->d_name;
        int known = !strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, "w.kiln") ||
                    !strcmp(n, "w.kiln-lock") || (c->op->output && !st && !strcmp(n, "out.kiln"));
        cr_assert(known, "%s: left %s/%s behind", kt_sweep_now(), c->run_dir, n);
    }
    closedir(dir);
}

static void fill(lmdb_ctx *c, const char *path, const int *which, int n)
{
    kiln_cache *k;
    cr_assert_eq(kiln_cache_open(&(kiln_cache_options){ .path = path }, &k), KILN_OK, "%s",
                 kiln_last_error());
    for (int i = 0; i < n; i++)
        cr_assert_eq(kiln_cache_store(k, c->rec[which[i]].key, &c->rec[which[i]].rec, NULL), KILN_OK,
                     "%s", kiln_last_error());
    kiln_cache_close(k);
}

static void setup(lmdb_ctx *c)
{
    for (int i = 0; i < REC_COUNT; i++)
        kt_made_init(&c->rec[i], i);
    c->rec[4].rec.compiler = "nvrtc 12.0";
    for (int i = 0; i < GROWN; i++) {
        kt_made_init(&c->grown[i], 100 + i);
        c->grown[i].rec.created = 1; /* the same record in every run */
    }
    kt_in_tmp(c->pristine, sizeof c->pristine, "pristine.kiln");
    kt_in_tmp(c->shipped, sizeof c->shipped, "shipped.kiln");
    kt_in_tmp(c->merged, sizeof c->merged, "merged.kiln");
    kt_in_tmp(c->run_dir, sizeof c->run_dir, "run");
    cr_assert_eq(mkdir(c->run_dir, 0700), 0);
    snprintf(c->writable, sizeof c->writable, "%s/w.kiln", c->run_dir);
    snprintf(c->lock, sizeof c->lock, "%s/w.kiln-lock", c->run_dir);
    snprintf(c->out, sizeof c->out, "%s/out.kiln", c->run_dir);
    fill(c, c->pristine, (const int[]){ 0, 1, 2, 3, 4 }, 5);
    fill(c, c->merged, (const int[]){ 2, 7 }, 2);
    /* Tuning tables in the writable cache, the merge source and the
     * shipped file, which has a manifest too. */
    kiln_tuning *t1 = tuning_of(1), *t2 = tuning_of(2);
    kiln_cache *k;
    cr_assert_eq(kiln_cache_open(&(kiln_cache_options){ .path = c->pristine }, &k), KILN_OK);
    cr_assert_eq(kiln_cache_store_tuning(k, t1), KILN_OK, "%s", kiln_last_error());
    kiln_cache_close(k);
    cr_assert_eq(kiln_cache_open(&(kiln_cache_options){ .path = c->merged }, &k), KILN_OK);
    cr_assert_eq(kiln_cache_store_tuning(k, t2), KILN_OK, "%s", kiln_last_error());
    kiln_cache_close(k);
    char made[128];
    kt_in_tmp(made, sizeof made, "made.kiln");
    fill(c, made, (const int[]){ 5, 6 }, 2);
    cr_assert_eq(kiln_cache_open(&(kiln_cache_options){ .path = made }, &k), KILN_OK);
    uint8_t keys[2][KILN_CACHE_KEY_BYTES];
    memcpy(keys[0], c->rec[5].key, sizeof keys[0]);
    memcpy(keys[1], c->rec[6].key, sizeof keys[1]);
    cr_assert_eq(kiln_cache_export_keys(k, (const uint8_t(*)[KILN_CACHE_KEY_BYTES])keys, 2,
                                        c->shipped, 0, "{\"kiln\":\"shipped\"}", t2),
                 KILN_OK, "%s", kiln_last_error());
    kiln_cache_close(k);
    kiln_tuning_destroy(t1);
    kiln_tuning_destroy(t2);
    /* Record 3 (on overflow pages) exported with a manifest, then another
     * kernel under its key: the first copy stays on the pages the second
     * freed, and salvage keeps the manifest too. */
    kt_in_tmp(c->stale, sizeof c->stale, "stale.kiln");
    char first[128];
    kt_in_tmp(first, sizeof first, "first.kiln");
    kiln_cache_put put;
    kt_made other = c->rec[3];
    other.rec.signature = "linear backend=simt format=q8_0 n=3 k=8192 target=sm_90a";
    other.rec.created = c->rec[3].rec.created = 1;
    other.rec.created++;
    cr_assert_eq(kiln_cache_open(&(kiln_cache_options){ .path = first }, &k), KILN_OK);
    cr_assert_eq(kiln_cache_store(k, c->rec[3].key, &c->rec[3].rec, NULL), KILN_OK, "%s",
                 kiln_last_error());
    cr_assert_eq(kiln_cache_export_keys(k, (const uint8_t(*)[KILN_CACHE_KEY_BYTES])c->rec[3].key,
                                        1, c->stale, 0, "{\"kiln\":\"stale\"}", NULL),
                 KILN_OK, "%s", kiln_last_error());
    kiln_cache_close(k);
    cr_assert_eq(kiln_cache_open(&(kiln_cache_options){ .path = c->stale }, &k), KILN_OK);
    cr_assert_eq(kiln_cache_store(k, c->rec[3].key, &other.rec, &put), KILN_OK, "%s",
                 kiln_last_error());
    cr_assert_eq(put, KILN_CACHE_REPLACED);
    kiln_cache_close(k);
    c->rec[3].rec.created = 0;

    setenv("KILN_NVRTC", KT_FAKE_NVRTC, 1);
    unsetenv("KT_FAKE_NVRTC");
    kt_model_make(&c->m);
    cr_assert_eq(kt_model_graph(&c->m, &c->g), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_target_from_name("sm_90a", &c->t), KILN_OK);
    kiln_compile_options o = { .cache = { .path = c->pristine }, .quiet = 1,
                               .plan = { .capture = one, .n_capture = 1 } };
    kiln_compile_result r;
    cr_assert_eq(kiln_compile(c->g, &c->t, &o, &r), KILN_OK, "%s", kiln_last_error());
    cr_assert_gt(r.compiled, 0);
    cr_assert_eq(kiln_plan_create(c->g, &c->t, &o.plan, &c->plan), KILN_OK, "%s", kiln_last_error());
    kt_records_read(c->pristine, &c->seeded);
    kt_records_read(c->shipped, &c->shipped_recs);
    kt_records_read(c->merged, &c->merged_recs);
}

static void teardown(lmdb_ctx *c)
{
    kt_records_free(&c->seeded);
    kt_records_free(&c->shipped_recs);
    kt_records_free(&c->merged_recs);
    kiln_plan_destroy(c->plan);
    kiln_graph_destroy(c->g);
    kt_model_free(&c->m);
}

/* ----------------------------------------------------- every LMDB call */

/* The LMDB calls of cache/ in the source, as "cache/cache.c:236"; and no
 * call past the gate but those that cannot fail. */
static int source_sites(char sites[][48], int cap)
{
    static const char *const files[] = { "cache/cache.c",  "cache/maint.c", "cache/lmdbfile.c",
                                         "cache/record.c", "cache/key.c",   "cache/manifest.c" };
    const char *root = getenv("KILN_SOURCE_DIR");
    cr_assert_not_null(root, "KILN_SOURCE_DIR names the source tree");
    regex_t gate, raw;
    cr_assert_eq(regcomp(&gate, "kiln_mdb_([a-z_]+)\\(", REG_EXTENDED), 0);
    cr_assert_eq(regcomp(&raw, "(^|[^a-z_])mdb_([a-z_]+)\\(", REG_EXTENDED), 0);
    int n = 0;
    for (size_t f = 0; f < KILN_ARRAY_LEN(files); f++) {
        char path[4096], line[1024];
        snprintf(path, sizeof path, "%s/%s", root, files[f]);
        FILE *in = fopen(path, "r");
        cr_assert_not_null(in, "%s", path);
        for (int no = 1; fgets(line, sizeof line, in); no++) {
            regmatch_t m[3];
            if (!regexec(&gate, line, 2, m, 0) && strncmp(line + m[1].rm_so, "txn_abort", 9)) {
                cr_assert_lt(n, cap);
                snprintf(sites[n++], sizeof sites[0], "%s:%d", files[f], no);
            }
            if (!regexec(&raw, line, 3, m, 0)) {
                int len = (int)(m[2].rm_eo - m[2].rm_so);
                const char *call = line + m[2].rm_so;
                int ok = (len == 9 && !strncmp(call, "env_close", 9)) ||
                         (len == 12 && !strncmp(call, "cursor_close", 12)) ||
                         (len == 8 && !strncmp(call, "strerror", 8));
                cr_assert(ok, "%s:%d calls LMDB past the gate (cache/mdb.c): %s", files[f], no, line);
            }
        }
        fclose(in);
    }
    regfree(&gate);
    regfree(&raw);
    return n;
}

Test(lmdb_fault, every_call_site, .init = kt_tmp_setup, .fini = kt_tmp_teardown, .timeout = 1200)
{
    static lmdb_ctx c;
    setup(&c);
    for (size_t i = 0; i < KILN_ARRAY_LEN(ops); i++) {
        c.op = &ops[i];
        c.have_after = 0;
        kt_mdb_sweep(&(kt_scenario){ .name = ops[i].name, .run = lmdb_run, .reset = lmdb_reset,
                                     .check = lmdb_check, .ctx = &c });
        kt_records_free(&c.after);
    }
    static char sites[256][48];
    int n = source_sites(sites, 256), missed = 0;
    for (int i = 0; i < n; i++) {
        int hit = 0;
        for (int j = 0; j < kt_mdb_n_swept() && !hit; j++) {
            /* __FILE__ as the build spelled the source tree's path */
            const char *s = kt_mdb_swept(j);
            size_t sn = strlen(s), len = strlen(sites[i]);
            hit = sn >= len && !strcmp(s + sn - len, sites[i]) && (sn == len || s[sn - len - 1] == '/');
        }
        if (!hit)
            printf("  never reached: %s\n", sites[i]);
        missed += !hit;
    }
    printf("lmdb sweep: %d of the %d LMDB call sites of cache/ reached and failed\n", n - missed, n);
    fflush(stdout);
    cr_assert_eq(missed, 0, "%d LMDB call sites of cache/ no scenario reaches (listed above)", missed);
    teardown(&c);
}
