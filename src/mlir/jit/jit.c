/* jit.c: kmlir_jit_compile over MLIR's C API (see jit.h). One context with
 * every upstream dialect and pass registered, made on the first call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/Diagnostics.h>
#include <mlir-c/ExecutionEngine.h>
#include <mlir-c/IR.h>
#include <mlir-c/Pass.h>
#include <mlir-c/RegisterEverything.h>

#include "mlir/jit/jit.h"

typedef struct {
    char *buf;
    size_t cap, n;
} sink;

static void put(MlirStringRef s, void *u) {
    sink *k = u;
    size_t room = k->cap > k->n + 1 ? k->cap - k->n - 1 : 0, w = s.length < room ? s.length : room;
    memcpy(k->buf + k->n, s.data, w);
    k->n += w;
    if (k->cap) k->buf[k->n] = 0;
}

static MlirLogicalResult on_diag(MlirDiagnostic d, void *u) {
    if (mlirDiagnosticGetSeverity(d) == MlirDiagnosticError) {
        sink *k = u;
        if (k->n) put(mlirStringRefCreateFromCString("; "), k);
        mlirDiagnosticPrint(d, put, k);
    }
    return mlirLogicalResultSuccess();
}

static MlirContext ctx;
static sink diag;
/* every engine made: their code is called for the process's lifetime (held
 * here, so that it stays reachable; LeakSanitizer counts it otherwise) */
static MlirExecutionEngine *engines;
static size_t n_engines;

int kmlir_jit_compile(const char *text, size_t len, const char *pipeline, int opt, const char *entry,
                      void (**fn)(void **), char *err, size_t cap);

int kmlir_jit_compile(const char *text, size_t len, const char *pipeline, int opt, const char *entry,
                      void (**fn)(void **), char *err, size_t cap) {
    *fn = NULL;
    if (cap) err[0] = 0;
    diag = (sink){err, cap, 0};
    if (mlirContextIsNull(ctx)) {
        ctx = mlirContextCreate();
        MlirDialectRegistry r = mlirDialectRegistryCreate();
        mlirRegisterAllDialects(r);
        mlirContextAppendDialectRegistry(ctx, r);
        mlirDialectRegistryDestroy(r);
        mlirContextLoadAllAvailableDialects(ctx);
        mlirRegisterAllLLVMTranslations(ctx);
        mlirRegisterAllPasses();
        mlirContextAttachDiagnosticHandler(ctx, on_diag, &diag, NULL);
    }
    MlirModule m = mlirModuleCreateParse(ctx, (MlirStringRef){text, len});
    if (mlirModuleIsNull(m)) {
        if (!diag.n) put(mlirStringRefCreateFromCString("the module does not parse"), &diag);
        return -1;
    }
    MlirPassManager pm = mlirPassManagerCreate(ctx);
    int rc = 0;
    if (mlirLogicalResultIsFailure(mlirParsePassPipeline(mlirPassManagerGetAsOpPassManager(pm), mlirStringRefCreateFromCString(pipeline), put, &diag)))
        rc = -1;
    else if (mlirLogicalResultIsFailure(mlirPassManagerRun(pm, m)))
        rc = -1, diag.n ? (void)0 : put(mlirStringRefCreateFromCString("the pass pipeline failed"), &diag);
    mlirPassManagerDestroy(pm);
    if (rc) {
        mlirModuleDestroy(m);
        return rc;
    }
    MlirStringRef lib = mlirStringRefCreateFromCString(KMLIR_RUNTIME_LIB);
    MlirExecutionEngine ee = mlirExecutionEngineCreate(m, opt, 1, &lib, false);
    mlirModuleDestroy(m);
    if (mlirExecutionEngineIsNull(ee)) {
        if (!diag.n) put(mlirStringRefCreateFromCString("the ExecutionEngine could not be created (LLVM translation failed)"), &diag);
        return -1;
    }
    *(void **)fn = mlirExecutionEngineLookupPacked(ee, mlirStringRefCreateFromCString(entry));
    if (!*fn) {
        put(mlirStringRefCreateFromCString("no packed entry point "), &diag), put(mlirStringRefCreateFromCString(entry), &diag);
        mlirExecutionEngineDestroy(ee);
        return -1;
    }
    MlirExecutionEngine *grown = realloc(engines, (n_engines + 1) * sizeof *engines);
    if (!grown) {
        put(mlirStringRefCreateFromCString("out of memory"), &diag);
        mlirExecutionEngineDestroy(ee);
        *fn = NULL;
        return -1;
    }
    engines = grown;
    engines[n_engines++] = ee; /* ee stays: the code lives in it */
    return 0;
}
