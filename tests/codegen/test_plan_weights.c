/* kiln_plan_weight_bytes: each weight once in every layout its kernels read
 * (the copies a session keeps on the device). No GPU needed. */
#include <criterion/criterion.h>
#include <stdio.h>

#include "kernels/gemv/pack.h"
#include "kiln.h"

static unsigned char dummy[1];

static kiln_target target(const char *name)
{
    kiln_target t;
    cr_assert_eq(kiln_target_from_name(name, &t), KILN_OK, "%s", kiln_last_error());
    return t;
}

/* y_i = x_i · wᵀ for `uses` linears reading one [n, k] weight. */
static kiln_graph *linears(kiln_format f, int64_t n, int64_t k, int uses)
{
    kiln_graph *g;
    cr_assert_eq(kiln_graph_create(&g), KILN_OK);
    kiln_qtensor q = { .format = f, .n = n, .k = k, .data = dummy, .scale = dummy };
    kiln_tensor *w;
    cr_assert_eq(kiln_graph_weight(g, "w", &q, &w), KILN_OK, "%s", kiln_last_error());
    for (int i = 0; i < uses; i++) {
        char name[16];
        kiln_tensor *x, *y;
        snprintf(name, sizeof name, "x%d", i);
        cr_assert_eq(kiln_graph_input(g, name, k, &x), KILN_OK);
        snprintf(name, sizeof name, "y%d", i);
        cr_assert_eq(kiln_graph_linear(g, name, x, w, NULL, &y), KILN_OK, "%s", kiln_last_error());
        cr_assert_eq(kiln_graph_output(g, y), KILN_OK);
    }
    return g;
}

static void weight_bytes(kiln_graph *g, const char *tname, int64_t max_tokens, size_t *storage,
                         size_t *packed)
{
    kiln_target t = target(tname);
    kiln_plan_options o = { .max_tokens = max_tokens };
    if (max_tokens) {
        static const int64_t capture[] = { 1, 2, 4, 8, 16 };
        o.capture = capture;
        o.n_capture = 5;
    }
    kiln_plan *p;
    cr_assert_eq(kiln_plan_create(g, &t, &o, &p), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_plan_weight_bytes(p, storage, packed), KILN_OK, "%s", kiln_last_error());
    kiln_plan_destroy(p);
}

static size_t storage_of(kiln_format f, int64_t n, int64_t k)
{
    size_t d, s;
    cr_assert_eq(kiln_format_data_bytes(f, n, k, &d), KILN_OK);
    cr_assert_eq(kiln_format_scale_bytes(f, n, k, &s), KILN_OK);
    return d + s;
}

static size_t packed_of(kiln_format f, int64_t n, int64_t k)
{
    size_t d, s;
    cr_assert_eq(kiln_gemv_pack_bytes(f, n, k, &d, &s), KILN_OK, "%s", kiln_last_error());
    return d + s;
}

/* On sm_90a with every bucket, `uses` linears of one [n, k] weight of
 * format f hold it packed, and in the storage layout too where `storage`. */
static void held_on_sm_90a(kiln_format f, int64_t n, int64_t k, int uses, int storage)
{
    size_t s, p;
    kiln_graph *g = linears(f, n, k, uses);
    weight_bytes(g, "sm_90a", 0, &s, &p);
    cr_assert_eq(s, storage ? storage_of(f, n, k) : 0, "%s", kiln_format_get(f)->name);
    cr_assert_eq(p, packed_of(f, n, k), "%s", kiln_format_get(f)->name);
    kiln_graph_destroy(g);
}

/* Decode buckets read the packed copy, prefill buckets (block FP8 on
 * wgmma) the storage one: both are held. Q4_0's prefill (wgmma_tc) and
 * per-channel FP8's (wgmma's TMA kernel, from the row-major atoms, an odd
 * count of them included) read the packed copy alone. */
Test(plan_weights, decode_and_prefill_hold_both_layouts)
{
    held_on_sm_90a(KILN_FMT_FP8_BLOCK, 200, 768, 1, 1);
    held_on_sm_90a(KILN_FMT_Q4_0, 200, 768, 1, 0);
    held_on_sm_90a(KILN_FMT_FP8_CHANNEL, 200, 768, 1, 0);
    held_on_sm_90a(KILN_FMT_FP8_CHANNEL, 200, 320, 1, 0);
}

/* Up to 16 tokens only the decode kernels run: no storage copy, E4M3
 * formats too (their one-token bucket runs gemv_tc's tc1). */
Test(plan_weights, decode_only_keeps_what_its_kernels_read)
{
    size_t storage, packed;
    kiln_graph *g = linears(KILN_FMT_BF16, 256, 512, 1);
    weight_bytes(g, "sm_90a", 16, &storage, &packed);
    cr_assert_eq(storage, 0);
    cr_assert_eq(packed, packed_of(KILN_FMT_BF16, 256, 512));
    kiln_graph_destroy(g);

    g = linears(KILN_FMT_FP8_CHANNEL, 256, 512, 1);
    weight_bytes(g, "sm_90a", 16, &storage, &packed);
    cr_assert_eq(storage, 0);
    cr_assert_eq(packed, packed_of(KILN_FMT_FP8_CHANNEL, 256, 512));
    kiln_graph_destroy(g);
}

/* Before sm_80 and for F32 nothing is packed. */
Test(plan_weights, no_packing_where_the_tensor_core_kernel_does_not_run)
{
    size_t storage, packed;
    kiln_graph *g = linears(KILN_FMT_Q4_K, 256, 512, 1);
    weight_bytes(g, "sm_75", 0, &storage, &packed);
    cr_assert_eq(storage, storage_of(KILN_FMT_Q4_K, 256, 512));
    cr_assert_eq(packed, 0);
    kiln_graph_destroy(g);

    g = linears(KILN_FMT_F32, 256, 512, 1);
    weight_bytes(g, "sm_90a", 16, &storage, &packed);
    cr_assert_eq(storage, storage_of(KILN_FMT_F32, 256, 512));
    cr_assert_eq(packed, 0);
    kiln_graph_destroy(g);
}

/* Three linears reading one weight hold it once per layout: block FP8 in
 * both (gemv_tc's packed layout for decode, the storage layout for
 * wgmma's prefill), BF16 and FP8 per-tensor packed alone (wgmma's TMA
 * kernel reads their row-major atoms), Q4_K and NVFP4 packed alone
 * (wgmma_tc's prefill reads the packed layout too). */
Test(plan_weights, a_shared_weight_counts_once)
{
    held_on_sm_90a(KILN_FMT_BF16, 128, 256, 3, 0);
    held_on_sm_90a(KILN_FMT_FP8_TENSOR, 128, 256, 3, 0);
    held_on_sm_90a(KILN_FMT_FP8_BLOCK, 128, 256, 3, 1);
    held_on_sm_90a(KILN_FMT_Q4_K, 128, 256, 3, 0);
    held_on_sm_90a(KILN_FMT_NVFP4, 128, 256, 3, 0);
}

Test(plan_weights, refuses_null_arguments)
{
    size_t a, b;
    cr_assert_eq(kiln_plan_weight_bytes(NULL, &a, &b), KILN_ERR_INVALID_ARG);
    kiln_graph *g = linears(KILN_FMT_BF16, 16, 64, 1);
    kiln_target t = target("sm_90a");
    kiln_plan *p;
    cr_assert_eq(kiln_plan_create(g, &t, NULL, &p), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_plan_weight_bytes(p, NULL, &b), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_plan_weight_bytes(p, &a, NULL), KILN_ERR_INVALID_ARG);
    kiln_plan_destroy(p);
    kiln_graph_destroy(g);
}
