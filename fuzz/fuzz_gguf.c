/* libFuzzer harness for the GGUF reader: any input must either open, with
 * every metadata value and tensor readable within the file, or fail with a
 * status and a message. Crashes, leaks, hangs and sanitizer reports are
 * the bugs it looks for. */
#include "graph/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Walks a value and everything inside it, the way a consumer would. */
static uint64_t walk(const kiln_gguf_value *v)
{
    uint64_t sum = (uint64_t)v->type;
    if (v->type == KILN_GGUF_STRING) {
        for (size_t i = 0; i < v->str.len; i++)
            sum += (unsigned char)v->str.ptr[i];
    } else if (v->type == KILN_GGUF_ARRAY) {
        for (size_t i = 0; i < v->arr.n; i++) {
            kiln_gguf_value item;
            if (kiln_gguf_array_at(v, i, &item) != KILN_OK)
                abort();
            sum += walk(&item);
        }
    } else {
        sum += v->u;
    }
    return sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz.gguf", MFD_CLOEXEC);
    if (fd < 0 || (size && write(fd, data, size) != (ssize_t)size))
        abort();
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);

    kiln_model *m = NULL;
    kiln_status st = kiln_gguf_open(path, &m);
    if (st != KILN_OK) {
        /* A failure names the file and says what went wrong. */
        if (m || strncmp(kiln_last_error(), path, strlen(path)) != 0)
            abort();
        close(fd);
        return 0;
    }

    volatile uint64_t sink = 0;
    char text[512];
    for (int i = 0; i < kiln_gguf_n_kv(m); i++) {
        const kiln_gguf_value *v;
        const char *key = kiln_gguf_kv_at(m, i, &v);
        if (!key || kiln_gguf_get(m, key) != v)
            abort();
        sink += walk(v);
        kiln_gguf_value_summary(v, 4, text, sizeof text);
    }

    /* Tensors lie inside the file and do not overlap, so together they
     * cannot be larger than it; every byte of a usable one is readable. */
    size_t total = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const kiln_model_tensor *t = &m->tensors[i];
        total += t->bytes;
        if (total > size || !t->name || !t->type_name || (!t->supported && !t->why))
            abort();
        if (!t->supported)
            continue;
        const uint8_t *p = t->qt.data;
        for (size_t j = 0; j < t->bytes; j++)
            sink += p[j];
    }
    (void)sink;
    kiln_model_close(m);
    close(fd);
    return 0;
}
