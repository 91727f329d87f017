/* The plan's insides: what the codegen and the runtime read. */
#ifndef KILN_PLAN_H
#define KILN_PLAN_H

#include "codegen/sig.h"
#include "graph/graph_impl.h"

/* A linear node's choices, one per bucket. */
typedef struct kiln_plan_choice {
    const kiln_backend *backend;
    kiln_act act;      /* what the kernel reads (its signature's act) */
    /* What the quantization step before it makes: act, or with a static
     * input scale its static form (kiln_act_static_form), which the kernel
     * reads as act; act too where the static scale is ignored. */
    kiln_act quant;
    int ignores_scale; /* the linear has a static input scale this kernel ignores */
    unsigned epilogue; /* what is fused in this bucket */
    int signature;
    char *refused;
    int fell_back;
    int tuned;         /* the variant is the tuning table's */
    /* -1, or the linear whose kernel computes this one in this bucket (its
     * gate epilogue): this linear has no step there, and its signature is
     * that kernel's. */
    int gate_of;
} kiln_plan_choice;

typedef struct kiln_plan_lin {
    kiln_tensor *node;      /* the linear */
    kiln_tensor *absorbed;  /* the consumer fused into it (add / mul), or NULL */
    kiln_tensor *absorbed2; /* silu_mul: the silu node absorbed with the mul */
    kiln_tensor *aux;       /* residual r or gate g, the epilogue's extra input */
    unsigned candidate;     /* epilogues it could fuse */
    int gate;               /* KILN_EPI_GATE candidate: the gate projection's linear, else -1 */
    kiln_linear_cfg cfg;    /* epilogue = bias only; the rest depends on the bucket */
    kiln_plan_choice *choice; /* [n_buckets] */
} kiln_plan_lin;

/* A kernel of the plan: its signature's text and the descriptor printed
 * as it, named after the text. */
typedef struct kiln_plan_sig {
    char *text;
    kiln_kernel_desc desc;
} kiln_plan_sig;

struct kiln_plan {
    kiln_graph *graph;
    kiln_target target;
    const kiln_registry *registry;
    int64_t *buckets;
    int n_buckets;
    kiln_program *programs; /* [n_buckets] */
    kiln_plan_lin *linears;
    int n_linears;
    /* Kernels are built for the target as signatures name it, its
     * architecture's row of the target table (kiln_kernel_desc). */
    kiln_target kernel_target;
    kiln_plan_sig *signatures;  /* de-duplicated by text */
    int n_signatures, cap_signatures;
    char **warnings;            /* NULL-terminated */
    int n_warnings;
    kiln_tuning *tuned;         /* the tuning entries the plan used, NULL: none */
};

/* kiln_plan_create with a registry of the caller's (tests register
 * test-only backends this way). */
kiln_status kiln_plan_create_with(const kiln_registry *r, kiln_graph *g, const kiln_target *t,
                                  const kiln_plan_options *opts, kiln_plan **out);

/* Arena offsets are multiples of this (the widest vector access). */
#define KILN_ARENA_ALIGN 256

#endif
