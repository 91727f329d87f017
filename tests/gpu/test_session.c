/* The GPU session against the CPU executor: every registered backend and
 * format on fresh random inputs, several shapes and token counts; graph
 * replay against eager launches; weights reloaded in place under captured
 * graphs; offline misses. Skipped, with the reason, where there is no GPU. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/registry/backend.h"
#include "runtime/driver.h"
#include "gpuutil.h"

/* A private writable cache per test process. */
static char cache_path[256];
static void fresh_cache(void) { kt_fresh_cache(cache_path, sizeof cache_path); }

/* A bucket for each of gemv_tc's classes (tc1 to tc16) and one past
 * them. */
static const int64_t capture[] = { 1, 2, 4, 8, 16, 64 };

static kiln_session *session(kiln_graph *g, int eager)
{
    kiln_session_options o = { .cache.path = cache_path, .eager = eager, .quiet = 1,
                                .plan = { .capture = capture, .n_capture = 6 } };
    return kt_session_create(g, &o);
}

static void every_format_one(int f)
{
    kt_rng r = kt_rng_new(1000 + (uint64_t)f);
    /* 136 x 192: three atoms of 64, FP8 block's last 128-column block
     * partial (where the formats allow a K of 192) */
    static const int64_t shapes[][2] = { { 256, 512 }, { 200, 768 }, { 136, 192 } };
    static const int64_t ms[] = { 1, 2, 3, 7, 16, 50 };
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        if (shapes[sh][1] % kiln_format_get((kiln_format)f)->k_multiple)
            continue;
        kt_weight w;
        kt_weight_make(&w, &r, (kiln_format)f, shapes[sh][0], shapes[sh][1]);
        kiln_graph *g = kt_linear_graph(&w);
        kiln_session *s = session(g, 0);
        double worst = 0;
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
            worst = fmax(worst, kt_check_session(s, g, ms[i], &r,
                                               kiln_format_get((kiln_format)f)->name, NULL));
        fprintf(stderr, "%-12s %lldx%lld: |gpu-ref| <= %.2f of the bound\n",
                kiln_format_get((kiln_format)f)->name, (long long)shapes[sh][0],
                (long long)shapes[sh][1], worst);
        kt_session_destroy(s);
        kiln_graph_destroy(g);
        kt_weight_free(&w);
    }
}

/* RMS norm weights of width 512, about 1. */
static void norm_weights(kt_rng *r, float *w)
{
    kt_fill_normal(r, w, 512, 0.2f);
    for (int i = 0; i < 512; i++)
        w[i] += 1.0f;
}

/* A gated FFN whose gate and up projections are format f, 208 x 512 (13
 * row tiles: the last gate and up tiles pair across a partial tile), the
 * down projection BF16: in the decode buckets up's kernel computes the gate
 * (the gate epilogue, where gemv_tc serves f), in the others they run
 * apart; every bucket against the CPU executor. */
static void every_format_ffn(int f)
{
    if (512 % kiln_format_get((kiln_format)f)->k_multiple)
        return;
    kt_rng r = kt_rng_new(2000 + (uint64_t)f);
    static const int64_t ms[] = { 1, 2, 3, 7, 16, 50 };
    float norm[512];
    norm_weights(&r, norm);
    kt_weight gate, up, down;
    kt_weight_make(&gate, &r, (kiln_format)f, 208, 512);
    kt_weight_make(&up, &r, (kiln_format)f, 208, 512);
    kt_weight_make(&down, &r, KILN_FMT_BF16, 512, 208);
    kiln_graph *g = kt_ffn_graph(&gate, &up, &down, norm);
    kiln_session *s = session(g, 0);
    kiln_plan_linear l;
    cr_assert_eq(kiln_plan_linear_at(kt_session_plan(s), 1, 0, &l), KILN_OK);
    double worst = 0;
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        worst = fmax(worst, kt_check_session(s, g, ms[i], &r, "ffn", NULL));
    fprintf(stderr, "%-12s ffn, up at M=1 %s %s: |gpu-ref| <= %.2f of the bound\n",
            kiln_format_get((kiln_format)f)->name, l.backend, l.epilogue, worst);
    kt_session_destroy(s);
    kiln_graph_destroy(g);
    kt_weight_free(&gate);
    kt_weight_free(&up);
    kt_weight_free(&down);
}

static void every_format_part(int part)
{
    kt_need_gpu();
    fresh_cache();
    for (int f = part; f < KILN_FMT_COUNT; f += KT_PARTS) {
        every_format_one(f);
        every_format_ffn(f);
    }
}

/* Every format, in KT_PARTS tests. */
Test(gpu_session, every_format_matches_the_cpu_1, .timeout = 600)
{
    every_format_part(0);
}

Test(gpu_session, every_format_matches_the_cpu_2, .timeout = 600)
{
    every_format_part(1);
}

Test(gpu_session, every_format_matches_the_cpu_3, .timeout = 600)
{
    every_format_part(2);
}

Test(gpu_session, every_format_matches_the_cpu_4, .timeout = 600)
{
    every_format_part(3);
}

Test(gpu_session, fused_ffn_matches_the_cpu, .timeout = 600)
{
    kt_need_gpu();
    fresh_cache();
    kt_rng r = kt_rng_new(2);
    kiln_format fs[] = { KILN_FMT_BF16, KILN_FMT_FP8_BLOCK, KILN_FMT_NVFP4, KILN_FMT_Q4_K };
    float norm[512];
    norm_weights(&r, norm);
    for (size_t f = 0; f < sizeof fs / sizeof fs[0]; f++) {
        kt_weight gate, up, down;
        kt_weight_make(&gate, &r, fs[f], 768, 512);
        kt_weight_make(&up, &r, fs[f], 768, 512);
        kt_weight_make(&down, &r, fs[f], 512, 768);
        kiln_graph *g = kt_ffn_graph(&gate, &up, &down, norm);
        kiln_session *s = session(g, 0);
        for (int64_t m = 1; m <= 64; m *= 4)
            kt_check_session(s, g, m, &r, "", NULL);
        kt_session_destroy(s);
        kiln_graph_destroy(g);
        kt_weight_free(&gate);
        kt_weight_free(&up);
        kt_weight_free(&down);
    }
}

/* Static input scales (a checkpoint's input_scale): the quantizer of the
 * static schemes (fp8-static before an FP8 GEMM, bf16-qdq before a BF16
 * kernel) reads each linear's scale from the session, so the GPU computes
 * e4m3(x / s) · s as the CPU executor does; where the plan says a kernel
 * ignores the scale, its own scheme's contract holds. s = 2/448 saturates
 * the inputs past 2σ. In the FFN, gate and up read one input with two
 * scales: two quantization steps. */
Test(gpu_session, static_input_scales_match_the_cpu, .timeout = 600)
{
    kt_need_gpu();
    fresh_cache();
    kt_rng r = kt_rng_new(11);
    static const kiln_format fs[] = { KILN_FMT_FP8_TENSOR, KILN_FMT_FP8_CHANNEL,
                                      KILN_FMT_FP8_BLOCK, KILN_FMT_BF16 };
    static const int64_t ms[] = { 1, 3, 16, 50 };
    for (size_t f = 0; f < sizeof fs / sizeof fs[0]; f++) {
        kt_weight w;
        kt_weight_make(&w, &r, fs[f], 256, 512);
        kiln_graph *g = kt_linear_graph(&w);
        cr_assert_eq(kiln_graph_linear_input_scale(g, kiln_graph_find(g, "y"), 2.0f / 448),
                     KILN_OK);
        kiln_session *s = session(g, 0);
        const kiln_plan *p = kt_session_plan(s);
        double worst = 0;
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
            kiln_plan_linear l;
            cr_assert_eq(kiln_plan_linear_at(p, 0, kiln_plan_bucket_for(p, ms[i]), &l), KILN_OK);
            cr_assert_str_neq(l.input_scale_use, "", "the plan carries the scale");
            worst = fmax(worst, kt_check_session(s, g, ms[i], &r, l.input_scale_use, NULL));
            fprintf(stderr, "%-12s M=%-3lld %-8s %-10s\n", kiln_format_get(fs[f])->name,
                    (long long)ms[i], l.backend, l.input_scale_use);
        }
        fprintf(stderr, "%-12s static input scale: |gpu-ref| <= %.2f of the bound\n",
                kiln_format_get(fs[f])->name, worst);
        kt_session_destroy(s);
        kiln_graph_destroy(g);
        kt_weight_free(&w);
    }

    float norm[512];
    for (int i = 0; i < 512; i++)
        norm[i] = 1.0f;
    kt_weight gate, up, down;
    kt_weight_make(&gate, &r, KILN_FMT_FP8_CHANNEL, 768, 512);
    kt_weight_make(&up, &r, KILN_FMT_FP8_CHANNEL, 768, 512);
    kt_weight_make(&down, &r, KILN_FMT_FP8_CHANNEL, 512, 768);
    kiln_graph *g = kt_ffn_graph(&gate, &up, &down, norm);
    static const char *const lin[] = { "gate", "up", "down" };
    const float scales[] = { 2.0f / 448, 3.0f / 448, 0.25f / 448 };
    for (int i = 0; i < 3; i++)
        cr_assert_eq(kiln_graph_linear_input_scale(g, kiln_graph_find(g, lin[i]), scales[i]),
                     KILN_OK, "%s: %s", lin[i], kiln_last_error());
    kiln_session *s = session(g, 0);
    for (int64_t m = 1; m <= 64; m *= 4)
        kt_check_session(s, g, m, &r, "static ffn", NULL);
    kt_session_destroy(s);
    kiln_graph_destroy(g);
    kt_weight_free(&gate);
    kt_weight_free(&up);
    kt_weight_free(&down);
}

Test(gpu_session, graph_replay_equals_eager_launches, .timeout = 600)
{
    kt_need_gpu();
    fresh_cache();
    kt_rng r = kt_rng_new(3);
    kt_weight w;
    kt_weight_make(&w, &r, KILN_FMT_Q4_K, 384, 1024);
    kiln_graph *g = kt_linear_graph(&w);
    kiln_session *graphs = session(g, 0), *eager = session(g, 1);
    float x[37 * 1024], a[37 * 384], b[37 * 384];
    kt_fill_normal(&r, x, sizeof x / sizeof x[0], 1.0f);
    const float *in[] = { x };
    float *oa[] = { a }, *ob[] = { b };
    for (int rep = 0; rep < 3; rep++) {
        cr_assert_eq(kiln_session_run(graphs, 37, in, oa), KILN_OK);
        cr_assert_eq(kiln_session_run(eager, 37, in, ob), KILN_OK);
        cr_assert_eq(memcmp(a, b, sizeof a), 0, "replay and eager differ");
    }
    kt_session_destroy(graphs);
    kt_session_destroy(eager);
    kiln_graph_destroy(g);
    kt_weight_free(&w);
}

/* A tuning table that makes every bucket's step serial (kiln tune's
 * launch policy): the plan says so, and each bucket's outputs are those of
 * the overlapped launches bit for bit, the same kernels in the same order. */
Test(gpu_session, serial_steps_equal_overlapped_ones, .timeout = 600)
{
    kt_need_gpu();
    fresh_cache();
    kt_rng r = kt_rng_new(30);
    float norm[512];
    norm_weights(&r, norm);
    kt_weight gate, up, down;
    kt_weight_make(&gate, &r, KILN_FMT_Q4_K, 768, 512);
    kt_weight_make(&up, &r, KILN_FMT_Q4_K, 768, 512);
    kt_weight_make(&down, &r, KILN_FMT_Q4_K, 512, 768);
    kiln_graph *g = kt_ffn_graph(&gate, &up, &down, norm);
    kiln_session *overlapped = session(g, 0);
    const kiln_plan *p = kt_session_plan(overlapped);
    kiln_tuning *t;
    cr_assert_eq(kiln_tuning_create(&t), KILN_OK);
    for (int b = 0; b < kiln_plan_n_buckets(p); b++) {
        char key[KILN_SIGNATURE_MAX];
        cr_assert_eq(kiln_plan_step_key(p, b, key, sizeof key), KILN_OK, "%s", kiln_last_error());
        kiln_tuning_entry e = { .signature = key, .bucket = kiln_plan_bucket(p, b),
                                .variant = "serial", .heuristic = "overlap" };
        cr_assert_eq(kiln_tuning_set(t, &e), KILN_OK, "%s", kiln_last_error());
    }
    kiln_session_options o = { .cache.path = cache_path, .quiet = 1,
                                .plan = { .capture = capture, .n_capture = 6, .tuning = t } };
    kiln_session *serial = kt_session_create(g, &o);
    kiln_tuning_destroy(t);
    const kiln_plan *ps = kt_session_plan(serial);
    static float x[64 * 512], a[64 * 512], b[64 * 512];
    kt_fill_normal(&r, x, 64 * 512, 1.0f);
    const float *in[] = { x };
    float *oa[] = { a }, *ob[] = { b };
    for (int i = 0; i < kiln_plan_n_buckets(ps); i++) {
        const int64_t m = kiln_plan_bucket(ps, i);
        cr_assert_eq(kiln_plan_step_policy(ps, i), 1, "bucket %lld is serial", (long long)m);
        cr_assert_eq(kiln_plan_step_policy(p, i), -1);
        cr_assert_eq(kiln_session_run(overlapped, m, in, oa), KILN_OK, "%s", kiln_last_error());
        cr_assert_eq(kiln_session_run(serial, m, in, ob), KILN_OK, "%s", kiln_last_error());
        cr_assert_eq(memcmp(a, b, (size_t)m * 512 * sizeof(float)), 0,
                     "%lld tokens: serial and overlapped launches differ", (long long)m);
        float us = 0;
        cr_assert_eq(kiln_session_bench(serial, m, 3, &us), KILN_OK, "%s", kiln_last_error());
        cr_assert_gt(us, 0);
    }
    kt_session_destroy(overlapped);
    kt_session_destroy(serial);
    kiln_graph_destroy(g);
    kt_weight_free(&gate);
    kt_weight_free(&up);
    kt_weight_free(&down);
}

Test(gpu_session, reloaded_weights_reach_captured_graphs, .timeout = 600)
{
    kt_need_gpu();
    fresh_cache();
    kt_rng r = kt_rng_new(4);
    kt_weight w, w2;
    kt_weight_make(&w, &r, KILN_FMT_FP8_CHANNEL, 256, 512);
    kt_weight_make(&w2, &r, KILN_FMT_FP8_CHANNEL, 256, 512);
    kiln_graph *g = kt_linear_graph(&w);
    kiln_session *s = session(g, 0);
    float before[4 * 256], after[4 * 256];
    kt_check_session(s, g, 4, &r, "", before);
    /* New values in the caller's memory, then into the session's buffers:
     * the graphs instantiated at create time see them. */
    size_t data, scale;
    kiln_format_data_bytes(w.q.format, w.q.n, w.q.k, &data);
    kiln_format_scale_bytes(w.q.format, w.q.n, w.q.k, &scale);
    memcpy(w.q.data, w2.q.data, data);
    memcpy(w.q.scale, w2.q.scale, scale);
    const kiln_qtensor *live = kiln_tensor_weight(kiln_graph_find(g, "w"));
    cr_assert_eq(kiln_session_set_weight(s, "w", live), KILN_OK, "%s", kiln_last_error());
    kt_check_session(s, g, 4, &r, "", after);
    cr_assert_neq(memcmp(before, after, sizeof before), 0, "the output changed");

    kiln_qtensor other = w2.q;
    other.format = KILN_FMT_MXFP4;
    cr_assert_eq(kiln_session_set_weight(s, "w", &other), KILN_ERR_STATE);
    cr_assert(strstr(kiln_last_error(), "set_weight w: the session holds fp8_channel [256, 512]"),
              "%s", kiln_last_error());
    other = w2.q;
    other.n = 128;
    cr_assert_eq(kiln_session_set_weight(s, "w", &other), KILN_ERR_STATE);
    cr_assert_eq(kiln_session_set_weight(s, "nope", &w2.q), KILN_ERR_NOT_FOUND);
    kt_session_destroy(s);
    kiln_graph_destroy(g);
    kt_weight_free(&w);
    kt_weight_free(&w2);
}

/* A reload that one of a weight's layouts refuses (the gemv_tc packer, a
 * NaN NVFP4 block scale) changes none of its copies: the packed one
 * (buckets 1 to 16) and the storage-layout one (64) give the same bytes
 * as before, and still the CPU's numbers of the weight loaded. */
Test(gpu_session, refused_reload_keeps_every_copy, .timeout = 600)
{
    kt_need_gpu();
    fresh_cache();
    kt_rng r = kt_rng_new(6);
    kt_weight w, w2;
    kt_weight_make(&w, &r, KILN_FMT_NVFP4, 256, 512);
    kt_weight_make(&w2, &r, KILN_FMT_NVFP4, 256, 512);
    kiln_graph *g = kt_linear_graph(&w);
    kiln_session *s = session(g, 0);
    static const int64_t ms[] = { 4, 50 };
    float x[50 * 512], before[50 * 256], after[50 * 256];
    kt_fill_normal(&r, x, sizeof x / sizeof x[0], 1.0f);
    const float *in[] = { x };
    float *ob[] = { before }, *oa[] = { after };
    ((uint8_t *)w2.q.scale)[3 * 32 + 5] = 0x7F; /* row 3, K 80..95 */
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        cr_assert_eq(kiln_session_run(s, ms[i], in, ob), KILN_OK, "%s", kiln_last_error());
        cr_assert_eq(kiln_session_set_weight(s, "w", &w2.q), KILN_ERR_MALFORMED);
        cr_assert(strstr(kiln_last_error(), "weight w") && strstr(kiln_last_error(), "NaN"), "%s",
                  kiln_last_error());
        cr_assert_eq(kiln_session_run(s, ms[i], in, oa), KILN_OK, "%s", kiln_last_error());
        cr_assert_eq(memcmp(before, after, (size_t)ms[i] * 256 * sizeof(float)), 0,
                     "m = %lld: the refused reload changed the output", (long long)ms[i]);
        kt_check_session(s, g, ms[i], &r, "after a refused reload", NULL);
    }
    kt_session_destroy(s);
    kiln_graph_destroy(g);
    kt_weight_free(&w);
    kt_weight_free(&w2);
}

Test(gpu_session, offline_miss_names_the_signature, .timeout = 300)
{
    kt_need_gpu();
    fresh_cache();
    kt_rng r = kt_rng_new(5);
    kt_weight w;
    kt_weight_make(&w, &r, KILN_FMT_Q8_0, 64, 256);
    kiln_graph *g = kt_linear_graph(&w);
    kiln_session_options o = { .cache = { .path = cache_path, .offline = 1 }, .quiet = 1 };
    kiln_session *s = NULL;
    cr_assert_eq(kiln_session_create(g, &o, &s), KILN_ERR_OFFLINE_MISS);
    cr_assert_null(s);
    cr_assert(strstr(kiln_last_error(), "linear backend="), "%s", kiln_last_error());
    cr_assert(strstr(kiln_last_error(), "format=q8_0"), "%s", kiln_last_error());
    kiln_graph_destroy(g);
    kt_weight_free(&w);
}

Test(gpu_session, bad_token_counts_are_refused, .timeout = 300)
{
    kt_need_gpu();
    fresh_cache();
    kt_rng r = kt_rng_new(6);
    kt_weight w;
    kt_weight_make(&w, &r, KILN_FMT_BF16, 64, 128);
    kiln_graph *g = kt_linear_graph(&w);
    kiln_session *s = session(g, 0);
    float x[65 * 128], y[65 * 64];
    const float *in[] = { x };
    float *out[] = { y };
    memset(x, 0, sizeof x);
    cr_assert_eq(kiln_session_run(s, 65, in, out), KILN_ERR_SHAPE);
    cr_assert(strstr(kiln_last_error(), "serves 1 to 64"), "%s", kiln_last_error());
    cr_assert_eq(kiln_session_run(s, 0, in, out), KILN_ERR_SHAPE);
    kt_session_destroy(s);
    kiln_graph_destroy(g);
    kt_weight_free(&w);
}

/* Large inputs (4 MiB a run) replayed back to back: each run must see its
 * own input. A host copy that the replay does not wait for shows here as a
 * result computed from part of the previous input. */
Test(gpu_session, every_run_sees_its_own_large_input, .timeout = 300)
{
    kt_need_gpu();
    fresh_cache();
    kt_rng r = kt_rng_new(7);
    kt_weight w;
    kt_weight_make(&w, &r, KILN_FMT_BF16, 128, 4096);
    kiln_graph *g = kt_linear_graph(&w);
    static const int64_t sizes[] = { 512 };
    kiln_session_options o = { .cache.path = cache_path, .quiet = 1,
                                .plan = { .capture = sizes, .n_capture = 1 } };
    kiln_session *s = kt_session_create(g, &o);
    for (int rep = 0; rep < 6; rep++)
        kt_check_session(s, g, 512, &r, "", NULL);
    kt_session_destroy(s);
    kiln_graph_destroy(g);
    kt_weight_free(&w);
}

/* A wide N at 16 tokens: gemv_tc's tc16 takes four row tiles a warp from
 * 512 row tiles on. 8200 rows end on a partial row tile and a partial
 * block of row groups. */
Test(gpu_session, wide_decode_matches_the_cpu, .timeout = 600)
{
    kt_need_gpu();
    fresh_cache();
    kt_rng r = kt_rng_new(8);
    static const kiln_format fs[] = { KILN_FMT_BF16,  KILN_FMT_FP8_BLOCK, KILN_FMT_NVFP4,
                                      KILN_FMT_Q4_0,  KILN_FMT_Q4_K,      KILN_FMT_Q6_K,
                                      KILN_FMT_MXFP4 };
    static const int64_t sizes[] = { 16 };
    for (size_t f = 0; f < sizeof fs / sizeof fs[0]; f++) {
        kt_weight w;
        kt_weight_make(&w, &r, fs[f], 8200, 512);
        kiln_graph *g = kt_linear_graph(&w);
        kiln_session_options o = { .cache.path = cache_path, .quiet = 1,
                                    .plan = { .capture = sizes, .n_capture = 1 } };
        kiln_session *s = NULL;
        s = kt_session_create(g, &o);
        double worst = 0;
        for (int64_t m = 9; m <= 16; m += 7)
            worst = fmax(worst, kt_check_session(s, g, m, &r, kiln_format_get(fs[f])->name, NULL));
        fprintf(stderr, "%-12s 8200x512 m=9,16: |gpu-ref| <= %.2f of the bound\n",
                kiln_format_get(fs[f])->name, worst);
        kt_session_destroy(s);
        kiln_graph_destroy(g);
        kt_weight_free(&w);
    }
}

/* Decode linears each reading the one before's output, as a model's do: on
 * sm_90 a gemv_tc kernel starts while the one before drains, copying
 * its weights, and must wait for that kernel before it reads x. The wide
 * layers (24576 rows: 1536 blocks at one token on an H200, more than a
 * wave) start beside the narrow ones' last blocks, the narrow ones (64
 * blocks, under a wave, shared memory for one block an SM) on the SMs the
 * wide ones leave. One that read x early would take the previous run's
 * activations (another m, other inputs) and fail here. */
Test(gpu_session, chained_decode_linears_match_the_cpu, .timeout = 600)
{
    kt_need_gpu();
    fresh_cache();
    kt_rng r = kt_rng_new(9);
    static const kiln_format fs[] = { KILN_FMT_Q4_0, KILN_FMT_NVFP4, KILN_FMT_FP8_CHANNEL,
                                      KILN_FMT_Q4_K, KILN_FMT_MXFP4, KILN_FMT_Q6_K };
    static const int64_t dims[] = { 1024, 24576, 1024, 24576, 1024, 24576, 1024 };
    enum { L = sizeof fs / sizeof fs[0] };
    kt_weight w[L];
    kiln_graph *g;
    kiln_tensor *h, *wt;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    cr_assert_eq(kiln_graph_input(g, "x", dims[0], &h), KILN_OK);
    for (int i = 0; i < L; i++) {
        char name[16];
        kt_weight_make(&w[i], &r, fs[i], dims[i + 1], dims[i]);
        snprintf(name, sizeof name, "w%d", i);
        cr_assert_eq(kiln_graph_weight(g, name, &w[i].q, &wt), KILN_OK, "%s", kiln_last_error());
        snprintf(name, sizeof name, "h%d", i);
        cr_assert_eq(kiln_graph_linear(g, name, h, wt, NULL, &h), KILN_OK, "%s",
                     kiln_last_error());
    }
    cr_assert_eq(kiln_graph_output(g, h), KILN_OK);
    static const int64_t sizes[] = { 1, 2, 16 };
    kiln_session_options o = { .cache.path = cache_path, .quiet = 1,
                                .plan = { .capture = sizes, .n_capture = 3 } };
    static const int64_t ms[] = { 1, 2, 1, 16, 11, 1 };
    double worst = 0;
    /* replayed graphs, then the same launches one by one */
    for (int eager = 0; eager <= 1; eager++) {
        kiln_session *s = NULL;
        o.eager = eager;
        s = kt_session_create(g, &o);
        for (size_t i = 0; i < KILN_ARRAY_LEN(ms); i++)
            worst = fmax(worst, kt_check_session(s, g, ms[i], &r, eager ? "eager chain" : "chain",
                                               NULL));
        kt_session_destroy(s);
    }
    fprintf(stderr, "%d chained decode linears m=1,2,11,16: |gpu-ref| <= %.2f of the bound\n",
            L, worst);
    kiln_graph_destroy(g);
    for (int i = 0; i < L; i++)
        kt_weight_free(&w[i]);
}

/* A target whose cubins the device cannot load is refused before
 * anything is compiled or loaded, naming both targets. */
Test(gpu_session, cubin_for_another_arch_is_named, .timeout = 300)
{
    kt_need_gpu();
    fresh_cache();
    kt_rng r = kt_rng_new(8);
    kt_weight w;
    kt_weight_make(&w, &r, KILN_FMT_Q4_0, 64, 256);
    kiln_graph *g = kt_linear_graph(&w);
    kiln_target live, other;
    cr_assert_eq(kiln_target_live(0, &live), KILN_OK);
    /* sm_75 code runs on no later major architecture */
    cr_assert_eq(kiln_target_from_name(live.sm >= 80 ? "sm_75" : "sm_90a", &other), KILN_OK);
    kiln_session_options o = { .cache.path = cache_path, .quiet = 1, .target = &other };
    kiln_session *s = NULL;
    cr_assert_eq(kiln_session_create(g, &o, &s), KILN_ERR_UNSUPPORTED);
    cr_assert_null(s);
    const char *e = kiln_last_error();
    cr_assert(strstr(e, "cannot load cubins built for "), "%s", e);
    cr_assert(strstr(e, live.name), "%s", e);
    kiln_graph_destroy(g);
    kt_weight_free(&w);
}

/* A cold start that compiles books NVRTC's time as its own phase; one that
 * finds every kernel compiles nothing and books none. */
Test(gpu_session, compile_time_is_its_own_phase, .timeout = 300)
{
    kt_need_gpu();
    fresh_cache();
    kt_rng r = kt_rng_new(9);
    kt_weight w;
    kt_weight_make(&w, &r, KILN_FMT_Q8_0, 64, 256);
    kiln_graph *g = kt_linear_graph(&w);
    kiln_session *s = session(g, 0);
    kiln_session_stats st;
    kiln_session_get_stats(s, &st);
    cr_assert_gt(st.compiled, 0);
    cr_assert_gt(st.compile_s, 0);
    kiln_session_destroy(s);
    s = session(g, 0);
    kiln_session_get_stats(s, &st);
    cr_assert_eq(st.compiled, 0);
    cr_assert_eq(st.compile_s, 0);
    kiln_session_destroy(s);
    kiln_graph_destroy(g);
    kt_weight_free(&w);
}

/* kiln_session_profile times every step of a bucket: one entry a step,
 * in stream order, each named and positive, and together at least the
 * replay of the bucket's graph they were taken apart from. A short out
 * array is refused, with the step count. */
Test(gpu_session, profile_times_every_step, .timeout = 300)
{
    kt_need_gpu();
    fresh_cache();
    kt_rng r = kt_rng_new(12);
    float norm[512];
    kt_fill_normal(&r, norm, 512, 0.2f);
    kt_weight gate, up, down;
    kt_weight_make(&gate, &r, KILN_FMT_BF16, 768, 512);
    kt_weight_make(&up, &r, KILN_FMT_BF16, 768, 512);
    kt_weight_make(&down, &r, KILN_FMT_BF16, 512, 768);
    kiln_graph *g = kt_ffn_graph(&gate, &up, &down, norm);
    kiln_session *s = session(g, 0);
    for (int64_t m = 1; m <= 64; m *= 64) {
        kt_check_session(s, g, m, &r, "profile", NULL);
        kiln_step_time t[16];
        int n = -1;
        cr_assert_eq(kiln_session_profile(s, m, 3, t, 1, &n), KILN_ERR_INVALID_ARG);
        cr_assert_gt(n, 1, "rms_norm, gate, up and down: %d steps", n);
        cr_assert_eq(kiln_session_profile(s, m, 5, t, 16, &n), KILN_OK, "%s", kiln_last_error());
        double sum = 0;
        for (int i = 0; i < n; i++) {
            cr_assert(t[i].node && t[i].node[0], "step %d", i);
            cr_assert(t[i].kernel && t[i].kernel[0], "step %d", i);
            cr_assert_gt(t[i].us, 0.0, "step %d (%s)", i, t[i].node);
            sum += t[i].us;
            fprintf(stderr, "profile m=%lld: %-10s %8.2f us  %s\n", (long long)m, t[i].node,
                    t[i].us, t[i].kernel);
        }
        cr_assert(strstr(t[n - 1].kernel, "linear "), "down runs last: %s", t[n - 1].kernel);
        float replay = 0;
        cr_assert_eq(kiln_session_bench(s, m, 20, &replay), KILN_OK, "%s", kiln_last_error());
        cr_assert_geq(sum, 0.5 * replay, "steps %.2f us, replay %.2f us", sum, replay);
    }
    cr_assert_eq(kiln_session_profile(s, 100000, 1, NULL, 0, &(int){ 0 }), KILN_ERR_SHAPE);
    kt_session_destroy(s);
    kiln_graph_destroy(g);
    kt_weight_free(&gate);
    kt_weight_free(&up);
    kt_weight_free(&down);
}

/* --------------------------------------------------- caller's device buffers */

/* A BF16 matrix of rows x width in device memory, rows stride elements
 * apart; the columns past width hold a pattern no run may touch. */
typedef struct dev_matrix {
    CUdeviceptr ptr;
    int64_t rows, width, stride;
} dev_matrix;

/* Fill d's bytes with c. cuMemsetD8 and a cuMemcpyHtoD from pageable
 * memory may return before the device has finished them, and the caller's
 * stream does not wait for the legacy stream they run on (it is
 * non-blocking): wait for them here. */
static void dev_fill(const kiln_cu *cu, CUdeviceptr d, unsigned char c, size_t bytes)
{
    cr_assert_eq(cu->MemsetD8(d, c, bytes), CUDA_SUCCESS);
    cr_assert_eq(cu->CtxSynchronize(), CUDA_SUCCESS);
}

static const kiln_cu *driver(void)
{
    const kiln_cu *cu;
    cr_assert_eq(kiln_cu_get(&cu), KILN_OK, "%s", kiln_last_error());
    return cu;
}

static dev_matrix dev_matrix_new(const kiln_cu *cu, int64_t rows, int64_t width, int64_t stride)
{
    dev_matrix d = { 0, rows, width, stride };
    size_t bytes = (size_t)(rows * stride) * 2;
    cr_assert_eq(cu->MemAlloc(&d.ptr, bytes), CUDA_SUCCESS);
    dev_fill(cu, d.ptr, 0xab, bytes);
    return d;
}

/* The caller holds the device's primary context, as an engine does, and
 * a stream of its own that outlives the sessions. */
static CUstream callers_stream(const kiln_cu *cu, CUdevice *dev)
{
    CUcontext ctx;
    CUstream stream;
    cr_assert_eq(cu->Init(0), CUDA_SUCCESS);
    cr_assert_eq(cu->DeviceGet(dev, 0), CUDA_SUCCESS);
    cr_assert_eq(cu->DevicePrimaryCtxRetain(&ctx, *dev), CUDA_SUCCESS);
    cr_assert_eq(cu->CtxSetCurrent(ctx), CUDA_SUCCESS);
    cr_assert_eq(cu->StreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    return stream;
}

/* x's rows, rounded to BF16, into d; x keeps the rounded values. */
static void dev_matrix_put(const kiln_cu *cu, const dev_matrix *d, float *x)
{
    size_t n = (size_t)(d->rows * d->stride);
    uint16_t *h = malloc(n * 2);
    cr_assert(h);
    cr_assert_eq(cu->MemcpyDtoH(h, d->ptr, n * 2), CUDA_SUCCESS);
    for (int64_t r = 0; r < d->rows; r++)
        for (int64_t c = 0; c < d->width; c++) {
            h[r * d->stride + c] = kiln_f32_to_bf16(x[r * d->width + c]);
            x[r * d->width + c] = kiln_bf16_to_f32(h[r * d->stride + c]);
        }
    cr_assert_eq(cu->MemcpyHtoD(d->ptr, h, n * 2), CUDA_SUCCESS);
    cr_assert_eq(cu->CtxSynchronize(), CUDA_SUCCESS); /* see dev_fill */
    free(h);
}

/* d's first m rows into y as f32, asserting the bytes past each row's width
 * (and the rows past m) still hold the pattern. */
static void dev_matrix_get(const kiln_cu *cu, const dev_matrix *d, int64_t m, float *y)
{
    size_t n = (size_t)(d->rows * d->stride);
    uint16_t *h = malloc(n * 2);
    cr_assert(h);
    cr_assert_eq(cu->MemcpyDtoH(h, d->ptr, n * 2), CUDA_SUCCESS);
    for (int64_t r = 0; r < d->rows; r++)
        for (int64_t c = 0; c < d->stride; c++) {
            if (r < m && c < d->width)
                y[r * d->width + c] = kiln_bf16_to_f32(h[r * d->stride + c]);
            else
                cr_assert_eq(h[r * d->stride + c], 0xabab, "row %lld column %lld written",
                             (long long)r, (long long)c);
        }
    free(h);
}

/* kiln_session_run_device on strided slices of the caller's buffers and
 * the caller's stream computes what kiln_session_run computes, bit for bit
 * (the same kernels on the same BF16 inputs), and writes nothing else: on
 * the session's graphs, eagerly, and inside a CUDA graph the caller
 * captures on its stream and replays with new inputs. */
Test(gpu_session, device_buffers_on_the_callers_stream, .timeout = 600)
{
    kt_need_gpu();
    fresh_cache();
    const kiln_cu *cu = driver();
    kt_rng r = kt_rng_new(13);
    enum { D = 512, F = 768, MAX_M = 64, PAD = 24 };
    float norm[D];
    kt_fill_normal(&r, norm, D, 0.2f);
    kt_weight gate, up, down;
    kt_weight_make(&gate, &r, KILN_FMT_Q4_K, F, D);
    kt_weight_make(&up, &r, KILN_FMT_Q4_K, F, D);
    kt_weight_make(&down, &r, KILN_FMT_Q4_K, D, F);
    kiln_graph *g = kt_ffn_graph(&gate, &up, &down, norm);
    static float x[MAX_M * D], want[MAX_M * D], got[MAX_M * D];
    CUdevice dev;
    CUstream stream = callers_stream(cu, &dev);
    for (int eager = 0; eager < 2; eager++) {
        kiln_session *s = session(g, eager);
        dev_matrix dx = dev_matrix_new(cu, MAX_M, D, D + PAD),
                   dy = dev_matrix_new(cu, MAX_M, D, D + 2 * PAD);
        kiln_device_matrix in = { dx.ptr, dx.stride }, out = { dy.ptr, dy.stride };
        static const int64_t ms[] = { 1, 5, 16, 37, 64 };
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
            int64_t m = ms[i];
            kt_fill_normal(&r, x, (size_t)(MAX_M * D), 1.0f);
            dev_matrix_put(cu, &dx, x);
            const float *hin[] = { x };
            float *hout[] = { want };
            cr_assert_eq(kiln_session_run(s, m, hin, hout), KILN_OK, "%s", kiln_last_error());
            cr_assert_eq(kiln_session_run_device(s, m, &in, &out, stream), KILN_OK, "%s",
                         kiln_last_error());
            cr_assert_eq(cu->StreamSynchronize(stream), CUDA_SUCCESS);
            dev_matrix_get(cu, &dy, m, got);
            cr_assert_eq(memcmp(got, want, (size_t)(m * D) * sizeof *got), 0,
                         "eager %d, m %lld: device buffers and host arrays differ", eager,
                         (long long)m);
            dev_fill(cu, dy.ptr, 0xab, (size_t)(dy.rows * dy.stride) * 2);
        }
        /* Captured by the caller, replayed twice with new inputs. */
        int64_t m = 23;
        CUgraph graph;
        CUgraphExec exec;
        cr_assert_eq(cu->StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL),
                     CUDA_SUCCESS);
        kiln_status st = kiln_session_run_device(s, m, &in, &out, stream);
        cr_assert_eq(cu->StreamEndCapture(stream, &graph), CUDA_SUCCESS);
        cr_assert_eq(st, KILN_OK, "inside the caller's capture: %s", kiln_last_error());
        cr_assert_eq(cu->GraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
        for (int rep = 0; rep < 2; rep++) {
            kt_fill_normal(&r, x, (size_t)(MAX_M * D), 1.0f);
            dev_matrix_put(cu, &dx, x);
            const float *hin[] = { x };
            float *hout[] = { want };
            cr_assert_eq(kiln_session_run(s, m, hin, hout), KILN_OK, "%s", kiln_last_error());
            cr_assert_eq(cu->GraphLaunch(exec, stream), CUDA_SUCCESS);
            cr_assert_eq(cu->StreamSynchronize(stream), CUDA_SUCCESS);
            dev_matrix_get(cu, &dy, m, got);
            cr_assert_eq(memcmp(got, want, (size_t)(m * D) * sizeof *got), 0,
                         "eager %d, the caller's graph, replay %d: differs", eager, rep);
        }
        cu->GraphExecDestroy(exec);
        cu->GraphDestroy(graph);
        /* Unusable buffers are refused, naming them, before anything runs. */
        kiln_device_matrix odd = { dx.ptr + 1, 0 }, narrow = { dx.ptr, D - 1 };
        cr_assert_eq(kiln_session_run_device(s, 4, &odd, &out, stream), KILN_ERR_INVALID_ARG);
        cr_assert(strstr(kiln_last_error(), "input x"), "%s", kiln_last_error());
        cr_assert_eq(kiln_session_run_device(s, 4, &in, &narrow, stream), KILN_ERR_INVALID_ARG);
        cr_assert(strstr(kiln_last_error(), "output"), "%s", kiln_last_error());
        cr_assert_eq(kiln_session_run_device(s, 0, &in, &out, stream), KILN_ERR_SHAPE);
        cr_assert_eq(kiln_session_run_device(s, MAX_M + 1, &in, &out, stream), KILN_ERR_SHAPE);
        cu->MemFree(dx.ptr);
        cu->MemFree(dy.ptr);
        kt_session_destroy(s);
    }
    cu->StreamDestroy(stream);
    cu->DevicePrimaryCtxRelease(dev);
    kiln_graph_destroy(g);
    kt_weight_free(&gate);
    kt_weight_free(&up);
    kt_weight_free(&down);
}

/* The pattern dev_matrix_get checks, over buffers a run wrote. */
static void repaint(const kiln_cu *cu, const dev_matrix *const *d, int n)
{
    for (int i = 0; i < n; i++)
        dev_fill(cu, d[i]->ptr, 0xab, (size_t)(d[i]->rows * d[i]->stride) * 2);
}

/* Entry points on the GPU: the FFN with its gate linear as a second
 * output. Each entry run on the caller's buffers and stream gives what the
 * whole graph gives for that output, bit for bit, in graphs and eagerly;
 * an entry captured into the caller's graph and replayed with new inputs
 * too. */
Test(gpu_session, entries_give_what_the_whole_graph_gives, .timeout = 600)
{
    kt_need_gpu();
    fresh_cache();
    const kiln_cu *cu = driver();
    kt_rng r = kt_rng_new(14);
    enum { D = 512, F = 768, MAX_M = 64 };
    float norm[D];
    kt_fill_normal(&r, norm, D, 0.2f);
    kt_weight gate, up, down;
    kt_weight_make(&gate, &r, KILN_FMT_NVFP4, F, D);
    kt_weight_make(&up, &r, KILN_FMT_NVFP4, F, D);
    kt_weight_make(&down, &r, KILN_FMT_NVFP4, D, F);
    kiln_graph *g = kt_ffn_graph(&gate, &up, &down, norm);
    cr_assert_eq(kiln_graph_output(g, kiln_graph_find(g, "gate")), KILN_OK, "%s",
                 kiln_last_error());
    static float x[MAX_M * D], whole[MAX_M * F], alone[MAX_M * F];
    CUdevice dev;
    CUstream stream = callers_stream(cu, &dev);
    for (int eager = 0; eager < 2; eager++) {
        kiln_session *s = session(g, eager);
        int ey, eg;
        cr_assert_eq(kiln_session_find_entry(s, "y", &ey), KILN_OK, "%s", kiln_last_error());
        cr_assert_eq(kiln_session_find_entry(s, "gate", &eg), KILN_OK, "%s", kiln_last_error());
        dev_matrix dx = dev_matrix_new(cu, MAX_M, D, D + 8);
        dev_matrix ya = dev_matrix_new(cu, MAX_M, D, D), ga = dev_matrix_new(cu, MAX_M, F, F);
        dev_matrix ye = dev_matrix_new(cu, MAX_M, D, D + 4), ge = dev_matrix_new(cu, MAX_M, F, F);
        kiln_device_matrix in = { dx.ptr, dx.stride };
        kiln_device_matrix outs[] = { { ya.ptr, ya.stride }, { ga.ptr, ga.stride } };
        kiln_device_matrix oy = { ye.ptr, ye.stride }, og = { ge.ptr, ge.stride };
        const dev_matrix *outputs[] = { &ya, &ga, &ye, &ge };
        static const int64_t ms[] = { 1, 5, 16, 37, 64 };
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
            const int64_t m = ms[i];
            kt_fill_normal(&r, x, (size_t)(MAX_M * D), 1.0f);
            dev_matrix_put(cu, &dx, x);
            cr_assert_eq(kiln_session_run_device(s, m, &in, outs, stream), KILN_OK, "%s",
                         kiln_last_error());
            cr_assert_eq(kiln_session_run_entry(s, eg, m, &in, &og, stream), KILN_OK, "%s",
                         kiln_last_error());
            cr_assert_eq(kiln_session_run_entry(s, ey, m, &in, &oy, stream), KILN_OK, "%s",
                         kiln_last_error());
            cr_assert_eq(cu->StreamSynchronize(stream), CUDA_SUCCESS);
            dev_matrix_get(cu, &ya, m, whole);
            dev_matrix_get(cu, &ye, m, alone);
            cr_assert_eq(memcmp(whole, alone, (size_t)(m * D) * sizeof *whole), 0,
                         "eager %d, m %lld: entry y differs", eager, (long long)m);
            dev_matrix_get(cu, &ga, m, whole);
            dev_matrix_get(cu, &ge, m, alone);
            cr_assert_eq(memcmp(whole, alone, (size_t)(m * F) * sizeof *whole), 0,
                         "eager %d, m %lld: entry gate differs", eager, (long long)m);
            repaint(cu, outputs, 4);
        }
        int64_t m = 29;
        CUgraph graph;
        CUgraphExec exec;
        cr_assert_eq(cu->StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL),
                     CUDA_SUCCESS);
        kiln_status st = kiln_session_run_entry(s, ey, m, &in, &oy, stream);
        cr_assert_eq(cu->StreamEndCapture(stream, &graph), CUDA_SUCCESS);
        cr_assert_eq(st, KILN_OK, "inside the caller's capture: %s", kiln_last_error());
        cr_assert_eq(cu->GraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
        for (int rep = 0; rep < 2; rep++) {
            kt_fill_normal(&r, x, (size_t)(MAX_M * D), 1.0f);
            dev_matrix_put(cu, &dx, x);
            cr_assert_eq(kiln_session_run_device(s, m, &in, outs, stream), KILN_OK, "%s",
                         kiln_last_error());
            cr_assert_eq(cu->GraphLaunch(exec, stream), CUDA_SUCCESS);
            cr_assert_eq(cu->StreamSynchronize(stream), CUDA_SUCCESS);
            dev_matrix_get(cu, &ya, m, whole);
            dev_matrix_get(cu, &ye, m, alone);
            cr_assert_eq(memcmp(whole, alone, (size_t)(m * D) * sizeof *whole), 0,
                         "eager %d, the caller's graph, replay %d: differs", eager, rep);
            repaint(cu, outputs, 4);
        }
        cu->GraphExecDestroy(exec);
        cu->GraphDestroy(graph);
        const dev_matrix *all[] = { &dx, &ya, &ga, &ye, &ge };
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            cu->MemFree(all[i]->ptr);
        kt_session_destroy(s);
    }
    cu->StreamDestroy(stream);
    cu->DevicePrimaryCtxRelease(dev);
    kiln_graph_destroy(g);
    kt_weight_free(&gate);
    kt_weight_free(&up);
    kt_weight_free(&down);
}
