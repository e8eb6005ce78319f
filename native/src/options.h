/* Every tr-sidecar option in one struct (tr_options), filled once from the command line by main.c.
 *
 * options.c holds the defaults (tr_options_defaults) and the flag table that the parser, --help and --print-config
 * read; main.c hands the server its part (tr_server_options) and the backend tr_cuda_options. */
#ifndef TR_OPTIONS_H
#define TR_OPTIONS_H

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A value the sidecar works out itself (--print-config prints null), where a field has one. */
#define TR_OPT_AUTO UINT64_MAX

/* The CUDA backend's part (tr_backend_config.cuda). */
typedef struct tr_cuda_options {
    int persist;                /* --cuda-persist: the persistent kernel serves the searches it can take */
    uint64_t one_trip_max_rows; /* --cuda-one-trip-max-rows: its one-trip merge build up to this many rows */
    uint64_t split_max_rows;    /* --cuda-split-max-rows: its split-scan build up to this many (TR_OPT_AUTO: all
                                 * the row cache holds; 0: never) */
    int verbose;                /* --cuda-verbose: log the backend's choices and each persistent-kernel stop */
    int profile;                /* --cuda-profile: the persistent kernel's stage profile, logged at each stop */
    int test_poison_results;    /* --test-poison-results: result buffers hold garbage before each search */
    int test_no_zero_copy;      /* --test-no-zero-copy: do not register the segment; results are copied */
} tr_cuda_options;

typedef struct tr_options {
    /* what to serve */
    const char *name;           /* --name (required) */
    uint64_t dim;               /* --dim (required; 0 until given) */
    uint64_t capacity;          /* --capacity (required; 0 until given) */
    const char *dtype;          /* --dtype f32|f16 (NULL: f16 on cuda, f32 on cpu; main.c resolves it) */
    const char *backend;        /* --backend cpu|cuda */
    uint64_t slots;             /* --slots */
    uint64_t slot_bytes;        /* --slot-bytes (TR_OPT_AUTO: 256 KiB or what one request needs) */
    uint64_t namespaces;        /* --namespaces (TR_OPT_AUTO: twice the capacity, 4,096 to 1,048,576) */
    uint64_t threads;           /* --threads (TR_OPT_AUTO: one per online core) */
    uint64_t device;            /* --device */
    const char *codes;          /* --codes int8|off (NULL: int8 where the backend has it for the dtype; main.c) */
    uint64_t codes_min_rows;    /* --codes-min-rows (TR_OPT_AUTO: the backend's own) */
    const char *test_cpu_isa;   /* --test-cpu-isa auto|avx512-vnni|avx-vnni|avx2|scalar */
    /* the server */
    uint64_t idle_spin_us;      /* --idle-spin-us */
    uint64_t gather_us;         /* --gather-us */
    uint64_t exit_when_orphaned_s; /* --exit-when-orphaned (0: never) */
    int verbose;                /* --verbose */
    int daemon;                 /* --daemon */
    uint64_t ready_fd;          /* --ready-fd (TR_OPT_AUTO: none) */
    int test_batched_server;    /* --test-batched-server: gather searches for one backend call on any backend */
    tr_cuda_options cuda;
} tr_options;

void tr_options_defaults(tr_options *o);

/* What the command line asks for: serve, or an action that prints and exits. */
typedef enum tr_action {
    TR_ACTION_SERVE,
    TR_ACTION_PRINT_CONFIG, /* after every other flag is parsed */
    TR_ACTION_PRINT_LAYOUT,
    TR_ACTION_BACKENDS,
    TR_ACTION_VERSION,
    TR_ACTION_HELP,
    TR_ACTION_BAD           /* a bad flag or value: the message, naming the flag, is on stderr */
} tr_action;

/* Parses argv into o (which holds the defaults). --print-layout, --backends, --version and --help act at once, as
 * they are met; --print-config once every flag is parsed. */
tr_action tr_options_parse(tr_options *o, int argc, char **argv);
void tr_options_usage(FILE *out);
/* The options as one JSON object, keys the flags' names with '_' for '-'; TR_OPT_AUTO and unset values are null. */
void tr_options_print_json(const tr_options *o, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
