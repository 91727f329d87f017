/* A GPU session: plan for the live device, kernels from the caches, weights
 * uploaded once, one activation arena, one CUDA graph per token bucket.
 * Everything it launches comes from the build (core/build.h); it finalises
 * the launches for the device once and never asks the codegen again. */
#include "core/build.h"
#include "graph/graph_impl.h"
#include "graph/model_impl.h"
#include "kernels/common/kiln_args.h"
#include "runtime/driver.h"
#include "runtime/load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Device copies of one weight tensor in one layout: kiln's storage layout
 * (layout.pack NULL) or a kernel's packed layout. A weight read by two
 * layouts (a packed decode kernel and a prefill kernel on the storage
 * layout) has two. Reloads copy into these very buffers. */
typedef struct dev_weight {
    kiln_tensor *tensor;
    kiln_weight_layout layout;
    CUdeviceptr data, scale, global;
    size_t data_bytes, scale_bytes;
    int same; /* the index of an earlier copy with the same bytes, -1 when none */
} dev_weight;

typedef struct dev_kernel {
    CUmodule module;
    CUfunction fn[KILN_MAX_LAUNCHES];
    int n_fn;
} dev_kernel;

/* An entry point: a graph output, the graph inputs its value depends on,
 * and in each program the steps that compute it, in stream order. */
typedef struct session_entry {
    const kiln_tensor *output;
    int *inputs;  /* indices of the graph's inputs, ascending */
    int n_inputs;
    int **steps;  /* [program] */
    int *n_steps; /* [program] */
} session_entry;

struct kiln_session {
    const kiln_cu *cu;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    kiln_graph *graph;
    kiln_plan *plan;
    kiln_build build;
    kiln_target target;       /* the plan's, which weights are packed for */
    kiln_launch **launches;   /* [program][step * KILN_MAX_LAUNCHES + f], finalised */
    CUtensorMap **maps;       /* [program][(step * KILN_MAX_LAUNCHES + f) * KILN_MAX_TMA + i] */
    dev_kernel *kernels;      /* [build.n] */
    dev_weight *weights;      /* one per weight tensor used */
    int n_weights;
    CUdeviceptr *params;      /* tensor id -> f32 copy of a param, 0 when none */
    CUdeviceptr arena;
    CUdeviceptr quant_scratch; /* fp8-tensor scale + amax partials, per quant step */
    /* The static input scale of each quantization step that applies one,
     * f32 [program][step], max_steps a program; read-only once uploaded. */
    CUdeviceptr input_scales;
    int max_steps;
    CUgraphExec *execs;        /* [n_buckets] */
    uint16_t *staging;         /* bf16 rows for inputs and outputs */
    size_t staging_elems;
    int eager, quiet;
    int host_pack;             /* $KILN_PACK=host: every layout packed on the CPU */
    /* What the device gives launches; sm_count 0 where no kernel may start
     * before the one before it has finished: $KILN_SERIAL=1, or a driver
     * before 12.3, which cannot capture such launches into a graph. */
    kiln_device_caps caps;
    kiln_session_stats stats;
    session_entry *entries; /* one per graph output */
    int n_entries;
};

#define CU(call, what)                                                                          \
    do {                                                                                        \
        kiln_status st_ = kiln_cu_check(s->cu, (call), (what));                                 \
        if (st_ != KILN_OK)                                                                     \
            return st_;                                                                         \
    } while (0)

/* ------------------------------------------------------------ weights */

static dev_weight *weight_of(kiln_session *s, const kiln_tensor *t, kiln_pack_fn pack)
{
    for (int i = 0; i < s->n_weights; i++)
        if (s->weights[i].tensor == t && s->weights[i].layout.pack == pack)
            return &s->weights[i];
    return NULL;
}

/* The bytes of weight t in kiln's storage layout. */
static kiln_status storage_bytes(const kiln_tensor *t, size_t *data, size_t *scale)
{
    kiln_status e = kiln_format_data_bytes(t->weight.format, t->weight.n, t->weight.k, data);
    if (e == KILN_OK)
        e = kiln_qtensor_scale_bytes(&t->weight, scale);
    return e != KILN_OK ? kiln_fail_prefix(e, "weight %s", t->name) : KILN_OK;
}

/* The device copy of weight t of linear step st (its own, or the gate
 * epilogue's weight2) in the layout its kernel reads, its buffers
 * allocated on first use; the load fills them. */
static kiln_status weight_for(kiln_session *s, const kiln_step *st, kiln_tensor *t,
                              dev_weight **out)
{
    if ((*out = weight_of(s, t, st->layout.pack)))
        return KILN_OK;
    dev_weight *w = *out = &s->weights[s->n_weights++];
    *w = (dev_weight){ .tensor = t, .layout = st->layout, .same = -1 };
    if (st->layout.pack) {
        w->data_bytes = st->layout.data_bytes, w->scale_bytes = st->layout.scale_bytes;
    } else {
        kiln_status e = storage_bytes(t, &w->data_bytes, &w->scale_bytes);
        if (e != KILN_OK)
            return e;
    }
    CU(s->cu->MemAlloc(&w->data, w->data_bytes), t->name);
    if (w->scale_bytes)
        CU(s->cu->MemAlloc(&w->scale, w->scale_bytes), t->name);
    CU(s->cu->MemAlloc(&w->global, sizeof(float)), t->name);
    s->stats.weight_bytes += w->data_bytes + w->scale_bytes;
    /* Graph weights that share host bytes (a benchmark's rotated copies)
     * are loaded once and copied on the device. */
    for (int i = 0; i < s->n_weights - 1 && w->same < 0; i++) {
        const kiln_qtensor *a = &s->weights[i].tensor->weight, *q = &t->weight;
        if (s->weights[i].layout.pack == w->layout.pack && a->data == q->data &&
            a->scale == q->scale &&
            a->format == q->format && a->n == q->n && a->k == q->k &&
            a->global_scale == q->global_scale && a->group == q->group)
            w->same = i;
    }
    return KILN_OK;
}

/* The load's settings: $KILN_LOAD_THREADS readers (one per core, at most
 * 8), $KILN_LOAD_SLOTS staging buffers (4) of $KILN_LOAD_SLOT_SIZE bytes
 * (64 MiB). */
static kiln_status load_options(const kiln_session *s, kiln_load_options *o)
{
    kiln_env env;
    kiln_env_read(&env);
    const struct {
        const char *name, *text;
        long long value;
    } bad[] = { { "KILN_LOAD_THREADS", env.load_threads_text, env.load_threads },
                { "KILN_LOAD_SLOTS", env.load_slots_text, env.load_slots },
                { "KILN_LOAD_SLOT_SIZE", env.load_slot_size_text, env.load_slot_size } };
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++)
        if (bad[i].value < 0 || (i < 2 && bad[i].value > 4096))
            return kiln_fail(KILN_ERR_INVALID_ARG,
                             "%s=%s: want a positive count%s", bad[i].name, bad[i].text,
                             i < 2 ? " up to 4096" : " of bytes (a K, M or G suffix allowed)");
    int cores = kiln_cpu_count();
    *o = (kiln_load_options){
        .cu = s->cu,
        .ctx = s->ctx,
        .stream = s->stream,
        .target = &s->target,
        .threads = env.load_threads ? (int)env.load_threads : cores < 8 ? cores : 8,
        .slots = env.load_slots ? (int)env.load_slots : 4,
        .slot_bytes = env.load_slot_size ? (size_t)env.load_slot_size : (size_t)64 << 20,
        .quiet = s->quiet,
    };
    return KILN_OK;
}

/* Whether copy w's layout is packed on the device: its backend has a
 * device packer, the session loaded it, and $KILN_PACK is not "host". */
static int device_packs(const kiln_session *s, const dev_weight *w)
{
    return !s->host_pack && w->layout.pack && w->layout.device_pack && w->layout.refusal &&
           s->kernels[w->layout.packer].n_fn == 1;
}

/* Queues w's device packer on src's storage-layout arrays data and scale
 * on the device; the first value it cannot carry lowers *bad. */
static kiln_status device_pack(kiln_session *s, const dev_weight *w, const kiln_tensor *src,
                               CUdeviceptr data, CUdeviceptr scale, CUdeviceptr bad)
{
    const kiln_qtensor *q = &src->weight;
    kiln_pack_args a = {
        .w = (const void *)data, .w_scale = (const void *)scale,
        .out = (void *)w->data, .out_scale = (void *)w->scale,
        .n = q->n, .k = q->k,
        .scale_bytes = (long long)w->scale_bytes, /* the storage layout's, where it is kept */
        .bad = (unsigned long long *)bad,
    };
    /* a warp an atom of a 16-row tile, grid-strided */
    const int64_t atoms = kiln_ceil_div(q->n, 16) * (q->k / 64), per_block = KILN_PACK_THREADS / 32;
    int64_t blocks = kiln_ceil_div(atoms, per_block);
    blocks = blocks < 1 ? 1 : blocks > 16384 ? 16384 : blocks;
    void *params[] = { &a };
    CUlaunchConfig lc = {
        .gridDimX = (unsigned)blocks, .gridDimY = 1, .gridDimZ = 1,
        .blockDimX = KILN_PACK_THREADS, .blockDimY = 1, .blockDimZ = 1,
        .hStream = s->stream,
    };
    const dev_kernel *d = &s->kernels[w->layout.packer];
    CU(s->cu->LaunchKernelEx(&lc, d->fn[0], params, NULL),
       s->build.kernels[w->layout.packer].signature);
    s->stats.load_device_packed_bytes += w->data_bytes + w->scale_bytes;
    return KILN_OK;
}

/* The load's tallies, summed over its runs. */
static void load_count(kiln_session *s, const kiln_load_stats *ls)
{
    s->stats.load_read_bytes += ls->read_bytes;
    s->stats.load_copied_bytes += ls->copied_bytes;
    s->stats.load_packed_bytes += ls->packed_bytes;
    s->stats.load_s += ls->seconds;
    s->stats.load_threads = ls->threads;
    s->stats.load_pinned = ls->pinned;
}

/* One run of the load over items, counted, staged through ring (NULL:
 * the run's own). */
static kiln_status load_items(kiln_session *s, kiln_load_ring *ring, const kiln_load_item *items,
                              int n)
{
    kiln_load_options o;
    kiln_status st = load_options(s, &o);
    if (st || !n)
        return st;
    o.ring = ring;
    kiln_load_stats ls;
    st = kiln_load_run(&o, items, n, &ls);
    load_count(s, &ls);
    return st;
}

/* A fill of the session's copies: copy i from src[i] (NULL: not now). */
typedef struct fill {
    kiln_session *s;
    const kiln_tensor *const *src;
    kiln_load_item *items; /* room for one a copy */
    CUdeviceptr bad;       /* a first-refused index a copy, all ones for none */
} fill;

/* The storage-layout arrays on the device that copy i is packed from in
 * this fill: its tensor's storage copy when this fill writes it (or its
 * twin, for a copy loaded as another's), else 0. */
static const dev_weight *pack_source(const fill *f, int i)
{
    const kiln_session *s = f->s;
    for (int j = 0; j < s->n_weights; j++) {
        const dev_weight *w = &s->weights[j];
        if (w->tensor != s->weights[i].tensor || w->layout.pack)
            continue;
        if (f->src[j])
            return w;
        if (w->same >= 0 && f->src[w->same])
            return &s->weights[w->same];
    }
    return NULL;
}

/* Storage-layout bytes staged for the device packers: at least
 * PACK_SCRATCH_MIN (or the largest weight), at most a quarter of the free
 * device memory, as few rounds as that allows. */
enum { PACK_SCRATCH_MIN = 1 << 30 };

static size_t align256(size_t n)
{
    return (n + 255) / 256 * 256;
}

/* The scratch buffer's bytes for `total` bytes of rounds whose largest
 * weight needs `largest`. */
static size_t scratch_size(const kiln_session *s, size_t total, size_t largest)
{
    size_t free_b = 0, all = 0, want = PACK_SCRATCH_MIN;
    if (s->cu->MemGetInfo(&free_b, &all) == CUDA_SUCCESS && free_b / 4 > want)
        want = free_b / 4;
    want = want < total ? want : total;
    return want > largest ? want : largest;
}

/* The device-packed copies with no storage copy to pack from, in rounds:
 * as many as fit the scratch buffer go up into it through one staging
 * ring kept for every round, and are packed. The next round's copies
 * queue on the stream behind the packers, so the host reads on while they
 * run; the buffer is freed once the stream is done. */
static kiln_status pack_through_scratch(fill *f)
{
    kiln_session *s = f->s;
    int *pick = kiln_calloc((size_t)s->n_weights + 1, sizeof *pick), n = 0;
    if (!pick)
        return kiln_fail(KILN_ERR_NOMEM, "session: out of memory for the weight load");
    /* f->items[k]: copy pick[k]'s storage arrays, placed in the scratch
     * buffer round by round */
    size_t total = 0, largest = 0, part = 1;
    kiln_status st = KILN_OK;
    for (int j = 0; st == KILN_OK && j < s->n_weights; j++) {
        size_t data, scale;
        if (!f->src[j] || !device_packs(s, &s->weights[j]) || pack_source(f, j) ||
            (st = storage_bytes(f->src[j], &data, &scale)) != KILN_OK)
            continue;
        f->items[n] = (kiln_load_item){ .tensor = f->src[j], .data_bytes = data,
                                        .scale_bytes = scale };
        pick[n++] = j;
        const size_t need = align256(data) + align256(scale);
        total += need, largest = need > largest ? need : largest;
        part = data > part ? data : scale > part ? scale : part;
    }
    CUdeviceptr scratch = 0;
    kiln_load_ring *ring = NULL;
    if (st == KILN_OK && n) {
        size_t size = scratch_size(s, total, largest);
        CUresult r;
        while ((r = s->cu->MemAlloc(&scratch, size)) == CUDA_ERROR_OUT_OF_MEMORY &&
               size > largest)
            size = size / 2 > largest ? size / 2 : largest;
        st = kiln_cu_check(s->cu, r, "the device packers' scratch");
        kiln_load_options o;
        if (st == KILN_OK && (st = load_options(s, &o)) == KILN_OK) {
            /* Slots no larger than the largest array: pinning costs by the byte. */
            o.slot_bytes = part < o.slot_bytes ? part : o.slot_bytes;
            st = kiln_load_ring_create(&o, &ring);
        }
        for (int first = 0, end; st == KILN_OK && first < n; first = end) {
            size_t used = 0;
            for (end = first; end < n; end++) {
                kiln_load_item *it = &f->items[end];
                const size_t need = align256(it->data_bytes) + align256(it->scale_bytes);
                if (end > first && used + need > size)
                    break;
                it->data = scratch + used, it->scale = scratch + used + align256(it->data_bytes);
                used += need;
            }
            st = load_items(s, ring, f->items + first, end - first);
            for (int k = first; k < end && st == KILN_OK; k++)
                st = device_pack(s, &s->weights[pick[k]], f->items[k].tensor, f->items[k].data,
                                 f->items[k].scale, f->bad + (size_t)pick[k] * 8);
        }
    }
    kiln_status sync = kiln_cu_check(s->cu, s->cu->StreamSynchronize(s->stream),
                                     "the device packers");
    kiln_load_ring_destroy(s->cu, ring);
    if (scratch)
        s->cu->MemFree(scratch);
    free(pick);
    return st ? st : sync;
}

/* What the device packers found: the first copy with a value its layout
 * cannot carry, named as the host packer names it. */
static kiln_status pack_refusals(const fill *f)
{
    kiln_session *s = f->s;
    uint64_t *first = kiln_calloc((size_t)s->n_weights + 1, sizeof *first);
    if (!first)
        return kiln_fail(KILN_ERR_NOMEM, "session: out of memory for the packers' findings");
    kiln_status st =
        kiln_cu_check(s->cu, s->cu->MemcpyDtoH(first, f->bad, (size_t)s->n_weights * 8),
                      "the device packers' findings");
    for (int i = 0; st == KILN_OK && i < s->n_weights; i++) {
        const dev_weight *w = &s->weights[i];
        if (!f->src[i] || !device_packs(s, w) || first[i] == UINT64_MAX)
            continue;
        const kiln_qtensor *q = &f->src[i]->weight;
        unsigned f16 = 0;
        if (q->format == KILN_FMT_F16) { /* the value's bits, from its storage copy */
            const dev_weight *src = pack_source(f, i);
            uint8_t b[2];
            if (src && s->cu->MemcpyDtoH(b, src->data + 2 * first[i], 2) == CUDA_SUCCESS)
                f16 = (unsigned)b[0] | (unsigned)b[1] << 8;
            else if (!f->src[i]->data_file.path)
                f16 = (unsigned)((const uint8_t *)q->data)[2 * first[i]] |
                      (unsigned)((const uint8_t *)q->data)[2 * first[i] + 1] << 8;
        }
        st = kiln_fail_prefix(w->layout.refusal(q->format, q->k, (int64_t)first[i], f16),
                              "weight %s", w->tensor->name);
    }
    free(first);
    return st;
}

/* Fill every copy i with src[i] from it: one load of the storage layouts
 * and the host-packed ones, then the device packers, from the storage
 * copy where this fill writes one, else through the scratch; then the
 * global scales. The stream is synchronized before it returns. */
static kiln_status weights_fill(kiln_session *s, const kiln_tensor *const *src)
{
    fill f = { .s = s, .src = src };
    f.items = kiln_calloc((size_t)s->n_weights + 1, sizeof *f.items);
    if (!f.items)
        return kiln_fail(KILN_ERR_NOMEM, "session: out of memory for the weight load");
    int n = 0, device = 0;
    for (int i = 0; i < s->n_weights; i++) {
        const dev_weight *w = &s->weights[i];
        if (!src[i])
            continue;
        device += device_packs(s, w);
        if (!device_packs(s, w))
            f.items[n++] = (kiln_load_item){ .tensor = src[i], .pack = w->layout.pack,
                                             .data = w->data, .scale = w->scale,
                                             .data_bytes = w->data_bytes,
                                             .scale_bytes = w->scale_bytes };
    }
    kiln_status st = load_items(s, NULL, f.items, n);
    if (st == KILN_OK && device) {
        st = kiln_cu_check(s->cu, s->cu->MemAlloc(&f.bad, (size_t)s->n_weights * 8),
                           "the device packers' findings");
        if (st == KILN_OK)
            st = kiln_cu_check(s->cu,
                               s->cu->MemsetD8Async(f.bad, 0xFF, (size_t)s->n_weights * 8,
                                                    s->stream),
                               "the device packers' findings");
        double t0 = kiln_now();
        for (int i = 0; st == KILN_OK && i < s->n_weights; i++) {
            const dev_weight *w = &s->weights[i], *from = pack_source(&f, i);
            if (src[i] && device_packs(s, w) && from)
                st = device_pack(s, w, src[i], from->data, from->scale, f.bad + (size_t)i * 8);
        }
        if (st == KILN_OK)
            st = pack_through_scratch(&f);
        if (st == KILN_OK)
            st = kiln_cu_check(s->cu, s->cu->StreamSynchronize(s->stream), "the device packers");
        s->stats.load_device_pack_s += kiln_now() - t0;
        if (st == KILN_OK)
            st = pack_refusals(&f);
    }
    for (int i = 0; st == KILN_OK && i < s->n_weights; i++)
        if (src[i])
            st = kiln_cu_check(s->cu, s->cu->MemcpyHtoDAsync(s->weights[i].global,
                                                             &src[i]->weight.global_scale,
                                                             sizeof(float), s->stream),
                               s->weights[i].tensor->name);
    kiln_status sync = kiln_cu_check(s->cu, s->cu->StreamSynchronize(s->stream), "weights");
    if (f.bad)
        s->cu->MemFree(f.bad);
    free(f.items);
    return st ? st : sync;
}

/* $KILN_PACK: where the packed layouts are written. */
static kiln_status pack_setting(kiln_session *s)
{
    kiln_env env;
    kiln_env_read(&env);
    if (env.pack && strcmp(env.pack, "host") && strcmp(env.pack, "device"))
        return kiln_fail(KILN_ERR_INVALID_ARG, "KILN_PACK=%s: want host or device", env.pack);
    s->host_pack = env.pack && !strcmp(env.pack, "host");
    return KILN_OK;
}

/* Every weight through the load, then the copies of shared ones. */
static kiln_status weights_load(kiln_session *s)
{
    kiln_status st = pack_setting(s);
    if (st)
        return st;
    const kiln_tensor **src = kiln_calloc((size_t)s->n_weights + 1, sizeof *src);
    if (!src)
        return kiln_fail(KILN_ERR_NOMEM, "session: out of memory for the weight load");
    for (int i = 0; i < s->n_weights; i++)
        src[i] = s->weights[i].same < 0 ? s->weights[i].tensor : NULL;
    st = weights_fill(s, src);
    free(src);
    for (int i = 0; st == KILN_OK && i < s->n_weights; i++) {
        dev_weight *w = &s->weights[i];
        const char *name = w->tensor->name;
        if (w->same < 0)
            continue;
        const dev_weight *same = &s->weights[w->same];
        CU(s->cu->MemcpyDtoD(w->data, same->data, w->data_bytes), name);
        if (w->scale_bytes)
            CU(s->cu->MemcpyDtoD(w->scale, same->scale, w->scale_bytes), name);
        CU(s->cu->MemcpyHtoDAsync(w->global, &w->tensor->weight.global_scale, sizeof(float),
                                  s->stream), name);
    }
    return st;
}

static kiln_status weights_create(kiln_session *s)
{
    const kiln_build *b = &s->build;
    size_t linears = 0;
    for (int p = 0; p < b->n_programs; p++)
        for (int i = 0; i < b->programs[p].n_steps; i++)
            linears += b->programs[p].steps[i].kind == KILN_STEP_LINEAR
                           ? 1 + (b->programs[p].steps[i].weight2 != NULL)
                           : 0;
    s->weights = kiln_calloc(linears + 1, sizeof *s->weights);
    s->params = kiln_calloc((size_t)s->graph->tensors.n + 1, sizeof *s->params);
    if (!s->weights || !s->params)
        return kiln_fail(KILN_ERR_NOMEM, "session: out of memory for the weights");
    for (int p = 0; p < b->n_programs; p++)
        for (int i = 0; i < b->programs[p].n_steps; i++) {
            const kiln_step *st = &b->programs[p].steps[i];
            dev_weight *w;
            kiln_status e = st->kind == KILN_STEP_LINEAR ? weight_for(s, st, st->weight, &w)
                                                         : KILN_OK;
            if (e == KILN_OK && st->kind == KILN_STEP_LINEAR && st->weight2)
                e = weight_for(s, st, st->weight2, &w);
            if (e != KILN_OK)
                return e;
        }
    kiln_status e = weights_load(s);
    if (e != KILN_OK)
        return e;
    for (int i = 0; i < s->graph->tensors.n; i++) {
        kiln_tensor *t = s->graph->tensors.v[i];
        if (t->op != KILN_OP_PARAM)
            continue;
        size_t bytes = (size_t)t->ne[0] * sizeof(float);
        CU(s->cu->MemAlloc(&s->params[t->id], bytes), t->name);
        CU(s->cu->MemcpyHtoDAsync(s->params[t->id], t->param, bytes, s->stream), t->name);
        s->stats.weight_bytes += bytes;
    }
    return KILN_OK;
}

/* Copies i with src[i] refilled from it, into the same device buffers.
 * Every copy's layout checks its new values before anything is written,
 * so a weight a layout refuses leaves the session as it was. */
static kiln_status weights_replace(kiln_session *s, const kiln_tensor *const *src,
                                   const char *what)
{
    for (int i = 0; i < s->n_weights; i++) {
        const dev_weight *w = &s->weights[i];
        kiln_status st = src[i] && w->layout.check ? w->layout.check(&src[i]->weight) : KILN_OK;
        if (st)
            return kiln_fail_prefix(st, "%s %s", what, w->tensor->name);
    }
    /* The stream may be replaying a graph that reads the old weights. */
    kiln_status st = kiln_cu_check(s->cu, s->cu->CtxSetCurrent(s->ctx), what);
    if (st == KILN_OK)
        st = kiln_cu_check(s->cu, s->cu->StreamSynchronize(s->stream), what);
    /* Past this point only a failing device (whose context is then lost)
     * or a file that cannot be read stops the copies halfway. The stats
     * stay those of the session's own load. */
    kiln_session_stats keep = s->stats;
    if (st == KILN_OK)
        st = weights_fill(s, src);
    s->stats = keep;
    return st;
}

kiln_status kiln_session_reload(kiln_session *s, const kiln_model *m)
{
    if (!s || !m)
        return kiln_fail(KILN_ERR_INVALID_ARG, "reload: session and model are required");
    kiln_tensor *now = kiln_calloc((size_t)s->n_weights + 1, sizeof *now);
    const kiln_tensor **src = kiln_calloc((size_t)s->n_weights + 1, sizeof *src);
    kiln_status st = now && src ? KILN_OK
                                : kiln_fail(KILN_ERR_NOMEM, "reload: out of memory for %d weights",
                                            s->n_weights);
    for (int i = 0; st == KILN_OK && i < s->n_weights; i++) {
        const kiln_tensor *t = s->weights[i].tensor;
        for (int j = 0; j < i && !src[i]; j++)
            if (s->weights[j].tensor == t)
                src[i] = src[j];
        if (src[i])
            continue;
        kiln_qtensor q;
        if ((st = kiln_model_graph_weight(m, t->name, &q))) {
            st = kiln_fail_prefix(st, "reload");
            break;
        }
        const kiln_qtensor *old = &t->weight;
        if (q.format != old->format || q.n != old->n || q.k != old->k ||
            (kiln_format_get(old->format)->grouped && q.group != old->group)) {
            st = kiln_fail(KILN_ERR_STATE,
                           "reload: weight %s is %s [%lld, %lld] (group %lld) in the model; the "
                           "session holds %s [%lld, %lld] (group %lld) and its graphs captured "
                           "those buffers (create a new session for a new layout)",
                           t->name, kiln_format_get(q.format)->name, (long long)q.n,
                           (long long)q.k, (long long)q.group,
                           kiln_format_get(old->format)->name, (long long)old->n,
                           (long long)old->k, (long long)old->group);
            break;
        }
        now[i] = *t;
        now[i].weight = q;
        now[i].data_file = now[i].scale_file = (kiln_file_span){ 0 };
        kiln_model_spans(m, &now[i]);
        src[i] = &now[i];
    }
    if (st == KILN_OK)
        st = weights_replace(s, src, "reload");
    free(src);
    free(now);
    return st;
}

kiln_status kiln_session_set_weight(kiln_session *s, const char *name, const kiln_qtensor *q)
{
    if (!s || !name || !q)
        return kiln_fail(KILN_ERR_INVALID_ARG, "set_weight: session, name and weight are required");
    kiln_tensor *t = kiln_graph_find(s->graph, name);
    int copies = 0;
    for (int i = 0; t && i < s->n_weights; i++)
        copies += s->weights[i].tensor == t;
    if (!copies)
        return kiln_fail(KILN_ERR_NOT_FOUND, "set_weight: no weight %s in the session", name);
    const kiln_qtensor *old = &t->weight;
    int grouped = kiln_format_get(old->format)->grouped;
    if (q->format != old->format || q->n != old->n || q->k != old->k ||
        (grouped && q->group != old->group))
        return kiln_fail(KILN_ERR_STATE,
                         "set_weight %s: the session holds %s [%lld, %lld] (group %lld) and the "
                         "graphs captured its buffers; %s [%lld, %lld] (group %lld) does not fit "
                         "them (create a new session for a new layout)",
                         name, kiln_format_get(old->format)->name, (long long)old->n,
                         (long long)old->k, (long long)old->group,
                         kiln_format_get(q->format) ? kiln_format_get(q->format)->name : "?",
                         (long long)q->n, (long long)q->k, (long long)q->group);
    if (!q->data || (kiln_format_get(q->format)->scale_type != KILN_SCALE_NONE && !q->scale))
        return kiln_fail(KILN_ERR_INVALID_ARG, "set_weight %s: data or scale missing", name);
    kiln_tensor now = *t;
    now.weight = *q;
    now.data_file = now.scale_file = (kiln_file_span){ 0 };
    const kiln_tensor **src = kiln_calloc((size_t)s->n_weights + 1, sizeof *src);
    if (!src)
        return kiln_fail(KILN_ERR_NOMEM, "set_weight %s: out of memory", name);
    for (int i = 0; i < s->n_weights; i++)
        src[i] = s->weights[i].tensor == t ? &now : NULL;
    kiln_status st = weights_replace(s, src, "set_weight");
    free(src);
    return st;
}

/* ------------------------------------------------------------ kernels */

/* Every step's launches as this device runs them, decided once. */
static kiln_status launches_create(kiln_session *s)
{
    const kiln_build *b = &s->build;
    s->launches = kiln_calloc((size_t)b->n_programs + 1, sizeof *s->launches);
    if (!s->launches)
        return kiln_fail(KILN_ERR_NOMEM, "session: out of memory for the launches");
    for (int p = 0; p < b->n_programs; p++) {
        const kiln_program *bk = &b->programs[p];
        kiln_launch *l = s->launches[p] =
            kiln_calloc((size_t)bk->n_steps * KILN_MAX_LAUNCHES + 1, sizeof *l);
        if (!l)
            return kiln_fail(KILN_ERR_NOMEM, "session: out of memory for the launches");
        for (int i = 0; i < bk->n_steps; i++) {
            const kiln_step *st = &bk->steps[i];
            if (st->n_launch != b->kernels[st->signature].n_entries)
                return kiln_fail(KILN_ERR_STATE,
                                 "bucket %lld, step %d: %d launches for the %d functions of %s",
                                 (long long)bk->m, i, st->n_launch,
                                 b->kernels[st->signature].n_entries,
                                 b->kernels[st->signature].signature);
            for (int f = 0; f < st->n_launch; f++) {
                l[i * KILN_MAX_LAUNCHES + f] = st->launch[f];
                kiln_launch_finalise(&s->caps, &l[i * KILN_MAX_LAUNCHES + f]);
            }
        }
    }
    return KILN_OK;
}

/* The most dynamic shared memory function f of kernel k asks for in any
 * launch: a function's allowance is set once. */
static unsigned smem_of(const kiln_session *s, int k, int f)
{
    unsigned most = 0;
    for (int p = 0; p < s->build.n_programs; p++) {
        const kiln_program *bk = &s->build.programs[p];
        for (int i = 0; i < bk->n_steps; i++)
            if (bk->steps[i].signature == k) {
                unsigned smem = s->launches[p][i * KILN_MAX_LAUNCHES + f].smem;
                most = smem > most ? smem : most;
            }
    }
    return most;
}

static kiln_status kernels_load(kiln_session *s)
{
    s->kernels = kiln_calloc((size_t)s->build.n + 1, sizeof *s->kernels);
    if (!s->kernels)
        return kiln_fail(KILN_ERR_NOMEM, "session: out of memory for the kernels");
    for (int i = 0; i < s->build.n; i++) {
        const kiln_kernel *k = &s->build.kernels[i];
        dev_kernel *d = &s->kernels[i];
        CUresult r = s->cu->ModuleLoadData(&d->module, k->cubin);
        if (r != CUDA_SUCCESS) {
            kiln_cu_check(s->cu, r, "cuModuleLoadData");
            return kiln_fail_prefix(KILN_ERR_CUDA,
                                    "kernel %s (%s) built for %s cannot be loaded on %s",
                                    k->entry[0], k->signature, k->target, s->stats.target);
        }
        d->n_fn = k->n_entries;
        for (int f = 0; f < d->n_fn; f++) {
            CU(s->cu->ModuleGetFunction(&d->fn[f], d->module, k->entry[f]), k->entry[f]);
            /* Static and dynamic shared memory together may pass the
             * default 48 KiB; the dynamic part is allowed explicitly. */
            unsigned smem = smem_of(s, i, f);
            if (smem > 0)
                CU(s->cu->FuncSetAttribute(d->fn[f],
                                           CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                           (int)smem),
                   k->entry[f]);
        }
    }
    return KILN_OK;
}

/* ------------------------------------------------------------ launches */

static CUdeviceptr value_ptr(const kiln_session *s, const kiln_program *bk, int v)
{
    return v < 0 ? 0 : s->arena + bk->values[v].offset;
}

/* The tensor map l->tma[i] of step st of bucket b, for this session's
 * device addresses. */
static kiln_status map_encode(kiln_session *s, int b, const kiln_step *st, const kiln_tma *t,
                              CUtensorMap *out)
{
    const kiln_program *bk = &s->build.programs[b];
    CUdeviceptr at = 0;
    const int rank = t->rank ? t->rank : 2;
    if (t->source == KILN_TMA_X) {
        at = value_ptr(s, bk, st->src[0]);
    } else if (t->source == KILN_TMA_W || t->source == KILN_TMA_W_SCALE) {
        const dev_weight *w = weight_of(s, st->weight, st->layout.pack);
        at = !w ? 0 : t->source == KILN_TMA_W ? w->data : w->scale;
        /* TMA bounds a copy by the map alone: the map must lie in the array,
         * its last element included. */
        const size_t have = !w ? 0 : t->source == KILN_TMA_W ? w->data_bytes : w->scale_bytes;
        uint64_t end = t->offset + t->dims[0] * t->elem_bytes;
        for (int d = 1; d < rank && d < 4; d++)
            end += (t->dims[d] ? t->dims[d] - 1 : 0) * t->strides[d - 1];
        if (w && end > have)
            return kiln_fail(KILN_ERR_STATE,
                             "tensor map %d of %s: %llu bytes past an array of %zu",
                             (int)t->source, st->node ? st->node->name : "?",
                             (unsigned long long)end, have);
    }
    static const CUtensorMapDataType types[] = { [1] = CU_TENSOR_MAP_DATA_TYPE_UINT8,
                                                 [2] = CU_TENSOR_MAP_DATA_TYPE_UINT16,
                                                 [4] = CU_TENSOR_MAP_DATA_TYPE_UINT32,
                                                 [8] = CU_TENSOR_MAP_DATA_TYPE_UINT64 };
    CUtensorMapSwizzle swizzle = t->swizzle == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                 : t->swizzle == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                 : t->swizzle == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                                                    : CU_TENSOR_MAP_SWIZZLE_NONE;
    const unsigned e = t->elem_bytes;
    if (!at || (e != 1 && e != 2 && e != 4 && e != 8) || rank < 2 || rank > 4 || t->offset % 16)
        return kiln_fail(KILN_ERR_STATE,
                         "tensor map %d of %s: no buffer, element size %u, rank %d or offset %llu",
                         (int)t->source, st->node ? st->node->name : "?", t->elem_bytes, rank,
                         (unsigned long long)t->offset);
    at += t->offset;
    const cuuint64_t dims[4] = { t->dims[0], t->dims[1], t->dims[2], t->dims[3] },
                     strides[3] = { t->strides[0], t->strides[1], t->strides[2] };
    const cuuint32_t box[4] = { t->box[0], t->box[1], t->box[2], t->box[3] },
                     unit[4] = { 1, 1, 1, 1 };
    CU(s->cu->TensorMapEncodeTiled(out, types[t->elem_bytes], (cuuint32_t)rank, (void *)at, dims,
                                   strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
       "cuTensorMapEncodeTiled");
    return KILN_OK;
}

/* Every launch's tensor maps, encoded once the arena and the weights are
 * on the device. */
static kiln_status maps_create(kiln_session *s)
{
    const kiln_build *b = &s->build;
    s->maps = kiln_calloc((size_t)b->n_programs + 1, sizeof *s->maps);
    if (!s->maps)
        return kiln_fail(KILN_ERR_NOMEM, "session: out of memory for the tensor maps");
    for (int p = 0; p < b->n_programs; p++) {
        const kiln_program *bk = &b->programs[p];
        int any = 0;
        for (int i = 0; i < bk->n_steps; i++)
            for (int f = 0; f < bk->steps[i].n_launch; f++)
                any |= bk->steps[i].launch[f].n_tma > 0;
        if (!any)
            continue;
        /* The driver encodes a map only at a 64-byte aligned address. */
        const size_t bytes = (size_t)bk->n_steps * KILN_MAX_LAUNCHES * KILN_MAX_TMA *
                             sizeof(CUtensorMap);
        CUtensorMap *m = s->maps[p] = kiln_aligned_alloc(128, bytes);
        if (!m)
            return kiln_fail(KILN_ERR_NOMEM, "session: out of memory for the tensor maps");
        memset(m, 0, bytes);
        for (int i = 0; i < bk->n_steps; i++)
            for (int f = 0; f < bk->steps[i].n_launch; f++) {
                const kiln_launch *l = &bk->steps[i].launch[f];
                for (int t = 0; t < l->n_tma; t++) {
                    kiln_status st = map_encode(
                        s, p, &bk->steps[i], &l->tma[t],
                        &m[(i * KILN_MAX_LAUNCHES + f) * KILN_MAX_TMA + t]);
                    if (st != KILN_OK)
                        return kiln_fail_prefix(st, "bucket %lld, step %d", (long long)bk->m, i);
                }
            }
    }
    return KILN_OK;
}

/* The static input scales of every program's quantization steps, at
 * [program][step] (0 where a step applies none). */
static kiln_status input_scales_create(kiln_session *s, int max_steps)
{
    size_t n = (size_t)s->build.n_programs * (size_t)(max_steps ? max_steps : 1);
    float *host = kiln_calloc(n, sizeof *host);
    if (!host)
        return kiln_fail(KILN_ERR_NOMEM, "session: out of memory for the input scales");
    s->max_steps = max_steps;
    for (int b = 0; b < s->build.n_programs; b++)
        for (int i = 0; i < s->build.programs[b].n_steps; i++)
            host[(size_t)b * (size_t)max_steps + (size_t)i] =
                s->build.programs[b].steps[i].input_scale;
    kiln_status st = kiln_cu_check(s->cu, s->cu->MemAlloc(&s->input_scales, n * sizeof *host),
                                   "input scales");
    if (st == KILN_OK)
        st = kiln_cu_check(s->cu, s->cu->MemcpyHtoD(s->input_scales, host, n * sizeof *host),
                           "input scales");
    free(host);
    return st;
}

static kiln_status launch_step(kiln_session *s, int b, int si, CUstream stream)
{
    const kiln_program *bk = &s->build.programs[b];
    const kiln_step *st = &bk->steps[si];
    const kiln_kernel *k = &s->build.kernels[st->signature];
    const dev_kernel *d = &s->kernels[st->signature];
    union {
        kiln_linear_args linear;
        kiln_op_args op;
        kiln_quant_args quant;
    } a;
    memset(&a, 0, sizeof a);
    int m = (int)bk->m;
    CUdeviceptr scratch = s->quant_scratch + (size_t)si * (1 + KILN_QUANT_AMAX_PARTS) * 4;
    switch (st->kind) {
    case KILN_STEP_LINEAR: {
        const dev_weight *w = weight_of(s, st->weight, st->layout.pack);
        const dev_weight *w2 = st->weight2 ? weight_of(s, st->weight2, st->layout.pack) : NULL;
        if (!w || (st->weight2 && !w2))
            return kiln_fail(KILN_ERR_STATE, "weight %s: no device copy in the layout of %s",
                             (w ? st->weight2 : st->weight)->name, k->signature);
        a.linear = (kiln_linear_args){
            .y = (void *)value_ptr(s, bk, st->dst),
            .x = (const void *)value_ptr(s, bk, st->src[0]),
            .w = (const void *)w->data,
            .w_scale = (const void *)w->scale,
            .w_global = (const float *)w->global,
            .bias = st->bias ? (const float *)s->params[st->bias->id] : NULL,
            .aux = (const void *)value_ptr(s, bk, st->src[1]),
            .w2 = w2 ? (const void *)w2->data : NULL,
            .w2_scale = w2 ? (const void *)w2->scale : NULL,
            .w2_global = w2 ? (const float *)w2->global : NULL,
            .m = m,
        };
        /* fp8-tensor activations carry their scale beside the quant step */
        if (bk->values[st->src[0]].act == KILN_ACT_FP8_TENSOR) {
            int q = bk->values[st->src[0]].first;
            a.linear.x_scale =
                (const void *)(s->quant_scratch + (size_t)q * (1 + KILN_QUANT_AMAX_PARTS) * 4);
        }
        break;
    }
    case KILN_STEP_OP: {
        const kiln_tensor *t = st->node;
        a.op = (kiln_op_args){
            .y = (void *)value_ptr(s, bk, st->dst),
            .a = (const void *)value_ptr(s, bk, st->src[0]),
            .b = (const void *)value_ptr(s, bk, st->src[1]),
            .weight = t->op == KILN_OP_RMS_NORM ? (const float *)s->params[t->src[1]->id] : NULL,
            .eps = t->eps,
            .m = m,
        };
        break;
    }
    case KILN_STEP_PACK:
        return kiln_fail(KILN_ERR_STATE, "%s: a packer is not a step of a program", k->signature);
    case KILN_STEP_QUANT:
        a.quant = (kiln_quant_args){
            .q = (void *)value_ptr(s, bk, st->dst),
            .x = (const void *)value_ptr(s, bk, st->src[0]),
            .scale = (float *)scratch,
            .partial = (float *)(scratch + 4),
            .m = m,
        };
        if (st->input_scale > 0.0f)
            a.quant.scale =
                (float *)(s->input_scales + ((size_t)b * (size_t)s->max_steps + (size_t)si) * 4);
        break;
    }
    for (int f = 0; f < d->n_fn; f++) {
        const kiln_launch *c = &s->launches[b][si * KILN_MAX_LAUNCHES + f];
        void *params[1 + KILN_MAX_TMA] = { &a };
        for (int t = 0; t < c->n_tma; t++)
            params[1 + t] = &s->maps[b][(si * KILN_MAX_LAUNCHES + f) * KILN_MAX_TMA + t];
        /* A kernel that waits for its predecessor itself may start while
         * that one drains (kiln_launch.overlap). */
        CUlaunchAttribute overlap = {
            .id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            .value.programmaticStreamSerializationAllowed = 1,
        };
        CUlaunchConfig lc = {
            .gridDimX = c->grid[0], .gridDimY = c->grid[1], .gridDimZ = c->grid[2],
            .blockDimX = c->block[0], .blockDimY = c->block[1], .blockDimZ = c->block[2],
            .sharedMemBytes = c->smem, .hStream = stream,
            .attrs = c->overlap ? &overlap : NULL, .numAttrs = c->overlap ? 1 : 0,
        };
        CU(s->cu->LaunchKernelEx(&lc, d->fn[f], params, NULL), k->entry[f]);
    }
    return KILN_OK;
}

static kiln_status launch_program(kiln_session *s, int b, CUstream stream)
{
    const kiln_program *bk = &s->build.programs[b];
    for (int i = 0; i < bk->n_steps; i++) {
        kiln_status st = launch_step(s, b, i, stream);
        if (st != KILN_OK)
            return kiln_fail_prefix(st, "bucket %lld, step %d (%s)", (long long)bk->m, i,
                                    bk->steps[i].node ? bk->steps[i].node->name : "?");
    }
    return KILN_OK;
}

/* Queue bucket b's program on stream: its graph, or its launches one by
 * one in an eager session or into a capture the caller has begun on
 * stream (the caller's graph then holds kiln's kernels). */
static kiln_status replay(kiln_session *s, int b, CUstream stream)
{
    CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_NONE;
    if (stream != s->stream)
        CU(s->cu->StreamIsCapturing(stream, &capturing), "cuStreamIsCapturing");
    if (s->eager || capturing != CU_STREAM_CAPTURE_STATUS_NONE)
        return launch_program(s, b, stream);
    CU(s->cu->GraphLaunch(s->execs[b], stream), "cuGraphLaunch");
    return KILN_OK;
}

static kiln_status graphs_create(kiln_session *s)
{
    int nb = s->build.n_programs;
    s->execs = kiln_calloc((size_t)nb, sizeof *s->execs);
    if (!s->execs)
        return kiln_fail(KILN_ERR_NOMEM, "session: out of memory for the graphs");
    for (int b = 0; b < nb; b++) {
        CUgraph graph;
        CU(s->cu->StreamBeginCapture(s->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
           "cuStreamBeginCapture");
        kiln_status st = launch_program(s, b, s->stream);
        CUresult r = s->cu->StreamEndCapture(s->stream, &graph);
        if (st != KILN_OK) {
            if (r == CUDA_SUCCESS)
                s->cu->GraphDestroy(graph);
            return st;
        }
        CU(r, "cuStreamEndCapture");
        r = s->cu->GraphInstantiateWithFlags(&s->execs[b], graph, 0);
        s->cu->GraphDestroy(graph);
        CU(r, "cuGraphInstantiate");
    }
    return KILN_OK;
}

/* ------------------------------------------------------------ create */

static void on_corrupt(void *ctx, const char *message)
{
    (void)ctx;
    fprintf(stderr, "kiln: warning: %s\n", message);
}

void kiln_session_destroy(kiln_session *s)
{
    if (!s)
        return;
    const kiln_cu *cu = s->cu;
    if (cu && s->ctx) {
        if (s->stream)
            cu->StreamSynchronize(s->stream);
        for (int b = 0; s->execs && b < s->build.n_programs; b++)
            if (s->execs[b])
                cu->GraphExecDestroy(s->execs[b]);
        for (int i = 0; s->kernels && i < s->build.n; i++)
            if (s->kernels[i].module)
                cu->ModuleUnload(s->kernels[i].module);
        for (int i = 0; i < s->n_weights; i++) {
            cu->MemFree(s->weights[i].data);
            cu->MemFree(s->weights[i].scale);
            cu->MemFree(s->weights[i].global);
        }
        for (int i = 0; s->params && i < s->graph->tensors.n; i++)
            cu->MemFree(s->params[i]);
        cu->MemFree(s->arena);
        cu->MemFree(s->quant_scratch);
        cu->MemFree(s->input_scales);
        if (s->stream)
            cu->StreamDestroy(s->stream);
        cu->DevicePrimaryCtxRelease(s->dev);
    }
    free(s->execs);
    for (int p = 0; s->launches && p < s->build.n_programs; p++)
        free(s->launches[p]);
    for (int p = 0; s->maps && p < s->build.n_programs; p++)
        free(s->maps[p]);
    free(s->maps);
    free(s->launches);
    free(s->kernels);
    free(s->weights);
    free(s->params);
    free(s->staging);
    for (int e = 0; s->entries && e < s->n_entries; e++) {
        for (int p = 0; s->entries[e].steps && p < s->build.n_programs; p++)
            free(s->entries[e].steps[p]);
        free(s->entries[e].steps);
        free(s->entries[e].n_steps);
        free(s->entries[e].inputs);
    }
    free(s->entries);
    kiln_build_free(&s->build);
    kiln_plan_destroy(s->plan);
    free(s);
}

/* ------------------------------------------------------------ entries */

/* The value of tensor t in program bk: its index, or -1. */
static int value_index(const kiln_program *bk, const kiln_tensor *t)
{
    for (int i = 0; i < bk->n_values; i++)
        if (bk->values[i].tensor == t)
            return i;
    return -1;
}

/* Entry e's steps in program p: those whose results its output depends
 * on, found from the last step back. need holds a flag per value. */
static kiln_status entry_steps(kiln_session *s, session_entry *e, int p, char *need)
{
    const kiln_program *bk = &s->build.programs[p];
    memset(need, 0, (size_t)bk->n_values);
    int out = value_index(bk, e->output), n = 0;
    if (out < 0)
        return kiln_fail(KILN_ERR_STATE, "session: output %s has no value in bucket %lld",
                         e->output->name, (long long)bk->m);
    need[out] = 1;
    int *steps = kiln_malloc(((size_t)bk->n_steps + 1) * sizeof *steps);
    if (!steps)
        return kiln_fail(KILN_ERR_NOMEM, "session: out of memory for the entry points");
    for (int i = bk->n_steps - 1; i >= 0; i--) {
        const kiln_step *st = &bk->steps[i];
        if (st->dst < 0 || !need[st->dst])
            continue;
        steps[n++] = i;
        for (int j = 0; j < KILN_STEP_MAX_SRC; j++)
            if (st->src[j] >= 0)
                need[st->src[j]] = 1;
    }
    for (int i = 0; i < n / 2; i++) { /* into stream order */
        int t = steps[i];
        steps[i] = steps[n - 1 - i];
        steps[n - 1 - i] = t;
    }
    e->steps[p] = steps;
    e->n_steps[p] = n;
    return KILN_OK;
}

/* One entry per graph output: the inputs it reads (through the graph's
 * edges, so the same in every bucket) and its steps in each program. */
static kiln_status entries_create(kiln_session *s)
{
    const kiln_graph *g = s->graph;
    int max_values = 1;
    for (int p = 0; p < s->build.n_programs; p++)
        if (s->build.programs[p].n_values > max_values)
            max_values = s->build.programs[p].n_values;
    s->entries = kiln_calloc((size_t)g->outputs.n + 1, sizeof *s->entries);
    char *need_t = kiln_calloc((size_t)g->tensors.n + 1, 1), *need_v = kiln_malloc((size_t)max_values);
    kiln_status st = s->entries && need_t && need_v
                         ? KILN_OK
                         : kiln_fail(KILN_ERR_NOMEM, "session: out of memory for the entry points");
    if (st == KILN_OK)
        s->n_entries = g->outputs.n;
    for (int i = 0; st == KILN_OK && i < s->n_entries; i++) {
        session_entry *e = &s->entries[i];
        e->output = g->outputs.v[i];
        memset(need_t, 0, (size_t)g->tensors.n);
        need_t[e->output->id] = 1;
        for (int t = g->tensors.n - 1; t >= 0; t--) { /* sources come first */
            const kiln_tensor *x = g->tensors.v[t];
            for (int j = 0; need_t[x->id] && j < KILN_MAX_SRC; j++)
                if (x->src[j])
                    need_t[x->src[j]->id] = 1;
        }
        e->inputs = kiln_malloc(((size_t)g->inputs.n + 1) * sizeof *e->inputs);
        e->steps = kiln_calloc((size_t)s->build.n_programs, sizeof *e->steps);
        e->n_steps = kiln_calloc((size_t)s->build.n_programs, sizeof *e->n_steps);
        if (!e->inputs || !e->steps || !e->n_steps) {
            st = kiln_fail(KILN_ERR_NOMEM, "session: out of memory for the entry points");
            break;
        }
        for (int j = 0; j < g->inputs.n; j++)
            if (need_t[g->inputs.v[j]->id])
                e->inputs[e->n_inputs++] = j;
        for (int p = 0; st == KILN_OK && p < s->build.n_programs; p++)
            st = entry_steps(s, e, p, need_v);
    }
    free(need_t);
    free(need_v);
    return st;
}

static kiln_status session_init(kiln_session *s, const kiln_session_options *o)
{
    kiln_target t;
    kiln_status st = kiln_cu_target(s->cu, o->device, &t, s->stats.device,
                                    sizeof s->stats.device);
    if (st != KILN_OK)
        return st;
    snprintf(s->stats.target, sizeof s->stats.target, "%s", t.name);
    kiln_env env;
    kiln_env_read(&env);
    if (o->target && !kiln_target_loads(&t, o->target))
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "device %d (%s, %s) cannot load cubins built for %s (a cubin loads on "
                         "its architecture's major version at an equal or newer minor, an "
                         "\"a\" one on its own architecture only); plan for %s",
                         o->device, s->stats.device, t.name, o->target->name, t.name);
    if (o->target)
        t = *o->target;
    s->target = t;
    CU(s->cu->DeviceGet(&s->dev, o->device), "cuDeviceGet");
    if ((st = kiln_cu_caps(s->cu, s->dev, &s->caps)))
        return kiln_fail_prefix(st, "device %d", o->device);
    if (env.serial || s->cu->version < 12030)
        s->caps.sm_count = 0;
    CU(s->cu->DevicePrimaryCtxRetain(&s->ctx, s->dev), "cuDevicePrimaryCtxRetain");
    CU(s->cu->CtxSetCurrent(s->ctx), "cuCtxSetCurrent");
    CU(s->cu->StreamCreate(&s->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");

    /* The cache first: the plan takes its tuning table. */
    double t0 = kiln_now();
    kiln_cache *cache;
    kiln_cache_options co = o->cache;
    if (!co.on_corrupt)
        co.on_corrupt = on_corrupt;
    kiln_build_options bo = { .offline = o->cache.offline || env.offline,
                              .quiet = o->quiet };
    if ((st = kiln_cache_open(&co, &cache)))
        return st;
    double open_s = kiln_now() - t0;

    t0 = kiln_now();
    if ((st = kiln_plan_create_cached(s->graph, &t, &o->plan, cache, &s->plan))) {
        kiln_cache_close(cache);
        return st;
    }
    s->stats.plan_s = kiln_now() - t0;

    t0 = kiln_now() - open_s;
    st = kiln_build_plan(s->plan, cache, &bo, &s->build);
    kiln_cache_close(cache);
    if (st != KILN_OK)
        return st;
    s->stats.kernels = s->build.n;
    s->stats.cached = s->build.cached;
    s->stats.compiled = s->build.compiled;
    s->stats.compile_s = s->build.compile_seconds;
    s->stats.cache_s = kiln_now() - t0 - s->stats.compile_s;

    t0 = kiln_now();
    if ((st = launches_create(s)) || (st = kernels_load(s)))
        return st;
    s->stats.module_s = kiln_now() - t0;

    t0 = kiln_now();
    if ((st = weights_create(s)))
        return st;
    size_t arena = 0, staging = 0;
    int max_steps = 0;
    const int64_t max_m = s->build.programs[s->build.n_programs - 1].m;
    for (int b = 0; b < s->build.n_programs; b++) {
        const kiln_program *bk = &s->build.programs[b];
        if (bk->arena_bytes > arena)
            arena = bk->arena_bytes;
        if (bk->n_steps > max_steps)
            max_steps = bk->n_steps;
    }
    for (int i = 0; i < s->graph->tensors.n; i++) {
        const kiln_tensor *x = s->graph->tensors.v[i];
        size_t rows = (size_t)max_m * (size_t)x->ne[0];
        if ((x->op == KILN_OP_INPUT || x->is_output) && rows > staging)
            staging = rows;
    }
    s->stats.arena_bytes = arena;
    CU(s->cu->MemAlloc(&s->arena, arena ? arena : 1), "activation arena");
    CU(s->cu->MemsetD8(s->arena, 0, arena ? arena : 1), "activation arena");
    CU(s->cu->StreamSynchronize(s->stream), "weight upload");
    size_t scratch = (size_t)(max_steps + 1) * (1 + KILN_QUANT_AMAX_PARTS) * 4;
    CU(s->cu->MemAlloc(&s->quant_scratch, scratch), "quantization scratch");
    if ((st = input_scales_create(s, max_steps)))
        return st;
    if (!(s->staging = kiln_malloc((staging ? staging : 1) * sizeof *s->staging)))
        return kiln_fail(KILN_ERR_NOMEM, "session: out of memory for the staging buffer");
    s->staging_elems = staging;
    CU(s->cu->CtxSynchronize(), "weight upload");
    s->stats.weights_s = kiln_now() - t0;

    if ((st = maps_create(s)) || (st = entries_create(s)))
        return st;

    t0 = kiln_now();
    if (!s->eager && (st = graphs_create(s)))
        return st;
    s->stats.graphs_s = kiln_now() - t0;
    return KILN_OK;
}

kiln_status kiln_session_create(kiln_graph *g, const kiln_session_options *opts,
                                kiln_session **out)
{
    if (!g || !out)
        return kiln_fail(KILN_ERR_INVALID_ARG, "session: graph and out are required");
    const kiln_session_options defaults = { 0 };
    const kiln_session_options *o = opts ? opts : &defaults;
    const kiln_cu *cu;
    kiln_status st = kiln_cu_get(&cu);
    if (st != KILN_OK)
        return st;
    kiln_session *s = kiln_calloc(1, sizeof *s);
    if (!s)
        return kiln_fail(KILN_ERR_NOMEM, "session: out of memory");
    s->cu = cu;
    s->graph = g;
    s->eager = o->eager;
    s->quiet = o->quiet;
    if ((st = session_init(s, o)) != KILN_OK) {
        kiln_session_destroy(s);
        return st;
    }
    *out = s;
    return KILN_OK;
}

/* ------------------------------------------------------------ run */

static const kiln_value *value_of_tensor(const kiln_program *bk, const kiln_tensor *t)
{
    int i = value_index(bk, t);
    return i < 0 ? NULL : &bk->values[i];
}

/* The bucket a run of m tokens replays, in *b; refusals for a run without
 * its arrays or past the session's buckets. */
static kiln_status run_bucket(const kiln_session *s, int64_t m, const void *inputs,
                              const void *outputs, int *b)
{
    if (!s || !inputs || !outputs)
        return kiln_fail(KILN_ERR_INVALID_ARG, "session run: inputs and outputs are required");
    *b = m >= 1 ? kiln_plan_bucket_for(s->plan, m) : -1;
    if (*b < 0)
        return kiln_fail(KILN_ERR_SHAPE, "session run: %lld tokens; the session serves 1 to %lld",
                         (long long)m, (long long)s->build.programs[s->build.n_programs - 1].m);
    return KILN_OK;
}

kiln_status kiln_session_run(kiln_session *s, int64_t m, const float *const *inputs,
                             float *const *outputs)
{
    int b = -1;
    kiln_status st = run_bucket(s, m, inputs, outputs, &b);
    if (st != KILN_OK)
        return st;
    const kiln_program *bk = &s->build.programs[b];
    kiln_graph *g = s->graph;
    CU(s->cu->CtxSetCurrent(s->ctx), "cuCtxSetCurrent");
    /* Rows past m are zero, so padding never feeds a per-tensor statistic. */
    for (int i = 0; i < g->inputs.n; i++) {
        const kiln_tensor *x = g->inputs.v[i];
        const kiln_value *v = value_of_tensor(bk, x);
        if (!v)
            continue;
        size_t n = (size_t)m * (size_t)x->ne[0], all = (size_t)bk->m * (size_t)x->ne[0];
        for (size_t j = 0; j < n; j++)
            s->staging[j] = kiln_f32_to_bf16(inputs[i][j]);
        memset(s->staging + n, 0, (all - n) * sizeof *s->staging);
        CU(s->cu->MemcpyHtoDAsync(s->arena + v->offset, s->staging, all * sizeof *s->staging,
                                  s->stream), x->name);
        /* the staging rows are refilled for the next input */
        CU(s->cu->StreamSynchronize(s->stream), x->name);
    }
    st = replay(s, b, s->stream);
    if (st != KILN_OK)
        return st;
    CU(s->cu->StreamSynchronize(s->stream), "run");
    for (int i = 0; i < g->outputs.n; i++) {
        const kiln_tensor *y = g->outputs.v[i];
        const kiln_value *v = value_of_tensor(bk, y);
        size_t n = (size_t)m * (size_t)y->ne[0];
        CU(s->cu->MemcpyDtoHAsync(s->staging, s->arena + v->offset, n * sizeof *s->staging,
                                  s->stream), y->name);
        CU(s->cu->StreamSynchronize(s->stream), y->name);
        for (size_t j = 0; j < n; j++)
            outputs[i][j] = kiln_bf16_to_f32(s->staging[j]);
    }
    return KILN_OK;
}

/* Rows of width BF16 elements between a caller's matrix and the arena;
 * into the arena when to_arena. */
static kiln_status copy_rows(kiln_session *s, const kiln_device_matrix *d, CUdeviceptr arena,
                             int64_t m, int64_t width, int to_arena, CUstream stream,
                             const char *name)
{
    size_t row = (size_t)width * 2, pitch = (size_t)(d->stride ? d->stride : width) * 2;
    CUDA_MEMCPY2D c = {
        .srcMemoryType = CU_MEMORYTYPE_DEVICE, .dstMemoryType = CU_MEMORYTYPE_DEVICE,
        .srcDevice = to_arena ? (CUdeviceptr)d->ptr : arena, .srcPitch = to_arena ? pitch : row,
        .dstDevice = to_arena ? arena : (CUdeviceptr)d->ptr, .dstPitch = to_arena ? row : pitch,
        .WidthInBytes = row, .Height = (size_t)m,
    };
    CU(s->cu->Memcpy2DAsync(&c, stream), name);
    return KILN_OK;
}

static kiln_status check_matrix(const kiln_device_matrix *d, const kiln_tensor *t,
                                const char *what)
{
    int64_t width = t->ne[0];
    if (!d->ptr)
        return kiln_fail(KILN_ERR_INVALID_ARG, "session run: %s %s: no device pointer", what,
                         t->name);
    if (d->ptr % 2 || (d->stride && d->stride < width) || d->stride < 0 ||
        d->stride > INT64_MAX / 2)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "session run: %s %s: pointer 0x%llx with a stride of %lld elements; "
                         "BF16 rows of %lld want an even address and a stride of 0 or at least "
                         "%lld", what, t->name, (unsigned long long)d->ptr, (long long)d->stride,
                         (long long)width, (long long)width);
    return KILN_OK;
}

/* m rows of input x from d into bucket bk's arena, on stream on; the rows
 * past m zeroed, so padding never feeds a per-tensor statistic. */
static kiln_status copy_in(kiln_session *s, const kiln_program *bk, const kiln_tensor *x,
                           const kiln_device_matrix *d, int64_t m, CUstream on)
{
    const kiln_value *v = value_of_tensor(bk, x);
    if (!v)
        return KILN_OK;
    kiln_status st = copy_rows(s, d, s->arena + v->offset, m, x->ne[0], 1, on, x->name);
    if (st != KILN_OK)
        return st;
    size_t row = (size_t)x->ne[0] * 2;
    if (m < bk->m)
        CU(s->cu->MemsetD8Async(s->arena + v->offset + (size_t)m * row, 0,
                                (size_t)(bk->m - m) * row, on),
           x->name);
    return KILN_OK;
}

kiln_status kiln_session_run_device(kiln_session *s, int64_t m, const kiln_device_matrix *inputs,
                                    const kiln_device_matrix *outputs, void *stream)
{
    int b = -1;
    kiln_status st = run_bucket(s, m, inputs, outputs, &b);
    if (st != KILN_OK)
        return st;
    const kiln_program *bk = &s->build.programs[b];
    kiln_graph *g = s->graph;
    for (int i = 0; i < g->inputs.n; i++) {
        st = check_matrix(&inputs[i], g->inputs.v[i], "input");
        if (st != KILN_OK)
            return st;
    }
    for (int i = 0; i < g->outputs.n; i++) {
        st = check_matrix(&outputs[i], g->outputs.v[i], "output");
        if (st != KILN_OK)
            return st;
    }
    CUstream on = (CUstream)stream;
    CU(s->cu->CtxSetCurrent(s->ctx), "cuCtxSetCurrent");
    for (int i = 0; i < g->inputs.n; i++)
        if ((st = copy_in(s, bk, g->inputs.v[i], &inputs[i], m, on)) != KILN_OK)
            return st;
    st = replay(s, b, on);
    if (st != KILN_OK)
        return st;
    for (int i = 0; i < g->outputs.n; i++) {
        const kiln_tensor *y = g->outputs.v[i];
        const kiln_value *v = value_of_tensor(bk, y);
        st = copy_rows(s, &outputs[i], s->arena + v->offset, m, y->ne[0], 0, on, y->name);
        if (st != KILN_OK)
            return st;
    }
    return KILN_OK;
}

int kiln_session_n_entries(const kiln_session *s)
{
    return s ? s->n_entries : 0;
}

kiln_status kiln_session_entry(const kiln_session *s, int i, kiln_entry_info *out)
{
    if (!s || !out || i < 0 || i >= s->n_entries)
        return kiln_fail(KILN_ERR_INVALID_ARG, "session entry %d: the session has %d", i,
                         s ? s->n_entries : 0);
    const session_entry *e = &s->entries[i];
    *out = (kiln_entry_info){ .name = e->output->name, .width = e->output->ne[0],
                              .inputs = e->inputs, .n_inputs = e->n_inputs };
    return KILN_OK;
}

kiln_status kiln_session_find_entry(const kiln_session *s, const char *name, int *i)
{
    if (!s || !name || !i)
        return kiln_fail(KILN_ERR_INVALID_ARG, "session find entry: session, name and i are required");
    for (int j = 0; j < s->n_entries; j++)
        if (!strcmp(s->entries[j].output->name, name)) {
            *i = j;
            return KILN_OK;
        }
    return kiln_fail(KILN_ERR_NOT_FOUND,
                     "session: no entry \"%s\": the entries are the graph's %d outputs (the first "
                     "\"%s\")",
                     name, s->n_entries, s->n_entries ? s->entries[0].output->name : "");
}

kiln_status kiln_session_run_entry(kiln_session *s, int entry, int64_t m,
                                   const kiln_device_matrix *inputs,
                                   const kiln_device_matrix *output, void *stream)
{
    if (!s || entry < 0 || entry >= s->n_entries || !output ||
        (!inputs && s->entries[entry].n_inputs))
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "session run entry %d: a session, an entry below %d, its inputs and "
                         "its output are required",
                         entry, s ? s->n_entries : 0);
    const session_entry *e = &s->entries[entry];
    int b = m >= 1 ? kiln_plan_bucket_for(s->plan, m) : -1;
    if (b < 0)
        return kiln_fail(KILN_ERR_SHAPE,
                         "session run entry %s: %lld tokens; the session serves 1 to %lld",
                         e->output->name, (long long)m,
                         (long long)s->build.programs[s->build.n_programs - 1].m);
    const kiln_program *bk = &s->build.programs[b];
    const kiln_graph *g = s->graph;
    kiln_status st;
    for (int j = 0; j < e->n_inputs; j++)
        if ((st = check_matrix(&inputs[j], g->inputs.v[e->inputs[j]], "input")) != KILN_OK)
            return st;
    if ((st = check_matrix(output, e->output, "output")) != KILN_OK)
        return st;
    CUstream on = (CUstream)stream;
    CU(s->cu->CtxSetCurrent(s->ctx), "cuCtxSetCurrent");
    for (int j = 0; j < e->n_inputs; j++)
        if ((st = copy_in(s, bk, g->inputs.v[e->inputs[j]], &inputs[j], m, on)) != KILN_OK)
            return st;
    for (int k = 0; k < e->n_steps[b]; k++) {
        const int si = e->steps[b][k];
        if ((st = launch_step(s, b, si, on)) != KILN_OK)
            return kiln_fail_prefix(st, "entry %s, bucket %lld, step %d (%s)", e->output->name,
                                    (long long)bk->m, si,
                                    bk->steps[si].node ? bk->steps[si].node->name : "?");
    }
    const kiln_value *v = value_of_tensor(bk, e->output);
    return copy_rows(s, output, s->arena + v->offset, m, e->output->ne[0], 0, on,
                     e->output->name);
}

const kiln_plan *kiln_session_plan(const kiln_session *s) { return s ? s->plan : NULL; }

void kiln_session_get_stats(const kiln_session *s, kiln_session_stats *out) { *out = s->stats; }

/* ------------------------------------------------------------ bench */

static kiln_status bench_replays(kiln_session *s, int b, int replays, CUevent start, CUevent stop)
{
    CU(s->cu->EventRecord(start, s->stream), "cuEventRecord");
    for (int i = 0; i < replays; i++) {
        kiln_status st = replay(s, b, s->stream);
        if (st != KILN_OK)
            return st;
    }
    CU(s->cu->EventRecord(stop, s->stream), "cuEventRecord");
    CU(s->cu->EventSynchronize(stop), "cuEventSynchronize");
    return KILN_OK;
}

/* Steps of bucket b launched one by one, an event recorded after each
 * (ev[0] before the first), reps times; sum[i] += each step's
 * milliseconds. */
static kiln_status profile_runs(kiln_session *s, int b, int reps, CUevent *ev, double *sum)
{
    const kiln_program *bk = &s->build.programs[b];
    for (int r = 0; r < reps; r++) {
        CU(s->cu->EventRecord(ev[0], s->stream), "cuEventRecord");
        for (int i = 0; i < bk->n_steps; i++) {
            kiln_status st = launch_step(s, b, i, s->stream);
            if (st != KILN_OK)
                return kiln_fail_prefix(st, "step %d (%s)", i,
                                        bk->steps[i].node ? bk->steps[i].node->name : "?");
            CU(s->cu->EventRecord(ev[i + 1], s->stream), "cuEventRecord");
        }
        CU(s->cu->EventSynchronize(ev[bk->n_steps]), "cuEventSynchronize");
        for (int i = 0; i < bk->n_steps; i++) {
            float ms = 0;
            CU(s->cu->EventElapsedTime(&ms, ev[i], ev[i + 1]), "cuEventElapsedTime");
            sum[i] += ms;
        }
    }
    return KILN_OK;
}

kiln_status kiln_session_profile(kiln_session *s, int64_t m, int reps, kiln_step_time *out,
                                 int cap, int *n)
{
    if (!s || !n || reps < 1 || cap < 0 || (cap > 0 && !out))
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "session profile: a session, out for cap steps, n and reps >= 1 are "
                         "required");
    int b = m >= 1 ? kiln_plan_bucket_for(s->plan, m) : -1;
    if (b < 0)
        return kiln_fail(KILN_ERR_SHAPE,
                         "session profile: %lld tokens; the session serves 1 to %lld",
                         (long long)m, (long long)s->build.programs[s->build.n_programs - 1].m);
    const kiln_program *bk = &s->build.programs[b];
    *n = bk->n_steps;
    if (bk->n_steps > cap)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "session profile: bucket %lld has %d steps, out holds %d",
                         (long long)bk->m, bk->n_steps, cap);
    CU(s->cu->CtxSetCurrent(s->ctx), "cuCtxSetCurrent");
    CUevent *ev = kiln_calloc((size_t)bk->n_steps + 1, sizeof *ev);
    double *sum = kiln_calloc((size_t)bk->n_steps + 1, sizeof *sum);
    kiln_status st = ev && sum ? KILN_OK
                               : kiln_fail(KILN_ERR_NOMEM, "session profile: out of memory");
    for (int i = 0; st == KILN_OK && i <= bk->n_steps; i++)
        st = kiln_cu_check(s->cu, s->cu->EventCreate(&ev[i], CU_EVENT_DEFAULT), "cuEventCreate");
    if (st == KILN_OK)
        st = profile_runs(s, b, reps, ev, sum);
    for (int i = 0; st == KILN_OK && i < bk->n_steps; i++) {
        const kiln_step *stp = &bk->steps[i];
        out[i] = (kiln_step_time){ .node = stp->node ? stp->node->name : "?",
                                   .kernel = s->build.kernels[stp->signature].signature,
                                   .us = sum[i] * 1000.0 / reps };
    }
    for (int i = 0; ev && i <= bk->n_steps; i++)
        if (ev[i])
            s->cu->EventDestroy(ev[i]);
    free(ev);
    free(sum);
    if (st != KILN_OK)
        return kiln_fail_prefix(st, "session profile, bucket %lld", (long long)bk->m);
    return KILN_OK;
}

kiln_status kiln_session_bench(kiln_session *s, int64_t m, int replays, float *us)
{
    if (!s || !us || replays < 1)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "session bench: a session, an out-parameter and replays >= 1 are required");
    int b = m >= 1 ? kiln_plan_bucket_for(s->plan, m) : -1;
    if (b < 0)
        return kiln_fail(KILN_ERR_SHAPE, "session bench: %lld tokens; the session serves 1 to %lld",
                         (long long)m, (long long)s->build.programs[s->build.n_programs - 1].m);
    CU(s->cu->CtxSetCurrent(s->ctx), "cuCtxSetCurrent");
    CUevent start = NULL, stop = NULL;
    kiln_status st = kiln_cu_check(s->cu, s->cu->EventCreate(&start, CU_EVENT_DEFAULT),
                                   "cuEventCreate");
    if (st == KILN_OK)
        st = kiln_cu_check(s->cu, s->cu->EventCreate(&stop, CU_EVENT_DEFAULT), "cuEventCreate");
    if (st == KILN_OK)
        st = bench_replays(s, b, replays, start, stop);
    float ms = 0;
    if (st == KILN_OK)
        st = kiln_cu_check(s->cu, s->cu->EventElapsedTime(&ms, start, stop), "cuEventElapsedTime");
    if (start)
        s->cu->EventDestroy(start);
    if (stop)
        s->cu->EventDestroy(stop);
    if (st != KILN_OK)
        return kiln_fail_prefix(st, "session bench, bucket %lld",
                                (long long)s->build.programs[b].m);
    *us = ms * 1000.0f / (float)replays;
    return KILN_OK;
}
