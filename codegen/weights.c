/* The weight memory a plan puts on a device: every weight once in each
 * layout its kernels read (runtime/session.c keeps exactly these copies). */
#include "codegen/plan.h"

/* The layouts weight w is read in, as the plan's steps give them:
 * *storage set when some kernel reads kiln's storage layout, and the
 * distinct packed layouts with their sizes. */
typedef struct weight_layouts {
    int storage;
    kiln_pack_fn pack[KILN_MAX_BACKENDS];
    size_t bytes[KILN_MAX_BACKENDS];
    int n;
} weight_layouts;

static kiln_status layouts_of(const kiln_plan *p, const kiln_tensor *w, weight_layouts *out)
{
    *out = (weight_layouts){ 0 };
    for (int b = 0; b < p->n_buckets; b++) {
        const kiln_program *bk = &p->programs[b];
        for (int i = 0; i < bk->n_steps; i++) {
            const kiln_step *s = &bk->steps[i];
            if (s->kind != KILN_STEP_LINEAR || (s->weight != w && s->weight2 != w))
                continue;
            if (!s->layout.pack) {
                out->storage = 1;
                continue;
            }
            int k = 0;
            while (k < out->n && out->pack[k] != s->layout.pack)
                k++;
            if (k == out->n && out->n < KILN_MAX_BACKENDS) {
                out->pack[k] = s->layout.pack;
                if (!kiln_add_size(s->layout.data_bytes, s->layout.scale_bytes, &out->bytes[k]))
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
                (st = kiln_qtensor_scale_bytes(&w->weight, &scale)))
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
