/* The fault sweep (tests/util/fault.h) over the GPU session: create from a
 * warm cache, run, reload a weight in place, run again, destroy. Skipped,
 * with the reason, where there is no GPU. */
#include "fault.h"

#include <criterion/criterion.h>
#include <string.h>

enum { MAX_TOKENS = 64 };

typedef struct session_ctx {
    kiln_graph *g;
    kiln_session_options o;
    const kiln_qtensor *reload; /* set_weight's new values, of output.weight's format and shape */
    float x[MAX_TOKENS * KT_D_MODEL];
    float head[MAX_TOKENS * KT_D_HEAD], stream[MAX_TOKENS * KT_D_MODEL];
} session_ctx;

static kiln_status session_run(session_ctx *c, kiln_session *s, int64_t m, kt_digest *d)
{
    const float *in[] = { c->x };
    float *out[] = { c->head, c->stream };
    kiln_status st = kiln_session_run(s, m, in, out);
    kt_dig(d, c->head, (size_t)m * KT_D_HEAD * sizeof(float));
    kt_dig(d, c->stream, (size_t)m * KT_D_MODEL * sizeof(float));
    return st;
}

static kiln_status scenario_session(void *ctx, kt_digest *d)
{
    session_ctx *c = ctx;
    kiln_session *s;
    kiln_status st = kiln_session_create(c->g, &c->o, &s);
    if (st)
        return st;
    if (!(st = session_run(c, s, 3, d)) && !(st = session_run(c, s, MAX_TOKENS, d)) &&
        !(st = kiln_session_set_weight(s, "output.weight", c->reload)))
        st = session_run(c, s, 3, d);
    kiln_session_stats stats;
    kiln_session_get_stats(s, &stats);
    kt_dig_int(d, stats.kernels);
    kt_dig_int(d, stats.compiled);
    kiln_session_destroy(s);
    return st;
}

/* A bucket for the decode kernels and one for prefill; offline, from a
 * cache the first session filled. */
Test(fault, gpu_session, .timeout = 1200)
{
    static const int64_t capture[] = { 1, MAX_TOKENS };
    static kt_model m;
    static session_ctx c;
    static char cache[256];
    kt_need_gpu();
    kt_fresh_cache(cache, sizeof cache);
    kt_model_make(&m);
    kt_rng r = kt_rng_new(22);
    kt_fill_normal(&r, c.x, MAX_TOKENS * KT_D_MODEL, 1.0f);
    kt_weight reload;
    kt_weight_make(&reload, &r, KILN_FMT_NVFP4, KT_D_HEAD, KT_D_MODEL);
    c.reload = &reload.q;
    c.o = (kiln_session_options){ .cache.path = cache, .quiet = 1,
                                  .plan = { .capture = capture, .n_capture = 2 } };
    cr_assert_eq(kt_model_graph(&m, &c.g), KILN_OK, "%s", kiln_last_error());
    kiln_session *s;
    cr_assert_eq(kiln_session_create(c.g, &c.o, &s), KILN_OK, "%s", kiln_last_error());
    kiln_session_destroy(s);
    c.o.cache.offline = 1;
    kt_sweep(&(kt_scenario){ .name = "session", .run = scenario_session, .ctx = &c });
    kiln_graph_destroy(c.g);
    kt_weight_free(&reload);
    kt_model_free(&m);
}
