/* compressed-tensors (llm-compressor's checkpoints): the quantization_config
 * with quant_method "compressed-tensors", and which of its schemes a weight
 * falls under. Its FP8 schemes (float, 8 bits, per tensor, per channel, in
 * blocks, or MXFP8's groups of 32) store the layouts safetensors_quant.c
 * already joins, and its pack-quantized integer schemes (int4 and int8
 * per group or per channel, symmetric or with zero points) map to kiln's
 * integer group formats; the rest (act-order g_idx, other bit widths,
 * dynamic weights, NVFP4 with a reciprocal global scale) are refused
 * naming the config field that asks for them.
 *
 * A group's targets and the ignore list match a module as compressed-tensors
 * does: "re:PATTERN" when the pattern matches at the start of the module's
 * name (Python's re.match; kiln compiles it as a POSIX extended regular
 * expression), "Linear" for any linear weight, else the module's exact
 * name. */
#include "graph/safetensors_impl.h"

#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static kiln_status ct_bad(const char *file, const char *field, const char *what)
{
    return kiln_fail(KILN_ERR_MALFORMED, "%s: quantization_config.%s %s", file, field, what);
}

/* An optional string member; NULL when absent or null. */
static kiln_status ct_str(const char *file, const json_t *o, const char *key, const char *where,
                          const char **out)
{
    const json_t *v = json_object_get(o, key);
    *out = NULL;
    if (!v || json_is_null(v))
        return KILN_OK;
    if (!json_is_string(v)) {
        char field[256]; /* where is at most 191 bytes, key a field name */
        snprintf(field, sizeof field, "%s%s", where, key);
        return ct_bad(file, field, "is not a string");
    }
    *out = json_string_value(v);
    return KILN_OK;
}

/* Every weight is matched against every pattern, each compiled anew: a
 * bound keeps a config.json of a million patterns from costing a million
 * compiles per tensor. Real configs hold a few. */
#define CT_MAX_PATTERNS 256

/* A list of strings; *patterns counts its "re:" entries. */
static kiln_status ct_str_list(const char *file, const json_t *v, const char *field,
                               size_t *patterns)
{
    if (!v || json_is_null(v))
        return KILN_OK;
    if (!json_is_array(v))
        return ct_bad(file, field, "is not a list of strings");
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_string(e))
            return ct_bad(file, field, "is not a list of strings");
        if (!strncmp(json_string_value(e), "re:", 3) && ++*patterns > CT_MAX_PATTERNS)
            return kiln_fail(KILN_ERR_MALFORMED,
                             "%s: quantization_config: more than %d \"re:\" patterns in "
                             "config_groups and ignore", file, CT_MAX_PATTERNS);
    }
    return KILN_OK;
}

/* weights or input_activations of a group: the members kiln reads have the
 * types compressed-tensors' QuantizationArgs gives them. */
static kiln_status ct_check_args(const char *file, const char *group, const char *role,
                                 const json_t *a)
{
    char where[160], field[192];
    snprintf(where, sizeof where, "config_groups.%s.%s", group, role);
    if (!a || json_is_null(a))
        return KILN_OK;
    if (!json_is_object(a))
        return ct_bad(file, where, "is not an object");
    static const char *ints[] = { "num_bits", "group_size" };
    for (size_t i = 0; i < KILN_ARRAY_LEN(ints); i++) {
        const json_t *v = json_object_get(a, ints[i]);
        snprintf(field, sizeof field, "%s.%s", where, ints[i]);
        /* group_size -1 is compressed-tensors' spelling of per channel. */
        int channel = i == 1 && json_is_integer(v) && json_integer_value(v) == -1;
        if (v && !json_is_null(v) && !channel &&
            (!json_is_integer(v) || json_integer_value(v) <= 0))
            return ct_bad(file, field, "is not a positive integer");
    }
    static const char *bools[] = { "symmetric", "dynamic" };
    for (size_t i = 0; i < KILN_ARRAY_LEN(bools); i++) {
        const json_t *v = json_object_get(a, bools[i]);
        snprintf(field, sizeof field, "%s.%s", where, bools[i]);
        /* dynamic may also be the string "local" (NVFP4's global scale). */
        if (v && !json_is_null(v) && !json_is_boolean(v) && !json_is_string(v))
            return ct_bad(file, field, "is not a boolean");
    }
    const char *s;
    snprintf(where + strlen(where), sizeof where - strlen(where), ".");
    kiln_status st = ct_str(file, a, "type", where, &s);
    if (!st)
        st = ct_str(file, a, "strategy", where, &s);
    if (st)
        return st;
    const json_t *bs = json_object_get(a, "block_structure");
    snprintf(field, sizeof field, "%sblock_structure", where);
    if (bs && !json_is_null(bs)) {
        const json_t *r = json_array_get(bs, 0), *c = json_array_get(bs, 1);
        if (json_array_size(bs) != 2 || !json_is_integer(r) || !json_is_integer(c) ||
            json_integer_value(r) <= 0 || json_integer_value(c) <= 0)
            return ct_bad(file, field, "is not [rows, cols]");
    }
    return KILN_OK;
}

kiln_status kiln_st_ct_parse(kiln_st_loader *L, const char *file, const json_t *q)
{
    const char *fmt;
    size_t patterns = 0;
    const json_t *groups = json_object_get(q, "config_groups");
    kiln_status st = ct_str(file, q, "format", "", &fmt);
    if (st)
        return st;
    if (!json_is_object(groups))
        return ct_bad(file, "config_groups", "is not an object of quantization schemes");
    const char *name;
    const json_t *g;
    json_object_foreach((json_t *)groups, name, g) {
        char field[192];
        snprintf(field, sizeof field, "config_groups.%s", name);
        if (!json_is_object(g))
            return ct_bad(file, field, "is not an object");
        snprintf(field, sizeof field, "config_groups.%s.targets", name);
        if ((st = ct_str_list(file, json_object_get(g, "targets"), field, &patterns)))
            return st;
        snprintf(field, sizeof field, "config_groups.%s.", name);
        if ((st = ct_str(file, g, "format", field, &fmt)) ||
            (st = ct_check_args(file, name, "weights", json_object_get(g, "weights"))) ||
            (st = ct_check_args(file, name, "input_activations",
                                json_object_get(g, "input_activations"))))
            return st;
    }
    if ((st = ct_str_list(file, json_object_get(q, "ignore"), "ignore", &patterns)))
        return st;
    char *copy = kiln_strdup(file);
    if (!copy)
        return kiln_st_nomem();
    json_decref(L->ct);
    free(L->ct_file);
    L->ct = json_incref((json_t *)q);
    L->ct_file = copy;
    return KILN_OK;
}

/* Whether target names module (see the top of the file). */
static int ct_match(const char *target, const char *module)
{
    if (!strcmp(target, "Linear") || !strcmp(target, module))
        return 1;
    if (strncmp(target, "re:", 3))
        return 0;
    size_t len = strlen(target + 3) + 4;
    char *anchored = kiln_malloc(len);
    if (!anchored)
        return 0;
    snprintf(anchored, len, "^(%s)", target + 3);
    regex_t re;
    int hit = 0;
    if (regcomp(&re, anchored, REG_EXTENDED | REG_NOSUB) == 0) {
        hit = regexec(&re, module, 0, NULL, 0) == 0;
        regfree(&re);
    }
    free(anchored);
    return hit;
}

static int ct_listed(const json_t *list, const char *module)
{
    for (size_t i = 0; list && i < json_array_size(list); i++)
        if (ct_match(json_string_value(json_array_get(list, i)), module))
            return 1;
    return 0;
}

static int64_t ct_int(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? json_integer_value(v) : 0;
}

static const char *ct_text(const json_t *o, const char *key, const char *none)
{
    const json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : none;
}

/* An integer scheme kiln has a format for: pack-quantized int4 or int8
 * codes, static, per group or per channel, in column order (actorder
 * "weight" / "static" changes calibration only; "group" / "dynamic" / true
 * stores weight_g_idx, a permutation kiln's kernels do not apply). 1 with
 * out filled, or 0 with why naming the field that asks for more. */
static int ct_int_scheme(const json_t *w, const char *fmt, kiln_st_ct_scheme *out, char *why,
                         size_t size)
{
    const char *strategy = ct_text(w, "strategy", "tensor");
    int64_t bits = ct_int(w, "num_bits"), group = ct_int(w, "group_size");
    const json_t *dyn = json_object_get(w, "dynamic"), *order = json_object_get(w, "actorder");
    const char *ord = json_is_string(order) ? json_string_value(order) : NULL;
    if (strcmp(fmt, "pack-quantized"))
        snprintf(why, size, "format \"%s\": kiln reads integer weights as pack-quantized writes "
                 "them, in int32 words", fmt);
    else if (bits != 4 && bits != 8)
        snprintf(why, size, "num_bits %lld: kiln's integer formats are int4 and int8",
                 (long long)bits);
    else if (dyn && !json_is_false(dyn) && !json_is_null(dyn))
        snprintf(why, size, "dynamic: weights quantized at run time store no codes to read");
    else if (json_is_true(order) ||
             (ord && (!strcasecmp(ord, "group") || !strcasecmp(ord, "dynamic"))))
        snprintf(why, size, "actorder %s: act-order weights need weight_g_idx, which kiln does not "
                 "apply", ord ? ord : "true");
    else if (strcmp(strategy, "group") && strcmp(strategy, "channel"))
        snprintf(why, size, "strategy %s: kiln's integer formats are per group or per channel",
                 strategy);
    else if (!strcmp(strategy, "group") && group <= 0)
        snprintf(why, size, "strategy group without a positive group_size");
    else {
        out->kind = KILN_ST_CT_INT;
        out->int_bits = (int)bits;
        out->int_group = !strcmp(strategy, "group") ? group : 0;
        out->int_zero_point = json_is_false(json_object_get(w, "symmetric"));
        return 1;
    }
    return 0;
}

kiln_status kiln_st_ct_lookup(const kiln_st_loader *L, const char *module, kiln_st_ct_scheme *out)
{
    *out = (kiln_st_ct_scheme){ .kind = KILN_ST_CT_NONE };
    if (!L->ct)
        return KILN_OK;
    if (ct_listed(json_object_get(L->ct, "ignore"), module)) {
        out->kind = KILN_ST_CT_IGNORED;
        return KILN_OK;
    }
    const char *name;
    const json_t *g;
    json_object_foreach(json_object_get(L->ct, "config_groups"), name, g) {
        if (!ct_listed(json_object_get(g, "targets"), module))
            continue;
        const json_t *w = json_object_get(g, "weights");
        const char *fmt = ct_text(g, "format", ct_text(L->ct, "format", "unnamed format"));
        const char *type = ct_text(w, "type", "?"), *strategy = ct_text(w, "strategy", "tensor");
        int64_t bits = ct_int(w, "num_bits"), group = ct_int(w, "group_size");
        const json_t *sym = json_object_get(w, "symmetric");
        snprintf(out->group, sizeof out->group, "%s", name);
        if (!w || json_is_null(w)) {
            out->kind = KILN_ST_CT_NONE; /* activations only: the weight stays as stored */
            return KILN_OK;
        }
        /* Static activations: one input_scale per linear, stored beside
         * the weight. */
        const json_t *in = json_object_get(g, "input_activations");
        out->act_static = json_is_object(in) && json_is_false(json_object_get(in, "dynamic"));
        if (!strcmp(type, "float") && bits == 8 && !json_is_false(sym) &&
            (!strcmp(strategy, "tensor") || !strcmp(strategy, "channel") ||
             !strcmp(strategy, "block"))) {
            out->kind = KILN_ST_CT_FP8;
            const json_t *bs = json_object_get(w, "block_structure");
            if (!strcmp(strategy, "block")) {
                int given = json_is_array(bs);
                out->block_rows = given ? json_integer_value(json_array_get(bs, 0)) : 128;
                out->block_cols = given ? json_integer_value(json_array_get(bs, 1)) : 128;
            }
            return KILN_OK;
        }
        /* MXFP8 as compressed-tensors writes it: E8M0 exponents in U8. */
        if (!strcmp(type, "float") && bits == 8 && !json_is_false(sym) &&
            !strcmp(strategy, "group") && group == 32) {
            out->kind = KILN_ST_CT_FP8;
            out->mxfp8 = 1;
            return KILN_OK;
        }
        char int_why[160] = "";
        if (!strcmp(type, "int") && ct_int_scheme(w, fmt, out, int_why, sizeof int_why))
            return KILN_OK;
        out->kind = KILN_ST_CT_UNSUPPORTED;
        char scheme[96];
        if (group)
            snprintf(scheme, sizeof scheme, "%s%lld %s %lld", type, (long long)bits, strategy,
                     (long long)group);
        else
            snprintf(scheme, sizeof scheme, "%s%lld %s", type, (long long)bits, strategy);
        const char *why;
        if (int_why[0])
            why = int_why;
        else if (!strcmp(type, "float") && bits == 4 && group == 16)
            why = "compressed-tensors' NVFP4 stores weight_global_scale, the reciprocal of "
                  "kiln's global scale, which kiln would have to round; not read yet";
        else if (!strcmp(type, "float") && bits == 4)
            why = "compressed-tensors' FP4 weight_packed layout is not read yet";
        else if (!strcmp(type, "float") && bits == 8)
            why = json_is_false(sym) ? "asymmetric FP8 is no kiln format"
                                     : "kiln's FP8 is per tensor, per channel or in 128x128 "
                                       "blocks";
        else
            why = "no kiln format";
        int n = snprintf(out->why, sizeof out->why,
                         "compressed-tensors quantization_config.config_groups.%s.weights: %s "
                         "(%s): %s", name, scheme, fmt, why);
        if (n >= (int)sizeof out->why) /* cut short, and said so */
            memcpy(out->why + sizeof out->why - 4, "...", 4);
        return KILN_OK;
    }
    return KILN_OK;
}
