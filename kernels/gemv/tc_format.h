/* The packed atom of each format the gemv_tc kernel serves, one row a
 * format. Read by the device template (kiln/tc.cuh: its tc_<name>
 * traits), the host backend (kernels/gemv/tc.c: rings and block shapes)
 * and the packer (kernels/gemv/pack.c: the arrays it writes), so the
 * three agree by construction. Valid C and CUDA, with no includes:
 * embedded for NVRTC as "kiln/tc_format.h".
 *
 * An atom is 16 rows x 64 values along K (kernels/gemv/pack.h). A row
 * X(FMT, name, bytes, pieces, units, record, super, rows):
 *   FMT      the format, KILN_FMT_<FMT>
 *   name     its short name (kiln_format_info.name)
 *   bytes    an atom's bytes in the data array
 *   pieces   16-byte pieces of a lane's share of an atom's data
 *   units    8-byte words a lane stages beside its pieces per atom:
 *            Q4_K's and Q6_K's super-record, Q6_K's high bits (inside
 *            the atom's bytes), FP8 block's scale (from the storage
 *            layout's scale array)
 *   record   bytes of a lane group's scale record per atom in the scale
 *            array; 0: the storage layout's scale array, copied as it is
 *   super    bytes of a lane group's record per 256 values (Q4_K: d and
 *            dmin, Q6_K: d), after every atom's records
 *   rows     1: the atom is its 16 rows in order (BF16: 128 bytes each,
 *            FP8: 64), read by ldmatrix, and by wgmma's TMA kernel as rows
 *            of its tiles (wgmma_tc, whose fragments are the others',
 *            refuses them)
 * F32 has no row: its values are not exact in BF16, nor in two terms. */
#ifndef KILN_TC_FORMAT_H
#define KILN_TC_FORMAT_H

/*  FMT          name         bytes pieces units record super rows */
#define KILN_TC_FORMATS(X)                                                                        \
    X(F16,         f16,         2048, 4,     0,    0,     0, 0)                                    \
    X(BF16,        bf16,        2048, 4,     0,    0,     0, 1)                                    \
    X(FP8_TENSOR,  fp8,         1024, 2,     0,    0,     0, 1)                                    \
    X(FP8_CHANNEL, fp8_channel, 1024, 2,     0,    0,     0, 1)                                    \
    X(FP8_BLOCK,   fp8_block,   1024, 2,     1,    0,     0, 0)                                    \
    X(MXFP8,       mxfp8,       1024, 2,     0,    4,     0, 0)                                    \
    X(NVFP4,       nvfp4,       512,  1,     0,    8,     0, 0)                                    \
    X(MXFP4,       mxfp4,       512,  1,     0,    4,     0, 0)                                    \
    X(Q8_0,        q8_0,        1024, 2,     0,    8,     0, 0)                                    \
    X(Q4_0,        q4_0,        512,  1,     0,    8,     0, 0)                                    \
    X(Q4_K,        q4_k,        512,  1,     1,    8,     8, 0)                                    \
    X(Q6_K,        q6_k,        768,  1,     2,    8,     4, 0)                                    \
    X(GGML_MXFP4,  ggml_mxfp4,  512,  1,     0,    4,     0, 0)

#endif
