/* The wgmma_tc backend's host side: Hopper warpgroup MMAs with the weight
 * as the register operand, decoded from the gemv_tc packed layout
 * (kernels/wgmma/wgmma_tc.cuh), so that a weight's one device copy serves
 * the decode kernels and these. Its formats are those whose A fragment
 * is one BF16 term: exact (NVFP4, MXFP4, GGML MXFP4, MXFP8) or the
 * weight rounded once to BF16 (F16, Q8_0, Q4_0, Q4_K, Q6_K), but BF16 and
 * FP8 per-tensor and per-channel, whose packed atoms are row-major for
 * wgmma's TMA kernel; its activations are
 * BF16 in the packed layout's k order (bf16-tc), which a quantization
 * step before the linear writes. */
#include "kernels/registry/backend.h"

#include "kernels/gemv/pack.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

enum {
    WTC_THREADS = 384,         /* a producer and two consumer warpgroups */
    WTC_SMEM_MAX = 227 * 1024, /* a block's dynamic shared memory on sm_90 */
    WTC_MAX_STAGES = 8,
};

typedef struct wtc_tile {
    const char *name;
    int64_t max_m; /* unused: the tile is chosen by wtc_choose */
    int bt;        /* tokens a tile: the MMA's N */
    int split;     /* 1: 128 rows a block, a consumer's 64 each; 2: 64, K split between them */
    double speed;  /* tensor-core throughput of a full tile, relative to the best */
} wtc_tile;

/* The tiles, each one's reason in a line. Decoding a stage's weights costs
 * the same whatever the tile's tokens, so the narrower tiles are slower
 * per token; their speeds are measured on the H200 (kiln-bench gemm,
 * 28672x4096 and 4096x14336, NVFP4 and MXFP4: time per tile per token).
 * A split tile does half a 128-row tile's work in a little more than half
 * its time (WTC_SPLIT_COST: the sums' hand-over, x read for 64 rows). */
static const wtc_tile wtc_tiles[] = {
    /* the most outputs a decoded weight feeds: large M */
    { "bt256", 0, 256, 1, 1.0 },
    /* half the tokens: twice the tiles where M is short */
    { "bt128", 0, 128, 1, 0.6 },
    /* the most tiles: small buckets waste fewer token columns */
    { "bt64", 0, 64, 1, 0.35 },
    /* the same, twice the blocks again where N is short (a down projection) */
    { "bt256s2", 0, 256, 2, 1.0 },
    { "bt128s2", 0, 128, 2, 0.6 },
    { "bt64s2", 0, 64, 2, 0.35 },
};

#define WTC_SPLIT_COST 1.18 /* a split tile's time over half a 128-row tile's */

static int wtc_rows(const wtc_tile *tile) { return 128 / tile->split; }

static const kiln_variant_table wtc_table = KILN_VARIANT_TABLE(wtc_tile, wtc_tiles);

#define WTC_BIT(f) (1u << KILN_FMT_##f)

/* The formats whose A fragment the kernel makes in one BF16 term: exactly
 * (wtc_exact) or rounded once (wtc_rounded, wtc_f16). */
#define WTC_FORMATS                                                                               \
    (WTC_BIT(F16) | WTC_BIT(NVFP4) | WTC_BIT(MXFP4) | WTC_BIT(GGML_MXFP4) | WTC_BIT(Q8_0) |     \
     WTC_BIT(Q4_0) | WTC_BIT(Q4_K) | WTC_BIT(Q6_K) | WTC_BIT(MXFP8))

static int wtc_format(kiln_format f)
{
    return (unsigned)f < KILN_FMT_COUNT && (WTC_FORMATS & (1u << f));
}

/* A stage: BT rows of 128 bytes of x, the block's row tiles' atoms, scale
 * records and super-records (wtc_tile in the template). */
static unsigned wtc_stage_bytes(const wtc_tile *tile, kiln_format f)
{
    const kiln_gemv_tc_format *p = kiln_gemv_tc_format_get(f);
    return (unsigned)(tile->bt * 128 +
                      wtc_rows(tile) / 16 * (p->bytes + 8 * p->record + 8 * p->super));
}

/* The second consumer's sums of a split tile: BT / 2 floats a thread. */
static unsigned wtc_red_bytes(const wtc_tile *tile)
{
    return tile->split == 2 ? 128u * (unsigned)(tile->bt / 2) * 4u : 0;
}

/* As many stages as fit beside the sums, the barriers and the alignment
 * slack (wtc_smem_bytes); a split tile's ring is even, half each
 * consumer's (wgmma_tc.cuh). */
static int wtc_stages(const wtc_tile *tile, kiln_format f)
{
    const unsigned room = WTC_SMEM_MAX - 1024 - wtc_red_bytes(tile);
    int stages = (int)(room / (wtc_stage_bytes(tile, f) + 16));
    if (stages > WTC_MAX_STAGES)
        stages = WTC_MAX_STAGES;
    return tile->split == 2 ? stages & ~1 : stages;
}

static unsigned wtc_smem_bytes(const wtc_tile *tile, kiln_format f)
{
    int stages = wtc_stages(tile, f);
    return 1024 + (unsigned)stages * wtc_stage_bytes(tile, f) + wtc_red_bytes(tile) +
           2 * (unsigned)stages * 8;
}

static int64_t wtc_sms(const kiln_target *t)
{
    return t->sm_count > 0 ? t->sm_count : 132;
}

/* The tile of least estimated time for m × n on t: whole waves of tiles
 * over the SMs, each tile's work at its speed. Ties go to the larger. */
static const wtc_tile *wtc_choose(const kiln_target *t, int64_t m, int64_t n)
{
    const int64_t sms = wtc_sms(t);
    const wtc_tile *best = NULL;
    double best_time = 0;
    for (size_t i = 0; i < KILN_ARRAY_LEN(wtc_tiles); i++) {
        const wtc_tile *tile = &wtc_tiles[i];
        int64_t count = kiln_ceil_div(m, tile->bt) * kiln_ceil_div(n, wtc_rows(tile));
        double time = (double)kiln_ceil_div(count, sms) * tile->bt / tile->speed;
        if (tile->split == 2)
            time *= 0.5 * WTC_SPLIT_COST;
        if (!best || time < best_time) {
            best = tile;
            best_time = time;
        }
    }
    return best;
}

static void wtc_variant(const kiln_target *t, const kiln_linear_cfg *c, int64_t bucket, char *buf,
                        size_t size)
{
    snprintf(buf, size, "%s", wtc_choose(t, bucket, c->n)->name);
}

static int wtc_candidates(const kiln_target *t, const kiln_linear_cfg *c, const char **names,
                          int max)
{
    (void)t;
    (void)c;
    int n = 0;
    for (size_t i = 0; i < KILN_ARRAY_LEN(wtc_tiles) && n < max; i++)
        names[n++] = wtc_tiles[i].name;
    return n;
}

static kiln_act wtc_act(const kiln_target *t, const kiln_linear_cfg *c, int64_t bucket)
{
    (void)t;
    (void)c;
    (void)bucket;
    return KILN_ACT_BF16_TC;
}

static int wtc_is_supported(const kiln_target *t, char *why, size_t size)
{
    if (t->wgmma)
        return 1;
    snprintf(why, size, "needs wgmma (sm_90a), target is %s", t->name);
    return 0;
}

/* The kernel counts tiles in an int: m x n in the smallest tiles must
 * stay below 2^31. */
static int wtc_too_many_tiles(int64_t m, int64_t n)
{
    return kiln_ceil_div(m, 64) > INT_MAX / kiln_ceil_div(n, 64);
}

/* Why c cannot be built, or 0 when it can: the packed layout's limits
 * (K in whole atoms, sizes) and the kernel's int template arguments. */
static int wtc_refuses(const kiln_target *t, const kiln_linear_cfg *c, char *why, size_t size)
{
    if (!wtc_format(c->format)) {
        snprintf(why, size, "%s has no one-term BF16 decoding",
                 kiln_format_get(c->format)->name);
        return 1;
    }
    if (c->n > INT_MAX || c->k > INT_MAX) {
        snprintf(why, size, "N=%lld, K=%lld: both must be below 2^31", (long long)c->n,
                 (long long)c->k);
        return 1;
    }
    return kiln_gemv_tc_refuses(t, c->format, c->n, c->k, why, size);
}

static int wtc_can_implement(const kiln_target *t, const kiln_linear_cfg *c, int64_t bucket,
                             char *why, size_t size)
{
    if (wtc_refuses(t, c, why, size))
        return 0;
    if (wtc_too_many_tiles(bucket, c->n)) {
        snprintf(why, size, "M bucket %lld x N=%lld: more than 2^31 - 1 tiles", (long long)bucket,
                 (long long)c->n);
        return 0;
    }
    return 1;
}

static kiln_status wtc_check(const kiln_target *t, const kiln_linear_kernel *k,
                             const wtc_tile **out)
{
    char why[256];
    if (!kiln_format_get(k->cfg.format))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "wgmma_tc: format %d is not a kiln_format",
                         (int)k->cfg.format);
    if (!(*out = kiln_variant_named(&wtc_table, k->variant)))
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "wgmma_tc: no variant \"%s\" (bt256, bt128, bt64, bt256s2, bt128s2, "
                         "bt64s2)",
                         k->variant);
    if (!wtc_is_supported(t, why, sizeof why))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "wgmma_tc: %s", why);
    kiln_status common = kiln_linear_kernel_check("wgmma_tc", k, KILN_ACT_BF16_TC);
    if (common != KILN_OK)
        return common;
    if (wtc_refuses(t, &k->cfg, why, sizeof why))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "wgmma_tc: %s", why);
    return KILN_OK;
}

static kiln_status wtc_emit(const kiln_target *t, const kiln_linear_kernel *k, const char *entry,
                            char *buf, size_t size)
{
    const wtc_tile *tile;
    kiln_status st = wtc_check(t, k, &tile);
    if (st != KILN_OK)
        return st;
    const kiln_gemv_tc_format *p = kiln_gemv_tc_format_get(k->cfg.format);
    char epi_args[96];
    return kiln_backend_source(
        buf, size, "wgmma_tc",
        "#include \"kiln/wgmma_tc.cuh\"\n"
        "\n"
        "using format = kiln::tc_%s;\n"
        "using tile = kiln::wtc_tile<format, /*bt*/ %d, /*stages*/ %d, /*split*/ %d>;\n"
        "using epilogue = kiln::epilogue<%s>;\n"
        "static_assert(tile::smem_bytes == %u, \"the launch's dynamic shared memory\");\n"
        "\n"
        "extern \"C\" __global__ void __launch_bounds__(tile::threads, 1)\n"
        "%s(const kiln_linear_args args, const __grid_constant__ kiln::tma_map x,\n"
        "    const __grid_constant__ kiln::tma_map w%s%s)\n"
        "{\n"
        "    kiln::wtc_gemm<format, tile, epilogue, /*n*/ %lld, /*k*/ %lld>(args, x, w, %s, %s);\n"
        "}\n",
        kiln_format_get(k->cfg.format)->name, tile->bt, wtc_stages(tile, k->cfg.format),
        tile->split,
        kiln_epilogue_template_args(k->cfg.epilogue, epi_args, sizeof epi_args),
        wtc_smem_bytes(tile, k->cfg.format), entry,
        p->record ? ", const __grid_constant__ kiln::tma_map rec" : "",
        p->super ? ", const __grid_constant__ kiln::tma_map sup" : "", (long long)k->cfg.n,
        (long long)k->cfg.k, p->record ? "&rec" : "nullptr", p->super ? "&sup" : "nullptr");
}

/* A 3-D map of `planes` planes of `rows` rows, `bytes` a row, starting
 * `offset` bytes into its buffer: boxes of one row of `box_planes` planes. */
static kiln_tma wtc_map(kiln_tma_source source, unsigned bytes, uint64_t rows, uint64_t planes,
                        uint64_t offset, unsigned box_planes)
{
    return (kiln_tma){ .source = source, .elem_bytes = 8, .rank = 3,
                       .dims = { bytes / 8, rows, planes }, .strides = { bytes, rows * bytes },
                       .offset = offset,
                       .box = { bytes / 8, 1, box_planes } };
}

static kiln_status wtc_launch(const kiln_target *t, const kiln_linear_kernel *k, int64_t m,
                              kiln_launch *out)
{
    const wtc_tile *tile;
    kiln_status st = wtc_check(t, k, &tile);
    if (st != KILN_OK)
        return st;
    if (m < 1 || wtc_too_many_tiles(m, k->cfg.n))
        return kiln_fail(KILN_ERR_SHAPE, "wgmma_tc %s: cannot launch for M = %lld x N = %lld",
                         k->variant, (long long)m, (long long)k->cfg.n);
    const kiln_gemv_tc_format *p = kiln_gemv_tc_format_get(k->cfg.format);
    const uint64_t atoms = (uint64_t)k->cfg.k / 64, tiles16 = (uint64_t)kiln_ceil_div(k->cfg.n, 16);
    const unsigned row_tiles = (unsigned)wtc_rows(tile) / 16;
    *out = (kiln_launch){
        .grid = { (unsigned)(kiln_ceil_div(m, tile->bt) * kiln_ceil_div(k->cfg.n, wtc_rows(tile))),
                  1, 1 },
        .block = { WTC_THREADS, 1, 1 },
        .smem = wtc_smem_bytes(tile, k->cfg.format),
        .persistent = 1,
        .tma = { { .source = KILN_TMA_X, .elem_bytes = 2, .rank = 2,
                   .dims = { (uint64_t)k->cfg.k, (uint64_t)m },
                   .strides = { (uint64_t)k->cfg.k * 2 }, .box = { 64, (unsigned)tile->bt },
                   .swizzle = 128 } },
        .n_tma = 1,
    };
    /* The packed arrays (kernels/gemv/pack.h) in 8-byte words: an atom's
     * words, the row tile's atoms, the row tiles; the records the same,
     * and the super-records a record per 256 values after them. */
    out->tma[out->n_tma++] = wtc_map(KILN_TMA_W, (unsigned)p->bytes, atoms, tiles16, 0, row_tiles);
    if (p->record)
        out->tma[out->n_tma++] = wtc_map(KILN_TMA_W_SCALE, 8u * (unsigned)p->record, atoms,
                                         tiles16, 0, row_tiles);
    if (p->super)
        out->tma[out->n_tma++] =
            wtc_map(KILN_TMA_W_SCALE, 8u * (unsigned)p->super, atoms / 4, tiles16,
                    tiles16 * atoms * 8u * (unsigned)p->record, row_tiles);
    return KILN_OK;
}

const kiln_backend kiln_backend_wgmma_tc = {
    .name = "wgmma_tc",
    .formats = WTC_FORMATS,
    .epilogues = KILN_EPI_ALL,
    .is_supported = wtc_is_supported,
    .can_implement = wtc_can_implement,
    .act = wtc_act,
    .variant = wtc_variant,
    .candidates = wtc_candidates,
    .emit = wtc_emit,
    .launch = wtc_launch,
    .layout = kiln_gemv_tc_layout,
};
