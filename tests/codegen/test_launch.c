/* Launches: a linear's from its backend cover its output, row kernels take
 * a block per row, an fp8-tensor quantizer runs the amax kernel its source
 * holds first, and impossible token counts are refused. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "codegen/emit.h"
#include "kernels/common/kiln_args.h"

static const kiln_registry *reg(void) { return kiln_registry_default(); }

/* A simt linear on sm_80 with the fields that vary. */
#define SIMT(variant, format, act, n, k, epilogue)                                                 \
    "linear backend=simt variant=" variant " format=" format " scales=x act=" act " n=" n        \
    " k=" k " epilogue=" epilogue " out=bf16 target=sm_80"

static void launches(const char *sig, int64_t m, kiln_kernel_launch *l, int *n)
{
    kiln_kernel_desc d;
    cr_assert_eq(kiln_sig_parse(reg(), sig, &d), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_kernel_launches(&d, m, l, n), KILN_OK, "%s", kiln_last_error());
}

Test(launch, simt_launches_cover_the_output)
{
    static const struct {
        const char *variant;
        int64_t m;
        unsigned gx, gy, threads;
    } cases[] = {
        { "t16x64", 1, 63, 1, 256 },   { "t16x64", 17, 63, 2, 256 },
        { "t64x64", 64, 63, 1, 256 },  { "t64x64", 65, 63, 2, 256 },
        { "t128x128", 512, 32, 4, 256 }, { "t128x128", 513, 32, 5, 256 },
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        char sig[256];
        snprintf(sig, sizeof sig,
                 "linear backend=simt variant=%s format=q8_0 scales=inline act=bf16 n=4000 k=4096 "
                 "epilogue=none out=bf16 target=sm_80",
                 cases[i].variant);
        kiln_kernel_launch l[KILN_MAX_LAUNCHES];
        int n = 0;
        launches(sig, cases[i].m, l, &n);
        cr_assert_eq(n, 1);
        kiln_kernel_desc d;
        kiln_sig_parse(reg(), sig, &d);
        cr_assert_str_eq(l[0].entry, d.entry);
        long long m = (long long)cases[i].m;
        cr_assert_eq(l[0].cfg.grid[0], cases[i].gx, "%s m=%lld", cases[i].variant, m);
        cr_assert_eq(l[0].cfg.grid[1], cases[i].gy, "%s m=%lld", cases[i].variant, m);
        cr_assert_eq(l[0].cfg.grid[2], 1);
        cr_assert_eq(l[0].cfg.block[0], cases[i].threads);
        cr_assert_eq(l[0].cfg.block[1] * l[0].cfg.block[2], 1);
        cr_assert_eq(l[0].cfg.smem, 0);
    }
}

Test(launch, row_kernels_launch_a_block_per_row)
{
    kiln_kernel_launch l[KILN_MAX_LAUNCHES];
    int n = 0;
    launches("op rms_norm width=4096 target=sm_80", 37, l, &n);
    cr_assert_eq(n, 1);
    cr_assert_eq(l[0].cfg.grid[0], 37);
    cr_assert_eq(l[0].cfg.block[0], KILN_ROW_THREADS);
    launches("quant act=fp8-token k=4096 target=sm_80", 5, l, &n);
    cr_assert_eq(n, 1);
    cr_assert_eq(l[0].cfg.grid[0], 5);

    /* The per-tensor scale is reduced by a first kernel of fixed size. */
    kiln_kernel_desc d;
    cr_assert_eq(kiln_sig_parse(reg(), "quant act=fp8-tensor k=4096 target=sm_80", &d), KILN_OK);
    launches("quant act=fp8-tensor k=4096 target=sm_80", 300, l, &n);
    cr_assert_eq(n, 2);
    char amax[KILN_ENTRY_MAX + 8];
    snprintf(amax, sizeof amax, "%s_amax", d.entry);
    cr_assert_str_eq(l[0].entry, amax);
    cr_assert_eq(l[0].cfg.grid[0], KILN_QUANT_AMAX_PARTS);
    cr_assert_eq(l[0].cfg.block[0], KILN_ROW_THREADS);
    cr_assert_str_eq(l[1].entry, d.entry);
    cr_assert_eq(l[1].cfg.grid[0], 300);
}

Test(launch, launches_refuse_impossible_token_counts)
{
    kiln_kernel_desc d;
    kiln_kernel_launch l[KILN_MAX_LAUNCHES];
    int n;
    cr_assert_eq(kiln_sig_parse(reg(), "op add width=8 target=sm_80", &d), KILN_OK);
    cr_assert_eq(kiln_kernel_launches(&d, 0, l, &n), KILN_ERR_SHAPE);
    cr_assert_eq(kiln_kernel_launches(&d, (int64_t)INT_MAX + 1, l, &n), KILN_ERR_SHAPE);
    cr_assert_eq(kiln_kernel_launches(NULL, 1, l, &n), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_sig_parse(reg(), SIMT("t16x64", "bf16", "bf16", "8", "8", "none"), &d),
                 KILN_OK);
    cr_assert_eq(kiln_kernel_launches(&d, 16 * 65535, l, &n), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_kernel_launches(&d, 16 * 65535 + 1, l, &n), KILN_ERR_SHAPE);
    cr_assert(strstr(kiln_last_error(), d.entry), "%s", kiln_last_error());
    /* A variant that no longer exists cannot be launched either. */
    snprintf(d.linear.variant, sizeof d.linear.variant, "t1x1");
    cr_assert_eq(kiln_kernel_launches(&d, 1, l, &n), KILN_ERR_UNSUPPORTED);
}

/* Every launch names a kernel of the emitted source, the source's kernels
 * all launch, and the amax kernel is the one kiln_emit_quant_has_amax
 * says the source holds. */
Test(launch, quantizer_launches_are_the_kernels_of_its_source)
{
    for (int a = 0; a < KILN_ACT_COUNT; a++) {
        if (a == KILN_ACT_BF16)
            continue;
        char sig[128];
        snprintf(sig, sizeof sig, "quant act=%s k=4096 target=sm_90a", kiln_act_name((kiln_act)a));
        kiln_kernel_source s;
        cr_assert_eq(kiln_emit_text(reg(), sig, &s), KILN_OK, "%s: %s", sig, kiln_last_error());
        kiln_kernel_launch l[KILN_MAX_LAUNCHES];
        int n = 0;
        cr_assert_eq(kiln_kernel_launches(&s.desc, 8, l, &n), KILN_OK, "%s", kiln_last_error());
        cr_assert_eq(n, 1 + kiln_emit_quant_has_amax((kiln_act)a), "%s", sig);
        int kernels = 0;
        for (const char *p = s.text; (p = strstr(p, "__global__")); p++)
            kernels++;
        cr_assert_eq(kernels, n, "%s", s.text);
        for (int i = 0; i < n; i++) {
            char decl[256];
            snprintf(decl, sizeof decl, "\n%.*s(const ", (int)KILN_ENTRY_MAX, l[i].entry);
            cr_assert(strstr(s.text, decl), "%s launches %s:\n%s", sig, l[i].entry, s.text);
        }
        cr_assert_str_eq(l[n - 1].entry, s.desc.entry, "the entry runs last");
        kiln_kernel_source_free(&s);
    }
    cr_assert(kiln_emit_quant_has_amax(KILN_ACT_FP8_TENSOR));
    cr_assert_not(kiln_emit_quant_has_amax(KILN_ACT_FP8_TOKEN));
}
