/* kiln-bench's GPU-free core: the command line, shape presets, byte and flop
 * accounting, the timing arithmetic, tiled weights, the CPU reference check
 * (against kiln's CPU executor), the table and the JSON report. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "codegen_util.h"
#include "testutil.h"

static kiln_bench_rng rng_new(uint64_t salt)
{
    return (kiln_bench_rng){ kt_seed() ^ (salt * 0x9E3779B97F4A7C15ull) };
}

/* ------------------------------------------------------------ options */

/* The options point into argv, as they do into main's: the words live on
 * until the next call. */
static kiln_status parse(kiln_bench_options *o, const char *line)
{
    static char buf[2048];
    static char *argv[64];
    int argc = 0;
    snprintf(buf, sizeof buf, "%s", line);
    argv[argc++] = "kiln-bench";
    for (char *t = strtok(buf, " "); t && argc < 63; t = strtok(NULL, " "))
        argv[argc++] = t;
    argv[argc] = NULL;
    return kiln_bench_args_parse(argc, argv, o);
}

static void refused(const char *line, const char *message)
{
    kiln_bench_options o;
    kiln_clear_error();
    cr_assert_eq(parse(&o, line), KILN_ERR_INVALID_ARG, "\"%s\" was taken", line);
    cr_assert(strstr(kiln_last_error(), message), "\"%s\": %s", line, kiln_last_error());
}

Test(bench_args, defaults)
{
    kiln_bench_options o;
    cr_assert_eq(parse(&o, "gemm"), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(o.n_shapes, 5);
    cr_assert_str_eq(o.shapes[0].name, "llama8b.qkv");
    cr_assert_eq(o.n_ms, 4);
    int64_t ms[] = { 1, 16, 256, 4096 };
    for (int i = 0; i < 4; i++)
        cr_assert_eq(o.ms[i], ms[i]);
    cr_assert_eq(o.n_formats, KILN_FMT_COUNT);
    for (int f = 0; f < KILN_FMT_COUNT; f++)
        cr_assert_eq(o.formats[f], (kiln_format)f);
    cr_assert_eq(o.iters, 200);
    cr_assert_eq(o.reps, 5);
    cr_assert_eq(o.warmup, 20);
    cr_assert_eq(o.check_rows, 16);
    cr_assert_eq(o.rotate_mb, 0);
    cr_assert_eq(o.copy_mb, 2048);
    cr_assert_null(o.json);
    cr_assert_null(o.plot);
    cr_assert_not(o.help);
    cr_assert_not(o.eager);
    cr_assert_not(o.no_peers);
}

Test(bench_args, presets_expand_to_their_linears)
{
    kiln_bench_options o;
    cr_assert_eq(parse(&o, "gemm --shapes llama8b,llama70b"), KILN_OK, "%s", kiln_last_error());
    static const struct {
        const char *name;
        int64_t n, k;
    } want[] = {
        { "llama8b.qkv", 6144, 4096 },      { "llama8b.o", 4096, 4096 },
        { "llama8b.gate_up", 28672, 4096 }, { "llama8b.down", 4096, 14336 },
        { "llama8b.head", 128256, 4096 },   { "llama70b.qkv", 10240, 8192 },
        { "llama70b.o", 8192, 8192 },       { "llama70b.gate_up", 57344, 8192 },
        { "llama70b.down", 8192, 28672 },   { "llama70b.head", 128256, 8192 },
    };
    cr_assert_eq(o.n_shapes, 10);
    for (int i = 0; i < 10; i++) {
        cr_assert_str_eq(o.shapes[i].name, want[i].name);
        cr_assert_eq(o.shapes[i].n, want[i].n, "%s", want[i].name);
        cr_assert_eq(o.shapes[i].k, want[i].k, "%s", want[i].name);
    }
}

Test(bench_args, explicit_shapes)
{
    kiln_bench_shape s[8];
    int n = 0;
    cr_assert_eq(kiln_bench_shapes_parse("28672x4096,4096X14336,llama8b,1x1", s, 8, &n), KILN_OK,
                 "%s", kiln_last_error());
    cr_assert_eq(n, 8);
    cr_assert_str_eq(s[0].name, "28672x4096");
    cr_assert_eq(s[0].n, 28672);
    cr_assert_eq(s[0].k, 4096);
    cr_assert_str_eq(s[1].name, "4096x14336");
    cr_assert_eq(s[1].n, 4096);
    cr_assert_eq(s[1].k, 14336);
    cr_assert_str_eq(s[2].name, "llama8b.qkv");
    cr_assert_eq(s[7].n, 1);
    cr_assert_eq(s[7].k, 1);
    cr_assert_eq(kiln_bench_shapes_parse("llama8b,llama8b", s, 8, &n), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "more than 8 shapes"), "%s", kiln_last_error());
}

Test(bench_args, bad_shapes_are_refused)
{
    const char *bad[] = { "12x",   "x5",    "0x5",       "5x0",        "axb",      "5x-3",
                          "5x3e3", "llama9b", "5x3000000000", "12", "5x5x5", "1x2,,3x4",
                          "1x2,",  "99999999999999999999999999999999x4" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char line[128];
        snprintf(line, sizeof line, "gemm --shapes %s", bad[i]);
        refused(line, "--shapes");
    }
    refused("gemm --shapes llama9b", "neither a preset (llama8b, llama70b) nor NxK");
    refused("gemm --shapes 1x2,,3x4", "an empty item");
    char line[1200] = "gemm --shapes ";
    for (int i = 0; i < 13; i++)
        strcat(line, i ? ",llama8b" : "llama8b");
    refused(line, "more than 64 shapes");
    char longlist[1100];
    memset(longlist, '1', sizeof longlist - 1);
    longlist[sizeof longlist - 1] = '\0';
    kiln_bench_shape s[4];
    int n;
    cr_assert_eq(kiln_bench_shapes_parse(longlist, s, 4, &n), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "longer than"), "%s", kiln_last_error());
    cr_assert_eq(kiln_bench_shapes_parse("", s, 4, &n), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "an empty list"), "%s", kiln_last_error());
}

Test(bench_args, token_counts_come_back_sorted_and_distinct)
{
    int64_t ms[KILN_BENCH_MAX_MS];
    int n;
    cr_assert_eq(kiln_bench_ms_parse("4096,1,16,1,8192,2", ms, KILN_BENCH_MAX_MS, &n), KILN_OK);
    int64_t want[] = { 1, 2, 16, 4096, 8192 };
    cr_assert_eq(n, 5);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(ms[i], want[i]);
    refused("gemm --m 0", "\"0\" is not a positive token count");
    refused("gemm --m -4", "--m");
    refused("gemm --m 1.5", "--m");
    refused("gemm --m 16,abc", "\"abc\"");
    refused("gemm --m 4294967296", "--m");
    char line[512] = "gemm --m ";
    for (int i = 1; i <= KILN_BENCH_MAX_MS + 1; i++) {
        char item[16];
        snprintf(item, sizeof item, i > 1 ? ",%d" : "%d", i);
        strcat(line, item);
    }
    refused(line, "more than 32 token counts");
}

Test(bench_args, formats)
{
    kiln_format f[KILN_FMT_COUNT];
    int n;
    cr_assert_eq(kiln_bench_formats_parse("q4_k,bf16,fp8,q4_k,fp8_block", f, &n), KILN_OK);
    cr_assert_eq(n, 4);
    cr_assert_eq(f[0], KILN_FMT_Q4_K);
    cr_assert_eq(f[1], KILN_FMT_BF16);
    cr_assert_eq(f[2], KILN_FMT_FP8_TENSOR);
    cr_assert_eq(f[3], KILN_FMT_FP8_BLOCK);
    cr_assert_eq(kiln_bench_formats_parse("nvfp4,all", f, &n), KILN_OK);
    cr_assert_eq(n, KILN_FMT_COUNT);
    cr_assert_eq(f[0], KILN_FMT_NVFP4);
    refused("gemm --formats q4_0,int4", "\"int4\" is not a kiln format (f32, f16, bf16");
    refused("gemm --formats q4_0,int4", "int8_group_zp, all)");
}

Test(bench_args, every_option)
{
    kiln_bench_options o;
    cr_assert_eq(parse(&o, "gemm --shapes 64x128 --m=8,1 --formats q8_0 --json r.json "
                           "--plot r.png --iters 7 --rep-ms 2.5 --reps 3 --warmup 0 "
                           "--rotate-mb 75 --copy-mb 64 --check-rows 4 --device 1 --cache c.kiln "
                           "--backend simt --eager --no-peers --peak-bf16 800 --peak-fp8=1300 "
                           "--seed 42"),
                 KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(o.n_shapes, 1);
    cr_assert_eq(o.n_ms, 2);
    cr_assert_eq(o.ms[0], 1);
    cr_assert_eq(o.ms[1], 8);
    cr_assert_eq(o.n_formats, 1);
    cr_assert_eq(o.formats[0], KILN_FMT_Q8_0);
    cr_assert_str_eq(o.json, "r.json");
    cr_assert_str_eq(o.plot, "r.png");
    cr_assert_eq(o.iters, 7);
    cr_assert_float_eq(o.rep_ms, 2.5, 1e-12);
    cr_assert_eq(o.reps, 3);
    cr_assert_eq(o.warmup, 0);
    cr_assert_float_eq(o.rotate_mb, 75, 1e-12);
    cr_assert_float_eq(o.copy_mb, 64, 1e-12);
    cr_assert_eq(o.check_rows, 4);
    cr_assert_eq(o.device, 1);
    cr_assert_str_eq(o.cache, "c.kiln");
    cr_assert_str_eq(o.backend, "simt");
    cr_assert(o.eager);
    cr_assert(o.no_peers);
    cr_assert_float_eq(o.peak_bf16, 800, 1e-12);
    cr_assert_float_eq(o.peak_fp8, 1300, 1e-12);
    cr_assert_eq(o.seed, 42);
}

Test(bench_args, bad_options_are_refused)
{
    refused("", "a command is needed: gemm");
    refused("gem", "unknown command \"gem\"");
    refused("gemm --frobnicate", "unknown option \"--frobnicate\"");
    refused("gemm --shapesx 1x1", "unknown option");
    refused("gemm --iters", "--iters needs a value");
    refused("gemm --eager=1", "--eager takes no value");
    refused("gemm --iters 0", "--iters: \"0\" is not a count from 1");
    refused("gemm --iters 12abc", "--iters");
    refused("gemm --reps 1001", "--reps");
    refused("gemm --warmup -1", "--warmup");
    refused("gemm --check-rows 1", "--check-rows");
    refused("gemm --check-rows 5000", "--check-rows");
    refused("gemm --device -1", "--device");
    refused("gemm --rep-ms 0", "--rep-ms");
    refused("gemm --rep-ms nan", "--rep-ms");
    refused("gemm --rotate-mb -5", "--rotate-mb");
    refused("gemm --copy-mb 0.5", "--copy-mb");
    refused("gemm --peak-fp8 inf", "--peak-fp8");
    refused("gemm --peak-bf16 x", "--peak-bf16");
    refused("gemm --seed -3", "--seed");
    refused("gemm --json=", "--json: \"\" is not a name");
    refused("gemm --plot p.png", "give --json FILE as well");
}

Test(bench_args, help)
{
    kiln_bench_options o;
    cr_assert_eq(parse(&o, "--help"), KILN_OK);
    cr_assert(o.help);
    cr_assert_eq(parse(&o, "-h"), KILN_OK);
    cr_assert(o.help);
    cr_assert_eq(parse(&o, "gemm --m 4 --help"), KILN_OK);
    cr_assert(o.help);
}

/* A command's usage text; every option it names parses for the command.
 * Returns the text (free it) and the count of options named in *seen. */
static char *usage_of(void (*usage)(FILE *), const char *command, int *seen)
{
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    usage(f);
    fclose(f);
    *seen = 0;
    for (char *p = strstr(text, "--"); p; p = strstr(p + 2, "--")) {
        char name[32];
        size_t n = strspn(p, "-abcdefghijklmnopqrstuvwxyz0123456789");
        if (n < 3 || n >= sizeof name)
            continue;
        memcpy(name, p, n);
        name[n] = '\0';
        char line[64];
        snprintf(line, sizeof line, "%s %s", command, name);
        kiln_bench_options o;
        kiln_clear_error();
        kiln_status st = parse(&o, line);
        cr_assert(st == KILN_OK || strstr(kiln_last_error(), "needs a value"),
                  "%s usage names %s: %s", command, name, kiln_last_error());
        ++*seen;
    }
    return text;
}

/* Every option the usage names is one the parser knows, and the reverse:
 * each option parsed in every_option appears in the text. */
Test(bench_args, usage_tells_the_truth)
{
    int seen;
    char *text = usage_of(kiln_bench_usage, "gemm", &seen);
    const char *all[] = { "--shapes", "--m ", "--formats", "--json", "--plot", "--iters",
                          "--rep-ms", "--reps", "--warmup", "--rotate-mb", "--copy-mb",
                          "--check-rows", "--device", "--cache", "--backend", "--eager",
                          "--no-peers", "--peak-bf16", "--peak-fp8", "--seed", "--help" };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        cr_assert(strstr(text, all[i]), "usage lacks %s", all[i]);
    cr_assert_geq(seen, 21);
    cr_assert(strstr(text, "python3 bench/plot.py"), "the two-step plot is documented");
    free(text);
}

Test(bench_args, ffn_defaults)
{
    kiln_bench_options o;
    cr_assert_eq(parse(&o, "ffn"), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(o.command, KILN_BENCH_FFN);
    cr_assert_str_eq(o.stack.name, "llama8b");
    cr_assert_eq(o.stack.d, 4096);
    cr_assert_eq(o.stack.f, 14336);
    cr_assert_eq(o.stack.layers, 32);
    cr_assert_eq(o.check_layers, 2);
    cr_assert_eq(o.check_rows, 4);
    int64_t ms[] = { 1, 2, 4, 8, 16, 128, 512 };
    cr_assert_eq(o.n_ms, 7);
    for (int i = 0; i < 7; i++)
        cr_assert_eq(o.ms[i], ms[i]);
    cr_assert_eq(o.n_formats, 1);
    cr_assert_eq(o.formats[0], KILN_FMT_BF16);
    cr_assert_eq(parse(&o, "gemm"), KILN_OK);
    cr_assert_eq(o.command, KILN_BENCH_GEMM);
}

Test(bench_args, ffn_options)
{
    kiln_bench_options o;
    cr_assert_eq(parse(&o, "ffn --shape llama70b --layers 3 --check-layers 5 --formats nvfp4,bf16 "
                           "--m 16,1 --check-rows 8 --no-peers --json f.json"),
                 KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(o.stack.d, 8192);
    cr_assert_eq(o.stack.f, 28672);
    cr_assert_eq(o.stack.layers, 3);
    cr_assert_eq(o.check_layers, 3, "the check runs no more layers than the stack has");
    cr_assert_eq(o.n_formats, 2);
    cr_assert_eq(o.ms[0], 1);
    cr_assert_eq(o.check_rows, 8);
    cr_assert(o.no_peers);
    cr_assert_str_eq(o.json, "f.json");
    /* --layers holds whichever side of --shape it is given */
    cr_assert_eq(parse(&o, "ffn --layers 3 --shape llama70b"), KILN_OK);
    cr_assert_eq(o.stack.layers, 3);
    cr_assert_eq(parse(&o, "ffn --shape llama70b"), KILN_OK);
    cr_assert_eq(o.stack.layers, 80);
    cr_assert_eq(parse(&o, "ffn --help"), KILN_OK);
    cr_assert(o.help);
    cr_assert_eq(o.command, KILN_BENCH_FFN);
    refused("ffn --shape llama9b", "is not a stack (llama8b, llama70b)");
    refused("ffn --layers 0", "--layers: \"0\" is not a layer count");
    refused("ffn --check-layers x", "--check-layers");
    refused("ffn --shapes 4x4", "--shapes is an option of kiln-bench gemm, not of ffn");
    refused("ffn --plot a.png", "--plot is an option of kiln-bench gemm");
    refused("gemm --layers 2", "--layers is an option of kiln-bench ffn, not of gemm");
    refused("gemm --shape llama8b", "--shape is an option of kiln-bench ffn");
    refused("ffm", "unknown command \"ffm\" (there are: gemm, ffn)");
}

/* The ffn usage names only options ffn takes, and every one of them. */
Test(bench_args, ffn_usage_tells_the_truth)
{
    int seen;
    char *text = usage_of(kiln_bench_ffn_usage, "ffn", &seen);
    const char *all[] = { "--shape ", "--layers", "--m ", "--formats", "--json", "--iters",
                          "--rep-ms", "--reps", "--warmup", "--copy-mb", "--check-layers",
                          "--check-rows", "--device", "--cache", "--backend", "--eager",
                          "--no-peers", "--seed", "--help" };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        cr_assert(strstr(text, all[i]), "usage lacks %s", all[i]);
    cr_assert_geq(seen, 19);
    free(text);
}

/* --------------------------------------------------------- accounting */

Test(bench_account, stack_bytes_and_flops)
{
    kiln_bench_stack_shape s;
    cr_assert_eq(kiln_bench_stack_parse("llama8b", &s), KILN_OK);
    double bytes;
    cr_assert_eq(kiln_bench_stack_bytes(KILN_FMT_BF16, &s, 1, &bytes), KILN_OK);
    /* 32 layers of three 4096 x 14336 BF16 weights, one token in and out */
    cr_assert_float_eq(bytes, 32.0 * 3 * 4096 * 14336 * 2 + 2 * 2 * 4096, 0.5);
    cr_assert_float_eq(kiln_bench_stack_flops(&s, 16), 6.0 * 16 * 4096 * 14336 * 32, 1);
    double fp8;
    cr_assert_eq(kiln_bench_stack_bytes(KILN_FMT_FP8_TENSOR, &s, 512, &fp8), KILN_OK);
    cr_assert_float_eq(fp8, 32.0 * 3 * (4096.0 * 14336 + 4) + 2 * 2 * 512 * 4096.0, 0.5);
    s.d = 100; /* not a whole Q4_K super-block */
    cr_assert_eq(kiln_bench_stack_bytes(KILN_FMT_Q4_K, &s, 1, &bytes), KILN_ERR_SHAPE);
}

Test(bench_account, kiln_bytes)
{
    kiln_bench_bytes b;
    cr_assert_eq(kiln_bench_kiln_bytes(KILN_FMT_BF16, 4096, 4096, 16, &b), KILN_OK);
    cr_assert_float_eq(b.weight, 2.0 * 4096 * 4096, 0.5);
    cr_assert_float_eq(b.act, 2.0 * 16 * 4096, 0.5);
    cr_assert_float_eq(b.out, 2.0 * 16 * 4096, 0.5);
    /* Q4_0: 18 bytes per 32 values, scales inline */
    cr_assert_eq(kiln_bench_kiln_bytes(KILN_FMT_Q4_0, 28672, 4096, 1, &b), KILN_OK);
    cr_assert_float_eq(b.weight, 28672.0 * 4096 / 32 * 18, 0.5);
    cr_assert_float_eq(kiln_bench_bytes_total(&b), b.weight + 2.0 * 4096 + 2.0 * 28672, 0.5);
    /* NVFP4: 8 bytes per 16 values, one UE4M3 per 16, one f32 global */
    cr_assert_eq(kiln_bench_kiln_bytes(KILN_FMT_NVFP4, 256, 512, 1, &b), KILN_OK);
    cr_assert_float_eq(b.weight, 256.0 * 512 / 2 + 256.0 * 512 / 16 + 4, 0.5);
    /* FP8 block: one f32 per 128x128 tile, partial tiles included */
    cr_assert_eq(kiln_bench_kiln_bytes(KILN_FMT_FP8_BLOCK, 300, 256, 2, &b), KILN_OK);
    cr_assert_float_eq(b.weight, 300.0 * 256 + 3 * 2 * 4, 0.5);
    cr_assert_eq(kiln_bench_kiln_bytes(KILN_FMT_Q4_K, 64, 100, 1, &b), KILN_ERR_SHAPE);
    cr_assert(strstr(kiln_last_error(), "q4_k"), "%s", kiln_last_error());
}

Test(bench_account, peer_bytes_and_flops)
{
    kiln_bench_bytes b;
    kiln_bench_peer_bytes(KILN_BENCH_PEER_BF16, 6144, 4096, 1, &b);
    cr_assert_float_eq(b.weight, 2.0 * 6144 * 4096, 0.5);
    cr_assert_float_eq(b.act, 2.0 * 4096, 0.5);
    cr_assert_float_eq(b.out, 2.0 * 6144, 0.5);
    kiln_bench_peer_bytes(KILN_BENCH_PEER_FP8, 6144, 4096, 16, &b);
    cr_assert_float_eq(b.weight, 6144.0 * 4096 + 4, 0.5);
    cr_assert_float_eq(b.act, 16.0 * 4096 + 4, 0.5);
    cr_assert_float_eq(b.out, 2.0 * 16 * 6144, 0.5);
    kiln_bench_peer_bytes(KILN_BENCH_PEER_FP8_BLOCK, 4096, 14336, 16, &b);
    cr_assert_float_eq(b.weight, 4096.0 * 14336 + 32.0 * 112 * 4, 0.5);
    cr_assert_float_eq(b.act, 16.0 * 14336 + 16.0 * 112 * 4, 0.5);
    cr_assert_float_eq(kiln_bench_flops(28672, 4096, 4096), 2.0 * 28672 * 4096 * 4096, 1);
    /* the yardstick from GPU.md: 68.2 µs for BF16 gate_up at M = 1 is 3.45 TB/s */
    kiln_bench_peer_bytes(KILN_BENCH_PEER_BF16, 28672, 4096, 1, &b);
    cr_assert_float_eq(kiln_bench_tbps(kiln_bench_bytes_total(&b), 68.2), 3.445, 0.005);
    cr_assert_float_eq(kiln_bench_tflops(2e12, 1e6), 2.0, 1e-12);
    cr_assert_eq(kiln_bench_tbps(1e9, 0), 0);
    cr_assert_str_eq(kiln_bench_peer_kind(KILN_BENCH_PEER_FP8_BLOCK), "fp8_block");
    cr_assert_str_eq(kiln_bench_peer_label(KILN_BENCH_PEER_BF16), "cuBLAS bf16");
    cr_assert_str_eq(kiln_bench_peer_kind(KILN_BENCH_PEER_COUNT), "?");
    cr_assert_str_eq(kiln_bench_peer_label((kiln_bench_peer)-1), "?");
}

Test(bench_account, rotation_covers_the_budget)
{
    double l2x3 = 150e6;
    cr_assert_eq(kiln_bench_rotation(2.0 * 128256 * 4096, l2x3), 1);
    cr_assert_eq(kiln_bench_rotation(150e6, l2x3), 1);
    cr_assert_eq(kiln_bench_rotation(149e6, l2x3), 2);
    cr_assert_eq(kiln_bench_rotation(4096.0 * 4096 * 4.5 / 8, l2x3), 16);
    cr_assert_eq(kiln_bench_rotation(1000, l2x3), KILN_BENCH_MAX_ROTATION);
    cr_assert_eq(kiln_bench_rotation(0, l2x3), 1);
    cr_assert_eq(kiln_bench_rotation(1e6, 0), 1);
    for (double w = 1e5; w < 1e9; w *= 1.7) {
        int r = kiln_bench_rotation(w, l2x3);
        cr_assert(r == KILN_BENCH_MAX_ROTATION || r * w >= l2x3, "%g bytes: %d copies", w, r);
        cr_assert(r == 1 || (r - 1) * w < l2x3, "%g bytes: %d copies is one too many", w, r);
    }
}

Test(bench_account, chain_cycles_whole_rotations_past_the_minimum)
{
    cr_assert_eq(kiln_bench_chain(1), KILN_BENCH_MIN_CHAIN);
    cr_assert_eq(kiln_bench_chain(0), KILN_BENCH_MIN_CHAIN);
    cr_assert_eq(kiln_bench_chain(3), 9);
    cr_assert_eq(kiln_bench_chain(KILN_BENCH_MAX_ROTATION), KILN_BENCH_MAX_ROTATION);
    for (int r = 1; r <= KILN_BENCH_MAX_ROTATION; r++) {
        int c = kiln_bench_chain(r);
        cr_assert(c % r == 0 && c >= KILN_BENCH_MIN_CHAIN && c - r < KILN_BENCH_MIN_CHAIN,
                  "%d copies: a chain of %d", r, c);
    }
}

Test(bench_account, launches_per_repetition)
{
    /* 10 µs launches of one GEMM: the count bounds it */
    cr_assert_eq(kiln_bench_launches(10, 1, 200, 50), 200);
    /* launches of 16 GEMMs: 200 GEMMs is 13 launches */
    cr_assert_eq(kiln_bench_launches(160, 16, 200, 50), 13);
    /* 1 ms launches: 50 fit in 50 ms */
    cr_assert_eq(kiln_bench_launches(1000, 1, 200, 50), 50);
    /* slower than the whole budget: still one */
    cr_assert_eq(kiln_bench_launches(1e6, 1, 200, 50), 1);
    cr_assert_eq(kiln_bench_launches(0, 4, 10, 50), 3);
    cr_assert_eq(kiln_bench_launches(5, 0, 0, 50), 1);
}

Test(bench_account, median)
{
    double odd[] = { 5, 1, 4, 2, 3 }, even[] = { 8, 2, 6, 4 }, one[] = { 7 };
    cr_assert_eq(kiln_bench_median(odd, 5), 3);
    cr_assert_eq(kiln_bench_median(even, 4), 5);
    cr_assert_eq(kiln_bench_median(one, 1), 7);
    cr_assert_eq(odd[0], 5, "the input is left as it was");
    cr_assert_eq(even[0], 8);
}

typedef struct fake_timer {
    int calls, launches[64];
    double us;
    int fail_at;
} fake_timer;

static kiln_status fake_time(void *ctx, int launches, double *us)
{
    fake_timer *t = ctx;
    t->launches[t->calls++] = launches;
    if (t->calls == t->fail_at)
        return kiln_fail(KILN_ERR_CUDA, "fake launch failure");
    *us = t->us * t->calls;
    return KILN_OK;
}

Test(bench_account, measure_warms_up_and_takes_the_median)
{
    kiln_bench_options o = { .iters = 100, .reps = 3, .warmup = 20, .rep_ms = 50 };
    fake_timer t = { .us = 40 };
    double us;
    cr_assert_eq(kiln_bench_measure(fake_time, &t, 4, &o, &us), KILN_OK);
    /* one launch to estimate, 16 more GEMMs of warm-up (4 launches), then
     * 3 repetitions of 25 launches (100 GEMMs) */
    cr_assert_eq(t.calls, 5);
    cr_assert_eq(t.launches[0], 1);
    cr_assert_eq(t.launches[1], 4);
    cr_assert_eq(t.launches[2], 25);
    cr_assert_eq(t.launches[4], 25);
    /* repetitions measured 120, 160, 200 µs per launch of 4 GEMMs */
    cr_assert_float_eq(us, 40.0, 1e-9);

    o.warmup = 4;
    t = (fake_timer){ .us = 10 };
    cr_assert_eq(kiln_bench_measure(fake_time, &t, 4, &o, &us), KILN_OK);
    cr_assert_eq(t.calls, 4, "the first launch was the whole warm-up");

    t = (fake_timer){ .us = 10, .fail_at = 3 };
    cr_assert_eq(kiln_bench_measure(fake_time, &t, 4, &o, &us), KILN_ERR_CUDA);
    cr_assert_eq(t.calls, 3, "stops at the failure");
    o.reps = 0;
    cr_assert_eq(kiln_bench_measure(fake_time, &t, 4, &o, &us), KILN_ERR_INVALID_ARG);
    o.reps = 3;
    cr_assert_eq(kiln_bench_measure(fake_time, &t, 0, &o, &us), KILN_ERR_INVALID_ARG);
}

/* ------------------------------------------------------------ weights */

Test(bench_weights, rng_is_seeded_and_normal)
{
    kiln_bench_rng a = { 7 }, b = { 7 }, c = { 8 };
    uint64_t x = kiln_bench_rng_next(&a);
    cr_assert_eq(x, kiln_bench_rng_next(&b));
    cr_assert_neq(x, kiln_bench_rng_next(&c));
    kiln_bench_rng r = rng_new(1);
    double s = 0, s2 = 0;
    int n = 200000;
    for (int i = 0; i < n; i++) {
        double v = kiln_bench_rng_normal(&r);
        cr_assert(isfinite(v));
        s += v;
        s2 += v * v;
    }
    cr_assert_float_eq(s / n, 0.0, 0.02);
    cr_assert_float_eq(s2 / n, 1.0, 0.02);
}

/* The full weight dequantizes to the tile, repeated: exactly. */
static void weight_is_the_tile_repeated(kiln_format f, int64_t n, int64_t k, uint64_t salt)
{
    kiln_bench_rng r = rng_new(salt);
    kiln_bench_weight w;
    cr_assert_eq(kiln_bench_weight_make(f, n, k, &r, &w), KILN_OK, "%s", kiln_last_error());
    const char *name = kiln_format_get(f)->name;
    cr_assert_eq(w.tile, n < KILN_BENCH_TILE_ROWS ? n : KILN_BENCH_TILE_ROWS);
    size_t data, scale;
    kiln_format_data_bytes(f, n, k, &data);
    kiln_format_scale_bytes(f, n, k, &scale);
    cr_assert_eq(w.data_bytes, data);
    cr_assert_eq(w.scale_bytes, scale);
    float *full = malloc((size_t)(n * k) * sizeof *full);
    cr_assert_eq(kiln_dequantize(&w.q, full), KILN_OK, "%s", kiln_last_error());
    double mag = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < k; j++) {
            float want = w.ref[(i % w.tile) * k + j];
            cr_assert(full[i * k + j] == want, "%s [%lld, %lld]: row %lld col %lld: %g != %g",
                      name, (long long)n, (long long)k, (long long)i, (long long)j,
                      full[i * k + j], want);
            mag += fabs(want);
        }
    /* N(0, 1/k) values: mean |w| is sqrt(2/pi/k) */
    cr_assert_float_eq(mag / (double)(n * k), sqrt(2.0 / M_PI / (double)k), 0.2 / sqrt((double)k),
                       "%s", name);
    free(full);
    kiln_bench_weight_free(&w);
    cr_assert_null(w.q.data);
}

Test(bench_weights, every_format_repeats_its_tile, .timeout = 300)
{
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        weight_is_the_tile_repeated((kiln_format)f, 1000, 256, 10 + (uint64_t)f);
        weight_is_the_tile_repeated((kiln_format)f, 100, 512, 40 + (uint64_t)f);
    }
    /* block scales: a partial 128-row block at the end */
    weight_is_the_tile_repeated(KILN_FMT_FP8_BLOCK, 900, 384, 70);
}

Test(bench_weights, tile_repeat_refuses_what_does_not_fit)
{
    kiln_bench_rng r = rng_new(2);
    kiln_bench_weight w;
    cr_assert_eq(kiln_bench_weight_make(KILN_FMT_FP8_BLOCK, 100, 256, &r, &w), KILN_OK);
    uint8_t data[300 * 256];
    float scale[3 * 2];
    kiln_qtensor full = { .format = KILN_FMT_FP8_BLOCK, .n = 300, .k = 256, .data = data,
                          .scale = scale };
    /* 100 rows are not whole 128-row scale blocks */
    cr_assert_eq(kiln_bench_tile_repeat(&w.q, &full), KILN_ERR_SHAPE);
    cr_assert(strstr(kiln_last_error(), "cover 128 rows; a tile of 100 rows"), "%s",
              kiln_last_error());
    full.scale = NULL;
    full.n = 100;
    cr_assert_eq(kiln_bench_tile_repeat(&w.q, &full), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "needs scale arrays"), "%s", kiln_last_error());
    full.format = KILN_FMT_FP8_CHANNEL;
    cr_assert_eq(kiln_bench_tile_repeat(&w.q, &full), KILN_ERR_INVALID_ARG);
    full.format = KILN_FMT_FP8_BLOCK;
    full.n = 50;
    cr_assert_eq(kiln_bench_tile_repeat(&w.q, &full), KILN_ERR_INVALID_ARG, "a tile taller");
    kiln_bench_weight_free(&w);
    kiln_bench_weight_free(NULL);
}

Test(bench_weights, weight_make_errors)
{
    kiln_bench_rng r = rng_new(3);
    kiln_bench_weight w;
    cr_assert_eq(kiln_bench_weight_make(KILN_FMT_Q4_K, 64, 100, &r, &w), KILN_ERR_SHAPE);
    cr_assert(strstr(kiln_last_error(), "bench weight q4_k [64, 100]"), "%s", kiln_last_error());
    cr_assert_eq(kiln_bench_weight_make(KILN_FMT_COUNT, 64, 256, &r, &w), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_bench_weight_make(KILN_FMT_BF16, 0, 256, &r, &w), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_bench_weight_make(KILN_FMT_BF16, 4, 256, NULL, &w), KILN_ERR_INVALID_ARG);
}

/* One layer of the stack in double precision from the dequantized weights:
 * x + down(silu(gate(h)) * up(h)), h = rms(x) * norm. */
static void stack_layer_ref(const kiln_bench_stack *s, double *x)
{
    const int64_t d = s->shape.d, f = s->shape.f;
    double *h = malloc((size_t)d * sizeof *h), *a = malloc((size_t)f * sizeof *a);
    cr_assert(h && a);
    double ss = 0;
    for (int64_t i = 0; i < d; i++)
        ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / (double)d + s->eps);
    for (int64_t i = 0; i < d; i++)
        h[i] = x[i] * r * s->norm[i];
    for (int64_t j = 0; j < f; j++) {
        double g = 0, u = 0;
        for (int64_t i = 0; i < d; i++) {
            g += h[i] * s->gate.ref[(j % s->gate.tile) * d + i];
            u += h[i] * s->up.ref[(j % s->up.tile) * d + i];
        }
        a[j] = g / (1.0 + exp(-g)) * u;
    }
    for (int64_t i = 0; i < d; i++) {
        double y = 0;
        for (int64_t j = 0; j < f; j++)
            y += a[j] * s->down.ref[(i % s->down.tile) * f + j];
        x[i] += y;
    }
    free(h);
    free(a);
}

/* The stack's graph is the stack's math: kiln's CPU executor against the
 * double-precision layers above, in BF16 and Q4_K; a graph of its first
 * layers alone; and rows gathered from a run give that run's rows. */
Test(bench_stack, the_graph_computes_the_stack)
{
    const kiln_format formats[] = { KILN_FMT_BF16, KILN_FMT_Q4_K };
    for (size_t fi = 0; fi < KILN_ARRAY_LEN(formats); fi++) {
        kiln_bench_rng r = rng_new(60 + fi);
        /* f past the 384-row tile, so rows repeat */
        const kiln_bench_stack_shape shape = { "tiny", 256, 512, 3 };
        kiln_bench_stack s;
        cr_assert_eq(kiln_bench_stack_make(formats[fi], &shape, &r, &s), KILN_OK, "%s",
                     kiln_last_error());
        enum { M = 5 };
        float x[M * 256], y[M * 256], rows_x[2 * 256], rows_y[2 * 256];
        for (int i = 0; i < M * 256; i++)
            x[i] = kiln_bench_rng_normal(&r);
        for (int layers = 1; layers <= 3; layers += 2) {
            kiln_graph *g;
            cr_assert_eq(kiln_bench_stack_graph(&s, layers, &g), KILN_OK, "%s",
                         kiln_last_error());
            cr_assert_eq(kiln_graph_n_inputs(g), 1);
            cr_assert_eq(kiln_graph_n_outputs(g), 1);
            kiln_cpu *cpu;
            cr_assert_eq(kiln_cpu_create(g, NULL, &cpu), KILN_OK, "%s", kiln_last_error());
            const float *in[] = { x };
            float *out[] = { y };
            cr_assert_eq(kiln_cpu_run(cpu, M, in, out), KILN_OK, "%s", kiln_last_error());
            for (int m = 0; m < M; m++) {
                double want[256];
                float want_f[256];
                for (int i = 0; i < 256; i++)
                    want[i] = x[m * 256 + i];
                for (int l = 0; l < layers; l++)
                    stack_layer_ref(&s, want);
                for (int i = 0; i < 256; i++)
                    want_f[i] = (float)want[i];
                double rel = kiln_bench_max_rel(y + m * 256, want_f, 256);
                cr_assert_lt(rel, 1e-5, "%s, %d layers, row %d: %g",
                             kiln_format_get(formats[fi])->name, layers, m, rel);
            }
            const int64_t rows[] = { 1, 4 };
            kiln_bench_gather_rows(x, 256, rows, 2, rows_x);
            const float *rin[] = { rows_x };
            float *rout[] = { rows_y };
            cr_assert_eq(kiln_cpu_run(cpu, 2, rin, rout), KILN_OK);
            for (int i = 0; i < 2; i++)
                cr_assert_eq(memcmp(rows_y + i * 256, y + rows[i] * 256, 256 * sizeof(float)), 0,
                             "row %lld alone is the row of the whole run", (long long)rows[i]);
            kiln_cpu_destroy(cpu);
            kiln_graph_destroy(g);
        }
        kiln_graph *g = NULL;
        cr_assert_eq(kiln_bench_stack_graph(&s, 4, &g), KILN_ERR_INVALID_ARG);
        cr_assert_eq(kiln_bench_stack_graph(&s, 0, &g), KILN_ERR_INVALID_ARG);
        cr_assert_null(g);
        kiln_bench_stack_free(&s);
    }
}

Test(bench_stack, shapes_and_refusals)
{
    kiln_bench_stack_shape s;
    cr_assert_eq(kiln_bench_stack_parse("llama70b", &s), KILN_OK);
    cr_assert_eq(s.d, 8192);
    cr_assert_eq(s.f, 28672);
    cr_assert_eq(s.layers, 80);
    cr_assert_eq(kiln_bench_stack_parse("LLAMA8B", &s), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_bench_stack_parse(NULL, &s), KILN_ERR_INVALID_ARG);
    kiln_bench_rng r = rng_new(62);
    kiln_bench_stack k;
    const kiln_bench_stack_shape none = { "none", 64, 64, 0 };
    cr_assert_eq(kiln_bench_stack_make(KILN_FMT_BF16, &none, &r, &k), KILN_ERR_INVALID_ARG);
    const kiln_bench_stack_shape odd = { "odd", 100, 256, 1 };
    kiln_clear_error();
    cr_assert_neq(kiln_bench_stack_make(KILN_FMT_Q4_K, &odd, &r, &k), KILN_OK);
    cr_assert(strstr(kiln_last_error(), "q4_k"), "%s", kiln_last_error());
}

/* The chain's kernels compile for Hopper, as kiln-bench ffn asks NVRTC. */
Test(bench_stack, the_chain_kernels_compile)
{
    kiln_target t;
    cr_assert_eq(kiln_target_from_name("sm_90a", &t), KILN_OK, "%s", kiln_last_error());
    kiln_nvrtc *nv = kt_open_nvrtc();
    kiln_compile_job job = { .name = "chain", .entry = "bench_chain",
                             .source = kiln_bench_chain_source(), .target = &t };
    cr_assert_eq(kiln_nvrtc_compile(nv, &job, NULL), KILN_OK, "%s\n%s", kiln_last_error(),
                 job.log ? job.log : "");
    cr_assert_gt(job.cubin_size, 0);
    kiln_compile_job_reset(&job);
    kiln_nvrtc_close(nv);
}

Test(bench_stack, max_rel)
{
    const float want[] = { 1, -4, 2 }, same[] = { 1, -4, 2 }, off[] = { 1, -3, 2 };
    cr_assert_eq(kiln_bench_max_rel(same, want, 3), 0);
    cr_assert_float_eq(kiln_bench_max_rel(off, want, 3), 0.25, 1e-12);
    const float nan_[] = { 1, NAN, 2 };
    cr_assert(isinf(kiln_bench_max_rel(nan_, want, 3)), "a NaN fails any tolerance");
    const float zeros[] = { 0, 0, 0 };
    cr_assert_float_eq(kiln_bench_max_rel(off, zeros, 3), 3, 1e-12);
}

Test(bench_weights, activations_1x128)
{
    kt_rng r = kt_rng_new(4);
    enum { M = 3, K = 300 };
    float x[M * K], scale[M * 3];
    uint8_t q[M * K];
    kt_fill_normal(&r, x, M * K, 2.0f);
    for (int j = 128; j < 256; j++)
        x[K + j] = 0; /* row 1, group 1: all zeros */
    kiln_bench_quant_1x128(x, M, K, q, scale);
    for (int i = 0; i < M; i++)
        for (int g = 0; g < 3; g++) {
            int lo = g * 128, hi = lo + 128 < K ? lo + 128 : K;
            float amax = 0;
            for (int j = lo; j < hi; j++)
                amax = fmaxf(amax, fabsf(x[i * K + j]));
            float s = scale[i * 3 + g];
            if (amax == 0) {
                cr_assert_eq(s, 1.0f);
                continue;
            }
            cr_assert_float_eq(s, amax / 448.0f, amax * 1e-6f);
            for (int j = lo; j < hi; j++) {
                float back = kiln_e4m3_to_f32(q[i * K + j]) * s;
                float v = x[i * K + j];
                /* E4M3: 3 mantissa bits, so half an ulp is 2^-4 of the value;
                 * below 2^-6 (subnormals) the step is 2^-9 of the scale unit */
                cr_assert_leq(fabsf(back - v), fmaxf(fabsf(v) * 0x1p-4f, s * 0x1p-10f),
                              "row %d col %d: %g -> %g", i, j, v, back);
            }
        }
}

/* ------------------------------------------------------------- checks */

Test(bench_check, sampled_rows)
{
    kiln_bench_rng r = rng_new(5);
    int64_t rows[64];
    int n = kiln_bench_sample_rows(5, 16, &r, rows);
    cr_assert_eq(n, 5);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(rows[i], i);
    for (int trial = 0; trial < 200; trial++) {
        int64_t m = 17 + (int64_t)(kiln_bench_rng_next(&r) % 5000);
        int count = 2 + (int)(kiln_bench_rng_next(&r) % 15);
        n = kiln_bench_sample_rows(m, count, &r, rows);
        cr_assert_eq(n, count);
        cr_assert_eq(rows[0], 0);
        cr_assert_eq(rows[n - 1], m - 1);
        for (int i = 1; i < n; i++)
            cr_assert_lt(rows[i - 1], rows[i], "m %lld: distinct and ascending", (long long)m);
    }
    n = kiln_bench_sample_rows(18, 17, &r, rows);
    cr_assert_eq(n, 17, "all but one of 18");
}

/* kiln's CPU executor on the full tiled weight passes the check, for every
 * format, with the BF16 budget; a wrong output is caught and located. */
static void cpu_matches_reference(kiln_format f, uint64_t salt)
{
    enum { M = 6 };
    const int64_t n = 400, k = 256;
    kiln_bench_rng r = rng_new(salt);
    kiln_bench_weight w;
    cr_assert_eq(kiln_bench_weight_make(f, n, k, &r, &w), KILN_OK, "%s", kiln_last_error());
    kiln_graph *g;
    kiln_tensor *x, *wt, *y;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    cr_assert_eq(kiln_graph_input(g, "x", k, &x), KILN_OK);
    cr_assert_eq(kiln_graph_weight(g, "w", &w.q, &wt), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_graph_linear(g, "y", x, wt, NULL, &y), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, y), KILN_OK);
    float *xs = malloc(M * (size_t)k * sizeof *xs), *ys = malloc(M * (size_t)n * sizeof *ys);
    for (int64_t i = 0; i < M * k; i++)
        xs[i] = kiln_bf16_to_f32(kiln_f32_to_bf16(kiln_bench_rng_normal(&r)));
    kiln_cpu *cpu;
    cr_assert_eq(kiln_cpu_create(g, NULL, &cpu), KILN_OK);
    const float *in[] = { xs };
    float *out[] = { ys };
    cr_assert_eq(kiln_cpu_run(cpu, M, in, out), KILN_OK, "%s", kiln_last_error());
    kiln_cpu_destroy(cpu);

    int64_t rows[M];
    const float *xp[M], *yp[M];
    int n_rows = kiln_bench_sample_rows(M, M, &r, rows);
    for (int i = 0; i < n_rows; i++) {
        xp[i] = xs + rows[i] * k;
        yp[i] = ys + rows[i] * n;
    }
    kiln_bench_check_in ci = { .x = xp, .y = yp, .rows = rows, .n_rows = n_rows, .w = w.ref,
                               .tile = w.tile, .n = n, .k = k, .tol = 0x1p-7 };
    kiln_bench_check c;
    const char *name = kiln_format_get(f)->name;
    cr_assert_eq(kiln_bench_check_run(&ci, &c), KILN_OK);
    cr_assert(c.pass, "%s: worst %g at row %lld col %lld (got %g want %g)", name, c.worst,
              (long long)c.row, (long long)c.col, c.got, c.want);
    cr_assert_lt(c.worst, 1e-5, "%s: f32 accumulation only", name);

    /* a wrong value past the tile, in the last sampled row */
    float keep = ys[5 * n + 391];
    ys[5 * n + 391] += 0.25f;
    cr_assert_eq(kiln_bench_check_run(&ci, &c), KILN_OK);
    cr_assert_not(c.pass, "%s: a wrong output passed", name);
    cr_assert_eq(c.row, 5);
    cr_assert_eq(c.col, 391);
    cr_assert_float_eq(c.got, keep + 0.25f, 1e-6);
    /* rows past the tile computed from the next tile row: j+1 - 384 where
     * j - 384 belongs (one value might match by chance; sixteen do not) */
    float saved[16];
    memcpy(saved, ys + 5 * n + 384, sizeof saved);
    for (int j = 384; j < 400; j++)
        ys[5 * n + j] = ys[5 * n + j - 383];
    cr_assert_eq(kiln_bench_check_run(&ci, &c), KILN_OK);
    cr_assert_not(c.pass, "%s: outputs from the wrong weight rows passed", name);
    cr_assert_geq(c.col, 384);
    memcpy(ys + 5 * n + 384, saved, sizeof saved);
    ys[5 * n + 391] = NAN;
    cr_assert_eq(kiln_bench_check_run(&ci, &c), KILN_OK);
    cr_assert_not(c.pass, "%s: NaN passed", name);
    cr_assert(isinf(c.worst));
    ys[5 * n + 391] = keep;
    cr_assert_eq(kiln_bench_check_run(&ci, &c), KILN_OK);
    cr_assert(c.pass);

    free(xs);
    free(ys);
    kiln_graph_destroy(g);
    kiln_bench_weight_free(&w);
}

Test(bench_check, cpu_executor_passes_and_wrong_outputs_fail, .timeout = 300)
{
    for (int f = 0; f < KILN_FMT_COUNT; f++)
        cpu_matches_reference((kiln_format)f, 100 + (uint64_t)f);
}

/* A dot product of E4M3-rounded activations, checked against the unrounded
 * ones, stays inside the budget the bench gives such kernels. */
Test(bench_check, fp8_activation_budget)
{
    enum { K = 4096, N = 64 };
    kiln_bench_rng r = rng_new(6);
    float *x = malloc(K * sizeof *x), *xq = malloc(K * sizeof *xq);
    float *w = malloc((size_t)N * K * sizeof *w), *y = malloc(N * sizeof *y);
    uint8_t *q = malloc(K);
    float scale[K / 128];
    for (int i = 0; i < K; i++)
        x[i] = kiln_bench_rng_normal(&r);
    for (int i = 0; i < N * K; i++)
        w[i] = kiln_bench_rng_normal(&r) / 64;
    kiln_bench_quant_1x128(x, 1, K, q, scale);
    for (int i = 0; i < K; i++)
        xq[i] = kiln_e4m3_to_f32(q[i]) * scale[i / 128];
    for (int j = 0; j < N; j++) {
        double acc = 0;
        for (int t = 0; t < K; t++)
            acc += (double)xq[t] * w[(size_t)j * K + t];
        y[j] = (float)acc;
    }
    int64_t row = 0;
    const float *xp[] = { x }, *yp[] = { y };
    kiln_bench_check_in ci = { .x = xp, .y = yp, .rows = &row, .n_rows = 1, .w = w, .tile = N,
                               .n = N, .k = K, .tol = 0x1p-5 };
    kiln_bench_check c;
    cr_assert_eq(kiln_bench_check_run(&ci, &c), KILN_OK);
    cr_assert(c.pass, "worst %g", c.worst);
    cr_assert_gt(c.worst, 0x1p-12, "the rounding shows");
    free(x);
    free(xq);
    free(w);
    free(y);
    free(q);
}

Test(bench_check, bad_input)
{
    kiln_bench_check c;
    kiln_bench_check_in ci = { 0 };
    cr_assert_eq(kiln_bench_check_run(&ci, &c), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_bench_check_run(NULL, &c), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "check:"), "%s", kiln_last_error());
}

/* ------------------------------------------------------------- report */

static kiln_bench_report sample_report(void)
{
    kiln_bench_report r = { .copy_tbps = 4.0, .l2_bytes = 50e6, .rotate_bytes = 150e6,
                            .iters = 200, .reps = 5, .peak_fp8 = 1300 };
    snprintf(r.device, sizeof r.device, "NVIDIA \"H200\"\tNVL");
    snprintf(r.target, sizeof r.target, "sm_90a");
    kiln_bench_row peer = { .shape = "llama8b.qkv", .n = 6144, .k = 4096, .m = 1,
                            .kind = "bf16_cublas", .us = 20.0, .bytes = 4e7, .flops = 5e7,
                            .rotation = 3, .check_err = 1e-3 };
    kiln_bench_row kiln = { .shape = "llama8b.qkv", .n = 6144, .k = 4096, .m = 1,
                            .kind = "kiln", .format = "q4_k", .backend = "gemv_tc",
                            .act = "bf16", .us = 10.0, .bytes = 1.5e7, .flops = 5e7, .rotation = 9,
                            .check_err = 2e-4, .speedup_bf16 = 2.0 };
    kiln_bench_row fail = kiln;
    fail.status = KILN_BENCH_FAIL;
    fail.us = 0;
    snprintf(fail.format, sizeof fail.format, "nvfp4");
    snprintf(fail.error, sizeof fail.error, "worst error 0.5 at row 0, column 3");
    kiln_bench_row unsup = peer;
    unsup.status = KILN_BENCH_UNSUPPORTED;
    unsup.us = 0;
    snprintf(unsup.kind, sizeof unsup.kind, "fp8_block");
    snprintf(unsup.error, sizeof unsup.error, "no algorithm");
    cr_assert_eq(kiln_bench_report_add(&r, &peer), KILN_OK);
    cr_assert_eq(kiln_bench_report_add(&r, &kiln), KILN_OK);
    cr_assert_eq(kiln_bench_report_add(&r, &fail), KILN_OK);
    cr_assert_eq(kiln_bench_report_add(&r, &unsup), KILN_OK);
    return r;
}

static char *capture(void (*fn)(FILE *, const kiln_bench_report *), const kiln_bench_report *r)
{
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    fn(f, r);
    fclose(f);
    return text;
}

static void table(FILE *f, const kiln_bench_report *r)
{
    kiln_bench_table_header(f, r);
    for (int i = 0; i < r->n_rows; i++)
        kiln_bench_table_row(f, r, &r->rows[i]);
}

Test(bench_report, table)
{
    kiln_bench_report r = sample_report();
    char *text = capture(table, &r);
    char *line[5];
    int n = 0;
    for (char *p = strtok(text, "\n"); p && n < 5; p = strtok(NULL, "\n"))
        line[n++] = p;
    cr_assert_eq(n, 5, "%s", text);
    const char *head[] = { "shape", "N", "K", "M", "format", "backend", "us", "TB/s", "TFLOP/s",
                           "%copy", "xbf16", "xfp8" };
    for (size_t i = 0; i < sizeof head / sizeof head[0]; i++)
        cr_assert(strstr(line[0], head[i]), "header lacks %s: %s", head[i], line[0]);
    /* peer: 4e7 bytes in 20 µs = 2 TB/s, 50 % of 4 TB/s; 5e7 flops = 2.5 TFLOP/s */
    cr_assert(strstr(line[1], "cuBLAS bf16"), "%s", line[1]);
    cr_assert(strstr(line[1], "20.00  2.000     2.50   50.0      -      -"), "%s", line[1]);
    /* kiln: 1.5 TB/s, 37.5 %, twice as fast as cuBLAS, no FP8 peer time */
    cr_assert(strstr(line[2], "q4_k             gemv_tc/bf16"), "%s", line[2]);
    cr_assert(strstr(line[2], "10.00  1.500     5.00   37.5   2.00      -"), "%s", line[2]);
    cr_assert(strstr(line[3], "nvfp4"), "%s", line[3]);
    cr_assert(strstr(line[3], "FAIL: worst error 0.5 at row 0, column 3"), "%s", line[3]);
    cr_assert_null(strstr(line[3], "10.00"), "a failed kernel shows no time");
    cr_assert(strstr(line[4], "cuBLASLt fp8 blk"), "%s", line[4]);
    cr_assert(strstr(line[4], "not supported: no algorithm"), "%s", line[4]);
    free(text);
    /* kiln-bench ffn's table: the last ratio is to kiln's own BF16 stack */
    r.ffn = 1;
    r.rows[1].speedup_kiln_bf16 = 1.6;
    text = capture(table, &r);
    cr_assert(strstr(text, "xbf16 xkbf16\n") && !strstr(text, "xfp8"), "%s", text);
    cr_assert(strstr(text, "10.00  1.500     5.00   37.5   2.00   1.60\n"), "%s", text);
    free(text);
    kiln_bench_report_free(&r);
    cr_assert_null(r.rows);
}

static void json(FILE *f, const kiln_bench_report *r)
{
    cr_assert_eq(kiln_bench_json_write(r, f), KILN_OK);
}

Test(bench_report, json)
{
    kiln_bench_report r = sample_report();
    char *text = capture(json, &r);
    json_error_t err;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &err);
    cr_assert_not_null(root, "line %d: %s\n%s", err.line, err.text, text);
    cr_assert_str_eq(json_string_value(json_object_get(root, "tool")), "kiln-bench gemm");
    cr_assert_str_eq(json_string_value(json_object_get(root, "kiln")), kiln_version());
    cr_assert_str_eq(json_string_value(json_object_get(root, "device")), "NVIDIA \"H200\"\tNVL");
    cr_assert_str_eq(json_string_value(json_object_get(root, "target")), "sm_90a");
    cr_assert_float_eq(json_number_value(json_object_get(root, "copy_TBps")), 4.0, 1e-12);
    cr_assert_float_eq(json_number_value(json_object_get(root, "l2_bytes")), 50e6, 1e-3);
    cr_assert_float_eq(json_number_value(json_object_get(root, "rotate_bytes")), 150e6, 1e-3);
    cr_assert_eq(json_integer_value(json_object_get(root, "iters")), 200);
    cr_assert_eq(json_integer_value(json_object_get(root, "reps")), 5);
    cr_assert(json_is_null(json_object_get(root, "peak_bf16_tflops")));
    cr_assert_float_eq(json_number_value(json_object_get(root, "peak_fp8_tflops")), 1300, 1e-9);
    json_t *rows = json_object_get(root, "rows");
    cr_assert_eq(json_array_size(rows), 4);

    json_t *p = json_array_get(rows, 0);
    cr_assert_str_eq(json_string_value(json_object_get(p, "shape")), "llama8b.qkv");
    cr_assert_eq(json_integer_value(json_object_get(p, "N")), 6144);
    cr_assert_eq(json_integer_value(json_object_get(p, "K")), 4096);
    cr_assert_eq(json_integer_value(json_object_get(p, "M")), 1);
    cr_assert_str_eq(json_string_value(json_object_get(p, "kind")), "bf16_cublas");
    cr_assert_null(json_object_get(p, "format"));
    cr_assert_null(json_object_get(p, "backend"));
    cr_assert_str_eq(json_string_value(json_object_get(p, "status")), "ok");
    cr_assert_float_eq(json_number_value(json_object_get(p, "us")), 20.0, 1e-9);
    cr_assert_float_eq(json_number_value(json_object_get(p, "TBps")), 2.0, 1e-9);
    cr_assert_float_eq(json_number_value(json_object_get(p, "tflops")), 2.5, 1e-9);
    cr_assert_float_eq(json_number_value(json_object_get(p, "frac_bw")), 0.5, 1e-9);
    cr_assert_eq(json_integer_value(json_object_get(p, "rotation")), 3);
    cr_assert(json_is_null(json_object_get(p, "speedup_bf16")));

    json_t *k = json_array_get(rows, 1);
    cr_assert_str_eq(json_string_value(json_object_get(k, "kind")), "kiln");
    cr_assert_str_eq(json_string_value(json_object_get(k, "format")), "q4_k");
    cr_assert_str_eq(json_string_value(json_object_get(k, "backend")), "gemv_tc");
    cr_assert_str_eq(json_string_value(json_object_get(k, "act")), "bf16");
    cr_assert_float_eq(json_number_value(json_object_get(k, "speedup_bf16")), 2.0, 1e-9);
    cr_assert(json_is_null(json_object_get(k, "speedup_fp8")));
    cr_assert(json_is_null(json_object_get(k, "speedup_kiln_bf16")));
    cr_assert_float_eq(json_number_value(json_object_get(k, "check_err")), 2e-4, 1e-12);

    json_t *f = json_array_get(rows, 2);
    cr_assert_str_eq(json_string_value(json_object_get(f, "status")), "FAIL");
    cr_assert_str_eq(json_string_value(json_object_get(f, "error")),
                     "worst error 0.5 at row 0, column 3");
    cr_assert_null(json_object_get(f, "us"), "a failed kernel has no time");
    cr_assert_null(json_object_get(f, "TBps"));
    json_t *u = json_array_get(rows, 3);
    cr_assert_str_eq(json_string_value(json_object_get(u, "status")), "not supported");
    json_decref(root);
    free(text);
    kiln_bench_report_free(&r);
}

Test(bench_report, empty_and_unchecked)
{
    kiln_bench_report r = { 0 };
    char *text = capture(json, &r);
    json_error_t err;
    json_t *root = json_loads(text, 0, &err);
    cr_assert_not_null(root, "%s\n%s", err.text, text);
    cr_assert_eq(json_array_size(json_object_get(root, "rows")), 0);
    cr_assert(json_is_null(json_object_get(root, "copy_TBps")), "not measured is null");
    json_decref(root);
    free(text);
    kiln_bench_row row = { .shape = "a\\b\x01", .kind = "kiln", .check_err = -1, .us = 3,
                           .bytes = NAN, .flops = 1 };
    cr_assert_eq(kiln_bench_report_add(&r, &row), KILN_OK);
    text = capture(json, &r);
    root = json_loads(text, 0, &err);
    cr_assert_not_null(root, "%s\n%s", err.text, text);
    json_t *j = json_array_get(json_object_get(root, "rows"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(j, "shape")), "a\\b\x01");
    cr_assert(json_is_null(json_object_get(j, "check_err")), "not checked is null");
    cr_assert(json_is_null(json_object_get(j, "bytes")), "NaN is null");
    cr_assert(json_is_null(json_object_get(j, "frac_bw")), "no copy bandwidth, no fraction");
    json_decref(root);
    free(text);
    kiln_bench_report_free(&r);
}

Test(bench_report, many_rows)
{
    kiln_bench_report r = { 0 };
    for (int i = 0; i < 500; i++) {
        kiln_bench_row row = { .m = i };
        cr_assert_eq(kiln_bench_report_add(&r, &row), KILN_OK);
    }
    cr_assert_eq(r.n_rows, 500);
    for (int i = 0; i < 500; i++)
        cr_assert_eq(r.rows[i].m, i);
    kiln_bench_report_free(&r);
}

Test(bench_report, write_failure)
{
    kiln_bench_report r = sample_report();
    FILE *f = fopen("/dev/null", "r");
    cr_assert_not_null(f);
    cr_assert_eq(kiln_bench_json_write(&r, f), KILN_ERR_IO);
    cr_assert(strstr(kiln_last_error(), "JSON report"), "%s", kiln_last_error());
    fclose(f);
    kiln_bench_report_free(&r);
}

Test(bench_report, status_names)
{
    cr_assert_str_eq(kiln_bench_status_name(KILN_BENCH_OK), "ok");
    cr_assert_str_eq(kiln_bench_status_name(KILN_BENCH_FAIL), "FAIL");
    cr_assert_str_eq(kiln_bench_status_name(KILN_BENCH_UNSUPPORTED), "not supported");
    cr_assert_str_eq(kiln_bench_status_name(KILN_BENCH_ERROR), "error");
    cr_assert_str_eq(kiln_bench_status_name(KILN_BENCH_STATUS_COUNT), "?");
}
