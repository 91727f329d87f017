/* NVRTC: every template instantiation kiln emits compiles for every
 * architecture family it targets (sm_75, sm_80, sm_89, sm_90a); compile
 * errors come back as KILN_ERR_COMPILE with the log; the pool gives the
 * serial cubins; kept sources land on disk. These tests need libnvrtc
 * (the CUDA toolkit) but no GPU, and fail when it cannot be loaded. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/emit.h"
#include "codegen/nvrtc.h"
#include "codegen_util.h"

static const char *const arches[] = { "sm_75", "sm_80", "sm_89", "sm_90a" };

static kiln_target target(const char *name)
{
    kiln_target t;
    cr_assert_eq(kiln_target_from_name(name, &t), KILN_OK, "%s", kiln_last_error());
    return t;
}

/* A batch of emitted kernels and their compile jobs. */
typedef struct batch {
    char **sig;
    kiln_kernel_source *src;
    kiln_compile_job *jobs;
    kiln_target *targets;
    int n, cap;
} batch;

static void batch_add(batch *b, const char *signature)
{
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->sig = realloc(b->sig, (size_t)b->cap * sizeof *b->sig);
        b->src = realloc(b->src, (size_t)b->cap * sizeof *b->src);
        b->jobs = realloc(b->jobs, (size_t)b->cap * sizeof *b->jobs);
        b->targets = realloc(b->targets, (size_t)b->cap * sizeof *b->targets);
        cr_assert(b->sig && b->src && b->jobs && b->targets);
    }
    kiln_kernel_source *s = &b->src[b->n];
    cr_assert_eq(kiln_emit_text(kiln_registry_default(), signature, s), KILN_OK, "%s",
                 kiln_last_error());
    b->targets[b->n] = s->desc.target;
    cr_assert_not_null(b->sig[b->n] = strdup(signature));
    b->n++;
}

/* Jobs point into src and targets, so they are made once the batch stops
 * growing. */
static void batch_jobs(batch *b)
{
    for (int i = 0; i < b->n; i++)
        b->jobs[i] = (kiln_compile_job){ .name = b->sig[i], .entry = b->src[i].desc.entry,
                                         .source = b->src[i].text, .target = &b->targets[i] };
}

static void batch_free(batch *b)
{
    for (int i = 0; i < b->n; i++) {
        kiln_kernel_source_free(&b->src[i]);
        kiln_compile_job_reset(&b->jobs[i]);
        free(b->sig[i]);
    }
    free(b->sig);
    free(b->src);
    free(b->jobs);
    free(b->targets);
}

/* Compile everything, fail with the first error, and report the time per
 * kernel. */
static void batch_compile(batch *b, const char *what)
{
    kiln_nvrtc *nv = kt_open_nvrtc();
    batch_jobs(b);
    double start = kiln_now();
    const kiln_nvrtc_pool quiet = { .quiet = 1 };
    kiln_status st = kiln_nvrtc_compile_all(nv, b->jobs, b->n, &quiet);
    double wall = kiln_now() - start;
    cr_assert_eq(st, KILN_OK, "%s", kiln_last_error());
    double sum = 0, max = 0;
    for (int i = 0; i < b->n; i++) {
        cr_assert_eq(b->jobs[i].status, KILN_OK);
        cr_assert_gt(b->jobs[i].cubin_size, 0);
        sum += b->jobs[i].seconds;
        if (b->jobs[i].seconds > max)
            max = b->jobs[i].seconds;
    }
    fprintf(stderr, "%s: %d kernels in %.1f s wall, %.2f s mean, %.2f s max per kernel\n", what,
            b->n, wall, sum / b->n, max);
    kiln_nvrtc_close(nv);
}

static char *linear_sig(char *buf, size_t size, const char *variant, kiln_format f, unsigned epi,
                        int64_t n, const char *arch)
{
    const kiln_format_info *fi = kiln_format_get(f);
    /* K past whole tiles where the format allows it: the tail paths too. */
    int64_t k = 3 * (int64_t)(fi->k_multiple > 128 ? fi->k_multiple : 128);
    if (fi->k_multiple == 1)
        k += 7;
    return kt_linear_sig(buf, size, "simt", variant, f, "bf16", n, k, epi, arch);
}

/* ------------------------------------------------------------- loading */

Test(nvrtc, version_names_the_library)
{
    kiln_nvrtc *nv = kt_open_nvrtc();
    int major = 0, minor = -1;
    cr_assert_eq(sscanf(kiln_nvrtc_version(nv), "nvrtc %d.%d", &major, &minor), 2, "%s",
                 kiln_nvrtc_version(nv));
    cr_assert_geq(major, 12);
    cr_assert_geq(minor, 0);
    cr_assert(strstr(kiln_nvrtc_library(nv), "nvrtc"), "%s", kiln_nvrtc_library(nv));
    kiln_nvrtc_close(nv);
    kiln_nvrtc_close(NULL);
}

Test(nvrtc, kiln_nvrtc_missing_file_is_not_found)
{
    setenv("KILN_NVRTC", "/nonexistent/libnvrtc.so.99", 1);
    kiln_nvrtc *nv = NULL;
    cr_assert_eq(kiln_nvrtc_open(&nv), KILN_ERR_NOT_FOUND);
    cr_assert_null(nv);
    cr_assert(strstr(kiln_last_error(), "/nonexistent/libnvrtc.so.99"), "%s", kiln_last_error());
}

Test(nvrtc, a_library_without_nvrtc_is_unsupported)
{
    setenv("KILN_NVRTC", "libm.so.6", 1);
    kiln_nvrtc *nv = NULL;
    cr_assert_eq(kiln_nvrtc_open(&nv), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "nvrtcVersion"), "%s", kiln_last_error());
}

Test(nvrtc, options_name_the_architecture)
{
    char buf[256];
    kiln_target t = target("h100");
    kiln_nvrtc_options(&t, buf, sizeof buf);
    cr_assert_str_eq(buf, "--gpu-architecture=sm_90a -default-device -std=c++17 -lineinfo");
}

/* --------------------------------------------------- every instantiation */

/* sig with its scales field naming a group of 128 along K, which a
 * grouped format's kernel takes as a template argument. */
static const char *in_groups_of_128(char *sig, size_t size)
{
    char *at = strstr(sig, "scales=x ");
    cr_assert_not_null(at, "%s", sig);
    char rest[512];
    snprintf(rest, sizeof rest, "%s", at + strlen("scales=x"));
    snprintf(at, size - (size_t)(at - sig), "scales=f32:1x128%s", rest);
    return sig;
}

/* Every format, each with two tile variants and an epilogue per variant,
 * rotating through all five fusions so every arch sees each of them; N is
 * not a multiple of any tile, so the edge paths are compiled too. A
 * grouped format's first kernel has one group per row, its second groups
 * of 128 along K. */
static void add_linears(batch *b, const char *arch)
{
    static const unsigned epilogues[] = {
        0, KILN_EPI_BIAS, KILN_EPI_BIAS | KILN_EPI_RESIDUAL, KILN_EPI_SILU_MUL,
        KILN_EPI_BIAS | KILN_EPI_SILU_MUL,
    };
    static const char *const variants[] = { "t16x64", "t64x64", "t128x128" };
    char sig[512];
    for (int f = 0; f < KILN_FMT_COUNT; f++)
        for (int v = 0; v < 2; v++) {
            linear_sig(sig, sizeof sig, variants[(f + v) % 3], (kiln_format)f,
                       epilogues[(2 * f + v) % 5], 1000 + f, arch);
            batch_add(b, v && kiln_format_get((kiln_format)f)->grouped ? in_groups_of_128(sig, sizeof sig)
                                                                        : sig);
        }
}

Test(nvrtc, every_format_compiles_for_sm_75, .timeout = 600)
{
    batch b = { 0 };
    add_linears(&b, "sm_75");
    batch_compile(&b, "sm_75 linears");
    batch_free(&b);
}

Test(nvrtc, every_format_compiles_for_sm_80, .timeout = 600)
{
    batch b = { 0 };
    add_linears(&b, "sm_80");
    batch_compile(&b, "sm_80 linears");
    batch_free(&b);
}

Test(nvrtc, every_format_compiles_for_sm_89, .timeout = 600)
{
    batch b = { 0 };
    add_linears(&b, "sm_89");
    batch_compile(&b, "sm_89 linears");
    batch_free(&b);
}

Test(nvrtc, every_format_compiles_for_sm_90a, .timeout = 600)
{
    batch b = { 0 };
    add_linears(&b, "sm_90a");
    batch_compile(&b, "sm_90a linears");
    batch_free(&b);
}

Test(nvrtc, every_variant_compiles, .timeout = 600)
{
    static const char *const variants[] = { "t16x64", "t64x64", "t128x128" };
    batch b = { 0 };
    char sig[512];
    for (size_t v = 0; v < KILN_ARRAY_LEN(variants); v++)
        batch_add(&b, linear_sig(sig, sizeof sig, variants[v], KILN_FMT_Q6_K,
                                 KILN_EPI_BIAS | KILN_EPI_RESIDUAL, 4096, "sm_90a"));
    batch_compile(&b, "variants");
    batch_free(&b);
}

/* Every op kernel and every quantizer, on every arch; widths that are not
 * multiples of the group sizes take the partial-group paths (bf16-tc, which
 * reorders whole groups of 16, takes one of those and refuses the rest). */
Test(nvrtc, every_aux_kernel_compiles, .timeout = 600)
{
    static const char *const ops[] = { "add", "mul", "silu", "gelu", "rms_norm" };
    batch b = { 0 };
    char sig[256];
    for (size_t a = 0; a < KILN_ARRAY_LEN(arches); a++) {
        for (size_t o = 0; o < KILN_ARRAY_LEN(ops); o++) {
            snprintf(sig, sizeof sig, "op %s width=4100 target=%s", ops[o], arches[a]);
            batch_add(&b, sig);
        }
        for (int act = KILN_ACT_BF16 + 1; act < KILN_ACT_COUNT; act++) {
            const int whole = act == KILN_ACT_BF16_TC;
            snprintf(sig, sizeof sig, "quant act=%s k=%d target=%s", kiln_act_name((kiln_act)act),
                     whole ? 4112 : 4100, arches[a]);
            batch_add(&b, sig);
        }
        kiln_kernel_source s;
        snprintf(sig, sizeof sig, "quant act=bf16-tc k=4100 target=%s", arches[a]);
        cr_assert_eq(kiln_emit_text(kiln_registry_default(), sig, &s), KILN_ERR_UNSUPPORTED);
        cr_assert(strstr(kiln_last_error(), "k=4100: bf16-tc reorders whole groups of 16"), "%s",
                  kiln_last_error());
    }
    batch_compile(&b, "aux kernels");
    batch_free(&b);
}

/* The device traits agree with the format table: a drift between
 * kernels/common/dequant.cuh and graph/format.c is a compile error. */
Test(nvrtc, format_traits_match_the_format_table)
{
    char src[8192];
    int n = snprintf(src, sizeof src, "#include \"kiln/dequant.cuh\"\n");
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        const kiln_format_info *fi = kiln_format_get((kiln_format)f);
        /* A grouped format's traits take the group and N. */
        const char *args = fi->grouped ? "<128, 7>" : "";
        n += snprintf(src + n, sizeof src - (size_t)n,
                      "static_assert(kiln::fmt_%s%s::block == %d && kiln::fmt_%s%s::block_bytes == %d"
                      " && %d %% kiln::fmt_%s%s::chunk == 0, \"%s\");\n",
                      fi->name, args, fi->block, fi->name, args, fi->block_bytes, fi->block,
                      fi->name, args, fi->name);
    }
    cr_assert_lt((size_t)n, sizeof src);
    kiln_nvrtc *nv = kt_open_nvrtc();
    kiln_target t = target("sm_75");
    kiln_compile_job job = { .name = "format traits", .entry = "traits", .source = src,
                             .target = &t };
    cr_assert_eq(kiln_nvrtc_compile(nv, &job, NULL), KILN_OK, "%s", kiln_last_error());
    kiln_compile_job_reset(&job);
    kiln_nvrtc_close(nv);
}

/* ------------------------------------------------------------- failures */

static const char broken_source[] =
    "#include \"kiln/kiln_types.cuh\"\n"
    "extern \"C\" __global__ void broken(float *y) { y[0] = undeclared_name; }\n";

Test(nvrtc, a_broken_source_is_a_compile_error_with_the_log)
{
    kiln_nvrtc *nv = kt_open_nvrtc();
    kiln_target t = target("sm_80");
    kiln_compile_job job = { .name = "linear backend=broken", .entry = "kiln_broken",
                             .source = broken_source, .target = &t };
    cr_assert_eq(kiln_nvrtc_compile(nv, &job, NULL), KILN_ERR_COMPILE);
    cr_assert_eq(job.status, KILN_ERR_COMPILE);
    const char *msg = kiln_last_error();
    cr_assert(strstr(msg, "linear backend=broken"), "%s", msg);
    cr_assert(strstr(msg, "sm_80"), "%s", msg);
    cr_assert(strstr(msg, "undeclared_name"), "the log is in the message: %s", msg);
    cr_assert(strstr(job.log, "kiln_broken.cu"), "%s", job.log);
    cr_assert(strstr(job.log, "undeclared_name"), "%s", job.log);
    cr_assert_str_eq(job.message, msg);
    cr_assert_null(job.cubin);
    kiln_compile_job_reset(&job);
    kiln_nvrtc_close(nv);
}

Test(nvrtc, an_unknown_architecture_is_a_compile_error)
{
    kiln_nvrtc *nv = kt_open_nvrtc();
    kiln_target t = { .name = "sm_12", .sm = 12 };
    kiln_compile_job job = { .name = "op add width=8 target=sm_12", .entry = "kiln_add",
                             .source = "extern \"C\" __global__ void k() {}\n", .target = &t };
    cr_assert_eq(kiln_nvrtc_compile(nv, &job, NULL), KILN_ERR_COMPILE);
    cr_assert(strstr(kiln_last_error(), "NVRTC_ERROR_INVALID_OPTION"), "%s", kiln_last_error());
    kiln_compile_job_reset(&job);
    kiln_nvrtc_close(nv);
}

Test(nvrtc, compile_rejects_incomplete_jobs)
{
    kiln_nvrtc *nv = kt_open_nvrtc();
    kiln_compile_job job = { .name = "x", .entry = "x" };
    cr_assert_eq(kiln_nvrtc_compile(nv, &job, NULL), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_nvrtc_compile_all(NULL, &job, 1, NULL), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_nvrtc_compile_all(nv, NULL, 1, NULL), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_nvrtc_compile_all(nv, NULL, 0, NULL), KILN_OK);
    kiln_nvrtc_close(nv);
}

Test(nvrtc, the_pool_runs_every_job_and_reports_the_first_failure)
{
    kiln_nvrtc *nv = kt_open_nvrtc();
    kiln_target t = target("sm_89");
    static const char good[] = "extern \"C\" __global__ void good(float *y) { y[0] = 1.0f; }\n";
    kiln_compile_job jobs[5];
    for (int i = 0; i < 5; i++) {
        int broken = i == 1 || i == 3;
        jobs[i] = (kiln_compile_job){ .name = i == 1 ? "first broken" : broken ? "second" : "good",
                                      .entry = "k", .source = broken ? broken_source : good,
                                      .target = &t };
    }
    const kiln_nvrtc_pool two = { .threads = 2, .quiet = 1 };
    kiln_status st = kiln_nvrtc_compile_all(nv, jobs, 5, &two);
    cr_assert_eq(st, KILN_ERR_COMPILE);
    cr_assert(strstr(kiln_last_error(), "2 of 5 kernels failed"), "%s", kiln_last_error());
    cr_assert(strstr(kiln_last_error(), "first broken"), "%s", kiln_last_error());
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(jobs[i].status, i == 1 || i == 3 ? KILN_ERR_COMPILE : KILN_OK, "job %d", i);
        cr_assert_eq(jobs[i].cubin != NULL, !(i == 1 || i == 3));
        kiln_compile_job_reset(&jobs[i]);
    }
    /* A single failure comes back as it is. */
    jobs[0] = (kiln_compile_job){ .name = "only broken", .entry = "k", .source = broken_source,
                                  .target = &t };
    cr_assert_eq(kiln_nvrtc_compile_all(nv, jobs, 1, NULL), KILN_ERR_COMPILE);
    cr_assert(!strstr(kiln_last_error(), "kernels failed"), "%s", kiln_last_error());
    cr_assert(strstr(kiln_last_error(), "only broken"), "%s", kiln_last_error());
    kiln_compile_job_reset(&jobs[0]);
    kiln_nvrtc_close(nv);
}

/* ------------------------------------------------------------ the pool */

Test(nvrtc, parallel_compiles_give_the_serial_cubins, .timeout = 600)
{
    batch b = { 0 };
    char sig[512];
    for (int f = KILN_FMT_F16; f < KILN_FMT_F16 + 8; f++)
        batch_add(&b, linear_sig(sig, sizeof sig, "t64x64", (kiln_format)f, KILN_EPI_BIAS, 512,
                                 "sm_90a"));
    kiln_nvrtc *nv = kt_open_nvrtc();
    batch_jobs(&b);
    const kiln_nvrtc_pool one = { .threads = 1, .quiet = 1 };
    const kiln_nvrtc_pool four = { .threads = 4, .quiet = 1 };
    cr_assert_eq(kiln_nvrtc_compile_all(nv, b.jobs, b.n, &one), KILN_OK, "%s", kiln_last_error());
    kiln_compile_job serial[8];
    memcpy(serial, b.jobs, sizeof serial);
    batch_jobs(&b); /* fresh jobs; the serial outputs stay in `serial` */
    cr_assert_eq(kiln_nvrtc_compile_all(nv, b.jobs, b.n, &four), KILN_OK, "%s", kiln_last_error());
    for (int i = 0; i < b.n; i++) {
        cr_assert_eq(b.jobs[i].cubin_size, serial[i].cubin_size, "job %d", i);
        cr_assert_eq(memcmp(b.jobs[i].cubin, serial[i].cubin, serial[i].cubin_size), 0, "job %d",
                     i);
        kiln_compile_job_reset(&serial[i]);
    }
    kiln_nvrtc_close(nv);
    batch_free(&b);
}

/* On a terminal the pool shows done/total and an ETA on one line; told to
 * be quiet it writes nothing. */
static void compile_on_a_terminal(int quiet, char *out, size_t size)
{
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    cr_assert_geq(master, 0);
    cr_assert_eq(grantpt(master), 0);
    cr_assert_eq(unlockpt(master), 0);
    int term = open(ptsname(master), O_RDWR | O_NOCTTY);
    cr_assert_geq(term, 0);
    int saved = dup(STDERR_FILENO);
    cr_assert_eq(dup2(term, STDERR_FILENO), STDERR_FILENO);

    kiln_nvrtc *nv = kt_open_nvrtc();
    kiln_target t = target("sm_80");
    kiln_compile_job jobs[3];
    for (int i = 0; i < 3; i++)
        jobs[i] = (kiln_compile_job){ .name = "tiny", .entry = "k", .target = &t,
                                      .source = "extern \"C\" __global__ void k() {}\n" };
    const kiln_nvrtc_pool o = { .threads = 2, .quiet = quiet };
    kiln_status st = kiln_nvrtc_compile_all(nv, jobs, 3, &o);
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(term);
    cr_assert_eq(st, KILN_OK, "%s", kiln_last_error());
    for (int i = 0; i < 3; i++)
        kiln_compile_job_reset(&jobs[i]);
    kiln_nvrtc_close(nv);

    size_t used = 0;
    struct pollfd pfd = { .fd = master, .events = POLLIN };
    while (used + 1 < size && poll(&pfd, 1, 200) > 0) {
        ssize_t n = read(master, out + used, size - 1 - used);
        if (n <= 0)
            break;
        used += (size_t)n;
    }
    out[used] = '\0';
    close(master);
}

Test(nvrtc, a_terminal_sees_progress)
{
    char out[4096];
    compile_on_a_terminal(0, out, sizeof out);
    cr_assert(strstr(out, "compiling kernels: 1/3"), "%s", out);
    cr_assert(strstr(out, "compiling kernels: 3/3"), "%s", out);
    cr_assert(strstr(out, "ETA"), "%s", out);
    compile_on_a_terminal(1, out, sizeof out);
    cr_assert_str_eq(out, "");
}

/* Off a terminal (a CI log) progress is whole lines, the last at the end;
 * each job reaches on_done as it finishes. */
static char *read_whole(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    char *text = calloc(1, 65536);
    cr_assert_not_null(text);
    size_t n = fread(text, 1, 65535, f);
    text[n] = '\0';
    fclose(f);
    return text;
}

static void count_done(void *ctx, int i, kiln_compile_job *job)
{
    int *done = ctx;
    cr_assert_eq(job->status, KILN_OK, "%s", job->message);
    cr_assert_not_null(job->cubin);
    done[i]++;
}

Test(nvrtc, a_log_sees_progress_lines)
{
    char path[] = "/tmp/kiln-progress-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    int saved = dup(STDERR_FILENO);
    cr_assert_eq(dup2(fd, STDERR_FILENO), STDERR_FILENO);
    kiln_nvrtc *nv = kt_open_nvrtc();
    kiln_target t = target("sm_80");
    kiln_compile_job jobs[3];
    for (int i = 0; i < 3; i++)
        jobs[i] = (kiln_compile_job){ .name = "tiny", .entry = "k", .target = &t,
                                      .source = "extern \"C\" __global__ void k() {}\n" };
    int done[3] = { 0 };
    const kiln_nvrtc_pool o = { .threads = 2, .on_done = count_done, .ctx = done };
    kiln_status st = kiln_nvrtc_compile_all(nv, jobs, 3, &o);
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(fd);
    cr_assert_eq(st, KILN_OK, "%s", kiln_last_error());
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(done[i], 1, "job %d reached on_done %d times", i, done[i]);
        kiln_compile_job_reset(&jobs[i]);
    }
    kiln_nvrtc_close(nv);
    char *out = read_whole(path);
    unlink(path);
    cr_assert(strstr(out, "compiling kernels: 3/3, "), "%s", out);
    cr_assert_null(strchr(out, '\r'), "%s", out);
    cr_assert_eq(out[strlen(out) - 1], '\n', "%s", out);
    free(out);
}

/* A pool told to stop starts no job: each fails as interrupted and still
 * reaches on_done, so its caller knows what was left. */
static void count_any(void *ctx, int i, kiln_compile_job *job)
{
    int *seen = ctx;
    cr_assert_eq(job->status, KILN_ERR_STATE);
    cr_assert(strstr(job->message, "interrupted before it compiled"), "%s", job->message);
    seen[i]++;
}

Test(nvrtc, a_stopped_pool_starts_nothing)
{
    kiln_nvrtc *nv = kt_open_nvrtc();
    kiln_target t = target("sm_80");
    kiln_compile_job jobs[4];
    for (int i = 0; i < 4; i++)
        jobs[i] = (kiln_compile_job){ .name = "tiny", .entry = "k", .target = &t,
                                      .source = "extern \"C\" __global__ void k() {}\n" };
    static volatile sig_atomic_t stop = 1;
    int seen[4] = { 0 };
    const kiln_nvrtc_pool o = { .threads = 2, .quiet = 1, .on_done = count_any, .ctx = seen,
                                .stop = &stop };
    cr_assert_eq(kiln_nvrtc_compile_all(nv, jobs, 4, &o), KILN_ERR_STATE);
    cr_assert(strstr(kiln_last_error(), "4 of 4 kernels failed"), "%s", kiln_last_error());
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(seen[i], 1);
        cr_assert_null(jobs[i].cubin);
        kiln_compile_job_reset(&jobs[i]);
    }
    kiln_nvrtc_close(nv);
}

/* ------------------------------------------------------------- keeping */

static char *temp_dir(void)
{
    char tmpl[] = "/tmp/kiln-nvrtc-XXXXXX";
    char *dir = mkdtemp(tmpl);
    cr_assert_not_null(dir);
    return strdup(dir);
}

static char *read_text(const char *dir, const char *entry, const char *ext)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s%s", dir, entry, ext);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s is missing", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = calloc(1, (size_t)n + 1);
    cr_assert_eq(fread(text, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    unlink(path);
    return text;
}

Test(nvrtc, kiln_dump_source_keeps_source_log_and_ptx)
{
    char *dir = temp_dir();
    char sub[512];
    snprintf(sub, sizeof sub, "%s/kept/sources", dir);
    setenv("KILN_DUMP_SOURCE", sub, 1);
    batch b = { 0 };
    batch_add(&b, "op gelu width=4096 target=sm_89");
    kiln_nvrtc *nv = kt_open_nvrtc();
    batch_jobs(&b);
    cr_assert_eq(kiln_nvrtc_compile_all(nv, b.jobs, b.n, NULL), KILN_OK, "%s", kiln_last_error());
    const char *entry = b.src[0].desc.entry;
    char *cu = read_text(sub, entry, ".cu");
    char *log = read_text(sub, entry, ".log");
    char *ptx = read_text(sub, entry, ".ptx");
    cr_assert_str_eq(cu, b.src[0].text);
    cr_assert_str_eq(log, b.jobs[0].log);
    char want[128];
    snprintf(want, sizeof want, ".entry %s(", entry);
    cr_assert(strstr(ptx, want), "the PTX defines %s", entry);
    free(cu), free(log), free(ptx);

    /* A failed compile keeps its source and its log. */
    kiln_target t = target("sm_89");
    kiln_compile_job job = { .name = "broken", .entry = "kiln_broken", .source = broken_source,
                             .target = &t };
    cr_assert_eq(kiln_nvrtc_compile(nv, &job, NULL), KILN_ERR_COMPILE);
    cu = read_text(sub, "kiln_broken", ".cu");
    log = read_text(sub, "kiln_broken", ".log");
    cr_assert_str_eq(cu, broken_source);
    cr_assert(strstr(log, "undeclared_name"), "%s", log);
    free(cu), free(log);
    kiln_compile_job_reset(&job);

    rmdir(sub);
    snprintf(sub, sizeof sub, "%s/kept", dir);
    rmdir(sub);
    cr_assert_eq(rmdir(dir), 0, "every kept file was read and removed");
    free(dir);
    kiln_nvrtc_close(nv);
    batch_free(&b);
}

Test(nvrtc, keeping_into_a_file_is_an_io_error)
{
    char *dir = temp_dir();
    char file[512];
    snprintf(file, sizeof file, "%s/plain", dir);
    FILE *f = fopen(file, "w");
    cr_assert_not_null(f);
    fclose(f);
    kiln_nvrtc *nv = kt_open_nvrtc();
    kiln_target t = target("sm_75");
    kiln_compile_job job = { .name = "good", .entry = "kiln_good",
                             .source = "extern \"C\" __global__ void k() {}\n", .target = &t };
    cr_assert_eq(kiln_nvrtc_compile(nv, &job, file), KILN_ERR_IO);
    cr_assert(strstr(kiln_last_error(), file), "%s", kiln_last_error());
    cr_assert_null(job.cubin);
    kiln_compile_job_reset(&job);
    /* A compile error stays the error when keeping fails too. */
    job = (kiln_compile_job){ .name = "broken", .entry = "kiln_broken", .source = broken_source,
                              .target = &t };
    cr_assert_eq(kiln_nvrtc_compile(nv, &job, file), KILN_ERR_COMPILE);
    cr_assert(strstr(kiln_last_error(), "undeclared_name"), "%s", kiln_last_error());
    kiln_compile_job_reset(&job);
    kiln_nvrtc_close(nv);
    unlink(file);
    rmdir(dir);
    free(dir);
}
