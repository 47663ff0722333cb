/* xgrad CPU worker pool: one call runs a kernel over [0, total) split into nthreads contiguous chunks.
 *
 * Kernel ABI: void kernel(void** restrict bufs, const int* restrict vars, int start, int end).
 * The caller runs chunk 0 itself; persistent workers 1..nthreads-1 run the others, each waiting on its own cache-line
 * sized slot so workers that are not needed are never woken. A waiter spins for SPIN_NS and then sleeps on a condition
 * variable: 1 ms covers the Python work between two kernels of a step (building and scheduling a graph takes
 * 0.2-0.5 ms), and waking a sleeping worker costs 40-100 us here (a VM), more than a small kernel itself.
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

typedef struct {
  _Alignas(64) atomic_uint gen; /* bumped by the caller to post a job */
  atomic_int sleeping;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  xgrad_kernel fn;
  void **bufs;
  const int *vars;
  int start, end;
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

/* The caller's core while a job is out (-1: unknown) and the job's thread count. */
static atomic_int caller_cpu = -1;
static atomic_int job_threads;

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
             atomic_load_explicit(&job_threads, memory_order_relaxed));
    s->fn(s->bufs, s->vars, s->start, s->end);
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

/* Run fn over [0, total) in nthreads contiguous chunks; returns the number of chunks used. */
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
  atomic_store_explicit(&job_threads, nthreads, memory_order_relaxed);
#if defined(__linux__)
  atomic_store_explicit(&caller_cpu, sched_getcpu(), memory_order_relaxed);
#endif
  for (int i = 1; i < nthreads; i++) {
    slot_t *s = &slots[i];
    s->fn = fn;
    s->bufs = bufs;
    s->vars = vars;
    s->start = (int)((int64_t)total * i / nthreads);
    s->end = (int)((int64_t)total * (i + 1) / nthreads);
    atomic_fetch_add(&s->gen, 1);
    if (atomic_load(&s->sleeping)) {
      pthread_mutex_lock(&s->mu);
      pthread_cond_signal(&s->cv);
      pthread_mutex_unlock(&s->mu);
    }
  }
  fn(bufs, vars, 0, (int)((int64_t)total / nthreads));
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
