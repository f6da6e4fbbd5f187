/* exec.c: a lowered graph compiled by MLIR 16 and called (see kmlir.h).
 *
 * Where libkiln-mlir.so sits beside the executable (built from jit/jit.c
 * when libmlir-16-dev is installed), the pipeline below runs in process
 * through MLIR's C API and its ExecutionEngine JIT-compiles the module;
 * otherwise (or with KILN_MLIR_JIT=0) the tools do it, as follows.
 *
 * Pipeline (mlir-opt; TOSA modules first through tosa-to-linalg-named,
 * tosa-to-linalg, tosa-to-arith, tosa-to-tensor): empty tensors to allocations, one-shot bufferization
 * across function boundaries with identity layouts, results turned into out
 * parameters, deallocation, linalg to loops, scf/cf/affine/math/arith/memref/
 * func to LLVM. mlir-cpu-runner JIT-compiles the result and dumps its object
 * (it runs an empty @kiln_noop, so nothing of the model runs there); cc links
 * that object with memrefCopy (the one runtime helper the lowered code calls,
 * normally from libmlir_c_runner_utils) into a shared object, which is
 * dlopen'ed: `_mlir__mlir_ciface_kiln_forward(void **args)` is the packed C
 * interface, args[i] pointing at the i-th memref descriptor pointer.
 * Compiled objects are cached by module text for the process. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mlir/jit/jit.h"
#include "mlir/kmlir.h"

#define DESC_WORDS (3 + 2 * KG_MAX_RANK)

struct kmlir_exec {
    kg_graph *g;
    kmlir_dialect dialect;
    kmlir_sig sig;
    void (*fn)(void **);
    int64_t (*desc)[DESC_WORDS]; /* per argument, then per result */
    void **descp, **argv;
    void **out; /* per result: its buffer */
    char dir[256];
};

static double compile_s, run_s;
static int64_t n_runs;

double kmlir_compile_seconds(void) { return compile_s; }

double kmlir_run_seconds(int64_t *runs) {
    if (runs) *runs = n_runs;
    return run_s;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

const char *kmlir_tool_dir(void) {
    const char *d = getenv("KILN_MLIR_BIN");
    return d && *d ? d : "/usr/lib/llvm-16/bin";
}

static bool exists_in_path(const char *name) {
    const char *p = getenv("PATH");
    if (!p) return false;
    char buf[4096];
    while (*p) {
        size_t n = strcspn(p, ":");
        snprintf(buf, sizeof buf, "%.*s/%s", (int)n, p, name);
        if (!access(buf, X_OK)) return true;
        p += n + (p[n] == ':');
    }
    return false;
}

static kmlir_jit_fn jit_fn(void);

kiln_status kmlir_tools(void) {
    if (jit_fn()) return NULL; /* the ExecutionEngine in process needs no tools */
    char p[4096];
    static const char *const tools[] = {"mlir-opt", "mlir-cpu-runner"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", kmlir_tool_dir(), tools[i]);
        if (access(p, X_OK))
            return kiln_error(KILN_EUNSUPPORTED, "the MLIR backend needs %s (Debian 12: apt-get install mlir-16-tools; "
                                                 "KILN_MLIR_BIN names another folder)", p);
    }
    if (!exists_in_path("cc")) return kiln_error(KILN_EUNSUPPORTED, "the MLIR backend needs a C compiler `cc` to link the JIT object");
    return NULL;
}

/* Runs argv (no shell), its output into log; NULL on exit status 0. */
static kiln_status run_tool(char *const *argv, const char *log) {
    pid_t pid = fork();
    if (pid < 0) return kiln_error(KILN_EIO, "fork: %s", strerror(errno));
    if (pid == 0) {
        FILE *f = freopen(log, "w", stdout);
        if (f) dup2(fileno(stdout), 2);
        execvp(argv[0], argv);
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return kiln_error(KILN_EIO, "waitpid: %s", strerror(errno));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return NULL;
    char msg[600] = "";
    FILE *f = fopen(log, "r");
    if (f) {
        size_t n = fread(msg, 1, sizeof msg - 1, f);
        msg[n] = 0;
        fclose(f);
    }
    return kiln_error(KILN_EIO, "%s failed: %s", argv[0], msg);
}

/* memrefCopy for the shared object: strided copy between unranked memrefs */
static const char rt_c[] =
    "#include <stdint.h>\n#include <string.h>\n"
    "typedef struct { int64_t rank; void *d; } um;\n"
    "static void cp(int64_t es, int r, int k, const char *s, const int64_t *ss, char *t, const int64_t *ts, const int64_t *n) {\n"
    "  if (k == r) { memcpy(t, s, (size_t)es); return; }\n"
    "  for (int64_t i = 0; i < n[k]; i++) cp(es, r, k + 1, s + i * ss[k] * es, ss, t + i * ts[k] * es, ts, n);\n"
    "}\n"
    "void memrefCopy(int64_t es, um *src, um *dst) {\n"
    "  int r = (int)src->rank;\n"
    "  int64_t *s = src->d, *t = dst->d;\n"
    "  char *sp = (char *)s[1] + s[2] * es, *tp = (char *)t[1] + t[2] * es;\n"
    "  cp(es, r, 0, sp, s + 3 + r, tp, t + 3 + r, s + 3);\n"
    "}\n";

/* mlir-opt's standard pipeline, as one --pass-pipeline string (the tools
 * and the C API read the same text); TOSA modules first go to linalg. */
static const char tosa_passes[] = "func.func(tosa-to-linalg-named,tosa-to-linalg,tosa-to-arith,tosa-to-tensor),";
static const char passes[] =
    "empty-tensor-to-alloc-tensor,"
    "one-shot-bufferize{bufferize-function-boundaries allow-return-allocs function-boundary-type-conversion=identity-layout-map},"
    "buffer-results-to-out-params,func.func(buffer-deallocation,convert-linalg-to-loops),convert-scf-to-cf,"
    "expand-strided-metadata,lower-affine,convert-math-to-llvm,convert-math-to-libm,convert-arith-to-llvm,"
    "convert-memref-to-llvm,convert-func-to-llvm,convert-cf-to-llvm,reconcile-unrealized-casts";

static void pipeline(char *buf, size_t cap, bool tosa) { snprintf(buf, cap, "builtin.module(%s%s)", tosa ? tosa_passes : "", passes); }

/* LLVM optimization of the JIT: -O0 by default (a correctness path: -O2 compiles ~12x slower, runs ~faster) */
static int opt_level(void) {
    const char *lvl = getenv("KILN_MLIR_OPT");
    return lvl && lvl[0] >= '0' && lvl[0] <= '3' && !lvl[1] ? lvl[0] - '0' : 0;
}

/* The in-process compiler (libkiln-mlir.so beside the executable, MLIR's
 * ExecutionEngine): NULL when it is not there or KILN_MLIR_JIT=0. */
static kmlir_jit_fn jit_loaded;
static pthread_once_t jit_once = PTHREAD_ONCE_INIT;

static void jit_load(void) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 32);
    if (n <= 0) return;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return;
    strcpy(slash + 1, "libkiln-mlir.so");
    void *h = dlopen(exe, RTLD_NOW | RTLD_LOCAL); /* kept loaded */
    if (h) *(void **)&jit_loaded = dlsym(h, KMLIR_JIT_SYMBOL);
}

static kmlir_jit_fn jit_fn(void) {
    const char *env = getenv("KILN_MLIR_JIT");
    if (env && !strcmp(env, "0")) return NULL;
    pthread_once(&jit_once, jit_load);
    return jit_loaded;
}

const char *kmlir_compiler(void) { return jit_fn() ? "ExecutionEngine (C API)" : "mlir-opt + mlir-cpu-runner + cc"; }

/* Compiled modules by text: validate and the engine build the same step
 * shape again in each new context, and a module's code does not depend on
 * the weights (arguments), so one object serves them all. Process lifetime. */
typedef struct {
    char *text;
    size_t len;
    bool jit; /* compiled by the ExecutionEngine, else by the tools */
    void (*fn)(void **);
} cached;

static cached cache[64];
static int n_cache;
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;

static kiln_status build_jit(kmlir_exec *e, kmlir_jit_fn jit, const char *text, size_t len, bool tosa) {
    char pipe[1024], err[1024];
    pipeline(pipe, sizeof pipe, tosa);
    if (jit(text, len, pipe, opt_level(), "_mlir_ciface_kiln_forward", &e->fn, err, sizeof err))
        return kiln_error(KILN_EIO, "mlir: %s", err);
    return NULL;
}

static kiln_status build(kmlir_exec *e, const char *text, size_t len, bool tosa) {
    kmlir_jit_fn jit = jit_fn();
    if (jit) return build_jit(e, jit, text, len, tosa);
    char src[320], low[320], obj[320], rt[320], so[320], log[320], tool[4096], runner[4096], cc[] = "cc";
    snprintf(src, sizeof src, "%s/model.mlir", e->dir);
    snprintf(low, sizeof low, "%s/model.llvm.mlir", e->dir);
    snprintf(obj, sizeof obj, "%s/model.o", e->dir);
    snprintf(rt, sizeof rt, "%s/rt.c", e->dir);
    snprintf(so, sizeof so, "%s/model.so", e->dir);
    snprintf(log, sizeof log, "%s/log.txt", e->dir);
    FILE *f = fopen(src, "w");
    if (!f) return kiln_error(KILN_EIO, "%s: cannot write", src);
    fwrite(text, 1, len, f);
    fclose(f);
    f = fopen(rt, "w");
    if (!f) return kiln_error(KILN_EIO, "%s: cannot write", rt);
    fputs(rt_c, f);
    fclose(f);
    snprintf(tool, sizeof tool, "%s/mlir-opt", kmlir_tool_dir());
    char pipe[1100];
    memcpy(pipe, "--pass-pipeline=", 16);
    pipeline(pipe + 16, sizeof pipe - 16, tosa);
    char *opt[] = {tool, src, pipe, "-o", low, NULL};
    KILN_TRY(run_tool(opt, log));
    snprintf(runner, sizeof runner, "%s/mlir-cpu-runner", kmlir_tool_dir());
    char objarg[400];
    snprintf(objarg, sizeof objarg, "--object-filename=%s", obj);
    char rtso[330], libarg[400];
    snprintf(rtso, sizeof rtso, "%s/rt.so", e->dir);
    snprintf(libarg, sizeof libarg, "--shared-libs=%s", rtso);
    char *rtlink[] = {cc, "-shared", "-O2", "-fPIC", "-o", rtso, rt, NULL};
    KILN_TRY(run_tool(rtlink, log));
    char optlevel[8];
    snprintf(optlevel, sizeof optlevel, "-O%d", opt_level());
    char *run[] = {runner, low, "-e", "kiln_noop", "--entry-point-result=void", optlevel, libarg, "--dump-object-file", objarg, NULL};
    KILN_TRY(run_tool(run, log));
    char *link[] = {cc, "-shared", "-O2", "-fPIC", "-Wl,-Bsymbolic", "-o", so, obj, rt, "-lm", NULL};
    KILN_TRY(run_tool(link, log));
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL); /* kept loaded: the cache holds its code */
    if (!h) return kiln_error(KILN_EIO, "dlopen %s: %s", so, dlerror());
    *(void **)&e->fn = dlsym(h, "_mlir__mlir_ciface_kiln_forward");
    if (!e->fn) return kiln_error(KILN_EIO, "%s: no _mlir__mlir_ciface_kiln_forward", so);
    return NULL;
}

static kiln_status compile(kmlir_exec *e) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return kiln_error(KILN_ENOMEM, "out of memory");
    kiln_status st = kmlir_emit_dialect(e->g, e->dialect, f, &e->sig);
    if (!st) { /* the runner's entry point, inside the module */
        fflush(f);
        fseek(f, (long)len - 2, SEEK_SET);
        fprintf(f, "  func.func @kiln_noop() {\n    return\n  }\n}\n");
    }
    fclose(f);
    if (st) {
        free(text);
        return st;
    }
    pthread_mutex_lock(&cache_mu);
    bool jit = jit_fn() != NULL;
    for (int i = 0; i < n_cache && !e->fn; i++)
        if (cache[i].jit == jit && cache[i].len == len && !memcmp(cache[i].text, text, len)) e->fn = cache[i].fn;
    if (!e->fn) {
        st = build(e, text, len, e->dialect == KMLIR_TOSA);
        if (!st && n_cache < (int)(sizeof cache / sizeof cache[0])) {
            cache[n_cache++] = (cached){text, len, jit, e->fn};
            text = NULL;
        }
    }
    pthread_mutex_unlock(&cache_mu);
    free(text);
    return st;
}

static void set_desc(int64_t *d, void *p, const kg_node *x) {
    int R = x->shape.rank;
    d[0] = (int64_t)(intptr_t)p, d[1] = (int64_t)(intptr_t)p, d[2] = 0;
    int64_t s = 1;
    for (int i = R - 1; i >= 0; i--) {
        d[3 + i] = x->shape.d[i];
        d[3 + R + i] = s;
        s *= x->shape.d[i];
    }
}

static void rm_dir(const char *dir) {
    static const char *const files[] = {"model.mlir", "model.llvm.mlir", "model.o", "rt.c", "rt.so", "model.so", "log.txt"};
    char p[400];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) snprintf(p, sizeof p, "%s/%s", dir, files[i]), unlink(p);
    rmdir(dir);
}

kiln_status kmlir_exec_create(kg_graph *g, kmlir_dialect d, kmlir_exec **out) {
    *out = NULL;
    kiln_status st = kmlir_tools();
    kmlir_exec *e = st ? NULL : calloc(1, sizeof *e);
    if (!st && !e) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (st) {
        kg_destroy(g);
        return st;
    }
    e->g = g;
    e->dialect = d;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const char *tmp = getenv("TMPDIR");
    snprintf(e->dir, sizeof e->dir, "%s/kiln-mlir-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(e->dir)) st = kiln_error(KILN_EIO, "%s: cannot create (%s)", e->dir, strerror(errno)), e->dir[0] = 0;
    if (!st) st = kmlir_lower(g);
    if (!st) st = compile(e);
    if (!getenv("KILN_MLIR_KEEP") && e->dir[0]) rm_dir(e->dir); /* the loaded object stays mapped */
    int na = e->sig.n_args, nr = e->sig.n_results;
    if (!st) {
        e->desc = calloc((size_t)(na + nr), sizeof *e->desc);
        e->descp = calloc((size_t)(na + nr), sizeof *e->descp);
        e->argv = calloc((size_t)(na + nr), sizeof *e->argv);
        e->out = calloc((size_t)nr + 1, sizeof *e->out);
        if (!e->desc || !e->descp || !e->argv || !e->out) st = kiln_error(KILN_ENOMEM, "out of memory");
    }
    for (int i = 0; !st && i < nr; i++) {
        const kg_node *r = e->sig.results[i];
        e->out[i] = calloc((size_t)kg_shape_numel(&r->shape) + 1, kg_dtype_size(r->dtype));
        if (!e->out[i]) st = kiln_error(KILN_ENOMEM, "out of memory");
        else set_desc(e->desc[na + i], e->out[i], r);
    }
    for (int i = 0; !st && i < na + nr; i++) e->descp[i] = e->desc[i], e->argv[i] = &e->descp[i];
    for (int i = 0; !st && i < na; i++)
        if (e->sig.args[i]->op == KG_OP_WEIGHT) set_desc(e->desc[i], (void *)e->sig.args[i]->a.weight.data, e->sig.args[i]);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    compile_s += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (st) {
        kmlir_exec_destroy(e);
        return st;
    }
    *out = e;
    return NULL;
}

void kmlir_exec_destroy(kmlir_exec *e) {
    if (!e) return;
    for (int i = 0; e->out && i < e->sig.n_results; i++) free(e->out[i]);
    free(e->out);
    free(e->desc);
    free(e->descp);
    free(e->argv);
    kmlir_sig_free(&e->sig);
    kg_destroy(e->g);
    free(e);
}

kiln_status kmlir_exec_run(kmlir_exec *e, void *const *params) {
    for (int i = 0; i < e->sig.n_args; i++) {
        const kg_node *a = e->sig.args[i];
        if (a->op == KG_OP_PARAM) set_desc(e->desc[i], params[a->a.param.index], a);
    }
    double t0 = now_s();
    e->fn(e->argv);
    run_s += now_s() - t0, n_runs++;
    for (int i = 0; i < e->sig.n_results; i++) {
        int p = e->sig.result_param[i];
        if (p < 0) continue;
        const kg_node *r = e->sig.results[i];
        memcpy(params[p], e->out[i], (size_t)kg_shape_numel(&r->shape) * kg_dtype_size(r->dtype));
    }
    return NULL;
}

const void *kmlir_exec_output(const kmlir_exec *e, int i) { return e->out[i]; }
