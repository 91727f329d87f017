/* The default registry: every name in a priority list is a registered
 * backend that claims the format, every format has a list, every
 * registered backend is in some list and has a name an entry can carry,
 * and each format's list is the policy kernels/registry/registry.c
 * states. */
#include <criterion/criterion.h>
#include <ctype.h>
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

/* Each format's list: gemv_tc first where it has a kernel for the format
 * (every format up to GGML MXFP4 but F32), then wgmma_tc for the formats
 * it decodes (the 4-bit ones exactly, the integer GGML ones rounded to
 * BF16, and F16 rounded), then gemv (every format), then wgmma and simt
 * (BF16's and FP8 per-tensor and per-channel atoms are wgmma's alone).
 * A backend that claims a format is in its list. */
Test(registry, each_format_lists_the_decode_backends_first)
{
    const kiln_registry *r = kiln_registry_default();
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        const char *name = kiln_format_get((kiln_format)f)->name;
        const char *want[KILN_MAX_BACKENDS + 1] = { 0 };
        int n = 0;
        const int packed = f <= KILN_FMT_GGML_MXFP4;
        const int one_copy = f == KILN_FMT_NVFP4 || f == KILN_FMT_MXFP4 ||
                             f == KILN_FMT_GGML_MXFP4 || f == KILN_FMT_Q8_0 ||
                             f == KILN_FMT_Q4_0 || f == KILN_FMT_Q4_K || f == KILN_FMT_Q6_K ||
                             f == KILN_FMT_MXFP8 || f == KILN_FMT_F16;
        if (packed && f != KILN_FMT_F32)
            want[n++] = "gemv_tc";
        if (one_copy)
            want[n++] = "wgmma_tc";
        want[n++] = "gemv";
        want[n++] = "wgmma";
        want[n++] = "simt";
        for (int i = 0; i <= n; i++) {
            if (!want[i]) {
                cr_assert_null(r->priority[f][i], "%s: %s past the policy's list", name,
                               r->priority[f][i]);
                break;
            }
            cr_assert_not_null(r->priority[f][i], "%s: the list stops before %s", name, want[i]);
            cr_assert_str_eq(r->priority[f][i], want[i], "%s, place %d", name, i);
        }
        for (int j = 0; j < r->n; j++) {
            unsigned in = 0;
            for (int i = 0; r->priority[f][i]; i++)
                in |= !strcmp(r->priority[f][i], r->backends[j]->name);
            cr_assert_eq(in, (r->backends[j]->formats >> f) & 1, "%s and %s", name,
                         r->backends[j]->name);
        }
    }
    cr_assert_eq(kiln_registry_find(r, "gemv_tc")->formats,
                 ((1u << (KILN_FMT_GGML_MXFP4 + 1)) - 1) & ~(1u << KILN_FMT_F32));
    cr_assert_eq(kiln_registry_find(r, "gemv")->formats, (1u << KILN_FMT_COUNT) - 1);
}

/* A kernel's entry is "kiln_<backend>_<hash>" (codegen/sig.h): a name
 * must be a C identifier's part, and names are distinct. */
Test(registry, backend_names_can_name_an_entry)
{
    const kiln_registry *r = kiln_registry_default();
    cr_assert_eq(r->n, 5);
    for (int j = 0; j < r->n; j++) {
        const char *name = r->backends[j]->name;
        cr_assert_gt(strlen(name), 0);
        for (const char *c = name; *c; c++)
            cr_assert(islower((unsigned char)*c) || isdigit((unsigned char)*c) || *c == '_',
                      "backend \"%s\": '%c' cannot be part of an entry name", name, *c);
        cr_assert_eq(kiln_registry_find(r, name), r->backends[j], "%s", name);
    }
}

Test(registry, find_takes_exact_names_only)
{
    const kiln_registry *r = kiln_registry_default();
    cr_assert_eq(kiln_registry_find(r, "gemv"), &kiln_backend_gemv);
    cr_assert_eq(kiln_registry_find(r, "gemv_tc"), &kiln_backend_gemv_tc);
    cr_assert_null(kiln_registry_find(r, "gem"));
    cr_assert_null(kiln_registry_find(r, "gemv-tc"));
    cr_assert_null(kiln_registry_find(r, "mma"));
    cr_assert_null(kiln_registry_find(r, ""));
}

/* The static epilogue names join the bits' names with '+' in bit order,
 * and name nothing else. */
Test(registry, epilogue_names_cover_every_combination)
{
    static const char *const bits[] = { "bias", "residual", "silu_mul", "gate" };
    for (unsigned epi = 0; epi < 16; epi++) {
        char want[64] = "", buf[64];
        for (unsigned b = 0; b < 4; b++)
            if (epi & (1u << b))
                snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s",
                         want[0] ? "+" : "", bits[b]);
        if (!want[0])
            snprintf(want, sizeof want, "none");
        cr_assert_str_eq(kiln_epilogue_str(epi), want);
        cr_assert_str_eq(kiln_epilogue_name(epi, buf, sizeof buf), want);
    }
    cr_assert_str_eq(kiln_epilogue_str(16), "?");
}
