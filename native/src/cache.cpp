/*
 * cache.cpp — the per-layer LOGICAL cache: S slots and the expert <-> slot maps.
 *
 * "Which Expert Misses Are Worth Waiting For?" keeps a fixed number of expert slots per
 * layer in VRAM; PSR (paper 2) makes residency a logical record updated only by decisions.
 * Here a slot holds at most one expert and an expert sits in at most one slot; free slots
 * are always taken lowest index first, so the layout is a pure function of the decisions.
 */
#include "moecache_internal.h"

#include <algorithm>
#include <cstdlib>

namespace moecache_core {

void layer_init(LayerState & L, int32_t n_experts, int32_t slots) {
    L.slot_of.assign(n_experts, -1);
    L.expert_of.assign(slots, -1);
    L.free_from = 0;
    L.last_use.assign(n_experts, 0);
    L.freq.assign(n_experts, 0.0);
    L.freq_step.assign(n_experts, 0);
    L.freq_key.assign(n_experts, -1e300);
    L.lost_mass.assign(n_experts, 0.0f);
    L.prefetched.assign(n_experts, 0);
    L.lru_prev.assign(n_experts, -1);
    L.lru_next.assign(n_experts, -1);
    L.lru_head = L.lru_tail = -1;
    L.n_resident = 0;
    L.fq_in.assign(n_experts, 0);
    L.fq_n = 0;
    L.fq_valid = L.fq_complete = false;
    L.ram_slot_of.assign(n_experts, -1);
    L.ram_expert_of.clear();
    L.ram_last_use.assign(n_experts, 0);
    L.n_ram = 0;
}

void layer_clear(LayerState & L) {
    std::fill(L.slot_of.begin(), L.slot_of.end(), -1);
    std::fill(L.expert_of.begin(), L.expert_of.end(), -1);
    L.free_from = 0;
    std::fill(L.last_use.begin(), L.last_use.end(), 0);
    std::fill(L.freq.begin(), L.freq.end(), 0.0);
    std::fill(L.freq_step.begin(), L.freq_step.end(), 0);
    std::fill(L.freq_key.begin(), L.freq_key.end(), -1e300);
    std::fill(L.lost_mass.begin(), L.lost_mass.end(), 0.0f);
    std::fill(L.prefetched.begin(), L.prefetched.end(), 0);
    std::fill(L.lru_prev.begin(), L.lru_prev.end(), -1);
    std::fill(L.lru_next.begin(), L.lru_next.end(), -1);
    L.lru_head = L.lru_tail = -1;
    L.n_resident = 0;
    std::fill(L.fq_in.begin(), L.fq_in.end(), 0);
    L.fq_n = 0;
    L.fq_valid = L.fq_complete = false;
    std::fill(L.ram_slot_of.begin(), L.ram_slot_of.end(), -1);
    std::fill(L.ram_expert_of.begin(), L.ram_expert_of.end(), -1);
    std::fill(L.ram_last_use.begin(), L.ram_last_use.end(), 0);
    L.n_ram = 0;
}

namespace {

void lru_unlink(LayerState & L, int32_t e) {
    const int32_t p = L.lru_prev[e];
    const int32_t n = L.lru_next[e];
    (p >= 0 ? L.lru_next[p] : L.lru_head) = n;
    (n >= 0 ? L.lru_prev[n] : L.lru_tail) = p;
    L.lru_prev[e] = L.lru_next[e] = -1;
}

void lru_link_before(LayerState & L, int32_t e, int32_t before) {
    const int32_t p = before >= 0 ? L.lru_prev[before] : L.lru_tail;
    L.lru_prev[e] = p;
    L.lru_next[e] = before;
    (p >= 0 ? L.lru_next[p] : L.lru_head) = e;
    (before >= 0 ? L.lru_prev[before] : L.lru_tail) = e;
}

}  // namespace

/* A new resident goes to the LRU tail: it is used (or given a fresh recency) by the call
 * that inserts it, and pinned until then. */
void layer_insert(LayerState & L, int32_t expert, int32_t slot) {
    L.slot_of[expert] = slot;
    L.expert_of[slot] = expert;
    L.n_resident += 1;
    lru_link_before(L, expert, -1);
    freq_order_insert(L, expert);
}

void layer_remove(LayerState & L, int32_t expert) {
    const int32_t slot = L.slot_of[expert];
    L.expert_of[slot] = -1;
    L.free_from = std::min(L.free_from, slot);
    L.slot_of[expert] = -1;
    L.n_resident -= 1;
    lru_unlink(L, expert);
    freq_order_erase(L, expert);
}

/* After last_use[expert] = ++clock: the most recent. */
void lru_touch(LayerState & L, int32_t expert) {
    if (L.lru_tail != expert) {
        lru_unlink(L, expert);
        lru_link_before(L, expert, -1);
    }
}

/* A resident put back with its old recency (a failed call's undo): its place in the order. */
void lru_place(LayerState & L, int32_t expert) {
    lru_unlink(L, expert);
    int32_t at = L.lru_head;
    while (at >= 0 && (L.last_use[at] < L.last_use[expert] ||
                       (L.last_use[at] == L.last_use[expert] && at < expert))) {
        at = L.lru_next[at];
    }
    lru_link_before(L, expert, at);
}

int32_t layer_lowest_free_slot(LayerState & L) {
    const int32_t n = static_cast<int32_t>(L.expert_of.size());
#ifdef MOECACHE_SELFCHECK
    for (int32_t s = 0; s < std::min(L.free_from, n); ++s) {
        if (L.expert_of[s] < 0) {
            std::abort();
        }
    }
#endif
    for (int32_t s = L.free_from; s < n; ++s) {
        if (L.expert_of[s] < 0) {
            L.free_from = s;
            return s;
        }
    }
    L.free_from = n;
    return -1;
}

/* A slot for a new resident: the lowest free one, else the eviction rule's victim's among
 * experts not pinned by this route call. Returns -1 when every slot is pinned. */
int32_t acquire_slot(moecache & c, LayerState & L, int64_t pin_epoch, int32_t * victim,
                     int32_t more) {
    *victim = -1;
    if (L.n_resident < static_cast<int32_t>(L.expert_of.size())) {
        return layer_lowest_free_slot(L);
    }
    const int32_t v = pick_victim(c, L, pin_epoch, more);
    if (v < 0) {
        return -1;
    }
    const int32_t slot = L.slot_of[v];
    layer_remove(L, v);
    *victim = v;
    return slot;
}

/* An expert that enters off the critical path (admission, PSR prefetch): a slot as for a
 * fetch, pinned for this call, a fresh recency and lost mass, its RAM-tier source, and an
 * asynchronous copy in the plan. Returns the slot, or -1 when every slot (or every RAM slot
 * a disk read could use) is pinned; nothing changes then. */
int32_t insert_background(moecache & c, LayerState & L, int32_t layer, int32_t expert,
                          int64_t pin_epoch, bool prefetched, moecache_copy * plan,
                          int32_t * n_plan, int32_t * victim, RamFill * ram, int32_t more) {
    if (!ram_can_fill(c, L, expert, pin_epoch)) {
        return -1;
    }
    const int32_t slot = acquire_slot(c, L, pin_epoch, victim, more);
    if (slot < 0) {
        return -1;
    }
    RamFill fill;
    ram_fill(c, L, expert, pin_epoch, &fill);
    ram_commit(c, L, expert, fill);
    if (ram != nullptr) {
        *ram = fill;
    }
    layer_insert(L, expert, slot);
    c.scratch.pin[expert] = pin_epoch;
    L.last_use[expert] = ++c.clock;
    lru_touch(L, expert);
    freq_order_rekey(L, expert);
    L.lost_mass[expert] = 0.0f;
    L.prefetched[expert] = prefetched ? 1 : 0;
    plan[*n_plan] = moecache_copy{layer, expert, slot, 1, fill.ram_slot, fill.from_disk};
    *n_plan += 1;
    return slot;
}

/* Live resize (between tokens): shrinking evicts by the eviction rule with nothing pinned,
 * then compacts; residents already inside [0, slots) keep their slot so the caller re-copies
 * as little as it wants to. Growing only adds free slots at the end. */
void resize_layer(moecache & c, LayerState & L, int32_t slots) {
    const int64_t no_pins = ++c.scratch.pin_epoch;
    while (L.n_resident > slots) {
        const int32_t v = pick_victim(c, L, no_pins, L.n_resident - slots);
        layer_remove(L, v);
        L.stats.resize_evictions += 1;
    }
    const int32_t old_slots = static_cast<int32_t>(L.expert_of.size());
    for (int32_t s = slots; s < old_slots; ++s) {
        const int32_t e = L.expert_of[s];
        if (e >= 0) { /* moves slot, keeps its place in the LRU order */
            int32_t dst = -1;
            for (int32_t d = 0; d < slots; ++d) {
                if (L.expert_of[d] < 0) {
                    dst = d;
                    break;
                }
            }
            L.expert_of[s] = -1;
            L.expert_of[dst] = e;
            L.slot_of[e] = dst;
        }
    }
    L.expert_of.resize(slots, -1);
    L.free_from = 0;
}

/* Grows the per-call buffers to the largest batch seen; steady-state calls allocate nothing. */
void Scratch::reserve(int32_t n_experts, int32_t n_tokens, int32_t k) {
    if (pin.size() < static_cast<size_t>(n_experts)) {
        pin.resize(n_experts, 0);
        ram_pin.resize(n_experts, 0);
        token_mark.resize(n_experts, 0);
        ranked.resize(n_experts, 0);
        rank_keys.resize(n_experts, 0);
    }
    const size_t selections = static_cast<size_t>(n_tokens) * static_cast<size_t>(k);
    if (action.size() < selections) {
        action.resize(selections);
        tier.resize(selections);
        wnorm.resize(selections);
        admitted.resize(selections);
        admit_evicted.resize(selections);
        fetches.reserve(selections);
    }
    if (n_admitted.size() < static_cast<size_t>(n_tokens)) {
        n_admitted.resize(n_tokens);
        n_admit_disk.resize(n_tokens);
    }
}

}  // namespace moecache_core
