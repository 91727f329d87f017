/* The gemv backend's host side: decode-sized linears (M bucket <= 16) as
 * bandwidth-bound matrix-vector products. Two kernels:
 *   tc.cuh    sm_80+, every format exact in BF16 (F16 in two terms), K a
 *             multiple of 64: tensor cores on weights packed by
 *             kernels/gemv/pack.c;
 *   gemv.cuh  everything else (F32, older parts, odd K): f32 FMA on
 *             kiln's storage layout.
 * It picks the kernel, the M class variant and the block shape, and
 * instantiates the template. The layout arithmetic for gemv.cuh mirrors
 * gemv_layout in the template, which checks the emitted total against
 * its own. */
#include "kernels/registry/backend.h"
#include "kernels/gemv/pack.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

/* How a format streams, the host's copy of the gemv_<format> traits. */
typedef struct gemv_format {
    int unit;       /* values one lane decodes at once; K must be a multiple */
    int aligned;    /* every unit starts 16-byte aligned in every row */
    int scale_cols; /* the stream also copies one scale per scale_cols values; 0: none */
    int scale_elem; /* bytes of one such scale */
    int offset;     /* keeps the sums of x per run of 8 (Q4_K's minimum) */
} gemv_format;

/* A unit is 16 bytes of data (32 for f32), or a GGML block of 32 values,
 * or an eighth of a 256-value block. */
static const gemv_format formats[] = {
    [KILN_FMT_F32] = { .unit = 8, .aligned = 1 },
    [KILN_FMT_F16] = { .unit = 8, .aligned = 1 },
    [KILN_FMT_BF16] = { .unit = 8, .aligned = 1 },
    [KILN_FMT_FP8_TENSOR] = { .unit = 16, .aligned = 1 },
    [KILN_FMT_FP8_CHANNEL] = { .unit = 16, .aligned = 1 },
    [KILN_FMT_FP8_BLOCK] = { .unit = 16, .aligned = 1, .scale_cols = 128, .scale_elem = 4 },
    [KILN_FMT_MXFP8] = { .unit = 16, .aligned = 1, .scale_cols = 32, .scale_elem = 1 },
    [KILN_FMT_NVFP4] = { .unit = 32, .aligned = 1, .scale_cols = 16, .scale_elem = 1 },
    [KILN_FMT_MXFP4] = { .unit = 32, .aligned = 1, .scale_cols = 32, .scale_elem = 1 },
    [KILN_FMT_Q8_0] = { .unit = 32 },
    [KILN_FMT_Q4_0] = { .unit = 32 },
    [KILN_FMT_Q4_K] = { .unit = 32, .aligned = 1, .offset = 1 },
    [KILN_FMT_Q6_K] = { .unit = 32 },
    [KILN_FMT_GGML_MXFP4] = { .unit = 32 },
};
_Static_assert(KILN_ARRAY_LEN(formats) == KILN_FMT_COUNT, "one row per format");

/* M classes, smallest first; a bucket takes the first whose max_m covers
 * it, and its kernel computes rows < args.m of at most max_m.
 *   rows        output rows per warp. From m = 4 on a warp owns several, so
 *               each x value read from shared memory feeds rows · m FMAs:
 *               at m = 16 one row per warp would be bound by shared-memory
 *               bandwidth rather than by the FMA pipe.
 *   lane_bytes  weight bytes a lane takes per stage, at least one unit: at
 *               m <= 2 the per-stage bookkeeping weighs against a 4-bit
 *               unit's few instructions, so 36 bytes take two units of the
 *               16- to 18-byte formats and one of the wider ones.
 *   stages      slots per warp ring, stages - 1 in flight.
 *   min_blocks  blocks per SM the registers are budgeted for; m = 16 keeps
 *               a 4 x 16 accumulator tile and runs one block of 8 warps. */
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

enum {
    GEMV_MAX_M = 16,
    /* Warps a launch should have before k-split pays: 16 for each of the
     * 132 SMs of an H100/H200, each with a stage or two in flight, keep
     * ~30 KB per SM in flight, above what its share of the bandwidth
     * needs. */
    GEMV_MIN_WARPS = 2048,
    /* Shared memory for the f32 x tile when K needs more: with the weight
     * rings, four blocks of eight warps fit an SM of sm_90 at m = 1. */
    GEMV_X_BUDGET = 24 * 1024,
    /* Without a known limit, what every CUDA device gives a block. */
    GEMV_DEFAULT_SMEM = 48 * 1024,
};

/* The tensor-core kernel's M classes: tokens up to max_m (a power of two:
 * the lane groups holding x, one or two token tiles of 8), row tiles of
 * 16 per warp, warps per block and ring stages per warp. From m = 8 on a
 * warp takes two row tiles, so each x fragment it stages feeds two of
 * them. Chosen by a sweep on an H200 (scripts/tc-sweep, docs/PERFORMANCE.md):
 * below 8 tokens, blocks of 4 warps with 3 stages fit four or more blocks an
 * SM. */
typedef struct tc_variant {
    const char *name;
    int64_t max_m;
    int row_tiles, warps, stages;
} tc_variant;

static const tc_variant tc_variants[] = {
    { "tc1", 1, 1, 4, 3 }, { "tc2", 2, 1, 4, 3 },    { "tc4", 4, 1, 4, 3 },
    { "tc8", 8, 2, 4, 4 }, { "tc16", 16, 2, 8, 3 },
};

static const kiln_variant_table tc_table = KILN_VARIANT_TABLE(tc_variant, tc_variants);

static const tc_variant *tc_for_bucket(int64_t m) { return kiln_variant_for_bucket(&tc_table, m); }

/* How a format streams through a warp's ring, tc.cuh's traits: the
 * 16-byte pieces and 8-byte units (super-records, Q6_K's high bits, FP8's
 * block scale) a lane stages per atom, the bytes of a lane group's scale
 * record per atom, and the atoms a stage holds at one row tile (about
 * 2 KiB of weights a warp). */
typedef struct tc_format {
    int pieces, units, record, batch;
} tc_format;

static const tc_format tc_formats[] = {
    [KILN_FMT_F16] = { 4, 0, 0, 1 },         [KILN_FMT_BF16] = { 4, 0, 0, 1 },
    [KILN_FMT_FP8_TENSOR] = { 2, 0, 0, 2 },
    [KILN_FMT_FP8_CHANNEL] = { 2, 0, 0, 2 }, [KILN_FMT_FP8_BLOCK] = { 2, 1, 0, 2 },
    [KILN_FMT_MXFP8] = { 2, 0, 4, 2 },       [KILN_FMT_NVFP4] = { 1, 0, 8, 4 },
    [KILN_FMT_MXFP4] = { 1, 0, 4, 4 },       [KILN_FMT_Q8_0] = { 2, 0, 8, 2 },
    [KILN_FMT_Q4_0] = { 1, 0, 8, 4 },        [KILN_FMT_Q4_K] = { 1, 1, 8, 4 },
    [KILN_FMT_Q6_K] = { 1, 2, 8, 2 },        [KILN_FMT_GGML_MXFP4] = { 1, 0, 4, 4 },
};
_Static_assert(KILN_ARRAY_LEN(tc_formats) == KILN_FMT_COUNT, "one entry per format");

/* Whether linear c on t runs the tensor-core kernel: in every bucket it
 * serves, one token included. At m = 1 the mma's eight token columns hold
 * one token (Q4_0, Q4_K and Q6_K put x's block sums in them), yet on an
 * H200 it is as fast as the f32 kernel or faster for every format it
 * serves on the decode shapes (the closest, F16 at 28672 x 4096: 99.4 %
 * of the copy bandwidth against 99.7 %), and a weight keeps one layout. */
static int tc_takes(const kiln_target *t, const kiln_linear_cfg *c)
{
    return kiln_gemv_tc_serves(t, c->format, c->n, c->k);
}

static const tc_variant *tc_named(const char *name) { return kiln_variant_named(&tc_table, name); }
typedef struct tc_config {
    int row_tiles, warps, stages, k_split, batch;
    unsigned smem; /* dynamic: the warps' rings */
    unsigned blocks;
} tc_config;

enum {
    /* Warps a tensor-core launch should have before its K stops being
     * split, at one token or for a format of two atoms a stage or fewer
     * (8 bits and more): more and shorter slices keep more of a weight in
     * flight than GEMV_MIN_WARPS would (H200, 28672 x 4096, 1792 row tiles,
     * 4 slices against 2: 3 to 14 points more of the copy bandwidth, Q8_0
     * at one token 77 % against 65 %). A 4-bit format's tc2 and tc4 lose 1
     * to 4 points so. */
    TC_MIN_WARPS = 4096,
    /* Row groups of 4 tiles a 16-token launch needs before its block takes
     * 4 warps (N >= 8192). Each warp then takes 4 row tiles, so that each x
     * fragment feeds 64 rows, and the launch keeps a block for each SM;
     * Q6_K's, Q8_0's and F16's warps keep 2 (tc_wide_two_tiles). */
    TC_WIDE_GROUPS = 128,
    /* The warps a wide launch of 4 row tiles a warp fills, and does not
     * pass: their registers keep 8 an SM, so 1024 are one wave on the 132
     * SMs of an H100/H200. Its blocks take 8 warps where 4-warp blocks
     * would leave fewer, and K splits while the launch stays within it
     * (H200, 16 tokens: 2 to 7 points more of the copy bandwidth, Q4_K at
     * 8192 x 28672 43.4 % against 36.8 % in 4-warp blocks split 4 ways). */
    TC_WIDE_WARPS = 1024,
    /* A one- or two-token launch of fewer warps than this at 4 a row tile,
     * its K at least TC_DEEP_ATOMS atoms, takes blocks of 8 warps, K split
     * 8 ways: each SM then keeps twice the warps streaming a launch within
     * a wave (H200, 4096 x 14336, launched as kiln does on sm_90: 0.5 to 5
     * points more of the copy bandwidth than 4-warp blocks at one and two
     * tokens, Q6_K at one token 63.0 % against 57.7 %). K of 4096 (64
     * atoms) loses with them: 8 atoms a slice, two stages of a 4-bit
     * format (6144 x 4096 Q4_0 45.9 % against 53.8 %); so do 4 tokens of
     * Q4_K. */
    TC_DEEP_WARPS = 2048,
    TC_DEEP_ATOMS = 128,
};

/* The formats whose wide 16-token blocks keep 2 row tiles a warp: their
 * decoding holds more registers a row tile, or F16's two terms twice the
 * mma (H200: 6 to 17 points more of the copy bandwidth than at 4 row
 * tiles, Q6_K at 8192 x 28672 48 % against 31 %). */
static const unsigned tc_wide_two_tiles =
    1u << KILN_FMT_Q6_K | 1u << KILN_FMT_Q8_0 | 1u << KILN_FMT_F16;

/* The class's row tiles, warps and stages for linear c. */
static tc_config tc_class(const tc_variant *v, const kiln_linear_cfg *c)
{
    const int64_t tiles = kiln_ceil_div(c->n, 16);
    if (v->max_m == 16 && tiles >= 4 * TC_WIDE_GROUPS) {
        if (tc_wide_two_tiles & (1u << c->format))
            return (tc_config){ .row_tiles = 2, .warps = 4, .stages = 3 };
        return (tc_config){ .row_tiles = 4,
                            .warps = kiln_ceil_div(tiles, 4) * 4 < TC_WIDE_WARPS ? 8 : 4,
                            .stages = 3 };
    }
    if (v->max_m <= 2 && v->row_tiles == 1 && tiles * v->warps < TC_DEEP_WARPS &&
        c->k / 64 >= TC_DEEP_ATOMS)
        return (tc_config){ .row_tiles = 1, .warps = 2 * v->warps, .stages = v->stages };
    return (tc_config){ .row_tiles = v->row_tiles, .warps = v->warps, .stages = v->stages };
}

/* Atoms a stage holds: the format's batch spread over the row tiles. */
static int tc_batch(const kiln_linear_cfg *c, int row_tiles)
{
    int b = tc_formats[c->format].batch / row_tiles;
    return b > 0 ? b : 1;
}

/* Bytes of the warps' rings (tc_smem in tc.cuh): per stage, each atom's
 * pieces, units and 8 lane groups' records at every row tile, and x: a
 * row per token of the lane groups holding x (the stage's 64-value atoms
 * and 32 bytes of padding), or for a format without records at one token
 * 8 bytes a lane of that group for each atom and k-tile. */
static int64_t tc_smem(const kiln_linear_cfg *c, const tc_variant *v, const tc_config *k,
                       int warps)
{
    const tc_format *f = &tc_formats[c->format];
    const int64_t tiles = v->max_m > 8 ? 2 : 1, groups = v->max_m < 8 ? v->max_m : 8;
    const int64_t b = tc_batch(c, k->row_tiles);
    const int64_t x = f->record || v->max_m > 1 ? tiles * groups * (b * 128 + 32)
                                                : b * tiles * 4 * groups * 32;
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
 * every slice keeps four atoms of 64 values; halve the block while its
 * shared memory is more than t gives one. */
static int tc_configure(const kiln_target *t, const kiln_linear_cfg *c, const tc_variant *v,
                        tc_config *out, char *why, size_t size)
{
    const int64_t limit = t->smem_optin > 0 ? t->smem_optin : GEMV_DEFAULT_SMEM;
    tc_config k = tc_class(v, c);
    const int64_t groups = kiln_ceil_div(kiln_ceil_div(c->n, 16), k.row_tiles);
    const int64_t atoms = c->k / 64;
    const int64_t min_warps =
        v->max_m == 1 || tc_formats[c->format].batch <= 2 ? TC_MIN_WARPS : GEMV_MIN_WARPS;
    const int wide4 = v->max_m == 16 && k.row_tiles == 4;
    int warps = k.warps, split;
    for (;;) {
        split = 1;
        while (split * 2 <= warps && atoms >= 8 * split &&
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
    /* Sixteen tokens on sm_90: a fourth stage in flight where a block still
     * fits and an SM's shared memory holds as many blocks. The 16-token
     * blocks hold 70 to 255 registers a thread, so an SM runs few warps,
     * and the rings keep the weights in flight (H200, 4 stages against 3
     * at the same blocks an SM: up to 7 points more of the copy bandwidth,
     * Q4_0 at 8192 x 28672 64.6 % against 57.2 %, BF16 the same). One block
     * an SM fewer loses 10 to 11 points (28672 x 4096 FP8 73.6 % against
     * 84.8 %); a fifth stage loses everywhere. */
    if (v->max_m == 16 && t->sm == 90) {
        tc_config deeper = k;
        deeper.stages = 4;
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
    const gemv_format *f = &formats[c->format];
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
    const int64_t stage_bytes = g.stage_k / fi->block * fi->block_bytes;
    g.slot = round16(stage_bytes + (f->aligned ? 0 : 32)) +
             (f->scale_cols ? round16(kiln_ceil_div(g.stage_k, f->scale_cols) * f->scale_elem + 8)
                            : 0);

    const int64_t limit = t->smem_optin > 0 ? t->smem_optin : GEMV_DEFAULT_SMEM;
    if (geometry_smem(&g, 1) > limit) {
        snprintf(why, size, "%s at %s: needs %lld bytes of shared memory per block, %s allows %lld",
                 v->name, fi->name, (long long)geometry_smem(&g, 1), t->name, (long long)limit);
        return 0;
    }
    /* Split K across the warps of a block while the launch is short of
     * warps, every slice keeps a stage, and the wider x tile fits. */
    const int64_t row_groups = kiln_ceil_div(c->n, v->rows);
    int split = 1;
    while (split * 2 <= v->warps && row_groups * split < GEMV_MIN_WARPS &&
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

static int gemv_is_supported(const kiln_target *t, char *why, size_t size)
{
    if (t->sm >= 75)
        return 1;
    snprintf(why, size, "needs sm_75 or newer, target is %s", t->name);
    return 0;
}

static int gemv_can_implement(const kiln_target *t, const kiln_linear_cfg *c, int64_t bucket,
                              char *why, size_t size)
{
    if (bucket > GEMV_MAX_M) {
        snprintf(why, size, "M bucket %lld > %d", (long long)bucket, GEMV_MAX_M);
        return 0;
    }
    if (tc_takes(t, c)) {
        tc_config tc;
        return tc_configure(t, c, tc_for_bucket(bucket), &tc, why, size);
    }
    gemv_config cfg;
    return gemv_configure(t, c, variant_for_bucket(bucket), &cfg, why, size);
}

static kiln_act gemv_act(const kiln_target *t, const kiln_linear_cfg *c, int64_t bucket)
{
    (void)t, (void)c, (void)bucket;
    return KILN_ACT_BF16;
}

static void gemv_variant_name(const kiln_target *t, const kiln_linear_cfg *c, int64_t bucket,
                              char *buf, size_t size)
{
    snprintf(buf, size, "%s",
             tc_takes(t, c) ? tc_for_bucket(bucket)->name : variant_for_bucket(bucket)->name);
}

/* What both kernels need of k's inputs: BF16 activations, one aux input. */
static kiln_status check_inputs(const kiln_linear_kernel *k)
{
    if (k->act != KILN_ACT_BF16)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gemv: activations must be bf16, not %s",
                         kiln_act_name(k->act));
    if ((k->cfg.epilogue & KILN_EPI_RESIDUAL) && (k->cfg.epilogue & KILN_EPI_SILU_MUL))
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "gemv: residual and silu_mul cannot both be fused (one aux input)");
    return KILN_OK;
}

/* The configuration of k, or a refusal naming what gemv does not build. */
static kiln_status gemv_check(const kiln_target *t, const kiln_linear_kernel *k, gemv_config *out)
{
    const gemv_variant *v = variant_named(k->variant);
    if (!v)
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "gemv: no variant \"%s\" (m1, m2, m4, m8, m16, tc1, tc2, tc4, tc8, tc16)",
                         k->variant);
    kiln_status st = check_inputs(k);
    if (st != KILN_OK)
        return st;
    if (!kiln_format_get(k->cfg.format))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gemv: format %d is not a kiln_format",
                         (int)k->cfg.format);
    char why[256];
    if (!gemv_configure(t, &k->cfg, v, out, why, sizeof why))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gemv: %s", why);
    return KILN_OK;
}

/* The tensor-core configuration of k, or a refusal; *is_tc = 0 when k is
 * not a tensor-core variant. */
static kiln_status tc_check(const kiln_target *t, const kiln_linear_kernel *k, int *is_tc,
                            const tc_variant **v, tc_config *out)
{
    *is_tc = 0;
    if (!(*v = tc_named(k->variant)))
        return KILN_OK;
    *is_tc = 1;
    kiln_status st = check_inputs(k);
    if (st != KILN_OK)
        return st;
    if (!kiln_gemv_tc_serves(t, k->cfg.format, k->cfg.n, k->cfg.k))
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "gemv %s: needs sm_80+, a format exact in bf16 (or f16), K a multiple "
                         "of 64, and N and a 16-row tile's packed bytes below 2^31 (target %s, "
                         "format %s, N=%lld, K=%lld)",
                         (*v)->name, t->name,
                         kiln_format_get(k->cfg.format) ? kiln_format_get(k->cfg.format)->name
                                                        : "?",
                         (long long)k->cfg.n, (long long)k->cfg.k);
    char why[256];
    if (!tc_configure(t, &k->cfg, *v, out, why, sizeof why))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gemv: %s", why);
    return KILN_OK;
}

static kiln_status tc_emit(const kiln_linear_kernel *k, const tc_variant *v, const tc_config *c,
                           const char *entry, char *buf, size_t size)
{
    unsigned epi = k->cfg.epilogue;
    char epi_args[96];
    int n = snprintf(
        buf, size,
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
        kiln_format_get(k->cfg.format)->name, (long long)v->max_m, c->row_tiles, c->warps,
        c->k_split, c->batch, c->stages,
        kiln_epilogue_template_args(epi, epi_args, sizeof epi_args), entry, (long long)k->cfg.n,
        (long long)k->cfg.k, c->smem);
    if (n < 0 || (size_t)n >= size)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "gemv: the source needs %d bytes, the buffer has %zu", n + 1, size);
    return KILN_OK;
}

static kiln_status gemv_emit(const kiln_target *t, const kiln_linear_kernel *k, const char *entry,
                             char *buf, size_t size)
{
    int is_tc;
    const tc_variant *tv;
    tc_config tc;
    kiln_status st = tc_check(t, k, &is_tc, &tv, &tc);
    if (st != KILN_OK || is_tc)
        return st != KILN_OK ? st : tc_emit(k, tv, &tc, entry, buf, size);

    gemv_config c;
    st = gemv_check(t, k, &c);
    if (st != KILN_OK)
        return st;
    unsigned epi = k->cfg.epilogue;
    char epi_args[96];
    int n = snprintf(
        buf, size,
        "#include \"kiln/gemv.cuh\"\n"
        "\n"
        "using format = kiln::gemv_%s;\n"
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
        kiln_format_get(k->cfg.format)->name, (long long)c.v->max_m, c.v->rows, c.v->warps,
        c.k_split,
        c.units, c.v->stages, c.tile_k, c.v->min_blocks,
        kiln_epilogue_template_args(epi, epi_args, sizeof epi_args),
        entry, (long long)k->cfg.n, (long long)k->cfg.k, c.smem);
    if (n < 0 || (size_t)n >= size)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "gemv: the source needs %d bytes, the buffer has %zu", n + 1, size);
    return KILN_OK;
}

/* The tensor-core kernels copy weights only before they wait for the
 * kernel before them (griddepcontrol): they may overlap it on sm_90, where
 * that was measured (kiln_launch_finalise says how the session holds them
 * to an SM); not on newer chips, where it was not. Their k-split sums are
 * static shared memory. */
static int tc_may_overlap(const kiln_target *t) { return t->sm == 90; }

static kiln_status gemv_launch(const kiln_target *t, const kiln_linear_kernel *k, int64_t m,
                               kiln_launch *out)
{
    int is_tc;
    const tc_variant *tv;
    tc_config tc;
    kiln_status st = tc_check(t, k, &is_tc, &tv, &tc);
    if (st != KILN_OK)
        return st;
    if (is_tc) {
        if (m < 1 || m > tv->max_m)
            return kiln_fail(KILN_ERR_SHAPE, "gemv %s: cannot launch for M = %lld (1 to %lld)",
                             tv->name, (long long)m, (long long)tv->max_m);
        *out = (kiln_launch){
            .grid = { tc.blocks, 1, 1 },
            .block = { (unsigned)tc.warps * 32, 1, 1 },
            .smem = tc.smem,
            .static_smem = (unsigned)tc_red(tv, &tc, tc.warps, tc.k_split),
            .overlap = tc_may_overlap(t),
        };
        return KILN_OK;
    }
    gemv_config c;
    st = gemv_check(t, k, &c);
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

static kiln_status gemv_pack(const kiln_target *t, const kiln_qtensor *src, void *data, void *scale)
{
    if (!kiln_gemv_tc_serves(t, src->format, src->n, src->k))
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "gemv pack: %s [%lld, %lld] on %s keeps the storage layout",
                         kiln_format_get(src->format) ? kiln_format_get(src->format)->name : "?",
                         (long long)src->n, (long long)src->k, t->name);
    return kiln_gemv_pack(src, data, scale);
}

/* The tensor-core variants read the packed layout, the others kiln's. */
static kiln_status gemv_layout(const kiln_target *t, const kiln_linear_kernel *k,
                               kiln_weight_layout *out)
{
    *out = (kiln_weight_layout){ 0 };
    if (!tc_named(k->variant) || !kiln_gemv_tc_serves(t, k->cfg.format, k->cfg.n, k->cfg.k))
        return KILN_OK;
    out->pack = gemv_pack;
    out->name = "gemv-tc";
    return kiln_gemv_pack_bytes(k->cfg.format, k->cfg.n, k->cfg.k, &out->data_bytes,
                                &out->scale_bytes);
}

const kiln_backend kiln_backend_gemv = {
    .name = "gemv",
    .formats = (1u << KILN_FMT_COUNT) - 1,
    .epilogues = KILN_EPI_BIAS | KILN_EPI_RESIDUAL | KILN_EPI_SILU_MUL,
    .is_supported = gemv_is_supported,
    .can_implement = gemv_can_implement,
    .act = gemv_act,
    .variant = gemv_variant_name,
    .emit = gemv_emit,
    .launch = gemv_launch,
    .layout = gemv_layout,
};
