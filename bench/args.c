/* The command lines of `kiln-bench gemm` and `kiln-bench ffn`: options,
 * shape presets, lists. */
#include "bench/bench.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ presets */

typedef struct preset_linear {
    const char *name;
    int64_t n, k;
} preset_linear;

typedef struct preset {
    const char *name;
    preset_linear linears[5];
} preset;

/* Llama 3 8B and 70B: q, k and v fused, gate and up fused, the output head
 * over the 128256-token vocabulary. */
static const preset presets[] = {
    { "llama8b",
      { { "qkv", 6144, 4096 }, { "o", 4096, 4096 }, { "gate_up", 28672, 4096 },
        { "down", 4096, 14336 }, { "head", 128256, 4096 } } },
    { "llama70b",
      { { "qkv", 10240, 8192 }, { "o", 8192, 8192 }, { "gate_up", 57344, 8192 },
        { "down", 8192, 28672 }, { "head", 128256, 8192 } } },
};

/* cuBLAS takes int dimensions. */
#define DIM_MAX 2147483647LL

/* A decimal integer in [lo, hi] filling all of text. */
static int parse_i64(const char *text, int64_t lo, int64_t hi, int64_t *out)
{
    if (!text || !*text)
        return 0;
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || *end || end == text || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

static int parse_f64(const char *text, double lo, double hi, double *out)
{
    if (!text || !*text)
        return 0;
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || *end || end == text || !(v >= lo && v <= hi))
        return 0;
    *out = v;
    return 1;
}

/* Calls each(item, ctx) for the comma-separated items of list, in order. */
typedef kiln_status (*item_fn)(const char *item, void *ctx);

static kiln_status for_each_item(const char *what, const char *list, item_fn each, void *ctx)
{
    if (!list || !*list)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: an empty list", what);
    char buf[1024];
    if (strlen(list) >= sizeof buf)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: the list is longer than %zu characters", what,
                         sizeof buf - 1);
    strcpy(buf, list);
    char *p = buf;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        if (!*p)
            return kiln_fail(KILN_ERR_INVALID_ARG, "%s: an empty item in \"%s\"", what, list);
        kiln_status st = each(p, ctx);
        if (st != KILN_OK)
            return st;
        if (!comma)
            return KILN_OK;
        p = comma + 1;
    }
}

typedef struct shape_ctx {
    kiln_bench_shape *out;
    int cap, n;
} shape_ctx;

static kiln_status shape_push(shape_ctx *c, const char *name, int64_t n, int64_t k)
{
    if (c->n == c->cap)
        return kiln_fail(KILN_ERR_INVALID_ARG, "--shapes: more than %d shapes", c->cap);
    kiln_bench_shape *s = &c->out[c->n++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->n = n;
    s->k = k;
    return KILN_OK;
}

static kiln_status shape_item(const char *item, void *ctx)
{
    shape_ctx *c = ctx;
    for (size_t i = 0; i < KILN_ARRAY_LEN(presets); i++) {
        if (strcmp(item, presets[i].name) != 0)
            continue;
        for (size_t j = 0; j < KILN_ARRAY_LEN(presets[i].linears); j++) {
            const preset_linear *l = &presets[i].linears[j];
            char name[KILN_BENCH_NAME];
            snprintf(name, sizeof name, "%s.%s", presets[i].name, l->name);
            kiln_status st = shape_push(c, name, l->n, l->k);
            if (st != KILN_OK)
                return st;
        }
        return KILN_OK;
    }
    char nb[32];
    const char *x = strpbrk(item, "xX");
    int64_t n, k;
    if (!x || (size_t)(x - item) >= sizeof nb)
        goto bad;
    memcpy(nb, item, (size_t)(x - item));
    nb[x - item] = '\0';
    if (!parse_i64(nb, 1, DIM_MAX, &n) || !parse_i64(x + 1, 1, DIM_MAX, &k))
        goto bad;
    char name[KILN_BENCH_NAME];
    snprintf(name, sizeof name, "%lldx%lld", (long long)n, (long long)k);
    return shape_push(c, name, n, k);
bad:
    return kiln_fail(KILN_ERR_INVALID_ARG,
                     "--shapes: \"%s\" is neither a preset (llama8b, llama70b) nor NxK with "
                     "positive N and K below 2^31",
                     item);
}

kiln_status kiln_bench_shapes_parse(const char *list, kiln_bench_shape *out, int cap, int *n)
{
    shape_ctx c = { out, cap, 0 };
    kiln_status st = for_each_item("--shapes", list, shape_item, &c);
    if (st == KILN_OK)
        *n = c.n;
    return st;
}

typedef struct ms_ctx {
    int64_t *out;
    int cap, n;
} ms_ctx;

static kiln_status m_item(const char *item, void *ctx)
{
    ms_ctx *c = ctx;
    int64_t m;
    if (!parse_i64(item, 1, DIM_MAX, &m))
        return kiln_fail(KILN_ERR_INVALID_ARG, "--m: \"%s\" is not a positive token count", item);
    for (int i = 0; i < c->n; i++)
        if (c->out[i] == m)
            return KILN_OK;
    if (c->n == c->cap)
        return kiln_fail(KILN_ERR_INVALID_ARG, "--m: more than %d token counts", c->cap);
    int i = c->n++;
    for (; i > 0 && c->out[i - 1] > m; i--)
        c->out[i] = c->out[i - 1];
    c->out[i] = m;
    return KILN_OK;
}

kiln_status kiln_bench_ms_parse(const char *list, int64_t *out, int cap, int *n)
{
    ms_ctx c = { out, cap, 0 };
    kiln_status st = for_each_item("--m", list, m_item, &c);
    if (st == KILN_OK)
        *n = c.n;
    return st;
}

typedef struct fmt_ctx {
    kiln_format *out;
    int n;
} fmt_ctx;

static kiln_status fmt_push(fmt_ctx *c, kiln_format f)
{
    for (int i = 0; i < c->n; i++)
        if (c->out[i] == f)
            return KILN_OK;
    c->out[c->n++] = f;
    return KILN_OK;
}

static kiln_status fmt_item(const char *item, void *ctx)
{
    fmt_ctx *c = ctx;
    if (!strcmp(item, "all")) {
        for (int f = 0; f < KILN_FMT_COUNT; f++)
            fmt_push(c, (kiln_format)f);
        return KILN_OK;
    }
    kiln_format f;
    if (kiln_format_from_name(item, &f) != KILN_OK) {
        char names[512] = "";
        for (int i = 0; i < KILN_FMT_COUNT; i++) {
            size_t len = strlen(names);
            snprintf(names + len, sizeof names - len, "%s%s", i ? ", " : "",
                     kiln_format_get((kiln_format)i)->name);
        }
        return kiln_fail(KILN_ERR_INVALID_ARG, "--formats: \"%s\" is not a kiln format (%s, all)",
                         item, names);
    }
    return fmt_push(c, f);
}

kiln_status kiln_bench_formats_parse(const char *list, kiln_format *out, int *n)
{
    fmt_ctx c = { out, 0 };
    kiln_status st = for_each_item("--formats", list, fmt_item, &c);
    if (st == KILN_OK)
        *n = c.n;
    return st;
}

/* ------------------------------------------------------------ options */

typedef kiln_status (*opt_fn)(kiln_bench_options *o, const char *name, const char *value);

static kiln_status bad_value(const char *name, const char *value, const char *want)
{
    return kiln_fail(KILN_ERR_INVALID_ARG, "%s: \"%s\" is not %s", name, value, want);
}

#define INT_OPT(fn, field, lo, hi, want)                                                    \
    static kiln_status fn(kiln_bench_options *o, const char *name, const char *value)       \
    {                                                                                       \
        int64_t v;                                                                          \
        if (!parse_i64(value, lo, hi, &v))                                                  \
            return bad_value(name, value, want);                                            \
        o->field = (int)v;                                                                  \
        return KILN_OK;                                                                     \
    }
#define F64_OPT(fn, field, lo, hi, want)                                                    \
    static kiln_status fn(kiln_bench_options *o, const char *name, const char *value)       \
    {                                                                                       \
        if (!parse_f64(value, lo, hi, &o->field))                                           \
            return bad_value(name, value, want);                                            \
        return KILN_OK;                                                                     \
    }
#define STR_OPT(fn, field)                                                                  \
    static kiln_status fn(kiln_bench_options *o, const char *name, const char *value)       \
    {                                                                                       \
        if (!*value)                                                                        \
            return bad_value(name, value, "a name");                                        \
        o->field = value;                                                                   \
        return KILN_OK;                                                                     \
    }

INT_OPT(opt_iters, iters, 1, 1000000, "a count from 1 to 1000000")
INT_OPT(opt_reps, reps, 1, 1000, "a count from 1 to 1000")
INT_OPT(opt_warmup, warmup, 0, 1000000, "a count from 0 to 1000000")
INT_OPT(opt_check_rows, check_rows, 2, 4096, "a count from 2 to 4096")
INT_OPT(opt_device, device, 0, 1023, "a device ordinal")
F64_OPT(opt_rep_ms, rep_ms, 0.001, 1e6, "a positive number of milliseconds")
F64_OPT(opt_rotate_mb, rotate_mb, 0, 1e7, "a number of megabytes (0: three times the L2)")
F64_OPT(opt_copy_mb, copy_mb, 1, 1e6, "a number of megabytes from 1")
F64_OPT(opt_peak_bf16, peak_bf16, 0, 1e6, "a TFLOP/s figure")
F64_OPT(opt_peak_fp8, peak_fp8, 0, 1e6, "a TFLOP/s figure")
STR_OPT(opt_json, json)
STR_OPT(opt_plot, plot)
STR_OPT(opt_cache, cache)
STR_OPT(opt_backend, backend)

static kiln_status opt_seed(kiln_bench_options *o, const char *name, const char *value)
{
    int64_t v;
    if (!parse_i64(value, 0, INT64_MAX, &v))
        return bad_value(name, value, "a non-negative integer");
    o->seed = (uint64_t)v;
    return KILN_OK;
}

static kiln_status opt_shapes(kiln_bench_options *o, const char *name, const char *value)
{
    (void)name;
    return kiln_bench_shapes_parse(value, o->shapes, KILN_BENCH_MAX_SHAPES, &o->n_shapes);
}

static kiln_status opt_m(kiln_bench_options *o, const char *name, const char *value)
{
    (void)name;
    return kiln_bench_ms_parse(value, o->ms, KILN_BENCH_MAX_MS, &o->n_ms);
}

static kiln_status opt_formats(kiln_bench_options *o, const char *name, const char *value)
{
    (void)name;
    return kiln_bench_formats_parse(value, o->formats, &o->n_formats);
}

static kiln_status opt_eager(kiln_bench_options *o, const char *name, const char *value)
{
    (void)name;
    (void)value;
    o->eager = 1;
    return KILN_OK;
}

static kiln_status opt_no_peers(kiln_bench_options *o, const char *name, const char *value)
{
    (void)name;
    (void)value;
    o->no_peers = 1;
    return KILN_OK;
}

static kiln_status opt_shape(kiln_bench_options *o, const char *name, const char *value)
{
    (void)name;
    int layers = o->stack.layers;
    kiln_status st = kiln_bench_stack_parse(value, &o->stack);
    if (st == KILN_OK && o->layers_given)
        o->stack.layers = layers;
    return st;
}

static kiln_status opt_layers(kiln_bench_options *o, const char *name, const char *value)
{
    int64_t v;
    if (!parse_i64(value, 1, 100000, &v))
        return bad_value(name, value, "a layer count from 1 to 100000");
    o->stack.layers = (int)v;
    o->layers_given = 1;
    return KILN_OK;
}

INT_OPT(opt_check_layers, check_layers, 1, 100000, "a layer count from 1 to 100000")

static kiln_status opt_help(kiln_bench_options *o, const char *name, const char *value)
{
    (void)name;
    (void)value;
    o->help = 1;
    return KILN_OK;
}

/* The commands an option belongs to. */
enum { GEMM = 1 << KILN_BENCH_GEMM, FFN = 1 << KILN_BENCH_FFN, BOTH = GEMM | FFN };

static const struct {
    const char *name;
    int takes_value;
    opt_fn fn;
    unsigned commands;
} options[] = {
    { "--shapes", 1, opt_shapes, GEMM },      { "--m", 1, opt_m, BOTH },
    { "--formats", 1, opt_formats, BOTH },    { "--json", 1, opt_json, BOTH },
    { "--plot", 1, opt_plot, GEMM },          { "--iters", 1, opt_iters, BOTH },
    { "--rep-ms", 1, opt_rep_ms, BOTH },      { "--reps", 1, opt_reps, BOTH },
    { "--warmup", 1, opt_warmup, BOTH },      { "--rotate-mb", 1, opt_rotate_mb, GEMM },
    { "--copy-mb", 1, opt_copy_mb, BOTH },    { "--check-rows", 1, opt_check_rows, BOTH },
    { "--device", 1, opt_device, BOTH },      { "--cache", 1, opt_cache, BOTH },
    { "--backend", 1, opt_backend, BOTH },    { "--eager", 0, opt_eager, BOTH },
    { "--no-peers", 0, opt_no_peers, BOTH },  { "--peak-bf16", 1, opt_peak_bf16, GEMM },
    { "--peak-fp8", 1, opt_peak_fp8, GEMM },  { "--seed", 1, opt_seed, BOTH },
    { "--shape", 1, opt_shape, FFN },         { "--layers", 1, opt_layers, FFN },
    { "--check-layers", 1, opt_check_layers, FFN },
    { "--help", 0, opt_help, BOTH },          { "-h", 0, opt_help, BOTH },
};

static const char *const command_names[] = { [KILN_BENCH_GEMM] = "gemm",
                                              [KILN_BENCH_FFN] = "ffn" };

static kiln_status defaults(kiln_bench_options *o, kiln_bench_command command)
{
    *o = (kiln_bench_options){
        .command = command, .iters = 200, .reps = 5, .warmup = 20, .rep_ms = 50,
        .copy_mb = 2048, .check_rows = 16, .check_layers = 2, .seed = 1,
    };
    kiln_status st = kiln_bench_shapes_parse("llama8b", o->shapes, KILN_BENCH_MAX_SHAPES,
                                             &o->n_shapes);
    if (st == KILN_OK)
        st = kiln_bench_stack_parse("llama8b", &o->stack);
    if (st == KILN_OK)
        st = kiln_bench_ms_parse(command == KILN_BENCH_FFN ? "1,2,4,8,16,128,512"
                                                           : "1,16,256,4096",
                                 o->ms, KILN_BENCH_MAX_MS, &o->n_ms);
    if (st == KILN_OK)
        st = kiln_bench_formats_parse(command == KILN_BENCH_FFN ? "bf16" : "all", o->formats,
                                      &o->n_formats);
    if (command == KILN_BENCH_FFN)
        o->check_rows = 4;
    return st;
}

static kiln_status parse_one(kiln_bench_options *o, int argc, char *const *argv, int *i)
{
    const char *arg = argv[*i];
    const char *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    for (size_t j = 0; j < KILN_ARRAY_LEN(options); j++) {
        if (strlen(options[j].name) != len || strncmp(options[j].name, arg, len) != 0)
            continue;
        const char *value = NULL;
        if (options[j].takes_value) {
            if (eq)
                value = eq + 1;
            else if (*i + 1 < argc)
                value = argv[++*i];
            else
                return kiln_fail(KILN_ERR_INVALID_ARG, "%s needs a value", options[j].name);
        } else if (eq) {
            return kiln_fail(KILN_ERR_INVALID_ARG, "%s takes no value", options[j].name);
        }
        if (!(options[j].commands & (1u << o->command)))
            return kiln_fail(KILN_ERR_INVALID_ARG, "%s is an option of kiln-bench %s, not of %s",
                             options[j].name,
                             command_names[o->command == KILN_BENCH_GEMM ? KILN_BENCH_FFN
                                                                         : KILN_BENCH_GEMM],
                             command_names[o->command]);
        return options[j].fn(o, options[j].name, value);
    }
    return kiln_fail(KILN_ERR_INVALID_ARG, "unknown option \"%s\"", arg);
}

kiln_status kiln_bench_args_parse(int argc, char *const *argv, kiln_bench_options *out)
{
    kiln_bench_options o;
    kiln_status st = defaults(&o, KILN_BENCH_GEMM);
    if (st != KILN_OK)
        return st;
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        o.help = 1;
        *out = o;
        return KILN_OK;
    }
    if (argc < 2)
        return kiln_fail(KILN_ERR_INVALID_ARG, "a command is needed: gemm or ffn");
    if (!strcmp(argv[1], "ffn"))
        st = defaults(&o, KILN_BENCH_FFN);
    else if (strcmp(argv[1], "gemm") != 0)
        return kiln_fail(KILN_ERR_INVALID_ARG, "unknown command \"%s\" (there are: gemm, ffn)",
                         argv[1]);
    for (int i = 2; st == KILN_OK && i < argc; i++)
        st = parse_one(&o, argc, argv, &i);
    if (st != KILN_OK)
        return st;
    if (o.plot && !o.json)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "--plot draws from the JSON report: give --json FILE as well");
    if (o.command == KILN_BENCH_FFN && o.check_layers > o.stack.layers)
        o.check_layers = o.stack.layers;
    *out = o;
    return KILN_OK;
}

void kiln_bench_usage(FILE *f)
{
    fputs(
        "usage: kiln-bench gemm [options]\n"
        "       kiln-bench ffn [options]  (kiln-bench ffn --help)\n"
        "       kiln-bench --help\n"
        "\n"
        "Times kiln's kernel for each weight format against cuBLAS BF16 and cuBLASLt FP8\n"
        "(per-tensor, and 128x128 weight / 1x128 activation block scales where the library\n"
        "offers it on the device), same shapes, same run, one GPU. Before timing, each\n"
        "kiln kernel's output is compared on sampled rows with a float64 CPU reference\n"
        "computed from the dequantized weights; a kernel that fails is reported FAIL and\n"
        "not timed. Each weight is one quantized tile of 384 random rows repeated down\n"
        "its N rows: quantizing whole weights with the CPU reference takes minutes.\n"
        "A timed CUDA graph runs a chain of at least 8 GEMMs cycling through the weight\n"
        "copies (--rotate-mb), as a decode step's linears follow one another; on sm_90\n"
        "kiln's decode kernels start while the one before drains (KILN_SERIAL=1 turns\n"
        "that off).\n"
        "\n"
        "  --shapes LIST    presets llama8b and llama70b (their qkv, o, gate_up, down and\n"
        "                   head linears) or NxK pairs, N outputs by K inputs [llama8b]\n"
        "  --m LIST         token counts M [1,16,256,4096]\n"
        "  --formats LIST   kiln weight formats, or all [all]\n"
        "  --json FILE      write every row and the run's facts as JSON\n"
        "  --plot FILE      after writing --json, draw FILE (PNG) with bench/plot.py, which\n"
        "                   needs python3 and matplotlib; the same as running\n"
        "                   python3 bench/plot.py JSON -o FILE\n"
        "  --iters N        at most N GEMMs per repetition [200]\n"
        "  --rep-ms T       no more GEMMs in a repetition than fit in T ms [50]\n"
        "  --reps N         repetitions; the median is reported [5]\n"
        "  --warmup N       GEMMs run before timing [20]\n"
        "  --rotate-mb MB   weight megabytes cycled through so that consecutive GEMMs read\n"
        "                   different copies from DRAM [three times the L2]\n"
        "  --copy-mb MB     size of the device-to-device copy that measures the bandwidth\n"
        "                   ceiling [2048]\n"
        "  --check-rows N   output rows (every column) checked per kernel [16]\n"
        "  --device N       CUDA device [0]\n"
        "  --cache PATH     kiln's writable kernel cache [$KILN_CACHE or the default]\n"
        "  --backend NAME   prefer this kiln backend where it can take the linear\n"
        "  --eager          launch kernels one by one instead of replaying CUDA graphs,\n"
        "                   for kiln and the peers alike\n"
        "  --no-peers       time kiln only\n"
        "  --peak-bf16 T    BF16 TFLOP/s line drawn by --plot [the best cuBLAS BF16 row]\n"
        "  --peak-fp8 T     FP8 TFLOP/s line drawn by --plot [the best cuBLASLt FP8 row]\n"
        "  --seed N         seed of the random weights and activations [1]\n"
        "  --help           this text\n"
        "\n"
        "Columns: us is the median time of one GEMM; TB/s counts the weight with its\n"
        "scales, the activations and the BF16 output once each; TFLOP/s is 2*M*N*K over\n"
        "the time; %copy is TB/s over the measured device-to-device copy bandwidth (read +\n"
        "write); xbf16 and xfp8 are the cuBLAS BF16 and cuBLASLt FP8 per-tensor times over\n"
        "kiln's (above 1: kiln is faster). kiln reads BF16 activations and quantizes them\n"
        "inside its graph where its kernel wants FP8; the FP8 peers are handed activations\n"
        "already in FP8.\n"
        "\n"
        "Exit status: 0 when every row ran and passed its check, 1 when a check failed or\n"
        "something went wrong, 2 for bad arguments.\n",
        f);
}

void kiln_bench_ffn_usage(FILE *f)
{
    fputs(
        "usage: kiln-bench ffn [options]\n"
        "\n"
        "Times a stack of FFN layers, x + down(silu(gate(rms(x))) * up(rms(x))) each,\n"
        "through kiln in each weight format and, in the same run, through a chain of\n"
        "cuBLAS BF16 GEMMs doing the same math (gate and up as one GEMM, the residual\n"
        "added by the down GEMM, the norm and silu*mul as simple kernels of the bench),\n"
        "captured in one CUDA graph. A row is one step of the whole stack at M tokens:\n"
        "kiln replays its session's graph of the bucket, as `kiln run` does. Each layer\n"
        "reads its own device copy of the weights (one quantized tile repeated down the\n"
        "rows, as in kiln-bench gemm). Before timing, the first --check-layers layers\n"
        "run on the GPU at M tokens and --check-rows of their output rows are compared\n"
        "with kiln's CPU executor: a run that differs by more than the activations'\n"
        "tolerance (2^-6 of the largest output for BF16 activations, 2^-3 where a\n"
        "kernel quantizes them to FP8) is reported FAIL and not timed.\n"
        "\n"
        "  --shape NAME       llama8b (d 4096, f 14336, 32 layers) or llama70b (d 8192,\n"
        "                     f 28672, 80 layers) [llama8b]\n"
        "  --layers N         layers of the stack [the shape's]\n"
        "  --m LIST           token counts M [1,2,4,8,16,128,512]\n"
        "  --formats LIST     kiln weight formats, or all [bf16]\n"
        "  --json FILE        write every row and the run's facts as JSON\n"
        "  --iters N          at most N steps per repetition [200]\n"
        "  --rep-ms T         no more steps in a repetition than fit in T ms [50]\n"
        "  --reps N           repetitions; the median is reported [5]\n"
        "  --warmup N         steps run before timing [20]\n"
        "  --copy-mb MB       size of the device-to-device copy that measures the\n"
        "                     bandwidth ceiling [2048]\n"
        "  --check-layers N   layers the check runs [2]\n"
        "  --check-rows N     output rows compared with the CPU executor [4]\n"
        "  --device N         CUDA device [0]\n"
        "  --cache PATH       kiln's writable kernel cache [$KILN_CACHE or the default]\n"
        "  --backend NAME     prefer this kiln backend where it can take a linear\n"
        "  --eager            launch kernels one by one instead of replaying CUDA graphs,\n"
        "                     for kiln and the peer alike\n"
        "  --no-peers         time kiln only\n"
        "  --seed N           seed of the random weights and activations [1]\n"
        "  --help             this text\n"
        "\n"
        "Columns: us is the median time of one step; TB/s counts every layer's weights\n"
        "with their scales and the step's BF16 input and output once; TFLOP/s is\n"
        "6*M*d*f per layer over the time; %copy is TB/s over the measured device-to-\n"
        "device copy bandwidth (read + write), the share of the weight-streaming\n"
        "roofline; xbf16 is the cuBLAS BF16 chain's time over kiln's (above 1: kiln is\n"
        "faster), xkbf16 kiln's BF16 stack's time over the row's (BF16 runs first\n"
        "when --formats names it). The backend column names the backend of the gate\n"
        "linear.\n"
        "\n"
        "Exit status: 0 when every row ran and passed its check, 1 when a check failed or\n"
        "something went wrong, 2 for bad arguments.\n",
        f);
}
