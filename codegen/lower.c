/* Lowering: a graph and a target become a plan. Per token bucket, every
 * linear gets a backend (codegen/backend.c), epilogues are fused where the
 * chosen backend can, activation-quantization steps are inserted where it
 * consumes quantized activations, every step gets a de-duplicated kernel
 * signature, and a liveness plan places the activations in one arena. */
#include "codegen/emit.h"
#include "codegen/plan.h"
#include "core/tuning.h"
#include "codegen/select.h"
#include "codegen/target.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static const int64_t default_capture[] = { KILN_DEFAULT_CAPTURE_SIZES };

/* ------------------------------------------------------------ buckets */

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static kiln_status plan_buckets(kiln_plan *p, const kiln_plan_options *o)
{
    const int64_t *cap = o->capture ? o->capture : default_capture;
    int n_cap = o->capture ? o->n_capture : (int)KILN_ARRAY_LEN(default_capture);
    if (n_cap < 0 || (o->capture && n_cap == 0))
        return kiln_fail(KILN_ERR_INVALID_ARG, "plan: an empty list of capture sizes");
    int64_t max = o->max_tokens;
    for (int i = 0; i < n_cap; i++) {
        if (cap[i] < 1)
            return kiln_fail(KILN_ERR_INVALID_ARG, "plan: capture size %lld is not a token count",
                             (long long)cap[i]);
        if (!o->max_tokens && cap[i] > max)
            max = cap[i];
    }
    if (max < 1)
        return kiln_fail(KILN_ERR_INVALID_ARG, "plan: max tokens %lld is not a token count",
                         (long long)max);
    p->buckets = kiln_malloc((size_t)(n_cap + 2) * sizeof *p->buckets);
    if (!p->buckets)
        return kiln_fail(KILN_ERR_NOMEM, "plan: out of memory for the buckets");
    int n = 0;
    p->buckets[n++] = 1;
    p->buckets[n++] = max;
    for (int i = 0; i < n_cap; i++)
        if (cap[i] <= max)
            p->buckets[n++] = cap[i];
    qsort(p->buckets, (size_t)n, sizeof *p->buckets, cmp_i64);
    int w = 0;
    for (int i = 0; i < n; i++)
        if (!w || p->buckets[w - 1] != p->buckets[i])
            p->buckets[w++] = p->buckets[i];
    p->n_buckets = w;
    return KILN_OK;
}

int kiln_plan_n_buckets(const kiln_plan *p) { return p->n_buckets; }

int64_t kiln_plan_bucket(const kiln_plan *p, int i)
{
    return i >= 0 && i < p->n_buckets ? p->buckets[i] : -1;
}

int kiln_plan_bucket_for(const kiln_plan *p, int64_t m)
{
    for (int i = 0; i < p->n_buckets; i++)
        if (p->buckets[i] >= m)
            return i;
    return -1;
}

/* --------------------------------------------------------- signatures */

/* The plan's kernel d, printed as its signature: an index into the
 * signatures, a new one unless its text is there already. */
static kiln_status plan_signature(kiln_plan *p, kiln_kernel_desc *d, int *out)
{
    char text[KILN_SIG_MAX];
    kiln_status st = kiln_sig_print(d, text, sizeof text);
    if (st != KILN_OK)
        return st;
    for (int i = 0; i < p->n_signatures; i++)
        if (!strcmp(p->signatures[i].text, text)) {
            *out = i;
            return KILN_OK;
        }
    if ((st = kiln_sig_name(d, text)))
        return st;
    if (p->n_signatures == p->cap_signatures) {
        int cap = p->cap_signatures ? 2 * p->cap_signatures : 32;
        kiln_plan_sig *s = kiln_realloc(p->signatures, (size_t)cap * sizeof *s);
        if (!s)
            return kiln_fail(KILN_ERR_NOMEM, "plan: out of memory for the signatures");
        p->signatures = s;
        p->cap_signatures = cap;
    }
    char *copy = kiln_strdup(text);
    if (!copy)
        return kiln_fail(KILN_ERR_NOMEM, "plan: out of memory for the signatures");
    p->signatures[p->n_signatures] = (kiln_plan_sig){ .text = copy, .desc = *d };
    *out = p->n_signatures++;
    return KILN_OK;
}

/* A linear kernel: everything that determines the compiled code. M is
 * absent: buckets share a kernel unless the backend's variant depends on
 * them. */
static kiln_status plan_warn(kiln_plan *p, const char *text);

/* The tuning table's variant for d at bucket into d, where t holds one
 * that d's backend offers there (c->tuned set, the entry copied into the
 * plan's); a warning where it holds one the backend does not. */
static kiln_status apply_tuning(kiln_plan *p, const kiln_tuning *t, kiln_kernel_desc *d,
                                int64_t bucket, kiln_plan_choice *c)
{
    char key[KILN_SIG_MAX];
    kiln_kernel_desc any = *d;
    snprintf(any.linear.variant, sizeof any.linear.variant, "*");
    kiln_status st = kiln_sig_print(&any, key, sizeof key);
    if (st)
        return st;
    int i = kiln_tuning_index(t, key, bucket);
    if (i < 0)
        return KILN_OK;
    kiln_tuning_entry e;
    if ((st = kiln_tuning_at(t, i, &e)))
        return st;
    const char *names[KILN_MAX_CANDIDATES];
    char heuristic[KILN_TUNING_NAME_MAX];
    int n = kiln_backend_candidates(d->backend, &p->target, &d->linear.cfg, d->linear.act, bucket,
                                    names, KILN_MAX_CANDIDATES, heuristic);
    int offered = 0;
    for (int j = 0; j < n && !offered; j++)
        offered = !strcmp(names[j], e.variant);
    if (!offered) {
        char text[KILN_SIG_MAX + 256];
        snprintf(text, sizeof text,
                 "tuning: variant %s for M bucket %lld of \"%s\" is none that %s offers there; "
                 "the heuristic's %s is used",
                 e.variant, (long long)bucket, key, d->backend->name, d->linear.variant);
        return plan_warn(p, text);
    }
    if (!p->tuned && (st = kiln_tuning_create(&p->tuned)))
        return st;
    if ((st = kiln_tuning_set(p->tuned, &e)))
        return st;
    snprintf(d->linear.variant, sizeof d->linear.variant, "%s", e.variant);
    c->tuned = 1;
    return KILN_OK;
}

static kiln_status linear_signature(kiln_plan *p, const kiln_plan_lin *l, kiln_plan_choice *c,
                                    int64_t bucket, const kiln_tuning *tuning, int *out)
{
    kiln_kernel_desc d = { .kind = KILN_STEP_LINEAR, .target = p->kernel_target,
                           .backend = c->backend,
                           .linear = { .cfg = l->cfg, .act = c->act, .variant = "default" } };
    d.linear.cfg.epilogue = c->epilogue;
    kiln_backend_variant(c->backend, &p->target, &d.linear.cfg, bucket, d.linear.variant,
                         sizeof d.linear.variant);
    kiln_status st;
    if (kiln_tuning_n(tuning) && (st = apply_tuning(p, tuning, &d, bucket, c)))
        return st;
    return plan_signature(p, &d, out);
}

/* ------------------------------------------------------------- fusion */

/* How many op nodes of the topo order read t, and the last one. */
static int consumers(kiln_tensor *const *topo, int n, const kiln_tensor *t, kiln_tensor **last)
{
    int count = 0;
    for (int i = 0; i < n; i++)
        for (int s = 0; s < KILN_MAX_SRC; s++)
            if (topo[i]->src[s] == t) {
                count++;
                *last = topo[i];
            }
    return count;
}

/* The plan's linear of node t, or -1. */
static int linear_of(const kiln_plan *p, const kiln_tensor *t)
{
    for (int i = 0; i < p->n_linears; i++)
        if (p->linears[i].node == t)
            return i;
    return -1;
}

/* Whether the silu's input g can be computed by linear l's kernel (the
 * gate epilogue): a linear of the same input, format, shape and static
 * input scale, read by the silu alone, neither with a bias. */
static int gate_fits(const kiln_plan *p, const kiln_plan_lin *l, const kiln_tensor *g,
                     kiln_tensor *const *topo, int n)
{
    kiln_tensor *last;
    int gi = linear_of(p, g);
    if (gi < 0 || g->is_output || consumers(topo, n, g, &last) != 1)
        return -1;
    const kiln_plan_lin *gl = &p->linears[gi];
    const kiln_linear_cfg *a = &gl->cfg, *b = &l->cfg;
    if (g->src[0] != l->node->src[0] || g->src[2] || l->node->src[2] || a->format != b->format ||
        a->n != b->n || a->k != b->k || a->group != b->group ||
        g->input_scale != l->node->input_scale)
        return -1;
    return gi;
}

/* Find what each linear could absorb: the add that takes it as one operand
 * (residual), or the mul with a silu of another tensor (gated FFN), and
 * with that mul, the linear the silu reads (the gate projection, computed
 * in the same kernel where the backend can). Only a consumer that reads
 * nothing else of the linear and is its sole reader can be absorbed, and
 * never a graph output's producer. */
static void plan_fusion_candidates(kiln_plan *p, kiln_tensor *const *topo, int n)
{
    for (int i = 0; i < p->n_linears; i++) {
        kiln_plan_lin *l = &p->linears[i];
        kiln_tensor *c = NULL, *silu = NULL;
        if (l->node->is_output || consumers(topo, n, l->node, &c) != 1)
            continue;
        if (c->op == KILN_OP_ADD && c->src[0] != c->src[1]) {
            l->absorbed = c;
            l->aux = c->src[0] == l->node ? c->src[1] : c->src[0];
            l->candidate |= KILN_EPI_RESIDUAL;
        } else if (c->op == KILN_OP_MUL && c->src[0] != c->src[1]) {
            kiln_tensor *other = c->src[0] == l->node ? c->src[1] : c->src[0];
            if (other->op == KILN_OP_SILU && !other->is_output &&
                consumers(topo, n, other, &silu) == 1) {
                l->absorbed = c;
                l->absorbed2 = other;
                l->aux = other->src[0];
                l->candidate |= KILN_EPI_SILU_MUL;
                if ((l->gate = gate_fits(p, l, other->src[0], topo, n)) >= 0)
                    l->candidate |= KILN_EPI_GATE;
            }
        }
    }
}

/* ---------------------------------------------------------- selection */

static kiln_status plan_warn(kiln_plan *p, const char *text)
{
    for (int i = 0; i < p->n_warnings; i++)
        if (!strcmp(p->warnings[i], text))
            return KILN_OK;
    char **w = kiln_realloc(p->warnings, (size_t)(p->n_warnings + 2) * sizeof *w);
    if (!w)
        return kiln_fail(KILN_ERR_NOMEM, "plan: out of memory for the warnings");
    p->warnings = w;
    if (!(w[p->n_warnings] = kiln_strdup(text)))
        return kiln_fail(KILN_ERR_NOMEM, "plan: out of memory for the warnings");
    w[++p->n_warnings] = NULL;
    return KILN_OK;
}

static kiln_status plan_select(kiln_plan *p, const kiln_plan_options *o, const kiln_backend *forced)
{
    uint32_t warned = 0; /* one fallback warning per weight format */
    for (int i = 0; i < p->n_linears; i++) {
        kiln_plan_lin *l = &p->linears[i];
        for (int b = 0; b < p->n_buckets; b++) {
            kiln_plan_choice *c = &l->choice[b];
            kiln_choice ch;
            kiln_status st = kiln_backend_select(p->registry, &p->target, &l->cfg, p->buckets[b],
                                                 forced, l->node->name, &ch);
            if (st != KILN_OK)
                return st;
            if (ch.fell_back && o->strict_backend)
                return kiln_fail(KILN_ERR_NO_KERNEL,
                                 "--strict-backend: backend %s cannot take linear \"%s\" (%s, "
                                 "N=%lld, K=%lld, M bucket %lld): %s",
                                 forced->name, l->node->name,
                                 kiln_format_get(l->cfg.format)->name, (long long)l->cfg.n,
                                 (long long)l->cfg.k, (long long)p->buckets[b], ch.fallback_why);
            if (ch.fell_back && !(warned & (1u << l->cfg.format))) {
                char text[512];
                snprintf(text, sizeof text,
                         "backend %s cannot take %s linears (first: \"%s\", M bucket %lld: %s); "
                         "they use the normal selection",
                         forced->name, kiln_format_get(l->cfg.format)->name, l->node->name,
                         (long long)p->buckets[b], ch.fallback_why);
                if ((st = plan_warn(p, text)))
                    return st;
                warned |= 1u << l->cfg.format;
            }
            c->backend = ch.backend;
            c->fell_back = ch.fell_back;
            c->act = kiln_backend_act(c->backend, &p->target, &l->cfg, p->buckets[b]);
            c->quant = c->act;
            if (l->node->input_scale > 0.0f) {
                kiln_act sf = kiln_act_static_form(c->act);
                c->ignores_scale = sf == KILN_ACT_COUNT;
                c->quant = c->ignores_scale ? c->act : sf;
            }
            c->epilogue = l->cfg.epilogue | (l->candidate & c->backend->epilogues);
            if (!(c->epilogue & KILN_EPI_SILU_MUL))
                c->epilogue &= ~KILN_EPI_GATE;
            c->gate_of = -1;
            if (!(c->refused = kiln_strdup(ch.refused)))
                return kiln_fail(KILN_ERR_NOMEM, "plan: out of memory for the refusals");
        }
    }
    /* A gate projection computed by its up projection's kernel runs where
     * both chose the same kernel form; it then has no step of its own. */
    for (int i = 0; i < p->n_linears; i++)
        for (int b = 0; b < p->n_buckets; b++) {
            kiln_plan_choice *c = &p->linears[i].choice[b];
            if (!(c->epilogue & KILN_EPI_GATE))
                continue;
            kiln_plan_choice *g = &p->linears[p->linears[i].gate].choice[b];
            if (g->backend != c->backend || g->act != c->act || g->quant != c->quant ||
                g->gate_of >= 0 || (g->epilogue & KILN_EPI_GATE))
                c->epilogue &= ~KILN_EPI_GATE;
            else
                g->gate_of = i;
        }
    for (int i = 0; i < p->n_linears; i++)
        for (int b = 0; b < p->n_buckets; b++) {
            kiln_plan_choice *c = &p->linears[i].choice[b];
            kiln_status st;
            if (c->gate_of < 0 &&
                (st = linear_signature(p, &p->linears[i], c, p->buckets[b], o->tuning,
                                       &c->signature)))
                return st;
        }
    for (int i = 0; i < p->n_linears; i++)
        for (int b = 0; b < p->n_buckets; b++) {
            kiln_plan_choice *c = &p->linears[i].choice[b];
            if (c->gate_of >= 0)
                c->signature = p->linears[c->gate_of].choice[b].signature;
        }
    return KILN_OK;
}

/* ----------------------------------------------------------- programs */

typedef struct builder {
    kiln_plan *p;
    kiln_program *bk;
    int bucket;
    int *value_of; /* tensor id -> value id, -1 none */
    int cap_steps;
} builder;

static kiln_status add_value(builder *b, kiln_tensor *t, int64_t width, kiln_act act, int *out)
{
    kiln_program *bk = b->bk;
    if (bk->n_values == bk->cap_values) {
        int cap = bk->cap_values ? 2 * bk->cap_values : 64;
        kiln_value *v = kiln_realloc(bk->values, (size_t)cap * sizeof *v);
        if (!v)
            return kiln_fail(KILN_ERR_NOMEM, "plan: out of memory for the values");
        bk->values = v;
        bk->cap_values = cap;
    }
    kiln_value *v = &bk->values[bk->n_values];
    *v = (kiln_value){ .tensor = t, .width = width, .act = act, .first = -1, .last = -1 };
    size_t row = kiln_act_row_bytes(act, width);
    if (!kiln_mul_size(row, (size_t)bk->m, &v->bytes))
        return kiln_fail(KILN_ERR_SHAPE, "plan: %s [%lld, %lld] overflows the address space",
                         t ? t->name : "activation", (long long)bk->m, (long long)width);
    if (t)
        b->value_of[t->id] = bk->n_values;
    *out = bk->n_values++;
    return KILN_OK;
}

static kiln_status add_step(builder *b, kiln_step s)
{
    kiln_program *bk = b->bk;
    if (bk->n_steps == b->cap_steps) {
        int cap = b->cap_steps ? 2 * b->cap_steps : 64;
        kiln_step *v = kiln_realloc(bk->steps, (size_t)cap * sizeof *v);
        if (!v)
            return kiln_fail(KILN_ERR_NOMEM, "plan: out of memory for the steps");
        bk->steps = v;
        b->cap_steps = cap;
    }
    int idx = bk->n_steps++;
    bk->steps[idx] = s;
    for (int i = 0; i < KILN_STEP_MAX_SRC; i++)
        if (s.src[i] >= 0)
            bk->values[s.src[i]].last = idx;
    bk->values[s.dst].first = idx;
    return KILN_OK;
}

static kiln_status aux_signature(builder *b, kiln_step *s)
{
    kiln_kernel_desc d = { .kind = s->kind, .target = b->p->kernel_target,
                           .width = b->bk->values[s->dst].width };
    if (s->kind == KILN_STEP_QUANT)
        d.act = s->act;
    else
        d.op = s->node->op;
    return plan_signature(b->p, &d, &s->signature);
}

/* The value holding x quantized to act (with input_scale, for a static
 * scheme; else 0), made by one QUANT step shared by every linear of the
 * bucket that reads x in that scheme and with that scale. */
static kiln_status quantized(builder *b, int x, kiln_act act, float input_scale, int *out)
{
    kiln_program *bk = b->bk;
    for (int i = 0; i < bk->n_steps; i++)
        if (bk->steps[i].kind == KILN_STEP_QUANT && bk->steps[i].src[0] == x &&
            bk->steps[i].act == act && bk->steps[i].input_scale == input_scale) {
            *out = bk->steps[i].dst;
            return KILN_OK;
        }
    int q;
    kiln_status st = add_value(b, NULL, bk->values[x].width, act, &q);
    kiln_step s = { .kind = KILN_STEP_QUANT, .node = bk->values[x].tensor, .act = act,
                    .input_scale = input_scale, .src = { x, -1, -1 }, .dst = q };
    if (st == KILN_OK)
        st = aux_signature(b, &s);
    if (st == KILN_OK)
        st = add_step(b, s);
    *out = q;
    return st;
}

static int value_of(builder *b, const kiln_tensor *t) { return b->value_of[t->id]; }

static kiln_status build_program(builder *b, kiln_tensor *const *topo, int n)
{
    kiln_plan *p = b->p;
    kiln_graph *g = p->graph;
    kiln_status st = KILN_OK;
    int v;
    for (int i = 0; i < g->inputs.n && st == KILN_OK; i++)
        st = add_value(b, g->inputs.v[i], g->inputs.v[i]->ne[0], KILN_ACT_BF16, &v);
    /* A node absorbed into a linear produces no value of its own; the fused
     * linear runs where its consumer would have (all aux inputs are ready
     * there, by topological order). */
    for (int i = 0; i < n && st == KILN_OK; i++) {
        kiln_tensor *t = topo[i];
        int li = -1, absorbed = 0;
        for (int j = 0; j < p->n_linears; j++) {
            const kiln_plan_lin *l = &p->linears[j];
            unsigned fused = l->choice[b->bucket].epilogue & ~KILN_EPI_BIAS;
            if (l->node == t && fused)
                absorbed = 1; /* emitted at its consumer */
            if (l->node == t && l->choice[b->bucket].gate_of >= 0)
                absorbed = 1; /* computed by its up projection's kernel */
            if (fused && (l->absorbed2 == t))
                absorbed = 1;
            if (fused && l->absorbed == t)
                li = j;
            if (!fused && l->node == t)
                li = j;
        }
        if (absorbed)
            continue;
        if (li < 0) {
            kiln_step s = { .kind = KILN_STEP_OP, .node = t, .linear = -1, .src = { -1, -1, -1 } };
            for (int k = 0; k < KILN_MAX_SRC && t->src[k]; k++)
                if (t->src[k]->op != KILN_OP_PARAM)
                    s.src[k] = value_of(b, t->src[k]);
            if ((st = add_value(b, t, t->ne[0], KILN_ACT_BF16, &s.dst)) ||
                (st = aux_signature(b, &s)))
                break;
            st = add_step(b, s);
            continue;
        }
        const kiln_plan_lin *l = &p->linears[li];
        const kiln_plan_choice *c = &l->choice[b->bucket];
        kiln_step s = { .kind = KILN_STEP_LINEAR, .node = t, .linear = li,
                        .src = { value_of(b, l->node->src[0]), -1, -1 },
                        .signature = c->signature };
        float scale = c->quant != c->act ? l->node->input_scale : 0.0f;
        if (c->quant != KILN_ACT_BF16 &&
            (st = quantized(b, s.src[0], c->quant, scale, &s.src[0])))
            break;
        if ((c->epilogue & (KILN_EPI_RESIDUAL | KILN_EPI_SILU_MUL)) &&
            !(c->epilogue & KILN_EPI_GATE))
            s.src[1] = value_of(b, l->aux);
        if ((st = add_value(b, t, l->cfg.n, KILN_ACT_BF16, &s.dst)))
            break;
        st = add_step(b, s);
    }
    for (int i = 0; i < g->outputs.n && st == KILN_OK; i++)
        b->bk->values[value_of(b, g->outputs.v[i])].last = b->bk->n_steps;
    return st;
}

/* What the runtime needs of each step of bk, decided here: a linear's
 * weight, bias and weight layout, and every step's launches for bk's m as
 * the target fixes them (kiln_launch_finalise does the rest on a device).
 * A planning-only backend (no code hooks) gets no launches. */
static kiln_status plan_launches(kiln_plan *p, kiln_program *bk)
{
    for (int i = 0; i < bk->n_steps; i++) {
        kiln_step *s = &bk->steps[i];
        const kiln_kernel_desc *d = &p->signatures[s->signature].desc;
        if (s->kind == KILN_STEP_LINEAR) {
            const kiln_tensor *lin = p->linears[s->linear].node;
            s->weight = lin->src[1];
            s->bias = lin->src[2];
            if (d->linear.cfg.epilogue & KILN_EPI_GATE)
                s->weight2 = p->linears[p->linears[s->linear].gate].node->src[1];
            kiln_status st;
            if (d->backend->layout && (st = d->backend->layout(&p->target, &d->linear, &s->layout)))
                return kiln_fail_prefix(st, "weight %s", s->weight->name);
            if (s->layout.device_pack) {
                kiln_kernel_desc pd = { .kind = KILN_STEP_PACK, .target = p->kernel_target };
                pd.linear.cfg.format = d->linear.cfg.format;
                if ((st = plan_signature(p, &pd, &s->layout.packer)))
                    return st;
                d = &p->signatures[s->signature].desc; /* the signatures may have moved */
            }
            if (!d->backend->launch)
                continue;
        }
        kiln_kernel_launch l[KILN_MAX_LAUNCHES];
        kiln_status st = kiln_kernel_launches(d, bk->m, l, &s->n_launch);
        if (st != KILN_OK)
            return kiln_fail_prefix(st, "plan: bucket %lld", (long long)bk->m);
        for (int f = 0; f < s->n_launch; f++)
            s->launch[f] = l[f].cfg;
    }
    return KILN_OK;
}

/* The tuning key of program bk, its whole step: "step target=T steps=N
 * hash=H", H chaining XXH3 over its steps' signatures in stream order, so
 * that another shape mix, kernel or layer count has another key. */
static void step_key(const kiln_plan *p, const kiln_program *bk, char *out, size_t size)
{
    uint64_t h = 0;
    for (int i = 0; i < bk->n_steps; i++) {
        const char *sig = p->signatures[bk->steps[i].signature].text;
        h = XXH3_64bits_withSeed(sig, strlen(sig), h);
    }
    snprintf(out, size, "step target=%s steps=%d hash=%016llx", p->kernel_target.name,
             bk->n_steps, (unsigned long long)h);
}

/* The tuning table's launch policy for program bk: "serial" clears every
 * launch's overlap, so each kernel starts after the one before it ends;
 * "overlap" keeps the backends' permissions, as no entry does. The entry
 * is copied into the plan's (an export carries it); any other variant
 * leaves a warning. */
static kiln_status apply_step_tuning(kiln_plan *p, const kiln_tuning *t, kiln_program *bk)
{
    char key[KILN_SIGNATURE_MAX];
    step_key(p, bk, key, sizeof key);
    int i = kiln_tuning_index(t, key, bk->m);
    if (i < 0)
        return KILN_OK;
    kiln_tuning_entry e;
    kiln_status st = kiln_tuning_at(t, i, &e);
    if (st)
        return st;
    const int serial = !strcmp(e.variant, "serial");
    if (!serial && strcmp(e.variant, "overlap")) {
        char text[KILN_SIGNATURE_MAX + 256];
        snprintf(text, sizeof text,
                 "tuning: launch policy %s for M bucket %lld of \"%s\" is neither overlap nor "
                 "serial; the kernels keep their overlap",
                 e.variant, (long long)bk->m, key);
        return plan_warn(p, text);
    }
    bk->tuned = 1;
    bk->serial = serial;
    for (int s = 0; s < bk->n_steps && serial; s++)
        for (int f = 0; f < bk->steps[s].n_launch; f++)
            bk->steps[s].launch[f].overlap = 0;
    if (!p->tuned && (st = kiln_tuning_create(&p->tuned)))
        return st;
    return kiln_tuning_set(p->tuned, &e);
}

/* First-fit placement in the order values are produced: a value takes the
 * lowest offset where it overlaps no earlier-placed value whose live range
 * [first, last] meets its own. Ranges are inclusive, so a step's output never
 * shares bytes with an input that dies at the same step: no kernel writes
 * over what it reads. */
static void plan_memory(kiln_program *bk)
{
    size_t top = 0, naive = 0;
    for (int s = -1; s < bk->n_steps; s++) {
        for (int i = 0; i < bk->n_values; i++) {
            kiln_value *v = &bk->values[i];
            if (v->first != s)
                continue;
            if (v->last < v->first)
                v->last = v->first;
            size_t size = (v->bytes + KILN_ARENA_ALIGN - 1) & ~(size_t)(KILN_ARENA_ALIGN - 1);
            size_t off = 0;
            for (int moved = 1; moved;) {
                moved = 0;
                for (int j = 0; j < bk->n_values; j++) {
                    const kiln_value *u = &bk->values[j];
                    int earlier = u->first < s || (u->first == s && j < i);
                    if (!earlier || u->last < v->first)
                        continue;
                    if (off < u->offset + u->bytes && u->offset < off + size) {
                        off = (u->offset + u->bytes + KILN_ARENA_ALIGN - 1) &
                              ~(size_t)(KILN_ARENA_ALIGN - 1);
                        moved = 1;
                    }
                }
            }
            v->offset = off;
            if (off + size > top)
                top = off + size;
            naive += size;
        }
    }
    bk->arena_bytes = top;
    bk->naive_bytes = naive;
}

/* -------------------------------------------------------------- create */

void kiln_plan_destroy(kiln_plan *p)
{
    if (!p)
        return;
    for (int i = 0; p->linears && i < p->n_linears; i++) {
        for (int b = 0; p->linears[i].choice && b < p->n_buckets; b++)
            free(p->linears[i].choice[b].refused);
        free(p->linears[i].choice);
    }
    free(p->linears);
    for (int b = 0; p->programs && b < p->n_buckets; b++) {
        free(p->programs[b].steps);
        free(p->programs[b].values);
    }
    free(p->programs);
    for (int i = 0; i < p->n_signatures; i++)
        free(p->signatures[i].text);
    free(p->signatures);
    for (int i = 0; i < p->n_warnings; i++)
        free(p->warnings[i]);
    free(p->warnings);
    free(p->buckets);
    kiln_tuning_destroy(p->tuned);
    free(p);
}

const kiln_tuning *kiln_plan_tuning(const kiln_plan *p) { return p ? p->tuned : NULL; }

int kiln_plan_candidates(const kiln_plan *p, int linear, int bucket, const char **names, int max,
                         char *key, size_t key_size)
{
    if (!p || !names || max < 1 || linear < 0 || linear >= p->n_linears || bucket < 0 ||
        bucket >= p->n_buckets)
        return 0;
    const kiln_kernel_desc *d = &p->signatures[p->linears[linear].choice[bucket].signature].desc;
    if (key) {
        kiln_kernel_desc any = *d;
        snprintf(any.linear.variant, sizeof any.linear.variant, "*");
        if (kiln_sig_print(&any, key, key_size))
            return 0;
    }
    char heuristic[KILN_TUNING_NAME_MAX];
    int n = kiln_backend_candidates(d->backend, &p->target, &d->linear.cfg, d->linear.act,
                                    p->buckets[bucket], names, max, heuristic);
    /* the heuristic's name lives in a buffer of this call: the plan's own
     * variant where that is the one (a backend with no candidates hook) */
    for (int i = 0; i < n; i++)
        if (names[i] == heuristic)
            names[i] = d->linear.variant;
    return n;
}

kiln_status kiln_plan_create_with(const kiln_registry *r, kiln_graph *g, const kiln_target *t,
                                  const kiln_plan_options *opts, kiln_plan **out)
{
    if (!r || !g || !t || !out)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "plan: registry, graph, target and out are required");
    const kiln_plan_options defaults = { 0 };
    const kiln_plan_options *o = opts ? opts : &defaults;
    const kiln_backend *forced = NULL;
    if (o->backend && !(forced = kiln_registry_find(r, o->backend))) {
        char built[256] = "";
        for (int i = 0; i < r->n; i++)
            snprintf(built + strlen(built), sizeof built - strlen(built), "%s%s", i ? ", " : "",
                     r->backends[i]->name);
        return kiln_fail(KILN_ERR_NOT_FOUND, "--backend %s: no such backend (built: %s)",
                         o->backend, r->n ? built : "none");
    }
    kiln_tensor *const *topo;
    int n;
    kiln_status st = kiln_graph_topo(g, &topo, &n);
    if (st != KILN_OK)
        return st;
    kiln_plan *p = kiln_calloc(1, sizeof *p);
    if (!p)
        return kiln_fail(KILN_ERR_NOMEM, "plan: out of memory");
    p->graph = g;
    p->target = *t;
    p->registry = r;
    if ((st = kiln_target_arch(t->name, &p->kernel_target))) {
        st = kiln_fail_prefix(st, "plan: kernels for target %s", t->name);
        goto fail;
    }
    if ((st = plan_buckets(p, o)))
        goto fail;
    for (int i = 0; i < n; i++)
        p->n_linears += topo[i]->op == KILN_OP_LINEAR;
    p->linears = kiln_calloc((size_t)p->n_linears + 1, sizeof *p->linears);
    p->programs = kiln_calloc((size_t)p->n_buckets, sizeof *p->programs);
    if (!p->linears || !p->programs) {
        st = kiln_fail(KILN_ERR_NOMEM, "plan: out of memory");
        goto fail;
    }
    for (int i = 0, j = 0; i < n; i++) {
        kiln_tensor *lin = topo[i];
        if (lin->op != KILN_OP_LINEAR)
            continue;
        kiln_plan_lin *l = &p->linears[j++];
        l->node = lin;
        l->gate = -1;
        const kiln_qtensor *wt = &lin->src[1]->weight;
        l->cfg = (kiln_linear_cfg){ .format = wt->format, .n = wt->n, .k = wt->k,
                                    .epilogue = lin->src[2] ? KILN_EPI_BIAS : 0,
                                    .group = kiln_format_get(wt->format)->grouped ? wt->group : 0 };
        if (!(l->choice = kiln_calloc((size_t)p->n_buckets, sizeof *l->choice))) {
            st = kiln_fail(KILN_ERR_NOMEM, "plan: out of memory");
            goto fail;
        }
    }
    if (!o->no_fuse)
        plan_fusion_candidates(p, topo, n);
    if ((st = plan_select(p, o, forced)))
        goto fail;
    builder b = { .p = p };
    b.value_of = kiln_malloc((size_t)g->tensors.n * sizeof *b.value_of);
    if (!b.value_of) {
        st = kiln_fail(KILN_ERR_NOMEM, "plan: out of memory");
        goto fail;
    }
    for (int i = 0; i < p->n_buckets && st == KILN_OK; i++) {
        memset(b.value_of, 0xff, (size_t)g->tensors.n * sizeof *b.value_of);
        b.bk = &p->programs[i];
        b.bucket = i;
        b.cap_steps = 0;
        b.bk->m = p->buckets[i];
        if ((st = build_program(&b, topo, n)) == KILN_OK) {
            plan_memory(b.bk);
            st = plan_launches(p, b.bk);
        }
        if (st == KILN_OK && kiln_tuning_n(o->tuning))
            st = apply_step_tuning(p, o->tuning, b.bk);
    }
    free(b.value_of);
    if (st != KILN_OK)
        goto fail;
    *out = p;
    return KILN_OK;
fail:
    kiln_plan_destroy(p);
    return st;
}

kiln_status kiln_plan_create(kiln_graph *g, const kiln_target *t, const kiln_plan_options *opts,
                             kiln_plan **out)
{
    return kiln_plan_create_with(kiln_registry_default(), g, t, opts, out);
}

/* ------------------------------------------------------------ queries */

int kiln_plan_n_linears(const kiln_plan *p) { return p->n_linears; }

kiln_status kiln_plan_linear_at(const kiln_plan *p, int linear, int bucket, kiln_plan_linear *out)
{
    if (linear < 0 || linear >= p->n_linears || bucket < 0 || bucket >= p->n_buckets)
        return kiln_fail(KILN_ERR_INVALID_ARG, "plan: linear %d of %d, bucket %d of %d", linear,
                         p->n_linears, bucket, p->n_buckets);
    const kiln_plan_lin *l = &p->linears[linear];
    const kiln_plan_choice *c = &l->choice[bucket];
    *out = (kiln_plan_linear){
        .node = l->node->name,
        .format = l->cfg.format,
        .n = l->cfg.n,
        .k = l->cfg.k,
        .backend = c->backend->name,
        .act = kiln_act_name(c->act),
        .epilogue = c->gate_of >= 0 ? "(in silu_mul+gate)" : kiln_epilogue_str(c->epilogue),
        .signature = c->signature,
        .refused = c->refused,
        .fell_back = c->fell_back,
        .input_scale = l->node->input_scale,
        .input_scale_use = !(l->node->input_scale > 0.0f) ? ""
                           : c->ignores_scale            ? "ignored"
                                                         : kiln_act_name(c->quant),
        .variant = p->signatures[c->signature].desc.linear.variant,
        .tuned = c->tuned,
    };
    return KILN_OK;
}

int kiln_plan_n_signatures(const kiln_plan *p) { return p->n_signatures; }

const char *kiln_plan_signature(const kiln_plan *p, int i)
{
    return i >= 0 && i < p->n_signatures ? p->signatures[i].text : NULL;
}

const char *const *kiln_plan_warnings(const kiln_plan *p)
{
    static const char *const none[] = { NULL };
    return p->warnings ? (const char *const *)p->warnings : none;
}

size_t kiln_plan_arena_bytes(const kiln_plan *p, int bucket)
{
    return bucket >= 0 && bucket < p->n_buckets ? p->programs[bucket].arena_bytes : 0;
}

kiln_status kiln_plan_step_key(const kiln_plan *p, int bucket, char *key, size_t size)
{
    if (!p || bucket < 0 || bucket >= p->n_buckets || !key || size < KILN_SIGNATURE_MAX)
        return kiln_fail(KILN_ERR_INVALID_ARG, "plan: step key of bucket %d of %d (%zu bytes)",
                         bucket, p ? p->n_buckets : 0, size);
    step_key(p, &p->programs[bucket], key, size);
    return KILN_OK;
}

int kiln_plan_step_policy(const kiln_plan *p, int bucket)
{
    if (!p || bucket < 0 || bucket >= p->n_buckets || !p->programs[bucket].tuned)
        return -1;
    return p->programs[bucket].serial;
}

int kiln_plan_step_overlaps(const kiln_plan *p, int bucket)
{
    int n = 0;
    for (int s = 0; p && bucket >= 0 && bucket < p->n_buckets && s < p->programs[bucket].n_steps;
         s++)
        for (int f = 0; f < p->programs[bucket].steps[s].n_launch; f++)
            n += p->programs[bucket].steps[s].launch[f].overlap;
    return n;
}

size_t kiln_plan_naive_bytes(const kiln_plan *p, int bucket)
{
    return bucket >= 0 && bucket < p->n_buckets ? p->programs[bucket].naive_bytes : 0;
}
