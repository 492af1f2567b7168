// The remote rollout engine: a td_rl_engine (rl/rollout.h) over a pool of running `tandem serve`
// processes reached over HTTP (POST /v1/completions with token-id prompts, processed logprobs and
// per-token weights versions), either given by URL or launched by the pool itself as children.
// One thread (the caller's) drives every request through libcurl's multi interface; health checks,
// restarts and re-syncs happen inside submit / wait_any / sync, never on a thread of their own.
// Not here: the HTTP server (src/server/), the weight-push protocol (rl/push.h).
//
// Servers and their states (td_rl_server_state):
//   UP        healthy, weights current: takes new requests (the one with the fewest in flight).
//   DOWN      dropped: its requests in flight were failed (status TD_ERR_IO or TD_ERR_TIMEOUT, msg
//             naming the server and why), it takes nothing. A launched child is SIGKILLed and
//             reaped at once, then restarted (STARTING); a URL server is probed every
//             health_interval_ms and readmitted when it answers again.
//   STARTING  a launched child started (again), waiting for GET /health (start_timeout_ms).
//   FAILED    a launched child that failed max_restarts starts in a row: never retried.
// A server is dropped when: GET /health (every health_interval_ms, deadline health_timeout_ms)
// fails or does not answer (a dead or SIGSTOPped process); a request on it cannot connect, loses
// its connection or passes request_timeout_ms (that request: TD_ERR_TIMEOUT); a launched child
// exits; a weight sync to it fails. Readmission (DOWN/STARTING -> UP) after a successful health
// check first pushes the last synced weights (when there was a sync): a server never serves
// stale weights. A re-sync blocks the calling submit / wait_any (each HTTP request of the push
// bounded by sync_timeout_ms). sync pushes to the UP servers one after the other.
//
// Requests: submit sends one POST /v1/completions (prompt as token ids, n, max_tokens, temperature,
// top_p, top_k, min_p, seed, stop, logprobs 0, logprobs_mode "processed", return_token_ids) to the
// UP server with the fewest in flight; wait_any hands back each request once: TD_OK with every
// choice parsed (token_ids, logprobs.token_logprobs, weights_versions, text, finish_reason; one
// missing or malformed, more tokens than max_tokens or text beyond text_cap: an error on that
// request naming the server), or the failure. An HTTP error answer fails the request without
// dropping the server. cancel removes the transfer (closing its connection: the server cancels
// the request) and hands the request back with TD_OK, every sample TD_FINISH_ABORT with no tokens
// (non-streamed answers carry nothing partial). Seeds must be < 2^53 (JSON numbers are doubles);
// penalties and logit bias are refused (TD_ERR_UNSUPPORTED). One thread: not thread-safe.
//
// Versions. Each pool sync is numbered: 0 = the weights the servers started with, k = the k-th
// call to sync. td_rl_req.ver[t] is the sync number whose weights produced token t: the pool keeps,
// per server, the map "server weights version (GET /v1/weights, the per-token weights_versions of
// /v1/completions) -> sync number", reset when that server is (re)started or readmitted. A token
// whose server version the pool never mapped fails its request (clear error), it is never guessed.
// A server without the weight routes (GET /v1/weights is a 404: no --enable-weight-sync) is taken
// at version 0 and serves until the first sync, which it fails (and is dropped).
// sync(k) pushes to every UP server, drops each that fails, and reports k and the wall time; it
// fails (TD_ERR_IO, naming each server and why) when none took the weights, k being used anyway
// (servers readmitted later get these weights). Requests in flight on a server continue on the new
// weights: their later tokens carry k.
// A re-sync reads the last source (cfg, get, gctx of the last sync call) again: that source must
// stay valid, and should still hold sync k's values, until the next sync or free (else a re-synced
// server's tokens labelled k come from later weights).
//
// Memory: every request's arrays are the caller's (td_rl_req). The pool allocates at create its
// curl handles, one request body buffer (body_cap) and one response buffer (response_cap) per
// in-flight slot (max_inflight); a body beyond body_cap fails submit, a response beyond
// response_cap fails that request (TD_ERR_LIMIT).
// A response is parsed with cJSON (a transient tree, freed before the request is handed back).
#ifndef TD_RL_REMOTE_H
#define TD_RL_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/status.h"
#include "rl/rollout.h"

#define TD_RL_REMOTE_MAX_SERVERS 64

// A `tandem serve` the pool starts as its child: argv (argv[0] the binary path, NULL-terminated,
// without --port) + "--port" <port>, listening on 127.0.0.1:port. The pool restarts it on the same
// port. Its stdout and stderr go to log_path (appended) or, when NULL, to the pool's stderr. The
// child gets SIGKILL when the thread that created the pool exits (PR_SET_PDEATHSIG): never orphaned.
typedef struct td_rl_remote_launch {
    const char *const *argv;
    int port;
    const char *log_path;
    bool shm;  // argv has --weight-sync-shm (the child is on this host): pushes go through shared
               //   memory (td_pusher_params.shm), not HTTP bodies
} td_rl_remote_launch;

typedef struct td_rl_remote_params {
    const char *const *urls;  // [n_urls] "http://host:port" (no path), servers already running
    int n_urls;
    const td_rl_remote_launch *launch;  // [n_launch] servers the pool starts
    int n_launch;
    const char *model;    // the requests' "model" (the served name); NULL: omitted (any)
    const char *api_key;  // sent as "Authorization: Bearer <key>"; NULL: none
    int max_inflight;     // requests in flight at once over the pool (slots); default 64
    size_t body_cap;      // bytes per slot's request body; default 1 MiB
    size_t response_cap;  // bytes per slot's response; default 16 MiB
    int connect_timeout_ms;  // default 2000
    int request_timeout_ms;  // a whole /v1/completions call; default 600000
    int health_interval_ms;  // between GET /health of each server; default 1000
    int health_timeout_ms;   // default 2000
    int start_timeout_ms;    // a launched server's first healthy answer; default 120000
    int sync_timeout_ms;     // each HTTP request of a weight push or version query (td_pusher's
                             //   timeout_ms); default 300000
    int max_restarts;        // consecutive failed starts before FAILED; default 5
    int min_healthy;         // create fails with fewer servers UP; 0 (default): all of them
} td_rl_remote_params;

td_rl_remote_params td_rl_remote_default_params(void);

// Starts the launched servers, waits (start_timeout_ms) until every server answers GET /health and
// creates one weight pusher per server. Fails (nothing left running, every child reaped) when
// fewer than min_healthy (default: all) servers answer; the message names each one that did not.
// With min_healthy below the count, a server that did not answer starts DOWN (or STARTING).
td_status td_rl_remote_engine(const td_rl_remote_params *p, td_rl_engine *out, td_err *err);

typedef enum td_rl_server_state {
    TD_RL_SERVER_UP = 0,
    TD_RL_SERVER_DOWN,
    TD_RL_SERVER_STARTING,
    TD_RL_SERVER_FAILED,
} td_rl_server_state;

const char *td_rl_server_state_name(td_rl_server_state s);  // "up", "down", "starting", "failed"

typedef struct td_rl_remote_server_stats {
    const char *url;  // owned by the pool
    td_rl_server_state state;
    bool launched;
    pid_t pid;              // the launched child's, 0 when none runs (or a URL server)
    int inflight;           // requests on it now
    uint64_t requests_ok;   // handed back with TD_OK
    uint64_t requests_failed;
    uint64_t drops;         // times dropped
    uint64_t restarts;      // children started after the first
    uint64_t resyncs;       // re-syncs on readmission
    uint64_t sync;          // the sync number of its weights (valid when UP)
    uint64_t server_version;  // its own weights version for that sync
    char last_error[200];   // why it was last dropped ("" if never)
} td_rl_remote_server_stats;

typedef struct td_rl_remote_stats {
    int n_servers, n_up;
    uint64_t sync;             // the pool's last sync number
    uint64_t requests_failed;  // over all servers, also those failed before any server took them
} td_rl_remote_stats;

// Per server stats into out[0, min(cap, n)); returns n, or -1 when e is not a remote engine.
int td_rl_remote_stats_get(const td_rl_engine *e, td_rl_remote_stats *pool, td_rl_remote_server_stats *out, int cap);

#endif
