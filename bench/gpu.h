/* The GPU side of kiln-bench: the device, the peers (cuBLAS, cuBLASLt) and
 * the run that puts kiln beside them. The CUDA driver is kiln's own dlopen'ed
 * one (runtime/driver.h): the bench shares the primary context with kiln's
 * sessions, times both with the same events, and needs no CUDA runtime
 * library of its own (cuBLAS carries what it uses). */
#ifndef KILN_BENCH_GPU_H
#define KILN_BENCH_GPU_H

#include "bench/bench.h"
#include "runtime/driver.h"

#include <cublasLt.h>
#include <cublas_v2.h>

/* Return the failure of a driver call, named what, from a function with a
 * kiln_bench_gpu *g in scope. */
#define CU(call, what)                                                                        \
    do {                                                                                      \
        kiln_status st_ = kiln_cu_check(g->cu, (call), (what));                               \
        if (st_ != KILN_OK)                                                                   \
            return st_;                                                                       \
    } while (0)

typedef struct kiln_bench_gpu {
    const kiln_cu *cu;
    int ordinal;
    int eager;               /* time launches one by one, no CUDA graphs */
    CUdevice dev;
    CUcontext ctx;           /* the primary context: kiln's sessions use it too */
    CUstream stream;         /* the peers' stream */
    CUevent start, stop;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    CUdeviceptr workspace;   /* cuBLAS and cuBLASLt scratch */
    size_t workspace_bytes;
    double l2_bytes;
    kiln_target target;
    char name[128];
} kiln_bench_gpu;

/* The device, a stream, events and the library handles. KILN_ERR_NO_DEVICE
 * without a GPU; KILN_ERR_CUDA naming the call that failed. */
kiln_status kiln_bench_gpu_open(int ordinal, int eager, kiln_bench_gpu *g);
void kiln_bench_gpu_close(kiln_bench_gpu *g);

/* KILN_OK for CUBLAS_STATUS_SUCCESS, else KILN_ERR_CUDA "what: NAME (text)". */
kiln_status kiln_bench_blas_check(cublasStatus_t st, const char *what);

kiln_status kiln_bench_alloc(kiln_bench_gpu *g, CUdeviceptr *p, size_t bytes, const char *what);
/* Free and zero; 0 is left alone. */
void kiln_bench_free(kiln_bench_gpu *g, CUdeviceptr *p);

/* Work timed as a unit: `count` operations, the i-th enqueued on the
 * peers' stream by enqueue(ctx, i). Prepared as one CUDA graph (unless
 * eager), so the peers are timed as kiln's replays are. */
typedef struct kiln_bench_unit {
    kiln_status (*enqueue)(void *ctx, int i);
    void *ctx;
    int count;
    CUgraphExec exec;
} kiln_bench_unit;

kiln_status kiln_bench_unit_prepare(kiln_bench_gpu *g, kiln_bench_unit *u);
/* A kiln_bench_time_fn; ctx is a kiln_bench_time_ctx. */
kiln_status kiln_bench_unit_time(void *ctx, int launches, double *us);
void kiln_bench_unit_release(kiln_bench_gpu *g, kiln_bench_unit *u);

typedef struct kiln_bench_time_ctx {
    kiln_bench_gpu *g;
    kiln_bench_unit *u;
} kiln_bench_time_ctx;

/* A kiln_bench_time_fn replaying a kiln session's bucket of m tokens
 * (kiln_session_bench); ctx is a kiln_bench_session_ctx. */
typedef struct kiln_bench_session_ctx {
    kiln_session *s;
    int64_t m;
} kiln_bench_session_ctx;

kiln_status kiln_bench_session_time(void *ctx, int launches, double *us);

/* Device-to-device copy bandwidth, read + write, over buffers of bytes. */
kiln_status kiln_bench_copy_tbps(kiln_bench_gpu *g, size_t bytes, const kiln_bench_options *o,
                                 double *tbps);

/* The peers of one shape: weights rotated through rotate_bytes, the
 * activations of x [m_max, k] (BF16-exact values) in each peer's form. */
typedef struct kiln_bench_peers kiln_bench_peers;

kiln_status kiln_bench_peers_create(kiln_bench_gpu *g, const kiln_bench_shape *s, int64_t m_max,
                                    const float *x, double rotate_bytes, kiln_bench_rng *r,
                                    kiln_bench_peers **out);
void kiln_bench_peers_destroy(kiln_bench_gpu *g, kiln_bench_peers *p);

/* One peer at m tokens: checked on sampled rows against the reference,
 * then timed (a failed check is reported and still timed: it measures the
 * library, not kiln). Fills row; never fails as a whole. */
void kiln_bench_peers_run(kiln_bench_gpu *g, kiln_bench_peers *p, kiln_bench_peer which,
                          int64_t m, const kiln_bench_options *o, kiln_bench_rng *r,
                          kiln_bench_row *row);

/* The whole `kiln-bench gemm` run: the table on stdout, the JSON report
 * where asked. 0 when every row ran and passed, 1 otherwise. */
int kiln_bench_gemm(const kiln_bench_options *o);

/* The whole `kiln-bench ffn` run: the stack through kiln in each format and
 * through the cuBLAS BF16 chain, the table on stdout, the JSON report where
 * asked. 0 when every row ran and passed, 1 otherwise. */
int kiln_bench_ffn(const kiln_bench_options *o);

#endif
