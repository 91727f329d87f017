#include "graph/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Tensor bytes are used in place, and safetensors stores them little-endian. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the safetensors reader needs a little-endian host"
#endif

/* The reference implementation's bound on the header: anything larger is
 * damage or an attempt to make the reader allocate without limit. */
#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)
#define ST_MAX_DIMS 4
/* The only FP8 block and NVFP4 group kiln's formats define. */
#define ST_FP8_BLOCK 128
#define ST_NVFP4_GROUP 16
#define ST_MXFP4_BLOCK 32

typedef enum st_dtype {
    ST_F32, ST_F16, ST_BF16, ST_F8_E4M3, ST_U8, ST_I8,
    ST_F64, ST_I64, ST_U64, ST_I32, ST_U32, ST_I16, ST_U16, ST_BOOL,
    ST_F8_E5M2, ST_F8_E8M0, ST_F6_E2M3, ST_F6_E3M2, ST_F4, ST_C64,
    ST_DTYPE_COUNT /* also: a dtype name kiln does not know */
} st_dtype;

typedef struct st_dtype_info {
    const char *name;
    int bits;  /* per element; sub-byte types pack along the tensor */
    int raw;   /* kiln reads its bytes: plain, or inside a quantized weight */
    int plain; /* usable on its own, as `format` */
    kiln_format format;
} st_dtype_info;

static const st_dtype_info st_dtypes[] = {
    [ST_F32] = { "F32", 32, 1, 1, KILN_FMT_F32 },
    [ST_F16] = { "F16", 16, 1, 1, KILN_FMT_F16 },
    [ST_BF16] = { "BF16", 16, 1, 1, KILN_FMT_BF16 },
    [ST_F8_E4M3] = { "F8_E4M3", 8, 1, 0, 0 },
    [ST_U8] = { "U8", 8, 1, 0, 0 },
    [ST_I8] = { "I8", 8, 1, 0, 0 },
    [ST_F64] = { "F64", 64, 0, 0, 0 },
    [ST_I64] = { "I64", 64, 0, 0, 0 },
    [ST_U64] = { "U64", 64, 0, 0, 0 },
    [ST_I32] = { "I32", 32, 0, 0, 0 },
    [ST_U32] = { "U32", 32, 0, 0, 0 },
    [ST_I16] = { "I16", 16, 0, 0, 0 },
    [ST_U16] = { "U16", 16, 0, 0, 0 },
    [ST_BOOL] = { "BOOL", 8, 0, 0, 0 },
    [ST_F8_E5M2] = { "F8_E5M2", 8, 0, 0, 0 },
    [ST_F8_E8M0] = { "F8_E8M0", 8, 0, 0, 0 },
    [ST_F6_E2M3] = { "F6_E2M3", 6, 0, 0, 0 },
    [ST_F6_E3M2] = { "F6_E3M2", 6, 0, 0, 0 },
    [ST_F4] = { "F4", 4, 0, 0, 0 },
    [ST_C64] = { "C64", 64, 0, 0, 0 },
};
_Static_assert(KILN_ARRAY_LEN(st_dtypes) == ST_DTYPE_COUNT, "one row per safetensors dtype");

/* config.json keys read into the hyper-parameters; all non-negative integers. */
static const struct st_hp_key {
    const char *key;
    size_t offset;
} st_hp_keys[] = {
    { "num_hidden_layers", offsetof(kiln_model_hparams, n_layers) },
    { "hidden_size", offsetof(kiln_model_hparams, d_model) },
    { "intermediate_size", offsetof(kiln_model_hparams, d_ffn) },
    { "num_attention_heads", offsetof(kiln_model_hparams, n_heads) },
    { "num_key_value_heads", offsetof(kiln_model_hparams, n_kv_heads) },
    { "vocab_size", offsetof(kiln_model_hparams, vocab) },
    { "max_position_embeddings", offsetof(kiln_model_hparams, ctx) },
};

/* The two spellings of gpt-oss's MXFP4 pair: Hugging Face's and the original
 * checkpoint's. */
static const struct st_mx_suffix {
    const char *blocks, *scales;
} st_mx_suffixes[] = {
    { "_blocks", "_scales" },
    { ".blocks", ".scales" },
};

typedef struct st_map {
    char *path;
    void *base;
    size_t size;
} st_map;

/* What the model keeps: the mappings, and the aligned copies of tensors the
 * file stores at an offset their element type cannot be read from. */
typedef struct st_impl {
    st_map *maps;
    int n_maps, cap_maps;
    void **owned;
    int n_owned, cap_owned;
} st_impl;

typedef struct st_slot {
    kiln_model_tensor t;
    st_dtype dtype;
    int rank;                   /* as stored; more than 4 dims are folded into shape[0] */
    int64_t shape[ST_MAX_DIMS]; /* outermost first, as in the file */
    size_t begin, end;          /* within the data section */
    const uint8_t *data;
    const char *file;           /* the path of its map */
    int insert_before;          /* a joined MXFP4 weight: listed before this slot; else -1 */
} st_slot;

/* Quantization settings from config.json or hf_quant_config.json. */
typedef struct st_quant {
    int64_t block_rows, block_cols; /* fp8 weight_block_size; 0 when not given */
    int64_t nvfp4_group;            /* ModelOpt NVFP4 group_size; 0 when not given */
} st_quant;

typedef struct st_loader {
    char *dir;
    st_impl *impl;
    st_slot *v;
    int n, cap;
    json_t *names; /* tensor name -> slot index */
    int n_stored;  /* slots from the files; joined MXFP4 weights follow */
    st_quant q;
    kiln_model_hparams hp;
    int n_shards;
} st_loader;

static int st_grow(void **v, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return 1;
    int c = *cap ? *cap : 8;
    while (c < need) {
        if (c > INT32_MAX / 2)
            return 0;
        c *= 2;
    }
    size_t bytes;
    if (!kiln_mul_size((size_t)c, elem, &bytes))
        return 0;
    void *p = realloc(*v, bytes);
    if (!p)
        return 0;
    *v = p;
    *cap = c;
    return 1;
}

static char *st_vstrdupf(const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int len = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    char *s = len < 0 ? NULL : malloc((size_t)len + 1);
    if (s)
        vsnprintf(s, (size_t)len + 1, fmt, ap);
    return s;
}

static char *st_strdupf(const char *fmt, ...) KILN_PRINTF(1, 2);
static char *st_strdupf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = st_vstrdupf(fmt, ap);
    va_end(ap);
    return s;
}

static kiln_status st_nomem(void) { return kiln_fail(KILN_ERR_NOMEM, "safetensors: out of memory"); }

/* Mark slot unusable and say why (replacing an earlier reason). */
static kiln_status st_refuse(st_slot *s, const char *fmt, ...) KILN_PRINTF(2, 3);
static kiln_status st_refuse(st_slot *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *why = st_vstrdupf(fmt, ap);
    va_end(ap);
    if (!why)
        return st_nomem();
    free(s->t.why);
    s->t.why = why;
    s->t.supported = 0;
    return KILN_OK;
}

static void st_impl_free(void *p)
{
    st_impl *impl = p;
    if (!impl)
        return;
    for (int i = 0; i < impl->n_maps; i++) {
        munmap(impl->maps[i].base, impl->maps[i].size);
        free(impl->maps[i].path);
    }
    for (int i = 0; i < impl->n_owned; i++)
        free(impl->owned[i]);
    free(impl->maps);
    free(impl->owned);
    free(impl);
}

static void st_tensor_free(kiln_model_tensor *t)
{
    free(t->name);
    free(t->type_name);
    free(t->why);
}

static char *st_join_path(const char *dir, const char *name) { return st_strdupf("%s/%s", dir, name); }

static int st_ends_with(const char *s, const char *suffix)
{
    size_t ls = strlen(s), lx = strlen(suffix);
    return ls >= lx && !strcmp(s + ls - lx, suffix);
}

static void st_shape_str(const st_slot *s, char *buf, size_t len)
{
    size_t at = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < s->rank && i < ST_MAX_DIMS && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%" PRId64, i ? ", " : "", s->shape[i]);
    if (at < len)
        snprintf(buf + at, len - at, "]");
}

static int64_t st_numel(const st_slot *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->rank && i < ST_MAX_DIMS; i++)
        n *= s->shape[i];
    return n;
}

/* ceil(a / b) without the overflow of (a + b - 1) / b. */
static int64_t st_ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

/* ------------------------------------------------------------ file access */

static kiln_status st_open_regular(const char *path, int *fd_out, size_t *size_out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return kiln_fail(KILN_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return kiln_fail(KILN_ERR_IO, "%s: not a regular file", path);
    }
    *fd_out = fd;
    *size_out = (size_t)sb.st_size;
    return KILN_OK;
}

/* Map a shard read-only for the model's life. */
static kiln_status st_map_file(st_impl *impl, const char *path, const st_map **out)
{
    int fd;
    size_t size;
    kiln_status st = st_open_regular(path, &fd, &size);
    if (st)
        return st;
    if (size < 8) {
        close(fd);
        return kiln_fail(KILN_ERR_MALFORMED, "%s: %zu bytes, shorter than the 8-byte header length", path,
                         size);
    }
    void *base = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (base == MAP_FAILED)
        return kiln_fail(KILN_ERR_IO, "%s: cannot map: %s", path, strerror(e));
    char *copy = strdup(path);
    if (!copy || !st_grow((void **)&impl->maps, &impl->cap_maps, impl->n_maps + 1, sizeof *impl->maps)) {
        free(copy);
        munmap(base, size);
        return st_nomem();
    }
    impl->maps[impl->n_maps] = (st_map){ copy, base, size };
    *out = &impl->maps[impl->n_maps++];
    return KILN_OK;
}

/* Read and parse a small JSON file (config, index). *present is 0 and the
 * call succeeds when the file does not exist and may be absent. */
static kiln_status st_load_json(const char *path, int optional, json_t **out, int *present)
{
    int fd;
    size_t size;
    *present = 0;
    if (optional) {
        struct stat sb;
        if (stat(path, &sb) != 0 && errno == ENOENT)
            return KILN_OK;
    }
    kiln_status st = st_open_regular(path, &fd, &size);
    if (st)
        return st;
    if (size > ST_MAX_HEADER) {
        close(fd);
        return kiln_fail(KILN_ERR_MALFORMED, "%s: %zu bytes, more than a JSON file kiln reads", path, size);
    }
    char *buf = malloc(size ? size : 1);
    if (!buf) {
        close(fd);
        return st_nomem();
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            close(fd);
            free(buf);
            return kiln_fail(KILN_ERR_IO, "%s: cannot read: %s", path, strerror(e));
        }
        got += (size_t)r;
    }
    close(fd);
    json_error_t err;
    json_t *j = json_loadb(buf, size, JSON_REJECT_DUPLICATES, &err);
    free(buf);
    if (!j)
        return kiln_fail(KILN_ERR_MALFORMED, "%s: line %d column %d: %s", path, err.line, err.column,
                         err.text);
    if (!json_is_object(j)) {
        json_decref(j);
        return kiln_fail(KILN_ERR_MALFORMED, "%s: not a JSON object", path);
    }
    *out = j;
    *present = 1;
    return KILN_OK;
}

/* ------------------------------------------------------------ the header */

static kiln_status st_parse_dims(const char *file, const char *name, const json_t *shape, st_slot *s,
                                 size_t *numel)
{
    if (!json_is_array(shape))
        return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: shape is not an array", file, name);
    size_t rank = json_array_size(shape);
    if (rank > INT32_MAX)
        return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: %zu dimensions", file, name, rank);
    /* Elements, and the product of the non-zero dims: the latter bounds
     * every partial product a reader of the shape forms, so a tensor with a
     * zero dim cannot smuggle in dims whose product overflows. */
    int64_t nonzero = 1;
    size_t elems = 1;
    for (size_t i = 0; i < rank; i++) {
        const json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return kiln_fail(KILN_ERR_MALFORMED,
                             "%s: tensor %s: shape entry %zu is not a non-negative integer", file, name, i);
        int64_t v = json_integer_value(d);
        if (v && __builtin_mul_overflow(nonzero, v, &nonzero))
            return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: the shape's element count overflows", file,
                             name);
        elems = v ? elems * (size_t)v : 0;
        size_t fold = rank > ST_MAX_DIMS ? rank - ST_MAX_DIMS : 0;
        if (i <= fold)
            s->shape[0] = i == 0 ? v : s->shape[0] * v;
        else
            s->shape[i - fold] = v;
    }
    s->rank = (int)rank;
    *numel = elems;
    return KILN_OK;
}

static kiln_status st_parse_offsets(const char *file, const char *name, const json_t *offs, size_t data_len,
                                    st_slot *s)
{
    size_t v[2];
    if (!json_is_array(offs) || json_array_size(offs) != 2)
        return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: data_offsets is not [begin, end]", file, name);
    for (int i = 0; i < 2; i++) {
        const json_t *o = json_array_get(offs, (size_t)i);
        if (!json_is_integer(o) || json_integer_value(o) < 0)
            return kiln_fail(KILN_ERR_MALFORMED,
                             "%s: tensor %s: data_offsets[%d] is not a non-negative integer", file, name, i);
        v[i] = (size_t)json_integer_value(o);
    }
    if (v[1] < v[0])
        return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: data_offsets end %zu is before begin %zu", file,
                         name, v[1], v[0]);
    if (v[1] > data_len)
        return kiln_fail(KILN_ERR_MALFORMED,
                         "%s: tensor %s: data_offsets [%zu, %zu] run past the %zu-byte data section", file,
                         name, v[0], v[1], data_len);
    s->begin = v[0];
    s->end = v[1];
    return KILN_OK;
}

static kiln_status st_parse_entry(st_loader *L, const st_map *map, size_t data_off, const char *name,
                                  const json_t *entry)
{
    const char *file = map->path;
    if (!json_is_object(entry))
        return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: entry is not a JSON object", file, name);
    const json_t *dtype = NULL, *shape = NULL, *offs = NULL;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)entry, key, val) {
        if (!strcmp(key, "dtype"))
            dtype = val;
        else if (!strcmp(key, "shape"))
            shape = val;
        else if (!strcmp(key, "data_offsets"))
            offs = val;
        else
            return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: unknown key \"%s\"", file, name, key);
    }
    if (!dtype)
        return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: no dtype", file, name);
    if (!shape)
        return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: no shape", file, name);
    if (!offs)
        return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: no data_offsets", file, name);
    if (!json_is_string(dtype))
        return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: dtype is not a string", file, name);
    if (json_object_get(L->names, name))
        return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: stored twice (also in %s)", file, name,
                         L->v[json_integer_value(json_object_get(L->names, name))].file);

    st_slot s = { .insert_before = -1, .file = file };
    size_t numel = 0;
    kiln_status st = st_parse_dims(file, name, shape, &s, &numel);
    if (st)
        return st;
    st = st_parse_offsets(file, name, offs, map->size - data_off, &s);
    if (st)
        return st;
    const char *dname = json_string_value(dtype);
    s.dtype = ST_DTYPE_COUNT;
    for (int i = 0; i < ST_DTYPE_COUNT; i++)
        if (!strcmp(dname, st_dtypes[i].name))
            s.dtype = (st_dtype)i;
    if (s.dtype != ST_DTYPE_COUNT) {
        size_t bits, bytes;
        int bpe = st_dtypes[s.dtype].bits;
        if (!kiln_mul_size(numel, (size_t)bpe, &bits) || bits % 8)
            return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: %s elements do not fill whole bytes", file,
                             name, dname);
        bytes = bits / 8;
        if (s.end - s.begin != bytes)
            return kiln_fail(KILN_ERR_MALFORMED,
                             "%s: tensor %s: data_offsets span %zu bytes, %s x %zu elements is %zu", file,
                             name, s.end - s.begin, dname, numel, bytes);
    }
    s.data = (const uint8_t *)map->base + data_off + s.begin;
    s.t.bytes = s.end - s.begin;
    s.t.n_dims = s.rank < ST_MAX_DIMS ? s.rank : ST_MAX_DIMS;
    for (int i = 0; i < ST_MAX_DIMS; i++)
        s.t.ne[i] = i < s.t.n_dims ? s.shape[s.t.n_dims - 1 - i] : 1;

    if (!st_grow((void **)&L->v, &L->cap, L->n + 1, sizeof *L->v))
        return st_nomem();
    s.t.name = strdup(name);
    s.t.type_name = strdup(dname);
    json_t *ix = json_integer(L->n);
    if (!s.t.name || !s.t.type_name || !ix || json_object_set_new(L->names, name, ix)) {
        st_tensor_free(&s.t);
        return st_nomem();
    }
    L->v[L->n++] = s;
    return KILN_OK;
}

static int st_slot_cmp(const void *a, const void *b)
{
    const st_slot *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->t.name, y->t.name);
}

/* Sort a shard's slots into storage order, then find overlaps: in that order a
 * tensor overlaps an earlier one exactly when it begins before the furthest
 * end seen so far. */
static kiln_status st_order_shard(st_loader *L, int first)
{
    if (L->n - first > 1)
        qsort(L->v + first, (size_t)(L->n - first), sizeof *L->v, st_slot_cmp);
    int reach = -1;
    for (int i = first; i < L->n; i++) {
        const st_slot *s = &L->v[i];
        json_integer_set(json_object_get(L->names, s->t.name), i);
        if (s->end == s->begin)
            continue;
        if (reach >= 0 && s->begin < L->v[reach].end)
            return kiln_fail(
                KILN_ERR_MALFORMED, "%s: tensor %s: bytes [%zu, %zu) overlap tensor %s [%zu, %zu)", s->file,
                s->t.name, s->begin, s->end, L->v[reach].t.name, L->v[reach].begin, L->v[reach].end);
        if (reach < 0 || s->end > L->v[reach].end)
            reach = i;
    }
    return KILN_OK;
}

static kiln_status st_check_metadata(const char *file, const json_t *meta)
{
    if (!json_is_object(meta))
        return kiln_fail(KILN_ERR_MALFORMED, "%s: __metadata__ is not a JSON object", file);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)meta, key, val) {
        if (!json_is_string(val))
            return kiln_fail(KILN_ERR_MALFORMED, "%s: __metadata__: value of \"%s\" is not a string", file,
                             key);
    }
    return KILN_OK;
}

static kiln_status st_load_shard(st_loader *L, const char *path)
{
    const st_map *map = NULL;
    kiln_status st = st_map_file(L->impl, path, &map);
    if (st)
        return st;
    const uint8_t *p = map->base;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | p[i];
    if (hlen > ST_MAX_HEADER)
        return kiln_fail(KILN_ERR_MALFORMED,
                         "%s: header length %" PRIu64 " exceeds the %" PRIu64 "-byte limit", map->path, hlen,
                         ST_MAX_HEADER);
    if (hlen > map->size - 8)
        return kiln_fail(KILN_ERR_MALFORMED,
                         "%s: header length %" PRIu64 " runs past the end of the %zu-byte file", map->path,
                         hlen, map->size);
    json_error_t err;
    json_t *h = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &err);
    if (!h)
        return kiln_fail(KILN_ERR_MALFORMED, "%s: header JSON, line %d column %d: %s", map->path, err.line,
                         err.column, err.text);
    if (!json_is_object(h)) {
        json_decref(h);
        return kiln_fail(KILN_ERR_MALFORMED, "%s: header is not a JSON object", map->path);
    }
    int first = L->n;
    const char *key;
    json_t *val;
    json_object_foreach(h, key, val) {
        st = !strcmp(key, "__metadata__") ? st_check_metadata(map->path, val)
                                          : st_parse_entry(L, map, 8 + (size_t)hlen, key, val);
        if (st)
            break;
    }
    json_decref(h);
    if (!st)
        st = st_order_shard(L, first);
    L->n_shards++;
    return st;
}

static int st_shard_name_ok(const char *s)
{
    return *s && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

/* A sharded set: every shard the weight_map names is mapped once, and every
 * tensor it lists must be in the shard it says. */
static kiln_status st_load_index(st_loader *L, const char *index_path)
{
    json_t *ix, *shards = json_object();
    int present;
    if (!shards)
        return st_nomem();
    kiln_status st = st_load_json(index_path, 0, &ix, &present);
    if (st) {
        json_decref(shards);
        return st;
    }
    const json_t *wm = json_object_get(ix, "weight_map");
    const char *name;
    json_t *val;
    if (!json_is_object(wm)) {
        st = kiln_fail(KILN_ERR_MALFORMED, "%s: no weight_map object", index_path);
        goto done;
    }
    json_object_foreach((json_t *)wm, name, val) {
        if (!json_is_string(val) || !st_shard_name_ok(json_string_value(val))) {
            st = kiln_fail(KILN_ERR_MALFORMED,
                           "%s: tensor %s: shard is not a file name in the index's directory", index_path,
                           name);
            goto done;
        }
        const char *shard = json_string_value(val);
        if (json_object_get(shards, shard))
            continue;
        if (json_object_set_new(shards, shard, json_true())) {
            st = st_nomem();
            goto done;
        }
        char *path = st_join_path(L->dir, shard);
        if (!path) {
            st = st_nomem();
            goto done;
        }
        st = st_load_shard(L, path);
        free(path);
        if (st) {
            kiln_fail_prefix(st, "%s: tensor %s: shard %s", index_path, name, shard);
            goto done;
        }
    }
    json_object_foreach((json_t *)wm, name, val) {
        const json_t *at = json_object_get(L->names, name);
        const char *shard = json_string_value(val);
        if (!at) {
            st = kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: not found in shard %s", index_path, name,
                           shard);
            goto done;
        }
        const char *file = L->v[json_integer_value(at)].file;
        if (!st_ends_with(file, shard) || file[strlen(file) - strlen(shard) - 1] != '/') {
            st = kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: listed in shard %s but stored in %s",
                           index_path, name, shard, file);
            goto done;
        }
    }
done:
    json_decref(ix);
    json_decref(shards);
    return st;
}

/* ------------------------------------------------------------ config.json */

static kiln_status st_parse_quant(st_loader *L, const char *file, const json_t *q)
{
    if (!json_is_object(q))
        return kiln_fail(KILN_ERR_MALFORMED, "%s: the quantization settings are not a JSON object", file);
    const json_t *method = json_object_get(q, "quant_method");
    const json_t *algo = json_object_get(q, "quant_algo");
    if ((method && !json_is_string(method)) || (algo && !json_is_string(algo)))
        return kiln_fail(KILN_ERR_MALFORMED, "%s: quant_method / quant_algo is not a string", file);
    if (method && !strcasecmp(json_string_value(method), "fp8")) {
        const json_t *wbs = json_object_get(q, "weight_block_size");
        if (wbs && !json_is_null(wbs)) {
            const json_t *r = json_array_get(wbs, 0), *c = json_array_get(wbs, 1);
            if (json_array_size(wbs) != 2 || !json_is_integer(r) || !json_is_integer(c) ||
                json_integer_value(r) <= 0 || json_integer_value(c) <= 0)
                return kiln_fail(KILN_ERR_MALFORMED, "%s: weight_block_size is not [rows, cols]", file);
            L->q.block_rows = json_integer_value(r);
            L->q.block_cols = json_integer_value(c);
        }
    }
    if (algo && !strcasecmp(json_string_value(algo), "NVFP4")) {
        const json_t *g = json_object_get(q, "group_size");
        if (g && !json_is_null(g)) {
            if (!json_is_integer(g) || json_integer_value(g) <= 0)
                return kiln_fail(KILN_ERR_MALFORMED, "%s: group_size is not a positive integer", file);
            L->q.nvfp4_group = json_integer_value(g);
        }
    }
    return KILN_OK;
}

static kiln_status st_parse_config(st_loader *L, const char *file, const json_t *cfg)
{
    const json_t *arch = json_object_get(cfg, "architectures");
    if (arch && !json_is_null(arch)) {
        if (!json_is_array(arch) || (json_array_size(arch) && !json_is_string(json_array_get(arch, 0))))
            return kiln_fail(KILN_ERR_MALFORMED, "%s: architectures is not an array of strings", file);
        if (json_array_size(arch))
            snprintf(L->hp.arch, sizeof L->hp.arch, "%s", json_string_value(json_array_get(arch, 0)));
    }
    for (size_t i = 0; i < KILN_ARRAY_LEN(st_hp_keys); i++) {
        const json_t *v = json_object_get(cfg, st_hp_keys[i].key);
        if (!v || json_is_null(v))
            continue;
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return kiln_fail(KILN_ERR_MALFORMED, "%s: %s is not a non-negative integer", file,
                             st_hp_keys[i].key);
        *(int64_t *)((char *)&L->hp + st_hp_keys[i].offset) = json_integer_value(v);
    }
    const json_t *eps = json_object_get(cfg, "rms_norm_eps");
    if (eps && !json_is_null(eps)) {
        if (!json_is_number(eps) || json_number_value(eps) < 0)
            return kiln_fail(KILN_ERR_MALFORMED, "%s: rms_norm_eps is not a non-negative number", file);
        L->hp.rms_eps = (float)json_number_value(eps);
    }
    const json_t *q = json_object_get(cfg, "quantization_config");
    return q ? st_parse_quant(L, file, q) : KILN_OK;
}

/* config.json, and ModelOpt's hf_quant_config.json when config.json carries
 * no quantization_config. Both are optional. */
static kiln_status st_load_config(st_loader *L)
{
    char *path = st_join_path(L->dir, "config.json");
    if (!path)
        return st_nomem();
    json_t *cfg = NULL;
    int present;
    kiln_status st = st_load_json(path, 1, &cfg, &present);
    if (!st && present)
        st = st_parse_config(L, path, cfg);
    int has_quant = present && json_object_get(cfg, "quantization_config");
    json_decref(cfg);
    free(path);
    if (st || has_quant)
        return st;

    path = st_join_path(L->dir, "hf_quant_config.json");
    if (!path)
        return st_nomem();
    st = st_load_json(path, 1, &cfg, &present);
    if (!st && present) {
        const json_t *q = json_object_get(cfg, "quantization");
        st = q ? st_parse_quant(L, path, q)
               : kiln_fail(KILN_ERR_MALFORMED, "%s: no quantization object", path);
        json_decref(cfg);
    }
    free(path);
    return st;
}

/* ------------------------------------------------- quantization conventions */

static int st_find(const st_loader *L, const char *base, const char *suffix)
{
    char *name = st_strdupf("%s%s", base, suffix);
    const json_t *at = name ? json_object_get(L->names, name) : NULL;
    free(name);
    return at ? (int)json_integer_value(at) : -1;
}

static int st_is_scalar(const st_slot *s) { return s->rank <= 1 && st_numel(s) == 1; }

/* A pointer a reader may load elements of `align` bytes through. safetensors
 * guarantees no alignment, so a tensor at an odd offset is copied once into
 * memory the model owns. */
static kiln_status st_aligned(st_loader *L, const st_slot *s, size_t align, void **out)
{
    if ((uintptr_t)s->data % align == 0 || s->t.bytes == 0) {
        *out = (void *)s->data;
        return KILN_OK;
    }
    st_impl *impl = L->impl;
    void *copy = malloc(s->t.bytes);
    if (!copy || !st_grow((void **)&impl->owned, &impl->cap_owned, impl->n_owned + 1, sizeof *impl->owned)) {
        free(copy);
        return st_nomem();
    }
    memcpy(copy, s->data, s->t.bytes);
    impl->owned[impl->n_owned++] = copy;
    *out = copy;
    return KILN_OK;
}

/* Make w a usable weight of format fmt, [n, k] with its scales, unless
 * kiln's format table refuses the shape (a K its blocks do not divide, an
 * empty tensor). */
static kiln_status st_set_weight(st_slot *w, kiln_format fmt, int64_t n, int64_t k, const st_slot *scale,
                                 float global)
{
    size_t data_bytes = 0, scale_bytes = 0;
    const kiln_format_info *fi = kiln_format_get(fmt);
    kiln_status fst = kiln_format_data_bytes(fmt, n, k, &data_bytes);
    if (!fst)
        fst = kiln_format_scale_bytes(fmt, n, k, &scale_bytes);
    if (fst)
        return st_refuse(w, "%s [%" PRId64 ", %" PRId64 "]: %s", fi->name, n, k, kiln_last_error());
    /* The callers checked the shapes against the checkpoint convention,
     * which for these formats is kiln's own layout byte for byte. */
    assert(data_bytes == w->t.bytes && scale_bytes == scale->t.bytes);
    /* An F32 scale was classified as a plain tensor first, which already
     * gave it an aligned address; byte scales need none. */
    void *scale_ptr = scale->dtype == ST_F32 ? scale->t.qt.data : (void *)scale->data;
    w->t.qt = (kiln_qtensor){
        .format = fmt, .n = n, .k = k, .data = (void *)w->data, .scale = scale_ptr, .global_scale = global
    };
    /* The logical [N, K], not the packed bytes (NVFP4 stores K/2 columns). */
    w->t.ne[0] = k;
    w->t.ne[1] = n;
    w->t.supported = 1;
    free(w->t.why);
    w->t.why = NULL;
    return KILN_OK;
}

static kiln_status st_shape_error(const st_slot *w, const st_slot *s, const char *expect)
{
    char ws[128], ss[128];
    st_shape_str(w, ws, sizeof ws);
    st_shape_str(s, ss, sizeof ss);
    return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: %s %s does not fit weight %s %s: expected %s",
                     s->file, s->t.name, s->t.type_name, ss, w->t.name, ws, expect);
}

/* FP8: weight F8_E4M3 [N, K] with weight_scale f32 (scalar or [N]) or with
 * weight_scale_inv f32 [ceil(N/128), ceil(K/128)]. */
static kiln_status st_join_fp8(st_loader *L, int wi, const char *base)
{
    int si = st_find(L, base, ".weight_scale"), bi = st_find(L, base, ".weight_scale_inv");
    st_slot *w = &L->v[wi];
    if (si >= 0 && bi >= 0)
        return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: has both %s and %s", w->file, w->t.name,
                         L->v[si].t.name, L->v[bi].t.name);
    if (si < 0 && bi < 0)
        return st_refuse(w, "F8_E4M3 weight without weight_scale or weight_scale_inv");
    const st_slot *s = &L->v[si >= 0 ? si : bi];
    if (w->rank != 2)
        return st_refuse(w, "F8_E4M3 weight of rank %d: kiln's weights are 2-D", w->rank);
    if (s->dtype != ST_F32)
        return st_refuse(w, "scale %s is %s: kiln's FP8 scales are F32", s->t.name, s->t.type_name);
    int64_t n = w->shape[0], k = w->shape[1];
    if (si >= 0) {
        if (st_is_scalar(s))
            return st_set_weight(w, KILN_FMT_FP8_TENSOR, n, k, s, 0);
        if ((s->rank == 1 && s->shape[0] == n) || (s->rank == 2 && s->shape[0] == n && s->shape[1] == 1))
            return st_set_weight(w, KILN_FMT_FP8_CHANNEL, n, k, s, 0);
        return st_shape_error(w, s, "[], [1], [N] or [N, 1]");
    }
    int64_t br = L->q.block_rows ? L->q.block_rows : ST_FP8_BLOCK;
    int64_t bc = L->q.block_cols ? L->q.block_cols : ST_FP8_BLOCK;
    if (s->rank != 2 || s->shape[0] != st_ceil_div(n, br) || s->shape[1] != st_ceil_div(k, bc)) {
        char expect[96];
        snprintf(expect, sizeof expect,
                 "[ceil(N/%" PRId64 "), ceil(K/%" PRId64 ")] = [%" PRId64 ", %" PRId64 "]", br, bc,
                 st_ceil_div(n, br), st_ceil_div(k, bc));
        return st_shape_error(w, s, expect);
    }
    if (br != ST_FP8_BLOCK || bc != ST_FP8_BLOCK)
        return st_refuse(w, "weight_block_size [%" PRId64 ", %" PRId64 "]: kiln's block FP8 is 128x128", br,
                         bc);
    return st_set_weight(w, KILN_FMT_FP8_BLOCK, n, k, s, 0);
}

/* ModelOpt NVFP4: weight U8 [N, K/2], weight_scale F8_E4M3 [N, K/16],
 * weight_scale_2 f32 scalar (the global scale). */
static kiln_status st_join_nvfp4(st_loader *L, int wi, const char *base)
{
    int si = st_find(L, base, ".weight_scale"), gi = st_find(L, base, ".weight_scale_2");
    st_slot *w = &L->v[wi];
    if (si < 0)
        return KILN_OK;
    st_slot *s = &L->v[si];
    if (s->dtype != ST_F8_E4M3)
        return st_refuse(w, "U8 weight with a %s weight_scale: no convention kiln knows", s->t.type_name);
    if (gi < 0)
        return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: NVFP4 weight with %s but no weight_scale_2",
                         w->file, w->t.name, s->t.name);
    const st_slot *g = &L->v[gi];
    if (g->dtype != ST_F32 || !st_is_scalar(g))
        return kiln_fail(KILN_ERR_MALFORMED,
                         "%s: tensor %s: global scale of NVFP4 weight %s is not an F32 scalar", g->file,
                         g->t.name, w->t.name);
    if (w->rank != 2)
        return st_refuse(w, "NVFP4 weight of rank %d: kiln's weights are 2-D", w->rank);
    int64_t group = L->q.nvfp4_group ? L->q.nvfp4_group : ST_NVFP4_GROUP;
    int64_t n = w->shape[0], k;
    if (__builtin_mul_overflow(w->shape[1], 2, &k) || k % group || s->rank != 2 || s->shape[0] != n ||
        s->shape[1] != k / group) {
        char expect[96];
        snprintf(expect, sizeof expect, "[N, K/%" PRId64 "] with K = 2 x %" PRId64 " a multiple of %" PRId64,
                 group, w->shape[1], group);
        return st_shape_error(w, s, expect);
    }
    kiln_status st = st_refuse(s, "the block scales of NVFP4 weight %s", w->t.name);
    if (st)
        return st;
    if (group != ST_NVFP4_GROUP)
        return st_refuse(w, "NVFP4 group_size %" PRId64 ": kiln's NVFP4 groups are 16", group);
    float global;
    memcpy(&global, g->data, sizeof global);
    return st_set_weight(w, KILN_FMT_NVFP4, n, k, s, global);
}

/* gpt-oss MXFP4: X_blocks U8 [..., N, K/32, 16] and X_scales U8 [..., N, K/32]
 * become weight X. Row n of the blocks, flattened, is kiln's MXFP4 data row:
 * 16 bytes per 32 elements, the even element in the low nibble (the OCP order,
 * which gpt-oss's reference dequantization also uses). */
static kiln_status st_join_mxfp4(st_loader *L, int bi, const char *base, const char *scale_suffix)
{
    int si = st_find(L, base, scale_suffix);
    const st_slot *b = &L->v[bi];
    if (si < 0 || b->rank > ST_MAX_DIMS)
        return KILN_OK;
    const st_slot *s = &L->v[si];
    if (b->dtype != ST_U8 || s->dtype != ST_U8)
        return KILN_OK;
    int fits = (b->rank == 3 || b->rank == 4) && s->rank == b->rank - 1 && b->shape[b->rank - 1] == 16;
    for (int i = 0; fits && i < s->rank; i++)
        fits = s->shape[i] == b->shape[i];
    if (!fits)
        return st_shape_error(b, s, "blocks [..., N, K/32, 16] with scales [..., N, K/32]");
    if (json_object_get(L->names, base)) {
        const st_slot *x = &L->v[json_integer_value(json_object_get(L->names, base))];
        return kiln_fail(KILN_ERR_MALFORMED, "%s: tensor %s: MXFP4 weight %s is also stored as tensor %s",
                         b->file, b->t.name, base, x->t.name);
    }
    int64_t e = b->rank == 4 ? b->shape[0] : 1, n = b->shape[b->rank - 3], k;
    if (__builtin_mul_overflow(b->shape[b->rank - 2], ST_MXFP4_BLOCK, &k))
        return st_shape_error(b, s, "K = 32 x groups to fit in 64 bits");

    if (!st_grow((void **)&L->v, &L->cap, L->n + 1, sizeof *L->v))
        return st_nomem();
    b = &L->v[bi];
    s = &L->v[si];
    st_slot x = {
        .dtype = ST_U8, .rank = e > 1 ? 3 : 2, .data = b->data, .file = b->file, .insert_before = bi
    };
    x.t.name = strdup(base);
    x.t.type_name = strdup(b->t.type_name);
    json_t *ix = json_integer(L->n);
    if (!x.t.name || !x.t.type_name || !ix || json_object_set_new(L->names, base, ix)) {
        st_tensor_free(&x.t);
        return st_nomem();
    }
    x.t.n_dims = x.rank;
    x.t.ne[0] = k;
    x.t.ne[1] = n;
    x.t.ne[2] = e;
    x.t.ne[3] = 1;
    x.t.bytes = b->t.bytes;
    L->v[L->n++] = x;
    st_slot *xs = &L->v[L->n - 1];
    kiln_status st = st_refuse(&L->v[bi], "the blocks of MXFP4 weight %s", base);
    if (!st)
        st = st_refuse(&L->v[si], "the scales of MXFP4 weight %s", base);
    if (st)
        return st;
    if (e > 1)
        return st_refuse(
            xs, "expert tensors are 3-D: [%" PRId64 ", %" PRId64 ", %" PRId64 "], kiln's weights are 2-D", e,
            n, k);
    return st_set_weight(xs, KILN_FMT_MXFP4, n, k, &L->v[si], 0);
}

/* Every stored tensor on its own: plain float types are usable as they are;
 * the rest wait for a convention to claim them. */
static kiln_status st_classify(st_loader *L, st_slot *s)
{
    if (s->dtype == ST_DTYPE_COUNT)
        return st_refuse(s, "dtype %s is not a safetensors dtype kiln knows", s->t.type_name);
    const st_dtype_info *d = &st_dtypes[s->dtype];
    if (s->rank > ST_MAX_DIMS)
        return st_refuse(s, "rank %d: kiln's tensors have at most 4 dims", s->rank);
    if (!d->raw)
        return st_refuse(s, "dtype %s is not supported", d->name);
    if (!d->plain)
        return st_refuse(s, "%s tensor outside any quantization convention kiln recognises", d->name);
    int64_t k = s->rank ? s->shape[s->rank - 1] : 1, n = 1;
    for (int i = 0; i + 1 < s->rank; i++)
        n *= s->shape[i];
    void *data = NULL;
    kiln_status st = st_aligned(L, s, (size_t)d->bits / 8, &data);
    if (st)
        return st;
    s->t.supported = 1;
    s->t.qt = (kiln_qtensor){ .format = d->format, .n = n, .k = k, .data = data };
    return KILN_OK;
}

static kiln_status st_join_all(st_loader *L)
{
    kiln_status st = KILN_OK;
    for (int i = 0; i < L->n && !st; i++)
        st = st_classify(L, &L->v[i]);
    L->n_stored = L->n;
    for (int i = 0; i < L->n_stored && !st; i++) {
        const char *name = L->v[i].t.name;
        size_t len = strlen(name);
        char *base = NULL;
        if (st_ends_with(name, ".weight") && (L->v[i].dtype == ST_F8_E4M3 || L->v[i].dtype == ST_U8)) {
            if (!(base = strndup(name, len - strlen(".weight"))))
                return st_nomem();
            st = L->v[i].dtype == ST_F8_E4M3 ? st_join_fp8(L, i, base) : st_join_nvfp4(L, i, base);
        }
        for (size_t j = 0; j < KILN_ARRAY_LEN(st_mx_suffixes) && !base; j++) {
            if (!st_ends_with(name, st_mx_suffixes[j].blocks))
                continue;
            if (!(base = strndup(name, len - strlen(st_mx_suffixes[j].blocks))))
                return st_nomem();
            st = st_join_mxfp4(L, i, base, st_mx_suffixes[j].scales);
        }
        free(base);
    }
    return st;
}

/* ------------------------------------------------------------ the model */

static kiln_status st_finish(st_loader *L, const char *path, kiln_model **out)
{
    kiln_model *m = calloc(1, sizeof *m);
    kiln_model_tensor *t = calloc(L->n ? (size_t)L->n : 1, sizeof *t);
    char *p = strdup(path);
    char *container =
        L->n_shards > 1 ? st_strdupf("safetensors (%d shards)", L->n_shards) : strdup("safetensors");
    if (!m || !t || !p || !container) {
        free(m);
        free(t);
        free(p);
        free(container);
        return st_nomem();
    }
    /* Storage order, with each joined MXFP4 weight just before its blocks.
     * The joined weights follow the stored tensors in the order of the
     * blocks they were made from, so one merge pass places them. */
    int at = 0, next = L->n_stored;
    for (int i = 0; i < L->n_stored; i++) {
        while (next < L->n && L->v[next].insert_before == i)
            t[at++] = L->v[next++].t;
        t[at++] = L->v[i].t;
    }
    m->path = p;
    m->container = container;
    m->hp = L->hp;
    m->tensors = t;
    m->n_tensors = L->n;
    m->impl = L->impl;
    m->impl_free = st_impl_free;
    L->n = 0;
    L->impl = NULL;
    *out = m;
    return KILN_OK;
}

static void st_loader_free(st_loader *L)
{
    for (int i = 0; i < L->n; i++)
        st_tensor_free(&L->v[i].t);
    free(L->v);
    json_decref(L->names);
    st_impl_free(L->impl);
    free(L->dir);
}

kiln_status kiln_safetensors_open(const char *path, struct kiln_model **out)
{
    if (!path || !out)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_safetensors_open: path and out must not be NULL");
    st_loader L = { .impl = calloc(1, sizeof(st_impl)), .names = json_object() };
    char *file = NULL;
    int sharded = 0;
    kiln_status st = KILN_OK;
    struct stat sb;
    if (!L.impl || !L.names) {
        st = st_nomem();
        goto done;
    }
    if (stat(path, &sb) != 0) {
        st = kiln_fail(KILN_ERR_IO, "%s: %s", path, strerror(errno));
        goto done;
    }
    if (S_ISDIR(sb.st_mode)) {
        L.dir = strdup(path);
        file = st_join_path(path, "model.safetensors");
        if (!L.dir || !file) {
            st = st_nomem();
            goto done;
        }
        if (stat(file, &sb) != 0) {
            free(file);
            if (!(file = st_join_path(path, "model.safetensors.index.json"))) {
                st = st_nomem();
                goto done;
            }
            if (stat(file, &sb) != 0) {
                st = kiln_fail(KILN_ERR_NOT_FOUND,
                               "%s: neither model.safetensors nor model.safetensors.index.json", path);
                goto done;
            }
            sharded = 1;
        }
    } else {
        const char *slash = strrchr(path, '/');
        L.dir = slash ? strndup(path, (size_t)(slash - path + (slash == path))) : strdup(".");
        file = strdup(path);
        if (!L.dir || !file) {
            st = st_nomem();
            goto done;
        }
        sharded = st_ends_with(path, ".index.json");
    }
    st = st_load_config(&L);
    if (!st)
        st = sharded ? st_load_index(&L, file) : st_load_shard(&L, file);
    if (!st)
        st = st_join_all(&L);
    if (!st)
        st = st_finish(&L, path, out);
done:
    free(file);
    st_loader_free(&L);
    return st;
}
