/* The helper threads one query's encoder calls share its tasks with: the caller and the helpers claim tasks from one
 * counter, so a helper that is not running leaves its share to the caller instead of holding the call up (one taken
 * off its core in the middle of a task holds the call until it finishes that task). */
#ifndef TR_CPU_ENCODER_POOL_H
#define TR_CPU_ENCODER_POOL_H

/* One task of a job; worker is 0 for the caller, 1 to workers for the helpers. */
typedef void (*tr_task_fn)(void *context, int task, int worker);
typedef struct tr_pool tr_pool;

/* `helpers` threads (1 to 7) that spin a while after each job, then sleep until the next; NULL when they cannot be
 * started. */
tr_pool *tr_pool_create(int helpers);
int tr_pool_helpers(const tr_pool *pool);
/* Runs fn(context, task, worker) for every task in 0..tasks-1 (at most 65,535), returning when all are done. Only one
 * thread at a time may run jobs on a pool. */
void tr_pool_run(tr_pool *pool, tr_task_fn fn, void *context, int tasks);
void tr_pool_destroy(tr_pool *pool);

#endif
