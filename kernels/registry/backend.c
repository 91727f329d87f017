#include "kernels/registry/backend.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* static_form: what a linear that reads this scheme reads instead when it
 * has a static input scale (KILN_ACT_COUNT: none, the scale is ignored):
 * the same layout, made with the checkpoint's scale. */
static const struct {
    const char *name;
    int group;      /* elements per scale along K; 0: one scale per row or tensor */
    int scale_bytes;
    int elem_bytes; /* of the values */
    kiln_act static_form;
} act_table[] = {
    [KILN_ACT_BF16] = { "bf16", 0, 0, 2, KILN_ACT_BF16_QDQ },
    /* the scale lives outside the rows */
    [KILN_ACT_FP8_TENSOR] = { "fp8-tensor", 0, 0, 1, KILN_ACT_COUNT },
    [KILN_ACT_FP8_TOKEN] = { "fp8-token", 0, 4, 1, KILN_ACT_FP8_STATIC },
    [KILN_ACT_FP8_G128] = { "fp8-1x128", 128, 4, 1, KILN_ACT_COUNT },
    [KILN_ACT_MXFP8_G32] = { "mxfp8-1x32", 32, 1, 1, KILN_ACT_COUNT },
    [KILN_ACT_FP8_STATIC] = { "fp8-static", 0, 4, 1, KILN_ACT_FP8_STATIC },
    [KILN_ACT_BF16_QDQ] = { "bf16-qdq", 0, 0, 2, KILN_ACT_BF16_QDQ },
    /* a permutation of the values: no static form yet, the scale is ignored */
    [KILN_ACT_BF16_TC] = { "bf16-tc", 0, 0, 2, KILN_ACT_COUNT },
};
_Static_assert(KILN_ARRAY_LEN(act_table) == KILN_ACT_COUNT, "one row per activation scheme");

const char *kiln_act_name(kiln_act a)
{
    return (unsigned)a < KILN_ACT_COUNT ? act_table[a].name : "?";
}

size_t kiln_act_row_bytes(kiln_act a, int64_t k)
{
    size_t scales = act_table[a].group ? (size_t)kiln_ceil_div(k, act_table[a].group) : 1;
    return (size_t)k * (size_t)act_table[a].elem_bytes + scales * (size_t)act_table[a].scale_bytes;
}

kiln_act kiln_act_static_form(kiln_act a)
{
    return (unsigned)a < KILN_ACT_COUNT ? act_table[a].static_form : KILN_ACT_COUNT;
}

/* Every combination of the KILN_EPI_* bits, by value. */
static const char *const epilogue_names[] = {
    "none",          "bias",
    "residual",      "bias+residual",
    "silu_mul",      "bias+silu_mul",
    "residual+silu_mul", "bias+residual+silu_mul",
    "gate",          "bias+gate",
    "residual+gate", "bias+residual+gate",
    "silu_mul+gate", "bias+silu_mul+gate",
    "residual+silu_mul+gate", "bias+residual+silu_mul+gate",
};
_Static_assert(KILN_ARRAY_LEN(epilogue_names) == 2 * KILN_EPI_GATE, "every combination");

const char *kiln_epilogue_str(unsigned epi)
{
    return epi < KILN_ARRAY_LEN(epilogue_names) ? epilogue_names[epi] : "?";
}

const char *kiln_epilogue_name(unsigned epi, char *buf, size_t size)
{
    snprintf(buf, size, "%s", kiln_epilogue_str(epi));
    return buf;
}

const char *kiln_epilogue_template_args(unsigned epi, char *buf, size_t size)
{
    snprintf(buf, size, "/*bias*/ %s, /*residual*/ %s, /*silu_mul*/ %s%s",
             epi & KILN_EPI_BIAS ? "true" : "false", epi & KILN_EPI_RESIDUAL ? "true" : "false",
             epi & KILN_EPI_SILU_MUL ? "true" : "false",
             epi & KILN_EPI_GATE ? ", /*gate*/ true" : "");
    return buf;
}

int64_t kiln_block_smem_limit(const kiln_target *t)
{
    return t->smem_optin > 0 ? t->smem_optin : 48 * 1024;
}

static const char *row_name(const kiln_variant_table *t, size_t i)
{
    return *(const char *const *)((const char *)t->rows + i * t->stride + t->name_at);
}

static size_t row_for_bucket(const kiln_variant_table *t, int64_t m)
{
    size_t i = 0;
    while (i + 1 < t->n &&
           m > *(const int64_t *)((const char *)t->rows + i * t->stride + t->max_m_at))
        i++;
    return i;
}

const void *kiln_variant_for_bucket(const kiln_variant_table *t, int64_t m)
{
    return (const char *)t->rows + row_for_bucket(t, m) * t->stride;
}

const char *kiln_variant_name_for_bucket(const kiln_variant_table *t, int64_t m)
{
    return row_name(t, row_for_bucket(t, m));
}

const void *kiln_variant_named(const kiln_variant_table *t, const char *name)
{
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(row_name(t, i), name))
            return (const char *)t->rows + i * t->stride;
    return NULL;
}

const kiln_backend *kiln_registry_find(const kiln_registry *r, const char *name)
{
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->backends[i]->name, name))
            return r->backends[i];
    return NULL;
}

kiln_status kiln_linear_kernel_check(const char *backend, const kiln_linear_kernel *k,
                                     kiln_act act)
{
    if (k->act != act)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: activations must be %s, not %s", backend,
                         kiln_act_name(act), kiln_act_name(k->act));
    if ((k->cfg.epilogue & KILN_EPI_RESIDUAL) && (k->cfg.epilogue & KILN_EPI_SILU_MUL))
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "%s: residual and silu_mul cannot both be fused (one aux input)", backend);
    if ((k->cfg.epilogue & KILN_EPI_GATE) &&
        (k->cfg.epilogue & (KILN_EPI_SILU_MUL | KILN_EPI_BIAS)) != KILN_EPI_SILU_MUL)
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "%s: the gate projection is fused only with silu_mul, without a bias",
                         backend);
    if (!kiln_format_get(k->cfg.format))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: format %d is not a kiln_format", backend,
                         (int)k->cfg.format);
    return KILN_OK;
}

int kiln_linear_group_fits(const kiln_linear_cfg *c, int unit, char *why, size_t size)
{
    const kiln_format_info *fi = kiln_format_get(c->format);
    if (!fi || !fi->grouped || c->group == 0 ||
        (c->group > 0 && c->group % unit == 0 && c->k % c->group == 0))
        return 1;
    snprintf(why, size, "%s group %lld is not a multiple of %d dividing K = %lld", fi->name,
             (long long)c->group, unit, (long long)c->k);
    return 0;
}

kiln_act kiln_backend_act(const kiln_backend *b, const kiln_target *t, const kiln_linear_cfg *c,
                          int64_t bucket)
{
    return b->act ? b->act(t, c, bucket) : KILN_ACT_BF16;
}

void kiln_backend_variant(const kiln_backend *b, const kiln_target *t, const kiln_linear_cfg *c,
                          int64_t bucket, char *buf, size_t size)
{
    if (b->variant)
        b->variant(t, c, bucket, buf, size);
    else
        snprintf(buf, size, "%s",
                 b->variants ? kiln_variant_name_for_bucket(b->variants, bucket) : "default");
}

int kiln_backend_candidates(const kiln_backend *b, const kiln_target *t, const kiln_linear_cfg *c,
                            kiln_act act, int64_t bucket, const char **names, int max,
                            char heuristic[64])
{
    kiln_backend_variant(b, t, c, bucket, heuristic, 64);
    if (!b->candidates) {
        if (max < 1)
            return 0;
        names[0] = heuristic;
        return 1;
    }
    const char *all[KILN_MAX_CANDIDATES];
    int n = b->candidates(t, c, all, KILN_MAX_CANDIDATES), kept = 0;
    for (int i = 0; i < n && kept < max; i++) {
        kiln_linear_kernel k = { .cfg = *c, .act = act };
        snprintf(k.variant, sizeof k.variant, "%s", all[i]);
        kiln_launch l;
        if (b->launch && b->launch(t, &k, bucket, &l) != KILN_OK) {
            kiln_clear_error();
            continue;
        }
        names[kept++] = all[i];
    }
    return kept;
}

kiln_status kiln_backend_source(char *buf, size_t size, const char *backend, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, size, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= size)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: the source needs %d bytes, the buffer has %zu",
                         backend, n + 1, size);
    return KILN_OK;
}

int kiln_sm75_or_newer(const kiln_target *t, char *why, size_t size)
{
    if (t->sm >= 75)
        return 1;
    snprintf(why, size, "needs sm_75 or newer, target is %s", t->name);
    return 0;
}
