/* schema_test.c: JSON Schema keywords accepted and rejected on hand-made
 * instances (over a byte vocabulary), compile errors naming the keyword and
 * pointer, masks over a real tokenizer, and the session's grammar hook
 * (sampled output obeys; a sequence's tokens do not depend on a neighbour). */
#include <stdlib.h>
#include <string.h>

#include "gen/session.h"
#include "grammar/grammar.h"
#include "kt.h"

static kgr_vocab *bytes_vocab(void) {
    static char b[256];
    const char *t[257];
    int32_t l[257];
    for (int i = 0; i < 256; i++) b[i] = (char)i, t[i] = &b[i], l[i] = 1;
    t[256] = "", l[256] = 0;
    kgr_vocab *v = NULL;
    kiln_status st = kgr_vocab_from_strings(t, l, 257, 256, &v);
    kiln_status_free(st);
    return v;
}

/* 1 accepted, 0 rejected, -1 compile error */
static int sch(const char *schema, const char *inst) {
    kgr_grammar *g;
    kiln_status st = kgr_from_json_schema(schema, strlen(schema), NULL, &g);
    if (st) {
        kiln_status_free(st);
        return -1;
    }
    kgr_vocab *v = bytes_vocab();
    kgr_index *ix;
    kgr_matcher *m;
    int r = -1;
    if (!kgr_index_create(g, v, &ix)) {
        if (!kgr_matcher_create(ix, &m)) {
            r = kgr_matcher_accept_bytes(m, inst, strlen(inst)) && kgr_matcher_can_end(m);
            kgr_matcher_free(m);
        }
        kgr_index_free(ix);
    }
    kgr_vocab_free(v);
    kgr_grammar_free(g);
    return r;
}

#define OK(s, i) KT_CHECKF(sch(s, i) == 1, "%s should accept %s (got %d)", s, i, sch(s, i))
#define NOT(s, i) KT_CHECKF(sch(s, i) == 0, "%s should reject %s (got %d)", s, i, sch(s, i))

KT_TEST(schema_types) {
    OK("{\"type\":\"integer\"}", "-42");
    NOT("{\"type\":\"integer\"}", "4.2");
    NOT("{\"type\":\"integer\"}", "042");
    OK("{\"type\":\"number\"}", "-4.2e+10");
    OK("{\"type\":[\"string\",\"null\"]}", "null");
    NOT("{\"type\":[\"string\",\"null\"]}", "1");
    OK("{\"type\":\"boolean\"}", "false");
    OK("{\"type\":\"string\"}", "\"a\\\"b\\u00e9\\n\"");
    NOT("{\"type\":\"string\"}", "\"a\nb\"");
    OK("{}", "[1, {\"a\": null}]");
    OK("{\"type\":\"string\",\"nullable\":true}", "null");
}

KT_TEST(schema_objects) {
    const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},"
                    "\"required\":[\"b\"],\"additionalProperties\":false}";
    OK(s, "{\"a\": 1, \"b\": \"x\"}");
    OK(s, "{\"b\": \"x\"}");
    OK(s, "{ \"b\" : \"x\" }");
    NOT(s, "{\"a\": 1}");
    NOT(s, "{\"b\": \"x\", \"c\": 1}");
    NOT(s, "{\"a\": \"1\", \"b\": \"x\"}");
    NOT(s, "{\"b\": \"x\"          }"); /* whitespace runs are bounded */
    const char *open = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}";
    OK(open, "{\"a\": 1, \"zz\": [true]}");
    NOT(open, "{\"a\": 1, \"a\": \"x\"}"); /* an extra key may not repeat a listed one */
    OK("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", "{\"x\": 1, \"y\": 2}");
    const char *pp = "{\"type\":\"object\",\"patternProperties\":{\"^x-[a-z]+$\":{\"type\":\"integer\"}},\"additionalProperties\":false}";
    OK(pp, "{\"x-ab\": 1, \"x-c\": 2}");
    NOT(pp, "{\"y\": 1}");
    NOT(pp, "{\"x-ab\": \"1\"}");
    OK("{\"patternProperties\":{\".*\":{\"type\":\"string\"}}}", "{\"k\": \"v\"}");
    NOT("{\"patternProperties\":{\".*\":{\"type\":\"string\"}}}", "{\"k\": 1}");
    const char *preq = "{\"type\":\"object\",\"patternProperties\":{\".*\":{\"type\":\"integer\"}},\"required\":[\"a\"]}";
    OK(preq, "{\"a\": 1}");
    NOT(preq, "{\"a\": \"x\"}");
    NOT(preq, "{}");
    NOT("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", "{\"x\": \"1\"}");
}

/* properties in any order, each at most once; extra keys anywhere */
KT_TEST(schema_objects_any_order) {
    const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"},"
                    "\"c\":{\"type\":\"boolean\"}},\"required\":[\"a\",\"c\"],\"additionalProperties\":false}";
    OK(s, "{\"a\": 1, \"c\": true}");
    OK(s, "{\"c\": true, \"a\": 1}");
    OK(s, "{\"b\": \"x\", \"c\": false, \"a\": 1}");
    OK(s, "{\"c\": false, \"b\": \"x\", \"a\": 1}");
    NOT(s, "{\"c\": true, \"b\": \"x\"}");              /* a required */
    NOT(s, "{\"c\": true, \"a\": 1, \"c\": true}");     /* each at most once */
    NOT(s, "{\"b\": \"x\", \"a\": 1, \"b\": \"y\", \"c\": true}");
    NOT(s, "{\"c\": 1, \"a\": 1}");                       /* each value its own schema */
    NOT(s, "{\"c\": true, \"a\": 1,}");
    const char *open = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}},"
                       "\"required\":[\"b\"]}";
    OK(open, "{\"x\": [1], \"b\": 2, \"y\": null, \"a\": 1}");
    NOT(open, "{\"x\": [1], \"b\": 2, \"b\": 3}");
    NOT(open, "{\"x\": 1, \"a\": 1}");
    const char *one = "{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{}},\"minProperties\":1,\"additionalProperties\":false}";
    OK(one, "{\"b\": 1, \"a\": 2}");
    NOT(one, "{}");
}

/* bounds past 2^53: the double is not the literal; the bound taken is surely inside it */
KT_TEST(schema_integer_large_bounds) {
    const char *s = "{\"type\":\"integer\",\"minimum\":0,\"maximum\":9223372036854776000}";
    OK(s, "0");
    OK(s, "9223372036854775000");
    NOT(s, "12345678901234567890");
    NOT(s, "9223372036854775808");
    NOT(s, "-1");
    const char *n = "{\"type\":\"integer\",\"exclusiveMinimum\":-9007199254740993000}";
    NOT(n, "-9007199254740993000");
    NOT(n, "-10000000000000000000");
    OK(n, "-9007199254740992000");
    KT_CHECK(sch("{\"type\":\"integer\",\"maximum\":1e30}", "1") == -1); /* refused, never dropped */
}

/* drafts 3 to 7 ignore the keywords beside $ref; 2019-09 on, they apply */
KT_TEST(schema_ref_siblings_by_draft) {
    const char *d7 = "{\"$schema\":\"http://json-schema.org/draft-07/schema#\",\"definitions\":{\"o\":{\"type\":\"object\","
                     "\"properties\":{\"a\":{\"type\":\"integer\"}}}},\"properties\":{\"s\":{\"type\":\"string\",\"$ref\":\"#/definitions/o\"}}}";
    OK(d7, "{\"s\": {\"a\": 1}}");
    NOT(d7, "{\"s\": \"x\"}");
    NOT(d7, "{\"s\": {\"a\": \"1\"}}");
    const char *now = "{\"definitions\":{\"o\":{\"type\":\"object\"}},\"properties\":{\"s\":{\"minLength\":2,"
                      "\"$ref\":\"#/definitions/o\"}}}";
    OK(now, "{\"s\": {}}");
    NOT(now, "{\"s\": \"x\"}");
}

KT_TEST(schema_arrays) {
    const char *s = "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}";
    OK(s, "[1, 2, 3]");
    NOT(s, "[]");
    NOT(s, "[1, 2, 3, 4]");
    NOT(s, "[1, \"2\"]");
    const char *t = "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"items\":false}";
    OK(t, "[\"a\", 1]");
    OK(t, "[\"a\"]");
    NOT(t, "[\"a\", 1, 2]");
    NOT(t, "[1]");
}

KT_TEST(schema_values) {
    OK("{\"enum\":[\"red\",1,null]}", "1");
    OK("{\"enum\":[\"red\",1,null]}", "\"red\"");
    NOT("{\"enum\":[\"red\",1,null]}", "\"blue\"");
    OK("{\"const\":{\"a\":[1,2]}}", "{\"a\": [1, 2]}");
    OK("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\"}]}", "\"x\"");
    NOT("{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"string\"}]}", "true");
    /* disjoint by a required discriminator */
    const char *tagged = "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"t\":{\"const\":\"a\"}},\"required\":[\"t\"]},"
                         "{\"type\":\"object\",\"properties\":{\"t\":{\"const\":\"b\"},\"n\":{\"type\":\"integer\"}},\"required\":[\"t\"]}]}";
    OK(tagged, "{\"t\": \"b\", \"n\": 1}");
    NOT(tagged, "{\"t\": \"c\"}");
    const char *all = "{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
                      "{\"properties\":{\"b\":{\"type\":\"string\"}}}],\"additionalProperties\":false}";
    OK(all, "{\"a\": 1, \"b\": \"x\"}");
    NOT(all, "{\"b\": \"x\"}");
    const char *rec = "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#/$defs/n\"}},"
                      "\"additionalProperties\":false}},\"$ref\":\"#/$defs/n\"}";
    OK(rec, "{\"next\": {\"next\": {}}}");
    NOT(rec, "{\"next\": 1}");
}

KT_TEST(schema_strings_numbers) {
    OK("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"ab\"");
    OK("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"\\u00e9\\n\"");
    NOT("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"abcd\"");
    OK("{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d+$\"}", "\"AB-12\"");
    NOT("{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d+$\"}", "\"AB-\"");
    OK("{\"type\":\"string\",\"format\":\"date\"}", "\"2024-02-29\"");
    NOT("{\"type\":\"string\",\"format\":\"date\"}", "\"2024-13-01\"");
    NOT("{\"type\":\"string\",\"format\":\"date\"}", "\"2022-02-31\"");
    NOT("{\"type\":\"string\",\"format\":\"date\"}", "\"2023-02-29\"");
    NOT("{\"type\":\"string\",\"format\":\"date\"}", "\"1900-02-29\"");
    OK("{\"type\":\"string\",\"format\":\"date\"}", "\"2000-02-29\"");
    OK("{\"type\":\"string\",\"format\":\"date\"}", "\"2023-04-30\"");
    NOT("{\"type\":\"string\",\"format\":\"date\"}", "\"2023-04-31\"");
    OK("{\"type\":\"string\",\"format\":\"uuid\"}", "\"123e4567-e89b-12d3-a456-426614174000\"");
    OK("{\"type\":\"string\",\"format\":\"ipv4\"}", "\"192.168.0.255\"");
    NOT("{\"type\":\"string\",\"format\":\"ipv4\"}", "\"256.1.1.1\"");
    OK("{\"type\":\"string\",\"format\":\"ipv6\"}", "\"fe80::1\"");
    OK("{\"type\":\"string\",\"format\":\"date-time\"}", "\"2022-01-01T12:00:00.000Z\"");
    OK("{\"type\":\"string\",\"format\":\"email\"}", "\"a@b.c\"");
    NOT("{\"type\":\"string\",\"format\":\"email\"}", "\"ab.c\"");
    const char *r = "{\"type\":\"integer\",\"minimum\":-15,\"maximum\":230}";
    for (int i = -20; i <= 240; i++) {
        char b[16];
        snprintf(b, sizeof b, "%d", i);
        KT_CHECKF(sch(r, b) == (i >= -15 && i <= 230), "integer %d in [-15, 230]", i);
    }
    OK("{\"type\":\"integer\",\"exclusiveMinimum\":0}", "1");
    NOT("{\"type\":\"integer\",\"exclusiveMinimum\":0}", "0");
    OK("{\"type\":\"integer\",\"minimum\":100}", "123456");
    NOT("{\"type\":\"integer\",\"minimum\":100}", "99");
    OK("{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "0.5");
    OK("{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "1.0");
    NOT("{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "1.5");
    NOT("{\"type\":\"number\",\"minimum\":0}", "-0.5");
    OK("{\"type\":\"number\",\"exclusiveMinimum\":0}", "0.25");
    NOT("{\"type\":\"number\",\"exclusiveMinimum\":0}", "0.0");
}

/* enum / const beside any keyword: the values that validate (validate.c) */
KT_TEST(schema_finite_values) {
    /* a number equal to a listed one, however written */
    OK("{\"enum\":[0, 5, 3.14]}", "0.0");
    OK("{\"enum\":[0, 5, 3.14]}", "-0");
    OK("{\"enum\":[0, 5, 3.14]}", "5.00");
    OK("{\"enum\":[0, 5, 3.14]}", "3.140");
    OK("{\"const\":{\"a\":[2]}}", "{\"a\": [2.0]}");
    NOT("{\"enum\":[0, 5, 3.14]}", "5.01");
    NOT("{\"enum\":[0, 5, 3.14]}", "3.1");
    NOT("{\"enum\":[0, 5, 3.14]}", "-5");
    NOT("{\"enum\":[0, 5, 3.14]}", "50");
    const char *notnot = "{\"allOf\":[{\"enum\":[1,\"a\",[1,1],{\"k\":2}]},{\"not\":{\"type\":\"string\"}}]}";
    OK(notnot, "1");
    OK(notnot, "[1, 1]");
    NOT(notnot, "\"a\"");
    const char *uniq = "{\"enum\":[[1,1],[1,2]],\"uniqueItems\":true}";
    OK(uniq, "[1, 2]");
    NOT(uniq, "[1, 1]");
    const char *cond = "{\"enum\":[{\"a\":1,\"b\":2},{\"a\":2}],\"if\":{\"properties\":{\"a\":{\"const\":1}}},"
                       "\"then\":{\"required\":[\"b\"]},\"else\":{\"maxProperties\":0}}";
    OK(cond, "{\"a\": 1, \"b\": 2}");
    NOT(cond, "{\"a\": 2}");
    const char *mult = "{\"enum\":[3,4,4.5,6],\"multipleOf\":1.5,\"minimum\":4}";
    OK(mult, "4.5");
    OK(mult, "6");
    NOT(mult, "3");
    NOT(mult, "4");
    const char *pat = "{\"enum\":[\"ab\",\"abc\",\"x\"],\"pattern\":\"^a\",\"maxLength\":2}";
    OK(pat, "\"ab\"");
    NOT(pat, "\"abc\"");
    NOT(pat, "\"x\"");
    /* $ is the end, not before a final newline (ECMAScript, not PCRE2's default) */
    NOT("{\"enum\":[\"a\\n\"],\"pattern\":\"^a$\"}", "\"a\\n\"");
    OK("{\"enum\":[\"a\"],\"pattern\":\"^a$\"}", "\"a\"");
    const char *deps = "{\"enum\":[{\"a\":1},{\"a\":1,\"b\":1}],\"dependencies\":{\"a\":[\"b\"]}}";
    OK(deps, "{\"a\": 1, \"b\": 1}");
    NOT(deps, "{\"a\": 1}");
    NOT("{\"enum\":[1,2],\"not\":{\"enum\":[1,2]}}", "1"); /* nothing left */
    /* what the validator cannot decide is refused, not guessed */
    KT_CHECK(sch("{\"enum\":[{\"a\":1}],\"unevaluatedProperties\":false}", "{\"a\": 1}") == -1);
}

/* oneOf: a branch that only lists required names is excluded exactly */
KT_TEST(schema_one_of_required) {
    const char *s = "{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"integer\"},\"j\":{\"type\":\"integer\"}},"
                    "\"oneOf\":[{\"required\":[\"p\"]},{\"required\":[\"j\"]}]}";
    OK(s, "{\"p\": 1}");
    OK(s, "{\"j\": 2}");
    NOT(s, "{\"p\": 1, \"j\": 2}");
    NOT(s, "{}");
    /* a branch whose names include the other's can never be the only match */
    const char *sub = "{\"type\":\"object\",\"oneOf\":[{\"required\":[\"a\"]},{\"required\":[\"a\",\"b\"]}],"
                      "\"properties\":{\"a\":{},\"b\":{}},\"additionalProperties\":false}";
    OK(sub, "{\"a\": 1}");
    NOT(sub, "{\"a\": 1, \"b\": 2}");
}

/* patternProperties beside listed properties (additionalProperties false);
 * minProperties 1 */
KT_TEST(schema_pattern_properties_listed) {
    const char *s = "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},"
                    "\"patternProperties\":{\"^x-\":{\"type\":\"string\"}},\"additionalProperties\":false}";
    OK(s, "{\"id\": 1, \"x-a\": \"s\"}");
    OK(s, "{\"x-a\": \"s\", \"x-b\": \"t\"}");
    NOT(s, "{\"id\": 1, \"x-a\": 2}");
    NOT(s, "{\"id\": 1, \"y\": \"s\"}");
    /* a listed name the pattern matches would have two schemas: refused */
    KT_CHECK(sch("{\"properties\":{\"x-id\":{}},\"patternProperties\":{\"^x-\":{\"type\":\"string\"}},"
                 "\"additionalProperties\":false}", "{}") == -1);
    const char *m = "{\"type\":\"object\",\"minProperties\":1,\"properties\":{\"a\":{\"type\":\"integer\"}}}";
    OK(m, "{\"a\": 1}");
    OK(m, "{\"b\": null}");
    NOT(m, "{}");
    KT_CHECK(sch("{\"type\":\"object\",\"minProperties\":2}", "{}") == -1);
}

/* pattern or format beside length bounds that every match already meets */
KT_TEST(schema_pattern_lengths_implied) {
    const char *s = "{\"type\":\"string\",\"pattern\":\"^[0-9]{16}$\",\"minLength\":16,\"maxLength\":16}";
    OK(s, "\"1234567890123456\"");
    NOT(s, "\"123456789012345\"");
    const char *w = "{\"type\":\"string\",\"pattern\":\"^(?:[a-z]{1,3}-)?[\\\\w.]{2,8}$\",\"minLength\":2,\"maxLength\":40}";
    OK(w, "\"abc-x_1\"");
    NOT(w, "\"a\"");
    OK("{\"type\":\"string\",\"format\":\"uuid\",\"maxLength\":36}", "\"123e4567-e89b-12d3-a456-426614174000\"");
    /* bounds a match may break: refused */
    KT_CHECK(sch("{\"type\":\"string\",\"pattern\":\"^[0-9]+$\",\"maxLength\":16}", "\"1\"") == -1);
    KT_CHECK(sch("{\"type\":\"string\",\"pattern\":\"^[0-9]{3}\",\"maxLength\":16}", "\"123\"") == -1); /* a search */
    KT_CHECK(sch("{\"type\":\"string\",\"pattern\":\"^a$|^bb$\",\"minLength\":1}", "\"a\"") == -1);
    KT_CHECK(sch("{\"type\":\"string\",\"pattern\":\"^[a-z]{2,}$\",\"minLength\":3}", "\"abc\"") == -1);
}

/* multipleOf of an integer: a residue automaton over the digits */
KT_TEST(schema_integer_multiple_of) {
    const char *s = "{\"type\":\"integer\",\"multipleOf\":7}";
    for (int i = -30; i <= 300; i++) {
        char b[16];
        snprintf(b, sizeof b, "%d", i);
        KT_CHECKF(sch(s, b) == (i % 7 == 0), "%d multiple of 7", i);
    }
    OK(s, "7000000000000000000007");
    NOT(s, "07");
    OK("{\"type\":\"integer\",\"multipleOf\":1,\"minimum\":2}", "3");
    KT_CHECK(sch("{\"type\":\"integer\",\"multipleOf\":3,\"minimum\":2}", "3") == -1); /* with bounds: refused */
    KT_CHECK(sch("{\"type\":\"number\",\"multipleOf\":0.01}", "0.5") == -1);
}

/* dependencies / dependentRequired: the object without the name, or with
 * it and what it needs */
KT_TEST(schema_dependencies) {
    const char *s = "{\"type\":\"object\",\"properties\":{\"card\":{\"type\":\"string\"},\"addr\":{\"type\":\"string\"}},"
                    "\"dependencies\":{\"card\":[\"addr\"]}}";
    OK(s, "{\"card\": \"x\", \"addr\": \"y\"}");
    OK(s, "{\"addr\": \"y\"}");
    OK(s, "{}");
    NOT(s, "{\"card\": \"x\"}");
    const char *sd = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{}},"
                     "\"dependentSchemas\":{\"a\":{\"properties\":{\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}}}";
    OK(sd, "{\"a\": 1, \"b\": \"s\"}");
    OK(sd, "{\"b\": 2}");
    NOT(sd, "{\"a\": 1, \"b\": 2}");
    NOT(sd, "{\"a\": 1}");
    const char *dr = "{\"type\":\"object\",\"required\":[\"a\"],\"dependentRequired\":{\"a\":[\"b\"],\"c\":[\"a\"]}}";
    OK(dr, "{\"a\": 1, \"b\": 2}");
    NOT(dr, "{\"a\": 1}");
}

/* formats the drafts do not define are annotations; defined ones it lacks are errors */
KT_TEST(schema_format_annotations) {
    OK("{\"type\":\"string\",\"format\":\"url\"}", "\"not a url\"");
    OK("{\"type\":\"string\",\"format\":\"byte\"}", "\"QUJD\"");
    NOT("{\"type\":\"string\",\"format\":\"path\"}", "1");
    KT_CHECK(sch("{\"type\":\"string\",\"format\":\"uri-reference\"}", "\"a\"") == -1);
    KT_CHECK(sch("{\"type\":\"string\",\"format\":\"regex\"}", "\"a\"") == -1);
}

KT_TEST(schema_errors) {
    static const char *const cases[][2] = {
        {"{\"type\":\"array\",\"uniqueItems\":true}", "'uniqueItems' at #"},
        {"{\"properties\":{\"t\":{\"not\":{}}}}", "'not' at #/properties/t"},
        {"{\"type\":\"string\",\"format\":\"iri\"}", "format 'iri'"},
        {"{\"$ref\":\"http://x/y.json\"}", "local JSON pointer"},
        {"{\"$ref\":\"#/$defs/missing\"}", "does not resolve"},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "backreferences"},
        {"{\"type\":\"number\",\"minimum\":0.5}", "not integers"},
        {"{\"type\":\"strin\"}", "unknown type"},
        {"{\"patternProperties\":{\"^a\":{}}}", "'patternProperties'"},
        {"{\"oneOf\":[{\"required\":[\"a\"]},{\"required\":[\"b\"]}]}", "'oneOf' whose branches may overlap"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kgr_grammar *g = NULL;
        kiln_status st = kgr_from_json_schema(cases[i][0], strlen(cases[i][0]), NULL, &g);
        KT_CHECKF(st != NULL, "%s should not compile", cases[i][0]);
        KT_CHECKF(strstr(kiln_status_msg(st), cases[i][1]) != NULL, "%s: %s", cases[i][0], kiln_status_msg(st));
        kiln_status_free(st);
    }
    /* pathological: deep nesting is refused, not a crash */
    char deep[8192] = "";
    for (int i = 0; i < 300; i++) strcat(deep, "{\"items\":");
    strcat(deep, "{}");
    for (int i = 0; i < 300; i++) strcat(deep, "}");
    kgr_grammar *g = NULL;
    kiln_status st = kgr_from_json_schema(deep, strlen(deep), NULL, &g);
    KT_CHECK(st != NULL);
    KT_CHECKF(strstr(kiln_status_msg(st), "deeper") != NULL, "%s", kiln_status_msg(st));
    kiln_status_free(st);
}

/* Llama 3.1's vocabulary: the mask and the matcher agree on every token. */
KT_TEST(schema_mask_real_tokenizer) {
    if (!kt_shared()) {
        kt_skip("../shared absent (the Llama-3.1 tokenizer)");
        return;
    }
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tokenizers/llama3_1", kt_shared());
    ktok *tok;
    KT_CHECK(ktok_load(dir, &tok) == NULL);
    int32_t eos = ktok_eos_id(tok), nv = ktok_vocab_size(tok);
    kgr_vocab *v;
    KT_CHECK(kgr_vocab_create(tok, nv, &eos, 1, &v) == NULL);
    const char *s = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"n\":{\"type\":\"integer\"}},"
                    "\"required\":[\"name\",\"n\"],\"additionalProperties\":false}";
    kgr_grammar *g;
    KT_CHECK(kgr_from_json_schema(s, strlen(s), NULL, &g) == NULL);
    kgr_index *ix;
    KT_CHECK(kgr_index_create(g, v, &ix) == NULL);
    uint32_t *bits = malloc(((size_t)nv + 31) / 32 * 4);
    const char *text = "{\"name\": \"Zo\u00eb\", \"n\": 12}";
    int32_t *ids;
    size_t n;
    KT_CHECK(ktok_encode(tok, text, strlen(text), false, &ids, &n) == NULL);
    kgr_matcher *m;
    KT_CHECK(kgr_matcher_create(ix, &m) == NULL);
    for (size_t i = 0; i <= n; i++) {
        KT_CHECK(kgr_matcher_mask(m, bits) == NULL);
        bool eos_ok = (bits[eos >> 5] >> (eos & 31)) & 1;
        KT_CHECKF(eos_ok == (i == n), "EOS allowed at token %zu of %zu", i, n);
        if (i == n) break;
        /* every 997th token: the bit says what a fresh matcher's accept says */
        for (int32_t t = 0; t < nv; t += 997) {
            if (t == eos) continue;
            kgr_matcher *c;
            KT_CHECK(kgr_matcher_create(ix, &c) == NULL);
            for (size_t j = 0; j < i; j++) KT_CHECK(kgr_matcher_accept(c, ids[j]) == NULL);
            kiln_status e = kgr_matcher_accept(c, t);
            bool bit = (bits[t >> 5] >> (t & 31)) & 1;
            KT_CHECKF(bit == (e == NULL), "token %d at %zu: mask %d, accept %d", t, i, bit, e == NULL);
            kiln_status_free(e);
            kgr_matcher_free(c);
            if (i > 3) t += 997 * 8; /* fewer checks deeper in */
        }
        KT_CHECKF((bits[ids[i] >> 5] >> (ids[i] & 31)) & 1, "token %d of the text is masked", (int)ids[i]);
        KT_CHECK(kgr_matcher_accept(m, ids[i]) == NULL);
    }
    KT_CHECK(kgr_matcher_accept(m, eos) == NULL);
    KT_CHECK(kgr_matcher_done(m));
    kgr_matcher_free(m);
    free(ids);
    free(bits);
    kgr_index_free(ix);
    kgr_grammar_free(g);
    kgr_vocab_free(v);
    ktok_free(tok);
}

/* ---- the session hook ---- */
static const char *piece(void *ud, int32_t id, size_t *len) {
    static char b[256][1];
    (void)ud;
    if (id >= 256) {
        *len = 0;
        return "";
    }
    b[id][0] = (char)id;
    *len = 1;
    return b[id];
}

static void logits_for(uint64_t *x, float *lg, int n) {
    for (int i = 0; i < n; i++) {
        *x = *x * 6364136223846793005ull + 1442695040888963407ull;
        lg[i] = (float)((*x >> 40) % 1000) / 100.0f;
    }
}

/* generates with params from a JSON body; returns the text (static) */
static kiln_status run(const char *body, uint64_t seed, const char *other, char *out, size_t cap) {
    kgr_vocab *gv = bytes_vocab();
    kgen_vocab v = {257, piece, NULL, NULL, gv};
    kgen_params p, q;
    KILN_TRY(kgen_params_init(&p));
    KILN_TRY(kgen_params_init(&q));
    cJSON *b = cJSON_Parse(body), *b2 = other ? cJSON_Parse(other) : NULL;
    kiln_status st = kgen_params_from_json(&p, b, NULL);
    if (!st && b2) st = kgen_params_from_json(&q, b2, NULL);
    int32_t eos = 256;
    kgen_session *g = NULL, *h = NULL;
    if (!st) st = kgen_session_create(&p, &v, 4096, &eos, 1, NULL, 0, &g);
    if (!st && b2) st = kgen_session_create(&q, &v, 4096, &eos, 1, NULL, 0, &h);
    float lg[257];
    uint64_t x = seed, y = seed * 7 + 1;
    size_t n = 0;
    kgen_finish f = KGEN_CONTINUE, fh = h ? KGEN_CONTINUE : KGEN_FINISH_EOS;
    while (!st && f == KGEN_CONTINUE) {
        if (fh == KGEN_CONTINUE) { /* a neighbour steps first */
            kgen_step s;
            logits_for(&y, lg, 257);
            st = kgen_session_step(h, lg, &s);
            fh = s.finish;
            if (st) break;
        }
        kgen_step s;
        logits_for(&x, lg, 257);
        st = kgen_session_step(g, lg, &s);
        if (st) break;
        if (n + s.text_len < cap) memcpy(out + n, s.text, s.text_len), n += s.text_len;
        f = s.finish;
    }
    out[n] = 0;
    if (!st && f != KGEN_FINISH_EOS && f != KGEN_FINISH_GRAMMAR) st = kiln_error(KILN_EINVAL, "finish %d", f);
    kgen_session_destroy(g);
    kgen_session_destroy(h);
    kgen_params_free(&p);
    kgen_params_free(&q);
    cJSON_Delete(b);
    cJSON_Delete(b2);
    kgr_vocab_free(gv);
    return st;
}

KT_TEST(schema_session_sampling) {
    static const char *const bodies[] = {
        "{\"temperature\": 1, \"seed\": %u, \"top_k\": 0, \"top_p\": 1, \"min_p\": 0, \"n_predict\": 200, \"guided_regex\": \"[a-c]{2,5}x\"}",
        "{\"temperature\": 1, \"seed\": %u, \"top_k\": 0, \"top_p\": 1, \"min_p\": 0, \"n_predict\": 400, \"response_format\": "
        "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"t\", \"schema\": {\"type\": \"object\", \"properties\": "
        "{\"k\": {\"enum\": [\"x\", \"y\"]}, \"n\": {\"type\": \"integer\", \"minimum\": 3, \"maximum\": 9}}, \"required\": [\"k\", \"n\"], "
        "\"additionalProperties\": false}}}}",
        "{\"temperature\": 1, \"seed\": %u, \"n_predict\": 50, \"structured_outputs\": {\"choice\": [\"yes\", \"no\"]}}",
    };
    const char *check[] = {"root ::= [a-c]{2,5} \"x\"", NULL, "root ::= \"yes\" | \"no\""};
    for (int k = 0; k < 3; k++)
        for (unsigned seed = 1; seed <= 20; seed++) {
            char body[1024], out[1024], out2[1024];
            const char *at = strstr(bodies[k], "%u"); /* the seed goes there */
            snprintf(body, sizeof body, "%.*s%u%s", (int)(at - bodies[k]), bodies[k], seed, at + 2);
            kiln_status st = run(body, seed, NULL, out, sizeof out);
            KT_CHECKF(!st, "%s: %s", body, kiln_status_msg(st));
            /* the output is in the language */
            if (check[k]) {
                kgr_grammar *g;
                KT_CHECK(kgr_from_gbnf(check[k], strlen(check[k]), &g) == NULL);
                kgr_vocab *v = bytes_vocab();
                kgr_matcher *m;
                KT_CHECK(kgr_matcher_create_owned(g, v, &m) == NULL);
                KT_CHECKF(kgr_matcher_accept_bytes(m, out, strlen(out)) && kgr_matcher_can_end(m), "'%s'", out);
                kgr_matcher_free(m);
                kgr_vocab_free(v);
            } else {
                cJSON *j = cJSON_Parse(out);
                KT_CHECKF(j != NULL, "not JSON: '%s'", out);
                const cJSON *n = cJSON_GetObjectItem(j, "n");
                KT_CHECKF(cJSON_IsNumber(n) && n->valuedouble >= 3 && n->valuedouble <= 9, "'%s'", out);
                cJSON_Delete(j);
            }
            /* beside an unconstrained neighbour: the same text */
            st = run(body, seed, "{\"temperature\": 1, \"seed\": 99, \"n_predict\": 30}", out2, sizeof out2);
            KT_CHECKF(!st, "%s", kiln_status_msg(st));
            KT_CHECKF(!strcmp(out, out2), "'%s' alone, '%s' beside another sequence", out, out2);
        }
}

KT_TEST(schema_request_errors) {
    static const char *const cases[][2] = {
        {"{\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": {\"type\": \"array\", \"uniqueItems\": true}}}}",
         "\"response_format\""},
        {"{\"response_format\": {\"type\": \"yaml\"}}", "\"response_format\""},
        {"{\"grammar\": \"root ::= [\"}", "\"grammar\""},
        {"{\"guided_regex\": \"(\"}", "\"guided_regex\""},
        {"{\"guided_choice\": []}", "\"guided_choice\""},
        {"{\"json_schema\": {\"type\": 1}}", "\"json_schema\""},
        {"{\"grammar\": \"root ::= \\\"a\\\"\", \"guided_regex\": \"a\"}", "only one"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kgen_params p;
        KT_CHECK(kgen_params_init(&p) == NULL);
        cJSON *b = cJSON_Parse(cases[i][0]);
        KT_CHECK(b != NULL);
        kiln_status st = kgen_params_from_json(&p, b, NULL);
        KT_CHECKF(st != NULL, "%s accepted", cases[i][0]);
        KT_CHECKF(strstr(kiln_status_msg(st), cases[i][1]) == kiln_status_msg(st) ||
                      (cases[i][1][0] != '"' && strstr(kiln_status_msg(st), cases[i][1])),
                  "%s: %s", cases[i][0], kiln_status_msg(st));
        kiln_status_free(st);
        cJSON_Delete(b);
        kgen_params_free(&p);
    }
    kgen_params p;
    KT_CHECK(kgen_params_init(&p) == NULL);
    cJSON *b = cJSON_Parse("{\"response_format\": {\"type\": \"text\"}}");
    KT_CHECK(kgen_params_from_json(&p, b, NULL) == NULL && p.grammar == NULL);
    cJSON_Delete(b);
    b = cJSON_Parse("{\"response_format\": {\"type\": \"json_object\"}}");
    KT_CHECK(kgen_params_from_json(&p, b, NULL) == NULL && p.grammar != NULL);
    cJSON_Delete(b);
    kgen_params_free(&p);
}

/* MaskBench texts: json.dumps of floats (repr) and exact ints */
static const char *as_float(void *ud, const cJSON *n, size_t *len) {
    (void)ud;
    (void)n;
    *len = 3;
    return "0.0";
}
static const char *as_int_text(void *ud, const cJSON *n, size_t *len) {
    (void)n;
    *len = strlen(ud);
    return ud;
}

KT_TEST(schema_json_dumps_floats) {
    cJSON *a = cJSON_Parse("[12345.0, 1e16, 1e15, 0.0001, 0.00001, 1.5e-7, 11.199999999999999, 3.14, -0.0, 1e300, "
                           "123456789012345678.0, 2.5e16, 100.0, -2.5]");
    char *s = kgr_json_dumps_lits(a, as_float, NULL);
    KT_CHECK(s && !strcmp(s, "[12345.0, 1e+16, 1000000000000000.0, 0.0001, 1e-05, 1.5e-07, 11.2, 3.14, -0.0, 1e+300, "
                             "1.2345678901234568e+17, 2.5e+16, 100.0, -2.5]"));
    free(s);
    s = kgr_json_dumps(a); /* without the literals: integral values as ints */
    KT_CHECK(s && !strncmp(s, "[12345, ", 8));
    free(s);
    cJSON_Delete(a);
    cJSON *b = cJSON_Parse("{\"id\": 12345678901234567890}");
    s = kgr_json_dumps_lits(b, as_int_text, "12345678901234567890"); /* ints exactly, past a double's digits */
    KT_CHECK(s && !strcmp(s, "{\"id\": 12345678901234567890}"));
    free(s);
    s = kgr_json_dumps_lits(b, as_int_text, "-0");
    KT_CHECK(s && !strcmp(s, "{\"id\": 0}"));
    free(s);
    cJSON_Delete(b);
}
