/* The gemv_tc backend's host side: decode-sized linears (M bucket <= 16)
 * on tensor cores, kernels/gemv/tc.cuh: sm_80+, every format whose values
 * are exact in BF16 (F16 in two terms), K a multiple of 64, weights packed
 * by kernels/gemv/pack.c. It picks the M class, the block shape and the
 * k-split, and instantiates the template. What it does not serve (F32,
 * sm_75, a K of part atoms) falls to gemv's f32 kernel, next in every
 * priority list that names both. */
#include "kernels/registry/backend.h"
#include "kernels/gemv/pack.h"
#include "kernels/gemv/tc_format.h"

#include <stdio.h>
#include <string.h>

/* The M classes, smallest first: a bucket takes the first whose max_m
 * covers it. Each column's reason:
 *   max_m      tokens up to a power of two: the lane groups holding x, one
 *              or two token tiles of 8
 *   row_tiles  row tiles of 16 a warp: 2 from 8 tokens on, so each x
 *              fragment a warp stages feeds two of them
 *   warps      a block's: 4 below 8 tokens, so four or more blocks fit an SM
 *   stages     a warp ring's: 3, 4 at 8 tokens, as many as keep those blocks
 * The block of a linear starts from its class and follows the tuning
 * below (tc_class, tc_configure). */
typedef struct tc_variant {
    const char *name;
    int64_t max_m;
    int row_tiles, warps, stages;
} tc_variant;

static const tc_variant variants[] = {
    { "tc1", 1, 1, 4, 3 }, { "tc2", 2, 1, 4, 3 },    { "tc4", 4, 1, 4, 3 },
    { "tc8", 8, 2, 4, 4 }, { "tc16", 16, 2, 8, 3 },
};

static const kiln_variant_table variant_table = KILN_VARIANT_TABLE(tc_variant, variants);

static const tc_variant *variant_for_bucket(int64_t m)
{
    return kiln_variant_for_bucket(&variant_table, m);
}

static const tc_variant *variant_named(const char *name)
{
    return kiln_variant_named(&variant_table, name);
}

/* The largest bucket: the last class's. */
#define TC_MAX_M (variants[KILN_ARRAY_LEN(variants) - 1].max_m)

/* The tuning of the blocks, each constant's reason in a line. Chosen by
 * sweeps on an H200 (scripts/tc-sweep re-runs them); the numbers are in
 * the commit messages that set them. */
enum {
    /* weights a warp stages at one row tile: 1, 2 or 4 atoms of a format (tc_format.h) */
    TC_STAGE_BYTES = 2048,
    /* atoms a K slice keeps at least: a shorter slice is mostly its ring's fill */
    TC_SLICE_ATOMS = 4,
    /* K splits while a launch has fewer warps: more, shorter slices keep more in flight */
    TC_SPLIT_WARPS = 4096,
    /* the same past one token for 4 atoms a stage (4-bit), whose shorter slices lose */
    TC_SPLIT_WARPS_4BIT = 2048,
    /* 16 tokens run wide from this many groups of 4 row tiles (N >= 8192): a block an SM */
    TC_WIDE_GROUPS = 128,
    /* row tiles a wide warp takes: each x fragment it stages feeds 64 rows */
    TC_WIDE_ROW_TILES = 4,
    /* a wide block's warps, or tc16's 8 while a launch of these stays below TC_WIDE_WARPS */
    TC_WIDE_BLOCK_WARPS = 4,
    /* warps a wide launch fills and does not pass, K split included: 8 an SM, one wave */
    TC_WIDE_WARPS = 1024,
    /* formats whose wide warps keep 2 row tiles: more registers a tile, or F16's two mma */
    TC_WIDE_TWO_TILES = 1 << KILN_FMT_Q6_K | 1 << KILN_FMT_Q8_0 | 1 << KILN_FMT_F16,
    /* one or two tokens in fewer warps than this take twice the warps, split 8 ways */
    TC_DEEP_WARPS = 2048,
    /* ... where K has this many atoms: fewer make slices of two 4-bit stages */
    TC_DEEP_ATOMS = 128,
    /* 16 tokens run few warps an SM: a fourth stage where the SM keeps as many blocks */
    TC_DEEP16_STAGES = 4,
    /* the part the fourth stage and the overlapped launches were measured on */
    TC_TUNED_SM = 90,
    /* BF16's atoms at 4 tokens: 8 warps of 4 stages, split while fewer than 8192 warps */
    TC_ROWS4_WARPS = 8,
    TC_ROWS4_STAGES = 4,
    TC_ROWS4_SPLIT_WARPS = 8192,
};

/* Whether format f's x is in mma's k order (tc.cuh's x_mma): BF16's
 * row-major atoms, whose rows are 16-bit values. */
static int tc_x_mma(kiln_format f)
{
    const kiln_gemv_tc_format *l = kiln_gemv_tc_format_get(f);
    return l->rows && l->pieces == 4;
}

/* Whether class v runs BF16's row-major atoms at 4 tokens, which take
 * their own block shape and split (TC_ROWS4_*). */
static int tc_rows4(const tc_variant *v, kiln_format f)
{
    return v->max_m == 4 && tc_x_mma(f);
}

typedef struct tc_config {
    int row_tiles, warps, stages, k_split, batch;
    unsigned smem; /* dynamic: the warps' rings */
    unsigned blocks;
} tc_config;

/* The class's row tiles, warps and stages for linear c. */
static tc_config tc_class(const tc_variant *v, const kiln_linear_cfg *c)
{
    const int64_t tiles = kiln_ceil_div(c->n, 16);
    if (v->max_m == 16 && tiles >= 4 * TC_WIDE_GROUPS) {
        if (TC_WIDE_TWO_TILES & (1u << c->format))
            return (tc_config){ .row_tiles = v->row_tiles, .warps = TC_WIDE_BLOCK_WARPS,
                                .stages = v->stages };
        const int64_t groups = kiln_ceil_div(tiles, TC_WIDE_ROW_TILES);
        return (tc_config){ .row_tiles = TC_WIDE_ROW_TILES,
                            .warps = groups * TC_WIDE_BLOCK_WARPS < TC_WIDE_WARPS
                                         ? v->warps
                                         : TC_WIDE_BLOCK_WARPS,
                            .stages = v->stages };
    }
    if (tc_rows4(v, c->format))
        return (tc_config){ .row_tiles = 1, .warps = TC_ROWS4_WARPS, .stages = TC_ROWS4_STAGES };
    if (v->max_m <= 2 && v->row_tiles == 1 && tiles * v->warps < TC_DEEP_WARPS &&
        c->k / 64 >= TC_DEEP_ATOMS)
        return (tc_config){ .row_tiles = 1, .warps = 2 * v->warps, .stages = v->stages };
    return (tc_config){ .row_tiles = v->row_tiles, .warps = v->warps, .stages = v->stages };
}

/* Atoms a stage holds at one row tile: 1 for the 16-bit formats, 2 for
 * the 8-bit ones and Q6_K, 4 for the 4-bit ones. */
static int tc_format_batch(kiln_format f)
{
    return TC_STAGE_BYTES / kiln_gemv_tc_format_get(f)->bytes;
}

/* Atoms a stage holds: the format's batch spread over the row tiles. */
static int tc_batch(const kiln_linear_cfg *c, int row_tiles)
{
    int b = tc_format_batch(c->format) / row_tiles;
    return b > 0 ? b : 1;
}

/* Bytes of the warps' rings (tc_smem in tc.cuh): per stage, each atom's
 * pieces, units and 8 lane groups' records at every row tile, and x: a
 * row per token of the lane groups holding x (the stage's 64-value atoms
 * and 32 bytes of padding, 16 for x in mma's order), or for a format
 * without records at one token (x in mma's order: up to two) 8 bytes a
 * lane of those groups for each atom and k-tile. */
static int64_t tc_smem(const kiln_linear_cfg *c, const tc_variant *v, const tc_config *k,
                       int warps)
{
    const kiln_gemv_tc_format *f = kiln_gemv_tc_format_get(c->format);
    const int64_t tiles = v->max_m > 8 ? 2 : 1, groups = v->max_m < 8 ? v->max_m : 8;
    const int64_t b = tc_batch(c, k->row_tiles);
    const int x_mma = tc_x_mma(c->format);
    const int by_lane = !f->record && (v->max_m == 1 || (x_mma && v->max_m == 2));
    const int64_t x = by_lane ? b * tiles * 4 * groups * 32
                              : tiles * groups * (b * 128 + (x_mma ? 16 : 32));
    const int64_t stage = b * k->row_tiles * (f->pieces * 512 + f->units * 256 + 8 * f->record) + x;
    return (int64_t)warps * k->stages * stage;
}

/* The k-split reduction's static shared memory (`red` in gemv_tc). */
static int64_t tc_red(const tc_variant *v, const tc_config *k, int warps, int split)
{
    return split > 1 ? (int64_t)warps * k->row_tiles * (v->max_m > 8 ? 2 : 1) * 4 * 32 * 4 : 0;
}

/* Blocks of `smem` bytes of rings and `red` of k-split sums an SM's shared
 * memory holds: the block limit and the 1 KiB the SM reserves, each block
 * reserving 1 KiB more. */
static int64_t tc_per_sm(const kiln_target *t, int64_t smem, int64_t red)
{
    return ((int64_t)t->smem_optin + 1024) / (smem + 1024 + red);
}

/* Split K across a block's warps while the launch is short of warps and
 * every slice keeps TC_SLICE_ATOMS atoms; halve the block while its
 * shared memory is more than t gives one. With the gate epilogue the rows
 * are twice as many, the gate's tiles beside the up's: an even count of
 * row tiles a warp, at least two. */
static int tc_configure(const kiln_target *t, const kiln_linear_cfg *lin, const tc_variant *v,
                        tc_config *out, char *why, size_t size)
{
    const int64_t limit = kiln_block_smem_limit(t);
    kiln_linear_cfg both = *lin;
    if (lin->epilogue & KILN_EPI_GATE)
        both.n = 2 * kiln_ceil_div(lin->n, 16) * 16;
    const kiln_linear_cfg *c = &both;
    tc_config k = tc_class(v, c);
    if ((lin->epilogue & KILN_EPI_GATE) && k.row_tiles % 2)
        k.row_tiles *= 2;
    const int64_t groups = kiln_ceil_div(kiln_ceil_div(c->n, 16), k.row_tiles);
    const int64_t atoms = c->k / 64;
    const int64_t min_warps = tc_rows4(v, c->format) ? TC_ROWS4_SPLIT_WARPS
                              : v->max_m == 1 || tc_format_batch(c->format) <= 2
                                  ? TC_SPLIT_WARPS
                                  : TC_SPLIT_WARPS_4BIT;
    const int wide4 = v->max_m == 16 && k.row_tiles == TC_WIDE_ROW_TILES;
    int warps = k.warps, split;
    for (;;) {
        split = 1;
        while (split * 2 <= warps && atoms >= 2 * split * TC_SLICE_ATOMS &&
               (wide4 ? groups * split * 2 <= TC_WIDE_WARPS : groups * split < min_warps))
            split *= 2;
        if (tc_smem(c, v, &k, warps) + tc_red(v, &k, warps, split) <= limit)
            break;
        if (warps == 1) {
            snprintf(why, size,
                     "%s at %s: needs %lld bytes of shared memory per block, %s allows %lld",
                     v->name, kiln_format_get(c->format)->name,
                     (long long)(tc_smem(c, v, &k, 1) + tc_red(v, &k, 1, split)), t->name,
                     (long long)limit);
            return 0;
        }
        warps /= 2;
    }
    k.warps = warps;
    k.k_split = split;
    k.batch = tc_batch(c, k.row_tiles);
    /* Sixteen tokens: a deeper ring where a block still fits and an SM's
     * shared memory holds as many blocks; one block an SM fewer loses more
     * than the stage gains. */
    if (v->max_m == 16 && t->sm == TC_TUNED_SM) {
        tc_config deeper = k;
        deeper.stages = TC_DEEP16_STAGES;
        const int64_t red = tc_red(v, &k, warps, split), smem = tc_smem(c, v, &deeper, warps);
        if (smem + red <= limit &&
            tc_per_sm(t, smem, red) >= tc_per_sm(t, tc_smem(c, v, &k, warps), red))
            k = deeper;
    }
    k.smem = (unsigned)tc_smem(c, v, &k, warps);
    k.blocks = (unsigned)kiln_ceil_div(groups, warps / split);
    *out = k;
    return 1;
}

static int tc_is_supported(const kiln_target *t, char *why, size_t size)
{
    if (t->sm >= KILN_GEMV_TC_MIN_SM)
        return 1;
    snprintf(why, size, "needs sm_%d or newer (bf16 mma.sync), target is %s",
             KILN_GEMV_TC_MIN_SM, t->name);
    return 0;
}

/* Every bucket up to 16 tokens of a linear the kernel serves, one token
 * included: at m = 1 the mma's eight token columns hold one token (Q4_0,
 * Q4_K and Q6_K put x's block sums in them), yet the kernel is as fast as
 * gemv's f32 one for every format it serves, and a weight keeps one
 * layout across the decode buckets. */
static int tc_can_implement(const kiln_target *t, const kiln_linear_cfg *c, int64_t bucket,
                            char *why, size_t size)
{
    if (bucket > TC_MAX_M) {
        snprintf(why, size, "M bucket %lld > %lld", (long long)bucket, (long long)TC_MAX_M);
        return 0;
    }
    if (kiln_gemv_tc_refuses(t, c->format, c->n, c->k, why, size))
        return 0;
    tc_config k;
    return tc_configure(t, c, variant_for_bucket(bucket), &k, why, size);
}

/* The class and configuration of k, or a refusal naming what gemv_tc does
 * not build. */
static kiln_status tc_check(const kiln_target *t, const kiln_linear_kernel *k,
                            const tc_variant **v, tc_config *out)
{
    if (!(*v = variant_named(k->variant)))
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "gemv_tc: no variant \"%s\" (tc1, tc2, tc4, tc8, tc16)", k->variant);
    kiln_status common = kiln_linear_kernel_check("gemv_tc", k, KILN_ACT_BF16);
    if (common != KILN_OK)
        return common;
    char why[256];
    if (kiln_gemv_tc_refuses(t, k->cfg.format, k->cfg.n, k->cfg.k, why, sizeof why))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gemv_tc %s: %s (format %s, N=%lld, K=%lld)",
                         (*v)->name, why,
                         kiln_format_get(k->cfg.format) ? kiln_format_get(k->cfg.format)->name
                                                        : "?",
                         (long long)k->cfg.n, (long long)k->cfg.k);
    if (!tc_configure(t, &k->cfg, *v, out, why, sizeof why))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gemv_tc: %s", why);
    return KILN_OK;
}

static kiln_status tc_emit(const kiln_target *t, const kiln_linear_kernel *k, const char *entry,
                           char *buf, size_t size)
{
    const tc_variant *v;
    tc_config c;
    kiln_status st = tc_check(t, k, &v, &c);
    if (st != KILN_OK)
        return st;
    char epi_args[96];
    return kiln_backend_source(buf, size, "gemv_tc",
        "#include \"kiln/tc.cuh\"\n"
        "\n"
        "using format = kiln::tc_%s;\n"
        "using shape = kiln::tc_shape</*max_m*/ %lld, /*row_tiles*/ %d, /*warps*/ %d, "
        "/*k_split*/ %d,\n"
        "                             /*batch*/ %d, /*stages*/ %d>;\n"
        "using epilogue = kiln::epilogue<%s>;\n"
        "\n"
        "extern \"C\" __global__ void __launch_bounds__(shape::threads, "
        "kiln::tc_min_blocks<format, shape>::value)\n"
        "%s(const kiln_linear_args args)\n"
        "{\n"
        "    kiln::gemv_tc<format, shape, epilogue, /*n*/ %lld, /*k*/ %lld, /*smem*/ %u>(args);\n"
        "}\n",
        kiln_format_get(k->cfg.format)->name, (long long)v->max_m, c.row_tiles, c.warps,
        c.k_split, c.batch, c.stages, kiln_epilogue_template_args(k->cfg.epilogue, epi_args, sizeof epi_args),
        entry, (long long)k->cfg.n, (long long)k->cfg.k, c.smem);
}

/* The kernels copy weights only before they wait for the kernel before
 * them (griddepcontrol): they may overlap it on the part that was
 * measured (kiln_launch_finalise says how the session holds them to an
 * SM); not on newer chips, where it was not. Their k-split sums are
 * static shared memory. */
static int tc_may_overlap(const kiln_target *t) { return t->sm == TC_TUNED_SM; }

static kiln_status tc_launch(const kiln_target *t, const kiln_linear_kernel *k, int64_t m,
                             kiln_launch *out)
{
    const tc_variant *v;
    tc_config c;
    kiln_status st = tc_check(t, k, &v, &c);
    if (st != KILN_OK)
        return st;
    if (m < 1 || m > v->max_m)
        return kiln_fail(KILN_ERR_SHAPE, "gemv_tc %s: cannot launch for M = %lld (1 to %lld)",
                         v->name, (long long)m, (long long)v->max_m);
    *out = (kiln_launch){
        .grid = { c.blocks, 1, 1 },
        .block = { (unsigned)c.warps * 32, 1, 1 },
        .smem = c.smem,
        .static_smem = (unsigned)tc_red(v, &c, c.warps, c.k_split),
        .overlap = tc_may_overlap(t),
    };
    return KILN_OK;
}

static kiln_status tc_pack(const kiln_target *t, const kiln_qtensor *src, void *data, void *scale)
{
    if (!kiln_gemv_tc_serves(t, src->format, src->n, src->k))
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "gemv_tc pack: %s [%lld, %lld] on %s keeps the storage layout",
                         kiln_format_get(src->format) ? kiln_format_get(src->format)->name : "?",
                         (long long)src->n, (long long)src->k, t->name);
    return kiln_gemv_pack(src, data, scale);
}

/* Every kernel of gemv_tc reads the packed layout, and so do wgmma_tc's
 * and, for BF16, whose atoms are row-major, wgmma's TMA kernels. */
kiln_status kiln_gemv_tc_layout(const kiln_target *t, const kiln_linear_kernel *k,
                                kiln_weight_layout *out)
{
    *out = (kiln_weight_layout){ 0 };
    char why[256];
    if (kiln_gemv_tc_refuses(t, k->cfg.format, k->cfg.n, k->cfg.k, why, sizeof why))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gemv_tc: no packed layout: %s", why);
    out->pack = tc_pack;
    out->name = "gemv_tc";
    out->device_pack = 1;
    out->refusal = kiln_gemv_pack_refusal;
    out->check = kiln_gemv_pack_check;
    return kiln_gemv_pack_bytes(k->cfg.format, k->cfg.n, k->cfg.k, &out->data_bytes,
                                &out->scale_bytes);
}

/* The formats of tc_format.h's rows. */
#define TC_FORMAT_BIT(fmt, ...) | 1u << KILN_FMT_##fmt

const kiln_backend kiln_backend_gemv_tc = {
    .name = "gemv_tc",
    .formats = 0 KILN_TC_FORMATS(TC_FORMAT_BIT),
    .epilogues = KILN_EPI_ALL | KILN_EPI_GATE,
    .is_supported = tc_is_supported,
    .can_implement = tc_can_implement,
    .variants = &variant_table,
    .emit = tc_emit,
    .launch = tc_launch,
    .layout = kiln_gemv_tc_layout,
};
