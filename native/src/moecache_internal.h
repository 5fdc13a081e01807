/*
 * moecache_internal.h — the state behind the C API, shared by the core's source files.
 *
 * The LOGICAL cache (paper 2, PSR): which experts count as resident, and where, changes only
 * through routing decisions and resizes; copy timing never enters. Everything is indexed by
 * dense vectors (no hash maps), so no decision can depend on container iteration order.
 */
#ifndef MOECACHE_INTERNAL_H
#define MOECACHE_INTERNAL_H

#include "moecache.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

namespace moecache_core {

/* One MoE layer's slice of the logical cache plus the per-expert history the policy reads. */
struct LayerState {
    std::vector<int32_t> slot_of;    /* expert -> slot, -1 when not resident */
    std::vector<int32_t> expert_of;  /* slot -> expert, -1 when free */
    std::vector<int64_t> last_use;   /* expert -> LRU clock of its last use, 0 = never */
    std::vector<double> freq;        /* decayed selection count as of freq_step */
    std::vector<int64_t> freq_step;  /* step of the last (lazy) decay of freq */
    std::vector<double> freq_key;    /* log2(freq) + freq_step / half_life: orders like freq */
    std::vector<float> lost_mass;    /* admission accumulator, normalized gate mass */
    std::vector<int8_t> prefetched;  /* 1: brought in by PSR prefetch and not used since */
    std::vector<int32_t> ram_slot_of;   /* RAM tier: expert -> RAM slot, -1 only on disk */
    std::vector<int32_t> ram_expert_of; /* RAM slot -> expert, -1 free; empty: tier off */
    std::vector<int64_t> ram_last_use;  /* expert -> LRU clock of its last RAM-tier use */
    /* residents in LRU order, least recent first (expert -> neighbour, -1 at the ends): every
     * use moves an expert to the tail, so LRU's victim is the first unpinned one */
    std::vector<int32_t> lru_prev;
    std::vector<int32_t> lru_next;
    int32_t lru_head = -1;
    int32_t lru_tail = -1;
    int32_t n_resident = 0;
    int32_t free_from = 0; /* every slot below it holds an expert (where a free one is sought) */
    /* Frequency eviction's order, kept between calls (eviction.cpp): the fq_n residents that
     * evict first, in eviction order; every other resident evicts after fq_ids[fq_n - 1]
     * (fq_complete: there is no other). Built by a scan when a frequency victim is wanted
     * in a layer of more than kFreqDepth slots (a smaller one is scanned per victim) and
     * the order is not valid, then kept by every insertion, removal and change of a
     * resident's key, so a victim needs no scan of the slots. */
    static constexpr int32_t kFreqDepth = 32;
    int32_t fq_ids[kFreqDepth];
    int32_t fq_n = 0;
    bool fq_valid = false;
    bool fq_complete = false;
    std::vector<int8_t> fq_in; /* expert -> 1 while in fq_ids */
    int32_t n_ram = 0;
    int64_t expert_bytes = 0;
    moecache_layer_stats stats{};
};

/* Rows of moecache_event, oldest overwritten when full (see moecache_drain_events). */
struct EventRing {
    std::vector<moecache_event> rows;
    int64_t head = 0;  /* index of the oldest row */
    int64_t count = 0;
    int64_t dropped = 0;

    moecache_event * push();  /* row to fill, or nullptr when recording is off */
    int32_t drain(moecache_event * out, int32_t cap);
    void set_capacity(int32_t capacity);
};

/* One fetch made while deciding a route call, so a failed call can be undone exactly. */
/* Where a slot fill's bytes come from in the RAM tier (see moecache_copy). */
struct RamFill {
    int32_t ram_slot = -1;
    int32_t from_disk = 0;
    int32_t ram_victim = -1; /* expert dropped from the RAM tier for a disk read */
};

struct FetchRecord {
    int32_t token;
    int32_t expert;
    int32_t slot;
    int32_t victim; /* expert evicted to make room, -1 if the slot was free */
    RamFill ram;
};

/* Frequency eviction's next victims in one small layer (LayerState::kFreqDepth slots or
 * fewer, which keeps no order between calls) within one pin epoch (a route, prefetch or
 * resize call): the best unpinned residents in eviction order, found by one scan of the slots. Within a
 * call the keys of unpinned residents never change (only the call's own, pinned, experts
 * are used or inserted), so successive victims are this order minus experts pinned since;
 * when it runs out the slots are scanned again. Equal to a full scan per victim. */
struct VictimQueue {
    static constexpr int32_t kDepth = 24;
    const LayerState * layer = nullptr;
    int64_t epoch = -1;
    int32_t depth = 0; /* how many the scan kept at most */
    int32_t n = 0;
    int32_t at = 0;
    int32_t ids[kDepth];

    void invalidate() { layer = nullptr; epoch = -1; }
};


/* Buffers reused by every route call: no heap allocation once they have grown. */
struct Scratch {
    std::vector<int64_t> pin;         /* expert -> route call that pinned it */
    std::vector<int64_t> ram_pin;     /* expert -> call whose copies read its RAM slot */
    std::vector<int8_t> tier;         /* [n_tokens * k] 0 slot, 1 RAM, 2 disk only */
    std::vector<int64_t> token_mark;  /* expert -> token that uses it (substitute exclusion) */
    std::vector<int8_t> action;       /* [n_tokens * k] enum moecache_action */
    std::vector<float> wnorm;         /* [n_tokens * k] normalized gate weights */
    std::vector<FetchRecord> fetches; /* decision order */
    std::vector<int32_t> admitted;    /* [n_tokens * k] experts admitted, per token */
    std::vector<int32_t> admit_evicted; /* [n_tokens * k] matching victims (-1: free slot) */
    std::vector<int32_t> n_admitted;  /* [n_tokens] */
    std::vector<int32_t> n_admit_disk; /* [n_tokens] admissions read from disk */
    std::vector<int32_t> ranked;      /* [n_experts] prefetch: expert ids, best score first */
    std::vector<uint64_t> rank_keys;  /* [n_experts] prefetch: rank_scores' keys */
    std::vector<double> decay;        /* decay[a] = 2^(-a / decay_h): record_selection's factor */
    float decay_h = 0.0f;
    /* Batch replay only (nullptr elsewhere): the route call's rows ranked once per trace
     * and shared by every configuration (moecache_rank_rows): row t's first
     * sub_rank_count[t] entries at sub_rank + t * MOECACHE_RANK_WIDTH */
    const uint16_t * sub_rank = nullptr;
    const uint8_t * sub_rank_count = nullptr;
    const float * sel_probs = nullptr; /* [rows * k] the selected experts' probabilities */
    VictimQueue victims;
    int64_t pin_epoch = 0;
    int64_t token_epoch = 0;

    void reserve(int32_t n_experts, int32_t n_tokens, int32_t k);
};

}  // namespace moecache_core

struct moecache {
    int32_t n_layers = 0;
    int32_t n_experts = 0;
    int32_t top_k = 0;
    int32_t slots = 0;
    int32_t ram_slots = 0; /* 0: RAM tier off (every expert in host memory) */
    moecache_policy policy{};
    moecache_policy pending{};
    bool has_pending = false;
    int64_t step = 0;
    int64_t clock = 0; /* LRU clock: +1 per use, so recency never ties */
    /* false only where the policy can never change to frequency eviction (a batch replay
     * of one fixed LRU policy): the decayed counts are then never read, so not kept */
    bool track_frequency = true;
    std::vector<moecache_core::LayerState> layers;
    moecache_core::EventRing events;
    moecache_core::Scratch scratch;
    mutable std::mutex mutex;
};

namespace moecache_core {

/* api.cpp: moecache_create with an event ring of `event_rows`. */
moecache * create(int32_t n_layers, int32_t n_experts, int32_t top_k, int32_t slots_per_layer,
                  const moecache_policy * policy, int32_t event_rows);

/* cache.cpp: slot maps of one layer. */
void layer_init(LayerState & L, int32_t n_experts, int32_t slots);
void layer_clear(LayerState & L);
void layer_insert(LayerState & L, int32_t expert, int32_t slot);
void layer_remove(LayerState & L, int32_t expert);
void lru_touch(LayerState & L, int32_t expert);
void lru_place(LayerState & L, int32_t expert);
int32_t layer_lowest_free_slot(LayerState & L);
int32_t acquire_slot(moecache & c, LayerState & L, int64_t pin_epoch, int32_t * victim,
                     int32_t more = 1);
int32_t insert_background(moecache & c, LayerState & L, int32_t layer, int32_t expert,
                          int64_t pin_epoch, bool prefetched, moecache_copy * plan,
                          int32_t * n_plan, int32_t * victim, RamFill * ram = nullptr,
                          int32_t more = 1);
void resize_layer(moecache & c, LayerState & L, int32_t slots);
void resize_ram(moecache & c, LayerState & L, int32_t ram_slots);

/* ram.cpp: the logical RAM tier under the slots. */
bool ram_on(const LayerState & L);
bool ram_has(const LayerState & L, int32_t expert);
bool ram_can_fill(const moecache & c, const LayerState & L, int32_t expert, int64_t pin_epoch);
bool ram_fill(moecache & c, LayerState & L, int32_t expert, int64_t pin_epoch, RamFill * out);
void ram_undo(LayerState & L, int32_t expert, const RamFill & f);
void ram_commit(moecache & c, LayerState & L, int32_t expert, const RamFill & f);

/* eviction.cpp: which resident expert leaves. */
int32_t pick_victim(moecache & c, LayerState & L, int64_t pin_epoch, int32_t more = 1);
int32_t pick_victim_scan(const moecache & c, const LayerState & L, int64_t pin_epoch);
void record_selection(LayerState & L, int32_t expert, int64_t step, float half_life);
void record_selection(LayerState & L, int32_t expert, int64_t step, float half_life,
                      Scratch & sc);
void refresh_frequency_keys(LayerState & L, float half_life);
void freq_order_insert(LayerState & L, int32_t expert); /* a new resident */
void freq_order_erase(LayerState & L, int32_t expert);  /* a resident leaves */
/* The best `want` substitutes of a row, kept in order (probability down, lower expert id
 * on ties) while the residents are met one by one: `beaten` says a candidate cannot enter
 * a full list (checked before the token's mark, which costs a load), `keep_best` inserts
 * it and returns the list's new length. Shared by pick_substitutes and the replay loop,
 * whose picks must be the same to the last tie. */
inline bool beaten(float p, int32_t e, int32_t want, int32_t n, const float * best_p,
                   const int32_t * out) {
    return n == want && (p < best_p[want - 1] || (p == best_p[want - 1] && e > out[want - 1]));
}

inline int32_t keep_best(float p, int32_t e, int32_t want, int32_t n, float * best_p,
                         int32_t * out) {
    int32_t at = n == want ? want - 1 : n++;
    while (at > 0 && (p > best_p[at - 1] || (p == best_p[at - 1] && e < out[at - 1]))) {
        best_p[at] = best_p[at - 1];
        out[at] = out[at - 1];
        --at;
    }
    best_p[at] = p;
    out[at] = e;
    return n;
}

/* after a resident's last_use or freq_key changed */
inline void freq_order_rekey(LayerState & L, int32_t expert) {
    if (L.fq_valid && L.slot_of[expert] >= 0) {
        freq_order_erase(L, expert);
        freq_order_insert(L, expert);
    }
}

/* rules.cpp: miss rules, substitution, policies. */
bool policy_valid(const moecache_policy & p);
int32_t preset(const char * name, moecache_policy * out);
bool miss_rule_fetches(const moecache_policy & p, int32_t rank, float normalized_weight,
                       bool disk_only);
int32_t pick_substitute(const LayerState & L, const float * probs_row,
                        const std::vector<int64_t> & token_mark, int64_t token);
/* rank_row: the row's first rank_count experts in pick_substitute's order (the batch
 * replay's SubstituteRanking; rank_count 0: none, scan) */
int32_t pick_substitutes(const LayerState & L, const float * probs_row,
                         std::vector<int64_t> & token_mark, int64_t token, int32_t want,
                         int32_t * out, const uint16_t * rank_row = nullptr,
                         int32_t rank_count = 0);

/* admission.cpp: background admission of experts that lost enough mass. */
void admit_lost_mass(moecache & c, LayerState & L, int32_t layer, int32_t n_tokens,
                     const int32_t * ids, moecache_copy * plan, int32_t * n_plan);

/* prefetch.cpp: PSR, predicted experts of the next layer (see moecache_prefetch). */
int32_t prefetch(moecache & c, int32_t layer, int32_t n_tokens, const float * scores,
                 moecache_copy * plan, int32_t plan_cap, int32_t * n_plan);
int32_t prefetch_per_token(const moecache & c);
/* Row `row`'s best `keep` of n experts (at most n) into out, best first: score descending,
 * ties by lower id, NaN as -inf (moecache_prefetch's order); keys: min(keep, n) of scratch. */
void rank_scores(const float * row, int32_t n, int32_t keep, uint64_t * keys, int32_t * out);
bool prefetch_ranked(moecache & c, int32_t layer, const int32_t * ranked, int32_t count,
                     moecache_copy * plan, int32_t plan_cap, int32_t * n_plan);

/* route.cpp: one route call, under the caller's lock. */
int32_t route(moecache & c, int32_t layer, int32_t n_tokens, const float * probs,
              const int32_t * ids, float * weights, int32_t * out_ids, int32_t * out_slots,
              moecache_copy * plan, int32_t plan_cap, int32_t * n_plan);

/* replay_loop.cpp: the batch replay's own decision loop for one configuration.
 * fast_covers: whether it decides this configuration (fixed policy and budget, no event
 * rows, the trace's ranking set, every row's ids valid); replay_fast then replays it exactly
 * as the per-call core would. replay_fast_configs counts the configurations it replayed. */
extern std::atomic<int64_t> replay_fast_configs;
extern std::atomic<int64_t> replay_scan_configs; /* those of them finding victims by scan */
extern std::atomic<int64_t> replay_reused_configs; /* configurations given another's run */
bool fast_covers(const moecache_replay_trace & t, const moecache_replay_config & cfg,
                 bool ids_valid, bool events);
/* A worker's buffers for ranking rows of n experts (moecache_rank_rows). */
struct RankScratch {
    std::vector<uint64_t> keys;
    std::vector<int32_t> idx;
    std::vector<float> vals; /* n + 8: padded for the vector loops */
    explicit RankScratch(int32_t n)
        : keys(static_cast<size_t>(n)), idx(static_cast<size_t>(n)),
          vals(static_cast<size_t>(n) + 8) {}
};
/* Row `row` of n experts ranked for substitution (moecache_rank_rows' contract): its best
 * experts at out (MOECACHE_RANK_WIDTH at most), how many returned, 0 for a row holding a
 * NaN. rank_row is rank_row_reference's result, entry for entry, faster. */
int32_t rank_row(const float * row, int32_t n, RankScratch & s, uint16_t * out);
int32_t rank_row_reference(const float * row, int32_t n, RankScratch & s, uint16_t * out);
struct FastPlan;      /* what the configurations of a batch share (fast_plan_new) */
struct FastWorkspace; /* buffers a worker reuses from one configuration to the next */
FastPlan * fast_plan_new(const moecache_replay_trace & t, const moecache_replay_config * configs,
                         int32_t n_configs, bool ids_valid, int32_t n_threads);
/* The plan with the parts the flags ask for (a kept moecache_replay_plan asks for all the
 * trace has, so that it serves any later batch); fast_plan_new asks for what `configs` read.
 * half_life > 0: each selection's frequency key for that half-life too. */
FastPlan * fast_plan_pack(const moecache_replay_trace & t, bool substitutes, bool bonus,
                          bool prefetches, float half_life, int32_t n_threads);
void fast_plan_free(FastPlan * plan);
int64_t fast_plan_bytes(const FastPlan & plan); /* what the plan holds, in bytes */
FastWorkspace * fast_workspace_new();
void fast_workspace_free(FastWorkspace * w);
/* A configuration's share of a batch's progress (moecache_replay_control): the replay
 * loops call layer_done after each layer (the per-call core after a token's share of one);
 * false means the caller cancelled, and the configuration stops with MOECACHE_E_CANCELLED. */
struct ReplayTicker {
    moecache_replay_control * ctl = nullptr;
    int64_t units = 0; /* counted for this configuration so far */
    bool layer_done(int64_t n = 1);
    bool cancelled() const;
};
/* evicted (optional): whether any layer ever wanted a slot with every slot full (an eviction,
 * or the failure to find one). Where none did, nothing the loop decided read the budget, so
 * the results are those of the same policy at any larger budget that prefetches as many
 * experts (run_batch's reuse of a run). */
int32_t replay_fast(const moecache_replay_trace & t, const FastPlan & plan,
                    const moecache_replay_config & cfg, moecache_replay_token * out,
                    FastWorkspace & w, ReplayTicker * ticker = nullptr,
                    bool * evicted = nullptr);
/* the experts a configuration's PSR prefetches per token (0: none, as without predictions) */
int32_t prefetch_per_token(const moecache_replay_trace & t, const moecache_policy & p,
                           int32_t slots);

}  // namespace moecache_core

#endif /* MOECACHE_INTERNAL_H */
