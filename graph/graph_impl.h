/* The graph's insides, shared by graph/, codegen/ and runtime/. Users see
 * only the opaque handles of kiln.h. */
#ifndef KILN_GRAPH_IMPL_H
#define KILN_GRAPH_IMPL_H

#include "core.h"

#define KILN_MAX_SRC 3

/* Where bytes a tensor points at are stored in a model's file, so that a
 * session reads them with pread: a file that shrank since it was mapped
 * is then an error naming it, not a SIGBUS, and one replaced (another
 * device and inode at the path) is refused. path NULL: memory only. */
typedef struct kiln_file_span {
    const char *path;     /* the model's, which outlives the graph's sessions */
    uint64_t offset;      /* of the first byte in the file */
    uint64_t dev, ino;    /* the file mapped */
} kiln_file_span;

struct kiln_tensor {
    kiln_op op;
    int id;               /* index in the graph's creation order */
    char *name;           /* owned by the graph's arena */
    int64_t ne[2];        /* see kiln_tensor_ne */
    kiln_tensor *src[KILN_MAX_SRC];
    kiln_qtensor weight;  /* KILN_OP_WEIGHT */
    kiln_file_span data_file, scale_file; /* KILN_OP_WEIGHT from a model: weight.data, .scale */
    const float *param;   /* KILN_OP_PARAM: caller memory, ne[0] floats */
    float eps;            /* KILN_OP_RMS_NORM */
    float input_scale;    /* KILN_OP_LINEAR: static activation scale; 0: none */
    int is_output;
};

/* A growable array of pointers; tensors themselves live in the arena. */
typedef struct kiln_tensor_list {
    kiln_tensor **v;
    int n, cap;
} kiln_tensor_list;

/* A bump allocator of linked chunks (graph/arena.c). Nothing is freed
 * before kiln_arena_free, so pointers into it stay valid for the graph's
 * life: tensors never move when the graph grows. */
struct kiln_arena_chunk;
void *kiln_arena_alloc(struct kiln_arena_chunk **arena, size_t size); /* NULL: out of memory */
char *kiln_arena_strdup(struct kiln_arena_chunk **arena, const char *s);
void kiln_arena_free(struct kiln_arena_chunk *arena);

struct kiln_graph {
    struct kiln_arena_chunk *arena; /* tensors and names; freed at destroy */
    kiln_tensor_list tensors;       /* creation order */
    kiln_tensor_list inputs;
    kiln_tensor_list outputs;
    kiln_tensor_list topo;          /* cache of kiln_graph_topo */
    int topo_valid;
    int *name_slots;                /* open-addressing index by name: id + 1, 0 = empty */
    int name_cap;                   /* a power of two, at least twice the tensor count */
};

#endif
