/* Internal helpers shared by every module: error reporting, checked sizes. */
#ifndef KILN_CORE_H
#define KILN_CORE_H

#include "kiln.h"

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define KILN_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define KILN_PRINTF(f, a)
#endif

#define KILN_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Record a detail message for kiln_last_error() and return status, so an
 * error path reads `return kiln_fail(KILN_ERR_SHAPE, "...", ...);`. */
kiln_status kiln_fail(kiln_status status, const char *fmt, ...) KILN_PRINTF(2, 3);

/* Prefix the current detail message with "prefix: " (adds context such as a
 * file name on the way out) and return status unchanged. */
kiln_status kiln_fail_prefix(kiln_status status, const char *fmt, ...) KILN_PRINTF(2, 3);

/* Forget the detail message (kiln_last_error() returns ""). */
void kiln_clear_error(void);

/* Overflow-checked size arithmetic: false when the result does not fit. */
static inline bool kiln_mul_size(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool kiln_add_size(size_t a, size_t b, size_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

static inline int64_t kiln_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Monotonic wall-clock seconds. */
double kiln_now(void);

/* Number of online CPU cores (at least 1). */
int kiln_cpu_count(void);

/* kiln's environment, read in this one place. A text is the variable's
 * value, NULL when it is unset or empty; it stays valid until the process
 * changes its environment. A flag is 1 when its variable is "1". */
typedef struct kiln_env {
    const char *cache;          /* KILN_CACHE: the writable kernel cache */
    const char *xdg_cache_home; /* XDG_CACHE_HOME, then HOME: where the default cache goes */
    const char *home;
    const char *dump_source;    /* KILN_DUMP_SOURCE: keep every generated source here */
    const char *nvrtc;          /* KILN_NVRTC: the NVRTC library to load */
    const char *libcuda;        /* KILN_LIBCUDA: the CUDA driver library to load */
    int offline;                /* KILN_OFFLINE: a kernel missing from every cache is an error */
    int serial;                 /* KILN_SERIAL: every kernel starts after the one before ends */
} kiln_env;
void kiln_env_read(kiln_env *out);

#endif
