/* webui.c: the browser chat page `kiln serve` answers at / (webui/index.html,
 * style.css, app.js), embedded in the binary at build time by the assembler's
 * .incbin, so it needs no tool beyond gcc and nothing from the network.
 * The Makefile makes this object depend on the files. */
#include <string.h>

#include "server/server_int.h"

/* the Makefile gives the absolute path; else the build runs at the root */
#ifndef KSRV_WEBUI_DIR
#define KSRV_WEBUI_DIR "src/server/webui"
#endif

/* KSRV_ASSET(sym, file): sym_start .. sym_end hold the file's bytes. */
#define KSRV_ASSET(sym, file)                                                                                          \
    __asm__(".pushsection .rodata\n"                                                                                   \
            ".balign 16\n"                                                                                             \
            ".type " #sym "_start, @object\n" #sym "_start:\n"                                                         \
            ".incbin \"" KSRV_WEBUI_DIR "/" file "\"\n" #sym "_end:\n"                                                 \
            ".byte 0\n"                                                                                                \
            ".popsection\n");                                                                                          \
    extern const char sym##_start[], sym##_end[]

KSRV_ASSET(ksrv_webui_html, "index.html");
KSRV_ASSET(ksrv_webui_css, "style.css");
KSRV_ASSET(ksrv_webui_js, "app.js");

bool ksrv_webui_asset(const char *url, const char **data, size_t *len, const char **ctype) {
    static const struct {
        const char *url, *ctype, *start, *end;
    } t[] = {
        {"/", "text/html; charset=utf-8", ksrv_webui_html_start, ksrv_webui_html_end},
        {"/index.html", "text/html; charset=utf-8", ksrv_webui_html_start, ksrv_webui_html_end},
        {"/webui/style.css", "text/css; charset=utf-8", ksrv_webui_css_start, ksrv_webui_css_end},
        {"/webui/app.js", "text/javascript; charset=utf-8", ksrv_webui_js_start, ksrv_webui_js_end},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(url, t[i].url)) {
            *data = t[i].start;
            *len = (size_t)(t[i].end - t[i].start);
            *ctype = t[i].ctype;
            return true;
        }
    return false;
}
