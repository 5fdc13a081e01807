/*
 * route.cpp — one moecache_route call: hit / fetch / substitute for every routed expert.
 *
 * Order of a call ("Which Expert Misses Are Worth Waiting For?", with PSR's logical cache):
 *   1. pin every selected expert that is resident (a hit for some token of the call);
 *   2. per token, in router order: hits; misses the miss rule fetches; substitutes for the
 *      others (highest-probability resident expert the token does not compute; none left ->
 *      fetch); under the routing bonus (paper 2) the misses are instead offered the best
 *      residents lowest-probability first, and a miss whose substitute scores p + bonus * S
 *      (S: the selection's probability) below it is fetched; then the fetches take free or evicted slots. Nothing but slot maps changes
 *      here, so a call that runs out of slots is undone exactly;
 *   3. commit: recency and frequency, substitute weights, background admissions, counters
 *      and one event row per token.
 * Victims are chosen from the history as it stood when the call began; experts used by the
 * call are pinned and never evicted during it.
 */
#include "moecache_internal.h"

#include <algorithm>
#include <cstring>

namespace moecache_core {

namespace {

bool arguments_valid(moecache & c, int32_t layer, int32_t n_tokens, const float * probs,
                     const int32_t * ids, const float * weights, const int32_t * out_ids,
                     const int32_t * out_slots, const int32_t * n_plan) {
    if (layer < 0 || layer >= c.n_layers || n_tokens < 0 || n_plan == nullptr) {
        return false;
    }
    if (n_tokens == 0) {
        return true;
    }
    if (!probs || !ids || !weights || !out_ids || !out_slots) {
        return false;
    }
    Scratch & sc = c.scratch;
    for (int32_t t = 0; t < n_tokens; ++t) {
        const int64_t mark = ++sc.token_epoch;
        for (int32_t j = 0; j < c.top_k; ++j) {
            const int32_t e = ids[t * c.top_k + j];
            if (e < 0 || e >= c.n_experts || sc.token_mark[e] == mark) {
                return false;
            }
            sc.token_mark[e] = mark;
        }
    }
    return true;
}

void undo_fetches(LayerState & L, const std::vector<FetchRecord> & fetches) {
    for (auto it = fetches.rbegin(); it != fetches.rend(); ++it) {
        ram_undo(L, it->expert, it->ram);
        layer_remove(L, it->expert);
        if (it->victim >= 0) {
            layer_insert(L, it->victim, it->slot);
            lru_place(L, it->victim);
        }
    }
}

/* Cache-Prior (paper 2) for one token's misses: the top-k of p + bonus * S * resident, where
 * S is the router probability of the token's selected experts. The bonus is thus in gate-weight
 * units (p / S is the weight an expert would get among the selection), the units of theta and
 * of the substituted mass: it means the same with 64 experts or 512, where raw probabilities
 * are several times smaller, and for a diffuse token as for a confident one. Pairing the
 * lowest-probability misses with the most probable unused residents, while
 * p_resident + bonus * S > p_miss, gives exactly that top-k; once a pair fails every later one
 * would, so the rest are fetched. Equal probabilities: the later router rank goes first. */
void steer_to_residents(moecache & c, const LayerState & L, int32_t base, const float * probs_row,
                        const uint16_t * rank_row, int32_t rank_count, const int32_t * ids,
                        int32_t * out_ids, int64_t mark) {
    Scratch & sc = c.scratch;
    /* the selection's probabilities: the batch replay's copy, else out of the row */
    float p_sel[MOECACHE_MAX_K];
    for (int32_t j = 0; j < c.top_k; ++j) {
        p_sel[j] = sc.sel_probs != nullptr ? sc.sel_probs[base + j] : probs_row[ids[base + j]];
    }
    int32_t order[MOECACHE_MAX_K];
    int32_t n = 0;
    float selected = 0.0f;
    for (int32_t i = base; i < base + c.top_k; ++i) {
        selected += p_sel[i - base];
        if (sc.action[i] == MOECACHE_SUBSTITUTE) {
            order[n++] = i;
        }
    }
    const float bonus = c.policy.bonus * (selected > 0.0f ? selected : 1.0f);
    std::sort(order, order + n, [&](int32_t a, int32_t b) {
        const float pa = p_sel[a - base];
        const float pb = p_sel[b - base];
        return pa != pb ? pa < pb : a > b;
    });
    int32_t best[MOECACHE_MAX_K];
    const int32_t n_best = pick_substitutes(L, probs_row, sc.token_mark, mark, n, best, rank_row,
                                            rank_count);
    bool steering = true;
    for (int32_t o = 0; o < n; ++o) {
        const int32_t i = order[o];
        const int32_t r = steering && o < n_best ? best[o] : -1;
        if (r >= 0 && probs_row[r] + bonus > p_sel[i - base]) {
            out_ids[i] = r;
            sc.pin[r] = sc.pin_epoch;
        } else {
            sc.action[i] = MOECACHE_FETCH;
            steering = false;
        }
    }
}

/* Step 2 for one token. Returns false when a fetch finds every slot pinned. */
bool decide_token(moecache & c, LayerState & L, int32_t t, const float * probs,
                  const int32_t * ids, const float * weights, int32_t * out_ids,
                  int32_t * out_slots) {
    Scratch & sc = c.scratch;
    const int32_t k = c.top_k;
    const int32_t base = t * k;
    const int64_t pin_epoch = sc.pin_epoch;
    const int64_t mark = ++sc.token_epoch;

    float sum = 0.0f;
    for (int32_t j = 0; j < k; ++j) {
        sum += weights[base + j];
    }
    /* fill_free: the layer's free slots take this token's first misses, whatever the rule */
    int32_t free_slots = c.policy.fill_free != 0
                             ? static_cast<int32_t>(L.expert_of.size()) - L.n_resident
                             : 0;
    for (int32_t j = 0; j < k; ++j) {
        const int32_t i = base + j;
        const int32_t e = ids[i];
        sc.wnorm[i] = sum > 0.0f ? weights[i] / sum : 0.0f;
        sc.token_mark[e] = mark;
        out_ids[i] = e;
        const bool disk_only = !ram_has(L, e);
        sc.tier[i] = L.slot_of[e] >= 0 ? 0 : (disk_only ? 2 : 1);
        if (L.slot_of[e] >= 0) {
            sc.action[i] = MOECACHE_HIT;
        } else if (free_slots > 0 || miss_rule_fetches(c.policy, j, sc.wnorm[i], disk_only)) {
            sc.action[i] = MOECACHE_FETCH;
            free_slots -= free_slots > 0;
        } else {
            sc.action[i] = MOECACHE_SUBSTITUTE;
        }
    }
    const float * probs_row = probs + static_cast<int64_t>(t) * c.n_experts;
    const uint16_t * rank_row = nullptr;
    int32_t rank_count = 0;
    if (sc.sub_rank != nullptr) {
        rank_row = sc.sub_rank + static_cast<int64_t>(t) * MOECACHE_RANK_WIDTH;
        rank_count = sc.sub_rank_count[t];
    }
    if (c.policy.miss_rule == MOECACHE_ROUTING_BONUS) {
        steer_to_residents(c, L, base, probs_row, rank_row, rank_count, ids, out_ids, mark);
    }
    int32_t n_sub = 0;
    for (int32_t i = base; i < base + k; ++i) {
        n_sub += sc.action[i] == MOECACHE_SUBSTITUTE;
    }
    if (n_sub > 0 && c.policy.miss_rule != MOECACHE_ROUTING_BONUS) {
        int32_t best[MOECACHE_MAX_K];
        const int32_t n_best = pick_substitutes(L, probs_row, sc.token_mark, mark, n_sub, best,
                                                rank_row, rank_count);
        int32_t next = 0;
        for (int32_t i = base; i < base + k; ++i) {
            if (sc.action[i] != MOECACHE_SUBSTITUTE) {
                continue;
            }
            if (next == n_best) {
                sc.action[i] = MOECACHE_FETCH; /* no resident expert left to substitute */
                continue;
            }
            const int32_t r = best[next++];
            out_ids[i] = r;
            sc.pin[r] = pin_epoch;
        }
    }
    int32_t n_fetch = 0;
    for (int32_t i = base; i < base + k; ++i) {
        n_fetch += sc.action[i] == MOECACHE_FETCH;
    }
    for (int32_t i = base; i < base + k; ++i) {
        if (sc.action[i] != MOECACHE_FETCH) {
            continue;
        }
        int32_t victim = -1;
        const int32_t slot = acquire_slot(c, L, pin_epoch, &victim, n_fetch--);
        if (slot < 0) {
            return false;
        }
        layer_insert(L, ids[i], slot);
        sc.pin[ids[i]] = pin_epoch;
        RamFill fill;
        const bool ram_ok = ram_fill(c, L, ids[i], pin_epoch, &fill);
        sc.fetches.push_back(FetchRecord{t, ids[i], slot, victim, fill});
        if (!ram_ok) {
            return false; /* every RAM slot holds an expert this call copies from */
        }
    }
    for (int32_t i = base; i < base + k; ++i) {
        out_slots[i] = L.slot_of[out_ids[i]];
    }
    return true;
}

/* The weight a substitute computes with: the missing expert's (default), or its own router
 * probability scaled as the router scaled the missing one (w_i / p_i), so it stays in the
 * same units whether or not the router renormalized the top-k. */
void apply_substitute_weights(const moecache & c, int32_t n_tokens, const float * probs,
                              const int32_t * ids, float * weights, const int32_t * out_ids) {
    if (c.policy.substitute_weight != MOECACHE_SUBW_OWN) {
        return;
    }
    for (int32_t i = 0; i < n_tokens * c.top_k; ++i) {
        if (c.scratch.action[i] != MOECACHE_SUBSTITUTE) {
            continue;
        }
        const float * row = probs + static_cast<int64_t>(i / c.top_k) * c.n_experts;
        const float p_missing = c.scratch.sel_probs != nullptr ? c.scratch.sel_probs[i] : row[ids[i]];
        const float p_own = row[out_ids[i]];
        weights[i] = p_missing > 0.0f ? p_own * (weights[i] / p_missing) : p_own;
    }
}

void record_token(moecache & c, LayerState & L, int32_t layer, int32_t t, const int32_t * ids,
                  const int32_t * out_ids, const int32_t * out_slots, size_t * next_fetch) {
    Scratch & sc = c.scratch;
    const int32_t k = c.top_k;
    const int32_t base = t * k;
    int32_t n_hit = 0;
    int32_t n_fetch = 0;
    int32_t n_sub = 0;
    float mass = 0.0f;
    for (int32_t i = base; i < base + k; ++i) {
        n_hit += sc.action[i] == MOECACHE_HIT;
        n_fetch += sc.action[i] == MOECACHE_FETCH;
        if (sc.action[i] == MOECACHE_SUBSTITUTE) {
            n_sub += 1;
            mass += sc.wnorm[i];
        }
    }
    int32_t evicted[2 * MOECACHE_MAX_K];
    int32_t n_evict = 0;
    int32_t n_disk = sc.n_admit_disk[t];
    while (*next_fetch < sc.fetches.size() && sc.fetches[*next_fetch].token == t) {
        if (sc.fetches[*next_fetch].victim >= 0) {
            evicted[n_evict++] = sc.fetches[*next_fetch].victim;
        }
        n_disk += sc.fetches[*next_fetch].ram.from_disk;
        *next_fetch += 1;
    }
    const int32_t n_admit = sc.n_admitted[t];
    for (int32_t a = 0; a < n_admit; ++a) {
        if (sc.admit_evicted[base + a] >= 0) {
            evicted[n_evict++] = sc.admit_evicted[base + a];
        }
    }

    moecache_layer_stats & s = L.stats;
    s.tokens += 1;
    s.selections += k;
    s.hits += n_hit;
    s.fetches += n_fetch;
    s.substitutions += n_sub;
    s.admissions += n_admit;
    s.evictions += n_evict;
    s.substituted_mass += static_cast<double>(mass);
    s.bytes_sync += n_fetch * L.expert_bytes;
    s.bytes_async += n_admit * L.expert_bytes;

    moecache_event * row = c.events.push();
    if (row == nullptr) {
        return;
    }
    std::memset(row, 0, sizeof(*row));
    row->step = c.step;
    row->layer = layer;
    row->token = t;
    row->k = k;
    for (int32_t j = 0; j < k; ++j) {
        row->ids[j] = ids[base + j];
        row->weights[j] = sc.wnorm[base + j];
        row->action[j] = sc.action[base + j];
        row->used_ids[j] = out_ids[base + j];
        row->slots[j] = out_slots[base + j];
        row->tier[j] = sc.tier[base + j];
    }
    row->n_disk = n_disk;
    row->bytes_disk = n_disk * L.expert_bytes;
    row->substituted_mass = mass;
    row->n_hit = n_hit;
    row->n_fetch = n_fetch;
    row->n_substitute = n_sub;
    row->n_admit = n_admit;
    row->n_evict = n_evict;
    for (int32_t a = 0; a < std::min(n_admit, MOECACHE_MAX_K); ++a) {
        row->admitted[a] = sc.admitted[base + a];
    }
    for (int32_t v = 0; v < std::min(n_evict, MOECACHE_MAX_K); ++v) {
        row->evicted[v] = evicted[v];
    }
    row->bytes_sync = n_fetch * L.expert_bytes;
    row->bytes_async = n_admit * L.expert_bytes;
}

}  // namespace

int32_t route(moecache & c, int32_t layer, int32_t n_tokens, const float * probs,
              const int32_t * ids, float * weights, int32_t * out_ids, int32_t * out_slots,
              moecache_copy * plan, int32_t plan_cap, int32_t * n_plan) {
    if (!arguments_valid(c, layer, n_tokens, probs, ids, weights, out_ids, out_slots, n_plan)) {
        return MOECACHE_E_ARG;
    }
    const int32_t k = c.top_k;
    const int64_t selections = static_cast<int64_t>(n_tokens) * k;
    const int32_t plan_needed = static_cast<int32_t>(std::min<int64_t>(c.slots, selections));
    if (plan_cap < plan_needed || (plan_needed > 0 && plan == nullptr)) {
        return MOECACHE_E_PLAN_CAP;
    }
    *n_plan = 0;
    if (n_tokens == 0) {
        return MOECACHE_OK;
    }
    LayerState & L = c.layers[layer];
    Scratch & sc = c.scratch;
    sc.reserve(c.n_experts, n_tokens, k);
    sc.fetches.clear();

    /* 1. pin the hits of every token */
    const int64_t pin_epoch = ++sc.pin_epoch;
    for (int64_t i = 0; i < selections; ++i) {
        if (L.slot_of[ids[i]] >= 0) {
            sc.pin[ids[i]] = pin_epoch;
        }
    }
    /* 2. decide */
    for (int32_t t = 0; t < n_tokens; ++t) {
        if (!decide_token(c, L, t, probs, ids, weights, out_ids, out_slots)) {
            undo_fetches(L, sc.fetches);
            sc.victims.invalidate();
            return MOECACHE_E_NO_SLOT;
        }
    }
    /* 3. commit */
    for (int64_t i = 0; i < selections; ++i) {
        L.last_use[out_ids[i]] = ++c.clock;
        lru_touch(L, out_ids[i]);
        /* each change of a key is followed by its rekey before the next: a substituted
         * expert that a later token of the call fetched is resident, and the kept order's
         * insertions compare with its entry, so it must not be stale then */
        if (ids[i] != out_ids[i]) {
            freq_order_rekey(L, out_ids[i]);
        }
        if (c.track_frequency) {
            record_selection(L, ids[i], c.step, c.policy.half_life, sc);
        }
        if (ids[i] == out_ids[i] || c.track_frequency) {
            freq_order_rekey(L, ids[i]);
        }
        if (sc.action[i] != MOECACHE_FETCH && L.prefetched[out_ids[i]]) {
            L.prefetched[out_ids[i]] = 0; /* a prefetch that paid off (hit or substitute) */
            L.stats.prefetch_hits += 1;
        }
    }
    for (const FetchRecord & f : sc.fetches) {
        L.lost_mass[f.expert] = 0.0f;
        L.prefetched[f.expert] = 0;
        ram_commit(c, L, f.expert, f.ram);
        plan[*n_plan] = moecache_copy{layer, f.expert, f.slot, 0, f.ram.ram_slot, f.ram.from_disk};
        *n_plan += 1;
    }
    apply_substitute_weights(c, n_tokens, probs, ids, weights, out_ids);
    admit_lost_mass(c, L, layer, n_tokens, ids, plan, n_plan);
    size_t next_fetch = 0;
    for (int32_t t = 0; t < n_tokens; ++t) {
        record_token(c, L, layer, t, ids, out_ids, out_slots, &next_fetch);
    }
    return MOECACHE_OK;
}

}  // namespace moecache_core
