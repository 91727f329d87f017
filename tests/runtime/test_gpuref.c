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

/* Every mutant on every listed format and shape; the contract's kernels
 * pass, the broken ones are caught. */
Test(gpuref, the_bound_passes_the_contract_and_catches_broken_kernels)
{
    kt_rng r = kt_rng_new(31);
    static const kiln_format fs[] = { KILN_FMT_BF16,  KILN_FMT_F16,   KILN_FMT_FP8_CHANNEL,
                                      KILN_FMT_FP8_BLOCK, KILN_FMT_MXFP8, KILN_FMT_NVFP4,
                                      KILN_FMT_MXFP4, KILN_FMT_Q8_0,  KILN_FMT_Q4_0,
                                      KILN_FMT_Q4_K,  KILN_FMT_Q6_K };
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
                double worst;
                char first[256];
                int64_t bad = kt_ref_violations(&want, y, &worst, first, sizeof first);
                const char *what = kiln_format_get(fs[f])->name;
                if (mu == MUT_NONE || mu == MUT_SPLIT)
                    cr_assert_eq(bad, 0, "%s %lldx%lld, %s: %lld outside the bound; %s", what,
                                 (long long)shapes[sh][0], (long long)shapes[sh][1],
                                 mutant_names[mu], (long long)bad, first);
                else
                    cr_assert_gt(bad, 0, "%s %lldx%lld, %s passes (worst %.2f of the bound)",
                                 what, (long long)shapes[sh][0], (long long)shapes[sh][1],
                                 mutant_names[mu], worst);
                free(y);
            }
            kt_ref_free(&want);
            free(x);
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
