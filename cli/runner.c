#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

kiln_status cli_exec_run(cli_exec *e, int64_t m, const float *const *in, float *const *out)
{
    return e->gpu ? kiln_session_run(e->gpu, m, in, out) : kiln_cpu_run(e->cpu, m, in, out);
}

/* splitmix64 from a fixed seed per input: the same numbers on every
 * machine, and uniform so no libm call shapes them. */
void cli_fill_input(int input, int64_t m, int64_t width, float *x)
{
    uint64_t s = 0x696e707574ull + (uint64_t)input;
    for (int64_t i = 0; i < m * width; i++) {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        x[i] = (float)((double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Buffers for every input and output of g at m tokens. */
typedef struct io {
    float **in, **out;
    int n_in, n_out;
} io;

static void io_free(io *b)
{
    for (int i = 0; b->in && i < b->n_in; i++)
        free(b->in[i]);
    for (int i = 0; b->out && i < b->n_out; i++)
        free(b->out[i]);
    free(b->in);
    free(b->out);
}

static kiln_status io_alloc(kiln_graph *g, int64_t m, io *b)
{
    memset(b, 0, sizeof *b);
    b->n_in = kiln_graph_n_inputs(g);
    b->n_out = kiln_graph_n_outputs(g);
    b->in = calloc((size_t)b->n_in + 1, sizeof *b->in);
    b->out = calloc((size_t)b->n_out + 1, sizeof *b->out);
    int ok = b->in && b->out;
    for (int i = 0; ok && i < b->n_in; i++) {
        int64_t w = kiln_tensor_ne(kiln_graph_input_at(g, i), 0);
        ok = (b->in[i] = malloc((size_t)(m * w) * sizeof(float))) != NULL;
        if (ok)
            cli_fill_input(i, m, w, b->in[i]);
    }
    for (int i = 0; ok && i < b->n_out; i++)
        ok = (b->out[i] = malloc((size_t)(m * kiln_tensor_ne(kiln_graph_output_at(g, i), 0)) *
                                 sizeof(float))) != NULL;
    if (!ok) {
        io_free(b);
        return cli_error(KILN_ERR_NOMEM, "activations for %lld tokens", (long long)m);
    }
    return KILN_OK;
}

int cli_run_table(const char *cmd, cli_exec *e, kiln_graph *g, const int64_t *tokens,
                  int n_tokens, int steps, double *first_run_s, cli_run_row *rows)
{
    if (!rows)
        printf("%-7s %-16s %-14s %s\n", "tokens", "checksum (sum)", "mean |y|",
               "time/step (median)");
    double *times = malloc((size_t)steps * sizeof *times);
    if (!times)
        return cli_fail(cli_error(KILN_ERR_NOMEM, "timings"), cmd);
    int rc = CLI_OK;
    for (int t = 0; t < n_tokens && rc == CLI_OK; t++) {
        int64_t m = tokens[t];
        io b;
        kiln_status st = io_alloc(g, m, &b);
        if (st != KILN_OK) {
            rc = cli_fail(st, cmd);
            break;
        }
        for (int s = 0; s < steps && rc == CLI_OK; s++) {
            double t0 = cli_now();
            st = cli_exec_run(e, m, (const float *const *)b.in, b.out);
            times[s] = cli_now() - t0;
            if (first_run_s && t == 0 && s == 0)
                *first_run_s = times[s];
            if (st != KILN_OK)
                rc = cli_fail(st, cmd);
        }
        if (rc == CLI_OK) {
            double sum = 0, l1 = 0;
            size_t elems = 0;
            for (int o = 0; o < b.n_out; o++) {
                size_t n = (size_t)(m * kiln_tensor_ne(kiln_graph_output_at(g, o), 0));
                for (size_t i = 0; i < n; i++) {
                    sum += b.out[o][i];
                    l1 += fabs(b.out[o][i]);
                }
                elems += n;
            }
            qsort(times, (size_t)steps, sizeof *times, cmp_double);
            if (rows)
                rows[t] = (cli_run_row){ .tokens = m, .sum = sum, .mean_abs = l1 / (double)elems,
                                         .median_s = times[steps / 2] };
            else
                printf("%-7lld %-+16.9e %-14.6e %.3f ms\n", (long long)m, sum,
                       l1 / (double)elems, times[steps / 2] * 1e3);
        }
        io_free(&b);
    }
    free(times);
    return rc;
}

int cli_run_compare(const char *cmd, cli_exec *gpu, cli_exec *cpu, kiln_graph *g, int64_t m,
                    double *max_err)
{
    io a, c;
    kiln_status st = io_alloc(g, m, &a);
    if (st == KILN_OK && (st = io_alloc(g, m, &c)) != KILN_OK)
        io_free(&a);
    if (st != KILN_OK)
        return cli_fail(st, cmd);
    if ((st = cli_exec_run(gpu, m, (const float *const *)a.in, a.out)) == KILN_OK)
        st = cli_exec_run(cpu, m, (const float *const *)c.in, c.out);
    double err = 0;
    for (int o = 0; st == KILN_OK && o < a.n_out; o++) {
        size_t n = (size_t)(m * kiln_tensor_ne(kiln_graph_output_at(g, o), 0));
        double scale = 0;
        for (size_t i = 0; i < n; i++)
            scale = fmax(scale, fabs(c.out[o][i]));
        for (size_t i = 0; i < n; i++)
            err = fmax(err, fabs((double)a.out[o][i] - c.out[o][i]) / (scale > 0 ? scale : 1));
    }
    io_free(&a);
    io_free(&c);
    if (st != KILN_OK)
        return cli_fail(st, cmd);
    *max_err = err;
    return CLI_OK;
}
