/* kvdisk.h: the prefix cache's bounded store of blobs (prefix kvd_): a RAM
 * tier (engine.h, ke_ctx_params.state_cache_bytes, --cache-ram) over an
 * optional disk tier of checksummed files (ke_ctx_params.cache_dir); the
 * same file format at an explicit path serves explicit saves (llama-server's
 * /slots/{id}?action=save).
 *
 * RAM tier: kvd_put keeps a copy of the blob in memory while it fits the RAM
 * bound (kvd_set_ram; 0, the default, keeps nothing there), moving the least
 * recently used blobs to disk (or dropping them, without a disk tier) to make
 * room; a blob larger than the bound goes straight to disk. A blob lives in
 * one tier at a time: putting it in RAM removes its file. The RAM tier is
 * trusted memory (no checksum); kvd_close moves what it holds to disk.
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
    /* the RAM tier */
    int64_t ram_blobs, ram_bytes; /* now (payload bytes) */
    int64_t ram_hits;             /* kvd_get answered from RAM */
    int64_t ram_writes, ram_spills, ram_drops; /* kvd_put into RAM; moved to disk; dropped (no disk tier) */
} kvd_stats;

/* Opens (creating it if absent, one level) the directory dir, bounded to
 * max_bytes (> 0). Errors: dir is not a directory or cannot be created.
 * dir NULL: a store with the RAM tier only (max_bytes unused). */
kiln_status kvd_open(const char *dir, int64_t max_bytes, kvd_store **out);
void kvd_close(kvd_store *d); /* NULL is fine */
/* Bounds the RAM tier to max_bytes of payload (<= 0: nothing), moving the
 * least recently used blobs out until it fits. */
void kvd_set_ram(kvd_store *d, int64_t max_bytes);
bool kvd_has_disk(const kvd_store *d); /* opened with a directory */
/* Whether either tier holds key; *payload_len (may be NULL) its payload's length. */
bool kvd_has(const kvd_store *d, uint64_t key, size_t *payload_len);
/* Writes the concatenated segments as key's blob (replacing it), removing
 * least recently used files to stay within the bound; false (counted) when
 * it cannot be written or is larger than the bound. */
bool kvd_put(kvd_store *d, uint64_t key, const kvd_seg *segs, int n);
/* Reads key's payload into a malloc'ed *out of *len bytes; false when it is
 * absent or bad (see above). From the RAM tier (*from_ram true; may be NULL)
 * with take the blob leaves the store (the caller gets its buffer, no copy);
 * a file stays either way. */
bool kvd_get(kvd_store *d, uint64_t key, bool take, void **out, size_t *len, bool *from_ram);
void kvd_get_stats(const kvd_store *d, kvd_stats *out);

/* The same file format at an explicit path (explicit saves): written atomically
 * (temporary file beside it, then rename); read with the same checks, which
 * fail with a KILN_EINVAL error naming the path and the problem. */
kiln_status kvd_write_file(const char *path, const kvd_seg *segs, int n, size_t *bytes_written);
kiln_status kvd_read_file(const char *path, void **out, size_t *len);

#endif
