/*
 * kiln — an ahead-of-time compiler and runtime for quantized linear layers.
 *
 * Conventions (the same for every call below):
 *  - Every call that can fail returns a kiln_status; objects come back through
 *    an out-parameter that is left untouched on failure.
 *  - On failure, kiln_last_error() returns a thread-local message that says
 *    what went wrong and where (file, tensor, node). It stays valid until the
 *    next failing call on the same thread.
 *  - Handles are opaque. create/destroy come in pairs; destroy accepts NULL.
 *  - A pointer a call returns (or writes into an out-parameter or a struct)
 *    belongs to the object it was read from and stays valid until that
 *    object is destroyed or closed, unless the call says otherwise. What
 *    kiln_version, kiln_strerror, kiln_format_get, kiln_op_name and
 *    kiln_target_names return is static. The caller frees nothing kiln
 *    returns except through the function named for it.
 *  - Plain data (descriptors, options) are public structs in which zero means
 *    "default"; initialize them with designated initializers.
 *  - A linear computes Y[M,N] = X[M,K] · W[N,K]ᵀ (+ bias). W is row-major
 *    [N,K] as in PyTorch and GGUF; blocks of a quantized format run along K.
 *    M, the number of tokens, is the only dynamic dimension.
 */
#ifndef KILN_H
#define KILN_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 1
#define KILN_VERSION_PATCH 0

/* Marks what libkiln exports: the library is built with hidden visibility,
 * so the functions declared here are the only symbols libkiln.so exports. */
#if defined(__GNUC__)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif

/* "MAJOR.MINOR.PATCH" of the library actually linked. */
KILN_API const char *kiln_version(void);

/* ---------------------------------------------------------------- status */

/* Values only grow at the end: they are part of the ABI. */
typedef enum kiln_status {
    KILN_OK = 0,
    KILN_ERR_INVALID_ARG,  /* a caller passed something meaningless (NULL, negative size) */
    KILN_ERR_NOMEM,        /* an allocation failed */
    KILN_ERR_IO,           /* a file could not be opened, read, written or mapped */
    KILN_ERR_MALFORMED,    /* a file or record is not what it claims to be */
    KILN_ERR_UNSUPPORTED,  /* a valid request kiln does not implement (type, format, op) */
    KILN_ERR_SHAPE,        /* shapes do not fit together or break a format's block rule */
    KILN_ERR_NOT_FOUND,    /* a named thing (tensor, key, kernel) does not exist */
    KILN_ERR_STATE,        /* the object is not in a state that allows the call */
    KILN_ERR_NO_KERNEL,    /* no backend can implement a node on the target */
    KILN_ERR_COMPILE,      /* NVRTC rejected generated source, or did not finish in time */
    KILN_ERR_CACHE,        /* the kernel cache failed (LMDB error, corrupt record) */
    KILN_ERR_OFFLINE_MISS, /* offline mode and a kernel is not in any cache */
    KILN_ERR_CUDA,         /* a CUDA driver call failed */
    KILN_ERR_NO_DEVICE,    /* no GPU or no driver */
    KILN_STATUS_COUNT
} kiln_status;

/* The status's name and meaning, e.g. "KILN_ERR_SHAPE: shapes do not fit".
 * Never NULL; an unknown value gives a string that says so. */
KILN_API const char *kiln_strerror(kiln_status status);

/* The detail message of the last failing call on this thread, or "" when
 * there is none. */
KILN_API const char *kiln_last_error(void);

/* --------------------------------------------------------------- formats */

/* A weight storage format. Values only grow at the end. */
typedef enum kiln_format {
    KILN_FMT_F32 = 0,
    KILN_FMT_F16,
    KILN_FMT_BF16,
    KILN_FMT_FP8_TENSOR,  /* E4M3, one f32 scale for the tensor */
    KILN_FMT_FP8_CHANNEL, /* E4M3, one f32 scale per output row n */
    KILN_FMT_FP8_BLOCK,   /* E4M3, one f32 scale per 128x128 tile (DeepSeek-V3) */
    KILN_FMT_MXFP8,       /* OCP MX: 32 x E4M3 + E8M0 scale */
    KILN_FMT_NVFP4,       /* 16 x E2M1 + UE4M3 scale, f32 global scale */
    KILN_FMT_MXFP4,       /* OCP MX: 32 x E2M1 + E8M0 scale */
    KILN_FMT_Q8_0,        /* GGML type 8 */
    KILN_FMT_Q4_0,        /* GGML type 2 */
    KILN_FMT_Q4_K,        /* GGML type 12 */
    KILN_FMT_Q6_K,        /* GGML type 14 */
    KILN_FMT_GGML_MXFP4,  /* GGML type 39 */
    KILN_FMT_Q5_0,        /* GGML type 6 */
    KILN_FMT_Q5_1,        /* GGML type 7 */
    KILN_FMT_Q2_K,        /* GGML type 10 */
    KILN_FMT_Q3_K,        /* GGML type 11 */
    KILN_FMT_Q5_K,        /* GGML type 13 */
    KILN_FMT_IQ4_NL,      /* GGML type 20 */
    KILN_FMT_IQ4_XS,      /* GGML type 23 */
    KILN_FMT_Q4_1,        /* GGML type 3 */
    KILN_FMT_INT4_GROUP,    /* int4 in int32 words, f32 scale per group (compressed-tensors) */
    KILN_FMT_INT4_GROUP_ZP, /* as INT4_GROUP, with an int8 zero point per group */
    KILN_FMT_INT8_GROUP,    /* int8 in int32 words, f32 scale per group (compressed-tensors) */
    KILN_FMT_INT8_GROUP_ZP, /* as INT8_GROUP, with an int8 zero point per group */
    KILN_FMT_COUNT
} kiln_format;

/* The element type of a format's separate scale array. */
typedef enum kiln_scale_type {
    KILN_SCALE_NONE = 0, /* no separate scales (plain, or GGML: scales inline in blocks) */
    KILN_SCALE_F32,
    KILN_SCALE_E8M0,
    KILN_SCALE_UE4M3,
} kiln_scale_type;

/* One row of the format table. Storage of a quantized W[N,K]:
 *   data:   N rows of (K / block) * block_bytes bytes, row-major;
 *   scales: when scale_type != NONE, an array of
 *           ceil(N / scale_rows) x ceil(K / scale_cols) elements, row-major
 *           (scale_rows == 0 means "all N rows", scale_cols == 0 "all K");
 *           in a grouped format, scale_cols is the weight's group
 *           (kiln_qtensor.group), and a format with zero points stores one
 *           int8 zero point per scale right after the scales, in the same
 *           order;
 *   global: when has_global_scale, one f32 multiplied into every value. */
typedef struct kiln_format_info {
    const char *name;      /* short name used by the CLI: "q4_k", "nvfp4" */
    const char *desc;      /* one line for humans */
    int block;             /* elements per block along K (1 for plain types) */
    int block_bytes;       /* bytes of data per block (GGML: inline scales included) */
    int k_multiple;        /* K must be a multiple of this */
    double bits_per_weight;/* data + scales, for a large tensor */
    kiln_scale_type scale_type;
    int scale_rows;
    int scale_cols;
    int has_global_scale;
    int gguf_type;         /* GGUF/GGML type id, or -1 */
    const char *scale_desc;/* "f16 per 32, inline" */
    int grouped;           /* scales per kiln_qtensor.group values along K (0: per row) */
    int zero_point;        /* an int8 zero point per scale follows the scales */
} kiln_format_info;

/* The table row of fmt, or NULL when fmt is out of range. */
KILN_API const kiln_format_info *kiln_format_get(kiln_format fmt);

/* Look a format up by its short name; KILN_ERR_NOT_FOUND if there is none. */
KILN_API kiln_status kiln_format_from_name(const char *name, kiln_format *out);

/* Bytes of the data array and of the scale array of an [n, k] tensor.
 * KILN_ERR_SHAPE when k breaks the format's k_multiple or a size overflows.
 * For a grouped format the scale bytes are those of group 0 (one scale per
 * row); kiln_qtensor_scale_bytes gives those of any group. */
KILN_API kiln_status kiln_format_data_bytes(kiln_format fmt, int64_t n, int64_t k, size_t *out);
KILN_API kiln_status kiln_format_scale_bytes(kiln_format fmt, int64_t n, int64_t k, size_t *out);

/* A quantized [n, k] tensor in caller memory. scale is NULL for formats with
 * scale_type NONE; global_scale is used only by formats with a global scale,
 * group only by grouped formats (both are ignored otherwise). */
typedef struct kiln_qtensor {
    kiln_format format;
    int64_t n, k;
    void *data;
    void *scale;
    float global_scale;
    /* Grouped formats: values along K that share a scale (and zero point).
     * 0: all K, one group per row; else a multiple of the format's block
     * that divides K. */
    int64_t group;
} kiln_qtensor;

/* Bytes of t's scale array (zero points included), for any format:
 * kiln_format_scale_bytes with t's group. KILN_ERR_SHAPE as
 * kiln_format_scale_bytes, and when a grouped format's group is negative,
 * not a multiple of its block or does not divide K. */
KILN_API kiln_status kiln_qtensor_scale_bytes(const kiln_qtensor *t, size_t *out);

/* CPU reference quantization of src[n*k] (row-major f32) into t. t->data and
 * t->scale must hold kiln_format_data_bytes / kiln_qtensor_scale_bytes bytes
 * (a grouped format quantizes in t->group);
 * the global scale (NVFP4) is computed and written to t->global_scale.
 * Follows the authoritative source of each format bit for bit (FORMATS.md). */
KILN_API kiln_status kiln_quantize(const float *src, kiln_qtensor *t);

/* CPU reference dequantization of t into dst[n*k] (row-major f32). */
KILN_API kiln_status kiln_dequantize(const kiln_qtensor *t, float *dst);

/* Element conversions, round to nearest even. The 8- and 4-bit types
 * saturate to their largest finite value (satfinite; E2M1 has no NaN and
 * takes NaN to +6); F16 and BF16 overflow to infinity as IEEE, numpy and
 * ggml do. NaN stays NaN where the type has one. */
KILN_API float kiln_e4m3_to_f32(uint8_t v);
KILN_API uint8_t kiln_f32_to_e4m3(float f);
KILN_API float kiln_e2m1_to_f32(uint8_t v);   /* low 4 bits */
KILN_API uint8_t kiln_f32_to_e2m1(float f);
KILN_API float kiln_e8m0_to_f32(uint8_t v);   /* 0xFF gives NaN */
KILN_API float kiln_f16_to_f32(uint16_t v);
KILN_API uint16_t kiln_f32_to_f16(float f);
KILN_API float kiln_bf16_to_f32(uint16_t v);
KILN_API uint16_t kiln_f32_to_bf16(float f);

/* ----------------------------------------------------------------- graph */

typedef struct kiln_graph kiln_graph;
typedef struct kiln_tensor kiln_tensor;

/* Operations. Values only grow at the end. */
typedef enum kiln_op {
    KILN_OP_INPUT = 0, /* activation [M, K], M dynamic */
    KILN_OP_WEIGHT,    /* quantized weight [N, K] */
    KILN_OP_PARAM,     /* f32 vector [N]: bias, norm weight */
    KILN_OP_LINEAR,    /* x[M,K] · w[N,K]ᵀ (+ bias[N]) */
    KILN_OP_ADD,
    KILN_OP_MUL,
    KILN_OP_SILU,
    KILN_OP_GELU,      /* tanh approximation */
    KILN_OP_RMS_NORM,  /* x / sqrt(mean(x²) + eps) · weight */
    KILN_OP_COUNT
} kiln_op;

/* Name of an op ("linear"), or "?" when out of range. */
KILN_API const char *kiln_op_name(kiln_op op);

/* A new, empty graph. It owns every tensor made through it; names are copied.
 * Weight and parameter data stay in caller memory, which must outlive the
 * graph and every object compiled from it. */
KILN_API kiln_status kiln_graph_create(kiln_graph **out);
KILN_API void kiln_graph_destroy(kiln_graph *g);

/* An activation input [M, k]. */
KILN_API kiln_status kiln_graph_input(kiln_graph *g, const char *name, int64_t k,
                                      kiln_tensor **out);

/* A weight [w->n, w->k] in any format. The descriptor is copied; the data
 * and scale arrays it points to are not. KILN_ERR_SHAPE when k is not a
 * multiple of the format's block, or a grouped format's group does not fit
 * it (kiln_qtensor_scale_bytes); KILN_ERR_UNSUPPORTED for an unknown format. */
KILN_API kiln_status kiln_graph_weight(kiln_graph *g, const char *name, const kiln_qtensor *w,
                                       kiln_tensor **out);

/* An f32 vector [n] (bias, norm weight) in caller memory. */
KILN_API kiln_status kiln_graph_param(kiln_graph *g, const char *name, int64_t n, const float *data,
                                      kiln_tensor **out);

/* y = x · wᵀ + bias. x is an activation [M, K], w a weight [N, K], bias NULL
 * or a param [N]. The result is [M, N]. */
KILN_API kiln_status kiln_graph_linear(kiln_graph *g, const char *name, kiln_tensor *x,
                                       kiln_tensor *w, kiln_tensor *bias, kiln_tensor **out);

/* Give linear a static activation scale (a checkpoint's input_scale): the
 * linear then computes y = (x_q · scale) · wᵀ (+ bias) with
 * x_q = e4m3(clamp(x / scale, ±448)), the activations quantized to E4M3
 * with that one scale for every token, as FP8 checkpoints with static
 * activations define it. The CPU executor (the reference) applies it, and
 * so do the GPU kernels, but for one that quantizes activations with
 * scales of its own (block FP8's 1x128 groups), which ignores it, as its
 * plan says (kiln_plan_linear.input_scale_use).
 * KILN_ERR_INVALID_ARG, naming the linear, when linear is not a linear of
 * g, or scale is not a positive finite number whose product with 448 is
 * finite. Setting it again replaces it. */
KILN_API kiln_status kiln_graph_linear_input_scale(kiln_graph *g, kiln_tensor *linear,
                                                   float scale);

/* Elementwise on activations of the same shape. */
KILN_API kiln_status kiln_graph_add(kiln_graph *g, const char *name, kiln_tensor *a, kiln_tensor *b,
                                    kiln_tensor **out);
KILN_API kiln_status kiln_graph_mul(kiln_graph *g, const char *name, kiln_tensor *a, kiln_tensor *b,
                                    kiln_tensor **out);
KILN_API kiln_status kiln_graph_silu(kiln_graph *g, const char *name, kiln_tensor *x,
                                     kiln_tensor **out);
KILN_API kiln_status kiln_graph_gelu(kiln_graph *g, const char *name, kiln_tensor *x,
                                     kiln_tensor **out);

/* Row-wise RMS norm of an activation [M, K] with a param weight [K]. */
KILN_API kiln_status kiln_graph_rms_norm(kiln_graph *g, const char *name, kiln_tensor *x,
                                         kiln_tensor *weight, float eps, kiln_tensor **out);

/* Mark an activation as a graph output (in the order of the calls). */
KILN_API kiln_status kiln_graph_output(kiln_graph *g, kiln_tensor *t);

/* Read-only views. */
KILN_API int kiln_graph_n_tensors(const kiln_graph *g);
KILN_API kiln_tensor *kiln_graph_tensor(const kiln_graph *g, int i); /* creation order */
KILN_API int kiln_graph_n_inputs(const kiln_graph *g);
KILN_API kiln_tensor *kiln_graph_input_at(const kiln_graph *g, int i);
KILN_API int kiln_graph_n_outputs(const kiln_graph *g);
KILN_API kiln_tensor *kiln_graph_output_at(const kiln_graph *g, int i);
KILN_API kiln_tensor *kiln_graph_find(const kiln_graph *g, const char *name);

KILN_API const char *kiln_tensor_name(const kiln_tensor *t);
KILN_API kiln_op kiln_tensor_op(const kiln_tensor *t);
/* For activations, ne[0] is the feature size and ne[1] is -1 (M, dynamic);
 * for weights, ne[0] = K and ne[1] = N (GGUF order); params have ne[1] = 1. */
KILN_API int64_t kiln_tensor_ne(const kiln_tensor *t, int dim);
/* The weight descriptor of a KILN_OP_WEIGHT tensor, else NULL. */
KILN_API const kiln_qtensor *kiln_tensor_weight(const kiln_tensor *t);
/* The static activation scale of a KILN_OP_LINEAR tensor
 * (kiln_graph_linear_input_scale), else 0: activations as the backend
 * takes them (BF16, or quantized with dynamic scales). */
KILN_API float kiln_tensor_input_scale(const kiln_tensor *t);
/* The i-th source of an op tensor, or NULL. */
KILN_API kiln_tensor *kiln_tensor_src(const kiln_tensor *t, int i);

/* The op tensors (not inputs, weights or params) that the outputs depend on,
 * in an order where every tensor comes after its sources. *out is owned by
 * the graph and valid until the graph changes. KILN_ERR_STATE when the graph
 * has no outputs. */
KILN_API kiln_status kiln_graph_topo(kiln_graph *g, kiln_tensor *const **out, int *n);

/* ---------------------------------------------------------------- targets */

/* What a GPU architecture offers kernels. Named targets need no GPU; a live
 * target is read from the device by the runtime. */
typedef struct kiln_target {
    char name[16];        /* "sm_90a": the NVRTC -arch value */
    int sm;               /* compute capability x 10: 75, 80, 86, 89, 90 */
    int arch_specific;    /* the "a" targets: instructions that exist on this chip only */
    int mma_bf16;         /* mma.sync on BF16/F16 (sm_80+) */
    int mma_fp8;          /* mma.sync on E4M3 (sm_89+) */
    int wgmma;            /* warpgroup MMA, needs sm_90a */
    int tma;              /* bulk tensor copies (sm_90+) */
    int smem_optin;       /* largest dynamic shared memory per block, bytes */
    int sm_count;         /* multiprocessors where the name fixes it, else 0 */
    char alias_of[16];    /* for an alias: the product name it was asked by ("h200") */
} kiln_target;

/* A named target, in any case: sm_75, sm_80, sm_86, sm_87, sm_89, sm_90,
 * sm_90a, sm_100, sm_100a, sm_103, sm_103a, sm_110, sm_120, sm_120a,
 * sm_121, sm_121a, or a product alias: t4, a100, a10, l40s, h100, h200,
 * orin, b200, gb200, rtx-pro-6000, rtx-5090, dgx-spark (each names the
 * target its live device plans for). Blackwell targets get the portable
 * backends. KILN_ERR_NOT_FOUND lists the names kiln knows. */
KILN_API kiln_status kiln_target_from_name(const char *name, kiln_target *out);

/* The target of a device of compute capability major.minor with sm_count
 * multiprocessors and smem_optin bytes of shared memory per block (0: the
 * architecture's default). An sm_90 device gets sm_90a; an architecture newer
 * than kiln's table gets the capabilities every later one keeps. Every
 * target it gives can be planned and compiled (for an architecture NVRTC
 * knows). KILN_ERR_UNSUPPORTED below sm_75. */
KILN_API kiln_status kiln_target_from_cc(int major, int minor, int sm_count, int smem_optin,
                                         kiln_target *out);

/* The target of CUDA device ordinal `device` on this machine, read from the
 * device. KILN_ERR_NO_DEVICE when there is no GPU or driver. */
KILN_API kiln_status kiln_target_live(int device, kiln_target *out);

/* 1 when a device of target device loads cubins built for target cubins:
 * the same major version at an equal or older minor (sm_80 cubins on an
 * sm_86 device), an arch-specific ("a") target on its own architecture
 * only; else 0. */
KILN_API int kiln_target_loads(const kiln_target *device, const kiln_target *cubins);

/* The names kiln_target_from_name accepts, NULL-terminated. */
KILN_API const char *const *kiln_target_names(void);

/* ---------------------------------------------------------------- lowering */

/* A plan binds a graph to a target: for every linear node and token bucket
 * the backend that will run it (and why the ones before it in the format's
 * priority list were refused), the inserted activation-quantization nodes,
 * the fused epilogues, the de-duplicated kernel signatures and the
 * activation memory plan. */
typedef struct kiln_plan kiln_plan;

/* Tile configurations chosen by measurement (`kiln tune`): for a linear
 * kernel's signature with its variant left out ("variant=*" in place of
 * the variant) and a token bucket, the variant that ran fastest there on a
 * device of the signature's target, with its time and the heuristic's
 * variant and time beside it. A plan given a table uses its variant for
 * every (signature, bucket) it holds, where the backend offers that
 * variant; the heuristic's elsewhere. A cache keeps a table beside its
 * kernels (kiln_cache_tuning), so a shipped cache carries it. */
typedef struct kiln_tuning kiln_tuning;

/* Bytes that hold any kernel signature's text, NUL included. */
#define KILN_SIGNATURE_MAX 512

typedef struct kiln_tuning_entry {
    const char *signature; /* "linear backend=... variant=* ...", or a step's key
                              (kiln_plan_step_key) with variant serial or overlap */
    int64_t bucket;
    const char *variant;   /* the fastest */
    double us;             /* its time, microseconds */
    const char *heuristic; /* the variant the heuristic gives */
    double heuristic_us;
} kiln_tuning_entry;

KILN_API kiln_status kiln_tuning_create(kiln_tuning **out);
KILN_API void kiln_tuning_destroy(kiln_tuning *t);
KILN_API int kiln_tuning_n(const kiln_tuning *t);
/* Entry i; its strings belong to t and live until t changes. */
KILN_API kiln_status kiln_tuning_at(const kiln_tuning *t, int i, kiln_tuning_entry *out);
/* Add e, or replace the entry of the same signature and bucket.
 * KILN_ERR_INVALID_ARG for a signature that is neither a linear one with
 * variant=* nor a step key, a bucket below 1, a variant that is no name
 * (empty, spaces, 64 bytes or more), a time that is negative or not
 * finite. */
KILN_API kiln_status kiln_tuning_set(kiln_tuning *t, const kiln_tuning_entry *e);

#define KILN_DEFAULT_CAPTURE_SIZES 1, 2, 4, 8, 16, 32, 64, 128, 256, 512

typedef struct kiln_plan_options {
    const char *backend;       /* only this backend where it can (--backend); NULL: all */
    int strict_backend;        /* a node the backend cannot take is an error, not a fallback */
    const int64_t *capture;    /* token-count capture sizes; NULL: KILN_DEFAULT_CAPTURE_SIZES */
    int n_capture;
    int64_t max_tokens;        /* the largest M to serve; 0: the largest capture size */
    int no_fuse;               /* keep epilogues as separate nodes */
    /* Measured variants (kiln tune) to prefer to the heuristic's; NULL:
     * none. kiln_compile and kiln_session_create read their cache's
     * table when this is NULL. The plan keeps a copy of the entries it
     * used: t may go once the plan is made. */
    const kiln_tuning *tuning;
} kiln_plan_options;

/* Plan g for target t. opts may be NULL. The graph must outlive the plan.
 * KILN_ERR_NO_KERNEL when some node fits no backend: the message lists every
 * backend's reason. KILN_ERR_NOT_FOUND for an unknown --backend name. */
KILN_API kiln_status kiln_plan_create(kiln_graph *g, const kiln_target *t,
                                      const kiln_plan_options *opts, kiln_plan **out);
KILN_API void kiln_plan_destroy(kiln_plan *p);

/* Token buckets, ascending: {1} ∪ capture sizes ∪ {max_tokens}, capped at
 * max_tokens. kiln_plan_bucket_for gives the index of the smallest bucket
 * >= m, or -1 when m exceeds max_tokens. */
KILN_API int kiln_plan_n_buckets(const kiln_plan *p);
KILN_API int64_t kiln_plan_bucket(const kiln_plan *p, int i);
KILN_API int kiln_plan_bucket_for(const kiln_plan *p, int64_t m);

/* One linear node in one bucket. Its strings belong to the plan (node and
 * refused) or are static (backend, act, epilogue): valid until
 * kiln_plan_destroy, whatever is called in between. */
typedef struct kiln_plan_linear {
    const char *node;       /* the linear's name */
    kiln_format format;
    int64_t n, k;
    const char *backend;    /* chosen backend */
    const char *act;        /* activation scheme it consumes: "bf16", "fp8-1x128", ... */
    const char *epilogue;   /* fused epilogue: "none", "bias", "bias+residual", ...;
                               "(in silu_mul+gate)" for a gate projection its up
                               projection's kernel computes in this bucket */
    int signature;          /* index into the plan's signatures */
    const char *refused;    /* "wgmma: needs sm_90a; simt: ..." for backends tried first, or "" */
    int fell_back;          /* --backend was asked for and could not take this node */
    float input_scale;      /* the linear's static activation scale, 0: none */
    /* With an input_scale, how this backend honours it (static strings):
     * "fp8-static" (activations quantized to E4M3 with it, the kernel reads
     * the codes as act), "bf16-qdq" (quantized with it and dequantized into
     * the BF16 the kernel reads), or "ignored" (the kernel reads act,
     * quantized with dynamic scales of its own); "" without one. */
    const char *input_scale_use;
    const char *variant;    /* the kernel's variant (tile configuration, M class) */
    int tuned;              /* 1: the variant is the tuning table's, 0: the heuristic's */
} kiln_plan_linear;

KILN_API int kiln_plan_n_linears(const kiln_plan *p);
KILN_API kiln_status kiln_plan_linear_at(const kiln_plan *p, int linear, int bucket,
                                         kiln_plan_linear *out);

/* The distinct kernel signatures of the whole plan (all nodes, all buckets),
 * owned by the plan; NULL for an i out of range. */
KILN_API int kiln_plan_n_signatures(const kiln_plan *p);
KILN_API const char *kiln_plan_signature(const kiln_plan *p, int i);

/* Warnings raised while planning (one per layer type that fell back from
 * --backend), NULL-terminated, owned by the plan. */
KILN_API const char *const *kiln_plan_warnings(const kiln_plan *p);

/* The tuning key of bucket i's whole step, "step target=T steps=N hash=H"
 * (H over the signatures of its kernels in stream order), into key of size
 * bytes (KILN_SIGNATURE_MAX holds it); KILN_ERR_INVALID_ARG for a bucket
 * out of range or a smaller buffer. A table entry of that key and bucket
 * with variant "serial" makes every kernel of the step start after the one
 * before it ends; "overlap" keeps the launch overlap the kernels allow
 * (programmatic dependent launch), as no entry does. `kiln tune` times
 * both in the whole step. */
KILN_API kiln_status kiln_plan_step_key(const kiln_plan *p, int bucket, char *key, size_t size);
/* 1: a tuning entry made bucket i's step serial; 0: one kept its overlap;
 * -1: no entry applies (or i is out of range). */
KILN_API int kiln_plan_step_policy(const kiln_plan *p, int bucket);
/* The launches of bucket i's step that may start while the kernel before
 * them drains (0 for i out of range): where there are none, serial and
 * overlap are the same step, and `kiln tune` leaves it out. */
KILN_API int kiln_plan_step_overlaps(const kiln_plan *p, int bucket);

/* Activation memory of bucket i: the arena the liveness plan needs and, for
 * comparison, the sum of every activation's size. */
KILN_API size_t kiln_plan_arena_bytes(const kiln_plan *p, int bucket);
KILN_API size_t kiln_plan_naive_bytes(const kiln_plan *p, int bucket);

/* Weight memory a session of the plan holds on the device: *storage bytes of
 * weights in kiln's storage layout, *packed bytes in backends' packed
 * layouts (the gemv_tc backend's). A weight read in both layouts counts in
 * both: prefill buckets read the storage layout, decode buckets (up to 16
 * tokens) the packed one where gemv_tc runs.
 * Params (norm weights, biases) are not counted. */
struct kiln_cache;
/* kiln_plan_create with, where opts names no tuning table, the table of
 * c's layers (kiln_cache_tuning; c may be NULL: none): the plan a build
 * from c makes, and the one a deployment from a cache exported from c
 * makes. KILN_ERR_CACHE for a damaged table. */
KILN_API kiln_status kiln_plan_create_cached(kiln_graph *g, const kiln_target *t,
                                             const kiln_plan_options *opts,
                                             struct kiln_cache *c, kiln_plan **out);

/* The variants `kiln tune` times for linear `linear` at bucket index
 * `bucket`: those its backend can run there, the plan's own among them
 * (strings that live as long as p), at most max of them into names; and
 * into key (key_size bytes, KILN_SIGNATURE_MAX holds it; may be NULL) the
 * tuning key, the kernel's signature with "variant=*". Returns the count:
 * 1 where the backend has nothing to choose from, 0 for arguments out of
 * range. */
KILN_API int kiln_plan_candidates(const kiln_plan *p, int linear, int bucket, const char **names,
                                  int max, char *key, size_t key_size);

/* The tuning entries p used (kiln_plan_options.tuning), NULL when it used
 * none: what an export of p carries. Owned by p. */
KILN_API const kiln_tuning *kiln_plan_tuning(const kiln_plan *p);
KILN_API kiln_status kiln_plan_weight_bytes(const kiln_plan *p, size_t *storage, size_t *packed);

/* ---------------------------------------------------------- kernel caches */

/* Compiled kernels live in LMDB files: zero or more shipped caches, opened
 * read-only without a lock file (they work on read-only media and never
 * change; one must not be written while it is open), searched first, in
 * order; then one writable cache, which other processes may use at the
 * same time. A record is found by its key, a hash of everything that
 * determines the kernel; the compiler's version is recorded in the record,
 * not in the key. A cache file is untrusted input: its structure is checked
 * before LMDB maps it, and every record is checked against its key before
 * it is served. Where a call below says "LMDB fails", the error names the
 * file and carries LMDB's text and code: KILN_ERR_CACHE for LMDB's own
 * codes (a full map that cannot grow, a full reader table), KILN_ERR_IO
 * for the system's under it (a full disk, an I/O error). A write that
 * fails writes nothing: every write is one LMDB transaction. */
typedef struct kiln_cache kiln_cache;

enum {
    KILN_CACHE_KEY_BYTES = 16,
    KILN_CACHE_KEY_HEX = 2 * KILN_CACHE_KEY_BYTES + 1, /* lowercase hex, with the NUL */
};

/* Which caches to use: the same struct tells kiln_cache_open which files
 * to open, and compile and session where to look kernels up and store
 * them. Zero is the default writable cache alone. */
typedef struct kiln_cache_options {
    const char *const *shipped; /* read-only caches, searched first, in order */
    int n_shipped;
    const char *path;           /* the writable cache; NULL: kiln_cache_default_path */
    int no_writable;            /* open no writable cache (read-only deployments) */
    size_t map_size;            /* initial map of the writable cache; 0: 64 MiB. The map
                                   grows when full; the file holds only what is written */
    /* A file whose structure is damaged (truncated, or a page number, node
     * or overflow count LMDB would misread) is never handed to LMDB. 0: it
     * is left out of the search and as it is on disk, reported through
     * on_corrupt and by kiln_cache_layer_damage; a damaged writable file is
     * neither written nor removed, and kiln_cache_writable_layer is -1.
     * 1: opening fails with KILN_ERR_CACHE naming the file. */
    int strict;
    /* Called with a message naming the file, the key and the signature for
     * every corrupt record a lookup passes over, and naming the file for
     * every damaged file left out. message is valid during the call only.
     * NULL: nothing is called, except that a session prints the message to
     * stderr as a warning. */
    void (*on_corrupt)(void *ctx, const char *message);
    void *ctx;
    /* Compile and session: a kernel missing from every cache is
     * KILN_ERR_OFFLINE_MISS naming its signature, and nothing is compiled;
     * $KILN_OFFLINE=1 sets it for both. kiln_cache_open ignores it. */
    int offline;
} kiln_cache_options;

/* Write the writable cache's path when none is given into buf (size
 * bytes): $KILN_CACHE, else $XDG_CACHE_HOME/kiln/kernels.kiln, else
 * $HOME/.cache/kiln/kernels.kiln (an empty or relative XDG_CACHE_HOME or
 * HOME is passed over). KILN_ERR_IO when none is set; KILN_ERR_INVALID_ARG
 * when buf is NULL or the path does not fit. */
KILN_API kiln_status kiln_cache_default_path(char *buf, size_t size);

/* Open the caches opts names (opts may be NULL: the default writable cache
 * alone). The writable cache and its parent directories are created when
 * absent; reader slots left by dead processes are cleared. Errors name the
 * file: KILN_ERR_IO when a shipped file is missing or a file cannot be
 * created or opened; KILN_ERR_CACHE when a file is not an LMDB file, or
 * (strict) its structure is damaged; KILN_ERR_STATE when this process has
 * the writable file open already (LMDB's locks are held once per process,
 * so a second open is refused); KILN_ERR_INVALID_ARG for a NULL out, a
 * negative n_shipped or a NULL shipped path. A kiln_cache is used by one
 * thread at a time. */
KILN_API kiln_status kiln_cache_open(const kiln_cache_options *opts, kiln_cache **out);
KILN_API void kiln_cache_close(kiln_cache *c);

/* Layers are numbered in search order: the shipped caches, then the
 * writable one. Strings belong to the cache and stay valid until
 * kiln_cache_close. kiln_cache_layer_path is NULL for a layer out of
 * range; kiln_cache_writable_layer is -1 when there is no usable writable
 * cache; kiln_cache_layer_damage says why a layer's file was left out
 * ("<path>: damaged: <what>"), or is NULL when the layer is in use. */
KILN_API int kiln_cache_n_layers(const kiln_cache *c);
KILN_API const char *kiln_cache_layer_path(const kiln_cache *c, int layer);
KILN_API int kiln_cache_writable_layer(const kiln_cache *c);
KILN_API const char *kiln_cache_layer_damage(const kiln_cache *c, int layer);

/* The lowercase hex of a key, NUL-terminated. */
KILN_API void kiln_cache_key_hex(const uint8_t key[KILN_CACHE_KEY_BYTES],
                                 char out[KILN_CACHE_KEY_HEX]);

/* Parse a key prefix of 1 to 32 hex digits (either case): its nibbles go to
 * the front of key (the rest is zero), their count to *n_nibbles. A whole
 * key is a prefix of 32 nibbles. KILN_ERR_INVALID_ARG for anything else. */
KILN_API kiln_status kiln_cache_key_parse(const char *hex, uint8_t key[KILN_CACHE_KEY_BYTES],
                                          int *n_nibbles);

/* The fields of a stored kernel. */
typedef struct kiln_cache_record {
    const char *compiler;  /* "nvrtc 13.0" */
    const char *entry;     /* the kernel function's name */
    const char *target;    /* "sm_90a" */
    const char *kind;      /* the backend that generated it ("wgmma"), or an auxiliary
                              kernel's family ("quant", "op") */
    const char *signature; /* the kernel's signature text */
    uint32_t threads;      /* threads per block */
    uint32_t smem;         /* dynamic shared memory per block, bytes */
    uint64_t created;      /* unix seconds */
    const uint8_t *cubin;  /* an ELF for the target */
    uint64_t cubin_size;
    uint64_t cubin_hash;   /* XXH3-64 of the cubin */
    uint32_t version;      /* the record layout's version */
    const char *schema;    /* the cache schema it was keyed under ("kiln-cache-2") */
} kiln_cache_record;

/* One stored entry as iteration sees it. status is KILN_OK for an intact
 * record; KILN_ERR_UNSUPPORTED for a record of another kiln's layout, left
 * alone, never served and not counted as bad: rec.version says which, and
 * a version 1 record's other fields are set (its schema is NULL), those of
 * an unknown version are NULL and 0; KILN_ERR_CACHE for a corrupt record:
 * rec is all NULL and 0. problem says what is wrong, naming the file and
 * the key, and is "" for an intact record. Every pointer in it, rec's
 * included, is valid during the visit only. */
typedef struct kiln_cache_entry {
    uint8_t key[KILN_CACHE_KEY_BYTES]; /* zero when the stored key is not 16 bytes */
    size_t key_size;                   /* the stored key's bytes */
    int layer;                         /* -1: the source file of a merge */
    size_t size;                       /* the stored value's bytes */
    kiln_status status;
    const char *problem;
    kiln_cache_record rec;
} kiln_cache_entry;

/* A visitor: any status but KILN_OK stops the iteration, which returns it.
 * It must not call into the cache it visits. */
typedef kiln_status (*kiln_cache_visit_fn)(void *ctx, const kiln_cache_entry *e);

/* Visit every entry of a layer in key order. KILN_ERR_INVALID_ARG for a
 * NULL c or fn or a layer out of range; KILN_ERR_CACHE, naming the file,
 * for a layer whose file was left out as damaged; KILN_ERR_CACHE or
 * KILN_ERR_IO when LMDB fails. */
KILN_API kiln_status kiln_cache_foreach(kiln_cache *c, int layer, kiln_cache_visit_fn fn,
                                        void *ctx);

/* Check every record of a layer: *n_entries and *n_bad (either may be
 * NULL) count them; on_bad (may be NULL) sees each corrupt one. A record
 * of another version is an entry, not bad. Errors as kiln_cache_foreach. */
KILN_API kiln_status kiln_cache_verify(kiln_cache *c, int layer, kiln_cache_visit_fn on_bad,
                                       void *ctx, size_t *n_entries, size_t *n_bad);

/* Records and bytes of one target or kind. */
typedef struct kiln_cache_tally {
    char *name;
    size_t entries;
    uint64_t bytes; /* values, record headers included */
} kiln_cache_tally;

typedef struct kiln_cache_stats {
    size_t entries, bad;
    size_t other_versions;   /* records of another version, left alone; not bad */
    uint64_t bytes;          /* every value */
    uint64_t cubin_bytes;    /* the cubins of intact records */
    uint64_t file_bytes;     /* the file on disk */
    uint64_t map_bytes;      /* its current map */
    uint64_t oldest, newest; /* created, of intact records; 0 when there is none */
    kiln_cache_tally *by_target, *by_kind; /* intact records, in order of first appearance */
    int n_targets, n_kinds;
} kiln_cache_stats;

/* The totals of a layer. by_target, by_kind and their names belong to *out
 * until kiln_cache_stats_free(out), which zeroes it and accepts NULL.
 * Errors as kiln_cache_foreach, and KILN_ERR_NOMEM. */
KILN_API kiln_status kiln_cache_stat(kiln_cache *c, int layer, kiln_cache_stats *out);
KILN_API void kiln_cache_stats_free(kiln_cache_stats *s);

/* What kiln_cache_gc removes; a record matching any field goes. */
typedef struct kiln_cache_gc_options {
    const char *compiler; /* records made by any other compiler; NULL: keep all */
    uint64_t max_age_s;   /* records created longer ago than this; 0: no limit */
    int corrupt;          /* records that fail their checks (not those of another version) */
    uint32_t version;     /* records of this record version; 0: none. Nothing else
                             removes a record of another version */
    int dry_run;          /* remove nothing: count, and show on_remove, what would go */
    /* Sees each entry that goes (or would go), before it does; a status
     * other than KILN_OK ends the gc with it, nothing removed. It must not
     * call into the cache. When the map must grow the gc starts again, and
     * on_remove sees those entries again. NULL: none. */
    kiln_cache_visit_fn on_remove;
    void *ctx;
} kiln_cache_gc_options;

/* Remove from the writable cache what o selects, in one transaction.
 * *removed and *bytes (either may be NULL) say how much went, or would go
 * on a dry run.
 * KILN_ERR_INVALID_ARG for a NULL c or o; KILN_ERR_STATE when no writable
 * cache is open; KILN_ERR_CACHE, naming the file, when it is damaged;
 * KILN_ERR_CACHE or KILN_ERR_IO when LMDB fails. */
KILN_API kiln_status kiln_cache_gc(kiln_cache *c, const kiln_cache_gc_options *o,
                                   size_t *removed, uint64_t *bytes);

/* Remove the writable cache's records whose keys start with a hex prefix
 * (as kiln_cache_key_parse reads it), or all of them. *removed (may be
 * NULL) counts them; a prefix no key has removes nothing and is not an
 * error. KILN_ERR_INVALID_ARG for a NULL c or a bad prefix; otherwise
 * errors as kiln_cache_gc. */
KILN_API kiln_status kiln_cache_rm(kiln_cache *c, const char *hex_prefix, size_t *removed);
KILN_API kiln_status kiln_cache_rm_all(kiln_cache *c, size_t *removed);

typedef struct kiln_cache_merge_result {
    size_t added;    /* new to the writable cache */
    size_t present;  /* an intact record of the same kernel was there already */
    size_t replaced; /* a corrupt record, or one of another kernel, held the key */
    size_t bad;      /* corrupt records of the source, left out */
    size_t other;    /* records of another version in the source, left out */
} kiln_cache_merge_result;

/* Copy every intact record of the cache file src into the writable cache,
 * keeping the intact records it holds, in one transaction. src is opened
 * as a shipped cache and must not be written meanwhile; on_bad (may be
 * NULL) sees each of its corrupt records, with layer -1. out may be NULL.
 * KILN_ERR_INVALID_ARG for a NULL c or src, or when src is the writable
 * cache itself; KILN_ERR_IO / KILN_ERR_CACHE, naming src, as
 * kiln_cache_open; otherwise errors as kiln_cache_gc. */
KILN_API kiln_status kiln_cache_merge(kiln_cache *c, const char *src, kiln_cache_visit_fn on_bad,
                                      void *ctx, kiln_cache_merge_result *out);

/* Write a new cache file at path holding exactly the kernels plan p needs,
 * each from the first layer of c with an intact record: the file to ship
 * with p's deployment. Nothing is compiled. The file is written beside path
 * and renamed into place, so a failure leaves no file behind.
 * KILN_ERR_OFFLINE_MISS, naming the signature and the files searched, when
 * no layer holds a kernel (compile p first, with kiln_compile_plan and the
 * same caches); KILN_ERR_CACHE when a layer that may hold it was left out
 * as damaged; KILN_ERR_IO when path exists and overwrite is 0, or cannot be
 * written; KILN_ERR_CACHE or KILN_ERR_IO, naming path, when LMDB fails;
 * KILN_ERR_INVALID_ARG for a NULL argument or when path is one of c's own
 * files. */
KILN_API kiln_status kiln_cache_export(kiln_cache *c, const kiln_plan *p, const char *path,
                                       int overwrite);

/* How kiln_cache_export_plans writes. */
typedef struct kiln_cache_export_options {
    int overwrite;        /* replace an existing file at path */
    /* A JSON object whose members go into the file's manifest: what the
     * deployment checks the file against (the model's identity, the
     * planning options as given). NULL: none. kiln's own members replace
     * any of the same name: "kiln" (its version), "schema" (the cache
     * schema), "created" (unix seconds), "targets", "buckets" (the first
     * plan's token buckets), "kernels" and "keys" (lowercase hex). */
    const char *manifest;
} kiln_cache_export_options;

/* kiln_cache_export of several plans into one file, with a manifest: the
 * kernels of every plan (one per target of a fleet of mixed GPUs, say),
 * each once. o may be NULL. Errors as kiln_cache_export, and
 * KILN_ERR_INVALID_ARG for an n_plans below 1, a NULL plan or a manifest
 * that is not a JSON object. */
KILN_API kiln_status kiln_cache_export_plans(kiln_cache *c, const kiln_plan *const *plans,
                                             int n_plans, const char *path,
                                             const kiln_cache_export_options *o);

/* The manifest of a layer's file, the JSON text kiln_cache_export_plans
 * wrote, in *json: owned by c, valid until kiln_cache_close. It is checked
 * against its checksum, not parsed: a reader parses it as it would any
 * untrusted text. KILN_ERR_NOT_FOUND when the file has none (a writable
 * cache, or a file exported by an older kiln); KILN_ERR_CACHE when it is
 * damaged, or the file was left out as damaged; KILN_ERR_UNSUPPORTED for a
 * manifest of another version; KILN_ERR_INVALID_ARG for a NULL c or json
 * or a layer out of range; KILN_ERR_CACHE or KILN_ERR_IO when LMDB fails.
 * Records are found, listed and counted as if it were not there. */
KILN_API kiln_status kiln_cache_manifest(kiln_cache *c, int layer, const char **json);

/* Called by kiln_cache_check_plan with each kernel no layer holds: its
 * signature and its key (lowercase hex), both valid during the call only. */
typedef void (*kiln_cache_missing_fn)(void *ctx, const char *signature, const char *key_hex);

/* Whether c holds every kernel plan p needs, without compiling anything and
 * without a GPU: *n_missing (may be NULL) counts the kernels no layer holds
 * an intact record of, and on_missing (may be NULL) sees each of them, in
 * the plan's signature order. A miss is not an error. KILN_ERR_INVALID_ARG
 * for a NULL c or p; KILN_ERR_CACHE, naming the files, when a layer that
 * may hold a missing kernel was left out as damaged; KILN_ERR_CACHE or
 * KILN_ERR_IO when LMDB fails. */
KILN_API kiln_status kiln_cache_check_plan(kiln_cache *c, const kiln_plan *p,
                                           kiln_cache_missing_fn on_missing, void *ctx,
                                           int *n_missing);

/* The tuning tables of c's layers merged into into (a layer's entries
 * before a later layer's: a shipped cache's win over the writable one's;
 * into's own before all). KILN_ERR_CACHE, naming the file, for a damaged
 * table (kiln cache salvage drops it); a layer left out as damaged is
 * passed over. */
KILN_API kiln_status kiln_cache_tuning(kiln_cache *c, kiln_tuning *into);
/* The tuning table of c's layer alone merged into into (its own entries
 * kept). KILN_OK with nothing added where the layer holds none;
 * KILN_ERR_CACHE, naming the file, for a damaged table or a layer left
 * out as damaged; KILN_ERR_INVALID_ARG for a layer out of range. */
KILN_API kiln_status kiln_cache_layer_tuning(kiln_cache *c, int layer, kiln_tuning *into);
/* Store t's entries in c's writable layer's tuning table, replacing its
 * entries of the same signature and bucket. KILN_ERR_STATE without a
 * writable layer; KILN_ERR_CACHE for a damaged table there (nothing is
 * written), or as kiln_cache_store when LMDB fails. */
KILN_API kiln_status kiln_cache_store_tuning(kiln_cache *c, const kiln_tuning *t);

typedef struct kiln_cache_salvage_result {
    size_t records;    /* intact records written */
    size_t bad;        /* pairs that were not intact records, left out */
    size_t other;      /* records of a version kiln cannot check, left out */
    size_t duplicates; /* intact records of a key already found (the later made is kept),
                        * and copies of the manifest kept */
    int manifest;      /* an exported file's manifest was found intact and copied */
    int tuning;        /* a tuning table was found intact and copied */
} kiln_cache_salvage_result;

/* Write a new cache file at dst holding every intact record found in the
 * file src, damaged or not: every page is searched for records without
 * following LMDB's tree, and each record is checked against its key. An
 * exported file's manifest is copied too when it is found intact (it may
 * then name keys whose records were lost: kiln cache check lists them).
 * Records of this version and readable older ones are copied; of a key
 * found twice, the later made. Records removed from src before it was
 * damaged may come back. dst is written beside its name and renamed into
 * place; out may be NULL. KILN_ERR_IO, naming the file, when src cannot be
 * read or is not a regular file, or dst exists and overwrite is 0;
 * KILN_ERR_CACHE or KILN_ERR_IO, naming dst, when LMDB fails writing it;
 * KILN_ERR_INVALID_ARG for a NULL path or when dst is src. */
KILN_API kiln_status kiln_cache_salvage(const char *src, const char *dst, int overwrite,
                                        kiln_cache_salvage_result *out);

/* --------------------------------------------------------------- compile */

/* Compile ahead of time: plan g for t, then make sure every kernel the plan
 * needs is in a cache — looked up in the shipped caches, then the writable
 * one, and on a miss compiled with NVRTC (loaded at run time; no GPU needed)
 * and stored in the writable cache. */
typedef struct kiln_compile_options {
    kiln_cache_options cache;   /* where kernels are looked up and stored */
    int jobs;                   /* compiles at once; 0: one per core */
    const char *keep_source;    /* write sources, NVRTC logs and PTX here */
    int quiet;                  /* no progress lines on stderr (on a terminal one line
                                   rewritten, elsewhere a line every few seconds) */
    kiln_plan_options plan;
    /* Seconds one kernel's compile may take; past it the kernel fails with
     * KILN_ERR_COMPILE naming its signature (NVRTC cannot be stopped: its
     * thread is left to finish on its own, its result dropped). 0:
     * $KILN_COMPILE_TIMEOUT, else 600; a $KILN_COMPILE_TIMEOUT that is not a
     * positive number fails a compile with KILN_ERR_INVALID_ARG. A session's
     * compiles take the same. */
    double compile_timeout_s;
    /* Once *stop is nonzero (a SIGINT or SIGTERM handler may set it), no
     * further kernel starts compiling: the ones compiling finish and are
     * stored, and the compile fails with KILN_ERR_STATE saying how many
     * were stored and how many are left. NULL: none. */
    const volatile sig_atomic_t *stop;
} kiln_compile_options;

typedef struct kiln_compile_result {
    int signatures;             /* distinct kernels the plan needs */
    int cached, compiled;
    double seconds;
    int writable;               /* 1: a writable cache was in use, and what compiled is
                                   stored there; 0: there was none (no_writable, or its
                                   file is damaged and left out): nothing was stored */
} kiln_compile_result;

/* Each kernel is stored as soon as it compiles, in a transaction of its
 * own: a compile that fails or is interrupted (a signal ending the process)
 * keeps every kernel done before, and the next compiles only the rest.
 * KILN_ERR_COMPILE with NVRTC's log when a kernel does not compile, or
 * naming it when its compile ran past compile_timeout_s (the ones that did
 * compile are stored); KILN_ERR_NOT_FOUND when NVRTC cannot be loaded;
 * KILN_ERR_NO_KERNEL from planning; KILN_ERR_OFFLINE_MISS naming the
 * signature (offline); KILN_ERR_CACHE and KILN_ERR_IO from the
 * caches, as kiln_cache_open. */
KILN_API kiln_status kiln_compile(kiln_graph *g, const kiln_target *t,
                                  const kiln_compile_options *opts, kiln_compile_result *out);

/* kiln_compile of a plan made already (opts->plan is not read): for a
 * caller that looks at the plan first. The plan must outlive the call only.
 * Errors as kiln_compile, and KILN_ERR_INVALID_ARG for a NULL p or out. */
KILN_API kiln_status kiln_compile_plan(const kiln_plan *p, const kiln_compile_options *opts,
                                       kiln_compile_result *out);

/* ------------------------------------------------------------ GPU session */

/* A session binds a graph to a GPU: the plan for the live device, every
 * kernel loaded from the caches (compiled first where a cache lacks one,
 * unless offline), weights packed and uploaded, one activation arena, and
 * one CUDA graph per token bucket, instantiated before the first run. */
typedef struct kiln_session kiln_session;
typedef struct kiln_model kiln_model; /* a model file: kiln_model_open, below */

typedef struct kiln_session_options {
    int device;                 /* CUDA device ordinal */
    kiln_cache_options cache;   /* where kernels are looked up and stored */
    int eager;                  /* launch kernels one by one instead of replaying graphs */
    int quiet;                  /* no progress line while compiling or loading weights */
    const kiln_target *target;  /* plan for this target, not the device's own; its
                                   cubins must load on the device (the same major
                                   version, minor no newer; an "a" target the same
                                   architecture), else KILN_ERR_UNSUPPORTED */
    kiln_plan_options plan;
} kiln_session_options;

/* Where the time of a cold start went, and what the session holds. */
typedef struct kiln_session_stats {
    char device[128];
    char target[16];
    int kernels, cached, compiled;
    double plan_s, cache_s, module_s, weights_s, graphs_s; /* seconds */
    size_t weight_bytes, arena_bytes;
    double compile_s; /* compiling the kernels no cache held (NVRTC), not in cache_s */
    /* The weights' load, within weights_s: bytes read from the model's
     * files (or memory), copied to the device and written by the CPU
     * packers; its seconds; the reader threads that ran it
     * ($KILN_LOAD_THREADS); 1 when it staged them in pinned memory. */
    size_t load_read_bytes, load_copied_bytes, load_packed_bytes;
    double load_s;
    int load_threads, load_pinned;
    /* Packed layouts written on the device from the storage layout by
     * their packers (kernels of the plan, cached like the others): bytes
     * written and seconds, after load_s. */
    size_t load_device_packed_bytes;
    double load_device_pack_s;
} kiln_session_stats;

/* KILN_ERR_NO_DEVICE when there is no GPU or driver (callers fall back to
 * the CPU executor); KILN_ERR_OFFLINE_MISS naming the signature;
 * KILN_ERR_UNSUPPORTED, before anything is compiled or loaded, when
 * opts->target's cubins cannot load on the device (kiln_target_loads);
 * KILN_ERR_CUDA naming the kernel whose cubin the device cannot load. opts may be NULL.
 * The weights are read by $KILN_LOAD_THREADS threads and copied through
 * $KILN_LOAD_SLOTS pinned staging buffers of $KILN_LOAD_SLOT_SIZE bytes
 * (README); KILN_ERR_INVALID_ARG names such a variable set to anything
 * but a count. Weights of a model (kiln_model_build_*) are read from
 * its files: KILN_ERR_IO names the file (and the weight) when one cannot
 * be read, has shrunk or has been replaced since the model was opened. A
 * weight a kernel's layout refuses, and a copy that fails, are errors
 * naming it. opts->quiet: no progress line for a load that passes a
 * second either.
 * The graph and its weight memory must outlive the session. */
KILN_API kiln_status kiln_session_create(kiln_graph *g, const kiln_session_options *opts,
                                         kiln_session **out);
KILN_API void kiln_session_destroy(kiln_session *s);

/* As kiln_cpu_run: f32 inputs and outputs in host memory; the activations are
 * BF16 on the device. Replays the graph of the smallest bucket >= m.
 * KILN_ERR_SHAPE when m exceeds the largest bucket. */
KILN_API kiln_status kiln_session_run(kiln_session *s, int64_t m, const float *const *inputs,
                                      float *const *outputs);

/* A BF16 matrix in device memory, row-major: a row of the tensor's width
 * (its K for an input, N for an output) every stride elements. */
typedef struct kiln_device_matrix {
    uint64_t ptr;   /* a CUdeviceptr in the session's device, 2-byte aligned */
    int64_t stride; /* elements from one row to the next; 0: the width (packed) */
} kiln_device_matrix;

/* kiln_session_run on device memory, queued on stream (a CUstream of the
 * device's primary context, as torch and the runtime API use; NULL is the
 * legacy default stream) without any host synchronisation: m rows of each
 * input are copied into the session's activations, the bucket's graph is
 * launched, and m rows of each output are copied out, in stream order. The
 * caller's buffers may be slices of larger ones (stride), and must stay
 * valid until the stream reaches the end. When the caller is capturing a
 * CUDA graph on stream, the bucket's kernels are launched one by one into
 * that capture instead of its graph, so the caller's graph holds them.
 * A session has one activation arena: its runs must be ordered (one
 * stream, or events between streams), and not overlap with
 * kiln_session_run, kiln_session_profile or kiln_session_bench, which use
 * the session's own stream. KILN_ERR_INVALID_ARG naming the input or output
 * whose pointer or stride is unusable; KILN_ERR_SHAPE when m is outside the
 * session's buckets; KILN_ERR_CUDA naming the copy or launch the driver
 * refused (a stream of another context, say). */
KILN_API kiln_status kiln_session_run_device(kiln_session *s, int64_t m,
                                             const kiln_device_matrix *inputs,
                                             const kiln_device_matrix *outputs, void *stream);

/* Entry points: each output of the session's graph is one, which runs the
 * steps its value depends on and no others, reading the graph inputs those
 * steps read. In a graph of linears (kiln_model_build_linears, `--graph
 * linears`) every linear is an entry of its own, named "<weight>.out",
 * reading "<weight>.in"; an engine graph (kiln_model_build_engine) adds
 * "blk.L.ffn_gate_up.out", reading "blk.L.ffn_gate_up.in". Entries are
 * numbered as the graph's outputs. */
KILN_API int kiln_session_n_entries(const kiln_session *s);

typedef struct kiln_entry_info {
    const char *name;  /* the output's name; valid while the graph is */
    int64_t width;     /* the output's width */
    const int *inputs; /* the graph inputs it reads (kiln_graph_input_at), ascending; the
                          session's memory */
    int n_inputs;
} kiln_entry_info;

/* Entry i; KILN_ERR_INVALID_ARG past the last. */
KILN_API kiln_status kiln_session_entry(const kiln_session *s, int i, kiln_entry_info *out);

/* The entry whose output is named name, in *i; KILN_ERR_NOT_FOUND naming
 * it when the graph has no such output. */
KILN_API kiln_status kiln_session_find_entry(const kiln_session *s, const char *name, int *i);

/* Entry `entry` on device memory, as kiln_session_run_device runs the
 * whole graph: m rows of each of its inputs (inputs[j] for the entry's
 * j-th input) copied into the session's activations, its steps launched
 * one by one (into the caller's capture when the caller is capturing on
 * stream), m rows of its output copied out, all queued on stream without
 * host synchronisation. Runs of one session, whole or by entry, must be
 * ordered: they share one activation arena. Refusals as
 * kiln_session_run_device's, naming the entry. */
KILN_API kiln_status kiln_session_run_entry(kiln_session *s, int entry, int64_t m,
                                            const kiln_device_matrix *inputs,
                                            const kiln_device_matrix *output, void *stream);

/* Replace the weight named name in place, through the load (kiln's
 * storage layout up, the packed layouts written by the device packers),
 * into the existing device buffers (every layout the session holds it
 * in), so the instantiated graphs stay valid. KILN_ERR_STATE, naming the
 * weight, when w's format or shape differs from the one the session was
 * built with; a value a layout cannot carry is refused before anything is
 * written. After any other failure the weight's device copies may hold
 * old and new values: set it again before running. */
KILN_API kiln_status kiln_session_set_weight(kiln_session *s, const char *name,
                                             const kiln_qtensor *w);

/* Every weight of the session read again, from model m's files (another
 * checkpoint of the same architecture: the same names, formats and
 * shapes), as kiln_session_set_weight writes one: through the load, into
 * the same device buffers. Every weight is found and checked before any is
 * written: a missing one is KILN_ERR_NOT_FOUND, another format or shape
 * KILN_ERR_STATE, a value a layout cannot carry KILN_ERR_MALFORMED, each
 * naming the weight, and the session keeps its weights. A file that
 * cannot be read midway leaves them mixed: reload again. m must stay open
 * for the call only. */
KILN_API kiln_status kiln_session_reload(kiln_session *s, const kiln_model *m);

KILN_API void kiln_session_get_stats(const kiln_session *s, kiln_session_stats *out);

/* The plan s runs, tuning table and all (owned by s, valid until
 * kiln_session_destroy): which backend and variant each linear takes in
 * each bucket, and the signatures. */
KILN_API const kiln_plan *kiln_session_plan(const kiln_session *s);

/* One step of a bucket's program, timed by kiln_session_profile. The
 * strings live as long as the session. */
typedef struct kiln_step_time {
    const char *node;   /* the graph node it computes (the last fused one) */
    const char *kernel; /* its kernel's signature */
    double us;          /* device time of its launches, mean of the repetitions */
} kiln_step_time;

/* Time each step of the program of the bucket that serves m tokens: its
 * launches issued one by one on the session's stream with a CUDA event
 * after each, reps times over, on whatever the activation arena holds (the
 * input of the bucket's last kiln_session_run, zeros before any). The
 * events keep each kernel from starting before the one before it ends, so
 * the steps add up to more than a replay of the bucket's graph, which lets
 * them overlap. out[0..*n) gets the steps in stream order; *n is the step
 * count even when it exceeds cap, and then only cap are written and the
 * call returns KILN_ERR_INVALID_ARG. KILN_ERR_SHAPE when m is outside the
 * session's buckets; KILN_ERR_CUDA naming the launch or event that failed. */
KILN_API kiln_status kiln_session_profile(kiln_session *s, int64_t m, int reps,
                                          kiln_step_time *out, int cap, int *n);

/* Time the bucket that serves m tokens, device work only: `replays`
 * replays of the bucket's graph (launches of its program when the session is
 * eager) back to back on the session's stream, between two CUDA events, with
 * no host copies. Each replay reads whatever the activation arena holds,
 * which is the input of the last kiln_session_run of that bucket (zeros
 * before any). *us receives the mean microseconds of one replay.
 * KILN_ERR_INVALID_ARG for a NULL session or out-parameter or replays < 1;
 * KILN_ERR_SHAPE when m is outside the session's buckets; KILN_ERR_CUDA when
 * a launch or an event fails. */
KILN_API kiln_status kiln_session_bench(kiln_session *s, int64_t m, int replays, float *us);

/* ---------------------------------------------------------- CPU executor */

typedef struct kiln_cpu kiln_cpu;

typedef struct kiln_cpu_options {
    int threads; /* 0: one per online core */
} kiln_cpu_options;

/* Prepare g for execution on the CPU: weights are dequantized to f32 once.
 * opts may be NULL. The graph must outlive the executor. */
KILN_API kiln_status kiln_cpu_create(kiln_graph *g, const kiln_cpu_options *opts, kiln_cpu **out);
KILN_API void kiln_cpu_destroy(kiln_cpu *cpu);

/* The threads a run computes on, the caller's included: opts->threads, or
 * one per online core; fewer when the system refused to start some. */
KILN_API int kiln_cpu_threads(const kiln_cpu *cpu);

/* Run the graph for m tokens. inputs[i] holds [m, K_i] f32 for the graph's
 * i-th input; outputs[i] receives [m, N_i] f32 for its i-th output. A
 * NULL output is not computed, nor anything only it depends on, and an
 * input only those read may be NULL: one output alone is the CPU's run of
 * an entry point (kiln_session_run_entry). */
KILN_API kiln_status kiln_cpu_run(kiln_cpu *cpu, int64_t m, const float *const *inputs,
                                  float *const *outputs);

/* ----------------------------------------------------------------- models */

/* A model file opened read-only: a GGUF file, a .safetensors file, or a
 * directory holding model.safetensors (or a sharded set with
 * model.safetensors.index.json) and config.json. Tensors are mapped, not
 * copied; they stay valid until kiln_model_close. (kiln_model is declared
 * with kiln_session, which reloads from one.) */

KILN_API kiln_status kiln_model_open(const char *path, kiln_model **out);
KILN_API void kiln_model_close(kiln_model *m);

/* How kiln_model_open_with treats what kiln would refuse. Zero: refuse. */
typedef struct kiln_model_options {
    /* Skip the load-time check that every separate scale array, global
     * scale, inline GGML block scale, 1-D float tensor (norm weights,
     * biases) and rms_norm_eps is finite. A static activation scale that
     * the checkpoint's settings make a linear read (input_scale) is
     * refused unless positive and finite all the same. */
    int allow_nonfinite;
    /* A part of the model that the graphs leave out or compute otherwise
     * (an architecture kiln does not know) is a warning
     * (kiln_model_warnings), not an error. */
    int allow_partial;
} kiln_model_options;

/* kiln_model_open with options (NULL: all zero, which is what
 * kiln_model_open does). Besides kiln_model_open's errors:
 * KILN_ERR_MALFORMED naming the tensor and the index of its first NaN or
 * infinity (or the hyper-parameter) unless allow_nonfinite. The check
 * reads every scale, which for GGML types means a few bytes of each block. */
KILN_API kiln_status kiln_model_open_with(const char *path, const kiln_model_options *opts,
                                          kiln_model **out);

/* Warnings raised while opening or building graphs (allow_partial),
 * NULL-terminated, owned by the model. */
KILN_API const char *const *kiln_model_warnings(const kiln_model *m);

/* "gguf v3", "safetensors", ... and the architecture name from the file
 * ("" when it names none), owned by the model. */
KILN_API const char *kiln_model_container(const kiln_model *m);
KILN_API const char *kiln_model_arch(const kiln_model *m);

/* Llama-family hyper-parameters, 0 where the file does not say. */
typedef struct kiln_model_info {
    int64_t n_layers, d_model, d_ffn, n_heads, n_kv_heads, vocab, ctx;
    float rms_eps;
} kiln_model_info;
KILN_API void kiln_model_get_info(const kiln_model *m, kiln_model_info *out);

/* The stored tensors, in file order; name and type_name are owned by the
 * model. */
typedef struct kiln_model_tensor_info {
    const char *name;
    const char *type_name; /* the file's own name of the type */
    int supported;         /* kiln can use it (format is valid) */
    kiln_format format;
    int n_dims;
    int64_t ne[4];         /* ne[0] innermost */
    size_t bytes;
    int64_t group;         /* an integer group format's group along K, 0: one a row */
    float input_scale;     /* a linear weight's static activation scale, 0: none */
} kiln_model_tensor_info;
KILN_API int kiln_model_n_tensors(const kiln_model *m);
KILN_API kiln_status kiln_model_tensor_at(const kiln_model *m, int i, kiln_model_tensor_info *out);

/* The file's metadata, in file order: a GGUF file's key/value pairs; a
 * safetensors model has none. kiln_model_metadata_at gives the i-th key in
 * *key, owned by the model (valid until kiln_model_close), and writes its
 * value into buf as one line of text, cut to fit size bytes and always
 * NUL-terminated: numbers in full, strings quoted and escaped (cut after
 * 64 bytes), arrays as `array<string>[32000] ["<unk>", "<s>", ...]` with
 * at most max_items items. KILN_ERR_INVALID_ARG, naming the file, for an i
 * out of range, a NULL key or buf, or a size of 0. */
KILN_API int kiln_model_n_metadata(const kiln_model *m);
KILN_API kiln_status kiln_model_metadata_at(const kiln_model *m, int i, int max_items,
                                            const char **key, char *buf, size_t size);

/* The weight named name as a kiln_qtensor pointing into the mapping.
 * KILN_ERR_NOT_FOUND when absent; KILN_ERR_UNSUPPORTED, naming the file, the
 * tensor and its type, when kiln cannot use its type. */
KILN_API kiln_status kiln_model_weight(const kiln_model *m, const char *name, kiln_qtensor *out);

/* Graphs built from a Llama-family model, into an empty graph g:
 *  linears: every linear of every layer (q, k, v, o, gate, up, down) and the
 *           output head, each its own node with its own input — for compiling
 *           a whole model ahead of time;
 *  engine:  linears' graph and, for each layer, the FFN's gate and up as one
 *           group with its own input "blk.L.ffn_gate_up.in" and output
 *           "blk.L.ffn_gate_up.out" = act(gate(x)) * up(x), act the family's
 *           as in ffn (an unknown family is refused as ffn refuses it) — an
 *           entry point (kiln_session_find_entry) an engine calls in place of
 *           the two linears and its own act·mul, run as two kernels;
 *  ffn:     the layers' feed-forward blocks chained with their norms and
 *           residuals, x + down(act(gate(norm(x))) * up(norm(x))), runnable;
 *           act is the family's (SiLU; GELU's tanh form for Gemma, or what
 *           config.json's hidden_activation / hidden_act names), Gemma 2 and
 *           3 norm the FFN's output too, and config.json Gemma norm weights
 *           are applied as 1 + w. An architecture or activation kiln does not
 *           model is KILN_ERR_UNSUPPORTED (a warning with allow_partial).
 * A linear's bias (its weight's name with .bias for .weight, as Qwen2's
 * q/k/v) is the linear's fused bias in both graphs.
 * n_layers limits the layers used (0: all). */
KILN_API kiln_status kiln_model_build_linears(kiln_model *m, kiln_graph *g, int n_layers);
KILN_API kiln_status kiln_model_build_engine(kiln_model *m, kiln_graph *g, int n_layers);
KILN_API kiln_status kiln_model_build_ffn(kiln_model *m, kiln_graph *g, int n_layers);

#ifdef __cplusplus
}
#endif
#endif /* KILN_H */
