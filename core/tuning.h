/* The tuning table's insides (core/tuning.c): what planning and the
 * cache use beside the public calls of include/kiln.h. */
#ifndef KILN_TUNING_H
#define KILN_TUNING_H

#include "core.h"

/* A variant's name, NUL included (kiln_linear_kernel.variant). */
#define KILN_TUNING_NAME_MAX 64

/* The index of t's entry for signature (variant=*) at bucket, or -1. */
int kiln_tuning_index(const kiln_tuning *t, const char *signature, int64_t bucket);

/* Every entry of from into into: where both hold a key, from's replaces
 * into's when replace is set, else into's stays. */
kiln_status kiln_tuning_merge(kiln_tuning *into, const kiln_tuning *from, int replace);

/* t as text (tuning.c gives the form), in a new buffer (*out, free()'d by
 * the caller) of *size bytes plus a NUL. */
kiln_status kiln_tuning_text(const kiln_tuning *t, char **out, size_t *size);

/* The entries of size bytes of text into t (replacing those of the same
 * key). KILN_ERR_MALFORMED naming origin and the line for anything that is
 * not the form; entries before the bad line are kept. */
kiln_status kiln_tuning_parse(kiln_tuning *t, const char *text, size_t size, const char *origin);

#endif
