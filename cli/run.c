#include "cli.h"

#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static void help(FILE *out)
{
    fprintf(out,
            "usage: kiln run MODEL|demo [--cache FILE] [--shipped FILE]... [--offline]\n"
            "                [--device cpu|cuda:N] [--tokens LIST] [--steps S] [--eager]\n"
            "                [--check] [--profile] [--json] [planning options]\n"
            "\n"
            "Runs a model's runnable graph (the demo MLP; a model file's FFN stack) on the\n"
            "GPU: the plan for the live device, kernels from the caches (compiled first\n"
            "where they lack one, unless --offline), weights uploaded once, one CUDA graph\n"
            "per token bucket. Prints the output checksum per token count, the cold-start\n"
            "breakdown and the steady-state time per step. Without a GPU or driver it says\n"
            "so once and runs on the CPU executor, unless --device cuda:N asked for one\n"
            "(then it fails). A --shipped file that is missing or damaged is an error on\n"
            "either; on the CPU, offline with --target, every kernel of that target's plan\n"
            "must be in the shipped files, as on a GPU of that target.\n"
            "\n"
            "  --cache FILE      the writable cache (default $KILN_CACHE, else\n"
            "                    $XDG_CACHE_HOME/kiln/kernels.kiln)\n"
            "  --shipped FILE    a read-only cache searched first (repeatable)\n"
            "  --offline         a kernel missing from every cache is an error, before\n"
            "                    anything runs (also KILN_OFFLINE=1)\n"
            "  --device D        cpu, or cuda:N (default cuda:0, else cpu; cuda:N given is\n"
            "                    an error without that GPU)\n"
            "  --tokens LIST     token counts to run (default 1,16,128)\n"
            "  --steps S         timed steps per token count (default 20)\n"
            "  --eager           launch kernels one by one instead of replaying graphs\n"
            "  --check           also run the CPU executor and print the largest difference\n"
            "                    (on the CPU executor alone it says there is nothing to compare)\n"
            "  --profile         print each kernel of each token count's bucket timed alone\n"
            "                    (launched one by one between CUDA events, 10 times; on the\n"
            "                    GPU only; not with --json)\n"
            "  --json            print the runs, the cold start and the check as JSON on\n"
            "                    stdout (seconds, bytes)\n"
            "\n"
            "planning options, as for kiln plan and kiln compile (a deployment gives the\n"
            "ones its cache was compiled with); without --target the plan is the device's:\n"
            CLI_PLAN_HELP);
}

/* Before anything loads: the shipped files must open, and each one's
 * manifest must describe this run: the model, the token buckets, the other
 * planning options and the target (--target, or the live GPU's). Every
 * difference is printed; offline (where a difference means a miss) they
 * fail the run. */
static kiln_status shipped_check(const cli_source *src, const kiln_session_options *so,
                                 const cli_plan_args *a, int offline, int cpu_only)
{
    kiln_cache_options co = so->cache;
    co.no_writable = 1;
    co.strict = 1;
    kiln_cache *c = NULL;
    kiln_plan *p = NULL;
    kiln_target t = { 0 }, any;
    if (so->target)
        t = *so->target;
    else if (cpu_only || kiln_target_live(so->device, &t) != KILN_OK)
        t.name[0] = '\0';
    kiln_status st = kiln_cache_open(&co, &c);
    /* The buckets are the same for every target: any plans them. */
    if (st == KILN_OK && kiln_target_from_name(t.name[0] ? t.name : "sm_90a", &any) == KILN_OK)
        st = kiln_plan_create(src->g, &any, &so->plan, &p);
    int differences = 0;
    for (int i = 0; st == KILN_OK && i < kiln_cache_n_layers(c); i++) {
        const char *json;
        kiln_status ms = kiln_cache_manifest(c, i, &json);
        if (ms == KILN_OK)
            differences += cli_manifest_check("run", kiln_cache_layer_path(c, i), json, src, a, p,
                                              &t);
        else if (ms != KILN_ERR_NOT_FOUND)
            st = ms;
    }
    if (st == KILN_OK && differences && offline)
        st = cli_error(KILN_ERR_OFFLINE_MISS,
                       "offline, and the shipped files were made for another plan (%d "
                       "differences above): nothing was loaded",
                       differences);
    kiln_plan_destroy(p);
    kiln_cache_close(c);
    return st;
}

/* Room for a signature and its key, quoted. */
enum { SIG_TEXT_MAX = 640 };

static void first_missing(void *ctx, const char *signature, const char *key_hex)
{
    char *first = ctx;
    if (!first[0])
        snprintf(first, SIG_TEXT_MAX, "\"%s\" (key %s)", signature, key_hex);
}

/* On the CPU executor no kernel is loaded, yet offline with a named target
 * every kernel of that target's plan must be in the shipped files, as a
 * GPU session of that target would need it. */
static kiln_status cpu_cache_check(const cli_source *src, const kiln_session_options *so,
                                   int offline)
{
    if (!so->cache.n_shipped || !offline || !so->target)
        return KILN_OK;
    kiln_cache_options co = so->cache;
    co.no_writable = 1;
    co.strict = 1;
    kiln_cache *c = NULL;
    kiln_plan *p = NULL;
    int missing = 0;
    char first[SIG_TEXT_MAX] = "";
    kiln_status st = kiln_cache_open(&co, &c);
    if (st == KILN_OK &&
        (st = kiln_plan_create_cached(src->g, so->target, &so->plan, c, &p)) == KILN_OK &&
        (st = kiln_cache_check_plan(c, p, first_missing, first, &missing)) == KILN_OK && missing)
        st = cli_error(KILN_ERR_OFFLINE_MISS,
                       "offline, and %d kernels of the plan for %s are in no shipped cache; the "
                       "first: %s (kiln cache check lists them)",
                       missing, so->target->name, first);
    kiln_plan_destroy(p);
    kiln_cache_close(c);
    return st;
}

/* Decimal gigabytes a second; 0 for no time. */
static double gb_per_s(size_t bytes, double s)
{
    return s > 0 ? (double)bytes / 1e9 / s : 0;
}

/* The most host memory the process has held (its peak resident set). */
static size_t peak_host_bytes(void)
{
    struct rusage u;
    return getrusage(RUSAGE_SELF, &u) ? 0 : (size_t)u.ru_maxrss * 1024;
}

/* --json: the table, the cold start (a GPU session's) and the check, every
 * time in seconds and every size in bytes. */
static int print_json(const char *model, const kiln_session_stats *ss, kiln_cpu *cpu,
                      const cli_run_row *rows, int n, const double *errs, double cold_s,
                      double open_s, double first_s)
{
    json_t *table = json_array(), *check = json_array();
    for (int t = 0; t < n; t++) {
        json_array_append_new(table, json_pack("{s:I, s:f, s:f, s:f}", "tokens",
                                               (json_int_t)rows[t].tokens, "sum", rows[t].sum,
                                               "mean_abs", rows[t].mean_abs, "median_s",
                                               rows[t].median_s));
        if (errs && ss)
            json_array_append_new(check, json_pack("{s:I, s:f}", "tokens",
                                                   (json_int_t)rows[t].tokens, "max_err",
                                                   errs[t]));
    }
    json_t *root = json_pack("{s:s, s:s, s:o}", "model", model, "executor", ss ? "gpu" : "cpu",
                             "runs", table);
    if (ss) {
        json_object_update_new(
            root, json_pack("{s:s, s:s, s:i, s:i, s:i}", "device", ss->device, "target",
                            ss->target, "kernels", ss->kernels, "cached", ss->cached,
                            "compiled", ss->compiled));
        json_t *cold =
            json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:I}", "total_s",
                      cold_s, "open_s", open_s, "plan_s", ss->plan_s, "cache_s", ss->cache_s,
                      "compile_s", ss->compile_s, "module_s", ss->module_s, "weights_s",
                      ss->weights_s, "graphs_s", ss->graphs_s, "first_run_s", first_s,
                      "weight_bytes", (json_int_t)ss->weight_bytes, "arena_bytes",
                      (json_int_t)ss->arena_bytes);
        json_object_update_new(
            cold, json_pack("{s:f, s:f, s:I, s:I, s:I, s:i, s:b, s:f, s:I, s:f}", "weights_gb_s",
                            gb_per_s(ss->weight_bytes, ss->weights_s), "load_s", ss->load_s,
                            "load_read_bytes", (json_int_t)ss->load_read_bytes,
                            "load_copied_bytes", (json_int_t)ss->load_copied_bytes,
                            "load_packed_bytes", (json_int_t)ss->load_packed_bytes,
                            "load_threads", ss->load_threads, "load_pinned", ss->load_pinned,
                            "load_gb_s", gb_per_s(ss->load_copied_bytes, ss->load_s),
                            "load_device_packed_bytes", (json_int_t)ss->load_device_packed_bytes,
                            "load_device_pack_s", ss->load_device_pack_s));
        json_object_set_new(cold, "peak_host_bytes", json_integer((json_int_t)peak_host_bytes()));
        json_object_set_new(root, "cold_start", cold);
    } else {
        json_object_set_new(root, "threads", json_integer(kiln_cpu_threads(cpu)));
    }
    if (errs)
        json_object_set_new(root, "check",
                            ss ? json_incref(check)
                               : json_string("nothing to compare: the CPU executor ran, and it "
                                             "is the reference the GPU is checked against"));
    json_decref(check);
    int rc = json_dumpf(root, stdout, JSON_INDENT(1)) == 0 ? CLI_OK : CLI_FAIL;
    putchar('\n');
    json_decref(root);
    return rc;
}

static int run(int argc, char **argv)
{
    static const struct option opts[] = {
        CLI_PLAN_LONG_OPTIONS,
        { "cache", required_argument, NULL, 'c' },
        { "shipped", required_argument, NULL, 's' },
        { "offline", no_argument, NULL, 'o' },
        { "device", required_argument, NULL, 'd' },
        { "steps", required_argument, NULL, 'S' },
        { "eager", no_argument, NULL, 'e' },
        { "check", no_argument, NULL, 'k' },
        { "json", no_argument, NULL, 'J' },
        { "profile", no_argument, NULL, 'p' },
        { 0 },
    };
    cli_plan_args a;
    const char *shipped[16];
    kiln_session_options so = { .cache.shipped = shipped };
    int64_t tokens[64] = { 1, 16, 128 };
    int n_tokens = 3, steps = 20, cpu_only = 0, check = 0, device_given = 0, json = 0, c, rc;
    int profile = 0;
    long long v;
    cli_plan_args_init(&a);
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        if (c == CLI_OPT_TOKENS) { /* here: the token counts to run */
            if (cli_parse_tokens(optarg, tokens, 64, &n_tokens))
                return cli_usage(&cli_cmd_run, "bad --tokens '%s' (want e.g. 1,16,128)", optarg);
            continue;
        }
        if (cli_plan_option(&cli_cmd_run, c, optarg, &a, &rc)) {
            if (rc != CLI_OK)
                return rc;
            continue;
        }
        switch (c) {
        case 'c': so.cache.path = optarg; break;
        case 's':
            if (so.cache.n_shipped == (int)(sizeof shipped / sizeof shipped[0]))
                return cli_usage(&cli_cmd_run, "too many --shipped caches");
            shipped[so.cache.n_shipped++] = optarg;
            break;
        case 'o': so.cache.offline = 1; break;
        case 'e': so.eager = 1; break;
        case 'k': check = 1; break;
        case 'J': json = 1; break;
        case 'p': profile = 1; break;
        case 'd':
            if (!strcmp(optarg, "cpu")) {
                cpu_only = 1;
            } else if (!strncmp(optarg, "cuda:", 5)) {
                long long dev;
                if (cli_parse_int(optarg + 5, 0, INT_MAX, &dev))
                    return cli_usage(&cli_cmd_run, "bad --device '%s'", optarg);
                so.device = (int)dev;
                device_given = 1;
            } else {
                return cli_usage(&cli_cmd_run, "bad --device '%s' (want cpu or cuda:N)", optarg);
            }
            break;
        case 'S':
            if (cli_parse_int(optarg, 1, 100000, &v))
                return cli_usage(&cli_cmd_run, "bad --steps '%s'", optarg);
            steps = (int)v;
            break;
        case ':': return cli_usage(&cli_cmd_run, "%s needs a value", argv[optind - 1]);
        default: return cli_usage(&cli_cmd_run, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return cli_usage(&cli_cmd_run, "what to run? give a MODEL file or directory, or demo");
    if (optind + 1 < argc)
        return cli_usage(&cli_cmd_run, "unexpected argument '%s'", argv[optind + 1]);
    kiln_target target;
    a.target_optional = 1;
    if ((rc = cli_plan_finish(&cli_cmd_run, &a, &target)) != CLI_OK)
        return rc;
    if (target.name[0])
        so.target = &target;
    /* The buckets must reach the largest count asked for. */
    int64_t largest = a.n_capture ? a.capture[a.n_capture - 1] : 512;
    if (!a.po.max_tokens && tokens[n_tokens - 1] > largest)
        a.po.max_tokens = tokens[n_tokens - 1];
    so.plan = a.po;

    const char *env = getenv("KILN_OFFLINE");
    int offline = so.cache.offline || (env && !strcmp(env, "1"));
    cli_source src;
    double open_t0 = cli_now();
    kiln_status st = cli_source_open(argv[optind], a.graph, a.layers, &a.mo, &src);
    if (st == KILN_OK && so.cache.n_shipped &&
        (st = shipped_check(&src, &so, &a, offline, cpu_only)) != KILN_OK)
        cli_source_close(&src);
    if (st != KILN_OK)
        return cli_fail(st, "run");
    const double open_s = cli_now() - open_t0;
    cli_exec gpu = { 0 }, cpu = { 0 };
    double t0 = cli_now();
    if (!cpu_only) {
        st = kiln_session_create(src.g, &so, &gpu.gpu);
        if (st == KILN_ERR_NO_DEVICE && device_given) {
            char what[64];
            snprintf(what, sizeof what, "run: --device cuda:%d", so.device);
            cli_source_close(&src);
            return cli_fail(st, what);
        }
        if (st == KILN_ERR_NO_DEVICE) {
            fprintf(stderr, "kiln run: %s; running on the CPU executor\n", kiln_last_error());
            cpu_only = 1;
        } else if (st != KILN_OK) {
            cli_source_close(&src);
            return cli_fail(st, "run");
        }
    }
    double create_s = cli_now() - t0;
    rc = CLI_OK;
    if (!gpu.gpu && (st = cpu_cache_check(&src, &so, offline)) != KILN_OK)
        rc = cli_fail(st, "run");
    if (cpu_only || check) {
        if ((st = kiln_cpu_create(src.g, NULL, &cpu.cpu)) != KILN_OK)
            rc = cli_fail(st, "run");
    }
    cli_exec *e = gpu.gpu ? &gpu : &cpu;
    double first = 0;
    kiln_session_stats ss = { 0 };
    if (gpu.gpu)
        kiln_session_get_stats(gpu.gpu, &ss);
    cli_run_row rows[64];
    double errs[64];
    if (rc == CLI_OK && !json) {
        if (gpu.gpu)
            printf("run: %s on %s (%s): %d kernels, %d cached, %d compiled\n", argv[optind],
                   ss.device, ss.target, ss.kernels, ss.cached, ss.compiled);
        else
            printf("run: %s on the CPU executor (%d threads)\n", argv[optind],
                   kiln_cpu_threads(cpu.cpu));
    }
    if (rc == CLI_OK)
        rc = cli_run_table("run", e, src.g, tokens, n_tokens, steps, &first, json ? rows : NULL);
    if (rc == CLI_OK && gpu.gpu && !json) {
        char weights[32];
        cli_bytes(ss.weight_bytes, weights, sizeof weights);
        printf("cold start %.1f ms: model open %.1f, plan %.1f, cache open + lookup %.1f, "
               "compile %.1f (%d kernels), module load %.1f, weights upload %.1f (%s, %.2f "
               "GB/s), graph instantiate %.1f, first run %.1f\n",
               (open_s + create_s + first) * 1e3, open_s * 1e3, ss.plan_s * 1e3,
               ss.cache_s * 1e3, ss.compile_s * 1e3, ss.compiled, ss.module_s * 1e3,
               ss.weights_s * 1e3, weights, gb_per_s(ss.weight_bytes, ss.weights_s),
               ss.graphs_s * 1e3, first * 1e3);
        char read[32], packed[32], device[32], peak[32];
        cli_bytes(ss.load_read_bytes, read, sizeof read);
        cli_bytes(ss.load_packed_bytes, packed, sizeof packed);
        cli_bytes(ss.load_device_packed_bytes, device, sizeof device);
        cli_bytes(peak_host_bytes(), peak, sizeof peak);
        printf("weights load %.1f ms (%.2f GB/s to the device): %s read, %s packed on the host, "
               "%d readers, %s staging; %s packed on the device in %.1f ms; peak host memory "
               "%s\n",
               ss.load_s * 1e3, gb_per_s(ss.load_copied_bytes, ss.load_s), read, packed,
               ss.load_threads, ss.load_pinned ? "pinned" : "pageable", device,
               ss.load_device_pack_s * 1e3, peak);
    }
    if (rc == CLI_OK && profile && !json) {
        if (gpu.gpu)
            rc = cli_run_profile("run", gpu.gpu, tokens, n_tokens);
        else
            printf("profile: the CPU executor runs no kernels; --profile times a GPU's\n");
    }
    if (rc == CLI_OK && !gpu.gpu && check && !json)
        printf("check: nothing to compare: the CPU executor ran, and it is the reference the "
               "GPU is checked against\n");
    for (int t = 0; rc == CLI_OK && gpu.gpu && check && t < n_tokens; t++)
        if ((rc = cli_run_compare("run", &gpu, &cpu, src.g, tokens[t], &errs[t])) == CLI_OK &&
            !json)
            printf("check %lld tokens: largest |gpu - cpu| = %.3e of max |y|\n",
                   (long long)tokens[t], errs[t]);
    if (rc == CLI_OK && json)
        rc = print_json(argv[optind], gpu.gpu ? &ss : NULL, cpu.cpu, rows, n_tokens,
                        check ? errs : NULL, open_s + create_s + first, open_s, first);
    kiln_session_destroy(gpu.gpu);
    kiln_cpu_destroy(cpu.cpu);
    cli_source_close(&src);
    return rc;
}

const cli_command cli_cmd_run = {
    .name = "run",
    .summary = "run a model on the GPU (or the CPU executor when there is none)",
    .run = run,
    .help = help,
};
