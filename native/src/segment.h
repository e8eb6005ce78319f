/* Creating, reclaiming and removing the sidecar's shared-memory segment in /dev/shm. */
#ifndef TR_SEGMENT_H
#define TR_SEGMENT_H

#include <stddef.h>
#include <stdint.h>

#include "tiered_recall/layout.h"

typedef struct tr_segment_geometry {
    uint32_t dim;
    uint32_t dtype;
    uint32_t backend;
    uint64_t capacity;
    uint32_t slot_count;
    uint32_t slot_payload_bytes;
    uint32_t ns_entries;
    uint32_t codes; /* tr_codes */
} tr_segment_geometry;

typedef struct tr_segment {
    char path[256]; /* shm_open name */
    void *base;
    uint64_t bytes;
    tr_header *header;
} tr_segment;

/* Fills in the derived fields (offsets, sizes, limits) of a header for this geometry. */
void tr_segment_plan(const tr_segment_geometry *g, tr_header *h);

/* Creates the segment O_EXCL with mode 0600. A segment of the same name whose owner is dead
 * (or that never finished starting) is unlinked first; one served by a live sidecar is refused. */
int tr_segment_create(const char *name, const tr_segment_geometry *g, tr_segment *seg, char *err,
                      size_t errlen);
void tr_segment_destroy(tr_segment *seg);

#endif
