/* The wgmma backend on a Hopper GPU against the CPU executor: every format,
 * both tile variants, partial row and column tiles, and the fused
 * epilogues, with every linear forced onto wgmma. Skipped, with the
 * reason, where there is no GPU or it has no wgmma. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "gpuutil.h"

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

Test(gpu_wgmma, every_format_matches_the_cpu, .timeout = 1200)
{
    need_hopper();
    fresh_cache();
    kt_rng r = kt_rng_new(21);
    /* N = 200 and 136 leave partial column tiles in both variants. */
    static const int64_t shapes[][2] = { { 256, 512 }, { 200, 768 }, { 136, 256 } };
    for (int f = 0; f < KILN_FMT_COUNT; f++)
        for (size_t sh = 0; sh < KILN_ARRAY_LEN(shapes); sh++) {
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

Test(gpu_wgmma, fused_ffn_matches_the_cpu, .timeout = 1200)
{
    need_hopper();
    fresh_cache();
    kt_rng r = kt_rng_new(22);
    static const kiln_format fs[] = { KILN_FMT_BF16,  KILN_FMT_FP8_BLOCK, KILN_FMT_NVFP4,
                                      KILN_FMT_MXFP4, KILN_FMT_Q4_K,      KILN_FMT_Q6_K };
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
