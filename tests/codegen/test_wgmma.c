/* The wgmma backend without a GPU: its capability rules and refusal
 * reasons, the variant per bucket, the emitted source and launch shape,
 * its place in the default plans (sm_90a takes it, older targets record
 * why not), and every format x variant x epilogue compiling with NVRTC for
 * sm_90a to SASS whose main loop is HGMMA. Running the kernels against the
 * CPU executor is tests/gpu/test_wgmma.c's. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clirun.h"
#include "codegen_util.h"
#include "codegen/emit.h"
#include "codegen/nvrtc.h"
#include "kernels/gemv/pack.h"
#include "codegen/plan.h"
#include "testutil.h"

static const kiln_backend *const wg = &kiln_backend_wgmma;

static kiln_target target(const char *name)
{
    kiln_target t;
    cr_assert_eq(kiln_target_from_name(name, &t), KILN_OK, "%s", kiln_last_error());
    return t;
}

/* The formats the TMA kernel runs on E4M3 activations, and the scheme
 * each format's wgmma kernels read. */
static int fp8_tma(int f)
{
    return f == KILN_FMT_FP8_TENSOR || f == KILN_FMT_FP8_CHANNEL || f == KILN_FMT_FP8_BLOCK;
}

static const char *act_of(int f)
{
    return f == KILN_FMT_FP8_BLOCK ? "fp8-1x128" : fp8_tma(f) ? "fp8-token" : "bf16";
}

/* A wgmma linear with the fields that vary. */
static char *wgmma_sig(char *buf, size_t size, const char *variant, kiln_format f, const char *act,
                       long long n, long long k, unsigned epi, const char *arch)
{
    return kt_linear_sig(buf, size, "wgmma", variant, f, act, n, k, epi, arch);
}

/* ---------------------------------------------------------- capability */

Test(wgmma, runs_only_where_wgmma_exists)
{
    for (const char *const *n = kiln_target_names(); *n; n++) {
        kiln_target t = target(*n);
        char why[128] = "";
        int ok = wg->is_supported(&t, why, sizeof why);
        cr_assert_eq(ok, t.wgmma, "%s", *n);
        if (ok)
            continue;
        char want[128];
        snprintf(want, sizeof want, "needs wgmma (sm_90a), target is %s", t.name);
        cr_assert_str_eq(why, want);
    }
    static const char *const refused[] = { "sm_75", "sm_80", "sm_86", "sm_89", "sm_90" };
    for (size_t i = 0; i < KILN_ARRAY_LEN(refused); i++) {
        kiln_target t = target(refused[i]);
        char why[128];
        cr_assert_eq(wg->is_supported(&t, why, sizeof why), 0, "%s", refused[i]);
    }
    static const char *const taken[] = { "sm_90a", "h100", "h200" };
    for (size_t i = 0; i < KILN_ARRAY_LEN(taken); i++) {
        kiln_target t = target(taken[i]);
        char why[128];
        cr_assert_eq(wg->is_supported(&t, why, sizeof why), 1, "%s", taken[i]);
    }
}

/* BF16 activations, but for E4M3 weights with a tensor or row scale, which
 * the TMA kernel multiplies on per-token E4M3 activations. Every format,
 * the integer groups with their group (per row, or along K). */
Test(wgmma, takes_every_format_and_epilogue)
{
    cr_assert_eq(wg->formats, (1u << KILN_FMT_COUNT) - 1);
    kiln_kernel_source src;
    cr_assert_eq(kiln_emit_text(kiln_registry_default(),
                                "linear backend=wgmma variant=bm64bn64 format=int4_group "
                                "scales=f32:1x128 act=bf16 n=1014 k=768 epilogue=none out=bf16 "
                                "target=sm_90a",
                                &src),
                 KILN_OK, "%s", kiln_last_error());
    cr_assert(strstr(src.text, "kiln::fmt_int4_group</*group*/ 128, /*n*/ 1014>"), "%s", src.text);
    kiln_kernel_source_free(&src);
    cr_assert_eq(wg->epilogues, KILN_EPI_BIAS | KILN_EPI_RESIDUAL | KILN_EPI_SILU_MUL);
    kiln_target t = target("sm_90a");
    static const int64_t buckets[] = { 1, 16, 17, 64, 512, 8192 };
    for (int f = 0; f < KILN_FMT_COUNT; f++)
        for (size_t b = 0; b < KILN_ARRAY_LEN(buckets); b++) {
            char why[128] = "";
            /* N need not fill a tile: the last one is partial. */
            kiln_linear_cfg c = { .format = (kiln_format)f, .n = 200, .k = 768,
                                  .group = kiln_format_get((kiln_format)f)->grouped ? 128 : 0 };
            cr_assert_eq(wg->can_implement(&t, &c, buckets[b], why, sizeof why), 1, "%s: %s",
                         kiln_format_get((kiln_format)f)->name, why);
            cr_assert_eq(kiln_backend_act(wg, &t, &c, buckets[b]),
                         f == KILN_FMT_FP8_BLOCK ? KILN_ACT_FP8_G128
                         : fp8_tma(f)            ? KILN_ACT_FP8_TOKEN
                                                 : KILN_ACT_BF16);
        }
}

Test(wgmma, refuses_shapes_it_does_not_build)
{
    kiln_target t = target("h100");
    char why[128];
    /* an integer group of whole words dividing K */
    kiln_linear_cfg g = { .format = KILN_FMT_INT4_GROUP, .n = 64, .k = 768, .group = 100 };
    cr_assert_eq(wg->can_implement(&t, &g, 64, why, sizeof why), 0);
    cr_assert_str_eq(why, "int4_group group 100 is not a multiple of 8 dividing K = 768");
    g.group = 512;
    cr_assert_eq(wg->can_implement(&t, &g, 64, why, sizeof why), 0);
    g.format = KILN_FMT_INT8_GROUP_ZP;
    g.group = 256;
    cr_assert_eq(wg->can_implement(&t, &g, 64, why, sizeof why), 1, "%s", why);
    kiln_linear_cfg c = { .format = KILN_FMT_BF16, .n = 4096, .k = 4128 };
    cr_assert_eq(wg->can_implement(&t, &c, 64, why, sizeof why), 0);
    cr_assert_str_eq(why, "K=4128 is not a multiple of 64");
    c = (kiln_linear_cfg){ .format = KILN_FMT_BF16, .n = (int64_t)INT_MAX + 1, .k = 64 };
    cr_assert_eq(wg->can_implement(&t, &c, 64, why, sizeof why), 0);
    cr_assert(strstr(why, "2^31"), "%s", why);
    c = (kiln_linear_cfg){ .format = KILN_FMT_BF16, .n = 64, .k = (int64_t)INT_MAX + 1 };
    cr_assert_eq(wg->can_implement(&t, &c, 64, why, sizeof why), 0);
    cr_assert(strstr(why, "2^31"), "%s", why);
    c.k = 64;
    cr_assert_eq(wg->can_implement(&t, &c, 64 * 65535, why, sizeof why), 1);
    cr_assert_eq(wg->can_implement(&t, &c, 64 * 65535 + 1, why, sizeof why), 0);
    cr_assert_str_eq(why, "M bucket 4194241 exceeds 4194240 rows");
    /* The TMA kernel's tiles fit an int: 65535 row tiles of 64 by 32769
     * column tiles of 128 do not. */
    kiln_linear_cfg b = { .format = KILN_FMT_BF16, .n = 32769LL * 128, .k = 64 };
    cr_assert_eq(wg->can_implement(&t, &b, 64 * 32767, why, sizeof why), 1, "%s", why);
    cr_assert_eq(wg->can_implement(&t, &b, 64 * 65535, why, sizeof why), 0);
    cr_assert_str_eq(why, "M bucket 4194240 x N=4194432: more than 2^31 - 1 tiles");
    kiln_launch l;
    kiln_linear_kernel k = { .cfg = b, .act = KILN_ACT_BF16, .variant = "tma_bm64bn128" };
    cr_assert_eq(wg->launch(&t, &k, 64 * 65535, &l), KILN_ERR_SHAPE);
    cr_assert(strstr(kiln_last_error(), "more than 2^31 - 1 tiles"), "%s", kiln_last_error());
    cr_assert_eq(wg->launch(&t, &k, 64 * 32767, &l), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(l.grid[0], 32767u * 32769u);
}

Test(wgmma, variants_follow_the_bucket)
{
    static const struct {
        int64_t m;
        const char *variant;
    } cases[] = {
        { 1, "bm64bn64" },    { 16, "bm64bn64" },    { 17, "bm64bn64" },
        { 64, "bm64bn64" },   { 65, "bm64bn128" },   { 512, "bm64bn128" },
        { 100000, "bm64bn128" },
    };
    kiln_target t = target("h200");
    kiln_linear_cfg c = { .format = KILN_FMT_NVFP4, .n = 4096, .k = 4096 };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        char v[64];
        kiln_backend_variant(wg, &t, &c, cases[i].m, v, sizeof v);
        cr_assert_str_eq(v, cases[i].variant, "m=%lld", (long long)cases[i].m);
    }
}

/* BF16 runs the TMA kernel, whose tile is the one of least estimated
 * time over whole waves of H200's 132 SMs; the GPU suite runs these very
 * shapes. */
Test(wgmma, bf16_tiles_fill_the_sms)
{
    static const struct {
        int64_t m, n;
        const char *variant;
    } cases[] = {
        { 2048, 4096, "tma_bm128bn256" },  /* 256 tiles: two whole waves */
        { 4096, 28672, "tma_bm128bn256" },
        { 2048, 4099, "tma_bm128bn128" },  /* 272 of the widest would be three waves */
        { 64, 33792, "tma_bm64bn256" },    /* 132 tiles: one wave */
        { 64, 4099, "tma_bm64bn128" },
        { 256, 4096, "tma_bm64bn128" },    /* 128 tiles, where the widest leaves 100 SMs idle */
        { 32, 1536, "tma_bm64bn128" },
    };
    kiln_target t = target("h200");
    cr_assert_eq(t.sm_count, 132);
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        kiln_linear_cfg c = { .format = KILN_FMT_BF16, .n = cases[i].n, .k = 4096 };
        char v[64];
        kiln_backend_variant(wg, &t, &c, cases[i].m, v, sizeof v);
        cr_assert_str_eq(v, cases[i].variant, "m=%lld n=%lld", (long long)cases[i].m,
                         (long long)cases[i].n);
    }
    /* E4M3 promotes its sums into a second set of accumulators: at most
     * 128 columns a consumer, and per-token FP8 activations. */
    for (int f = KILN_FMT_FP8_TENSOR; f <= KILN_FMT_FP8_BLOCK; f++) {
        kiln_linear_cfg c = { .format = (kiln_format)f, .n = 28672, .k = 4096 };
        char v[64];
        kiln_backend_variant(wg, &t, &c, 4096, v, sizeof v);
        cr_assert_str_eq(v, "tma_bm128bn128");
        cr_assert_str_eq(kiln_act_name(kiln_backend_act(wg, &t, &c, 4096)), act_of(f));
    }
    /* Other formats keep the dequantizing kernel's tiles. */
    kiln_linear_cfg c = { .format = KILN_FMT_Q8_0, .n = 4096, .k = 4096 };
    char v[64];
    kiln_backend_variant(wg, &t, &c, 4096, v, sizeof v);
    cr_assert_str_eq(v, "bm64bn128");
}

/* ------------------------------------------------------- emit and launch */

Test(wgmma, source_is_stable)
{
    static const char sig[] = "linear backend=wgmma variant=bm64bn128 format=q4_k scales=inline "
                              "act=bf16 n=4096 k=14336 epilogue=bias+residual out=bf16 "
                              "target=sm_90a";
    kiln_kernel_source s;
    cr_assert_eq(kiln_emit_text(kiln_registry_default(), sig, &s), KILN_OK, "%s",
                 kiln_last_error());
    char golden[2048];
    snprintf(golden, sizeof golden,
             "// kiln kernel, generated from its signature: the logic is in the included "
             "template.\n"
             "// signature: %s\n"
             "// templates: %s\n"
             "// cache key: ________________________________\n"
             "#include \"kiln/wgmma.cuh\"\n"
             "\n"
             "using format = kiln::fmt_q4_k;\n"
             "using tile = kiln::wgmma_tile</*bn*/ 128>;\n"
             "using epilogue = kiln::epilogue</*bias*/ true, /*residual*/ true, /*silu_mul*/ "
             "false>;\n"
             "static_assert(tile::smem_bytes == 49152, \"the launch's dynamic shared memory\");\n"
             "\n"
             "extern \"C\" __global__ void __launch_bounds__(tile::threads, 1)\n"
             "%s(const kiln_linear_args args)\n"
             "{\n"
             "    kiln::wgmma_gemm<format, tile, epilogue, /*n*/ 4096, /*k*/ 14336>(args);\n"
             "}\n",
             sig, kiln_emit_templates_digest(), s.desc.entry);
    cr_assert_str_eq(s.text, golden);
    cr_assert_eq(strncmp(s.desc.entry, "kiln_wgmma_", 11), 0, "%s", s.desc.entry);
    kiln_kernel_source_free(&s);
}

/* The one launch of the wgmma kernel of variant for format on N x K at
 * m tokens, asserting the signature parses and names its function. */
static kiln_launch launch_of(const char *variant, kiln_format f, long long n, long long k,
                             int64_t m)
{
    char sig[512];
    wgmma_sig(sig, sizeof sig, variant, f, act_of(f), n, k, 0, "sm_90a");
    kiln_kernel_desc d;
    cr_assert_eq(kiln_sig_parse(kiln_registry_default(), sig, &d), KILN_OK, "%s",
                 kiln_last_error());
    kiln_kernel_launch l[KILN_MAX_LAUNCHES];
    int count = 0;
    cr_assert_eq(kiln_kernel_launches(&d, m, l, &count), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(count, 1);
    cr_assert_str_eq(l[0].entry, d.entry);
    return l[0].cfg;
}

Test(wgmma, launches_cover_the_output)
{
    static const struct {
        const char *variant;
        int64_t m;
        unsigned gx, gy, smem;
    } cases[] = {
        /* N = 200: the last column tile is partial. */
        { "bm64bn64", 1, 4, 1, 32768 },    { "bm64bn64", 64, 4, 1, 32768 },
        { "bm64bn64", 65, 4, 2, 32768 },   { "bm64bn128", 65, 2, 2, 49152 },
        { "bm64bn128", 512, 2, 8, 49152 }, { "bm64bn128", 513, 2, 9, 49152 },
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        const kiln_launch c = launch_of(cases[i].variant, KILN_FMT_Q8_0, 200, 4096, cases[i].m);
        long long m = (long long)cases[i].m;
        cr_assert_eq(c.grid[0], cases[i].gx, "%s m=%lld", cases[i].variant, m);
        cr_assert_eq(c.grid[1], cases[i].gy, "%s m=%lld", cases[i].variant, m);
        cr_assert_eq(c.grid[2], 1);
        cr_assert_eq(c.block[0], 128, "one warpgroup");
        cr_assert_eq(c.block[1] * c.block[2], 1);
        cr_assert_eq(c.smem, cases[i].smem);
    }
}

/* The TMA kernel: one block per tile, which the session may clamp to the
 * SMs, and the maps of x (the bucket's rows) and W (N rows). */
Test(wgmma, tma_launch_is_persistent_with_two_maps)
{
    static const struct {
        const char *variant;
        int64_t m;
        unsigned tiles, bm, bn, smem;
    } cases[] = {
        { "tma_bm128bn256", 2048, 16 * 17, 128, 256, 1024 + 4 * 49152 + 64 },
        { "tma_bm128bn128", 129, 2 * 33, 128, 128, 1024 + 6 * 32768 + 96 },
        { "tma_bm64bn256", 64, 17, 64, 256, 1024 + 5 * 40960 + 80 },
        { "tma_bm64bn128", 65, 2 * 33, 64, 128, 1024 + 8 * 24576 + 128 },
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        const kiln_launch launch = launch_of(cases[i].variant, KILN_FMT_BF16, 4099, 192,
                                             cases[i].m);
        const kiln_launch *c = &launch;
        cr_assert_eq(c->grid[0], cases[i].tiles, "%s", cases[i].variant);
        cr_assert_eq(c->grid[1] * c->grid[2], 1);
        cr_assert_eq(c->block[0], 384, "a producer and two consumer warpgroups");
        cr_assert_eq(c->smem, cases[i].smem, "%s", cases[i].variant);
        cr_assert(c->persistent);
        cr_assert_eq(c->overlap, 0);
        cr_assert_eq(c->n_tma, 2);
        const kiln_tma *x = &c->tma[0], *w = &c->tma[1];
        cr_assert_eq(x->source, KILN_TMA_X);
        cr_assert_eq(w->source, KILN_TMA_W);
        for (int t = 0; t < 2; t++) {
            cr_assert_eq(c->tma[t].elem_bytes, 2);
            cr_assert_eq(c->tma[t].box[0], 64, "128 bytes of K: the swizzle's span");
            cr_assert_eq(c->tma[t].swizzle, 128);
        }
        cr_assert(x->rank <= 2 && x->dims[0] == 192 && x->strides[0] == 384);
        cr_assert_eq(x->dims[1], (uint64_t)cases[i].m);
        cr_assert_eq(x->box[1], cases[i].bm);
        /* W from gemv_tc's row-major atoms: 64 values, 16 rows, 3 atoms,
         * 257 row tiles; a box of one atom of bn / 16 row tiles */
        cr_assert_eq(w->rank, 4);
        cr_assert(w->dims[0] == 64 && w->dims[1] == 16 && w->dims[2] == 3 && w->dims[3] == 257);
        cr_assert(w->strides[0] == 128 && w->strides[1] == 2048 && w->strides[2] == 3 * 2048);
        cr_assert(w->box[1] == 16 && w->box[2] == 1 && w->box[3] == cases[i].bn / 16);
    }
    /* FP8 per-tensor and per-channel from theirs: 128 bytes (two rows), 8
     * of them, 257 row tiles, 3 atoms, a box of bn / 16 row tiles of two
     * atoms, in the 128-byte swizzle; block FP8 from its rows. */
    for (int f = KILN_FMT_FP8_TENSOR; f <= KILN_FMT_FP8_BLOCK; f++) {
        const kiln_launch c = launch_of("tma_bm128bn128", (kiln_format)f, 4099, 192, 129);
        const kiln_tma *x = &c.tma[0], *w = &c.tma[1];
        cr_assert(x->elem_bytes == 1 && x->box[0] == 128 && x->swizzle == 128);
        cr_assert_eq(w->elem_bytes, 1);
        if (f == KILN_FMT_FP8_BLOCK) {
            cr_assert(w->rank <= 2 && w->dims[0] == 192 && w->dims[1] == 4099);
            cr_assert(w->box[0] == 128 && w->box[1] == 128 && w->swizzle == 128);
            continue;
        }
        cr_assert_eq(w->rank, 4);
        cr_assert(w->dims[0] == 128 && w->dims[1] == 8 && w->dims[2] == 257 && w->dims[3] == 3);
        cr_assert(w->strides[0] == 128 && w->strides[1] == 3 * 1024 && w->strides[2] == 1024);
        cr_assert(w->box[0] == 128 && w->box[1] == 8 && w->box[2] == 8 && w->box[3] == 2);
        cr_assert_eq(w->swizzle, 128);
    }
}

/* Byte offset in the array of element i (box order) of map t's box at
 * coordinates c, or -1 past the map (TMA reads zeros there). */
static int64_t map_byte(const kiln_tma *t, const uint64_t c[4], uint64_t i)
{
    int64_t at = (int64_t)t->offset;
    for (int d = 0; d < t->rank; d++) {
        const uint64_t x = c[d] + i % t->box[d];
        i /= t->box[d];
        if (x >= t->dims[d])
            return -1;
        at += (int64_t)(x * (d ? t->strides[d - 1] : t->elem_bytes));
    }
    return at;
}

/* Which element of an FP8 weight tile, half by half bn rows of 64 bytes,
 * the MMA reads where the copy puts element i of a box: at byte i ^ (i >>
 * 7) % 8 · 16 (the map's 128-byte swizzle), which the descriptors' 64-byte
 * swizzle reads as element b ^ (b >> 7) % 4 · 16. */
static uint64_t fp8_mma_element(uint64_t i)
{
    const uint64_t b = i ^ ((i >> 7) & 7) << 4;
    return b ^ ((b >> 7) & 3) << 4;
}

/* Every element of every box the producer loads from the 4-D weight map
 * of BF16 and FP8, read from the packed atoms as the map addresses them,
 * is the weight's value at the row and column of the kernel's shared tile
 * there: box row n of row tile block c is weight row c · bn + n, its 128
 * bytes of K (BF16: one atom; FP8: two, a half of the tile each, the last
 * of an odd count past the map) stage s's. Rows past N read zeros. */
Test(wgmma, tma_boxes_of_packed_atoms_are_rows)
{
    enum { N = 40, K = 192, BN = 128 };
    static const kiln_format fs[] = { KILN_FMT_BF16, KILN_FMT_FP8_TENSOR, KILN_FMT_FP8_CHANNEL };
    for (size_t fi = 0; fi < KILN_ARRAY_LEN(fs); fi++) {
        const kiln_format f = fs[fi];
        const int e = f == KILN_FMT_BF16 ? 2 : 1, bk = 128 / e;
        const kiln_launch launch = launch_of("tma_bm64bn128", f, N, K, 64);
        const kiln_tma *w = &launch.tma[1];
        kt_rng rng = kt_rng_new(5 + fi);
        static uint8_t v[N * K * 2];
        static float row_scale[N];
        for (int i = 0; i < N * K; i++) {
            const uint16_t b = kiln_f32_to_bf16(kt_normal(&rng));
            const uint8_t code = (uint8_t)kt_next(&rng);
            if (e == 2)
                memcpy(v + 2 * i, &b, 2);
            else /* an E4M3 code, not NaN */
                v[i] = (code & 0x7F) == 0x7F ? code ^ 1 : code;
        }
        for (int i = 0; i < N; i++)
            row_scale[i] = 1.0f + (float)i;
        kiln_qtensor q = { .format = f, .n = N, .k = K, .data = v, .scale = row_scale };
        size_t data, scale;
        cr_assert_eq(kiln_gemv_pack_bytes(f, N, K, &data, &scale), KILN_OK);
        uint8_t *p = malloc(data + scale + 1);
        cr_assert_eq(kiln_gemv_pack(&q, p, p + data), KILN_OK, "%s", kiln_last_error());
        uint64_t last = 0;
        int checked = 0;
        for (int s = 0; s < (K + bk - 1) / bk; s++)
            for (int cb = 0; cb < (N + BN - 1) / BN; cb++) {
                const uint64_t c[4] = { 0, 0, e == 2 ? (uint64_t)s : (uint64_t)cb * BN / 16,
                                        e == 2 ? (uint64_t)cb * BN / 16 : 2 * (uint64_t)s };
                for (uint64_t i = 0; i < (uint64_t)BN * 128 / e; i++) {
                    /* the tile's row n and column of element i */
                    const uint64_t per = (uint64_t)BN * 64, b = e == 2 ? i : fp8_mma_element(i);
                    const int64_t n = cb * BN + (int64_t)(e == 2 ? b / 64 : b % per / 64);
                    const int64_t col = s * bk + (int64_t)(e == 2 ? b % 64 : b / per * 64 + b % 64);
                    const int64_t at = map_byte(w, c, i);
                    uint8_t got[2] = { 0, 0 }, want[2] = { 0, 0 };
                    if (at >= 0) {
                        cr_assert_leq((uint64_t)at + (unsigned)e, data, "inside the array");
                        memcpy(got, p + at, (size_t)e);
                        last = (uint64_t)at + (unsigned)e > last ? (uint64_t)at + (unsigned)e
                                                                  : last;
                    }
                    if (n < N && col < K)
                        memcpy(want, v + (n * K + col) * e, (size_t)e);
                    cr_assert(!memcmp(got, want, (size_t)e), "%s: row %lld, column %lld",
                              kiln_format_get(f)->name, (long long)n, (long long)col);
                    checked += n < N && col < K;
                }
            }
        cr_assert_eq(checked, N * K, "%s: every value, once", kiln_format_get(f)->name);
        cr_assert_eq(last, data, "%s: the map spans the packed array", kiln_format_get(f)->name);
        free(p);
    }
}

/* A persistent launch gets the blocks the device holds at once and no
 * more; without an SM count it keeps one block per tile. */
Test(wgmma, persistent_launches_are_clamped_to_the_device)
{
    const kiln_device_caps h200 = { .sm_count = 132, .smem_per_sm = 233472,
                                    .smem_per_block_reserved = 1024, .warps_per_sm = 64 };
    kiln_launch l = { .grid = { 272, 1, 1 }, .block = { 384, 1, 1 }, .smem = 197696,
                      .persistent = 1 };
    kiln_launch_finalise(&h200, &l);
    cr_assert_eq(l.grid[0], 132, "one block an SM by shared memory");
    l = (kiln_launch){ .grid = { 100, 1, 1 }, .block = { 384, 1, 1 }, .smem = 197696,
                       .persistent = 1 };
    kiln_launch_finalise(&h200, &l);
    cr_assert_eq(l.grid[0], 100, "fewer tiles than SMs: one block each");
    l = (kiln_launch){ .grid = { 1000, 1, 1 }, .block = { 384, 1, 1 }, .smem = 50000,
                       .persistent = 1 };
    kiln_launch_finalise(&h200, &l);
    cr_assert_eq(l.grid[0], 4 * 132, "four blocks an SM fit");
    const kiln_device_caps none = { 0 };
    l = (kiln_launch){ .grid = { 1000, 1, 1 }, .block = { 384, 1, 1 }, .smem = 50000,
                       .persistent = 1 };
    kiln_launch_finalise(&none, &l);
    cr_assert_eq(l.grid[0], 1000);
    l = (kiln_launch){ .grid = { 1000, 1, 1 }, .block = { 384, 1, 1 }, .smem = 197696 };
    kiln_launch_finalise(&h200, &l);
    cr_assert_eq(l.grid[0], 1000, "not persistent: every block launches");
}

Test(wgmma, launch_refuses_impossible_token_counts)
{
    char sig[512];
    kiln_kernel_desc d;
    kiln_kernel_launch l[KILN_MAX_LAUNCHES];
    int n;
    wgmma_sig(sig, sizeof sig, "bm64bn64", KILN_FMT_Q8_0, "bf16", 64, 64, 0, "sm_90a");
    cr_assert_eq(kiln_sig_parse(kiln_registry_default(), sig, &d), KILN_OK);
    cr_assert_eq(kiln_kernel_launches(&d, 64 * 65535, l, &n), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_kernel_launches(&d, 64 * 65535 + 1, l, &n), KILN_ERR_SHAPE);
    cr_assert(strstr(kiln_last_error(), "wgmma bm64bn64: cannot launch for M = 4194241"), "%s",
              kiln_last_error());
    kiln_launch cfg;
    kiln_target t = target("sm_90a");
    cr_assert_eq(wg->launch(&t, &d.linear, 0, &cfg), KILN_ERR_SHAPE);
    snprintf(d.linear.variant, sizeof d.linear.variant, "bm128bn256");
    cr_assert_eq(kiln_kernel_launches(&d, 1, l, &n), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "no variant \"bm128bn256\""), "%s", kiln_last_error());
}

/* Every kernel emit refuses, with the reason in the message. */
Test(wgmma, emit_refuses_kernels_it_does_not_build)
{
    char sigs[11][512];
    static const char *const reasons[] = {
        "no variant \"t64x64\"",
        "activations must be bf16, not fp8-token",
        "residual and silu_mul cannot both be fused",
        "needs wgmma (sm_90a), target is sm_90",
        "needs wgmma (sm_90a), target is sm_89",
        "K=96 is not a multiple of 64",
        "N=2147483648, K=64: both must be below 2^31",
        "no variant \"bm64bn64\" for bf16 (tma_bm128bn256,",
        "no variant \"tma_bm64bn128\" for q8_0 (bm64bn64, bm64bn128)",
        "activations must be fp8-token, not bf16",
        "tma_bm128bn256 sums E4M3 in two sets of accumulators",
    };
    wgmma_sig(sigs[0], 512, "t64x64", KILN_FMT_BF16, "bf16", 64, 64, 0, "sm_90a");
    wgmma_sig(sigs[1], 512, "bm64bn64", KILN_FMT_Q8_0, "fp8-token", 64, 64, 0, "sm_90a");
    wgmma_sig(sigs[2], 512, "tma_bm64bn128", KILN_FMT_BF16, "bf16", 64, 64,
              KILN_EPI_RESIDUAL | KILN_EPI_SILU_MUL, "sm_90a");
    wgmma_sig(sigs[3], 512, "tma_bm64bn128", KILN_FMT_BF16, "bf16", 64, 64, 0, "sm_90");
    wgmma_sig(sigs[4], 512, "bm64bn128", KILN_FMT_Q4_0, "bf16", 64, 64, 0, "sm_89");
    wgmma_sig(sigs[5], 512, "tma_bm128bn256", KILN_FMT_BF16, "bf16", 64, 96, 0, "sm_90a");
    wgmma_sig(sigs[6], 512, "bm64bn64", KILN_FMT_Q8_0, "bf16", (long long)INT_MAX + 1, 64, 0,
              "sm_90a");
    wgmma_sig(sigs[7], 512, "bm64bn64", KILN_FMT_BF16, "bf16", 64, 64, 0, "sm_90a");
    wgmma_sig(sigs[8], 512, "tma_bm64bn128", KILN_FMT_Q8_0, "bf16", 64, 64, 0, "sm_90a");
    wgmma_sig(sigs[9], 512, "tma_bm64bn128", KILN_FMT_FP8_CHANNEL, "bf16", 64, 64, 0, "sm_90a");
    wgmma_sig(sigs[10], 512, "tma_bm128bn256", KILN_FMT_FP8_TENSOR, "fp8-token", 64, 64, 0,
              "sm_90a");
    for (size_t i = 0; i < KILN_ARRAY_LEN(sigs); i++) {
        kiln_kernel_source s = { .text = NULL };
        cr_assert_eq(kiln_emit_text(kiln_registry_default(), sigs[i], &s), KILN_ERR_UNSUPPORTED,
                     "%s: %s", sigs[i], kiln_last_error());
        cr_assert(strstr(kiln_last_error(), reasons[i]), "%s: %s", sigs[i], kiln_last_error());
        cr_assert_null(s.text);
    }
    /* A format outside the table never reaches the format traits. */
    kiln_target t = target("sm_90a");
    kiln_linear_kernel k = { .cfg = { .format = KILN_FMT_COUNT, .n = 64, .k = 64 },
                             .act = KILN_ACT_BF16, .variant = "bm64bn64" };
    char buf[4096];
    cr_assert_eq(wg->emit(&t, &k, "kiln_wgmma_0", buf, sizeof buf), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "is not a kiln_format"), "%s", kiln_last_error());
}

Test(wgmma, emit_refuses_a_buffer_too_small)
{
    kiln_target t = target("sm_90a");
    kiln_linear_kernel k = { .cfg = { .format = KILN_FMT_Q8_0, .n = 64, .k = 64 },
                             .act = KILN_ACT_BF16, .variant = "bm64bn64" };
    char buf[64];
    cr_assert_eq(wg->emit(&t, &k, "kiln_wgmma_0", buf, sizeof buf), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "the buffer has 64"), "%s", kiln_last_error());
}

/* ------------------------------------------------------------- planning */

/* x -> rms -> gate (q4_k), up (nvfp4) -> silu·mul -> down (fp8_block) + x:
 * the demo's FFN block with three formats, and a bf16 projection whose K
 * is no multiple of 64. */
typedef struct ffn {
    kiln_graph *g;
    uint8_t *wdata, *scale;
    float norm[256];
} ffn;

static void ffn_make(ffn *f)
{
    enum { D = 256, F = 512, ODD_K = 96 };
    kt_rng rng = kt_rng_new(11);
    f->wdata = calloc(F * D * 2, 1);
    f->scale = calloc(8192, 1);
    cr_assert(f->wdata && f->scale);
    kt_fill_normal(&rng, f->norm, D, 1.0f);
    kiln_graph *g;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    kiln_tensor *x, *nw, *h, *wg_, *wu, *wd, *wo, *gate, *up, *act, *prod, *down, *out, *x2, *odd;
    kiln_qtensor qg = { .format = KILN_FMT_Q4_K, .n = F, .k = D, .data = f->wdata };
    kiln_qtensor qu = { .format = KILN_FMT_NVFP4, .n = F, .k = D, .data = f->wdata,
                        .scale = f->scale };
    kiln_qtensor qd = { .format = KILN_FMT_FP8_BLOCK, .n = D, .k = F, .data = f->wdata,
                        .scale = f->scale };
    kiln_qtensor qo = { .format = KILN_FMT_BF16, .n = 64, .k = ODD_K, .data = f->wdata };
    cr_assert_eq(kiln_graph_input(g, "x", D, &x), KILN_OK);
    cr_assert_eq(kiln_graph_input(g, "x2", ODD_K, &x2), KILN_OK);
    cr_assert_eq(kiln_graph_param(g, "norm", D, f->norm, &nw), KILN_OK);
    cr_assert_eq(kiln_graph_rms_norm(g, "h", x, nw, 1e-6f, &h), KILN_OK);
    cr_assert_eq(kiln_graph_weight(g, "wg", &qg, &wg_), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_graph_weight(g, "wu", &qu, &wu), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_graph_weight(g, "wd", &qd, &wd), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_graph_weight(g, "wo", &qo, &wo), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_graph_linear(g, "gate", h, wg_, NULL, &gate), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "up", h, wu, NULL, &up), KILN_OK);
    cr_assert_eq(kiln_graph_silu(g, "act", gate, &act), KILN_OK);
    cr_assert_eq(kiln_graph_mul(g, "prod", up, act, &prod), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "down", prod, wd, NULL, &down), KILN_OK);
    cr_assert_eq(kiln_graph_add(g, "out", x, down, &out), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "odd", x2, wo, NULL, &odd), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, out), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, odd), KILN_OK);
    f->g = g;
}

static void ffn_free(ffn *f)
{
    kiln_graph_destroy(f->g);
    free(f->wdata);
    free(f->scale);
}

/* Past the decode buckets on sm_90a: wgmma_tc for the formats it decodes
 * from the packed layout in one BF16 term, wgmma for the others. */
static const char *prefill_backend(kiln_format f)
{
    return f == KILN_FMT_NVFP4 || f == KILN_FMT_MXFP4 || f == KILN_FMT_GGML_MXFP4 ||
                   f == KILN_FMT_Q8_0 || f == KILN_FMT_Q4_0 || f == KILN_FMT_Q4_K ||
                   f == KILN_FMT_Q6_K || f == KILN_FMT_MXFP8
               ? "wgmma_tc"
               : "wgmma";
}

/* On sm_90a every linear whose K allows it runs on its prefill backend past
 * the decode buckets (gemv_tc or gemv, where registered, may take those up
 * to 16); the odd K goes to simt with wgmma's reason recorded; every
 * signature emits. */
Test(wgmma, default_plan_for_sm_90a_takes_wgmma)
{
    ffn f;
    ffn_make(&f);
    kiln_target t = target("h100");
    kiln_plan *p;
    cr_assert_eq(kiln_plan_create(f.g, &t, NULL, &p), KILN_OK, "%s", kiln_last_error());
    int wgmma = 0, tc = 0;
    for (int l = 0; l < kiln_plan_n_linears(p); l++)
        for (int b = 0; b < kiln_plan_n_buckets(p); b++) {
            kiln_plan_linear pl;
            cr_assert_eq(kiln_plan_linear_at(p, l, b, &pl), KILN_OK);
            int64_t m = kiln_plan_bucket(p, b);
            if (pl.k == 96) {
                if (m <= 16 && !strncmp(pl.backend, "gemv", 4))
                    continue;
                cr_assert_str_eq(pl.backend, "simt", "M %lld", (long long)m);
                cr_assert(strstr(pl.refused, "wgmma: K=96 is not a multiple of 64"), "%s",
                          pl.refused);
                continue;
            }
            if (m > 16)
                cr_assert_str_eq(pl.backend, prefill_backend(pl.format), "%s at M %lld", pl.node,
                                 (long long)m);
            else
                cr_assert(!strcmp(pl.backend, "wgmma") || !strncmp(pl.backend, "gemv", 4),
                          "%s at M %lld: %s", pl.node, (long long)m, pl.backend);
            tc += !strcmp(pl.backend, "wgmma_tc");
            if (strcmp(pl.backend, "wgmma"))
                continue;
            wgmma++;
            cr_assert_null(strstr(pl.refused, "wgmma"), "%s", pl.refused);
            cr_assert_str_eq(pl.act, act_of(pl.format));
            const char *sig = kiln_plan_signature(p, pl.signature);
            if (fp8_tma(pl.format) || pl.format == KILN_FMT_BF16)
                cr_assert(strstr(sig, "variant=tma_"), "%s", sig);
            else
                cr_assert(strstr(sig, m <= 64 ? "variant=bm64bn64 " : "variant=bm64bn128 "),
                          "%s", sig);
            if (!strcmp(pl.node, "up"))
                cr_assert_str_eq(pl.epilogue, "silu_mul");
            if (!strcmp(pl.node, "down"))
                cr_assert_str_eq(pl.epilogue, "residual");
        }
    cr_assert_geq(wgmma, 5, "down (FP8 block) in the five buckets past 16 at least");
    cr_assert_eq(tc, 2 * 5, "gate (Q4_K) and up (NVFP4) in the five buckets past 16");
    for (int i = 0; i < kiln_plan_n_signatures(p); i++) {
        kiln_kernel_source s;
        cr_assert_eq(kiln_emit_text(kiln_registry_default(), kiln_plan_signature(p, i), &s),
                     KILN_OK, "%s: %s", kiln_plan_signature(p, i), kiln_last_error());
        kiln_kernel_source_free(&s);
    }
    kiln_plan_destroy(p);
    ffn_free(&f);
}

Test(wgmma, default_plan_elsewhere_records_why_not)
{
    ffn f;
    ffn_make(&f);
    static const char *const names[] = { "sm_80", "sm_89", "sm_90" };
    for (size_t i = 0; i < KILN_ARRAY_LEN(names); i++) {
        kiln_target t = target(names[i]);
        kiln_plan *p;
        cr_assert_eq(kiln_plan_create(f.g, &t, NULL, &p), KILN_OK, "%s", kiln_last_error());
        char why[96];
        snprintf(why, sizeof why, "wgmma: needs wgmma (sm_90a), target is %s", names[i]);
        for (int l = 0; l < kiln_plan_n_linears(p); l++)
            for (int b = 0; b < kiln_plan_n_buckets(p); b++) {
                kiln_plan_linear pl;
                cr_assert_eq(kiln_plan_linear_at(p, l, b, &pl), KILN_OK);
                cr_assert_str_neq(pl.backend, "wgmma");
                if (!strcmp(pl.backend, "simt"))
                    cr_assert(strstr(pl.refused, why), "%s: %s", names[i], pl.refused);
            }
        for (int s = 0; s < kiln_plan_n_signatures(p); s++)
            cr_assert_null(strstr(kiln_plan_signature(p, s), "backend=wgmma"));
        kiln_plan_destroy(p);
    }
    ffn_free(&f);
}

/* The demo as a user plans it: on sm_90a every bucket past 16 is wgmma's
 * or, for the formats of the packed layout's prefill, wgmma_tc's,
 * on sm_80 none is, and each simt choice says why. */
Test(wgmma, demo_plans_by_target)
{
    kt_cli r = kt_cli_run("plan demo --target sm_90a --json");
    cr_assert_eq(r.status, 0, "%s", r.err);
    int past16 = 0, tc = 0;
    for (const char *p = strstr(r.out, "\"tokens\": "); p; p = strstr(p + 1, "\"tokens\": ")) {
        /* A linear's bucket names its backend before the next "tokens";
         * the arena's buckets name none. */
        long long m = atoll(p + strlen("\"tokens\": "));
        const char *b = strstr(p, "\"backend\": \""), *next = strstr(p + 1, "\"tokens\": ");
        if (!b || (next && b > next))
            continue;
        b += strlen("\"backend\": \"");
        /* the linear's format: the last one named before its bucket */
        const char *fmt = NULL;
        for (const char *q = strstr(r.out, "\"format\": \""); q && q < p;
             q = strstr(q + 1, "\"format\": \""))
            fmt = q + strlen("\"format\": \"");
        cr_assert_not_null(fmt);
        if (m > 16) {
            kiln_format f = KILN_FMT_COUNT;
            for (int i = 0; i < KILN_FMT_COUNT; i++) {
                const char *name = kiln_format_get((kiln_format)i)->name;
                if (!strncmp(fmt, name, strlen(name)) && fmt[strlen(name)] == '"')
                    f = (kiln_format)i;
            }
            cr_assert_neq(f, KILN_FMT_COUNT, "%.20s", fmt);
            const char *want = prefill_backend(f);
            cr_assert(!strncmp(b, want, strlen(want)) && b[strlen(want)] == '"', "M %lld: %.20s",
                      m, b);
            past16++;
            tc += !strcmp(want, "wgmma_tc");
        }
    }
    cr_assert_eq(past16, 18 * 5, "18 linears x buckets 32, 64, 128, 256, 512");
    cr_assert_gt(tc, 0, "the demo has a linear in a format wgmma_tc takes");
    kt_cli_free(&r);

    r = kt_cli_run("plan demo --target sm_80");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "18 linear nodes x 10 buckets"), "%s", r.out);
    /* Table rows: a linear's first row names it, its further bucket
     * ranges follow indented; the backend comes after the range. */
    int simt = 0;
    const char *rows = strstr(r.out, "refused before it\n");
    cr_assert_not_null(rows, "%s", r.out);
    for (const char *line = strchr(rows, '\n') + 1; *line && *line != '\n';
         line = strchr(line, '\n') + 1) {
        char name[64], format[32], shape[32], range[32], backend[16];
        int first = !strncmp(line, "blk.", 4);
        int got = first ? sscanf(line, "%63s %31s %31s %31s %15s", name, format, shape, range,
                                 backend)
                        : sscanf(line, "%31s %15s", range, backend);
        cr_assert_eq(got, first ? 5 : 2, "%.120s", line);
        cr_assert_str_neq(backend, "wgmma", "%.120s", line);
        const char *end = strchr(line, '\n');
        cr_assert_not_null(end);
        if (strcmp(backend, "simt"))
            continue;
        const char *why = strstr(line, "wgmma: needs wgmma (sm_90a), target is sm_80");
        cr_assert(why && why < end, "%.*s", (int)(end - line), line);
        simt++;
    }
    cr_assert_geq(simt, 18, "every linear runs on simt past the decode buckets");
    kt_cli_free(&r);
}

/* ------------------------------------------------------------ compiling */

static const unsigned epilogues[] = {
    0,
    KILN_EPI_BIAS,
    KILN_EPI_BIAS | KILN_EPI_RESIDUAL,
    KILN_EPI_SILU_MUL,
    KILN_EPI_BIAS | KILN_EPI_SILU_MUL,
};
static const char *const variants[] = { "bm64bn64", "bm64bn128" };
static const char *const tma_variants[] = { "tma_bm128bn256", "tma_bm128bn128", "tma_bm64bn256",
                                            "tma_bm64bn128" };

/* K: whole steps of 64 and whole blocks of every format (Q4_K, Q6_K: 256),
 * more than two steps so both stages turn over. N = 1000 + f leaves a
 * partial column tile, odd N included, so both epilogue store paths
 * compile. BF16 has the TMA kernel's variants. */
static void sig_for(char *buf, size_t size, int f, const char *variant, int e)
{
    wgmma_sig(buf, size, variant, (kiln_format)f, act_of(f), 1000 + f, 768, epilogues[e],
              "sm_90a");
}

/* The integer groups: each format per row and in groups of 32 along K,
 * both tiles. */
Test(wgmma, integer_groups_compile_for_sm_90a, .timeout = 600)
{
    static const kiln_format fs[] = { KILN_FMT_INT4_GROUP, KILN_FMT_INT4_GROUP_ZP,
                                      KILN_FMT_INT8_GROUP, KILN_FMT_INT8_GROUP_ZP };
    static const char *const scales[] = { "f32:1xK", "f32:1x32" };
    kt_batch b = { 0 };
    char sig[512];
    for (size_t f = 0; f < KILN_ARRAY_LEN(fs); f++)
        for (size_t g = 0; g < KILN_ARRAY_LEN(scales); g++) {
            snprintf(sig, sizeof sig,
                     "linear backend=wgmma variant=%s format=%s scales=%s%s act=bf16 n=1001 "
                     "k=768 epilogue=%s out=bf16 target=sm_90a",
                     variants[(f + g) % KILN_ARRAY_LEN(variants)], kiln_format_get(fs[f])->name,
                     scales[g], f % 2 ? "+zp" : "", g ? "bias" : "none");
            kt_batch_add(&b, sig);
        }
    kt_batch_compile(&b, "wgmma integer groups");
}

Test(wgmma, every_format_variant_and_epilogue_compiles_for_sm_90a, .timeout = 1200)
{
    enum { NV = KILN_ARRAY_LEN(variants), NT = KILN_ARRAY_LEN(tma_variants) };
    enum { NE = KILN_ARRAY_LEN(epilogues) };
    /* BF16 on every TMA tile, E4M3 on all but the widest; no integer groups */
    enum { JOBS = (KILN_FMT_COUNT - 4 - 4) * NV * NE + NT * NE + 3 * (NT - 1) * NE };
    static kiln_kernel_source src[JOBS];
    static kiln_compile_job jobs[JOBS];
    static char sigs[JOBS][512];
    int n = 0;
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        if (kiln_format_get((kiln_format)f)->grouped)
            continue;
        const int tma = f == KILN_FMT_BF16 || fp8_tma(f);
        for (int v = fp8_tma(f); v < (tma ? NT : NV); v++)
            for (int e = 0; e < NE; e++, n++) {
                sig_for(sigs[n], sizeof sigs[n], f, tma ? tma_variants[v] : variants[v], e);
                cr_assert_eq(kiln_emit_text(kiln_registry_default(), sigs[n], &src[n]), KILN_OK,
                             "%s: %s", sigs[n], kiln_last_error());
                jobs[n] = (kiln_compile_job){ .name = sigs[n], .entry = src[n].desc.entry,
                                              .source = src[n].text,
                                              .target = &src[n].desc.target };
            }
    }
    cr_assert_eq(n, JOBS);
    kiln_nvrtc *nv = kt_open_nvrtc();
    const kiln_nvrtc_pool quiet = { .quiet = 1 };
    double start = kiln_now();
    kiln_status st = kiln_nvrtc_compile_all(nv, jobs, n, &quiet);
    double wall = kiln_now() - start;
    cr_assert_eq(st, KILN_OK, "%s", kiln_last_error());
    double sum = 0, max = 0;
    for (int i = 0; i < n; i++) {
        cr_assert_eq(jobs[i].status, KILN_OK);
        cr_assert_gt(jobs[i].cubin_size, 0);
        /* ptxas says when it serializes wgmma (a register it must move
         * while an MMA is in flight): the kernel would be correct and slow. */
        cr_assert_null(strstr(jobs[i].log, "wgmma"), "%s: %s", sigs[i], jobs[i].log);
        sum += jobs[i].seconds;
        max = jobs[i].seconds > max ? jobs[i].seconds : max;
        kiln_compile_job_reset(&jobs[i]);
        kiln_kernel_source_free(&src[i]);
    }
    fprintf(stderr, "wgmma sm_90a: %d kernels in %.1f s wall, %.2f s mean, %.2f s max\n", n, wall,
            sum / n, max);
    kiln_nvrtc_close(nv);
}

/* ------------------------------------------------------------------ SASS */

/* The main loop is HGMMA of the tile's width, four per K step (the
 * compiler may unroll), behind the proxy fence and the warpgroup arrive
 * and wait; the accumulators never leave registers. */
Test(wgmma, sass_runs_the_main_loop_on_hgmma, .timeout = 300)
{
    static const struct {
        const char *variant;
        kiln_format f;
        const char *hgmma;
        int tma; /* copies by TMA into mbarrier stages, else stores and a proxy fence */
    } cases[] = {
        { "bm64bn64", KILN_FMT_Q8_0, "HGMMA.64x64x16.F32.BF16", 0 },
        { "bm64bn128", KILN_FMT_Q4_K, "HGMMA.64x128x16.F32.BF16", 0 },
        { "bm64bn128", KILN_FMT_NVFP4, "HGMMA.64x128x16.F32.BF16", 0 },
        { "tma_bm128bn256", KILN_FMT_BF16, "HGMMA.64x256x16.F32.BF16", 1 },
        { "tma_bm64bn128", KILN_FMT_BF16, "HGMMA.64x64x16.F32.BF16", 1 },
        { "tma_bm128bn128", KILN_FMT_FP8_CHANNEL, "QGMMA.64x128x32.F32.E4M3.E4M3", 1 },
        { "tma_bm64bn256", KILN_FMT_FP8_BLOCK, "QGMMA.64x128x32.F32.E4M3.E4M3", 1 },
    };
    kiln_nvrtc *nv = kt_open_nvrtc();
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        char sig[512];
        wgmma_sig(sig, sizeof sig, cases[i].variant, cases[i].f,
                  act_of(cases[i].f), 4096, 4096,
                  KILN_EPI_BIAS | KILN_EPI_SILU_MUL, "sm_90a");
        kiln_kernel_source s;
        cr_assert_eq(kiln_emit_text(kiln_registry_default(), sig, &s), KILN_OK, "%s",
                     kiln_last_error());
        kiln_compile_job job = { .name = sig, .entry = s.desc.entry, .source = s.text,
                                 .target = &s.desc.target };
        cr_assert_eq(kiln_nvrtc_compile(nv, &job, NULL), KILN_OK, "%s", kiln_last_error());
        char *sass = kt_dump_sass(job.cubin, job.cubin_size);
        if (!sass) {
            kiln_compile_job_reset(&job);
            kiln_kernel_source_free(&s);
            kiln_nvrtc_close(nv);
            cr_skip_test("cuobjdump (with nvdisasm) is not on PATH: the SASS is not checked");
        }
        cr_assert(strstr(sass, "code for sm_90a"), "%.200s", sass);
        int mma = kt_count(sass, cases[i].hgmma);
        cr_assert(mma >= 4 && mma % 4 == 0, "%s: four k16 MMAs per K step, %d seen", sig, mma);
        cr_assert_eq(kt_count(sass, "GMMA"), mma, "%s: no other MMA", sig);
        cr_assert_geq(kt_count(sass, "WARPGROUP.ARRIVE"), 1, "%s", sig);
        cr_assert_geq(kt_count(sass, "WARPGROUP.DEPBAR.LE gsb0, 0x0"), 1, "%s", sig);
        if (cases[i].tma) {
            const int atoms = cases[i].f == KILN_FMT_BF16 || cases[i].f == KILN_FMT_FP8_TENSOR ||
                              cases[i].f == KILN_FMT_FP8_CHANNEL;
            cr_assert_geq(kt_count(sass, "UTMALDG.2D"), atoms ? 1 : 2, "%s: x and W by TMA", sig);
            cr_assert_geq(kt_count(sass, "UTMALDG.4D"), atoms, "%s: W from its atoms", sig);
            cr_assert_geq(kt_count(sass, "SYNCS"), 1, "%s: stages behind mbarriers", sig);
            /* E4M3 waits for each stage's sum to promote it */
            if (!fp8_tma(cases[i].f))
                cr_assert_geq(kt_count(sass, "WARPGROUP.DEPBAR.LE gsb0, 0x1"), 1,
                              "%s: one stage of MMAs stays queued", sig);
        } else {
            cr_assert_geq(kt_count(sass, "FENCE.VIEW.ASYNC.S"), 1, "%s: after a stage's stores",
                          sig);
        }
        cr_assert_eq(kt_count(sass, "LDL"), 0, "%s: nothing in local memory", sig);
        cr_assert_eq(kt_count(sass, "STL"), 0, "%s: nothing in local memory", sig);
        free(sass);
        kiln_compile_job_reset(&job);
        kiln_kernel_source_free(&s);
    }
    kiln_nvrtc_close(nv);
}
