// The tokenizer a training run used, recorded beside its data and its checkpoints: `data prepare`
// copies tokenizer.json (and tokenizer_config.json) into the shard directory, `tandem train` copies
// them from there into its checkpoint directory and records tokenizer.json's XXH3-64 in every
// checkpoint's metadata, and `tandem export` checks that hash before using the copy.
// Files, not checkpoint members: the export copies them as they are, and they stay readable.
#ifndef TD_TRAIN_TOK_RECORD_H
#define TD_TRAIN_TOK_RECORD_H

#include "base/status.h"

// The directory holding the tokenizer.json of `path` (a directory, or a tokenizer.json file) into
// dir (cap bytes). 0 when path is neither (for example a .gguf file).
int td_tok_record_dir(const char *path, char *dir, size_t cap);

// Copies src_dir/tokenizer.json (required) and src_dir/tokenizer_config.json (when present) into
// dst_dir (created if missing), each atomically; hex (17 bytes) gets tokenizer.json's XXH3-64 as
// 16 hex digits. Copying a directory onto itself only hashes.
td_status td_tok_record_copy(const char *src_dir, const char *dst_dir, char hex[17], td_err *err);

// Checks that dir/tokenizer.json exists and hashes to hex. TD_ERR_NOT_FOUND / TD_ERR_FORMAT with
// a message naming the file otherwise.
td_status td_tok_record_check(const char *dir, const char *hex, td_err *err);

#endif
