/* The GGUF reader: opens a GGUF v2/v3 file as a kiln_model and exposes its
 * metadata. The file is untrusted input: every count, length, offset and
 * size is checked before use, and a malformed file is an error, never a
 * crash. See ggml's docs/gguf.md for the container itself. */
#ifndef KILN_GGUF_H
#define KILN_GGUF_H

#include "graph/model_impl.h"

/* Metadata value types, numbered as in the file. */
typedef enum kiln_gguf_type {
    KILN_GGUF_UINT8 = 0,
    KILN_GGUF_INT8,
    KILN_GGUF_UINT16,
    KILN_GGUF_INT16,
    KILN_GGUF_UINT32,
    KILN_GGUF_INT32,
    KILN_GGUF_FLOAT32,
    KILN_GGUF_BOOL,
    KILN_GGUF_STRING,
    KILN_GGUF_ARRAY,
    KILN_GGUF_UINT64,
    KILN_GGUF_INT64,
    KILN_GGUF_FLOAT64,
    KILN_GGUF_TYPE_COUNT
} kiln_gguf_type;

/* Arrays may hold arrays; deeper nesting than this is refused, which bounds
 * the reader's recursion. */
#define KILN_GGUF_MAX_DEPTH 8

/* A metadata value, a view valid until the model is closed. */
typedef struct kiln_gguf_value {
    kiln_gguf_type type;
    union {
        uint64_t u; /* UINT8, UINT16, UINT32, UINT64, and BOOL (0 or 1) */
        int64_t i;  /* INT8, INT16, INT32, INT64 */
        double f;   /* FLOAT32 (widened exactly), FLOAT64 */
        struct {
            const char *ptr; /* into the mapping: NOT NUL-terminated, may hold NULs */
            size_t len;
        } str;
        struct {
            kiln_gguf_type type; /* of every element */
            size_t n;
            /* Scalar elements: n packed little-endian values in the mapping
             * (read them with kiln_gguf_array_at). */
            const uint8_t *raw;
            /* STRING and ARRAY elements: n parsed values. */
            const struct kiln_gguf_value *items;
        } arr;
    };
} kiln_gguf_value;

/* "uint32", "string", "array", ... or "?" when out of range. */
const char *kiln_gguf_type_name(kiln_gguf_type type);

/* Open path as a GGUF file. The file is mapped read-only; tensors of types
 * kiln supports get a qt pointing into the mapping, the others are listed
 * with supported = 0 and a reason (using them is an error later, opening
 * is not). KILN_ERR_IO when the file cannot be opened or mapped;
 * KILN_ERR_MALFORMED when it breaks the format, with a message
 * "<path>: [key 'k' | tensor 't']: <what> (at byte offset N)";
 * KILN_ERR_UNSUPPORTED for GGUF v1, versions above 3, big-endian files and
 * tensor types ggml has removed. *out is left untouched on failure.
 *
 * Ownership in the returned model: path, container, tensors and each
 * tensor's name, type_name and why are separate malloc'ed blocks;
 * impl/impl_free hold the mapping and the metadata. */
kiln_status kiln_gguf_open(const char *path, struct kiln_model **out);

/* The value of key, or NULL when the model has no such key or was not read
 * from a GGUF file. */
const kiln_gguf_value *kiln_gguf_get(const struct kiln_model *m, const char *key);

/* Typed lookups. KILN_ERR_NOT_FOUND when the key is absent; KILN_ERR_MALFORMED,
 * naming the key, when its type does not fit: get_int takes any integer type
 * whose value fits an int64_t, get_float FLOAT32 or FLOAT64, get_str STRING
 * (the view is not NUL-terminated). */
kiln_status kiln_gguf_get_int(const struct kiln_model *m, const char *key, int64_t *out);
kiln_status kiln_gguf_get_float(const struct kiln_model *m, const char *key, double *out);
kiln_status kiln_gguf_get_str(const struct kiln_model *m, const char *key, const char **ptr,
                              size_t *len);

/* Element i of an array value. KILN_ERR_INVALID_ARG when arr is not an
 * array or i is out of range. */
kiln_status kiln_gguf_array_at(const kiln_gguf_value *arr, size_t i, kiln_gguf_value *out);

/* The metadata in file order: kiln_gguf_n_kv is 0 for a model not read from
 * GGUF; kiln_gguf_kv_at returns the i-th key (NUL-terminated) and its value,
 * or NULL when i is out of range. */
int kiln_gguf_n_kv(const struct kiln_model *m);
const char *kiln_gguf_kv_at(const struct kiln_model *m, int i, const kiln_gguf_value **value);

/* A one-line rendering of v for `kiln inspect`: scalars in full, strings
 * quoted and escaped (cut after 64 bytes), arrays as
 * "array<string>[32000] ["<unk>", "<s>", ...]" with at most max_items
 * items. Always NUL-terminates buf (when size > 0); returns buf. */
char *kiln_gguf_value_summary(const kiln_gguf_value *v, int max_items, char *buf, size_t size);

/* A GGML tensor type as GGUF files use it: ggml's name, elements per block
 * and bytes per block. Removed types keep their name with block = 0. */
typedef struct kiln_gguf_tensor_type {
    const char *name;
    int block;
    int type_size;
} kiln_gguf_tensor_type;

/* The row of type id, or NULL for an id ggml never defined. */
const kiln_gguf_tensor_type *kiln_gguf_tensor_type_get(uint32_t id);

#endif
