/*
 * eviction.cpp — which resident expert leaves when a slot is needed.
 *
 * "Which Expert Misses Are Worth Waiting For?" compares LRU with frequency-based eviction
 * (exponentially decayed use counts). Both are deterministic:
 *   LRU       victim = smallest last_use (the LRU clock ticks once per use, so no ties among
 *             used experts); ties (never used) by lower expert id.
 *   FREQUENCY victim = smallest decayed count of router selections; ties by LRU, then id.
 * An expert pinned by the current route call (used by one of its tokens) is never a victim.
 *
 * Lazy decay: a count is decayed only when the expert is selected again,
 *   f <- f * 2^(-(t - t_f) / h) + 1,  t_f <- t.
 * Counts decayed to a common time t compare like log2(f) + t_f / h (the factor 2^(-t/h) is
 * shared), so that key is stored and compared: no exponentials on the eviction path.
 */
#include "moecache_internal.h"

#include <cmath>

namespace moecache_core {

namespace {

constexpr double kNeverSelected = -1e300;

bool evicts_before_lru(const LayerState & L, int32_t a, int32_t b) {
    if (L.last_use[a] != L.last_use[b]) {
        return L.last_use[a] < L.last_use[b];
    }
    return a < b;
}

bool evicts_before_frequency(const LayerState & L, int32_t a, int32_t b) {
    if (L.freq_key[a] != L.freq_key[b]) {
        return L.freq_key[a] < L.freq_key[b];
    }
    return evicts_before_lru(L, a, b);
}

}  // namespace

int32_t pick_victim(const moecache & c, const LayerState & L, int64_t pin_epoch) {
    const bool by_frequency = c.policy.eviction == MOECACHE_EVICT_FREQUENCY;
    const std::vector<int64_t> & pin = c.scratch.pin;
    int32_t best = -1;
    for (const int32_t e : L.expert_of) {
        if (e < 0 || pin[e] == pin_epoch) {
            continue;
        }
        if (best < 0 || (by_frequency ? evicts_before_frequency(L, e, best)
                                      : evicts_before_lru(L, e, best))) {
            best = e;
        }
    }
    return best;
}

void record_selection(LayerState & L, int32_t expert, int64_t step, float half_life) {
    const double h = static_cast<double>(half_life);
    const double age = static_cast<double>(step - L.freq_step[expert]);
    const double f = L.freq[expert] * std::exp2(-age / h) + 1.0;
    L.freq[expert] = f;
    L.freq_step[expert] = step;
    L.freq_key[expert] = std::log2(f) + static_cast<double>(step) / h;
}

void refresh_frequency_keys(LayerState & L, float half_life) {
    const double h = static_cast<double>(half_life);
    const size_t n = L.freq.size();
    for (size_t e = 0; e < n; ++e) {
        L.freq_key[e] = L.freq[e] > 0.0
                            ? std::log2(L.freq[e]) + static_cast<double>(L.freq_step[e]) / h
                            : kNeverSelected;
    }
}

}  // namespace moecache_core
