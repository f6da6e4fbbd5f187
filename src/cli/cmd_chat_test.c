/* cmd_chat_test.c: `kiln chat` scripted through a pipe, as a user scripts
 * it: one user turn per line, one reply per turn. The replies with the
 * previous turns' KV reused equal the replies computed from scratch, and a
 * turn with an image equals kiln generate on the same prompt and image. */
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/file.h"
#include "base/json.h"
#include "ckpt/ckpt_test.h"
#include "kt.h"
#include "kt_run.h"

/* The k-th line of s (0-based) into buf. */
static const char *line_of(const char *s, int k, char *buf, size_t cap) {
    for (; k > 0 && s; k--) s = strchr(s, '\n'), s = s ? s + 1 : NULL;
    if (!s) return NULL;
    size_t n = strcspn(s, "\n");
    if (n >= cap) n = cap - 1;
    memcpy(buf, s, n);
    buf[n] = 0;
    return buf;
}

KT_TEST(cli_chat_reuses_the_previous_turns_and_matches_a_fresh_run) {
    KT_NEED_KILN_BIN();
    char conv[] = "/tmp/kiln-chat-XXXXXX", path[128], in[512];
    KT_CHECK(mkdtemp(conv));
    snprintf(path, sizeof path, "%s/c.json", conv);
    /* three turns; the demo model's replies end at its end-of-turn token or after 12 tokens, on one line */
    const char *flags = "chat -n 12 --temp 0 --stop '\\n'";
    snprintf(in, sizeof in, "Tell me a proverb.\n/save %s\nAnother one, please.\nAnd a third.\n", path);
    kt_proc a;
    KT_CHECK(kt_run_kiln(flags, in, &a) == 0);
    KT_CHECKF(a.status == 0, "%s", a.err);
    char r1[512], r2[512], r3[512], b2[512], b3[512];
    KT_CHECKF(line_of(a.out, 0, r1, sizeof r1) && line_of(a.out, 1, r2, sizeof r2) && line_of(a.out, 2, r3, sizeof r3),
              "%s", a.out);
    KT_CHECK(!line_of(a.out, 3, b2, sizeof b2) || !*b2); /* one line per reply */
    /* the second and third turns computed only what followed the KV they kept */
    const char *s2 = strstr(a.err, "\n[");
    KT_CHECKF(s2 && !strstr(s2, " 0 reused"), "%s", a.err);
    /* the saved conversation: the first turn */
    cJSON *j;
    KT_CHECK_OK(ku_json_load(path, &j));
    KT_CHECK_EQ(cJSON_GetArraySize(j), 2);
    KT_CHECK_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 1), "content")->valuestring, r1);
    cJSON_Delete(j);
    /* from scratch: load the first turn, then the same two turns */
    snprintf(in, sizeof in, "/load %s\nAnother one, please.\nAnd a third.\n", path);
    kt_proc b;
    KT_CHECK(kt_run_kiln(flags, in, &b) == 0);
    KT_CHECKF(b.status == 0 && line_of(b.out, 0, b2, sizeof b2) && line_of(b.out, 1, b3, sizeof b3), "%s %s", b.out, b.err);
    KT_CHECK_STR(b2, r2);
    KT_CHECK_STR(b3, r3);
    kt_run_free(&b);
    /* /clear forgets the conversation: the first reply again */
    snprintf(in, sizeof in, "Tell me a proverb.\n/clear\nTell me a proverb.\n");
    KT_CHECK(kt_run_kiln(flags, in, &b) == 0);
    KT_CHECKF(b.status == 0 && line_of(b.out, 0, b2, sizeof b2) && line_of(b.out, 1, b3, sizeof b3), "%s", b.err);
    KT_CHECK_STR(b2, r1);
    KT_CHECK_STR(b3, r1);
    kt_run_free(&b);
    kt_run_free(&a);
    unlink(path), rmdir(conv);
}

KT_TEST(cli_chat_commands_and_bad_input_are_errors_not_silence) {
    KT_NEED_KILN_BIN();
    kt_proc p;
    KT_CHECK(kt_run_kiln("chat -n 4 --temp 0", "/nonsense\n/load /nonexistent.json\n/image x.png\n/system\n", &p) == 0);
    KT_CHECK_EQ(p.status, 0); /* the session goes on after each error */
    KT_CHECKF(strstr(p.err, "unknown command /nonsense") && strstr(p.err, "/nonexistent.json") &&
                  strstr(p.err, "is not a vision-language model") && strstr(p.err, "/system TEXT"),
              "%s", p.err);
    kt_run_free(&p);
    KT_CHECK(kt_run_kiln("chat --n-probs 2", "", &p) == 0);
    KT_CHECK(p.status != 0 && strstr(p.err, "--n-probs"));
    kt_run_free(&p);
    /* an empty input is an empty session */
    KT_CHECK(kt_run_kiln("chat", "", &p) == 0);
    KT_CHECK(p.status == 0 && !*p.out);
    kt_run_free(&p);
}

/* A LLaVA fixture with a word-level tokenizer and a chat template that
 * writes the image placeholder: the chat turn with /image gives the text
 * kiln generate gives for the same prompt ids and image. */
KT_TEST(cli_chat_image_turn_matches_generate) {
    KT_NEED_KILN_BIN();
    char dir[] = "/tmp/kiln-chat-vlm-XXXXXX", src[4096], rel[256], p[4200];
    KT_CHECK(mkdtemp(dir));
    const char *files[] = {"config.json", "model.safetensors", "preprocessor_config.json", "generation_config.json"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(rel, sizeof rel, "tests/fixtures/vlm/llava/%s", files[i]);
        KT_CHECK(ckt_copy(kt_path(src, sizeof src, rel), dir, files[i]));
    }
    /* every id has a word ("w7 "), so that any reply has text */
    static char tj[16384];
    size_t n = (size_t)snprintf(tj, sizeof tj, "{\"added_tokens\": [{\"id\": 512, \"content\": \"<image>\", \"special\": true}],"
                                                " \"pre_tokenizer\": {\"type\": \"WhitespaceSplit\"}, \"model\": {\"type\": \"WordLevel\","
                                                " \"unk_token\": \"<unk>\", \"vocab\": {\"<unk>\": 0, \"USER:\": 17, \"ASSISTANT:\": 93,"
                                                " \"what\": 254, \"is\": 311, \"this\": 42");
    for (int i = 1; i < 512; i++)
        if (i != 17 && i != 93 && i != 254 && i != 311 && i != 42) n += (size_t)snprintf(tj + n, sizeof tj - n, ", \"w%d \": %d", i, i);
    snprintf(tj + n, sizeof tj - n, "}}}");
    KT_CHECK(ckt_write_str(dir, "tokenizer.json", tj));
    KT_CHECK(ckt_write_str(dir, "tokenizer_config.json",
                           "{\"chat_template\": \"{% for m in messages %}USER: {% if m.content is string %}{{ m.content }}"
                           "{% else %}{% for p in m.content %}{% if p.type == 'image' %}<image> {% else %}{{ p.text }}{% endif %}"
                           "{% endfor %}{% endif %} {% endfor %}ASSISTANT:\"}"));
    snprintf(src, sizeof src, "%s/image.png", kt_path(p, sizeof p, "tests/fixtures/vlm/llava"));
    char args[16384], in[16384];
    snprintf(args, sizeof args, "chat -m %s -n 6 --temp 0 --ignore-eos -t 1", dir);
    snprintf(in, sizeof in, "/image %s\nwhat is this\n", src);
    kt_proc c, g;
    KT_CHECK(kt_run_kiln(args, in, &c) == 0);
    KT_CHECKF(c.status == 0 && *c.out, "%s", c.err);
    /* USER: <image> what is this ASSISTANT: */
    snprintf(args, sizeof args, "generate -m %s --image %s --prompt-ids 17,512,254,311,42,93 -n 6 --temp 0 --ignore-eos -t 1 --json", dir, src);
    KT_CHECK(kt_run_kiln(args, NULL, &g) == 0);
    cJSON *j = cJSON_Parse(g.out);
    KT_CHECKF(g.status == 0 && j, "%s", g.err);
    const cJSON *text = cJSON_GetObjectItem(j, "text");
    KT_CHECKF(cJSON_IsString(text) && *text->valuestring, "%s", g.out);
    char want[1024];
    snprintf(want, sizeof want, "%s\n", text->valuestring);
    KT_CHECK_STR(c.out, want);
    /* a second turn with a second image: both images stay in the
     * conversation, in order; the reply equals kiln generate with --image
     * twice on the re-rendered conversation:
     * USER: <image> what is this USER: <reply> USER: <image> what is this ASSISTANT: */
    char conv[4096], ids2[2048] = "";
    snprintf(conv, sizeof conv, "tokenize -m %s -p 'USER: <image> what is this USER: %s USER: <image> what is this ASSISTANT:'", dir,
             text->valuestring);
    cJSON_Delete(j);
    kt_run_free(&c), kt_run_free(&g);
    kt_proc tk;
    KT_CHECK(kt_run_kiln(conv, NULL, &tk) == 0);
    KT_CHECKF(tk.status == 0, "%s", tk.err);
    for (const char *q = tk.out; *q; q++) /* the ids, space- or line-separated, as a comma list */
        if (strlen(ids2) + 2 < sizeof ids2) {
            char ch = *q == ' ' || *q == '\n' ? ',' : *q;
            size_t l = strlen(ids2);
            if (ch != ',' || (l && ids2[l - 1] != ',')) ids2[l] = ch, ids2[l + 1] = 0;
        }
    if (*ids2 && ids2[strlen(ids2) - 1] == ',') ids2[strlen(ids2) - 1] = 0;
    kt_run_free(&tk);
    KT_CHECKF(strstr(ids2, "512") && strstr(strstr(ids2, "512") + 3, "512"), "two image tokens: %s", ids2);
    snprintf(args, sizeof args, "chat -m %s -n 6 --temp 0 --ignore-eos -t 1", dir);
    snprintf(in, sizeof in, "/image %s\nwhat is this\n/image %s\nwhat is this\n", src, src);
    KT_CHECK(kt_run_kiln(args, in, &c) == 0);
    KT_CHECKF(c.status == 0 && *c.out, "%s", c.err);
    snprintf(args, sizeof args, "generate -m %s --image %s --image %s --prompt-ids %s -n 6 --temp 0 --ignore-eos -t 1 --json", dir,
             src, src, ids2);
    KT_CHECK(kt_run_kiln(args, NULL, &g) == 0);
    j = cJSON_Parse(g.out);
    KT_CHECKF(g.status == 0 && j, "%s", g.err);
    text = cJSON_GetObjectItem(j, "text");
    char want2[2048];
    snprintf(want2, sizeof want2, "%s%s\n", want, cJSON_IsString(text) ? text->valuestring : "?");
    KT_CHECK_STR(c.out, want2);
    cJSON_Delete(j);
    kt_run_free(&c), kt_run_free(&g);
    const char *all[] = {"config.json", "model.safetensors", "preprocessor_config.json", "generation_config.json", "tokenizer.json",
                         "tokenizer_config.json"};
    for (size_t i = 0; i < 6; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, all[i]);
        unlink(p);
    }
    rmdir(dir);
}

/* On a terminal (a pseudo-terminal here): libedit reads the line, Ctrl-C
 * stops the reply being written and the session goes on, the up arrow
 * recalls the previous line, /exit leaves with status 0. */
static size_t pty_read(int fd, char *buf, size_t len, size_t cap, double seconds, const char *until) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    size_t from = len; /* until is looked for in what this call reads */
    for (;;) {
        buf[len] = 0;
        if (until && strstr(buf + from, until)) return len;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec) > seconds) return len;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n <= 0) return len;
        len += (size_t)n;
    }
}

KT_TEST(cli_chat_on_a_terminal_ctrl_c_stops_the_reply) {
    KT_NEED_KILN_BIN();
    int fd;
    pid_t pid = forkpty(&fd, NULL, NULL, NULL);
    KT_CHECK(pid >= 0);
    if (pid == 0) {
        execl(kt_kiln_bin(), "kiln", "chat", "-n", "100000", "-c", "256", "--temp", "0", "--ignore-eos", "-t", "1", (char *)NULL);
        _exit(127);
    }
    static char out[1 << 16];
    size_t n = pty_read(fd, out, 0, sizeof out, 30, "> ");
    KT_CHECKF(strstr(out, "> "), "no prompt: %s", out);
    /* libedit may flush pending input while it sets the terminal up after
     * printing the prompt: type a moment later, as a person does */
    pty_read(fd, out, n, sizeof out, 0.3, NULL);
    KT_CHECK(write(fd, "Hello\r", 6) == 6);
    n = pty_read(fd, out, n, sizeof out, 30, "Hello\r\n");
    size_t at = n;
    /* the first bytes of the reply, then Ctrl-C at once: the demo model
     * fills its 256 positions in a fraction of a second */
    for (int i = 0; i < 600 && n == at; i++) n = pty_read(fd, out, n, sizeof out, 0.05, NULL);
    kill(pid, SIGINT);
    /* the reply stops, its line of figures, the next prompt */
    n = pty_read(fd, out, n, sizeof out, 30, "stopped (Ctrl-C)]\r\n> ");
    KT_CHECKF(strstr(out + at, "stopped (Ctrl-C)]\r\n> "), "%s", out);
    n = pty_read(fd, out, n, sizeof out, 0.3, NULL);
    at = n;
    KT_CHECK(write(fd, "\x1b[A\r", 4) == 4); /* the previous line again */
    n = pty_read(fd, out, n, sizeof out, 30, "Hello");
    KT_CHECKF(strstr(out + at, "Hello"), "history: %s", out + at);
    kill(pid, SIGINT);
    n = pty_read(fd, out, n, sizeof out, 30, "stopped (Ctrl-C)]\r\n> ");
    KT_CHECKF(strstr(out + at, "stopped (Ctrl-C)]\r\n> ") && !strstr(out + at, " 0 reused"), "%s", out + at);
    n = pty_read(fd, out, n, sizeof out, 0.3, NULL);
    KT_CHECK(write(fd, "/exit\r", 6) == 6);
    int status = -1;
    for (int i = 0; i < 300 && waitpid(pid, &status, WNOHANG) == 0; i++) {
        n = pty_read(fd, out, n, sizeof out, 0.1, NULL);
        usleep(100000); /* the read fails at once when the terminal has closed */
    }
    if (!WIFEXITED(status)) kill(pid, SIGKILL), waitpid(pid, NULL, 0);
    close(fd);
    KT_CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d: %s", status, out);
}

/* kiln generate --image on Mllama (tests/fixtures/vlm/mllama): kiln's own
 * preprocessing of image.png, the tower's cross-attention states on the
 * <|image|> token, the oracle's 16 greedy ids. */
KT_TEST(cli_generate_mllama_image_gives_the_oracle_ids) {
    char dir[2048], args[8192], path[4096];
    kt_path(dir, sizeof dir, "tests/fixtures/vlm/mllama");
    snprintf(args, sizeof args, "generate -m %s --image %s/image.png --prompt-ids 1,17,93,512,254,311,42,500,7,128 -n 16 --temp 0 "
             "--ignore-eos -t 1 --json", dir, dir);
    kt_proc g;
    KT_CHECK(kt_run_kiln(args, NULL, &g) == 0);
    cJSON *j = cJSON_Parse(g.out), *o = NULL;
    KT_CHECKF(g.status == 0 && j, "%s", g.err);
    snprintf(path, sizeof path, "%s/oracle.json", dir);
    KT_CHECK_OK(ku_json_load(path, &o));
    const cJSON *got = cJSON_GetObjectItem(j, "generated_ids"), *want = cJSON_GetObjectItem(o, "generated_ids");
    KT_CHECK(cJSON_IsArray(got) && cJSON_IsArray(want) && cJSON_GetArraySize(want) == 16);
    char *a = cJSON_PrintUnformatted(got), *b = cJSON_PrintUnformatted(want);
    KT_CHECK_STR(a, b);
    free(a), free(b);
    cJSON_Delete(j), cJSON_Delete(o);
    kt_run_free(&g);
}
