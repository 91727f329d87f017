/* The backend matrix: every registered backend that claims a format on the
 * live GPU, forced with strict_backend, on shapes that include the
 * smallest K it takes for the format, the smallest it takes that is not a
 * multiple of 64, N not a multiple of any row tile, and token counts that fill
 * every bucket class and stop one past each. The decode kernels are two
 * backends, each forced on every format it claims: gemv_tc (tensor cores,
 * packed weights) and gemv (f32 FMA, the storage layout), which plans give
 * only what gemv_tc leaves. The test asserts that the plan ran the forced
 * backend and the variant it names for the bucket, that a backend refusing
 * a shape makes the strict plan fail, and that every output lies within
 * the derived bound of tests/util/gpuref.h. Skipped, with the reason, where
 * there is no GPU. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/registry/backend.h"
#include "gpuutil.h"

static char cache_path[256];

/* Bucket classes of every backend: gemv_tc's and gemv's M classes up to
 * 16, wgmma's two tiles (64 and past it), simt's three (16, 64, past
 * them). */
static const int64_t capture[] = { 1, 2, 4, 8, 16, 32, 64, 128, 192 };
#define N_CAPTURE ((int)KILN_ARRAY_LEN(capture))

/* The variant named in signature text ("... variant=tc4 ..."). */
static void signature_variant(const char *sig, char *out, size_t size)
{
    const char *v = strstr(sig, " variant=");
    cr_assert_not_null(v, "signature without a variant: %s", sig);
    v += strlen(" variant=");
    size_t n = strcspn(v, " ");
    cr_assert_lt(n, size);
    memcpy(out, v, n);
    out[n] = '\0';
}

/* The buckets of capture backend b takes for c, into takes; their count. */
static int buckets_taken(const kiln_backend *b, const kiln_target *t, const kiln_linear_cfg *c,
                         int64_t *takes)
{
    int n = 0;
    char why[256];
    for (int i = 0; i < N_CAPTURE; i++)
        if (b->can_implement(t, c, capture[i], why, sizeof why))
            takes[n++] = capture[i];
    return n;
}

/* The matrix's group of an integer group format: one a row, but groups of
 * 32 along K for those with zero points (gemv streams them along K only);
 * integer_groups_along_k_on_every_backend runs the rest. */
static int64_t matrix_group(kiln_format f)
{
    return kiln_format_get(f)->zero_point ? 32 : 0;
}

/* Whether b takes an [n, k] weight of format f in any bucket. */
static int takes_k(const kiln_backend *b, const kiln_target *t, kiln_format f, int64_t k)
{
    kiln_linear_cfg cfg = { .format = f, .n = 136, .k = k, .epilogue = KILN_EPI_BIAS,
                            .group = matrix_group(f) };
    int64_t takes[N_CAPTURE];
    return buckets_taken(b, t, &cfg, takes) > 0;
}

/* The K values to run b on for format f: the smallest it takes, the
 * smallest it takes that is not a multiple of 64 (where there is one up to
 * 1024), and one of several 64-wide steps; *refused gets the smallest K of
 * the format it refuses (0: none up to 1024). Returns the count. */
static int k_values(const kiln_backend *b, const kiln_target *t, kiln_format f, int64_t *ks,
                    int64_t *refused)
{
    const int64_t km = kiln_format_get(f)->k_multiple, g = matrix_group(f);
    const int64_t step = km < 16 ? (g > 16 ? g : 16) : km;
    int n = 0;
    *refused = 0;
    for (int64_t k = step; k <= 1024; k += step) {
        int took = takes_k(b, t, f, k);
        if (!took && !*refused)
            *refused = k;
        if (took && (n == 0 || (n == 1 && k % 64)))
            ks[n++] = k;
    }
    const int64_t many = km >= 256 ? 768 : 576;
    if (takes_k(b, t, f, many) && (n == 0 || ks[n - 1] != many))
        ks[n++] = many;
    return n;
}

/* Buckets each registered backend ran, by its index in the registry. */
typedef struct ran_buckets {
    int n[KILN_MAX_BACKENDS];
} ran_buckets;

/* The count of backend `name` in ran. */
static int ran_of(const ran_buckets *ran, const char *name)
{
    const kiln_registry *reg = kiln_registry_default();
    for (int i = 0; i < reg->n; i++)
        if (!strcmp(reg->backends[i]->name, name))
            return ran->n[i];
    cr_assert_fail("backend %s is not registered", name);
    return 0;
}

/* One (backend, format, K) case on target live: the strict plan runs the
 * backend and the variant it names in every bucket it takes, or fails
 * where it takes none; with run, a session on the GPU checks every output.
 * Returns 1 when the backend took the case; *ran counts its buckets. */
static int run_case(const kiln_backend *b, const kiln_target *live, kiln_format f, int64_t k,
                    int run, kt_rng *r, int *ran)
{
    const int64_t n = 136; /* 8.5 tiles of 16, 2.1 of 64, 1.1 of 128 */
    const char *fname = kiln_format_get(f)->name;
    kt_weight w;
    kt_weight_make_group(&w, r, f, n, k, matrix_group(f));
    kiln_graph *g = kt_linear_graph(&w);
    kiln_linear_cfg cfg = { .format = f, .n = n, .k = k, .epilogue = KILN_EPI_BIAS,
                            .group = matrix_group(f) };
    int64_t takes[N_CAPTURE];
    int nb = buckets_taken(b, live, &cfg, takes);
    if (nb == 0) {
        /* Refused everywhere: a strict plan must fail and name the backend. */
        kiln_plan_options po = { .backend = b->name, .strict_backend = 1, .capture = capture,
                                 .n_capture = N_CAPTURE };
        kiln_plan *p = NULL;
        kiln_status st = kiln_plan_create(g, live, &po, &p);
        cr_assert_eq(st, KILN_ERR_NO_KERNEL,
                     "%s %s K=%lld: strict plan gave %s for a refused shape", b->name, fname,
                     (long long)k, kiln_strerror(st));
        cr_assert(strstr(kiln_last_error(), b->name), "%s", kiln_last_error());
        kiln_plan_destroy(p);
        kiln_graph_destroy(g);
        kt_weight_free(&w);
        return 0;
    }
    kiln_plan_options po = { .backend = b->name, .strict_backend = 1, .capture = takes,
                             .n_capture = nb };
    kiln_session_options o = { .cache.path = cache_path, .quiet = 1, .plan = po };
    kiln_session *s = NULL;
    kiln_plan *own = NULL;
    const kiln_plan *p;
    if (run) {
        s = kt_session_create(g, &o);
        p = kt_session_plan(s);
    } else {
        cr_assert_eq(kiln_plan_create(g, live, &po, &own), KILN_OK, "%s", kiln_last_error());
        p = own;
    }
    double worst = 0;
    for (int i = 0; i < nb; i++) {
        /* the bucket full, and one token past the bucket below it */
        const int64_t ms[] = { takes[i], i ? takes[i - 1] + 1 : takes[i] };
        int bucket = kiln_plan_bucket_for(p, takes[i]);
        kiln_plan_linear l;
        cr_assert_eq(kiln_plan_linear_at(p, 0, bucket, &l), KILN_OK);
        cr_assert_str_eq(l.backend, b->name, "%s K=%lld bucket %lld", fname, (long long)k,
                         (long long)takes[i]);
        char got[64], want[64];
        signature_variant(kiln_plan_signature(p, l.signature), got, sizeof got);
        kiln_backend_variant(b, live, &cfg, takes[i], want, sizeof want);
        cr_assert_str_eq(got, want, "%s %s K=%lld bucket %lld", b->name, fname, (long long)k,
                         (long long)takes[i]);
        ++*ran;
        for (size_t j = 0; run && j < KILN_ARRAY_LEN(ms); j++) {
            char what[96];
            snprintf(what, sizeof what, "%s %s %lldx%lld variant %s", b->name, fname,
                     (long long)n, (long long)k, got);
            double q = kt_check_session(s, g, ms[j], r, what, NULL);
            worst = q > worst ? q : worst;
        }
    }
    if (run)
        fprintf(stderr, "%-7s %-12s %lldx%-4lld %d buckets: |gpu-ref| <= %.2f of the bound\n",
                b->name, fname, (long long)n, (long long)k, nb, worst);
    kt_session_destroy(s);
    kiln_plan_destroy(own);
    kiln_graph_destroy(g);
    kt_weight_free(&w);
    return 1;
}

/* Whether the comma-separated list in the environment variable var (unset
 * or empty: everything) names name: a sanitizer too slow for the whole
 * matrix within one run takes it a few backends (KT_BACKENDS) or formats
 * (KT_FORMATS) at a time. */
static int listed(const char *var, const char *name)
{
    const char *list = getenv(var);
    if (!list || !*list)
        return 1;
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
            return 1;
    return 0;
}

static int selected(const kiln_backend *b)
{
    return listed("KT_BACKENDS", b->name);
}

/* The matrix on target t, of format only (-1: every format); returns the
 * cases the backends took, and counts each backend's buckets in *ran. */
static int matrix(const kiln_target *t, int only, int run, kt_rng *r, ran_buckets *ran)
{
    const kiln_registry *reg = kiln_registry_default();
    int cases = 0;
    for (int bi = 0; bi < reg->n; bi++) {
        const kiln_backend *b = reg->backends[bi];
        char why[256];
        if (run && !selected(b)) {
            fprintf(stderr, "%s: not in KT_BACKENDS=%s, not run\n", b->name, getenv("KT_BACKENDS"));
            continue;
        }
        if (!b->is_supported(t, why, sizeof why)) {
            fprintf(stderr, "%s on %s: %s\n", b->name, t->name, why);
            continue;
        }
        for (int f = 0; f < KILN_FMT_COUNT; f++) {
            if (!(b->formats & (1u << f)) || (only >= 0 && f != only))
                continue;
            if (run && !listed("KT_FORMATS", kiln_format_get((kiln_format)f)->name)) {
                fprintf(stderr, "%s %s: not in KT_FORMATS=%s, not run\n", b->name,
                        kiln_format_get((kiln_format)f)->name, getenv("KT_FORMATS"));
                continue;
            }
            int64_t ks[3], refused;
            int nk = k_values(b, t, (kiln_format)f, ks, &refused), took = 0;
            for (int i = 0; i < nk; i++)
                took += run_case(b, t, (kiln_format)f, ks[i], run, r, &ran->n[bi]);
            cr_assert_gt(took, 0, "%s claims %s on %s but took none of its shapes", b->name,
                         kiln_format_get((kiln_format)f)->name, t->name);
            if (refused)
                cr_assert_eq(run_case(b, t, (kiln_format)f, refused, run, r, &ran->n[bi]), 0);
            cases += took;
        }
    }
    return cases;
}

/* The plans alone, on named targets of each generation: no GPU needed. */
Test(gpu_backends, strict_plans_run_the_forced_backend_on_named_targets)
{
    kt_rng r = kt_rng_new(40);
    static const char *const names[] = { "sm_75", "a100", "l40s", "h200" };
    for (size_t i = 0; i < KILN_ARRAY_LEN(names); i++) {
        kiln_target t;
        cr_assert_eq(kiln_target_from_name(names[i], &t), KILN_OK, "%s", kiln_last_error());
        ran_buckets ran = { { 0 } };
        cr_assert_gt(matrix(&t, -1, 0, &r, &ran), 0);
        cr_assert_gt(ran_of(&ran, "gemv"), 0, "%s: gemv in no bucket", names[i]);
        cr_assert_gt(ran_of(&ran, "simt"), 0, "%s: simt in no bucket", names[i]);
        cr_assert(t.mma_bf16 ? ran_of(&ran, "gemv_tc") > 0 : ran_of(&ran, "gemv_tc") == 0,
                  "%s: gemv_tc in %d buckets", names[i], ran_of(&ran, "gemv_tc"));
        cr_assert(t.wgmma ? ran_of(&ran, "wgmma") > 0 : ran_of(&ran, "wgmma") == 0,
                  "%s: wgmma in %d buckets", names[i], ran_of(&ran, "wgmma"));
    }
}

/* The matrix runs the integer group formats mostly with one group per row;
 * here each backend that takes them runs them in groups along K, against the
 * CPU reference, in its bucket classes, with an N of no whole tile. */
Test(gpu_backends, integer_groups_along_k_on_every_backend, .timeout = 600)
{
    kt_need_gpu();
    kt_fresh_cache(cache_path, sizeof cache_path);
    kiln_target live;
    cr_assert_eq(kiln_target_live(0, &live), KILN_OK, "%s", kiln_last_error());
    kt_rng r = kt_rng_new(42);
    static const kiln_format fmts[] = { KILN_FMT_INT4_GROUP, KILN_FMT_INT4_GROUP_ZP,
                                        KILN_FMT_INT8_GROUP, KILN_FMT_INT8_GROUP_ZP };
    static const int64_t groups[] = { 32, 128 };
    static const int64_t decode[] = { 1, 4, 16 }, any[] = { 1, 17, 192 };
    const kiln_registry *reg = kiln_registry_default();
    int ran = 0;
    for (int bi = 0; bi < reg->n; bi++) {
        const kiln_backend *b = reg->backends[bi];
        char why[256];
        if (!b->is_supported(&live, why, sizeof why))
            continue;
        const int small = !strcmp(b->name, "gemv");
        const int64_t *ms = small ? decode : any;
        for (size_t i = 0; i < KILN_ARRAY_LEN(fmts); i++)
            for (size_t j = 0; j < KILN_ARRAY_LEN(groups) && (b->formats & (1u << fmts[i])); j++) {
                kt_weight w;
                kt_weight_make_group(&w, &r, fmts[i], 137, 512, groups[j]);
                kiln_graph *g = kt_linear_graph(&w);
                kiln_plan_options po = { .backend = b->name, .strict_backend = 1,
                                         .capture = ms, .n_capture = 3 };
                kiln_session_options o = { .cache.path = cache_path, .quiet = 1, .plan = po };
                kiln_session *s = kt_session_create(g, &o);
                for (size_t m = 0; m < 3; m++) {
                    char what[96];
                    snprintf(what, sizeof what, "%s %s group %lld M=%lld", b->name,
                             kiln_format_get(fmts[i])->name, (long long)groups[j],
                             (long long)ms[m]);
                    kt_check_session(s, g, ms[m], &r, what, NULL);
                }
                ran++;
                kt_session_destroy(s);
                kiln_graph_destroy(g);
                kt_weight_free(&w);
            }
    }
    cr_assert_geq(ran, 8, "simt at least runs every format and group");
}

/* The matrix on the GPU for format f; KT_BACKENDS and KT_FORMATS narrow
 * it. */
static void matrix_one(const kiln_target *live, int f)
{
    const char *fname = kiln_format_get((kiln_format)f)->name;
    if (!listed("KT_FORMATS", fname)) {
        fprintf(stderr, "%s: not in KT_FORMATS=%s, not run\n", fname, getenv("KT_FORMATS"));
        return;
    }
    kt_rng r = kt_rng_new(4100 + (uint64_t)f);
    ran_buckets ran = { { 0 } };
    int cases = matrix(live, f, 1, &r, &ran);
    const kiln_registry *reg = kiln_registry_default();
    fprintf(stderr, "%s: %d (backend, K) cases; buckets:", fname, cases);
    for (int i = 0; i < reg->n; i++)
        fprintf(stderr, " %s %d", reg->backends[i]->name, ran.n[i]);
    fprintf(stderr, "\n");
    for (int i = 0; i < reg->n; i++) {
        const kiln_backend *b = reg->backends[i];
        char why[256];
        if (selected(b) && (b->formats >> f & 1) && b->is_supported(live, why, sizeof why))
            cr_assert_gt(ran.n[i], 0, "%s %s ran in no bucket", b->name, fname);
    }
}

static void matrix_part(int part)
{
    kt_need_gpu();
    kt_fresh_cache(cache_path, sizeof cache_path);
    kiln_target live;
    cr_assert_eq(kiln_target_live(0, &live), KILN_OK, "%s", kiln_last_error());
    for (int f = part; f < KILN_FMT_COUNT; f += KT_PARTS)
        matrix_one(&live, f);
}

/* The matrix on the GPU in KT_PARTS tests, a share of the formats each. */
Test(gpu_backends, every_backend_and_format_on_every_bucket_class_1, .timeout = 1200)
{
    matrix_part(0);
}

Test(gpu_backends, every_backend_and_format_on_every_bucket_class_2, .timeout = 1200)
{
    matrix_part(1);
}

Test(gpu_backends, every_backend_and_format_on_every_bucket_class_3, .timeout = 1200)
{
    matrix_part(2);
}

Test(gpu_backends, every_backend_and_format_on_every_bucket_class_4, .timeout = 1200)
{
    matrix_part(3);
}

/* KT_BACKENDS and KT_FORMATS, which a sanitizer run sets, select some case
 * the GPU runs: a misspelt name does not make the matrix pass empty. */
Test(gpu_backends, every_selection_holds_a_case)
{
    kt_need_gpu();
    kiln_target live;
    cr_assert_eq(kiln_target_live(0, &live), KILN_OK, "%s", kiln_last_error());
    const kiln_registry *reg = kiln_registry_default();
    int cases = 0;
    for (int i = 0; i < reg->n; i++) {
        const kiln_backend *b = reg->backends[i];
        char why[256];
        if (!selected(b) || !b->is_supported(&live, why, sizeof why))
            continue;
        for (int f = 0; f < KILN_FMT_COUNT; f++) {
            int64_t ks[3], refused;
            if ((b->formats >> f & 1) && listed("KT_FORMATS", kiln_format_get((kiln_format)f)->name))
                cases += k_values(b, &live, (kiln_format)f, ks, &refused);
        }
    }
    cr_assert_gt(cases, 0, "KT_BACKENDS=%s KT_FORMATS=%s select no case the GPU runs",
                 getenv("KT_BACKENDS") ? getenv("KT_BACKENDS") : "",
                 getenv("KT_FORMATS") ? getenv("KT_FORMATS") : "");
}
