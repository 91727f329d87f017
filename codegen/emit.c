/* Descriptors become sources. A linear's source comes from its backend's
 * emit hook; the aux kernels (elementwise ops, rms_norm, activation
 * quantizers) are printed here from one table row per op and per scheme,
 * each naming the template of kernels/common/elementwise.cuh it
 * instantiates. Every source starts with the same header comment: the
 * signature, the templates' digest and the cache-key line. */
#include "codegen/emit.h"

#include "kernels/common/kiln_args.h"
#include "kernels/gemv/pack.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The elementwise templates by op: the device function and the template
 * arguments before the width. */
static const struct {
    const char *fn;
    const char *args;
} op_kernels[KILN_OP_COUNT] = {
    [KILN_OP_ADD] = { "elementwise", "kiln::add_fn, /*binary*/ true, " },
    [KILN_OP_MUL] = { "elementwise", "kiln::mul_fn, /*binary*/ true, " },
    [KILN_OP_SILU] = { "elementwise", "kiln::silu_fn, /*binary*/ false, " },
    [KILN_OP_GELU] = { "elementwise", "kiln::gelu_fn, /*binary*/ false, " },
    [KILN_OP_RMS_NORM] = { "rms_norm", "" },
};

/* The quantizers by scheme: an optional first kernel (its entry gets the
 * suffix "_amax"), the main one, and the template arguments after k. */
static const struct {
    const char *pre;
    const char *fn;
    const char *args;
} quant_kernels[] = {
    [KILN_ACT_BF16] = { NULL, NULL, NULL },
    [KILN_ACT_FP8_TENSOR] = { "quant_fp8_tensor_amax", "quant_fp8_tensor", "" },
    [KILN_ACT_FP8_TOKEN] = { NULL, "quant_fp8_token", "" },
    [KILN_ACT_FP8_G128] = { NULL, "quant_fp8_groups", ", /*group*/ 128, /*mx*/ false" },
    [KILN_ACT_MXFP8_G32] = { NULL, "quant_fp8_groups", ", /*group*/ 32, /*mx*/ true" },
    [KILN_ACT_FP8_STATIC] = { NULL, "quant_fp8_static", "" },
    [KILN_ACT_BF16_QDQ] = { NULL, "quant_bf16_qdq", "" },
    [KILN_ACT_BF16_TC] = { NULL, "quant_bf16_tc", "" },
};
_Static_assert(KILN_ARRAY_LEN(quant_kernels) == KILN_ACT_COUNT, "one row per activation scheme");

enum { BODY_MAX = 4096 };

/* A source body under construction in a fixed buffer. used counts what
 * was asked for, so text past the end is dropped, never written out of
 * bounds; BODY_MAX holds every aux body many times over. */
typedef struct source_body {
    char *buf;
    size_t size, used;
} source_body;

static void body_printf(source_body *b, const char *fmt, ...) KILN_PRINTF(2, 3);

static void body_printf(source_body *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->used < b->size ? b->buf + b->used : NULL,
                      b->used < b->size ? b->size - b->used : 0, fmt, ap);
    va_end(ap);
    b->used += n > 0 ? (size_t)n : 0;
}

/* Row kernels take their width as an int template argument. */
static kiln_status check_width(const kiln_kernel_desc *d)
{
    if (d->width > INT_MAX)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: width %lld does not fit an int", d->entry,
                         (long long)d->width);
    return KILN_OK;
}

/* A row kernel's wrapper; the template takes its row length (named dim
 * in the source) between the arguments before and after it. It lets the
 * next kernel start at once: one launched with overlap (a decode GEMM
 * after an rms_norm) copies its first weights while this one runs, and
 * waits for it to finish before it reads what it writes; since every block
 * of this one has then started, none waits for room the next one holds. */
static void print_wrapper(source_body *b, const char *entry, const char *suffix,
                          const char *args_type, const char *fn, const char *before,
                          const char *dim, int64_t width, const char *after)
{
    body_printf(b,
                "\n"
                "extern \"C\" __global__ void __launch_bounds__(KILN_ROW_THREADS)\n"
                "%s%s(const %s args)\n"
                "{\n"
                "    kiln::grid_launch_dependents();\n"
                "    kiln::%s<%s/*%s*/ %lld%s>(args);\n"
                "}\n",
                entry, suffix, args_type, fn, before, dim, (long long)width, after);
}

static kiln_status emit_op(const kiln_kernel_desc *d, char *buf, size_t size)
{
    if ((unsigned)d->op >= KILN_OP_COUNT || !op_kernels[d->op].fn)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: op %s has no kernel", d->entry,
                         kiln_op_name(d->op));
    kiln_status st = check_width(d);
    if (st != KILN_OK)
        return st;
    source_body b = { buf, size, 0 };
    body_printf(&b, "#include \"kiln/elementwise.cuh\"\n");
    print_wrapper(&b, d->entry, "", "kiln_op_args", op_kernels[d->op].fn, op_kernels[d->op].args,
                  "width", d->width, "");
    assert(b.used < b.size);
    return KILN_OK;
}

static kiln_status emit_quant(const kiln_kernel_desc *d, char *buf, size_t size)
{
    if (!quant_kernels[d->act].fn)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: activations in %s need no quantizer",
                         d->entry, kiln_act_name(d->act));
    kiln_status st = check_width(d);
    if (st != KILN_OK)
        return st;
    if (d->act == KILN_ACT_BF16_TC && d->width % 16)
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "%s: k=%lld: bf16-tc reorders whole groups of 16 values of K", d->entry,
                         (long long)d->width);
    source_body b = { buf, size, 0 };
    body_printf(&b, "#include \"kiln/elementwise.cuh\"\n");
    if (quant_kernels[d->act].pre)
        print_wrapper(&b, d->entry, KILN_EMIT_AMAX_SUFFIX, "kiln_quant_args",
                      quant_kernels[d->act].pre, "", "k", d->width, quant_kernels[d->act].args);
    print_wrapper(&b, d->entry, "", "kiln_quant_args", quant_kernels[d->act].fn, "", "k",
                  d->width, quant_kernels[d->act].args);
    assert(b.used < b.size);
    return KILN_OK;
}

static kiln_status emit_linear(const kiln_kernel_desc *d, char *buf, size_t size)
{
    if (!d->backend->emit || !d->backend->launch)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: backend %s has no code hooks", d->entry,
                         d->backend->name);
    kiln_status st = d->backend->emit(&d->target, &d->linear, d->entry, buf, size);
    if (st != KILN_OK)
        return kiln_fail_prefix(st, "%s", d->entry);
    /* The backend's emit refuses what it knows it cannot build; a signature
     * from outside a plan may still name a format its table leaves out:
     * refused here, not by NVRTC. */
    if (!(d->backend->formats & (1u << d->linear.cfg.format)))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: backend %s has no kernel for %s", d->entry,
                         d->backend->name, kiln_format_get(d->linear.cfg.format)->name);
    return KILN_OK;
}

int kiln_emit_quant_has_amax(kiln_act a)
{
    assert((unsigned)a < KILN_ACT_COUNT);
    return quant_kernels[a].pre != NULL;
}

kiln_status kiln_emit(const kiln_kernel_desc *d, const char *signature, kiln_kernel_source *out)
{
    if (!d || !signature || !out)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_emit: desc, signature and out are required");
    kiln_status st = KILN_OK;
    char body[BODY_MAX];
    switch (d->kind) {
    case KILN_STEP_LINEAR: st = emit_linear(d, body, sizeof body); break;
    case KILN_STEP_OP: st = emit_op(d, body, sizeof body); break;
    case KILN_STEP_QUANT: st = emit_quant(d, body, sizeof body); break;
    case KILN_STEP_PACK:
        st = kiln_gemv_pack_emit(d->linear.cfg.format, d->entry, body, sizeof body);
        break;
    }
    if (st != KILN_OK)
        return st;
    static const char header[] =
        "// kiln kernel, generated from its signature: the logic is in the included template.\n"
        "// signature: %s\n"
        "// templates: %s\n"
        "// cache key: " KILN_EMIT_KEY_PLACEHOLDER "\n"
        "%s";
    const char *templates = kiln_emit_templates_digest();
    int len = snprintf(NULL, 0, header, signature, templates, body);
    char *text = kiln_malloc((size_t)len + 1);
    if (!text)
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for the source text", d->entry);
    snprintf(text, (size_t)len + 1, header, signature, templates, body);
    *out = (kiln_kernel_source){ .desc = *d, .text = text, .length = (size_t)len };
    return KILN_OK;
}

kiln_status kiln_emit_text(const kiln_registry *r, const char *signature,
                           kiln_kernel_source *out)
{
    if (!out)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_emit_text: out is required");
    kiln_kernel_desc d;
    kiln_status st = kiln_sig_parse(r, signature, &d);
    return st == KILN_OK ? kiln_emit(&d, signature, out) : st;
}

void kiln_kernel_source_free(kiln_kernel_source *s)
{
    if (!s)
        return;
    free(s->text);
    s->text = NULL;
    s->length = 0;
}

kiln_status kiln_emit_set_key(char *text, const char *key_hex)
{
    const size_t key_len = sizeof KILN_EMIT_KEY_PLACEHOLDER - 1;
    if (!text || !key_hex || strlen(key_hex) != key_len ||
        strspn(key_hex, "0123456789abcdef") != key_len)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "kiln_emit_set_key: a key is %zu lowercase hex digits", key_len);
    char *at = strstr(text, "// cache key: " KILN_EMIT_KEY_PLACEHOLDER "\n");
    if (!at)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "kiln_emit_set_key: the source has no key placeholder");
    memcpy(at + strlen("// cache key: "), key_hex, key_len);
    return KILN_OK;
}
