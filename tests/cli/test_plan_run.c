/* kiln plan, compile and run as a user meets them. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clirun.h"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/kiln-cli-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    char cache[128];
    snprintf(cache, sizeof cache, "%s/kernels.kiln", dir);
    setenv("KILN_CACHE", cache, 1);
    setenv("XDG_CACHE_HOME", dir, 1);
}

TestSuite(cli_plan_run, .init = setup);

Test(cli_plan_run, plan_explains_every_linear)
{
    kt_cli r = kt_cli_run("plan demo --target sm_90a");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "plan: demo for sm_90a, 10 token buckets: 1 2 4 8 16 32 64 128 256 512"),
              "%s", r.out);
    for (int l = 0; l < 6; l++) {
        char name[32];
        snprintf(name, sizeof name, "blk.%d.ffn_down", l);
        cr_assert(strstr(r.out, name), "%s missing", name);
    }
    cr_assert(strstr(r.out, "18 linear nodes x 10 buckets -> "), "%s", r.out);
    cr_assert(strstr(r.out, "activation arena: "));
    /* the demo's weights as a session holds them: packed (decode), and
     * in kiln's layout (prefill) but for the formats whose prefill reads
     * the packed layout (wgmma_tc's: NVFP4, MXFP4, Q4_K, ...) and BF16
     * and FP8 per-channel, whose row-major atoms wgmma's TMA kernel reads:
     * block FP8 alone is held twice */
    cr_assert(strstr(r.out, "weights on the device: 15.0 MiB (2.3 MiB in kiln's storage "
                            "layout, 12.8 MiB packed for the tensor-core kernels)"),
              "%s", r.out);
    kt_cli_free(&r);
    r = kt_cli_run("plan demo --target sm_75");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "weights on the device: 12.7 MiB (12.7 MiB in kiln's storage "
                            "layout, 0 B packed"),
              "%s", r.out);
    kt_cli_free(&r);
    /* --json: the same sizes to the byte */
    r = kt_cli_run("plan demo --target sm_75 --json");
    cr_assert(strstr(r.out, "\"storage\": 13359680"), "%s", r.out);
    kt_cli_free(&r);
}

Test(cli_plan_run, plan_json_and_named_targets)
{
    kt_cli r = kt_cli_run("plan demo --target h200 --capture 1,8 --max-tokens 64 --json");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "\"target\": \"sm_90a\""), "%s", r.out);
    cr_assert(strstr(r.out, "\"buckets\": [\n  1,\n  8,\n  64\n ]"), "%s", r.out);
    cr_assert(strstr(r.out, "\"signatures\""));
    cr_assert(strstr(r.out, "\"weights\": {\n  \"storage\": "), "%s", r.out);
    kt_cli_free(&r);
}

/* A one-layer FP8 FFN with static activations (quant_method fp8,
 * activation_scheme static) in dir/static: gate and up per tensor with
 * input scales 0.5 and 0.25, down in 128 x 128 blocks with 0.125. The
 * weights are zeros: planning reads none of them. */
static void write_static_fp8_ffn(char *model, size_t size)
{
    enum { D = 256, F = 512 };
    static const struct {
        const char *name, *dtype;
        int64_t rows, cols; /* cols 0: [rows]; rows 0: a scalar */
        float value;
    } t[] = {
        { "model.layers.0.post_attention_layernorm.weight", "F32", D, 0, 1.0f },
        { "model.layers.0.mlp.gate_proj.weight", "F8_E4M3", F, D, 0 },
        { "model.layers.0.mlp.gate_proj.weight_scale", "F32", 0, 0, 0.01f },
        { "model.layers.0.mlp.gate_proj.input_scale", "F32", 0, 0, 0.5f },
        { "model.layers.0.mlp.up_proj.weight", "F8_E4M3", F, D, 0 },
        { "model.layers.0.mlp.up_proj.weight_scale", "F32", 0, 0, 0.01f },
        { "model.layers.0.mlp.up_proj.input_scale", "F32", 0, 0, 0.25f },
        { "model.layers.0.mlp.down_proj.weight", "F8_E4M3", D, F, 0 },
        { "model.layers.0.mlp.down_proj.weight_scale_inv", "F32", D / 128, F / 128, 0.01f },
        { "model.layers.0.mlp.down_proj.input_scale", "F32", 0, 0, 0.125f },
    };
    snprintf(model, size, "%s/static", dir);
    cr_assert_eq(mkdir(model, 0755), 0);
    char header[4096], path[256];
    size_t at = 0, off = 0, total = 0;
    at += (size_t)snprintf(header + at, sizeof header - at, "{");
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        size_t n = t[i].rows ? (size_t)t[i].rows * (size_t)(t[i].cols ? t[i].cols : 1) : 1;
        size_t bytes = n * (strcmp(t[i].dtype, "F32") ? 1 : 4);
        char shape[32];
        if (!t[i].rows)
            snprintf(shape, sizeof shape, "[]");
        else if (!t[i].cols)
            snprintf(shape, sizeof shape, "[%lld]", (long long)t[i].rows);
        else
            snprintf(shape, sizeof shape, "[%lld, %lld]", (long long)t[i].rows,
                     (long long)t[i].cols);
        at += (size_t)snprintf(header + at, sizeof header - at,
                               "%s\"%s\": {\"dtype\": \"%s\", \"shape\": %s, "
                               "\"data_offsets\": [%zu, %zu]}",
                               i ? ", " : "", t[i].name, t[i].dtype, shape, off, off + bytes);
        off += bytes;
    }
    at += (size_t)snprintf(header + at, sizeof header - at, "}");
    cr_assert_lt(at, sizeof header);
    total = off;
    uint8_t *data = calloc(1, total);
    off = 0;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        size_t n = t[i].rows ? (size_t)t[i].rows * (size_t)(t[i].cols ? t[i].cols : 1) : 1;
        int f32 = !strcmp(t[i].dtype, "F32");
        for (size_t e = 0; f32 && e < n; e++)
            memcpy(data + off + 4 * e, &t[i].value, 4);
        off += n * (f32 ? 4 : 1);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", model);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)((uint64_t)at >> (8 * i));
    cr_assert_eq(fwrite(len, 1, 8, f), 8);
    cr_assert_eq(fwrite(header, 1, at, f), at);
    cr_assert_eq(fwrite(data, 1, total, f), total);
    cr_assert_eq(fclose(f), 0);
    free(data);
    snprintf(path, sizeof path, "%s/config.json", model);
    f = fopen(path, "w");
    cr_assert(f);
    fprintf(f, "{\"architectures\": [\"LlamaForCausalLM\"], \"num_hidden_layers\": 1, "
               "\"hidden_size\": %d, \"intermediate_size\": %d, \"rms_norm_eps\": 1e-5, "
               "\"quantization_config\": {\"quant_method\": \"fp8\", "
               "\"activation_scheme\": \"static\"}}", D, F);
    cr_assert_eq(fclose(f), 0);
}

/* kiln COMMAND MODEL REST, which must succeed. */
static kt_cli run_ok(const char *command, const char *model, const char *rest)
{
    char args[512];
    snprintf(args, sizeof args, "%s %s%s", command, model, rest);
    kt_cli r = kt_cli_run(args);
    cr_assert_eq(r.status, 0, "%s: %s", args, r.err);
    return r;
}

/* inspect shows each FP8 linear's static activation scale beside its
 * weight, in text and JSON. */
Test(cli_plan_run, inspect_shows_static_activation_scales)
{
    char model[128];
    write_static_fp8_ffn(model, sizeof model);
    kt_cli r = run_ok("inspect", model, "");
    const char *up = strstr(r.out, "model.layers.0.mlp.up_proj.weight ");
    cr_assert(up, "%s", r.out);
    cr_assert(strstr(up, "static input_scale 0.25\n"), "%s", r.out);
    kt_cli_free(&r);
    r = run_ok("inspect", model, " --json");
    cr_assert(strstr(r.out, "\"input_scale\": 0.125"), "%s", r.out);
    kt_cli_free(&r);
}

/* The plan names each FP8 linear's activation scale: static with its
 * value where the backend applies it (fp8 codes for wgmma's FP8 GEMM, a
 * BF16 quantize-dequantize for the decode kernels), and says so where the
 * backend ignores it (block FP8 quantizes its own 1x128 groups). */
Test(cli_plan_run, plan_shows_static_activation_scales)
{
    char model[128];
    write_static_fp8_ffn(model, sizeof model);
    kt_cli r = run_ok("plan", model, " --target sm_90a --capture 1,512");
    cr_assert(strstr(r.out, "act scale"), "%s", r.out);
    const char *gate = strstr(r.out, "blk.0.ffn_gate");
    cr_assert(gate, "%s", r.out);
    cr_assert(strstr(gate, "gemv_tc  tc1             bf16        static (input_scale=0.5) q/dq "),
              "%s", r.out);
    cr_assert(strstr(gate, "wgmma    tma_bm64bn128   fp8-token   static (input_scale=0.5) "),
              "%s", r.out);
    cr_assert(strstr(r.out, "static (input_scale=0.25)"), "%s", r.out);
    cr_assert(strstr(r.out, "wgmma    tma_bm64bn128   fp8-1x128   IGNORED: static "
                            "(input_scale=0.125) "),
              "%s", r.out);
    kt_cli_free(&r);

    r = run_ok("plan", model, " --target sm_90a --capture 1,512 --json");
    json_error_t e;
    json_t *root = json_loads(r.out, 0, &e), *lin;
    cr_assert_not_null(root, "%s", e.text);
    size_t i;
    const char *want_use[] = { "fp8-static", "fp8-static", "ignored" };
    const double want_scale[] = { 0.5, 0.25, 0.125 };
    json_array_foreach(json_object_get(root, "linears"), i, lin) {
        cr_assert_lt(i, 3);
        cr_assert_eq(json_real_value(json_object_get(lin, "input_scale")), want_scale[i]);
        json_t *big = json_array_get(json_object_get(lin, "buckets"), 1);
        json_t *one = json_array_get(json_object_get(lin, "buckets"), 0);
        cr_assert_str_eq(json_string_value(json_object_get(big, "input_scale_use")), want_use[i]);
        cr_assert_str_eq(json_string_value(json_object_get(one, "input_scale_use")), "bf16-qdq");
        cr_assert(strstr(json_string_value(json_object_get(big, "act_scale")), "static"));
    }
    json_decref(root);
    kt_cli_free(&r);

    /* The demo's FP8 linears quantize activations with dynamic scales. */
    r = kt_cli_run("plan demo --target sm_90a --json");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "\"input_scale\": null"), "%s", r.out);
    kt_cli_free(&r);
}

Test(cli_plan_run, plan_errors)
{
    kt_cli r = kt_cli_run("plan demo --backend cutlass");
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "--backend cutlass: no such backend (built: "), "%s", r.err);
    kt_cli_free(&r);
    static const char *usage[] = { "plan", "plan demo --target sm_10",
                                   "plan demo --target sm_80 --target sm_90a",
                                   "plan demo --strict-backend",
                                   "plan demo --capture 0", "plan demo --graph attention",
                                   "plan demo extra" };
    for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
        r = kt_cli_run(usage[i]);
        cr_assert_eq(r.status, 2, "%s exited %d", usage[i], r.status);
        cr_assert(strstr(r.err, "usage: kiln plan"), "%s: %s", usage[i], r.err);
        kt_cli_free(&r);
    }
    r = kt_cli_run("plan /nonexistent/model.gguf");
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "/nonexistent/model.gguf"));
    kt_cli_free(&r);
}

static int compiled_count(const char *out)
{
    const char *p = strstr(out, " cached, ");
    return p ? atoi(p + 9) : -1;
}

Test(cli_plan_run, compile_twice_compiles_nothing_the_second_time, .timeout = 300)
{
    char args[256];
    snprintf(args, sizeof args, "compile demo --target sm_80 --cache %s/c.kiln --quiet", dir);
    kt_cli a = kt_cli_run(args);
    cr_assert_eq(a.status, 0, "%s", a.err);
    int first = compiled_count(a.out);
    cr_assert_gt(first, 0, "%s", a.out);
    kt_cli b = kt_cli_run(args);
    cr_assert_eq(b.status, 0, "%s", b.err);
    cr_assert_eq(compiled_count(b.out), 0, "%s", b.out);
    char want[64];
    snprintf(want, sizeof want, "signatures: %d cached, 0 compiled", first);
    cr_assert(strstr(b.out, want), "%s", b.out);
    kt_cli_free(&a);
    kt_cli_free(&b);
    /* --offline finds every kernel, and in an empty cache names the first
     * it misses. */
    snprintf(args, sizeof args, "compile demo --target sm_80 --cache %s/c.kiln --offline", dir);
    a = kt_cli_run(args);
    cr_assert_eq(a.status, 0, "%s", a.err);
    cr_assert(strstr(a.out, want), "%s", a.out);
    snprintf(args, sizeof args, "compile demo --target sm_80 --cache %s/empty.kiln --offline", dir);
    b = kt_cli_run(args);
    cr_assert_eq(b.status, 1, "%s", b.out);
    cr_assert(strstr(b.err, "offline, and kernel \"linear backend="), "%s", b.err);
    /* and lists every kernel missing, as kiln cache check does */
    char listed[64];
    snprintf(listed, sizeof listed, "kiln compile: %d of %d kernels are in no cache\n", first,
             first);
    cr_assert(strstr(b.err, listed), "want %s in %s", listed, b.err);
    int lines = 0;
    for (const char *q = b.err; (q = strstr(q, "kiln compile: missing: ")); q++)
        lines++;
    cr_assert_eq(lines, first, "%s", b.err);
    kt_cli_free(&a);
    kt_cli_free(&b);
    /* --json: the same counts */
    snprintf(args, sizeof args, "compile demo --target sm_80 --cache %s/c.kiln --json", dir);
    a = kt_cli_run(args);
    cr_assert_eq(a.status, 0, "%s", a.err);
    snprintf(want, sizeof want, "\"cached\": %d,\n   \"compiled\": 0,", first);
    cr_assert(strstr(a.out, "\"target\": \"sm_80\""), "%s", a.out);
    cr_assert(strstr(a.out, want), "want %s in %s", want, a.out);
    kt_cli_free(&a);
    /* KILN_OFFLINE=1 is --offline */
    snprintf(args, sizeof args, "compile demo --target sm_80 --cache %s/empty.kiln", dir);
    setenv("KILN_OFFLINE", "1", 1);
    b = kt_cli_run(args);
    unsetenv("KILN_OFFLINE");
    cr_assert_eq(b.status, 1, "%s", b.out);
    cr_assert(strstr(b.err, "offline, and kernel \"linear backend="), "%s", b.err);
    kt_cli_free(&b);
}

/* Each kernel is stored as it compiles: a compile stopped by SIGINT after a
 * few kernels stores the ones compiling, says so and exits 130, leaving
 * every kernel done in the cache; the next compiles only the rest. Off a
 * terminal progress comes as lines. */
Test(cli_plan_run, an_interrupted_compile_keeps_what_it_did, .timeout = 600)
{
    char cache[128], err[128];
    snprintf(cache, sizeof cache, "%s/stopped.kiln", dir);
    snprintf(err, sizeof err, "%s/compile.err", dir);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fd = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int null = open("/dev/null", O_WRONLY);
        if (fd < 0 || null < 0 || dup2(fd, STDERR_FILENO) < 0 || dup2(null, STDOUT_FILENO) < 0)
            _exit(99);
        execl(getenv("KILN_CLI"), "kiln", "compile", "demo", "--target", "sm_80", "--cache", cache,
              "-j", "1", (char *)NULL);
        _exit(98);
    }
    /* Wait for the first progress line: some kernels are done. */
    char *text = NULL;
    for (int i = 0; i < 1200; i++) {
        free(text);
        text = kt_read_file(err, NULL);
        if (text && strstr(text, "compiling kernels: "))
            break;
        nanosleep(&(struct timespec){ .tv_nsec = 100000000 }, NULL);
    }
    cr_assert(text && strstr(text, "compiling kernels: "), "no progress line: %s", text);
    cr_assert_null(strchr(text, '\r'), "a terminal's line in a file: %s", text);
    int done = 0;
    cr_assert_eq(sscanf(strstr(text, "compiling kernels: "), "compiling kernels: %d/", &done), 1);
    free(text);
    kill(pid, SIGINT);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGINT, "status %#x", status);
    text = kt_read_file(err, NULL);
    cr_assert(text && strstr(text, "kiln: compile: interrupted: "), "%s", text);
    cr_assert(strstr(text, " were compiled and stored, "), "%s", text);
    free(text);

    char args[256];
    snprintf(args, sizeof args, "cache check --model demo --target sm_80 --cache %s", cache);
    kt_cli r = kt_cli_run(args);
    int kept = 0, total = 0;
    const char *summary = strstr(r.out, " kernels of demo for sm_80");
    while (summary && summary > r.out && summary[-1] != '\n')
        summary--;
    cr_assert(summary && sscanf(summary, "%d of %d", &kept, &total) == 2, "%s", r.out);
    kt_cli_free(&r);
    cr_assert_geq(kept, done, "a kernel done before the signal was lost");
    cr_assert_gt(kept, 0, "nothing was stored");
    cr_assert_lt(kept, total);

    snprintf(args, sizeof args, "compile demo --target sm_80 --cache %s --quiet", cache);
    r = kt_cli_run(args);
    cr_assert_eq(r.status, 0, "%s", r.err);
    char want[64];
    snprintf(want, sizeof want, "%d signatures: %d cached, %d compiled", total, kept, total - kept);
    cr_assert(strstr(r.out, want), "want %s: %s", want, r.out);
    kt_cli_free(&r);
}

Test(cli_plan_run, run_on_the_cpu_matches_the_demo)
{
    kt_cli r = kt_cli_run("run demo --device cpu --tokens 3,1 --steps 1");
    kt_cli d = kt_cli_run("demo --tokens 1,3 --steps 1");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_eq(d.status, 0, "%s", d.err);
    cr_assert(strstr(r.out, "on the CPU executor"));
    for (int m = 1; m <= 3; m += 2) {
        char key[16];
        snprintf(key, sizeof key, "\n%-7d ", m);
        const char *a = strstr(r.out, key), *b = strstr(d.out, key);
        cr_assert(a && b, "no row for %d tokens", m);
        cr_assert_eq(strncmp(a, b, 40), 0, "run and demo differ:\n%.40s\n%.40s", a, b);
    }
    kt_cli_free(&r);
    kt_cli_free(&d);
    /* --json: the same checksums, and why --check has nothing to compare */
    r = kt_cli_run("run demo --device cpu --tokens 3 --steps 1 --json --check");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "\"executor\": \"cpu\""), "%s", r.out);
    cr_assert(strstr(r.out, "\"tokens\": 3,"), "%s", r.out);
    cr_assert(strstr(r.out, "\"check\": \"nothing to compare: "), "%s", r.out);
    kt_cli_free(&r);
    r = kt_cli_run("run demo --device cpu --tokens 1 --steps 1 --check");
    cr_assert(strstr(r.out, "check: nothing to compare: "), "%s", r.out);
    kt_cli_free(&r);
}

/* --capture means capture sizes wherever a plan is made; --tokens is the
 * token counts kiln run runs, and elsewhere it is refused naming --capture. */
Test(cli_plan_run, capture_sizes_have_one_name)
{
    static const char *old[] = { "plan demo --tokens 1,8", "compile demo --tokens 1,8",
                                 "cache export --model demo -o x.kiln --tokens 1,8" };
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++) {
        kt_cli r = kt_cli_run(old[i]);
        cr_assert_eq(r.status, 2, "%s exited %d", old[i], r.status);
        cr_assert(strstr(r.err, "capture sizes are --capture 1,8"), "%s: %s", old[i], r.err);
        kt_cli_free(&r);
    }
    kt_cli r = kt_cli_run("plan demo --target sm_80 --capture 1,8 --max-tokens 32");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "3 token buckets: 1 8 32"), "%s", r.out);
    kt_cli_free(&r);
    /* run takes the same planning options, --target and --capture included */
    r = kt_cli_run("run demo --device cpu --target sm_80 --capture 1,8 --max-tokens 32 "
                   "--no-fuse --tokens 3 --steps 1");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "\n3 "), "%s", r.out);
    kt_cli_free(&r);
}

/* --profile on the CPU executor says there are no kernels to time and
 * still runs; on a GPU it prints every kernel of the bucket with its time. */
Test(cli_plan_run, run_profile_on_either_executor, .timeout = 300)
{
    kt_cli r = kt_cli_run("run demo --device cpu --tokens 2 --steps 1 --profile");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "profile: the CPU executor runs no kernels"), "%s", r.out);
    kt_cli_free(&r);
    r = kt_cli_run("run demo --tokens 2 --steps 1 --profile");
    cr_assert_eq(r.status, 0, "%s", r.err);
    if (strstr(r.out, "on the CPU executor")) {
        cr_assert(strstr(r.out, "profile: the CPU executor runs no kernels"), "%s", r.out);
    } else {
        const char *p = strstr(r.out, "profile 2 tokens: ");
        cr_assert_not_null(p, "%s", r.out);
        int kernels = atoi(p + strlen("profile 2 tokens: "));
        cr_assert_gt(kernels, 3, "%s", r.out);
        int rows = 0;
        for (const char *l = strstr(p, "\n  "); l; l = strstr(l + 1, "\n  ")) {
            const char *end = strchr(l + 1, '\n'), *k = strstr(l, "  linear ");
            const char *o = strstr(l, "  op ");
            rows += (k && (!end || k < end)) || (o && (!end || o < end));
        }
        cr_assert_geq(rows, kernels, "a row a kernel:\n%s", p);
    }
    kt_cli_free(&r);
}

/* On a GPU (here the stand-in driver, whose kernels do nothing) the cold
 * start gives the model's open, the weights' rate and the load's bytes,
 * readers and staging, in text and in --json; the open counts in the
 * total. */
Test(cli_plan_run, run_reports_the_weight_load, .timeout = 300)
{
    setenv("KILN_LIBCUDA", KT_FAKE_LIBCUDA, 1);
    setenv("KT_FAKE_CUDA", "device", 1);
    setenv("KILN_NVRTC", KT_FAKE_NVRTC, 1);
    setenv("KILN_LOAD_THREADS", "2", 1);
    kt_cli r = kt_cli_run("run demo --eager --capture 1 --max-tokens 4 --tokens 1 --steps 1");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "on fake sm_90 device (sm_90a)"), "%s", r.out);
    cr_assert(strstr(r.out, " GB/s), graph instantiate "), "%s", r.out);
    double total = -1, open = -1;
    const char *c = strstr(r.out, "cold start ");
    cr_assert(c && sscanf(c, "cold start %lf ms: model open %lf, plan ", &total, &open) == 2,
              "%s", r.out);
    cr_assert(open >= 0 && open <= total, "%s", r.out);
    const char *w = strstr(r.out, "weights load ");
    cr_assert(w && strstr(w, " GB/s to the device): "), "%s", r.out);
    cr_assert(strstr(w, " packed on the host, 2 readers, pinned staging; "), "%s", r.out);
    cr_assert(strstr(w, " packed on the device in "), "%s", r.out);
    cr_assert(strstr(w, "; peak host memory "), "%s", r.out);
    kt_cli_free(&r);
    r = kt_cli_run("run demo --eager --capture 1 --max-tokens 4 --tokens 1 --steps 1 --json");
    cr_assert_eq(r.status, 0, "%s", r.err);
    static const char *keys[] = { "\"open_s\": ", "\"weights_gb_s\": ", "\"load_gb_s\": ",
                                  "\"load_read_bytes\": ", "\"load_copied_bytes\": ",
                                  "\"load_packed_bytes\": ", "\"load_threads\": 2",
                                  "\"load_pinned\": true", "\"load_device_packed_bytes\": ",
                                  "\"load_device_pack_s\": ", "\"peak_host_bytes\": " };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        cr_assert(strstr(r.out, keys[i]), "no %s in %s", keys[i], r.out);
    kt_cli_free(&r);
}

Test(cli_plan_run, run_usage_errors)
{
    static const char *usage[] = { "run", "run demo --device gpu", "run demo --device cuda:x",
                                   "run demo --steps 0", "run demo --target sm_1",
                                   "run demo --tokens", "run demo --capture 0",
                                   "run demo --strict-backend",
                                   "run demo --target sm_80 --target sm_90a" };
    for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
        kt_cli r = kt_cli_run(usage[i]);
        cr_assert_eq(r.status, 2, "%s exited %d", usage[i], r.status);
        cr_assert(strstr(r.err, "usage: kiln run"), "%s: %s", usage[i], r.err);
        kt_cli_free(&r);
    }
}

/* kiln tune on the stand-in driver, whose kernels do nothing and whose
 * events all read 1 us: every candidate ties, and a tie keeps the
 * heuristic's variant; each bucket's step ties too, and keeps its overlap.
 * The table is stored all the same, and kiln plan --cache marks the
 * variants it chose and names the launch policies. */
Test(cli_plan_run, tune_stores_a_table_plan_reads, .timeout = 300)
{
    setenv("KILN_LIBCUDA", KT_FAKE_LIBCUDA, 1);
    setenv("KT_FAKE_CUDA", "device", 1);
    setenv("KILN_NVRTC", KT_FAKE_NVRTC, 1);
    char cache[128], cmd[256];
    snprintf(cache, sizeof cache, "%s/tuned.kiln", dir);
    snprintf(cmd, sizeof cmd, "tune demo --capture 1,16,256 --reps 3 --cache %s", cache);
    kt_cli r = kt_cli_run(cmd);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "tune: demo on sm_90a: "), "%s", r.out);
    cr_assert(strstr(r.out, "wgmma bf16 1536x512 bf16 none "), "%s", r.out);
    cr_assert(strstr(r.out, "\n0 of "), "ties keep the heuristic's:\n%s", r.out);
    cr_assert(strstr(r.out, " choices differ from the heuristic's\n"), "%s", r.out);
    cr_assert(strstr(r.out, "tokens  kernels    overlap us    serial us  launches\n"), "%s", r.out);
    cr_assert(strstr(r.out, "\n16      "), "a row for each bucket:\n%s", r.out);
    cr_assert(strstr(r.out, "\n0 of 2 buckets run serial (1 with no launch that may overlap "
                            "left out)\nstored in "),
              "the prefill bucket is not timed:\n%s", r.out);
    cr_assert_null(strstr(r.out, "\n256     "), "%s", r.out);
    cr_assert(strstr(r.err, "tune: round 1 of "), "%s", r.err);
    cr_assert(strstr(r.err, "tune: the whole step of each bucket, kernels overlapping\n"), "%s",
              r.err);
    kt_cli_free(&r);
    snprintf(cmd, sizeof cmd, "plan demo --capture 1,16,256 --cache %s", cache);
    r = kt_cli_run(cmd);
    cr_assert_eq(r.status, 0, "%s", r.err);
    const char *gate = strstr(r.out, "blk.0.ffn_gate");
    cr_assert(gate && strstr(gate, "wgmma    tma_bm"), "%s", r.out);
    cr_assert(strstr(r.out, "256-256   wgmma    tma_bm64bn128*  bf16 "), "a tuned variant is "
              "marked:\n%s", r.out);
    cr_assert(strstr(r.out, "gemv_tc  tc1             bf16"), "decode is not tuned:\n%s", r.out);
    cr_assert(strstr(r.out, "launches (tuned): 1 overlap 16 overlap;"), "%s", r.out);
    kt_cli_free(&r);
    /* --json: one row per kernel and bucket */
    snprintf(cmd, sizeof cmd, "tune demo --capture 16,256 --reps 1 --cache %s --json", cache);
    r = kt_cli_run(cmd);
    cr_assert_eq(r.status, 0, "%s", r.err);
    json_error_t e;
    json_t *root = json_loads(r.out, 0, &e);
    cr_assert_not_null(root, "%s: %s", e.text, r.out);
    json_t *rows = json_object_get(root, "kernels");
    cr_assert_gt(json_array_size(rows), 3);
    json_t *row = json_array_get(rows, 0);
    cr_assert_eq(json_integer_value(json_object_get(row, "tokens")), 256);
    cr_assert_str_eq(json_string_value(json_object_get(row, "variant")),
                     json_string_value(json_object_get(row, "heuristic")));
    for (size_t i = 0; i < json_array_size(rows); i++)
        cr_assert(!strncmp(json_string_value(json_object_get(json_array_get(rows, i), "signature")),
                           "linear ", 7), "kernels lists the linear kernels");
    rows = json_object_get(root, "steps");
    cr_assert_gt(json_array_size(rows), 0, "%s", r.out);
    row = json_array_get(rows, json_array_size(rows) - 1);
    for (size_t i = 0; i < json_array_size(rows); i++)
        cr_assert_leq(json_integer_value(json_object_get(json_array_get(rows, i), "tokens")), 16,
                      "decode buckets alone: %s", r.out);
    cr_assert_eq(json_integer_value(json_object_get(row, "tokens")), 16);
    cr_assert_str_eq(json_string_value(json_object_get(row, "launches")), "overlap");
    cr_assert(json_is_false(json_object_get(row, "outputs_differ")));
    cr_assert(!strncmp(json_string_value(json_object_get(row, "key")), "step ", 5));
    json_decref(root);
    kt_cli_free(&r);
    /* KILN_SERIAL=1: nothing overlaps, so no step is timed (and none stored) */
    setenv("KILN_SERIAL", "1", 1);
    snprintf(cmd, sizeof cmd, "tune demo --capture 16,256 --reps 1 --cache %s", cache);
    r = kt_cli_run(cmd);
    unsetenv("KILN_SERIAL");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.err, "tune: KILN_SERIAL is set, so no launch overlaps"), "%s", r.err);
    cr_assert_null(strstr(r.out, "buckets run serial"), "%s", r.out);
    cr_assert(strstr(r.out, "stored in "), "the kernels' choices are: %s", r.out);
    kt_cli_free(&r);
    /* kiln cache stat shows the table, verify checks it, salvage keeps it */
    snprintf(cmd, sizeof cmd, "cache stat %s", cache);
    r = kt_cli_run(cmd);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "tuning:   18 kernel and bucket choices measured by kiln tune, 0 "
                            "differ from the heuristic's; 2 steps' launch policies, 0 serial"),
              "%s", r.out);
    kt_cli_free(&r);
    snprintf(cmd, sizeof cmd, "cache stat %s --json", cache);
    r = kt_cli_run(cmd);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "\"tuning\": [") && strstr(r.out, "\"heuristic_us\": "), "%s",
              r.out);
    kt_cli_free(&r);
    snprintf(cmd, sizeof cmd, "cache verify %s", cache);
    r = kt_cli_run(cmd);
    cr_assert_eq(r.status, 0, "%s%s", r.out, r.err);
    kt_cli_free(&r);
    /* a byte of every copy of the table flipped: the live one, and any
     * older one on a page the second run freed */
    long n;
    char *bytes = kt_read_file(cache, &n);
    cr_assert_not_null(bytes);
    FILE *f = fopen(cache, "r+b");
    cr_assert_not_null(f);
    int copies = 0;
    for (char *at = bytes; (at = memmem(at, (size_t)(bytes + n - at), "KLNT", 4)); at += 4) {
        cr_assert(at + 40 < bytes + n);
        at[30] ^= 0x01;
        cr_assert_eq(fseek(f, at + 30 - bytes, SEEK_SET), 0);
        cr_assert_eq(fwrite(at + 30, 1, 1, f), 1);
        copies++;
    }
    cr_assert_gt(copies, 0);
    fclose(f);
    free(bytes);
    r = kt_cli_run(cmd);
    cr_assert_eq(r.status, 1, "%s%s", r.out, r.err);
    cr_assert(strstr(r.out, "tuning    ") && strstr(r.out, "the tuning table is damaged"), "%s",
              r.out);
    kt_cli_free(&r);
    /* salvage leaves the damaged table out (an intact older copy on a page
     * freed by the second run may come back), and what it writes verifies */
    snprintf(cmd, sizeof cmd, "cache salvage %s -o %s/saved.kiln", cache, dir);
    r = kt_cli_run(cmd);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, " tuning table"), "%s", r.out);
    kt_cli_free(&r);
    snprintf(cmd, sizeof cmd, "cache verify %s/saved.kiln", dir);
    r = kt_cli_run(cmd);
    cr_assert_eq(r.status, 0, "%s%s", r.out, r.err);
    kt_cli_free(&r);
    /* without a device nothing is stored */
    setenv("KT_FAKE_CUDA", "none", 1);
    r = kt_cli_run("tune demo --reps 1");
    cr_assert_eq(r.status, 1, "%s", r.err);
    cr_assert(strstr(r.err, "kiln: tune: device 0: "), "%s", r.err);
    kt_cli_free(&r);
    unsetenv("KT_FAKE_CUDA");
    unsetenv("KILN_LIBCUDA");
}

Test(cli_plan_run, tune_usage_errors)
{
    static const char *usage[] = { "tune", "tune demo --target sm_90a", "tune demo --reps 0",
                                   "tune demo --device 0", "tune demo extra", "tune demo --x" };
    for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
        kt_cli r = kt_cli_run(usage[i]);
        cr_assert_eq(r.status, 2, "%s exited %d", usage[i], r.status);
        cr_assert(strstr(r.err, "usage: kiln tune"), "%s: %s", usage[i], r.err);
        kt_cli_free(&r);
    }
}
