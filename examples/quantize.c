/* Quantize a random matrix into every kiln format and print how far the
 * dequantized values land from the originals: the smallest useful program
 * against the installed library.
 *
 *   cc quantize.c $(pkg-config --cflags --libs --static kiln) -o quantize
 */
#include <kiln.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    enum { N = 256, K = 1024 };
    float *w = malloc(sizeof(float) * N * K), *back = malloc(sizeof(float) * N * K);
    if (!w || !back)
        return 1;
    unsigned s = 1;
    for (int i = 0; i < N * K; i++) { /* a cheap spread of values around zero */
        s = s * 1103515245u + 12345u;
        w[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 0.1f;
    }
    printf("%-12s %8s %12s\n", "format", "bits/w", "rms error");
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        kiln_qtensor q = { .format = (kiln_format)f, .n = N, .k = K };
        size_t data, scale;
        if (kiln_format_data_bytes(q.format, N, K, &data) ||
            kiln_format_scale_bytes(q.format, N, K, &scale)) {
            fprintf(stderr, "%s\n", kiln_last_error());
            return 1;
        }
        q.data = malloc(data);
        q.scale = scale ? malloc(scale) : NULL;
        /* Every call says what went wrong through kiln_last_error(). */
        if (kiln_quantize(w, &q) != KILN_OK || kiln_dequantize(&q, back) != KILN_OK) {
            fprintf(stderr, "%s\n", kiln_last_error());
            return 1;
        }
        double err = 0;
        for (int i = 0; i < N * K; i++)
            err += (double)(back[i] - w[i]) * (back[i] - w[i]);
        printf("%-12s %8.3f %12.3e\n", kiln_format_get(q.format)->name,
               kiln_format_get(q.format)->bits_per_weight, sqrt(err / (N * K)));
        free(q.data);
        free(q.scale);
    }
    free(w);
    free(back);
    return 0;
}
