/* The default registry: every name in a priority list is a registered
 * backend that claims the format, every format has a list, and every
 * registered backend is in some list. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "kernels/registry/backend.h"

Test(registry, every_priority_name_is_a_registered_backend_for_the_format)
{
    const kiln_registry *r = kiln_registry_default();
    int listed[KILN_MAX_BACKENDS] = { 0 };
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        const char *const *names = r->priority[f];
        cr_assert_not_null(names[0], "format %s has an empty priority list",
                           kiln_format_get((kiln_format)f)->name);
        for (int i = 0; names[i]; i++) {
            const kiln_backend *b = kiln_registry_find(r, names[i]);
            cr_assert_not_null(b, "%s's list names \"%s\", which is not registered",
                               kiln_format_get((kiln_format)f)->name, names[i]);
            cr_assert(b->formats & (1u << f), "%s's list names %s, which has no kernel for it",
                      kiln_format_get((kiln_format)f)->name, names[i]);
            for (int j = 0; j < i; j++)
                cr_assert_str_neq(names[j], names[i], "%s is listed twice", names[i]);
            for (int j = 0; j < r->n; j++)
                listed[j] |= r->backends[j] == b;
        }
    }
    for (int j = 0; j < r->n; j++)
        cr_assert(listed[j], "backend %s is in no priority list", r->backends[j]->name);
}

Test(registry, find_takes_exact_names_only)
{
    const kiln_registry *r = kiln_registry_default();
    cr_assert_not_null(kiln_registry_find(r, "gemv"));
    cr_assert_null(kiln_registry_find(r, "gem"));
    cr_assert_null(kiln_registry_find(r, "mma"));
    cr_assert_null(kiln_registry_find(r, ""));
}

/* The static epilogue names join the bits' names with '+' in bit order,
 * and name nothing else. */
Test(registry, epilogue_names_cover_every_combination)
{
    static const char *const bits[] = { "bias", "residual", "silu_mul" };
    for (unsigned epi = 0; epi < 8; epi++) {
        char want[64] = "", buf[64];
        for (unsigned b = 0; b < 3; b++)
            if (epi & (1u << b))
                snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s",
                         want[0] ? "+" : "", bits[b]);
        if (!want[0])
            snprintf(want, sizeof want, "none");
        cr_assert_str_eq(kiln_epilogue_str(epi), want);
        cr_assert_str_eq(kiln_epilogue_name(epi, buf, sizeof buf), want);
    }
    cr_assert_str_eq(kiln_epilogue_str(8), "?");
}
