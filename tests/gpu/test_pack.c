/* The device packers (kiln/pack.cuh): for every format with a packed
 * layout, the kernel compiled from its "pack" signature writes, from the
 * weight in kiln's storage layout, exactly the bytes the host packer
 * (kernels/gemv/pack.c) writes: every byte of both arrays (the output
 * starts as 0xAB), with ragged row tiles, a grid smaller than the work,
 * and fresh random weights. The values a layout cannot carry are found at
 * the index the host packer names, and a session that packs on the device
 * refuses such a weight with the host packer's message. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/emit.h"
#include "codegen/nvrtc.h"
#include "gpuutil.h"
#include "kernels/common/kiln_args.h"
#include "kernels/gemv/pack.h"
#include "runtime/driver.h"

typedef struct packer {
    const kiln_cu *cu;
    CUdevice dev;
    CUcontext ctx;
    kiln_target t; /* the live device's */
    kiln_nvrtc *nv;
    CUmodule module;
    CUfunction fn;
} packer;

/* The device's primary context current, its target and NVRTC. */
static void device_open(packer *p)
{
    kt_need_gpu();
    cr_assert_eq(kiln_cu_get(&p->cu), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(p->cu->Init(0), CUDA_SUCCESS);
    cr_assert_eq(p->cu->DeviceGet(&p->dev, 0), CUDA_SUCCESS);
    cr_assert_eq(p->cu->DevicePrimaryCtxRetain(&p->ctx, p->dev), CUDA_SUCCESS);
    cr_assert_eq(p->cu->CtxSetCurrent(p->ctx), CUDA_SUCCESS);
    cr_assert_eq(kiln_target_live(0, &p->t), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_nvrtc_open(&p->nv), KILN_OK, "%s", kiln_last_error());
}

static void device_close(packer *p)
{
    kiln_nvrtc_close(p->nv);
    p->cu->DevicePrimaryCtxRelease(p->dev);
}

/* Format f's packer, compiled for the live device. */
static void packer_load(packer *p, kiln_format f)
{
    kiln_nvrtc *nv = p->nv;
    const kiln_target *t = &p->t;
    char sig[128];
    snprintf(sig, sizeof sig, "pack format=%s target=%s", kiln_format_get(f)->name, t->name);
    kiln_kernel_source src;
    cr_assert_eq(kiln_emit_text(kiln_registry_default(), sig, &src), KILN_OK, "%s",
                 kiln_last_error());
    kiln_compile_job job = { .name = sig, .entry = src.desc.entry, .source = src.text,
                             .target = &src.desc.target };
    cr_assert_eq(kiln_nvrtc_compile(nv, &job, NULL), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(p->cu->ModuleLoadData(&p->module, job.cubin), CUDA_SUCCESS, "%s", sig);
    cr_assert_eq(p->cu->ModuleGetFunction(&p->fn, p->module, src.desc.entry), CUDA_SUCCESS);
    kiln_compile_job_reset(&job);
    kiln_kernel_source_free(&src);
}

static CUdeviceptr upload(const kiln_cu *cu, const void *host, size_t bytes)
{
    CUdeviceptr d = 0;
    cr_assert_eq(cu->MemAlloc(&d, bytes ? bytes : 1), CUDA_SUCCESS);
    if (bytes)
        cr_assert_eq(cu->MemcpyHtoD(d, host, bytes), CUDA_SUCCESS);
    return d;
}

/* q packed on the device with `blocks` blocks: the packed bytes (data,
 * then scale) into out, and the first refused index (UINT64_MAX: none). */
static uint64_t device_pack(packer *p, const kiln_qtensor *q, unsigned blocks, uint8_t *out,
                            size_t pd, size_t ps)
{
    const kiln_cu *cu = p->cu;
    size_t data, scale;
    cr_assert_eq(kiln_format_data_bytes(q->format, q->n, q->k, &data), KILN_OK);
    cr_assert_eq(kiln_qtensor_scale_bytes(q, &scale), KILN_OK);
    CUdeviceptr w = upload(cu, q->data, data), ws = upload(cu, q->scale, scale);
    CUdeviceptr o, bad;
    cr_assert_eq(cu->MemAlloc(&o, pd + ps + 1), CUDA_SUCCESS);
    cr_assert_eq(cu->MemsetD8(o, 0xAB, pd + ps + 1), CUDA_SUCCESS);
    cr_assert_eq(cu->MemAlloc(&bad, 8), CUDA_SUCCESS);
    cr_assert_eq(cu->MemsetD8(bad, 0xFF, 8), CUDA_SUCCESS);
    kiln_pack_args a = { .w = (const void *)w, .w_scale = (const void *)ws, .out = (void *)o,
                         .out_scale = (void *)(o + pd), .n = q->n, .k = q->k,
                         .scale_bytes = (long long)(ps < scale ? ps : scale),
                         .bad = (unsigned long long *)bad };
    void *params[] = { &a };
    CUlaunchConfig lc = { .gridDimX = blocks, .gridDimY = 1, .gridDimZ = 1,
                          .blockDimX = KILN_PACK_THREADS, .blockDimY = 1, .blockDimZ = 1 };
    cr_assert_eq(cu->LaunchKernelEx(&lc, p->fn, params, NULL), CUDA_SUCCESS);
    cr_assert_eq(cu->CtxSynchronize(), CUDA_SUCCESS);
    cr_assert_eq(cu->MemcpyDtoH(out, o, pd + ps + 1), CUDA_SUCCESS);
    uint64_t first;
    cr_assert_eq(cu->MemcpyDtoH(&first, bad, 8), CUDA_SUCCESS);
    cr_assert_eq(out[pd + ps], 0xAB, "the packer wrote past its arrays");
    cu->MemFree(w), cu->MemFree(ws), cu->MemFree(o), cu->MemFree(bad);
    return first;
}

Test(gpu_pack, every_format_as_the_host_packs_it, .timeout = 600)
{
    packer p;
    device_open(&p);
    kt_rng r = kt_rng_new(41);
    /* ragged last tiles (200, 37), one row, an 8200-row weight over a
     * grid of 3 blocks */
    static const int64_t shapes[][2] = { { 200, 512 }, { 37, 768 }, { 1, 256 }, { 8200, 256 } };
    static const unsigned grids[] = { 4096, 7, 1, 3 };
    int formats = 0;
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        if (!kiln_gemv_tc_format_get((kiln_format)f))
            continue;
        packer_load(&p, (kiln_format)f);
        formats++;
        for (size_t s = 0; s < KILN_ARRAY_LEN(shapes); s++) {
            kt_weight w;
            kt_weight_make(&w, &r, (kiln_format)f, shapes[s][0], shapes[s][1]);
            size_t pd, ps;
            cr_assert_eq(kiln_gemv_pack_bytes(w.q.format, w.q.n, w.q.k, &pd, &ps), KILN_OK);
            uint8_t *want = malloc(pd + ps + 1), *got = malloc(pd + ps + 1);
            cr_assert(want && got);
            cr_assert_eq(kiln_gemv_pack(&w.q, want, want + pd), KILN_OK, "%s",
                         kiln_last_error());
            uint64_t first = device_pack(&p, &w.q, grids[s], got, pd, ps);
            cr_assert_eq(first, UINT64_MAX, "%s: value %llu refused",
                         kiln_format_get((kiln_format)f)->name, (unsigned long long)first);
            for (size_t i = 0; i < pd + ps; i++)
                cr_assert_eq(got[i], want[i], "%s [%lld, %lld]: %s byte %zu: 0x%02x, want 0x%02x",
                             kiln_format_get((kiln_format)f)->name, (long long)w.q.n,
                             (long long)w.q.k, i < pd ? "data" : "scale", i < pd ? i : i - pd,
                             got[i], want[i]);
            free(want);
            free(got);
            kt_weight_free(&w);
        }
        fprintf(stderr, "pack %-12s %zu shapes: every byte as the host packs it\n",
                kiln_format_get((kiln_format)f)->name, KILN_ARRAY_LEN(shapes));
        p.cu->ModuleUnload(p.module);
    }
    cr_assert_eq(formats, 13);
    device_close(&p);
}

/* A value the layout cannot carry, put at (row 3, K 70) and again later:
 * the device packer reports the first, where the host packer refuses it. */
Test(gpu_pack, refused_values_are_found_where_the_host_finds_them, .timeout = 300)
{
    packer p;
    device_open(&p);
    kt_rng r = kt_rng_new(43);
    static const struct {
        kiln_format f;
        unsigned bits;
    } cases[] = { { KILN_FMT_F16, 0x7C00 }, { KILN_FMT_F16, 0x7E01 },
                  { KILN_FMT_FP8_TENSOR, 0x7F }, { KILN_FMT_MXFP8, 0xFF },
                  { KILN_FMT_NVFP4, 0x7F } };
    enum { N = 40, K = 256, ROW = 3, COL = 70 };
    for (size_t c = 0; c < KILN_ARRAY_LEN(cases); c++) {
        kt_weight w;
        kt_weight_make(&w, &r, cases[c].f, N, K);
        uint8_t *d = (uint8_t *)w.q.data;
        size_t at = (size_t)ROW * K + COL, later = (size_t)(N - 1) * K + 5;
        if (cases[c].f == KILN_FMT_NVFP4) {
            uint8_t *sc = (uint8_t *)w.q.scale;
            sc[at / 16] = sc[later / 16] = (uint8_t)cases[c].bits;
            at /= 16;
        } else if (cases[c].f == KILN_FMT_F16) {
            d[2 * at] = d[2 * later] = (uint8_t)cases[c].bits;
            d[2 * at + 1] = d[2 * later + 1] = (uint8_t)(cases[c].bits >> 8);
        } else {
            d[at] = d[later] = (uint8_t)cases[c].bits;
        }
        size_t pd, ps;
        cr_assert_eq(kiln_gemv_pack_bytes(w.q.format, N, K, &pd, &ps), KILN_OK);
        uint8_t *buf = malloc(pd + ps + 1);
        cr_assert_eq(kiln_gemv_pack(&w.q, buf, buf + pd), KILN_ERR_MALFORMED);
        char host[512];
        snprintf(host, sizeof host, "%s", kiln_last_error());
        packer_load(&p, cases[c].f);
        uint64_t first = device_pack(&p, &w.q, 5, buf, pd, ps);
        cr_assert_eq(first, (uint64_t)at, "%s: first refused %llu, want %zu",
                     kiln_format_get(cases[c].f)->name, (unsigned long long)first, at);
        kiln_gemv_pack_refusal(cases[c].f, K, (int64_t)first,
                               cases[c].f == KILN_FMT_F16 ? cases[c].bits : 0);
        cr_assert_str_eq(kiln_last_error(), host);
        p.cu->ModuleUnload(p.module);
        free(buf);
        kt_weight_free(&w);
    }
    device_close(&p);
}

/* A session packing on the device and one packing on the host run the
 * same kernels on the same weights: their outputs are equal bit for bit,
 * at a decode bucket (the packers read a scratch copy) and with a
 * prefill bucket too (they read the copy the prefill kernels keep). A
 * weight with a NaN is refused by the device packers as by the host's. */
Test(gpu_pack, sessions_packed_on_the_device_run_as_packed_on_the_host, .timeout = 600)
{
    kt_need_gpu();
    char cache[512];
    kt_fresh_cache(cache, sizeof cache);
    kt_rng r = kt_rng_new(47);
    static const int64_t decode[] = { 1, 16 }, both[] = { 1, 16, 64 };
    static const kiln_format formats[] = { KILN_FMT_BF16, KILN_FMT_FP8_BLOCK, KILN_FMT_NVFP4,
                                           KILN_FMT_Q4_K, KILN_FMT_Q6_K };
    enum { N = 8200, K = 512, M = 16 };
    static float x[M * K], y_host[M * N], y_dev[M * N];
    kt_fill_normal(&r, x, M * K, 1.0f);
    for (size_t f = 0; f < KILN_ARRAY_LEN(formats); f++)
        for (int b = 0; b < 2; b++) {
            kt_weight w;
            kt_weight_make(&w, &r, formats[f], N, K);
            kiln_graph *g = kt_linear_graph(&w);
            kiln_session_options o = { .cache.path = cache, .quiet = 1,
                                       .plan = { .capture = b ? both : decode,
                                                 .n_capture = b ? 3 : 2 } };
            const float *in[] = { x };
            float *out_host[] = { y_host }, *out_dev[] = { y_dev };
            setenv("KILN_PACK", "host", 1);
            kiln_session *s = kt_session_create(g, &o);
            kiln_session_stats ss;
            kiln_session_get_stats(s, &ss);
            cr_assert_eq(ss.load_device_packed_bytes, 0);
            cr_assert_eq(kiln_session_run(s, M, in, out_host), KILN_OK, "%s", kiln_last_error());
            kt_session_destroy(s);
            setenv("KILN_PACK", "device", 1);
            s = kt_session_create(g, &o);
            kiln_session_get_stats(s, &ss);
            cr_assert_gt(ss.load_device_packed_bytes, 0);
            cr_assert_eq(ss.load_packed_bytes, 0);
            cr_assert_eq(kiln_session_run(s, M, in, out_dev), KILN_OK, "%s", kiln_last_error());
            kt_session_destroy(s);
            cr_assert_eq(memcmp(y_host, y_dev, sizeof y_host), 0,
                         "%s, buckets %s: device-packed and host-packed sessions differ",
                         kiln_format_get(formats[f])->name, b ? "1,16,64" : "1,16");
            kiln_graph_destroy(g);
            kt_weight_free(&w);
        }
    /* refused on the device as on the host */
    kt_weight w;
    kt_weight_make(&w, &r, KILN_FMT_FP8_TENSOR, 64, 256);
    ((uint8_t *)w.q.data)[3 * 256 + 70] = 0x7F;
    kiln_graph *g = kt_linear_graph(&w);
    kiln_session_options o = { .cache.path = cache, .quiet = 1,
                               .plan = { .capture = decode, .n_capture = 2 } };
    kiln_session *s = NULL;
    setenv("KILN_PACK", "device", 1);
    cr_assert_eq(kiln_session_create(g, &o, &s), KILN_ERR_MALFORMED);
    cr_assert(strstr(kiln_last_error(), "weight w") &&
                  strstr(kiln_last_error(), "fp8 weight (row 3, K 70) is NaN"),
              "%s", kiln_last_error());
    unsetenv("KILN_PACK");
    kiln_graph_destroy(g);
    kt_weight_free(&w);
}
