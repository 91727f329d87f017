/* Backends and their selection. A backend is a table row of capability
 * checks and code hooks (ggml's backend struct, vLLM's linear kernels); each
 * format has a priority list of backend names, best first. */
#ifndef KILN_BACKEND_H
#define KILN_BACKEND_H

#include "core/build.h"

#include <stddef.h>

const char *kiln_act_name(kiln_act a);
/* Bytes of one token's activations of width k in scheme a, scales included. */
size_t kiln_act_row_bytes(kiln_act a, int64_t k);
/* The scheme a linear reading a takes instead when it has a static input
 * scale: the same layout, quantized with that scale (fp8-token:
 * fp8-static; bf16: bf16-qdq). KILN_ACT_COUNT where there is none: the
 * kernel quantizes with scales of its own, and the static one is ignored. */
kiln_act kiln_act_static_form(kiln_act a);

/* Epilogues a linear can absorb. */
enum {
    KILN_EPI_BIAS = 1 << 0,     /* + bias[N] */
    KILN_EPI_RESIDUAL = 1 << 1, /* + r[M,N] */
    KILN_EPI_SILU_MUL = 1 << 2, /* · silu(g[M,N]): the up projection of a gated FFN */
    /* with silu_mul alone: g is not read but computed in the same kernel,
     * g = x · w2ᵀ with the gate projection's weight, of the same format and
     * shape (kiln_linear_args w2). Not in KILN_EPI_ALL: a backend opts in. */
    KILN_EPI_GATE = 1 << 3,
};
#define KILN_EPI_ALL (KILN_EPI_BIAS | KILN_EPI_RESIDUAL | KILN_EPI_SILU_MUL)
#define KILN_FMT_ALL ((1u << KILN_FMT_COUNT) - 1)
/* The integer group formats: their scales come in the weight's group, which
 * only the simt kernel takes as a parameter so far. */
#define KILN_FMT_INT_GROUPS                                                                        \
    ((1u << KILN_FMT_INT4_GROUP) | (1u << KILN_FMT_INT4_GROUP_ZP) | (1u << KILN_FMT_INT8_GROUP) | \
     (1u << KILN_FMT_INT8_GROUP_ZP))
/* "none", "bias", "bias+residual", ... into buf; kiln_epilogue_str gives
 * the same text as a string with static storage ("?" for bits that are no
 * epilogue). */
const char *kiln_epilogue_name(unsigned epi, char *buf, size_t size);
const char *kiln_epilogue_str(unsigned epi);
/* The arguments of kernels/common/epilogue.cuh's kiln::epilogue for epi,
 * as a generated source spells them, each value after a comment naming
 * it: bias, residual, silu_mul, and gate where it is set. */
const char *kiln_epilogue_template_args(unsigned epi, char *buf, size_t size);

/* What a backend is asked to implement: one linear, independent of M. */
typedef struct kiln_linear_cfg {
    kiln_format format;
    int64_t n, k;
    unsigned epilogue;
    int64_t group; /* a grouped format's kiln_qtensor.group; 0 for the others */
} kiln_linear_cfg;

/* One linear kernel as its signature names it: the linear, the fused
 * epilogue (in cfg.epilogue), the activation scheme and the variant. */
typedef struct kiln_linear_kernel {
    kiln_linear_cfg cfg;
    kiln_act act;
    char variant[64];
} kiln_linear_kernel;

/* A backend's variants (tiles, M classes) as a table of rows of its own
 * struct, each with a `const char *name` and an `int64_t max_m`, the largest
 * bucket the row serves, ascending. */
typedef struct kiln_variant_table {
    const void *rows;
    size_t n, stride, name_at, max_m_at;
} kiln_variant_table;

#define KILN_VARIANT_TABLE(type, rows)                                                          \
    { (rows), KILN_ARRAY_LEN(rows), sizeof(type), offsetof(type, name), offsetof(type, max_m) }

/* The first row whose max_m covers bucket m (the last row past them all),
 * and the row named name (NULL when there is none); the caller casts to its
 * row type. */
const void *kiln_variant_for_bucket(const kiln_variant_table *t, int64_t m);
const void *kiln_variant_named(const kiln_variant_table *t, const char *name);
/* The name of the row kiln_variant_for_bucket gives. */
const char *kiln_variant_name_for_bucket(const kiln_variant_table *t, int64_t m);

/* Capability checks write a reason into why (for the plan's report and the
 * no-fit error) and return 0 when they refuse. */
typedef struct kiln_backend {
    const char *name;
    uint32_t formats;   /* bit f set: handles kiln_format f */
    unsigned epilogues; /* KILN_EPI_* it can fuse */
    int (*is_supported)(const kiln_target *t, char *why, size_t size);
    int (*can_implement)(const kiln_target *t, const kiln_linear_cfg *c, int64_t bucket,
                         char *why, size_t size);
    /* The activation scheme it consumes for this linear and bucket;
     * NULL: BF16. */
    kiln_act (*act)(const kiln_target *t, const kiln_linear_cfg *c, int64_t bucket);
    /* The variant (tile configuration, M class) for the signature; buckets
     * that get the same variant share a kernel. The row of variants that
     * serves the bucket (kiln_variant_for_bucket), unless the variant hook
     * is set; "default" when neither is. */
    const kiln_variant_table *variants;
    void (*variant)(const kiln_target *t, const kiln_linear_cfg *c, int64_t bucket, char *buf,
                    size_t size);
    /* Every variant that can serve linear c (any bucket) on t, the
     * heuristic's among them: what `kiln tune` times and a tuning table
     * may name. Writes at most max names (static strings) and returns
     * their count; NULL: the heuristic's variant alone. */
    int (*candidates)(const kiln_target *t, const kiln_linear_cfg *c, const char **names, int max);
    /* Code hooks, optional: NULL in a backend that only takes part in
     * planning (tests), which then cannot be compiled. */
    /* The source after the generated header comment: the template's
     * include and an extern "C" __global__ function named entry taking one
     * kiln_linear_args (kernels/common/kiln_args.h). Writes at most size
     * bytes, NUL included: KILN_ERR_INVALID_ARG when they cannot hold it;
     * KILN_ERR_UNSUPPORTED for a kernel it does not build (an unknown
     * variant, an activation scheme it does not take). */
    kiln_status (*emit)(const kiln_target *t, const kiln_linear_kernel *k, const char *entry,
                        char *buf, size_t size);
    /* Grid, block and dynamic shared memory of k for a bucket of m tokens;
     * KILN_ERR_UNSUPPORTED as emit, KILN_ERR_SHAPE for an m it cannot
     * launch. */
    kiln_status (*launch)(const kiln_target *t, const kiln_linear_kernel *k, int64_t m,
                          kiln_launch *out);
    /* Weights in a layout of the backend's own, optional (NULL: kiln's
     * storage layout everywhere): the layout kernel k reads on t, with the
     * function that packs it (core/build.h). A session keeps one device
     * copy per weight and pack function. */
    kiln_status (*layout)(const kiln_target *t, const kiln_linear_kernel *k,
                          kiln_weight_layout *out);
} kiln_backend;

/* b's activation scheme and variant for linear c at bucket on t, as its
 * hooks or its variant table give them (the defaults where it has
 * neither). */
kiln_act kiln_backend_act(const kiln_backend *b, const kiln_target *t, const kiln_linear_cfg *c,
                          int64_t bucket);
void kiln_backend_variant(const kiln_backend *b, const kiln_target *t, const kiln_linear_cfg *c,
                          int64_t bucket, char *buf, size_t size);

enum { KILN_MAX_CANDIDATES = 16 };

/* The variants b may run linear c with at bucket on t: its candidates hook's
 * that it can launch for a bucket of that many tokens with activations in
 * act (at most max; KILN_MAX_CANDIDATES holds every backend's), or the
 * heuristic's variant alone when it has no hook. Names are static, or
 * written into heuristic (KILN_TUNING_NAME_MAX bytes), which
 * names[i] may point to. Returns the count; 0 when none can launch. */
int kiln_backend_candidates(const kiln_backend *b, const kiln_target *t, const kiln_linear_cfg *c,
                            kiln_act act, int64_t bucket, const char **names, int max,
                            char heuristic[64]);

/* An emit hook's source, printed into buf as printf would:
 * KILN_ERR_INVALID_ARG, naming backend, when size bytes cannot hold it. */
kiln_status kiln_backend_source(char *buf, size_t size, const char *backend, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* An is_supported hook: any target from sm_75 (kiln's oldest). */
int kiln_sm75_or_newer(const kiln_target *t, char *why, size_t size);

/* What every linear kernel requires of k: activations in scheme act (BF16
 * for every W*A16 kernel), at most one aux input (residual or silu_mul), a
 * kiln_format. KILN_ERR_UNSUPPORTED, naming backend, for anything else. */
kiln_status kiln_linear_kernel_check(const char *backend, const kiln_linear_kernel *k,
                                     kiln_act act);

/* Whether linear c's integer group is one a kernel decoding unit values at
 * a time takes: 0 (one group a row) or a positive multiple of unit that
 * divides K. 1 for a format without groups; 0 with the reason in why
 * otherwise. */
int kiln_linear_group_fits(const kiln_linear_cfg *c, int unit, char *why, size_t size);

/* The portable fallback: dequantize + f32 FMA, every format, sm_75+. */
extern const kiln_backend kiln_backend_simt;
/* Decode (M bucket <= 16): bandwidth-bound matrix-vector products in f32
 * FMA, every format, sm_75+, weights in kiln's storage layout. */
extern const kiln_backend kiln_backend_gemv;
/* Decode (M bucket <= 16) on tensor cores (mma.sync, sm_80+): every format
 * exact in BF16 (all but F32), K in whole atoms of 64, weights packed. */
extern const kiln_backend kiln_backend_gemv_tc;
/* Hopper warpgroup MMA (sm_90a): every format dequantized to BF16 in the
 * main loop, f32 accumulators. */
extern const kiln_backend kiln_backend_wgmma;

/* Hopper warpgroup MMA (sm_90a) with the weight as the register operand,
 * read from the gemv_tc packed layout: the formats whose decoding is
 * one BF16 term (NVFP4, MXFP4, GGML MXFP4, ...; BF16's atoms are wgmma's),
 * K in whole atoms of 64, activations in the bf16-tc order. */
extern const kiln_backend kiln_backend_wgmma_tc;

/* The gemv_tc packed layout of k's weight on t (KILN_ERR_UNSUPPORTED where
 * there is none): gemv_tc's layout hook, which wgmma_tc shares, and
 * wgmma's for BF16 (row-major atoms), so that decode and prefill read one
 * device copy. */
kiln_status kiln_gemv_tc_layout(const kiln_target *t, const kiln_linear_kernel *k,
                                kiln_weight_layout *out);

/* Shared memory a block may ask for on t: its opt-in limit, or where that
 * is unknown (a live device past kiln's table that did not say), the 48
 * KiB every CUDA device gives a block. */
int64_t kiln_block_smem_limit(const kiln_target *t);

#define KILN_MAX_BACKENDS 16

/* The backends kiln can use and each format's priority list. Only backends
 * whose kernels exist are in the default registry; tests build their own. */
typedef struct kiln_registry {
    const kiln_backend *backends[KILN_MAX_BACKENDS];
    int n;
    const char *priority[KILN_FMT_COUNT][KILN_MAX_BACKENDS + 1]; /* NULL-terminated names */
} kiln_registry;

const kiln_registry *kiln_registry_default(void);
const kiln_backend *kiln_registry_find(const kiln_registry *r, const char *name);

#endif
