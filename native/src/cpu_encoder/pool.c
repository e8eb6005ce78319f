/* The encoder's helper threads (pool.h): one 64-bit word holds the job's generation, its task count and the next task
 * to claim, so a claim is one compare-and-swap that fails once the job is over or another has begun. */
#define _GNU_SOURCE
#include "pool.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

enum {
    MAX_HELPERS = 7,
    /* pauses a helper polls for the next job before it sleeps: about 100 µs, longer than the serial work between the
     * jobs of one query, so that a query's jobs find the helpers awake */
    SPIN_PAUSES = 4000,
    /* pauses the caller polls for helpers to finish their tasks before it yields the core to them */
    WAIT_PAUSES = 2000
};

struct tr_pool {
    _Atomic uint64_t state; /* generation (32 bits) | tasks (16) | next task (16) */
    atomic_uint generation; /* the futex word: the low 32 bits of state's generation */
    atomic_int done, sleepers, stop;
    tr_task_fn fn;
    void *context;
    int helpers;
    pthread_t threads[MAX_HELPERS];
    struct seat {
        struct tr_pool *pool;
        int worker;
    } seats[MAX_HELPERS];
};

static uint64_t pack(uint32_t generation, uint32_t tasks, uint32_t next) {
    return (uint64_t)generation << 32 | (uint64_t)tasks << 16 | next;
}

/* Claims and runs tasks of the job of `generation` until none is left; they are counted in done. */
static void work(tr_pool *pool, uint32_t generation, int worker) {
    uint64_t state = atomic_load(&pool->state);
    for (;;) {
        const uint32_t tasks = (uint32_t)(state >> 16) & 0xFFFF, next = (uint32_t)state & 0xFFFF;
        if ((uint32_t)(state >> 32) != generation || next >= tasks) return;
        if (!atomic_compare_exchange_weak(&pool->state, &state, state + 1)) continue;
        /* a claimed task keeps its job from ending, so the job's function and context stay the ones published */
        pool->fn(pool->context, (int)next, worker);
        atomic_fetch_add(&pool->done, 1);
        state = atomic_load(&pool->state);
    }
}

static void *helper(void *argument) {
    const struct seat *seat = argument;
    tr_pool *pool = seat->pool;
    const int worker = seat->worker;
    uint32_t seen = atomic_load(&pool->generation);
    while (!atomic_load(&pool->stop)) {
        uint32_t now = atomic_load(&pool->generation);
        for (int spins = 0; now == seen && !atomic_load(&pool->stop); now = atomic_load(&pool->generation)) {
            if (++spins < SPIN_PAUSES) {
                _mm_pause();
                continue;
            }
            atomic_fetch_add(&pool->sleepers, 1);
            syscall(SYS_futex, &pool->generation, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
            atomic_fetch_sub(&pool->sleepers, 1);
            spins = 0;
        }
        seen = now;
        work(pool, now, worker);
    }
    return NULL;
}

tr_pool *tr_pool_create(int helpers) {
    if (helpers < 1 || helpers > MAX_HELPERS) return NULL;
    tr_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    for (int i = 0; i < helpers; ++i) {
        pool->seats[i] = (struct seat){pool, i + 1};
        if (pthread_create(&pool->threads[i], NULL, helper, &pool->seats[i]) != 0) {
            pool->helpers = i;
            tr_pool_destroy(pool);
            return NULL;
        }
        pool->helpers = i + 1;
    }
    return pool;
}

int tr_pool_helpers(const tr_pool *pool) { return pool ? pool->helpers : 0; }

void tr_pool_run(tr_pool *pool, tr_task_fn fn, void *context, int tasks) {
    if (!pool || tasks <= 1) {
        for (int task = 0; task < tasks; ++task) fn(context, task, 0);
        return;
    }
    const uint32_t generation = atomic_load(&pool->generation) + 1;
    pool->fn = fn, pool->context = context;
    atomic_store(&pool->done, 0);
    atomic_store(&pool->state, pack(generation, (uint32_t)tasks, 0));
    atomic_store(&pool->generation, generation);
    if (atomic_load(&pool->sleepers) > 0)
        syscall(SYS_futex, &pool->generation, FUTEX_WAKE_PRIVATE, pool->helpers, NULL, NULL, 0);
    work(pool, generation, 0);
    for (int spins = 0; atomic_load(&pool->done) < tasks; ++spins) {
        if (spins < WAIT_PAUSES)
            _mm_pause();
        else
            sched_yield();
    }
}

void tr_pool_destroy(tr_pool *pool) {
    if (!pool) return;
    atomic_store(&pool->stop, 1);
    atomic_fetch_add(&pool->generation, 1);
    syscall(SYS_futex, &pool->generation, FUTEX_WAKE_PRIVATE, MAX_HELPERS, NULL, NULL, 0);
    for (int i = 0; i < pool->helpers; ++i) pthread_join(pool->threads[i], NULL);
    free(pool);
}
