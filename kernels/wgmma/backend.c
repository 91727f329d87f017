/* The wgmma backend's host side: Hopper's warpgroup MMA (sm_90a only),
 * capability checks, the tile per signature and bucket, the instantiation
 * of its templates and their launch shapes. Weights stay in kiln's storage
 * layout but BF16's and FP8 per-tensor and per-channel, which the TMA
 * kernel reads from gemv_tc's row-major atoms: the decode kernels' copy,
 * one for both.
 *
 * Two kernels. BF16 and FP8 E4M3 weights (with a tensor, row or 128 x 128
 * block scale) run kernels/wgmma/tma.cuh: TMA copies of both operands
 * into a multi-stage ring, a producer warpgroup and two consumer
 * warpgroups, persistent tiles; FP8 on activations the graph quantizes
 * to E4M3 before. Every other format runs
 * kernels/wgmma/wgmma.cuh, which dequantizes the weight to BF16 in the
 * main loop with one warpgroup a tile. */
#include "kernels/gemv/pack.h"
#include "kernels/registry/backend.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

/* The dequantizing kernel's block, as wgmma.cuh's wgmma_tile fixes it (the
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

/* The TMA kernel's block, as tma.cuh's tma_tile fixes it. */
enum {
    TMA_ROW_BYTES = 128,     /* K a stage: 128 bytes of each row, the swizzle's span */
    TMA_THREADS = 384,       /* a producer and two consumer warpgroups */
    TMA_STAGE_BUDGET = 200 * 1024, /* the ring's bytes: room for the barriers, and L1 */
    TMA_MAX_STAGES = 8,
};

typedef struct tma_tile {
    const char *name;
    int64_t max_m; /* unused: the tile is chosen by tma_choose */
    int bm, bn;
    double speed; /* tensor-core throughput of a full tile, relative to the best */
} tma_tile;

/* The tiles, each one's reason in a line. A consumer warpgroup owns 64
 * rows × bn columns when bm = 128, 64 × bn / 2 when bm = 64. */
static const tma_tile tma_tiles[] = {
    /* the most outputs an operand byte feeds: large M and N */
    { "tma_bm128bn256", 0, 128, 256, 1.0 },
    /* half the columns: twice the tiles where N is short */
    { "tma_bm128bn128", 0, 128, 128, 0.9 },
    /* half the rows: small buckets waste no tensor-core rows */
    { "tma_bm64bn256", 0, 64, 256, 0.85 },
    /* the most tiles: fills the SMs for small M and N */
    { "tma_bm64bn128", 0, 64, 128, 0.75 },
};

static const kiln_variant_table tma_table = KILN_VARIANT_TABLE(tma_tile, tma_tiles);

static int tma_stages(const tma_tile *tile)
{
    int stages = TMA_STAGE_BUDGET / ((tile->bm + tile->bn) * TMA_ROW_BYTES);
    return stages > TMA_MAX_STAGES ? TMA_MAX_STAGES : stages;
}

/* tma.cuh's tma_tile::smem_bytes: alignment slack, the ring, the barriers. */
static unsigned tma_smem_bytes(const tma_tile *tile)
{
    int stages = tma_stages(tile);
    return (unsigned)(1024 + stages * (tile->bm + tile->bn) * TMA_ROW_BYTES + 2 * stages * 8);
}

/* The formats the TMA kernel multiplies as they are stored: BF16 on BF16
 * activations; E4M3 with a scale for the tensor or each row on E4M3
 * activations with a scale for each token, and E4M3 with a scale for each
 * 128 x 128 block on E4M3 activations with one for each token's 128 of K
 * (DeepSeek-V3's scheme). */
static int tma_fp8(kiln_format f)
{
    return f == KILN_FMT_FP8_TENSOR || f == KILN_FMT_FP8_CHANNEL || f == KILN_FMT_FP8_BLOCK;
}

static int tma_format(kiln_format f)
{
    return f == KILN_FMT_BF16 || tma_fp8(f);
}

/* Whether the TMA kernel reads k's weight from gemv_tc's row-major atoms
 * (the formats whose tc_format.h row says rows, wherever gemv_tc packs
 * them): the decode kernels' copy, the only one a session then holds. */
static int tma_atoms(const kiln_target *t, const kiln_linear_kernel *k)
{
    const kiln_format f = k->cfg.format;
    const kiln_gemv_tc_format *row = kiln_gemv_tc_format_get(f);
    return tma_format(f) && row && row->rows && kiln_gemv_tc_serves(t, f, k->cfg.n, k->cfg.k);
}

/* The map of k's weight in row-major atoms, a box a stage of bn rows and
 * 128 bytes of K, rows of 128 bytes in the 128-byte swizzle. BF16's atoms,
 * 16 rows × 128 bytes: (64 values, 16 rows, K / 64 atoms, N / 16 row
 * tiles), boxes of one atom of bn / 16 row tiles. FP8's, 16 rows × 64
 * bytes: (128 bytes: two rows, 8 of them, N / 16 row tiles, K / 64 atoms),
 * boxes of bn / 16 row tiles of two atoms, each atom's half of the tile in
 * the 64-byte swizzle of the MMA once the atoms' swapped rows 8 .. 15 have
 * been through the copy's (tma_e4m3_atoms); an odd last atom's partner lies
 * past the map and reads zeros. */
static kiln_tma tma_atoms_map(const kiln_linear_kernel *k, int bn)
{
    const uint64_t atoms = (uint64_t)k->cfg.k / 64,
                   row_tiles = (uint64_t)kiln_ceil_div(k->cfg.n, 16);
    if (k->cfg.format == KILN_FMT_BF16)
        return (kiln_tma){ .source = KILN_TMA_W, .elem_bytes = 2, .rank = 4,
                           .dims = { 64, 16, atoms, row_tiles },
                           .strides = { 128, 2048, atoms * 2048 },
                           .box = { 64, 16, 1, (unsigned)bn / 16 }, .swizzle = 128 };
    return (kiln_tma){ .source = KILN_TMA_W, .elem_bytes = 1, .rank = 4,
                       .dims = { 128, 8, row_tiles, atoms },
                       .strides = { 128, atoms * 1024, 1024 },
                       .box = { 128, 8, (unsigned)bn / 16, 2 }, .swizzle = 128 };
}

static kiln_act wgmma_act(const kiln_target *t, const kiln_linear_cfg *c, int64_t bucket)
{
    (void)t;
    (void)bucket;
    if (c->format == KILN_FMT_FP8_BLOCK)
        return KILN_ACT_FP8_G128;
    return tma_fp8(c->format) ? KILN_ACT_FP8_TOKEN : KILN_ACT_BF16;
}

/* A consumer's columns: the tile's, or half when the two split N. */
static int tma_consumer_cols(const tma_tile *tile)
{
    return tile->bm == 128 ? tile->bn : tile->bn / 2;
}

/* E4M3 sums a stage in a second set of accumulators (tma.cuh), which 128
 * columns a consumer leave room for; each of those then lies in one
 * 128-row block of a block-scaled W. */
static int tma_tile_takes(const tma_tile *tile, kiln_format f)
{
    return !tma_fp8(f) || (tma_consumer_cols(tile) <= 128 && tile->bn % 128 == 0);
}

/* SMs the tiles are spread over: the target's, or an H100's where the
 * name does not fix it. */
static int64_t tma_sms(const kiln_target *t)
{
    return t->sm_count > 0 ? t->sm_count : 132;
}

/* The tile of least estimated time for m × n on t: whole waves of tiles
 * over the SMs, each tile's work at its speed. Ties go to the larger. */
static const tma_tile *tma_choose(const kiln_target *t, kiln_format f, int64_t m, int64_t n)
{
    const int64_t sms = tma_sms(t);
    const tma_tile *best = NULL;
    double best_time = 0;
    for (size_t i = 0; i < KILN_ARRAY_LEN(tma_tiles); i++) {
        const tma_tile *tile = &tma_tiles[i];
        if (!tma_tile_takes(tile, f))
            continue;
        int64_t count = kiln_ceil_div(m, tile->bm) * kiln_ceil_div(n, tile->bn);
        double waves = (double)kiln_ceil_div(count, sms);
        double time = waves * tile->bm * tile->bn / tile->speed;
        if (!best || time < best_time) {
            best = tile;
            best_time = time;
        }
    }
    return best;
}

static void wgmma_variant(const kiln_target *t, const kiln_linear_cfg *c, int64_t bucket,
                          char *buf, size_t size)
{
    const char *name = tma_format(c->format) ? tma_choose(t, c->format, bucket, c->n)->name
                                             : kiln_variant_name_for_bucket(&tile_table, bucket);
    snprintf(buf, size, "%s", name);
}

static int wgmma_candidates(const kiln_target *t, const kiln_linear_cfg *c, const char **names,
                            int max)
{
    (void)t;
    int n = 0;
    if (tma_format(c->format)) {
        for (size_t i = 0; i < KILN_ARRAY_LEN(tma_tiles) && n < max; i++)
            if (tma_tile_takes(&tma_tiles[i], c->format))
                names[n++] = tma_tiles[i].name;
    } else {
        for (size_t i = 0; i < KILN_ARRAY_LEN(tiles) && n < max; i++)
            names[n++] = tiles[i].name;
    }
    return n;
}

/* The TMA kernel counts its tiles in an int and launches at most one block
 * a tile: m x n in the smallest tiles must stay below 2^31. */
static int tma_too_many_tiles(int64_t m, int64_t n)
{
    return kiln_ceil_div(m, 64) > INT_MAX / kiln_ceil_div(n, 128);
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
    return !kiln_linear_group_fits(c, kiln_format_get(c->format)->block, why, size);
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
    if (tma_format(c->format) && tma_too_many_tiles(bucket, c->n)) {
        snprintf(why, size, "M bucket %lld x N=%lld: more than 2^31 - 1 tiles", (long long)bucket,
                 (long long)c->n);
        return 0;
    }
    return 1;
}

/* The tile of k on t (one of *out and *tma, the other NULL), or a refusal
 * naming what wgmma does not build. */
static kiln_status wgmma_check(const kiln_target *t, const kiln_linear_kernel *k,
                               const wgmma_tile **out, const tma_tile **tma)
{
    char why[128];
    if (!kiln_format_get(k->cfg.format))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "wgmma: format %d is not a kiln_format",
                         (int)k->cfg.format);
    const int direct = tma_format(k->cfg.format);
    *out = direct ? NULL : tile_named(k->variant);
    *tma = direct ? kiln_variant_named(&tma_table, k->variant) : NULL;
    if (!*out && !*tma)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "wgmma: no variant \"%s\" for %s (%s)", k->variant,
                         kiln_format_get(k->cfg.format)->name,
                         direct ? "tma_bm128bn256, tma_bm128bn128, tma_bm64bn256, tma_bm64bn128"
                                : "bm64bn64, bm64bn128");
    if (*tma && !tma_tile_takes(*tma, k->cfg.format))
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "wgmma: %s sums E4M3 in two sets of accumulators, which %d columns a "
                         "consumer leave no registers for",
                         k->variant, tma_consumer_cols(*tma));
    if (!wgmma_is_supported(t, why, sizeof why))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "wgmma: %s", why);
    kiln_status common = kiln_linear_kernel_check("wgmma", k, wgmma_act(t, &k->cfg, 0));
    if (common != KILN_OK)
        return common;
    if (shape_refused(&k->cfg, why, sizeof why))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "wgmma: %s", why);
    return KILN_OK;
}

static kiln_status emit_tma(const kiln_target *t, const kiln_linear_kernel *k,
                            const tma_tile *tile, const char *entry, char *buf, size_t size)
{
    const char *scale = k->cfg.format == KILN_FMT_FP8_TENSOR    ? "tma_token_scaled<false>"
                        : k->cfg.format == KILN_FMT_FP8_CHANNEL ? "tma_token_scaled<true>"
                        : k->cfg.format == KILN_FMT_FP8_BLOCK   ? "tma_block_scaled"
                                                                : "tma_unscaled";
    char epi_args[96];
    return kiln_backend_source(
        buf, size, "wgmma",
        "#include \"kiln/tma.cuh\"\n"
        "\n"
        "using tile = kiln::tma_tile</*bm*/ %d, /*bn*/ %d, /*stages*/ %d>;\n"
        "using scale = kiln::%s;\n"
        "using epilogue = kiln::epilogue<%s>;\n"
        "static_assert(tile::smem_bytes == %u, \"the launch's dynamic shared memory\");\n"
        "\n"
        "extern \"C\" __global__ void __launch_bounds__(tile::threads, 1)\n"
        "%s(const kiln_linear_args args, const __grid_constant__ kiln::tma_map x,\n"
        "    const __grid_constant__ kiln::tma_map w)\n"
        "{\n"
        "    kiln::tma_gemm<kiln::%s, tile, scale, epilogue, /*n*/ %lld, /*k*/ %lld>(args, x, w);\n"
        "}\n",
        tile->bm, tile->bn, tma_stages(tile), scale,
        kiln_epilogue_template_args(k->cfg.epilogue, epi_args, sizeof epi_args),
        tma_smem_bytes(tile), entry,
        tma_fp8(k->cfg.format) ? (tma_atoms(t, k) ? "tma_e4m3_atoms" : "tma_e4m3")
        : tma_atoms(t, k)      ? "tma_bf16_atoms"
                               : "tma_bf16",
        (long long)k->cfg.n, (long long)k->cfg.k);
}

static kiln_status wgmma_emit(const kiln_target *t, const kiln_linear_kernel *k, const char *entry,
                              char *buf, size_t size)
{
    const wgmma_tile *tile = NULL;
    const tma_tile *tma = NULL;
    kiln_status st = wgmma_check(t, k, &tile, &tma);
    if (st != KILN_OK)
        return st;
    if (tma)
        return emit_tma(t, k, tma, entry, buf, size);
    char epi_args[96], group[64] = "";
    if (kiln_format_get(k->cfg.format)->grouped)
        snprintf(group, sizeof group, "</*group*/ %lld, /*n*/ %lld>", (long long)k->cfg.group,
                 (long long)k->cfg.n);
    return kiln_backend_source(
        buf, size, "wgmma",
        "#include \"kiln/wgmma.cuh\"\n"
        "\n"
        "using format = kiln::fmt_%s%s;\n"
        "using tile = kiln::wgmma_tile</*bn*/ %d>;\n"
        "using epilogue = kiln::epilogue<%s>;\n"
        "static_assert(tile::smem_bytes == %u, \"the launch's dynamic shared memory\");\n"
        "\n"
        "extern \"C\" __global__ void __launch_bounds__(tile::threads, 1)\n"
        "%s(const kiln_linear_args args)\n"
        "{\n"
        "    kiln::wgmma_gemm<format, tile, epilogue, /*n*/ %lld, /*k*/ %lld>(args);\n"
        "}\n",
        kiln_format_get(k->cfg.format)->name, group, tile->bn,
        kiln_epilogue_template_args(k->cfg.epilogue, epi_args, sizeof epi_args),
        smem_bytes(tile), entry, (long long)k->cfg.n, (long long)k->cfg.k);
}

/* A 2-D map of a row-major matrix of rows × k values of elem bytes, read
 * in boxes of 128 bytes of K × box_rows with the 128-byte swizzle. */
static kiln_tma tma_map(kiln_tma_source source, unsigned elem, int64_t rows, int64_t k,
                        int box_rows)
{
    return (kiln_tma){ .source = source, .elem_bytes = elem,
                       .dims = { (uint64_t)k, (uint64_t)rows }, .strides = { (uint64_t)k * elem },
                       .box = { TMA_ROW_BYTES / elem, (unsigned)box_rows }, .swizzle = 128 };
}

static kiln_status wgmma_launch(const kiln_target *t, const kiln_linear_kernel *k, int64_t m,
                                kiln_launch *out)
{
    const wgmma_tile *tile = NULL;
    const tma_tile *tma = NULL;
    kiln_status st = wgmma_check(t, k, &tile, &tma);
    if (st != KILN_OK)
        return st;
    if (m < 1 || kiln_ceil_div(m, WGMMA_BM) > WGMMA_MAX_GRID_Y)
        return kiln_fail(KILN_ERR_SHAPE, "wgmma %s: cannot launch for M = %lld (1 to %lld)",
                         k->variant, (long long)m, (long long)WGMMA_MAX_GRID_Y * WGMMA_BM);
    if (tma && tma_too_many_tiles(m, k->cfg.n))
        return kiln_fail(KILN_ERR_SHAPE, "wgmma %s: M = %lld x N = %lld is more than 2^31 - 1 tiles",
                         k->variant, (long long)m, (long long)k->cfg.n);
    if (tma) {
        const unsigned elem = tma_fp8(k->cfg.format) ? 1 : 2;
        *out = (kiln_launch){
            .grid = { (unsigned)(kiln_ceil_div(m, tma->bm) * kiln_ceil_div(k->cfg.n, tma->bn)),
                      1, 1 },
            .block = { TMA_THREADS, 1, 1 },
            .smem = tma_smem_bytes(tma),
            .persistent = 1,
            .tma = { tma_map(KILN_TMA_X, elem, m, k->cfg.k, tma->bm),
                     tma_atoms(t, k) ? tma_atoms_map(k, tma->bn)
                                     : tma_map(KILN_TMA_W, elem, k->cfg.n, k->cfg.k, tma->bn) },
            .n_tma = 2,
        };
        return KILN_OK;
    }
    *out = (kiln_launch){
        .grid = { (unsigned)kiln_ceil_div(k->cfg.n, tile->bn), (unsigned)kiln_ceil_div(m, WGMMA_BM),
                  1 },
        .block = { WGMMA_THREADS, 1, 1 },
        .smem = smem_bytes(tile),
    };
    return KILN_OK;
}

/* BF16's and FP8 per-tensor and per-channel TMA kernels read gemv_tc's
 * packed copy (tma_atoms); the rest kiln's storage layout. */
static kiln_status wgmma_layout(const kiln_target *t, const kiln_linear_kernel *k,
                                kiln_weight_layout *out)
{
    if (tma_atoms(t, k))
        return kiln_gemv_tc_layout(t, k, out);
    *out = (kiln_weight_layout){ 0 };
    return KILN_OK;
}

const kiln_backend kiln_backend_wgmma = {
    .name = "wgmma",
    .formats = KILN_FMT_ALL,
    .epilogues = KILN_EPI_ALL,
    .is_supported = wgmma_is_supported,
    .can_implement = wgmma_can_implement,
    .act = wgmma_act,
    .variant = wgmma_variant,
    .candidates = wgmma_candidates,
    .emit = wgmma_emit,
    .launch = wgmma_launch,
    .layout = wgmma_layout,
};
