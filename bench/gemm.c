/* `kiln-bench gemm`: per shape, the peers at every M, then kiln in every
 * format at every M, each kiln kernel checked before it is timed. */
#include "bench/gpu.h"

#include <stdlib.h>
#include <string.h>

/* kiln's side of one (shape, format): R copies of the weight and a chain
 * of C linears (kiln_bench_chain), linear i reading copy i mod R behind its
 * own input, in one graph: one replay of a bucket runs C GEMMs cycling
 * through the copies (R covers the rotation's bytes, so none is read from
 * L2), and every GEMM quantizes its own activations where its kernel wants
 * FP8, as a lone linear would. */
typedef struct kiln_side {
    kiln_bench_weight w;
    int rotation, chain;
    kiln_graph *graph;
    const kiln_plan *plan; /* the session's */
    kiln_session *session;
    const float **inputs;
    float **outputs;
} kiln_side;

typedef struct shape_run {
    kiln_bench_gpu *g;
    const kiln_bench_options *o;
    const kiln_bench_shape *s;
    kiln_bench_report *report;
    kiln_bench_rng rng;
    double rotate_bytes;
    int64_t m_max;
    float *x;                                         /* [m_max, k], BF16-exact */
    float *y;                                         /* [m_max, n] */
    kiln_bench_row peer[KILN_BENCH_PEER_COUNT][KILN_BENCH_MAX_MS];
    int failed;
} shape_run;

static void row_start(const shape_run *r, int64_t m, kiln_bench_row *row)
{
    *row = (kiln_bench_row){ .n = r->s->n, .k = r->s->k, .m = m, .check_err = -1 };
    snprintf(row->shape, sizeof row->shape, "%s", r->s->name);
}



/* ------------------------------------------------------------- peers */

static void peers_all(shape_run *r)
{
    const kiln_bench_options *o = r->o;
    kiln_bench_peers *p = NULL;
    kiln_status st = o->no_peers ? KILN_OK
                                 : kiln_bench_peers_create(r->g, r->s, r->m_max, r->x,
                                                           r->rotate_bytes, &r->rng, &p);
    for (int i = 0; i < o->n_ms; i++)
        for (int q = 0; q < KILN_BENCH_PEER_COUNT; q++) {
            kiln_bench_row *row = &r->peer[q][i];
            row_start(r, o->ms[i], row);
            snprintf(row->kind, sizeof row->kind, "%s", kiln_bench_peer_kind((kiln_bench_peer)q));
            if (o->no_peers)
                continue;
            if (st != KILN_OK)
                kiln_bench_row_error(row, KILN_BENCH_ERROR, kiln_last_error());
            else
                kiln_bench_peers_run(r->g, p, (kiln_bench_peer)q, o->ms[i], o, &r->rng, row);
            r->failed |= kiln_bench_row_emit(r->report, row);
        }
    kiln_bench_peers_destroy(r->g, p);
}

/* -------------------------------------------------------------- kiln */

static void side_free(kiln_side *k)
{
    kiln_session_destroy(k->session);
    kiln_graph_destroy(k->graph);
    kiln_bench_weight_free(&k->w);
    free(k->inputs);
    free(k->outputs);
    memset(k, 0, sizeof *k);
}

static kiln_status side_graph(kiln_side *k, const shape_run *r)
{
    kiln_tensor *w[KILN_BENCH_MAX_ROTATION];
    char name[32];
    kiln_status st = kiln_graph_create(&k->graph);
    for (int i = 0; st == KILN_OK && i < k->rotation; i++) {
        snprintf(name, sizeof name, "w%d", i);
        st = kiln_graph_weight(k->graph, name, &k->w.q, &w[i]);
    }
    for (int i = 0; st == KILN_OK && i < k->chain; i++) {
        kiln_tensor *x, *y;
        snprintf(name, sizeof name, "x%d", i);
        st = kiln_graph_input(k->graph, name, r->s->k, &x);
        snprintf(name, sizeof name, "y%d", i);
        if (st == KILN_OK)
            st = kiln_graph_linear(k->graph, name, x, w[i % k->rotation], NULL, &y);
        if (st == KILN_OK)
            st = kiln_graph_output(k->graph, y);
        if (st == KILN_OK) {
            /* every copy reads the same host rows and writes the same host
             * output: they compute the same thing */
            k->inputs[i] = r->x;
            k->outputs[i] = r->y;
        }
    }
    return st;
}

static kiln_status side_create(kiln_side *k, shape_run *r, kiln_format f)
{
    const kiln_bench_options *o = r->o;
    kiln_status st = kiln_bench_weight_make(f, r->s->n, r->s->k, &r->rng, &k->w);
    if (st != KILN_OK)
        return st;
    double weight = (double)(k->w.data_bytes + k->w.scale_bytes);
    k->rotation = kiln_bench_rotation(weight, r->rotate_bytes);
    k->chain = kiln_bench_chain(k->rotation);
    k->inputs = calloc((size_t)k->chain, sizeof *k->inputs);
    k->outputs = calloc((size_t)k->chain, sizeof *k->outputs);
    if (!k->inputs || !k->outputs)
        return kiln_fail(KILN_ERR_NOMEM, "%d graph inputs", k->chain);
    if ((st = side_graph(k, r)) != KILN_OK)
        return st;
    kiln_session_options so = {
        .device = o->device, .cache.path = o->cache, .eager = o->eager, .quiet = 1,
        .plan = { .backend = o->backend, .capture = o->ms, .n_capture = o->n_ms },
    };
    /* its plan names the backend of each bucket for the table */
    if ((st = kiln_session_create(k->graph, &so, &k->session)) == KILN_OK)
        k->plan = kiln_session_plan(k->session);
    return st;
}

/* A kernel fed BF16 activations rounds only its output (2^-9 of |y|) and
 * accumulates in FP32: 2^-7 of sum |x||w| holds it with room. One that
 * quantizes the activations to E4M3 first (3 mantissa bits, relative error up
 * to 2^-4 per element, random in sign) gets 2^-5. */
static double act_tolerance(const char *act) { return strcmp(act, "bf16") ? 0x1p-5 : 0x1p-7; }

static kiln_status kiln_check(shape_run *r, kiln_side *k, int64_t m, double tol,
                              kiln_bench_check *out)
{
    const kiln_bench_options *o = r->o;
    kiln_status st = kiln_session_run(k->session, m, k->inputs, k->outputs);
    if (st != KILN_OK)
        return st;
    int64_t rows[4096];
    const float *xp[4096], *yp[4096];
    int n_rows = kiln_bench_sample_rows(m, o->check_rows, &r->rng, rows);
    for (int i = 0; i < n_rows; i++) {
        xp[i] = r->x + rows[i] * r->s->k;
        yp[i] = r->y + rows[i] * r->s->n;
    }
    kiln_bench_check_in in = { .x = xp, .y = yp, .rows = rows, .n_rows = n_rows, .w = k->w.ref,
                               .tile = k->w.tile, .n = r->s->n, .k = r->s->k, .tol = tol };
    return kiln_bench_check_run(&in, out);
}


static void speedups(const shape_run *r, int mi, kiln_bench_row *row)
{
    const kiln_bench_row *bf = &r->peer[KILN_BENCH_PEER_BF16][mi];
    const kiln_bench_row *f8 = &r->peer[KILN_BENCH_PEER_FP8][mi];
    if (bf->status == KILN_BENCH_OK && bf->us > 0)
        row->speedup_bf16 = bf->us / row->us;
    if (f8->status == KILN_BENCH_OK && f8->us > 0)
        row->speedup_fp8 = f8->us / row->us;
}

static void kiln_row(shape_run *r, kiln_side *k, int mi, kiln_bench_row *row)
{
    int64_t m = r->o->ms[mi];
    kiln_plan_linear pl;
    kiln_status st = kiln_plan_linear_at(k->plan, 0, kiln_plan_bucket_for(k->plan, m), &pl);
    if (st == KILN_OK) {
        snprintf(row->backend, sizeof row->backend, "%s", pl.backend);
        snprintf(row->act, sizeof row->act, "%s", pl.act);
    }
    double tol = act_tolerance(row->act);
    kiln_bench_check c;
    if (st == KILN_OK)
        st = kiln_check(r, k, m, tol, &c);
    if (st != KILN_OK) {
        kiln_bench_row_error(row, KILN_BENCH_ERROR, kiln_last_error());
        return;
    }
    row->check_err = c.worst;
    if (!c.pass) {
        char msg[sizeof row->error];
        snprintf(msg, sizeof msg,
                 "worst error %.3g of sum|x||w| (tolerance %.3g) at row %lld, column %lld: "
                 "got %g, want %g; not timed",
                 c.worst, tol, (long long)c.row, (long long)c.col, c.got, c.want);
        kiln_bench_row_error(row, KILN_BENCH_FAIL, msg);
        return;
    }
    kiln_bench_session_ctx tc = { k->session, m };
    if ((st = kiln_bench_measure(kiln_bench_session_time, &tc, k->chain, r->o, &row->us)) != KILN_OK) {
        kiln_bench_row_error(row, KILN_BENCH_ERROR, kiln_last_error());
        return;
    }
    speedups(r, mi, row);
}

static void kiln_format_rows(shape_run *r, kiln_format f)
{
    const kiln_bench_options *o = r->o;
    const char *name = kiln_format_get(f)->name;
    fprintf(stderr, "kiln-bench: %s %s: building the weight, planning, loading kernels\n",
            r->s->name, name);
    kiln_side k = { 0 };
    kiln_bench_row row;
    kiln_status st = side_create(&k, r, f);
    char why[sizeof row.error] = "";
    if (st != KILN_OK)
        snprintf(why, sizeof why, "%s", kiln_last_error());
    for (int i = 0; i < o->n_ms; i++) {
        row_start(r, o->ms[i], &row);
        snprintf(row.kind, sizeof row.kind, "kiln");
        snprintf(row.format, sizeof row.format, "%s", name);
        row.rotation = k.rotation;
        row.chain = k.chain;
        kiln_bench_bytes b;
        if (kiln_bench_kiln_bytes(f, r->s->n, r->s->k, o->ms[i], &b) == KILN_OK)
            row.bytes = kiln_bench_bytes_total(&b);
        row.flops = kiln_bench_flops(r->s->n, r->s->k, o->ms[i]);
        if (st != KILN_OK)
            kiln_bench_row_error(&row, KILN_BENCH_ERROR, why);
        else
            kiln_row(r, &k, i, &row);
        r->failed |= kiln_bench_row_emit(r->report, &row);
    }
    side_free(&k);
}

/* -------------------------------------------------------------- run */

static kiln_status shape_data(shape_run *r)
{
    size_t xs = (size_t)r->m_max * (size_t)r->s->k, ys = (size_t)r->m_max * (size_t)r->s->n;
    r->x = malloc(xs * sizeof *r->x);
    r->y = malloc(ys * sizeof *r->y);
    if (!r->x || !r->y)
        return kiln_fail(KILN_ERR_NOMEM, "%s: host activations and outputs for M = %lld",
                         r->s->name, (long long)r->m_max);
    /* BF16-exact, so kiln, the peers and the reference all see these values */
    for (size_t i = 0; i < xs; i++)
        r->x[i] = kiln_bf16_to_f32(kiln_f32_to_bf16(kiln_bench_rng_normal(&r->rng)));
    return KILN_OK;
}

static void shape_all(shape_run *r)
{
    const kiln_bench_options *o = r->o;
    kiln_status st = shape_data(r);
    if (st == KILN_OK) {
        peers_all(r);
        for (int f = 0; f < o->n_formats; f++)
            kiln_format_rows(r, o->formats[f]);
    } else {
        fprintf(stderr, "kiln-bench: %s\n", kiln_last_error());
        r->failed = 1;
    }
    free(r->x);
    free(r->y);
    r->x = r->y = NULL;
}


int kiln_bench_gemm(const kiln_bench_options *o)
{
    kiln_bench_gpu g;
    kiln_status st = kiln_bench_gpu_open(o->device, o->eager, &g);
    if (st != KILN_OK) {
        fprintf(stderr, "kiln-bench: %s\n", kiln_last_error());
        return 1;
    }
    kiln_bench_report report = {
        .l2_bytes = g.l2_bytes, .iters = o->iters, .reps = o->reps,
        .peak_bf16 = o->peak_bf16, .peak_fp8 = o->peak_fp8,
        .rotate_bytes = o->rotate_mb > 0 ? o->rotate_mb * 1e6 : 3 * g.l2_bytes,
    };
    snprintf(report.device, sizeof report.device, "%s", g.name);
    snprintf(report.target, sizeof report.target, "%s", g.target.name);
    int failed = 0;
    st = kiln_bench_copy_tbps(&g, (size_t)(o->copy_mb * 1e6), o, &report.copy_tbps);
    if (st != KILN_OK) {
        fprintf(stderr, "kiln-bench: %s\n", kiln_last_error());
        failed = 1;
    }
    printf("device %s (%s), L2 %.0f MB, weights rotated through %.0f MB, copy %.3f TB/s\n",
           report.device, report.target, report.l2_bytes / 1e6, report.rotate_bytes / 1e6,
           report.copy_tbps);
    kiln_bench_table_header(stdout, &report);
    shape_run *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, "kiln-bench: out of memory\n");
        kiln_bench_gpu_close(&g);
        return 1;
    }
    for (int i = 0; i < o->n_shapes; i++) {
        memset(r, 0, sizeof *r);
        *r = (shape_run){ .g = &g, .o = o, .s = &o->shapes[i], .report = &report,
                          .rng = { o->seed * 0x2545F4914F6CDD1Dull + (uint64_t)i },
                          .rotate_bytes = report.rotate_bytes, .m_max = o->ms[o->n_ms - 1] };
        shape_all(r);
        failed |= r->failed;
    }
    free(r);
    if (o->json)
        failed |= kiln_bench_json_save(&report, o->json);
    kiln_bench_report_free(&report);
    kiln_bench_gpu_close(&g);
    return failed;
}
