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

/* The M classes: tokens up to max_m (a power of two: the lane groups
 * holding x, one or two token tiles of 8), row tiles of 16 per warp, warps
 * per block and ring stages per warp. From m = 8 on a warp takes two row
 * tiles, so each x fragment it stages feeds two of them. Chosen by a sweep on
 * an H200 (scripts/tc-sweep, docs/PERFORMANCE.md): below 8 tokens, blocks of
 * 4 warps with 3 stages fit four or more blocks an SM. */
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

typedef struct tc_config {
    int row_tiles, warps, stages, k_split, batch;
    unsigned smem; /* dynamic: the warps' rings */
    unsigned blocks;
} tc_config;

enum {
    TC_MAX_M = 16,
    /* Weight bytes a warp's stage holds at one row tile: whole atoms of a
     * format (tc_format.h's bytes), one at least. */
    TC_STAGE_BYTES = 2048,
    /* Warps a launch should have before k-split pays: 16 for each of the
     * 132 SMs of an H100/H200, each with a stage or two in flight, keep
     * ~30 KB per SM in flight, above what its share of the bandwidth
     * needs. */
    GEMV_MIN_WARPS = 2048,
    /* Without a known limit, what every CUDA device gives a block. */
    GEMV_DEFAULT_SMEM = 48 * 1024,
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
 * and 32 bytes of padding), or for a format without records at one token
 * 8 bytes a lane of that group for each atom and k-tile. */
static int64_t tc_smem(const kiln_linear_cfg *c, const tc_variant *v, const tc_config *k,
                       int warps)
{
    const kiln_gemv_tc_format *f = kiln_gemv_tc_format_get(c->format);
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
        v->max_m == 1 || tc_format_batch(c->format) <= 2 ? TC_MIN_WARPS : GEMV_MIN_WARPS;
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

static int tc_is_supported(const kiln_target *t, char *why, size_t size)
{
    if (t->sm >= KILN_GEMV_TC_MIN_SM)
        return 1;
    snprintf(why, size, "needs sm_%d or newer (bf16 mma.sync), target is %s",
             KILN_GEMV_TC_MIN_SM, t->name);
    return 0;
}

/* Every bucket up to 16 tokens of a linear the kernel serves, one token
 * included. At m = 1 the mma's eight token columns hold one token (Q4_0,
 * Q4_K and Q6_K put x's block sums in them), yet on an H200 it is as fast
 * as the f32 kernel or faster for every format it serves on the decode
 * shapes (the closest, F16 at 28672 x 4096: 99.4 % of the copy bandwidth
 * against 99.7 %), and a weight keeps one layout. */
static int tc_can_implement(const kiln_target *t, const kiln_linear_cfg *c, int64_t bucket,
                            char *why, size_t size)
{
    if (bucket > TC_MAX_M) {
        snprintf(why, size, "M bucket %lld > %d", (long long)bucket, TC_MAX_M);
        return 0;
    }
    if (kiln_gemv_tc_refuses(t, c->format, c->n, c->k, why, size))
        return 0;
    tc_config k;
    return tc_configure(t, c, variant_for_bucket(bucket), &k, why, size);
}

static kiln_act tc_act(const kiln_target *t, const kiln_linear_cfg *c, int64_t bucket)
{
    (void)t, (void)c, (void)bucket;
    return KILN_ACT_BF16;
}

static void tc_variant_name(const kiln_target *t, const kiln_linear_cfg *c, int64_t bucket,
                            char *buf, size_t size)
{
    (void)t, (void)c;
    snprintf(buf, size, "%s", variant_for_bucket(bucket)->name);
}

/* The class and configuration of k, or a refusal naming what gemv_tc does
 * not build. */
static kiln_status tc_check(const kiln_target *t, const kiln_linear_kernel *k,
                            const tc_variant **v, tc_config *out)
{
    if (!(*v = variant_named(k->variant)))
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "gemv_tc: no variant \"%s\" (tc1, tc2, tc4, tc8, tc16)", k->variant);
    if (k->act != KILN_ACT_BF16)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gemv_tc: activations must be bf16, not %s",
                         kiln_act_name(k->act));
    if ((k->cfg.epilogue & KILN_EPI_RESIDUAL) && (k->cfg.epilogue & KILN_EPI_SILU_MUL))
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "gemv_tc: residual and silu_mul cannot both be fused (one aux input)");
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
        kiln_format_get(k->cfg.format)->name, (long long)v->max_m, c.row_tiles, c.warps,
        c.k_split, c.batch, c.stages, kiln_epilogue_template_args(epi, epi_args, sizeof epi_args),
        entry, (long long)k->cfg.n, (long long)k->cfg.k, c.smem);
    if (n < 0 || (size_t)n >= size)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "gemv_tc: the source needs %d bytes, the buffer has %zu", n + 1, size);
    return KILN_OK;
}

/* The kernels copy weights only before they wait for the kernel before
 * them (griddepcontrol): they may overlap it on sm_90, where that was
 * measured (kiln_launch_finalise says how the session holds them to an
 * SM); not on newer chips, where it was not. Their k-split sums are
 * static shared memory. */
static int tc_may_overlap(const kiln_target *t) { return t->sm == 90; }

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

/* Every kernel of gemv_tc reads the packed layout. */
static kiln_status tc_layout(const kiln_target *t, const kiln_linear_kernel *k,
                             kiln_weight_layout *out)
{
    *out = (kiln_weight_layout){ 0 };
    char why[256];
    if (kiln_gemv_tc_refuses(t, k->cfg.format, k->cfg.n, k->cfg.k, why, sizeof why))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gemv_tc: no packed layout: %s", why);
    out->pack = tc_pack;
    out->name = "gemv_tc";
    return kiln_gemv_pack_bytes(k->cfg.format, k->cfg.n, k->cfg.k, &out->data_bytes,
                                &out->scale_bytes);
}

/* The formats of tc_format.h's rows. */
#define TC_FORMAT_BIT(fmt, ...) | 1u << KILN_FMT_##fmt

const kiln_backend kiln_backend_gemv_tc = {
    .name = "gemv_tc",
    .formats = 0 KILN_TC_FORMATS(TC_FORMAT_BIT),
    .epilogues = KILN_EPI_BIAS | KILN_EPI_RESIDUAL | KILN_EPI_SILU_MUL,
    .is_supported = tc_is_supported,
    .can_implement = tc_can_implement,
    .act = tc_act,
    .variant = tc_variant_name,
    .emit = tc_emit,
    .launch = tc_launch,
    .layout = tc_layout,
};
