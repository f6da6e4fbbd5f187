/* cmd_template_test.c: `kiln template` on a folder holding only a
 * tokenizer_config.json, run in a child whose stdout goes to a file. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "cli/cmd_template.h"
#include "kt.h"

static int run_cmd(char **argv, int argc, const char *out_path) {
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(out_path, "wb", stdout);
        if (!f) _exit(99);
        FILE *e = freopen("/dev/null", "wb", stderr);
        (void)e;
        int rc = kiln_cmd_template(argc, argv);
        fflush(stdout);
        _exit(rc);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

KT_TEST(cli_template_renders_a_folder) {
    char dir[] = "/tmp/kiln-cli-template-XXXXXX";
    KT_CHECK(mkdtemp(dir));
    char cfg[256], msgs[256], out[256];
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    snprintf(msgs, sizeof msgs, "%s/messages.json", dir);
    snprintf(out, sizeof out, "%s/out.txt", dir);
    FILE *f = fopen(cfg, "wb");
    fputs("{\"eos_token\": \"<E>\", \"chat_template\": \"{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}"
          "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}{{ mode | default('') }}\"}", f);
    fclose(f);
    f = fopen(msgs, "wb");
    fputs("[{\"role\": \"user\", \"content\": \"hi\"}]", f);
    fclose(f);
    char *argv[] = {"template", "-m", dir, "--messages", msgs, "--add-generation-prompt", "--kwargs", "{\"mode\": \"!\"}"};
    KT_CHECK_EQ(run_cmd(argv, 8, out), 0);
    char *text;
    KT_CHECK_OK(ku_read_file(out, &text, NULL));
    KT_CHECK_STR(text, "[user]hi<E>[assistant]!");
    free(text);
    char *bad[] = {"template", "-m", "/nonexistent-kiln-dir", "--messages", msgs};
    KT_CHECK_EQ(run_cmd(bad, 5, out), 1);
    char *usage[] = {"template", "-m", dir};
    KT_CHECK_EQ(run_cmd(usage, 3, out), 2); /* no --messages */
    remove(cfg);
    remove(msgs);
    remove(out);
    rmdir(dir);
}
