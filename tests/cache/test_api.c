/* The kernel cache as include/kiln.h offers it, used as a program uses it:
 * through the public header alone. The kernels are a one-linear plan's,
 * compiled with NVRTC; damage is done to the files' bytes. Every function's
 * success, and each error it documents, with a message naming the file. */
#include "kiln.h"
#include "clirun.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------- fixtures */

static char dir[64];

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/kiln-api-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

TestSuite(api, .init = setup, .fini = teardown);

/* A path in the test's folder. */
static const char *in_dir(char buf[256], const char *name)
{
    snprintf(buf, 256, "%s/%s", dir, name);
    return buf;
}

static off_t file_size(const char *path)
{
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "%s", path);
    return st.st_size;
}

static void copy_file(const char *from, const char *to)
{
    long len;
    char *p = kt_read_file(from, &len);
    cr_assert_not_null(p, "%s", from);
    FILE *f = fopen(to, "wb");
    cr_assert_not_null(f, "%s", to);
    cr_assert_eq(fwrite(p, 1, (size_t)len, f), (size_t)len);
    cr_assert_eq(fclose(f), 0);
    free(p);
}

/* Cut the file to half its size: its pages no longer fit, and kiln's
 * structural check calls it damaged. */
static void truncate_half(const char *path)
{
    cr_assert_eq(truncate(path, file_size(path) / 2), 0, "%s", path);
}

/* Change the first byte of the one copy of signature (stored with its NUL)
 * in the file: the record's header checksum fails. */
static void damage_record(const char *path, const char *signature)
{
    long len;
    char *p = kt_read_file(path, &len);
    cr_assert_not_null(p, "%s", path);
    size_t n = strlen(signature) + 1;
    long at = -1;
    for (long i = 0; i + (long)n <= len; i++)
        if (!memcmp(p + i, signature, n)) {
            cr_assert_eq(at, -1, "%s holds \"%s\" twice", path, signature);
            at = i;
        }
    cr_assert_neq(at, -1, "%s does not hold \"%s\"", path, signature);
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    cr_assert_eq(fseek(f, at, SEEK_SET), 0);
    cr_assert_eq(fputc(p[at] ^ 0x20, f), p[at] ^ 0x20);
    cr_assert_eq(fclose(f), 0);
    free(p);
}

static void expect_error(kiln_status got, kiln_status want, const char *frag)
{
    cr_assert_eq(got, want, "%s, wanted %s: %s", kiln_strerror(got), kiln_strerror(want),
                 kiln_last_error());
    cr_assert(strstr(kiln_last_error(), frag), "\"%s\" not in: %s", frag, kiln_last_error());
}

/* A plan of two linears [64, 64], Q8_0 and Q4_0, for sm_80 and one bucket:
 * two kernels or more, quick to compile. */
typedef struct tiny {
    kiln_graph *g;
    kiln_plan *p;
    void *data[2];
} tiny;

static void tiny_make(tiny *t)
{
    enum { N = 64, K = 64 };
    static const int64_t capture[] = { 1 };
    static const kiln_format formats[2] = { KILN_FMT_Q8_0, KILN_FMT_Q4_0 };
    static float src[N * K];
    kt_rng r = kt_rng_new(1);
    kiln_tensor *x, *wt, *y;
    kiln_target target;
    cr_assert_eq(kiln_graph_create(&t->g), KILN_OK);
    cr_assert_eq(kiln_graph_input(t->g, "x", K, &x), KILN_OK);
    for (int i = 0; i < 2; i++) {
        kiln_qtensor w = { .format = formats[i], .n = N, .k = K };
        size_t bytes;
        char name[8];
        kt_fill_normal(&r, src, N * K, 1.0f);
        cr_assert_eq(kiln_format_data_bytes(w.format, N, K, &bytes), KILN_OK);
        t->data[i] = w.data = malloc(bytes);
        cr_assert_eq(kiln_quantize(src, &w), KILN_OK, "%s", kiln_last_error());
        snprintf(name, sizeof name, "w%d", i);
        cr_assert_eq(kiln_graph_weight(t->g, name, &w, &wt), KILN_OK);
        snprintf(name, sizeof name, "y%d", i);
        cr_assert_eq(kiln_graph_linear(t->g, name, x, wt, NULL, &y), KILN_OK);
        cr_assert_eq(kiln_graph_output(t->g, y), KILN_OK);
    }
    cr_assert_eq(kiln_target_from_name("sm_80", &target), KILN_OK);
    kiln_plan_options po = { .capture = capture, .n_capture = 1 };
    cr_assert_eq(kiln_plan_create(t->g, &target, &po, &t->p), KILN_OK, "%s", kiln_last_error());
}

static void tiny_free(tiny *t)
{
    kiln_plan_destroy(t->p);
    kiln_graph_destroy(t->g);
    free(t->data[0]);
    free(t->data[1]);
}

/* Compile t's kernels into the writable cache at path; their number. */
static int compile_into(const tiny *t, const char *path)
{
    kiln_compile_options o = { .cache.path = path, .quiet = 1 };
    kiln_compile_result r;
    cr_assert_eq(kiln_compile_plan(t->p, &o, &r), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(r.signatures, kiln_plan_n_signatures(t->p));
    cr_assert_geq(r.signatures, 2);
    cr_assert_eq(r.compiled, r.signatures, "a fresh cache");
    cr_assert_eq(r.writable, 1);
    return r.signatures;
}

static kiln_cache *open_shipped(const char *path)
{
    kiln_cache *c = NULL;
    kiln_cache_options o = { .shipped = &path, .n_shipped = 1, .no_writable = 1 };
    cr_assert_eq(kiln_cache_open(&o, &c), KILN_OK, "%s", kiln_last_error());
    return c;
}

static kiln_cache *open_writable(const char *path)
{
    kiln_cache *c = NULL;
    kiln_cache_options o = { .path = path };
    cr_assert_eq(kiln_cache_open(&o, &c), KILN_OK, "%s", kiln_last_error());
    return c;
}

/* What visitors saw. */
typedef struct seen {
    int n, bad;
    char problem[1024];
    char first_key[KILN_CACHE_KEY_HEX];
    int layer;
} seen;

static kiln_status see(void *ctx, const kiln_cache_entry *e)
{
    seen *s = ctx;
    if (!s->n++)
        kiln_cache_key_hex(e->key, s->first_key);
    s->layer = e->layer;
    if (e->status != KILN_OK) {
        s->bad++;
        snprintf(s->problem, sizeof s->problem, "%s", e->problem);
    }
    return KILN_OK;
}

static kiln_status stop(void *ctx, const kiln_cache_entry *e)
{
    (void)e;
    ++*(int *)ctx;
    return KILN_ERR_STATE;
}

static void note(void *ctx, const char *message)
{
    seen *s = ctx;
    s->n++;
    snprintf(s->problem, sizeof s->problem, "%s", message);
}

/* -------------------------------------------------------------- open */

Test(api, default_path_follows_the_environment)
{
    char buf[256];
    setenv("KILN_CACHE", "/c/k.kiln", 1);
    cr_assert_eq(kiln_cache_default_path(buf, sizeof buf), KILN_OK, "%s", kiln_last_error());
    cr_assert_str_eq(buf, "/c/k.kiln");
    unsetenv("KILN_CACHE");
    setenv("XDG_CACHE_HOME", "relative", 1);
    setenv("HOME", "/home/u", 1);
    cr_assert_eq(kiln_cache_default_path(buf, sizeof buf), KILN_OK);
    cr_assert_str_eq(buf, "/home/u/.cache/kiln/kernels.kiln");
    setenv("XDG_CACHE_HOME", "/x", 1);
    cr_assert_eq(kiln_cache_default_path(buf, sizeof buf), KILN_OK);
    cr_assert_str_eq(buf, "/x/kiln/kernels.kiln");
    cr_assert_eq(kiln_cache_default_path(buf, 8), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_cache_default_path(NULL, sizeof buf), KILN_ERR_INVALID_ARG);
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    expect_error(kiln_cache_default_path(buf, sizeof buf), KILN_ERR_IO, "KILN_CACHE");
}

Test(api, open_gives_the_layers_in_search_order)
{
    char w[256], s[256];
    kiln_cache_close(open_writable(in_dir(s, "shipped.kiln")));
    const char *shipped[] = { s };
    kiln_cache_options o = { .shipped = shipped, .n_shipped = 1, .path = in_dir(w, "sub/w.kiln") };
    kiln_cache *c = NULL;
    cr_assert_eq(kiln_cache_open(&o, &c), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_cache_n_layers(c), 2);
    cr_assert_str_eq(kiln_cache_layer_path(c, 0), s);
    cr_assert_str_eq(kiln_cache_layer_path(c, 1), w);
    cr_assert_null(kiln_cache_layer_path(c, 2));
    cr_assert_null(kiln_cache_layer_path(c, -1));
    cr_assert_eq(kiln_cache_writable_layer(c), 1);
    cr_assert_null(kiln_cache_layer_damage(c, 0));
    cr_assert_null(kiln_cache_layer_damage(c, 1));
    /* One open of a writable file per process. */
    kiln_cache *again = (kiln_cache *)0x1;
    expect_error(kiln_cache_open(&(kiln_cache_options){ .path = w }, &again), KILN_ERR_STATE, w);
    cr_assert_eq(again, (kiln_cache *)0x1);
    kiln_cache_close(c);
    kiln_cache_close(NULL);

    o.no_writable = 1;
    cr_assert_eq(kiln_cache_open(&o, &c), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_cache_n_layers(c), 1);
    cr_assert_eq(kiln_cache_writable_layer(c), -1);
    kiln_cache_close(c);
}

Test(api, open_names_each_file_it_cannot_use)
{
    char missing[256], text[256], empty[256];
    in_dir(missing, "missing.kiln");
    FILE *f = fopen(in_dir(text, "text.kiln"), "w");
    for (int i = 0; i < 1024; i++)
        fputs("not a cache\n", f);
    fclose(f);
    fclose(fopen(in_dir(empty, "empty.kiln"), "w"));
    kiln_cache *c = NULL;
    const char *one[] = { missing };
    kiln_cache_options o = { .shipped = one, .n_shipped = 1, .no_writable = 1 };
    expect_error(kiln_cache_open(&o, &c), KILN_ERR_IO, missing);
    one[0] = text;
    expect_error(kiln_cache_open(&o, &c), KILN_ERR_CACHE, text);
    one[0] = empty;
    o.strict = 1;
    expect_error(kiln_cache_open(&o, &c), KILN_ERR_CACHE, empty);
    cr_assert(strstr(kiln_last_error(), "damaged"), "%s", kiln_last_error());
    cr_assert_null(c);

    one[0] = NULL;
    expect_error(kiln_cache_open(&o, &c), KILN_ERR_INVALID_ARG, "shipped cache 0");
    o.n_shipped = -1;
    cr_assert_eq(kiln_cache_open(&o, &c), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_cache_open(NULL, NULL), KILN_ERR_INVALID_ARG);
    cr_assert_null(c);
}

Test(api, keys_print_and_parse)
{
    uint8_t key[KILN_CACHE_KEY_BYTES];
    char hex[KILN_CACHE_KEY_HEX];
    int n;
    cr_assert_eq(kiln_cache_key_parse("00112233445566778899AABBCCDDEEFF", key, &n), KILN_OK);
    cr_assert_eq(n, 32);
    kiln_cache_key_hex(key, hex);
    cr_assert_str_eq(hex, "00112233445566778899aabbccddeeff");
    cr_assert_eq(kiln_cache_key_parse("abc", key, &n), KILN_OK);
    cr_assert_eq(n, 3);
    cr_assert_eq(key[0], 0xab);
    cr_assert_eq(key[1], 0xc0);
    expect_error(kiln_cache_key_parse("abx", key, &n), KILN_ERR_INVALID_ARG, "'x'");
    cr_assert_eq(kiln_cache_key_parse("", key, &n), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_cache_key_parse("00112233445566778899aabbccddeeff0", key, &n),
                 KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_cache_key_parse(NULL, key, &n), KILN_ERR_INVALID_ARG);
}

/* ------------------------------------------------------- compile, export */

Test(api, compile_plan_stores_then_finds, .timeout = 600)
{
    tiny t;
    tiny_make(&t);
    char c[256], other[256];
    int n = compile_into(&t, in_dir(c, "c.kiln"));
    cr_assert_gt(n, 0);
    kiln_compile_options o = { .cache.path = c, .quiet = 1 };
    kiln_compile_result r;
    cr_assert_eq(kiln_compile_plan(t.p, &o, &r), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(r.cached, n);
    cr_assert_eq(r.compiled, 0);
    cr_assert_eq(r.writable, 1);

    /* The same struct names the caches of kiln_compile: read-only, the
     * kernels are found and nothing is stored. */
    const char *shipped[] = { c };
    o.cache = (kiln_cache_options){ .shipped = shipped, .n_shipped = 1, .no_writable = 1 };
    o.plan = (kiln_plan_options){ .capture = (const int64_t[]){ 1 }, .n_capture = 1 };
    kiln_target target;
    cr_assert_eq(kiln_target_from_name("sm_80", &target), KILN_OK);
    cr_assert_eq(kiln_compile(t.g, &target, &o, &r), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(r.cached, n);
    cr_assert_eq(r.writable, 0);

    /* Offline, a cache without them is a miss naming the signature. */
    o.cache = (kiln_cache_options){ .path = in_dir(other, "other.kiln"), .offline = 1 };
    expect_error(kiln_compile_plan(t.p, &o, &r), KILN_ERR_OFFLINE_MISS, other);
    int named = 0;
    for (int i = 0; i < n; i++)
        named += strstr(kiln_last_error(), kiln_plan_signature(t.p, i)) != NULL;
    cr_assert_eq(named, 1, "%s", kiln_last_error());

    /* opts NULL: the default cache. */
    setenv("KILN_CACHE", c, 1);
    cr_assert_eq(kiln_compile_plan(t.p, NULL, &r), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(r.cached, n);
    cr_assert_eq(kiln_compile_plan(NULL, &o, &r), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_compile_plan(t.p, &o, NULL), KILN_ERR_INVALID_ARG);
    tiny_free(&t);
}

Test(api, export_writes_exactly_the_plan, .timeout = 600)
{
    tiny t;
    tiny_make(&t);
    char c[256], s[256], e[256];
    int n = compile_into(&t, in_dir(c, "c.kiln"));
    kiln_cache *k = open_writable(c);
    cr_assert_eq(kiln_cache_export(k, t.p, in_dir(s, "s.kiln"), 0), KILN_OK, "%s",
                 kiln_last_error());
    expect_error(kiln_cache_export(k, t.p, s, 0), KILN_ERR_IO, "exists");
    cr_assert_eq(kiln_cache_export(k, t.p, s, 1), KILN_OK, "%s", kiln_last_error());
    expect_error(kiln_cache_export(k, t.p, c, 1), KILN_ERR_INVALID_ARG, "export reads");
    cr_assert_eq(kiln_cache_export(NULL, t.p, s, 1), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_cache_export(k, NULL, s, 1), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_cache_export(k, t.p, NULL, 1), KILN_ERR_INVALID_ARG);
    /* Only a regular file is replaced (a device node or a FIFO, as root
     * /dev/null, was renamed over), and a link is not followed. */
    char fifo[256], link[256];
    cr_assert_eq(mkfifo(in_dir(fifo, "fifo.kiln"), 0600), 0);
    cr_assert_eq(symlink(s, in_dir(link, "link.kiln")), 0);
    expect_error(kiln_cache_export(k, t.p, fifo, 1), KILN_ERR_IO, "not a regular file");
    expect_error(kiln_cache_export(k, t.p, link, 1), KILN_ERR_IO, "not a regular file");
    struct stat sb;
    cr_assert(!lstat(fifo, &sb) && S_ISFIFO(sb.st_mode), "the FIFO is still there");
    cr_assert(!lstat(link, &sb) && S_ISLNK(sb.st_mode), "the link is still there");
    kiln_cache_close(k);

    k = open_shipped(s);
    seen v = { 0 };
    cr_assert_eq(kiln_cache_foreach(k, 0, see, &v), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(v.n, n);
    cr_assert_eq(v.bad, 0, "%s", v.problem);
    kiln_cache_close(k);

    /* From a cache without the kernels: a miss naming what was searched,
     * and no file. */
    k = open_writable(in_dir(e, "empty.kiln"));
    char x[256];
    expect_error(kiln_cache_export(k, t.p, in_dir(x, "x.kiln"), 0), KILN_ERR_OFFLINE_MISS, e);
    cr_assert_neq(access(x, F_OK), 0, "%s", x);
    kiln_cache_close(k);

    /* A shipped file left out as damaged may hold them: its error. */
    truncate_half(s);
    const char *shipped[] = { s };
    kiln_cache_options o = { .shipped = shipped, .n_shipped = 1, .no_writable = 1 };
    cr_assert_eq(kiln_cache_open(&o, &k), KILN_OK, "%s", kiln_last_error());
    expect_error(kiln_cache_export(k, t.p, x, 0), KILN_ERR_CACHE, s);
    kiln_cache_close(k);
    tiny_free(&t);
}

/* ------------------------------------------------- foreach, verify, stat */

Test(api, foreach_verify_and_stat_read_a_layer, .timeout = 600)
{
    tiny t;
    tiny_make(&t);
    char c[256], s[256];
    int n = compile_into(&t, in_dir(c, "c.kiln"));
    copy_file(c, in_dir(s, "s.kiln"));
    damage_record(s, kiln_plan_signature(t.p, 0));
    kiln_cache *k = open_shipped(s);

    seen v = { 0 };
    cr_assert_eq(kiln_cache_foreach(k, 0, see, &v), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(v.n, n);
    cr_assert_eq(v.bad, 1);
    cr_assert_eq(v.layer, 0);
    cr_assert(strstr(v.problem, s) && strstr(v.problem, "key "), "%s", v.problem);
    int visits = 0;
    cr_assert_eq(kiln_cache_foreach(k, 0, stop, &visits), KILN_ERR_STATE);
    cr_assert_eq(visits, 1);
    expect_error(kiln_cache_foreach(k, 1, see, &v), KILN_ERR_INVALID_ARG, "layer 1");
    cr_assert_eq(kiln_cache_foreach(k, 0, NULL, &v), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_cache_foreach(NULL, 0, see, &v), KILN_ERR_INVALID_ARG);

    size_t entries = 0, bad = 0;
    seen b = { 0 };
    cr_assert_eq(kiln_cache_verify(k, 0, see, &b, &entries, &bad), KILN_OK, "%s",
                 kiln_last_error());
    cr_assert_eq(entries, (size_t)n);
    cr_assert_eq(bad, 1);
    cr_assert_eq(b.n, 1);
    cr_assert(strstr(b.problem, s), "%s", b.problem);
    cr_assert_eq(kiln_cache_verify(k, 0, NULL, NULL, NULL, NULL), KILN_OK);
    cr_assert_eq(kiln_cache_verify(k, -1, NULL, NULL, NULL, NULL), KILN_ERR_INVALID_ARG);

    kiln_cache_stats st;
    cr_assert_eq(kiln_cache_stat(k, 0, &st), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(st.entries, (size_t)n);
    cr_assert_eq(st.bad, 1);
    cr_assert_eq(st.other_versions, 0);
    cr_assert_eq(st.n_targets, 1);
    cr_assert_str_eq(st.by_target[0].name, "sm_80");
    cr_assert_eq(st.by_target[0].entries, (size_t)n - 1);
    cr_assert_gt(st.cubin_bytes, 0);
    cr_assert_leq(st.oldest, st.newest);
    cr_assert_leq(st.newest, (uint64_t)time(NULL));
    cr_assert_gt(st.bytes, st.cubin_bytes);
    cr_assert_eq(st.file_bytes, (uint64_t)file_size(s));
    kiln_cache_stats_free(&st);
    cr_assert_null(st.by_target);
    cr_assert_eq(st.n_kinds, 0);
    kiln_cache_stats_free(NULL);
    cr_assert_eq(kiln_cache_stat(k, 0, NULL), KILN_ERR_INVALID_ARG);
    kiln_cache_close(k);
    tiny_free(&t);
}

static kiln_status fields(void *ctx, const kiln_cache_entry *e)
{
    const kiln_plan *p = ctx;
    cr_assert_eq(e->status, KILN_OK, "%s", e->problem);
    cr_assert_str_eq(e->problem, "");
    cr_assert_eq(e->key_size, (size_t)KILN_CACHE_KEY_BYTES);
    cr_assert_eq(strncmp(e->rec.compiler, "nvrtc ", 6), 0, "%s", e->rec.compiler);
    cr_assert_str_eq(e->rec.target, "sm_80");
    cr_assert_gt(strlen(e->rec.entry), 0);
    cr_assert_gt(strlen(e->rec.kind), 0);
    cr_assert_gt(e->rec.threads, 0);
    cr_assert_gt(e->rec.cubin_size, 0);
    cr_assert_gt(e->size, e->rec.cubin_size);
    cr_assert_eq(memcmp(e->rec.cubin, "\x7f" "ELF", 4), 0);
    cr_assert_leq(e->rec.created, (uint64_t)time(NULL));
    int found = 0;
    for (int i = 0; i < kiln_plan_n_signatures(p); i++)
        found += !strcmp(e->rec.signature, kiln_plan_signature(p, i));
    cr_assert_eq(found, 1, "%s", e->rec.signature);
    return KILN_OK;
}

Test(api, entries_hold_the_records_fields, .timeout = 600)
{
    tiny t;
    tiny_make(&t);
    char c[256];
    compile_into(&t, in_dir(c, "c.kiln"));
    kiln_cache *k = open_writable(c);
    cr_assert_eq(kiln_cache_foreach(k, 0, fields, t.p), KILN_OK, "%s", kiln_last_error());
    kiln_cache_close(k);
    tiny_free(&t);
}

/* ------------------------------------------------------ gc, rm, merge */

Test(api, gc_and_rm_change_the_writable_cache, .timeout = 600)
{
    tiny t;
    tiny_make(&t);
    char c[256];
    int n = compile_into(&t, in_dir(c, "c.kiln"));
    damage_record(c, kiln_plan_signature(t.p, 0));
    kiln_cache *k = open_writable(c);
    size_t removed = 99;
    uint64_t bytes = 0;

    expect_error(kiln_cache_gc(k, NULL, &removed, &bytes), KILN_ERR_INVALID_ARG, "gc");
    cr_assert_eq(kiln_cache_gc(NULL, &(kiln_cache_gc_options){ .corrupt = 1 }, NULL, NULL),
                 KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_cache_gc(k, &(kiln_cache_gc_options){ .max_age_s = 3600 }, &removed, NULL),
                 KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(removed, 0);
    cr_assert_eq(kiln_cache_gc(k, &(kiln_cache_gc_options){ .corrupt = 1 }, &removed, &bytes),
                 KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(removed, 1);
    cr_assert_gt(bytes, 0);

    seen v = { 0 };
    cr_assert_eq(kiln_cache_foreach(k, 0, see, &v), KILN_OK);
    cr_assert_eq(v.n, n - 1);
    cr_assert_eq(kiln_cache_rm(k, v.first_key, &removed), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(removed, 1);
    cr_assert_eq(kiln_cache_rm(k, v.first_key, &removed), KILN_OK);
    cr_assert_eq(removed, 0);
    expect_error(kiln_cache_rm(k, "xyz", &removed), KILN_ERR_INVALID_ARG, "xyz");
    cr_assert_eq(kiln_cache_rm(NULL, "ab", &removed), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_cache_gc(k, &(kiln_cache_gc_options){ .compiler = "nvrtc 0.0" }, &removed,
                               NULL),
                 KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(removed, (size_t)n - 2);
    cr_assert_eq(kiln_cache_rm_all(k, &removed), KILN_OK);
    cr_assert_eq(removed, 0);
    cr_assert_eq(kiln_cache_rm_all(NULL, &removed), KILN_ERR_INVALID_ARG);
    kiln_cache_close(k);

    /* Without a writable cache there is nothing to change. */
    k = open_shipped(c);
    expect_error(kiln_cache_gc(k, &(kiln_cache_gc_options){ .corrupt = 1 }, NULL, NULL),
                 KILN_ERR_STATE, "no writable cache");
    expect_error(kiln_cache_rm(k, "ab", NULL), KILN_ERR_STATE, "no writable cache");
    expect_error(kiln_cache_rm_all(k, NULL), KILN_ERR_STATE, "no writable cache");
    expect_error(kiln_cache_merge(k, c, NULL, NULL, NULL), KILN_ERR_STATE, "no writable cache");
    kiln_cache_close(k);
    tiny_free(&t);
}

Test(api, merge_copies_the_intact_records, .timeout = 600)
{
    tiny t;
    tiny_make(&t);
    char c[256], s[256], w[256], missing[256];
    int n = compile_into(&t, in_dir(c, "c.kiln"));
    copy_file(c, in_dir(s, "s.kiln"));
    damage_record(s, kiln_plan_signature(t.p, 0));
    kiln_cache *k = open_writable(in_dir(w, "w.kiln"));
    kiln_cache_merge_result m;
    seen b = { 0 };
    cr_assert_eq(kiln_cache_merge(k, s, see, &b, &m), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(m.added, (size_t)n - 1);
    cr_assert_eq(m.present + m.replaced + m.other, 0);
    cr_assert_eq(m.bad, 1);
    cr_assert_eq(b.n, 1);
    cr_assert_eq(b.layer, -1);
    cr_assert(strstr(b.problem, s), "%s", b.problem);
    cr_assert_eq(kiln_cache_merge(k, c, NULL, NULL, &m), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(m.added, 1);
    cr_assert_eq(m.present, (size_t)n - 1);
    cr_assert_eq(kiln_cache_merge(k, c, NULL, NULL, NULL), KILN_OK);

    expect_error(kiln_cache_merge(k, w, NULL, NULL, &m), KILN_ERR_INVALID_ARG, "writable cache");
    expect_error(kiln_cache_merge(k, in_dir(missing, "missing.kiln"), NULL, NULL, &m),
                 KILN_ERR_IO, missing);
    truncate_half(s);
    expect_error(kiln_cache_merge(k, s, NULL, NULL, &m), KILN_ERR_CACHE, s);
    cr_assert(strstr(kiln_last_error(), "damaged"), "%s", kiln_last_error());
    cr_assert_eq(kiln_cache_merge(k, NULL, NULL, NULL, &m), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_cache_merge(NULL, c, NULL, NULL, &m), KILN_ERR_INVALID_ARG);
    kiln_cache_close(k);
    tiny_free(&t);
}

/* ------------------------------------------------- damage and salvage */

Test(api, a_damaged_file_is_left_out_or_refused, .timeout = 600)
{
    tiny t;
    tiny_make(&t);
    char c[256], s[256];
    compile_into(&t, in_dir(c, "c.kiln"));
    copy_file(c, in_dir(s, "s.kiln"));
    truncate_half(s);

    const char *shipped[] = { s };
    kiln_cache_options o = { .shipped = shipped, .n_shipped = 1, .no_writable = 1, .strict = 1 };
    kiln_cache *k = NULL;
    expect_error(kiln_cache_open(&o, &k), KILN_ERR_CACHE, s);
    cr_assert(strstr(kiln_last_error(), "damaged"), "%s", kiln_last_error());

    seen v = { 0 };
    o = (kiln_cache_options){ .shipped = shipped, .n_shipped = 1, .no_writable = 1,
                              .on_corrupt = note, .ctx = &v };
    cr_assert_eq(kiln_cache_open(&o, &k), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(v.n, 1);
    cr_assert(strstr(v.problem, s), "%s", v.problem);
    cr_assert_not_null(kiln_cache_layer_damage(k, 0));
    cr_assert(strstr(kiln_cache_layer_damage(k, 0), s), "%s", kiln_cache_layer_damage(k, 0));
    expect_error(kiln_cache_foreach(k, 0, see, &v), KILN_ERR_CACHE, s);
    expect_error(kiln_cache_verify(k, 0, NULL, NULL, NULL, NULL), KILN_ERR_CACHE, s);
    kiln_cache_stats st;
    expect_error(kiln_cache_stat(k, 0, &st), KILN_ERR_CACHE, s);
    kiln_cache_close(k);

    /* A damaged writable file is neither written nor removed: compile
     * stores nothing, and says so. */
    k = NULL;
    o = (kiln_cache_options){ .path = s, .on_corrupt = note, .ctx = &v };
    cr_assert_eq(kiln_cache_open(&o, &k), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_cache_writable_layer(k), -1);
    expect_error(kiln_cache_gc(k, &(kiln_cache_gc_options){ .corrupt = 1 }, NULL, NULL),
                 KILN_ERR_CACHE, s);
    expect_error(kiln_cache_rm_all(k, NULL), KILN_ERR_CACHE, s);
    kiln_cache_close(k);
    off_t size = file_size(s);
    kiln_compile_options co = { .cache = o, .quiet = 1 };
    kiln_compile_result r;
    cr_assert_eq(kiln_compile_plan(t.p, &co, &r), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(r.writable, 0);
    cr_assert_eq(r.compiled, r.signatures);
    cr_assert_eq(file_size(s), size);
    co.cache.strict = 1;
    expect_error(kiln_compile_plan(t.p, &co, &r), KILN_ERR_CACHE, s);
    tiny_free(&t);
}

Test(api, salvage_copies_what_is_intact, .timeout = 600)
{
    tiny t;
    tiny_make(&t);
    char c[256], r[256], s[256], missing[256];
    int n = compile_into(&t, in_dir(c, "c.kiln"));
    kiln_cache_salvage_result sr;
    cr_assert_eq(kiln_cache_salvage(c, in_dir(r, "r.kiln"), 0, &sr), KILN_OK, "%s",
                 kiln_last_error());
    cr_assert_eq(sr.records, (size_t)n);
    cr_assert_eq(sr.bad, 0);
    kiln_cache *k = open_shipped(r);
    size_t entries, bad;
    cr_assert_eq(kiln_cache_verify(k, 0, NULL, NULL, &entries, &bad), KILN_OK);
    cr_assert_eq(entries, (size_t)n);
    cr_assert_eq(bad, 0);
    kiln_cache_close(k);

    expect_error(kiln_cache_salvage(c, r, 0, &sr), KILN_ERR_IO, "exists");
    cr_assert_eq(kiln_cache_salvage(c, r, 1, NULL), KILN_OK, "%s", kiln_last_error());
    expect_error(kiln_cache_salvage(c, c, 1, &sr), KILN_ERR_INVALID_ARG, "itself");
    expect_error(kiln_cache_salvage(in_dir(missing, "missing.kiln"), r, 1, &sr), KILN_ERR_IO,
                 missing);
    expect_error(kiln_cache_salvage(dir, r, 1, &sr), KILN_ERR_IO, "not a regular file");
    cr_assert_eq(kiln_cache_salvage(NULL, r, 1, &sr), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_cache_salvage(c, NULL, 1, &sr), KILN_ERR_INVALID_ARG);

    /* From a damaged copy: what is found is intact. */
    copy_file(c, in_dir(s, "s.kiln"));
    truncate_half(s);
    cr_assert_eq(kiln_cache_salvage(s, r, 1, &sr), KILN_OK, "%s", kiln_last_error());
    cr_assert_leq(sr.records, (size_t)n);
    k = open_shipped(r);
    cr_assert_eq(kiln_cache_verify(k, 0, NULL, NULL, &entries, &bad), KILN_OK);
    cr_assert_eq(entries, sr.records);
    cr_assert_eq(bad, 0);
    kiln_cache_close(k);
    tiny_free(&t);
}
