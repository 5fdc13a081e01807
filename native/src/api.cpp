/*
 * api.cpp — the C API of moecache.h: argument checks and the lock, nothing else.
 *
 * One mutex per cache: route runs on the decode thread while the GUI thread may set the
 * policy, read counters or drain events. The policy part that decides ("Which Expert Misses
 * Are Worth Waiting For?") lives in rules.cpp, eviction.cpp and admission.cpp.
 */
#include "moecache_internal.h"

#include <algorithm>
#include <cstring>
#include <new>

using moecache_core::LayerState;

namespace {

using Lock = std::lock_guard<std::mutex>;

bool layer_ok(const moecache * c, int32_t layer) {
    return c != nullptr && layer >= 0 && layer < c->n_layers;
}

}  // namespace

/* moecache_create with an event ring of `event_rows` (the batch replay sizes its own). */
moecache * moecache_core::create(int32_t n_layers, int32_t n_experts, int32_t top_k,
                                 int32_t slots_per_layer, const moecache_policy * policy,
                                 int32_t event_rows) {
    moecache_policy p{};
    if (policy != nullptr) {
        p = *policy;
    } else {
        moecache_core::preset("exact", &p);
    }
    const bool shape_ok = n_layers >= 1 && top_k >= 1 && top_k <= MOECACHE_MAX_K &&
                          top_k <= n_experts && slots_per_layer >= top_k &&
                          slots_per_layer <= n_experts;
    if (!shape_ok || !moecache_core::policy_valid(p) || event_rows < 0) {
        return nullptr;
    }
    moecache * c = new (std::nothrow) moecache();
    if (c == nullptr) {
        return nullptr;
    }
    try {
        c->n_layers = n_layers;
        c->n_experts = n_experts;
        c->top_k = top_k;
        c->slots = slots_per_layer;
        c->policy = p;
        c->layers.resize(n_layers);
        for (LayerState & L : c->layers) {
            moecache_core::layer_init(L, n_experts, slots_per_layer);
        }
        c->scratch.reserve(n_experts, 1, top_k);
        c->events.set_capacity(event_rows);
    } catch (const std::bad_alloc &) {
        delete c;
        return nullptr;
    }
    return c;
}

extern "C" {

int32_t moecache_preset(const char * name, moecache_policy * out) {
    return moecache_core::preset(name, out);
}

moecache * moecache_create(int32_t n_layers, int32_t n_experts, int32_t top_k,
                           int32_t slots_per_layer, const moecache_policy * policy) {
    return moecache_core::create(n_layers, n_experts, top_k, slots_per_layer, policy,
                                 MOECACHE_DEFAULT_EVENT_ROWS);
}

void moecache_destroy(moecache * c) {
    delete c;
}

int32_t moecache_set_policy(moecache * c, const moecache_policy * policy) {
    if (c == nullptr || policy == nullptr || !moecache_core::policy_valid(*policy)) {
        return MOECACHE_E_ARG;
    }
    Lock lock(c->mutex);
    c->pending = *policy;
    c->has_pending = true;
    return MOECACHE_OK;
}

void moecache_get_policy(const moecache * c, moecache_policy * out) {
    if (c == nullptr || out == nullptr) {
        return;
    }
    Lock lock(c->mutex);
    *out = c->policy;
}

int32_t moecache_set_slots(moecache * c, int32_t slots) {
    if (c == nullptr || slots < c->top_k || slots > c->n_experts) {
        return MOECACHE_E_ARG;
    }
    Lock lock(c->mutex);
    for (LayerState & L : c->layers) {
        moecache_core::resize_layer(*c, L, slots);
    }
    c->slots = slots;
    return MOECACHE_OK;
}

int32_t moecache_get_slots(const moecache * c) {
    if (c == nullptr) {
        return 0;
    }
    Lock lock(c->mutex);
    return c->slots;
}

int32_t moecache_set_ram_slots(moecache * c, int32_t ram_slots) {
    if (c == nullptr || (ram_slots != 0 && (ram_slots < c->top_k || ram_slots > c->n_experts))) {
        return MOECACHE_E_ARG;
    }
    Lock lock(c->mutex);
    for (LayerState & L : c->layers) {
        moecache_core::resize_ram(*c, L, ram_slots);
    }
    c->ram_slots = ram_slots;
    return MOECACHE_OK;
}

int32_t moecache_get_ram_slots(const moecache * c) {
    if (c == nullptr) {
        return 0;
    }
    Lock lock(c->mutex);
    return c->ram_slots;
}

void moecache_layer_ram(const moecache * c, int32_t layer, int32_t * ram_slot_of_expert) {
    if (!layer_ok(c, layer) || ram_slot_of_expert == nullptr) {
        return;
    }
    Lock lock(c->mutex);
    const std::vector<int32_t> & v = c->layers[layer].ram_slot_of;
    std::copy(v.begin(), v.end(), ram_slot_of_expert);
}

void moecache_layer_ram_slots(const moecache * c, int32_t layer, int32_t * expert_of_ram_slot) {
    if (!layer_ok(c, layer) || expert_of_ram_slot == nullptr) {
        return;
    }
    Lock lock(c->mutex);
    const std::vector<int32_t> & v = c->layers[layer].ram_expert_of;
    std::copy(v.begin(), v.end(), expert_of_ram_slot);
}

void moecache_set_expert_bytes(moecache * c, int32_t layer, int64_t bytes) {
    if (!layer_ok(c, layer) || bytes < 0) {
        return;
    }
    Lock lock(c->mutex);
    c->layers[layer].expert_bytes = bytes;
}

void moecache_begin_step(moecache * c) {
    if (c == nullptr) {
        return;
    }
    Lock lock(c->mutex);
    if (c->has_pending) {
        const bool half_life_changed = c->pending.half_life != c->policy.half_life;
        c->policy = c->pending;
        c->has_pending = false;
        if (half_life_changed) {
            for (LayerState & L : c->layers) {
                moecache_core::refresh_frequency_keys(L, c->policy.half_life);
            }
        }
    }
    c->step += 1;
}

int64_t moecache_step(const moecache * c) {
    if (c == nullptr) {
        return 0;
    }
    Lock lock(c->mutex);
    return c->step;
}

int32_t moecache_route(moecache * c, int32_t layer, int32_t n_tokens, const float * probs,
                       const int32_t * ids, float * weights, int32_t * out_ids,
                       int32_t * out_slots, moecache_copy * plan, int32_t plan_cap,
                       int32_t * n_plan) {
    if (c == nullptr) {
        return MOECACHE_E_ARG;
    }
    Lock lock(c->mutex);
    return moecache_core::route(*c, layer, n_tokens, probs, ids, weights, out_ids, out_slots,
                                plan, plan_cap, n_plan);
}

int32_t moecache_rank_predictions(const float * scores, int64_t n_rows, int32_t n_experts,
                                  int32_t keep, int32_t * out) {
    if (n_rows < 0 || n_experts <= 0 || keep <= 0 ||
        (n_rows > 0 && (scores == nullptr || out == nullptr))) {
        return MOECACHE_E_ARG;
    }
    const int32_t width = std::min(keep, n_experts);
    try {
        std::vector<uint64_t> keys(static_cast<size_t>(n_experts));
        for (int64_t r = 0; r < n_rows; ++r) {
            moecache_core::rank_scores(scores + r * n_experts, n_experts, width, keys.data(),
                                       out + r * width);
        }
    } catch (const std::bad_alloc &) {
        return MOECACHE_E_ARG;
    }
    return MOECACHE_OK;
}

int32_t moecache_prefetch(moecache * c, int32_t layer, int32_t n_tokens, const float * scores,
                          moecache_copy * plan, int32_t plan_cap, int32_t * n_plan) {
    if (c == nullptr) {
        return MOECACHE_E_ARG;
    }
    Lock lock(c->mutex);
    return moecache_core::prefetch(*c, layer, n_tokens, scores, plan, plan_cap, n_plan);
}

void moecache_layer_experts(const moecache * c, int32_t layer, int32_t * slot_of_expert) {
    if (!layer_ok(c, layer) || slot_of_expert == nullptr) {
        return;
    }
    Lock lock(c->mutex);
    const std::vector<int32_t> & v = c->layers[layer].slot_of;
    std::copy(v.begin(), v.end(), slot_of_expert);
}

void moecache_layer_slots(const moecache * c, int32_t layer, int32_t * expert_of_slot) {
    if (!layer_ok(c, layer) || expert_of_slot == nullptr) {
        return;
    }
    Lock lock(c->mutex);
    const std::vector<int32_t> & v = c->layers[layer].expert_of;
    std::copy(v.begin(), v.end(), expert_of_slot);
}

void moecache_layer_lost_mass(const moecache * c, int32_t layer, float * lost_mass) {
    if (!layer_ok(c, layer) || lost_mass == nullptr) {
        return;
    }
    Lock lock(c->mutex);
    const std::vector<float> & v = c->layers[layer].lost_mass;
    std::copy(v.begin(), v.end(), lost_mass);
}

int32_t moecache_drain_events(moecache * c, moecache_event * out, int32_t cap) {
    if (c == nullptr) {
        return 0;
    }
    Lock lock(c->mutex);
    return c->events.drain(out, cap);
}

int32_t moecache_events_pending(const moecache * c) {
    if (c == nullptr) {
        return 0;
    }
    Lock lock(c->mutex);
    return static_cast<int32_t>(c->events.count);
}

int64_t moecache_events_dropped(const moecache * c) {
    if (c == nullptr) {
        return 0;
    }
    Lock lock(c->mutex);
    return c->events.dropped;
}

void moecache_set_event_capacity(moecache * c, int32_t rows) {
    if (c == nullptr || rows < 0) {
        return;
    }
    Lock lock(c->mutex);
    c->events.set_capacity(rows);
}

void moecache_get_layer_stats(const moecache * c, int32_t layer, moecache_layer_stats * out) {
    if (out == nullptr) {
        return;
    }
    std::memset(out, 0, sizeof(*out));
    if (!layer_ok(c, layer)) {
        return;
    }
    Lock lock(c->mutex);
    *out = c->layers[layer].stats;
}

void moecache_reset_stats(moecache * c) {
    if (c == nullptr) {
        return;
    }
    Lock lock(c->mutex);
    for (LayerState & L : c->layers) {
        L.stats = moecache_layer_stats{};
    }
}

void moecache_clear(moecache * c) {
    if (c == nullptr) {
        return;
    }
    Lock lock(c->mutex);
    for (LayerState & L : c->layers) {
        moecache_core::layer_clear(L);
    }
}

const char * moecache_version(void) {
    return "0.4.0"; /* 0.4: fill_free (moecache_policy grew); 0.3: RAM tier, theta_disk;
                     * 0.2: routing bonus in gate-weight units */
}

}  // extern "C"
