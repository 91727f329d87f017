/* Choosing a backend for one linear and bucket: the format's priority
 * list of a registry, each backend's capability checks, --backend. */
#ifndef KILN_SELECT_H
#define KILN_SELECT_H

#include "kernels/registry/backend.h"

/* The outcome of choosing a backend for one (linear, bucket). */
typedef struct kiln_choice {
    const kiln_backend *backend; /* NULL: nothing fits */
    char refused[1024];          /* "name: reason; name: reason" of those tried first */
    int fell_back;               /* the forced backend was not taken */
    char fallback_why[256];      /* why the forced backend was not taken */
} kiln_choice;

/* Choose for (cfg, bucket): the first backend of cfg's format priority list
 * that is registered, passes is_supported and can_implement. With forced !=
 * NULL the forced backend is tried alone first; when it cannot take the node
 * the normal list decides and out->fell_back is set (strict: the caller turns
 * that into an error). KILN_ERR_NO_KERNEL when nothing fits, the message
 * naming the node and listing every backend's reason. */
kiln_status kiln_backend_select(const kiln_registry *r, const kiln_target *t,
                                const kiln_linear_cfg *cfg, int64_t bucket,
                                const kiln_backend *forced, const char *node, kiln_choice *out);

#endif
