/* A loaded model file, whatever its container: the common form both readers
 * (gguf.c, safetensors.c) fill in and that model.c builds graphs from. */
#ifndef KILN_MODEL_IMPL_H
#define KILN_MODEL_IMPL_H

#include "core.h"
#include "graph/graph_impl.h"

#include <sys/stat.h>

/* One tensor as stored in the file (or, for a quantized safetensors weight,
 * the stored tensor joined with its scale tensors). */
typedef struct kiln_model_tensor {
    char *name;            /* as in the file: "blk.0.ffn_up.weight" */
    char *type_name;       /* the file's own type name: "Q4_K", "F8_E4M3", "IQ4_XS" */
    int supported;         /* 1 when qt below is usable */
    int n_dims;
    int64_t ne[4];         /* GGUF order: ne[0] is the innermost (K) dimension */
    size_t bytes;          /* bytes of the stored data */
    kiln_qtensor qt;       /* format, n, k, data (points into the mapping), scale, global */
    char *why;             /* when !supported: why, for the error message */
    float input_scale;     /* a linear weight's static activation scale; 0: none */
} kiln_model_tensor;

/* Llama-family hyper-parameters; 0 when the file does not say. */
typedef struct kiln_model_hparams {
    char arch[64];         /* "llama", "LlamaForCausalLM" */
    int64_t n_layers, d_model, d_ffn, n_heads, n_kv_heads, vocab, ctx;
    float rms_eps;
    int has_rms_eps;       /* the file gives rms_eps (which may be NaN) */
    char act[32];          /* config.json's hidden_activation or hidden_act; "" */
    int act_legacy;        /* act is hidden_act (which Gemma's configs do not follow) */
} kiln_model_hparams;

struct kiln_model {
    char *path;
    char *container;       /* "gguf v3", "safetensors (3 shards)" */
    kiln_model_hparams hp;
    kiln_model_tensor *tensors;
    int n_tensors;
    /* f32 copies of parameters the graphs need that the file stores in
     * another type or unaligned; freed at close */
    void **owned;
    int n_owned, cap_owned;
    kiln_model_options opts;
    /* kiln_model_warnings: n_warnings strings and a NULL */
    char **warnings;
    int n_warnings;
    /* container-specific state: mappings, parsed JSON, metadata */
    void *impl;
    void (*impl_free)(void *impl);
    /* Where in the model's files bytes [p, p + bytes) lie; out->path NULL
     * when they are not in one of its mappings (a converted copy). */
    void (*impl_file_of)(const struct kiln_model *m, const void *p, size_t bytes,
                         kiln_file_span *out);
};

/* The weight a graph built from m names name: kiln_model_weight's, or
 * for "<tensor>:gate" and "<tensor>:up", the halves of a fused gate and
 * up projection's rows (Phi-3). */
kiln_status kiln_model_graph_weight(const kiln_model *m, const char *name, kiln_qtensor *out);

/* Where w's data and scale (a weight of m) lie in m's files, for a
 * session to read them from there; none for bytes in no mapping. */
void kiln_model_spans(const kiln_model *m, kiln_tensor *w);

/* NaN or infinity in a scale, a global scale, a 1-D or scalar float tensor
 * or rms_norm_eps: KILN_ERR_MALFORMED naming the first (model_check.c). */
kiln_status kiln_model_check_values(const kiln_model *m);

/* Opening a model's files (graph/file.c). kiln_file_stat is stat(2)
 * with KILN_ERR_IO naming path on failure, a dangling symbolic link as
 * such. kiln_file_open_regular opens path read-only, never waiting on a
 * FIFO: KILN_ERR_IO naming path unless it is a regular file; *size is its
 * bytes. */
kiln_status kiln_file_stat(const char *path, struct stat *sb);
kiln_status kiln_file_open_regular(const char *path, int *fd, size_t *size);

#endif
