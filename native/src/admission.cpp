/*
 * admission.cpp — background admission.
 *
 * "Which Expert Misses Are Worth Waiting For?": a substituted expert is not fetched, so
 * without help a frequently wanted expert could stay out of the cache forever. Each
 * (layer, expert) accumulates the normalized gate mass it lost to substitution; when the
 * sum reaches beta (0.5) the expert is admitted off the critical path: an ASYNC copy-plan
 * entry into a free or evicted slot. It counts as resident at once (logical cache, paper 2)
 * and its accumulator restarts from zero (as on any insertion).
 *
 * Admissions run after every token of the route call has been decided, in token then
 * router order, so they never take a slot a fetch of the same call needed, and they never
 * evict an expert the call uses. With every slot pinned the admission waits for a later
 * call, keeping its accumulated mass.
 */
#include "moecache_internal.h"

namespace moecache_core {

void admit_lost_mass(moecache & c, LayerState & L, int32_t layer, int32_t n_tokens,
                     const int32_t * ids, moecache_copy * plan, int32_t * n_plan) {
    Scratch & sc = c.scratch;
    const int32_t k = c.top_k;
    const int64_t pin_epoch = sc.pin_epoch;
    for (int32_t t = 0; t < n_tokens; ++t) {
        sc.n_admitted[t] = 0;
        sc.n_admit_disk[t] = 0;
        if (!c.policy.admission) {
            continue;
        }
        for (int32_t j = 0; j < k; ++j) {
            const int32_t i = t * k + j;
            if (sc.action[i] != MOECACHE_SUBSTITUTE) {
                continue;
            }
            const int32_t e = ids[i];
            if (L.slot_of[e] >= 0) {
                continue; /* admitted earlier in this call */
            }
            L.lost_mass[e] += sc.wnorm[i];
            if (L.lost_mass[e] < c.policy.beta) {
                continue;
            }
            int32_t victim = -1;
            RamFill fill;
            if (insert_background(c, L, layer, e, pin_epoch, false, plan, n_plan, &victim,
                                  &fill) < 0) {
                continue;
            }
            sc.n_admit_disk[t] += fill.from_disk;
            const int32_t a = t * k + sc.n_admitted[t];
            sc.admitted[a] = e;
            sc.admit_evicted[a] = victim;
            sc.n_admitted[t] += 1;
        }
    }
}

}  // namespace moecache_core
