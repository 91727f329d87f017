// Timing sweep of the gemv_tc backend's kernel template
// (kernels/gemv/tc.cuh) over launch shapes: row tiles a warp, warps a block,
// K slices, atoms a stage, stages, blocks an SM for the registers. It is
// how kiln's gemv_tc classes were chosen (kernels/gemv/tc.c); it times,
// it does not check: the weights are one repeated byte and the scales
// another. kiln-bench gemm checks kiln's chosen kernels and times them
// against cuBLAS.
//
// Built and run by scripts/tc-sweep, one binary per format and shape:
//   SWEEP_FORMAT  a tc.cuh trait (tc_q4_0, tc_nvfp4, ...)
//   SWEEP_N, SWEEP_K, SWEEP_M   the linear and the tokens
//   SWEEP_CONFIGS X(row_tiles, warps, k_split, batch, stages, min_blocks) ...
//   SWEEP_GATE    1: the gate epilogue (a gated FFN's gate and up projections
//                 in one kernel, row tiles alternating; an even row_tiles),
//                 reading two weights, timed over both
// Prints one line a configuration: registers, blocks an SM, µs (the best
// of 7 repetitions of 40 launches, the weights cycled through 4 copies so
// that no launch finds its weights in L2) and % of the copy bandwidth
// measured in the same run, over the packed weight's bytes: once with each
// launch after the one before has finished, once overlapping it as kiln
// launches on sm_90 (programmatic stream serialization; a launch within a
// wave asks for the least shared memory that holds its ceil(blocks / SMs)
// blocks an SM, here found with the occupancy calculator, registers
// included).
#include "kiln/tc.cuh"

#include <cstdio>
#include <cstdlib>

#ifndef SWEEP_CONFIGS
#error "SWEEP_CONFIGS: X(row_tiles, warps, k_split, batch, stages, min_blocks) ..."
#endif

#ifndef SWEEP_GATE
#define SWEEP_GATE 0
#endif

#define SWEEP_STR2(x) #x
#define SWEEP_STR(x) SWEEP_STR2(x)

namespace {

constexpr int copies = 4; // weight copies cycled through: 4 x the largest weight > L2
constexpr bool gate = SWEEP_GATE != 0;
constexpr int weights = gate ? 2 : 1; // weights a launch reads

#define CHECK(call)                                                                           \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "tc-sweep: %s: %s\n", #call, cudaGetErrorString(e_));            \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

// Stored bytes of a 16 x 64 atom: its data, 8 lane groups' records, and
// its share of a 256-value super-record (Q4_K 8 bytes, Q6_K 4 a group).
template <class F>
constexpr double atom_bytes()
{
    const double sup = F::has_min ? 8.0 * 8 / 4 : (F::units == 2 ? 4.0 * 8 / 4 : 0.0);
    return F::atom_bytes + 8.0 * F::record + sup;
}

template <class F, int M, int RT, int W, int KS, int B, int ST, int MINB, int N, int K>
__global__ void __launch_bounds__(W * 32, MINB) sweep_kernel(const kiln_linear_args args)
{
    using S = kiln::tc_shape<M, RT, W, KS, B, ST>;
    kiln::gemv_tc<F, S, kiln::epilogue<false, false, gate, gate>, N, K,
                  kiln::tc_smem<F, S>::bytes>(args);
}

struct buffers {
    unsigned char *w, *s, *x, *y;
    float *one;
    size_t w_stride, s_stride;
};

template <class F, int M, int RT, int W, int KS, int B, int ST, int MINB, int N, int K>
void run(const buffers &b, double copy_bps)
{
    using S = kiln::tc_shape<M, RT, W, KS, B, ST>;
    constexpr int smem = kiln::tc_smem<F, S>::bytes, tiles = (N + 15) / 16 * weights;
    constexpr int groups = (tiles + RT - 1) / RT, blocks = (groups + W / KS - 1) / (W / KS);
    auto fn = sweep_kernel<F, M, RT, W, KS, B, ST, MINB, N, K>;
    printf("RT=%d W=%-2d KS=%-2d B=%d ST=%d MINB=%d ", RT, W, KS, B, ST, MINB);
    cudaFuncAttributes at;
    CHECK(cudaFuncGetAttributes(&at, fn));
    int optin = 0, sms = 0;
    CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int most = optin - (int)at.sharedSizeBytes;
    if (smem > most ||
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, most) !=
            cudaSuccess) {
        cudaGetLastError();
        printf("smem %d refused\n", smem);
        return;
    }
    int occ = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, W * 32, smem));
    // Overlapping: within a wave, the least shared memory that holds
    // ceil(blocks / SMs) blocks an SM and no more.
    int padded = smem;
    if (blocks <= occ * sms) {
        const int p = (blocks + sms - 1) / sms;
        for (int o = occ; o > p && padded + 128 <= most;) {
            padded += 128;
            CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, fn, W * 32, padded));
        }
    }
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t t0, t1;
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    auto launch = [&](int i, bool overlap) {
        kiln_linear_args a{};
        a.y = b.y, a.x = b.x, a.m = M;
        a.w = b.w + (size_t)(i % copies) * b.w_stride;
        a.w_scale = b.s + (size_t)(i % copies) * b.s_stride;
        a.w_global = b.one;
        if (gate) /* the next copy: another weight, not in L2 either */
            a.w2 = b.w + (size_t)((i + 1) % copies) * b.w_stride,
            a.w2_scale = b.s + (size_t)((i + 1) % copies) * b.s_stride, a.w2_global = b.one;
        cudaLaunchAttribute attr{};
        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t c{};
        c.gridDim = dim3(blocks), c.blockDim = dim3(W * 32), c.stream = stream;
        c.dynamicSmemBytes = overlap ? padded : smem;
        c.attrs = overlap ? &attr : nullptr, c.numAttrs = overlap ? 1 : 0;
        CHECK(cudaLaunchKernelEx(&c, fn, a));
    };
    auto time = [&](bool overlap) {
        for (int i = 0; i < 20; i++)
            launch(i, overlap);
        float best = 1e30f;
        for (int r = 0; r < 7; r++) {
            CHECK(cudaEventRecord(t0, stream));
            for (int i = 0; i < 40; i++)
                launch(i, overlap);
            CHECK(cudaEventRecord(t1, stream));
            CHECK(cudaEventSynchronize(t1));
            float ms;
            CHECK(cudaEventElapsedTime(&ms, t0, t1));
            best = ms < best ? ms : best;
        }
        CHECK(cudaGetLastError());
        return best * 1e3 / 40;
    };
    const double bytes = (double)tiles * (K / 64) * atom_bytes<F>();
    const double serial = time(false), overlapped = time(true);
    printf("regs=%3d smem=%6d blocks/SM=%d grid=%5d %8.2f us %5.1f %% | overlapping, smem=%6d "
           "%8.2f us %5.1f %%\n",
           at.numRegs, smem, occ, blocks, serial, bytes / (serial * 1e-6) / copy_bps * 100,
           padded, overlapped, bytes / (overlapped * 1e-6) / copy_bps * 100);
    CHECK(cudaEventDestroy(t0));
    CHECK(cudaEventDestroy(t1));
    CHECK(cudaStreamDestroy(stream));
}

// Device-to-device copy bandwidth (read + write), best of 5.
double copy_bandwidth()
{
    const size_t bytes = (size_t)1 << 30;
    void *a, *c;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&c, bytes));
    cudaEvent_t t0, t1;
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    CHECK(cudaMemcpy(c, a, bytes, cudaMemcpyDeviceToDevice));
    float best = 1e30f;
    for (int r = 0; r < 5; r++) {
        CHECK(cudaEventRecord(t0));
        CHECK(cudaMemcpy(c, a, bytes, cudaMemcpyDeviceToDevice));
        CHECK(cudaEventRecord(t1));
        CHECK(cudaEventSynchronize(t1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, t0, t1));
        best = ms < best ? ms : best;
    }
    CHECK(cudaFree(a));
    CHECK(cudaFree(c));
    return 2.0 * bytes / (best * 1e-3);
}

} // namespace

int main()
{
    using F = kiln::SWEEP_FORMAT;
    constexpr int N = SWEEP_N, K = SWEEP_K, M = SWEEP_M;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        fprintf(stderr, "tc-sweep: no CUDA device\n");
        return 1;
    }
    buffers b{};
    // Data and records per row tile and atom, with room for every format's
    // super-records and FP8 block scales.
    b.w_stride = ((size_t)(N + 15) / 16 * (K / 64) * 2048 + 4096) & ~(size_t)255;
    b.s_stride = ((size_t)(N + 15) / 16 * (K / 64) * 96 + 4096) & ~(size_t)255;
    CHECK(cudaMalloc(&b.w, b.w_stride * copies));
    CHECK(cudaMalloc(&b.s, b.s_stride * copies));
    CHECK(cudaMalloc(&b.x, (size_t)16 * K * 2));
    CHECK(cudaMalloc(&b.y, (size_t)16 * N * 2));
    CHECK(cudaMalloc(&b.one, sizeof(float)));
    const float one = 1.0f;
    CHECK(cudaMemcpy(b.one, &one, sizeof one, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(b.w, 0x11, b.w_stride * copies));
    CHECK(cudaMemset(b.s, 0x3c, b.s_stride * copies));
    CHECK(cudaMemset(b.x, 0x3c, (size_t)16 * K * 2));
    const double bw = copy_bandwidth();
    printf("# %s %dx%d m=%d%s, copy %.3f TB/s\n", SWEEP_STR(SWEEP_FORMAT), N, K, M,
           gate ? " gate+up" : "", bw / 1e12);
#define X(RT, W, KS, B, ST, MINB) run<F, M, RT, W, KS, B, ST, MINB, N, K>(b, bw);
    SWEEP_CONFIGS
#undef X
    return 0;
}
