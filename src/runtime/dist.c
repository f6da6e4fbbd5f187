/* dist.c: the job's processes (see dist.h). */
#include "runtime/dist.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef KILN_MPI
#include <mpi.h>
#endif

static int rank_, size_ = 1, tp_size = 1, tp_rank, pp_size = 1, pp_rank;
static bool lockstep = true;
enum { MAX_STAGES = 256 };
static int pp_layers[MAX_STAGES]; /* --pp-layers; pp_layers[0] == 0: even */
#ifdef KILN_MPI
static bool started; /* MPI_Init was called here */
static MPI_Comm stage_comm = MPI_COMM_NULL, column_comm = MPI_COMM_NULL; /* this stage's processes; this tensor rank's */
#endif

bool kd_built_with_mpi(void) {
#ifdef KILN_MPI
    return true;
#else
    return false;
#endif
}

#ifdef KILN_MPI
/* Launched by mpirun (Open MPI's or a PMIx launcher's environment). */
static bool under_launcher(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}
#endif

kiln_status kd_init(int tp) { return kd_init_pp(tp, 1, NULL); }

kiln_status kd_init_pp(int tp, int pp, const int *layers) {
    if (tp < 1) return kiln_error(KILN_EINVAL, "--tp %d: want a process count >= 1", tp);
    if (pp < 1 || pp > MAX_STAGES) return kiln_error(KILN_EINVAL, "--pp %d: want 1 to %d stages", pp, MAX_STAGES);
#ifdef KILN_MPI
    if (!started && under_launcher()) {
        int provided = 0;
        /* kernels may run on a server's worker thread, one call at a time */
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return kiln_error(KILN_EIO, "MPI_Init failed");
        started = true;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
        MPI_Comm_size(MPI_COMM_WORLD, &size_);
        if (provided < MPI_THREAD_SERIALIZED)
            return kiln_error(KILN_EUNSUPPORTED, "this MPI does not allow calls from more than one thread");
    }
#else
    if (tp * pp > 1)
        return kiln_error(KILN_EUNSUPPORTED,
                          "--tp %d --pp %d: this kiln was built without MPI (install libopenmpi-dev and rebuild)", tp, pp);
#endif
    if (size_ != tp * pp) {
        if (pp == 1)
            return kiln_error(KILN_EINVAL, "--tp %d: the job has %d process%s (run it as mpirun -np %d kiln ... --tp %d)", tp,
                              size_, size_ == 1 ? "" : "es", tp, tp);
        return kiln_error(KILN_EINVAL, "--tp %d --pp %d: the job has %d process%s, not tp x pp = %d (mpirun -np %d)", tp, pp,
                          size_, size_ == 1 ? "" : "es", tp * pp, tp * pp);
    }
    tp_size = tp;
    tp_rank = rank_ % tp;
    kd_set_pp(pp, rank_ / tp, layers);
#ifdef KILN_MPI
    if (started && size_ > 1 && stage_comm == MPI_COMM_NULL) {
        MPI_Comm_split(MPI_COMM_WORLD, pp_rank, tp_rank, &stage_comm);
        MPI_Comm_split(MPI_COMM_WORLD, tp_rank, pp_rank, &column_comm);
    }
#endif
    return NULL;
}

static _Thread_local int solo; /* kd_solo_begin's depth on this thread */
void kd_solo_begin(void) { solo++; }
void kd_solo_end(void) { solo -= solo > 0; }
bool kd_solo(void) { return solo > 0; }

static int pp_micro; /* --pp-micro; 0: the stages */
int kd_pp_micro(void) { return pp_micro > 0 ? pp_micro : kd_pp_size(); }
void kd_set_pp_micro(int n) { pp_micro = n > 0 ? n : 0; }

int kd_pp_size(void) { return solo ? 1 : pp_size; }
int kd_pp_rank(void) { return solo ? 0 : pp_rank; }

void kd_set_pp(int size, int rank, const int *layers) {
    pp_size = size > 0 && size <= MAX_STAGES ? size : 1;
    pp_rank = rank >= 0 && rank < pp_size ? rank : 0;
    for (int i = 0; i < pp_size; i++) pp_layers[i] = layers ? layers[i] : 0;
}

kiln_status kd_pp_split(int n_layers, int stage, int *lo, int *hi) {
    *lo = 0, *hi = n_layers;
    if (kd_pp_size() <= 1) return NULL;
    if (n_layers < pp_size)
        return kiln_error(KILN_EINVAL, "--pp %d: the model has %d layer%s, fewer than the stages", pp_size, n_layers,
                          n_layers == 1 ? "" : "s");
    int sum = 0, at = 0;
    for (int i = 0; i < pp_size; i++) {
        int n = pp_layers[0] ? pp_layers[i] : n_layers / pp_size + (i < n_layers % pp_size);
        if (i == stage) *lo = at, *hi = at + n;
        at += n, sum += n;
    }
    if (sum != n_layers)
        return kiln_error(KILN_EINVAL, "--pp-layers: the stages' layers add up to %d; the model has %d", sum, n_layers);
    return NULL;
}

int kd_rank(void) { return rank_; }
int kd_size(void) { return size_; }
int kd_tp_size(void) { return solo ? 1 : tp_size; }
int kd_tp_rank(void) { return solo ? 0 : tp_rank; }

static bool expert_parallel;
bool kd_expert_parallel(void) { return expert_parallel && !solo; }
void kd_set_expert_parallel(bool on) { expert_parallel = on; }

bool kd_lockstep(void) { return lockstep; }
void kd_set_lockstep(bool on) { lockstep = on; }

void kd_set_tp(int size, int rank) {
    tp_size = size > 0 ? size : 1;
    tp_rank = rank >= 0 && rank < tp_size ? rank : 0;
}

#ifdef KILN_MPI
static int count_of(size_t bytes) {
    if (bytes > INT_MAX) {
        fprintf(stderr, "kiln: rank %d: a collective of %zu bytes is over MPI's limit\n", rank_, bytes);
        kd_abort(70);
    }
    return (int)bytes;
}
#endif

void kd_all_gather(const void *in, size_t bytes, void *out) {
#ifdef KILN_MPI
    if (started && size_ > 1) {
        MPI_Allgather(in, count_of(bytes), MPI_BYTE, out, count_of(bytes), MPI_BYTE, MPI_COMM_WORLD);
        return;
    }
#endif
    if (out != in) memcpy(out, in, bytes);
}

void kd_group_all_gather(const int *members, int n, const void *in, size_t bytes, void *out) {
    bool all = n == size_, stage = n == tp_size && pp_size > 1, column = n == pp_size && tp_size > 1;
    for (int i = 0; i < n; i++) {
        all &= members[i] == i;
        stage &= members[i] == pp_rank * tp_size + i;
        column &= members[i] == i * tp_size + tp_rank;
    }
    if (all) {
        kd_all_gather(in, bytes, out);
        return;
    }
#ifdef KILN_MPI
    if (started && size_ > 1 && (stage || column)) {
        MPI_Allgather(in, count_of(bytes), MPI_BYTE, out, count_of(bytes), MPI_BYTE, stage ? stage_comm : column_comm);
        return;
    }
#endif
    if (n == 1 && members[0] == rank_) {
        if (out != in) memcpy(out, in, bytes);
        return;
    }
    fprintf(stderr, "kiln: rank %d: a collective over a group of %d processes that is not this stage's or this tensor rank's\n",
            rank_, n);
    kd_abort(70);
}

/* ---------------------------------------------------------------- non-blocking hand-offs
 *
 * A send is started from a copy in one of SEND_SLOTS buffers, and its slot
 * waited for only when the ring comes back to it; so a pipeline stage goes
 * on to its next micro-batch while the last one's activations are in
 * flight. Receives wait where the data is needed (the hand-off's node).
 * Transports that need the sender's calls to advance a large message (TCP's
 * rendezvous; shared memory's single copy does not) get them from
 * kd_progress, which the executor calls between kernels. */
#ifdef KILN_MPI
enum { SEND_SLOTS = 64, TAG_HANDOFF = 0, TAG_ROWS = 1 };
typedef struct {
    MPI_Request rq;
    void *buf;
    size_t cap;
} send_slot;
static send_slot slots[SEND_SLOTS];
static int next_slot, n_started; /* the ring's next slot; requests started, not yet seen complete */
static MPI_Request *shares;      /* kd_pp_share_begin's, [n_shares] of cap_shares */
static int n_shares, cap_shares;

static void init_slots(void) {
    static bool done;
    if (done) return;
    for (int i = 0; i < SEND_SLOTS; i++) slots[i].rq = MPI_REQUEST_NULL;
    done = true;
}

static void wait_one(MPI_Request *rq) {
    if (*rq == MPI_REQUEST_NULL) return;
    MPI_Wait(rq, MPI_STATUS_IGNORE);
    n_started--;
}

/* Every started send and share complete. */
static void wait_all(void) {
    init_slots();
    for (int i = 0; i < SEND_SLOTS; i++) wait_one(&slots[i].rq);
    for (int i = 0; i < n_shares; i++) wait_one(&shares[i]);
    n_shares = 0;
}
#endif

void kd_send_recv(const void *send, int to, void *recv, int from, size_t bytes) {
#ifdef KILN_MPI
    if (started && size_ > 1) {
        init_slots();
        if (to >= 0 && bytes) {
            send_slot *sl = &slots[next_slot];
            next_slot = (next_slot + 1) % SEND_SLOTS;
            wait_one(&sl->rq);
            if (sl->cap < bytes) {
                void *p = realloc(sl->buf, bytes);
                if (!p) {
                    fprintf(stderr, "kiln: rank %d: out of memory for a %zu-byte hand-off\n", rank_, bytes);
                    kd_abort(71);
                }
                sl->buf = p, sl->cap = bytes;
            }
            memcpy(sl->buf, send, bytes);
            MPI_Isend(sl->buf, count_of(bytes), MPI_BYTE, to, TAG_HANDOFF, MPI_COMM_WORLD, &sl->rq);
            n_started++;
        }
        if (from >= 0 && bytes) MPI_Recv(recv, count_of(bytes), MPI_BYTE, from, TAG_HANDOFF, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        return;
    }
#endif
    if (from == rank_ && to == rank_ && recv != send) memcpy(recv, send, bytes);
}

void kd_progress(void) {
#ifdef KILN_MPI
    if (solo || !n_started) return; /* solo: a graph of this process alone, maybe on another thread */
    init_slots();
    int flag = 0;
    /* one test advances every request of the job (MPI's progress engine);
     * the ones found complete are counted when they are waited for */
    for (int i = 0; i < SEND_SLOTS; i++)
        if (slots[i].rq != MPI_REQUEST_NULL) {
            MPI_Test(&slots[i].rq, &flag, MPI_STATUS_IGNORE);
            if (flag) n_started--;
            return;
        }
    if (n_shares) MPI_Test(&shares[0], &flag, MPI_STATUS_IGNORE), n_started -= flag;
#endif
}

void kd_pp_share_begin(void *buf, size_t bytes) {
#ifdef KILN_MPI
    /* column_comm ranks are the stages (MPI_Comm_split's key: pp_rank) */
    if (!started || size_ <= 1 || pp_size <= 1 || !bytes) return;
    init_slots(); /* kd_progress reads the ring too */
    int need = n_shares + (pp_rank == pp_size - 1 ? pp_size - 1 : 1);
    if (need > cap_shares) {
        int cap = need * 2;
        MPI_Request *p = realloc(shares, sizeof *p * (size_t)cap);
        if (!p) {
            fprintf(stderr, "kiln: rank %d: out of memory\n", rank_);
            kd_abort(71);
        }
        shares = p, cap_shares = cap;
    }
    if (pp_rank == pp_size - 1)
        for (int s = 0; s < pp_size - 1; s++)
            MPI_Isend(buf, count_of(bytes), MPI_BYTE, s, TAG_ROWS, column_comm, &shares[n_shares++]), n_started++;
    else MPI_Irecv(buf, count_of(bytes), MPI_BYTE, pp_size - 1, TAG_ROWS, column_comm, &shares[n_shares++]), n_started++;
#endif
    (void)buf, (void)bytes;
}

void kd_pp_share_wait(void) {
#ifdef KILN_MPI
    for (int i = 0; i < n_shares; i++) wait_one(&shares[i]);
    n_shares = 0;
#endif
}

void kd_broadcast(void *buf, size_t bytes, int root) {
#ifdef KILN_MPI
    if (started && size_ > 1) MPI_Bcast(buf, count_of(bytes), MPI_BYTE, root, MPI_COMM_WORLD);
#endif
    (void)buf, (void)bytes, (void)root;
}

void kd_broadcast_idle(void *buf, size_t bytes, int root) {
#ifdef KILN_MPI
    if (started && size_ > 1) {
        MPI_Request rq;
        MPI_Ibcast(buf, count_of(bytes), MPI_BYTE, root, MPI_COMM_WORLD, &rq);
        /* a few hundred tests spinning (a step follows at once), then 100 us naps */
        for (int done = 0, spins = 0; MPI_Test(&rq, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done;)
            if (++spins > 256) nanosleep(&(struct timespec){0, 100000}, NULL);
    }
#endif
    (void)buf, (void)bytes, (void)root;
}

_Noreturn void kd_abort(int code) {
#ifdef KILN_MPI
    if (started && size_ > 1) {
        fflush(stdout);
        fprintf(stderr, "kiln: rank %d of %d failed: ending the job\n", rank_, size_);
        MPI_Abort(MPI_COMM_WORLD, code ? code : 1);
    }
#endif
    exit(code);
}

void kd_finalize(void) {
#ifdef KILN_MPI
    if (started) {
        wait_all();
        free(shares), shares = NULL, n_shares = cap_shares = 0;
        for (int i = 0; i < SEND_SLOTS; i++) free(slots[i].buf), slots[i].buf = NULL, slots[i].cap = 0;
        if (stage_comm != MPI_COMM_NULL) MPI_Comm_free(&stage_comm), MPI_Comm_free(&column_comm);
        MPI_Finalize();
        started = false;
    }
#endif
}
