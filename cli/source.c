#include "cli.h"

#include <stdio.h>
#include <string.h>

kiln_status cli_source_open(const char *arg, const char *graph, int layers,
                            const kiln_model_options *mo, cli_source *out)
{
    memset(out, 0, sizeof *out);
    out->name = arg;
    kiln_status st;
    if (!strcmp(arg, "demo")) {
        if ((st = cli_demo_create(&out->demo)))
            return st;
        out->g = cli_demo_graph(out->demo);
        return KILN_OK;
    }
    if (strcmp(graph, "ffn") && strcmp(graph, "linears") && strcmp(graph, "engine"))
        return cli_error(KILN_ERR_INVALID_ARG, "--graph %s: want ffn, linears or engine", graph);
    if ((st = kiln_model_open_with(arg, mo, &out->model)))
        return st;
    if ((st = kiln_graph_create(&out->own)) == KILN_OK)
        st = !strcmp(graph, "ffn")       ? kiln_model_build_ffn(out->model, out->own, layers)
             : !strcmp(graph, "linears") ? kiln_model_build_linears(out->model, out->own, layers)
                                         : kiln_model_build_engine(out->model, out->own, layers);
    for (const char *const *w = kiln_model_warnings(out->model); *w; w++)
        fprintf(stderr, "kiln: warning: %s\n", *w);
    if (st != KILN_OK) {
        cli_source_close(out);
        return st;
    }
    out->g = out->own;
    return KILN_OK;
}

void cli_source_close(cli_source *s)
{
    kiln_graph_destroy(s->own);
    kiln_model_close(s->model);
    cli_demo_destroy(s->demo);
    memset(s, 0, sizeof *s);
}
