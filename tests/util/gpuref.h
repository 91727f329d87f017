/* A float64 reference of kiln's GPU numeric contract, with a derived error
 * bound per output element, for any graph of kiln's ops.
 *
 * The contract every GPU backend keeps (kernels/common/kiln_args.h):
 * activations are stored as BF16 (round to nearest even); the host's f32
 * inputs are rounded to BF16 once on upload; a weight is read as exactly
 * the value its format's CPU dequantizer gives, or (wgmma) that value
 * rounded to BF16; a linear multiplies BF16
 * activations by those values and accumulates in f32, or (wgmma on FP8
 * weights) first quantizes each token's activations to E4M3 with one f32
 * scale, or one for each 128 of K (the bound of fp8_error in gpuref.c); a
 * linear with a static input scale s reads e4m3(x / s) · s, as E4M3 codes
 * (fp8-static) or stored as BF16 (bf16-qdq), unless its plan says the
 * kernel ignores s (then its own scheme's contract holds); every op computes in
 * f32 from its BF16 inputs and rounds once to BF16 when it stores. A fused
 * epilogue only removes stores, so a bound that rounds after every op holds
 * for every fusion.
 *
 * Bounds, per element, propagated op by op to first order:
 * - BF16 store: the unit roundoff of 8 significant bits, 2^-8 of the value,
 *   for what later ops read; the output's own store is checked exactly (the
 *   GPU's value must be what some f32 value within the bound rounds to).
 * - f32 accumulation of K products: rounding errors that behave as
 *   independent zero-mean variables stay below λ·√K·u of Σ|terms| with
 *   probability 1 − 2K·exp(−λ²(1−u)²/2) (Higham & Mary, SISC 2019); λ = 8
 *   gives (4√K + 1)·FLT_EPSILON, a false failure ~1e-10 an element at K =
 *   4096. Tensor cores truncate (round toward zero) each k-step's sum: a
 *   biased error of up to 2 ulps of the accumulator a step, bounded by
 *   4·(K/16)·FLT_EPSILON of the largest partial sum of any contiguous K
 *   range, which the reference tracks. Formats decoded with an offset
 *   (Q4_0, Q4_K, Q6_K: d·q − offset) are summed as two terms whose sizes
 *   reach three times the block's largest weight: Σ|terms| counts them.
 * - f32 elementwise ops (fast-math exp, rsqrt, division): 2^-16 relative,
 *   far above their few ulps and far below the BF16 store after them.
 * What the bound cannot pass: an accumulator in FP16 (2^-11 an add, on
 * partial sums of the size of the result), a scale dropped, doubled or read
 * from the wrong block, a block read in the wrong place. */
#ifndef KILN_GPUREF_H
#define KILN_GPUREF_H

#include "kiln.h"

#include <stddef.h>
#include <stdint.h>

/* An activation [m, d]: the reference value and the bound on how far the
 * GPU's f32 value may be from it before the op's BF16 store. */
typedef struct kt_ref {
    int64_t m, d;
    double *v, *e;
} kt_ref;

/* Evaluate g (one input, one output) for m tokens on x (f32 [m, K]) under
 * the contract above, each linear read as the backend plan p gives it for
 * m tokens reads its weight (exactly, or rounded to BF16: the table in
 * gpuref.c); p NULL: every weight exactly. */
kt_ref kt_ref_eval(kiln_graph *g, const kiln_plan *p, int64_t m, const float *x);
void kt_ref_free(kt_ref *r);

/* The elements of got (f32 [m, d], BF16 values) that no f32 value within
 * the bound rounds to (NaN counts); *worst gets the largest |got − v| over
 * the allowed distance; the first violation is described in first. */
int64_t kt_ref_violations(const kt_ref *want, const float *got, double *worst, char *first,
                          size_t size);

#endif
