/* Shared by the GPU suites: skipping without a GPU, a private kernel cache,
 * random quantized weights and the small graphs the suites run. */
#ifndef KILN_GPUUTIL_H
#define KILN_GPUUTIL_H

#include "kiln.h"
#include "gpuref.h"
#include "testutil.h"

#include <stddef.h>

/* Skip the calling test, with the reason, when there is no GPU or driver
 * (KILN_ERR_NO_DEVICE); fail it on any other error of reading the device: a
 * GPU that is there but unusable is broken, not absent. */
void kt_need_gpu(void);

/* The tests that loop over formats run as KT_PARTS tests, part p taking
 * the formats f with f % KT_PARTS == p: test processes the GPU suites run
 * at once. */
#define KT_PARTS 4

/* A fresh writable cache path in a new temporary folder. */
void kt_fresh_cache(char *path, size_t size);

/* A weight quantized from N(0, 1/K) values, and a bias of N(0, 0.1). */
typedef struct kt_weight {
    kiln_qtensor q;
    float *bias;
} kt_weight;
void kt_weight_make(kt_weight *w, kt_rng *r, kiln_format f, int64_t n, int64_t k);
/* The same with a grouped format's group (kiln_qtensor.group). */
void kt_weight_make_group(kt_weight *w, kt_rng *r, kiln_format f, int64_t n, int64_t k, int64_t group);
void kt_weight_free(kt_weight *w);

/* y = x·wᵀ + b, alone in a graph: input "x", weight "w", output "y". */
kiln_graph *kt_linear_graph(kt_weight *w);

/* x + down(silu(gate(rms(x))) · up(rms(x))): the silu_mul and residual
 * epilogues fuse. norm is f32 [K of gate]. */
kiln_graph *kt_ffn_graph(kt_weight *gate, kt_weight *up, kt_weight *down, float *norm);

/* kiln_session_create (asserting it succeeds), and the plan the session
 * runs (kiln_session_plan), for kt_check_session and the tests' assertions
 * on which backend runs. */
kiln_session *kt_session_create(kiln_graph *g, const kiln_session_options *o);
void kt_session_destroy(kiln_session *s);
const kiln_plan *kt_session_plan(const kiln_session *s);

/* Run g (one input, one output) for m tokens on the session with a fresh
 * N(0, 1) input and assert every output lies within the bound of
 * tests/util/gpuref.h around the float64 reference of kiln's GPU contract.
 * what names the case in failures; gpu_out (may be NULL) gets the GPU's
 * output. Returns the largest |gpu − reference| / bound (at most 1). */
double kt_check_session(kiln_session *s, kiln_graph *g, int64_t m, kt_rng *r, const char *what,
                        float *gpu_out);

#endif
