/* The device the bench runs on: context, stream, events, library handles,
 * timed units and the copy bandwidth that is the ceiling. */
#include "bench/gpu.h"

/* cuBLAS asks for 32 MiB of workspace on Hopper to reach its best kernels. */
#define WORKSPACE_BYTES (32u << 20)

kiln_status kiln_bench_blas_check(cublasStatus_t st, const char *what)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return KILN_OK;
    return kiln_fail(KILN_ERR_CUDA, "%s: %s (%s)", what, cublasGetStatusName(st),
                     cublasGetStatusString(st));
}

kiln_status kiln_bench_alloc(kiln_bench_gpu *g, CUdeviceptr *p, size_t bytes, const char *what)
{
    CU(g->cu->MemAlloc(p, bytes ? bytes : 1), what);
    return KILN_OK;
}

void kiln_bench_free(kiln_bench_gpu *g, CUdeviceptr *p)
{
    if (*p)
        g->cu->MemFree(*p);
    *p = 0;
}

static kiln_status gpu_init(kiln_bench_gpu *g)
{
    kiln_status st = kiln_cu_target(g->cu, g->ordinal, &g->target, g->name, sizeof g->name);
    if (st != KILN_OK)
        return st;
    int l2 = 0;
    CU(g->cu->DeviceGet(&g->dev, g->ordinal), "cuDeviceGet");
    CU(g->cu->DeviceGetAttribute(&l2, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, g->dev),
       "L2 cache size");
    g->l2_bytes = l2;
    CU(g->cu->DevicePrimaryCtxRetain(&g->ctx, g->dev), "cuDevicePrimaryCtxRetain");
    CU(g->cu->CtxSetCurrent(g->ctx), "cuCtxSetCurrent");
    CU(g->cu->StreamCreate(&g->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    CU(g->cu->EventCreate(&g->start, CU_EVENT_DEFAULT), "cuEventCreate");
    CU(g->cu->EventCreate(&g->stop, CU_EVENT_DEFAULT), "cuEventCreate");
    g->workspace_bytes = WORKSPACE_BYTES;
    if ((st = kiln_bench_alloc(g, &g->workspace, g->workspace_bytes, "cuBLAS workspace")))
        return st;
    /* The CUDA runtime inside cuBLAS takes the context current on this
     * thread: the primary one, which the runtime would pick anyway. */
    if ((st = kiln_bench_blas_check(cublasCreate(&g->blas), "cublasCreate")) ||
        (st = kiln_bench_blas_check(cublasSetStream(g->blas, g->stream), "cublasSetStream")) ||
        (st = kiln_bench_blas_check(cublasSetWorkspace(g->blas, (void *)(uintptr_t)g->workspace,
                                                       g->workspace_bytes),
                                    "cublasSetWorkspace")) ||
        (st = kiln_bench_blas_check(cublasLtCreate(&g->lt), "cublasLtCreate")))
        return st;
    return KILN_OK;
}

kiln_status kiln_bench_gpu_open(int ordinal, int eager, kiln_bench_gpu *g)
{
    *g = (kiln_bench_gpu){ .ordinal = ordinal, .eager = eager };
    kiln_status st = kiln_cu_get(&g->cu);
    if (st == KILN_OK)
        st = gpu_init(g);
    if (st != KILN_OK) {
        kiln_bench_gpu_close(g);
        return kiln_fail_prefix(st, "device %d", ordinal);
    }
    return KILN_OK;
}

void kiln_bench_gpu_close(kiln_bench_gpu *g)
{
    if (!g->cu || !g->ctx) {
        *g = (kiln_bench_gpu){ 0 };
        return;
    }
    if (g->stream)
        g->cu->StreamSynchronize(g->stream);
    if (g->lt)
        cublasLtDestroy(g->lt);
    if (g->blas)
        cublasDestroy(g->blas);
    kiln_bench_free(g, &g->workspace);
    if (g->start)
        g->cu->EventDestroy(g->start);
    if (g->stop)
        g->cu->EventDestroy(g->stop);
    if (g->stream)
        g->cu->StreamDestroy(g->stream);
    g->cu->DevicePrimaryCtxRelease(g->dev);
    *g = (kiln_bench_gpu){ 0 };
}

/* -------------------------------------------------------------- units */

static kiln_status enqueue_all(kiln_bench_unit *u)
{
    for (int i = 0; i < u->count; i++) {
        kiln_status st = u->enqueue(u->ctx, i);
        if (st != KILN_OK)
            return st;
    }
    return KILN_OK;
}

kiln_status kiln_bench_unit_prepare(kiln_bench_gpu *g, kiln_bench_unit *u)
{
    u->exec = NULL;
    if (g->eager)
        return KILN_OK;
    CUgraph graph;
    CU(g->cu->StreamBeginCapture(g->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
       "cuStreamBeginCapture");
    kiln_status st = enqueue_all(u);
    CUresult r = g->cu->StreamEndCapture(g->stream, &graph);
    if (st != KILN_OK) {
        if (r == CUDA_SUCCESS)
            g->cu->GraphDestroy(graph);
        return kiln_fail_prefix(st, "while capturing a CUDA graph");
    }
    CU(r, "cuStreamEndCapture");
    r = g->cu->GraphInstantiateWithFlags(&u->exec, graph, 0);
    g->cu->GraphDestroy(graph);
    CU(r, "cuGraphInstantiate");
    return KILN_OK;
}

void kiln_bench_unit_release(kiln_bench_gpu *g, kiln_bench_unit *u)
{
    if (u->exec)
        g->cu->GraphExecDestroy(u->exec);
    u->exec = NULL;
}

kiln_status kiln_bench_unit_time(void *ctx, int launches, double *us)
{
    kiln_bench_time_ctx *c = ctx;
    kiln_bench_gpu *g = c->g;
    kiln_bench_unit *u = c->u;
    CU(g->cu->EventRecord(g->start, g->stream), "cuEventRecord");
    for (int i = 0; i < launches; i++) {
        if (u->exec) {
            CU(g->cu->GraphLaunch(u->exec, g->stream), "cuGraphLaunch");
        } else {
            kiln_status st = enqueue_all(u);
            if (st != KILN_OK)
                return st;
        }
    }
    CU(g->cu->EventRecord(g->stop, g->stream), "cuEventRecord");
    CU(g->cu->EventSynchronize(g->stop), "cuEventSynchronize");
    float ms;
    CU(g->cu->EventElapsedTime(&ms, g->start, g->stop), "cuEventElapsedTime");
    *us = ms * 1000.0 / launches;
    return KILN_OK;
}

kiln_status kiln_bench_session_time(void *ctx, int launches, double *us)
{
    kiln_bench_session_ctx *c = ctx;
    float t;
    kiln_status st = kiln_session_bench(c->s, c->m, launches, &t);
    if (st == KILN_OK)
        *us = t;
    return st;
}

/* ------------------------------------------------------- copy bandwidth */

typedef struct copy_ctx {
    kiln_bench_gpu *g;
    CUdeviceptr src, dst;
    size_t bytes;
} copy_ctx;

/* cuMemcpyDtoD runs on the legacy stream, so the events are recorded there. */
static kiln_status copy_time(void *ctx, int launches, double *us)
{
    copy_ctx *c = ctx;
    kiln_bench_gpu *g = c->g;
    CU(g->cu->EventRecord(g->start, NULL), "cuEventRecord");
    for (int i = 0; i < launches; i++)
        CU(g->cu->MemcpyDtoD(c->dst, c->src, c->bytes), "cuMemcpyDtoD");
    CU(g->cu->EventRecord(g->stop, NULL), "cuEventRecord");
    CU(g->cu->EventSynchronize(g->stop), "cuEventSynchronize");
    float ms;
    CU(g->cu->EventElapsedTime(&ms, g->start, g->stop), "cuEventElapsedTime");
    *us = ms * 1000.0 / launches;
    return KILN_OK;
}

kiln_status kiln_bench_copy_tbps(kiln_bench_gpu *g, size_t bytes, const kiln_bench_options *o,
                                 double *tbps)
{
    copy_ctx c = { .g = g, .bytes = bytes };
    kiln_status st = kiln_bench_alloc(g, &c.src, bytes, "copy source");
    if (st == KILN_OK)
        st = kiln_bench_alloc(g, &c.dst, bytes, "copy destination");
    if (st == KILN_OK)
        st = kiln_cu_check(g->cu, g->cu->MemsetD8(c.src, 0x5a, bytes), "cuMemsetD8");
    double us = 0;
    if (st == KILN_OK)
        st = kiln_bench_measure(copy_time, &c, 1, o, &us);
    kiln_bench_free(g, &c.src);
    kiln_bench_free(g, &c.dst);
    if (st != KILN_OK)
        return kiln_fail_prefix(st, "copy bandwidth over %zu bytes", bytes);
    *tbps = kiln_bench_tbps(2.0 * (double)bytes, us);
    return KILN_OK;
}
