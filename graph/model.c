/* Container-independent side of a loaded model: opening by sniffing the file,
 * tensor lookup, and the graphs built from a Llama-family model. */
#include "model_impl.h"

#include "graph/gguf.h"
#include "graph/graph_impl.h"
#include "graph/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static kiln_status model_open(const char *path, kiln_model **out);

kiln_status kiln_model_open(const char *path, kiln_model **out)
{
    return kiln_model_open_with(path, NULL, out);
}

kiln_status kiln_model_open_with(const char *path, const kiln_model_options *opts,
                                 kiln_model **out)
{
    if (!path || !out)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_model_open: path and out are required");
    kiln_model *m;
    kiln_status st = model_open(path, &m);
    if (st != KILN_OK)
        return st;
    if (opts)
        m->opts = *opts;
    if (!m->opts.allow_nonfinite && (st = kiln_model_check_values(m)) != KILN_OK) {
        kiln_model_close(m);
        return st;
    }
    *out = m;
    return KILN_OK;
}

const char *const *kiln_model_warnings(const kiln_model *m)
{
    static const char *const none[] = { NULL };
    return m->warnings ? (const char *const *)m->warnings : none;
}

/* Keep a warning (allow_partial): printed by the caller, once. */
static kiln_status model_warn(kiln_model *m, const char *fmt, ...) KILN_PRINTF(2, 3);
static kiln_status model_warn(kiln_model *m, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    for (int i = 0; i < m->n_warnings; i++)
        if (!strcmp(m->warnings[i], text))
            return KILN_OK;
    char **w = kiln_realloc(m->warnings, (size_t)(m->n_warnings + 2) * sizeof *w);
    if (!w)
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for a warning", m->path);
    m->warnings = w;
    if (!(w[m->n_warnings] = kiln_strdup(text)))
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for a warning", m->path);
    w[++m->n_warnings] = NULL;
    return KILN_OK;
}

static kiln_status model_open(const char *path, kiln_model **out)
{
    struct stat sb;
    kiln_status st = kiln_file_stat(path, &sb);
    if (st != KILN_OK)
        return st;
    if (S_ISDIR(sb.st_mode))
        return kiln_safetensors_open(path, out);
    char magic[4] = { 0 };
    int fd;
    size_t size;
    if ((st = kiln_file_open_regular(path, &fd, &size)))
        return st;
    ssize_t got = read(fd, magic, sizeof magic);
    close(fd);
    if (got == (ssize_t)sizeof magic && !memcmp(magic, "GGUF", 4))
        return kiln_gguf_open(path, out);
    size_t len = strlen(path);
    if ((len >= 12 && !strcmp(path + len - 12, ".safetensors")) ||
        (len >= 5 && !strcmp(path + len - 5, ".json")))
        return kiln_safetensors_open(path, out);
    return kiln_fail(KILN_ERR_UNSUPPORTED,
                     "%s: neither a GGUF file (no 'GGUF' magic) nor a .safetensors file or "
                     "model directory", path);
}

void kiln_model_close(kiln_model *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_tensors; i++) {
        free(m->tensors[i].name);
        free(m->tensors[i].type_name);
        free(m->tensors[i].why);
    }
    free(m->tensors);
    for (int i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    for (int i = 0; i < m->n_warnings; i++)
        free(m->warnings[i]);
    free(m->warnings);
    if (m->impl_free)
        m->impl_free(m->impl);
    free(m->path);
    free(m->container);
    free(m);
}

const char *kiln_model_container(const kiln_model *m) { return m->container ? m->container : ""; }
const char *kiln_model_arch(const kiln_model *m) { return m->hp.arch; }

void kiln_model_get_info(const kiln_model *m, kiln_model_info *out)
{
    *out = (kiln_model_info){
        .n_layers = m->hp.n_layers,
        .d_model = m->hp.d_model,
        .d_ffn = m->hp.d_ffn,
        .n_heads = m->hp.n_heads,
        .n_kv_heads = m->hp.n_kv_heads,
        .vocab = m->hp.vocab,
        .ctx = m->hp.ctx,
        .rms_eps = m->hp.rms_eps,
    };
}

int kiln_model_n_tensors(const kiln_model *m) { return m->n_tensors; }

kiln_status kiln_model_tensor_at(const kiln_model *m, int i, kiln_model_tensor_info *out)
{
    if (i < 0 || i >= m->n_tensors)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: tensor index %d of %d", m->path, i,
                         m->n_tensors);
    const kiln_model_tensor *t = &m->tensors[i];
    *out = (kiln_model_tensor_info){
        .name = t->name,
        .type_name = t->type_name,
        .supported = t->supported,
        .format = t->qt.format,
        .n_dims = t->n_dims,
        .bytes = t->bytes,
        .group = t->supported ? t->qt.group : 0,
        .input_scale = t->input_scale,
    };
    memcpy(out->ne, t->ne, sizeof out->ne);
    return KILN_OK;
}

int kiln_model_n_metadata(const kiln_model *m) { return kiln_gguf_n_kv(m); }

kiln_status kiln_model_metadata_at(const kiln_model *m, int i, int max_items, const char **key,
                                   char *buf, size_t size)
{
    const kiln_gguf_value *v;
    const char *k = kiln_gguf_kv_at(m, i, &v);
    if (!k)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: metadata index %d of %d", m->path, i,
                         kiln_gguf_n_kv(m));
    if (!key || !buf || !size)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: metadata %s: no room for the %s", m->path, k,
                         !key ? "key" : "value");
    *key = k;
    kiln_gguf_value_summary(v, max_items, buf, size);
    return KILN_OK;
}

static const kiln_model_tensor *model_find(const kiln_model *m, const char *name)
{
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name))
            return &m->tensors[i];
    return NULL;
}

kiln_status kiln_model_weight(const kiln_model *m, const char *name, kiln_qtensor *out)
{
    const kiln_model_tensor *t = model_find(m, name);
    if (!t)
        return kiln_fail(KILN_ERR_NOT_FOUND, "%s: no tensor %s", m->path, name);
    if (!t->supported)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor %s: type %s is not supported%s%s",
                         m->path, name, t->type_name, t->why ? ": " : "", t->why ? t->why : "");
    *out = t->qt;
    return KILN_OK;
}

/* ------------------------------------------------------------ graphs */

/* A tensor's role in a Llama-family layer, named in both conventions. The
 * "%d" is the layer index; roles without one are model-wide. */
typedef struct model_role {
    const char *gguf;
    const char *hf;
} model_role;

enum {
    ROLE_Q, ROLE_K, ROLE_V, ROLE_O, ROLE_GATE, ROLE_UP, ROLE_DOWN,
    ROLE_FFN_NORM, ROLE_FFN_PRE_NORM, ROLE_FFN_POST_NORM, ROLE_HEAD, ROLE_HEAD_TIED, ROLE_COUNT
};

static const model_role roles[ROLE_COUNT] = {
    [ROLE_Q] = { "blk.%d.attn_q.weight", "model.layers.%d.self_attn.q_proj.weight" },
    [ROLE_K] = { "blk.%d.attn_k.weight", "model.layers.%d.self_attn.k_proj.weight" },
    [ROLE_V] = { "blk.%d.attn_v.weight", "model.layers.%d.self_attn.v_proj.weight" },
    [ROLE_O] = { "blk.%d.attn_output.weight", "model.layers.%d.self_attn.o_proj.weight" },
    [ROLE_GATE] = { "blk.%d.ffn_gate.weight", "model.layers.%d.mlp.gate_proj.weight" },
    [ROLE_UP] = { "blk.%d.ffn_up.weight", "model.layers.%d.mlp.up_proj.weight" },
    [ROLE_DOWN] = { "blk.%d.ffn_down.weight", "model.layers.%d.mlp.down_proj.weight" },
    [ROLE_FFN_NORM] = { "blk.%d.ffn_norm.weight",
                        "model.layers.%d.post_attention_layernorm.weight" },
    /* Gemma 2 and 3 norm the FFN's input and output; their
     * post_attention_layernorm belongs to the attention. */
    [ROLE_FFN_PRE_NORM] = { "blk.%d.ffn_norm.weight",
                            "model.layers.%d.pre_feedforward_layernorm.weight" },
    [ROLE_FFN_POST_NORM] = { "blk.%d.post_ffw_norm.weight",
                             "model.layers.%d.post_feedforward_layernorm.weight" },
    [ROLE_HEAD] = { "output.weight", "lm_head.weight" },
    [ROLE_HEAD_TIED] = { "token_embd.weight", "model.embed_tokens.weight" },
};

/* The stored name of role in layer l under whichever convention the model
 * uses; NULL when the model has neither. */
static const kiln_model_tensor *model_role_find(const kiln_model *m, int role, int l,
                                                char *name, size_t cap)
{
    const char *pats[2] = { roles[role].gguf, roles[role].hf };
    for (int c = 0; c < 2; c++) {
        snprintf(name, cap, pats[c], l);
        const kiln_model_tensor *t = model_find(m, name);
        if (t)
            return t;
    }
    /* compressed-tensors' packed integer weights: found, so that the error
     * says why kiln cannot use them. */
    char packed[256];
    snprintf(packed, sizeof packed, pats[1], l);
    snprintf(packed + strlen(packed), sizeof packed - strlen(packed), "_packed");
    const kiln_model_tensor *t = model_find(m, packed);
    if (t) {
        snprintf(name, cap, "%s", packed);
        return t;
    }
    snprintf(name, cap, pats[0], l);
    return NULL;
}

/* The tensor of role in layer l; KILN_ERR_NOT_FOUND naming both its
 * names when the file has neither. */
static kiln_status model_role_need(const kiln_model *m, int role, int l,
                                   const kiln_model_tensor **out)
{
    char name[256], hf[256];
    if ((*out = model_role_find(m, role, l, name, sizeof name)))
        return KILN_OK;
    snprintf(name, sizeof name, roles[role].gguf, l);
    snprintf(hf, sizeof hf, roles[role].hf, l);
    return kiln_fail(KILN_ERR_NOT_FOUND, "%s: layer %d has no %s (nor %s)", m->path, l, name, hf);
}

void kiln_model_spans(const kiln_model *m, kiln_tensor *w)
{
    const kiln_qtensor *q = &w->weight;
    size_t data = 0, scale = 0;
    if (!m->impl_file_of || kiln_format_data_bytes(q->format, q->n, q->k, &data) != KILN_OK ||
        kiln_qtensor_scale_bytes(q, &scale) != KILN_OK)
        return;
    m->impl_file_of(m, q->data, data, &w->data_file);
    if (scale && q->scale)
        m->impl_file_of(m, q->scale, scale, &w->scale_file);
}

/* Rows [r0, r0 + rows) of q, a view of its bytes. KILN_ERR_SHAPE when its
 * scales do not split there (a 128-row block). */
static kiln_status qtensor_rows(const kiln_qtensor *q, int64_t r0, int64_t rows,
                                kiln_qtensor *out)
{
    const kiln_format_info *fi = kiln_format_get(q->format);
    size_t data = 0, scale = 0;
    kiln_qtensor head = *q;
    head.n = r0;
    if (fi->scale_rows > 1 && r0 % fi->scale_rows)
        return kiln_fail(KILN_ERR_SHAPE, "row %lld is inside a block of %d rows of scales",
                         (long long)r0, fi->scale_rows);
    kiln_status st = r0 ? kiln_format_data_bytes(q->format, r0, q->k, &data) : KILN_OK;
    if (st == KILN_OK && r0 && q->scale && fi->scale_rows)
        st = kiln_qtensor_scale_bytes(&head, &scale);
    if (st)
        return st;
    *out = *q;
    out->n = rows;
    out->data = (uint8_t *)q->data + data;
    if (q->scale)
        out->scale = (uint8_t *)q->scale + scale;
    return KILN_OK;
}

kiln_status kiln_model_graph_weight(const kiln_model *m, const char *name, kiln_qtensor *out)
{
    const char *colon = strrchr(name, ':');
    if (!colon || (strcmp(colon, ":gate") && strcmp(colon, ":up")))
        return kiln_model_weight(m, name, out);
    char base[256];
    snprintf(base, sizeof base, "%.*s", (int)(colon - name), name);
    kiln_qtensor q;
    kiln_status st = kiln_model_weight(m, base, &q);
    if (st == KILN_OK && q.n % 2)
        st = kiln_fail(KILN_ERR_SHAPE, "%s: tensor %s: a fused gate and up projection has an "
                       "even number of rows, not %lld", m->path, base, (long long)q.n);
    if (st == KILN_OK && (st = qtensor_rows(&q, colon[1] == 'g' ? 0 : q.n / 2, q.n / 2, out)))
        st = kiln_fail_prefix(st, "%s: tensor %s: its gate and up halves", m->path, base);
    return st;
}

/* Phi-3's gate and up projections in one tensor: HF's mlp.gate_up_proj,
 * GGUF's ffn_up of twice the rows where there is no ffn_gate. The gate is
 * the first half of its rows, up the second (transformers' Phi3MLP
 * chunks the product in two, llama.cpp's fused SwiGLU splits it so). *out
 * is NULL when the layer has separate gate and up projections. */
static kiln_status model_gate_up_half(const kiln_model *m, kiln_graph *g, int role, int l,
                                      kiln_tensor **out)
{
    char name[256], fused[256];
    *out = NULL;
    if ((role != ROLE_GATE && role != ROLE_UP) || model_role_find(m, ROLE_GATE, l, name,
                                                                   sizeof name))
        return KILN_OK;
    snprintf(fused, sizeof fused, "model.layers.%d.mlp.gate_up_proj.weight", l);
    const kiln_model_tensor *t = model_find(m, fused);
    if (!t) { /* GGUF: only an ffn_up of twice the rows ffn_down reads */
        kiln_qtensor up, down;
        snprintf(fused, sizeof fused, roles[ROLE_UP].gguf, l);
        snprintf(name, sizeof name, roles[ROLE_DOWN].gguf, l);
        t = model_find(m, fused);
        if (t && (!model_find(m, name) || kiln_model_weight(m, fused, &up) ||
                  kiln_model_weight(m, name, &down) || up.n != 2 * down.k))
            t = NULL;
    }
    if (!t)
        return KILN_OK;
    if (t->n_dims != 2)
        return kiln_fail(KILN_ERR_SHAPE, "%s: tensor %s: a linear weight must be 2-D, not %d-D",
                         m->path, t->name, t->n_dims);
    snprintf(name, sizeof name, "%s:%s", t->name, role == ROLE_GATE ? "gate" : "up");
    if ((*out = kiln_graph_find(g, name)))
        return KILN_OK;
    kiln_qtensor half;
    kiln_status st = kiln_model_graph_weight(m, name, &half);
    if (st == KILN_OK && (st = kiln_graph_weight(g, name, &half, out)) == KILN_OK)
        kiln_model_spans(m, *out);
    return st;
}

static kiln_status model_role_weight(const kiln_model *m, kiln_graph *g, int role, int l,
                                     kiln_tensor **out)
{
    kiln_status fused = model_gate_up_half(m, g, role, l, out);
    if (fused != KILN_OK || *out)
        return fused;
    const kiln_model_tensor *t;
    kiln_status st = model_role_need(m, role, l, &t);
    if (st != KILN_OK)
        return st;
    kiln_tensor *w = kiln_graph_find(g, t->name);
    if (w) {
        *out = w;
        return KILN_OK;
    }
    kiln_qtensor q;
    st = kiln_model_weight(m, t->name, &q);
    if (st == KILN_OK && t->n_dims != 2)
        st = kiln_fail(KILN_ERR_SHAPE, "%s: tensor %s: a linear weight must be 2-D, not %d-D",
                       m->path, t->name, t->n_dims);
    if (st == KILN_OK)
        st = kiln_graph_weight(g, t->name, &q, out);
    if (st == KILN_OK)
        kiln_model_spans(m, *out);
    return st;
}

static kiln_status model_keep(kiln_model *m, void *p)
{
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 16;
        void **v = kiln_realloc(m->owned, (size_t)cap * sizeof *v);
        if (!v)
            return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for parameter copies", m->path);
        m->owned = v;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return KILN_OK;
}

/* A 1-D parameter t as f32 in memory that lives as long as the model: the
 * mapping itself when it already is aligned f32 and needs no offset, else a
 * converted copy. plus_one adds 1 to every element (in f32, as the
 * reference computes 1 + w). */
static kiln_status model_param_of(kiln_model *m, kiln_graph *g, const kiln_model_tensor *t,
                                  int64_t expect, int plus_one, kiln_tensor **out)
{
    kiln_status st;
    if (!t->supported)
        return kiln_model_weight(m, t->name, &(kiln_qtensor){ 0 });
    if (t->n_dims != 1 || t->ne[0] != expect)
        return kiln_fail(KILN_ERR_SHAPE, "%s: tensor %s: expected a vector of %lld, not %d-D "
                         "with %lld elements", m->path, t->name, (long long)expect, t->n_dims,
                         (long long)t->ne[0]);
    const float *data = t->qt.data;
    if (t->qt.format != KILN_FMT_F32 || ((uintptr_t)data & 3) || plus_one) {
        float *copy = kiln_malloc((size_t)expect * sizeof *copy);
        if (!copy)
            return kiln_fail(KILN_ERR_NOMEM, "%s: tensor %s: out of memory for its f32 copy", m->path,
                             t->name);
        kiln_qtensor q = t->qt;
        q.n = 1;
        q.k = expect;
        st = kiln_dequantize(&q, copy);
        for (int64_t i = 0; plus_one && i < expect; i++)
            copy[i] += 1.0f;
        if (st == KILN_OK)
            st = model_keep(m, copy);
        if (st != KILN_OK) {
            free(copy);
            return kiln_fail_prefix(st, "%s: tensor %s", m->path, t->name);
        }
        data = copy;
    }
    kiln_tensor *have = kiln_graph_find(g, t->name);
    if (have) {
        *out = have;
        return KILN_OK;
    }
    return kiln_graph_param(g, t->name, expect, data, out);
}

static kiln_status model_param(kiln_model *m, kiln_graph *g, int role, int l, int64_t expect,
                               int plus_one, kiln_tensor **out)
{
    const kiln_model_tensor *t;
    kiln_status st = model_role_need(m, role, l, &t);
    return st ? st : model_param_of(m, g, t, expect, plus_one, out);
}

/* The bias of linear weight w (its name with .bias for .weight), or NULL in
 * *out when the model has none. */
static kiln_status model_bias(kiln_model *m, kiln_graph *g, kiln_tensor *w, kiln_tensor **out)
{
    const char *name = kiln_tensor_name(w);
    size_t len = strlen(name);
    char bias[320];
    *out = NULL;
    if (len < 7 || strcmp(name + len - 7, ".weight") || len + 1 > sizeof bias)
        return KILN_OK;
    snprintf(bias, sizeof bias, "%.*s.bias", (int)(len - 7), name);
    const kiln_model_tensor *t = model_find(m, bias);
    return t ? model_param_of(m, g, t, kiln_tensor_ne(w, 1), 0, out) : KILN_OK;
}

/* linear y = x · wᵀ with the static activation scale of w's checkpoint
 * tensor, where it has one. */
static kiln_status model_linear(kiln_model *m, kiln_graph *g, const char *name, kiln_tensor *x,
                                kiln_tensor *w, kiln_tensor *bias, kiln_tensor **out)
{
    kiln_status st = kiln_graph_linear(g, name, x, w, bias, out);
    const kiln_model_tensor *t = st == KILN_OK ? model_find(m, kiln_tensor_name(w)) : NULL;
    if (t && t->input_scale > 0.0f && (st = kiln_graph_linear_input_scale(g, *out,
                                                                           t->input_scale)))
        return kiln_fail_prefix(st, "%s: tensor %s", m->path, t->name);
    return st;
}

/* How a family computes its FFN. An architecture is named by GGUF's
 * general.architecture or config.json's architectures[0]. */
typedef struct model_arch {
    const char *gguf, *hf;
    int gelu;          /* GELU (tanh) gate, else SiLU */
    int norm_plus_one; /* config.json checkpoints store norm weights as w - 1: x * (1 + w)
                          (llama.cpp's converter adds the 1 into GGUF files) */
    int post_norm;     /* RMS norms on the FFN's input and output (Gemma 2, 3) */
} model_arch;

static const model_arch model_archs[] = {
    { "llama", "LlamaForCausalLM", 0, 0, 0 },
    { "mistral", "MistralForCausalLM", 0, 0, 0 },
    { "qwen2", "Qwen2ForCausalLM", 0, 0, 0 },
    { "qwen3", "Qwen3ForCausalLM", 0, 0, 0 },
    { "phi3", "Phi3ForCausalLM", 0, 0, 0 },
    { "gemma", "GemmaForCausalLM", 1, 1, 0 },
    { "gemma2", "Gemma2ForCausalLM", 1, 1, 1 },
    { "gemma3", "Gemma3ForCausalLM", 1, 1, 1 },
};

/* The FFN of m: its family's, with the activation config.json names. A
 * family kiln does not know, or an activation it has no op for, is an
 * error, or a warning and the Llama FFN with allow_partial. A file that
 * names no architecture is taken as Llama-family. */
static kiln_status model_ffn_arch(kiln_model *m, model_arch *out)
{
    const char *arch = m->hp.arch;
    int hf = m->tensors && m->container && strncmp(m->container, "gguf", 4);
    *out = model_archs[0];
    if (arch[0]) {
        size_t i = 0;
        while (i < KILN_ARRAY_LEN(model_archs) && strcmp(model_archs[i].gguf, arch) &&
               strcmp(model_archs[i].hf, arch))
            i++;
        if (i < KILN_ARRAY_LEN(model_archs)) {
            *out = model_archs[i];
        } else {
            const char *fmt = "%s: architecture %s: kiln models the FFN of llama, mistral, "
                              "qwen2, qwen3, phi3, gemma, gemma2 and gemma3%s";
            if (!m->opts.allow_partial)
                return kiln_fail(KILN_ERR_UNSUPPORTED, fmt, m->path, arch,
                                 " (--allow-partial builds a Llama FFN with a warning)");
            kiln_status st = model_warn(m, fmt, m->path, arch, "; built as a Llama FFN");
            if (st)
                return st;
        }
    }
    if (!hf)
        out->norm_plus_one = 0;
    const char *act = m->hp.act;
    /* transformers runs Gemma with GELU (tanh) whatever its legacy
     * hidden_act says. */
    if (!act[0] || (m->hp.act_legacy && out->gelu))
        return KILN_OK;
    if (!strcmp(act, "silu") || !strcmp(act, "swish")) {
        out->gelu = 0;
        return KILN_OK;
    }
    if (!strcmp(act, "gelu_pytorch_tanh") || !strcmp(act, "gelu_new") ||
        !strcmp(act, "gelu_fast")) {
        out->gelu = 1;
        return KILN_OK;
    }
    const char *fmt = "%s: hidden activation %s: kiln's FFN activations are silu and GELU's "
                      "tanh approximation (gelu_pytorch_tanh)%s";
    if (!m->opts.allow_partial)
        return kiln_fail(KILN_ERR_UNSUPPORTED, fmt, m->path, act,
                         " (--allow-partial uses the nearest with a warning)");
    out->gelu = !strncmp(act, "gelu", 4);
    return model_warn(m, fmt, m->path, act, out->gelu ? "; built with GELU (tanh)" :
                      "; built with silu");
}

/* The layers a graph takes: n_layers, or all when 0 or more than the model
 * has. A layer count no file could back (more layers than tensors) is
 * refused rather than cut to an int. */
static kiln_status model_layers(const kiln_model *m, int n_layers, int *out)
{
    if (m->hp.n_layers > m->n_tensors)
        return kiln_fail(KILN_ERR_MALFORMED,
                         "%s: the model says it has %lld layers, more than its %d tensors "
                         "could hold", m->path, (long long)m->hp.n_layers, m->n_tensors);
    *out = n_layers > 0 && n_layers < m->hp.n_layers ? n_layers : (int)m->hp.n_layers;
    return KILN_OK;
}

/* Layer l's gate and up as one group with their own input:
 * blk.L.ffn_gate_up.out = act(gate(in)) * up(in), the FFN's first half,
 * which lowering runs as two linears, the second with the act·mul
 * epilogue. */
static kiln_status model_gate_up_group(kiln_model *m, kiln_graph *g, const model_arch *arch,
                                       int l)
{
    kiln_tensor *gate_w, *up_w, *gate_b, *up_b, *x, *gate, *up, *act, *prod;
    char n[5][64];
    static const char *const parts[] = { "in", "gate", "up", "act", "out" };
    for (int i = 0; i < 5; i++)
        snprintf(n[i], sizeof n[i], "blk.%d.ffn_gate_up.%s", l, parts[i]);
    kiln_status st;
    if ((st = model_role_weight(m, g, ROLE_GATE, l, &gate_w)) ||
        (st = model_role_weight(m, g, ROLE_UP, l, &up_w)) ||
        (st = model_bias(m, g, gate_w, &gate_b)) || (st = model_bias(m, g, up_w, &up_b)) ||
        (st = kiln_graph_input(g, n[0], kiln_tensor_ne(gate_w, 0), &x)) ||
        (st = model_linear(m, g, n[1], x, gate_w, gate_b, &gate)) ||
        (st = model_linear(m, g, n[2], x, up_w, up_b, &up)) ||
        (st = arch->gelu ? kiln_graph_gelu(g, n[3], gate, &act)
                         : kiln_graph_silu(g, n[3], gate, &act)) ||
        (st = kiln_graph_mul(g, n[4], act, up, &prod)))
        return st;
    return kiln_graph_output(g, prod);
}

static kiln_status model_build_linears(kiln_model *m, kiln_graph *g, int n_layers, int groups)
{
    static const int linear_roles[] = { ROLE_Q, ROLE_K, ROLE_V, ROLE_O,
                                        ROLE_GATE, ROLE_UP, ROLE_DOWN };
    if (m->hp.n_layers <= 0)
        return kiln_fail(KILN_ERR_MALFORMED, "%s: the model does not say how many layers it has",
                         m->path);
    int layers = 0;
    model_arch arch = { 0 };
    kiln_status st = model_layers(m, n_layers, &layers);
    if (st == KILN_OK && groups)
        st = model_ffn_arch(m, &arch);
    for (int l = 0; l <= layers && st == KILN_OK; l++) {
        int last = l == layers; /* the head after the layers */
        size_t n_roles = last ? 1 : sizeof linear_roles / sizeof linear_roles[0];
        for (size_t r = 0; r < n_roles && st == KILN_OK; r++) {
            int role = last ? ROLE_HEAD : linear_roles[r];
            kiln_tensor *w, *x, *y;
            char name[256];
            if (last && !model_role_find(m, ROLE_HEAD, 0, name, sizeof name))
                role = ROLE_HEAD_TIED;
            if ((st = model_role_weight(m, g, role, l, &w)))
                break;
            snprintf(name, sizeof name, "%s.in", kiln_tensor_name(w));
            if ((st = kiln_graph_input(g, name, kiln_tensor_ne(w, 0), &x)))
                break;
            kiln_tensor *bias;
            if ((st = model_bias(m, g, w, &bias)))
                break;
            snprintf(name, sizeof name, "%s.out", kiln_tensor_name(w));
            if ((st = model_linear(m, g, name, x, w, bias, &y)) ||
                (st = kiln_graph_output(g, y)))
                break;
        }
        if (st == KILN_OK && groups && !last)
            st = model_gate_up_group(m, g, &arch, l);
    }
    return st;
}

kiln_status kiln_model_build_linears(kiln_model *m, kiln_graph *g, int n_layers)
{
    return model_build_linears(m, g, n_layers, 0);
}

kiln_status kiln_model_build_engine(kiln_model *m, kiln_graph *g, int n_layers)
{
    return model_build_linears(m, g, n_layers, 1);
}

kiln_status kiln_model_build_ffn(kiln_model *m, kiln_graph *g, int n_layers)
{
    if (m->hp.n_layers <= 0 || m->hp.d_model <= 0)
        return kiln_fail(KILN_ERR_MALFORMED, "%s: the model does not give its layer count and "
                         "width", m->path);
    float eps = m->hp.has_rms_eps ? m->hp.rms_eps : 1e-5f;
    int layers = 0;
    kiln_tensor *x;
    model_arch arch;
    kiln_status st = model_ffn_arch(m, &arch);
    if (st == KILN_OK)
        st = model_layers(m, n_layers, &layers);
    if (st == KILN_OK)
        st = kiln_graph_input(g, "x", m->hp.d_model, &x);
    int norm_role = arch.post_norm ? ROLE_FFN_PRE_NORM : ROLE_FFN_NORM;
    for (int l = 0; l < layers && st == KILN_OK; l++) {
        kiln_tensor *norm_w, *gate_w, *up_w, *down_w, *h, *gate, *up, *act, *prod, *down;
        kiln_tensor *gate_b, *up_b, *down_b;
        char n[6][64];
        snprintf(n[0], 64, "blk.%d.ffn_norm", l);
        snprintf(n[1], 64, "blk.%d.ffn_gate", l);
        snprintf(n[2], 64, "blk.%d.ffn_up", l);
        snprintf(n[3], 64, "blk.%d.ffn_%s", l, arch.gelu ? "gelu" : "silu");
        snprintf(n[4], 64, "blk.%d.ffn_act", l);
        snprintf(n[5], 64, "blk.%d.ffn_down", l);
        if ((st = model_param(m, g, norm_role, l, m->hp.d_model, arch.norm_plus_one, &norm_w)) ||
            (st = model_role_weight(m, g, ROLE_GATE, l, &gate_w)) ||
            (st = model_role_weight(m, g, ROLE_UP, l, &up_w)) ||
            (st = model_role_weight(m, g, ROLE_DOWN, l, &down_w)) ||
            (st = model_bias(m, g, gate_w, &gate_b)) || (st = model_bias(m, g, up_w, &up_b)) ||
            (st = model_bias(m, g, down_w, &down_b)) ||
            (st = kiln_graph_rms_norm(g, n[0], x, norm_w, eps, &h)) ||
            (st = model_linear(m, g, n[1], h, gate_w, gate_b, &gate)) ||
            (st = model_linear(m, g, n[2], h, up_w, up_b, &up)) ||
            (st = arch.gelu ? kiln_graph_gelu(g, n[3], gate, &act)
                            : kiln_graph_silu(g, n[3], gate, &act)) ||
            (st = kiln_graph_mul(g, n[4], act, up, &prod)) ||
            (st = model_linear(m, g, n[5], prod, down_w, down_b, &down)))
            break;
        if (arch.post_norm) {
            kiln_tensor *post_w;
            snprintf(n[0], 64, "blk.%d.ffn_post_norm", l);
            if ((st = model_param(m, g, ROLE_FFN_POST_NORM, l, m->hp.d_model, arch.norm_plus_one,
                                  &post_w)) ||
                (st = kiln_graph_rms_norm(g, n[0], down, post_w, eps, &down)))
                break;
        }
        snprintf(n[0], 64, "blk.%d.ffn_out", l);
        st = kiln_graph_add(g, n[0], x, down, &x);
    }
    if (st == KILN_OK)
        st = kiln_graph_output(g, x);
    return st;
}
