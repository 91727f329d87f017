/* The gemv_tc backend's weight packing (pack.h): codes and scales read from
 * kiln's storage layout (FORMATS.md) and written where the tensor-core
 * kernel's lanes load them. */
#include "kernels/gemv/pack.h"
#include "kernels/gemv/tc_format.h"

#include "graph/quant.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TILE = 16, ATOM = 64, LANES = 32, QK_K = 256 };

/* How a format's codes sit in a lane's words (tc.cuh). */
typedef enum pack_class {
    PACK_W16,  /* BF16, F16: word 4j + r, half at bit 16·half */
    PACK_W8,   /* a byte a value: word 2j + (s >> 1), byte h + 2·(s & 1) */
    PACK_INT4, /* a nibble: word j, nibble r + 4·half */
    PACK_E2M1, /* word j, the magnitude and sign where decode_e2m1 finds them */
    PACK_Q6,   /* low nibble as PACK_INT4, high 2 bits in the lane's qh words */
} pack_class;

/* Scale records a lane group reads per atom. */
typedef enum pack_record {
    REC_NATIVE, /* none packed: the storage layout's scale array, copied */
    REC_E8M0,   /* 4 bytes: (g, 0), (g, 1), (g + 8, 0), (g + 8, 1) per 32 */
    REC_F16,    /* 8 bytes: f16 of the same four */
    REC_E4M3,   /* 8 bytes: (g, 0..3), (g + 8, 0..3) per 16, as nvfp4_scale_code */
    REC_Q4_K,   /* 8 bytes + super-record 8 */
    REC_Q6_K,   /* 8 bytes + super-record 4 */
} pack_record;

/* The codes of row n at k0 .. k0 + 63 (k0 a multiple of 64), as the class
 * stores them: one atom's share of the row, read in storage order. */
typedef void (*atom_codes_fn)(const kiln_qtensor *q, int64_t n, int64_t k0, uint16_t *out);

/* How a format's codes and scales are read and placed; its atom's sizes
 * are its row of layouts. */
typedef struct pack_format {
    pack_class cls;
    pack_record rec;
    atom_codes_fn codes;
} pack_format;

static size_t at(const kiln_qtensor *q, int64_t n, int64_t k)
{
    return (size_t)n * (size_t)q->k + (size_t)k;
}

static const uint8_t *ggml_block(const kiln_qtensor *q, int64_t n, int64_t k, int block, int bytes)
{
    return (const uint8_t *)q->data + at(q, n, k) / (size_t)block * (size_t)bytes;
}

static void codes_w16(const kiln_qtensor *q, int64_t n, int64_t k0, uint16_t *out)
{
    const uint8_t *p = (const uint8_t *)q->data + 2 * at(q, n, k0);
    for (int i = 0; i < ATOM; i++)
        out[i] = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
}

static void codes_byte(const kiln_qtensor *q, int64_t n, int64_t k0, uint16_t *out)
{
    const uint8_t *p = (const uint8_t *)q->data + at(q, n, k0);
    for (int i = 0; i < ATOM; i++)
        out[i] = p[i];
}

/* The even element in the low nibble (MXFP4, NVFP4). */
static void codes_fp4(const kiln_qtensor *q, int64_t n, int64_t k0, uint16_t *out)
{
    const uint8_t *p = (const uint8_t *)q->data + at(q, n, k0) / 2;
    for (int i = 0; i < ATOM / 2; i++)
        out[2 * i] = p[i] & 0xF, out[2 * i + 1] = p[i] >> 4;
}

/* An OCP MX block whose E8M0 scale is 255 (NaN) gets zero codes: tc.cuh
 * decodes that scale as +inf (e8m0_byte), and inf · 0 is the NaN the
 * block's weights are. */
static void codes_nan_blocks(const kiln_qtensor *q, int64_t n, int64_t k0, uint16_t *out)
{
    const uint8_t *sc = (const uint8_t *)q->scale + at(q, n, k0) / 32;
    for (int b = 0; b < ATOM / 32; b++)
        if (sc[b] == 0xFF)
            for (int i = 32 * b; i < 32 * b + 32; i++)
                out[i] = 0;
}

static void codes_mxfp8(const kiln_qtensor *q, int64_t n, int64_t k0, uint16_t *out)
{
    codes_byte(q, n, k0, out);
    codes_nan_blocks(q, n, k0, out);
}

static void codes_mxfp4(const kiln_qtensor *q, int64_t n, int64_t k0, uint16_t *out)
{
    codes_fp4(q, n, k0, out);
    codes_nan_blocks(q, n, k0, out);
}

/* NVFP4's block scale is packed as a positive magnitude (nvfp4_scale_code):
 * a negative one's sign moves into its block's codes, and a zero one's
 * block gets zero codes, which is what w = e2m1 · scale makes them. */
static void codes_nvfp4(const kiln_qtensor *q, int64_t n, int64_t k0, uint16_t *out)
{
    codes_fp4(q, n, k0, out);
    const uint8_t *sc = (const uint8_t *)q->scale + at(q, n, k0) / 16;
    for (int b = 0; b < ATOM / 16; b++) {
        const float s = kiln_e4m3_to_f32(sc[b]);
        for (int i = 16 * b; i < 16 * b + 16; i++)
            out[i] = s == 0.0f ? 0 : s < 0.0f ? out[i] ^ 8u : out[i];
    }
}

/* The scale as tc.cuh's tc_nvfp4 decodes it: f32 bits >> 20 (exponent and
 * three mantissa bits, exact for every E4M3 magnitude, subnormals
 * normalized) less 110 << 3, in 64..207. Zero for a zero scale, whose
 * block's codes are zero. kiln_gemv_pack refuses NaN scales first. */
static uint8_t nvfp4_scale_code(uint8_t e4m3)
{
    const float s = fabsf(kiln_e4m3_to_f32(e4m3));
    if (!(s > 0.0f))
        return 0;
    uint32_t u;
    memcpy(&u, &s, sizeof u);
    return (uint8_t)((u >> 20) - (110u << 3));
}

/* GGML's 32-value blocks of `bytes` with the codes at `skip`: element
 * j < 16 is the low nibble of qs[j], j + 16 its high nibble. */
static void codes_split_nibbles(const kiln_qtensor *q, int64_t n, int64_t k0, int bytes, int skip,
                                uint16_t *out)
{
    for (int b = 0; b < ATOM / 32; b++) {
        const uint8_t *qs = ggml_block(q, n, k0 + 32 * b, 32, bytes) + skip;
        for (int j = 0; j < 16; j++)
            out[32 * b + j] = qs[j] & 0xF, out[32 * b + 16 + j] = qs[j] >> 4;
    }
}

static void codes_q4_0(const kiln_qtensor *q, int64_t n, int64_t k0, uint16_t *out)
{
    codes_split_nibbles(q, n, k0, 18, 2, out);
}

static void codes_ggml_mxfp4(const kiln_qtensor *q, int64_t n, int64_t k0, uint16_t *out)
{
    codes_split_nibbles(q, n, k0, 17, 1, out);
}

static void codes_q8_0(const kiln_qtensor *q, int64_t n, int64_t k0, uint16_t *out)
{
    for (int b = 0; b < ATOM / 32; b++) {
        const uint8_t *qs = ggml_block(q, n, k0 + 32 * b, 32, 34) + 2;
        for (int j = 0; j < 32; j++)
            out[32 * b + j] = qs[j] ^ 0x80u; /* q + 128 */
    }
}

/* Each 64 values of a Q4_K block use 32 bytes of qs: low nibbles first. */
static void codes_q4_k(const kiln_qtensor *q, int64_t n, int64_t k0, uint16_t *out)
{
    const uint8_t *qs = ggml_block(q, n, k0, QK_K, 144) + 16 + k0 % QK_K / 64 * 32;
    for (int l = 0; l < 32; l++)
        out[l] = qs[l] & 0xF, out[32 + l] = qs[l] >> 4;
}

/* The 6-bit code: quarter c of a 128-value half takes the low (c < 2) or
 * high nibble of ql[l] (c even) or ql[l + 32] (c odd), and bits 2c, 2c + 1
 * of qh[l]. An atom is two quarters of one half. */
static void codes_q6_k(const kiln_qtensor *q, int64_t n, int64_t k0, uint16_t *out)
{
    const uint8_t *y = ggml_block(q, n, k0, QK_K, 210);
    const int64_t p = k0 % QK_K, half = p / 128, c0 = p % 128 / 32;
    const uint8_t *ql = y + half * 64, *qh = y + 128 + half * 32;
    for (int cc = 0; cc < 2; cc++) {
        const int c = (int)c0 + cc;
        for (int l = 0; l < 32; l++) {
            const uint8_t b = ql[l + (c & 1) * 32];
            const unsigned lo = c < 2 ? b & 0xFu : (unsigned)b >> 4;
            out[32 * cc + l] = (uint16_t)(lo | ((qh[l] >> (2 * c)) & 3u) << 4);
        }
    }
}

static const pack_format formats[] = {
    [KILN_FMT_F32] = { 0 },
    [KILN_FMT_F16] = { PACK_W16, REC_NATIVE, codes_w16 },
    [KILN_FMT_BF16] = { PACK_W16, REC_NATIVE, codes_w16 },
    [KILN_FMT_FP8_TENSOR] = { PACK_W8, REC_NATIVE, codes_byte },
    [KILN_FMT_FP8_CHANNEL] = { PACK_W8, REC_NATIVE, codes_byte },
    [KILN_FMT_FP8_BLOCK] = { PACK_W8, REC_NATIVE, codes_byte },
    [KILN_FMT_MXFP8] = { PACK_W8, REC_E8M0, codes_mxfp8 },
    [KILN_FMT_NVFP4] = { PACK_E2M1, REC_E4M3, codes_nvfp4 },
    [KILN_FMT_MXFP4] = { PACK_E2M1, REC_E8M0, codes_mxfp4 },
    [KILN_FMT_Q8_0] = { PACK_W8, REC_F16, codes_q8_0 },
    [KILN_FMT_Q4_0] = { PACK_INT4, REC_F16, codes_q4_0 },
    [KILN_FMT_Q4_K] = { PACK_INT4, REC_Q4_K, codes_q4_k },
    [KILN_FMT_Q6_K] = { PACK_Q6, REC_Q6_K, codes_q6_k },
    [KILN_FMT_GGML_MXFP4] = { PACK_E2M1, REC_E8M0, codes_ggml_mxfp4 },
    [KILN_FMT_Q5_0] = { 0 },
    [KILN_FMT_Q5_1] = { 0 },
    [KILN_FMT_Q2_K] = { 0 },
    [KILN_FMT_Q3_K] = { 0 },
    [KILN_FMT_Q5_K] = { 0 },
    [KILN_FMT_IQ4_NL] = { 0 },
    [KILN_FMT_IQ4_XS] = { 0 },
    [KILN_FMT_Q4_1] = { 0 },
    [KILN_FMT_INT4_GROUP] = { 0 },
    [KILN_FMT_INT4_GROUP_ZP] = { 0 },
    [KILN_FMT_INT8_GROUP] = { 0 },
    [KILN_FMT_INT8_GROUP_ZP] = { 0 },
};
_Static_assert(KILN_ARRAY_LEN(formats) == KILN_FMT_COUNT, "one row per format");

/* Each atom's sizes, as the kernel reads them (tc_format.h); bytes 0: no
 * packed layout. */
#define LAYOUT_ROW(fmt, name, bytes, pieces, units, record, super)                              \
    [KILN_FMT_##fmt] = { bytes, pieces, units, record, super },
static const kiln_gemv_tc_format layouts[KILN_FMT_COUNT] = { KILN_TC_FORMATS(LAYOUT_ROW) };
#undef LAYOUT_ROW
#define LAYOUT_COUNT(...) +1
/* Every format up to GGML MXFP4 but F32; the GGML formats after it have no
 * packed layout yet. */
_Static_assert(0 KILN_TC_FORMATS(LAYOUT_COUNT) == KILN_FMT_GGML_MXFP4,
               "every format to GGML MXFP4 but F32");
#undef LAYOUT_COUNT

const kiln_gemv_tc_format *kiln_gemv_tc_format_get(kiln_format f)
{
    return (unsigned)f < KILN_FMT_COUNT && layouts[f].bytes ? &layouts[f] : NULL;
}

int kiln_gemv_tc_refuses(const kiln_target *t, kiln_format f, int64_t n, int64_t k, char *why,
                         size_t size)
{
    const kiln_format_info *fi = kiln_format_get(f);
    if (t->sm < KILN_GEMV_TC_MIN_SM)
        snprintf(why, size, "needs sm_%d or newer (bf16 mma.sync), target is %s",
                 KILN_GEMV_TC_MIN_SM, t->name);
    else if (!fi)
        snprintf(why, size, "format %d is not a kiln_format", (int)f);
    else if (!layouts[f].bytes)
        snprintf(why, size, "%s values are not exact in bf16", fi->name);
    else if (n <= 0 || k <= 0)
        snprintf(why, size, "N=%lld, K=%lld: both must be positive", (long long)n, (long long)k);
    else if (k % ATOM)
        snprintf(why, size, "K=%lld is not a multiple of %d, the packed layout's atoms",
                 (long long)k, ATOM);
    /* the kernel indexes rows, and a row tile's packed bytes, with ints */
    else if (n > INT_MAX - TILE || k / ATOM > INT_MAX / layouts[f].bytes)
        snprintf(why, size,
                 "N=%lld, K=%lld: N and a 16-row tile's packed bytes must be below 2^31",
                 (long long)n, (long long)k);
    else
        return 0;
    return 1;
}

int kiln_gemv_tc_serves(const kiln_target *t, kiln_format f, int64_t n, int64_t k)
{
    return !kiln_gemv_tc_refuses(t, f, n, k, NULL, 0);
}

kiln_status kiln_gemv_pack_bytes(kiln_format f, int64_t n, int64_t k, size_t *data, size_t *scale)
{
    const kiln_gemv_tc_format *lay = kiln_gemv_tc_format_get(f);
    if (!lay)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gemv_tc pack: format %d has no packed layout",
                         (int)f);
    if (n <= 0 || k <= 0 || k % ATOM)
        return kiln_fail(KILN_ERR_SHAPE,
                         "gemv_tc pack: [%lld, %lld]: K must be a positive multiple of %d",
                         (long long)n, (long long)k, ATOM);
    size_t atoms, rec, sup = 0;
    kiln_status st = kiln_format_data_bytes(f, n, k, data);
    if (st != KILN_OK)
        return st;
    if (!kiln_mul_size((size_t)kiln_ceil_div(n, TILE), (size_t)(k / ATOM), &atoms) ||
        !kiln_mul_size(atoms, (size_t)lay->bytes, data))
        return kiln_fail(KILN_ERR_SHAPE, "gemv_tc pack: [%lld, %lld] overflows", (long long)n,
                         (long long)k);
    if (!lay->record)
        return kiln_format_scale_bytes(f, n, k, scale);
    if (!kiln_mul_size(atoms, 8 * (size_t)lay->record, &rec) ||
        !kiln_mul_size(atoms / 4, 8 * (size_t)lay->super, &sup) ||
        !kiln_add_size(rec, sup, scale))
        return kiln_fail(KILN_ERR_SHAPE, "gemv_tc pack: [%lld, %lld] overflows", (long long)n,
                         (long long)k);
    return KILN_OK;
}

/* Where one of a lane's 32 values of an atom goes: value (h, s) of k-tile
 * j comes from row g + 8h, column 16j + 4t + s of the atom, and sits in
 * register r = 2(s >> 1) + h, half s & 1 (pack.h). */
typedef struct pack_slot {
    uint8_t row, col;
    uint8_t word, shift; /* the code's bits in the lane's data words */
    uint8_t reg;         /* E2M1: which register's bit placement */
    uint8_t qh_word, qh_shift; /* Q6_K: the high two bits */
} pack_slot;

static pack_slot slot_of(pack_class cls, int t, int g, int j, int h, int s)
{
    const int r = 2 * (s >> 1) + h, half = s & 1;
    pack_slot o = {
        .row = (uint8_t)(g + 8 * h), .col = (uint8_t)(16 * j + 4 * t + s), .reg = (uint8_t)r
    };
    switch (cls) {
    case PACK_W16:
        o.word = (uint8_t)(4 * j + r), o.shift = (uint8_t)(16 * half);
        break;
    case PACK_W8:
        o.word = (uint8_t)(2 * j + (s >> 1)), o.shift = (uint8_t)(8 * (h + 2 * half));
        break;
    case PACK_INT4:
    case PACK_Q6:
        o.word = (uint8_t)j, o.shift = (uint8_t)(4 * (r + 4 * half));
        o.qh_word = (uint8_t)(j >> 1), o.qh_shift = (uint8_t)(2 * ((j & 1) * 4 + r) + 16 * half);
        break;
    case PACK_E2M1:
        o.word = (uint8_t)j, o.shift = (uint8_t)(16 * half);
        break;
    }
    return o;
}

/* E2M1 code c as register r's bits in the low half of a word: magnitude at
 * 6, 3, 0 with the sign 9 above (registers 0..2); register 3: magnitude >> 1
 * at 10, its low bit at 13, the sign at 14 (decode_e2m1 in tc.cuh). */
static uint32_t e2m1_bits(int r, unsigned code)
{
    static const int mag_at[3] = { 6, 3, 0 };
    const uint32_t c = code & 7, sign = (code >> 3) & 1;
    return r < 3 ? c << mag_at[r] | sign << (mag_at[r] + 9)
                 : (c >> 1) << 10 | (c & 1) << 13 | sign << 14;
}

static void store_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Row tiles [r0, r1) of the data array: each atom's 16 row runs of codes
 * are read in storage order, then scattered into the lanes' words. */
static void pack_data(const kiln_qtensor *q, const pack_format *pf,
                      const kiln_gemv_tc_format *lay, uint8_t *out, int64_t r0, int64_t r1)
{
    const int64_t atoms = q->k / ATOM;
    const int pieces = lay->pieces;
    const uint32_t mask = pf->cls == PACK_W16 ? 0xFFFF : pf->cls == PACK_W8 ? 0xFF : 0xF;
    pack_slot slots[LANES][32];
    uint32_t e2m1[4][16];
    for (int l = 0; l < LANES; l++)
        for (int e = 0; e < 32; e++)
            slots[l][e] = slot_of(pf->cls, l % 4, l / 4, e / 8, e / 4 % 2, e % 4);
    for (int r = 0; r < 4; r++)
        for (unsigned c = 0; c < 16; c++)
            e2m1[r][c] = e2m1_bits(r, c);
    uint16_t codes[TILE][ATOM];
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t a = 0; a < atoms; a++) {
            for (int i = 0; i < TILE; i++) {
                if (r * TILE + i < q->n)
                    pf->codes(q, r * TILE + i, a * ATOM, codes[i]);
                else
                    memset(codes[i], 0, sizeof codes[i]);
            }
            uint8_t *atom = out + (size_t)(r * atoms + a) * (size_t)lay->bytes;
            for (int l = 0; l < LANES; l++) {
                uint32_t w[16] = { 0 }, qh[2] = { 0 };
                const pack_slot *sl = slots[l];
                if (pf->cls == PACK_E2M1) {
                    for (int e = 0; e < 32; e++)
                        w[sl[e].word] |= e2m1[sl[e].reg][codes[sl[e].row][sl[e].col] & 0xF]
                                         << sl[e].shift;
                } else {
                    for (int e = 0; e < 32; e++)
                        w[sl[e].word] |= (codes[sl[e].row][sl[e].col] & mask) << sl[e].shift;
                }
                if (pf->cls == PACK_Q6)
                    for (int e = 0; e < 32; e++)
                        qh[sl[e].qh_word] |= (uint32_t)((codes[sl[e].row][sl[e].col] >> 4) & 3)
                                             << sl[e].qh_shift;
                for (int p = 0; p < pieces; p++)
                    for (int i = 0; i < 4; i++)
                        store_le32(atom + p * 512 + l * 16 + 4 * i, w[4 * p + i]);
                if (pf->cls == PACK_Q6)
                    for (int i = 0; i < 2; i++)
                        store_le32(atom + 512 + l * 8 + 4 * i, qh[i]);
            }
        }
    }
}

/* The scales of rows n (both halves of a record) for atom a, as bytes. */
static void record_of(const kiln_qtensor *q, pack_record rec, int64_t n, int64_t a, uint8_t *out)
{
    const uint8_t *sc = q->scale;
    switch (rec) {
    case REC_E8M0: /* GGML's MXFP4 keeps its E8M0 at the head of each block */
        for (int b = 0; b < 2; b++)
            out[b] = q->format == KILN_FMT_GGML_MXFP4
                         ? ggml_block(q, n, a * ATOM + 32 * b, 32, 17)[0]
                         : sc[at(q, n, a * ATOM + 32 * b) / 32];
        break;
    case REC_E4M3:
        for (int b = 0; b < 4; b++)
            out[b] = nvfp4_scale_code(sc[at(q, n, a * ATOM + 16 * b) / 16]);
        break;
    case REC_F16: {
        const int bytes = q->format == KILN_FMT_Q8_0 ? 34 : 18;
        for (int b = 0; b < 2; b++)
            memcpy(out + 2 * b, ggml_block(q, n, a * ATOM + 32 * b, 32, bytes), 2);
        break;
    }
    case REC_Q4_K: {
        const uint8_t *y = ggml_block(q, n, a * ATOM, QK_K, 144);
        for (int b = 0; b < 2; b++)
            kiln_quant_q4_k_scale_min((int)(a % 4) * 2 + b, y + 4, &out[b], &out[2 + b]);
        break;
    }
    case REC_Q6_K: { /* the int8 scales as s + 128 */
        const uint8_t *y = ggml_block(q, n, a * ATOM, QK_K, 210);
        for (int b = 0; b < 4; b++)
            out[b] = y[192 + (a % 4) * 4 + b] ^ 0x80u;
        break;
    }
    case REC_NATIVE:
        break;
    }
}

/* Row tiles [r0, r1) of the scale records. */
static void pack_scales(const kiln_qtensor *q, const pack_format *pf,
                        const kiln_gemv_tc_format *lay, uint8_t *out, int64_t r0, int64_t r1)
{
    const int64_t tiles = kiln_ceil_div(q->n, TILE), atoms = q->k / ATOM;
    const int rb = lay->record, half = rb / 2;
    uint8_t *super = out + (size_t)(tiles * atoms) * 8 * (size_t)rb;
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t a = 0; a < atoms; a++) {
            uint8_t *rec = out + (size_t)(r * atoms + a) * 8 * (size_t)rb;
            for (int g = 0; g < 8; g++) {
                for (int h = 0; h < 2; h++) {
                    const int64_t n = r * TILE + g + 8 * h;
                    uint8_t bytes[4] = { 0 };
                    if (n < q->n)
                        record_of(q, pf->rec, n, a, bytes);
                    /* E8M0 interleaves the rows by byte pairs; the others
                     * put row g + 8 in the record's second half. */
                    if (pf->rec == REC_E8M0)
                        memcpy(rec + g * rb + 2 * h, bytes, 2);
                    else
                        memcpy(rec + g * rb + half * h, bytes, (size_t)half);
                }
            }
            if (a % 4 || !lay->super)
                continue;
            const int sb = lay->super;
            uint8_t *srec = super + (size_t)(r * (atoms / 4) + a / 4) * 8 * (size_t)sb;
            for (int g = 0; g < 8; g++)
                for (int h = 0; h < 2; h++) {
                    const int64_t n = r * TILE + g + 8 * h;
                    uint8_t *dst = srec + g * sb + (sb / 2) * h;
                    memset(dst, 0, (size_t)sb / 2);
                    if (n >= q->n)
                        continue;
                    const uint8_t *y = pf->rec == REC_Q4_K
                                           ? ggml_block(q, n, a * ATOM, QK_K, 144)
                                           : ggml_block(q, n, a * ATOM, QK_K, 210) + 208;
                    memcpy(dst, y, (size_t)sb / 2); /* Q4_K: d, dmin; Q6_K: d */
                }
        }
    }
}

/* One thread's share: row tiles [r0, r1). */
typedef struct pack_job {
    const kiln_qtensor *q;
    const pack_format *pf;
    const kiln_gemv_tc_format *lay;
    uint8_t *data, *scale;
    int64_t r0, r1;
} pack_job;

static void *pack_run(void *arg)
{
    const pack_job *j = arg;
    pack_data(j->q, j->pf, j->lay, j->data, j->r0, j->r1);
    if (j->lay->record)
        pack_scales(j->q, j->pf, j->lay, j->scale, j->r0, j->r1);
    return NULL;
}

enum { PACK_MAX_THREADS = 32, PACK_TILES_PER_THREAD = 64 };

/* Values the packed layout cannot carry, refused rather than changed: an
 * NVFP4 NaN block scale (its packed code has no NaN), an E4M3 NaN code
 * (s.1111.111: decode_e4m3_word reads 480 · 2^e), and an F16 infinity or
 * NaN (tc_f16 reads exponent 31 as 2^16). The error names the first. */
static kiln_status refuse_unpackable(const kiln_qtensor *q)
{
    const size_t count = (size_t)q->n * (size_t)q->k, k = (size_t)q->k;
    const uint8_t *b = q->data;
    switch (q->format) {
    case KILN_FMT_NVFP4: {
        const uint8_t *sc = q->scale;
        for (size_t i = 0; i < count / 16; i++)
            if ((sc[i] & 0x7F) == 0x7F)
                return kiln_fail(KILN_ERR_MALFORMED,
                                 "gemv_tc pack: NVFP4 block scale %zu (row %zu, K %zu) is NaN", i,
                                 i / (k / 16), i % (k / 16) * 16);
        return KILN_OK;
    }
    case KILN_FMT_FP8_TENSOR:
    case KILN_FMT_FP8_CHANNEL:
    case KILN_FMT_FP8_BLOCK:
    case KILN_FMT_MXFP8:
        for (size_t i = 0; i < count; i++)
            if ((b[i] & 0x7F) == 0x7F)
                return kiln_fail(KILN_ERR_MALFORMED,
                                 "gemv_tc pack: %s weight (row %zu, K %zu) is NaN, which the "
                                 "tensor-core kernel cannot carry",
                                 kiln_format_get(q->format)->name, i / k, i % k);
        return KILN_OK;
    case KILN_FMT_F16:
        for (size_t i = 0; i < count; i++)
            if ((b[2 * i + 1] & 0x7C) == 0x7C)
                return kiln_fail(KILN_ERR_MALFORMED,
                                 "gemv_tc pack: f16 weight (row %zu, K %zu) is %s, which the "
                                 "tensor-core kernel cannot carry",
                                 i / k, i % k,
                                 (b[2 * i + 1] & 0x03) || b[2 * i] ? "NaN" : "infinite");
        return KILN_OK;
    default:
        return KILN_OK;
    }
}

kiln_status kiln_gemv_pack(const kiln_qtensor *src, void *data, void *scale)
{
    size_t data_bytes, scale_bytes;
    kiln_status st = kiln_gemv_pack_bytes(src->format, src->n, src->k, &data_bytes, &scale_bytes);
    if (st != KILN_OK)
        return st;
    const pack_format *pf = &formats[src->format];
    const kiln_gemv_tc_format *lay = kiln_gemv_tc_format_get(src->format);
    assert(pf->codes && lay);
    st = refuse_unpackable(src);
    if (st != KILN_OK)
        return st;
    memset(data, 0, data_bytes);
    if (!lay->record) {
        if (scale_bytes)
            memcpy(scale, src->scale, scale_bytes);
    } else {
        memset(scale, 0, scale_bytes);
    }
    /* Row tiles are independent: split them over the cores, a big weight
     * (a model's head) takes seconds on one. A thread that cannot start
     * leaves its share to this one. */
    const int64_t tiles = kiln_ceil_div(src->n, TILE);
    int64_t threads = kiln_cpu_count();
    if (threads > PACK_MAX_THREADS)
        threads = PACK_MAX_THREADS;
    if (threads > tiles / PACK_TILES_PER_THREAD)
        threads = tiles / PACK_TILES_PER_THREAD;
    if (threads < 1)
        threads = 1;
    pack_job jobs[PACK_MAX_THREADS];
    pthread_t tid[PACK_MAX_THREADS];
    int started[PACK_MAX_THREADS] = { 0 };
    for (int64_t i = 0; i < threads; i++) {
        jobs[i] = (pack_job){ src, pf, lay, data, scale, tiles * i / threads,
                              tiles * (i + 1) / threads };
        if (i > 0)
            started[i] = pthread_create(&tid[i], NULL, pack_run, &jobs[i]) == 0;
    }
    pack_run(&jobs[0]);
    for (int64_t i = 1; i < threads; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        else
            pack_run(&jobs[i]);
    }
    return KILN_OK;
}
