/*
 * ram.cpp — the LOGICAL RAM tier between the slots and the model file.
 *
 * Models larger than host memory keep only some experts in RAM (issue 16: VRAM slots <- RAM
 * <- SSD). Like the slots, the tier is a record changed only by decisions: which experts are
 * in RAM, in which RAM slot. Every slot fill of an expert not in the tier reads it from disk
 * into a RAM slot (the tier admits what it serves), so a later miss of the same expert is a
 * memory copy, not a read. A RAM slot that a copy of the current call reads from is pinned
 * (never reused for another read of the same call). Eviction follows the policy's rule:
 * LRU over RAM-tier uses, or the same decayed selection counts as the slots (ties by LRU,
 * then id). With ram_expert_of empty the tier is off and every expert is in host memory.
 */
#include "moecache_internal.h"

namespace moecache_core {

namespace {

bool ram_evicts_before(const moecache & c, const LayerState & L, int32_t a, int32_t b) {
    if (c.policy.eviction == MOECACHE_EVICT_FREQUENCY && L.freq_key[a] != L.freq_key[b]) {
        return L.freq_key[a] < L.freq_key[b];
    }
    if (L.ram_last_use[a] != L.ram_last_use[b]) {
        return L.ram_last_use[a] < L.ram_last_use[b];
    }
    return a < b;
}

int32_t ram_victim(const moecache & c, const LayerState & L, int64_t pin_epoch) {
    int32_t best = -1;
    for (const int32_t e : L.ram_expert_of) {
        if (e < 0 || c.scratch.ram_pin[e] == pin_epoch) {
            continue;
        }
        if (best < 0 || ram_evicts_before(c, L, e, best)) {
            best = e;
        }
    }
    return best;
}

int32_t ram_free_slot(const LayerState & L) {
    const int32_t n = static_cast<int32_t>(L.ram_expert_of.size());
    for (int32_t s = 0; s < n; ++s) {
        if (L.ram_expert_of[s] < 0) {
            return s;
        }
    }
    return -1;
}

void ram_insert(LayerState & L, int32_t expert, int32_t slot) {
    L.ram_slot_of[expert] = slot;
    L.ram_expert_of[slot] = expert;
    L.n_ram += 1;
}

void ram_remove(LayerState & L, int32_t expert) {
    L.ram_expert_of[L.ram_slot_of[expert]] = -1;
    L.ram_slot_of[expert] = -1;
    L.n_ram -= 1;
}

}  // namespace

bool ram_on(const LayerState & L) {
    return !L.ram_expert_of.empty();
}

bool ram_has(const LayerState & L, int32_t expert) {
    return !ram_on(L) || L.ram_slot_of[expert] >= 0;
}

/* Whether ram_fill would succeed, changing nothing. */
bool ram_can_fill(const moecache & c, const LayerState & L, int32_t expert, int64_t pin_epoch) {
    if (ram_has(L, expert) || L.n_ram < static_cast<int32_t>(L.ram_expert_of.size())) {
        return true;
    }
    return ram_victim(c, L, pin_epoch) >= 0;
}

/* The RAM-tier side of one slot fill: the expert's RAM slot, or a free/evicted one that a
 * disk read fills. The slot is pinned for the call. False (nothing changed) when every RAM
 * slot is pinned. Recency is updated at commit (ram_commit) so a failed call undoes cleanly. */
bool ram_fill(moecache & c, LayerState & L, int32_t expert, int64_t pin_epoch, RamFill * out) {
    *out = RamFill{};
    if (!ram_on(L)) {
        return true;
    }
    if (L.ram_slot_of[expert] >= 0) {
        out->ram_slot = L.ram_slot_of[expert];
        c.scratch.ram_pin[expert] = pin_epoch;
        return true;
    }
    int32_t slot = -1;
    if (L.n_ram < static_cast<int32_t>(L.ram_expert_of.size())) {
        slot = ram_free_slot(L);
    } else {
        const int32_t v = ram_victim(c, L, pin_epoch);
        if (v < 0) {
            return false;
        }
        slot = L.ram_slot_of[v];
        ram_remove(L, v);
        out->ram_victim = v;
    }
    ram_insert(L, expert, slot);
    c.scratch.ram_pin[expert] = pin_epoch;
    out->ram_slot = slot;
    out->from_disk = 1;
    return true;
}

void ram_undo(LayerState & L, int32_t expert, const RamFill & f) {
    if (f.ram_slot < 0 || !f.from_disk) {
        return;
    }
    ram_remove(L, expert);
    if (f.ram_victim >= 0) {
        ram_insert(L, f.ram_victim, f.ram_slot);
    }
}

void ram_commit(moecache & c, LayerState & L, int32_t expert, const RamFill & f) {
    if (f.ram_slot < 0) {
        return;
    }
    L.ram_last_use[expert] = ++c.clock;
    if (f.from_disk) {
        L.stats.disk_fills += 1;
        L.stats.bytes_disk += L.expert_bytes;
        L.stats.ram_evictions += f.ram_victim >= 0;
    } else {
        L.stats.ram_fills += 1;
    }
}

/* Resize the tier (between tokens): 0 turns it off; shrinking evicts with nothing pinned,
 * then compacts residents into [0, ram_slots) in slot order; turning it on starts empty. */
void resize_ram(moecache & c, LayerState & L, int32_t ram_slots) {
    const int32_t n_experts = static_cast<int32_t>(L.slot_of.size());
    if (ram_slots == 0) {
        L.ram_expert_of.clear();
        L.ram_slot_of.assign(n_experts, -1);
        L.n_ram = 0;
        return;
    }
    if (!ram_on(L)) {
        L.ram_slot_of.assign(n_experts, -1);
        L.ram_last_use.assign(n_experts, 0);
        L.ram_expert_of.assign(ram_slots, -1);
        L.n_ram = 0;
        return;
    }
    const int64_t no_pins = ++c.scratch.pin_epoch;
    while (L.n_ram > ram_slots) {
        const int32_t v = ram_victim(c, L, no_pins);
        ram_remove(L, v);
        L.stats.ram_evictions += 1;
    }
    const int32_t old = static_cast<int32_t>(L.ram_expert_of.size());
    for (int32_t s = ram_slots; s < old; ++s) {
        const int32_t e = L.ram_expert_of[s];
        if (e >= 0) {
            ram_remove(L, e);
            ram_insert(L, e, ram_free_slot(L));
        }
    }
    L.ram_expert_of.resize(ram_slots, -1);
}

}  // namespace moecache_core
