/* version.h: kiln's version (kiln --version, the server's /version). The
 * Makefile passes KILN_COMMIT (git describe) to the files that print it. */
#ifndef KILN_VERSION_H
#define KILN_VERSION_H

#define KILN_VERSION "0.1.0"
#ifndef KILN_COMMIT
#define KILN_COMMIT "unknown"
#endif

#endif
