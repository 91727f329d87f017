/* Signatures: one table prints descriptors and parses text back. The text
 * is byte for byte the form cache keys and shipped caches hold, every
 * plan's descriptors print as its signatures and parse back to themselves,
 * entry names are deterministic, and every malformed text is refused with
 * the right status and a message that quotes it. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "clirun.h"
#include "codegen/plan.h"

static const kiln_registry *reg(void) { return kiln_registry_default(); }

static kiln_target target(const char *name)
{
    kiln_target t;
    cr_assert_eq(kiln_target_from_name(name, &t), KILN_OK, "%s", kiln_last_error());
    return t;
}

static void print_ok(const kiln_kernel_desc *d, char text[KILN_SIG_MAX])
{
    cr_assert_eq(kiln_sig_print(d, text, KILN_SIG_MAX), KILN_OK, "%s", kiln_last_error());
}

/* Everything a descriptor of its kind means, entry included. */
static void assert_same_desc(const kiln_kernel_desc *a, const kiln_kernel_desc *b, const char *sig)
{
    cr_assert_eq(a->kind, b->kind, "%s", sig);
    cr_assert_str_eq(a->target.name, b->target.name, "%s", sig);
    cr_assert_eq(a->target.sm_count, b->target.sm_count, "%s", sig);
    cr_assert_eq(a->target.smem_optin, b->target.smem_optin, "%s", sig);
    cr_assert_str_eq(a->entry, b->entry, "%s", sig);
    switch (a->kind) {
    case KILN_STEP_LINEAR:
        cr_assert_eq(a->backend, b->backend, "%s", sig);
        cr_assert_str_eq(a->linear.variant, b->linear.variant, "%s", sig);
        cr_assert_eq(a->linear.cfg.format, b->linear.cfg.format, "%s", sig);
        cr_assert_eq(a->linear.cfg.n, b->linear.cfg.n, "%s", sig);
        cr_assert_eq(a->linear.cfg.k, b->linear.cfg.k, "%s", sig);
        cr_assert_eq(a->linear.cfg.epilogue, b->linear.cfg.epilogue, "%s", sig);
        cr_assert_eq(a->linear.cfg.group, b->linear.cfg.group, "%s", sig);
        cr_assert_eq(a->linear.act, b->linear.act, "%s", sig);
        break;
    case KILN_STEP_OP:
        cr_assert_eq(a->op, b->op, "%s", sig);
        cr_assert_eq(a->width, b->width, "%s", sig);
        break;
    case KILN_STEP_QUANT:
        cr_assert_eq(a->act, b->act, "%s", sig);
        cr_assert_eq(a->width, b->width, "%s", sig);
        break;
    case KILN_STEP_PACK:
        cr_assert_eq(a->linear.cfg.format, b->linear.cfg.format, "%s", sig);
        break;
    }
}

/* Text parses, prints back to itself, and parses to what it printed. */
static void assert_round_trip(const kiln_registry *r, const char *sig, kiln_kernel_desc *out)
{
    kiln_kernel_desc d, again;
    char text[KILN_SIG_MAX];
    cr_assert_eq(kiln_sig_parse(r, sig, &d), KILN_OK, "%s: %s", sig, kiln_last_error());
    print_ok(&d, text);
    cr_assert_str_eq(text, sig);
    cr_assert_eq(kiln_sig_parse(r, text, &again), KILN_OK);
    assert_same_desc(&d, &again, sig);
    if (out)
        *out = d;
}

/* ------------------------------------------------------- the old format */

static kiln_kernel_desc linear(const char *backend, const char *variant, kiln_format f,
                               kiln_act act, int64_t n, int64_t k, unsigned epi, const char *t)
{
    kiln_kernel_desc d = { .kind = KILN_STEP_LINEAR, .target = target(t),
                           .backend = kiln_registry_find(reg(), backend),
                           .linear = { .cfg = { .format = f, .n = n, .k = k, .epilogue = epi },
                                       .act = act } };
    cr_assert_not_null(d.backend, "%s", backend);
    snprintf(d.linear.variant, sizeof d.linear.variant, "%s", variant);
    return d;
}

/* Signatures as lowering printed them before the table: every scale form,
 * every epilogue form, the aux kinds. A change here is a new cache key for
 * every kernel, shipped caches included. */
Test(sig, prints_the_format_caches_hold)
{
    const struct {
        kiln_kernel_desc d;
        const char *want;
    } cases[] = {
        { linear("simt", "t64x64", KILN_FMT_Q4_K, KILN_ACT_BF16, 4096, 14336,
                 KILN_EPI_BIAS | KILN_EPI_RESIDUAL, "sm_90a"),
          "linear backend=simt variant=t64x64 format=q4_k scales=inline act=bf16 n=4096 k=14336 "
          "epilogue=bias+residual out=bf16 target=sm_90a" },
        { linear("gemv", "m1", KILN_FMT_FP8_BLOCK, KILN_ACT_BF16, 1536, 512, KILN_EPI_SILU_MUL,
                 "sm_75"),
          "linear backend=gemv variant=m1 format=fp8_block scales=f32:128x128 act=bf16 n=1536 "
          "k=512 epilogue=silu_mul out=bf16 target=sm_75" },
        { linear("gemv", "m1", KILN_FMT_FP8_CHANNEL, KILN_ACT_BF16, 1536, 512, 0, "sm_75"),
          "linear backend=gemv variant=m1 format=fp8_channel scales=f32:1xK act=bf16 n=1536 "
          "k=512 epilogue=none out=bf16 target=sm_75" },
        { linear("gemv", "m1", KILN_FMT_FP8_TENSOR, KILN_ACT_BF16, 1536, 512, 0, "sm_75"),
          "linear backend=gemv variant=m1 format=fp8 scales=f32:NxK act=bf16 n=1536 k=512 "
          "epilogue=none out=bf16 target=sm_75" },
        { linear("gemv_tc", "tc16", KILN_FMT_MXFP8, KILN_ACT_BF16, 1536, 512, KILN_EPI_BIAS,
                 "h200"),
          "linear backend=gemv_tc variant=tc16 format=mxfp8 scales=e8m0:1x32 act=bf16 n=1536 "
          "k=512 epilogue=bias out=bf16 target=sm_90a" },
        { linear("gemv_tc", "tc1", KILN_FMT_Q4_K, KILN_ACT_BF16, 14336, 4096,
                 KILN_EPI_SILU_MUL | KILN_EPI_GATE, "sm_90a"),
          "linear backend=gemv_tc variant=tc1 format=q4_k scales=inline act=bf16 n=14336 "
          "k=4096 epilogue=silu_mul+gate out=bf16 target=sm_90a" },
        { linear("gemv", "m1", KILN_FMT_NVFP4, KILN_ACT_BF16, 1536, 512, KILN_EPI_SILU_MUL,
                 "sm_75"),
          "linear backend=gemv variant=m1 format=nvfp4 scales=ue4m3:1x16+f32 act=bf16 n=1536 "
          "k=512 epilogue=silu_mul out=bf16 target=sm_75" },
        { linear("wgmma", "bm64bn64", KILN_FMT_F32, KILN_ACT_BF16, 512, 1536, KILN_EPI_RESIDUAL,
                 "sm_90a"),
          "linear backend=wgmma variant=bm64bn64 format=f32 scales=none act=bf16 n=512 k=1536 "
          "epilogue=residual out=bf16 target=sm_90a" },
        { linear("simt", "t16x64", KILN_FMT_FP8_BLOCK, KILN_ACT_FP8_G128, 7168, 2048,
                 KILN_EPI_BIAS | KILN_EPI_SILU_MUL, "sm_80"),
          "linear backend=simt variant=t16x64 format=fp8_block scales=f32:128x128 act=fp8-1x128 "
          "n=7168 k=2048 epilogue=bias+silu_mul out=bf16 target=sm_80" },
        { { .kind = KILN_STEP_OP, .target = target("sm_90a"), .op = KILN_OP_RMS_NORM,
            .width = 4096 },
          "op rms_norm width=4096 target=sm_90a" },
        { { .kind = KILN_STEP_OP, .target = target("t4"), .op = KILN_OP_MUL, .width = 1536 },
          "op mul width=1536 target=sm_75" },
        { { .kind = KILN_STEP_QUANT, .target = target("sm_90a"), .act = KILN_ACT_FP8_TENSOR,
            .width = 4096 },
          "quant act=fp8-tensor k=4096 target=sm_90a" },
        { { .kind = KILN_STEP_QUANT, .target = target("sm_89"), .act = KILN_ACT_MXFP8_G32,
            .width = 96 },
          "quant act=mxfp8-1x32 k=96 target=sm_89" },
        { { .kind = KILN_STEP_QUANT, .target = target("sm_90a"), .act = KILN_ACT_FP8_STATIC,
            .width = 4096 },
          "quant act=fp8-static k=4096 target=sm_90a" },
        { { .kind = KILN_STEP_QUANT, .target = target("sm_80"), .act = KILN_ACT_BF16_QDQ,
            .width = 512 },
          "quant act=bf16-qdq k=512 target=sm_80" },
        { { .kind = KILN_STEP_PACK, .target = target("h200"),
            .linear = { .cfg = { .format = KILN_FMT_Q4_K } } },
          "pack format=q4_k target=sm_90a" },
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        char text[KILN_SIG_MAX];
        print_ok(&cases[i].d, text);
        cr_assert_str_eq(text, cases[i].want);
        kiln_kernel_desc d = cases[i].d;
        cr_assert_eq(kiln_sig_name(&d, text), KILN_OK, "%s", kiln_last_error());
        kiln_kernel_desc parsed;
        assert_round_trip(reg(), cases[i].want, &parsed);
        /* a product name is its architecture's row, not the product's SM count */
        d.target.sm_count = 0;
        d.target.alias_of[0] = '\0';
        assert_same_desc(&parsed, &d, text);
    }
}

/* The entry names of the source goldens of test_emit.c. */
Test(sig, names_entries_as_before)
{
    static const struct {
        const char *sig, *entry;
    } cases[] = {
        { "linear backend=simt variant=t64x64 format=q4_k scales=inline act=bf16 n=4096 k=14336 "
          "epilogue=bias+residual out=bf16 target=sm_90a",
          "kiln_simt_158627c8c69de24f" },
        { "op rms_norm width=4096 target=sm_90a", "kiln_rms_norm_24a180e41c08795b" },
        { "quant act=fp8-tensor k=4096 target=sm_90a", "kiln_quant_14883eb009f465c9" },
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        kiln_kernel_desc d;
        assert_round_trip(reg(), cases[i].sig, &d);
        cr_assert_str_eq(d.entry, cases[i].entry, "%s", cases[i].sig);
    }
}

/* --------------------------------------------------------- round trips */

/* A planning-only backend that takes fp8 activations where the format has
 * them, so that plans carry quant steps of every scheme. */
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

static kiln_act fp8_act(const kiln_target *t, const kiln_linear_cfg *c, int64_t m)
{
    (void)t, (void)m;
    switch (c->format) {
    case KILN_FMT_FP8_TENSOR: return KILN_ACT_FP8_TENSOR;
    case KILN_FMT_FP8_CHANNEL: return KILN_ACT_FP8_TOKEN;
    case KILN_FMT_FP8_BLOCK: return KILN_ACT_FP8_G128;
    case KILN_FMT_MXFP8: return KILN_ACT_MXFP8_G32;
    case KILN_FMT_MXFP4: return KILN_ACT_BF16_TC;
    default: return KILN_ACT_BF16;
    }
}

static void m_variant(const kiln_target *t, const kiln_linear_cfg *c, int64_t m, char *buf,
                      size_t n)
{
    (void)t, (void)c;
    snprintf(buf, n, "m%lld", (long long)(m <= 16 ? 16 : 512));
}

static const kiln_backend quantizing = {
    .name = "fp8", .formats = (1u << KILN_FMT_COUNT) - 1,
    .epilogues = KILN_EPI_BIAS | KILN_EPI_RESIDUAL | KILN_EPI_SILU_MUL,
    .is_supported = any_target, .can_implement = any_shape, .act = fp8_act, .variant = m_variant,
};

static char dummy[1 << 16]; /* planning never reads weight bytes */

/* An FFN block per format, x + down(silu(gate(rms(x))) * up(rms(x))), gate
 * with a bias, up with a static input scale. */
static kiln_graph *every_format_graph(void)
{
    enum { D = 256, F = 512 };
    static float norm[D], bias[F];
    kiln_graph *g;
    kiln_tensor *x;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    cr_assert_eq(kiln_graph_input(g, "x", D, &x), KILN_OK);
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        kiln_tensor *nw, *b, *h, *w[3], *gate, *up, *act, *prod, *down;
        const int64_t n[3] = { F, F, D }, k[3] = { D, D, F };
        for (int j = 0; j < 3; j++) {
            kiln_qtensor q = { .format = (kiln_format)f, .n = n[j], .k = k[j], .data = dummy,
                               .scale = dummy };
            cr_assert_eq(kiln_graph_weight(g, NULL, &q, &w[j]), KILN_OK, "%s", kiln_last_error());
        }
        cr_assert_eq(kiln_graph_param(g, NULL, D, norm, &nw), KILN_OK);
        cr_assert_eq(kiln_graph_param(g, NULL, F, bias, &b), KILN_OK);
        cr_assert_eq(kiln_graph_rms_norm(g, NULL, x, nw, 1e-6f, &h), KILN_OK);
        cr_assert_eq(kiln_graph_linear(g, NULL, h, w[0], b, &gate), KILN_OK);
        cr_assert_eq(kiln_graph_linear(g, NULL, h, w[1], NULL, &up), KILN_OK);
        cr_assert_eq(kiln_graph_linear_input_scale(g, up, 0.0625f), KILN_OK);
        cr_assert_eq(kiln_graph_silu(g, NULL, gate, &act), KILN_OK);
        cr_assert_eq(kiln_graph_mul(g, NULL, up, act, &prod), KILN_OK);
        cr_assert_eq(kiln_graph_linear(g, NULL, prod, w[2], NULL, &down), KILN_OK);
        cr_assert_eq(kiln_graph_add(g, NULL, x, down, &x), KILN_OK);
    }
    cr_assert_eq(kiln_graph_output(g, x), KILN_OK);
    return g;
}

/* Every kernel of a plan: its descriptor prints as its text, the text
 * parses back to the descriptor, entry name included. Counts the kernels
 * of each kind, and sets bit a of *acts for a quantizer of scheme a. */
static void check_plan(const kiln_registry *r, kiln_graph *g, const char *name,
                       const kiln_plan_options *o, int kinds[KILN_STEP_PACK + 1], unsigned *acts)
{
    kiln_target t = target(name);
    kiln_plan *p;
    cr_assert_eq(kiln_plan_create_with(r, g, &t, o, &p), KILN_OK, "%s: %s", name,
                 kiln_last_error());
    cr_assert_gt(kiln_plan_n_signatures(p), 0);
    for (int i = 0; i < kiln_plan_n_signatures(p); i++) {
        const kiln_plan_sig *s = &p->signatures[i];
        cr_assert_str_eq(kiln_plan_signature(p, i), s->text);
        char text[KILN_SIG_MAX];
        print_ok(&s->desc, text);
        cr_assert_str_eq(text, s->text, "%s", name);
        kiln_kernel_desc d;
        assert_round_trip(r, s->text, &d);
        assert_same_desc(&s->desc, &d, s->text);
        kinds[s->desc.kind]++;
        if (s->desc.kind == KILN_STEP_QUANT)
            *acts |= 1u << s->desc.act;
    }
    kiln_plan_destroy(p);
}

Test(sig, plans_print_their_descriptors_and_parse_back)
{
    static const char *const targets[] = { "t4", "sm_80", "sm_86", "l40s", "sm_90", "sm_90a",
                                           "h200" };
    kiln_graph *g = every_format_graph();
    unsigned acts = 0;
    for (size_t i = 0; i < KILN_ARRAY_LEN(targets); i++) {
        int kinds[KILN_STEP_PACK + 1] = { 0 };
        check_plan(reg(), g, targets[i], NULL, kinds, &acts);
        const kiln_plan_options no_fuse = { .no_fuse = 1 };
        check_plan(reg(), g, targets[i], &no_fuse, kinds, &acts);
        cr_assert_gt(kinds[KILN_STEP_LINEAR], 0, "%s", targets[i]);
        cr_assert_gt(kinds[KILN_STEP_OP], 0, "%s", targets[i]);
    }
    kiln_registry r = { .backends = { &quantizing }, .n = 1 };
    for (int f = 0; f < KILN_FMT_COUNT; f++)
        r.priority[f][0] = "fp8";
    int kinds[KILN_STEP_PACK + 1] = { 0 };
    check_plan(&r, g, "sm_89", NULL, kinds, &acts);
    cr_assert_eq(acts, (1u << KILN_ACT_COUNT) - 2,
                 "a quantizer of every scheme but bf16, the static ones included");
    kiln_graph_destroy(g);
}

/* The demo of the kiln command, planned for several targets: every
 * signature it prints parses and prints back to the same text. */
Test(sig, demo_plan_signatures_round_trip)
{
    static const char *const targets[] = { "sm_75", "sm_80", "sm_89", "sm_90", "sm_90a", "h100" };
    for (size_t i = 0; i < KILN_ARRAY_LEN(targets); i++) {
        char args[128];
        snprintf(args, sizeof args, "plan demo --json --target %s --capture 1,2,16,64,512",
                 targets[i]);
        kt_cli c = kt_cli_run(args);
        cr_assert_eq(c.status, 0, "%s: %s", args, c.err);
        json_error_t e;
        json_t *plan = json_loads(c.out, 0, &e);
        cr_assert_not_null(plan, "%s: %s", args, e.text);
        json_t *sigs = json_object_get(plan, "signatures");
        cr_assert(json_is_array(sigs) && json_array_size(sigs) > 0, "%s", args);
        size_t j;
        json_t *s;
        int linears = 0;
        json_array_foreach(sigs, j, s) {
            kiln_kernel_desc d;
            assert_round_trip(reg(), json_string_value(s), &d);
            linears += d.kind == KILN_STEP_LINEAR;
        }
        cr_assert_gt(linears, 0, "%s", args);
        json_decref(plan);
        kt_cli_free(&c);
    }
}

/* ------------------------------------------------------------ parsing */

/* Fields after the kind come in any order; scales follows from the format
 * and is not read back; the entry name is the hash of the text as given. */
Test(sig, parse_takes_fields_in_any_order)
{
    const char *canonical = "linear backend=simt variant=t16x64 format=q8_0 scales=inline "
                            "act=bf16 n=64 k=64 epilogue=none out=bf16 target=sm_80";
    const char *shuffled = "linear target=sm_80 out=bf16 k=64 n=64 scales=x act=bf16 "
                           "epilogue=none format=q8_0 variant=t16x64 backend=simt";
    kiln_kernel_desc a, b;
    assert_round_trip(reg(), canonical, &a);
    cr_assert_eq(kiln_sig_parse(reg(), shuffled, &b), KILN_OK, "%s", kiln_last_error());
    char text[KILN_SIG_MAX];
    print_ok(&b, text);
    cr_assert_str_eq(text, canonical);
    cr_assert_str_neq(a.entry, b.entry, "named after the text as given");
    memcpy(b.entry, a.entry, sizeof b.entry);
    assert_same_desc(&a, &b, shuffled);
}

/* An integer group format's scales name the weight's group, so weights of
 * one shape in different groups are different kernels; 1xK is one group
 * per row. */
Test(sig, grouped_formats_print_and_parse_their_group)
{
    kiln_kernel_desc d = linear("simt", "t16x64", KILN_FMT_INT4_GROUP_ZP, KILN_ACT_BF16, 4096, 4096,
                                0, "sm_80");
    d.linear.cfg.group = 128;
    char text[KILN_SIG_MAX];
    print_ok(&d, text);
    cr_assert_str_eq(text, "linear backend=simt variant=t16x64 format=int4_group_zp "
                           "scales=f32:1x128+zp act=bf16 n=4096 k=4096 epilogue=none out=bf16 "
                           "target=sm_80");
    kiln_kernel_desc back;
    assert_round_trip(reg(), text, &back);
    cr_assert_eq(back.linear.cfg.group, 128);
    d.linear.cfg.group = 0;
    d.linear.cfg.format = KILN_FMT_INT8_GROUP;
    print_ok(&d, text);
    cr_assert(strstr(text, " scales=f32:1xK "), "%s", text);
    assert_round_trip(reg(), text, &back);
    cr_assert_eq(back.linear.cfg.group, 0);
}

Test(sig, parse_reads_every_field)
{
    kiln_kernel_desc d;
    cr_assert_eq(kiln_sig_parse(reg(),
                                "linear backend=simt variant=t64x64 format=q4_k scales=inline "
                                "act=bf16 n=4096 k=14336 epilogue=bias+residual out=bf16 "
                                "target=sm_90a",
                                &d),
                 KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(d.kind, KILN_STEP_LINEAR);
    cr_assert_eq(d.backend, &kiln_backend_simt);
    cr_assert_str_eq(d.linear.variant, "t64x64");
    cr_assert_eq(d.linear.cfg.format, KILN_FMT_Q4_K);
    cr_assert_eq(d.linear.cfg.n, 4096);
    cr_assert_eq(d.linear.cfg.k, 14336);
    cr_assert_eq(d.linear.cfg.epilogue, KILN_EPI_BIAS | KILN_EPI_RESIDUAL);
    cr_assert_eq(d.linear.act, KILN_ACT_BF16);
    cr_assert_str_eq(d.target.name, "sm_90a");
    cr_assert_eq(d.target.wgmma, 1);

    cr_assert_eq(kiln_sig_parse(reg(), "op rms_norm width=4096 target=sm_80", &d), KILN_OK);
    cr_assert_eq(d.kind, KILN_STEP_OP);
    cr_assert_eq(d.op, KILN_OP_RMS_NORM);
    cr_assert_eq(d.width, 4096);
    cr_assert_str_eq(d.target.name, "sm_80");
    cr_assert_eq(strncmp(d.entry, "kiln_rms_norm_", 14), 0, "%s", d.entry);

    cr_assert_eq(kiln_sig_parse(reg(), "quant act=fp8-1x128 k=7168 target=h100", &d), KILN_OK);
    cr_assert_eq(d.kind, KILN_STEP_QUANT);
    cr_assert_eq(d.act, KILN_ACT_FP8_G128);
    cr_assert_eq(d.width, 7168);
    cr_assert_str_eq(d.target.name, "sm_90a");
    cr_assert_eq(d.target.sm_count, 0, "the architecture's row, not the product's");
    cr_assert_eq(strncmp(d.entry, "kiln_quant_", 11), 0, "%s", d.entry);

    cr_assert_eq(kiln_sig_parse(reg(), "pack target=sm_80 format=nvfp4", &d), KILN_OK);
    cr_assert_eq(d.kind, KILN_STEP_PACK);
    cr_assert_eq(d.linear.cfg.format, KILN_FMT_NVFP4);
    cr_assert_str_eq(d.target.name, "sm_80");
    cr_assert_eq(strncmp(d.entry, "kiln_pack_", 10), 0, "%s", d.entry);
}

/* A simt linear on sm_80 with the fields that vary. */
#define SIMT(variant, format, act, n, k, epilogue)                                                 \
    "linear backend=simt variant=" variant " format=" format " scales=x act=" act " n=" n        \
    " k=" k " epilogue=" epilogue " out=bf16 target=sm_80"

Test(sig, entry_names_are_deterministic_and_distinct)
{
    enum { N = 3 * KILN_FMT_COUNT };
    char sigs[N][256];
    char entries[N][KILN_ENTRY_MAX];
    static const char *const variants[] = { "t16x64", "t64x64", "t128x128" };
    for (int i = 0; i < N; i++) {
        snprintf(sigs[i], sizeof sigs[i],
                 "linear backend=simt variant=%s format=%s scales=x act=bf16 n=4096 k=4096 "
                 "epilogue=none out=bf16 target=sm_90a",
                 variants[i % 3], kiln_format_get((kiln_format)(i / 3))->name);
        kiln_kernel_desc a, b;
        cr_assert_eq(kiln_sig_parse(reg(), sigs[i], &a), KILN_OK, "%s", kiln_last_error());
        cr_assert_eq(kiln_sig_parse(reg(), sigs[i], &b), KILN_OK);
        cr_assert_str_eq(a.entry, b.entry);
        cr_assert_eq(strlen(a.entry), strlen("kiln_simt_") + 16, "%s", a.entry);
        cr_assert_eq(strncmp(a.entry, "kiln_simt_", 10), 0, "%s", a.entry);
        cr_assert_eq(strspn(a.entry + 10, "0123456789abcdef"), 16, "%s", a.entry);
        memcpy(entries[i], a.entry, sizeof entries[i]);
        for (int j = 0; j < i; j++)
            cr_assert_str_neq(entries[i], entries[j], "%s and %s", sigs[i], sigs[j]);
    }
}

/* ------------------------------------------------------------- errors */

Test(sig, malformed_signatures_are_refused)
{
    static const struct {
        const char *sig;
        kiln_status want;
    } cases[] = {
        { "", KILN_ERR_MALFORMED },
        { "conv backend=simt", KILN_ERR_MALFORMED },
        { "linear backend=simt", KILN_ERR_MALFORMED },
        { "op", KILN_ERR_MALFORMED },
        { "op add", KILN_ERR_MALFORMED },
        { "op add width=8 target=sm_80 extra=1", KILN_ERR_MALFORMED },
        { "op add width=8 width=8 target=sm_80", KILN_ERR_MALFORMED },
        { "op add width target=sm_80", KILN_ERR_MALFORMED },
        { "op add =8 target=sm_80", KILN_ERR_MALFORMED },
        { "op add width=eight target=sm_80", KILN_ERR_MALFORMED },
        { "op add width=0 target=sm_80", KILN_ERR_MALFORMED },
        { "op add width=-3 target=sm_80", KILN_ERR_MALFORMED },
        { "op add width=99999999999999999999 target=sm_80", KILN_ERR_MALFORMED },
        { "op add width=8 target=sm_12", KILN_ERR_NOT_FOUND },
        { "op nosuch width=8 target=sm_80", KILN_ERR_NOT_FOUND },
        { "quant act=fp4 k=8 target=sm_80", KILN_ERR_NOT_FOUND },
        { "quant k=8 target=sm_80", KILN_ERR_MALFORMED },
        { "linear backend=nosuch variant=v format=q4_0 scales=x act=bf16 n=8 k=32 epilogue=none "
          "out=bf16 target=sm_80",
          KILN_ERR_NOT_FOUND },
        { SIMT("t16x64", "q8_1", "bf16", "8", "32", "none"), KILN_ERR_NOT_FOUND },
        { SIMT("t16x64", "q4_0", "bf17", "8", "32", "none"), KILN_ERR_NOT_FOUND },
        { SIMT("t16x64", "q4_0", "bf16", "8", "32x", "none"), KILN_ERR_MALFORMED },
        { "linear backend=simt variant=t16x64 format=q4_0 scales=x act=bf16 n=8 k=32 epilogue=none "
          "out=f32 target=sm_80",
          KILN_ERR_UNSUPPORTED },
        { SIMT("t16x64", "q4_0", "bf16", "8", "32", "scale"), KILN_ERR_MALFORMED },
        { "linear backend=simt variant=t16x64 format=int4_group scales=f32:1x12q act=bf16 n=8 "
          "k=32 epilogue=none out=bf16 target=sm_80",
          KILN_ERR_MALFORMED },
        { "linear backend=simt variant=t16x64 format=int4_group scales=f32:1x-8 act=bf16 n=8 "
          "k=32 epilogue=none out=bf16 target=sm_80",
          KILN_ERR_MALFORMED },
        { "linear backend=simt variant=t16x64 format=int8_group scales=f32 act=bf16 n=8 "
          "k=32 epilogue=none out=bf16 target=sm_80",
          KILN_ERR_MALFORMED },
        { SIMT("t16x64", "q4_0", "bf16", "8", "32", "bias+bias"), KILN_ERR_MALFORMED },
        { SIMT("t16x64", "q4_0", "bf16", "8", "32", "bias+"), KILN_ERR_MALFORMED },
        { SIMT("t16x64", "q4_0", "bf16", "8", "32", "+bias"), KILN_ERR_MALFORMED },
        /* simt does not fuse the gate projection (gemv_tc does) */
        { SIMT("t16x64", "q4_0", "bf16", "8", "32", "silu_mul+gate"), KILN_ERR_MALFORMED },
        { SIMT("x123456789x123456789x123456789x123456789x123456789x123456789x123", "q4_0",
               "bf16", "8", "32", "none"),
          KILN_ERR_MALFORMED },
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        kiln_kernel_desc d = { .width = 7 };
        cr_assert_eq(kiln_sig_parse(reg(), cases[i].sig, &d), cases[i].want, "\"%s\": %s",
                     cases[i].sig, kiln_last_error());
        if (cases[i].sig[0])
            cr_assert(strstr(kiln_last_error(), cases[i].sig),
                      "the message names the signature: %s", kiln_last_error());
        cr_assert_eq(d.width, 7, "out is untouched on failure");
    }
    char long_sig[600];
    memset(long_sig, 'x', sizeof long_sig - 1);
    long_sig[sizeof long_sig - 1] = '\0';
    kiln_kernel_desc d;
    cr_assert_eq(kiln_sig_parse(reg(), long_sig, &d), KILN_ERR_MALFORMED);
    cr_assert_eq(kiln_sig_parse(NULL, "op add width=8 target=sm_80", &d), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_sig_parse(reg(), NULL, &d), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_sig_parse(reg(), "op add width=8 target=sm_80", NULL),
                 KILN_ERR_INVALID_ARG);
}

/* An entry name is "kiln_<backend>_<16 hex>" in KILN_ENTRY_MAX bytes. */
Test(sig, a_backend_name_too_long_for_an_entry_is_refused)
{
    kiln_backend wordy = quantizing;
    wordy.name = "a_backend_whose_name_leaves_no_room_for_the_hash_";
    kiln_registry r = { .backends = { &wordy }, .n = 1 };
    kiln_kernel_desc d;
    const char *sig = "linear backend=a_backend_whose_name_leaves_no_room_for_the_hash_ "
                      "variant=v format=bf16 scales=none act=bf16 n=8 k=8 epilogue=none out=bf16 "
                      "target=sm_80";
    cr_assert_eq(kiln_sig_parse(&r, sig, &d), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "too long for an entry name"), "%s", kiln_last_error());
    d = (kiln_kernel_desc){ .kind = KILN_STEP_LINEAR, .backend = &wordy, .entry = "kept" };
    cr_assert_eq(kiln_sig_name(&d, sig), KILN_ERR_INVALID_ARG);
    cr_assert_str_eq(d.entry, "kept", "d is untouched on failure");
}

/* Printing into too small a buffer fails instead of cutting the text. */
Test(sig, print_refuses_a_buffer_too_small)
{
    kiln_kernel_desc d = { .kind = KILN_STEP_OP, .target = target("sm_80"), .op = KILN_OP_ADD,
                           .width = 8 };
    char text[KILN_SIG_MAX];
    print_ok(&d, text);
    const size_t fits = strlen("op add width=8 target=sm_80") + 1;
    cr_assert_eq(kiln_sig_print(&d, text, fits), KILN_OK);
    cr_assert_str_eq(text, "op add width=8 target=sm_80");
    cr_assert_eq(kiln_sig_print(&d, text, fits - 1), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "longer than"), "%s", kiln_last_error());
}
