/* Building a plan's kernels: every signature is emitted, keyed, looked up in
 * the layered cache and, on a miss, compiled with NVRTC and stored. The
 * result holds one cubin per signature, ready for the runtime to load. */
#ifndef KILN_COMPILE_H
#define KILN_COMPILE_H

#include "cache/cache.h"
#include "codegen/emit.h"
#include "codegen/plan.h"

typedef struct kiln_kernel {
    kiln_kernel_desc desc;
    const char *signature;              /* the plan's text */
    uint8_t key[KILN_CACHE_KEY_BYTES];
    void *cubin;                        /* owned */
    size_t cubin_size;
    int cached;                         /* found in a cache (layer below), else compiled now */
    int layer;
    double seconds;                     /* compile time when compiled now */
} kiln_kernel;

typedef struct kiln_build_options {
    int jobs;                /* compiles at once; 0: one per core */
    int offline;             /* a miss is KILN_ERR_OFFLINE_MISS, nothing is compiled */
    const char *keep_source; /* write sources, logs and PTX here (or $KILN_DUMP_SOURCE) */
    int quiet;               /* no progress line */
    int no_cubins;           /* keys and hits only: do not keep cubins in memory */
} kiln_build_options;

typedef struct kiln_build {
    kiln_kernel *kernels; /* [n], index = the plan's signature index */
    int n;
    int cached, compiled;
    double seconds;       /* the whole build */
    char compiler[64];    /* of the compiles done now, "" when none */
} kiln_build;

/* Build every kernel of p. c may hold only shipped layers (then nothing can
 * be stored: a miss that compiles is still returned, not stored). NVRTC is
 * loaded only when something must be compiled. On failure *out is left
 * empty; what was compiled before the failure is already stored. */
kiln_status kiln_build_plan(const kiln_plan *p, kiln_cache *c, const kiln_build_options *o,
                            kiln_build *out);
void kiln_build_free(kiln_build *b);

#endif
