/*
 * moecache.h — MoEScope's expert-cache core: the C API.
 *
 * Interface drafted by the lead and implemented in native/src/. Keep the names (they are
 * the paper's words) and tell the lead about any change: the llama.cpp glue (engine_patch/)
 * and the Python binding (moescope.core.native, which mirrors these structs) call it.
 *
 * The core DECIDES and never copies bytes (like vLLM's block manager): for every routed
 * expert it says hit / fetch / substitute, keeps the LOGICAL cache (which experts count as
 * resident, in which slot), and returns a COPY PLAN the caller executes against real memory
 * (the engine) or a cost model (the simulator). Decisions depend only on the logical cache
 * and the router inputs, never on when copies finish, so they are deterministic.
 *
 * No llama.cpp dependency. Compiled standalone (libmoecache.so, tests) and into libllama.
 */
#ifndef MOECACHE_H
#define MOECACHE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define MOECACHE_API __declspec(dllexport)
#else
#define MOECACHE_API __attribute__((visibility("default")))
#endif

#define MOECACHE_MAX_K 32 /* largest top-k the event rows can hold */

/* Defaults shared by the presets and the Python Policy (moescope.core.policy). */
#define MOECACHE_DEFAULT_THETA      0.15f  /* paper 1: the 0.15 rule */
#define MOECACHE_DEFAULT_BETA       0.5f   /* paper 1: background admission threshold */
#define MOECACHE_DEFAULT_HALF_LIFE  64.0f  /* ours: frequency half-life, in steps (tokens) */
#define MOECACHE_DEFAULT_EVENT_ROWS 8192   /* event ring capacity, rows */
#define MOECACHE_DEFAULT_BONUS      0.07f  /* ours: Cache-Prior routing bonus (gate weight) */
#define MOECACHE_PREFETCH_TOP_K     (-1)   /* policy.prefetch: as many as the router selects */
#define MOECACHE_THETA_DISK_AS_THETA (-1.0f) /* policy.theta_disk: the same threshold as theta */
#define MOECACHE_SUGGESTED_THETA_DISK 0.3f /* a disk threshold that trades quality for reads
                                             (no preset uses it: on code it cost +2-4%) */

/* Return codes of the functions that return int32_t status. */
enum moecache_status {
    MOECACHE_OK          = 0,
    MOECACHE_E_ARG       = -1, /* bad argument (range, NULL, duplicate id in a token) */
    MOECACHE_E_NO_SLOT   = -2, /* the batch needs more distinct experts than there are slots */
    MOECACHE_E_PLAN_CAP  = -3, /* plan_cap < min(slots_per_layer, n_tokens * top_k) */
    MOECACHE_E_CANCELLED = -4, /* a batch replay stopped by moecache_replay_cancel */
    /* MOECACHE_E_NO_SLOT is also returned when the RAM tier cannot hold the call's reads */
};

/* What to do with a routed expert that is not resident (paper 1, "miss rules"). */
enum moecache_miss_rule {
    MOECACHE_FETCH_ALL      = 0, /* wait for every miss: exact output */
    MOECACHE_THRESHOLD      = 1, /* fetch if first choice or w_i / sum_k w >= theta
                                    (>= theta_disk when the expert is only on disk) */
    MOECACHE_FIRST_CHOICE   = 2, /* fetch only a missing first choice */
    MOECACHE_SUBSTITUTE_ALL = 3, /* substitute every miss (reference for what it costs) */
    MOECACHE_ROUTING_BONUS  = 4, /* paper 2, Cache-Prior: route as if every resident expert's
                                    gate weight were raised by policy.bonus, i.e. the top-k of
                                    p + bonus * S * resident, S = sum of the router's selected
                                    probabilities (so the bonus is in the units of theta, the
                                    same for 64 or 512 experts). A miss is replaced by the best
                                    resident the token does not use when p_sub + bonus * S >
                                    p_miss (lowest-probability misses first, which makes the
                                    result exactly that top-k); every other miss is fetched. */
};

/* Which resident expert makes room (never one used by the current route call).
 * LRU: least recently used (hit, fetched, used as substitute, or admitted); ties by lower id.
 * FREQUENCY: lowest exponentially decayed count of router selections (hit, fetch or miss
 * alike), decayed lazily with policy.half_life steps; ties by LRU, then lower id. */
enum moecache_eviction {
    MOECACHE_EVICT_LRU       = 0,
    MOECACHE_EVICT_FREQUENCY = 1, /* exponentially decayed use counts, half-life in tokens */
};

/* Which gate weight a substitute expert gets. */
enum moecache_substitute_weight {
    MOECACHE_SUBW_MISSING = 0, /* the missing expert's gate weight (default, paper 1) */
    MOECACHE_SUBW_OWN     = 1, /* its own router probability, scaled as the router scaled
                                  the missing one's: p_sub * (w_i / p_i) */
};

/* Per selected expert, what the core decided. */
enum moecache_action {
    MOECACHE_HIT        = 0,
    MOECACHE_FETCH      = 1,
    MOECACHE_SUBSTITUTE = 2,
};

typedef struct moecache_policy {
    int32_t miss_rule;         /* enum moecache_miss_rule */
    float   theta;             /* THRESHOLD: 0.15 in the paper */
    int32_t eviction;          /* enum moecache_eviction */
    float   half_life;         /* half-life of use counts, in steps (> 0; kept even under LRU) */
    int32_t admission;         /* 1: background admission on */
    float   beta;              /* admission threshold on accumulated lost mass: 0.5 */
    int32_t substitute_weight; /* enum moecache_substitute_weight */
    float   bonus;             /* ROUTING_BONUS: added to a resident expert's gate weight, >= 0 */
    int32_t prefetch;          /* paper 2, PSR: experts of the next layer to bring in per token
                                  from moecache_prefetch's prediction; 0 = off, -1 = top_k */
    float   theta_disk;        /* THRESHOLD, RAM tier on: the threshold for a miss that is only
                                  on disk (not in the RAM tier); -1 = theta. In [0, 1] or -1 */
    int32_t fill_free;         /* 1: while the layer has a free slot, a miss is fetched into it
                                  whatever the rule (an empty slot stands in for nothing; at a
                                  budget holding every expert the output is Exact's); 0: the
                                  rule alone (traces recorded before this field) */
} moecache_policy;

/* One expert copy the caller must perform: host bytes of `expert` into `slot` of `layer`.
 * With the RAM tier on (moecache_set_ram_slots), the bytes come from RAM-tier slot
 * `ram_slot` of the layer; from_disk == 1 means the expert must first be read from the
 * model file into that RAM slot (the RAM tier admits every expert it serves). With the
 * tier off, ram_slot is -1 and the bytes come from the host copy of every expert.
 * async == 0: needed before this layer's matmul (a fetch). async == 1: background
 * admission; the slot counts as resident at once (logical cache) and a later token that
 * uses it must wait for the copy to finish. A later plan may reuse the same slot (eviction),
 * so the executor must finish copies into one slot in plan order (e.g. one copy stream). */
typedef struct moecache_copy {
    int32_t layer;
    int32_t expert;
    int32_t slot;
    int32_t async;
    int32_t ram_slot;   /* RAM-tier slot holding (or receiving) the expert; -1: tier off */
    int32_t from_disk;  /* 1: read the expert from the file into ram_slot first */
} moecache_copy;

/* One row per (step, layer, token in batch). `weights` are the router's gate weights of
 * `ids`, normalized over the top-k (before any substitute weight is applied). */
typedef struct moecache_event {
    int64_t step;
    int32_t layer;
    int32_t token;                       /* index within the routed batch */
    int32_t k;
    int32_t ids[MOECACHE_MAX_K];         /* router's selection, router order */
    float   weights[MOECACHE_MAX_K];     /* normalized gate weights */
    int8_t  action[MOECACHE_MAX_K];      /* enum moecache_action */
    int32_t used_ids[MOECACHE_MAX_K];    /* expert actually computed (substitute for SUBSTITUTE) */
    int32_t slots[MOECACHE_MAX_K];
    float   substituted_mass;            /* sum of normalized weights of substituted experts */
    int32_t n_hit, n_fetch, n_substitute;
    int32_t n_admit, n_evict;
    int32_t admitted[MOECACHE_MAX_K];    /* first min(n_admit, MAX_K) admitted experts */
    int32_t evicted[MOECACHE_MAX_K];     /* first min(n_evict, MAX_K) evicted experts */
    int64_t bytes_sync;                  /* bytes fetched synchronously for this row */
    int64_t bytes_async;                 /* bytes of background admissions scheduled */
    int8_t  tier[MOECACHE_MAX_K];        /* per selection: 0 in a slot, 1 in RAM, 2 only on disk
                                            (as the call began; tier off: 1 for every miss) */
    int32_t n_disk;                      /* slot fills of this row read from disk */
    int64_t bytes_disk;                  /* their bytes (fetches and admissions) */
} moecache_event;

typedef struct moecache_layer_stats {
    int64_t tokens;
    int64_t selections;
    int64_t hits;
    int64_t fetches;
    int64_t substitutions;
    int64_t admissions;
    int64_t evictions;
    double  substituted_mass;
    int64_t bytes_sync;
    int64_t bytes_async;
    int64_t resize_evictions;  /* experts dropped by moecache_set_slots (no event rows) */
    int64_t prefetches;        /* experts brought in by moecache_prefetch (async copies) */
    int64_t prefetch_hits;     /* of those, routed to (a hit) before being evicted */
    int64_t ram_fills;         /* slot fills (fetch, admission, prefetch) served from the RAM tier */
    int64_t disk_fills;        /* slot fills read from disk (tier on only) */
    int64_t bytes_disk;        /* bytes read from disk */
    int64_t ram_evictions;     /* experts dropped from the RAM tier (reads and resizes) */
} moecache_layer_stats;

typedef struct moecache moecache;

/* Presets: "exact", "quality-first", "speed-first", "cache-prior", "psr", "substitute-all",
 * "threshold", "first-choice". Returns 0, or -1 for an unknown name. cache-prior and psr are
 * paper 2's (routing bonus with frequency eviction and admission; psr adds prefetch of the
 * predicted top-k); the last three are the bare miss rules of paper 1 (LRU, no admission). */
MOECACHE_API int32_t moecache_preset(const char * name, moecache_policy * out);

/* Every slot starts free. Returns NULL on bad arguments: n_layers >= 1,
 * 1 <= top_k <= min(MOECACHE_MAX_K, n_experts), top_k <= slots_per_layer <= n_experts,
 * a valid policy (NULL: the "exact" preset). */
MOECACHE_API moecache * moecache_create(int32_t n_layers, int32_t n_experts, int32_t top_k,
                                        int32_t slots_per_layer, const moecache_policy * policy);
MOECACHE_API void      moecache_destroy(moecache * c);

/* Takes effect at the next moecache_begin_step. Returns 0 or MOECACHE_E_ARG on bad
 * parameters (unknown enum, theta outside [0, 1], half_life <= 0, beta <= 0, bonus < 0 or
 * not finite, prefetch < -1). */
MOECACHE_API int32_t moecache_set_policy(moecache * c, const moecache_policy * policy);
/* The ACTIVE policy (a pending one shows only after the next moecache_begin_step). */
MOECACHE_API void    moecache_get_policy(const moecache * c, moecache_policy * out);

/* Resize every layer to `slots` (>= top_k, <= n_experts), immediately (call it between
 * tokens). Shrinking evicts by the active eviction rule and compacts residents into slots
 * [0, slots): residents already below `slots` stay put, the others move, in slot order, to
 * the lowest free slots. Growing adds free slots. The caller then reallocates its slot
 * buffers and re-copies every resident expert (see moecache_layer_slots). Returns 0 or <0. */
MOECACHE_API int32_t moecache_set_slots(moecache * c, int32_t slots);
MOECACHE_API int32_t moecache_get_slots(const moecache * c);

/* The RAM tier (a LOGICAL record like the slots): `ram_slots` experts per layer held in host
 * memory; every other expert is only in the model file. 0 turns the tier off: every expert
 * counts as in host memory (today's engine, the default). Otherwise top_k <= ram_slots <=
 * n_experts. A slot fill of an expert not in the tier reads it from disk into a RAM slot
 * (free, else evicted by the policy's eviction rule, never one the same call reads from).
 * Shrinking evicts and compacts like moecache_set_slots; turning the tier on starts it
 * empty. Decisions depend on this record, never on I/O timing. Returns 0 or <0. */
MOECACHE_API int32_t moecache_set_ram_slots(moecache * c, int32_t ram_slots);
MOECACHE_API int32_t moecache_get_ram_slots(const moecache * c);
/* expert -> RAM slot (-1: only on disk; every entry -1 when the tier is off), n_experts
 * entries; and RAM slot -> expert (-1 free), ram_slots entries. */
MOECACHE_API void moecache_layer_ram(const moecache * c, int32_t layer, int32_t * ram_slot_of_expert);
MOECACHE_API void moecache_layer_ram_slots(const moecache * c, int32_t layer, int32_t * expert_of_ram_slot);

/* Bytes one expert occupies in `layer` (all its matrices), for the byte counters. */
MOECACHE_API void moecache_set_expert_bytes(moecache * c, int32_t layer, int64_t bytes);

/* Start a new token (decode step): applies a pending policy, advances the step (the time
 * of frequency decay and of event rows). The step starts at 0 and is 1 after the first call. */
MOECACHE_API void    moecache_begin_step(moecache * c);
MOECACHE_API int64_t moecache_step(const moecache * c);

/* Decide for n_tokens tokens of one layer.
 *   probs   [n_tokens * n_experts] router probabilities (choosing substitutes)
 *   ids     [n_tokens * k] selected experts, router order (ids[0] = first choice)
 *   weights [n_tokens * k] gate weights as the router produced them (in/out: a substitute
 *           gets the weight given by policy.substitute_weight)
 *   out_ids [n_tokens * k] expert actually used; out_slots [n_tokens * k] its slot
 *   plan    room for plan_cap copies; *n_plan receives the count. Sync fetches come first
 *           (decision order), then async admissions. plan_cap >= min(slots, n_tokens * k)
 *           always suffices and is required (else MOECACHE_E_PLAN_CAP).
 * Experts used by any token of the call (hits, fetches, substitutes) are never evicted
 * during it; admissions are decided after every token's fetches. Ids must be in range and
 * distinct within a token. Returns MOECACHE_OK, MOECACHE_E_NO_SLOT when the batch needs more
 * distinct experts than there are slots (only possible when n_tokens * k > slots; the glue
 * then keeps llama.cpp's original path), or MOECACHE_E_ARG / MOECACHE_E_PLAN_CAP. On any
 * error nothing changes (cache, weights, stats, events); out_ids/out_slots are undefined. */
MOECACHE_API int32_t moecache_route(moecache * c, int32_t layer, int32_t n_tokens,
                                    const float * probs, const int32_t * ids, float * weights,
                                    int32_t * out_ids, int32_t * out_slots,
                                    moecache_copy * plan, int32_t plan_cap, int32_t * n_plan);

/* PSR (paper 2): bring the experts predicted for `layer` into the logical cache before that
 * layer routes. `scores` [n_tokens * n_experts] rank the experts per token (the engine
 * applies `layer`'s router to the previous layer's hidden state); each token's top
 * policy.prefetch (ties: lower id) that are not resident take a free or evicted slot (never
 * another predicted one) and become ASYNC copies in `plan`: resident at once, so the routing
 * bonus and hits see them, while the copy overlaps computation. Nothing happens when
 * policy.prefetch is 0. plan_cap >= min(slots, n_tokens * prefetch) is required. Counted in
 * moecache_layer_stats (prefetches, bytes_async, evictions); no event row. Returns 0 or <0,
 * and on error nothing changes. */
MOECACHE_API int32_t moecache_prefetch(moecache * c, int32_t layer, int32_t n_tokens,
                                       const float * scores, moecache_copy * plan,
                                       int32_t plan_cap, int32_t * n_plan);

/* PSR's ranking without a cache: each of n_rows rows of n_experts scores ranked as
 * moecache_prefetch ranks them (score descending, ties by lower id, NaN last), its first
 * min(keep, n_experts) ids at out[r * min(keep, n_experts)]. What a trace keeps of each
 * prediction. Returns MOECACHE_OK, or MOECACHE_E_ARG (a bad argument, or no memory for
 * n_experts keys). */
MOECACHE_API int32_t moecache_rank_predictions(const float * scores, int64_t n_rows,
                                               int32_t n_experts, int32_t keep, int32_t * out);

/* expert -> slot (-1 if not resident), n_experts entries; and slot -> expert (-1 free). */
MOECACHE_API void moecache_layer_experts(const moecache * c, int32_t layer, int32_t * slot_of_expert);
MOECACHE_API void moecache_layer_slots(const moecache * c, int32_t layer, int32_t * expert_of_slot);

/* Admission accumulators: per expert, the normalized gate mass lost to substitution since
 * it was last brought into the cache (n_experts entries). */
MOECACHE_API void moecache_layer_lost_mass(const moecache * c, int32_t layer, float * lost_mass);

/* Event ring buffer: returns rows copied (oldest first) and removes them. When full, a new
 * row overwrites the oldest, which is counted in moecache_events_dropped (cumulative).
 * Capacity 0 stops recording. Changing the capacity keeps the newest rows that fit. */
MOECACHE_API int32_t moecache_drain_events(moecache * c, moecache_event * out, int32_t cap);
MOECACHE_API int32_t moecache_events_pending(const moecache * c);
MOECACHE_API int64_t moecache_events_dropped(const moecache * c);
MOECACHE_API void    moecache_set_event_capacity(moecache * c, int32_t rows);

MOECACHE_API void moecache_get_layer_stats(const moecache * c, int32_t layer, moecache_layer_stats * out);
MOECACHE_API void moecache_reset_stats(moecache * c);

/* Forget all residency (every slot free), accumulators, recency and frequency; keeps
 * policy, slots, step, stats and events. */
MOECACHE_API void moecache_clear(moecache * c);

/* Audits (issue 20): the route of an audited token as if every miss were fetched, deciding
 * nothing. For n_tokens tokens of `layer` (ids [n_tokens * top_k], router order), out_slots
 * receives each selection's slot: a resident's own, or a SCRATCH slot numbered from
 * moecache_get_slots (slots, slots + 1, ...; one per distinct missing expert) that the caller
 * holds outside the cache. `plan` receives one synchronous copy per scratch slot; with the
 * RAM tier on, ram_slot is the expert's RAM slot or -1 with from_disk = 1 (read it from the
 * file straight into the scratch slot: the RAM tier admits nothing). Changes NOTHING (no
 * eviction, admission, recency, frequency, accumulator, stats, event row or step), so a
 * policy's run is the same with or without audits. plan_cap >= n_tokens * top_k suffices.
 * Returns 0, MOECACHE_E_ARG or MOECACHE_E_PLAN_CAP. */
MOECACHE_API int32_t moecache_audit_route(const moecache * c, int32_t layer, int32_t n_tokens,
                                          const int32_t * ids, int32_t * out_slots,
                                          moecache_copy * plan, int32_t plan_cap,
                                          int32_t * n_plan);

MOECACHE_API const char * moecache_version(void);

/* ---- Batch replay: the router-logit simulator's fast path (batch_replay.cpp) ----------
 * A recorded trace replayed under many (policy, slots) configurations in one call, with
 * no caller code per token: each configuration runs on a fresh cache exactly as a caller
 * would drive moecache_begin_step / moecache_set_policy / moecache_set_slots /
 * moecache_route / moecache_prefetch from the trace, so the decisions are the per-call
 * API's. Configurations run in parallel (one thread per configuration at a time). */

/* A trace's routing in flat arrays (the caller keeps them alive during the call). Route
 * call c decides rows [call_start[c], call_stop[c]) of layer call_layer[c] after walking
 * the core's step up to call_step[c]; token t owns calls [token_calls[t], token_calls[t+1])
 * and, before them, changes i with change_token[i] == t (in order). */
typedef struct moecache_replay_trace {
    int32_t n_layers;
    int32_t n_experts;
    int32_t top_k;
    int32_t pred_width;              /* ranked predictions per row (0: none recorded) */
    int64_t initial_step;            /* the core's step when recording began */
    int32_t start_slots;             /* slots per layer when recording began */
    moecache_policy start_policy;    /* policy when recording began */
    const int64_t * expert_bytes;    /* [n_layers] bytes of one expert (0: dense layer) */
    int64_t n_rows;
    const float * probs;             /* [n_rows * n_experts] router probabilities */
    const int32_t * ids;             /* [n_rows * top_k] router's selection */
    const float * weights;           /* [n_rows * top_k] raw gate weights (not written) */
    const int32_t * next_layer;      /* [n_rows] PSR: layer of the row's prediction, -1 none */
    const int32_t * predicted;       /* [n_rows * pred_width] ranked ids, -1 padded */
    int64_t n_calls;
    const int64_t * call_step;
    const int32_t * call_layer;
    const int64_t * call_start;
    const int64_t * call_stop;
    int64_t n_tokens;
    const int64_t * token_calls;     /* [n_tokens + 1] */
    int64_t n_changes;
    const int64_t * change_token;    /* [n_changes], non-decreasing */
    const int32_t * change_slots;    /* > 0: a budget change to that many slots; 0: policy */
    const moecache_policy * change_policy; /* [n_changes], read where change_slots == 0 */
    /* optional (NULL: the call ranks the rows itself): moecache_rank_rows's output for
     * probs, kept by the caller so that every batch over one trace shares one ranking (a
     * count above MOECACHE_RANK_WIDTH or an expert out of range: MOECACHE_E_ARG) */
    const uint16_t * ranks;          /* [n_rows * MOECACHE_RANK_WIDTH] */
    const uint8_t * rank_counts;     /* [n_rows] */
    const float * selected_probs;    /* [n_rows * top_k] */
} moecache_replay_trace;

typedef struct moecache_replay_config {
    moecache_policy policy;  /* the policy throughout, unless follow_policy */
    int32_t follow_policy;   /* 1: the trace's starting policy, then its policy changes */
    int32_t slots;           /* slots per layer throughout; 0: the trace's, changes included */
} moecache_replay_config;

/* What one configuration's cache did for one trace token (all its rows and copies). */
typedef struct moecache_replay_token {
    int64_t rows;
    int64_t selections;
    int64_t hits;
    int64_t fetches;
    int64_t substitutions;
    int64_t admissions;
    double  substituted_mass;
    int64_t bytes_sync;
    int64_t bytes_async;     /* admissions and PSR prefetches */
    int64_t n_sync;
    int64_t n_async;
    int64_t prefetches;
    int64_t prefetch_hits;
} moecache_replay_token;

#define MOECACHE_RANK_WIDTH 64 /* experts ranked per row for substitution, at most */

/* Ranks each of n_rows rows of router probabilities for substitution, once for all the
 * configurations a batch replays: row r's first rank_counts[r] experts in the order a
 * substitute is chosen (probability descending, ties by lower id) at
 * ranks[r * MOECACHE_RANK_WIDTH]; every other expert of the row ranks below them. A
 * substitute is then the first resident the row's ranking names, with no scan of a layer's
 * slots (the scan decides what the ranking does not reach, and a row holding a NaN, whose
 * count is 0). selected_probs[r * top_k + j] receives probs[r][ids[r * top_k + j]] (0 for
 * an id out of range), so the routing bonus reads no row. Needs n_experts < 65535. On up
 * to n_threads threads (<= 0: one per core). Returns MOECACHE_OK or MOECACHE_E_ARG. */
MOECACHE_API int32_t moecache_rank_rows(const float * probs, const int32_t * ids, int64_t n_rows,
                                        int32_t n_experts, int32_t top_k, int32_t n_threads,
                                        uint16_t * ranks, uint8_t * rank_counts,
                                        float * selected_probs);

/* Replays `trace` under each of `configs` on up to `n_threads` threads (<= 0: one per
 * configuration, at most the machine's). out: [n_configs * n_tokens], configuration-major.
 * events (optional, NULL for none): [n_configs * trace->n_rows] replayed event rows.
 * Returns MOECACHE_OK, MOECACHE_E_ARG for a malformed trace or configuration (nothing
 * replayed), or the first route/prefetch error of a configuration (its later tokens are
 * left zero). */
MOECACHE_API int32_t moecache_replay_batch(const moecache_replay_trace * trace,
                                           const moecache_replay_config * configs,
                                           int32_t n_configs, int32_t n_threads,
                                           moecache_replay_token * out,
                                           moecache_event * events);

/* Progress and cancel for a batch replay that another thread watches (a window's what-if):
 * opaque, made and freed by the caller, any number of batches one after another. Counting
 * is atomic; every function may be called from any thread while a batch runs. */
typedef struct moecache_replay_control moecache_replay_control;

MOECACHE_API moecache_replay_control * moecache_replay_control_new(void); /* NULL: no memory */
MOECACHE_API void moecache_replay_control_free(moecache_replay_control * ctl);

/* Asks the batch to stop: it takes no new configuration and stops a running one at its next
 * layer (or token, for one the per-call core replays), then returns MOECACHE_E_CANCELLED.
 * Sticky: a batch started on a cancelled control returns at once; new() for another. */
MOECACHE_API void moecache_replay_cancel(moecache_replay_control * ctl);

/* Where the batch stands: configurations finished, and work units done of the total (one
 * unit per configuration and trace layer: a smooth bar). Any pointer may be NULL. */
MOECACHE_API void moecache_replay_progress(const moecache_replay_control * ctl,
                                           int64_t * configs_done, int64_t * units_done,
                                           int64_t * units_total);

/* moecache_replay_batch, counted on `ctl` (NULL: as moecache_replay_batch) and stopped by
 * moecache_replay_cancel (MOECACHE_E_CANCELLED: `out` and `events` are partly written). The
 * counts start again at 0 for each call. */
MOECACHE_API int32_t moecache_replay_batch_ctl(const moecache_replay_trace * trace,
                                               const moecache_replay_config * configs,
                                               int32_t n_configs, int32_t n_threads,
                                               moecache_replay_token * out,
                                               moecache_event * events,
                                               moecache_replay_control * ctl);

/* A trace's replay plan: the per-trace work every batch call would otherwise redo, made
 * once and kept beside the trace (as its ranking is) for any number of later batches of any
 * configurations: the trace validated (every row's predictions and router ids), and the
 * rows the replay loop reads packed layer by layer (ids, gate weights, ranking, the
 * selection's and the ranked experts' probabilities, predictions). Without the trace's own
 * ranking (ranks NULL) the plan ranks the rows itself and keeps that too. What it holds is
 * a copy: 20 * top_k + 257 bytes a row (4 * top_k + 129 more without the trace's ranking;
 * 8 * top_k of it each selection's frequency key, for MOECACHE_DEFAULT_HALF_LIFE), and up to
 * 104 + 4 * pred_width bytes a route call (moecache_replay_plan_bytes says exactly; 689
 * bytes a row at top-10, 32 predictions and a call a row, beside 2,048 bytes of
 * probabilities at 512 experts).
 * Opaque; read-only once made, so batches on several threads may share one. */
typedef struct moecache_replay_plan moecache_replay_plan;

/* The plan of `trace`, on up to n_threads threads (<= 0: one per core). NULL for a trace
 * moecache_replay_batch would refuse (MOECACHE_E_ARG), or no memory. The plan is bound to
 * the trace's row and call arrays as they are now (their addresses and contents) and to its
 * dimensions and initial step; start_slots, start_policy, expert_bytes and the changes may
 * differ from one batch to the next. */
MOECACHE_API moecache_replay_plan * moecache_replay_plan_new(const moecache_replay_trace * trace,
                                                             int32_t n_threads);
MOECACHE_API void moecache_replay_plan_free(moecache_replay_plan * plan);
/* The memory the plan holds, in bytes (0 for NULL). */
MOECACHE_API int64_t moecache_replay_plan_bytes(const moecache_replay_plan * plan);

/* moecache_replay_batch_ctl over `plan`, made by moecache_replay_plan_new for this trace:
 * the same results to the bit, without validating the rows again or packing them. Returns
 * MOECACHE_E_ARG (nothing replayed) for a plan made for another trace (other dimensions,
 * initial step or arrays) and for what moecache_replay_batch_ctl refuses; the rows must
 * hold what they held when the plan was made (the plan cannot see a change in place). */
MOECACHE_API int32_t moecache_replay_batch_plan(const moecache_replay_trace * trace,
                                                const moecache_replay_plan * plan,
                                                const moecache_replay_config * configs,
                                                int32_t n_configs, int32_t n_threads,
                                                moecache_replay_token * out,
                                                moecache_event * events,
                                                moecache_replay_control * ctl);

#ifdef __cplusplus
}
#endif

#endif /* MOECACHE_H */
