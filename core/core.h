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

/* Allocation. The library allocates through these and never calls malloc,
 * calloc, realloc, strdup, strndup or aligned_alloc itself, so that a test
 * can fail any one allocation (kiln_alloc_set_hook) and prove the error
 * path behind it. They behave as the C functions they are named after (NULL
 * and errno ENOMEM on failure; realloc leaves the block alone); what they
 * return is released with free(). Each call site passes its "file:line",
 * the name a hook sees. Memory that LMDB, jansson, NVRTC or libc allocate
 * for themselves does not pass through here. */
#define KILN_SITE_STR2(x) #x
#define KILN_SITE_STR(x) KILN_SITE_STR2(x)
#define KILN_SITE __FILE__ ":" KILN_SITE_STR(__LINE__)
#define kiln_malloc(size) kiln_malloc_at((size), KILN_SITE)
#define kiln_calloc(n, size) kiln_calloc_at((n), (size), KILN_SITE)
#define kiln_realloc(p, size) kiln_realloc_at((p), (size), KILN_SITE)
#define kiln_strdup(s) kiln_strdup_at((s), KILN_SITE)
#define kiln_strndup(s, n) kiln_strndup_at((s), (n), KILN_SITE)
#define kiln_aligned_alloc(align, size) kiln_aligned_alloc_at((align), (size), KILN_SITE)
void *kiln_malloc_at(size_t size, const char *site);
void *kiln_calloc_at(size_t n, size_t size, const char *site);
void *kiln_realloc_at(void *p, size_t size, const char *site);
char *kiln_strdup_at(const char *s, const char *site);
char *kiln_strndup_at(const char *s, size_t n, const char *site);
void *kiln_aligned_alloc_at(size_t align, size_t size, const char *site);

/* For tests: hook(ctx, site) runs before every allocation above, on the
 * thread that allocates, and a nonzero return fails that allocation. NULL
 * removes it. Set it while no other thread is inside kiln; the hook itself
 * must not allocate through kiln. */
typedef int (*kiln_alloc_hook)(void *ctx, const char *site);
void kiln_alloc_set_hook(kiln_alloc_hook hook, void *ctx);

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

/* A progress line on stderr for a task that may run long: on a terminal
 * one line rewritten in place, at most every tty_every_s; elsewhere (a CI
 * log) a new line every KILN_PROGRESS_EVERY_S; and one at the end. Nothing
 * is shown before delay_s has passed, so a short task prints nothing. */
#define KILN_PROGRESS_EVERY_S 5.0
typedef struct kiln_progress {
    int mode;           /* 0: quiet; 1: a terminal; 2: log lines */
    double delay_s, tty_every_s;
    double start, last_line;
    int shown;          /* a line has been printed */
} kiln_progress;

/* Starts the clock; mode 0 when quiet, else from whether stderr is a
 * terminal. */
void kiln_progress_start(kiln_progress *p, int quiet, double delay_s, double tty_every_s);

/* Shows fmt as the task's line now if its mode and clock say so; last
 * closes the line (printed when any line was, or when delay_s is 0). The
 * caller serializes the calls. */
void kiln_progress_show(kiln_progress *p, int last, const char *fmt, ...) KILN_PRINTF(3, 4);

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
    const char *pack;           /* KILN_PACK: "host" packs every weight layout on the CPU
                                   (the reference), "device" (the default) with the plan's
                                   device packers */
    const char *compile_timeout;
    double compile_timeout_s;   /* KILN_COMPILE_TIMEOUT: seconds one compile may take; 0 when
                                   unset, -1 when it is not a positive number */
    /* A session's weight load: reader threads, staging buffers and the
     * bytes of each (KILN_LOAD_SLOT_SIZE takes a K, M or G suffix, powers
     * of 1024). 0 when unset, -1 when not a positive number; the texts
     * are for the error that names a bad one. */
    const char *load_threads_text, *load_slots_text, *load_slot_size_text;
    long load_threads, load_slots;
    long long load_slot_size;
} kiln_env;
void kiln_env_read(kiln_env *out);

#endif
