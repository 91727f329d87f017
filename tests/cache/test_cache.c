/* cache/cache.c and cache/maint.c: layered lookups, stores from racing and
 * dying processes, corrupt records on disk, read-only shipped files, map
 * growth, and the maintenance operations. */
#include "cache/cache.h"
#include "tests/cache/fake_cubin.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <lmdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------- fixtures */

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static char *tmp_dir(void)
{
    char *dir = strdup("/tmp/kiln-cache-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    return dir;
}

static void tmp_remove(char *dir)
{
    cr_assert_eq(nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS), 0, "remove %s", dir);
    free(dir);
}

static char *path_in(const char *dir, const char *name)
{
    char *p;
    cr_assert_gt(asprintf(&p, "%s/%s", dir, name), 0);
    return p;
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* A kernel as the compiler driver would store it: everything follows from
 * i, so a forked child makes the same record as its parent. The cubin
 * carries a marker that finds it in the file. */
typedef struct made {
    kiln_cache_record rec;
    uint8_t key[KILN_CACHE_KEY_BYTES];
    char hex[KILN_CACHE_KEY_HEX];
    char sig[160], entry[32], marker[24];
    uint8_t *cubin;
} made;

static void make(made *m, int i, size_t cubin_size)
{
    kt_rng r = kt_rng_new(1000 + (uint64_t)i);
    char source[64];
    snprintf(m->sig, sizeof m->sig,
             "linear backend=simt variant=default format=q8_0 n=%d k=4096 epilogue=none "
             "out=bf16 target=sm_90a",
             i);
    snprintf(m->entry, sizeof m->entry, "kiln_linear_%d", i);
    snprintf(m->marker, sizeof m->marker, "KILN-MARKER-%06d", i);
    snprintf(source, sizeof source, "kernel %d of %zu bytes", i, cubin_size);
    cr_assert_eq(kiln_cache_key("sm_90a", "-arch=sm_90a", source, strlen(source), m->key),
                 KILN_OK);
    kiln_cache_key_hex(m->key, m->hex);
    m->cubin = malloc(cubin_size);
    for (size_t j = 0; j < cubin_size; j++)
        m->cubin[j] = (uint8_t)kt_next(&r);
    cr_assert_gt(cubin_size, 64 + sizeof m->marker);
    kt_elf_header(m->cubin, 90);
    memcpy(m->cubin + 64, m->marker, strlen(m->marker));
    m->rec = (kiln_cache_record){
        .compiler = "nvrtc 13.0",
        .entry = m->entry,
        .target = "sm_90a",
        .kind = "simt",
        .signature = m->sig,
        .threads = 128,
        .smem = (uint32_t)i * 16,
        .cubin = m->cubin,
        .cubin_size = cubin_size,
    };
}

static void unmake(made *m) { free(m->cubin); }

static kiln_cache *open_at(const char *path, size_t map_size)
{
    kiln_cache_options o = { .path = path, .map_size = map_size };
    kiln_cache *c = NULL;
    kiln_status st = kiln_cache_open(&o, &c);
    cr_assert_eq(st, KILN_OK, "%s", kiln_last_error());
    return c;
}

static kiln_cache *open_shipped(const char *path)
{
    kiln_cache_options o = { .shipped = &path, .n_shipped = 1, .no_writable = 1 };
    kiln_cache *c = NULL;
    kiln_status st = kiln_cache_open(&o, &c);
    cr_assert_eq(st, KILN_OK, "%s", kiln_last_error());
    return c;
}

static void store(kiln_cache *c, const made *m, kiln_cache_put want)
{
    kiln_cache_put got;
    kiln_status st = kiln_cache_store(c, m->key, &m->rec, &got);
    cr_assert_eq(st, KILN_OK, "%s: %s", m->hex, kiln_last_error());
    cr_assert_eq(got, want, "%s: put %d, wanted %d", m->hex, got, want);
}

static void expect_hit(kiln_cache *c, const made *m, int layer)
{
    kiln_cache_hit h;
    kiln_status st = kiln_cache_lookup(c, m->key, "sm_90a", &h);
    cr_assert_eq(st, KILN_OK, "%s: %s", m->hex, kiln_last_error());
    cr_assert_eq(h.layer, layer, "%s: layer %d, wanted %d", m->hex, h.layer, layer);
    cr_assert_str_eq(h.rec.signature, m->sig);
    cr_assert_str_eq(h.rec.entry, m->entry);
    cr_assert_str_eq(h.rec.compiler, m->rec.compiler);
    cr_assert_eq(h.rec.threads, 128);
    cr_assert_eq(h.rec.smem, m->rec.smem);
    cr_assert_eq(h.rec.cubin_size, m->rec.cubin_size);
    cr_assert_arr_eq(h.rec.cubin, m->cubin, (size_t)m->rec.cubin_size);
    kiln_cache_hit_release(&h);
}

static void expect_miss(kiln_cache *c, const made *m)
{
    kiln_cache_hit h;
    cr_assert_eq(kiln_cache_lookup(c, m->key, "sm_90a", &h), KILN_ERR_NOT_FOUND, "%s", m->hex);
    cr_assert(strstr(kiln_last_error(), m->hex), "%s", kiln_last_error());
}

static size_t entries(kiln_cache *c, int layer, size_t *bad)
{
    size_t n, b;
    kiln_status st = kiln_cache_verify(c, layer, NULL, NULL, &n, &b);
    cr_assert_eq(st, KILN_OK, "%s", kiln_last_error());
    if (bad)
        *bad = b;
    else
        cr_assert_eq(b, 0, "%zu bad records", b);
    return n;
}

static uint8_t *slurp(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(*size ? *size : 1);
    cr_assert_eq(fread(p, 1, *size, f), *size);
    fclose(f);
    return p;
}

/* Flip one byte of m's cubin inside the closed file at path. LMDB reuses
 * page buffers without clearing them, so stale copies of a record can sit
 * in unused parts of pages: every copy is changed, the live one among them. */
static void flip_in_file(const char *path, const made *m)
{
    size_t size, len = strlen(m->marker);
    int found = 0;
    uint8_t *p = slurp(path, &size);
    int fd = open(path, O_WRONLY);
    cr_assert_geq(fd, 0);
    for (size_t i = 0; i + len + 6 <= size; i++)
        if (!memcmp(p + i, m->marker, len)) {
            uint8_t b = (uint8_t)(p[i + len + 5] ^ 0x5a);
            cr_assert_eq(pwrite(fd, &b, 1, (off_t)(i + len + 5)), 1);
            found++;
        }
    cr_assert_gt(found, 0, "marker %s not in %s", m->marker, path);
    close(fd);
    free(p);
}

typedef struct reports {
    int n;
    char last[1024];
} reports;

static void on_corrupt(void *ctx, const char *message)
{
    reports *r = ctx;
    r->n++;
    snprintf(r->last, sizeof r->last, "%s", message);
}

static kiln_status collect_bad(void *ctx, const kiln_cache_entry *e)
{
    reports *r = ctx;
    r->n++;
    snprintf(r->last, sizeof r->last, "%s", e->problem);
    return KILN_OK;
}

/* ------------------------------------------------------ lookup, store */

Test(cache, store_and_lookup)
{
    char *dir = tmp_dir();
    char *path = path_in(dir, "a/b/kernels.kiln");
    made m, other;
    make(&m, 1, 2000);
    make(&other, 2, 2000);
    kiln_cache *c = open_at(path, 0);
    cr_assert_eq(kiln_cache_n_layers(c), 1);
    cr_assert_eq(kiln_cache_writable_layer(c), 0);
    cr_assert_str_eq(kiln_cache_layer_path(c, 0), path);
    cr_assert_null(kiln_cache_layer_path(c, 1));
    expect_miss(c, &m);
    store(c, &m, KILN_CACHE_ADDED);
    expect_hit(c, &m, 0);
    /* A second store of the key changes nothing. */
    store(c, &m, KILN_CACHE_PRESENT);
    expect_miss(c, &other);
    cr_assert_eq(entries(c, 0, NULL), 1);
    kiln_cache_close(c);
    /* It is on disk. */
    c = open_at(path, 0);
    expect_hit(c, &m, 0);
    kiln_cache_hit h;
    cr_assert_eq(kiln_cache_lookup(c, m.key, "sm_90a", &h), KILN_OK);
    cr_assert_geq(h.rec.created, (uint64_t)time(NULL) - 60);
    cr_assert_eq(h.size, h.rec.cubin_size + (size_t)(h.rec.cubin - (const uint8_t *)h.blob));
    kiln_cache_hit_release(&h);
    kiln_cache_hit_release(NULL);
    kiln_cache_close(c);
    kiln_cache_close(NULL);
    unmake(&m);
    unmake(&other);
    free(path);
    tmp_remove(dir);
}

Test(cache, default_path)
{
    char buf[256], small[8];
    setenv("KILN_CACHE", "/x/k.kiln", 1);
    setenv("XDG_CACHE_HOME", "/xdg", 1);
    setenv("HOME", "/home/u", 1);
    cr_assert_eq(kiln_cache_default_path(buf, sizeof buf), KILN_OK);
    cr_assert_str_eq(buf, "/x/k.kiln");
    unsetenv("KILN_CACHE");
    cr_assert_eq(kiln_cache_default_path(buf, sizeof buf), KILN_OK);
    cr_assert_str_eq(buf, "/xdg/kiln/kernels.kiln");
    setenv("XDG_CACHE_HOME", "relative", 1);
    cr_assert_eq(kiln_cache_default_path(buf, sizeof buf), KILN_OK);
    cr_assert_str_eq(buf, "/home/u/.cache/kiln/kernels.kiln");
    cr_assert_eq(kiln_cache_default_path(small, sizeof small), KILN_ERR_INVALID_ARG);
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    cr_assert_eq(kiln_cache_default_path(buf, sizeof buf), KILN_ERR_IO);
    cr_assert(strstr(kiln_last_error(), "set KILN_CACHE"), "%s", kiln_last_error());
    kiln_cache *c = NULL;
    cr_assert_eq(kiln_cache_open(NULL, &c), KILN_ERR_IO);
    cr_assert_null(c);

    /* With no path given, open takes the default and makes its folders. */
    char *dir = tmp_dir();
    setenv("XDG_CACHE_HOME", dir, 1);
    cr_assert_eq(kiln_cache_open(NULL, &c), KILN_OK, "%s", kiln_last_error());
    char *want = path_in(dir, "kiln/kernels.kiln");
    cr_assert_str_eq(kiln_cache_layer_path(c, 0), want);
    cr_assert(exists(want));
    kiln_cache_close(c);
    free(want);
    tmp_remove(dir);
}

/* Four processes store the same 50 kernels at once into a map that starts
 * at 64 KiB: each kernel is added exactly once, every other store finds it
 * present, and all of them succeed. */
Test(cache, racing_processes_store_each_key_once)
{
    enum { PROCS = 4, KEYS = 50 };
    char *dir = tmp_dir();
    char *path = path_in(dir, "kernels.kiln");
    kt_seed();
    int fds[PROCS][2];
    pid_t pids[PROCS];
    for (int p = 0; p < PROCS; p++) {
        cr_assert_eq(pipe(fds[p]), 0);
        pids[p] = fork();
        cr_assert_geq(pids[p], 0);
        if (pids[p] == 0) {
            close(fds[p][0]);
            int order[KEYS];
            for (int i = 0; i < KEYS; i++)
                order[i] = i;
            kt_rng r = kt_rng_new(50 + (uint64_t)p);
            for (int i = KEYS - 1; i > 0; i--) {
                int j = (int)(kt_next(&r) % (uint64_t)(i + 1)), t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
            kiln_cache_options o = { .path = path, .map_size = 64 << 10 };
            kiln_cache *c;
            int added = 0, failed = kiln_cache_open(&o, &c) != KILN_OK;
            for (int i = 0; i < KEYS && !failed; i++) {
                made m;
                kiln_cache_put put;
                make(&m, order[i], 4096);
                failed = kiln_cache_store(c, m.key, &m.rec, &put) != KILN_OK;
                added += !failed && put == KILN_CACHE_ADDED;
                unmake(&m);
            }
            if (failed)
                fprintf(stderr, "child %d: %s\n", p, kiln_last_error());
            else
                kiln_cache_close(c);
            ssize_t w = write(fds[p][1], &added, sizeof added);
            _exit(failed || w != (ssize_t)sizeof added);
        }
        close(fds[p][1]);
    }
    int total = 0;
    for (int p = 0; p < PROCS; p++) {
        int added = 0, status;
        cr_assert_eq(read(fds[p][0], &added, sizeof added), (ssize_t)sizeof added);
        close(fds[p][0]);
        cr_assert_eq(waitpid(pids[p], &status, 0), pids[p]);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d failed", p);
        total += added;
    }
    cr_assert_eq(total, KEYS);
    kiln_cache *c = open_at(path, 0);
    cr_assert_eq(entries(c, 0, NULL), KEYS);
    for (int i = 0; i < KEYS; i++) {
        made m;
        make(&m, i, 4096);
        expect_hit(c, &m, 0);
        unmake(&m);
    }
    kiln_cache_close(c);
    free(path);
    tmp_remove(dir);
}

/* A writer killed mid-stream (possibly inside a transaction, holding the
 * write lock) leaves a cache that opens, verifies clean and takes stores;
 * in the last round the survivor has the cache open during the kill. */
Test(cache, killed_writer_leaves_a_sound_cache)
{
    char *dir = tmp_dir();
    char *path = path_in(dir, "kernels.kiln");
    kt_rng r = kt_rng_new(11);
    for (int round = 0; round < 3; round++) {
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            kiln_cache_options o = { .path = path, .map_size = 64 << 10 };
            kiln_cache *c;
            if (kiln_cache_open(&o, &c))
                _exit(2);
            for (int i = 0; i < 1000000; i++) {
                made m;
                make(&m, round * 1000000 + i, 1500 + i % 3000);
                kiln_status st = kiln_cache_store(c, m.key, &m.rec, NULL);
                unmake(&m);
                if (st)
                    _exit(3);
            }
            _exit(4);
        }
        kiln_cache *c = NULL;
        usleep(30000 + (useconds_t)(kt_next(&r) % 70000));
        if (round == 2)
            c = open_at(path, 0);
        usleep((useconds_t)(kt_next(&r) % 30000));
        cr_assert_eq(kill(pid, SIGKILL), 0);
        int status;
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the writer ended early");
        if (!c)
            c = open_at(path, 0);
        size_t n = entries(c, 0, NULL);
        cr_assert_gt(n, 0, "round %d: nothing was written before the kill", round);
        made m;
        make(&m, -1 - round, 2000);
        store(c, &m, KILN_CACHE_ADDED);
        expect_hit(c, &m, 0);
        /* A writer killed after its meta page reached the file but before
         * it let go of the lock has committed; a reader that was open
         * already sees that only after the next writer recovers the lock. */
        size_t n2 = entries(c, 0, NULL);
        cr_assert(n2 == n + 1 || (round == 2 && n2 == n + 2), "round %d: %zu then %zu", round,
                  n, n2);
        unmake(&m);
        kiln_cache_close(c);
    }
    free(path);
    tmp_remove(dir);
}

/* A byte changed on disk inside a stored cubin: verify names the key, a
 * lookup reports it and misses, and the next store heals the key. */
Test(cache, corrupt_record_on_disk)
{
    char *dir = tmp_dir();
    char *path = path_in(dir, "kernels.kiln");
    made m[3];
    kiln_cache *c = open_at(path, 0);
    for (int i = 0; i < 3; i++) {
        make(&m[i], i, 3000);
        store(c, &m[i], KILN_CACHE_ADDED);
    }
    kiln_cache_close(c);
    flip_in_file(path, &m[1]);

    reports seen = { 0 }, bad = { 0 };
    kiln_cache_options o = { .path = path, .on_corrupt = on_corrupt, .ctx = &seen };
    cr_assert_eq(kiln_cache_open(&o, &c), KILN_OK, "%s", kiln_last_error());
    size_t n, n_bad;
    cr_assert_eq(kiln_cache_verify(c, 0, collect_bad, &bad, &n, &n_bad), KILN_OK);
    cr_assert_eq(n, 3);
    cr_assert_eq(n_bad, 1);
    cr_assert_eq(bad.n, 1);
    cr_assert(strstr(bad.last, m[1].hex), "%s", bad.last);
    cr_assert(strstr(bad.last, "cubin checksum"), "%s", bad.last);

    expect_hit(c, &m[0], 0);
    expect_miss(c, &m[1]);
    cr_assert(strstr(kiln_last_error(), "passed over"), "%s", kiln_last_error());
    cr_assert_eq(seen.n, 1);
    cr_assert_eq(kiln_cache_corrupt_seen(c), 1);
    cr_assert(strstr(seen.last, m[1].hex), "%s", seen.last);
    cr_assert(strstr(seen.last, m[1].sig), "%s", seen.last);
    cr_assert(strstr(seen.last, path), "%s", seen.last);

    store(c, &m[1], KILN_CACHE_REPLACED);
    expect_hit(c, &m[1], 0);
    cr_assert_eq(entries(c, 0, NULL), 3);
    kiln_cache_close(c);
    for (int i = 0; i < 3; i++)
        unmake(&m[i]);
    free(path);
    tmp_remove(dir);
}

/* A shipped cache on read-only media: a 0444 file in a 0555 folder. It is
 * read without a lock file and never written, even by root, whom the modes
 * do not stop. */
Test(cache, shipped_cache_is_read_only)
{
    char *dir = tmp_dir();
    char *sub = path_in(dir, "ro");
    char *path = path_in(sub, "model.kiln");
    char *lock = path_in(sub, "model.kiln-lock");
    made m[4];
    kiln_cache *c = open_at(path, 0);
    for (int i = 0; i < 4; i++) {
        make(&m[i], i, 2500);
        if (i < 3)
            store(c, &m[i], KILN_CACHE_ADDED);
    }
    kiln_cache_close(c);
    cr_assert_eq(unlink(lock), 0);
    cr_assert_eq(chmod(path, 0444), 0);
    cr_assert_eq(chmod(sub, 0555), 0);
    struct stat before, after;
    cr_assert_eq(stat(path, &before), 0);
    size_t size0, size1;
    uint8_t *bytes0 = slurp(path, &size0);

    c = open_shipped(path);
    cr_assert_eq(kiln_cache_writable_layer(c), -1);
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < 3; i++)
            expect_hit(c, &m[i], 0);
    expect_miss(c, &m[3]);
    cr_assert_eq(entries(c, 0, NULL), 3);
    cr_assert_eq(kiln_cache_store(c, m[3].key, &m[3].rec, NULL), KILN_ERR_STATE);
    cr_assert(strstr(kiln_last_error(), "no writable cache"), "%s", kiln_last_error());
    kiln_cache_close(c);

    cr_assert_eq(stat(path, &after), 0);
    uint8_t *bytes1 = slurp(path, &size1);
    cr_assert_eq(size0, size1);
    cr_assert_arr_eq(bytes0, bytes1, size0);
    cr_assert_eq(before.st_mtim.tv_sec, after.st_mtim.tv_sec);
    cr_assert_eq(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
    cr_assert_not(exists(lock), "a lock file was made");
    cr_assert_eq(chmod(sub, 0755), 0);
    free(bytes0);
    free(bytes1);
    for (int i = 0; i < 4; i++)
        unmake(&m[i]);
    free(lock);
    free(path);
    free(sub);
    tmp_remove(dir);
}

/* Shipped layers come first; a corrupt shipped record falls through to the
 * writable cache's copy. */
Test(cache, layers_in_order)
{
    char *dir = tmp_dir();
    char *user = path_in(dir, "user.kiln"), *ship = path_in(dir, "ship.kiln");
    made m[6];
    uint8_t keys[3][KILN_CACHE_KEY_BYTES];
    kiln_cache *c = open_at(user, 0);
    for (int i = 0; i < 6; i++) {
        make(&m[i], i, 3000);
        if (i < 5)
            store(c, &m[i], KILN_CACHE_ADDED);
        if (i < 3)
            memcpy(keys[i], m[i].key, sizeof keys[i]);
    }
    cr_assert_eq(kiln_cache_export_keys(c, (const uint8_t(*)[KILN_CACHE_KEY_BYTES])keys, 3,
                                        ship, 0, NULL, NULL),
                 KILN_OK, "%s", kiln_last_error());
    kiln_cache_close(c);
    flip_in_file(ship, &m[1]);

    reports seen = { 0 };
    const char *shipped[] = { ship };
    kiln_cache_options o = {
        .shipped = shipped, .n_shipped = 1, .path = user, .on_corrupt = on_corrupt, .ctx = &seen
    };
    cr_assert_eq(kiln_cache_open(&o, &c), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_cache_n_layers(c), 2);
    cr_assert_eq(kiln_cache_writable_layer(c), 1);
    expect_hit(c, &m[0], 0);
    expect_hit(c, &m[2], 0);
    expect_hit(c, &m[3], 1);
    expect_hit(c, &m[1], 1);
    cr_assert_eq(seen.n, 1);
    cr_assert(strstr(seen.last, ship) && strstr(seen.last, m[1].hex), "%s", seen.last);
    expect_miss(c, &m[5]);
    cr_assert(strstr(kiln_last_error(), "2 cache files searched"), "%s", kiln_last_error());
    /* The shipped copy stays as it is: a store goes to the user cache. */
    store(c, &m[1], KILN_CACHE_PRESENT);
    kiln_cache_close(c);
    for (int i = 0; i < 6; i++)
        unmake(&m[i]);
    free(user);
    free(ship);
    tmp_remove(dir);
}

/* A 64 KiB map takes 2 MiB of kernels; another process's growth is adopted
 * by a process whose map is still small. */
Test(cache, map_grows)
{
    enum { N = 64, CUBIN = 32 << 10 };
    char *dir = tmp_dir();
    char *path = path_in(dir, "kernels.kiln");
    kiln_cache *c = open_at(path, 64 << 10);
    made first;
    make(&first, 0, 2000);
    store(c, &first, KILN_CACHE_ADDED);
    kiln_cache_stats s;
    cr_assert_eq(kiln_cache_stat(c, 0, &s), KILN_OK);
    cr_assert_lt(s.map_bytes, 1 << 20);
    kiln_cache_stats_free(&s);

    kt_seed();
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        kiln_cache_options o = { .path = path, .map_size = 64 << 10 };
        kiln_cache *cc;
        if (kiln_cache_open(&o, &cc))
            _exit(2);
        for (int i = 1; i <= N; i++) {
            made m;
            make(&m, i, CUBIN);
            if (kiln_cache_store(cc, m.key, &m.rec, NULL)) {
                fprintf(stderr, "child: %s\n", kiln_last_error());
                _exit(3);
            }
            unmake(&m);
        }
        kiln_cache_close(cc);
        _exit(0);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    for (int i = 1; i <= N; i++) {
        made m;
        make(&m, i, CUBIN);
        expect_hit(c, &m, 0);
        unmake(&m);
    }
    made last;
    make(&last, N + 1, CUBIN);
    store(c, &last, KILN_CACHE_ADDED);
    cr_assert_eq(kiln_cache_stat(c, 0, &s), KILN_OK);
    cr_assert_eq(s.entries, N + 2);
    cr_assert_geq(s.map_bytes, 2u << 20);
    cr_assert_geq(s.file_bytes, (uint64_t)N * CUBIN);
    kiln_cache_stats_free(&s);
    kiln_cache_close(c);

    /* And in one process alone. */
    char *path2 = path_in(dir, "alone.kiln");
    c = open_at(path2, 64 << 10);
    for (int i = 1; i <= N; i++) {
        made m;
        make(&m, i, CUBIN);
        store(c, &m, KILN_CACHE_ADDED);
        unmake(&m);
    }
    for (int i = 1; i <= N; i++) {
        made m;
        make(&m, i, CUBIN);
        expect_hit(c, &m, 0);
        unmake(&m);
    }
    cr_assert_eq(kiln_cache_stat(c, 0, &s), KILN_OK);
    cr_assert_geq(s.map_bytes, 2u << 20);
    kiln_cache_stats_free(&s);
    kiln_cache_close(c);
    unmake(&first);
    unmake(&last);
    free(path);
    free(path2);
    tmp_remove(dir);
}

/* ASan reserves terabytes of address space up front, so an address-space
 * limit only works in the plain build. */
#if !defined(__SANITIZE_ADDRESS__)
Test(cache, map_that_cannot_grow_is_an_error)
{
    char *dir = tmp_dir();
    char *path = path_in(dir, "kernels.kiln");
    kiln_cache *c = open_at(path, 64 << 10);
    FILE *statm = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    cr_assert_eq(fscanf(statm, "%lu", &pages), 1);
    fclose(statm);
    /* Room for a map of 16 MiB and the transaction's pages, not for 32 MiB. */
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_AS, &rl), 0);
    rl.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (24u << 20);
    cr_assert_eq(setrlimit(RLIMIT_AS, &rl), 0);
    kiln_status st = KILN_OK;
    int i;
    for (i = 0; i < 400 && !st; i++) {
        made m;
        make(&m, i, 256 << 10);
        st = kiln_cache_store(c, m.key, &m.rec, NULL);
        unmake(&m);
    }
    cr_assert_eq(st, KILN_ERR_CACHE, "after %d stores: %s", i, kiln_last_error());
    cr_assert(strstr(kiln_last_error(), "cannot grow"), "%s", kiln_last_error());
    made m;
    make(&m, 0, 256 << 10);
    cr_assert_eq(kiln_cache_store(c, m.key, &m.rec, NULL), KILN_ERR_STATE);
    cr_assert(strstr(kiln_last_error(), "open the cache again"), "%s", kiln_last_error());
    kiln_cache_hit h;
    cr_assert_eq(kiln_cache_lookup(c, m.key, "sm_90a", &h), KILN_ERR_STATE);
    unmake(&m);
    kiln_cache_close(c);
    free(path);
    tmp_remove(dir);
}
#endif

Test(cache, offline_miss_names_the_kernel)
{
    char *dir = tmp_dir();
    char *path = path_in(dir, "kernels.kiln");
    made m;
    make(&m, 3, 1000);
    kiln_cache *c = open_at(path, 0);
    cr_assert_eq(kiln_cache_offline_miss(c, m.sig, m.key), KILN_ERR_OFFLINE_MISS);
    const char *msg = kiln_last_error();
    cr_assert(strstr(msg, m.sig) && strstr(msg, m.hex) && strstr(msg, path), "%s", msg);
    kiln_cache_close(c);
    cr_assert_eq(kiln_cache_offline_miss(NULL, m.sig, m.key), KILN_ERR_OFFLINE_MISS);
    cr_assert(strstr(kiln_last_error(), "searched: none"), "%s", kiln_last_error());
    unmake(&m);
    free(path);
    tmp_remove(dir);
}

/* ------------------------------------------------------------ errors */

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

static void expect_open_fails(const kiln_cache_options *o, kiln_status want, const char *what)
{
    kiln_cache *c = NULL;
    cr_assert_eq(kiln_cache_open(o, &c), want, "%s", kiln_last_error());
    cr_assert_null(c);
    cr_assert(strstr(kiln_last_error(), what), "wanted \"%s\" in: %s", what, kiln_last_error());
}

Test(cache, open_errors)
{
    char *dir = tmp_dir();
    char *junk = path_in(dir, "junk.kiln"), *empty = path_in(dir, "empty.kiln");
    char *missing = path_in(dir, "missing.kiln"), *good = path_in(dir, "good.kiln");
    char *under_file = path_in(dir, "junk.kiln/sub/k.kiln");
    char text[8192];
    memset(text, 'x', sizeof text);
    write_file(junk, text, sizeof text);
    write_file(empty, "", 0);

    const char *shipped[1];
    kiln_cache_options o = { .shipped = shipped, .n_shipped = 1, .no_writable = 1, .strict = 1 };
    shipped[0] = junk;
    expect_open_fails(&o, KILN_ERR_CACHE, junk);
    expect_open_fails(&o, KILN_ERR_CACHE, "MDB_INVALID");
    shipped[0] = missing;
    expect_open_fails(&o, KILN_ERR_IO, missing);
    shipped[0] = empty;
    expect_open_fails(&o, KILN_ERR_CACHE, "empty file");
    shipped[0] = dir;
    expect_open_fails(&o, KILN_ERR_IO, "not a regular file");

    /* A broken shipped layer fails the open even with a good writable one. */
    shipped[0] = missing;
    o.no_writable = 0;
    o.path = good;
    expect_open_fails(&o, KILN_ERR_IO, missing);

    /* Not an LMDB file as the writable cache: refused, and left as it was. */
    kiln_cache_options w = { .path = junk };
    expect_open_fails(&w, KILN_ERR_CACHE, junk);
    size_t size;
    uint8_t *after = slurp(junk, &size);
    cr_assert_eq(size, sizeof text);
    cr_assert_arr_eq(after, text, size);
    free(after);

    w.path = under_file;
    expect_open_fails(&w, KILN_ERR_IO, "cannot create directory");

    /* LMDB forbids a second handle on one file in one process. */
    kiln_cache *c = open_at(good, 0);
    w.path = good;
    expect_open_fails(&w, KILN_ERR_STATE, "open already");
    kiln_cache_close(c);
    c = open_at(good, 0);
    kiln_cache_close(c);

    kiln_cache_options bad = { .n_shipped = -1 };
    expect_open_fails(&bad, KILN_ERR_INVALID_ARG, "bad options");
    bad = (kiln_cache_options){ .n_shipped = 1 };
    expect_open_fails(&bad, KILN_ERR_INVALID_ARG, "bad options");

    free(junk);
    free(empty);
    free(missing);
    free(good);
    free(under_file);
    tmp_remove(dir);
}

/* A FIFO named as a shipped or a writable cache is refused at once, by
 * name: kiln never waits for a writer that will not come. */
Test(cache, a_fifo_is_not_a_cache, .timeout = 20)
{
    char *dir = tmp_dir();
    char *fifo = path_in(dir, "fifo.kiln");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    const char *shipped[1] = { fifo };
    kiln_cache_options o = { .shipped = shipped, .n_shipped = 1, .no_writable = 1, .strict = 1 };
    expect_open_fails(&o, KILN_ERR_IO, "fifo.kiln: not a regular file");
    kiln_cache_options w = { .path = fifo, .strict = 1 };
    expect_open_fails(&w, KILN_ERR_IO, "fifo.kiln: not a regular file");
    free(fifo);
    tmp_remove(dir);
}

Test(cache, operations_need_a_writable_cache)
{
    char *dir = tmp_dir();
    char *path = path_in(dir, "k.kiln");
    kiln_cache *c = open_at(path, 0);
    kiln_cache_close(c);
    c = open_shipped(path);
    made m;
    make(&m, 1, 1000);
    kiln_cache_gc_options g = { .corrupt = 1 };
    cr_assert_eq(kiln_cache_store(c, m.key, &m.rec, NULL), KILN_ERR_STATE);
    cr_assert_eq(kiln_cache_gc(c, &g, NULL, NULL), KILN_ERR_STATE);
    cr_assert_eq(kiln_cache_rm(c, "ab", NULL), KILN_ERR_STATE);
    cr_assert_eq(kiln_cache_rm_all(c, NULL), KILN_ERR_STATE);
    cr_assert_eq(kiln_cache_merge(c, path, NULL, NULL, NULL), KILN_ERR_STATE);
    cr_assert(strstr(kiln_last_error(), "merge: no writable cache"), "%s", kiln_last_error());
    cr_assert_eq(kiln_cache_verify(c, 1, NULL, NULL, NULL, NULL), KILN_ERR_INVALID_ARG);
    kiln_cache_stats s;
    cr_assert_eq(kiln_cache_stat(c, -1, &s), KILN_ERR_INVALID_ARG);
    kiln_cache_close(c);

    /* A cache of no layers at all misses everything. */
    kiln_cache_options none = { .no_writable = 1 };
    cr_assert_eq(kiln_cache_open(&none, &c), KILN_OK);
    expect_miss(c, &m);
    kiln_cache_close(c);
    unmake(&m);
    free(path);
    tmp_remove(dir);
}

/* ------------------------------------------------------- maintenance */

typedef struct seen_keys {
    int n;
    uint8_t keys[64][KILN_CACHE_KEY_BYTES];
} seen_keys;

static kiln_status collect_keys(void *ctx, const kiln_cache_entry *e)
{
    seen_keys *s = ctx;
    cr_assert_eq(e->status, KILN_OK, "%s", e->problem);
    cr_assert_lt(s->n, 64);
    memcpy(s->keys[s->n++], e->key, KILN_CACHE_KEY_BYTES);
    return KILN_OK;
}

static kiln_status stop_at_second(void *ctx, const kiln_cache_entry *e)
{
    (void)e;
    return ++*(int *)ctx == 2 ? KILN_ERR_STATE : KILN_OK;
}

Test(cache, foreach_and_stat)
{
    char *dir = tmp_dir();
    char *path = path_in(dir, "k.kiln");
    kiln_cache *c = open_at(path, 0);
    made m[6];
    uint64_t value_bytes = 0;
    for (int i = 0; i < 6; i++) {
        make(&m[i], i, 1000 + 100 * (size_t)i);
        m[i].rec.target = i < 4 ? "sm_90a" : "sm_89";
        kt_elf_header(m[i].cubin, i < 4 ? 90 : 89);
        m[i].rec.kind = i % 2 ? "wgmma" : "simt";
        m[i].rec.created = 1000 + (uint64_t)i;
        store(c, &m[i], KILN_CACHE_ADDED);
        uint8_t *enc;
        size_t size;
        cr_assert_eq(kiln_cache_record_encode(&m[i].rec, m[i].key, &enc, &size), KILN_OK);
        value_bytes += size;
        free(enc);
    }
    seen_keys s = { 0 };
    cr_assert_eq(kiln_cache_foreach(c, 0, collect_keys, &s), KILN_OK);
    cr_assert_eq(s.n, 6);
    for (int i = 1; i < s.n; i++)
        cr_assert_lt(memcmp(s.keys[i - 1], s.keys[i], KILN_CACHE_KEY_BYTES), 0, "key order");
    int calls = 0;
    cr_assert_eq(kiln_cache_foreach(c, 0, stop_at_second, &calls), KILN_ERR_STATE);
    cr_assert_eq(calls, 2);

    kiln_cache_stats st;
    cr_assert_eq(kiln_cache_stat(c, 0, &st), KILN_OK);
    cr_assert_eq(st.entries, 6);
    cr_assert_eq(st.bad, 0);
    cr_assert_eq(st.bytes, value_bytes);
    cr_assert_eq(st.cubin_bytes, 6 * 1000 + 100 * 15);
    cr_assert_eq(st.oldest, 1000);
    cr_assert_eq(st.newest, 1005);
    cr_assert_gt(st.file_bytes, st.bytes);
    cr_assert_eq(st.n_targets, 2);
    cr_assert_eq(st.n_kinds, 2);
    for (int i = 0; i < st.n_targets; i++)
        cr_assert_eq(st.by_target[i].entries, strcmp(st.by_target[i].name, "sm_90a") ? 2u : 4u,
                     "%s", st.by_target[i].name);
    for (int i = 0; i < st.n_kinds; i++) {
        cr_assert(!strcmp(st.by_kind[i].name, "simt") || !strcmp(st.by_kind[i].name, "wgmma"));
        cr_assert_eq(st.by_kind[i].entries, 3);
    }
    kiln_cache_stats_free(&st);
    kiln_cache_stats_free(NULL);
    kiln_cache_close(c);
    for (int i = 0; i < 6; i++)
        unmake(&m[i]);
    free(path);
    tmp_remove(dir);
}

/* Entries no kiln wrote: a key of another size and a value that is not a
 * record. Iteration reports them, stat counts them, gc removes them. */
Test(cache, foreign_entries)
{
    char *dir = tmp_dir();
    char *path = path_in(dir, "k.kiln");
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_env_create(&env), 0);
    cr_assert_eq(mdb_env_open(env, path, MDB_NOSUBDIR, 0644), 0);
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
    MDB_val k = { 4, "abcd" }, v = { 5, "hello" };
    cr_assert_eq(mdb_put(txn, dbi, &k, &v, 0), 0);
    uint8_t key16[KILN_CACHE_KEY_BYTES] = { 0xee };
    k = (MDB_val){ sizeof key16, key16 };
    cr_assert_eq(mdb_put(txn, dbi, &k, &v, 0), 0);
    cr_assert_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);

    kiln_cache *c = open_at(path, 0);
    made m;
    make(&m, 1, 1000);
    store(c, &m, KILN_CACHE_ADDED);
    reports bad = { 0 };
    size_t n, n_bad;
    cr_assert_eq(kiln_cache_verify(c, 0, collect_bad, &bad, &n, &n_bad), KILN_OK);
    cr_assert_eq(n, 3);
    cr_assert_eq(n_bad, 2);
    kiln_cache_stats st;
    cr_assert_eq(kiln_cache_stat(c, 0, &st), KILN_OK);
    cr_assert_eq(st.bad, 2);
    cr_assert_eq(st.n_targets, 1);
    kiln_cache_stats_free(&st);
    /* The record's own key is looked up; the stranger of 16 bytes is corrupt. */
    expect_hit(c, &m, 0);
    kiln_cache_hit h;
    cr_assert_eq(kiln_cache_lookup(c, key16, "sm_90a", &h), KILN_ERR_NOT_FOUND);
    cr_assert(strstr(kiln_last_error(), "shorter than its header"), "%s", kiln_last_error());

    size_t removed;
    uint64_t bytes;
    kiln_cache_gc_options g = { .corrupt = 1 };
    cr_assert_eq(kiln_cache_gc(c, &g, &removed, &bytes), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(removed, 2);
    cr_assert_eq(bytes, 10);
    cr_assert_eq(entries(c, 0, NULL), 1);
    kiln_cache_close(c);
    unmake(&m);
    free(path);
    tmp_remove(dir);
}

static kiln_cache_record *aged(made *m, const char *compiler, uint64_t age_days)
{
    m->rec.compiler = compiler;
    m->rec.created = (uint64_t)time(NULL) - age_days * 86400;
    return &m->rec;
}

Test(cache, gc)
{
    char *dir = tmp_dir();
    char *path = path_in(dir, "k.kiln");
    kiln_cache *c = open_at(path, 0);
    made m[8];
    for (int i = 0; i < 8; i++) {
        make(&m[i], i, 1500);
        aged(&m[i], i % 2 ? "nvrtc 12.4" : "nvrtc 13.0", i < 4 ? 40 : 1);
        store(c, &m[i], KILN_CACHE_ADDED);
    }
    size_t removed;
    uint64_t bytes;
    kiln_cache_gc_options keep_all = { 0 };
    cr_assert_eq(kiln_cache_gc(c, &keep_all, &removed, &bytes), KILN_OK);
    cr_assert_eq(removed, 0);
    cr_assert_eq(bytes, 0);

    kiln_cache_gc_options old = { .max_age_s = 30 * 86400 };
    cr_assert_eq(kiln_cache_gc(c, &old, &removed, &bytes), KILN_OK);
    cr_assert_eq(removed, 4);
    cr_assert_gt(bytes, 4 * 1500);
    for (int i = 0; i < 8; i++)
        if (i < 4)
            expect_miss(c, &m[i]);
        else
            expect_hit(c, &m[i], 0);

    kiln_cache_gc_options compiler = { .compiler = "nvrtc 13.0" };
    cr_assert_eq(kiln_cache_gc(c, &compiler, &removed, NULL), KILN_OK);
    cr_assert_eq(removed, 2);
    cr_assert_eq(entries(c, 0, NULL), 2);
    expect_hit(c, &m[4], 0);
    expect_hit(c, &m[6], 0);
    kiln_cache_close(c);
    for (int i = 0; i < 8; i++)
        unmake(&m[i]);
    free(path);
    tmp_remove(dir);
}

Test(cache, rm)
{
    enum { N = 40 };
    char *dir = tmp_dir();
    char *path = path_in(dir, "k.kiln");
    kiln_cache *c = open_at(path, 0);
    made m[N];
    for (int i = 0; i < N; i++) {
        make(&m[i], i, 1000);
        store(c, &m[i], KILN_CACHE_ADDED);
    }
    size_t removed;
    /* One hex digit: every key starting with it, and no other. */
    char prefix[2] = { m[0].hex[0], 0 };
    int expected = 0;
    for (int i = 0; i < N; i++)
        expected += m[i].hex[0] == prefix[0];
    cr_assert_eq(kiln_cache_rm(c, prefix, &removed), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(removed, (size_t)expected);
    for (int i = 0; i < N; i++)
        if (m[i].hex[0] == prefix[0])
            expect_miss(c, &m[i]);
        else
            expect_hit(c, &m[i], 0);
    cr_assert_eq(kiln_cache_rm(c, prefix, &removed), KILN_OK);
    cr_assert_eq(removed, 0);

    /* A whole key, in capitals; then an odd-length prefix of another. */
    int a = -1, b = -1;
    for (int i = 0; i < N; i++) {
        if (m[i].hex[0] == prefix[0])
            continue;
        if (a < 0)
            a = i;
        else if (b < 0)
            b = i;
    }
    char upper[KILN_CACHE_KEY_HEX];
    for (int i = 0; i < KILN_CACHE_KEY_HEX; i++)
        upper[i] = (char)(m[a].hex[i] >= 'a' ? m[a].hex[i] - 32 : m[a].hex[i]);
    cr_assert_eq(kiln_cache_rm(c, upper, &removed), KILN_OK);
    cr_assert_eq(removed, 1);
    expect_miss(c, &m[a]);
    char odd[6];
    snprintf(odd, sizeof odd, "%.5s", m[b].hex);
    int sharing = 0;
    for (int i = 0; i < N; i++)
        sharing += i != a && !strncmp(m[i].hex, odd, 5);
    cr_assert_eq(kiln_cache_rm(c, odd, &removed), KILN_OK);
    cr_assert_eq(removed, (size_t)sharing);
    expect_miss(c, &m[b]);
    expected += 1 + sharing;

    cr_assert_eq(kiln_cache_rm(c, "xyz", &removed), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "cache key \"xyz\": 'x' is not a hex digit"), "%s",
              kiln_last_error());
    cr_assert_eq(kiln_cache_rm(c, "", &removed), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_cache_rm_all(c, &removed), KILN_OK);
    cr_assert_eq(removed, (size_t)(N - expected));
    cr_assert_eq(entries(c, 0, NULL), 0);
    /* Still usable. */
    store(c, &m[0], KILN_CACHE_ADDED);
    expect_hit(c, &m[0], 0);
    kiln_cache_close(c);
    for (int i = 0; i < N; i++)
        unmake(&m[i]);
    free(path);
    tmp_remove(dir);
}

Test(cache, merge)
{
    char *dir = tmp_dir();
    char *a = path_in(dir, "a.kiln"), *b = path_in(dir, "b.kiln");
    made m[15];
    for (int i = 0; i < 15; i++)
        make(&m[i], i, 3000);
    /* b: 5..14, with 14 corrupt. a: 0..9, with 7 corrupt. */
    kiln_cache *c = open_at(b, 0);
    for (int i = 5; i < 15; i++)
        store(c, &m[i], KILN_CACHE_ADDED);
    kiln_cache_close(c);
    flip_in_file(b, &m[14]);
    c = open_at(a, 64 << 10);
    for (int i = 0; i < 10; i++)
        store(c, &m[i], KILN_CACHE_ADDED);
    kiln_cache_close(c);
    flip_in_file(a, &m[7]);

    c = open_at(a, 0);
    reports bad = { 0 };
    kiln_cache_merge_result r;
    cr_assert_eq(kiln_cache_merge(c, b, collect_bad, &bad, &r), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(r.added, 4);    /* 10..13 */
    cr_assert_eq(r.present, 4);  /* 5, 6, 8, 9 */
    cr_assert_eq(r.replaced, 1); /* 7 */
    cr_assert_eq(r.bad, 1);      /* 14 */
    cr_assert_eq(bad.n, 1);
    cr_assert(strstr(bad.last, m[14].hex) && strstr(bad.last, b), "%s", bad.last);
    cr_assert_eq(entries(c, 0, NULL), 14);
    for (int i = 0; i < 14; i++)
        expect_hit(c, &m[i], 0);
    expect_miss(c, &m[14]);

    /* Again: nothing new. */
    cr_assert_eq(kiln_cache_merge(c, b, NULL, NULL, &r), KILN_OK);
    cr_assert_eq(r.added, 0);
    cr_assert_eq(r.present, 9);

    char *missing = path_in(dir, "missing.kiln");
    cr_assert_eq(kiln_cache_merge(c, missing, NULL, NULL, &r), KILN_ERR_IO);
    cr_assert(strstr(kiln_last_error(), missing), "%s", kiln_last_error());
    cr_assert_eq(kiln_cache_merge(c, a, NULL, NULL, &r), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "the writable cache itself"), "%s", kiln_last_error());
    kiln_cache_close(c);
    for (int i = 0; i < 15; i++)
        unmake(&m[i]);
    free(missing);
    free(a);
    free(b);
    tmp_remove(dir);
}

static int count_dir(const char *dir)
{
    int n = 0;
    char *cmd;
    cr_assert_gt(asprintf(&cmd, "ls -A %s | wc -l", dir), 0);
    FILE *p = popen(cmd, "r");
    cr_assert_eq(fscanf(p, "%d", &n), 1);
    pclose(p);
    free(cmd);
    return n;
}

Test(cache, export)
{
    enum { N = 20, PICK = 5 };
    char *dir = tmp_dir();
    char *user = path_in(dir, "user.kiln"), *ship = path_in(dir, "out/model.kiln");
    char *outdir = path_in(dir, "out");
    cr_assert_eq(mkdir(outdir, 0755), 0);
    made m[N + 1];
    uint8_t keys[PICK + 1][KILN_CACHE_KEY_BYTES];
    kiln_cache *c = open_at(user, 0);
    for (int i = 0; i <= N; i++) {
        make(&m[i], i, 4000);
        if (i < N)
            store(c, &m[i], KILN_CACHE_ADDED);
    }
    for (int i = 0; i < PICK; i++)
        memcpy(keys[i], m[3 * i].key, KILN_CACHE_KEY_BYTES);
    memcpy(keys[PICK], m[0].key, KILN_CACHE_KEY_BYTES); /* twice is once */
    const uint8_t(*k)[KILN_CACHE_KEY_BYTES] = (const uint8_t(*)[KILN_CACHE_KEY_BYTES])keys;
    cr_assert_eq(kiln_cache_export_keys(c, k, PICK + 1, ship, 0, NULL, NULL), KILN_OK, "%s",
                 kiln_last_error());

    kiln_cache *s = open_shipped(ship);
    seen_keys got = { 0 };
    cr_assert_eq(kiln_cache_foreach(s, 0, collect_keys, &got), KILN_OK);
    cr_assert_eq(got.n, PICK);
    for (int i = 0; i < PICK; i++)
        expect_hit(s, &m[3 * i], 0);
    expect_miss(s, &m[1]);
    kiln_cache_close(s);
    struct stat su, ss;
    cr_assert_eq(stat(user, &su), 0);
    cr_assert_eq(stat(ship, &ss), 0);
    cr_assert_lt(ss.st_size, su.st_size);
    cr_assert_eq(ss.st_mode & 0777, 0644);
    cr_assert_eq(count_dir(outdir), 1, "no lock or temporary file beside the output");

    /* An existing file stays unless overwriting is asked for. */
    size_t size0, size1;
    uint8_t *before = slurp(ship, &size0);
    cr_assert_eq(kiln_cache_export_keys(c, k, 1, ship, 0, NULL, NULL), KILN_ERR_IO);
    cr_assert(strstr(kiln_last_error(), "exists"), "%s", kiln_last_error());
    uint8_t *after = slurp(ship, &size1);
    cr_assert_eq(size0, size1);
    cr_assert_arr_eq(before, after, size0);
    cr_assert_eq(kiln_cache_export_keys(c, k, 1, ship, 1, NULL, NULL), KILN_OK, "%s",
                 kiln_last_error());
    s = open_shipped(ship);
    cr_assert_eq(entries(s, 0, NULL), 1);
    kiln_cache_close(s);

    /* A key no layer holds: an error naming it, and nothing left behind. */
    char *other = path_in(outdir, "other.kiln");
    memcpy(keys[1], m[N].key, KILN_CACHE_KEY_BYTES);
    cr_assert_eq(kiln_cache_export_keys(c, k, 2, other, 0, NULL, NULL), KILN_ERR_NOT_FOUND);
    cr_assert(strstr(kiln_last_error(), m[N].hex), "%s", kiln_last_error());
    cr_assert_not(exists(other));
    cr_assert_eq(count_dir(outdir), 1);

    char *nowhere = path_in(dir, "no/such/dir/x.kiln");
    cr_assert_eq(kiln_cache_export_keys(c, k, 1, nowhere, 0, NULL, NULL), KILN_ERR_IO);
    cr_assert(strstr(kiln_last_error(), "cannot create a file beside it"), "%s",
              kiln_last_error());
    kiln_cache_close(c);
    free(before);
    free(after);
    for (int i = 0; i <= N; i++)
        unmake(&m[i]);
    free(nowhere);
    free(other);
    free(outdir);
    free(user);
    free(ship);
    tmp_remove(dir);
}

/* Salvage src into dst: its 3 records kept, and its manifest when want is
 * one (then read back as want), else none. */
static void salvage_3(const char *src, const char *dst, const char *want)
{
    kiln_cache_salvage_result r;
    cr_assert_eq(kiln_cache_salvage(src, dst, 1, &r), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(r.records, 3);
    cr_assert_eq(r.manifest, want != NULL);
    if (!want)
        cr_assert_geq(r.bad, 1, "the damaged manifest is counted bad");
    kiln_cache *s = open_shipped(dst);
    const char *json;
    cr_assert_eq(kiln_cache_manifest(s, 0, &json), want ? KILN_OK : KILN_ERR_NOT_FOUND, "%s",
                 kiln_last_error());
    if (want)
        cr_assert_str_eq(json, want);
    kiln_cache_close(s);
}

/* A manifest rides beside the records: read back as written, passed over
 * by iteration, verify and merge, kept by salvage (in a page of its own or
 * on overflow pages) unless damaged, and a changed byte of it is damage. */
Test(cache, manifest)
{
    char *dir = tmp_dir();
    char *user = path_in(dir, "user.kiln"), *ship = path_in(dir, "ship.kiln");
    made m[3];
    uint8_t keys[3][KILN_CACHE_KEY_BYTES];
    kiln_cache *c = open_at(user, 0);
    for (int i = 0; i < 3; i++) {
        make(&m[i], i, 2000);
        store(c, &m[i], KILN_CACHE_ADDED);
        memcpy(keys[i], m[i].key, KILN_CACHE_KEY_BYTES);
    }
    const char *json;
    cr_assert_eq(kiln_cache_manifest(c, 0, &json), KILN_ERR_NOT_FOUND);
    const char *text = "{\"model\":{\"name\":\"MANIFEST-MARKER\"}}";
    cr_assert_eq(kiln_cache_export_keys(c, (const uint8_t(*)[KILN_CACHE_KEY_BYTES])keys, 3, ship,
                                        0, text, NULL),
                 KILN_OK, "%s", kiln_last_error());
    kiln_cache_close(c);

    kiln_cache *s = open_shipped(ship);
    cr_assert_eq(kiln_cache_manifest(s, 0, &json), KILN_OK, "%s", kiln_last_error());
    cr_assert_str_eq(json, text);
    size_t bad = 1;
    cr_assert_eq(entries(s, 0, &bad), 3);
    cr_assert_eq(bad, 0);
    cr_assert_eq(kiln_cache_manifest(s, 1, &json), KILN_ERR_INVALID_ARG);
    kiln_cache_close(s);

    /* salvaged: the records and the manifest */
    char *saved = path_in(dir, "saved.kiln");
    salvage_3(ship, saved, text);

    /* merged into a writable cache: the records, not the manifest */
    c = open_at(user, 0);
    kiln_cache_merge_result mr;
    cr_assert_eq(kiln_cache_merge(c, ship, NULL, NULL, &mr), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(mr.present, 3);
    cr_assert_eq(mr.bad + mr.other, 0);
    cr_assert_eq(kiln_cache_manifest(c, 0, &json), KILN_ERR_NOT_FOUND);
    kiln_cache_close(c);

    size_t size;
    uint8_t *bytes = slurp(ship, &size);
    uint8_t *at = memmem(bytes, size, "MANIFEST-MARKER", 15);
    cr_assert_not_null(at);
    at[0] ^= 0x20;
    FILE *f = fopen(ship, "r+b");
    cr_assert_not_null(f);
    cr_assert_eq(fseek(f, at - bytes, SEEK_SET), 0);
    cr_assert_eq(fwrite(at, 1, 1, f), 1);
    fclose(f);
    s = open_shipped(ship);
    cr_assert_eq(kiln_cache_manifest(s, 0, &json), KILN_ERR_CACHE);
    cr_assert(strstr(kiln_last_error(), "the manifest is damaged (checksum)"), "%s",
              kiln_last_error());
    kiln_cache_close(s);
    free(bytes);
    /* a damaged manifest is left out by salvage, the records kept */
    salvage_3(ship, saved, NULL);

    /* a manifest larger than a page lies on overflow pages: found there */
    size_t big_n = 3 * 4096;
    char *big = malloc(big_n + 64);
    cr_assert_not_null(big);
    int at0 = snprintf(big, big_n + 64, "{\"model\":{\"name\":\"");
    memset(big + at0, 'x', big_n);
    memcpy(big + at0 + big_n, "\"}}", 4);
    c = open_at(user, 0);
    cr_assert_eq(kiln_cache_export_keys(c, (const uint8_t(*)[KILN_CACHE_KEY_BYTES])keys, 3, ship,
                                        1, big, NULL),
                 KILN_OK, "%s", kiln_last_error());
    kiln_cache_close(c);
    salvage_3(ship, saved, big);
    free(big);
    free(saved);
    for (int i = 0; i < 3; i++)
        unmake(&m[i]);
    free(user);
    free(ship);
    tmp_remove(dir);
}
