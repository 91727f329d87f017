/* The wgmma backend's host side: Hopper's warpgroup MMA (sm_90a only),
 * capability checks, the tile variant per token bucket, the instantiation
 * of kernels/wgmma/wgmma.cuh and its launch shape. Weights stay in kiln's
 * storage layout and are dequantized to BF16 in the kernel's main loop:
 * nothing to pack. */
#include "kernels/registry/backend.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

/* The block, as kernels/wgmma/wgmma.cuh's wgmma_tile fixes it (the
 * emitted source asserts its shared memory); the variants differ in the
 * tile's width. */
enum {
    WGMMA_BM = 64,            /* rows of a tile: one warpgroup's wgmma M */
    WGMMA_BK = 64,            /* K a stage: four k16 wgmma steps */
    WGMMA_THREADS = 128,      /* one warpgroup */
    WGMMA_STAGES = 2,         /* one stage loads while the other is read */
    WGMMA_MAX_GRID_Y = 65535, /* blocks along M are grid.y, which CUDA caps */
};

typedef struct wgmma_tile {
    const char *name;
    int64_t max_m; /* the largest bucket that gets it */
    int bn;
} wgmma_tile;

/* The tiles, smallest M first, each row's reason in a line. */
static const wgmma_tile tiles[] = {
    /* up to 64 tokens, one row of blocks: twice the blocks while weights dominate */
    { "bm64bn64", 64, 64 },
    /* past it, each activation tile read feeds twice the outputs */
    { "bm64bn128", INT64_MAX, 128 },
};

static const kiln_variant_table tile_table = KILN_VARIANT_TABLE(wgmma_tile, tiles);

static const wgmma_tile *tile_named(const char *name)
{
    return kiln_variant_named(&tile_table, name);
}

/* Both stages of both operands, BF16: the template's tile::smem_bytes,
 * which the emitted source asserts. */
static unsigned smem_bytes(const wgmma_tile *tile)
{
    return (unsigned)(WGMMA_STAGES * (WGMMA_BM + tile->bn) * WGMMA_BK * 2);
}

static int wgmma_is_supported(const kiln_target *t, char *why, size_t size)
{
    if (t->wgmma)
        return 1;
    snprintf(why, size, "needs wgmma (sm_90a), target is %s", t->name);
    return 0;
}

/* Why the shape of c cannot be built, or "" when it can: K in whole
 * steps of 64 (a partial step is simt's), and N and K within the
 * kernel's int template arguments. */
static int shape_refused(const kiln_linear_cfg *c, char *why, size_t size)
{
    if (c->n > INT_MAX || c->k > INT_MAX) {
        snprintf(why, size, "N=%lld, K=%lld: both must be below 2^31", (long long)c->n,
                 (long long)c->k);
        return 1;
    }
    if (c->k % WGMMA_BK) {
        snprintf(why, size, "K=%lld is not a multiple of %d", (long long)c->k, WGMMA_BK);
        return 1;
    }
    return 0;
}

/* Small buckets are not refused: the decode backends (gemv_tc, gemv) come
 * first in every priority list and take them where they can; where they
 * cannot, a 64-row tile with idle rows still beats the SIMT fallback. */
static int wgmma_can_implement(const kiln_target *t, const kiln_linear_cfg *c, int64_t bucket,
                               char *why, size_t size)
{
    (void)t;
    if (shape_refused(c, why, size))
        return 0;
    if (kiln_ceil_div(bucket, WGMMA_BM) > WGMMA_MAX_GRID_Y) {
        snprintf(why, size, "M bucket %lld exceeds %lld rows", (long long)bucket,
                 (long long)WGMMA_MAX_GRID_Y * WGMMA_BM);
        return 0;
    }
    return 1;
}

/* The tile of k on t, or a refusal naming what wgmma does not build. */
static kiln_status wgmma_check(const kiln_target *t, const kiln_linear_kernel *k,
                               const wgmma_tile **out)
{
    char why[128];
    const wgmma_tile *tile = tile_named(k->variant);
    if (!tile)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "wgmma: no variant \"%s\" (bm64bn64, bm64bn128)",
                         k->variant);
    if (!wgmma_is_supported(t, why, sizeof why))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "wgmma: %s", why);
    kiln_status common = kiln_linear_kernel_check("wgmma", k);
    if (common != KILN_OK)
        return common;
    if (shape_refused(&k->cfg, why, sizeof why))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "wgmma: %s", why);
    *out = tile;
    return KILN_OK;
}

static kiln_status wgmma_emit(const kiln_target *t, const kiln_linear_kernel *k, const char *entry,
                              char *buf, size_t size)
{
    const wgmma_tile *tile = NULL;
    kiln_status st = wgmma_check(t, k, &tile);
    if (st != KILN_OK)
        return st;
    char epi_args[96];
    int n = snprintf(
        buf, size,
        "#include \"kiln/wgmma.cuh\"\n"
        "\n"
        "using format = kiln::fmt_%s;\n"
        "using tile = kiln::wgmma_tile</*bn*/ %d>;\n"
        "using epilogue = kiln::epilogue<%s>;\n"
        "static_assert(tile::smem_bytes == %u, \"the launch's dynamic shared memory\");\n"
        "\n"
        "extern \"C\" __global__ void __launch_bounds__(tile::threads, 1)\n"
        "%s(const kiln_linear_args args)\n"
        "{\n"
        "    kiln::wgmma_gemm<format, tile, epilogue, /*n*/ %lld, /*k*/ %lld>(args);\n"
        "}\n",
        kiln_format_get(k->cfg.format)->name, tile->bn,
        kiln_epilogue_template_args(k->cfg.epilogue, epi_args, sizeof epi_args),
        smem_bytes(tile), entry, (long long)k->cfg.n, (long long)k->cfg.k);
    if (n < 0 || (size_t)n >= size)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "wgmma: the source needs %d bytes, the buffer has %zu", n + 1, size);
    return KILN_OK;
}

static kiln_status wgmma_launch(const kiln_target *t, const kiln_linear_kernel *k, int64_t m,
                                kiln_launch *out)
{
    const wgmma_tile *tile = NULL;
    kiln_status st = wgmma_check(t, k, &tile);
    if (st != KILN_OK)
        return st;
    if (m < 1 || kiln_ceil_div(m, WGMMA_BM) > WGMMA_MAX_GRID_Y)
        return kiln_fail(KILN_ERR_SHAPE, "wgmma %s: cannot launch for M = %lld (1 to %lld)",
                         tile->name, (long long)m, (long long)WGMMA_MAX_GRID_Y * WGMMA_BM);
    *out = (kiln_launch){
        .grid = { (unsigned)kiln_ceil_div(k->cfg.n, tile->bn), (unsigned)kiln_ceil_div(m, WGMMA_BM),
                  1 },
        .block = { WGMMA_THREADS, 1, 1 },
        .smem = smem_bytes(tile),
    };
    return KILN_OK;
}

const kiln_backend kiln_backend_wgmma = {
    .name = "wgmma",
    .formats = KILN_FMT_ALL,
    .epilogues = KILN_EPI_ALL,
    .is_supported = wgmma_is_supported,
    .can_implement = wgmma_can_implement,
    .variants = &tile_table,
    .emit = wgmma_emit,
    .launch = wgmma_launch,
};
