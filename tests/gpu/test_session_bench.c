/* kiln_session_bench: a bucket's replays timed on the device, no host
 * copies, graphs and eager launches alike. Skipped, with the reason, where
 * there is no GPU (except the checks that need no session). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuutil.h"

Test(gpu_session_bench, needs_a_session)
{
    float us = -1;
    cr_assert_eq(kiln_session_bench(NULL, 1, 1, &us), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "session bench"), "%s", kiln_last_error());
    cr_assert_eq(us, -1, "untouched on failure");
}

static void bench_one(int eager)
{
    char dir[] = "/tmp/kiln-gpu-XXXXXX", cache[256];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(cache, sizeof cache, "%s/kernels.kiln", dir);
    kt_rng r = kt_rng_new(1 + (uint64_t)eager);
    enum { N = 256, K = 512, M = 16 };
    float *src = malloc(N * K * sizeof *src);
    kt_fill_normal(&r, src, N * K, 1.0f / sqrtf(K));
    uint16_t *data = malloc(N * K * 2);
    kiln_qtensor w = { .format = KILN_FMT_BF16, .n = N, .k = K, .data = data };
    cr_assert_eq(kiln_quantize(src, &w), KILN_OK);
    kiln_graph *g;
    kiln_tensor *x, *wt, *y;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    cr_assert_eq(kiln_graph_input(g, "x", K, &x), KILN_OK);
    cr_assert_eq(kiln_graph_weight(g, "w", &w, &wt), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "y", x, wt, NULL, &y), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, y), KILN_OK);
    static const int64_t capture[] = { 4, M };
    kiln_session_options o = { .cache.path = cache, .eager = eager, .quiet = 1,
                                .plan = { .capture = capture, .n_capture = 2 } };
    kiln_session *s;
    cr_assert_eq(kiln_session_create(g, &o, &s), KILN_OK, "%s", kiln_last_error());

    float xs[M * K], before[M * N], after[M * N];
    kt_fill_normal(&r, xs, M * K, 1.0f);
    const float *in[] = { xs };
    float *out[] = { before };
    cr_assert_eq(kiln_session_run(s, M, in, out), KILN_OK, "%s", kiln_last_error());

    float us = 0;
    cr_assert_eq(kiln_session_bench(s, M, 20, &us), KILN_OK, "%s", kiln_last_error());
    cr_assert(isfinite(us) && us > 0, "%g us a replay", us);
    cr_assert_eq(kiln_session_bench(s, 3, 5, &us), KILN_OK, "3 tokens run bucket 4");
    cr_assert(us > 0);

    /* replays write the same outputs from the same inputs */
    out[0] = after;
    cr_assert_eq(kiln_session_run(s, M, in, out), KILN_OK);
    cr_assert_eq(memcmp(before, after, sizeof before), 0);

    us = -1;
    cr_assert_eq(kiln_session_bench(s, M + 1, 1, &us), KILN_ERR_SHAPE);
    cr_assert(strstr(kiln_last_error(), "17 tokens; the session serves 1 to 16"), "%s",
              kiln_last_error());
    cr_assert_eq(kiln_session_bench(s, 0, 1, &us), KILN_ERR_SHAPE);
    cr_assert_eq(kiln_session_bench(s, M, 0, &us), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_session_bench(s, M, 1, NULL), KILN_ERR_INVALID_ARG);
    cr_assert_eq(us, -1, "untouched on failure");

    kiln_session_destroy(s);
    kiln_graph_destroy(g);
    free(src);
    free(data);
}

Test(gpu_session_bench, graph_replays_are_timed, .timeout = 300)
{
    kt_need_gpu();
    bench_one(0);
}

Test(gpu_session_bench, eager_launches_are_timed, .timeout = 300)
{
    kt_need_gpu();
    bench_one(1);
}
