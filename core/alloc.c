#include "core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Written only while no other thread is inside kiln (core.h), so the
 * threads that read it saw it set before they started or were woken. */
static kiln_alloc_hook alloc_hook;
static void *alloc_hook_ctx;

void kiln_alloc_set_hook(kiln_alloc_hook hook, void *ctx)
{
    alloc_hook = hook;
    alloc_hook_ctx = ctx;
}

static bool alloc_refused(const char *site)
{
    if (alloc_hook && alloc_hook(alloc_hook_ctx, site)) {
        errno = ENOMEM;
        return true;
    }
    return false;
}

void *kiln_malloc_at(size_t size, const char *site)
{
    return alloc_refused(site) ? NULL : malloc(size);
}

void *kiln_calloc_at(size_t n, size_t size, const char *site)
{
    return alloc_refused(site) ? NULL : calloc(n, size);
}

void *kiln_realloc_at(void *p, size_t size, const char *site)
{
    return alloc_refused(site) ? NULL : realloc(p, size);
}

char *kiln_strdup_at(const char *s, const char *site)
{
    return alloc_refused(site) ? NULL : strdup(s);
}

char *kiln_strndup_at(const char *s, size_t n, const char *site)
{
    return alloc_refused(site) ? NULL : strndup(s, n);
}

void *kiln_aligned_alloc_at(size_t align, size_t size, const char *site)
{
    return alloc_refused(site) ? NULL : aligned_alloc(align, size);
}
