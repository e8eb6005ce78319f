/* tr-fuzz-client: a hostile client for the sidecar's request ring (issue 8, fuzzing).
 *
 * Attaches to /dev/shm/tiered-recall.NAME and sends requests whose every field a client controls
 * (opcode, flags, k, count, ns_hash, seq, reply words, message, payload: ids, namespaces,
 * timestamps, vectors with NaN/inf/denormals/huge values) is random or a boundary value. It plays
 * by the slot-ownership rules (claims with a CAS, writes only slots it holds), so honest clients
 * can run beside it; within its own slots it also races the server (rewrites the payload while
 * the request is BUSY) and parks slots in nonsense states. With --header-garbage it also scribbles
 * over the header's geometry and the doorbell, then restores them (run that with no honest client:
 * the C client trusts the geometry it reads).
 *
 * Checks every reply: status is a known code, reply_seq matches, the message is NUL-terminated,
 * a search never claims more than k hits. Prints one JSON line of counts; exits 1 on any anomaly,
 * 3 if the sidecar died or stopped answering.
 *
 * Built only with -DTR_BUILD_FUZZ=ON:  cmake -S native -B /tmp/asan -DTR_SANITIZE=ON -DTR_BUILD_FUZZ=ON
 * usage: tr-fuzz-client --name NAME [--requests N] [--seconds S] [--seed X] [--inflight M]
 *                       [--header-garbage]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "platform.h"
#include "tiered_recall/layout.h"

#define MAX_INFLIGHT 64
#define HANG_NS (10ull * 1000 * 1000 * 1000)

static uint64_t rng_state;
static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static uint32_t pick(const uint32_t *v, size_t n) { return v[rnd() % n]; }
static uint64_t pick64(const uint64_t *v, size_t n) { return v[rnd() % n]; }

typedef struct {
    tr_slot *slot;
    uint32_t seq, opcode, k, count;
    uint64_t sent_ns;
    int raced;
} inflight;

static tr_header geo; /* our own copy, read once at attach */
static void *base;

static float hostile_float(void) {
    switch (rnd() % 12) {
    case 0: return NAN;
    case 1: return INFINITY;
    case 2: return -INFINITY;
    case 3: return 0.0f;
    case 4: return -0.0f;
    case 5: return 1e-45f; /* denormal */
    case 6: return 3.4e38f;
    case 7: return -3.4e38f;
    default: return (float)((double)(int64_t)rnd() / 9.3e18);
    }
}

static int64_t hostile_id(void) {
    switch (rnd() % 8) {
    case 0: return INT64_MIN;
    case 1: return INT64_MAX;
    case 2: return -1;
    case 3: return 0;
    case 4: return (int64_t)(rnd() % 64); /* collide with each other */
    default: return (int64_t)rnd();
    }
}

static uint64_t hostile_ns(void) {
    static const uint64_t v[] = {0, 1, UINT64_MAX, 42, 0x8000000000000000ULL};
    return rnd() % 3 ? v[rnd() % 5] : rnd();
}

/* Fills the bytes the server will read for this request, bounded by the payload. */
static void fill_payload(unsigned char *p, uint32_t op, uint32_t count, uint32_t k) {
    uint64_t cap = geo.slot_payload_bytes, d = geo.dim;
    uint64_t c = count > 4096 ? 4096 : count; /* the server refuses larger counts before reading */
    int finite_only = rnd() % 2;
    if (op == TR_OP_SEARCH) {
        uint64_t n = c * d;
        if (n * 4 > cap) n = cap / 4;
        float *f = (float *)p;
        for (uint64_t i = 0; i < n; i++) f[i] = finite_only ? (float)((double)(int64_t)rnd() / 9.3e18) : hostile_float();
        if (rnd() % 16 == 0 && n) memset(f, 0, d * 4 < n * 4 ? d * 4 : n * 4); /* a zero query */
    } else if (op == TR_OP_UPSERT) {
        uint64_t meta = 24 * c;
        if (TR_UPSERT_VECTORS_OFFSET(c) + c * d * 4 > cap) return; /* refused on count */
        int64_t *ids = (int64_t *)p;
        uint64_t *ns = (uint64_t *)(p + 8 * c);
        int64_t *created = (int64_t *)(p + 16 * c);
        for (uint64_t i = 0; i < c; i++) {
            ids[i] = hostile_id();
            ns[i] = hostile_ns();
            created[i] = hostile_id();
        }
        (void)meta;
        float *f = (float *)(p + TR_UPSERT_VECTORS_OFFSET(c));
        for (uint64_t i = 0; i < c * d; i++) f[i] = finite_only ? (float)((double)(int64_t)rnd() / 9.3e18) : hostile_float();
    } else if (op == TR_OP_DELETE || op == TR_OP_CONTAINS) {
        uint64_t n = c * 8 > cap ? cap / 8 : c;
        int64_t *ids = (int64_t *)p;
        for (uint64_t i = 0; i < n; i++) ids[i] = hostile_id();
    } else if (op == TR_OP_SET_TOTALS) {
        uint64_t n = c * 16 > cap ? cap / 16 : c;
        uint64_t *w = (uint64_t *)p;
        for (uint64_t i = 0; i < n; i++) {
            w[i] = hostile_ns();
            w[n + i] = rnd() % 2 ? rnd() : rnd() % 1000;
        }
    } else if (op == TR_OP_LIST_IDS) {
        const uint64_t cursors[] = {0, 1, 2, UINT64_MAX, UINT64_MAX - 1, 0x8000000000000000ull};
        uint64_t cursor = rnd() % 2 ? rnd() % 64 : pick64(cursors, sizeof cursors / sizeof cursors[0]);
        memcpy(p, &cursor, sizeof cursor);
    }
    (void)k;
}

static uint32_t hostile_count(uint32_t op) {
    uint32_t pl = geo.slot_payload_bytes;
    const uint32_t v[] = {0, 1, 2, 3, 7, 16, geo.max_upsert_rows, geo.max_upsert_rows + 1,
                          geo.max_search_queries, geo.max_search_queries + 1, pl / 9 - 8, pl / 9 - 7,
                          pl / 9 - 1, pl / 9, pl / 9 + 1, pl / 16, pl / 16 + 1, pl / 8 - 1, pl / 8,
                          pl / 8 + 1, 0x7FFFFFFF, 0xFFFFFFFF,
                          0x80000000u};
    if (rnd() % 16) return 1 + (uint32_t)(rnd() % 4); /* mostly small: cheap and reaches deep code */
    (void)op;
    return pick(v, sizeof v / sizeof v[0]);
}

static void send_one(inflight *f, tr_slot *slot, int32_t pid) {
    static const uint32_t ops[] = {TR_OP_PING, TR_OP_SEARCH, TR_OP_SEARCH, TR_OP_SEARCH, TR_OP_UPSERT,
                                   TR_OP_UPSERT, TR_OP_DELETE, TR_OP_CONTAINS, TR_OP_SET_TOTALS,
                                   TR_OP_CLEAR, TR_OP_LIST_IDS, 0, TR_OP_MAX + 1, 0xFFFFFFFF, 0x80000000u};
    static const uint32_t flag_set[] = {0, TR_FLAG_NS_FILTER, TR_FLAG_NORMALIZE, TR_FLAG_NO_TOUCH,
                                        TR_FLAGS_KNOWN, 8, 0xFFFFFFFF, 0x80000000u};
    uint32_t op = rnd() % 8 ? pick(ops, sizeof ops / sizeof ops[0]) : (uint32_t)rnd();
    if (op == TR_OP_CLEAR && rnd() % 8) op = TR_OP_PING; /* keep some rows around to search */
    uint32_t flags = rnd() % 8 ? pick(flag_set, 4) : pick(flag_set, sizeof flag_set / sizeof flag_set[0]);
    const uint32_t ks[] = {0, 1, 2, 10, geo.max_k - 1, geo.max_k, geo.max_k + 1, 0xFFFFFFFF, 0x80000000u};
    uint32_t k = rnd() % 4 ? 1 + (uint32_t)(rnd() % 16) : pick(ks, sizeof ks / sizeof ks[0]);
    uint32_t count = hostile_count(op);
    slot->owner_pid = pid;
    slot->opcode = op;
    slot->flags = flags;
    slot->k = k;
    slot->count = count;
    slot->ns_hash = hostile_ns();
    slot->status = (int32_t)rnd();      /* the server must overwrite the reply words */
    slot->reply_count = (uint32_t)rnd();
    slot->reply_seq = (uint32_t)rnd();
    slot->client_waiting = (uint32_t)(rnd() % 3); /* 0, 1 or nonsense: only a futex wake follows */
    slot->reserved0 = (uint32_t)rnd();
    slot->service_ns = rnd();
    memset(slot->message, 'X', TR_MESSAGE_BYTES); /* no NUL: the server must terminate its own */
    fill_payload(tr_slot_payload(slot), op, count, k);
    uint32_t seq = rnd() % 16 == 0 ? (uint32_t)rnd() : slot->seq + 1;
    slot->seq = seq;
    f->slot = slot;
    f->seq = seq;
    f->opcode = op;
    f->k = k;
    f->count = count;
    f->raced = 0;
    f->sent_ns = tr_now_ns();
    tr_store_release(&slot->state, (uint32_t)TR_SLOT_REQUEST);
    /* Hostile doorbell: random bumps, sometimes a nonsense "sleeping" word. */
    __atomic_fetch_add(&((tr_header *)base)->doorbell, rnd() % 4 ? 1u : (uint32_t)rnd(), __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&((tr_header *)base)->server_sleeping, __ATOMIC_SEQ_CST) || rnd() % 64 == 0)
        tr_futex_wake(&((tr_header *)base)->doorbell, 1);
}

static tr_slot *claim(uint32_t n) {
    uint32_t start = (uint32_t)(rnd() % n);
    for (uint32_t t = 0; t < n; t++) {
        tr_slot *s = tr_slot_at(base, &geo, (start + t) % n);
        uint32_t expected = TR_SLOT_FREE;
        if (tr_load_relaxed(&s->state) == TR_SLOT_FREE && tr_cas(&s->state, &expected, (uint32_t)TR_SLOT_CLAIMED))
            return s;
    }
    return NULL;
}

int main(int argc, char **argv) {
    const char *name = NULL;
    uint64_t requests = 100000, seed = 1;
    double seconds = 0;
    int inflight_n = 4, header_garbage = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--name") && i + 1 < argc) name = argv[++i];
        else if (!strcmp(argv[i], "--requests") && i + 1 < argc) requests = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--inflight") && i + 1 < argc) inflight_n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--header-garbage")) header_garbage = 1;
        else {
            fprintf(stderr, "usage: tr-fuzz-client --name NAME [--requests N] [--seconds S] [--seed X] "
                            "[--inflight M] [--header-garbage]\n");
            return 2;
        }
    }
    if (!name) {
        fprintf(stderr, "tr-fuzz-client: --name is required\n");
        return 2;
    }
    if (inflight_n < 1) inflight_n = 1;
    if (inflight_n > MAX_INFLIGHT) inflight_n = MAX_INFLIGHT;
    rng_state = seed * 0x2545F4914F6CDD1DULL + 1;
    char path[256];
    if (tr_segment_path(name, path, sizeof path) != 0) {
        fprintf(stderr, "tr-fuzz-client: invalid name\n");
        return 2;
    }
    int fd = shm_open(path, O_RDWR, 0);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(tr_header)) {
        fprintf(stderr, "tr-fuzz-client: cannot open /dev/shm%s: %s\n", path, strerror(errno));
        return 2;
    }
    base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) return 2;
    tr_header *h = base;
    geo = *h;
    if (geo.magic != TR_MAGIC || geo.layout_version != TR_LAYOUT_VERSION || geo.segment_bytes > (uint64_t)st.st_size) {
        fprintf(stderr, "tr-fuzz-client: not a v%u segment\n", TR_LAYOUT_VERSION);
        return 2;
    }
    const int32_t pid = getpid();
    const int32_t server = h->owner_pid;
    const uint32_t n = geo.slot_count;
    if ((uint32_t)inflight_n > n) inflight_n = (int)n;
    inflight fl[MAX_INFLIGHT];
    int active = 0;
    uint64_t sent = 0, answered = 0, ok = 0, errors = 0, anomalies = 0, hangs = 0, races = 0, header_rounds = 0;
    uint64_t by_status[16] = {0};
    const uint64_t t0 = tr_now_ns();
    const uint64_t stop_ns = seconds > 0 ? t0 + (uint64_t)(seconds * 1e9) : UINT64_MAX;
    uint64_t next_header = t0 + 200ull * 1000 * 1000, next_alive = t0;
    int dead = 0;
    while ((sent < requests && tr_now_ns() < stop_ns) || active) {
        /* top up */
        int header_due = header_garbage && tr_now_ns() >= next_header;
        while (!header_due && active < inflight_n && sent < requests && tr_now_ns() < stop_ns) {
            tr_slot *s = claim(n);
            if (!s) break;
            int action = (int)(rnd() % 64);
            if (action == 0) { /* park a claimed slot in a nonsense state, then take it back */
                uint32_t junk = 6 + (uint32_t)(rnd() % 1000);
                tr_store_release(&s->state, junk);
                usleep(50);
                tr_store_release(&s->state, (uint32_t)TR_SLOT_FREE);
                continue;
            }
            send_one(&fl[active++], s, pid);
            sent++;
        }
        uint64_t now = tr_now_ns();
        if (now >= next_alive) {
            if (!tr_pid_alive(server)) { dead = 1; break; }
            next_alive = now + 50ull * 1000 * 1000;
        }
        if (header_garbage && now >= next_header && active == 0) {
            /* scribble over geometry, doorbell and client table for a moment, then restore */
            unsigned char saved[128];
            memcpy(saved, h, sizeof saved);
            uint32_t *w = (uint32_t *)h;
            for (int i = 2; i < 32; i++) w[i] = (uint32_t)rnd(); /* keep magic so attach still fails cleanly */
            h->doorbell = (uint32_t)rnd();
            tr_futex_wake(&h->doorbell, 1);
            usleep(150 * 1000); /* > one sweep */
            memcpy(h, saved, sizeof saved);
            header_rounds++;
            next_header = tr_now_ns() + 300ull * 1000 * 1000;
        }
        for (int i = 0; i < active;) {
            inflight *f = &fl[i];
            uint32_t stv = tr_load_acquire(&f->slot->state);
            if (stv == TR_SLOT_BUSY && !f->raced && rnd() % 4 == 0) {
                /* race the server: rewrite fields and payload while it serves */
                f->raced = 1;
                races++;
                f->slot->count = (uint32_t)rnd();
                f->slot->opcode = (uint32_t)rnd();
                f->slot->k = (uint32_t)rnd();
                int64_t *p = (int64_t *)tr_slot_payload(f->slot);
                for (int j = 0; j < 64; j++) p[rnd() % 512] = hostile_id();
            }
            if (stv != TR_SLOT_DONE) {
                if (tr_now_ns() - f->sent_ns > HANG_NS) {
                    hangs++;
                    fprintf(stderr, "tr-fuzz-client: request op=%u k=%u count=%u unanswered for 10 s\n",
                            f->opcode, f->k, f->count);
                    dead = 1;
                    break;
                }
                i++;
                continue;
            }
            tr_slot *s = f->slot;
            int32_t status = s->status;
            answered++;
            int bad = 0;
            if (status > 0 || status < TR_E_INTERNAL) bad = 1;
            if (s->reply_seq != f->seq) bad = 1;
            if (memchr(s->message, '\0', TR_MESSAGE_BYTES) == NULL) bad = 1;
            if (status < 0 && s->message[0] == '\0') bad = 1;
            if (!f->raced && status == TR_OK && f->opcode == TR_OP_SEARCH && s->reply_count > f->k) bad = 1;
            if (status == TR_OK) ok++; else errors++;
            by_status[status <= 0 && status >= -15 ? -status : 15]++;
            if (bad) {
                anomalies++;
                if (anomalies <= 20)
                    fprintf(stderr, "tr-fuzz-client: anomaly op=%u k=%u count=%u raced=%d status=%d "
                            "reply_seq=%u seq=%u reply_count=%u\n", f->opcode, f->k, f->count, f->raced,
                            status, s->reply_seq, f->seq, s->reply_count);
            }
            s->owner_pid = 0;
            tr_store_release(&s->state, (uint32_t)TR_SLOT_FREE);
            fl[i] = fl[--active];
        }
        if (dead) break;
        if (active == inflight_n || sent >= requests) tr_cpu_relax();
    }
    double secs = (double)(tr_now_ns() - t0) / 1e9;
    int alive = tr_pid_alive(server);
    printf("{\"sent\": %llu, \"answered\": %llu, \"ok\": %llu, \"errors\": %llu, \"anomalies\": %llu, "
           "\"hangs\": %llu, \"races\": %llu, \"header_rounds\": %llu, \"seconds\": %.2f, \"rate\": %.0f, "
           "\"sidecar_alive\": %s, \"by_status\": [",
           (unsigned long long)sent, (unsigned long long)answered, (unsigned long long)ok,
           (unsigned long long)errors, (unsigned long long)anomalies, (unsigned long long)hangs,
           (unsigned long long)races, (unsigned long long)header_rounds, secs, answered / (secs > 0 ? secs : 1),
           alive ? "true" : "false");
    for (int i = 0; i < 16; i++) printf("%s%llu", i ? ", " : "", (unsigned long long)by_status[i]);
    printf("]}\n");
    fflush(stdout);
    if (!alive || dead) return 3;
    return anomalies ? 1 : 0;
}
