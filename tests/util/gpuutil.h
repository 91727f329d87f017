/* Shared by the GPU suites: skipping without a GPU, a private kernel cache,
 * random quantized weights and the small graphs the suites run. */
#ifndef KILN_GPUUTIL_H
#define KILN_GPUUTIL_H

#include "kiln.h"
#include "testutil.h"

#include <stddef.h>

/* Skip the calling test, with the reason, when there is no GPU or driver. */
void kt_need_gpu(void);

/* A fresh writable cache path in a new temporary folder. */
void kt_fresh_cache(char *path, size_t size);

/* A weight quantized from N(0, 1/K) values, and a bias of N(0, 0.1). */
typedef struct kt_weight {
    kiln_qtensor q;
    float *bias;
} kt_weight;
void kt_weight_make(kt_weight *w, kt_rng *r, kiln_format f, int64_t n, int64_t k);
void kt_weight_free(kt_weight *w);

/* y = x·wᵀ + b, alone in a graph: input "x", weight "w", output "y". */
kiln_graph *kt_linear_graph(kt_weight *w);

/* x + down(silu(gate(rms(x))) · up(rms(x))): the silu_mul and residual
 * epilogues fuse. norm is f32 [K of gate]. */
kiln_graph *kt_ffn_graph(kt_weight *gate, kt_weight *up, kt_weight *down, float *norm);

/* Run g (one input, one output) for m tokens on the session and on the CPU
 * executor with the same fresh input, and assert they agree. The GPU keeps
 * activations (and, for tensor cores, weights) in BF16 with its 8
 * significant bits, the CPU f32: each output may differ by a few BF16 ulps of
 * the terms that made it, so the bound is 2^-6 of the largest |y| plus 2^-6
 * of |y| itself. what names the case in failures; gpu_out (may be NULL) gets
 * the GPU's output. Returns the largest difference over the largest |y|. */
double kt_compare_cpu(kiln_session *s, kiln_graph *g, int64_t m, kt_rng *r, const char *what,
                      float *gpu_out);

#endif
