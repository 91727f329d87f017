/* Swap a layer's weights under a running session. The session captured one
 * CUDA graph per token bucket with the weights' device addresses baked in;
 * kiln_session_set_weight copies the new values into those same buffers, so
 * the graphs keep running without being captured again. A weight of another
 * format or shape would not fit the buffers and is refused.
 *
 * Without a GPU the CPU executor shows the same swap: it reads the weights
 * when created, so it is created again after the caller's memory changes.
 */
#include <kiln.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 256, K = 512, M = 2 };

static void fill(float *w, int n, float scale)
{
    for (int i = 0; i < n; i++)
        w[i] = scale * (float)((i * 7 % 13) - 6) / (6.0f * 22.6f);
}

int main(void)
{
    static float src[N * K];
    static unsigned char data[N * K];
    static float scale[N];
    kiln_qtensor w = { .format = KILN_FMT_FP8_CHANNEL, .n = N, .k = K, .data = data,
                       .scale = scale };
    fill(src, N * K, 1.0f);
    kiln_quantize(src, &w);

    kiln_graph *g;
    kiln_tensor *x, *wt, *y;
    kiln_graph_create(&g);
    kiln_graph_input(g, "x", K, &x);
    kiln_graph_weight(g, "proj.weight", &w, &wt);
    kiln_graph_linear(g, "proj", x, wt, NULL, &y);
    kiln_graph_output(g, y);

    float in[M * K], a[M * N], b[M * N];
    for (int i = 0; i < M * K; i++)
        in[i] = 1.0f;
    const float *ins[] = { in };
    float *out_a[] = { a }, *out_b[] = { b };

    kiln_session *s;
    kiln_cpu *cpu = NULL;
    kiln_status st = kiln_session_create(g, NULL, &s);
    if (st != KILN_OK && st != KILN_ERR_NO_DEVICE) {
        fprintf(stderr, "example_reload: %s\n", kiln_last_error());
        return 1;
    }
    int gpu = st == KILN_OK;
    if (!gpu && kiln_cpu_create(g, NULL, &cpu) != KILN_OK)
        return 1;
    st = gpu ? kiln_session_run(s, M, ins, out_a) : kiln_cpu_run(cpu, M, ins, out_a);

    /* New values, quantized into the same memory the graph points at. */
    fill(src, N * K, -2.0f);
    kiln_quantize(src, &w);
    if (gpu) {
        st = kiln_session_set_weight(s, "proj.weight", &w);
    } else {
        kiln_cpu_destroy(cpu);
        st = kiln_cpu_create(g, NULL, &cpu);
    }
    if (st == KILN_OK)
        st = gpu ? kiln_session_run(s, M, ins, out_b) : kiln_cpu_run(cpu, M, ins, out_b);
    if (st != KILN_OK) {
        fprintf(stderr, "example_reload: %s\n", kiln_last_error());
        return 1;
    }
    printf("%s: y[0] before %.4f, after %.4f\n", gpu ? "GPU" : "CPU", a[0], b[0]);
    int changed = memcmp(a, b, sizeof a) != 0;

    if (gpu) { /* a layout that does not fit the captured buffers */
        kiln_qtensor other = w;
        other.format = KILN_FMT_BF16;
        st = kiln_session_set_weight(s, "proj.weight", &other);
        printf("bf16 into an fp8 slot: %s\n", kiln_last_error());
        changed = changed && st == KILN_ERR_STATE;
    }
    kiln_session_destroy(s);
    kiln_cpu_destroy(cpu);
    kiln_graph_destroy(g);
    return changed ? 0 : 1;
}
