#include "core.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *text(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* A positive number of seconds; 0 when unset, -1 when set to anything else. */
static double seconds(const char *name)
{
    const char *v = text(name);
    if (!v)
        return 0;
    char *end;
    double s = strtod(v, &end);
    return !*end && isfinite(s) && s > 0 ? s : -1;
}

/* A positive count, with a K, M or G suffix (powers of 1024) where
 * suffix; 0 when unset, -1 when set to anything else. */
static long long count(const char *name, int suffix)
{
    const char *v = text(name);
    if (!v)
        return 0;
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    int shift = 0;
    if (suffix && *end && !end[1]) {
        const char *units = "KMG", *u = strchr(units, *end);
        shift = u ? 10 * (int)(u - units + 1) : -1;
        end += u != NULL;
    }
    if (errno || end == v || *end || n <= 0 || shift < 0 || n > (LLONG_MAX >> shift))
        return -1;
    return n << shift;
}

static int flag(const char *name)
{
    const char *v = getenv(name);
    return v && !strcmp(v, "1");
}

void kiln_env_read(kiln_env *out)
{
    *out = (kiln_env){
        .cache = text("KILN_CACHE"),
        .xdg_cache_home = text("XDG_CACHE_HOME"),
        .home = text("HOME"),
        .dump_source = text("KILN_DUMP_SOURCE"),
        .nvrtc = text("KILN_NVRTC"),
        .libcuda = text("KILN_LIBCUDA"),
        .offline = flag("KILN_OFFLINE"),
        .serial = flag("KILN_SERIAL"),
        .pack = text("KILN_PACK"),
        .compile_timeout = text("KILN_COMPILE_TIMEOUT"),
        .compile_timeout_s = seconds("KILN_COMPILE_TIMEOUT"),
        .load_threads_text = text("KILN_LOAD_THREADS"),
        .load_slots_text = text("KILN_LOAD_SLOTS"),
        .load_slot_size_text = text("KILN_LOAD_SLOT_SIZE"),
        .load_threads = (long)count("KILN_LOAD_THREADS", 0),
        .load_slots = (long)count("KILN_LOAD_SLOTS", 0),
        .load_slot_size = count("KILN_LOAD_SLOT_SIZE", 1),
    };
}
