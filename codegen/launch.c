/* A kernel's launches for a bucket: a linear's from its backend, the aux
 * kernels' one block of KILN_ROW_THREADS per row (an fp8-tensor
 * quantizer's amax kernel first, over KILN_QUANT_AMAX_PARTS blocks). */
#include "codegen/emit.h"

#include "kernels/common/kiln_args.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

kiln_status kiln_kernel_launches(const kiln_kernel_desc *d, int64_t m,
                                 kiln_kernel_launch out[KILN_MAX_LAUNCHES], int *n)
{
    if (!d || !out || !n)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "kiln_kernel_launches: desc, out and n are required");
    if (m < 1 || m > INT_MAX)
        return kiln_fail(KILN_ERR_SHAPE, "%s: cannot launch for M = %lld (1 to %d)", d->entry,
                         (long long)m, INT_MAX);
    kiln_kernel_launch l[KILN_MAX_LAUNCHES];
    int count = 0;
    const kiln_launch rows = { .grid = { (unsigned)m, 1, 1 }, .block = { KILN_ROW_THREADS, 1, 1 } };
    switch (d->kind) {
    case KILN_STEP_LINEAR: {
        if (!d->backend->launch)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: backend %s has no code hooks", d->entry,
                             d->backend->name);
        kiln_status st = d->backend->launch(&d->target, &d->linear, m, &l[count].cfg);
        if (st != KILN_OK)
            return kiln_fail_prefix(st, "%s", d->entry);
        snprintf(l[count++].entry, KILN_ENTRY_MAX, "%s", d->entry);
        break;
    }
    case KILN_STEP_OP:
        l[count].cfg = rows;
        snprintf(l[count++].entry, KILN_ENTRY_MAX, "%s", d->entry);
        break;
    case KILN_STEP_QUANT:
        if (kiln_emit_quant_has_amax(d->act)) {
            l[count].cfg = (kiln_launch){ .grid = { KILN_QUANT_AMAX_PARTS, 1, 1 },
                                          .block = { KILN_ROW_THREADS, 1, 1 } };
            snprintf(l[count++].entry, KILN_ENTRY_MAX, "%.*s" KILN_EMIT_AMAX_SUFFIX,
                     (int)(KILN_ENTRY_MAX - sizeof KILN_EMIT_AMAX_SUFFIX), d->entry);
        }
        l[count].cfg = rows;
        snprintf(l[count++].entry, KILN_ENTRY_MAX, "%s", d->entry);
        break;
    case KILN_STEP_PACK: /* its blocks follow from the weight's shape at load */
        l[count].cfg = (kiln_launch){ .grid = { 1, 1, 1 }, .block = { KILN_PACK_THREADS, 1, 1 } };
        snprintf(l[count++].entry, KILN_ENTRY_MAX, "%s", d->entry);
        break;
    }
    memcpy(out, l, (size_t)count * sizeof *l);
    *n = count;
    return KILN_OK;
}
