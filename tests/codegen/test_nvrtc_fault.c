/* NVRTC failing under kiln_compile, through the fake NVRTC of
 * tests/harness/fake_nvrtc.c: the library missing; nvrtcCreateProgram,
 * nvrtcCompileProgram (with its log) or nvrtcGetCUBIN failing for one
 * kernel of the shared model; one kernel's compile never returning, with
 * the pool's threads and with one thread, through the API and the CLI.
 * Each is an error naming the kernel's signature; every other kernel is
 * compiled and stored, and the cache verifies and holds every record it
 * held before, byte for byte. */
#include "clirun.h"
#include "fault.h"
#include "tests/cache/fake_record.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct nvrtc_case {
    kt_model m;
    kiln_graph *g;
    kiln_target t;
    kiln_plan *p;
    int n_sig, victim;
    const char *sig; /* the victim's */
    char cache[128], match[512];
    kt_records seeded;
} nvrtc_case;

static const int64_t capture[] = { 1 };

/* A cache that holds three records, and the model's plan; the kernel to
 * fail is the plan's second. */
static void setup(nvrtc_case *c)
{
    kt_tmp_setup();
    kt_model_make(&c->m);
    cr_assert_eq(kt_model_graph(&c->m, &c->g), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_target_from_name("sm_90a", &c->t), KILN_OK);
    kiln_plan_options po = { .capture = capture, .n_capture = 1 };
    cr_assert_eq(kiln_plan_create(c->g, &c->t, &po, &c->p), KILN_OK, "%s", kiln_last_error());
    c->n_sig = kiln_plan_n_signatures(c->p);
    cr_assert_geq(c->n_sig, 3);
    c->victim = 1;
    c->sig = kiln_plan_signature(c->p, c->victim);
    /* The generated source names its signature on a line of its own. */
    snprintf(c->match, sizeof c->match, "// signature: %s\n", c->sig);
    kt_in_tmp(c->cache, sizeof c->cache, "kernels.kiln");
    kiln_cache *k;
    cr_assert_eq(kiln_cache_open(&(kiln_cache_options){ .path = c->cache }, &k), KILN_OK, "%s",
                 kiln_last_error());
    for (int i = 0; i < 3; i++) {
        kt_made r;
        kt_made_init(&r, i);
        cr_assert_eq(kiln_cache_store(k, r.key, &r.rec, NULL), KILN_OK, "%s", kiln_last_error());
    }
    kiln_cache_close(k);
    kt_records_read(c->cache, &c->seeded);
    setenv("KILN_NVRTC", KT_FAKE_NVRTC, 1);
    setenv("KT_FAKE_NVRTC_MATCH", c->match, 1);
    unsetenv("KT_FAKE_NVRTC");
}

static void teardown(nvrtc_case *c)
{
    kt_records_free(&c->seeded);
    kiln_plan_destroy(c->p);
    kiln_graph_destroy(c->g);
    kt_model_free(&c->m);
    kt_tmp_teardown();
}

static kiln_status compile(nvrtc_case *c, int jobs, double timeout_s, kiln_compile_result *r)
{
    kiln_compile_options o = { .cache = { .path = c->cache }, .quiet = 1, .jobs = jobs,
                               .compile_timeout_s = timeout_s,
                               .plan = { .capture = capture, .n_capture = 1 } };
    return kiln_compile(c->g, &c->t, &o, r);
}

/* The cache verifies, holds every record it held and, when the others
 * compiled, every kernel but the victim; a second compile with NVRTC
 * working compiles only what is missing. */
static void check_after(nvrtc_case *c, int others_stored)
{
    size_t want = c->seeded.n + (others_stored ? (size_t)c->n_sig - 1 : 0);
    kt_cache_intact(c->cache, 0, want);
    kt_records have;
    kt_records_read(c->cache, &have);
    kt_records_within(&c->seeded, &have, 0, c->cache);
    cr_assert_eq(have.n, want, "%s holds %zu records, not %zu", c->cache, have.n, want);
    kt_records_free(&have);
    unsetenv("KT_FAKE_NVRTC");
    kiln_compile_result r;
    cr_assert_eq(compile(c, 0, 0, &r), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(r.compiled, others_stored ? 1 : c->n_sig);
    cr_assert_eq(r.cached, others_stored ? c->n_sig - 1 : 0);
}

/* One kernel failing with mode: the error names its signature and says. */
static void one_fails(const char *mode, kiln_status want, const char *says, int jobs,
                      double timeout_s)
{
    nvrtc_case c = { 0 };
    setup(&c);
    setenv("KT_FAKE_NVRTC", mode, 1);
    kiln_compile_result r;
    double t0 = kiln_now();
    kiln_status st = compile(&c, jobs, timeout_s, &r);
    double took = kiln_now() - t0;
    cr_assert_eq(st, want, "%s: %s: %s", mode, kiln_strerror(st), kiln_last_error());
    cr_assert(strstr(kiln_last_error(), c.sig), "%s: the message does not name the signature "
              "\"%s\": %s", mode, c.sig, kiln_last_error());
    cr_assert(strstr(kiln_last_error(), says), "%s: the message does not say \"%s\": %s", mode, says,
              kiln_last_error());
    if (timeout_s > 0)
        cr_assert_lt(took, timeout_s + 20, "%s: the compile took %.1f s, the limit is %.0f s", mode,
                     took, timeout_s);
    check_after(&c, 1);
    teardown(&c);
}

Test(nvrtc_fault, create_program_fails)
{
    one_fails("create", KILN_ERR_COMPILE, "creating the program", 2, 0);
}

Test(nvrtc_fault, compile_fails_with_the_log)
{
    one_fails("compile", KILN_ERR_COMPILE, "the fake NVRTC refuses this source", 2, 0);
}

Test(nvrtc_fault, get_cubin_fails)
{
    one_fails("cubin", KILN_ERR_COMPILE, "NVRTC_ERROR_INVALID_PROGRAM", 2, 0);
}

Test(nvrtc_fault, a_compile_past_its_limit_fails_and_the_rest_compile)
{
    one_fails("hang", KILN_ERR_COMPILE, "no result after 1 s", 2, 1);
}

/* With one thread, the kernels after the one that hangs need the thread
 * that takes its place. */
Test(nvrtc_fault, one_thread_hangs_and_another_takes_its_place)
{
    one_fails("hang", KILN_ERR_COMPILE, "the time limit of one compile", 1, 1);
}

Test(nvrtc_fault, a_missing_library_names_it_and_the_first_kernel)
{
    nvrtc_case c = { 0 };
    setup(&c);
    setenv("KILN_NVRTC", "/nonexistent/libnvrtc.so.13", 1);
    kiln_compile_result r;
    cr_assert_eq(compile(&c, 2, 0, &r), KILN_ERR_NOT_FOUND, "%s", kiln_last_error());
    cr_assert(strstr(kiln_last_error(), "/nonexistent/libnvrtc.so.13"), "%s", kiln_last_error());
    cr_assert(strstr(kiln_last_error(), kiln_plan_signature(c.p, 0)), "%s", kiln_last_error());
    setenv("KILN_NVRTC", KT_FAKE_NVRTC, 1);
    check_after(&c, 0);
    teardown(&c);
}

/* KILN_COMPILE_TIMEOUT and --compile-timeout reach the command: it fails
 * within the limit, naming a kernel that hung (the demo's two Q4_K
 * kernels, up with the gate and down, and its Q4_K packer hang), and stores the rest, which the next
 * run finds. */
Test(nvrtc_fault, the_command_takes_the_limit)
{
    nvrtc_case c = { 0 };
    setup(&c);
    setenv("KT_FAKE_NVRTC", "hang", 1);
    setenv("KT_FAKE_NVRTC_MATCH", "format=q4_k ", 1);
    const char *how[] = { "--compile-timeout 1", "" };
    char args[512];
    for (size_t i = 0; i < KILN_ARRAY_LEN(how); i++) {
        if (!how[i][0])
            setenv("KILN_COMPILE_TIMEOUT", "1", 1);
        snprintf(args, sizeof args,
                 "compile demo --target sm_90a --capture 1 --quiet --cache %s %s",
                 c.cache, how[i]);
        double t0 = kiln_now();
        kt_cli run = kt_cli_run(args);
        double took = kiln_now() - t0;
        unsetenv("KILN_COMPILE_TIMEOUT");
        cr_assert_eq(run.status, 1, "kiln %s: exit %d: %s", args, run.status, run.err);
        /* The second run finds the other 16 cached. */
        const char *count = i ? "3 of 3 kernels failed" : "3 of 19 kernels failed";
        cr_assert(strstr(run.err, count), "kiln %s: %s", args, run.err);
        cr_assert(strstr(run.err, "format=q4_k") && strstr(run.err, "no result after 1 s"),
                  "kiln %s: %s", args, run.err);
        cr_assert_lt(took, 20, "kiln %s took %.1f s", args, took);
        kt_cli_free(&run);
    }
    kt_records have;
    kt_records_read(c.cache, &have);
    kt_records_within(&c.seeded, &have, 0, c.cache);
    kt_records_free(&have);
    unsetenv("KT_FAKE_NVRTC");
    /* A limit that is not a positive number is refused by name, never
     * passed over: nothing is compiled. */
    snprintf(args, sizeof args, "compile demo --target sm_90a --capture 1 --quiet --cache %s",
             c.cache);
    setenv("KILN_COMPILE_TIMEOUT", "10s", 1);
    kt_cli bad = kt_cli_run(args);
    unsetenv("KILN_COMPILE_TIMEOUT");
    cr_assert_eq(bad.status, 1, "exit %d: %s", bad.status, bad.err);
    cr_assert(strstr(bad.err, "KILN_COMPILE_TIMEOUT=10s: not a positive number of seconds"), "%s",
              bad.err);
    kt_cli_free(&bad);
    kt_cli run = kt_cli_run(args);
    cr_assert_eq(run.status, 0, "kiln %s: %s", args, run.err);
    cr_assert(strstr(run.out, "19 signatures: 16 cached, 3 compiled"), "kiln %s: %s", args, run.out);
    kt_cli_free(&run);
    kt_cache_intact(c.cache, 0, c.seeded.n + 19);
    teardown(&c);
}
