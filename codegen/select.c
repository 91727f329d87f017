#include "codegen/select.h"

#include <stdio.h>
#include <string.h>

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
