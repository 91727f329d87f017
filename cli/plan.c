#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void help(FILE *out)
{
    fprintf(out,
            "usage: kiln plan MODEL|demo [--target T] [--backend B] [--strict-backend]\n"
            "                 [--capture LIST] [--max-tokens N] [--graph KIND]\n"
            "                 [--layers N] [--no-fuse] [--cache PATH] [--json]\n"
            "\n"
            "Lowers a model for a target and prints, per linear node, the backend chosen\n"
            "for each range of token buckets, the activations it reads and their scale\n"
            "(dynamic, or a checkpoint's static input_scale, and whether the backend\n"
            "applies or ignores it), the fused epilogue and why the backends before it in\n"
            "the format's priority list were refused; then how many kernels the plan\n"
            "needs, the activation arena and the weight memory on the device (storage\n"
            "layout and packed), in binary units (MiB); --json gives every size in bytes.\n"
            "The variant column is the kernel's tile configuration or M class, marked *\n"
            "where a tuning table (kiln tune) chose it over the heuristic; a \"launches\n"
            "(tuned)\" line names the buckets whose launch policy the table sets (serial:\n"
            "each kernel starts after the one before it ends).\n"
            "\n"
            CLI_PLAN_HELP
            "  --cache PATH      plan with the tuning table of this kernel cache, as compile\n"
            "                    and run do with theirs (default: the heuristic's variants)\n"
            "  --json            print the plan as JSON on stdout\n");
}

/* Buckets [b0, b1] of linear i that share backend, activations and
 * epilogue print as one row, with the refusals of its first bucket. */
static int same_choice(const kiln_plan_linear *a, const kiln_plan_linear *b)
{
    return !strcmp(a->backend, b->backend) && !strcmp(a->variant, b->variant) &&
           a->tuned == b->tuned && !strcmp(a->act, b->act) &&
           !strcmp(a->epilogue, b->epilogue) && a->fell_back == b->fell_back &&
           !strcmp(a->input_scale_use, b->input_scale_use);
}

/* The activation scale of l as the plan applies it: "static
 * (input_scale=0.0125)" where the kernel reads E4M3 codes made with it,
 * with " q/dq" where a BF16 kernel reads them dequantized, and "IGNORED: "
 * before it where the kernel quantizes with dynamic scales of its own;
 * "dynamic" for FP8 activations without one; "-" for BF16 without one. */
static const char *act_scale_text(const kiln_plan_linear *l, char *buf, size_t size)
{
    if (!l->input_scale_use[0])
        return strcmp(l->act, "bf16") ? "dynamic" : "-";
    int ignored = !strcmp(l->input_scale_use, "ignored");
    snprintf(buf, size, "%sstatic (input_scale=%.9g)%s", ignored ? "IGNORED: " : "",
             (double)l->input_scale, strcmp(l->input_scale_use, "bf16-qdq") ? "" : " q/dq");
    return buf;
}

static void print_text(const kiln_plan *p, const char *source, const kiln_target *t)
{
    int nb = kiln_plan_n_buckets(p), nl = kiln_plan_n_linears(p);
    printf("plan: %s for %s%s%s%s, %d token buckets:", source, t->name,
           t->alias_of[0] ? " (" : "", t->alias_of, t->alias_of[0] ? ")" : "", nb);
    for (int b = 0; b < nb; b++)
        printf(" %lld", (long long)kiln_plan_bucket(p, b));
    printf("\n\n%-28s %-11s %-12s %-9s %-8s %-15s %-11s %-35s %-15s %s\n", "linear", "format",
           "N x K", "tokens", "backend", "variant", "activations", "act scale", "epilogue",
           "refused before it");
    for (int i = 0; i < nl; i++) {
        for (int b0 = 0; b0 < nb;) {
            kiln_plan_linear first, cur;
            kiln_plan_linear_at(p, i, b0, &first);
            int b1 = b0;
            while (b1 + 1 < nb && (kiln_plan_linear_at(p, i, b1 + 1, &cur), same_choice(&first, &cur)))
                b1++;
            char shape[32], range[24];
            snprintf(shape, sizeof shape, "%lldx%lld", (long long)first.n, (long long)first.k);
            snprintf(range, sizeof range, "%lld-%lld", (long long)kiln_plan_bucket(p, b0),
                     (long long)kiln_plan_bucket(p, b1));
            char scale[128], variant[72];
            snprintf(variant, sizeof variant, "%s%s", first.variant, first.tuned ? "*" : "");
            printf("%-28s %-11s %-12s %-9s %-8s %-15s %-11s %-35s %-15s %s%s\n",
                   b0 ? "" : first.node, b0 ? "" : kiln_format_get(first.format)->name,
                   b0 ? "" : shape, range, first.backend, variant, first.act,
                   act_scale_text(&first, scale, sizeof scale),
                   first.epilogue,
                   first.fell_back ? "(fallback) " : "", first.refused[0] ? first.refused : "-");
            b0 = b1 + 1;
        }
    }
    int ns = kiln_plan_n_signatures(p), linear_sigs = 0;
    for (int s = 0; s < ns; s++)
        linear_sigs += !strncmp(kiln_plan_signature(p, s), "linear ", 7);
    printf("\n%d linear nodes x %d buckets -> %d signatures -> %d kernels (%d linear, %d "
           "elementwise and activation-quantization)\n",
           nl, nb, linear_sigs, ns, linear_sigs, ns - linear_sigs);
    char a[32], b[32], c[32];
    printf("activation arena: %s at %lld tokens (no reuse: %s)\n",
           cli_bytes(kiln_plan_arena_bytes(p, nb - 1), a, sizeof a),
           (long long)kiln_plan_bucket(p, nb - 1),
           cli_bytes(kiln_plan_naive_bytes(p, nb - 1), b, sizeof b));
    int tuned = 0;
    for (int s = 0; s < nb; s++)
        tuned += kiln_plan_step_policy(p, s) >= 0;
    if (tuned) {
        printf("launches (tuned):");
        for (int s = 0; s < nb; s++)
            if (kiln_plan_step_policy(p, s) >= 0)
                printf(" %lld %s", (long long)kiln_plan_bucket(p, s),
                       kiln_plan_step_policy(p, s) ? "serial" : "overlap");
        printf("; the other buckets overlap where their kernels allow\n");
    }
    size_t storage, packed;
    if (kiln_plan_weight_bytes(p, &storage, &packed) == KILN_OK)
        printf("weights on the device: %s (%s in kiln's storage layout, %s packed for the "
               "tensor-core kernels)\n",
               cli_bytes(storage + packed, a, sizeof a), cli_bytes(storage, b, sizeof b),
               cli_bytes(packed, c, sizeof c));
}

static int print_json(const kiln_plan *p, const char *source, const kiln_target *t)
{
    int nb = kiln_plan_n_buckets(p), nl = kiln_plan_n_linears(p);
    json_t *root = json_object(), *buckets = json_array(), *linears = json_array(),
           *sigs = json_array(), *arena = json_array(), *warn = json_array();
    for (int b = 0; b < nb; b++) {
        json_array_append_new(buckets, json_integer(kiln_plan_bucket(p, b)));
        json_array_append_new(arena, json_pack("{s:I, s:I, s:I}", "tokens",
                                               (json_int_t)kiln_plan_bucket(p, b), "bytes",
                                               (json_int_t)kiln_plan_arena_bytes(p, b), "naive",
                                               (json_int_t)kiln_plan_naive_bytes(p, b)));
        int pol = kiln_plan_step_policy(p, b);
        if (pol >= 0)
            json_object_set_new(json_array_get(arena, (size_t)b), "launches",
                                json_string(pol ? "serial" : "overlap"));
    }
    for (int i = 0; i < nl; i++) {
        json_t *per = json_array(), *node = NULL;
        for (int b = 0; b < nb; b++) {
            kiln_plan_linear l;
            kiln_plan_linear_at(p, i, b, &l);
            if (!node) {
                node = json_pack("{s:s, s:s, s:I, s:I}", "name", l.node, "format",
                                 kiln_format_get(l.format)->name, "n", (json_int_t)l.n, "k",
                                 (json_int_t)l.k);
                /* The scale as an f32 printed to round-trip. */
                json_object_set_new(node, "input_scale",
                                    l.input_scale_use[0] ? json_real(l.input_scale) : json_null());
            }
            char scale[128];
            json_t *row = json_pack("{s:I, s:s, s:s, s:s, s:s, s:i, s:s, s:b}", "tokens",
                                    (json_int_t)kiln_plan_bucket(p, b), "backend", l.backend,
                                    "act", l.act, "act_scale",
                                    act_scale_text(&l, scale, sizeof scale), "epilogue",
                                    l.epilogue, "signature", l.signature, "refused", l.refused,
                                    "fallback", l.fell_back);
            if (l.input_scale_use[0])
                json_object_set_new(row, "input_scale_use", json_string(l.input_scale_use));
            json_object_set_new(row, "variant", json_string(l.variant));
            json_object_set_new(row, "tuned", json_boolean(l.tuned));
            json_array_append_new(per, row);
        }
        json_object_set_new(node, "buckets", per);
        json_array_append_new(linears, node);
    }
    for (int s = 0; s < kiln_plan_n_signatures(p); s++)
        json_array_append_new(sigs, json_string(kiln_plan_signature(p, s)));
    for (const char *const *w = kiln_plan_warnings(p); *w; w++)
        json_array_append_new(warn, json_string(*w));
    json_object_set_new(root, "source", json_string(source));
    json_object_set_new(root, "target", json_string(t->name));
    json_object_set_new(root, "buckets", buckets);
    json_object_set_new(root, "linears", linears);
    json_object_set_new(root, "signatures", sigs);
    json_object_set_new(root, "arena", arena);
    size_t storage, packed;
    if (kiln_plan_weight_bytes(p, &storage, &packed) == KILN_OK)
        json_object_set_new(root, "weights",
                            json_pack("{s:I, s:I}", "storage", (json_int_t)storage, "packed",
                                      (json_int_t)packed));
    json_object_set_new(root, "warnings", warn);
    int rc = json_dumpf(root, stdout, JSON_INDENT(1)) == 0 ? CLI_OK : CLI_FAIL;
    putchar('\n');
    json_decref(root);
    return rc;
}

static int run(int argc, char **argv)
{
    static const struct option opts[] = {
        CLI_PLAN_LONG_OPTIONS,
        { "json", no_argument, NULL, 'j' },
        { "cache", required_argument, NULL, 'c' },
        { 0 },
    };
    cli_plan_args a;
    const char *cache = NULL;
    int json = 0, c, rc;
    cli_plan_args_init(&a);
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        if (cli_plan_option(&cli_cmd_plan, c, optarg, &a, &rc)) {
            if (rc != CLI_OK)
                return rc;
            continue;
        }
        switch (c) {
        case 'j': json = 1; break;
        case 'c': cache = optarg; break;
        case ':': return cli_usage(&cli_cmd_plan, "%s needs a value", argv[optind - 1]);
        default: return cli_usage(&cli_cmd_plan, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return cli_usage(&cli_cmd_plan, "what to plan? give a MODEL file or directory, or demo");
    if (optind + 1 < argc)
        return cli_usage(&cli_cmd_plan, "unexpected argument '%s'", argv[optind + 1]);
    kiln_target t;
    if ((rc = cli_plan_finish(&cli_cmd_plan, &a, &t)) != CLI_OK)
        return rc;
    cli_source src;
    kiln_plan *p;
    kiln_status st = KILN_OK;
    struct stat fs;
    if (cache && stat(cache, &fs))
        st = cli_error(KILN_ERR_IO, "--cache %s: %s", cache, strerror(errno));
    else if (cache)
        st = cli_plan_tuning(&a, &(kiln_cache_options){ .path = cache, .strict = 1 });
    if (st == KILN_OK)
        st = cli_plan_open(argv[optind], &a, &t, &src, &p);
    if (st != KILN_OK) {
        cli_plan_args_free(&a);
        return cli_fail(st, "plan");
    }
    for (const char *const *w = kiln_plan_warnings(p); *w; w++)
        fprintf(stderr, "kiln plan: warning: %s\n", *w);
    rc = CLI_OK;
    if (json)
        rc = print_json(p, argv[optind], &t);
    else
        print_text(p, argv[optind], &t);
    kiln_plan_destroy(p);
    cli_source_close(&src);
    cli_plan_args_free(&a);
    return rc;
}

const cli_command cli_cmd_plan = {
    .name = "plan",
    .summary = "show which backend runs each linear, per token bucket, and why",
    .run = run,
    .help = help,
};
