#include <criterion/criterion.h>
#include <string.h>

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
    cr_assert_eq(kiln_target_from_name("sm_100a", &t), KILN_ERR_NOT_FOUND);
    cr_assert(strstr(kiln_last_error(), "'sm_100a'"));
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
