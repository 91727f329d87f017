/* The yardsticks: cuBLAS BF16 and cuBLASLt FP8 (per-tensor and block
 * scaled) on the shapes kiln runs, with the same weight rotation, checked
 * against the same kind of reference.
 *
 * Layout: Y[M,N] = X[M,K]·W[N,K]ᵀ is, column-major, Yᵀ[N,M] = op(A)·B with
 * A = W seen as a K×N matrix (ld K) taken transposed and B = X seen as K×M
 * (ld K): the "TN" layout, the only one Hopper's FP8 GEMMs take. So m = N,
 * n = M, k = K in cuBLAS terms; the weight is operand A and its scales are
 * A's scales. */
#include "bench/gpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BLAS(call, what)                                                                      \
    do {                                                                                      \
        kiln_status st_ = kiln_bench_blas_check((call), (what));                              \
        if (st_ != KILN_OK)                                                                   \
            return st_;                                                                       \
    } while (0)

static void *dptr(CUdeviceptr p) { return (void *)(uintptr_t)p; }

/* The kiln format whose CPU quantizer makes each peer's weight: FP8 and its
 * scales mean the same to kiln and to cuBLASLt (w = q · scale). */
static const kiln_format peer_format[] = {
    [KILN_BENCH_PEER_BF16] = KILN_FMT_BF16,
    [KILN_BENCH_PEER_FP8] = KILN_FMT_FP8_TENSOR,
    [KILN_BENCH_PEER_FP8_BLOCK] = KILN_FMT_FP8_BLOCK,
};
_Static_assert(KILN_ARRAY_LEN(peer_format) == KILN_BENCH_PEER_COUNT, "one format per peer");

typedef struct peer_weight {
    int rotation;
    CUdeviceptr data[KILN_BENCH_MAX_ROTATION];
    CUdeviceptr scale[KILN_BENCH_MAX_ROTATION]; /* per copy: one f32, or the 128x128 grid */
    float *ref;                                 /* [tile, k], dequantized */
    int64_t tile;
    char error[320];                            /* why it could not be made; "" when it was */
} peer_weight;

struct kiln_bench_peers {
    int64_t n, k, m_max;
    int64_t kb, kb_ld;          /* 128-wide K groups; the weight scales' padded stride */
    const float *x;             /* the caller's [m_max, k] */
    peer_weight w[KILN_BENCH_PEER_COUNT];
    CUdeviceptr x_bf16, x_fp8, x_scale, x_blk, x_blk_scale, y;
    uint8_t *hx_fp8, *hx_blk;   /* host copies, for the reference */
    float hx_scale;
    float *hx_blk_scale;        /* [m_max, kb] */
    float *staging;             /* [kb, m_max]: the activation scales as cuBLASLt reads them */
};

/* ------------------------------------------------------------ create */

static kiln_status upload(kiln_bench_gpu *g, CUdeviceptr *p, const void *src, size_t bytes,
                          const char *what)
{
    kiln_status st = kiln_bench_alloc(g, p, bytes, what);
    if (st == KILN_OK)
        st = kiln_cu_check(g->cu, g->cu->MemcpyHtoD(*p, src, bytes), what);
    return st;
}

static kiln_status acts_create(kiln_bench_gpu *g, kiln_bench_peers *p)
{
    size_t elems = (size_t)p->m_max * (size_t)p->k;
    uint16_t *bf = malloc(elems * sizeof *bf);
    p->hx_fp8 = malloc(elems);
    p->hx_blk = malloc(elems);
    p->hx_blk_scale = malloc((size_t)p->m_max * (size_t)p->kb * sizeof *p->hx_blk_scale);
    p->staging = malloc((size_t)p->m_max * (size_t)p->kb * sizeof *p->staging);
    kiln_status st = KILN_OK;
    if (!bf || !p->hx_fp8 || !p->hx_blk || !p->hx_blk_scale || !p->staging)
        st = kiln_fail(KILN_ERR_NOMEM, "peer activations [%lld, %lld]", (long long)p->m_max,
                       (long long)p->k);
    if (st == KILN_OK) {
        for (size_t i = 0; i < elems; i++)
            bf[i] = kiln_f32_to_bf16(p->x[i]);
        st = upload(g, &p->x_bf16, bf, elems * 2, "bf16 activations");
    }
    kiln_qtensor xq = { .format = KILN_FMT_FP8_TENSOR, .n = p->m_max, .k = p->k,
                        .data = p->hx_fp8, .scale = &p->hx_scale };
    if (st == KILN_OK)
        st = kiln_quantize(p->x, &xq);
    if (st == KILN_OK)
        st = upload(g, &p->x_fp8, p->hx_fp8, elems, "fp8 activations");
    if (st == KILN_OK)
        st = upload(g, &p->x_scale, &p->hx_scale, sizeof p->hx_scale, "fp8 activation scale");
    if (st == KILN_OK) {
        kiln_bench_quant_1x128(p->x, p->m_max, p->k, p->hx_blk, p->hx_blk_scale);
        st = upload(g, &p->x_blk, p->hx_blk, elems, "1x128 fp8 activations");
    }
    if (st == KILN_OK)
        st = kiln_bench_alloc(g, &p->x_blk_scale,
                              (size_t)p->m_max * (size_t)p->kb * sizeof(float),
                              "1x128 activation scales");
    if (st == KILN_OK)
        st = kiln_bench_alloc(g, &p->y, (size_t)p->m_max * (size_t)p->n * 2, "peer output");
    free(bf);
    return st;
}

/* cuBLASLt reads the 128x128 grid row-major with its row stride padded to
 * four floats (16 bytes); kiln's grid is unpadded. */
static kiln_status block_scales_padded(const kiln_bench_peers *p, const float *grid, float **out)
{
    int64_t rows = kiln_ceil_div(p->n, 128);
    float *s = calloc((size_t)rows * (size_t)p->kb_ld, sizeof *s);
    if (!s)
        return kiln_fail(KILN_ERR_NOMEM, "block scales");
    for (int64_t r = 0; r < rows; r++)
        memcpy(s + r * p->kb_ld, grid + r * p->kb, (size_t)p->kb * sizeof *s);
    *out = s;
    return KILN_OK;
}

static kiln_status weight_upload(kiln_bench_gpu *g, kiln_bench_peers *p, kiln_bench_peer which,
                                 const kiln_bench_weight *w, double rotate_bytes)
{
    peer_weight *pw = &p->w[which];
    const void *scale = w->q.scale;
    size_t scale_bytes = w->scale_bytes;
    float *padded = NULL;
    kiln_status st = KILN_OK;
    if (which == KILN_BENCH_PEER_FP8_BLOCK) {
        st = block_scales_padded(p, w->q.scale, &padded);
        scale = padded;
        scale_bytes = (size_t)kiln_ceil_div(p->n, 128) * (size_t)p->kb_ld * sizeof(float);
    }
    pw->rotation = kiln_bench_rotation((double)(w->data_bytes + scale_bytes), rotate_bytes);
    for (int r = 0; st == KILN_OK && r < pw->rotation; r++) {
        st = kiln_bench_alloc(g, &pw->data[r], w->data_bytes, "peer weight");
        if (st == KILN_OK)
            st = r ? kiln_cu_check(g->cu, g->cu->MemcpyDtoD(pw->data[r], pw->data[0],
                                                            w->data_bytes), "weight copy")
                   : kiln_cu_check(g->cu, g->cu->MemcpyHtoD(pw->data[0], w->q.data,
                                                            w->data_bytes), "weight upload");
        if (st == KILN_OK && scale_bytes)
            st = upload(g, &pw->scale[r], scale, scale_bytes, "peer weight scales");
    }
    free(padded);
    return st;
}

static void weight_create(kiln_bench_gpu *g, kiln_bench_peers *p, kiln_bench_peer which,
                          double rotate_bytes, kiln_bench_rng *r)
{
    peer_weight *pw = &p->w[which];
    kiln_bench_weight w;
    kiln_status st = kiln_bench_weight_make(peer_format[which], p->n, p->k, r, &w);
    if (st == KILN_OK) {
        st = weight_upload(g, p, which, &w, rotate_bytes);
        pw->ref = w.ref;
        pw->tile = w.tile;
        w.ref = NULL;
        kiln_bench_weight_free(&w);
    }
    if (st != KILN_OK)
        snprintf(pw->error, sizeof pw->error, "%s", kiln_last_error());
}

void kiln_bench_peers_destroy(kiln_bench_gpu *g, kiln_bench_peers *p)
{
    if (!p)
        return;
    for (int i = 0; i < KILN_BENCH_PEER_COUNT; i++) {
        for (int r = 0; r < KILN_BENCH_MAX_ROTATION; r++) {
            kiln_bench_free(g, &p->w[i].data[r]);
            kiln_bench_free(g, &p->w[i].scale[r]);
        }
        free(p->w[i].ref);
    }
    CUdeviceptr *bufs[] = { &p->x_bf16, &p->x_fp8, &p->x_scale, &p->x_blk, &p->x_blk_scale, &p->y };
    for (size_t i = 0; i < KILN_ARRAY_LEN(bufs); i++)
        kiln_bench_free(g, bufs[i]);
    free(p->hx_fp8);
    free(p->hx_blk);
    free(p->hx_blk_scale);
    free(p->staging);
    free(p);
}

kiln_status kiln_bench_peers_create(kiln_bench_gpu *g, const kiln_bench_shape *s, int64_t m_max,
                                    const float *x, double rotate_bytes, kiln_bench_rng *r,
                                    kiln_bench_peers **out)
{
    kiln_bench_peers *p = calloc(1, sizeof *p);
    if (!p)
        return kiln_fail(KILN_ERR_NOMEM, "peers");
    p->n = s->n;
    p->k = s->k;
    p->m_max = m_max;
    p->x = x;
    p->kb = kiln_ceil_div(s->k, 128);
    p->kb_ld = kiln_ceil_div(p->kb, 4) * 4;
    kiln_status st = acts_create(g, p);
    if (st != KILN_OK) {
        kiln_bench_peers_destroy(g, p);
        return kiln_fail_prefix(st, "%s peers", s->name);
    }
    for (int i = 0; i < KILN_BENCH_PEER_COUNT; i++)
        weight_create(g, p, (kiln_bench_peer)i, rotate_bytes, r);
    *out = p;
    return KILN_OK;
}

/* --------------------------------------------------------------- run */

typedef struct peer_run {
    kiln_bench_gpu *g;
    kiln_bench_peers *p;
    kiln_bench_peer which;
    int64_t m;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulDesc_t desc[KILN_BENCH_MAX_ROTATION];
    int n_desc;
    cublasLtMatmulAlgo_t algo;
    int unsupported;            /* the heuristic had nothing to offer */
} peer_run;

static kiln_status enqueue(void *ctx, int i)
{
    peer_run *u = ctx;
    kiln_bench_peers *p = u->p;
    const peer_weight *pw = &p->w[u->which];
    i %= pw->rotation; /* the chain cycles through the copies */
    const float alpha = 1.0f, beta = 0.0f;
    int n = (int)p->n, m = (int)u->m, k = (int)p->k;
    if (u->which == KILN_BENCH_PEER_BF16)
        return kiln_bench_blas_check(
            cublasGemmEx(u->g->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha,
                         dptr(pw->data[i]), CUDA_R_16BF, k, dptr(p->x_bf16), CUDA_R_16BF, k,
                         &beta, dptr(p->y), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
    const void *x = dptr(u->which == KILN_BENCH_PEER_FP8 ? p->x_fp8 : p->x_blk);
    return kiln_bench_blas_check(
        cublasLtMatmul(u->g->lt, u->desc[i % u->n_desc], &alpha, dptr(pw->data[i]), u->a, x, u->b,
                       &beta, dptr(p->y), u->c, dptr(p->y), u->c, &u->algo,
                       dptr(u->g->workspace), u->g->workspace_bytes, u->g->stream),
        "cublasLtMatmul");
}

static kiln_status desc_create(peer_run *u, int copy, cublasLtMatmulDesc_t *out)
{
    const kiln_bench_peers *p = u->p;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    BLAS(cublasLtMatmulDescCreate(out, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    cublasLtMatmulDesc_t d = *out;
    BLAS(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA");
    BLAS(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB");
    const void *a_scale = dptr(p->w[u->which].scale[copy]);
    const void *b_scale = dptr(u->which == KILN_BENCH_PEER_FP8 ? p->x_scale : p->x_blk_scale);
    if (u->which == KILN_BENCH_PEER_FP8_BLOCK) {
        int32_t am = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        int32_t bm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        BLAS(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am),
             "A_SCALE_MODE");
        BLAS(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm),
             "B_SCALE_MODE");
    }
    BLAS(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                                        sizeof a_scale),
         "A_SCALE_POINTER");
    BLAS(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                                        sizeof b_scale),
         "B_SCALE_POINTER");
    return KILN_OK;
}

/* The 1x128 activation scales of the first m rows, M-contiguous per K group
 * (element (row, group) at group·m + row) as cuBLASLt's VEC128 mode reads
 * the scales of the K×M operand B. */
static kiln_status act_scales_upload(peer_run *u)
{
    kiln_bench_peers *p = u->p;
    kiln_bench_gpu *g = u->g;
    for (int64_t i = 0; i < u->m; i++)
        for (int64_t t = 0; t < p->kb; t++)
            p->staging[t * u->m + i] = p->hx_blk_scale[i * p->kb + t];
    CU(g->cu->MemcpyHtoD(p->x_blk_scale, p->staging, (size_t)(u->m * p->kb) * sizeof(float)),
       "activation scales");
    return KILN_OK;
}

static kiln_status lt_setup(peer_run *u)
{
    const kiln_bench_peers *p = u->p;
    if (u->which == KILN_BENCH_PEER_FP8_BLOCK) {
        kiln_status st = act_scales_upload(u);
        if (st != KILN_OK)
            return st;
    }
    BLAS(cublasLtMatrixLayoutCreate(&u->a, CUDA_R_8F_E4M3, (uint64_t)p->k, (uint64_t)p->n, p->k),
         "layout A");
    BLAS(cublasLtMatrixLayoutCreate(&u->b, CUDA_R_8F_E4M3, (uint64_t)p->k, (uint64_t)u->m, p->k),
         "layout B");
    BLAS(cublasLtMatrixLayoutCreate(&u->c, CUDA_R_16BF, (uint64_t)p->n, (uint64_t)u->m, p->n),
         "layout C");
    u->n_desc = u->which == KILN_BENCH_PEER_FP8_BLOCK ? p->w[u->which].rotation : 1;
    for (int i = 0; i < u->n_desc; i++) {
        kiln_status st = desc_create(u, i, &u->desc[i]);
        if (st != KILN_OK)
            return st;
    }
    cublasLtMatmulPreference_t pref;
    BLAS(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    uint64_t ws = u->g->workspace_bytes;
    cublasStatus_t bs = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    memset(&res, 0, sizeof res);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasLtMatmulAlgoGetHeuristic(u->g->lt, u->desc[0], u->a, u->b, u->c, u->c, pref, 1,
                                            &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (bs == CUBLAS_STATUS_NOT_SUPPORTED || (bs == CUBLAS_STATUS_SUCCESS && found == 0)) {
        u->unsupported = 1;
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cublasLtMatmulAlgoGetHeuristic: %s for M = %lld",
                         bs == CUBLAS_STATUS_SUCCESS ? "no algorithm" : cublasLtGetStatusName(bs),
                         (long long)u->m);
    }
    BLAS(bs, "cublasLtMatmulAlgoGetHeuristic");
    u->algo = res.algo;
    return KILN_OK;
}

static void lt_teardown(peer_run *u)
{
    for (int i = 0; i < u->n_desc; i++)
        if (u->desc[i])
            cublasLtMatmulDescDestroy(u->desc[i]);
    if (u->a)
        cublasLtMatrixLayoutDestroy(u->a);
    if (u->b)
        cublasLtMatrixLayoutDestroy(u->b);
    if (u->c)
        cublasLtMatrixLayoutDestroy(u->c);
}

/* The activations of row i as this peer's kernel reads them. */
static void act_row(const peer_run *u, int64_t i, float *out)
{
    const kiln_bench_peers *p = u->p;
    const float *x = p->x + i * p->k;
    const uint8_t *q = (u->which == KILN_BENCH_PEER_FP8 ? p->hx_fp8 : p->hx_blk) + i * p->k;
    for (int64_t t = 0; t < p->k; t++) {
        switch (u->which) {
        case KILN_BENCH_PEER_BF16:
            out[t] = x[t];
            break;
        case KILN_BENCH_PEER_FP8:
            out[t] = kiln_e4m3_to_f32(q[t]) * p->hx_scale;
            break;
        default:
            out[t] = kiln_e4m3_to_f32(q[t]) * p->hx_blk_scale[i * p->kb + t / 128];
            break;
        }
    }
}

/* Output rows fetched from the device, compared with the float64
 * reference. The inputs are exact in the kernel's types, so what is left is
 * FP32 accumulation and the BF16 rounding of the output (2^-9 of |y|):
 * 2^-7 of sum |x||w| holds them with room. */
static kiln_status peer_check(peer_run *u, const kiln_bench_options *o, kiln_bench_rng *r,
                              kiln_bench_check *out)
{
    kiln_bench_gpu *g = u->g;
    kiln_bench_peers *p = u->p;
    int64_t rows[4096];
    int n_rows = kiln_bench_sample_rows(u->m, o->check_rows, r, rows);
    float *xs = malloc((size_t)n_rows * (size_t)p->k * sizeof *xs);
    float *ys = malloc((size_t)n_rows * (size_t)p->n * sizeof *ys);
    uint16_t *raw = malloc((size_t)p->n * sizeof *raw);
    const float **xp = malloc((size_t)n_rows * sizeof *xp);
    const float **yp = malloc((size_t)n_rows * sizeof *yp);
    kiln_status st = KILN_OK;
    if (!xs || !ys || !raw || !xp || !yp)
        st = kiln_fail(KILN_ERR_NOMEM, "peer check");
    if (st == KILN_OK)
        st = kiln_cu_check(g->cu, g->cu->StreamSynchronize(g->stream), "peer run");
    for (int i = 0; st == KILN_OK && i < n_rows; i++) {
        float *xi = xs + (size_t)i * (size_t)p->k, *yi = ys + (size_t)i * (size_t)p->n;
        st = kiln_cu_check(g->cu, g->cu->MemcpyDtoH(raw, p->y + (size_t)rows[i] * (size_t)p->n * 2,
                                                    (size_t)p->n * 2),
                           "peer output");
        for (int64_t j = 0; st == KILN_OK && j < p->n; j++)
            yi[j] = kiln_bf16_to_f32(raw[j]);
        act_row(u, rows[i], xi);
        xp[i] = xi;
        yp[i] = yi;
    }
    const peer_weight *pw = &p->w[u->which];
    kiln_bench_check_in in = { .x = xp, .y = yp, .rows = rows, .n_rows = n_rows, .w = pw->ref,
                               .tile = pw->tile, .n = p->n, .k = p->k, .tol = 0x1p-7 };
    if (st == KILN_OK)
        st = kiln_bench_check_run(&in, out);
    free(xs);
    free(ys);
    free(raw);
    free(xp);
    free(yp);
    return st;
}

static kiln_status peer_measure(peer_run *u, const kiln_bench_options *o, kiln_bench_rng *r,
                                kiln_bench_row *row)
{
    kiln_status st = KILN_OK;
    if (u->which != KILN_BENCH_PEER_BF16 && (st = lt_setup(u)) != KILN_OK)
        return st;
    if ((st = enqueue(u, 0)) != KILN_OK)
        return st;
    kiln_bench_check c;
    if ((st = peer_check(u, o, r, &c)) != KILN_OK)
        return st;
    row->check_err = c.worst;
    if (!c.pass) {
        row->status = KILN_BENCH_FAIL;
        snprintf(row->error, sizeof row->error,
                 "worst error %.3g of sum|x||w| at row %lld, column %lld (got %g, want %g); "
                 "timed anyway",
                 c.worst, (long long)c.row, (long long)c.col, c.got, c.want);
    }
    kiln_bench_unit unit = { .enqueue = enqueue,
                             .ctx = u,
                             .count = kiln_bench_chain(u->p->w[u->which].rotation) };
    if ((st = kiln_bench_unit_prepare(u->g, &unit)) != KILN_OK)
        return st;
    kiln_bench_time_ctx tc = { u->g, &unit };
    st = kiln_bench_measure(kiln_bench_unit_time, &tc, unit.count, o, &row->us);
    kiln_bench_unit_release(u->g, &unit);
    return st;
}

void kiln_bench_peers_run(kiln_bench_gpu *g, kiln_bench_peers *p, kiln_bench_peer which,
                          int64_t m, const kiln_bench_options *o, kiln_bench_rng *r,
                          kiln_bench_row *row)
{
    assert(m >= 1 && m <= p->m_max);
    kiln_bench_bytes b;
    kiln_bench_peer_bytes(which, p->n, p->k, m, &b);
    row->m = m;
    snprintf(row->kind, sizeof row->kind, "%s", kiln_bench_peer_kind(which));
    row->bytes = kiln_bench_bytes_total(&b);
    row->flops = kiln_bench_flops(p->n, p->k, m);
    row->rotation = p->w[which].rotation;
    row->chain = kiln_bench_chain(row->rotation);
    row->check_err = -1;
    if (p->w[which].error[0]) {
        row->status = KILN_BENCH_ERROR;
        snprintf(row->error, sizeof row->error, "%s", p->w[which].error);
        return;
    }
    peer_run u = { .g = g, .p = p, .which = which, .m = m };
    kiln_status st = peer_measure(&u, o, r, row);
    lt_teardown(&u);
    if (st != KILN_OK) {
        row->us = 0;
        row->status = u.unsupported ? KILN_BENCH_UNSUPPORTED : KILN_BENCH_ERROR;
        snprintf(row->error, sizeof row->error, "%s", kiln_last_error());
        /* a failed launch may leave the stream in capture or with work queued */
        g->cu->StreamSynchronize(g->stream);
    }
}
