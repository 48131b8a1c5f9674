/* A fake libnccl.so.2 for the agent's tests of communicator tracking: the traced NCCL entry
 * points with NCCL 2.28's C signatures (nccl.h) that always succeed, without a GPU.
 * ncclCommInit* hand out distinct fake communicators (never dereferenced). ncclGetUniqueId gives
 * each process and call its own id (as NCCL's differ: the root's address and a random magic),
 * with bytes from the whole 0..255 range, so the ranks of one communicator share an id only by
 * passing it on. Built by the test with `cc -shared -fPIC -O0 -o libnccl.so.2 fake_nccl.c`. */
#include <stddef.h>
#include <unistd.h>

typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef int ncclResult_t;

static unsigned long next_comm = 0x10000;

static ncclComm_t fresh(void) {
    ncclComm_t c = (ncclComm_t)next_comm;
    next_comm += 0x100;
    return c;
}

ncclResult_t ncclGetVersion(int *v) { *v = 22803; return 0; }
static unsigned ids_made;
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    unsigned seed = (unsigned)getpid() * 2654435761u + ++ids_made * 40503u;
    for (int i = 0; i < 128; i++) {
        seed = seed * 1103515245u + 12345u;
        id->internal[i] = (char)(seed >> 16);
    }
    return 0;
}
ncclResult_t ncclCommInitRank(ncclComm_t *c, int nranks, ncclUniqueId id, int rank) {
    (void)nranks; (void)id; (void)rank; *c = fresh(); return 0;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t *c, int nranks, ncclUniqueId id, int rank, void *config) {
    (void)nranks; (void)id; (void)rank; (void)config; *c = fresh(); return 0;
}
ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
    (void)devlist; for (int i = 0; i < ndev; i++) comms[i] = fresh(); return 0;
}
ncclResult_t ncclCommInitRankScalable(ncclComm_t *c, int nranks, int rank, int nid, ncclUniqueId *ids, void *config) {
    (void)nranks; (void)rank; (void)nid; (void)ids; (void)config; *c = fresh(); return 0;
}
ncclResult_t ncclCommDestroy(ncclComm_t c) { (void)c; return 0; }
ncclResult_t ncclCommAbort(ncclComm_t c) { (void)c; return 0; }
ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, int t, int op, ncclComm_t c, void *st) {
    (void)s; (void)r; (void)n; (void)t; (void)op; (void)c; (void)st; return 0;
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t n, int t, ncclComm_t c, void *st) {
    (void)s; (void)r; (void)n; (void)t; (void)c; (void)st; return 0;
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, ncclComm_t c, void *st) {
    (void)s; (void)r; (void)n; (void)t; (void)op; (void)c; (void)st; return 0;
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, int t, int root, ncclComm_t c, void *st) {
    (void)s; (void)r; (void)n; (void)t; (void)root; (void)c; (void)st; return 0;
}
/* comm is the 7th integer argument: on the stack at [rsp+8] at entry. */
ncclResult_t ncclReduce(const void *s, void *r, size_t n, int t, int op, int root, ncclComm_t c, void *st) {
    (void)s; (void)r; (void)n; (void)t; (void)op; (void)root; (void)c; (void)st; return 0;
}
ncclResult_t ncclSend(const void *s, size_t n, int t, int peer, ncclComm_t c, void *st) {
    (void)s; (void)n; (void)t; (void)peer; (void)c; (void)st; return 0;
}
ncclResult_t ncclRecv(void *r, size_t n, int t, int peer, ncclComm_t c, void *st) {
    (void)r; (void)n; (void)t; (void)peer; (void)c; (void)st; return 0;
}
ncclResult_t ncclGroupStart(void) { return 0; }
ncclResult_t ncclGroupEnd(void) { return 0; }
ncclResult_t ncclAlltoAll(const void *s, void *r, size_t n, int t, ncclComm_t c, void *st) {
    (void)s; (void)r; (void)n; (void)t; (void)c; (void)st; return 0;
}
ncclResult_t ncclGather(const void *s, void *r, size_t n, int t, int root, ncclComm_t c, void *st) {
    (void)s; (void)r; (void)n; (void)t; (void)root; (void)c; (void)st; return 0;
}
ncclResult_t ncclScatter(const void *s, void *r, size_t n, int t, int root, ncclComm_t c, void *st) {
    (void)s; (void)r; (void)n; (void)t; (void)root; (void)c; (void)st; return 0;
}
