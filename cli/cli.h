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

/* Print "kiln: <what>: <detail>" and return CLI_FAIL. The detail is the
 * command's own message when cli_error recorded one since the last
 * cli_fail, else kiln_last_error(). */
int cli_fail(kiln_status st, const char *what);

/* s with its control characters written as \xHH, into buf of size bytes
 * (at least 5; cut short where it does not hold all): text from a file
 * never moves the terminal's cursor or colours. Returns buf. */
const char *cli_printable(const char *s, char *buf, size_t size);

/* Record the detail of a failure the command found itself (kiln reported
 * nothing) for the next cli_fail, and return st. */
kiln_status cli_error(kiln_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Report a usage error for cmd on stderr and return CLI_USAGE. */
int cli_usage(const cli_command *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* n bytes for a reader, into buf: "512 B", "185.2 MiB" (binary units, one
 * decimal). --json gives the exact count instead. Returns buf. */
const char *cli_bytes(uint64_t n, char *buf, size_t size);

/* Monotonic wall-clock seconds. */
double cli_now(void);

/* Parse "1,2,16" into a sorted list of distinct positive token counts. */
int cli_parse_tokens(const char *s, int64_t *out, int max, int *n);

/* A decimal integer, the whole of s, from lo to hi: 0 with *out set, or -1
 * (nothing is cut to fit a type: 4294967297 is out of range, not 1). */
int cli_parse_int(const char *s, long long lo, long long hi, long long *out);

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

/* Runs a graph on the GPU session when there is one, else the CPU executor. */
typedef struct cli_exec {
    kiln_session *gpu;
    kiln_cpu *cpu;
} cli_exec;
kiln_status cli_exec_run(cli_exec *e, int64_t m, const float *const *in, float *const *out);

/* The deterministic input of graph input number `input`: [m, width]. */
void cli_fill_input(int input, int64_t m, int64_t width, float *x);

/* One row of cli_run_table. */
typedef struct cli_run_row {
    int64_t tokens;
    double sum, mean_abs, median_s;
} cli_run_row;

/* Run g for each token count `steps` times on fresh deterministic inputs and
 * print tokens, the outputs' checksum (sum, mean |y|) and the median time,
 * or, when rows is not NULL, write them to rows[n_tokens] and print nothing.
 * first_run_s (may be NULL) gets the very first run's time. */
int cli_run_table(const char *cmd, cli_exec *e, kiln_graph *g, const int64_t *tokens,
                  int n_tokens, int steps, double *first_run_s, cli_run_row *rows);

/* Print, for each token count, every kernel of its bucket timed alone
 * (kiln_session_profile): node, kernel signature, microseconds and share. */
int cli_run_profile(const char *cmd, kiln_session *s, const int64_t *tokens, int n_tokens);

/* Run g for m tokens on both executors and give the largest difference,
 * relative to the largest |y| of the CPU's output. */
int cli_run_compare(const char *cmd, cli_exec *gpu, cli_exec *cpu, kiln_graph *g, int64_t m,
                    double *max_err);

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
/* mo may be NULL; the model's warnings are printed to stderr. */
kiln_status cli_source_open(const char *arg, const char *graph, int layers,
                            const kiln_model_options *mo, cli_source *out);
void cli_source_close(cli_source *s);

/* The lowering options every planning command shares (plan, compile, run,
 * cache export): their long options, parsing and the plan they make. */
enum {
    CLI_OPT_TARGET = 1000, CLI_OPT_BACKEND, CLI_OPT_STRICT, CLI_OPT_TOKENS, CLI_OPT_MAX_TOKENS,
    CLI_OPT_GRAPH, CLI_OPT_LAYERS, CLI_OPT_NO_FUSE, CLI_OPT_CAPTURE, CLI_OPT_ALLOW_NONFINITE,
    CLI_OPT_ALLOW_PARTIAL,
};
/* --tokens is not a planning option: run takes it for the token counts it
 * runs, and the other commands refuse it naming --capture (it once meant
 * the capture sizes there). It is in the table so that they can. */
#define CLI_PLAN_LONG_OPTIONS                                                                   \
    { "target", required_argument, NULL, CLI_OPT_TARGET },                                      \
    { "backend", required_argument, NULL, CLI_OPT_BACKEND },                                    \
    { "strict-backend", no_argument, NULL, CLI_OPT_STRICT },                                    \
    { "capture", required_argument, NULL, CLI_OPT_CAPTURE },                                    \
    { "tokens", required_argument, NULL, CLI_OPT_TOKENS },                                      \
    { "max-tokens", required_argument, NULL, CLI_OPT_MAX_TOKENS },                              \
    { "graph", required_argument, NULL, CLI_OPT_GRAPH },                                        \
    { "layers", required_argument, NULL, CLI_OPT_LAYERS },                                      \
    { "no-fuse", no_argument, NULL, CLI_OPT_NO_FUSE },                                          \
    { "allow-nonfinite", no_argument, NULL, CLI_OPT_ALLOW_NONFINITE },                          \
    { "allow-partial", no_argument, NULL, CLI_OPT_ALLOW_PARTIAL }
#define CLI_PLAN_HELP                                                                           \
    "  --target T        sm_75 ... sm_90a, sm_100(a), sm_103(a), sm_110, sm_120(a),\n"         \
    "                    sm_121(a) or a product name (t4, a100, a10, l40s, h100, h200,\n"     \
    "                    orin, b200, gb200, rtx-pro-6000, rtx-5090, dgx-spark), in any\n"     \
    "                    case; default: the GPU's, or sm_90a when there is none. Given\n"     \
    "                    twice only to compile, cache export and cache check (a plan\n"       \
    "                    per target)\n"                                                        \
    "  --backend B       use backend B wherever it can take a node; elsewhere fall\n"          \
    "                    back to the normal choice with one warning per layer type\n"          \
    "  --strict-backend  make such a fallback an error\n"                                      \
    "  --capture LIST    capture sizes: the token buckets compiled and captured\n"            \
    "                    (default 1,2,4,8,16,32,64,128,256,512); give the same\n"             \
    "                    sizes to plan, compile, cache export, cache check and run\n"         \
    "  --max-tokens N    the largest token count to serve (default: largest size)\n"           \
    "  --graph KIND      for a model file: ffn (the runnable FFN stack, default),\n"          \
    "                    linears (every linear of every layer and the head), or\n"            \
    "                    engine (linears and each layer's gate and up as one entry,\n"       \
    "                    blk.L.ffn_gate_up.out = act(gate(x)) * up(x))\n"                    \
    "  --layers N        use only the first N layers of a model file\n"                        \
    "  --no-fuse         keep epilogues as separate kernels\n"                                  \
    "  --allow-nonfinite load a model whose scales, norm weights or rms_norm_eps hold\n"   \
    "                    NaN or infinity (never a static input_scale)\n"                     \
    "  --allow-partial   build what kiln does not model exactly (an unknown architecture\n"\
    "                    or activation) with a warning instead of refusing it\n"

enum { CLI_MAX_TARGETS = 16 };
typedef struct cli_plan_args {
    const char *target, *graph; /* target: the first --target */
    const char *targets[CLI_MAX_TARGETS];
    int n_targets;              /* --target given; after cli_plan_finish at least 1,
                                   unless target_optional */
    int multi_target;           /* the command takes several --target (one plan each) */
    int64_t capture[64];
    int n_capture, layers;
    int target_optional; /* no --target: cli_plan_finish leaves t's name empty */
    kiln_target live;    /* no --target: the live GPU's, when there is one */
    kiln_plan_options po;
    kiln_model_options mo;
    kiln_tuning *tuning; /* po.tuning's table, cli_plan_tuning's */
} cli_plan_args;
void cli_plan_args_init(cli_plan_args *a);
void cli_plan_args_free(cli_plan_args *a);
/* The tuning table of the caches o names (kiln_cache_tuning) as a's
 * plans' (po.tuning), so that they plan as the kernels stored there were
 * planned. */
kiln_status cli_plan_tuning(cli_plan_args *a, const kiln_cache_options *o);
/* 1 when c is a planning option (then *rc is CLI_OK or CLI_USAGE, already
 * reported), 0 when it is not. */
int cli_plan_option(const cli_command *cmd, int c, const char *arg, cli_plan_args *a, int *rc);
/* Check the options together and resolve the (first) target (without
 * --target: the live GPU's, else sm_90a; or none when target_optional);
 * CLI_OK or CLI_USAGE. */
int cli_plan_finish(const cli_command *cmd, cli_plan_args *a, kiln_target *t);
/* Target i of the targets cli_plan_finish accepted. */
void cli_plan_target(const cli_plan_args *a, int i, kiln_target *t);
/* Open what (demo or a model) and plan it; src stays open for the plan. */
kiln_status cli_plan_open(const char *what, cli_plan_args *a, const kiln_target *t,
                          cli_source *src, kiln_plan **p);

/* A shipped file's manifest (cli/manifest.c). cli_manifest_make: the
 * model's identity (name, files and sizes, a digest of its graph) and the
 * planning options as given, a JSON object (free()) for
 * kiln_cache_export_plans. cli_manifest_check: print on stderr, as "kiln
 * CMD: FILE was made for another ...", everything in which file's manifest
 * json differs from what this command plans: the model, the token buckets
 * of p (may be NULL), the other planning options, the target t (may be
 * NULL); returns how many. cli_manifest_print: the manifest for kiln cache
 * stat. */
char *cli_manifest_make(const cli_source *src, const cli_plan_args *a);
int cli_manifest_check(const char *cmd, const char *file, const char *json, const cli_source *src,
                       const cli_plan_args *a, const kiln_plan *p, const kiln_target *t);
void cli_manifest_print(const char *json);

extern const cli_command cli_cmd_formats;
extern const cli_command cli_cmd_demo;
extern const cli_command cli_cmd_inspect;
extern const cli_command cli_cmd_plan;
extern const cli_command cli_cmd_compile;
extern const cli_command cli_cmd_cache;
extern const cli_command cli_cmd_run;
extern const cli_command cli_cmd_tune;

/* t's entries whose signature starts with prefix (NULL: all) as a JSON
 * array (signature, tokens, variant, us, heuristic, heuristic_us), as kiln
 * tune --json and kiln cache stat --json give them. */
struct json_t;
struct json_t *cli_tuning_json(const kiln_tuning *t, const char *prefix);

#endif
