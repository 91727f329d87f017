/* cache/lmdbfile.c and what the cache makes of a damaged file. A real cache
 * file, written through the cache API, is damaged by tests/cache/damage.h
 * in every way it lists (about 20,000: cuts at every page boundary, a byte
 * changed at every offset of the meta, branch and leaf pages, the numbers
 * LMDB follows, 1,000 offsets of the overflow runs), and for each the
 * suite asserts: no signal and no hang; a damaged file is reported by path
 * and treated as absent; what is served is byte for byte what was stored,
 * and when it is not all of it, verify says so; salvage finds every record
 * whose own bytes are whole; a file that passes survives kiln's writes with
 * nothing intact lost. The same files go through the kiln command: exit 1,
 * a message naming the file, the file left as it was. */
#include "cache/cache_impl.h"
#include "clirun.h"
#include "tests/cache/damage.h"
#include "tests/cache/fake_cubin.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <lmdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---------------------------------------------------------- fixtures */

static char *dir;

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* On a RAM file system where there is one: the suite commits thousands of
 * LMDB transactions, each with an fsync. */
static void setup(void)
{
    dir = strdup(access("/dev/shm", W_OK) ? "/tmp/kiln-lmdbfile-XXXXXX" : "/dev/shm/kiln-lmdbfile-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    free(dir);
}

TestSuite(lmdbfile, .init = setup, .fini = teardown, .timeout = 900);

static char *path_in(const char *name)
{
    char *p;
    cr_assert_gt(asprintf(&p, "%s/%s", dir, name), 0);
    return p;
}

static uint8_t *slurp(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)n + 1);
    cr_assert_eq(fread(p, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return p;
}

static void spill(const char *path, const uint8_t *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

/* A record as the compiler driver stores one: small ones live in the leaf
 * pages, large ones in overflow runs. enc is the value as stored. */
typedef struct made {
    kiln_cache_record rec;
    uint8_t key[KILN_CACHE_KEY_BYTES];
    char sig[160], entry[32];
    uint8_t *cubin, *enc;
    size_t size;
} made;

enum { N_SMALL = 9, N_LARGE = 5, N_MADE = N_SMALL + N_LARGE + 3 };

/* The page size of the files this suite writes (LMDB takes the system's). */
#define L_PSIZE ((size_t)sysconf(_SC_PAGESIZE))

static void make(made *m, int i, size_t cubin_size)
{
    kt_rng r = kt_rng_new(5000 + (uint64_t)i);
    char source[64];
    snprintf(m->sig, sizeof m->sig,
             "linear backend=simt variant=default format=q4_k n=%d k=4096 epilogue=none out=bf16 "
             "target=sm_90a",
             64 * (i + 1));
    snprintf(m->entry, sizeof m->entry, "kiln_linear_%d", i);
    snprintf(source, sizeof source, "damaged kernel %d", i);
    cr_assert_eq(kiln_cache_key("sm_90a", "-arch=sm_90a", source, strlen(source), m->key), KILN_OK);
    m->cubin = malloc(cubin_size);
    for (size_t j = 0; j < cubin_size; j++)
        m->cubin[j] = (uint8_t)kt_next(&r);
    kt_elf_header(m->cubin, 90);
    m->rec = (kiln_cache_record){
        .compiler = "nvrtc 13.0", .entry = m->entry, .target = "sm_90a", .kind = "simt",
        .signature = m->sig, .threads = 128, .created = 1700000000 + (uint64_t)i,
        .cubin = m->cubin, .cubin_size = cubin_size,
    };
    cr_assert_eq(kiln_cache_record_encode(&m->rec, m->key, &m->enc, &m->size), KILN_OK);
}

static made made_v[N_MADE];
static int n_kept; /* made_v[0, n_kept) are in the file; the rest were removed */

/* The file: records stored one transaction each, three of them removed
 * again, so the free list holds pages and the records' tree has a branch. */
static void build(const char *path)
{
    for (int i = 0; i < N_MADE; i++)
        make(&made_v[i], i, i < N_SMALL ? 300 + 40 * (size_t)i : 2500 + 1500 * (size_t)i);
    kiln_cache_options o = { .path = path, .strict = 1 };
    kiln_cache *c;
    cr_assert_eq(kiln_cache_open(&o, &c), KILN_OK, "%s", kiln_last_error());
    for (int i = 0; i < N_MADE; i++)
        cr_assert_eq(kiln_cache_store(c, made_v[i].key, &made_v[i].rec, NULL), KILN_OK, "%s",
                     kiln_last_error());
    n_kept = N_SMALL + N_LARGE;
    for (int i = n_kept; i < N_MADE; i++) {
        char hex[KILN_CACHE_KEY_HEX];
        kiln_cache_key_hex(made_v[i].key, hex);
        cr_assert_eq(kiln_cache_rm(c, hex, NULL), KILN_OK, "%s", kiln_last_error());
    }
    kiln_cache_close(c);
    char lock[4096];
    snprintf(lock, sizeof lock, "%s-lock", path);
    unlink(lock);
}

static const made *made_of(const uint8_t *key)
{
    for (int i = 0; i < n_kept; i++)
        if (!memcmp(made_v[i].key, key, KILN_CACHE_KEY_BYTES))
            return &made_v[i];
    return NULL;
}

/* ---------------------------------------------------------- one damage */

typedef enum outcome {
    OUT_CLEAN,       /* passes, serves every record as stored */
    OUT_BAD_RECORDS, /* passes; verify names bad records */
    OUT_DAMAGED,     /* reported damaged by path and left out */
    OUT_SILENT,      /* serves less or other than stored, and verify is silent */
    OUT_WRONG,       /* serves bytes other than stored */
    OUT_FAILED,      /* anything else the case checks */
    OUT_COUNT
} outcome;

static const char *const outcome_names[OUT_COUNT] = {
    "changed nothing served", "bad records named", "damaged file named", "SILENT", "WRONG BYTES",
    "FAILED",
};

typedef struct shared_case {
    volatile uint8_t started, done, outcome;
    char why[200];
} shared_case;

static outcome failed(char *why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static outcome failed(char *why, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof((shared_case *)0)->why, fmt, ap);
    va_end(ap);
    return OUT_FAILED;
}

static void count_corrupt(void *ctx, const char *message)
{
    (void)message;
    ++*(int *)ctx;
}

/* Serve every kept record from c (one layer) and compare: the number of
 * those missing, or OUT_WRONG. */
static int serve_all(kiln_cache *c, int *missing, const kt_damage *d, char *why)
{
    *missing = 0;
    for (int i = 0; i < n_kept; i++) {
        kiln_cache_hit h;
        kiln_status st = kiln_cache_lookup(c, made_v[i].key, "sm_90a", &h);
        if (st == KILN_ERR_NOT_FOUND) {
            ++*missing;
            continue;
        }
        if (st)
            return failed(why, "lookup %d: %s", i, kiln_last_error());
        int same = h.size == made_v[i].size && !memcmp(h.blob, made_v[i].enc, h.size);
        kiln_cache_hit_release(&h);
        if (!same) {
            snprintf(why, sizeof((shared_case *)0)->why, "record %d served changed (%s)", i,
                     d->what);
            return OUT_WRONG;
        }
    }
    return OUT_CLEAN;
}

typedef struct extra_ctx {
    int extra;
} extra_ctx;

/* An intact record of a key that was not stored. */
static kiln_status count_extra(void *ctx, const kiln_cache_entry *e)
{
    if (e->status == KILN_OK && !made_of(e->key))
        ((extra_ctx *)ctx)->extra++;
    return KILN_OK;
}

/* Salvage finds every record whose own bytes d left whole. */
static outcome salvage_check(const char *path, const char *scratch, const kt_layout *L,
                             const kt_damage *d, char *why)
{
    kiln_cache_salvage_result r;
    if (kiln_cache_salvage(path, scratch, 1, &r))
        return failed(why, "salvage: %s", kiln_last_error());
    kiln_cache_options o = { .shipped = &scratch, .n_shipped = 1, .no_writable = 1, .strict = 1 };
    kiln_cache *c;
    if (kiln_cache_open(&o, &c))
        return failed(why, "salvaged file: %s", kiln_last_error());
    outcome out = OUT_CLEAN;
    for (size_t i = 0; i < L->n_records && out == OUT_CLEAN; i++) {
        const made *m = made_of(L->records[i].key);
        if (!m || kt_damage_hits(d, &L->records[i]))
            continue;
        kiln_cache_hit h;
        if (kiln_cache_lookup(c, m->key, "sm_90a", &h)) {
            out = failed(why, "salvage lost record %s: %s", m->entry, kiln_last_error());
            continue;
        }
        if (h.size != m->size || memcmp(h.blob, m->enc, h.size))
            out = failed(why, "salvage changed record %s", m->entry);
        kiln_cache_hit_release(&h);
    }
    kiln_cache_close(c);
    unlink(scratch);
    return out;
}

/* A whole file, without the suite's assertions (a worker process makes no
 * assertion of its own: it reports). NULL when it cannot be read. */
static uint8_t *read_all(const char *path, size_t *size)
{
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    uint8_t *p = malloc((size_t)st.st_size + 1);
    if (p && pread(fd, p, (size_t)st.st_size, 0) != st.st_size) {
        free(p);
        p = NULL;
    }
    close(fd);
    *size = (size_t)st.st_size;
    return p;
}

/* kiln's writes on a copy of the damaged file: a damaged file is neither
 * written nor changed; one that passed survives gc --corrupt, a store and
 * an rm with its structure sound and every record it served still served. */
static outcome write_check(const char *path, const char *scratch, char *why)
{
    size_t size;
    uint8_t *before = read_all(path, &size);
    int fd = open(scratch, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (!before || fd < 0 || write(fd, before, size) != (ssize_t)size) {
        free(before);
        if (fd >= 0)
            close(fd);
        return failed(why, "copy to %s: %s", scratch, strerror(errno));
    }
    close(fd);
    kiln_cache_options o = { .path = scratch };
    kiln_cache *c;
    outcome out = OUT_CLEAN;
    if (kiln_cache_open(&o, &c)) {
        free(before);
        return failed(why, "open to write: %s", kiln_last_error());
    }
    made *fresh = &made_v[N_MADE - 1];
    kiln_cache_gc_options g = { .corrupt = 1 };
    int served[N_MADE] = { 0 };
    for (int i = 0; i < n_kept; i++) {
        kiln_cache_hit h;
        if (!kiln_cache_lookup(c, made_v[i].key, "sm_90a", &h)) {
            served[i] = 1;
            kiln_cache_hit_release(&h);
        }
    }
    if (kiln_cache_layer_damage(c, 0)) {
        if (kiln_cache_writable_layer(c) != -1 ||
            kiln_cache_store(c, fresh->key, &fresh->rec, NULL) != KILN_ERR_CACHE ||
            kiln_cache_gc(c, &g, NULL, NULL) != KILN_ERR_CACHE || !strstr(kiln_last_error(), scratch))
            out = failed(why, "a damaged writable file was not left out");
        kiln_cache_close(c);
        size_t after_size;
        uint8_t *after = read_all(scratch, &after_size);
        if (out == OUT_CLEAN && (!after || after_size != size || memcmp(after, before, size)))
            out = failed(why, "a damaged writable file was changed");
        free(after);
    } else {
        char hex[KILN_CACHE_KEY_HEX];
        int rm = -1;
        for (int i = 0; i < n_kept && rm < 0; i++)
            if (served[i])
                rm = i;
        if (kiln_cache_gc(c, &g, NULL, NULL) ||
            kiln_cache_store(c, fresh->key, &fresh->rec, NULL))
            out = failed(why, "gc or store: %s", kiln_last_error());
        if (out == OUT_CLEAN && rm >= 0) {
            kiln_cache_key_hex(made_v[rm].key, hex);
            if (kiln_cache_rm(c, hex, NULL))
                out = failed(why, "rm: %s", kiln_last_error());
        }
        kiln_cache_close(c);
        kiln_cache_check chk;
        if (out == OUT_CLEAN && kiln_cache_file_check(scratch, &chk))
            out = failed(why, "after kiln's writes: %s", kiln_last_error());
        kiln_cache_options r = { .shipped = &scratch, .n_shipped = 1, .no_writable = 1,
                                 .strict = 1 };
        if (out == OUT_CLEAN && kiln_cache_open(&r, &c))
            out = failed(why, "reopen: %s", kiln_last_error());
        int open = out == OUT_CLEAN;
        for (int i = 0; out == OUT_CLEAN && i < n_kept + 1; i++) {
            const made *m = i < n_kept ? &made_v[i] : fresh;
            if ((i < n_kept && (!served[i] || i == rm)))
                continue;
            kiln_cache_hit h;
            if (kiln_cache_lookup(c, m->key, "sm_90a", &h)) {
                out = failed(why, "after kiln's writes, record %s is lost: %s", m->entry,
                             kiln_last_error());
                break;
            }
            if (h.size != m->size || memcmp(h.blob, m->enc, h.size))
                out = failed(why, "after kiln's writes, record %s changed", m->entry);
            kiln_cache_hit_release(&h);
        }
        if (open)
            kiln_cache_close(c);
    }
    free(before);
    char lock[4096];
    snprintf(lock, sizeof lock, "%s-lock", scratch);
    unlink(scratch);
    unlink(lock);
    return out;
}

/* What kiln makes of the file at path with damage d done to it. */
static outcome run_case(const char *path, const char *scratch, const kt_layout *L, const kt_damage *d,
                        int deep, char *why)
{
    int seen = 0;
    kiln_cache_options o = { .shipped = &path, .n_shipped = 1, .no_writable = 1,
                             .on_corrupt = count_corrupt, .ctx = &seen };
    kiln_cache *c;
    if (kiln_cache_open(&o, &c))
        return failed(why, "open: %s", kiln_last_error());
    outcome out;
    const char *damage = kiln_cache_layer_damage(c, 0);
    int missing = 0;
    if (damage) {
        out = OUT_DAMAGED;
        uint8_t key[KILN_CACHE_KEY_BYTES] = { 0 };
        if (!strstr(damage, path) || !seen)
            out = failed(why, "damage not reported by path: %s", damage);
        else if (kiln_cache_offline_miss(c, "sig", key) != KILN_ERR_CACHE ||
                 !strstr(kiln_last_error(), path))
            out = failed(why, "an offline miss does not name the damaged file: %s",
                         kiln_last_error());
        else if ((out = serve_all(c, &missing, d, why)) == OUT_CLEAN)
            out = missing == n_kept ? OUT_DAMAGED
                                    : failed(why, "a damaged file served %d records",
                                             n_kept - missing);
    } else {
        size_t n, bad;
        extra_ctx x = { 0 };
        if (kiln_cache_verify(c, 0, NULL, NULL, &n, &bad) ||
            kiln_cache_foreach(c, 0, count_extra, &x)) {
            out = failed(why, "verify: %s", kiln_last_error());
        } else if ((out = serve_all(c, &missing, d, why)) == OUT_CLEAN) {
            if ((missing || x.extra) && !bad) {
                snprintf(why, sizeof((shared_case *)0)->why,
                         "%d records missing, %d not stored served, verify silent", missing,
                         x.extra);
                out = OUT_SILENT;
            } else {
                out = bad ? OUT_BAD_RECORDS : OUT_CLEAN;
            }
        }
    }
    kiln_cache_close(c);
    if (deep & 1 && out <= OUT_DAMAGED) {
        outcome s = salvage_check(path, scratch, L, d, why);
        out = s == OUT_CLEAN ? out : s;
    }
    if (deep & 2 && out <= OUT_DAMAGED) {
        outcome w = write_check(path, scratch, why);
        out = w == OUT_CLEAN ? out : w;
    }
    return out;
}

/* ---------------------------------------------------------- the plan */

typedef struct run_ctx {
    const kt_plan *plan;
    const kt_layout *L;
    const uint8_t *intact;
    size_t size;
    shared_case *cases;
} run_ctx;

/* A case's depth: every cut and every sixteenth change is salvaged, every
 * sixty-fourth also written to. */
static int depth_of(const kt_damage *d, size_t i)
{
    return (!d->xor || i % 16 == 0) | (i % 64 == 0) << 1;
}

/* A worker runs cases first, first + stride, ... on its own copy of the
 * file, each under a time limit; the parent learns from the shared table
 * which case a dead worker was on. */
static void worker(const run_ctx *x, const char *path, const char *scratch, size_t first,
                   size_t stride)
{
    int fd = open(path, O_RDWR);
    if (fd < 0)
        _exit(90);
    for (size_t i = first; i < x->plan->n; i += stride) {
        shared_case *sc = &x->cases[i];
        if (sc->done)
            continue;
        const kt_damage *d = &x->plan->v[i];
        sc->started = 1;
        if (kt_damage_apply(fd, d, x->intact))
            _exit(91);
        alarm(20);
        sc->outcome = (uint8_t)run_case(path, scratch, x->L, d, depth_of(d, i), sc->why);
        alarm(0);
        if (kt_damage_undo(fd, d, x->intact, x->size))
            _exit(92);
        sc->done = 1;
    }
    close(fd);
    _exit(0);
}

enum { WORKERS = 2 };

static void run_plan(run_ctx *x)
{
    char *paths[WORKERS], *scratch[WORKERS];
    pid_t pid[WORKERS];
    for (int w = 0; w < WORKERS; w++) {
        char name[32];
        snprintf(name, sizeof name, "worker-%d.kiln", w);
        paths[w] = path_in(name);
        snprintf(name, sizeof name, "scratch-%d.kiln", w);
        scratch[w] = path_in(name);
        pid[w] = -1;
    }
    for (int live = WORKERS;;) {
        for (int w = 0; w < WORKERS; w++) {
            if (pid[w] > 0)
                continue;
            if (pid[w] == 0)
                continue; /* finished */
            spill(paths[w], x->intact, x->size);
            fflush(NULL);
            pid[w] = fork();
            cr_assert_geq(pid[w], 0);
            if (pid[w] == 0)
                worker(x, paths[w], scratch[w], (size_t)w, WORKERS);
        }
        if (!live)
            break;
        int status;
        pid_t got = wait(&status);
        cr_assert_gt(got, 0, "wait: %s", strerror(errno));
        int w = got == pid[0] ? 0 : 1;
        /* The case a dead worker was on: started, not done. */
        size_t at = x->plan->n;
        for (size_t i = (size_t)w; i < x->plan->n; i += WORKERS)
            if (x->cases[i].started && !x->cases[i].done) {
                at = i;
                break;
            }
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && at == x->plan->n) {
            pid[w] = 0;
            live--;
            continue;
        }
        cr_assert(at < x->plan->n, "worker %d exited %d outside any case", w,
                  WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        shared_case *sc = &x->cases[at];
        sc->outcome = OUT_FAILED;
        snprintf(sc->why, sizeof sc->why, "%s",
                 WIFSIGNALED(status) ? (WTERMSIG(status) == SIGALRM ? "hung" : strsignal(WTERMSIG(status)))
                                     : "the worker exited");
        sc->done = 1;
        pid[w] = -1; /* start it again, past this case */
    }
    for (int w = 0; w < WORKERS; w++) {
        free(paths[w]);
        free(scratch[w]);
    }
}

Test(lmdbfile, every_damage_of_a_real_cache_file_is_survived_and_reported)
{
    char *path = path_in("intact.kiln");
    build(path);
    size_t size;
    uint8_t *intact = slurp(path, &size);
    kt_layout L;
    kt_layout_read(intact, size, &L);
    cr_assert_eq(L.n_records, (size_t)n_kept);
    int branches = 0, leaves = 0, overflow = 0, free_pages = 0;
    for (uint64_t p = 0; p < L.pages; p++) {
        branches += L.kind[p] == KT_PAGE_BRANCH;
        leaves += L.kind[p] == KT_PAGE_LEAF;
        overflow += L.kind[p] == KT_PAGE_OVERFLOW;
        free_pages += L.kind[p] == KT_PAGE_FREE_LEAF;
    }
    cr_assert(branches && leaves > 1 && overflow >= N_LARGE && free_pages,
              "the file has every kind of page: %d branch, %d leaf, %d overflow, %d free list",
              branches, leaves, overflow, free_pages);

    kt_plan plan = kt_damage_plan(&L, intact, size, kt_seed());
    shared_case *cases = mmap(NULL, plan.n * sizeof *cases, PROT_READ | PROT_WRITE,
                              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(cases, MAP_FAILED);
    run_ctx x = { .plan = &plan, .L = &L, .intact = intact, .size = size, .cases = cases };
    run_plan(&x);

    size_t tally[OUT_COUNT] = { 0 }, shown = 0;
    for (size_t i = 0; i < plan.n; i++) {
        cr_assert(cases[i].done, "case %zu (%s) never ran", i, plan.v[i].what);
        tally[cases[i].outcome]++;
        if (cases[i].outcome >= OUT_SILENT && shown++ < 20)
            cr_log_error("%s: %s: %s", plan.v[i].what, outcome_names[cases[i].outcome],
                         cases[i].why);
    }
    cr_log_info("%zu damages of a %zu-byte cache: %zu %s, %zu %s, %zu %s", plan.n, size,
                tally[OUT_CLEAN], outcome_names[OUT_CLEAN], tally[OUT_BAD_RECORDS],
                outcome_names[OUT_BAD_RECORDS], tally[OUT_DAMAGED], outcome_names[OUT_DAMAGED]);
    cr_assert_eq(tally[OUT_SILENT] + tally[OUT_WRONG] + tally[OUT_FAILED], 0,
                 "%zu silent, %zu wrong bytes served, %zu failed (the first are above)",
                 tally[OUT_SILENT], tally[OUT_WRONG], tally[OUT_FAILED]);
    cr_assert_gt(tally[OUT_DAMAGED], 0);
    cr_assert_gt(tally[OUT_BAD_RECORDS], 0);
    munmap(cases, plan.n * sizeof *cases);
    free(plan.v);
    kt_layout_free(&L);
    free(intact);
    free(path);
}

/* A free list LMDB would hand out twice: a record keyed by transaction 0
 * (LMDB reads it again in every allocation), one keyed past the last
 * commit, one whose pages are not in descending order (LMDB's merge loses
 * some and repeats others). Each changes bytes no record or tree page
 * holds; each must be named as damage, and left alone by kiln's writes,
 * where LMDB would abort allocating a page it already gave out. */
Test(lmdbfile, a_free_list_that_would_give_a_page_out_twice_is_damage)
{
    char *path = path_in("intact.kiln"), *work = path_in("damaged.kiln"),
         *scratch = path_in("scratch.kiln");
    build(path);
    size_t size;
    uint8_t *intact = slurp(path, &size);
    kt_layout L;
    kt_layout_read(intact, size, &L);
    const uint8_t *m0 = intact + 16, *m1 = intact + L.psize + 16;
    uint64_t txnid = kt_le(m0 + 128, 8) > kt_le(m1 + 128, 8) ? kt_le(m0 + 128, 8)
                                                             : kt_le(m1 + 128, 8);
    /* The first free list record with two pages or more, in the node. */
    uint64_t key_at = 0, ids_at = 0;
    for (uint64_t pg = 2; pg < L.pages && !ids_at; pg++) {
        if (L.kind[pg] != KT_PAGE_FREE_LEAF)
            continue;
        const uint8_t *p = intact + pg * L.psize;
        unsigned n = (unsigned)(kt_le(p + 12, 2) - 16) / 2;
        for (unsigned i = 0; i < n && !ids_at; i++) {
            unsigned off = (unsigned)kt_le(p + 16 + 2 * i, 2);
            if (kt_le(p + off + 4, 2) == 0 && kt_le(p + off + 16, 8) >= 2) {
                key_at = pg * L.psize + off + 8;
                ids_at = key_at + 8 + 8;
            }
        }
    }
    cr_assert(ids_at, "the file's free list holds a record of two pages");
    struct {
        const char *what;
        uint64_t at, value;
    } cases[] = {
        { "a free list record of transaction 0", key_at, 0 },
        { "a free list record of a transaction not committed", key_at, txnid + 1 },
        { "a free list record's pages in ascending order", ids_at, kt_le(intact + ids_at + 8, 8) },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t *bytes = malloc(size);
        memcpy(bytes, intact, size);
        if (cases[i].at == ids_at) { /* swap the first two page numbers */
            uint64_t first = kt_le(intact + ids_at, 8);
            memcpy(bytes + ids_at, &cases[i].value, 8);
            memcpy(bytes + ids_at + 8, &first, 8);
        } else {
            memcpy(bytes + cases[i].at, &cases[i].value, 8);
        }
        spill(work, bytes, size);
        kiln_cache_check chk;
        cr_assert_eq(kiln_cache_file_check(work, &chk), KILN_ERR_CACHE, "%s passed the check",
                     cases[i].what);
        cr_assert(strstr(kiln_last_error(), work) && strstr(kiln_last_error(), "free list"),
                  "%s: %s", cases[i].what, kiln_last_error());
        kt_damage d = { .at = cases[i].at, .xor = 0xff };
        snprintf(d.what, sizeof d.what, "%s", cases[i].what);
        char why[200] = "";
        outcome out = run_case(work, scratch, &L, &d, 3, why);
        cr_assert_eq(out, OUT_DAMAGED, "%s: %s: %s", cases[i].what, outcome_names[out], why);
        free(bytes);
    }
    kt_layout_free(&L);
    free(intact);
    free(path);
    free(work);
    free(scratch);
}

/* ---------------------------------------------------------- the command */

static kt_cli cli(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static kt_cli cli(const char *fmt, ...)
{
    char *args;
    va_list ap;
    va_start(ap, fmt);
    cr_assert_gt(vasprintf(&args, fmt, ap), 0);
    va_end(ap);
    kt_cli r = kt_cli_run(args);
    cr_assert(r.out && r.err, "%s", args);
    free(args);
    return r;
}

/* salvage of a damaged file: a file that verifies, with at least every
 * record whose own bytes the damage left whole. */
static void salvage_through_the_command(const char *path, const char *out, const kt_layout *L,
                                        const kt_damage *d)
{
    kt_cli r = cli("cache salvage %s -o %s --force", path, out);
    cr_assert_eq(r.status, 0, "%s: salvage: %s", d->what, r.err);
    kt_cli_free(&r);
    r = cli("cache verify %s", out);
    cr_assert_eq(r.status, 0, "%s: the salvaged file: %s%s", d->what, r.out, r.err);
    size_t whole = 0;
    for (size_t i = 0; i < L->n_records; i++)
        whole += made_of(L->records[i].key) && !kt_damage_hits(d, &L->records[i]);
    /* Stale copies on freed pages may come back too: at least the whole. */
    size_t got = 0, bad = 1;
    const char *tail = strstr(r.out, " records, ");
    while (tail && tail > r.out && tail[-1] >= '0' && tail[-1] <= '9')
        tail--;
    cr_assert(tail && sscanf(tail, "%zu records, %zu bad", &got, &bad) == 2, "%s", r.out);
    cr_assert(got >= whole && !bad, "%s: salvage kept %zu records, %zu bad, of %zu whole", d->what,
              got, bad, whole);
    kt_cli_free(&r);
}

/* A damaged file through verify, or through every cache subcommand that
 * opens one: exit 1 and a message naming it, never a signal, and the file
 * as it was; salvage copies its intact records out. */
static void damaged_through_the_command(const char *path, const uint8_t *bytes, size_t size,
                                        const kt_layout *L, const kt_damage *d, int every)
{
    char *other = path_in("other.kiln"), *out = path_in("salvaged.kiln");
    static const char *const reads[] = { "verify %s", "ls %s", "stat %s", "gc --corrupt --cache %s",
                                         "rm --all --cache %s", "merge %s --cache %s" };
    for (size_t i = 0; i < (every ? sizeof reads / sizeof reads[0] : 1); i++) {
        char args[8192];
        snprintf(args, sizeof args, reads[i], path, other);
        kt_cli r = cli("cache %s", args);
        cr_assert_eq(r.status, 1, "%s: kiln cache %s: exit %d\n%s%s", d->what, args, r.status, r.out,
                     r.err);
        cr_assert(strstr(r.out, path) || strstr(r.err, path), "%s: kiln cache %s: %s%s", d->what,
                  args, r.out, r.err);
        cr_assert(strstr(r.out, "damaged") || strstr(r.err, "damaged"), "%s: %s%s", d->what, r.out,
                  r.err);
        kt_cli_free(&r);
    }
    size_t now;
    uint8_t *after = slurp(path, &now);
    cr_assert(now == size && !memcmp(after, bytes, size), "%s: the file was changed", d->what);
    free(after);

    if (every)
        salvage_through_the_command(path, out, L, d);
    char lock[4096];
    snprintf(lock, sizeof lock, "%s-lock", other);
    unlink(other);
    unlink(lock);
    unlink(out);
    free(other);
    free(out);
}

Test(lmdbfile, the_kiln_command_names_a_damaged_file_and_leaves_it_alone)
{
    char *path = path_in("intact.kiln"), *work = path_in("damaged.kiln");
    build(path);
    size_t size;
    uint8_t *intact = slurp(path, &size);
    kt_layout L;
    kt_layout_read(intact, size, &L);
    kt_plan plan = kt_damage_plan(&L, intact, size, kt_seed());
    /* Every cut at a page boundary, and the first damage the check finds
     * of each other kind of change; every fourth through every subcommand. */
    int fd;
    size_t tried = 0;
    char last_kind[32] = "";
    for (size_t i = 0; i < plan.n; i++) {
        const kt_damage *d = &plan.v[i];
        char kind[32];
        snprintf(kind, sizeof kind, "%.*s", (int)strcspn(d->what, "0123456789"), d->what);
        if (d->xor && !strcmp(kind, last_kind))
            continue;
        spill(work, intact, size);
        cr_assert_geq(fd = open(work, O_RDWR), 0);
        cr_assert_eq(kt_damage_apply(fd, d, intact), 0);
        close(fd);
        kiln_cache_check chk;
        if (kiln_cache_file_check(work, &chk) != KILN_ERR_CACHE || (!d->xor && d->at % L.psize))
            continue;
        snprintf(last_kind, sizeof last_kind, "%s", kind);
        size_t n;
        uint8_t *bytes = slurp(work, &n);
        damaged_through_the_command(work, bytes, n, &L, d, tried % 4 == 0);
        free(bytes);
        tried++;
    }
    cr_assert_gt(tried, L.pages / 2);
    free(plan.v);
    kt_layout_free(&L);
    free(intact);
    free(path);
    free(work);
}

/* Files LMDB wrote and kiln's check: every commit of a file churned by
 * puts, overwrites, deletes and drops of small and overflow values passes,
 * so a healthy cache is never taken for a damaged one. */
Test(lmdbfile, every_commit_of_a_churned_file_passes)
{
    char *path = path_in("churn.kiln");
    MDB_env *env;
    MDB_dbi dbi;
    cr_assert_eq(mdb_env_create(&env), 0);
    cr_assert_eq(mdb_env_set_mapsize(env, (size_t)1 << 28), 0);
    cr_assert_eq(mdb_env_open(env, path, MDB_NOSUBDIR, 0644), 0);
    kt_rng r = kt_rng_new(kt_seed());
    static uint8_t val[200000];
    for (size_t i = 0; i < sizeof val; i++)
        val[i] = (uint8_t)i;
    int commits = 0;
    for (int round = 0; round < 150; round++) {
        MDB_txn *txn;
        cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
        cr_assert_eq(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
        int ops = 1 + (int)(kt_next(&r) % 150);
        for (int o = 0; o < ops; o++) {
            uint8_t key[KILN_CACHE_KEY_BYTES] = { 0 };
            uint64_t k = kt_next(&r) % 3000;
            memcpy(key, &k, sizeof k);
            MDB_val K = { sizeof key, key }, V;
            uint64_t what = kt_next(&r) % 100;
            if (what < 60) {
                V.mv_size = kt_next(&r) % 40 ? kt_next(&r) % 1500 : kt_next(&r) % sizeof val;
                V.mv_data = val;
                int rc = mdb_put(txn, dbi, &K, &V, what % 2 ? MDB_NOOVERWRITE : 0);
                cr_assert(!rc || rc == MDB_KEYEXIST, "%s", mdb_strerror(rc));
            } else if (what < 99) {
                int rc = mdb_del(txn, dbi, &K, NULL);
                cr_assert(!rc || rc == MDB_NOTFOUND, "%s", mdb_strerror(rc));
            } else if (kt_next(&r) % 20 == 0) {
                cr_assert_eq(mdb_drop(txn, dbi, 0), 0);
            }
        }
        if (kt_next(&r) % 8 == 0) {
            mdb_txn_abort(txn);
            continue;
        }
        cr_assert_eq(mdb_txn_commit(txn), 0);
        commits++;
        kiln_cache_check chk;
        cr_assert_eq(kiln_cache_file_check(path, &chk), KILN_OK, "commit %d: %s", commits,
                     kiln_last_error());
        MDB_stat ms;
        MDB_txn *rd;
        cr_assert_eq(mdb_txn_begin(env, NULL, MDB_RDONLY, &rd), 0);
        cr_assert_eq(mdb_stat(rd, dbi, &ms), 0);
        mdb_txn_abort(rd);
        cr_assert_eq(chk.records, ms.ms_entries);
    }
    mdb_env_close(env);
    free(path);
}

/* Meta pages LMDB accepts (the flag, the magic and the version are right)
 * but cannot use: each is damage, left out, never handed to LMDB (a page
 * size of 0 was a division by zero inside mdb_env_open). */
Test(lmdbfile, a_meta_page_lmdb_would_accept_but_not_survive_is_damage)
{
    char *path = path_in("intact.kiln"), *work = path_in("meta.kiln");
    build(path);
    size_t size;
    uint8_t *intact = slurp(path, &size);
    static const struct {
        unsigned at, bytes;
        uint64_t value;
        const char *says;
    } edits[] = {
        { 40, 4, 0, "page size 0" },
        { 40, 4, 1, "page size 1" },
        { 40, 4, 0x80000000u, "page size 2147483648" },
        { 136, 8, UINT64_MAX, "the meta page says pages 0.." },
        { 46, 2, 40, "is 40 deep" },
        { 94, 2, 40, "is 40 deep" },
        { 128, 8, 1, "page 1 (+1) lies outside pages 2.." },
        { 144, 8, 1u << 20, "txnid" },
        { 92, 2, 0x04, "database flags" },
        { 44, 2, 0x01 | 0x08, "database flags" },
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        uint8_t *b = malloc(size);
        memcpy(b, intact, size);
        /* On the meta page LMDB uses, whichever of the two that is. */
        size_t m = kt_le(b + 144, 8) < kt_le(b + L_PSIZE + 144, 8) ? L_PSIZE : 0;
        for (unsigned j = 0; j < edits[i].bytes; j++)
            b[m + edits[i].at + j] = (uint8_t)(edits[i].value >> (8 * j));
        spill(work, b, size);
        free(b);
        const char *shipped = work;
        kiln_cache_options o = { .shipped = &shipped, .n_shipped = 1, .no_writable = 1 };
        kiln_cache *c;
        cr_assert_eq(kiln_cache_open(&o, &c), KILN_OK, "%s: %s", edits[i].says, kiln_last_error());
        const char *damage = kiln_cache_layer_damage(c, 0);
        cr_assert(damage && strstr(damage, work) && strstr(damage, edits[i].says), "%s: %s",
                  edits[i].says, damage ? damage : "(passed)");
        kiln_cache_close(c);
    }
    free(intact);
    free(path);
    free(work);
}
