/* A persistent worker pool: threads start once, so a search never pays thread start-up. */
#ifndef TR_THREADPOOL_H
#define TR_THREADPOOL_H

#include <stdint.h>

typedef void (*tr_task_fn)(void *arg, uint32_t worker, uint32_t workers);

typedef struct tr_threadpool tr_threadpool;

/* threads = total workers including the caller (>= 1). */
tr_threadpool *tr_threadpool_create(uint32_t threads);
void tr_threadpool_destroy(tr_threadpool *pool);
uint32_t tr_threadpool_size(const tr_threadpool *pool);
/* Runs fn(arg, w, n) for w in [0, n): n = 1 when workers <= 1, else the pool size; the caller runs w = 0. */
void tr_threadpool_run(tr_threadpool *pool, uint32_t workers, tr_task_fn fn, void *arg);

#endif
