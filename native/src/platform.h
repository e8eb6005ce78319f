/* OS primitives the sidecar and the client share: clocks, futexes, atomics, process liveness, segments. */
#ifndef TR_PLATFORM_H
#define TR_PLATFORM_H

#include <stdint.h>
#include <stddef.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

uint64_t tr_now_ns(void);      /* CLOCK_MONOTONIC */
uint64_t tr_realtime_ns(void); /* CLOCK_REALTIME */

/* futex on a 32-bit word in a MAP_SHARED mapping (not FUTEX_PRIVATE: other processes wake us). */
int tr_futex_wait(uint32_t *word, uint32_t expected, uint64_t timeout_ns);
int tr_futex_wake(uint32_t *word, int waiters);

/* 1 when a process with this pid exists (kill(pid, 0) succeeds or says EPERM). */
int tr_pid_alive(pid_t pid);

/* Valid names: 1..TR_NAME_MAX of [A-Za-z0-9_.-], not starting with '.', no "..". */
int tr_segment_name_valid(const char *name);
/* Writes "/" TR_SEGMENT_PREFIX name into out (for shm_open). */
int tr_segment_path(const char *name, char *out, size_t out_size);

static inline void tr_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Asks for the cache line at p with intent to write (x86 PREFETCHW, a no-op on CPUs without it: without
 * -mprfchw, __builtin_prefetch(p, 1, ...) emits a read prefetch, which leaves the store's ownership request to do). */
static inline void tr_prefetch_for_write(const void *p) {
#if defined(__x86_64__) || defined(__i386__)
    __asm__ __volatile__("prefetchw %0" ::"m"(*(const char *)p));
#else
    __builtin_prefetch(p, 1, 3);
#endif
}

/* Hints the core to move the line at p out of its own caches into the shared last-level cache, where the next
 * reader on another core (or a device's DMA read) finds it sooner. x86 CLDEMOTE, spelled as bytes (0F 1C /0 with
 * [rdi]) so an assembler that predates it still builds it; it sits in the hint-NOP space, so a CPU without it
 * does nothing. TR_CLDEMOTE=0 leaves it out. */
#ifndef TR_CLDEMOTE
#define TR_CLDEMOTE 1
#endif
static inline void tr_cache_demote(const void *p) {
#if TR_CLDEMOTE && defined(__x86_64__)
    __asm__ __volatile__(".byte 0x0f, 0x1c, 0x07" ::"D"(p) : "memory");
#else
    (void)p;
#endif
}

#define tr_load_acquire(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define tr_load_relaxed(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define tr_store_release(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define tr_store_relaxed(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define tr_cas(p, expected_ptr, desired) \
    __atomic_compare_exchange_n((p), (expected_ptr), (desired), 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)

#ifdef __cplusplus
}
#endif
#endif
