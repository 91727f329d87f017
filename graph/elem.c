/* Element conversions between f32 and the narrow types of the formats.
 *
 * Every conversion to a narrow type rounds to nearest, ties to even. The
 * formats' own element types (E4M3, E2M1) saturate to their largest finite
 * value (satfinite), as cvt.rn.satfinite does on the GPU. F16 and BF16 have
 * infinities and follow IEEE 754 instead: a finite value that rounds past the
 * largest finite one becomes ±inf, as in numpy, PyTorch and ggml, which
 * write the GGUF and safetensors files kiln reads.
 *
 * NaN:
 *  - E4M3 has one NaN per sign (s.1111.111): NaN in gives 0x7F or 0xFF.
 *  - E2M1 has none. NaN in gives +6 (0x7), positive whatever its sign, as
 *    CUDA's own float-to-fp4 conversion does, so the CPU reference and GPU
 *    quantizers agree.
 *  - E8M0 0xFF decodes to NaN.
 *  - F16 keeps sign and the top 10 payload bits; a payload that would vanish
 *    becomes the quiet bit, so NaN stays NaN and every F16 code round-trips.
 *  - BF16 keeps sign and the top 7 payload bits and sets the quiet bit, as
 *    ggml and gguf-py do; a signalling BF16 NaN comes back quiet.
 */
#include "core.h"

#include <math.h>
#include <string.h>

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* A small binary float type without infinities: `man` mantissa bits,
 * exponent bias `bias`, largest finite magnitude code `max_code`; its
 * smallest normal 2^(1 - bias) and the reciprocal of its smallest subnormal
 * 2^(bias - 1 + man). */
typedef struct mini_float {
    int man;
    int bias;
    uint32_t max_code;
    float min_normal;
    float inv_min_subnormal;
} mini_float;

static const mini_float e4m3_type = {
    .man = 3, .bias = 7, .max_code = 0x7E, .min_normal = 0x1p-6f, .inv_min_subnormal = 0x1p9f,
};
static const mini_float e2m1_type = {
    .man = 1, .bias = 1, .max_code = 0x7, .min_normal = 1.0f, .inv_min_subnormal = 2.0f,
};

/* Magnitude code of |f| (f finite or ±inf, not NaN), RNE, satfinite. */
static uint32_t mini_float_encode(const mini_float *t, float f)
{
    uint32_t a = f32_bits(f) & 0x7FFFFFFFu;
    float af = f32_from_bits(a);
    /* Below the smallest normal, the code is the value in units of the
     * smallest subnormal; scaling by a power of two is exact here, so
     * rintf performs the only rounding. A result of 2^man is the smallest
     * normal, which is also its code. */
    if (af < t->min_normal)
        return (uint32_t)rintf(af * t->inv_min_subnormal);
    /* Normal: round the f32 mantissa to `man` bits in place; a carry moves
     * into the exponent field as it should. */
    int shift = 23 - t->man;
    uint64_t r = (uint64_t)a + ((1u << (shift - 1)) - 1) + ((a >> shift) & 1);
    uint64_t code = (r >> shift) - ((uint64_t)(127 - t->bias) << t->man);
    return code > t->max_code ? t->max_code : (uint32_t)code;
}

float kiln_e4m3_to_f32(uint8_t v)
{
    uint32_t sign = (uint32_t)(v & 0x80) << 24;
    uint32_t e = (v >> 3) & 0xF, m = v & 0x7;
    if (e == 0xF && m == 0x7)
        return f32_from_bits(sign | 0x7FC00000u);
    if (e == 0) /* subnormal: m * 2^-9, exact */
        return f32_from_bits(sign | f32_bits((float)m * 0x1p-9f));
    return f32_from_bits(sign | (e + 120) << 23 | m << 20);
}

uint8_t kiln_f32_to_e4m3(float f)
{
    uint8_t sign = (f32_bits(f) >> 24) & 0x80;
    if (isnan(f))
        return sign | 0x7F;
    return sign | (uint8_t)mini_float_encode(&e4m3_type, f);
}

float kiln_e2m1_to_f32(uint8_t v)
{
    static const float mag[8] = { 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f };
    float m = mag[v & 0x7];
    return (v & 0x8) ? -m : m;
}

uint8_t kiln_f32_to_e2m1(float f)
{
    if (isnan(f))
        return 0x7;
    uint8_t sign = (f32_bits(f) >> 28) & 0x8;
    return sign | (uint8_t)mini_float_encode(&e2m1_type, f);
}

float kiln_e8m0_to_f32(uint8_t v)
{
    if (v == 0xFF)
        return NAN;
    /* 2^-127 is an f32 subnormal: its only set bit is the mantissa's top. */
    return f32_from_bits(v == 0 ? 0x00400000u : (uint32_t)v << 23);
}

float kiln_f16_to_f32(uint16_t v)
{
    uint32_t sign = (uint32_t)(v & 0x8000) << 16;
    uint32_t e = (v >> 10) & 0x1F;
    uint32_t m = v & 0x3FF;
    if (e == 0x1F)
        return f32_from_bits(sign | 0x7F800000u | (m << 13));
    if (e == 0) {
        float mag = ldexpf((float)m, -24);
        return sign ? -mag : mag;
    }
    return f32_from_bits(sign | ((e + 127 - 15) << 23) | (m << 13));
}

uint16_t kiln_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) {
        uint32_t payload = (a >> 13) & 0x3FF;
        return sign | 0x7C00 | (uint16_t)(payload ? payload : 0x200);
    }
    float af = f32_from_bits(a);
    if (af < 0x1p-14f)
        return sign | (uint16_t)rintf(af * 0x1p24f);
    uint32_t r = (a + 0xFFFu + ((a >> 13) & 1)) >> 13;
    uint32_t code = r - ((127u - 15u) << 10);
    return sign | (uint16_t)(code >= 0x7C00 ? 0x7C00 : code);
}

float kiln_bf16_to_f32(uint16_t v) { return f32_from_bits((uint32_t)v << 16); }

uint16_t kiln_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)(((uint64_t)u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
}
