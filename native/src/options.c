/* tr-sidecar's options: the defaults, the flag table that --help, the parser and --print-config all read. */
#define _GNU_SOURCE
#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "tiered_recall/layout.h"

void tr_options_defaults(tr_options *o) {
    memset(o, 0, sizeof *o);
    o->backend = "cpu";
    o->slots = 32;
    o->slot_bytes = TR_OPT_AUTO;
    o->namespaces = TR_OPT_AUTO;
    o->threads = TR_OPT_AUTO;
    o->codes_min_rows = TR_OPT_AUTO;
    o->test_cpu_isa = "auto";
    o->idle_spin_us = 2000;
    /* After a batch from several clients is answered, the server waits this long for them to come back (or for as
     * many requests as that batch and the gathered one held), so they share the next pass instead of alternating in
     * two half-size batches (docs/sidecar-options.md: how it was chosen). */
    o->gather_us = 25;
    o->ready_fd = TR_OPT_AUTO;
    o->cuda.persist = 1;
    /* The persistent kernel's one-trip merge is its own build (in one kernel with the scan it slowed the scan of
     * larger tiers, the more the more rounds each block walks); its merge is the shorter one up to this many rows. */
    o->cuda.one_trip_max_rows = 131072;
    o->cuda.split_max_rows = TR_OPT_AUTO;
}

typedef enum { F_U64, F_SWITCH, F_ONOFF, F_TEXT, F_CHOICE, F_ACTION } flag_kind;

typedef struct flag {
    const char *name;     /* without the leading -- */
    flag_kind kind;
    size_t offset;        /* into tr_options (F_ACTION: the tr_action) */
    uint64_t min, max;    /* F_U64 */
    const char *arg;      /* what --help shows for the value; F_CHOICE: the choices, '|'-separated */
    const char *help;
    const char *auto_text; /* --help's default where the field holds TR_OPT_AUTO, NULL or a required 0 */
} flag;

#define OFF(field) offsetof(tr_options, field)
static const flag flags[] = {
    {"name", F_TEXT, OFF(name), 0, 0, "NAME", "segment name: /dev/shm/" TR_SEGMENT_PREFIX "NAME, [A-Za-z0-9_.-]",
     "required"},
    {"dim", F_U64, OFF(dim), 1, TR_MAX_DIM, "D", "vector dimension", "required"},
    {"capacity", F_U64, OFF(capacity), 1, 1ull << 34, "ROWS", "hot rows kept; a full tier evicts the least recently "
     "used", "required"},
    {"dtype", F_CHOICE, OFF(dtype), 0, 0, "f32|f16|float32|float16", "element type of the stored vectors",
     "f16 on cuda, f32 on cpu"},
    {"backend", F_CHOICE, OFF(backend), 0, 0, "cpu|cuda", "which backend serves", NULL},
    {"slots", F_U64, OFF(slots), 1, 4096, "N", "request slots, i.e. requests in flight at once", NULL},
    {"slot-bytes", F_U64, OFF(slot_bytes), 1, 1ull << 30, "B", "payload bytes per slot",
     "256 KiB or what one request needs"},
    {"namespaces", F_U64, OFF(namespaces), 1, 1ull << 26, "N", "namespace table entries, rounded up to a power of two",
     "twice the capacity, 4096 to 1048576"},
    {"threads", F_U64, OFF(threads), 1, 256, "N", "CPU search threads", "one per online core"},
    {"device", F_U64, OFF(device), 0, 64, "N", "CUDA device", NULL},
    {"codes", F_CHOICE, OFF(codes), 0, 0, "int8|off", "keep 8-bit codes beside the rows: a search scans the codes, "
     "bounds each score and re-scores from the rows only those that can reach the top k (exact; 1 byte a dimension "
     "more a row); off: scan the rows", "int8, except cuda with --dtype f32: off"},
    {"codes-min-rows", F_U64, OFF(codes_min_rows), 0, 1ull << 34, "ROWS", "with --codes int8: tiers of fewer rows "
     "scan the rows (the codes pay from about this size); on the CPU also a namespace searched alone", "cpu 1024, cuda 100000"},
    {"idle-spin-us", F_U64, OFF(idle_spin_us), 0, 60ull * 1000 * 1000, "US", "keep polling this long after the last "
     "answer before sleeping (the CUDA backend also stops its persistent kernel then)", NULL},
    {"gather-us", F_U64, OFF(gather_us), 0, 1000ull * 1000, "US", "after answering searches of several clients, wait "
     "up to this long for them to come back and share the next pass (0: off)", NULL},
    {"exit-when-orphaned", F_U64, OFF(exit_when_orphaned_s), 0, 86400ull * 365, "S", "exit once no client has been "
     "attached for S seconds (0: never)", NULL},
    {"verbose", F_SWITCH, OFF(verbose), 0, 0, NULL, "log start-up and shutdown to stderr", NULL},
    {"daemon", F_SWITCH, OFF(daemon), 0, 0, NULL, "detach: fork, start a new session, the parent exits at once", NULL},
    {"ready-fd", F_U64, OFF(ready_fd), 0, 65535, "FD", "write \"ready PID\" to FD and close it once serving", "none"},
    {"cuda-persist", F_ONOFF, OFF(cuda.persist), 0, 0, "on|off", "cuda: a persistent kernel serves the searches it "
     "can take (f16 rows, k <= 64, up to 16 queries a pass); off: a launch per pass", NULL},
    {"cuda-one-trip-max-rows", F_U64, OFF(cuda.one_trip_max_rows), 0, 1ull << 34, "ROWS", "cuda: tiers of up to this "
     "many rows get the persistent kernel's build with the one-trip merge", NULL},
    {"cuda-split-max-rows", F_U64, OFF(cuda.split_max_rows), 0, 1ull << 34, "ROWS", "cuda: tiers of up to this many "
     "rows get its split-scan build over the row cache (0: never; at most what the cache holds)",
     "all the row cache holds"},
    {"cuda-verbose", F_SWITCH, OFF(cuda.verbose), 0, 0, NULL, "cuda: log the backend's choices and each persistent "
     "kernel start and stop", NULL},
    {"cuda-profile", F_SWITCH, OFF(cuda.profile), 0, 0, NULL, "cuda: time the persistent kernel's stages and log the "
     "means at each stop (benchmarks/persist_profile.py)", NULL},
    {"test-poison-results", F_SWITCH, OFF(cuda.test_poison_results), 0, 0, NULL, "tests only, cuda: fill result "
     "buffers with garbage before each search, so a result never written shows", NULL},
    {"test-no-zero-copy", F_SWITCH, OFF(cuda.test_no_zero_copy), 0, 0, NULL, "tests only, cuda: leave the segment "
     "unregistered, so results take the copy path of a machine where registration fails", NULL},
    {"test-cpu-isa", F_CHOICE, OFF(test_cpu_isa), 0, 0, "auto|avx512-vnni|avx-vnni|avx2|scalar", "tests only, cpu: "
     "the instructions the scan of the codes uses (auto: the best the CPU has; one it lacks is refused at start)",
     NULL},
    {"test-batched-server", F_SWITCH, OFF(test_batched_server), 0, 0, NULL, "tests only: gather searches into "
     "batches on a backend without batched search too (one call per request)", NULL},
    {"print-config", F_ACTION, TR_ACTION_PRINT_CONFIG, 0, 0, NULL, "print the options as JSON (after the other flags) "
     "and exit", NULL},
    {"print-layout", F_ACTION, TR_ACTION_PRINT_LAYOUT, 0, 0, NULL, "print the segment layout as JSON and exit", NULL},
    {"backends", F_ACTION, TR_ACTION_BACKENDS, 0, 0, NULL, "print the backends this install can serve from (cuda: libtrcuda.so beside tr-sidecar loads) and exit", NULL},
    {"version", F_ACTION, TR_ACTION_VERSION, 0, 0, NULL, "print the layout version and exit", NULL},
    {"help", F_ACTION, TR_ACTION_HELP, 0, 0, NULL, "print this and exit (also -h)", NULL},
};
#undef OFF
#define NFLAGS (sizeof flags / sizeof flags[0])

static void *field(tr_options *o, const flag *f) { return (char *)o + f->offset; }
static const void *cfield(const tr_options *o, const flag *f) { return (const char *)o + f->offset; }

/* text is one of f's '|'-separated choices */
static int is_choice(const flag *f, const char *text) {
    const size_t n = strlen(text);
    for (const char *c = f->arg; *c;) {
        const char *end = strchr(c, '|');
        const size_t len = end ? (size_t)(end - c) : strlen(c);
        if (len == n && strncmp(c, text, n) == 0) return 1;
        c += len + (end ? 1 : 0);
    }
    return 0;
}

static int set_value(tr_options *o, const flag *f, const char *text) {
    switch (f->kind) {
    case F_U64: {
        char *end = NULL;
        errno = 0;
        unsigned long long v = strtoull(text, &end, 10);
        if (errno || !end || *end || !text[0] || text[0] == '-' || v < f->min || v > f->max) {
            fprintf(stderr, "tr-sidecar: --%s needs an integer in [%llu, %llu], got '%s'\n", f->name,
                    (unsigned long long)f->min, (unsigned long long)f->max, text);
            return -1;
        }
        *(uint64_t *)field(o, f) = v;
        return 0;
    }
    case F_ONOFF:
        if (strcmp(text, "on") != 0 && strcmp(text, "off") != 0) {
            fprintf(stderr, "tr-sidecar: --%s needs on or off, got '%s'\n", f->name, text);
            return -1;
        }
        *(int *)field(o, f) = strcmp(text, "on") == 0;
        return 0;
    case F_CHOICE:
        if (!is_choice(f, text)) {
            fprintf(stderr, "tr-sidecar: --%s must be one of %s, got '%s'\n", f->name, f->arg, text);
            return -1;
        }
        /* fall through */
    case F_TEXT:
        *(const char **)field(o, f) = text;
        return 0;
    case F_SWITCH:
        *(int *)field(o, f) = 1;
        return 0;
    case F_ACTION:
        break;
    }
    return -1;
}

tr_action tr_options_parse(tr_options *o, int argc, char **argv) {
    struct option longopts[NFLAGS + 1];
    for (size_t i = 0; i < NFLAGS; i++) {
        const int takes = flags[i].kind == F_U64 || flags[i].kind == F_ONOFF || flags[i].kind == F_TEXT ||
                          flags[i].kind == F_CHOICE;
        longopts[i] = (struct option){flags[i].name, takes ? required_argument : no_argument, NULL, 256 + (int)i};
    }
    memset(&longopts[NFLAGS], 0, sizeof longopts[NFLAGS]);
    int print_config = 0, c;
    opterr = 0; /* the messages below name the flag and point to --help */
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        if (c == 'h') return TR_ACTION_HELP;
        if (c == '?' || c == ':') {
            const char *arg = argv[optind - 1];
            if (c == ':') fprintf(stderr, "tr-sidecar: %s needs a value (see --help)\n", arg);
            else if (optopt) fprintf(stderr, "tr-sidecar: unknown flag '-%c' (see --help)\n", optopt);
            else fprintf(stderr, "tr-sidecar: unknown flag '%s' (see --help)\n", arg);
            return TR_ACTION_BAD;
        }
        const flag *f = &flags[c - 256];
        if (f->kind == F_ACTION) {
            if ((tr_action)f->offset == TR_ACTION_PRINT_CONFIG) print_config = 1;
            else return (tr_action)f->offset;
        } else if (set_value(o, f, optarg) != 0) {
            return TR_ACTION_BAD;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "tr-sidecar: unexpected argument '%s' (see --help)\n", argv[optind]);
        return TR_ACTION_BAD;
    }
    return print_config ? TR_ACTION_PRINT_CONFIG : TR_ACTION_SERVE;
}

/* The value of f in o, as --help shows it (NULL: f has no value to show). */
static const char *value_text(const tr_options *o, const flag *f, char *buf, size_t len) {
    switch (f->kind) {
    case F_U64: {
        const uint64_t v = *(const uint64_t *)cfield(o, f);
        if (v == TR_OPT_AUTO || (v == 0 && f->min > 0)) return f->auto_text;
        snprintf(buf, len, "%llu", (unsigned long long)v);
        return buf;
    }
    case F_ONOFF: return *(const int *)cfield(o, f) ? "on" : "off";
    case F_TEXT:
    case F_CHOICE: {
        const char *t = *(const char *const *)cfield(o, f);
        return t ? t : f->auto_text;
    }
    default: return NULL;
    }
}

/* text after a 34-column margin, wrapped at 110 columns */
static void print_wrapped(FILE *out, const char *left, const char *text) {
    enum { MARGIN = 34, WIDTH = 110 };
    int col = fprintf(out, "  %-*s", MARGIN - 3, left);
    if (col >= MARGIN) {
        fputc('\n', out);
        col = fprintf(out, "%*s", MARGIN - 1, "");
    }
    while (*text) {
        const size_t word = strcspn(text, " ");
        if (col + 1 + (int)word > WIDTH && col > MARGIN) {
            fprintf(out, "\n%*s", MARGIN - 1, "");
            col = MARGIN - 1;
        }
        col += fprintf(out, " %.*s", (int)word, text);
        text += word;
        while (*text == ' ') text++;
    }
    fputc('\n', out);
}

void tr_options_usage(FILE *out) {
    tr_options d;
    tr_options_defaults(&d);
    fprintf(out, "usage: tr-sidecar --name NAME --dim D --capacity ROWS [options]\n"
                 "       tr-sidecar [options] --print-config | --print-layout | --backends | --version\n\n"
                 "Serves a tiered-recall hot tier from the shared-memory segment /dev/shm/" TR_SEGMENT_PREFIX "NAME.\n"
                 "A flag's value follows it (--flag VALUE) or is joined to it (--flag=VALUE).\n\n");
    for (size_t i = 0; i < NFLAGS; i++) {
        const flag *f = &flags[i];
        char left[64], buf[32], text[512];
        snprintf(left, sizeof left, "--%s%s%s", f->name, f->arg ? " " : "", f->arg ? f->arg : "");
        const char *def = f->kind == F_SWITCH ? "off" : value_text(&d, f, buf, sizeof buf);
        if (!def) snprintf(text, sizeof text, "%s", f->help);
        else if (strcmp(def, "required") == 0) snprintf(text, sizeof text, "%s (required)", f->help);
        else snprintf(text, sizeof text, "%s (default: %s)", f->help, def);
        print_wrapped(out, left, text);
    }
}

static void json_string(FILE *out, const char *s) {
    fputc('"', out);
    for (; *s; s++) {
        const unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(out, "\\%c", ch);
        else if (ch < 0x20) fprintf(out, "\\u%04x", ch);
        else fputc(ch, out);
    }
    fputc('"', out);
}

void tr_options_print_json(const tr_options *o, FILE *out) {
    fputc('{', out);
    int first = 1;
    for (size_t i = 0; i < NFLAGS; i++) {
        const flag *f = &flags[i];
        if (f->kind == F_ACTION) continue;
        fprintf(out, "%s\"", first ? "" : ", ");
        first = 0;
        for (const char *n = f->name; *n; n++) fputc(*n == '-' ? '_' : *n, out);
        fputs("\": ", out);
        switch (f->kind) {
        case F_U64: {
            const uint64_t v = *(const uint64_t *)cfield(o, f);
            if (v == TR_OPT_AUTO || (v == 0 && f->min > 0)) fputs("null", out);
            else fprintf(out, "%llu", (unsigned long long)v);
            break;
        }
        case F_SWITCH:
        case F_ONOFF: fputs(*(const int *)cfield(o, f) ? "true" : "false", out); break;
        default: {
            const char *t = *(const char *const *)cfield(o, f);
            if (t) json_string(out, t);
            else fputs("null", out);
        }
        }
    }
    fputs("}\n", out);
}
