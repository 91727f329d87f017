/* Internal: the quantizers of quant_ggml.c and quant_int.c, dispatched by
 * quant.c. */
#ifndef KILN_QUANT_H
#define KILN_QUANT_H

#include "kiln.h"

/* The GGML block formats (quant_ggml.c); a GGML tensor is a run of
 * independent blocks in row-major order. */
void kiln_quant_q8_0_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_q8_0_dequantize(const kiln_qtensor *t, float *dst);
void kiln_quant_q4_0_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_q4_0_dequantize(const kiln_qtensor *t, float *dst);
void kiln_quant_q4_k_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_q4_k_dequantize(const kiln_qtensor *t, float *dst);
/* Sub-block j's 6-bit scale and min from a Q4_K block's 12 packed bytes. */
void kiln_quant_q4_k_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m);
void kiln_quant_q6_k_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_q6_k_dequantize(const kiln_qtensor *t, float *dst);
void kiln_quant_ggml_mxfp4_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_ggml_mxfp4_dequantize(const kiln_qtensor *t, float *dst);

/* The integer group formats (quant_int.c), all four: the table row says
 * the bits and whether zero points follow the scales. */
void kiln_quant_int_group_quantize(const float *src, kiln_qtensor *t);
void kiln_quant_int_group_dequantize(const kiln_qtensor *t, float *dst);

#endif
