/* A session's weight load: the weights read from the model's files by
 * several threads (in file order), packed on those threads where a kernel
 * reads a packed layout, staged through a ring of pinned buffers and copied
 * to the device on a stream while the next ones are read. */
#ifndef KILN_LOAD_H
#define KILN_LOAD_H

#include "core/build.h"
#include "graph/graph_impl.h"
#include "runtime/driver.h"

/* One device copy of a weight to fill: kiln's storage layout (pack NULL:
 * the stored bytes, read from the tensor's file spans, or from its memory
 * where it has none) or a kernel's packed layout (pack writes both arrays
 * from the whole stored weight). */
typedef struct kiln_load_item {
    const kiln_tensor *tensor;
    kiln_pack_fn pack;
    CUdeviceptr data, scale;
    size_t data_bytes, scale_bytes; /* as stored, or as packed */
} kiln_load_item;

/* Staging buffers kept across runs (kiln_load_ring_create). */
typedef struct kiln_load_ring kiln_load_ring;

typedef struct kiln_load_options {
    const kiln_cu *cu;
    CUcontext ctx;               /* made current on every reader thread */
    CUstream stream;             /* the copies' */
    const kiln_target *target;   /* the packers' */
    int threads;                 /* readers, the caller's thread among them */
    int slots;                   /* staging buffers */
    size_t slot_bytes;           /* each; fewer where the largest unit needs less */
    int quiet;                   /* no progress line */
    kiln_load_ring *ring;        /* NULL: each run makes and frees its own */
} kiln_load_options;

typedef struct kiln_load_stats {
    size_t read_bytes;   /* taken from the files (or memory) */
    size_t copied_bytes; /* sent to the device */
    size_t packed_bytes; /* written by the CPU packers */
    double seconds;
    int threads;         /* readers that ran */
    int pinned;          /* 1: staged in pinned memory; 0: pageable */
} kiln_load_stats;

/* Fill every item. The unit of work is a packed weight whole (its pack
 * needs all of it) or a slot's worth of a stored array; units are taken in
 * file order, each shard's from its start. Host memory: the ring; per
 * reader the stored bytes of the packed weight it reads, at most a slot
 * (the packed ones go straight into a slot); and one packed weight larger
 * than a slot at a time, stored and packed. A staging buffer is reused once the
 * event recorded after its copies has completed. Pinned buffers that
 * cannot be had are replaced by pageable ones, with one warning on stderr.
 * On the first error every reader stops after its unit; the stream is
 * synchronized and every buffer freed before the call returns it: the
 * detail names the weight and, for a read, the file (KILN_ERR_IO), a
 * refused pack as its packer says, a copy as KILN_ERR_CUDA. Device arrays
 * may then hold part of their bytes. */
kiln_status kiln_load_run(const kiln_load_options *o, const kiln_load_item *items, int n,
                          kiln_load_stats *stats);

/* o->slots staging buffers of o->slot_bytes, pinned where the driver gives
 * them (else pageable, with the run's warning), for runs that follow one
 * another: their options carry it in ring, and each run uses all of it,
 * cutting stored arrays into units of o->slot_bytes. A run returns with
 * the ring's copies landed. Destroy frees it (NULL: nothing). */
kiln_status kiln_load_ring_create(const kiln_load_options *o, kiln_load_ring **out);
void kiln_load_ring_destroy(const kiln_cu *cu, kiln_load_ring *ring);

#endif
