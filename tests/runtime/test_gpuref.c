/* The bound the GPU suites hold kernels to (tests/util/gpuref.c), tested on
 * the CPU: a kernel that keeps kiln's GPU contract (BF16 activations,
 * exact weights, f32 accumulation in any order, BF16 stores) passes it, and
 * each broken variant a kernel change could bring fails it — accumulation
 * in FP16, one block's scale off by a factor of two, one row reading its
 * neighbour block's weights. Emulated here, so the guard itself is checked
 * on every machine, GPU or not. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuutil.h"

typedef enum mutant {
    MUT_NONE,        /* the contract: f32 accumulation */
    MUT_SPLIT,       /* the contract, K split in four slices summed at the end */
    MUT_FP16_ACC,    /* the accumulator rounded to FP16 after every 16 products */
    MUT_SCALE,       /* one 32-block of one row at twice its scale */
    MUT_BLOCK,       /* one row reads the next 32-block's weights for its first */
    MUT_COUNT
} mutant;

static const char *const mutant_names[] = { "f32", "f32 k-split", "fp16 accumulator",
                                            "doubled block scale", "off-by-one block" };

static float bf16(float v) { return kiln_bf16_to_f32(kiln_f32_to_bf16(v)); }
static float f16(float v) { return kiln_f16_to_f32(kiln_f32_to_f16(v)); }

/* y = bf16(x̂ · ŵᵀ + b) as a kernel would compute it, broken as mut says. */
static float *emulate(const kt_weight *w, const float *x, int64_t m, mutant mut)
{
    const int64_t n = w->q.n, k = w->q.k;
    float *deq = malloc((size_t)(n * k) * sizeof *deq), *y = malloc((size_t)(m * n) * sizeof *y);
    cr_assert(deq && y);
    cr_assert_eq(kiln_dequantize(&w->q, deq), KILN_OK, "%s", kiln_last_error());
    const int64_t row = n / 3;
    if (mut == MUT_SCALE)
        for (int64_t l = 32; l < 64; l++)
            deq[row * k + l] *= 2;
    if (mut == MUT_BLOCK)
        memcpy(deq + row * k, deq + row * k + 32, 32 * sizeof *deq);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float acc = 0, part[4] = { 0 };
            for (int64_t l = 0; l < k; l++) {
                float p = bf16(x[i * k + l]) * deq[j * k + l];
                if (mut == MUT_SPLIT)
                    part[l * 4 / k] += p;
                else
                    acc += p;
                if (mut == MUT_FP16_ACC && l % 16 == 15)
                    acc = f16(acc);
            }
            if (mut == MUT_SPLIT)
                acc = (part[0] + part[1]) + (part[2] + part[3]);
            y[i * n + j] = bf16(acc + w->bias[j]);
        }
    free(deq);
    return y;
}

/* The emulated output y of the kernel named what on weight w: within the
 * bound everywhere when it keeps the contract, outside it somewhere when
 * it is broken. */
static void expect(const kt_ref *want, const float *y, const kt_weight *w, int keeps,
                   const char *what)
{
    double worst;
    char first[256];
    int64_t bad = kt_ref_violations(want, y, &worst, first, sizeof first);
    const char *format = kiln_format_get(w->q.format)->name;
    if (keeps)
        cr_assert_eq(bad, 0, "%s %lldx%lld, %s: %lld outside the bound; %s", format,
                     (long long)w->q.n, (long long)w->q.k, what, (long long)bad, first);
    else
        cr_assert_gt(bad, 0, "%s %lldx%lld, %s passes (worst %.2f of the bound)", format,
                     (long long)w->q.n, (long long)w->q.k, what, worst);
}

/* Every mutant on every listed format and shape; the contract's kernels
 * pass, the broken ones are caught. */
Test(gpuref, the_bound_passes_the_contract_and_catches_broken_kernels)
{
    kt_rng r = kt_rng_new(31);
    static const kiln_format fs[] = { KILN_FMT_BF16,  KILN_FMT_F16,   KILN_FMT_FP8_CHANNEL,
                                      KILN_FMT_FP8_BLOCK, KILN_FMT_MXFP8, KILN_FMT_NVFP4,
                                      KILN_FMT_MXFP4, KILN_FMT_Q8_0,  KILN_FMT_Q4_0,
                                      KILN_FMT_Q4_K,  KILN_FMT_Q6_K,  KILN_FMT_Q5_0,
                                      KILN_FMT_Q5_1,  KILN_FMT_Q2_K,  KILN_FMT_Q3_K,
                                      KILN_FMT_Q5_K,  KILN_FMT_IQ4_NL, KILN_FMT_IQ4_XS,
                                      KILN_FMT_Q4_1 };
    static const int64_t shapes[][2] = { { 128, 256 }, { 64, 512 } };
    const int64_t m = 16;
    for (size_t f = 0; f < sizeof fs / sizeof fs[0]; f++)
        for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
            kt_weight w;
            kt_weight_make(&w, &r, fs[f], shapes[sh][0], shapes[sh][1]);
            kiln_graph *g = kt_linear_graph(&w);
            float *x = malloc((size_t)(m * shapes[sh][1]) * sizeof *x);
            cr_assert_not_null(x);
            kt_fill_normal(&r, x, (size_t)(m * shapes[sh][1]), 1.0f);
            kt_ref want = kt_ref_eval(g, NULL, m, x);
            for (int mu = 0; mu < MUT_COUNT; mu++) {
                float *y = emulate(&w, x, m, (mutant)mu);
                expect(&want, y, &w, mu == MUT_NONE || mu == MUT_SPLIT, mutant_names[mu]);
                free(y);
            }
            kt_ref_free(&want);
            free(x);
            kiln_graph_destroy(g);
            kt_weight_free(&w);
        }
}

typedef enum fp8_mutant {
    FP8_NONE,    /* E4M3 activations, as the wgmma FP8 kernels run */
    FP8_DROPPED, /* the activation scales never applied */
    FP8_DOUBLED, /* the activation scales applied twice over */
    FP8_COUNT
} fp8_mutant;

static const char *const fp8_names[] = { "fp8 activations", "dropped activation scale",
                                         "doubled activation scale" };

/* y = bf16(Σ_groups s_ig · Σ q_il·ŵ_jl + b) over groups of g along K,
 * q = e4m3(x̂ / s), s = amax / 448 per row and group. */
static float *emulate_fp8(const kt_weight *w, const float *x, int64_t m, int64_t g,
                          fp8_mutant mut)
{
    const int64_t n = w->q.n, k = w->q.k;
    float *deq = malloc((size_t)(n * k) * sizeof *deq), *y = malloc((size_t)(m * n) * sizeof *y);
    float *q = malloc((size_t)k * sizeof *q), *s = malloc((size_t)k * sizeof *s);
    cr_assert(deq && y && q && s);
    cr_assert_eq(kiln_dequantize(&w->q, deq), KILN_OK, "%s", kiln_last_error());
    for (int64_t i = 0; i < m; i++) {
        for (int64_t b = 0; b < k; b += g) {
            float amax = 0;
            for (int64_t l = b; l < b + g; l++)
                amax = fmaxf(amax, fabsf(bf16(x[i * k + l])));
            s[b] = amax / 448.0f;
            for (int64_t l = b; l < b + g; l++)
                q[l] = kiln_e4m3_to_f32(kiln_f32_to_e4m3(bf16(x[i * k + l]) / s[b]));
            s[b] = mut == FP8_DROPPED ? 1.0f : mut == FP8_DOUBLED ? 2 * s[b] : s[b];
        }
        for (int64_t j = 0; j < n; j++) {
            float acc = 0;
            for (int64_t b = 0; b < k; b += g) {
                float part = 0;
                for (int64_t l = b; l < b + g; l++)
                    part += q[l] * deq[j * k + l];
                acc += part * s[b];
            }
            y[i * n + j] = bf16(acc + w->bias[j]);
        }
    }
    free(s);
    free(q);
    free(deq);
    return y;
}

/* The FP8 kernels' contract: each token's activations quantized to E4M3
 * with its own scale, or one for each 128 of K (block FP8). The bound
 * takes it, for short and long K, and still catches a scale dropped or
 * doubled. The plan is wgmma's on sm_90a, whose FP8 linears read
 * fp8-token or fp8-1x128 activations. */
Test(gpuref, fp8_activations_pass_and_broken_scales_fail)
{
    kt_rng r = kt_rng_new(32);
    static const kiln_format fs[] = { KILN_FMT_FP8_TENSOR, KILN_FMT_FP8_CHANNEL,
                                      KILN_FMT_FP8_BLOCK };
    static const int64_t shapes[][2] = { { 128, 256 }, { 64, 4096 } };
    static const int64_t capture[] = { 16 };
    const int64_t m = 16;
    kiln_target t;
    cr_assert_eq(kiln_target_from_name("sm_90a", &t), KILN_OK);
    for (size_t f = 0; f < sizeof fs / sizeof fs[0]; f++)
        for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
            kt_weight w;
            kt_weight_make(&w, &r, fs[f], shapes[sh][0], shapes[sh][1]);
            kiln_graph *g = kt_linear_graph(&w);
            const kiln_plan_options o = { .backend = "wgmma", .strict_backend = 1,
                                          .capture = capture, .n_capture = 1 };
            kiln_plan *p = NULL;
            cr_assert_eq(kiln_plan_create(g, &t, &o, &p), KILN_OK, "%s", kiln_last_error());
            kiln_plan_linear l;
            cr_assert_eq(kiln_plan_linear_at(p, 0, 0, &l), KILN_OK);
            const int block = fs[f] == KILN_FMT_FP8_BLOCK;
            cr_assert_str_eq(l.act, block ? "fp8-1x128" : "fp8-token");
            float *x = malloc((size_t)(m * shapes[sh][1]) * sizeof *x);
            cr_assert_not_null(x);
            kt_fill_normal(&r, x, (size_t)(m * shapes[sh][1]), 1.0f);
            kt_ref want = kt_ref_eval(g, p, m, x);
            for (int mu = 0; mu < FP8_COUNT; mu++) {
                float *y = emulate_fp8(&w, x, m, block ? 128 : shapes[sh][1], (fp8_mutant)mu);
                expect(&want, y, &w, mu == FP8_NONE, fp8_names[mu]);
                free(y);
            }
            kt_ref_free(&want);
            free(x);
            kiln_plan_destroy(p);
            kiln_graph_destroy(g);
            kt_weight_free(&w);
        }
}

typedef enum static_mutant {
    STATIC_FP8,     /* E4M3 codes with the static scale (wgmma's fp8-static) */
    STATIC_QDQ,     /* the same dequantized into BF16 for a BF16 kernel (bf16-qdq) */
    STATIC_DYNAMIC, /* the static scale ignored: each token's own amax / 448 */
    STATIC_NONE,    /* the static scale ignored: BF16 activations as they come */
    STATIC_DOUBLED, /* twice the static scale */
    STATIC_COUNT
} static_mutant;

static const char *const static_names[] = { "fp8-static", "bf16-qdq", "dynamic per token",
                                            "unquantized", "doubled static scale" };

/* y = bf16(Σ x_q·ŵ + b) with x_q = e4m3(x̂ / s)·s as the kernels of the
 * static schemes compute it (the codes and s apart for fp8-static, x_q
 * stored as BF16 for bf16-qdq), or broken as mut says. */
static float *emulate_static(const kt_weight *w, const float *x, int64_t m, float s,
                             static_mutant mut)
{
    const int64_t n = w->q.n, k = w->q.k;
    float *deq = malloc((size_t)(n * k) * sizeof *deq), *y = malloc((size_t)(m * n) * sizeof *y);
    float *q = malloc((size_t)k * sizeof *q);
    cr_assert(deq && y && q);
    cr_assert_eq(kiln_dequantize(&w->q, deq), KILN_OK, "%s", kiln_last_error());
    for (int64_t i = 0; i < m; i++) {
        float si = mut == STATIC_DOUBLED ? 2 * s : s;
        if (mut == STATIC_DYNAMIC) {
            float amax = 0;
            for (int64_t l = 0; l < k; l++)
                amax = fmaxf(amax, fabsf(bf16(x[i * k + l])));
            si = amax / 448.0f;
        }
        for (int64_t l = 0; l < k; l++) {
            float v = bf16(x[i * k + l]), c = kiln_e4m3_to_f32(kiln_f32_to_e4m3(v / si));
            q[l] = mut == STATIC_NONE ? v : mut == STATIC_FP8 ? c : bf16(c * si);
        }
        for (int64_t j = 0; j < n; j++) {
            float acc = 0;
            for (int64_t l = 0; l < k; l++)
                acc += q[l] * deq[j * k + l];
            y[i * n + j] = bf16((mut == STATIC_FP8 ? acc * si : acc) + w->bias[j]);
        }
    }
    free(q);
    free(deq);
    return y;
}

/* A static input scale: the plan's fp8-static (wgmma, FP8 weights) and
 * bf16-qdq (gemv) kernels pass the bound of the model's meaning, e4m3(x /
 * s)·s, and a kernel that ignores the scale (dynamic or no quantization)
 * or doubles it is caught. s = 2/448 saturates the inputs past 2σ. */
Test(gpuref, static_input_scales_pass_and_ignored_or_wrong_ones_fail)
{
    kt_rng r = kt_rng_new(33);
    static const int64_t shapes[][2] = { { 128, 256 }, { 64, 4096 } };
    static const struct {
        const char *backend, *use;
        int64_t m;
        static_mutant keeps;
    } paths[] = { { "wgmma", "fp8-static", 64, STATIC_FP8 }, { "gemv", "bf16-qdq", 4, STATIC_QDQ } };
    const float s = 2.0f / 448;
    kiln_target t;
    cr_assert_eq(kiln_target_from_name("sm_90a", &t), KILN_OK);
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (size_t pa = 0; pa < sizeof paths / sizeof paths[0]; pa++) {
            const int64_t m = paths[pa].m, k = shapes[sh][1];
            kt_weight w;
            kt_weight_make(&w, &r, KILN_FMT_FP8_CHANNEL, shapes[sh][0], k);
            kiln_graph *g = kt_linear_graph(&w);
            cr_assert_eq(kiln_graph_linear_input_scale(g, kiln_graph_find(g, "y"), s), KILN_OK);
            const kiln_plan_options o = { .backend = paths[pa].backend, .strict_backend = 1,
                                          .capture = &m, .n_capture = 1 };
            kiln_plan *p = NULL;
            cr_assert_eq(kiln_plan_create(g, &t, &o, &p), KILN_OK, "%s", kiln_last_error());
            kiln_plan_linear l;
            cr_assert_eq(kiln_plan_linear_at(p, 0, 0, &l), KILN_OK);
            cr_assert_str_eq(l.input_scale_use, paths[pa].use);
            float *x = malloc((size_t)(m * k) * sizeof *x);
            cr_assert_not_null(x);
            kt_fill_normal(&r, x, (size_t)(m * k), 1.0f);
            kt_ref want = kt_ref_eval(g, p, m, x);
            for (int mu = 0; mu < STATIC_COUNT; mu++) {
                if (mu == STATIC_FP8 + STATIC_QDQ - (int)paths[pa].keeps)
                    continue; /* the other path's kernel: within either bound */
                float *y = emulate_static(&w, x, m, s, (static_mutant)mu);
                char what[96];
                snprintf(what, sizeof what, "%s, %s", paths[pa].backend, static_names[mu]);
                expect(&want, y, &w, mu == (int)paths[pa].keeps, what);
                free(y);
            }
            kt_ref_free(&want);
            free(x);
            kiln_plan_destroy(p);
            kiln_graph_destroy(g);
            kt_weight_free(&w);
        }
}

/* The output's BF16 rounding is checked exactly: 1 within 0.001 may be
 * stored as 1 only (BF16 neighbours 1 − 2^-8 and 1 + 2^-7), 100 within
 * 0.6 as 99.5, 100 or 100.5; a NaN never passes. The first violation is
 * described. */
Test(gpuref, violations_are_counted_and_described)
{
    kt_ref want = { 1, 3, (double[]){ 1.0, -2.0, 100.0 }, (double[]){ 0.001, 0.001, 0.6 } };
    const float ok[] = { 1.0f, -2.0f, 100.5f }, bad[] = { NAN, -2.0f - 0x1p-6f, 101.0f },
                off[] = { 1.0f - 0x1p-8f, -2.0f, 99.5f };
    double worst;
    char first[256];
    cr_assert_eq(kt_ref_violations(&want, ok, &worst, first, sizeof first), 0);
    cr_assert(worst > 0.99 && worst <= 1.0, "worst %g", worst);
    cr_assert_eq(kt_ref_violations(&want, bad, &worst, first, sizeof first), 3);
    cr_assert(isinf(worst));
    cr_assert(strstr(first, "y[0][0]") && strstr(first, "nan"), "%s", first);
    cr_assert_eq(kt_ref_violations(&want, off, &worst, first, sizeof first), 1);
    cr_assert(strstr(first, "y[0][0]") && strstr(first, "0.99609375"), "%s", first);
}
