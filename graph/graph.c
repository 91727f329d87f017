/* The graph IR and its builder: tensors and nodes in an arena, a name index,
 * validation with messages that name the node and its operands, and the
 * topological order executors walk. */
#include "graph_impl.h"

#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct kiln_op_traits {
    const char *name;
    bool activation; /* [M, ne0]: one row per token */
    bool computed;   /* has sources: an executor evaluates it */
} kiln_op_traits;

static const kiln_op_traits op_traits[] = {
    [KILN_OP_INPUT] = { "input", true, false },
    [KILN_OP_WEIGHT] = { "weight", false, false },
    [KILN_OP_PARAM] = { "param", false, false },
    [KILN_OP_LINEAR] = { "linear", true, true },
    [KILN_OP_ADD] = { "add", true, true },
    [KILN_OP_MUL] = { "mul", true, true },
    [KILN_OP_SILU] = { "silu", true, true },
    [KILN_OP_GELU] = { "gelu", true, true },
    [KILN_OP_RMS_NORM] = { "rms_norm", true, true },
};
_Static_assert(KILN_ARRAY_LEN(op_traits) == KILN_OP_COUNT, "one row per op");

const char *kiln_op_name(kiln_op op)
{
    return (unsigned)op < KILN_OP_COUNT ? op_traits[op].name : "?";
}

/* What an operand must be; also how a tensor's kind is described. */
typedef enum kiln_kind { KILN_KIND_ACTIVATION, KILN_KIND_WEIGHT, KILN_KIND_PARAM } kiln_kind;

static const char *const kind_text[] = {
    [KILN_KIND_ACTIVATION] = "an activation",
    [KILN_KIND_WEIGHT] = "a weight",
    [KILN_KIND_PARAM] = "a param",
};

static kiln_kind tensor_kind(const kiln_tensor *t)
{
    if (t->op == KILN_OP_WEIGHT)
        return KILN_KIND_WEIGHT;
    if (t->op == KILN_OP_PARAM)
        return KILN_KIND_PARAM;
    return KILN_KIND_ACTIVATION;
}

/* ------------------------------------------------------------ containers */

static kiln_status list_reserve(kiln_tensor_list *l, int extra)
{
    if (l->n + extra <= l->cap)
        return KILN_OK;
    int cap = l->cap ? l->cap : 16;
    while (cap < l->n + extra) {
        if (cap > INT_MAX / 2)
            return kiln_fail(KILN_ERR_NOMEM, "graph: a tensor list cannot grow past %d entries",
                             cap);
        cap *= 2;
    }
    kiln_tensor **v = kiln_realloc(l->v, (size_t)cap * sizeof *v);
    if (!v)
        return kiln_fail(KILN_ERR_NOMEM, "graph: out of memory growing a tensor list to %d entries",
                         cap);
    l->v = v;
    l->cap = cap;
    return KILN_OK;
}

static uint64_t name_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* The slot that holds name, or the empty slot where it would go. The table
 * is never more than half full, so the probe ends. */
static size_t name_slot(const kiln_graph *g, const char *name)
{
    size_t mask = (size_t)g->name_cap - 1;
    for (size_t i = name_hash(name) & mask;; i = (i + 1) & mask) {
        int id = g->name_slots[i];
        if (id == 0 || strcmp(g->tensors.v[id - 1]->name, name) == 0)
            return i;
    }
}

static kiln_status name_index_reserve(kiln_graph *g)
{
    int need = g->tensors.n + 1;
    if (g->name_cap / 2 >= need)
        return KILN_OK;
    int cap = g->name_cap ? g->name_cap : 64;
    while (cap / 2 < need) {
        if (cap > INT_MAX / 2)
            return kiln_fail(KILN_ERR_NOMEM, "graph: the name index cannot grow past %d slots",
                             cap);
        cap *= 2;
    }
    int *slots = kiln_calloc((size_t)cap, sizeof *slots);
    if (!slots)
        return kiln_fail(KILN_ERR_NOMEM, "graph: out of memory growing the name index to %d slots",
                         cap);
    free(g->name_slots);
    g->name_slots = slots;
    g->name_cap = cap;
    for (int i = 0; i < g->tensors.n; i++)
        slots[name_slot(g, g->tensors.v[i]->name)] = i + 1;
    return KILN_OK;
}

/* --------------------------------------------------------------- builder */

static bool graph_owns(const kiln_graph *g, const kiln_tensor *t)
{
    return t->id >= 0 && t->id < g->tensors.n && g->tensors.v[t->id] == t;
}

/* Room for a node's description: op, quotes and a name, truncated if the
 * name is very long (the message buffer is bounded anyway). */
enum { KILN_WHERE_LEN = 320, KILN_AUTO_NAME_LEN = 64 };

/* A free name for an unnamed node: "linear.7" where 7 is the id it gets,
 * with a further suffix in the rare case the caller already took that. */
static void auto_name(const kiln_graph *g, kiln_op op, char *buf)
{
    snprintf(buf, KILN_AUTO_NAME_LEN, "%s.%d", op_traits[op].name, g->tensors.n);
    for (int k = 1; kiln_graph_find(g, buf); k++)
        snprintf(buf, KILN_AUTO_NAME_LEN, "%s.%d.%d", op_traits[op].name, g->tensors.n, k);
}

/* A node under construction: its name (the caller's or an automatic one)
 * and "op \"name\"" for messages. */
typedef struct kiln_node_ctx {
    const char *name;
    char auto_buf[KILN_AUTO_NAME_LEN];
    char where[KILN_WHERE_LEN];
} kiln_node_ctx;

static kiln_status node_begin(kiln_graph *g, kiln_op op, const char *name, kiln_tensor **out,
                              kiln_node_ctx *c)
{
    const char *opn = op_traits[op].name;
    if (!g)
        return name ? kiln_fail(KILN_ERR_INVALID_ARG, "%s \"%s\": graph is NULL", opn, name)
                    : kiln_fail(KILN_ERR_INVALID_ARG, "%s: graph is NULL", opn);
    if (name) {
        if (!name[0])
            return kiln_fail(KILN_ERR_INVALID_ARG, "%s: the name is empty (pass NULL for an "
                             "automatic one)", opn);
        const kiln_tensor *dup = kiln_graph_find(g, name);
        if (dup)
            return kiln_fail(KILN_ERR_INVALID_ARG,
                             "%s \"%s\": the graph already has a tensor named \"%s\" (%s)", opn,
                             name, name, op_traits[dup->op].name);
        c->name = name;
    } else {
        auto_name(g, op, c->auto_buf);
        c->name = c->auto_buf;
    }
    snprintf(c->where, sizeof c->where, "%s \"%s\"", opn, c->name);
    if (!out)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: out is NULL", c->where);
    return KILN_OK;
}

static kiln_status check_operand(const kiln_graph *g, const char *where, const char *role,
                                 const kiln_tensor *t, kiln_kind want)
{
    if (!t)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: %s is NULL", where, role);
    if (!graph_owns(g, t))
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: %s \"%s\" belongs to another graph", where,
                         role, t->name);
    if (tensor_kind(t) != want)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: %s \"%s\" is %s, not %s", where, role, t->name,
                         kind_text[tensor_kind(t)], kind_text[want]);
    return KILN_OK;
}

/* Append a zeroed tensor. Everything that can fail happens before the graph
 * is touched, so a failed builder call leaves the graph as it was. */
static kiln_status tensor_new(kiln_graph *g, kiln_op op, const kiln_node_ctx *c, kiln_tensor **out)
{
    kiln_status st = list_reserve(&g->tensors, 1);
    if (st == KILN_OK)
        st = name_index_reserve(g);
    if (st != KILN_OK)
        return kiln_fail_prefix(st, "%s", c->where);
    kiln_tensor *t = kiln_arena_alloc(&g->arena, sizeof *t);
    char *name = t ? kiln_arena_strdup(&g->arena, c->name) : NULL;
    if (!name)
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", c->where);
    memset(t, 0, sizeof *t);
    t->op = op;
    t->id = g->tensors.n;
    t->name = name;
    g->tensors.v[g->tensors.n++] = t;
    g->name_slots[name_slot(g, name)] = t->id + 1;
    g->topo_valid = 0;
    *out = t;
    return KILN_OK;
}

kiln_status kiln_graph_create(kiln_graph **out)
{
    if (!out)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_graph_create: out is NULL");
    kiln_graph *g = kiln_calloc(1, sizeof *g);
    if (!g)
        return kiln_fail(KILN_ERR_NOMEM, "kiln_graph_create: out of memory");
    *out = g;
    return KILN_OK;
}

void kiln_graph_destroy(kiln_graph *g)
{
    if (!g)
        return;
    free(g->tensors.v);
    free(g->inputs.v);
    free(g->outputs.v);
    free(g->topo.v);
    free(g->name_slots);
    kiln_arena_free(g->arena);
    free(g);
}

kiln_status kiln_graph_input(kiln_graph *g, const char *name, int64_t k, kiln_tensor **out)
{
    kiln_node_ctx c;
    kiln_status st = node_begin(g, KILN_OP_INPUT, name, out, &c);
    if (st != KILN_OK)
        return st;
    if (k <= 0)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: %" PRId64 " features; must be positive",
                         c.where, k);
    st = list_reserve(&g->inputs, 1);
    if (st != KILN_OK)
        return kiln_fail_prefix(st, "%s", c.where);
    kiln_tensor *t;
    st = tensor_new(g, KILN_OP_INPUT, &c, &t);
    if (st != KILN_OK)
        return st;
    t->ne[0] = k;
    t->ne[1] = -1;
    g->inputs.v[g->inputs.n++] = t;
    *out = t;
    return KILN_OK;
}

static kiln_status check_weight(const char *where, const kiln_qtensor *w)
{
    if (!w)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: the descriptor is NULL", where);
    const kiln_format_info *fi = kiln_format_get(w->format);
    if (!fi)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: format %d is not a kiln_format", where,
                         (int)w->format);
    if (w->n <= 0 || w->k <= 0)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: shape N = %" PRId64 ", K = %" PRId64
                         "; both must be positive", where, w->n, w->k);
    assert(fi->k_multiple > 0);
    if (w->k % fi->k_multiple != 0)
        return kiln_fail(KILN_ERR_SHAPE, "%s: K = %" PRId64 " is not a multiple of %d (%s blocks)",
                         where, w->k, fi->k_multiple, fi->name);
    if (!w->data)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: data is NULL", where);
    if (fi->scale_type != KILN_SCALE_NONE && !w->scale)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "%s: format %s needs a scale array but scale is NULL", where, fi->name);
    /* The sizes must be representable for anything to copy or upload it. */
    size_t bytes;
    kiln_status st = kiln_format_data_bytes(w->format, w->n, w->k, &bytes);
    if (st == KILN_OK)
        st = kiln_qtensor_scale_bytes(w, &bytes);
    if (st != KILN_OK)
        return kiln_fail_prefix(st, "%s", where);
    return KILN_OK;
}

kiln_status kiln_graph_weight(kiln_graph *g, const char *name, const kiln_qtensor *w,
                              kiln_tensor **out)
{
    kiln_node_ctx c;
    kiln_status st = node_begin(g, KILN_OP_WEIGHT, name, out, &c);
    if (st == KILN_OK)
        st = check_weight(c.where, w);
    kiln_tensor *t;
    if (st == KILN_OK)
        st = tensor_new(g, KILN_OP_WEIGHT, &c, &t);
    if (st != KILN_OK)
        return st;
    t->weight = *w;
    t->ne[0] = w->k;
    t->ne[1] = w->n;
    *out = t;
    return KILN_OK;
}

kiln_status kiln_graph_param(kiln_graph *g, const char *name, int64_t n, const float *data,
                             kiln_tensor **out)
{
    kiln_node_ctx c;
    kiln_status st = node_begin(g, KILN_OP_PARAM, name, out, &c);
    if (st != KILN_OK)
        return st;
    if (n <= 0)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: %" PRId64 " elements; must be positive",
                         c.where, n);
    if (!data)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: data is NULL", c.where);
    kiln_tensor *t;
    st = tensor_new(g, KILN_OP_PARAM, &c, &t);
    if (st != KILN_OK)
        return st;
    t->param = data;
    t->ne[0] = n;
    t->ne[1] = 1;
    *out = t;
    return KILN_OK;
}

kiln_status kiln_graph_linear(kiln_graph *g, const char *name, kiln_tensor *x, kiln_tensor *w,
                              kiln_tensor *bias, kiln_tensor **out)
{
    kiln_node_ctx c;
    kiln_status st = node_begin(g, KILN_OP_LINEAR, name, out, &c);
    if (st == KILN_OK)
        st = check_operand(g, c.where, "x", x, KILN_KIND_ACTIVATION);
    if (st == KILN_OK)
        st = check_operand(g, c.where, "weight", w, KILN_KIND_WEIGHT);
    if (st == KILN_OK && bias)
        st = check_operand(g, c.where, "bias", bias, KILN_KIND_PARAM);
    if (st != KILN_OK)
        return st;
    if (x->ne[0] != w->ne[0])
        return kiln_fail(KILN_ERR_SHAPE,
                         "%s: x \"%s\" has %" PRId64 " features but weight \"%s\" has K = %" PRId64,
                         c.where, x->name, x->ne[0], w->name, w->ne[0]);
    if (bias && bias->ne[0] != w->ne[1])
        return kiln_fail(KILN_ERR_SHAPE,
                         "%s: bias \"%s\" has %" PRId64 " elements but weight \"%s\" has N = %"
                         PRId64, c.where, bias->name, bias->ne[0], w->name, w->ne[1]);
    kiln_tensor *t;
    st = tensor_new(g, KILN_OP_LINEAR, &c, &t);
    if (st != KILN_OK)
        return st;
    t->ne[0] = w->ne[1];
    t->ne[1] = -1;
    t->src[0] = x;
    t->src[1] = w;
    t->src[2] = bias;
    *out = t;
    return KILN_OK;
}

kiln_status kiln_graph_linear_input_scale(kiln_graph *g, kiln_tensor *linear, float scale)
{
    if (!g)
        return kiln_fail(KILN_ERR_INVALID_ARG, "linear input scale: graph is NULL");
    kiln_status st = check_operand(g, "linear input scale", "tensor", linear,
                                   KILN_KIND_ACTIVATION);
    if (st != KILN_OK)
        return st;
    if (linear->op != KILN_OP_LINEAR)
        return kiln_fail(KILN_ERR_INVALID_ARG, "linear input scale: tensor \"%s\" is %s, not a "
                         "linear", linear->name, op_traits[linear->op].name);
    /* x_q · scale must stay finite for every E4M3 code, 448 the largest. */
    if (!(scale > 0.0f) || !isfinite(scale * 448.0f))
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "linear \"%s\": input scale %g; a static activation scale must be "
                         "positive, finite and at most %g (448 times it must be finite)",
                         linear->name, (double)scale, (double)(FLT_MAX / 448.0f));
    linear->input_scale = scale;
    return KILN_OK;
}

static kiln_status binary(kiln_graph *g, kiln_op op, const char *name, kiln_tensor *a,
                          kiln_tensor *b, kiln_tensor **out)
{
    kiln_node_ctx c;
    kiln_status st = node_begin(g, op, name, out, &c);
    if (st == KILN_OK)
        st = check_operand(g, c.where, "a", a, KILN_KIND_ACTIVATION);
    if (st == KILN_OK)
        st = check_operand(g, c.where, "b", b, KILN_KIND_ACTIVATION);
    if (st != KILN_OK)
        return st;
    if (a->ne[0] != b->ne[0])
        return kiln_fail(KILN_ERR_SHAPE,
                         "%s: a \"%s\" has %" PRId64 " features but b \"%s\" has %" PRId64, c.where,
                         a->name, a->ne[0], b->name, b->ne[0]);
    kiln_tensor *t;
    st = tensor_new(g, op, &c, &t);
    if (st != KILN_OK)
        return st;
    t->ne[0] = a->ne[0];
    t->ne[1] = -1;
    t->src[0] = a;
    t->src[1] = b;
    *out = t;
    return KILN_OK;
}

kiln_status kiln_graph_add(kiln_graph *g, const char *name, kiln_tensor *a, kiln_tensor *b,
                           kiln_tensor **out)
{
    return binary(g, KILN_OP_ADD, name, a, b, out);
}

kiln_status kiln_graph_mul(kiln_graph *g, const char *name, kiln_tensor *a, kiln_tensor *b,
                           kiln_tensor **out)
{
    return binary(g, KILN_OP_MUL, name, a, b, out);
}

static kiln_status unary(kiln_graph *g, kiln_op op, const char *name, kiln_tensor *x,
                         kiln_tensor **out)
{
    kiln_node_ctx c;
    kiln_status st = node_begin(g, op, name, out, &c);
    if (st == KILN_OK)
        st = check_operand(g, c.where, "x", x, KILN_KIND_ACTIVATION);
    kiln_tensor *t;
    if (st == KILN_OK)
        st = tensor_new(g, op, &c, &t);
    if (st != KILN_OK)
        return st;
    t->ne[0] = x->ne[0];
    t->ne[1] = -1;
    t->src[0] = x;
    *out = t;
    return KILN_OK;
}

kiln_status kiln_graph_silu(kiln_graph *g, const char *name, kiln_tensor *x, kiln_tensor **out)
{
    return unary(g, KILN_OP_SILU, name, x, out);
}

kiln_status kiln_graph_gelu(kiln_graph *g, const char *name, kiln_tensor *x, kiln_tensor **out)
{
    return unary(g, KILN_OP_GELU, name, x, out);
}

kiln_status kiln_graph_rms_norm(kiln_graph *g, const char *name, kiln_tensor *x,
                                kiln_tensor *weight, float eps, kiln_tensor **out)
{
    kiln_node_ctx c;
    kiln_status st = node_begin(g, KILN_OP_RMS_NORM, name, out, &c);
    if (st == KILN_OK)
        st = check_operand(g, c.where, "x", x, KILN_KIND_ACTIVATION);
    if (st == KILN_OK)
        st = check_operand(g, c.where, "weight", weight, KILN_KIND_PARAM);
    if (st != KILN_OK)
        return st;
    if (x->ne[0] != weight->ne[0])
        return kiln_fail(KILN_ERR_SHAPE,
                         "%s: x \"%s\" has %" PRId64 " features but weight \"%s\" has %" PRId64
                         " elements", c.where, x->name, x->ne[0], weight->name, weight->ne[0]);
    if (!(eps > 0.0f) || !isfinite(eps))
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: eps = %g; must be positive and finite",
                         c.where, (double)eps);
    kiln_tensor *t;
    st = tensor_new(g, KILN_OP_RMS_NORM, &c, &t);
    if (st != KILN_OK)
        return st;
    t->ne[0] = x->ne[0];
    t->ne[1] = -1;
    t->src[0] = x;
    t->src[1] = weight;
    t->eps = eps;
    *out = t;
    return KILN_OK;
}

kiln_status kiln_graph_output(kiln_graph *g, kiln_tensor *t)
{
    if (!g)
        return kiln_fail(KILN_ERR_INVALID_ARG, "output: graph is NULL");
    kiln_status st = check_operand(g, "output", "tensor", t, KILN_KIND_ACTIVATION);
    if (st != KILN_OK)
        return st;
    if (t->is_output)
        return kiln_fail(KILN_ERR_INVALID_ARG, "output: tensor \"%s\" is already an output",
                         t->name);
    st = list_reserve(&g->outputs, 1);
    if (st != KILN_OK)
        return kiln_fail_prefix(st, "output \"%s\"", t->name);
    t->is_output = 1;
    g->outputs.v[g->outputs.n++] = t;
    g->topo_valid = 0;
    return KILN_OK;
}

/* ---------------------------------------------------------------- views */

int kiln_graph_n_tensors(const kiln_graph *g) { return g ? g->tensors.n : 0; }

static kiln_tensor *list_at(const kiln_graph *g, const kiln_tensor_list *l, int i)
{
    return g && i >= 0 && i < l->n ? l->v[i] : NULL;
}

kiln_tensor *kiln_graph_tensor(const kiln_graph *g, int i)
{
    return g ? list_at(g, &g->tensors, i) : NULL;
}

int kiln_graph_n_inputs(const kiln_graph *g) { return g ? g->inputs.n : 0; }

kiln_tensor *kiln_graph_input_at(const kiln_graph *g, int i)
{
    return g ? list_at(g, &g->inputs, i) : NULL;
}

int kiln_graph_n_outputs(const kiln_graph *g) { return g ? g->outputs.n : 0; }

kiln_tensor *kiln_graph_output_at(const kiln_graph *g, int i)
{
    return g ? list_at(g, &g->outputs, i) : NULL;
}

kiln_tensor *kiln_graph_find(const kiln_graph *g, const char *name)
{
    if (!g || !name || g->name_cap == 0)
        return NULL;
    int id = g->name_slots[name_slot(g, name)];
    return id ? g->tensors.v[id - 1] : NULL;
}

const char *kiln_tensor_name(const kiln_tensor *t) { return t ? t->name : NULL; }

kiln_op kiln_tensor_op(const kiln_tensor *t)
{
    assert(t);
    return t->op;
}

int64_t kiln_tensor_ne(const kiln_tensor *t, int dim)
{
    return t && (dim == 0 || dim == 1) ? t->ne[dim] : 0;
}

const kiln_qtensor *kiln_tensor_weight(const kiln_tensor *t)
{
    return t && t->op == KILN_OP_WEIGHT ? &t->weight : NULL;
}

float kiln_tensor_input_scale(const kiln_tensor *t)
{
    return t && t->op == KILN_OP_LINEAR ? t->input_scale : 0.0f;
}

kiln_tensor *kiln_tensor_src(const kiln_tensor *t, int i)
{
    return t && i >= 0 && i < KILN_MAX_SRC ? t->src[i] : NULL;
}

/* ---------------------------------------------------------------- order */

/* Depth-first from each output, emitting a tensor once all its sources are
 * out (post-order). Iterative, so a deep chain cannot overflow the C stack;
 * the explicit stack holds each tensor at most once, so it needs no more
 * entries than the graph has tensors. Sources always precede their users in
 * creation order, so the graph cannot hold a cycle. */
static kiln_status topo_build(kiln_graph *g)
{
    int nt = g->tensors.n;
    struct frame {
        kiln_tensor *t;
        int next_src;
    } *stack = kiln_malloc((size_t)nt * sizeof *stack);
    unsigned char *seen = kiln_calloc((size_t)nt, 1);
    kiln_status st = stack && seen ? list_reserve(&g->topo, nt)
                                   : kiln_fail(KILN_ERR_NOMEM, "graph topo: out of memory");
    if (st == KILN_OK) {
        g->topo.n = 0;
        for (int o = 0; o < g->outputs.n; o++) {
            kiln_tensor *root = g->outputs.v[o];
            if (seen[root->id])
                continue;
            seen[root->id] = 1;
            int sp = 0;
            stack[sp++] = (struct frame){ root, 0 };
            while (sp > 0) {
                struct frame *f = &stack[sp - 1];
                if (f->next_src < KILN_MAX_SRC) {
                    kiln_tensor *s = f->t->src[f->next_src++];
                    if (s && op_traits[s->op].computed && !seen[s->id]) {
                        seen[s->id] = 1;
                        stack[sp++] = (struct frame){ s, 0 };
                    }
                    continue;
                }
                if (op_traits[f->t->op].computed)
                    g->topo.v[g->topo.n++] = f->t;
                sp--;
            }
        }
        g->topo_valid = 1;
    }
    free(stack);
    free(seen);
    return st;
}

kiln_status kiln_graph_topo(kiln_graph *g, kiln_tensor *const **out, int *n)
{
    if (!g || !out || !n)
        return kiln_fail(KILN_ERR_INVALID_ARG, "graph topo: %s is NULL",
                         !g ? "graph" : !out ? "out" : "n");
    if (g->outputs.n == 0)
        return kiln_fail(KILN_ERR_STATE,
                         "graph topo: the graph has no outputs (mark them with kiln_graph_output)");
    if (!g->topo_valid) {
        kiln_status st = topo_build(g);
        if (st != KILN_OK)
            return st;
    }
    *out = g->topo.v;
    *n = g->topo.n;
    return KILN_OK;
}
