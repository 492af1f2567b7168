// AdamW (decoupled weight decay, bias correction) over a model's parameter buffer: m and v live
// in two buffers with the parameter buffer's layout. Decay applies only to tensors marked decay
// (matrices, embeddings), never to norms and biases. Per element, as torch.optim.AdamW does it:
//   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// Not here: clipping and the schedule (trainer.h, lr.h).
#ifndef TD_TRAIN_ADAMW_H
#define TD_TRAIN_ADAMW_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/status.h"
#include "train/model_train.h"

typedef struct td_adamw_params {
    float beta1, beta2;  // 0.9, 0.95 by default
    float eps;           // 1e-8
    float weight_decay;  // 0.1
} td_adamw_params;

td_adamw_params td_adamw_default_params(void);

typedef struct td_adamw td_adamw;

// State for n_params elements (m and v zeroed, step 0) in host memory. *out owned by the caller
// (td_adamw_free).
td_status td_adamw_create(size_t n_params, const td_adamw_params *p, td_adamw **out, td_err *err);
// The same with m and v in be's buffers (one td_backend_alloc of 2 x n_params floats; be
// borrowed, outliving the state), and, when be is not a host backend, a host mirror of them of
// the same size (the host view below). be NULL: td_adamw_create.
td_status td_adamw_create_on(td_backend *be, size_t n_params, const td_adamw_params *p, td_adamw **out,
                             td_err *err);
void td_adamw_free(td_adamw *o);  // NULL is fine

// One update of every tensor (views into the same layout as m and v) with learning rate lr;
// increments the step first (bias correction uses t = step after the increment). The update runs
// on be's adamw slot (borrowed, not NULL; the tensors' data/grad and the state in its memory),
// one call per tensor; the values do not depend on the backend's slice count.
void td_adamw_update(td_adamw *o, const td_tparam *tensors, int n_tensors, float lr,
                     td_backend *be);

// The same step over arbitrary segments instead of whole tensors: a ZeRO shard's pieces. Segment
// i updates w[0, n) from g[0, n) with m and v at [state_off, state_off + n) of this state (whose
// size is then the shard's, not the model's); decay per segment (a segment lies in one tensor).
typedef struct td_adamw_seg {
    float *w;
    const float *g;
    size_t state_off;  // elements into m and v
    int64_t n;
    int decay;
} td_adamw_seg;
void td_adamw_update_segs(td_adamw *o, const td_adamw_seg *segs, int n_segs, float lr, td_backend *be);

// m and v ([n_params] each) where the update reads them: host arrays for td_adamw_create or a
// host backend, the backend's addresses otherwise.
float *td_adamw_m(td_adamw *o);
float *td_adamw_v(td_adamw *o);
// The host view for checkpoints: host arrays [n_params] each. Where m and v are host memory they
// are the state itself and the sync calls do nothing; otherwise the mirror, which
// td_adamw_state_to_host fills from the backend (synchronously) and td_adamw_state_from_host
// uploads (after a restore wrote it).
float *td_adamw_host_m(td_adamw *o);
float *td_adamw_host_v(td_adamw *o);
void td_adamw_state_to_host(td_adamw *o);
void td_adamw_state_from_host(td_adamw *o);
size_t td_adamw_size(const td_adamw *o);
long td_adamw_step_count(const td_adamw *o);
void td_adamw_set_step_count(td_adamw *o, long step);

#endif
