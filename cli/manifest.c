/* What kiln cache export records of a model and its planning options in a
 * shipped file's manifest, and what kiln run checks a shipped file
 * against before anything loads. */
#include "cli.h"

#include <dirent.h>
#include <stdarg.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* FNV-1a, 64 bits: a digest of the graph, not a defence against forgery
 * (the file's own checksums cover its bytes). */
static void fnv(uint64_t *h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        *h = (*h ^ b[i]) * 0x100000001b3ull;
}

/* Every tensor of the graph the model gives, in order: name, op, shape and
 * format, all read from the file's headers. Weights' values are not in it:
 * new weights of the same shapes need the same kernels. */
static void graph_digest(kiln_graph *g, char out[17])
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < kiln_graph_n_tensors(g); i++) {
        const kiln_tensor *t = kiln_graph_tensor(g, i);
        const kiln_qtensor *w = kiln_tensor_weight(t);
        int64_t v[4] = { kiln_tensor_op(t), kiln_tensor_ne(t, 0), kiln_tensor_ne(t, 1),
                         w ? (int64_t)w->format : -1 };
        fnv(&h, kiln_tensor_name(t), strlen(kiln_tensor_name(t)) + 1);
        fnv(&h, v, sizeof v);
    }
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(json_string_value(json_object_get(*(json_t *const *)a, "name")),
                  json_string_value(json_object_get(*(json_t *const *)b, "name")));
}

/* The model's files, name and size: the file, or a directory's regular
 * files, sorted by name; none for the demo. */
static json_t *model_files(const cli_source *src)
{
    json_t *files = json_array();
    struct stat st;
    if (src->demo || stat(src->name, &st))
        return files;
    if (!S_ISDIR(st.st_mode)) {
        const char *base = strrchr(src->name, '/');
        json_array_append_new(files, json_pack("{s:s, s:I}", "name", base ? base + 1 : src->name,
                                               "bytes", (json_int_t)st.st_size));
        return files;
    }
    DIR *d = opendir(src->name);
    json_t *list[256];
    size_t n = 0;
    for (struct dirent *e; d && n < 256 && (e = readdir(d));) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", src->name, e->d_name);
        if (e->d_name[0] != '.' && !stat(path, &st) && S_ISREG(st.st_mode))
            list[n++] = json_pack("{s:s, s:I}", "name", e->d_name, "bytes", (json_int_t)st.st_size);
    }
    if (d)
        closedir(d);
    qsort(list, n, sizeof list[0], by_name);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(files, list[i]);
    return files;
}

static json_t *model_identity(const cli_source *src)
{
    char digest[17];
    graph_digest(src->g, digest);
    return json_pack("{s:s, s:o, s:s}", "name", src->name, "files", model_files(src), "graph",
                     digest);
}

/* The planning options as given (0 and null: the default). */
static json_t *plan_options(const cli_plan_args *a)
{
    json_t *capture = json_null();
    if (a->n_capture) {
        capture = json_array();
        for (int i = 0; i < a->n_capture; i++)
            json_array_append_new(capture, json_integer(a->capture[i]));
    }
    return json_pack("{s:o, s:I, s:s?, s:b, s:b, s:s, s:i}", "capture", capture, "max_tokens",
                     (json_int_t)a->po.max_tokens, "backend", a->po.backend, "strict_backend",
                     a->po.strict_backend, "no_fuse", a->po.no_fuse, "graph", a->graph, "layers",
                     a->layers);
}

char *cli_manifest_make(const cli_source *src, const cli_plan_args *a)
{
    json_t *m = json_pack("{s:o, s:o}", "model", model_identity(src), "options", plan_options(a));
    char *text = m ? json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(m);
    return text;
}

/* --------------------------------------------------------- checking */

typedef struct differ {
    const char *cmd, *file;
    int n;
} differ;

static void differs(differ *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void differs(differ *d, const char *fmt, ...)
{
    char msg[1024], safe[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kiln %s: %s was made for another %s\n", d->cmd, d->file,
            cli_printable(msg, safe, sizeof safe));
    d->n++;
}

static const char *text_or(const json_t *v, const char *none)
{
    return json_is_string(v) ? json_string_value(v) : none;
}

/* "1, 8, 64" */
static void int_list(const json_t *a, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v)
    {
        int n = snprintf(buf + used, used < size ? size - used : 0, "%s%lld", i ? "," : "",
                         (long long)json_integer_value(v));
        used += n > 0 ? (size_t)n : 0;
    }
}

int cli_manifest_check(const char *cmd, const char *file, const char *json, const cli_source *src,
                       const cli_plan_args *a, const kiln_plan *p, const kiln_target *t)
{
    differ d = { .cmd = cmd, .file = file };
    json_error_t err;
    json_t *m = json_loads(json, JSON_REJECT_DUPLICATES, &err);
    if (!json_is_object(m)) {
        json_decref(m);
        fprintf(stderr, "kiln %s: %s: its manifest is not a JSON object (%s)\n", cmd, file,
                err.text);
        return 1;
    }
    json_t *model = json_object_get(m, "model"), *o = json_object_get(m, "options");
    json_t *mine = model_identity(src), *opts = plan_options(a);
    const char *had = text_or(json_object_get(model, "graph"), "?");
    if (strcmp(had, json_string_value(json_object_get(mine, "graph")))) {
        char *files = json_dumps(json_object_get(model, "files"), JSON_COMPACT);
        char *now = json_dumps(json_object_get(mine, "files"), JSON_COMPACT);
        differs(&d, "model: %s (files %s, graph %s), not %s (files %s, graph %s)",
                text_or(json_object_get(model, "name"), "?"), files ? files : "?", had,
                src->name, now ? now : "?", json_string_value(json_object_get(mine, "graph")));
        free(files);
        free(now);
    }
    char want[512], have[512];
    json_t *buckets = json_object_get(m, "buckets"), *these = json_array();
    for (int b = 0; p && b < kiln_plan_n_buckets(p); b++)
        json_array_append_new(these, json_integer(kiln_plan_bucket(p, b)));
    if (p && !json_equal(buckets, these)) {
        int_list(buckets, have, sizeof have);
        int_list(these, want, sizeof want);
        differs(&d, "set of token buckets: %s, not %s (--capture and --max-tokens as given to "
                "kiln compile and kiln cache export)", have, want);
    }
    json_decref(these);
    static const char *const same[][2] = { { "backend", "--backend" },
                                           { "strict_backend", "--strict-backend" },
                                           { "no_fuse", "--no-fuse" },
                                           { "graph", "--graph" },
                                           { "layers", "--layers" } };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        json_t *x = json_object_get(o, same[i][0]), *y = json_object_get(opts, same[i][0]);
        if (json_equal(x, y))
            continue;
        char *xs = x ? json_dumps(x, JSON_ENCODE_ANY) : NULL, *ys = json_dumps(y, JSON_ENCODE_ANY);
        differs(&d, "planning option: %s %s, not %s", same[i][1], xs ? xs : "(none)",
                ys ? ys : "?");
        free(xs);
        free(ys);
    }
    if (t && t->name[0]) {
        json_t *targets = json_object_get(m, "targets"), *v;
        size_t i;
        int found = 0;
        json_array_foreach(targets, i, v) found |= !strcmp(text_or(v, ""), t->name);
        if (!found) {
            char *list = json_dumps(targets, JSON_COMPACT);
            differs(&d, "target: %s, not %s", list ? list : "?", t->name);
            free(list);
        }
    }
    json_decref(mine);
    json_decref(opts);
    json_decref(m);
    return d.n;
}

/* ------------------------------------------------------------ stat */

void cli_manifest_print(const char *json)
{
    json_error_t err;
    json_t *m = json_loads(json, JSON_REJECT_DUPLICATES, &err);
    if (!json_is_object(m)) {
        printf("manifest: not a JSON object (%s)\n", err.text);
        json_decref(m);
        return;
    }
    char safe[2048], buckets[512];
    json_t *model = json_object_get(m, "model");
    char *targets = json_dumps(json_object_get(m, "targets"), JSON_COMPACT);
    char *options = json_dumps(json_object_get(m, "options"), JSON_COMPACT);
    char *files = json_dumps(json_object_get(model, "files"), JSON_COMPACT);
    int_list(json_object_get(m, "buckets"), buckets, sizeof buckets);
    printf("manifest: kiln %s, %s, %lld kernels\n", text_or(json_object_get(m, "kiln"), "?"),
           text_or(json_object_get(m, "schema"), "?"),
           (long long)json_integer_value(json_object_get(m, "kernels")));
    printf("  model:    %s, graph %s, files %s\n",
           cli_printable(text_or(json_object_get(model, "name"), "?"), safe, sizeof safe),
           text_or(json_object_get(model, "graph"), "?"), files ? files : "?");
    printf("  targets:  %s\n  buckets:  %s\n  options:  %s\n", targets ? targets : "?", buckets,
           options ? options : "?");
    free(targets);
    free(options);
    free(files);
    json_decref(m);
}
