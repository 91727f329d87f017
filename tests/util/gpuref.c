#include "gpuref.h"

#include "graph/graph_impl.h"

#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EPS ((double)FLT_EPSILON)
#define U_BF16 0x1p-8 /* unit roundoff of BF16 */
#define U_OP 0x1p-16  /* an f32 elementwise op, fast-math functions included */

static kt_ref ref_new(int64_t m, int64_t d)
{
    kt_ref a = { m, d, calloc((size_t)(m * d), sizeof(double)),
                 calloc((size_t)(m * d), sizeof(double)) };
    cr_assert(a.v && a.e);
    return a;
}

void kt_ref_free(kt_ref *r)
{
    free(r->v);
    free(r->e);
    r->v = r->e = NULL;
}

/* The value computed in f32 within e of v, rounded to BF16. */
static void store(kt_ref *a)
{
    for (int64_t i = 0; i < a->m * a->d; i++)
        a->e[i] += U_BF16 * (fabs(a->v[i]) + a->e[i]);
}

static double sum_gamma(int64_t k) { return (4.0 * sqrt((double)k) + 1.0) * EPS; }

/* Formats decoded as d·q − offset: the offset reaches the block's largest
 * weight, so the two terms' sizes reach |w| + 2·that. */
static int has_offset(kiln_format f)
{
    return f == KILN_FMT_Q4_0 || f == KILN_FMT_Q4_K || f == KILN_FMT_Q6_K ||
           f == KILN_FMT_Q4_1 || f == KILN_FMT_Q5_1 || f == KILN_FMT_Q5_K || f == KILN_FMT_Q2_K;
}

static float bf16(float v) { return kiln_bf16_to_f32(kiln_f32_to_bf16(v)); }

/* The integer GGML formats, whose weights BF16 does not hold exactly. */
#define KT_INT_GGML                                                                               \
    (1u << KILN_FMT_Q8_0 | 1u << KILN_FMT_Q4_0 | 1u << KILN_FMT_Q4_K | 1u << KILN_FMT_Q6_K)

/* How each backend reads a weight: the CPU dequantizer's f32 value exactly,
 * or, for the formats in weight_bf16, that value rounded to BF16 (to
 * nearest even). A backend without a row has no stated contract, and its
 * kernels cannot be checked. */
static const struct {
    const char *backend;
    unsigned weight_bf16;
} contracts[] = {
    { "gemv", 0 },    /* f32 FMA on the dequantized value */
    { "gemv_tc", 0 }, /* tensor cores on exact BF16 terms of the value, f32 sums */
    { "simt", 0 },    /* f32 FMA on the dequantized value */
    { "wgmma", ~0u }, /* dequantized to f32, packed as BF16 for the tensor cores */
    /* the packed layout's values in BF16, exact or rounded once, f32 sums */
    { "wgmma_tc", KT_INT_GGML | 1u << KILN_FMT_F16 },
};

static int weight_bf16(const char *backend, kiln_format f)
{
    for (size_t i = 0; i < sizeof contracts / sizeof contracts[0]; i++)
        if (!strcmp(contracts[i].backend, backend))
            return !!(contracts[i].weight_bf16 & (1u << f));
    cr_assert_fail("backend %s has no numeric contract in tests/util/gpuref.c", backend);
    return 0;
}

/* The weight as the GPU reads it; per element the size of the terms a
 * kernel may sum it as, and how far a rounding to BF16 may land from the
 * value used here (where the kernel's f32 value could differ from the CPU
 * dequantizer's in its last bits and fall on the other side of a BF16
 * rounding boundary). */
static void weight_values(const kiln_qtensor *q, int round_bf16, float **w, float **size,
                          float **slack)
{
    size_t nk = (size_t)(q->n * q->k);
    *w = malloc(nk * sizeof **w);
    *size = malloc(nk * sizeof **size);
    *slack = calloc(nk, sizeof **slack);
    cr_assert(*w && *size && *slack);
    cr_assert_eq(kiln_dequantize(q, *w), KILN_OK, "%s", kiln_last_error());
    for (size_t i = 0; i < nk && round_bf16; i++) {
        const float v = (*w)[i], up = bf16(v * (1 + 0x1p-20f)), down = bf16(v * (1 - 0x1p-20f));
        (*w)[i] = bf16(v);
        (*slack)[i] = fabsf(up - down);
    }
    for (size_t i = 0; i < nk; i++)
        (*size)[i] = fabsf((*w)[i]);
    if (!has_offset(q->format))
        return;
    for (size_t b = 0; b < nk; b += 32) {
        float big = 0;
        for (size_t i = b; i < b + 32; i++)
            big = fmaxf(big, fabsf((*w)[i]));
        for (size_t i = b; i < b + 32; i++)
            (*size)[i] += 2 * big;
    }
}

/* How far an FP8-activation kernel's product with w may land from the
 * exact one for row x (values v, bounds e) of k, quantized in groups of
 * g along K (g = k: fp8-token; 128: fp8-1x128): a group's scale s = amax
 * / 448 (amax at most max |v| + e) turns each value into s·q, q an E4M3 code
 * rounded to nearest, off by at most 2^-4 of the value (3 significant
 * bits) or 2^-10·s (below E4M3's normals), with 2^-8 of that again for a
 * fast-math division landing on the other side of a rounding boundary.
 * Those errors are independent and zero-mean across a row, so, as for the
 * f32 sums (Higham–Mary, λ = 8), their sum over the products stays below
 * 8·√(Σ (err·w)²). The tensor cores add a stage's 128 E4M3 products with
 * fewer bits than f32: four k32 steps each within 2^-12 of the terms'
 * magnitude, before the f32 promotion. */
static double fp8_error(const double *v, const double *e, const float *w, int64_t k, int64_t g)
{
    double sq = 0, mag = 0;
    for (int64_t b = 0; b < k; b += g) {
        const int64_t end = b + g < k ? b + g : k;
        double amax = 0;
        for (int64_t l = b; l < end; l++)
            amax = fmax(amax, fabs(v[l]) + e[l]);
        const double s = amax / 448.0;
        for (int64_t l = b; l < end; l++) {
            double err = ((fabs(v[l]) + e[l]) * 0x1p-4 + s * 0x1p-10) * (1 + 0x1p-8);
            sq += err * err * (double)w[l] * (double)w[l];
            mag += (fabs(v[l]) + e[l] + err) * fabs(w[l]);
        }
    }
    /* a grouped kernel scales and adds each stage's sum in f32: two more
     * roundings a stage */
    return 8.0 * sqrt(sq) + 4.0 * 0x1p-12 * mag + (g < k ? 2 * EPS * mag : 0);
}

/* e4m3(v / s) · s, saturated: a static input scale's quantization. */
static double static_qdq(double v, float s)
{
    return (double)kiln_e4m3_to_f32(kiln_f32_to_e4m3((float)(v / s))) * s;
}

/* A linear's input x under its static scale s, as the GPU makes it: each
 * value v becomes e4m3(v / s) · s. The GPU's v is known within e, and the
 * rounding to E4M3 is monotone, so its value lies between what v − e and
 * v + e quantize to; the f32 quotient and product are a rounding each
 * (2^-23 relative widens e for the first). bf16: the value is stored as
 * BF16 (bf16-qdq), one more rounding of 2^-8. */
static kt_ref ref_static(const kt_ref *x, float s, int bf16)
{
    kt_ref y = ref_new(x->m, x->d);
    for (int64_t i = 0; i < x->m * x->d; i++) {
        const double v = x->v[i], e = x->e[i] + fabs(v) * 0x1p-23;
        const double q = static_qdq(v, s);
        const double spread = fmax(q - static_qdq(v - e, s), static_qdq(v + e, s) - q);
        y.v[i] = q;
        y.e[i] = spread + fabs(q) * (0x1p-24 + (bf16 ? 0x1p-8 : 0));
    }
    return y;
}

/* The tensor cores' part of an FP8 product of activations quantized
 * before (fp8-static): fp8_error's without the quantization. */
static double fp8_static_error(const double *v, const double *e, const float *w, int64_t k)
{
    double mag = 0;
    for (int64_t l = 0; l < k; l++)
        mag += (fabs(v[l]) + e[l]) * fabs(w[l]);
    return 4.0 * 0x1p-12 * mag;
}

/* Outputs [j0, j1) of every row of a linear's reference. */
typedef struct linear_job {
    const kt_ref *x;
    kt_ref *y;
    const float *w, *size, *slack, *bias;
    int64_t fp8_group, j0, j1;
} linear_job;

static void *linear_rows(void *arg)
{
    const linear_job *jb = arg;
    const kt_ref *x = jb->x;
    const int64_t k = x->d, n = jb->y->d, steps = (k + 15) / 16;
    for (int64_t i = 0; i < x->m; i++)
        for (int64_t j = jb->j0; j < jb->j1; j++) {
            const double *xr = x->v + i * k, *er = x->e + i * k;
            const float *wr = jb->w + j * k, *sr = jb->size + j * k, *lr = jb->slack + j * k;
            double s = 0, off = 0, mag = 0, prop = 0;
            double lo = 0, hi = 0, off_lo = 0, off_hi = 0;
            for (int64_t l = 0; l < k; l++) {
                s += xr[l] * wr[l];
                off += xr[l] * (sr[l] - fabs(wr[l]));
                mag += (fabs(xr[l]) + er[l]) * sr[l];
                prop += er[l] * fabs(wr[l]) + (fabs(xr[l]) + er[l]) * lr[l];
                lo = fmin(lo, s), hi = fmax(hi, s);
                off_lo = fmin(off_lo, off), off_hi = fmax(off_hi, off);
            }
            /* the largest sum of a contiguous K range */
            double partial = fmax(hi - lo, off_hi - off_lo);
            if (jb->fp8_group) {
                prop += jb->fp8_group > 0 ? fp8_error(xr, er, wr, k, jb->fp8_group)
                                          : fp8_static_error(xr, er, wr, k);
                /* the f32 scales multiply the sum: three roundings */
                mag += 3 * fabs(s);
            }
            if (jb->bias) {
                s += jb->bias[j];
                mag += fabs(jb->bias[j]);
            }
            jb->y->v[i * n + j] = s;
            jb->y->e[i * n + j] = prop + sum_gamma(k) * mag + 4.0 * (double)steps * EPS * partial;
        }
    return NULL;
}

enum { REF_MAX_THREADS = 64 };

/* fp8_group: 0 for BF16 activations, g > 0 for FP8 quantized in groups of
 * g along K by the kernel's own scales, -1 for FP8 codes of x made with a
 * static scale (x holds their values). Large products are split over the
 * cores by output columns: the GPU suites' time goes here. */
static kt_ref ref_linear(const kt_ref *x, const kiln_qtensor *q, const float *bias,
                         int round_bf16, int64_t fp8_group)
{
    float *w, *size, *slack;
    weight_values(q, round_bf16, &w, &size, &slack);
    kt_ref y = ref_new(x->m, q->n);
    int64_t threads = kiln_cpu_count();
    if (threads > REF_MAX_THREADS)
        threads = REF_MAX_THREADS;
    if ((double)x->m * (double)q->n * (double)x->d < 4e6 || threads < 1)
        threads = 1;
    linear_job jobs[REF_MAX_THREADS];
    pthread_t tid[REF_MAX_THREADS];
    int started[REF_MAX_THREADS] = { 0 };
    for (int64_t t = 0; t < threads; t++) {
        jobs[t] = (linear_job){ x, &y, w, size, slack, bias, fp8_group,
                                q->n * t / threads, q->n * (t + 1) / threads };
        if (t > 0)
            started[t] = pthread_create(&tid[t], NULL, linear_rows, &jobs[t]) == 0;
    }
    linear_rows(&jobs[0]);
    for (int64_t t = 1; t < threads; t++) {
        if (started[t])
            pthread_join(tid[t], NULL);
        else
            linear_rows(&jobs[t]);
    }
    free(w);
    free(size);
    free(slack);
    return y;
}

/* y_l = w_l·x_l / r, r = √(mean x² + eps); ∂y_l/∂x_j = w_l(δ_lj/r −
 * x_l·x_j/(K·r³)). The f32 sum of squares carries sum_gamma(K), half of it
 * in r. */
static kt_ref ref_rms_norm(const kt_ref *x, const float *w, float eps)
{
    kt_ref y = ref_new(x->m, x->d);
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
                             (sum_gamma(k) / 2 + U_OP) * fabs(v);
        }
    }
    return y;
}

/* |silu'| ≤ 1.1, |gelu'| ≤ 1.13. */
static kt_ref ref_unary(const kt_ref *x, kiln_op op)
{
    const double c = sqrt(2.0 / M_PI);
    kt_ref y = ref_new(x->m, x->d);
    for (int64_t i = 0; i < x->m * x->d; i++) {
        double v = x->v[i], r;
        if (op == KILN_OP_SILU)
            r = v / (1.0 + exp(-v));
        else
            r = 0.5 * v * (1.0 + tanh(c * (v + 0.044715 * v * v * v)));
        y.v[i] = r;
        y.e[i] = 1.13 * x->e[i] + U_OP * (fabs(r) + fabs(v) + x->e[i]);
    }
    return y;
}

static kt_ref ref_binary(const kt_ref *a, const kt_ref *b, kiln_op op)
{
    kt_ref y = ref_new(a->m, a->d);
    for (int64_t i = 0; i < a->m * a->d; i++) {
        double av = fabs(a->v[i]) + a->e[i], bv = fabs(b->v[i]) + b->e[i];
        if (op == KILN_OP_MUL) {
            y.v[i] = a->v[i] * b->v[i];
            y.e[i] = av * bv - fabs(a->v[i]) * fabs(b->v[i]) + U_OP * av * bv;
        } else {
            y.v[i] = a->v[i] + b->v[i];
            y.e[i] = a->e[i] + b->e[i] + U_OP * (av + bv);
        }
    }
    return y;
}

/* How plan p runs linear t for m tokens: its backend and activations. */
static kiln_plan_linear linear_of(const kiln_plan *p, const kiln_tensor *t, int64_t m)
{
    int bucket = kiln_plan_bucket_for(p, m);
    cr_assert_geq(bucket, 0, "m=%lld exceeds the plan's buckets", (long long)m);
    kiln_plan_linear l = { 0 };
    for (int i = 0; i < kiln_plan_n_linears(p); i++) {
        cr_assert_eq(kiln_plan_linear_at(p, i, bucket, &l), KILN_OK);
        if (!strcmp(l.node, t->name))
            return l;
    }
    cr_assert_fail("linear %s is not in the plan", t->name);
    return l;
}

/* The activation schemes the reference models: BF16 (0; bf16-tc is its
 * values reordered along K), FP8 in groups of the returned size along K:
 * fp8-token (all of K), fp8-1x128; and -1 for FP8 codes made with the
 * linear's static input scale (fp8-static). */
static int64_t fp8_group(const kiln_plan_linear *l)
{
    if (!strcmp(l->input_scale_use, "fp8-static"))
        return -1;
    if (!strcmp(l->act, "fp8-token"))
        return l->k;
    if (!strcmp(l->act, "fp8-1x128"))
        return 128;
    cr_assert(!strcmp(l->act, "bf16") || !strcmp(l->act, "bf16-tc"),
              "%s: activations %s have no reference in gpuref.c", l->node, l->act);
    return 0;
}

kt_ref kt_ref_eval(kiln_graph *g, const kiln_plan *p, int64_t m, const float *x)
{
    cr_assert_eq(kiln_graph_n_inputs(g), 1);
    cr_assert_eq(kiln_graph_n_outputs(g), 1);
    int n = kiln_graph_n_tensors(g);
    kt_ref *acts = calloc((size_t)n, sizeof *acts);
    cr_assert_not_null(acts);

    const kiln_tensor *in = kiln_graph_input_at(g, 0);
    kt_ref *xr = &acts[in->id];
    *xr = ref_new(m, in->ne[0]);
    for (int64_t i = 0; i < m * in->ne[0]; i++)
        xr->v[i] = kiln_bf16_to_f32(kiln_f32_to_bf16(x[i]));

    kiln_tensor *const *topo;
    int nt;
    cr_assert_eq(kiln_graph_topo(g, &topo, &nt), KILN_OK);
    const kiln_tensor *out = kiln_graph_output_at(g, 0);
    for (int i = 0; i < nt; i++) {
        const kiln_tensor *t = topo[i];
        const kt_ref *a = t->src[0] ? &acts[t->src[0]->id] : NULL;
        switch (t->op) {
        case KILN_OP_LINEAR: {
            /* Without a plan, a static input scale as the model defines it. */
            const float s = kiln_tensor_input_scale(t);
            kiln_plan_linear l = { .act = "bf16", .input_scale_use = s > 0 ? "exact" : "" };
            if (p)
                l = linear_of(p, t, m);
            kt_ref quantized = { 0 };
            if (l.input_scale_use[0] && strcmp(l.input_scale_use, "ignored")) {
                quantized = ref_static(a, s, !strcmp(l.input_scale_use, "bf16-qdq"));
                a = &quantized;
            }
            acts[t->id] = ref_linear(a, &t->src[1]->weight, t->src[2] ? t->src[2]->param : NULL,
                                     p && weight_bf16(l.backend, t->src[1]->weight.format),
                                     fp8_group(&l));
            kt_ref_free(&quantized);
            break;
        }
        case KILN_OP_RMS_NORM:
            acts[t->id] = ref_rms_norm(a, t->src[1]->param, t->eps);
            break;
        case KILN_OP_SILU:
        case KILN_OP_GELU:
            acts[t->id] = ref_unary(a, t->op);
            break;
        case KILN_OP_ADD:
        case KILN_OP_MUL:
            acts[t->id] = ref_binary(a, &acts[t->src[1]->id], t->op);
            break;
        default:
            cr_assert_fail("op %s has no reference", kiln_op_name(t->op));
        }
        /* What later ops read is stored; the output's rounding is checked
         * exactly by kt_ref_violations. */
        if (t != out)
            store(&acts[t->id]);
        else
            cr_assert(i == nt - 1, "the output is the last op and read by none");
    }
    kt_ref y = acts[out->id];
    acts[out->id] = (kt_ref){ 0 };
    for (int i = 0; i < n; i++)
        kt_ref_free(&acts[i]);
    free(acts);
    return y;
}

/* The BF16 value x rounds to, with x first widened to f32 away from v. */
static float bf16_at(double x, float toward)
{
    return kiln_bf16_to_f32(kiln_f32_to_bf16(nextafterf((float)x, toward)));
}

int64_t kt_ref_violations(const kt_ref *want, const float *got, double *worst, char *first,
                          size_t size)
{
    int64_t bad = 0;
    *worst = 0;
    if (size)
        first[0] = '\0';
    for (int64_t i = 0; i < want->m * want->d; i++) {
        /* Rounding is monotone: the stored value lies between the roundings
         * of the interval's ends. */
        const double v = want->v[i], e = want->e[i];
        const double lo = bf16_at(v - e, -INFINITY), hi = bf16_at(v + e, INFINITY);
        const double diff = fabs((double)got[i] - v), allowed = fmax(v - lo, hi - v);
        const int ok = got[i] >= lo && got[i] <= hi; /* false for NaN */
        *worst = fmax(*worst, ok ? diff / allowed : INFINITY);
        if (ok)
            continue;
        if (!bad++ && size)
            snprintf(first, size,
                     "y[%lld][%lld]: got %.9g, want %.9g within %.3g before BF16 rounding "
                     "([%.9g, %.9g] after)",
                     (long long)(i / want->d), (long long)(i % want->d), (double)got[i], v, e,
                     lo, hi);
    }
    return bad;
}
