/* xgrad CPU worker pool: one call runs a kernel over [0, total) on nthreads threads.
 *
 * Kernel ABI: void kernel(void** restrict bufs, const int* restrict vars, int start, int end).
 * [0, total) is split into nthreads contiguous shares; the caller runs share 0 itself, persistent workers
 * 1..nthreads-1 the others, each waiting on its own cache-line sized slot so workers that are not needed are never
 * woken. A thread runs its share a grain (1/GRAINS_PER_SHARE of it) at a time from the front, then helps the others
 * by taking grains from the back of shares whose owners have started: on a shared VM one core often runs slower for
 * a while (another tenant's load), and a static split would wait for it (2048^2 matmul under such load: paired
 * median 0.94-0.96 of the static split's time, best 99-102 ms against 109-117). A share whose owner has not started
 * yet (a worker still waking) is left to it, so every thread gets its own first grain.
 * A waiter spins for SPIN_NS and then sleeps on a condition variable: 1 ms covers the Python work between two
 * kernels of a step (building and scheduling a graph takes 0.2-0.5 ms), and waking a sleeping worker costs 40-100 us
 * here (a VM), more than a small kernel itself.
 * Sleep/wake uses the "store flag, then load the other side's word" pattern with seq_cst atomics on both sides, so a
 * wakeup is never lost.
 * Calls are serialised by run_mu, which is also held across fork() so a child starts with a clean, empty pool.
 * Placement (Linux): workers keep off the caller's core (see keep_off).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getcpu, CPU_SET */
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef void (*xgrad_kernel)(void **bufs, const int *vars, int start, int end);

#define XGRAD_MAX_THREADS 256
#define SPIN_NS 1000000
#define GRAINS_PER_SHARE 16

/* A thread's share of the current job: [front, back) packed as back << 32 | front, claimed with compare-and-swap;
 * the owner takes grains at the front, helpers at the back. */
typedef struct {
  _Alignas(64) _Atomic uint64_t span;
  uint32_t start; /* where the share began: front == start means the owner has not started */
} share_t;

static share_t shares[XGRAD_MAX_THREADS];
static xgrad_kernel job_fn;
static void **job_bufs;
static const int *job_vars;
static uint32_t job_grain;
static int job_nthreads; /* the job's thread count (the caller included) */

static inline uint64_t pack_span(uint32_t front, uint32_t back) { return (uint64_t)back << 32 | front; }

/* Claim up to job_grain iterations of share s into [*a, *b): from the front (its owner) or the back (a helper, only
 * once the owner has started); 0 when there is nothing to take. */
static int claim(share_t *s, int from_back, uint32_t *a, uint32_t *b) {
  uint64_t old = atomic_load_explicit(&s->span, memory_order_relaxed);
  for (;;) {
    uint32_t front = (uint32_t)old, back = (uint32_t)(old >> 32);
    if (front >= back || (from_back && front == s->start)) return 0;
    uint32_t n = back - front < job_grain ? back - front : job_grain;
    uint64_t next = from_back ? pack_span(front, back - n) : pack_span(front + n, back);
    if (atomic_compare_exchange_weak_explicit(&s->span, &old, next, memory_order_relaxed, memory_order_relaxed)) {
      *a = from_back ? back - n : front;
      *b = from_back ? back : front + n;
      return 1;
    }
  }
}

/* Thread `me`'s part of the current job: its own share, then grains of the others'. */
static void run_share(int me) {
  uint32_t a, b;
  while (claim(&shares[me], 0, &a, &b)) job_fn(job_bufs, job_vars, (int)a, (int)b);
  for (int k = 1; k < job_nthreads; k++) {
    share_t *s = &shares[(me + k) % job_nthreads];
    while (claim(s, 1, &a, &b)) job_fn(job_bufs, job_vars, (int)a, (int)b);
  }
}

typedef struct {
  _Alignas(64) atomic_uint gen; /* bumped by the caller to post a job */
  atomic_int sleeping;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int index;      /* the slot's place in slots[] and its share in shares[] */
#if defined(__linux__)
  cpu_set_t base; /* the worker's affinity set when it started */
#endif
  int ncpu;       /* the number of cores in it */
  int off;        /* the core the worker keeps off now (-1: none) */
} slot_t;

static slot_t slots[XGRAD_MAX_THREADS];
static int nstarted = 1; /* slot 0 is the caller */
static pthread_mutex_t run_mu = PTHREAD_MUTEX_INITIALIZER;
static int atfork_registered = 0;

static _Alignas(64) atomic_int pending;
static atomic_int caller_sleeping;
static pthread_mutex_t done_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* bounded busy-wait: keep_spinning() returns 0 once SPIN_NS have passed since the first call. It yields the core
 * now and then so that, when threads outnumber free cores, the thread we wait for gets to run. */
typedef struct {
  uint64_t deadline;
  unsigned iters;
} spin_t;

static int keep_spinning(spin_t *sp) {
  if ((++sp->iters & 255) == 0) {
    uint64_t t = now_ns();
    if (sp->deadline == 0) sp->deadline = t + SPIN_NS;
    else if (t > sp->deadline) return 0;
    sched_yield();
  }
  cpu_relax();
  return 1;
}

/* The caller's core while a job is out (-1: unknown). */
static atomic_int caller_cpu = -1;

/* A worker woken from sleep can be placed on the core of the thread that woke it: the two then share one core, and
 * a kernel takes twice as long until the scheduler moves one of them (measured on a 2-core VM: half of the calls
 * after an idle pause ran at half speed). So while a job has no more threads than the worker has cores, the worker
 * may run on every core of its starting affinity set except the caller's; when the caller shows up on another core
 * the set follows (one syscall). The caller is never pinned: the scheduler can still move it. */
static void keep_off(slot_t *s, int cpu, int threads) {
#if defined(__linux__)
  if (threads > s->ncpu || cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &s->base)) cpu = -1;
  if (cpu == s->off) return;
  cpu_set_t mask = s->base;
  if (cpu >= 0) CPU_CLR(cpu, &mask);
  sched_setaffinity(0, sizeof mask, &mask);
  s->off = cpu;
#else
  (void)s;
  (void)cpu;
  (void)threads;
#endif
}

static void *worker_main(void *arg) {
  slot_t *s = (slot_t *)arg;
  unsigned seen = 0;
  s->off = -1;
#if defined(__linux__)
  if (sched_getaffinity(0, sizeof s->base, &s->base) != 0) CPU_ZERO(&s->base);
  s->ncpu = CPU_COUNT(&s->base);
#endif
  for (;;) {
    spin_t sp = {0, 0};
    while (atomic_load_explicit(&s->gen, memory_order_acquire) == seen) {
      if (keep_spinning(&sp)) continue;
      pthread_mutex_lock(&s->mu);
      atomic_store(&s->sleeping, 1);
      while (atomic_load(&s->gen) == seen) pthread_cond_wait(&s->cv, &s->mu);
      atomic_store(&s->sleeping, 0);
      pthread_mutex_unlock(&s->mu);
    }
    seen = atomic_load_explicit(&s->gen, memory_order_acquire);
    keep_off(s, atomic_load_explicit(&caller_cpu, memory_order_relaxed),
             job_nthreads);
    run_share(s->index);
    if (atomic_fetch_sub(&pending, 1) == 1 && atomic_load(&caller_sleeping)) {
      pthread_mutex_lock(&done_mu);
      pthread_cond_signal(&done_cv);
      pthread_mutex_unlock(&done_mu);
    }
  }
  return NULL;
}

static void init_slot(slot_t *s) {
  memset(s, 0, sizeof(*s));
  s->index = (int)(s - slots);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
}

static void before_fork(void) { pthread_mutex_lock(&run_mu); }
static void after_fork_parent(void) { pthread_mutex_unlock(&run_mu); }
static void after_fork_child(void) {
  /* the workers do not exist in the child: forget them, the next call starts new ones */
  for (int i = 1; i < nstarted; i++) init_slot(&slots[i]);
  nstarted = 1;
  pthread_mutex_init(&done_mu, NULL);
  pthread_cond_init(&done_cv, NULL);
  atomic_store(&pending, 0);
  atomic_store(&caller_sleeping, 0);
  pthread_mutex_unlock(&run_mu);
}

/* start workers up to n threads in all; returns how many threads (caller included) are available */
static int ensure_threads(int n) {
  if (!atfork_registered) {
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    atfork_registered = 1;
  }
  while (nstarted < n) {
    slot_t *s = &slots[nstarted];
    init_slot(s);
    pthread_t tid;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 8u << 20);  /* kernels keep packed panels (up to 512 KiB) on the stack */
    int err = pthread_create(&tid, &attr, worker_main, s);
    pthread_attr_destroy(&attr);
    if (err != 0) break;
    nstarted++;
  }
  return nstarted < n ? nstarted : n;
}

int xgrad_pool_max_threads(void) { return XGRAD_MAX_THREADS; }

/* Run fn over [0, total) on nthreads threads (see the top of this file); returns the number of threads used. */
int xgrad_pool_run(xgrad_kernel fn, void **bufs, const int *vars, int total, int nthreads) {
  if (nthreads > total) nthreads = total;
  if (nthreads > XGRAD_MAX_THREADS) nthreads = XGRAD_MAX_THREADS;
  if (nthreads <= 1) {
    fn(bufs, vars, 0, total);
    return 1;
  }
  pthread_mutex_lock(&run_mu);
  nthreads = ensure_threads(nthreads);
  atomic_store(&pending, nthreads - 1);
#if defined(__linux__)
  atomic_store_explicit(&caller_cpu, sched_getcpu(), memory_order_relaxed);
#endif
  job_fn = fn;
  job_bufs = bufs;
  job_vars = vars;
  job_nthreads = nthreads;
  uint32_t per_share = (uint32_t)(total / nthreads);
  job_grain = per_share > GRAINS_PER_SHARE ? (per_share + GRAINS_PER_SHARE - 1) / GRAINS_PER_SHARE : 1;
  for (int i = 0; i < nthreads; i++) {
    shares[i].start = (uint32_t)((int64_t)total * i / nthreads);
    atomic_store_explicit(&shares[i].span, pack_span(shares[i].start, (uint32_t)((int64_t)total * (i + 1) / nthreads)),
                          memory_order_relaxed);
  }
  for (int i = 1; i < nthreads; i++) {
    slot_t *s = &slots[i];
    atomic_fetch_add(&s->gen, 1); /* seq_cst: publishes the job and the shares above */
    if (atomic_load(&s->sleeping)) {
      pthread_mutex_lock(&s->mu);
      pthread_cond_signal(&s->cv);
      pthread_mutex_unlock(&s->mu);
    }
  }
  run_share(0);
  spin_t sp = {0, 0};
  while (atomic_load_explicit(&pending, memory_order_acquire) != 0) {
    if (keep_spinning(&sp)) continue;
    pthread_mutex_lock(&done_mu);
    atomic_store(&caller_sleeping, 1);
    while (atomic_load(&pending) != 0) pthread_cond_wait(&done_cv, &done_mu);
    atomic_store(&caller_sleeping, 0);
    pthread_mutex_unlock(&done_mu);
  }
  pthread_mutex_unlock(&run_mu);
  return nthreads;
}

/* One launch of a list (a TinyJit replay): the kernel, its arguments, the iterations and the threads to use. */
typedef struct {
  xgrad_kernel fn;
  void **bufs;
  const int *vars;
  int total;
  int nthreads;
} xgrad_launch;

/* Run n launches in order, each finished before the next starts (a later kernel reads what an earlier one wrote).
 * One call for a whole replay: the Python caller pays one ctypes call, not one per kernel. */
void xgrad_pool_run_list(const xgrad_launch *launches, int n) {
  for (int i = 0; i < n; i++) {
    const xgrad_launch *l = &launches[i];
    if (l->nthreads <= 1 || l->total <= 1) l->fn(l->bufs, l->vars, 0, l->total);
    else xgrad_pool_run(l->fn, l->bufs, l->vars, l->total, l->nthreads);
  }
}
