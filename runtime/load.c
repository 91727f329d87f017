/* The weight load (load.h). Readers take units from one list under the
 * lock, fill a staging slot (pread, memcpy or pack), queue its copies and
 * an event on the stream, and give the slot back; a reader that takes a
 * slot waits for that slot's last event first, so a slot is never
 * rewritten while the device still reads it. A reader holds one slot at a
 * time, so any count of readers and slots makes progress. */
#include "runtime/load.h"

#include "graph/model_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct load_unit {
    const kiln_load_item *item;
    int part;          /* 0: data, 1: scale, -1: the whole weight, packed */
    size_t at, bytes;  /* within the part */
    const char *path;  /* file order: by path (memory last), then */
    uint64_t key;      /* offset in the file, or address */
} load_unit;

typedef struct load_slot {
    void *host;
    CUevent done;      /* recorded after the slot's last copies */
    int busy;          /* a reader holds it */
} load_slot;

/* The staging buffers: a run's own, or a caller's kept across runs. */
struct kiln_load_ring {
    load_slot *slots;
    int n_slots, pinned;
    size_t slot_bytes;
};

typedef struct load_file {
    const char *path;
    int fd;
} load_file;

typedef struct load_run {
    const kiln_load_options *o;
    load_unit *units;
    size_t n_units, next;
    kiln_load_ring own, *ring; /* ring: &own, or the options' */
    load_slot *slots;          /* the ring's, for short */
    int n_slots, cursor, pinned;
    size_t slot_bytes;
    load_file *files;
    int n_files;
    pthread_mutex_t mu;        /* units, slots' busy, failure, counts, progress */
    pthread_cond_t freed;      /* a slot came back, or the load failed */
    pthread_mutex_t stream_mu; /* a slot's copies and its event, queued together */
    pthread_mutex_t big;       /* a packed weight larger than a slot: one at a time */
    int failed;
    kiln_status status;
    char error[1024];
    size_t read_bytes, copied_bytes, packed_bytes, total_bytes;
    kiln_progress progress;
} load_run;

/* The bytes a weight is stored in. */
static kiln_status stored_bytes(const kiln_tensor *t, size_t *data, size_t *scale)
{
    const kiln_qtensor *q = &t->weight;
    kiln_status st = kiln_format_data_bytes(q->format, q->n, q->k, data);
    if (st == KILN_OK)
        st = kiln_qtensor_scale_bytes(q, scale);
    return st ? kiln_fail_prefix(st, "weight %s", t->name) : KILN_OK;
}

static int unit_order(const void *pa, const void *pb)
{
    const load_unit *a = pa, *b = pb;
    if (!a->path != !b->path)
        return a->path ? -1 : 1;
    int c = a->path ? strcmp(a->path, b->path) : 0;
    if (c)
        return c;
    return a->key < b->key ? -1 : a->key > b->key;
}

static const kiln_file_span *span_of(const kiln_tensor *t, int part)
{
    return part ? &t->scale_file : &t->data_file;
}

static const uint8_t *memory_of(const kiln_tensor *t, int part)
{
    return part ? t->weight.scale : t->weight.data;
}

/* Cuts the items into units; the slot size the largest needs. */
static kiln_status units_make(load_run *r, const kiln_load_item *items, int n)
{
    size_t slot = r->o->ring ? r->o->ring->slot_bytes : r->o->slot_bytes, need = 1, count = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n; i++) {
            const kiln_load_item *it = &items[i];
            const kiln_tensor *t = it->tensor;
            if (it->pack) {
                size_t data, scale;
                kiln_status st = stored_bytes(t, &data, &scale);
                if (st)
                    return st;
                size_t most = data + scale > it->data_bytes + it->scale_bytes
                                  ? data + scale : it->data_bytes + it->scale_bytes;
                need = most > need ? most : need;
                if (pass)
                    r->units[count] = (load_unit){
                        .item = it, .part = -1, .bytes = it->data_bytes + it->scale_bytes,
                        .path = t->data_file.path,
                        .key = t->data_file.path ? t->data_file.offset
                                                 : (uint64_t)(uintptr_t)t->weight.data };
                count++;
                continue;
            }
            for (int part = 0; part < 2; part++) {
                size_t bytes = part ? it->scale_bytes : it->data_bytes;
                need = bytes > need ? bytes : need;
                const kiln_file_span *f = span_of(t, part);
                for (size_t at = 0; at < bytes; at += slot, count++) {
                    if (!pass)
                        continue;
                    size_t len = bytes - at < slot ? bytes - at : slot;
                    r->units[count] = (load_unit){
                        .item = it, .part = part, .at = at, .bytes = len, .path = f->path,
                        .key = f->path ? f->offset + at
                                       : (uint64_t)(uintptr_t)(memory_of(t, part) + at) };
                }
            }
        }
        if (!pass) {
            r->units = kiln_calloc(count + 1, sizeof *r->units);
            if (!r->units)
                return kiln_fail(KILN_ERR_NOMEM, "weights: out of memory for %zu load units",
                                 count);
            r->n_units = count;
            count = 0;
        }
    }
    qsort(r->units, r->n_units, sizeof *r->units, unit_order);
    r->slot_bytes = need < slot ? need : slot;
    for (size_t i = 0; i < r->n_units; i++)
        r->total_bytes += r->units[i].bytes;
    return KILN_OK;
}

static kiln_status files_open(load_run *r)
{
    r->files = kiln_calloc(r->n_units + 1, sizeof *r->files);
    if (!r->files)
        return kiln_fail(KILN_ERR_NOMEM, "weights: out of memory for the model's files");
    for (size_t i = 0; i < r->n_units; i++) {
        const load_unit *u = &r->units[i];
        for (int part = 0; part < 2; part++) {
            /* a packed unit reads both spans; a chunk its own */
            if (u->part >= 0 && u->part != part)
                continue;
            const char *path = span_of(u->item->tensor, part)->path;
            if (!path || (r->n_files && !strcmp(r->files[r->n_files - 1].path, path)))
                continue;
            int known = 0;
            for (int f = 0; f < r->n_files && !known; f++)
                known = !strcmp(r->files[f].path, path);
            if (known)
                continue;
            size_t size;
            int fd;
            kiln_status st = kiln_file_open_regular(path, &fd, &size);
            if (st)
                return st;
            const kiln_file_span *f = span_of(u->item->tensor, part);
            struct stat sb;
            if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_dev != f->dev ||
                (uint64_t)sb.st_ino != f->ino) {
                close(fd);
                return kiln_fail(KILN_ERR_IO, "%s: not the file the model was opened from (it "
                                 "has been replaced since); open the model again", path);
            }
            r->files[r->n_files] = (load_file){ path, fd };
            r->n_files++;
            /* advice: a kernel that ignores it reads the same bytes */
            (void)posix_fadvise(r->files[r->n_files - 1].fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        }
    }
    return KILN_OK;
}

static void files_close(load_run *r)
{
    for (int f = 0; f < r->n_files; f++)
        close(r->files[f].fd);
    free(r->files);
}

/* n staging buffers of bytes each, pinned where the driver gives them. */
static kiln_status ring_fill(const kiln_cu *cu, int n, size_t bytes, kiln_load_ring *g)
{
    *g = (kiln_load_ring){ .slot_bytes = bytes };
    g->slots = kiln_calloc((size_t)n + 1, sizeof *g->slots);
    if (!g->slots)
        return kiln_fail(KILN_ERR_NOMEM, "weights: out of memory for the staging ring");
    g->pinned = 1;
    CUresult res = CUDA_SUCCESS;
    for (int i = 0; i < n && res == CUDA_SUCCESS; i++) {
        res = cu->MemHostAlloc(&g->slots[i].host, bytes, 0);
        if (res != CUDA_SUCCESS)
            g->slots[i].host = NULL;
    }
    if (res != CUDA_SUCCESS) {
        const char *name = "?";
        cu->GetErrorName(res, &name);
        fprintf(stderr,
                "kiln: warning: %d pinned staging buffers of %zu bytes: cuMemHostAlloc: %s; "
                "weights are staged in pageable memory, which copies slower\n",
                n, bytes, name);
        for (int i = 0; i < n; i++)
            if (g->slots[i].host)
                cu->MemFreeHost(g->slots[i].host);
        memset(g->slots, 0, (size_t)n * sizeof *g->slots);
        g->pinned = 0;
        for (int i = 0; i < n; i++)
            if (!(g->slots[i].host = kiln_malloc(bytes))) {
                g->n_slots = i;
                return kiln_fail(KILN_ERR_NOMEM, "weights: out of memory for %d staging buffers "
                                 "of %zu bytes", n, bytes);
            }
    }
    g->n_slots = n;
    for (int i = 0; i < n; i++) {
        kiln_status st = kiln_cu_check(cu, cu->EventCreate(&g->slots[i].done,
                                                           CU_EVENT_DISABLE_TIMING),
                                       "weights: cuEventCreate");
        if (st)
            return st;
    }
    return KILN_OK;
}

static void ring_free(const kiln_cu *cu, kiln_load_ring *g)
{
    for (int i = 0; g->slots && i < g->n_slots; i++) {
        if (g->slots[i].done)
            cu->EventDestroy(g->slots[i].done);
        if (g->pinned)
            cu->MemFreeHost(g->slots[i].host);
        else
            free(g->slots[i].host);
    }
    free(g->slots);
    *g = (kiln_load_ring){ 0 };
}

kiln_status kiln_load_ring_create(const kiln_load_options *o, kiln_load_ring **out)
{
    *out = NULL;
    kiln_load_ring *g = kiln_calloc(1, sizeof *g);
    if (!g)
        return kiln_fail(KILN_ERR_NOMEM, "weights: out of memory for the staging ring");
    kiln_status st = ring_fill(o->cu, o->slots, o->slot_bytes, g);
    if (st) {
        ring_free(o->cu, g);
        free(g);
        return st;
    }
    *out = g;
    return KILN_OK;
}

void kiln_load_ring_destroy(const kiln_cu *cu, kiln_load_ring *ring)
{
    if (!ring)
        return;
    ring_free(cu, ring);
    free(ring);
}

/* The run's slots: the options' ring, or its own of as many buffers as it
 * has units (at most o->slots), of the size the largest unit needs. */
static kiln_status slots_create(load_run *r)
{
    if (r->o->ring) {
        r->ring = r->o->ring;
    } else {
        int n = r->o->slots;
        if ((size_t)n > r->n_units)
            n = (int)r->n_units;
        r->ring = &r->own;
        kiln_status st = ring_fill(r->o->cu, n, r->slot_bytes, &r->own);
        if (st)
            return st;
    }
    r->slots = r->ring->slots, r->n_slots = r->ring->n_slots, r->pinned = r->ring->pinned;
    r->slot_bytes = r->ring->slot_bytes;
    return KILN_OK;
}

static void slots_free(load_run *r)
{
    ring_free(r->o->cu, &r->own);
}

/* The first failure stops every reader; later ones are consequences. */
static void load_fail(load_run *r, kiln_status st)
{
    pthread_mutex_lock(&r->mu);
    if (!r->failed) {
        r->failed = 1;
        r->status = st;
        snprintf(r->error, sizeof r->error, "%s", kiln_last_error());
    }
    pthread_cond_broadcast(&r->freed);
    pthread_mutex_unlock(&r->mu);
}

/* A free slot whose last copies have landed, or NULL with *st KILN_OK
 * when the load has failed meanwhile. */
static load_slot *slot_take(load_run *r, kiln_status *st)
{
    *st = KILN_OK;
    load_slot *s = NULL;
    pthread_mutex_lock(&r->mu);
    while (!r->failed && !s) {
        for (int i = 0; i < r->n_slots && !s; i++) {
            int at = (r->cursor + i) % r->n_slots;
            if (!r->slots[at].busy) {
                s = &r->slots[at];
                r->cursor = (at + 1) % r->n_slots;
            }
        }
        if (!s)
            pthread_cond_wait(&r->freed, &r->mu);
    }
    if (s)
        s->busy = 1;
    pthread_mutex_unlock(&r->mu);
    if (!s)
        return NULL;
    *st = kiln_cu_check(r->o->cu, r->o->cu->EventSynchronize(s->done), "cuEventSynchronize");
    return s;
}

static void slot_give(load_run *r, load_slot *s)
{
    pthread_mutex_lock(&r->mu);
    s->busy = 0;
    pthread_cond_signal(&r->freed);
    pthread_mutex_unlock(&r->mu);
}

/* Bytes [at, at + bytes) of a slot to copy into dst. */
typedef struct load_copy {
    CUdeviceptr dst;
    size_t at, bytes;
} load_copy;

/* Queues the copies c of weight t's bytes in s, and s's event. */
static kiln_status slot_send(load_run *r, const kiln_tensor *t, load_slot *s, const load_copy *c,
                             int n)
{
    const kiln_cu *cu = r->o->cu;
    kiln_status st = KILN_OK;
    size_t sent = 0;
    pthread_mutex_lock(&r->stream_mu);
    for (int i = 0; i < n && st == KILN_OK; i++) {
        if (!c[i].bytes)
            continue;
        st = kiln_cu_check(cu, cu->MemcpyHtoDAsync(c[i].dst, (const char *)s->host + c[i].at,
                                                   c[i].bytes, r->o->stream),
                           "cuMemcpyHtoDAsync");
        sent += st == KILN_OK ? c[i].bytes : 0;
    }
    if (st == KILN_OK)
        st = kiln_cu_check(cu, cu->EventRecord(s->done, r->o->stream), "cuEventRecord");
    pthread_mutex_unlock(&r->stream_mu);
    pthread_mutex_lock(&r->mu);
    r->copied_bytes += sent;
    pthread_mutex_unlock(&r->mu);
    return st ? kiln_fail_prefix(st, "weight %s", t->name) : KILN_OK;
}

/* Bytes [at, at + bytes) of the stored part of t into out: pread from its
 * file where it has one, else from memory. */
static kiln_status part_read(load_run *r, const kiln_tensor *t, int part, size_t at, void *out,
                             size_t bytes)
{
    const kiln_file_span *f = span_of(t, part);
    if (!f->path) {
        memcpy(out, memory_of(t, part) + at, bytes);
    } else {
        int fd = -1;
        for (int i = 0; i < r->n_files && fd < 0; i++)
            if (!strcmp(r->files[i].path, f->path))
                fd = r->files[i].fd;
        uint64_t off = f->offset + at;
        for (size_t done = 0; done < bytes;) {
            ssize_t got = pread(fd, (char *)out + done, bytes - done, (off_t)(off + done));
            if (got < 0 && errno == EINTR)
                continue;
            if (got < 0)
                return kiln_fail(KILN_ERR_IO, "%s: weight %s: cannot read %zu bytes at offset "
                                 "%llu: %s", f->path, t->name, bytes - done,
                                 (unsigned long long)(off + done), strerror(errno));
            if (got == 0)
                return kiln_fail(KILN_ERR_IO, "%s: weight %s: the file ends before byte %llu "
                                 "(it has changed since the model was opened)", f->path,
                                 t->name, (unsigned long long)(off + bytes));
            done += (size_t)got;
        }
    }
    pthread_mutex_lock(&r->mu);
    r->read_bytes += bytes;
    pthread_mutex_unlock(&r->mu);
    return KILN_OK;
}

/* A slot's worth of a stored array, read straight into the slot. */
static kiln_status unit_copy(load_run *r, const load_unit *u)
{
    const kiln_load_item *it = u->item;
    kiln_status st;
    load_slot *s = slot_take(r, &st);
    if (!s)
        return st;
    if (st == KILN_OK)
        st = part_read(r, it->tensor, u->part, u->at, s->host, u->bytes);
    if (st == KILN_OK) {
        load_copy c = { (u->part ? it->scale : it->data) + u->at, 0, u->bytes };
        st = slot_send(r, it->tensor, s, &c, 1);
    }
    slot_give(r, s);
    return st;
}

/* Packed bytes buf (data, then scale) to the device a slot at a time. */
static kiln_status packed_send(load_run *r, const kiln_load_item *it, const uint8_t *buf)
{
    size_t total = it->data_bytes + it->scale_bytes;
    kiln_status st = KILN_OK;
    for (size_t at = 0; at < total && st == KILN_OK; at += r->slot_bytes) {
        size_t len = total - at < r->slot_bytes ? total - at : r->slot_bytes;
        load_slot *s = slot_take(r, &st);
        if (!s)
            return st;
        if (st == KILN_OK) {
            memcpy(s->host, buf + at, len);
            size_t in_data = at < it->data_bytes ? it->data_bytes - at : 0;
            in_data = in_data < len ? in_data : len;
            load_copy c[2] = { { it->data + at, 0, in_data },
                               { it->scale + (at + in_data - it->data_bytes), in_data,
                                 len - in_data } };
            st = slot_send(r, it->tensor, s, c, 2);
        }
        slot_give(r, s);
    }
    return st;
}

/* A whole weight: read, packed (into a slot where it fits) and sent. */
static kiln_status unit_pack(load_run *r, const load_unit *u)
{
    const kiln_load_item *it = u->item;
    const kiln_tensor *t = it->tensor;
    size_t data, scale, packed = it->data_bytes + it->scale_bytes;
    kiln_status st = stored_bytes(t, &data, &scale);
    if (st)
        return st;
    int big = packed > r->slot_bytes || data + scale > r->slot_bytes;
    if (big)
        pthread_mutex_lock(&r->big);
    kiln_qtensor q = t->weight;
    uint8_t *stored = NULL, *out = NULL;
    if (t->data_file.path || t->scale_file.path) {
        stored = kiln_malloc(data + scale + 1);
        if (!stored)
            st = kiln_fail(KILN_ERR_NOMEM, "weight %s: out of memory for its %zu stored bytes",
                           t->name, data + scale);
        if (st == KILN_OK)
            st = part_read(r, t, 0, 0, stored, data);
        if (st == KILN_OK && scale && q.scale)
            st = part_read(r, t, 1, 0, stored + data, scale);
        q.data = stored;
        q.scale = scale && q.scale ? stored + data : q.scale;
    } else {
        pthread_mutex_lock(&r->mu);
        r->read_bytes += data + (q.scale ? scale : 0);
        pthread_mutex_unlock(&r->mu);
    }
    load_slot *s = NULL;
    if (st == KILN_OK && !big) {
        s = slot_take(r, &st);
        out = s ? s->host : NULL;
    } else if (st == KILN_OK) {
        out = kiln_malloc(packed + 1);
        if (!out)
            st = kiln_fail(KILN_ERR_NOMEM, "weight %s: out of memory for %zu bytes to pack it",
                           t->name, packed);
    }
    if (st == KILN_OK && out) {
        st = it->pack(r->o->target, &q, out, out + it->data_bytes);
        if (st != KILN_OK)
            st = kiln_fail_prefix(st, "weight %s", t->name);
    }
    if (st == KILN_OK && out) {
        pthread_mutex_lock(&r->mu);
        r->packed_bytes += packed;
        pthread_mutex_unlock(&r->mu);
        if (s) {
            load_copy c[2] = { { it->data, 0, it->data_bytes },
                               { it->scale, it->data_bytes, it->scale_bytes } };
            st = slot_send(r, it->tensor, s, c, 2);
        } else {
            st = packed_send(r, it, out);
        }
    }
    if (s)
        slot_give(r, s);
    else
        free(out);
    free(stored);
    if (big)
        pthread_mutex_unlock(&r->big);
    return st;
}

static void progress_show(load_run *r, int last)
{
    double s = kiln_now() - r->progress.start;
    kiln_progress_show(&r->progress, last, "loading weights: %.2f/%.2f GB, %.1f s, %.2f GB/s",
                       (double)r->copied_bytes / 1e9, (double)r->total_bytes / 1e9, s,
                       s > 0 ? (double)r->copied_bytes / 1e9 / s : 0.0);
}

static void *reader(void *arg)
{
    load_run *r = arg;
    kiln_status st = kiln_cu_check(r->o->cu, r->o->cu->CtxSetCurrent(r->o->ctx),
                                   "weights: cuCtxSetCurrent");
    if (st)
        load_fail(r, st);
    for (;;) {
        pthread_mutex_lock(&r->mu);
        if (r->failed || r->next == r->n_units) {
            pthread_mutex_unlock(&r->mu);
            return NULL;
        }
        const load_unit *u = &r->units[r->next++];
        progress_show(r, 0);
        pthread_mutex_unlock(&r->mu);
        st = u->part < 0 ? unit_pack(r, u) : unit_copy(r, u);
        if (st)
            load_fail(r, st);
    }
}

static kiln_status readers_run(load_run *r, int *ran)
{
    int n = r->o->threads > 0 ? r->o->threads : 1;
    if ((size_t)n > r->n_units)
        n = (int)r->n_units;
    pthread_t *tid = kiln_calloc((size_t)n + 1, sizeof *tid);
    if (!tid)
        return kiln_fail(KILN_ERR_NOMEM, "weights: out of memory for the reader threads");
    /* A reader the system will not start leaves its share to the others;
     * the caller reads too. */
    int started = 0;
    while (started + 1 < n && !pthread_create(&tid[started], NULL, reader, r))
        started++;
    reader(r);
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    free(tid);
    *ran = started + 1;
    return KILN_OK;
}

kiln_status kiln_load_run(const kiln_load_options *o, const kiln_load_item *items, int n,
                          kiln_load_stats *stats)
{
    double t0 = kiln_now();
    load_run r = { .o = o };
    *stats = (kiln_load_stats){ 0 };
    kiln_status st = units_make(&r, items, n);
    if (st != KILN_OK || r.n_units == 0) {
        free(r.units);
        return st;
    }
    pthread_mutex_init(&r.mu, NULL);
    pthread_mutex_init(&r.stream_mu, NULL);
    pthread_mutex_init(&r.big, NULL);
    pthread_cond_init(&r.freed, NULL);
    kiln_progress_start(&r.progress, o->quiet, 1.0, 0.1);
    int ran = 0;
    if ((st = files_open(&r)) == KILN_OK && (st = slots_create(&r)) == KILN_OK)
        st = readers_run(&r, &ran);
    if (st == KILN_OK && r.failed)
        st = kiln_fail(r.status, "%s", r.error);
    /* The copies queued read the slots: they land before the slots go. */
    kiln_status sync = kiln_cu_check(o->cu, o->cu->StreamSynchronize(o->stream),
                                     "weights: cuStreamSynchronize");
    if (st == KILN_OK)
        st = sync;
    slots_free(&r);
    files_close(&r);
    if (st == KILN_OK)
        progress_show(&r, 1);
    *stats = (kiln_load_stats){ .read_bytes = r.read_bytes,
                                .copied_bytes = r.copied_bytes,
                                .packed_bytes = r.packed_bytes,
                                .seconds = kiln_now() - t0,
                                .threads = ran,
                                .pinned = r.pinned };
    pthread_cond_destroy(&r.freed);
    pthread_mutex_destroy(&r.big);
    pthread_mutex_destroy(&r.stream_mu);
    pthread_mutex_destroy(&r.mu);
    free(r.units);
    return st;
}
