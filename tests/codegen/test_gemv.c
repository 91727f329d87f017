/* The gemv backend (kernels/gemv): capability checks and their reasons,
 * the M class per bucket, launch shapes, the emitted source, its place in
 * the default registry and plans, and every (format x M class x
 * epilogue) instantiation compiled by NVRTC for each architecture family
 * kiln targets. Needs libnvrtc but no GPU: the GPU suite
 * (tests/gpu/test_session.c) checks the results against the CPU. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/emit.h"
#include "codegen/nvrtc.h"
#include "codegen/plan.h"

static const kiln_backend *const gemv = &kiln_backend_gemv;

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

static const char *variant_of(int64_t bucket, char *buf, size_t size)
{
    kiln_target t = target("h200");
    kiln_linear_cfg c = cfg(KILN_FMT_Q4_0, 4096, 4096);
    gemv->variant(&t, &c, bucket, buf, size);
    return buf;
}

/* The gemv signature of one linear. */
static char *gemv_sig(char *buf, size_t size, const char *variant, kiln_format f, unsigned epi,
                      int64_t n, int64_t k, const char *arch)
{
    char epi_text[64];
    snprintf(buf, size,
             "linear backend=gemv variant=%s format=%s scales=x act=bf16 n=%lld k=%lld "
             "epilogue=%s out=bf16 target=%s",
             variant, kiln_format_get(f)->name, (long long)n, (long long)k,
             kiln_epilogue_name(epi, epi_text, sizeof epi_text), arch);
    return buf;
}

/* A value the source passes to the template: "/\*name*\/ <value>". */
static long long source_param(const char *text, const char *name)
{
    char key[64];
    snprintf(key, sizeof key, "/*%s*/ ", name);
    const char *at = strstr(text, key);
    cr_assert_not_null(at, "no %s in\n%s", name, text);
    return strtoll(at + strlen(key), NULL, 10);
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
    cr_assert_eq(gemv->formats, (1u << KILN_FMT_COUNT) - 1);
    cr_assert_eq(gemv->epilogues, KILN_EPI_BIAS | KILN_EPI_RESIDUAL | KILN_EPI_SILU_MUL);
    kiln_target t = target("h200");
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        kiln_linear_cfg c = cfg((kiln_format)f, 4096, 4096);
        for (int64_t m = 1; m <= 16; m++) {
            char why[256] = "";
            cr_assert_eq(gemv->can_implement(&t, &c, m, why, sizeof why), 1, "%s m=%lld: %s",
                         kiln_format_get((kiln_format)f)->name, (long long)m, why);
            cr_assert_eq(gemv->act(&t, &c, m), KILN_ACT_BF16);
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

Test(gemv, variants_follow_the_bucket)
{
    static const struct {
        int64_t m;
        const char *variant;
    } cases[] = {
        { 1, "m1" }, { 2, "m2" }, { 3, "m4" }, { 4, "m4" },   { 5, "m8" },
        { 8, "m8" }, { 9, "m16" }, { 12, "m16" }, { 16, "m16" },
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        char v[64];
        cr_assert_str_eq(variant_of(cases[i].m, v, sizeof v), cases[i].variant, "m=%lld",
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
    kiln_target t = target("sm_90a");
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        kiln_linear_cfg c = cfg(cases[i].f, 512, cases[i].k);
        char why[256] = "";
        int ok = gemv->can_implement(&t, &c, 1, why, sizeof why);
        cr_assert_eq(ok, cases[i].why == NULL, "case %zu: %s", i, why);
        if (cases[i].why)
            cr_assert(strstr(why, cases[i].why), "case %zu: %s", i, why);
    }
}

Test(gemv, refuses_shapes_past_its_indexing)
{
    kiln_target t = target("sm_80");
    char why[256];
    kiln_linear_cfg c = cfg(KILN_FMT_BF16, (int64_t)INT_MAX + 1, 64);
    cr_assert_eq(gemv->can_implement(&t, &c, 1, why, sizeof why), 0);
    cr_assert(strstr(why, "below 2^31"), "%s", why);
    c = cfg(KILN_FMT_BF16, 64, (int64_t)INT_MAX + 1);
    cr_assert_eq(gemv->can_implement(&t, &c, 1, why, sizeof why), 0);
    /* K fits an int, its f32 row's bytes do not */
    c = cfg(KILN_FMT_F32, 64, 600000000);
    cr_assert_eq(gemv->can_implement(&t, &c, 1, why, sizeof why), 0);
    cr_assert(strstr(why, "row's bytes"), "%s", why);
    c.format = KILN_FMT_FP8_TENSOR;
    cr_assert_eq(gemv->can_implement(&t, &c, 1, why, sizeof why), 1, "%s", why);
}

/* m = 16 keeps a 16-row f32 copy of a whole 32-value stage per lane: more
 * than sm_75 and sm_89 give a block for 4-bit formats; simt takes those. */
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
    cr_assert_eq(gemv->can_implement(&t, &c, 16, why, sizeof why), 0);
    t = target("sm_90a");
    cr_assert_eq(gemv->can_implement(&t, &c, 16, why, sizeof why), 1, "%s", why);
    /* A short K needs only its own values of x. */
    c.k = 512;
    t = target("sm_89");
    cr_assert_eq(gemv->can_implement(&t, &c, 16, why, sizeof why), 1, "%s", why);
    /* A live device of an architecture past the table, limit unknown. */
    kiln_target future = { .name = "sm_120", .sm = 120 };
    c.k = 4096;
    cr_assert_eq(gemv->can_implement(&future, &c, 16, why, sizeof why), 0);
    cr_assert(strstr(why, "sm_120 allows 49152"), "%s", why);
}

/* ------------------------------------------------------------ selection */

Test(gemv, selection_takes_gemv_for_decode_buckets)
{
    const kiln_registry *r = kiln_registry_default();
    cr_assert_eq(kiln_registry_find(r, "gemv"), gemv);
    kiln_target t = target("a100");
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        kiln_linear_cfg c = cfg((kiln_format)f, 4096, 4096);
        kiln_choice ch;
        cr_assert_eq(kiln_backend_select(r, &t, &c, 1, NULL, "y", &ch), KILN_OK);
        cr_assert_eq(ch.backend, gemv, "%s", kiln_format_get((kiln_format)f)->name);
        cr_assert_str_eq(ch.refused, "");
        cr_assert_eq(kiln_backend_select(r, &t, &c, 32, NULL, "y", &ch), KILN_OK);
        cr_assert_neq(ch.backend, gemv);
        cr_assert(strstr(ch.refused, "gemv: M bucket 32 > 16"), "%s", ch.refused);
    }
    /* A K gemv refuses falls to the next backend with gemv's reason. */
    kiln_linear_cfg c = cfg(KILN_FMT_BF16, 4096, 4100);
    kiln_choice ch;
    cr_assert_eq(kiln_backend_select(r, &t, &c, 1, NULL, "y", &ch), KILN_OK);
    cr_assert_str_eq(ch.backend->name, "simt");
    cr_assert(strstr(ch.refused, "gemv: K=4100 is not a multiple of 8"), "%s", ch.refused);
}

static char dummy[16]; /* planning never reads weight bytes */

/* A gated FFN with a residual in three formats: decode buckets run gemv,
 * with the epilogues fused, the rest do not, and every signature emits. */
Test(gemv, default_plans_use_gemv_for_decode)
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
    kiln_target t = target("a100");
    kiln_plan *p;
    cr_assert_eq(kiln_plan_create(g, &t, NULL, &p), KILN_OK, "%s", kiln_last_error());
    int gemv_choices = 0;
    for (int i = 0; i < p->n_linears; i++)
        for (int b = 0; b < p->n_buckets; b++) {
            const kiln_plan_choice *c = &p->linears[i].choice[b];
            int decode = p->buckets[b] <= 16;
            cr_assert_eq(c->backend == gemv, decode, "%s, bucket %lld: %s",
                         p->linears[i].node->name, (long long)p->buckets[b], c->backend->name);
            gemv_choices += decode;
            if (decode)
                cr_assert_eq(c->epilogue, p->linears[i].candidate, "every fusion is taken");
        }
    cr_assert_eq(gemv_choices, 3 * 5, "buckets 1, 2, 4, 8, 16 of three linears");
    int gemv_kernels = 0;
    for (int i = 0; i < kiln_plan_n_signatures(p); i++) {
        const char *sig = kiln_plan_signature(p, i);
        kiln_kernel_source s;
        cr_assert_eq(kiln_emit(p->registry, sig, &s), KILN_OK, "%s: %s", sig, kiln_last_error());
        gemv_kernels += s.desc.kind == KILN_STEP_LINEAR && s.desc.backend == gemv;
        kiln_kernel_source_free(&s);
    }
    cr_assert_eq(gemv_kernels, 3 * 5, "one kernel per linear and M class");
    kiln_plan_destroy(p);
    kiln_graph_destroy(g);
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
        "// cache key: " KILN_EMIT_KEY_PLACEHOLDER "\n"
        "#include \"kiln/gemv.cuh\"\n"
        "\n"
        "using format = kiln::gemv_q4_k;\n"
        "using shape = kiln::gemv_shape</*max_m*/ 1, /*rows*/ 1, /*warps*/ 8, /*k_split*/ 1,\n"
        "                               /*units*/ 2, /*stages*/ 3, /*tile_k*/ 4096,\n"
        "                               /*min_blocks*/ 4>;\n"
        "using epilogue = kiln::gemv_epilogue</*bias*/ true, /*residual*/ true, /*silu_mul*/ "
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
    cr_assert_eq(kiln_emit(kiln_registry_default(), sig, &s), KILN_OK, "%s", kiln_last_error());
    char want[4096];
    snprintf(want, sizeof want, golden, s.desc.entry);
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
    snprintf(k.variant, sizeof k.variant, "t16x64");
    cr_assert_eq(gemv->emit(&t, &k, "kiln_gemv_0", buf, sizeof buf), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "no variant \"t16x64\""), "%s", kiln_last_error());
    cr_assert_eq(gemv->launch(&t, &k, 1, &l), KILN_ERR_UNSUPPORTED);
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

Test(gemv, launch_serves_its_m_class_only)
{
    kiln_target t = target("sm_80");
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
            for (int f = 0; f < KILN_FMT_COUNT; f++)
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
                    gemv_sig(sig, sizeof sig, variants[v], (kiln_format)f, 0, shapes[s][0],
                             shapes[s][1], arches[a]);
                    kiln_kernel_source src;
                    cr_assert_eq(kiln_emit(kiln_registry_default(), sig, &src), KILN_OK, "%s: %s",
                                 sig, kiln_last_error());
                    const long long rows = source_param(src.text, "rows"),
                                    warps = source_param(src.text, "warps"),
                                    split = source_param(src.text, "k_split"),
                                    tile_k = source_param(src.text, "tile_k");
                    const long long block_rows = warps / split * rows;
                    kiln_launch l;
                    cr_assert_eq(gemv->launch(&t, &src.desc.linear, bucket, &l), KILN_OK);
                    cr_assert_geq((long long)l.grid[0] * block_rows, shapes[s][0], "%s", sig);
                    cr_assert_lt((long long)(l.grid[0] - 1) * block_rows, shapes[s][0], "%s",
                                 sig);
                    cr_assert_eq(l.grid[1] * l.grid[2], 1);
                    cr_assert_eq(l.block[0], 32 * warps);
                    cr_assert_eq(l.smem, source_param(src.text, "smem"), "%s", sig);
                    cr_assert_leq(l.smem, (unsigned)t.smem_optin, "%s", sig);
                    cr_assert_eq(tile_k % 32, 0, "%s", sig);
                    cr_assert_eq(warps % split, 0, "%s", sig);
                    kiln_kernel_source_free(&src);
                }
}

/* The decode shapes of an 8B model on an H200 at m = 1: one row per warp
 * with no k-split (enough warps already), and shared memory low enough
 * for four blocks of eight warps on each SM (228 KiB, 1 KiB of it
 * reserved per block). A short N splits K instead. */
Test(gemv, decode_shapes_fill_an_h200)
{
    static const int64_t shapes[][2] = { { 28672, 4096 }, { 4096, 14336 }, { 8192, 28672 } };
    static const kiln_format fs[] = { KILN_FMT_BF16, KILN_FMT_FP8_TENSOR, KILN_FMT_NVFP4,
                                      KILN_FMT_MXFP4, KILN_FMT_Q8_0, KILN_FMT_Q4_0,
                                      KILN_FMT_Q4_K, KILN_FMT_Q6_K };
    kiln_target t = target("h200");
    for (size_t s = 0; s < KILN_ARRAY_LEN(shapes); s++)
        for (size_t f = 0; f < KILN_ARRAY_LEN(fs); f++) {
            char sig[512];
            gemv_sig(sig, sizeof sig, "m1", fs[f], 0, shapes[s][0], shapes[s][1], "h200");
            kiln_kernel_source src;
            cr_assert_eq(kiln_emit(kiln_registry_default(), sig, &src), KILN_OK, "%s",
                         kiln_last_error());
            kiln_launch l;
            cr_assert_eq(gemv->launch(&t, &src.desc.linear, 1, &l), KILN_OK);
            cr_assert_eq(source_param(src.text, "k_split"), 1, "%s", sig);
            cr_assert_eq(l.grid[0], shapes[s][0] / 8, "%s", sig);
            cr_assert_leq(4 * (l.smem + 1024), 228 * 1024, "%s: %u bytes", sig, l.smem);
            kiln_kernel_source_free(&src);
        }
    char sig[512];
    gemv_sig(sig, sizeof sig, "m1", KILN_FMT_NVFP4, 0, 1024, 8192, "h200");
    kiln_kernel_source src;
    cr_assert_eq(kiln_emit(kiln_registry_default(), sig, &src), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(source_param(src.text, "k_split"), 2, "%s", src.text);
    kiln_launch l;
    cr_assert_eq(gemv->launch(&t, &src.desc.linear, 1, &l), KILN_OK);
    cr_assert_eq(l.grid[0], 1024 / 4);
    kiln_kernel_source_free(&src);
}

/* ---------------------------------------------------------------- NVRTC */

typedef struct batch {
    kiln_kernel_source *src;
    kiln_compile_job *jobs;
    char **sig;
    int n, cap;
} batch;

static void batch_add(batch *b, const char *signature)
{
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->src = realloc(b->src, (size_t)b->cap * sizeof *b->src);
        b->jobs = realloc(b->jobs, (size_t)b->cap * sizeof *b->jobs);
        b->sig = realloc(b->sig, (size_t)b->cap * sizeof *b->sig);
        cr_assert(b->src && b->jobs && b->sig);
    }
    cr_assert_eq(kiln_emit(kiln_registry_default(), signature, &b->src[b->n]), KILN_OK, "%s: %s",
                 signature, kiln_last_error());
    cr_assert_not_null(b->sig[b->n] = strdup(signature));
    b->n++;
}

/* Compile everything two at a time, fail on the first error, report the
 * time per kernel. */
static void batch_compile(batch *b, const char *what)
{
    kiln_nvrtc *nv = NULL;
    cr_assert_eq(kiln_nvrtc_open(&nv), KILN_OK,
                 "libnvrtc cannot be loaded, and these tests need it: %s", kiln_last_error());
    for (int i = 0; i < b->n; i++)
        b->jobs[i] = (kiln_compile_job){ .name = b->sig[i], .entry = b->src[i].desc.entry,
                                         .source = b->src[i].text,
                                         .target = &b->src[i].desc.target };
    const kiln_nvrtc_pool pool = { .threads = 2, .quiet = 1 };
    double start = kiln_now();
    cr_assert_eq(kiln_nvrtc_compile_all(nv, b->jobs, b->n, &pool), KILN_OK, "%s",
                 kiln_last_error());
    double wall = kiln_now() - start, sum = 0, max = 0;
    for (int i = 0; i < b->n; i++) {
        cr_assert_gt(b->jobs[i].cubin_size, 0);
        sum += b->jobs[i].seconds;
        max = b->jobs[i].seconds > max ? b->jobs[i].seconds : max;
    }
    fprintf(stderr, "%s: %d kernels in %.1f s wall, %.2f s mean, %.2f s max per kernel\n", what,
            b->n, wall, sum / b->n, max);
    for (int i = 0; i < b->n; i++) {
        kiln_kernel_source_free(&b->src[i]);
        kiln_compile_job_reset(&b->jobs[i]);
        free(b->sig[i]);
    }
    free(b->src);
    free(b->jobs);
    free(b->sig);
    kiln_nvrtc_close(nv);
}

/* Every format in every M class, two shapes taking turns: 200 x 13568
 * splits K across warps, walks two x tiles and ends on a partial stage;
 * 4100 x 4096 is one tile with a partial block of rows. The epilogue
 * rotates through all five fusions. A class the target's shared memory
 * cannot hold is refused (simt's then), never at m = 1. */
static void compile_every_class(const char *arch)
{
    static const unsigned epilogues[] = {
        0, KILN_EPI_BIAS, KILN_EPI_BIAS | KILN_EPI_RESIDUAL, KILN_EPI_SILU_MUL,
        KILN_EPI_BIAS | KILN_EPI_SILU_MUL,
    };
    static const char *const variants[] = { "m1", "m2", "m4", "m8", "m16" };
    static const int64_t shapes[][2] = { { 200, 13568 }, { 4100, 4096 } };
    kiln_target t = target(arch);
    batch b = { 0 };
    for (int f = 0; f < KILN_FMT_COUNT; f++)
        for (int v = 0; v < (int)KILN_ARRAY_LEN(variants); v++) {
            const int64_t *shape = shapes[(f + v) % 2];
            kiln_linear_cfg c = cfg((kiln_format)f, shape[0], shape[1]);
            char why[256], sig[512];
            if (!gemv->can_implement(&t, &c, 1ll << v, why, sizeof why)) {
                cr_assert_neq(v, 0, "%s: %s", arch, why);
                cr_assert(strstr(why, "shared memory"), "%s", why);
                continue;
            }
            batch_add(&b, gemv_sig(sig, sizeof sig, variants[v], (kiln_format)f,
                                   epilogues[(f + v) % 5], shape[0], shape[1], arch));
        }
    char what[64];
    snprintf(what, sizeof what, "%s gemv", arch);
    batch_compile(&b, what);
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
 * E2M1 with block scales, Q4_K's offset, Q6_K's unaligned blocks. */
Test(gemv_nvrtc, every_epilogue_compiles, .timeout = 600)
{
    static const unsigned epilogues[] = {
        0, KILN_EPI_BIAS, KILN_EPI_RESIDUAL, KILN_EPI_BIAS | KILN_EPI_RESIDUAL, KILN_EPI_SILU_MUL,
        KILN_EPI_BIAS | KILN_EPI_SILU_MUL,
    };
    static const kiln_format fs[] = { KILN_FMT_BF16, KILN_FMT_FP8_CHANNEL, KILN_FMT_NVFP4,
                                      KILN_FMT_Q4_K, KILN_FMT_Q6_K };
    batch b = { 0 };
    char sig[512];
    for (size_t f = 0; f < KILN_ARRAY_LEN(fs); f++)
        for (size_t e = 0; e < KILN_ARRAY_LEN(epilogues); e++)
            batch_add(&b, gemv_sig(sig, sizeof sig, e % 2 ? "m4" : "m1", fs[f], epilogues[e], 1000,
                                   2048, "sm_90a"));
    batch_compile(&b, "gemv epilogues");
}
