/* Build a small MLP with the C API, compile it ahead of time, and run it:
 * on the GPU when there is one (the session plans for the live device),
 * else on the CPU executor after compiling for a named target.
 *
 *   example_mlp [TARGET]      TARGET for the no-GPU compile, default sm_90a
 */
#include <kiln.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { D = 512, H = 1024, M = 4 };

static int check(kiln_status st, const char *what)
{
    if (st != KILN_OK)
        fprintf(stderr, "example_mlp: %s: %s\n", what, kiln_last_error());
    return st != KILN_OK;
}

/* A weight quantized from small random values. Its bytes must outlive the
 * graph and everything made from it: kiln keeps pointers, not copies. */
static kiln_qtensor make_weight(kiln_format f, int64_t n, int64_t k)
{
    kiln_qtensor q = { .format = f, .n = n, .k = k };
    size_t data, scale;
    kiln_format_data_bytes(f, n, k, &data);
    kiln_format_scale_bytes(f, n, k, &scale);
    q.data = malloc(data);
    q.scale = scale ? malloc(scale) : NULL;
    float *src = malloc(sizeof(float) * (size_t)(n * k));
    for (int64_t i = 0; i < n * k; i++)
        src[i] = (float)((i * 7919 % 1000) - 500) / (500.0f * sqrtf((float)k));
    kiln_quantize(src, &q);
    free(src);
    return q;
}

int main(int argc, char **argv)
{
    /* y = down(gelu(up(x))) + x, up in Q4_K, down in NVFP4 */
    kiln_qtensor up = make_weight(KILN_FMT_Q4_K, H, D), down = make_weight(KILN_FMT_NVFP4, D, H);
    kiln_graph *g;
    kiln_tensor *x, *wu, *wd, *h, *a, *d, *y;
    if (check(kiln_graph_create(&g), "graph") ||
        check(kiln_graph_input(g, "x", D, &x), "input") ||
        check(kiln_graph_weight(g, "up.weight", &up, &wu), "up.weight") ||
        check(kiln_graph_weight(g, "down.weight", &down, &wd), "down.weight") ||
        check(kiln_graph_linear(g, "up", x, wu, NULL, &h), "up") ||
        check(kiln_graph_gelu(g, "act", h, &a), "act") ||
        check(kiln_graph_linear(g, "down", a, wd, NULL, &d), "down") ||
        check(kiln_graph_add(g, "y", x, d, &y), "y") || check(kiln_graph_output(g, y), "output"))
        return 1;

    float in[M * D], out[M * D];
    for (int i = 0; i < M * D; i++)
        in[i] = (float)((i * 31 % 200) - 100) / 100.0f;
    const float *ins[] = { in };
    float *outs[] = { out };

    kiln_session *s;
    kiln_status st = kiln_session_create(g, NULL, &s);
    if (st == KILN_OK) {
        /* The first create compiled what the cache lacked; later ones load it. */
        kiln_session_stats ss;
        kiln_session_get_stats(s, &ss);
        printf("GPU %s (%s): %d kernels, %d compiled now\n", ss.device, ss.target, ss.kernels,
               ss.compiled);
        st = kiln_session_run(s, M, ins, outs);
        kiln_session_destroy(s);
    } else if (st == KILN_ERR_NO_DEVICE) {
        /* No GPU: compile for a named target anyway (the build-machine case),
         * then compute on the CPU. */
        kiln_target t;
        kiln_compile_result r;
        if (check(kiln_target_from_name(argc > 1 ? argv[1] : "sm_90a", &t), "target") ||
            check(kiln_compile(g, &t, &(kiln_compile_options){ .quiet = 1 }, &r), "compile"))
            return 1;
        printf("no GPU; compiled for %s: %d kernels, %d compiled now\n", t.name, r.signatures,
               r.compiled);
        kiln_cpu *cpu;
        if (check(kiln_cpu_create(g, NULL, &cpu), "cpu"))
            return 1;
        st = kiln_cpu_run(cpu, M, ins, outs);
        kiln_cpu_destroy(cpu);
    }
    if (check(st, "run"))
        return 1;
    double sum = 0;
    for (int i = 0; i < M * D; i++)
        sum += out[i];
    printf("y[0][0..3] = %.4f %.4f %.4f %.4f, sum %.6f\n", out[0], out[1], out[2], out[3], sum);
    kiln_graph_destroy(g);
    free(up.data), free(up.scale), free(down.data), free(down.scale);
    return isfinite(sum) ? 0 : 1;
}
