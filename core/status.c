#include "core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char last_error[1024];

static const char *const status_text[] = {
    [KILN_OK] = "KILN_OK: success",
    [KILN_ERR_INVALID_ARG] = "KILN_ERR_INVALID_ARG: invalid argument",
    [KILN_ERR_NOMEM] = "KILN_ERR_NOMEM: out of memory",
    [KILN_ERR_IO] = "KILN_ERR_IO: input/output error",
    [KILN_ERR_MALFORMED] = "KILN_ERR_MALFORMED: malformed file or record",
    [KILN_ERR_UNSUPPORTED] = "KILN_ERR_UNSUPPORTED: not supported",
    [KILN_ERR_SHAPE] = "KILN_ERR_SHAPE: shapes do not fit",
    [KILN_ERR_NOT_FOUND] = "KILN_ERR_NOT_FOUND: not found",
    [KILN_ERR_STATE] = "KILN_ERR_STATE: object not in a state that allows the call",
    [KILN_ERR_NO_KERNEL] = "KILN_ERR_NO_KERNEL: no backend can implement the node",
    [KILN_ERR_COMPILE] = "KILN_ERR_COMPILE: kernel compilation failed",
    [KILN_ERR_CACHE] = "KILN_ERR_CACHE: kernel cache error",
    [KILN_ERR_OFFLINE_MISS] = "KILN_ERR_OFFLINE_MISS: kernel not cached and offline",
    [KILN_ERR_CUDA] = "KILN_ERR_CUDA: CUDA driver error",
    [KILN_ERR_NO_DEVICE] = "KILN_ERR_NO_DEVICE: no GPU or no driver",
};
_Static_assert(KILN_ARRAY_LEN(status_text) == KILN_STATUS_COUNT, "one text per status");

const char *kiln_strerror(kiln_status status)
{
    if ((unsigned)status >= KILN_STATUS_COUNT)
        return "unknown kiln_status";
    return status_text[status];
}

const char *kiln_last_error(void) { return last_error; }

void kiln_clear_error(void) { last_error[0] = '\0'; }

kiln_status kiln_fail(kiln_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

kiln_status kiln_fail_prefix(kiln_status status, const char *fmt, ...)
{
    char old[sizeof last_error];
    va_list ap;
    memcpy(old, last_error, sizeof old);
    va_start(ap, fmt);
    int n = vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    /* The message is cut at the buffer's end when too long: detail, not data. */
    size_t used = n < 0 ? 0 : (size_t)n < sizeof last_error ? (size_t)n : sizeof last_error - 1;
    if (old[0] && used + 3 < sizeof last_error) {
        size_t room = sizeof last_error - used - 1;
        size_t len = strlen(old);
        last_error[used] = ':';
        last_error[used + 1] = ' ';
        room -= 2;
        if (len > room)
            len = room;
        memcpy(last_error + used + 2, old, len);
        last_error[used + 2 + len] = '\0';
    }
    return status;
}

#define KILN_STR2(x) #x
#define KILN_STR(x) KILN_STR2(x)
const char *kiln_version(void)
{
    return KILN_STR(KILN_VERSION_MAJOR) "." KILN_STR(KILN_VERSION_MINOR) "." KILN_STR(KILN_VERSION_PATCH);
}

double kiln_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int kiln_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
