#include <criterion/criterion.h>
#include <string.h>

#include "fault.h"
#include "kiln.h"

Test(target, every_listed_name_resolves)
{
    for (const char *const *n = kiln_target_names(); *n; n++) {
        kiln_target t;
        cr_assert_eq(kiln_target_from_name(*n, &t), KILN_OK, "%s: %s", *n, kiln_last_error());
        cr_assert(t.sm >= 75 && t.smem_optin >= 65536, "%s", *n);
        cr_assert(!strncmp(t.name, "sm_", 3));
    }
}

Test(target, capabilities_follow_the_architecture)
{
    kiln_target t75, t80, t89, t90, t90a;
    cr_assert_eq(kiln_target_from_name("sm_75", &t75), KILN_OK);
    cr_assert_eq(kiln_target_from_name("sm_80", &t80), KILN_OK);
    cr_assert_eq(kiln_target_from_name("sm_89", &t89), KILN_OK);
    cr_assert_eq(kiln_target_from_name("sm_90", &t90), KILN_OK);
    cr_assert_eq(kiln_target_from_name("sm_90a", &t90a), KILN_OK);
    cr_assert(!t75.mma_bf16 && t80.mma_bf16);
    cr_assert(!t80.mma_fp8 && t89.mma_fp8);
    cr_assert(!t90.wgmma && t90a.wgmma, "wgmma needs the arch-specific target");
    cr_assert(t90.tma && !t89.tma);
    cr_assert(t90a.smem_optin > t80.smem_optin);
    cr_assert_eq(t90a.sm_count, 0, "a bare architecture fixes no SM count");
}

Test(target, aliases_name_products)
{
    kiln_target h200, a100, l40s;
    cr_assert_eq(kiln_target_from_name("h200", &h200), KILN_OK);
    cr_assert_str_eq(h200.name, "sm_90a");
    cr_assert_str_eq(h200.alias_of, "h200");
    cr_assert_eq(h200.sm_count, 132);
    cr_assert_eq(kiln_target_from_name("a100", &a100), KILN_OK);
    cr_assert_str_eq(a100.name, "sm_80");
    cr_assert_eq(kiln_target_from_name("l40s", &l40s), KILN_OK);
    cr_assert(l40s.mma_fp8);
}

Test(target, unknown_name_lists_the_known_ones)
{
    kiln_target t = { .sm = 1234 };
    cr_assert_eq(kiln_target_from_name("sm_100x", &t), KILN_ERR_NOT_FOUND);
    cr_assert(strstr(kiln_last_error(), "'sm_100x'"));
    cr_assert(strstr(kiln_last_error(), "rtx-pro-6000"), "%s", kiln_last_error());
    cr_assert(strstr(kiln_last_error(), "sm_90a"));
    cr_assert_eq(t.sm, 1234, "out is untouched on failure");
    cr_assert_eq(kiln_target_from_name(NULL, &t), KILN_ERR_INVALID_ARG);
}

Test(target, from_compute_capability)
{
    kiln_target t;
    cr_assert_eq(kiln_target_from_cc(9, 0, 132, 232448, &t), KILN_OK);
    cr_assert_str_eq(t.name, "sm_90a", "a live Hopper runs arch-specific code");
    cr_assert(t.wgmma);
    cr_assert_eq(t.sm_count, 132);
    cr_assert_eq(kiln_target_from_cc(8, 9, 142, 0, &t), KILN_OK);
    cr_assert_str_eq(t.name, "sm_89");
    cr_assert_eq(t.smem_optin, 101376, "0 keeps the architecture's limit");
    cr_assert_eq(kiln_target_from_cc(12, 0, 84, 101376, &t), KILN_OK);
    cr_assert_str_eq(t.name, "sm_120");
    cr_assert(t.mma_fp8 && t.tma && !t.wgmma, "newer chips keep mma and TMA, not sm_90a's wgmma");
    cr_assert_eq(kiln_target_from_cc(7, 0, 80, 0, &t), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "7.0"));
}

Test(target, names_in_any_case)
{
    static const char *const names[][2] = {
        { "H100", "sm_90a" }, { "SM_90A", "sm_90a" }, { "Sm_80", "sm_80" }, { "B200", "sm_100" },
        { "RTX-5090", "sm_120" }, { "DGX-Spark", "sm_121" },
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        kiln_target t;
        cr_assert_eq(kiln_target_from_name(names[i][0], &t), KILN_OK, "%s: %s", names[i][0],
                     kiln_last_error());
        cr_assert_str_eq(t.name, names[i][1], "%s", names[i][0]);
    }
    kiln_target t;
    cr_assert_eq(kiln_target_from_name("sm_90a_long_name_past_the_table", &t), KILN_ERR_NOT_FOUND);
}

/* Blackwell, Thor and Orin: portable backends' capabilities, no wgmma; a
 * product names the architecture its live device plans for. */
Test(target, blackwell_and_orin)
{
    static const struct {
        const char *name, *arch;
        int sm, sm_count;
    } want[] = {
        { "sm_100", "sm_100", 100, 0 },   { "sm_100a", "sm_100a", 100, 0 },
        { "sm_103a", "sm_103a", 103, 0 }, { "sm_110", "sm_110", 110, 0 },
        { "sm_120", "sm_120", 120, 0 },   { "sm_120a", "sm_120a", 120, 0 },
        { "sm_121", "sm_121", 121, 0 },   { "sm_87", "sm_87", 87, 0 },
        { "b200", "sm_100", 100, 148 },   { "gb200", "sm_100", 100, 152 },
        { "rtx-pro-6000", "sm_120", 120, 188 }, { "rtx-5090", "sm_120", 120, 170 },
        { "dgx-spark", "sm_121", 121, 48 },     { "orin", "sm_87", 87, 16 },
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        kiln_target t;
        cr_assert_eq(kiln_target_from_name(want[i].name, &t), KILN_OK, "%s", want[i].name);
        cr_assert_str_eq(t.name, want[i].arch);
        cr_assert_eq(t.sm, want[i].sm, "%s", want[i].name);
        cr_assert_eq(t.sm_count, want[i].sm_count, "%s", want[i].name);
        cr_assert(!t.wgmma && t.mma_bf16, "%s", want[i].name);
        cr_assert_eq(t.arch_specific, t.name[strlen(t.name) - 1] == 'a', "%s", want[i].name);
        cr_assert_eq(t.mma_fp8, t.sm >= 89, "%s", want[i].name);
    }
}

/* A live device of every compute capability NVRTC 13 compiles for (and one
 * newer than kiln's table, which plans): its target, asked for through the
 * API, plans and compiles with NVRTC, no GPU needed. */
Test(target, every_live_capability_compiles, .init = kt_tmp_setup, .fini = kt_tmp_teardown,
     .timeout = 900)
{
    static const int cc[][2] = { { 7, 5 },  { 8, 0 },  { 8, 6 },  { 8, 7 },  { 8, 8 },  { 8, 9 },
                                 { 9, 0 },  { 10, 0 }, { 10, 3 }, { 11, 0 }, { 12, 0 }, { 12, 1 } };
    static kt_model m;
    kt_model_make(&m);
    kiln_graph *g;
    cr_assert_eq(kt_model_graph(&m, &g), KILN_OK, "%s", kiln_last_error());
    static const int64_t capture[] = { 1, 32 };
    char cache[512];
    kiln_compile_options o = { .quiet = 1, .jobs = 2,
                               .cache.path = kt_in_tmp(cache, sizeof cache, "every.kiln"),
                               .plan = { .capture = capture, .n_capture = 2 } };
    for (size_t i = 0; i < sizeof cc / sizeof cc[0]; i++) {
        kiln_target t;
        cr_assert_eq(kiln_target_from_cc(cc[i][0], cc[i][1], 0, 0, &t), KILN_OK, "%d.%d",
                     cc[i][0], cc[i][1]);
        kiln_compile_result r;
        cr_assert_eq(kiln_compile(g, &t, &o, &r), KILN_OK, "%d.%d (%s): %s", cc[i][0], cc[i][1],
                     t.name, kiln_last_error());
        cr_assert_gt(r.compiled, 0, "%s", t.name);
        cr_assert_eq(r.compiled + r.cached, r.signatures);
    }
    kiln_target t;
    kiln_plan *p;
    cr_assert_eq(kiln_target_from_cc(13, 0, 0, 0, &t), KILN_OK);
    cr_assert_str_eq(t.name, "sm_130");
    cr_assert_eq(kiln_plan_create(g, &t, &o.plan, &p), KILN_OK, "%s", kiln_last_error());
    kiln_plan_destroy(p);
    kiln_graph_destroy(g);
    kt_model_free(&m);
}

Test(target, which_cubins_a_device_loads)
{
    static const struct {
        const char *device, *cubins;
        int loads;
    } cases[] = {
        { "sm_86", "sm_80", 1 },   { "sm_80", "sm_86", 0 },   { "sm_90a", "sm_80", 0 },
        { "sm_90a", "sm_90", 1 },  { "sm_90a", "sm_90a", 1 }, { "sm_103", "sm_100a", 0 },
        { "sm_121", "sm_120", 1 }, { "sm_121", "sm_120a", 0 }, { "sm_100", "sm_90", 0 },
        { "sm_103", "sm_100", 1 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kiln_target d, c;
        cr_assert_eq(kiln_target_from_name(cases[i].device, &d), KILN_OK);
        cr_assert_eq(kiln_target_from_name(cases[i].cubins, &c), KILN_OK);
        cr_assert_eq(kiln_target_loads(&d, &c), cases[i].loads, "%s on %s", cases[i].cubins,
                     cases[i].device);
    }
}
