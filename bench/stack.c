/* The FFN stack of `kiln-bench ffn`: its presets, what a step moves and
 * computes, its weights and graph, and the CPU reference of a few rows. */
#include "bench/bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Llama 3 8B and 70B. */
static const kiln_bench_stack_shape stacks[] = {
    { "llama8b", 4096, 14336, 32 },
    { "llama70b", 8192, 28672, 80 },
};

kiln_status kiln_bench_stack_parse(const char *name, kiln_bench_stack_shape *out)
{
    for (size_t i = 0; i < KILN_ARRAY_LEN(stacks); i++)
        if (name && !strcmp(name, stacks[i].name)) {
            *out = stacks[i];
            return KILN_OK;
        }
    return kiln_fail(KILN_ERR_INVALID_ARG, "--shape: \"%s\" is not a stack (llama8b, llama70b)",
                     name ? name : "");
}

kiln_status kiln_bench_stack_bytes(kiln_format f, const kiln_bench_stack_shape *s, int64_t m,
                                   double *bytes)
{
    kiln_bench_bytes gate, down;
    kiln_status st = kiln_bench_kiln_bytes(f, s->f, s->d, m, &gate);
    if (st == KILN_OK)
        st = kiln_bench_kiln_bytes(f, s->d, s->f, m, &down);
    if (st != KILN_OK)
        return st;
    *bytes = (2.0 * gate.weight + down.weight) * s->layers + 2.0 * 2.0 * (double)m * (double)s->d;
    return KILN_OK;
}

double kiln_bench_stack_flops(const kiln_bench_stack_shape *s, int64_t m)
{
    return 6.0 * (double)m * (double)s->d * (double)s->f * s->layers;
}

void kiln_bench_stack_free(kiln_bench_stack *s)
{
    kiln_bench_weight_free(&s->gate);
    kiln_bench_weight_free(&s->up);
    kiln_bench_weight_free(&s->down);
    free(s->norm);
    memset(s, 0, sizeof *s);
}

kiln_status kiln_bench_stack_make(kiln_format f, const kiln_bench_stack_shape *s,
                                  kiln_bench_rng *r, kiln_bench_stack *out)
{
    if (!s || !r || !out || s->d < 1 || s->f < 1 || s->layers < 1)
        return kiln_fail(KILN_ERR_INVALID_ARG, "bench stack: a shape of at least one layer");
    kiln_bench_stack k = { .shape = *s, .eps = 1e-5f };
    kiln_status st = kiln_bench_weight_make(f, s->f, s->d, r, &k.gate);
    if (st == KILN_OK)
        st = kiln_bench_weight_make(f, s->f, s->d, r, &k.up);
    if (st == KILN_OK)
        st = kiln_bench_weight_make(f, s->d, s->f, r, &k.down);
    if (st == KILN_OK && !(k.norm = malloc((size_t)s->d * sizeof *k.norm)))
        st = kiln_fail(KILN_ERR_NOMEM, "bench stack: the norm weight");
    if (st != KILN_OK) {
        kiln_bench_stack_free(&k);
        return st;
    }
    for (int64_t i = 0; i < s->d; i++)
        k.norm[i] = 1.0f + 0.1f * kiln_bench_rng_normal(r);
    *out = k;
    return KILN_OK;
}

static kiln_status stack_layer(const kiln_bench_stack *s, kiln_graph *g, int l, kiln_tensor **x)
{
    char n[8][48];
    static const char *const parts[] = { "norm", "gate.w", "up.w", "down.w",
                                         "h",    "gate",   "up",   "down" };
    for (int i = 0; i < 8; i++)
        snprintf(n[i], sizeof n[i], "blk.%d.%s", l, parts[i]);
    kiln_tensor *norm, *wg, *wu, *wd, *h, *gate, *up, *act, *prod, *down;
    kiln_status st;
    if ((st = kiln_graph_param(g, n[0], s->shape.d, s->norm, &norm)) ||
        (st = kiln_graph_weight(g, n[1], &s->gate.q, &wg)) ||
        (st = kiln_graph_weight(g, n[2], &s->up.q, &wu)) ||
        (st = kiln_graph_weight(g, n[3], &s->down.q, &wd)) ||
        (st = kiln_graph_rms_norm(g, n[4], *x, norm, s->eps, &h)) ||
        (st = kiln_graph_linear(g, n[5], h, wg, NULL, &gate)) ||
        (st = kiln_graph_linear(g, n[6], h, wu, NULL, &up)))
        return st;
    snprintf(n[0], sizeof n[0], "blk.%d.act", l);
    snprintf(n[1], sizeof n[1], "blk.%d.prod", l);
    snprintf(n[2], sizeof n[2], "blk.%d.out", l);
    if ((st = kiln_graph_silu(g, n[0], gate, &act)) ||
        (st = kiln_graph_mul(g, n[1], act, up, &prod)) ||
        (st = kiln_graph_linear(g, n[7], prod, wd, NULL, &down)))
        return st;
    return kiln_graph_add(g, n[2], *x, down, x);
}

kiln_status kiln_bench_stack_graph(const kiln_bench_stack *s, int layers, kiln_graph **out)
{
    if (!s || !out || layers < 1 || layers > s->shape.layers)
        return kiln_fail(KILN_ERR_INVALID_ARG, "bench stack graph: 1 to %d layers",
                         s ? s->shape.layers : 0);
    kiln_graph *g;
    kiln_status st = kiln_graph_create(&g);
    if (st != KILN_OK)
        return st;
    kiln_tensor *x;
    st = kiln_graph_input(g, "x", s->shape.d, &x);
    for (int l = 0; st == KILN_OK && l < layers; l++)
        st = stack_layer(s, g, l, &x);
    if (st == KILN_OK)
        st = kiln_graph_output(g, x);
    if (st != KILN_OK) {
        kiln_graph_destroy(g);
        return kiln_fail_prefix(st, "bench stack graph");
    }
    *out = g;
    return KILN_OK;
}

void kiln_bench_gather_rows(const float *x, int64_t d, const int64_t *rows, int n, float *out)
{
    for (int i = 0; i < n; i++)
        memcpy(out + (size_t)i * (size_t)d, x + (size_t)rows[i] * (size_t)d,
               (size_t)d * sizeof *out);
}

double kiln_bench_max_rel(const float *got, const float *want, size_t n)
{
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        /* NaN anywhere fails the comparison */
        if (!(d <= diff))
            diff = isnan(d) ? INFINITY : d;
        scale = fmax(scale, fabs((double)want[i]));
    }
    return scale > 0 ? diff / scale : diff;
}

/* The chain's own kernels: the norm (which also copies the step's input
 * into the residual stream at the first layer, so every replay starts from
 * the same x) and silu(gate) * up over the gate_up GEMM's output. BF16 is
 * carried as its bits; arithmetic in f32, rounding to nearest even. */
static const char chain_source[] =
    "typedef unsigned short bf16_t;\n"
    "__device__ __forceinline__ float from_bf16(bf16_t v)\n"
    "{ return __uint_as_float((unsigned)v << 16); }\n"
    "__device__ __forceinline__ bf16_t to_bf16(float f)\n"
    "{\n"
    "    unsigned u = __float_as_uint(f);\n"
    "    if ((u & 0x7FFFFFFFu) > 0x7F800000u)\n"
    "        return (bf16_t)((u >> 16) | 0x40u); /* a NaN stays one */\n"
    "    u += 0x7FFFu + ((u >> 16) & 1u);\n"
    "    return (bf16_t)(u >> 16);\n"
    "}\n"
    "extern \"C\" __global__ void chain_rms_norm(const bf16_t *x, bf16_t *copy, const float *w,\n"
    "                                          bf16_t *h, int d, float eps)\n"
    "{\n"
    "    const bf16_t *xr = x + (size_t)blockIdx.x * d;\n"
    "    float ss = 0.0f;\n"
    "    for (int i = threadIdx.x; i < d; i += blockDim.x) {\n"
    "        float v = from_bf16(xr[i]);\n"
    "        ss += v * v;\n"
    "    }\n"
    "    __shared__ float part[32];\n"
    "    for (int o = 16; o > 0; o >>= 1)\n"
    "        ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);\n"
    "    if ((threadIdx.x & 31) == 0)\n"
    "        part[threadIdx.x >> 5] = ss;\n"
    "    __syncthreads();\n"
    "    if (threadIdx.x < 32) {\n"
    "        ss = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;\n"
    "        for (int o = 16; o > 0; o >>= 1)\n"
    "            ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);\n"
    "        if (threadIdx.x == 0)\n"
    "            part[0] = ss;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    const float scale = rsqrtf(part[0] / (float)d + eps);\n"
    "    bf16_t *hr = h + (size_t)blockIdx.x * d;\n"
    "    for (int i = threadIdx.x; i < d; i += blockDim.x) {\n"
    "        if (copy)\n"
    "            copy[(size_t)blockIdx.x * d + i] = xr[i];\n"
    "        hr[i] = to_bf16(from_bf16(xr[i]) * scale * w[i]);\n"
    "    }\n"
    "}\n"
    "extern \"C\" __global__ void chain_silu_mul(const bf16_t *gu, bf16_t *a, int f, long long n)\n"
    "{\n"
    "    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i >= n)\n"
    "        return;\n"
    "    long long row = i / f, j = i - row * f;\n"
    "    float g = from_bf16(gu[row * 2 * f + j]), u = from_bf16(gu[row * 2 * f + f + j]);\n"
    "    a[i] = to_bf16(g / (1.0f + __expf(-g)) * u);\n"
    "}\n";

const char *kiln_bench_chain_source(void) { return chain_source; }
