// Token shards: binary files of token ids for training, their writer, a verifying reader, and
// `data prepare` (text files -> documents -> encoder -> train/validation shard sets).
// Not here: batching and shuffling (loader.h), the tokenizer itself (an encoder callback is given).
//
// Shard file layout (little-endian, every field written explicitly; version 1):
//   0  "TDSHARD\0" magic (8)
//   8  u32 version (1)          12 u32 header bytes (64)
//   16 u32 token bytes (2 = uint16, used when vocab <= 65536; 4 = uint32)
//   20 u32 vocab size           24 u64 token count       32 u64 document count (separators)
//   40 u64 XXH3-64 of the payload                        48 u64 reserved (0)
//   56 u64 XXH3-64 of header bytes 0..55
//   64 payload: token count ids of token bytes each
//   end: "TDSHEND\0" (the completeness marker, written last)
// Documents are separated inside the token stream by the configured separator token (EOS after
// each document, or BOS before it); windows for training cross document boundaries.
#ifndef TD_TRAIN_SHARDS_H
#define TD_TRAIN_SHARDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tokenizer/tokenizer.h"

#define TD_SHARD_VERSION 1

// ---- writing one shard ----

// Writes `n` token ids (each < vocab_size) as one shard at `path`, atomically (path.tmp, fsync,
// rename). ndocs is informational (documents in the stream). TD_ERR_INVALID for an id out of range.
td_status td_shard_write(const char *path, int vocab_size, const int32_t *ids, size_t n,
                         uint64_t ndocs, td_err *err);

// ---- reading ----

typedef struct td_shard td_shard;

// Maps and verifies a shard: magic, version, header checksum, size, completeness marker and
// payload checksum. TD_ERR_FORMAT naming the problem (truncated, corrupt payload, ...). Free with
// td_shard_close. The shard is read-only and may be shared between threads.
td_status td_shard_open(const char *path, td_shard **out, td_err *err);
void td_shard_close(td_shard *s);
uint64_t td_shard_tokens(const td_shard *s);
uint64_t td_shard_docs(const td_shard *s);
int td_shard_vocab(const td_shard *s);
int td_shard_token_bytes(const td_shard *s);  // 2 or 4
// Copies tokens [start, start + n) as int32 into out; the range must lie inside the shard
// (TD_ASSERT: the loader computes ranges from the verified token count).
void td_shard_read(const td_shard *s, uint64_t start, size_t n, int32_t *out);

// ---- data prepare ----

// Encodes `len` bytes of UTF-8 text into out (out->n reset first; ids appended, grown as in
// tokenizer.h). td_tokenizer_encode has this shape; td_shard_encode_tokenizer adapts it.
typedef td_status (*td_shard_encode_fn)(void *ctx, const char *text, size_t len, td_tokens *out,
                                        td_err *err);
// ctx is a const td_tokenizer *; encodes without special tokens.
td_status td_shard_encode_tokenizer(void *ctx, const char *text, size_t len, td_tokens *out,
                                    td_err *err);

typedef enum td_shard_docs_mode {
    TD_SHARD_DOC_BLANK_LINE = 0,  // a blank line (two or more newlines) ends a document
    TD_SHARD_DOC_LINE,            // every non-empty line is a document
    TD_SHARD_DOC_FILE,            // every file is one document
} td_shard_docs_mode;

typedef enum td_shard_split_mode {
    TD_SHARD_SPLIT_DOCS = 0,  // each document goes to validation with probability val_fraction
                              // (a seeded hash of its index: deterministic, order-stable)
    TD_SHARD_SPLIT_TOKENS,    // a document goes to validation while validation holds fewer than
                              // val_fraction of the tokens so far (token-balanced, deterministic)
} td_shard_split_mode;

typedef struct td_shard_prepare_params {
    const char *out_dir;  // created if missing; files <name>-train-000000.tdsh, -val-...
    const char *name;     // file name stem (default "data")
    int vocab_size;       // ids must be below it; decides uint16 vs uint32
    int32_t sep_id;       // separator token id (EOS or BOS); -1 = none
    bool sep_before;      // false: sep after each document (EOS); true: before (BOS)
    td_shard_docs_mode docs;
    td_shard_split_mode split;
    double val_fraction;        // 0..1 (0: no validation shards)
    uint64_t seed;              // for TD_SHARD_SPLIT_DOCS
    uint64_t shard_tokens;      // tokens per shard file (default 1 << 26)
    td_shard_encode_fn encode;  // must be thread-safe when n_threads > 1 (td_tokenizer is)
    void *encode_ctx;
    int n_threads;  // encoder threads; <= 1 encodes on the caller's thread. The
                    // output does not depend on it (documents are routed in order).
} td_shard_prepare_params;

td_shard_prepare_params td_shard_prepare_default_params(void);

typedef struct td_shard_prepare_stats {
    uint64_t docs[2], tokens[2];  // [0] train, [1] validation
    int shards[2];                // files written
    uint64_t bytes_in;            // text bytes read
} td_shard_prepare_stats;

// Reads the files in order, splits them into documents, encodes each, routes it to train or
// validation and writes the shards. stats may be NULL. On error the shards already written stay
// (each is complete) and err names the file.
td_status td_shard_prepare(const td_shard_prepare_params *p, const char *const *files, int nfiles,
                           td_shard_prepare_stats *stats, td_err *err);

#endif
