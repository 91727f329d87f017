#include "clirun.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

char *kt_read_file(const char *path, long *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len)
            *len = n;
    }
    return buf;
}

kt_cli kt_cli_run(const char *args)
{
    kt_cli r = { .status = -1 };
    const char *cli = getenv("KILN_CLI");
    if (!cli)
        cli = "kiln";
    char out[] = "/tmp/kiln-cli-out-XXXXXX", err[] = "/tmp/kiln-cli-err-XXXXXX";
    int fo = mkstemp(out), fe = mkstemp(err);
    if (fo < 0 || fe < 0)
        return r;
    close(fo);
    close(fe);
    size_t len = strlen(cli) + strlen(args) + strlen(out) + strlen(err) + 32;
    char *cmd = malloc(len);
    snprintf(cmd, len, "'%s' %s >%s 2>%s", cli, args, out, err);
    int st = system(cmd);
    free(cmd);
    if (st != -1 && WIFEXITED(st))
        r.status = WEXITSTATUS(st);
    r.out = kt_read_file(out, NULL);
    r.err = kt_read_file(err, NULL);
    unlink(out);
    unlink(err);
    return r;
}

void kt_cli_free(kt_cli *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}
