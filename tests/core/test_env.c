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

/* A time limit is a positive number of seconds; anything else set is -1,
 * which the compile refuses by name rather than ignore. */
Test(env, compile_timeout)
{
    static const struct {
        const char *value;
        double want;
    } cases[] = { { NULL, 0 }, { "", 0 }, { "30", 30 }, { "0.5", 0.5 }, { "0", -1 },
                  { "-3", -1 }, { "abc", -1 }, { "10s", -1 }, { "inf", -1 } };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].value)
            setenv("KILN_COMPILE_TIMEOUT", cases[i].value, 1);
        else
            unsetenv("KILN_COMPILE_TIMEOUT");
        kiln_env e;
        kiln_env_read(&e);
        cr_assert_eq(e.compile_timeout_s, cases[i].want, "'%s': %g",
                     cases[i].value ? cases[i].value : "(unset)", e.compile_timeout_s);
    }
}
