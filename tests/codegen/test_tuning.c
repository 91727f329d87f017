/* Tuning tables: the table itself (entries, its text and the text's
 * refusals), planning with one (the measured variant where the backend
 * offers it, the heuristic's and a warning where it does not), and the
 * cache keeping it: stored, read over layers, carried by an export so that
 * a deployment plans as the build did, merged, salvaged, and refused when
 * damaged. The kernels compile with the stand-in NVRTC. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "codegen/plan.h"
#include "codegen/sig.h"
#include "core/tuning.h"
#include "clirun.h"
#include "fault.h"
#include "gpuutil.h"

#define SIG "linear backend=wgmma variant=* format=bf16 n=64 k=64 target=sm_90a"

static kiln_tuning *table(void)
{
    kiln_tuning *t;
    cr_assert_eq(kiln_tuning_create(&t), KILN_OK);
    return t;
}

static void set(kiln_tuning *t, const char *sig, int64_t bucket, const char *variant, double us)
{
    kiln_tuning_entry e = { .signature = sig, .bucket = bucket, .variant = variant, .us = us,
                            .heuristic = "bm64bn64", .heuristic_us = us + 1 };
    cr_assert_eq(kiln_tuning_set(t, &e), KILN_OK, "%s", kiln_last_error());
}

static const char *variant_at(const kiln_tuning *t, const char *sig, int64_t bucket)
{
    kiln_tuning_entry e;
    int i = kiln_tuning_index(t, sig, bucket);
    if (i < 0)
        return NULL;
    cr_assert_eq(kiln_tuning_at(t, i, &e), KILN_OK);
    return e.variant;
}

Test(tuning, entries_are_set_replaced_and_refused)
{
    kiln_tuning *t = table();
    set(t, SIG, 512, "bm64bn128", 10.5);
    set(t, SIG, 64, "bm64bn64", 3);
    set(t, SIG, 512, "bm64bn64", 9); /* the same key: replaced */
    cr_assert_eq(kiln_tuning_n(t), 2);
    cr_assert_str_eq(variant_at(t, SIG, 512), "bm64bn64");
    kiln_tuning_entry e;
    cr_assert_eq(kiln_tuning_at(t, 0, &e), KILN_OK);
    cr_assert_eq(e.us, 9);
    cr_assert_eq(e.heuristic_us, 10);
    cr_assert_eq(kiln_tuning_at(t, 2, &e), KILN_ERR_INVALID_ARG);
    const struct {
        const char *sig, *variant;
        int64_t bucket;
        double us;
    } bad[] = {
        { "linear backend=wgmma variant=bm64bn64 format=bf16", "x", 1, 1 }, /* no variant=* */
        { "op silu variant=* width=8", "x", 1, 1 },
        { "step target=sm_90a steps=3", "serial", 1, 1 }, /* a step key without its hash */
        { SIG, "two words", 1, 1 },
        { SIG, "", 1, 1 },
        { SIG, "x", 0, 1 },
        { SIG, "x", 1, -1 },
        { SIG, "x", 1, NAN },
        { SIG, "x", 1, INFINITY },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kiln_tuning_entry b = { .signature = bad[i].sig, .bucket = bad[i].bucket,
                                .variant = bad[i].variant, .us = bad[i].us, .heuristic = "h" };
        cr_assert_eq(kiln_tuning_set(t, &b), KILN_ERR_INVALID_ARG, "case %zu", i);
    }
    char long_name[80];
    memset(long_name, 'v', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    kiln_tuning_entry b = { .signature = SIG, .bucket = 1, .variant = long_name, .heuristic = "h" };
    cr_assert_eq(kiln_tuning_set(t, &b), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_tuning_n(t), 2, "a refused entry changes nothing");
    set(t, "step target=sm_90a steps=3 hash=00ff00ff00ff00ff", 16, "serial", 2);
    cr_assert_str_eq(variant_at(t, "step target=sm_90a steps=3 hash=00ff00ff00ff00ff", 16),
                     "serial");
    kiln_tuning_destroy(t);
}

Test(tuning, text_round_trips_and_bad_lines_are_named)
{
    kiln_tuning *t = table(), *back = table();
    set(t, SIG, 512, "bm64bn128", 10.25);
    set(t, SIG, 1, "bm64bn64", 0.5);
    char *text;
    size_t n;
    cr_assert_eq(kiln_tuning_text(t, &text, &n), KILN_OK);
    cr_assert_eq(strlen(text), n);
    cr_assert_eq(kiln_tuning_parse(back, text, n, "t.kiln"), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_tuning_n(back), 2);
    cr_assert_str_eq(variant_at(back, SIG, 512), "bm64bn128");
    cr_assert_str_eq(variant_at(back, SIG, 1), "bm64bn64");
    free(text);
    static const char *const bad[] = {
        "512 bm64bn128 10 bm64bn64 11 " SIG,        /* no newline */
        "512 bm64bn128 10 bm64bn64 " SIG "\n",      /* a field short */
        "0x20 bm64bn128 10 bm64bn64 11 " SIG "\n",  /* not a bucket */
        "1.5 bm64bn128 10 bm64bn64 11 " SIG "\n",
        "512 bm64bn128 ten bm64bn64 11 " SIG "\n",
        "512 bm64bn128 10 bm64bn64 11 linear no variant\n",
        "512  bm64bn128 10 bm64bn64 11 " SIG "\n",  /* an empty field */
        "\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kiln_tuning *x = table();
        cr_assert_eq(kiln_tuning_parse(x, bad[i], strlen(bad[i]), "t.kiln"), KILN_ERR_MALFORMED,
                     "case %zu", i);
        cr_assert(strstr(kiln_last_error(), "t.kiln: tuning line 1"), "%s", kiln_last_error());
        kiln_tuning_destroy(x);
    }
    /* a good line, then a bad one: the second is named, the first kept */
    const char two[] = "8 bm64bn128 1 bm64bn64 2 " SIG "\nnonsense\n";
    kiln_tuning *x = table();
    cr_assert_eq(kiln_tuning_parse(x, two, strlen(two), "t.kiln"), KILN_ERR_MALFORMED);
    cr_assert(strstr(kiln_last_error(), "tuning line 2"), "%s", kiln_last_error());
    cr_assert_eq(kiln_tuning_n(x), 1);
    kiln_tuning_destroy(x);
    /* merge: into's entries stay unless replace */
    kiln_tuning *a = table(), *b = table();
    set(a, SIG, 512, "bm64bn64", 1);
    set(b, SIG, 512, "bm64bn128", 1);
    set(b, SIG, 2, "bm64bn128", 1);
    cr_assert_eq(kiln_tuning_merge(a, b, 0), KILN_OK);
    cr_assert_str_eq(variant_at(a, SIG, 512), "bm64bn64");
    cr_assert_eq(kiln_tuning_n(a), 2);
    cr_assert_eq(kiln_tuning_merge(a, b, 1), KILN_OK);
    cr_assert_str_eq(variant_at(a, SIG, 512), "bm64bn128");
    kiln_tuning_destroy(a);
    kiln_tuning_destroy(b);
    kiln_tuning_destroy(t);
    kiln_tuning_destroy(back);
}

/* ------------------------------------------------------------ planning */

static const int64_t buckets[] = { 512 };

typedef struct linear_case {
    kt_weight w;
    kiln_graph *g;
    kiln_target t;
} linear_case;

/* A BF16 linear the TMA wgmma kernel takes at 512 tokens on an H200. */
static void make_case(linear_case *c, kiln_format f)
{
    kt_rng r = kt_rng_new(7);
    kt_weight_make(&c->w, &r, f, 4096, 1024);
    c->g = kt_linear_graph(&c->w);
    cr_assert_eq(kiln_target_from_name("h200", &c->t), KILN_OK);
}

static void free_case(linear_case *c)
{
    kiln_graph_destroy(c->g);
    kt_weight_free(&c->w);
}

static kiln_plan *plan_with(linear_case *c, const kiln_tuning *t)
{
    kiln_plan_options o = { .capture = buckets, .n_capture = 1, .tuning = t };
    kiln_plan *p;
    cr_assert_eq(kiln_plan_create(c->g, &c->t, &o, &p), KILN_OK, "%s", kiln_last_error());
    return p;
}

/* The tuning key of p's linear at bucket b: its signature, variant=*. */
static void key_of(const kiln_plan *p, int b, char *key, size_t size, kiln_plan_linear *l)
{
    cr_assert_eq(kiln_plan_linear_at(p, 0, b, l), KILN_OK);
    const char *sig = kiln_plan_signature(p, l->signature);
    const char *v = strstr(sig, " variant=");
    cr_assert_not_null(v);
    const char *end = strchr(v + 1, ' ');
    snprintf(key, size, "%.*s variant=*%s", (int)(v - sig), sig, end);
}

/* Another of the backend's variants than the heuristic's. */
static const char *another(const kiln_plan_linear *l)
{
    static const char *const tma[] = { "tma_bm128bn256", "tma_bm128bn128", "tma_bm64bn256",
                                       "tma_bm64bn128" };
    for (size_t i = 0; i < sizeof tma / sizeof tma[0]; i++)
        if (strcmp(tma[i], l->variant))
            return tma[i];
    return NULL;
}

Test(tuning, a_plan_takes_the_measured_variant)
{
    linear_case c;
    make_case(&c, KILN_FMT_BF16);
    kiln_plan *h = plan_with(&c, NULL);
    const int b512 = kiln_plan_bucket_for(h, 512);
    char key[KILN_SIG_MAX];
    kiln_plan_linear l;
    key_of(h, b512, key, sizeof key, &l);
    cr_assert_str_eq(l.backend, "wgmma");
    cr_assert_eq(l.tuned, 0);
    cr_assert_null(kiln_plan_tuning(h));
    const char *want = another(&l);
    kiln_tuning *t = table();
    set(t, key, 512, want, 5);
    set(t, key, 4096, "tma_bm64bn128", 5); /* a bucket the plan has not: unused */
    kiln_plan *p = plan_with(&c, t);
    kiln_tuning_destroy(t); /* the plan keeps what it used */
    kiln_plan_linear tl;
    cr_assert_eq(kiln_plan_linear_at(p, 0, b512, &tl), KILN_OK);
    cr_assert_str_eq(tl.variant, want);
    cr_assert_eq(tl.tuned, 1);
    cr_assert(strstr(kiln_plan_signature(p, tl.signature), want));
    cr_assert_eq(kiln_plan_linear_at(p, 0, 0, &tl), KILN_OK); /* one token: untouched */
    cr_assert_eq(tl.tuned, 0);
    cr_assert_eq(kiln_tuning_n(kiln_plan_tuning(p)), 1);
    cr_assert_str_eq(variant_at(kiln_plan_tuning(p), key, 512), want);
    cr_assert_null(kiln_plan_warnings(p)[0]);
    kiln_plan_destroy(p);

    /* a variant the backend does not offer: the heuristic's, with a warning */
    t = table();
    set(t, key, 512, "bt256", 5);
    p = plan_with(&c, t);
    cr_assert_eq(kiln_plan_linear_at(p, 0, b512, &tl), KILN_OK);
    cr_assert_str_eq(tl.variant, l.variant);
    cr_assert_eq(tl.tuned, 0);
    cr_assert_not_null(kiln_plan_warnings(p)[0]);
    cr_assert(strstr(kiln_plan_warnings(p)[0], "tuning: variant bt256 for M bucket 512"), "%s",
              kiln_plan_warnings(p)[0]);
    kiln_plan_destroy(p);
    kiln_tuning_destroy(t);
    kiln_plan_destroy(h);
    free_case(&c);
}

/* A bucket's whole step has a key of its own; a table's "serial" for it
 * clears the overlap of every launch of that bucket alone, "overlap" keeps
 * them, anything else warns. The plan keeps the entries it used. */
Test(tuning, a_step_takes_the_measured_launch_policy)
{
    linear_case c, other;
    make_case(&c, KILN_FMT_BF16);
    make_case(&other, KILN_FMT_FP8_TENSOR);
    kiln_plan *h = plan_with(&c, NULL), *h2 = plan_with(&c, NULL), *o = plan_with(&other, NULL);
    cr_assert_eq(kiln_plan_n_buckets(h), 2);
    char key[KILN_SIGNATURE_MAX], again[KILN_SIGNATURE_MAX], elsewhere[KILN_SIGNATURE_MAX];
    cr_assert_eq(kiln_plan_step_key(h, 0, key, sizeof key), KILN_OK, "%s", kiln_last_error());
    cr_assert(!strncmp(key, "step target=sm_90a steps=", 25) && strstr(key, " hash="), "%s", key);
    cr_assert_eq(kiln_plan_step_key(h2, 0, again, sizeof again), KILN_OK);
    cr_assert_str_eq(key, again, "the same step, the same key");
    cr_assert_eq(kiln_plan_step_key(h, 1, again, sizeof again), KILN_OK);
    cr_assert_str_neq(key, again, "another bucket's kernels, another key");
    cr_assert_eq(kiln_plan_step_key(o, 0, elsewhere, sizeof elsewhere), KILN_OK);
    cr_assert_str_neq(key, elsewhere, "another weight format, another key");
    cr_assert_eq(kiln_plan_step_key(h, 2, again, sizeof again), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_plan_step_key(h, 0, again, 64), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_plan_step_policy(h, 0), -1);
    cr_assert_eq(kiln_plan_step_policy(h, 5), -1);
    const int overlap0 = kiln_plan_step_overlaps(h, 0), overlap1 = kiln_plan_step_overlaps(h, 1);
    cr_assert_gt(overlap0, 0, "the decode kernel may overlap the step before it");
    cr_assert_eq(overlap1, 0, "the prefill kernel may not");
    cr_assert_eq(kiln_plan_step_overlaps(h, 2), 0);

    const int64_t m0 = kiln_plan_bucket(h, 0);
    kiln_tuning *t = table();
    set(t, key, m0, "serial", 5);
    kiln_plan *p = plan_with(&c, t);
    cr_assert_eq(kiln_plan_step_policy(p, 0), 1);
    cr_assert_eq(kiln_plan_step_overlaps(p, 0), 0, "serial: no launch overlaps");
    cr_assert_eq(kiln_plan_step_policy(p, 1), -1);
    cr_assert_eq(kiln_plan_step_overlaps(p, 1), overlap1, "the other bucket keeps its overlap");
    cr_assert_str_eq(variant_at(kiln_plan_tuning(p), key, m0), "serial");
    cr_assert_null(kiln_plan_warnings(p)[0]);
    kiln_plan_destroy(p);

    set(t, key, m0, "overlap", 5);
    p = plan_with(&c, t);
    cr_assert_eq(kiln_plan_step_policy(p, 0), 0);
    cr_assert_eq(kiln_plan_step_overlaps(p, 0), overlap0);
    cr_assert_str_eq(variant_at(kiln_plan_tuning(p), key, m0), "overlap");
    kiln_plan_destroy(p);

    set(t, key, m0, "fast", 5);
    p = plan_with(&c, t);
    cr_assert_eq(kiln_plan_step_policy(p, 0), -1);
    cr_assert_eq(kiln_plan_step_overlaps(p, 0), overlap0);
    cr_assert_not_null(kiln_plan_warnings(p)[0]);
    cr_assert(strstr(kiln_plan_warnings(p)[0], "launch policy fast"), "%s",
              kiln_plan_warnings(p)[0]);
    kiln_plan_destroy(p);
    kiln_tuning_destroy(t);
    kiln_plan_destroy(h);
    kiln_plan_destroy(h2);
    kiln_plan_destroy(o);
    free_case(&c);
    free_case(&other);
}

/* Block FP8 sums in a second set of accumulators, which a consumer's 256
 * columns (the 128 x 256 tile) leave no registers for: its candidate list
 * does not name that tile. */
Test(tuning, candidates_are_the_variants_a_backend_can_run)
{
    const kiln_registry *r = kiln_registry_default();
    const kiln_backend *wgmma = kiln_registry_find(r, "wgmma"),
                       *wtc = kiln_registry_find(r, "wgmma_tc"),
                       *gemv = kiln_registry_find(r, "gemv");
    kiln_target t;
    cr_assert_eq(kiln_target_from_name("h200", &t), KILN_OK);
    const char *names[KILN_MAX_CANDIDATES];
    char h[KILN_TUNING_NAME_MAX];
    kiln_linear_cfg bf16 = { .format = KILN_FMT_BF16, .n = 4096, .k = 1024 };
    int n = kiln_backend_candidates(wgmma, &t, &bf16, KILN_ACT_BF16, 512, names,
                                    KILN_MAX_CANDIDATES, h);
    cr_assert_eq(n, 4);
    kiln_linear_cfg block = { .format = KILN_FMT_FP8_BLOCK, .n = 4096, .k = 1024 };
    n = kiln_backend_candidates(wgmma, &t, &block, KILN_ACT_FP8_G128, 512, names,
                                KILN_MAX_CANDIDATES, h);
    cr_assert_eq(n, 3);
    for (int i = 0; i < n; i++)
        cr_assert_str_neq(names[i], "tma_bm128bn256");
    int has_h = 0;
    for (int i = 0; i < n; i++)
        has_h |= !strcmp(names[i], h);
    cr_assert(has_h, "the heuristic's %s is a candidate", h);
    kiln_linear_cfg q4 = { .format = KILN_FMT_Q4_K, .n = 4096, .k = 1024 };
    cr_assert_eq(kiln_backend_candidates(wtc, &t, &q4, KILN_ACT_BF16_TC, 512, names,
                                         KILN_MAX_CANDIDATES, h),
                 6);
    cr_assert_eq(kiln_backend_candidates(wgmma, &t, &q4, KILN_ACT_BF16, 512, names,
                                         KILN_MAX_CANDIDATES, h),
                 2);
    /* no candidates hook: the heuristic's alone */
    cr_assert_eq(kiln_backend_candidates(gemv, &t, &q4, KILN_ACT_BF16, 8, names,
                                         KILN_MAX_CANDIDATES, h),
                 1);
    cr_assert_str_eq(names[0], "m8");
}

/* ---------------------------------------------------------------- cache */

static kiln_cache *open_cache(const char *path, const char *shipped)
{
    kiln_cache *c;
    const char *s[] = { shipped };
    kiln_cache_options o = { .path = path, .no_writable = !path, .shipped = s,
                             .n_shipped = shipped ? 1 : 0 };
    cr_assert_eq(kiln_cache_open(&o, &c), KILN_OK, "%s", kiln_last_error());
    return c;
}

static kiln_tuning *read_tuning(kiln_cache *c)
{
    kiln_tuning *t = table();
    cr_assert_eq(kiln_cache_tuning(c, t), KILN_OK, "%s", kiln_last_error());
    return t;
}

Test(tuning, a_cache_keeps_its_table_and_an_export_carries_the_plans, .init = kt_tmp_setup,
     .fini = kt_tmp_teardown)
{
    setenv("KILN_NVRTC", KT_FAKE_NVRTC, 1);
    unsetenv("KT_FAKE_NVRTC");
    char user[256], ship[256], other[256];
    kt_in_tmp(user, sizeof user, "user.kiln");
    kt_in_tmp(ship, sizeof ship, "ship.kiln");
    kt_in_tmp(other, sizeof other, "other.kiln");
    linear_case lc;
    make_case(&lc, KILN_FMT_BF16);
    kiln_plan *h = plan_with(&lc, NULL);
    char key[KILN_SIG_MAX];
    kiln_plan_linear l;
    key_of(h, kiln_plan_bucket_for(h, 512), key, sizeof key, &l);
    const char *want = another(&l);

    /* stored, replaced, and read back */
    kiln_cache *c = open_cache(user, NULL);
    kiln_tuning *t = read_tuning(c);
    cr_assert_eq(kiln_tuning_n(t), 0, "a new cache has no table");
    kiln_tuning_destroy(t);
    t = table();
    set(t, key, 512, l.variant, 9);
    set(t, SIG, 64, "bm64bn64", 1);
    cr_assert_eq(kiln_cache_store_tuning(c, t), KILN_OK, "%s", kiln_last_error());
    kiln_tuning_destroy(t);
    t = table();
    set(t, key, 512, want, 5);
    cr_assert_eq(kiln_cache_store_tuning(c, t), KILN_OK, "%s", kiln_last_error());
    kiln_tuning_destroy(t);
    t = read_tuning(c);
    cr_assert_eq(kiln_tuning_n(t), 2);
    cr_assert_str_eq(variant_at(t, key, 512), want);
    kiln_tuning_destroy(t);

    /* kiln_compile plans with the cache's table, and stores its kernels */
    kiln_cache_close(c);
    kiln_compile_options co = { .cache.path = user, .quiet = 1,
                                .plan = { .capture = buckets, .n_capture = 1 } };
    kiln_compile_result res;
    cr_assert_eq(kiln_compile(lc.g, &lc.t, &co, &res), KILN_OK, "%s", kiln_last_error());
    c = open_cache(user, NULL);
    kiln_plan *p;
    cr_assert_eq(kiln_plan_create_cached(lc.g, &lc.t, &co.plan, c, &p), KILN_OK, "%s",
                 kiln_last_error());
    kiln_plan_linear tl;
    cr_assert_eq(kiln_plan_linear_at(p, 0, kiln_plan_bucket_for(p, 512), &tl), KILN_OK);
    cr_assert_str_eq(tl.variant, want);
    int missing = -1;
    cr_assert_eq(kiln_cache_check_plan(c, p, NULL, NULL, &missing), KILN_OK);
    cr_assert_eq(missing, 0, "the compile built the tuned plan's kernels");

    /* the export carries the entries the plan used, and no other */
    cr_assert_eq(kiln_cache_export(c, p, ship, 0), KILN_OK, "%s", kiln_last_error());
    kiln_cache_close(c);
    c = open_cache(NULL, ship);
    t = read_tuning(c);
    cr_assert_eq(kiln_tuning_n(t), 1);
    cr_assert_str_eq(variant_at(t, key, 512), want);
    kiln_tuning_destroy(t);
    /* a deployment from the shipped file alone plans the same kernels */
    kiln_plan *d;
    cr_assert_eq(kiln_plan_create_cached(lc.g, &lc.t, &co.plan, c, &d), KILN_OK, "%s",
                 kiln_last_error());
    missing = -1;
    cr_assert_eq(kiln_cache_check_plan(c, d, NULL, NULL, &missing), KILN_OK);
    cr_assert_eq(missing, 0, "offline, every kernel of the deployment's plan is shipped");
    cr_assert_eq(kiln_cache_check_plan(c, h, NULL, NULL, &missing), KILN_OK);
    cr_assert_gt(missing, 0, "the heuristic's plan needs a kernel the file does not hold");
    kiln_plan_destroy(d);
    kiln_cache_close(c);

    /* layers: the shipped file's entries win over the writable cache's */
    c = open_cache(other, NULL);
    t = table();
    set(t, key, 512, l.variant, 1);
    cr_assert_eq(kiln_cache_store_tuning(c, t), KILN_OK);
    kiln_tuning_destroy(t);
    kiln_cache_close(c);
    c = open_cache(other, ship);
    t = read_tuning(c);
    cr_assert_str_eq(variant_at(t, key, 512), want);
    kiln_tuning_destroy(t);
    /* merge adds the source's entries the writable cache lacks, keeps its own */
    cr_assert_eq(kiln_cache_merge(c, user, NULL, NULL, NULL), KILN_OK, "%s", kiln_last_error());
    kiln_cache_close(c);
    c = open_cache(other, NULL);
    t = read_tuning(c);
    cr_assert_eq(kiln_tuning_n(t), 2);
    cr_assert_str_eq(variant_at(t, key, 512), l.variant);
    cr_assert_str_eq(variant_at(t, SIG, 64), "bm64bn64");
    kiln_tuning_destroy(t);
    kiln_cache_close(c);

    /* salvage keeps an intact table */
    char saved[256];
    kt_in_tmp(saved, sizeof saved, "saved.kiln");
    kiln_cache_salvage_result sr;
    cr_assert_eq(kiln_cache_salvage(ship, saved, 0, &sr), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(sr.tuning, 1);
    cr_assert_eq(sr.manifest, 1);
    c = open_cache(NULL, saved);
    t = read_tuning(c);
    cr_assert_str_eq(variant_at(t, key, 512), want);
    kiln_tuning_destroy(t);
    kiln_cache_close(c);

    /* a damaged table is refused by name, never half read; salvage drops it */
    long n;
    char *bytes = kt_read_file(ship, &n);
    cr_assert_not_null(bytes);
    char *at = memmem(bytes, (size_t)n, "KLNT", 4);
    cr_assert_not_null(at);
    char *text = memmem(at, (size_t)(n - (at - bytes)), "variant=*", 9);
    cr_assert_not_null(text);
    text[0] ^= 0x20;
    kt_write_file(ship, bytes, (size_t)n);
    free(bytes);
    c = open_cache(NULL, ship);
    t = table();
    cr_assert_eq(kiln_cache_tuning(c, t), KILN_ERR_CACHE);
    cr_assert(strstr(kiln_last_error(), "ship.kiln: the tuning table is damaged (checksum) "), "%s",
              kiln_last_error());
    kiln_tuning_destroy(t);
    cr_assert_eq(kiln_plan_create_cached(lc.g, &lc.t, &co.plan, c, &d), KILN_ERR_CACHE);
    kiln_cache_close(c);
    cr_assert_eq(kiln_cache_salvage(ship, saved, 1, &sr), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(sr.tuning, 0);
    cr_assert_geq(sr.bad, 1);
    cr_assert_eq(sr.records, (size_t)kiln_plan_n_signatures(p), "every kernel kept");

    kiln_plan_destroy(p);
    kiln_plan_destroy(h);
    free_case(&lc);
}

/* A session (here on the stand-in driver) plans with its cache's table,
 * and kiln_session_plan says which variant each kernel took. */
Test(tuning, a_session_plans_with_its_caches_table, .init = kt_tmp_setup,
     .fini = kt_tmp_teardown, .timeout = 120)
{
    kt_fake_device(NULL);
    linear_case lc;
    make_case(&lc, KILN_FMT_BF16);
    cr_assert_eq(kiln_target_live(0, &lc.t), KILN_OK, "%s", kiln_last_error());
    kiln_plan *h = plan_with(&lc, NULL);
    char key[KILN_SIG_MAX];
    kiln_plan_linear l;
    key_of(h, kiln_plan_bucket_for(h, 512), key, sizeof key, &l);
    const char *want = another(&l);
    char path[256];
    kt_in_tmp(path, sizeof path, "tuned.kiln");
    kiln_cache *c = open_cache(path, NULL);
    kiln_tuning *t = table();
    set(t, key, 512, want, 1);
    cr_assert_eq(kiln_cache_store_tuning(c, t), KILN_OK, "%s", kiln_last_error());
    kiln_tuning_destroy(t);
    kiln_cache_close(c);
    kiln_session_options o = { .cache.path = path, .eager = 1, .quiet = 1,
                                .plan = { .capture = buckets, .n_capture = 1 } };
    kiln_session *s;
    cr_assert_eq(kiln_session_create(lc.g, &o, &s), KILN_OK, "%s", kiln_last_error());
    const kiln_plan *p = kiln_session_plan(s);
    cr_assert_not_null(p);
    kiln_plan_linear tl;
    cr_assert_eq(kiln_plan_linear_at(p, 0, kiln_plan_bucket_for(p, 512), &tl), KILN_OK);
    cr_assert_str_eq(tl.variant, want);
    cr_assert_eq(tl.tuned, 1);
    kiln_session_destroy(s);
    cr_assert_null(kiln_session_plan(NULL));
    kiln_plan_destroy(h);
    free_case(&lc);
}
