/* The fault sweep (tests/util/fault.h) over the CPU executor: create, run
 * the shared model for 3 tokens and then 5 (the activations grow),
 * destroy. A pool that cannot start its workers runs with fewer threads
 * and the same results: those failures are absorbed. */
#include "fault.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_TOKENS = 5 };

typedef struct cpu_ctx {
    kiln_graph *g;
    float x[MAX_TOKENS * KT_D_MODEL];
    float head[MAX_TOKENS * KT_D_HEAD], stream[MAX_TOKENS * KT_D_MODEL];
} cpu_ctx;

static kiln_status scenario_cpu(void *ctx, kt_digest *d)
{
    cpu_ctx *c = ctx;
    kiln_cpu *cpu;
    kiln_status st = kiln_cpu_create(c->g, &(kiln_cpu_options){ .threads = 2 }, &cpu);
    if (st)
        return st;
    const float *in[] = { c->x };
    float *out[] = { c->head, c->stream };
    for (int m = 3; m <= MAX_TOKENS && !st; m += 2) {
        memset(c->head, 0, sizeof c->head);
        memset(c->stream, 0, sizeof c->stream);
        st = kiln_cpu_run(cpu, m, in, out);
        kt_dig(d, c->head, (size_t)m * KT_D_HEAD * sizeof(float));
        kt_dig(d, c->stream, (size_t)m * KT_D_MODEL * sizeof(float));
    }
    kiln_cpu_destroy(cpu);
    return st;
}

Test(fault, cpu_executor)
{
    static kt_model m;
    static cpu_ctx c;
    kt_rng r = kt_rng_new(20);
    kt_fill_normal(&r, c.x, MAX_TOKENS * KT_D_MODEL, 1.0f);
    kt_model_make(&m);
    cr_assert_eq(kt_model_graph(&m, &c.g), KILN_OK, "%s", kiln_last_error());
    kt_sweep(&(kt_scenario){ .name = "cpu", .run = scenario_cpu, .ctx = &c });
    kiln_graph_destroy(c.g);
    kt_model_free(&m);
}
