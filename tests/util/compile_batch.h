/* Many kernels emitted from their signatures and compiled with NVRTC in
 * one go, as the codegen suites check whole tables of them. */
#ifndef KILN_COMPILE_BATCH_H
#define KILN_COMPILE_BATCH_H

#include "codegen/emit.h"
#include "codegen/nvrtc.h"

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

#endif
