/* Lowering: backend selection by capability checks (in the spirit of vLLM's
 * kernel-selection tests), token buckets, signature de-duplication, the
 * inserted activation-quantization steps, epilogue fusion and the memory
 * plan. The backends here are test-only rows with the capability rules of
 * the real ones, so selection is tested apart from any kernel. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "codegen/plan.h"

/* ---------------------------------------------------- test-only backends */

#define ALL_FORMATS ((1u << KILN_FMT_COUNT) - 1)
#define FP_FORMATS                                                                              \
    ((1u << KILN_FMT_BF16) | (1u << KILN_FMT_F16) | (1u << KILN_FMT_FP8_TENSOR) |              \
     (1u << KILN_FMT_FP8_CHANNEL) | (1u << KILN_FMT_FP8_BLOCK) | (1u << KILN_FMT_MXFP8) |      \
     (1u << KILN_FMT_NVFP4) | (1u << KILN_FMT_MXFP4))

static int any_target(const kiln_target *t, char *why, size_t n)
{
    (void)t, (void)why, (void)n;
    return 1;
}

static int needs_wgmma(const kiln_target *t, char *why, size_t n)
{
    if (!t->wgmma)
        snprintf(why, n, "needs wgmma (sm_90a), target is %s", t->name);
    return t->wgmma;
}

static int needs_mma(const kiln_target *t, char *why, size_t n)
{
    if (!t->mma_bf16)
        snprintf(why, n, "needs mma.sync (sm_80+), target is %s", t->name);
    return t->mma_bf16;
}

static int small_m(const kiln_target *t, const kiln_linear_cfg *c, int64_t m, char *why, size_t n)
{
    (void)t, (void)c;
    if (m > 16)
        snprintf(why, n, "M bucket %lld > 16", (long long)m);
    return m <= 16;
}

static int any_shape(const kiln_target *t, const kiln_linear_cfg *c, int64_t m, char *why,
                     size_t n)
{
    (void)t, (void)c, (void)m, (void)why, (void)n;
    return 1;
}

static int tile_shape(const kiln_target *t, const kiln_linear_cfg *c, int64_t m, char *why,
                      size_t n)
{
    (void)t, (void)m;
    if (c->format == KILN_FMT_FP8_BLOCK && (c->n % 128 || c->k % 128)) {
        snprintf(why, n, "block FP8 needs N and K multiples of 128, got N=%lld K=%lld",
                 (long long)c->n, (long long)c->k);
        return 0;
    }
    return 1;
}

static kiln_act wgmma_act(const kiln_target *t, const kiln_linear_cfg *c, int64_t m)
{
    (void)t, (void)m;
    switch (c->format) {
    case KILN_FMT_FP8_BLOCK: return KILN_ACT_FP8_G128;
    case KILN_FMT_FP8_TENSOR:
    case KILN_FMT_FP8_CHANNEL: return KILN_ACT_FP8_TOKEN;
    default: return KILN_ACT_BF16;
    }
}

static void gemv_variant(const kiln_target *t, const kiln_linear_cfg *c, int64_t m, char *buf,
                         size_t n)
{
    (void)t, (void)c;
    snprintf(buf, n, "m%d", m <= 1 ? 1 : m <= 4 ? 4 : 16);
}

static void tile_variant(const kiln_target *t, const kiln_linear_cfg *c, int64_t m, char *buf,
                         size_t n)
{
    (void)t, (void)c;
    snprintf(buf, n, "%s", m <= 64 ? "64x128" : "128x128");
}

static const kiln_backend t_gemv = { .name = "gemv", .formats = ALL_FORMATS,
                                     .epilogues = KILN_EPI_BIAS | KILN_EPI_RESIDUAL,
                                     .is_supported = any_target, .can_implement = small_m,
                                     .variant = gemv_variant };
static const kiln_backend t_wgmma = { .name = "wgmma", .formats = FP_FORMATS,
                                      .epilogues = KILN_EPI_BIAS | KILN_EPI_RESIDUAL |
                                                   KILN_EPI_SILU_MUL,
                                      .is_supported = needs_wgmma, .can_implement = tile_shape,
                                      .act = wgmma_act, .variant = tile_variant };
static const kiln_backend t_mma = { .name = "mma", .formats = ALL_FORMATS,
                                    .epilogues = KILN_EPI_BIAS | KILN_EPI_RESIDUAL,
                                    .is_supported = needs_mma, .can_implement = tile_shape,
                                    .variant = tile_variant };
static const kiln_backend t_simt = { .name = "simt", .formats = ALL_FORMATS,
                                     .epilogues = KILN_EPI_BIAS, .is_supported = any_target,
                                     .can_implement = any_shape };

/* Each format's list names the backends that claim it, as the default
 * registry's do: wgmma's only in the lists of FP_FORMATS. */
#define FP_LIST { "gemv", "wgmma", "mma", "simt", NULL }
#define INT_LIST { "gemv", "mma", "simt", NULL }
static kiln_registry reg = {
    .backends = { &t_gemv, &t_wgmma, &t_mma, &t_simt },
    .n = 4,
    .priority = {
        [KILN_FMT_F32] = INT_LIST, [KILN_FMT_F16] = FP_LIST, [KILN_FMT_BF16] = FP_LIST,
        [KILN_FMT_FP8_TENSOR] = FP_LIST, [KILN_FMT_FP8_CHANNEL] = FP_LIST,
        [KILN_FMT_FP8_BLOCK] = FP_LIST, [KILN_FMT_MXFP8] = FP_LIST,
        [KILN_FMT_NVFP4] = FP_LIST, [KILN_FMT_MXFP4] = FP_LIST, [KILN_FMT_Q8_0] = INT_LIST,
        [KILN_FMT_Q4_0] = INT_LIST, [KILN_FMT_Q4_K] = INT_LIST, [KILN_FMT_Q6_K] = INT_LIST,
        [KILN_FMT_GGML_MXFP4] = INT_LIST, [KILN_FMT_Q5_0] = INT_LIST, [KILN_FMT_Q5_1] = INT_LIST,
        [KILN_FMT_Q2_K] = INT_LIST, [KILN_FMT_Q3_K] = INT_LIST, [KILN_FMT_Q5_K] = INT_LIST,
        [KILN_FMT_IQ4_NL] = INT_LIST, [KILN_FMT_IQ4_XS] = INT_LIST, [KILN_FMT_Q4_1] = INT_LIST,
        [KILN_FMT_INT4_GROUP] = INT_LIST,
        [KILN_FMT_INT4_GROUP_ZP] = INT_LIST, [KILN_FMT_INT8_GROUP] = INT_LIST,
        [KILN_FMT_INT8_GROUP_ZP] = INT_LIST,
    },
};

/* --------------------------------------------------------------- graphs */

static char dummy[16]; /* planning never reads weight bytes */

static kiln_target target(const char *name)
{
    kiln_target t;
    cr_assert_eq(kiln_target_from_name(name, &t), KILN_OK);
    return t;
}

static kiln_tensor *weight(kiln_graph *g, const char *name, kiln_format f, int64_t n, int64_t k)
{
    kiln_qtensor q = { .format = f, .n = n, .k = k, .data = dummy, .scale = dummy };
    kiln_tensor *w;
    cr_assert_eq(kiln_graph_weight(g, name, &q, &w), KILN_OK, "%s", kiln_last_error());
    return w;
}

/* One linear per format, each with its own input and output. */
static kiln_graph *one_linear_per_format(int64_t n, int64_t k)
{
    kiln_graph *g;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    for (int f = KILN_FMT_F16; f < KILN_FMT_COUNT; f++) {
        char name[64];
        kiln_tensor *x, *y;
        snprintf(name, sizeof name, "x.%d", f);
        cr_assert_eq(kiln_graph_input(g, name, k, &x), KILN_OK);
        snprintf(name, sizeof name, "w.%s", kiln_format_get((kiln_format)f)->name);
        kiln_tensor *w = weight(g, name, (kiln_format)f, n, k);
        snprintf(name, sizeof name, "y.%s", kiln_format_get((kiln_format)f)->name);
        cr_assert_eq(kiln_graph_linear(g, name, x, w, NULL, &y), KILN_OK, "%s", kiln_last_error());
        cr_assert_eq(kiln_graph_output(g, y), KILN_OK);
    }
    return g;
}

/* A gated FFN block: x + down(silu(gate(rms(x))) * up(rms(x))). */
static kiln_graph *ffn(kiln_format f, int layers, int64_t d, int64_t h)
{
    static float ones[1 << 14];
    for (size_t i = 0; i < sizeof ones / sizeof ones[0]; i++)
        ones[i] = 1.0f;
    kiln_graph *g;
    kiln_tensor *x, *norm, *hh, *gate, *up, *act, *prod, *down;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    cr_assert_eq(kiln_graph_input(g, "x", d, &x), KILN_OK);
    for (int l = 0; l < layers; l++) {
        char n[64];
        snprintf(n, sizeof n, "norm.%d", l);
        cr_assert_eq(kiln_graph_param(g, n, d, ones, &norm), KILN_OK);
        snprintf(n, sizeof n, "gate.%d.w", l);
        kiln_tensor *wg = weight(g, n, f, h, d);
        snprintf(n, sizeof n, "up.%d.w", l);
        kiln_tensor *wu = weight(g, n, f, h, d);
        snprintf(n, sizeof n, "down.%d.w", l);
        kiln_tensor *wd = weight(g, n, f, d, h);
        cr_assert_eq(kiln_graph_rms_norm(g, NULL, x, norm, 1e-5f, &hh), KILN_OK);
        snprintf(n, sizeof n, "gate.%d", l);
        cr_assert_eq(kiln_graph_linear(g, n, hh, wg, NULL, &gate), KILN_OK);
        snprintf(n, sizeof n, "up.%d", l);
        cr_assert_eq(kiln_graph_linear(g, n, hh, wu, NULL, &up), KILN_OK);
        cr_assert_eq(kiln_graph_silu(g, NULL, gate, &act), KILN_OK);
        cr_assert_eq(kiln_graph_mul(g, NULL, act, up, &prod), KILN_OK);
        snprintf(n, sizeof n, "down.%d", l);
        cr_assert_eq(kiln_graph_linear(g, n, prod, wd, NULL, &down), KILN_OK);
        cr_assert_eq(kiln_graph_add(g, NULL, x, down, &x), KILN_OK);
    }
    cr_assert_eq(kiln_graph_output(g, x), KILN_OK);
    return g;
}

static kiln_plan *plan(kiln_graph *g, const char *tname, const kiln_plan_options *o)
{
    kiln_target t = target(tname);
    kiln_plan *p = NULL;
    kiln_status st = kiln_plan_create_with(&reg, g, &t, o, &p);
    cr_assert_eq(st, KILN_OK, "%s", kiln_last_error());
    return p;
}

static kiln_plan_linear linear_at(const kiln_plan *p, int i, int64_t m)
{
    kiln_plan_linear l;
    int b = kiln_plan_bucket_for(p, m);
    cr_assert_geq(b, 0);
    cr_assert_eq(kiln_plan_bucket(p, b), m, "bucket %lld exists", (long long)m);
    cr_assert_eq(kiln_plan_linear_at(p, i, b, &l), KILN_OK);
    return l;
}

/* ------------------------------------------------------------- priority */

Test(lower, priority_per_format_and_target)
{
    kiln_graph *g = one_linear_per_format(256, 512);
    struct { const char *target; int64_t m; const char *fp, *q; } want[] = {
        { "sm_90a", 1, "gemv", "gemv" },   { "sm_90a", 16, "gemv", "gemv" },
        { "sm_90a", 32, "wgmma", "mma" },  { "sm_90a", 512, "wgmma", "mma" },
        { "sm_80", 512, "mma", "mma" },    { "sm_75", 512, "simt", "simt" },
        { "sm_75", 1, "gemv", "gemv" },
    };
    for (size_t c = 0; c < sizeof want / sizeof want[0]; c++) {
        kiln_plan *p = plan(g, want[c].target, NULL);
        for (int i = 0; i < kiln_plan_n_linears(p); i++) {
            kiln_plan_linear l = linear_at(p, i, want[c].m);
            const char *expect = FP_FORMATS & (1u << l.format) ? want[c].fp : want[c].q;
            cr_assert_str_eq(l.backend, expect, "%s on %s, M=%lld: got %s (refused: %s)",
                             l.node, want[c].target, (long long)want[c].m, l.backend, l.refused);
        }
        kiln_plan_destroy(p);
    }
    kiln_graph_destroy(g);
}

/* Selection reads the format's own list: a backend that could take a
 * linear but is not in its format's list is never chosen for it, nor named
 * among the refusals, unless --backend forces it. */
Test(lower, a_format_list_is_the_policy)
{
    kiln_registry own = reg;
    static const char *const bf16_list[] = { "gemv", "wgmma", "simt", NULL };
    memcpy(own.priority[KILN_FMT_BF16], bf16_list, sizeof bf16_list);
    kiln_graph *g = one_linear_per_format(256, 512);
    kiln_target t = target("sm_80");
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_plan_create_with(&own, g, &t, NULL, &p), KILN_OK, "%s", kiln_last_error());
    for (int i = 0; i < kiln_plan_n_linears(p); i++) {
        kiln_plan_linear l = linear_at(p, i, 512);
        cr_assert_str_eq(l.backend, l.format == KILN_FMT_BF16 ? "simt" : "mma", "%s", l.node);
        if (l.format == KILN_FMT_BF16)
            cr_assert_str_eq(l.refused, "gemv: M bucket 512 > 16; wgmma: needs wgmma (sm_90a), "
                                        "target is sm_80");
    }
    kiln_plan_destroy(p);
    cr_assert_eq(kiln_plan_create_with(&own, g, &t, &(kiln_plan_options){ .backend = "mma" }, &p),
                 KILN_OK, "%s", kiln_last_error());
    for (int i = 0; i < kiln_plan_n_linears(p); i++)
        cr_assert_str_eq(linear_at(p, i, 512).backend, "mma", "%s", linear_at(p, i, 512).node);
    kiln_plan_destroy(p);
    kiln_graph_destroy(g);
}

Test(lower, refusals_are_recorded_in_priority_order)
{
    kiln_graph *g = one_linear_per_format(256, 512);
    kiln_plan *p = plan(g, "sm_75", NULL);
    kiln_plan_linear l = linear_at(p, 0, 512);
    cr_assert_str_eq(l.backend, "simt");
    cr_assert_str_eq(l.refused, "gemv: M bucket 512 > 16; wgmma: needs wgmma (sm_90a), target is "
                                "sm_75; mma: needs mma.sync (sm_80+), target is sm_75");
    l = linear_at(p, 0, 1);
    cr_assert_str_empty(l.refused, "the first choice refuses nothing");
    kiln_plan_destroy(p);
    kiln_graph_destroy(g);
}

Test(lower, can_implement_constraints_move_to_the_next_backend)
{
    kiln_graph *g = one_linear_per_format(200, 512); /* N not a multiple of 128 */
    kiln_plan *p = plan(g, "sm_90a", NULL);
    for (int i = 0; i < kiln_plan_n_linears(p); i++) {
        kiln_plan_linear l = linear_at(p, i, 512);
        if (l.format == KILN_FMT_FP8_BLOCK) {
            cr_assert_str_eq(l.backend, "simt", "wgmma and mma refuse block FP8 at N=200");
            cr_assert(strstr(l.refused, "wgmma: block FP8 needs N and K multiples of 128, got "
                                        "N=200 K=512"), "%s", l.refused);
        } else if (FP_FORMATS & (1u << l.format)) {
            cr_assert_str_eq(l.backend, "wgmma");
        }
    }
    kiln_plan_destroy(p);
    kiln_graph_destroy(g);
}

/* ------------------------------------------------------- --backend */

Test(lower, explicit_backend_is_used_everywhere_it_can)
{
    kiln_graph *g = one_linear_per_format(256, 512);
    kiln_plan *p = plan(g, "sm_90a", &(kiln_plan_options){ .backend = "simt" });
    for (int i = 0; i < kiln_plan_n_linears(p); i++)
        for (int b = 0; b < kiln_plan_n_buckets(p); b++) {
            kiln_plan_linear l;
            cr_assert_eq(kiln_plan_linear_at(p, i, b, &l), KILN_OK);
            cr_assert_str_eq(l.backend, "simt");
            cr_assert_not(l.fell_back);
        }
    cr_assert_null(kiln_plan_warnings(p)[0], "no warning when the backend takes everything");
    kiln_plan_destroy(p);
    kiln_graph_destroy(g);
}

Test(lower, fallback_warns_once_per_layer_type)
{
    /* wgmma has no kernel for q4_k: 8 q4_k linears x 10 buckets fall back
     * with one warning; the bf16 layers take wgmma. */
    kiln_graph *g;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    for (int i = 0; i < 16; i++) {
        char n[32];
        kiln_tensor *x, *y;
        kiln_format f = i % 2 ? KILN_FMT_Q4_K : KILN_FMT_BF16;
        snprintf(n, sizeof n, "x%d", i);
        cr_assert_eq(kiln_graph_input(g, n, 512, &x), KILN_OK);
        snprintf(n, sizeof n, "w%d", i);
        kiln_tensor *w = weight(g, n, f, 256, 512);
        cr_assert_eq(kiln_graph_linear(g, NULL, x, w, NULL, &y), KILN_OK);
        cr_assert_eq(kiln_graph_output(g, y), KILN_OK);
    }
    kiln_plan *p = plan(g, "sm_90a", &(kiln_plan_options){ .backend = "wgmma" });
    const char *const *w = kiln_plan_warnings(p);
    cr_assert_not_null(w[0]);
    cr_assert_null(w[1], "one warning, got a second: %s", w[1]);
    cr_assert(strstr(w[0], "backend wgmma cannot take q4_k linears"), "%s", w[0]);
    for (int i = 0; i < kiln_plan_n_linears(p); i++) {
        kiln_plan_linear l = linear_at(p, i, 1);
        if (l.format == KILN_FMT_Q4_K) {
            cr_assert(l.fell_back);
            cr_assert_str_eq(l.backend, "gemv", "normal selection decides");
        } else {
            cr_assert_not(l.fell_back);
            cr_assert_str_eq(l.backend, "wgmma", "the forced backend beats gemv at M=1");
        }
    }
    kiln_plan_destroy(p);
    kiln_graph_destroy(g);
}

/* With kiln's own registry: gemv_tc has no kernel for the integer groups,
 * so --backend gemv_tc falls back for their layers, with one warning, in
 * every bucket: to gemv for decode, to wgmma past it on Hopper; the group
 * reaches the signature. */
Test(lower, integer_groups_fall_back_with_one_warning)
{
    static const char *const forced[] = { "gemv_tc" };
    for (size_t b = 0; b < KILN_ARRAY_LEN(forced); b++) {
        kiln_graph *g;
        cr_assert_eq(kiln_graph_create(&g), KILN_OK);
        for (int i = 0; i < 4; i++) {
            char n[32];
            kiln_tensor *x, *y, *w;
            snprintf(n, sizeof n, "x%d", i);
            cr_assert_eq(kiln_graph_input(g, n, 512, &x), KILN_OK);
            kiln_qtensor q = { .format = KILN_FMT_INT4_GROUP_ZP, .n = 256, .k = 512,
                               .data = dummy, .scale = dummy, .group = 128 };
            snprintf(n, sizeof n, "w%d", i);
            cr_assert_eq(kiln_graph_weight(g, n, &q, &w), KILN_OK, "%s", kiln_last_error());
            cr_assert_eq(kiln_graph_linear(g, NULL, x, w, NULL, &y), KILN_OK);
            cr_assert_eq(kiln_graph_output(g, y), KILN_OK);
        }
        kiln_target t = target("h200");
        kiln_plan *p = NULL;
        cr_assert_eq(kiln_plan_create(g, &t, &(kiln_plan_options){ .backend = forced[b] }, &p),
                     KILN_OK, "%s", kiln_last_error());
        const char *const *w = kiln_plan_warnings(p);
        cr_assert_not_null(w[0], "%s", forced[b]);
        cr_assert_null(w[1], "one warning, got a second: %s", w[1]);
        cr_assert(strstr(w[0], "int4_group_zp"), "%s", w[0]);
        for (int i = 0; i < kiln_plan_n_linears(p); i++)
            for (int bk = 0; bk < kiln_plan_n_buckets(p); bk++) {
                kiln_plan_linear l;
                cr_assert_eq(kiln_plan_linear_at(p, i, bk, &l), KILN_OK);
                cr_assert(l.fell_back);
                cr_assert_str_eq(l.backend, kiln_plan_bucket(p, bk) <= 16 ? "gemv" : "wgmma");
                cr_assert(strstr(kiln_plan_signature(p, l.signature), " scales=f32:1x128+zp "),
                          "%s", kiln_plan_signature(p, l.signature));
            }
        kiln_plan_destroy(p);
        kiln_graph_destroy(g);
    }
}

Test(lower, strict_backend_makes_fallback_an_error)
{
    kiln_graph *g = ffn(KILN_FMT_Q4_K, 1, 512, 1024);
    kiln_target t = target("sm_90a");
    kiln_plan *p = NULL;
    kiln_status st = kiln_plan_create_with(
        &reg, g, &t, &(kiln_plan_options){ .backend = "wgmma", .strict_backend = 1 }, &p);
    cr_assert_eq(st, KILN_ERR_NO_KERNEL);
    cr_assert_null(p);
    cr_assert(strstr(kiln_last_error(), "--strict-backend: backend wgmma cannot take linear "
                                        "\"gate.0\" (q4_k"), "%s", kiln_last_error());
    cr_assert(strstr(kiln_last_error(), "no kernel for q4_k"));
    kiln_graph_destroy(g);
}

Test(lower, unknown_backend_names_the_built_ones)
{
    kiln_graph *g = ffn(KILN_FMT_BF16, 1, 256, 512);
    kiln_target t = target("sm_90a");
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_plan_create_with(&reg, g, &t, &(kiln_plan_options){ .backend = "cutlass" },
                                       &p), KILN_ERR_NOT_FOUND);
    cr_assert(strstr(kiln_last_error(), "--backend cutlass: no such backend (built: gemv, "
                                        "wgmma, mma, simt)"), "%s", kiln_last_error());
    kiln_graph_destroy(g);
}

Test(lower, no_fit_lists_every_reason)
{
    kiln_registry tc = { .backends = { &t_wgmma, &t_mma }, .n = 2 };
    for (int f = 0; f < KILN_FMT_COUNT; f++)
        memcpy(tc.priority[f], reg.priority[f], sizeof tc.priority[f]);
    kiln_graph *g = ffn(KILN_FMT_BF16, 1, 256, 512);
    kiln_target t = target("sm_75");
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_plan_create_with(&tc, g, &t, NULL, &p), KILN_ERR_NO_KERNEL);
    const char *e = kiln_last_error();
    cr_assert(strstr(e, "failed to find a kernel for linear \"gate.0\" (bf16, N=512, K=256"), "%s",
              e);
    cr_assert(strstr(e, "Reasons: wgmma: needs wgmma (sm_90a), target is sm_75; mma: needs "
                        "mma.sync (sm_80+), target is sm_75"), "%s", e);
    kiln_graph_destroy(g);
}

/* -------------------------------------------------------------- buckets */

Test(lower, buckets_hold_one_the_capture_sizes_and_max)
{
    kiln_graph *g = ffn(KILN_FMT_BF16, 1, 256, 512);
    kiln_plan *p = plan(g, "sm_90a", NULL);
    int64_t want[] = { 1, 2, 4, 8, 16, 32, 64, 128, 256, 512 };
    cr_assert_eq(kiln_plan_n_buckets(p), 10);
    for (int i = 0; i < 10; i++)
        cr_assert_eq(kiln_plan_bucket(p, i), want[i]);
    cr_assert_eq(kiln_plan_bucket_for(p, 3), 2, "3 tokens run in the bucket of 4");
    cr_assert_eq(kiln_plan_bucket_for(p, 512), 9);
    cr_assert_eq(kiln_plan_bucket_for(p, 513), -1);
    kiln_plan_destroy(p);

    int64_t cap[] = { 24, 3, 3, 1000 };
    p = plan(g, "sm_90a", &(kiln_plan_options){ .capture = cap, .n_capture = 4, .max_tokens = 100 });
    int64_t want2[] = { 1, 3, 24, 100 };
    cr_assert_eq(kiln_plan_n_buckets(p), 4, "sizes above max_tokens are dropped");
    for (int i = 0; i < 4; i++)
        cr_assert_eq(kiln_plan_bucket(p, i), want2[i]);
    cr_assert_eq(kiln_plan_bucket_for(p, 50), 3);
    kiln_plan_destroy(p);

    kiln_target t = target("sm_90a");
    int64_t bad[] = { 4, 0 };
    cr_assert_eq(kiln_plan_create_with(&reg, g, &t,
                                       &(kiln_plan_options){ .capture = bad, .n_capture = 2 }, &p),
                 KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "capture size 0"));
    kiln_graph_destroy(g);
}

/* ------------------------------------------------------- de-duplication */

Test(lower, llama8b_linears_share_kernels_by_signature)
{
    static const struct { const char *name; int64_t n, k; } proj[] = {
        { "attn_q", 4096, 4096 },    { "attn_k", 1024, 4096 },  { "attn_v", 1024, 4096 },
        { "attn_output", 4096, 4096 }, { "ffn_gate", 14336, 4096 }, { "ffn_up", 14336, 4096 },
        { "ffn_down", 4096, 14336 },
    };
    kiln_graph *g;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < 7; i++) {
            char n[64];
            kiln_tensor *x, *y;
            snprintf(n, sizeof n, "blk.%d.%s.in", l, proj[i].name);
            cr_assert_eq(kiln_graph_input(g, n, proj[i].k, &x), KILN_OK);
            snprintf(n, sizeof n, "blk.%d.%s.weight", l, proj[i].name);
            kiln_tensor *w = weight(g, n, KILN_FMT_FP8_BLOCK, proj[i].n, proj[i].k);
            snprintf(n, sizeof n, "blk.%d.%s", l, proj[i].name);
            cr_assert_eq(kiln_graph_linear(g, n, x, w, NULL, &y), KILN_OK);
            cr_assert_eq(kiln_graph_output(g, y), KILN_OK);
        }
    kiln_plan *p = plan(g, "sm_90a", NULL);
    cr_assert_eq(kiln_plan_n_linears(p), 224);
    /* 4 distinct shapes; per shape gemv serves buckets 1..16 in 3 variants
     * (m1, m4, m16) and wgmma 32..512 in 2 (64x128, 128x128). */
    int linear_sigs = 0;
    for (int i = 0; i < kiln_plan_n_signatures(p); i++)
        linear_sigs += !strncmp(kiln_plan_signature(p, i), "linear ", 7);
    cr_assert_eq(linear_sigs, 4 * (3 + 2), "got %d", linear_sigs);
    /* Same (shape, backend, variant) <=> same signature. */
    for (int i = 0; i < 224; i += 5)
        for (int j = 0; j < 224; j += 3)
            for (int b = 0; b < kiln_plan_n_buckets(p); b += 2) {
                kiln_plan_linear a, c;
                char va[32], vc[32];
                kiln_plan_linear_at(p, i, b, &a);
                kiln_plan_linear_at(p, j, b, &c);
                kiln_linear_cfg ca = { .format = a.format, .n = a.n, .k = a.k };
                int64_t m = kiln_plan_bucket(p, b);
                (!strcmp(a.backend, "gemv") ? gemv_variant : tile_variant)(NULL, &ca, m, va, 32);
                (!strcmp(c.backend, "gemv") ? gemv_variant : tile_variant)(NULL, &ca, m, vc, 32);
                int same = a.n == c.n && a.k == c.k && !strcmp(a.backend, c.backend) &&
                           !strcmp(va, vc);
                cr_assert_eq(same, a.signature == c.signature, "%s vs %s", a.node, c.node);
            }
    const char *s = kiln_plan_signature(p, linear_at(p, 4, 512).signature);
    cr_assert_str_eq(s, "linear backend=wgmma variant=128x128 format=fp8_block scales=f32:128x128 "
                        "act=fp8-1x128 n=14336 k=4096 epilogue=none out=bf16 target=sm_90a");
    kiln_plan_destroy(p);
    kiln_graph_destroy(g);
}

/* ------------------------------------------------ passes on a program */

static const kiln_program *program(const kiln_plan *p, int64_t m)
{
    return &p->programs[kiln_plan_bucket_for(p, m)];
}

static int count_steps(const kiln_program *bk, kiln_step_kind kind)
{
    int n = 0;
    for (int i = 0; i < bk->n_steps; i++)
        n += bk->steps[i].kind == kind;
    return n;
}

Test(lower, activation_quantization_is_inserted_and_shared)
{
    kiln_graph *g = ffn(KILN_FMT_FP8_BLOCK, 2, 512, 1024);
    kiln_plan *p = plan(g, "sm_90a", NULL);
    const kiln_program *big = program(p, 512), *small = program(p, 1);
    /* per layer: one quant of rms(x) shared by gate and up, one of the
     * silu*up product for down */
    cr_assert_eq(count_steps(big, KILN_STEP_QUANT), 4);
    cr_assert_eq(count_steps(small, KILN_STEP_QUANT), 0, "gemv reads bf16 activations");
    for (int i = 0; i < big->n_steps; i++) {
        const kiln_step *s = &big->steps[i];
        if (s->kind != KILN_STEP_LINEAR)
            continue;
        const kiln_value *x = &big->values[s->src[0]];
        cr_assert_eq(x->act, KILN_ACT_FP8_G128, "%s reads fp8 1x128", s->node->name);
        cr_assert_lt(x->first, i, "the quantized input is made before the linear");
        cr_assert_eq(big->steps[x->first].kind, KILN_STEP_QUANT);
        cr_assert_eq(x->bytes, (size_t)512 * (size_t)(x->width + x->width / 128 * 4));
    }
    kiln_plan_destroy(p);
    kiln_graph_destroy(g);
}

/* Static input scales with kiln's own backends on sm_90a: one quant step
 * per (input, scheme, scale); wgmma's FP8 GEMM reads fp8-static codes
 * through its fp8-token kernel (the same kernel as a dynamic linear),
 * the decode kernels read bf16-qdq, and wgmma's block-FP8 kernel ignores
 * the scale, which the plan says. */
Test(lower, static_input_scales_make_their_own_quant_steps)
{
    enum { K = 256, N = 256 };
    static const struct {
        const char *name;
        kiln_format f;
        float scale;
    } lin[] = {
        { "q", KILN_FMT_FP8_CHANNEL, 0.5f },   { "k", KILN_FMT_FP8_CHANNEL, 0.5f },
        { "v", KILN_FMT_FP8_CHANNEL, 0.25f },  { "blk", KILN_FMT_FP8_BLOCK, 0.5f },
        { "dyn", KILN_FMT_FP8_CHANNEL, 0.0f },
    };
    kiln_graph *g;
    kiln_tensor *x;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    cr_assert_eq(kiln_graph_input(g, "x", K, &x), KILN_OK);
    for (size_t i = 0; i < KILN_ARRAY_LEN(lin); i++) {
        char wn[16];
        snprintf(wn, sizeof wn, "%s.w", lin[i].name);
        kiln_tensor *y, *w = weight(g, wn, lin[i].f, N, K);
        cr_assert_eq(kiln_graph_linear(g, lin[i].name, x, w, NULL, &y), KILN_OK);
        if (lin[i].scale > 0)
            cr_assert_eq(kiln_graph_linear_input_scale(g, y, lin[i].scale), KILN_OK);
        cr_assert_eq(kiln_graph_output(g, y), KILN_OK);
    }
    kiln_target t = target("sm_90a");
    const int64_t capture[] = { 1, 512 };
    const kiln_plan_options o = { .capture = capture, .n_capture = 2 };
    kiln_plan *p;
    cr_assert_eq(kiln_plan_create(g, &t, &o, &p), KILN_OK, "%s", kiln_last_error());

    static const char *const use_big[] = { "fp8-static", "fp8-static", "fp8-static", "ignored", "" };
    for (size_t i = 0; i < KILN_ARRAY_LEN(lin); i++) {
        kiln_plan_linear big = linear_at(p, (int)i, 512), one = linear_at(p, (int)i, 1);
        cr_assert_str_eq(big.node, lin[i].name);
        cr_assert_str_eq(big.backend, "wgmma");
        cr_assert_eq(big.input_scale, lin[i].scale);
        cr_assert_str_eq(big.input_scale_use, use_big[i], "%s", lin[i].name);
        cr_assert_str_eq(one.act, "bf16", "%s: a decode kernel", lin[i].name);
        cr_assert_str_eq(one.input_scale_use, lin[i].scale > 0 ? "bf16-qdq" : "", "%s",
                         lin[i].name);
    }
    cr_assert_eq(linear_at(p, 0, 512).signature, linear_at(p, 4, 512).signature,
                 "a static and a dynamic linear share the GEMM kernel");
    cr_assert_str_eq(linear_at(p, 0, 512).act, "fp8-token");
    cr_assert_str_eq(linear_at(p, 3, 512).act, "fp8-1x128");

    /* 512: fp8-static for 0.5 (q and k) and 0.25 (v), fp8-token for dyn,
     * fp8-1x128 for blk. 1: bf16-qdq for 0.5 (q, k, blk) and 0.25 (v). */
    const kiln_program *big = program(p, 512), *one = program(p, 1);
    cr_assert_eq(count_steps(big, KILN_STEP_QUANT), 4);
    cr_assert_eq(count_steps(one, KILN_STEP_QUANT), 2);
    int statics = 0;
    for (int i = 0; i < big->n_steps; i++) {
        const kiln_step *s = &big->steps[i];
        if (s->kind == KILN_STEP_QUANT) {
            const char *sig = kiln_plan_signature(p, s->signature);
            if (s->act == KILN_ACT_FP8_STATIC) {
                statics++;
                cr_assert(s->input_scale == 0.5f || s->input_scale == 0.25f);
                cr_assert_str_eq(sig, "quant act=fp8-static k=256 target=sm_90a");
                cr_assert_eq(big->values[s->dst].bytes, (size_t)512 * (K + 4),
                             "the fp8-token layout");
            } else {
                cr_assert_eq(s->input_scale, 0.0f, "%s", sig);
            }
        }
        if (s->kind == KILN_STEP_LINEAR) {
            const kiln_step *q = &big->steps[big->values[s->src[0]].first];
            cr_assert_eq(q->kind, KILN_STEP_QUANT);
            float want = p->linears[s->linear].node->input_scale;
            cr_assert_eq(q->input_scale, q->act == KILN_ACT_FP8_STATIC ? want : 0.0f, "%s",
                         s->node->name);
        }
    }
    cr_assert_eq(statics, 2);
    for (int i = 0; i < one->n_steps; i++) {
        const kiln_step *s = &one->steps[i];
        if (s->kind != KILN_STEP_QUANT)
            continue;
        cr_assert_eq(s->act, KILN_ACT_BF16_QDQ);
        cr_assert_str_eq(kiln_plan_signature(p, s->signature), "quant act=bf16-qdq k=256 target=sm_90a");
        cr_assert_eq(one->values[s->dst].bytes, (size_t)1 * K * 2);
    }
    kiln_plan_destroy(p);
    kiln_graph_destroy(g);
}

Test(lower, epilogues_fuse_where_the_backend_can)
{
    kiln_graph *g = ffn(KILN_FMT_BF16, 1, 512, 1024);
    kiln_plan *p = plan(g, "sm_90a", NULL);
    /* wgmma (M=512) fuses silu*mul into up and the residual into down */
    const kiln_program *big = program(p, 512);
    cr_assert_eq(count_steps(big, KILN_STEP_LINEAR), 3);
    cr_assert_eq(count_steps(big, KILN_STEP_OP), 1, "only rms_norm is left: %d",
                 count_steps(big, KILN_STEP_OP));
    cr_assert_str_eq(linear_at(p, 1, 512).epilogue, "silu_mul");
    cr_assert_str_eq(linear_at(p, 2, 512).epilogue, "residual");
    /* gemv (M=1) fuses the residual but not silu*mul */
    const kiln_program *small = program(p, 1);
    cr_assert_eq(count_steps(small, KILN_STEP_OP), 3, "rms_norm, silu, mul");
    cr_assert_str_eq(linear_at(p, 1, 1).epilogue, "none");
    cr_assert_str_eq(linear_at(p, 2, 1).epilogue, "residual");
    kiln_plan_destroy(p);
    /* --no-fuse keeps every op */
    p = plan(g, "sm_90a", &(kiln_plan_options){ .no_fuse = 1 });
    cr_assert_eq(count_steps(program(p, 512), KILN_STEP_OP), 4);
    kiln_plan_destroy(p);
    kiln_graph_destroy(g);
}

/* With kiln's own backends on sm_90a, gemv_tc computes each layer's gate
 * projection in its up projection's kernel (the gate epilogue) in the
 * decode buckets: two linear steps a layer, the gate's weight the step's
 * weight2 and no aux input; wgmma keeps three. The gate's plan row names
 * the kernel that computes it; the weights stay one copy each. */
Test(lower, decode_kernels_compute_the_gate_with_up)
{
    enum { LAYERS = 2 };
    kiln_graph *g = ffn(KILN_FMT_BF16, LAYERS, 512, 1024);
    kiln_target t = target("sm_90a");
    const int64_t capture[] = { 1, 16, 512 };
    kiln_plan *p, *unfused;
    cr_assert_eq(kiln_plan_create(g, &t, &(kiln_plan_options){ .capture = capture,
                                                                .n_capture = 3 }, &p),
                 KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_plan_create(g, &t, &(kiln_plan_options){ .capture = capture, .n_capture = 3,
                                                                .no_fuse = 1 }, &unfused),
                 KILN_OK, "%s", kiln_last_error());
    for (int i = 0; i < 3; i++) {
        const int64_t m = capture[i];
        const int decode = m <= 16;
        const kiln_program *bk = program(p, m);
        cr_assert_eq(count_steps(bk, KILN_STEP_LINEAR), (decode ? 2 : 3) * LAYERS);
        cr_assert_eq(count_steps(bk, KILN_STEP_OP), LAYERS, "rms_norm alone");
        for (int l = 0; l < LAYERS; l++) {
            kiln_plan_linear gate = linear_at(p, 3 * l, m), up = linear_at(p, 3 * l + 1, m);
            cr_assert(strncmp(gate.node, "gate.", 5) == 0 && strncmp(up.node, "up.", 3) == 0);
            cr_assert_str_eq(up.backend, decode ? "gemv_tc" : "wgmma");
            cr_assert_str_eq(up.epilogue, decode ? "silu_mul+gate" : "silu_mul");
            cr_assert_str_eq(gate.epilogue, decode ? "(in silu_mul+gate)" : "none");
            cr_assert_eq(gate.signature == up.signature, decode, "%s at %lld", gate.node,
                         (long long)m);
        }
        for (int j = 0; j < bk->n_steps; j++) {
            const kiln_step *s = &bk->steps[j];
            if (s->kind != KILN_STEP_LINEAR)
                continue;
            const char *name = p->linears[s->linear].node->name;
            cr_assert(!decode || strncmp(name, "gate.", 5), "no gate step of its own at %lld",
                      (long long)m);
            const int fused = decode && !strncmp(name, "up.", 3);
            cr_assert_eq(s->weight2 != NULL, fused, "%s", name);
            if (fused) {
                cr_assert_eq(s->weight2, p->linears[s->linear - 1].node->src[1]);
                cr_assert_eq(s->src[1], -1, "the gate is computed, not read");
                cr_assert(strstr(kiln_plan_signature(p, s->signature), "epilogue=silu_mul+gate"));
            }
        }
        cr_assert_eq(count_steps(program(unfused, m), KILN_STEP_LINEAR), 3 * LAYERS);
    }
    size_t storage[2], packed[2];
    cr_assert_eq(kiln_plan_weight_bytes(p, &storage[0], &packed[0]), KILN_OK);
    cr_assert_eq(kiln_plan_weight_bytes(unfused, &storage[1], &packed[1]), KILN_OK);
    cr_assert_eq(packed[0], packed[1], "the gate weights are packed once, as unfused");
    cr_assert_eq(storage[0], storage[1]);
    kiln_plan_destroy(p);
    kiln_plan_destroy(unfused);
    kiln_graph_destroy(g);
}

/* The gate projection stays a kernel of its own where another node reads
 * it, or where it differs from up in format. */
Test(lower, a_gate_read_elsewhere_or_of_another_format_keeps_its_kernel)
{
    for (int variant = 0; variant < 2; variant++) {
        kiln_graph *g;
        kiln_tensor *x, *gate, *up, *act, *prod;
        cr_assert_eq(kiln_graph_create(&g), KILN_OK);
        cr_assert_eq(kiln_graph_input(g, "x", 512, &x), KILN_OK);
        kiln_tensor *wg = weight(g, "gate.w", variant ? KILN_FMT_FP8_CHANNEL : KILN_FMT_BF16,
                                 1024, 512);
        kiln_tensor *wu = weight(g, "up.w", KILN_FMT_BF16, 1024, 512);
        cr_assert_eq(kiln_graph_linear(g, "gate", x, wg, NULL, &gate), KILN_OK);
        cr_assert_eq(kiln_graph_linear(g, "up", x, wu, NULL, &up), KILN_OK);
        cr_assert_eq(kiln_graph_silu(g, NULL, gate, &act), KILN_OK);
        cr_assert_eq(kiln_graph_mul(g, NULL, act, up, &prod), KILN_OK);
        cr_assert_eq(kiln_graph_output(g, prod), KILN_OK);
        if (!variant)
            cr_assert_eq(kiln_graph_output(g, gate), KILN_OK);
        kiln_target t = target("sm_90a");
        const int64_t capture[] = { 1 };
        kiln_plan *p;
        cr_assert_eq(kiln_plan_create(g, &t, &(kiln_plan_options){ .capture = capture,
                                                                    .n_capture = 1 }, &p),
                     KILN_OK, "%s", kiln_last_error());
        cr_assert_str_eq(linear_at(p, 1, 1).epilogue, "silu_mul", "variant %d", variant);
        cr_assert_str_eq(linear_at(p, 0, 1).epilogue, "none");
        cr_assert_eq(count_steps(program(p, 1), KILN_STEP_LINEAR), 2);
        kiln_plan_destroy(p);
        kiln_graph_destroy(g);
    }
}

/* ---------------------------------------------------------- memory plan */

static void assert_no_live_overlap(const kiln_program *bk)
{
    for (int i = 0; i < bk->n_values; i++) {
        const kiln_value *a = &bk->values[i];
        cr_assert_leq(a->offset + a->bytes, bk->arena_bytes);
        cr_assert_eq(a->offset % KILN_ARENA_ALIGN, 0);
        for (int j = i + 1; j < bk->n_values; j++) {
            const kiln_value *b = &bk->values[j];
            int live_together = a->first <= b->last && b->first <= a->last;
            int overlap = a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
            cr_assert(!(live_together && overlap),
                      "values %d [%d,%d] @%zu+%zu and %d [%d,%d] @%zu+%zu share bytes", i,
                      a->first, a->last, a->offset, a->bytes, j, b->first, b->last, b->offset,
                      b->bytes);
        }
    }
}

Test(lower, memory_plan_never_overlaps_live_values)
{
    kiln_format fs[] = { KILN_FMT_BF16, KILN_FMT_FP8_BLOCK, KILN_FMT_Q4_K };
    for (size_t f = 0; f < 3; f++) {
        kiln_graph *g = ffn(fs[f], 8, 512, 1536);
        const char *targets[] = { "sm_90a", "sm_80", "sm_75" };
        for (int t = 0; t < 3; t++) {
            kiln_plan *p = plan(g, targets[t], NULL);
            for (int b = 0; b < kiln_plan_n_buckets(p); b++) {
                const kiln_program *bk = &p->programs[b];
                assert_no_live_overlap(bk);
                cr_assert_leq(kiln_plan_arena_bytes(p, b), kiln_plan_naive_bytes(p, b));
            }
            /* 8 layers reuse the same few buffers */
            int last = kiln_plan_n_buckets(p) - 1;
            cr_assert_lt(kiln_plan_arena_bytes(p, last) * 4, kiln_plan_naive_bytes(p, last),
                         "arena %zu vs naive %zu", kiln_plan_arena_bytes(p, last),
                         kiln_plan_naive_bytes(p, last));
            kiln_plan_destroy(p);
        }
        kiln_graph_destroy(g);
    }
}

Test(lower, outputs_and_inputs_stay_live)
{
    kiln_graph *g = ffn(KILN_FMT_BF16, 3, 256, 512);
    kiln_plan *p = plan(g, "sm_80", NULL);
    const kiln_program *bk = program(p, 64);
    for (int i = 0; i < bk->n_values; i++) {
        const kiln_value *v = &bk->values[i];
        if (v->tensor && v->tensor->op == KILN_OP_INPUT)
            cr_assert_eq(v->first, -1);
        if (v->tensor && v->tensor->is_output)
            cr_assert_eq(v->last, bk->n_steps, "an output lives to the end");
    }
    kiln_plan_destroy(p);
    kiln_graph_destroy(g);
}

Test(lower, graph_without_outputs_is_refused)
{
    kiln_graph *g;
    kiln_tensor *x;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    cr_assert_eq(kiln_graph_input(g, "x", 64, &x), KILN_OK);
    kiln_target t = target("sm_90a");
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_plan_create_with(&reg, g, &t, NULL, &p), KILN_ERR_STATE);
    cr_assert(strstr(kiln_last_error(), "the graph has no outputs"), "%s", kiln_last_error());
    cr_assert_null(p);
    kiln_graph_destroy(g);
}

/* Kernels are named for a target the signature can name: every live
 * device plans (one newer than the table too), a made-up name is refused
 * when planned, not when built. */
Test(lower, a_target_signatures_cannot_name_is_refused)
{
    kiln_graph *g = ffn(KILN_FMT_BF16, 1, 256, 512);
    kiln_target t = target("sm_80");
    snprintf(t.name, sizeof t.name, "gpu_x");
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_plan_create_with(&reg, g, &t, NULL, &p), KILN_ERR_NOT_FOUND);
    cr_assert(strstr(kiln_last_error(), "plan: kernels for target gpu_x"), "%s",
              kiln_last_error());
    cr_assert_null(p);
    static const int cc[][2] = { { 12, 0 }, { 8, 7 }, { 13, 0 } };
    for (size_t i = 0; i < sizeof cc / sizeof cc[0]; i++) {
        cr_assert_eq(kiln_target_from_cc(cc[i][0], cc[i][1], 84, 101376, &t), KILN_OK);
        cr_assert_eq(kiln_plan_create_with(&reg, g, &t, NULL, &p), KILN_OK, "%s: %s", t.name,
                     kiln_last_error());
        cr_assert_str_eq(p->kernel_target.name, t.name);
        cr_assert_eq(p->kernel_target.sm_count, 0);
        kiln_plan_destroy(p);
    }
    /* a live device of a known architecture plans for its row of the table */
    cr_assert_eq(kiln_target_from_cc(9, 0, 132, 200000, &t), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_plan_create_with(&reg, g, &t, NULL, &p), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(p->kernel_target.sm_count, 0);
    cr_assert_eq(p->kernel_target.smem_optin, target("sm_90a").smem_optin);
    for (int i = 0; i < kiln_plan_n_signatures(p); i++) {
        const kiln_target *k = &p->signatures[i].desc.target;
        cr_assert_str_eq(k->name, "sm_90a");
        cr_assert_eq(k->sm_count, 0);
        cr_assert_eq(k->smem_optin, p->kernel_target.smem_optin);
    }
    kiln_plan_destroy(p);
    kiln_graph_destroy(g);
}

Test(lower, null_arguments_are_named)
{
    kiln_graph *g = ffn(KILN_FMT_BF16, 1, 256, 512);
    kiln_target t = target("sm_90a");
    kiln_plan *p = NULL;
    const struct {
        const kiln_registry *r;
        kiln_graph *g;
        const kiln_target *t;
        kiln_plan **out;
        const char *name;
    } bad[] = {
        { NULL, g, &t, &p, "registry" },
        { &reg, NULL, &t, &p, "graph" },
        { &reg, g, NULL, &p, "target" },
        { &reg, g, &t, NULL, "out" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(kiln_plan_create_with(bad[i].r, bad[i].g, bad[i].t, NULL, bad[i].out),
                     KILN_ERR_INVALID_ARG, "NULL %s", bad[i].name);
        const char *e = kiln_last_error();
        cr_assert(!strncmp(e, "plan: ", 6) && strstr(e, bad[i].name), "NULL %s: %s", bad[i].name,
                  e);
        cr_assert_null(p);
    }
    kiln_graph_destroy(g);
}
