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

/* The weight load's counts are positive integers, the slot size with an
 * optional K, M or G; anything else set is -1, which a session refuses by
 * name. */
Test(env, load_counts)
{
    static const struct {
        const char *value;
        long long threads, size;
    } cases[] = { { NULL, 0, 0 },        { "", 0, 0 },          { "4", 4, 4 },
                  { "64K", -1, 65536 },  { "2M", -1, 2 << 20 }, { "1G", -1, 1LL << 30 },
                  { "0", -1, -1 },       { "-2", -1, -1 },      { "3x", -1, -1 },
                  { "1KB", -1, -1 },     { "K", -1, -1 },       { "99999999999999999999", -1, -1 },
                  { "9000000000000G", -1, -1 } };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *v = cases[i].value;
        if (v) {
            setenv("KILN_LOAD_THREADS", v, 1);
            setenv("KILN_LOAD_SLOTS", v, 1);
            setenv("KILN_LOAD_SLOT_SIZE", v, 1);
        } else {
            unsetenv("KILN_LOAD_THREADS");
            unsetenv("KILN_LOAD_SLOTS");
            unsetenv("KILN_LOAD_SLOT_SIZE");
        }
        kiln_env e;
        kiln_env_read(&e);
        cr_assert_eq(e.load_threads, cases[i].threads, "'%s': %ld", v ? v : "(unset)",
                     e.load_threads);
        cr_assert_eq(e.load_slots, cases[i].threads, "'%s'", v ? v : "(unset)");
        cr_assert_eq(e.load_slot_size, cases[i].size, "'%s': %lld", v ? v : "(unset)",
                     e.load_slot_size);
    }
}
