/* Descriptors become sources. A linear's source comes from its backend's
 * emit hook; the aux kernels (elementwise ops, rms_norm, activation
 * quantizers) are printed here from one table row per op and per scheme,
 * each naming the template of kernels/common/elementwise.cuh it
 * instantiates. Every source starts with the same header comment: the
 * signature and the cache-key line. */
#include "codegen/emit.h"

#include "cache/cache.h"

#include "kernels/common/kiln_args.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: hashing cannot fail */
#include <xxhash.h>

/* ------------------------------------------------------------ emitting */

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
};
_Static_assert(KILN_ARRAY_LEN(quant_kernels) == KILN_ACT_COUNT, "one row per activation scheme");

#define AMAX_SUFFIX "_amax"

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
 * in the source) between the arguments before and after it. */
static void print_wrapper(source_body *b, const char *entry, const char *suffix,
                          const char *args_type, const char *fn, const char *before,
                          const char *dim, int64_t width, const char *after)
{
    body_printf(b,
                "\n"
                "extern \"C\" __global__ void __launch_bounds__(KILN_ROW_THREADS)\n"
                "%s%s(const %s args)\n"
                "{\n"
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
    source_body b = { buf, size, 0 };
    body_printf(&b, "#include \"kiln/elementwise.cuh\"\n");
    if (quant_kernels[d->act].pre)
        print_wrapper(&b, d->entry, AMAX_SUFFIX, "kiln_quant_args", quant_kernels[d->act].pre, "",
                      "k", d->width, quant_kernels[d->act].args);
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
    return KILN_OK;
}

/* XXH3-128 over every embedded template, name and text, each a field as
 * the cache key's are. */
static char templates_digest[KILN_CACHE_KEY_HEX];
static pthread_once_t templates_once = PTHREAD_ONCE_INIT;

static void templates_digest_once(void)
{
    XXH3_state_t s;
    XXH3_INITSTATE(&s);
    XXH3_128bits_reset(&s);
    for (size_t i = 0; i < kiln_embedded_headers_count; i++) {
        const kiln_embedded_file *f = &kiln_embedded_headers[i];
        kiln_cache_key_field(&s, f->name, strlen(f->name));
        kiln_cache_key_field(&s, f->text, strlen(f->text));
    }
    XXH128_canonical_t canon;
    XXH128_canonicalFromHash(&canon, XXH3_128bits_digest(&s));
    uint8_t digest[KILN_CACHE_KEY_BYTES];
    memcpy(digest, canon.digest, sizeof digest);
    kiln_cache_key_hex(digest, templates_digest);
}

const char *kiln_emit_templates_digest(void)
{
    pthread_once(&templates_once, templates_digest_once);
    return templates_digest;
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
    char *text = malloc((size_t)len + 1);
    if (!text)
        return kiln_fail(KILN_ERR_NOMEM, "%s: source text", d->entry);
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

/* ----------------------------------------------------------- launching */

kiln_status kiln_kernel_launches(const kiln_kernel_desc *d, int64_t m,
                                 kiln_kernel_launch out[KILN_MAX_LAUNCHES], int *n)
{
    if (!d || !out || !n)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "kiln_kernel_launches: desc, out and n are required");
    if (m < 1 || m > INT_MAX)
        return kiln_fail(KILN_ERR_SHAPE, "%s: cannot launch for M = %lld (1 to %d)", d->entry,
                         (long long)m, INT_MAX);
    kiln_kernel_launch l[KILN_MAX_LAUNCHES];
    int count = 0;
    const kiln_launch rows = { .grid = { (unsigned)m, 1, 1 }, .block = { KILN_ROW_THREADS, 1, 1 } };
    switch (d->kind) {
    case KILN_STEP_LINEAR: {
        if (!d->backend->launch)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: backend %s has no code hooks", d->entry,
                             d->backend->name);
        kiln_status st = d->backend->launch(&d->target, &d->linear, m, &l[count].cfg);
        if (st != KILN_OK)
            return kiln_fail_prefix(st, "%s", d->entry);
        snprintf(l[count++].entry, KILN_ENTRY_MAX, "%s", d->entry);
        break;
    }
    case KILN_STEP_OP:
        l[count].cfg = rows;
        snprintf(l[count++].entry, KILN_ENTRY_MAX, "%s", d->entry);
        break;
    case KILN_STEP_QUANT:
        if (quant_kernels[d->act].pre) {
            l[count].cfg = (kiln_launch){ .grid = { KILN_QUANT_AMAX_PARTS, 1, 1 },
                                          .block = { KILN_ROW_THREADS, 1, 1 } };
            snprintf(l[count++].entry, KILN_ENTRY_MAX, "%.*s" AMAX_SUFFIX,
                     (int)(KILN_ENTRY_MAX - sizeof AMAX_SUFFIX), d->entry);
        }
        l[count].cfg = rows;
        snprintf(l[count++].entry, KILN_ENTRY_MAX, "%s", d->entry);
        break;
    }
    memcpy(out, l, (size_t)count * sizeof *l);
    *n = count;
    return KILN_OK;
}

/* ------------------------------------------------------------- keeping */

const char *kiln_emit_keep_dir(const char *keep)
{
    if (keep)
        return keep;
    const char *env = getenv("KILN_DUMP_SOURCE");
    return env && *env ? env : NULL;
}

/* A path past PATH_MAX does not fit the 1 KiB error text either: it is
 * named by its beginning, so that the reason survives. */
static kiln_status path_too_long(const char *path, size_t len)
{
    return kiln_fail(KILN_ERR_IO, "%.64s...: path too long (%zu bytes, at most %d)", path, len,
                     PATH_MAX - 1);
}

/* mkdir -p: every prefix of dir that ends at a '/', then dir itself. */
static kiln_status make_dirs(const char *dir)
{
    char path[PATH_MAX];
    size_t len = strlen(dir);
    if (len >= sizeof path)
        return path_too_long(dir, len);
    memcpy(path, dir, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (path[i] != '/' && path[i] != '\0')
            continue;
        char c = path[i];
        path[i] = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST)
            return kiln_fail(KILN_ERR_IO, "%s: cannot create directory: %s", path, strerror(errno));
        path[i] = c;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return kiln_fail(KILN_ERR_IO, "%s: not a directory", dir);
    return KILN_OK;
}

static kiln_status write_text(const char *dir, const char *entry, const char *ext, const char *text)
{
    char path[PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/%s%s", dir, entry, ext);
    if (n >= (int)sizeof path)
        return path_too_long(path, (size_t)n);
    FILE *f = fopen(path, "wb");
    if (!f)
        return kiln_fail(KILN_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    size_t len = strlen(text);
    int bad = fwrite(text, 1, len, f) != len;
    bad |= fclose(f) != 0;
    if (bad)
        return kiln_fail(KILN_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return KILN_OK;
}

kiln_status kiln_emit_keep(const char *dir, const char *entry, const char *source, const char *log,
                           const char *ptx)
{
    if (!dir || !entry || !source)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "kiln_emit_keep: dir, entry and source are required");
    kiln_status st = make_dirs(dir);
    if (st == KILN_OK)
        st = write_text(dir, entry, ".cu", source);
    if (st == KILN_OK && log)
        st = write_text(dir, entry, ".log", log);
    if (st == KILN_OK && ptx)
        st = write_text(dir, entry, ".ptx", ptx);
    return st;
}
