/* kiln-bench: the parts of the GEMM benchmark that need no GPU — options,
 * shape presets, byte and flop accounting, timing arithmetic, weights built
 * from a quantized tile, the CPU reference check, the table and the JSON
 * report. The GPU side (bench/gpu.h) drives them. */
#ifndef KILN_BENCH_H
#define KILN_BENCH_H

#include "core.h"

#include <stdio.h>

enum {
    KILN_BENCH_MAX_SHAPES = 64,
    KILN_BENCH_MAX_MS = 32,
    KILN_BENCH_NAME = 48,
    /* More copies than this would make the kiln graph of one bucket
     * thousands of launches long; a weight that small stays in L2 anyway. */
    KILN_BENCH_MAX_ROTATION = 64,
    /* GEMMs at least in one replay of a timed graph (kiln_bench_chain). */
    KILN_BENCH_MIN_CHAIN = 8,
    /* Rows of the quantized tile that a benchmark weight repeats (see
     * kiln_bench_weight_make): a multiple of 128 so block-scale rows repeat
     * with the data, and not a power of two so a kernel that confuses row n
     * with row n + 2^j still fails the check. */
    KILN_BENCH_TILE_ROWS = 384,
};

/* ------------------------------------------------------------ options */

typedef struct kiln_bench_shape {
    char name[KILN_BENCH_NAME]; /* "llama8b.qkv", or "NxK" for an explicit shape */
    int64_t n, k;
} kiln_bench_shape;

/* What kiln-bench runs. */
typedef enum kiln_bench_command {
    KILN_BENCH_GEMM = 0, /* one linear per shape */
    KILN_BENCH_FFN,      /* a stack of FFN layers */
} kiln_bench_command;

/* The FFN stack `kiln-bench ffn` builds: layers of
 * x + down(silu(gate(rms(x))) · up(rms(x))), d the model's width, f the FFN's. */
typedef struct kiln_bench_stack_shape {
    char name[KILN_BENCH_NAME]; /* "llama8b" */
    int64_t d, f;
    int layers;
} kiln_bench_stack_shape;

typedef struct kiln_bench_options {
    kiln_bench_command command;
    kiln_bench_stack_shape stack; /* ffn: the stack; --layers overrides its count */
    int check_layers;     /* ffn: layers of the stack the check runs */
    int layers_given;     /* ffn: --layers was given (a later --shape keeps it) */
    kiln_bench_shape shapes[KILN_BENCH_MAX_SHAPES];
    int n_shapes;
    int64_t ms[KILN_BENCH_MAX_MS]; /* ascending, distinct */
    int n_ms;
    kiln_format formats[KILN_FMT_COUNT];
    int n_formats;
    const char *json;     /* write every row here */
    const char *plot;     /* draw this PNG from the JSON with bench/plot.py */
    const char *cache;    /* kiln's writable kernel cache; NULL: the default */
    const char *backend;  /* kiln --backend; NULL: normal selection */
    int iters;            /* most GEMMs timed per repetition */
    int reps;             /* repetitions; the median is reported */
    int warmup;           /* GEMMs run before timing */
    double rep_ms;        /* a repetition stops adding GEMMs past this */
    double rotate_mb;     /* weight bytes rotated through; 0: three times the L2 */
    double copy_mb;       /* size of the device-to-device copy that sets the ceiling */
    int check_rows;       /* output rows compared with the CPU reference */
    int device;
    int eager;            /* launch one by one instead of replaying CUDA graphs */
    int no_peers;
    double peak_bf16;     /* TFLOP/s ceilings for the plot; 0: the measured maxima */
    double peak_fp8;
    uint64_t seed;
    int help;             /* --help was asked for: print the usage, run nothing */
} kiln_bench_options;

/* Parse `kiln-bench gemm|ffn [options]` (argv[0] is the program, argv[1]
 * the command). Defaults fill what is not given, the command's own where
 * they differ; the strings in *out point into argv. KILN_ERR_INVALID_ARG
 * with a message naming the option for anything it cannot take, an option
 * of the other command included; --help alone is KILN_OK with out->help
 * set (the command's usage when one was named). */
kiln_status kiln_bench_args_parse(int argc, char *const *argv, kiln_bench_options *out);

/* The usage text of a command, every option with its default. */
void kiln_bench_usage(FILE *f);
void kiln_bench_ffn_usage(FILE *f);

/* "llama8b" or "llama70b": Llama 3's width, FFN width and layer count. */
kiln_status kiln_bench_stack_parse(const char *name, kiln_bench_stack_shape *out);

/* "llama8b,llama70b,28672x4096": presets expand to their five linears, an
 * explicit NxK is one shape named "NxK". At most cap shapes. */
kiln_status kiln_bench_shapes_parse(const char *list, kiln_bench_shape *out, int cap, int *n);

/* "1,16,256": positive token counts, returned ascending and distinct. */
kiln_status kiln_bench_ms_parse(const char *list, int64_t *out, int cap, int *n);

/* "bf16,fp8,q4_k" or "all": kiln format names, distinct, in the order given. */
kiln_status kiln_bench_formats_parse(const char *list, kiln_format *out, int *n);

/* --------------------------------------------------------- accounting */

/* The yardsticks run beside kiln. Values index the tables below. */
typedef enum kiln_bench_peer {
    KILN_BENCH_PEER_BF16 = 0,  /* cuBLAS, BF16 in and out, FP32 compute */
    KILN_BENCH_PEER_FP8,       /* cuBLASLt, E4M3 x E4M3 -> BF16, per-tensor scales */
    KILN_BENCH_PEER_FP8_BLOCK, /* cuBLASLt, 128x128 weight and 1x128 activation scales */
    KILN_BENCH_PEER_COUNT
} kiln_bench_peer;

/* The row's kind in the JSON ("bf16_cublas", "fp8_tensor", "fp8_block"),
 * and a label for the table. */
const char *kiln_bench_peer_kind(kiln_bench_peer p);
const char *kiln_bench_peer_label(kiln_bench_peer p);

/* Bytes one GEMM moves, each array counted once: the weight with every scale,
 * the activations as the kernel reads them, the BF16 output. */
typedef struct kiln_bench_bytes {
    double weight, act, out;
} kiln_bench_bytes;

double kiln_bench_bytes_total(const kiln_bench_bytes *b);

/* kiln reads BF16 activations (any quantization of them happens inside its
 * graph). KILN_ERR_SHAPE when k breaks the format's block rule. */
kiln_status kiln_bench_kiln_bytes(kiln_format f, int64_t n, int64_t k, int64_t m,
                                  kiln_bench_bytes *out);
void kiln_bench_peer_bytes(kiln_bench_peer p, int64_t n, int64_t k, int64_t m,
                           kiln_bench_bytes *out);

/* 2·M·N·K. */
double kiln_bench_flops(int64_t n, int64_t k, int64_t m);

/* One step of the stack at m tokens: every layer's three weights (with
 * their scales) read once, the BF16 activations in and out once (what the
 * step must move at least), and 6·m·d·f FLOPs a layer. KILN_ERR_SHAPE
 * when d or f breaks the format's block rule. */
kiln_status kiln_bench_stack_bytes(kiln_format f, const kiln_bench_stack_shape *s, int64_t m,
                                   double *bytes);
double kiln_bench_stack_flops(const kiln_bench_stack_shape *s, int64_t m);

/* How many copies of a weight of weight_bytes make consecutive GEMMs read
 * from DRAM: enough to cover rotate_bytes, at least 1, at most
 * KILN_BENCH_MAX_ROTATION. */
int kiln_bench_rotation(double weight_bytes, double rotate_bytes);

/* GEMMs in one replay of a timed graph: the rotation's copies, cycled
 * through as many times as it takes to reach KILN_BENCH_MIN_CHAIN, so that
 * most GEMMs follow another one in the graph as the linears of a decode
 * step do (and a kernel that starts while its predecessor drains gets to). */
int kiln_bench_chain(int rotation);

/* Timed launches per repetition: each launch runs per_launch GEMMs and took
 * about launch_us when tried; as many as fit in rep_ms, at least one, and no
 * more than it takes to reach iters GEMMs. */
int kiln_bench_launches(double launch_us, int per_launch, int iters, double rep_ms);

/* Times something launched `launches` times back to back: *us receives the
 * mean microseconds of one launch. */
typedef kiln_status (*kiln_bench_time_fn)(void *ctx, int launches, double *us);

/* The measurement every row gets: one launch to warm up and to estimate,
 * o->warmup GEMMs more (bounded by o->rep_ms), then o->reps repetitions of
 * kiln_bench_launches launches each. *us_per_gemm is the median repetition's
 * time per launch divided by per_launch, the GEMMs one launch runs. */
kiln_status kiln_bench_measure(kiln_bench_time_fn fn, void *ctx, int per_launch,
                               const kiln_bench_options *o, double *us_per_gemm);

/* The median of v[n], 1 <= n <= 1000 (the most --reps allows); v is left
 * as it was. */
double kiln_bench_median(const double *v, int n);

/* TB/s and TFLOP/s of a GEMM of bytes / flops that took us microseconds. */
double kiln_bench_tbps(double bytes, double us);
double kiln_bench_tflops(double flops, double us);

/* ------------------------------------------------------------ weights */

/* A seeded splitmix64 stream. */
typedef struct kiln_bench_rng {
    uint64_t s;
} kiln_bench_rng;

uint64_t kiln_bench_rng_next(kiln_bench_rng *r);
/* Standard normal. */
float kiln_bench_rng_normal(kiln_bench_rng *r);

/* A benchmark weight [n, k] in format f. Quantizing a large tensor with the
 * CPU reference takes minutes for the K-quants, so a tile of
 * min(n, KILN_BENCH_TILE_ROWS) rows of N(0, 1/k) values is quantized with
 * kiln_quantize and repeated down the rows: row r (and its scales) is tile
 * row r mod tile. The kernels read a full-sized weight; the CPU reference
 * needs only the tile, dequantized. */
typedef struct kiln_bench_weight {
    kiln_qtensor q;  /* [n, k], data and scale owned */
    float *ref;      /* [tile, k]: kiln_dequantize of the tile */
    int64_t tile;
    size_t data_bytes, scale_bytes;
} kiln_bench_weight;

kiln_status kiln_bench_weight_make(kiln_format f, int64_t n, int64_t k, kiln_bench_rng *r,
                                   kiln_bench_weight *out);
void kiln_bench_weight_free(kiln_bench_weight *w);

/* Repeat a quantized tile down the rows of full (same format and k; data and
 * scale allocated by the caller). The tile's row count must be full->n or a
 * multiple of the format's scale rows. */
kiln_status kiln_bench_tile_repeat(const kiln_qtensor *tile, kiln_qtensor *full);

/* 1x128 FP8 activations as cuBLASLt and DeepSeek-V3 take them: per row m and
 * 128-column group g, s = amax/448 (1 where the group is all zeros) and
 * q = e4m3(x / s). x is [m, k], q [m, k], scale [m, ceil(k/128)] row-major. */
void kiln_bench_quant_1x128(const float *x, int64_t m, int64_t k, uint8_t *q, float *scale);

/* The stack's weights in one format: a gate, an up and a down weight
 * (kiln_bench_weight_make) and a norm every layer shares, each layer's
 * tensors in the graph reading those host bytes (a session still holds a
 * device copy per layer: kiln_session loads shared host bytes once and
 * copies them on the device). */
typedef struct kiln_bench_stack {
    kiln_bench_stack_shape shape;
    kiln_bench_weight gate, up, down; /* [f, d], [f, d], [d, f] */
    float *norm;                      /* [d]: 1 + N(0, 1/100) */
    float eps;
} kiln_bench_stack;

kiln_status kiln_bench_stack_make(kiln_format f, const kiln_bench_stack_shape *s,
                                  kiln_bench_rng *r, kiln_bench_stack *out);
void kiln_bench_stack_free(kiln_bench_stack *s);

/* The graph of the stack's first `layers` layers: input "x" [d], output
 * the residual stream after the last layer. */
kiln_status kiln_bench_stack_graph(const kiln_bench_stack *s, int layers, kiln_graph **out);

/* Rows rows[0..n) of x [*, d] gathered into out [n, d]: every op of the
 * stack works row by row, so the CPU executor run on the gathered rows
 * gives the reference of those rows of a run of any m. */
void kiln_bench_gather_rows(const float *x, int64_t d, const int64_t *rows, int n, float *out);

/* The CUDA source of the cuBLAS chain's own kernels, compiled with NVRTC
 * by kiln-bench ffn: chain_rms_norm (grid: a block of 256 threads a row)
 * and chain_silu_mul (a thread an output). */
const char *kiln_bench_chain_source(void);

/* The largest |got - want| over the largest |want|, over n values. */
double kiln_bench_max_rel(const float *got, const float *want, size_t n);

/* ------------------------------------------------------------- checks */

/* Which output rows of an [m, n] result to compare: every row when m <=
 * count, else the first, the last and count - 2 others drawn from r;
 * ascending. rows holds at least min(m, count) entries; returns how many. */
int kiln_bench_sample_rows(int64_t m, int count, kiln_bench_rng *r, int64_t *rows);

/* One comparison of sampled output rows against the float64 reference
 * y[m, j] = sum_k x[m, k] · w[j mod tile, k]. An output passes when
 * |y - ref| <= tol · sum_k |x[m, k]| · |w[j mod tile, k]|: the error budget of
 * a dot product whose inputs were rounded at relative precision tol. */
typedef struct kiln_bench_check_in {
    const float *const *x;  /* [n_rows] rows of k activations, as the kernel saw them */
    const float *const *y;  /* [n_rows] rows of n outputs */
    const int64_t *rows;    /* [n_rows] row indices, for the message */
    int n_rows;
    const float *w;         /* [tile, k], dequantized */
    int64_t tile, n, k;
    double tol;
} kiln_bench_check_in;

typedef struct kiln_bench_check {
    int pass;
    double worst;           /* largest |y - ref| / sum |x||w| */
    int64_t row, col;       /* where it was */
    double got, want;
} kiln_bench_check;

/* Runs on every core. KILN_ERR_INVALID_ARG for missing inputs, KILN_ERR_NOMEM. */
kiln_status kiln_bench_check_run(const kiln_bench_check_in *in, kiln_bench_check *out);

/* ------------------------------------------------------------- report */

typedef enum kiln_bench_status {
    KILN_BENCH_OK = 0,
    KILN_BENCH_FAIL,         /* the output did not match the reference */
    KILN_BENCH_UNSUPPORTED,  /* the library offers no algorithm for it */
    KILN_BENCH_ERROR,        /* something failed on the way; see error */
    KILN_BENCH_STATUS_COUNT
} kiln_bench_status;

const char *kiln_bench_status_name(kiln_bench_status s);

typedef struct kiln_bench_row {
    char shape[KILN_BENCH_NAME];
    int64_t n, k, m;
    char kind[16];           /* "kiln" or kiln_bench_peer_kind */
    char format[16];         /* kiln's weight format; "" for a peer */
    char backend[32];        /* kiln's backend and activation scheme for this M */
    char act[16];
    kiln_bench_status status;
    char error[384];
    double us;               /* median microseconds of one GEMM; 0 when not timed */
    double bytes, flops;
    int rotation;            /* weight copies the timed GEMMs cycled through */
    int chain;               /* GEMMs in one replay of the timed graph */
    double check_err;        /* worst error / budget unit; < 0 when not checked */
    double speedup_bf16;     /* peer µs / kiln µs; 0 when there is no peer time */
    double speedup_fp8;
    double speedup_kiln_bf16; /* kiln-bench ffn: kiln's BF16 stack µs / this row's; 0: none */
} kiln_bench_row;

typedef struct kiln_bench_report {
    char device[128];
    char target[16];
    double copy_tbps;        /* measured device-to-device copy, read + write */
    double l2_bytes, rotate_bytes;
    int iters, reps;
    double peak_bf16, peak_fp8;
    int ffn;                 /* kiln-bench ffn: the last ratio is xkbf16, not xfp8 */
    kiln_bench_row *rows;
    int n_rows, cap_rows;
} kiln_bench_report;

kiln_status kiln_bench_report_add(kiln_bench_report *r, const kiln_bench_row *row);
void kiln_bench_report_free(kiln_bench_report *r);

/* The table on stdout: a header, then one line per row. */
void kiln_bench_table_header(FILE *f, const kiln_bench_report *r);
void kiln_bench_table_row(FILE *f, const kiln_bench_report *r, const kiln_bench_row *row);

/* The whole report as JSON: the run's facts and every row with its derived
 * TB/s, TFLOP/s and fraction of the copy bandwidth. KILN_ERR_IO when the
 * stream fails. */
kiln_status kiln_bench_json_write(const kiln_bench_report *r, FILE *f);

/* kiln_bench_json_write into the file at path, saying so on stderr; 1 (and
 * why, on stderr) when it could not be written, else 0. */
int kiln_bench_json_save(const kiln_bench_report *r, const char *path);

/* A row that was not timed: its status and why. */
void kiln_bench_row_error(kiln_bench_row *row, kiln_bench_status status, const char *message);

/* A finished row: printed on stdout and added to the report. 1 when the row
 * failed or could not be added (the reason on stderr), else 0. */
int kiln_bench_row_emit(kiln_bench_report *r, const kiln_bench_row *row);

#endif
