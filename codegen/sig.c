/* Signatures print and parse through one table of fields per step kind:
 * each field names its key, how its value is printed from a descriptor and
 * how it is read back into one. A field added to a form is printed and
 * parsed alike. */
#include "codegen/sig.h"
#include "codegen/target.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* A field's value of d, as text: a name of d's, or buf holding it. at is
 * the field's offset in the descriptor where one printer serves several
 * fields. */
typedef const char *sig_print_fn(const kiln_kernel_desc *d, size_t at, char *buf, size_t size);
/* Read value into d; sig is the whole text, for the message. */
typedef kiln_status sig_parse_fn(const kiln_registry *r, const char *sig, const char *value,
                                 size_t at, kiln_kernel_desc *d);

typedef struct sig_field {
    const char *key;     /* NULL: a bare word, right after the kind */
    sig_print_fn *print;
    sig_parse_fn *parse; /* NULL: follows from other fields, not read back */
    size_t at;
} sig_field;

enum { SIG_VALUE_MAX = 64 }; /* a printed value, NUL included: the variant is the longest */

static kiln_status malformed(const char *sig, const char *why)
{
    return kiln_fail(KILN_ERR_MALFORMED, "kernel signature \"%s\": %s", sig, why);
}

/* ---------------------------------------------------------- the fields */

/* A NUL-terminated name held in the descriptor (the variant, the target's
 * name). */
static const char *print_text(const kiln_kernel_desc *d, size_t at, char *buf, size_t size)
{
    (void)buf, (void)size;
    return (const char *)d + at;
}

static const char *print_backend(const kiln_kernel_desc *d, size_t at, char *buf, size_t size)
{
    (void)at, (void)buf, (void)size;
    return d->backend->name;
}

static kiln_status parse_backend(const kiln_registry *r, const char *sig, const char *value,
                                 size_t at, kiln_kernel_desc *d)
{
    (void)at;
    if (!(d->backend = kiln_registry_find(r, value)))
        return kiln_fail(KILN_ERR_NOT_FOUND,
                         "kernel signature \"%s\": backend %s is not registered", sig, value);
    return KILN_OK;
}

static kiln_status parse_variant(const kiln_registry *r, const char *sig, const char *value,
                                 size_t at, kiln_kernel_desc *d)
{
    (void)r, (void)at;
    if (strlen(value) >= sizeof d->linear.variant)
        return malformed(sig, "variant too long");
    memcpy(d->linear.variant, value, strlen(value) + 1);
    return KILN_OK;
}

static const char *print_format(const kiln_kernel_desc *d, size_t at, char *buf, size_t size)
{
    (void)at, (void)buf, (void)size;
    return kiln_format_get(d->linear.cfg.format)->name;
}

static kiln_status parse_format(const kiln_registry *r, const char *sig, const char *value,
                                size_t at, kiln_kernel_desc *d)
{
    (void)r, (void)at;
    kiln_status st = kiln_format_from_name(value, &d->linear.cfg.format);
    return st == KILN_OK ? st : kiln_fail_prefix(st, "kernel signature \"%s\"", sig);
}

/* The scale granularity of the format: "f32:128x128", "ue4m3:1x16+f32";
 * "inline" for scales inside the blocks (GGML), "none" for none. A grouped
 * format's columns are the weight's group ("f32:1x128+zp"), the one part
 * of the field read back. */
static const char *print_scales(const kiln_kernel_desc *d, size_t at, char *buf, size_t size)
{
    (void)at;
    static const char *const types[] = { "none", "f32", "e8m0", "ue4m3" };
    const kiln_format_info *fi = kiln_format_get(d->linear.cfg.format);
    if (fi->scale_type == KILN_SCALE_NONE)
        return fi->block > 1 ? "inline" : "none";
    int64_t per = fi->grouped ? d->linear.cfg.group : fi->scale_cols;
    char rows[12], cols[24];
    snprintf(rows, sizeof rows, "%d", fi->scale_rows);
    snprintf(cols, sizeof cols, "%lld", (long long)per);
    snprintf(buf, size, "%s:%sx%s%s%s", types[fi->scale_type], fi->scale_rows ? rows : "N",
             per ? cols : "K", fi->has_global_scale ? "+f32" : "", fi->zero_point ? "+zp" : "");
    return buf;
}

/* After the format: a grouped format's group from "f32:1x<group>" (1xK,
 * or nothing after the x: 0); the other formats' scales follow from the
 * format. */
static kiln_status parse_scales(const kiln_registry *r, const char *sig, const char *value,
                                size_t at, kiln_kernel_desc *d)
{
    (void)r, (void)at;
    if (!kiln_format_get(d->linear.cfg.format)->grouped)
        return KILN_OK;
    const char *x = strchr(value, 'x');
    if (!x)
        return malformed(sig, "the scales of a grouped format are not <type>:1x<group>");
    if (x[1] == '\0' || (x[1] == 'K' && (x[2] == '\0' || x[2] == '+'))) {
        d->linear.cfg.group = 0;
        return KILN_OK;
    }
    char *end;
    errno = 0;
    long long g = strtoll(x + 1, &end, 10);
    if (errno || end == x + 1 || g <= 0 || (*end && *end != '+'))
        return malformed(sig, "the group of a grouped format's scales is not a positive count");
    d->linear.cfg.group = g;
    return KILN_OK;
}

static const char *print_act(const kiln_kernel_desc *d, size_t at, char *buf, size_t size)
{
    (void)buf, (void)size;
    return kiln_act_name(*(const kiln_act *)((const char *)d + at));
}

static kiln_status parse_act(const kiln_registry *r, const char *sig, const char *value,
                             size_t at, kiln_kernel_desc *d)
{
    (void)r;
    for (int a = 0; a < KILN_ACT_COUNT; a++)
        if (!strcmp(kiln_act_name((kiln_act)a), value)) {
            *(kiln_act *)((char *)d + at) = (kiln_act)a;
            return KILN_OK;
        }
    return kiln_fail(KILN_ERR_NOT_FOUND, "kernel signature \"%s\": no activation scheme \"%s\"",
                     sig, value);
}

static const char *print_count(const kiln_kernel_desc *d, size_t at, char *buf, size_t size)
{
    snprintf(buf, size, "%lld", (long long)*(const int64_t *)((const char *)d + at));
    return buf;
}

static kiln_status parse_count(const kiln_registry *r, const char *sig, const char *value,
                               size_t at, kiln_kernel_desc *d)
{
    (void)r;
    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (errno || end == value || *end || v < 1)
        return malformed(sig, "a size is not a positive integer");
    *(int64_t *)((char *)d + at) = v;
    return KILN_OK;
}

/* "none" or names joined by '+', as kiln_epilogue_name writes them. */
static const char *print_epilogue(const kiln_kernel_desc *d, size_t at, char *buf, size_t size)
{
    (void)at;
    return kiln_epilogue_name(d->linear.cfg.epilogue, buf, size);
}

static kiln_status parse_epilogue(const kiln_registry *r, const char *sig, const char *value,
                                  size_t at, kiln_kernel_desc *d)
{
    (void)r, (void)at;
    unsigned epi = 0;
    if (!strcmp(value, "none")) {
        d->linear.cfg.epilogue = 0;
        return KILN_OK;
    }
    for (const char *p = value;; p++) {
        size_t len = strcspn(p, "+");
        unsigned bit = 0;
        for (unsigned b = 1; b <= KILN_EPI_GATE; b <<= 1) {
            char name[32];
            kiln_epilogue_name(b, name, sizeof name);
            if (strlen(name) == len && !strncmp(name, p, len))
                bit = b;
        }
        if (!bit || (epi & bit))
            return malformed(sig, "unknown epilogue");
        epi |= bit;
        p += len;
        if (!*p)
            break;
    }
    d->linear.cfg.epilogue = epi;
    return KILN_OK;
}

/* Linears write bf16; the field keeps room for other outputs. */
static const char *print_out(const kiln_kernel_desc *d, size_t at, char *buf, size_t size)
{
    (void)d, (void)at, (void)buf, (void)size;
    return "bf16";
}

static kiln_status parse_out(const kiln_registry *r, const char *sig, const char *value,
                             size_t at, kiln_kernel_desc *d)
{
    (void)r, (void)at, (void)d;
    if (strcmp(value, "bf16"))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "kernel signature \"%s\": output must be bf16", sig);
    return KILN_OK;
}

static kiln_status parse_target(const kiln_registry *r, const char *sig, const char *value,
                                size_t at, kiln_kernel_desc *d)
{
    (void)r, (void)at;
    /* A product alias names its architecture's row: no SM count. */
    kiln_target product;
    kiln_status st = kiln_target_arch(value, &d->target);
    if (st == KILN_ERR_NOT_FOUND && kiln_target_from_name(value, &product) == KILN_OK)
        st = kiln_target_arch(product.name, &d->target);
    return st == KILN_OK ? st : kiln_fail_prefix(st, "kernel signature \"%s\"", sig);
}

static const char *print_op(const kiln_kernel_desc *d, size_t at, char *buf, size_t size)
{
    (void)at, (void)buf, (void)size;
    return kiln_op_name(d->op);
}

static kiln_status parse_op(const kiln_registry *r, const char *sig, const char *value, size_t at,
                            kiln_kernel_desc *d)
{
    (void)r, (void)at;
    for (int op = 0; op < KILN_OP_COUNT; op++)
        if (!strcmp(kiln_op_name((kiln_op)op), value)) {
            d->op = (kiln_op)op;
            return KILN_OK;
        }
    return kiln_fail(KILN_ERR_NOT_FOUND, "kernel signature \"%s\": no op \"%s\"", sig, value);
}

/* ----------------------------------------------------------- the forms */

#define FIELD(key, name) { key, print_##name, parse_##name, 0 }
#define TEXT(key, name, member)                                                                    \
    { key, print_text, parse_##name, offsetof(kiln_kernel_desc, member) }
#define COUNT(key, member) { key, print_count, parse_count, offsetof(kiln_kernel_desc, member) }
#define ACT(key, member) { key, print_act, parse_act, offsetof(kiln_kernel_desc, member) }

static const sig_field linear_fields[] = {
    FIELD("backend", backend),
    TEXT("variant", variant, linear.variant),
    FIELD("format", format),
    FIELD("scales", scales),
    ACT("act", linear.act),
    COUNT("n", linear.cfg.n),
    COUNT("k", linear.cfg.k),
    FIELD("epilogue", epilogue),
    FIELD("out", out),
    TEXT("target", target, target.name),
};

static const sig_field op_fields[] = {
    FIELD(NULL, op),
    COUNT("width", width),
    TEXT("target", target, target.name),
};

static const sig_field quant_fields[] = {
    ACT("act", act),
    COUNT("k", width),
    TEXT("target", target, target.name),
};

/* A layout's device packer: the format is all it depends on. */
static const sig_field pack_fields[] = {
    FIELD("format", format),
    TEXT("target", target, target.name),
};

enum { SIG_MAX_FIELDS = KILN_ARRAY_LEN(linear_fields) };

/* A form: the word that starts it, its fields in print order, and the
 * field whose value names the entry (-1: the kind word). */
static const struct sig_form {
    const char *kind;
    const sig_field *fields;
    size_t n;
    int tag;
} sig_forms[] = {
    [KILN_STEP_OP] = { "op", op_fields, KILN_ARRAY_LEN(op_fields), 0 },
    [KILN_STEP_LINEAR] = { "linear", linear_fields, KILN_ARRAY_LEN(linear_fields), 0 },
    [KILN_STEP_QUANT] = { "quant", quant_fields, KILN_ARRAY_LEN(quant_fields), -1 },
    [KILN_STEP_PACK] = { "pack", pack_fields, KILN_ARRAY_LEN(pack_fields), -1 },
};
_Static_assert(KILN_ARRAY_LEN(sig_forms) == KILN_STEP_PACK + 1, "one form per step kind");
_Static_assert(KILN_ARRAY_LEN(op_fields) <= SIG_MAX_FIELDS &&
                   KILN_ARRAY_LEN(quant_fields) <= SIG_MAX_FIELDS &&
                   KILN_ARRAY_LEN(pack_fields) <= SIG_MAX_FIELDS,
               "the linear form has the most fields");

kiln_status kiln_sig_print(const kiln_kernel_desc *d, char *buf, size_t size)
{
    assert(d && (unsigned)d->kind < KILN_ARRAY_LEN(sig_forms) && buf && size);
    const struct sig_form *f = &sig_forms[d->kind];
    size_t used = (size_t)snprintf(buf, size, "%s", f->kind);
    for (size_t i = 0; i < f->n; i++) {
        char value[SIG_VALUE_MAX];
        const sig_field *fd = &f->fields[i];
        const char *v = fd->print(d, fd->at, value, sizeof value);
        used += (size_t)snprintf(used < size ? buf + used : NULL, used < size ? size - used : 0,
                                 " %s%s%s", fd->key ? fd->key : "", fd->key ? "=" : "", v);
    }
    if (used >= size)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kernel signature \"%s...\": longer than %zu bytes",
                         buf, size - 1);
    return KILN_OK;
}

kiln_status kiln_sig_name(kiln_kernel_desc *d, const char *signature)
{
    const struct sig_form *f = &sig_forms[d->kind];
    char value[SIG_VALUE_MAX];
    const char *tag = f->tag < 0 ? f->kind
                                 : f->fields[f->tag].print(d, f->fields[f->tag].at, value,
                                                           sizeof value);
    char entry[KILN_ENTRY_MAX];
    if (snprintf(entry, sizeof entry, "kiln_%s_%016llx", tag,
                 (unsigned long long)XXH3_64bits(signature, strlen(signature))) >=
        (int)sizeof entry)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "kernel signature \"%s\": backend name %s is too long for an entry name",
                         signature, tag);
    memcpy(d->entry, entry, sizeof entry);
    return KILN_OK;
}

/* The field of f keyed key, or f->n. */
static size_t field_keyed(const struct sig_form *f, const char *key)
{
    size_t i = 0;
    while (i < f->n && (!f->fields[i].key || strcmp(f->fields[i].key, key)))
        i++;
    return i;
}

kiln_status kiln_sig_parse(const kiln_registry *r, const char *signature, kiln_kernel_desc *out)
{
    if (!r || !signature || !out)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "kiln_sig_parse: registry, signature and out are required");
    char buf[KILN_SIG_MAX];
    if (strlen(signature) >= sizeof buf)
        return malformed(signature, "too long");
    memcpy(buf, signature, strlen(signature) + 1);
    char *save = NULL;
    const char *kind = strtok_r(buf, " ", &save);
    size_t form = 0;
    while (form < KILN_ARRAY_LEN(sig_forms) && (!kind || strcmp(kind, sig_forms[form].kind)))
        form++;
    if (form == KILN_ARRAY_LEN(sig_forms))
        return malformed(signature, "does not start with linear, op, quant or pack");
    const struct sig_form *f = &sig_forms[form];
    /* Split first, so that text of the wrong shape is malformed whatever
     * its values are. */
    const char *value[SIG_MAX_FIELDS] = { NULL };
    for (size_t i = 0; i < f->n && !f->fields[i].key; i++)
        if (!(value[i] = strtok_r(NULL, " ", &save)))
            return kiln_fail(KILN_ERR_MALFORMED, "kernel signature \"%s\": no %s name", signature,
                             f->kind);
    for (char *tok; (tok = strtok_r(NULL, " ", &save));) {
        char *eq = strchr(tok, '=');
        if (!eq || eq == tok)
            return malformed(signature, "a field is not key=value");
        *eq = '\0';
        size_t i = field_keyed(f, tok);
        if (i == f->n || value[i])
            return malformed(signature, "unknown or repeated field");
        value[i] = eq + 1;
    }
    for (size_t i = 0; i < f->n; i++)
        if (!value[i])
            return malformed(signature, "a field is missing");
    kiln_kernel_desc d = { .kind = (kiln_step_kind)form };
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < f->n && st == KILN_OK; i++)
        if (f->fields[i].parse)
            st = f->fields[i].parse(r, signature, value[i], f->fields[i].at, &d);
    if (st == KILN_OK && d.kind == KILN_STEP_LINEAR &&
        (d.linear.cfg.epilogue & ~d.backend->epilogues))
        return malformed(signature, "the backend does not fuse that epilogue");
    if (st == KILN_OK && (st = kiln_sig_name(&d, signature)) == KILN_OK)
        *out = d;
    return st;
}
