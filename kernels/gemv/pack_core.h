/* The gemv_tc packed layout (pack.h), byte by byte: one text for the host
 * packer (kernels/gemv/pack.c) and the device packer (kiln/pack.cuh, a
 * kernel per format, compiled and cached like any other), so that the two
 * write the same bytes by construction; the tests compare them all the
 * same. Valid C11 and CUDA, with no includes: embedded for NVRTC as
 * "kiln/pack_core.h".
 *
 * Every function computes a piece of the layout from the weight in kiln's
 * storage layout (FORMATS.md) alone: a lane's words of an atom, a lane
 * group's scale record, a value the layout cannot carry. */
#ifndef KILN_PACK_CORE_H
#define KILN_PACK_CORE_H

#ifdef __CUDACC__
#define KP_FN static __device__ __forceinline__
#define KP_UNROLL _Pragma("unroll")
#else
#define KP_FN static inline
#define KP_UNROLL
#endif

typedef unsigned char kp_u8;
typedef unsigned int kp_u32;
typedef long long kp_i64;

enum { KP_TILE = 16, KP_ATOM = 64, KP_QK_K = 256 };

/* How a format's codes sit in a lane's words (tc.cuh). */
enum {
    KP_W16,  /* BF16, F16: word 4j + r, half at bit 16·half */
    KP_W8,   /* a byte a value: word 2j + (s >> 1), byte h + 2·(s & 1) */
    KP_INT4, /* a nibble: word j, nibble r + 4·half */
    KP_E2M1, /* word j, the magnitude and sign where decode_e2m1 finds them */
    KP_Q6,   /* low nibble as KP_INT4, high 2 bits in the lane's qh words */
    KP_W16R, /* BF16: the atom row-major, word w: row 4(w >> 2) + l / 8, values
              * 8(l % 8) + 2(w & 3), + 1 (tc_rows) */
    KP_W8R,  /* FP8: the atom row-major, word w: row R = 8(w >> 2) + l / 4 (rows
              * 8 .. 15 swapped in pairs: R ^ 1), values 16(l % 4) + 4(w & 3)
              * .. + 3 (tc_rows) */
};

/* Scale records a lane group reads per atom. */
enum {
    KP_REC_NATIVE, /* none packed: the storage layout's scale array, copied */
    KP_REC_E8M0,   /* 4 bytes: (g, 0), (g, 1), (g + 8, 0), (g + 8, 1) per 32 */
    KP_REC_F16,    /* 8 bytes: f16 of the same four */
    KP_REC_E4M3,   /* 8 bytes: (g, 0..3), (g + 8, 0..3) per 16, as kp_nvfp4_scale_code */
    KP_REC_Q4_K,   /* 8 bytes + super-record 8 */
    KP_REC_Q6_K,   /* 8 bytes + super-record 4 */
};

/* Where a format's codes are in kiln's storage layout. */
enum {
    KP_CODES_W16,        /* two bytes a value */
    KP_CODES_BYTE,       /* a byte a value */
    KP_CODES_MXFP8,      /* a byte a value, a NaN block's zero */
    KP_CODES_NVFP4,      /* nibbles, even value low; the block scale's sign folded in */
    KP_CODES_MXFP4,      /* nibbles, a NaN block's zero */
    KP_CODES_Q8_0,       /* GGML blocks of 34 bytes, as q + 128 */
    KP_CODES_Q4_0,       /* GGML blocks of 18 bytes, split nibbles */
    KP_CODES_GGML_MXFP4, /* GGML blocks of 17 bytes, split nibbles */
    KP_CODES_Q4_K,       /* 144-byte super-blocks */
    KP_CODES_Q6_K,       /* 210-byte super-blocks */
};

/* The values a layout cannot carry, refused rather than changed. */
enum {
    KP_CHECK_NONE,
    KP_CHECK_F16,   /* an F16 infinity or NaN (tc_f16 reads exponent 31 as 2^16) */
    KP_CHECK_E4M3,  /* an E4M3 NaN code (decode_e4m3_word reads s.1111.111 as 480 · 2^e) */
    KP_CHECK_NVFP4, /* an NVFP4 NaN block scale (its packed code has no NaN) */
};

/* A format's way through the packer and its atom's sizes (tc_format.h). */
typedef struct kp_format {
    int cls, rec, codes, check;
    int bytes, pieces, record, super;
} kp_format;

/* A weight [n, k] in kiln's storage layout. */
typedef struct kp_src {
    const kp_u8 *data, *scale;
    kp_i64 n, k;
} kp_src;

KP_FN kp_i64 kp_at(const kp_src *q, kp_i64 n, kp_i64 k)
{
    return n * q->k + k;
}

/* The GGML block of `block` values and `bytes` bytes holding (n, k). */
KP_FN const kp_u8 *kp_block(const kp_src *q, kp_i64 n, kp_i64 k, int block, int bytes)
{
    return q->data + kp_at(q, n, k) / block * bytes;
}

/* The code of value (n, k) as its class stores it. An OCP MX block whose
 * E8M0 scale is 255 (NaN) gets zero codes: tc.cuh decodes that scale as
 * +inf, and inf · 0 is the NaN the block's weights are. NVFP4's block
 * scale is packed as a magnitude: a negative one's sign moves into its
 * block's codes, a zero one's block gets zero codes, which is what w =
 * e2m1 · scale makes them. */
KP_FN kp_u32 kp_code(const kp_src *q, int codes, kp_i64 n, kp_i64 k)
{
    const kp_i64 i = kp_at(q, n, k);
    switch (codes) {
    case KP_CODES_W16:
        return (kp_u32)q->data[2 * i] | (kp_u32)q->data[2 * i + 1] << 8;
    case KP_CODES_BYTE:
        return q->data[i];
    case KP_CODES_MXFP8:
        return q->scale[i / 32] == 0xFF ? 0u : q->data[i];
    case KP_CODES_MXFP4:
    case KP_CODES_NVFP4: {
        const kp_u32 c = (q->data[i / 2] >> (4 * (i & 1))) & 0xFu;
        if (codes == KP_CODES_MXFP4)
            return q->scale[i / 32] == 0xFF ? 0u : c;
        const kp_u32 s = q->scale[i / 16], mag = s & 0x7Fu;
        return mag == 0 ? 0u : mag != 0x7F && (s & 0x80u) ? c ^ 8u : c;
    }
    case KP_CODES_Q8_0:
        return kp_block(q, n, k, 32, 34)[2 + k % 32] ^ 0x80u; /* q + 128 */
    case KP_CODES_Q4_0:
    case KP_CODES_GGML_MXFP4: { /* value j < 16: low nibble of qs[j]; j + 16 its high */
        const int q40 = codes == KP_CODES_Q4_0, j = (int)(k % 32);
        const kp_u8 *qs = kp_block(q, n, k, 32, q40 ? 18 : 17) + (q40 ? 2 : 1);
        return j < 16 ? qs[j] & 0xFu : (kp_u32)qs[j - 16] >> 4;
    }
    case KP_CODES_Q4_K: { /* each 64 values use 32 bytes of qs: low nibbles first */
        const kp_u8 *qs = kp_block(q, n, k, KP_QK_K, 144) + 16 + k % KP_QK_K / 64 * 32;
        const int l = (int)(k % 64);
        return l < 32 ? qs[l] & 0xFu : (kp_u32)qs[l - 32] >> 4;
    }
    case KP_CODES_Q6_K: {
        /* Quarter c of a 128-value half takes the low (c < 2) or high
         * nibble of ql[l] (c even) or ql[l + 32] (c odd), and bits 2c,
         * 2c + 1 of qh[l]. */
        const kp_u8 *y = kp_block(q, n, k, KP_QK_K, 210);
        const int p = (int)(k % KP_QK_K), half = p / 128, c = p % 128 / 32, l = p % 32;
        const kp_u32 b = y[half * 64 + l + (c & 1) * 32];
        const kp_u32 lo = c < 2 ? b & 0xFu : b >> 4;
        return lo | ((kp_u32)(y[128 + half * 32 + l] >> (2 * c)) & 3u) << 4;
    }
    }
    return 0;
}

/* Where one of a lane's 32 values of an atom goes: value (h, s) of k-tile
 * j comes from row g + 8h, column 16j + 4t + s of the atom, and sits in
 * register r = 2(s >> 1) + h, half s & 1 (pack.h); in a row-major atom
 * value e = 8j + 4h + s of lane l = 4g + t is half e & 1 of word e >> 1
 * (KP_W16R) or byte e & 3 of word e >> 2 (KP_W8R), the lane's bytes being
 * the atom's 16l .. 16l + 15 of each 512. */
typedef struct kp_slot {
    int row, col;
    int word, shift;       /* the code's bits in the lane's data words */
    int reg;               /* E2M1: which register's bit placement */
    int qh_word, qh_shift; /* Q6_K: the high two bits */
} kp_slot;

KP_FN kp_slot kp_slot_of(int cls, int t, int g, int j, int h, int s)
{
    const int r = 2 * (s >> 1) + h, half = s & 1;
    kp_slot o = { g + 8 * h, 16 * j + 4 * t + s, 0, 0, r, 0, 0 };
    switch (cls) {
    case KP_W16:
        o.word = 4 * j + r, o.shift = 16 * half;
        break;
    case KP_W8:
        o.word = 2 * j + (s >> 1), o.shift = 8 * (h + 2 * half);
        break;
    case KP_INT4:
    case KP_Q6:
        o.word = j, o.shift = 4 * (r + 4 * half);
        o.qh_word = j >> 1, o.qh_shift = 2 * ((j & 1) * 4 + r) + 16 * half;
        break;
    case KP_E2M1:
        o.word = j, o.shift = 16 * half;
        break;
    case KP_W16R: {
        const int l = 4 * g + t, e = 8 * j + 4 * h + s, w = e >> 1;
        o.row = 4 * (w >> 2) + (l >> 3), o.col = 8 * (l & 7) + 2 * (w & 3) + (e & 1);
        o.word = w, o.shift = 16 * (e & 1);
        break;
    }
    case KP_W8R: {
        const int l = 4 * g + t, e = 8 * j + 4 * h + s, w = e >> 2, at = 8 * (w >> 2) + (l >> 2);
        o.row = at ^ (at >> 3), o.col = 16 * (l & 3) + 4 * (w & 3) + (e & 3);
        o.word = w, o.shift = 8 * (e & 3);
        break;
    }
    }
    return o;
}

/* E2M1 code c as register r's bits in the low half of a word: magnitude at
 * 6, 3, 0 with the sign 9 above (registers 0..2); register 3: magnitude >> 1
 * at 10, its low bit at 13, the sign at 14 (decode_e2m1 in tc.cuh). */
KP_FN kp_u32 kp_e2m1_bits(int r, kp_u32 code)
{
    const kp_u32 c = code & 7u, sign = (code >> 3) & 1u;
    const int mag_at = r == 0 ? 6 : r == 1 ? 3 : 0;
    return r < 3 ? c << mag_at | sign << (mag_at + 9) : (c >> 1) << 10 | (c & 1u) << 13 | sign << 14;
}

KP_FN void kp_store_le32(kp_u8 *p, kp_u32 v)
{
    KP_UNROLL
    for (int i = 0; i < 4; i++)
        p[i] = (kp_u8)(v >> (8 * i));
}

/* Lane l's share of atom a of row tile r, into atom (the atom's bytes):
 * its pieces at p·512 + 16·l, and Q6_K's high bits at 512 + 8·l. Rows
 * past n are zero. */
KP_FN void kp_pack_lane(const kp_src *q, const kp_format *f, kp_i64 r, kp_i64 a, int l,
                        kp_u8 *atom)
{
    kp_u32 w[16] = { 0 }, qh[2] = { 0 };
    const kp_u32 mask = f->cls == KP_W16 || f->cls == KP_W16R ? 0xFFFFu
                        : f->cls == KP_W8 || f->cls == KP_W8R ? 0xFFu
                                                              : 0xFu;
    KP_UNROLL
    for (int e = 0; e < 32; e++) {
        const kp_slot sl = kp_slot_of(f->cls, l % 4, l / 4, e / 8, e / 4 % 2, e % 4);
        const kp_i64 n = r * KP_TILE + sl.row;
        const kp_u32 c = n < q->n ? kp_code(q, f->codes, n, a * KP_ATOM + sl.col) : 0u;
        w[sl.word] |= (f->cls == KP_E2M1 ? kp_e2m1_bits(sl.reg, c) : c & mask) << sl.shift;
        if (f->cls == KP_Q6)
            qh[sl.qh_word] |= ((c >> 4) & 3u) << sl.qh_shift;
    }
    for (int p = 0; p < f->pieces; p++)
        for (int i = 0; i < 4; i++)
            kp_store_le32(atom + p * 512 + l * 16 + 4 * i, w[4 * p + i]);
    if (f->cls == KP_Q6)
        for (int i = 0; i < 2; i++)
            kp_store_le32(atom + 512 + l * 8 + 4 * i, qh[i]);
}

/* Sub-block j's 6-bit scale and min of a Q4_K super-block's 12 packed
 * bytes s (graph/quant_ggml.c's kiln_quant_q4_k_scale_min). */
KP_FN void kp_q4_k_scale_min(int j, const kp_u8 *s, kp_u8 *sc, kp_u8 *m)
{
    if (j < 4) {
        *sc = (kp_u8)(s[j] & 63), *m = (kp_u8)(s[j + 4] & 63);
    } else {
        *sc = (kp_u8)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *m = (kp_u8)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* An NVFP4 block scale as tc.cuh's tc_nvfp4 decodes it: the f32 bits of
 * its magnitude >> 20 (exponent and three mantissa bits, exact for every
 * E4M3 magnitude, subnormals normalized) less 110 << 3, in 64..207. Zero
 * for a zero scale, whose block's codes are zero, and for a NaN one, which
 * the packers refuse. */
KP_FN kp_u8 kp_nvfp4_scale_code(kp_u8 s)
{
    const kp_u32 e = (s >> 3) & 15u, m = s & 7u;
    if ((s & 0x7F) == 0x7F || (!e && !m))
        return 0;
    if (e) /* 2^(e-7) · (1 + m/8): f32 exponent e + 120 */
        return (kp_u8)(8 * e + 80 + m);
    const kp_u32 p = m >= 4 ? 2 : m >= 2 ? 1 : 0; /* m · 2^-9: f32 exponent 118 + p */
    return (kp_u8)(64 + 8 * p + ((m << (3 - p)) & 7u));
}

/* Row n's record bytes for atom a. */
KP_FN void kp_record_of(const kp_src *q, const kp_format *f, kp_i64 n, kp_i64 a, kp_u8 *out)
{
    const kp_i64 k0 = a * KP_ATOM;
    switch (f->rec) {
    case KP_REC_E8M0: /* GGML's MXFP4 keeps its E8M0 at the head of each block */
        for (int b = 0; b < 2; b++)
            out[b] = f->codes == KP_CODES_GGML_MXFP4 ? kp_block(q, n, k0 + 32 * b, 32, 17)[0]
                                                    : q->scale[kp_at(q, n, k0 + 32 * b) / 32];
        break;
    case KP_REC_E4M3:
        for (int b = 0; b < 4; b++)
            out[b] = kp_nvfp4_scale_code(q->scale[kp_at(q, n, k0 + 16 * b) / 16]);
        break;
    case KP_REC_F16:
        for (int b = 0; b < 2; b++) {
            const kp_u8 *y = kp_block(q, n, k0 + 32 * b, 32, f->codes == KP_CODES_Q8_0 ? 34 : 18);
            out[2 * b] = y[0], out[2 * b + 1] = y[1];
        }
        break;
    case KP_REC_Q4_K: {
        const kp_u8 *y = kp_block(q, n, k0, KP_QK_K, 144);
        for (int b = 0; b < 2; b++)
            kp_q4_k_scale_min((int)(a % 4) * 2 + b, y + 4, &out[b], &out[2 + b]);
        break;
    }
    case KP_REC_Q6_K: { /* the int8 scales as s + 128 */
        const kp_u8 *y = kp_block(q, n, k0, KP_QK_K, 210);
        for (int b = 0; b < 4; b++)
            out[b] = y[192 + (a % 4) * 4 + b] ^ 0x80u;
        break;
    }
    }
}

/* Row g + 8h of row tile r: its record for atom a in the scale array, and
 * where a starts a 256-value super-block, its super-record after every
 * atom's records (Q4_K: d and dmin; Q6_K: d). Rows past n are zero. */
KP_FN void kp_pack_record(const kp_src *q, const kp_format *f, kp_i64 r, kp_i64 a, int g, int h,
                          kp_u8 *scale)
{
    const kp_i64 tiles = (q->n + KP_TILE - 1) / KP_TILE, atoms = q->k / KP_ATOM;
    const kp_i64 n = r * KP_TILE + g + 8 * h;
    const int rb = f->record, half = rb / 2;
    kp_u8 bytes[4] = { 0, 0, 0, 0 };
    if (n < q->n)
        kp_record_of(q, f, n, a, bytes);
    /* E8M0 interleaves the rows by byte pairs; the others put row g + 8 in
     * the record's second half. */
    kp_u8 *rec = scale + (r * atoms + a) * 8 * rb + g * rb;
    if (f->rec == KP_REC_E8M0)
        rec[2 * h] = bytes[0], rec[2 * h + 1] = bytes[1];
    else
        for (int i = 0; i < half; i++)
            rec[half * h + i] = bytes[i];
    if (a % 4 || !f->super)
        return;
    const int sb = f->super;
    kp_u8 *dst = scale + tiles * atoms * 8 * rb + (r * (atoms / 4) + a / 4) * 8 * sb + g * sb +
                 (sb / 2) * h;
    const kp_u8 *y = n >= q->n ? 0
                     : f->rec == KP_REC_Q4_K ? kp_block(q, n, a * KP_ATOM, KP_QK_K, 144)
                                             : kp_block(q, n, a * KP_ATOM, KP_QK_K, 210) + 208;
    for (int i = 0; i < sb / 2; i++)
        dst[i] = y ? y[i] : 0;
}

/* The values kp_unpackable looks at: every value, or NVFP4's block scales. */
KP_FN kp_i64 kp_check_count(const kp_src *q, int check)
{
    return check == KP_CHECK_NONE ? 0 : check == KP_CHECK_NVFP4 ? q->n * q->k / 16 : q->n * q->k;
}

/* Whether value i (a block scale for NVFP4) is one the layout cannot carry. */
KP_FN int kp_unpackable(const kp_src *q, int check, kp_i64 i)
{
    switch (check) {
    case KP_CHECK_F16:
        return (q->data[2 * i + 1] & 0x7C) == 0x7C;
    case KP_CHECK_E4M3:
        return (q->data[i] & 0x7F) == 0x7F;
    case KP_CHECK_NVFP4:
        return (q->scale[i] & 0x7F) == 0x7F;
    }
    return 0;
}

#endif
