/* Replays the seeds and every input they crashed on of the request-body
 * fuzzer (fuzz/corpus_server, fuzz/regress_server) and the side-config /
 * data-URL fuzzer (fuzz/corpus_configs, fuzz/regress_configs) and the
 * embeddings / rerank / tokenize / detokenize fuzzer (fuzz/corpus_requests,
 * fuzz/regress_requests) through the harnesses themselves, so `make test` and `make asan` keep them fixed. */
#define LLVMFuzzerTestOneInput fuzz_server_input
#include "../../fuzz/fuzz_server.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_configs_input
#include "../../fuzz/fuzz_configs.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_requests_input
#include "../../fuzz/fuzz_requests.c"
#undef LLVMFuzzerTestOneInput

#include "kt.h"

KT_TEST(fuzz_server_corpus_replays) {
    static char dir[4096];
    fz_model = kt_path(dir, sizeof dir, "models/kiln-demo");
    int n = kt_replay("fuzz/corpus_server", fuzz_server_input), ok = fz_ok;
    kt_replay("fuzz/regress_server", fuzz_server_input);
    ksrv_stop(fz_srv);
    fz_srv = NULL;
    KT_CHECK(n >= 15);
    /* all but the three with tools: the demo model's template writes tool calls in no known format (an error) */
    KT_CHECKF(ok == n - 3, "%d of %d seed requests parse", ok, n);
}

KT_TEST(fuzz_configs_corpus_replays) {
    int n = kt_replay("fuzz/corpus_configs", fuzz_configs_input);
    kt_replay("fuzz/regress_configs", fuzz_configs_input);
    if (fz_dir[0]) ckt_rmdir(fz_dir);
    fz_dir[0] = 0;
    KT_CHECK(n >= 60);
    /* the seeds' kinds are what the harness reads */
    uint8_t *b = NULL;
    size_t nb = 0;
    KT_CHECK_OK(ksrv_base64_decode("aGk=", 4, &b, &nb));
    KT_CHECK(nb == 2 && b[0] == 'h' && b[1] == 'i');
    free(b);
    /* data URLs as the server parses them: the payload is the URL's tail */
    const char *pl;
    size_t npl;
    static const char u[] = "data:image/webp;name=x.webp;base64,UklGR";
    KT_CHECK_OK(ksrv_data_url_parse(u, sizeof u - 1, "u", &pl, &npl));
    KT_CHECK(pl == u + 35 && npl == 5);
    KT_CHECK_ERR(ksrv_data_url_parse("data:video/mp4;base64,AA", 24, "v", &pl, &npl), "v: a video file (data:video/...) is not decoded");
    KT_CHECK_ERR(ksrv_data_url_parse("data:image/png,abc", 18, "p", &pl, &npl), "p: only base64 data URLs");
    KT_CHECK_ERR(ksrv_data_url_parse("data:image/pngx;base64,", 23, "t", &pl, &npl), "t: only PNG, JPEG, WebP and GIF");
    KT_CHECK_ERR(ksrv_data_url_parse("data:image/png;base64,AA", 10, "cut", &pl, &npl), "cut: only PNG"); /* its length bounds the read */
    /* a crasher: a pinpoint side past int64 (UB in the conversion); now an error naming the field */
    cJSON *j = cJSON_Parse("{\"image_grid_pinpoints\": [[32, 1e125]]}");
    kimg_proc p;
    memset(&p, 0, sizeof p);
    KT_CHECK_ERR(kimg_proc_parse(j, &p), "image_grid_pinpoints");
    cJSON_Delete(j);
}

KT_TEST(fuzz_requests_corpus_replays) {
    fr_root = kt_root();
    int n = kt_replay("fuzz/corpus_requests", fuzz_requests_input), ok = fr_ok;
    kt_replay("fuzz/regress_requests", fuzz_requests_input);
    fr_cleanup();
    KT_CHECK(n >= 25);
    KT_CHECKF(ok == n, "%d of %d seed requests answered 200", ok, n); /* every seed is a valid request */
}
