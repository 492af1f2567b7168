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

// State for n_params elements (m and v zeroed, step 0). *out owned by the caller (td_adamw_free).
td_status td_adamw_create(size_t n_params, const td_adamw_params *p, td_adamw **out, td_err *err);
void td_adamw_free(td_adamw *o);  // NULL is fine

// One update of every tensor (views into the same layout as m and v) with learning rate lr;
// increments the step first (bias correction uses t = step after the increment). The update runs
// on be's adamw slot (borrowed, not NULL; a host backend: tensors, m and v are host memory), one
// call per tensor; the values do not depend on the backend's slice count.
void td_adamw_update(td_adamw *o, const td_tparam *tensors, int n_tensors, float lr,
                     td_backend *be);

// State access for checkpoints: m, v ([n_params] each) and the step count.
float *td_adamw_m(td_adamw *o);
float *td_adamw_v(td_adamw *o);
size_t td_adamw_size(const td_adamw *o);
long td_adamw_step_count(const td_adamw *o);
void td_adamw_set_step_count(td_adamw *o, long step);

#endif
