/* The emitter: generated sources are stable (golden text), a plan's
 * descriptors emit what their text does, what has no template is refused,
 * and the simt backend's capability rules. Signatures are
 * tests/codegen/test_sig.c's, compiling tests/codegen/test_nvrtc.c's. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/emit.h"
#include "codegen/plan.h"
#include "testutil.h"

#define Q4K_SIG                                                                                    \
    "linear backend=simt variant=t64x64 format=q4_k scales=inline act=bf16 n=4096 k=14336 "       \
    "epilogue=bias+residual out=bf16 target=sm_90a"

/* A simt linear on sm_80 with the fields that vary. */
#define SIMT(variant, format, act, n, k, epilogue)                                                 \
    "linear backend=simt variant=" variant " format=" format " scales=x act=" act " n=" n        \
    " k=" k " epilogue=" epilogue " out=bf16 target=sm_80"

static const kiln_registry *reg(void) { return kiln_registry_default(); }

static kiln_kernel_source emit_ok(const char *sig)
{
    kiln_kernel_source s;
    cr_assert_eq(kiln_emit_text(reg(), sig, &s), KILN_OK, "%s: %s", sig, kiln_last_error());
    return s;
}

/* ------------------------------------------------------------- golden */

/* A golden source names the templates' digest where its %s is. */
static char *golden_text(const char *golden)
{
    static char buf[4096];
    snprintf(buf, sizeof buf, golden, kiln_emit_templates_digest());
    return buf;
}

Test(emit, linear_source_is_stable)
{
    static const char golden[] =
        "// kiln kernel, generated from its signature: the logic is in the included template.\n"
        "// signature: " Q4K_SIG "\n"
        "// templates: %s\n"
        "// cache key: ________________________________\n"
        "#include \"kiln/simt.cuh\"\n"
        "\n"
        "using format = kiln::fmt_q4_k;\n"
        "using tile = kiln::simt_tile</*bm*/ 64, /*bn*/ 64, /*bk*/ 32, /*tm*/ 4, /*tn*/ 4>;\n"
        "using epilogue = kiln::epilogue</*bias*/ true, /*residual*/ true, /*silu_mul*/ false>;\n"
        "\n"
        "extern \"C\" __global__ void __launch_bounds__(tile::threads)\n"
        "kiln_simt_158627c8c69de24f(const kiln_linear_args args)\n"
        "{\n"
        "    kiln::simt_gemm<format, tile, epilogue, /*n*/ 4096, /*k*/ 14336>(args);\n"
        "}\n";
    kiln_kernel_source s = emit_ok(Q4K_SIG);
    cr_assert_str_eq(s.text, golden_text(golden));
    cr_assert_eq(s.length, strlen(golden_text(golden)));
    cr_assert_str_eq(s.desc.entry, "kiln_simt_158627c8c69de24f");
    kiln_kernel_source_free(&s);
    kiln_kernel_source_free(&s); /* idempotent */
    kiln_kernel_source_free(NULL);
}

Test(emit, aux_sources_are_stable)
{
    static const char golden_norm[] =
        "// kiln kernel, generated from its signature: the logic is in the included template.\n"
        "// signature: op rms_norm width=4096 target=sm_90a\n"
        "// templates: %s\n"
        "// cache key: ________________________________\n"
        "#include \"kiln/elementwise.cuh\"\n"
        "\n"
        "extern \"C\" __global__ void __launch_bounds__(KILN_ROW_THREADS)\n"
        "kiln_rms_norm_24a180e41c08795b(const kiln_op_args args)\n"
        "{\n"
        "    kiln::grid_launch_dependents();\n"
        "    kiln::rms_norm</*width*/ 4096>(args);\n"
        "}\n";
    static const char golden_tensor[] =
        "// kiln kernel, generated from its signature: the logic is in the included template.\n"
        "// signature: quant act=fp8-tensor k=4096 target=sm_90a\n"
        "// templates: %s\n"
        "// cache key: ________________________________\n"
        "#include \"kiln/elementwise.cuh\"\n"
        "\n"
        "extern \"C\" __global__ void __launch_bounds__(KILN_ROW_THREADS)\n"
        "kiln_quant_14883eb009f465c9_amax(const kiln_quant_args args)\n"
        "{\n"
        "    kiln::grid_launch_dependents();\n"
        "    kiln::quant_fp8_tensor_amax</*k*/ 4096>(args);\n"
        "}\n"
        "\n"
        "extern \"C\" __global__ void __launch_bounds__(KILN_ROW_THREADS)\n"
        "kiln_quant_14883eb009f465c9(const kiln_quant_args args)\n"
        "{\n"
        "    kiln::grid_launch_dependents();\n"
        "    kiln::quant_fp8_tensor</*k*/ 4096>(args);\n"
        "}\n";
    kiln_kernel_source s = emit_ok("op rms_norm width=4096 target=sm_90a");
    cr_assert_str_eq(s.text, golden_text(golden_norm));
    kiln_kernel_source_free(&s);
    s = emit_ok("quant act=fp8-tensor k=4096 target=sm_90a");
    cr_assert_str_eq(s.text, golden_text(golden_tensor));
    kiln_kernel_source_free(&s);
}

/* Every op, scheme, format and epilogue reaches the source as the
 * template arguments that stand for it. */
Test(emit, sources_carry_their_parameters)
{
    static const struct {
        const char *sig, *want;
    } cases[] = {
        { "op add width=7 target=sm_75",
          "kiln::elementwise<kiln::add_fn, /*binary*/ true, /*width*/ 7>" },
        { "op mul width=7 target=sm_75",
          "kiln::elementwise<kiln::mul_fn, /*binary*/ true, /*width*/ 7>" },
        { "op silu width=7 target=sm_75",
          "kiln::elementwise<kiln::silu_fn, /*binary*/ false, /*width*/ 7>" },
        { "op gelu width=7 target=sm_75",
          "kiln::elementwise<kiln::gelu_fn, /*binary*/ false, /*width*/ 7>" },
        { "quant act=fp8-token k=9 target=sm_80", "kiln::quant_fp8_token</*k*/ 9>" },
        { "quant act=fp8-1x128 k=9 target=sm_80",
          "kiln::quant_fp8_groups</*k*/ 9, /*group*/ 128, /*mx*/ false>" },
        { "quant act=mxfp8-1x32 k=9 target=sm_80",
          "kiln::quant_fp8_groups</*k*/ 9, /*group*/ 32, /*mx*/ true>" },
        { "quant act=fp8-static k=9 target=sm_90a", "kiln::quant_fp8_static</*k*/ 9>" },
        { "quant act=bf16-qdq k=9 target=sm_75", "kiln::quant_bf16_qdq</*k*/ 9>" },
        { SIMT("t16x64", "nvfp4", "bf16", "3", "32", "none"), "using format = kiln::fmt_nvfp4;" },
        { SIMT("t16x64", "nvfp4", "bf16", "3", "32", "none"),
          "/*bias*/ false, /*residual*/ false, /*silu_mul*/ false" },
        { SIMT("t128x128", "fp8_block", "bf16", "3", "5", "bias+silu_mul"),
          "/*bias*/ true, /*residual*/ false, /*silu_mul*/ true" },
        { SIMT("t128x128", "fp8_block", "bf16", "3", "5", "bias+silu_mul"),
          "kiln::simt_tile</*bm*/ 128, /*bn*/ 128, /*bk*/ 16, /*tm*/ 8, /*tn*/ 8>" },
        { SIMT("t64x64", "q6_k", "bf16", "3", "256", "residual"), "/*n*/ 3, /*k*/ 256>" },
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        kiln_kernel_source s = emit_ok(cases[i].sig);
        cr_assert(strstr(s.text, cases[i].want), "%s\nlacks %s:\n%s", cases[i].sig, cases[i].want,
                  s.text);
        kiln_kernel_source_free(&s);
    }
}

/* ---------------------------------------------------------------- errors */

/* Text from outside is parsed first: its errors come back as they are. */
Test(emit, text_that_does_not_parse_is_refused)
{
    static const struct {
        const char *sig;
        kiln_status want;
    } cases[] = {
        { "", KILN_ERR_MALFORMED },
        { "op nosuch width=8 target=sm_80", KILN_ERR_NOT_FOUND },
        { "linear backend=simt variant=t16x64 format=q4_0 scales=x act=bf16 n=8 k=32 epilogue=none "
          "out=f32 target=sm_80",
          KILN_ERR_UNSUPPORTED },
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        kiln_kernel_source s = { .text = NULL };
        cr_assert_eq(kiln_emit_text(reg(), cases[i].sig, &s), cases[i].want, "\"%s\": %s",
                     cases[i].sig, kiln_last_error());
        cr_assert_null(s.text, "out is untouched on failure");
    }
    kiln_kernel_desc d;
    kiln_kernel_source s = { .text = NULL };
    cr_assert_eq(kiln_sig_parse(reg(), Q4K_SIG, &d), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_emit_text(reg(), Q4K_SIG, NULL), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_emit(&d, Q4K_SIG, NULL), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_emit(&d, NULL, &s), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_emit(NULL, Q4K_SIG, &s), KILN_ERR_INVALID_ARG);
    cr_assert_null(s.text);
}

/* A planning-only backend, as tests register them. */
static int any_target(const kiln_target *t, char *why, size_t n)
{
    (void)t, (void)why, (void)n;
    return 1;
}

static int any_shape(const kiln_target *t, const kiln_linear_cfg *c, int64_t m, char *why, size_t n)
{
    (void)t, (void)c, (void)m, (void)why, (void)n;
    return 1;
}

static const kiln_backend planning_only = {
    .name = "plan",
    .formats = 1u << KILN_FMT_BF16,
    .is_supported = any_target,
    .can_implement = any_shape,
};

Test(emit, kernels_without_a_template_are_unsupported)
{
    static const char *const cases[] = {
        SIMT("t8x8", "q4_0", "bf16", "8", "32", "none"),
        SIMT("t16x64", "q4_0", "fp8-token", "8", "32", "none"),
        SIMT("t16x64", "q4_0", "bf16", "8", "32", "residual+silu_mul"),
        "op linear width=8 target=sm_80",
        "op input width=8 target=sm_80",
        "quant act=bf16 k=8 target=sm_80",
        "op add width=2147483648 target=sm_80",
        "quant act=fp8-token k=2147483648 target=sm_80",
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        kiln_kernel_source s = { .text = NULL };
        cr_assert_eq(kiln_emit_text(reg(), cases[i], &s), KILN_ERR_UNSUPPORTED, "\"%s\": %s",
                     cases[i], kiln_last_error());
        cr_assert_null(s.text);
    }
    kiln_registry r = { .backends = { &planning_only }, .n = 1 };
    kiln_kernel_source s = { .text = NULL };
    const char *sig = "linear backend=plan variant=default format=bf16 scales=none act=bf16 n=8 "
                      "k=8 epilogue=none out=bf16 target=sm_80";
    cr_assert_eq(kiln_emit_text(&r, sig, &s), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "no code hooks"), "%s", kiln_last_error());
    kiln_kernel_desc d;
    cr_assert_eq(kiln_sig_parse(&r, sig, &d), KILN_OK);
    kiln_kernel_launch l[KILN_MAX_LAUNCHES];
    int n;
    cr_assert_eq(kiln_kernel_launches(&d, 4, l, &n), KILN_ERR_UNSUPPORTED);
}

Test(simt, emit_refuses_a_buffer_too_small)
{
    kiln_target t;
    cr_assert_eq(kiln_target_from_name("sm_80", &t), KILN_OK);
    kiln_linear_kernel k = { .cfg = { .format = KILN_FMT_Q8_0, .n = 64, .k = 64 },
                             .act = KILN_ACT_BF16, .variant = "t64x64" };
    char buf[64];
    cr_assert_eq(kiln_backend_simt.emit(&t, &k, "kiln_simt_0", buf, sizeof buf),
                 KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "the buffer has 64"), "%s", kiln_last_error());
}

/* ------------------------------------------------------------ cache key */

Test(emit, the_key_fills_its_placeholder_once)
{
    kiln_kernel_source s = emit_ok(Q4K_SIG);
    char *before = strdup(s.text);
    const char *key = "0123456789abcdef0123456789abcdef";
    cr_assert_eq(kiln_emit_set_key(s.text, key), KILN_OK, "%s", kiln_last_error());
    cr_assert(strstr(s.text, "// cache key: 0123456789abcdef0123456789abcdef\n"), "%s", s.text);
    cr_assert_eq(strlen(s.text), strlen(before));
    cr_assert_eq(kiln_emit_set_key(s.text, key), KILN_ERR_INVALID_ARG);
    free(before);
    kiln_kernel_source_free(&s);

    s = emit_ok(Q4K_SIG);
    static const char *const bad[] = { "0123", "0123456789ABCDEF0123456789ABCDEF",
                                       "0123456789abcdef0123456789abcdefg",
                                       "0123456789abcdef0123456789abcdeg" };
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++)
        cr_assert_eq(kiln_emit_set_key(s.text, bad[i]), KILN_ERR_INVALID_ARG, "%s", bad[i]);
    cr_assert_eq(kiln_emit_set_key(NULL, key), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(s.text, KILN_EMIT_KEY_PLACEHOLDER), "refused keys change nothing");
    kiln_kernel_source_free(&s);
}

/* ---------------------------------------------------- the simt backend */

static kiln_target target(const char *name)
{
    kiln_target t;
    cr_assert_eq(kiln_target_from_name(name, &t), KILN_OK, "%s", kiln_last_error());
    return t;
}

Test(simt, runs_on_sm_75_and_newer)
{
    char why[128] = "";
    for (const char *const *n = kiln_target_names(); *n; n++) {
        kiln_target t = target(*n);
        cr_assert_eq(kiln_backend_simt.is_supported(&t, why, sizeof why), 1, "%s", *n);
    }
    kiln_target old = { .name = "sm_70", .sm = 70 };
    cr_assert_eq(kiln_backend_simt.is_supported(&old, why, sizeof why), 0);
    cr_assert_str_eq(why, "needs sm_75 or newer, target is sm_70");
}

Test(simt, takes_every_format_and_epilogue_with_bf16_activations)
{
    cr_assert_eq(kiln_backend_simt.formats, (1u << KILN_FMT_COUNT) - 1);
    cr_assert_eq(kiln_backend_simt.epilogues,
                 KILN_EPI_BIAS | KILN_EPI_RESIDUAL | KILN_EPI_SILU_MUL);
    kiln_target t = target("sm_90a");
    char why[128];
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        kiln_linear_cfg c = { .format = (kiln_format)f, .n = 4096, .k = 4096 };
        cr_assert_eq(kiln_backend_simt.can_implement(&t, &c, 512, why, sizeof why), 1);
        cr_assert_eq(kiln_backend_act(&kiln_backend_simt, &t, &c, 512), KILN_ACT_BF16);
    }
}

Test(simt, refuses_shapes_past_its_indexing)
{
    kiln_target t = target("sm_80");
    char why[128];
    kiln_linear_cfg c = { .format = KILN_FMT_BF16, .n = (int64_t)INT_MAX + 1, .k = 64 };
    cr_assert_eq(kiln_backend_simt.can_implement(&t, &c, 1, why, sizeof why), 0);
    cr_assert(strstr(why, "2^31"), "%s", why);
    c = (kiln_linear_cfg){ .format = KILN_FMT_BF16, .n = 64, .k = (int64_t)INT_MAX + 1 };
    cr_assert_eq(kiln_backend_simt.can_implement(&t, &c, 1, why, sizeof why), 0);
    c.k = 64;
    cr_assert_eq(kiln_backend_simt.can_implement(&t, &c, 128 * 65535, why, sizeof why), 1);
    cr_assert_eq(kiln_backend_simt.can_implement(&t, &c, 128 * 65535 + 1, why, sizeof why), 0);
    cr_assert(strstr(why, "rows"), "%s", why);
}

Test(simt, variants_follow_the_bucket)
{
    static const struct {
        int64_t m;
        const char *variant;
    } cases[] = {
        { 1, "t16x64" }, { 16, "t16x64" }, { 17, "t64x64" }, { 64, "t64x64" },
        { 65, "t128x128" }, { 512, "t128x128" }, { 100000, "t128x128" },
    };
    kiln_target t = target("sm_89");
    kiln_linear_cfg c = { .format = KILN_FMT_Q4_0, .n = 4096, .k = 4096 };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        char v[64];
        kiln_backend_variant(&kiln_backend_simt, &t, &c, cases[i].m, v, sizeof v);
        cr_assert_str_eq(v, cases[i].variant, "m=%lld", (long long)cases[i].m);
    }
}

/* The default registry plans with simt where neither a decode backend
 * (gemv_tc, gemv: M buckets up to 16) nor wgmma runs (sm_80: wgmma needs
 * sm_90a), and every signature of the plan (linears, ops) emits. On sm_80
 * gemv_tc runs a class for each decode bucket (tc1, tc2, tc4, tc8, tc16),
 * K being whole atoms of 64, fp8-block (E4M3) too: each linear has five
 * gemv_tc kernels and none of gemv. */
Test(simt, default_plans_emit)
{
    cr_assert_eq(kiln_registry_find(kiln_registry_default(), "simt"), &kiln_backend_simt);
    kt_rng rng = kt_rng_new(7);
    enum { D = 256, F = 512 };
    static uint8_t wdata[F * D], scale[4096];
    static float norm[D];
    kt_fill_normal(&rng, norm, D, 1.0f);
    kiln_graph *g;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    kiln_tensor *x, *nw, *h, *wg, *wu, *wd, *gate, *up, *act, *prod, *down, *out;
    kiln_qtensor qg = { .format = KILN_FMT_Q4_K, .n = F, .k = D, .data = wdata };
    kiln_qtensor qu = { .format = KILN_FMT_NVFP4, .n = F, .k = D, .data = wdata, .scale = scale };
    kiln_qtensor qd = { .format = KILN_FMT_FP8_BLOCK, .n = D, .k = F, .data = wdata,
                        .scale = scale };
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
    kiln_target t = target("a100");
    kiln_plan *p;
    cr_assert_eq(kiln_plan_create(g, &t, NULL, &p), KILN_OK, "%s", kiln_last_error());
    int linears = 0, fused = 0, simt = 0, f32 = 0, tc = 0;
    for (int i = 0; i < kiln_plan_n_signatures(p); i++) {
        const char *sig = kiln_plan_signature(p, i);
        kiln_kernel_source s, from_text = emit_ok(sig);
        /* the build emits the plan's descriptor: the source its text gives */
        cr_assert_eq(kiln_emit(&p->signatures[i].desc, sig, &s), KILN_OK, "%s: %s", sig,
                     kiln_last_error());
        cr_assert_str_eq(s.text, from_text.text);
        cr_assert_eq(s.length, from_text.length);
        cr_assert_str_eq(s.desc.entry, from_text.desc.entry);
        kiln_kernel_source_free(&from_text);
        if (s.desc.kind == KILN_STEP_LINEAR) {
            linears++;
            simt += s.desc.backend == &kiln_backend_simt;
            f32 += s.desc.backend == &kiln_backend_gemv;
            tc += s.desc.backend == &kiln_backend_gemv_tc;
        }
        fused += strstr(sig, "silu_mul") || strstr(sig, "residual");
        kiln_kernel_source_free(&s);
    }
    cr_assert_eq(linears, 3 * 7, "five gemv_tc kernels and two simt tiles a linear");
    cr_assert_eq(simt, 3 * 2, "two simt tiles a linear");
    cr_assert_eq(f32, 0, "one token of every format on tc1");
    cr_assert_eq(tc, 3 * 5, "tc1 to tc16 for every linear");
    cr_assert_eq(fused, 7 + 7, "up absorbs silu·mul, down the residual, in every variant");
    kiln_plan_destroy(p);
    kiln_graph_destroy(g);
}

/* The key covers the templates: every source names their digest. */
Test(emit, sources_name_the_templates_digest)
{
    const char *d = kiln_emit_templates_digest();
    char line[64];
    snprintf(line, sizeof line, "// templates: %s\n", d);
    kiln_kernel_source a = emit_ok(Q4K_SIG), b = emit_ok("op rms_norm width=4096 target=sm_90a");
    cr_assert(strstr(a.text, line), "%s", a.text);
    cr_assert(strstr(b.text, line), "%s", b.text);
    kiln_kernel_source_free(&a);
    kiln_kernel_source_free(&b);
}
