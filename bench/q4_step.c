/* q4_step.c: the linear layers of one Qwen2.5-0.5B decode step (24 layers of
 * q, k, v, o, gate, up, down, then the tied 151,936-row output head), 4-bit
 * MLX affine g64, at M input rows, on weights of the model's size (280 MB:
 * streamed, as in a real step), timed by the thread's CPU clock so that other
 * sessions' time slices on a shared machine do not count (their cache and
 * memory traffic still do). Prints the best of R steps, in ms, per matrix kind.
 *
 *   make && cc -O2 -std=c11 -D_GNU_SOURCE -Isrc bench/q4_step.c build/libkiln.a -lcjson -lpcre2-8 \
 *       -lutf8proc -lmicrohttpd -lblis -lpng -ljpeg -lgif -lwebpdemux -lwebp -ledit -lcurl -lcrypto -lm \
 *       -lpthread $(pkg-config --libs ompi-c) -o /tmp/q4_step
 *   /tmp/q4_step [M=8] [threads=1] [R=5]
 *
 * With threads > 1 the CPU time is the calling thread's only (use the wall
 * figure). Not built by make: a measuring tool for docs/performance.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ir/graph.h"
#include "runtime/exec.h"
#include "runtime/pool.h"

static double clock_s(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    kr_exec *e;
    void *p[4];
} mat;

static mat make(int64_t M, int64_t N, int64_t K) {
    const int64_t gs = 64, words = N * K / 8;
    mat m = {0};
    kg_wattr wa = {.fmt = KG_WF_AFFINE, .bits = 4, .group_size = (int)gs, .rows = N, .cols = K};
    kg_graph *g = kg_create();
    kg_node *x = kg_param(g, KG_F32, KG_SHAPE(M, K), "x");
    m.p[0] = aligned_alloc(64, (size_t)(M * K * 4 + 63) / 64 * 64);
    m.p[1] = aligned_alloc(64, (size_t)(words * 4 + 63) / 64 * 64);
    m.p[2] = calloc((size_t)(N * K / gs), 2);
    m.p[3] = calloc((size_t)(N * K / gs), 2);
    if (!m.p[0] || !m.p[1] || !m.p[2] || !m.p[3]) {
        fprintf(stderr, "q4_step: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < M * K; i++) ((float *)m.p[0])[i] = (float)(i % 7) * 0.1f;
    for (int64_t i = 0; i < words * 4; i++) ((unsigned char *)m.p[1])[i] = (unsigned char)((uint64_t)i * 2654435761u >> 13);
    kg_node *w = kg_weight(g, KG_U32, KG_SHAPE(N, K / 8), m.p[1], "w");
    kg_node *s = kg_weight(g, KG_BF16, KG_SHAPE(N, K / gs), m.p[2], "s");
    kg_node *b = kg_weight(g, KG_BF16, KG_SHAPE(N, K / gs), m.p[3], "b");
    kg_add_output(g, kg_linear(g, x, w, s, b, &wa));
    kiln_status st = kr_exec_create(g, NULL, &m.e);
    if (st) {
        fprintf(stderr, "q4_step: %s\n", kiln_status_msg(st));
        exit(1);
    }
    return m;
}

int main(int argc, char **argv) {
    int M = argc > 1 ? atoi(argv[1]) : 8, T = argc > 2 ? atoi(argv[2]) : 1, reps = argc > 3 ? atoi(argv[3]) : 5;
    if (M < 1 || T < 1 || reps < 1) {
        fprintf(stderr, "usage: q4_step [M >= 1] [threads >= 1] [runs >= 1]\n");
        return 2;
    }
    static const int64_t shape[7][2] = {{896, 896}, {128, 896}, {128, 896}, {896, 896}, {4864, 896}, {4864, 896}, {896, 4864}};
    static const char *const name[8] = {"q", "k", "v", "o", "gate", "up", "down", "head"};
    enum { LAYERS = 24, N_MAT = LAYERS * 7 + 1 };
    kr_pool *pool = T > 1 ? kr_pool_create(T) : NULL;
    mat *ms = malloc(sizeof(mat) * N_MAT);
    if (!ms) return 1;
    for (int l = 0; l < LAYERS; l++)
        for (int j = 0; j < 7; j++) ms[l * 7 + j] = make(M, shape[j][0], shape[j][1]);
    ms[LAYERS * 7] = make(M, 151936, 896);
    double per[8] = {0}, best_cpu = 1e30, best_wall = 1e30;
    for (int r = 0; r < reps; r++) {
        double c0 = clock_s(CLOCK_THREAD_CPUTIME_ID), w0 = clock_s(CLOCK_MONOTONIC), kind[8] = {0};
        for (int i = 0; i < N_MAT; i++) {
            double t = clock_s(CLOCK_THREAD_CPUTIME_ID);
            kr_exec_run(ms[i].e, ms[i].p, pool);
            kind[i == LAYERS * 7 ? 7 : i % 7] += clock_s(CLOCK_THREAD_CPUTIME_ID) - t;
        }
        double c = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0, w = clock_s(CLOCK_MONOTONIC) - w0;
        if (c < best_cpu) best_cpu = c, memcpy(per, kind, sizeof per);
        if (w < best_wall) best_wall = w;
    }
    printf("M=%d threads=%d: linears of a step, cpu %.2f ms (wall %.2f ms) |", M, T, best_cpu * 1e3, best_wall * 1e3);
    for (int j = 0; j < 8; j++) printf(" %s %.2f", name[j], per[j] * 1e3);
    printf("\n");
    for (int i = 0; i < N_MAT; i++) {
        kr_exec_destroy(ms[i].e);
        for (int j = 0; j < 4; j++) free(ms[i].p[j]);
    }
    free(ms);
    kr_pool_destroy(pool);
    return 0;
}
