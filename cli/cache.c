/* `kiln cache`: look into kernel caches, check and prune them, and write the
 * file a deployment ships: exactly the kernels of one plan. */
#include "cli.h"

#include <assert.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static void help(FILE *out)
{
    fprintf(out,
            "usage: kiln cache SUBCOMMAND [ARGS] [--cache FILE]\n"
            "\n"
            "Looks into kernel caches, checks and prunes them, and writes the cache file a\n"
            "deployment ships. The writable cache is the one kiln compile fills; a shipped\n"
            "cache is a read-only file a deployment searches before it.\n"
            "\n"
            "  ls [FILE] [--wide]     one line per record: key, target, kind (backend, op,\n"
            "                         quant or pack), cubin size, date created (UTC), signature; the\n"
            "                         signature is cut to fit unless --wide, which also shows\n"
            "                         the compiler\n"
            "  stat [FILE]            records, sizes (values, cubins, the file, its map),\n"
            "                         oldest and newest record, records by target and by\n"
            "                         kind; an exported file's manifest: kiln version, cache\n"
            "                         schema, model (name, files, graph digest), targets,\n"
            "                         token buckets, planning options; the tuning table's\n"
            "                         entries (kiln tune)\n"
            "  verify [FILE]          check each file's structure, every record and an\n"
            "                         exported file's manifest and tuning table; print each\n"
            "                         damaged file and\n"
            "                         each bad record (key, problem), then\n"
            "                         \"N records, B bad\"; exit 1 when any is\n"
            "  check --model MODEL|demo [--json] [planning options]\n"
            "                         plan MODEL as kiln plan does (default target sm_90a;\n"
            "                         one plan per --target, which may be repeated) and say\n"
            "                         whether the files read (--shipped, else the writable\n"
            "                         cache) hold every kernel the plans need; print each\n"
            "                         missing one (signature, key) and exit 1 when any is.\n"
            "                         Needs no GPU and compiles nothing\n"
            "  export --model MODEL|demo -o SHIPPED [--force] [planning options]\n"
            "                         plan MODEL (a model file or directory, or demo) as kiln\n"
            "                         plan does (default target sm_90a; one plan per\n"
            "                         --target, which may be repeated: one file for a fleet\n"
            "                         of mixed GPUs), and write SHIPPED holding exactly the\n"
            "                         kernels the plans need, each\n"
            "                         from the first cache that has it; a kernel no cache has\n"
            "                         is an error: run kiln compile with the same options\n"
            "                         first. An existing SHIPPED is replaced only with --force.\n"
            "                         SHIPPED holds a manifest (see stat) that kiln run checks\n"
            "                         against the model and options it is given\n"
            "  merge SRC              copy every intact record of the cache file SRC into the\n"
            "                         writable cache, keeping the intact records it has; print\n"
            "                         how many were added, present, replaced (corrupt here) and\n"
            "                         bad (corrupt in SRC, left out)\n"
            "  gc [--compiler VERSION] [--older-than DAYS] [--corrupt] [--version N]\n"
            "     [--dry-run] [--force]\n"
            "                         remove from the writable cache every record made by a\n"
            "                         compiler other than VERSION (as ls --wide shows it, e.g.\n"
            "                         \"nvrtc 13.0\"), created more than DAYS ago, failing\n"
            "                         verify, or of record version N; give at least one.\n"
            "                         Records of another kiln's version are removed by\n"
            "                         --version only. Each record removed is named;\n"
            "                         --dry-run names them and removes nothing. A VERSION\n"
            "                         no record was made by (which would remove them all) is\n"
            "                         refused unless --force\n"
            "  salvage SRC -o DST [--force]\n"
            "                         copy every intact record found in the cache file SRC,\n"
            "                         damaged or not, and an exported file's manifest and a\n"
            "                         tuning table when intact, into a new file DST\n"
            "  rm KEYPREFIX | --all   remove the writable cache's records whose key starts with\n"
            "                         KEYPREFIX (1 to 32 hex digits; none matching is an\n"
            "                         error), or all of them\n"
            "\n"
            "  --cache FILE           the writable cache (default $KILN_CACHE, else\n"
            "                         $XDG_CACHE_HOME/kiln/kernels.kiln, else\n"
            "                         ~/.cache/kiln/kernels.kiln); created when absent by\n"
            "                         the commands that write it\n"
            "  --shipped FILE         ls, stat, verify, check: a file to read as well as FILE\n"
            "                         (repeatable); export: a shipped cache searched before\n"
            "                         the writable one\n"
            "  --json                 ls, stat, check: the result as JSON on stdout, sizes\n"
            "                         in bytes (the text gives them in binary units)\n"
            "\n"
            "ls, stat, verify and check read the files named (FILE and --shipped), or the\n"
            "writable cache when none is; a named file is opened read-only without a lock,\n"
            "as a deployment opens it, unless it is the writable cache. They create no file\n"
            "or folder: a writable cache not made yet reads as empty.\n"
            "\n"
            "planning options of export and check, as for kiln plan:\n" CLI_PLAN_HELP);
}

/* Options of the cache subcommands; a subcommand lists the ones it takes as
 * bits of this enum. The planning options are export's alone. */
typedef enum cache_opt {
    CACHE_OPT_CACHE,
    CACHE_OPT_SHIPPED,
    CACHE_OPT_WIDE,
    CACHE_OPT_MODEL,
    CACHE_OPT_OUTPUT,
    CACHE_OPT_FORCE,
    CACHE_OPT_COMPILER,
    CACHE_OPT_OLDER,
    CACHE_OPT_CORRUPT,
    CACHE_OPT_ALL,
    CACHE_OPT_VERSION,
    CACHE_OPT_JSON,
    CACHE_OPT_DRY_RUN,
    CACHE_OPT_COUNT
} cache_opt;

/* getopt_long values of the options above, clear of the planning ones. */
enum { CACHE_OPT_BASE = 2000 };

#define TAKES(o) (1u << CACHE_OPT_##o)

/* Files a reading subcommand may name, FILE and --shipped together. */
enum { CACHE_MAX_FILES = 16 };

/* Signature characters ls prints without --wide: a line of about 140
 * columns, enough to show backend, variant and format. */
enum { LS_SIGNATURE_COLS = 64 };

typedef struct cache_args cache_args;

typedef struct cache_sub {
    const char *name;
    unsigned takes;      /* TAKES() bits */
    bool plans;          /* takes the planning options */
    int min_args, max_args;
    const char *missing; /* the usage error when fewer than min_args are given */
    int (*run)(cache_args *a);
} cache_sub;

struct cache_args {
    const cache_sub *sub;
    const char *cache;
    const char *files[CACHE_MAX_FILES];
    int n_files;
    const char *model, *output, *compiler;
    uint64_t max_age_s;
    uint32_t version;
    int wide, force, corrupt, all, json, dry_run;
    cli_plan_args plan;
    char **args;
    int n_args;
    json_t *out; /* --json: what a visitor adds to */
};

static int usage(const cache_args *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int usage(const cache_args *a, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!a->sub)
        return cli_usage(&cli_cmd_cache, "%s", msg);
    return cli_usage(&cli_cmd_cache, "%s: %s", a->sub->name, msg);
}

static int fail(const cache_args *a, kiln_status st)
{
    char what[32];
    snprintf(what, sizeof what, "cache %s", a->sub->name);
    return cli_fail(st, what);
}

/* ------------------------------------------------------------ opening */

static bool same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return !stat(a, &sa) && !stat(b, &sb) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static const char *layer_role(const kiln_cache *c, int layer)
{
    return layer == kiln_cache_writable_layer(c) ? "writable" : "shipped";
}

/* What a reading subcommand reads: the named files, read-only and without a
 * lock, or the writable cache when none is named. A named file that is the
 * writable cache goes through LMDB's lock instead, because another process
 * may be writing it. A damaged file fails the open unless the subcommand
 * reports damage itself (strict 0). Reading creates nothing: a writable
 * cache that does not exist yet is said so on stderr and read as empty (no
 * layer). */
static kiln_status open_named(const cache_args *a, int strict, kiln_cache **out)
{
    char writable[4096];
    const char *path = a->cache;
    if (!path && kiln_cache_default_path(writable, sizeof writable) == KILN_OK)
        path = writable;
    const char *shipped[CACHE_MAX_FILES];
    struct stat st;
    bool absent = !a->n_files && path && stat(path, &st) && errno == ENOENT;
    if (absent)
        fprintf(stderr, "kiln cache %s: no cache at %s yet\n", a->sub->name, path);
    kiln_cache_options o = { .shipped = shipped, .path = a->cache,
                             .no_writable = a->n_files > 0 || absent, .strict = strict };
    for (int i = 0; i < a->n_files; i++) {
        if (path && same_file(a->files[i], path))
            o.no_writable = 0;
        else
            shipped[o.n_shipped++] = a->files[i];
    }
    return kiln_cache_open(&o, out);
}

static kiln_status open_writable(const cache_args *a, kiln_cache **out)
{
    kiln_cache_options o = { .path = a->cache, .strict = 1 };
    return kiln_cache_open(&o, out);
}

/* ---------------------------------------------------------- reporting */

static void key_text(const kiln_cache_entry *e, char out[KILN_CACHE_KEY_HEX])
{
    if (e->key_size == KILN_CACHE_KEY_BYTES)
        kiln_cache_key_hex(e->key, out);
    else
        snprintf(out, KILN_CACHE_KEY_HEX, "(a key of %zu bytes)", e->key_size);
}

static void time_text(uint64_t t, const char *fmt, char *buf, size_t size)
{
    struct tm tm;
    time_t tt = (time_t)t;
    if (!t || !gmtime_r(&tt, &tm) || !strftime(buf, size, fmt, &tm))
        snprintf(buf, size, "-");
}

/* Before each layer's report when a subcommand reads more than one. */
static void layer_heading(const kiln_cache *c, int layer)
{
    if (kiln_cache_n_layers(c) > 1)
        printf("%s%s (%s):\n", layer ? "\n" : "", kiln_cache_layer_path(c, layer),
               layer_role(c, layer));
}

/* ----------------------------------------------------------------- ls */

/* One entry as JSON: exact sizes, every field of an intact record. */
static json_t *entry_json(const kiln_cache_entry *e)
{
    char key[KILN_CACHE_KEY_HEX];
    key_text(e, key);
    const kiln_cache_record *r = &e->rec;
    const char *status = e->status == KILN_OK                 ? "ok"
                         : e->status == KILN_ERR_UNSUPPORTED ? "other version"
                                                             : "bad";
    json_t *o = json_pack("{s:s, s:s, s:I, s:i}", "key", key, "status", status, "bytes",
                          (json_int_t)e->size, "version", (int)r->version);
    if (e->status == KILN_OK)
        json_object_update_new(
            o, json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:I, s:I}", "target", r->target,
                         "kind", r->kind, "compiler", r->compiler, "entry", r->entry,
                         "signature", r->signature, "threads", (int)r->threads, "smem",
                         (int)r->smem, "cubin_bytes", (json_int_t)r->cubin_size, "created",
                         (json_int_t)r->created));
    else if (e->status != KILN_ERR_UNSUPPORTED)
        json_object_set_new(o, "problem", json_string(e->problem));
    return o;
}

static kiln_status ls_visit(void *ctx, const kiln_cache_entry *e)
{
    const cache_args *a = ctx;
    if (a->json) {
        json_array_append_new(a->out, entry_json(e));
        return KILN_OK;
    }
    char key[KILN_CACHE_KEY_HEX], date[16], size[32];
    key_text(e, key);
    if (e->status == KILN_ERR_UNSUPPORTED) {
        printf("%-32s  record version %u, left alone\n", key, e->rec.version);
        return KILN_OK;
    }
    if (e->status != KILN_OK) {
        printf("%-32s  bad: %s\n", key, e->problem);
        return KILN_OK;
    }
    const kiln_cache_record *r = &e->rec;
    time_text(r->created, "%Y-%m-%d", date, sizeof date);
    printf("%s  %-7s %-7s %9s  %-10s  ", key, r->target, r->kind,
           cli_bytes(r->cubin_size, size, sizeof size), date);
    size_t len = strlen(r->signature);
    if (a->wide)
        printf("%-12s  %s\n", r->compiler, r->signature);
    else if (len > LS_SIGNATURE_COLS)
        printf("%.*s...\n", LS_SIGNATURE_COLS - 3, r->signature);
    else
        printf("%s\n", r->signature);
    return KILN_OK;
}

static int print_json(json_t *root)
{
    int rc = json_dumpf(root, stdout, JSON_INDENT(1)) == 0 ? CLI_OK : CLI_FAIL;
    putchar('\n');
    json_decref(root);
    return rc;
}

static int run_ls(cache_args *a)
{
    kiln_cache *c = NULL;
    json_t *caches = json_array();
    kiln_status st = open_named(a, 1, &c);
    for (int i = 0; st == KILN_OK && i < kiln_cache_n_layers(c); i++) {
        if (a->json) {
            a->out = json_array();
            st = kiln_cache_foreach(c, i, ls_visit, a);
            json_array_append_new(caches, json_pack("{s:s, s:s, s:o}", "path",
                                                    kiln_cache_layer_path(c, i), "role",
                                                    layer_role(c, i), "records", a->out));
            continue;
        }
        layer_heading(c, i);
        printf("%-32s  %-7s %-7s %9s  %-10s  %s%s\n", "key", "target", "kind", "cubin",
               "created", a->wide ? "compiler      " : "", "signature");
        st = kiln_cache_foreach(c, i, ls_visit, a);
    }
    kiln_cache_close(c);
    if (st != KILN_OK) {
        json_decref(caches);
        return fail(a, st);
    }
    if (a->json)
        return print_json(json_pack("{s:o}", "caches", caches));
    json_decref(caches);
    return CLI_OK;
}

/* --------------------------------------------------------------- stat */

static void print_tallies(const char *what, const kiln_cache_tally *t, int n)
{
    printf("\n%-10s %8s %12s\n", what, "records", "size");
    for (int i = 0; i < n; i++) {
        char size[32];
        printf("%-10s %8zu %12s\n", t[i].name, t[i].entries, cli_bytes(t[i].bytes, size,
                                                                        sizeof size));
    }
}

static json_t *tallies_json(const kiln_cache_tally *t, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_pack("{s:s, s:I, s:I}", "name", t[i].name, "records",
                                           (json_int_t)t[i].entries, "bytes",
                                           (json_int_t)t[i].bytes));
    return a;
}

/* Layer i's tuning entries as JSON: null where its table cannot be read. */
static json_t *tuning_json(kiln_cache *c, int i)
{
    kiln_tuning *t;
    if (kiln_tuning_create(&t))
        return json_null();
    json_t *rows =
        kiln_cache_layer_tuning(c, i, t) == KILN_OK ? cli_tuning_json(t, NULL) : json_null();
    kiln_tuning_destroy(t);
    return rows;
}

static json_t *stat_json(kiln_cache *c, int i, const kiln_cache_stats *s)
{
    const char *manifest;
    json_t *m = kiln_cache_manifest(c, i, &manifest) == KILN_OK
                    ? json_loads(manifest, JSON_REJECT_DUPLICATES, NULL)
                    : NULL;
    return json_pack("{s:s, s:s, s:I, s:I, s:I, s:{s:I, s:I, s:I, s:I}, s:I, s:I, s:o, s:o, "
                     "s:o, s:o}",
                     "path", kiln_cache_layer_path(c, i), "role", layer_role(c, i), "records",
                     (json_int_t)s->entries, "bad", (json_int_t)s->bad, "other_versions",
                     (json_int_t)s->other_versions, "bytes", "values", (json_int_t)s->bytes,
                     "cubins", (json_int_t)s->cubin_bytes, "file", (json_int_t)s->file_bytes,
                     "map", (json_int_t)s->map_bytes, "oldest", (json_int_t)s->oldest, "newest",
                     (json_int_t)s->newest, "by_target", tallies_json(s->by_target, s->n_targets),
                     "by_kind", tallies_json(s->by_kind, s->n_kinds), "manifest",
                     m ? m : json_null(), "tuning", tuning_json(c, i));
}

static int run_stat(cache_args *a)
{
    kiln_cache *c = NULL;
    json_t *caches = json_array();
    kiln_status st = open_named(a, 1, &c);
    for (int i = 0; st == KILN_OK && i < kiln_cache_n_layers(c); i++) {
        kiln_cache_stats s;
        if ((st = kiln_cache_stat(c, i, &s)) != KILN_OK)
            break;
        if (a->json) {
            json_array_append_new(caches, stat_json(c, i, &s));
            kiln_cache_stats_free(&s);
            continue;
        }
        char oldest[32], newest[32], v[32], cu[32], f[32], m[32];
        time_text(s.oldest, "%Y-%m-%dT%H:%M:%SZ", oldest, sizeof oldest);
        time_text(s.newest, "%Y-%m-%dT%H:%M:%SZ", newest, sizeof newest);
        printf("%scache:    %s (%s)\n", i ? "\n" : "", kiln_cache_layer_path(c, i),
               layer_role(c, i));
        if (s.other_versions)
            printf("records:  %zu (%zu bad, %zu of other record versions)\n", s.entries, s.bad,
                   s.other_versions);
        else
            printf("records:  %zu (%zu bad)\n", s.entries, s.bad);
        printf("size:     values %s, cubins %s, file %s, map %s\n",
               cli_bytes(s.bytes, v, sizeof v), cli_bytes(s.cubin_bytes, cu, sizeof cu),
               cli_bytes(s.file_bytes, f, sizeof f), cli_bytes(s.map_bytes, m, sizeof m));
        printf("oldest:   %s\nnewest:   %s\n", oldest, newest);
        print_tallies("target", s.by_target, s.n_targets);
        print_tallies("kind", s.by_kind, s.n_kinds);
        kiln_cache_stats_free(&s);
        const char *manifest;
        kiln_status ms = kiln_cache_manifest(c, i, &manifest);
        if (ms == KILN_OK) {
            putchar('\n');
            cli_manifest_print(manifest);
        } else if (ms != KILN_ERR_NOT_FOUND) {
            char safe[2048];
            printf("\nmanifest: %s\n", cli_printable(kiln_last_error(), safe, sizeof safe));
        }
        kiln_tuning *t;
        if ((st = kiln_tuning_create(&t)) != KILN_OK)
            break;
        if (kiln_cache_layer_tuning(c, i, t) != KILN_OK) {
            char safe[2048];
            printf("tuning:   %s\n", cli_printable(kiln_last_error(), safe, sizeof safe));
        } else if (kiln_tuning_n(t)) {
            int changed = 0, steps = 0, serial = 0;
            for (int k = 0; k < kiln_tuning_n(t); k++) {
                kiln_tuning_entry e;
                kiln_tuning_at(t, k, &e);
                if (!strncmp(e.signature, "step ", 5)) {
                    steps++;
                    serial += !strcmp(e.variant, "serial");
                } else {
                    changed += strcmp(e.variant, e.heuristic) != 0;
                }
            }
            printf("tuning:   %d kernel and bucket choices measured by kiln tune, %d differ from "
                   "the heuristic's; %d steps' launch policies, %d serial (--json lists "
                   "them)\n",
                   kiln_tuning_n(t) - steps, changed, steps, serial);
        }
        kiln_tuning_destroy(t);
    }
    kiln_cache_close(c);
    if (st != KILN_OK) {
        json_decref(caches);
        return fail(a, st);
    }
    if (a->json)
        return print_json(json_pack("{s:o}", "caches", caches));
    json_decref(caches);
    return CLI_OK;
}

/* ------------------------------------------------------------- verify */

static kiln_status verify_bad(void *ctx, const kiln_cache_entry *e)
{
    (void)ctx;
    char key[KILN_CACHE_KEY_HEX];
    key_text(e, key);
    printf("%s  %s\n", key, e->problem);
    return KILN_OK;
}

static int run_verify(cache_args *a)
{
    kiln_cache *c = NULL;
    size_t total = 0, total_bad = 0, damaged = 0;
    kiln_status st = open_named(a, 0, &c);
    for (int i = 0; st == KILN_OK && i < kiln_cache_n_layers(c); i++) {
        size_t n, bad;
        if (kiln_cache_layer_damage(c, i)) {
            printf("%s\n", kiln_cache_layer_damage(c, i));
            damaged++;
        } else if ((st = kiln_cache_verify(c, i, verify_bad, NULL, &n, &bad)) == KILN_OK) {
            total += n;
            total_bad += bad;
            /* A manifest is checked too: a damaged one is a bad entry. */
            const char *manifest;
            kiln_status ms = kiln_cache_manifest(c, i, &manifest);
            if (ms == KILN_ERR_CACHE || ms == KILN_ERR_UNSUPPORTED) {
                char safe[2048];
                printf("manifest  %s\n", cli_printable(kiln_last_error(), safe, sizeof safe));
                total_bad++;
            } else if (ms != KILN_OK && ms != KILN_ERR_NOT_FOUND) {
                st = ms;
            }
            /* and the tuning table */
            kiln_tuning *t;
            if (st == KILN_OK && (st = kiln_tuning_create(&t)) == KILN_OK) {
                kiln_status ts = kiln_cache_layer_tuning(c, i, t);
                if (ts == KILN_ERR_CACHE) {
                    char safe[2048];
                    printf("tuning    %s\n", cli_printable(kiln_last_error(), safe, sizeof safe));
                    total_bad++;
                } else if (ts != KILN_OK) {
                    st = ts;
                }
                kiln_tuning_destroy(t);
            }
        }
    }
    kiln_cache_close(c);
    if (st != KILN_OK)
        return fail(a, st);
    if (damaged)
        printf("%zu records, %zu bad; %zu damaged files (kiln cache salvage copies their intact "
               "records out)\n",
               total, total_bad, damaged);
    else
        printf("%zu records, %zu bad\n", total, total_bad);
    return total_bad || damaged ? CLI_FAIL : CLI_OK;
}

/* ------------------------------------------------------------- export */

static void export_corrupt(void *ctx, const char *message)
{
    (void)ctx;
    fprintf(stderr, "kiln cache export: warning: %s\n", message);
}

/* The plans of export and check: one per --target, of one model. On
 * failure nothing is left open. */
typedef struct cache_plans {
    cli_source src;
    kiln_plan *p[CLI_MAX_TARGETS];
    kiln_target t[CLI_MAX_TARGETS];
    int n;
    char targets[CLI_MAX_TARGETS * 24]; /* "--target sm_80 --target sm_90a" */
    cli_plan_args *args;                /* the plans' arguments, their tuning table */
} cache_plans;

static void plans_close(cache_plans *ps)
{
    for (int i = 0; i < ps->n; i++)
        kiln_plan_destroy(ps->p[i]);
    cli_source_close(&ps->src);
    cli_plan_args_free(ps->args);
}

static kiln_status plans_open(cache_args *a, cache_plans *ps)
{
    *ps = (cache_plans){ .args = &a->plan };
    cli_plan_target(&a->plan, 0, &ps->t[0]);
    /* the tuning of the layers the command reads: the plans the kernels
     * there were made for */
    kiln_cache_options o = { .shipped = a->files, .n_shipped = a->n_files, .path = a->cache,
                             .strict = 1 };
    kiln_status st = cli_plan_tuning(&a->plan, &o);
    if (st == KILN_OK)
        st = cli_plan_open(a->model, &a->plan, &ps->t[0], &ps->src, &ps->p[0]);
    if (st != KILN_OK) {
        cli_plan_args_free(&a->plan);
        return st;
    }
    ps->n = 1;
    for (int i = 1; i < a->plan.n_targets && st == KILN_OK; i++) {
        cli_plan_target(&a->plan, i, &ps->t[i]);
        if ((st = kiln_plan_create(ps->src.g, &ps->t[i], &a->plan.po, &ps->p[i])) == KILN_OK)
            ps->n++;
    }
    if (st != KILN_OK) {
        plans_close(ps);
        return st;
    }
    size_t used = 0;
    for (int i = 0; i < ps->n; i++) {
        for (const char *const *w = kiln_plan_warnings(ps->p[i]); *w; w++)
            fprintf(stderr, "kiln cache %s: warning: %s (%s)\n", a->sub->name, *w, ps->t[i].name);
        int n = snprintf(ps->targets + used, sizeof ps->targets - used, "%s--target %s",
                         i ? " " : "", ps->t[i].name);
        used += n > 0 ? (size_t)n : 0;
    }
    return KILN_OK;
}

/* What export and check begin with: a model asked for (verb names the
 * subcommand's question), the planning options finished and every
 * target's plan made. CLI_OK with ps open, else the exit status. */
static int plans_start(cache_args *a, const char *verb, cache_plans *ps)
{
    if (!a->model)
        return usage(a, "%s what? give --model MODEL or --model demo", verb);
    kiln_target t;
    int rc = cli_plan_finish(&cli_cmd_cache, &a->plan, &t);
    if (rc != CLI_OK)
        return rc;
    kiln_status st = plans_open(a, ps);
    return st == KILN_OK ? CLI_OK : fail(a, st);
}

static int run_export(cache_args *a)
{
    if (a->model && !a->output)
        return usage(a, "export where? give -o SHIPPED");
    cache_plans ps;
    int rc = plans_start(a, "export", &ps);
    if (rc != CLI_OK)
        return rc;
    kiln_status st = KILN_OK;
    kiln_cache_options o = {
        .shipped = a->files, .n_shipped = a->n_files, .path = a->cache, .strict = 1,
        .on_corrupt = export_corrupt,
    };
    kiln_cache *c = NULL;
    struct stat fs;
    char *manifest = cli_manifest_make(&ps.src, &a->plan);
    if (!manifest)
        st = cli_error(KILN_ERR_NOMEM, "out of memory for the manifest");
    if (st == KILN_OK && (st = kiln_cache_open(&o, &c)) == KILN_OK)
        st = kiln_cache_export_plans(
            c, (const kiln_plan *const *)ps.p, ps.n, a->output,
            &(kiln_cache_export_options){ .overwrite = a->force, .manifest = manifest });
    free(manifest);
    if (st == KILN_OK) {
        int kernels = 0;
        for (int i = 0; i < ps.n; i++)
            kernels += kiln_plan_n_signatures(ps.p[i]);
        char size[32];
        cli_bytes(stat(a->output, &fs) ? 0 : (uint64_t)fs.st_size, size, sizeof size);
        printf("exported %d kernels (%s) to %s\n", kernels, size, a->output);
    }
    kiln_cache_close(c);
    if (st != KILN_OK) {
        rc = fail(a, st);
        if (st == KILN_ERR_OFFLINE_MISS)
            fprintf(stderr,
                    "kiln cache export: compile the plan's kernels first: kiln compile %s %s, "
                    "with the same planning options and caches\n",
                    a->model, ps.targets);
    }
    plans_close(&ps);
    return st == KILN_OK ? CLI_OK : rc;
}

/* -------------------------------------------------------------- check */

typedef struct check_ctx {
    const cache_args *a;
    json_t *missing;
} check_ctx;

static void check_missing(void *ctx, const char *signature, const char *key_hex)
{
    check_ctx *x = ctx;
    if (x->a->json)
        json_array_append_new(x->missing,
                              json_pack("{s:s, s:s}", "signature", signature, "key", key_hex));
    else
        printf("missing: %s (key %s)\n", signature, key_hex);
}

static int run_check(cache_args *a)
{
    cache_plans ps;
    int rc = plans_start(a, "check", &ps);
    if (rc != CLI_OK)
        return rc;
    kiln_status st = KILN_OK;
    kiln_cache *c = NULL;
    json_t *per = json_array();
    int missing = 0;
    st = open_named(a, 1, &c);
    for (int i = 0; st == KILN_OK && i < ps.n; i++) {
        check_ctx x = { .a = a, .missing = json_array() };
        int miss = 0, kernels = kiln_plan_n_signatures(ps.p[i]);
        if ((st = kiln_cache_check_plan(c, ps.p[i], check_missing, &x, &miss)) == KILN_OK &&
            a->json) {
            json_array_append_new(per, json_pack("{s:s, s:i, s:i, s:O}", "target", ps.t[i].name,
                                                 "kernels", kernels, "present", kernels - miss,
                                                 "missing", x.missing));
        } else if (st == KILN_OK) {
            printf("%d of %d kernels of %s for %s in", kernels - miss, kernels, a->model,
                   ps.t[i].name);
            for (int l = 0; l < kiln_cache_n_layers(c); l++)
                printf("%s %s", l ? "," : "", kiln_cache_layer_path(c, l));
            printf("%s: %s\n", kiln_cache_n_layers(c) ? "" : " no cache",
                   miss ? "incomplete" : "complete");
        }
        json_decref(x.missing);
        missing += miss;
    }
    if (st == KILN_OK && a->json) {
        json_t *files = json_array();
        for (int i = 0; i < kiln_cache_n_layers(c); i++)
            json_array_append_new(files, json_string(kiln_cache_layer_path(c, i)));
        json_t *root = json_pack("{s:s, s:o, s:O, s:b}", "model", a->model, "caches", files,
                                 "targets", per, "complete", missing == 0);
        json_dumpf(root, stdout, JSON_INDENT(1));
        putchar('\n');
        json_decref(root);
    }
    json_decref(per);
    kiln_cache_close(c);
    if (st == KILN_OK && missing && !a->json)
        fprintf(stderr,
                "kiln cache check: %d kernels missing: kiln compile %s %s with the same planning "
                "options compiles them\n",
                missing, a->model, ps.targets);
    plans_close(&ps);
    if (st != KILN_OK)
        return fail(a, st);
    return missing ? CLI_FAIL : CLI_OK;
}

/* ---------------------------------------------------- merge, gc, rm */

static kiln_status merge_bad(void *ctx, const kiln_cache_entry *e)
{
    (void)ctx;
    fprintf(stderr, "kiln cache merge: left out: %s\n", e->problem);
    return KILN_OK;
}

static int run_merge(cache_args *a)
{
    kiln_cache *c = NULL;
    kiln_cache_merge_result m;
    kiln_status st = open_writable(a, &c);
    if (st == KILN_OK && (st = kiln_cache_merge(c, a->args[0], merge_bad, NULL, &m)) == KILN_OK)
        printf("merged %s into %s: %zu added, %zu present, %zu replaced, %zu bad%s\n", a->args[0],
               kiln_cache_layer_path(c, kiln_cache_writable_layer(c)), m.added, m.present,
               m.replaced, m.bad, m.other ? ", and records of other versions left out" : "");
    kiln_cache_close(c);
    return st == KILN_OK ? CLI_OK : fail(a, st);
}

/* The compilers of a cache's intact records, "nvrtc 13.0, nvrtc 12.8". */
typedef struct compilers {
    char list[512];
    bool has; /* one of them is the one asked for */
    const char *asked;
} compilers;

static kiln_status compiler_seen(void *ctx, const kiln_cache_entry *e)
{
    compilers *x = ctx;
    if (e->status != KILN_OK)
        return KILN_OK;
    if (!strcmp(e->rec.compiler, x->asked))
        x->has = true;
    size_t n = strlen(x->list), len = strlen(e->rec.compiler);
    for (const char *p = x->list; (p = strstr(p, e->rec.compiler)); p += len)
        if ((p == x->list || p[-1] == ' ') && (p[len] == ',' || !p[len]))
            return KILN_OK;
    snprintf(x->list + n, sizeof x->list - n, "%s%s", n ? ", " : "", e->rec.compiler);
    return KILN_OK;
}

static kiln_status gc_show(void *ctx, const kiln_cache_entry *e)
{
    const cache_args *a = ctx;
    char key[KILN_CACHE_KEY_HEX];
    key_text(e, key);
    const char *verb = a->dry_run ? "would remove" : "removing";
    if (e->status == KILN_OK)
        printf("%s %s  %s  %s  %s\n", verb, key, e->rec.target, e->rec.compiler,
               e->rec.signature);
    else if (e->status == KILN_ERR_UNSUPPORTED)
        printf("%s %s  record version %u\n", verb, key, e->rec.version);
    else
        printf("%s %s  %s\n", verb, key, e->problem);
    return KILN_OK;
}

/* gc --compiler V keeps V's records alone: where no record is V's, a
 * misspelt V would remove every record, so that takes --force. */
static int run_gc(cache_args *a)
{
    if (!a->compiler && !a->max_age_s && !a->corrupt && !a->version)
        return usage(a, "what to remove? give --compiler, --older-than, --corrupt or --version");
    kiln_cache_gc_options g = { .compiler = a->compiler, .max_age_s = a->max_age_s,
                                .corrupt = a->corrupt, .version = a->version,
                                .dry_run = a->dry_run, .on_remove = gc_show, .ctx = a };
    kiln_cache *c = NULL;
    size_t removed;
    uint64_t bytes;
    kiln_status st = open_writable(a, &c);
    const char *path = st == KILN_OK ? kiln_cache_layer_path(c, kiln_cache_writable_layer(c)) : "";
    compilers x = { .asked = a->compiler };
    if (st == KILN_OK && a->compiler && !a->force && !a->dry_run &&
        (st = kiln_cache_foreach(c, kiln_cache_writable_layer(c), compiler_seen, &x)) == KILN_OK &&
        !x.has && x.list[0])
        st = cli_error(KILN_ERR_INVALID_ARG,
                       "%s: no record was made by \"%s\" (they were made by %s), so --compiler "
                       "would remove every record; --dry-run lists them, --force removes them",
                       path, a->compiler, x.list);
    if (st == KILN_OK && (st = kiln_cache_gc(c, &g, &removed, &bytes)) == KILN_OK) {
        char size[32];
        cli_bytes(bytes, size, sizeof size);
        printf("%s %zu records (%s) from %s\n", a->dry_run ? "would remove" : "removed", removed,
               size, path);
    }
    kiln_cache_close(c);
    return st == KILN_OK ? CLI_OK : fail(a, st);
}

static int run_rm(cache_args *a)
{
    const char *prefix = a->n_args ? a->args[0] : NULL;
    uint8_t key[KILN_CACHE_KEY_BYTES];
    int nibbles;
    if (!prefix && !a->all)
        return usage(a, "remove what? give a KEYPREFIX or --all");
    if (prefix && a->all)
        return usage(a, "give a KEYPREFIX or --all, not both");
    if (prefix && kiln_cache_key_parse(prefix, key, &nibbles) != KILN_OK)
        return usage(a, "bad KEYPREFIX '%s' (want 1 to 32 hex digits)", prefix);
    kiln_cache *c = NULL;
    size_t removed = 0;
    kiln_status st = open_writable(a, &c);
    if (st == KILN_OK)
        st = prefix ? kiln_cache_rm(c, prefix, &removed) : kiln_cache_rm_all(c, &removed);
    const char *path = st == KILN_OK ? kiln_cache_layer_path(c, kiln_cache_writable_layer(c)) : "";
    if (st == KILN_OK && prefix && !removed)
        st = cli_error(KILN_ERR_NOT_FOUND, "%s: no key starts with %s", path, prefix);
    if (st == KILN_OK)
        printf("removed %zu records from %s\n", removed, path);
    kiln_cache_close(c);
    return st == KILN_OK ? CLI_OK : fail(a, st);
}

static int run_salvage(cache_args *a)
{
    if (!a->output)
        return usage(a, "salvage into what? give -o DST");
    kiln_cache_salvage_result r;
    kiln_status st = kiln_cache_salvage(a->args[0], a->output, a->force, &r);
    if (st != KILN_OK)
        return fail(a, st);
    printf("salvaged %zu records of %s into %s (%zu bad and %zu of unknown record versions left "
           "out, %zu found twice); %s; %s\n",
           r.records, a->args[0], a->output, r.bad, r.other, r.duplicates,
           r.manifest ? "its manifest kept" : "no intact manifest",
           r.tuning ? "its tuning table kept" : "no intact tuning table");
    return CLI_OK;
}

/* -------------------------------------------------------- dispatch */

#define TAKES_READ (TAKES(CACHE) | TAKES(SHIPPED))

static const cache_sub subs[] = {
    { "ls", TAKES_READ | TAKES(WIDE) | TAKES(JSON), false, 0, 1, NULL, run_ls },
    { "stat", TAKES_READ | TAKES(JSON), false, 0, 1, NULL, run_stat },
    { "verify", TAKES_READ, false, 0, 1, NULL, run_verify },
    { "export", TAKES_READ | TAKES(MODEL) | TAKES(OUTPUT) | TAKES(FORCE), true, 0, 0, NULL,
      run_export },
    { "check", TAKES_READ | TAKES(MODEL) | TAKES(JSON), true, 0, 0, NULL, run_check },
    { "merge", TAKES(CACHE), false, 1, 1, "merge what? give a cache file", run_merge },
    { "gc",
      TAKES(CACHE) | TAKES(COMPILER) | TAKES(OLDER) | TAKES(CORRUPT) | TAKES(VERSION) |
          TAKES(DRY_RUN) | TAKES(FORCE),
      false, 0, 0, NULL, run_gc },
    { "salvage", TAKES(OUTPUT) | TAKES(FORCE), false, 1, 1, "salvage what? give a cache file",
      run_salvage },
    { "rm", TAKES(CACHE) | TAKES(ALL), false, 0, 1, NULL, run_rm },
};

static const struct option cache_options[] = {
    CLI_PLAN_LONG_OPTIONS,
    { "cache", required_argument, NULL, CACHE_OPT_BASE + CACHE_OPT_CACHE },
    { "shipped", required_argument, NULL, CACHE_OPT_BASE + CACHE_OPT_SHIPPED },
    { "wide", no_argument, NULL, CACHE_OPT_BASE + CACHE_OPT_WIDE },
    { "model", required_argument, NULL, CACHE_OPT_BASE + CACHE_OPT_MODEL },
    { "output", required_argument, NULL, CACHE_OPT_BASE + CACHE_OPT_OUTPUT },
    { "force", no_argument, NULL, CACHE_OPT_BASE + CACHE_OPT_FORCE },
    { "compiler", required_argument, NULL, CACHE_OPT_BASE + CACHE_OPT_COMPILER },
    { "older-than", required_argument, NULL, CACHE_OPT_BASE + CACHE_OPT_OLDER },
    { "corrupt", no_argument, NULL, CACHE_OPT_BASE + CACHE_OPT_CORRUPT },
    { "all", no_argument, NULL, CACHE_OPT_BASE + CACHE_OPT_ALL },
    { "version", required_argument, NULL, CACHE_OPT_BASE + CACHE_OPT_VERSION },
    { "json", no_argument, NULL, CACHE_OPT_BASE + CACHE_OPT_JSON },
    { "dry-run", no_argument, NULL, CACHE_OPT_BASE + CACHE_OPT_DRY_RUN },
    { 0 },
};

/* One of the cache's own options; CLI_OK or a reported usage error. */
static int take_option(cache_args *a, cache_opt o, const char *arg)
{
    char *end;
    double days;
    unsigned long version;
    switch (o) {
    case CACHE_OPT_CACHE: a->cache = arg; break;
    case CACHE_OPT_SHIPPED:
        if (a->n_files == CACHE_MAX_FILES)
            return usage(a, "more than %d cache files", CACHE_MAX_FILES);
        a->files[a->n_files++] = arg;
        break;
    case CACHE_OPT_WIDE: a->wide = 1; break;
    case CACHE_OPT_MODEL: a->model = arg; break;
    case CACHE_OPT_OUTPUT: a->output = arg; break;
    case CACHE_OPT_FORCE: a->force = 1; break;
    case CACHE_OPT_COMPILER:
        if (!arg[0])
            return usage(a, "--compiler needs a version, e.g. \"nvrtc 13.0\"");
        a->compiler = arg;
        break;
    case CACHE_OPT_OLDER:
        /* A day's fraction is allowed; less than a second would mean no limit. */
        days = strtod(arg, &end);
        if (end == arg || *end || !(days * 86400.0 >= 1.0) || days > 1e6)
            return usage(a, "bad --older-than '%s' (want days, e.g. 30 or 0.5)", arg);
        a->max_age_s = (uint64_t)(days * 86400.0);
        break;
    case CACHE_OPT_CORRUPT: a->corrupt = 1; break;
    case CACHE_OPT_JSON: a->json = 1; break;
    case CACHE_OPT_DRY_RUN: a->dry_run = 1; break;
    case CACHE_OPT_ALL: a->all = 1; break;
    case CACHE_OPT_VERSION:
        version = strtoul(arg, &end, 10);
        if (end == arg || *end || arg[0] == '-' || !version || version > UINT32_MAX)
            return usage(a, "bad --version '%s' (want a record version, e.g. 1)", arg);
        a->version = (uint32_t)version;
        break;
    case CACHE_OPT_COUNT: assert(0);
    }
    return CLI_OK;
}

/* getopt_long names the long option it matched; the one short option is -o. */
static int refuse_option(const cache_args *a, int index)
{
    if (index < 0)
        return usage(a, "takes no -o");
    return usage(a, "takes no --%s", cache_options[index].name);
}

static int parse(int argc, char **argv, cache_args *a)
{
    int c, index, rc;
    opterr = 0;
    optind = 1;
    while (index = -1, (c = getopt_long(argc, argv, ":o:", cache_options, &index)) != -1) {
        if (c == ':')
            return usage(a, "%s needs a value", argv[optind - 1]);
        if (c == '?')
            return usage(a, "unknown option '%s'", argv[optind - 1]);
        if (c == 'o')
            c = CACHE_OPT_BASE + CACHE_OPT_OUTPUT;
        if (cli_plan_option(&cli_cmd_cache, c, optarg, &a->plan, &rc)) {
            if (rc != CLI_OK)
                return rc;
            if (!a->sub->plans)
                return refuse_option(a, index);
            continue;
        }
        cache_opt o = (cache_opt)(c - CACHE_OPT_BASE);
        if (!(a->sub->takes & (1u << o)))
            return refuse_option(a, index);
        if ((rc = take_option(a, o, optarg)) != CLI_OK)
            return rc;
    }
    a->args = argv + optind;
    a->n_args = argc - optind;
    if (a->n_args < a->sub->min_args)
        return usage(a, "%s", a->sub->missing);
    if (a->n_args > a->sub->max_args)
        return usage(a, "unexpected argument '%s'", a->args[a->sub->max_args]);
    return CLI_OK;
}

static int run(int argc, char **argv)
{
    cache_args a = { 0 };
    cli_plan_args_init(&a.plan);
    if (argc < 2)
        return usage(&a, "which subcommand? ls, stat, verify, check, export, merge, gc, rm or "
                         "salvage");
    for (size_t i = 0; i < sizeof subs / sizeof subs[0] && !a.sub; i++)
        if (!strcmp(argv[1], subs[i].name))
            a.sub = &subs[i];
    if (!a.sub)
        return usage(&a, "unknown subcommand '%s'", argv[1]);
    a.plan.multi_target = 1; /* export and check: one plan per --target */
    int rc = parse(argc - 1, argv + 1, &a);
    if (rc != CLI_OK)
        return rc;
    /* FILE is read with the --shipped files, first. */
    if (a.n_args && a.sub->takes & TAKES(SHIPPED)) {
        if (a.n_files == CACHE_MAX_FILES)
            return usage(&a, "more than %d cache files", CACHE_MAX_FILES);
        memmove(a.files + 1, a.files, (size_t)a.n_files * sizeof a.files[0]);
        a.files[0] = a.args[0];
        a.n_files++;
    }
    return a.sub->run(&a);
}

const cli_command cli_cmd_cache = {
    .name = "cache",
    .summary = "list, check, prune and merge kernel caches; export a plan's kernels to ship",
    .run = run,
    .help = help,
};
