/* The packed weight layout of the gemv_tc backend's tensor-core kernel
 * (kernels/gemv/tc.cuh, which explains why it is laid out so).
 *
 * Rows of W are cut into tiles of 16 (the last padded with zeros), K into
 * atoms of 64. Atom a of tile r is atom_bytes of data at (r·(K/64) + a) ·
 * atom_bytes; lane l (g = l / 4, t = l % 4) owns 16-byte piece p of it at
 * p·512 + 16·l and holds the weights of rows 16r + g + 8h (h = 0, 1) at k
 * = 64a + 16j + 4t + s (k-tile j = 0..3, slot s = 0..3). In mma terms,
 * value (h, s) of k-tile j is half s & 1 of A register 2·(s >> 1) + h.
 * How a format's codes fill a lane's words, and its scale records, are
 * described beside its trait in tc.cuh; kiln_gemv_pack writes exactly
 * that. */
#ifndef KILN_GEMV_PACK_H
#define KILN_GEMV_PACK_H

#include "core.h"
#include "kernels/gemv/pack_core.h"

/* The tensor-core kernel runs mma.sync m16n8k16 with BF16 inputs. */
enum { KILN_GEMV_TC_MIN_SM = 80 };

/* Whether the tensor-core kernel (and so the packed layout) refuses format
 * f on an [n, k] weight for target t, and why: it serves sm_80+, K a
 * multiple of 64, a format whose values are exact in BF16, or in two BF16
 * terms (F16; not F32), and N and a 16-row tile's packed bytes below
 * 2^31, which the kernel indexes with ints. 0 when it serves them; else 1
 * with the first reason in why (size bytes; why may be NULL when size is
 * 0). kiln_gemv_pack refuses the values it cannot carry. */
int kiln_gemv_tc_refuses(const kiln_target *t, kiln_format f, int64_t n, int64_t k, char *why,
                         size_t size);

/* !kiln_gemv_tc_refuses(t, f, n, k, NULL, 0). */
int kiln_gemv_tc_serves(const kiln_target *t, kiln_format f, int64_t n, int64_t k);

/* A format's packed atom, its row of kernels/gemv/tc_format.h (which
 * says what each field is), and the row of format f: NULL for a format
 * the layout does not carry (F32). */
typedef struct kiln_gemv_tc_format {
    int bytes, pieces, units, record, super, rows;
} kiln_gemv_tc_format;

const kiln_gemv_tc_format *kiln_gemv_tc_format_get(kiln_format f);

/* Bytes of the packed data and scale arrays; KILN_ERR_SHAPE when the
 * shape cannot be packed (K not a multiple of 64, sizes overflow). */
kiln_status kiln_gemv_pack_bytes(kiln_format f, int64_t n, int64_t k, size_t *data,
                                 size_t *scale);

/* Pack src (kiln's storage layout) into data and scale, which hold
 * kiln_gemv_pack_bytes bytes: every byte of both is written. Refuses the
 * values the layout cannot carry (kiln_gemv_pack_refusal's error). */
kiln_status kiln_gemv_pack(const kiln_qtensor *src, void *data, void *scale);

/* kiln_gemv_pack's refusals of src, without packing it. */
kiln_status kiln_gemv_pack_check(const kiln_qtensor *src);

/* Format f's way through pack_core.h, which the host packer and the
 * device packer (kiln/pack.cuh) both take; 0 for a format without a
 * packed layout. */
int kiln_gemv_pack_way(kiln_format f, kp_format *out);

/* The error for value i of a weight of format f and k columns that the
 * layout cannot carry (kp_unpackable: an element, or NVFP4's block scale
 * i); f16_bits: the value's bits where f is F16. KILN_ERR_MALFORMED. */
kiln_status kiln_gemv_pack_refusal(kiln_format f, int64_t k, int64_t i, unsigned f16_bits);

/* The device packer of format f: CUDA source defining entry, a kernel
 * taking kiln_pack_args (kiln/kiln_args.h) that writes what
 * kiln_gemv_pack writes, launched with KILN_PACK_THREADS threads and any
 * count of blocks; written into buf of size bytes. */
kiln_status kiln_gemv_pack_emit(kiln_format f, const char *entry, char *buf, size_t size);

#endif
