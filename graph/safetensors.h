/* The safetensors reader: single files, directories and sharded sets, with
 * the quantization conventions of Hugging Face checkpoints joined into kiln
 * weights. kiln_model_open dispatches here; the model is freed by
 * kiln_model_close. */
#ifndef KILN_SAFETENSORS_H
#define KILN_SAFETENSORS_H

#include "graph/model_impl.h"

/* Open path read-only, which is one of
 *  - a .safetensors file;
 *  - a directory holding model.safetensors, or else
 *    model.safetensors.index.json and the shards its weight_map names;
 *  - a model.safetensors.index.json file.
 * config.json (or, for its quantization settings, hf_quant_config.json) is
 * read from the same directory when present. Every file is mapped once;
 * tensors point into the mappings.
 *
 * Quantized weights are joined with their scale tensors and listed under the
 * weight's name: FP8 (weight + weight_scale, per tensor or per channel),
 * block FP8 (weight + weight_scale_inv, or a weight_scale of 128x128 tiles),
 * ModelOpt MXFP8 (weight + E8M0 weight_scale [N, K/32]), ModelOpt NVFP4
 * (weight + weight_scale + weight_scale_2) and MXFP4 (X_blocks + X_scales,
 * listed as X). FP8 scales may be F32, BF16, F16 or F8_E8M0 and are read as
 * F32 (exactly: every value of those types is an F32 value); E8M0 scales of
 * MXFP8 and MXFP4 may be F8_E8M0 or U8 and are kept as bytes. The scale
 * tensors stay listed on their own: float ones usable as such, the others
 * (and MXFP4 blocks) unsupported with a why naming their weight.
 * A valid tensor kiln cannot use (a dtype, a rank above 4, a stacked 3-D
 * expert weight, a block or group size kiln's formats lack) is listed with
 * supported = 0 and a reason; opening does not fail for it.
 *
 * Ownership in the returned model: path, container, tensors and each
 * tensor's name, type_name and why are separate malloc'ed blocks;
 * impl/impl_free hold the mappings and the aligned copies of tensors whose
 * offset in the file does not suit their element type.
 *
 * Returns KILN_ERR_IO when a file cannot be opened or mapped,
 * KILN_ERR_NOT_FOUND when a directory holds no safetensors file,
 * KILN_ERR_MALFORMED for anything a file gets wrong ("<file>: tensor <name>:
 * <what>"), KILN_ERR_NOMEM. *out is untouched on failure. */
kiln_status kiln_safetensors_open(const char *path, struct kiln_model **out);

#endif
