/* The kiln command: one function per subcommand, a table in main.c. */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include "kiln.h"

#include <stdio.h>

/* Exit codes: 0 success, 1 the work failed, 2 bad usage. */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

typedef struct cli_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the command name */
    void (*help)(FILE *out);
} cli_command;

/* Print "kiln: <what>: <kiln_last_error()>" and return CLI_FAIL. */
int cli_fail(kiln_status st, const char *what);

/* Report a usage error for cmd on stderr and return CLI_USAGE. */
int cli_usage(const cli_command *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parse "1,2,16" into a sorted list of distinct positive token counts. */
int cli_parse_tokens(const char *s, int64_t *out, int max, int *n);

/* The demo model: a small MLP of FFN layers in several formats, weights
 * quantized from a fixed seed so every run (and every device) sees the same
 * numbers. */
typedef struct cli_demo cli_demo;
kiln_status cli_demo_create(cli_demo **out);
void cli_demo_destroy(cli_demo *d);
kiln_graph *cli_demo_graph(cli_demo *d);
int cli_demo_n_layers(const cli_demo *d);
const char *cli_demo_layer_desc(const cli_demo *d, int i);
int64_t cli_demo_width(const cli_demo *d);
/* The demo's deterministic input for m tokens, [m, width]. */
void cli_demo_input(const cli_demo *d, int64_t m, float *x);

/* What a command runs or compiles: "demo", or a model file / directory whose
 * graph is built by kind ("ffn": the runnable FFN stack; "linears": every
 * linear of the model). */
typedef struct cli_source {
    const char *name;
    kiln_graph *g;
    cli_demo *demo;
    kiln_model *model;
    kiln_graph *own;
} cli_source;
kiln_status cli_source_open(const char *arg, const char *graph, int layers, cli_source *out);
void cli_source_close(cli_source *s);

extern const cli_command cli_cmd_formats;
extern const cli_command cli_cmd_demo;
extern const cli_command cli_cmd_inspect;
extern const cli_command cli_cmd_plan;

#endif
