#include "cli.h"

#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *out)
{
    fprintf(out,
            "usage: kiln compile MODEL|demo [--target T]... [--cache FILE] [--shipped FILE]...\n"
            "                    [--offline] [-j N] [--keep-source DIR] [--compile-timeout S]\n"
            "                    [--quiet] [--json] [planning options]\n"
            "\n"
            "Plans a model for a target, then compiles with NVRTC every kernel the plan\n"
            "needs that no cache holds, and stores it in the writable cache. Needs no GPU.\n"
            "With several --target, one plan per target, compiled in turn (a line each).\n"
            "Prints \"S signatures: H cached, C compiled in T s\"; a second run compiles\n"
            "nothing. Each kernel is stored as soon as it compiles. The first Ctrl-C (or\n"
            "SIGTERM) starts no more compiles, stores the ones running and exits 128 plus\n"
            "the signal's number (130, 143), as a shell reports it; the next compile does\n"
            "only the rest.\n"
            "\n"
            "  --cache FILE      the writable cache (default $KILN_CACHE, else\n"
            "                    $XDG_CACHE_HOME/kiln/kernels.kiln)\n"
            "  --shipped FILE    a read-only cache searched first (repeatable)\n"
            "  --offline         compile nothing: a kernel missing from every cache is an\n"
            "                    error, and every missing one is listed (a check that a\n"
            "                    shipped cache is whole; also KILN_OFFLINE=1)\n"
            "  -j, --jobs N      compiles at once (default: one per core)\n"
            "  --keep-source DIR write each kernel's source, NVRTC log and PTX to DIR\n"
            "                    (also $KILN_DUMP_SOURCE)\n"
            "  --compile-timeout S\n"
            "                    a kernel whose compile takes more than S seconds fails\n"
            "                    (default $KILN_COMPILE_TIMEOUT, else 600)\n"
            "  --quiet           no progress (on a terminal one line, elsewhere a line\n"
            "                    every few seconds, on stderr)\n"
            "  --json            print the result as JSON on stdout: per target, the\n"
            "                    signatures, cached, compiled, seconds and the cache\n"
            "\n"
            "planning options, as for kiln plan:\n" CLI_PLAN_HELP);
}

static void on_corrupt(void *ctx, const char *message)
{
    (void)ctx;
    fprintf(stderr, "kiln: warning: %s (it will be compiled again)\n", message);
}

/* The first SIGINT or SIGTERM's number: the compile ends once the kernels
 * compiling are stored. A second one ends the process at once. */
static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    stop = sig;
}

static void catch_signals(void)
{
    struct sigaction sa = { .sa_handler = on_signal, .sa_flags = SA_RESETHAND };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

static void print_missing(void *ctx, const char *signature, const char *key_hex)
{
    (void)ctx;
    fprintf(stderr, "kiln compile: missing: %s (key %s)\n", signature, key_hex);
}

/* Offline, a miss fails the compile naming the first; the others are
 * listed too, as kiln cache check lists them. Returns st with its message
 * kept for cli_fail. */
static kiln_status list_missing(const kiln_plan *p, const kiln_cache_options *o, kiln_status st)
{
    char message[2048];
    snprintf(message, sizeof message, "%s", kiln_last_error());
    kiln_cache *c = NULL;
    int missing = 0;
    if (kiln_cache_open(o, &c) == KILN_OK &&
        kiln_cache_check_plan(c, p, print_missing, NULL, &missing) == KILN_OK)
        fprintf(stderr, "kiln compile: %d of %d kernels are in no cache\n", missing,
                kiln_plan_n_signatures(p));
    kiln_cache_close(c);
    return cli_error(st, "%s", message);
}

static int run(int argc, char **argv)
{
    static const struct option opts[] = {
        CLI_PLAN_LONG_OPTIONS,
        { "cache", required_argument, NULL, 'c' },
        { "shipped", required_argument, NULL, 's' },
        { "jobs", required_argument, NULL, 'j' },
        { "keep-source", required_argument, NULL, 'k' },
        { "quiet", no_argument, NULL, 'q' },
        { "compile-timeout", required_argument, NULL, 't' },
        { "offline", no_argument, NULL, 'o' },
        { "json", no_argument, NULL, 'J' },
        { 0 },
    };
    cli_plan_args a;
    const char *shipped[16];
    kiln_compile_options co = { .cache = { .shipped = shipped, .on_corrupt = on_corrupt } };
    int c, rc, json = 0;
    long long v;
    cli_plan_args_init(&a);
    a.multi_target = 1;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":j:", opts, NULL)) != -1) {
        if (cli_plan_option(&cli_cmd_compile, c, optarg, &a, &rc)) {
            if (rc != CLI_OK)
                return rc;
            continue;
        }
        switch (c) {
        case 'c': co.cache.path = optarg; break;
        case 's':
            if (co.cache.n_shipped == (int)(sizeof shipped / sizeof shipped[0]))
                return cli_usage(&cli_cmd_compile, "too many --shipped caches");
            shipped[co.cache.n_shipped++] = optarg;
            break;
        case 'j':
            if (cli_parse_int(optarg, 1, 1024, &v))
                return cli_usage(&cli_cmd_compile, "bad --jobs '%s'", optarg);
            co.jobs = (int)v;
            break;
        case 'k': co.keep_source = optarg; break;
        case 't':
            if (cli_parse_int(optarg, 1, 1 << 30, &v))
                return cli_usage(&cli_cmd_compile, "bad --compile-timeout '%s' (want whole seconds)",
                                 optarg);
            co.compile_timeout_s = (double)v;
            break;
        case 'q': co.quiet = 1; break;
        case 'o': co.cache.offline = 1; break;
        case 'J': json = 1; break;
        case ':': return cli_usage(&cli_cmd_compile, "%s needs a value", argv[optind - 1]);
        default: return cli_usage(&cli_cmd_compile, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return cli_usage(&cli_cmd_compile, "what to compile? give a MODEL file or directory, or demo");
    if (optind + 1 < argc)
        return cli_usage(&cli_cmd_compile, "unexpected argument '%s'", argv[optind + 1]);
    kiln_target t;
    if ((rc = cli_plan_finish(&cli_cmd_compile, &a, &t)) != CLI_OK)
        return rc;

    cli_source src;
    kiln_plan *p = NULL;
    kiln_status st = cli_plan_tuning(&a, &co.cache);
    if (st == KILN_OK)
        st = cli_plan_open(argv[optind], &a, &t, &src, &p);
    if (st != KILN_OK) {
        cli_plan_args_free(&a);
        return cli_fail(st, "compile");
    }
    char path[4096];
    const char *into = co.cache.path;
    if (!into && (st = kiln_cache_default_path(path, sizeof path)) == KILN_OK)
        into = path;
    co.stop = &stop;
    catch_signals();
    json_t *done = json_array();
    /* One plan per target, each compiled in turn into the same caches. */
    int i = 0;
    for (; st == KILN_OK && !stop && i < a.n_targets; i++) {
        if (i) {
            cli_plan_target(&a, i, &t);
            kiln_plan_destroy(p);
            p = NULL;
            if ((st = kiln_plan_create(src.g, &t, &a.po, &p)) != KILN_OK)
                break;
        }
        for (const char *const *w = kiln_plan_warnings(p); *w; w++)
            fprintf(stderr, "kiln compile: warning: %s (%s)\n", *w, t.name);
        kiln_compile_result r;
        if ((st = kiln_compile_plan(p, &co, &r)) == KILN_ERR_OFFLINE_MISS)
            st = list_missing(p, &co.cache, st);
        if (st != KILN_OK)
            break;
        if (json)
            json_array_append_new(done, json_pack("{s:s, s:i, s:i, s:i, s:f, s:s?}", "target",
                                                   t.name, "signatures", r.signatures, "cached",
                                                   r.cached, "compiled", r.compiled, "seconds",
                                                   r.seconds, "cache",
                                                   r.writable ? into : NULL));
        else
            printf("%d signatures: %d cached, %d compiled in %.2f s (%s, %s)\n", r.signatures,
                   r.cached, r.compiled, r.seconds, t.name,
                   r.writable ? into : "no usable writable cache: nothing stored");
    }
    if (st == KILN_OK && !stop && json) {
        json_t *root = json_pack("{s:O}", "targets", done);
        json_dumpf(root, stdout, JSON_INDENT(1));
        putchar('\n');
        json_decref(root);
    }
    json_decref(done);
    if (st == KILN_OK && i < a.n_targets)
        st = cli_error(KILN_ERR_STATE, "interrupted: %d of %d targets compiled", i, a.n_targets);
    kiln_plan_destroy(p);
    cli_source_close(&src);
    cli_plan_args_free(&a);
    if (st != KILN_OK)
        cli_fail(st, "compile");
    return st == KILN_OK ? CLI_OK : stop ? 128 + (int)stop : CLI_FAIL;
}

const cli_command cli_cmd_compile = {
    .name = "compile",
    .summary = "compile the kernels a model needs into the kernel cache (no GPU needed)",
    .run = run,
    .help = help,
};
