/* The weight load of a session (runtime/load.c), with no GPU: the stand-in
 * driver (tests/harness/fake_libcuda.c, KT_FAKE_CUDA=device) keeps device
 * memory in this process, so every byte a session wrote can be read back
 * and compared with the weight as stored and as the CPU packer writes it;
 * kernels come from the stand-in NVRTC. A two-shard safetensors model, and
 * the same weights in a GGUF file, are loaded with rings smaller than one
 * weight and with one and several readers; pinned memory refused, a copy
 * failing halfway, a shard that shrank or went away and every allocation
 * failing in turn are each an error or a fallback that says so, with
 * nothing left allocated. */
#include "fault.h"
#include "graph/graph_impl.h"
#include "kernels/gemv/pack.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef KT_FAKE_LIBCUDA
#error "tests/CMakeLists.txt defines KT_FAKE_LIBCUDA"
#endif

enum { D = 128, FFN = 256, VOCAB = 64 };

static const struct {
    const char *name, *gguf;
    int64_t n, k;
    int shard;
} weights[] = {
    { "model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight", D, D, 1 },
    { "model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight", D / 2, D, 1 },
    { "model.layers.0.self_attn.v_proj.weight", "blk.0.attn_v.weight", D / 2, D, 1 },
    { "model.layers.0.self_attn.o_proj.weight", "blk.0.attn_output.weight", D, D, 1 },
    { "model.layers.0.mlp.gate_proj.weight", "blk.0.ffn_gate.weight", FFN, D, 2 },
    { "model.layers.0.mlp.up_proj.weight", "blk.0.ffn_up.weight", FFN, D, 2 },
    { "model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight", D, FFN, 2 },
    { "lm_head.weight", "output.weight", VOCAB, D, 2 },
};
enum { N_WEIGHTS = sizeof weights / sizeof weights[0] };

static const char *shard_name(int shard)
{
    return shard == 1 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
}

/* Where write_model writes (a folder of the test's, with its slash, or
 * ""), and its values' seed. */
static const char *g_sub = "";
static uint64_t g_seed = 41;

static char *model_path(char *path, size_t size, const char *name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "%s%s", g_sub, name);
    kt_in_tmp(path, size, rel);
    return path;
}

/* The first shard's weights are F32, the second's BF16: F32 is read as
 * stored and BF16 packed (gemv_tc's row-major atoms, which wgmma's
 * prefill reads too), so a load writes both kinds of array. */
static int is_f32(int i) { return weights[i].shard == 1; }

static size_t value_bytes(int i) { return is_f32(i) ? 4 : 2; }

/* Value v of weight i as stored, into b. */
static void put_value(kt_buf *b, int i, float v)
{
    if (is_f32(i)) {
        kt_put(b, &v, 4);
    } else {
        const uint16_t h = kiln_f32_to_bf16(v);
        kt_put(b, &h, 2);
    }
}

/* One shard: its header names the weights of that shard, random. */
static void write_shard(int shard, kt_rng *r)
{
    char header[4096] = "{";
    size_t at = 0, len = 1;
    for (int i = 0; i < N_WEIGHTS; i++) {
        if (weights[i].shard != shard)
            continue;
        size_t bytes = (size_t)(weights[i].n * weights[i].k) * value_bytes(i);
        len += (size_t)snprintf(header + len, sizeof header - len,
                                "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],"
                                "\"data_offsets\":[%zu,%zu]}",
                                len > 1 ? "," : "", weights[i].name,
                                is_f32(i) ? "F32" : "BF16", (long long)weights[i].n,
                                (long long)weights[i].k, at, at + bytes);
        at += bytes;
    }
    len += (size_t)snprintf(header + len, sizeof header - len, "}");
    while (len % 8)
        header[len++] = ' ';
    kt_buf b = { 0 };
    kt_put_le(&b, len, 8);
    kt_put(&b, header, len);
    for (int i = 0; i < N_WEIGHTS; i++) {
        if (weights[i].shard != shard)
            continue;
        for (int64_t e = 0; e < weights[i].n * weights[i].k; e++)
            put_value(&b, i, kt_normal(r));
    }
    char path[512];
    kt_write_file(model_path(path, sizeof path, shard_name(shard)), b.p, b.n);
    free(b.p);
}

static void write_model(void)
{
    kt_rng r = kt_rng_new(g_seed);
    write_shard(1, &r);
    write_shard(2, &r);
    char index[4096], path[512];
    size_t len = (size_t)snprintf(index, sizeof index, "{\"weight_map\":{");
    for (int i = 0; i < N_WEIGHTS; i++)
        len += (size_t)snprintf(index + len, sizeof index - len, "%s\"%s\":\"%s\"",
                                i ? "," : "", weights[i].name, shard_name(weights[i].shard));
    snprintf(index + len, sizeof index - len, "}}");
    kt_write_file(model_path(path, sizeof path, "model.safetensors.index.json"), index,
                  strlen(index));
    static const char config[] = "{\"architectures\":[\"LlamaForCausalLM\"],"
                                 "\"num_hidden_layers\":1,\"hidden_size\":128}";
    kt_write_file(model_path(path, sizeof path, "config.json"), config, strlen(config));
}

/* The same weights in one GGUF file (F32 type 0, BF16 type 30), its tensor data
 * aligned to 32 bytes. */
static void write_gguf(void)
{
    kt_rng r = kt_rng_new(43);
    kt_buf b = { 0 };
    kt_put(&b, "GGUF", 4);
    kt_put_le(&b, 3, 4);
    kt_put_le(&b, N_WEIGHTS, 8);
    kt_put_le(&b, 2, 8);
    static const char *const keys[] = { "general.architecture", "llama.block_count" };
    kt_put_le(&b, strlen(keys[0]), 8);
    kt_put(&b, keys[0], strlen(keys[0]));
    kt_put_le(&b, 8, 4); /* string */
    kt_put_le(&b, 5, 8);
    kt_put(&b, "llama", 5);
    kt_put_le(&b, strlen(keys[1]), 8);
    kt_put(&b, keys[1], strlen(keys[1]));
    kt_put_le(&b, 4, 4); /* uint32 */
    kt_put_le(&b, 1, 4);
    uint64_t at = 0;
    for (int i = 0; i < N_WEIGHTS; i++) {
        kt_put_le(&b, strlen(weights[i].gguf), 8);
        kt_put(&b, weights[i].gguf, strlen(weights[i].gguf));
        kt_put_le(&b, 2, 4);
        kt_put_le(&b, (uint64_t)weights[i].k, 8);
        kt_put_le(&b, (uint64_t)weights[i].n, 8);
        kt_put_le(&b, is_f32(i) ? 0 : 30, 4);
        kt_put_le(&b, at, 8);
        at += (uint64_t)(weights[i].n * weights[i].k) * value_bytes(i);
        at = (at + 31) / 32 * 32;
    }
    kt_pad(&b, 32);
    for (int i = 0; i < N_WEIGHTS; i++) {
        for (int64_t e = 0; e < weights[i].n * weights[i].k; e++)
            put_value(&b, i, kt_normal(&r));
        kt_pad(&b, 32);
    }
    char path[512];
    kt_write_file(kt_in_tmp(path, sizeof path, "model.gguf"), b.p, b.n);
    free(b.p);
}

/* The stand-in driver and compiler, a kernel cache in the test's folder,
 * and the load's settings (NULL: the default). The stand-in driver runs
 * no kernel, so the layouts are packed on the host unless a test asks
 * for the device packers (KILN_PACK=device). */
static void fake_device(const char *fail, const char *threads, const char *slots,
                        const char *slot_size)
{
    kt_fake_device(fail);
    const char *names[] = { "KILN_LOAD_THREADS", "KILN_LOAD_SLOTS", "KILN_LOAD_SLOT_SIZE" };
    const char *values[] = { threads, slots, slot_size };
    for (int i = 0; i < 3; i++)
        if (values[i])
            setenv(names[i], values[i], 1);
        else
            unsetenv(names[i]);
}

typedef struct loaded {
    kiln_model *model;
    kiln_graph *graph;
    kiln_session *session;
    kiln_status st;
} loaded;

static int g_gguf; /* the model is model.gguf, its weights named as GGUF names them */

static const char *weight_name(int i)
{
    return g_gguf ? weights[i].gguf : weights[i].name;
}

static loaded load_buckets(const int64_t *capture, int n_capture)
{
    char dir[512];
    loaded l = { 0 };
    kt_in_tmp(dir, sizeof dir, g_gguf ? "model.gguf" : "");
    cr_assert_eq(kiln_model_open(dir, &l.model), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_graph_create(&l.graph), KILN_OK);
    cr_assert_eq(kiln_model_build_linears(l.model, l.graph, 0), KILN_OK, "%s",
                 kiln_last_error());
    kiln_session_options so = { .eager = 1, .quiet = 1,
                                .plan = { .capture = capture, .n_capture = n_capture } };
    l.st = kiln_session_create(l.graph, &so, &l.session);
    return l;
}

static loaded load(void)
{
    static const int64_t capture[] = { 1, 64 };
    return load_buckets(capture, 2);
}

static void unload(loaded *l)
{
    kiln_session_destroy(l->session);
    kiln_graph_destroy(l->graph);
    kiln_model_close(l->model);
}

/* The stand-in driver's own bookkeeping, from the copy kiln loaded. */
typedef struct fake_view {
    int (*n_blocks)(void);
    const void *(*block)(int, size_t *);
    int (*host_live)(void);
} fake_view;

static fake_view fake(void)
{
    void *lib = dlopen(KT_FAKE_LIBCUDA, RTLD_NOW | RTLD_NOLOAD);
    cr_assert_not_null(lib, "the stand-in driver is not loaded");
    fake_view v;
    *(void **)&v.n_blocks = dlsym(lib, "kt_fake_cuda_n_blocks");
    *(void **)&v.block = dlsym(lib, "kt_fake_cuda_block");
    *(void **)&v.host_live = dlsym(lib, "kt_fake_cuda_host_live");
    cr_assert(v.n_blocks && v.block && v.host_live);
    dlclose(lib);
    return v;
}

/* Nothing of a failed session is left on the device or pinned. */
static void nothing_left(void)
{
    fake_view v = fake();
    cr_assert_eq(v.n_blocks(), 0, "%d device allocations left", v.n_blocks());
    cr_assert_eq(v.host_live(), 0, "%d pinned buffers left", v.host_live());
}

/* Every device array of a weight holds the bytes the old path wrote: the
 * stored bytes, or the CPU packer's. Their sizes add up to the session's
 * weight bytes, so no weight byte escapes the comparison. */
typedef struct want_bytes {
    const uint8_t *bytes;
    size_t size;
    int packed;
} want_bytes;

static void every_byte_equal(const loaded *l, int *raw_out, int *packed_out)
{
    fake_view v = fake();
    want_bytes want[3 * N_WEIGHTS];
    void *owned[N_WEIGHTS] = { 0 };
    int n_want = 0;
    for (int i = 0; i < N_WEIGHTS; i++) {
        const kiln_tensor *t = kiln_graph_find(l->graph, weight_name(i));
        cr_assert_not_null(t, "%s", weight_name(i));
        cr_assert_not_null(t->data_file.path, "%s has no file span", weight_name(i));
        const kiln_qtensor *q = &t->weight;
        size_t data;
        cr_assert_eq(kiln_format_data_bytes(q->format, q->n, q->k, &data), KILN_OK);
        want[n_want++] = (want_bytes){ q->data, data, 0 };
        if (q->format == KILN_FMT_F32)
            continue; /* no packed layout */
        size_t pd, ps;
        cr_assert_eq(kiln_gemv_pack_bytes(q->format, q->n, q->k, &pd, &ps), KILN_OK);
        uint8_t *p = owned[i] = malloc(pd + ps + 1);
        cr_assert_eq(kiln_gemv_pack(q, p, p + pd), KILN_OK, "%s", kiln_last_error());
        want[n_want++] = (want_bytes){ p, pd, 1 };
        if (ps)
            want[n_want++] = (want_bytes){ p + pd, ps, 1 };
    }
    size_t matched = 0;
    int raw = 0, packed = 0;
    for (int b = 0; b < v.n_blocks(); b++) {
        size_t size;
        const void *p = v.block(b, &size);
        for (int w = 0; w < n_want; w++)
            if (want[w].size == size && !memcmp(want[w].bytes, p, size)) {
                matched += size;
                raw += !want[w].packed;
                packed += want[w].packed;
                break;
            }
    }
    kiln_session_stats ss;
    kiln_session_get_stats(l->session, &ss);
    cr_assert_eq(matched, ss.weight_bytes,
                 "%zu of the session's %zu weight bytes are as the old path wrote them",
                 matched, ss.weight_bytes);
    cr_assert_eq(ss.load_copied_bytes, ss.weight_bytes);
    for (int i = 0; i < N_WEIGHTS; i++)
        free(owned[i]);
    *raw_out = raw;
    *packed_out = packed;
}

static void load_and_compare(const char *threads, const char *slots, const char *slot_size,
                             int want_threads)
{
    if (g_gguf)
        write_gguf();
    else
        write_model();
    fake_device(NULL, threads, slots, slot_size);
    loaded l = load();
    cr_assert_eq(l.st, KILN_OK, "%s", kiln_last_error());
    int raw, packed;
    every_byte_equal(&l, &raw, &packed);
    cr_assert(raw > 0 && packed > 0,
              "the plan should read weights both as stored (%d) and packed (%d)", raw, packed);
    kiln_session_stats ss;
    kiln_session_get_stats(l.session, &ss);
    cr_assert_eq(ss.load_pinned, 1);
    if (want_threads > 0)
        cr_assert_eq(ss.load_threads, want_threads);
    else
        cr_assert(ss.load_threads >= 1 && ss.load_threads <= 8, "%d", ss.load_threads);
    cr_assert_gt(ss.load_packed_bytes, 0);
    cr_assert_geq(ss.load_read_bytes, ss.load_copied_bytes - ss.load_packed_bytes);
    cr_assert_geq(ss.weights_s, ss.load_s);
    unload(&l);
    nothing_left();
}

TestSuite(load, .init = kt_tmp_setup, .fini = kt_tmp_teardown, .timeout = 120);

/* 1 KiB slots: every weight crosses several, packed ones go whole. */
Test(load, one_reader_and_a_ring_smaller_than_a_weight)
{
    load_and_compare("1", "2", "1K", 1);
}

Test(load, several_readers_and_a_ring_smaller_than_a_weight)
{
    load_and_compare("3", "2", "1K", 3);
}

/* More readers than slots, and a slot that does not divide a weight. */
Test(load, more_readers_than_slots)
{
    load_and_compare("4", "1", "3000", 4);
}

Test(load, defaults)
{
    load_and_compare(NULL, NULL, NULL, -1);
}

Test(load, a_gguf_file)
{
    g_gguf = 1;
    load_and_compare("3", "2", "1K", 3);
}

static void setup_redirected(void)
{
    kt_tmp_setup();
    cr_redirect_stderr();
}

Test(load, pinned_memory_refused_falls_back_with_one_warning, .init = setup_redirected)
{
    write_model();
    fake_device("host-alloc", "2", "2", "4K");
    loaded l = load();
    cr_assert_eq(l.st, KILN_OK, "%s", kiln_last_error());
    int raw, packed;
    every_byte_equal(&l, &raw, &packed);
    kiln_session_stats ss;
    kiln_session_get_stats(l.session, &ss);
    cr_assert_eq(ss.load_pinned, 0);
    unload(&l);
    nothing_left();
    fflush(stderr);
    char text[4096] = "";
    size_t n = fread(text, 1, sizeof text - 1, cr_get_redirected_stderr());
    text[n] = '\0';
    const char *first = strstr(text, "pinned staging");
    cr_assert_not_null(first, "no warning: %s", text);
    cr_assert_null(strstr(first + 1, "pinned staging"), "more than one warning: %s", text);
    cr_assert_not_null(strstr(text, "CUDA_ERROR_OUT_OF_MEMORY"), "%s", text);
}

static int names_a_weight(const char *msg)
{
    for (int i = 0; i < N_WEIGHTS; i++)
        if (strstr(msg, weight_name(i)))
            return 1;
    return 0;
}

Test(load, a_copy_failing_halfway_names_the_weight_and_leaves_nothing)
{
    const char *threads[] = { "1", "3" };
    for (int t = 0; t < 2; t++) {
        write_model();
        fake_device("copy:7", threads[t], "2", "2K");
        loaded l = load();
        const char *msg = kiln_last_error();
        cr_assert_eq(l.st, KILN_ERR_CUDA, "%s", msg);
        cr_assert_null(l.session);
        cr_assert(strstr(msg, "weight ") && names_a_weight(msg), "%s", msg);
        cr_assert_not_null(strstr(msg, "cuMemcpyHtoDAsync: CUDA_ERROR_ILLEGAL_ADDRESS"), "%s",
                           msg);
        unload(&l);
        nothing_left();
    }
}

/* The model opened and its linears built, then damage() done to its
 * files, then a session: refused with KILN_ERR_IO, leaving nothing
 * allocated; its message, for the caller to check. */
static const char *session_after(void (*damage)(void))
{
    write_model();
    fake_device(NULL, "2", "2", "2K");
    char dir[512];
    kiln_model *m;
    kiln_graph *g;
    cr_assert_eq(kiln_model_open(kt_in_tmp(dir, sizeof dir, ""), &m), KILN_OK, "%s",
                 kiln_last_error());
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    cr_assert_eq(kiln_model_build_linears(m, g, 0), KILN_OK, "%s", kiln_last_error());
    damage();
    kiln_session *s = NULL;
    kiln_session_options so = { .eager = 1, .quiet = 1 };
    kiln_status st = kiln_session_create(g, &so, &s);
    static char msg[1024];
    snprintf(msg, sizeof msg, "%s", kiln_last_error());
    cr_assert_eq(st, KILN_ERR_IO, "%s", msg);
    cr_assert_null(s);
    nothing_left();
    kiln_graph_destroy(g);
    kiln_model_close(m);
    return msg;
}

/* after the model was opened: its mapping would fault where the pread
 * comes back short */
static void shrink(void)
{
    char path[512];
    cr_assert_eq(truncate(kt_in_tmp(path, sizeof path, shard_name(2)), 4096), 0);
}

Test(load, a_shard_that_shrank_is_an_error_naming_it)
{
    const char *msg = session_after(shrink);
    cr_assert(strstr(msg, shard_name(2)) && strstr(msg, "weight ") && names_a_weight(msg),
              "%s", msg);
    cr_assert_not_null(strstr(msg, "the file ends"), "%s", msg);
}

static void remove_shard_1(void)
{
    char path[512], moved[512];
    cr_assert_eq(rename(kt_in_tmp(path, sizeof path, shard_name(1)),
                        kt_in_tmp(moved, sizeof moved, "moved")), 0);
}

Test(load, a_shard_gone_is_an_error_naming_it)
{
    const char *msg = session_after(remove_shard_1);
    cr_assert_not_null(strstr(msg, shard_name(1)), "%s", msg);
}

Test(load, a_bad_setting_is_refused_by_name)
{
    static const struct {
        const char *threads, *slots, *size, *name;
    } cases[] = { { "many", NULL, NULL, "KILN_LOAD_THREADS=many" },
                  { NULL, "0", NULL, "KILN_LOAD_SLOTS=0" },
                  { NULL, "5000", NULL, "KILN_LOAD_SLOTS=5000" },
                  { NULL, NULL, "64MB", "KILN_LOAD_SLOT_SIZE=64MB" } };
    write_model();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fake_device(NULL, cases[i].threads, cases[i].slots, cases[i].size);
        loaded l = load();
        cr_assert_eq(l.st, KILN_ERR_INVALID_ARG, "%s", kiln_last_error());
        cr_assert_not_null(strstr(kiln_last_error(), cases[i].name), "%s", kiln_last_error());
        unload(&l);
        nothing_left();
    }
}

/* The device copies of w a session over it holds: each of its storage
 * arrays (data, scales) and packed arrays found once where the plan keeps
 * that layout (want_storage), and not at all where it does not. */
static void device_copies(const kt_weight *w, int want_storage, const kiln_session *s)
{
    size_t pd, ps, data, scale;
    cr_assert_eq(kiln_gemv_pack_bytes(w->q.format, w->q.n, w->q.k, &pd, &ps), KILN_OK);
    cr_assert_eq(kiln_format_data_bytes(w->q.format, w->q.n, w->q.k, &data), KILN_OK);
    cr_assert_eq(kiln_format_scale_bytes(w->q.format, w->q.n, w->q.k, &scale), KILN_OK);
    uint8_t *packed = malloc(pd + ps);
    cr_assert_eq(kiln_gemv_pack(&w->q, packed, packed + pd), KILN_OK);
    const void *want[] = { w->q.data, w->q.scale, packed, packed + pd };
    const size_t sizes[] = { data, scale, pd, ps };
    /* An array is held once per layout kept that has it, and twice where
     * both layouts have the same bytes (FP8 per-channel's scales). */
    const int kept[] = { want_storage, want_storage, 1, 1 };
    int expect[4] = { 0 };
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4 && sizes[i]; j++)
            expect[i] += kept[j] && sizes[j] == sizes[i] && !memcmp(want[i], want[j], sizes[i]);
    fake_view v = fake();
    int found[4] = { 0 };
    for (int b = 0; b < v.n_blocks(); b++) {
        size_t size;
        const void *p = v.block(b, &size);
        for (int i = 0; i < 4; i++)
            found[i] += sizes[i] && sizes[i] == size && !memcmp(want[i], p, size);
    }
    for (int i = 0; i < 4; i++) /* Q4_K's scales are in its blocks: no array */
        cr_assert_eq(found[i], expect[i], "%s, array %d of the weight: %d device copies",
                     kiln_format_get(w->q.format)->name, i, found[i]);
    kiln_session_stats ss;
    kiln_session_get_stats(s, &ss);
    cr_assert_eq(ss.load_copied_bytes, (want_storage ? data + scale : 0) + pd + ps);
    free(packed);
}

/* A weight in caller memory goes through the same load: one the packer
 * refuses (a NaN NVFP4 block scale) is refused naming it, as before, and
 * one it takes arrives as the packer and the storage layout have it: NVFP4
 * and FP8 per-channel packed alone (decode and prefill read that layout
 * on the device, an sm_90a: wgmma_tc, and wgmma's TMA kernel from FP8's
 * row-major atoms, an odd count of them included), block FP8 packed for
 * decode and in the storage layout for prefill (wgmma's FP8 kernel). */
Test(load, weights_in_memory_and_a_refused_pack)
{
    fake_device(NULL, "3", "2", "1K");
    kt_rng r = kt_rng_new(7);
    kt_weight w;
    kt_weight_make(&w, &r, KILN_FMT_NVFP4, 256, 512);
    ((uint8_t *)w.q.scale)[3 * 32 + 5] = 0x7F;
    kiln_graph *g = kt_linear_graph(&w);
    static const int64_t capture[] = { 1, 64 };
    kiln_session_options so = { .eager = 1, .quiet = 1,
                                .plan = { .capture = capture, .n_capture = 2 } };
    kiln_session *s = NULL;
    kiln_status st = kiln_session_create(g, &so, &s);
    const char *msg = kiln_last_error();
    cr_assert_eq(st, KILN_ERR_MALFORMED, "%s", msg);
    cr_assert(strstr(msg, "weight w: ") && strstr(msg, "NaN"), "%s", msg);
    cr_assert_null(s);
    nothing_left();

    ((uint8_t *)w.q.scale)[3 * 32 + 5] = 0x38;
    cr_assert_eq(kiln_session_create(g, &so, &s), KILN_OK, "%s", kiln_last_error());
    device_copies(&w, 0, s);
    kiln_session_destroy(s);
    kiln_graph_destroy(g);
    kt_weight_free(&w);
    nothing_left();

    static const struct {
        kiln_format f;
        int64_t k;
        int storage;
    } held[] = { { KILN_FMT_FP8_CHANNEL, 512, 0 },
                 { KILN_FMT_FP8_CHANNEL, 320, 0 },
                 { KILN_FMT_FP8_BLOCK, 512, 1 } };
    for (size_t i = 0; i < KILN_ARRAY_LEN(held); i++) {
        kt_weight_make(&w, &r, held[i].f, 256, held[i].k);
        g = kt_linear_graph(&w);
        cr_assert_eq(kiln_session_create(g, &so, &s), KILN_OK, "%s", kiln_last_error());
        device_copies(&w, held[i].storage, s);
        kiln_session_destroy(s);
        kiln_graph_destroy(g);
        kt_weight_free(&w);
        nothing_left();
    }
}

/* The fault sweep (tests/util/fault.h) over a session that loads the
 * two-shard model with one reader (the sweep needs the same allocations
 * in the same order every run) and a ring smaller than a weight, from a
 * warm cache: every allocation failing in turn is an out-of-memory error,
 * with nothing left on the device or pinned. */
typedef struct sweep_ctx {
    kiln_graph *g;
    kiln_session_options o;
} sweep_ctx;

static kiln_status scenario_load(void *ctx, kt_digest *d)
{
    sweep_ctx *c = ctx;
    kiln_session *s;
    kiln_status st = kiln_session_create(c->g, &c->o, &s);
    if (st)
        return st;
    kiln_session_stats ss;
    kiln_session_get_stats(s, &ss);
    kt_dig_int(d, (int64_t)ss.weight_bytes);
    kt_dig_int(d, (int64_t)ss.load_copied_bytes);
    kt_dig_int(d, (int64_t)ss.load_packed_bytes);
    kiln_session_destroy(s);
    return KILN_OK;
}

static void check_load(void *ctx, kiln_status st)
{
    (void)ctx;
    (void)st;
    fake_view v = fake();
    cr_assert_eq(v.n_blocks(), 0, "%s: %d device allocations left", kt_sweep_now(),
                 v.n_blocks());
    cr_assert_eq(v.host_live(), 0, "%s: %d pinned buffers left", kt_sweep_now(), v.host_live());
}

Test(load, every_allocation_failing)
{
    write_model();
    fake_device(NULL, "1", "2", "1K");
    static const int64_t capture[] = { 1, 64 };
    loaded l = load();
    cr_assert_eq(l.st, KILN_OK, "%s", kiln_last_error());
    kiln_session_destroy(l.session);
    static sweep_ctx c;
    c.g = l.graph;
    c.o = (kiln_session_options){ .eager = 1, .quiet = 1, .cache.offline = 1,
                                  .plan = { .capture = capture, .n_capture = 2 } };
    kt_sweep(&(kt_scenario){ .name = "load", .run = scenario_load, .check = check_load,
                             .ctx = &c });
    kiln_graph_destroy(l.graph);
    kiln_model_close(l.model);
}

/* The same sweep through the device packers' scratch path (a decode-only
 * plan, KILN_PACK=device: every weight goes up into one scratch buffer
 * through one staging ring and is packed there): its list of copies, the
 * scratch, the ring and the packers' kernels failing in turn each leave
 * an error and nothing behind. */
Test(load, every_allocation_failing_with_the_device_packers)
{
    write_model();
    fake_device(NULL, "1", "2", "1K");
    setenv("KILN_PACK", "device", 1);
    static const int64_t capture[] = { 1 };
    loaded l = load_buckets(capture, 1);
    cr_assert_eq(l.st, KILN_OK, "%s", kiln_last_error());
    kiln_session_stats ss;
    kiln_session_get_stats(l.session, &ss);
    cr_assert_gt(ss.load_device_packed_bytes, 0, "the scratch path ran");
    kiln_session_destroy(l.session);
    static sweep_ctx c;
    c.g = l.graph;
    c.o = (kiln_session_options){ .eager = 1, .quiet = 1, .cache.offline = 1,
                                  .plan = { .capture = capture, .n_capture = 1 } };
    kt_sweep(&(kt_scenario){ .name = "load-device-packers", .run = scenario_load,
                             .check = check_load, .ctx = &c });
    kiln_graph_destroy(l.graph);
    kiln_model_close(l.model);
}

/* A shard replaced by another file at its path after the model was opened
 * (the same bytes, another inode) is refused: the mapping the graph's
 * weights point into and the file read would no longer be one. */
static void replace_shard_2(void)
{
    char path[512], moved[512];
    kt_in_tmp(path, sizeof path, shard_name(2));
    cr_assert_eq(rename(path, kt_in_tmp(moved, sizeof moved, "moved")), 0);
    kt_copy_file(moved, path);
}

Test(load, a_shard_replaced_is_refused_naming_it)
{
    const char *msg = session_after(replace_shard_2);
    cr_assert(strstr(msg, shard_name(2)) && strstr(msg, "replaced"), "%s", msg);
}

/* The bytes in kiln's storage layout of every weight, or where f32_only
 * of the F32 ones, which the session holds as stored and never packs. */
static size_t storage_bytes_of(const loaded *l, int f32_only)
{
    size_t total = 0;
    for (int i = 0; i < N_WEIGHTS; i++) {
        const kiln_tensor *t = kiln_graph_find(l->graph, weight_name(i));
        if (f32_only && t->weight.format != KILN_FMT_F32)
            continue;
        size_t data, scale;
        cr_assert_eq(kiln_format_data_bytes(t->weight.format, t->weight.n, t->weight.k, &data),
                     KILN_OK);
        cr_assert_eq(kiln_qtensor_scale_bytes(&t->weight, &scale), KILN_OK);
        total += data + scale;
    }
    return total;
}

static size_t storage_total(const loaded *l)
{
    return storage_bytes_of(l, 0);
}

/* With the device packers, each weight is read once, in its storage
 * layout, and the host packs nothing: the BF16 weights go up into a
 * scratch buffer that is freed with the load and are packed from it
 * (their prefill kernels read the packed atoms too), the F32 ones stay
 * as stored. What the packers write is checked against
 * the host packer on a GPU (tests/gpu/test_pack.c). */
Test(load, device_packers_read_each_weight_once)
{
    static const int64_t both[] = { 1, 64 }, decode[] = { 1 };
    const struct {
        const int64_t *capture;
        int n;
    } cases[] = { { both, 2 }, { decode, 1 } };
    write_model();
    for (size_t c = 0; c < KILN_ARRAY_LEN(cases); c++) {
        fake_device(NULL, "2", "2", "4K");
        setenv("KILN_PACK", "device", 1);
        loaded l = load_buckets(cases[c].capture, cases[c].n);
        cr_assert_eq(l.st, KILN_OK, "%s", kiln_last_error());
        kiln_session_stats ss;
        kiln_session_get_stats(l.session, &ss);
        const size_t stored = storage_total(&l);
        cr_assert_eq(ss.load_packed_bytes, 0, "the host packed %zu bytes", ss.load_packed_bytes);
        cr_assert_gt(ss.load_device_packed_bytes, 0);
        cr_assert_eq(ss.load_read_bytes, stored, "read %zu of %zu stored bytes",
                     ss.load_read_bytes, stored);
        cr_assert_eq(ss.load_copied_bytes, stored);
        cr_assert_eq(ss.load_device_packed_bytes + storage_bytes_of(&l, 1), ss.weight_bytes,
                     "every packed byte is the device packers'");
        unload(&l);
        nothing_left();
    }
    setenv("KILN_PACK", "sideways", 1);
    loaded l = load();
    cr_assert_eq(l.st, KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "KILN_PACK=sideways"), "%s", kiln_last_error());
    unload(&l);
    nothing_left();
}

/* A device that cannot hold the device packers' whole scratch buffer: it
 * is halved until it can (but never below the largest weight), the
 * weights go up in more rounds through the one staging ring, each read
 * once, and nothing is left behind. */
Test(load, device_packers_scratch_halves_until_it_fits)
{
    static const int64_t decode[] = { 1 };
    write_model();
    /* the BF16 weights' storage arrays take 208 KiB, the largest (gate,
     * up, down) 64 KiB: 208 and 104 KiB are refused, 64 KiB taken */
    fake_device("alloc-over:100000", "2", "2", "4K");
    setenv("KILN_PACK", "device", 1);
    void *lib = dlopen(KT_FAKE_LIBCUDA, RTLD_NOW | RTLD_NOLOAD);
    long (*refused)(void) = NULL;
    loaded l = load_buckets(decode, 1);
    cr_assert_eq(l.st, KILN_OK, "%s", kiln_last_error());
    if (!lib)
        lib = dlopen(KT_FAKE_LIBCUDA, RTLD_NOW | RTLD_NOLOAD);
    cr_assert_not_null(lib, "the stand-in driver is not loaded");
    *(void **)&refused = dlsym(lib, "kt_fake_cuda_refused");
    cr_assert_not_null(refused);
    cr_assert_eq(refused(), 2, "%ld allocations refused", refused());
    dlclose(lib);
    kiln_session_stats ss;
    kiln_session_get_stats(l.session, &ss);
    const size_t stored = storage_total(&l);
    cr_assert_eq(ss.load_read_bytes, stored, "read %zu of %zu stored bytes", ss.load_read_bytes,
                 stored);
    cr_assert_eq(ss.load_copied_bytes, stored);
    cr_assert_eq(ss.load_device_packed_bytes + storage_bytes_of(&l, 1), ss.weight_bytes,
                 "every BF16 weight packed on the device, every F32 one as stored");
    unload(&l);
    nothing_left();
}

/* kiln_session_reload from another checkpoint of the same shape: after it
 * every device array holds the new model's bytes, stored and packed, in
 * the same buffers, and the session's stats are still its load's. A
 * checkpoint that lacks a weight (the same weights under GGUF's names) is
 * refused naming it, and changes nothing. With the device packers the
 * reload reads each weight once. */
Test(load, reload_from_another_checkpoint)
{
    write_model();
    write_gguf();
    char dir[512], gguf[512];
    cr_assert_eq(mkdir(kt_in_tmp(dir, sizeof dir, "b"), 0700), 0);
    g_sub = "b/", g_seed = 77;
    write_model();
    g_sub = "", g_seed = 41;
    kt_in_tmp(gguf, sizeof gguf, "model.gguf");
    for (int device = 0; device < 2; device++) {
        fake_device(NULL, "2", "2", "4K");
        if (device)
            setenv("KILN_PACK", "device", 1);
        loaded l = load();
        cr_assert_eq(l.st, KILN_OK, "%s", kiln_last_error());
        kiln_session_stats before, after;
        kiln_session_get_stats(l.session, &before);
        loaded b = { .session = l.session };
        cr_assert_eq(kiln_model_open(dir, &b.model), KILN_OK, "%s", kiln_last_error());
        cr_assert_eq(kiln_graph_create(&b.graph), KILN_OK);
        cr_assert_eq(kiln_model_build_linears(b.model, b.graph, 0), KILN_OK);
        cr_assert_eq(kiln_session_reload(l.session, b.model), KILN_OK, "%s", kiln_last_error());
        kiln_session_get_stats(l.session, &after);
        cr_assert_eq(memcmp(&before, &after, sizeof before), 0, "the reload changed the stats");
        int raw, packed;
        if (!device)
            every_byte_equal(&b, &raw, &packed);
        kiln_model *other;
        cr_assert_eq(kiln_model_open(gguf, &other), KILN_OK, "%s", kiln_last_error());
        cr_assert_eq(kiln_session_reload(l.session, other), KILN_ERR_NOT_FOUND);
        cr_assert(strstr(kiln_last_error(), "reload") &&
                      strstr(kiln_last_error(), weights[0].name),
                  "%s", kiln_last_error());
        kiln_model_close(other);
        if (!device)
            every_byte_equal(&b, &raw, &packed);
        cr_assert_eq(kiln_session_reload(NULL, b.model), KILN_ERR_INVALID_ARG);
        kiln_graph_destroy(b.graph);
        kiln_model_close(b.model);
        unload(&l);
        nothing_left();
    }
}
