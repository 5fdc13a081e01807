/*
 * rules.cpp — miss rules, substitution and the named policies.
 *
 * "Which Expert Misses Are Worth Waiting For?" decides, per routed expert that is not
 * resident (a miss), whether to wait for it (fetch) or to substitute a resident expert:
 *   fetch-every-miss  exact output;
 *   0.15 rule         fetch the router's first choice, and any miss whose normalized gate
 *                     weight w_i / sum_j w_j (over the top-k) is >= theta (0.15);
 *   first-choice      fetch only a missing first choice;
 *   substitute-all    the reference for what substituting everything costs.
 * "Prefetch-Steered Routing" (paper 2) adds the Cache-Prior routing bonus: resident experts'
 * gate weights count bonus more, so a miss gives way to a resident expert that is nearly as
 * probable (route.cpp).
 * A substitute is the resident expert with the highest router probability for the token
 * that the token does not already compute; it takes the missing expert's gate weight.
 */
#include "moecache_internal.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

namespace moecache_core {

bool policy_valid(const moecache_policy & p) {
    const bool rule_ok = p.miss_rule >= MOECACHE_FETCH_ALL && p.miss_rule <= MOECACHE_ROUTING_BONUS;
    const bool evict_ok = p.eviction == MOECACHE_EVICT_LRU || p.eviction == MOECACHE_EVICT_FREQUENCY;
    const bool subw_ok =
        p.substitute_weight == MOECACHE_SUBW_MISSING || p.substitute_weight == MOECACHE_SUBW_OWN;
    const bool admission_ok = p.admission == 0 || p.admission == 1;
    const bool fill_ok = p.fill_free == 0 || p.fill_free == 1;
    const bool theta_ok = std::isfinite(p.theta) && p.theta >= 0.0f && p.theta <= 1.0f;
    const bool half_life_ok = std::isfinite(p.half_life) && p.half_life > 0.0f;
    const bool beta_ok = std::isfinite(p.beta) && p.beta > 0.0f;
    const bool bonus_ok = std::isfinite(p.bonus) && p.bonus >= 0.0f;
    const bool prefetch_ok = p.prefetch >= MOECACHE_PREFETCH_TOP_K;
    const bool theta_disk_ok = p.theta_disk == MOECACHE_THETA_DISK_AS_THETA ||
                               (std::isfinite(p.theta_disk) && p.theta_disk >= 0.0f &&
                                p.theta_disk <= 1.0f);
    return rule_ok && evict_ok && subw_ok && admission_ok && theta_ok && half_life_ok && beta_ok &&
           bonus_ok && prefetch_ok && theta_disk_ok && fill_ok;
}

/* The presets. Quality-first and speed-first are paper 1's recommended operating points;
 * cache-prior and psr are paper 2's routing bonus without and with prefetch, on the same
 * eviction and admission as quality-first so that only the routing differs; the bare rules
 * use LRU and no admission so they isolate the rule itself. */
int32_t preset(const char * name, moecache_policy * out) {
    if (name == nullptr || out == nullptr) {
        return MOECACHE_E_ARG;
    }
    moecache_policy p{};
    p.miss_rule = MOECACHE_FETCH_ALL;
    p.theta = MOECACHE_DEFAULT_THETA;
    p.eviction = MOECACHE_EVICT_LRU;
    p.half_life = MOECACHE_DEFAULT_HALF_LIFE;
    p.admission = 0;
    p.beta = MOECACHE_DEFAULT_BETA;
    p.substitute_weight = MOECACHE_SUBW_MISSING;
    p.bonus = MOECACHE_DEFAULT_BONUS;
    p.prefetch = 0;
    p.theta_disk = MOECACHE_THETA_DISK_AS_THETA;
    p.fill_free = 1;
    if (std::strcmp(name, "exact") == 0) {
        /* defaults */
    } else if (std::strcmp(name, "quality-first") == 0) {
        /* disk-only misses at theta too: a separate, higher threshold cost +2-4% perplexity
         * on code (docs/benchmarks.md); Custom can set one */
        p.miss_rule = MOECACHE_THRESHOLD;
        p.eviction = MOECACHE_EVICT_FREQUENCY;
        p.admission = 1;
    } else if (std::strcmp(name, "speed-first") == 0) {
        p.miss_rule = MOECACHE_FIRST_CHOICE;
        p.eviction = MOECACHE_EVICT_FREQUENCY;
        p.admission = 1;
    } else if (std::strcmp(name, "cache-prior") == 0 || std::strcmp(name, "psr") == 0) {
        /* the router chose the substitute, so it computes with its own probability */
        p.miss_rule = MOECACHE_ROUTING_BONUS;
        p.eviction = MOECACHE_EVICT_FREQUENCY;
        p.admission = 1;
        p.substitute_weight = MOECACHE_SUBW_OWN;
        p.prefetch = std::strcmp(name, "psr") == 0 ? MOECACHE_PREFETCH_TOP_K : 0;
    } else if (std::strcmp(name, "substitute-all") == 0) {
        p.miss_rule = MOECACHE_SUBSTITUTE_ALL;
    } else if (std::strcmp(name, "threshold") == 0) {
        p.miss_rule = MOECACHE_THRESHOLD;
    } else if (std::strcmp(name, "first-choice") == 0) {
        p.miss_rule = MOECACHE_FIRST_CHOICE;
    } else {
        return MOECACHE_E_ARG;
    }
    *out = p;
    return MOECACHE_OK;
}

/* The miss rule: true = wait for this missing expert. `rank` is its position in router
 * order (0 = first choice). */
bool miss_rule_fetches(const moecache_policy & p, int32_t rank, float normalized_weight,
                       bool disk_only) {
    const float theta =
        disk_only && p.theta_disk != MOECACHE_THETA_DISK_AS_THETA ? p.theta_disk : p.theta;
    switch (p.miss_rule) {
        case MOECACHE_FETCH_ALL:
            return true;
        case MOECACHE_THRESHOLD:
            return rank == 0 || normalized_weight >= theta;
        case MOECACHE_FIRST_CHOICE:
            return rank == 0;
        case MOECACHE_ROUTING_BONUS: /* a candidate; route.cpp compares with the substitute */
        default:
            return false;
    }
}

/* Highest router probability among resident experts the token does not already use
 * (token_mark[e] == token); ties by lower expert id. -1 when none is left. */
int32_t pick_substitute(const LayerState & L, const float * probs_row,
                        const std::vector<int64_t> & token_mark, int64_t token) {
    int32_t best = -1;
    float best_p = 0.0f;
    for (const int32_t e : L.expert_of) {
        if (e < 0 || token_mark[e] == token) {
            continue;
        }
        const float p = probs_row[e];
        if (best < 0 || p > best_p || (p == best_p && e < best)) {
            best = e;
            best_p = p;
        }
    }
    return best;
}

}  // namespace moecache_core

namespace moecache_core {

/* The first `want` picks of pick_substitute in a row, each marked (token_mark[e] = token)
 * as it is picked: the best unmarked residents by probability, ties by lower expert id,
 * best first, found in one scan of the slots. Returns how many (< want when too few
 * residents are left). A NaN probability makes "best" depend on the scan order, so such a
 * row is decided by pick_substitute itself. */
int32_t pick_substitutes(const LayerState & L, const float * probs_row,
                         std::vector<int64_t> & token_mark, int64_t token, int32_t want,
                         int32_t * out, const uint16_t * rank_row, int32_t rank_count) {
    if (want <= 0) {
        return 0;
    }
    int32_t n = 0;
    if (rank_count > 0) {
        /* the first unmarked residents of the row's ranking are the scan's picks, in order;
         * when the ranked prefix runs out, every resident it held is marked (the token's
         * own or picked), so the scan below finds the rest among the unranked */
        for (int32_t j = 0; j < rank_count && n < want; ++j) {
            const int32_t e = rank_row[j];
            if (L.slot_of[e] >= 0 && token_mark[e] != token) {
                token_mark[e] = token;
                out[n++] = e;
            }
        }
#ifdef MOECACHE_SELFCHECK
        for (int32_t i = 0; i < n; ++i) {
            token_mark[out[i]] = token - 1;
        }
        for (int32_t i = 0; i < n; ++i) {
            if (pick_substitute(L, probs_row, token_mark, token) != out[i]) {
                std::abort();
            }
            token_mark[out[i]] = token;
        }
#endif
        if (n == want || rank_count >= static_cast<int32_t>(L.slot_of.size())) {
            return n;
        }
        /* the rest among the residents (the LRU list holds exactly them; a ranked row has
         * no NaN, so the order they are met in does not matter) */
        float best_p[MOECACHE_MAX_K];
        const int32_t need = want - n;
        int32_t * rest = out + n;
        int32_t m = 0;
        for (int32_t e = L.lru_head; e >= 0; e = L.lru_next[e]) {
            const float p = probs_row[e];
            if (beaten(p, e, need, m, best_p, rest) || token_mark[e] == token) {
                continue;
            }
            m = keep_best(p, e, need, m, best_p, rest);
        }
#ifdef MOECACHE_SELFCHECK
        for (int32_t i = 0; i < need; ++i) {
            const int32_t r = pick_substitute(L, probs_row, token_mark, token);
            if (r != (i < m ? rest[i] : -1)) {
                std::abort();
            }
            if (r < 0) {
                break;
            }
            token_mark[r] = token;
        }
#endif
        for (int32_t i = 0; i < m; ++i) {
            token_mark[rest[i]] = token;
        }
        return n + m;
    }
    float best_p[MOECACHE_MAX_K];
    bool nan = false;
    for (const int32_t e : L.expert_of) {
        if (e < 0) {
            continue;
        }
        const float p = probs_row[e];
        if (p != p) {
            nan = true;
            continue;
        }
        if (beaten(p, e, want, n, best_p, out) || token_mark[e] == token) {
            continue;
        }
        n = keep_best(p, e, want, n, best_p, out);
    }
    if (nan) {
        n = 0;
        while (n < want) {
            const int32_t r = pick_substitute(L, probs_row, token_mark, token);
            if (r < 0) {
                break;
            }
            out[n++] = r;
            token_mark[r] = token;
        }
        return n;
    }
#ifdef MOECACHE_SELFCHECK
    for (int32_t i = 0; i < want; ++i) {
        const int32_t r = pick_substitute(L, probs_row, token_mark, token);
        if (r != (i < n ? out[i] : -1)) {
            std::abort();
        }
        if (r < 0) {
            break;
        }
        token_mark[r] = token;
    }
#endif
    for (int32_t i = 0; i < n; ++i) {
        token_mark[out[i]] = token;
    }
    return n;
}

}  // namespace moecache_core
