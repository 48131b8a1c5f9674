/* Processes sharing a region through the limiter, against the simulated driver (linked with
 * -lcuda). Usage:
 *   region_caller fork DIR      allocate 64 MiB, fork; the child allocates 32 MiB, creates
 *                               DIR/child-ready, waits for DIR/child-go and exits normally; the
 *                               parent checks cuMemGetInfo_v2 after the child exited, creates
 *                               DIR/parent-ready and waits for DIR/parent-go
 *   region_caller hold BYTES    allocate BYTES, print "held <result>", wait for stdin EOF, free
 *   region_caller grab BLOCK    wait for one byte on stdin (the barrier), allocate BLOCK bytes until
 *                               the first failure, print "got <blocks> <bytes>", wait for stdin EOF
 *                               and exit without freeing (the exit handler returns the bytes)
 *   region_caller threads       a thread started before cuInit and one after it each allocate and
 *                               free 1 MiB, as does the main thread; print "threads done", wait
 *                               for stdin EOF
 *   region_caller pool          cuMemAllocAsync 96 MiB twice, cuMemFreeAsync both, print the pool's
 *                               reserved size and the limiter's view (cuMemGetInfo_v2) at each step
 *   region_caller failing       under SIMCUDA_FAIL=cuMemAlloc_v2:2,cuMemFree_v2:2: four 1 MiB
 *                               allocations (the 2nd and 4th fail), frees of the two that succeeded
 *                               (the second fails), that one again; the limiter's view after each
 * Prints "ok: ..." / "FAIL: ..." per check; exits 1 if any check failed. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUmemoryPool;
typedef void *CUstream;
#define MIB (1024ULL * 1024)

CUresult cuInit(unsigned);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuDeviceGetMemPool(CUmemoryPool *, int);
CUresult cuMemPoolGetAttribute(CUmemoryPool, int, void *);
CUresult cuMemPoolTrimTo(CUmemoryPool, size_t);

static int failures;
#define CHECK(cond, ...)                                                                             \
    do {                                                                                             \
        int ok_ = (cond);                                                                            \
        printf(ok_ ? "ok: " : "FAIL: ");                                                             \
        printf(__VA_ARGS__);                                                                         \
        printf("\n");                                                                                \
        fflush(stdout);                                                                              \
        if (!ok_) failures++;                                                                        \
    } while (0)

static void path(char *out, const char *dir, const char *name) { snprintf(out, 4096, "%s/%s", dir, name); }
static void touch(const char *dir, const char *name) {
    char p[4096];
    path(p, dir, name);
    close(open(p, O_CREAT | O_WRONLY, 0644));
}
static void wait_file(const char *dir, const char *name) {
    char p[4096];
    path(p, dir, name);
    while (access(p, F_OK)) usleep(2000);
}
static void wait_eof(void) {
    char b[64];
    while (read(0, b, sizeof b) > 0) {
    }
}
static size_t used_now(void) {
    size_t fr = 0, total = 0;
    if (cuMemGetInfo_v2(&fr, &total)) return (size_t)-1;
    return total - fr;
}

static int do_fork(const char *dir) {
    CUdeviceptr a = 0, b = 0;
    CHECK(cuInit(0) == 0, "fork: cuInit");
    CHECK(cuMemAlloc_v2(&a, 64 * MIB) == 0, "fork: parent allocates 64 MiB");
    pid_t child = fork();
    if (child == 0) {
        int rc = cuMemAlloc_v2(&b, 32 * MIB);
        touch(dir, "child-ready");
        wait_file(dir, "child-go");
        exit(rc == 0 ? 0 : 3);
    }
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "fork: child allocated 32 MiB and exited");
    size_t used = used_now();
    CHECK(used == 64 * MIB, "fork: after the child's exit the container uses 64 MiB (%zu)", used);
    touch(dir, "parent-ready");
    wait_file(dir, "parent-go");
    return failures;
}

static int do_hold(size_t bytes) {
    CUdeviceptr p = 0;
    cuInit(0);
    int rc = cuMemAlloc_v2(&p, bytes);
    printf("held %d\n", rc);
    fflush(stdout);
    wait_eof();
    if (rc == 0) cuMemFree_v2(p);
    return 0;
}

static int do_grab(size_t block) {
    CUdeviceptr p;
    char go;
    cuInit(0);
    if (read(0, &go, 1) != 1) return 2;
    unsigned long long n = 0;
    while (cuMemAlloc_v2(&p, block) == 0) n++;
    printf("got %llu %llu\n", n, n * (unsigned long long)block);
    fflush(stdout);
    wait_eof();
    return 0;
}

static pthread_barrier_t start;
static void *early(void *arg) {
    (void)arg;
    pthread_barrier_wait(&start); /* released after the main thread's cuInit */
    CUdeviceptr p;
    if (cuMemAlloc_v2(&p, MIB) == 0) cuMemFree_v2(p);
    return NULL;
}
static void *late(void *arg) {
    (void)arg;
    CUdeviceptr p;
    if (cuMemAlloc_v2(&p, MIB) == 0) cuMemFree_v2(p);
    return NULL;
}
static int do_threads(void) {
    pthread_t a, b;
    pthread_barrier_init(&start, NULL, 2);
    pthread_create(&a, NULL, early, NULL);
    CHECK(cuInit(0) == 0, "threads: cuInit");
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, MIB) == 0 && cuMemFree_v2(p) == 0, "threads: main allocates and frees");
    pthread_barrier_wait(&start);
    pthread_join(a, NULL);
    pthread_create(&b, NULL, late, NULL);
    pthread_join(b, NULL);
    printf("threads done\n");
    fflush(stdout);
    wait_eof();
    return failures;
}

#define RESERVED_MEM_CURRENT 5
static size_t pool_reserved(CUmemoryPool pool) {
    unsigned long long v = 0;
    cuMemPoolGetAttribute(pool, RESERVED_MEM_CURRENT, &v);
    return v;
}
static int do_pool(void) {
    CUmemoryPool pool;
    CUdeviceptr a, b;
    CHECK(cuInit(0) == 0 && cuDeviceGetMemPool(&pool, 0) == 0, "pool: default pool");
    CHECK(cuMemAllocAsync(&a, 96 * MIB, NULL) == 0 && cuMemAllocAsync(&b, 96 * MIB, NULL) == 0,
          "pool: two async allocations of 96 MiB");
    size_t grown = used_now();
    CHECK(grown == pool_reserved(pool) && grown >= 192 * MIB,
          "pool: charged the pool's reserved size %zu (used %zu)", pool_reserved(pool), grown);
    CHECK(cuMemFreeAsync(a, NULL) == 0 && cuMemFreeAsync(b, NULL) == 0, "pool: async frees");
    size_t cached = used_now();
    CHECK(cached == pool_reserved(pool), "pool: freed memory stays charged while the pool caches it (%zu, pool %zu)",
          cached, pool_reserved(pool));
    CHECK(cuMemPoolTrimTo(pool, 0) == 0, "pool: trim");
    size_t trimmed = used_now();
    CHECK(trimmed == pool_reserved(pool) && trimmed == 0, "pool: after the trim nothing is charged (%zu)", trimmed);
    /* A pool that grows past the limit is refused before the driver call. */
    CUdeviceptr big;
    CHECK(cuMemAllocAsync(&big, 300 * MIB, NULL) == 2, "pool: 300 MiB over a 256 MiB limit is refused");
    CHECK(pool_reserved(pool) == 0, "pool: the refused allocation never reached the pool");
    return failures;
}

/* A failed allocation returns its reservation; a failed free keeps its charge until a free of
 * the same address succeeds. */
static int do_failing(void) {
    CUdeviceptr p[4] = {0};
    CHECK(cuInit(0) == 0, "failing: cuInit");
    size_t base = used_now();
    for (int i = 0; i < 4; i++) {
        CUresult r = cuMemAlloc_v2(&p[i], MIB);
        CHECK((r == 0) == (i % 2 == 0), "failing: allocation %d returned %d", i + 1, r);
    }
    CHECK(used_now() - base == 2 * MIB, "failing: 2 of 4 allocations charged (%zu)", used_now() - base);
    CHECK(cuMemFree_v2(p[0]) == 0, "failing: first free");
    CHECK(cuMemFree_v2(p[2]) != 0, "failing: the second free fails");
    CHECK(used_now() - base == MIB, "failing: the address the driver did not free stays charged (%zu)",
          used_now() - base);
    CHECK(cuMemFree_v2(p[2]) == 0, "failing: freeing it again");
    CHECK(used_now() == base, "failing: nothing charged at the end (%zu)", used_now() - base);
    return failures;
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "fork")) return do_fork(argv[2]);
    if (argc >= 3 && !strcmp(argv[1], "hold")) return do_hold(strtoull(argv[2], NULL, 0));
    if (argc >= 3 && !strcmp(argv[1], "grab")) return do_grab(strtoull(argv[2], NULL, 0));
    if (argc >= 2 && !strcmp(argv[1], "threads")) return do_threads();
    if (argc >= 2 && !strcmp(argv[1], "pool")) return do_pool();
    if (argc >= 2 && !strcmp(argv[1], "failing")) return do_failing();
    fprintf(stderr, "usage: region_caller fork DIR | hold BYTES | grab BLOCK | threads | pool | failing\n");
    return 2;
}
