// Which kernel semantics a test should expect: the set `auto` picks on this CPU (td_kernels_get(NULL)
// with TANDEM_KERNELS unset) and the best exact set, for tests that pin exactness. Header-only test
// helper; not a kernel registry (src/kernels/kernels.c is).
#ifndef TD_TEST_KERNEL_CHOICE_H
#define TD_TEST_KERNEL_CHOICE_H

#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

// The int8/bf16-activation set's name (docs/kernels.md): Q8_0/Q4_0/BF16 matmuls round activations.
#define TK_INT8_SET "avx512-int8"

// 1 if the set the forward will use (TANDEM_KERNELS, else auto) rounds activations: avx512-int8,
// and the AMX sets, which round them exactly as it does (docs/kernels.md, "AMX").
static inline int tk_rounds_activations(void) {
    const td_kernels *k = td_kernels_get(NULL);
    return k && (!strcmp(k->name, TK_INT8_SET) || !strcmp(k->name, "amx") || !strcmp(k->name, "amx-emu"));
}

// The fastest set this CPU runs that matches the reference kernels up to f32 summation order.
static inline const char *tk_exact_set(void) {
    static const char *const exact[] = {"avx512", "avx2"};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
        if (td_kernels_available(exact[i])) return exact[i];
    return "ref";
}

// For tests about exactness (a forward against a float64 reference at 1e-4, conversions whose
// weights are identical): if the set in force rounds activations, force the best exact set through
// TANDEM_KERNELS (inherited by `tandem` subprocesses); an exact choice already made is kept.
// Returns the set now in force.
static inline const char *tk_pin_exact(void) {
    if (tk_rounds_activations()) setenv("TANDEM_KERNELS", tk_exact_set(), 1);
    const td_kernels *k = td_kernels_get(NULL);
    return k ? k->name : "(none)";
}

#endif
