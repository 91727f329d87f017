#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const cli_command *const commands[] = {
    &cli_cmd_formats,
    &cli_cmd_demo,
    &cli_cmd_inspect,
    &cli_cmd_plan,
    &cli_cmd_compile,
    &cli_cmd_cache,
    &cli_cmd_run,
    &cli_cmd_tune,
};

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kiln [--help] [--version] COMMAND [ARGS]\n"
            "\n"
            "kiln compiles quantized linear layers ahead of time and runs them.\n"
            "\n"
            "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i]->name, commands[i]->summary);
    fprintf(out, "\n'kiln COMMAND --help' describes a command.\n");
}

/* The command runs on one thread: one pending message is enough. */
static char cli_detail[1024];

const char *cli_printable(const char *s, char *buf, size_t size)
{
    size_t n = 0;
    for (; *s && n + 5 <= size; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c == 0x7f)
            n += (size_t)snprintf(buf + n, size - n, "\\x%02x", c);
        else
            buf[n++] = (char)c;
    }
    buf[n] = '\0';
    return buf;
}

int cli_fail(kiln_status st, const char *what)
{
    const char *detail = cli_detail[0] ? cli_detail : kiln_last_error();
    char safe[sizeof cli_detail * 4];
    fprintf(stderr, "kiln: %s: %s\n", what,
            detail[0] ? cli_printable(detail, safe, sizeof safe) : kiln_strerror(st));
    cli_detail[0] = '\0';
    return CLI_FAIL;
}

kiln_status cli_error(kiln_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cli_detail, sizeof cli_detail, fmt, ap);
    va_end(ap);
    return st;
}

const char *cli_bytes(uint64_t n, char *buf, size_t size)
{
    static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
    if (n < 1024) {
        snprintf(buf, size, "%llu B", (unsigned long long)n);
        return buf;
    }
    double v = (double)n / 1024;
    int u = 0;
    while (v >= 1024 && u + 1 < (int)(sizeof units / sizeof units[0])) {
        v /= 1024;
        u++;
    }
    snprintf(buf, size, "%.1f %s", v, units[u]);
    return buf;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int cli_usage(const cli_command *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "kiln %s: ", cmd->name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    cmd->help(stderr);
    return CLI_USAGE;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int cli_parse_int(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno == ERANGE || v < lo || v > hi || !isdigit((unsigned char)s[0]))
        return -1;
    *out = v;
    return 0;
}

int cli_parse_tokens(const char *s, int64_t *out, int max, int *n)
{
    int k = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v <= 0 || v > (1 << 20) || (*end && *end != ','))
            return -1;
        if (k == max)
            return -1;
        out[k++] = v;
        p = *end ? end + 1 : end;
    }
    if (k == 0)
        return -1;
    qsort(out, (size_t)k, sizeof *out, cmp_i64);
    int w = 0;
    for (int i = 0; i < k; i++)
        if (w == 0 || out[w - 1] != out[i])
            out[w++] = out[i];
    *n = w;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
        usage(stdout);
        return CLI_OK;
    }
    if (!strcmp(name, "--version")) {
        printf("kiln %s\n", kiln_version());
        return CLI_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(name, commands[i]->name))
            continue;
        for (int a = 2; a < argc; a++)
            if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
                commands[i]->help(stdout);
                return CLI_OK;
            }
        return commands[i]->run(argc - 1, argv + 1);
    }
    fprintf(stderr, "kiln: unknown command '%s'\n\n", name);
    usage(stderr);
    return CLI_USAGE;
}
