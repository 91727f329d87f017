#include "graph_impl.h"

#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

/* Big enough that a graph of a few hundred tensors takes a handful of
 * chunks; small enough that a tiny graph wastes little. */
enum { KILN_ARENA_CHUNK_BYTES = 16 * 1024 };

struct kiln_arena_chunk {
    struct kiln_arena_chunk *next;
    size_t used, cap;
    max_align_t data[];
};

void *kiln_arena_alloc(struct kiln_arena_chunk **arena, size_t size)
{
    const size_t align = alignof(max_align_t);
    size_t rounded;
    if (!kiln_add_size(size, align - 1, &rounded))
        return NULL;
    rounded &= ~(align - 1);

    struct kiln_arena_chunk *c = *arena;
    if (!c || c->cap - c->used < rounded) {
        size_t cap = rounded > KILN_ARENA_CHUNK_BYTES ? rounded : KILN_ARENA_CHUNK_BYTES;
        size_t bytes;
        if (!kiln_add_size(sizeof *c, cap, &bytes))
            return NULL;
        c = kiln_malloc(bytes);
        if (!c)
            return NULL;
        c->next = *arena;
        c->used = 0;
        c->cap = cap;
        *arena = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += rounded;
    return p;
}

char *kiln_arena_strdup(struct kiln_arena_chunk **arena, const char *s)
{
    size_t len = strlen(s);
    char *p = kiln_arena_alloc(arena, len + 1);
    if (p)
        memcpy(p, s, len + 1);
    return p;
}

void kiln_arena_free(struct kiln_arena_chunk *arena)
{
    while (arena) {
        struct kiln_arena_chunk *next = arena->next;
        free(arena);
        arena = next;
    }
}
