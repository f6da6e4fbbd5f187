/* hub.h: Hugging Face Hub downloads into the Hugging Face cache.
 *
 * khub_pull fetches a model repository's files (GET {endpoint}/api/models/
 * {repo}/revision/{rev} for the file list and commit, {endpoint}/{repo}/
 * resolve/{commit}/{file} for each file, redirects followed) into the layout
 * huggingface_hub writes (file_download.py), so either tool reuses the
 * other's files:
 *   {cache}/models--ORG--NAME/blobs/{etag}             the file's bytes
 *   {cache}/models--ORG--NAME/blobs/{etag}.incomplete  a partial download
 *   {cache}/models--ORG--NAME/snapshots/{commit}/{file} -> ../../blobs/{etag}
 *   {cache}/models--ORG--NAME/refs/{rev}               the commit, no newline
 *   {cache}/.locks/models--ORG--NAME/{etag}.lock       flock while writing
 * The etag is X-Linked-Etag (the sha256 of an LFS file) or ETag (the git
 * blob sha1 of a small one); a download is checked against it before it
 * enters blobs/, and resumes from an .incomplete file with an HTTP Range.
 * The cache is $HF_HUB_CACHE, $HUGGINGFACE_HUB_CACHE, $HF_HOME/hub,
 * $XDG_CACHE_HOME/huggingface/hub or ~/.cache/huggingface/hub, in that order;
 * the endpoint $HF_ENDPOINT or https://huggingface.co; the token $HF_TOKEN or
 * the file $HF_TOKEN_PATH ($HF_HOME/token), as huggingface_hub reads them. */
#ifndef KILN_HUB_H
#define KILN_HUB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct {
    const char *endpoint; /* NULL: $HF_ENDPOINT or https://huggingface.co */
    const char *cache;    /* NULL: khub_cache_dir() */
    const char *token;    /* NULL: $HF_TOKEN or the token file; "" none */
    /* fnmatch globs on the repository path ("*.safetensors", "sub/"): a file
     * is fetched when it matches an include (none given: khub_default_include)
     * and no exclude; a glob ending in '/' means everything under it. */
    const char *const *include;
    int n_include;
    const char *const *exclude;
    int n_exclude;
    /* called as bytes arrive (done of total, total -1 when unknown) and once
     * with done == total when a file is in place; NULL: silent. Files download
     * in parallel: calls come from the workers' threads, one at a time. */
    void (*progress)(void *ctx, const char *file, int64_t done, int64_t total);
    void *progress_ctx;
    int workers; /* files fetched at once; 0: KHUB_WORKERS */
    /* NULL, or a folder that receives the files themselves (hard links to
     * the cache's blobs where the file system allows, else copies), as
     * `hf download --local-dir` gives them: what tools that want a plain
     * folder read; out then names this folder */
    const char *local_dir;
} khub_opts;

/* huggingface_hub's default max_workers */
#define KHUB_WORKERS 8

/* The globs fetched by default: weights, configs, tokenizer, chat template;
 * and those left out when no include is given (second copies of the weights
 * in other layouts: consolidated*.safetensors, original/, onnx/, ...). */
extern const char *const khub_default_include[];
extern const int khub_n_default_include;
extern const char *const khub_default_exclude[];
extern const int khub_n_default_exclude;

/* The cache folder (not created). */
kiln_status khub_cache_dir(char *buf, size_t cap);

/* True when s reads as ORG/NAME[@REVISION] (one '/', no "..", no leading '/'
 * or '.'); it says nothing about whether the repository exists. */
bool khub_is_repo_id(const char *s);

/* The cached snapshot folder of ORG/NAME[@REVISION] (revision main when
 * absent; a branch or tag through refs/, a full commit directly), without
 * the network. cache NULL: khub_cache_dir(). */
kiln_status khub_resolve(const char *spec, const char *cache, char *out, size_t cap);

/* Downloads ORG/NAME[@REVISION]; out receives the snapshot folder. Files
 * already in the cache are not fetched again. */
kiln_status khub_pull(const char *spec, const khub_opts *o, char *out, size_t cap);

#endif
