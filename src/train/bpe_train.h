// Byte-level BPE training (GPT-2 / Llama 3 style): pre-tokenize text with a regex (PCRE2, UTF+UCP),
// count words, learn merges by pair frequency, and write a Hugging Face tokenizer.json plus
// tokenizer_config.json that HF `tokenizers` and td_tokenizer load and encode identically.
// Not here: encoding (tokenizer/tokenizer.h), SentencePiece/Unigram/WordPiece training.
//
// The training rule (an independent Python reimplementation checks it,
// tests/reference/bpe_train_ref.py):
//  - base vocabulary: the 256 bytes as GPT-2's bytes_to_unicode characters, ids in code-point order
//    of those characters (the order of GPT-2's own vocabulary: '!'=0 ... then the remapped bytes);
//  - every adjacent symbol pair in every word counts with the word's frequency (overlapping
//    occurrences too: "aaa" counts (a,a) twice);
//  - each step merges the pair with the highest count; ties go to the smallest (left id, right id);
//    the merge is applied left to right without overlap in every word; the new symbol takes the
//    next id unless a symbol with the same bytes already exists (then that id is reused, as HF
//    does);
//  - training stops when the vocabulary (symbols + special tokens) reaches vocab_size, when no pair
//    is left, or when the best count is below min_frequency;
//  - special tokens follow the learned symbols (ids contiguous after the last merge), as
//  added_tokens.
// Input text is UTF-8; an invalid byte is replaced by U+FFFD before pre-tokenization. Special
// token strings in the training text are not split out (they are pre-tokenized like other text).
#ifndef TD_TRAIN_BPE_TRAIN_H
#define TD_TRAIN_BPE_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

// The Llama 3 pre-tokenizer regex (GPT-2's with case-insensitive contractions, 1-3 digit numbers).
extern const char *const TD_BPE_LLAMA3_PATTERN;

#define TD_BPE_MAX_SPECIAL 64

typedef struct td_bpe_params {
    int vocab_size;               // tokens, including the 256 bytes and the special tokens
    int64_t min_frequency;        // stop when the best pair occurs fewer times (default 2)
    const char *pattern;          // pre-tokenizer regex; NULL = TD_BPE_LLAMA3_PATTERN
    const char *bos, *eos, *pad;  // special tokens for these roles; NULL = none
    const char *special[TD_BPE_MAX_SPECIAL];  // further special tokens, in id order
    int n_special;
    bool add_bos;          // post-processor prepends bos (needs bos)
    int model_max_length;  // tokens, written to tokenizer_config.json
} td_bpe_params;

// vocab_size 4096, min_frequency 2, Llama 3 pattern, bos "<|bos|>", eos "<|eos|>", no pad,
// add_bos true, model_max_length 2048. Strings are static.
td_bpe_params td_bpe_default_params(void);

// The trainer owns its word counts and learned merges; strings in params are copied.
typedef struct td_bpe_trainer td_bpe_trainer;

td_status td_bpe_trainer_new(const td_bpe_params *p, td_bpe_trainer **out, td_err *err);
void td_bpe_trainer_free(td_bpe_trainer *t);

// Pre-tokenizes text (len bytes; need not be NUL-terminated) and adds its words to the counts.
// May be called many times (once per file or document) before td_bpe_train.
td_status td_bpe_feed(td_bpe_trainer *t, const char *text, size_t len, td_err *err);

// Learns the merges. Call once, after feeding.
td_status td_bpe_train(td_bpe_trainer *t, td_err *err);

// Counts after training (for logs and tests).
int td_bpe_vocab_size(const td_bpe_trainer *t);  // symbols + special tokens
int td_bpe_merge_count(const td_bpe_trainer *t);
size_t td_bpe_word_count(const td_bpe_trainer *t);  // distinct pre-tokenized words

// Writes dir/tokenizer.json and dir/tokenizer_config.json (atomically each; dir created if
// missing).
td_status td_bpe_write(const td_bpe_trainer *t, const char *dir, td_err *err);

#endif
