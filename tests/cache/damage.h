/* A tool that damages a real cache file the way disks, copies and hostile
 * hands do, for the suites that assert what kiln makes of it.
 *
 * kt_layout_read walks an intact cache file (LMDB 0.9's layout on a 64-bit
 * little-endian host, as cache/lmdbfile.c reads it) and notes what each page
 * is and where each record's own bytes lie. kt_damage_plan lists, from
 * that: a cut at every page boundary (and inside every overflow run); one
 * byte changed at every offset of the meta pages' fields and of every
 * branch and leaf page; the numbers LMDB follows changed on purpose (page
 * bounds, node offsets, node sizes and flags, child page numbers, overflow
 * page numbers and counts, key bytes); and changes at 1,000 seeded offsets
 * of the overflow runs. kt_damage_apply does one to a file on disk and
 * kt_damage_undo takes it back. */
#ifndef KILN_TEST_DAMAGE_H
#define KILN_TEST_DAMAGE_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
    KT_PAGE_UNUSED,
    KT_PAGE_META,
    KT_PAGE_BRANCH,
    KT_PAGE_LEAF,
    KT_PAGE_FREE_BRANCH,
    KT_PAGE_FREE_LEAF,
    KT_PAGE_OVERFLOW, /* the first page of a run: its header */
    KT_PAGE_OVERFLOW_DATA,
};

/* A record's own bytes: its node (header, key and value or overflow page
 * number) and, for a big value, the value in its overflow run. */
typedef struct kt_record_bytes {
    uint8_t key[16];
    uint64_t node_at, node_end;
    uint64_t value_at, value_end; /* 0, 0 for a value inside the node */
} kt_record_bytes;

typedef struct kt_layout {
    size_t psize;
    uint64_t pages;
    uint8_t *kind; /* per page */
    kt_record_bytes *records;
    size_t n_records;
} kt_layout;

typedef struct kt_damage {
    uint64_t at;  /* the byte changed; for a cut, the size left */
    uint8_t xor;  /* 0: a cut */
    char what[72];
} kt_damage;

static inline uint64_t kt_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void kt_layout_page(kt_layout *L, const uint8_t *f, uint64_t pgno, int free_db, int depth)
{
    const uint8_t *p = f + pgno * L->psize;
    int leaf = kt_le(p + 10, 2) == 2;
    L->kind[pgno] = free_db ? (leaf ? KT_PAGE_FREE_LEAF : KT_PAGE_FREE_BRANCH)
                            : (leaf ? KT_PAGE_LEAF : KT_PAGE_BRANCH);
    unsigned n = (unsigned)(kt_le(p + 12, 2) - 16) / 2;
    for (unsigned i = 0; i < n; i++) {
        uint64_t off = kt_le(p + 16 + 2 * i, 2);
        const uint8_t *node = p + off;
        uint64_t lo = kt_le(node, 2), hi = kt_le(node + 2, 2), flags = kt_le(node + 4, 2);
        uint64_t ksize = kt_le(node + 6, 2);
        if (!leaf) {
            kt_layout_page(L, f, lo | hi << 16 | flags << 32, free_db, depth + 1);
            continue;
        }
        uint64_t dsize = lo | hi << 16;
        kt_record_bytes r = { .node_at = pgno * L->psize + off };
        if (flags & 1) {
            uint64_t ov = kt_le(node + 8 + ksize, 8), pages = kt_le(f + ov * L->psize + 12, 4);
            L->kind[ov] = KT_PAGE_OVERFLOW;
            for (uint64_t q = 1; q < pages; q++)
                L->kind[ov + q] = KT_PAGE_OVERFLOW_DATA;
            r.node_end = r.node_at + 8 + ksize + 8;
            r.value_at = ov * L->psize + 16;
            r.value_end = r.value_at + dsize;
        } else {
            r.node_end = r.node_at + 8 + ksize + dsize;
        }
        if (!free_db && ksize == 16) {
            memcpy(r.key, node + 8, 16);
            L->records[L->n_records++] = r;
        }
    }
}

/* The layout of an intact file of size bytes. */
static inline void kt_layout_read(const uint8_t *f, size_t size, kt_layout *L)
{
    L->psize = (size_t)kt_le(f + 16 + 24, 4);
    L->pages = size / L->psize;
    L->kind = calloc(L->pages, 1);
    L->records = calloc(L->pages * L->psize / 24 + 1, sizeof *L->records);
    L->n_records = 0;
    L->kind[0] = L->kind[1] = KT_PAGE_META;
    const uint8_t *m0 = f + 16, *m1 = f + L->psize + 16;
    const uint8_t *m = kt_le(m0 + 128, 8) < kt_le(m1 + 128, 8) ? m1 : m0;
    for (int db = 0; db < 2; db++) {
        uint64_t root = kt_le(m + 24 + 48 * db + 40, 8);
        if (root != UINT64_MAX)
            kt_layout_page(L, f, root, db == 0, 0);
    }
}

static inline void kt_layout_free(kt_layout *L)
{
    free(L->kind);
    free(L->records);
}

typedef struct kt_plan {
    kt_damage *v;
    size_t n, cap;
} kt_plan;

static void kt_plan_add(kt_plan *P, uint64_t at, uint8_t xor, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void kt_plan_add(kt_plan *P, uint64_t at, uint8_t xor, const char *fmt, ...)
{
    if (P->n == P->cap) {
        P->cap = P->cap ? 2 * P->cap : 1024;
        P->v = realloc(P->v, P->cap * sizeof *P->v);
    }
    kt_damage *d = &P->v[P->n++];
    d->at = at;
    d->xor = xor;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->what, sizeof d->what, fmt, ap);
    va_end(ap);
}

static const char *const kt_page_names[] = {
    [KT_PAGE_UNUSED] = "unused", [KT_PAGE_META] = "meta", [KT_PAGE_BRANCH] = "branch",
    [KT_PAGE_LEAF] = "leaf", [KT_PAGE_FREE_BRANCH] = "free-list branch",
    [KT_PAGE_FREE_LEAF] = "free-list leaf", [KT_PAGE_OVERFLOW] = "overflow",
    [KT_PAGE_OVERFLOW_DATA] = "overflow data",
};

/* Every damage of the file, in a fixed order for a given seed. */
static inline kt_plan kt_damage_plan(const kt_layout *L, const uint8_t *f, size_t size, uint64_t seed)
{
    kt_plan P = { 0 };
    size_t ps = L->psize;
    for (uint64_t pg = 0; pg < L->pages; pg++) {
        kt_plan_add(&P, pg * ps, 0, "cut to %llu pages", (unsigned long long)pg);
        if (L->kind[pg] == KT_PAGE_OVERFLOW_DATA || pg < 2)
            kt_plan_add(&P, pg * ps + ps / 2, 0, "cut in the middle of page %llu",
                        (unsigned long long)pg);
    }
    kt_plan_add(&P, size - 1, 0, "cut the last byte");
    for (int m = 0; m < 2; m++)
        for (unsigned b = 0; b < 152; b++) {
            kt_plan_add(&P, m * ps + b, 0x01, "meta page %d byte %u ^ 0x01", m, b);
            kt_plan_add(&P, m * ps + b, 0x80, "meta page %d byte %u ^ 0x80", m, b);
        }
    for (uint64_t pg = 2; pg < L->pages; pg++) {
        int k = L->kind[pg];
        const uint8_t *p = f + pg * ps;
        if (k == KT_PAGE_OVERFLOW) {
            for (unsigned b = 0; b < 16; b++)
                kt_plan_add(&P, pg * ps + b, (uint8_t)(1u << (b % 8)), "overflow page %llu header byte %u",
                            (unsigned long long)pg, b);
            static const uint8_t counts[] = { 0x01, 0x02, 0x03, 0x80 };
            for (size_t c = 0; c < sizeof counts; c++)
                kt_plan_add(&P, pg * ps + 12, counts[c], "overflow page %llu: its page count ^ %#x",
                            (unsigned long long)pg, counts[c]);
            kt_plan_add(&P, pg * ps + 13, 0x01, "overflow page %llu: its page count + 256",
                        (unsigned long long)pg);
            continue;
        }
        if (k != KT_PAGE_BRANCH && k != KT_PAGE_LEAF && k != KT_PAGE_FREE_BRANCH &&
            k != KT_PAGE_FREE_LEAF)
            continue;
        /* Every offset, one bit each, the bit turning with the offset. */
        for (unsigned b = 0; b < ps; b++)
            kt_plan_add(&P, pg * ps + b, (uint8_t)(1u << (b % 8)), "%s page %llu byte %u",
                        kt_page_names[k], (unsigned long long)pg, b);
        /* The numbers LMDB follows, changed by more than a bit. */
        static const uint8_t big[] = { 0x02, 0x10, 0x40, 0xff };
        for (unsigned b = 12; b < 16; b++)
            for (size_t x = 0; x < sizeof big; x++)
                kt_plan_add(&P, pg * ps + b, big[x], "%s page %llu: bounds byte %u ^ %#x",
                            kt_page_names[k], (unsigned long long)pg, b, big[x]);
        unsigned n = (unsigned)(kt_le(p + 12, 2) - 16) / 2;
        for (unsigned i = 0; i < n; i++) {
            unsigned off = (unsigned)kt_le(p + 16 + 2 * i, 2);
            for (size_t x = 0; x < sizeof big; x++) {
                kt_plan_add(&P, pg * ps + 16 + 2 * i, big[x], "%s page %llu: node %u's offset ^ %#x",
                            kt_page_names[k], (unsigned long long)pg, i, big[x]);
                for (unsigned b = 0; b < 8; b++)
                    kt_plan_add(&P, pg * ps + off + b, big[x],
                                "%s page %llu: node %u header byte %u ^ %#x", kt_page_names[k],
                                (unsigned long long)pg, i, b, big[x]);
            }
            unsigned ksize = (unsigned)kt_le(p + off + 6, 2);
            for (unsigned b = 0; b < ksize; b++)
                kt_plan_add(&P, pg * ps + off + 8 + b, 0xff, "%s page %llu: node %u key byte %u",
                            kt_page_names[k], (unsigned long long)pg, i, b);
            if ((k == KT_PAGE_LEAF || k == KT_PAGE_FREE_LEAF) && (kt_le(p + off + 4, 2) & 1))
                for (unsigned b = 0; b < 8; b++)
                    kt_plan_add(&P, pg * ps + off + 8 + ksize + b, 0x01,
                                "%s page %llu: node %u overflow page number byte %u",
                                kt_page_names[k], (unsigned long long)pg, i, b);
        }
    }
    /* Overflow runs: 1,000 seeded offsets. */
    uint64_t ov = 0, s = seed | 1;
    for (uint64_t pg = 2; pg < L->pages; pg++)
        ov += L->kind[pg] == KT_PAGE_OVERFLOW || L->kind[pg] == KT_PAGE_OVERFLOW_DATA;
    for (int i = 0; ov && i < 1000; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        uint64_t nth = s % ov, at = 0;
        for (uint64_t pg = 2; pg < L->pages; pg++)
            if ((L->kind[pg] == KT_PAGE_OVERFLOW || L->kind[pg] == KT_PAGE_OVERFLOW_DATA) && !nth--) {
                at = pg * ps + (s >> 20) % ps;
                break;
            }
        kt_plan_add(&P, at, (uint8_t)(1 + (s >> 40) % 255), "overflow byte %llu (page %llu)",
                    (unsigned long long)at, (unsigned long long)(at / ps));
    }
    return P;
}

/* Whether d touches a record's own bytes (so a salvage may miss it). */
static inline int kt_damage_hits(const kt_damage *d, const kt_record_bytes *r)
{
    if (!d->xor)
        return d->at < r->node_end || d->at < r->value_end;
    return (d->at >= r->node_at && d->at < r->node_end) ||
           (d->at >= r->value_at && d->at < r->value_end);
}

/* Do d to the file fd holds; undo it from the intact bytes. */
static inline int kt_damage_apply(int fd, const kt_damage *d, const uint8_t *intact)
{
    if (!d->xor)
        return ftruncate(fd, (off_t)d->at);
    uint8_t b = intact[d->at] ^ d->xor;
    return pwrite(fd, &b, 1, (off_t)d->at) == 1 ? 0 : -1;
}

static inline int kt_damage_undo(int fd, const kt_damage *d, const uint8_t *intact, size_t size)
{
    if (!d->xor)
        return pwrite(fd, intact + d->at, size - d->at, (off_t)d->at) == (ssize_t)(size - d->at) ? 0 : -1;
    return pwrite(fd, intact + d->at, 1, (off_t)d->at) == 1 ? 0 : -1;
}

#endif
