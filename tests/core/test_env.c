/* kiln's environment is read in one place: texts are NULL when unset or
 * empty, flags are set by "1" only. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "core.h"

static const char *const vars[] = { "KILN_CACHE", "XDG_CACHE_HOME", "HOME", "KILN_DUMP_SOURCE",
                                    "KILN_NVRTC", "KILN_LIBCUDA", "KILN_OFFLINE", "KILN_SERIAL" };

Test(env, texts_and_flags)
{
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
    kiln_env e;
    kiln_env_read(&e);
    cr_assert(!e.cache && !e.xdg_cache_home && !e.home && !e.dump_source && !e.nvrtc &&
              !e.libcuda && !e.offline && !e.serial);

    setenv("KILN_CACHE", "/c.kiln", 1);
    setenv("XDG_CACHE_HOME", "", 1);
    setenv("HOME", "/h", 1);
    setenv("KILN_DUMP_SOURCE", "/d", 1);
    setenv("KILN_NVRTC", "libnvrtc.so.13", 1);
    setenv("KILN_LIBCUDA", "libcuda.so.1", 1);
    setenv("KILN_OFFLINE", "1", 1);
    setenv("KILN_SERIAL", "yes", 1);
    kiln_env_read(&e);
    cr_assert_str_eq(e.cache, "/c.kiln");
    cr_assert_null(e.xdg_cache_home, "an empty variable is unset");
    cr_assert_str_eq(e.home, "/h");
    cr_assert_str_eq(e.dump_source, "/d");
    cr_assert_str_eq(e.nvrtc, "libnvrtc.so.13");
    cr_assert_str_eq(e.libcuda, "libcuda.so.1");
    cr_assert_eq(e.offline, 1);
    cr_assert_eq(e.serial, 0, "only \"1\" sets a flag");
}
