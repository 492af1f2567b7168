// KV-cache transfer between a prefill and a decode instance (disaggregated serving,
// docs/disagg.md): a byte-stream transport interface with two implementations (TCP sockets:
// xfer_tcp.c, no dependency; UCX: xfer_ucx.c, which picks shared memory, TCP or RDMA as the hosts
// offer), a fault-injecting wrapper that drives the failure tests (xfer_fault.c), and above them
// one framing of typed messages (xfer.c): every message has a type, a transfer id, a length and an
// xxHash64 of its payload, and every wait has a deadline. The handshake exchanges a compatibility
// record and refuses a mismatched pair before any KV moves.
//
// Threading: a connection is used by one thread at a time for sends and one for receives (they may
// be different threads). A listener's accept is called from one thread. Nothing here knows the
// engine: the caller moves bytes between the pool and these calls.
#ifndef TD_DISAGG_XFER_H
#define TD_DISAGG_XFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

// ---- Transports: a table of function pointers, one per implementation.

typedef struct td_xfer_conn td_xfer_conn;          // one connected byte stream
typedef struct td_xfer_listener td_xfer_listener;  // a bound, listening endpoint

typedef struct td_xfer_transport td_xfer_transport;

typedef struct td_xfer_transport_vt {
    const char *name;  // "tcp", "ucx", "fault(tcp)", ...
    // Binds host:port (port 0: any free port) and listens. *endpoint receives the address a peer
    // connects to, "<name>://<ip>:<port>" (for UCX it may carry the worker address instead of a port
    // the peer can reach only through it; whatever connect() accepts), NUL-terminated within cap.
    td_status (*listen)(td_xfer_transport *t, const char *host, int port, td_xfer_listener **out,
                        char *endpoint, size_t cap, td_err *err);
    // Waits up to timeout_ms (0: poll) for one incoming connection. TD_ERR_TIMEOUT when none came.
    td_status (*accept)(td_xfer_listener *l, int timeout_ms, td_xfer_conn **out, td_err *err);
    // Stops listening (a blocked accept returns TD_ERR_IO or TD_ERR_TIMEOUT) and frees l. NULL is fine.
    void (*listener_close)(td_xfer_listener *l);
    // Connects to an endpoint that listen() returned, within timeout_ms. TD_ERR_IO names the address
    // and the reason (refused, unreachable); TD_ERR_TIMEOUT when the deadline passed.
    td_status (*connect)(td_xfer_transport *t, const char *endpoint, int timeout_ms, td_xfer_conn **out,
                         td_err *err);
    // Sends all n bytes of the iovec-like pieces (bufs[i], lens[i]) in order, within timeout_ms.
    // One call is one unit for the fault wrapper (the framing sends one message per call).
    // TD_ERR_IO when the peer is gone (the connection is then unusable), TD_ERR_TIMEOUT.
    td_status (*send)(td_xfer_conn *c, const void *const *bufs, const size_t *lens, int n, int timeout_ms,
                      td_err *err);
    // Receives exactly n bytes into buf within timeout_ms. TD_ERR_IO when the peer closed or failed
    // (the message says which), TD_ERR_TIMEOUT when the deadline passed first (the connection is
    // then unusable: a partial read may have happened).
    td_status (*recv)(td_xfer_conn *c, void *buf, size_t n, int timeout_ms, td_err *err);
    // Wakes any thread blocked in send/recv on c (they return TD_ERR_IO "shut down") and refuses
    // further calls; callable from any thread. Does not free c.
    void (*shutdown)(td_xfer_conn *c);
    // Closes and frees c (after shutdown if other threads may be inside it). NULL is fine.
    void (*close)(td_xfer_conn *c);
    // Frees the transport (after every listener and connection it made is closed).
    void (*destroy)(td_xfer_transport *t);
} td_xfer_transport_vt;

// Every transport object starts with this header, so the generic calls below can dispatch.
struct td_xfer_transport {
    const td_xfer_transport_vt *vt;
};
struct td_xfer_listener {
    td_xfer_transport *t;
};
struct td_xfer_conn {
    td_xfer_transport *t;
};

td_status td_xfer_tcp_create(td_xfer_transport **out, td_err *err);
// TD_ERR_UNSUPPORTED when tandem was built without UCX (TANDEM_UCX=OFF) or UCX fails to start.
td_status td_xfer_ucx_create(td_xfer_transport **out, td_err *err);
// By name: "tcp" or "ucx".
td_status td_xfer_create(const char *name, td_xfer_transport **out, td_err *err);

// The fault-injecting wrapper: every send of a connection made through it (listen/accept or
// connect) is, independently with the given probabilities (each in [0, 1], summing to <= 1),
// dropped (the bytes never leave, the call reports success), delayed by delay_ms first, truncated
// (a prefix of the bytes is sent, then the connection is shut down) or corrupted (one byte of the
// payload flipped). Decisions come from a seeded RNG (reproducible). Wraps `inner`, which it owns.
typedef struct td_xfer_fault_params {
    double drop, delay, truncate, corrupt;
    int delay_ms;
    uint64_t seed;
} td_xfer_fault_params;
td_status td_xfer_fault_create(td_xfer_transport *inner, const td_xfer_fault_params *p, td_xfer_transport **out,
                               td_err *err);
// Parses "drop=0.05,delay=0.01,delay_ms=200,truncate=0.01,corrupt=0.01,seed=7" (the
// TANDEM_XFER_FAULTS environment variable and `serve --kv-faults`). TD_ERR_INVALID names the bad key.
td_status td_xfer_fault_parse(const char *spec, td_xfer_fault_params *out, td_err *err);

// Generic dispatch (same contracts as the vt entries).
td_status td_xfer_listen(td_xfer_transport *t, const char *host, int port, td_xfer_listener **out, char *endpoint,
                         size_t cap, td_err *err);
td_status td_xfer_accept(td_xfer_listener *l, int timeout_ms, td_xfer_conn **out, td_err *err);
void td_xfer_listener_close(td_xfer_listener *l);
td_status td_xfer_connect(td_xfer_transport *t, const char *endpoint, int timeout_ms, td_xfer_conn **out,
                          td_err *err);
td_status td_xfer_send(td_xfer_conn *c, const void *const *bufs, const size_t *lens, int n, int timeout_ms,
                       td_err *err);
td_status td_xfer_recv(td_xfer_conn *c, void *buf, size_t n, int timeout_ms, td_err *err);
void td_xfer_shutdown(td_xfer_conn *c);
void td_xfer_close(td_xfer_conn *c);
void td_xfer_destroy(td_xfer_transport *t);

// ---- Framing (xfer.c): typed messages over any transport.

#define TD_XFER_MAGIC 0x54445846u  // "TDXF"
#define TD_XFER_VERSION 1          // wire format version, in the header and the compat record

typedef enum td_xfer_msg_type {
    TD_XFER_HELLO = 1,   // payload: td_xfer_compat (the connecting side's)
    TD_XFER_HELLO_OK,    // payload: td_xfer_compat (the accepting side's); the pair is compatible
    TD_XFER_REFUSE,      // payload: UTF-8 reason naming the mismatch or the failure; ends the exchange
    TD_XFER_REQUEST,     // payload: defined by the user of the framing (disaggregated serving)
    TD_XFER_DATA,        // payload: bytes of a transfer (e.g. one layer's K and V of some blocks)
    TD_XFER_DONE,        // payload: the transfer's trailer (e.g. first token and its logprobs)
    TD_XFER_CANCEL,      // payload: optional reason; the transfer id is abandoned by the sender
    TD_XFER_ACK,         // payload: optional
} td_xfer_msg_type;

// On the wire, little-endian, 32 bytes, then `len` payload bytes.
typedef struct td_xfer_hdr {
    uint32_t magic;     // TD_XFER_MAGIC
    uint16_t version;   // TD_XFER_VERSION
    uint16_t type;      // td_xfer_msg_type
    uint64_t xfer_id;   // the transfer this message belongs to (0 for HELLO/HELLO_OK)
    uint64_t len;       // payload bytes (<= the receiver's max_payload)
    uint64_t checksum;  // XXH64(payload, len, seed = xfer_id)
} td_xfer_hdr;

// Sends one message (header + payload as one transport send). TD_ERR_INVALID for a bad type.
td_status td_xfer_send_msg(td_xfer_conn *c, td_xfer_msg_type type, uint64_t xfer_id, const void *payload, size_t len,
                           int timeout_ms, td_err *err);
// The same with the payload in pieces (e.g. a small sub-header and the bytes of KV rows, unjoined).
td_status td_xfer_send_msgv(td_xfer_conn *c, td_xfer_msg_type type, uint64_t xfer_id, const void *const *bufs,
                            const size_t *lens, int n, int timeout_ms, td_err *err);
// Receives one message: its header into *h and its payload into buf (cap bytes). The header and
// payload are checked: TD_ERR_FORMAT for a bad magic, version or type, a length over cap (the
// message names both) or a checksum mismatch (names the id); TD_ERR_IO / TD_ERR_TIMEOUT as recv.
// After any error the connection is unusable (the stream position is lost).
td_status td_xfer_recv_msg(td_xfer_conn *c, td_xfer_hdr *h, void *buf, size_t cap, int timeout_ms, td_err *err);

// ---- Compatibility record and handshake.

typedef struct td_xfer_compat {
    uint32_t version;       // TD_XFER_VERSION
    uint32_t kv_layout;     // 1: the paged pool's layout (per layer, per block: K then V rows of
                            //   block_size x n_kv_heads x head_dim elements)
    uint64_t model_hash;    // identifies the weights (and weights version): equal hash, same KV
    uint32_t kv_dtype;      // td_dtype of the KV cache
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t block_size;    // tokens per KV block
    uint32_t reserved;
    char model_name[64];    // for messages only (NUL-terminated)
} td_xfer_compat;

// Writes "" into why and returns true when a and b can exchange KV; otherwise names the first
// mismatching field with both values (e.g. "kv_dtype: f16 here, bf16 on the peer").
bool td_xfer_compat_check(const td_xfer_compat *here, const td_xfer_compat *peer, char *why, size_t cap);

// Client side: sends HELLO(mine) and waits for HELLO_OK(peer) or REFUSE. Refused or incompatible:
// TD_ERR_INVALID with the reason (a REFUSE's text, or td_xfer_compat_check's).
td_status td_xfer_handshake_connect(td_xfer_conn *c, const td_xfer_compat *mine, td_xfer_compat *peer, int timeout_ms,
                                    td_err *err);
// Server side: waits for HELLO, checks it against mine, answers HELLO_OK or REFUSE(reason).
// Mismatch: TD_ERR_INVALID with the reason (after sending the REFUSE).
td_status td_xfer_handshake_accept(td_xfer_conn *c, const td_xfer_compat *mine, td_xfer_compat *peer, int timeout_ms,
                                   td_err *err);

#endif
