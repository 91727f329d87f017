#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln.h"
#include "testutil.h"

/* Unit roundoff of f32. */
#define U (FLT_EPSILON / 2.0)

/* The f32 sum of K products x_k·w_k that the executor forms (k in order,
 * then + bias) differs from the exact value by at most γ·(Σ|x_k||w_k| + |b|).
 * The worst case is γ = K·u, but rounding errors that behave as independent
 * zero-mean variables give γ = λ·√K·u, which holds with probability at least
 * 1 − 2K·exp(−λ²(1−u)²/2) (Higham & Mary, "A new approach to probabilistic
 * rounding error analysis", SISC 2019, Thm 3.1). λ = 8 makes a false failure
 * about 1e-10 per element at K = 4096, so 4·√K·FLT_EPSILON (= 8·√K·u), plus
 * one rounding for the bias, is tight enough to catch a dropped or doubled
 * term (≈ 1/√K of the result) and loose enough never to flake. */
static double dot_gamma(int64_t k) { return (4.0 * sqrt((double)k) + 1.0) * FLT_EPSILON; }

static void expect_err(kiln_status got, kiln_status want, ...)
{
    cr_assert_eq(got, want, "status %s, want %s; message: %s", kiln_strerror(got),
                 kiln_strerror(want), kiln_last_error());
    va_list ap;
    va_start(ap, want);
    for (const char *sub; (sub = va_arg(ap, const char *));)
        cr_assert(strstr(kiln_last_error(), sub), "message \"%s\" lacks \"%s\"", kiln_last_error(),
                  sub);
    va_end(ap);
}

static float *random_floats(kt_rng *r, size_t n, float sigma)
{
    float *x = malloc(n * sizeof *x);
    cr_assert_not_null(x);
    kt_fill_normal(r, x, n, sigma);
    return x;
}

/* A weight quantized from random normal values, and its dequantized f32
 * form: the reference multiplies by exactly what the executor sees. */
typedef struct test_weight {
    kiln_qtensor q;
    float *deq; /* [n, k] */
} test_weight;

static test_weight make_weight(kt_rng *r, kiln_format f, int64_t n, int64_t k)
{
    test_weight w = { .q = { .format = f, .n = n, .k = k } };
    size_t data_bytes, scale_bytes;
    cr_assert_eq(kiln_format_data_bytes(f, n, k, &data_bytes), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_format_scale_bytes(f, n, k, &scale_bytes), KILN_OK, "%s",
                 kiln_last_error());
    w.q.data = malloc(data_bytes);
    w.q.scale = scale_bytes ? malloc(scale_bytes) : NULL;
    float *src = random_floats(r, (size_t)(n * k), 0.5f);
    cr_assert_eq(kiln_quantize(src, &w.q), KILN_OK, "%s", kiln_last_error());
    free(src);
    w.deq = malloc((size_t)(n * k) * sizeof(float));
    cr_assert_eq(kiln_dequantize(&w.q, w.deq), KILN_OK, "%s", kiln_last_error());
    return w;
}

static void free_weight(test_weight *w)
{
    free(w->q.data);
    free(w->q.scale);
    free(w->deq);
}

/* ----------------------------------------------------- float64 reference */

/* An activation [m, d] in double with, per element, a bound on how far the
 * executor's f32 value may be from it (propagated op by op to first order). */
typedef struct ref_act {
    int64_t m, d;
    double *v, *e;
} ref_act;

static ref_act ref_new(int64_t m, int64_t d)
{
    ref_act a = { m, d, calloc((size_t)(m * d), sizeof(double)),
                  calloc((size_t)(m * d), sizeof(double)) };
    cr_assert(a.v && a.e);
    return a;
}

static void ref_free(ref_act *a)
{
    free(a->v);
    free(a->e);
}

static ref_act ref_input(const float *x, int64_t m, int64_t d)
{
    ref_act a = ref_new(m, d);
    for (int64_t i = 0; i < m * d; i++)
        a.v[i] = x[i];
    return a;
}

static ref_act ref_linear(const ref_act *x, const float *w, const float *bias, int64_t n)
{
    ref_act y = ref_new(x->m, n);
    int64_t k = x->d;
    for (int64_t i = 0; i < x->m; i++)
        for (int64_t j = 0; j < n; j++) {
            const double *xr = x->v + i * k, *er = x->e + i * k;
            const float *wr = w + j * k;
            double s = 0, mag = 0, prop = 0;
            for (int64_t l = 0; l < k; l++) {
                s += xr[l] * wr[l];
                mag += (fabs(xr[l]) + er[l]) * fabs(wr[l]);
                prop += er[l] * fabs(wr[l]);
            }
            if (bias) {
                s += bias[j];
                mag += fabs(bias[j]);
            }
            y.v[i * n + j] = s;
            y.e[i * n + j] = prop + dot_gamma(k) * mag;
        }
    return y;
}

/* y_k = w_k·x_k / r with r = √(mean x² + eps): ∂y_k/∂x_j = w_k(δ_kj/r −
 * x_k·x_j/(K·r³)). The executor rounds the scale, x·scale and ·w: 3 u. */
static ref_act ref_rms_norm(const ref_act *x, const float *w, float eps)
{
    ref_act y = ref_new(x->m, x->d);
    int64_t k = x->d;
    for (int64_t i = 0; i < x->m; i++) {
        const double *xr = x->v + i * k, *er = x->e + i * k;
        double ss = 0, xe = 0;
        for (int64_t l = 0; l < k; l++) {
            ss += xr[l] * xr[l];
            xe += fabs(xr[l]) * er[l];
        }
        double r = sqrt(ss / (double)k + (double)eps);
        for (int64_t l = 0; l < k; l++) {
            double v = xr[l] * w[l] / r;
            y.v[i * k + l] = v;
            y.e[i * k + l] = fabs(w[l]) / r * (er[l] + fabs(xr[l]) * xe / ((double)k * r * r)) +
                             4 * U * fabs(v);
        }
    }
    return y;
}

/* |silu'| ≤ 1.1; expf (< 1 ulp), 1 + e, and the division: at most 4 u
 * relative, doubled for margin. */
static ref_act ref_silu(const ref_act *x)
{
    ref_act y = ref_new(x->m, x->d);
    for (int64_t i = 0; i < x->m * x->d; i++) {
        double v = x->v[i], s = v / (1.0 + exp(-v));
        y.v[i] = s;
        y.e[i] = 1.1 * x->e[i] + 8 * U * (fabs(s) + 1.1 * x->e[i]);
    }
    return y;
}

/* |gelu'| ≤ 1.13. The tanh argument t = c(v + 0.044715·v³) carries at most
 * 7 u of T = c(|v| + 0.044715|v|³) (the two rounded constants, three
 * products, a sum, a product); tanhf adds 2 u, 1 + tanh u·2, the last
 * product u·|y|: 0.5|v|(7T + 4)u + |y|u, rounded up to 8T + 6 and 2|y|. */
static ref_act ref_gelu(const ref_act *x)
{
    const double c = sqrt(2.0 / M_PI);
    ref_act y = ref_new(x->m, x->d);
    for (int64_t i = 0; i < x->m * x->d; i++) {
        double v = x->v[i], g = 0.5 * v * (1.0 + tanh(c * (v + 0.044715 * v * v * v)));
        double av = fabs(v) + x->e[i];
        double big_t = c * (av + 0.044715 * av * av * av);
        y.v[i] = g;
        y.e[i] = 1.13 * x->e[i] + U * (0.5 * av * (8 * big_t + 6) + 2 * fabs(g));
    }
    return y;
}

/* One rounding each; counted as 2 u, since a single rounding can reach u
 * exactly and the double reference of a sum is itself rounded. */
static ref_act ref_binary(const ref_act *a, const ref_act *b, bool mul)
{
    ref_act y = ref_new(a->m, a->d);
    for (int64_t i = 0; i < a->m * a->d; i++) {
        double av = fabs(a->v[i]) + a->e[i], bv = fabs(b->v[i]) + b->e[i];
        if (mul) {
            y.v[i] = a->v[i] * b->v[i];
            y.e[i] = av * bv - fabs(a->v[i]) * fabs(b->v[i]) + 2 * U * av * bv;
        } else {
            y.v[i] = a->v[i] + b->v[i];
            y.e[i] = a->e[i] + b->e[i] + 2 * U * (av + bv);
        }
    }
    return y;
}

static void check_against(const float *got, const ref_act *want, const char *what)
{
    for (int64_t i = 0; i < want->m; i++)
        for (int64_t j = 0; j < want->d; j++) {
            size_t at = (size_t)(i * want->d + j);
            double diff = fabs((double)got[at] - want->v[at]);
            cr_assert(diff <= want->e[at],
                      "%s [m=%lld of %lld, n=%lld]: got %.9g, want %.9g (diff %.3g > bound %.3g)",
                      what, (long long)i, (long long)want->m, (long long)j, (double)got[at],
                      want->v[at], diff, want->e[at]);
        }
}

/* ----------------------------------------------------------------- tests */

static kiln_graph *new_graph(void)
{
    kiln_graph *g = NULL;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    return g;
}

static kiln_cpu *new_cpu(kiln_graph *g, int threads)
{
    kiln_cpu_options opts = { .threads = threads };
    kiln_cpu *cpu = NULL;
    cr_assert_eq(kiln_cpu_create(g, &opts, &cpu), KILN_OK, "%s", kiln_last_error());
    cr_assert_not_null(cpu);
    return cpu;
}

/* y = x·Wᵀ + b for every format, for token counts that do and do not fill a
 * micro-tile, and N that does and does not fill a panel. */
Test(cpu, linear_matches_float64_reference_for_every_format)
{
    static const struct { int64_t n, k; } shapes[] = { { 48, 256 }, { 96, 512 }, { 130, 768 } };
    static const int64_t ms[] = { 1, 3, 17, 64, 3 }; /* grow, then shrink the scratch */
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        const char *fname = kiln_format_get((kiln_format)f)->name;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int64_t n = shapes[s].n, k = shapes[s].k;
            kt_rng r = kt_rng_new((uint64_t)(f * 16 + (int)s));
            test_weight w = make_weight(&r, (kiln_format)f, n, k);
            float *bias = random_floats(&r, (size_t)n, 1.0f);

            kiln_graph *g = new_graph();
            kiln_tensor *x, *wt, *b, *y;
            cr_assert_eq(kiln_graph_input(g, "x", k, &x), KILN_OK);
            cr_assert_eq(kiln_graph_weight(g, "w", &w.q, &wt), KILN_OK, "%s", kiln_last_error());
            cr_assert_eq(kiln_graph_param(g, "b", n, bias, &b), KILN_OK);
            cr_assert_eq(kiln_graph_linear(g, "y", x, wt, b, &y), KILN_OK);
            cr_assert_eq(kiln_graph_output(g, y), KILN_OK);
            kiln_cpu *cpu = new_cpu(g, 2);

            for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                int64_t m = ms[mi];
                float *in = random_floats(&r, (size_t)(m * k), 1.0f);
                float *out = malloc((size_t)(m * n) * sizeof(float));
                const float *ins[] = { in };
                float *outs[] = { out };
                cr_assert_eq(kiln_cpu_run(cpu, m, ins, outs), KILN_OK, "%s", kiln_last_error());
                ref_act rx = ref_input(in, m, k);
                ref_act ry = ref_linear(&rx, w.deq, bias, n);
                char what[96];
                snprintf(what, sizeof what, "%s linear N=%lld K=%lld M=%lld", fname,
                         (long long)n, (long long)k, (long long)m);
                check_against(out, &ry, what);
                ref_free(&rx);
                ref_free(&ry);
                free(in);
                free(out);
            }
            kiln_cpu_destroy(cpu);
            kiln_graph_destroy(g);
            free(bias);
            free_weight(&w);
        }
    }
}

/* A feed-forward block: out = x + down(silu(gate(n)) * up(n)), n = rms_norm(x),
 * and a second output gelu(out). */
typedef struct mlp {
    int64_t d, f;
    test_weight gate, up, down;
    float *norm_w, *up_b;
    kiln_graph *g;
} mlp;

static mlp mlp_build(uint64_t salt)
{
    kt_rng r = kt_rng_new(salt);
    mlp p = { .d = 256, .f = 384 };
    p.gate = make_weight(&r, KILN_FMT_Q4_K, p.f, p.d);
    p.up = make_weight(&r, KILN_FMT_Q8_0, p.f, p.d);
    p.down = make_weight(&r, KILN_FMT_NVFP4, p.d, p.f);
    p.norm_w = random_floats(&r, (size_t)p.d, 1.0f);
    p.up_b = random_floats(&r, (size_t)p.f, 0.5f);
    p.g = new_graph();
    kiln_tensor *x, *nw, *wg, *wu, *wd, *ub, *n, *gate, *up, *act, *prod, *down, *out, *z;
    cr_assert_eq(kiln_graph_input(p.g, "x", p.d, &x), KILN_OK);
    cr_assert_eq(kiln_graph_param(p.g, "norm.weight", p.d, p.norm_w, &nw), KILN_OK);
    cr_assert_eq(kiln_graph_weight(p.g, "gate.weight", &p.gate.q, &wg), KILN_OK);
    cr_assert_eq(kiln_graph_weight(p.g, "up.weight", &p.up.q, &wu), KILN_OK);
    cr_assert_eq(kiln_graph_weight(p.g, "down.weight", &p.down.q, &wd), KILN_OK);
    cr_assert_eq(kiln_graph_param(p.g, "up.bias", p.f, p.up_b, &ub), KILN_OK);
    cr_assert_eq(kiln_graph_rms_norm(p.g, "norm", x, nw, 1e-5f, &n), KILN_OK);
    cr_assert_eq(kiln_graph_linear(p.g, "gate", n, wg, NULL, &gate), KILN_OK);
    cr_assert_eq(kiln_graph_linear(p.g, "up", n, wu, ub, &up), KILN_OK);
    cr_assert_eq(kiln_graph_silu(p.g, "act", gate, &act), KILN_OK);
    cr_assert_eq(kiln_graph_mul(p.g, "prod", act, up, &prod), KILN_OK);
    cr_assert_eq(kiln_graph_linear(p.g, "down", prod, wd, NULL, &down), KILN_OK);
    cr_assert_eq(kiln_graph_add(p.g, "out", x, down, &out), KILN_OK);
    cr_assert_eq(kiln_graph_gelu(p.g, "z", out, &z), KILN_OK);
    cr_assert_eq(kiln_graph_output(p.g, out), KILN_OK);
    cr_assert_eq(kiln_graph_output(p.g, z), KILN_OK);
    return p;
}

static void mlp_free(mlp *p)
{
    kiln_graph_destroy(p->g);
    free_weight(&p->gate);
    free_weight(&p->up);
    free_weight(&p->down);
    free(p->norm_w);
    free(p->up_b);
}

Test(cpu, mlp_matches_float64_reference)
{
    mlp p = mlp_build(1);
    kiln_cpu *cpu = new_cpu(p.g, 0);
    kt_rng r = kt_rng_new(2);
    static const int64_t ms[] = { 5, 64, 1 };
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
        int64_t m = ms[mi];
        float *in = random_floats(&r, (size_t)(m * p.d), 1.0f);
        float *out = malloc((size_t)(m * p.d) * sizeof(float));
        float *z = malloc((size_t)(m * p.d) * sizeof(float));
        const float *ins[] = { in };
        float *outs[] = { out, z };
        cr_assert_eq(kiln_cpu_run(cpu, m, ins, outs), KILN_OK, "%s", kiln_last_error());

        ref_act rx = ref_input(in, m, p.d);
        ref_act rn = ref_rms_norm(&rx, p.norm_w, 1e-5f);
        ref_act rg = ref_linear(&rn, p.gate.deq, NULL, p.f);
        ref_act ru = ref_linear(&rn, p.up.deq, p.up_b, p.f);
        ref_act ra = ref_silu(&rg);
        ref_act rp = ref_binary(&ra, &ru, true);
        ref_act rd = ref_linear(&rp, p.down.deq, NULL, p.d);
        ref_act ro = ref_binary(&rx, &rd, false);
        ref_act rz = ref_gelu(&ro);
        check_against(out, &ro, "mlp out");
        check_against(z, &rz, "mlp gelu(out)");
        ref_act *all[] = { &rx, &rn, &rg, &ru, &ra, &rp, &rd, &ro, &rz };
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            ref_free(all[i]);
        free(in);
        free(out);
        free(z);
    }
    kiln_cpu_destroy(cpu);
    mlp_free(&p);
}

static void run_mlp(kiln_cpu *cpu, int64_t m, const float *in, float *out, float *z)
{
    const float *ins[] = { in };
    float *outs[] = { out, z };
    cr_assert_eq(kiln_cpu_run(cpu, m, ins, outs), KILN_OK, "%s", kiln_last_error());
}

Test(cpu, thread_count_does_not_change_a_bit)
{
    mlp p = mlp_build(3);
    kiln_cpu *one = new_cpu(p.g, 1), *four = new_cpu(p.g, 4), *odd = new_cpu(p.g, 3);
    kt_rng r = kt_rng_new(4);
    static const int64_t ms[] = { 64, 17, 1 };
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
        int64_t m = ms[mi];
        size_t n = (size_t)(m * p.d);
        float *in = random_floats(&r, n, 1.0f);
        float *o1 = malloc(n * sizeof(float)), *z1 = malloc(n * sizeof(float));
        float *o4 = malloc(n * sizeof(float)), *z4 = malloc(n * sizeof(float));
        float *o3 = malloc(n * sizeof(float)), *z3 = malloc(n * sizeof(float));
        run_mlp(one, m, in, o1, z1);
        run_mlp(four, m, in, o4, z4);
        run_mlp(odd, m, in, o3, z3);
        cr_assert(!memcmp(o1, o4, n * sizeof(float)), "out differs between 1 and 4 threads, m=%lld",
                  (long long)m);
        cr_assert(!memcmp(z1, z4, n * sizeof(float)), "z differs between 1 and 4 threads");
        cr_assert(!memcmp(o1, o3, n * sizeof(float)), "out differs between 1 and 3 threads");
        cr_assert(!memcmp(z1, z3, n * sizeof(float)), "z differs between 1 and 3 threads");
        /* And a second run on the same executor gives the same bits. */
        run_mlp(four, m, in, o4, z4);
        cr_assert(!memcmp(o1, o4, n * sizeof(float)), "a second run differs");
        free(in);
        free(o1);
        free(z1);
        free(o4);
        free(z4);
        free(o3);
        free(z3);
    }
    cr_assert_eq(kiln_cpu_threads(one), 1);
    cr_assert_eq(kiln_cpu_threads(four), 4);
    cr_assert_eq(kiln_cpu_threads(odd), 3);
    kiln_cpu_destroy(one);
    kiln_cpu_destroy(four);
    kiln_cpu_destroy(odd);
    mlp_free(&p);
}

/* Threads 0 is one per online core. */
Test(cpu, default_threads_are_one_per_core)
{
    mlp p = mlp_build(1);
    kiln_cpu *cpu = new_cpu(p.g, 0);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    cr_assert_eq(kiln_cpu_threads(cpu), cores > 0 ? (int)cores : 1);
    kiln_cpu_destroy(cpu);
    mlp_free(&p);
}

Test(cpu, wide_linear_is_identical_across_thread_counts)
{
    kt_rng r = kt_rng_new(5);
    int64_t n = 130, k = 768, m = 64;
    test_weight w = make_weight(&r, KILN_FMT_Q6_K, n, k);
    kiln_graph *g = new_graph();
    kiln_tensor *x, *wt, *y;
    cr_assert_eq(kiln_graph_input(g, "x", k, &x), KILN_OK);
    cr_assert_eq(kiln_graph_weight(g, "w", &w.q, &wt), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "y", x, wt, NULL, &y), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, y), KILN_OK);
    float *in = random_floats(&r, (size_t)(m * k), 1.0f);
    float *ref = malloc((size_t)(m * n) * sizeof(float));
    float *got = malloc((size_t)(m * n) * sizeof(float));
    const float *ins[] = { in };
    kiln_cpu *one = new_cpu(g, 1);
    cr_assert_eq(kiln_cpu_run(one, m, ins, (float *const[]){ ref }), KILN_OK);
    kiln_cpu_destroy(one);
    static const int threads[] = { 2, 4, 7, 17, 64 };
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
        kiln_cpu *cpu = new_cpu(g, threads[t]);
        cr_assert_eq(kiln_cpu_run(cpu, m, ins, (float *const[]){ got }), KILN_OK);
        cr_assert(!memcmp(ref, got, (size_t)(m * n) * sizeof(float)), "%d threads differ",
                  threads[t]);
        kiln_cpu_destroy(cpu);
    }
    free(in);
    free(ref);
    free(got);
    kiln_graph_destroy(g);
    free_weight(&w);
}

Test(cpu, shared_weight_inputs_as_outputs_and_unused_inputs)
{
    kt_rng r = kt_rng_new(6);
    int64_t n = 40, k = 64, m = 9;
    test_weight w = make_weight(&r, KILN_FMT_BF16, n, k);
    kiln_graph *g = new_graph();
    kiln_tensor *a, *b, *unused, *wt, *ya, *yb;
    cr_assert_eq(kiln_graph_input(g, "a", k, &a), KILN_OK);
    cr_assert_eq(kiln_graph_input(g, "unused", 7, &unused), KILN_OK);
    cr_assert_eq(kiln_graph_input(g, "b", k, &b), KILN_OK);
    cr_assert_eq(kiln_graph_weight(g, "w", &w.q, &wt), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "ya", a, wt, NULL, &ya), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "yb", b, wt, NULL, &yb), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, yb), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, a), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, ya), KILN_OK);
    kiln_cpu *cpu = new_cpu(g, 2);

    /* Outputs marked after the executor was made are not its business. */
    kiln_tensor *late;
    cr_assert_eq(kiln_graph_silu(g, "late", ya, &late), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, late), KILN_OK);

    float *in_a = random_floats(&r, (size_t)(m * k), 1.0f);
    float *in_b = random_floats(&r, (size_t)(m * k), 1.0f);
    float *out_yb = malloc((size_t)(m * n) * sizeof(float));
    float *out_a = malloc((size_t)(m * k) * sizeof(float));
    float *out_ya = malloc((size_t)(m * n) * sizeof(float));
    const float *ins[] = { in_a, NULL, in_b };
    float *outs[] = { out_yb, out_a, out_ya };
    cr_assert_eq(kiln_cpu_run(cpu, m, ins, outs), KILN_OK, "%s", kiln_last_error());
    cr_assert(!memcmp(out_a, in_a, (size_t)(m * k) * sizeof(float)), "an input output is a copy");
    ref_act ra = ref_input(in_a, m, k), rb = ref_input(in_b, m, k);
    ref_act rya = ref_linear(&ra, w.deq, NULL, n), ryb = ref_linear(&rb, w.deq, NULL, n);
    check_against(out_ya, &rya, "ya");
    check_against(out_yb, &ryb, "yb");

    /* An output buffer that is its own input: a copy onto itself. */
    float *outs_same[] = { out_yb, in_a, out_ya };
    cr_assert_eq(kiln_cpu_run(cpu, m, ins, outs_same), KILN_OK);
    check_against(out_ya, &rya, "ya after an aliased run");

    /* One output alone (an entry point): it needs only b, and gives the
     * same bits; the others are left as they were. */
    float *yb_alone = malloc((size_t)(m * n) * sizeof(float));
    memset(out_ya, 0x7f, (size_t)(m * n) * sizeof(float));
    const float *only_b[] = { NULL, NULL, in_b };
    float *only_yb[] = { yb_alone, NULL, NULL };
    cr_assert_eq(kiln_cpu_run(cpu, m, only_b, only_yb), KILN_OK, "%s", kiln_last_error());
    cr_assert(!memcmp(yb_alone, out_yb, (size_t)(m * n) * sizeof(float)), "yb alone differs");
    for (int64_t i = 0; i < m * n; i++) {
        uint32_t bits;
        memcpy(&bits, &out_ya[i], 4);
        cr_assert_eq(bits, 0x7f7f7f7fu, "ya written by a run that did not ask for it");
    }
    const float *only_a[] = { in_a, NULL, NULL };
    expect_err(kiln_cpu_run(cpu, m, only_a, only_yb), KILN_ERR_INVALID_ARG,
               "inputs[2] (input \"b\") is NULL", NULL);
    free(yb_alone);

    ref_free(&ra);
    ref_free(&rb);
    ref_free(&rya);
    ref_free(&ryb);
    free(in_a);
    free(in_b);
    free(out_yb);
    free(out_a);
    free(out_ya);
    kiln_cpu_destroy(cpu);
    kiln_graph_destroy(g);
    free_weight(&w);
}

/* Each non-linear op as its own output, so its bound is tight: a large eps
 * and small activations make any misuse of eps visible. */
Test(cpu, elementwise_ops_match_reference)
{
    kt_rng r = kt_rng_new(7);
    int64_t k = 40, m = 11;
    const float eps = 0.25f;
    float *nw = random_floats(&r, (size_t)k, 1.0f);
    kiln_graph *g = new_graph();
    kiln_tensor *a, *b, *w, *t[6];
    cr_assert_eq(kiln_graph_input(g, "a", k, &a), KILN_OK);
    cr_assert_eq(kiln_graph_input(g, "b", k, &b), KILN_OK);
    cr_assert_eq(kiln_graph_param(g, "nw", k, nw, &w), KILN_OK);
    cr_assert_eq(kiln_graph_add(g, "add", a, b, &t[0]), KILN_OK);
    cr_assert_eq(kiln_graph_mul(g, "mul", a, b, &t[1]), KILN_OK);
    cr_assert_eq(kiln_graph_silu(g, "silu", a, &t[2]), KILN_OK);
    cr_assert_eq(kiln_graph_gelu(g, "gelu", a, &t[3]), KILN_OK);
    cr_assert_eq(kiln_graph_rms_norm(g, "norm", a, w, eps, &t[4]), KILN_OK);
    cr_assert_eq(kiln_graph_rms_norm(g, "norm_b", b, w, eps, &t[5]), KILN_OK);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(kiln_graph_output(g, t[i]), KILN_OK);
    kiln_cpu *cpu = new_cpu(g, 1);

    float *in_a = random_floats(&r, (size_t)(m * k), 3.0f);
    float *in_b = random_floats(&r, (size_t)(m * k), 0.1f);
    float *out[6];
    for (int i = 0; i < 6; i++)
        out[i] = malloc((size_t)(m * k) * sizeof(float));
    const float *ins[] = { in_a, in_b };
    cr_assert_eq(kiln_cpu_run(cpu, m, ins, out), KILN_OK, "%s", kiln_last_error());

    ref_act ra = ref_input(in_a, m, k), rb = ref_input(in_b, m, k);
    ref_act want[6] = {
        ref_binary(&ra, &rb, false), ref_binary(&ra, &rb, true), ref_silu(&ra),
        ref_gelu(&ra),               ref_rms_norm(&ra, nw, eps), ref_rms_norm(&rb, nw, eps),
    };
    const char *names[6] = { "add", "mul", "silu", "gelu", "rms_norm", "rms_norm (small x)" };
    for (int i = 0; i < 6; i++) {
        check_against(out[i], &want[i], names[i]);
        ref_free(&want[i]);
        free(out[i]);
    }
    ref_free(&ra);
    ref_free(&rb);
    free(in_a);
    free(in_b);
    free(nw);
    kiln_cpu_destroy(cpu);
    kiln_graph_destroy(g);
}

/* An output that later nodes read keeps its buffer to the end, while the
 * buffers around it are reused by the long tail after it. */
Test(cpu, outputs_survive_the_nodes_after_them)
{
    kt_rng r = kt_rng_new(8);
    int64_t k = 24, m = 6;
    enum { TAIL = 12 };
    kiln_graph *g = new_graph();
    kiln_tensor *x, *early, *t;
    cr_assert_eq(kiln_graph_input(g, "x", k, &x), KILN_OK);
    cr_assert_eq(kiln_graph_silu(g, "early", x, &early), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, early), KILN_OK);
    cr_assert_eq(kiln_graph_gelu(g, NULL, early, &t), KILN_OK);
    for (int i = 0; i < TAIL; i++) {
        kiln_tensor *s;
        cr_assert_eq(kiln_graph_silu(g, NULL, t, &s), KILN_OK);
        cr_assert_eq(kiln_graph_add(g, NULL, s, x, &t), KILN_OK);
    }
    cr_assert_eq(kiln_graph_output(g, t), KILN_OK);
    kiln_cpu *cpu = new_cpu(g, 1);

    float *in = random_floats(&r, (size_t)(m * k), 1.0f);
    float *out_early = malloc((size_t)(m * k) * sizeof(float));
    float *out_last = malloc((size_t)(m * k) * sizeof(float));
    const float *ins[] = { in };
    float *outs[] = { out_early, out_last };
    cr_assert_eq(kiln_cpu_run(cpu, m, ins, outs), KILN_OK, "%s", kiln_last_error());

    ref_act rx = ref_input(in, m, k);
    ref_act re = ref_silu(&rx);
    ref_act rt = ref_gelu(&re);
    for (int i = 0; i < TAIL; i++) {
        ref_act rs = ref_silu(&rt);
        ref_act next = ref_binary(&rs, &rx, false);
        ref_free(&rs);
        ref_free(&rt);
        rt = next;
    }
    check_against(out_early, &re, "early output");
    check_against(out_last, &rt, "last output");
    ref_free(&rx);
    ref_free(&re);
    ref_free(&rt);
    free(in);
    free(out_early);
    free(out_last);
    kiln_cpu_destroy(cpu);
    kiln_graph_destroy(g);
}

/* The E4M3 value nearest v, found by search over every finite code, v
 * first clamped to ±448: an oracle independent of kiln_f32_to_e4m3. */
static double e4m3_nearest(double v)
{
    v = v > 448 ? 448 : v < -448 ? -448 : v;
    double best = 0, dist = INFINITY;
    for (int c = 0; c < 256; c++) {
        double e = kiln_e4m3_to_f32((uint8_t)c);
        if (!isnan(e) && fabs(e - v) < dist) {
            dist = fabs(e - v);
            best = e;
        }
    }
    return best;
}

/* A static input scale: each linear reads e4m3(x / s) · s, its own s, the
 * values past ±448 · s saturated; a linear without one reads x as it is.
 * Two linears share the input, and the scales make some values saturate. */
Test(cpu, static_input_scale_quantizes_the_linear_input)
{
    enum { M = 5, K = 96, N = 40 };
    kt_rng r = kt_rng_new(71);
    test_weight w = make_weight(&r, KILN_FMT_BF16, N, K);
    float *x = random_floats(&r, M * K, 1.0f);
    const float scales[2] = { 1.0f / 64, 3.0f / 448 }; /* the second saturates |x| > 3 */
    x[7] = 5.5f;
    x[K + 3] = -9.0f;
    kiln_graph *g = new_graph();
    kiln_tensor *in, *wt, *y[3];
    cr_assert_eq(kiln_graph_input(g, "x", K, &in), KILN_OK);
    cr_assert_eq(kiln_graph_weight(g, "w", &w.q, &wt), KILN_OK);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(kiln_graph_linear(g, NULL, in, wt, NULL, &y[i]), KILN_OK);
        if (i < 2)
            cr_assert_eq(kiln_graph_linear_input_scale(g, y[i], scales[i]), KILN_OK, "%s",
                         kiln_last_error());
        cr_assert_eq(kiln_graph_output(g, y[i]), KILN_OK);
    }
    kiln_cpu *cpu = new_cpu(g, 2);
    float *out[3];
    for (int i = 0; i < 3; i++)
        out[i] = malloc(M * N * sizeof(float));
    const float *ins[] = { x };
    cr_assert_eq(kiln_cpu_run(cpu, M, ins, out), KILN_OK, "%s", kiln_last_error());
    for (int i = 0; i < 3; i++) {
        ref_act xr = ref_input(x, M, K);
        int saturated = 0;
        for (int64_t e = 0; i < 2 && e < M * K; e++) {
            double q = (double)x[e] / scales[i];
            saturated += fabs(q) > 448;
            /* the quotient and the product are f32 roundings */
            xr.v[e] = e4m3_nearest((float)q) * scales[i];
            xr.e[e] = fabs(xr.v[e]) * FLT_EPSILON;
        }
        cr_assert(i == 2 || i == 0 || saturated >= 2, "the test saturates some values");
        ref_act want = ref_linear(&xr, w.deq, NULL, N);
        char what[32];
        snprintf(what, sizeof what, "linear %d", i);
        check_against(out[i], &want, what);
        ref_free(&want);
        ref_free(&xr);
        free(out[i]);
    }
    kiln_cpu_destroy(cpu);
    kiln_graph_destroy(g);
    free(x);
    free_weight(&w);
}

static kiln_graph *small_graph(float *data)
{
    kiln_graph *g = new_graph();
    kiln_qtensor q = { .format = KILN_FMT_F32, .n = 8, .k = 16, .data = data };
    kiln_tensor *x, *w, *y;
    cr_assert_eq(kiln_graph_input(g, "x", 16, &x), KILN_OK);
    cr_assert_eq(kiln_graph_weight(g, "w", &q, &w), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "y", x, w, NULL, &y), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, y), KILN_OK);
    return g;
}

Test(cpu, create_errors)
{
    static float data[8 * 16];
    kiln_cpu *cpu = NULL;
    kiln_graph *g = new_graph();
    kiln_tensor *x;
    cr_assert_eq(kiln_graph_input(g, "x", 16, &x), KILN_OK);
    expect_err(kiln_cpu_create(g, NULL, &cpu), KILN_ERR_STATE, "no outputs", NULL);
    kiln_graph_destroy(g);

    g = small_graph(data);
    expect_err(kiln_cpu_create(NULL, NULL, &cpu), KILN_ERR_INVALID_ARG, "graph is NULL", NULL);
    expect_err(kiln_cpu_create(g, NULL, NULL), KILN_ERR_INVALID_ARG, "out is NULL", NULL);
    expect_err(kiln_cpu_create(g, &(kiln_cpu_options){ .threads = -1 }, &cpu),
               KILN_ERR_INVALID_ARG, "threads = -1", NULL);
    expect_err(kiln_cpu_create(g, &(kiln_cpu_options){ .threads = 100000 }, &cpu),
               KILN_ERR_INVALID_ARG, "threads = 100000", NULL);
    cr_assert_null(cpu);
    cr_assert_eq(kiln_cpu_create(g, NULL, &cpu), KILN_OK, "NULL options mean defaults");
    kiln_cpu_destroy(cpu);
    kiln_cpu_destroy(NULL);
    kiln_graph_destroy(g);
    cpu = NULL;

    /* Valid to describe (the data is never read before create) but too big
     * to dequantize: N·K f32 values overflow size_t. */
    g = new_graph();
    int64_t big = (int64_t)1 << 31;
    kiln_qtensor q = { .format = KILN_FMT_Q4_0, .n = big, .k = big, .data = data };
    kiln_tensor *w, *y;
    cr_assert_eq(kiln_graph_input(g, "x", big, &x), KILN_OK);
    cr_assert_eq(kiln_graph_weight(g, "huge", &q, &w), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_graph_linear(g, "y", x, w, NULL, &y), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, y), KILN_OK);
    expect_err(kiln_cpu_create(g, NULL, &cpu), KILN_ERR_SHAPE, "weight \"huge\"", "too large",
               NULL);
    cr_assert_null(cpu);
    kiln_graph_destroy(g);
}

Test(cpu, run_errors)
{
    static float data[8 * 16];
    kiln_graph *g = small_graph(data);
    kiln_cpu *cpu = new_cpu(g, 1);
    float in[4 * 16] = { 1.0f }, out[4 * 8];
    const float *ins[] = { in };
    float *outs[] = { out };
    const float *no_ins[] = { NULL };
    float *no_outs[] = { NULL };
    expect_err(kiln_cpu_run(NULL, 1, ins, outs), KILN_ERR_INVALID_ARG, "executor is NULL", NULL);
    expect_err(kiln_cpu_run(cpu, 1, NULL, outs), KILN_ERR_INVALID_ARG, "inputs is NULL", NULL);
    expect_err(kiln_cpu_run(cpu, 1, ins, NULL), KILN_ERR_INVALID_ARG, "outputs is NULL", NULL);
    expect_err(kiln_cpu_run(cpu, 0, ins, outs), KILN_ERR_INVALID_ARG, "m = 0", NULL);
    expect_err(kiln_cpu_run(cpu, -4, ins, outs), KILN_ERR_INVALID_ARG, "m = -4", NULL);
    expect_err(kiln_cpu_run(cpu, INT64_MAX / 2, ins, outs), KILN_ERR_SHAPE, "too large", NULL);
    expect_err(kiln_cpu_run(cpu, (int64_t)1 << 62, ins, outs), KILN_ERR_SHAPE, "too large", NULL);
    expect_err(kiln_cpu_run(cpu, 2, no_ins, outs), KILN_ERR_INVALID_ARG,
               "inputs[0] (input \"x\") is NULL", NULL);
    expect_err(kiln_cpu_run(cpu, 2, ins, no_outs), KILN_ERR_INVALID_ARG,
               "every output is NULL (outputs[0] is tensor \"y\")", NULL);
    cr_assert_eq(kiln_cpu_run(cpu, 4, ins, outs), KILN_OK, "still usable after refusals");
    kiln_cpu_destroy(cpu);
    kiln_graph_destroy(g);
}
