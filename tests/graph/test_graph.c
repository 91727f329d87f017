#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"

/* The builder never reads weight or parameter data, so one buffer serves as
 * every array a descriptor points to. */
static float backing[4096];

static void expect_err(kiln_status got, kiln_status want, ...)
{
    cr_assert_eq(got, want, "status %s, want %s; message: %s", kiln_strerror(got),
                 kiln_strerror(want), kiln_last_error());
    va_list ap;
    va_start(ap, want);
    for (const char *sub; (sub = va_arg(ap, const char *));)
        cr_assert(strstr(kiln_last_error(), sub), "message \"%s\" lacks \"%s\"", kiln_last_error(),
                  sub);
    va_end(ap);
}

static kiln_graph *new_graph(void)
{
    kiln_graph *g = NULL;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    cr_assert_not_null(g);
    return g;
}

static kiln_qtensor qt(kiln_format f, int64_t n, int64_t k)
{
    return (kiln_qtensor){ .format = f, .n = n, .k = k, .data = backing, .scale = backing,
                           .global_scale = 1.0f };
}

static kiln_tensor *input(kiln_graph *g, const char *name, int64_t k)
{
    kiln_tensor *t = NULL;
    cr_assert_eq(kiln_graph_input(g, name, k, &t), KILN_OK, "%s", kiln_last_error());
    return t;
}

static kiln_tensor *weight(kiln_graph *g, const char *name, kiln_format f, int64_t n, int64_t k)
{
    kiln_qtensor w = qt(f, n, k);
    kiln_tensor *t = NULL;
    cr_assert_eq(kiln_graph_weight(g, name, &w, &t), KILN_OK, "%s", kiln_last_error());
    return t;
}

static kiln_tensor *param(kiln_graph *g, const char *name, int64_t n)
{
    kiln_tensor *t = NULL;
    cr_assert_eq(kiln_graph_param(g, name, n, backing, &t), KILN_OK, "%s", kiln_last_error());
    return t;
}

static kiln_tensor *silu(kiln_graph *g, const char *name, kiln_tensor *x)
{
    kiln_tensor *t = NULL;
    cr_assert_eq(kiln_graph_silu(g, name, x, &t), KILN_OK, "%s", kiln_last_error());
    return t;
}

static int topo_index(kiln_tensor *const *order, int n, const kiln_tensor *t)
{
    for (int i = 0; i < n; i++)
        if (order[i] == t)
            return i;
    return -1;
}

/* Every entry is an op tensor, appears once, and comes after every op
 * tensor among its sources. */
static void check_topo_properties(kiln_tensor *const *order, int n)
{
    for (int i = 0; i < n; i++) {
        kiln_op op = kiln_tensor_op(order[i]);
        cr_assert(op != KILN_OP_INPUT && op != KILN_OP_WEIGHT && op != KILN_OP_PARAM,
                  "%s is not an op tensor", kiln_tensor_name(order[i]));
        cr_assert_eq(topo_index(order, n, order[i]), i, "%s appears twice",
                     kiln_tensor_name(order[i]));
        for (int s = 0; s < 3; s++) {
            kiln_tensor *src = kiln_tensor_src(order[i], s);
            if (!src || kiln_tensor_op(src) == KILN_OP_INPUT ||
                kiln_tensor_op(src) == KILN_OP_WEIGHT || kiln_tensor_op(src) == KILN_OP_PARAM)
                continue;
            int at = topo_index(order, n, src);
            cr_assert(at >= 0 && at < i, "%s comes before its source %s",
                      kiln_tensor_name(order[i]), kiln_tensor_name(src));
        }
    }
}

Test(graph, builds_every_op_with_its_shape)
{
    kiln_graph *g = new_graph();
    kiln_tensor *x = input(g, "x", 256);
    kiln_tensor *w = weight(g, "w", KILN_FMT_Q4_K, 48, 256);
    kiln_tensor *b = param(g, "b", 48);
    kiln_tensor *nw = param(g, "nw", 256);
    kiln_tensor *n, *y, *y2, *a, *m, *s, *ge;
    cr_assert_eq(kiln_graph_rms_norm(g, "norm", x, nw, 1e-5f, &n), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "y", n, w, b, &y), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "y2", x, w, NULL, &y2), KILN_OK);
    cr_assert_eq(kiln_graph_add(g, "a", y, y2, &a), KILN_OK);
    cr_assert_eq(kiln_graph_mul(g, "m", a, y, &m), KILN_OK);
    cr_assert_eq(kiln_graph_silu(g, "s", m, &s), KILN_OK);
    cr_assert_eq(kiln_graph_gelu(g, "ge", s, &ge), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, ge), KILN_OK);

    struct { kiln_tensor *t; kiln_op op; int64_t ne0, ne1; const char *name; } want[] = {
        { x, KILN_OP_INPUT, 256, -1, "x" },       { w, KILN_OP_WEIGHT, 256, 48, "w" },
        { b, KILN_OP_PARAM, 48, 1, "b" },         { nw, KILN_OP_PARAM, 256, 1, "nw" },
        { n, KILN_OP_RMS_NORM, 256, -1, "norm" }, { y, KILN_OP_LINEAR, 48, -1, "y" },
        { y2, KILN_OP_LINEAR, 48, -1, "y2" },     { a, KILN_OP_ADD, 48, -1, "a" },
        { m, KILN_OP_MUL, 48, -1, "m" },          { s, KILN_OP_SILU, 48, -1, "s" },
        { ge, KILN_OP_GELU, 48, -1, "ge" },
    };
    cr_assert_eq(kiln_graph_n_tensors(g), (int)(sizeof want / sizeof want[0]));
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        cr_assert_eq(kiln_graph_tensor(g, (int)i), want[i].t, "creation order at %zu", i);
        cr_assert_eq(kiln_tensor_op(want[i].t), want[i].op);
        cr_assert_eq(kiln_tensor_ne(want[i].t, 0), want[i].ne0, "%s ne[0]", want[i].name);
        cr_assert_eq(kiln_tensor_ne(want[i].t, 1), want[i].ne1, "%s ne[1]", want[i].name);
        cr_assert_str_eq(kiln_tensor_name(want[i].t), want[i].name);
        cr_assert_eq(kiln_graph_find(g, want[i].name), want[i].t);
    }
    cr_assert_eq(kiln_tensor_src(y, 0), n);
    cr_assert_eq(kiln_tensor_src(y, 1), w);
    cr_assert_eq(kiln_tensor_src(y, 2), b);
    cr_assert_null(kiln_tensor_src(y2, 2));
    cr_assert_eq(kiln_tensor_src(n, 1), nw);
    cr_assert_eq(kiln_tensor_src(m, 0), a);
    cr_assert_eq(kiln_tensor_src(m, 1), y);
    cr_assert_eq(kiln_tensor_src(ge, 0), s);
    cr_assert_null(kiln_tensor_src(ge, 1));
    cr_assert_null(kiln_tensor_src(ge, 3));
    cr_assert_null(kiln_tensor_src(ge, -1));

    const kiln_qtensor *d = kiln_tensor_weight(w);
    cr_assert_not_null(d);
    cr_assert_eq(d->format, KILN_FMT_Q4_K);
    cr_assert_eq(d->n, 48);
    cr_assert_eq(d->k, 256);
    cr_assert_eq(d->data, (void *)backing);
    cr_assert_null(kiln_tensor_weight(x));

    cr_assert_eq(kiln_graph_n_inputs(g), 1);
    cr_assert_eq(kiln_graph_input_at(g, 0), x);
    cr_assert_null(kiln_graph_input_at(g, 1));
    cr_assert_eq(kiln_graph_n_outputs(g), 1);
    cr_assert_eq(kiln_graph_output_at(g, 0), ge);
    cr_assert_null(kiln_graph_output_at(g, -1));
    cr_assert_null(kiln_graph_find(g, "nope"));
    cr_assert_null(kiln_graph_tensor(g, 11));
    cr_assert_eq(kiln_tensor_ne(x, 2), 0);
    kiln_graph_destroy(g);
}

Test(graph, weight_descriptor_is_copied)
{
    kiln_graph *g = new_graph();
    kiln_qtensor w = qt(KILN_FMT_Q8_0, 4, 64);
    kiln_tensor *t;
    cr_assert_eq(kiln_graph_weight(g, "w", &w, &t), KILN_OK);
    w.n = 999;
    w.data = NULL;
    cr_assert_eq(kiln_tensor_weight(t)->n, 4);
    cr_assert_eq(kiln_tensor_weight(t)->data, (void *)backing);
    kiln_graph_destroy(g);
}

Test(graph, names_are_copied)
{
    kiln_graph *g = new_graph();
    char name[16] = "h";
    kiln_tensor *x = input(g, name, 8);
    strcpy(name, "changed");
    cr_assert_str_eq(kiln_tensor_name(x), "h");
    cr_assert_eq(kiln_graph_find(g, "h"), x);
    cr_assert_null(kiln_graph_find(g, "changed"));
    kiln_graph_destroy(g);
}

Test(graph, unnamed_tensors_get_op_and_id)
{
    kiln_graph *g = new_graph();
    kiln_tensor *x = input(g, NULL, 32);
    cr_assert_str_eq(kiln_tensor_name(x), "input.0");
    kiln_tensor *w = weight(g, NULL, KILN_FMT_Q4_0, 16, 32);
    cr_assert_str_eq(kiln_tensor_name(w), "weight.1");
    kiln_tensor *y;
    cr_assert_eq(kiln_graph_linear(g, NULL, x, w, NULL, &y), KILN_OK);
    cr_assert_str_eq(kiln_tensor_name(y), "linear.2");
    /* The caller took the name the next node would get. */
    kiln_tensor *taken = silu(g, "silu.4", y);
    kiln_tensor *s = silu(g, NULL, taken);
    cr_assert_str_eq(kiln_tensor_name(s), "silu.4.1");
    cr_assert_eq(kiln_graph_find(g, "silu.4.1"), s);
    kiln_graph_destroy(g);
}

Test(graph, many_tensors_and_long_names)
{
    kiln_graph *g = new_graph();
    enum { COUNT = 5000 };
    kiln_tensor *prev = input(g, "x", 4);
    char name[64];
    for (int i = 0; i < COUNT; i++) {
        snprintf(name, sizeof name, "blk.%d.act", i);
        prev = silu(g, name, prev);
    }
    size_t long_len = 40000; /* longer than an arena chunk */
    char *long_name = malloc(long_len + 1);
    memset(long_name, 'n', long_len);
    long_name[long_len] = '\0';
    kiln_tensor *last = silu(g, long_name, prev);
    cr_assert_eq(kiln_graph_n_tensors(g), COUNT + 2);
    for (int i = 0; i < COUNT; i += 97) {
        snprintf(name, sizeof name, "blk.%d.act", i);
        kiln_tensor *t = kiln_graph_find(g, name);
        cr_assert_not_null(t, "%s", name);
        cr_assert_str_eq(kiln_tensor_name(t), name);
        cr_assert_eq(kiln_graph_tensor(g, i + 1), t);
    }
    cr_assert_eq(kiln_graph_find(g, long_name), last);
    cr_assert_eq(strlen(kiln_tensor_name(last)), long_len);
    free(long_name);
    kiln_graph_destroy(g);
}

Test(graph, names_must_be_unique_and_non_empty)
{
    kiln_graph *g = new_graph();
    kiln_tensor *x = input(g, "h", 64);
    kiln_tensor *t = NULL;
    expect_err(kiln_graph_input(g, "h", 64, &t), KILN_ERR_INVALID_ARG, "input \"h\"",
               "already has a tensor named \"h\"", NULL);
    expect_err(kiln_graph_param(g, "h", 64, backing, &t), KILN_ERR_INVALID_ARG, "param \"h\"",
               "(input)", NULL);
    expect_err(kiln_graph_silu(g, "h", x, &t), KILN_ERR_INVALID_ARG, "silu \"h\"", NULL);
    expect_err(kiln_graph_gelu(g, "", x, &t), KILN_ERR_INVALID_ARG, "gelu", "empty", NULL);
    cr_assert_null(t, "out is untouched on failure");
    cr_assert_eq(kiln_graph_n_tensors(g), 1);
    kiln_graph_destroy(g);
}

Test(graph, null_graph_and_out_are_refused)
{
    kiln_tensor *t = NULL;
    kiln_qtensor w = qt(KILN_FMT_F32, 4, 4);
    expect_err(kiln_graph_create(NULL), KILN_ERR_INVALID_ARG, "out is NULL", NULL);
    expect_err(kiln_graph_input(NULL, "x", 4, &t), KILN_ERR_INVALID_ARG, "input \"x\"",
               "graph is NULL", NULL);
    expect_err(kiln_graph_weight(NULL, NULL, &w, &t), KILN_ERR_INVALID_ARG, "weight: graph is NULL",
               NULL);
    expect_err(kiln_graph_output(NULL, t), KILN_ERR_INVALID_ARG, "output: graph is NULL", NULL);

    kiln_graph *g = new_graph();
    kiln_tensor *x = input(g, "x", 4);
    expect_err(kiln_graph_input(g, "x2", 4, NULL), KILN_ERR_INVALID_ARG,
               "input \"x2\": out is NULL", NULL);
    expect_err(kiln_graph_weight(g, "w", &w, NULL), KILN_ERR_INVALID_ARG, "out is NULL", NULL);
    expect_err(kiln_graph_param(g, "p", 4, backing, NULL), KILN_ERR_INVALID_ARG, "out is NULL",
               NULL);
    expect_err(kiln_graph_silu(g, NULL, x, NULL), KILN_ERR_INVALID_ARG,
               "silu \"silu.1\": out is NULL", NULL);
    cr_assert_eq(kiln_graph_n_tensors(g), 1);
    kiln_graph_destroy(g);
    kiln_graph_destroy(NULL);
}

Test(graph, input_and_param_validation)
{
    kiln_graph *g = new_graph();
    kiln_tensor *t = NULL;
    expect_err(kiln_graph_input(g, "x", 0, &t), KILN_ERR_INVALID_ARG, "input \"x\"",
               "0 features", NULL);
    expect_err(kiln_graph_input(g, "x", -3, &t), KILN_ERR_INVALID_ARG, "-3 features", NULL);
    expect_err(kiln_graph_param(g, "b", 0, backing, &t), KILN_ERR_INVALID_ARG, "param \"b\"",
               "0 elements", NULL);
    expect_err(kiln_graph_param(g, "b", 8, NULL, &t), KILN_ERR_INVALID_ARG, "param \"b\"",
               "data is NULL", NULL);
    cr_assert_eq(kiln_graph_n_tensors(g), 0);
    cr_assert_eq(kiln_graph_n_inputs(g), 0);
    kiln_graph_destroy(g);
}

Test(graph, weight_validation)
{
    kiln_graph *g = new_graph();
    kiln_tensor *t = NULL;
    kiln_qtensor w;

    expect_err(kiln_graph_weight(g, "w1", NULL, &t), KILN_ERR_INVALID_ARG, "weight \"w1\"",
               "descriptor is NULL", NULL);

    w = qt((kiln_format)KILN_FMT_COUNT, 4, 32);
    expect_err(kiln_graph_weight(g, "w1", &w, &t), KILN_ERR_UNSUPPORTED, "weight \"w1\"",
               "is not a kiln_format", NULL);
    w = qt((kiln_format)-1, 4, 32);
    expect_err(kiln_graph_weight(g, "w1", &w, &t), KILN_ERR_UNSUPPORTED, "format -1", NULL);

    w = qt(KILN_FMT_Q4_0, 0, 32);
    expect_err(kiln_graph_weight(g, "w1", &w, &t), KILN_ERR_INVALID_ARG, "weight \"w1\"",
               "N = 0", NULL);
    w = qt(KILN_FMT_Q4_0, 4, -32);
    expect_err(kiln_graph_weight(g, "w1", &w, &t), KILN_ERR_INVALID_ARG, "K = -32", NULL);

    w = qt(KILN_FMT_Q4_0, 4, 100);
    expect_err(kiln_graph_weight(g, "w1", &w, &t), KILN_ERR_SHAPE,
               "weight \"w1\": K = 100 is not a multiple of 32 (q4_0 blocks)", NULL);
    w = qt(KILN_FMT_Q4_K, 4, 4096 + 32);
    expect_err(kiln_graph_weight(g, "blk.0.ffn_up.weight", &w, &t), KILN_ERR_SHAPE,
               "K = 4128 is not a multiple of 256 (q4_k blocks)", NULL);

    w = qt(KILN_FMT_Q8_0, 4, 32);
    w.data = NULL;
    expect_err(kiln_graph_weight(g, "w1", &w, &t), KILN_ERR_INVALID_ARG, "weight \"w1\"",
               "data is NULL", NULL);

    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        const kiln_format_info *fi = kiln_format_get((kiln_format)f);
        w = qt((kiln_format)f, 4, 256);
        w.scale = NULL;
        char name[32];
        snprintf(name, sizeof name, "w.%s", fi->name);
        kiln_status st = kiln_graph_weight(g, name, &w, &t);
        if (fi->scale_type == KILN_SCALE_NONE) {
            cr_assert_eq(st, KILN_OK, "%s needs no scale: %s", fi->name, kiln_last_error());
        } else {
            expect_err(st, KILN_ERR_INVALID_ARG, name, "needs a scale array", fi->name, NULL);
        }
    }

    /* N x K bytes overflow size_t even though each fits int64. */
    w = qt(KILN_FMT_F32, INT64_MAX / 2, 256);
    expect_err(kiln_graph_weight(g, "huge", &w, &t), KILN_ERR_SHAPE, "weight \"huge\"", "overflow",
               NULL);
    kiln_graph_destroy(g);
}

Test(graph, linear_validation)
{
    kiln_graph *g = new_graph();
    kiln_tensor *h = input(g, "h", 4096);
    kiln_tensor *w = weight(g, "blk.0.ffn_up.weight", KILN_FMT_Q8_0, 64, 4064);
    kiln_tensor *w2 = weight(g, "w2", KILN_FMT_Q8_0, 64, 4096);
    kiln_tensor *b = param(g, "b", 63);
    kiln_tensor *t = NULL;
    int before = kiln_graph_n_tensors(g);

    expect_err(kiln_graph_linear(g, "blk.0.ffn_up", h, w, NULL, &t), KILN_ERR_SHAPE,
               "linear \"blk.0.ffn_up\": x \"h\" has 4096 features but weight "
               "\"blk.0.ffn_up.weight\" has K = 4064", NULL);
    expect_err(kiln_graph_linear(g, "y", h, w2, b, &t), KILN_ERR_SHAPE,
               "linear \"y\": bias \"b\" has 63 elements but weight \"w2\" has N = 64", NULL);
    expect_err(kiln_graph_linear(g, "y", NULL, w2, NULL, &t), KILN_ERR_INVALID_ARG,
               "linear \"y\": x is NULL", NULL);
    expect_err(kiln_graph_linear(g, "y", h, NULL, NULL, &t), KILN_ERR_INVALID_ARG,
               "linear \"y\": weight is NULL", NULL);
    expect_err(kiln_graph_linear(g, "y", w2, w2, NULL, &t), KILN_ERR_INVALID_ARG,
               "linear \"y\": x \"w2\" is a weight, not an activation", NULL);
    expect_err(kiln_graph_linear(g, "y", h, h, NULL, &t), KILN_ERR_INVALID_ARG,
               "linear \"y\": weight \"h\" is an activation, not a weight", NULL);
    expect_err(kiln_graph_linear(g, "y", h, w2, h, &t), KILN_ERR_INVALID_ARG,
               "linear \"y\": bias \"h\" is an activation, not a param", NULL);
    expect_err(kiln_graph_linear(g, "y", b, w2, NULL, &t), KILN_ERR_INVALID_ARG,
               "x \"b\" is a param, not an activation", NULL);
    expect_err(kiln_graph_linear(g, NULL, h, w, NULL, &t), KILN_ERR_SHAPE, "linear \"linear.4\"",
               NULL);
    cr_assert_null(t);
    cr_assert_eq(kiln_graph_n_tensors(g), before, "failed calls add nothing");
    cr_assert_null(kiln_graph_find(g, "y"), "a failed call does not take its name");
    kiln_graph_destroy(g);
}

/* A static activation scale lives on the linear; only a positive finite
 * scale that E4M3's largest value times stays finite is taken, and a
 * refused one leaves the linear as it was. */
Test(graph, linear_input_scale)
{
    kiln_graph *g = new_graph();
    kiln_tensor *x = input(g, "x", 64), *w = weight(g, "w", KILN_FMT_FP8_TENSOR, 32, 64), *y;
    cr_assert_eq(kiln_graph_linear(g, "y", x, w, NULL, &y), KILN_OK);
    cr_assert_eq(kiln_tensor_input_scale(y), 0.0f, "no static scale until one is given");
    cr_assert_eq(kiln_graph_linear_input_scale(g, y, 0.0125f), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_tensor_input_scale(y), 0.0125f);
    const float max_ok = FLT_MAX / 448.0f;
    cr_assert_eq(kiln_graph_linear_input_scale(g, y, max_ok), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_graph_linear_input_scale(g, y, 1e-40f), KILN_OK, "a subnormal is a scale");
    cr_assert_eq(kiln_graph_linear_input_scale(g, y, 0.5f), KILN_OK);
    const float bad[] = { 0.0f, -0.0f, -1.0f, NAN, INFINITY, -INFINITY, FLT_MAX,
                          nextafterf(max_ok, INFINITY) };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        expect_err(kiln_graph_linear_input_scale(g, y, bad[i]), KILN_ERR_INVALID_ARG,
                   "linear \"y\"", "static activation scale", NULL);
        cr_assert_eq(kiln_tensor_input_scale(y), 0.5f, "a refused scale changes nothing");
    }
    expect_err(kiln_graph_linear_input_scale(g, x, 0.5f), KILN_ERR_INVALID_ARG, "\"x\"",
               "not a linear", NULL);
    expect_err(kiln_graph_linear_input_scale(g, w, 0.5f), KILN_ERR_INVALID_ARG, "\"w\"",
               "a weight", NULL);
    expect_err(kiln_graph_linear_input_scale(g, NULL, 0.5f), KILN_ERR_INVALID_ARG, NULL);
    expect_err(kiln_graph_linear_input_scale(NULL, y, 0.5f), KILN_ERR_INVALID_ARG, NULL);
    kiln_graph *other = new_graph();
    expect_err(kiln_graph_linear_input_scale(other, y, 0.5f), KILN_ERR_INVALID_ARG,
               "another graph", NULL);
    cr_assert_eq(kiln_tensor_input_scale(x), 0.0f);
    cr_assert_eq(kiln_tensor_input_scale(w), 0.0f);
    cr_assert_eq(kiln_tensor_input_scale(NULL), 0.0f);
    kiln_graph_destroy(other);
    kiln_graph_destroy(g);
}

Test(graph, elementwise_and_norm_validation)
{
    kiln_graph *g = new_graph();
    kiln_tensor *a = input(g, "a", 64);
    kiln_tensor *b = input(g, "b", 65);
    kiln_tensor *p = param(g, "p", 64);
    kiln_tensor *p2 = param(g, "p2", 63);
    kiln_tensor *w = weight(g, "w", KILN_FMT_F16, 64, 64);
    kiln_tensor *t = NULL;

    expect_err(kiln_graph_add(g, "s", a, b, &t), KILN_ERR_SHAPE,
               "add \"s\": a \"a\" has 64 features but b \"b\" has 65", NULL);
    expect_err(kiln_graph_mul(g, "s", b, a, &t), KILN_ERR_SHAPE,
               "mul \"s\": a \"b\" has 65 features but b \"a\" has 64", NULL);
    expect_err(kiln_graph_add(g, "s", a, p, &t), KILN_ERR_INVALID_ARG,
               "add \"s\": b \"p\" is a param, not an activation", NULL);
    expect_err(kiln_graph_mul(g, "s", w, a, &t), KILN_ERR_INVALID_ARG,
               "mul \"s\": a \"w\" is a weight", NULL);
    expect_err(kiln_graph_add(g, "s", a, NULL, &t), KILN_ERR_INVALID_ARG, "add \"s\": b is NULL",
               NULL);
    expect_err(kiln_graph_silu(g, "s", p, &t), KILN_ERR_INVALID_ARG,
               "silu \"s\": x \"p\" is a param", NULL);
    expect_err(kiln_graph_gelu(g, "s", NULL, &t), KILN_ERR_INVALID_ARG, "gelu \"s\": x is NULL",
               NULL);

    expect_err(kiln_graph_rms_norm(g, "n", a, p2, 1e-5f, &t), KILN_ERR_SHAPE,
               "rms_norm \"n\": x \"a\" has 64 features but weight \"p2\" has 63 elements", NULL);
    expect_err(kiln_graph_rms_norm(g, "n", a, a, 1e-5f, &t), KILN_ERR_INVALID_ARG,
               "rms_norm \"n\": weight \"a\" is an activation, not a param", NULL);
    expect_err(kiln_graph_rms_norm(g, "n", p, p, 1e-5f, &t), KILN_ERR_INVALID_ARG,
               "x \"p\" is a param", NULL);
    const float bad_eps[] = { 0.0f, -1e-6f, NAN, INFINITY };
    for (size_t i = 0; i < sizeof bad_eps / sizeof bad_eps[0]; i++)
        expect_err(kiln_graph_rms_norm(g, "n", a, p, bad_eps[i], &t), KILN_ERR_INVALID_ARG,
                   "rms_norm \"n\": eps = ", "positive and finite", NULL);
    cr_assert_null(t);
    cr_assert_eq(kiln_graph_rms_norm(g, "n", a, p, 1e-6f, &t), KILN_OK);
    kiln_graph_destroy(g);
}

Test(graph, tensors_of_another_graph_are_refused)
{
    kiln_graph *g = new_graph(), *other = new_graph();
    kiln_tensor *x = input(g, "x", 32);
    kiln_tensor *w = weight(g, "w", KILN_FMT_Q4_0, 8, 32);
    kiln_tensor *ox = input(other, "ox", 32);
    kiln_tensor *ow = weight(other, "ow", KILN_FMT_Q4_0, 8, 32);
    kiln_tensor *ob = param(other, "ob", 8);
    kiln_tensor *onw = param(other, "onw", 32);
    /* Same id in both graphs: an id check alone would accept it. */
    kiln_tensor *twin = input(other, "x", 32);
    kiln_tensor *t = NULL;

    expect_err(kiln_graph_linear(g, "y", ox, w, NULL, &t), KILN_ERR_INVALID_ARG,
               "linear \"y\": x \"ox\" belongs to another graph", NULL);
    expect_err(kiln_graph_linear(g, "y", x, ow, NULL, &t), KILN_ERR_INVALID_ARG,
               "weight \"ow\" belongs to another graph", NULL);
    expect_err(kiln_graph_linear(g, "y", x, w, ob, &t), KILN_ERR_INVALID_ARG,
               "bias \"ob\" belongs to another graph", NULL);
    expect_err(kiln_graph_add(g, "y", x, twin, &t), KILN_ERR_INVALID_ARG,
               "b \"x\" belongs to another graph", NULL);
    expect_err(kiln_graph_silu(g, "y", ox, &t), KILN_ERR_INVALID_ARG, "belongs to another graph",
               NULL);
    expect_err(kiln_graph_rms_norm(g, "y", x, onw, 1e-5f, &t), KILN_ERR_INVALID_ARG,
               "weight \"onw\" belongs to another graph", NULL);
    expect_err(kiln_graph_output(g, ox), KILN_ERR_INVALID_ARG,
               "output: tensor \"ox\" belongs to another graph", NULL);
    cr_assert_eq(kiln_graph_n_tensors(g), 2);
    cr_assert_eq(kiln_graph_n_outputs(g), 0);
    kiln_graph_destroy(g);
    kiln_graph_destroy(other);
}

Test(graph, output_validation)
{
    kiln_graph *g = new_graph();
    kiln_tensor *x = input(g, "x", 32);
    kiln_tensor *w = weight(g, "w", KILN_FMT_BF16, 8, 32);
    kiln_tensor *p = param(g, "p", 8);
    kiln_tensor *s = silu(g, "s", x);
    expect_err(kiln_graph_output(g, NULL), KILN_ERR_INVALID_ARG, "output: tensor is NULL", NULL);
    expect_err(kiln_graph_output(g, w), KILN_ERR_INVALID_ARG,
               "output: tensor \"w\" is a weight, not an activation", NULL);
    expect_err(kiln_graph_output(g, p), KILN_ERR_INVALID_ARG, "tensor \"p\" is a param", NULL);
    cr_assert_eq(kiln_graph_output(g, s), KILN_OK);
    expect_err(kiln_graph_output(g, s), KILN_ERR_INVALID_ARG,
               "output: tensor \"s\" is already an output", NULL);
    cr_assert_eq(kiln_graph_output(g, x), KILN_OK, "an input may be an output");
    cr_assert_eq(kiln_graph_n_outputs(g), 2);
    cr_assert_eq(kiln_graph_output_at(g, 0), s);
    cr_assert_eq(kiln_graph_output_at(g, 1), x);
    kiln_graph_destroy(g);
}

Test(graph, topo_needs_outputs_and_arguments)
{
    kiln_graph *g = new_graph();
    kiln_tensor *x = input(g, "x", 8);
    silu(g, "s", x);
    kiln_tensor *const *order = NULL;
    int n = -1;
    expect_err(kiln_graph_topo(g, &order, &n), KILN_ERR_STATE, "no outputs", NULL);
    cr_assert_null(order);
    cr_assert_eq(n, -1);
    expect_err(kiln_graph_topo(NULL, &order, &n), KILN_ERR_INVALID_ARG, "graph is NULL", NULL);
    expect_err(kiln_graph_topo(g, NULL, &n), KILN_ERR_INVALID_ARG, "out is NULL", NULL);
    expect_err(kiln_graph_topo(g, &order, NULL), KILN_ERR_INVALID_ARG, "n is NULL", NULL);
    kiln_graph_destroy(g);
}

Test(graph, topo_orders_sources_first_and_leaves_out_the_unreachable)
{
    kiln_graph *g = new_graph();
    kiln_tensor *x = input(g, "x", 64);
    kiln_tensor *x2 = input(g, "x2", 64);
    kiln_tensor *wg = weight(g, "wg", KILN_FMT_Q8_0, 128, 64);
    kiln_tensor *wu = weight(g, "wu", KILN_FMT_Q8_0, 128, 64);
    kiln_tensor *wd = weight(g, "wd", KILN_FMT_Q8_0, 64, 128);
    kiln_tensor *nw = param(g, "nw", 64);
    kiln_tensor *unused_early = silu(g, "unused_early", x2);
    kiln_tensor *n, *gate, *up, *act, *prod, *down, *res, *unused_late, *dead;
    cr_assert_eq(kiln_graph_rms_norm(g, "norm", x, nw, 1e-5f, &n), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "gate", n, wg, NULL, &gate), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "up", n, wu, NULL, &up), KILN_OK);
    cr_assert_eq(kiln_graph_silu(g, "act", gate, &act), KILN_OK);
    cr_assert_eq(kiln_graph_mul(g, "prod", act, up, &prod), KILN_OK);
    cr_assert_eq(kiln_graph_linear(g, "down", prod, wd, NULL, &down), KILN_OK);
    cr_assert_eq(kiln_graph_add(g, "res", x, down, &res), KILN_OK);
    cr_assert_eq(kiln_graph_gelu(g, "unused_late", res, &unused_late), KILN_OK);
    cr_assert_eq(kiln_graph_gelu(g, "dead", unused_early, &dead), KILN_OK);
    cr_assert_eq(kiln_graph_output(g, res), KILN_OK);

    kiln_tensor *const *order;
    int n_order;
    cr_assert_eq(kiln_graph_topo(g, &order, &n_order), KILN_OK);
    cr_assert_eq(n_order, 7, "norm gate up act prod down res");
    check_topo_properties(order, n_order);
    cr_assert_eq(order[n_order - 1], res);
    cr_assert_eq(topo_index(order, n_order, unused_early), -1);
    cr_assert_eq(topo_index(order, n_order, unused_late), -1);
    cr_assert_eq(topo_index(order, n_order, dead), -1);
    cr_assert_eq(topo_index(order, n_order, x), -1, "inputs are not in the order");

    /* Cached: the same array until the graph changes. */
    kiln_tensor *const *again;
    int n_again;
    cr_assert_eq(kiln_graph_topo(g, &again, &n_again), KILN_OK);
    cr_assert_eq(again, order);
    cr_assert_eq(n_again, n_order);

    /* A new output brings its sources in, after what they depend on. */
    cr_assert_eq(kiln_graph_output(g, dead), KILN_OK);
    cr_assert_eq(kiln_graph_topo(g, &order, &n_order), KILN_OK);
    cr_assert_eq(n_order, 9);
    check_topo_properties(order, n_order);
    cr_assert(topo_index(order, n_order, unused_early) < topo_index(order, n_order, dead));
    cr_assert_eq(topo_index(order, n_order, unused_late), -1);

    /* A node added after the order was taken, and made an output, appears. */
    kiln_tensor *late = silu(g, "late", unused_late);
    cr_assert_eq(kiln_graph_output(g, late), KILN_OK);
    cr_assert_eq(kiln_graph_topo(g, &order, &n_order), KILN_OK);
    cr_assert_eq(n_order, 11);
    check_topo_properties(order, n_order);
    cr_assert(topo_index(order, n_order, res) < topo_index(order, n_order, unused_late));
    cr_assert(topo_index(order, n_order, unused_late) < topo_index(order, n_order, late));
    kiln_graph_destroy(g);
}

Test(graph, topo_of_input_outputs_is_empty)
{
    kiln_graph *g = new_graph();
    kiln_tensor *x = input(g, "x", 8);
    silu(g, "s", x);
    cr_assert_eq(kiln_graph_output(g, x), KILN_OK);
    kiln_tensor *const *order;
    int n = -1;
    cr_assert_eq(kiln_graph_topo(g, &order, &n), KILN_OK);
    cr_assert_eq(n, 0);
    kiln_graph_destroy(g);
}

Test(graph, topo_of_a_deep_chain_and_a_wide_fan)
{
    kiln_graph *g = new_graph();
    enum { DEPTH = 200000, WIDTH = 300 };
    kiln_tensor *x = input(g, "x", 4);
    kiln_tensor *t = x;
    for (int i = 0; i < DEPTH; i++)
        t = silu(g, NULL, t);
    cr_assert_eq(kiln_graph_output(g, t), KILN_OK);

    /* Many nodes sharing one source: the source appears once, first. */
    kiln_tensor *shared = silu(g, "shared", x), *sum = shared;
    for (int i = 0; i < WIDTH; i++) {
        kiln_tensor *leaf = silu(g, NULL, shared);
        cr_assert_eq(kiln_graph_add(g, NULL, sum, leaf, &sum), KILN_OK);
    }
    cr_assert_eq(kiln_graph_output(g, sum), KILN_OK);

    kiln_tensor *const *order;
    int n;
    cr_assert_eq(kiln_graph_topo(g, &order, &n), KILN_OK);
    cr_assert_eq(n, DEPTH + 1 + 2 * WIDTH);
    for (int i = 0; i < DEPTH; i++)
        cr_assert_eq(kiln_tensor_src(order[i], 0), i ? order[i - 1] : x);
    cr_assert_eq(order[DEPTH], shared);
    cr_assert_eq(order[n - 1], sum);
    kiln_graph_destroy(g);
}

Test(graph, op_names)
{
    const char *want[] = { "input", "weight", "param", "linear", "add",
                           "mul", "silu", "gelu", "rms_norm" };
    cr_assert_eq(sizeof want / sizeof want[0], (size_t)KILN_OP_COUNT);
    for (int op = 0; op < KILN_OP_COUNT; op++)
        cr_assert_str_eq(kiln_op_name((kiln_op)op), want[op]);
    cr_assert_str_eq(kiln_op_name(KILN_OP_COUNT), "?");
    cr_assert_str_eq(kiln_op_name((kiln_op)-1), "?");
}

Test(graph, views_of_null_are_empty)
{
    cr_assert_eq(kiln_graph_n_tensors(NULL), 0);
    cr_assert_eq(kiln_graph_n_inputs(NULL), 0);
    cr_assert_eq(kiln_graph_n_outputs(NULL), 0);
    cr_assert_null(kiln_graph_tensor(NULL, 0));
    cr_assert_null(kiln_graph_input_at(NULL, 0));
    cr_assert_null(kiln_graph_output_at(NULL, 0));
    cr_assert_null(kiln_graph_find(NULL, "x"));
    cr_assert_null(kiln_tensor_name(NULL));
    cr_assert_eq(kiln_tensor_ne(NULL, 0), 0);
    cr_assert_null(kiln_tensor_weight(NULL));
    cr_assert_null(kiln_tensor_src(NULL, 0));
    kiln_graph *g = new_graph();
    cr_assert_null(kiln_graph_find(g, "x"), "an empty graph finds nothing");
    cr_assert_null(kiln_graph_find(g, NULL));
    kiln_graph_destroy(g);
}
