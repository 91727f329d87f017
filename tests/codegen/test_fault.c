/* The fault sweep (tests/util/fault.h) over codegen/: planning the
 * shared model for a named target, compiling it offline from a warm cache
 * (and building its kernels with their cubins, as a session does), and
 * compiling one kernel with NVRTC into an empty cache. */
#include "codegen/compile.h"
#include "codegen/nvrtc.h"
#include "fault.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

static void dig_plan(kt_digest *d, const kiln_plan *p)
{
    for (int b = 0; b < kiln_plan_n_buckets(p); b++) {
        kt_dig_int(d, kiln_plan_bucket(p, b));
        kt_dig_int(d, (int64_t)kiln_plan_arena_bytes(p, b));
        for (int i = 0; i < kiln_plan_n_linears(p); i++) {
            kiln_plan_linear l;
            cr_assert_eq(kiln_plan_linear_at(p, i, b, &l), KILN_OK);
            kt_dig_str(d, l.node);
            kt_dig_str(d, l.backend);
            kt_dig_str(d, l.act);
            kt_dig_str(d, l.epilogue);
            kt_dig_str(d, l.refused);
            kt_dig_int(d, l.signature);
            kt_dig_int(d, l.fell_back);
        }
    }
    for (int i = 0; i < kiln_plan_n_signatures(p); i++)
        kt_dig_str(d, kiln_plan_signature(p, i));
    for (const char *const *w = kiln_plan_warnings(p); *w; w++)
        kt_dig_str(d, *w);
}

typedef struct plan_ctx {
    kiln_graph *g;
    kiln_target t;
} plan_ctx;

/* The default selection, and --backend gemv, which cannot take the 64-token
 * bucket and falls back with a warning per format. */
static kiln_status scenario_plan(void *ctx, kt_digest *d)
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
        kt_dig_int(d, (int64_t)storage);
        kt_dig_int(d, (int64_t)packed);
        kiln_plan_destroy(p);
        if (st)
            return st;
    }
    return KILN_OK;
}

Test(fault, plan)
{
    static kt_model m;
    plan_ctx c;
    kt_model_make(&m);
    cr_assert_eq(kt_model_graph(&m, &c.g), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_target_from_name("sm_90a", &c.t), KILN_OK);
    kt_sweep(&(kt_scenario){ .name = "plan", .run = scenario_plan, .ctx = &c });
    kiln_graph_destroy(c.g);
    kt_model_free(&m);
}


/* ---------------------------------------------------------- compile */

typedef struct compile_ctx {
    kiln_graph *g;
    kiln_target t;
    kiln_compile_options o;
    char cache[128], lock[160], exported[128];
} compile_ctx;

static kiln_status compile_dig(compile_ctx *c, kt_digest *d)
{
    kiln_compile_result r;
    kiln_status st = kiln_compile(c->g, &c->t, &c->o, &r);
    if (st)
        return st;
    kt_dig_int(d, r.signatures);
    kt_dig_int(d, r.cached);
    kt_dig_int(d, r.compiled);
    return KILN_OK;
}

static void export_reset(void *ctx)
{
    compile_ctx *c = ctx;
    unlink(c->exported);
}

/* A failed export leaves no file; one that did not fail ships every kernel. */
static void export_check(void *ctx, kiln_status st)
{
    compile_ctx *c = ctx;
    if (st)
        cr_assert_neq(access(c->exported, F_OK), 0, "%s: a failed export left %s",
                      kt_sweep_now(), c->exported);
    else
        kt_cache_intact(c->exported, 1, 1);
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
 * every kernel built with its cubin, the cache opened read-only; then the
 * plan's kernels exported from it. */
static kiln_status scenario_compile(void *ctx, kt_digest *d)
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
            kt_dig(d, b.kernels[i].cubin, b.kernels[i].cubin_size);
        kiln_build_free(&b);
        st = kiln_cache_export(k, p, c->exported, 0);
    }
    kiln_cache_close(k);
    kiln_plan_destroy(p);
    return st;
}

/* Offline, from a cache NVRTC filled first: a failure that a lookup took
 * for a miss would be KILN_ERR_OFFLINE_MISS, not KILN_ERR_NOMEM. */
Test(fault, cached_compile, .init = kt_tmp_setup, .fini = kt_tmp_teardown)
{
    static const int64_t capture[] = { 1 };
    compile_ctx c = { .o = { .quiet = 1, .jobs = 2, .plan = { .capture = capture, .n_capture = 1 } } };
    nvrtc_required();
    c.o.cache.path = kt_in_tmp(c.cache, sizeof c.cache, "compile.kiln");
    static kt_model m;
    kt_model_make(&m);
    cr_assert_eq(kt_model_graph(&m, &c.g), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_target_from_name("sm_90a", &c.t), KILN_OK);
    kiln_compile_result r;
    cr_assert_eq(kiln_compile(c.g, &c.t, &c.o, &r), KILN_OK, "%s", kiln_last_error());
    cr_assert_gt(r.compiled, 0);
    c.o.cache.offline = 1;
    kt_in_tmp(c.exported, sizeof c.exported, "exported.kiln");
    kt_sweep(&(kt_scenario){ .name = "compile", .run = scenario_compile, .reset = export_reset,
                             .check = export_check, .ctx = &c });
    kiln_graph_destroy(c.g);
    kt_model_free(&m);
}

static void nvrtc_reset(void *ctx)
{
    compile_ctx *c = ctx;
    unlink(c->cache);
    unlink(c->lock);
}

static kiln_status scenario_nvrtc(void *ctx, kt_digest *d) { return compile_dig(ctx, d); }

/* What a failed compile left: a cache of intact records. */
static void nvrtc_check(void *ctx, kiln_status st)
{
    compile_ctx *c = ctx;
    (void)st;
    struct stat sb;
    if (!stat(c->cache, &sb))
        kt_cache_intact(c->cache, 1, 0);
}

/* One kernel compiled with NVRTC and stored, into an empty cache each run;
 * one compile at a time (no worker threads), so the allocations keep their
 * order. */
Test(fault, nvrtc_compile, .init = kt_tmp_setup, .fini = kt_tmp_teardown)
{
    static const int64_t capture[] = { 1 };
    compile_ctx c = { .o = { .quiet = 1, .jobs = 1, .plan = { .capture = capture, .n_capture = 1 } } };
    nvrtc_required();
    c.o.cache.path = kt_in_tmp(c.cache, sizeof c.cache, "nvrtc.kiln");
    snprintf(c.lock, sizeof c.lock, "%s-lock", c.cache);
    kt_weight w;
    kt_rng r = kt_rng_new(21);
    kt_weight_make(&w, &r, KILN_FMT_Q8_0, KT_D_MODEL, KT_D_MODEL);
    c.g = kt_linear_graph(&w);
    kiln_tensor *const *order;
    int n_order;
    cr_assert_eq(kiln_graph_topo(c.g, &order, &n_order), KILN_OK, "the graph keeps its order from here");
    cr_assert_eq(kiln_target_from_name("sm_90a", &c.t), KILN_OK);
    kt_sweep(&(kt_scenario){ .name = "nvrtc", .run = scenario_nvrtc, .reset = nvrtc_reset,
                             .check = nvrtc_check, .ctx = &c });
    kiln_graph_destroy(c.g);
    kt_weight_free(&w);
}

