/* The one parameter every kiln kernel takes, by value. This header is read
 * twice: by the host C compiler (the runtime fills these structs and hands
 * cuLaunchKernel a pointer to one) and by NVRTC, embedded as
 * "kiln/kiln_args.h", inside every kernel. One text, so one layout. Plain
 * C types only: NVRTC sees no libc or toolkit header.
 *
 * Activations are BF16 [m, width] row-major unless a quantization scheme
 * says otherwise; m is the bucket's token count (rows past the real count
 * are computed and ignored). Weights are in kiln's storage layout
 * (include/kiln.h, kiln_format_info): `w` the data rows, `w_scale` the
 * separate scale array, `w_global` NVFP4's f32 global scale in device
 * memory (a pointer, so reloading weights never stales a captured graph).
 *
 * Quantized activations (kiln_act, one value of the plan) occupy
 * m * kiln_act_row_bytes(act, k) bytes: E4M3 codes [m, k] row-major from
 * byte 0, then the scales from byte m * k:
 *   fp8-token   f32 [m]                 s = amax(row) / 448
 *   fp8-1x128   f32 [ceil(k/128)][m]    group-major, the order a TMA
 *                                       descriptor of DeepGEMM's kind reads
 *   mxfp8-1x32  e8m0 [m][ceil(k/32)]    OCP MX scale codes
 *   fp8-static  f32 [m]                 every row the linear's static input scale
 * bf16-qdq is BF16 [m, k] like bf16, holding e4m3(x / s) · s.
 * f32 scales start at byte m * k, which need not be 4-aligned: they are
 * written and read byte by byte. fp8-tensor keeps no scale in the value:
 * its f32 scale and the amax partials live in `scale` and `partial`. */
#ifndef KILN_ARGS_H
#define KILN_ARGS_H

/* A linear: y[m, n] = epilogue(x[m, k] · w[n, k]ᵀ). */
typedef struct kiln_linear_args {
    void *y;               /* bf16 [m, n] */
    const void *x;         /* [m, k] in the kernel's activation scheme */
    const void *x_scale;   /* fp8-tensor: the f32 scale; otherwise NULL */
    const void *w;         /* weight data */
    const void *w_scale;   /* weight scales; NULL for formats without */
    const float *w_global; /* NVFP4: the f32 global scale; otherwise NULL */
    const float *bias;     /* f32 [n], with the bias epilogue */
    const void *aux;       /* bf16 [m, n]: the residual, or the gate of silu_mul */
    /* With the gate epilogue, the gate projection's weight (the aux gate
     * is computed, not read): w, w_scale and w_global of its own. */
    const void *w2;
    const void *w2_scale;
    const float *w2_global;
    int m;
} kiln_linear_args;

/* Threads per block of the aux kernels (elementwise ops, rms_norm,
 * activation quantizers), which run one block per row: grid.x = m. */
#define KILN_ROW_THREADS 256

/* An elementwise op or rms_norm on rows of `width`. */
typedef struct kiln_op_args {
    void *y;              /* bf16 [m, width] */
    const void *a;        /* bf16 [m, width] */
    const void *b;        /* bf16 [m, width]: add, mul; otherwise NULL */
    const float *weight;  /* rms_norm: f32 [width]; otherwise NULL */
    float eps;            /* rms_norm */
    int m;
} kiln_op_args;

/* The per-tensor scheme reduces in two kernels of one module: the first
 * writes one partial amax per block into partial[KILN_QUANT_AMAX_PARTS],
 * the second folds them, writes the scale and quantizes. No atomics and no
 * zeroing between replays, and the result does not depend on timing. */
#define KILN_QUANT_AMAX_PARTS 64

/* Activation quantization of x[m, k] into one kiln_act layout. */
typedef struct kiln_quant_args {
    void *q;              /* m * kiln_act_row_bytes(act, k) bytes, layout above */
    const void *x;        /* bf16 [m, k] */
    float *scale;         /* fp8-tensor: the f32 scale written; fp8-static and bf16-qdq:
                             the static f32 input scale, read; otherwise NULL */
    float *partial;       /* fp8-tensor: f32 [KILN_QUANT_AMAX_PARTS]; otherwise NULL */
    int m;
} kiln_quant_args;

/* The device packer of a packed weight layout (kiln/pack.cuh): the weight
 * [n, k] in kiln's storage layout in, its packed arrays out; where the
 * layout packs no scale records, the scale_bytes of w_scale are copied to
 * out_scale as they are. The first value the layout cannot carry lowers
 * *bad to its index (an element, or NVFP4's block scale); *bad is left as
 * it was when there is none. */
#define KILN_PACK_THREADS 256

typedef struct kiln_pack_args {
    const void *w, *w_scale;
    void *out, *out_scale;
    long long n, k, scale_bytes;
    unsigned long long *bad;
} kiln_pack_args;

#endif
