/* core/alloc.c: the allocation hook, and the fault sweep it exists for.
 *
 * A scenario (building a graph, planning it, a cached compile, the CPU
 * executor, the kernel cache, the GGUF and safetensors readers) runs once
 * to count its allocations and name their sites, then once per allocation
 * with that one allocation failing. Each such run either fails with
 * KILN_ERR_NOMEM and a message that says what ran out, or succeeds with
 * the very result of the run that failed nothing (the library absorbed the
 * failure: a thread pool that starts fewer threads). Under the sanitizers
 * it also leaks nothing. In the cache, every run leaves each record that was
 * there intact, writes no half record and leaves no stray file. Every site
 * a scenario reaches is failed at least once; a scenario of more
 * allocations than SWEEP_BUDGET fails each site's first and last
 * allocation and a spread of the rest. Each scenario prints how many
 * allocations and sites it swept; KILN_FAULT_SITES=1 lists every site with
 * the message its failure gave. */
#include "cache/cache.h"
#include "codegen/compile.h"
#include "codegen/nvrtc.h"
#include "core.h"
#include "tests/cache/fake_cubin.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* Failing runs of one scenario at most; past it, sampled. Keeps the suite
 * well under a minute on two cores under the sanitizers. */
enum { SWEEP_BUDGET = 700 };

static struct {
    pthread_mutex_t mu;
    long count;          /* allocations of this run */
    long fail_at;        /* the one to fail, from 1; 0: none */
    const char *failed;  /* its site */
    const char **seq;    /* the recording run's site of each allocation */
    long seq_cap;
    int recording;
} hook = { .mu = PTHREAD_MUTEX_INITIALIZER };

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

static void hook_arm(long fail_at, int recording)
{
    hook.count = 0;
    hook.fail_at = fail_at;
    hook.failed = NULL;
    hook.recording = recording;
    kiln_alloc_set_hook(hook_fn, NULL);
}

static void hook_disarm(void) { kiln_alloc_set_hook(NULL, NULL); }

/* "graph/gguf.c:282": the site without the source tree's directory. */
static const char *site_name(const char *site)
{
    const char *root = getenv("KILN_SOURCE_DIR");
    size_t n = root ? strlen(root) : 0;
    return n && !strncmp(site, root, n) && site[n] == '/' ? site + n + 1 : site;
}

Test(alloc, the_hook_sees_every_wrapper_and_fails_the_one_it_chooses)
{
    hook_arm(0, 1);
    void *a = kiln_malloc(8);
    void *b = kiln_calloc(2, 8);
    void *c = kiln_aligned_alloc(64, 64);
    char *d = kiln_strdup("kiln");
    char *e = kiln_strndup("kiln", 2);
    b = kiln_realloc(b, 64);
    hook_disarm();
    cr_assert(a && b && c && d && e);
    cr_assert_str_eq(e, "ki");
    cr_assert_eq((uintptr_t)c % 64, 0);
    cr_assert_eq(hook.count, 6);
    for (int i = 0; i < 6; i++)
        cr_assert(strstr(site_name(hook.seq[i]), "tests/core/test_alloc.c:"), "%s", hook.seq[i]);
    for (int i = 1; i < 6; i++)
        cr_assert_str_neq(hook.seq[i - 1], hook.seq[i], "each call site has its own name");

    for (long i = 1; i <= 6; i++) {
        void *p[6];
        hook_arm(i, 0);
        errno = 0;
        p[0] = kiln_malloc(8);
        p[1] = kiln_calloc(2, 8);
        p[2] = kiln_aligned_alloc(64, 64);
        p[3] = kiln_strdup("kiln");
        p[4] = kiln_strndup("kiln", 2);
        p[5] = kiln_realloc(a, 128);
        hook_disarm();
        cr_assert_null(p[i - 1], "allocation %ld fails", i);
        cr_assert_eq(errno, ENOMEM);
        for (int j = 0; j < 5; j++)
            if (j != i - 1)
                free(p[j]);
        if (i != 6)
            a = p[5];
    }
    free(a);
    free(b);
    free(c);
    free(d);
    free(e);
    cr_assert_not_null(a = kiln_malloc(1), "no hook, no failure");
    free(a);
}

/* ---------------------------------------------------------- the sweep */

/* What a scenario computed, hashed (FNV-1a), to compare a run that
 * absorbed a failure with the run that failed nothing. */
typedef struct digest {
    uint64_t h;
} digest;

static void dig(digest *d, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++)
        d->h = (d->h ^ s[i]) * 0x100000001b3ull;
}
static void dig_str(digest *d, const char *s) { dig(d, s ? s : "(null)", strlen(s ? s : "(null)") + 1); }
static void dig_int(digest *d, int64_t v) { dig(d, &v, sizeof v); }

typedef struct scenario {
    const char *name;
    kiln_status (*run)(void *ctx, digest *d);
    void (*reset)(void *ctx);                   /* before every run; may be NULL */
    void (*check)(void *ctx, kiln_status st);   /* the state a run left; may be NULL */
    void *ctx;
} scenario;

/* The failing run under way, for the scenarios' own assertions. */
static char sweep_now[512];

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

static kiln_status sweep_one(const scenario *s, long fail_at, int recording, digest *d)
{
    if (s->reset)
        s->reset(s->ctx);
    kiln_clear_error();
    *d = (digest){ 0xcbf29ce484222325ull };
    hook_arm(fail_at, recording);
    kiln_status st = s->run(s->ctx, d);
    hook_disarm();
    return st;
}

static void sweep(const scenario *s)
{
    digest want, got;
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
    for (long i = 1; i <= n; i++) {
        site_tally *t = tally_of(sites, &n_sites, hook.seq[i - 1]);
        if (!t->first)
            t->first = i;
        t->last = i;
    }
    /* Every allocation within budget; else each site's first and last and
     * an even spread of the rest. */
    char *pick = calloc((size_t)n + 1, 1);
    cr_assert_not_null(pick);
    long room = SWEEP_BUDGET - 2L * n_sites;
    cr_assert_gt(room, 0, "%s: %d sites leave no budget for a spread", s->name, n_sites);
    long stride = n <= SWEEP_BUDGET ? 1 : (n + room - 1) / room;
    for (long i = 1; i <= n; i += stride)
        pick[i] = 1;
    for (int i = 0; i < n_sites; i++)
        pick[sites[i].first] = pick[sites[i].last] = 1;

    long runs = 0, nomem = 0, absorbed = 0;
    for (long i = 1; i <= n; i++) {
        if (!pick[i])
            continue;
        snprintf(sweep_now, sizeof sweep_now, "%s, allocation %ld of %ld failing (%s)", s->name, i, n,
                 site_name(hook.seq[i - 1]));
        /* A scenario is deterministic: every run makes the same allocations
         * in the same order, up to the one that fails. */
        const char *expected = hook.seq[i - 1];
        st = sweep_one(s, i, 0, &got);
        cr_assert_not_null(hook.failed, "%s: the run made only %ld allocations", sweep_now, hook.count);
        cr_assert_str_eq(hook.failed, expected, "%s: the run failed %s instead: runs differ", sweep_now,
                         site_name(hook.failed));
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
            /* The CLI prints the message in place of kiln_strerror's. */
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
        cr_assert_gt(sites[i].failed, 0, "%s: site %s was never failed", s->name, site_name(sites[i].site));
        if (getenv("KILN_FAULT_SITES") || sites[i].absorbed)
            printf("  %-34s %s\n", site_name(sites[i].site),
                   sites[i].absorbed ? "absorbed: the call succeeded" : sites[i].message);
    }
    fflush(stdout);
    free(sites);
    free(pick);
}

/* -------------------------------------------------------------- files */

static char tmp_root[64];

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void tmp_setup(void)
{
    snprintf(tmp_root, sizeof tmp_root, "/tmp/kiln-fault-XXXXXX");
    cr_assert_not_null(mkdtemp(tmp_root));
}

static void tmp_teardown(void)
{
    if (tmp_root[0])
        nftw(tmp_root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static const char *in_tmp(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", tmp_root, name);
    return buf;
}

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(p, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

/* A growing byte buffer for the files the readers read. */
typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
} wbuf;

static void put(wbuf *b, const void *src, size_t n)
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

static void put_le(wbuf *b, uint64_t v, int n)
{
    uint8_t x[8];
    for (int i = 0; i < n; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    put(b, x, (size_t)n);
}

static void pad(wbuf *b, size_t align)
{
    while (b->n % align)
        put(b, NULL, 1);
}

/* ---------------------------------------------------- graph, plan, CPU */

/* A small model in the demo's shape: two FFN blocks, x + down(silu(gate(
 * rms(x))) * up(rms(x))), in Q4_K and block FP8, then a norm and an NVFP4
 * head with a bias and a GELU; both the head and the residual stream are
 * outputs. */
enum { D_MODEL = 256, D_FFN = 512, D_HEAD = 128, N_LAYERS = 2 };

static const kiln_format layer_formats[N_LAYERS] = { KILN_FMT_Q4_K, KILN_FMT_FP8_BLOCK };

typedef struct model_data {
    kiln_qtensor w[N_LAYERS * 3 + 1];
    float norm[N_LAYERS + 1][D_MODEL];
    float bias[D_HEAD];
} model_data;

static void quantized(kiln_qtensor *q, kiln_format fmt, int64_t n, int64_t k, kt_rng *r)
{
    size_t db, sb;
    cr_assert_eq(kiln_format_data_bytes(fmt, n, k, &db), KILN_OK);
    cr_assert_eq(kiln_format_scale_bytes(fmt, n, k, &sb), KILN_OK);
    float *src = malloc((size_t)(n * k) * sizeof *src);
    *q = (kiln_qtensor){ .format = fmt, .n = n, .k = k, .data = malloc(db), .scale = sb ? malloc(sb) : NULL };
    cr_assert(src && q->data && (!sb || q->scale));
    kt_fill_normal(r, src, (size_t)(n * k), 0.05f);
    cr_assert_eq(kiln_quantize(src, q), KILN_OK, "%s", kiln_last_error());
    free(src);
}

static void model_data_make(model_data *md)
{
    kt_rng r = kt_rng_new(19);
    for (int l = 0; l < N_LAYERS; l++) {
        quantized(&md->w[3 * l], layer_formats[l], D_FFN, D_MODEL, &r);
        quantized(&md->w[3 * l + 1], layer_formats[l], D_FFN, D_MODEL, &r);
        quantized(&md->w[3 * l + 2], layer_formats[l], D_MODEL, D_FFN, &r);
    }
    quantized(&md->w[3 * N_LAYERS], KILN_FMT_NVFP4, D_HEAD, D_MODEL, &r);
    for (int l = 0; l <= N_LAYERS; l++)
        for (int i = 0; i < D_MODEL; i++)
            md->norm[l][i] = 1.0f + kt_uniform(&r, -0.1f, 0.1f);
    for (int i = 0; i < D_HEAD; i++)
        md->bias[i] = kt_uniform(&r, -0.1f, 0.1f);
}

static void model_data_free(model_data *md)
{
    for (size_t i = 0; i < KILN_ARRAY_LEN(md->w); i++) {
        free(md->w[i].data);
        free(md->w[i].scale);
    }
}

static kiln_status model_build(const model_data *md, kiln_graph **out)
{
    kiln_graph *g = NULL;
    kiln_tensor *x, *t[12];
    char name[64];
    kiln_status st = kiln_graph_create(&g);
    if (!st)
        st = kiln_graph_input(g, "x", D_MODEL, &x);
    for (int l = 0; l < N_LAYERS && !st; l++) {
        const char *role[3] = { "gate", "up", "down" };
        for (int j = 0; j < 3 && !st; j++) {
            snprintf(name, sizeof name, "blk.%d.ffn_%s.weight", l, role[j]);
            st = kiln_graph_weight(g, name, &md->w[3 * l + j], &t[j]);
        }
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
        if (!st)
            st = kiln_graph_param(g, name, D_MODEL, md->norm[l], &t[3]);
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
    if (!st)
        st = kiln_graph_param(g, "output_norm.weight", D_MODEL, md->norm[N_LAYERS], &t[0]);
    if (!st)
        st = kiln_graph_param(g, "output.bias", D_HEAD, md->bias, &t[1]);
    if (!st)
        st = kiln_graph_weight(g, "output.weight", &md->w[3 * N_LAYERS], &t[2]);
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

static model_data md;

static kiln_status scenario_graph(void *ctx, digest *d)
{
    (void)ctx;
    kiln_graph *g;
    kiln_status st = model_build(&md, &g);
    if (st)
        return st;
    for (int i = 0; i < kiln_graph_n_tensors(g); i++)
        dig_str(d, kiln_tensor_name(kiln_graph_tensor(g, i)));
    kiln_graph_destroy(g);
    return KILN_OK;
}

Test(fault, graph_builder)
{
    model_data_make(&md);
    sweep(&(scenario){ .name = "graph", .run = scenario_graph });
    model_data_free(&md);
}

static void dig_plan(digest *d, const kiln_plan *p)
{
    for (int b = 0; b < kiln_plan_n_buckets(p); b++) {
        dig_int(d, kiln_plan_bucket(p, b));
        dig_int(d, (int64_t)kiln_plan_arena_bytes(p, b));
        for (int i = 0; i < kiln_plan_n_linears(p); i++) {
            kiln_plan_linear l;
            cr_assert_eq(kiln_plan_linear_at(p, i, b, &l), KILN_OK);
            dig_str(d, l.node);
            dig_str(d, l.backend);
            dig_str(d, l.act);
            dig_str(d, l.epilogue);
            dig_str(d, l.refused);
            dig_int(d, l.signature);
            dig_int(d, l.fell_back);
        }
    }
    for (int i = 0; i < kiln_plan_n_signatures(p); i++)
        dig_str(d, kiln_plan_signature(p, i));
    for (const char *const *w = kiln_plan_warnings(p); *w; w++)
        dig_str(d, *w);
}

typedef struct plan_ctx {
    kiln_graph *g;
    kiln_target t;
} plan_ctx;

/* The default selection, and --backend gemv, which cannot take the 64-token
 * bucket and falls back with a warning per format. */
static kiln_status scenario_plan(void *ctx, digest *d)
{
    plan_ctx *c = ctx;
    static const int64_t capture[] = { 1, 8, 64 };
    const char *backends[] = { NULL, "gemv" };
    for (size_t i = 0; i < KILN_ARRAY_LEN(backends); i++) {
        kiln_plan_options o = { .capture = capture, .n_capture = 3, .backend = backends[i] };
        kiln_plan *p;
        kiln_status st = kiln_plan_create(c->g, &c->t, &o, &p);
        if (st)
            return st;
        dig_plan(d, p);
        size_t storage, packed;
        st = kiln_plan_weight_bytes(p, &storage, &packed);
        dig_int(d, (int64_t)storage);
        dig_int(d, (int64_t)packed);
        kiln_plan_destroy(p);
        if (st)
            return st;
    }
    return KILN_OK;
}

Test(fault, plan)
{
    plan_ctx c;
    model_data_make(&md);
    cr_assert_eq(model_build(&md, &c.g), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_target_from_name("sm_90a", &c.t), KILN_OK);
    sweep(&(scenario){ .name = "plan", .run = scenario_plan, .ctx = &c });
    kiln_graph_destroy(c.g);
    model_data_free(&md);
}

typedef struct cpu_ctx {
    kiln_graph *g;
    float *x, *y[2];
} cpu_ctx;

/* Create, run 3 tokens and then 5 (the activations grow), destroy. */
static kiln_status scenario_cpu(void *ctx, digest *d)
{
    cpu_ctx *c = ctx;
    kiln_cpu *cpu;
    kiln_status st = kiln_cpu_create(c->g, &(kiln_cpu_options){ .threads = 2 }, &cpu);
    if (st)
        return st;
    const float *in[] = { c->x };
    for (int m = 3; m <= 5 && !st; m += 2) {
        memset(c->y[0], 0, 5 * D_HEAD * sizeof(float));
        memset(c->y[1], 0, 5 * D_MODEL * sizeof(float));
        st = kiln_cpu_run(cpu, m, in, c->y);
        dig(d, c->y[0], (size_t)m * D_HEAD * sizeof(float));
        dig(d, c->y[1], (size_t)m * D_MODEL * sizeof(float));
    }
    kiln_cpu_destroy(cpu);
    return st;
}

Test(fault, cpu_executor)
{
    cpu_ctx c = { .x = malloc(5 * D_MODEL * sizeof(float)), .y = { malloc(5 * D_HEAD * sizeof(float)),
                                                                   malloc(5 * D_MODEL * sizeof(float)) } };
    kt_rng r = kt_rng_new(20);
    cr_assert(c.x && c.y[0] && c.y[1]);
    kt_fill_normal(&r, c.x, 5 * D_MODEL, 1.0f);
    model_data_make(&md);
    cr_assert_eq(model_build(&md, &c.g), KILN_OK, "%s", kiln_last_error());
    sweep(&(scenario){ .name = "cpu", .run = scenario_cpu, .ctx = &c });
    kiln_graph_destroy(c.g);
    model_data_free(&md);
    free(c.x);
    free(c.y[0]);
    free(c.y[1]);
}

/* ---------------------------------------------------------- compile */

/* The cache file at path verifies, with at least at_least records. */
static void expect_intact(const char *path, int shipped, size_t at_least)
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


typedef struct compile_ctx {
    kiln_graph *g;
    kiln_target t;
    kiln_compile_options o;
    char cache[128], lock[160];
} compile_ctx;

static kiln_status compile_dig(compile_ctx *c, digest *d)
{
    kiln_compile_result r;
    kiln_status st = kiln_compile(c->g, &c->t, &c->o, &r);
    if (st)
        return st;
    dig_int(d, r.signatures);
    dig_int(d, r.cached);
    dig_int(d, r.compiled);
    return KILN_OK;
}

static void nvrtc_required(void)
{
    kiln_nvrtc *nv;
    cr_assert_eq(kiln_nvrtc_open(&nv), KILN_OK,
                 "libnvrtc cannot be loaded, and this test compiles with it (the CUDA toolkit's NVRTC, "
                 "or $KILN_NVRTC naming it): %s", kiln_last_error());
    kiln_nvrtc_close(nv);
}

/* kiln_compile, offline; then what a session does with the same cache:
 * every kernel built with its cubin, the cache opened read-only. */
static kiln_status scenario_compile(void *ctx, digest *d)
{
    compile_ctx *c = ctx;
    kiln_status st = compile_dig(c, d);
    if (st)
        return st;
    const char *shipped[] = { c->cache };
    kiln_plan *p;
    kiln_cache *k = NULL;
    kiln_build b;
    if ((st = kiln_plan_create(c->g, &c->t, &c->o.plan, &p)))
        return st;
    if (!(st = kiln_cache_open(&(kiln_cache_options){ .shipped = shipped, .n_shipped = 1, .no_writable = 1 },
                               &k)) &&
        !(st = kiln_build_plan(p, k, &(kiln_build_options){ .offline = 1 }, &b))) {
        for (int i = 0; i < b.n; i++)
            dig(d, b.kernels[i].cubin, b.kernels[i].cubin_size);
        kiln_build_free(&b);
    }
    kiln_cache_close(k);
    kiln_plan_destroy(p);
    return st;
}

/* Offline, from a cache NVRTC filled first: a failure that a lookup took
 * for a miss would be KILN_ERR_OFFLINE_MISS, not KILN_ERR_NOMEM. */
Test(fault, cached_compile, .init = tmp_setup, .fini = tmp_teardown)
{
    static const int64_t capture[] = { 1 };
    compile_ctx c = { .o = { .quiet = 1, .jobs = 2, .plan = { .capture = capture, .n_capture = 1 } } };
    nvrtc_required();
    c.o.cache = in_tmp(c.cache, sizeof c.cache, "compile.kiln");
    model_data_make(&md);
    cr_assert_eq(model_build(&md, &c.g), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_target_from_name("sm_90a", &c.t), KILN_OK);
    kiln_compile_result r;
    cr_assert_eq(kiln_compile(c.g, &c.t, &c.o, &r), KILN_OK, "%s", kiln_last_error());
    cr_assert_gt(r.compiled, 0);
    c.o.offline = 1;
    sweep(&(scenario){ .name = "compile", .run = scenario_compile, .ctx = &c });
    kiln_graph_destroy(c.g);
    model_data_free(&md);
}

static void nvrtc_reset(void *ctx)
{
    compile_ctx *c = ctx;
    unlink(c->cache);
    unlink(c->lock);
}

static kiln_status scenario_nvrtc(void *ctx, digest *d) { return compile_dig(ctx, d); }

/* What a failed compile left: a cache of intact records. */
static void nvrtc_check(void *ctx, kiln_status st)
{
    compile_ctx *c = ctx;
    (void)st;
    struct stat sb;
    if (!stat(c->cache, &sb))
        expect_intact(c->cache, 1, 0);
}

/* One kernel compiled with NVRTC and stored, into an empty cache each run;
 * one compile at a time, so the allocations keep their order. */
Test(fault, nvrtc_compile, .init = tmp_setup, .fini = tmp_teardown)
{
    static const int64_t capture[] = { 1 };
    compile_ctx c = { .o = { .quiet = 1, .jobs = 1, .plan = { .capture = capture, .n_capture = 1 } } };
    nvrtc_required();
    c.o.cache = in_tmp(c.cache, sizeof c.cache, "nvrtc.kiln");
    snprintf(c.lock, sizeof c.lock, "%s-lock", c.cache);
    kiln_qtensor w;
    kiln_tensor *x, *wt, *y;
    kt_rng r = kt_rng_new(21);
    quantized(&w, KILN_FMT_Q8_0, D_MODEL, D_MODEL, &r);
    cr_assert_eq(kiln_graph_create(&c.g), KILN_OK);
    cr_assert_eq(kiln_graph_input(c.g, "x", D_MODEL, &x), KILN_OK);
    cr_assert_eq(kiln_graph_weight(c.g, "w", &w, &wt), KILN_OK);
    cr_assert_eq(kiln_graph_linear(c.g, "y", x, wt, NULL, &y), KILN_OK);
    cr_assert_eq(kiln_graph_output(c.g, y), KILN_OK);
    kiln_tensor *const *order;
    int n_order;
    cr_assert_eq(kiln_graph_topo(c.g, &order, &n_order), KILN_OK, "the graph keeps its order from here");
    cr_assert_eq(kiln_target_from_name("sm_90a", &c.t), KILN_OK);
    sweep(&(scenario){ .name = "nvrtc", .run = scenario_nvrtc, .reset = nvrtc_reset, .check = nvrtc_check,
                       .ctx = &c });
    kiln_graph_destroy(c.g);
    free(w.data);
    free(w.scale);
}

/* ------------------------------------------------------------ cache */

/* A kernel record with a fake cubin; everything follows from i. Record 3's
 * is larger than a page: LMDB keeps it on overflow pages. */
typedef struct made {
    uint8_t key[KILN_CACHE_KEY_BYTES];
    char sig[128], entry[32];
    uint8_t cubin[6000];
    kiln_cache_record rec;
} made;

static void make(made *m, int i)
{
    size_t size = i == 3 ? sizeof m->cubin : 512;
    snprintf(m->sig, sizeof m->sig, "linear backend=simt format=q8_0 n=%d k=4096 target=sm_90a", i);
    snprintf(m->entry, sizeof m->entry, "kiln_linear_%d", i);
    cr_assert_eq(kiln_cache_key("sm_90a", "", m->sig, strlen(m->sig), m->key), KILN_OK);
    for (size_t j = 0; j < size; j++)
        m->cubin[j] = (uint8_t)(j * 31 + (size_t)i);
    kt_elf_header(m->cubin, 90);
    m->rec = (kiln_cache_record){ .compiler = "nvrtc 13.0", .entry = m->entry, .target = "sm_90a",
                                  .kind = i % 2 ? "simt" : "gemv", .signature = m->sig, .threads = 128,
                                  .cubin = m->cubin, .cubin_size = size };
}

/* Records 0-2 in the writable cache as each run finds it, 3-4 in the
 * shipped one, 2 and 5 in the file merged in; 6 is stored by the run. A
 * second shipped file, truncated, is left out as damaged. */
enum { REC_COUNT = 7 };

typedef struct cache_ctx {
    made rec[REC_COUNT];
    char pristine[128], shipped[128], damaged[128], merged[128];
    char run_dir[128], writable[160], lock[160], exported[160], salvaged[160];
    int did_export, did_salvage;
} cache_ctx;

static void cache_fill(cache_ctx *c, const char *path, int from, int to)
{
    kiln_cache *k;
    cr_assert_eq(kiln_cache_open(&(kiln_cache_options){ .path = path }, &k), KILN_OK, "%s",
                 kiln_last_error());
    for (int i = from; i <= to; i++)
        cr_assert_eq(kiln_cache_store(k, c->rec[i].key, &c->rec[i].rec, NULL), KILN_OK, "%s",
                     kiln_last_error());
    kiln_cache_close(k);
}

static void copy_file(const char *from, const char *to)
{
    FILE *f = fopen(from, "rb");
    cr_assert_not_null(f);
    wbuf b = { 0 };
    uint8_t chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        put(&b, chunk, n);
    fclose(f);
    write_file(to, b.p, b.n);
    free(b.p);
}

static void cache_reset(void *ctx)
{
    cache_ctx *c = ctx;
    copy_file(c->pristine, c->writable);
    unlink(c->lock);
    unlink(c->exported);
    unlink(c->salvaged);
    c->did_export = c->did_salvage = 0;
}

static kiln_status cache_scenario_steps(cache_ctx *c, kiln_cache *k, digest *d)
{
    kiln_cache_hit h;
    kiln_status st;
    for (int i = 0; i < 5; i += 3) {
        if ((st = kiln_cache_lookup(k, c->rec[i].key, "sm_90a", &h)))
            return st;
        dig_int(d, h.layer);
        dig_str(d, h.rec.signature);
        kiln_cache_hit_release(&h);
    }
    if ((st = kiln_cache_lookup(k, c->rec[6].key, "sm_90a", &h)) != KILN_ERR_NOT_FOUND)
        return st ? st : kiln_fail(KILN_ERR_STATE, "record 6 was found before it was stored");
    kiln_cache_put put;
    if ((st = kiln_cache_store(k, c->rec[6].key, &c->rec[6].rec, &put)))
        return st;
    dig_int(d, put);
    size_t entries, bad;
    int w = kiln_cache_writable_layer(k);
    if ((st = kiln_cache_verify(k, w, NULL, NULL, &entries, &bad)))
        return st;
    dig_int(d, (int64_t)entries);
    dig_int(d, (int64_t)bad);
    kiln_cache_stats s;
    if ((st = kiln_cache_stat(k, w, &s)))
        return st;
    dig_int(d, (int64_t)s.entries);
    for (int i = 0; i < s.n_targets; i++)
        dig_str(d, s.by_target[i].name);
    for (int i = 0; i < s.n_kinds; i++)
        dig_str(d, s.by_kind[i].name);
    kiln_cache_stats_free(&s);
    uint8_t two[2][KILN_CACHE_KEY_BYTES];
    memcpy(two[0], c->rec[0].key, sizeof two[0]);
    memcpy(two[1], c->rec[3].key, sizeof two[1]);
    if ((st = kiln_cache_export(k, (const uint8_t(*)[KILN_CACHE_KEY_BYTES])two, 2, c->exported, 0)))
        return st;
    c->did_export = 1;
    kiln_cache_merge_result mr;
    if ((st = kiln_cache_merge(k, c->merged, NULL, NULL, &mr)))
        return st;
    dig(d, &mr, sizeof mr);
    size_t removed;
    if ((st = kiln_cache_gc(k, &(kiln_cache_gc_options){ .corrupt = 1 }, &removed, NULL)))
        return st;
    dig_int(d, (int64_t)removed);
    return KILN_OK;
}

static kiln_status scenario_cache(void *ctx, digest *d)
{
    cache_ctx *c = ctx;
    const char *shipped[] = { c->damaged, c->shipped };
    kiln_cache *k;
    kiln_status st = kiln_cache_open(
        &(kiln_cache_options){ .shipped = shipped, .n_shipped = 2, .path = c->writable }, &k);
    if (st)
        return st;
    dig_str(d, kiln_cache_layer_damage(k, 0));
    st = cache_scenario_steps(c, k, d);
    kiln_cache_close(k);
    if (st)
        return st;
    kiln_cache_salvage_result sr;
    if ((st = kiln_cache_salvage(c->shipped, c->salvaged, 0, &sr)))
        return st;
    c->did_salvage = 1;
    dig(d, &sr, sizeof sr);
    return KILN_OK;
}

/* After every run: the writable cache verifies and holds records 0-2; an
 * export or a salvage that failed left no file, not even a temporary one. */
static void cache_check(void *ctx, kiln_status st)
{
    (void)st;
    cache_ctx *c = ctx;
    kiln_cache *k;
    cr_assert_eq(kiln_cache_open(&(kiln_cache_options){ .path = c->writable }, &k), KILN_OK, "%s: %s",
                 sweep_now, kiln_last_error());
    size_t entries, bad;
    cr_assert_eq(kiln_cache_verify(k, 0, NULL, NULL, &entries, &bad), KILN_OK, "%s: %s", sweep_now,
                 kiln_last_error());
    cr_assert_eq(bad, 0, "%s: the writable cache holds %zu bad records", sweep_now, bad);
    for (int i = 0; i < 3; i++) {
        kiln_cache_hit h;
        cr_assert_eq(kiln_cache_lookup(k, c->rec[i].key, "sm_90a", &h), KILN_OK, "%s: record %d: %s",
                     sweep_now, i, kiln_last_error());
        kiln_cache_hit_release(&h);
    }
    kiln_cache_close(k);
    if (c->did_export)
        expect_intact(c->exported, 1, 2);
    if (c->did_salvage)
        expect_intact(c->salvaged, 1, 2);
    DIR *dir = opendir(c->run_dir);
    cr_assert_not_null(dir);
    for (struct dirent *e; (e = readdir(dir));) {
        const char *n = e->d_name;
        int known = !strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, "w.kiln") || !strcmp(n, "w.kiln-lock") ||
                    (c->did_export && !strcmp(n, "export.kiln")) ||
                    (c->did_salvage && !strcmp(n, "salvaged.kiln"));
        cr_assert(known, "%s: left %s/%s behind", sweep_now, c->run_dir, n);
    }
    closedir(dir);
}

Test(fault, cache, .init = tmp_setup, .fini = tmp_teardown)
{
    static cache_ctx c;
    for (int i = 0; i < REC_COUNT; i++)
        make(&c.rec[i], i);
    in_tmp(c.pristine, sizeof c.pristine, "pristine.kiln");
    in_tmp(c.shipped, sizeof c.shipped, "shipped.kiln");
    in_tmp(c.merged, sizeof c.merged, "merged.kiln");
    in_tmp(c.run_dir, sizeof c.run_dir, "run");
    cr_assert_eq(mkdir(c.run_dir, 0700), 0);
    snprintf(c.writable, sizeof c.writable, "%s/w.kiln", c.run_dir);
    snprintf(c.lock, sizeof c.lock, "%s/w.kiln-lock", c.run_dir);
    snprintf(c.exported, sizeof c.exported, "%s/export.kiln", c.run_dir);
    snprintf(c.salvaged, sizeof c.salvaged, "%s/salvaged.kiln", c.run_dir);
    cache_fill(&c, c.pristine, 0, 2);
    cache_fill(&c, c.shipped, 3, 4);
    in_tmp(c.damaged, sizeof c.damaged, "damaged.kiln");
    copy_file(c.shipped, c.damaged);
    cr_assert_eq(truncate(c.damaged, 3 * 4096), 0);
    cache_fill(&c, c.merged, 2, 2);
    cache_fill(&c, c.merged, 5, 5);
    sweep(&(scenario){ .name = "cache", .run = scenario_cache, .reset = cache_reset, .check = cache_check,
                       .ctx = &c });
}

/* ----------------------------------------------------------- readers */

static void dig_model(digest *d, const kiln_model *m)
{
    kiln_model_info info;
    dig_str(d, kiln_model_container(m));
    dig_str(d, kiln_model_arch(m));
    kiln_model_get_info(m, &info);
    dig(d, &info, sizeof info);
    for (int i = 0; i < kiln_model_n_tensors(m); i++) {
        kiln_model_tensor_info t;
        kiln_qtensor q;
        cr_assert_eq(kiln_model_tensor_at(m, i, &t), KILN_OK);
        dig_str(d, t.name);
        dig_str(d, t.type_name);
        dig_int(d, t.supported);
        dig_int(d, t.format);
        dig(d, t.ne, sizeof t.ne);
        dig_int(d, (int64_t)t.bytes);
        kiln_status st = kiln_model_weight(m, t.name, &q);
        dig_int(d, st);
        /* The reason kiln cannot use a tensor, or its scales. */
        dig_str(d, st ? kiln_last_error() : "");
        if (!st)
            dig_int(d, q.scale != NULL);
    }
}

/* Open each of the NULL-terminated paths and list every tensor; build the
 * FFN graph from the first. */
static kiln_status scenario_model(void *ctx, digest *d)
{
    const char *const *paths = ctx;
    kiln_status st = KILN_OK;
    for (int i = 0; paths[i] && !st; i++) {
        kiln_model *m;
        kiln_graph *g = NULL;
        if ((st = kiln_model_open(paths[i], &m)))
            break;
        dig_model(d, m);
        if (i == 0 && !(st = kiln_graph_create(&g)) && !(st = kiln_model_build_ffn(m, g, 0)))
            dig_int(d, kiln_graph_n_tensors(g));
        kiln_graph_destroy(g);
        kiln_model_close(m);
    }
    return st;
}

static void gguf_str(wbuf *b, const char *s)
{
    put_le(b, strlen(s), 8);
    put(b, s, strlen(s));
}

static void gguf_key(wbuf *b, const char *key, uint32_t type)
{
    gguf_str(b, key);
    put_le(b, type, 4);
}

static void gguf_tensor(wbuf *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                        uint64_t offset)
{
    gguf_str(b, name);
    put_le(b, n_dims, 4);
    for (uint32_t i = 0; i < n_dims; i++)
        put_le(b, ne[i], 8);
    put_le(b, type, 4);
    put_le(b, offset, 8);
}

/* A one-layer Llama FFN: an F16 norm (copied to f32 for the graph), Q8_0
 * gate and up, a Q4_0 down, an IQ4_NL tensor kiln cannot use; metadata
 * with strings, an array of strings and an array of arrays. */
static void write_gguf(const char *path)
{
    enum { GGUF_U32 = 4, GGUF_F32 = 6, GGUF_STRING = 8, GGUF_ARRAY = 9 };
    static const struct {
        const char *name;
        uint32_t n_dims;
        uint64_t ne[2];
        uint32_t type;
        size_t bytes;
    } tensors[] = {
        { "blk.0.ffn_norm.weight", 1, { D_MODEL }, 1, D_MODEL * 2 },
        { "blk.0.ffn_gate.weight", 2, { D_MODEL, D_FFN }, 8, D_FFN * D_MODEL / 32 * 34 },
        { "blk.0.ffn_up.weight", 2, { D_MODEL, D_FFN }, 8, D_FFN * D_MODEL / 32 * 34 },
        { "blk.0.ffn_down.weight", 2, { D_FFN, D_MODEL }, 2, D_MODEL * D_FFN / 32 * 18 },
        { "blk.0.attn_q.weight", 2, { D_MODEL, 32 }, 20, 32 * D_MODEL / 32 * 18 },
    };
    wbuf b = { 0 };
    put(&b, "GGUF", 4);
    put_le(&b, 3, 4);
    put_le(&b, KILN_ARRAY_LEN(tensors), 8);
    put_le(&b, 8, 8);
    gguf_key(&b, "general.architecture", GGUF_STRING);
    gguf_str(&b, "llama");
    gguf_key(&b, "general.name", GGUF_STRING);
    gguf_str(&b, "fault sweep");
    const char *ints[] = { "llama.block_count", "llama.embedding_length", "llama.feed_forward_length" };
    const uint32_t values[] = { 1, D_MODEL, D_FFN };
    for (int i = 0; i < 3; i++) {
        gguf_key(&b, ints[i], GGUF_U32);
        put_le(&b, values[i], 4);
    }
    gguf_key(&b, "llama.attention.layer_norm_rms_epsilon", GGUF_F32);
    float eps = 1e-5f;
    put(&b, &eps, 4);
    gguf_key(&b, "tokenizer.ggml.tokens", GGUF_ARRAY);
    put_le(&b, GGUF_STRING, 4);
    put_le(&b, 3, 8);
    gguf_str(&b, "<s>");
    gguf_str(&b, "a");
    gguf_str(&b, "b");
    gguf_key(&b, "fault.nested", GGUF_ARRAY);
    put_le(&b, GGUF_ARRAY, 4);
    put_le(&b, 2, 8);
    for (int i = 0; i < 2; i++) {
        put_le(&b, GGUF_U32, 4);
        put_le(&b, 2, 8);
        put_le(&b, (uint64_t)i, 4);
        put_le(&b, (uint64_t)i + 1, 4);
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < KILN_ARRAY_LEN(tensors); i++) {
        gguf_tensor(&b, tensors[i].name, tensors[i].n_dims, tensors[i].ne, tensors[i].type, offset);
        offset += (tensors[i].bytes + 31) / 32 * 32;
    }
    pad(&b, 32);
    for (size_t i = 0; i < KILN_ARRAY_LEN(tensors); i++) {
        size_t at = b.n;
        put(&b, NULL, tensors[i].bytes);
        if (i == 0)
            for (int j = 0; j < D_MODEL; j++) /* f16 1.0 */
                b.p[at + 2 * (size_t)j + 1] = 0x3c;
        pad(&b, 32);
    }
    write_file(path, b.p, b.n);
    free(b.p);
}

Test(fault, gguf_reader, .init = tmp_setup, .fini = tmp_teardown)
{
    char path[128];
    write_gguf(in_tmp(path, sizeof path, "model.gguf"));
    const char *paths[] = { path, NULL };
    sweep(&(scenario){ .name = "gguf", .run = scenario_model, .ctx = paths });
}

/* A safetensors file under construction: the header's JSON and the data. */
typedef struct stw {
    char json[4096];
    size_t jn;
    wbuf data;
} stw;

static void st_add(stw *w, const char *name, const char *dtype, const char *shape, size_t bytes,
                   size_t align)
{
    pad(&w->data, align);
    size_t begin = w->data.n;
    put(&w->data, NULL, bytes);
    w->jn += (size_t)snprintf(w->json + w->jn, sizeof w->json - w->jn,
                              "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                              w->jn ? "," : "{\"__metadata__\":{\"format\":\"pt\"},", name, dtype, shape,
                              begin, w->data.n);
    cr_assert_lt(w->jn, sizeof w->json);
}

/* The header padded to 8 bytes, so that data offsets decide alignment. */
static void st_write(stw *w, const char *path)
{
    wbuf b = { 0 };
    size_t hlen = (w->jn + 1 + 7) / 8 * 8;
    put_le(&b, hlen, 8);
    put(&b, w->json, w->jn);
    put(&b, "}", 1);
    while (b.n < 8 + hlen)
        put(&b, " ", 1);
    put(&b, w->data.p, w->data.n);
    write_file(path, b.p, b.n);
    free(b.p);
    free(w->data.p);
}

/* A directory, opened as one and through one of its shards: config.json
 * (block FP8 quantization), an index and two shards holding a one-layer
 * Llama FFN (a BF16 norm, block-FP8 gate and up, a BF16 down), an NVFP4,
 * a per-channel FP8 and a one-expert MXFP4 weight, an F32 tensor at an
 * odd offset (copied to aligned memory) and a U8 tensor no convention
 * claims. */
static void write_safetensors(const char *dir)
{
    char path[256];
    cr_assert_eq(mkdir(dir, 0700), 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    const char *config = "{\"architectures\":[\"LlamaForCausalLM\"],\"num_hidden_layers\":1,"
                         "\"hidden_size\":256,\"intermediate_size\":512,\"rms_norm_eps\":1e-5,"
                         "\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[128,128]}}";
    write_file(path, config, strlen(config));

    const char *l = "model.layers.0.";
    char name[128];
    stw a = { 0 }, b = { 0 };
    char map[4096];
    size_t mn = 0;
#define ST(w, shard, suffix, dtype, shape, bytes, align)                                                   \
    do {                                                                                                   \
        snprintf(name, sizeof name, "%s%s", l, suffix);                                                    \
        st_add(&w, name, dtype, shape, bytes, align);                                                      \
        mn += (size_t)snprintf(map + mn, sizeof map - mn, "%s\"%s\":\"%s\"", mn ? "," : "", name, shard); \
    } while (0)
    const char *s1 = "model-00001-of-00002.safetensors", *s2 = "model-00002-of-00002.safetensors";
    ST(a, s1, "extra.bytes", "U8", "[3]", 3, 1);
    ST(a, s1, "extra.odd", "F32", "[4]", 16, 1);
    ST(a, s1, "post_attention_layernorm.weight", "BF16", "[256]", 512, 16);
    ST(a, s1, "mlp.gate_proj.weight", "F8_E4M3", "[512,256]", 512 * 256, 16);
    ST(a, s1, "mlp.gate_proj.weight_scale_inv", "F32", "[4,2]", 32, 16);
    ST(b, s2, "mlp.up_proj.weight", "F8_E4M3", "[512,256]", 512 * 256, 16);
    ST(b, s2, "mlp.up_proj.weight_scale_inv", "F32", "[4,2]", 32, 16);
    ST(b, s2, "mlp.down_proj.weight", "BF16", "[256,512]", 256 * 512 * 2, 16);
    ST(b, s2, "self_attn.q_proj.weight", "U8", "[32,128]", 32 * 128, 16);
    ST(b, s2, "self_attn.q_proj.weight_scale", "F8_E4M3", "[32,16]", 32 * 16, 16);
    ST(b, s2, "self_attn.q_proj.weight_scale_2", "F32", "[]", 4, 16);
    ST(b, s2, "self_attn.k_proj.weight", "F8_E4M3", "[32,256]", 32 * 256, 16);
    ST(b, s2, "self_attn.k_proj.weight_scale", "F32", "[32]", 32 * 4, 16);
    ST(b, s2, "mlp.experts.gate_up_proj_blocks", "U8", "[1,32,8,16]", 32 * 8 * 16, 16);
    ST(b, s2, "mlp.experts.gate_up_proj_scales", "U8", "[1,32,8]", 32 * 8, 16);
#undef ST
    snprintf(path, sizeof path, "%s/%s", dir, s1);
    st_write(&a, path);
    snprintf(path, sizeof path, "%s/%s", dir, s2);
    st_write(&b, path);
    char index[4200];
    int n = snprintf(index, sizeof index, "{\"metadata\":{},\"weight_map\":{%s}}", map);
    cr_assert_lt((size_t)n, sizeof index);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    write_file(path, index, (size_t)n);
}

Test(fault, safetensors_reader, .init = tmp_setup, .fini = tmp_teardown)
{
    char dir[128], shard[192];
    write_safetensors(in_tmp(dir, sizeof dir, "model"));
    snprintf(shard, sizeof shard, "%s/model-00002-of-00002.safetensors", dir);
    const char *paths[] = { dir, shard, NULL };
    sweep(&(scenario){ .name = "safetensors", .run = scenario_model, .ctx = paths });
}
