/* hub_test.c: kiln pull against a fake hub on loopback (libmicrohttpd) that
 * serves the demo model in the hub's URL layout: the file list API, resolve
 * URLs with X-Repo-Commit and ETag, LFS files behind a redirect to a "CDN"
 * with X-Linked-Etag / X-Linked-Size, byte ranges, a gated repository (401
 * without the token), a renamed one (relative redirect), a cut transfer and
 * a wrong checksum. Offline. */
#include <ftw.h>
#include <limits.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "ckpt/ckpt_test.h"
#include "cli/cli.h"
#include "cli/cmd_pull.h"
#include "hub/hub.h"
#include "kt.h"

/* paths here are a temporary folder plus a few names: far below PATH_MAX */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define COMMIT "0123456789abcdef0123456789abcdef01234567"

typedef struct {
    const char *name;
    char *data;
    size_t len;
    bool lfs;
    char sha256[65], sha1[41];
} tfile;

typedef struct {
    struct MHD_Daemon *d;
    int port;
    tfile files[24];
    int n;
    pthread_mutex_t mu;
    int blob_gets, heads;
    long long last_range; /* -1: the last blob GET had no Range */
    int cut_next;         /* blob GETs to cut halfway */
} fakehub;

static void hexdigest(const EVP_MD *md, const char *prefix, size_t plen, const void *d, size_t n, char *out) {
    unsigned char h[EVP_MAX_MD_SIZE];
    unsigned hn = 0;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    EVP_DigestInit_ex(c, md, NULL);
    if (plen) EVP_DigestUpdate(c, prefix, plen);
    EVP_DigestUpdate(c, d, n);
    EVP_DigestFinal_ex(c, h, &hn);
    EVP_MD_CTX_free(c);
    for (unsigned i = 0; i < hn; i++) sprintf(out + 2 * i, "%02x", h[i]);
}

static void add_file(fakehub *h, const char *name, char *data, size_t len, bool lfs) {
    tfile *f = &h->files[h->n++];
    f->name = name, f->data = data, f->len = len, f->lfs = lfs;
    hexdigest(EVP_sha256(), NULL, 0, data, len, f->sha256);
    char pre[64];
    int pn = snprintf(pre, sizeof pre, "blob %zu", len);
    hexdigest(EVP_sha1(), pre, (size_t)pn + 1, data, len, f->sha1);
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, struct MHD_Response *r) {
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static struct MHD_Response *text(const char *s) {
    return MHD_create_response_from_buffer(strlen(s), (void *)s, MHD_RESPMEM_MUST_COPY);
}

typedef struct {
    const char *data;
    size_t cut; /* bytes of the body sent before the connection is dropped */
} cutter;

static ssize_t cut_body(void *cls, uint64_t pos, char *buf, size_t max) {
    cutter *c = cls;
    if (pos >= c->cut) return MHD_CONTENT_READER_END_WITH_ERROR;
    size_t n = c->cut - (size_t)pos < max ? c->cut - (size_t)pos : max;
    memcpy(buf, c->data + pos, n);
    return (ssize_t)n;
}

static enum MHD_Result on_req(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con) {
    fakehub *h = cls;
    bool head = !strcmp(method, "HEAD");
    char loc[1024];
    bool old_api = !strncmp(url, "/api/models/org/old/", 20);
    if (!strncmp(url, "/org/old/", 9) || old_api) { /* a renamed repository */
        snprintf(loc, sizeof loc, "%s/org/demo/%s", old_api ? "/api/models" : "", url + (old_api ? 20 : 9));
        struct MHD_Response *r = text("");
        MHD_add_response_header(r, "Location", loc);
        return reply(c, 307, r);
    }
    if (!strncmp(url, "/cdn/", 5)) {
        tfile *f = NULL;
        for (int i = 0; i < h->n; i++)
            if (!strcmp(h->files[i].sha256, url + 5)) f = &h->files[i];
        if (!f) return reply(c, 404, text("no such blob"));
        const char *range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range");
        long long from = -1;
        if (range && sscanf(range, "bytes=%lld-", &from) != 1) from = -1;
        pthread_mutex_lock(&h->mu);
        h->blob_gets++;
        h->last_range = from;
        bool cut = h->cut_next > 0;
        if (cut) h->cut_next--;
        pthread_mutex_unlock(&h->mu);
        size_t start = from > 0 ? (size_t)from : 0;
        if (start >= f->len) return reply(c, 416, text("range"));
        struct MHD_Response *r;
        static cutter cu;
        if (cut) {
            cu.data = f->data + start;
            cu.cut = (f->len - start) / 2;
            r = MHD_create_response_from_callback(f->len - start, 65536, cut_body, &cu, NULL);
        } else {
            r = MHD_create_response_from_buffer(f->len - start, f->data + start, MHD_RESPMEM_PERSISTENT);
        }
        if (from > 0) {
            char cr[96];
            snprintf(cr, sizeof cr, "bytes %zu-%zu/%zu", start, f->len - 1, f->len);
            MHD_add_response_header(r, "Content-Range", cr);
        }
        return reply(c, from > 0 ? 206 : 200, r);
    }
    bool api = !strncmp(url, "/api/models/", 12);
    const char *p = api ? url + 12 : url + 1;
    const char *s1 = strchr(p, '/'), *s2 = s1 ? strchr(s1 + 1, '/') : NULL;
    if (!s2) return reply(c, 404, text("no route"));
    char repo[128];
    snprintf(repo, sizeof repo, "%.*s", (int)(s2 - p), p);
    bool known = !strcmp(repo, "org/demo") || !strcmp(repo, "org/gated") || !strcmp(repo, "org/bad");
    if (!known) {
        struct MHD_Response *r = text("{\"error\": \"Repository Not Found\"}");
        MHD_add_response_header(r, "X-Error-Code", "RepoNotFound");
        return reply(c, 401, r);
    }
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!strcmp(repo, "org/gated") && !(auth && !strcmp(auth, "Bearer sekrit"))) {
        struct MHD_Response *r = text("{\"error\": \"Access to model org/gated is restricted.\"}");
        MHD_add_response_header(r, "X-Error-Code", "GatedRepo");
        return reply(c, 401, r);
    }
    char rev[128];
    const char *rest;
    if (api) {
        if (strncmp(s2, "/revision/", 10)) return reply(c, 404, text("no route"));
        snprintf(rev, sizeof rev, "%s", s2 + 10);
        rest = NULL;
    } else {
        if (strncmp(s2, "/resolve/", 9)) return reply(c, 404, text("no route"));
        const char *r0 = s2 + 9, *r1 = strchr(r0, '/');
        if (!r1) return reply(c, 404, text("no file"));
        snprintf(rev, sizeof rev, "%.*s", (int)(r1 - r0), r0);
        rest = r1 + 1;
    }
    if (strcmp(rev, "main") && strcmp(rev, COMMIT)) {
        struct MHD_Response *r = text("{\"error\": \"Invalid rev id\"}");
        MHD_add_response_header(r, "X-Error-Code", "RevisionNotFound");
        return reply(c, 404, r);
    }
    if (api) {
        char body[2048];
        size_t n = (size_t)snprintf(body, sizeof body, "{\"id\": \"%s\", \"sha\": \"%s\", \"siblings\": [", repo, COMMIT);
        for (int i = 0; i < h->n; i++)
            n += (size_t)snprintf(body + n, sizeof body - n, "%s{\"rfilename\": \"%s\"}", i ? ", " : "", h->files[i].name);
        snprintf(body + n, sizeof body - n, "]}");
        return reply(c, 200, text(body));
    }
    tfile *f = NULL;
    for (int i = 0; i < h->n; i++)
        if (!strcmp(h->files[i].name, rest)) f = &h->files[i];
    if (!f) {
        struct MHD_Response *r = text("{\"error\": \"Entry not found\"}");
        MHD_add_response_header(r, "X-Error-Code", "EntryNotFound");
        return reply(c, 404, r);
    }
    if (head) {
        pthread_mutex_lock(&h->mu);
        h->heads++;
        pthread_mutex_unlock(&h->mu);
    }
    char tag[80];
    if (f->lfs) {
        struct MHD_Response *r = text("");
        snprintf(loc, sizeof loc, "http://127.0.0.1:%d/cdn/%s", h->port, f->sha256);
        MHD_add_response_header(r, "Location", loc);
        /* org/bad: the hub's checksum is not the bytes' */
        snprintf(tag, sizeof tag, "\"%s\"", !strcmp(repo, "org/bad") ? "00000000000000000000000000000000000000000000000000000000deadbeef" : f->sha256);
        MHD_add_response_header(r, "X-Linked-Etag", tag);
        char size[32];
        snprintf(size, sizeof size, "%zu", f->len);
        MHD_add_response_header(r, "X-Linked-Size", size);
        MHD_add_response_header(r, "ETag", "\"not-the-file\"");
        MHD_add_response_header(r, "X-Repo-Commit", COMMIT);
        return reply(c, 302, r);
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(f->len, f->data, MHD_RESPMEM_PERSISTENT);
    snprintf(tag, sizeof tag, "\"%s\"", f->sha1);
    MHD_add_response_header(r, "ETag", tag);
    MHD_add_response_header(r, "X-Repo-Commit", COMMIT);
    return reply(c, 200, r);
}

static char *slurp(const char *path, size_t *len) {
    char *d = NULL;
    kiln_status st = ku_read_file(path, &d, len);
    kiln_status_free(st);
    return st ? NULL : d;
}

static bool hub_start(fakehub *h) {
    memset(h, 0, sizeof *h);
    pthread_mutex_init(&h->mu, NULL);
    char p[PATH_MAX];
    static const char *const demo[] = {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
                                       "model.safetensors", "README.md"};
    for (size_t i = 0; i < sizeof demo / sizeof demo[0]; i++) {
        size_t len;
        snprintf(p, sizeof p, "%s/models/kiln-demo/%s", kt_root(), demo[i]);
        char *d = slurp(p, &len);
        if (!d) return false;
        add_file(h, demo[i], d, len, strstr(demo[i], ".safetensors") != NULL);
    }
    char *extra = strdup("{\"nested\": true}\n");
    add_file(h, "sub/extra.json", extra, strlen(extra), false);
    char *bin = strdup("not weights kiln reads");
    add_file(h, "pytorch_model.bin", bin, strlen(bin), true);
    char *cons = strdup("Mistral's second copy of the weights");
    add_file(h, "consolidated.safetensors", cons, strlen(cons), true);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    h->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, 0, NULL, NULL,
                            on_req, h, MHD_OPTION_SOCK_ADDR, &a, MHD_OPTION_END);
    if (!h->d) return false;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : 0;
    return h->port > 0;
}

static void hub_stop(fakehub *h) {
    if (h->d) MHD_stop_daemon(h->d);
    for (int i = 0; i < h->n; i++) free(h->files[i].data);
    pthread_mutex_destroy(&h->mu);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) { return remove(p); }
static void rmtree(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static const tfile *find(const fakehub *h, const char *name) {
    for (int i = 0; i < h->n; i++)
        if (!strcmp(h->files[i].name, name)) return &h->files[i];
    return NULL;
}

/* snap/<w's name> holds w's bytes */
static bool same_bytes(const char *snap, const tfile *w) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", snap, w->name);
    size_t len;
    char *d = slurp(p, &len);
    bool same = d && len == w->len && !memcmp(d, w->data, len);
    free(d);
    return same;
}

typedef struct {
    fakehub hub;
    char endpoint[64], cache[PATH_MAX];
    khub_opts o;
} fixture;

/* false: the test skipped or failed already */
static bool setup(fixture *f) {
    memset(f, 0, sizeof *f);
    if (!hub_start(&f->hub)) {
        kt_skip("cannot start the fake hub on loopback (or read models/kiln-demo)");
        return false;
    }
    snprintf(f->endpoint, sizeof f->endpoint, "http://127.0.0.1:%d", f->hub.port);
    if (!ckt_tmpdir(f->cache, sizeof f->cache)) {
        kt_skip("no temporary folder");
        return false;
    }
    f->o = (khub_opts){.endpoint = f->endpoint, .cache = f->cache, .token = ""};
    return true;
}

static void teardown(fixture *f) {
    hub_stop(&f->hub);
    if (f->cache[0]) rmtree(f->cache);
}

/* The link target of snapshot file name, "" when it is no link. */
static const char *link_of(const fixture *f, const char *name, char *buf, size_t cap) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/models--org--demo/snapshots/" COMMIT "/%s", f->cache, name);
    ssize_t n = readlink(p, buf, cap - 1);
    buf[n > 0 ? n : 0] = 0;
    return buf;
}

static void pull_layout_body(fixture *f) {
    char snap[PATH_MAX], want[PATH_MAX], got[PATH_MAX], p[PATH_MAX];
    KT_CHECK_OK(khub_pull("org/demo", &f->o, snap, sizeof snap));
    snprintf(want, sizeof want, "%s/models--org--demo/snapshots/" COMMIT, f->cache);
    KT_CHECK_STR(snap, want);
    /* huggingface_hub's layout: relative links into blobs/, named by etag */
    char t[PATH_MAX];
    snprintf(t, sizeof t, "../../blobs/%s", find(&f->hub, "config.json")->sha1);
    KT_CHECK_STR(link_of(f, "config.json", got, sizeof got), t);
    snprintf(t, sizeof t, "../../blobs/%s", find(&f->hub, "model.safetensors")->sha256);
    KT_CHECK_STR(link_of(f, "model.safetensors", got, sizeof got), t);
    snprintf(t, sizeof t, "../../../blobs/%s", find(&f->hub, "sub/extra.json")->sha1);
    KT_CHECK_STR(link_of(f, "sub/extra.json", got, sizeof got), t);
    /* the default globs leave out README.md and pytorch_model.bin */
    KT_CHECK_STR(link_of(f, "README.md", got, sizeof got), "");
    KT_CHECK_STR(link_of(f, "pytorch_model.bin", got, sizeof got), "");
    KT_CHECK_STR(link_of(f, "consolidated.safetensors", got, sizeof got), "");
    /* the bytes, through the link */
    const tfile *w = find(&f->hub, "model.safetensors");
    KT_CHECK(same_bytes(snap, w));
    snprintf(p, sizeof p, "%s/models--org--demo/blobs/%s.incomplete", f->cache, w->sha256);
    KT_CHECK(!ku_file_exists(p));
    snprintf(p, sizeof p, "%s/.locks/models--org--demo/%s.lock", f->cache, w->sha256);
    KT_CHECK(ku_file_exists(p));
    /* refs/main holds the commit, without a newline */
    snprintf(p, sizeof p, "%s/models--org--demo/refs/main", f->cache);
    size_t len;
    char *d = slurp(p, &len);
    KT_CHECK(d != NULL);
    bool ref_ok = !strcmp(d, COMMIT);
    free(d);
    KT_CHECK(ref_ok);
    /* resolved offline, by branch and by commit */
    KT_CHECK_OK(khub_resolve("org/demo", f->cache, got, sizeof got));
    KT_CHECK_STR(got, want);
    KT_CHECK_OK(khub_resolve("org/demo@" COMMIT, f->cache, got, sizeof got));
    KT_CHECK_STR(got, want);
    KT_CHECK_ERR(khub_resolve("org/demo@v2", f->cache, got, sizeof got), "kiln pull org/demo@v2");
    KT_CHECK_ERR(khub_resolve("org/other", f->cache, got, sizeof got), "nor a model in the Hugging Face cache");
    /* a second pull finds everything in place: no HEAD, no blob */
    int heads = f->hub.heads, gets = f->hub.blob_gets;
    KT_CHECK_OK(khub_pull("org/demo@main", &f->o, snap, sizeof snap));
    KT_CHECK_EQ(f->hub.heads, heads);
    KT_CHECK_EQ(f->hub.blob_gets, gets);
    /* a blob already there (another tool fetched it) is linked, not fetched */
    snprintf(p, sizeof p, "%s/config.json", snap);
    KT_CHECK(unlink(p) == 0);
    KT_CHECK_OK(khub_pull("org/demo", &f->o, snap, sizeof snap));
    KT_CHECK_EQ(f->hub.heads, heads + 1);
    KT_CHECK_EQ(f->hub.blob_gets, gets);
    KT_CHECK(ku_file_exists(p));
}

KT_TEST(hub_pull_layout) {
    fixture f;
    if (setup(&f)) pull_layout_body(&f);
    teardown(&f);
}

static void model_arg_body(fixture *f) {
    /* -hf pulls through $HF_ENDPOINT into $HF_HUB_CACHE, -m resolves */
    setenv("HF_ENDPOINT", f->endpoint, 1);
    setenv("HF_HUB_CACHE", f->cache, 1);
    setenv("HF_TOKEN", "", 1);
    /* the command's flags */
    char *p1[] = {"pull", "org/demo", "--include", "*.json", "--exclude", "tokenizer*", NULL};
    KT_CHECK_EQ(kiln_cmd_pull(6, p1), 0);
    KT_CHECK_EQ(f->hub.blob_gets, 0);
    char *p2[] = {"pull", NULL}, *p3[] = {"pull", "org/demo", "--bogus", NULL}, *p4[] = {"pull", "a/b", "c/d", NULL};
    char *p5[] = {"pull", "org/demo", "--include", NULL}, *p6[] = {"pull", "--help", NULL};
    KT_CHECK_EQ(kiln_cmd_pull(1, p2), 1);
    KT_CHECK_EQ(kiln_cmd_pull(3, p3), 1);
    KT_CHECK_EQ(kiln_cmd_pull(3, p4), 1);
    KT_CHECK_EQ(kiln_cmd_pull(3, p5), 1);
    KT_CHECK_EQ(kiln_cmd_pull(2, p6), 0);
    char *argv[] = {"info", "-hf", "org/demo", NULL};
    bool ok = kiln_resolve_model_args(3, argv);
    KT_CHECK(ok);
    KT_CHECK_STR(argv[1], "-m");
    char want[PATH_MAX];
    snprintf(want, sizeof want, "%s/models--org--demo/snapshots/" COMMIT, f->cache);
    KT_CHECK_STR(argv[2], want);
    char *argv2[] = {"info", "-m", "org/demo", NULL};
    KT_CHECK(kiln_resolve_model_args(3, argv2));
    KT_CHECK_STR(argv2[2], want);
    KT_CHECK_EQ(kiln_cmd_info(3, argv2), 0); /* the snapshot loads */
    /* the README's path: pull, then quantize the snapshot to 4 bits */
    char out[PATH_MAX];
    snprintf(out, sizeof out, "%s/demo-q4", f->cache);
    char *q[] = {"quantize", "-m", "org/demo", "--bits", "4", "--out", out, NULL};
    KT_CHECK(kiln_resolve_model_args(7, q));
    KT_CHECK_EQ(kiln_cmd_quantize(7, q), 0);
    char *qi[] = {"info", "-m", out, NULL};
    KT_CHECK_EQ(kiln_cmd_info(3, qi), 0);
    char tj[PATH_MAX + 32];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", out);
    KT_CHECK(ku_file_exists(tj));
    char *argv3[] = {"info", "-m", "org/missing", NULL};
    KT_CHECK(!kiln_resolve_model_args(3, argv3));
    char *argv4[] = {"info", "-m", "models/kiln-demo", NULL}; /* a path stays a path */
    KT_CHECK(kiln_resolve_model_args(3, argv4));
    KT_CHECK_STR(argv4[2], "models/kiln-demo");
}

KT_TEST(hub_model_args) {
    fixture f;
    char *old = getenv("HF_HUB_CACHE") ? strdup(getenv("HF_HUB_CACHE")) : NULL;
    char *oldt = getenv("HF_TOKEN") ? strdup(getenv("HF_TOKEN")) : NULL;
    if (setup(&f)) model_arg_body(&f);
    unsetenv("HF_ENDPOINT");
    if (old) setenv("HF_HUB_CACHE", old, 1);
    else unsetenv("HF_HUB_CACHE");
    if (oldt) setenv("HF_TOKEN", oldt, 1);
    else unsetenv("HF_TOKEN");
    free(old), free(oldt);
    teardown(&f);
}

static void globs_body(fixture *f) {
    const char *inc[] = {"*.json"}, *exc[] = {"sub/", "tokenizer*"};
    f->o.include = inc, f->o.n_include = 1, f->o.exclude = exc, f->o.n_exclude = 2;
    char snap[PATH_MAX], got[PATH_MAX];
    KT_CHECK_OK(khub_pull("org/demo", &f->o, snap, sizeof snap));
    KT_CHECK(link_of(f, "config.json", got, sizeof got)[0]);
    KT_CHECK(link_of(f, "generation_config.json", got, sizeof got)[0]);
    KT_CHECK(!link_of(f, "tokenizer.json", got, sizeof got)[0]);
    KT_CHECK(!link_of(f, "sub/extra.json", got, sizeof got)[0]);
    KT_CHECK(!link_of(f, "model.safetensors", got, sizeof got)[0]);
    KT_CHECK_EQ(f->hub.blob_gets, 0);
    const char *none[] = {"*.gguf"};
    f->o.include = none, f->o.n_exclude = 0;
    KT_CHECK_ERR(khub_pull("org/demo", &f->o, snap, sizeof snap), "no file of the repository matches");
}

KT_TEST(hub_pull_globs) {
    fixture f;
    if (setup(&f)) globs_body(&f);
    teardown(&f);
}

static void errors_body(fixture *f) {
    char snap[PATH_MAX];
    /* gated: 401 without the token, a clear message; the token opens it */
    KT_CHECK_ERR(khub_pull("org/gated", &f->o, snap, sizeof snap), "set HF_TOKEN");
    f->o.token = "wrong";
    KT_CHECK_ERR(khub_pull("org/gated", &f->o, snap, sizeof snap), "the token in HF_TOKEN may not read");
    f->o.token = "sekrit";
    KT_CHECK_OK(khub_pull("org/gated", &f->o, snap, sizeof snap));
    f->o.token = "";
    KT_CHECK_ERR(khub_pull("org/nothere", &f->o, snap, sizeof snap), "not found on");
    KT_CHECK_ERR(khub_pull("org/demo@v9", &f->o, snap, sizeof snap), "not found on");
    KT_CHECK_ERR(khub_pull("demo", &f->o, snap, sizeof snap), "not a Hugging Face model name");
    KT_CHECK_ERR(khub_pull("org/../x", &f->o, snap, sizeof snap), "not a Hugging Face model name");
    /* a renamed repository: a relative redirect on the resolve URL */
    KT_CHECK_OK(khub_pull("org/old", &f->o, snap, sizeof snap));
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/models--org--old/snapshots/" COMMIT "/model.safetensors", f->cache);
    KT_CHECK(ku_file_exists(p));
    /* a wrong checksum: a clear error, nothing in the snapshot, no partial blob */
    KT_CHECK_ERR(khub_pull("org/bad", &f->o, snap, sizeof snap), "checksum mismatch");
    snprintf(p, sizeof p, "%s/models--org--bad/snapshots/" COMMIT "/model.safetensors", f->cache);
    struct stat sb;
    KT_CHECK(lstat(p, &sb) != 0);
    snprintf(p, sizeof p, "%s/models--org--bad/blobs/00000000000000000000000000000000000000000000000000000000deadbeef", f->cache);
    KT_CHECK(lstat(p, &sb) != 0);
    strcat(p, ".incomplete");
    KT_CHECK(lstat(p, &sb) != 0);
    snprintf(p, sizeof p, "%s/models--org--bad/refs/main", f->cache);
    KT_CHECK(lstat(p, &sb) != 0);
}

KT_TEST(hub_pull_errors) {
    fixture f;
    if (setup(&f)) errors_body(&f);
    teardown(&f);
}

static void resume_body(fixture *f) {
    const tfile *w = find(&f->hub, "model.safetensors");
    char snap[PATH_MAX], p[PATH_MAX];
    /* a transfer cut halfway is resumed with a Range from where it stopped */
    f->hub.cut_next = 1;
    KT_CHECK_OK(khub_pull("org/demo", &f->o, snap, sizeof snap));
    KT_CHECK_EQ(f->hub.blob_gets, 2);
    KT_CHECK(f->hub.last_range > 0 && f->hub.last_range < (long long)w->len);
    KT_CHECK(same_bytes(snap, w));
    /* an .incomplete left by an earlier run (kiln's or huggingface_hub's) */
    rmtree(f->cache);
    snprintf(p, sizeof p, "%s/models--org--demo/blobs", f->cache);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", p);
    KT_CHECK(system(cmd) == 0);
    snprintf(p + strlen(p), sizeof p - strlen(p), "/%s.incomplete", w->sha256);
    FILE *fp = fopen(p, "wb");
    KT_CHECK(fp != NULL);
    fwrite(w->data, 1, 1000000, fp);
    fclose(fp);
    KT_CHECK_OK(khub_pull("org/demo", &f->o, snap, sizeof snap));
    KT_CHECK_EQ(f->hub.last_range, 1000000);
    KT_CHECK(!ku_file_exists(p));
}

KT_TEST(hub_pull_resume) {
    fixture f;
    if (setup(&f)) resume_body(&f);
    teardown(&f);
}

/* Progress calls of a parallel pull: never two at once, every file landed once. */
typedef struct {
    atomic_int inside;
    bool overlapped;
    int landed;
} progress_probe;

static void probe_progress(void *ctx, const char *file, int64_t done, int64_t total) {
    progress_probe *p = ctx;
    if (atomic_fetch_add(&p->inside, 1)) p->overlapped = true;
    usleep(200); /* widen the window a second caller would fall into */
    if (done == total) p->landed++;
    atomic_fetch_sub(&p->inside, 1);
}

static void parallel_body(fixture *f) {
    /* four more LFS shards, so that several transfers run at once */
    static const char *const shards[] = {"model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                                         "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors"};
    for (int i = 0; i < 4; i++) {
        size_t n = 300000 + 7919 * (size_t)i;
        char *d = malloc(n);
        KT_CHECK(d != NULL);
        for (size_t k = 0; k < n; k++) d[k] = (char)(k * 31 + (size_t)i * 7 + (k >> 9));
        add_file(&f->hub, shards[i], d, n, true);
    }
    progress_probe pr = {0};
    f->o.workers = 4;
    f->o.progress = probe_progress, f->o.progress_ctx = &pr;
    char local[PATH_MAX], out[PATH_MAX], p[PATH_MAX];
    snprintf(local, sizeof local, "%s/plain/demo", f->cache);
    f->o.local_dir = local;
    KT_CHECK_OK(khub_pull("org/demo", &f->o, out, sizeof out));
    KT_CHECK_STR(out, local);
    KT_CHECK(!pr.overlapped);
    /* config, tokenizer x2, generation config, model, sub/extra, 4 shards */
    KT_CHECKF(pr.landed == 10, "%d files landed", pr.landed);
    KT_CHECK_EQ(f->hub.blob_gets, 5);
    /* the snapshot as usual, and the same files as plain files in local/ */
    char snap[PATH_MAX];
    KT_CHECK_OK(khub_resolve("org/demo", f->cache, snap, sizeof snap));
    const char *names[] = {"config.json", "model.safetensors", "sub/extra.json", shards[0], shards[3]};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const tfile *w = find(&f->hub, names[i]);
        KT_CHECK(w && same_bytes(snap, w) && same_bytes(local, w));
        struct stat a, b;
        snprintf(p, sizeof p, "%s/%s", local, names[i]);
        KT_CHECK(lstat(p, &a) == 0 && S_ISREG(a.st_mode));
        snprintf(p, sizeof p, "%s/%s", snap, names[i]);
        KT_CHECK(stat(p, &b) == 0 && a.st_ino == b.st_ino); /* a hard link to the blob: no second copy */
    }
    snprintf(p, sizeof p, "%s/README.md", local);
    KT_CHECK(!ku_file_exists(p));
    /* a local file replaced by something else is put back from the cache,
     * without the network fetching a blob again */
    snprintf(p, sizeof p, "%s/%s", local, shards[1]);
    KT_CHECK(unlink(p) == 0);
    FILE *fp = fopen(p, "wb");
    KT_CHECK(fp != NULL);
    fputs("edited", fp);
    fclose(fp);
    int gets = f->hub.blob_gets;
    pr.landed = 0;
    KT_CHECK_OK(khub_pull("org/demo", &f->o, out, sizeof out));
    KT_CHECK_EQ(f->hub.blob_gets, gets);
    KT_CHECK(same_bytes(local, find(&f->hub, shards[1])));
    /* one worker: the same result */
    rmtree(f->cache);
    f->o.workers = 1;
    f->o.local_dir = NULL;
    KT_CHECK_OK(khub_pull("org/demo", &f->o, out, sizeof out));
    KT_CHECK(same_bytes(out, find(&f->hub, shards[2])));
    /* the command's flags */
    char *bad[] = {"pull", "org/demo", "--max-workers", "0", NULL}, *bad2[] = {"pull", "org/demo", "--local-dir", NULL};
    KT_CHECK_EQ(kiln_cmd_pull(4, bad), 1);
    KT_CHECK_EQ(kiln_cmd_pull(3, bad2), 1);
}

KT_TEST(hub_pull_parallel_local_dir) {
    fixture f;
    if (setup(&f)) parallel_body(&f);
    teardown(&f);
}

KT_TEST(hub_repo_id) {
    KT_CHECK(khub_is_repo_id("Qwen/Qwen3-0.6B"));
    KT_CHECK(khub_is_repo_id("meta-llama/Llama-3.2-1B-Instruct@main"));
    KT_CHECK(khub_is_repo_id("a/b@" COMMIT));
    KT_CHECK(!khub_is_repo_id("models/kiln-demo/"));
    KT_CHECK(!khub_is_repo_id("/abs/path"));
    KT_CHECK(!khub_is_repo_id("./a"));
    KT_CHECK(!khub_is_repo_id("a/b/c"));
    KT_CHECK(!khub_is_repo_id("a/.."));
    KT_CHECK(!khub_is_repo_id("a/b@"));
    KT_CHECK(!khub_is_repo_id("noslash"));
    char buf[PATH_MAX];
    char *oldc = getenv("HF_HUB_CACHE") ? strdup(getenv("HF_HUB_CACHE")) : NULL;
    setenv("HF_HUB_CACHE", "/x/hub", 1);
    kiln_status st = khub_cache_dir(buf, sizeof buf);
    if (oldc) setenv("HF_HUB_CACHE", oldc, 1);
    else unsetenv("HF_HUB_CACHE");
    free(oldc);
    KT_CHECK_OK(st);
    KT_CHECK_STR(buf, "/x/hub");
    if (!getenv("HF_HUB_CACHE") && !getenv("HUGGINGFACE_HUB_CACHE")) {
        char *old = getenv("HF_HOME") ? strdup(getenv("HF_HOME")) : NULL;
        setenv("HF_HOME", "/y", 1);
        KT_CHECK_OK(khub_cache_dir(buf, sizeof buf));
        if (old) setenv("HF_HOME", old, 1);
        else unsetenv("HF_HOME");
        free(old);
        KT_CHECK_STR(buf, "/y/hub");
    }
}
