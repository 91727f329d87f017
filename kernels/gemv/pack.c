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

enum { TILE = KP_TILE, ATOM = KP_ATOM, LANES = 32 };

/* Each format's way through the packer (pack_core.h); cls 0 with codes 0
 * is KP_W16 too, so a row without a layout is told by its atom's bytes. */
static const struct pack_way {
    int cls, rec, codes, check;
} ways[KILN_FMT_COUNT] = {
    [KILN_FMT_F16] = { KP_W16, KP_REC_NATIVE, KP_CODES_W16, KP_CHECK_F16 },
    [KILN_FMT_BF16] = { KP_W16R, KP_REC_NATIVE, KP_CODES_W16, KP_CHECK_NONE },
    [KILN_FMT_FP8_TENSOR] = { KP_W8R, KP_REC_NATIVE, KP_CODES_BYTE, KP_CHECK_E4M3 },
    [KILN_FMT_FP8_CHANNEL] = { KP_W8R, KP_REC_NATIVE, KP_CODES_BYTE, KP_CHECK_E4M3 },
    [KILN_FMT_FP8_BLOCK] = { KP_W8, KP_REC_NATIVE, KP_CODES_BYTE, KP_CHECK_E4M3 },
    [KILN_FMT_MXFP8] = { KP_W8, KP_REC_E8M0, KP_CODES_MXFP8, KP_CHECK_E4M3 },
    [KILN_FMT_NVFP4] = { KP_E2M1, KP_REC_E4M3, KP_CODES_NVFP4, KP_CHECK_NVFP4 },
    [KILN_FMT_MXFP4] = { KP_E2M1, KP_REC_E8M0, KP_CODES_MXFP4, KP_CHECK_NONE },
    [KILN_FMT_Q8_0] = { KP_W8, KP_REC_F16, KP_CODES_Q8_0, KP_CHECK_NONE },
    [KILN_FMT_Q4_0] = { KP_INT4, KP_REC_F16, KP_CODES_Q4_0, KP_CHECK_NONE },
    [KILN_FMT_Q4_K] = { KP_INT4, KP_REC_Q4_K, KP_CODES_Q4_K, KP_CHECK_NONE },
    [KILN_FMT_Q6_K] = { KP_Q6, KP_REC_Q6_K, KP_CODES_Q6_K, KP_CHECK_NONE },
    [KILN_FMT_GGML_MXFP4] = { KP_E2M1, KP_REC_E8M0, KP_CODES_GGML_MXFP4, KP_CHECK_NONE },
};

/* Each atom's sizes, as the kernel reads them (tc_format.h); bytes 0: no
 * packed layout. */
#define LAYOUT_ROW(fmt, name, bytes, pieces, units, record, super, rows)                        \
    [KILN_FMT_##fmt] = { bytes, pieces, units, record, super, rows },
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

int kiln_gemv_pack_way(kiln_format f, kp_format *out)
{
    const kiln_gemv_tc_format *lay = kiln_gemv_tc_format_get(f);
    if (!lay)
        return 0;
    const struct pack_way *w = &ways[f];
    *out = (kp_format){ w->cls, w->rec, w->codes, w->check,
                        lay->bytes, lay->pieces, lay->record, lay->super };
    return 1;
}

static kp_src src_of(const kiln_qtensor *q)
{
    return (kp_src){ q->data, q->scale, q->n, q->k };
}

/* Row tiles [r0, r1): every lane's share of every atom, and the records. */
static void pack_tiles(const kiln_qtensor *q, const kp_format *f, uint8_t *data, uint8_t *scale,
                       int64_t r0, int64_t r1)
{
    const kp_src src = src_of(q);
    const int64_t atoms = q->k / ATOM;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t a = 0; a < atoms; a++) {
            for (int l = 0; l < LANES; l++)
                kp_pack_lane(&src, f, r, a, l, data + (size_t)(r * atoms + a) * (size_t)f->bytes);
            for (int i = 0; f->record && i < 16; i++)
                kp_pack_record(&src, f, r, a, i % 8, i / 8, scale);
        }
}

/* One thread's share: row tiles [r0, r1). */
typedef struct pack_job {
    const kiln_qtensor *q;
    const kp_format *f;
    uint8_t *data, *scale;
    int64_t r0, r1;
} pack_job;

static void *pack_run(void *arg)
{
    const pack_job *j = arg;
    pack_tiles(j->q, j->f, j->data, j->scale, j->r0, j->r1);
    return NULL;
}

enum { PACK_MAX_THREADS = 32, PACK_TILES_PER_THREAD = 64 };

kiln_status kiln_gemv_pack_refusal(kiln_format f, int64_t k, int64_t i, unsigned f16_bits)
{
    const kiln_format_info *fi = kiln_format_get(f);
    if (f == KILN_FMT_NVFP4)
        return kiln_fail(KILN_ERR_MALFORMED,
                         "gemv_tc pack: NVFP4 block scale %lld (row %lld, K %lld) is NaN",
                         (long long)i, (long long)(i / (k / 16)), (long long)(i % (k / 16) * 16));
    return kiln_fail(KILN_ERR_MALFORMED,
                     "gemv_tc pack: %s weight (row %lld, K %lld) is %s, which the tensor-core "
                     "kernel cannot carry",
                     fi ? fi->name : "?", (long long)(i / k), (long long)(i % k),
                     f == KILN_FMT_F16 && !(f16_bits & 0x3FF) ? "infinite" : "NaN");
}

/* Values the packed layout cannot carry (kp_unpackable), refused rather
 * than changed. The error names the first. */
static kiln_status refuse_unpackable(const kiln_qtensor *q, const kp_format *f)
{
    const kp_src src = src_of(q);
    const int64_t count = kp_check_count(&src, f->check);
    for (int64_t i = 0; i < count; i++)
        if (kp_unpackable(&src, f->check, i))
            return kiln_gemv_pack_refusal(q->format, q->k, i,
                                          f->check == KP_CHECK_F16
                                              ? (unsigned)src.data[2 * i] | src.data[2 * i + 1] << 8
                                              : 0);
    return KILN_OK;
}

kiln_status kiln_gemv_pack_check(const kiln_qtensor *q)
{
    kp_format f;
    if (!kiln_gemv_pack_way(q->format, &f))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gemv_tc pack: format %d has no packed layout",
                         (int)q->format);
    return refuse_unpackable(q, &f);
}

kiln_status kiln_gemv_pack(const kiln_qtensor *src, void *data, void *scale)
{
    size_t data_bytes, scale_bytes;
    kiln_status st = kiln_gemv_pack_bytes(src->format, src->n, src->k, &data_bytes, &scale_bytes);
    if (st != KILN_OK)
        return st;
    kp_format f;
    if (!kiln_gemv_pack_way(src->format, &f))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gemv_tc pack: format %d has no packed layout",
                         (int)src->format);
    st = refuse_unpackable(src, &f);
    if (st != KILN_OK)
        return st;
    /* Every byte of both arrays is written; the scale array is the
     * storage layout's own where the format packs no records. */
    if (!f.record && scale_bytes)
        memcpy(scale, src->scale, scale_bytes);
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
        jobs[i] = (pack_job){ src, &f, data, scale, tiles * i / threads,
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

kiln_status kiln_gemv_pack_emit(kiln_format f, const char *entry, char *buf, size_t size)
{
    kp_format w;
    if (!kiln_gemv_pack_way(f, &w))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: format %s has no packed layout", entry,
                         kiln_format_get(f) ? kiln_format_get(f)->name : "?");
    int n = snprintf(buf, size,
                     "#include \"kiln/pack.cuh\"\n"
                     "\n"
                     "extern \"C\" __global__ void __launch_bounds__(KILN_PACK_THREADS)\n"
                     "%s(const kiln_pack_args args)\n"
                     "{\n"
                     "    // %s: class, record, codes, check, atom bytes, pieces, record, super\n"
                     "    kiln::pack_weight<%d, %d, %d, %d, %d, %d, %d, %d>(args);\n"
                     "}\n",
                     entry, kiln_format_get(f)->name, w.cls, w.rec, w.codes, w.check, w.bytes,
                     w.pieces, w.record, w.super);
    if (n < 0 || (size_t)n >= size)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: the source does not fit %zu bytes", entry,
                         size);
    return KILN_OK;
}
