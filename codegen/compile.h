/* Building a plan's kernels (core/build.h declares kiln_build_plan, the
 * build being the runtime's contract): every signature is emitted, keyed,
 * looked up in the layered cache and, on a miss, compiled with NVRTC and
 * stored. */
#ifndef KILN_COMPILE_H
#define KILN_COMPILE_H

#include "cache/cache.h"
#include "codegen/emit.h"
#include "codegen/plan.h"

_Static_assert(sizeof((kiln_kernel){ 0 }.key) == KILN_CACHE_KEY_BYTES, "a kernel holds its key");

#endif
