/* The wgmma_tc backend without a GPU: what it takes and refuses, its tile
 * per bucket, its launch, a plan in which the decode (gemv_tc) and the
 * prefill (wgmma_tc) kernels read one packed copy of each weight behind a
 * bf16-tc quantization step, and every format x tile x epilogue compiling
 * with NVRTC for sm_90a to SASS whose main loop is HGMMA on register
 * operands fed by TMA alone. Running the kernels against the
 * CPU executor is tests/gpu/test_wgmma.c's. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/emit.h"
#include "codegen/nvrtc.h"
#include "codegen/plan.h"
#include "codegen_util.h"
#include "clirun.h"
#include "gpuutil.h"
#include "kernels/gemv/pack.h"
#include "testutil.h"

static const kiln_backend *const wtc = &kiln_backend_wgmma_tc;

static kiln_target target(const char *name)
{
    kiln_target t;
    cr_assert_eq(kiln_target_from_name(name, &t), KILN_OK, "%s", kiln_last_error());
    return t;
}

/* BF16 and FP8 per-tensor and per-channel are not: their packed atoms are
 * row-major, wgmma's TMA kernel's. */
static const kiln_format formats[] = { KILN_FMT_F16,  KILN_FMT_NVFP4, KILN_FMT_MXFP4,
                                       KILN_FMT_GGML_MXFP4, KILN_FMT_Q8_0, KILN_FMT_Q4_0,
                                       KILN_FMT_Q4_K, KILN_FMT_Q6_K, KILN_FMT_MXFP8 };
static const char *const tiles[] = { "bt256", "bt128", "bt64", "bt256s2", "bt128s2", "bt64s2" };

static int taken(kiln_format f)
{
    for (size_t i = 0; i < KILN_ARRAY_LEN(formats); i++)
        if (formats[i] == f)
            return 1;
    return 0;
}

Test(wgmma_tc, takes_the_one_term_formats_on_hopper_only)
{
    kiln_target h = target("h200"), a = target("sm_80");
    char why[256];
    cr_assert_eq(wtc->is_supported(&h, why, sizeof why), 1);
    cr_assert_eq(wtc->is_supported(&a, why, sizeof why), 0);
    cr_assert_str_eq(why, "needs wgmma (sm_90a), target is sm_80");
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        cr_assert_eq(!!(wtc->formats & (1u << f)), taken((kiln_format)f), "%s",
                     kiln_format_get((kiln_format)f)->name);
        kiln_linear_cfg c = { .format = (kiln_format)f, .n = 4096, .k = 4096 };
        if (kiln_format_get((kiln_format)f)->grouped)
            c.group = 128;
        int ok = wtc->can_implement(&h, &c, 512, why, sizeof why);
        cr_assert_eq(ok, taken((kiln_format)f), "%s: %s", kiln_format_get((kiln_format)f)->name,
                     why);
        if (!ok)
            cr_assert(strstr(why, "no one-term BF16 decoding"), "%s", why);
        else
            cr_assert_eq(kiln_backend_act(wtc, &h, &c, 512), KILN_ACT_BF16_TC);
    }
}

Test(wgmma_tc, refuses_shapes_the_packed_layout_does_not_hold)
{
    kiln_target h = target("h100");
    char why[256];
    kiln_linear_cfg c = { .format = KILN_FMT_NVFP4, .n = 4096, .k = 4096 + 32 };
    cr_assert_eq(wtc->can_implement(&h, &c, 256, why, sizeof why), 0);
    cr_assert(strstr(why, "multiple of 64"), "%s", why);
    c = (kiln_linear_cfg){ .format = KILN_FMT_MXFP4, .n = (int64_t)INT_MAX + 1, .k = 64 };
    cr_assert_eq(wtc->can_implement(&h, &c, 256, why, sizeof why), 0);
    cr_assert(strstr(why, "below 2^31"), "%s", why);
    c = (kiln_linear_cfg){ .format = KILN_FMT_F16, .n = 1 << 20, .k = 64 };
    cr_assert_eq(wtc->can_implement(&h, &c, (int64_t)1 << 30, why, sizeof why), 0);
    cr_assert(strstr(why, "more than 2^31 - 1 tiles"), "%s", why);
}

/* Byte i of the box at (0, c1, c2) of a 3-D map: its offset in the
 * buffer, or -1 where the box passes the array (TMA reads a zero). */
static int64_t box_byte(const kiln_tma *t, int64_t c1, int64_t c2, int64_t i)
{
    const int64_t row = (int64_t)t->box[0] * t->elem_bytes;
    const int64_t x = i % row, y = c1 + i / row % t->box[1], z = c2 + i / row / t->box[1];
    if (x >= (int64_t)(t->dims[0] * t->elem_bytes) || y >= (int64_t)t->dims[1] ||
        z >= (int64_t)t->dims[2])
        return -1;
    return (int64_t)t->offset + z * (int64_t)t->strides[1] + y * (int64_t)t->strides[0] + x;
}

/* Every box the producer loads, for every format, tile and a whole, a
 * partial and a short last block of rows: byte for byte the atoms,
 * records and super-records of the packed layout (kernels/gemv/pack.h,
 * records_of in kiln/tc.cuh) that the consumers decode, zeros past the
 * last row tile, nothing past an array. */
Test(wgmma_tc, maps_read_the_packed_arrays)
{
    kiln_target h = target("h100");
    static const int64_t ns[] = { 16, 1000, 4100 }, ks[] = { 256, 768 };
    for (size_t f = 0; f < KILN_ARRAY_LEN(formats); f++)
        for (size_t v = 0; v < KILN_ARRAY_LEN(tiles); v++)
            for (size_t a = 0; a < KILN_ARRAY_LEN(ns); a++)
                for (size_t b = 0; b < KILN_ARRAY_LEN(ks); b++) {
                    const kiln_gemv_tc_format *p = kiln_gemv_tc_format_get(formats[f]);
                    const int64_t n = ns[a], k = ks[b], steps = k / 64, tiles16 = (n + 15) / 16;
                    kiln_linear_kernel kk = { .cfg = { .format = formats[f], .n = n, .k = k },
                                              .act = KILN_ACT_BF16_TC };
                    snprintf(kk.variant, sizeof kk.variant, "%s", tiles[v]);
                    kiln_launch l;
                    cr_assert_eq(wtc->launch(&h, &kk, 300, &l), KILN_OK, "%s",
                                 kiln_last_error());
                    cr_assert_eq(l.n_tma, 2 + !!p->record + !!p->super);
                    const int64_t rows = strstr(tiles[v], "s2") ? 64 : 128, rt = rows / 16;
                    size_t data, scale;
                    cr_assert_eq(kiln_gemv_pack_bytes(formats[f], n, k, &data, &scale), KILN_OK);
                    /* map, bytes of a row tile's unit, units a row tile, where unit u of
                     * row tile t lies, the array's end */
                    const struct {
                        int map;
                        int64_t bytes, units, at0, end;
                    } arrays[] = {
                        { 1, p->bytes, steps, 0, (int64_t)data },
                        { p->record ? 2 : 0, 8 * p->record, steps, 0, (int64_t)scale },
                        { p->super ? 2 + !!p->record : 0, 8 * p->super, steps / 4,
                          tiles16 * steps * 8 * p->record, (int64_t)scale },
                    };
                    for (size_t r = 0; r < KILN_ARRAY_LEN(arrays); r++) {
                        if (!arrays[r].map)
                            continue;
                        const kiln_tma *t = &l.tma[arrays[r].map];
                        for (int64_t tile0 = 0; tile0 < tiles16; tile0 += rt)
                            for (int64_t s = 0; s < steps; s++) {
                                const int64_t u = r == 2 ? s / 4 : s;
                                for (int64_t i = 0; i < rt * arrays[r].bytes; i++) {
                                    const int64_t tile = tile0 + i / arrays[r].bytes;
                                    const int64_t want =
                                        tile < tiles16 ? arrays[r].at0 +
                                                             (tile * arrays[r].units + u) *
                                                                 arrays[r].bytes +
                                                             i % arrays[r].bytes
                                                       : -1;
                                    const int64_t got = box_byte(t, u, tile0, i);
                                    if (got != want || got >= arrays[r].end)
                                        cr_assert_fail("%s %s N=%lld K=%lld array %zu tile %lld "
                                                       "stage %lld byte %lld: %lld, not %lld",
                                                       kiln_format_get(formats[f])->name,
                                                       tiles[v], (long long)n, (long long)k, r,
                                                       (long long)tile0, (long long)s,
                                                       (long long)i, (long long)got,
                                                       (long long)want);
                                }
                            }
                    }
                }
}

/* The widest tile where the tiles fill the SMs in whole waves; a narrower
 * one where the wider leave most SMs idle, and one of 64 rows with K split
 * between the consumers where 128-row blocks leave them idle too. */
Test(wgmma_tc, tiles_follow_the_bucket)
{
    kiln_target h = target("h100"); /* 132 SMs */
    kiln_linear_cfg c = { .format = KILN_FMT_NVFP4, .n = 4096, .k = 4096 };
    char v[64];
    wtc->variant(&h, &c, 8192, v, sizeof v);
    cr_assert_str_eq(v, "bt256"); /* 32 x 32 tiles: 8 waves of 256 */
    wtc->variant(&h, &c, 64, v, sizeof v);
    cr_assert_str_eq(v, "bt64s2"); /* 64 blocks of 64 rows against 32 of 128 */
    wtc->variant(&h, &c, 512, v, sizeof v);
    cr_assert_str_eq(v, "bt256s2"); /* 128 blocks in one wave, at the widest tile */
    wtc->variant(&h, &c, 256, v, sizeof v);
    cr_assert_str_eq(v, "bt128s2"); /* 128 blocks: 64 rows x 128 tokens */
    c.n = 28672;
    wtc->variant(&h, &c, 256, v, sizeof v);
    cr_assert_str_eq(v, "bt256"); /* 224 tiles of 256: 2 waves, of 128: 4 */
    wtc->variant(&h, &c, 512, v, sizeof v);
    cr_assert_str_eq(v, "bt256"); /* 4 waves of 256 against 7 of 128 at 0.6, or of split ones */
    wtc->variant(&h, &c, 128, v, sizeof v);
    cr_assert_str_eq(v, "bt128"); /* 2 waves either way: the faster of the two */
    wtc->variant(&h, &c, 64, v, sizeof v);
    cr_assert_str_eq(v, "bt64"); /* 224 blocks of 128 rows fill the SMs already */
}

Test(wgmma_tc, launch_is_persistent_with_maps_of_x_and_the_packed_arrays)
{
    kiln_target h = target("h100");
    kiln_linear_kernel k = { .cfg = { .format = KILN_FMT_NVFP4, .n = 1000, .k = 768 },
                             .act = KILN_ACT_BF16_TC, .variant = "bt128" };
    kiln_launch l;
    cr_assert_eq(wtc->launch(&h, &k, 300, &l), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(l.grid[0], 3 * 8, "ceil(300 / 128) x ceil(1000 / 128) tiles");
    cr_assert_eq(l.block[0], 384);
    cr_assert(l.persistent);
    cr_assert_eq(l.n_tma, 3, "x, the packed data and the records");
    cr_assert_eq(l.tma[0].source, KILN_TMA_X);
    cr_assert_eq(l.tma[0].elem_bytes, 2);
    cr_assert_eq(l.tma[0].dims[0], 768);
    cr_assert_eq(l.tma[0].dims[1], 300);
    cr_assert_eq(l.tma[0].box[0], 64);
    cr_assert_eq(l.tma[0].box[1], 128);
    cr_assert_eq(l.tma[0].swizzle, 128);
    cr_assert_leq(l.smem, 227 * 1024, "within an H100's opt-in shared memory");
    /* NVFP4's atoms (512 bytes) and records (8 bytes a lane group), 12
     * atoms a row tile, 63 row tiles: a box is an atom of the block's 8. */
    const kiln_tma *dm = &l.tma[1], *r = &l.tma[2];
    cr_assert(dm->source == KILN_TMA_W && dm->rank == 3 && dm->elem_bytes == 8);
    cr_assert(dm->dims[0] == 64 && dm->dims[1] == 12 && dm->dims[2] == 63, "%llu %llu %llu",
              (unsigned long long)dm->dims[0], (unsigned long long)dm->dims[1],
              (unsigned long long)dm->dims[2]);
    cr_assert(dm->strides[0] == 512 && dm->strides[1] == 12 * 512 && dm->offset == 0);
    cr_assert(dm->box[0] == 64 && dm->box[1] == 1 && dm->box[2] == 8 && dm->swizzle == 0);
    cr_assert(r->source == KILN_TMA_W_SCALE && r->rank == 3 && r->elem_bytes == 8);
    cr_assert(r->dims[0] == 8 && r->dims[1] == 12 && r->dims[2] == 63);
    cr_assert(r->strides[0] == 64 && r->strides[1] == 12 * 64 && r->offset == 0);
    cr_assert(r->box[0] == 8 && r->box[1] == 1 && r->box[2] == 8);
    /* Q4_K: the super-records (d and dmin, 8 bytes a lane group a 256
     * values) after every atom's records; F16: the data alone. */
    kiln_linear_kernel q = { .cfg = { .format = KILN_FMT_Q4_K, .n = 1000, .k = 768 },
                             .act = KILN_ACT_BF16_TC, .variant = "bt64s2" };
    cr_assert_eq(wtc->launch(&h, &q, 300, &l), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(l.n_tma, 4);
    const kiln_tma *sup = &l.tma[3];
    cr_assert(sup->source == KILN_TMA_W_SCALE && sup->dims[0] == 8 && sup->dims[1] == 3 &&
              sup->dims[2] == 63 && sup->box[2] == 4);
    cr_assert_eq(sup->offset, 63 * 12 * 64, "past the records");
    size_t data, scale;
    cr_assert_eq(kiln_gemv_pack_bytes(KILN_FMT_Q4_K, 1000, 768, &data, &scale), KILN_OK);
    cr_assert_eq(scale, sup->offset + 63 * 3 * 64, "the super-records end the scale array");
    q.cfg.format = KILN_FMT_F16;
    cr_assert_eq(wtc->launch(&h, &q, 300, &l), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(l.n_tma, 2);
    cr_assert(l.tma[1].dims[0] == 256 && l.tma[1].box[0] == 256, "an atom of 2048 bytes");
    cr_assert_eq(wtc->launch(&h, &k, 300, &l), KILN_OK);
    /* Split tiles: 64 rows a block, and the sums' hand-over within the
     * opt-in shared memory for every format. */
    for (size_t f = 0; f < KILN_ARRAY_LEN(formats); f++) {
        kiln_linear_kernel s = { .cfg = { .format = formats[f], .n = 1000, .k = 768 },
                                 .act = KILN_ACT_BF16_TC, .variant = "bt256s2" };
        kiln_launch sl;
        cr_assert_eq(wtc->launch(&h, &s, 300, &sl), KILN_OK, "%s", kiln_last_error());
        cr_assert_eq(sl.grid[0], 2 * 16, "ceil(300 / 256) x ceil(1000 / 64) tiles");
        cr_assert_leq(sl.smem, 227 * 1024, "%s", kiln_format_get(formats[f])->name);
    }
    kiln_weight_layout w;
    cr_assert_eq(wtc->layout(&h, &k, &w), KILN_OK, "%s", kiln_last_error());
    cr_assert_str_eq(w.name, "gemv_tc");
    kiln_weight_layout d;
    cr_assert_eq(kiln_backend_gemv_tc.layout(&h, &k, &d), KILN_OK);
    cr_assert(w.pack == d.pack && w.data_bytes == d.data_bytes && w.scale_bytes == d.scale_bytes,
              "the decode kernels' copy");
    k.act = KILN_ACT_BF16;
    cr_assert_eq(wtc->launch(&h, &k, 300, &l), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "wgmma_tc"), "%s", kiln_last_error());
    k.act = KILN_ACT_BF16_TC;
    snprintf(k.variant, sizeof k.variant, "bm64bn128");
    cr_assert_eq(wtc->launch(&h, &k, 300, &l), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "bt256, bt128, bt64"), "%s", kiln_last_error());
}

/* gemv_tc for the decode buckets, wgmma_tc past them: each linear reads
 * one packed copy and no storage-layout copy, and its activations pass
 * one bf16-tc step per value (gate and up share theirs). */
Test(wgmma_tc, decode_and_prefill_read_one_packed_copy)
{
    kiln_registry r = *kiln_registry_default();
    static const char *const list[] = { "gemv_tc", "wgmma_tc", "simt", NULL };
    for (size_t i = 0; i < KILN_ARRAY_LEN(list); i++)
        r.priority[KILN_FMT_NVFP4][i] = list[i];
    kt_rng rng = kt_rng_new(7);
    kt_weight gate, up, down;
    kt_weight_make(&gate, &rng, KILN_FMT_NVFP4, 512, 256);
    kt_weight_make(&up, &rng, KILN_FMT_NVFP4, 512, 256);
    kt_weight_make(&down, &rng, KILN_FMT_NVFP4, 256, 512);
    float norm[256];
    kt_fill_normal(&rng, norm, 256, 1.0f);
    kiln_graph *g = kt_ffn_graph(&gate, &up, &down, norm);
    kiln_target h = target("h200");
    static const int64_t capture[] = { 16, 512 };
    kiln_plan_options o = { .capture = capture, .n_capture = 2 };
    kiln_plan *p;
    cr_assert_eq(kiln_plan_create_with(&r, g, &h, &o, &p), KILN_OK, "%s", kiln_last_error());
    for (int l = 0; l < kiln_plan_n_linears(p); l++)
        for (int b = 0; b < kiln_plan_n_buckets(p); b++) {
            kiln_plan_linear pl;
            cr_assert_eq(kiln_plan_linear_at(p, l, b, &pl), KILN_OK);
            const int64_t m = kiln_plan_bucket(p, b);
            cr_assert_str_eq(pl.backend, m <= 16 ? "gemv_tc" : "wgmma_tc", "%s at %lld", pl.node,
                             (long long)m);
            cr_assert_str_eq(pl.act, m <= 16 ? "bf16" : "bf16-tc");
        }
    size_t storage, packed, data, scale, want = 0;
    cr_assert_eq(kiln_plan_weight_bytes(p, &storage, &packed), KILN_OK);
    const kt_weight *ws[] = { &gate, &up, &down };
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(kiln_gemv_pack_bytes(KILN_FMT_NVFP4, ws[i]->q.n, ws[i]->q.k, &data, &scale),
                     KILN_OK);
        want += data + scale;
    }
    cr_assert_eq(storage, 0, "no kernel reads the storage layout");
    cr_assert_eq(packed, want, "one packed copy a weight");
    /* The 512 bucket: rms_norm, bf16-tc for gate and up (one), gate, up
     * (silu_mul), bf16-tc for down, down (residual). */
    const kiln_program *prog = &p->programs[kiln_plan_bucket_for(p, 512)];
    int quant = 0;
    for (int i = 0; i < prog->n_steps; i++)
        if (prog->steps[i].kind == KILN_STEP_QUANT) {
            quant++;
            cr_assert_eq(prog->steps[i].act, KILN_ACT_BF16_TC);
        }
    cr_assert_eq(quant, 2, "one bf16-tc step per activation the linears read");
    for (int i = 0; i < kiln_plan_n_signatures(p); i++) {
        kiln_kernel_source s;
        cr_assert_eq(kiln_emit_text(&r, kiln_plan_signature(p, i), &s), KILN_OK, "%s: %s",
                     kiln_plan_signature(p, i), kiln_last_error());
        kiln_kernel_source_free(&s);
    }
    kiln_plan_destroy(p);
    kiln_graph_destroy(g);
    kt_weight_free(&gate);
    kt_weight_free(&up);
    kt_weight_free(&down);
}

/* ------------------------------------------------------------ NVRTC */

static const unsigned epilogues[] = {
    0,
    KILN_EPI_BIAS | KILN_EPI_RESIDUAL,
    KILN_EPI_BIAS | KILN_EPI_SILU_MUL,
};

/* Every format x tile, each format and each tile with every epilogue
 * (the epilogue turns with the tile), N odd and a partial column tile
 * (1001), K of three super-blocks; and the bf16-tc quantizer. No MMA
 * serialized, nothing in local memory. */
Test(wgmma_tc, every_format_tile_and_epilogue_compiles_for_sm_90a, .timeout = 1200)
{
    enum { JOBS = KILN_ARRAY_LEN(formats) * KILN_ARRAY_LEN(tiles) + 1 };
    static kiln_kernel_source src[JOBS];
    static kiln_compile_job jobs[JOBS];
    static char sigs[JOBS][512];
    int n = 0;
    for (size_t f = 0; f < KILN_ARRAY_LEN(formats); f++)
        for (size_t v = 0; v < KILN_ARRAY_LEN(tiles); v++, n++)
            kt_linear_sig(sigs[n], sizeof sigs[n], "wgmma_tc", tiles[v], formats[f], "bf16-tc",
                          1001, 768, epilogues[(f + v) % KILN_ARRAY_LEN(epilogues)], "sm_90a");
    snprintf(sigs[n++], sizeof sigs[0], "quant act=bf16-tc k=768 target=sm_90a");
    cr_assert_eq(n, JOBS);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(kiln_emit_text(kiln_registry_default(), sigs[i], &src[i]), KILN_OK, "%s: %s",
                     sigs[i], kiln_last_error());
        jobs[i] = (kiln_compile_job){ .name = sigs[i], .entry = src[i].desc.entry,
                                      .source = src[i].text, .target = &src[i].desc.target };
    }
    kiln_nvrtc *nv = kt_open_nvrtc();
    const kiln_nvrtc_pool quiet = { .quiet = 1 };
    cr_assert_eq(kiln_nvrtc_compile_all(nv, jobs, n, &quiet), KILN_OK, "%s", kiln_last_error());
    for (int i = 0; i < n; i++) {
        cr_assert_eq(jobs[i].status, KILN_OK, "%s", sigs[i]);
        cr_assert_gt(jobs[i].cubin_size, 0);
        cr_assert_null(strstr(jobs[i].log, "wgmma"), "%s: %s", sigs[i], jobs[i].log);
        kiln_compile_job_reset(&jobs[i]);
        kiln_kernel_source_free(&src[i]);
    }
    kiln_nvrtc_close(nv);
}

/* HGMMA of the tile's width with A in registers (its first source a
 * register, not a descriptor), four a stage; x and the packed arrays by
 * TMA, stages behind mbarriers; nothing in local memory. */
Test(wgmma_tc, sass_runs_register_operand_hgmma, .timeout = 300)
{
    static const struct {
        const char *tile;
        kiln_format f;
        const char *hgmma;
    } cases[] = {
        { "bt256", KILN_FMT_NVFP4, "HGMMA.64x256x16.F32.BF16 R" },
        { "bt128", KILN_FMT_MXFP4, "HGMMA.64x128x16.F32.BF16 R" },
        { "bt64", KILN_FMT_MXFP8, "HGMMA.64x64x16.F32.BF16 R" },
        { "bt256", KILN_FMT_Q4_K, "HGMMA.64x256x16.F32.BF16 R" },
        { "bt128", KILN_FMT_Q6_K, "HGMMA.64x128x16.F32.BF16 R" },
        { "bt64", KILN_FMT_Q8_0, "HGMMA.64x64x16.F32.BF16 R" },
        { "bt256s2", KILN_FMT_GGML_MXFP4, "HGMMA.64x256x16.F32.BF16 R" },
        { "bt64s2", KILN_FMT_Q4_0, "HGMMA.64x64x16.F32.BF16 R" },
        { "bt128s2", KILN_FMT_F16, "HGMMA.64x128x16.F32.BF16 R" },
    };
    kiln_nvrtc *nv = kt_open_nvrtc();
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        char sig[512];
        kt_linear_sig(sig, sizeof sig, "wgmma_tc", cases[i].tile, cases[i].f, "bf16-tc", 4096,
                      4096, KILN_EPI_BIAS | KILN_EPI_SILU_MUL, "sm_90a");
        kiln_kernel_source s;
        cr_assert_eq(kiln_emit_text(kiln_registry_default(), sig, &s), KILN_OK, "%s",
                     kiln_last_error());
        kiln_compile_job job = { .name = sig, .entry = s.desc.entry, .source = s.text,
                                 .target = &s.desc.target };
        cr_assert_eq(kiln_nvrtc_compile(nv, &job, NULL), KILN_OK, "%s", kiln_last_error());
        char *sass = kt_dump_sass(job.cubin, job.cubin_size);
        if (!sass) {
            kiln_compile_job_reset(&job);
            kiln_kernel_source_free(&s);
            kiln_nvrtc_close(nv);
            cr_skip_test("cuobjdump (with nvdisasm) is not on PATH: the SASS is not checked");
        }
        int mma = kt_count(sass, cases[i].hgmma);
        cr_assert(mma >= 4 && mma % 4 == 0, "%s: four k16 MMAs a stage, %d seen", sig, mma);
        cr_assert_eq(kt_count(sass, "GMMA"), mma, "%s: no other MMA", sig);
        cr_assert_geq(kt_count(sass, "UTMALDG.2D"), 1, "%s: x by TMA", sig);
        cr_assert_geq(kt_count(sass, "UTMALDG.3D"), 1, "%s: the packed arrays by TMA", sig);
        cr_assert_eq(kt_count(sass, "UBLKCP"), 0, "%s: no bulk copy a row tile", sig);
        cr_assert_geq(kt_count(sass, "SYNCS"), 1, "%s: stages behind mbarriers", sig);
        cr_assert_geq(kt_count(sass, "WARPGROUP.DEPBAR.LE gsb0, 0x0"), 1,
                      "%s: a stage's MMAs done before the next decodes", sig);
        cr_assert_eq(kt_count(sass, "LDL"), 0, "%s: nothing in local memory", sig);
        cr_assert_eq(kt_count(sass, "STL"), 0, "%s: nothing in local memory", sig);
        free(sass);
        kiln_compile_job_reset(&job);
        kiln_kernel_source_free(&s);
    }
    kiln_nvrtc_close(nv);
}
