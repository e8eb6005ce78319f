/* tr-sidecar: the hot-tier process. Parses options, creates the segment, picks a backend, serves. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "options.h"
#include "segment.h"
#include "server.h"

void tr_print_layout_json(void);

/* --codes int8 is the CUDA backend's default up to this many dimensions (its kernels' shared memory past them:
 * libtrcuda refuses a start that asks for more than the GPU has). */
#define TR_CUDA_CODES_MAX_DIM 4096u

static volatile sig_atomic_t stop_requested = 0;
static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

static uint32_t next_pow2(uint64_t v) {
    uint64_t p = 1;
    while (p < v) p <<= 1;
    return (uint32_t)p;
}

/* libtrcuda.so's path: beside this executable. */
static int cuda_library_path(char *path, size_t len) {
    char self[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return -1;
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (!slash) return -1;
    *slash = 0;
    return snprintf(path, len, "%s/%s", self, TR_CUDA_LIBRARY) < (int)len ? 0 : -1;
}

/* The CUDA backend's operations from libtrcuda.so, or NULL with why in err (quiet = no message needed). */
static const tr_backend_ops *load_cuda_backend(char *err, size_t errlen) {
    char path[PATH_MAX + 32];
    if (cuda_library_path(path, sizeof path) != 0) {
        snprintf(err, errlen, "cannot find the folder of tr-sidecar to load %s from", TR_CUDA_LIBRARY);
        return NULL;
    }
    if (access(path, F_OK) != 0) {
        snprintf(err, errlen, "this install has no CUDA backend (no %s): install a wheel or a build made with a "
                              "CUDA toolkit present (TR_CUDA=ON), or use --backend cpu", path);
        return NULL;
    }
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(err, errlen, "the CUDA backend %s does not load: %s", path, dlerror());
        return NULL;
    }
    const uint32_t *layout = (const uint32_t *)dlsym(lib, TR_CUDA_LAYOUT_SYMBOL);
    const tr_backend_ops *ops = (const tr_backend_ops *)dlsym(lib, TR_CUDA_BACKEND_SYMBOL);
    if (!layout || !ops || *layout != TR_LAYOUT_VERSION) {
        snprintf(err, errlen, "%s is from another build (layout %u, this sidecar %u): reinstall the package so both "
                              "come from one build", path, layout ? *layout : 0u, TR_LAYOUT_VERSION);
        dlclose(lib);
        return NULL;
    }
    return ops; /* kept loaded for the life of the process */
}

/* The backend o->backend names (NULL, with a message, when this install lacks it); fills in the dtype it implies. */
static const tr_backend_ops *pick_backend(tr_options *o) {
    const tr_backend_ops *ops = &tr_cpu_backend;
    if (strcmp(o->backend, "cuda") == 0) {
        char err[PATH_MAX + 256];
        ops = load_cuda_backend(err, sizeof err);
        if (!ops) {
            fprintf(stderr, "tr-sidecar: %s\n", err);
            return NULL;
        }
    }
    if (!o->dtype) o->dtype = ops->kind == TR_BACKEND_CUDA ? "f16" : "f32";
    else if (strcmp(o->dtype, "float32") == 0) o->dtype = "f32";
    else if (strcmp(o->dtype, "float16") == 0) o->dtype = "f16";
    /* the CUDA backend re-scores its candidates with the tensor-core arithmetic of the f16 scan, and its kernels'
     * shared memory holds the queries of up to TR_CUDA_CODES_MAX_DIM dimensions */
    const int cuda = ops->kind == TR_BACKEND_CUDA, cuda_f32 = cuda && strcmp(o->dtype, "f32") == 0;
    if (!o->codes) {
        o->codes = cuda_f32 || (cuda && o->dim > TR_CUDA_CODES_MAX_DIM) ? "off" : "int8";
    } else if (cuda_f32 && strcmp(o->codes, "int8") == 0) {
        fprintf(stderr, "tr-sidecar: --codes int8 needs --dtype f16 on the cuda backend: drop --dtype f32, or use "
                        "--codes off\n");
        return NULL;
    }
    return ops;
}

static int act(tr_action action, tr_options *o) {
    switch (action) {
    case TR_ACTION_PRINT_LAYOUT: tr_print_layout_json(); return 0;
    case TR_ACTION_BACKENDS: {
        char err[PATH_MAX + 256];
        const int cuda = load_cuda_backend(err, sizeof err) != NULL;
        printf(cuda ? "cpu cuda\n" : "cpu\n");
        if (!cuda && o->verbose) fprintf(stderr, "tr-sidecar: no cuda: %s\n", err);
        return 0;
    }
    case TR_ACTION_VERSION: printf("tr-sidecar layout %u\n", TR_LAYOUT_VERSION); return 0;
    case TR_ACTION_HELP: tr_options_usage(stdout); return 0;
    case TR_ACTION_PRINT_CONFIG:
        if (!pick_backend(o)) return 2;
        tr_options_print_json(o, stdout);
        return 0;
    default: return 2;
    }
}

/* Forks before any backend state exists (a CUDA context does not survive fork). The parent exits at once so its
 * starter can reap it; the daemon belongs to no terminal. */
static int daemonize(void) {
    pid_t child = fork();
    if (child < 0) {
        fprintf(stderr, "tr-sidecar: fork: %s\n", strerror(errno));
        return -1;
    }
    if (child > 0) _exit(0);
    setsid();
    return 0;
}

static void handle_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static uint32_t cpu_isa_of(const char *name) {
    if (strcmp(name, "avx512-vnni") == 0) return TR_ISA_AVX512_VNNI;
    if (strcmp(name, "avx-vnni") == 0) return TR_ISA_AVX_VNNI;
    if (strcmp(name, "avx2") == 0) return TR_ISA_AVX2;
    if (strcmp(name, "scalar") == 0) return TR_ISA_SCALAR;
    return TR_ISA_AUTO;
}

static int serve(const tr_options *o, const tr_backend_ops *ops) {
    const uint32_t dtype = strcmp(o->dtype, "f16") == 0 ? TR_DTYPE_F16 : TR_DTYPE_F32;
    const uint32_t codes = strcmp(o->codes, "int8") == 0 ? TR_CODES_INT8 : TR_CODES_OFF;
    uint64_t namespaces = o->namespaces;
    if (namespaces == TR_OPT_AUTO)
        namespaces = o->capacity * 2 < 4096 ? 4096 : (o->capacity * 2 > (1u << 20) ? (1u << 20) : o->capacity * 2);
    tr_segment_geometry g = {(uint32_t)o->dim, dtype, ops->kind, o->capacity, (uint32_t)o->slots,
                             o->slot_bytes == TR_OPT_AUTO ? 0u : (uint32_t)o->slot_bytes, next_pow2(namespaces), codes};
    char err[512] = {0};
    tr_segment seg;
    if (tr_segment_create(o->name, &g, &seg, err, sizeof err) != 0) {
        fprintf(stderr, "tr-sidecar: %s\n", err);
        return 1;
    }
    tr_backend_config cfg = {(uint32_t)o->dim, dtype, o->capacity, TR_MAX_K,
                             o->threads == TR_OPT_AUTO ? 0u : (uint32_t)o->threads, (int)o->device, seg.base,
                             seg.bytes, o->cuda, codes, o->codes_min_rows, cpu_isa_of(o->test_cpu_isa),
                             &seg.header->code_scans, &seg.header->code_fallbacks};
    void *backend = ops->create(&cfg, err, sizeof err);
    if (!backend) {
        fprintf(stderr, "tr-sidecar: %s backend: %s\n", ops->name, err);
        tr_segment_destroy(&seg);
        return 1;
    }
    tr_server_options opt = {o->idle_spin_us * 1000ull, o->exit_when_orphaned_s * 1000000000ull, o->verbose,
                             o->ready_fd == TR_OPT_AUTO ? -1 : (int)o->ready_fd, o->gather_us * 1000ull,
                             o->test_batched_server};
    tr_server server;
    if (tr_server_init(&server, &seg, ops, backend, &opt, err, sizeof err) != 0) {
        fprintf(stderr, "tr-sidecar: %s\n", err);
        ops->destroy(backend);
        tr_segment_destroy(&seg);
        return 1;
    }
    if (o->verbose)
        fprintf(stderr, "tr-sidecar: serving /dev/shm%s (%s, dim %llu, %s, codes %s, capacity %llu, %llu slots)\n",
                seg.path, ops->name, (unsigned long long)o->dim, o->dtype, o->codes, (unsigned long long)o->capacity,
                (unsigned long long)o->slots);
    tr_server_run(&server, &stop_requested);
    tr_server_free(&server);
    ops->destroy(backend); /* before the segment goes: a CUDA backend unregisters it */
    tr_segment_destroy(&seg);
    if (o->verbose) fprintf(stderr, "tr-sidecar: stopped\n");
    return 0;
}

int main(int argc, char **argv) {
    tr_options o;
    tr_options_defaults(&o);
    const tr_action action = tr_options_parse(&o, argc, argv);
    if (action != TR_ACTION_SERVE) return act(action, &o);
    if (!o.name || !o.dim || !o.capacity) {
        fprintf(stderr, "tr-sidecar: --name, --dim and --capacity are required (see --help)\n");
        return 2;
    }
    const tr_backend_ops *ops = pick_backend(&o);
    if (!ops) return 2;
    if (o.daemon && daemonize() != 0) return 1;
    handle_signals();
    return serve(&o, ops);
}
