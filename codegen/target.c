/* Named GPU targets: what each architecture offers the backends' capability
 * checks, known without a GPU so a build machine can compile for them. */
#include "core.h"

#include <stdio.h>
#include <string.h>

/* Shared memory per block with the opt-in attribute, from the CUDA
 * programming guide's per-capability table. */
static const kiln_target arch_table[] = {
    { .name = "sm_75", .sm = 75, .smem_optin = 65536 },
    { .name = "sm_80", .sm = 80, .mma_bf16 = 1, .smem_optin = 166912 },
    { .name = "sm_86", .sm = 86, .mma_bf16 = 1, .smem_optin = 101376 },
    { .name = "sm_89", .sm = 89, .mma_bf16 = 1, .mma_fp8 = 1, .smem_optin = 101376 },
    { .name = "sm_90", .sm = 90, .mma_bf16 = 1, .mma_fp8 = 1, .tma = 1, .smem_optin = 232448 },
    { .name = "sm_90a", .sm = 90, .arch_specific = 1, .mma_bf16 = 1, .mma_fp8 = 1, .wgmma = 1,
      .tma = 1, .smem_optin = 232448 },
};

/* Products name an architecture and fix the multiprocessor count (the SXM /
 * PCIe parts kiln is measured on). */
static const struct {
    const char *alias, *arch;
    int sm_count;
} alias_table[] = {
    { "t4", "sm_75", 40 },   { "a100", "sm_80", 108 }, { "a10", "sm_86", 72 },
    { "l40s", "sm_89", 142 }, { "h100", "sm_90a", 132 }, { "h200", "sm_90a", 132 },
};

static const char *const target_names[] = {
    "sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a",
    "t4", "a100", "a10", "l40s", "h100", "h200", NULL,
};

const char *const *kiln_target_names(void) { return target_names; }

kiln_status kiln_target_from_name(const char *name, kiln_target *out)
{
    if (!name || !out)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_target_from_name: name and out are required");
    const char *arch = name;
    int sm_count = 0;
    for (size_t i = 0; i < KILN_ARRAY_LEN(alias_table); i++)
        if (!strcmp(name, alias_table[i].alias)) {
            arch = alias_table[i].arch;
            sm_count = alias_table[i].sm_count;
        }
    for (size_t i = 0; i < KILN_ARRAY_LEN(arch_table); i++) {
        if (strcmp(arch, arch_table[i].name))
            continue;
        *out = arch_table[i];
        out->sm_count = sm_count;
        if (arch != name)
            snprintf(out->alias_of, sizeof out->alias_of, "%s", name);
        return KILN_OK;
    }
    return kiln_fail(KILN_ERR_NOT_FOUND,
                     "unknown target '%s' (known: sm_75, sm_80, sm_86, sm_89, sm_90, sm_90a, "
                     "t4, a100, a10, l40s, h100, h200)", name);
}

kiln_status kiln_target_from_cc(int major, int minor, int sm_count, int smem_optin,
                                kiln_target *out)
{
    int sm = major * 10 + minor;
    if (major < 7 || minor < 0 || minor > 9 || sm < 75)
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "compute capability %d.%d: kiln needs 7.5 (sm_75) or newer", major,
                         minor);
    /* A live sm_90 device is a Hopper chip, where the arch-specific
     * instructions (wgmma) exist: its cubins are built for sm_90a. */
    char name[16];
    snprintf(name, sizeof name, "sm_%d%s", sm, sm == 90 ? "a" : "");
    kiln_target t;
    if (kiln_target_from_name(name, &t) != KILN_OK) {
        /* An architecture newer than the table: what every later one keeps. */
        t = (kiln_target){ .sm = sm, .mma_bf16 = 1, .mma_fp8 = 1, .tma = sm >= 90 };
        snprintf(t.name, sizeof t.name, "%s", name);
    }
    t.sm_count = sm_count;
    if (smem_optin > 0)
        t.smem_optin = smem_optin;
    kiln_clear_error();
    *out = t;
    return KILN_OK;
}
