/* LMDB's data file read without LMDB: the structural check every cache file
 * passes before LMDB maps it, and the page scan salvage copies records out
 * of a damaged file with.
 *
 * LMDB trusts its file: a page number past the end of a truncated file is a
 * SIGBUS, a damaged node offset or overflow count a read (or, in a write
 * transaction, a free) of the wrong bytes. So a file is read here with
 * pread, page by page, and every number LMDB would follow is checked before
 * it is followed: the meta pages (magic, version, page size, the txnid each
 * holds, the last page against the file's size), then both B-trees of the
 * meta LMDB would pick, from the root down. A page must lie in the file and
 * carry its own number and the flags its place in the tree implies; its
 * nodes must lie inside it, packed from mp_upper to its end as LMDB keeps
 * them, with keys in order and inside the range their parent gives them;
 * an overflow run must have the pages its value needs and lie in the file;
 * every page is reached at most once, counting the pages the free list
 * holds (which may lie past the end of the file: LMDB never wrote a page a
 * transaction took and gave back); a free list record must be keyed by a
 * committed transaction and list its pages in descending order; and the
 * tree's counts in the meta must be what the walk found. That is what
 * LMDB's reads and writes assume (mdb.c, LMDB 0.9: the layouts below, with
 * 64-bit page numbers and PAGEBASE 0).
 *
 * What the check cannot see is a byte that changes no structure: a key byte
 * (a record is bound to its key), a value byte (records carry checksums). */
#include "cache/cache_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if MDB_VERSION_MAJOR != 0 || MDB_VERSION_MINOR != 9
#error "the LMDB file check reads LMDB 0.9's data file format"
#endif
#if SIZE_MAX != UINT64_MAX || !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the LMDB file check reads the layout of 64-bit little-endian hosts"
#endif

/* mdb.c's layout. A page starts with its header; a meta page's MDB_meta
 * follows it; a branch or leaf page's node offsets (u16) follow it, and its
 * nodes are packed at its end. */
enum {
    PG_PGNO = 0,       /* u64 */
    PG_FLAGS = 10,     /* u16 */
    PG_LOWER = 12,     /* u16: end of the offsets */
    PG_UPPER = 14,     /* u16: start of the nodes */
    PG_PAGES = 12,     /* u32: an overflow run's length, in pages */
    PAGEHDRSZ = 16,

    P_BRANCH = 0x01,
    P_LEAF = 0x02,
    P_OVERFLOW = 0x04,
    P_META = 0x08,

    META_MAGIC = 16,   /* u32 */
    META_VERSION = 20, /* u32 */
    META_DBS = 40,     /* two MDB_db: the free list, then the main tree */
    META_LAST_PG = 136,
    META_TXNID = 144,
    META_END = 152,

    DB_PAD = 0,        /* u32: the page size, in the free list's MDB_db */
    DB_FLAGS = 4,      /* u16 */
    DB_DEPTH = 6,      /* u16 */
    DB_BRANCH = 8,
    DB_LEAF = 16,
    DB_OVERFLOW = 24,
    DB_ENTRIES = 32,
    DB_ROOT = 40,
    DB_SIZE = 48,

    NODE_LO = 0,
    NODE_HI = 2,
    NODE_FLAGS = 4,    /* also the top 16 bits of a branch node's page number */
    NODE_KSIZE = 6,
    NODESIZE = 8,
    F_BIGDATA = 0x01,

    FREE_DBI = 0,
    MAIN_DBI = 1,
    NUM_METAS = 2,
    CURSOR_STACK = 32, /* the deepest tree a cursor can walk */
    MAX_KEY = 511,     /* MDB_MAXKEYSIZE */
    MIN_PAGE = 512,
    MAX_PAGE = 0x8000,
};

#define MDB_MAGIC 0xBEEFC0DEu
#define MDB_DATA_VERSION 1u
#define P_INVALID UINT64_MAX
/* The free list's flags: MDB_INTEGERKEY, and the environment's persistent
 * flags, of which only MDB_NOSUBDIR may be set (MDB_FIXEDMAP would map the
 * file at an address the file names). */
#define FREE_FLAGS 0x08u
#define FREE_FLAGS_ALLOWED (0x08u | 0x4000u)

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ------------------------------------------------------------ reading */

typedef struct lf_file {
    const char *path;
    int fd;
    uint64_t size;  /* bytes */
    uint64_t pages; /* whole pages in the file */
    size_t psize;
    uint8_t *page;  /* a buffer per tree level, CURSOR_STACK + 1 of psize bytes */
} lf_file;

typedef struct lf_node {
    unsigned off, size;
} lf_node;

static kiln_status lf_read(const lf_file *f, uint64_t off, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(f->fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return kiln_fail(KILN_ERR_IO, "%s: cannot read: %s", f->path, strerror(errno));
        if (r == 0)
            return kiln_fail(KILN_ERR_CACHE, "%s: damaged: the file ends at byte %" PRIu64, f->path,
                             f->size);
        got += (size_t)r;
    }
    return KILN_OK;
}

static kiln_status lf_damaged(const lf_file *f, const char *fmt, ...) KILN_PRINTF(2, 3);
static kiln_status lf_damaged(const lf_file *f, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return kiln_fail(KILN_ERR_CACHE, "%s: damaged: %s", f->path, what);
}

static kiln_status lf_open(lf_file *f, const char *path)
{
    /* O_NONBLOCK: a FIFO is refused below, not waited on for a writer */
    *f = (lf_file){ .path = path, .fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK) };
    struct stat st;
    if (f->fd < 0)
        return kiln_fail(KILN_ERR_IO, "%s: %s", path, strerror(errno));
    if (fstat(f->fd, &st)) {
        kiln_status s = kiln_fail(KILN_ERR_IO, "%s: %s", path, strerror(errno));
        close(f->fd);
        return s;
    }
    if (!S_ISREG(st.st_mode)) {
        close(f->fd);
        return kiln_fail(KILN_ERR_IO, "%s: not a regular file", path);
    }
    f->size = (uint64_t)st.st_size;
    return KILN_OK;
}

static void lf_close(lf_file *f)
{
    if (f->fd >= 0)
        close(f->fd);
    free(f->page);
}

/* ------------------------------------------------------------ metas */

typedef struct lf_meta {
    uint8_t raw[META_END];
    uint64_t txnid, last_pg;
} lf_meta;

static const uint8_t *meta_db(const lf_meta *m, int dbi) { return m->raw + META_DBS + dbi * DB_SIZE; }

/* Meta page i, with what can be checked of it alone. Page 1 lies one page
 * size on, which page 0 gives. */
static kiln_status meta_read(lf_file *f, int i, lf_meta *m)
{
    uint64_t off = (uint64_t)i * f->psize;
    if (f->size < off + META_END)
        return lf_damaged(f, "%" PRIu64 " bytes, too short for meta page %d", f->size, i);
    kiln_status st = lf_read(f, off, m->raw, META_END);
    if (st)
        return st;
    if (le(m->raw + PG_PGNO, 8) != (uint64_t)i || !(le(m->raw + PG_FLAGS, 2) & P_META))
        return lf_damaged(f, "page %d is not a meta page", i);
    if (le(m->raw + META_MAGIC, 4) != MDB_MAGIC)
        return lf_damaged(f, "meta page %d: no LMDB magic", i);
    if (le(m->raw + META_VERSION, 4) != MDB_DATA_VERSION)
        return lf_damaged(f, "meta page %d: data version %u, LMDB writes %u", i,
                          (unsigned)le(m->raw + META_VERSION, 4), MDB_DATA_VERSION);
    uint64_t psize = le(meta_db(m, FREE_DBI) + DB_PAD, 4);
    if (psize < MIN_PAGE || psize > MAX_PAGE || (psize & (psize - 1)))
        return lf_damaged(f, "meta page %d: page size %" PRIu64, i, psize);
    if (i == 0)
        f->psize = (size_t)psize;
    else if (psize != f->psize)
        return lf_damaged(f, "meta page 1: page size %" PRIu64 ", meta page 0 says %zu", psize,
                          f->psize);
    m->txnid = le(m->raw + META_TXNID, 8);
    m->last_pg = le(m->raw + META_LAST_PG, 8);
    /* LMDB writes transaction t's meta to page t % 2; both start at 0. */
    if (m->txnid && m->txnid % 2 != (uint64_t)i)
        return lf_damaged(f, "meta page %d: txnid %" PRIu64 " belongs on page %d", i, m->txnid,
                          (int)(m->txnid % 2));
    unsigned ff = (unsigned)le(meta_db(m, FREE_DBI) + DB_FLAGS, 2);
    unsigned mf = (unsigned)le(meta_db(m, MAIN_DBI) + DB_FLAGS, 2);
    if ((ff & ~FREE_FLAGS_ALLOWED) || !(ff & FREE_FLAGS) || mf)
        return lf_damaged(f, "meta page %d: database flags %#x and %#x", i, ff, mf);
    return KILN_OK;
}

/* Whether LMDB itself refuses the file before it maps it: page 0 too short
 * for a meta page, or not one of its version (mdb_env_read_header). */
static int lmdb_refuses(const lf_file *f)
{
    uint8_t h[META_END];
    return f->size < META_END || lf_read(f, 0, h, sizeof h) || !(le(h + PG_FLAGS, 2) & P_META) ||
           le(h + META_MAGIC, 4) != MDB_MAGIC || le(h + META_VERSION, 4) != MDB_DATA_VERSION;
}

/* Whether a meta page's header is anywhere LMDB could have put page 1:
 * page 0's damage then is damage, not a file that never was LMDB's. */
static int meta_anywhere(const lf_file *f)
{
    for (uint64_t off = MIN_PAGE; off <= MAX_PAGE; off *= 2) {
        uint8_t h[META_END];
        if (f->size >= off + META_END && !lf_read(f, off, h, sizeof h) &&
            (le(h + PG_FLAGS, 2) & P_META) && le(h + META_MAGIC, 4) == MDB_MAGIC)
            return 1;
    }
    return 0;
}

/* ------------------------------------------------------------ trees */

typedef struct lf_key {
    const uint8_t *p; /* NULL: unbounded */
    size_t n;
} lf_key;

typedef struct lf_walk {
    lf_file *f;
    uint64_t last_pg, txnid;
    uint8_t *seen;  /* a bit per page up to last_pg */
    int dbi;        /* the tree walked; -1 for the pages the free list holds */
    unsigned depth;
    uint64_t branch, leaf, overflow, entries;
    lf_node *nodes; /* scratch: one page's nodes */
    /* The free list's page numbers, read after the walk of its tree. */
    uint64_t *free_ids;
    size_t n_free, cap_free;
} lf_walk;

static const char *const db_names[] = { "the free list", "the records' tree" };

/* LMDB's order: the main tree compares bytes, then lengths (mdb_cmp_memn);
 * the free list's keys are native size_t (mdb_cmp_long). */
static int key_cmp(int dbi, const uint8_t *a, size_t an, const uint8_t *b, size_t bn)
{
    if (dbi == FREE_DBI) {
        uint64_t x = le(a, 8), y = le(b, 8);
        return x < y ? -1 : x > y;
    }
    int c = memcmp(a, b, an < bn ? an : bn);
    return c ? c : an < bn ? -1 : an > bn;
}

/* Take pages pgno..pgno+n-1 for what: in range, and not taken before. A
 * page the trees use must be in the file; the free list may also hold the
 * pages past its end up to the last page (LMDB writes a page only when it
 * is used: pages a transaction took and gave back are never written). */
static kiln_status mark(lf_walk *w, uint64_t pgno, uint64_t n, const char *what, uint64_t from)
{
    uint64_t last = w->dbi < 0 || w->f->pages == 0 || w->f->pages - 1 > w->last_pg
                        ? w->last_pg
                        : w->f->pages - 1;
    if (pgno < NUM_METAS || pgno > last || n > last - pgno + 1)
        return lf_damaged(w->f, "%s: page %" PRIu64 " (+%" PRIu64 ") lies outside pages 2..%" PRIu64
                          " (from page %" PRIu64 ")",
                          what, pgno, n, last, from);
    for (uint64_t p = pgno; p < pgno + n; p++) {
        if (w->seen[p / 8] & (1u << (p % 8)))
            return lf_damaged(w->f, "%s: page %" PRIu64 " is used twice (from page %" PRIu64 ")",
                              what, p, from);
        w->seen[p / 8] |= (uint8_t)(1u << (p % 8));
    }
    return KILN_OK;
}

/* A value's bytes as LMDB would hand them out: in the node, or in the
 * overflow run the node names. Only the free list's values are read (its
 * page lists); a record's are the record layer's to check. */
static kiln_status leaf_value(lf_walk *w, uint64_t pgno, const uint8_t *node, size_t ksize,
                              uint64_t dsize, uint8_t **out)
{
    const uint8_t *data = node + NODESIZE + ksize;
    *out = NULL;
    if (!(le(node + NODE_FLAGS, 2) & F_BIGDATA)) {
        if (w->dbi == FREE_DBI && !(*out = kiln_malloc(dsize ? dsize : 1)))
            return kiln_fail(KILN_ERR_NOMEM, "%s: check: out of memory", w->f->path);
        if (*out)
            memcpy(*out, data, dsize);
        return KILN_OK;
    }
    uint64_t ov = le(data, 8), psize = w->f->psize;
    /* OVPAGES: the header and the value, in whole pages. A run can be
     * longer: LMDB rewrites a shorter value into the run it has. */
    uint64_t need = (PAGEHDRSZ - 1 + dsize) / psize + 1, pages;
    uint8_t hdr[PAGEHDRSZ];
    kiln_status st = KILN_OK;
    if (ov < NUM_METAS || ov > w->last_pg)
        return lf_damaged(w->f, "page %" PRIu64 ": a value on page %" PRIu64 ", outside pages 2..%" PRIu64,
                          pgno, ov, w->last_pg);
    if ((st = lf_read(w->f, ov * psize, hdr, sizeof hdr)))
        return st;
    pages = le(hdr + PG_PAGES, 4);
    if (le(hdr + PG_PGNO, 8) != ov || le(hdr + PG_FLAGS, 2) != P_OVERFLOW || pages < need)
        return lf_damaged(w->f,
                          "page %" PRIu64 ": not an overflow run of the %" PRIu64
                          " pages a %" PRIu64 "-byte value of page %" PRIu64 " needs",
                          ov, need, dsize, pgno);
    if ((st = mark(w, ov, pages, "an overflow run", pgno)))
        return st;
    w->overflow += pages;
    if (w->dbi != FREE_DBI)
        return KILN_OK;
    if (!(*out = kiln_malloc(dsize ? dsize : 1)))
        return kiln_fail(KILN_ERR_NOMEM, "%s: check: out of memory", w->f->path);
    return lf_read(w->f, ov * psize + PAGEHDRSZ, *out, dsize);
}

/* A free list record: a count, then that many page numbers (the record may
 * be longer than they need). They are marked once the trees are walked. */
static kiln_status free_record(lf_walk *w, uint64_t pgno, const uint8_t *v, uint64_t size)
{
    uint64_t n = size >= 8 ? le(v, 8) : 0;
    if (size < 8 || size % 8 || n > size / 8 - 1)
        return lf_damaged(w->f, "page %" PRIu64 ": a free list record of %" PRIu64
                          " bytes that says %" PRIu64 " pages",
                          pgno, size, n);
    if (w->n_free + n > w->cap_free) {
        size_t cap = w->cap_free ? w->cap_free : 256;
        while (cap < w->n_free + n)
            cap *= 2;
        uint64_t *ids = kiln_realloc(w->free_ids, cap * sizeof *ids);
        if (!ids)
            return kiln_fail(KILN_ERR_NOMEM, "%s: check: out of memory", w->f->path);
        w->free_ids = ids;
        w->cap_free = cap;
    }
    /* Descending, as LMDB merges them (mdb_midl_xmerge): out of order,
     * the merge loses some and repeats others. */
    for (uint64_t i = 0; i < n; i++) {
        uint64_t id = le(v + 8 * (i + 1), 8);
        if (i && id >= w->free_ids[w->n_free - 1])
            return lf_damaged(w->f, "page %" PRIu64 ": a free list record's pages out of order",
                              pgno);
        w->free_ids[w->n_free++] = id;
    }
    return KILN_OK;
}

/* Node i of a page whose offsets were checked. */
static const uint8_t *node_at(const uint8_t *p, unsigned i)
{
    return p + le(p + PAGEHDRSZ + 2 * i, 2);
}

static int node_by_offset(const void *a, const void *b)
{
    const lf_node *x = a, *y = b;
    return (x->off > y->off) - (x->off < y->off);
}

/* The page at pgno, level levels below the root, whose keys must lie in
 * [lo, hi). */
static kiln_status walk_page(lf_walk *w, uint64_t pgno, uint64_t from, unsigned level, lf_key lo,
                             lf_key hi)
{
    lf_file *f = w->f;
    kiln_status st = mark(w, pgno, 1, db_names[w->dbi], from);
    if (st)
        return st;
    uint8_t *p = f->page + (size_t)level * f->psize;
    if ((st = lf_read(f, pgno * f->psize, p, f->psize)))
        return st;
    unsigned want = level + 1 < w->depth ? P_BRANCH : P_LEAF;
    unsigned flags = (unsigned)le(p + PG_FLAGS, 2);
    unsigned lower = (unsigned)le(p + PG_LOWER, 2), upper = (unsigned)le(p + PG_UPPER, 2);
    if (le(p + PG_PGNO, 8) != pgno)
        return lf_damaged(f, "page %" PRIu64 " says it is page %" PRIu64, pgno, le(p + PG_PGNO, 8));
    if (flags != want)
        return lf_damaged(f, "page %" PRIu64 ": flags %#x, %s at depth %u of %u needs %#x", pgno,
                          flags, db_names[w->dbi], level + 1, w->depth, want);
    unsigned n = lower >= PAGEHDRSZ ? (lower - PAGEHDRSZ) / 2 : 0;
    /* LMDB asserts a branch of the records' tree has two children. */
    unsigned min = want == P_BRANCH && w->dbi == MAIN_DBI ? 2 : 1;
    if (lower < PAGEHDRSZ || (lower - PAGEHDRSZ) % 2 || upper < lower || upper > f->psize || n < min)
        return lf_damaged(f, "page %" PRIu64 ": node bounds %u..%u of %zu bytes", pgno, lower,
                          upper, f->psize);
    lf_node *nodes = w->nodes;
    /* Every node lies inside the page; together they fill it from upper to
     * its end (LMDB packs them there and moves them up when one goes). */
    for (unsigned i = 0; i < n; i++) {
        unsigned off = (unsigned)le(p + PAGEHDRSZ + 2 * i, 2), size;
        if (off % 2 || off < upper || off > f->psize - NODESIZE)
            return lf_damaged(f, "page %" PRIu64 ": node %u at offset %u", pgno, i, off);
        const uint8_t *node = p + off;
        unsigned ksize = (unsigned)le(node + NODE_KSIZE, 2);
        uint64_t dsize = le(node + NODE_LO, 2) | le(node + NODE_HI, 2) << 16;
        unsigned nflags = (unsigned)le(node + NODE_FLAGS, 2);
        if (want == P_BRANCH)
            size = NODESIZE + ksize;
        else if (nflags == F_BIGDATA)
            size = NODESIZE + ksize + 8;
        else if (nflags == 0 && dsize <= f->psize)
            size = NODESIZE + ksize + (unsigned)dsize;
        else
            return lf_damaged(f, "page %" PRIu64 ": node %u: flags %#x, %" PRIu64 " bytes of data",
                              pgno, i, nflags, dsize);
        if (ksize > MAX_KEY || size > f->psize - off)
            return lf_damaged(f, "page %" PRIu64 ": node %u of %u bytes at offset %u", pgno, i, size,
                              off);
        nodes[i] = (lf_node){ off, size + size % 2 };
    }
    qsort(nodes, n, sizeof *nodes, node_by_offset);
    for (unsigned i = 0, at = upper; i < n; at = nodes[i].off + nodes[i].size, i++)
        if (nodes[i].off != at || (i + 1 == n && nodes[i].off + nodes[i].size != f->psize))
            return lf_damaged(f, "page %" PRIu64 ": its nodes do not fill bytes %u..%zu", pgno,
                              upper, f->psize);

    /* Keys ascend, inside [lo, hi). A branch's first key is never compared
     * (LMDB searches from the second), so it is not checked. */
    for (unsigned i = want == P_BRANCH; i < n; i++) {
        const uint8_t *node = node_at(p, i), *k = node + NODESIZE;
        size_t ks = (size_t)le(node + NODE_KSIZE, 2);
        if (w->dbi == FREE_DBI && ks != 8)
            return lf_damaged(f, "page %" PRIu64 ": a free list key of %zu bytes", pgno, ks);
        /* A free list key is the transaction that freed the pages, one
         * that committed: 1..txnid. LMDB looks a record keyed 0 up again
         * in every allocation, handing its pages out twice. */
        if (w->dbi == FREE_DBI && (le(k, 8) == 0 || le(k, 8) > w->txnid))
            return lf_damaged(f, "page %" PRIu64 ": a free list record of transaction %" PRIu64
                              ", outside 1..%" PRIu64,
                              pgno, le(k, 8), w->txnid);
        const uint8_t *prev = i > (want == P_BRANCH) ? node_at(p, i - 1) : NULL;
        if ((prev && key_cmp(w->dbi, prev + NODESIZE, (size_t)le(prev + NODE_KSIZE, 2), k, ks) >= 0) ||
            (lo.p && key_cmp(w->dbi, k, ks, lo.p, lo.n) < 0) ||
            (hi.p && key_cmp(w->dbi, k, ks, hi.p, hi.n) >= 0))
            return lf_damaged(f, "page %" PRIu64 ": key %u is out of order", pgno, i);
    }
    if (want == P_LEAF) {
        w->leaf++;
        w->entries += n;
        for (unsigned i = 0; i < n; i++) {
            const uint8_t *node = node_at(p, i);
            size_t ks = (size_t)le(node + NODE_KSIZE, 2);
            uint64_t dsize = le(node + NODE_LO, 2) | le(node + NODE_HI, 2) << 16;
            uint8_t *v;
            if ((st = leaf_value(w, pgno, node, ks, dsize, &v)))
                return st;
            if (v)
                st = free_record(w, pgno, v, dsize);
            free(v);
            if (st)
                return st;
        }
        return KILN_OK;
    }
    w->branch++;
    /* A child's bounds point into this page's buffer, which the walks
     * below it (one buffer per level) leave alone. */
    for (unsigned i = 0; i < n; i++) {
        const uint8_t *node = node_at(p, i);
        uint64_t child = le(node + NODE_LO, 2) | le(node + NODE_HI, 2) << 16 |
                         le(node + NODE_FLAGS, 2) << 32;
        lf_key clo = lo, chi = hi;
        if (i > 0)
            clo = (lf_key){ node + NODESIZE, (size_t)le(node + NODE_KSIZE, 2) };
        if (i + 1 < n) {
            const uint8_t *next = node_at(p, i + 1);
            chi = (lf_key){ next + NODESIZE, (size_t)le(next + NODE_KSIZE, 2) };
        }
        if ((st = walk_page(w, child, pgno, level + 1, clo, chi)))
            return st;
    }
    return KILN_OK;
}

static kiln_status walk_tree(lf_walk *w, const lf_meta *m, int dbi)
{
    const uint8_t *db = meta_db(m, dbi);
    uint64_t root = le(db + DB_ROOT, 8);
    w->dbi = dbi;
    w->depth = (unsigned)le(db + DB_DEPTH, 2);
    w->branch = w->leaf = w->overflow = w->entries = 0;
    kiln_status st = KILN_OK;
    if (root == P_INVALID) {
        if (w->depth)
            return lf_damaged(w->f, "%s is empty but %u deep", db_names[dbi], w->depth);
    } else if (w->depth < 1 || w->depth > CURSOR_STACK) {
        return lf_damaged(w->f, "%s is %u deep", db_names[dbi], w->depth);
    } else if ((st = walk_page(w, root, 0, 0, (lf_key){ 0 }, (lf_key){ 0 }))) {
        return st;
    }
    const struct {
        const char *what;
        int at;
        uint64_t found;
    } counts[] = {
        { "branch pages", DB_BRANCH, w->branch },
        { "leaf pages", DB_LEAF, w->leaf },
        { "overflow pages", DB_OVERFLOW, w->overflow },
        { "entries", DB_ENTRIES, w->entries },
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(counts); i++)
        if (le(db + counts[i].at, 8) != counts[i].found)
            return lf_damaged(w->f, "%s: the meta page counts %" PRIu64 " %s, the tree has %" PRIu64,
                              db_names[dbi], le(db + counts[i].at, 8), counts[i].what,
                              counts[i].found);
    return KILN_OK;
}

kiln_status kiln_cache_file_check(const char *path, kiln_cache_check *out)
{
    lf_file f;
    lf_meta m[NUM_METAS] = { 0 };
    lf_walk w = { 0 };
    kiln_status st = lf_open(&f, path);
    if (st)
        return st;
    *out = (kiln_cache_check){ 0 };
    if (f.size == 0) {
        lf_close(&f);
        return KILN_OK;
    }
    for (int i = 0; i < NUM_METAS && !st; i++)
        st = meta_read(&f, i, &m[i]);
    /* A file with no meta page at all is not a damaged cache: LMDB says
     * what it is, and it says so before it maps anything. */
    if (st == KILN_ERR_CACHE && !f.psize && lmdb_refuses(&f) && !meta_anywhere(&f)) {
        out->not_lmdb = 1;
        st = kiln_fail(KILN_ERR_CACHE, "%s: not an LMDB file", path);
    }
    /* LMDB uses the meta of the later transaction (page 0 on a tie); the
     * other holds the one before it. A txnid that changed would have LMDB
     * read an older tree, or the newer one as older. */
    const lf_meta *use = &m[m[0].txnid < m[1].txnid];
    uint64_t t0 = m[0].txnid, t1 = m[1].txnid;
    if (!st && t0 != t1 && (t0 > t1 ? t0 - t1 : t1 - t0) != 1)
        st = lf_damaged(&f, "the meta pages hold txnids %" PRIu64 " and %" PRIu64
                        ", not two in a row",
                        t0, t1);
    /* Pages past the end of the file are free pages, each listed in the
     * free list by 8 bytes that are in the file. */
    if (!st && (use->last_pg < NUM_METAS - 1 || f.size / f.psize < NUM_METAS ||
                use->last_pg >= f.size / f.psize + f.size / 8))
        st = lf_damaged(&f, "%" PRIu64 " bytes hold %" PRIu64 " pages of %zu bytes, the meta page "
                        "says pages 0..%" PRIu64,
                        f.size, f.size / f.psize, f.psize, use->last_pg);
    if (!st) {
        f.pages = f.size / f.psize;
        w.f = &f;
        w.last_pg = use->last_pg;
        w.txnid = use->txnid;
        w.seen = kiln_calloc((size_t)(use->last_pg / 8 + 1), 1);
        f.page = kiln_malloc((size_t)(CURSOR_STACK + 1) * f.psize);
        w.nodes = kiln_malloc(f.psize / 2 * sizeof *w.nodes);
        if (!w.seen || !f.page || !w.nodes)
            st = kiln_fail(KILN_ERR_NOMEM, "%s: check: out of memory", path);
        else
            w.seen[0] = 3; /* the meta pages */
    }
    if (!st)
        st = walk_tree(&w, use, FREE_DBI);
    if (!st)
        st = walk_tree(&w, use, MAIN_DBI);
    w.dbi = -1; /* the free list's own pages */
    for (size_t i = 0; !st && i < w.n_free; i++)
        st = mark(&w, w.free_ids[i], 1, "the free list's pages", 0);
    if (!st) {
        out->txnid = use->txnid;
        out->psize = f.psize;
        out->pages = use->last_pg + 1;
        out->records = le(meta_db(use, MAIN_DBI) + DB_ENTRIES, 8);
    }
    free(w.seen);
    free(w.nodes);
    free(w.free_ids);
    lf_close(&f);
    return st;
}

/* ------------------------------------------------------------ salvage */

/* The scan trusts no page header, offset array or tree: a record is found
 * by its own node, at any even offset of any page: a node header of kiln's
 * key size and a value, in the page or in the overflow run the node names,
 * that starts with a record's magic; a manifest or a tuning table the same
 * way, by its key and its magic. What it finds is only a candidate; the
 * caller checks each against its key (a record's checksum covers it) or
 * its checksum (a named value's). */
#define MANIFEST_KEY_BYTES (sizeof KILN_CACHE_MANIFEST_KEY - 1)
#define TUNING_KEY_BYTES (sizeof KILN_CACHE_TUNING_KEY - 1)
_Static_assert(TUNING_KEY_BYTES < MANIFEST_KEY_BYTES &&
                   MANIFEST_KEY_BYTES < KILN_CACHE_KEY_BYTES, "the scan's shortest node");
enum { SCAN_NODE = NODESIZE + TUNING_KEY_BYTES };

static kiln_status scan_node(lf_file *f, const uint8_t *page, unsigned off, kiln_cache_scan_fn fn,
                             void *ctx)
{
    const uint8_t *node = page + off, *key = node + NODESIZE;
    const unsigned ksize = (unsigned)le(node + NODE_KSIZE, 2);
    const char *magic;
    if (ksize == KILN_CACHE_KEY_BYTES)
        magic = "KLNR";
    else if (ksize == MANIFEST_KEY_BYTES && off + NODESIZE + ksize <= f->psize &&
             !memcmp(key, KILN_CACHE_MANIFEST_KEY, ksize))
        magic = "KLNM";
    else if (ksize == TUNING_KEY_BYTES && off + NODESIZE + ksize <= f->psize &&
             !memcmp(key, KILN_CACHE_TUNING_KEY, ksize))
        magic = "KLNT";
    else
        return KILN_OK;
    const unsigned end = off + NODESIZE + ksize; /* the value's offset in the page */
    unsigned nflags = (unsigned)le(node + NODE_FLAGS, 2);
    uint64_t dsize = le(node + NODE_LO, 2) | le(node + NODE_HI, 2) << 16;
    if (nflags == 0) {
        if (end > f->psize || dsize < 4 || dsize > f->psize - end || memcmp(page + end, magic, 4))
            return KILN_OK;
        return fn(ctx, key, ksize, page + end, (size_t)dsize);
    }
    if (nflags != F_BIGDATA || end + 8 > f->psize || dsize < 4)
        return KILN_OK;
    uint64_t ov = le(page + end, 8), at;
    uint8_t head[4];
    if (ov < NUM_METAS || ov >= f->pages || __builtin_mul_overflow(ov, (uint64_t)f->psize, &at) ||
        at + PAGEHDRSZ > f->size || dsize > f->size - at - PAGEHDRSZ ||
        lf_read(f, at + PAGEHDRSZ, head, 4) || memcmp(head, magic, 4))
        return KILN_OK;
    uint8_t *v = kiln_malloc(dsize);
    if (!v)
        return kiln_fail(KILN_ERR_NOMEM, "%s: salvage: out of memory for %" PRIu64 " bytes", f->path,
                         dsize);
    kiln_status st = lf_read(f, at + PAGEHDRSZ, v, dsize);
    if (!st)
        st = fn(ctx, key, ksize, v, (size_t)dsize);
    free(v);
    return st;
}

kiln_status kiln_cache_file_scan(const char *path, kiln_cache_scan_fn fn, void *ctx)
{
    lf_file f;
    lf_meta m;
    kiln_status st = lf_open(&f, path);
    if (st)
        return st;
    /* The page size page 0 gives, else LMDB's usual one. */
    f.psize = 4096;
    (void)meta_read(&f, 0, &m);
    f.pages = f.size / f.psize;
    uint8_t *p = kiln_malloc(f.psize);
    if (!p) {
        lf_close(&f);
        return kiln_fail(KILN_ERR_NOMEM, "%s: salvage: out of memory", path);
    }
    for (uint64_t pgno = NUM_METAS; pgno < f.pages && !st; pgno++) {
        if ((st = lf_read(&f, pgno * f.psize, p, f.psize)))
            break;
        for (unsigned off = PAGEHDRSZ; off + SCAN_NODE <= f.psize && !st; off += 2)
            st = scan_node(&f, p, off, fn, ctx);
    }
    free(p);
    lf_close(&f);
    return st;
}
