/* The main of every suite: Criterion's own, plus the verdicts that keep a
 * run which proved nothing from passing.
 *   - A failed, crashed or timed-out test fails the run, --always-succeed
 *     (or CRITERION_ALWAYS_SUCCEED) notwithstanding.
 *   - A run in which no test started fails: a --filter that selects nothing,
 *     or a suite that lost its tests.
 *   - Without an explicit --filter on the command line, a run of fewer tests
 *     than the suite declares outside preprocessor conditionals (KT_MIN_TESTS,
 *     counted from its source at configure time) fails; a pattern left in
 *     CRITERION_TEST_PATTERN is not explicit.
 *   - In a GPU suite (KT_GPU_SUITE) a run with a skipped test and none
 *     failed exits 77, which ctest reports as skipped (SKIP_RETURN_CODE):
 *     without a GPU the suite is skipped, not passed, while its tests that
 *     need no GPU still run and can fail it.
 * Criterion calls the report hooks in this process, the runner; a filtered
 * test reaches none of them, a skipped one reaches POST_FINI, a crashed one
 * only its PRE_INIT. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if !defined(KT_MIN_TESTS) || !defined(KT_GPU_SUITE)
#error "tests/CMakeLists.txt defines KT_MIN_TESTS and KT_GPU_SUITE for each suite"
#endif

/* Automake's "skipped", the SKIP_RETURN_CODE of the GPU suites. */
enum { KT_EXIT_SKIPPED = 77 };

static struct {
    size_t started;
    size_t skipped;
    size_t failed;
    char first_skip[512]; /* "suite::test: reason" of the first skipped test */
} run;

ReportHook(PRE_INIT)(struct criterion_test *test)
{
    (void)test;
    run.started++;
}

ReportHook(POST_FINI)(struct criterion_test_stats *stats)
{
    if (stats->test_status != CR_STATUS_SKIPPED)
        return;
    if (run.skipped++ == 0)
        snprintf(run.first_skip, sizeof run.first_skip, "%s::%s: %s", stats->test->category,
                 stats->test->name, stats->message ? stats->message : "no reason given");
}

/* tests_failed counts the crashed and timed-out tests too. */
ReportHook(POST_ALL)(struct criterion_global_stats *stats)
{
    run.failed = stats->tests_failed;
}

/* LeakSanitizer's leak check at exit stops every thread of the process and
 * reads its stack and TLS; a thread that is exiting at that moment can crash
 * the check itself ("Tracer caught signal 11", a fatal LeakSanitizer error,
 * not a leak). Criterion's message thread ends as its worker process exits.
 * Registered after the sanitizer's start-up and before Criterion starts, this
 * handler runs after Criterion's own (atexit runs them in reverse) and before
 * the leak check: it waits, at most half a second, for the other threads to be
 * gone. A thread that stays (a test's detached worker) is left alive, which
 * the check handles. */
#if defined(__SANITIZE_ADDRESS__)
#define KT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KT_ASAN 1
#endif
#endif

#ifdef KT_ASAN
static int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void await_lone_thread(void)
{
    const struct timespec tick = { .tv_nsec = 1000000 };
    for (int i = 0; i < 500 && thread_count() > 1; i++)
        nanosleep(&tick, NULL);
}

/* A constructor, not main: Criterion's workers run the tests without
 * passing through main. */
__attribute__((constructor)) static void register_await(void) { atexit(await_lone_thread); }
#endif

static int has_arg(int argc, char *argv[], const char *const *names)
{
    for (int i = 1; i < argc; i++)
        for (const char *const *n = names; *n; n++)
            if (strcmp(argv[i], *n) == 0)
                return 1;
    return 0;
}

static int has_filter(int argc, char *argv[])
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--filter") == 0 || strncmp(argv[i], "--filter=", 9) == 0)
            return 1;
    return 0;
}

/* The exit status of a run that Criterion judged `passed`. */
static int verdict(const char *suite, int passed, int filtered)
{
    if (!passed || run.failed)
        return 1;
    if (run.started == 0) {
        fprintf(stderr, "%s: no test ran%s\n", suite,
                filtered ? ": the --filter selects none" : "");
        return 1;
    }
    if (!filtered && run.started < KT_MIN_TESTS) {
        fprintf(stderr, "%s: ran %zu test(s), fewer than the %d the suite declares (a run of "
                "part of it needs an explicit --filter)\n", suite, run.started, KT_MIN_TESTS);
        return 1;
    }
    if (KT_GPU_SUITE && run.skipped) {
        fprintf(stderr, "%s: %zu of %zu tests skipped, the first %s\n", suite, run.skipped,
                run.started, run.first_skip);
        return KT_EXIT_SKIPPED;
    }
    return 0;
}

int main(int argc, char *argv[])
{
    static const char *const informs[] = { "-h", "--help", "-v", "--version", "-l", "--list",
                                           NULL };
    const char *slash = strrchr(argv[0], '/');
    const char *suite = slash ? slash + 1 : argv[0];
    struct criterion_test_set *tests = criterion_initialize();
    int status;
    if (criterion_handle_args(argc, argv, true)) {
        int passed = criterion_run_all_tests(tests);
        status = verdict(suite, passed, has_filter(argc, argv));
    } else {
        /* Criterion has printed what was asked for, or the usage after an
         * argument it does not know: only the former is not an error. */
        status = has_arg(argc, argv, informs) ? 0 : 2;
    }
    criterion_finalize(tests);
    return status;
}
