/* How each format streams through the gemv kernel's warp rings, one row a
 * format. Read by the device traits (kiln/gemv_formats.cuh: gemv_<name>)
 * and the host backend (kernels/gemv/backend.c: a stage's slot, the x
 * tile and the block's shared memory), so both size a stage alike. Valid
 * C and CUDA, with no includes: embedded for NVRTC as "kiln/gemv_format.h".
 *
 * A unit is what a lane decodes at once: 16 bytes of data (32 for F32), a
 * GGML block of 32 values, or an eighth of a 256-value block. A row
 * X(FMT, name, unit, aligned, scale_rows, scale_cols, scale_elem, offset):
 *   FMT         the format, KILN_FMT_<FMT>
 *   name        its short name (kiln_format_info.name)
 *   unit        values a unit holds; K is a multiple of it
 *   aligned     1: every unit starts 16-byte aligned in every row; 0: the
 *               blocks sit at any byte and a stage copies their cover
 *   scale_rows, scale_cols, scale_elem
 *               the separate scale array a stage also copies: one
 *               scale_elem-byte scale per scale_rows x scale_cols values
 *               (scale_cols 0: none in the stream; the rest of the
 *               formats' scales are inline or per row)
 *   offset      1: a run has an offset (the K-quants' minimum, Q4_1's and
 *               Q5_1's m), and the block keeps the sums of x per run of 8
 *               beside the x tile */
#ifndef KILN_GEMV_FORMAT_H
#define KILN_GEMV_FORMAT_H

/*  FMT          name         unit aligned scale_rows scale_cols scale_elem offset */
#define KILN_GEMV_FORMATS(X)                                                                      \
    X(F32,         f32,         8,   1,      0,         0,         0,         0)                  \
    X(F16,         f16,         8,   1,      0,         0,         0,         0)                  \
    X(BF16,        bf16,        8,   1,      0,         0,         0,         0)                  \
    X(FP8_TENSOR,  fp8,         16,  1,      0,         0,         0,         0)                  \
    X(FP8_CHANNEL, fp8_channel, 16,  1,      0,         0,         0,         0)                  \
    X(FP8_BLOCK,   fp8_block,   16,  1,      128,       128,       4,         0)                  \
    X(MXFP8,       mxfp8,       16,  1,      1,         32,        1,         0)                  \
    X(NVFP4,       nvfp4,       32,  1,      1,         16,        1,         0)                  \
    X(MXFP4,       mxfp4,       32,  1,      1,         32,        1,         0)                  \
    X(Q8_0,        q8_0,        32,  0,      0,         0,         0,         0)                  \
    X(Q4_0,        q4_0,        32,  0,      0,         0,         0,         0)                  \
    X(Q4_K,        q4_k,        32,  1,      0,         0,         0,         1)                  \
    X(Q6_K,        q6_k,        32,  0,      0,         0,         0,         0)                  \
    X(GGML_MXFP4,  ggml_mxfp4,  32,  0,      0,         0,         0,         0)                  \
    X(Q5_0,        q5_0,        32,  0,      0,         0,         0,         0)                  \
    X(Q5_1,        q5_1,        32,  0,      0,         0,         0,         1)                  \
    X(Q2_K,        q2_k,        32,  0,      0,         0,         0,         1)                  \
    X(Q3_K,        q3_k,        32,  0,      0,         0,         0,         0)                  \
    X(Q5_K,        q5_k,        32,  1,      0,         0,         0,         1)                  \
    X(IQ4_NL,      iq4_nl,      32,  0,      0,         0,         0,         0)                  \
    X(IQ4_XS,      iq4_xs,      32,  0,      0,         0,         0,         0)                  \
    X(Q4_1,        q4_1,        32,  0,      0,         0,         0,         1)

#endif
