/* The gemv_tc backend (kernels/gemv/tc.c): capability checks and their
 * reasons, the M class per bucket, block shapes and shared memory worked
 * by hand, launch shapes, the emitted source, the packed weight layout,
 * its place before gemv in the default registry's lists and plans, and
 * every (format x M class x epilogue) instantiation of kernels/gemv/tc.cuh
 * compiled by NVRTC for each architecture family from sm_80 on. Needs
 * libnvrtc but no GPU: the GPU suites (tests/gpu/test_backends.c,
 * test_session.c) check the results against the CPU. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/emit.h"
#include "codegen/select.h"
#include "codegen/nvrtc.h"
#include "codegen/plan.h"
#include "kernels/gemv/pack.h"
#include "codegen_util.h"
#include "testutil.h"

static const kiln_backend *const tc = &kiln_backend_gemv_tc;

/* The formats up to GGML MXFP4, which gemv_tc and gemv have kernels for;
 * the GGML formats after it go to wgmma or simt (decode_later_ggml_formats). */
#define TC_FORMATS_END (KILN_FMT_GGML_MXFP4 + 1)

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

/* What the default registry runs an [n, k] linear of format f in bucket m
 * on t: "backend variant". */
static const char *choice_on(const kiln_target *t, kiln_format f, int64_t n, int64_t k,
                             int64_t m, char *buf, size_t size)
{
    kiln_linear_cfg c = cfg(f, n, k);
    kiln_choice ch;
    cr_assert_eq(kiln_backend_select(kiln_registry_default(), t, &c, m, NULL, "y", &ch), KILN_OK,
                 "%s", kiln_last_error());
    char v[KILN_SIG_MAX];
    kiln_backend_variant(ch.backend, t, &c, m, v, sizeof v);
    snprintf(buf, size, "%s %.32s", ch.backend->name, v);
    return buf;
}

/* choice_on a named target, for a linear of 4096 rows. */
static const char *choice_of(const char *arch, kiln_format f, int64_t k, int64_t m, char *buf,
                             size_t size)
{
    kiln_target t = target(arch);
    return choice_on(&t, f, 4096, k, m, buf, size);
}

/* The gemv_tc signature of one linear. */
static char *tc_sig(char *buf, size_t size, const char *variant, kiln_format f, unsigned epi,
                    int64_t n, int64_t k, const char *arch)
{
    return kt_linear_sig(buf, size, "gemv_tc", variant, f, "bf16", n, k, epi, arch);
}

/* --------------------------------------------------------- capabilities */

Test(gemv_tc, runs_on_sm_80_and_newer)
{
    char why[128] = "";
    for (const char *const *n = kiln_target_names(); *n; n++) {
        kiln_target t = target(*n);
        cr_assert_eq(tc->is_supported(&t, why, sizeof why), t.sm >= 80, "%s", *n);
    }
    kiln_target t4 = target("t4");
    cr_assert_eq(tc->is_supported(&t4, why, sizeof why), 0);
    cr_assert_str_eq(why, "needs sm_80 or newer (bf16 mma.sync), target is sm_75");
    /* A live device past the table is sm_80+ too. */
    kiln_target future = { .name = "sm_120", .sm = 120 };
    cr_assert_eq(tc->is_supported(&future, why, sizeof why), 1);
}

/* Every format but F32, whose values are not exact in BF16, every
 * epilogue (the gate one included), BF16 activations, in every bucket up
 * to 16 tokens. */
Test(gemv_tc, covers_every_format_exact_in_bf16)
{
    cr_assert_eq(tc->formats, ((1u << TC_FORMATS_END) - 1) & ~(1u << KILN_FMT_F32));
    cr_assert_eq(tc->epilogues,
                 KILN_EPI_BIAS | KILN_EPI_RESIDUAL | KILN_EPI_SILU_MUL | KILN_EPI_GATE);
    kiln_target t = target("h200");
    char why[256] = "";
    for (int f = 0; f < TC_FORMATS_END; f++) {
        kiln_linear_cfg c = cfg((kiln_format)f, 4096, 4096);
        for (int64_t m = 1; m <= 16; m++) {
            cr_assert_eq(tc->can_implement(&t, &c, m, why, sizeof why),
                         f != KILN_FMT_F32 && !kiln_format_get((kiln_format)f)->grouped,
                         "%s m=%lld: %s", kiln_format_get((kiln_format)f)->name, (long long)m,
                         why);
            cr_assert_eq(kiln_backend_act(tc, &t, &c, m), KILN_ACT_BF16);
        }
    }
    kiln_linear_cfg c = cfg(KILN_FMT_F32, 4096, 4096);
    cr_assert_eq(tc->can_implement(&t, &c, 1, why, sizeof why), 0);
    cr_assert_str_eq(why, "f32 values are not exact in bf16");
}

Test(gemv_tc, refuses_buckets_past_16)
{
    kiln_target t = target("h200");
    kiln_linear_cfg c = cfg(KILN_FMT_NVFP4, 4096, 4096);
    char why[256];
    cr_assert_eq(tc->can_implement(&t, &c, 17, why, sizeof why), 0);
    cr_assert_str_eq(why, "M bucket 17 > 16");
    cr_assert_eq(tc->can_implement(&t, &c, 32, why, sizeof why), 0);
    cr_assert_str_eq(why, "M bucket 32 > 16");
}

/* K in whole atoms of 64, whatever the format's own block. */
Test(gemv_tc, refuses_k_of_part_atoms)
{
    static const struct {
        kiln_format f;
        int64_t k;
    } cases[] = {
        { KILN_FMT_BF16, 4096 + 8 }, { KILN_FMT_F16, 4104 },  { KILN_FMT_FP8_BLOCK, 1008 },
        { KILN_FMT_NVFP4, 96 },      { KILN_FMT_Q8_0, 4128 }, { KILN_FMT_GGML_MXFP4, 32 * 7 },
    };
    kiln_target t = target("sm_90a");
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        kiln_linear_cfg c = cfg(cases[i].f, 512, cases[i].k);
        char why[256] = "", want[128];
        cr_assert_eq(tc->can_implement(&t, &c, 1, why, sizeof why), 0, "case %zu", i);
        snprintf(want, sizeof want, "K=%lld is not a multiple of 64, the packed layout's atoms",
                 (long long)cases[i].k);
        cr_assert_str_eq(why, want);
    }
}

/* tc1, tc2, tc4, tc8 and tc16 by the power of two at or above m, whatever
 * the linear and target. */
Test(gemv_tc, variants_follow_the_bucket)
{
    static const char *const want[] = { NULL,   "tc1",  "tc2",  "tc4",  "tc4",  "tc8",
                                        "tc8",  "tc8",  "tc8",  "tc16", "tc16", "tc16",
                                        "tc16", "tc16", "tc16", "tc16", "tc16" };
    static const char *const arches[] = { "sm_80", "sm_89", "h200" };
    for (size_t a = 0; a < KILN_ARRAY_LEN(arches); a++)
        for (int f = KILN_FMT_F16; f < TC_FORMATS_END; f++)
            for (int64_t m = 1; m <= 16; m++) {
                kiln_target t = target(arches[a]);
                kiln_linear_cfg c = cfg((kiln_format)f, 4096, 256);
                char v[64];
                kiln_backend_variant(tc, &t, &c, m, v, sizeof v);
                cr_assert_str_eq(v, want[m], "%s m=%lld", arches[a], (long long)m);
            }
}

/* ------------------------------------------------------------ selection */

/* Asserts that the default registry runs f [4096, k] in bucket m on arch
 * on gemv's class want, or where gemv's shared memory cannot hold that
 * class, on neither decode backend. */
static void f32_ladder(const char *arch, kiln_format f, int64_t k, int64_t m, const char *want)
{
    char got[64], why[256];
    kiln_target t = target(arch);
    kiln_linear_cfg c = cfg(f, 4096, k);
    choice_on(&t, f, 4096, k, m, got, sizeof got);
    if (kiln_backend_gemv.can_implement(&t, &c, m, why, sizeof why)) {
        cr_assert_str_eq(got, want, "%s %s K=%lld m=%lld", arch, kiln_format_get(f)->name,
                         (long long)k, (long long)m);
    } else {
        cr_assert(strstr(why, "shared memory"), "%s", why);
        cr_assert(strncmp(got, "gemv", 4), "%s %s K=%lld m=%lld: %s", arch,
                  kiln_format_get(f)->name, (long long)k, (long long)m, got);
    }
}

/* Where gemv_tc serves a linear (sm_80+, a format exact in BF16, K in
 * whole atoms of 64) it runs every decode bucket, tc1 to tc16; anything
 * else runs the f32 ladder of gemv, next in the list. */
Test(gemv_tc, selection_puts_gemv_tc_before_gemv)
{
    static const char *const ladder[] = { NULL, "m1", "m2", "m4", "m4", "m8", "m8", "m8", "m8",
                                          "m16", "m16", "m16", "m16", "m16", "m16", "m16", "m16" };
    static const char *const classes[] = { NULL,   "tc1",  "tc2",  "tc4",  "tc4",  "tc8",
                                           "tc8",  "tc8",  "tc8",  "tc16", "tc16", "tc16",
                                           "tc16", "tc16", "tc16", "tc16", "tc16" };
    static const char *const tc_arches[] = { "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a",
                                             "a100", "l40s", "h200" };
    for (size_t a = 0; a < KILN_ARRAY_LEN(tc_arches); a++)
        for (int f = 0; f < TC_FORMATS_END; f++)
            for (int64_t m = 1; m <= 16; m++) {
                const kiln_format fmt = (kiln_format)f;
                const char *name = kiln_format_get(fmt)->name;
                char got[64], f32[64], want[64];
                snprintf(f32, sizeof f32, "gemv %s", ladder[m]);
                snprintf(want, sizeof want, "gemv_tc %s", classes[m]);
                const char *expect = fmt == KILN_FMT_F32 ? f32 : want;
                cr_assert_str_eq(choice_of(tc_arches[a], fmt, 4096, m, got, sizeof got), expect,
                                 "%s %s m=%lld", tc_arches[a], name, (long long)m);
                /* The smallest K the tensor-core kernel takes. */
                cr_assert_str_eq(choice_of(tc_arches[a], fmt, 256, m, got, sizeof got), expect,
                                 "%s %s K=256 m=%lld", tc_arches[a], name, (long long)m);
                /* sm_75, and a K not in whole atoms of 64, keep the f32 ladder. */
                f32_ladder("sm_75", fmt, 4096, m, f32);
                if ((4096 + 32) % kiln_format_get(fmt)->k_multiple == 0)
                    f32_ladder(tc_arches[a], fmt, 4096 + 32, m, f32);
            }
    /* A live device past the table is sm_80+ too. */
    kiln_target future = { .name = "sm_120", .sm = 120 };
    char got[64];
    cr_assert_str_eq(choice_on(&future, KILN_FMT_Q6_K, 4096, 4096, 1, got, sizeof got),
                     "gemv_tc tc1");
    cr_assert_str_eq(choice_on(&future, KILN_FMT_Q6_K, 4096, 4096, 16, got, sizeof got),
                     "gemv_tc tc16");
}

/* The single token, format by format: every format exact in BF16 runs tc1
 * at m = 1 on sm_80+, F32 gemv's m1; two tokens run tc2 on all but F32.
 * sm_75 has no mma: m1 for all. */
Test(gemv_tc, one_token_runs_tc1)
{
    static const char *const arches[] = { "sm_80", "sm_86", "sm_89", "sm_90a", "h200" };
    for (size_t a = 0; a < KILN_ARRAY_LEN(arches); a++)
        for (int f = 0; f < TC_FORMATS_END; f++) {
            const kiln_format fmt = (kiln_format)f;
            const char *name = kiln_format_get(fmt)->name;
            const int plain = fmt == KILN_FMT_F32;
            char got[64];
            cr_assert_str_eq(choice_of(arches[a], fmt, 4096, 1, got, sizeof got),
                             plain ? "gemv m1" : "gemv_tc tc1", "%s %s m=1", arches[a], name);
            cr_assert_str_eq(choice_of(arches[a], fmt, 4096, 2, got, sizeof got),
                             plain ? "gemv m2" : "gemv_tc tc2", "%s %s m=2", arches[a], name);
            cr_assert_str_eq(choice_of("sm_75", fmt, 4096, 1, got, sizeof got), "gemv m1",
                             "sm_75 %s", name);
        }
}

/* A bucket past 16 tokens refuses both decode backends, with their
 * reasons; a K gemv_tc refuses falls to gemv with gemv_tc's reason, and
 * one gemv refuses too falls further. F32's list does not name gemv_tc. */
Test(gemv_tc, refusals_fall_to_the_next_backend)
{
    const kiln_registry *r = kiln_registry_default();
    cr_assert_eq(kiln_registry_find(r, "gemv_tc"), tc);
    kiln_target t = target("a100");
    for (int f = 0; f < TC_FORMATS_END; f++) {
        kiln_linear_cfg c = cfg((kiln_format)f, 4096, 4096);
        kiln_choice ch;
        cr_assert_eq(kiln_backend_select(r, &t, &c, 1, NULL, "y", &ch), KILN_OK);
        cr_assert_eq(ch.backend, f == KILN_FMT_F32 ? &kiln_backend_gemv : tc, "%s",
                     kiln_format_get((kiln_format)f)->name);
        cr_assert_str_eq(ch.refused, "");
        cr_assert_eq(kiln_backend_select(r, &t, &c, 32, NULL, "y", &ch), KILN_OK);
        cr_assert_str_eq(ch.backend->name, "simt");
        cr_assert(strstr(ch.refused, "gemv: M bucket 32 > 16"), "%s", ch.refused);
        cr_assert_eq(strstr(ch.refused, "gemv_tc: M bucket 32 > 16") != NULL, f != KILN_FMT_F32,
                     "%s", ch.refused);
    }
    kiln_linear_cfg c = cfg(KILN_FMT_BF16, 4096, 4096 + 8);
    kiln_choice ch;
    cr_assert_eq(kiln_backend_select(r, &t, &c, 1, NULL, "y", &ch), KILN_OK);
    cr_assert_str_eq(ch.backend->name, "gemv");
    cr_assert_str_eq(ch.refused, "gemv_tc: K=4104 is not a multiple of 64, the packed layout's "
                                 "atoms");
    c.k = 4100;
    cr_assert_eq(kiln_backend_select(r, &t, &c, 1, NULL, "y", &ch), KILN_OK);
    cr_assert_str_eq(ch.backend->name, "simt");
    cr_assert(strstr(ch.refused, "gemv_tc: K=4100 is not a multiple of 64"), "%s", ch.refused);
    cr_assert(strstr(ch.refused, "gemv: K=4100 is not a multiple of 8"), "%s", ch.refused);
    t = target("sm_75");
    c.k = 4096;
    cr_assert_eq(kiln_backend_select(r, &t, &c, 1, NULL, "y", &ch), KILN_OK);
    cr_assert_str_eq(ch.backend->name, "gemv");
    cr_assert_str_eq(ch.refused, "gemv_tc: needs sm_80 or newer (bf16 mma.sync), target is "
                                 "sm_75");
}

/* The GGML formats after GGML MXFP4 have no packed layout: gemv decodes
 * them from the storage layout on every target, and past 16 tokens the
 * dequantizing wgmma (Hopper) or simt takes them; a forced gemv_tc falls
 * back to gemv, saying why. */
Test(gemv_tc, decode_later_ggml_formats)
{
    const kiln_registry *r = kiln_registry_default();
    for (int f = TC_FORMATS_END; f < KILN_FMT_COUNT; f++) {
        if (kiln_format_get((kiln_format)f)->grouped) /* the integer groups: test_gemv.c */
            continue;
        const char *name = kiln_format_get((kiln_format)f)->name;
        kiln_linear_cfg c = cfg((kiln_format)f, 4096, 4096);
        char no_kernel[64];
        snprintf(no_kernel, sizeof no_kernel, "no kernel for %s", name);
        cr_assert_eq(tc->formats & (1u << f), 0, "%s", name);
        cr_assert_neq(kiln_backend_gemv.formats & (1u << f), 0, "%s", name);
        static const struct {
            const char *arch, *prefill;
        } want[] = { { "sm_75", "simt" }, { "a100", "simt" }, { "h200", "wgmma" } };
        for (size_t a = 0; a < KILN_ARRAY_LEN(want); a++) {
            kiln_target t = target(want[a].arch);
            for (int64_t m = 1; m <= 32; m *= 2) {
                kiln_choice ch;
                cr_assert_eq(kiln_backend_select(r, &t, &c, m, NULL, "y", &ch), KILN_OK);
                /* sm_75's 64 KiB of shared memory hold the larger M
                 * classes of some formats' blocks only: simt then */
                if (t.sm == 75 && m <= 16 && strcmp(ch.backend->name, "gemv")) {
                    cr_assert(m >= 8 && strstr(ch.refused, "shared memory"), "%s m=%lld: %s",
                              name, (long long)m, ch.refused);
                    continue;
                }
                cr_assert_str_eq(ch.backend->name, m <= 16 ? "gemv" : want[a].prefill,
                                 "%s %s m=%lld: %s (%s)", want[a].arch, name, (long long)m,
                                 ch.backend->name, ch.refused);
            }
        }
        kiln_target t = target("a100");
        kiln_choice ch;
        cr_assert_eq(kiln_backend_select(r, &t, &c, 1, tc, "y", &ch), KILN_OK);
        cr_assert(ch.fell_back, "%s", name);
        cr_assert_str_eq(ch.backend->name, "gemv");
        cr_assert_str_eq(ch.fallback_why, no_kernel);
        cr_assert_eq(kiln_backend_select(r, &t, &c, 1, &kiln_backend_gemv, "y", &ch), KILN_OK);
        cr_assert(!ch.fell_back, "%s", name);
    }
}

/* The kernel indexes rows and a 16-row tile's packed bytes with ints: a
 * shape past that is refused with the reason (gemv's f32 kernel takes it
 * where its own indexing allows), by an explicit variant too. */
Test(gemv_tc, refuses_shapes_past_its_indexing)
{
    char why[256], got[64];
    kiln_target t = target("sm_80");
    static const char past[] = "N and a 16-row tile's packed bytes must be below 2^31";
    for (int64_t m = 1; m <= 16; m *= 16) {
        kiln_linear_cfg c = cfg(KILN_FMT_BF16, (int64_t)INT_MAX + 1, 64);
        cr_assert_eq(tc->can_implement(&t, &c, m, why, sizeof why), 0);
        cr_assert(strstr(why, past), "%s", why);
        c = cfg(KILN_FMT_BF16, 64, (int64_t)INT_MAX + 1);
        cr_assert_eq(tc->can_implement(&t, &c, m, why, sizeof why), 0);
        cr_assert(strstr(why, past), "%s", why);
    }
    /* K fits an int, a BF16 row tile's packed bytes (2048 an atom of 64) do
     * not: the f32 kernel; at 4 bits they do */
    kiln_linear_cfg c = cfg(KILN_FMT_BF16, 64, (int64_t)1 << 26);
    cr_assert_eq(kiln_gemv_tc_serves(&t, c.format, c.n, c.k), 0);
    cr_assert_str_eq(choice_on(&t, c.format, c.n, c.k, 16, got, sizeof got), "gemv m16");
    c = cfg(KILN_FMT_Q4_0, 64, (int64_t)1 << 26);
    cr_assert_eq(kiln_gemv_tc_serves(&t, c.format, c.n, c.k), 1);
    cr_assert_eq(tc->can_implement(&t, &c, 16, why, sizeof why), 1, "%s", why);
    cr_assert_eq(kiln_gemv_tc_serves(&t, KILN_FMT_BF16, (int64_t)INT_MAX - 15, 64), 0);
    cr_assert_eq(kiln_gemv_tc_serves(&t, KILN_FMT_BF16, (int64_t)INT_MAX - 16, 64), 1);
    /* the last K whose BF16 row tile indexes: INT_MAX / 2048 atoms */
    const int64_t atoms = INT_MAX / 2048;
    cr_assert_eq(kiln_gemv_tc_serves(&t, KILN_FMT_BF16, 64, atoms * 64), 1);
    cr_assert_eq(kiln_gemv_tc_serves(&t, KILN_FMT_BF16, 64, (atoms + 1) * 64), 0);
    /* An FP8 row of 600000000 indexes, tc1's row tile of 16 rows would
     * not: gemv's m1 takes it */
    c = cfg(KILN_FMT_FP8_TENSOR, 64, 600000000);
    cr_assert_eq(tc->can_implement(&t, &c, 1, why, sizeof why), 0);
    cr_assert(strstr(why, past), "%s", why);
    cr_assert_str_eq(choice_on(&t, c.format, c.n, c.k, 1, got, sizeof got), "gemv m1");
    /* an explicit variant says why */
    kiln_linear_kernel k = { .cfg = c, .act = KILN_ACT_BF16 };
    snprintf(k.variant, sizeof k.variant, "tc1");
    kiln_launch l;
    cr_assert_eq(tc->launch(&t, &k, 1, &l), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), past), "%s", kiln_last_error());
}

/* How a format streams through the tensor-core kernel's rings, tc.cuh's
 * traits restated: 16-byte pieces and 8-byte units a lane stages per
 * atom, a lane group's record bytes per atom, and the atoms a stage holds
 * at one row tile. F32 it does not serve. */
static const struct {
    int pieces, units, record, batch;
} tc_fmt[] = {
    [KILN_FMT_F16] = { 4, 0, 0, 1 },         [KILN_FMT_BF16] = { 4, 0, 0, 1 },
    [KILN_FMT_FP8_TENSOR] = { 2, 0, 0, 2 },
    [KILN_FMT_FP8_CHANNEL] = { 2, 0, 0, 2 }, [KILN_FMT_FP8_BLOCK] = { 2, 1, 0, 2 },
    [KILN_FMT_MXFP8] = { 2, 0, 4, 2 },       [KILN_FMT_NVFP4] = { 1, 0, 8, 4 },
    [KILN_FMT_MXFP4] = { 1, 0, 4, 4 },       [KILN_FMT_Q8_0] = { 2, 0, 8, 2 },
    [KILN_FMT_Q4_0] = { 1, 0, 8, 4 },        [KILN_FMT_Q4_K] = { 1, 1, 8, 4 },
    [KILN_FMT_Q6_K] = { 1, 2, 8, 2 },        [KILN_FMT_GGML_MXFP4] = { 1, 0, 4, 4 },
};
_Static_assert(KILN_ARRAY_LEN(tc_fmt) == TC_FORMATS_END, "one entry per format gemv_tc serves");

/* A tensor-core block's rings (tc_smem in tc.cuh): warps · stages ·
 * (batch atoms · row tiles · (pieces · 512 + units · 256 + 8 records) +
 * x), batch being the format's spread over the row tiles and x token
 * tiles · lane groups holding x · (batch · 128 + 32; + 16 for BF16, whose
 * x rows ldmatrix reads), or for a format without records at one token
 * (BF16: up to two; x copied by lane) batch · 4 k-tiles · 4 lanes of
 * each group · 8 bytes. */
static long long tc_ring_bytes(kiln_format f, long long max_m, long long row_tiles,
                               long long warps, long long stages)
{
    const long long b = tc_fmt[f].batch / row_tiles > 0 ? tc_fmt[f].batch / row_tiles : 1;
    const long long tiles = max_m > 8 ? 2 : 1, groups = max_m < 8 ? max_m : 8;
    const long long pad = f == KILN_FMT_BF16 ? 16 : 32;
    const int by_lane = !tc_fmt[f].record && (max_m == 1 || (f == KILN_FMT_BF16 && max_m == 2));
    const long long x = by_lane ? b * tiles * 4 * groups * 32 : tiles * groups * (b * 128 + pad);
    const long long stage =
        b * row_tiles * (tc_fmt[f].pieces * 512 + tc_fmt[f].units * 256 + 8 * tc_fmt[f].record) +
        x;
    return warps * stages * stage;
}

/* Emits sig into src and checks its block against a launch worked by
 * hand: warps, stages (where given) and the rings' bytes, which
 * tc_ring_bytes restates from the source's own shape. */
static void tc_emit_worked(const char *sig, kiln_format f, int warps, int stages, unsigned smem,
                           kiln_kernel_source *src)
{
    cr_assert_eq(kiln_emit_text(kiln_registry_default(), sig, src), KILN_OK, "%s",
                 kiln_last_error());
    cr_assert_eq(kt_source_param(src->text, "warps"), warps, "%s", sig);
    if (stages)
        cr_assert_eq(kt_source_param(src->text, "stages"), stages, "%s", sig);
    cr_assert_eq(kt_source_param(src->text, "smem"), smem, "%s", sig);
    cr_assert_eq(tc_ring_bytes(f, kt_source_param(src->text, "max_m"),
                               kt_source_param(src->text, "row_tiles"), warps,
                               kt_source_param(src->text, "stages")),
                 smem, "%s", sig);
}

/* The tensor-core kernel's shared memory, worked by hand. 4096 x 4096 is
 * 256 row tiles and 64 atoms of 64. A block starts at its class's warps
 * and halves until the rings and a k-split's reduction (warps · row tiles
 * · token tiles · 4 · 32 · 4 bytes) fit the target's opt-in limit; the
 * launch asks for the rings as dynamic shared memory. */
Test(gemv_tc, shared_memory_worked_by_hand)
{
    static const struct {
        const char *arch;
        const char *variant;
        kiln_format f;
        int64_t m;
        int warps, k_split;
        unsigned smem, grid;
    } cases[] = {
        /* tc16, 2 row tiles, 3 stages of 2 atoms: q4_0's stage is 2 · 2 ·
         * (512 + 64) + 2 · 8 · (2 · 128 + 32) = 6912 bytes, 8 warps
         * 165888, + 16384 of 8-way reduction: 182272 of 232448. 128 row
         * groups, one a block. */
        { "sm_90a", "tc16", KILN_FMT_Q4_0, 16, 8, 8, 165888, 128 },
        /* sm_89 (101376) and sm_80 (166912) halve to 4 warps: 82944 +
         * 8192 (4-way split) for q4_0. */
        { "sm_89", "tc16", KILN_FMT_Q4_0, 16, 4, 4, 82944, 128 },
        { "l40s", "tc16", KILN_FMT_NVFP4, 9, 4, 4, 82944, 128 },
        { "sm_80", "tc16", KILN_FMT_Q4_K, 16, 4, 4, 95232, 128 },
        { "sm_89", "tc16", KILN_FMT_Q6_K, 16, 4, 4, 56832, 128 },
        /* tc1: one lane group holds x, 4 warps of 3 stages of 4 atoms:
         * 4 · (512 + 256 + 64) + (4 · 128 + 32) = 3872 bytes a stage. */
        { "sm_89", "tc1", KILN_FMT_Q4_K, 1, 4, 4, 46464, 256 },
        /* tc8 of BF16, 2 row tiles of one atom, 4 stages: 2 · 2048 + 8 ·
         * (128 + 16) = 5248 bytes a stage, 4 warps 83968. */
        { "sm_90a", "tc8", KILN_FMT_BF16, 8, 4, 4, 83968, 128 },
        { "sm_86", "tc2", KILN_FMT_Q8_0, 2, 4, 4, 33024, 256 },
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        kiln_target t = target(cases[i].arch);
        kiln_linear_cfg c = cfg(cases[i].f, 4096, 4096);
        char v[64], why[256] = "", sig[512];
        kiln_backend_variant(tc, &t, &c, cases[i].m, v, sizeof v);
        cr_assert_str_eq(v, cases[i].variant, "case %zu", i);
        cr_assert_eq(tc->can_implement(&t, &c, cases[i].m, why, sizeof why), 1, "%s", why);
        tc_sig(sig, sizeof sig, v, cases[i].f, 0, 4096, 4096, cases[i].arch);
        kiln_kernel_source src;
        tc_emit_worked(sig, cases[i].f, cases[i].warps, 0, cases[i].smem, &src);
        cr_assert_eq(kt_source_param(src.text, "k_split"), cases[i].k_split, "%s", sig);
        kiln_launch l;
        cr_assert_eq(tc->launch(&t, &src.desc.linear, cases[i].m, &l), KILN_OK, "%s",
                     kiln_last_error());
        cr_assert_eq(l.block[0], 32u * cases[i].warps, "%s", sig);
        cr_assert_eq(l.smem, cases[i].smem, "%s", sig);
        cr_assert_eq(l.grid[0], cases[i].grid, "%s", sig);
        kiln_kernel_source_free(&src);
    }
}

/* Without a known limit a block gets 48 KiB: tc16 at q4_0 halves twice, to
 * 2 warps (41472 + 4096 of 2-way reduction). Where not even one warp's
 * 20736 bytes of rings fit, the tensor-core variant is refused, by
 * can_implement, emit and launch alike. */
Test(gemv_tc, block_halves_to_the_limit_and_refuses_below_one_warp)
{
    kiln_target future = { .name = "sm_120", .sm = 120 };
    kiln_linear_cfg c = cfg(KILN_FMT_Q4_0, 4096, 4096);
    char why[256] = "", buf[4096];
    cr_assert_eq(tc->can_implement(&future, &c, 16, why, sizeof why), 1, "%s", why);
    kiln_linear_kernel k = { .cfg = c, .act = KILN_ACT_BF16 };
    snprintf(k.variant, sizeof k.variant, "tc16");
    cr_assert_eq(tc->emit(&future, &k, "kiln_gemv_tc_0", buf, sizeof buf), KILN_OK, "%s",
                 kiln_last_error());
    cr_assert_eq(kt_source_param(buf, "warps"), 2, "%s", buf);
    cr_assert_eq(kt_source_param(buf, "k_split"), 2, "%s", buf);
    cr_assert_eq(kt_source_param(buf, "smem"), 41472, "%s", buf);
    kiln_launch l;
    cr_assert_eq(tc->launch(&future, &k, 16, &l), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(l.block[0], 64);
    cr_assert_eq(l.smem, 41472);
    cr_assert_eq(l.grid[0], 128);

    /* A part that opts in to one byte less than one warp's rings. */
    kiln_target small;
    cr_assert_eq(kiln_target_from_cc(12, 0, 1, 20735, &small), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(tc->can_implement(&small, &c, 16, why, sizeof why), 0);
    cr_assert_str_eq(why, "tc16 at q4_0: needs 20736 bytes of shared memory per block, sm_120 "
                          "allows 20735");
    cr_assert_eq(tc->emit(&small, &k, "kiln_gemv_tc_0", buf, sizeof buf), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "gemv_tc: tc16 at q4_0: needs 20736 bytes"), "%s",
              kiln_last_error());
    cr_assert_eq(tc->launch(&small, &k, 16, &l), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "sm_120 allows 20735"), "%s", kiln_last_error());
    /* tc1 of BF16 needs 6528 bytes a warp (3 stages of 2048 bytes of
     * pieces and 128 of x fragments): 4 warps' 26112 do not fit, 2 warps'
     * 13056 and their 2-way reduction (1024) do. */
    c.format = KILN_FMT_BF16;
    cr_assert_eq(tc->can_implement(&small, &c, 1, why, sizeof why), 1, "%s", why);
    k.cfg = c;
    snprintf(k.variant, sizeof k.variant, "tc1");
    cr_assert_eq(tc->launch(&small, &k, 1, &l), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(l.block[0], 64);
    cr_assert_eq(l.smem, 13056);
}

/* ---------------------------------------------------------------- plans */

static char dummy[16]; /* planning never reads weight bytes */

/* What the plan of a gated FFN gives one target. */
typedef struct decode_plan {
    const char *arch;
    int choices;         /* decode buckets gemv_tc or gemv takes, of 3 x 5 */
    int tc, f32, m1;     /* gemv_tc kernels, gemv kernels, of them m1 */
    const char *what;
} decode_plan;

static int decode_backend(const kiln_backend *b)
{
    return b == tc || b == &kiln_backend_gemv;
}

static void check_decode_plan(kiln_graph *g, const decode_plan *want)
{
    kiln_target t = target(want->arch);
    kiln_plan *p;
    cr_assert_eq(kiln_plan_create(g, &t, NULL, &p), KILN_OK, "%s", kiln_last_error());
    int choices = 0;
    for (int i = 0; i < p->n_linears; i++)
        for (int b = 0; b < p->n_buckets; b++) {
            const kiln_plan_choice *c = &p->linears[i].choice[b];
            if (p->buckets[b] > 16) {
                cr_assert_not(decode_backend(c->backend), "%s bucket %lld", want->arch,
                              (long long)p->buckets[b]);
                continue;
            }
            if (!decode_backend(c->backend)) {
                /* Only a class the part's shared memory cannot hold. */
                cr_assert_str_eq(c->backend->name, "simt");
                cr_assert(c->refused && strstr(c->refused, "shared memory"), "%s %s: %s",
                          want->arch, p->linears[i].node->name, c->refused);
                continue;
            }
            choices++;
            cr_assert_eq(c->epilogue, p->linears[i].candidate, "every fusion is taken");
        }
    cr_assert_eq(choices, want->choices, "%s: %s", want->arch, want->what);
    int n_tc = 0, f32 = 0, m1 = 0;
    for (int i = 0; i < kiln_plan_n_signatures(p); i++) {
        const char *sig = kiln_plan_signature(p, i);
        kiln_kernel_source s;
        cr_assert_eq(kiln_emit_text(p->registry, sig, &s), KILN_OK, "%s: %s", sig,
                     kiln_last_error());
        if (s.desc.kind == KILN_STEP_LINEAR) {
            n_tc += s.desc.backend == tc;
            f32 += s.desc.backend == &kiln_backend_gemv;
            m1 += !strcmp(s.desc.linear.variant, "m1");
        }
        kiln_kernel_source_free(&s);
    }
    cr_assert_eq(n_tc, want->tc, "%s: %s", want->arch, want->what);
    cr_assert_eq(f32, want->f32, "%s: %s", want->arch, want->what);
    cr_assert_eq(m1, want->m1, "%s: %s", want->arch, want->what);
    kiln_plan_destroy(p);
}

/* A gated FFN with a residual in three formats: decode buckets run the
 * decode backends, with the epilogues fused, the rest do not, and every
 * signature emits. sm_75 has gemv's f32 kernel per linear and M class
 * that its shared memory holds (not m16, nor q6_k's m8: simt takes
 * those); sm_80 runs every decode bucket on gemv_tc, each on its own
 * class, with no gemv kernel left. */
Test(gemv_tc, default_plans_use_it_for_decode)
{
    enum { D = 512, F = 768 };
    static float norm[D];
    for (int i = 0; i < D; i++)
        norm[i] = 1.0f;
    kiln_graph *g;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    kiln_tensor *x, *nw, *h, *wg, *wu, *wd, *gate, *up, *act, *prod, *down, *out;
    kiln_qtensor qg = { .format = KILN_FMT_Q4_K, .n = F, .k = D, .data = dummy };
    kiln_qtensor qu = { .format = KILN_FMT_NVFP4, .n = F, .k = D, .data = dummy, .scale = dummy };
    kiln_qtensor qd = { .format = KILN_FMT_Q6_K, .n = D, .k = F, .data = dummy };
    cr_assert_eq(kiln_graph_input(g, "x", D, &x), KILN_OK);
    cr_assert_eq(kiln_graph_param(g, "norm", D, norm, &nw), KILN_OK);
    cr_assert_eq(kiln_graph_rms_norm(g, "h", x, nw, 1e-6f, &h), KILN_OK);
    cr_assert_eq(kiln_graph_weight(g, "wg", &qg, &wg), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_graph_weight(g, "wu", &qu, &wu), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_graph_weight(g, "wd", &qd, &wd), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_graph_linear(g, "gate", h, wg, NULL, &gate), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "up", h, wu, NULL, &up), KILN_OK);
    cr_assert_eq(kiln_graph_silu(g, "act", gate, &act), KILN_OK);
    cr_assert_eq(kiln_graph_mul(g, "prod", up, act, &prod), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "down", prod, wd, NULL, &down), KILN_OK);
    cr_assert_eq(kiln_graph_add(g, "out", x, down, &out), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, out), KILN_OK);
    static const decode_plan plans[] = {
        { "t4", 4 + 4 + 3, 0, 4 + 4 + 3, 3,
          "gemv: q4_k and nvfp4 m1 to m8, q6_k m1, m2, m4; one kernel each" },
        { "a100", 3 * 5, 3 * 5, 0, 0, "gemv_tc: every linear in tc1, tc2, tc4, tc8, tc16" },
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(plans); i++)
        check_decode_plan(g, &plans[i]);
    kiln_graph_destroy(g);
}

/* ------------------------------------------------------ source, launches */

/* The golden source of q6_k 4096 x 14336 at m = 16 on sm_90a, worked by
 * hand: tc16 takes two row tiles of 16 a warp, so 4096 rows are 128 warp
 * row groups, far short of the 2048 warps that fill the part; K splits
 * over all 8 warps of a block (224 atoms of 64, 28 a slice), so a block
 * is one row group and the grid 128 blocks. Dynamic shared memory, the
 * rings: 8 warps · 3 stages · (1 atom · 2 row tiles · (512 of pieces +
 * 2 · 256 of units + 64 of records) + 16 x rows of 128 + 32) = 113664,
 * with the 16384 of the reduction within sm_90a's 232448. An SM holds one
 * such block (233472 / (113664 + 1024 + 16384)), and one with a fourth
 * stage too, which sm_90 takes: 151552 (+ 16384 = 167936). */
Test(gemv_tc, emit_instantiates_the_template)
{
    static const char golden[] =
        "// kiln kernel, generated from its signature: the logic is in the included template.\n"
        "// signature: linear backend=gemv_tc variant=tc16 format=q6_k scales=inline act=bf16 "
        "n=4096 k=14336 epilogue=bias+residual out=bf16 target=sm_90a\n"
        "// templates: %s\n"
        "// cache key: " KILN_EMIT_KEY_PLACEHOLDER "\n"
        "#include \"kiln/tc.cuh\"\n"
        "\n"
        "using format = kiln::tc_q6_k;\n"
        "using shape = kiln::tc_shape</*max_m*/ 16, /*row_tiles*/ 2, /*warps*/ 8, /*k_split*/ 8,\n"
        "                             /*batch*/ 1, /*stages*/ 4>;\n"
        "using epilogue = kiln::epilogue</*bias*/ true, /*residual*/ true, /*silu_mul*/ "
        "false>;\n"
        "\n"
        "extern \"C\" __global__ void __launch_bounds__(shape::threads, "
        "kiln::tc_min_blocks<format, shape>::value)\n"
        "%s(const kiln_linear_args args)\n"
        "{\n"
        "    kiln::gemv_tc<format, shape, epilogue, /*n*/ 4096, /*k*/ 14336, /*smem*/ "
        "151552>(args);\n"
        "}\n";
    const char *sig = "linear backend=gemv_tc variant=tc16 format=q6_k scales=inline act=bf16 "
                      "n=4096 k=14336 epilogue=bias+residual out=bf16 target=sm_90a";
    kiln_kernel_source s;
    cr_assert_eq(kiln_emit_text(kiln_registry_default(), sig, &s), KILN_OK, "%s",
                 kiln_last_error());
    char want[4096];
    snprintf(want, sizeof want, golden, kiln_emit_templates_digest(), s.desc.entry);
    cr_assert_str_eq(s.text, want);
    cr_assert_eq(strncmp(s.desc.entry, "kiln_gemv_tc_", 13), 0, "%s", s.desc.entry);
    for (int64_t m = 9; m <= 16; m++) {
        kiln_kernel_launch l[KILN_MAX_LAUNCHES];
        int n;
        cr_assert_eq(kiln_kernel_launches(&s.desc, m, l, &n), KILN_OK, "%s", kiln_last_error());
        cr_assert_eq(n, 1);
        cr_assert_eq(l[0].cfg.grid[0], 128);
        cr_assert_eq(l[0].cfg.block[0], 256);
        cr_assert_eq(l[0].cfg.smem, 151552);
    }
    kiln_kernel_source_free(&s);
}

/* gemv_tc builds sm_80+, a format exact in BF16 and K in whole atoms of
 * 64, whatever the signature asks; emit and launch refuse alike, with the
 * reason, the variant and the linear they were given. */
Test(gemv_tc, emit_refuses_what_it_does_not_serve)
{
    static const struct {
        const char *arch;
        kiln_format f;
        int64_t k;
        const char *why;
    } refused[] = {
        { "sm_75", KILN_FMT_Q4_0, 4096, "needs sm_80 or newer (bf16 mma.sync), target is sm_75" },
        { "t4", KILN_FMT_BF16, 4096, "needs sm_80 or newer (bf16 mma.sync), target is sm_75" },
        { "sm_90a", KILN_FMT_F32, 4096, "f32 values are not exact in bf16" },
        { "sm_80", KILN_FMT_F16, 4096 + 8, "K=4104 is not a multiple of 64" },
        { "sm_89", KILN_FMT_Q8_0, 4096 + 32, "K=4128 is not a multiple of 64" },
        { "sm_90a", KILN_FMT_NVFP4, 96, "K=96 is not a multiple of 64" },
    };
    static const char *const variants[] = { "tc8", "tc16" };
    char buf[4096];
    for (size_t i = 0; i < KILN_ARRAY_LEN(refused); i++)
        for (size_t v = 0; v < KILN_ARRAY_LEN(variants); v++) {
            kiln_target t = target(refused[i].arch);
            kiln_linear_kernel k = { .cfg = cfg(refused[i].f, 4096, refused[i].k),
                                     .act = KILN_ACT_BF16 };
            snprintf(k.variant, sizeof k.variant, "%s", variants[v]);
            kiln_launch l;
            cr_assert_eq(tc->emit(&t, &k, "kiln_gemv_tc_0", buf, sizeof buf),
                         KILN_ERR_UNSUPPORTED, "%s %s", refused[i].arch, variants[v]);
            char named[192];
            snprintf(named, sizeof named, "gemv_tc %s: %s", variants[v], refused[i].why);
            cr_assert(strstr(kiln_last_error(), named), "%s", kiln_last_error());
            snprintf(named, sizeof named, "(format %s, N=4096, K=%lld)",
                     kiln_format_get(refused[i].f)->name, (long long)refused[i].k);
            cr_assert(strstr(kiln_last_error(), named), "%s", kiln_last_error());
            cr_assert_eq(tc->launch(&t, &k, 1, &l), KILN_ERR_UNSUPPORTED, "%s %s",
                         refused[i].arch, variants[v]);
            cr_assert(strstr(kiln_last_error(), refused[i].why), "%s", kiln_last_error());
        }
    /* Through the registry, from a signature. */
    kiln_kernel_source s;
    cr_assert_eq(kiln_emit_text(kiln_registry_default(),
                                "linear backend=gemv_tc variant=tc8 format=f32 scales=none "
                                "act=bf16 n=4096 k=4096 epilogue=none out=bf16 target=sm_90a",
                                &s),
                 KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "not exact in bf16"), "%s", kiln_last_error());
    cr_assert_eq(kiln_emit_text(kiln_registry_default(),
                                "linear backend=gemv_tc variant=tc16 format=bf16 scales=none "
                                "act=bf16 n=4096 k=4096 epilogue=none out=bf16 target=sm_75",
                                &s),
                 KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "sm_80"), "%s", kiln_last_error());

    kiln_target t = target("sm_90a");
    kiln_linear_kernel k = { .cfg = cfg(KILN_FMT_Q6_K, 4096, 4096), .act = KILN_ACT_FP8_TOKEN };
    snprintf(k.variant, sizeof k.variant, "tc8");
    kiln_launch l;
    cr_assert_eq(tc->emit(&t, &k, "kiln_gemv_tc_0", buf, sizeof buf), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "bf16, not fp8-token"), "%s", kiln_last_error());
    cr_assert_eq(tc->launch(&t, &k, 1, &l), KILN_ERR_UNSUPPORTED);
    k.act = KILN_ACT_BF16;
    k.cfg.epilogue = KILN_EPI_RESIDUAL | KILN_EPI_SILU_MUL;
    cr_assert_eq(tc->emit(&t, &k, "kiln_gemv_tc_0", buf, sizeof buf), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "one aux input"), "%s", kiln_last_error());
    k.cfg.epilogue = KILN_EPI_BIAS;
    k.cfg.format = KILN_FMT_COUNT;
    cr_assert_eq(tc->emit(&t, &k, "kiln_gemv_tc_0", buf, sizeof buf), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "is not a kiln_format"), "%s", kiln_last_error());
    snprintf(k.variant, sizeof k.variant, "m8");
    cr_assert_eq(tc->emit(&t, &k, "kiln_gemv_tc_0", buf, sizeof buf), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "no variant \"m8\" (tc1, tc2, tc4, tc8, tc16)"), "%s",
              kiln_last_error());
    snprintf(k.variant, sizeof k.variant, "tc8");
    k.cfg = cfg(KILN_FMT_BF16, (int64_t)INT_MAX + 1, 4096);
    cr_assert_eq(tc->emit(&t, &k, "kiln_gemv_tc_0", buf, sizeof buf), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "below 2^31"), "%s", kiln_last_error());
    cr_assert_eq(tc->launch(&t, &k, 1, &l), KILN_ERR_UNSUPPORTED);
    k.cfg = cfg(KILN_FMT_Q6_K, 4096, 4096);
    cr_assert_eq(tc->emit(&t, &k, "kiln_gemv_tc_0", buf, 64), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "the buffer has 64"), "%s", kiln_last_error());
    cr_assert_eq(tc->emit(&t, &k, "kiln_gemv_tc_0", buf, sizeof buf), KILN_OK, "%s",
                 kiln_last_error());
    cr_assert(strstr(buf, "kiln/tc.cuh"), "%s", buf);
}

Test(gemv_tc, launch_serves_its_m_class_only)
{
    kiln_target t = target("sm_80");
    kiln_linear_kernel k = { .cfg = cfg(KILN_FMT_MXFP4, 2048, 4096), .act = KILN_ACT_BF16 };
    kiln_launch l;
    /* tcN serves 1 to N tokens (a bucket of 9 to 16 runs fewer at its
     * tail). */
    static const struct {
        const char *variant;
        int max_m;
    } classes[] = { { "tc1", 1 }, { "tc2", 2 }, { "tc4", 4 }, { "tc8", 8 }, { "tc16", 16 } };
    for (size_t v = 0; v < KILN_ARRAY_LEN(classes); v++) {
        snprintf(k.variant, sizeof k.variant, "%s", classes[v].variant);
        for (int64_t m = 1; m <= classes[v].max_m; m++)
            cr_assert_eq(tc->launch(&t, &k, m, &l), KILN_OK, "%s m=%lld: %s",
                         classes[v].variant, (long long)m, kiln_last_error());
        char want[64];
        snprintf(want, sizeof want, "gemv_tc %s: cannot launch for M = %d (1 to %d)",
                 classes[v].variant, classes[v].max_m + 1, classes[v].max_m);
        cr_assert_eq(tc->launch(&t, &k, classes[v].max_m + 1, &l), KILN_ERR_SHAPE);
        cr_assert(strstr(kiln_last_error(), want), "%s", kiln_last_error());
        cr_assert_eq(tc->launch(&t, &k, 0, &l), KILN_ERR_SHAPE);
    }
}

/* The kernels copy weights only before they wait for the kernel before
 * them (griddepcontrol, sm_90+): the plan lets them overlap it on sm_90,
 * and a device that gives its SM count (kiln_launch_finalise) does;
 * nowhere else (not on the newer chips either, where it was not
 * measured). A launch of more than a wave keeps its shared memory. One
 * within a wave holds p = ceil(blocks / 132) blocks an SM and no more:
 * where its own shared memory would hold more, it asks for the least
 * that holds p + 1 no more, in 128-byte steps. H200, 4 warps a block with K split 4 ways (2048 bytes
 * of sums, 1024 reserved): 28672 x 4096 at one token is 1792 blocks,
 * Q4_K's 46464 bytes of rings hold 4 an SM, 528 a wave. 4096 x 14336 at
 * tc4 is 256 blocks of 66048 bytes, 3 an SM, p = 2: 233472 / 3 − 3072 +
 * 1 rounds up to 74880; at tc1 its blocks take 8 warps (4096 bytes of
 * sums): Q4_K's 92928 bytes hold 2 an SM already, FP8's 55296 hold 3:
 * 233472 / 3 − 5120 + 1 rounds up to 72832. FP8 at 2048 x 4096 is 128
 * blocks (27648 bytes, 7 an SM): p = 1, 233472 / 2 − 3072 + 1 rounds up
 * to 113792. tc16 at 28672 x 4096 is 224 blocks of Q4_K's 94208 bytes (4
 * stages) and 16384 of sums: p = 2, 2 an SM already; at 4096 x 14336
 * FP8's 147456 hold one. */
Test(gemv_tc, launches_overlap_their_predecessor_on_sm_90)
{
    static const struct {
        const char *arch, *variant;
        kiln_format f;
        int64_t n, k;
        int overlap;
        unsigned smem; /* 0: the kernel's own */
    } cases[] = {
        { "h200", "tc1", KILN_FMT_Q4_K, 28672, 4096, 1, 0 },
        { "h100", "tc1", KILN_FMT_Q4_K, 28672, 4096, 1, 0 },
        { "h200", "tc4", KILN_FMT_Q4_K, 4096, 14336, 1, 74880 },
        { "h200", "tc1", KILN_FMT_Q4_K, 4096, 14336, 1, 0 },
        { "h200", "tc1", KILN_FMT_FP8_TENSOR, 4096, 14336, 1, 72832 },
        { "h200", "tc1", KILN_FMT_FP8_TENSOR, 2048, 4096, 1, 113792 },
        { "h200", "tc16", KILN_FMT_Q4_K, 28672, 4096, 1, 0 },
        { "h200", "tc16", KILN_FMT_FP8_TENSOR, 4096, 14336, 1, 0 },
        { "sm_90a", "tc1", KILN_FMT_Q4_K, 28672, 4096, 0, 0 },
        { "a100", "tc1", KILN_FMT_Q4_K, 28672, 4096, 0, 0 },
        { "l40s", "tc1", KILN_FMT_Q4_K, 28672, 4096, 0, 0 },
        { "sm_100", "tc1", KILN_FMT_Q4_K, 28672, 4096, 0, 0 },
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        kiln_target t;
        /* a chip newer than sm_90, not measured: as a live device gives it */
        if (!strcmp(cases[i].arch, "sm_100"))
            cr_assert_eq(kiln_target_from_cc(10, 0, 148, 232448, &t), KILN_OK);
        else
            t = target(cases[i].arch);
        kiln_linear_kernel k = { .cfg = cfg(cases[i].f, cases[i].n, cases[i].k),
                                 .act = KILN_ACT_BF16 };
        snprintf(k.variant, sizeof k.variant, "%s", cases[i].variant);
        /* The plan's launch: a permission and the kernel's own shared
         * memory, whatever the SM count; the device decides. */
        kiln_launch own, l;
        kiln_target plain = t;
        plain.sm_count = 0;
        cr_assert_eq(tc->launch(&plain, &k, 1, &own), KILN_OK, "%s %s: %s", cases[i].arch,
                     cases[i].variant, kiln_last_error());
        cr_assert_eq(tc->launch(&t, &k, 1, &l), KILN_OK);
        cr_assert_eq(memcmp(&l, &own, sizeof l), 0, "%s %s: the SM count changes nothing",
                     cases[i].arch, cases[i].variant);
        const kiln_device_caps caps = { .sm_count = t.sm_count,
                                        .smem_per_sm = t.smem_optin + 1024,
                                        .smem_per_block_reserved = 1024,
                                        .warps_per_sm = 64 };
        kiln_launch_finalise(&caps, &l);
        cr_assert_eq(l.overlap, cases[i].overlap, "%s %s %lldx%lld: %u blocks", cases[i].arch,
                     cases[i].variant, (long long)cases[i].n, (long long)cases[i].k, l.grid[0]);
        cr_assert_eq(l.smem, cases[i].smem ? cases[i].smem : own.smem,
                     "%s %s %lldx%lld: %u, own %u", cases[i].arch, cases[i].variant,
                     (long long)cases[i].n, (long long)cases[i].k, l.smem, own.smem);
        cr_assert_geq(l.smem, own.smem);
    }
}

/* tc16 on sm_90 takes a fourth stage where a block with it still fits
 * and an SM's shared memory (233472 bytes, 1024 a block) holds as many
 * blocks, worked by hand. 8192 x 28672 is 128 blocks of 8 warps, 4 row
 * tiles each, K split 8 (32768 bytes of sums): Q4_0's stage is 4 · (512 +
 * 64) + 2 · 8 · (128 + 32) = 4864 bytes, 116736 for 3 stages and 155648
 * for 4, one block an SM either way. BF16's 3 stages of 8 warps (251904:
 * 4 · 2048 + 2 · 8 · (128 + 16) a stage) pass the limit: 4 warps, split 4,
 * 4 stages of 10496 bytes. 28672 x 4096
 * takes blocks of 4 warps split 2 (16384 of sums): Q4_K's 70656 and
 * 94208 hold 2 an SM; Q4_0's 58368 hold 3, its 77824 only 2; FP8's 79872
 * hold 2, its 106496 one. NVFP4 at 4096 x 14336 (2 row tiles, 2 atoms a
 * stage, 6912 bytes) has no room for a fourth: 221184 + 16384. sm_80 is
 * not measured, and keeps 3. */
Test(gemv_tc, tc16_takes_a_fourth_stage_on_sm_90)
{
    static const struct {
        const char *arch;
        kiln_format f;
        int64_t n, k;
        int warps, stages;
        unsigned smem;
    } cases[] = {
        { "sm_90a", KILN_FMT_Q4_0, 8192, 28672, 8, 4, 155648 },
        { "sm_90a", KILN_FMT_BF16, 8192, 28672, 4, 4, 167936 },
        { "sm_90a", KILN_FMT_Q4_K, 28672, 4096, 4, 4, 94208 },
        { "sm_90a", KILN_FMT_Q4_0, 28672, 4096, 4, 3, 58368 },
        { "sm_90a", KILN_FMT_FP8_TENSOR, 28672, 4096, 4, 3, 79872 },
        { "sm_90a", KILN_FMT_NVFP4, 4096, 14336, 8, 3, 165888 },
        { "sm_80", KILN_FMT_Q4_0, 8192, 28672, 8, 3, 116736 },
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        char sig[512];
        tc_sig(sig, sizeof sig, "tc16", cases[i].f, 0, cases[i].n, cases[i].k, cases[i].arch);
        kiln_kernel_source src;
        tc_emit_worked(sig, cases[i].f, cases[i].warps, cases[i].stages, cases[i].smem, &src);
        kiln_kernel_source_free(&src);
    }
}

/* The tensor-core variants: 16 rows a row tile, row_tiles a warp, warps /
 * k_split warp row groups a block; the grid covers every row and not one
 * block more with the warps the source was built for, and every K slice
 * keeps at least four atoms of 64. The launch's dynamic shared memory is
 * the source's, the warps' rings; with the reduction it fits the part. A
 * warp has its class's row tiles (1 below 8 tokens, else 2; 4 at tc16
 * from N = 8192, 512 row tiles, on), a block its class's warps (4; 8 for
 * tc16 of 2 row tiles, and for tc16 of 4 where blocks of 4 would make
 * fewer than 1024 warps) but where they would not fit: then half as many
 * as the first count that does not. */
Test(gemv_tc, launches_cover_every_row)
{
    static const int64_t shapes[][2] = {
        { 28672, 4096 }, { 4096, 14336 }, { 8192, 28672 }, { 6144, 4096 }, { 151936, 4096 },
        { 200, 13568 },  { 1000, 512 },   { 7, 256 },      { 4097, 768 },  { 17, 64 },
        { 1, 64 },       { 33, 128 },     { 1024, 512 },   { 4100, 4096 }, { 65536, 1024 },
    };
    static const struct {
        const char *name;
        int64_t m, max_m;
        int row_tiles, warps;
    } variants[] = { { "tc1", 1, 1, 1, 4 },  { "tc2", 2, 2, 1, 4 },    { "tc4", 3, 4, 1, 4 },
                     { "tc8", 5, 8, 2, 4 },  { "tc8", 8, 8, 2, 4 },    { "tc16", 9, 16, 2, 8 },
                     { "tc16", 16, 16, 2, 8 } };
    static const char *const arches[] = { "sm_80", "sm_86", "sm_89", "sm_90a" };
    int checked = 0;
    for (size_t a = 0; a < KILN_ARRAY_LEN(arches); a++)
        for (size_t s = 0; s < KILN_ARRAY_LEN(shapes); s++)
            for (int f = 0; f < TC_FORMATS_END; f++)
                for (size_t v = 0; v < KILN_ARRAY_LEN(variants); v++) {
                    kiln_target t = target(arches[a]);
                    const int64_t n = shapes[s][0], k = shapes[s][1];
                    kiln_linear_cfg c = cfg((kiln_format)f, n, k);
                    char name[64], why[256] = "";
                    kiln_backend_variant(tc, &t, &c, variants[v].m, name, sizeof name);
                    if (!kiln_gemv_tc_serves(&t, (kiln_format)f, n, k)) {
                        cr_assert_eq(tc->can_implement(&t, &c, variants[v].m, why, sizeof why),
                                     0, "%s %s", arches[a], kiln_format_get((kiln_format)f)->name);
                        continue;
                    }
                    if (k % kiln_format_get((kiln_format)f)->k_multiple)
                        continue;
                    cr_assert_str_eq(name, variants[v].name);
                    cr_assert_eq(tc->can_implement(&t, &c, variants[v].m, why, sizeof why), 1,
                                 "%s", why);
                    char sig[512];
                    tc_sig(sig, sizeof sig, name, (kiln_format)f, 0, n, k, arches[a]);
                    kiln_kernel_source src;
                    cr_assert_eq(kiln_emit_text(kiln_registry_default(), sig, &src), KILN_OK,
                                 "%s: %s", sig, kiln_last_error());
                    const long long max_m = kt_source_param(src.text, "max_m"),
                                    row_tiles = kt_source_param(src.text, "row_tiles"),
                                    warps = kt_source_param(src.text, "warps"),
                                    split = kt_source_param(src.text, "k_split");
                    const long long smem = kt_source_param(src.text, "smem"),
                                    stages = kt_source_param(src.text, "stages");
                    cr_assert_null(strstr(src.text, "/*rows*/"), "%s", src.text);
                    cr_assert_null(strstr(src.text, "/*tile_k*/"), "%s", src.text);
                    cr_assert(strstr(src.text, "__launch_bounds__(shape::threads, "
                                               "kiln::tc_min_blocks<format, shape>::value)"),
                              "%s", src.text);
                    cr_assert_eq(max_m, variants[v].max_m, "%s", sig);
                    const int wide = max_m == 16 && (n + 15) / 16 >= 512;
                    const int two = f == KILN_FMT_Q6_K || f == KILN_FMT_Q8_0 || f == KILN_FMT_F16;
                    /* Wide blocks of 4 row tiles a warp take 8 warps below
                     * 1024 warps of 4-warp blocks; so do one and two tokens
                     * below 2048 warps of them, K at least 128 atoms. */
                    const int deep = max_m <= 2 && (n + 15) / 16 * 4 < 2048 && k / 64 >= 128;
                    /* BF16's row-major atoms at 4 tokens: 8 warps */
                    const int rows4 = max_m == 4 && f == KILN_FMT_BF16;
                    const long long class_warps =
                        wide    ? (!two && (n + 63) / 64 * 4 < 1024 ? 8 : 4)
                        : rows4 ? 8
                        : deep  ? 2 * variants[v].warps
                                : variants[v].warps;
                    cr_assert_eq(row_tiles, wide && !two ? 4 : variants[v].row_tiles, "%s", sig);
                    cr_assert_eq(warps % split, 0, "%s", sig);
                    cr_assert(split == 1 || k / 64 >= 4 * split, "%s: k_split %lld", sig, split);
                    cr_assert_eq(smem,
                                 tc_ring_bytes((kiln_format)f, max_m, row_tiles, warps, stages),
                                 "%s", sig);
                    const long long token_tiles = max_m > 8 ? 2 : 1;
                    const long long reduction =
                        split > 1 ? warps * row_tiles * token_tiles * 4 * 32 * 4 : 0;
                    cr_assert_leq(smem + reduction, t.smem_optin, "%s", sig);
                    /* Halved only where twice the warps' rings alone pass the limit. */
                    cr_assert_leq(warps, class_warps, "%s", sig);
                    if (warps < class_warps)
                        cr_assert_gt(tc_ring_bytes((kiln_format)f, max_m, row_tiles, 2 * warps,
                                                   stages),
                                     t.smem_optin - 2 * warps * row_tiles * token_tiles * 512,
                                     "%s", sig);
                    const long long block_rows = 16 * row_tiles * (warps / split);
                    for (int64_t m = 1; m <= max_m; m++) {
                        kiln_launch l;
                        cr_assert_eq(tc->launch(&t, &src.desc.linear, m, &l), KILN_OK, "%s: %s",
                                     sig, kiln_last_error());
                        cr_assert_geq((long long)l.grid[0] * block_rows, n, "%s", sig);
                        cr_assert_lt((long long)(l.grid[0] - 1) * block_rows, n, "%s", sig);
                        cr_assert_eq(l.grid[1] * l.grid[2], 1);
                        cr_assert_eq(l.block[0], 32 * warps, "%s", sig);
                        cr_assert_eq(l.block[1] * l.block[2], 1);
                        cr_assert_eq(l.smem, smem, "%s", sig);
                    }
                    checked++;
                    kiln_kernel_source_free(&src);
                }
    /* Every format but f32 on every shape, but q4_k and q6_k (256-value
     * blocks) not on the three of K < 256. */
    cr_assert_eq(checked, 4 * 7 * (11 * 15 + 2 * 12));
}

/* The gate epilogue: a warp's row tiles pair a gate tile with an up tile
 * (an even count, two at least), and the grid covers both projections'
 * rows, twice N's tiles; the gate comes only with silu_mul, no bias. */
Test(gemv_tc, gate_kernels_pair_their_row_tiles)
{
    static const int64_t shapes[][2] = { { 14336, 4096 }, { 1000, 512 }, { 200, 768 }, { 17, 64 } };
    static const char *const classes[] = { "tc1", "tc2", "tc4", "tc8", "tc16" };
    static const char *const arches[] = { "sm_80", "sm_90a" };
    int checked = 0;
    for (size_t a = 0; a < KILN_ARRAY_LEN(arches); a++)
        for (size_t s = 0; s < KILN_ARRAY_LEN(shapes); s++)
            for (int f = 0; f < TC_FORMATS_END; f++)
                for (size_t v = 0; v < KILN_ARRAY_LEN(classes); v++) {
                    kiln_target t = target(arches[a]);
                    const int64_t n = shapes[s][0], k = shapes[s][1];
                    if (!kiln_gemv_tc_serves(&t, (kiln_format)f, n, k) ||
                        k % kiln_format_get((kiln_format)f)->k_multiple)
                        continue;
                    char sig[512];
                    tc_sig(sig, sizeof sig, classes[v], (kiln_format)f,
                           KILN_EPI_SILU_MUL | KILN_EPI_GATE, n, k, arches[a]);
                    kiln_kernel_source src;
                    cr_assert_eq(kiln_emit_text(kiln_registry_default(), sig, &src), KILN_OK,
                                 "%s: %s", sig, kiln_last_error());
                    cr_assert(strstr(src.text, "/*silu_mul*/ true, /*gate*/ true"), "%s",
                              src.text);
                    const long long row_tiles = kt_source_param(src.text, "row_tiles"),
                                    warps = kt_source_param(src.text, "warps"),
                                    split = kt_source_param(src.text, "k_split"),
                                    max_m = kt_source_param(src.text, "max_m");
                    cr_assert_eq(row_tiles % 2, 0, "%s", sig);
                    const long long block_rows = 16 * row_tiles * (warps / split);
                    const long long rows = 2 * 16 * ((n + 15) / 16);
                    for (int64_t m = 1; m <= max_m; m++) {
                        kiln_launch l;
                        cr_assert_eq(tc->launch(&t, &src.desc.linear, m, &l), KILN_OK, "%s: %s",
                                     sig, kiln_last_error());
                        cr_assert_geq((long long)l.grid[0] * block_rows, rows, "%s", sig);
                        cr_assert_lt((long long)(l.grid[0] - 1) * block_rows, rows, "%s", sig);
                    }
                    kiln_kernel_source_free(&src);
                    checked++;
                }
    cr_assert_gt(checked, 2 * 4 * 5 * 8);
    static const unsigned refused[] = { KILN_EPI_GATE, KILN_EPI_BIAS | KILN_EPI_SILU_MUL |
                                                           KILN_EPI_GATE };
    for (size_t i = 0; i < KILN_ARRAY_LEN(refused); i++) {
        char sig[512];
        tc_sig(sig, sizeof sig, "tc1", KILN_FMT_BF16, refused[i], 4096, 4096, "sm_90a");
        kiln_kernel_source src;
        cr_assert_eq(kiln_emit_text(kiln_registry_default(), sig, &src), KILN_ERR_UNSUPPORTED,
                     "%s", sig);
        cr_assert(strstr(kiln_last_error(), "only with silu_mul"), "%s", kiln_last_error());
    }
}

/* On the H200: asserts that the default registry runs bucket m of format
 * f at n x k on gemv_tc's variant, emits it into src (the caller frees
 * it), and gives its launch at m; sig names it for messages. */
static void h200_tc(kiln_format f, const char *variant, int64_t n, int64_t k, int64_t m,
                    char (*sig)[512], kiln_kernel_source *src, kiln_launch *l)
{
    kiln_target t = target("h200");
    char got[64], want[64];
    snprintf(want, sizeof want, "gemv_tc %s", variant);
    cr_assert_str_eq(choice_on(&t, f, n, k, m, got, sizeof got), want);
    tc_sig(*sig, sizeof *sig, variant, f, 0, n, k, "h200");
    cr_assert_eq(kiln_emit_text(kiln_registry_default(), *sig, src), KILN_OK, "%s",
                 kiln_last_error());
    cr_assert_eq(tc->launch(&t, &src->desc.linear, m, l), KILN_OK, "%s", *sig);
}

/* The same shapes at m = 1 for the formats whose single token runs tc1,
 * worked by hand: one row tile of 16 a warp, 4 warps a block, and K split
 * (up to the warps of a block) while the launch has fewer than 4096
 * warps and every slice keeps four atoms of 64. 1024 x 512 has only 8
 * atoms: two slices. 4096 x 14336 is 256 row tiles, 1024 warps in 4-warp
 * blocks, and 224 atoms: blocks of 8 warps, 8 slices of 28 atoms, twice
 * the rings. The rings, 4 warps · 3 stages · (batch atoms of
 * pieces, units and records + a 64-value x row per atom and 32 bytes),
 * are 26112 for BF16 (batch 1, x fragments by lane: 128 bytes an atom),
 * 29568 for Q8_0 and Q6_K (batch 2), 34176
 * for Q4_0 and NVFP4, 32640 for the MX 4-bit formats (4-byte records) and
 * 46464 for Q4_K (its super-record a unit). */
Test(gemv_tc, decode_shapes_fill_an_h200)
{
    static const struct {
        int64_t n, k;
        int warps, k_split;
        unsigned grid;
    } shapes[] = {
        { 28672, 4096, 4, 4, 1792 },  /* 1792 tiles: two slices give 3584 warps */
        { 4096, 14336, 8, 8, 256 },   /* 256 tiles, 224 atoms: 8 slices of 28 */
        { 8192, 28672, 4, 4, 512 },   /* 512 tiles: 4 slices, the block's warps */
        { 1024, 512, 4, 2, 64 / 2 },
    };
    static const struct {
        kiln_format f;
        unsigned smem;
    } fs[] = {
        { KILN_FMT_BF16, 26112 },  { KILN_FMT_Q8_0, 29568 },  { KILN_FMT_Q6_K, 29568 },
        { KILN_FMT_NVFP4, 34176 }, { KILN_FMT_MXFP4, 32640 }, { KILN_FMT_Q4_0, 34176 },
        { KILN_FMT_Q4_K, 46464 },  { KILN_FMT_GGML_MXFP4, 32640 },
        /* E4M3 (batch 2, two pieces an atom): x by lane without records,
         * 2 · (1024 + 128) a stage; FP8 block adds a 256-byte unit an atom,
         * MXFP8 has records: 2 · (1024 + 32) + (2 · 128 + 32). */
        { KILN_FMT_FP8_TENSOR, 27648 }, { KILN_FMT_FP8_CHANNEL, 27648 },
        { KILN_FMT_FP8_BLOCK, 33792 },  { KILN_FMT_MXFP8, 28800 },
    };
    for (size_t s = 0; s < KILN_ARRAY_LEN(shapes); s++)
        for (size_t f = 0; f < KILN_ARRAY_LEN(fs); f++) {
            char sig[512];
            kiln_kernel_source src;
            kiln_launch l;
            h200_tc(fs[f].f, "tc1", shapes[s].n, shapes[s].k, 1, &sig, &src, &l);
            cr_assert_eq(kt_source_param(src.text, "row_tiles"), 1, "%s", sig);
            cr_assert_eq(kt_source_param(src.text, "k_split"), shapes[s].k_split, "%s", sig);
            cr_assert_eq(l.grid[0], shapes[s].grid, "%s", sig);
            const unsigned warps = (unsigned)shapes[s].warps, smem = fs[f].smem / 4 * warps;
            cr_assert_eq(kt_source_param(src.text, "warps"), warps, "%s", sig);
            cr_assert_eq(kt_source_param(src.text, "stages"), 3, "%s", sig);
            cr_assert_eq(l.block[0], 32 * warps, "%s", sig);
            cr_assert_eq(kt_source_param(src.text, "smem"), smem, "%s", sig);
            /* launches within a wave ask for more: see
             * tc_launches_overlap_their_predecessor_on_sm_90 */
            cr_assert_geq(l.smem, smem, "%s", sig);
            cr_assert(l.overlap, "%s", sig);
            if (shapes[s].n >= 4096)
                cr_assert_geq(l.grid[0] * warps, 1024, "%s", sig);
            kiln_kernel_source_free(&src);
        }
}

/* From two tokens on, a 4-bit format's stage holds 4 atoms, and K splits
 * only while the launch has fewer than 2048 warps: 28672 x 4096 at tc2 is
 * 1792 row tiles in 2 slices of 32 atoms. Formats of two atoms a stage or
 * fewer split on to 4096 warps, like every format at one token. */
Test(gemv_tc, split_stops_sooner_for_4_bit_from_two_tokens)
{
    static const struct {
        kiln_format f;
        const char *variant;
        int64_t m;
        int k_split;
    } cases[] = {
        { KILN_FMT_Q4_0, "tc2", 2, 2 },       { KILN_FMT_NVFP4, "tc4", 4, 2 },
        { KILN_FMT_Q4_K, "tc2", 2, 2 },       { KILN_FMT_FP8_TENSOR, "tc2", 2, 4 },
        { KILN_FMT_Q8_0, "tc4", 4, 4 },       { KILN_FMT_BF16, "tc2", 2, 4 },
        { KILN_FMT_Q4_0, "tc1", 1, 4 },
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        char sig[512];
        kiln_kernel_source src;
        kiln_launch l;
        h200_tc(cases[i].f, cases[i].variant, 28672, 4096, cases[i].m, &sig, &src, &l);
        cr_assert_eq(kt_source_param(src.text, "k_split"), cases[i].k_split, "%s", sig);
        cr_assert_eq(l.grid[0], 1792u / (4 / cases[i].k_split), "%s", sig);
        kiln_kernel_source_free(&src);
    }
}

/* 16 tokens on the H200 decode shapes, worked by hand. N >= 8192 is wide:
 * 4 row tiles a warp for the 4-bit formats, and a launch that fills 1024
 * warps, no more. 8192 x 28672 is 128 row groups: 4-warp blocks split 4
 * ways would be 512 warps, so blocks take 8 and split 8 ways. 28672 x 4096
 * is 448 row groups: split 2 ways, 896 warps. Q6_K keeps 2 row tiles and
 * splits while under 2048 warps. 4096 x 14336 is not wide: 2 row tiles, 8
 * warps, 128 row groups split 8 ways. */
Test(gemv_tc, tc16_fills_one_wave_of_an_h200)
{
    static const struct {
        kiln_format f;
        int64_t n, k;
        int row_tiles, warps, k_split;
        unsigned grid;
    } cases[] = {
        { KILN_FMT_Q4_0, 8192, 28672, 4, 8, 8, 128 },
        { KILN_FMT_NVFP4, 8192, 28672, 4, 8, 8, 128 },
        { KILN_FMT_Q4_0, 28672, 4096, 4, 4, 2, 224 },
        { KILN_FMT_Q4_K, 28672, 4096, 4, 4, 2, 224 },
        { KILN_FMT_Q6_K, 28672, 4096, 2, 4, 4, 896 },
        { KILN_FMT_Q4_0, 4096, 14336, 2, 8, 8, 128 },
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        char sig[512];
        kiln_kernel_source src;
        kiln_launch l;
        h200_tc(cases[i].f, "tc16", cases[i].n, cases[i].k, 16, &sig, &src, &l);
        cr_assert_eq(kt_source_param(src.text, "row_tiles"), cases[i].row_tiles, "%s", sig);
        cr_assert_eq(kt_source_param(src.text, "warps"), cases[i].warps, "%s", sig);
        cr_assert_eq(kt_source_param(src.text, "k_split"), cases[i].k_split, "%s", sig);
        cr_assert_eq(l.grid[0], cases[i].grid, "%s", sig);
        cr_assert_eq(l.block[0], 32u * cases[i].warps, "%s", sig);
        kiln_kernel_source_free(&src);
    }
}

/* ------------------------------------------------------- weight layout */

/* Every variant reads the packed layout, of kiln_gemv_pack_bytes' sizes,
 * named gemv_tc; a linear it does not serve has no layout of its. */
Test(gemv_tc, layout_is_packed)
{
    static const char *const classes[] = { "tc1", "tc8", "tc16" };
    static const int64_t shapes[][2] = { { 4096, 4096 }, { 200, 768 }, { 1000, 512 }, { 7, 256 } };
    static const char *const arches[] = { "sm_80", "sm_89", "sm_90a" };
    for (size_t a = 0; a < KILN_ARRAY_LEN(arches); a++)
        for (size_t s = 0; s < KILN_ARRAY_LEN(shapes); s++)
            for (int f = 0; f < TC_FORMATS_END; f++) {
                kiln_target t = target(arches[a]);
                kiln_linear_kernel k = { .cfg = cfg((kiln_format)f, shapes[s][0], shapes[s][1]),
                                         .act = KILN_ACT_BF16 };
                kiln_weight_layout lay;
                if (!kiln_gemv_tc_serves(&t, (kiln_format)f, shapes[s][0], shapes[s][1])) {
                    snprintf(k.variant, sizeof k.variant, "tc1");
                    cr_assert_eq(tc->layout(&t, &k, &lay), KILN_ERR_UNSUPPORTED);
                    cr_assert(strstr(kiln_last_error(), "gemv_tc: no packed layout: "), "%s",
                              kiln_last_error());
                    continue;
                }
                size_t data, scale;
                cr_assert_eq(kiln_gemv_pack_bytes((kiln_format)f, shapes[s][0], shapes[s][1],
                                                  &data, &scale),
                             KILN_OK, "%s", kiln_last_error());
                cr_assert_gt(data, 0);
                for (size_t v = 0; v < KILN_ARRAY_LEN(classes); v++) {
                    snprintf(k.variant, sizeof k.variant, "%s", classes[v]);
                    memset(&lay, 0, sizeof lay);
                    cr_assert_eq(tc->layout(&t, &k, &lay), KILN_OK, "%s", kiln_last_error());
                    cr_assert_not_null(lay.pack, "%s %s %s", arches[a],
                                       kiln_format_get((kiln_format)f)->name, classes[v]);
                    cr_assert_str_eq(lay.name, "gemv_tc");
                    cr_assert_eq(lay.data_bytes, data, "%s", classes[v]);
                    cr_assert_eq(lay.scale_bytes, scale, "%s", classes[v]);
                }
            }
    /* No layout on sm_75, which gemv_tc does not run on. */
    kiln_target t = target("sm_75");
    kiln_linear_kernel k = { .cfg = cfg(KILN_FMT_Q4_K, 4096, 4096), .act = KILN_ACT_BF16 };
    snprintf(k.variant, sizeof k.variant, "tc1");
    kiln_weight_layout lay;
    cr_assert_eq(tc->layout(&t, &k, &lay), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "needs sm_80 or newer"), "%s", kiln_last_error());
}

/* The function that packs gemv_tc's layout, as its layout hook gives it. */
static kiln_pack_fn tc_pack(void)
{
    kiln_target t = target("sm_89");
    kiln_linear_kernel k = { .cfg = cfg(KILN_FMT_F16, 4096, 4096), .act = KILN_ACT_BF16 };
    snprintf(k.variant, sizeof k.variant, "tc8");
    kiln_weight_layout lay = { 0 };
    cr_assert_eq(tc->layout(&t, &k, &lay), KILN_OK, "%s", kiln_last_error());
    cr_assert_not_null(lay.pack);
    return lay.pack;
}

/* pack writes what kiln_gemv_pack writes, and refuses a weight gemv_tc
 * does not serve on the target: it stays in kiln's storage layout. */
Test(gemv_tc, pack_serves_what_the_kernel_serves)
{
    enum { N = 40, K = 256 };
    kt_rng rng = kt_rng_new(11);
    static float w[N * K];
    kt_fill_normal(&rng, w, N * K, 1.0f);
    static const kiln_format fs[] = { KILN_FMT_BF16, KILN_FMT_NVFP4, KILN_FMT_Q4_K,
                                      KILN_FMT_Q6_K };
    kiln_target t = target("sm_89");
    const kiln_pack_fn pack = tc_pack();
    for (size_t f = 0; f < KILN_ARRAY_LEN(fs); f++) {
        size_t qd, qs, pd, ps;
        cr_assert_eq(kiln_format_data_bytes(fs[f], N, K, &qd), KILN_OK);
        cr_assert_eq(kiln_format_scale_bytes(fs[f], N, K, &qs), KILN_OK);
        kiln_qtensor q = { .format = fs[f], .n = N, .k = K, .data = malloc(qd),
                           .scale = malloc(qs ? qs : 1) };
        cr_assert(q.data && q.scale);
        cr_assert_eq(kiln_quantize(w, &q), KILN_OK, "%s", kiln_last_error());
        cr_assert_eq(kiln_gemv_pack_bytes(fs[f], N, K, &pd, &ps), KILN_OK);
        unsigned char *a = malloc(pd + ps + 1), *b = malloc(pd + ps + 1);
        cr_assert(a && b);
        memset(a, 0x5A, pd + ps + 1);
        memset(b, 0xA5, pd + ps + 1);
        cr_assert_eq(pack(&t, &q, a, a + pd), KILN_OK, "%s", kiln_last_error());
        cr_assert_eq(kiln_gemv_pack(&q, b, b + pd), KILN_OK, "%s", kiln_last_error());
        cr_assert_eq(memcmp(a, b, pd + ps), 0, "%s", kiln_format_get(fs[f])->name);
        cr_assert_eq(a[pd + ps], 0x5A, "nothing past the sizes layout gives");
        free(a);
        free(b);
        free(q.data);
        free(q.scale);
    }

    static char buf[1 << 16];
    static const struct {
        const char *arch;
        kiln_format f;
        int64_t k;
    } refused[] = {
        { "sm_75", KILN_FMT_BF16, 256 },  { "t4", KILN_FMT_Q4_K, 256 },
        { "sm_90a", KILN_FMT_F32, 256 },  { "sm_80", KILN_FMT_F16, 256 + 8 },
        { "sm_89", KILN_FMT_Q8_0, 96 },
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(refused); i++) {
        t = target(refused[i].arch);
        kiln_qtensor q = { .format = refused[i].f, .n = 16, .k = refused[i].k, .data = buf,
                           .scale = buf };
        cr_assert_eq(pack(&t, &q, buf, buf), KILN_ERR_UNSUPPORTED, "case %zu", i);
        cr_assert(strstr(kiln_last_error(), "keeps the storage layout"), "%s", kiln_last_error());
        cr_assert(strstr(kiln_last_error(), t.name), "%s", kiln_last_error());
        cr_assert(strstr(kiln_last_error(), kiln_format_get(refused[i].f)->name), "%s",
                  kiln_last_error());
    }
}

/* ---------------------------------------------------------------- NVRTC */

/* Every format gemv_tc serves in each of its classes, three shapes taking
 * turns: 4096 x 4096 splits K over all the warps of a block, 200 x 768
 * and 1000 x 512 in two and end on a partial row tile. tc16's 8 warps do
 * not fit sm_89 (101376 bytes): its twelve run 4 warps, Q4_K's 2; on
 * sm_80 (166912) six of them halve, BF16 and the 4-bit formats at their
 * shapes here. Each template checks the shared memory the host computed.
 * The epilogue rotates through all five fusions. */
static void compile_every_class(const char *arch)
{
    static const unsigned epilogues[] = {
        0, KILN_EPI_BIAS, KILN_EPI_BIAS | KILN_EPI_RESIDUAL, KILN_EPI_SILU_MUL,
        KILN_EPI_BIAS | KILN_EPI_SILU_MUL, KILN_EPI_SILU_MUL | KILN_EPI_GATE,
    };
    static const struct {
        const char *name;
        int64_t m;
    } classes[] = { { "tc1", 1 }, { "tc2", 2 }, { "tc4", 4 }, { "tc8", 8 }, { "tc16", 16 } };
    static const int64_t shapes[][2] = { { 4096, 4096 }, { 200, 768 }, { 1000, 512 } };
    kiln_target t = target(arch);
    kt_batch b = { 0 };
    int halved = 0;
    for (int f = 0; f < TC_FORMATS_END; f++)
        for (int v = 0; v < (int)KILN_ARRAY_LEN(classes); v++) {
            const int64_t *shape = shapes[(f + v) % 3];
            kiln_linear_cfg c = cfg((kiln_format)f, shape[0], shape[1]);
            char why[256], sig[512];
            if (f == KILN_FMT_F32 || kiln_format_get((kiln_format)f)->grouped) {
                cr_assert_eq(tc->can_implement(&t, &c, classes[v].m, why, sizeof why), 0);
                continue;
            }
            cr_assert_eq(tc->can_implement(&t, &c, classes[v].m, why, sizeof why), 1, "%s", why);
            kiln_backend_variant(tc, &t, &c, classes[v].m, sig, sizeof sig);
            cr_assert_str_eq(sig, classes[v].name);
            kt_batch_add(&b, tc_sig(sig, sizeof sig, classes[v].name, (kiln_format)f,
                                 epilogues[(f + v) % 6], shape[0], shape[1], arch));
            halved += kt_source_param(b.src[b.n - 1].text, "warps") < (classes[v].m == 16 ? 8 : 4);
        }
    /* Thirteen formats in five classes. */
    cr_assert_eq(b.n, 5 * (TC_FORMATS_END - 1), "%s", arch);
    cr_assert_eq(halved, t.sm == 89 ? 13 : t.sm == 80 ? 7 : 0, "%s", arch);
    char what[64];
    snprintf(what, sizeof what, "%s gemv_tc", arch);
    kt_batch_compile(&b, what);
}

Test(gemv_tc_nvrtc, every_format_and_class_compiles_for_sm_80, .timeout = 600)
{
    compile_every_class("sm_80");
}

Test(gemv_tc_nvrtc, every_format_and_class_compiles_for_sm_89, .timeout = 600)
{
    compile_every_class("sm_89");
}

Test(gemv_tc_nvrtc, every_format_and_class_compiles_for_sm_90a, .timeout = 600)
{
    compile_every_class("sm_90a");
}
