/* Element conversions (graph/elem.c): every code of every narrow type is
 * decoded against a value computed here from the bit layout alone, encoded
 * back, and f32 -> narrow rounding is compared with a brute-force search for
 * the nearest value (ties to the even code) over a dense sweep of floats. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kiln.h"
#include "testutil.h"

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Same value and, for zeros, the same sign. */
static int same_value(float a, double b)
{
    return (double)a == b && !!signbit(a) == !!signbit(b);
}

/* --------------------------------------------------------------- E4M3 */

/* s.eeee.mmm, bias 7, no infinities, s.1111.111 is NaN. */
static double e4m3_layout(unsigned c)
{
    int s = (c >> 7) & 1, e = (c >> 3) & 0xF, m = c & 7;
    if (e == 15 && m == 7)
        return NAN;
    double mag = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return s ? -mag : mag;
}

/* The code of the finite E4M3 value nearest to x >= 0, ties to the even
 * code, by trying all of them. */
static unsigned e4m3_brute(double x)
{
    unsigned best = 0;
    double best_err = INFINITY;
    for (unsigned c = 0; c <= 0x7E; c++) {
        double err = fabs(x - e4m3_layout(c));
        if (err < best_err || (err == best_err && (c & 1) == 0)) {
            best = c;
            best_err = err;
        }
    }
    return best;
}

Test(e4m3, every_code_decodes_to_its_layout_value)
{
    for (unsigned c = 0; c < 256; c++) {
        float got = kiln_e4m3_to_f32((uint8_t)c);
        double want = e4m3_layout(c);
        if (isnan(want)) {
            cr_assert(isnan(got), "code 0x%02x must be NaN", c);
            cr_assert_eq(!!signbit(got), c >> 7, "code 0x%02x keeps its sign", c);
        } else {
            cr_assert(same_value(got, want), "code 0x%02x: got %a, want %a", c, got, want);
        }
    }
    cr_assert_eq(kiln_e4m3_to_f32(0x7E), 448.0f);
    cr_assert_eq(kiln_e4m3_to_f32(0x01), 0x1p-9f);
    cr_assert_eq(kiln_e4m3_to_f32(0x08), 0x1p-6f);
}

Test(e4m3, every_code_encodes_back_to_itself)
{
    for (unsigned c = 0; c < 256; c++) {
        uint8_t back = kiln_f32_to_e4m3(kiln_e4m3_to_f32((uint8_t)c));
        cr_assert_eq(back, c, "code 0x%02x came back as 0x%02x", c, back);
    }
}

Test(e4m3, nan_gives_the_nan_code_of_its_sign)
{
    cr_assert_eq(kiln_f32_to_e4m3(NAN), 0x7F);
    cr_assert_eq(kiln_f32_to_e4m3(-NAN), 0xFF);
    cr_assert_eq(kiln_f32_to_e4m3(float_of(0x7F800001u)), 0x7F, "signalling NaN");
}

Test(e4m3, beyond_the_range_saturates)
{
    const float big[] = { 448.0f, 448.5f, 464.0f, 479.9f, 480.0f, 1e6f, 3.4e38f, INFINITY };
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        cr_assert_eq(kiln_f32_to_e4m3(big[i]), 0x7E, "%g", big[i]);
        cr_assert_eq(kiln_f32_to_e4m3(-big[i]), 0xFE, "%g", -big[i]);
    }
}

Test(e4m3, midpoints_round_to_the_even_code)
{
    for (unsigned c = 0; c < 0x7E; c++) {
        float lo = kiln_e4m3_to_f32((uint8_t)c), hi = kiln_e4m3_to_f32((uint8_t)(c + 1));
        float mid = (lo + hi) / 2; /* exact: both have few mantissa bits */
        unsigned even = (c & 1) ? c + 1 : c;
        cr_assert_eq(kiln_f32_to_e4m3(mid), even, "midpoint %a of 0x%02x/0x%02x", mid, c, c + 1);
        cr_assert_eq(kiln_f32_to_e4m3(nextafterf(mid, 0.0f)), c, "just below %a", mid);
        cr_assert_eq(kiln_f32_to_e4m3(nextafterf(mid, INFINITY)), c + 1, "just above %a", mid);
        cr_assert_eq(kiln_f32_to_e4m3(-mid), 0x80 | even, "negative midpoint %a", -mid);
    }
}

Test(e4m3, subnormals_round_correctly)
{
    for (int m = 1; m < 8; m++)
        cr_assert_eq(kiln_f32_to_e4m3(ldexpf((float)m, -9)), m, "m/8 * 2^-6, m = %d", m);
    cr_assert_eq(kiln_f32_to_e4m3(0x1p-10f), 0x00, "half the smallest subnormal: tie to 0");
    cr_assert_eq(kiln_f32_to_e4m3(nextafterf(0x1p-10f, 1.0f)), 0x01);
    cr_assert_eq(kiln_f32_to_e4m3(3 * 0x1p-10f), 0x02, "1.5 * 2^-9: tie to the even code 2");
    cr_assert_eq(kiln_f32_to_e4m3(15 * 0x1p-10f), 0x08, "7.5 * 2^-9 rounds up into the normals");
    cr_assert_eq(kiln_f32_to_e4m3(-0x1p-9f), 0x81);
    cr_assert_eq(kiln_f32_to_e4m3(0x1p-149f), 0x00, "an f32 subnormal");
    cr_assert_eq(kiln_f32_to_e4m3(-0.0f), 0x80, "negative zero keeps its sign");
}

/* Every positive f32 up to 512 with a stride coprime to the mantissa's
 * power-of-two structure, so every exponent and many rounding positions are
 * hit; negative values must mirror. */
Test(e4m3, matches_brute_force_over_a_dense_sweep)
{
    for (uint32_t u = 0; u <= 0x44000000u; u += 997) {
        float x = float_of(u);
        unsigned want = e4m3_brute(x);
        unsigned got = kiln_f32_to_e4m3(x);
        cr_assert_eq(got, want, "x = %a: got 0x%02x, want 0x%02x", x, got, want);
        cr_assert_eq(kiln_f32_to_e4m3(-x), 0x80 | want, "x = %a", -x);
    }
}

/* --------------------------------------------------------------- E2M1 */

/* s.ee.m, bias 1, no infinities or NaN. */
static double e2m1_layout(unsigned c)
{
    int s = (c >> 3) & 1, e = (c >> 1) & 3, m = c & 1;
    double mag = e == 0 ? m * 0.5 : (1.0 + m * 0.5) * ldexp(1.0, e - 1);
    return s ? -mag : mag;
}

static unsigned e2m1_brute(double x)
{
    unsigned best = 0;
    double best_err = INFINITY;
    for (unsigned c = 0; c <= 7; c++) {
        double err = fabs(x - e2m1_layout(c));
        if (err < best_err || (err == best_err && (c & 1) == 0)) {
            best = c;
            best_err = err;
        }
    }
    return best;
}

Test(e2m1, every_code_decodes_and_encodes_back)
{
    const double table[8] = { 0, 0.5, 1, 1.5, 2, 3, 4, 6 };
    for (unsigned c = 0; c < 16; c++) {
        double want = e2m1_layout(c);
        cr_assert_eq(fabs(want), table[c & 7], "layout of code %u", c);
        float got = kiln_e2m1_to_f32((uint8_t)c);
        cr_assert(same_value(got, want), "code %u: got %g, want %g", c, got, want);
        cr_assert_eq(kiln_f32_to_e2m1(got), c, "code %u", c);
        cr_assert_eq(kiln_e2m1_to_f32((uint8_t)(0xF0 | c)), got, "only the low 4 bits count");
    }
}

Test(e2m1, ties_round_to_even_and_large_values_saturate)
{
    const struct { float x; uint8_t code; } cases[] = {
        { 0.25f, 0 }, { 0.75f, 2 }, { 1.25f, 2 }, { 1.75f, 4 }, { 2.5f, 4 }, { 3.5f, 6 }, { 5.0f, 6 },
        { 6.0f, 7 }, { 6.5f, 7 }, { 7.0f, 7 }, { 1e9f, 7 }, { INFINITY, 7 }, { -INFINITY, 15 },
        { -2.5f, 12 }, { -0.0f, 8 }, { 0x1p-149f, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_assert_eq(kiln_f32_to_e2m1(cases[i].x), cases[i].code, "%g", cases[i].x);
}

Test(e2m1, nan_saturates_to_plus_six)
{
    cr_assert_eq(kiln_f32_to_e2m1(NAN), 0x7);
    cr_assert_eq(kiln_f32_to_e2m1(-NAN), 0x7);
}

Test(e2m1, matches_brute_force_over_a_dense_sweep)
{
    for (uint32_t u = 0; u <= 0x41000000u; u += 499) {
        float x = float_of(u);
        unsigned want = e2m1_brute(x);
        cr_assert_eq(kiln_f32_to_e2m1(x), want, "x = %a", x);
        cr_assert_eq(kiln_f32_to_e2m1(-x), 8 | want, "x = %a", -x);
    }
}

/* --------------------------------------------------------------- E8M0 */

Test(e8m0, every_code_is_a_power_of_two_and_ff_is_nan)
{
    for (unsigned e = 0; e < 255; e++) {
        float got = kiln_e8m0_to_f32((uint8_t)e);
        cr_assert_eq((double)got, ldexp(1.0, (int)e - 127), "code %u: %a", e, got);
    }
    cr_assert(isnan(kiln_e8m0_to_f32(0xFF)));
    cr_assert_eq(fpclassify(kiln_e8m0_to_f32(0)), FP_SUBNORMAL, "2^-127 is an f32 subnormal");
    cr_assert_eq(kiln_e8m0_to_f32(127), 1.0f);
    cr_assert_eq(kiln_e8m0_to_f32(254), 0x1p127f);
}

/* ---------------------------------------------------------------- F16 */

static double f16_layout(unsigned h)
{
    int s = (h >> 15) & 1, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    double mag;
    if (e == 31)
        mag = m ? NAN : INFINITY;
    else if (e == 0)
        mag = ldexp(m, -24);
    else
        mag = ldexp(1024 + m, e - 25);
    return s ? -mag : mag;
}

Test(f16, every_code_decodes_and_round_trips)
{
    for (unsigned h = 0; h < 65536; h++) {
        float got = kiln_f16_to_f32((uint16_t)h);
        double want = f16_layout(h);
        if (isnan(want))
            cr_assert(isnan(got), "0x%04x", h);
        else
            cr_assert(same_value(got, want), "0x%04x: got %a, want %a", h, got, want);
        uint16_t back = kiln_f32_to_f16(got);
        cr_assert_eq(back, h, "0x%04x came back as 0x%04x", h, back);
    }
}

Test(f16, rounding_overflow_and_subnormals)
{
    cr_assert_eq(kiln_f32_to_f16(1.0f + 0x1p-11f), 0x3C00, "midpoint: tie to even 1.0");
    cr_assert_eq(kiln_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02, "midpoint: tie to even mantissa 2");
    cr_assert_eq(kiln_f32_to_f16(65504.0f), 0x7BFF);
    cr_assert_eq(kiln_f32_to_f16(65519.99f), 0x7BFF);
    cr_assert_eq(kiln_f32_to_f16(65520.0f), 0x7C00, "the tie above the largest finite goes to inf");
    cr_assert_eq(kiln_f32_to_f16(-1e9f), 0xFC00);
    cr_assert_eq(kiln_f32_to_f16(0x1p-24f), 0x0001);
    cr_assert_eq(kiln_f32_to_f16(0x1p-25f), 0x0000, "half the smallest subnormal: tie to 0");
    cr_assert_eq(kiln_f32_to_f16(nextafterf(0x1p-25f, 1.0f)), 0x0001);
    cr_assert_eq(kiln_f32_to_f16(3 * 0x1p-25f), 0x0002);
    cr_assert_eq(kiln_f32_to_f16(1023 * 0x1p-24f + 0x1p-25f), 0x0400, "tie into the smallest normal");
    cr_assert_eq(kiln_f32_to_f16(-0.0f), 0x8000);
    uint16_t nan = kiln_f32_to_f16(float_of(0x7F800001u));
    cr_assert(nan > 0x7C00 && nan <= 0x7FFF, "a NaN whose payload is only low bits stays NaN: 0x%04x", nan);
}

/* The encoding of x must be the nearest of itself and its two neighbours,
 * with ties on the even code. */
static void check_nearest_16(float x, uint16_t c, float (*dec)(uint16_t))
{
    double v = dec(c), err = fabs((double)x - v);
    for (int d = -1; d <= 1; d += 2) {
        int nb = (int)(c & 0x7FFF) + d;
        if (nb < 0)
            continue;
        double w = dec((uint16_t)((c & 0x8000) | nb));
        if (isnan(w) || isinf(w))
            continue;
        double nerr = fabs((double)x - w);
        cr_assert(err < nerr || (err == nerr && (c & 1) == 0), "x = %a: code 0x%04x (%a), neighbour %a is closer",
                  x, c, v, w);
    }
}

Test(f16, rounding_matches_nearest_even_over_a_dense_sweep)
{
    for (uint32_t u = 0; u < 0x477FE000u; u += 1021) {
        float x = float_of(u);
        check_nearest_16(x, kiln_f32_to_f16(x), kiln_f16_to_f32);
        check_nearest_16(-x, kiln_f32_to_f16(-x), kiln_f16_to_f32);
    }
}

/* --------------------------------------------------------------- BF16 */

Test(bf16, every_code_decodes_and_round_trips)
{
    for (unsigned h = 0; h < 65536; h++) {
        float got = kiln_bf16_to_f32((uint16_t)h);
        cr_assert_eq(bits_of(got), (uint32_t)h << 16, "0x%04x", h);
        uint16_t back = kiln_f32_to_bf16(got);
        if (isnan(got))
            cr_assert_eq(back, h | 0x40, "NaN 0x%04x comes back quiet, sign and payload kept: 0x%04x", h, back);
        else
            cr_assert_eq(back, h, "0x%04x came back as 0x%04x", h, back);
    }
}

Test(bf16, rounding_and_overflow)
{
    cr_assert_eq(kiln_f32_to_bf16(1.0f + 0x1p-8f), 0x3F80, "midpoint: tie to even");
    cr_assert_eq(kiln_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82, "midpoint: tie to even");
    cr_assert_eq(kiln_f32_to_bf16(nextafterf(1.0f + 0x1p-8f, 2.0f)), 0x3F81);
    cr_assert_eq(kiln_f32_to_bf16(3.4028235e38f), 0x7F80, "FLT_MAX rounds to inf");
    cr_assert_eq(kiln_f32_to_bf16(-INFINITY), 0xFF80);
    cr_assert_eq(kiln_f32_to_bf16(float_of(0x7F800001u)), 0x7FC0, "signalling NaN comes out quiet");
    cr_assert_eq(kiln_f32_to_bf16(float_of(0xFFC12345u)), 0xFFC1);
    cr_assert_eq(kiln_f32_to_bf16(float_of(0x00018000u)), 0x0002, "subnormal tie to even");
}

Test(bf16, rounding_matches_nearest_even_over_a_dense_sweep)
{
    for (uint32_t u = 0; u < 0x7F7F0000u; u += 65599) {
        float x = float_of(u);
        check_nearest_16(x, kiln_f32_to_bf16(x), kiln_bf16_to_f32);
        check_nearest_16(-x, kiln_f32_to_bf16(-x), kiln_bf16_to_f32);
    }
}

/* Random values of every magnitude, for the seeded record of the run. */
Test(bf16, random_values_round_trip_through_f16_and_bf16_within_half_an_ulp)
{
    kt_rng rng = kt_rng_new(11);
    for (int i = 0; i < 100000; i++) {
        float x = kt_normal(&rng) * ldexpf(1.0f, (int)(kt_next(&rng) % 20) - 10);
        float h = kiln_f16_to_f32(kiln_f32_to_f16(x));
        float b = kiln_bf16_to_f32(kiln_f32_to_bf16(x));
        cr_assert(fabsf(h - x) <= ldexpf(fabsf(x), -11) + 0x1p-25f, "f16 of %a is %a", x, h);
        cr_assert(fabsf(b - x) <= ldexpf(fabsf(x), -8), "bf16 of %a is %a", x, b);
    }
}
