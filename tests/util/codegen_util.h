/* What the codegen suites share: linear signatures written from their
 * varying fields, the template parameters a source passes, and many
 * kernels emitted and compiled with NVRTC in one go. */
#ifndef KILN_CODEGEN_UTIL_H
#define KILN_CODEGEN_UTIL_H

#include "codegen/emit.h"
#include "codegen/nvrtc.h"

/* "linear backend=... target=arch" into buf (size bytes), scales=x and
 * out=bf16; returns buf. */
char *kt_linear_sig(char *buf, size_t size, const char *backend, const char *variant,
                    kiln_format f, const char *act, int64_t n, int64_t k, unsigned epi,
                    const char *arch);

/* The value a generated source passes as "/\*name*\/ <value>" (asserting
 * there is one). */
long long kt_source_param(const char *text, const char *name);

typedef struct kt_batch {
    kiln_kernel_source *src;
    kiln_compile_job *jobs;
    char **sig;
    int n, cap;
} kt_batch;

/* Emit signature (asserting the emit succeeds) into b, which starts as
 * { 0 }. */
void kt_batch_add(kt_batch *b, const char *signature);

/* Compile everything in b two at a time, assert each compiled, report the
 * time per kernel under what, and free b. */
void kt_batch_compile(kt_batch *b, const char *what);

/* NVRTC, asserting it loads (the CUDA toolkit's, or $KILN_NVRTC's). */
kiln_nvrtc *kt_open_nvrtc(void);

/* cuobjdump --dump-sass of a cubin (malloc'ed text), or NULL when
 * cuobjdump or nvdisasm is not on PATH. */
char *kt_dump_sass(const void *cubin, size_t size);

/* How many times what occurs in text. */
int kt_count(const char *text, const char *what);

#endif
