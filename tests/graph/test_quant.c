/* CPU reference quantize / dequantize (graph/quant.c, graph/quant_ggml.c,
 * graph/quant_q2k_q3k.c, graph/quant_iq4.c).
 *
 *  - round trips on random normal data, every format and several shapes,
 *    against error bounds that follow from each format's definition, with
 *    the stored scales checked against the formula that defines them;
 *  - exact decoding of blocks written byte by byte here, values worked out
 *    by hand: subnormal E4M3, NaN scale codes, negative zero, saturation;
 *  - quantization edge cases: all-zero blocks, saturation, ties, NaN inputs;
 *  - every error path.
 * Bit-exactness against ggml / gguf-py is tests/oracle/test_gguf.py's job. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"
#include "testutil.h"

/* ---------------------------------------------------------------- helpers */

typedef struct qbuf {
    kiln_qtensor t;
    size_t data_bytes, scale_bytes;
} qbuf;

/* A tensor with freshly allocated data and scale arrays, filled with a
 * pattern so that bytes a quantizer forgot to write do not read as zero. */
static qbuf qbuf_new(kiln_format f, int64_t n, int64_t k)
{
    qbuf q = { .t = { .format = f, .n = n, .k = k } };
    cr_assert_eq(kiln_format_data_bytes(f, n, k, &q.data_bytes), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_format_scale_bytes(f, n, k, &q.scale_bytes), KILN_OK, "%s", kiln_last_error());
    q.t.data = malloc(q.data_bytes);
    cr_assert_not_null(q.t.data);
    memset(q.t.data, 0xA5, q.data_bytes);
    if (q.scale_bytes) {
        q.t.scale = malloc(q.scale_bytes);
        cr_assert_not_null(q.t.scale);
        memset(q.t.scale, 0xA5, q.scale_bytes);
    }
    return q;
}

static void qbuf_free(qbuf *q)
{
    free(q->t.data);
    free(q->t.scale);
}

static uint8_t *data_u8(const qbuf *q) { return q->t.data; }
static uint8_t *scale_u8(const qbuf *q) { return q->t.scale; }

static float scale_f32(const qbuf *q, size_t i)
{
    float v;
    memcpy(&v, (const unsigned char *)q->t.scale + 4 * i, 4);
    return v;
}

static void set_scale_f32(qbuf *q, size_t i, float v) { memcpy((unsigned char *)q->t.scale + 4 * i, &v, 4); }

static float f16_at(const uint8_t *p) { return kiln_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

static void put_f16(uint8_t *p, uint16_t h)
{
    p[0] = (uint8_t)(h & 0xFF);
    p[1] = (uint8_t)(h >> 8);
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Bit-identical, or both NaN. */
static void assert_same(float got, float want, const char *what, int64_t i)
{
    if (isnan(want))
        cr_assert(isnan(got), "%s[%lld]: got %a, want NaN", what, (long long)i, got);
    else
        cr_assert_eq(bits_of(got), bits_of(want), "%s[%lld]: got %a, want %a", what, (long long)i, got, want);
}

static float *dequant(const qbuf *q)
{
    float *y = malloc((size_t)(q->t.n * q->t.k) * sizeof(float));
    cr_assert_not_null(y);
    cr_assert_eq(kiln_dequantize(&q->t, y), KILN_OK, "%s", kiln_last_error());
    return y;
}

static void quant(const float *x, qbuf *q)
{
    cr_assert_eq(kiln_quantize(x, &q->t), KILN_OK, "%s", kiln_last_error());
}

static float amax_of(const float *x, int64_t n)
{
    float a = 0.0f;
    for (int64_t i = 0; i < n; i++)
        a = fabsf(x[i]) > a ? fabsf(x[i]) : a;
    return a;
}

/* floor(log2(a)) for a > 0, from frexp rather than log2f. */
static int floor_log2(float a)
{
    int e;
    frexpf(a, &e);
    return e - 1;
}

/* Half the distance between neighbouring values around v >= 0, in units of
 * the scale: E4M3 has 3 mantissa bits (half an ulp is at most 2^-4 of the
 * value) and subnormal spacing 2^-9; E2M1 steps by 0.5 below 2, by 1 up to
 * 4 and by 2 up to 6. */
static double half_step_e4m3(double v) { return fmax(ldexp(v, -4), 0x1p-10); }

static double half_step_e2m1(double v) { return v < 2 ? 0.25 : v < 4 ? 0.5 : 1.0; }

/* ------------------------------------------------ round-trip error bounds */

typedef struct rt_case {
    const float *x, *y;
    const qbuf *q;
    double sigma;
} rt_case;

static void rt_f32(const rt_case *c)
{
    for (int64_t i = 0; i < c->q->t.n * c->q->t.k; i++)
        assert_same(c->y[i], c->x[i], "f32", i);
}

/* Half an ulp: 2^-11 relative (10 mantissa bits), 2^-25 absolute in the
 * subnormals. */
static void rt_f16(const rt_case *c)
{
    for (int64_t i = 0; i < c->q->t.n * c->q->t.k; i++)
        cr_assert(fabs((double)c->y[i] - c->x[i]) <= ldexp(fabs(c->x[i]), -11) + 0x1p-25, "f16[%lld]: %a -> %a",
                  (long long)i, c->x[i], c->y[i]);
}

/* Half an ulp: 2^-8 relative (7 mantissa bits). */
static void rt_bf16(const rt_case *c)
{
    for (int64_t i = 0; i < c->q->t.n * c->q->t.k; i++)
        cr_assert(fabs((double)c->y[i] - c->x[i]) <= ldexp(fabs(c->x[i]), -8), "bf16[%lld]: %a -> %a",
                  (long long)i, c->x[i], c->y[i]);
}

/* One FP8 scale window: the stored scale is amax/448, so |x/s| <= 448 never
 * saturates, and each value is off by at most half an E4M3 step (times s);
 * the f32 division and product add a few f32 ulps (2^-20 covers them). */
static void rt_fp8_window(const rt_case *c, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float s)
{
    int64_t ld = c->q->t.k;
    float amax = 0.0f;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t j = c0; j < c1; j++)
            amax = fmaxf(amax, fabsf(c->x[r * ld + j]));
    cr_assert_eq(bits_of(s), bits_of(amax / 448.0f), "scale of rows [%lld,%lld) cols [%lld,%lld): %a, amax %a",
                 (long long)r0, (long long)r1, (long long)c0, (long long)c1, s, amax);
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t j = c0; j < c1; j++) {
            double x = c->x[r * ld + j], y = c->y[r * ld + j];
            double bound = (half_step_e4m3(fabs(x) / s) * s) * (1 + 0x1p-20);
            cr_assert(fabs(y - x) <= bound, "fp8 [%lld,%lld]: %a -> %a (scale %a)", (long long)r, (long long)j, x, y, s);
        }
    }
}

static void rt_fp8_tensor(const rt_case *c) { rt_fp8_window(c, 0, c->q->t.n, 0, c->q->t.k, scale_f32(c->q, 0)); }

static void rt_fp8_channel(const rt_case *c)
{
    for (int64_t r = 0; r < c->q->t.n; r++)
        rt_fp8_window(c, r, r + 1, 0, c->q->t.k, scale_f32(c->q, (size_t)r));
}

static void rt_fp8_block(const rt_case *c)
{
    int64_t n = c->q->t.n, k = c->q->t.k, tk = (k + 127) / 128;
    for (int64_t r = 0; r < n; r += 128)
        for (int64_t j = 0; j < k; j += 128)
            rt_fp8_window(c, r, r + 128 < n ? r + 128 : n, j, j + 128 < k ? j + 128 : k,
                          scale_f32(c->q, (size_t)(r / 128 * tk + j / 128)));
}

/* One block with power-of-two scale X: elements beyond the element type's
 * largest value saturate to exactly ±max·X (X · element is exact), the rest
 * are off by at most half a step. */
static void rt_block_pow2(const float *x, const float *y, int bs, double X, double elem_max,
                          double (*half_step)(double), const char *what)
{
    for (int j = 0; j < bs; j++) {
        double a = fabs(x[j]);
        if (a > elem_max * X)
            cr_assert_eq((double)y[j], copysign(elem_max * X, x[j]), "%s: %a saturates to %a, got %a", what, x[j],
                         copysign(elem_max * X, x[j]), y[j]);
        else
            cr_assert(fabs(y[j] - x[j]) <= half_step(a / X) * X, "%s: %a -> %a (X = %a)", what, x[j], y[j], X);
    }
}

/* OCP MX: the stored E8M0 code must be floor(log2(amax)) - emax + 127. */
static void rt_mx(const rt_case *c, int emax, double elem_max, double (*half_step)(double), const char *what)
{
    size_t nb = (size_t)(c->q->t.n * c->q->t.k) / 32;
    for (size_t b = 0; b < nb; b++) {
        const float *x = c->x + b * 32;
        int code = floor_log2(amax_of(x, 32)) - emax + 127;
        cr_assert_eq(scale_u8(c->q)[b], code, "%s block %zu: scale code %d, want %d", what, b, scale_u8(c->q)[b],
                     code);
        rt_block_pow2(x, c->y + b * 32, 32, ldexp(1.0, code - 127), elem_max, half_step, what);
    }
}

/* E4M3 elements: amax / X lies in [256, 512), so the top of a block can
 * saturate at 448 (the OCP rule's known clipping). */
static void rt_mxfp8(const rt_case *c) { rt_mx(c, 8, 448.0, half_step_e4m3, "mxfp8"); }

/* E2M1 elements: amax / X lies in [4, 8), so values above 6 X clip to 6 X. */
static void rt_mxfp4(const rt_case *c) { rt_mx(c, 2, 6.0, half_step_e2m1, "mxfp4"); }

/* NVFP4: global g = amax / 2688, block scale ue4m3(amax_b / (6 g)); the
 * block scale's rounding (up to 2^-4 relative) lets amax_b / d reach
 * 6 (1 + 2^-4): those values saturate at ±6 d. Slack 2^-20 for the f32
 * division and products. */
static void rt_nvfp4(const rt_case *c)
{
    int64_t count = c->q->t.n * c->q->t.k;
    float g = amax_of(c->x, count) / (6.0f * 448.0f);
    cr_assert_eq(bits_of(c->q->t.global_scale), bits_of(g), "global scale %a, want %a", c->q->t.global_scale, g);
    for (int64_t b = 0; b < count / 16; b++) {
        const float *x = c->x + b * 16, *y = c->y + b * 16;
        float amax = amax_of(x, 16);
        uint8_t code = amax > 0 ? kiln_f32_to_e4m3(amax / (6.0f * g)) : 0x38;
        cr_assert_eq(scale_u8(c->q)[b], code, "nvfp4 block %lld: scale 0x%02x, want 0x%02x", (long long)b,
                     scale_u8(c->q)[b], code);
        float d = kiln_e4m3_to_f32(code) * g;
        cr_assert(d > 0, "block scale of random data is positive");
        for (int j = 0; j < 16; j++) {
            float a = fabsf(x[j]);
            if (a / d > 6.0f)
                cr_assert_eq(y[j], copysignf(6.0f * d, x[j]), "nvfp4: %a saturates, got %a", x[j], y[j]);
            else
                cr_assert(fabs(y[j] - x[j]) <= half_step_e2m1(a / d) * d * (1 + 0x1p-20), "nvfp4: %a -> %a (d = %a)",
                          x[j], y[j], d);
        }
    }
}

/* Q8_0: d = amax/127, stored as f16. Rounding to an integer costs half a
 * step of the exact d; the f16 error of d costs |q| <= 127 times itself. */
static void rt_q8_0(const rt_case *c)
{
    int64_t count = c->q->t.n * c->q->t.k;
    for (int64_t b = 0; b < count / 32; b++) {
        const float *x = c->x + b * 32, *y = c->y + b * 32;
        const uint8_t *blk = data_u8(c->q) + b * 34;
        float dt = amax_of(x, 32) / 127;
        double d16 = f16_at(blk);
        cr_assert_eq(d16, kiln_f16_to_f32(kiln_f32_to_f16(dt)), "q8_0 block %lld: d = f16(amax/127)", (long long)b);
        double bound = 0.5 * dt * (1 + 0x1p-20) + 127 * fabs(d16 - dt) + 0x1p-30 * dt;
        for (int j = 0; j < 32; j++)
            cr_assert(fabs((double)y[j] - x[j]) <= bound, "q8_0 block %lld: %a -> %a", (long long)b, x[j], y[j]);
    }
}

/* Q4_0: d = max / -8 with max the signed extreme, so x / d + 8 lies in
 * [0, 16]: the extreme itself is exact (level 0), the opposite side can
 * reach 16 and clips to 15 (error up to one step), everything else is off
 * by at most half a step; plus the f16 error of d times |q - 8| <= 8. */
static void rt_q4_0(const rt_case *c)
{
    int64_t count = c->q->t.n * c->q->t.k;
    for (int64_t b = 0; b < count / 32; b++) {
        const float *x = c->x + b * 32, *y = c->y + b * 32;
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        float dt = max / -8;
        double d16 = f16_at(data_u8(c->q) + b * 18);
        cr_assert_eq(d16, kiln_f16_to_f32(kiln_f32_to_f16(dt)), "q4_0 block %lld: d = f16(max/-8)", (long long)b);
        for (int j = 0; j < 32; j++) {
            double v = (double)x[j] / dt + 8;
            double bound = fabs(dt) * (v > 15.5 ? v - 15 : 0.5) * (1 + 0x1p-20) + 8 * fabs(d16 - dt);
            cr_assert(fabs((double)y[j] - x[j]) <= bound, "q4_0 block %lld: %a -> %a", (long long)b, x[j], y[j]);
        }
    }
}

/* K-quants store levels chosen by a fit, so the bound is the format's
 * guarantee after ggml's requantization step: each value is the grid point
 * of its sub-block nearest to x, up to f32 rounding of (x + m) / d. */
static void rt_nearest_on_grid(const float *x, const float *y, int n, double d, double m, int qlo, int qhi,
                               const char *what)
{
    for (int j = 0; j < n; j++) {
        double best = INFINITY;
        for (int q = qlo; q <= qhi; q++)
            best = fmin(best, fabs(x[j] - (d * q - m)));
        double slack = 0x1p-20 * (fabs(x[j]) + fabs(m) + fabs(d) * (qhi - qlo));
        cr_assert(fabs((double)y[j] - x[j]) <= best + slack, "%s: %a -> %a, nearest grid point is %a away", what,
                  x[j], y[j], best);
    }
}

static void q4_k_unpack(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Relative RMS error ceilings, with room above what the fits achieve on
 * Gaussian data: Q4_K spends 4 bits on a sub-block of 32 whose range is
 * about 4 sigma, a step of ~0.27 sigma and a uniform rounding RMS of
 * step / sqrt(12) ~ 0.077 sigma before the fit improves it; Q6_K has 64
 * levels over about ±2 sigma per 16 values, RMS ~ 0.018 sigma. */
static void rt_rms(const rt_case *c, double ceiling, const char *what)
{
    double se = 0, sx = 0;
    for (int64_t i = 0; i < c->q->t.n * c->q->t.k; i++) {
        se += ((double)c->y[i] - c->x[i]) * ((double)c->y[i] - c->x[i]);
        sx += (double)c->x[i] * c->x[i];
    }
    cr_assert(sqrt(se / sx) <= ceiling, "%s: relative RMS error %g above %g", what, sqrt(se / sx), ceiling);
}

static void rt_q4_k(const rt_case *c)
{
    int64_t count = c->q->t.n * c->q->t.k;
    for (int64_t b = 0; b < count / 256; b++) {
        const uint8_t *blk = data_u8(c->q) + b * 144;
        float d = f16_at(blk), dmin = f16_at(blk + 2);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            q4_k_unpack(blk + 4, j, &sc, &m);
            const float *x = c->x + b * 256 + 32 * j, *y = c->y + b * 256 + 32 * j;
            rt_nearest_on_grid(x, y, 32, (double)(d * sc), (double)(dmin * m), 0, 15, "q4_k");
        }
    }
    if (c->sigma >= 1)
        rt_rms(c, 0.10, "q4_k");
}

static void rt_q6_k(const rt_case *c)
{
    int64_t count = c->q->t.n * c->q->t.k;
    for (int64_t b = 0; b < count / 256; b++) {
        const uint8_t *blk = data_u8(c->q) + b * 210;
        float d = f16_at(blk + 208);
        for (int j = 0; j < 16; j++) {
            const float *x = c->x + b * 256 + 16 * j, *y = c->y + b * 256 + 16 * j;
            rt_nearest_on_grid(x, y, 16, (double)(d * (int8_t)blk[192 + j]), 0.0, -32, 31, "q6_k");
        }
    }
    if (c->sigma >= 1)
        rt_rms(c, 0.03, "q6_k");
}

/* GGML MXFP4 is OCP MXFP4 with ggml's scale rule and nearest-value search
 * (ties toward the smaller magnitude): the same bound holds. */
static void rt_ggml_mxfp4(const rt_case *c)
{
    size_t nb = (size_t)(c->q->t.n * c->q->t.k) / 32;
    for (size_t b = 0; b < nb; b++) {
        const float *x = c->x + b * 32;
        const uint8_t *blk = data_u8(c->q) + b * 17;
        int code = floor_log2(amax_of(x, 32)) - 2 + 127;
        cr_assert_eq(blk[0], code, "ggml_mxfp4 block %zu: e = %d, want %d", b, blk[0], code);
        rt_block_pow2(x, c->y + b * 32, 32, ldexp(1.0, code - 127), 6.0, half_step_e2m1, "ggml_mxfp4");
    }
}

/* Q5_0: Q4_0's scheme on 32 levels, d = max / -16, x / d + 16 in [0, 32]:
 * the opposite side can reach 32 and clips to 31. */
static void rt_q5_0(const rt_case *c)
{
    int64_t count = c->q->t.n * c->q->t.k;
    for (int64_t b = 0; b < count / 32; b++) {
        const float *x = c->x + b * 32, *y = c->y + b * 32;
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        float dt = max / -16;
        double d16 = f16_at(data_u8(c->q) + b * 22);
        cr_assert_eq(d16, kiln_f16_to_f32(kiln_f32_to_f16(dt)), "q5_0 block %lld: d = f16(max/-16)", (long long)b);
        for (int j = 0; j < 32; j++) {
            double v = (double)x[j] / dt + 16;
            double bound = fabs(dt) * (v > 31.5 ? v - 31 : 0.5) * (1 + 0x1p-20) + 16 * fabs(d16 - dt);
            cr_assert(fabs((double)y[j] - x[j]) <= bound, "q5_0 block %lld: %a -> %a", (long long)b, x[j], y[j]);
        }
    }
}

/* Q4_1 and Q5_1: d = (max - min) / top, m = min, both f16; q = round((x -
 * min) / d) costs half a step of the exact d, the f16 errors |q| <= top
 * times d's and once m's. */
static void rt_affine(const rt_case *c, int top, int block_bytes, const char *name)
{
    int64_t count = c->q->t.n * c->q->t.k;
    for (int64_t b = 0; b < count / 32; b++) {
        const float *x = c->x + b * 32, *y = c->y + b * 32;
        const uint8_t *blk = data_u8(c->q) + b * block_bytes;
        float min = x[0], max = x[0];
        for (int j = 1; j < 32; j++) {
            min = fminf(min, x[j]);
            max = fmaxf(max, x[j]);
        }
        float dt = (max - min) / (float)top;
        double d16 = f16_at(blk), m16 = f16_at(blk + 2);
        cr_assert_eq(d16, kiln_f16_to_f32(kiln_f32_to_f16(dt)), "%s block %lld: d = f16((max-min)/%d)",
                     name, (long long)b, top);
        cr_assert_eq(m16, kiln_f16_to_f32(kiln_f32_to_f16(min)), "%s block %lld: m = f16(min)", name,
                     (long long)b);
        double bound = 0.5 * dt * (1 + 0x1p-20) + top * fabs(d16 - dt) + fabs(m16 - min) + 0x1p-20 * fabs(min);
        for (int j = 0; j < 32; j++)
            cr_assert(fabs((double)y[j] - x[j]) <= bound, "%s block %lld: %a -> %a", name, (long long)b, x[j],
                      y[j]);
    }
}

static void rt_q5_1(const rt_case *c) { rt_affine(c, 31, 24, "q5_1"); }
static void rt_q4_1(const rt_case *c) { rt_affine(c, 15, 20, "q4_1"); }

/* Q2_K: sub-blocks of 16, 4-bit scale and min codes under f16 d, dmin;
 * 4 levels over a sub-block's range leave a relative RMS near 0.3 on
 * Gaussian data. */
static void rt_q2_k(const rt_case *c)
{
    int64_t count = c->q->t.n * c->q->t.k;
    for (int64_t b = 0; b < count / 256; b++) {
        const uint8_t *blk = data_u8(c->q) + b * 84;
        float d = f16_at(blk + 80), dmin = f16_at(blk + 82);
        for (int j = 0; j < 16; j++) {
            const float *x = c->x + b * 256 + 16 * j, *y = c->y + b * 256 + 16 * j;
            rt_nearest_on_grid(x, y, 16, (double)(d * (blk[j] & 15)), (double)(dmin * (blk[j] >> 4)), 0, 3, "q2_k");
        }
    }
    /* Four levels a sub-block of 16: about 0.296 of the RMS over many
     * blocks, but one block of 256 values spans 0.24 to 0.38 over 4000
     * seeds (six blocks 0.27 to 0.32), so the ceiling leaves room for a
     * few blocks' spread: 0.42 for one block, 0.355 for six, 0.315 for
     * 520. */
    if (c->sigma >= 1)
        rt_rms(c, 0.31 + 0.11 / sqrt((double)(c->q->t.n * c->q->t.k) / 256.0), "q2_k");
}

/* Q3_K: sub-blocks of 16, signed 6-bit scales (stored + 32) under f16 d,
 * levels -4..3. */
static void rt_q3_k(const rt_case *c)
{
    int64_t count = c->q->t.n * c->q->t.k;
    for (int64_t b = 0; b < count / 256; b++) {
        const uint8_t *blk = data_u8(c->q) + b * 110;
        float d = f16_at(blk + 108);
        for (int j = 0; j < 16; j++) {
            const uint8_t *s = blk + 96;
            int sc = (j < 8 ? s[j] & 15 : s[j - 8] >> 4) | ((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4;
            const float *x = c->x + b * 256 + 16 * j, *y = c->y + b * 256 + 16 * j;
            rt_nearest_on_grid(x, y, 16, (double)(d * (sc - 32)), 0.0, -4, 3, "q3_k");
        }
    }
    if (c->sigma >= 1)
        rt_rms(c, 0.20, "q3_k");
}

/* Q5_K: Q4_K's scales and mins on 32 levels. */
static void rt_q5_k(const rt_case *c)
{
    int64_t count = c->q->t.n * c->q->t.k;
    for (int64_t b = 0; b < count / 256; b++) {
        const uint8_t *blk = data_u8(c->q) + b * 176;
        float d = f16_at(blk), dmin = f16_at(blk + 2);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            q4_k_unpack(blk + 4, j, &sc, &m);
            const float *x = c->x + b * 256 + 32 * j, *y = c->y + b * 256 + 32 * j;
            rt_nearest_on_grid(x, y, 32, (double)(d * sc), (double)(dmin * m), 0, 31, "q5_k");
        }
    }
    if (c->sigma >= 1)
        rt_rms(c, 0.05, "q5_k");
}

static const int iq4_levels[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };

/* IQ4_XS: each value is the codebook point nearest to x under the block's
 * scale d · l before d's f16 rounding (l: the 6-bit block scale, rounded
 * against the unrounded d too); against the stored scale ds =
 * f16(d) · l that leaves the nearest point plus twice 127 times |l| times
 * the f16 rounding of d (2^-11 relative, 2^-25 absolute when subnormal,
 * which tiny blocks reach). */
static void rt_iq4_block(const float *x, const float *y, double d16, int l, const char *what)
{
    const double ds = d16 * l;
    double slack = 2 * 127 * abs(l) * (ldexp(fabs(d16), -11) + 0x1p-25) * (1 + 0x1p-20);
    for (int j = 0; j < 32; j++) {
        double best = INFINITY;
        for (int q = 0; q < 16; q++)
            best = fmin(best, fabs(x[j] - ds * iq4_levels[q]));
        cr_assert(fabs((double)y[j] - x[j]) <= best + slack + 0x1p-20 * fabs(x[j]),
                  "%s: %a -> %a, nearest codebook point is %a away", what, x[j], y[j], best);
    }
}

/* IQ4_NL: ggml's reference fit takes the levels of x / d0, d0 = max / -127
 * (max: the signed extreme), then stores the least-squares scale d of
 * those levels without choosing them again: each value is the codebook
 * point nearest to x under d0, moved by 127 |f16(d) - d0| at most. */
static void rt_iq4_nl(const rt_case *c)
{
    int64_t count = c->q->t.n * c->q->t.k;
    for (int64_t b = 0; b < count / 32; b++) {
        const float *x = c->x + b * 32, *y = c->y + b * 32;
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        const double d0 = max / -127.0f, d16 = f16_at(data_u8(c->q) + b * 18);
        for (int j = 0; j < 32; j++) {
            double best = INFINITY;
            for (int q = 0; q < 16; q++)
                best = fmin(best, fabs(x[j] - d0 * iq4_levels[q]));
            double bound = best + 127 * fabs(d16 - d0) + 0x1p-20 * fabs(x[j]);
            cr_assert(fabs((double)y[j] - x[j]) <= bound, "iq4_nl block %lld: %a -> %a (d0 %a, d %a)", (long long)b,
                      x[j], y[j], d0, d16);
        }
    }
    if (c->sigma >= 1)
        rt_rms(c, 0.10, "iq4_nl");
}

static void rt_iq4_xs(const rt_case *c)
{
    int64_t count = c->q->t.n * c->q->t.k;
    for (int64_t b = 0; b < count / 256; b++) {
        const uint8_t *blk = data_u8(c->q) + b * 136;
        float d = f16_at(blk);
        unsigned h = (unsigned)(blk[2] | blk[3] << 8);
        for (int ib = 0; ib < 8; ib++) {
            int ls = ((blk[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (int)((h >> (2 * ib)) & 3) << 4;
            rt_iq4_block(c->x + b * 256 + 32 * ib, c->y + b * 256 + 32 * ib, d, ls - 32, "iq4_xs");
        }
    }
    if (c->sigma >= 1)
        rt_rms(c, 0.10, "iq4_xs");
}

/* The integer groups at group 0 (one per row): each value is the nearest
 * point of its row's grid s · (q − zp); quant_int.c's own suite tests
 * groups along K. */
static void rt_int_group(const rt_case *c)
{
    const kiln_format_info *fi = kiln_format_get(c->q->t.format);
    int bits = fi->block == 8 ? 4 : 8, half = 1 << (bits - 1);
    int64_t n = c->q->t.n, k = c->q->t.k;
    for (int64_t r = 0; r < n; r++) {
        float s = scale_f32(c->q, (size_t)r);
        int zp = fi->zero_point ? (int8_t)scale_u8(c->q)[(size_t)n * 4 + (size_t)r] : 0;
        rt_nearest_on_grid(c->x + r * k, c->y + r * k, (int)k, (double)s, (double)s * zp, -half,
                           half - 1, fi->name);
    }
}

static void (*const rt_check[])(const rt_case *) = {
    [KILN_FMT_F32] = rt_f32,
    [KILN_FMT_F16] = rt_f16,
    [KILN_FMT_BF16] = rt_bf16,
    [KILN_FMT_FP8_TENSOR] = rt_fp8_tensor,
    [KILN_FMT_FP8_CHANNEL] = rt_fp8_channel,
    [KILN_FMT_FP8_BLOCK] = rt_fp8_block,
    [KILN_FMT_MXFP8] = rt_mxfp8,
    [KILN_FMT_NVFP4] = rt_nvfp4,
    [KILN_FMT_MXFP4] = rt_mxfp4,
    [KILN_FMT_Q8_0] = rt_q8_0,
    [KILN_FMT_Q4_0] = rt_q4_0,
    [KILN_FMT_Q4_K] = rt_q4_k,
    [KILN_FMT_Q6_K] = rt_q6_k,
    [KILN_FMT_GGML_MXFP4] = rt_ggml_mxfp4,
    [KILN_FMT_Q5_0] = rt_q5_0,
    [KILN_FMT_Q5_1] = rt_q5_1,
    [KILN_FMT_Q2_K] = rt_q2_k,
    [KILN_FMT_Q3_K] = rt_q3_k,
    [KILN_FMT_Q5_K] = rt_q5_k,
    [KILN_FMT_IQ4_NL] = rt_iq4_nl,
    [KILN_FMT_IQ4_XS] = rt_iq4_xs,
    [KILN_FMT_Q4_1] = rt_q4_1,
    [KILN_FMT_INT4_GROUP] = rt_int_group,
    [KILN_FMT_INT4_GROUP_ZP] = rt_int_group,
    [KILN_FMT_INT8_GROUP] = rt_int_group,
    [KILN_FMT_INT8_GROUP_ZP] = rt_int_group,
};
_Static_assert(sizeof rt_check / sizeof rt_check[0] == KILN_FMT_COUNT, "one round-trip check per format");

static void round_trip(kiln_format f)
{
    const int64_t shapes[][2] = { { 1, 256 }, { 3, 512 }, { 130, 1024 }, { 129, 200 }, { 2, 48 }, { 1, 1 } };
    const double sigmas[] = { 1.0, 1e-3, 300.0 };
    const kiln_format_info *fi = kiln_format_get(f);
    kt_rng rng = kt_rng_new(100 + (uint64_t)f);
    int tested = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t n = shapes[s][0], k = shapes[s][1];
        if (k % fi->k_multiple != 0)
            continue;
        for (size_t g = 0; g < sizeof sigmas / sizeof sigmas[0]; g++) {
            float *x = malloc((size_t)(n * k) * sizeof(float));
            cr_assert_not_null(x);
            kt_fill_normal(&rng, x, (size_t)(n * k), (float)sigmas[g]);
            qbuf q = qbuf_new(f, n, k);
            quant(x, &q);
            float *y = dequant(&q);
            rt_check[f](&(rt_case){ .x = x, .y = y, .q = &q, .sigma = sigmas[g] });
            free(y);
            free(x);
            qbuf_free(&q);
            tested++;
        }
    }
    cr_assert_geq(tested, 9, "%s: at least three shapes", fi->name);
}

Test(round_trip, f32) { round_trip(KILN_FMT_F32); }
Test(round_trip, f16) { round_trip(KILN_FMT_F16); }
Test(round_trip, bf16) { round_trip(KILN_FMT_BF16); }
Test(round_trip, fp8_tensor) { round_trip(KILN_FMT_FP8_TENSOR); }
Test(round_trip, fp8_channel) { round_trip(KILN_FMT_FP8_CHANNEL); }
Test(round_trip, fp8_block) { round_trip(KILN_FMT_FP8_BLOCK); }
Test(round_trip, mxfp8) { round_trip(KILN_FMT_MXFP8); }
Test(round_trip, nvfp4) { round_trip(KILN_FMT_NVFP4); }
Test(round_trip, mxfp4) { round_trip(KILN_FMT_MXFP4); }
Test(round_trip, q8_0) { round_trip(KILN_FMT_Q8_0); }
Test(round_trip, q4_0) { round_trip(KILN_FMT_Q4_0); }
Test(round_trip, q4_k) { round_trip(KILN_FMT_Q4_K); }
Test(round_trip, q6_k) { round_trip(KILN_FMT_Q6_K); }
Test(round_trip, ggml_mxfp4) { round_trip(KILN_FMT_GGML_MXFP4); }
Test(round_trip, q5_0) { round_trip(KILN_FMT_Q5_0); }
Test(round_trip, q5_1) { round_trip(KILN_FMT_Q5_1); }
Test(round_trip, q2_k) { round_trip(KILN_FMT_Q2_K); }
Test(round_trip, q3_k) { round_trip(KILN_FMT_Q3_K); }
Test(round_trip, q5_k) { round_trip(KILN_FMT_Q5_K); }
Test(round_trip, iq4_nl) { round_trip(KILN_FMT_IQ4_NL); }
Test(round_trip, iq4_xs) { round_trip(KILN_FMT_IQ4_XS); }
Test(round_trip, q4_1) { round_trip(KILN_FMT_Q4_1); }
Test(round_trip, int4_group) { round_trip(KILN_FMT_INT4_GROUP); }
Test(round_trip, int4_group_zp) { round_trip(KILN_FMT_INT4_GROUP_ZP); }
Test(round_trip, int8_group) { round_trip(KILN_FMT_INT8_GROUP); }
Test(round_trip, int8_group_zp) { round_trip(KILN_FMT_INT8_GROUP_ZP); }

/* --------------------------------------------------- hand-built decoding */

static void expect_values(const qbuf *q, const float *want, int64_t count, const char *what)
{
    float *y = dequant(q);
    for (int64_t i = 0; i < count; i++)
        assert_same(y[i], want[i], what, i);
    free(y);
}

Test(decode, f32_is_copied_bit_for_bit)
{
    qbuf q = qbuf_new(KILN_FMT_F32, 1, 3);
    const uint32_t raw[3] = { 0x3FC00000u, 0x80000000u, 0x7FC00001u };
    memcpy(q.t.data, raw, sizeof raw);
    float *y = dequant(&q);
    cr_assert_eq(memcmp(y, raw, sizeof raw), 0, "1.5, -0 and a NaN payload come back unchanged");
    free(y);
    qbuf_free(&q);
}

Test(decode, f16_and_bf16)
{
    qbuf h = qbuf_new(KILN_FMT_F16, 1, 5);
    const uint8_t hb[] = { 0x00, 0x3C, 0x01, 0x00, 0x00, 0x80, 0xFF, 0x7B, 0x00, 0xFC };
    memcpy(h.t.data, hb, sizeof hb);
    expect_values(&h, (const float[]){ 1.0f, 0x1p-24f, -0.0f, 65504.0f, -INFINITY }, 5, "f16");
    qbuf b = qbuf_new(KILN_FMT_BF16, 1, 4);
    const uint8_t bb[] = { 0x80, 0x3F, 0xC0, 0xBF, 0x01, 0x00, 0x80, 0x7F };
    memcpy(b.t.data, bb, sizeof bb);
    expect_values(&b, (const float[]){ 1.0f, -1.5f, 0x1p-133f, INFINITY }, 4, "bf16");
    qbuf_free(&h);
    qbuf_free(&b);
}

/* E4M3 codes: 0x38 = 1.0, 0x01 = 2^-9 (smallest subnormal), 0x07 = 7·2^-9
 * (largest subnormal), 0x08 = 2^-6 (smallest normal), 0x7E = 448,
 * 0x80 = -0, 0xFE = -448, 0x7F = NaN. */
Test(decode, fp8_tensor_with_subnormals_saturated_codes_and_nan)
{
    qbuf q = qbuf_new(KILN_FMT_FP8_TENSOR, 2, 4);
    const uint8_t codes[8] = { 0x38, 0x01, 0x80, 0x7E, 0xFE, 0x07, 0x08, 0x7F };
    memcpy(q.t.data, codes, 8);
    set_scale_f32(&q, 0, 0.5f);
    expect_values(&q,
                  (const float[]){ 0.5f, 0x1p-10f, -0.0f, 224.0f, -224.0f, 7 * 0x1p-10f, 0x1p-7f, NAN }, 8,
                  "fp8");
    qbuf_free(&q);
}

Test(decode, fp8_channel_uses_each_rows_scale)
{
    qbuf q = qbuf_new(KILN_FMT_FP8_CHANNEL, 2, 2);
    /* 0x40 = 2, 0x44 = 3, 0xC0 = -2, 0x30 = 0.5 */
    memcpy(q.t.data, (const uint8_t[]){ 0x40, 0x44, 0xC0, 0x30 }, 4);
    set_scale_f32(&q, 0, 2.0f);
    set_scale_f32(&q, 1, 0.25f);
    expect_values(&q, (const float[]){ 4.0f, 6.0f, -0.5f, 0.125f }, 4, "fp8_channel");
    qbuf_free(&q);
}

Test(decode, fp8_block_uses_the_scale_of_each_tile_including_partial_ones)
{
    qbuf q = qbuf_new(KILN_FMT_FP8_BLOCK, 130, 129);
    cr_assert_eq(q.scale_bytes, 2 * 2 * 4);
    memset(q.t.data, 0x38, q.data_bytes); /* every value 1.0 */
    for (int i = 0; i < 4; i++)
        set_scale_f32(&q, (size_t)i, (float)(1 << i));
    float *y = dequant(&q);
    const struct { int r, c; float v; } at[] = {
        { 0, 0, 1 }, { 127, 127, 1 }, { 0, 128, 2 }, { 127, 128, 2 }, { 128, 0, 4 }, { 129, 127, 4 }, { 129, 128, 8 },
    };
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++)
        cr_assert_eq(y[at[i].r * 129 + at[i].c], at[i].v, "[%d,%d]", at[i].r, at[i].c);
    free(y);
    qbuf_free(&q);
}

Test(decode, mxfp8_with_e8m0_scales_including_nan_and_2_pow_minus_127)
{
    qbuf q = qbuf_new(KILN_FMT_MXFP8, 1, 96);
    uint8_t *d = data_u8(&q);
    memset(d, 0x00, 96);
    memcpy(d, (const uint8_t[]){ 0x38, 0x01, 0x80, 0x7E, 0xB9 }, 5); /* 0xB9 = -1.125 */
    d[32] = 0x38;
    memcpy(d + 64, (const uint8_t[]){ 0x38, 0x01 }, 2);
    memcpy(q.t.scale, (const uint8_t[]){ 127, 0xFF, 0 }, 3);
    float want[96] = { 1.0f, 0x1p-9f, -0.0f, 448.0f, -1.125f };
    for (int j = 32; j < 64; j++)
        want[j] = NAN; /* scale 0xFF: every value of the block is NaN */
    want[64] = 0x1p-127f;
    want[65] = 0x1p-136f;
    expect_values(&q, want, 96, "mxfp8");
    qbuf_free(&q);
}

/* E2M1 nibbles: 1 = 0.5, 2 = 1, 7 = 6, 8 = -0, 9 = -0.5, 0xF = -6. */
Test(decode, mxfp4_even_element_in_the_low_nibble)
{
    qbuf q = qbuf_new(KILN_FMT_MXFP4, 1, 64);
    uint8_t *d = data_u8(&q);
    memset(d, 0, 32);
    memcpy(d, (const uint8_t[]){ 0x71, 0x9F, 0x08 }, 3);
    d[16] = 0x22;
    memcpy(q.t.scale, (const uint8_t[]){ 125, 0xFF }, 2);
    float want[64] = { 0.125f, 1.5f, -1.5f, -0.125f, -0.0f, 0.0f };
    for (int j = 32; j < 64; j++)
        want[j] = NAN;
    expect_values(&q, want, 64, "mxfp4");
    qbuf_free(&q);
}

Test(decode, nvfp4_scale_times_global_with_nan_and_subnormal_scales)
{
    qbuf q = qbuf_new(KILN_FMT_NVFP4, 1, 48);
    uint8_t *d = data_u8(&q);
    memset(d, 0, 24);
    memcpy(d, (const uint8_t[]){ 0x21, 0xF7, 0x08 }, 3);
    d[8] = 0x11;
    d[16] = 0x07;
    memcpy(q.t.scale, (const uint8_t[]){ 0x38, 0x7F, 0x01 }, 3);
    q.t.global_scale = 2.0f;
    float want[48] = { 1.0f, 2.0f, 12.0f, -12.0f, -0.0f, 0.0f };
    for (int j = 16; j < 32; j++)
        want[j] = NAN; /* scale 0x7F is E4M3's NaN */
    want[32] = 6 * 0x1p-9f * 2; /* subnormal scale 2^-9 */
    expect_values(&q, want, 48, "nvfp4");
    qbuf_free(&q);
}

Test(decode, q8_0_including_negative_zero_and_subnormal_scales)
{
    qbuf q = qbuf_new(KILN_FMT_Q8_0, 1, 96);
    uint8_t *d = data_u8(&q);
    memset(d, 0, 3 * 34);
    put_f16(d, 0x3800); /* 0.5 */
    memcpy(d + 2, (const uint8_t[]){ 0x80, 0x7F, 0x01, 0x00 }, 4);
    put_f16(d + 34, 0x8000); /* -0 */
    memcpy(d + 36, (const uint8_t[]){ 0x05, 0xFB }, 2);
    put_f16(d + 68, 0x0001); /* 2^-24 */
    d[70] = 3;
    float want[96] = { -64.0f, 63.5f, 0.5f, 0.0f };
    for (int j = 4; j < 32; j++)
        want[j] = 0.0f;
    for (int j = 32; j < 64; j++)
        want[j] = -0.0f; /* 0 * -0 */
    want[32] = -0.0f;
    want[33] = 0.0f; /* -5 * -0 */
    want[64] = 3 * 0x1p-24f;
    expect_values(&q, want, 96, "q8_0");
    qbuf_free(&q);
}

Test(decode, q4_0_split_halves)
{
    qbuf q = qbuf_new(KILN_FMT_Q4_0, 1, 32);
    uint8_t *d = data_u8(&q);
    put_f16(d, 0x4000); /* 2 */
    memset(d + 2, 0x88, 16); /* q = 8: zero */
    d[2] = 0x0F;
    d[2 + 15] = 0x39;
    float want[32];
    for (int j = 0; j < 32; j++)
        want[j] = 0.0f;
    want[0] = 14.0f;   /* (15 - 8) * 2 */
    want[16] = -16.0f; /* (0 - 8) * 2 */
    want[15] = 2.0f;   /* (9 - 8) * 2 */
    want[31] = -10.0f; /* (3 - 8) * 2 */
    expect_values(&q, want, 32, "q4_0");
    qbuf_free(&q);
}

/* d = 1, dmin = 0.5. Sub-block 0: scale 1, min 2; sub-block 1: scale 63,
 * min 0; sub-block 4: scale 37 = 0b10_0101, min 58 = 0b11_1010, split as
 * low nibbles in byte 8 (0xA5) and high bits in the top of bytes 0 and 4. */
Test(decode, q4_k_six_bit_scales_and_mins)
{
    qbuf q = qbuf_new(KILN_FMT_Q4_K, 1, 256);
    uint8_t *d = data_u8(&q);
    memset(d, 0, 144);
    put_f16(d, 0x3C00);
    put_f16(d + 2, 0x3800);
    uint8_t *s = d + 4;
    s[0] = 1 | (2 << 6);
    s[4] = 2 | (3 << 6);
    s[1] = 63;
    s[8] = 0xA5;
    uint8_t *qs = d + 16;
    qs[0] = 0x3F;  /* value 0: 15 (sub-block 0); value 32: 3 (sub-block 1) */
    qs[64] = 0x02; /* value 128: 2 (sub-block 4); value 160: 0 (sub-block 5) */
    float *y = dequant(&q);
    cr_assert_eq(y[0], 14.0f, "1 * 1 * 15 - 0.5 * 2");
    cr_assert_eq(y[1], -1.0f, "1 * 1 * 0 - 0.5 * 2");
    cr_assert_eq(y[32], 189.0f, "63 * 3 - 0");
    cr_assert_eq(y[33], 0.0f);
    cr_assert_eq(y[64], 0.0f, "sub-block 2: scale 0, min 0");
    cr_assert_eq(y[128], 45.0f, "37 * 2 - 0.5 * 58");
    cr_assert_eq(y[129], -29.0f);
    cr_assert_eq(y[160], 0.0f, "sub-block 5: scale 0, min 0");
    free(y);
    qbuf_free(&q);
}

/* d = 0.5; scales[0] = 2, [1] = 0, [2] = -3, [4] = 127, [6] = -128, [8] = 1.
 * qh[0] = 0b11_10_01_00 gives values 0, 32, 64, 96 the top bits 0, 1, 2, 3. */
Test(decode, q6_k_six_bit_values_and_signed_scales)
{
    qbuf q = qbuf_new(KILN_FMT_Q6_K, 1, 256);
    uint8_t *d = data_u8(&q);
    memset(d, 0, 210);
    uint8_t *ql = d, *qh = d + 128;
    int8_t *sc = (int8_t *)(d + 192);
    put_f16(d + 208, 0x3800);
    sc[0] = 2;
    sc[2] = -3;
    sc[4] = 127;
    sc[6] = -128;
    sc[8] = 1;
    ql[0] = 0x21;  /* value 0: low 1; value 64: low 2 */
    ql[32] = 0x0F; /* value 32: low 15; value 96: low 0 */
    qh[0] = 0xE4;
    float *y = dequant(&q);
    cr_assert_eq(y[0], -31.0f, "0.5 * 2 * (1 - 32)");
    cr_assert_eq(y[1], -32.0f, "0.5 * 2 * (0 - 32)");
    cr_assert_eq(y[32], 1.5f, "0.5 * -3 * ((15 | 16) - 32)");
    cr_assert_eq(y[64], 127.0f, "0.5 * 127 * ((2 | 32) - 32)");
    cr_assert_eq(y[96], -1024.0f, "0.5 * -128 * (48 - 32)");
    cr_assert_eq(y[128], -16.0f, "second half, scale index 8: 0.5 * 1 * -32");
    cr_assert_eq(bits_of(y[16]), bits_of(-0.0f), "scale 0: (0.5 * 0) * -32 is -0");
    free(y);
    qbuf_free(&q);
}

/* ggml's table doubles E2M1 and halves the scale: code 8 is +0 (not -0), and
 * e = 0xFF is the scale 2^127, not NaN, so 2 * 2^127 overflows to inf. */
Test(decode, ggml_mxfp4_half_scale_and_e_ff)
{
    qbuf q = qbuf_new(KILN_FMT_GGML_MXFP4, 1, 96);
    uint8_t *d = data_u8(&q);
    memset(d, 0, 3 * 17);
    d[0] = 127;
    memcpy(d + 1, (const uint8_t[]){ 0x71, 0x9F, 0x08 }, 3);
    d[17] = 0xFF;
    d[18] = 0x21;
    d[34] = 0;
    d[35] = 0x07;
    float want[96] = { 0.5f, -6.0f, 0.0f };
    want[16] = 6.0f;
    want[17] = -0.5f;
    want[32] = 0x1p127f;
    want[48] = INFINITY;
    want[64] = 12 * 0x1p-128f;
    expect_values(&q, want, 96, "ggml_mxfp4");
    qbuf_free(&q);
}

/* Value i of a dequantized tensor, checked bit for bit. */
static void expect_at(const float *y, int i, float want, const char *what)
{
    assert_same(y[i], want, what, i);
}

/* Q5_0's fifth bits: bit j of the little-endian u32 qh is element j's. */
Test(decode, q5_0_fifth_bit_from_qh)
{
    qbuf q = qbuf_new(KILN_FMT_Q5_0, 1, 32);
    uint8_t *b = data_u8(&q);
    memset(b, 0, 22);
    put_f16(b, 0x3800); /* d = 0.5 */
    b[2] = 0x01;        /* element 0 */
    b[4] = 0x02;        /* element 17 */
    b[6] = 0x3F;        /* element 0: 0xF, element 16: 3 */
    float *y = dequant(&q);
    expect_at(y, 0, (31 - 16) * 0.5f, "q5_0");
    expect_at(y, 16, (3 - 16) * 0.5f, "q5_0");
    expect_at(y, 1, -8.0f, "q5_0");
    expect_at(y, 17, 0.0f, "q5_0");
    free(y);
    qbuf_free(&q);
}

/* Q4_1: y = d * q + m with the nibbles split as Q4_0's, element j < 16 in
 * the low nibble of qs[j] and element j + 16 in its high one. */
Test(decode, q4_1_scale_min_and_split_nibbles)
{
    qbuf q = qbuf_new(KILN_FMT_Q4_1, 1, 64);
    uint8_t *b = data_u8(&q);
    memset(b, 0, 40);
    put_f16(b, 0x3800);     /* d = 0.5 */
    put_f16(b + 2, 0xC000); /* m = -2 */
    b[4] = 0x3F;            /* element 0: 15, element 16: 3 */
    b[4 + 15] = 0xA1;       /* element 15: 1, element 31: 10 */
    put_f16(b + 20, 0x3C00); /* block 1: d = 1, m = 0 */
    b[24 + 2] = 0x70;        /* element 32 + 18: 7 */
    float *y = dequant(&q);
    expect_at(y, 0, 15 * 0.5f - 2, "q4_1");
    expect_at(y, 16, 3 * 0.5f - 2, "q4_1");
    expect_at(y, 15, 1 * 0.5f - 2, "q4_1");
    expect_at(y, 31, 10 * 0.5f - 2, "q4_1");
    expect_at(y, 1, -2.0f, "q4_1");
    expect_at(y, 50, 7.0f, "q4_1");
    expect_at(y, 34, 0.0f, "q4_1");
    free(y);
    qbuf_free(&q);
}

/* Q3_K: sub-block 0's scale 33 (low 4 bits 1 in scales[0], high 2 bits 2
 * in scales[8]), sub-block 9's 30 (0xE in the high nibble of scales[1], 1
 * at bits 4-5 of scales[9]), the others 0; a value's level loses 4 unless
 * its hmask bit (bit v / 32 of hmask[v % 32]) is set. */
Test(decode, q3_k_six_bit_scales_and_high_mask)
{
    qbuf q = qbuf_new(KILN_FMT_Q3_K, 1, 256);
    uint8_t *b = data_u8(&q);
    memset(b, 0, 110);
    put_f16(b + 108, 0x3C00); /* d = 1 */
    b[96 + 0] = 0x01;
    b[96 + 8] = 0x02;
    b[96 + 1] = 0xE0;
    b[96 + 9] = 0x10;
    b[32 + 0] = 0x03;  /* value 0: level 3 */
    b[0] = 0x01;       /* value 0: hmask bit 0 */
    b[32 + 48] = 0x01; /* value 144: level 1 (second half, byte 16) */
    b[16] = 0x10;      /* value 144: hmask[16] bit 4 */
    float *y = dequant(&q);
    expect_at(y, 0, 1.0f * 3, "q3_k");
    expect_at(y, 1, 1.0f * -4, "q3_k");
    expect_at(y, 16, -32.0f * -4, "q3_k");
    expect_at(y, 144, -2.0f * 1, "q3_k");
    expect_at(y, 145, -2.0f * -4, "q3_k");
    free(y);
    qbuf_free(&q);
}

/* IQ4_XS: block 3's scale 45 (0xD in the high nibble of scales_l[1], 2 at
 * bits 6-7 of scales_h), the others 0; nibbles index the codebook, split
 * halves within each block of 32. */
Test(decode, iq4_xs_six_bit_scales_and_codebook)
{
    qbuf q = qbuf_new(KILN_FMT_IQ4_XS, 1, 256);
    uint8_t *b = data_u8(&q);
    memset(b, 0, 136);
    put_f16(b, 0x3400); /* d = 0.25 */
    b[5] = 0xD0;
    b[2] = 0x80;
    b[8 + 48] = 0xF0; /* block 3, element 0: code 0; element 16: code 15 */
    b[8 + 49] = 0x08; /* block 3, element 1: code 8 */
    float *y = dequant(&q);
    expect_at(y, 0, 0.25f * -32 * -127, "iq4_xs");
    expect_at(y, 96, 0.25f * 13 * -127, "iq4_xs");
    expect_at(y, 112, 0.25f * 13 * 113, "iq4_xs");
    expect_at(y, 97, 0.25f * 13 * 1, "iq4_xs");
    free(y);
    qbuf_free(&q);
}

/* -------------------------------------------------- quantization edges */

/* Every format: an all-zero tensor gives finite zeros back, and the scales
 * are finite (no 0/0). */
Test(quantize, all_zero_tensors_give_zeros_and_finite_scales)
{
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        const kiln_format_info *fi = kiln_format_get((kiln_format)f);
        float x[2 * 256] = { 0 };
        qbuf q = qbuf_new((kiln_format)f, 2, 256);
        quant(x, &q);
        float *y = dequant(&q);
        for (int i = 0; i < 2 * 256; i++)
            cr_assert(y[i] == 0.0f, "%s[%d] = %a", fi->name, i, y[i]);
        /* compressed-tensors gives a zero range f32's epsilon as its scale. */
        if (fi->scale_type == KILN_SCALE_F32)
            for (size_t i = 0; i < q.scale_bytes / (4 + (size_t)fi->zero_point); i++)
                cr_assert_eq(scale_f32(&q, i), fi->grouped ? FLT_EPSILON : 0.0f, "%s scale %zu",
                             fi->name, i);
        if (fi->scale_type == KILN_SCALE_E8M0)
            for (size_t i = 0; i < q.scale_bytes; i++)
                cr_assert_eq(scale_u8(&q)[i], 0, "%s: a zero block gets code 0", fi->name);
        if (fi->scale_type == KILN_SCALE_UE4M3) {
            cr_assert_eq(q.t.global_scale, 0.0f, "%s global", fi->name);
            for (size_t i = 0; i < q.scale_bytes; i++)
                cr_assert_eq(scale_u8(&q)[i], 0x38, "%s: ModelOpt's 1.0 for a zero block", fi->name);
        }
        free(y);
        qbuf_free(&q);
    }
}

/* A zero block between non-zero ones: no NaN leaks into the format's
 * stored scale, and its neighbours are unaffected. */
Test(quantize, zero_block_inside_a_tensor)
{
    const kiln_format fmts[] = { KILN_FMT_MXFP8, KILN_FMT_MXFP4, KILN_FMT_NVFP4,  KILN_FMT_Q8_0,       KILN_FMT_Q4_0,
                                 KILN_FMT_Q4_K,  KILN_FMT_Q6_K,  KILN_FMT_GGML_MXFP4, KILN_FMT_FP8_BLOCK, KILN_FMT_Q5_0,
                                 KILN_FMT_Q5_1,  KILN_FMT_Q2_K,  KILN_FMT_Q3_K,  KILN_FMT_Q5_K,       KILN_FMT_IQ4_NL,
                                 KILN_FMT_IQ4_XS, KILN_FMT_Q4_1 };
    kt_rng rng = kt_rng_new(7);
    float x[3 * 256];
    kt_fill_normal(&rng, x, 3 * 256, 1.0f);
    memset(x + 256, 0, 256 * sizeof(float));
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        qbuf q = qbuf_new(fmts[i], 1, 3 * 256);
        quant(x, &q);
        float *y = dequant(&q);
        for (int j = 0; j < 3 * 256; j++)
            cr_assert(isfinite(y[j]), "%s[%d]", kiln_format_get(fmts[i])->name, j);
        for (int j = 256; j < 512; j++)
            cr_assert(y[j] == 0.0f, "%s[%d] = %a", kiln_format_get(fmts[i])->name, j, y[j]);
        free(y);
        qbuf_free(&q);
    }
}

/* OCP MX clips: amax / X reaches up to 2^(emax + 1), beyond the element
 * type's largest value. 511 has floor(log2) = 8, so X = 1 for MXFP8 and the
 * value saturates to 448; 7.9 gives X = 1 for MXFP4 and saturates to 6. */
Test(quantize, mx_blocks_saturate_at_the_element_maximum)
{
    float x[32] = { 511.0f, -500.0f, 1.0f };
    qbuf q = qbuf_new(KILN_FMT_MXFP8, 1, 32);
    quant(x, &q);
    cr_assert_eq(scale_u8(&q)[0], 127);
    cr_assert_eq(data_u8(&q)[0], 0x7E);
    cr_assert_eq(data_u8(&q)[1], 0xFE);
    cr_assert_eq(data_u8(&q)[2], 0x38);
    qbuf_free(&q);

    float z[32] = { 7.9f, -6.5f, 0.3f };
    qbuf p = qbuf_new(KILN_FMT_MXFP4, 1, 32);
    quant(z, &p);
    cr_assert_eq(scale_u8(&p)[0], 127);
    cr_assert_eq(data_u8(&p)[0], 0x7 | (0xF << 4), "6 and -6");
    cr_assert_eq(data_u8(&p)[1] & 0xF, 0x1, "0.3 rounds to 0.5");
    qbuf_free(&p);
}

/* Ties: OCP MXFP4 rounds to the even code, ggml's MXFP4 to the first table
 * entry, the smaller magnitude. With amax = 6, X = 1 and ggml's d = 1/2. */
Test(quantize, mxfp4_ties_ocp_to_even_ggml_to_smaller_magnitude)
{
    float x[32] = { 6.0f, 5.0f, 0.25f, -0.75f, 2.5f, 3.5f, -0.0f, 1.75f };
    qbuf o = qbuf_new(KILN_FMT_MXFP4, 1, 32);
    quant(x, &o);
    const uint8_t *od = data_u8(&o);
    cr_assert_eq(scale_u8(&o)[0], 127);
    cr_assert_eq(od[0], 0x7 | (0x6 << 4), "6 -> 6, 5 -> 4 (even)");
    cr_assert_eq(od[1], 0x0 | (0xA << 4), "0.25 -> 0, -0.75 -> -1 (even)");
    cr_assert_eq(od[2], 0x4 | (0x6 << 4), "2.5 -> 2, 3.5 -> 4");
    cr_assert_eq(od[3], 0x8 | (0x4 << 4), "-0 keeps its sign, 1.75 -> 2");

    qbuf g = qbuf_new(KILN_FMT_GGML_MXFP4, 1, 32);
    quant(x, &g);
    const uint8_t *gd = data_u8(&g);
    cr_assert_eq(gd[0], 127);
    /* split halves: element j in the low nibble of qs[j], j + 16 in the high */
    const uint8_t want[8] = { 7, 6, 0, 9, 4, 5, 0, 3 };
    for (int j = 0; j < 8; j++)
        cr_assert_eq(gd[1 + j] & 0xF, want[j], "element %d (%g): code %d, want %d", j, x[j], gd[1 + j] & 0xF, want[j]);
    qbuf_free(&o);
    qbuf_free(&g);
}

Test(quantize, negative_zero_keeps_its_sign_where_the_element_type_has_one)
{
    float x[32] = { -0.0f, 2.0f };
    const kiln_format fmts[] = { KILN_FMT_FP8_TENSOR, KILN_FMT_FP8_CHANNEL, KILN_FMT_FP8_BLOCK, KILN_FMT_MXFP8,
                                 KILN_FMT_MXFP4, KILN_FMT_NVFP4, KILN_FMT_F16, KILN_FMT_BF16, KILN_FMT_F32 };
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        qbuf q = qbuf_new(fmts[i], 1, 32);
        quant(x, &q);
        float *y = dequant(&q);
        cr_assert_eq(bits_of(y[0]), bits_of(-0.0f), "%s: got %a", kiln_format_get(fmts[i])->name, y[0]);
        cr_assert(fabsf(y[1] - 2.0f) <= 0x1p-20f, "%s: %a", kiln_format_get(fmts[i])->name, y[1]);
        free(y);
        qbuf_free(&q);
    }
}

/* Worked by hand: x_j = j - 16. Q8_0: d = 16/127, f16 0x3008; 1/d is
 * 7.9375 to f32 precision, far from any .5 for these x. Q4_0: the
 * extreme is -16, d = 2, q = trunc(x / 2 + 8.5), 15 clipped at the top. */
Test(quantize, q8_0_and_q4_0_worked_by_hand)
{
    float x[32];
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j - 16);
    qbuf a = qbuf_new(KILN_FMT_Q8_0, 1, 32);
    quant(x, &a);
    const uint8_t *ad = data_u8(&a);
    cr_assert(ad[0] == 0x08 && ad[1] == 0x30, "d = 0x%02x%02x", ad[1], ad[0]);
    cr_assert_eq((int8_t)ad[2 + 0], -127);
    cr_assert_eq((int8_t)ad[2 + 17], 8, "1 * 7.9375 = 7.94 -> 8");
    cr_assert_eq((int8_t)ad[2 + 18], 16, "2 * 7.9375 = 15.875 -> 16");
    cr_assert_eq((int8_t)ad[2 + 31], 119, "15 * 7.9375 = 119.06 -> 119");
    qbuf b = qbuf_new(KILN_FMT_Q4_0, 1, 32);
    quant(x, &b);
    const uint8_t *bd = data_u8(&b);
    cr_assert(bd[0] == 0x00 && bd[1] == 0x40, "d = 2");
    cr_assert_eq(bd[2 + 0] & 0xF, 0, "-16 -> 0");
    cr_assert_eq(bd[2 + 0] >> 4, 8, "0 -> 8");
    cr_assert_eq(bd[2 + 1] & 0xF, 1, "-15: -7.5 + 8.5 = 1");
    cr_assert_eq(bd[2 + 15] >> 4, 15, "15: 7.5 + 8.5 = 16, clipped to 15");
    qbuf_free(&a);
    qbuf_free(&b);
}

/* ModelOpt NVFP4 by hand: amax 6 gives g = 6 / 2688, the block scale
 * 6 / (6 g) = 448 (code 0x7E), so d = 448 g ≈ 1 and 6, 3, -1.5, 0.5 map to
 * codes 7, 5, 0xB, 1; an all-zero block gets scale 1.0 (0x38). */
Test(quantize, nvfp4_worked_by_hand)
{
    float x[32] = { 6.0f, 3.0f, -1.5f, 0.5f };
    qbuf q = qbuf_new(KILN_FMT_NVFP4, 1, 32);
    quant(x, &q);
    cr_assert_eq(bits_of(q.t.global_scale), bits_of(6.0f / 2688.0f));
    cr_assert_eq(scale_u8(&q)[0], 0x7E);
    cr_assert_eq(scale_u8(&q)[1], 0x38);
    cr_assert_eq(data_u8(&q)[0], 0x7 | (0x5 << 4));
    cr_assert_eq(data_u8(&q)[1], 0xB | (0x1 << 4));
    qbuf_free(&q);
}

/* A fixed input built from integer arithmetic and exact f32 operations only
 * (no libm), so it is the same on every platform: blocks of Gaussian-like
 * values, mostly positive values (Q4_K's min > 0 path), tiny values, and
 * half-zero blocks of large values. */
static uint64_t golden_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* The hashes are of the bytes ggml's quantize_row_*_ref (IQ4_XS:
 * quantize_iq4_xs without importance weights) writes for this input.
 * gguf-py has no K-quant or IQ4 quantizer, so these pin Q2_K, Q3_K, Q4_K,
 * Q5_K, Q6_K, IQ4_NL and IQ4_XS to ggml's fits; a change in any fitting
 * step changes them. */
Test(quantize, ggml_formats_match_ggml_reference_bytes_on_a_fixed_input)
{
    enum { N = 8 * 256 };
    static float x[N];
    uint64_t s = 2024;
    for (int i = 0; i < N; i++) {
        float u = 0;
        for (int r = 0; r < 4; r++)
            u += (float)(golden_next(&s) >> 40) * 0x1p-24f;
        float g = (u - 2.0f) * 1.7320508f;
        switch ((i / 256) % 4) {
        case 0: x[i] = g; break;
        case 1: x[i] = g + 2.5f; break;
        case 2: x[i] = g * 0x1p-12f; break;
        default: x[i] = (i % 256) < 128 ? 0.0f : g * 300.0f; break;
        }
    }
    const struct { kiln_format f; uint64_t hash; } golden[] = {
        { KILN_FMT_Q4_K, 0xf7f19fb9b5f2f26bull }, { KILN_FMT_Q6_K, 0x3eeb0958c4b498bbull },
        { KILN_FMT_Q8_0, 0xb6a607b23af22734ull }, { KILN_FMT_Q4_0, 0xd919bbfddadda08cull },
        { KILN_FMT_GGML_MXFP4, 0xbb84734e9a4fbeb6ull },
        { KILN_FMT_Q5_0, 0x9cc51e0f06c8129aull }, { KILN_FMT_Q5_1, 0x36855a378761677full },
        { KILN_FMT_Q2_K, 0xed44939e38cb6e89ull }, { KILN_FMT_Q3_K, 0x1435bfb0035ca348ull },
        { KILN_FMT_Q5_K, 0x37eda8ea841c42cfull }, { KILN_FMT_IQ4_NL, 0x8cf0674cd5e5c1eeull },
        { KILN_FMT_IQ4_XS, 0xb9cffc7f702bd8b1ull }, { KILN_FMT_Q4_1, 0xd006b64390a8bd38ull },
    };
    for (size_t i = 0; i < sizeof golden / sizeof golden[0]; i++) {
        qbuf q = qbuf_new(golden[i].f, 1, N);
        quant(x, &q);
        uint64_t h = fnv1a(q.t.data, q.data_bytes);
        cr_assert_eq(h, golden[i].hash, "%s: FNV-1a of the blocks is 0x%016llx, ggml's is 0x%016llx",
                     kiln_format_get(golden[i].f)->name, (unsigned long long)h, (unsigned long long)golden[i].hash);
        qbuf_free(&q);
    }
}

/* The first block's scale as dequantization applies it. */
static float block0_scale(const qbuf *q)
{
    switch (q->t.format) {
    case KILN_FMT_Q4_0: return f16_at(data_u8(q));
    case KILN_FMT_GGML_MXFP4: return ldexpf(1.0f, data_u8(q)[0] - 127);
    case KILN_FMT_MXFP4: return kiln_e8m0_to_f32(scale_u8(q)[0]);
    case KILN_FMT_NVFP4: return kiln_e4m3_to_f32(scale_u8(q)[0]) * q->t.global_scale;
    default: cr_assert_fail("format %d has no block scale here", (int)q->t.format);
    }
    return NAN;
}

/* NaN inputs are defined: skipped by the block maximum, stored as the
 * element type's NaN where it has one. The maximum, 4, comes before the
 * NaN, so a maximum that restarted after a NaN would show. Q8_0 keeps
 * ggml's maximum, which does restart: its own test follows. */
Test(quantize, nan_inputs_do_not_poison_their_block)
{
    float x[32];
    for (int j = 0; j < 32; j++)
        x[j] = (float)(32 - j) / 8;
    x[5] = NAN;
    qbuf q = qbuf_new(KILN_FMT_MXFP8, 1, 32);
    quant(x, &q);
    cr_assert_eq(scale_u8(&q)[0], floor_log2(4.0f) - 8 + 127, "amax 4 from the other elements");
    cr_assert_eq(data_u8(&q)[5], 0x7F);
    float *y = dequant(&q);
    cr_assert(isnan(y[5]));
    cr_assert_eq(y[0], 4.0f);
    free(y);
    qbuf_free(&q);

    qbuf t = qbuf_new(KILN_FMT_FP8_TENSOR, 1, 32);
    quant(x, &t);
    cr_assert_eq(scale_f32(&t, 0), 4.0f / 448.0f);
    qbuf_free(&t);

    /* The formats without a NaN element: the scale is the one amax 4 gives
     * (NVFP4: that of its first block of 16, under the global scale of the
     * same amax), and each of the other 31 elements comes back bit for bit
     * as with a 0 in the NaN's place (0 never raises a maximum). The NaN
     * becomes, in the block's scale:
     *  - Q4_0: code 0, -8 d = 4, the block's signed extreme. ggml converts
     *    NaN to an integer there, which is undefined; kiln clamps it to the
     *    lowest code.
     *  - GGML MXFP4: 0. ggml's nearest-value search finds no code nearer
     *    to NaN than code 0 and keeps it.
     *  - NVFP4, MXFP4: 6, the E2M1 code CUDA's conversion gives NaN. */
    float x0[32];
    memcpy(x0, x, sizeof x0);
    x0[5] = 0.0f;
    const float g = 4.0f / (6.0f * 448.0f);
    const float nv = kiln_e4m3_to_f32(kiln_f32_to_e4m3(4.0f / (6.0f * g))) * g;
    const struct { kiln_format f; float scale, nan_to; } blk[] = {
        { KILN_FMT_Q4_0, -0.5f, 4.0f },
        { KILN_FMT_GGML_MXFP4, 1.0f, 0.0f },
        { KILN_FMT_NVFP4, nv, 6.0f * nv },
        { KILN_FMT_MXFP4, 1.0f, 6.0f },
    };
    for (size_t i = 0; i < sizeof blk / sizeof blk[0]; i++) {
        const char *name = kiln_format_get(blk[i].f)->name;
        qbuf a = qbuf_new(blk[i].f, 1, 32), b = qbuf_new(blk[i].f, 1, 32);
        quant(x, &a);
        quant(x0, &b);
        float s = block0_scale(&a);
        cr_assert_eq(bits_of(s), bits_of(blk[i].scale), "%s: block scale %a, want %a", name, s, blk[i].scale);
        float *ya = dequant(&a), *yb = dequant(&b);
        for (int j = 0; j < 32; j++)
            if (j != 5)
                assert_same(ya[j], yb[j], name, j);
        cr_assert_eq(bits_of(ya[5]), bits_of(blk[i].nan_to), "%s: NaN comes back as %a, want %a", name, ya[5],
                     blk[i].nan_to);
        free(ya);
        free(yb);
        qbuf_free(&a);
        qbuf_free(&b);
    }
}

/* Q8_0 keeps ggml's block maximum as written, amax = MAX(amax, |x|) with
 * MAX(a, b) = a > b ? a : b: a NaN makes amax NaN and the next element
 * replaces it. The scale is that of the elements after the block's last
 * NaN, as ggml writes it: a larger element before the NaN saturates at
 * 127 d (ggml's int8 conversion is undefined there, kiln clamps), and a
 * NaN in the last place leaves d NaN and the whole block NaN. */
Test(quantize, q8_0_nan_restarts_ggmls_block_maximum)
{
    float x[64];
    for (int j = 0; j < 64; j++)
        x[j] = (float)(j % 32 + 1) / 8;
    x[0] = 8.0f;
    x[5] = NAN;
    x[63] = NAN;
    qbuf q = qbuf_new(KILN_FMT_Q8_0, 1, 64);
    quant(x, &q);
    float d = kiln_f16_to_f32(kiln_f32_to_f16(4.0f / 127));
    cr_assert_eq(f16_at(data_u8(&q)), d, "amax 4 from after the NaN, not 8: d = %a", f16_at(data_u8(&q)));
    cr_assert(isnan(f16_at(data_u8(&q) + 34)), "a NaN last makes d NaN");
    float *y = dequant(&q);
    cr_assert_eq(y[0], 127 * d, "8 saturates: %a", y[0]);
    cr_assert_eq(y[31], 127 * d);
    cr_assert_eq(y[5], 0.0f);
    for (int j = 32; j < 64; j++)
        cr_assert(isnan(y[j]), "y[%d] = %a", j, y[j]);
    free(y);
    qbuf_free(&q);
}

/* The elements one stored scale covers: scale_rows x scale_cols (0: all of
 * that dimension) where the format has a scale array, one GGML block or
 * one element where it has none. */
static void scale_window(const kiln_format_info *fi, int64_t n, int64_t k, int64_t *rows, int64_t *cols)
{
    if (fi->scale_type == KILN_SCALE_NONE) {
        *rows = 1;
        *cols = fi->block;
        return;
    }
    *rows = fi->scale_rows ? fi->scale_rows : n;
    *cols = fi->scale_cols ? fi->scale_cols : k;
}

enum { EXT_N = 2, EXT_K = 256, EXT_CLEAN = 64 };

/* Whether element i of the extremes tensor below shares a scale with one
 * of its extremes, at columns 0, 7, ..., 28 of row 0. */
static int under_an_extreme(const kiln_format_info *fi, int i)
{
    int64_t rows, cols, r = i / EXT_K, c = i % EXT_K;
    if (fi->has_global_scale)
        return 1;
    scale_window(fi, EXT_N, EXT_K, &rows, &cols);
    if (r / rows != 0)
        return 0;
    return cols == 1 ? c % 7 == 0 && c <= 28 : c / cols <= 28 / cols;
}

/* ±inf, NaN and ±3.4e38 (the extremes, at 0, 7, ..., 28 of row 0), tiny
 * values (at 35, 42, 49) and a row of subnormals in one tensor. Every
 * format quantizes and dequantizes it without undefined behaviour
 * (out-of-range float-to-int conversions, shifts), which the sanitizer
 * build checks, and with the results the definitions give:
 *  - an element that shares no scale with an extreme comes back finite;
 *    row 0 from element 64 on, where the scales cover normal values only,
 *    round-trips within the format's bound with the scales its own values
 *    give; the subnormal row comes back no larger than its largest
 *    magnitude, 2^-133, and never with its sign flipped;
 *  - where every scale saturates or there is none (the plain types, E8M0
 *    scales), only the NaN input comes back NaN, and the extremes map as
 *    in mapped[] below;
 *  - an f32 scale over an extreme (FP8 amax / 448, the NVFP4 global
 *    amax / 2688, which ModelOpt and DeepSeek do not clamp either) is
 *    +inf, and every element under it becomes q · inf with q = ±0 or NaN:
 *    NaN.
 * GGML's f16 scales (Q8_0, Q4_0, Q4_K, Q6_K) overflow to inf over the
 * extremes, as ggml's do; what ggml's arithmetic makes of those blocks is
 * not asserted. */
Test(quantize, extreme_and_non_finite_inputs_are_defined_for_every_format)
{
    float x[EXT_N * EXT_K];
    kt_rng rng = kt_rng_new(9);
    kt_fill_normal(&rng, x, EXT_N * EXT_K, 1.0f);
    const float odd[] = { INFINITY, -INFINITY, NAN, 3.4e38f, -3.4e38f, 1e-45f, -1e-40f, 0x1p-126f };
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++)
        x[i * 7] = odd[i];
    for (int j = EXT_K; j < EXT_N * EXT_K; j++)
        x[j] = 0x1p-140f * (float)(j - 384);
    /* F16 and BF16 round a finite value past their largest to inf (IEEE).
     * The E8M0 code of an infinite amax clamps to 254, X = 2^127: ±inf
     * saturates to the element's largest value and 3.4e38 / X rounds to 2,
     * and either times X overflows f32; E2M1 has no NaN and NaN becomes +6.
     * Under GGML MXFP4's half scale 2^126 every table value from 4 (E2M1 2)
     * up is inf: no code is nearer to ±inf than code 0 (every error is inf
     * or NaN), and ±3.4e38 goes to ±3 · 2^126. */
    const struct { kiln_format f; float ext[5]; } mapped[] = {
        { KILN_FMT_F32, { INFINITY, -INFINITY, NAN, 3.4e38f, -3.4e38f } },
        { KILN_FMT_F16, { INFINITY, -INFINITY, NAN, INFINITY, -INFINITY } },
        { KILN_FMT_BF16, { INFINITY, -INFINITY, NAN, INFINITY, -INFINITY } },
        { KILN_FMT_MXFP8, { INFINITY, -INFINITY, NAN, INFINITY, -INFINITY } },
        { KILN_FMT_MXFP4, { INFINITY, -INFINITY, INFINITY, INFINITY, -INFINITY } },
        { KILN_FMT_GGML_MXFP4, { 0.0f, 0.0f, 0.0f, 0x1.8p127f, -0x1.8p127f } },
    };
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        const kiln_format_info *fi = kiln_format_get((kiln_format)f);
        qbuf q = qbuf_new((kiln_format)f, EXT_N, EXT_K);
        quant(x, &q);
        float *y = dequant(&q);

        for (int i = 0; i < EXT_N * EXT_K; i++) {
            if (under_an_extreme(fi, i))
                continue;
            cr_assert(isfinite(y[i]), "%s[%d]: %a -> %a", fi->name, i, x[i], y[i]);
            /* The integer groups' symmetric grid reaches 8 / 7.5 of the
             * largest magnitude, where -amax rounds to code -8. */
            if (i >= EXT_K)
                cr_assert(fabsf(y[i]) <= (fi->grouped ? 0x1p-133f * 16 / 15 : 0x1p-133f) &&
                          (y[i] == 0.0f || signbit(y[i]) == signbit(x[i])),
                          "%s[%d]: subnormal %a -> %a", fi->name, i, x[i], y[i]);
        }

        int64_t rows, cols;
        scale_window(fi, EXT_N, EXT_K, &rows, &cols);
        if (!fi->has_global_scale && rows == 1 && EXT_CLEAN % cols == 0) {
            size_t data_off, scale_off;
            cr_assert_eq(kiln_format_data_bytes((kiln_format)f, 1, EXT_CLEAN, &data_off), KILN_OK);
            cr_assert_eq(kiln_format_scale_bytes((kiln_format)f, 1, EXT_CLEAN, &scale_off), KILN_OK);
            qbuf row0 = q;
            row0.t.n = 1;
            row0.t.k = EXT_K - EXT_CLEAN;
            row0.t.data = data_u8(&q) + data_off;
            row0.t.scale = q.t.scale ? scale_u8(&q) + scale_off : NULL;
            rt_check[f](&(rt_case){ .x = x + EXT_CLEAN, .y = y + EXT_CLEAN, .q = &row0, .sigma = 1.0 });
        }
        if (f == KILN_FMT_FP8_BLOCK)
            rt_fp8_window(&(rt_case){ .x = x, .y = y, .q = &q, .sigma = 1.0 }, 0, EXT_N, 128, EXT_K,
                          scale_f32(&q, 1));

        if (fi->scale_type == KILN_SCALE_F32 || fi->has_global_scale) {
            float s = fi->has_global_scale ? q.t.global_scale : scale_f32(&q, 0);
            cr_assert(isinf(s) && s > 0, "%s: the scale over the extremes is %a, want +inf", fi->name, s);
            for (int i = 0; i < EXT_N * EXT_K; i++)
                if (under_an_extreme(fi, i))
                    cr_assert(isnan(y[i]), "%s[%d]: %a under an infinite scale -> %a", fi->name, i, x[i], y[i]);
        }
        for (size_t m = 0; m < sizeof mapped / sizeof mapped[0]; m++) {
            if (mapped[m].f != (kiln_format)f)
                continue;
            if (fi->scale_type == KILN_SCALE_E8M0 || f == KILN_FMT_GGML_MXFP4) {
                uint8_t e = f == KILN_FMT_GGML_MXFP4 ? data_u8(&q)[0] : scale_u8(&q)[0];
                cr_assert_eq(e, 254, "%s: E8M0 code %d over an infinite amax, want 254", fi->name, e);
            }
            for (int e = 0; e < 5; e++)
                assert_same(y[7 * e], mapped[m].ext[e], fi->name, 7 * e);
            for (int i = 0; i < EXT_N * EXT_K; i++)
                cr_assert(!isnan(y[i]) || isnan(x[i]), "%s[%d]: %a -> NaN", fi->name, i, x[i]);
        }
        free(y);
        qbuf_free(&q);
    }
}

/* ------------------------------------------------------------ error paths */

Test(errors, null_descriptor_and_null_buffers)
{
    float x[32] = { 1 }, y[32];
    cr_assert_eq(kiln_quantize(x, NULL), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_dequantize(NULL, y), KILN_ERR_INVALID_ARG);

    qbuf q = qbuf_new(KILN_FMT_Q4_0, 1, 32);
    cr_assert_eq(kiln_quantize(NULL, &q.t), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "q4_0") && strstr(kiln_last_error(), "src"), "%s", kiln_last_error());
    cr_assert_eq(kiln_dequantize(&q.t, NULL), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "q4_0") && strstr(kiln_last_error(), "dst"), "%s", kiln_last_error());
    kiln_qtensor nodata = q.t;
    nodata.data = NULL;
    cr_assert_eq(kiln_quantize(x, &nodata), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "q4_0") && strstr(kiln_last_error(), "data"), "%s", kiln_last_error());
    cr_assert_eq(kiln_dequantize(&nodata, y), KILN_ERR_INVALID_ARG);
    qbuf_free(&q);

    qbuf m = qbuf_new(KILN_FMT_MXFP8, 1, 32);
    kiln_qtensor noscale = m.t;
    noscale.scale = NULL;
    cr_assert_eq(kiln_quantize(x, &noscale), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "mxfp8") && strstr(kiln_last_error(), "scale"), "%s", kiln_last_error());
    cr_assert_eq(kiln_dequantize(&noscale, y), KILN_ERR_INVALID_ARG);
    qbuf_free(&m);

    qbuf g = qbuf_new(KILN_FMT_Q8_0, 1, 32);
    cr_assert_null(g.t.scale);
    cr_assert_eq(kiln_quantize(x, &g.t), KILN_OK, "GGML formats need no scale array");
    qbuf_free(&g);
}

Test(errors, unknown_format)
{
    float x[32] = { 1 }, y[32];
    uint8_t buf[64];
    kiln_qtensor t = { .format = KILN_FMT_COUNT, .n = 1, .k = 32, .data = buf, .scale = buf };
    cr_assert_eq(kiln_quantize(x, &t), KILN_ERR_UNSUPPORTED);
    char count_text[32];
    snprintf(count_text, sizeof count_text, "format %d", (int)KILN_FMT_COUNT);
    cr_assert(strstr(kiln_last_error(), count_text), "%s", kiln_last_error());
    t.format = (kiln_format)-1;
    cr_assert_eq(kiln_dequantize(&t, y), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "format -1"), "%s", kiln_last_error());
}

Test(errors, k_breaking_the_block_rule_names_format_and_k)
{
    float x[512] = { 1 }, y[512];
    uint8_t buf[1024];
    const struct { kiln_format f; int64_t k; const char *name; } bad[] = {
        { KILN_FMT_Q4_K, 288, "q4_k" }, { KILN_FMT_Q6_K, 128, "q6_k" }, { KILN_FMT_Q8_0, 48, "q8_0" },
        { KILN_FMT_Q4_0, 16, "q4_0" }, { KILN_FMT_MXFP8, 40, "mxfp8" }, { KILN_FMT_MXFP4, 16, "mxfp4" },
        { KILN_FMT_NVFP4, 24, "nvfp4" }, { KILN_FMT_GGML_MXFP4, 33, "ggml_mxfp4" },
        { KILN_FMT_Q5_0, 48, "q5_0" }, { KILN_FMT_Q5_1, 16, "q5_1" }, { KILN_FMT_Q2_K, 128, "q2_k" },
        { KILN_FMT_Q3_K, 320, "q3_k" }, { KILN_FMT_Q5_K, 96, "q5_k" }, { KILN_FMT_IQ4_NL, 40, "iq4_nl" },
        { KILN_FMT_IQ4_XS, 384, "iq4_xs" }, { KILN_FMT_Q4_1, 40, "q4_1" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char k_text[32];
        snprintf(k_text, sizeof k_text, "K = %lld", (long long)bad[i].k);
        kiln_qtensor t = { .format = bad[i].f, .n = 1, .k = bad[i].k, .data = buf, .scale = buf };
        cr_assert_eq(kiln_quantize(x, &t), KILN_ERR_SHAPE, "%s", bad[i].name);
        cr_assert(strstr(kiln_last_error(), bad[i].name) && strstr(kiln_last_error(), k_text) &&
                      strstr(kiln_last_error(), "kiln_quantize"),
                  "%s", kiln_last_error());
        cr_assert_eq(kiln_dequantize(&t, y), KILN_ERR_SHAPE, "%s", bad[i].name);
        cr_assert(strstr(kiln_last_error(), bad[i].name) && strstr(kiln_last_error(), "kiln_dequantize"), "%s",
                  kiln_last_error());
    }
}

Test(errors, non_positive_shapes)
{
    float x[32] = { 1 };
    uint8_t buf[64];
    const int64_t bad[][2] = { { 0, 32 }, { -2, 32 }, { 1, 0 }, { 1, -32 } };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kiln_qtensor t = { .format = KILN_FMT_Q8_0, .n = bad[i][0], .k = bad[i][1], .data = buf };
        cr_assert_eq(kiln_quantize(x, &t), KILN_ERR_SHAPE);
        cr_assert(strstr(kiln_last_error(), "q8_0"), "%s", kiln_last_error());
    }
}

/* Q4_0 packs 4.5 bits per value: N * K / 32 * 18 bytes fit in size_t while
 * the N * K floats on the f32 side do not. Nothing is touched. */
Test(errors, f32_side_that_overflows_size_t)
{
    float x[1] = { 0 };
    uint8_t buf[1];
    kiln_qtensor t = { .format = KILN_FMT_Q4_0, .n = (int64_t)1 << 31, .k = (int64_t)1 << 31, .data = buf };
    cr_assert_eq(kiln_quantize(x, &t), KILN_ERR_SHAPE);
    cr_assert(strstr(kiln_last_error(), "q4_0") && strstr(kiln_last_error(), "overflow"), "%s", kiln_last_error());
    cr_assert_eq(kiln_dequantize(&t, x), KILN_ERR_SHAPE);
    t.format = KILN_FMT_F32;
    cr_assert_eq(kiln_quantize(x, &t), KILN_ERR_SHAPE, "data bytes overflow first");
    cr_assert(strstr(kiln_last_error(), "f32"), "%s", kiln_last_error());
}
