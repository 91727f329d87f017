#include "cli.h"

#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The demo: a stack of FFN blocks, x + down(silu(gate(rms(x))) * up(rms(x))),
 * one weight format per layer so one run touches the main families, then a
 * final RMS norm. Widths are multiples of 256 so every format's block fits. */
enum { DEMO_WIDTH = 512, DEMO_FFN = 1536 };

static const kiln_format demo_formats[] = {
    KILN_FMT_BF16, KILN_FMT_FP8_CHANNEL, KILN_FMT_FP8_BLOCK,
    KILN_FMT_NVFP4, KILN_FMT_MXFP4, KILN_FMT_Q4_K,
};
enum { DEMO_LAYERS = sizeof demo_formats / sizeof demo_formats[0] };

struct cli_demo {
    kiln_graph *g;
    void *bufs[DEMO_LAYERS * 3 * 2 + DEMO_LAYERS + 1]; /* data, scale per weight; norms */
    int n_bufs;
    char desc[DEMO_LAYERS][64];
};

/* splitmix64: fixed seed, so the demo's numbers are the same everywhere. */
static uint64_t demo_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-a, a). A uniform spread keeps the checksum free of libm
 * differences (no log/cos), so it is bit-stable across machines. */
static float demo_uniform(uint64_t *s, float a)
{
    return a * (float)((double)(demo_next(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static void *demo_keep(cli_demo *d, size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (p)
        d->bufs[d->n_bufs++] = p;
    return p;
}

static kiln_status demo_weight(cli_demo *d, uint64_t *seed, kiln_format fmt, const char *name,
                               int64_t n, int64_t k, kiln_tensor **out)
{
    size_t data_bytes, scale_bytes;
    kiln_status st = kiln_format_data_bytes(fmt, n, k, &data_bytes);
    if (st == KILN_OK)
        st = kiln_format_scale_bytes(fmt, n, k, &scale_bytes);
    if (st != KILN_OK)
        return st;
    float *src = malloc((size_t)(n * k) * sizeof *src);
    kiln_qtensor q = { .format = fmt, .n = n, .k = k };
    q.data = demo_keep(d, data_bytes);
    q.scale = scale_bytes ? demo_keep(d, scale_bytes) : NULL;
    if (!src || !q.data || (scale_bytes && !q.scale)) {
        free(src);
        return cli_error(KILN_ERR_NOMEM, "demo weight %s", name);
    }
    float a = 1.7320508f / sqrtf((float)k); /* unit variance of the output */
    for (int64_t i = 0; i < n * k; i++)
        src[i] = demo_uniform(seed, a);
    st = kiln_quantize(src, &q);
    free(src);
    if (st == KILN_OK)
        st = kiln_graph_weight(d->g, name, &q, out);
    return st;
}

static kiln_status demo_norm(cli_demo *d, uint64_t *seed, const char *name, kiln_tensor **out)
{
    float *w = demo_keep(d, DEMO_WIDTH * sizeof *w);
    if (!w)
        return cli_error(KILN_ERR_NOMEM, "demo norm %s", name);
    for (int i = 0; i < DEMO_WIDTH; i++)
        w[i] = 1.0f + demo_uniform(seed, 0.1f);
    return kiln_graph_param(d->g, name, DEMO_WIDTH, w, out);
}

static kiln_status demo_layer(cli_demo *d, uint64_t *seed, int l, kiln_tensor *x, kiln_tensor **out)
{
    kiln_format fmt = demo_formats[l];
    char n[6][64];
    kiln_tensor *norm_w, *gate_w, *up_w, *down_w, *h, *gate, *up, *act, *prod, *down;
    snprintf(n[0], 64, "blk.%d.ffn_norm.weight", l);
    snprintf(n[1], 64, "blk.%d.ffn_gate.weight", l);
    snprintf(n[2], 64, "blk.%d.ffn_up.weight", l);
    snprintf(n[3], 64, "blk.%d.ffn_down.weight", l);
    kiln_status st;
    if ((st = demo_norm(d, seed, n[0], &norm_w)) ||
        (st = demo_weight(d, seed, fmt, n[1], DEMO_FFN, DEMO_WIDTH, &gate_w)) ||
        (st = demo_weight(d, seed, fmt, n[2], DEMO_FFN, DEMO_WIDTH, &up_w)) ||
        (st = demo_weight(d, seed, fmt, n[3], DEMO_WIDTH, DEMO_FFN, &down_w)))
        return st;
    snprintf(n[0], 64, "blk.%d.ffn_norm", l);
    snprintf(n[1], 64, "blk.%d.ffn_gate", l);
    snprintf(n[2], 64, "blk.%d.ffn_up", l);
    snprintf(n[3], 64, "blk.%d.ffn_act", l);
    snprintf(n[4], 64, "blk.%d.ffn_down", l);
    snprintf(n[5], 64, "blk.%d.ffn_out", l);
    if ((st = kiln_graph_rms_norm(d->g, n[0], x, norm_w, 1e-5f, &h)) ||
        (st = kiln_graph_linear(d->g, n[1], h, gate_w, NULL, &gate)) ||
        (st = kiln_graph_linear(d->g, n[2], h, up_w, NULL, &up)) ||
        (st = kiln_graph_silu(d->g, NULL, gate, &act)) ||
        (st = kiln_graph_mul(d->g, n[3], act, up, &prod)) ||
        (st = kiln_graph_linear(d->g, n[4], prod, down_w, NULL, &down)) ||
        (st = kiln_graph_add(d->g, n[5], x, down, out)))
        return st;
    snprintf(d->desc[l], sizeof d->desc[l], "%s", kiln_format_get(fmt)->name);
    return KILN_OK;
}

kiln_status cli_demo_create(cli_demo **out)
{
    cli_demo *d = calloc(1, sizeof *d);
    if (!d)
        return cli_error(KILN_ERR_NOMEM, "demo");
    uint64_t seed = 0x6b696c6e; /* fixed: the demo's numbers never change */
    kiln_tensor *x, *norm_w;
    kiln_status st = kiln_graph_create(&d->g);
    if (st == KILN_OK)
        st = kiln_graph_input(d->g, "x", DEMO_WIDTH, &x);
    for (int l = 0; st == KILN_OK && l < DEMO_LAYERS; l++)
        st = demo_layer(d, &seed, l, x, &x);
    if (st == KILN_OK)
        st = demo_norm(d, &seed, "output_norm.weight", &norm_w);
    if (st == KILN_OK)
        st = kiln_graph_rms_norm(d->g, "output_norm", x, norm_w, 1e-5f, &x);
    if (st == KILN_OK)
        st = kiln_graph_output(d->g, x);
    if (st != KILN_OK) {
        cli_demo_destroy(d);
        return st;
    }
    *out = d;
    return KILN_OK;
}

void cli_demo_destroy(cli_demo *d)
{
    if (!d)
        return;
    kiln_graph_destroy(d->g);
    for (int i = 0; i < d->n_bufs; i++)
        free(d->bufs[i]);
    free(d);
}

kiln_graph *cli_demo_graph(cli_demo *d) { return d->g; }
int cli_demo_n_layers(const cli_demo *d) { (void)d; return DEMO_LAYERS; }
const char *cli_demo_layer_desc(const cli_demo *d, int i) { return d->desc[i]; }
int64_t cli_demo_width(const cli_demo *d) { (void)d; return DEMO_WIDTH; }

/* ------------------------------------------------------------ kiln demo */

static void help(FILE *out)
{
    fprintf(out,
            "usage: kiln demo [--tokens LIST] [--steps S] [--threads N]\n"
            "\n"
            "Builds the built-in demo model (%d FFN layers of width %d and hidden size %d,\n"
            "one weight format per layer, weights quantized from a fixed seed) and runs it\n"
            "on the CPU executor. Prints each layer's format, then per token count the\n"
            "output checksum (sum and mean |y|) and the median time of S runs.\n"
            "\n"
            "  --tokens LIST   token counts to run, comma-separated (default 1,16,128)\n"
            "  --steps S       timed runs per token count (default 3)\n"
            "  --threads N     CPU threads (default: one per core)\n",
            DEMO_LAYERS, DEMO_WIDTH, DEMO_FFN);
}

static int run(int argc, char **argv)
{
    static const struct option opts[] = {
        { "tokens", required_argument, NULL, 't' },
        { "steps", required_argument, NULL, 's' },
        { "threads", required_argument, NULL, 'j' },
        { 0 },
    };
    int64_t tokens[64] = { 1, 16, 128 };
    int n_tokens = 3, steps = 3, threads = 0, c;
    long long v;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        switch (c) {
        case 't':
            if (cli_parse_tokens(optarg, tokens, 64, &n_tokens))
                return cli_usage(&cli_cmd_demo, "bad --tokens '%s' (want e.g. 1,16,128)", optarg);
            break;
        case 's':
            if (cli_parse_int(optarg, 1, 10000, &v))
                return cli_usage(&cli_cmd_demo, "bad --steps '%s'", optarg);
            steps = (int)v;
            break;
        case 'j':
            if (cli_parse_int(optarg, 1, 1024, &v))
                return cli_usage(&cli_cmd_demo, "bad --threads '%s'", optarg);
            threads = (int)v;
            break;
        case ':':
            return cli_usage(&cli_cmd_demo, "%s needs a value", argv[optind - 1]);
        default:
            return cli_usage(&cli_cmd_demo, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return cli_usage(&cli_cmd_demo, "unexpected argument '%s'", argv[optind]);

    cli_demo *d;
    kiln_status st = cli_demo_create(&d);
    if (st != KILN_OK)
        return cli_fail(st, "building the demo model");
    kiln_cpu *cpu;
    kiln_cpu_options o = { .threads = threads };
    st = kiln_cpu_create(cli_demo_graph(d), &o, &cpu);
    if (st != KILN_OK) {
        cli_demo_destroy(d);
        return cli_fail(st, "preparing the CPU executor");
    }
    printf("demo: %d FFN layers, width %d, hidden %d, CPU executor (%d threads)\n", DEMO_LAYERS,
           DEMO_WIDTH, DEMO_FFN, kiln_cpu_threads(cpu));
    printf("%-6s %-12s %s\n", "layer", "format", "linears (N x K)");
    for (int l = 0; l < DEMO_LAYERS; l++)
        printf("%-6d %-12s gate, up %dx%d; down %dx%d\n", l, d->desc[l], DEMO_FFN, DEMO_WIDTH,
               DEMO_WIDTH, DEMO_FFN);
    putchar('\n');
    cli_exec e = { .cpu = cpu };
    int rc =
        cli_run_table("demo", &e, cli_demo_graph(d), tokens, n_tokens, steps, NULL, NULL);
    kiln_cpu_destroy(cpu);
    cli_demo_destroy(d);
    return rc;
}

const cli_command cli_cmd_demo = {
    .name = "demo",
    .summary = "build the built-in demo model and run it on the CPU",
    .run = run,
    .help = help,
};
