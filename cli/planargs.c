#include "cli.h"

#include <getopt.h>
#include <limits.h>

#include <stdlib.h>
#include <string.h>

void cli_plan_args_init(cli_plan_args *a)
{
    memset(a, 0, sizeof *a);
    a->target = NULL; /* the live GPU's, else sm_90a */
    a->graph = "ffn";
}

int cli_plan_option(const cli_command *cmd, int c, const char *arg, cli_plan_args *a, int *rc)
{
    long long v = 0;
    *rc = CLI_OK;
    switch (c) {
    case CLI_OPT_TARGET: a->target = arg; return 1;
    case CLI_OPT_BACKEND: a->po.backend = arg; return 1;
    case CLI_OPT_STRICT: a->po.strict_backend = 1; return 1;
    case CLI_OPT_NO_FUSE: a->po.no_fuse = 1; return 1;
    case CLI_OPT_GRAPH:
        if (strcmp(arg, "ffn") && strcmp(arg, "linears"))
            *rc = cli_usage(cmd, "bad --graph '%s' (want ffn or linears)", arg);
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
    if (!a->target && a->target_optional) {
        t->name[0] = '\0';
        return CLI_OK;
    }
    if (!a->target) {
        if (kiln_target_live(0, t) == KILN_OK)
            return CLI_OK;
        a->target = "sm_90a";
    }
    if (kiln_target_from_name(a->target, t) != KILN_OK)
        return cli_usage(cmd, "%s", kiln_last_error());
    return CLI_OK;
}

kiln_status cli_plan_open(const char *what, cli_plan_args *a, const kiln_target *t,
                          cli_source *src, kiln_plan **p)
{
    kiln_status st = cli_source_open(what, a->graph, a->layers, src);
    if (st != KILN_OK)
        return st;
    if ((st = kiln_plan_create(src->g, t, &a->po, p))) {
        cli_source_close(src);
        return st;
    }
    return KILN_OK;
}
