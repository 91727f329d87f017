/* The fault sweep (tests/util/fault.h) over the kernel cache: open with a
 * damaged shipped layer, lookup, store, verify, stat, export, merge, gc
 * and salvage. After every run, failed or not, the writable cache still
 * verifies and holds every record it held, no half record was written,
 * and an export or salvage that failed left no file behind, not even a
 * temporary one. */
#include "cache/cache.h"
#include "fault.h"
#include "tests/cache/fake_record.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Records 0-2 in the writable cache as each run finds it, 3-4 in the
 * shipped one, 2 and 5 in the file merged in; 6 is stored by the run. A
 * second shipped file, truncated, is left out as damaged. */
enum { REC_COUNT = 7 };

typedef struct cache_ctx {
    kt_made rec[REC_COUNT];
    char pristine[128], shipped[128], damaged[128], merged[128];
    char run_dir[128], writable[160], lock[160], exported[160], salvaged[160];
    int did_export, did_salvage;
} cache_ctx;

static void cache_fill(cache_ctx *c, const char *path, int from, int to)
{
    kiln_cache *k;
    cr_assert_eq(kiln_cache_open(&(kiln_cache_options){ .path = path }, &k), KILN_OK, "%s",
                 kiln_last_error());
    for (int i = from; i <= to; i++)
        cr_assert_eq(kiln_cache_store(k, c->rec[i].key, &c->rec[i].rec, NULL), KILN_OK, "%s",
                     kiln_last_error());
    kiln_cache_close(k);
}

static void cache_reset(void *ctx)
{
    cache_ctx *c = ctx;
    kt_copy_file(c->pristine, c->writable);
    unlink(c->lock);
    unlink(c->exported);
    unlink(c->salvaged);
    c->did_export = c->did_salvage = 0;
}

static kiln_status cache_scenario_steps(cache_ctx *c, kiln_cache *k, kt_digest *d)
{
    kiln_cache_hit h;
    kiln_status st;
    for (int i = 0; i < 5; i += 3) {
        if ((st = kiln_cache_lookup(k, c->rec[i].key, "sm_90a", &h)))
            return st;
        kt_dig_int(d, h.layer);
        kt_dig_str(d, h.rec.signature);
        kiln_cache_hit_release(&h);
    }
    if ((st = kiln_cache_lookup(k, c->rec[6].key, "sm_90a", &h)) != KILN_ERR_NOT_FOUND)
        return st ? st : kiln_fail(KILN_ERR_STATE, "record 6 was found before it was stored");
    kiln_cache_put put;
    if ((st = kiln_cache_store(k, c->rec[6].key, &c->rec[6].rec, &put)))
        return st;
    kt_dig_int(d, put);
    size_t entries, bad;
    int w = kiln_cache_writable_layer(k);
    if ((st = kiln_cache_verify(k, w, NULL, NULL, &entries, &bad)))
        return st;
    kt_dig_int(d, (int64_t)entries);
    kt_dig_int(d, (int64_t)bad);
    kiln_cache_stats s;
    if ((st = kiln_cache_stat(k, w, &s)))
        return st;
    kt_dig_int(d, (int64_t)s.entries);
    for (int i = 0; i < s.n_targets; i++)
        kt_dig_str(d, s.by_target[i].name);
    for (int i = 0; i < s.n_kinds; i++)
        kt_dig_str(d, s.by_kind[i].name);
    kiln_cache_stats_free(&s);
    uint8_t two[2][KILN_CACHE_KEY_BYTES];
    memcpy(two[0], c->rec[0].key, sizeof two[0]);
    memcpy(two[1], c->rec[3].key, sizeof two[1]);
    if ((st = kiln_cache_export_keys(k, (const uint8_t(*)[KILN_CACHE_KEY_BYTES])two, 2,
                                     c->exported, 0, NULL, NULL)))
        return st;
    c->did_export = 1;
    kiln_cache_merge_result mr;
    if ((st = kiln_cache_merge(k, c->merged, NULL, NULL, &mr)))
        return st;
    kt_dig(d, &mr, sizeof mr);
    size_t removed;
    if ((st = kiln_cache_gc(k, &(kiln_cache_gc_options){ .corrupt = 1 }, &removed, NULL)))
        return st;
    kt_dig_int(d, (int64_t)removed);
    return KILN_OK;
}

static kiln_status scenario_cache(void *ctx, kt_digest *d)
{
    cache_ctx *c = ctx;
    const char *shipped[] = { c->damaged, c->shipped };
    kiln_cache *k;
    kiln_status st = kiln_cache_open(
        &(kiln_cache_options){ .shipped = shipped, .n_shipped = 2, .path = c->writable }, &k);
    if (st)
        return st;
    kt_dig_str(d, kiln_cache_layer_damage(k, 0));
    st = cache_scenario_steps(c, k, d);
    kiln_cache_close(k);
    if (st)
        return st;
    kiln_cache_salvage_result sr;
    if ((st = kiln_cache_salvage(c->shipped, c->salvaged, 0, &sr)))
        return st;
    c->did_salvage = 1;
    kt_dig(d, &sr, sizeof sr);
    return KILN_OK;
}

/* After every run: the writable cache verifies and holds records 0-2; an
 * export or a salvage that failed left no file, not even a temporary one. */
static void cache_check(void *ctx, kiln_status st)
{
    (void)st;
    cache_ctx *c = ctx;
    kiln_cache *k;
    cr_assert_eq(kiln_cache_open(&(kiln_cache_options){ .path = c->writable }, &k), KILN_OK, "%s: %s",
                 kt_sweep_now(), kiln_last_error());
    size_t entries, bad;
    cr_assert_eq(kiln_cache_verify(k, 0, NULL, NULL, &entries, &bad), KILN_OK, "%s: %s", kt_sweep_now(),
                 kiln_last_error());
    cr_assert_eq(bad, 0, "%s: the writable cache holds %zu bad records", kt_sweep_now(), bad);
    for (int i = 0; i < 3; i++) {
        kiln_cache_hit h;
        cr_assert_eq(kiln_cache_lookup(k, c->rec[i].key, "sm_90a", &h), KILN_OK, "%s: record %d: %s",
                     kt_sweep_now(), i, kiln_last_error());
        kiln_cache_hit_release(&h);
    }
    kiln_cache_close(k);
    if (c->did_export)
        kt_cache_intact(c->exported, 1, 2);
    if (c->did_salvage)
        kt_cache_intact(c->salvaged, 1, 2);
    DIR *dir = opendir(c->run_dir);
    cr_assert_not_null(dir);
    for (struct dirent *e; (e = readdir(dir));) {
        const char *n = e->d_name;
        int known = !strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, "w.kiln") || !strcmp(n, "w.kiln-lock") ||
                    (c->did_export && !strcmp(n, "export.kiln")) ||
                    (c->did_salvage && !strcmp(n, "salvaged.kiln"));
        cr_assert(known, "%s: left %s/%s behind", kt_sweep_now(), c->run_dir, n);
    }
    closedir(dir);
}

Test(fault, cache, .init = kt_tmp_setup, .fini = kt_tmp_teardown)
{
    static cache_ctx c;
    for (int i = 0; i < REC_COUNT; i++)
        kt_made_init(&c.rec[i], i);
    kt_in_tmp(c.pristine, sizeof c.pristine, "pristine.kiln");
    kt_in_tmp(c.shipped, sizeof c.shipped, "shipped.kiln");
    kt_in_tmp(c.merged, sizeof c.merged, "merged.kiln");
    kt_in_tmp(c.run_dir, sizeof c.run_dir, "run");
    cr_assert_eq(mkdir(c.run_dir, 0700), 0);
    snprintf(c.writable, sizeof c.writable, "%s/w.kiln", c.run_dir);
    snprintf(c.lock, sizeof c.lock, "%s/w.kiln-lock", c.run_dir);
    snprintf(c.exported, sizeof c.exported, "%s/export.kiln", c.run_dir);
    snprintf(c.salvaged, sizeof c.salvaged, "%s/salvaged.kiln", c.run_dir);
    cache_fill(&c, c.pristine, 0, 2);
    cache_fill(&c, c.shipped, 3, 4);
    kt_in_tmp(c.damaged, sizeof c.damaged, "damaged.kiln");
    kt_copy_file(c.shipped, c.damaged);
    cr_assert_eq(truncate(c.damaged, 3 * 4096), 0);
    cache_fill(&c, c.merged, 2, 2);
    cache_fill(&c, c.merged, 5, 5);
    kt_sweep(&(kt_scenario){ .name = "cache", .run = scenario_cache, .reset = cache_reset,
                             .check = cache_check, .ctx = &c });
}

