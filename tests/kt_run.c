#include "kt_run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"

const char *kt_kiln_bin(void) {
    const char *b = getenv("KILN_BIN");
    return b && *b ? b : NULL;
}

int kt_run_kiln(const char *args, const char *input, kt_proc *p) { return kt_run_bin(kt_kiln_bin(), args, input, p); }

int kt_run_bin(const char *bin, const char *args, const char *input, kt_proc *p) {
    memset(p, 0, sizeof *p);
    p->status = -1;
    if (!bin) return -1;
    char dir[] = "/tmp/kiln-kt-run-XXXXXX";
    if (!mkdtemp(dir)) return -1;
    char in[64], out[64], err[64];
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(err, sizeof err, "%s/err", dir);
    FILE *f = fopen(in, "wb");
    if (!f) return -1;
    if (input) fputs(input, f);
    fclose(f);
    size_t cap = strlen(bin) + strlen(args) + 256;
    char *cmd = malloc(cap);
    if (!cmd) return -1;
    snprintf(cmd, cap, "'%s' %s <%s >%s 2>%s", bin, args, in, out, err);
    int rc = system(cmd);
    free(cmd);
    p->status = rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    size_t n;
    kiln_status st = ku_read_file(out, &p->out, &n);
    kiln_status_free(st);
    st = ku_read_file(err, &p->err, &n);
    kiln_status_free(st);
    if (!p->out) p->out = strdup("");
    if (!p->err) p->err = strdup("");
    unlink(in), unlink(out), unlink(err), rmdir(dir);
    return 0;
}

void kt_run_free(kt_proc *p) {
    free(p->out), free(p->err);
    p->out = p->err = NULL;
}
