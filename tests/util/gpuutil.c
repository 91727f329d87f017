#include "gpuutil.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kt_need_gpu(void)
{
    kiln_target t;
    if (kiln_target_live(0, &t) != KILN_OK)
        cr_skip_test("no GPU here (%s): the gpu suite runs on a machine with one",
                     kiln_last_error());
}

void kt_fresh_cache(char *path, size_t size)
{
    char dir[] = "/tmp/kiln-gpu-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, size, "%s/kernels.kiln", dir);
}

void kt_weight_make(kt_weight *w, kt_rng *r, kiln_format f, int64_t n, int64_t k)
{
    size_t data, scale;
    cr_assert_eq(kiln_format_data_bytes(f, n, k, &data), KILN_OK);
    cr_assert_eq(kiln_format_scale_bytes(f, n, k, &scale), KILN_OK);
    float *src = malloc((size_t)(n * k) * sizeof *src);
    kt_fill_normal(r, src, (size_t)(n * k), 1.0f / sqrtf((float)k));
    w->q = (kiln_qtensor){ .format = f, .n = n, .k = k, .data = malloc(data),
                           .scale = scale ? malloc(scale) : NULL };
    cr_assert_eq(kiln_quantize(src, &w->q), KILN_OK, "%s", kiln_last_error());
    free(src);
    w->bias = malloc((size_t)n * sizeof *w->bias);
    kt_fill_normal(r, w->bias, (size_t)n, 0.1f);
}

void kt_weight_free(kt_weight *w)
{
    free(w->q.data);
    free(w->q.scale);
    free(w->bias);
}

kiln_graph *kt_linear_graph(kt_weight *w)
{
    kiln_graph *g;
    kiln_tensor *x, *wt, *b, *y;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    cr_assert_eq(kiln_graph_input(g, "x", w->q.k, &x), KILN_OK);
    cr_assert_eq(kiln_graph_weight(g, "w", &w->q, &wt), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_graph_param(g, "b", w->q.n, w->bias, &b), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "y", x, wt, b, &y), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, y), KILN_OK);
    return g;
}

kiln_graph *kt_ffn_graph(kt_weight *gate, kt_weight *up, kt_weight *down, float *norm)
{
    kiln_graph *g;
    kiln_tensor *x, *nw, *wg, *wu, *wd, *h, *a, *u, *s, *p, *d, *y;
    int64_t dm = gate->q.k;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    cr_assert_eq(kiln_graph_input(g, "x", dm, &x), KILN_OK);
    cr_assert_eq(kiln_graph_param(g, "norm", dm, norm, &nw), KILN_OK);
    cr_assert_eq(kiln_graph_weight(g, "gate.w", &gate->q, &wg), KILN_OK);
    cr_assert_eq(kiln_graph_weight(g, "up.w", &up->q, &wu), KILN_OK);
    cr_assert_eq(kiln_graph_weight(g, "down.w", &down->q, &wd), KILN_OK);
    cr_assert_eq(kiln_graph_rms_norm(g, "h", x, nw, 1e-5f, &h), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "gate", h, wg, NULL, &a), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "up", h, wu, NULL, &u), KILN_OK);
    cr_assert_eq(kiln_graph_silu(g, "act", a, &s), KILN_OK);
    cr_assert_eq(kiln_graph_mul(g, "prod", s, u, &p), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "down", p, wd, NULL, &d), KILN_OK);
    cr_assert_eq(kiln_graph_add(g, "y", x, d, &y), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, y), KILN_OK);
    return g;
}

double kt_compare_cpu(kiln_session *s, kiln_graph *g, int64_t m, kt_rng *r, const char *what,
                      float *gpu_out)
{
    int64_t k = kiln_tensor_ne(kiln_graph_input_at(g, 0), 0);
    int64_t n = kiln_tensor_ne(kiln_graph_output_at(g, 0), 0);
    float *x = malloc((size_t)(m * k) * sizeof *x), *yg = malloc((size_t)(m * n) * sizeof *yg),
          *yc = malloc((size_t)(m * n) * sizeof *yc);
    kt_fill_normal(r, x, (size_t)(m * k), 1.0f);
    const float *in[] = { x };
    float *og[] = { yg }, *oc[] = { yc };
    kiln_cpu *cpu;
    cr_assert_eq(kiln_cpu_create(g, NULL, &cpu), KILN_OK);
    cr_assert_eq(kiln_session_run(s, m, in, og), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_cpu_run(cpu, m, in, oc), KILN_OK);
    kiln_cpu_destroy(cpu);
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < m * n; i++)
        scale = fmax(scale, fabs(yc[i]));
    for (int64_t i = 0; i < m * n; i++) {
        cr_assert(isfinite(yg[i]), "%s m=%lld y[%lld][%lld] = %g", what, (long long)m,
                  (long long)(i / n), (long long)(i % n), yg[i]);
        double err = fabs((double)yg[i] - yc[i]);
        double tol = ldexp(scale, -6) + ldexp(fabs(yc[i]), -6);
        cr_assert_leq(err, tol, "%s m=%lld y[%lld][%lld]: gpu %g cpu %g", what, (long long)m,
                      (long long)(i / n), (long long)(i % n), yg[i], yc[i]);
        worst = fmax(worst, err / scale);
    }
    if (gpu_out)
        memcpy(gpu_out, yg, (size_t)(m * n) * sizeof *yg);
    free(x);
    free(yg);
    free(yc);
    return worst;
}
