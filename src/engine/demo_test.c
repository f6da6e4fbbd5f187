/* The bundled demo model (models/kiln-demo): it loads, its greedy output
 * matches the ids and logits that the training script's own PyTorch forward
 * recorded (tests/data/demo), and its tokenizer and chat template give the
 * ids the reference tokenizer gives. */
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "chat/chat.h"
#include "engine/validate.h"
#include "kt.h"
#include "tokenizer/tokenizer.h"

KT_TEST(demo_model_matches_its_pytorch_reference) {
    char model[4096], oracle[4096];
    kt_path(model, sizeof model, "models/kiln-demo");
    kt_path(oracle, sizeof oracle, "tests/data/demo");
    kv_options o = {.oracle_dir = oracle};
    kv_result r;
    KT_CHECK_OK(kv_validate(model, &o, &r));
    KT_CHECKF(r.pass, "demo model: %s", r.reason);
    KT_CHECK_EQ(r.greedy_ok, r.greedy_total);
}

KT_TEST(demo_tokenizer_and_template_match_reference) {
    char dir[4096], path[4096];
    kt_path(dir, sizeof dir, "models/kiln-demo");
    ktok *t;
    KT_CHECK_OK(ktok_load(dir, &t));
    cJSON *v;
    KT_CHECK_OK(ku_json_load(kt_path(path, sizeof path, "tests/data/demo/tokenizer_vectors.json"), &v));
    const cJSON *c;
    int n = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(v, "cases")) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(c, "ids");
        /* cJSON cuts strings at an escaped NUL: skip texts holding one (id 3 is byte 0x00) */
        bool has_nul = false;
        for (int i = 0; i < cJSON_GetArraySize(want); i++) has_nul |= cJSON_GetArrayItem(want, i)->valueint == 3;
        if (has_nul) continue;
        int32_t *ids;
        size_t nids;
        KT_CHECK_OK(ktok_encode(t, text, strlen(text), false, &ids, &nids));
        bool same = (int)nids == cJSON_GetArraySize(want);
        for (size_t i = 0; same && i < nids; i++) same = ids[i] == cJSON_GetArrayItem(want, (int)i)->valueint;
        free(ids);
        KT_CHECKF(same, "demo tokenizer: \"%s\" gives other ids than the reference", text);
        n++;
    }
    KT_CHECK(n >= 40);
    /* the chat template renders and tokenizes as the reference did */
    const cJSON *chat = cJSON_GetObjectItem(v, "chat");
    kchat_template *tpl;
    KT_CHECK_OK(kchat_load(dir, &tpl));
    kchat_input in = {.messages = cJSON_GetObjectItem(chat, "messages"), .add_generation_prompt = true};
    char *out;
    KT_CHECK_OK(kchat_render(tpl, &in, &out));
    KT_CHECK_STR(out, cJSON_GetObjectItem(chat, "rendered")->valuestring);
    int32_t *ids;
    size_t nids;
    KT_CHECK_OK(ktok_encode(t, out, strlen(out), false, &ids, &nids));
    const cJSON *want = cJSON_GetObjectItem(chat, "ids");
    KT_CHECK_EQ((int)nids, cJSON_GetArraySize(want));
    for (size_t i = 0; i < nids; i++) KT_CHECK_EQ(ids[i], cJSON_GetArrayItem(want, (int)i)->valueint);
    free(ids);
    free(out);
    kchat_free(tpl);
    cJSON_Delete(v);
    ktok_free(t);
}
