#include "codegen/backend.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int group;      /* elements per scale along K; 0: one scale per row or tensor */
    int scale_bytes;
} act_table[] = {
    [KILN_ACT_BF16] = { "bf16", 0, 0 },
    [KILN_ACT_FP8_TENSOR] = { "fp8-tensor", 0, 0 }, /* the scale lives outside the rows */
    [KILN_ACT_FP8_TOKEN] = { "fp8-token", 0, 4 },
    [KILN_ACT_FP8_G128] = { "fp8-1x128", 128, 4 },
    [KILN_ACT_MXFP8_G32] = { "mxfp8-1x32", 32, 1 },
};
_Static_assert(KILN_ARRAY_LEN(act_table) == KILN_ACT_COUNT, "one row per activation scheme");

const char *kiln_act_name(kiln_act a)
{
    return (unsigned)a < KILN_ACT_COUNT ? act_table[a].name : "?";
}

size_t kiln_act_row_bytes(kiln_act a, int64_t k)
{
    if (a == KILN_ACT_BF16)
        return (size_t)k * 2;
    size_t scales = act_table[a].group ? (size_t)kiln_ceil_div(k, act_table[a].group) : 1;
    return (size_t)k + scales * (size_t)act_table[a].scale_bytes;
}

const char *kiln_epilogue_name(unsigned epi, char *buf, size_t size)
{
    static const char *const names[] = { "bias", "residual", "silu_mul" };
    size_t used = 0;
    buf[0] = '\0';
    for (unsigned i = 0; i < KILN_ARRAY_LEN(names); i++)
        if (epi & (1u << i))
            used += (size_t)snprintf(buf + used, used < size ? size - used : 0, "%s%s",
                                     used ? "+" : "", names[i]);
    if (!used)
        snprintf(buf, size, "none");
    return buf;
}

/* The order every format tries: the decode kernel while it can (M small,
 * memory-bound), then the tensor-core paths from newest to oldest, then the
 * portable SIMT fallback. A name without a registered backend is skipped. */
#define KILN_PRIORITY_ALL { "gemv", "wgmma", "mma", "simt", NULL }

static const kiln_registry default_registry = {
    .backends = { &kiln_backend_gemv, &kiln_backend_wgmma, &kiln_backend_simt },
    .n = 3,
    .priority = {
        [KILN_FMT_F32] = KILN_PRIORITY_ALL,
        [KILN_FMT_F16] = KILN_PRIORITY_ALL,
        [KILN_FMT_BF16] = KILN_PRIORITY_ALL,
        [KILN_FMT_FP8_TENSOR] = KILN_PRIORITY_ALL,
        [KILN_FMT_FP8_CHANNEL] = KILN_PRIORITY_ALL,
        [KILN_FMT_FP8_BLOCK] = KILN_PRIORITY_ALL,
        [KILN_FMT_MXFP8] = KILN_PRIORITY_ALL,
        [KILN_FMT_NVFP4] = KILN_PRIORITY_ALL,
        [KILN_FMT_MXFP4] = KILN_PRIORITY_ALL,
        [KILN_FMT_Q8_0] = KILN_PRIORITY_ALL,
        [KILN_FMT_Q4_0] = KILN_PRIORITY_ALL,
        [KILN_FMT_Q4_K] = KILN_PRIORITY_ALL,
        [KILN_FMT_Q6_K] = KILN_PRIORITY_ALL,
        [KILN_FMT_GGML_MXFP4] = KILN_PRIORITY_ALL,
    },
};

const kiln_registry *kiln_registry_default(void) { return &default_registry; }

static const char *row_name(const kiln_variant_table *t, size_t i)
{
    return *(const char *const *)((const char *)t->rows + i * t->stride + t->name_at);
}

const void *kiln_variant_for_bucket(const kiln_variant_table *t, int64_t m)
{
    size_t i = 0;
    while (i + 1 < t->n &&
           m > *(const int64_t *)((const char *)t->rows + i * t->stride + t->max_m_at))
        i++;
    return (const char *)t->rows + i * t->stride;
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

/* Why b cannot take (cfg, bucket) on t, or "" when it can. */
static int backend_refuses(const kiln_backend *b, const kiln_target *t,
                           const kiln_linear_cfg *cfg, int64_t bucket, char *why, size_t size)
{
    why[0] = '\0';
    if (!(b->formats & (1u << cfg->format))) {
        snprintf(why, size, "no kernel for %s", kiln_format_get(cfg->format)->name);
        return 1;
    }
    if (!b->is_supported(t, why, size))
        return 1;
    if (!b->can_implement(t, cfg, bucket, why, size))
        return 1;
    return 0;
}

static void refusal_append(char *list, size_t size, const char *name, const char *why)
{
    size_t used = strlen(list);
    if (used < size)
        snprintf(list + used, size - used, "%s%s: %s", used ? "; " : "", name, why);
}

kiln_status kiln_backend_select(const kiln_registry *r, const kiln_target *t,
                                const kiln_linear_cfg *cfg, int64_t bucket,
                                const kiln_backend *forced, const char *node, kiln_choice *out)
{
    char why[256];
    memset(out, 0, sizeof *out);
    if (forced) {
        if (!backend_refuses(forced, t, cfg, bucket, why, sizeof why)) {
            out->backend = forced;
            return KILN_OK;
        }
        out->fell_back = 1;
        snprintf(out->fallback_why, sizeof out->fallback_why, "%s", why);
    }
    const char *const *names = r->priority[cfg->format];
    for (int i = 0; names[i]; i++) {
        const kiln_backend *b = kiln_registry_find(r, names[i]);
        if (!b || b == forced)
            continue;
        if (!backend_refuses(b, t, cfg, bucket, why, sizeof why)) {
            out->backend = b;
            return KILN_OK;
        }
        refusal_append(out->refused, sizeof out->refused, b->name, why);
    }
    if (forced)
        refusal_append(out->refused, sizeof out->refused, forced->name, out->fallback_why);
    return kiln_fail(KILN_ERR_NO_KERNEL,
                     "failed to find a kernel for linear \"%s\" (%s, N=%lld, K=%lld, M bucket "
                     "%lld) on %s. Reasons: %s",
                     node, kiln_format_get(cfg->format)->name, (long long)cfg->n,
                     (long long)cfg->k, (long long)bucket, t->name,
                     out->refused[0] ? out->refused : "no backend is built for this format");
}
