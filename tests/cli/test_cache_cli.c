/* `kiln cache` as a user meets it: records stored through the cache API
 * are listed, counted and checked; a record changed on disk is found; merge,
 * gc and rm change what ls shows; export ships exactly a plan's kernels.
 * Every test has its own directory and points KILN_CACHE, XDG_CACHE_HOME
 * and HOME into it. */
#include "cache/cache.h"
#include "clirun.h"
#include "tests/cache/fake_cubin.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdarg.h>
#include <ftw.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------- fixtures */

static char *dir;

static char *path_in(const char *name)
{
    char *p;
    cr_assert_gt(asprintf(&p, "%s/%s", dir, name), 0);
    return p;
}

static void setup(void)
{
    dir = strdup("/tmp/kiln-cache-cli-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    char *user = path_in("user/kernels.kiln"), *xdg = path_in("xdg");
    setenv("KILN_CACHE", user, 1);
    setenv("XDG_CACHE_HOME", xdg, 1);
    setenv("HOME", dir, 1);
    free(user);
    free(xdg);
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void teardown(void)
{
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    free(dir);
}

TestSuite(cache_cli, .init = setup, .fini = teardown);

static kt_cli run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static kt_cli run(const char *fmt, ...)
{
    char *args;
    va_list ap;
    va_start(ap, fmt);
    cr_assert_gt(vasprintf(&args, fmt, ap), 0);
    va_end(ap);
    kt_cli r = kt_cli_run(args);
    cr_assert_not_null(r.out, "%s", args);
    cr_assert_not_null(r.err, "%s", args);
    free(args);
    return r;
}

/* A record as the compiler driver would store one; its cubin carries a
 * marker that finds it in the file. */
typedef struct made {
    kiln_cache_record rec;
    uint8_t key[KILN_CACHE_KEY_BYTES];
    char hex[KILN_CACHE_KEY_HEX];
    char sig[200], entry[32], marker[24];
    uint8_t *cubin;
} made;

static const char *const targets[] = { "sm_80", "sm_90a" };
static const char *const kinds[] = { "simt", "mma", "op", "quant" };

/* Record i: target, kind and size follow from i and the suite's seed. */
static void make(made *m, int i, const char *compiler, uint64_t created)
{
    kt_rng r = kt_rng_new(kt_seed() + 7919 * (uint64_t)i);
    size_t cubin_size = 200 + (size_t)(kt_next(&r) % 3000);
    const char *target = targets[i % 2], *kind = kinds[(i / 2) % 4];
    char source[64];
    snprintf(m->sig, sizeof m->sig,
             "linear backend=%s variant=default format=q8_0 scales=f16 act=bf16 n=%d k=4096 "
             "epilogue=none out=bf16 target=%s",
             kind, 64 * (i + 1), target);
    snprintf(m->entry, sizeof m->entry, "kiln_%s_%d", kind, i);
    snprintf(m->marker, sizeof m->marker, "KILN-CLI-MARKER-%04d", i % 10000);
    snprintf(source, sizeof source, "kernel %d", i);
    cr_assert_eq(kiln_cache_key(target, "-arch", source, strlen(source), m->key), KILN_OK);
    kiln_cache_key_hex(m->key, m->hex);
    m->cubin = malloc(cubin_size);
    for (size_t j = 0; j < cubin_size; j++)
        m->cubin[j] = (uint8_t)kt_next(&r);
    kt_elf_header(m->cubin, i % 2 ? 90 : 80);
    memcpy(m->cubin + 100, m->marker, strlen(m->marker));
    m->rec = (kiln_cache_record){
        .compiler = compiler,
        .entry = m->entry,
        .target = target,
        .kind = kind,
        .signature = m->sig,
        .threads = 128,
        .cubin = m->cubin,
        .cubin_size = cubin_size,
        .created = created,
    };
}

static void make_all(made *m, int n, uint64_t created)
{
    for (int i = 0; i < n; i++)
        make(&m[i], i, "nvrtc 13.0", created + (uint64_t)i * 3600);
}

static void unmake_all(made *m, int n)
{
    for (int i = 0; i < n; i++)
        free(m[i].cubin);
}

/* Store m[first..last] in the cache file at path. */
static void fill(const char *path, const made *m, int first, int last)
{
    kiln_cache_options o = { .path = path };
    kiln_cache *c;
    cr_assert_eq(kiln_cache_open(&o, &c), KILN_OK, "%s", kiln_last_error());
    for (int i = first; i <= last; i++)
        cr_assert_eq(kiln_cache_store(c, m[i].key, &m[i].rec, NULL), KILN_OK, "%s",
                     kiln_last_error());
    kiln_cache_close(c);
}

/* Flip a byte after m's marker in the closed file at path. LMDB leaves
 * stale copies of a record in the unused part of its pages, so every copy
 * changes, the live one among them. */
static void corrupt(const char *path, const made *m)
{
    long size;
    size_t len = strlen(m->marker);
    char *p = kt_read_file(path, &size);
    cr_assert_not_null(p, "%s", path);
    int fd = open(path, O_WRONLY), found = 0;
    cr_assert_geq(fd, 0);
    for (long i = 0; i + (long)len + 4 <= size; i++)
        if (!memcmp(p + i, m->marker, len)) {
            char b = (char)(p[i + (long)len + 3] ^ 0x5a);
            cr_assert_eq(pwrite(fd, &b, 1, i + (long)len + 3), 1);
            found++;
        }
    cr_assert_gt(found, 0, "marker %s not in %s", m->marker, path);
    close(fd);
    free(p);
}

/* The line of out that starts with prefix, copied into line. */
static bool line_with(const char *out, const char *prefix, char *line, size_t size)
{
    size_t n = strlen(prefix);
    for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, prefix, n)) {
            const char *end = strchr(p, '\n');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            snprintf(line, size, "%.*s", (int)(len < size ? len : size - 1), p);
            return true;
        }
    return false;
}

/* What cli_bytes prints. */
static void human_bytes(uint64_t n, char *buf, size_t size)
{
    static const char *const units[] = { "KiB", "MiB", "GiB" };
    double v = (double)n;
    int u = -1;
    while (v >= 1024 && u < 2) {
        v /= 1024;
        u++;
    }
    if (u < 0)
        snprintf(buf, size, "%llu B", (unsigned long long)n);
    else
        snprintf(buf, size, "%.1f %s", v, units[u]);
}

/* Lines of ls output that are records: they start with 32 hex digits. */
static int record_lines(const char *out)
{
    int n = 0;
    for (const char *p = out; *p;) {
        size_t hex = strspn(p, "0123456789abcdef");
        n += hex == 32 && p[32] == ' ';
        const char *nl = strchr(p, '\n');
        if (!nl)
            break;
        p = nl + 1;
    }
    return n;
}

static off_t file_size(const char *path)
{
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "%s", path);
    return st.st_size;
}

static void date_of(uint64_t t, const char *fmt, char *buf, size_t size)
{
    time_t tt = (time_t)t;
    struct tm tm;
    gmtime_r(&tt, &tm);
    strftime(buf, size, fmt, &tm);
}

/* -------------------------------------------------------- help, usage */

Test(cache_cli, help_describes_every_subcommand_and_option)
{
    static const char *const words[] = {
        "ls [FILE]", "stat [FILE]", "verify [FILE]", "export --model", "merge SRC",
        "gc [--compiler", "rm KEYPREFIX | --all", "--wide", "--older-than", "--corrupt",
        "--cache FILE", "--shipped FILE", "--force", "--capture", "--target", "kiln compile",
        "--version N", "salvage SRC -o DST",
    };
    static const char *const asks[] = { "cache --help", "cache ls --help", "cache export -h" };
    for (size_t a = 0; a < sizeof asks / sizeof asks[0]; a++) {
        kt_cli r = run("%s", asks[a]);
        cr_assert_eq(r.status, 0, "%s: %s", asks[a], r.err);
        for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
            cr_assert(strstr(r.out, words[i]), "%s: no '%s' in:\n%s", asks[a], words[i], r.out);
        kt_cli_free(&r);
    }
    kt_cli r = run("--help");
    cr_assert(strstr(r.out, "\n  cache "), "%s", r.out);
    kt_cli_free(&r);
}

Test(cache_cli, usage_errors)
{
    static const struct {
        const char *args, *says;
    } bad[] = {
        { "cache", "which subcommand?" },
        { "cache frob", "unknown subcommand 'frob'" },
        { "cache --wide", "unknown subcommand '--wide'" },
        { "cache ls --bogus", "ls: unknown option '--bogus'" },
        { "cache ls --cache", "ls: --cache needs a value" },
        { "cache ls --model demo", "ls: takes no --model" },
        { "cache ls --target sm_80", "ls: takes no --target" },
        { "cache stat -o x", "stat: takes no -o" },
        { "cache merge --wide x", "merge: takes no --wide" },
        { "cache merge --shipped a x", "merge: takes no --shipped" },
        { "cache ls a b", "ls: unexpected argument 'b'" },
        { "cache verify a b", "verify: unexpected argument 'b'" },
        { "cache merge", "merge: merge what?" },
        { "cache merge a b", "merge: unexpected argument 'b'" },
        { "cache gc", "gc: what to remove?" },
        { "cache gc extra --corrupt", "gc: unexpected argument 'extra'" },
        { "cache gc --older-than x", "gc: bad --older-than 'x'" },
        { "cache gc --older-than 0", "gc: bad --older-than '0'" },
        { "cache gc --older-than -3", "gc: bad --older-than '-3'" },
        { "cache gc --older-than 5d", "gc: bad --older-than '5d'" },
        { "cache gc --compiler ''", "gc: --compiler needs a version" },
        { "cache gc --version 0", "gc: bad --version '0'" },
        { "cache gc --version -1", "gc: bad --version '-1'" },
        { "cache gc --version 2x", "gc: bad --version '2x'" },
        { "cache gc --version 4294967296", "gc: bad --version '4294967296'" },
        { "cache salvage", "salvage: salvage what?" },
        { "cache salvage a", "salvage: salvage into what? give -o DST" },
        { "cache salvage a b -o c", "salvage: unexpected argument 'b'" },
        { "cache salvage a -o c --cache d", "salvage: takes no --cache" },
        { "cache rm", "rm: remove what?" },
        { "cache rm abc --all", "rm: give a KEYPREFIX or --all, not both" },
        { "cache rm xyz", "rm: bad KEYPREFIX 'xyz'" },
        { "cache rm 0123456789abcdef0123456789abcdef0", "rm: bad KEYPREFIX" },
        { "cache rm a b", "rm: unexpected argument 'b'" },
        { "cache export -o s", "export: export what?" },
        { "cache export --model demo", "export: export where?" },
        { "cache export --model demo -o s extra", "export: unexpected argument 'extra'" },
        { "cache export --model demo -o s --target sm_10", "sm_10" },
        { "cache export --model demo -o s --capture 0", "bad --capture '0'" },
        { "cache export --model demo -o s --graph all", "bad --graph 'all'" },
        { "cache export --model demo -o s --strict-backend", "--strict-backend needs --backend" },
        { "cache export --model demo -o s --wide", "export: takes no --wide" },
        { "cache ls a --shipped 1 --shipped 2 --shipped 3 --shipped 4 --shipped 5 --shipped 6 "
          "--shipped 7 --shipped 8 --shipped 9 --shipped 10 --shipped 11 --shipped 12 --shipped "
          "13 --shipped 14 --shipped 15 --shipped 16",
          "ls: more than 16 cache files" },
        { "cache stat --shipped 1 --shipped 2 --shipped 3 --shipped 4 --shipped 5 --shipped 6 "
          "--shipped 7 --shipped 8 --shipped 9 --shipped 10 --shipped 11 --shipped 12 --shipped "
          "13 --shipped 14 --shipped 15 --shipped 16 --shipped 17",
          "stat: more than 16 cache files" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kt_cli r = run("%s", bad[i].args);
        cr_assert_eq(r.status, 2, "%s: exit %d, stderr %s", bad[i].args, r.status, r.err);
        cr_assert(strstr(r.err, bad[i].says), "%s: stderr lacks '%s':\n%s", bad[i].args,
                  bad[i].says, r.err);
        cr_assert(strstr(r.err, "usage: kiln cache"), "%s: %s", bad[i].args, r.err);
        cr_assert_str_empty(r.out, "%s", bad[i].args);
        kt_cli_free(&r);
    }
}

/* -------------------------------------------------------- ls, stat */

enum { N_LS = 12 };

Test(cache_cli, ls_lists_every_record)
{
    made m[N_LS];
    uint64_t t0 = (uint64_t)time(NULL) - 40 * 86400;
    make_all(m, N_LS, t0);
    char *c = path_in("c.kiln");
    fill(c, m, 0, N_LS - 1);
    kt_cli r = run("cache ls --cache %s", c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_eq(record_lines(r.out), N_LS, "%s", r.out);
    cr_assert(!strncmp(r.out, "key ", 4), "%s", r.out);
    for (int i = 0; i < N_LS; i++) {
        char line[512], want[256], date[16];
        cr_assert(line_with(r.out, m[i].hex, line, sizeof line), "no %s in:\n%s", m[i].hex,
                  r.out);
        date_of(m[i].rec.created, "%Y-%m-%d", date, sizeof date);
        char size[32];
        human_bytes(m[i].rec.cubin_size, size, sizeof size);
        snprintf(want, sizeof want, "%s  %-7s %-7s %9s  %-10s  ", m[i].hex, m[i].rec.target,
                 m[i].rec.kind, size, date);
        cr_assert(!strncmp(line, want, strlen(want)), "got  '%s'\nwant '%s'", line, want);
        /* Cut to fit: the start of the signature, then "...". */
        cr_assert(strstr(line, "linear backend="), "%s", line);
        cr_assert(!strstr(line, m[i].sig), "%s", line);
        cr_assert_eq(strcmp(line + strlen(line) - 3, "..."), 0, "%s", line);
    }
    kt_cli_free(&r);

    r = run("cache ls --wide --cache %s", c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    for (int i = 0; i < N_LS; i++) {
        char line[512];
        cr_assert(line_with(r.out, m[i].hex, line, sizeof line));
        cr_assert(strstr(line, m[i].sig), "%s", line);
        cr_assert(strstr(line, "nvrtc 13.0"), "%s", line);
    }
    kt_cli_free(&r);

    /* The default writable cache, and the same file named. */
    setenv("KILN_CACHE", c, 1);
    r = run("cache ls");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_eq(record_lines(r.out), N_LS, "%s", r.out);
    kt_cli_free(&r);
    r = run("cache ls %s", c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_eq(record_lines(r.out), N_LS, "%s", r.out);
    kt_cli_free(&r);
    unmake_all(m, N_LS);
    free(c);
}

Test(cache_cli, ls_reads_named_files_read_only)
{
    made m[N_LS];
    make_all(m, N_LS, 1700000000);
    char *a = path_in("a.kiln"), *b = path_in("b.kiln"), *user = path_in("user/kernels.kiln");
    fill(a, m, 0, 4);
    fill(b, m, 5, N_LS - 1);
    chmod(a, 0444);
    kt_cli r = run("cache ls %s --shipped %s", a, b);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_eq(record_lines(r.out), N_LS, "%s", r.out);
    char heading[512];
    snprintf(heading, sizeof heading, "%s (shipped):\n", a);
    const char *ha = strstr(r.out, heading);
    snprintf(heading, sizeof heading, "\n%s (shipped):\n", b);
    const char *hb = strstr(r.out, heading);
    cr_assert(ha && hb && ha < hb, "%s", r.out);
    for (int i = 0; i < N_LS; i++) {
        const char *at = strstr(r.out, m[i].hex);
        cr_assert(at && (i < 5 ? at < hb : at > hb), "%s in the wrong file:\n%s", m[i].hex,
                  r.out);
    }
    kt_cli_free(&r);
    /* Named, the writable cache is still read as the writable one. */
    r = run("cache ls %s --shipped %s --cache %s", a, b, b);
    cr_assert_eq(r.status, 0, "%s", r.err);
    snprintf(heading, sizeof heading, "\n%s (writable):\n", b);
    cr_assert(strstr(r.out, heading), "%s", r.out);
    kt_cli_free(&r);
    /* Reading named files leaves the writable cache alone. */
    struct stat st;
    cr_assert_neq(stat(user, &st), 0, "%s was created", user);
    unmake_all(m, N_LS);
    free(a);
    free(b);
    free(user);
}

Test(cache_cli, unreadable_caches_fail)
{
    char *junk = path_in("junk.kiln"), *missing = path_in("missing.kiln");
    FILE *f = fopen(junk, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < 10000; i++)
        fputs("not lmdb ", f);
    fclose(f);
    const char *sub[] = { "ls", "stat", "verify" };
    for (size_t i = 0; i < 3; i++) {
        kt_cli r = run("cache %s %s", sub[i], missing);
        cr_assert_eq(r.status, 1, "%s: %s", sub[i], r.err);
        cr_assert(strstr(r.err, "kiln: cache ") && strstr(r.err, missing), "%s", r.err);
        kt_cli_free(&r);
        r = run("cache %s %s", sub[i], junk);
        cr_assert_eq(r.status, 1, "%s: %s", sub[i], r.err);
        cr_assert(strstr(r.err, junk), "%s", r.err);
        kt_cli_free(&r);
    }
    /* No writable cache can be named at all. */
    unsetenv("KILN_CACHE");
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    static const char *const writers[] = { "ls", "stat", "verify", "gc --corrupt", "rm --all",
                                           "merge x" };
    for (size_t i = 0; i < sizeof writers / sizeof writers[0]; i++) {
        kt_cli r = run("cache %s", writers[i]);
        cr_assert_eq(r.status, 1, "%s: %s", writers[i], r.err);
        cr_assert(strstr(r.err, "kiln: cache "), "%s", r.err);
        kt_cli_free(&r);
    }
    free(junk);
    free(missing);
}

Test(cache_cli, stat_counts_by_target_and_kind)
{
    made m[N_LS];
    make_all(m, N_LS, 1700000000);
    char *c = path_in("c.kiln");
    fill(c, m, 0, N_LS - 1);
    kt_cli r = run("cache stat --cache %s", c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    char want[512], line[512];
    unsigned long long cubins = 0, by_target[2] = { 0 }, by_kind[4] = { 0 };
    size_t n_target[2] = { 0 }, n_kind[4] = { 0 };
    for (int i = 0; i < N_LS; i++) {
        uint8_t *buf;
        size_t size;
        cr_assert_eq(kiln_cache_record_encode(&m[i].rec, m[i].key, &buf, &size), KILN_OK);
        free(buf);
        cubins += m[i].rec.cubin_size;
        by_target[i % 2] += size;
        n_target[i % 2]++;
        by_kind[(i / 2) % 4] += size;
        n_kind[(i / 2) % 4]++;
    }
    snprintf(want, sizeof want, "cache:    %s (writable)\n", c);
    cr_assert(strstr(r.out, want), "%s", r.out);
    snprintf(want, sizeof want, "records:  %d (0 bad)\n", N_LS);
    cr_assert(strstr(r.out, want), "%s", r.out);
    char cu[32], f[32];
    human_bytes(cubins, cu, sizeof cu);
    human_bytes((uint64_t)file_size(c), f, sizeof f);
    snprintf(want, sizeof want, "cubins %s, file %s, map ", cu, f);
    cr_assert(line_with(r.out, "size:", line, sizeof line) && strstr(line, want),
              "want '%s' in:\n%s", want, r.out);
    char oldest[32], newest[32];
    date_of(m[0].rec.created, "%Y-%m-%dT%H:%M:%SZ", oldest, sizeof oldest);
    date_of(m[N_LS - 1].rec.created, "%Y-%m-%dT%H:%M:%SZ", newest, sizeof newest);
    snprintf(want, sizeof want, "oldest:   %s\nnewest:   %s\n", oldest, newest);
    cr_assert(strstr(r.out, want), "want '%s' in:\n%s", want, r.out);
    for (int t = 0; t < 2; t++) {
        char size[32];
        human_bytes(by_target[t], size, sizeof size);
        snprintf(want, sizeof want, "\n%-10s %8zu %12s\n", targets[t], n_target[t], size);
        cr_assert(strstr(r.out, want), "want '%s' in:\n%s", want, r.out);
    }
    for (int k = 0; k < 4; k++) {
        char size[32];
        human_bytes(by_kind[k], size, sizeof size);
        snprintf(want, sizeof want, "\n%-10s %8zu %12s\n", kinds[k], n_kind[k], size);
        cr_assert(strstr(r.out, want), "want '%s' in:\n%s", want, r.out);
    }
    kt_cli_free(&r);

    /* --json: the same numbers, to the byte */
    r = run("cache stat --cache %s --json", c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    snprintf(want, sizeof want, "\"cubins\": %llu,\n", cubins);
    cr_assert(strstr(r.out, want), "want '%s' in:\n%s", want, r.out);
    snprintf(want, sizeof want, "\"file\": %lld,\n", (long long)file_size(c));
    cr_assert(strstr(r.out, want), "want '%s' in:\n%s", want, r.out);
    snprintf(want, sizeof want, "\"records\": %d,\n", N_LS);
    cr_assert(strstr(r.out, want), "want '%s' in:\n%s", want, r.out);
    cr_assert(strstr(r.out, "\"manifest\": null"), "%s", r.out);
    kt_cli_free(&r);
    r = run("cache ls --cache %s --json", c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    for (int i = 0; i < N_LS; i++) {
        snprintf(want, sizeof want, "\"key\": \"%s\"", m[i].hex);
        const char *at = strstr(r.out, want);
        cr_assert(at, "no %s in:\n%s", m[i].hex, r.out);
        snprintf(want, sizeof want, "\"cubin_bytes\": %llu,",
                 (unsigned long long)m[i].rec.cubin_size);
        cr_assert(strstr(at, want), "want '%s' in:\n%s", want, at);
    }
    kt_cli_free(&r);
    unmake_all(m, N_LS);
    free(c);
}

/* ------------------------------------------------------------- verify */

Test(cache_cli, verify_names_a_corrupt_record)
{
    made m[N_LS];
    make_all(m, N_LS, 1700000000);
    char *c = path_in("c.kiln");
    fill(c, m, 0, N_LS - 1);
    kt_cli r = run("cache verify --cache %s", c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    char want[64];
    snprintf(want, sizeof want, "%d records, 0 bad\n", N_LS);
    cr_assert_str_eq(r.out, want);
    kt_cli_free(&r);

    kt_rng rng = kt_rng_new(kt_seed());
    int victim = (int)(kt_next(&rng) % N_LS);
    corrupt(c, &m[victim]);
    r = run("cache verify %s", c);
    cr_assert_eq(r.status, 1, "%s", r.out);
    snprintf(want, sizeof want, "%d records, 1 bad\n", N_LS);
    cr_assert(strstr(r.out, want), "%s", r.out);
    char line[1024];
    cr_assert(line_with(r.out, m[victim].hex, line, sizeof line), "%s", r.out);
    cr_assert(strstr(line, c) && strstr(line, "checksum"), "%s", line);
    cr_assert_eq(record_lines(r.out), 1, "%s", r.out);
    kt_cli_free(&r);

    /* ls shows it as bad; stat counts it. */
    r = run("cache ls --cache %s", c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(line_with(r.out, m[victim].hex, line, sizeof line), "%s", r.out);
    cr_assert(strstr(line, "  bad: "), "%s", line);
    kt_cli_free(&r);
    r = run("cache stat --cache %s", c);
    snprintf(want, sizeof want, "records:  %d (1 bad)\n", N_LS);
    cr_assert(strstr(r.out, want), "%s", r.out);
    kt_cli_free(&r);
    unmake_all(m, N_LS);
    free(c);
}

/* A pair that is no kiln record at all: a key of 5 bytes. */
Test(cache_cli, verify_names_a_foreign_key)
{
    made m[2];
    make_all(m, 2, 1700000000);
    char *c = path_in("c.kiln");
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_env_create(&env), 0);
    cr_assert_eq(mdb_env_open(env, c, MDB_NOSUBDIR, 0644), 0);
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
    MDB_val k = { 5, "fives" }, v = { 5, "hello" };
    cr_assert_eq(mdb_put(txn, dbi, &k, &v, 0), 0);
    cr_assert_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
    fill(c, m, 0, 1);
    kt_cli r = run("cache verify %s", c);
    cr_assert_eq(r.status, 1, "%s", r.err);
    char line[512];
    cr_assert(line_with(r.out, "(a key of 5 bytes)", line, sizeof line), "%s", r.out);
    cr_assert(strstr(line, "not a kiln key"), "%s", line);
    cr_assert(strstr(r.out, "\n3 records, 1 bad\n"), "%s", r.out);
    kt_cli_free(&r);
    r = run("cache ls %s", c);
    cr_assert(line_with(r.out, "(a key of 5 bytes)", line, sizeof line), "%s", r.out);
    cr_assert(strstr(line, "bad: "), "%s", line);
    cr_assert_eq(record_lines(r.out), 2, "%s", r.out);
    kt_cli_free(&r);
    unmake_all(m, 2);
    free(c);
}

/* -------------------------------------------------- merge, gc, rm */

Test(cache_cli, merge_counts_what_it_did)
{
    made m[10];
    make_all(m, 10, 1700000000);
    char *a = path_in("a.kiln"), *b = path_in("b.kiln");
    /* a: 0..5 with 2 corrupt; b: 2..8 with 7 corrupt. */
    fill(a, m, 0, 5);
    fill(b, m, 2, 8);
    corrupt(a, &m[2]);
    corrupt(b, &m[7]);
    kt_cli r = run("cache merge %s --cache %s", b, a);
    cr_assert_eq(r.status, 0, "%s", r.err);
    char want[512];
    snprintf(want, sizeof want, "merged %s into %s: 2 added, 3 present, 1 replaced, 1 bad\n", b,
             a);
    cr_assert_str_eq(r.out, want);
    cr_assert(strstr(r.err, "left out") && strstr(r.err, m[7].hex), "%s", r.err);
    kt_cli_free(&r);
    r = run("cache verify %s", a);
    cr_assert_eq(r.status, 0, "%s", r.out);
    cr_assert_str_eq(r.out, "8 records, 0 bad\n");
    kt_cli_free(&r);
    r = run("cache ls %s", a);
    for (int i = 0; i < 10; i++)
        cr_assert_eq(strstr(r.out, m[i].hex) != NULL, i != 7 && i != 9, "%s:\n%s", m[i].hex,
                     r.out);
    kt_cli_free(&r);

    /* A file that is not there, and the cache into itself. */
    r = run("cache merge %s/none.kiln --cache %s", dir, a);
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "none.kiln"), "%s", r.err);
    kt_cli_free(&r);
    r = run("cache merge %s --cache %s", a, a);
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "writable cache itself"), "%s", r.err);
    kt_cli_free(&r);
    unmake_all(m, 10);
    free(a);
    free(b);
}

Test(cache_cli, gc_removes_what_it_is_asked_to)
{
    enum { N = 12 };
    made m[N];
    uint64_t now = (uint64_t)time(NULL);
    /* Thirds: an old compiler; 100 days old; new. */
    for (int i = 0; i < N; i++)
        make(&m[i], i, i % 3 == 0 ? "nvrtc 12.4" : "nvrtc 13.0",
             i % 3 == 1 ? now - 100 * 86400 : now - 3600);
    char *c = path_in("c.kiln");
    fill(c, m, 0, N - 1);
    corrupt(c, &m[2]);

    uint64_t bytes = 0;
    for (int i = 0; i < N; i += 3) {
        uint8_t *buf;
        size_t size;
        cr_assert_eq(kiln_cache_record_encode(&m[i].rec, m[i].key, &buf, &size), KILN_OK);
        free(buf);
        bytes += size;
    }
    char size[32], want[512], line[600];
    human_bytes(bytes, size, sizeof size);

    /* A dry run names what would go and removes nothing. */
    kt_cli r = run("cache gc --compiler 'nvrtc 13.0' --dry-run --cache %s", c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    for (int i = 0; i < N; i++) {
        snprintf(want, sizeof want, "would remove %s  ", m[i].hex);
        cr_assert_eq(strstr(r.out, want) != NULL, i % 3 == 0, "%s:\n%s", m[i].hex, r.out);
    }
    snprintf(want, sizeof want, "would remove %d records (%s) from %s", N / 3, size, c);
    cr_assert(line_with(r.out, "would remove 4 records", line, sizeof line), "%s", r.out);
    cr_assert_str_eq(line, want);
    kt_cli_free(&r);
    r = run("cache ls --cache %s", c);
    cr_assert_eq(record_lines(r.out), N, "%s", r.out);
    kt_cli_free(&r);

    /* A compiler no record was made by would remove them all: refused. */
    r = run("cache gc --compiler 'nvrtc 12.9' --cache %s", c);
    cr_assert_eq(r.status, 1, "%s", r.out);
    cr_assert(strstr(r.err, "no record was made by \"nvrtc 12.9\"") &&
                  strstr(r.err, "nvrtc 12.4") && strstr(r.err, "--force"),
              "%s", r.err);
    kt_cli_free(&r);
    r = run("cache ls --cache %s", c);
    cr_assert_eq(record_lines(r.out), N, "%s", r.out);
    kt_cli_free(&r);

    r = run("cache gc --compiler 'nvrtc 13.0' --cache %s", c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    for (int i = 0; i < N; i += 3) {
        snprintf(want, sizeof want, "removing %s  ", m[i].hex);
        cr_assert(strstr(r.out, want), "%s:\n%s", m[i].hex, r.out);
    }
    snprintf(want, sizeof want, "removed %d records (%s) from %s", N / 3, size, c);
    cr_assert(line_with(r.out, "removed ", line, sizeof line), "%s", r.out);
    cr_assert_str_eq(line, want);
    kt_cli_free(&r);

    r = run("cache gc --older-than 30 --cache %s", c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "\nremoved 4 records ("), "%s", r.out);
    kt_cli_free(&r);
    /* Nothing left is that old, however a fraction of a day is spelt. */
    r = run("cache gc --older-than 0.5 --cache %s", c);
    cr_assert(!strncmp(r.out, "removed 0 records (0 B)", 23), "%s", r.out);
    kt_cli_free(&r);

    r = run("cache gc --corrupt --cache %s", c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "\nremoved 1 records ("), "%s", r.out);
    kt_cli_free(&r);

    r = run("cache ls --cache %s", c);
    for (int i = 0; i < N; i++)
        cr_assert_eq(strstr(r.out, m[i].hex) != NULL, i % 3 == 2 && i != 2, "%s:\n%s",
                     m[i].hex, r.out);
    kt_cli_free(&r);
    unmake_all(m, N);
    free(c);
}

Test(cache_cli, rm_by_prefix_and_all)
{
    made m[N_LS];
    make_all(m, N_LS, 1700000000);
    char *c = path_in("c.kiln");
    fill(c, m, 0, N_LS - 1);
    kt_rng rng = kt_rng_new(kt_seed() + 1);
    int victim = (int)(kt_next(&rng) % N_LS);
    /* Ten hex digits: no other key of twelve shares them (2^-40). */
    char prefix[11], upper[11];
    snprintf(prefix, sizeof prefix, "%.10s", m[victim].hex);
    for (int i = 0; i < 11; i++)
        upper[i] = (char)(prefix[i] >= 'a' && prefix[i] <= 'f' ? prefix[i] - 32 : prefix[i]);
    kt_cli r = run("cache rm %s --cache %s", upper, c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    char want[512];
    snprintf(want, sizeof want, "removed 1 records from %s\n", c);
    cr_assert_str_eq(r.out, want);
    kt_cli_free(&r);
    r = run("cache ls --cache %s", c);
    cr_assert_eq(record_lines(r.out), N_LS - 1, "%s", r.out);
    cr_assert_null(strstr(r.out, m[victim].hex));
    kt_cli_free(&r);

    /* Gone now: nothing matches. */
    r = run("cache rm %s --cache %s", prefix, c);
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "no key starts with") && strstr(r.err, prefix), "%s", r.err);
    kt_cli_free(&r);

    r = run("cache rm --all --cache %s", c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    snprintf(want, sizeof want, "removed %d records from %s\n", N_LS - 1, c);
    cr_assert_str_eq(r.out, want);
    kt_cli_free(&r);
    r = run("cache verify --cache %s", c);
    cr_assert_str_eq(r.out, "0 records, 0 bad\n");
    kt_cli_free(&r);
    unmake_all(m, N_LS);
    free(c);
}

/* ------------------------------------------------------------- export */

static kiln_status first_entry(void *ctx, const kiln_cache_entry *e)
{
    snprintf(ctx, 64, "%s", e->rec.entry);
    return KILN_ERR_STATE;
}

/* Make the first record of the cache file at path fail its checks: change
 * every copy of its entry name, which only it holds (in its header and in
 * its cubin's symbols). */
static void corrupt_first(const char *path)
{
    kiln_cache_options o = { .shipped = &path, .n_shipped = 1, .no_writable = 1 };
    kiln_cache *c;
    char entry[64] = "";
    cr_assert_eq(kiln_cache_open(&o, &c), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_cache_foreach(c, 0, first_entry, entry), KILN_ERR_STATE);
    kiln_cache_close(c);
    made m = { 0 };
    snprintf(m.marker, sizeof m.marker, "%.*s", (int)sizeof m.marker - 1, entry);
    cr_assert_gt(strlen(m.marker), 8, "%s", entry);
    corrupt(path, &m);
}

/* Small capture sizes keep the plan, and so the compile, short. */
#define EXPORT_PLAN "--model demo --capture 1,16"

static int compiled(const char *target, const char *cache)
{
    kt_cli r = run("compile demo --capture 1,16 --target %s --cache %s --quiet", target, cache);
    cr_assert_eq(r.status, 0, "compile for %s: %s", target, r.err);
    int n = 0;
    cr_assert_eq(sscanf(r.out, "%d signatures", &n), 1, "%s", r.out);
    cr_assert_gt(n, 0);
    kt_cli_free(&r);
    return n;
}

Test(cache_cli, export_ships_exactly_the_plan, .timeout = 1200)
{
    char *c = path_in("c.kiln"), *s = path_in("sm_80.kiln");
    char *s2 = path_in("again.kiln"), *empty = path_in("empty.kiln");
    int n80 = compiled("sm_80", c);
    int n90 = compiled("sm_90a", c);

    kt_cli r = run("cache export " EXPORT_PLAN " --target sm_80 -o %s --cache %s", s, c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    char want[512], size[32];
    human_bytes((uint64_t)file_size(s), size, sizeof size);
    snprintf(want, sizeof want, "exported %d kernels (%s) to %s\n", n80, size, s);
    cr_assert_str_eq(r.out, want);
    kt_cli_free(&r);
    cr_assert_lt(file_size(s), file_size(c));

    r = run("cache ls %s", s);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_eq(record_lines(r.out), n80, "%s", r.out);
    cr_assert_null(strstr(r.out, "sm_90a"), "%s", r.out);
    kt_cli_free(&r);
    r = run("cache ls --cache %s", c);
    cr_assert_eq(record_lines(r.out), n80 + n90, "%s", r.out);
    kt_cli_free(&r);
    r = run("cache verify %s", s);
    cr_assert_eq(r.status, 0, "%s", r.out);
    kt_cli_free(&r);

    /* An existing file stays unless --force; export never replaces a
     * cache it reads. */
    r = run("cache export " EXPORT_PLAN " --target sm_80 -o %s --cache %s", s, c);
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "exists"), "%s", r.err);
    kt_cli_free(&r);
    r = run("cache export " EXPORT_PLAN " --target sm_80 -o %s --cache %s --force", s, c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    kt_cli_free(&r);
    r = run("cache export " EXPORT_PLAN " --target sm_80 -o %s --cache %s --force", c, c);
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "export reads"), "%s", r.err);
    kt_cli_free(&r);

    /* From a shipped file alone, into a new one: the same kernels. */
    r = run("cache export " EXPORT_PLAN " --target sm_80 -o %s --shipped %s --cache %s", s2, s,
            empty);
    cr_assert_eq(r.status, 0, "%s", r.err);
    kt_cli_free(&r);
    kt_cli a = run("cache ls --wide %s", s), b = run("cache ls --wide %s", s2);
    cr_assert_str_eq(a.out, b.out);
    kt_cli_free(&a);
    kt_cli_free(&b);

    /* A record gone bad in the shipped file: passed over with a warning,
     * then found in the writable cache, or missing when that is empty. */
    corrupt_first(s);
    char *s3 = path_in("s3.kiln");
    r = run("cache export " EXPORT_PLAN " --target sm_80 -o %s --shipped %s --cache %s", s3, s,
            empty);
    cr_assert_eq(r.status, 1, "%s", r.out);
    cr_assert(strstr(r.err, "kiln cache export: warning: ") && strstr(r.err, "corrupt"), "%s",
              r.err);
    cr_assert(strstr(r.err, "kiln compile"), "%s", r.err);
    kt_cli_free(&r);
    r = run("cache export " EXPORT_PLAN " --target sm_80 -o %s --shipped %s --cache %s", s3, s, c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.err, "kiln cache export: warning: "), "%s", r.err);
    kt_cli_free(&r);
    r = run("cache verify %s", s3);
    cr_assert_eq(r.status, 0, "%s", r.out);
    kt_cli_free(&r);
    free(s3);

    /* Another plan needs kernels that were never compiled. */
    r = run("cache export --model demo --capture 1,16,64 --target sm_80 -o %s/x.kiln --cache %s",
            dir, c);
    cr_assert_eq(r.status, 1, "%s", r.out);
    cr_assert(strstr(r.err, "kiln compile demo --target sm_80"), "%s", r.err);
    kt_cli_free(&r);
    free(s2);
    free(empty);
    free(s);
    free(c);
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* check says, without a GPU and compiling nothing, whether the caches hold
 * a plan's kernels, and lists the ones they lack. */
Test(cache_cli, check_lists_what_a_cache_lacks, .timeout = 600)
{
    char *c = path_in("c.kiln");
    int n = compiled("sm_80", c);
    kt_cli r = run("cache check " EXPORT_PLAN " --target sm_80 --cache %s", c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    char want[512];
    snprintf(want, sizeof want, "%d of %d kernels of demo for sm_80 in %s: complete\n", n, n, c);
    cr_assert_str_eq(r.out, want);
    kt_cli_free(&r);

    /* more capture sizes: more kernels, each listed, and exit 1 */
    r = run("cache check --model demo --capture 1,16,64 --target sm_80 --cache %s", c);
    cr_assert_eq(r.status, 1, "%s", r.err);
    int missing = 0;
    for (const char *p = r.out; (p = strstr(p, "missing: linear backend=")); p++)
        missing++;
    cr_assert_gt(missing, 0, "%s", r.out);
    cr_assert(strstr(r.out, ": incomplete\n"), "%s", r.out);
    cr_assert(strstr(r.err, "kernels missing: kiln compile demo --target sm_80"), "%s", r.err);
    kt_cli_free(&r);

    r = run("cache check --model demo --capture 1,16,64 --target sm_80 --cache %s --json", c);
    cr_assert_eq(r.status, 1, "%s", r.err);
    cr_assert(strstr(r.out, "\"complete\": false"), "%s", r.out);
    cr_assert(strstr(r.out, "\"signature\": \"linear backend="), "%s", r.out);
    kt_cli_free(&r);

    /* another target's plan is not covered */
    r = run("cache check " EXPORT_PLAN " --target sm_90a --cache %s", c);
    cr_assert_eq(r.status, 1, "%s", r.out);
    kt_cli_free(&r);
    free(c);
}

/* ls, stat, verify and check read: on a fresh machine they create no file
 * and no folder. */
Test(cache_cli, reading_creates_nothing)
{
    char *user = path_in("user");
    static const char *const reads[] = { "cache ls", "cache stat", "cache verify",
                                         "cache check " EXPORT_PLAN " --target sm_80" };
    for (size_t i = 0; i < sizeof reads / sizeof reads[0]; i++) {
        kt_cli r = run("%s", reads[i]);
        cr_assert(strstr(r.err, "no cache at "), "%s: %s", reads[i], r.err);
        cr_assert(!exists(user), "%s made %s", reads[i], user);
        kt_cli_free(&r);
    }
    kt_cli r = run("cache ls --cache %s/none.kiln", dir);
    cr_assert_eq(r.status, 0, "%s", r.err);
    kt_cli_free(&r);
    char *none = path_in("none.kiln");
    cr_assert(!exists(none));
    free(none);
    free(user);
}

/* The workflow a deployment pipeline runs, on the CPU: compile with
 * capture sizes of its own, export, check, then run offline from the
 * shipped file alone; then the traps that once hid until the deployment. */
Test(cache_cli, shipping_workflow, .timeout = 600)
{
    char *c = path_in("build.kiln"), *s = path_in("ship.kiln");
    compiled("sm_80", c);
    kt_cli r = run("cache export " EXPORT_PLAN " --target sm_80 -o %s --cache %s", s, c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    kt_cli_free(&r);
    r = run("cache check " EXPORT_PLAN " --target sm_80 --shipped %s", s);
    cr_assert_eq(r.status, 0, "%s%s", r.out, r.err);
    kt_cli_free(&r);
    r = run("run demo --device cpu --shipped %s --offline --target sm_80 --capture 1,16 "
            "--tokens 1,16 --steps 1", s);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "\n16 "), "%s", r.out);
    kt_cli_free(&r);

    /* the default capture sizes need kernels the file lacks: its manifest
     * says so first, and so does a salvaged copy's (salvage keeps an intact
     * manifest); a file without one (the compile's own cache) is checked
     * kernel by kernel */
    r = run("run demo --device cpu --shipped %s --offline --target sm_80 --tokens 1 --steps 1", s);
    cr_assert_eq(r.status, 1, "%s", r.out);
    cr_assert(strstr(r.err, "was made for another set of token buckets: 1,16, not 1,2,4,"),
              "%s", r.err);
    kt_cli_free(&r);
    char *saved = path_in("saved.kiln");
    r = run("cache salvage %s -o %s", s, saved);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "; its manifest kept; no intact tuning table\n"), "%s", r.out);
    kt_cli_free(&r);
    r = run("run demo --device cpu --shipped %s --offline --target sm_80 --tokens 1 --steps 1",
            saved);
    cr_assert_eq(r.status, 1, "%s", r.out);
    cr_assert(strstr(r.err, "was made for another set of token buckets: 1,16, not 1,2,4,"),
              "%s", r.err);
    kt_cli_free(&r);
    free(saved);
    r = run("run demo --device cpu --shipped %s --offline --target sm_80 --tokens 1 --steps 1",
            c);
    cr_assert_eq(r.status, 1, "%s", r.out);
    cr_assert(strstr(r.err, "are in no shipped cache") && strstr(r.err, "kiln cache check"),
              "%s", r.err);
    kt_cli_free(&r);
    setenv("KILN_OFFLINE", "1", 1);
    r = run("run demo --device cpu --shipped %s --target sm_80 --tokens 1 --steps 1", s);
    unsetenv("KILN_OFFLINE");
    cr_assert_eq(r.status, 1, "KILN_OFFLINE=1 is --offline: %s", r.out);
    kt_cli_free(&r);
    /* the old spelling of capture sizes */
    r = run("cache export --model demo --tokens 1,16 --target sm_80 -o %s/x.kiln --cache %s", dir,
            c);
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--capture 1,16"), "%s", r.err);
    kt_cli_free(&r);
    /* a shipped file that is not there */
    r = run("run demo --shipped %s/none.kiln --offline --tokens 1 --steps 1", dir);
    cr_assert_eq(r.status, 1, "%s", r.out);
    cr_assert(strstr(r.err, "none.kiln"), "%s", r.err);
    kt_cli_free(&r);
    /* a device asked for by number that is not there */
    r = run("run demo --device cuda:999 --tokens 1 --steps 1");
    cr_assert_eq(r.status, 1, "%s", r.out);
    cr_assert(strstr(r.err, "kiln: run"), "%s", r.err);
    kt_cli_free(&r);
    free(s);
    free(c);
}

/* One file for a fleet of mixed GPUs: compile and export for three
 * targets at once; the file serves each of them offline, and check says
 * so per target. */
Test(cache_cli, one_file_serves_several_targets, .timeout = 900)
{
    char *c = path_in("fleet-build.kiln"), *s = path_in("fleet.kiln");
    static const char *const fleet[] = { "sm_90a", "sm_120a", "sm_80" };
    kt_cli r = run("compile demo --capture 1,8 --target sm_90a --target SM_120A --target sm_80 "
                   "--cache %s --quiet", c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    for (size_t i = 0; i < 3; i++) {
        char want[64];
        snprintf(want, sizeof want, "(%s, ", fleet[i]);
        cr_assert(strstr(r.out, want), "%s: %s", fleet[i], r.out);
    }
    kt_cli_free(&r);
    r = run("cache export --model demo --capture 1,8 --target sm_90a --target sm_120a "
            "--target sm_80 -o %s --cache %s", s, c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    kt_cli_free(&r);
    r = run("cache check --model demo --capture 1,8 --target sm_90a --target sm_120a "
            "--target sm_80 --shipped %s", s);
    cr_assert_eq(r.status, 0, "%s%s", r.out, r.err);
    for (size_t i = 0; i < 3; i++) {
        char want[64];
        snprintf(want, sizeof want, " for %s in %s: complete\n", fleet[i], s);
        cr_assert(strstr(r.out, want), "%s: %s", fleet[i], r.out);
    }
    kt_cli_free(&r);
    for (size_t i = 0; i < 3; i++) {
        r = run("run demo --device cpu --shipped %s --offline --target %s --capture 1,8 "
                "--tokens 1,8 --steps 1", s, fleet[i]);
        cr_assert_eq(r.status, 0, "%s: %s", fleet[i], r.err);
        kt_cli_free(&r);
    }
    /* a target the file was not made for */
    r = run("run demo --device cpu --shipped %s --offline --target sm_86 --capture 1,8 "
            "--tokens 1 --steps 1", s);
    cr_assert_eq(r.status, 1, "%s", r.out);
    kt_cli_free(&r);
    /* one target twice is refused */
    r = run("compile demo --target sm_80 --target a100 --cache %s", c);
    cr_assert_eq(r.status, 2, "%s", r.out);
    cr_assert(strstr(r.err, "are one target, sm_80"), "%s", r.err);
    kt_cli_free(&r);
    free(s);
    free(c);
}

/* An exported file says what it was made for (cache stat shows it), and
 * kiln run checks it against what it is given before anything loads:
 * offline every difference is named and fails the run; online they are
 * warnings (the kernels the file lacks are compiled). */
Test(cache_cli, manifest_says_what_a_file_was_made_for, .timeout = 600)
{
    char *c = path_in("m-build.kiln"), *s = path_in("m.kiln");
    compiled("sm_80", c);
    kt_cli r = run("cache export " EXPORT_PLAN " --target sm_80 -o %s --cache %s", s, c);
    cr_assert_eq(r.status, 0, "%s", r.err);
    kt_cli_free(&r);
    kt_cli v = run("--version");
    char want[256];
    snprintf(want, sizeof want, "manifest: %.*s, kiln-cache-2, ", (int)strcspn(v.out, "\n"),
             v.out);
    kt_cli_free(&v);
    r = run("cache stat %s", s);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, want), "want %s: %s", want, r.out);
    cr_assert(strstr(r.out, "  model:    demo, graph "), "%s", r.out);
    cr_assert(strstr(r.out, "  targets:  [\"sm_80\"]\n  buckets:  1,16\n"), "%s", r.out);
    cr_assert(strstr(r.out, "\"capture\":[1,16]"), "%s", r.out);
    kt_cli_free(&r);
    /* the writable cache has none */
    r = run("cache stat --cache %s", c);
    cr_assert_null(strstr(r.out, "manifest:"), "%s", r.out);
    kt_cli_free(&r);

    r = run("run demo --device cpu --shipped %s --offline --target sm_80 --capture 1,16 "
            "--tokens 1 --steps 1", s);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_null(strstr(r.err, "was made for"), "%s", r.err);
    kt_cli_free(&r);
    r = run("run demo --device cpu --shipped %s --offline --target sm_86 --capture 1,8 "
            "--no-fuse --tokens 1 --steps 1", s);
    cr_assert_eq(r.status, 1, "%s", r.out);
    cr_assert(strstr(r.err, "was made for another set of token buckets: 1,16, not 1,8"), "%s",
              r.err);
    cr_assert(strstr(r.err, "was made for another planning option: --no-fuse false, not true"),
              "%s", r.err);
    cr_assert(strstr(r.err, "was made for another target: [\"sm_80\"], not sm_86"), "%s", r.err);
    cr_assert(strstr(r.err, "(3 differences above): nothing was loaded"), "%s", r.err);
    cr_assert_str_empty(r.out);
    kt_cli_free(&r);
    /* not offline: the same differences, as warnings */
    r = run("run demo --device cpu --shipped %s --target sm_86 --capture 1,8 --tokens 1 "
            "--steps 1", s);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.err, "was made for another target"), "%s", r.err);
    kt_cli_free(&r);

    /* a manifest changed on disk: verify and stat say so, run refuses it */
    long len;
    char *bytes = kt_read_file(s, &len);
    cr_assert_not_null(bytes);
    char *at = memmem(bytes, (size_t)len, "\"capture\":[1,16]", 16);
    cr_assert_not_null(at, "the manifest's text is in the file");
    int fd = open(s, O_WRONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pwrite(fd, "7", 1, (at - bytes) + 12), 1);
    close(fd);
    free(bytes);
    r = run("cache verify %s", s);
    cr_assert_eq(r.status, 1, "%s", r.out);
    cr_assert(strstr(r.out, "manifest  ") && strstr(r.out, "damaged (checksum)"), "%s", r.out);
    kt_cli_free(&r);
    r = run("cache stat %s", s);
    cr_assert(strstr(r.out, "manifest: ") && strstr(r.out, "damaged (checksum)"), "%s", r.out);
    kt_cli_free(&r);
    r = run("run demo --device cpu --shipped %s --offline --target sm_80 --capture 1,16 "
            "--tokens 1 --steps 1", s);
    cr_assert_eq(r.status, 1, "%s", r.out);
    cr_assert(strstr(r.err, "damaged (checksum)"), "%s", r.err);
    kt_cli_free(&r);
    free(s);
    free(c);
}

Test(cache_cli, export_from_an_empty_cache_fails)
{
    char *c = path_in("empty.kiln"), *s = path_in("s.kiln");
    kt_cli r = run("cache export " EXPORT_PLAN " --target sm_80 -o %s --cache %s", s, c);
    cr_assert_eq(r.status, 1, "%s", r.out);
    cr_assert(strstr(r.err, "kernel \"") && strstr(r.err, "target=sm_80"), "%s", r.err);
    cr_assert(strstr(r.err, "kiln compile"), "%s", r.err);
    cr_assert_str_empty(r.out);
    struct stat st;
    cr_assert_neq(stat(s, &st), 0, "%s was written", s);
    kt_cli_free(&r);

    r = run("cache export --model %s/none.gguf --target sm_80 -o %s --cache %s", dir, s, c);
    cr_assert_eq(r.status, 1, "%s", r.out);
    cr_assert(strstr(r.err, "none.gguf"), "%s", r.err);
    kt_cli_free(&r);
    free(s);
    free(c);
}

/* -------------------------------------------------------- salvage */

/* A truncated cache is damaged: verify says so and exits 1; salvage copies
 * the records whose bytes survived into a new file that verifies, and
 * refuses to replace its source or an existing file unasked. */
Test(cache_cli, salvage_copies_what_a_cut_file_still_holds)
{
    char *c = path_in("c.kiln"), *out = path_in("out.kiln");
    made m[N_LS];
    make_all(m, N_LS, 1700000000);
    fill(c, m, 0, N_LS - 1);
    /* LMDB may leave free pages at the end of a file, and a cut of those
     * loses nothing: cut a page at a time until a page in use is gone. */
    const off_t size = file_size(c);
    off_t cut = 0;
    kt_cli r;
    for (;;) {
        cut += 4096;
        cr_assert_eq(truncate(c, size - cut), 0);
        r = run("cache verify %s", c);
        if (r.status != 0 || cut >= size / 2)
            break;
        kt_cli_free(&r);
    }
    cr_assert_eq(r.status, 1, "%s%s (cut %lld of %lld bytes)", r.out, r.err, (long long)cut,
                 (long long)size);
    cr_assert(strstr(r.out, c) && strstr(r.out, "damaged"), "%s", r.out);
    kt_cli_free(&r);
    r = run("cache salvage %s -o %s", c, out);
    cr_assert_eq(r.status, 0, "%s", r.err);
    int n = 0;
    cr_assert_eq(sscanf(r.out, "salvaged %d records of", &n), 1, "%s", r.out);
    cr_assert_gt(n, 0, "%s", r.out);
    kt_cli_free(&r);
    r = run("cache verify %s", out);
    cr_assert_eq(r.status, 0, "%s%s", r.out, r.err);
    char want[64];
    snprintf(want, sizeof want, "%d records, 0 bad\n", n);
    cr_assert_str_eq(r.out, want);
    kt_cli_free(&r);
    r = run("cache salvage %s -o %s", c, out);
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "exists"), "%s", r.err);
    kt_cli_free(&r);
    r = run("cache salvage %s -o %s --force", c, c);
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "the output is the file itself"), "%s", r.err);
    kt_cli_free(&r);
    unmake_all(m, N_LS);
    free(c);
    free(out);
}
