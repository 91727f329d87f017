/* kiln in an engine's own CUDA world: the engine's device buffers, its
 * stream, its CUDA graph. A gated FFN with a residual runs on activations
 * that stay on the GPU (BF16, the input a strided slice of a wider buffer),
 * queued on the engine's stream with no host synchronisation, first
 * directly, then captured into the engine's CUDA graph and replayed; each
 * result equals the host-array path's, bit for bit.
 *
 *   example_device_io        exits 77 (skipped) on a machine without a GPU
 */
#include <kiln.h>

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { D = 512, F = 1536, M = 7, LD = D + 64, EXIT_SKIP = 77 };

static int kiln_ok(kiln_status st, const char *what)
{
    if (st != KILN_OK)
        fprintf(stderr, "example_device_io: %s: %s\n", what, kiln_last_error());
    return st == KILN_OK;
}

static int cuda_ok(cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        fprintf(stderr, "example_device_io: %s: %s\n", what, cudaGetErrorString(e));
    return e == cudaSuccess;
}

/* A BF16 weight of small random values; its bytes outlive the graph. */
static kiln_qtensor bf16_weight(int64_t n, int64_t k, unsigned seed)
{
    kiln_qtensor q = { .format = KILN_FMT_BF16, .n = n, .k = k };
    size_t bytes;
    kiln_format_data_bytes(q.format, n, k, &bytes);
    q.data = malloc(bytes);
    float *src = malloc(sizeof(float) * (size_t)(n * k));
    for (int64_t i = 0; i < n * k; i++) {
        seed = seed * 1664525u + 1013904223u;
        src[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 2.0f / sqrtf((float)k);
    }
    kiln_quantize(src, &q);
    free(src);
    return q;
}

int main(void)
{
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("example_device_io: no GPU here: the device path needs one (skipped)\n");
        return EXIT_SKIP;
    }
    /* out = x + down(silu(gate(h)) * up(h)), h = rms_norm(x) */
    kiln_qtensor qg = bf16_weight(F, D, 1), qu = bf16_weight(F, D, 2), qd = bf16_weight(D, F, 3);
    static float norm[D];
    for (int i = 0; i < D; i++)
        norm[i] = 1.0f + 0.01f * (float)(i % 7);
    kiln_graph *g;
    kiln_tensor *x, *nw, *h, *wg, *wu, *wd, *gate, *up, *act, *prod, *down, *out;
    if (!kiln_ok(kiln_graph_create(&g), "graph") ||
        !kiln_ok(kiln_graph_input(g, "x", D, &x), "x") ||
        !kiln_ok(kiln_graph_param(g, "norm", D, norm, &nw), "norm") ||
        !kiln_ok(kiln_graph_rms_norm(g, "h", x, nw, 1e-6f, &h), "h") ||
        !kiln_ok(kiln_graph_weight(g, "gate.weight", &qg, &wg), "gate.weight") ||
        !kiln_ok(kiln_graph_weight(g, "up.weight", &qu, &wu), "up.weight") ||
        !kiln_ok(kiln_graph_weight(g, "down.weight", &qd, &wd), "down.weight") ||
        !kiln_ok(kiln_graph_linear(g, "gate", h, wg, NULL, &gate), "gate") ||
        !kiln_ok(kiln_graph_linear(g, "up", h, wu, NULL, &up), "up") ||
        !kiln_ok(kiln_graph_silu(g, "act", gate, &act), "act") ||
        !kiln_ok(kiln_graph_mul(g, "prod", up, act, &prod), "prod") ||
        !kiln_ok(kiln_graph_linear(g, "down", prod, wd, NULL, &down), "down") ||
        !kiln_ok(kiln_graph_add(g, "out", x, down, &out), "out") ||
        !kiln_ok(kiln_graph_output(g, out), "output"))
        return 1;
    kiln_session *s;
    if (!kiln_ok(kiln_session_create(g, NULL, &s), "session"))
        return 1;

    /* The engine's side: a stream, an input slice M x D of an M x LD
     * buffer, an output M x D. */
    cudaStream_t stream;
    uint16_t *dx, *dy;
    static uint16_t hx[M * D], hy[M * D];
    static float fx[M * D], want[M * D];
    if (!cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream") ||
        !cuda_ok(cudaMalloc((void **)&dx, sizeof(uint16_t) * M * LD), "x buffer") ||
        !cuda_ok(cudaMalloc((void **)&dy, sizeof(uint16_t) * M * D), "y buffer"))
        return 1;
    kiln_device_matrix in = { (uint64_t)(uintptr_t)dx, LD }, res = { (uint64_t)(uintptr_t)dy, 0 };
    const float *hin[] = { fx };
    float *hout[] = { want };
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    int ok = 1;
    for (int round = 0; round < 3 && ok; round++) {
        for (int i = 0; i < M * D; i++) {
            hx[i] = kiln_f32_to_bf16(sinf(0.37f * (float)(i + 1000 * round)));
            fx[i] = kiln_bf16_to_f32(hx[i]);
        }
        ok = cuda_ok(cudaMemcpy2D(dx, sizeof(uint16_t) * LD, hx, sizeof(uint16_t) * D,
                                  sizeof(uint16_t) * D, M, cudaMemcpyHostToDevice), "upload");
        if (ok && round == 0) {
            /* Straight onto the engine's stream. */
            ok = kiln_ok(kiln_session_run_device(s, M, &in, &res, stream), "run on the stream");
        } else if (ok && round == 1) {
            /* Captured into the engine's graph, then replayed in later rounds. */
            ok = cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "capture") &&
                 kiln_ok(kiln_session_run_device(s, M, &in, &res, stream), "run in a capture") &&
                 cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture") &&
                 cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
        }
        if (ok && round >= 1)
            ok = cuda_ok(cudaGraphLaunch(exec, stream), "graph launch");
        ok = ok && cuda_ok(cudaStreamSynchronize(stream), "synchronize") &&
             cuda_ok(cudaMemcpy(hy, dy, sizeof hy, cudaMemcpyDeviceToHost), "download") &&
             kiln_ok(kiln_session_run(s, M, hin, hout), "host path");
        int same = 1;
        for (int i = 0; ok && i < M * D; i++)
            same &= kiln_bf16_to_f32(hy[i]) == want[i];
        printf("%s: out[0][0..2] = %.4f %.4f %.4f, %s the host path\n",
               round == 0 ? "on the engine's stream" : "in the engine's CUDA graph",
               kiln_bf16_to_f32(hy[0]), kiln_bf16_to_f32(hy[1]), kiln_bf16_to_f32(hy[2]),
               same ? "equal to" : "DIFFERENT from");
        ok = ok && same;
    }
    if (exec)
        cudaGraphExecDestroy(exec);
    if (graph)
        cudaGraphDestroy(graph);
    cudaFree(dx);
    cudaFree(dy);
    cudaStreamDestroy(stream);
    kiln_session_destroy(s);
    kiln_graph_destroy(g);
    free(qg.data), free(qu.data), free(qd.data);
    return ok ? 0 : 1;
}
