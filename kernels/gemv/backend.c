/* The gemv backend's host side: decode-sized linears (M bucket <= 16) as
 * bandwidth-bound matrix-vector products, kernels/gemv/gemv.cuh: f32 FMA
 * on kiln's storage layout, every format, sm_75+.
 * Where gemv_tc serves a linear (kernels/gemv/tc.c: tensor cores on packed
 * weights) it comes first in the format's priority list; this kernel
 * takes the rest: F32, the GGML formats without a packed layout, sm_75, a
 * K of part atoms. It picks the M class variant and the block
 * shape, and instantiates the template. The layout arithmetic mirrors
 * gemv_layout in the template, which checks the emitted total against
 * its own. */
#include "kernels/registry/backend.h"
#include "kernels/gemv/gemv_format.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

/* How a format streams: its row of kernels/gemv/gemv_format.h, which the
 * device traits (gemv_formats.cuh) are built from too. */
typedef struct gemv_format {
    int unit;       /* values one lane decodes at once; K must be a multiple; 0: no row */
    int aligned;    /* every unit starts 16-byte aligned in every row */
    int scale_cols; /* the stream also copies one scale per scale_cols values; 0: none */
    int scale_elem; /* bytes of one such scale */
    int offset;     /* keeps the sums of x per run of 8 (the K-quants' minimum) */
    int zero_points; /* also copies an int8 zero point per scale (integer groups) */
} gemv_format;

#define FORMAT_ROW(fmt, name, unit_, aligned_, rows_, cols_, elem_, offset_)                    \
    [KILN_FMT_##fmt] = { .unit = unit_, .aligned = aligned_, .scale_cols = cols_,               \
                         .scale_elem = elem_, .offset = offset_ },
static const gemv_format formats[KILN_FMT_COUNT] = { KILN_GEMV_FORMATS(FORMAT_ROW) };
#undef FORMAT_ROW
/* The formats with a row, and the integer groups, whose stream takes its
 * scale columns from the weight's group (gemv_format_of; the device's
 * gemv_int_group). */
#define FORMAT_BIT(fmt, ...) | 1u << KILN_FMT_##fmt
#define GEMV_FORMAT_BITS (0 KILN_GEMV_FORMATS(FORMAT_BIT) | KILN_FMT_INT_GROUPS)
#define FORMAT_COUNT(...) +1
_Static_assert(0 KILN_GEMV_FORMATS(FORMAT_COUNT) == KILN_FMT_Q4_1 + 1,
               "one row per format up to Q4_1");
#undef FORMAT_COUNT

/* How c's weight streams: its format's row, or for an integer group a
 * 16-byte unit and, along K, one f32 scale a group and its zero point
 * (per row: the row scale, no zero points). unit 0: no kernel. */
static gemv_format gemv_format_of(const kiln_linear_cfg *c)
{
    if ((unsigned)c->format >= KILN_FMT_COUNT)
        return (gemv_format){ 0 };
    const kiln_format_info *fi = kiln_format_get(c->format);
    if (!fi->grouped)
        return formats[c->format];
    const int along = c->group > 0 && c->group < c->k && c->group <= INT_MAX;
    if (fi->zero_point && !along)
        return (gemv_format){ 0 };
    return (gemv_format){ .unit = fi->block == 8 ? 32 : 16, .aligned = 1,
                          .scale_cols = along ? (int)c->group : 0, .scale_elem = along ? 4 : 0,
                          .zero_points = fi->zero_point };
}

/* The M classes, smallest first: a bucket takes the first whose max_m
 * covers it, and its kernel computes rows < args.m of at most max_m. Each
 * column's reason:
 *   rows        output rows a warp: several from m = 4, or x's shared-memory reads bind
 *   warps       a block's: 8 share one f32 copy of x
 *   lane_bytes  weight bytes a lane takes a stage, a unit at least: 36 at m <= 2 spread
 *               a stage's bookkeeping over two units of the 16- to 18-byte formats
 *   stages      slots a warp ring, stages - 1 in flight: 2 at m = 16, four rows a warp
 *   min_blocks  blocks an SM the registers are budgeted for: m = 16's 4 x 16 tile leaves 1 */
typedef struct gemv_variant {
    const char *name;
    int64_t max_m;
    int rows, warps, lane_bytes, stages, min_blocks;
} gemv_variant;

static const gemv_variant variants[] = {
    { "m1", 1, 1, 8, 36, 3, 4 },
    { "m2", 2, 1, 8, 36, 3, 4 },
    { "m4", 4, 2, 8, 18, 3, 2 },
    { "m8", 8, 2, 8, 18, 3, 2 },
    { "m16", 16, 4, 8, 18, 2, 1 },
};

/* The largest bucket: the last class's. */
#define GEMV_MAX_M (variants[KILN_ARRAY_LEN(variants) - 1].max_m)

/* The tuning of the blocks, each constant's reason in a line (the
 * numbers behind them are in the commit messages that set them). */
enum {
    /* K splits while the launch has fewer warps: 16 an SM keep an H200's bandwidth busy */
    GEMV_SPLIT_WARPS = 2048,
    /* bytes of the f32 x tile where K needs more: four blocks of 8 warps an SM of sm_90 */
    GEMV_X_BUDGET = 24 * 1024,
};

/* Everything a kernel's source and launch need. */
typedef struct gemv_config {
    const gemv_variant *v;
    int units, k_split, tile_k;
    unsigned smem;
    unsigned blocks;
} gemv_config;

static const kiln_variant_table variant_table = KILN_VARIANT_TABLE(gemv_variant, variants);

static const gemv_variant *variant_for_bucket(int64_t m)
{
    return kiln_variant_for_bucket(&variant_table, m);
}

static const gemv_variant *variant_named(const char *name)
{
    return kiln_variant_named(&variant_table, name);
}

static int64_t round16(int64_t v) { return (v + 15) / 16 * 16; }

/* A block's shared memory and x tile for a k-split, as gemv_layout lays
 * them out. */
typedef struct gemv_geometry {
    const gemv_variant *v;
    const gemv_format *f;
    int64_t k, stage_k, slot;
} gemv_geometry;

static int64_t geometry_tile_k(const gemv_geometry *g, int split)
{
    /* All of K (to a multiple of 32, the padding's period) when the budget
     * holds it, else whole stages of every slice, as many as the budget
     * holds and one at least. Eighths of a byte per tile value: 4 bytes
     * of f32, half a byte of bank padding, half of run sums. */
    const int64_t step = split * g->stage_k;
    const int64_t eighths = (int64_t)g->v->max_m * (36 + (g->f->offset ? 4 : 0));
    const int64_t fits = GEMV_X_BUDGET * 8 / eighths;
    const int64_t whole = kiln_ceil_div(g->k, 32) * 32;
    if (whole <= fits || whole <= step)
        return whole;
    return fits >= step ? fits / step * step : step;
}

static int64_t geometry_smem(const gemv_geometry *g, int split)
{
    const gemv_variant *v = g->v;
    const int64_t tile_k = geometry_tile_k(g, split);
    const int64_t x_bytes = (int64_t)v->max_m * (tile_k + tile_k / 8) * 4;
    const int64_t xsum_bytes = g->f->offset ? (int64_t)v->max_m * (tile_k / 8) * 4 : 0;
    const int64_t ring_bytes = (int64_t)v->warps * v->stages * v->rows * g->slot;
    const int64_t red_bytes = split > 1 ? (int64_t)v->warps * v->rows * v->max_m * 4 : 0;
    return x_bytes + xsum_bytes + ring_bytes + red_bytes;
}

/* The block shape of variant v for linear c on t, or 0 with the reason. */
static int gemv_configure(const kiln_target *t, const kiln_linear_cfg *c, const gemv_variant *v,
                          gemv_config *out, char *why, size_t size)
{
    const kiln_format_info *fi = kiln_format_get(c->format);
    const gemv_format fmt = gemv_format_of(c), *f = &fmt;
    if (!fi) {
        snprintf(why, size, "format %d is not a kiln_format", (int)c->format);
        return 0;
    }
    if (!f->unit && fi->zero_point) {
        snprintf(why, size, "%s with one group a row: zero points stream along K only",
                 fi->name);
        return 0;
    }
    if (!f->unit) {
        snprintf(why, size, "no kernel for %s", fi->name);
        return 0;
    }
    if (c->n > INT_MAX || c->k > INT_MAX || c->k / fi->block * fi->block_bytes > INT_MAX) {
        snprintf(why, size, "N=%lld, K=%lld: N, K and the row's bytes must be below 2^31",
                 (long long)c->n, (long long)c->k);
        return 0;
    }
    if (c->k % f->unit) {
        snprintf(why, size,
                 "K=%lld is not a multiple of %d, the %s values a lane decodes from one load",
                 (long long)c->k, f->unit, fi->name);
        return 0;
    }
    int units = (int)((int64_t)v->lane_bytes * fi->block / ((int64_t)f->unit * fi->block_bytes));
    if (units < 1)
        units = 1;
    gemv_geometry g = { .v = v, .f = f, .k = c->k, .stage_k = 32 * (int64_t)units * f->unit };
    if (!kiln_linear_group_fits(c, f->unit, why, size))
        return 0;
    if (fi->grouped && c->group != 0 && c->group != c->k && g.stage_k % c->group) {
        snprintf(why, size, "%s group %lld does not divide %s's stage of %lld values", fi->name,
                 (long long)c->group, v->name, (long long)g.stage_k);
        return 0;
    }
    const int64_t stage_bytes = g.stage_k / fi->block * fi->block_bytes;
    g.slot = round16(stage_bytes + (f->aligned ? 0 : 32)) +
             (f->scale_cols ? round16(kiln_ceil_div(g.stage_k, f->scale_cols) * f->scale_elem + 8)
                            : 0) +
             (f->zero_points ? round16(kiln_ceil_div(g.stage_k, f->scale_cols) + 8) : 0);

    const int64_t limit = kiln_block_smem_limit(t);
    if (geometry_smem(&g, 1) > limit) {
        snprintf(why, size, "%s at %s: needs %lld bytes of shared memory per block, %s allows %lld",
                 v->name, fi->name, (long long)geometry_smem(&g, 1), t->name, (long long)limit);
        return 0;
    }
    /* Split K across the warps of a block while the launch is short of
     * warps, every slice keeps a stage, and the wider x tile fits. */
    const int64_t row_groups = kiln_ceil_div(c->n, v->rows);
    int split = 1;
    while (split * 2 <= v->warps && row_groups * split < GEMV_SPLIT_WARPS &&
           c->k >= 2 * split * g.stage_k && geometry_smem(&g, 2 * split) <= limit)
        split *= 2;
    *out = (gemv_config){
        .v = v,
        .units = units,
        .k_split = split,
        .tile_k = (int)geometry_tile_k(&g, split),
        .smem = (unsigned)geometry_smem(&g, split),
        .blocks = (unsigned)kiln_ceil_div(c->n, (int64_t)(v->warps / split) * v->rows),
    };
    return 1;
}

static int gemv_can_implement(const kiln_target *t, const kiln_linear_cfg *c, int64_t bucket,
                              char *why, size_t size)
{
    if (bucket > GEMV_MAX_M) {
        snprintf(why, size, "M bucket %lld > %lld", (long long)bucket, (long long)GEMV_MAX_M);
        return 0;
    }
    gemv_config cfg;
    return gemv_configure(t, c, variant_for_bucket(bucket), &cfg, why, size);
}

/* The configuration of k, or a refusal naming what gemv does not build. */
static kiln_status gemv_check(const kiln_target *t, const kiln_linear_kernel *k, gemv_config *out)
{
    const gemv_variant *v = variant_named(k->variant);
    if (!v)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gemv: no variant \"%s\" (m1, m2, m4, m8, m16)",
                         k->variant);
    kiln_status common = kiln_linear_kernel_check("gemv", k, KILN_ACT_BF16);
    if (common != KILN_OK)
        return common;
    char why[256];
    if (!gemv_configure(t, &k->cfg, v, out, why, sizeof why))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gemv: %s", why);
    return KILN_OK;
}

static kiln_status gemv_emit(const kiln_target *t, const kiln_linear_kernel *k, const char *entry,
                             char *buf, size_t size)
{
    gemv_config c;
    kiln_status st = gemv_check(t, k, &c);
    if (st != KILN_OK)
        return st;
    char epi_args[96], group[64] = "";
    if (kiln_format_get(k->cfg.format)->grouped) /* a group of all K: one scale a row */
        snprintf(group, sizeof group, "</*group*/ %lld, /*n*/ %lld>",
                 (long long)(k->cfg.group < k->cfg.k ? k->cfg.group : 0), (long long)k->cfg.n);
    return kiln_backend_source(buf, size, "gemv",
        "#include \"kiln/gemv.cuh\"\n"
        "\n"
        "using format = kiln::gemv_%s%s;\n"
        "using shape = kiln::gemv_shape</*max_m*/ %lld, /*rows*/ %d, /*warps*/ %d, "
        "/*k_split*/ %d,\n"
        "                               /*units*/ %d, /*stages*/ %d, /*tile_k*/ %d,\n"
        "                               /*min_blocks*/ %d>;\n"
        "using epilogue = kiln::epilogue<%s>;\n"
        "\n"
        "extern \"C\" __global__ void __launch_bounds__(shape::threads, shape::min_blocks)\n"
        "%s(const kiln_linear_args args)\n"
        "{\n"
        "    kiln::gemv<format, shape, epilogue, /*n*/ %lld, /*k*/ %lld, /*smem*/ %u>(args);\n"
        "}\n",
        kiln_format_get(k->cfg.format)->name, group, (long long)c.v->max_m, c.v->rows, c.v->warps,
        c.k_split, c.units, c.v->stages, c.tile_k, c.v->min_blocks,
        kiln_epilogue_template_args(k->cfg.epilogue, epi_args, sizeof epi_args), entry, (long long)k->cfg.n,
        (long long)k->cfg.k, c.smem);
}

/* The f32 kernel reads x from its first instruction: it never overlaps
 * the kernel before it. */
static kiln_status gemv_launch(const kiln_target *t, const kiln_linear_kernel *k, int64_t m,
                               kiln_launch *out)
{
    gemv_config c;
    kiln_status st = gemv_check(t, k, &c);
    if (st != KILN_OK)
        return st;
    if (m < 1 || m > c.v->max_m)
        return kiln_fail(KILN_ERR_SHAPE, "gemv %s: cannot launch for M = %lld (1 to %lld)",
                         c.v->name, (long long)m, (long long)c.v->max_m);
    *out = (kiln_launch){
        .grid = { c.blocks, 1, 1 },
        .block = { (unsigned)c.v->warps * 32, 1, 1 },
        .smem = c.smem,
    };
    return KILN_OK;
}

/* Weights stay in kiln's storage layout: no layout hook. */
const kiln_backend kiln_backend_gemv = {
    .name = "gemv",
    .formats = GEMV_FORMAT_BITS,
    .epilogues = KILN_EPI_ALL,
    .is_supported = kiln_sm75_or_newer,
    .can_implement = gemv_can_implement,
    .variants = &variant_table,
    .emit = gemv_emit,
    .launch = gemv_launch,
};
