#include "core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *text(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static double seconds(const char *name)
{
    const char *v = text(name);
    char *end;
    double s = v ? strtod(v, &end) : 0;
    return v && !*end && isfinite(s) && s > 0 ? s : 0;
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
        .compile_timeout_s = seconds("KILN_COMPILE_TIMEOUT"),
    };
}
