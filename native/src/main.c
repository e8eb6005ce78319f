/* tr-sidecar: the hot-tier process. Parses options, creates the segment, picks a backend, serves. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "segment.h"
#include "server.h"

void tr_print_layout_json(void);

static volatile sig_atomic_t stop_requested = 0;
static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: tr-sidecar --name NAME --dim D --capacity ROWS [options]\n"
            "       tr-sidecar --print-layout | --backends | --version\n\n"
            "Serves a tiered-recall hot tier from the shared-memory segment /dev/shm/" TR_SEGMENT_PREFIX "NAME.\n\n"
            "  --name NAME            segment name: [A-Za-z0-9_.-], at most %u characters\n"
            "  --dim D                vector dimension (1..%u)\n"
            "  --capacity ROWS        hot rows kept; a full tier evicts the least recently used\n"
            "  --dtype f32|f16        element type of the stored vectors (default f32 on cpu, f16 on cuda)\n"
            "  --backend cpu|cuda     which backend serves (default cpu)\n"
            "  --slots N              request slots, i.e. requests in flight at once (default 32)\n"
            "  --slot-bytes B         payload bytes per slot (default 256 KiB or what one request needs)\n"
            "  --namespaces N         namespace table entries, rounded up to a power of two\n"
            "  --threads N            CPU search threads (default: one per online core)\n"
            "  --device N             CUDA device (default 0)\n"
            "  --idle-spin-us US      keep polling this long after the last answer before sleeping (default 2000)\n"
            "  --exit-when-orphaned S exit once no client has been attached for S seconds (default: never)\n"
            "  --verbose              log start-up and shutdown to stderr\n"
            "  --daemon               detach: fork, start a new session, the parent exits at once\n"
            "  --ready-fd FD          write \"ready PID\" to FD and close it once serving\n"
            "  --print-layout         print the segment layout as JSON and exit\n"
            "  --backends             print the compiled backends and exit\n",
            TR_NAME_MAX, TR_MAX_DIM);
}

static int parse_u64(const char *flag, const char *text, uint64_t min, uint64_t max, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || !end || *end || text[0] == '-' || v < min || v > max) {
        fprintf(stderr, "tr-sidecar: %s needs an integer in [%llu, %llu], got '%s'\n", flag,
                (unsigned long long)min, (unsigned long long)max, text);
        return -1;
    }
    *out = v;
    return 0;
}

static uint32_t next_pow2(uint64_t v) {
    uint64_t p = 1;
    while (p < v) p <<= 1;
    return (uint32_t)p;
}

int main(int argc, char **argv) {
    const char *name = NULL, *dtype_text = NULL, *backend_text = "cpu";
    uint64_t dim = 0, capacity = 0, slots = 32, slot_bytes = 0, namespaces = 0, threads = 0, device = 0;
    uint64_t idle_spin_us = 2000, orphan_s = 0, ready_fd = UINT64_MAX;
    int verbose = 0, daemonize = 0;
    enum { O_NAME = 256, O_DIM, O_CAP, O_DTYPE, O_BACKEND, O_SLOTS, O_SLOT_BYTES, O_NS, O_THREADS,
           O_DEVICE, O_SPIN, O_ORPHAN, O_VERBOSE, O_DAEMON, O_READY_FD, O_LAYOUT, O_BACKENDS, O_VERSION, O_HELP };
    static const struct option options[] = {
        {"name", required_argument, 0, O_NAME}, {"dim", required_argument, 0, O_DIM},
        {"capacity", required_argument, 0, O_CAP}, {"dtype", required_argument, 0, O_DTYPE},
        {"backend", required_argument, 0, O_BACKEND}, {"slots", required_argument, 0, O_SLOTS},
        {"slot-bytes", required_argument, 0, O_SLOT_BYTES}, {"namespaces", required_argument, 0, O_NS},
        {"threads", required_argument, 0, O_THREADS}, {"device", required_argument, 0, O_DEVICE},
        {"idle-spin-us", required_argument, 0, O_SPIN},
        {"exit-when-orphaned", required_argument, 0, O_ORPHAN}, {"verbose", no_argument, 0, O_VERBOSE},
        {"daemon", no_argument, 0, O_DAEMON}, {"ready-fd", required_argument, 0, O_READY_FD},
        {"print-layout", no_argument, 0, O_LAYOUT}, {"backends", no_argument, 0, O_BACKENDS},
        {"version", no_argument, 0, O_VERSION}, {"help", no_argument, 0, O_HELP}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case O_NAME: name = optarg; break;
        case O_DIM: bad = parse_u64("--dim", optarg, 1, TR_MAX_DIM, &dim); break;
        case O_CAP: bad = parse_u64("--capacity", optarg, 1, 1ull << 34, &capacity); break;
        case O_DTYPE: dtype_text = optarg; break;
        case O_BACKEND: backend_text = optarg; break;
        case O_SLOTS: bad = parse_u64("--slots", optarg, 1, 4096, &slots); break;
        case O_SLOT_BYTES: bad = parse_u64("--slot-bytes", optarg, 1, 1ull << 30, &slot_bytes); break;
        case O_NS: bad = parse_u64("--namespaces", optarg, 1, 1ull << 26, &namespaces); break;
        case O_THREADS: bad = parse_u64("--threads", optarg, 1, 256, &threads); break;
        case O_DEVICE: bad = parse_u64("--device", optarg, 0, 64, &device); break;
        case O_SPIN: bad = parse_u64("--idle-spin-us", optarg, 0, 60ull * 1000 * 1000, &idle_spin_us); break;
        case O_ORPHAN: bad = parse_u64("--exit-when-orphaned", optarg, 0, 86400ull * 365, &orphan_s); break;
        case O_VERBOSE: verbose = 1; break;
        case O_DAEMON: daemonize = 1; break;
        case O_READY_FD: bad = parse_u64("--ready-fd", optarg, 0, 65535, &ready_fd); break;
        case O_LAYOUT: tr_print_layout_json(); return 0;
        case O_BACKENDS:
#ifdef TR_WITH_CUDA
            printf("cpu cuda\n");
#else
            printf("cpu\n");
#endif
            return 0;
        case O_VERSION: printf("tr-sidecar layout %u\n", TR_LAYOUT_VERSION); return 0;
        case 'h': case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "tr-sidecar: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!name || !dim || !capacity) {
        fprintf(stderr, "tr-sidecar: --name, --dim and --capacity are required (see --help)\n");
        return 2;
    }
    const tr_backend_ops *ops = NULL;
    if (strcmp(backend_text, "cpu") == 0) {
        ops = &tr_cpu_backend;
    } else if (strcmp(backend_text, "cuda") == 0) {
#ifdef TR_WITH_CUDA
        ops = &tr_cuda_backend;
#else
        fprintf(stderr, "tr-sidecar: this build has no CUDA backend: reinstall with a CUDA toolkit "
                        "present (TR_CUDA=ON) or use --backend cpu\n");
        return 2;
#endif
    } else {
        fprintf(stderr, "tr-sidecar: --backend must be cpu or cuda, got '%s'\n", backend_text);
        return 2;
    }
    uint32_t dtype = ops->kind == TR_BACKEND_CUDA ? TR_DTYPE_F16 : TR_DTYPE_F32;
    if (dtype_text) {
        if (strcmp(dtype_text, "f32") == 0 || strcmp(dtype_text, "float32") == 0) dtype = TR_DTYPE_F32;
        else if (strcmp(dtype_text, "f16") == 0 || strcmp(dtype_text, "float16") == 0) dtype = TR_DTYPE_F16;
        else {
            fprintf(stderr, "tr-sidecar: --dtype must be f32 or f16, got '%s'\n", dtype_text);
            return 2;
        }
    }
    if (!namespaces) namespaces = capacity * 2 < 4096 ? 4096 : (capacity * 2 > (1u << 20) ? (1u << 20) : capacity * 2);
    tr_segment_geometry g = {(uint32_t)dim, dtype, ops->kind, capacity, (uint32_t)slots,
                             (uint32_t)slot_bytes, next_pow2(namespaces)};

    if (daemonize) {
        /* Before any backend state exists (a CUDA context does not survive fork). The parent
         * exits at once so its starter can reap it; the daemon belongs to no terminal. */
        pid_t child = fork();
        if (child < 0) {
            fprintf(stderr, "tr-sidecar: fork: %s\n", strerror(errno));
            return 1;
        }
        if (child > 0) _exit(0);
        setsid();
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    char err[512] = {0};
    tr_segment seg;
    if (tr_segment_create(name, &g, &seg, err, sizeof err) != 0) {
        fprintf(stderr, "tr-sidecar: %s\n", err);
        return 1;
    }
    tr_backend_config cfg = {(uint32_t)dim, dtype, capacity, TR_MAX_K, (uint32_t)threads, (int)device,
                             seg.base, seg.bytes};
    void *backend = ops->create(&cfg, err, sizeof err);
    if (!backend) {
        fprintf(stderr, "tr-sidecar: %s backend: %s\n", ops->name, err);
        tr_segment_destroy(&seg);
        return 1;
    }
    tr_server_options opt = {idle_spin_us * 1000ull, orphan_s * 1000000000ull, verbose,
                             ready_fd == UINT64_MAX ? -1 : (int)ready_fd};
    tr_server server;
    if (tr_server_init(&server, &seg, ops, backend, &opt, err, sizeof err) != 0) {
        fprintf(stderr, "tr-sidecar: %s\n", err);
        ops->destroy(backend);
        tr_segment_destroy(&seg);
        return 1;
    }
    if (verbose)
        fprintf(stderr, "tr-sidecar: serving /dev/shm%s (%s, dim %llu, %s, capacity %llu, %llu slots)\n",
                seg.path, ops->name, (unsigned long long)dim, dtype == TR_DTYPE_F16 ? "f16" : "f32",
                (unsigned long long)capacity, (unsigned long long)slots);
    tr_server_run(&server, &stop_requested);
    tr_server_free(&server);
    ops->destroy(backend); /* before the segment goes: a CUDA backend unregisters it */
    tr_segment_destroy(&seg);
    if (verbose) fprintf(stderr, "tr-sidecar: stopped\n");
    return 0;
}
