/* kvdisk.h: a bounded on-disk store of checksummed blobs (prefix kvd_), the
 * disk tier of the prefix cache (engine.h, ke_ctx_params.cache_dir); the same
 * format at an explicit path is meant for explicit saves (llama-server's
 * /slots/{id}?action=save, which kiln does not serve yet).
 *
 * A blob lives in DIR/<16 hex digits of its key>.kvb as
 *   "KILNKVD1" | u64 payload length (little endian) | payload | SHA-256 of the
 *   preceding bytes
 * written to a temporary file in DIR and renamed over the name, so a reader
 * sees a whole file or none. A file that is absent, truncated, of the wrong
 * length, with another magic or a checksum that does not match is a miss
 * (the bad file is removed), never an error. The store keeps an index of its
 * files (scanned at open, oldest modification first) and removes the least
 * recently used ones when a write would take it past its size bound; a hit
 * touches the file, so the order survives a restart. What the payload means
 * (and whether it belongs to the reader's model) is the caller's business.
 *
 * Not thread-safe: one owner (the engine context) calls it. */
#ifndef KILN_KVDISK_H
#define KILN_KVDISK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct kvd_store kvd_store;

typedef struct {
    const void *p;
    size_t n;
} kvd_seg;

typedef struct {
    int64_t files, bytes;     /* now */
    int64_t hits, misses;     /* kvd_get */
    int64_t bad;              /* files found corrupt, truncated or of another format (removed) */
    int64_t writes, write_errors, evictions;
} kvd_stats;

/* Opens (creating it if absent, one level) the directory dir, bounded to
 * max_bytes (> 0). Errors: dir is not a directory or cannot be created. */
kiln_status kvd_open(const char *dir, int64_t max_bytes, kvd_store **out);
void kvd_close(kvd_store *d); /* NULL is fine */
/* Whether the index holds key; *payload_len (may be NULL) its payload's length. */
bool kvd_has(const kvd_store *d, uint64_t key, size_t *payload_len);
/* Writes the concatenated segments as key's blob (replacing it), removing
 * least recently used files to stay within the bound; false (counted) when
 * it cannot be written or is larger than the bound. */
bool kvd_put(kvd_store *d, uint64_t key, const kvd_seg *segs, int n);
/* Reads key's payload into a malloc'ed *out of *len bytes; false when it is
 * absent or bad (see above). */
bool kvd_get(kvd_store *d, uint64_t key, void **out, size_t *len);
void kvd_get_stats(const kvd_store *d, kvd_stats *out);

/* The same file format at an explicit path (explicit saves): written atomically
 * (temporary file beside it, then rename); read with the same checks, which
 * fail with a KILN_EINVAL error naming the path and the problem. */
kiln_status kvd_write_file(const char *path, const kvd_seg *segs, int n, size_t *bytes_written);
kiln_status kvd_read_file(const char *path, void **out, size_t *len);

#endif
