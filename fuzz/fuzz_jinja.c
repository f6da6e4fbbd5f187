/* fuzz_jinja.c: libFuzzer harness for the chat template engine.
 * The input is a template; it is parsed and rendered with a small chat
 * context under tight limits. Any crash, leak or sanitizer report is a bug:
 * bad templates must come back as errors. Build: make fuzz-jinja. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja.h"

static const char *CTX =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"},"
    " {\"role\": \"user\", \"content\": \"hi \\u00e9 \\ud83d\\ude00\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"type\": \"function\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, null, true]}}}]},"
    " {\"role\": \"tool\", \"content\": \"{}\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"n\": 3}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static cJSON *ctx;
    if (!ctx) ctx = cJSON_Parse(CTX);
    kjin_template *t = NULL;
    kiln_status st = kjin_parse((const char *)data, size, &t);
    if (!st) {
        kjin_limits lim = kjin_limits_default();
        lim.max_steps = 200000;
        lim.max_output = 1 << 20;
        lim.max_memory = 64 << 20;
        lim.max_depth = 50;
        lim.now = 0;
        char *out = NULL;
        st = kjin_render(t, ctx, &lim, &out, NULL);
        free(out);
    }
    kiln_status_free(st);
    kjin_free(t);
    return 0;
}
