/* Creating, reclaiming and removing the sidecar's shared-memory segment in /dev/shm. */
#define _GNU_SOURCE
#include "segment.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "platform.h"

void tr_segment_plan(const tr_segment_geometry *g, tr_header *h) {
    memset(h, 0, sizeof *h);
    h->magic = TR_MAGIC;
    h->layout_version = TR_LAYOUT_VERSION;
    h->header_bytes = TR_HEADER_BYTES;
    h->dim = g->dim;
    h->dtype = g->dtype;
    h->backend = g->backend;
    h->codes = g->codes;
    h->capacity = g->capacity;
    h->slot_count = g->slot_count;
    uint64_t payload = g->slot_payload_bytes;
    /* At least one query at k = max_k and one upserted row must fit. */
    uint64_t need = TR_SEARCH_BYTES(1, g->dim, TR_MAX_K);
    if (TR_UPSERT_BYTES(1, g->dim) > need) need = TR_UPSERT_BYTES(1, g->dim);
    if (payload < need) payload = need;
    if (payload < TR_MIN_SLOT_PAYLOAD_BYTES) payload = TR_MIN_SLOT_PAYLOAD_BYTES;
    payload = TR_ALIGN64(payload);
    h->slot_payload_bytes = (uint32_t)payload;
    h->slot_bytes = (uint32_t)(TR_SLOT_HEADER_BYTES + payload);
    h->max_k = TR_MAX_K;
    uint32_t rows = (uint32_t)(payload / ((uint64_t)g->dim * 4u + 32u));
    while (rows > 1 && TR_UPSERT_BYTES(rows, g->dim) > payload) rows--;
    h->max_upsert_rows = rows;
    uint32_t queries = (uint32_t)(payload / ((uint64_t)g->dim * 4u + TR_MAX_K * 12u));
    while (queries > 1 && TR_SEARCH_BYTES(queries, g->dim, TR_MAX_K) > payload) queries--;
    h->max_search_queries = queries;
    h->ns_entries = g->ns_entries;
    h->clients_offset = TR_HEADER_BYTES;
    h->ns_offset = TR_ALIGN64(h->clients_offset + (uint64_t)TR_MAX_CLIENTS * sizeof(tr_client_entry));
    h->slots_offset = TR_ALIGN64(h->ns_offset + (uint64_t)g->ns_entries * sizeof(tr_ns_entry));
    h->segment_bytes = h->slots_offset + (uint64_t)g->slot_count * h->slot_bytes;
}

/* 1 when an existing segment may be removed: its owner is dead, or it never got a header
 * and is old enough that its creator cannot still be writing it. */
static int segment_is_stale(const char *path, pid_t *owner) {
    *owner = 0;
    int fd = shm_open(path, O_RDONLY, 0);
    if (fd < 0) return errno == ENOENT;
    struct stat st;
    int stale = 0;
    if (fstat(fd, &st) == 0) {
        if ((size_t)st.st_size >= sizeof(tr_header)) {
            tr_header h;
            if (pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && h.magic == TR_MAGIC) {
                *owner = h.owner_pid;
                stale = !tr_pid_alive(h.owner_pid);
            } else {
                stale = time(NULL) - st.st_mtime > 2;
            }
        } else {
            stale = time(NULL) - st.st_mtime > 2;
        }
    }
    close(fd);
    return stale;
}

int tr_segment_create(const char *name, const tr_segment_geometry *g, tr_segment *seg, char *err,
                      size_t errlen) {
    memset(seg, 0, sizeof *seg);
    if (tr_segment_path(name, seg->path, sizeof seg->path) != 0) {
        snprintf(err, errlen, "invalid segment name '%s': use 1-%u of [A-Za-z0-9_.-], not starting "
                 "with '.'", name, TR_NAME_MAX);
        return -1;
    }
    tr_header plan;
    tr_segment_plan(g, &plan);
    int fd = -1;
    for (int attempt = 0; attempt < 100; attempt++) {
        fd = shm_open(seg->path, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd >= 0 || errno != EEXIST) break;
        pid_t owner;
        if (segment_is_stale(seg->path, &owner)) {
            if (owner) fprintf(stderr, "tr-sidecar: reclaiming stale segment /dev/shm%s of dead pid %d\n",
                               seg->path, (int)owner);
            shm_unlink(seg->path);
            continue;
        }
        if (owner) {
            snprintf(err, errlen, "segment /dev/shm%s is served by a live sidecar (pid %d): stop it "
                     "first or choose another --name", seg->path, (int)owner);
            return -1;
        }
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL); /* someone is creating it right now */
    }
    if (fd < 0) {
        snprintf(err, errlen, "cannot create /dev/shm%s: %s", seg->path, strerror(errno));
        return -1;
    }
    fchmod(fd, 0600);
    if (ftruncate(fd, (off_t)plan.segment_bytes) != 0) {
        snprintf(err, errlen, "cannot size /dev/shm%s to %llu bytes: %s (is /dev/shm big enough?)",
                 seg->path, (unsigned long long)plan.segment_bytes, strerror(errno));
        close(fd);
        shm_unlink(seg->path);
        return -1;
    }
    void *base = mmap(NULL, plan.segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        snprintf(err, errlen, "cannot map /dev/shm%s: %s", seg->path, strerror(errno));
        shm_unlink(seg->path);
        return -1;
    }
    memset(base, 0, plan.segment_bytes);
    seg->base = base;
    seg->bytes = plan.segment_bytes;
    seg->header = (tr_header *)base;
    memcpy(seg->header, &plan, sizeof plan);
    seg->header->owner_pid = getpid();
    seg->header->owner_uid = getuid();
    seg->header->started_ns = tr_realtime_ns();
    seg->header->heartbeat_ns = tr_now_ns();
    return 0;
}

void tr_segment_destroy(tr_segment *seg) {
    if (!seg->base) return;
    tr_store_release(&seg->header->state, (uint32_t)TR_SERVER_STOPPING);
    shm_unlink(seg->path);
    munmap(seg->base, seg->bytes);
    seg->base = NULL;
}
