/* The simt backend's host side: capability checks, the tile variant per
 * token bucket, the instantiation of kernels/simt/simt.cuh and its launch
 * shape. Weights stay in kiln's storage layout: nothing to pack. */
#include "kernels/registry/backend.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

/* The tiles, smallest M first: a bucket takes the first whose max_m
 * covers it. Every one runs 256 threads ((bm / tm) · (bn / tn)), and BK
 * is a multiple of every format's chunk (16 at most). Each row's reason
 * in a line. */
typedef struct simt_tile {
    const char *name;
    int64_t max_m;
    int bm, bn, bk, tm, tn;
} simt_tile;

static const simt_tile tiles[] = {
    /* decode: a weight tile serves few rows; more blocks spread the weight reads */
    { "t16x64", 16, 16, 64, 32, 1, 4 },
    /* a weight tile serves 64 rows, 4 x 4 outputs a thread */
    { "t64x64", 64, 64, 64, 32, 4, 4 },
    /* prefill: reuse pays, 8 x 8 outputs a thread from a shallower K step */
    { "t128x128", INT64_MAX, 128, 128, 16, 8, 8 },
};

/* Blocks along M are grid.y, which CUDA caps at 65535. */
enum { SIMT_MAX_GRID_Y = 65535 };

static const kiln_variant_table tile_table = KILN_VARIANT_TABLE(simt_tile, tiles);

static const simt_tile *tile_for_bucket(int64_t m)
{
    return kiln_variant_for_bucket(&tile_table, m);
}

static const simt_tile *tile_named(const char *name)
{
    return kiln_variant_named(&tile_table, name);
}

/* Any shape the format allows, within the kernel's int indexing (N and K
 * are template arguments of type int) and CUDA's grid limit on M. */
static int simt_can_implement(const kiln_target *t, const kiln_linear_cfg *c, int64_t bucket,
                              char *why, size_t size)
{
    (void)t;
    if (c->n > INT_MAX || c->k > INT_MAX) {
        snprintf(why, size, "N=%lld, K=%lld: both must be below 2^31", (long long)c->n,
                 (long long)c->k);
        return 0;
    }
    const simt_tile *tile = tile_for_bucket(bucket);
    if (kiln_ceil_div(bucket, tile->bm) > SIMT_MAX_GRID_Y) {
        snprintf(why, size, "M bucket %lld exceeds %lld rows", (long long)bucket,
                 (long long)SIMT_MAX_GRID_Y * tile->bm);
        return 0;
    }
    return 1;
}

/* The tile of k, or a refusal naming what simt does not build. *out is
 * NULL on a refusal, so it is defined on every path: the compiler cannot
 * see that kiln_fail never returns KILN_OK. */
static kiln_status simt_check(const kiln_linear_kernel *k, const simt_tile **out)
{
    *out = NULL;
    const simt_tile *tile = tile_named(k->variant);
    if (!tile)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "simt: no variant \"%s\" (t16x64, t64x64, t128x128)",
                         k->variant);
    kiln_status common = kiln_linear_kernel_check("simt", k, KILN_ACT_BF16);
    if (common != KILN_OK)
        return common;
    char why[128];
    if (!kiln_linear_group_fits(&k->cfg, kiln_format_get(k->cfg.format)->block, why, sizeof why))
        return kiln_fail(KILN_ERR_SHAPE, "simt: %s", why);
    *out = tile;
    return KILN_OK;
}

static kiln_status simt_emit(const kiln_target *t, const kiln_linear_kernel *k, const char *entry,
                             char *buf, size_t size)
{
    (void)t;
    const simt_tile *tile;
    kiln_status st = simt_check(k, &tile);
    if (st != KILN_OK)
        return st;
    char epi_args[96], group[64] = "";
    const kiln_format_info *fi = kiln_format_get(k->cfg.format);
    if (fi->grouped)
        snprintf(group, sizeof group, "</*group*/ %lld, /*n*/ %lld>", (long long)k->cfg.group,
                 (long long)k->cfg.n);
    return kiln_backend_source(buf, size, "simt",
        "#include \"kiln/simt.cuh\"\n"
        "\n"
        "using format = kiln::fmt_%s%s;\n"
        "using tile = kiln::simt_tile</*bm*/ %d, /*bn*/ %d, /*bk*/ %d, /*tm*/ %d, /*tn*/ %d>;\n"
        "using epilogue = kiln::epilogue<%s>;\n"
        "\n"
        "extern \"C\" __global__ void __launch_bounds__(tile::threads)\n"
        "%s(const kiln_linear_args args)\n"
        "{\n"
        "    kiln::simt_gemm<format, tile, epilogue, /*n*/ %lld, /*k*/ %lld>(args);\n"
        "}\n",
        fi->name, group, tile->bm, tile->bn, tile->bk, tile->tm, tile->tn,
        kiln_epilogue_template_args(k->cfg.epilogue, epi_args, sizeof epi_args), entry, (long long)k->cfg.n,
        (long long)k->cfg.k);
}

static kiln_status simt_launch(const kiln_target *t, const kiln_linear_kernel *k, int64_t m,
                               kiln_launch *out)
{
    (void)t;
    const simt_tile *tile;
    kiln_status st = simt_check(k, &tile);
    if (st != KILN_OK)
        return st;
    if (m < 1 || kiln_ceil_div(m, tile->bm) > SIMT_MAX_GRID_Y)
        return kiln_fail(KILN_ERR_SHAPE, "simt %s: cannot launch for M = %lld (1 to %lld)",
                         tile->name, (long long)m, (long long)SIMT_MAX_GRID_Y * tile->bm);
    *out = (kiln_launch){
        .grid = { (unsigned)kiln_ceil_div(k->cfg.n, tile->bn), (unsigned)kiln_ceil_div(m, tile->bm),
                  1 },
        .block = { (unsigned)((tile->bm / tile->tm) * (tile->bn / tile->tn)), 1, 1 },
    };
    return KILN_OK;
}

const kiln_backend kiln_backend_simt = {
    .name = "simt",
    .formats = KILN_FMT_ALL,
    .epilogues = KILN_EPI_ALL,
    .is_supported = kiln_sm75_or_newer,
    .can_implement = simt_can_implement,
    .variants = &tile_table,
    .emit = simt_emit,
    .launch = simt_launch,
};
