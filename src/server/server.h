// `tandem serve`'s HTTP server: OpenAI-compatible routes over libmicrohttpd (one internal epoll thread,
// streaming through suspend/resume, so open streams cost no threads), talking to an engine only
// through td_engine (engine/serve_api.h); optionally a bearer API key on every route but /health,
// and the weight-sync routes (/v1/weights/*) over a td_wsync (server/wsync.h). Not the engine,
// not the signal handling (the serve command catches SIGTERM and calls td_server_stop), not TLS.
#ifndef TD_SERVER_SERVER_H
#define TD_SERVER_SERVER_H

#include <stddef.h>
#include "base/status.h"
#include "server/openai.h"
#include "engine/serve_api.h"

typedef struct td_server_params {
    const char *host;           // IPv4 address to bind; default "127.0.0.1"
    int port;                   // 0: any free port (read it back with td_server_port)
    int max_connections;        // connections served at once; up to 16 more get a 503 JSON error,
                                //   beyond that the socket is closed at accept (default 1024; cut
                                //   to fit RLIMIT_NOFILE, whose soft limit start raises to the hard)
    size_t max_body_bytes;      // request body; beyond: 413 (default 8 MiB)
    size_t max_header_bytes;    // request line + headers per connection; beyond: 431/414 (default 32 KiB)
    unsigned idle_timeout_s;    // idle connection timeout, seconds (default 600; 0 = none). Suspended
                                //   connections (waiting on the engine) do not time out.
    td_api_limits limits;       // max_n etc.; max_model_len and vocab_size are taken from the engine
    const char *api_key;        // non-empty: every route but /health needs "Authorization: Bearer
                                //   <api_key>" (compared in constant time), else 401. Borrowed.
    struct td_wsync *weight_sync;  // the /v1/weights routes' state (borrowed: free it after
                                   //   td_server_stop); NULL: those routes answer 404 "disabled"
    const char *const *model_aliases;  // [n_model_aliases] more ids this model answers to (listed by
    int n_model_aliases;               //   /v1/models after the engine's name; `--served-model-name a,b`,
                                       //   `--alias`). Borrowed.
    const char *allowed_origins;  // CORS: NULL or "": no CORS headers; "*": any origin; else a
                                  //   comma-separated list of origins (`--allowed-origins`). Borrowed.
    bool log_prompts;             // the per-request log line also carries the prompt text
    const char *tool_call_parser; // how chat output becomes tool_calls: "auto" (chosen from the chat
                                  //   template), "hermes", "llama3_json" or "none"; NULL = "auto"
    bool has_default_seed;        // requests without "seed" get seed td_server_request_seed(default_seed,
    uint64_t default_seed;        //   i), i = 0, 1, ... counting such requests (`serve --seed`)
} td_server_params;

// The seed of the i-th (from 0) unseeded request under has_default_seed: splitmix64's i-th output
// from state `seed`.
uint64_t td_server_request_seed(uint64_t seed, uint64_t i);

td_server_params td_server_default_params(void);

typedef struct td_server td_server;

// Starts listening and serving on MHD's own thread. The engine must outlive the server (stop the
// server first). Returns NULL with err set when MHD is unavailable or the bind fails.
td_server *td_server_start(const td_server_params *p, td_engine engine, td_err *err);

int td_server_port(const td_server *s);

// Stops accepting new connections, lets in-flight requests finish for up to grace_ms, cancels the rest
// through the engine and waits (bounded) for their last events, then stops MHD and frees the server.
// A weight-sync commit in flight is waited for (bounded by the sync's own deadline) before MHD stops.
// Returns the number of requests it had to cancel. Safe to call from any thread but the server's own.
// If the engine still holds requests after the bounded waits, their memory (and the server's) is
// freed when the engine's last on_done arrives; the engine must still deliver those on_done calls.
int td_server_stop(td_server *s, int grace_ms);

#endif
