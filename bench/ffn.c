/* `kiln-bench ffn`: a stack of FFN layers through the cuBLAS BF16 chain and
 * through kiln in each format, at every M, each checked on its first layers
 * against kiln's CPU executor before the whole stack is timed. */
#include "bench/gpu.h"
#include "codegen/nvrtc.h"

#include <stdlib.h>
#include <string.h>

enum { CHAIN_THREADS = 256 };

/* Activations quantized to E4M3 by a kernel make a larger error than BF16
 * ones: the check's tolerance, in units of the largest output. */
#define TOL_BF16 0x1p-6
#define TOL_FP8 0x1p-3

static void *dptr(CUdeviceptr p) { return (void *)(uintptr_t)p; }

typedef struct ffn_run {
    kiln_bench_gpu *g;
    const kiln_bench_options *o;
    kiln_bench_report *report;
    kiln_bench_rng rng;
    char name[KILN_BENCH_NAME];
    int64_t d, f, m_max;
    float *x;      /* [m_max, d], BF16-exact */
    float *y;      /* [m_max, d] */
    int64_t rows[4096];
    float *x_rows, *y_rows, *ref_rows; /* [check_rows, d] */
    kiln_bench_row peer[KILN_BENCH_MAX_MS];
    double kiln_bf16_us[KILN_BENCH_MAX_MS]; /* kiln's BF16 stack at each M, 0: not timed */
    int failed;
} ffn_run;

static void row_start(const ffn_run *r, int64_t m, const char *kind, kiln_bench_row *row)
{
    *row = (kiln_bench_row){ .n = r->f, .k = r->d, .m = m, .check_err = -1,
                             .rotation = r->o->stack.layers, .chain = 1 };
    snprintf(row->shape, sizeof row->shape, "%s", r->name);
    snprintf(row->kind, sizeof row->kind, "%s", kind);
    row->flops = kiln_bench_stack_flops(&r->o->stack, m);
}



/* The sampled rows of r->y against the CPU executor on the same rows of
 * r->x. The layers' sum, output minus input, is compared: the residual
 * stream's own x would dilute the tolerance. *rel is the largest
 * difference over the largest value of the reference's sum. */
static kiln_status check_rows(ffn_run *r, kiln_cpu *cpu, int64_t m, double *rel)
{
    int n = kiln_bench_sample_rows(m, r->o->check_rows, &r->rng, r->rows);
    kiln_bench_gather_rows(r->x, r->d, r->rows, n, r->x_rows);
    kiln_bench_gather_rows(r->y, r->d, r->rows, n, r->y_rows);
    const float *in[] = { r->x_rows };
    float *out[] = { r->ref_rows };
    kiln_status st = kiln_cpu_run(cpu, n, in, out);
    if (st != KILN_OK)
        return st;
    const size_t all = (size_t)n * (size_t)r->d;
    for (size_t i = 0; i < all; i++) {
        r->y_rows[i] -= r->x_rows[i];
        r->ref_rows[i] -= r->x_rows[i];
    }
    *rel = kiln_bench_max_rel(r->y_rows, r->ref_rows, all);
    return KILN_OK;
}

static void check_verdict(kiln_bench_row *row, double rel, double tol)
{
    row->check_err = rel;
    if (rel <= tol)
        return;
    char msg[sizeof row->error];
    snprintf(msg, sizeof msg,
             "the checked layers differ from the CPU executor by %.3g of the largest output "
             "(tolerance %.3g); not timed",
             rel, tol);
    kiln_bench_row_error(row, KILN_BENCH_FAIL, msg);
}

/* ----------------------------------------------------- the BF16 chain */

typedef struct chain {
    kiln_bench_gpu *g;
    int64_t d, f, m; /* m: the tokens of the unit being prepared */
    int layers;      /* the layers of the unit being prepared */
    float eps;
    CUmodule module;
    CUfunction norm, silu_mul;
    CUdeviceptr *wgu, *wd; /* per layer: gate and up [2f, d], down [d, f] */
    int n_layers;          /* allocated */
    CUdeviceptr norm_w, x0, x, h, gu, a;
} chain;

static void chain_free(chain *c)
{
    kiln_bench_gpu *g = c->g;
    for (int l = 0; l < c->n_layers; l++) {
        kiln_bench_free(g, &c->wgu[l]);
        kiln_bench_free(g, &c->wd[l]);
    }
    free(c->wgu);
    free(c->wd);
    CUdeviceptr *bufs[] = { &c->norm_w, &c->x0, &c->x, &c->h, &c->gu, &c->a };
    for (size_t i = 0; i < KILN_ARRAY_LEN(bufs); i++)
        kiln_bench_free(g, bufs[i]);
    if (c->module)
        g->cu->ModuleUnload(c->module);
    memset(c, 0, sizeof *c);
}

static kiln_status chain_kernels(chain *c)
{
    kiln_bench_gpu *g = c->g;
    kiln_nvrtc *nv;
    kiln_status st = kiln_nvrtc_open(&nv);
    if (st != KILN_OK)
        return st;
    kiln_compile_job job = { .name = "kiln-bench ffn: the BF16 chain's kernels",
                             .entry = "bench_chain", .source = kiln_bench_chain_source(),
                             .target = &g->target };
    st = kiln_nvrtc_compile(nv, &job, NULL);
    if (st == KILN_OK)
        st = kiln_cu_check(g->cu, g->cu->ModuleLoadData(&c->module, job.cubin), "chain module");
    if (st == KILN_OK)
        st = kiln_cu_check(g->cu, g->cu->ModuleGetFunction(&c->norm, c->module, "chain_rms_norm"),
                           "chain_rms_norm");
    if (st == KILN_OK)
        st = kiln_cu_check(g->cu,
                           g->cu->ModuleGetFunction(&c->silu_mul, c->module, "chain_silu_mul"),
                           "chain_silu_mul");
    kiln_compile_job_reset(&job);
    kiln_nvrtc_close(nv);
    return st;
}

/* Every layer's own copy of the BF16 stack's weights: the first uploaded,
 * the others copied from it on the device. */
static kiln_status chain_weights(chain *c, const kiln_bench_stack *s)
{
    kiln_bench_gpu *g = c->g;
    size_t half = (size_t)c->f * (size_t)c->d * 2, down = half;
    c->wgu = calloc((size_t)s->shape.layers, sizeof *c->wgu);
    c->wd = calloc((size_t)s->shape.layers, sizeof *c->wd);
    if (!c->wgu || !c->wd)
        return kiln_fail(KILN_ERR_NOMEM, "chain weights");
    c->n_layers = s->shape.layers;
    for (int l = 0; l < c->n_layers; l++) {
        kiln_status st = kiln_bench_alloc(g, &c->wgu[l], 2 * half, "chain gate_up weight");
        if (st == KILN_OK)
            st = kiln_bench_alloc(g, &c->wd[l], down, "chain down weight");
        if (st != KILN_OK)
            return kiln_fail_prefix(st, "layer %d of %d", l, c->n_layers);
        if (l == 0) {
            CU(g->cu->MemcpyHtoD(c->wgu[0], s->gate.q.data, half), "gate upload");
            CU(g->cu->MemcpyHtoD(c->wgu[0] + half, s->up.q.data, half), "up upload");
            CU(g->cu->MemcpyHtoD(c->wd[0], s->down.q.data, down), "down upload");
        } else {
            CU(g->cu->MemcpyDtoD(c->wgu[l], c->wgu[0], 2 * half), "gate_up copy");
            CU(g->cu->MemcpyDtoD(c->wd[l], c->wd[0], down), "down copy");
        }
    }
    return KILN_OK;
}

static kiln_status chain_create(chain *c, kiln_bench_gpu *g, const kiln_bench_stack *s,
                                const float *x, int64_t m_max)
{
    *c = (chain){ .g = g, .d = s->shape.d, .f = s->shape.f, .eps = s->eps };
    size_t xs = (size_t)m_max * (size_t)c->d;
    uint16_t *bf = malloc(xs * sizeof *bf);
    if (!bf)
        return kiln_fail(KILN_ERR_NOMEM, "chain input");
    for (size_t i = 0; i < xs; i++)
        bf[i] = kiln_f32_to_bf16(x[i]);
    kiln_status st = chain_kernels(c);
    if (st == KILN_OK)
        st = chain_weights(c, s);
    if (st == KILN_OK)
        st = kiln_bench_alloc(g, &c->norm_w, (size_t)c->d * sizeof(float), "chain norm");
    if (st == KILN_OK)
        st = kiln_cu_check(g->cu, g->cu->MemcpyHtoD(c->norm_w, s->norm,
                                                    (size_t)c->d * sizeof(float)),
                           "chain norm upload");
    if (st == KILN_OK)
        st = kiln_bench_alloc(g, &c->x0, xs * 2, "chain input");
    if (st == KILN_OK)
        st = kiln_cu_check(g->cu, g->cu->MemcpyHtoD(c->x0, bf, xs * 2), "chain input upload");
    if (st == KILN_OK)
        st = kiln_bench_alloc(g, &c->x, xs * 2, "chain residual stream");
    if (st == KILN_OK)
        st = kiln_bench_alloc(g, &c->h, xs * 2, "chain norm output");
    if (st == KILN_OK)
        st = kiln_bench_alloc(g, &c->gu, (size_t)m_max * (size_t)c->f * 4, "chain gate_up output");
    if (st == KILN_OK)
        st = kiln_bench_alloc(g, &c->a, (size_t)m_max * (size_t)c->f * 2, "chain silu*mul output");
    /* the copies ran on the legacy stream; the chain runs on the bench's
     * non-blocking one */
    if (st == KILN_OK)
        st = kiln_cu_check(g->cu, g->cu->CtxSynchronize(), "chain upload");
    free(bf);
    return st;
}

static kiln_status chain_launch(chain *c, CUfunction fn, unsigned blocks, void **params)
{
    kiln_bench_gpu *g = c->g;
    CUlaunchConfig cfg = { .gridDimX = blocks, .gridDimY = 1, .gridDimZ = 1,
                           .blockDimX = CHAIN_THREADS, .blockDimY = 1, .blockDimZ = 1,
                           .hStream = g->stream };
    CU(g->cu->LaunchKernelEx(&cfg, fn, params, NULL), "chain kernel launch");
    return KILN_OK;
}

/* Step i of the unit: layer i / 4's norm, gate_up GEMM, silu*mul, and down
 * GEMM adding into the residual stream. */
static kiln_status chain_enqueue(void *ctx, int i)
{
    chain *c = ctx;
    const int l = i / 4;
    const float one = 1.0f, zero = 0.0f;
    int d = (int)c->d, f = (int)c->f, m = (int)c->m;
    switch (i % 4) {
    case 0: {
        void *x = dptr(l ? c->x : c->x0), *copy = l ? NULL : dptr(c->x);
        void *w = dptr(c->norm_w), *h = dptr(c->h);
        void *params[] = { &x, &copy, &w, &h, &d, &c->eps };
        return chain_launch(c, c->norm, (unsigned)m, params);
    }
    case 1:
        return kiln_bench_blas_check(
            cublasGemmEx(c->g->blas, CUBLAS_OP_T, CUBLAS_OP_N, 2 * f, m, d, &one,
                         dptr(c->wgu[l]), CUDA_R_16BF, d, dptr(c->h), CUDA_R_16BF, d, &zero,
                         dptr(c->gu), CUDA_R_16BF, 2 * f, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx gate_up");
    case 2: {
        long long n = (long long)m * f;
        void *gu = dptr(c->gu), *a = dptr(c->a);
        void *params[] = { &gu, &a, &f, &n };
        return chain_launch(c, c->silu_mul, (unsigned)kiln_ceil_div(n, CHAIN_THREADS), params);
    }
    default:
        return kiln_bench_blas_check(
            cublasGemmEx(c->g->blas, CUBLAS_OP_T, CUBLAS_OP_N, d, m, f, &one, dptr(c->wd[l]),
                         CUDA_R_16BF, f, dptr(c->a), CUDA_R_16BF, f, &one, dptr(c->x),
                         CUDA_R_16BF, d, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx down");
    }
}

/* The first check_layers layers at m tokens, once; their output in r->y. */
static kiln_status chain_check_run(ffn_run *r, chain *c, int64_t m)
{
    kiln_bench_gpu *g = r->g;
    c->m = m;
    c->layers = r->o->check_layers;
    kiln_bench_unit u = { .enqueue = chain_enqueue, .ctx = c, .count = 4 * c->layers };
    kiln_bench_time_ctx tc = { g, &u };
    double us;
    kiln_status st = kiln_bench_unit_prepare(g, &u);
    if (st == KILN_OK)
        st = kiln_bench_unit_time(&tc, 1, &us);
    kiln_bench_unit_release(g, &u);
    size_t n = (size_t)m * (size_t)c->d;
    uint16_t *bf = st == KILN_OK ? malloc(n * sizeof *bf) : NULL;
    if (st == KILN_OK && !bf)
        st = kiln_fail(KILN_ERR_NOMEM, "chain output");
    if (st == KILN_OK)
        st = kiln_cu_check(g->cu, g->cu->MemcpyDtoH(bf, c->x, n * 2), "chain output");
    for (size_t i = 0; st == KILN_OK && i < n; i++)
        r->y[i] = kiln_bf16_to_f32(bf[i]);
    free(bf);
    return st;
}

static void chain_row(ffn_run *r, chain *c, kiln_cpu *cpu, int64_t m, kiln_bench_row *row)
{
    double rel = 0;
    kiln_status st = chain_check_run(r, c, m);
    if (st == KILN_OK)
        st = check_rows(r, cpu, m, &rel);
    if (st != KILN_OK) {
        kiln_bench_row_error(row, KILN_BENCH_ERROR, kiln_last_error());
        return;
    }
    check_verdict(row, rel, TOL_BF16);
    if (row->status != KILN_BENCH_OK)
        return;
    c->m = m;
    c->layers = r->o->stack.layers;
    kiln_bench_unit u = { .enqueue = chain_enqueue, .ctx = c, .count = 4 * c->layers };
    kiln_bench_time_ctx tc = { r->g, &u };
    st = kiln_bench_unit_prepare(r->g, &u);
    if (st == KILN_OK)
        st = kiln_bench_measure(kiln_bench_unit_time, &tc, 1, r->o, &row->us);
    kiln_bench_unit_release(r->g, &u);
    if (st != KILN_OK)
        kiln_bench_row_error(row, KILN_BENCH_ERROR, kiln_last_error());
}

static void peer_rows(ffn_run *r)
{
    const kiln_bench_options *o = r->o;
    fprintf(stderr, "kiln-bench: %s: the cuBLAS BF16 chain: building the weights\n", r->name);
    kiln_bench_stack s = { 0 };
    chain c = { .g = r->g };
    kiln_graph *check = NULL;
    kiln_cpu *cpu = NULL;
    kiln_status st = kiln_bench_stack_make(KILN_FMT_BF16, &o->stack, &r->rng, &s);
    if (st == KILN_OK)
        st = kiln_bench_stack_graph(&s, o->check_layers, &check);
    if (st == KILN_OK)
        st = kiln_cpu_create(check, NULL, &cpu);
    if (st == KILN_OK)
        st = chain_create(&c, r->g, &s, r->x, r->m_max);
    char why[sizeof r->peer[0].error] = "";
    if (st != KILN_OK)
        snprintf(why, sizeof why, "%s", kiln_last_error());
    for (int i = 0; i < o->n_ms; i++) {
        kiln_bench_row *row = &r->peer[i];
        double bytes;
        row_start(r, o->ms[i], kiln_bench_peer_kind(KILN_BENCH_PEER_BF16), row);
        snprintf(row->format, sizeof row->format, "bf16");
        if (kiln_bench_stack_bytes(KILN_FMT_BF16, &o->stack, o->ms[i], &bytes) == KILN_OK)
            row->bytes = bytes;
        if (st != KILN_OK)
            kiln_bench_row_error(row, KILN_BENCH_ERROR, why);
        else
            chain_row(r, &c, cpu, o->ms[i], row);
        r->failed |= kiln_bench_row_emit(r->report, row);
    }
    if (c.g)
        chain_free(&c);
    kiln_cpu_destroy(cpu);
    kiln_graph_destroy(check);
    kiln_bench_stack_free(&s);
}

/* -------------------------------------------------------------- kiln */

typedef struct kiln_stack {
    kiln_bench_stack s;
    kiln_graph *graph, *check;
    const kiln_plan *plan; /* the session's */
    kiln_session *session, *check_session;
    kiln_cpu *cpu;
} kiln_stack;

static void kiln_stack_free(kiln_stack *k)
{
    kiln_session_destroy(k->session);
    kiln_session_destroy(k->check_session);
    kiln_cpu_destroy(k->cpu);
    kiln_graph_destroy(k->graph);
    kiln_graph_destroy(k->check);
    kiln_bench_stack_free(&k->s);
    memset(k, 0, sizeof *k);
}

static kiln_status kiln_stack_create(ffn_run *r, kiln_format f, kiln_stack *k)
{
    const kiln_bench_options *o = r->o;
    kiln_status st = kiln_bench_stack_make(f, &o->stack, &r->rng, &k->s);
    if (st == KILN_OK)
        st = kiln_bench_stack_graph(&k->s, o->stack.layers, &k->graph);
    if (st == KILN_OK)
        st = kiln_bench_stack_graph(&k->s, o->check_layers, &k->check);
    if (st == KILN_OK)
        st = kiln_cpu_create(k->check, NULL, &k->cpu);
    if (st != KILN_OK)
        return st;
    kiln_session_options so = {
        .device = o->device, .cache.path = o->cache, .eager = o->eager, .quiet = 1,
        .plan = { .backend = o->backend, .capture = o->ms, .n_capture = o->n_ms },
    };
    /* the session's plan names the backends of each bucket */
    if ((st = kiln_session_create(k->check, &so, &k->check_session)) != KILN_OK ||
        (st = kiln_session_create(k->graph, &so, &k->session)) != KILN_OK)
        return st;
    k->plan = kiln_session_plan(k->session);
    return KILN_OK;
}

/* The check's tolerance at bucket b: FP8's where any linear quantizes its
 * activations to E4M3, BF16's otherwise. */
static double stack_tolerance(const kiln_plan *p, int b)
{
    for (int l = 0; l < kiln_plan_n_linears(p); l++) {
        kiln_plan_linear pl;
        if (kiln_plan_linear_at(p, l, b, &pl) == KILN_OK && strncmp(pl.act, "bf16", 4) != 0)
            return TOL_FP8;
    }
    return TOL_BF16;
}


static void kiln_row(ffn_run *r, kiln_stack *k, int mi, kiln_bench_row *row)
{
    const int64_t m = r->o->ms[mi];
    const int b = kiln_plan_bucket_for(k->plan, m);
    kiln_plan_linear pl;
    kiln_status st = kiln_plan_linear_at(k->plan, 0, b, &pl);
    if (st == KILN_OK) {
        snprintf(row->backend, sizeof row->backend, "%s", pl.backend);
        snprintf(row->act, sizeof row->act, "%s", pl.act);
    }
    const float *in[] = { r->x };
    float *out[] = { r->y };
    double rel = 0;
    if (st == KILN_OK)
        st = kiln_session_run(k->check_session, m, in, out);
    if (st == KILN_OK)
        st = check_rows(r, k->cpu, m, &rel);
    if (st != KILN_OK) {
        kiln_bench_row_error(row, KILN_BENCH_ERROR, kiln_last_error());
        return;
    }
    check_verdict(row, rel, stack_tolerance(k->plan, b));
    if (row->status != KILN_BENCH_OK)
        return;
    /* A replay runs on what the bucket's last run left in the activations:
     * the stack's own input, as the chain's is, not the zeros of a new
     * session. */
    kiln_bench_session_ctx sc = { k->session, m };
    if ((st = kiln_session_run(k->session, m, in, out)) != KILN_OK ||
        (st = kiln_bench_measure(kiln_bench_session_time, &sc, 1, r->o, &row->us)) != KILN_OK) {
        kiln_bench_row_error(row, KILN_BENCH_ERROR, kiln_last_error());
        return;
    }
    const kiln_bench_row *peer = &r->peer[mi];
    if (peer->status == KILN_BENCH_OK && peer->us > 0)
        row->speedup_bf16 = peer->us / row->us;
    if (!strcmp(row->format, "bf16"))
        r->kiln_bf16_us[mi] = row->us;
    if (r->kiln_bf16_us[mi] > 0)
        row->speedup_kiln_bf16 = r->kiln_bf16_us[mi] / row->us;
}

static void kiln_rows(ffn_run *r, kiln_format f)
{
    const kiln_bench_options *o = r->o;
    const char *name = kiln_format_get(f)->name;
    fprintf(stderr, "kiln-bench: %s %s: building the weights, planning, loading kernels\n",
            r->name, name);
    kiln_stack k = { 0 };
    kiln_status st = kiln_stack_create(r, f, &k);
    char why[sizeof r->peer[0].error] = "";
    if (st != KILN_OK)
        snprintf(why, sizeof why, "%s", kiln_last_error());
    for (int i = 0; i < o->n_ms; i++) {
        kiln_bench_row row;
        row_start(r, o->ms[i], "kiln", &row);
        snprintf(row.format, sizeof row.format, "%s", name);
        double bytes;
        if (kiln_bench_stack_bytes(f, &o->stack, o->ms[i], &bytes) == KILN_OK)
            row.bytes = bytes;
        if (st != KILN_OK)
            kiln_bench_row_error(&row, KILN_BENCH_ERROR, why);
        else
            kiln_row(r, &k, i, &row);
        r->failed |= kiln_bench_row_emit(r->report, &row);
    }
    kiln_stack_free(&k);
}

/* -------------------------------------------------------------- run */

static kiln_status run_data(ffn_run *r)
{
    size_t xs = (size_t)r->m_max * (size_t)r->d, rs = (size_t)r->o->check_rows * (size_t)r->d;
    r->x = malloc(xs * sizeof *r->x);
    r->y = malloc(xs * sizeof *r->y);
    r->x_rows = malloc(rs * sizeof *r->x_rows);
    r->y_rows = malloc(rs * sizeof *r->y_rows);
    r->ref_rows = malloc(rs * sizeof *r->ref_rows);
    if (!r->x || !r->y || !r->x_rows || !r->y_rows || !r->ref_rows)
        return kiln_fail(KILN_ERR_NOMEM, "host activations for M = %lld", (long long)r->m_max);
    /* BF16-exact, so kiln, the chain and the reference all see these values */
    for (size_t i = 0; i < xs; i++)
        r->x[i] = kiln_bf16_to_f32(kiln_f32_to_bf16(kiln_bench_rng_normal(&r->rng)));
    return KILN_OK;
}

static void run_free(ffn_run *r)
{
    free(r->x);
    free(r->y);
    free(r->x_rows);
    free(r->y_rows);
    free(r->ref_rows);
}


int kiln_bench_ffn(const kiln_bench_options *o)
{
    kiln_bench_gpu g;
    kiln_status st = kiln_bench_gpu_open(o->device, o->eager, &g);
    if (st != KILN_OK) {
        fprintf(stderr, "kiln-bench: %s\n", kiln_last_error());
        return 1;
    }
    kiln_bench_report report = { .l2_bytes = g.l2_bytes, .iters = o->iters, .reps = o->reps };
    snprintf(report.device, sizeof report.device, "%s", g.name);
    snprintf(report.target, sizeof report.target, "%s", g.target.name);
    int failed = 0;
    st = kiln_bench_copy_tbps(&g, (size_t)(o->copy_mb * 1e6), o, &report.copy_tbps);
    if (st != KILN_OK) {
        fprintf(stderr, "kiln-bench: %s\n", kiln_last_error());
        failed = 1;
    }
    ffn_run *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, "kiln-bench: out of memory\n");
        kiln_bench_gpu_close(&g);
        return 1;
    }
    *r = (ffn_run){ .g = &g, .o = o, .report = &report, .d = o->stack.d, .f = o->stack.f,
                    .rng = { o->seed * 0x2545F4914F6CDD1Dull }, .m_max = o->ms[o->n_ms - 1] };
    snprintf(r->name, sizeof r->name, "%.24s.ffn%d", o->stack.name, o->stack.layers);
    printf("device %s (%s), copy %.3f TB/s; stack %s: d %lld, f %lld, %d layers, checked on "
           "%d\n",
           report.device, report.target, report.copy_tbps, o->stack.name, (long long)r->d,
           (long long)r->f, o->stack.layers, o->check_layers);
    report.ffn = 1;
    kiln_bench_table_header(stdout, &report);
    if ((st = run_data(r)) == KILN_OK) {
        if (!o->no_peers)
            peer_rows(r);
        /* BF16 first: the other formats' rows give their ratio to it */
        for (int i = 0; i < o->n_formats; i++)
            if (o->formats[i] == KILN_FMT_BF16)
                kiln_rows(r, o->formats[i]);
        for (int i = 0; i < o->n_formats; i++)
            if (o->formats[i] != KILN_FMT_BF16)
                kiln_rows(r, o->formats[i]);
    } else {
        fprintf(stderr, "kiln-bench: %s\n", kiln_last_error());
        r->failed = 1;
    }
    failed |= r->failed;
    run_free(r);
    free(r);
    if (o->json)
        failed |= kiln_bench_json_save(&report, o->json);
    kiln_bench_report_free(&report);
    kiln_bench_gpu_close(&g);
    return failed;
}
