/* The safetensors container: the files (single, directory, sharded set), each
 * file's header JSON and the index, checked against the bytes that are there,
 * and config.json; the quantization conventions that join weights with their
 * scales are safetensors_quant.c's. */
#include "graph/safetensors_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

const kiln_st_dtype_info kiln_st_dtypes[] = {
    [KILN_ST_F32] = { "F32", 32, 1, 1, KILN_FMT_F32 },
    [KILN_ST_F16] = { "F16", 16, 1, 1, KILN_FMT_F16 },
    [KILN_ST_BF16] = { "BF16", 16, 1, 1, KILN_FMT_BF16 },
    [KILN_ST_F8_E4M3] = { "F8_E4M3", 8, 1, 0, 0 },
    [KILN_ST_U8] = { "U8", 8, 1, 0, 0 },
    [KILN_ST_I8] = { "I8", 8, 1, 0, 0 },
    [KILN_ST_F64] = { "F64", 64, 0, 0, 0 },
    [KILN_ST_I64] = { "I64", 64, 1, 0, 0 },
    [KILN_ST_U64] = { "U64", 64, 0, 0, 0 },
    [KILN_ST_I32] = { "I32", 32, 1, 0, 0 },
    [KILN_ST_U32] = { "U32", 32, 0, 0, 0 },
    [KILN_ST_I16] = { "I16", 16, 0, 0, 0 },
    [KILN_ST_U16] = { "U16", 16, 0, 0, 0 },
    [KILN_ST_BOOL] = { "BOOL", 8, 0, 0, 0 },
    [KILN_ST_F8_E5M2] = { "F8_E5M2", 8, 0, 0, 0 },
    [KILN_ST_F8_E8M0] = { "F8_E8M0", 8, 1, 0, 0 },
    [KILN_ST_F6_E2M3] = { "F6_E2M3", 6, 0, 0, 0 },
    [KILN_ST_F6_E3M2] = { "F6_E3M2", 6, 0, 0, 0 },
    [KILN_ST_F4] = { "F4", 4, 0, 0, 0 },
    [KILN_ST_C64] = { "C64", 64, 0, 0, 0 },
};
_Static_assert(KILN_ARRAY_LEN(kiln_st_dtypes) == KILN_ST_DTYPE_COUNT, "one row per safetensors dtype");

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

int kiln_st_grow(void **v, int *cap, int need, size_t elem)
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
    void *p = kiln_realloc(*v, bytes);
    if (!p)
        return 0;
    *v = p;
    *cap = c;
    return 1;
}

char *kiln_st_vstrdupf(const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int len = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    char *s = len < 0 ? NULL : kiln_malloc((size_t)len + 1);
    if (s)
        vsnprintf(s, (size_t)len + 1, fmt, ap);
    return s;
}

char *kiln_st_strdupf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = kiln_st_vstrdupf(fmt, ap);
    va_end(ap);
    return s;
}

kiln_status kiln_st_nomem(void) { return kiln_fail(KILN_ERR_NOMEM, "safetensors: out of memory"); }

static void st_impl_free(void *p)
{
    kiln_st_impl *impl = p;
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

void kiln_st_tensor_free(kiln_model_tensor *t)
{
    free(t->name);
    free(t->type_name);
    free(t->why);
}

static char *st_join_path(const char *dir, const char *name) { return kiln_st_strdupf("%s/%s", dir, name); }

int kiln_st_ends_with(const char *s, const char *suffix)
{
    size_t ls = strlen(s), lx = strlen(suffix);
    return ls >= lx && !strcmp(s + ls - lx, suffix);
}

/* ------------------------------------------------------------ file access */

static void st_file_of(const kiln_model *m, const void *p, size_t bytes, kiln_file_span *out)
{
    const kiln_st_impl *impl = m->impl;
    uintptr_t at = (uintptr_t)p;
    for (int i = 0; impl && i < impl->n_maps; i++) {
        const kiln_st_map *f = &impl->maps[i];
        uintptr_t base = (uintptr_t)f->base;
        if (at >= base && at - base <= f->size && bytes <= f->size - (at - base)) {
            *out = (kiln_file_span){ f->path, at - base, f->dev, f->ino };
            return;
        }
    }
}

/* Map a shard read-only for the model's life. */
static kiln_status st_map_file(kiln_st_impl *impl, const char *path, const kiln_st_map **out)
{
    int fd;
    size_t size;
    kiln_status st = kiln_file_open_regular(path, &fd, &size);
    if (st)
        return st;
    if (size < 8) {
        close(fd);
        return kiln_fail(KILN_ERR_MALFORMED, "%s: %zu bytes, shorter than the 8-byte header length", path,
                         size);
    }
    struct stat sb;
    uint64_t dev = 0, ino = 0;
    if (fstat(fd, &sb) == 0)
        dev = (uint64_t)sb.st_dev, ino = (uint64_t)sb.st_ino;
    void *base = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (base == MAP_FAILED)
        return kiln_fail(KILN_ERR_IO, "%s: cannot map: %s", path, strerror(e));
    char *copy = kiln_strdup(path);
    if (!copy ||
        !kiln_st_grow((void **)&impl->maps, &impl->cap_maps, impl->n_maps + 1, sizeof *impl->maps)) {
        free(copy);
        munmap(base, size);
        return kiln_st_nomem();
    }
    impl->maps[impl->n_maps] = (kiln_st_map){ copy, base, size, dev, ino };
    *out = &impl->maps[impl->n_maps++];
    return KILN_OK;
}

/* A JSON parse failure of file path (of its header, when header): out of
 * memory as such (jansson gives that no text), else where and what. */
static kiln_status st_json_error(const char *path, int header, const json_error_t *err)
{
    if (json_error_code(err) == json_error_out_of_memory)
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory parsing %s", path,
                         header ? "the header" : "it");
    return kiln_fail(KILN_ERR_MALFORMED, "%s: %sline %d column %d: %s", path,
                     header ? "header JSON, " : "", err->line, err->column, err->text);
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
        if (stat(path, &sb) != 0 && errno == ENOENT && lstat(path, &sb) != 0)
            return KILN_OK;
    }
    kiln_status st = kiln_file_open_regular(path, &fd, &size);
    if (st)
        return st;
    if (size > ST_MAX_HEADER) {
        close(fd);
        return kiln_fail(KILN_ERR_MALFORMED, "%s: %zu bytes, more than a JSON file kiln reads", path, size);
    }
    char *buf = kiln_malloc(size ? size : 1);
    if (!buf) {
        close(fd);
        return kiln_st_nomem();
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
        return st_json_error(path, 0, &err);
    if (!json_is_object(j)) {
        json_decref(j);
        return kiln_fail(KILN_ERR_MALFORMED, "%s: not a JSON object", path);
    }
    *out = j;
    *present = 1;
    return KILN_OK;
}

/* ------------------------------------------------------------ the header */

static kiln_status st_parse_dims(const char *file, const char *name, const json_t *shape, kiln_st_slot *s,
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
        size_t fold = rank > KILN_ST_MAX_DIMS ? rank - KILN_ST_MAX_DIMS : 0;
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
                                    kiln_st_slot *s)
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

static kiln_status st_parse_entry(kiln_st_loader *L, const kiln_st_map *map, size_t data_off,
                                  const char *name, const json_t *entry)
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

    kiln_st_slot s = { .insert_before = -1, .file = file };
    size_t numel = 0;
    kiln_status st = st_parse_dims(file, name, shape, &s, &numel);
    if (st)
        return st;
    st = st_parse_offsets(file, name, offs, map->size - data_off, &s);
    if (st)
        return st;
    const char *dname = json_string_value(dtype);
    s.dtype = KILN_ST_DTYPE_COUNT;
    for (int i = 0; i < KILN_ST_DTYPE_COUNT; i++)
        if (!strcmp(dname, kiln_st_dtypes[i].name))
            s.dtype = (kiln_st_dtype)i;
    if (s.dtype != KILN_ST_DTYPE_COUNT) {
        size_t bits, bytes;
        int bpe = kiln_st_dtypes[s.dtype].bits;
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
    s.t.n_dims = s.rank < KILN_ST_MAX_DIMS ? s.rank : KILN_ST_MAX_DIMS;
    for (int i = 0; i < KILN_ST_MAX_DIMS; i++)
        s.t.ne[i] = i < s.t.n_dims ? s.shape[s.t.n_dims - 1 - i] : 1;

    if (!kiln_st_grow((void **)&L->v, &L->cap, L->n + 1, sizeof *L->v))
        return kiln_st_nomem();
    s.t.name = kiln_strdup(name);
    s.t.type_name = kiln_strdup(dname);
    /* json_object_set_new takes ix, even when it fails; nothing else does. */
    json_t *ix = s.t.name && s.t.type_name ? json_integer(L->n) : NULL;
    if (!s.t.name || !s.t.type_name || !ix || json_object_set_new(L->names, name, ix)) {
        kiln_st_tensor_free(&s.t);
        return kiln_st_nomem();
    }
    L->v[L->n++] = s;
    return KILN_OK;
}

static int st_slot_cmp(const void *a, const void *b)
{
    const kiln_st_slot *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->t.name, y->t.name);
}

/* Sort a shard's slots into storage order, then find overlaps: in that order a
 * tensor overlaps an earlier one exactly when it begins before the furthest
 * end seen so far. */
static kiln_status st_order_shard(kiln_st_loader *L, int first)
{
    if (L->n - first > 1)
        qsort(L->v + first, (size_t)(L->n - first), sizeof *L->v, st_slot_cmp);
    int reach = -1;
    for (int i = first; i < L->n; i++) {
        const kiln_st_slot *s = &L->v[i];
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

/* Enough arrays and nesting for any tensor table: a header is an object of
 * objects whose arrays (shape, data_offsets) hold a few integers. Checked
 * on the bytes before JSON parsing, which would otherwise spend memory in
 * proportion to whatever a hostile header holds (tens of bytes a value). */
enum { ST_MAX_DEPTH = 3, ST_MAX_ARRAY = 64 };

static kiln_status st_header_shape(const char *path, const char *p, size_t n)
{
    int depth = 0, in_string = 0;
    size_t values = 0; /* in the innermost open array */
    int in_array = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = 0;
            continue;
        }
        switch (c) {
        case '"': in_string = 1; break;
        case '{':
        case '[':
            if (++depth > ST_MAX_DEPTH)
                return kiln_fail(KILN_ERR_MALFORMED, "%s: header nests deeper than a tensor table "
                                 "(byte %zu)", path, 8 + i);
            in_array = c == '[';
            values = 1;
            break;
        case '}':
        case ']':
            depth--;
            in_array = 0;
            break;
        case ',':
            if (in_array && ++values > ST_MAX_ARRAY)
                return kiln_fail(KILN_ERR_MALFORMED, "%s: header array of more than %d values "
                                 "(byte %zu): no tensor has that many dimensions", path,
                                 ST_MAX_ARRAY, 8 + i);
            break;
        }
    }
    return KILN_OK;
}

static kiln_status st_load_shard(kiln_st_loader *L, const char *path)
{
    const kiln_st_map *map = NULL;
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
    if ((st = st_header_shape(map->path, (const char *)p + 8, (size_t)hlen)))
        return st;
    json_error_t err;
    json_t *h = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &err);
    if (!h)
        return st_json_error(map->path, 1, &err);
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
static kiln_status st_load_index(kiln_st_loader *L, const char *index_path)
{
    json_t *ix, *shards = json_object();
    int present;
    if (!shards)
        return kiln_st_nomem();
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
            st = kiln_st_nomem();
            goto done;
        }
        char *path = st_join_path(L->dir, shard);
        if (!path) {
            st = kiln_st_nomem();
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
        if (!kiln_st_ends_with(file, shard) || file[strlen(file) - strlen(shard) - 1] != '/') {
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

static kiln_status st_parse_config(kiln_st_loader *L, const char *file, const json_t *cfg)
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
        L->hp.has_rms_eps = 1;
    }
    /* Gemma's configs name the activation hidden_activation; the others
     * hidden_act. */
    static const char *act_keys[] = { "hidden_activation", "hidden_act" };
    for (size_t i = 0; i < KILN_ARRAY_LEN(act_keys) && !L->hp.act[0]; i++) {
        const json_t *act = json_object_get(cfg, act_keys[i]);
        if (!act || json_is_null(act))
            continue;
        if (!json_is_string(act) || json_string_length(act) >= sizeof L->hp.act)
            return kiln_fail(KILN_ERR_MALFORMED, "%s: %s is not an activation's name", file,
                             act_keys[i]);
        snprintf(L->hp.act, sizeof L->hp.act, "%s", json_string_value(act));
        L->hp.act_legacy = i == 1;
    }
    const json_t *q = json_object_get(cfg, "quantization_config");
    return q ? kiln_st_parse_quant(L, file, q) : KILN_OK;
}

/* config.json, and ModelOpt's hf_quant_config.json when config.json carries
 * no quantization_config. Both are optional. */
static kiln_status st_load_config(kiln_st_loader *L)
{
    char *path = st_join_path(L->dir, "config.json");
    if (!path)
        return kiln_st_nomem();
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
        return kiln_st_nomem();
    st = st_load_json(path, 1, &cfg, &present);
    if (!st && present) {
        const json_t *q = json_object_get(cfg, "quantization");
        st = q ? kiln_st_parse_quant(L, path, q)
               : kiln_fail(KILN_ERR_MALFORMED, "%s: no quantization object", path);
        json_decref(cfg);
    }
    free(path);
    return st;
}

/* ------------------------------------------------------------ the model */

static kiln_status st_finish(kiln_st_loader *L, const char *path, kiln_model **out)
{
    kiln_model *m = kiln_calloc(1, sizeof *m);
    kiln_model_tensor *t = kiln_calloc(L->n ? (size_t)L->n : 1, sizeof *t);
    char *p = kiln_strdup(path);
    char *container =
        L->n_shards > 1 ? kiln_st_strdupf("safetensors (%d shards)", L->n_shards) : kiln_strdup("safetensors");
    if (!m || !t || !p || !container) {
        free(m);
        free(t);
        free(p);
        free(container);
        return kiln_st_nomem();
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
    m->impl_file_of = st_file_of;
    L->n = 0;
    L->impl = NULL;
    *out = m;
    return KILN_OK;
}

static void st_loader_free(kiln_st_loader *L)
{
    for (int i = 0; i < L->n; i++)
        kiln_st_tensor_free(&L->v[i].t);
    free(L->v);
    json_decref(L->names);
    json_decref(L->ct);
    free(L->ct_file);
    st_impl_free(L->impl);
    free(L->dir);
}

kiln_status kiln_safetensors_open(const char *path, struct kiln_model **out)
{
    if (!path || !out)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_safetensors_open: path and out must not be NULL");
    kiln_st_loader L = { .impl = kiln_calloc(1, sizeof(kiln_st_impl)), .names = json_object() };
    char *file = NULL;
    int sharded = 0;
    kiln_status st = KILN_OK;
    struct stat sb;
    if (!L.impl || !L.names) {
        st = kiln_st_nomem();
        goto done;
    }
    if ((st = kiln_file_stat(path, &sb)))
        goto done;
    if (S_ISDIR(sb.st_mode)) {
        L.dir = kiln_strdup(path);
        file = st_join_path(path, "model.safetensors");
        if (!L.dir || !file) {
            st = kiln_st_nomem();
            goto done;
        }
        if (stat(file, &sb) != 0 && lstat(file, &sb) != 0) {
            free(file);
            if (!(file = st_join_path(path, "model.safetensors.index.json"))) {
                st = kiln_st_nomem();
                goto done;
            }
            if (stat(file, &sb) != 0 && lstat(file, &sb) != 0) {
                st = kiln_fail(KILN_ERR_NOT_FOUND,
                               "%s: neither model.safetensors nor model.safetensors.index.json", path);
                goto done;
            }
            sharded = 1;
        }
    } else {
        const char *slash = strrchr(path, '/');
        L.dir = slash ? kiln_strndup(path, (size_t)(slash - path + (slash == path))) : kiln_strdup(".");
        file = kiln_strdup(path);
        if (!L.dir || !file) {
            st = kiln_st_nomem();
            goto done;
        }
        sharded = kiln_st_ends_with(path, ".index.json");
    }
    st = st_load_config(&L);
    if (!st)
        st = sharded ? st_load_index(&L, file) : st_load_shard(&L, file);
    if (!st)
        st = kiln_st_join_all(&L);
    if (!st)
        st = st_finish(&L, path, out);
done:
    free(file);
    st_loader_free(&L);
    return st;
}
