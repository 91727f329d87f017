/* What a GEMM moves and computes, and the arithmetic of timing it. */
#include "bench/bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct peer_info {
    const char *kind;
    const char *label;
    double weight_elem, act_elem; /* bytes per element of W and X */
    int scalar_scales;            /* one f32 per operand */
    int block_scales;             /* 128x128 on W, 1x128 on X */
} peer_info;

static const peer_info peers[] = {
    [KILN_BENCH_PEER_BF16] = { "bf16_cublas", "cuBLAS bf16", 2, 2, 0, 0 },
    [KILN_BENCH_PEER_FP8] = { "fp8_tensor", "cuBLASLt fp8", 1, 1, 1, 0 },
    [KILN_BENCH_PEER_FP8_BLOCK] = { "fp8_block", "cuBLASLt fp8 blk", 1, 1, 0, 1 },
};
_Static_assert(KILN_ARRAY_LEN(peers) == KILN_BENCH_PEER_COUNT, "one row per peer");

const char *kiln_bench_peer_kind(kiln_bench_peer p)
{
    return (unsigned)p < KILN_BENCH_PEER_COUNT ? peers[p].kind : "?";
}

const char *kiln_bench_peer_label(kiln_bench_peer p)
{
    return (unsigned)p < KILN_BENCH_PEER_COUNT ? peers[p].label : "?";
}

double kiln_bench_bytes_total(const kiln_bench_bytes *b) { return b->weight + b->act + b->out; }

kiln_status kiln_bench_kiln_bytes(kiln_format f, int64_t n, int64_t k, int64_t m,
                                  kiln_bench_bytes *out)
{
    size_t data, scale;
    kiln_status st = kiln_format_data_bytes(f, n, k, &data);
    if (st == KILN_OK)
        st = kiln_format_scale_bytes(f, n, k, &scale);
    if (st != KILN_OK)
        return st;
    *out = (kiln_bench_bytes){
        .weight = (double)data + (double)scale + (kiln_format_get(f)->has_global_scale ? 4 : 0),
        .act = 2.0 * (double)m * (double)k,
        .out = 2.0 * (double)m * (double)n,
    };
    return KILN_OK;
}

void kiln_bench_peer_bytes(kiln_bench_peer p, int64_t n, int64_t k, int64_t m,
                           kiln_bench_bytes *out)
{
    const peer_info *i = &peers[p];
    double kb = (double)kiln_ceil_div(k, 128);
    *out = (kiln_bench_bytes){
        .weight = i->weight_elem * (double)n * (double)k,
        .act = i->act_elem * (double)m * (double)k,
        .out = 2.0 * (double)m * (double)n,
    };
    if (i->scalar_scales) {
        out->weight += 4;
        out->act += 4;
    }
    if (i->block_scales) {
        out->weight += 4.0 * (double)kiln_ceil_div(n, 128) * kb;
        out->act += 4.0 * (double)m * kb;
    }
}

double kiln_bench_flops(int64_t n, int64_t k, int64_t m)
{
    return 2.0 * (double)m * (double)n * (double)k;
}

int kiln_bench_rotation(double weight_bytes, double rotate_bytes)
{
    if (!(weight_bytes > 0) || !(rotate_bytes > weight_bytes))
        return 1;
    double copies = ceil(rotate_bytes / weight_bytes);
    return copies >= KILN_BENCH_MAX_ROTATION ? KILN_BENCH_MAX_ROTATION : (int)copies;
}

int kiln_bench_chain(int rotation)
{
    if (rotation < 1)
        rotation = 1;
    return (KILN_BENCH_MIN_CHAIN + rotation - 1) / rotation * rotation;
}

int kiln_bench_launches(double launch_us, int per_launch, int iters, double rep_ms)
{
    if (per_launch < 1)
        per_launch = 1;
    int by_count = (iters + per_launch - 1) / per_launch;
    if (by_count < 1)
        by_count = 1;
    if (!(launch_us > 0))
        return by_count;
    double fit = floor(rep_ms * 1000.0 / launch_us);
    if (fit < 1)
        return 1;
    return fit < by_count ? (int)fit : by_count;
}

static int cmp_f64(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double kiln_bench_median(const double *v, int n)
{
    assert(n >= 1 && n <= 1000);
    double s[1000];
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_f64);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

double kiln_bench_tbps(double bytes, double us) { return us > 0 ? bytes / us * 1e-6 : 0; }

double kiln_bench_tflops(double flops, double us) { return us > 0 ? flops / us * 1e-6 : 0; }

kiln_status kiln_bench_measure(kiln_bench_time_fn fn, void *ctx, int per_launch,
                               const kiln_bench_options *o, double *us_per_gemm)
{
    if (per_launch < 1 || o->reps < 1 || o->reps > 1000)
        return kiln_fail(KILN_ERR_INVALID_ARG, "measure: %d GEMMs per launch, %d repetitions",
                         per_launch, o->reps);
    double first, rest, v[1000];
    kiln_status st = fn(ctx, 1, &first);
    if (st == KILN_OK && o->warmup > per_launch)
        st = fn(ctx, kiln_bench_launches(first, per_launch, o->warmup - per_launch, o->rep_ms),
                &rest);
    int launches = kiln_bench_launches(first, per_launch, o->iters, o->rep_ms);
    for (int i = 0; st == KILN_OK && i < o->reps; i++)
        st = fn(ctx, launches, &v[i]);
    if (st != KILN_OK)
        return st;
    *us_per_gemm = kiln_bench_median(v, o->reps) / per_launch;
    return KILN_OK;
}
