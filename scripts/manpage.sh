#!/bin/bash
# manpage.sh KILN: a man page (roff) made of `kiln --help` and every
# command's --help, so it says what the binary does. make install uses it.
set -euo pipefail
kiln=${1:?usage: manpage.sh PATH/TO/kiln}
esc() { sed -e 's/\\/\\e/g' -e 's/^\./\\\&./' -e "s/^'/\\\\\\&'/"; }
echo ".TH KILN 1 \"$(date -u +%Y-%m-%d)\" \"$("$kiln" --version | esc)\" \"User Commands\""
echo ".SH NAME"
echo "kiln \\- LLM inference engine: generate, chat, serve, quantize, inspect models"
echo ".SH SYNOPSIS"
echo ".B kiln"
echo "\\fICOMMAND\\fR [\\fIoptions\\fR]"
echo ".SH DESCRIPTION"
echo ".nf"
"$kiln" --help | esc
echo ".fi"
for cmd in $("$kiln" --help | awk '/^commands:/{on=1; next} on && /^  [a-z]/{print $1} on && /^$/{exit}'); do
    echo ".SH \"KILN ${cmd^^}\""
    echo ".nf"
    "$kiln" "$cmd" --help | esc
    echo ".fi"
done
echo ".SH FILES"
echo "The bundled demo model: PREFIX/share/kiln/models/kiln-demo (\$KILN_DEFAULT_MODEL overrides it)."
