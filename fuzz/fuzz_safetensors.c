/* libFuzzer harness for the safetensors reader. The input is a safetensors
 * file, optionally followed by sections that each start with an 8-byte
 * marker: "\0KILNCFG" a config.json, "\0KILNHFQ" an hf_quant_config.json,
 * "\0KILNIDX" a model.safetensors.index.json (the file is then the shard
 * s.safetensors, which the index may name), "\0KILNSH2" a second shard
 * t.safetensors. So the quantization settings and sharded sets are fuzzed
 * along with the header. Any input must either open, with every usable
 * tensor consistent with its format and readable (zero-byte ones included),
 * or fail with a status and a message naming the file. Crashes, leaks,
 * hangs and sanitizer reports are the bugs it looks for.
 *
 * fuzz/safetensors.dict (dtype names, the quantization suffixes, shapes
 * with zero dims) is loaded unless the command line names a dictionary. */
#include "graph/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { SECTION_CFG, SECTION_HFQ, SECTION_IDX, SECTION_SHARD2, SECTION_COUNT };
static const char markers[SECTION_COUNT][8] = {
    [SECTION_CFG] = { 0, 'K', 'I', 'L', 'N', 'C', 'F', 'G' },
    [SECTION_HFQ] = { 0, 'K', 'I', 'L', 'N', 'H', 'F', 'Q' },
    [SECTION_IDX] = { 0, 'K', 'I', 'L', 'N', 'I', 'D', 'X' },
    [SECTION_SHARD2] = { 0, 'K', 'I', 'L', 'N', 'S', 'H', '2' },
};
static const char *const section_files[SECTION_COUNT] = {
    [SECTION_CFG] = "config.json",
    [SECTION_HFQ] = "hf_quant_config.json",
    [SECTION_IDX] = "model.safetensors.index.json",
    [SECTION_SHARD2] = "t.safetensors",
};

static char dir[64];

static void path_in_dir(char *buf, size_t len, const char *name) { snprintf(buf, len, "%s/%s", dir, name); }

static void remove_file(const char *name)
{
    char p[128];
    path_in_dir(p, sizeof p, name);
    unlink(p);
}

static void remove_dir(void)
{
    for (int i = 0; i < SECTION_COUNT; i++)
        remove_file(section_files[i]);
    remove_file("model.safetensors");
    remove_file("s.safetensors");
    rmdir(dir);
}

static void write_file(const char *name, const uint8_t *p, size_t n)
{
    char path[128];
    path_in_dir(path, sizeof path, name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f))
        abort();
}

/* The first marker at or after data[from], or size when there is none. */
static size_t next_marker(const uint8_t *data, size_t size, size_t from, int *which)
{
    size_t best = size;
    for (int i = 0; i < SECTION_COUNT && size - from >= sizeof markers[i]; i++) {
        const uint8_t *hit = memmem(data + from, size - from, markers[i], sizeof markers[i]);
        if (hit && (size_t)(hit - data) < best) {
            best = (size_t)(hit - data);
            *which = i;
        }
    }
    return best;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Adds -dict=fuzz/safetensors.dict unless a dictionary is given; libFuzzer
 * reads its flags after this returns. */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    for (int i = 1; i < *argc; i++)
        if (!strncmp((*argv)[i], "-dict=", 6))
            return 0;
    static char flag[] = "-dict=" KILN_FUZZ_DICT;
    char **v = malloc(((size_t)*argc + 2) * sizeof *v);
    if (!v)
        abort();
    memcpy(v, *argv, (size_t)*argc * sizeof *v);
    v[(*argc)++] = flag;
    v[*argc] = NULL;
    *argv = v;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/kiln-fuzz-st-XXXXXX");
        if (!mkdtemp(dir))
            abort();
        atexit(remove_dir);
    }
    int which = -1, present[SECTION_COUNT] = { 0 };
    size_t end = next_marker(data, size, 0, &which);
    size_t st_size = end;
    while (end < size) {
        int section = which;
        size_t from = end + sizeof markers[0];
        end = next_marker(data, size, from, &which);
        if (!present[section])
            write_file(section_files[section], data + from, end - from);
        present[section] = 1;
    }
    for (int i = 0; i < SECTION_COUNT; i++)
        if (!present[i])
            remove_file(section_files[i]);
    remove_file(present[SECTION_IDX] ? "model.safetensors" : "s.safetensors");
    write_file(present[SECTION_IDX] ? "s.safetensors" : "model.safetensors", data, st_size);

    kiln_model *m = NULL;
    kiln_status st = kiln_safetensors_open(dir, &m);
    if (st != KILN_OK) {
        /* A failure says where: it names a file in the directory. */
        if (m || strncmp(kiln_last_error(), dir, strlen(dir)) != 0)
            abort();
        return 0;
    }

    /* Usable tensors do not overlap and lie in the files (a joined weight
     * and the entries it was made from share bytes, but only the joined one
     * is usable), so together they are no larger than the input. Each
     * agrees with its format's size, every byte of it is read, and a small
     * one dequantizes. A usable tensor of no bytes is an empty plain one:
     * its shape holds no elements, and dequantizing it is refused. */
    volatile uint64_t sink = 0;
    size_t total = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const kiln_model_tensor *t = &m->tensors[i];
        if (!t->name || !t->type_name || (!t->supported && !t->why) || t->n_dims < 0 || t->n_dims > 4)
            abort();
        if (!t->supported)
            continue;
        total += t->bytes;
        if (total > size)
            abort();
        const kiln_format_info *fi = kiln_format_get(t->qt.format);
        if (!fi)
            abort();
        float out[4096];
        if (t->bytes == 0) {
            if (t->qt.n > 0 && t->qt.k > 0)
                abort();
            if (kiln_dequantize(&t->qt, out) == KILN_OK)
                abort();
            continue;
        }
        size_t data_bytes, scale_bytes = 0;
        if (kiln_format_data_bytes(t->qt.format, t->qt.n, t->qt.k, &data_bytes) != KILN_OK ||
            data_bytes != t->bytes)
            abort();
        if (fi->scale_type != KILN_SCALE_NONE &&
            (!t->qt.scale ||
             kiln_qtensor_scale_bytes(&t->qt, &scale_bytes) != KILN_OK))
            abort();
        const uint8_t *p = t->qt.data, *s = t->qt.scale;
        for (size_t j = 0; j < data_bytes; j++)
            sink += p[j];
        for (size_t j = 0; j < scale_bytes; j++)
            sink += s[j];
        if (t->qt.n * t->qt.k <= 4096) {
            if (kiln_dequantize(&t->qt, out) != KILN_OK)
                abort();
            uint32_t bits;
            memcpy(&bits, &out[0], sizeof bits);
            sink += bits;
        }
    }
    (void)sink;
    kiln_model_close(m);
    return 0;
}
