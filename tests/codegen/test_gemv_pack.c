/* The gemv backend's weight packing (kernels/gemv/pack.c) read back the
 * way the tensor-core kernel (kernels/gemv/tc.cuh) reads it. The model
 * below is written from tc.cuh alone: a lane's 16-byte loads, its scale
 * record and super-record, the bit decodings into BF16 A registers and
 * the trait's offset, scale, minimum and row scale, applied to one weight
 * at a time (x one-hot, so the sum of x over a block is 1). Every weight
 * it decodes must be what kiln_dequantize gives. No GPU needed. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemv/pack.h"
#include "codegen_util.h"
#include "kernels/gemv/tc_format.h"
#include "testutil.h"

enum { TILE = 16, ATOM = 64, PIECE = 512 };

/* ------------------------------------------- the kernel's BF16 pair ops */

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static float bf16_half(uint32_t pair, int half) { return kiln_bf16_to_f32((uint16_t)(pair >> (16 * half))); }

static uint32_t lop_and_or(uint32_t a, uint32_t mask, uint32_t bits) { return (a & mask) | bits; }

/* fma.rn.bf16x2. tc.cuh relies on every use having a BF16 result, so the
 * model asserts that rather than rounding. */
static uint32_t bf2_fma(uint32_t a, uint32_t b, uint32_t c)
{
    uint32_t d = 0;
    for (int h = 0; h < 2; h++) {
        const double r = (double)bf16_half(a, h) * bf16_half(b, h) + bf16_half(c, h);
        const uint16_t o = kiln_f32_to_bf16((float)r);
        cr_assert_eq((double)kiln_bf16_to_f32(o), r, "bf16 fma %08x * %08x + %08x: not a BF16 value", a,
                     b, c);
        d |= (uint32_t)o << (16 * h);
    }
    return d;
}

#define SPLAT(x) ((uint32_t)(x) | (uint32_t)(x) << 16)
enum { MAGIC = 0x43004300u, BF2_ONE = 0x3F803F80u, NEG_ZERO = 0x80008000u };

static void decode_int4(uint32_t w, uint32_t a[4])
{
    for (int r = 0; r < 4; r++)
        a[r] = lop_and_or(w >> (4 * r), 0x000F000Fu, MAGIC);
}

/* The E2M1 values · 2^-126 in BF16 pairs; the caller's multiply. */
static void e2m1_bits(uint32_t w, uint32_t raw[4])
{
    const uint32_t mask = 0x81C081C0u;
    uint32_t r3 = (w >> 3) & 0x01800180u;
    r3 = lop_and_or(w >> 7, 0x00400040u, r3);
    r3 = lop_and_or(w << 1, 0x80008000u, r3);
    raw[0] = w & mask, raw[1] = (w << 3) & mask, raw[2] = (w << 6) & mask, raw[3] = r3;
}

static void decode_e2m1(uint32_t w, uint32_t scale, uint32_t a[4])
{
    uint32_t raw[4];
    e2m1_bits(w, raw);
    for (int r = 0; r < 4; r++)
        a[r] = bf2_fma(raw[r], SPLAT(scale), NEG_ZERO);
}

static void decode_e4m3_word(uint32_t w, uint32_t *lo, uint32_t *hi)
{
    const uint32_t p0 = lop_and_or(w << 8, 0x80008000u, (w << 4) & 0x07F007F0u);
    const uint32_t p1 = lop_and_or(w, 0x80008000u, (w >> 4) & 0x07F007F0u);
    *lo = bf2_fma(p0, SPLAT(0x7B80u), NEG_ZERO); /* 2^120 */
    *hi = bf2_fma(p1, SPLAT(0x7B80u), NEG_ZERO);
}

static void decode_q8_word(uint32_t w, uint32_t *lo, uint32_t *hi)
{
    const uint32_t l0 = lop_and_or(w, 0x000F000Fu, MAGIC);
    const uint32_t h0 = lop_and_or(w >> 4, 0x000F000Fu, MAGIC);
    const uint32_t l1 = lop_and_or(w >> 8, 0x000F000Fu, MAGIC);
    const uint32_t h1 = lop_and_or(w >> 12, 0x000F000Fu, MAGIC);
    *lo = bf2_fma(l0, BF2_ONE, bf2_fma(h0, SPLAT(0x4180u), SPLAT(0xC510u))); /* 16, -2304 */
    *hi = bf2_fma(l1, BF2_ONE, bf2_fma(h1, SPLAT(0x4180u), SPLAT(0xC510u)));
}

/* ------------------------------------------------ one lane's registers */

typedef struct lane_raw {
    uint32_t q[4][4]; /* pieces */
    uint32_t s[2], sup[2], qh[2];
} lane_raw;

typedef struct packed {
    const kiln_qtensor *q; /* the source: shape and NVFP4's global scale */
    const uint8_t *data, *scale;
} packed;

static void dec_bf16(const lane_raw *r, int j, uint32_t a[4]) { memcpy(a, r->q[j], 4 * sizeof a[0]); }

/* F16 as hi + lo (decode_f16_word): hi the value · 2^-112 shifted down 3
 * beside the sign, times 2^112; lo the low 3 bits atop hi's base, less the
 * base, times 2^105. */
static void decode_f16_word(uint32_t w, uint32_t *hi, uint32_t *lo)
{
    const uint32_t p = lop_and_or(w >> 3, 0x0FFF0FFFu, w & 0x80008000u), base = p & 0x8F808F80u;
    *hi = bf2_fma(p, SPLAT(0x7780u), NEG_ZERO);
    *lo = bf2_fma(lop_and_or(w << 4, 0x00700070u, base), SPLAT(0x7400u),
                  bf2_fma(base, SPLAT(0xF400u), NEG_ZERO));
}

static void dec_f16_hi(const lane_raw *r, int j, uint32_t a[4])
{
    uint32_t lo;
    for (int i = 0; i < 4; i++)
        decode_f16_word(r->q[j][i], &a[i], &lo);
}

static void dec_f16_lo(const lane_raw *r, int j, uint32_t a[4])
{
    uint32_t hi;
    for (int i = 0; i < 4; i++)
        decode_f16_word(r->q[j][i], &hi, &a[i]);
}

static void dec_e4m3(const lane_raw *r, int j, uint32_t a[4])
{
    decode_e4m3_word(r->q[j >> 1][(j & 1) * 2], &a[0], &a[1]);
    decode_e4m3_word(r->q[j >> 1][(j & 1) * 2 + 1], &a[2], &a[3]);
}

static void dec_q8_0(const lane_raw *r, int j, uint32_t a[4])
{
    decode_q8_word(r->q[j >> 1][(j & 1) * 2], &a[0], &a[1]);
    decode_q8_word(r->q[j >> 1][(j & 1) * 2 + 1], &a[2], &a[3]);
}

static void dec_int4(const lane_raw *r, int j, uint32_t a[4]) { decode_int4(r->q[0][j], a); }
static void dec_e2m1(const lane_raw *r, int j, uint32_t a[4]) { decode_e2m1(r->q[0][j], 0x7E80u, a); }
static void dec_e2m1_ggml(const lane_raw *r, int j, uint32_t a[4]) { decode_e2m1(r->q[0][j], 0x7F00u, a); }

/* NVFP4: block j's scale code c (byte j of rows g and g + 8) times the
 * E2M1 bits, as the BF16 pair 16·c + (110 + 118) << 7: s · 2^118. */
static void dec_nvfp4(const lane_raw *r, int j, uint32_t a[4])
{
    uint32_t raw[4], mul[2];
    e2m1_bits(r->q[0][j], raw);
    for (int h = 0; h < 2; h++)
        mul[h] = SPLAT(((r->s[h] >> (8 * j)) & 0xFF) * 16 + ((110u + 118u) << 7));
    for (int i = 0; i < 4; i++)
        a[i] = bf2_fma(raw[i], mul[i & 1], NEG_ZERO);
}

static void dec_q6_k(const lane_raw *r, int j, uint32_t a[4])
{
    const uint32_t w = r->q[0][j], hw = r->qh[j >> 1];
    for (int i = 0; i < 4; i++) {
        const int hs = 2 * ((j & 1) * 4 + i);
        const uint32_t h = hs < 4 ? hw << (4 - hs) : hw >> (hs - 4);
        a[i] = lop_and_or(w >> (4 * i), 0x000F000Fu, lop_and_or(h, 0x00300030u, MAGIC));
    }
}

/* Scale records: lane group g's at (tile·atoms + atom)·8·record + g·record,
 * super-records after all of them, per 256 values. */
static const uint8_t *record_at(const packed *p, int64_t tile, int64_t atom, int g, int bytes)
{
    const size_t record = (size_t)(tile * (p->q->k / ATOM) + atom);
    return p->scale + (record * 8 + (size_t)g) * (size_t)bytes;
}

static const uint8_t *super_at(const packed *p, int64_t tile, int64_t atom, int g, int bytes)
{
    const int64_t tiles = (p->q->n + TILE - 1) / TILE;
    const size_t record = (size_t)(tile * (p->q->k / 256) + atom / 4);
    return p->scale + (size_t)(tiles * (p->q->k / ATOM)) * 64 + (record * 8 + (size_t)g) * (size_t)bytes;
}

static void load_rec4(const packed *p, int64_t tile, int64_t atom, int g, lane_raw *r)
{
    r->s[0] = le32(record_at(p, tile, atom, g, 4));
}

static void load_rec8(const packed *p, int64_t tile, int64_t atom, int g, lane_raw *r)
{
    const uint8_t *at = record_at(p, tile, atom, g, 8);
    r->s[0] = le32(at), r->s[1] = le32(at + 4);
}

static void load_q4_k(const packed *p, int64_t tile, int64_t atom, int g, lane_raw *r)
{
    load_rec8(p, tile, atom, g, r);
    const uint8_t *at = super_at(p, tile, atom, g, 8);
    r->sup[0] = le32(at), r->sup[1] = le32(at + 4);
}

static void load_q6_k(const packed *p, int64_t tile, int64_t atom, int g, lane_raw *r)
{
    load_rec8(p, tile, atom, g, r);
    r->sup[0] = le32(super_at(p, tile, atom, g, 4));
}

/* FP8 block: kiln's own f32 per 128 × 128, an atom inside one. */
static void load_fp8_block(const packed *p, int64_t tile, int64_t atom, int g, lane_raw *r)
{
    (void)g;
    r->s[0] = le32(p->scale + 4 * (size_t)((tile / 8) * ((p->q->k + 127) / 128) + atom / 2));
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* OCP E8M0 as e8m0_byte reads it: 255 (NaN) as +inf, whose block the
 * packer zeroes. */
static float e8m0(uint32_t e) { return bits_f32(e << 23 > 0x00400000u ? e << 23 : 0x00400000u); }
static float e8m0_half(uint32_t e) { return bits_f32(e < 2 ? 0x00200000u << e : (e - 1) << 23); }
static float f16(uint32_t v) { return kiln_f16_to_f32((uint16_t)v); }

/* Block b's scales of rows g, g + 8 (s) and Q4_K's minimums (m). */
static void sc_fp8_block(const lane_raw *r, int b, float s[2], float m[2])
{
    (void)b, (void)m;
    s[0] = s[1] = bits_f32(r->s[0]);
}

/* E8M0 records interleave: rows g and g + 8 at bytes b and b + 2. */
static void sc_e8m0(const lane_raw *r, int b, float s[2], float m[2])
{
    (void)m;
    s[0] = e8m0((r->s[0] >> (8 * b)) & 0xFF), s[1] = e8m0((r->s[0] >> (8 * b + 16)) & 0xFF);
}

static void sc_e8m0_half(const lane_raw *r, int b, float s[2], float m[2])
{
    (void)m;
    s[0] = e8m0_half((r->s[0] >> (8 * b)) & 0xFF);
    s[1] = e8m0_half((r->s[0] >> (8 * b + 16)) & 0xFF);
}

static void sc_f16(const lane_raw *r, int b, float s[2], float m[2])
{
    (void)m;
    s[0] = f16(r->s[0] >> (16 * b)), s[1] = f16(r->s[1] >> (16 * b));
}

static void sc_q4_k(const lane_raw *r, int b, float s[2], float m[2])
{
    for (int h = 0; h < 2; h++) {
        s[h] = f16(r->sup[h]) * (float)((r->s[h] >> (8 * b)) & 0xFF);
        m[h] = f16(r->sup[h] >> 16) * (float)((r->s[h] >> (8 * b + 16)) & 0xFF);
    }
}

static void sc_q6_k(const lane_raw *r, int b, float s[2], float m[2])
{
    (void)m;
    for (int h = 0; h < 2; h++)
        s[h] = f16(r->sup[0] >> (16 * h)) * (float)((int)((r->s[h] >> (8 * b)) & 0xFF) - 128);
}

static float f32_at(const uint8_t *p, size_t i) { return bits_f32(le32(p + 4 * i)); }

/* What multiplies row n's sum at the end. */
static float row_one(const packed *p, int64_t n) { return (void)p, (void)n, 1.0f; }
static float row_tensor(const packed *p, int64_t n) { return (void)n, f32_at(p->scale, 0); }
static float row_channel(const packed *p, int64_t n) { return f32_at(p->scale, (size_t)n); }
static float row_global(const packed *p, int64_t n) { return (void)n, p->q->global_scale * 256.0f; }

/* Where pack.h puts a value's code in a lane's words (padding check). */
typedef enum field_class { F_W16, F_W8, F_INT4, F_E2M1, F_Q6, F_W16R, F_W8R } field_class;

typedef struct tc_model {
    int pieces, atom_bytes, block_tiles; /* block_tiles 0: no block scale */
    void (*load)(const packed *p, int64_t tile, int64_t atom, int g, lane_raw *r); /* NULL: none */
    void (*decode)(const lane_raw *r, int j, uint32_t a[4]);
    void (*decode_lo)(const lane_raw *r, int j, uint32_t a[4]); /* F16's second term */
    void (*scale)(const lane_raw *r, int b, float s[2], float m[2]);
    float offset[2]; /* subtracted from the decoded code; 0: none */
    float (*row)(const packed *p, int64_t n);
    field_class field;
    /* Exact: the kernel and kiln_dequantize do the same roundings. NVFP4
     * is not: the kernel takes (e2m1 · s · 2^-8) · (global · 2^8), the
     * reference e2m1 · (s · global). */
    int exact;
} tc_model;

/* Every format the packer serves; F32 has no row. */
static const tc_model models[KILN_FMT_COUNT] = {
    [KILN_FMT_F16] = { 4, 2048, 0, NULL, dec_f16_hi, dec_f16_lo, NULL, { 0 }, row_one, F_W16, 1 },
    [KILN_FMT_BF16] = { 4, 2048, 0, NULL, dec_bf16, NULL, NULL, { 0 }, row_one, F_W16R, 1 },
    [KILN_FMT_FP8_TENSOR] = { 2, 1024, 0, NULL, dec_e4m3, NULL, NULL, { 0 }, row_tensor, F_W8R, 1 },
    [KILN_FMT_FP8_CHANNEL] = { 2, 1024, 0, NULL, dec_e4m3, NULL, NULL, { 0 }, row_channel, F_W8R, 1 },
    [KILN_FMT_FP8_BLOCK] = { 2, 1024, 4, load_fp8_block, dec_e4m3, NULL, sc_fp8_block, { 0 }, row_one, F_W8, 1 },
    [KILN_FMT_MXFP8] = { 2, 1024, 2, load_rec4, dec_e4m3, NULL, sc_e8m0, { 0 }, row_one, F_W8, 1 },
    [KILN_FMT_NVFP4] = { 1, 512, 0, load_rec8, dec_nvfp4, NULL, NULL, { 0 }, row_global, F_E2M1, 0 },
    [KILN_FMT_MXFP4] = { 1, 512, 2, load_rec4, dec_e2m1, NULL, sc_e8m0, { 0 }, row_one, F_E2M1, 1 },
    [KILN_FMT_Q8_0] = { 2, 1024, 2, load_rec8, dec_q8_0, NULL, sc_f16, { 0 }, row_one, F_W8, 1 },
    [KILN_FMT_Q4_0] = { 1, 512, 2, load_rec8, dec_int4, NULL, sc_f16, { 136, 136 }, row_one, F_INT4, 1 },
    [KILN_FMT_Q4_K] = { 1, 512, 2, load_q4_k, dec_int4, NULL, sc_q4_k, { 128, 128 }, row_one, F_INT4, 1 },
    [KILN_FMT_Q6_K] = { 1, 768, 1, load_q6_k, dec_q6_k, NULL, sc_q6_k, { 160, 160 }, row_one, F_Q6, 1 },
    [KILN_FMT_GGML_MXFP4] = { 1, 512, 2, load_rec4, dec_e2m1_ggml, NULL, sc_e8m0_half, { 0 }, row_one, F_E2M1, 1 },
};

/* What the kernel makes of weight (n, k): lane 4g + t of row tile n / 16
 * holds it in k-tile j, register 2·(s >> 1) + h, half s & 1. */
/* A row-major atom's 16-byte chunk c of row R in the stage: at c ^ (R % 8)
 * for rows of 128 bytes, c ^ (R / 2 % 4) for rows of 64. */
static int rows_swizzle(int rb, int row) { return rb == 128 ? row & 7 : (row >> 1) & 3; }

/* Word r of ldmatrix.x4 number q that lane (g, t) reads from a row-major
 * atom of rb-byte rows (tc_rows in tc.cuh, restated): the lanes' pieces
 * (lane l's 16 bytes of each 512) staged swizzled, then ldmatrix.x4, whose
 * matrix r row g comes from the address lane 8r + g gives: row R = 8 (r %
 * 2) + g (for rows of 64 bytes, rows 8 .. 15 lie swapped in pairs: R ^ 1),
 * chunk 2q + r / 2; bytes 4t .. 4t + 3 of it in the word. */
static uint32_t rows_word(const uint8_t *atom, int rb, int g, int t, int q, int r)
{
    uint8_t stage[2048];
    for (int i = 0; i < 16 * rb / PIECE; i++)
        for (int l = 0; l < 32; l++) {
            const int at = i * PIECE + l * 16, row = at / rb;
            memcpy(stage + row * rb + ((at % rb / 16) ^ rows_swizzle(rb, row)) * 16, atom + at, 16);
        }
    const int l = 8 * r + g, row = (l >> 3 & 1) * 8 + (l & 7);
    const int at = rb == 64 ? row ^ (row >> 3) : row;
    return le32(stage + at * rb + ((2 * q + (l >> 4)) ^ rows_swizzle(rb, at)) * 16 + 4 * t);
}

/* __byte_perm(a, b, sel): byte i of the result is byte sel's nibble i of
 * b:a. */
static uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel)
{
    const uint64_t ab = (uint64_t)b << 32 | a;
    uint32_t out = 0;
    for (int i = 0; i < 4; i++)
        out |= (uint32_t)(ab >> (8 * ((sel >> (4 * i)) & 7)) & 0xFF) << (8 * i);
    return out;
}

static float tc_weight(const packed *p, int64_t n, int64_t k)
{
    const tc_model *m = &models[p->q->format];
    const int64_t tile = n / TILE, atom = k / ATOM, atoms = p->q->k / ATOM;
    const int g = (int)(n % 8), h = (int)(n % TILE / 8), kk = (int)(k % ATOM);
    const int j = kk / 16, t = kk % 16 / 4, s = kk % 4, lane = 4 * g + t;
    const uint8_t *at = p->data + (size_t)(tile * atoms + atom) * (size_t)m->atom_bytes;
    if (m->field == F_W16R) { /* mma's own k order: value c of the k-tile */
        const int c = kk % 16, r = 2 * (c >= 8) + h;
        return bf16_half(rows_word(at, 128, g, c % 8 / 2, j, r), c & 1) * m->row(p, n);
    }
    lane_raw r = { 0 };
    for (int i = 0; i < m->pieces; i++)
        for (int w = 0; w < 4; w++)
            r.q[i][w] = m->field == F_W8R ? rows_word(at, 64, g, t, i, w)
                                          : le32(at + i * PIECE + lane * 16 + 4 * w);
    if (m->field == F_W8R) { /* rows g, g + 8 of k-tile j interleaved (tc_e4m3_of) */
        uint32_t *w = &r.q[j >> 1][(j & 1) * 2];
        const uint32_t g0 = w[0], g8 = w[1];
        w[0] = byte_perm(g0, g8, 0x5140), w[1] = byte_perm(g0, g8, 0x7362);
    }
    if (m->field == F_Q6)
        r.qh[0] = le32(at + PIECE + lane * 8), r.qh[1] = le32(at + PIECE + lane * 8 + 4);
    if (m->load)
        m->load(p, tile, atom, g, &r);
    uint32_t a[4];
    m->decode(&r, j, a);
    float w = bf16_half(a[2 * (s >> 1) + h], s & 1);
    if (m->decode_lo) { /* hi + lo: 8 and 3 significant bits, exact in f32 */
        m->decode_lo(&r, j, a);
        w += bf16_half(a[2 * (s >> 1) + h], s & 1);
    }
    if (m->block_tiles) {
        float sc[2], mn[2] = { 0.0f, 0.0f };
        m->scale(&r, j / m->block_tiles, sc, mn);
        w = m->offset[h] != 0.0f ? fmaf(w - m->offset[h], sc[h], -mn[h]) : w * sc[h];
    }
    return w * m->row(p, n);
}

/* ------------------------------------------------------------- helpers */

static kiln_qtensor quantized(kiln_format f, int64_t n, int64_t k, uint64_t salt)
{
    size_t db, sb;
    cr_assert_eq(kiln_format_data_bytes(f, n, k, &db), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_format_scale_bytes(f, n, k, &sb), KILN_OK, "%s", kiln_last_error());
    kt_rng rng = kt_rng_new(salt);
    float *x = malloc((size_t)(n * k) * sizeof *x);
    cr_assert_not_null(x);
    kt_fill_normal(&rng, x, (size_t)(n * k), 1.0f);
    kiln_qtensor q = { .format = f, .n = n, .k = k, .data = malloc(db), .scale = sb ? malloc(sb) : NULL };
    cr_assert_not_null(q.data);
    cr_assert_eq(kiln_quantize(x, &q), KILN_OK, "%s", kiln_last_error());
    free(x);
    return q;
}

/* The packed arrays of q; data_bytes gets their size. */
static packed pack(const kiln_qtensor *q, size_t *data_bytes)
{
    size_t db, sb;
    cr_assert_eq(kiln_gemv_pack_bytes(q->format, q->n, q->k, &db, &sb), KILN_OK, "%s",
                 kiln_last_error());
    uint8_t *data = malloc(db), *scale = malloc(sb ? sb : 1);
    cr_assert(data && scale);
    /* bytes the packer leaves unwritten show as 0xA5, not as zeros */
    memset(data, 0xA5, db);
    memset(scale, 0xA5, sb ? sb : 1);
    cr_assert_eq(kiln_gemv_pack(q, data, scale), KILN_OK, "%s", kiln_last_error());
    if (data_bytes)
        *data_bytes = db;
    return (packed){ q, data, scale };
}

static void release(packed *p, kiln_qtensor *q)
{
    free((void *)p->data);
    free((void *)p->scale);
    free(q->data);
    free(q->scale);
}

/* Every weight the model decodes against kiln_dequantize. */
static void check_decoded(const packed *p)
{
    const kiln_qtensor *q = p->q;
    const char *name = kiln_format_get(q->format)->name;
    const size_t count = (size_t)(q->n * q->k);
    float *want = malloc(count * sizeof *want), amax = 0.0f;
    cr_assert_not_null(want);
    cr_assert_eq(kiln_dequantize(q, want), KILN_OK, "%s", kiln_last_error());
    for (size_t i = 0; i < count; i++)
        if (!isnan(want[i]))
            amax = fmaxf(amax, fabsf(want[i]));
    cr_assert_gt(amax, 0.0f, "%s: all-zero weights test nothing", name);
    size_t bad = 0, first = 0;
    float first_got = 0.0f;
    for (int64_t n = 0; n < q->n; n++)
        for (int64_t k = 0; k < q->k; k++) {
            const size_t i = (size_t)(n * q->k + k);
            const float got = tc_weight(p, n, k);
            const int ok = isnan(want[i]) ? isnan(got)
                           : models[q->format].exact ? got == want[i]
                                                     : fabsf(got - want[i]) <= 1e-6f * amax;
            if (!ok && !bad++)
                first = i, first_got = got;
        }
    cr_expect_eq(bad, 0, "%s [%lld, %lld]: %zu of %zu weights differ; first (%lld, %lld): "
                 "kernel %.9g, dequantize %.9g", name, (long long)q->n, (long long)q->k, bad, count,
                 (long long)(first / (size_t)q->k), (long long)(first % (size_t)q->k), first_got,
                 want[first]);
    free(want);
}

/* ---------------------------------------------------------------- tests */

/* Row padding (40, 136, 2056 rows), several atoms and super-records, a
 * second 128-row FP8 block and a partial 128-column one (136 × 192), and
 * enough row tiles for the packer to split them over threads (2056). */
Test(gemv_pack, decodes_as_dequantize)
{
    static const int64_t shapes[][2] = { { 40, 512 }, { 16, 256 }, { 136, 192 }, { 2056, 64 } };
    for (kiln_format f = 0; f < KILN_FMT_COUNT; f++)
        for (size_t s = 0; s < KILN_ARRAY_LEN(shapes); s++) {
            if (!models[f].decode || shapes[s][1] % kiln_format_get(f)->k_multiple)
                continue;
            kiln_qtensor q = quantized(f, shapes[s][0], shapes[s][1], 16 * f + s);
            packed p = pack(&q, NULL);
            check_decoded(&p);
            release(&p, &q);
        }
}

Test(gemv_pack, bytes_refuses_what_it_cannot_pack)
{
    size_t data, scale;
    cr_expect_eq(kiln_gemv_pack_bytes(KILN_FMT_BF16, 40, 96, &data, &scale), KILN_ERR_SHAPE);
    cr_expect_eq(kiln_gemv_pack_bytes(KILN_FMT_Q8_0, 40, 32, &data, &scale), KILN_ERR_SHAPE);
    cr_expect_eq(kiln_gemv_pack_bytes(KILN_FMT_F32, 40, 512, &data, &scale), KILN_ERR_UNSUPPORTED);
    cr_assert_eq(kiln_gemv_pack_bytes(KILN_FMT_BF16, 40, 512, &data, &scale), KILN_OK, "%s",
                 kiln_last_error());
    cr_expect_eq(data, 3 * 8 * 2048u, "three row tiles of eight 2048-byte atoms");
    /* storage sizes fit, the packed ones do not */
    cr_expect_eq(kiln_gemv_pack_bytes(KILN_FMT_Q4_0, 1, (int64_t)1 << 62, &data, &scale),
                 KILN_ERR_SHAPE);
    cr_expect(strstr(kiln_last_error(), "overflows"), "%s", kiln_last_error());
}

/* A NaN block scale has no packed code: refused, naming the block. */
Test(gemv_pack, nvfp4_nan_block_scale_is_refused)
{
    for (int i = 0; i < 2; i++) {
        kiln_qtensor q = quantized(KILN_FMT_NVFP4, 40, 512, 300 + (uint64_t)i);
        ((uint8_t *)q.scale)[2 * 32 + 7] = i ? 0xFF : 0x7F; /* row 2, K 112; either sign */
        size_t db, sb;
        cr_assert_eq(kiln_gemv_pack_bytes(q.format, q.n, q.k, &db, &sb), KILN_OK);
        uint8_t *data = malloc(db), *scale = malloc(sb);
        cr_assert(data && scale);
        cr_assert_eq(kiln_gemv_pack(&q, data, scale), KILN_ERR_MALFORMED);
        cr_assert(strstr(kiln_last_error(), "block scale 71 (row 2, K 112) is NaN"), "%s",
                  kiln_last_error());
        free(data);
        free(scale);
        free(q.data);
        free(q.scale);
    }
}

/* Every finite F16 (63488 codes: both signs, subnormals, 65504) in a
 * 16 x 3968 weight decodes exactly as hi + lo. */
Test(gemv_pack, f16_every_finite_code)
{
    kiln_qtensor q = { .format = KILN_FMT_F16, .n = 16, .k = 3968 };
    uint16_t *v = malloc((size_t)(q.n * q.k) * sizeof *v);
    cr_assert_not_null(v);
    size_t i = 0;
    for (uint32_t c = 0; c < 0x10000u; c++)
        if ((c & 0x7C00u) != 0x7C00u)
            v[i++] = (uint16_t)c;
    cr_assert_eq(i, (size_t)(q.n * q.k));
    q.data = v;
    packed p = pack(&q, NULL);
    check_decoded(&p);
    cr_expect_eq(tc_weight(&p, 0, 1), kiln_f16_to_f32(0x0001), "the smallest subnormal");
    release(&p, &q);
}

/* Values the packed layout cannot carry are refused, naming the first:
 * F16 infinities and NaN, E4M3 NaN codes of either sign. */
Test(gemv_pack, unpackable_values_are_refused)
{
    static const struct {
        kiln_format f;
        uint16_t bad; /* F16 bits, or the E4M3 byte */
        const char *want;
    } cases[] = {
        { KILN_FMT_F16, 0x7C00, "f16 weight (row 3, K 70) is infinite" },
        { KILN_FMT_F16, 0xFC00, "f16 weight (row 3, K 70) is infinite" },
        { KILN_FMT_F16, 0x7E01, "f16 weight (row 3, K 70) is NaN" },
        { KILN_FMT_FP8_TENSOR, 0x7F, "fp8 weight (row 3, K 70) is NaN" },
        { KILN_FMT_FP8_CHANNEL, 0xFF, "weight (row 3, K 70) is NaN" },
        { KILN_FMT_FP8_BLOCK, 0x7F, "weight (row 3, K 70) is NaN" },
        { KILN_FMT_MXFP8, 0xFF, "mxfp8 weight (row 3, K 70) is NaN" },
    };
    for (size_t c = 0; c < KILN_ARRAY_LEN(cases); c++) {
        kiln_qtensor q = quantized(cases[c].f, 40, 512, 500 + c);
        const size_t at = 3 * 512 + 70;
        if (cases[c].f == KILN_FMT_F16)
            memcpy((uint8_t *)q.data + 2 * at, &cases[c].bad, 2); /* little-endian hosts */
        else
            ((uint8_t *)q.data)[at] = (uint8_t)cases[c].bad;
        size_t db, sb;
        cr_assert_eq(kiln_gemv_pack_bytes(q.format, q.n, q.k, &db, &sb), KILN_OK);
        uint8_t *data = malloc(db), *scale = malloc(sb ? sb : 1);
        cr_assert(data && scale);
        cr_expect_eq(kiln_gemv_pack(&q, data, scale), KILN_ERR_MALFORMED, "%s %04x",
                     kiln_format_get(q.format)->name, cases[c].bad);
        cr_expect(strstr(kiln_last_error(), cases[c].want), "%s", kiln_last_error());
        free(data);
        free(scale);
        free(q.data);
        free(q.scale);
    }
}

/* An OCP MX block scale of 255 is NaN: the kernel reads +inf times the
 * block's codes, which the packer zeroes, so every weight of the block is
 * NaN, as kiln_dequantize has it; E = 0, 2^-127, is exact, and the other
 * blocks are untouched. */
Test(gemv_pack, mx_nan_and_smallest_block_scales)
{
    static const kiln_format fs[] = { KILN_FMT_MXFP4, KILN_FMT_MXFP8 };
    for (size_t f = 0; f < KILN_ARRAY_LEN(fs); f++) {
        kiln_qtensor q = quantized(fs[f], 40, 512, 400 + f);
        uint8_t *sc = q.scale;
        sc[2 * 16 + 3] = 0xFF; /* row 2, K 96..127 */
        sc[5 * 16 + 0] = 0x00; /* row 5, K 0..31 */
        packed p = pack(&q, NULL);
        check_decoded(&p);
        for (int64_t k = 96; k < 128; k++)
            cr_expect(isnan(tc_weight(&p, 2, k)), "%s (2, %lld) is not NaN",
                      kiln_format_get(q.format)->name, (long long)k);
        cr_expect(!isnan(tc_weight(&p, 2, 95)) && !isnan(tc_weight(&p, 2, 128)));
        release(&p, &q);
    }
}

static kiln_target target(const char *name)
{
    kiln_target t;
    cr_assert_eq(kiln_target_from_name(name, &t), KILN_OK, "%s", kiln_last_error());
    return t;
}

Test(gemv_pack, tc_serves)
{
    const kiln_target sm75 = target("sm_75"), sm80 = target("sm_80"), sm90a = target("sm_90a");
    cr_expect_eq(kiln_gemv_tc_serves(&sm75, KILN_FMT_BF16, 40, 512), 0, "no BF16 mma before sm_80");
    cr_expect_eq(kiln_gemv_tc_serves(&sm80, KILN_FMT_F32, 40, 512), 0, "F32 is not exact in BF16");
    cr_expect_eq(kiln_gemv_tc_serves(&sm80, KILN_FMT_F16, 40, 512), 1, "F16 is, in two terms");
    cr_expect_eq(kiln_gemv_tc_serves(&sm80, KILN_FMT_BF16, 40, 96), 0, "K is not whole atoms");
    cr_expect_eq(kiln_gemv_tc_serves(&sm80, KILN_FMT_BF16, 40, 512), 1);
    cr_expect_eq(kiln_gemv_tc_serves(&sm90a, KILN_FMT_BF16, 40, 512), 1);
}

/* The rows of kernels/gemv/tc_format.h, which the kernel's traits are
 * built from: one for every format but F32, named by the format's short
 * name (tc.cuh's tc_layout_<name>), each atom's bytes its pieces and
 * Q6_K's high bits, and a record where the scales are not copied as
 * they are. */
#define ROW_CHECK(fmt, short_name, n_bytes, n_pieces, n_units, n_record, n_super, n_rows)          \
    {                                                                                              \
        const kiln_gemv_tc_format *row = kiln_gemv_tc_format_get(KILN_FMT_##fmt);                  \
        const int q6_k = KILN_FMT_##fmt == KILN_FMT_Q6_K;                                          \
        cr_assert_not_null(row, #fmt);                                                             \
        cr_assert_str_eq(kiln_format_get(KILN_FMT_##fmt)->name, #short_name);                      \
        cr_assert_eq(row->bytes, n_bytes, #fmt);                                                   \
        cr_assert_eq(row->bytes, 512 * row->pieces + (q6_k ? 256 : 0), #fmt);                      \
        cr_assert(row->pieces == n_pieces && row->units == n_units &&                              \
                      row->record == n_record && row->super == n_super && row->rows == n_rows,     \
                  #fmt);                                                                           \
        cr_assert(!row->rows || ((row->bytes == 2048 || row->bytes == 1024) && !row->units &&      \
                                 !row->record),                                                    \
                  #fmt);                                                                           \
        rows++;                                                                                    \
    }

Test(gemv_pack, format_rows_name_their_formats)
{
    int rows = 0;
    KILN_TC_FORMATS(ROW_CHECK)
    cr_assert_eq(rows, KILN_FMT_GGML_MXFP4, "every format to GGML MXFP4 but F32");
    cr_assert_null(kiln_gemv_tc_format_get(KILN_FMT_F32));
    cr_assert_null(kiln_gemv_tc_format_get(KILN_FMT_COUNT));
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        size_t data, scale;
        const kiln_gemv_tc_format *row = kiln_gemv_tc_format_get((kiln_format)f);
        if (!row)
            continue;
        cr_assert_eq(kiln_gemv_pack_bytes((kiln_format)f, 16, 256, &data, &scale), KILN_OK);
        cr_assert_eq(data, 4 * (size_t)row->bytes, "%s", kiln_format_get((kiln_format)f)->name);
        if (row->record)
            cr_assert_eq(scale, 4 * 8 * (size_t)row->record + 8 * (size_t)row->super, "%s",
                         kiln_format_get((kiln_format)f)->name);
    }
}

/* Where pack.h puts value (h, s) of k-tile j of a lane: the byte offsets
 * in its atom of the words holding it and the bits there (two for Q6_K:
 * low nibble and high bits). */
static int fields(field_class c, int lane, int j, int h, int s, size_t off[2], uint32_t mask[2])
{
    static const int mag_at[3] = { 6, 3, 0 };
    const int r = 2 * (s >> 1) + h, half = 16 * (s & 1);
    int word = j; /* of the lane's sixteen: piece word / 4, word % 4 of it */
    if (c == F_W16R || c == F_W8R) { /* the atom row-major: row g + 8h, column 16j + 4t + s */
        const int row = lane / 4 + 8 * h, col = 16 * j + 4 * (lane % 4) + s;
        if (c == F_W16R)
            off[0] = (size_t)(row * 128 + col / 2 * 4), mask[0] = 0xFFFFu << (16 * (col & 1));
        else /* rows 8 .. 15 swapped in pairs */
            off[0] = (size_t)((row ^ (row >> 3)) * 64 + col / 4 * 4),
            mask[0] = 0xFFu << (8 * (col & 3));
        return 1;
    }
    if (c == F_W16)
        word = 4 * j + r, mask[0] = 0xFFFFu << half;
    else if (c == F_W8)
        word = 2 * j + (s >> 1), mask[0] = 0xFFu << (8 * h + half);
    else if (c == F_E2M1)
        mask[0] = (r < 3 ? 7u << mag_at[r] | 1u << (mag_at[r] + 9) : 0x6C00u) << half;
    else
        mask[0] = 0xFu << (4 * r + half);
    off[0] = (size_t)(word / 4 * PIECE + lane * 16 + word % 4 * 4);
    if (c != F_Q6)
        return 1;
    off[1] = (size_t)(PIECE + lane * 8 + (j >> 1) * 4);
    mask[1] = 3u << (2 * ((j & 1) * 4 + r) + half);
    return 2;
}

/* Row tile 2 of a 40-row weight holds rows 32..47: its rows g + 8 are
 * padding, and the kernel decodes them as any other. */
Test(gemv_pack, padding_rows_stay_zero)
{
    for (kiln_format f = 0; f < KILN_FMT_COUNT; f++) {
        const tc_model *m = &models[f];
        if (!m->decode)
            continue;
        kiln_qtensor q = quantized(f, 40, 256, 100 + f);
        size_t bytes, set = 0, off[2];
        uint32_t mask[2];
        packed p = pack(&q, &bytes);
        cr_assert_eq(bytes, 3 * 4 * (size_t)m->atom_bytes, "3 row tiles of 4 atoms");
        for (int a = 0; a < 4; a++) {
            const uint8_t *atom = p.data + (size_t)(2 * 4 + a) * (size_t)m->atom_bytes;
            for (int lane = 0; lane < 32; lane++)
                for (int j = 0; j < 4; j++)
                    for (int s = 0; s < 4; s++)
                        for (int i = fields(m->field, lane, j, 1, s, off, mask); i-- > 0;)
                            set += (le32(atom + off[i]) & mask[i]) != 0;
        }
        cr_expect_eq(set, 0, "%s: %zu fields of padding rows 40..47 are not zero",
                     kiln_format_get(f)->name, set);
        release(&p, &q);
    }
}

/* pack.c's NVFP4 rule: the record holds the block scale's magnitude, so a
 * negative scale's sign moves into its block's codes and a zero scale's
 * block gets zero codes (the record's 0 decodes to 2^-17, not zero). */
Test(gemv_pack, nvfp4_zero_and_negative_block_scales)
{
    kiln_qtensor q = quantized(KILN_FMT_NVFP4, 40, 512, 200);
    uint8_t *sc = q.scale;
    const uint8_t *codes = q.data;
    const size_t zero_block = 3 * 32 + 5, neg_block = 29 * 32 + 17; /* rows 3 (a g), 29 (a g + 8) */
    for (size_t b = 0; b < 2; b++) {
        const size_t blk = b ? neg_block : zero_block;
        size_t nonzero = 0;
        for (int i = 0; i < 8; i++)
            nonzero += (codes[blk * 8 + (size_t)i] & 0x77) != 0;
        cr_assert_gt(nonzero, 0, "block %zu has only zero codes: the edit tests nothing", blk);
        cr_assert_eq(sc[blk] & 0x80, 0, "quantize gives positive block scales");
    }
    sc[zero_block] = 0x00;
    sc[neg_block] |= 0x80;
    packed p = pack(&q, NULL);
    check_decoded(&p);
    const int64_t n = (int64_t)(zero_block * 16) / q.k, k0 = (int64_t)(zero_block * 16) % q.k;
    for (int64_t k = k0; k < k0 + 16; k++)
        cr_expect_eq(tc_weight(&p, n, k), 0.0f, "zero-scale block, (%lld, %lld)", (long long)n,
                     (long long)k);
    release(&p, &q);
}

/* ------------------------------------------------- the device packers */

/* The device packer of every format with a packed layout compiles with
 * NVRTC for the oldest and the newest architecture gemv_tc serves; a
 * format without one is refused by name before NVRTC sees it. Whether it
 * writes the host packer's bytes is tests/gpu/test_pack.c's question. */
Test(gemv_pack, device_packers_compile, .timeout = 600)
{
    static const char *const arches[] = { "sm_80", "sm_90a" };
    kt_batch b = { 0 };
    for (size_t a = 0; a < KILN_ARRAY_LEN(arches); a++)
        for (int f = 0; f < KILN_FMT_COUNT; f++) {
            char sig[128];
            snprintf(sig, sizeof sig, "pack format=%s target=%s",
                     kiln_format_get((kiln_format)f)->name, arches[a]);
            if (kiln_gemv_tc_format_get((kiln_format)f)) {
                kt_batch_add(&b, sig);
                continue;
            }
            kiln_kernel_source src;
            cr_assert_eq(kiln_emit_text(kiln_registry_default(), sig, &src),
                         KILN_ERR_UNSUPPORTED, "%s", sig);
            cr_assert(strstr(kiln_last_error(), "has no packed layout"), "%s",
                      kiln_last_error());
        }
    kt_batch_compile(&b, "device packers");
}
