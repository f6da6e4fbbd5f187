/* dist.h: the processes of one job (prefix kd_), over MPI when kiln is
 * built with Open MPI (the Makefile finds it with pkg-config ompi-c).
 *
 * kiln runs SPMD: every process of `mpirun -np N kiln CMD --tp N` runs the
 * same command on the same inputs, each with its shard of the weights
 * (models/blocks_shard.c); the collectives in the graph (ir/graph.h,
 * kernels/collective.c) are the only communication. Reductions are
 * computed from gathered operands in a fixed process order, so every
 * process holds the same bits and takes the same decisions (sampling,
 * stopping) without further messages; rank 0 prints.
 *
 * Without MPI (or before kd_init) the job is one process: rank 0 of 1, and
 * the transfers are copies.
 */
#ifndef KILN_DIST_H
#define KILN_DIST_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

bool kd_built_with_mpi(void);
/* Joins the job for tensor parallelism over tp processes: MPI_Init when
 * launched by mpirun, then checks the job has tp processes. tp 1 outside
 * mpirun needs nothing. Errors name the problem (no MPI in this build, the
 * wrong -np). Idempotent. */
kiln_status kd_init(int tp);
/* The same for tp x pp processes: pp pipeline stages of tp processes each;
 * process r is stage r / tp, tensor rank r % tp. layers: --pp-layers, the
 * count of layers of each stage (pp numbers), or NULL: an even split
 * (kd_pp_split). */
kiln_status kd_init_pp(int tp, int pp, const int *layers);
int kd_rank(void);
int kd_size(void);
/* The tensor-parallel layout graph builds shard for (1, 0 unless kd_init set it). */
int kd_tp_size(void);
int kd_tp_rank(void);
/* Expert parallelism (--enable-expert-parallel, as vLLM names it): the
 * MoE layers' experts split whole across the tp processes instead of
 * every process holding all of them (models/blocks_moe.c). Off by default. */
bool kd_expert_parallel(void);
void kd_set_expert_parallel(bool on);
/* True (the default) while every process runs the same command on the same
 * inputs and so takes part in broadcasts outside the graph (a fresh
 * sampling seed: gen/sampler.c); false once a server's rank 0 drives the
 * others through engine/mirror.c (serve --tp), which only follow steps. */
bool kd_lockstep(void);
void kd_set_lockstep(bool on);
/* Pipeline stages (1, 0 without --pp). */
int kd_pp_size(void);
int kd_pp_rank(void);
/* Layers [*lo, *hi) of n_layers that stage `stage` runs: --pp-layers', or
 * n_layers / pp each with the remainder on the first stages. Errors name a
 * split that does not add up to n_layers or leaves a stage none. */
kiln_status kd_pp_split(int n_layers, int stage, int *lo, int *hi);
/* Micro-batches a pipelined step is split into (--pp-micro; default: the
 * stages, at most the step's sequences; 1: the whole step at once), so that
 * stage s works on micro-batch m while stage s + 1 works on m - 1
 * (engine.c, pp_step). */
int kd_pp_micro(void);
void kd_set_pp_micro(int n);
/* Starts passing the last stage's buf [bytes] to every stage's process of
 * the same tensor rank (the rows one micro-batch with
 * kb_shape.pp_local_output left there: pp_step shares each one as soon as
 * it is computed, while the next is). buf is untouched by the caller until
 * kd_pp_share_wait, which completes every share begun. */
void kd_pp_share_begin(void *buf, size_t bytes);
void kd_pp_share_wait(void);
/* For tests: build graphs for stage `rank` of `size`, layers split as given (NULL: even). */
void kd_set_pp(int size, int rank, const int *layers);
/* For tests: build graphs for rank `rank` of `size` (the collectives then
 * still run on this job's processes). */
void kd_set_tp(int size, int rank);
/* This process alone, on the calling thread, between kd_solo_begin and
 * kd_solo_end (nested): the layout above reads one tensor rank of one stage
 * without expert parallelism, so that graphs built then are the whole model
 * with no collectives (a draft model that rank 0 of a server runs by itself:
 * engine.h, ke_ctx_params). kd_rank and kd_size still name the job. */
void kd_solo_begin(void);
void kd_solo_end(void);
bool kd_solo(void);

/* Collectives over every process of the job, in rank order.
 * out [size * bytes] = each process's `in` [bytes], rank 0 first. */
void kd_all_gather(const void *in, size_t bytes, void *out);
/* The same over the n processes members [n] (this process among them), in
 * their order: out [n * bytes]. Groups kiln's graphs use: every process,
 * the processes of this one's stage, or those of its tensor rank across the
 * stages (communicators made at kd_init); another aborts the job. */
void kd_group_all_gather(const int *members, int n, const void *in, size_t bytes, void *out);
/* Sends `send` to process `to` and receives `recv` from `from` (either
 * < 0: none), `bytes` each way. The send does not wait: it starts from a
 * copy (send may be reused at once) and completes while the caller goes
 * on; the receive returns with the data. Messages between two processes
 * arrive in the order sent. */
void kd_send_recv(const void *send, int to, void *recv, int from, size_t bytes);
/* Lets started sends advance (a transport such as TCP moves a large
 * message only while its sender calls MPI); the executor calls it between
 * kernels. Nothing to do when none is in flight. */
void kd_progress(void);
/* root's buf to every process. */
void kd_broadcast(void *buf, size_t bytes, int root);
/* The same, for a process that may wait long (a server's follower between
 * requests): it polls and sleeps instead of spinning on a core. Every
 * process of one broadcast must call this one (MPI does not match a
 * nonblocking broadcast with a blocking one). */
void kd_broadcast_idle(void *buf, size_t bytes, int root);

/* Ends the whole job now with exit status code (MPI_Abort with several
 * processes, so that no process waits forever on one that failed). */
_Noreturn void kd_abort(int code);
/* MPI_Finalize when kd_init started MPI (after the sends in flight
 * complete); then a normal exit may follow. */
void kd_finalize(void);

#endif
