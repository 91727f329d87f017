/* The source emitter: a kernel of the plan, as its descriptor
 * (codegen/sig.h), becomes a short CUDA source that includes a template of
 * kernels/ and instantiates it with the signature's parameters (DeepGEMM's
 * JIT layout). The templates hold the logic; a generated source is a header
 * comment, an include and an extern "C" __global__ wrapper. Kernel
 * arguments are the structs of kernels/common/kiln_args.h. One file per
 * concept: emit.c the sources, templates.c the embedded templates' digest,
 * launch.c the launches of a kernel, keep.c kept sources. */
#ifndef KILN_EMIT_H
#define KILN_EMIT_H

#include "codegen/sig.h"

/* ---------------------------------------------------------- templates.c */

/* The device templates (every .cuh and .h under kernels/), embedded at build time
 * by cmake/embed.cmake; NVRTC gets every one as an in-memory header named
 * "kiln/<file name>". A cache key covers them all: changing any template
 * changes every key. */
typedef struct kiln_embedded_file {
    const char *name; /* "kiln/simt.cuh" */
    const char *text; /* NUL-terminated */
    size_t length;    /* bytes, NUL excluded */
} kiln_embedded_file;

extern const kiln_embedded_file kiln_embedded_headers[];
extern const size_t kiln_embedded_headers_count;

/* 32 hex digits of XXH3-128 over every embedded template. Each generated
 * source names it in its header, so a kernel's cache key changes with the
 * templates it includes, not only with its own text. */
const char *kiln_emit_templates_digest(void);

/* ---------------------------------------------------------------- emit.c */

/* One generated source. */
typedef struct kiln_kernel_source {
    kiln_kernel_desc desc;
    char *text;    /* malloc'ed, NUL-terminated */
    size_t length;
} kiln_kernel_source;

/* The cache-key line of every generated source carries this placeholder
 * until kiln_emit_set_key fills it. A key is XXH3-128 in 32 hex digits. */
#define KILN_EMIT_KEY_PLACEHOLDER "________________________________"

/* Emit the source of kernel d, named after signature (the text d was
 * printed as or parsed from, which the source's header quotes).
 * KILN_ERR_UNSUPPORTED when the backend has no code hooks or refuses the
 * kernel, or for an op or scheme that has no kernel (bf16 needs none).
 * *out is untouched on failure; release it with kiln_kernel_source_free. */
kiln_status kiln_emit(const kiln_kernel_desc *d, const char *signature, kiln_kernel_source *out);

/* kiln_emit of signature text from outside the process (a cache record,
 * the command line, a test), parsed by kiln_sig_parse with r's backends;
 * its errors besides kiln_emit's. */
kiln_status kiln_emit_text(const kiln_registry *r, const char *signature,
                           kiln_kernel_source *out);
void kiln_kernel_source_free(kiln_kernel_source *s);

/* Write key_hex (32 hex digits) over the placeholder in text, in place.
 * KILN_ERR_INVALID_ARG for a key of another form, or when text has no
 * placeholder left. */
kiln_status kiln_emit_set_key(char *text, const char *key_hex);

/* An fp8-tensor quantizer's source holds a kernel named its entry followed
 * by this suffix, which finds the tensor's amax before the entry runs. */
#define KILN_EMIT_AMAX_SUFFIX "_amax"

/* 1 when the quantizer of scheme a holds a KILN_EMIT_AMAX_SUFFIX kernel. */
int kiln_emit_quant_has_amax(kiln_act a);

/* -------------------------------------------------------------- launch.c */

/* One kernel launch of a step. */
typedef struct kiln_kernel_launch {
    char entry[KILN_ENTRY_MAX];
    kiln_launch cfg;
} kiln_kernel_launch;

/* The launches that run d for a bucket of m tokens, in stream order, all
 * with the same argument struct: one, except the fp8-tensor quantizer,
 * whose "<entry>_amax" kernel runs first. KILN_ERR_SHAPE for an m that
 * cannot be launched. */
kiln_status kiln_kernel_launches(const kiln_kernel_desc *d, int64_t m,
                                 kiln_kernel_launch out[KILN_MAX_LAUNCHES], int *n);

/* ---------------------------------------------------------------- keep.c */

/* Where kernel sources are kept (--keep-source DIR): keep when set, else
 * $KILN_DUMP_SOURCE when set and not empty, else NULL. */
const char *kiln_emit_keep_dir(const char *keep);

/* Write dir/<entry>.cu with source and, when not NULL, dir/<entry>.log
 * and dir/<entry>.ptx; dir is created (with its parents) when missing.
 * KILN_ERR_IO naming the path that failed. */
kiln_status kiln_emit_keep(const char *dir, const char *entry, const char *source, const char *log,
                           const char *ptx);

#endif
