// Kernel-set registry: the reference table and the run-time switch (TANDEM_KERNELS).
#include "kernels/kernels.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/ref/ref.h"

const td_kernels td_kernels_ref = {
    .name = "ref",
    .matmul = td_ref_matmul,
    .rmsnorm = td_ref_rmsnorm,
    .rope = td_ref_rope,
    .kv_write = td_ref_kv_write,
    .attention = td_ref_attention,
    .silu_mul = td_ref_silu_mul,
    .embed = td_ref_embed,
    .add = td_ref_add,
};

const td_kernels *td_kernels_get(const char *name) {
    if (!name) name = getenv("TANDEM_KERNELS");
    if (!name || !*name || !strcmp(name, "auto")) return &td_kernels_ref;  // the best: only ref so far
    if (!strcmp(name, "ref")) return &td_kernels_ref;
    return NULL;
}
