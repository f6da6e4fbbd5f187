/* hub.c: Hugging Face Hub downloads (see hub.h for the cache layout). */
#include "hub/hub.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"

const char *const khub_default_include[] = {
    "*.safetensors", "*.json", "*.jinja", "tokenizer.model", "*.tiktoken", "merges.txt", "vocab.txt",
};
const int khub_n_default_include = (int)(sizeof khub_default_include / sizeof khub_default_include[0]);
/* with the default globs: Mistral's consolidated copy of the weights, Meta's
 * original/ folder and exported runtimes' folders hold a second copy */
const char *const khub_default_exclude[] = {"consolidated*.safetensors", "original/", "onnx/", "openvino/", "coreml/"};
const int khub_n_default_exclude = (int)(sizeof khub_default_exclude / sizeof khub_default_exclude[0]);

enum { MAX_REDIRECTS = 10, MAX_TRIES = 5 };

/* ---- names and paths ---------------------------------------------------- */

static bool name_char(char c) { return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.'; }

bool khub_is_repo_id(const char *s) {
    if (!s || !*s) return false;
    const char *at = strchr(s, '@');
    size_t n = at ? (size_t)(at - s) : strlen(s);
    if (at && !at[1]) return false;
    int slashes = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '/') {
            if (i == 0 || i + 1 == n || s[i + 1] == '.' || s[i + 1] == '-') return false;
            slashes++;
        } else if (!name_char(s[i])) {
            return false;
        }
    }
    if (s[0] == '.' || s[0] == '-' || slashes != 1) return false;
    for (size_t i = 0; i + 1 < n; i++)
        if (s[i] == '.' && s[i + 1] == '.') return false;
    return true;
}

typedef struct {
    char repo[256];   /* ORG/NAME */
    char rev[256];    /* main when absent */
    char folder[300]; /* models--ORG--NAME */
} spec;

static kiln_status parse_spec(const char *s, spec *p) {
    if (!khub_is_repo_id(s))
        return kiln_error(KILN_EINVAL, "\"%s\" is not a Hugging Face model name: want ORG/NAME or ORG/NAME@REVISION", s);
    const char *at = strchr(s, '@');
    size_t n = at ? (size_t)(at - s) : strlen(s);
    const char *rev = at ? at + 1 : "main";
    if (n >= sizeof p->repo || strlen(rev) >= sizeof p->rev) return kiln_error(KILN_EINVAL, "\"%s\": name too long", s);
    for (const char *c = rev; *c; c++)
        if (!name_char(*c) && *c != '/')
            return kiln_error(KILN_EINVAL, "\"%s\": revision \"%s\" has a character a branch, tag or commit cannot", s, rev);
    if (strstr(rev, "..") || rev[0] == '/' || rev[strlen(rev) - 1] == '/')
        return kiln_error(KILN_EINVAL, "\"%s\": revision \"%s\" is not a branch, tag or commit", s, rev);
    memcpy(p->repo, s, n);
    p->repo[n] = 0;
    strcpy(p->rev, rev);
    const char *slash = strchr(p->repo, '/');
    snprintf(p->folder, sizeof p->folder, "models--%.*s--%s", (int)(slash - p->repo), p->repo, slash + 1);
    return NULL;
}

static bool is_hex(const char *s, size_t n) {
    if (strlen(s) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i])) return false;
    return true;
}

kiln_status khub_cache_dir(char *buf, size_t cap) {
    const char *e;
    int n;
    if ((e = getenv("HF_HUB_CACHE")) && *e) n = snprintf(buf, cap, "%s", e);
    else if ((e = getenv("HUGGINGFACE_HUB_CACHE")) && *e) n = snprintf(buf, cap, "%s", e);
    else if ((e = getenv("HF_HOME")) && *e) n = snprintf(buf, cap, "%s/hub", e);
    else if ((e = getenv("XDG_CACHE_HOME")) && *e) n = snprintf(buf, cap, "%s/huggingface/hub", e);
    else if ((e = getenv("HOME")) && *e) n = snprintf(buf, cap, "%s/.cache/huggingface/hub", e);
    else return kiln_error(KILN_EINVAL, "no Hugging Face cache folder: set HF_HUB_CACHE or HF_HOME (HOME is unset)");
    if (n < 0 || (size_t)n >= cap) return kiln_error(KILN_EINVAL, "the Hugging Face cache path is too long");
    return NULL;
}

/* Creates every missing folder of path (path itself included). */
static kiln_status mkdirs(const char *path) {
    char tmp[PATH_MAX];
    if (strlen(path) >= sizeof tmp) return kiln_error(KILN_EINVAL, "%s: path too long", path);
    strcpy(tmp, path);
    for (char *p = tmp + 1;; p++) {
        if (*p == '/' || !*p) {
            char c = *p;
            *p = 0;
            if (mkdir(tmp, 0777) && errno != EEXIST) return kiln_error(KILN_EIO, "%s: cannot create: %s", tmp, strerror(errno));
            if (!c) break;
            *p = c;
        }
    }
    return NULL;
}

static kiln_status pathf(char *buf, size_t cap, const char *fmt, ...) KILN_PRINTF(3, 4);
static kiln_status pathf(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap) return kiln_error(KILN_EINVAL, "path too long: %.80s...", buf);
    return NULL;
}

kiln_status khub_resolve(const char *s, const char *cache, char *out, size_t cap) {
    spec p;
    KILN_TRY(parse_spec(s, &p));
    char dir[PATH_MAX], ref[PATH_MAX];
    if (!cache) KILN_TRY(khub_cache_dir(dir, sizeof dir));
    else KILN_TRY(pathf(dir, sizeof dir, "%s", cache));
    char commit[128];
    if (is_hex(p.rev, 40)) {
        strcpy(commit, p.rev);
    } else {
        KILN_TRY(pathf(ref, sizeof ref, "%s/%s/refs/%s", dir, p.folder, p.rev));
        char *txt;
        size_t len;
        kiln_status st = ku_read_file(ref, &txt, &len);
        if (st) {
            kiln_status_free(st);
            return kiln_error(KILN_ENOTFOUND, "%s is neither a folder nor a model in the Hugging Face cache (%s): run `kiln pull %s` first, or pass -hf %s to pull it now",
                              s, dir, s, s);
        }
        while (len && isspace((unsigned char)txt[len - 1])) txt[--len] = 0;
        bool ok = is_hex(txt, 40);
        if (ok) strcpy(commit, txt);
        free(txt);
        if (!ok) return kiln_error(KILN_EINVAL, "%s: does not hold a commit hash", ref);
    }
    KILN_TRY(pathf(out, cap, "%s/%s/snapshots/%s", dir, p.folder, commit));
    if (!ku_dir_exists(out))
        return kiln_error(KILN_ENOTFOUND, "%s: no snapshot %s in the Hugging Face cache (%s): run `kiln pull %s`", s, commit, dir, s);
    return NULL;
}

/* ---- HTTP ---------------------------------------------------------------- */

typedef struct {
    long status;
    char etag[160], linked_etag[160], commit[64], location[2048], error_code[64], error_msg[256];
    int64_t linked_size, content_length;
} headers;

typedef struct {
    char *data;
    size_t len;
} membuf;

static void copy_value(char *dst, size_t cap, const char *v, size_t n) {
    while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' ')) n--;
    while (n && *v == ' ') v++, n--;
    if (n >= cap) n = cap - 1;
    memcpy(dst, v, n);
    dst[n] = 0;
}

static size_t on_header(char *line, size_t size, size_t n, void *ctx) {
    headers *h = ctx;
    size_t len = size * n;
    if (len > 5 && !strncmp(line, "HTTP/", 5)) { /* a new response (after a redirect) */
        memset(h, 0, sizeof *h);
        h->linked_size = h->content_length = -1;
        return len;
    }
    const char *colon = memchr(line, ':', len);
    if (!colon) return len;
    size_t kn = (size_t)(colon - line);
    const char *v = colon + 1;
    size_t vn = len - kn - 1;
    char num[32];
#define IS(name) (kn == strlen(name) && !strncasecmp(line, name, kn))
    if (IS("ETag")) copy_value(h->etag, sizeof h->etag, v, vn);
    else if (IS("X-Linked-Etag")) copy_value(h->linked_etag, sizeof h->linked_etag, v, vn);
    else if (IS("X-Repo-Commit")) copy_value(h->commit, sizeof h->commit, v, vn);
    else if (IS("Location")) copy_value(h->location, sizeof h->location, v, vn);
    else if (IS("X-Error-Code")) copy_value(h->error_code, sizeof h->error_code, v, vn);
    else if (IS("X-Error-Message")) copy_value(h->error_msg, sizeof h->error_msg, v, vn);
    else if (IS("X-Linked-Size")) copy_value(num, sizeof num, v, vn), h->linked_size = strtoll(num, NULL, 10);
    else if (IS("Content-Length")) copy_value(num, sizeof num, v, vn), h->content_length = strtoll(num, NULL, 10);
#undef IS
    return len;
}

static size_t on_body(char *p, size_t size, size_t n, void *ctx) {
    membuf *b = ctx;
    size_t len = size * n;
    if (b->len + len > (64u << 20)) return 0; /* an API answer is small */
    char *nd = realloc(b->data, b->len + len + 1);
    if (!nd) return 0;
    memcpy(nd + b->len, p, len);
    b->len += len;
    nd[b->len] = 0;
    b->data = nd;
    return len;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

typedef struct {
    const char *endpoint;
    char token[512];
    struct curl_slist *hdrs;
} client;

static kiln_status client_open(client *c, const khub_opts *o) {
    memset(c, 0, sizeof *c);
    pthread_once(&curl_once, curl_init);
    const char *e = o->endpoint;
    if (!e) e = getenv("HF_ENDPOINT");
    if (!e || !*e) e = "https://huggingface.co";
    c->endpoint = e;
    const char *tok = o->token;
    if (!tok) tok = getenv("HF_TOKEN");
    if (!tok) {
        char path[PATH_MAX];
        const char *tp = getenv("HF_TOKEN_PATH"), *home = getenv("HF_HOME"), *xdg = getenv("XDG_CACHE_HOME");
        if (tp && *tp) snprintf(path, sizeof path, "%s", tp);
        else if (home && *home) snprintf(path, sizeof path, "%s/token", home);
        else if (xdg && *xdg) snprintf(path, sizeof path, "%s/huggingface/token", xdg);
        else snprintf(path, sizeof path, "%s/.cache/huggingface/token", getenv("HOME") ? getenv("HOME") : "");
        char *txt;
        size_t len;
        kiln_status st = ku_read_file(path, &txt, &len);
        if (!st) {
            while (len && isspace((unsigned char)txt[len - 1])) txt[--len] = 0;
            snprintf(c->token, sizeof c->token, "%s", txt);
            free(txt);
        }
        kiln_status_free(st);
    } else {
        snprintf(c->token, sizeof c->token, "%s", tok);
    }
    c->hdrs = curl_slist_append(NULL, "Accept-Encoding: identity");
    if (c->token[0]) {
        char auth[600];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->token);
        c->hdrs = curl_slist_append(c->hdrs, auth);
    }
    if (!c->hdrs) return kiln_error(KILN_ENOMEM, "out of memory");
    return NULL;
}

static void client_close(client *c) { curl_slist_free_all(c->hdrs); }

static CURL *easy(const client *c, const char *url, headers *h) {
    CURL *e = curl_easy_init();
    if (!e) return NULL;
    memset(h, 0, sizeof *h);
    h->linked_size = h->content_length = -1;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, c->hdrs);
    curl_easy_setopt(e, CURLOPT_USERAGENT, "kiln");
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, h);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 30L);
    /* a stalled transfer (under 1 byte/s for a minute) fails and is retried */
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, 60L);
    return e;
}

/* The error for an HTTP status other than success. */
static kiln_status http_error(const client *c, const char *what, const spec *p, const headers *h, const char *url) {
    const char *why = h->error_msg[0] ? h->error_msg : "";
    if (h->status == 401 || h->status == 403) {
        if (!strcmp(h->error_code, "RepoNotFound"))
            return kiln_error(KILN_ENOTFOUND, "%s: %s@%s: not found on %s, or private (HTTP %ld; a private repository needs HF_TOKEN)",
                              what, p->repo, p->rev, c->endpoint, h->status);
        if (c->token[0])
            return kiln_error(KILN_EINVAL, "%s: %s: HTTP %ld: the token in HF_TOKEN may not read this repository (gated: accept its terms at %s/%s with the token's account) %s",
                              what, p->repo, h->status, c->endpoint, p->repo, why);
        return kiln_error(KILN_EINVAL, "%s: %s: HTTP %ld: the repository is gated or private: accept its terms at %s/%s and set HF_TOKEN to a read token (https://huggingface.co/settings/tokens) %s",
                          what, p->repo, h->status, c->endpoint, p->repo, why);
    }
    if (h->status == 404)
        return kiln_error(KILN_ENOTFOUND, "%s: %s@%s: not found on %s (HTTP 404%s%s)", what, p->repo, p->rev, c->endpoint,
                          h->error_code[0] ? ", " : "", h->error_code);
    return kiln_error(KILN_EIO, "%s: HTTP %ld from %s %s", what, h->status, url, why);
}

static kiln_status perform(CURL *e, const char *url, headers *h) {
    CURLcode r = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &h->status);
    if (r == CURLE_COULDNT_RESOLVE_HOST || r == CURLE_COULDNT_CONNECT || r == CURLE_OPERATION_TIMEDOUT)
        return kiln_error(KILN_EIO, "%s: %s (offline? a cached model needs no network: -m ORG/NAME; HF_ENDPOINT names a mirror)",
                          url, curl_easy_strerror(r));
    if (r != CURLE_OK) return kiln_error(KILN_EIO, "%s: %s", url, curl_easy_strerror(r));
    return NULL;
}

/* ---- the file list ------------------------------------------------------- */

typedef struct {
    char commit[64];
    char **files;
    int n;
} listing;

static void listing_free(listing *l) {
    for (int i = 0; i < l->n; i++) free(l->files[i]);
    free(l->files);
}

/* A repository path that stays inside the snapshot. */
static bool safe_path(const char *f) {
    if (!*f || f[0] == '/' || strlen(f) > 1000) return false;
    const char *s = f;
    for (;;) {
        const char *e = strchr(s, '/');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.')) return false;
        if (!e) break;
        s = e + 1;
    }
    for (; *f; f++)
        if ((unsigned char)*f < 0x20 || *f == '\\') return false;
    return true;
}

static bool glob_match(const char *g, const char *f) {
    size_t n = strlen(g);
    if (n && g[n - 1] == '/') {
        char buf[1100];
        snprintf(buf, sizeof buf, "%s*", g);
        return fnmatch(buf, f, 0) == 0;
    }
    return fnmatch(g, f, 0) == 0;
}

static bool wanted(const khub_opts *o, const char *f) {
    const char *const *inc = o->n_include ? o->include : khub_default_include;
    int ni = o->n_include ? o->n_include : khub_n_default_include;
    bool in = false;
    for (int i = 0; i < ni && !in; i++) in = glob_match(inc[i], f);
    for (int i = 0; i < o->n_exclude && in; i++) in = !glob_match(o->exclude[i], f);
    for (int i = 0; i < khub_n_default_exclude && in && !o->n_include; i++) in = !glob_match(khub_default_exclude[i], f);
    return in;
}

static kiln_status list_files(const client *c, const spec *p, const khub_opts *o, listing *l) {
    memset(l, 0, sizeof *l);
    char url[4096];
    CURL *e0 = curl_easy_init();
    if (!e0) return kiln_error(KILN_ENOMEM, "curl_easy_init failed");
    char *rev = curl_easy_escape(e0, p->rev, 0);
    curl_easy_cleanup(e0);
    if (!rev) return kiln_error(KILN_ENOMEM, "out of memory");
    kiln_status st = pathf(url, sizeof url, "%s/api/models/%s/revision/%s", c->endpoint, p->repo, rev);
    curl_free(rev);
    KILN_TRY(st);
    headers h;
    CURL *e = easy(c, url, &h);
    if (!e) return kiln_error(KILN_ENOMEM, "curl_easy_init failed");
    membuf b = {0};
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(e, CURLOPT_MAXREDIRS, (long)MAX_REDIRECTS);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
    st = perform(e, url, &h);
    curl_easy_cleanup(e);
    if (!st && h.status != 200) st = http_error(c, "file list", p, &h, url);
    cJSON *j = NULL;
    if (!st && !(j = cJSON_Parse(b.data ? b.data : "")))
        st = kiln_error(KILN_EINVAL, "%s: the answer is not JSON", url);
    free(b.data);
    if (st) return st;
    const cJSON *sha = cJSON_GetObjectItemCaseSensitive(j, "sha");
    const cJSON *sib = cJSON_GetObjectItemCaseSensitive(j, "siblings");
    if (!cJSON_IsString(sha) || !is_hex(sha->valuestring, 40) || !cJSON_IsArray(sib)) {
        cJSON_Delete(j);
        return kiln_error(KILN_EINVAL, "%s: the answer lacks a 40-digit \"sha\" or a \"siblings\" list", url);
    }
    strcpy(l->commit, sha->valuestring);
    int n = cJSON_GetArraySize(sib);
    l->files = calloc((size_t)n + 1, sizeof *l->files);
    if (!l->files) st = kiln_error(KILN_ENOMEM, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, sib) {
        if (st) break;
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(it, "rfilename");
        if (!cJSON_IsString(f)) continue;
        if (!safe_path(f->valuestring)) {
            st = kiln_error(KILN_EINVAL, "%s: file name \"%.200s\" leaves the repository folder", url, f->valuestring);
            break;
        }
        if (!wanted(o, f->valuestring)) continue;
        if (!(l->files[l->n++] = strdup(f->valuestring))) st = kiln_error(KILN_ENOMEM, "out of memory");
    }
    cJSON_Delete(j);
    if (st) {
        listing_free(l);
        memset(l, 0, sizeof *l);
    }
    return st;
}

/* ---- one file ------------------------------------------------------------ */

typedef struct {
    char etag[160];
    int64_t size; /* -1 unknown */
    char url[4096];
} meta;

/* HEAD on the resolve URL, following relative redirects only (a renamed
 * repository), as huggingface_hub does: the etag of an LFS file is on the
 * redirect to its storage. */
static kiln_status file_meta(const client *c, const spec *p, const char *commit, const char *file, meta *m) {
    CURL *e0 = curl_easy_init();
    if (!e0) return kiln_error(KILN_ENOMEM, "curl_easy_init failed");
    /* escape each path component of the file */
    char path[3000] = "";
    size_t pl = 0;
    kiln_status st = NULL;
    for (const char *s = file; *s && !st;) {
        const char *sl = strchr(s, '/');
        size_t n = sl ? (size_t)(sl - s) : strlen(s);
        char *q = curl_easy_escape(e0, s, (int)n);
        if (!q) st = kiln_error(KILN_ENOMEM, "out of memory");
        else if (pl + strlen(q) + 2 >= sizeof path) st = kiln_error(KILN_EINVAL, "%s: name too long", file);
        else pl += (size_t)sprintf(path + pl, "%s%s", q, sl ? "/" : "");
        curl_free(q);
        s = sl ? sl + 1 : s + n;
    }
    curl_easy_cleanup(e0);
    KILN_TRY(st);
    KILN_TRY(pathf(m->url, sizeof m->url, "%s/%s/resolve/%s/%s", c->endpoint, p->repo, commit, path));
    headers h;
    for (int hop = 0;; hop++) {
        CURL *e = easy(c, m->url, &h);
        if (!e) return kiln_error(KILN_ENOMEM, "curl_easy_init failed");
        curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
        st = perform(e, m->url, &h);
        curl_easy_cleanup(e);
        KILN_TRY(st);
        bool redirect = h.status >= 300 && h.status < 400 && h.location[0];
        if (redirect && h.location[0] == '/' && hop < MAX_REDIRECTS) {
            char base[512];
            const char *sch = strstr(c->endpoint, "://");
            const char *host_end = sch ? strchr(sch + 3, '/') : NULL;
            size_t bl = host_end ? (size_t)(host_end - c->endpoint) : strlen(c->endpoint);
            if (bl >= sizeof base) return kiln_error(KILN_EINVAL, "endpoint too long");
            memcpy(base, c->endpoint, bl);
            base[bl] = 0;
            KILN_TRY(pathf(m->url, sizeof m->url, "%s%s", base, h.location));
            continue;
        }
        if (!redirect && h.status != 200) return kiln_status_wrap(http_error(c, file, p, &h, m->url), "pull");
        const char *tag = h.linked_etag[0] ? h.linked_etag : h.etag;
        if (!strncmp(tag, "W/", 2)) tag += 2;
        size_t tl = strlen(tag);
        if (tl && tag[0] == '"') tag++, tl--;
        if (tl && tag[tl - 1] == '"') tl--;
        if (!tl || tl >= sizeof m->etag) return kiln_error(KILN_EINVAL, "%s: the hub sent no ETag for it", file);
        memcpy(m->etag, tag, tl);
        m->etag[tl] = 0;
        for (const char *q = m->etag; *q; q++)
            if (!name_char(*q) || *q == '.') return kiln_error(KILN_EINVAL, "%s: ETag \"%s\" is not a hash", file, m->etag);
        m->size = h.linked_size >= 0 ? h.linked_size : redirect ? -1 : h.content_length;
        return NULL;
    }
}

/* sha256 of the file (etag of 64 hex digits, an LFS file) or its git blob
 * sha1 ("blob <size>\0" + bytes; 40 digits, a file kept in git). */
static kiln_status verify(const char *path, const char *file, const char *etag, int64_t size) {
    bool lfs = is_hex(etag, 64), git = is_hex(etag, 40);
    struct stat sb;
    if (stat(path, &sb)) return kiln_error(KILN_EIO, "%s: %s", path, strerror(errno));
    if (size >= 0 && sb.st_size != size)
        return kiln_error(KILN_EIO, "%s: %lld bytes arrived, the hub says %lld", file, (long long)sb.st_size, (long long)size);
    if (!lfs && !git) return NULL; /* an etag that is no hash: the size is all there is to check */
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_error(KILN_EIO, "%s: %s", path, strerror(errno));
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    kiln_status st = NULL;
    if (!ctx || !EVP_DigestInit_ex(ctx, lfs ? EVP_sha256() : EVP_sha1(), NULL)) st = kiln_error(KILN_EINTERNAL, "libcrypto: digest init failed");
    if (!st && git) {
        char pre[64];
        int n = snprintf(pre, sizeof pre, "blob %lld", (long long)sb.st_size);
        EVP_DigestUpdate(ctx, pre, (size_t)n + 1);
    }
    enum { CHUNK = 1 << 20 };
    char *buf = st ? NULL : malloc(CHUNK);
    if (!st && !buf) st = kiln_error(KILN_ENOMEM, "out of memory");
    size_t r;
    while (!st && (r = fread(buf, 1, CHUNK, f)) > 0) EVP_DigestUpdate(ctx, buf, r);
    if (!st && ferror(f)) st = kiln_error(KILN_EIO, "%s: read failed", path);
    free(buf);
    fclose(f);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned mdn = 0;
    if (!st) EVP_DigestFinal_ex(ctx, md, &mdn);
    EVP_MD_CTX_free(ctx);
    if (st) return st;
    char hex[2 * EVP_MAX_MD_SIZE + 1];
    for (unsigned i = 0; i < mdn; i++) sprintf(hex + 2 * i, "%02x", md[i]);
    if (strcasecmp(hex, etag))
        return kiln_error(KILN_EIO, "%s: checksum mismatch: the download's %s is %s, the hub says %s (the download was removed; run the pull again)",
                          file, lfs ? "sha256" : "git sha1", hex, etag);
    return NULL;
}

typedef struct {
    FILE *f;
    CURL *e;
    int64_t offset; /* bytes in the file before this transfer */
    bool ranged;    /* a Range was asked for */
    bool writing;   /* the final response is a success and its body goes to f */
    bool decided;
    const khub_opts *o;
    const char *file;
    int64_t total;
} sink;

static size_t on_blob(char *p, size_t size, size_t n, void *ctx) {
    sink *s = ctx;
    size_t len = size * n;
    if (!s->decided) {
        long code = 0;
        curl_easy_getinfo(s->e, CURLINFO_RESPONSE_CODE, &code);
        s->decided = true;
        if (code == 206 && s->ranged) {
            s->writing = true;
        } else if (code == 200) { /* the Range was ignored: start over */
            s->writing = true;
            if (s->offset) {
                if (fflush(s->f) || ftruncate(fileno(s->f), 0) || fseeko(s->f, 0, SEEK_SET)) return 0;
                s->offset = 0;
            }
        }
    }
    if (!s->writing) return len; /* an error page: dropped, the status says it */
    if (fwrite(p, 1, len, s->f) != len) return 0;
    return len;
}

static int on_xfer(void *ctx, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
    sink *s = ctx;
    /* done == total is kept for the one call that says the file is in place */
    if (s->o->progress && s->writing && s->offset + dlnow != s->total)
        s->o->progress(s->o->progress_ctx, s->file, s->offset + dlnow, s->total);
    return 0;
}

/* Fetches m->url into path (an .incomplete file), resuming what is there. */
static kiln_status fetch_blob(const client *c, const spec *p, const khub_opts *o, const char *file, const meta *m, const char *path) {
    kiln_status st = NULL;
    for (int attempt = 1;; attempt++) {
        kiln_status_free(st);
        st = NULL;
        FILE *f = fopen(path, "ab");
        if (!f) return kiln_error(KILN_EIO, "%s: cannot write: %s", path, strerror(errno));
        off_t have = ftello(f);
        if (m->size >= 0 && have > m->size) { /* not this file's start */
            if (ftruncate(fileno(f), 0)) have = -1;
            else have = 0;
        }
        if (have < 0) {
            fclose(f);
            return kiln_error(KILN_EIO, "%s: %s", path, strerror(errno));
        }
        if (m->size >= 0 && have == m->size) {
            fclose(f);
            return NULL;
        }
        headers h;
        CURL *e = easy(c, m->url, &h);
        if (!e) {
            fclose(f);
            return kiln_error(KILN_ENOMEM, "curl_easy_init failed");
        }
        sink s = {.f = f, .e = e, .offset = have, .ranged = have > 0, .o = o, .file = file, .total = m->size};
        char range[64];
        snprintf(range, sizeof range, "%lld-", (long long)have);
        if (have > 0) curl_easy_setopt(e, CURLOPT_RANGE, range);
        curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(e, CURLOPT_MAXREDIRS, (long)MAX_REDIRECTS);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_blob);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, &s);
        curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, on_xfer);
        curl_easy_setopt(e, CURLOPT_XFERINFODATA, &s);
        curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
        CURLcode r = curl_easy_perform(e);
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &h.status);
        curl_easy_cleanup(e);
        bool wrote_ok = fclose(f) == 0;
        if (r == CURLE_OK && !wrote_ok) return kiln_error(KILN_EIO, "%s: write failed: %s", path, strerror(errno));
        if (r == CURLE_OK && (h.status == 200 || h.status == 206)) return NULL;
        if (r == CURLE_OK && h.status == 416 && have > 0 && m->size < 0) return NULL; /* had it all */
        if (r == CURLE_OK) {
            st = http_error(c, file, p, &h, m->url);
            if (h.status < 500 && h.status != 429) return st;
        } else if (r == CURLE_WRITE_ERROR) {
            return kiln_error(KILN_EIO, "%s: write failed: %s", path, strerror(errno));
        } else {
            st = kiln_error(KILN_EIO, "%s: %s", file, curl_easy_strerror(r));
        }
        /* a cut or stalled transfer, or a server error: resume (after a pause) */
        if (attempt >= MAX_TRIES) return kiln_status_wrap(st, "after %d tries", attempt);
        if (attempt > 1) sleep((unsigned)attempt);
    }
}

static kiln_status link_snapshot(const char *snap, const char *file, const char *etag) {
    char dst[PATH_MAX], rel[PATH_MAX];
    KILN_TRY(pathf(dst, sizeof dst, "%s/%s", snap, file));
    char *slash = strrchr(dst, '/');
    *slash = 0;
    KILN_TRY(mkdirs(dst));
    *slash = '/';
    /* relative, as os.path.relpath(blob, dirname(pointer)) gives it */
    size_t n = 0;
    rel[0] = 0;
    for (const char *q = file; *q; q++)
        if (*q == '/') n += (size_t)snprintf(rel + n, sizeof rel - n, "../");
    KILN_TRY(pathf(rel + n, sizeof rel - n, "../../blobs/%s", etag));
    if (unlink(dst) && errno != ENOENT) return kiln_error(KILN_EIO, "%s: %s", dst, strerror(errno));
    if (symlink(rel, dst)) return kiln_error(KILN_EIO, "%s: cannot link: %s", dst, strerror(errno));
    return NULL;
}

static kiln_status pull_file(const client *c, const spec *p, const khub_opts *o, const char *cache, const char *repo_dir,
                             const char *commit, const char *snap, const char *file) {
    char dst[PATH_MAX];
    KILN_TRY(pathf(dst, sizeof dst, "%s/%s", snap, file));
    struct stat sb;
    if (stat(dst, &sb) == 0 && S_ISREG(sb.st_mode)) { /* in the cache already */
        if (o->progress) o->progress(o->progress_ctx, file, sb.st_size, sb.st_size);
        return NULL;
    }
    meta m;
    KILN_TRY(file_meta(c, p, commit, file, &m));
    char blob[PATH_MAX], part[PATH_MAX], lock[PATH_MAX];
    KILN_TRY(pathf(blob, sizeof blob, "%s/blobs/%s", repo_dir, m.etag));
    KILN_TRY(pathf(part, sizeof part, "%s.incomplete", blob));
    KILN_TRY(pathf(lock, sizeof lock, "%s/.locks/%s", cache, p->folder));
    KILN_TRY(mkdirs(lock));
    KILN_TRY(pathf(lock + strlen(lock), sizeof lock - strlen(lock), "/%s.lock", m.etag));
    int lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (lfd < 0) return kiln_error(KILN_EIO, "%s: %s", lock, strerror(errno));
    kiln_status st = NULL;
    if (flock(lfd, LOCK_EX)) st = kiln_error(KILN_EIO, "%s: cannot lock: %s", lock, strerror(errno));
    if (!st && !(stat(blob, &sb) == 0 && S_ISREG(sb.st_mode))) {
        st = fetch_blob(c, p, o, file, &m, part);
        if (!st) {
            st = verify(part, file, m.etag, m.size);
            if (st) unlink(part); /* bytes that are not the file: never resumed from */
        }
        if (!st) {
            mode_t um = umask(0);
            umask(um);
            chmod(part, 0666 & ~um);
            if (rename(part, blob)) st = kiln_error(KILN_EIO, "%s: %s", blob, strerror(errno));
        }
    }
    close(lfd); /* releases the lock; the lock file stays, as huggingface_hub leaves it */
    KILN_TRY(st);
    KILN_TRY(link_snapshot(snap, file, m.etag));
    if (o->progress && stat(blob, &sb) == 0) o->progress(o->progress_ctx, file, sb.st_size, sb.st_size);
    return NULL;
}

static kiln_status write_ref(const char *repo_dir, const spec *p, const char *commit) {
    if (!strcmp(p->rev, commit)) return NULL;
    char ref[PATH_MAX], tmp[PATH_MAX + 32];
    KILN_TRY(pathf(ref, sizeof ref, "%s/refs/%s", repo_dir, p->rev));
    char *slash = strrchr(ref, '/');
    *slash = 0;
    KILN_TRY(mkdirs(ref));
    *slash = '/';
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", ref, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return kiln_error(KILN_EIO, "%s: %s", tmp, strerror(errno));
    bool ok = fputs(commit, f) >= 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, ref)) {
        unlink(tmp);
        return kiln_error(KILN_EIO, "%s: cannot write", ref);
    }
    return NULL;
}

/* The files of a pull, fetched by up to o.workers threads, each taking the
 * next file; the first error stops the others from starting new files. */
typedef struct {
    const client *c;
    const spec *p;
    const khub_opts *user;
    khub_opts o; /* the user's, with progress calls serialized */
    const char *cache, *repo_dir, *commit, *snap;
    char **files;
    int n, next;
    pthread_mutex_t mu, progress_mu;
    kiln_status err;
} puller;

static void serialized_progress(void *ctx, const char *file, int64_t done, int64_t total) {
    puller *w = ctx;
    pthread_mutex_lock(&w->progress_mu);
    w->user->progress(w->user->progress_ctx, file, done, total);
    pthread_mutex_unlock(&w->progress_mu);
}

static void *pull_worker(void *arg) {
    puller *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        int i = w->err ? w->n : w->next++;
        pthread_mutex_unlock(&w->mu);
        if (i >= w->n) return NULL;
        kiln_status st = pull_file(w->c, w->p, &w->o, w->cache, w->repo_dir, w->commit, w->snap, w->files[i]);
        if (st) {
            pthread_mutex_lock(&w->mu);
            if (!w->err) w->err = st;
            else kiln_status_free(st);
            pthread_mutex_unlock(&w->mu);
        }
    }
}

static kiln_status pull_all(puller *w) {
    int nt = w->user->workers > 0 ? w->user->workers : KHUB_WORKERS;
    if (nt > w->n) nt = w->n;
    if (nt > 64) nt = 64;
    if (w->user->progress) {
        w->o.progress = serialized_progress;
        w->o.progress_ctx = w;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_mutex_init(&w->progress_mu, NULL);
    pthread_t t[64];
    int started = 0;
    for (; started < nt - 1; started++)
        if (pthread_create(&t[started], NULL, pull_worker, w)) break;
    pull_worker(w); /* this thread is one of the workers */
    for (int i = 0; i < started; i++) pthread_join(t[i], NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_mutex_destroy(&w->progress_mu);
    return w->err;
}

/* dst, a new name for the bytes of src: a hard link, else a copy, written
 * beside dst and renamed over it so a reader never sees half a file. */
static kiln_status place_file(const char *src, const char *dst) {
    char tmp[PATH_MAX + 32];
    KILN_TRY(pathf(tmp, sizeof tmp, "%s.%d.incomplete", dst, (int)getpid()));
    unlink(tmp);
    if (link(src, tmp)) {
        int in = open(src, O_RDONLY | O_CLOEXEC);
        if (in < 0) return kiln_error(KILN_EIO, "%s: %s", src, strerror(errno));
        int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        if (out < 0) {
            close(in);
            return kiln_error(KILN_EIO, "%s: cannot write: %s", tmp, strerror(errno));
        }
        char buf[1 << 16];
        ssize_t r;
        bool ok = true;
        while (ok && (r = read(in, buf, sizeof buf)) != 0) {
            if (r < 0) ok = errno == EINTR;
            for (ssize_t o = 0; ok && r > 0 && o < r;) {
                ssize_t wr = write(out, buf + o, (size_t)(r - o));
                if (wr < 0 && errno != EINTR) ok = false;
                else if (wr > 0) o += wr;
            }
        }
        close(in);
        if (close(out) || !ok) {
            unlink(tmp);
            return kiln_error(KILN_EIO, "%s: copy failed: %s", dst, strerror(errno));
        }
    }
    if (rename(tmp, dst)) {
        unlink(tmp);
        return kiln_error(KILN_EIO, "%s: %s", dst, strerror(errno));
    }
    return NULL;
}

/* The pulled files of snap, as files, under dir (--local-dir). One already
 * linked to its blob is left alone; anything else there under that name
 * (an older revision's file, a partial copy) is replaced by the checked
 * snapshot's bytes. */
static kiln_status export_files(const char *snap, const char *dir, char **files, int n) {
    KILN_TRY(mkdirs(dir));
    for (int i = 0; i < n; i++) {
        char src[PATH_MAX], dst[PATH_MAX];
        KILN_TRY(pathf(src, sizeof src, "%s/%s", snap, files[i]));
        KILN_TRY(pathf(dst, sizeof dst, "%s/%s", dir, files[i]));
        struct stat a, b;
        if (stat(src, &a)) return kiln_error(KILN_EIO, "%s: %s", src, strerror(errno));
        if (lstat(dst, &b) == 0 && S_ISREG(b.st_mode) && b.st_dev == a.st_dev && b.st_ino == a.st_ino) continue;
        char *slash = strrchr(dst, '/');
        *slash = 0;
        KILN_TRY(mkdirs(dst));
        *slash = '/';
        char real[PATH_MAX];
        if (!realpath(src, real)) return kiln_error(KILN_EIO, "%s: %s", src, strerror(errno));
        KILN_TRY(place_file(real, dst));
    }
    return NULL;
}

kiln_status khub_pull(const char *s, const khub_opts *o, char *out, size_t cap) {
    spec p;
    KILN_TRY(parse_spec(s, &p));
    char cache[PATH_MAX], repo_dir[PATH_MAX], snap[PATH_MAX];
    if (o->cache) KILN_TRY(pathf(cache, sizeof cache, "%s", o->cache));
    else KILN_TRY(khub_cache_dir(cache, sizeof cache));
    KILN_TRY(pathf(repo_dir, sizeof repo_dir, "%s/%s", cache, p.folder));
    client c;
    KILN_TRY(client_open(&c, o));
    listing l;
    kiln_status st = list_files(&c, &p, o, &l);
    if (!st && l.n == 0)
        st = kiln_error(KILN_ENOTFOUND, "%s: no file of the repository matches the include globs (use --include GLOB)", s);
    if (!st) st = pathf(snap, sizeof snap, "%s/snapshots/%s", repo_dir, l.commit);
    if (!st) st = pathf(out, cap, "%s", snap);
    char blobs[PATH_MAX];
    if (!st) st = pathf(blobs, sizeof blobs, "%s/blobs", repo_dir);
    if (!st) st = mkdirs(blobs);
    if (!st) st = mkdirs(snap);
    if (!st) {
        puller w = {.c = &c, .p = &p, .user = o, .o = *o, .cache = cache, .repo_dir = repo_dir,
                    .commit = l.commit, .snap = snap, .files = l.files, .n = l.n};
        st = pull_all(&w);
    }
    /* the ref last: a failed pull leaves no ref that resolves to a partial snapshot */
    if (!st) st = write_ref(repo_dir, &p, l.commit);
    if (!st && o->local_dir) st = export_files(snap, o->local_dir, l.files, l.n);
    if (!st && o->local_dir) st = pathf(out, cap, "%s", o->local_dir);
    listing_free(&l);
    client_close(&c);
    return st ? kiln_status_wrap(st, "pull %s", s) : NULL;
}
