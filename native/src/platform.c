/* OS primitives the sidecar and the client share: clocks, futexes, process liveness, segment names. */
#define _GNU_SOURCE
#include "platform.h"

#include <errno.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "tiered_recall/layout.h"

uint64_t tr_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t tr_realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int tr_futex_wait(uint32_t *word, uint32_t expected, uint64_t timeout_ns) {
    struct timespec ts = {(time_t)(timeout_ns / 1000000000ull), (long)(timeout_ns % 1000000000ull)};
    long rc = syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, NULL, 0);
    return rc == 0 ? 0 : -errno;
}

int tr_futex_wake(uint32_t *word, int waiters) {
    long rc = syscall(SYS_futex, word, FUTEX_WAKE, waiters, NULL, NULL, 0);
    return rc < 0 ? -errno : (int)rc;
}

/* A zombie (killed but not yet reaped by its parent) still answers kill(pid, 0). */
static int pid_is_zombie(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *close_paren = strrchr(buf, ')');
    return close_paren && (close_paren[2] == 'Z' || close_paren[2] == 'X');
}

int tr_pid_alive(pid_t pid) {
    if (pid <= 0) return 0;
    if (kill(pid, 0) != 0 && errno != EPERM) return 0;
    return !pid_is_zombie(pid);
}

int tr_segment_name_valid(const char *name) {
    if (!name) return 0;
    size_t n = strlen(name);
    if (n == 0 || n > TR_NAME_MAX || name[0] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '-' || c == '.';
        if (!ok) return 0;
        if (c == '.' && i + 1 < n && name[i + 1] == '.') return 0;
    }
    return 1;
}

int tr_segment_path(const char *name, char *out, size_t out_size) {
    if (!tr_segment_name_valid(name)) return -1;
    int n = snprintf(out, out_size, "/%s%s", TR_SEGMENT_PREFIX, name);
    return (n > 0 && (size_t)n < out_size) ? 0 : -1;
}
