#include "fault.h"

#include "cache/cache.h"
#include "core.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <ftw.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if defined(__SANITIZE_ADDRESS__)
#define KT_LEAK_CHECK 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KT_LEAK_CHECK 1
#endif
#endif
#ifdef KT_LEAK_CHECK
#include <sanitizer/lsan_interface.h>
#endif

/* ------------------------------------------------------------- the hook */

static struct {
    pthread_mutex_t mu;
    long count;         /* allocations of this run */
    long fail_at;       /* the one to fail, from 1; 0: none */
    const char *failed; /* its site */
    const char **seq;   /* the recording run's site of each allocation */
    long seq_cap;
    int recording;
} hook = { .mu = PTHREAD_MUTEX_INITIALIZER };

/* Any thread may allocate; the hook itself allocates only with malloc. */
static int hook_fn(void *ctx, const char *site)
{
    (void)ctx;
    pthread_mutex_lock(&hook.mu);
    long i = ++hook.count;
    if (hook.recording) {
        if (i > hook.seq_cap) {
            hook.seq_cap = hook.seq_cap ? 2 * hook.seq_cap : 1024;
            hook.seq = realloc(hook.seq, (size_t)hook.seq_cap * sizeof *hook.seq);
            cr_assert_not_null(hook.seq);
        }
        hook.seq[i - 1] = site;
    }
    int fail = i == hook.fail_at;
    if (fail)
        hook.failed = site;
    pthread_mutex_unlock(&hook.mu);
    return fail;
}

void kt_hook_arm(long fail_at, int recording)
{
    hook.count = 0;
    hook.fail_at = fail_at;
    hook.failed = NULL;
    hook.recording = recording;
    kiln_alloc_set_hook(hook_fn, NULL);
}

void kt_hook_disarm(void) { kiln_alloc_set_hook(NULL, NULL); }

long kt_hook_count(void) { return hook.count; }

const char *kt_hook_site(long i) { return hook.seq[i - 1]; }

const char *kt_site_name(const char *site)
{
    const char *root = getenv("KILN_SOURCE_DIR");
    size_t n = root ? strlen(root) : 0;
    return n && !strncmp(site, root, n) && site[n] == '/' ? site + n + 1 : site;
}

/* ---------------------------------------------------------- the sweep */

void kt_dig(kt_digest *d, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++)
        d->h = (d->h ^ s[i]) * 0x100000001b3ull; /* FNV-1a */
}

void kt_dig_str(kt_digest *d, const char *s)
{
    s = s ? s : "(null)";
    kt_dig(d, s, strlen(s) + 1);
}

void kt_dig_int(kt_digest *d, int64_t v) { kt_dig(d, &v, sizeof v); }

static char sweep_now[512];
static char tmp_root[64];

const char *kt_sweep_now(void) { return sweep_now; }

typedef struct site_tally {
    const char *site;
    long first, last; /* allocation indices, from 1 */
    long failed, absorbed;
    char message[160]; /* of its first KILN_ERR_NOMEM */
} site_tally;

static site_tally *tally_of(site_tally *t, int *n, const char *site)
{
    for (int i = 0; i < *n; i++)
        if (!strcmp(t[i].site, site))
            return &t[i];
    t[*n] = (site_tally){ .site = site };
    return &t[(*n)++];
}

/* Which of n calls, their sites in seq, a sweep of budget runs fails
 * (pick[i], from 1): every one when they fit, else each site's first and
 * last and an even spread of the rest. The sites go to sites. */
static char *sweep_pick(const char *name, const char *const *seq, long n, long budget,
                        site_tally *sites, int *n_sites)
{
    for (long i = 1; i <= n; i++) {
        site_tally *t = tally_of(sites, n_sites, seq[i - 1]);
        if (!t->first)
            t->first = i;
        t->last = i;
    }
    char *pick = calloc((size_t)n + 1, 1);
    cr_assert_not_null(pick);
    long room = budget - 2L * *n_sites;
    cr_assert_gt(room, 0, "%s: %d sites leave no budget for a spread", name, *n_sites);
    long stride = n <= budget ? 1 : (n + room - 1) / room;
    for (long i = 1; i <= n; i += stride)
        pick[i] = 1;
    for (int i = 0; i < *n_sites; i++)
        pick[sites[i].first] = pick[sites[i].last] = 1;
    return pick;
}

static kiln_status sweep_one(const kt_scenario *s, long fail_at, int recording, kt_digest *d)
{
    if (s->reset)
        s->reset(s->ctx);
    kiln_clear_error();
    *d = (kt_digest){ 0xcbf29ce484222325ull };
    kt_hook_arm(fail_at, recording);
    kiln_status st = s->run(s->ctx, d);
    kt_hook_disarm();
    return st;
}

void kt_sweep(const kt_scenario *s)
{
    kt_digest want, got;
    snprintf(sweep_now, sizeof sweep_now, "%s, failing nothing", s->name);
    kiln_status st = sweep_one(s, 0, 1, &want);
    cr_assert_eq(st, KILN_OK, "%s: %s", sweep_now, kiln_last_error());
    if (s->check)
        s->check(s->ctx, st);
    long n = hook.count;
    cr_assert_gt(n, 0, "%s allocates nothing: the sweep would prove nothing", s->name);

    site_tally *sites = calloc((size_t)n, sizeof *sites);
    int n_sites = 0;
    cr_assert_not_null(sites);
    char *pick = sweep_pick(s->name, hook.seq, n, KT_SWEEP_BUDGET, sites, &n_sites);

    long runs = 0, nomem = 0, absorbed = 0;
    for (long i = 1; i <= n; i++) {
        if (!pick[i])
            continue;
        const char *expected = hook.seq[i - 1];
        snprintf(sweep_now, sizeof sweep_now, "%s, allocation %ld of %ld failing (%s)", s->name, i, n,
                 kt_site_name(expected));
        st = sweep_one(s, i, 0, &got);
        cr_assert_not_null(hook.failed, "%s: the run made only %ld allocations", sweep_now, hook.count);
        cr_assert_str_eq(hook.failed, expected, "%s: the run failed %s instead: runs differ", sweep_now,
                         kt_site_name(hook.failed));
        site_tally *t = tally_of(sites, &n_sites, hook.failed);
        t->failed++;
        runs++;
        if (st == KILN_OK) {
            cr_assert_eq(got.h, want.h, "%s: the call succeeded with another result", sweep_now);
            t->absorbed++;
            absorbed++;
        } else {
            cr_assert_eq(st, KILN_ERR_NOMEM, "%s: %s, not KILN_ERR_NOMEM: %s", sweep_now,
                         kiln_strerror(st), kiln_last_error());
            cr_assert(strstr(kiln_last_error(), "out of memory"),
                      "%s: the message does not say what ran out: \"%s\"", sweep_now, kiln_last_error());
            if (!t->message[0])
                snprintf(t->message, sizeof t->message, "%s", kiln_last_error());
            nomem++;
        }
        if (s->check)
            s->check(s->ctx, st);
    }
#ifdef KT_LEAK_CHECK
    cr_assert_eq(__lsan_do_recoverable_leak_check(), 0, "%s: a failing run leaked (report above)",
                 s->name);
#endif
    printf("fault sweep: %-12s %5ld allocations at %3d sites: %ld failed, %ld KILN_ERR_NOMEM, %ld "
           "absorbed\n", s->name, n, n_sites, runs, nomem, absorbed);
    for (int i = 0; i < n_sites; i++) {
        cr_assert_gt(sites[i].failed, 0, "%s: site %s was never failed", s->name,
                     kt_site_name(sites[i].site));
        if (getenv("KILN_FAULT_SITES") || sites[i].absorbed)
            printf("  %-34s %s\n", kt_site_name(sites[i].site),
                   sites[i].absorbed ? "absorbed: the call succeeded" : sites[i].message);
    }
    fflush(stdout);
    free(sites);
    free(pick);
}

/* -------------------------------------------------------- the LMDB sweep */

const int kt_mdb_codes[4] = { MDB_MAP_FULL, ENOSPC, EIO, MDB_READERS_FULL };

static struct {
    long count;         /* LMDB calls of this run */
    long fail_at;       /* the one to fail, from 1; 0: none */
    int code;           /* with this code */
    const char *failed; /* its site */
    const char **seq;   /* the recording run's site of each call */
    const char **calls; /* and the call ("mdb_put") */
    long seq_cap;
    int recording;
    const char **swept; /* every site failed in this process */
    int n_swept, cap_swept;
} mdb;

static int mdb_hook_fn(void *ctx, const char *site, const char *call)
{
    (void)ctx;
    pthread_mutex_lock(&hook.mu);
    long i = ++mdb.count;
    if (mdb.recording) {
        if (i > mdb.seq_cap) {
            mdb.seq_cap = mdb.seq_cap ? 2 * mdb.seq_cap : 256;
            mdb.seq = realloc(mdb.seq, (size_t)mdb.seq_cap * sizeof *mdb.seq);
            mdb.calls = realloc(mdb.calls, (size_t)mdb.seq_cap * sizeof *mdb.calls);
            cr_assert(mdb.seq && mdb.calls);
        }
        mdb.seq[i - 1] = site;
        mdb.calls[i - 1] = call;
    }
    int fail = i == mdb.fail_at;
    if (fail)
        mdb.failed = site;
    pthread_mutex_unlock(&hook.mu);
    return fail ? mdb.code : 0;
}

static kiln_status mdb_sweep_one(const kt_scenario *s, long fail_at, int code, int recording,
                                 kt_digest *d)
{
    if (s->reset)
        s->reset(s->ctx);
    kiln_clear_error();
    *d = (kt_digest){ 0xcbf29ce484222325ull };
    mdb.count = 0;
    mdb.fail_at = fail_at;
    mdb.code = code;
    mdb.failed = NULL;
    mdb.recording = recording;
    kiln_cache_set_mdb_hook(mdb_hook_fn, NULL);
    kiln_status st = s->run(s->ctx, d);
    kiln_cache_set_mdb_hook(NULL, NULL);
    return st;
}

static void mdb_swept_add(const char *site)
{
    for (int i = 0; i < mdb.n_swept; i++)
        if (!strcmp(mdb.swept[i], site))
            return;
    if (mdb.n_swept == mdb.cap_swept) {
        mdb.cap_swept = mdb.cap_swept ? 2 * mdb.cap_swept : 64;
        mdb.swept = realloc(mdb.swept, (size_t)mdb.cap_swept * sizeof *mdb.swept);
        cr_assert_not_null(mdb.swept);
    }
    mdb.swept[mdb.n_swept++] = site;
}

int kt_mdb_n_swept(void) { return mdb.n_swept; }

const char *kt_mdb_swept(int i) { return kt_site_name(mdb.swept[i]); }

void kt_mdb_sweep(const kt_scenario *s)
{
    enum { N_CODES = KILN_ARRAY_LEN(kt_mdb_codes) };
    kt_digest want, got;
    snprintf(sweep_now, sizeof sweep_now, "%s, failing nothing", s->name);
    kiln_status st = mdb_sweep_one(s, 0, 0, 1, &want);
    cr_assert_eq(st, KILN_OK, "%s: %s", sweep_now, kiln_last_error());
    if (s->check)
        s->check(s->ctx, st);
    long n = mdb.count;
    cr_assert_gt(n, 0, "%s makes no LMDB call: the sweep would prove nothing", s->name);

    site_tally *sites = calloc((size_t)n, sizeof *sites);
    int n_sites = 0, commits = 0;
    cr_assert_not_null(sites);
    char *pick = sweep_pick(s->name, mdb.seq, n, KT_SWEEP_BUDGET / N_CODES, sites, &n_sites);
    for (int i = 0; i < n_sites; i++)
        commits += !strcmp(mdb.calls[sites[i].first - 1], "mdb_txn_commit");

    long runs = 0, by_status[KILN_STATUS_COUNT] = { 0 }, absorbed = 0;
    for (long i = 1; i <= n; i++) {
        if (!pick[i])
            continue;
        const char *expected = mdb.seq[i - 1], *call = mdb.calls[i - 1];
        for (int e = 0; e < N_CODES; e++) {
            int code = kt_mdb_codes[e];
            snprintf(sweep_now, sizeof sweep_now, "%s, LMDB call %ld of %ld (%s, %s) failing with %s",
                     s->name, i, n, call, kt_site_name(expected), mdb_strerror(code));
            st = mdb_sweep_one(s, i, code, 0, &got);
            cr_assert_not_null(mdb.failed, "%s: the run made only %ld LMDB calls", sweep_now,
                               mdb.count);
            cr_assert_str_eq(mdb.failed, expected, "%s: the run failed %s instead: runs differ",
                             sweep_now, kt_site_name(mdb.failed));
            site_tally *t = tally_of(sites, &n_sites, mdb.failed);
            t->failed++;
            runs++;
            if (st == KILN_OK) {
                cr_assert_eq(got.h, want.h, "%s: the call succeeded with another result", sweep_now);
                t->absorbed++;
                absorbed++;
            } else {
                const char *msg = kiln_last_error();
                cr_assert(st == KILN_ERR_CACHE || st == KILN_ERR_IO, "%s: %s, not KILN_ERR_CACHE or "
                          "KILN_ERR_IO: %s", sweep_now, kiln_strerror(st), msg);
                cr_assert(strstr(msg, tmp_root), "%s: the message names no file of %s: \"%s\"",
                          sweep_now, tmp_root, msg);
                cr_assert(strstr(msg, mdb_strerror(code)), "%s: the message does not say what "
                          "failed: \"%s\"", sweep_now, msg);
                if (!t->message[0])
                    snprintf(t->message, sizeof t->message, "%s", msg);
                by_status[st]++;
            }
            if (s->check)
                s->check(s->ctx, st);
        }
    }
#ifdef KT_LEAK_CHECK
    cr_assert_eq(__lsan_do_recoverable_leak_check(), 0, "%s: a failing run leaked (report above)",
                 s->name);
#endif
    printf("lmdb sweep: %-9s %4ld calls at %2d sites (%d commits): %5ld runs, %ld KILN_ERR_CACHE, "
           "%ld KILN_ERR_IO, %ld absorbed\n", s->name, n, n_sites, commits, runs,
           by_status[KILN_ERR_CACHE], by_status[KILN_ERR_IO], absorbed);
    for (int i = 0; i < n_sites; i++) {
        cr_assert_gt(sites[i].failed, 0, "%s: site %s was never failed", s->name,
                     kt_site_name(sites[i].site));
        mdb_swept_add(sites[i].site);
        if (getenv("KILN_FAULT_SITES"))
            printf("  %-22s %-19s %ld of %ld absorbed; %s\n", kt_site_name(sites[i].site),
                   mdb.calls[sites[i].first - 1], sites[i].absorbed, sites[i].failed,
                   sites[i].message[0] ? sites[i].message : "never an error");
    }
    fflush(stdout);
    free(sites);
    free(pick);
}

/* -------------------------------------------------------------- files */

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void kt_tmp_setup(void)
{
    snprintf(tmp_root, sizeof tmp_root, "/tmp/kiln-fault-XXXXXX");
    cr_assert_not_null(mkdtemp(tmp_root));
}

void kt_tmp_teardown(void)
{
    if (tmp_root[0])
        nftw(tmp_root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

const char *kt_in_tmp(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", tmp_root, name);
    return buf;
}

void kt_fake_device(const char *fail)
{
    char path[512];
    setenv("KILN_LIBCUDA", KT_FAKE_LIBCUDA, 1);
    setenv("KT_FAKE_CUDA", "device", 1);
    setenv("KILN_NVRTC", KT_FAKE_NVRTC, 1);
    setenv("KILN_CACHE", kt_in_tmp(path, sizeof path, "kernels.kiln"), 1);
    setenv("KILN_PACK", "host", 1);
    if (fail)
        setenv("KT_FAKE_CUDA_FAIL", fail, 1);
    else
        unsetenv("KT_FAKE_CUDA_FAIL");
}

void kt_write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(p, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

void kt_copy_file(const char *from, const char *to)
{
    FILE *f = fopen(from, "rb");
    cr_assert_not_null(f, "%s: %s", from, strerror(errno));
    kt_buf b = { 0 };
    uint8_t chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        kt_put(&b, chunk, n);
    fclose(f);
    kt_write_file(to, b.p, b.n);
    free(b.p);
}

void kt_put(kt_buf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
        cr_assert_not_null(b->p);
    }
    if (src)
        memcpy(b->p + b->n, src, n);
    else
        memset(b->p + b->n, 0, n);
    b->n += n;
}

void kt_put_le(kt_buf *b, uint64_t v, int n)
{
    uint8_t x[8];
    for (int i = 0; i < n; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    kt_put(b, x, (size_t)n);
}

void kt_pad(kt_buf *b, size_t align)
{
    while (b->n % align)
        kt_put(b, NULL, 1);
}

void kt_cache_intact(const char *path, int shipped, size_t at_least)
{
    kiln_cache_options o = shipped ? (kiln_cache_options){ .shipped = &path, .n_shipped = 1, .no_writable = 1 }
                                   : (kiln_cache_options){ .path = path };
    kiln_cache *k;
    size_t entries, bad;
    cr_assert_eq(kiln_cache_open(&o, &k), KILN_OK, "%s: %s: %s", sweep_now, path, kiln_last_error());
    cr_assert_eq(kiln_cache_verify(k, 0, NULL, NULL, &entries, &bad), KILN_OK, "%s: %s: %s", sweep_now,
                 path, kiln_last_error());
    kiln_cache_close(k);
    cr_assert_eq(bad, 0, "%s: %s holds %zu bad records", sweep_now, path, bad);
    cr_assert_geq(entries, at_least, "%s: %s holds %zu records", sweep_now, path, entries);
}

void kt_records_read(const char *path, kt_records *out)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    MDB_cursor *cur;
    MDB_val k, v;
    *out = (kt_records){ 0 };
    cr_assert_eq(mdb_env_create(&env), 0);
    int rc = mdb_env_open(env, path, MDB_RDONLY | MDB_NOSUBDIR | MDB_NOLOCK, 0644);
    cr_assert_eq(rc, 0, "%s: %s: %s", sweep_now, path, mdb_strerror(rc));
    cr_assert_eq(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
    cr_assert_eq(mdb_cursor_open(txn, dbi, &cur), 0);
    size_t cap = 0;
    while (!(rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))) {
        if (out->n == cap) {
            cap = cap ? 2 * cap : 16;
            out->pair = realloc(out->pair, cap * sizeof *out->pair);
            cr_assert_not_null(out->pair);
        }
        kt_buf *b = &out->pair[out->n++];
        *b = (kt_buf){ 0 };
        kt_put(b, k.mv_data, k.mv_size);
        kt_put(b, v.mv_data, v.mv_size);
    }
    cr_assert_eq(rc, MDB_NOTFOUND, "%s: %s: %s", sweep_now, path, mdb_strerror(rc));
    mdb_cursor_close(cur);
    mdb_txn_abort(txn);
    mdb_env_close(env);
}

void kt_records_free(kt_records *r)
{
    for (size_t i = 0; i < r->n; i++)
        free(r->pair[i].p);
    free(r->pair);
    *r = (kt_records){ 0 };
}

void kt_records_within(const kt_records *want, const kt_records *have, int exact, const char *what)
{
    for (size_t i = 0; i < want->n; i++) {
        const kt_buf *w = &want->pair[i];
        size_t j = 0;
        while (j < have->n && (have->pair[j].n != w->n || memcmp(have->pair[j].p, w->p, w->n)))
            j++;
        cr_assert_lt(j, have->n, "%s: %s: record %zu of %zu is gone or changed", sweep_now, what, i + 1,
                     want->n);
    }
    if (exact)
        cr_assert_eq(have->n, want->n, "%s: %s holds %zu records, not the %zu it held", sweep_now, what,
                     have->n, want->n);
}

/* ------------------------------------------------------------ the model */

static const kiln_format layer_formats[KT_LAYERS] = { KILN_FMT_Q4_K, KILN_FMT_FP8_BLOCK };

void kt_model_make(kt_model *m)
{
    kt_rng r = kt_rng_new(19);
    for (int l = 0; l < KT_LAYERS; l++) {
        kt_weight_make(&m->w[3 * l], &r, layer_formats[l], KT_D_FFN, KT_D_MODEL);
        kt_weight_make(&m->w[3 * l + 1], &r, layer_formats[l], KT_D_FFN, KT_D_MODEL);
        kt_weight_make(&m->w[3 * l + 2], &r, layer_formats[l], KT_D_MODEL, KT_D_FFN);
    }
    kt_weight_make(&m->w[3 * KT_LAYERS], &r, KILN_FMT_NVFP4, KT_D_HEAD, KT_D_MODEL);
    for (int l = 0; l <= KT_LAYERS; l++)
        for (int i = 0; i < KT_D_MODEL; i++)
            m->norm[l][i] = 1.0f + kt_uniform(&r, -0.1f, 0.1f);
}

void kt_model_free(kt_model *m)
{
    for (size_t i = 0; i < KILN_ARRAY_LEN(m->w); i++)
        kt_weight_free(&m->w[i]);
}

kiln_status kt_model_graph(const kt_model *m, kiln_graph **out)
{
    kiln_graph *g = NULL;
    kiln_tensor *x, *t[12];
    char name[64];
    kiln_status st = kiln_graph_create(&g);
    if (!st)
        st = kiln_graph_input(g, "x", KT_D_MODEL, &x);
    for (int l = 0; l < KT_LAYERS && !st; l++) {
        const char *role[3] = { "gate", "up", "down" };
        for (int j = 0; j < 3 && !st; j++) {
            snprintf(name, sizeof name, "blk.%d.ffn_%s.weight", l, role[j]);
            st = kiln_graph_weight(g, name, &m->w[3 * l + j].q, &t[j]);
        }
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
        if (!st)
            st = kiln_graph_param(g, name, KT_D_MODEL, m->norm[l], &t[3]);
        if (!st)
            st = kiln_graph_rms_norm(g, NULL, x, t[3], 1e-5f, &t[4]);
        if (!st)
            st = kiln_graph_linear(g, NULL, t[4], t[0], NULL, &t[5]);
        if (!st)
            st = kiln_graph_linear(g, NULL, t[4], t[1], NULL, &t[6]);
        if (!st)
            st = kiln_graph_silu(g, NULL, t[5], &t[7]);
        if (!st)
            st = kiln_graph_mul(g, NULL, t[7], t[6], &t[8]);
        if (!st)
            st = kiln_graph_linear(g, NULL, t[8], t[2], NULL, &t[9]);
        snprintf(name, sizeof name, "blk.%d.ffn_out", l);
        if (!st)
            st = kiln_graph_add(g, name, x, t[9], &x);
    }
    const kt_weight *head = &m->w[3 * KT_LAYERS];
    if (!st)
        st = kiln_graph_param(g, "output_norm.weight", KT_D_MODEL, m->norm[KT_LAYERS], &t[0]);
    if (!st)
        st = kiln_graph_param(g, "output.bias", KT_D_HEAD, head->bias, &t[1]);
    if (!st)
        st = kiln_graph_weight(g, "output.weight", &head->q, &t[2]);
    if (!st)
        st = kiln_graph_rms_norm(g, "output_norm", x, t[0], 1e-5f, &t[3]);
    if (!st)
        st = kiln_graph_linear(g, "output", t[3], t[2], t[1], &t[4]);
    if (!st)
        st = kiln_graph_gelu(g, "output.act", t[4], &t[5]);
    if (!st)
        st = kiln_graph_output(g, t[5]);
    if (!st)
        st = kiln_graph_output(g, x);
    kiln_tensor *const *order;
    int n_order;
    if (!st)
        st = kiln_graph_topo(g, &order, &n_order);
    if (st) {
        kiln_graph_destroy(g);
        return st;
    }
    *out = g;
    return KILN_OK;
}
