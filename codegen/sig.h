/* Kernel signatures. A signature is the canonical text of everything that
 * determines a compiled kernel; its descriptor is the same thing as data.
 * One table of fields per step kind both prints a descriptor and parses text
 * back (codegen/sig.c), so the two cannot drift apart. Lowering builds
 * descriptors and prints them; emission and compiling read descriptors;
 * text is parsed only where it comes from outside the process (a cache
 * record, the command line, a test).
 *
 * The text is part of every generated source, hence of every cache key and
 * of every shipped cache: its form does not change. The forms, fields in
 * this order, one space apart:
 *   linear backend=B variant=V format=F scales=S act=A n=N k=K epilogue=E out=bf16 target=T
 *   op OP width=W target=T
 *   quant act=A k=K target=T
 *   pack format=F target=T      (a packed layout's device packer)
 * scales follows from the format ("f32:128x128", "e8m0:1x32", "inline",
 * "none"): it is printed for the reader and not read back. */
#ifndef KILN_SIG_H
#define KILN_SIG_H

#include "kernels/registry/backend.h"

enum { KILN_SIG_MAX = KILN_SIGNATURE_MAX }; /* a signature's text, NUL included */

/* A signature as data. Its entry name is "kiln_<backend | op | quant>_"
 * followed by 16 hex digits of the XXH3-64 of the signature text: the same
 * signature gives the same name on every machine and run. The target is
 * the one the text names (kiln_target_from_name), never a live device's SM
 * count or shared memory: a kernel built from a plan and one rebuilt from
 * its cache record's text are the same kernel. */
typedef struct kiln_kernel_desc {
    kiln_step_kind kind;
    kiln_target target;
    char entry[KILN_ENTRY_MAX];
    const kiln_backend *backend; /* KILN_STEP_LINEAR */
    kiln_linear_kernel linear;   /* KILN_STEP_LINEAR */
    kiln_op op;                  /* KILN_STEP_OP */
    kiln_act act;                /* KILN_STEP_QUANT; KILN_STEP_PACK: linear.cfg.format */
    int64_t width;               /* KILN_STEP_OP: row width; KILN_STEP_QUANT: k */
} kiln_kernel_desc;

/* Print d's signature into buf of size bytes (KILN_SIG_MAX holds every
 * signature); d->entry is not read. KILN_ERR_INVALID_ARG when size cannot
 * hold the text. */
kiln_status kiln_sig_print(const kiln_kernel_desc *d, char *buf, size_t size);

/* Set d->entry from signature, the text d was printed as or parsed from.
 * KILN_ERR_INVALID_ARG when the backend's name leaves the entry name no
 * room in KILN_ENTRY_MAX; d is untouched then. */
kiln_status kiln_sig_name(kiln_kernel_desc *d, const char *signature);

/* Parse signature into *out, named after it (kiln_sig_name). Fields after
 * the kind (and the op's name) may come in any order, each once; linear
 * backends are looked up in r. KILN_ERR_MALFORMED for text of none of the
 * forms; KILN_ERR_NOT_FOUND for an unknown backend, format, activation
 * scheme, op or target; KILN_ERR_UNSUPPORTED for an output other than bf16;
 * KILN_ERR_INVALID_ARG as kiln_sig_name, or for a NULL argument. Every
 * message quotes the signature. *out is untouched on failure. */
kiln_status kiln_sig_parse(const kiln_registry *r, const char *signature, kiln_kernel_desc *out);

#endif
