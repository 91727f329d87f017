#include "gpuutil.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kt_need_gpu(void)
{
    kiln_target t;
    kiln_status st = kiln_target_live(0, &t);
    if (st == KILN_ERR_NO_DEVICE)
        cr_skip_test("no GPU here (%s): the gpu suite runs on a machine with one",
                     kiln_last_error());
    cr_assert_eq(st, KILN_OK, "a GPU is there but cannot be used: %s", kiln_last_error());
}

void kt_fresh_cache(char *path, size_t size)
{
    char dir[] = "/tmp/kiln-gpu-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, size, "%s/kernels.kiln", dir);
}

void kt_weight_make(kt_weight *w, kt_rng *r, kiln_format f, int64_t n, int64_t k)
{
    kt_weight_make_group(w, r, f, n, k, 0);
}

void kt_weight_make_group(kt_weight *w, kt_rng *r, kiln_format f, int64_t n, int64_t k, int64_t group)
{
    size_t data, scale;
    w->q = (kiln_qtensor){ .format = f, .n = n, .k = k, .group = group };
    cr_assert_eq(kiln_format_data_bytes(f, n, k, &data), KILN_OK);
    cr_assert_eq(kiln_qtensor_scale_bytes(&w->q, &scale), KILN_OK, "%s", kiln_last_error());
    float *src = malloc((size_t)(n * k) * sizeof *src);
    kt_fill_normal(r, src, (size_t)(n * k), 1.0f / sqrtf((float)k));
    w->q.data = malloc(data);
    w->q.scale = scale ? malloc(scale) : NULL;
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

kiln_session *kt_session_create(kiln_graph *g, const kiln_session_options *o)
{
    kiln_session *s = NULL;
    cr_assert_eq(kiln_session_create(g, o, &s), KILN_OK, "%s", kiln_last_error());
    return s;
}

void kt_session_destroy(kiln_session *s) { kiln_session_destroy(s); }

const kiln_plan *kt_session_plan(const kiln_session *s)
{
    const kiln_plan *p = kiln_session_plan(s);
    cr_assert_not_null(p, "no session");
    return p;
}

double kt_check_session(kiln_session *s, kiln_graph *g, int64_t m, kt_rng *r, const char *what,
                        float *gpu_out)
{
    int64_t k = kiln_tensor_ne(kiln_graph_input_at(g, 0), 0);
    int64_t n = kiln_tensor_ne(kiln_graph_output_at(g, 0), 0);
    float *x = malloc((size_t)(m * k) * sizeof *x), *y = malloc((size_t)(m * n) * sizeof *y);
    cr_assert(x && y);
    kt_fill_normal(r, x, (size_t)(m * k), 1.0f);
    const float *in[] = { x };
    float *out[] = { y };
    cr_assert_eq(kiln_session_run(s, m, in, out), KILN_OK, "%s", kiln_last_error());
    kt_ref want = kt_ref_eval(g, kt_session_plan(s), m, x);
    double worst;
    char first[256];
    int64_t bad = kt_ref_violations(&want, y, &worst, first, sizeof first);
    cr_assert_eq(bad, 0, "%s m=%lld: %lld of %lld outputs outside the bound; first %s", what,
                 (long long)m, (long long)bad, (long long)(m * n), first);
    if (gpu_out)
        memcpy(gpu_out, y, (size_t)(m * n) * sizeof *y);
    kt_ref_free(&want);
    free(x);
    free(y);
    return worst;
}
