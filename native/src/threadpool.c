/* A persistent worker pool: workers spin briefly on a generation word, then sleep on a futex. */
#define _GNU_SOURCE
#include "threadpool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "platform.h"

struct tr_threadpool {
    uint32_t size;
    pthread_t *threads;
    uint32_t generation; /* bumped per job; workers futex-wait on it */
    uint32_t pending;    /* workers still running the current job */
    uint32_t active;     /* workers taking part in the current job */
    uint32_t stop;
    tr_task_fn fn;
    void *arg;
};

typedef struct {
    tr_threadpool *pool;
    uint32_t index;
} worker_arg;

static void futex_wait_private(uint32_t *w, uint32_t v) {
    syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}
static void futex_wake_private(uint32_t *w) {
    syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

static void *worker_main(void *p) {
    worker_arg wa = *(worker_arg *)p;
    free(p);
    tr_threadpool *pool = wa.pool;
    uint32_t seen = 0;
    for (;;) {
        uint32_t gen;
        int spins = 0;
        while ((gen = tr_load_acquire(&pool->generation)) == seen) {
            if (tr_load_acquire(&pool->stop)) return NULL;
            if (++spins < 2000) tr_cpu_relax();
            else futex_wait_private(&pool->generation, seen);
        }
        seen = gen;
        if (tr_load_acquire(&pool->stop)) return NULL;
        uint32_t active = tr_load_acquire(&pool->active);
        if (wa.index < active) {
            pool->fn(pool->arg, wa.index, active);
            __atomic_fetch_sub(&pool->pending, 1, __ATOMIC_ACQ_REL);
        }
    }
}

tr_threadpool *tr_threadpool_create(uint32_t threads) {
    if (threads < 1) threads = 1;
    tr_threadpool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->size = threads;
    pool->threads = calloc(threads, sizeof(pthread_t));
    for (uint32_t i = 1; i < threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        wa->pool = pool;
        wa->index = i;
        if (pthread_create(&pool->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            pool->size = i;
            break;
        }
    }
    return pool;
}

void tr_threadpool_destroy(tr_threadpool *pool) {
    if (!pool) return;
    tr_store_release(&pool->stop, 1);
    __atomic_fetch_add(&pool->generation, 1, __ATOMIC_ACQ_REL);
    futex_wake_private(&pool->generation);
    for (uint32_t i = 1; i < pool->size; i++) pthread_join(pool->threads[i], NULL);
    free(pool->threads);
    free(pool);
}

uint32_t tr_threadpool_size(const tr_threadpool *pool) { return pool->size; }

void tr_threadpool_run(tr_threadpool *pool, uint32_t workers, tr_task_fn fn, void *arg) {
    /* A job uses every worker or only the caller: partial jobs would let a slow idle worker
     * read the next job's `active` under an old generation and run it twice. */
    workers = workers <= 1 ? 1 : pool->size;
    if (workers <= 1) {
        fn(arg, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->arg = arg;
    tr_store_release(&pool->active, workers);
    tr_store_release(&pool->pending, workers - 1);
    __atomic_fetch_add(&pool->generation, 1, __ATOMIC_ACQ_REL);
    futex_wake_private(&pool->generation);
    fn(arg, 0, workers);
    while (tr_load_acquire(&pool->pending) != 0) tr_cpu_relax();
}
