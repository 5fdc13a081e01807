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

#include <algorithm>
#include <cmath>
#include <cstdlib>

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

/* The reference: a scan of every slot per victim (what pick_victim must equal). */
int32_t pick_victim_scan(const moecache & c, const LayerState & L, int64_t pin_epoch) {
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

namespace {

/* One scan of the layer's residents, less those `skip` names: the first `depth` of them in
 * frequency eviction order into ids (insertion into a sorted prefix); returns how many. */
template <class Skip>
int32_t frequency_order(const LayerState & L, int32_t depth, int32_t * ids, Skip skip) {
    int32_t n = 0;
    for (const int32_t e : L.expert_of) {
        if (e < 0 || skip(e) ||
            (n == depth && !evicts_before_frequency(L, e, ids[depth - 1]))) {
            continue;
        }
        int32_t at = n < depth ? n++ : depth - 1;
        while (at > 0 && evicts_before_frequency(L, e, ids[at - 1])) {
            ids[at] = ids[at - 1];
            --at;
        }
        ids[at] = e;
    }
    return n;
}

/* One scan: the layer's first LayerState::kFreqDepth residents in frequency eviction order
 * (pinned ones too: pins last one call, the order outlives it). */
void build_freq_order(LayerState & L) {
    constexpr int32_t depth = LayerState::kFreqDepth;
    int32_t * ids = L.fq_ids;
    for (int32_t i = 0; i < L.fq_n; ++i) {
        L.fq_in[ids[i]] = 0;
    }
    const int32_t n = frequency_order(L, depth, ids, [](int32_t) { return false; });
    for (int32_t i = 0; i < n; ++i) {
        L.fq_in[ids[i]] = 1;
    }
    L.fq_n = n;
    L.fq_complete = L.n_resident <= depth;
    L.fq_valid = true;
}

/* One scan: the first `depth` unpinned residents in frequency eviction order. */
int32_t scan_victims(const LayerState & L, const std::vector<int64_t> & pin, int64_t pin_epoch,
                     int32_t depth, int32_t * ids) {
    return frequency_order(L, depth, ids, [&](int32_t e) { return pin[e] == pin_epoch; });
}

/* A small layer's next victim: the call's queue, scanned again when it runs out. */
int32_t next_victim_small(moecache & c, const LayerState & L, int64_t pin_epoch, int32_t more) {
    const std::vector<int64_t> & pin = c.scratch.pin;
    VictimQueue & q = c.scratch.victims;
    if (q.layer == &L && q.epoch == pin_epoch) {
        while (q.at < q.n) {
            const int32_t e = q.ids[q.at++];
            if (L.slot_of[e] >= 0 && pin[e] != pin_epoch) {
                return e;
            }
        }
        if (q.n < q.depth) {
            return -1; /* the scan saw every unpinned resident: none is left */
        }
    }
    q.layer = &L;
    q.epoch = pin_epoch;
    q.at = 0;
    q.depth = std::max(1, std::min(more, VictimQueue::kDepth));
    q.n = scan_victims(L, pin, pin_epoch, q.depth, q.ids);
    if (q.n == 0) {
        return -1;
    }
    q.at = 1;
    return q.ids[0];
}

int32_t next_victim(moecache & c, LayerState & L, int64_t pin_epoch, int32_t more) {
    const std::vector<int64_t> & pin = c.scratch.pin;
    if (c.policy.eviction != MOECACHE_EVICT_FREQUENCY) {
        for (int32_t e = L.lru_head; e >= 0; e = L.lru_next[e]) {
            if (pin[e] != pin_epoch) {
                return e;
            }
        }
        return -1;
    }
    if (static_cast<int32_t>(L.expert_of.size()) <= LayerState::kFreqDepth) {
        /* a layer this small is scanned faster than its order is kept (every resident
         * would be in the order, and every change of one would move it) */
        return next_victim_small(c, L, pin_epoch, more);
    }
    if (!L.fq_valid) {
        build_freq_order(L);
    }
    for (int32_t i = 0; i < L.fq_n; ++i) {
        if (pin[L.fq_ids[i]] != pin_epoch) {
            return L.fq_ids[i];
        }
    }
    /* every resident the order holds is pinned: the rest are after them, so scan those */
    return L.fq_complete ? -1 : pick_victim_scan(c, L, pin_epoch);
}

}  // namespace

void freq_order_insert(LayerState & L, int32_t expert) {
    if (!L.fq_valid) {
        return;
    }
    int32_t * ids = L.fq_ids;
    int32_t n = L.fq_n;
    if (!L.fq_complete && !evicts_before_frequency(L, expert, ids[n - 1])) {
        return; /* after the last kept: the order's promise holds */
    }
    int32_t at = 0; /* how many evict before it: a binary search of the kept order */
    for (int32_t hi = n; at < hi;) {
        const int32_t mid = (at + hi) / 2;
        if (evicts_before_frequency(L, expert, ids[mid])) {
            hi = mid;
        } else {
            at = mid + 1;
        }
    }
    if (n == LayerState::kFreqDepth) { /* the last kept drops out, after all the others */
        L.fq_in[ids[n - 1]] = 0;
        L.fq_complete = false;
        --n;
    }
    for (int32_t i = n; i > at; --i) {
        ids[i] = ids[i - 1];
    }
    ids[at] = expert;
    L.fq_in[expert] = 1;
    L.fq_n = n + 1;
}

void freq_order_erase(LayerState & L, int32_t expert) {
    if (!L.fq_valid || !L.fq_in[expert]) {
        return;
    }
    int32_t * ids = L.fq_ids;
    int32_t i = 0;
    while (ids[i] != expert) {
        ++i;
    }
    for (; i + 1 < L.fq_n; ++i) {
        ids[i] = ids[i + 1];
    }
    L.fq_n -= 1;
    L.fq_in[expert] = 0;
    if (L.fq_n == 0 && !L.fq_complete) {
        L.fq_valid = false; /* nothing known: the next victim scans */
    }
}

/* `more`: how many victims the caller expects to need in this call, this one included (a
 * hint: a small layer's one scan keeps that many). */
int32_t pick_victim(moecache & c, LayerState & L, int64_t pin_epoch, int32_t more) {
    const int32_t v = next_victim(c, L, pin_epoch, more);
#ifdef MOECACHE_SELFCHECK
    if (v != pick_victim_scan(c, L, pin_epoch)) {
        std::abort();
    }
#endif
    return v;
}

void record_selection(LayerState & L, int32_t expert, int64_t step, float half_life) {
    const double h = static_cast<double>(half_life);
    const double age = static_cast<double>(step - L.freq_step[expert]);
    const double f = L.freq[expert] * std::exp2(-age / h) + 1.0;
    L.freq[expert] = f;
    L.freq_step[expert] = step;
    L.freq_key[expert] = std::log2(f) + static_cast<double>(step) / h;
}

/* The same, with the decay factors of small ages memoized (the same expression, so the same
 * doubles). */
void record_selection(LayerState & L, int32_t expert, int64_t step, float half_life,
                      Scratch & sc) {
    constexpr int64_t kTable = 4096;
    const int64_t a = step - L.freq_step[expert];
    if (a < 0 || a >= kTable) {
        record_selection(L, expert, step, half_life);
        return;
    }
    const double h = static_cast<double>(half_life);
    if (sc.decay_h != half_life || sc.decay.empty()) {
        sc.decay.resize(kTable);
        for (int64_t i = 0; i < kTable; ++i) {
            sc.decay[static_cast<size_t>(i)] = std::exp2(-static_cast<double>(i) / h);
        }
        sc.decay_h = half_life;
    }
    const double f = L.freq[expert] * sc.decay[static_cast<size_t>(a)] + 1.0;
    L.freq[expert] = f;
    L.freq_step[expert] = step;
    L.freq_key[expert] = std::log2(f) + static_cast<double>(step) / h;
}

void refresh_frequency_keys(LayerState & L, float half_life) {
    L.fq_valid = false;
    const double h = static_cast<double>(half_life);
    const size_t n = L.freq.size();
    for (size_t e = 0; e < n; ++e) {
        L.freq_key[e] = L.freq[e] > 0.0
                            ? std::log2(L.freq[e]) + static_cast<double>(L.freq_step[e]) / h
                            : kNeverSelected;
    }
}

}  // namespace moecache_core
