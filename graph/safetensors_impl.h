/* Internal to the safetensors reader: what the container (safetensors.c:
 * files, headers, index, config.json, the kiln_model) and the quantization
 * conventions (safetensors_quant.c) share while a checkpoint is loaded. */
#ifndef KILN_SAFETENSORS_IMPL_H
#define KILN_SAFETENSORS_IMPL_H

#include "graph/safetensors.h"

#include <jansson.h>
#include <stdarg.h>

#define KILN_ST_MAX_DIMS 4

typedef enum kiln_st_dtype {
    KILN_ST_F32, KILN_ST_F16, KILN_ST_BF16, KILN_ST_F8_E4M3, KILN_ST_U8, KILN_ST_I8,
    KILN_ST_F64, KILN_ST_I64, KILN_ST_U64, KILN_ST_I32, KILN_ST_U32, KILN_ST_I16, KILN_ST_U16, KILN_ST_BOOL,
    KILN_ST_F8_E5M2, KILN_ST_F8_E8M0, KILN_ST_F6_E2M3, KILN_ST_F6_E3M2, KILN_ST_F4, KILN_ST_C64,
    KILN_ST_DTYPE_COUNT /* also: a dtype name kiln does not know */
} kiln_st_dtype;

typedef struct kiln_st_dtype_info {
    const char *name;
    int bits;  /* per element; sub-byte types pack along the tensor */
    int raw;   /* kiln reads its bytes: plain, or inside a quantized weight */
    int plain; /* usable on its own, as `format` */
    kiln_format format;
} kiln_st_dtype_info;

extern const kiln_st_dtype_info kiln_st_dtypes[KILN_ST_DTYPE_COUNT];

typedef struct kiln_st_map {
    char *path;
    void *base;
    size_t size;
    uint64_t dev, ino; /* the file mapped */
} kiln_st_map;

/* What the model keeps: the mappings, and the aligned copies of tensors the
 * file stores at an offset their element type cannot be read from. */
typedef struct kiln_st_impl {
    kiln_st_map *maps;
    int n_maps, cap_maps;
    void **owned;
    int n_owned, cap_owned;
} kiln_st_impl;

typedef struct kiln_st_slot {
    kiln_model_tensor t;
    kiln_st_dtype dtype;
    int rank;                        /* as stored; more than 4 dims are folded into shape[0] */
    int64_t shape[KILN_ST_MAX_DIMS]; /* outermost first, as in the file */
    size_t begin, end;               /* within the data section */
    const uint8_t *data;
    const char *file;                /* the path of its map */
    int insert_before;               /* a joined MXFP4 weight: listed before this slot; else -1 */
} kiln_st_slot;

/* Quantization settings from config.json or hf_quant_config.json. */
typedef struct kiln_st_quant {
    int64_t block_rows, block_cols; /* fp8 weight_block_size; 0 when not given */
    int64_t nvfp4_group;            /* ModelOpt NVFP4 group_size; 0 when not given */
    int mxfp8;                      /* ModelOpt quant_algo MXFP8 */
    /* FP8 weights come with a static activation scale, input_scale, which
     * the settings named in act_static_why require. */
    int act_static;
    char act_static_why[192];
} kiln_st_quant;

typedef struct kiln_st_loader {
    char *dir;
    kiln_st_impl *impl;
    kiln_st_slot *v;
    int n, cap;
    json_t *names; /* tensor name -> slot index */
    int n_stored;  /* slots from the files; joined MXFP4 weights follow */
    kiln_st_quant q;
    json_t *ct;    /* a compressed-tensors quantization_config, or NULL */
    char *ct_file; /* the file it came from */
    kiln_model_hparams hp;
    int n_shards;
} kiln_st_loader;

/* safetensors.c's helpers, used by both files. */

/* Grows *v to hold need elements of elem bytes; 0 when out of memory. */
int kiln_st_grow(void **v, int *cap, int need, size_t elem);
/* A malloc'ed formatted string, or NULL. */
char *kiln_st_vstrdupf(const char *fmt, va_list ap);
char *kiln_st_strdupf(const char *fmt, ...) KILN_PRINTF(1, 2);
kiln_status kiln_st_nomem(void);
/* Frees a tensor's name, type_name and why. */
void kiln_st_tensor_free(kiln_model_tensor *t);
int kiln_st_ends_with(const char *s, const char *suffix);

/* safetensors_quant.c. */

/* Reads quantization settings q (quantization_config, or the quantization
 * object of hf_quant_config.json) from file into L->q. */
kiln_status kiln_st_parse_quant(kiln_st_loader *L, const char *file, const json_t *q);
/* Classifies every stored tensor, then joins each quantized weight with its
 * scales; joined MXFP4 weights are appended after the stored slots. */
kiln_status kiln_st_join_all(kiln_st_loader *L);

/* safetensors_ct.c: compressed-tensors. */

typedef enum kiln_st_ct_kind {
    KILN_ST_CT_NONE,        /* no group quantizes the module's weight */
    KILN_ST_CT_IGNORED,     /* the ignore list names the module */
    KILN_ST_CT_FP8,         /* FP8 per tensor, per channel, in blocks, or MXFP8 */
    KILN_ST_CT_INT,         /* int4 / int8 in int32 words, per group or per channel */
    KILN_ST_CT_UNSUPPORTED, /* a scheme kiln has no format for: why says which */
} kiln_st_ct_kind;

typedef struct kiln_st_ct_scheme {
    kiln_st_ct_kind kind;
    int64_t block_rows, block_cols; /* FP8 blocks; 0 otherwise */
    int mxfp8;                      /* FP8 in groups of 32 with E8M0 scales */
    int act_static;                 /* input_activations.dynamic is false */
    int int_bits;                   /* KILN_ST_CT_INT: 4 or 8 */
    int64_t int_group;              /* KILN_ST_CT_INT: group_size; 0 per channel */
    int int_zero_point;             /* KILN_ST_CT_INT: asymmetric, weight_zero_point */
    char group[64];
    char why[320];
} kiln_st_ct_scheme;

/* Checks a quantization_config with quant_method "compressed-tensors" from
 * file and keeps it in L->ct. KILN_ERR_MALFORMED naming the field that is
 * not what compressed-tensors writes. */
kiln_status kiln_st_ct_parse(kiln_st_loader *L, const char *file, const json_t *q);
/* The scheme of the weight of module (its name without ".weight"). */
kiln_status kiln_st_ct_lookup(const kiln_st_loader *L, const char *module, kiln_st_ct_scheme *out);

#endif
