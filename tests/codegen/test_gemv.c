/* The gemv backend (kernels/gemv/backend.c), the f32 kernel of
 * kernels/gemv/gemv.cuh: capability checks and their reasons, the M class
 * per bucket, launch shapes, the emitted source, the storage layout it
 * reads, and every (format x M class x epilogue) instantiation compiled
 * by NVRTC for each architecture family kiln targets. Its place after
 * gemv_tc in the default registry's lists is tests/codegen/test_gemv_tc.c's.
 * Needs libnvrtc but no GPU: the GPU suites (tests/gpu/test_backends.c,
 * test_session.c) check the results against the CPU. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/emit.h"
#include "codegen/nvrtc.h"
#include "kernels/gemv/gemv_format.h"
#include "codegen_util.h"
#include "testutil.h"

static const kiln_backend *const gemv = &kiln_backend_gemv;

/* The formats up to Q4_1, which gemv has rows for; the integer groups
 * after them have their own test. */
#define GEMV_FORMATS_END (KILN_FMT_Q4_1 + 1)

static kiln_target target(const char *name)
{
    kiln_target t;
    cr_assert_eq(kiln_target_from_name(name, &t), KILN_OK, "%s", kiln_last_error());
    return t;
}

static kiln_linear_cfg cfg(kiln_format f, int64_t n, int64_t k)
{
    return (kiln_linear_cfg){ .format = f, .n = n, .k = k };
}

static const char *variant_of(const char *arch, kiln_format f, int64_t k, int64_t bucket,
                              char *buf, size_t size)
{
    kiln_target t = target(arch);
    kiln_linear_cfg c = cfg(f, 4096, k);
    kiln_backend_variant(gemv, &t, &c, bucket, buf, size);
    return buf;
}

/* k, or k + 32 where the format allows it on a target gemv_tc runs on:
 * a K of part atoms, which plans give this kernel there. */
static int64_t plan_k(const kiln_target *t, kiln_format f, int64_t k)
{
    return t->sm >= 80 && (k + 32) % kiln_format_get(f)->k_multiple == 0 ? k + 32 : k;
}

/* The gemv signature of one linear. */
static char *gemv_sig(char *buf, size_t size, const char *variant, kiln_format f, unsigned epi,
                      int64_t n, int64_t k, const char *arch)
{
    return kt_linear_sig(buf, size, "gemv", variant, f, "bf16", n, k, epi, arch);
}

/* -------------------------------------------------------------- formats */

/* The rows of kernels/gemv/gemv_format.h, which the host's stage sizes
 * and the device traits are built from: one a format, in kiln_format's
 * order, named by the format's short name (gemv_formats.cuh's
 * gemv_stream_<name>); a unit is whole storage blocks or a part of one,
 * and the scale array a stage copies is the format's own. */
#define ROW_CHECK(fmt, short_name, n_unit, n_aligned, n_rows, n_cols, n_elem, n_offset)            \
    {                                                                                              \
        const kiln_format_info *fi = kiln_format_get(KILN_FMT_##fmt);                              \
        const int elem = fi->scale_type == KILN_SCALE_F32 ? 4 : 1;                                 \
        cr_assert_eq(KILN_FMT_##fmt, rows, #fmt);                                                  \
        cr_assert_str_eq(fi->name, #short_name);                                                   \
        cr_assert(n_unit % fi->block == 0 || fi->block % n_unit == 0, #fmt);                       \
        if (fi->scale_cols > 0)                                                                    \
            cr_assert(n_rows == fi->scale_rows && n_cols == fi->scale_cols && n_elem == elem,      \
                      #fmt);                                                                       \
        else                                                                                       \
            cr_assert(n_rows == 0 && n_cols == 0 && n_elem == 0, #fmt);                            \
        cr_assert((n_aligned == 0 || n_aligned == 1) && (n_offset == 0 || n_offset == 1), #fmt);   \
        rows++;                                                                                    \
    }

Test(gemv, format_rows_name_their_formats)
{
    int rows = 0;
    KILN_GEMV_FORMATS(ROW_CHECK)
    cr_assert_eq(rows, GEMV_FORMATS_END);
}

/* --------------------------------------------------------- capabilities */

Test(gemv, runs_on_sm_75_and_newer)
{
    char why[128] = "";
    for (const char *const *n = kiln_target_names(); *n; n++) {
        kiln_target t = target(*n);
        cr_assert_eq(gemv->is_supported(&t, why, sizeof why), 1, "%s", *n);
    }
    kiln_target old = { .name = "sm_70", .sm = 70 };
    cr_assert_eq(gemv->is_supported(&old, why, sizeof why), 0);
    cr_assert_str_eq(why, "needs sm_75 or newer, target is sm_70");
}

Test(gemv, covers_every_format_and_epilogue_with_bf16_activations)
{
    cr_assert_eq(gemv->formats, ((1u << GEMV_FORMATS_END) - 1) | KILN_FMT_INT_GROUPS);
    cr_assert_eq(gemv->epilogues, KILN_EPI_BIAS | KILN_EPI_RESIDUAL | KILN_EPI_SILU_MUL);
    kiln_target t = target("h200");
    for (int f = 0; f < GEMV_FORMATS_END; f++) {
        kiln_linear_cfg c = cfg((kiln_format)f, 4096, 4096);
        for (int64_t m = 1; m <= 16 && !kiln_format_get((kiln_format)f)->grouped; m++) {
            char why[256] = "";
            cr_assert_eq(gemv->can_implement(&t, &c, m, why, sizeof why), 1, "%s m=%lld: %s",
                         kiln_format_get((kiln_format)f)->name, (long long)m, why);
            cr_assert_eq(kiln_backend_act(gemv, &t, &c, m), KILN_ACT_BF16);
        }
    }
}

Test(gemv, refuses_buckets_past_16)
{
    kiln_target t = target("h200");
    kiln_linear_cfg c = cfg(KILN_FMT_NVFP4, 4096, 4096);
    char why[256];
    cr_assert_eq(gemv->can_implement(&t, &c, 17, why, sizeof why), 0);
    cr_assert_str_eq(why, "M bucket 17 > 16");
    cr_assert_eq(gemv->can_implement(&t, &c, 32, why, sizeof why), 0);
    cr_assert_str_eq(why, "M bucket 32 > 16");
}

/* The M classes, whatever the format, K and target. */
Test(gemv, variants_follow_the_bucket)
{
    static const struct {
        int64_t m;
        const char *variant;
    } cases[] = {
        { 1, "m1" }, { 2, "m2" }, { 3, "m4" }, { 4, "m4" },   { 5, "m8" },
        { 8, "m8" }, { 9, "m16" }, { 12, "m16" }, { 16, "m16" },
    };
    static const struct {
        const char *arch;
        kiln_format f;
        int64_t k;
    } linears[] = {
        { "t4", KILN_FMT_Q4_0, 4096 },
        { "t4", KILN_FMT_BF16, 4096 },
        { "h200", KILN_FMT_F16, 4096 + 8 },
        { "h200", KILN_FMT_F32, 4096 },
        { "h200", KILN_FMT_BF16, 4096 },
        { "sm_80", KILN_FMT_Q4_K, 256 },
        { "a100", KILN_FMT_Q8_0, 4096 + 32 },
        { "l40s", KILN_FMT_NVFP4, 4096 - 32 },
    };
    for (size_t l = 0; l < KILN_ARRAY_LEN(linears); l++)
        for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
            char v[64];
            cr_assert_str_eq(variant_of(linears[l].arch, linears[l].f, linears[l].k, cases[i].m, v,
                                        sizeof v),
                             cases[i].variant, "%s %s K=%lld m=%lld", linears[l].arch,
                             kiln_format_get(linears[l].f)->name, (long long)linears[l].k,
                             (long long)cases[i].m);
        }
}

/* K must be whole 16-byte loads of the plain and FP8/FP4 formats; the GGML
 * formats' own block multiple is always enough. */
Test(gemv, refuses_k_that_is_not_whole_loads)
{
    static const struct {
        kiln_format f;
        int64_t k;
        const char *why; /* NULL: taken */
    } cases[] = {
        { KILN_FMT_F32, 1004, "K=1004 is not a multiple of 8, the f32 values a lane decodes" },
        { KILN_FMT_BF16, 4100, "K=4100 is not a multiple of 8, the bf16 values a lane decodes" },
        { KILN_FMT_F16, 4104, NULL },
        { KILN_FMT_FP8_TENSOR, 1000, "K=1000 is not a multiple of 16, the fp8 values" },
        { KILN_FMT_FP8_BLOCK, 1008, NULL },
        { KILN_FMT_NVFP4, 1008, "K=1008 is not a multiple of 32, the nvfp4 values" },
        { KILN_FMT_NVFP4, 1024, NULL },
        { KILN_FMT_Q4_0, 32 * 33, NULL },
        { KILN_FMT_GGML_MXFP4, 32 * 7, NULL },
        { KILN_FMT_Q6_K, 256 * 5, NULL },
    };
    /* The same on sm_90a as on sm_75. */
    static const char *const arches[] = { "sm_75", "sm_90a" };
    for (size_t a = 0; a < KILN_ARRAY_LEN(arches); a++)
        for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
            kiln_target t = target(arches[a]);
            kiln_linear_cfg c = cfg(cases[i].f, 512, cases[i].k);
            char why[256] = "";
            int ok = gemv->can_implement(&t, &c, 1, why, sizeof why);
            cr_assert_eq(ok, cases[i].why == NULL, "%s case %zu: %s", arches[a], i, why);
            if (cases[i].why)
                cr_assert(strstr(why, cases[i].why), "%s case %zu: %s", arches[a], i, why);
        }
}

/* The kernel indexes rows, K and a row's bytes with ints. */
Test(gemv, refuses_shapes_past_its_indexing)
{
    char why[256];
    static const char *const archs[] = { "sm_75", "sm_80" };
    for (size_t i = 0; i < KILN_ARRAY_LEN(archs); i++) {
        kiln_target t = target(archs[i]);
        for (int64_t m = 1; m <= 16; m *= 16) {
            kiln_linear_cfg c = cfg(KILN_FMT_BF16, (int64_t)INT_MAX + 1, 64);
            cr_assert_eq(gemv->can_implement(&t, &c, m, why, sizeof why), 0);
            cr_assert(strstr(why, "N, K and the row's bytes must be below 2^31"), "%s: %s",
                      archs[i], why);
            c = cfg(KILN_FMT_BF16, 64, (int64_t)INT_MAX + 1);
            cr_assert_eq(gemv->can_implement(&t, &c, m, why, sizeof why), 0);
            cr_assert(strstr(why, "N, K and the row's bytes must be below 2^31"), "%s: %s",
                      archs[i], why);
        }
    }
    /* K fits an int, its f32 row's bytes do not; an FP8 row's do */
    kiln_target t = target("sm_80");
    kiln_linear_cfg c = cfg(KILN_FMT_F32, 64, 600000000);
    cr_assert_eq(gemv->can_implement(&t, &c, 1, why, sizeof why), 0);
    cr_assert(strstr(why, "row's bytes"), "%s", why);
    c.format = KILN_FMT_FP8_TENSOR;
    cr_assert_eq(gemv->can_implement(&t, &c, 1, why, sizeof why), 1, "%s", why);
}

/* m = 16 keeps a 16-row f32 copy of a whole 32-value stage per lane:
 * more than sm_75, sm_89 and a part of unknown limit (48 KiB) give a
 * block for 4-bit formats; simt takes those where gemv_tc does not.
 * sm_90a holds it, and a short K needs only its own values of x. */
Test(gemv, refuses_what_shared_memory_cannot_hold)
{
    kiln_linear_cfg c = cfg(KILN_FMT_NVFP4, 4096, 4096);
    char why[256];
    kiln_target t = target("sm_75");
    cr_assert_eq(gemv->can_implement(&t, &c, 16, why, sizeof why), 0);
    cr_assert(strstr(why, "m16 at nvfp4: needs"), "%s", why);
    cr_assert(strstr(why, "bytes of shared memory per block, sm_75 allows 65536"), "%s", why);
    cr_assert_eq(gemv->can_implement(&t, &c, 1, why, sizeof why), 1, "%s", why);
    t = target("sm_89");
    for (c.k = 4096; c.k <= 4128; c.k += 32) {
        cr_assert_eq(gemv->can_implement(&t, &c, 16, why, sizeof why), 0);
        cr_assert(strstr(why, "m16 at nvfp4: needs"), "%s", why);
        cr_assert(strstr(why, "sm_89 allows 101376"), "%s", why);
    }
    t = target("sm_90a");
    c.k = 4128;
    cr_assert_eq(gemv->can_implement(&t, &c, 16, why, sizeof why), 1, "%s", why);
    c.k = 544;
    t = target("sm_89");
    cr_assert_eq(gemv->can_implement(&t, &c, 16, why, sizeof why), 1, "%s", why);
    /* A live device of an architecture past the table, limit unknown. */
    kiln_target future = { .name = "sm_120", .sm = 120 };
    c.k = 4128;
    cr_assert_eq(gemv->can_implement(&future, &c, 16, why, sizeof why), 0);
    cr_assert(strstr(why, "sm_120 allows 49152"), "%s", why);
}

/* ------------------------------------------------------ source, launches */

/* The golden source of q4_k 4096 x 14336 at m = 1 on sm_90a. Its numbers,
 * worked by hand: two 18-byte units a lane, so a stage is 2048 values
 * (1152 bytes); 4096 rows need no k-split; the x tile is the most whole
 * stages in 24 KiB at 4.5 bytes a value plus Q4_K's run sums (4096);
 * shared memory = 4096·4.5 (x) + 512·4 (run sums) + 8 warps · 3 slots ·
 * 1152 = 48128. */
Test(gemv, emit_instantiates_the_template)
{
    static const char golden[] =
        "// kiln kernel, generated from its signature: the logic is in the included template.\n"
        "// signature: linear backend=gemv variant=m1 format=q4_k scales=inline act=bf16 "
        "n=4096 k=14336 epilogue=bias+residual out=bf16 target=sm_90a\n"
        "// templates: %s\n"
        "// cache key: " KILN_EMIT_KEY_PLACEHOLDER "\n"
        "#include \"kiln/gemv.cuh\"\n"
        "\n"
        "using format = kiln::gemv_q4_k;\n"
        "using shape = kiln::gemv_shape</*max_m*/ 1, /*rows*/ 1, /*warps*/ 8, /*k_split*/ 1,\n"
        "                               /*units*/ 2, /*stages*/ 3, /*tile_k*/ 4096,\n"
        "                               /*min_blocks*/ 4>;\n"
        "using epilogue = kiln::epilogue</*bias*/ true, /*residual*/ true, /*silu_mul*/ "
        "false>;\n"
        "\n"
        "extern \"C\" __global__ void __launch_bounds__(shape::threads, shape::min_blocks)\n"
        "%s(const kiln_linear_args args)\n"
        "{\n"
        "    kiln::gemv<format, shape, epilogue, /*n*/ 4096, /*k*/ 14336, /*smem*/ 48128>(args);\n"
        "}\n";
    const char *sig = "linear backend=gemv variant=m1 format=q4_k scales=inline act=bf16 n=4096 "
                      "k=14336 epilogue=bias+residual out=bf16 target=sm_90a";
    kiln_kernel_source s;
    cr_assert_eq(kiln_emit_text(kiln_registry_default(), sig, &s), KILN_OK, "%s",
                 kiln_last_error());
    char want[4096];
    snprintf(want, sizeof want, golden, kiln_emit_templates_digest(), s.desc.entry);
    cr_assert_str_eq(s.text, want);
    cr_assert_eq(strncmp(s.desc.entry, "kiln_gemv_", 10), 0, "%s", s.desc.entry);
    kiln_kernel_launch l[KILN_MAX_LAUNCHES];
    int n;
    cr_assert_eq(kiln_kernel_launches(&s.desc, 1, l, &n), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(n, 1);
    cr_assert_eq(l[0].cfg.grid[0], 4096 / 8);
    cr_assert_eq(l[0].cfg.block[0], 256);
    cr_assert_eq(l[0].cfg.smem, 48128);
    kiln_kernel_source_free(&s);
}

Test(gemv, emit_refuses_what_it_does_not_build)
{
    kiln_target t = target("sm_90a");
    kiln_linear_kernel k = { .cfg = cfg(KILN_FMT_Q8_0, 4096, 4096), .act = KILN_ACT_BF16 };
    char buf[4096];
    kiln_launch l;
    static const char *const others[] = { "t16x64", "tc8" }; /* simt's, gemv_tc's */
    for (size_t i = 0; i < KILN_ARRAY_LEN(others); i++) {
        snprintf(k.variant, sizeof k.variant, "%s", others[i]);
        char want[96];
        snprintf(want, sizeof want, "gemv: no variant \"%s\" (m1, m2, m4, m8, m16)", others[i]);
        cr_assert_eq(gemv->emit(&t, &k, "kiln_gemv_0", buf, sizeof buf), KILN_ERR_UNSUPPORTED);
        cr_assert(strstr(kiln_last_error(), want), "%s", kiln_last_error());
        cr_assert_eq(gemv->launch(&t, &k, 1, &l), KILN_ERR_UNSUPPORTED);
    }
    snprintf(k.variant, sizeof k.variant, "m4");
    k.act = KILN_ACT_FP8_TOKEN;
    cr_assert_eq(gemv->emit(&t, &k, "kiln_gemv_0", buf, sizeof buf), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "bf16, not fp8-token"), "%s", kiln_last_error());
    k.act = KILN_ACT_BF16;
    k.cfg.epilogue = KILN_EPI_RESIDUAL | KILN_EPI_SILU_MUL;
    cr_assert_eq(gemv->emit(&t, &k, "kiln_gemv_0", buf, sizeof buf), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "one aux input"), "%s", kiln_last_error());
    k.cfg.epilogue = KILN_EPI_BIAS;
    k.cfg.format = KILN_FMT_COUNT;
    cr_assert_eq(gemv->emit(&t, &k, "kiln_gemv_0", buf, sizeof buf), KILN_ERR_UNSUPPORTED);
    k.cfg = cfg(KILN_FMT_BF16, 4096, 4100);
    cr_assert_eq(gemv->emit(&t, &k, "kiln_gemv_0", buf, sizeof buf), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "gemv: K=4100"), "%s", kiln_last_error());
    k.cfg = cfg(KILN_FMT_Q8_0, 4096, 4096);
    cr_assert_eq(gemv->emit(&t, &k, "kiln_gemv_0", buf, 64), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "the buffer has 64"), "%s", kiln_last_error());
    cr_assert_eq(gemv->emit(&t, &k, "kiln_gemv_0", buf, sizeof buf), KILN_OK, "%s",
                 kiln_last_error());
}

/* The integer groups: a 16-byte unit, scales (and zero points) along K a
 * group of whole units dividing the stage, or one scale a row (group 0
 * or K), which the zero-point formats do not take. */
Test(gemv, takes_integer_groups)
{
    kiln_target t = target("h200");
    char why[256] = "", buf[4096];
    static const int64_t fine[] = { 0, 32, 128, 512, 4096 };
    for (int f = KILN_FMT_INT4_GROUP; f <= KILN_FMT_INT8_GROUP_ZP; f++)
        for (size_t i = 0; i < KILN_ARRAY_LEN(fine); i++)
            for (int64_t m = 1; m <= 16; m *= 2) {
                kiln_linear_cfg c = cfg((kiln_format)f, 1000, 4096);
                c.group = fine[i];
                const int per_row = c.group == 0 || c.group == c.k;
                const int zp = kiln_format_get((kiln_format)f)->zero_point;
                cr_assert_eq(gemv->can_implement(&t, &c, m, why, sizeof why), !(zp && per_row),
                             "%s group %lld m=%lld: %s", kiln_format_get((kiln_format)f)->name,
                             (long long)c.group, (long long)m, why);
                if (zp && per_row)
                    cr_assert(strstr(why, "zero points stream along K only"), "%s", why);
            }
    kiln_linear_cfg c = cfg(KILN_FMT_INT4_GROUP, 1000, 4096);
    c.group = 16; /* half a unit */
    cr_assert_eq(gemv->can_implement(&t, &c, 1, why, sizeof why), 0);
    cr_assert(strstr(why, "int4_group group 16 is not a multiple of 32 dividing K = 4096"), "%s",
              why);
    c = cfg(KILN_FMT_INT4_GROUP, 1000, 3 * 4096);
    c.group = 96; /* whole units dividing K, but no stage */
    cr_assert_eq(gemv->can_implement(&t, &c, 1, why, sizeof why), 0);
    cr_assert(strstr(why, "int4_group group 96 does not divide"), "%s", why);
    kiln_linear_kernel k = { .cfg = cfg(KILN_FMT_INT8_GROUP_ZP, 1000, 4096), .act = KILN_ACT_BF16,
                             .variant = "m4" };
    k.cfg.group = 128;
    cr_assert_eq(gemv->emit(&t, &k, "kiln_gemv_0", buf, sizeof buf), KILN_OK, "%s",
                 kiln_last_error());
    cr_assert(strstr(buf, "kiln::gemv_int8_group_zp</*group*/ 128, /*n*/ 1000>"), "%s", buf);
    k.cfg.format = KILN_FMT_INT8_GROUP;
    k.cfg.group = 4096; /* one group a row: the row scale */
    cr_assert_eq(gemv->emit(&t, &k, "kiln_gemv_0", buf, sizeof buf), KILN_OK, "%s",
                 kiln_last_error());
    cr_assert(strstr(buf, "kiln::gemv_int8_group</*group*/ 0, /*n*/ 1000>"), "%s", buf);
}

/* They compile in every M class, per row and in groups along K. */
Test(gemv_nvrtc, integer_groups_compile_for_sm_80, .timeout = 600)
{
    static const char *const variants[] = { "m1", "m2", "m4", "m8", "m16" };
    static const char *const scales[] = { "f32:1xK", "f32:1x128" };
    kt_batch b = { 0 };
    char sig[512];
    for (int f = KILN_FMT_INT4_GROUP; f <= KILN_FMT_INT8_GROUP_ZP; f++)
        for (size_t g = 0; g < KILN_ARRAY_LEN(scales); g++)
            for (size_t v = 0; v < KILN_ARRAY_LEN(variants); v++) {
                const int zp = kiln_format_get((kiln_format)f)->zero_point;
                if (zp && g == 0) /* zero points along K only */
                    continue;
                snprintf(sig, sizeof sig,
                         "linear backend=gemv variant=%s format=%s scales=%s%s act=bf16 "
                         "n=1001 k=2048 epilogue=%s out=bf16 target=sm_80",
                         variants[v], kiln_format_get((kiln_format)f)->name, scales[g],
                         zp ? "+zp" : "", v % 2 ? "bias" : "none");
                kt_batch_add(&b, sig);
            }
    kt_batch_compile(&b, "gemv integer groups");
}

Test(gemv, launch_serves_its_m_class_only)
{
    kiln_target t = target("sm_75");
    kiln_linear_kernel k = { .cfg = cfg(KILN_FMT_MXFP4, 2048, 4096), .act = KILN_ACT_BF16 };
    snprintf(k.variant, sizeof k.variant, "m4");
    kiln_launch l;
    for (int64_t m = 1; m <= 4; m++)
        cr_assert_eq(gemv->launch(&t, &k, m, &l), KILN_OK, "m=%lld", (long long)m);
    cr_assert_eq(gemv->launch(&t, &k, 5, &l), KILN_ERR_SHAPE);
    cr_assert(strstr(kiln_last_error(), "gemv m4: cannot launch for M = 5 (1 to 4)"), "%s",
              kiln_last_error());
    cr_assert_eq(gemv->launch(&t, &k, 0, &l), KILN_ERR_SHAPE);
}

/* The kernel reads x from its first instruction: its launches never let
 * it start before the kernel before it has finished, on sm_90 either. */
Test(gemv, launches_never_overlap)
{
    static const char *const arches[] = { "h200", "sm_90a", "a100", "t4" };
    for (size_t a = 0; a < KILN_ARRAY_LEN(arches); a++) {
        kiln_target t = target(arches[a]);
        kiln_linear_kernel k = { .cfg = cfg(KILN_FMT_Q4_K, 28672, 4096), .act = KILN_ACT_BF16 };
        snprintf(k.variant, sizeof k.variant, "m4");
        kiln_launch l;
        cr_assert_eq(gemv->launch(&t, &k, 1, &l), KILN_OK, "%s: %s", arches[a],
                     kiln_last_error());
        cr_assert_eq(l.overlap, 0, "%s", arches[a]);
        cr_assert_eq(l.static_smem, 0, "%s", arches[a]);
    }
}

/* Every shape's launch covers its rows exactly once per block row group,
 * with the block and shared memory the source was built for. */
Test(gemv, launches_cover_every_row)
{
    static const int64_t shapes[][2] = {
        { 28672, 4096 }, { 4096, 14336 }, { 8192, 28672 }, { 6144, 4096 },
        { 200, 13568 },  { 1000, 512 },   { 7, 256 },      { 4097, 768 },
    };
    static const char *const variants[] = { "m1", "m2", "m4", "m8", "m16" };
    static const char *const arches[] = { "sm_75", "sm_80", "sm_89", "sm_90a" };
    for (size_t a = 0; a < KILN_ARRAY_LEN(arches); a++)
        for (size_t s = 0; s < KILN_ARRAY_LEN(shapes); s++)
            for (int f = 0; f < GEMV_FORMATS_END; f++)
                for (size_t v = 0; v < KILN_ARRAY_LEN(variants); v++) {
                    kiln_target t = target(arches[a]);
                    kiln_linear_cfg c = cfg((kiln_format)f, shapes[s][0], shapes[s][1]);
                    char why[256];
                    int64_t bucket = 1ll << v;
                    if (!gemv->can_implement(&t, &c, bucket, why, sizeof why)) {
                        cr_assert(strstr(why, "shared memory"), "%s", why);
                        continue;
                    }
                    char sig[512];
                    gemv_sig(sig, sizeof sig, variants[v], (kiln_format)f, 0, c.n, c.k,
                             arches[a]);
                    kiln_kernel_source src;
                    cr_assert_eq(kiln_emit_text(kiln_registry_default(), sig, &src), KILN_OK,
                                 "%s: %s", sig, kiln_last_error());
                    const long long rows = kt_source_param(src.text, "rows"),
                                    warps = kt_source_param(src.text, "warps"),
                                    split = kt_source_param(src.text, "k_split"),
                                    tile_k = kt_source_param(src.text, "tile_k");
                    const long long block_rows = warps / split * rows;
                    kiln_launch l;
                    cr_assert_eq(gemv->launch(&t, &src.desc.linear, bucket, &l), KILN_OK);
                    cr_assert_geq((long long)l.grid[0] * block_rows, shapes[s][0], "%s", sig);
                    cr_assert_lt((long long)(l.grid[0] - 1) * block_rows, shapes[s][0], "%s",
                                 sig);
                    cr_assert_eq(l.grid[1] * l.grid[2], 1);
                    cr_assert_eq(l.block[0], 32 * warps);
                    cr_assert_eq(l.smem, kt_source_param(src.text, "smem"), "%s", sig);
                    cr_assert_leq(l.smem, (unsigned)t.smem_optin, "%s", sig);
                    cr_assert_eq(tile_k % 32, 0, "%s", sig);
                    cr_assert_eq(warps % split, 0, "%s", sig);
                    kiln_kernel_source_free(&src);
                }
}

/* The decode shapes of an 8B model on an H200 at m = 1, for the formats
 * whose single token runs the f32 kernel: one row per warp with no
 * k-split (enough warps already), and shared memory low enough for four
 * blocks of eight warps on each SM (228 KiB, 1 KiB of it reserved per
 * block). A short N splits K instead. */
Test(gemv, decode_shapes_fill_an_h200)
{
    static const int64_t shapes[][2] = { { 28672, 4096 }, { 4096, 14336 }, { 8192, 28672 } };
    static const kiln_format fs[] = { KILN_FMT_F32 };
    kiln_target t = target("h200");
    for (size_t s = 0; s < KILN_ARRAY_LEN(shapes); s++)
        for (size_t f = 0; f < KILN_ARRAY_LEN(fs); f++) {
            char v[64];
            cr_assert_str_eq(variant_of("h200", fs[f], shapes[s][1], 1, v, sizeof v), "m1");
            char sig[512];
            gemv_sig(sig, sizeof sig, "m1", fs[f], 0, shapes[s][0], shapes[s][1], "h200");
            kiln_kernel_source src;
            cr_assert_eq(kiln_emit_text(kiln_registry_default(), sig, &src), KILN_OK, "%s",
                         kiln_last_error());
            kiln_launch l;
            cr_assert_eq(gemv->launch(&t, &src.desc.linear, 1, &l), KILN_OK);
            cr_assert_eq(kt_source_param(src.text, "k_split"), 1, "%s", sig);
            cr_assert_eq(l.grid[0], shapes[s][0] / 8, "%s", sig);
            cr_assert_leq(4 * (l.smem + 1024), 228 * 1024, "%s: %u bytes", sig, l.smem);
            kiln_kernel_source_free(&src);
        }
    char sig[512];
    char v[64];
    cr_assert_str_eq(variant_of("h200", KILN_FMT_F32, 8192, 1, v, sizeof v), "m1");
    gemv_sig(sig, sizeof sig, "m1", KILN_FMT_F32, 0, 1024, 8192, "h200");
    kiln_kernel_source src;
    cr_assert_eq(kiln_emit_text(kiln_registry_default(), sig, &src), KILN_OK, "%s",
                 kiln_last_error());
    cr_assert_eq(kt_source_param(src.text, "k_split"), 2, "%s", src.text);
    kiln_launch l;
    cr_assert_eq(gemv->launch(&t, &src.desc.linear, 1, &l), KILN_OK);
    cr_assert_eq(l.grid[0], 1024 / 4);
    kiln_kernel_source_free(&src);
}

/* ------------------------------------------------------- weight layout */

/* The kernel reads kiln's storage layout: no layout hook, nothing packed. */
Test(gemv, keeps_the_storage_layout)
{
    cr_assert_null(gemv->layout);
}

/* ---------------------------------------------------------------- NVRTC */

/* Every format in every M class, two shapes taking turns: 200 x 13568
 * splits K across warps, walks two x tiles and ends on a partial stage;
 * 4100 x 4096 is one tile with a partial block of rows. On sm_80+ K grows
 * by 32 (13600, 4128) where the format allows, as plans give this kernel
 * there; formats of 256-value blocks keep it. The epilogue rotates through
 * all five fusions. A class the target's shared memory cannot hold is
 * refused, never at m = 1. */
static void compile_every_class(const char *arch)
{
    static const unsigned epilogues[] = {
        0, KILN_EPI_BIAS, KILN_EPI_BIAS | KILN_EPI_RESIDUAL, KILN_EPI_SILU_MUL,
        KILN_EPI_BIAS | KILN_EPI_SILU_MUL,
    };
    static const char *const variants[] = { "m1", "m2", "m4", "m8", "m16" };
    static const int64_t shapes[][2] = { { 200, 13568 }, { 4100, 4096 } };
    kiln_target t = target(arch);
    kt_batch b = { 0 };
    for (int f = 0; f < GEMV_FORMATS_END; f++)
        for (int v = 0; v < (int)KILN_ARRAY_LEN(variants); v++) {
            const int64_t *shape = shapes[(f + v) % 2];
            kiln_linear_cfg c =
                cfg((kiln_format)f, shape[0], plan_k(&t, (kiln_format)f, shape[1]));
            char why[256], sig[512];
            if (!gemv->can_implement(&t, &c, 1ll << v, why, sizeof why)) {
                cr_assert_neq(v, 0, "%s: %s", arch, why);
                cr_assert(strstr(why, "shared memory"), "%s", why);
                continue;
            }
            kt_batch_add(&b, gemv_sig(sig, sizeof sig, variants[v], (kiln_format)f,
                                   epilogues[(f + v) % 5], c.n, c.k, arch));
        }
    char what[64];
    snprintf(what, sizeof what, "%s gemv", arch);
    kt_batch_compile(&b, what);
}

Test(gemv_nvrtc, every_format_and_class_compiles_for_sm_75, .timeout = 600)
{
    compile_every_class("sm_75");
}

Test(gemv_nvrtc, every_format_and_class_compiles_for_sm_80, .timeout = 600)
{
    compile_every_class("sm_80");
}

Test(gemv_nvrtc, every_format_and_class_compiles_for_sm_89, .timeout = 600)
{
    compile_every_class("sm_89");
}

Test(gemv_nvrtc, every_format_and_class_compiles_for_sm_90a, .timeout = 600)
{
    compile_every_class("sm_90a");
}

/* Every epilogue with each decoding family: plain, FP8 with a row scale,
 * E2M1 with block scales, Q4_K's offset, Q6_K's unaligned blocks, Q4_1's
 * offset on unaligned blocks, IQ4_XS's codebook. */
Test(gemv_nvrtc, every_epilogue_compiles, .timeout = 600)
{
    static const unsigned epilogues[] = {
        0, KILN_EPI_BIAS, KILN_EPI_RESIDUAL, KILN_EPI_BIAS | KILN_EPI_RESIDUAL, KILN_EPI_SILU_MUL,
        KILN_EPI_BIAS | KILN_EPI_SILU_MUL,
    };
    static const kiln_format fs[] = { KILN_FMT_BF16, KILN_FMT_FP8_CHANNEL, KILN_FMT_NVFP4,
                                      KILN_FMT_Q4_K, KILN_FMT_Q6_K, KILN_FMT_Q4_1,
                                      KILN_FMT_IQ4_XS };
    kt_batch b = { 0 };
    char sig[512];
    for (size_t f = 0; f < KILN_ARRAY_LEN(fs); f++)
        for (size_t e = 0; e < KILN_ARRAY_LEN(epilogues); e++)
            kt_batch_add(&b, gemv_sig(sig, sizeof sig, e % 2 ? "m4" : "m1", fs[f], epilogues[e], 1000,
                                   2048, "sm_90a"));
    kt_batch_compile(&b, "gemv epilogues");
}
