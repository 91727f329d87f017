#include "core.h"

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
        .compile_timeout = text("KILN_COMPILE_TIMEOUT"),
        .compile_timeout_s = seconds("KILN_COMPILE_TIMEOUT"),
    };
}
