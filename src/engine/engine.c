// The serving engine's step loop (see engine.h). One engine thread owns the forward, the pool, the
// scheduler, every request once it has left the inbox, and the KV imports; server threads only
// touch the inbox, cancel flags, the command queue and the stats snapshot, all under one mutex.
// Sink callbacks run on the engine thread without the mutex held. Commands are applied between
// steps (docs/engine.md, "The command queue").
#include "engine/engine.h"

#include "base/rng.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "base/log.h"
#include "engine/kv_pool.h"
#include "engine/sampler.h"
#include "engine/sched.h"
#include "engine/stop.h"
#include "grammar/grammar.h"
#include "jinja/jinja.h"
#include "kernels/kernels.h"
#include "model/forward.h"
#include "tokenizer/chat_template.h"

#define SEQ_SHIFT 6  // seq id = request slot << SEQ_SHIFT | choice (TD_ENG_MAX_N == 1 << SEQ_SHIFT)
#define TEXT_CAP (1 << 16)
#define MAX_LOGPROBS 20
#define MAX_IMPORTS 256                      // KV imports pending at once
#define N_ENDED 32                           // recently ended imports remembered for messages
#define IDLE_TICK_NS (200 * 1000000LL)       // the idle engine thread wakes at least this often

typedef struct echoice {
    td_rng rng;
    td_stop *stop;
    td_detok *detok;
    td_gmatch *gm;  // NULL: unconstrained; else the choice's grammar state (allocated at submit)
    int generated;  // tokens sampled
    bool in_sched;  // a live scheduler sequence
    bool finished;
} echoice;

typedef struct ereq {
    struct ereq *next, *prev;  // the `all` list (under mu): from submit to on_done
    struct ereq *qnext;        // engine-thread lists: pending FCFS queue
    uint64_t handle;
    td_gen_request g;  // copy; its pointers stay the server's
    td_gen_sink sink;
    td_sampling_params sp;
    td_logit_bias *bias;  // [g.n_logit_bias]
    td_grammar *grammar;  // g.grammar compiled (one reference), or NULL
    int slot;             // request slot (seq ids), -1 until added to the scheduler
    int n_open;           // choices not finished
    bool cancelled;       // set under mu by cancel
    bool seen_cancel;     // engine thread acted on it
    bool forked;          // first sample done (children forked)
    bool scheduled;       // choice 0 was in a step (admitted at least once)
    bool want_prompt_lp;
    int prompt_lp_next;   // next prompt position whose logprob event is owed (0: the first token)
    int completion_tokens, cached_tokens;
    echoice ch[];         // [g.n]
} ereq;

typedef struct emb_slot {  // an embedding input in flight (cmd_embed)
    int input;  // index in the command
    int len;    // tokens
    int done;   // tokens through the forward so far
    int take;   // tokens in the current forward
    int nb;     // blocks held (row a of e->tables)
} emb_slot;

typedef struct entry_meta {  // per step entry: where its logits rows are, what it was
    uint64_t seq;
    bool needs_logits;
    int last_pos;
    int row0, n_rows;
    bool lp;       // prompt logprob events are owed by this entry's request (choice 0 prefill)
    int lp_first;  // first position p whose row is a prompt-logprob row (predicts p + 1); -1 none
} entry_meta;

// A command: engine-owned from submit to release (the caller's td_eng_cmd is copied; IMPORT_BEGIN's
// tokens and results live in the same allocation). Every state change is under mu.
typedef enum cmd_state { CMD_QUEUED, CMD_RUNNING, CMD_PARKED, CMD_DONE } cmd_state;
struct td_eng_ticket {
    struct td_eng_ticket *next, *prev;  // e->tickets: every ticket not yet freed
    struct td_eng_ticket *qnext;        // e->cmd_head queue (QUEUED), or e->drains (PARKED DRAIN)
    td_eng_cmd c;                       // the copy; out fields are filled here by the engine thread
    int32_t *tokens;                    // IMPORT_BEGIN: [n_blocks * block_size] the full blocks' ids;
                                        //   EMBED: [offsets[n_inputs]] the inputs' ids
    int32_t *blocks;                    // IMPORT_BEGIN results: [n_blocks]
    size_t *offsets;                    //   [n_blocks, n_layers, 2]
    int *emb_offs;                      // EMBED: [n_inputs + 1] the inputs' offsets into tokens
    float *emb;                         // EMBED results: [n_inputs, dim]
    bool detached;                      // EMBED from td_eng_embed: no waiter; on completion the
    td_embed_sink sink;                 //   results go to user_out, then sink.on_done, then the
    float *user_out;                    //   engine thread frees the ticket
    cmd_state state;
    bool released;  // the caller let go: whoever moves it to (or finds it in) CMD_DONE frees it
    td_status st;
    char msg[TD_ERR_MSG_MAX];
};

// A pending KV import: blocks reserved (one reference each, held by the import, not by a sequence)
// until TRANSFER_DONE enters them into the prefix cache or the lease ends.
typedef struct eimport {
    struct eimport *next;
    uint64_t id, version;
    int n_blocks;
    int lease_ms;
    int64_t deadline_ns;  // CLOCK_MONOTONIC
    int32_t *blocks;      // [n_blocks]
    int32_t *tokens;      // [n_blocks * block_size]
} eimport;

struct td_eng {
    td_eng_params p;
    char *model_name, *chat_src;
    const td_model *m;
    const td_tokenizer *tok;
    td_jinja_template *tmpl;
    char tmpl_err[256];
    int vocab, max_ctx, kv_dim, n_layers;
    int32_t eos[TD_MAX_EOS + 1];
    int n_eos;
    int64_t created;

    td_backend *be;  // the one backend the forward and the KV pool share (owned)
    td_forward *fwd;
    td_kv_pool *pool;
    td_sched *sched;
    td_sampler *smp;
    td_grammar_cache *gcache;  // compiled grammars by text (thread-safe)
    td_gvocab *gvocab;         // the vocabulary as grammar matchers see it (engine thread only)

    // step scratch, sized at create
    int32_t *b_tok, *b_pos, *b_seq;  // [max_batched_tokens]
    uint8_t *b_want;                 // [max_batched_tokens]
    int32_t *tables;                 // [max_seqs, table_stride] flat block tables of the step
    int table_stride;                // blocks per sequence at max_model_len
    td_kv_layer *kvl;                // [n_layers]
    entry_meta *meta;                // [max_seqs]
    float *logits;                   // [max_batched_tokens, vocab]
    float *scratch;                  // [vocab]
    char *text;                      // [TEXT_CAP + TD_STOP_MAX_LEN]
    char *tail;                      // [TEXT_CAP + 2 * TD_STOP_MAX_LEN]
    int32_t *top_ids;                // [MAX_LOGPROBS]
    float *top_lps;
    // embeddings (TD_ENG_CMD_EMBED), sized at create
    int dim;                         // floats per embedding (the model's hidden size)
    float *hidden;                   // [max_batched_tokens, dim] final hidden rows of one forward
    double *emb_acc;                 // [max_seqs, dim] pooled sums of the inputs in flight
    struct emb_slot *emb_act;        // [max_seqs] those inputs of the head EMBED
    int32_t *emb_tables;             // [max_seqs, table_stride] their blocks (row a: slot a)
    td_kv_layer *emb_kvl;            // [n_layers] the pool's layers read through emb_tables
    int emb_nact, emb_next, emb_finished;  // the head EMBED: inputs in flight, next to enter, done
    struct td_eng_ticket *emb_head, *emb_tail;  // EMBEDs applied, run one forward per loop (FIFO)

    // request slots (engine thread)
    ereq **slots;  // [n_req_slots]
    int *free_slots, n_free_slots, n_req_slots;
    int sched_seqs, sched_cap;  // scheduler sequences in use / available
    ereq *pend_head, *pend_tail;

    // shared (mu)
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    bool th_started, quit;
    ereq *all;       // every live request
    ereq *inbox_head, *inbox_tail;
    int n_live, n_inbox, n_pending;
    uint64_t next_handle, n_cancel_req, n_aborted;
    td_sched_stats sst;
    td_eng_debug dbg;
    uint64_t seed_ctr;

    // commands: the queue, the ticket list and the flags below under mu; the rest engine thread
    pthread_cond_t cmd_cv;                // broadcast when a command completes
    struct td_eng_ticket *cmd_head, *cmd_tail;
    struct td_eng_ticket *tickets;
    struct td_eng_ticket *drains, *drains_tail;  // DRAINs applied, waiting for idleness (FIFO)
    bool draining;                        // (mu) submissions refused
    bool weights_ok;                      // (mu; engine thread writes) false after a failed update
    char weights_msg[TD_ERR_MSG_MAX];     // (mu) why, for submissions and failed requests
    uint64_t weights_version;             // engine thread (written under mu too, for snapshots)
    uint64_t n_commands;
    eimport *imports;
    int n_imports, n_import_blocks;
    uint64_t next_import;
    struct {
        uint64_t id;
        const char *why;
        int lease_ms;
    } ended[N_ENDED];                     // ring of recently ended imports
    int n_ended;
};

td_eng_params td_eng_default_params(void) {
    return (td_eng_params){.kv_cache_fraction = 0.25,
                           .block_size = 16,
                           .max_batched_tokens = 512,
                           .max_seqs = 32,
                           .max_waiting = 256,
                           .max_queue = 4096,
                           .enable_prefix_cache = true,
                           .device = -1};
}

// ---- helpers

static size_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// pthread_cond_timedwait until a CLOCK_MONOTONIC instant (every cond var here uses that clock).
static void cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t t_ns) {
    struct timespec ts = {.tv_sec = (time_t)(t_ns / 1000000000LL), .tv_nsec = (long)(t_ns % 1000000000LL)};
    pthread_cond_timedwait(cv, mu, &ts);
}

static bool is_eos(const td_eng *e, int32_t t) {
    for (int i = 0; i < e->n_eos; i++)
        if (e->eos[i] == t) return true;
    return false;
}


static void req_free(ereq *r) {
    if (!r) return;
    for (int j = 0; j < r->g.n; j++) {
        td_stop_free(r->ch[j].stop);
        td_detok_free(r->ch[j].detok);
        td_gmatch_free(r->ch[j].gm);
    }
    td_grammar_unref(r->grammar);
    free(r->bias);
    free(r);
}

// ---- submit / cancel / stats (any thread)

td_status td_eng_submit(td_eng *e, const td_gen_request *g, const td_gen_sink *sink, td_engine_handle *h,
                        td_err *err) {
    if (!e || !g || !sink || !sink->on_token || !sink->on_finish || !sink->on_done)
        return td_err_set(err, TD_ERR_INVALID, "engine: no request or sink");
    if (g->n < 1 || g->n > TD_ENG_MAX_N)
        return td_err_set(err, TD_ERR_INVALID, "n must be in [1, %d], got %d", TD_ENG_MAX_N, g->n);
    if (g->n_prompt < 1 || !g->prompt) return td_err_set(err, TD_ERR_INVALID, "the prompt is empty");
    if (g->n_prompt >= e->max_ctx)
        return td_err_set(err, TD_ERR_INVALID,
                          "the prompt has %d tokens; this model's maximum context length is %d tokens", g->n_prompt,
                          e->max_ctx);
    if (g->max_tokens < 1) return td_err_set(err, TD_ERR_INVALID, "max_tokens must be >= 1");
    for (int i = 0; i < g->n_prompt; i++)
        if (g->prompt[i] < 0 || g->prompt[i] >= e->vocab)
            return td_err_set(err, TD_ERR_INVALID, "prompt token %d at position %d is outside the vocabulary (%d)",
                              g->prompt[i], i, e->vocab);
    if (g->logprobs > MAX_LOGPROBS || g->prompt_logprobs > MAX_LOGPROBS)
        return td_err_set(err, TD_ERR_INVALID, "logprobs must be <= %d", MAX_LOGPROBS);
    if (g->n_logit_bias < 0 || (g->n_logit_bias > 0 && !g->logit_bias))
        return td_err_set(err, TD_ERR_INVALID, "bad logit_bias");
    if (g->prompt_logprobs >= 0 && g->n_prompt > e->p.max_batched_tokens * 64)
        return td_err_set(err, TD_ERR_INVALID, "prompt too long for prompt logprobs");

    ereq *r = calloc(1, sizeof *r + (size_t)g->n * sizeof(echoice));
    if (!r) return td_err_set(err, TD_ERR_NOMEM, "engine: out of memory");
    r->g = *g;
    r->sink = *sink;
    r->slot = -1;
    r->n_open = g->n;
    r->want_prompt_lp = g->prompt_logprobs >= 0;
    td_sampling_params *sp = &r->sp;
    *sp = td_sampling_default_params();
    sp->temperature = g->temperature;
    sp->top_k = g->top_k;
    sp->top_p = g->top_p;
    sp->min_p = g->min_p;
    sp->repetition_penalty = g->repetition_penalty;
    sp->presence_penalty = g->presence_penalty;
    sp->frequency_penalty = g->frequency_penalty;
    if (g->n_logit_bias > 0) {
        r->bias = malloc((size_t)g->n_logit_bias * sizeof *r->bias);
        if (!r->bias) {
            req_free(r);
            return td_err_set(err, TD_ERR_NOMEM, "engine: out of memory");
        }
        for (int i = 0; i < g->n_logit_bias; i++)
            r->bias[i] = (td_logit_bias){g->logit_bias[i].token, g->logit_bias[i].bias};
        sp->logit_bias = r->bias;
        sp->n_logit_bias = g->n_logit_bias;
    }
    td_status st = td_sampling_params_check(sp, e->vocab, err);
    if (st) {
        req_free(r);
        return st;
    }
    if (g->grammar) {
        if (!e->gcache || !e->gvocab) {
            req_free(r);
            return td_err_set(err, TD_ERR_NOMEM, "engine: structured output is unavailable (out of memory at start)");
        }
        r->grammar = td_grammar_cache_get(e->gcache, g->grammar, err);
        if (!r->grammar) {
            req_free(r);
            return err ? err->status : TD_ERR_INVALID;
        }
    }
    uint64_t base_seed;
    pthread_mutex_lock(&e->mu);
    base_seed = g->has_seed ? g->seed : td_mix64(++e->seed_ctr ^ (uint64_t)time(NULL) << 20);
    pthread_mutex_unlock(&e->mu);
    for (int j = 0; j < g->n; j++) {
        // Choice j's stream depends only on (seed, j): reproducible whatever else runs.
        td_rng_seed(&r->ch[j].rng, j == 0 ? base_seed : td_mix64(base_seed ^ td_mix64((uint64_t)j)));
        r->ch[j].stop = td_stop_create(g->stop, NULL, g->n_stop, err);
        r->ch[j].detok = td_detok_new(e->tok, true);
        if (r->grammar && r->ch[j].stop && r->ch[j].detok) {
            r->ch[j].gm = td_gmatch_create(r->grammar, e->gvocab, err);
            if (!r->ch[j].gm) {
                req_free(r);
                return err ? err->status : TD_ERR_NOMEM;
            }
        }
        if (!r->ch[j].stop || !r->ch[j].detok) {
            bool stop_err = !r->ch[j].stop;
            req_free(r);
            return stop_err ? (err ? err->status : TD_ERR_INVALID)
                            : td_err_set(err, TD_ERR_NOMEM, "engine: out of memory");
        }
    }

    pthread_mutex_lock(&e->mu);
    if (e->quit) {
        pthread_mutex_unlock(&e->mu);
        req_free(r);
        return td_err_set(err, TD_ERR_LIMIT, "engine: shutting down");
    }
    if (e->n_live >= e->p.max_queue) {
        pthread_mutex_unlock(&e->mu);
        req_free(r);
        return td_err_set(err, TD_ERR_LIMIT, "engine: %d requests queued, try again later", e->p.max_queue);
    }
    if (e->draining || !e->weights_ok) {
        td_status st = e->draining ? td_err_set(err, TD_ERR_LIMIT, "engine: draining: not accepting new requests")
                                   : td_err_set(err, TD_ERR_LIMIT, "%s", e->weights_msg);
        pthread_mutex_unlock(&e->mu);
        req_free(r);
        return st;
    }
    r->handle = ++e->next_handle;
    h->v = r->handle;
    r->next = e->all;
    if (e->all) e->all->prev = r;
    e->all = r;
    e->n_live++;
    if (e->inbox_tail)
        e->inbox_tail->qnext = r;
    else
        e->inbox_head = r;
    e->inbox_tail = r;
    e->n_inbox++;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return TD_OK;
}

void td_eng_cancel(td_eng *e, td_engine_handle h) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    for (ereq *r = e->all; r; r = r->next)
        if (r->handle == h.v && !r->cancelled) {
            r->cancelled = true;
            e->n_cancel_req++;
            pthread_cond_signal(&e->cv);
            break;
        }
    pthread_mutex_unlock(&e->mu);
}

void td_eng_stats(td_eng *e, td_engine_stats *o) {
    memset(o, 0, sizeof *o);
    pthread_mutex_lock(&e->mu);
    o->num_running = e->sst.n_running;
    o->num_waiting = e->sst.n_waiting + e->n_pending + e->n_inbox;
    o->kv_cache_usage = e->sst.kv_usage;
    o->prefix_cache_queries = e->sst.prefix_queries;
    o->prefix_cache_hits = e->sst.prefix_hits;
    o->num_preemptions = e->sst.n_preemptions;
    o->num_aborted = e->n_aborted;
    pthread_mutex_unlock(&e->mu);
}

void td_eng_info(td_eng *e, td_engine_info *o) {
    o->model_name = e->model_name;
    o->max_model_len = e->max_ctx;
    o->vocab_size = e->vocab;
    o->created = e->created;
    o->embed_dim = e->dim;
    o->embed_pooling = e->p.pooling == TD_ENG_POOL_MEAN ? "mean" : "last";
    o->embed_normalized = !e->p.embed_no_normalize;
}

void td_eng_debug_get(td_eng *e, td_eng_debug *o) {
    pthread_mutex_lock(&e->mu);
    *o = e->dbg;
    o->n_live = e->n_live;
    pthread_mutex_unlock(&e->mu);
}

// ---- engine thread: request lifecycle

static uint64_t seq_of(const ereq *r, int j) { return ((uint64_t)r->slot << SEQ_SHIFT) | (uint64_t)j; }

// Ends the request: every choice must be finished. Removes it from `all` first so that a late
// cancel cannot touch it, then on_done, then frees.
static void req_done(td_eng *e, ereq *r, td_status st, const char *msg) {
    if (r->slot >= 0) {
        e->slots[r->slot] = NULL;
        e->free_slots[e->n_free_slots++] = r->slot;
        e->sched_seqs -= r->g.n;
        r->slot = -1;
    }
    pthread_mutex_lock(&e->mu);
    if (r->prev)
        r->prev->next = r->next;
    else
        e->all = r->next;
    if (r->next) r->next->prev = r->prev;
    e->n_live--;
    if (r->seen_cancel) e->n_aborted++;
    pthread_mutex_unlock(&e->mu);
    td_gen_usage u = {.prompt_tokens = r->g.n_prompt,
                      .completion_tokens = r->completion_tokens,
                      .cached_tokens = r->cached_tokens};
    r->sink.on_done(r->sink.ctx, &u, st, msg);
    req_free(r);
}

// Finishes choice j: the scheduler sequence ends (finish caches its blocks, abort does not).
static void choice_finish(td_eng *e, ereq *r, int j, td_finish_reason why, const char *tail, size_t tail_len) {
    echoice *c = &r->ch[j];
    if (c->finished) return;
    if (c->in_sched) {
        if (why == TD_FINISH_ABORT)
            td_sched_cancel(e->sched, seq_of(r, j));
        else
            td_sched_finish(e->sched, seq_of(r, j));
        c->in_sched = false;
    }
    c->finished = true;
    r->n_open--;
    r->sink.on_finish(r->sink.ctx, j, why, tail ? tail : "", tail ? tail_len : 0);
}

// Aborts every open choice and ends the request with status st.
static void req_abort(td_eng *e, ereq *r, td_status st, const char *msg) {
    for (int j = 0; j < r->g.n; j++) choice_finish(e, r, j, TD_FINISH_ABORT, NULL, 0);
    req_done(e, r, st, msg);
}

// Adds choice 0 of a pending request to the scheduler. Returns false when it must wait (no room).
static bool req_admit(td_eng *e, ereq *r) {
    if (e->n_free_slots == 0 || e->sched_seqs + r->g.n > e->sched_cap) return false;
    r->slot = e->free_slots[--e->n_free_slots];
    e->slots[r->slot] = r;
    e->sched_seqs += r->g.n;
    td_err err = {0};
    td_status st = td_sched_add(e->sched, seq_of(r, 0), r->g.prompt, r->g.n_prompt, r->g.max_tokens, &err);
    if (st == TD_ERR_LIMIT && strstr(err.msg, "queue full")) {  // retry later
        e->slots[r->slot] = NULL;
        e->free_slots[e->n_free_slots++] = r->slot;
        e->sched_seqs -= r->g.n;
        r->slot = -1;
        return false;
    }
    if (st) {
        req_done(e, r, st, err.msg);
        return true;
    }
    r->ch[0].in_sched = true;
    if (r->want_prompt_lp) td_sched_set_no_prefix_hit(e->sched, seq_of(r, 0), true);
    return true;
}

// ---- engine thread: tokens and events

// row: raw logits for raw logprobs (NULL: none). plp: instead, the processed logprob of tok from the
// td_sampler_logprob call just made on e->smp (its kept set gives the alternatives).
static void emit_token(td_eng *e, ereq *r, int index, bool prompt, int32_t tok, const char *text, size_t len,
                       const float *row, int k, const double *plp) {
    td_top_logprob top[MAX_LOGPROBS];
    td_gen_token t = {.index = index,
                      .prompt = prompt,
                      .token = tok,
                      .text = text ? text : "",
                      .text_len = len,
                      .weights_version = e->weights_version};
    if (plp) {
        t.has_logprob = true;
        t.logprob = (float)*plp;
        if (k > 0) {
            int n = td_sampler_logprob_topk(e->smp, k, e->top_ids, e->top_lps);
            for (int i = 0; i < n; i++) top[i] = (td_top_logprob){e->top_ids[i], e->top_lps[i]};
            t.top = top;
            t.n_top = n;
        }
    } else if (row) {
        double lse = td_logsumexp(row, e->vocab);
        t.has_logprob = true;
        t.logprob = (float)((double)row[tok] - lse);
        if (k > 0) {
            td_logprobs_topk(row, e->vocab, lse, k, e->top_ids, e->top_lps);
            for (int i = 0; i < k; i++) top[i] = (td_top_logprob){e->top_ids[i], e->top_lps[i]};
            t.top = top;
            t.n_top = k;
        }
    }
    r->sink.on_token(r->sink.ctx, &t);
}

// Feeds text through choice c's stop matcher in chunks, appending what may be emitted to out
// (capacity cap). Returns the bytes written; *stopped as td_stop_feed.
static size_t stop_feed_all(echoice *c, const char *s, size_t n, char *out, size_t cap, bool *stopped) {
    size_t o = 0;
    *stopped = false;
    const size_t hold = td_stop_max_hold(c->stop);
    while (n > 0 && !*stopped) {
        size_t piece = n < TEXT_CAP ? n : TEXT_CAP;
        if (o + piece + hold > cap) break;  // bounded output: the rest is dropped (absurdly long token)
        size_t k = td_stop_feed(c->stop, s, piece, out + o, cap - o, stopped, NULL);
        if (k == (size_t)-1) break;
        o += k;
        s += piece;
        n -= piece;
    }
    return o;
}

// Releases the held-back text of choice c at a length/EOS finish: the detokenizer's tail through
// the stop matcher, then the matcher's tail. *why becomes STOP if a stop string completes there.
static size_t final_tail(echoice *c, char *out, size_t cap, td_finish_reason *why) {
    size_t dl = 0;
    const char *d = td_detok_flush(c->detok, &dl);
    bool stopped = false;
    size_t o = d ? stop_feed_all(c, d, dl, out, cap - TD_STOP_MAX_LEN, &stopped) : 0;
    if (stopped) {
        *why = TD_FINISH_STOP;
        return o;
    }
    return o + td_stop_flush(c->stop, out + o, cap - o);
}

static bool mask_empty(const uint32_t *m, int vocab) {
    for (int w = 0; w < (vocab + 31) / 32; w++)
        if (m[w]) return false;
    return true;
}

// Samples the next token of choice j from its logits row and handles it: event, finish or append.
// Returns false when the whole request ended (r is freed).
static bool choice_sample(td_eng *e, ereq *r, int j, const float *row) {
    echoice *c = &r->ch[j];
    const td_seq *q = td_sched_get(e->sched, seq_of(r, j));
    TD_ASSERT(q != NULL);
    td_sampling_params sp = r->sp;
    if (c->gm) {  // structured output: only tokens that keep the output matchable; EOS where complete
        td_err gerr = {0};
        sp.allow = td_gmatch_mask(c->gm, !r->g.ignore_eos, &gerr);
        if (!sp.allow) {
            req_abort(e, r, gerr.status, gerr.msg);
            return false;
        }
        if (mask_empty(sp.allow, e->vocab)) {
            if (!td_gmatch_complete(c->gm)) {
                req_abort(e, r, TD_ERR_INVALID, "grammar: no token of the vocabulary can continue the output");
                return false;
            }
            td_finish_reason why = TD_FINISH_STOP;  // complete, nothing may follow (ignore_eos)
            size_t tl = final_tail(c, e->tail, TEXT_CAP + 2 * TD_STOP_MAX_LEN, &why);
            choice_finish(e, r, j, TD_FINISH_STOP, e->tail, tl);
            return true;
        }
    }
    memcpy(e->scratch, row, (size_t)e->vocab * sizeof(float));  // the sampler processes its copy in place
    int32_t tok = td_sampler_sample(e->smp, &sp, e->scratch, q->tokens, q->n_prompt, q->tokens + q->n_prompt,
                                    q->n_tokens - q->n_prompt, &c->rng);
    if (c->gm && !td_gmatch_accept(c->gm, tok)) {  // cannot happen: tok was allowed
        req_abort(e, r, TD_ERR_LIMIT, "grammar: the matcher could not advance (too ambiguous)");
        return false;
    }
    // Processed mode: the same raw row and history (the token is not appended yet).
    double plp_v = 0;
    const double *plp = NULL;
    if (r->g.logprobs >= 0 && r->g.logprobs_processed) {
        plp_v = td_sampler_logprob(e->smp, &sp, row, q->tokens, q->n_prompt, q->tokens + q->n_prompt,
                                   q->n_tokens - q->n_prompt, tok, NULL);
        plp = &plp_v;
    }
    c->generated++;
    r->completion_tokens++;
    const float *lp_row = r->g.logprobs >= 0 && !plp ? row : NULL;
    bool stop_tok = !r->g.ignore_eos && is_eos(e, tok);
    for (int i = 0; i < r->g.n_stop_token_ids && !stop_tok; i++) stop_tok = r->g.stop_token_ids[i] == tok;
    if (stop_tok) {  // the token is reported, its text is not (as vLLM)
        emit_token(e, r, j, false, tok, "", 0, lp_row, r->g.logprobs, plp);
        td_finish_reason why = TD_FINISH_STOP;
        size_t tl = final_tail(c, e->tail, TEXT_CAP + 2 * TD_STOP_MAX_LEN, &why);
        choice_finish(e, r, j, TD_FINISH_STOP, e->tail, tl);
        return true;
    }
    size_t pl = 0;
    const char *piece = td_detok_push(c->detok, tok, &pl);
    bool stopped = false;
    size_t n = piece ? stop_feed_all(c, piece, pl, e->text, TEXT_CAP + TD_STOP_MAX_LEN, &stopped) : 0;
    emit_token(e, r, j, false, tok, e->text, n, lp_row, r->g.logprobs, plp);
    if (stopped) {
        choice_finish(e, r, j, TD_FINISH_STOP, NULL, 0);
        return true;
    }
    if (c->gm && td_gmatch_done(c->gm)) {  // the grammar is complete and nothing can follow: stop now
        td_finish_reason why = TD_FINISH_STOP;
        size_t tl = final_tail(c, e->tail, TEXT_CAP + 2 * TD_STOP_MAX_LEN, &why);
        choice_finish(e, r, j, TD_FINISH_STOP, e->tail, tl);
        return true;
    }
    if (c->generated >= r->g.max_tokens || q->n_tokens + 1 >= q->capacity || q->n_tokens + 1 >= e->max_ctx) {
        td_finish_reason why = TD_FINISH_LENGTH;
        size_t tl = final_tail(c, e->tail, TEXT_CAP + 2 * TD_STOP_MAX_LEN, &why);
        choice_finish(e, r, j, why, e->tail, tl);
        return true;
    }
    td_err err = {0};
    td_status st = td_sched_append_token(e->sched, seq_of(r, j), tok, &err);
    TD_ASSERT(st == TD_OK);
    return true;
}

// The first logits of a request: fork the other choices off choice 0, then sample each.
static void req_first_sample(td_eng *e, ereq *r, const float *row) {
    r->forked = true;
    for (int j = 1; j < r->g.n; j++) {
        td_err err = {0};
        td_status st = td_sched_fork(e->sched, seq_of(r, 0), seq_of(r, j), &err);
        if (st) {  // cannot happen: slots were reserved at admission; end the request cleanly
            TD_LOGE("engine: fork failed: %s", err.msg);
            req_abort(e, r, st, err.msg);
            return;
        }
        r->ch[j].in_sched = true;
    }
    for (int j = 0; j < r->g.n; j++)
        if (!choice_sample(e, r, j, row)) return;
}

// ---- engine thread: the step

static void snapshot(td_eng *e) {
    td_sched_stats st;
    td_sched_stats_get(e->sched, &st);
    pthread_mutex_lock(&e->mu);
    e->sst = st;
    e->dbg.n_blocks = st.n_blocks;
    e->dbg.n_blocks_free = st.n_blocks_free;
    e->dbg.n_blocks_evictable = st.n_blocks_evictable;
    e->dbg.n_blocks_used = st.n_blocks_used;
    e->dbg.weights_version = e->weights_version;
    e->dbg.weights_ok = e->weights_ok;
    e->dbg.draining = e->draining;
    e->dbg.n_imports = e->n_imports;
    pthread_mutex_unlock(&e->mu);
}

// Runs one scheduler step and its forward. Returns false when nothing ran.
static bool step(td_eng *e) {
    td_sched_out out;
    td_sched_step(e->sched, &out);
    // Forks' block copies first: the forward may read (and then extend) the copied blocks.
    td_kv_pool_run_copies(e->pool, out.copies, out.n_copies);
    if (out.n_entries == 0) return false;
    const int V = e->vocab;
    int T = 0, rows = 0;
    for (int i = 0; i < out.n_entries; i++) {
        const td_sched_entry *en = &out.entries[i];
        ereq *r = e->slots[en->seq_id >> SEQ_SHIFT];
        const int j = (int)(en->seq_id & (TD_ENG_MAX_N - 1));
        entry_meta *mt = &e->meta[i];
        mt->row0 = rows;
        mt->lp_first = -1;
        if (j == 0 && !r->scheduled) {  // usage counts the first admission's prefix-cache hit
            r->cached_tokens = en->n_cached_tokens;
            r->scheduled = true;
        }
        // Prompt logprobs: the row at position p predicts prompt token p + 1.
        const int lp_from = r->prompt_lp_next > 1 ? r->prompt_lp_next - 1 : 0;  // first position wanted
        const bool lp = r->want_prompt_lp && j == 0 && en->is_prefill && r->prompt_lp_next < r->g.n_prompt;
        mt->lp = lp;
        TD_ASSERT(en->table.n_blocks <= e->table_stride);
        memcpy(e->tables + (size_t)i * e->table_stride, en->table.ids, (size_t)en->table.n_blocks * sizeof(int32_t));
        for (int t = 0; t < en->n_tokens; t++, T++) {
            const int p = en->start_pos + t;
            e->b_tok[T] = en->tokens[t];
            e->b_pos[T] = p;
            e->b_seq[T] = i;
            bool w = (en->needs_logits && t == en->n_tokens - 1) || (lp && p >= lp_from && p + 1 < r->g.n_prompt);
            if (lp && p >= lp_from && p + 1 < r->g.n_prompt && mt->lp_first < 0) mt->lp_first = p;
            e->b_want[T] = w;
            rows += w;
        }
        mt->n_rows = rows - mt->row0;
    }
    TD_ASSERT(T == out.n_tokens && T <= e->p.max_batched_tokens && rows <= e->p.max_batched_tokens);
    // Take what is needed from the entries now: finishing, appending or cancelling a sequence
    // invalidates the scheduler's output arrays.
    const int n_entries = out.n_entries;
    for (int i = 0; i < n_entries; i++) {
        const td_sched_entry *en = &out.entries[i];
        e->meta[i].seq = en->seq_id;
        e->meta[i].needs_logits = en->needs_logits;
        e->meta[i].last_pos = en->start_pos + en->n_tokens - 1;
    }
    td_batch b = {.n_tokens = T, .tokens = e->b_tok, .pos = e->b_pos, .seq_id = e->b_seq, .want_logits = e->b_want};
    td_err err = {0};
    td_status st = td_forward_run_kv(e->fwd, &b, e->kvl, e->logits, &err);
    pthread_mutex_lock(&e->mu);
    e->dbg.n_steps++;
    e->dbg.n_batch_tokens += (uint64_t)T;
    pthread_mutex_unlock(&e->mu);
    if (st) {  // cancel every request of this step (td_sched_cancel caches nothing)
        TD_LOGE("engine: forward failed: %s", err.msg);
        for (int i = 0; i < n_entries; i++) {
            ereq *r = e->slots[e->meta[i].seq >> SEQ_SHIFT];
            if (r) req_abort(e, r, st, err.msg);
        }
        return true;
    }
    for (int i = 0; i < n_entries; i++) {
        const entry_meta *mt = &e->meta[i];
        ereq *r = e->slots[mt->seq >> SEQ_SHIFT];
        if (!r) continue;  // ended earlier in this loop
        const int j = (int)(mt->seq & (TD_ENG_MAX_N - 1));
        int row = mt->row0;
        if (mt->lp && r->prompt_lp_next == 0) {  // the first prompt token has no logprob
            emit_token(e, r, -1, true, r->g.prompt[0], NULL, 0, NULL, 0, NULL);
            r->prompt_lp_next = 1;
        }
        if (mt->lp_first >= 0) {
            int k = r->g.prompt_logprobs;
            for (int p = mt->lp_first; p + 1 < r->g.n_prompt && p <= mt->last_pos; p++, row++) {
                if (p + 1 != r->prompt_lp_next) continue;  // cannot happen: rows are in order
                emit_token(e, r, -1, true, r->g.prompt[p + 1], NULL, 0, e->logits + (size_t)row * V, k, NULL);
                r->prompt_lp_next++;
            }
        }
        if (!mt->needs_logits) continue;
        const float *lrow = e->logits + (size_t)(mt->row0 + mt->n_rows - 1) * V;
        if (!r->forked)
            req_first_sample(e, r, lrow);
        else
            choice_sample(e, r, j, lrow);
        if (e->slots[mt->seq >> SEQ_SHIFT] == r && r->n_open == 0) req_done(e, r, TD_OK, NULL);
    }
    return true;
}

// ---- commands (docs/engine.md, "The command queue")

static const char *cmd_name(td_eng_cmd_type t) {
    switch (t) {
    case TD_ENG_CMD_SET_WEIGHTS: return "SET_WEIGHTS";
    case TD_ENG_CMD_IMPORT_BEGIN: return "IMPORT_BEGIN";
    case TD_ENG_CMD_TRANSFER_DONE: return "TRANSFER_DONE";
    case TD_ENG_CMD_DRAIN: return "DRAIN";
    case TD_ENG_CMD_RESUME: return "RESUME";
    case TD_ENG_CMD_REPORT_STATE: return "REPORT_STATE";
    case TD_ENG_CMD_EMBED: return "EMBED";
    }
    return "unknown command";
}

static bool on_engine_thread(const td_eng *e) { return e->th_started && pthread_equal(pthread_self(), e->th); }

// Unlinks t from the ticket list and frees it (mu held).
static void ticket_free_locked(td_eng *e, td_eng_ticket *t) {
    if (t->prev)
        t->prev->next = t->next;
    else
        e->tickets = t->next;
    if (t->next) t->next->prev = t->prev;
    free(t);
}

// Checks and queues a command; sink non-NULL: a detached EMBED (td_eng_embed) whose results go to
// user_out. *out receives the ticket (also for a detached one, which the caller must not touch).
static td_status cmd_queue(td_eng *e, const td_eng_cmd *cmd, const td_embed_sink *sink, float *user_out,
                           td_eng_ticket **out, td_err *err) {
    const int bs = e->p.block_size, L = e->n_layers;
    int nb = 0;         // IMPORT_BEGIN: blocks to reserve
    size_t n_emb = 0;   // EMBED: tokens
    switch (cmd->type) {
    case TD_ENG_CMD_SET_WEIGHTS:
        if (!cmd->set_weights.get) return td_err_set(err, TD_ERR_INVALID, "engine: SET_WEIGHTS without a source");
        break;
    case TD_ENG_CMD_IMPORT_BEGIN: {
        const int n = cmd->import.n_tokens;
        if (!cmd->import.tokens || n < bs)
            return td_err_set(err, TD_ERR_INVALID, "engine: IMPORT_BEGIN needs at least one full block (%d tokens), got %d",
                              bs, n);
        if (n > e->max_ctx)
            return td_err_set(err, TD_ERR_INVALID, "engine: IMPORT_BEGIN of %d tokens: max_model_len is %d", n, e->max_ctx);
        if (cmd->import.lease_ms <= 0)
            return td_err_set(err, TD_ERR_INVALID, "engine: IMPORT_BEGIN needs a lease (lease_ms > 0)");
        nb = n / bs;
        for (int i = 0; i < nb * bs; i++)
            if (cmd->import.tokens[i] < 0 || cmd->import.tokens[i] >= e->vocab)
                return td_err_set(err, TD_ERR_INVALID, "engine: IMPORT_BEGIN: token %d at position %d is outside the vocabulary (%d)",
                                  cmd->import.tokens[i], i, e->vocab);
        break;
    }
    case TD_ENG_CMD_EMBED: {
        const int n = cmd->embed.n_inputs;
        const int *off = cmd->embed.offsets;
        if (n < 1 || n > (1 << 20) || !off || !cmd->embed.tokens || off[0] != 0)
            return td_err_set(err, TD_ERR_INVALID, "engine: EMBED needs 1 to 2^20 inputs, with offsets from 0 and tokens");
        for (int i = 0; i < n; i++) {
            const int len = off[i + 1] - off[i];
            if (len < 1 || len > e->max_ctx)
                return td_err_set(err, TD_ERR_INVALID,
                                  "engine: EMBED input %d has %d tokens; each needs 1 to %d (max_model_len)", i,
                                  off[i + 1] - off[i], e->max_ctx);
            for (int k = off[i]; k < off[i + 1]; k++)
                if (cmd->embed.tokens[k] < 0 || cmd->embed.tokens[k] >= e->vocab)
                    return td_err_set(err, TD_ERR_INVALID,
                                      "engine: EMBED input %d: token %d at position %d is outside the vocabulary (%d)", i,
                                      cmd->embed.tokens[k], k - off[i], e->vocab);
        }
        n_emb = (size_t)off[n];
        break;
    }
    case TD_ENG_CMD_TRANSFER_DONE:
    case TD_ENG_CMD_DRAIN:
    case TD_ENG_CMD_RESUME:
    case TD_ENG_CMD_REPORT_STATE: break;
    default: return td_err_set(err, TD_ERR_INVALID, "engine: unknown command type %d", (int)cmd->type);
    }
    // One allocation: the ticket, then IMPORT_BEGIN's offsets, blocks and tokens, or EMBED's
    // results, offsets and tokens.
    const size_t n_off = (size_t)nb * (size_t)L * 2;
    const size_t n_in = cmd->type == TD_ENG_CMD_EMBED ? (size_t)cmd->embed.n_inputs : 0;
    const size_t sz = sizeof(td_eng_ticket) + n_off * sizeof(size_t) + (size_t)nb * sizeof(int32_t) +
                      (size_t)nb * (size_t)bs * sizeof(int32_t) + n_in * (size_t)e->dim * sizeof(float) +
                      (n_in ? n_in + 1 : 0) * sizeof(int) + n_emb * sizeof(int32_t);
    td_eng_ticket *t = calloc(1, sz);
    if (!t) return td_err_set(err, TD_ERR_NOMEM, "engine: out of memory");
    t->c = *cmd;
    if (cmd->type == TD_ENG_CMD_EMBED) {
        t->emb = (float *)(t + 1);
        t->emb_offs = (int *)(t->emb + n_in * (size_t)e->dim);
        t->tokens = (int32_t *)(t->emb_offs + n_in + 1);
        memcpy(t->emb_offs, cmd->embed.offsets, (n_in + 1) * sizeof(int));
        memcpy(t->tokens, cmd->embed.tokens, n_emb * sizeof(int32_t));
        t->c.embed.tokens = t->tokens;
        t->c.embed.offsets = t->emb_offs;
        t->c.embed.out = NULL;
        if (sink) {
            t->detached = true;
            t->sink = *sink;
            t->user_out = user_out;
        }
    }
    if (cmd->type == TD_ENG_CMD_IMPORT_BEGIN) {
        t->offsets = (size_t *)(t + 1);
        t->blocks = (int32_t *)(t->offsets + n_off);
        t->tokens = t->blocks + nb;
        memcpy(t->tokens, cmd->import.tokens, (size_t)nb * (size_t)bs * sizeof(int32_t));
        t->c.import.tokens = t->tokens;  // never the caller's pointers from here on
        t->c.import.blocks = NULL;
        t->c.import.offsets = NULL;
    }
    t->state = CMD_QUEUED;
    pthread_mutex_lock(&e->mu);
    if (e->quit) {
        pthread_mutex_unlock(&e->mu);
        free(t);
        return td_err_set(err, TD_ERR_LIMIT, "engine: shutting down");
    }
    t->next = e->tickets;
    if (e->tickets) e->tickets->prev = t;
    e->tickets = t;
    if (e->cmd_tail)
        e->cmd_tail->qnext = t;
    else
        e->cmd_head = t;
    e->cmd_tail = t;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    *out = t;
    return TD_OK;
}

td_status td_eng_cmd_submit(td_eng *e, const td_eng_cmd *cmd, td_eng_ticket **out, td_err *err) {
    if (out) *out = NULL;
    if (!e || !cmd || !out) return td_err_set(err, TD_ERR_INVALID, "engine: command: no engine, command or ticket");
    return cmd_queue(e, cmd, NULL, NULL, out, err);
}

td_status td_eng_embed(td_eng *e, const td_embed_request *req, const td_embed_sink *sink, td_err *err) {
    if (!e || !req || !sink || !sink->on_done || !req->out)
        return td_err_set(err, TD_ERR_INVALID, "engine: embed: no engine, request, output or sink");
    td_eng_cmd c = {.type = TD_ENG_CMD_EMBED};
    c.embed.tokens = req->tokens;
    c.embed.offsets = req->offsets;
    c.embed.n_inputs = req->n_inputs;
    td_eng_ticket *t;  // detached: the engine thread frees it
    return cmd_queue(e, &c, sink, req->out, &t, err);
}

// Copies a completed command's out fields into the caller's struct (mu held).
static void cmd_copy_out(const td_eng *e, const td_eng_ticket *t, td_eng_cmd *dst) {
    const td_eng_cmd *c = &t->c;
    switch (c->type) {
    case TD_ENG_CMD_SET_WEIGHTS: dst->set_weights.version = c->set_weights.version; break;
    case TD_ENG_CMD_IMPORT_BEGIN: {
        const int nb = c->import.n_blocks;
        dst->import.import_id = c->import.import_id;
        dst->import.n_blocks = nb;
        dst->import.buffer = c->import.buffer;
        dst->import.block_bytes = c->import.block_bytes;
        dst->import.dtype = c->import.dtype;
        if (dst->import.blocks && nb) memcpy(dst->import.blocks, t->blocks, (size_t)nb * sizeof(int32_t));
        if (dst->import.offsets && nb)
            memcpy(dst->import.offsets, t->offsets, (size_t)nb * (size_t)e->n_layers * 2 * sizeof(size_t));
        break;
    }
    case TD_ENG_CMD_TRANSFER_DONE: dst->transfer_done.n_cached_tokens = c->transfer_done.n_cached_tokens; break;
    case TD_ENG_CMD_REPORT_STATE: dst->state = c->state; break;
    case TD_ENG_CMD_EMBED:
        dst->embed.dim = c->embed.dim;
        dst->embed.n_tokens = c->embed.n_tokens;
        if (dst->embed.out && t->st == TD_OK)
            memcpy(dst->embed.out, t->emb, (size_t)c->embed.n_inputs * (size_t)e->dim * sizeof(float));
        break;
    default: break;
    }
}

td_status td_eng_cmd_wait(td_eng *e, td_eng_ticket *t, td_eng_cmd *cmd, int timeout_ms, bool *done, td_err *err) {
    bool dummy;
    if (!done) done = &dummy;
    *done = false;
    if (!e || !t) return td_err_set(err, TD_ERR_INVALID, "engine: command wait: no engine or ticket");
    if (timeout_ms < 0) timeout_ms = 0;
    if (timeout_ms > 0 && on_engine_thread(e))
        return td_err_set(err, TD_ERR_INVALID, "engine: the engine thread may only poll commands (timeout 0)");
    const int64_t deadline = now_ns() + (int64_t)timeout_ms * 1000000LL;
    pthread_mutex_lock(&e->mu);
    while (t->state != CMD_DONE && now_ns() < deadline) cond_wait_until(&e->cmd_cv, &e->mu, deadline);
    if (t->state != CMD_DONE) {
        const char *what = t->state == CMD_QUEUED ? "queued" : "being applied";
        td_eng_cmd_type ty = t->c.type;
        pthread_mutex_unlock(&e->mu);
        return td_err_set(err, TD_ERR_TIMEOUT, "engine: %s not completed within %d ms (still %s)", cmd_name(ty),
                          timeout_ms, what);
    }
    if (cmd) cmd_copy_out(e, t, cmd);
    td_status st = t->st;
    if (st) td_err_set(err, st, "%s", t->msg);
    pthread_mutex_unlock(&e->mu);
    *done = true;
    return st;
}

// Releases t; returns the state it was in (QUEUED: cancelled, never runs).
static cmd_state ticket_release(td_eng *e, td_eng_ticket *t) {
    pthread_mutex_lock(&e->mu);
    cmd_state was = t->state;
    if (was == CMD_QUEUED) {
        td_eng_ticket **pp = &e->cmd_head, *prev = NULL;
        while (*pp && *pp != t) prev = *pp, pp = &(*pp)->qnext;
        TD_ASSERT(*pp == t);
        *pp = t->qnext;
        if (e->cmd_tail == t) e->cmd_tail = prev;
        ticket_free_locked(e, t);
    } else if (was == CMD_DONE) {
        ticket_free_locked(e, t);
    } else {
        t->released = true;  // the engine thread frees it when it completes
    }
    pthread_mutex_unlock(&e->mu);
    return was;
}

void td_eng_cmd_release(td_eng *e, td_eng_ticket *t) {
    if (e && t) ticket_release(e, t);
}

td_status td_eng_command(td_eng *e, td_eng_cmd *cmd, int timeout_ms, td_err *err) {
    if (!e || !cmd) return td_err_set(err, TD_ERR_INVALID, "engine: command: no engine or command");
    if (timeout_ms <= 0) return td_err_set(err, TD_ERR_INVALID, "engine: %s: timeout_ms must be > 0", cmd_name(cmd->type));
    if (on_engine_thread(e))
        return td_err_set(err, TD_ERR_INVALID,
                          "engine: td_eng_command called on the engine thread (use td_eng_cmd_submit from callbacks)");
    td_eng_ticket *t = NULL;
    td_status st = td_eng_cmd_submit(e, cmd, &t, err);
    if (st) return st;
    bool done = false;
    st = td_eng_cmd_wait(e, t, cmd, timeout_ms, &done, err);
    if (done) {
        ticket_release(e, t);
        return st;
    }
    // The deadline passed: a queued command is taken back; a running one completes unobserved
    // (or, when it completed just now, its result is used after all).
    pthread_mutex_lock(&e->mu);
    if (t->state == CMD_DONE) {
        cmd_copy_out(e, t, cmd);
        st = t->st;
        if (st) td_err_set(err, st, "%s", t->msg);
        pthread_mutex_unlock(&e->mu);
        ticket_release(e, t);
        return st;
    }
    pthread_mutex_unlock(&e->mu);
    cmd_state was = ticket_release(e, t);
    return td_err_set(err, TD_ERR_TIMEOUT, "engine: %s timed out after %d ms: %s", cmd_name(cmd->type), timeout_ms,
                      was == CMD_QUEUED ? "cancelled before it ran (nothing changed)"
                                        : "it is being applied; its result will be discarded");
}

// Engine thread: the command is complete; wake waiters, free it if nobody waits any more.
static void cmd_complete(td_eng *e, td_eng_ticket *t, td_status st, const char *msg) {
    if (t->detached) {  // td_eng_embed: nobody waits; the sink hears of it, then the ticket goes
        if (st == TD_OK)
            memcpy(t->user_out, t->emb, (size_t)t->c.embed.n_inputs * (size_t)e->dim * sizeof(float));
        t->sink.on_done(t->sink.ctx, st, st ? (msg && *msg ? msg : td_status_name(st)) : NULL);
        pthread_mutex_lock(&e->mu);
        ticket_free_locked(e, t);
        pthread_mutex_unlock(&e->mu);
        return;
    }
    pthread_mutex_lock(&e->mu);
    t->st = st;
    snprintf(t->msg, sizeof t->msg, "%s", st && msg ? msg : "");
    t->state = CMD_DONE;
    if (t->released) ticket_free_locked(e, t);
    pthread_cond_broadcast(&e->cmd_cv);
    pthread_mutex_unlock(&e->mu);
}

static void state_fill(td_eng *e, td_eng_state *o) {
    td_sched_stats st;
    td_sched_stats_get(e->sched, &st);
    memset(o, 0, sizeof *o);
    pthread_mutex_lock(&e->mu);
    o->weights_ok = e->weights_ok;
    o->draining = e->draining;
    o->n_live = e->n_live;
    o->n_steps = e->dbg.n_steps;
    pthread_mutex_unlock(&e->mu);
    o->weights_version = e->weights_version;
    o->n_running = st.n_running;
    o->n_waiting = st.n_waiting;
    o->n_blocks = st.n_blocks;
    o->n_blocks_free = st.n_blocks_free;
    o->n_blocks_evictable = st.n_blocks_evictable;
    o->n_blocks_used = st.n_blocks_used;
    o->n_imports = e->n_imports;
    o->n_import_blocks = e->n_import_blocks;
    o->n_commands = e->n_commands;
}

// Ends an import: its references are dropped last to first (as a sequence releases its blocks),
// so blocks it cached become evictable and the others free; remembered for later messages.
static void import_end(td_eng *e, eimport *im, const char *why) {
    td_sched_unhold_blocks(e->sched, im->blocks, im->n_blocks);
    int k = e->n_ended++ % N_ENDED;
    e->ended[k].id = im->id;
    e->ended[k].why = why;
    e->ended[k].lease_ms = im->lease_ms;
    e->n_imports--;
    e->n_import_blocks -= im->n_blocks;
    free(im);
}

static void imports_drop_all(td_eng *e, const char *why) {
    while (e->imports) {
        eimport *im = e->imports;
        e->imports = im->next;
        import_end(e, im, why);
    }
}

static void imports_expire(td_eng *e) {
    const int64_t now = now_ns();
    bool expired = false;
    for (eimport **pp = &e->imports; *pp;) {
        eimport *im = *pp;
        if (now < im->deadline_ns) {
            pp = &im->next;
            continue;
        }
        *pp = im->next;
        TD_LOGW("engine: KV import %llu expired (lease %d ms): %d blocks freed", (unsigned long long)im->id,
                im->lease_ms, im->n_blocks);
        import_end(e, im, "its lease expired");
        expired = true;
    }
    if (expired) snapshot(e);
}

static int64_t imports_due(const td_eng *e) {  // the earliest lease deadline, INT64_MAX if none
    int64_t due = INT64_MAX;
    for (const eimport *im = e->imports; im; im = im->next)
        if (im->deadline_ns < due) due = im->deadline_ns;
    return due;
}

// Ends every request (running, queued in the scheduler, pending) with status st.
static void fail_all(td_eng *e, td_status st, const char *msg) {
    for (int s = 0; s < e->n_req_slots; s++)
        if (e->slots[s]) req_abort(e, e->slots[s], st, msg);
    while (e->pend_head) {
        ereq *r = e->pend_head;
        e->pend_head = r->qnext;
        if (!e->pend_head) e->pend_tail = NULL;
        pthread_mutex_lock(&e->mu);
        e->n_pending--;
        pthread_mutex_unlock(&e->mu);
        req_abort(e, r, st, msg);
    }
}

static void embeds_fail(td_eng *e, td_status st, const char *msg);

static td_status cmd_set_weights(td_eng *e, td_eng_cmd *c, td_err *err) {
    if (!e->p.updatable_weights)
        return td_err_set(err, TD_ERR_UNSUPPORTED,
                          "engine: SET_WEIGHTS needs an engine created with updatable_weights (td_eng_params): this "
                          "one reads the model's weights in place; nothing changed");
    td_err ferr = {0};
    td_status st = td_forward_set_weights_typed(e->fwd, c->set_weights.get, c->set_weights.get_typed,
                                                  c->set_weights.ctx, &ferr);
    if (st == TD_OK) {
        // The new weights are complete: nothing computed by the old ones is read again (running
        // sequences recompute, the prefix cache restarts under the new version), and imports
        // computed by the old ones are dropped.
        imports_drop_all(e, "dropped by a weights update");
        embeds_fail(e, TD_ERR_LIMIT, "engine: embeddings interrupted by a weights update; retry");
        td_sched_set_weights_version(e->sched, e->weights_version + 1);
        pthread_mutex_lock(&e->mu);
        e->weights_version++;
        e->weights_ok = true;
        e->weights_msg[0] = 0;
        pthread_mutex_unlock(&e->mu);
        c->set_weights.version = e->weights_version;
        TD_LOGI("engine: weights updated to version %llu", (unsigned long long)e->weights_version);
        return TD_OK;
    }
    c->set_weights.version = e->weights_version;
    if (st == TD_ERR_UNSUPPORTED)  // refused before touching anything (forward.h): keep serving
        return td_err_set(err, st, "engine: SET_WEIGHTS: %s; nothing changed", ferr.msg);
    // Some weights may be new: the forward refuses to run until a good update, so every request
    // ends now with the reason instead of failing step after step, and new ones are refused.
    char msg[TD_ERR_MSG_MAX];
    snprintf(msg, sizeof msg, "engine: the weights update failed (%.400s); no request is served until a SET_WEIGHTS "
             "succeeds", ferr.msg);
    TD_LOGE("%s", msg);
    pthread_mutex_lock(&e->mu);
    e->weights_ok = false;
    snprintf(e->weights_msg, sizeof e->weights_msg, "%s", msg);
    pthread_mutex_unlock(&e->mu);
    imports_drop_all(e, "dropped by a failed weights update");
    embeds_fail(e, TD_ERR_LIMIT, msg);
    fail_all(e, TD_ERR_LIMIT, msg);
    return td_err_set(err, st, "engine: SET_WEIGHTS failed: %s", ferr.msg);
}

static td_status cmd_import_begin(td_eng *e, td_eng_ticket *t, td_err *err) {
    td_eng_cmd *c = &t->c;
    const int bs = e->p.block_size, L = e->n_layers, nb = c->import.n_tokens / bs;
    if (!e->p.enable_prefix_cache)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "engine: IMPORT_BEGIN needs the prefix cache (enable_prefix_cache)");
    if (!e->weights_ok) return td_err_set(err, TD_ERR_LIMIT, "engine: IMPORT_BEGIN: %s", e->weights_msg);
    if (c->import.weights_version != e->weights_version)
        return td_err_set(err, TD_ERR_INVALID,
                          "engine: IMPORT_BEGIN: the KV was computed with weights version %llu, the engine is at "
                          "version %llu: rejected",
                          (unsigned long long)c->import.weights_version, (unsigned long long)e->weights_version);
    if (e->n_imports >= MAX_IMPORTS)
        return td_err_set(err, TD_ERR_LIMIT, "engine: IMPORT_BEGIN: %d imports pending already", e->n_imports);
    const int avail = td_kv_pool_n_available(e->pool);
    if (avail < nb)
        return td_err_set(err, TD_ERR_LIMIT,
                          "engine: IMPORT_BEGIN: no room for %d blocks: %d free or evictable (an import never "
                          "preempts running sequences)",
                          nb, avail);
    eimport *im = calloc(1, sizeof *im + (size_t)nb * sizeof(int32_t) * (1 + (size_t)bs));
    if (!im) return td_err_set(err, TD_ERR_NOMEM, "engine: out of memory");
    im->blocks = (int32_t *)(im + 1);
    im->tokens = im->blocks + nb;
    memcpy(im->tokens, t->tokens, (size_t)nb * (size_t)bs * sizeof(int32_t));
    td_status hst = td_sched_hold_blocks(e->sched, nb, im->blocks, err);  // counted above: cannot fail
    if (hst) {
        free(im);
        return hst;
    }
    im->n_blocks = nb;
    im->id = ++e->next_import;
    im->version = e->weights_version;
    im->lease_ms = c->import.lease_ms;
    im->deadline_ns = now_ns() + (int64_t)c->import.lease_ms * 1000000LL;
    im->next = e->imports;
    e->imports = im;
    e->n_imports++;
    e->n_import_blocks += nb;
    c->import.import_id = im->id;
    c->import.n_blocks = nb;
    c->import.buffer = td_kv_pool_buffer(e->pool);
    c->import.block_bytes = (size_t)bs * td_kv_pool_row_bytes(e->pool);
    c->import.dtype = td_kv_pool_dtype(e->pool);
    for (int i = 0; i < nb; i++) {
        t->blocks[i] = im->blocks[i];
        for (int l = 0; l < L; l++)
            for (int kv = 0; kv < 2; kv++)
                t->offsets[((size_t)i * L + l) * 2 + kv] = td_kv_pool_offset(e->pool, im->blocks[i], l, kv);
    }
    return TD_OK;
}

static td_status cmd_transfer_done(td_eng *e, td_eng_cmd *c, td_err *err) {
    const uint64_t id = c->transfer_done.import_id;
    c->transfer_done.n_cached_tokens = 0;
    eimport **pp = &e->imports;
    while (*pp && (*pp)->id != id) pp = &(*pp)->next;
    if (!*pp) {
        for (int i = 0; i < N_ENDED && i < e->n_ended; i++) {
            int k = (e->n_ended - 1 - i) % N_ENDED;
            if (e->ended[k].id == id)
                return td_err_set(err, TD_ERR_NOT_FOUND,
                                  "engine: TRANSFER_DONE: import %llu is no longer pending: %s (lease %d ms)",
                                  (unsigned long long)id, e->ended[k].why, e->ended[k].lease_ms);
        }
        return td_err_set(err, TD_ERR_NOT_FOUND, "engine: TRANSFER_DONE: no pending import %llu", (unsigned long long)id);
    }
    eimport *im = *pp;
    *pp = im->next;
    if (c->transfer_done.status != TD_OK) {
        import_end(e, im, "its transfer failed");
        return TD_OK;
    }
    TD_ASSERT(im->version == e->weights_version);  // updates drop pending imports
    // The chain for these tokens, as the scheduler commits a sequence's full blocks. A block whose
    // prefix is already cached stays uncached (and is freed below); the chain goes on from the
    // canonical entry.
    const int bs = e->p.block_size;
    uint64_t h = td_kv_pool_root_hash(e->pool), parent = TD_KV_NO_ENTRY;
    for (int i = 0; i < im->n_blocks; i++) {
        const int32_t *tok = im->tokens + (size_t)i * bs;
        h = td_kv_pool_hash(e->pool, h, tok);
        parent = td_kv_pool_cache_insert(e->pool, im->blocks[i], h, parent, tok);
    }
    c->transfer_done.n_cached_tokens = im->n_blocks * bs;
    import_end(e, im, "TRANSFER_DONE was applied already");
    return TD_OK;
}

// Engine-side invariant check: td_sched_check (it counts the imports' held blocks too), and the
// imports' blocks against what the scheduler holds.
static td_status check_all(td_eng *e, td_err *err) {
    td_status st0 = td_sched_check(e->sched, err);
    if (st0) return st0;
    int emb_blocks = 0;  // held by the embedding inputs in flight
    for (int a = 0; a < e->emb_nact; a++) emb_blocks += e->emb_act[a].nb;
    if (td_sched_n_held(e->sched) != e->n_import_blocks + emb_blocks)
        return td_err_set(err, TD_ERR_INVALID,
                          "engine check: %d blocks held by the scheduler, %d by imports, %d by embeddings",
                          td_sched_n_held(e->sched), e->n_import_blocks, emb_blocks);
    if (!e->imports && !e->emb_nact) return TD_OK;
    td_status st = td_kv_pool_check(e->pool, err);
    if (st) return st;
    const int nb = td_kv_pool_n_blocks(e->pool);
    int32_t *refs = calloc((size_t)nb, sizeof *refs);
    if (!refs) return td_err_set(err, TD_ERR_NOMEM, "engine check: no memory");
    for (int s = 0; s < e->n_req_slots && !st; s++) {
        ereq *r = e->slots[s];
        for (int j = 0; r && j < r->g.n && !st; j++) {
            if (!r->ch[j].in_sched) continue;
            const td_seq *q = td_sched_get(e->sched, seq_of(r, j));
            if (!q) {
                st = td_err_set(err, TD_ERR_INVALID, "engine check: seq %llu not in the scheduler",
                                (unsigned long long)seq_of(r, j));
                break;
            }
            for (int i = 0; i < q->n_blocks; i++) refs[q->blocks[i]]++;
        }
    }
    for (const eimport *im = e->imports; im; im = im->next)
        for (int i = 0; i < im->n_blocks; i++) refs[im->blocks[i]]++;
    for (int a = 0; a < e->emb_nact; a++)
        for (int i = 0; i < e->emb_act[a].nb; i++) refs[e->emb_tables[(size_t)a * e->table_stride + i]]++;
    for (int b = 0; !st && b < nb; b++)
        if (refs[b] != td_kv_pool_refcount(e->pool, b))
            st = td_err_set(err, TD_ERR_INVALID, "engine check: block %d: refcount %d but %d references", b,
                            td_kv_pool_refcount(e->pool, b), refs[b]);
    free(refs);
    return st;
}

static void debug_check(td_eng *e) {
    if (!e->p.debug_checks) return;
    td_err err = {0};
    if (check_all(e, &err) != TD_OK) {
        pthread_mutex_lock(&e->mu);
        if (e->dbg.n_check_failures++ == 0) snprintf(e->dbg.check_msg, sizeof e->dbg.check_msg, "%.150s", err.msg);
        pthread_mutex_unlock(&e->mu);
    }
}

// Completes the parked DRAINs (in order) once no request is live, or with st/msg when given.
static void drains_complete(td_eng *e, td_status st, const char *msg) {
    if (!e->drains) return;
    if (!st) {
        pthread_mutex_lock(&e->mu);
        bool idle = e->n_live == 0 && !e->emb_head;
        pthread_mutex_unlock(&e->mu);
        if (!idle) return;
    }
    while (e->drains) {
        td_eng_ticket *t = e->drains;
        e->drains = t->qnext;
        t->qnext = NULL;
        cmd_complete(e, t, st, msg);
    }
    e->drains_tail = NULL;
}

// Releases the blocks of the embedding inputs in flight.
static void embed_release(td_eng *e) {
    for (int a = 0; a < e->emb_nact; a++)
        td_sched_unhold_blocks(e->sched, e->emb_tables + (size_t)a * e->table_stride, e->emb_act[a].nb);
    e->emb_nact = 0;
}

// Ends the EMBED at the head of the queue (its blocks released) with st.
static void embed_end(td_eng *e, td_status st, const char *msg) {
    td_eng_ticket *t = e->emb_head;
    embed_release(e);
    e->emb_head = t->qnext;
    if (!e->emb_head) e->emb_tail = NULL;
    t->qnext = NULL;
    e->emb_next = e->emb_finished = 0;
    if (st == TD_OK) {
        t->c.embed.dim = e->dim;
        t->c.embed.n_tokens = t->emb_offs[t->c.embed.n_inputs];
    }
    cmd_complete(e, t, st, msg);
}

// Fails every EMBED still queued or running (shutdown, a weights update: their hidden states
// would mix weights).
static void embeds_fail(td_eng *e, td_status st, const char *msg) {
    while (e->emb_head) embed_end(e, st, msg);
}

// One forward of the EMBED at the head of the queue (TD_ENG_CMD_EMBED, engine.h), run between
// generation steps so that both advance: inputs enter in order while a sequence row and their
// blocks are free; the forward takes the next tokens of every input in flight (within
// max_batched_tokens) over that input's own held blocks (row a of emb_tables, batch sequence a);
// the final hidden rows are pooled into emb_acc; an input is finished (mean, L2 norm) and its
// blocks released as soon as its last token has run. Nothing is entered into the prefix cache.
// Returns whether a forward ran.
static bool embed_step(td_eng *e) {
    td_eng_ticket *t = e->emb_head;
    if (!t) return false;
    const int n = t->c.embed.n_inputs, D = e->dim, bs = e->p.block_size, S = e->p.max_seqs;
    const int TB = e->p.max_batched_tokens;
    const int *off = t->emb_offs;
    const bool mean = e->p.pooling == TD_ENG_POOL_MEAN;
    emb_slot *act = e->emb_act;
    while (e->emb_next < n && e->emb_nact < S) {  // admit the next inputs while there is room
        const int len = off[e->emb_next + 1] - off[e->emb_next], nb = (len + bs - 1) / bs;
        if (td_kv_pool_n_available(e->pool) < nb) break;
        td_err herr = {0};
        if (td_sched_hold_blocks(e->sched, nb, e->emb_tables + (size_t)e->emb_nact * e->table_stride, &herr)) break;
        act[e->emb_nact] = (emb_slot){.input = e->emb_next, .len = len, .nb = nb};
        memset(e->emb_acc + (size_t)e->emb_nact * D, 0, (size_t)D * sizeof(double));
        e->emb_nact++, e->emb_next++;
    }
    if (e->emb_nact == 0) {
        char msg[TD_ERR_MSG_MAX];
        snprintf(msg, sizeof msg,
                 "engine: no room in the KV cache for an input of %d tokens now (%d of %d blocks available); retry "
                 "later",
                 off[e->emb_next + 1] - off[e->emb_next], td_kv_pool_n_available(e->pool), td_kv_pool_n_blocks(e->pool));
        embed_end(e, TD_ERR_LIMIT, msg);
        return false;
    }
    int T = 0;
    for (int a = 0; a < e->emb_nact; a++) {
        emb_slot *q = &act[a];
        int take = q->len - q->done;
        if (take > TB - T) take = TB - T;
        q->take = take;
        for (int k = 0; k < take; k++, T++) {
            const int p = q->done + k;
            e->b_tok[T] = t->tokens[off[q->input] + p];
            e->b_pos[T] = p;
            e->b_seq[T] = a;
            e->b_want[T] = mean || p == q->len - 1;
        }
    }
    td_batch b = {.n_tokens = T, .tokens = e->b_tok, .pos = e->b_pos, .seq_id = e->b_seq, .want_logits = e->b_want};
    td_err ferr = {0};
    td_status st = td_forward_run_kv_hidden(e->fwd, &b, e->emb_kvl, e->hidden, &ferr);
    pthread_mutex_lock(&e->mu);
    e->dbg.n_steps++;
    e->dbg.n_batch_tokens += (uint64_t)T;
    pthread_mutex_unlock(&e->mu);
    if (st) {
        char msg[TD_ERR_MSG_MAX];
        snprintf(msg, sizeof msg, "engine: embedding forward failed: %.400s", ferr.msg);
        embed_end(e, st, msg);
        return true;
    }
    // Pool the rows (batch order: slot by slot), then finish the inputs that are done.
    const float *row = e->hidden;
    for (int a = 0; a < e->emb_nact; a++) {
        emb_slot *q = &act[a];
        double *acc = e->emb_acc + (size_t)a * D;
        for (int k = 0; k < q->take; k++) {
            if (!mean && q->done + k != q->len - 1) continue;
            for (int d = 0; d < D; d++) acc[d] += row[d];
            row += D;
        }
        q->done += q->take;
    }
    int w = 0;
    for (int a = 0; a < e->emb_nact; a++) {
        emb_slot *q = &act[a];
        double *acc = e->emb_acc + (size_t)a * D;
        int32_t *blocks = e->emb_tables + (size_t)a * e->table_stride;
        if (q->done < q->len) {  // still running: keep it, compacted to slot w
            if (w != a) {
                act[w] = *q;
                memcpy(e->emb_tables + (size_t)w * e->table_stride, blocks, (size_t)q->nb * sizeof(int32_t));
                memcpy(e->emb_acc + (size_t)w * D, acc, (size_t)D * sizeof(double));
            }
            w++;
            continue;
        }
        const double scale = mean ? 1.0 / q->len : 1.0;
        double ss = 0;
        for (int d = 0; d < D; d++) acc[d] *= scale, ss += acc[d] * acc[d];
        // As torch.nn.functional.normalize: x / max(||x||, 1e-12).
        const double inv = e->p.embed_no_normalize ? 1.0 : 1.0 / (sqrt(ss) > 1e-12 ? sqrt(ss) : 1e-12);
        float *o = t->emb + (size_t)q->input * D;
        for (int d = 0; d < D; d++) o[d] = (float)(acc[d] * inv);
        td_sched_unhold_blocks(e->sched, blocks, q->nb);
        e->emb_finished++;
    }
    e->emb_nact = w;
    if (e->emb_finished == n) embed_end(e, TD_OK, NULL);
    return true;
}

// EMBED applied: refused at once while draining or with unusable weights; otherwise queued behind
// the EMBEDs already running (parked: embed_step completes it).
static bool cmd_embed(td_eng *e, td_eng_ticket *t, td_err *err) {
    if (!e->weights_ok) {
        td_err_set(err, TD_ERR_LIMIT, "engine: %s", e->weights_msg);
        return false;
    }
    pthread_mutex_lock(&e->mu);
    const bool draining = e->draining;
    if (!draining) t->state = CMD_PARKED;
    pthread_mutex_unlock(&e->mu);
    if (draining) {
        td_err_set(err, TD_ERR_LIMIT, "engine: draining: not accepting new requests");
        return false;
    }
    if (e->emb_tail)
        e->emb_tail->qnext = t;
    else
        e->emb_head = t;
    e->emb_tail = t;
    return true;
}

// Applies one command (engine thread, between steps). A DRAIN with requests still live is parked
// and completes later; everything else completes here.
static void cmd_apply(td_eng *e, td_eng_ticket *t) {
    td_err err = {0};
    td_status st = TD_OK;
    e->n_commands++;
    switch (t->c.type) {
    case TD_ENG_CMD_SET_WEIGHTS: st = cmd_set_weights(e, &t->c, &err); break;
    case TD_ENG_CMD_IMPORT_BEGIN: st = cmd_import_begin(e, t, &err); break;
    case TD_ENG_CMD_TRANSFER_DONE: st = cmd_transfer_done(e, &t->c, &err); break;
    case TD_ENG_CMD_DRAIN: {
        pthread_mutex_lock(&e->mu);
        e->draining = true;
        t->state = CMD_PARKED;
        pthread_mutex_unlock(&e->mu);
        if (e->drains_tail)
            e->drains_tail->qnext = t;
        else
            e->drains = t;
        e->drains_tail = t;
        drains_complete(e, TD_OK, NULL);  // at once when already idle
        return;
    }
    case TD_ENG_CMD_RESUME:
        pthread_mutex_lock(&e->mu);
        e->draining = false;
        pthread_mutex_unlock(&e->mu);
        drains_complete(e, TD_ERR_LIMIT, "engine: DRAIN interrupted by RESUME before the engine was idle");
        break;
    case TD_ENG_CMD_REPORT_STATE: state_fill(e, &t->c.state); break;
    case TD_ENG_CMD_EMBED:
        if (cmd_embed(e, t, &err)) return;  // parked: embed_step completes it
        st = err.status;
        break;
    }
    snapshot(e);  // td_eng_debug agrees with the command's effect once its waiter wakes
    cmd_complete(e, t, st, err.msg);
}

// Applies every queued command in FIFO order; with quit, completes them with an error instead.
static void cmds_run(td_eng *e, bool quit) {
    for (;;) {
        pthread_mutex_lock(&e->mu);
        td_eng_ticket *t = e->cmd_head;
        if (t) {
            e->cmd_head = t->qnext;
            if (!e->cmd_head) e->cmd_tail = NULL;
            t->qnext = NULL;
            t->state = CMD_RUNNING;
        }
        pthread_mutex_unlock(&e->mu);
        if (!t) return;
        if (quit)
            cmd_complete(e, t, TD_ERR_LIMIT, "engine: shutting down");
        else
            cmd_apply(e, t);
        debug_check(e);
    }
}

static void *engine_thread(void *arg) {
    td_eng *e = arg;
    uint64_t seen_cancels = 0;
    for (;;) {
        drains_complete(e, TD_OK, NULL);  // DRAINs whose engine became idle
        pthread_mutex_lock(&e->mu);
        bool active = e->n_free_slots < e->n_req_slots || e->pend_head || e->emb_head;
        // Idle: sleep until work arrives, the next lease deadline, or the tick.
        while (!e->quit && !e->inbox_head && !active && e->n_cancel_req == seen_cancels && !e->cmd_head) {
            const int64_t now = now_ns(), due = imports_due(e);
            if (now >= due) break;
            cond_wait_until(&e->cv, &e->mu, due - now < IDLE_TICK_NS ? due : now + IDLE_TICK_NS);
        }
        bool quit = e->quit;
        // Take the inbox (FCFS after what is already pending).
        if (e->inbox_head) {
            if (e->pend_tail)
                e->pend_tail->qnext = e->inbox_head;
            else
                e->pend_head = e->inbox_head;
            e->pend_tail = e->inbox_tail;
            e->n_pending += e->n_inbox;
            e->inbox_head = e->inbox_tail = NULL;
            e->n_inbox = 0;
        }
        bool scan = quit || e->n_cancel_req != seen_cancels;
        seen_cancels = e->n_cancel_req;
        if (scan)
            for (ereq *r = e->all; r; r = r->next)
                if (r->cancelled || quit) r->seen_cancel = true;
        pthread_mutex_unlock(&e->mu);

        if (scan) {  // abort cancelled requests: running ones and pending ones
            for (int s = 0; s < e->n_req_slots; s++)
                if (e->slots[s] && e->slots[s]->seen_cancel) req_abort(e, e->slots[s], TD_OK, NULL);
            ereq **pp = &e->pend_head, *prev = NULL;
            while (*pp) {
                ereq *r = *pp;
                if (r->seen_cancel) {
                    *pp = r->qnext;
                    if (e->pend_tail == r) e->pend_tail = prev;
                    pthread_mutex_lock(&e->mu);
                    e->n_pending--;
                    pthread_mutex_unlock(&e->mu);
                    req_abort(e, r, TD_OK, NULL);
                } else {
                    prev = r;
                    pp = &r->qnext;
                }
            }
        }
        // Commands, between steps; then leases that ran out.
        cmds_run(e, quit);
        if (quit) embeds_fail(e, TD_ERR_LIMIT, "engine: shutting down");
        imports_expire(e);
        if (quit && !e->pend_head && e->n_free_slots == e->n_req_slots) {
            pthread_mutex_lock(&e->mu);
            bool empty = !e->inbox_head;
            pthread_mutex_unlock(&e->mu);
            if (empty) break;
            continue;
        }
        // Admit pending requests in order while the scheduler has room (none while the weights
        // are unusable: they end with the reason).
        if (!e->weights_ok && e->pend_head) {
            char msg[TD_ERR_MSG_MAX];
            pthread_mutex_lock(&e->mu);
            snprintf(msg, sizeof msg, "%s", e->weights_msg);
            pthread_mutex_unlock(&e->mu);
            fail_all(e, TD_ERR_LIMIT, msg);
        }
        while (e->pend_head) {
            ereq *r = e->pend_head, *next = r->qnext;
            if (!req_admit(e, r)) break;  // (r may be freed now: an admission error ends it)
            e->pend_head = next;
            if (!e->pend_head) e->pend_tail = NULL;
            pthread_mutex_lock(&e->mu);
            e->n_pending--;
            pthread_mutex_unlock(&e->mu);
        }
        bool ran = step(e);
        debug_check(e);
        snapshot(e);
        if (embed_step(e)) {  // one forward of a running EMBED after each step: both advance
            ran = true;
            debug_check(e);
            snapshot(e);
        }
        if (!ran) {  // live sequences but nothing runnable (waiting for blocks an import holds): do not spin
            pthread_mutex_lock(&e->mu);
            if (!e->inbox_head && e->n_cancel_req == seen_cancels && !e->quit && !e->cmd_head &&
                (e->n_free_slots < e->n_req_slots || e->pend_head))
                cond_wait_until(&e->cv, &e->mu, now_ns() + 2000000);
            pthread_mutex_unlock(&e->mu);
        }
    }
    // Shutting down: nothing is live any more; what is left of the command machinery ends here.
    cmds_run(e, true);
    embeds_fail(e, TD_ERR_LIMIT, "engine: shutting down");
    drains_complete(e, TD_ERR_LIMIT, "engine: shutting down");
    imports_drop_all(e, "dropped at shutdown");
    return NULL;
}

// ---- iface glue

static void i_info(void *ctx, td_engine_info *o) { td_eng_info(ctx, o); }
static td_status i_submit(void *ctx, const td_gen_request *g, const td_gen_sink *s, td_engine_handle *h,
                          td_err *err) {
    return td_eng_submit(ctx, g, s, h, err);
}
static void i_cancel(void *ctx, td_engine_handle h) { td_eng_cancel(ctx, h); }
static void i_stats(void *ctx, td_engine_stats *o) { td_eng_stats(ctx, o); }
static td_status i_embed(void *ctx, const td_embed_request *q, const td_embed_sink *s, td_err *err) {
    return td_eng_embed(ctx, q, s, err);
}

static int i_tokenize(void *ctx, const char *text, size_t len, bool add_special, int32_t *ids, int cap,
                      td_err *err) {
    td_eng *e = ctx;
    td_tokens t = {0};
    if (td_tokenizer_encode(e->tok, text, len, add_special, &t, err) != TD_OK) return -1;
    if (t.n > (size_t)(1 << 30)) {
        td_tokens_free(&t);
        td_err_set(err, TD_ERR_LIMIT, "text too long");
        return -1;
    }
    int n = (int)t.n;
    if (ids && cap > 0) memcpy(ids, t.ids, (size_t)(n < cap ? n : cap) * sizeof(int32_t));
    td_tokens_free(&t);
    return n;
}

static long i_detokenize(void *ctx, const int32_t *ids, int n, char *out, size_t cap, td_err *err) {
    td_eng *e = ctx;
    char *s = NULL;
    size_t len = 0;
    if (td_tokenizer_decode(e->tok, ids, (size_t)(n > 0 ? n : 0), false, &s, &len, err) != TD_OK) return -1;
    if (out && cap) memcpy(out, s, len < cap ? len : cap);
    free(s);
    return (long)len;
}

static td_status i_chat(void *ctx, const cJSON *messages, const cJSON *body, bool add_gen, char **out, size_t *len,
                        td_err *err) {
    td_eng *e = ctx;
    *out = NULL;
    if (!e->tmpl)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "%s",
                          e->tmpl_err[0] ? e->tmpl_err
                                         : "this model has no chat template; start the server with --chat-template FILE");
    td_chat_params cp = {
        .messages = messages,
        .add_generation_prompt = add_gen,
        .bos_token = td_tokenizer_bos_token(e->tok),
        .eos_token = td_tokenizer_eos_token(e->tok),
        .tools = body ? cJSON_GetObjectItemCaseSensitive(body, "tools") : NULL,
        .documents = body ? cJSON_GetObjectItemCaseSensitive(body, "documents") : NULL,
        .kwargs = body ? cJSON_GetObjectItemCaseSensitive(body, "chat_template_kwargs") : NULL,
    };
    return td_chat_template_apply(e->tmpl, &cp, out, len, err);
}

static const td_engine_iface eng_iface = {
    .info = i_info,
    .submit = i_submit,
    .cancel = i_cancel,
    .stats = i_stats,
    .tokenize = i_tokenize,
    .detokenize = i_detokenize,
    .apply_chat_template = i_chat,
    .embed = i_embed,
};

td_engine td_eng_iface(td_eng *e) { return (td_engine){.vt = &eng_iface, .ctx = e}; }

// ---- create / free

td_status td_eng_create(const td_model *m, const td_tokenizer *tok, const td_eng_params *pp, td_eng **out,
                        td_err *err) {
    *out = NULL;
    if (!m || !tok) return td_err_set(err, TD_ERR_INVALID, "engine: a model and a tokenizer are required");
    td_eng_params p = pp ? *pp : td_eng_default_params();
    if (p.block_size <= 0) p.block_size = 16;
    if (p.max_seqs <= 0) p.max_seqs = 32;
    if (p.max_batched_tokens <= 0) p.max_batched_tokens = 512;
    if (p.max_batched_tokens < p.max_seqs)
        return td_err_set(err, TD_ERR_INVALID, "engine: max_batched_tokens %d must be >= max_seqs %d",
                          p.max_batched_tokens, p.max_seqs);
    if (p.max_waiting <= 0) p.max_waiting = 256;
    if (p.max_queue <= 0) p.max_queue = 4096;
    if (!(p.kv_cache_fraction > 0 && p.kv_cache_fraction <= 1)) p.kv_cache_fraction = 0.25;
    if (p.pooling != TD_ENG_POOL_LAST && p.pooling != TD_ENG_POOL_MEAN)
        return td_err_set(err, TD_ERR_INVALID, "engine: unknown pooling %d (last or mean)", (int)p.pooling);
    const td_model_config *c = &m->cfg;
    if (td_tokenizer_vocab_size(tok) > c->vocab_size)
        TD_LOGW("engine: the tokenizer knows %d ids, the model %d; ids beyond the model are rejected",
                td_tokenizer_vocab_size(tok), c->vocab_size);

    td_eng *e = calloc(1, sizeof *e);
    if (!e) return td_err_set(err, TD_ERR_NOMEM, "engine: out of memory");
    pthread_mutex_init(&e->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);  // every timed wait here is on CLOCK_MONOTONIC
    pthread_cond_init(&e->cv, &ca);
    pthread_cond_init(&e->cmd_cv, &ca);
    pthread_condattr_destroy(&ca);
    e->weights_ok = true;
    e->m = m;
    e->tok = tok;
    e->vocab = c->vocab_size;
    e->n_layers = c->n_layers;
    e->kv_dim = c->n_kv_heads * c->head_dim;
    e->created = (int64_t)time(NULL);
    td_status st = TD_OK;
    for (int i = 0; i < c->n_eos; i++) e->eos[e->n_eos++] = c->eos_ids[i];
    int teos = td_tokenizer_eos_id(tok);
    if (teos >= 0 && !is_eos(e, teos)) e->eos[e->n_eos++] = teos;

    // Name.
    const char *name = p.model_name;
    char buf[256];
    if (!name) {
        const char *path = m->path ? m->path : "model";
        size_t n = strlen(path);
        while (n > 1 && path[n - 1] == '/') n--;
        size_t b0 = n;
        while (b0 > 0 && path[b0 - 1] != '/') b0--;
        snprintf(buf, sizeof buf, "%.*s", (int)(n - b0), path + b0);
        name = buf;
    }
    e->model_name = strdup(name);
    if (!e->model_name) {
        st = td_err_set(err, TD_ERR_NOMEM, "engine: out of memory");
        goto fail;
    }

    // Chat template.
    const char *src = p.chat_template ? p.chat_template : td_tokenizer_chat_template(tok);
    if (src) {
        td_err terr = {0};
        if (td_jinja_compile(src, strlen(src), &e->tmpl, &terr) != TD_OK) {
            if (p.chat_template) {
                st = td_err_set(err, TD_ERR_INVALID, "engine: --chat-template: %s", terr.msg);
                goto fail;
            }
            TD_LOGW("engine: the model's chat template does not compile: %s", terr.msg);
            snprintf(e->tmpl_err, sizeof e->tmpl_err, "the model's chat template does not compile: %.200s", terr.msg);
        }
    }

    // Context and KV pool.
    int max_ctx = p.max_model_len > 0 ? p.max_model_len : (c->max_pos > 0 ? c->max_pos : 4096);
    if (p.max_model_len > 0 && c->max_pos > 0 && p.max_model_len > c->max_pos) {
        st = td_err_set(err, TD_ERR_INVALID, "engine: max_model_len %d exceeds the model's max_position_embeddings %d",
                        p.max_model_len, c->max_pos);
        goto fail;
    }
    td_kv_pool_params kp = td_kv_pool_default_params();
    kp.block_size = p.block_size;
    kp.n_layers = c->n_layers;
    kp.n_kv_heads = c->n_kv_heads;
    kp.head_dim = c->head_dim;
    if (!td_kv_dtype_ok(p.kv_cache_dtype)) {
        st = td_err_set(err, TD_ERR_INVALID, "engine: KV cache dtype must be f32, f16 or bf16");
        goto fail;
    }
    kp.dtype = p.kv_cache_dtype;
    kp.alloc_data = true;
    td_backend_params bp = td_backend_default_params();
    bp.name = p.backend;
    bp.device = p.device;
    bp.n_threads = p.n_threads;
    if ((st = td_backend_create(&bp, &e->be, err))) goto fail;
    kp.backend = e->be;
    size_t bpb = td_kv_pool_bytes_per_block(&kp);
    if (!bpb) {
        st = td_err_set(err, TD_ERR_INVALID, "engine: bad KV dimensions");
        goto fail;
    }
    if (p.kv_blocks > 0) {
        kp.n_blocks = p.kv_blocks;
    } else if (p.kv_cache_bytes > 0) {
        kp.budget_bytes = p.kv_cache_bytes;
    } else {
        size_t avail = mem_available();
        size_t budget = (size_t)((double)avail * p.kv_cache_fraction);
        size_t useful = (size_t)p.max_seqs * (((size_t)max_ctx + (size_t)p.block_size - 1) / (size_t)p.block_size) * bpb;
        if (budget == 0 || budget > useful) budget = useful;
        kp.budget_bytes = budget;
    }
    if ((st = td_kv_pool_create(&kp, &e->pool, err))) goto fail;
    const int n_blocks = td_kv_pool_n_blocks(e->pool);
    if ((int64_t)n_blocks * p.block_size < max_ctx) {
        TD_LOGW("engine: the KV pool holds %d tokens; max_model_len lowered from %d", n_blocks * p.block_size, max_ctx);
        max_ctx = n_blocks * p.block_size;
    }
    e->max_ctx = max_ctx;

    td_forward_params fp = td_forward_default_params();
    fp.max_batch_tokens = p.max_batched_tokens;
    fp.max_seqs = p.max_seqs;
    fp.max_ctx = max_ctx;
    fp.n_threads = p.n_threads;
    fp.external_kv = true;
    fp.own_weights = p.updatable_weights;  // SET_WEIGHTS replaces the forward's own copy
    fp.backend = e->be;
    if ((st = td_forward_create(m, &fp, &e->fwd, err))) goto fail;

    td_sched_params sp = td_sched_default_params();
    sp.max_batched_tokens = p.max_batched_tokens;
    sp.max_seqs = p.max_seqs;
    sp.max_waiting = p.max_waiting;
    sp.max_ctx = max_ctx;
    sp.enable_prefix_cache = p.enable_prefix_cache;
    if ((st = td_sched_create(&sp, e->pool, &e->sched, err))) goto fail;
    e->sched_cap = p.max_seqs + p.max_waiting;
    e->n_req_slots = e->sched_cap;

    const size_t T = (size_t)p.max_batched_tokens, V = (size_t)e->vocab;
    e->b_tok = malloc(T * sizeof(int32_t));
    e->b_pos = malloc(T * sizeof(int32_t));
    e->b_seq = malloc(T * sizeof(int32_t));
    e->b_want = malloc(T);
    e->table_stride = (max_ctx + p.block_size - 1) / p.block_size;
    e->tables = calloc((size_t)p.max_seqs * (size_t)e->table_stride, sizeof *e->tables);
    e->kvl = calloc((size_t)c->n_layers, sizeof *e->kvl);
    e->meta = calloc((size_t)p.max_seqs, sizeof *e->meta);
    e->logits = T * V <= SIZE_MAX / sizeof(float) ? malloc(T * V * sizeof(float)) : NULL;
    e->scratch = malloc(V * sizeof(float));
    e->text = malloc(TEXT_CAP + TD_STOP_MAX_LEN);
    e->tail = malloc(TEXT_CAP + 2 * TD_STOP_MAX_LEN);
    e->top_ids = malloc(MAX_LOGPROBS * sizeof(int32_t));
    e->top_lps = malloc(MAX_LOGPROBS * sizeof(float));
    e->dim = c->dim;
    e->hidden = malloc(T * (size_t)c->dim * sizeof(float));
    e->emb_acc = malloc((size_t)p.max_seqs * (size_t)c->dim * sizeof(double));
    e->emb_act = malloc((size_t)p.max_seqs * sizeof *e->emb_act);
    e->emb_tables = calloc((size_t)p.max_seqs * (size_t)e->table_stride, sizeof *e->emb_tables);
    e->emb_kvl = calloc((size_t)c->n_layers, sizeof *e->emb_kvl);
    e->slots = calloc((size_t)e->n_req_slots, sizeof *e->slots);
    e->free_slots = malloc((size_t)e->n_req_slots * sizeof(int));
    e->smp = td_sampler_create(e->vocab);
    e->gcache = td_grammar_cache_create(16);
    e->gvocab = td_gvocab_from_tokenizer(e->tok, e->vocab, e->eos, e->n_eos, NULL);
    if (!e->b_tok || !e->b_pos || !e->b_seq || !e->b_want || !e->tables || !e->kvl || !e->meta || !e->logits ||
        !e->scratch || !e->text || !e->tail || !e->top_ids || !e->top_lps || !e->hidden || !e->emb_acc || !e->emb_act || !e->emb_tables || !e->emb_kvl || !e->slots || !e->free_slots || !e->smp) {
        st = td_err_set(err, TD_ERR_NOMEM, "engine: out of memory (logits %zu MiB)", T * V * 4 >> 20);
        goto fail;
    }
    for (int i = 0; i < e->n_req_slots; i++) e->free_slots[i] = e->n_req_slots - 1 - i;
    e->n_free_slots = e->n_req_slots;
    for (int l = 0; l < c->n_layers; l++)
        e->kvl[l] = (td_kv_layer){.k = td_kv_pool_layer_k(e->pool, l),
                                  .v = td_kv_pool_layer_v(e->pool, l),
                                  .block_table = e->tables,
                                  .table_stride = e->table_stride,
                                  .block_size = p.block_size,
                                  .kv_dim = e->kv_dim,
                                  .dtype = p.kv_cache_dtype};
    for (int l = 0; l < c->n_layers; l++) {
        e->emb_kvl[l] = e->kvl[l];
        e->emb_kvl[l].block_table = e->emb_tables;
    }
    e->p = p;
    e->p.model_name = e->model_name;
    e->p.chat_template = NULL;
    e->dbg.block_size = p.block_size;
    e->dbg.max_model_len = max_ctx;
    snapshot(e);
    if (pthread_create(&e->th, NULL, engine_thread, e) != 0) {
        st = td_err_set(err, TD_ERR_IO, "engine: cannot start the engine thread");
        goto fail;
    }
    e->th_started = true;
    TD_LOGI("engine: %s: %d KV blocks of %d tokens (%zu MiB, %s), max_model_len %d, max_seqs %d, "
            "max_batched_tokens %d, prefix cache %s",
            e->model_name, n_blocks, p.block_size, (size_t)n_blocks * bpb >> 20, td_dtype_name(p.kv_cache_dtype),
            max_ctx, p.max_seqs,
            p.max_batched_tokens, p.enable_prefix_cache ? "on" : "off");
    *out = e;
    return TD_OK;
fail:
    td_eng_free(e);
    return st;
}

void td_eng_free(td_eng *e) {
    if (!e) return;
    if (e->th_started) {
        pthread_mutex_lock(&e->mu);
        e->quit = true;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->th, NULL);
    }
    td_sched_free(e->sched);
    td_kv_pool_free(e->pool);
    td_forward_free(e->fwd);
    td_backend_free(e->be);  // after everything that allocated from it
    td_sampler_free(e->smp);
    td_grammar_cache_free(e->gcache);
    td_gvocab_free(e->gvocab);
    td_jinja_free(e->tmpl);
    free(e->b_tok), free(e->b_pos), free(e->b_seq), free(e->b_want), free(e->tables), free(e->kvl);
    free(e->meta), free(e->logits), free(e->scratch), free(e->text), free(e->tail), free(e->top_ids);
    free(e->top_lps), free(e->hidden), free(e->emb_acc), free(e->emb_act), free(e->emb_tables), free(e->emb_kvl), free(e->slots), free(e->free_slots), free(e->model_name);
    while (e->tickets) ticket_free_locked(e, e->tickets);  // completed, never released
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_cond_destroy(&e->cmd_cv);
    free(e);
}
