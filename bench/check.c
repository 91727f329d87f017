/* Benchmark data and the CPU reference it is checked against. */
#include "bench/bench.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ random */

uint64_t kiln_bench_rng_next(kiln_bench_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1]: never 0, so the logarithm below is finite. */
static double uniform(kiln_bench_rng *r)
{
    return ((double)(kiln_bench_rng_next(r) >> 11) + 1.0) * 0x1.0p-53;
}

float kiln_bench_rng_normal(kiln_bench_rng *r)
{
    double u = uniform(r), v = uniform(r);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* ------------------------------------------------------------ weights */

static const size_t scale_elem_bytes[] = {
    [KILN_SCALE_NONE] = 0,
    [KILN_SCALE_F32] = 4,
    [KILN_SCALE_E8M0] = 1,
    [KILN_SCALE_UE4M3] = 1,
};

/* Copies the first `rows` rows of src (rows of row_bytes) down all of dst's
 * total rows, src row i going to dst rows i, i + rows, i + 2·rows, ... */
static void repeat_rows(uint8_t *dst, int64_t total, const uint8_t *src, int64_t rows,
                        size_t row_bytes)
{
    for (int64_t r = 0; r < total; r += rows) {
        int64_t n = total - r < rows ? total - r : rows;
        memcpy(dst + (size_t)r * row_bytes, src, (size_t)n * row_bytes);
    }
}

kiln_status kiln_bench_tile_repeat(const kiln_qtensor *tile, kiln_qtensor *full)
{
    const kiln_format_info *fi = kiln_format_get(tile->format);
    if (!fi || tile->format != full->format || tile->k != full->k || tile->n < 1 ||
        tile->n > full->n || !tile->data || !full->data)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "tile repeat: a tile of the weight's format, width and data is needed");
    int64_t sr = fi->scale_rows;
    if (fi->scale_type != KILN_SCALE_NONE && tile->n != full->n && sr > 0 && tile->n % sr)
        return kiln_fail(KILN_ERR_SHAPE,
                         "tile repeat: %s scales cover %lld rows; a tile of %lld rows does not "
                         "repeat them",
                         fi->name, (long long)sr, (long long)tile->n);
    size_t row_bytes;
    kiln_status st = kiln_format_data_bytes(tile->format, 1, tile->k, &row_bytes);
    if (st != KILN_OK)
        return st;
    repeat_rows(full->data, full->n, tile->data, tile->n, row_bytes);
    full->global_scale = tile->global_scale;
    if (fi->scale_type == KILN_SCALE_NONE)
        return KILN_OK;
    if (!tile->scale || !full->scale)
        return kiln_fail(KILN_ERR_INVALID_ARG, "tile repeat: %s needs scale arrays", fi->name);
    int64_t per = fi->grouped ? tile->group : fi->scale_cols;
    int64_t cols = per ? kiln_ceil_div(tile->k, per) : 1;
    size_t scale_row = (size_t)cols * scale_elem_bytes[fi->scale_type];
    int64_t full_rows = sr ? kiln_ceil_div(full->n, sr) : 1;
    int64_t tile_rows = sr ? kiln_ceil_div(tile->n, sr) : 1;
    repeat_rows(full->scale, full_rows, tile->scale, tile_rows, scale_row);
    /* Zero points (a byte per scale) follow the scales. */
    if (fi->zero_point)
        repeat_rows((uint8_t *)full->scale + (size_t)full_rows * scale_row, full_rows,
                    (const uint8_t *)tile->scale + (size_t)tile_rows * scale_row, tile_rows,
                    (size_t)cols);
    return KILN_OK;
}

void kiln_bench_weight_free(kiln_bench_weight *w)
{
    if (!w)
        return;
    free(w->q.data);
    free(w->q.scale);
    free(w->ref);
    memset(w, 0, sizeof *w);
}

static kiln_status weight_fill(kiln_bench_weight *w, kiln_format f, int64_t n, int64_t k,
                               kiln_bench_rng *r, float *src, kiln_qtensor *tile)
{
    size_t tile_data, tile_scale;
    kiln_status st = kiln_format_data_bytes(f, w->tile, k, &tile_data);
    if (st == KILN_OK)
        st = kiln_format_scale_bytes(f, w->tile, k, &tile_scale);
    if (st == KILN_OK)
        st = kiln_format_data_bytes(f, n, k, &w->data_bytes);
    if (st == KILN_OK)
        st = kiln_format_scale_bytes(f, n, k, &w->scale_bytes);
    if (st != KILN_OK)
        return st;
    size_t elems = (size_t)w->tile * (size_t)k;
    float sigma = 1.0f / sqrtf((float)k);
    for (size_t i = 0; i < elems; i++)
        src[i] = sigma * kiln_bench_rng_normal(r);
    *tile = (kiln_qtensor){ .format = f, .n = w->tile, .k = k, .data = malloc(tile_data),
                            .scale = tile_scale ? malloc(tile_scale) : NULL };
    w->q = (kiln_qtensor){ .format = f, .n = n, .k = k, .data = malloc(w->data_bytes),
                           .scale = w->scale_bytes ? malloc(w->scale_bytes) : NULL };
    w->ref = malloc(elems * sizeof *w->ref);
    if (!tile->data || (tile_scale && !tile->scale) || !w->q.data ||
        (w->scale_bytes && !w->q.scale) || !w->ref)
        return kiln_fail(KILN_ERR_NOMEM, "%zu bytes of weight", w->data_bytes + w->scale_bytes);
    if ((st = kiln_quantize(src, tile)) != KILN_OK ||
        (st = kiln_dequantize(tile, w->ref)) != KILN_OK)
        return st;
    return kiln_bench_tile_repeat(tile, &w->q);
}

kiln_status kiln_bench_weight_make(kiln_format f, int64_t n, int64_t k, kiln_bench_rng *r,
                                   kiln_bench_weight *out)
{
    const kiln_format_info *fi = kiln_format_get(f);
    if (!fi || !r || !out || n < 1 || k < 1)
        return kiln_fail(KILN_ERR_INVALID_ARG, "bench weight: a format, a shape and a generator");
    kiln_bench_weight w = { .tile = n < KILN_BENCH_TILE_ROWS ? n : KILN_BENCH_TILE_ROWS };
    kiln_qtensor tile = { 0 };
    float *src = malloc((size_t)w.tile * (size_t)k * sizeof *src);
    kiln_status st = src ? weight_fill(&w, f, n, k, r, src, &tile)
                         : kiln_fail(KILN_ERR_NOMEM, "bench weight tile");
    free(src);
    free(tile.data);
    free(tile.scale);
    if (st != KILN_OK) {
        kiln_bench_weight_free(&w);
        return kiln_fail_prefix(st, "bench weight %s [%lld, %lld]", fi->name, (long long)n,
                                (long long)k);
    }
    *out = w;
    return KILN_OK;
}

void kiln_bench_quant_1x128(const float *x, int64_t m, int64_t k, uint8_t *q, float *scale)
{
    int64_t groups = kiln_ceil_div(k, 128);
    for (int64_t i = 0; i < m; i++)
        for (int64_t g = 0; g < groups; g++) {
            int64_t lo = g * 128, hi = lo + 128 < k ? lo + 128 : k;
            float amax = 0;
            for (int64_t j = lo; j < hi; j++)
                amax = fmaxf(amax, fabsf(x[i * k + j]));
            float s = amax > 0 ? amax / 448.0f : 1.0f;
            scale[i * groups + g] = s;
            for (int64_t j = lo; j < hi; j++)
                q[i * k + j] = kiln_f32_to_e4m3(x[i * k + j] / s);
        }
}

/* ------------------------------------------------------------- checks */

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int kiln_bench_sample_rows(int64_t m, int count, kiln_bench_rng *r, int64_t *rows)
{
    if (m <= count) {
        for (int64_t i = 0; i < m; i++)
            rows[i] = i;
        return (int)m;
    }
    int n = 0;
    rows[n++] = 0;
    rows[n++] = m - 1;
    /* Floyd's sampling of count - 2 distinct rows from 1 .. m-2. */
    int64_t lo = 1, span = m - 2;
    for (int64_t j = span - (count - 2); j < span; j++) {
        int64_t t = lo + (int64_t)(kiln_bench_rng_next(r) % (uint64_t)(j + 1));
        int seen = 0;
        for (int i = 2; i < n && !seen; i++)
            seen = rows[i] == t;
        rows[n++] = seen ? lo + j : t;
    }
    qsort(rows, (size_t)n, sizeof *rows, cmp_i64);
    return n;
}

typedef struct check_part {
    const kiln_bench_check_in *in;
    int64_t col0, col1;
    kiln_bench_check out;
} check_part;

static void *check_columns(void *arg)
{
    check_part *p = arg;
    const kiln_bench_check_in *in = p->in;
    p->out = (kiln_bench_check){ .pass = 1, .row = -1, .col = -1 };
    for (int i = 0; i < in->n_rows; i++) {
        const float *x = in->x[i];
        for (int64_t j = p->col0; j < p->col1; j++) {
            const float *w = in->w + (size_t)(j % in->tile) * (size_t)in->k;
            double acc = 0, mag = 0;
            for (int64_t t = 0; t < in->k; t++) {
                double v = (double)x[t] * (double)w[t];
                acc += v;
                mag += fabs(v);
            }
            double got = in->y[i][j];
            double err = fabs(got - acc);
            double ratio = mag > 0 ? err / mag : (err == 0 ? 0 : INFINITY);
            if (isnan(ratio))
                ratio = INFINITY;
            if (!(err <= in->tol * mag))
                p->out.pass = 0;
            if (ratio > p->out.worst || p->out.row < 0) {
                p->out.worst = ratio;
                p->out.row = in->rows[i];
                p->out.col = j;
                p->out.got = got;
                p->out.want = acc;
            }
        }
    }
    return NULL;
}

kiln_status kiln_bench_check_run(const kiln_bench_check_in *in, kiln_bench_check *out)
{
    if (!in || !out || !in->x || !in->y || !in->rows || !in->w || in->n_rows < 1 ||
        in->tile < 1 || in->n < 1 || in->k < 1)
        return kiln_fail(KILN_ERR_INVALID_ARG, "check: rows, outputs and a weight are required");
    int threads = kiln_cpu_count();
    if (threads > in->n)
        threads = (int)in->n;
    check_part *parts = calloc((size_t)threads, sizeof *parts);
    pthread_t *ids = calloc((size_t)threads, sizeof *ids);
    int *started = calloc((size_t)threads, sizeof *started);
    if (!parts || !ids || !started) {
        free(parts);
        free(ids);
        free(started);
        return kiln_fail(KILN_ERR_NOMEM, "check: %d threads", threads);
    }
    for (int t = 0; t < threads; t++) {
        parts[t] = (check_part){ .in = in, .col0 = in->n * t / threads,
                                 .col1 = in->n * (t + 1) / threads };
        /* a thread that cannot start leaves its columns to this one */
        started[t] = t > 0 && pthread_create(&ids[t], NULL, check_columns, &parts[t]) == 0;
    }
    for (int t = 0; t < threads; t++)
        if (!started[t])
            check_columns(&parts[t]);
    *out = (kiln_bench_check){ .pass = 1, .row = -1, .col = -1 };
    for (int t = 0; t < threads; t++) {
        if (started[t])
            pthread_join(ids[t], NULL);
        const kiln_bench_check *c = &parts[t].out;
        out->pass &= c->pass;
        if (c->row >= 0 && (out->row < 0 || c->worst > out->worst)) {
            int pass = out->pass;
            *out = *c;
            out->pass = pass;
        }
    }
    free(parts);
    free(ids);
    free(started);
    return KILN_OK;
}
