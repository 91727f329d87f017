/* Named GPU targets: what each architecture offers the backends' capability
 * checks, known without a GPU so a build machine can compile for them. */
#include "codegen/target.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Shared memory per block with the opt-in attribute, from the CUDA
 * programming guide's per-capability table. Blackwell and Orin get the
 * portable backends: wgmma is sm_90a's alone, and the "a" targets of
 * Blackwell name chips whose own tensor-core instructions no backend uses
 * yet. */
static const kiln_target arch_table[] = {
    { .name = "sm_75", .sm = 75, .smem_optin = 65536 },
    { .name = "sm_80", .sm = 80, .mma_bf16 = 1, .smem_optin = 166912 },
    { .name = "sm_86", .sm = 86, .mma_bf16 = 1, .smem_optin = 101376 },
    { .name = "sm_87", .sm = 87, .mma_bf16 = 1, .smem_optin = 166912 },
    { .name = "sm_89", .sm = 89, .mma_bf16 = 1, .mma_fp8 = 1, .smem_optin = 101376 },
    { .name = "sm_90", .sm = 90, .mma_bf16 = 1, .mma_fp8 = 1, .tma = 1, .smem_optin = 232448 },
    { .name = "sm_90a", .sm = 90, .arch_specific = 1, .mma_bf16 = 1, .mma_fp8 = 1, .wgmma = 1,
      .tma = 1, .smem_optin = 232448 },
    { .name = "sm_100", .sm = 100, .mma_bf16 = 1, .mma_fp8 = 1, .tma = 1, .smem_optin = 232448 },
    { .name = "sm_100a", .sm = 100, .arch_specific = 1, .mma_bf16 = 1, .mma_fp8 = 1, .tma = 1,
      .smem_optin = 232448 },
    { .name = "sm_103", .sm = 103, .mma_bf16 = 1, .mma_fp8 = 1, .tma = 1, .smem_optin = 232448 },
    { .name = "sm_103a", .sm = 103, .arch_specific = 1, .mma_bf16 = 1, .mma_fp8 = 1, .tma = 1,
      .smem_optin = 232448 },
    { .name = "sm_110", .sm = 110, .mma_bf16 = 1, .mma_fp8 = 1, .tma = 1, .smem_optin = 232448 },
    { .name = "sm_120", .sm = 120, .mma_bf16 = 1, .mma_fp8 = 1, .tma = 1, .smem_optin = 101376 },
    { .name = "sm_120a", .sm = 120, .arch_specific = 1, .mma_bf16 = 1, .mma_fp8 = 1, .tma = 1,
      .smem_optin = 101376 },
    { .name = "sm_121", .sm = 121, .mma_bf16 = 1, .mma_fp8 = 1, .tma = 1, .smem_optin = 101376 },
    { .name = "sm_121a", .sm = 121, .arch_specific = 1, .mma_bf16 = 1, .mma_fp8 = 1, .tma = 1,
      .smem_optin = 101376 },
};

/* Products name the architecture their live device plans for (what
 * kiln_target_from_cc gives it, so a cache compiled by product name serves
 * the live device) and fix the multiprocessor count (the SXM / PCIe parts
 * kiln is measured on, the full chip of the others). */
static const struct {
    const char *alias, *arch;
    int sm_count;
} alias_table[] = {
    { "t4", "sm_75", 40 },        { "a100", "sm_80", 108 },      { "a10", "sm_86", 72 },
    { "l40s", "sm_89", 142 },     { "h100", "sm_90a", 132 },     { "h200", "sm_90a", 132 },
    { "orin", "sm_87", 16 },      { "b200", "sm_100", 148 },     { "gb200", "sm_100", 152 },
    { "rtx-pro-6000", "sm_120", 188 }, { "rtx-5090", "sm_120", 170 },
    { "dgx-spark", "sm_121", 48 },
};

static const char *const target_names[] = {
    "sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a",
    "sm_103", "sm_103a", "sm_110", "sm_120", "sm_120a", "sm_121", "sm_121a",
    "t4", "a100", "a10", "l40s", "h100", "h200", "orin", "b200", "gb200", "rtx-pro-6000",
    "rtx-5090", "dgx-spark", NULL,
};

_Static_assert(KILN_ARRAY_LEN(target_names) ==
                   KILN_ARRAY_LEN(arch_table) + KILN_ARRAY_LEN(alias_table) + 1,
               "every architecture and alias is listed once");

const char *const *kiln_target_names(void) { return target_names; }

static kiln_status unknown(const char *name)
{
    char known[512] = "";
    size_t n = 0;
    for (const char *const *t = target_names; *t && n < sizeof known; t++) {
        int w = snprintf(known + n, sizeof known - n, "%s%s", n ? ", " : "", *t);
        n += w > 0 ? (size_t)w : 0;
    }
    return kiln_fail(KILN_ERR_NOT_FOUND, "unknown target '%s' (known, in any case: %s)", name,
                     known);
}

/* "sm_NN" or "sm_NNa" with NN a compute capability of sm_75 or newer:
 * *sm and *a, else 0. */
static int arch_number(const char *name, int *sm, int *a)
{
    if (strncmp(name, "sm_", 3) || !isdigit((unsigned char)name[3]))
        return 0;
    char *end;
    long v = strtol(name + 3, &end, 10);
    if (v < 75 || v > 999 || (*end && strcmp(end, "a")))
        return 0;
    *sm = (int)v;
    *a = *end == 'a';
    return 1;
}

kiln_status kiln_target_arch(const char *name, kiln_target *out)
{
    for (size_t i = 0; i < KILN_ARRAY_LEN(arch_table); i++)
        if (!strcmp(name, arch_table[i].name)) {
            *out = arch_table[i];
            return KILN_OK;
        }
    int sm, a;
    if (!arch_number(name, &sm, &a))
        return unknown(name);
    /* An architecture newer than the table: what every later one keeps. */
    *out = (kiln_target){ .sm = sm, .arch_specific = a, .mma_bf16 = 1, .mma_fp8 = 1,
                          .tma = 1, .smem_optin = 101376 };
    snprintf(out->name, sizeof out->name, "%s", name);
    return KILN_OK;
}

kiln_status kiln_target_from_name(const char *name, kiln_target *out)
{
    if (!name || !out)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_target_from_name: name and out are required");
    char lower[16];
    size_t n = strlen(name);
    if (n >= sizeof lower)
        return unknown(name);
    for (size_t i = 0; i <= n; i++)
        lower[i] = (char)tolower((unsigned char)name[i]);
    const char *arch = lower, *alias = NULL;
    int sm_count = 0;
    for (size_t i = 0; i < KILN_ARRAY_LEN(alias_table); i++)
        if (!strcmp(lower, alias_table[i].alias)) {
            alias = alias_table[i].alias;
            arch = alias_table[i].arch;
            sm_count = alias_table[i].sm_count;
        }
    for (size_t i = 0; i < KILN_ARRAY_LEN(arch_table); i++) {
        if (strcmp(arch, arch_table[i].name))
            continue;
        *out = arch_table[i];
        out->sm_count = sm_count;
        if (alias)
            snprintf(out->alias_of, sizeof out->alias_of, "%s", alias);
        return KILN_OK;
    }
    return unknown(name);
}

kiln_status kiln_target_from_cc(int major, int minor, int sm_count, int smem_optin,
                                kiln_target *out)
{
    int sm = major * 10 + minor;
    if (major < 7 || minor < 0 || minor > 9 || sm < 75 || major > 99)
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "compute capability %d.%d: kiln needs 7.5 (sm_75) or newer", major,
                         minor);
    /* A live sm_90 device is a Hopper chip, where the arch-specific
     * instructions (wgmma) exist: its cubins are built for sm_90a. Other
     * chips run the portable backends, built for the plain architecture. */
    char name[16];
    snprintf(name, sizeof name, "sm_%d%s", sm, sm == 90 ? "a" : "");
    kiln_target t;
    kiln_status st = kiln_target_arch(name, &t);
    if (st != KILN_OK)
        return st;
    t.sm_count = sm_count;
    if (smem_optin > 0)
        t.smem_optin = smem_optin;
    *out = t;
    return KILN_OK;
}

int kiln_target_loads(const kiln_target *device, const kiln_target *cubins)
{
    if (cubins->arch_specific)
        return cubins->sm == device->sm;
    return cubins->sm / 10 == device->sm / 10 && cubins->sm <= device->sm;
}
