/* The weight memory a plan puts on a device: every weight once in each
 * layout its kernels read (runtime/session.c keeps exactly these copies). */
#include "codegen/plan.h"

/* The layouts weight w is read in: *storage set when some kernel reads
 * kiln's storage layout, and the distinct packing backends with their
 * sizes. */
typedef struct weight_layouts {
    int storage;
    const kiln_backend *packer[KILN_MAX_BACKENDS];
    size_t bytes[KILN_MAX_BACKENDS];
    int n;
} weight_layouts;

static kiln_status layouts_of(const kiln_plan *p, const kiln_tensor *w, weight_layouts *out)
{
    *out = (weight_layouts){ 0 };
    for (int i = 0; i < p->n_linears; i++) {
        const kiln_plan_lin *l = &p->linears[i];
        if (l->node->src[1] != w)
            continue;
        for (int b = 0; b < p->n_buckets; b++) {
            const kiln_kernel_desc *d = &p->signatures[l->choice[b].signature].desc;
            kiln_weight_layout lay = { 0 };
            kiln_status st;
            if (d->backend->layout && (st = d->backend->layout(&p->target, &d->linear, &lay)))
                return kiln_fail_prefix(st, "weight %s", w->name);
            if (!lay.packed) {
                out->storage = 1;
                continue;
            }
            int k = 0;
            while (k < out->n && out->packer[k] != d->backend)
                k++;
            if (k == out->n && out->n < KILN_MAX_BACKENDS) {
                out->packer[k] = d->backend;
                if (!kiln_add_size(lay.data_bytes, lay.scale_bytes, &out->bytes[k]))
                    return kiln_fail(KILN_ERR_SHAPE, "weight %s: packed size overflows", w->name);
                out->n++;
            }
        }
    }
    return KILN_OK;
}

kiln_status kiln_plan_weight_bytes(const kiln_plan *p, size_t *storage, size_t *packed)
{
    if (!p || !storage || !packed)
        return kiln_fail(KILN_ERR_INVALID_ARG, "plan weight bytes: plan and outputs are required");
    *storage = *packed = 0;
    for (int i = 0; i < p->n_linears; i++) {
        const kiln_tensor *w = p->linears[i].node->src[1];
        int first = 1;
        for (int j = 0; j < i && first; j++)
            first = p->linears[j].node->src[1] != w;
        if (!first)
            continue;
        weight_layouts wl;
        kiln_status st = layouts_of(p, w, &wl);
        if (st != KILN_OK)
            return st;
        if (wl.storage) {
            size_t data, scale;
            if ((st = kiln_format_data_bytes(w->weight.format, w->weight.n, w->weight.k, &data)) ||
                (st = kiln_format_scale_bytes(w->weight.format, w->weight.n, w->weight.k, &scale)))
                return kiln_fail_prefix(st, "weight %s", w->name);
            if (!kiln_add_size(*storage, data, storage) || !kiln_add_size(*storage, scale, storage))
                return kiln_fail(KILN_ERR_SHAPE, "plan weight bytes: the sum overflows");
        }
        for (int k = 0; k < wl.n; k++)
            if (!kiln_add_size(*packed, wl.bytes[k], packed))
                return kiln_fail(KILN_ERR_SHAPE, "plan weight bytes: the sum overflows");
    }
    return KILN_OK;
}
