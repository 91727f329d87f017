/* A session's entry points (kiln_session_n_entries, _entry, _find_entry,
 * _run_entry) with no GPU: the stand-in driver (tests/harness/
 * fake_libcuda.c) counts the kernels a run launches and copies rows with
 * memcpy, so each entry is seen to launch its own steps and no others, to
 * read only its inputs and to write only its output's rows. Their numbers
 * are tests/gpu/test_session.c's. */
#include "fault.h"
#include "kiln.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef KT_FAKE_LIBCUDA
#error "tests/CMakeLists.txt defines KT_FAKE_LIBCUDA"
#endif

TestSuite(entry, .init = kt_tmp_setup, .fini = kt_tmp_teardown, .timeout = 120);


static long launches(void)
{
    void *lib = dlopen(KT_FAKE_LIBCUDA, RTLD_NOW | RTLD_NOLOAD);
    cr_assert_not_null(lib, "the stand-in driver is not loaded");
    long (*count)(void);
    *(void **)&count = dlsym(lib, "kt_fake_cuda_launches");
    cr_assert_not_null(count);
    long n = count();
    dlclose(lib);
    return n;
}

enum { D = 128, F = 256, N1 = 64, N2 = 96, MAX_M = 64 };

typedef struct weights {
    kiln_qtensor q[5];
    uint16_t *data[5];
    float bias[N2];
} weights;

static void weight(weights *w, int i, int64_t n, int64_t k, kt_rng *r)
{
    w->data[i] = malloc((size_t)(n * k) * 2);
    cr_assert_not_null(w->data[i]);
    for (int64_t j = 0; j < n * k; j++)
        w->data[i][j] = kiln_f32_to_bf16(kt_normal(r));
    w->q[i] = (kiln_qtensor){ .format = KILN_FMT_BF16, .n = n, .k = k, .data = w->data[i] };
}

/* Three outputs: y1 = a·W1ᵀ; y2 = b·W2ᵀ + bias; y3 = down(silu(gate a) · up a),
 * the last a fused group (up takes silu_mul) followed by a linear. */
static kiln_graph *graph(weights *w)
{
    kt_rng r = kt_rng_new(3);
    weight(w, 0, N1, D, &r);
    weight(w, 1, N2, D, &r);
    weight(w, 2, F, D, &r);
    weight(w, 3, F, D, &r);
    weight(w, 4, D, F, &r);
    kt_fill_normal(&r, w->bias, N2, 1.0f);
    kiln_graph *g;
    kiln_tensor *a, *b, *t[5], *bias, *y1, *y2, *gate, *up, *act, *prod, *y3;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    cr_assert_eq(kiln_graph_input(g, "a", D, &a), KILN_OK);
    cr_assert_eq(kiln_graph_input(g, "b", D, &b), KILN_OK);
    for (int i = 0; i < 5; i++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", i + 1);
        cr_assert_eq(kiln_graph_weight(g, name, &w->q[i], &t[i]), KILN_OK, "%s", kiln_last_error());
    }
    cr_assert_eq(kiln_graph_param(g, "bias", N2, w->bias, &bias), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "y1", a, t[0], NULL, &y1), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "y2", b, t[1], bias, &y2), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "gate", a, t[2], NULL, &gate), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "up", a, t[3], NULL, &up), KILN_OK);
    cr_assert_eq(kiln_graph_silu(g, "act", gate, &act), KILN_OK);
    cr_assert_eq(kiln_graph_mul(g, "prod", act, up, &prod), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "y3", prod, t[4], NULL, &y3), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, y1), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, y2), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, y3), KILN_OK);
    return g;
}

static void weights_free(weights *w)
{
    for (int i = 0; i < 5; i++)
        free(w->data[i]);
}

static kiln_session *session(kiln_graph *g)
{
    static const int64_t capture[] = { 1, MAX_M };
    kiln_session_options o = { .eager = 1, .quiet = 1,
                                .plan = { .capture = capture, .n_capture = 2 } };
    kiln_session *s = NULL;
    cr_assert_eq(kiln_session_create(g, &o, &s), KILN_OK, "%s", kiln_last_error());
    return s;
}

/* Rows of width BF16 values stride apart, as a caller's buffer: the stand-in
 * driver's device addresses are host addresses. */
typedef struct rows {
    uint16_t *p;
    int64_t width, stride;
} rows;

static rows rows_new(int64_t width, int64_t stride, uint16_t fill)
{
    rows r = { malloc((size_t)(MAX_M * stride) * 2), width, stride };
    cr_assert_not_null(r.p);
    for (int64_t i = 0; i < MAX_M * stride; i++)
        r.p[i] = fill;
    return r;
}

static kiln_device_matrix as_matrix(const rows *r)
{
    return (kiln_device_matrix){ (uint64_t)(uintptr_t)r->p, r->stride };
}

Test(entry, each_output_is_an_entry_with_the_inputs_it_reads)
{
    kt_fake_device(NULL);
    weights w;
    kiln_graph *g = graph(&w);
    kiln_session *s = session(g);
    cr_assert_eq(kiln_session_n_entries(s), 3);
    static const struct {
        const char *name;
        int64_t width;
        int n_inputs, input; /* graph input index: a 0, b 1 */
    } want[] = { { "y1", N1, 1, 0 }, { "y2", N2, 1, 1 }, { "y3", D, 1, 0 } };
    for (int i = 0; i < 3; i++) {
        kiln_entry_info e;
        cr_assert_eq(kiln_session_entry(s, i, &e), KILN_OK, "%s", kiln_last_error());
        cr_assert_str_eq(e.name, want[i].name);
        cr_assert_eq(e.width, want[i].width);
        cr_assert_eq(e.n_inputs, want[i].n_inputs, "%s", e.name);
        cr_assert_eq(e.inputs[0], want[i].input, "%s", e.name);
        int found = -1;
        cr_assert_eq(kiln_session_find_entry(s, want[i].name, &found), KILN_OK);
        cr_assert_eq(found, i);
    }
    kiln_entry_info e;
    cr_assert_eq(kiln_session_entry(s, 3, &e), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_session_entry(s, -1, &e), KILN_ERR_INVALID_ARG);
    int i;
    cr_assert_eq(kiln_session_find_entry(s, "gate", &i), KILN_ERR_NOT_FOUND);
    cr_assert(strstr(kiln_last_error(), "no entry \"gate\"") &&
                  strstr(kiln_last_error(), "3 outputs"),
              "%s", kiln_last_error());
    kiln_session_destroy(s);
    kiln_graph_destroy(g);
    weights_free(&w);
}

/* Each entry launches its own steps in both buckets (y1, y2: one linear;
 * y3: gate, up with silu_mul, down, where up's decode kernel computes the
 * gate too), where the whole graph launches them all; its output's first m
 * rows are written, within the row's width, and nothing else of the
 * caller's buffer. */
Test(entry, an_entry_launches_its_steps_alone_and_writes_its_rows)
{
    kt_fake_device(NULL);
    weights w;
    kiln_graph *g = graph(&w);
    kiln_session *s = session(g);
    rows a = rows_new(D, D + 8, 0x3f80), b = rows_new(D, D, 0x4000);
    static const int64_t ms[] = { 1, 37, MAX_M };
    static const long steps[] = { 1, 1, 3 }; /* prefill; decode: y3's gate in up's kernel */
    for (size_t k = 0; k < sizeof ms / sizeof ms[0]; k++)
        for (int e = 0; e < 3; e++) {
            kiln_entry_info info;
            cr_assert_eq(kiln_session_entry(s, e, &info), KILN_OK);
            rows y = rows_new(info.width, info.width + 6, 0xabab);
            kiln_device_matrix in = as_matrix(info.inputs[0] ? &b : &a), out = as_matrix(&y);
            long before = launches();
            cr_assert_eq(kiln_session_run_entry(s, e, ms[k], &in, &out, NULL), KILN_OK, "%s",
                         kiln_last_error());
            cr_assert_eq(launches() - before, steps[e] - (e == 2 && ms[k] <= 16), "%s at m %lld",
                         info.name, (long long)ms[k]);
            for (int64_t r = 0; r < MAX_M; r++)
                for (int64_t c = 0; c < y.stride; c++)
                    cr_assert_eq(y.p[r * y.stride + c] == 0xabab, r >= ms[k] || c >= y.width,
                                 "%s, m %lld: row %lld column %lld", info.name, (long long)ms[k],
                                 (long long)r, (long long)c);
            free(y.p);
        }
    rows y1 = rows_new(N1, N1, 0), y2 = rows_new(N2, N2, 0), y3 = rows_new(D, D, 0);
    kiln_device_matrix ins[] = { as_matrix(&a), as_matrix(&b) },
                       outs[] = { as_matrix(&y1), as_matrix(&y2), as_matrix(&y3) };
    long before = launches();
    cr_assert_eq(kiln_session_run_device(s, 5, ins, outs, NULL), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(launches() - before, 5, "the whole graph (bucket 64)");
    free(y1.p);
    free(y2.p);
    free(y3.p);
    free(a.p);
    free(b.p);
    kiln_session_destroy(s);
    kiln_graph_destroy(g);
    weights_free(&w);
}

Test(entry, run_entry_refuses_what_it_cannot_run)
{
    kt_fake_device(NULL);
    weights w;
    kiln_graph *g = graph(&w);
    kiln_session *s = session(g);
    rows a = rows_new(D, D, 0), y = rows_new(N1, N1, 0);
    kiln_device_matrix in = as_matrix(&a), out = as_matrix(&y);
    long before = launches();
    cr_assert_eq(kiln_session_run_entry(s, 3, 1, &in, &out, NULL), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_session_run_entry(s, 0, 1, NULL, &out, NULL), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_session_run_entry(s, 0, 1, &in, NULL, NULL), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_session_run_entry(NULL, 0, 1, &in, &out, NULL), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_session_run_entry(s, 0, MAX_M + 1, &in, &out, NULL), KILN_ERR_SHAPE);
    cr_assert(strstr(kiln_last_error(), "entry y1: 65 tokens; the session serves 1 to 64"), "%s",
              kiln_last_error());
    cr_assert_eq(kiln_session_run_entry(s, 0, 0, &in, &out, NULL), KILN_ERR_SHAPE);
    kiln_device_matrix odd = { in.ptr + 1, 0 }, narrow = { out.ptr, N1 - 1 };
    cr_assert_eq(kiln_session_run_entry(s, 0, 1, &odd, &out, NULL), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "input a"), "%s", kiln_last_error());
    cr_assert_eq(kiln_session_run_entry(s, 0, 1, &in, &narrow, NULL), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "output y1"), "%s", kiln_last_error());
    cr_assert_eq(launches(), before, "nothing launched");
    free(a.p);
    free(y.p);
    kiln_session_destroy(s);
    kiln_graph_destroy(g);
    weights_free(&w);
}
