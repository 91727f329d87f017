/* libFuzzer harness for what kiln does with an untrusted cache file: the
 * input is the file. Opened as a shipped layer it is either left out as
 * damaged, named, and never handed to LMDB, or opened: then every record
 * is iterated, verified and looked up, and whatever is served must be a
 * record that checks against its key. The file is salvaged in both cases,
 * and the salvaged file must pass the check. Opened as the writable cache,
 * a file that passed takes gc --corrupt and a store, and must still pass.
 * Crashes, hangs, leaks and sanitizer reports are the bugs it looks for: a
 * file the check let through that LMDB misreads.
 *
 * fuzz_cache_seeds DIR writes the seed corpus (fuzz/corpus/cache). */
#include "cache/cache_impl.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64], path[96], out[96], lock[112];

static void remove_all(void)
{
    unlink(path);
    unlink(out);
    unlink(lock);
    rmdir(dir);
}

static void write_input(const uint8_t *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || (size && write(fd, data, size) != (ssize_t)size) || close(fd))
        abort();
}

static kiln_status visit(void *ctx, const kiln_cache_entry *e)
{
    kiln_cache *c = ctx;
    (void)c;
    if (e->status == KILN_OK && (!e->rec.signature || !e->rec.cubin || !e->rec.cubin_size))
        abort();
    return KILN_OK;
}

/* The records a layer serves, each looked up by its key. */
static void serve(kiln_cache *c, int layer)
{
    enum { MAX_KEYS = 64 };
    uint8_t keys[MAX_KEYS][KILN_CACHE_KEY_BYTES];
    size_t n = 0, entries, bad;
    if (kiln_cache_verify(c, layer, NULL, NULL, &entries, &bad) ||
        kiln_cache_foreach(c, layer, visit, c))
        return;
    /* Keys again, for lookups after the iteration's transaction ended. */
    MDB_txn *txn;
    MDB_cursor *cur;
    MDB_val k, v;
    kiln_cache_file *f = &c->files[layer];
    if (kiln_cache_file_begin(f, MDB_RDONLY, &txn, "fuzz"))
        return;
    if (!mdb_cursor_open(txn, f->dbi, &cur)) {
        while (n < MAX_KEYS && !mdb_cursor_get(cur, &k, &v, MDB_NEXT))
            if (k.mv_size == KILN_CACHE_KEY_BYTES)
                memcpy(keys[n++], k.mv_data, KILN_CACHE_KEY_BYTES);
        mdb_cursor_close(cur);
    }
    mdb_txn_abort(txn);
    for (size_t i = 0; i < n; i++) {
        kiln_cache_hit h;
        kiln_cache_record r;
        if (kiln_cache_lookup(c, keys[i], NULL, &h) == KILN_OK) {
            if (kiln_cache_record_decode(h.blob, h.size, keys[i], &r) != KILN_OK)
                abort();
            kiln_cache_hit_release(&h);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s/kiln-fuzz-cache-XXXXXX",
                 access("/dev/shm", W_OK) ? "/tmp" : "/dev/shm");
        if (!mkdtemp(dir))
            abort();
        snprintf(path, sizeof path, "%s/c.kiln", dir);
        snprintf(out, sizeof out, "%s/salvaged.kiln", dir);
        snprintf(lock, sizeof lock, "%s-lock", path);
        atexit(remove_all);
    }
    write_input(data, size);

    const char *shipped = path;
    kiln_cache_options o = { .shipped = &shipped, .n_shipped = 1, .no_writable = 1 };
    kiln_cache *c = NULL;
    if (kiln_cache_open(&o, &c) == KILN_OK) {
        const char *damage = kiln_cache_layer_damage(c, 0);
        if (damage && !strstr(damage, path))
            abort();
        if (!damage)
            serve(c, 0);
        /* the tuning table: read whole or refused naming the file */
        kiln_tuning *t;
        if (kiln_tuning_create(&t) == KILN_OK) {
            kiln_status st = kiln_cache_tuning(c, t);
            if (st != KILN_OK && st != KILN_ERR_NOMEM && !strstr(kiln_last_error(), path))
                abort();
            kiln_tuning_destroy(t);
        }
        kiln_cache_close(c);
    } else if (!strstr(kiln_last_error(), path)) {
        abort();
    }

    kiln_cache_salvage_result sr;
    kiln_cache_check chk;
    if (kiln_cache_salvage(path, out, 1, &sr) == KILN_OK && kiln_cache_file_check(out, &chk))
        abort();

    /* As the writable cache: kiln's own writes on a file that passed. */
    kiln_cache_options w = { .path = path };
    if (size && kiln_cache_open(&w, &c) == KILN_OK) {
        int sound = kiln_cache_writable_layer(c) == 0;
        kiln_cache_gc_options g = { .corrupt = 1 };
        uint8_t key[KILN_CACHE_KEY_BYTES] = { 0x6b, 0x69, 0x6c, 0x6e };
        uint8_t cubin[96] = { 0x7f, 'E', 'L', 'F', 2, 1, 1, 0x41, 8 };
        cubin[18] = 190;
        cubin[49] = 90;
        kiln_cache_record rec = { .compiler = "nvrtc", .entry = "k", .target = "sm_90a",
                                  .kind = "simt", .signature = "fuzz", .threads = 32,
                                  .cubin = cubin, .cubin_size = sizeof cubin };
        (void)kiln_cache_gc(c, &g, NULL, NULL);
        (void)kiln_cache_store(c, key, &rec, NULL);
        kiln_tuning *t;
        kiln_tuning_entry e = { .signature = "linear backend=wgmma variant=* format=bf16",
                                .bucket = 8, .variant = "bm64bn64", .heuristic = "bm64bn128" };
        if (kiln_tuning_create(&t) == KILN_OK) {
            if (kiln_tuning_set(t, &e) == KILN_OK)
                (void)kiln_cache_store_tuning(c, t);
            kiln_tuning_destroy(t);
        }
        kiln_cache_close(c);
        if (sound && kiln_cache_file_check(path, &chk))
            abort();
        /* A damaged file is left as it was. */
        uint8_t *now = malloc(size);
        int fd = open(path, O_RDONLY);
        if (!sound && (!now || fd < 0 || read(fd, now, size) != (ssize_t)size ||
                       lseek(fd, 0, SEEK_END) != (off_t)size || memcmp(now, data, size)))
            abort();
        if (fd >= 0)
            close(fd);
        free(now);
    }
    unlink(lock);
    return 0;
}
