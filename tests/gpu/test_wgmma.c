/* The wgmma backend on a Hopper GPU against the CPU executor: every format it claims,
 * both tile variants, partial row and column tiles, and the fused
 * epilogues, with every linear forced onto wgmma. Skipped, with the
 * reason, where there is no GPU or it has no wgmma. The wgmma_tc backend
 * (the packed layout as the register operand) is checked here too. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/plan.h"
#include "core.h"
#include "gpuutil.h"
#include "kernels/registry/backend.h"

static char cache_path[256];
static void fresh_cache(void) { kt_fresh_cache(cache_path, sizeof cache_path); }

static void need_hopper(void)
{
    kt_need_gpu();
    kiln_target t;
    cr_assert_eq(kiln_target_live(0, &t), KILN_OK, "%s", kiln_last_error());
    if (!t.wgmma)
        cr_skip_test("the GPU is %s: wgmma needs sm_90a", t.name);
}

/* Buckets 1, 16, 64 take the 64-wide tile, 192 the 128-wide one. */
static const int64_t capture[] = { 16, 64, 192 };
/* Partial row tiles (1, 16, 50, 65, 130), whole ones (64, 192), and a
 * second row of blocks (65, 130, 192). */
static const int64_t token_counts[] = { 1, 16, 50, 64, 65, 130, 192 };

/* Every linear on wgmma, or the session fails. */
static kiln_session *wgmma_session(kiln_graph *g)
{
    kiln_session_options o = { .cache.path = cache_path, .quiet = 1,
                                .plan = { .backend = "wgmma", .strict_backend = 1,
                                          .capture = capture, .n_capture = 3 } };
    return kt_session_create(g, &o);
}

static void every_format_one(int f)
{
    kt_rng r = kt_rng_new(2100 + (uint64_t)f);
    /* N = 200 and 136 leave partial column tiles in both variants. */
    static const int64_t shapes[][2] = { { 256, 512 }, { 200, 768 }, { 136, 256 } };
    const kiln_backend *b = kiln_registry_find(kiln_registry_default(), "wgmma");
    cr_assert(b && b->formats, "no wgmma backend, or one that claims no format");
    for (size_t sh = 0; sh < KILN_ARRAY_LEN(shapes) && (b->formats & (1u << f)); sh++) {
        kt_weight w;
        kt_weight_make(&w, &r, (kiln_format)f, shapes[sh][0], shapes[sh][1]);
        kiln_graph *g = kt_linear_graph(&w);
        kiln_session *s = wgmma_session(g);
        char what[64];
        snprintf(what, sizeof what, "%s %lldx%lld", kiln_format_get((kiln_format)f)->name,
                 (long long)shapes[sh][0], (long long)shapes[sh][1]);
        double worst = 0;
        for (size_t i = 0; i < KILN_ARRAY_LEN(token_counts); i++)
            worst = fmax(worst, kt_check_session(s, g, token_counts[i], &r, what, NULL));
        fprintf(stderr, "wgmma %-22s |gpu-ref| <= %.2f of the bound\n", what, worst);
        kt_session_destroy(s);
        kiln_graph_destroy(g);
        kt_weight_free(&w);
    }
}

static void every_format_part(int part)
{
    need_hopper();
    fresh_cache();
    for (int f = part; f < KILN_FMT_COUNT; f += KT_PARTS)
        every_format_one(f);
}

/* Every format wgmma takes, in KT_PARTS tests. */
Test(gpu_wgmma, every_format_matches_the_cpu_1, .timeout = 1200)
{
    every_format_part(0);
}

Test(gpu_wgmma, every_format_matches_the_cpu_2, .timeout = 1200)
{
    every_format_part(1);
}

Test(gpu_wgmma, every_format_matches_the_cpu_3, .timeout = 1200)
{
    every_format_part(2);
}

Test(gpu_wgmma, every_format_matches_the_cpu_4, .timeout = 1200)
{
    every_format_part(3);
}

/* How many of the plan's signatures name variant. */
static int signatures_with(const kiln_plan *p, const char *variant)
{
    char want[64];
    snprintf(want, sizeof want, "variant=%s ", variant);
    int n = 0;
    for (int i = 0; i < p->n_signatures; i++)
        n += strstr(p->signatures[i].text, want) != NULL;
    return n;
}

/* BF16 on the TMA kernel in each of its four tiles (the shapes
 * bf16_tiles_fill_the_sms of the codegen suite picks them for on 132 SMs),
 * with partial row and column tiles, odd N, more tiles than SMs (blocks
 * loop over tiles), and K of one step, of fewer steps than stages and of
 * more (the ring wraps inside a tile). A bucket's kernel computes all its
 * rows whatever the token count; the counts checked past 1024 reach the
 * second band of row tiles. */
Test(gpu_wgmma, bf16_tma_tiles_match_the_cpu, .timeout = 1200)
{
    need_hopper();
    fresh_cache();
    kiln_target live;
    cr_assert_eq(kiln_target_live(0, &live), KILN_OK, "%s", kiln_last_error());
    kt_rng r = kt_rng_new(23);
    static const struct {
        int64_t n, k;
        int64_t capture[2];
        const char *variant[2]; /* on 132 SMs */
        int64_t tokens[6];
    } cases[] = {
        { 4096, 128, { 64, 2048 }, { "tma_bm64bn128", "tma_bm128bn256" },
          { 1, 63, 64, 65, 1000, 2048 } },
        { 4099, 576, { 64, 2048 }, { "tma_bm64bn128", "tma_bm128bn128" },
          { 2, 64, 127, 129, 600, 1100 } },
        { 33792, 64, { 64, 256 }, { "tma_bm64bn256", "tma_bm128bn256" },
          { 1, 17, 64, 65, 200, 256 } },
    };
    int seen[4] = { 0 };
    static const char *const all[] = { "tma_bm128bn256", "tma_bm128bn128", "tma_bm64bn256",
                                       "tma_bm64bn128" };
    for (size_t c = 0; c < KILN_ARRAY_LEN(cases); c++) {
        kt_weight w;
        kt_weight_make(&w, &r, KILN_FMT_BF16, cases[c].n, cases[c].k);
        kiln_graph *g = kt_linear_graph(&w);
        kiln_session_options o = { .cache.path = cache_path, .quiet = 1,
                                    .plan = { .backend = "wgmma", .strict_backend = 1,
                                              .capture = cases[c].capture, .n_capture = 2 } };
        kiln_session *s = kt_session_create(g, &o);
        const kiln_plan *p = kt_session_plan(s);
        for (int v = 0; v < 2; v++)
            if (live.sm_count == 132)
                cr_assert_eq(signatures_with(p, cases[c].variant[v]), 1, "%lldx%lld: %s",
                             (long long)cases[c].n, (long long)cases[c].k, cases[c].variant[v]);
        for (size_t v = 0; v < KILN_ARRAY_LEN(all); v++)
            seen[v] += signatures_with(p, all[v]);
        char what[64];
        snprintf(what, sizeof what, "bf16 %lldx%lld", (long long)cases[c].n,
                 (long long)cases[c].k);
        double worst = 0;
        for (size_t i = 0; i < KILN_ARRAY_LEN(cases[c].tokens); i++)
            worst = fmax(worst, kt_check_session(s, g, cases[c].tokens[i], &r, what, NULL));
        fprintf(stderr, "wgmma tma %-16s |gpu-ref| <= %.2f of the bound\n", what, worst);
        kt_session_destroy(s);
        kiln_graph_destroy(g);
        kt_weight_free(&w);
    }
    for (size_t v = 0; v < KILN_ARRAY_LEN(all); v++)
        if (live.sm_count == 132)
            cr_assert_gt(seen[v], 0, "%s ran", all[v]);
        else if (!seen[v])
            fprintf(stderr, "wgmma tma: %s not chosen on %d SMs\n", all[v], live.sm_count);
}

/* E4M3 weights with a tensor, row or 128 x 128 block scale on the TMA
 * kernel, on E4M3 activations with a scale per token (per token and 128
 * of K for blocks): the three tiles it takes (the widest leaves no
 * registers for the promoted sums), partial tiles and blocks, odd N,
 * blocks looping over tiles, a last stage of K half past the end (K =
 * 576: 4.5 stages of 128). */
Test(gpu_wgmma, fp8_tma_tiles_match_the_cpu, .timeout = 1200)
{
    need_hopper();
    fresh_cache();
    kiln_target live;
    cr_assert_eq(kiln_target_live(0, &live), KILN_OK, "%s", kiln_last_error());
    kt_rng r = kt_rng_new(24);
    static const struct {
        kiln_format f;
        int64_t n, k;
        int64_t capture[2];
        const char *variant[2]; /* on 132 SMs */
        int64_t tokens[4];
    } cases[] = {
        { KILN_FMT_FP8_CHANNEL, 4099, 576, { 64, 2048 }, { "tma_bm64bn128", "tma_bm128bn128" },
          { 1, 65, 300, 1100 } },
        { KILN_FMT_FP8_TENSOR, 4099, 576, { 64, 2048 }, { "tma_bm64bn128", "tma_bm128bn128" },
          { 3, 64, 129, 257 } },
        { KILN_FMT_FP8_CHANNEL, 33792, 128, { 64, 64 }, { "tma_bm64bn256", "tma_bm64bn256" },
          { 1, 17, 63, 64 } },
        { KILN_FMT_FP8_BLOCK, 4099, 576, { 64, 2048 }, { "tma_bm64bn128", "tma_bm128bn128" },
          { 2, 64, 129, 1100 } },
        { KILN_FMT_FP8_BLOCK, 33792, 320, { 64, 64 }, { "tma_bm64bn256", "tma_bm64bn256" },
          { 1, 33, 64, 64 } },
    };
    for (size_t c = 0; c < KILN_ARRAY_LEN(cases); c++) {
        kt_weight w;
        kt_weight_make(&w, &r, cases[c].f, cases[c].n, cases[c].k);
        kiln_graph *g = kt_linear_graph(&w);
        const int n_capture = cases[c].capture[0] == cases[c].capture[1] ? 1 : 2;
        kiln_session_options o = { .cache.path = cache_path, .quiet = 1,
                                    .plan = { .backend = "wgmma", .strict_backend = 1,
                                              .capture = cases[c].capture,
                                              .n_capture = n_capture } };
        kiln_session *s = kt_session_create(g, &o);
        const kiln_plan *p = kt_session_plan(s);
        for (int v = 0; v < n_capture; v++)
            if (live.sm_count == 132)
                cr_assert_eq(signatures_with(p, cases[c].variant[v]), 1, "%lldx%lld: %s",
                             (long long)cases[c].n, (long long)cases[c].k, cases[c].variant[v]);
        char what[64];
        snprintf(what, sizeof what, "%s %lldx%lld", kiln_format_get(cases[c].f)->name,
                 (long long)cases[c].n, (long long)cases[c].k);
        double worst = 0;
        for (size_t i = 0; i < KILN_ARRAY_LEN(cases[c].tokens); i++)
            worst = fmax(worst, kt_check_session(s, g, cases[c].tokens[i], &r, what, NULL));
        fprintf(stderr, "wgmma tma %-22s |gpu-ref| <= %.2f of the bound\n", what, worst);
        kt_session_destroy(s);
        kiln_graph_destroy(g);
        kt_weight_free(&w);
    }
}

Test(gpu_wgmma, fused_ffn_matches_the_cpu, .timeout = 1200)
{
    need_hopper();
    fresh_cache();
    kt_rng r = kt_rng_new(22);
    static const kiln_format fs[] = { KILN_FMT_BF16,  KILN_FMT_FP8_BLOCK, KILN_FMT_FP8_TENSOR,
                                      KILN_FMT_NVFP4, KILN_FMT_MXFP4,     KILN_FMT_Q4_K,
                                      KILN_FMT_Q6_K };
    float norm[512];
    kt_fill_normal(&r, norm, 512, 0.2f);
    for (int i = 0; i < 512; i++)
        norm[i] += 1.0f;
    for (size_t f = 0; f < KILN_ARRAY_LEN(fs); f++) {
        kt_weight gate, up, down;
        kt_weight_make(&gate, &r, fs[f], 768, 512);
        kt_weight_make(&up, &r, fs[f], 768, 512);
        kt_weight_make(&down, &r, fs[f], 512, 768);
        kiln_graph *g = kt_ffn_graph(&gate, &up, &down, norm);
        kiln_session *s = wgmma_session(g);
        const char *what = kiln_format_get(fs[f])->name;
        double worst = 0;
        for (size_t i = 0; i < KILN_ARRAY_LEN(token_counts); i++)
            worst = fmax(worst, kt_check_session(s, g, token_counts[i], &r, what, NULL));
        fprintf(stderr, "wgmma ffn %-12s |gpu-ref| <= %.2f of the bound\n", what, worst);
        kt_session_destroy(s);
        kiln_graph_destroy(g);
        kt_weight_free(&gate);
        kt_weight_free(&up);
        kt_weight_free(&down);
    }
}

/* ------------------------------------------------------------ wgmma_tc */

static kiln_session *wgmma_tc_session(kiln_graph *g, const int64_t *sizes, int n_sizes)
{
    kiln_session_options o = { .cache.path = cache_path, .quiet = 1,
                                .plan = { .backend = "wgmma_tc", .strict_backend = 1,
                                          .capture = sizes, .n_capture = n_sizes } };
    return kt_session_create(g, &o);
}

/* The register-operand kernel on the packed layout, every format it takes,
 * each of its six tiles (the shapes pick them on 132 SMs; the split ones
 * with K of one atom, an odd number and an even one, and with more tiles
 * than SMs): partial row tiles
 * of the packed layout (N = 200, 1001, 4232), partial column and token
 * tiles, K of one atom to twelve (Q4_K and Q6_K: whole super-blocks of
 * four atoms, one to three); and one weight copy on the device. */
static const kiln_format tc_formats[] = {
    KILN_FMT_F16,  KILN_FMT_NVFP4, KILN_FMT_MXFP4, KILN_FMT_GGML_MXFP4, KILN_FMT_Q8_0,
    KILN_FMT_Q4_0, KILN_FMT_Q4_K,  KILN_FMT_Q6_K,  KILN_FMT_MXFP8,
};
static const struct {
    int64_t n, k;
    int64_t capture[2];
    const char *variant; /* of the largest bucket, on 132 SMs */
    int64_t tokens[5];
} tc_cases[] = {
    { 256, 768, { 64, 256 }, "bt64s2", { 1, 17, 64, 65, 256 } },
    { 1001, 192, { 64, 300 }, "bt64s2", { 2, 63, 64, 200, 300 } },
    { 2048, 64, { 16, 1024 }, "bt256s2", { 16, 17, 129, 1000, 1024 } },
    { 4232, 128, { 64, 4096 }, "bt256", { 1, 65, 257, 3000, 4096 } },
    { 16384, 64, { 64, 128 }, "bt128", { 1, 33, 64, 65, 128 } }, /* 64: bt64 */
    { 4096, 128, { 16, 200 }, "bt128s2", { 16, 17, 100, 199, 200 } },
    /* 376 split tiles for 132 SMs: blocks loop over tiles, the sums'
     * buffer handed back and forth; five atoms, both consumers' MMAs */
    { 3000, 320, { 16, 2048 }, "bt256s2", { 16, 17, 1000, 2047, 2048 } },
};

/* K of case c for format f: whole blocks. */
static int64_t tc_case_k(kiln_format f, size_t c)
{
    const int64_t block = kiln_format_get(f)->block;
    return (tc_cases[c].k + block - 1) / block * block;
}

static kiln_plan *tc_case_plan(kiln_graph *g, const kiln_target *t, size_t c)
{
    kiln_plan_options po = { .backend = "wgmma_tc", .strict_backend = 1,
                             .capture = tc_cases[c].capture, .n_capture = 2 };
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_plan_create(g, t, &po, &p), KILN_OK, "%s", kiln_last_error());
    return p;
}

/* The cases reach each of the six tiles on 132 SMs, over the formats:
 * the plans alone, so that the runs below can go one format a process. */
Test(gpu_wgmma, wgmma_tc_cases_reach_every_tile)
{
    need_hopper();
    kiln_target live;
    cr_assert_eq(kiln_target_live(0, &live), KILN_OK, "%s", kiln_last_error());
    if (live.sm_count != 132) {
        fprintf(stderr, "wgmma_tc tiles: the cases pick them on 132 SMs, this %s has %d: "
                "not asserted\n", live.name, live.sm_count);
        return;
    }
    kt_rng r = kt_rng_new(23);
    static const char *const all[] = { "bt256", "bt128", "bt64", "bt256s2", "bt128s2", "bt64s2" };
    int seen[KILN_ARRAY_LEN(all)] = { 0 };
    for (size_t f = 0; f < KILN_ARRAY_LEN(tc_formats); f++)
        for (size_t c = 0; c < KILN_ARRAY_LEN(tc_cases); c++) {
            kt_weight w;
            kt_weight_make(&w, &r, tc_formats[f], tc_cases[c].n, tc_case_k(tc_formats[f], c));
            kiln_graph *g = kt_linear_graph(&w);
            kiln_plan *p = tc_case_plan(g, &live, c);
            for (size_t v = 0; v < KILN_ARRAY_LEN(all); v++)
                seen[v] += signatures_with(p, all[v]);
            kiln_plan_destroy(p);
            kiln_graph_destroy(g);
            kt_weight_free(&w);
        }
    for (size_t v = 0; v < KILN_ARRAY_LEN(all); v++)
        cr_assert_gt(seen[v], 0, "no case takes the %s tile", all[v]);
}

static void wgmma_tc_one(kiln_format f)
{
    kiln_target live;
    cr_assert_eq(kiln_target_live(0, &live), KILN_OK, "%s", kiln_last_error());
    kt_rng r = kt_rng_new(2400 + (uint64_t)f);
    for (size_t c = 0; c < KILN_ARRAY_LEN(tc_cases); c++) {
        const int64_t k = tc_case_k(f, c);
        kt_weight w;
        kt_weight_make(&w, &r, f, tc_cases[c].n, k);
        kiln_graph *g = kt_linear_graph(&w);
        kiln_session *s = wgmma_tc_session(g, tc_cases[c].capture, 2);
        const kiln_plan *p = kt_session_plan(s);
        if (live.sm_count == 132)
            cr_assert_eq(signatures_with(p, tc_cases[c].variant), 1, "%lldx%lld: %s",
                         (long long)tc_cases[c].n, (long long)tc_cases[c].k, tc_cases[c].variant);
        size_t storage, packed;
        cr_assert_eq(kiln_plan_weight_bytes(p, &storage, &packed), KILN_OK);
        cr_assert(storage == 0 && packed > 0, "one packed copy: %zu + %zu", storage, packed);
        char what[64];
        snprintf(what, sizeof what, "%s %lldx%lld", kiln_format_get(f)->name,
                 (long long)tc_cases[c].n, (long long)k);
        double worst = 0;
        for (size_t i = 0; i < KILN_ARRAY_LEN(tc_cases[c].tokens); i++)
            worst = fmax(worst, kt_check_session(s, g, tc_cases[c].tokens[i], &r, what, NULL));
        fprintf(stderr, "wgmma_tc %-24s |gpu-ref| <= %.2f of the bound\n", what, worst);
        kt_session_destroy(s);
        kiln_graph_destroy(g);
        kt_weight_free(&w);
    }
}

static void wgmma_tc_part(int part)
{
    need_hopper();
    fresh_cache();
    for (size_t f = (size_t)part; f < KILN_ARRAY_LEN(tc_formats); f += KT_PARTS)
        wgmma_tc_one(tc_formats[f]);
}

/* Every format wgmma_tc takes, in KT_PARTS tests. */
Test(gpu_wgmma, wgmma_tc_matches_the_cpu_1, .timeout = 1200)
{
    wgmma_tc_part(0);
}

Test(gpu_wgmma, wgmma_tc_matches_the_cpu_2, .timeout = 1200)
{
    wgmma_tc_part(1);
}

Test(gpu_wgmma, wgmma_tc_matches_the_cpu_3, .timeout = 1200)
{
    wgmma_tc_part(2);
}

Test(gpu_wgmma, wgmma_tc_matches_the_cpu_4, .timeout = 1200)
{
    wgmma_tc_part(3);
}

/* The FFN on wgmma_tc: gate and up share one bf16-tc step, up fuses
 * silu_mul and down the residual. */
Test(gpu_wgmma, wgmma_tc_ffn_matches_the_cpu, .timeout = 1200)
{
    need_hopper();
    fresh_cache();
    kt_rng r = kt_rng_new(25);
    static const kiln_format fs[] = { KILN_FMT_F16,  KILN_FMT_NVFP4, KILN_FMT_MXFP4,
                                      KILN_FMT_GGML_MXFP4, KILN_FMT_Q8_0, KILN_FMT_Q4_0,
                                      KILN_FMT_Q4_K, KILN_FMT_Q6_K, KILN_FMT_MXFP8 };
    float norm[512];
    kt_fill_normal(&r, norm, 512, 0.2f);
    for (int i = 0; i < 512; i++)
        norm[i] += 1.0f;
    for (size_t f = 0; f < KILN_ARRAY_LEN(fs); f++) {
        kt_weight gate, up, down;
        kt_weight_make(&gate, &r, fs[f], 768, 512);
        kt_weight_make(&up, &r, fs[f], 768, 512);
        kt_weight_make(&down, &r, fs[f], 512, 768);
        kiln_graph *g = kt_ffn_graph(&gate, &up, &down, norm);
        kiln_session *s = wgmma_tc_session(g, capture, 3);
        const char *what = kiln_format_get(fs[f])->name;
        double worst = 0;
        for (size_t i = 0; i < KILN_ARRAY_LEN(token_counts); i++)
            worst = fmax(worst, kt_check_session(s, g, token_counts[i], &r, what, NULL));
        fprintf(stderr, "wgmma_tc ffn %-12s |gpu-ref| <= %.2f of the bound\n", what, worst);
        kt_session_destroy(s);
        kiln_graph_destroy(g);
        kt_weight_free(&gate);
        kt_weight_free(&up);
        kt_weight_free(&down);
    }
}
