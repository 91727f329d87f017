/* The fault sweep (tests/util/fault.h) over graph/: building a graph,
 * and the GGUF and safetensors readers on small files written here, each
 * opened, listed and built into the FFN graph. */
#include "core.h"
#include "fault.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static kiln_status scenario_graph(void *ctx, kt_digest *d)
{
    kiln_graph *g;
    kiln_status st = kt_model_graph(ctx, &g);
    if (st)
        return st;
    for (int i = 0; i < kiln_graph_n_tensors(g); i++)
        kt_dig_str(d, kiln_tensor_name(kiln_graph_tensor(g, i)));
    kiln_graph_destroy(g);
    return KILN_OK;
}

Test(fault, graph_builder)
{
    static kt_model m;
    kt_model_make(&m);
    kt_sweep(&(kt_scenario){ .name = "graph", .run = scenario_graph, .ctx = &m });
    kt_model_free(&m);
}


static void dig_model(kt_digest *d, const kiln_model *m)
{
    kiln_model_info info;
    kt_dig_str(d, kiln_model_container(m));
    kt_dig_str(d, kiln_model_arch(m));
    kiln_model_get_info(m, &info);
    kt_dig(d, &info, sizeof info);
    for (int i = 0; i < kiln_model_n_tensors(m); i++) {
        kiln_model_tensor_info t;
        kiln_qtensor q;
        cr_assert_eq(kiln_model_tensor_at(m, i, &t), KILN_OK);
        kt_dig_str(d, t.name);
        kt_dig_str(d, t.type_name);
        kt_dig_int(d, t.supported);
        kt_dig_int(d, t.format);
        kt_dig(d, t.ne, sizeof t.ne);
        kt_dig_int(d, (int64_t)t.bytes);
        kiln_status st = kiln_model_weight(m, t.name, &q);
        kt_dig_int(d, st);
        /* The reason kiln cannot use a tensor, or its scales. */
        kt_dig_str(d, st ? kiln_last_error() : "");
        if (!st)
            kt_dig_int(d, q.scale != NULL);
    }
}

/* Open each of the NULL-terminated paths and list every tensor; build the
 * FFN graph from the first. */
static kiln_status scenario_model(void *ctx, kt_digest *d)
{
    const char *const *paths = ctx;
    kiln_status st = KILN_OK;
    for (int i = 0; paths[i] && !st; i++) {
        kiln_model *m;
        kiln_graph *g = NULL;
        if ((st = kiln_model_open(paths[i], &m)))
            break;
        dig_model(d, m);
        if (i == 0 && !(st = kiln_graph_create(&g)) && !(st = kiln_model_build_ffn(m, g, 0)))
            kt_dig_int(d, kiln_graph_n_tensors(g));
        kiln_graph_destroy(g);
        kiln_model_close(m);
    }
    return st;
}

static void gguf_str(kt_buf *b, const char *s)
{
    kt_put_le(b, strlen(s), 8);
    kt_put(b, s, strlen(s));
}

static void gguf_key(kt_buf *b, const char *key, uint32_t type)
{
    gguf_str(b, key);
    kt_put_le(b, type, 4);
}

static void gguf_tensor(kt_buf *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                        uint64_t offset)
{
    gguf_str(b, name);
    kt_put_le(b, n_dims, 4);
    for (uint32_t i = 0; i < n_dims; i++)
        kt_put_le(b, ne[i], 8);
    kt_put_le(b, type, 4);
    kt_put_le(b, offset, 8);
}

/* A one-layer Llama FFN: an F16 norm (copied to f32 for the graph), Q8_0
 * gate and up, a Q4_0 down, an IQ4_NL tensor kiln cannot use; metadata
 * with strings, an array of strings and an array of arrays. */
static void write_gguf(const char *path)
{
    enum { GGUF_U32 = 4, GGUF_F32 = 6, GGUF_STRING = 8, GGUF_ARRAY = 9 };
    static const struct {
        const char *name;
        uint32_t n_dims;
        uint64_t ne[2];
        uint32_t type;
        size_t bytes;
    } tensors[] = {
        { "blk.0.ffn_norm.weight", 1, { KT_D_MODEL }, 1, KT_D_MODEL * 2 },
        { "blk.0.ffn_gate.weight", 2, { KT_D_MODEL, KT_D_FFN }, 8, KT_D_FFN * KT_D_MODEL / 32 * 34 },
        { "blk.0.ffn_up.weight", 2, { KT_D_MODEL, KT_D_FFN }, 8, KT_D_FFN * KT_D_MODEL / 32 * 34 },
        { "blk.0.ffn_down.weight", 2, { KT_D_FFN, KT_D_MODEL }, 2, KT_D_MODEL * KT_D_FFN / 32 * 18 },
        { "blk.0.attn_q.weight", 2, { KT_D_MODEL, 32 }, 20, 32 * KT_D_MODEL / 32 * 18 },
    };
    kt_buf b = { 0 };
    kt_put(&b, "GGUF", 4);
    kt_put_le(&b, 3, 4);
    kt_put_le(&b, KILN_ARRAY_LEN(tensors), 8);
    kt_put_le(&b, 8, 8);
    gguf_key(&b, "general.architecture", GGUF_STRING);
    gguf_str(&b, "llama");
    gguf_key(&b, "general.name", GGUF_STRING);
    gguf_str(&b, "fault sweep");
    const char *ints[] = { "llama.block_count", "llama.embedding_length", "llama.feed_forward_length" };
    const uint32_t values[] = { 1, KT_D_MODEL, KT_D_FFN };
    for (int i = 0; i < 3; i++) {
        gguf_key(&b, ints[i], GGUF_U32);
        kt_put_le(&b, values[i], 4);
    }
    gguf_key(&b, "llama.attention.layer_norm_rms_epsilon", GGUF_F32);
    float eps = 1e-5f;
    kt_put(&b, &eps, 4);
    gguf_key(&b, "tokenizer.ggml.tokens", GGUF_ARRAY);
    kt_put_le(&b, GGUF_STRING, 4);
    kt_put_le(&b, 3, 8);
    gguf_str(&b, "<s>");
    gguf_str(&b, "a");
    gguf_str(&b, "b");
    gguf_key(&b, "fault.nested", GGUF_ARRAY);
    kt_put_le(&b, GGUF_ARRAY, 4);
    kt_put_le(&b, 2, 8);
    for (int i = 0; i < 2; i++) {
        kt_put_le(&b, GGUF_U32, 4);
        kt_put_le(&b, 2, 8);
        kt_put_le(&b, (uint64_t)i, 4);
        kt_put_le(&b, (uint64_t)i + 1, 4);
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < KILN_ARRAY_LEN(tensors); i++) {
        gguf_tensor(&b, tensors[i].name, tensors[i].n_dims, tensors[i].ne, tensors[i].type, offset);
        offset += (tensors[i].bytes + 31) / 32 * 32;
    }
    kt_pad(&b, 32);
    for (size_t i = 0; i < KILN_ARRAY_LEN(tensors); i++) {
        size_t at = b.n;
        kt_put(&b, NULL, tensors[i].bytes);
        if (i == 0)
            for (int j = 0; j < KT_D_MODEL; j++) /* f16 1.0 */
                b.p[at + 2 * (size_t)j + 1] = 0x3c;
        kt_pad(&b, 32);
    }
    kt_write_file(path, b.p, b.n);
    free(b.p);
}

Test(fault, gguf_reader, .init = kt_tmp_setup, .fini = kt_tmp_teardown)
{
    char path[128];
    write_gguf(kt_in_tmp(path, sizeof path, "model.gguf"));
    const char *paths[] = { path, NULL };
    kt_sweep(&(kt_scenario){ .name = "gguf", .run = scenario_model, .ctx = paths });
}

/* A safetensors file under construction: the header's JSON and the data. */
typedef struct stw {
    char json[4096];
    size_t jn;
    kt_buf data;
} stw;

static void st_add(stw *w, const char *name, const char *dtype, const char *shape, size_t bytes,
                   size_t align)
{
    kt_pad(&w->data, align);
    size_t begin = w->data.n;
    kt_put(&w->data, NULL, bytes);
    w->jn += (size_t)snprintf(w->json + w->jn, sizeof w->json - w->jn,
                              "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                              w->jn ? "," : "{\"__metadata__\":{\"format\":\"pt\"},", name, dtype, shape,
                              begin, w->data.n);
    cr_assert_lt(w->jn, sizeof w->json);
}

/* The header padded to 8 bytes, so that data offsets decide alignment. */
static void st_write(stw *w, const char *path)
{
    kt_buf b = { 0 };
    size_t hlen = (w->jn + 1 + 7) / 8 * 8;
    kt_put_le(&b, hlen, 8);
    kt_put(&b, w->json, w->jn);
    kt_put(&b, "}", 1);
    while (b.n < 8 + hlen)
        kt_put(&b, " ", 1);
    kt_put(&b, w->data.p, w->data.n);
    kt_write_file(path, b.p, b.n);
    free(b.p);
    free(w->data.p);
}

/* A directory, opened as one and through one of its shards: config.json
 * (block FP8 quantization), an index and two shards holding a one-layer
 * Llama FFN (a BF16 norm, block-FP8 gate and up, a BF16 down), an NVFP4,
 * a per-channel FP8 and a one-expert MXFP4 weight, an F32 tensor at an
 * odd offset (copied to aligned memory) and a U8 tensor no convention
 * claims. */
static void write_safetensors(const char *dir)
{
    char path[256];
    cr_assert_eq(mkdir(dir, 0700), 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    const char *config = "{\"architectures\":[\"LlamaForCausalLM\"],\"num_hidden_layers\":1,"
                         "\"hidden_size\":256,\"intermediate_size\":512,\"rms_norm_eps\":1e-5,"
                         "\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[128,128]}}";
    kt_write_file(path, config, strlen(config));

    const char *l = "model.layers.0.";
    char name[128];
    stw a = { 0 }, b = { 0 };
    char map[4096];
    size_t mn = 0;
#define ST(w, shard, suffix, dtype, shape, bytes, align)                                                   \
    do {                                                                                                   \
        snprintf(name, sizeof name, "%s%s", l, suffix);                                                    \
        st_add(&w, name, dtype, shape, bytes, align);                                                      \
        mn += (size_t)snprintf(map + mn, sizeof map - mn, "%s\"%s\":\"%s\"", mn ? "," : "", name, shard); \
    } while (0)
    const char *s1 = "model-00001-of-00002.safetensors", *s2 = "model-00002-of-00002.safetensors";
    ST(a, s1, "extra.bytes", "U8", "[3]", 3, 1);
    ST(a, s1, "extra.odd", "F32", "[4]", 16, 1);
    ST(a, s1, "post_attention_layernorm.weight", "BF16", "[256]", 512, 16);
    ST(a, s1, "mlp.gate_proj.weight", "F8_E4M3", "[512,256]", 512 * 256, 16);
    ST(a, s1, "mlp.gate_proj.weight_scale_inv", "F32", "[4,2]", 32, 16);
    ST(b, s2, "mlp.up_proj.weight", "F8_E4M3", "[512,256]", 512 * 256, 16);
    ST(b, s2, "mlp.up_proj.weight_scale_inv", "F32", "[4,2]", 32, 16);
    ST(b, s2, "mlp.down_proj.weight", "BF16", "[256,512]", 256 * 512 * 2, 16);
    ST(b, s2, "self_attn.q_proj.weight", "U8", "[32,128]", 32 * 128, 16);
    ST(b, s2, "self_attn.q_proj.weight_scale", "F8_E4M3", "[32,16]", 32 * 16, 16);
    ST(b, s2, "self_attn.q_proj.weight_scale_2", "F32", "[]", 4, 16);
    ST(b, s2, "self_attn.k_proj.weight", "F8_E4M3", "[32,256]", 32 * 256, 16);
    ST(b, s2, "self_attn.k_proj.weight_scale", "F32", "[32]", 32 * 4, 16);
    ST(b, s2, "mlp.experts.gate_up_proj_blocks", "U8", "[1,32,8,16]", 32 * 8 * 16, 16);
    ST(b, s2, "mlp.experts.gate_up_proj_scales", "U8", "[1,32,8]", 32 * 8, 16);
#undef ST
    snprintf(path, sizeof path, "%s/%s", dir, s1);
    st_write(&a, path);
    snprintf(path, sizeof path, "%s/%s", dir, s2);
    st_write(&b, path);
    char index[4200];
    int n = snprintf(index, sizeof index, "{\"metadata\":{},\"weight_map\":{%s}}", map);
    cr_assert_lt((size_t)n, sizeof index);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    kt_write_file(path, index, (size_t)n);
}

Test(fault, safetensors_reader, .init = kt_tmp_setup, .fini = kt_tmp_teardown)
{
    char dir[128], shard[192];
    write_safetensors(kt_in_tmp(dir, sizeof dir, "model"));
    snprintf(shard, sizeof shard, "%s/model-00002-of-00002.safetensors", dir);
    const char *paths[] = { dir, shard, NULL };
    kt_sweep(&(kt_scenario){ .name = "safetensors", .run = scenario_model, .ctx = paths });
}
