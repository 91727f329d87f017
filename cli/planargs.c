#include "cli.h"

#include <assert.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void cli_plan_args_init(cli_plan_args *a)
{
    memset(a, 0, sizeof *a);
    a->target = NULL; /* the live GPU's, else sm_90a */
    a->graph = "ffn";
}

void cli_plan_args_free(cli_plan_args *a)
{
    kiln_tuning_destroy(a->tuning);
    a->tuning = NULL;
    a->po.tuning = NULL;
}

kiln_status cli_plan_tuning(cli_plan_args *a, const kiln_cache_options *o)
{
    cli_plan_args_free(a);
    /* reading creates no writable cache where there is none */
    kiln_cache_options ro = *o;
    char path[4096];
    struct stat fs;
    if (!ro.path && kiln_cache_default_path(path, sizeof path) == KILN_OK)
        ro.path = path;
    if (ro.path && stat(ro.path, &fs) && errno == ENOENT)
        ro.no_writable = 1;
    if (ro.no_writable && !ro.n_shipped)
        return KILN_OK;
    kiln_cache *c;
    kiln_status st = kiln_cache_open(&ro, &c);
    if (st)
        return st;
    if (!(st = kiln_tuning_create(&a->tuning)) && !(st = kiln_cache_tuning(c, a->tuning)))
        a->po.tuning = a->tuning;
    kiln_cache_close(c);
    if (st)
        cli_plan_args_free(a);
    return st;
}

int cli_plan_option(const cli_command *cmd, int c, const char *arg, cli_plan_args *a, int *rc)
{
    long long v = 0;
    *rc = CLI_OK;
    switch (c) {
    case CLI_OPT_TARGET:
        if (a->n_targets && !a->multi_target)
            *rc = cli_usage(cmd, "--target given twice ('%s', then '%s'): kiln %s plans for one "
                            "target (kiln compile and kiln cache export take several)",
                            a->target, arg, cmd->name);
        else if (a->n_targets == CLI_MAX_TARGETS)
            *rc = cli_usage(cmd, "more than %d --target", CLI_MAX_TARGETS);
        else
            a->targets[a->n_targets++] = arg;
        a->target = a->targets[0];
        return 1;
    case CLI_OPT_BACKEND: a->po.backend = arg; return 1;
    case CLI_OPT_STRICT: a->po.strict_backend = 1; return 1;
    case CLI_OPT_NO_FUSE: a->po.no_fuse = 1; return 1;
    case CLI_OPT_ALLOW_NONFINITE: a->mo.allow_nonfinite = 1; return 1;
    case CLI_OPT_ALLOW_PARTIAL: a->mo.allow_partial = 1; return 1;
    case CLI_OPT_GRAPH:
        if (strcmp(arg, "ffn") && strcmp(arg, "linears") && strcmp(arg, "engine"))
            *rc = cli_usage(cmd, "bad --graph '%s' (want ffn, linears or engine)", arg);
        a->graph = arg;
        return 1;
    case CLI_OPT_CAPTURE:
        if (cli_parse_tokens(arg, a->capture, 64, &a->n_capture))
            *rc = cli_usage(cmd, "bad --capture '%s' (want e.g. 1,16,128)", arg);
        return 1;
    case CLI_OPT_TOKENS:
        *rc = cli_usage(cmd, "--tokens is not an option of kiln %s: capture sizes are "
                        "--capture %s (kiln run --tokens gives the token counts to run)",
                        cmd->name, arg);
        return 1;
    case CLI_OPT_MAX_TOKENS:
        if (cli_parse_int(arg, 1, 1 << 20, &v))
            *rc = cli_usage(cmd, "bad --max-tokens '%s'", arg);
        a->po.max_tokens = v;
        return 1;
    case CLI_OPT_LAYERS:
        if (cli_parse_int(arg, 1, INT_MAX, &v))
            *rc = cli_usage(cmd, "bad --layers '%s'", arg);
        a->layers = (int)v;
        return 1;
    default: return 0;
    }
}

int cli_plan_finish(const cli_command *cmd, cli_plan_args *a, kiln_target *t)
{
    if (a->po.strict_backend && !a->po.backend)
        return cli_usage(cmd, "--strict-backend needs --backend");
    if (a->n_capture) {
        a->po.capture = a->capture;
        a->po.n_capture = a->n_capture;
    }
    if (!a->n_targets && a->target_optional) {
        t->name[0] = '\0';
        return CLI_OK;
    }
    if (!a->n_targets) {
        if (kiln_target_live(0, t) == KILN_OK) {
            a->live = *t;
            a->n_targets = 1;
            return CLI_OK;
        }
        a->targets[a->n_targets++] = a->target = "sm_90a";
    }
    for (int i = 0; i < a->n_targets; i++) {
        if (kiln_target_from_name(a->targets[i], t) != KILN_OK)
            return cli_usage(cmd, "%s", kiln_last_error());
        for (int j = 0; j < i; j++) {
            kiln_target u;
            cli_plan_target(a, j, &u);
            if (!strcmp(u.name, t->name))
                return cli_usage(cmd, "--target %s and --target %s are one target, %s",
                                 a->targets[j], a->targets[i], t->name);
        }
    }
    cli_plan_target(a, 0, t);
    return CLI_OK;
}

void cli_plan_target(const cli_plan_args *a, int i, kiln_target *t)
{
    if (a->live.name[0]) {
        *t = a->live;
        return;
    }
    kiln_status st = kiln_target_from_name(a->targets[i], t);
    assert(st == KILN_OK); /* cli_plan_finish accepted it */
    (void)st;
}

kiln_status cli_plan_open(const char *what, cli_plan_args *a, const kiln_target *t,
                          cli_source *src, kiln_plan **p)
{
    kiln_status st = cli_source_open(what, a->graph, a->layers, &a->mo, src);
    if (st != KILN_OK)
        return st;
    if ((st = kiln_plan_create(src->g, t, &a->po, p))) {
        cli_source_close(src);
        return st;
    }
    return KILN_OK;
}
