/*
 * prefetch.cpp — PSR: bring the next layer's predicted experts in before it routes.
 *
 * "Prefetch-Steered Routing" (paper 2) applies layer l+1's router to layer l's hidden state,
 * inserts a bounded number of the predicted experts into the LOGICAL cache and schedules
 * their copies separately, so the copy overlaps layer l's computation and, with the routing
 * bonus, the prediction steers routing towards experts that are (or soon will be) present.
 * The insertion is a decision like any other: it depends only on the scores and the logical
 * cache, never on when the copies land, so outputs stay repeatable.
 *
 * Per token, the top policy.prefetch experts by score (ties: lower id) are predicted. Those
 * already resident are pinned (kept); the others take the lowest free slot or evict by the
 * eviction rule, in token then rank order, and never evict another predicted expert. The
 * first route that computes a prefetched expert (a hit, or as a substitute) before it is
 * evicted counts a prefetch hit: prefetch accuracy = prefetch_hits / prefetches.
 */
#include "moecache_internal.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace moecache_core {

/* A score as an unsigned key whose order is the scores' descending order: NaN as -inf (it
 * ranks last, so a broken score can never displace a real prediction), -0 as +0. In the
 * integers only, so no floating-point flag of a build can fold the NaN or zero tests. */
static inline uint32_t descending_key(float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    const uint32_t mag = u & 0x7FFFFFFFu;
    u = mag > 0x7F800000u ? 0xFF800000u : u; /* NaN -> -inf */
    u = mag == 0 ? 0u : u;                  /* -0 -> +0: equal scores, equal keys */
    /* ascending as the floats, without a branch on the sign (a coin toss per score) */
    u ^= static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u;
    return ~u; /* descending */
}

void rank_scores(const float * row, int32_t n, int32_t keep, uint64_t * keys, int32_t * out) {
    keep = std::min(keep, n);
    if (keep <= 0) {
        return;
    }
    /* (score descending, id ascending) is one total order, kept as keys ascending: the
     * best `keep` so far, sorted, each later key inserted only if it beats the last of them.
     * On a row of random scores a selection (nth_element) mispredicts about every other
     * comparison; this test mostly is not taken (measured: 48 rows of 512, top 32, 4.8 ->
     * 2.8 us a row with the branch-free keys; testing eight keys at a time was slower) */
    int32_t m = 0;
    for (int32_t e = 0; e < n; ++e) {
        const uint64_t key =
            (static_cast<uint64_t>(descending_key(row[e])) << 32) | static_cast<uint32_t>(e);
        if (m == keep) {
            if (key >= keys[keep - 1]) {
                continue;
            }
            --m; /* the last one drops out */
        }
        int32_t at = m++;
        for (; at > 0 && keys[at - 1] > key; --at) {
            keys[at] = keys[at - 1];
        }
        keys[at] = key;
    }
    for (int32_t j = 0; j < keep; ++j) {
        out[j] = static_cast<int32_t>(keys[j] & 0xFFFFFFFFu);
    }
}

int32_t prefetch_per_token(const moecache & c) {
    const int32_t want = c.policy.prefetch == MOECACHE_PREFETCH_TOP_K ? c.top_k : c.policy.prefetch;
    return std::min({want, c.n_experts, c.slots});
}

namespace {

/* One token's predictions, best first: the resident ones are pinned before any insertion can
 * evict them, then the others enter in rank order. False when every slot holds a
 * prediction (the rest are dropped). */
bool insert_predictions(moecache & c, LayerState & L, int32_t layer, const int32_t * chosen,
                        int32_t per_token, int64_t pin_epoch, moecache_copy * plan,
                        int32_t * n_plan) {
    Scratch & sc = c.scratch;
    for (int32_t j = 0; j < per_token; ++j) {
        if (L.slot_of[chosen[j]] >= 0) {
            sc.pin[chosen[j]] = pin_epoch;
        }
    }
    for (int32_t j = 0; j < per_token; ++j) {
        const int32_t e = chosen[j];
        if (L.slot_of[e] >= 0) {
            continue;
        }
        int32_t victim = -1;
        if (insert_background(c, L, layer, e, pin_epoch, true, plan, n_plan, &victim, nullptr,
                              per_token - j) < 0) {
            return false;
        }
        L.stats.prefetches += 1;
        L.stats.bytes_async += L.expert_bytes;
        L.stats.evictions += victim >= 0;
    }
    return true;
}

}  // namespace

int32_t prefetch(moecache & c, int32_t layer, int32_t n_tokens, const float * scores,
                 moecache_copy * plan, int32_t plan_cap, int32_t * n_plan) {
    if (layer < 0 || layer >= c.n_layers || n_tokens < 0 || n_plan == nullptr) {
        return MOECACHE_E_ARG;
    }
    const int32_t per_token = prefetch_per_token(c);
    if (per_token <= 0 || n_tokens == 0) {
        *n_plan = 0;
        return MOECACHE_OK;
    }
    if (scores == nullptr) {
        return MOECACHE_E_ARG;
    }
    const int64_t wanted = static_cast<int64_t>(n_tokens) * per_token;
    const int32_t plan_needed = static_cast<int32_t>(std::min<int64_t>(c.slots, wanted));
    if (plan_cap < plan_needed || plan == nullptr) {
        return MOECACHE_E_PLAN_CAP;
    }
    *n_plan = 0;
    LayerState & L = c.layers[layer];
    Scratch & sc = c.scratch;
    sc.reserve(c.n_experts, n_tokens, c.top_k);
    const int64_t pin_epoch = ++sc.pin_epoch;

    std::vector<int32_t> & ranked = sc.ranked;
    std::vector<uint64_t> & keys = sc.rank_keys;
    for (int32_t t = 0; t < n_tokens; ++t) {
        const float * row = scores + static_cast<int64_t>(t) * c.n_experts;
        rank_scores(row, c.n_experts, per_token, keys.data(), ranked.data());
        if (!insert_predictions(c, L, layer, ranked.data(), per_token, pin_epoch, plan, n_plan)) {
            return MOECACHE_OK; /* every slot holds a prediction: enough */
        }
    }
    return MOECACHE_OK;
}

/* prefetch for one token whose scores rank `ranked[0..count)` first, in that order, and
 * every other expert equal below them (what the batch replay has: a recorded ranking), so
 * the top per_token are read off the ranking instead of sorted out of n_experts scores.
 * False when the ranking is not `count` distinct experts: the caller scores it instead. */
bool prefetch_ranked(moecache & c, int32_t layer, const int32_t * ranked, int32_t count,
                     moecache_copy * plan, int32_t plan_cap, int32_t * n_plan) {
    *n_plan = 0;
    const int32_t per_token = prefetch_per_token(c);
    if (per_token <= 0) {
        return true;
    }
    if (plan_cap < per_token || plan == nullptr || layer < 0 || layer >= c.n_layers) {
        return false;
    }
    Scratch & sc = c.scratch;
    sc.reserve(c.n_experts, 1, c.top_k);
    const int64_t mark = ++sc.token_epoch;
    for (int32_t j = 0; j < count; ++j) {
        const int32_t e = ranked[j];
        if (e < 0 || e >= c.n_experts || sc.token_mark[e] == mark) {
            return false;
        }
        sc.token_mark[e] = mark;
    }
    std::vector<int32_t> & chosen = sc.ranked;
    int32_t n = 0;
    for (; n < per_token && n < count; ++n) {
        chosen[n] = ranked[n];
    }
    for (int32_t e = 0; n < per_token && e < c.n_experts; ++e) {
        if (sc.token_mark[e] != mark) {
            chosen[n++] = e; /* the unranked ones tie: lower id first */
        }
    }
    const int64_t pin_epoch = ++sc.pin_epoch;
    insert_predictions(c, c.layers[layer], layer, chosen.data(), per_token, pin_epoch, plan,
                       n_plan);
    return true;
}

}  // namespace moecache_core
