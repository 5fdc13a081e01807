/*
 * audit.cpp — moecache_audit_route: the exact route of an audited token, read-only.
 *
 * An audit computes a token's output as if every miss were fetched, beside the policy's own
 * pass, to measure what substitution costs (KL of the two distributions). It must leave the
 * policy's run untouched, so this reads the logical cache and changes nothing: no eviction,
 * admission, recency, frequency, accumulator, stats, event row or step. Misses go to scratch
 * slots numbered from the cache's slot count, which the caller holds outside the cache.
 */
#include "moecache_internal.h"

namespace {

using Lock = std::lock_guard<std::mutex>;

}  // namespace

int32_t moecache_audit_route(const moecache * c, int32_t layer, int32_t n_tokens,
                             const int32_t * ids, int32_t * out_slots, moecache_copy * plan,
                             int32_t plan_cap, int32_t * n_plan) {
    if (c == nullptr || ids == nullptr || out_slots == nullptr || n_plan == nullptr ||
        n_tokens < 1 || (plan == nullptr && plan_cap != 0)) {
        return MOECACHE_E_ARG;
    }
    Lock lock(c->mutex);
    if (layer < 0 || layer >= c->n_layers) {
        return MOECACHE_E_ARG;
    }
    const int32_t k = c->top_k;
    const int64_t total = static_cast<int64_t>(n_tokens) * k;
    for (int64_t i = 0; i < total; ++i) {
        if (ids[i] < 0 || ids[i] >= c->n_experts) {
            return MOECACHE_E_ARG;
        }
    }
    const moecache_core::LayerState & L = c->layers[static_cast<size_t>(layer)];
    const bool ram = moecache_core::ram_on(L);
    /* one scratch slot per distinct missing expert of the call */
    int32_t n = 0;
    for (int64_t i = 0; i < total; ++i) {
        const int32_t e = ids[i];
        const int32_t s = L.slot_of[static_cast<size_t>(e)];
        if (s >= 0) {
            out_slots[i] = s;
            continue;
        }
        int32_t found = -1;
        for (int32_t j = 0; j < n; ++j) {
            if (plan[j].expert == e) {
                found = plan[j].slot;
                break;
            }
        }
        if (found >= 0) {
            out_slots[i] = found;
            continue;
        }
        if (n >= plan_cap) {
            return MOECACHE_E_PLAN_CAP;
        }
        moecache_copy & cp = plan[n];
        cp.layer = layer;
        cp.expert = e;
        cp.slot = c->slots + n;
        cp.async = 0;
        cp.ram_slot = ram ? L.ram_slot_of[static_cast<size_t>(e)] : -1;
        cp.from_disk = ram && cp.ram_slot < 0 ? 1 : 0;
        out_slots[i] = cp.slot;
        n++;
    }
    *n_plan = n;
    return MOECACHE_OK;
}
