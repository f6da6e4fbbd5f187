/* slots.c: llama-server's slot persistence, POST /slots/{id_slot}?action=
 * save|restore|erase (see docs/serving.md "Slots").
 *
 * A slot is one of the --parallel places a running request occupies
 * (ksch_slot_info); it holds the tokens (prompt and reply) of the last
 * request served on it, whose KV blocks and state snapshots the prefix
 * cache keeps. save writes the cached prefix of those tokens to
 * --slot-save-path/FILENAME (ke_ctx_prefix_save); restore reads such a file
 * back into the prefix cache, so that the next request starting with those
 * tokens reuses them (usage.prompt_tokens_details.cached_tokens); erase
 * forgets the slot's tokens. The engine work runs on the scheduler's thread
 * (ksch_call). */
#include <limits.h>
#include <sys/stat.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/json.h"
#include "server/server_int.h"

/* llama.cpp's fs_validate_filename, in spirit: a plain file name in the
 * folder, never a path. NULL when it is fine, else why not. */
static const char *bad_filename(const char *f) {
    size_t n = strlen(f);
    if (n == 0) return "is empty";
    if (n > 255) return "is longer than 255 bytes";
    if (!strcmp(f, ".") || !strcmp(f, "..") || strstr(f, "..")) return "contains \"..\"";
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)f[i];
        if (ch == '/' || ch == '\\') return "contains a path separator";
        if (ch < 0x20 || ch == 0x7f || ch == ':' || ch == '*' || ch == '?' || ch == '"' || ch == '<' || ch == '>' ||
            ch == '|')
            return "contains a character not allowed in file names";
    }
    if (f[0] == ' ' || f[n - 1] == ' ' || f[n - 1] == '.') return "starts or ends with a space, or ends with a dot";
    return NULL;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

static int fail(ksrv_buf *out, int status, const char *type, const char *msg) {
    ksrv_error_json(out, status, type, NULL, msg);
    return status;
}

/* An engine or scheduler error as an HTTP answer: 400 for a bad request (an
 * unknown slot, a bad or foreign file: llama-server answers 400 too). */
static int fail_status(ksrv_buf *out, kiln_status st) {
    kiln_code c = kiln_status_code(st);
    int status = c == KILN_EINVAL || c == KILN_ENOTFOUND ? 400
                 : c == KILN_EUNSUPPORTED                ? 501
                 : c == KILN_ELIMIT                      ? 503 /* stopping */
                                                         : 500;
    fail(out, status,
         status == 400   ? "invalid_request_error"
         : status == 501 ? "not_supported_error"
         : status == 503 ? "unavailable_error"
                         : "server_error",
         kiln_status_msg(st));
    kiln_status_free(st);
    return status;
}

int ksrv_slot_action(ksrv *s, const char *id_str, const char *action, const cJSON *body, ksrv_buf *out) {
    if (!s->p.slot_save_path || !*s->p.slot_save_path)
        return fail(out, 501, "not_supported_error",
                    "This server does not support slots action (start it with --slot-save-path DIR)");
    char *end = NULL;
    long id = strtol(id_str, &end, 10);
    if (!*id_str || *end || id < 0 || id > INT_MAX) return fail(out, 400, "invalid_request_error", "Invalid slot ID");
    if (!action || !*action)
        return fail(out, 400, "invalid_request_error", "missing ?action= (save, restore or erase)");
    bool save = !strcmp(action, "save"), restore = !strcmp(action, "restore");
    if (!save && !restore && strcmp(action, "erase"))
        return fail(out, 400, "invalid_request_error", "Invalid action (save, restore or erase)");
    double t0 = now_ms();
    kiln_status st;
    if (!save && !restore) {
        int64_t n = 0;
        if ((st = ksch_slot_erase(s->sch, (int)id, &n))) return fail_status(out, st);
        ksrv_buf_printf(out, "{\"id_slot\": %ld, \"n_erased\": %lld}", id, (long long)n);
        return 200;
    }
    const cJSON *fn = ku_json_get(body, "filename");
    if (!cJSON_IsString(fn)) return fail(out, 400, "invalid_request_error", "\"filename\" (a string) is required");
    const char *why = bad_filename(fn->valuestring);
    if (why) {
        char msg[160];
        snprintf(msg, sizeof msg, "Invalid filename: it %s", why);
        return fail(out, 400, "invalid_request_error", msg);
    }
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", s->p.slot_save_path, fn->valuestring) >= sizeof path)
        return fail(out, 400, "invalid_request_error", "Invalid filename: the path is too long");
    if (save) (void)mkdir(s->p.slot_save_path, 0755); /* created if absent (one level); an error shows at the write */
    int64_t n = 0;
    size_t bytes = 0;
    st = save ? ksch_slot_save(s->sch, (int)id, path, &n, &bytes) : ksch_slot_restore(s->sch, (int)id, path, &n, &bytes);
    if (st) return fail_status(out, st);
    char *name = cJSON_PrintUnformatted(fn);
    ksrv_buf_printf(out, "{\"id_slot\": %ld, \"filename\": %s, \"%s\": %lld, \"%s\": %zu, \"timings\": {\"%s\": %.3f}}", id,
                    name ? name : "\"\"", save ? "n_saved" : "n_restored", (long long)n, save ? "n_written" : "n_read",
                    bytes, save ? "save_ms" : "restore_ms", now_ms() - t0);
    cJSON_free(name);
    return 200;
}
