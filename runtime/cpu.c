/* The CPU executor: the reference every GPU backend is checked against and
 * the fallback when there is no GPU. Weights are dequantized once to f32 and
 * repacked; activations live in one scratch buffer planned from liveness.
 *
 * Results do not depend on the thread count: each output element of a linear
 * is summed by one thread in plain k order (0, 1, ..., K-1), then the bias is
 * added. Threads only decide who computes which columns, never how. */
#include "graph/graph_impl.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum {
    /* A micro-tile is MR token rows by NR output columns: 8 four-wide SSE
     * accumulators, which leaves registers for the operands (x86-64's
     * baseline has 16). */
    KILN_CPU_MR = 4,
    KILN_CPU_NR = 8,
    KILN_CPU_V = KILN_CPU_NR / 2,
    /* K per block: one panel slice (KB x NR floats, 8 KiB) and the MR rows
     * of x it meets (4 KiB) stay in L1 while every token tile passes. */
    KILN_CPU_KB = 256,
    /* Activation rows start on a cache line. */
    KILN_CPU_ALIGN_FLOATS = 16,
    KILN_CPU_MAX_THREADS = 256,
};

/* Below this many multiply-adds a linear runs on the calling thread: waking
 * the pool costs more than it saves. */
#define KILN_CPU_PARALLEL_MACS (1 << 18)

/* ----------------------------------------------------------- thread pool */

typedef void (*kiln_cpu_job)(void *ctx, int part, int n_parts);

/* Persistent workers woken per job; the caller takes part 0. */
typedef struct kiln_cpu_pool {
    int n_threads; /* workers + the caller */
    pthread_t *workers;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    uint64_t generation; /* bumped per job */
    int pending;         /* workers still busy with the current job */
    bool stop;
    kiln_cpu_job job;
    void *ctx;
    int n_parts;
} kiln_cpu_pool;

typedef struct kiln_cpu_worker_arg {
    kiln_cpu_pool *pool;
    int part;
} kiln_cpu_worker_arg;

static void *pool_worker(void *p)
{
    kiln_cpu_worker_arg *arg = p;
    kiln_cpu_pool *pool = arg->pool;
    int part = arg->part;
    free(arg);
    uint64_t seen = 0;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (!pool->stop && pool->generation == seen)
            pthread_cond_wait(&pool->wake, &pool->mu);
        if (pool->stop)
            break;
        seen = pool->generation;
        kiln_cpu_job job = pool->job;
        void *ctx = pool->ctx;
        int n_parts = pool->n_parts;
        pthread_mutex_unlock(&pool->mu);
        if (part < n_parts)
            job(ctx, part, n_parts);
        pthread_mutex_lock(&pool->mu);
        if (--pool->pending == 0)
            pthread_cond_signal(&pool->done);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

/* A pool of just the caller; static initializers cannot fail. */
static void pool_init(kiln_cpu_pool *pool)
{
    *pool = (kiln_cpu_pool){
        .n_threads = 1,
        .mu = PTHREAD_MUTEX_INITIALIZER,
        .wake = PTHREAD_COND_INITIALIZER,
        .done = PTHREAD_COND_INITIALIZER,
    };
}

/* Start up to n_threads - 1 workers. Fewer is not an error: results do not
 * depend on the thread count, so a pool that could not start every thread
 * runs with those it has. */
static void pool_spawn(kiln_cpu_pool *pool, int n_threads)
{
    if (n_threads <= 1)
        return;
    pool->workers = kiln_calloc((size_t)n_threads - 1, sizeof *pool->workers);
    if (!pool->workers)
        return;
    for (int i = 1; i < n_threads; i++) {
        kiln_cpu_worker_arg *arg = kiln_malloc(sizeof *arg);
        if (!arg)
            break;
        *arg = (kiln_cpu_worker_arg){ pool, i };
        if (pthread_create(&pool->workers[i - 1], NULL, pool_worker, arg) != 0) {
            free(arg);
            break;
        }
        pool->n_threads++;
    }
}

static void pool_stop(kiln_cpu_pool *pool)
{
    pthread_mutex_lock(&pool->mu);
    pool->stop = true;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 0; i < pool->n_threads - 1; i++)
        pthread_join(pool->workers[i], NULL);
    free(pool->workers);
}

static void pool_run(kiln_cpu_pool *pool, kiln_cpu_job job, void *ctx, int n_parts)
{
    if (n_parts <= 1 || pool->n_threads <= 1) {
        job(ctx, 0, 1);
        return;
    }
    if (n_parts > pool->n_threads)
        n_parts = pool->n_threads;
    pthread_mutex_lock(&pool->mu);
    pool->job = job;
    pool->ctx = ctx;
    pool->n_parts = n_parts;
    pool->pending = pool->n_threads - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    job(ctx, 0, n_parts);
    pthread_mutex_lock(&pool->mu);
    while (pool->pending > 0)
        pthread_cond_wait(&pool->done, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
}

/* ------------------------------------------------------------------ GEMM */

/* W[N,K] repacked as panels of NR output columns: panel p holds, for each
 * k, the NR values W[p*NR + j][k] side by side (zeros past N). The
 * micro-kernel then reads one contiguous NR-vector per k. */
static size_t panel_count(int64_t n) { return (size_t)kiln_ceil_div(n, KILN_CPU_NR); }

/* acc[i][j] += sum over k < kn of x[i][k] * w[k*NR + j], k in order. Each
 * row and half-row has its own named accumulator because GCC at -O2 keeps
 * those in registers, where a 2-D array would stay in memory. */
static void gemm_micro(const float *const x[KILN_CPU_MR], const float *restrict w, int64_t kn,
                       float acc[restrict KILN_CPU_MR][KILN_CPU_NR])
{
    enum { V = KILN_CPU_V };
    const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
    float a0[V], b0[V], a1[V], b1[V], a2[V], b2[V], a3[V], b3[V];
    for (int j = 0; j < V; j++) {
        a0[j] = acc[0][j];
        b0[j] = acc[0][V + j];
        a1[j] = acc[1][j];
        b1[j] = acc[1][V + j];
        a2[j] = acc[2][j];
        b2[j] = acc[2][V + j];
        a3[j] = acc[3][j];
        b3[j] = acc[3][V + j];
    }
    for (int64_t k = 0; k < kn; k++, w += KILN_CPU_NR) {
        const float v0 = x0[k], v1 = x1[k], v2 = x2[k], v3 = x3[k];
        for (int j = 0; j < V; j++) {
            a0[j] += v0 * w[j];
            b0[j] += v0 * w[V + j];
            a1[j] += v1 * w[j];
            b1[j] += v1 * w[V + j];
            a2[j] += v2 * w[j];
            b2[j] += v2 * w[V + j];
            a3[j] += v3 * w[j];
            b3[j] += v3 * w[V + j];
        }
    }
    for (int j = 0; j < V; j++) {
        acc[0][j] = a0[j];
        acc[0][V + j] = b0[j];
        acc[1][j] = a1[j];
        acc[1][V + j] = b1[j];
        acc[2][j] = a2[j];
        acc[2][V + j] = b2[j];
        acc[3][j] = a3[j];
        acc[3][V + j] = b3[j];
    }
}

_Static_assert(KILN_CPU_MR == 4 && KILN_CPU_NR == 2 * KILN_CPU_V,
               "gemm_micro is written out for 4 rows of two half-panels");

/* Rows of x past m point here; their results are computed and dropped. */
static const float kiln_cpu_zeros[KILN_CPU_KB];

typedef struct kiln_cpu_gemm {
    const float *x;     /* [m, k] */
    const float *panels;/* panel_count(n) x [k, NR] */
    const float *bias;  /* [n] or NULL */
    float *y;           /* [m, n] */
    int64_t m, n, k;
} kiln_cpu_gemm;

/* Panels [p0, p1) of y = x · Wᵀ + bias. Partial sums pass through y between
 * K blocks; storing and reloading an f32 is exact, so every element is still
 * the plain k-order sum, whatever the blocking or the thread. */
static void gemm_panels(const kiln_cpu_gemm *c, size_t p0, size_t p1)
{
    float acc[KILN_CPU_MR][KILN_CPU_NR];
    const float *xr[KILN_CPU_MR];
    for (size_t p = p0; p < p1; p++) {
        int64_t n0 = (int64_t)p * KILN_CPU_NR;
        int64_t nc = c->n - n0 < KILN_CPU_NR ? c->n - n0 : KILN_CPU_NR;
        const float *panel = c->panels + p * (size_t)c->k * KILN_CPU_NR;
        for (int64_t k0 = 0; k0 < c->k; k0 += KILN_CPU_KB) {
            int64_t kn = c->k - k0 < KILN_CPU_KB ? c->k - k0 : KILN_CPU_KB;
            bool last = k0 + kn == c->k;
            for (int64_t m0 = 0; m0 < c->m; m0 += KILN_CPU_MR) {
                int64_t mr = c->m - m0 < KILN_CPU_MR ? c->m - m0 : KILN_CPU_MR;
                for (int i = 0; i < KILN_CPU_MR; i++) {
                    xr[i] = i < mr ? c->x + (size_t)(m0 + i) * (size_t)c->k + (size_t)k0
                                   : kiln_cpu_zeros;
                    for (int j = 0; j < KILN_CPU_NR; j++)
                        acc[i][j] = k0 > 0 && i < mr && j < nc
                                        ? c->y[(size_t)(m0 + i) * (size_t)c->n + (size_t)(n0 + j)]
                                        : 0.0f;
                }
                gemm_micro(xr, panel + (size_t)k0 * KILN_CPU_NR, kn, acc);
                for (int64_t i = 0; i < mr; i++) {
                    float *yr = c->y + (size_t)(m0 + i) * (size_t)c->n + (size_t)n0;
                    for (int64_t j = 0; j < nc; j++)
                        yr[j] = last && c->bias ? acc[i][j] + c->bias[n0 + j] : acc[i][j];
                }
            }
        }
    }
}

static void gemm_job(void *ctx, int part, int n_parts)
{
    const kiln_cpu_gemm *c = ctx;
    size_t np = panel_count(c->n);
    gemm_panels(c, np * (size_t)part / (size_t)n_parts, np * (size_t)(part + 1) / (size_t)n_parts);
}

/* ------------------------------------------------------------- executor */

typedef struct kiln_cpu_node {
    const kiln_tensor *t;
    int64_t off;          /* its rows start at scratch + off * m */
    const float *panels;  /* KILN_OP_LINEAR: the packed weight */
} kiln_cpu_node;

struct kiln_cpu {
    kiln_cpu_node *nodes; /* the graph's topological order at create time */
    int n_nodes;
    const kiln_tensor **inputs, **outputs;
    bool *input_used;     /* per input: read by some node or an output */
    int n_inputs, n_outputs;
    float **packed;       /* one per distinct weight */
    int n_packed;
    const float **buf;    /* per tensor id: its rows in the current run */
    bool *need;           /* per tensor id: the current run computes it */
    int n_tensors;        /* of the graph at create time */
    int64_t per_token;    /* scratch floats per token */
    int64_t widest;       /* the most floats per token of any one buffer */
    float *scratch;
    size_t scratch_floats;
    int64_t static_k;     /* the widest input of a linear with a static input scale */
    float *xq;            /* its quantized activations, [m, static_k] */
    size_t xq_floats;
    kiln_cpu_pool pool;
};

typedef void (*kiln_cpu_eval)(kiln_cpu *cpu, const kiln_cpu_node *nd, int64_t m, float *y);

/* A static input scale s makes the linear read x_q · s with
 * x_q = e4m3(x / s): the division and the product in f32, the E4M3
 * conversion saturating at ±448 (the clamp) and rounding to nearest even. */
static const float *static_quantize(kiln_cpu *cpu, const kiln_tensor *t, int64_t m)
{
    const float *x = cpu->buf[t->src[0]->id];
    const float s = t->input_scale;
    size_t n = (size_t)m * (size_t)t->src[0]->ne[0];
    for (size_t i = 0; i < n; i++)
        cpu->xq[i] = kiln_e4m3_to_f32(kiln_f32_to_e4m3(x[i] / s)) * s;
    return cpu->xq;
}

static void eval_linear(kiln_cpu *cpu, const kiln_cpu_node *nd, int64_t m, float *y)
{
    const kiln_tensor *t = nd->t;
    kiln_cpu_gemm c = {
        .x = t->input_scale > 0.0f ? static_quantize(cpu, t, m) : cpu->buf[t->src[0]->id],
        .panels = nd->panels,
        .bias = t->src[2] ? t->src[2]->param : NULL,
        .y = y,
        .m = m,
        .n = t->ne[0],
        .k = t->src[0]->ne[0],
    };
    double macs = (double)c.m * (double)c.n * (double)c.k;
    size_t np = panel_count(c.n);
    int parts = macs < KILN_CPU_PARALLEL_MACS ? 1 : cpu->pool.n_threads;
    if ((size_t)parts > np)
        parts = (int)np;
    pool_run(&cpu->pool, gemm_job, &c, parts);
}

static size_t elems(const kiln_cpu_node *nd, int64_t m) { return (size_t)m * (size_t)nd->t->ne[0]; }

static void eval_add(kiln_cpu *cpu, const kiln_cpu_node *nd, int64_t m, float *y)
{
    const float *a = cpu->buf[nd->t->src[0]->id], *b = cpu->buf[nd->t->src[1]->id];
    for (size_t i = 0, n = elems(nd, m); i < n; i++)
        y[i] = a[i] + b[i];
}

static void eval_mul(kiln_cpu *cpu, const kiln_cpu_node *nd, int64_t m, float *y)
{
    const float *a = cpu->buf[nd->t->src[0]->id], *b = cpu->buf[nd->t->src[1]->id];
    for (size_t i = 0, n = elems(nd, m); i < n; i++)
        y[i] = a[i] * b[i];
}

static void eval_silu(kiln_cpu *cpu, const kiln_cpu_node *nd, int64_t m, float *y)
{
    const float *x = cpu->buf[nd->t->src[0]->id];
    for (size_t i = 0, n = elems(nd, m); i < n; i++)
        y[i] = x[i] / (1.0f + expf(-x[i]));
}

/* 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), the approximation GPT-2 and
 * ggml use. */
static void eval_gelu(kiln_cpu *cpu, const kiln_cpu_node *nd, int64_t m, float *y)
{
    const float c = 0.7978845608028654f; /* √(2/π) */
    const float *x = cpu->buf[nd->t->src[0]->id];
    for (size_t i = 0, n = elems(nd, m); i < n; i++) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
    }
}

/* The sum of squares is accumulated in double: K terms of one sign, so an
 * f32 running sum would lose about log2(K) bits; in double the scale is
 * exact to f32 precision at any K a model has. */
static void eval_rms_norm(kiln_cpu *cpu, const kiln_cpu_node *nd, int64_t m, float *y)
{
    const kiln_tensor *t = nd->t;
    const float *x = cpu->buf[t->src[0]->id], *w = t->src[1]->param;
    size_t k = (size_t)t->ne[0];
    for (int64_t r = 0; r < m; r++) {
        const float *xr = x + (size_t)r * k;
        float *yr = y + (size_t)r * k;
        double ss = 0.0;
        for (size_t i = 0; i < k; i++)
            ss += (double)xr[i] * xr[i];
        float scale = (float)(1.0 / sqrt(ss / (double)k + (double)t->eps));
        for (size_t i = 0; i < k; i++)
            yr[i] = xr[i] * scale * w[i];
    }
}

static const kiln_cpu_eval evals[] = {
    [KILN_OP_INPUT] = NULL,
    [KILN_OP_WEIGHT] = NULL,
    [KILN_OP_PARAM] = NULL,
    [KILN_OP_LINEAR] = eval_linear,
    [KILN_OP_ADD] = eval_add,
    [KILN_OP_MUL] = eval_mul,
    [KILN_OP_SILU] = eval_silu,
    [KILN_OP_GELU] = eval_gelu,
    [KILN_OP_RMS_NORM] = eval_rms_norm,
};
_Static_assert(KILN_ARRAY_LEN(evals) == KILN_OP_COUNT, "one row per op");

/* Dequantize w once and repack it as panels. */
static kiln_status pack_weight(const kiln_tensor *w, float **out)
{
    const kiln_qtensor *q = &w->weight;
    size_t nk, np = panel_count(q->n), tmp_bytes, panel_floats, panel_bytes;
    if (!kiln_mul_size((size_t)q->n, (size_t)q->k, &nk) ||
        !kiln_mul_size(nk, sizeof(float), &tmp_bytes) ||
        !kiln_mul_size(np * KILN_CPU_NR, (size_t)q->k, &panel_floats) ||
        !kiln_mul_size(panel_floats, sizeof(float), &panel_bytes))
        return kiln_fail(KILN_ERR_SHAPE, "kiln_cpu_create: weight \"%s\" [%" PRId64 ", %" PRId64
                         "] is too large to dequantize", w->name, q->n, q->k);
    float *tmp = kiln_malloc(tmp_bytes);
    float *panels = kiln_malloc(panel_bytes);
    kiln_status st;
    if (!tmp || !panels)
        st = kiln_fail(KILN_ERR_NOMEM, "kiln_cpu_create: out of memory dequantizing weight \"%s\" "
                       "(%zu bytes)", w->name, tmp_bytes);
    else if ((st = kiln_dequantize(q, tmp)) != KILN_OK)
        kiln_fail_prefix(st, "kiln_cpu_create: weight \"%s\"", w->name);
    if (st != KILN_OK) {
        free(tmp);
        free(panels);
        return st;
    }
    for (size_t p = 0; p < np; p++) {
        float *dst = panels + p * (size_t)q->k * KILN_CPU_NR;
        for (int j = 0; j < KILN_CPU_NR; j++) {
            int64_t row = (int64_t)p * KILN_CPU_NR + j;
            const float *src = row < q->n ? tmp + (size_t)row * (size_t)q->k : NULL;
            for (int64_t k = 0; k < q->k; k++)
                dst[(size_t)k * KILN_CPU_NR + (size_t)j] = src ? src[k] : 0.0f;
        }
    }
    free(tmp);
    *out = panels;
    return KILN_OK;
}

static int64_t round_floats(int64_t n)
{
    return kiln_ceil_div(n, KILN_CPU_ALIGN_FLOATS) * KILN_CPU_ALIGN_FLOATS;
}

/* Give each node a place in a scratch of per_token floats per token, first
 * fit by liveness: a node's buffer is taken before its sources are released,
 * so no node reads and writes the same memory; outputs are never released,
 * they are copied out at the end. Offsets are per token, so one plan serves
 * every m. */
static kiln_status plan_memory(kiln_cpu *cpu)
{
    int n = cpu->n_nodes;
    size_t rows = (size_t)(n ? n : 1);
    int *last_use = kiln_malloc(rows * sizeof *last_use);
    int *live = kiln_malloc(rows * sizeof *live); /* live node indices, by offset */
    int *node_at = kiln_malloc((size_t)cpu->n_tensors * sizeof *node_at);
    if (!last_use || !live || !node_at) {
        free(last_use);
        free(live);
        free(node_at);
        return kiln_fail(KILN_ERR_NOMEM, "kiln_cpu_create: out of memory planning activations");
    }
    for (int i = 0; i < cpu->n_tensors; i++)
        node_at[i] = -1;
    for (int i = 0; i < n; i++) {
        node_at[cpu->nodes[i].t->id] = i;
        last_use[i] = cpu->nodes[i].t->is_output ? n : i;
    }
    for (int i = 0; i < n; i++)
        for (int s = 0; s < KILN_MAX_SRC; s++) {
            const kiln_tensor *src = cpu->nodes[i].t->src[s];
            if (src && node_at[src->id] >= 0 && last_use[node_at[src->id]] < i)
                last_use[node_at[src->id]] = i;
        }

    int n_live = 0;
    int64_t peak = 0;
    for (int i = 0; i < n; i++) {
        int64_t size = round_floats(cpu->nodes[i].t->ne[0]);
        int64_t at = 0;
        int slot = 0;
        for (; slot < n_live; slot++) {
            const kiln_cpu_node *b = &cpu->nodes[live[slot]];
            if (b->off - at >= size)
                break;
            at = b->off + round_floats(b->t->ne[0]);
        }
        memmove(live + slot + 1, live + slot, (size_t)(n_live - slot) * sizeof *live);
        live[slot] = i;
        n_live++;
        cpu->nodes[i].off = at;
        if (at + size > peak)
            peak = at + size;
        int kept = 0;
        for (int j = 0; j < n_live; j++)
            if (last_use[live[j]] > i)
                live[kept++] = live[j];
        n_live = kept;
    }
    cpu->per_token = peak;
    free(last_use);
    free(live);
    free(node_at);
    return KILN_OK;
}

void kiln_cpu_destroy(kiln_cpu *cpu)
{
    if (!cpu)
        return;
    pool_stop(&cpu->pool);
    for (int i = 0; i < cpu->n_packed; i++)
        free(cpu->packed[i]);
    free(cpu->packed);
    free(cpu->nodes);
    free(cpu->inputs);
    free(cpu->outputs);
    free(cpu->input_used);
    free(cpu->need);
    free(cpu->buf);
    free(cpu->scratch);
    free(cpu->xq);
    free(cpu);
}

int kiln_cpu_threads(const kiln_cpu *cpu) { return cpu->pool.n_threads; }

/* Copy what a run needs from g and dequantize the weights the order uses. */
static kiln_status cpu_prepare(kiln_cpu *cpu, kiln_graph *g)
{
    kiln_tensor *const *order;
    int n;
    kiln_status st = kiln_graph_topo(g, &order, &n);
    if (st != KILN_OK)
        return kiln_fail_prefix(st, "kiln_cpu_create");
    int nt = g->tensors.n;
    cpu->n_tensors = nt;
    cpu->n_nodes = n;
    cpu->n_inputs = g->inputs.n;
    cpu->n_outputs = g->outputs.n;
    cpu->nodes = kiln_calloc((size_t)(n ? n : 1), sizeof *cpu->nodes);
    cpu->inputs = kiln_calloc((size_t)(cpu->n_inputs ? cpu->n_inputs : 1), sizeof *cpu->inputs);
    cpu->outputs = kiln_calloc((size_t)cpu->n_outputs, sizeof *cpu->outputs);
    cpu->input_used = kiln_calloc((size_t)(cpu->n_inputs ? cpu->n_inputs : 1), sizeof *cpu->input_used);
    cpu->need = kiln_calloc((size_t)g->tensors.n + 1, sizeof *cpu->need);
    cpu->packed = kiln_calloc((size_t)(n ? n : 1), sizeof *cpu->packed);
    cpu->buf = kiln_calloc((size_t)nt, sizeof *cpu->buf);
    float **packed_of = kiln_calloc((size_t)nt, sizeof *packed_of); /* by weight id */
    if (!cpu->nodes || !cpu->inputs || !cpu->outputs || !cpu->input_used || !cpu->need ||
        !cpu->packed || !cpu->buf || !packed_of) {
        free(packed_of);
        return kiln_fail(KILN_ERR_NOMEM, "kiln_cpu_create: out of memory preparing %d nodes", n);
    }

    for (int i = 0; i < cpu->n_outputs; i++) {
        cpu->outputs[i] = g->outputs.v[i];
        if (cpu->outputs[i]->ne[0] > cpu->widest)
            cpu->widest = cpu->outputs[i]->ne[0];
    }
    for (int i = 0; i < cpu->n_inputs; i++) {
        const kiln_tensor *in = g->inputs.v[i];
        cpu->inputs[i] = in;
        if (in->ne[0] > cpu->widest)
            cpu->widest = in->ne[0];
        cpu->input_used[i] = in->is_output;
        for (int j = 0; j < n && !cpu->input_used[i]; j++)
            for (int s = 0; s < KILN_MAX_SRC; s++)
                if (order[j]->src[s] == in)
                    cpu->input_used[i] = true;
    }
    for (int i = 0; i < n && st == KILN_OK; i++) {
        const kiln_tensor *t = order[i];
        cpu->nodes[i].t = t;
        if (t->op != KILN_OP_LINEAR)
            continue;
        if (t->input_scale > 0.0f && t->src[0]->ne[0] > cpu->static_k)
            cpu->static_k = t->src[0]->ne[0];
        const kiln_tensor *w = t->src[1];
        if (!packed_of[w->id]) {
            st = pack_weight(w, &packed_of[w->id]);
            if (st == KILN_OK)
                cpu->packed[cpu->n_packed++] = packed_of[w->id];
        }
        cpu->nodes[i].panels = packed_of[w->id];
    }
    free(packed_of);
    if (st == KILN_OK)
        st = plan_memory(cpu);
    if (st == KILN_OK && cpu->per_token > cpu->widest)
        cpu->widest = cpu->per_token;
    return st;
}

kiln_status kiln_cpu_create(kiln_graph *g, const kiln_cpu_options *opts, kiln_cpu **out)
{
    if (!g || !out)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_cpu_create: %s is NULL", !g ? "graph" : "out");
    int threads = opts ? opts->threads : 0;
    if (threads < 0 || threads > KILN_CPU_MAX_THREADS)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_cpu_create: threads = %d; must be 0 (one per "
                         "core) up to %d", threads, KILN_CPU_MAX_THREADS);
    if (threads == 0)
        threads = kiln_cpu_count();
    if (threads > KILN_CPU_MAX_THREADS)
        threads = KILN_CPU_MAX_THREADS;
    kiln_cpu *cpu = kiln_calloc(1, sizeof *cpu);
    if (!cpu)
        return kiln_fail(KILN_ERR_NOMEM, "kiln_cpu_create: out of memory");
    pool_init(&cpu->pool);
    kiln_status st = cpu_prepare(cpu, g);
    if (st != KILN_OK) {
        kiln_cpu_destroy(cpu);
        return st;
    }
    pool_spawn(&cpu->pool, threads);
    *out = cpu;
    return KILN_OK;
}

kiln_status kiln_cpu_run(kiln_cpu *cpu, int64_t m, const float *const *inputs,
                         float *const *outputs)
{
    if (!cpu || !inputs || !outputs)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_cpu_run: %s is NULL",
                         !cpu ? "the executor" : !inputs ? "inputs" : "outputs");
    if (m <= 0)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "kiln_cpu_run: m = %" PRId64 " tokens; must be positive", m);
    size_t floats, bytes;
    if (!kiln_mul_size((size_t)m, (size_t)cpu->widest, &floats) ||
        !kiln_mul_size(floats, sizeof(float), &bytes))
        return kiln_fail(KILN_ERR_SHAPE,
                         "kiln_cpu_run: m = %" PRId64 " tokens is too large: %" PRId64
                         " floats per token overflow size_t", m, cpu->widest);
    /* What the outputs asked for depend on: a NULL output is not computed,
     * nor anything only it reads (a graph's entry points). */
    memset(cpu->need, 0, (size_t)cpu->n_tensors * sizeof *cpu->need);
    int asked = 0;
    for (int i = 0; i < cpu->n_outputs; i++)
        if (outputs[i])
            cpu->need[cpu->outputs[i]->id] = true, asked++;
    if (!asked && cpu->n_outputs)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "kiln_cpu_run: every output is NULL (outputs[0] is tensor \"%s\"): "
                         "nothing to compute",
                         cpu->outputs[0]->name);
    for (int i = cpu->n_nodes - 1; i >= 0; i--) {
        const kiln_tensor *t = cpu->nodes[i].t;
        for (int j = 0; cpu->need[t->id] && j < KILN_MAX_SRC; j++)
            if (t->src[j])
                cpu->need[t->src[j]->id] = true;
    }
    for (int i = 0; i < cpu->n_inputs; i++)
        if (!inputs[i] && cpu->input_used[i] && cpu->need[cpu->inputs[i]->id])
            return kiln_fail(KILN_ERR_INVALID_ARG,
                             "kiln_cpu_run: inputs[%d] (input \"%s\") is NULL", i,
                             cpu->inputs[i]->name);

    /* per_token is a multiple of the alignment, as aligned_alloc wants. */
    size_t need = (size_t)m * (size_t)cpu->per_token;
    if (need > cpu->scratch_floats) {
        float *s = kiln_aligned_alloc(KILN_CPU_ALIGN_FLOATS * sizeof(float), need * sizeof(float));
        if (!s)
            return kiln_fail(KILN_ERR_NOMEM,
                             "kiln_cpu_run: out of memory for %zu bytes of activations "
                             "(m = %" PRId64 ")", need * sizeof(float), m);
        free(cpu->scratch);
        cpu->scratch = s;
        cpu->scratch_floats = need;
    }

    size_t xq_need;
    if (!kiln_mul_size((size_t)m, (size_t)cpu->static_k, &xq_need) ||
        !kiln_mul_size(xq_need, sizeof(float), &bytes))
        return kiln_fail(KILN_ERR_SHAPE, "kiln_cpu_run: m = %" PRId64 " tokens is too large for "
                         "the quantized activations", m);
    if (xq_need > cpu->xq_floats) {
        float *q = kiln_malloc(bytes);
        if (!q)
            return kiln_fail(KILN_ERR_NOMEM,
                             "kiln_cpu_run: out of memory for %zu bytes of quantized activations "
                             "(m = %" PRId64 ")", bytes, m);
        free(cpu->xq);
        cpu->xq = q;
        cpu->xq_floats = xq_need;
    }

    for (int i = 0; i < cpu->n_inputs; i++)
        cpu->buf[cpu->inputs[i]->id] = inputs[i];
    for (int i = 0; i < cpu->n_nodes; i++) {
        const kiln_cpu_node *nd = &cpu->nodes[i];
        if (!cpu->need[nd->t->id])
            continue;
        float *y = cpu->scratch + (size_t)nd->off * (size_t)m;
        evals[nd->t->op](cpu, nd, m, y);
        cpu->buf[nd->t->id] = y;
    }
    for (int i = 0; i < cpu->n_outputs; i++) {
        const kiln_tensor *t = cpu->outputs[i];
        /* memmove: an output that is also an input may be the same buffer. */
        if (outputs[i])
            memmove(outputs[i], cpu->buf[t->id], (size_t)m * (size_t)t->ne[0] * sizeof(float));
    }
    return KILN_OK;
}
