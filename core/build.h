/* The build: everything a session needs to run a plan, as data. Planning
 * (codegen/lower.c) decides each step's kernel, launches and weight layout;
 * building (codegen/compile.c) finds or compiles each kernel's cubin. The
 * runtime reads this and nothing of codegen or of the kernels: a session
 * only finalises the launches for its device (runtime/launch.c), once, and
 * then captures. */
#ifndef KILN_BUILD_H
#define KILN_BUILD_H

#include "core.h"

/* How a linear consumes its activations. Values only grow at the end. */
typedef enum kiln_act {
    KILN_ACT_BF16 = 0,    /* W*A16: activations stay BF16 */
    KILN_ACT_FP8_TENSOR,  /* E4M3, one dynamic scale per tensor */
    KILN_ACT_FP8_TOKEN,   /* E4M3, one scale per token (row) */
    KILN_ACT_FP8_G128,    /* E4M3, one scale per token per 128 along K (block FP8) */
    KILN_ACT_MXFP8_G32,   /* E4M3 with an E8M0 scale per 32 along K */
    /* The static forms of a linear's input_scale (kiln_graph_linear_input_scale),
     * made by a quantization step that reads the scale: */
    KILN_ACT_FP8_STATIC,  /* E4M3 with the static scale, laid out as fp8-token (every
                             row's scale the same) for the kernels that read that */
    KILN_ACT_BF16_QDQ,    /* BF16 holding e4m3(x / scale) · scale, for W*A16 kernels */
    KILN_ACT_BF16_TC,     /* BF16, each 16 of K in the order of the gemv_tc packed
                             layout's k slots (kernels/wgmma/wgmma_tc.cuh) */
    KILN_ACT_COUNT
} kiln_act;

/* What a step of a program runs. */
typedef enum kiln_step_kind {
    KILN_STEP_OP = 0,  /* an elementwise graph op (add, mul, silu, gelu, rms_norm) */
    KILN_STEP_LINEAR,  /* a linear with its fused epilogue */
    KILN_STEP_QUANT,   /* quantize an activation for a linear (inserted) */
    KILN_STEP_PACK,    /* pack a weight into a layout on the device (a load, not a step) */
} kiln_step_kind;

enum {
    KILN_ENTRY_MAX = 64,   /* a kernel function's name, NUL included */
    KILN_MAX_LAUNCHES = 2, /* kernels one step launches, in order */
    KILN_STEP_MAX_SRC = 3,
};

/* What a TMA tensor map of a launch describes. */
typedef enum kiln_tma_source {
    KILN_TMA_NONE = 0,
    KILN_TMA_X,       /* the step's activations, src[0] */
    KILN_TMA_W,       /* its weight data, in the step's layout */
    KILN_TMA_W_SCALE, /* its weight's scale array, in the step's layout */
} kiln_tma_source;

enum { KILN_MAX_TMA = 4 };

/* A tiled tensor map (sm_90+) of 2 to 4 dimensions a kernel takes after
 * its args, in order: the session encodes it once for its device
 * addresses. The array starts `offset` bytes into its buffer: dims[0]
 * contiguous elements, then dims[d] steps of strides[d - 1] bytes for
 * each further dimension d (in any order of size: a map may walk an
 * inner dimension with a longer stride than an outer one); a copy moves
 * a box of box[0] × box[1] × ... elements into shared memory in that
 * order, swizzled. Boxes past the array read zeros, and count as whole
 * boxes on the barrier. */
typedef struct kiln_tma {
    kiln_tma_source source;
    unsigned elem_bytes;  /* 1, 2, 4 or 8: the copies are typeless */
    int rank;             /* 2 to 4; 0 reads as 2 */
    uint64_t dims[4];
    uint64_t strides[3];  /* bytes, multiples of 16 */
    uint64_t offset;      /* bytes, a multiple of 16 */
    unsigned box[4];
    unsigned swizzle;     /* 0, 32, 64 or 128 bytes */
} kiln_tma;

/* One kernel launch. */
typedef struct kiln_launch {
    unsigned grid[3];
    unsigned block[3];
    unsigned smem;        /* dynamic shared memory, bytes */
    unsigned static_smem; /* shared memory the kernel declares itself, bytes */
    /* 1: the kernel copies only weights before it waits for the kernel
     * launched before it (griddepcontrol.wait, sm_90+), so it may start
     * while that one drains (programmatic stream serialization). As the
     * plan gives it, a permission; kiln_launch_finalise decides for the
     * device. 0: it must start after. */
    int overlap;
    /* 1: the kernel loops over its grid.x work units with a stride of
     * gridDim.x, so the session may launch fewer blocks, as many as the
     * device holds at once (kiln_launch_finalise). */
    int persistent;
    kiln_tma tma[KILN_MAX_TMA];
    int n_tma;
} kiln_launch;

/* Weights in a kernel's own layout: pack writes src (kiln's storage
 * layout) for target t into arrays of data_bytes and scale_bytes. */
typedef kiln_status (*kiln_pack_fn)(const kiln_target *t, const kiln_qtensor *src, void *data,
                                    void *scale);

/* The layout a kernel reads its weight in. Kernels whose layouts have the
 * same pack function share one device copy of a weight. */
typedef struct kiln_weight_layout {
    kiln_pack_fn pack;  /* NULL: kiln's storage layout (the rest unused) */
    const char *name;   /* the packed layout's name, static */
    size_t data_bytes;  /* the packed arrays */
    size_t scale_bytes;
    /* 1: the backend packs on the device too, with a kernel of the
     * layout's format (a "pack" signature); packer is that signature's
     * index in the plan, set by lowering. The kernel lowers its bad
     * index to the first value it cannot carry, and refusal gives the
     * error the host packer would: for value i of a format f weight of k
     * columns, f16_bits the value's bits where f is F16. */
    int device_pack;
    int packer;
    kiln_status (*refusal)(kiln_format f, int64_t k, int64_t i, unsigned f16_bits);
    /* The packer's refusals of a weight without packing it (NULL: it
     * refuses nothing), so a reload can be refused before it writes. */
    kiln_status (*check)(const kiln_qtensor *q);
} kiln_weight_layout;

/* A step of one bucket's program. */
typedef struct kiln_step {
    kiln_step_kind kind;
    kiln_tensor *node;   /* the graph node it computes (the last absorbed one if fused) */
    int linear;          /* KILN_STEP_LINEAR: index of the plan's linear */
    kiln_act act;        /* KILN_STEP_QUANT: the scheme */
    float input_scale;   /* KILN_STEP_QUANT of a static scheme: the scale it applies */
    int src[KILN_STEP_MAX_SRC]; /* value ids, -1 unused; linear: x, aux (residual / gate) */
    int dst;             /* value id */
    int signature;       /* the kernel it runs, index into the plan's signatures */
    /* KILN_STEP_LINEAR: the weight, its bias (NULL: none) and the layout
     * the kernel reads the weight in. */
    kiln_tensor *weight, *bias;
    kiln_tensor *weight2; /* the gate epilogue's gate weight, in the same layout; else NULL */
    kiln_weight_layout layout;
    /* The kernel's launches for the program's m, in stream order, one per
     * entry of the kernel; none for a kernel whose backend cannot be built
     * (a planning-only backend of the tests). */
    kiln_launch launch[KILN_MAX_LAUNCHES];
    int n_launch;
} kiln_step;

/* An activation buffer of one bucket's program. */
typedef struct kiln_value {
    kiln_tensor *tensor; /* NULL for an inserted quantized activation */
    int64_t width;
    kiln_act act;        /* BF16 for ordinary activations */
    size_t bytes;        /* for the bucket's M */
    int first, last;     /* step that produces it (-1: graph input) and last that reads it */
    size_t offset;       /* in the arena */
} kiln_value;

/* The program of one token bucket: its steps in stream order over one
 * activation arena. */
typedef struct kiln_program {
    int64_t m;
    kiln_step *steps;
    int n_steps;
    kiln_value *values;
    int n_values, cap_values;
    size_t arena_bytes, naive_bytes;
    /* A tuning entry chose the launch policy of the whole step: serial,
     * every kernel starting after the one before it ends (the launches'
     * overlap cleared), or the backends' overlap kept. */
    int tuned, serial;
} kiln_program;

/* One kernel of the build: a cubin and the functions a step launches. */
typedef struct kiln_kernel {
    const char *signature;           /* the plan's text */
    char target[16];                 /* the target it is built for ("sm_90a") */
    char entry[KILN_MAX_LAUNCHES][KILN_ENTRY_MAX]; /* its functions, in launch order */
    int n_entries;
    uint32_t threads;                /* threads a block of its first function, as the cache
                                        record holds it (or the plan, compiled now) */
    uint8_t key[16];                 /* its cache key */
    void *cubin;                     /* owned */
    size_t cubin_size;
    int cached;                      /* found in a cache (layer below), else compiled now */
    int layer;
    double seconds;                  /* compile time when compiled now */
} kiln_kernel;

/* A plan's build: its programs (owned by the plan) and one kernel per
 * signature. */
typedef struct kiln_build {
    kiln_target target;              /* the plan's target, which weights are packed for */
    const kiln_program *programs;    /* [n_programs], one per bucket, ascending */
    int n_programs;
    kiln_kernel *kernels;            /* [n], index = the plan's signature index */
    int n;
    int cached, compiled;
    double seconds;                  /* the whole build */
    double compile_seconds;          /* of it, compiling with NVRTC (wall time) */
    char compiler[64];               /* of the compiles done now, "" when none */
} kiln_build;

typedef struct kiln_build_options {
    int jobs;                /* compiles at once; 0: one per core */
    int offline;             /* a miss is KILN_ERR_OFFLINE_MISS, nothing is compiled */
    const char *keep_source; /* write sources, logs and PTX here (or $KILN_DUMP_SOURCE) */
    int quiet;               /* no progress line */
    int no_cubins;           /* keys and hits only: do not keep cubins in memory */
    int misses_ok;           /* with offline: a miss leaves its kernel uncached (cached 0,
                                no cubin) and the build goes on, to list every miss */
    double timeout_s;        /* one compile's time limit; 0: $KILN_COMPILE_TIMEOUT, else
                                KILN_COMPILE_TIMEOUT_S */
    const volatile sig_atomic_t *stop; /* kiln_compile_options.stop */
} kiln_build_options;

/* One compile's time limit when nothing sets one. A kernel of the slowest
 * backend (wgmma) compiles in about 10 s; this is for a compiler that hangs. */
#define KILN_COMPILE_TIMEOUT_S 600.0

/* Build every kernel of p (codegen/compile.c): emitted, keyed, looked up
 * in c's layers and, on a miss, compiled with NVRTC and stored. c may hold
 * only shipped layers (then nothing can be stored: a miss that compiles is
 * still returned, not stored). NVRTC is loaded only when something must be
 * compiled. A cached record whose threads differ from the plan's launch is
 * KILN_ERR_CACHE naming the signature. On failure *out is left empty;
 * what was compiled before the failure is already stored. The build
 * points into p, which must outlive it. */
struct kiln_cache;
kiln_status kiln_build_plan(const kiln_plan *p, struct kiln_cache *c, const kiln_build_options *o,
                            kiln_build *out);
void kiln_build_free(kiln_build *b);

/* What a device gives the launches of a session. */
typedef struct kiln_device_caps {
    int sm_count;          /* 0: no launch may overlap the one before it */
    int smem_per_sm;       /* shared memory an SM holds, bytes */
    int smem_per_block_reserved; /* the part of it each block reserves */
    int warps_per_sm;      /* resident warps an SM holds */
} kiln_device_caps;

/* Launch l as device d runs it (runtime/launch.c). A persistent launch
 * gets at most the blocks d holds at once, by shared memory and warps. A
 * launch the plan lets
 * overlap (l->overlap) does so where d has an SM count. Then one whose
 * blocks fit in a wave holds p = ceil(blocks / SMs) blocks an SM and no
 * more: where its own shared memory would let more in, it asks for the
 * least that holds p + 1 no more, so that the next kernel starts on an SM
 * as its blocks there finish, and the rest of the SM's memory stays L1.
 * A launch of more than a wave leaves the SMs one by one anyway and keeps
 * its shared memory. */
void kiln_launch_finalise(const kiln_device_caps *d, kiln_launch *l);

#endif
