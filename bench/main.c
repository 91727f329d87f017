/* kiln-bench: kiln's kernels and FFN stacks against cuBLAS and cuBLASLt on
 * one GPU. */
#include "bench/gpu.h"

#include <errno.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

extern char **environ;

/* bench/plot.py draws the PNG: plotting is a Python job. */
static int plot(const kiln_bench_options *o)
{
    const char *script = getenv("KILN_BENCH_PLOT");
    if (!script || !*script)
        script = KILN_BENCH_PLOT_SCRIPT;
    char *argv[] = { "python3", (char *)script, (char *)o->json, "-o", (char *)o->plot, NULL };
    pid_t pid;
    int err = posix_spawnp(&pid, "python3", NULL, NULL, argv, environ);
    int status = 0;
    if (!err && waitpid(pid, &status, 0) < 0)
        err = errno;
    if (err || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr,
                "kiln-bench: drawing %s failed (%s); the report is in %s, draw it with:\n"
                "  python3 %s %s -o %s\n",
                o->plot, err ? strerror(err) : "python3 reported an error", o->json, script,
                o->json, o->plot);
        return 1;
    }
    fprintf(stderr, "kiln-bench: drew %s\n", o->plot);
    return 0;
}

int main(int argc, char **argv)
{
    kiln_bench_options o;
    if (kiln_bench_args_parse(argc, argv, &o) != KILN_OK) {
        fprintf(stderr, "kiln-bench: %s\n\n", kiln_last_error());
        if (argc >= 2 && !strcmp(argv[1], "ffn"))
            kiln_bench_ffn_usage(stderr);
        else
            kiln_bench_usage(stderr);
        return 2;
    }
    if (o.help) {
        if (o.command == KILN_BENCH_FFN)
            kiln_bench_ffn_usage(stdout);
        else
            kiln_bench_usage(stdout);
        return 0;
    }
    int failed = o.command == KILN_BENCH_FFN ? kiln_bench_ffn(&o) : kiln_bench_gemm(&o);
    if (o.plot)
        failed |= plot(&o);
    return failed;
}
