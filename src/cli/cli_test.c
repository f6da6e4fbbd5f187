/* cli_test.c: the command line as a user meets it, through the built
 * binary: --help and --version, options that are errors rather than
 * silently ignored, model paths, the demo model as every command's default. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/file.h"
#include "cli/cli.h"
#include "kt.h"
#include "kt_run.h"

/* Runs args, expects exit status rc (0 or "not 0" with rc = 1) and, when
 * given, text in stderr (or stdout for rc 0). */
#define EXPECT_RUN(args, rc, text)                                                                                     \
    do {                                                                                                               \
        kt_proc p_;                                                                                                    \
        KT_CHECK(kt_run_kiln(args, NULL, &p_) == 0);                                                                   \
        bool ok_ = (rc) ? p_.status > 0 : p_.status == 0;                                                              \
        const char *where_ = (rc) ? p_.err : p_.out;                                                                   \
        bool has_ = !(text) || strstr(where_, (text));                                                                 \
        KT_CHECKF(ok_ && has_, "kiln %s: status %d, stdout \"%.300s\", stderr \"%.300s\" (want %s, \"%s\")", args,    \
                  p_.status, p_.out, p_.err, (rc) ? "an error" : "success", (text) ? (text) : "");                      \
        kt_run_free(&p_);                                                                                              \
    } while (0)

KT_TEST(cli_every_command_has_help_and_rejects_unknown_options) {
    KT_NEED_KILN_BIN();
    kt_proc p;
    KT_CHECK(kt_run_kiln("--help", NULL, &p) == 0);
    KT_CHECK_EQ(p.status, 0);
    int n = 0;
    char *s = strstr(p.out, "commands:\n");
    KT_CHECK(s);
    for (char *line = strchr(s, '\n') + 1; line && strncmp(line, "  ", 2) == 0; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        char name[64];
        if (sscanf(line, " %63s", name) != 1) break;
        char args[128];
        snprintf(args, sizeof args, "%s --help", name);
        EXPECT_RUN(args, 0, "usage: kiln");
        /* an unknown option is named as such, never "needs a value" */
        snprintf(args, sizeof args, "%s --no-such-option", name);
        EXPECT_RUN(args, 1, "unknown");
        n++;
    }
    kt_run_free(&p);
    KT_CHECKF(n >= 14, "only %d commands listed", n);
    EXPECT_RUN("--version", 0, "kiln 0.");
    EXPECT_RUN("no-such-command", 1, "unknown command");
}

KT_TEST(cli_flags_that_do_nothing_are_errors) {
    KT_NEED_KILN_BIN();
    EXPECT_RUN("export --stage bogus", 1, "--stage bogus: not a compiler stage");
    EXPECT_RUN("export --dialect onnx", 1, "--dialect onnx: expected stablehlo, linalg or tosa");
    EXPECT_RUN("export --shape foo:1", 1, "expected prefill:T or decode:S");
    EXPECT_RUN("export --dialect linalg --stage fuse", 1, "--stage applies to the StableHLO text");
    EXPECT_RUN("validate --backend tpu x", 1, "--backend tpu: expected native or mlir");
    EXPECT_RUN("generate -p hi --backend tpu", 1, "--backend tpu: expected native or mlir");
    EXPECT_RUN("generate -p hi --dialect tosa", 1, "--dialect tosa applies to --backend mlir");
    EXPECT_RUN("generate -p hi --n-probs 2", 1, "add --json");
    EXPECT_RUN("generate --prompt-ids 1,,2", 1, "an empty entry");
    EXPECT_RUN("generate --prompt-ids 1,2,", 1, "ends with a comma");
    EXPECT_RUN("generate -p hi --system be-brief", 1, "--system needs --chat");
    EXPECT_RUN("generate -p", 1, "-p needs a value");
    EXPECT_RUN("tokenize hello", 2, "unexpected argument \"hello\": give the text with -p TEXT");
    EXPECT_RUN("generate hello", 1, "unexpected argument \"hello\"");
    EXPECT_RUN("detokenize 99999", 1, "token id 99999 is not in the vocabulary");
    EXPECT_RUN("detokenize 1,,2", 1, "an empty entry");
    EXPECT_RUN("detokenize", 1, "give the token ids");
    EXPECT_RUN("validate --tolerance abc x", 1, "is not a number");
    EXPECT_RUN("validate --threads", 1, "--threads needs a value");
    EXPECT_RUN("info -m", 1, "-m needs a value");
    EXPECT_RUN("bench -p", 1, "-p needs a value");
    EXPECT_RUN("grammar-bench -m", 1, "-m needs a value");
}

KT_TEST(cli_n_probs_reports_one_entry_per_generated_token) {
    KT_NEED_KILN_BIN();
    kt_proc p;
    KT_CHECK(kt_run_kiln("generate --prompt-ids 1,17,93 -n 5 --temp 0 --ignore-eos --json --n-probs 3", NULL, &p) == 0);
    cJSON *j = cJSON_Parse(p.out);
    KT_CHECKF(p.status == 0 && j, "%s %s", p.out, p.err);
    const cJSON *ids = cJSON_GetObjectItem(j, "generated_ids"), *probs = cJSON_GetObjectItem(j, "probs");
    KT_CHECK(cJSON_GetArraySize(ids) == 5 && cJSON_GetArraySize(probs) == 5);
    for (int i = 0; i < 5; i++) {
        const cJSON *e = cJSON_GetArrayItem(probs, i), *top = cJSON_GetObjectItem(e, "top");
        KT_CHECK_EQ(cJSON_GetObjectItem(e, "id")->valueint, cJSON_GetArrayItem(ids, i)->valueint);
        KT_CHECK_EQ(cJSON_GetArraySize(top), 3);
        /* greedy: the chosen token is the most likely one */
        KT_CHECK_EQ(cJSON_GetObjectItem(cJSON_GetArrayItem(top, 0), "id")->valueint, cJSON_GetArrayItem(ids, i)->valueint);
        KT_CHECK(cJSON_GetObjectItem(e, "logprob")->valuedouble <= 0);
    }
    cJSON_Delete(j);
    kt_run_free(&p);
}

KT_TEST(cli_parse_ids_rejects_empty_entries) {
    int32_t *ids;
    int n;
    KT_CHECK_OK(kiln_parse_ids("1,17, 93", &ids, &n));
    KT_CHECK(n == 3 && ids[0] == 1 && ids[1] == 17 && ids[2] == 93);
    free(ids);
    KT_CHECK_OK(kiln_parse_ids(" 4 5\t6 ", &ids, &n));
    KT_CHECK(n == 3 && ids[2] == 6);
    free(ids);
    KT_CHECK_ERR(kiln_parse_ids("1,,2", &ids, &n), "empty entry");
    KT_CHECK_ERR(kiln_parse_ids(",1", &ids, &n), "empty entry");
    KT_CHECK_ERR(kiln_parse_ids("1 , ,2", &ids, &n), "empty entry");
    KT_CHECK_ERR(kiln_parse_ids("1,", &ids, &n), "ends with a comma");
    KT_CHECK_ERR(kiln_parse_ids("1,x", &ids, &n), "not a list of token ids");
    KT_CHECK_ERR(kiln_parse_ids("-3", &ids, &n), "not a list of token ids");
}

KT_TEST(cli_model_paths_get_distinct_messages) {
    char dir[] = "/tmp/kiln-cli-paths-XXXXXX", gguf[128], file[128], missing[128];
    KT_CHECK(mkdtemp(dir));
    snprintf(gguf, sizeof gguf, "%s/model-Q4_K_M.gguf", dir);
    snprintf(file, sizeof file, "%s/config.json", dir);
    snprintf(missing, sizeof missing, "%s/nope", dir);
    FILE *f = fopen(gguf, "w");
    KT_CHECK(f);
    fclose(f);
    f = fopen(file, "w");
    KT_CHECK(f);
    fclose(f);
    KT_CHECK_OK(ku_check_model_dir(dir));
    KT_CHECK_ERR(ku_check_model_dir(missing), "no such folder");
    KT_CHECK_ERR(ku_check_model_dir(gguf), "is a GGUF file");
    KT_CHECK_ERR(ku_check_model_dir(file), "is a file, not a folder");
    if (kt_kiln_bin()) {
        char args[256];
        const char *cmds[] = {"generate -p hi", "info", "tokenize -p hi", "detokenize 1", "chat"};
        for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
            snprintf(args, sizeof args, "%s -m %s", cmds[i], missing);
            EXPECT_RUN(args, 1, "no such folder");
            snprintf(args, sizeof args, "%s -m %s", cmds[i], gguf);
            EXPECT_RUN(args, 1, "is a GGUF file");
            snprintf(args, sizeof args, "%s -m %s", cmds[i], file);
            EXPECT_RUN(args, 1, "is a file, not a folder");
        }
    }
    unlink(gguf), unlink(file), rmdir(dir);
}

KT_TEST(cli_tokenizer_commands_default_to_the_demo_model) {
    KT_NEED_KILN_BIN();
    kt_proc p;
    KT_CHECK(kt_run_kiln("tokenize -p 'Hello world'", NULL, &p) == 0);
    KT_CHECKF(p.status == 0 && p.out[0] >= '0' && p.out[0] <= '9', "%s %s", p.out, p.err);
    char args[256];
    p.out[strcspn(p.out, "\n")] = 0;
    snprintf(args, sizeof args, "detokenize %.200s", p.out);
    kt_run_free(&p);
    EXPECT_RUN(args, 0, "Hello world");
    char dir[] = "/tmp/kiln-cli-tmpl-XXXXXX", msgs[128];
    KT_CHECK(mkdtemp(dir));
    snprintf(msgs, sizeof msgs, "%s/m.json", dir);
    FILE *f = fopen(msgs, "w");
    KT_CHECK(f);
    fputs("[{\"role\": \"user\", \"content\": \"Hi there\"}]", f);
    fclose(f);
    snprintf(args, sizeof args, "template --messages %s --add-generation-prompt", msgs);
    EXPECT_RUN(args, 0, "Hi there");
    unlink(msgs), rmdir(dir);
}

KT_TEST(cli_context_checks_and_memory) {
    KT_NEED_KILN_BIN();
    /* the demo model was trained on 256 positions */
    kt_proc p;
    KT_CHECK(kt_run_kiln("generate -p Hello -n 2 -c 1024", NULL, &p) == 0);
    KT_CHECKF(strstr(p.err, "longer than the 256 positions the model was trained on"), "%s", p.err);
    kt_run_free(&p);
    KT_CHECK(kt_run_kiln("generate -p Hello -n 2 -c 256", NULL, &p) == 0);
    KT_CHECKF(p.status == 0 && !strstr(p.err, "warning"), "%s", p.err);
    kt_run_free(&p);
    /* a prompt too long for the context: the error, and the prompt is not echoed first */
    static char args[8192];
    int n = snprintf(args, sizeof args, "generate -c 16 -n 2 -p '");
    for (int i = 0; i < 100; i++) n += snprintf(args + n, sizeof args - (size_t)n, "word ");
    snprintf(args + n, sizeof args - (size_t)n, "'");
    KT_CHECK(kt_run_kiln(args, NULL, &p) == 0);
    KT_CHECKF(p.status == 1 && strstr(p.err, "more than the context size 16") && !*p.out, "%s %s", p.out, p.err);
    kt_run_free(&p);
    /* kiln info: 4 layers x 4 KV heads x 32 dims, K and V, float32 = 4 MiB per 1k tokens */
    EXPECT_RUN("info", 0, "KV cache     4.00 MiB per 1k tokens");
    EXPECT_RUN("info -c 1024 --parallel 2", 0, "kiln serve -c 1024 --parallel 2 (weights + at most 8.0 MiB allocated)");
    EXPECT_RUN("info -c 1024", 0, "4.0 MiB at the context 1024");
}

/* An installed binary (PREFIX/bin/kiln, as make install lays it out) finds
 * the demo model under PREFIX/share/kiln/models; a copy with nothing beside
 * it says where it looked. */
KT_TEST(cli_installed_binary_finds_the_demo_model) {
    KT_NEED_KILN_BIN();
    char pre[] = "/tmp/kiln-cli-prefix-XXXXXX", model[128], demo[PATH_MAX];
    static char cmd[16384];
    KT_CHECK(mkdtemp(pre));
    char rel[4096];
    KT_CHECK(realpath(kt_path(rel, sizeof rel, "models/kiln-demo"), demo)); /* an absolute path for the copy */
    snprintf(model, sizeof model, "%s/share/kiln/models/kiln-demo", pre);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/bin %s && cp '%s' %s/bin/kiln && cp '%s'/* %s/", pre, model, kt_kiln_bin(), pre,
             demo, model);
    KT_CHECK(system(cmd) == 0);
    char bin[4200];
    snprintf(bin, sizeof bin, "%s/bin/kiln", pre);
    kt_proc p;
    KT_CHECK(kt_run_bin(bin, "info", NULL, &p) == 0);
    char want[4200];
    snprintf(want, sizeof want, "model        %s\n", model);
    KT_CHECKF(p.status == 0 && strstr(p.out, want), "%s %s", p.out, p.err);
    kt_run_free(&p);
    /* without the model: the message says where it looked and what to do */
    snprintf(cmd, sizeof cmd, "rm -rf %s/share", pre);
    KT_CHECK(system(cmd) == 0);
    KT_CHECK(kt_run_bin(bin, "generate -p hi", "", &p) == 0);
    KT_CHECKF(p.status == 1 && strstr(p.err, "the bundled demo model is neither installed") && strstr(p.err, "KILN_DEFAULT_MODEL"),
              "%s", p.err);
    kt_run_free(&p);
    snprintf(cmd, sizeof cmd, "rm -rf %s", pre);
    KT_CHECK(system(cmd) == 0);
}

/* kiln bench --embed: a figure per batch kind, the long inputs capped at the
 * model's positions, its options checked as every command's are. */
KT_TEST(cli_bench_embed_reports_embeddings_per_second) {
    KT_NEED_KILN_BIN();
    kt_proc p;
    KT_CHECK(kt_run_kiln("bench --embed -m tests/fixtures/embed/xlmr_cls --json --batch 3 --short 5 --long 100000 -r 1",
                         NULL, &p) == 0);
    KT_CHECKF(p.status == 0, "status %d: %s", p.status, p.err);
    cJSON *j = cJSON_Parse(p.out);
    KT_CHECKF(j, "not JSON: %s", p.out);
    const cJSON *s = cJSON_GetObjectItem(j, "short"), *l = cJSON_GetObjectItem(j, "long");
    KT_CHECK(s && l && cJSON_GetObjectItem(j, "batch")->valueint == 3);
    KT_CHECK_EQ(cJSON_GetObjectItem(s, "tokens")->valueint, 5);
    int long_tokens = cJSON_GetObjectItem(l, "tokens")->valueint;
    KT_CHECKF(long_tokens > 5 && long_tokens <= 514, "long inputs of %d tokens: not capped at the positions", long_tokens);
    KT_CHECK(cJSON_GetObjectItem(s, "embeddings_per_s")->valuedouble > 0 && cJSON_GetObjectItem(l, "tokens_per_s")->valuedouble > 0);
    cJSON_Delete(j);
    kt_run_free(&p);
    EXPECT_RUN("bench --embed", 1, "needs -m DIR");
    EXPECT_RUN("bench --embed -m tests/fixtures/embed/xlmr_cls --batch 0", 1, "--batch");
    EXPECT_RUN("bench --embed --help", 0, "embeddings per second");
}

/* kiln bench --multi-turn: turn 2 reuses turn 1 from memory, from disk and
 * after a restart (the bench checks the first tokens are the cold run's). */
KT_TEST(cli_bench_multi_turn_reuses_turn_one) {
    KT_NEED_KILN_BIN();
    const char *models[2] = {"qwen2", "jamba"};
    for (int k = 0; k < 2; k++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "bench --multi-turn -m tests/fixtures/oracle/%s -p 100 -n 4 --turn2 8 -t 1 --json", models[k]);
        kt_proc p;
        KT_CHECK(kt_run_kiln(cmd, NULL, &p) == 0);
        KT_CHECKF(p.status == 0, "%s: status %d: %s", models[k], p.status, p.err);
        cJSON *j = cJSON_Parse(p.out);
        KT_CHECKF(j, "not JSON: %s", p.out);
        static const char *const names[4] = {"cold", "cached", "disk", "restart"};
        for (int i = 0; j && i < 4; i++) {
            const cJSON *r = cJSON_GetObjectItem(j, names[i]);
            KT_CHECK(r && cJSON_GetObjectItem(r, "ttft_s")->valuedouble > 0);
            int reused = r ? cJSON_GetObjectItem(r, "reused_tokens")->valueint : -1;
            KT_CHECKF(i ? reused == 96 : reused == 0, "%s %s: %d tokens reused", models[k], names[i], reused);
            int disk = r ? cJSON_GetObjectItem(r, "disk_hits")->valueint : -1;
            KT_CHECKF(i >= 2 ? disk == 96 : disk == 0, "%s %s: %d disk hits", models[k], names[i], disk);
        }
        cJSON_Delete(j);
        kt_run_free(&p);
    }
    EXPECT_RUN("bench --multi-turn", 1, "needs -m DIR");
    EXPECT_RUN("bench --multi-turn -m tests/fixtures/oracle/qwen2 --chunk 3", 1, "--chunk");
    EXPECT_RUN("bench --multi-turn --help", 0, "time to first token");
}

/* kiln bench --json-schema: plain and constrained figures at batch 1 and
 * --batch; a bad schema or a missing constraint value is an error naming it */
KT_TEST(cli_bench_json_schema_reports_both) {
    KT_NEED_KILN_BIN();
    kt_proc p;
    KT_CHECK(kt_run_kiln("bench --json-schema '{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}' "
                         "-n 8 -r 1 --batch 2 --json",
                         NULL, &p) == 0);
    KT_CHECKF(p.status == 0, "status %d: %s", p.status, p.err);
    cJSON *j = cJSON_Parse(p.out);
    KT_CHECKF(j, "not JSON: %s", p.out);
    KT_CHECK(j && cJSON_GetObjectItem(j, "tg_tps")->valuedouble > 0 && cJSON_GetObjectItem(j, "tg_constrained_tps")->valuedouble > 0);
    KT_CHECK(j && cJSON_GetObjectItem(j, "batch_size")->valueint == 2 &&
             cJSON_GetObjectItem(j, "batch_constrained_tps")->valuedouble > 0);
    cJSON_Delete(j);
    kt_run_free(&p);
    EXPECT_RUN("bench --json-schema '{\"type\":\"objekt\"}' -n 2", 1, "objekt");
    EXPECT_RUN("bench --grammar-file", 1, "--grammar-file needs a value");
}
