/* The kiln command as a user meets it: help, version, formats, demo, and
 * usage errors (exit 2, usage on stderr). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clirun.h"
#include "kiln.h"

Test(cli, help_lists_every_command)
{
    kt_cli r = kt_cli_run("--help");
    cr_assert_eq(r.status, 0, "stderr: %s", r.err);
    cr_assert(strstr(r.out, "usage: kiln"));
    cr_assert(strstr(r.out, "formats"));
    cr_assert(strstr(r.out, "demo"));
    kt_cli_free(&r);
}

Test(cli, version_matches_library)
{
    kt_cli r = kt_cli_run("--version");
    cr_assert_eq(r.status, 0);
    cr_assert(strstr(r.out, kiln_version()), "got %s", r.out);
    kt_cli_free(&r);
}

Test(cli, no_command_is_usage_error)
{
    kt_cli r = kt_cli_run("");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "usage: kiln"));
    kt_cli_free(&r);
}

Test(cli, unknown_command_is_usage_error)
{
    kt_cli r = kt_cli_run("frobnicate");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "unknown command 'frobnicate'"));
    cr_assert(strstr(r.err, "usage: kiln"));
    cr_assert_str_empty(r.out);
    kt_cli_free(&r);
}

Test(cli, formats_lists_every_format)
{
    kt_cli r = kt_cli_run("formats");
    cr_assert_eq(r.status, 0, "stderr: %s", r.err);
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        const kiln_format_info *fi = kiln_format_get((kiln_format)f);
        char row[64];
        snprintf(row, sizeof row, "\n%-12s %6d", fi->name, fi->block);
        cr_assert(strstr(r.out, row), "no row for %s in:\n%s", fi->name, r.out);
    }
    kt_cli_free(&r);
}

Test(cli, formats_rejects_arguments)
{
    kt_cli r = kt_cli_run("formats extra");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "unexpected argument 'extra'"));
    kt_cli_free(&r);
}

Test(cli, demo_help)
{
    kt_cli r = kt_cli_run("demo --help");
    cr_assert_eq(r.status, 0);
    cr_assert(strstr(r.out, "--tokens"));
    kt_cli_free(&r);
}

Test(cli, demo_bad_arguments)
{
    static const char *bad[] = { "demo --tokens 0", "demo --tokens x", "demo --tokens",
                                 "demo --steps -1", "demo --bogus", "demo extra" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kt_cli r = kt_cli_run(bad[i]);
        cr_assert_eq(r.status, 2, "%s exited %d", bad[i], r.status);
        cr_assert(strstr(r.err, "usage: kiln demo"), "%s: %s", bad[i], r.err);
        kt_cli_free(&r);
    }
}

/* A number is taken whole or refused: none is cut to fit an int (2^32 + 1
 * once became 1 and cuda:2^32 device 0). An unknown target is named. */
Test(cli, numbers_are_taken_whole_or_refused)
{
    static const struct {
        const char *args, *want;
    } bad[] = {
        { "compile demo -j 4294967297", "bad --jobs '4294967297'" },
        { "compile demo -j 1x", "bad --jobs" },
        { "compile demo --compile-timeout 0", "bad --compile-timeout '0'" },
        { "compile demo --compile-timeout 1.5", "bad --compile-timeout" },
        { "run demo --device cuda:4294967296", "bad --device 'cuda:4294967296'" },
        { "run demo --device cuda:-1", "bad --device" },
        { "run demo --steps 99999999999999999999", "bad --steps" },
        { "plan demo --layers 4294967297", "bad --layers" },
        { "plan demo --max-tokens +5", "bad --max-tokens" },
        { "demo --threads 4294967297", "bad --threads" },
        { "run demo --target sm_1", "unknown target 'sm_1'" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kt_cli r = kt_cli_run(bad[i].args);
        cr_assert_eq(r.status, 2, "%s exited %d: %s", bad[i].args, r.status, r.err);
        cr_assert(strstr(r.err, bad[i].want), "%s: %s", bad[i].args, r.err);
        kt_cli_free(&r);
    }
}

/* The checksum line of token count m in demo output, or NULL. */
static char *checksum_line(const char *out, int m)
{
    char key[32];
    snprintf(key, sizeof key, "\n%-7d ", m);
    const char *p = strstr(out, key);
    if (!p)
        return NULL;
    p++;
    /* tokens, sum and mean |y|: everything before the time column */
    const char *ms = strstr(p, " ms");
    if (!ms)
        return NULL;
    size_t n = (size_t)(ms - p);
    while (n && p[n - 1] != ' ')
        n--;
    return strndup(p, n);
}

Test(cli, demo_runs_and_is_deterministic)
{
    kt_cli a = kt_cli_run("demo --tokens 1,5 --steps 1 --threads 1");
    kt_cli b = kt_cli_run("demo --tokens 5,1 --steps 2 --threads 2");
    cr_assert_eq(a.status, 0, "stderr: %s", a.err);
    cr_assert_eq(b.status, 0, "stderr: %s", b.err);
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        const char *name = kiln_format_get((kiln_format)f)->name;
        if (!strcmp(name, "fp8_channel") || !strcmp(name, "nvfp4") || !strcmp(name, "q4_k"))
            cr_assert(strstr(a.out, name), "demo lacks a %s layer:\n%s", name, a.out);
    }
    for (int m = 1; m <= 5; m += 4) {
        char *la = checksum_line(a.out, m), *lb = checksum_line(b.out, m);
        cr_assert(la && lb, "no line for %d tokens:\n%s", m, a.out);
        cr_assert_str_eq(la, lb, "checksums differ between thread counts");
        cr_assert(!strstr(la, "nan") && !strstr(la, "inf"), "%s", la);
        free(la);
        free(lb);
    }
    kt_cli_free(&a);
    kt_cli_free(&b);
}
