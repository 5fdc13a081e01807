/*
 * replay_loop.cpp — the batch replay's decision loop for one fixed configuration.
 *
 * moecache_replay_batch drives the per-call core (route.cpp) once per recorded route call;
 * that path keeps what a live engine needs (events, per-layer stats, copy plans, undo
 * records, slot-order indexes, per-call validation), about 45 ns per selected expert. A
 * what-if only needs each token's totals, so this loop keeps only the state they depend on:
 * per (layer, expert) residency, recency, the decayed count where the eviction reads it,
 * admission's lost mass and PSR's prefetched flag; per layer the slots (a NaN row's
 * substitute depends on their order) and the eviction order. It decides exactly what
 * route.cpp and prefetch.cpp decide, in the same order for each layer:
 *   - one layer after another (FastPlan: each layer's route calls and the prefetches aimed
 *     at it, in trace order, with their rows packed once for every configuration: per trace
 *     in a kept moecache_replay_plan, else per batch);
 *   - victims: LRU from a list of residents in recency order (pinned ones skipped; a call's
 *     uses moved to the tail with the tail in a register, a fetch linked at its first use);
 *     frequency from a bucket queue: each resident listed under floor(key * q), a lower
 *     bound of its current key (a selection only raises a key), moved up when its bucket
 *     is reached (singly linked: a walk from a list's head knows each entry's predecessor,
 *     so neither a move nor an eviction needs back links); a fetch, and a PSR prefetch that
 *     its layer's next call selects, listed only once that selection has set its key
 *     (pinned until then); the least (key, recency, id) of the first bucket holding an
 *     unpinned resident is the victim (bq_victim); under PSR's prefetches (several victims
 *     a call) in layers of few slots, the next victims of a call from one scan of its
 *     unpinned residents instead (scan_fill);
 *   - every selection hits once every expert is resident (no resize in this loop);
 *   - substitute-all without admission or prefetch, once it holds top-k residents, never
 *     fetches again and nothing reads which resident stands in: its rows are counted only;
 *   - the frequency key log2(f) + step / h after each selection from the plan, where it has
 *     them for the policy's half-life (a selection's count depends only on the trace: every
 *     configuration counts every selection), else from the same doubles record_selection
 *     keeps, only when a victim search needs it;
 *   - a row's misses, fetches and substitutes as bit masks over its selections;
 *   - substitutes from the trace's shared ranking (the plan's copy without the row's own
 *     selections), as pick_substitutes.
 * Covered: fixed policy and budget (no policy or budget change followed), no event rows,
 * a ranking where the policy substitutes, valid router ids, and frequency keys whose
 * increase outruns their rounding (see fast_covers). Anything else, and the RAM tier
 * (which the batch replay does not model), runs the per-call core (batch_replay.cpp).
 */
#include "moecache_internal.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif
#if defined(__SSE2__) && defined(__GNUC__) /* x86-64 GCC and Clang */
#include <emmintrin.h>
#define MOECACHE_LOOP_SSE2 1
#endif

namespace moecache_core {

std::atomic<int64_t> replay_fast_configs{0};
std::atomic<int64_t> replay_scan_configs{0};
std::atomic<int64_t> replay_reused_configs{0};

namespace loop { /* named: the engine compiles the core as one unit */

constexpr double kNoCount = -1e300;
constexpr int32_t kRankP = 32; /* ranked probabilities a plan keeps per row (routing bonus) */
constexpr uint8_t kRankCount = 0x7F; /* a plan's rank count: the ranked experts it keeps, */
constexpr uint8_t kRankedAll = 0x80; /* and whether the trace's ranking named every expert */
constexpr int64_t kRowAhead = 2; /* a layer's route calls whose probability rows are asked for ahead */
constexpr int64_t kAheadWindow = 256; /* route calls over which the rows read are counted */
constexpr int64_t kAheadShare = 8;    /* ask ahead while over 1 in this many read the row */
constexpr int32_t kQueue = 16;    /* victims one scan keeps in order, at most */
constexpr int32_t kScanSlots = 40; /* frequency victims by scan (prefetching policies) up to */

/* Bit j set where w[j] >= theta, for j < k (a NaN compares false either way). */
inline uint32_t at_least(const float * w, int32_t k, float theta) {
    uint32_t bits = 0;
    int32_t j = 0;
#if MOECACHE_LOOP_SSE2
    const __m128 t = _mm_set1_ps(theta);
    for (; j + 4 <= k; j += 4) {
        const int m = _mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(w + j), t));
        bits |= static_cast<uint32_t>(m) << j;
    }
#endif
    for (; j < k; ++j) {
        bits |= static_cast<uint32_t>(w[j] >= theta) << j;
    }
    return bits;
}

/* The lowest `n` set bits of `m` (all of them when it has no more). */
inline uint32_t lowest_bits(uint32_t m, int32_t n) {
    uint32_t rest = m;
    for (; n > 0 && rest != 0; --n) {
        rest &= rest - 1;
    }
    return m & ~rest;
}

/* One expert of the layer being replayed: what every selection reads. */
struct Expert {
    int32_t last_use;  /* the layer's clock at its last use, 0 never */
    int16_t slot;      /* -1: not resident */
    int16_t prev;      /* LRU: residents in recency order, a ring through the sentinel E;
                        * E + 1 while inserted and not yet used (unlinked) */
    int16_t next;
    bool prefetched; /* brought in by PSR and not used since (a bool: its stores, unlike a
                      * byte's, alias nothing the loop keeps in registers) */
    bool unused;
};

/* Frequency eviction's count of one expert. */
struct Fq {
    double freq;   /* decayed selection count as of step */
    int32_t step;
    uint32_t kver; /* changes with its count (versions kkey_'s cache where the plan has no
                    * keys for the half-life) */
};

/* record_selection and the key (eviction.cpp's), with memoized decay factors: the same
 * doubles, for the loop and for the plan's keys alike. */
struct Decay {
    static constexpr int64_t kTable = 4096;
    double h;
    std::vector<double> factor; /* [kTable] 2^(-age / h) */

    explicit Decay(float half_life) : h(static_cast<double>(half_life)), factor(kTable) {
        for (int64_t i = 0; i < kTable; ++i) {
            factor[static_cast<size_t>(i)] = std::exp2(-static_cast<double>(i) / h);
        }
    }

    void record(Fq & x, int64_t step) const {
        const int64_t a = step - x.step;
        double f;
        if (a < 0 || a >= kTable) {
            const double age = static_cast<double>(a);
            f = x.freq * std::exp2(-age / h) + 1.0;
        } else {
            f = x.freq * factor[static_cast<size_t>(a)] + 1.0;
        }
        x.freq = f;
        x.step = static_cast<int32_t>(step);
        x.kver += 1;
    }

    double key(const Fq & x) const {
        return x.freq > 0.0 ? std::log2(x.freq) + static_cast<double>(x.step) / h : kNoCount;
    }
};

/* A row's first `want` substitutes, as pick_substitutes (rules.cpp) picks them. */
struct Substitutes {
    const Expert * X;
    const int32_t * expert_of; /* the layer's slots */
    const int32_t * n_full;    /* slots below it hold an expert, the others none */
    int32_t n_experts;
    int64_t * mark;
    int64_t * reads; /* rows whose probabilities were read (counted, for asking ahead) */
    const int32_t * own = nullptr; /* the row's own selections: no substitutes */
    int32_t k = 0;

    /* the row's own selections and the first n picks marked with `token`: only a search
     * beyond the row's ranking reads marks (the ranking names neither) */
    void mark_row(int64_t token, int32_t n, const int32_t * picks) const {
        for (int32_t j = 0; j < k; ++j) {
            mark[own[j]] = token;
        }
        for (int32_t i = 0; i < n; ++i) {
            mark[picks[i]] = token;
        }
    }

    /* pick_substitute: the reference scan in slot order (a NaN row) */
    int32_t one(const float * row, int64_t token) const {
        int32_t best = -1;
        float best_p = 0.0f;
        const int32_t slots = *n_full;
        for (int32_t s = 0; s < slots; ++s) {
            const int32_t e = expert_of[s];
            if (mark[e] == token) {
                continue;
            }
            const float p = row[e];
            if (best < 0 || p > best_p || (p == best_p && e < best)) {
                best = e;
                best_p = p;
            }
        }
        return best;
    }

    /* at_rank (optional): where each pick stands in the row's ranking, -1 outside it.
     * steer (optional, the routing bonus): the picks beyond the ranked ones are looked for
     * only if one could be taken: steer[n] < floor + bonus, where floor bounds every unranked
     * expert's probability (the bonus then gives no resident the miss at n, so no later one) */
    int32_t pick(const float * row, int64_t token, int32_t want, int32_t * out,
                 const uint16_t * rank_row, int32_t rank_count, bool ranked_all, int32_t n_res,
                 int32_t * at_rank = nullptr, const float * steer = nullptr,
                 float floor = 0.0f, float bonus = 0.0f) const {
        if (want <= 0) {
            return 0;
        }
        if (at_rank != nullptr) {
            std::fill(at_rank, at_rank + want, -1);
        }
        int32_t n = 0;
        if (rank_count > 0 && n_res <= 2 * want + 8) {
            /* so few residents that the ranking would mostly name others: the same picks
             * (a ranked row has no NaN) from the residents directly */
            mark_row(token, 0, out);
            return best_of_rest(row, token, want, out);
        }
        if (rank_count > 0) {
            /* without a branch on whether each is taken (residency is a coin toss per
             * entry): every entry is written at n, which moves on only when it is taken */
            if (at_rank != nullptr) {
                n = walk<true>(want, out, rank_row, rank_count, at_rank);
                if (n < want) {
                    at_rank[n] = -1;
                }
            } else {
                n = walk<false>(want, out, rank_row, rank_count, at_rank);
            }
            if (n == want || ranked_all ||
                (steer != nullptr && !(floor + bonus > steer[n]))) {
                return n;
            }
            mark_row(token, n, out);
            return n + best_of_rest(row, token, want - n, out + n);
        }
        mark_row(token, 0, out);
        ++*reads;
        float best_p[MOECACHE_MAX_K];
        bool nan = false;
        const int32_t slots = *n_full;
        for (int32_t s = 0; s < slots; ++s) {
            const int32_t e = expert_of[s];
            const float p = row[e];
            if (p != p) {
                nan = true;
                continue;
            }
            if (beaten(p, e, want, n, best_p, out) || mark[e] == token) {
                continue;
            }
            n = keep_best(p, e, want, n, best_p, out);
        }
        if (nan) {
            n = 0;
            while (n < want) {
                const int32_t r = one(row, token);
                if (r < 0) {
                    break;
                }
                out[n++] = r;
                mark[r] = token;
            }
            return n;
        }
        for (int32_t i = 0; i < n; ++i) {
            mark[out[i]] = token;
        }
        return n;
    }

    template <bool AtRank>
    int32_t walk(int32_t want, int32_t * out, const uint16_t * rank_row,
                 int32_t rank_count, int32_t * at_rank) const {
        int32_t n = 0;
        for (int32_t j = 0; j < rank_count; ++j) {
            const int32_t e = rank_row[j];
            const int32_t take = X[e].slot >= 0; /* the plan left out the row's own */
            out[n] = e;
            if (AtRank) {
                at_rank[n] = j;
            }
            n += take;
            if (n == want) {
                break;
            }
        }
        return n; /* marked (mark_row) only where a search goes on beyond the ranking */
    }

    /* The best `need` unmarked residents of a row without NaN (any order of meeting them). */
    int32_t best_of_rest(const float * row, int64_t token, int32_t need, int32_t * rest) const {
        ++*reads;
        float best_p[MOECACHE_MAX_K];
        int32_t m = 0;
        const int32_t slots = *n_full;
        for (int32_t s = 0; s < slots; ++s) {
            const int32_t e = expert_of[s];
            const float p = row[e];
            if (beaten(p, e, need, m, best_p, rest) || mark[e] == token) {
                continue;
            }
            m = keep_best(p, e, need, m, best_p, rest);
        }
        for (int32_t i = 0; i < m; ++i) {
            mark[rest[i]] = token;
        }
        return m;
    }
};

}  // namespace loop

/* One step of a layer's work: a route call, or a PSR prefetch into the layer. */
struct PlanEvent {
    int64_t row;     /* the call's first row (route) or last (prefetch), in the trace */
    int64_t packed;  /* where its rows (route) or its prediction (prefetch) are packed */
    int64_t token;
    int64_t step;    /* the core's step at the call */
    int64_t call;
    int32_t n;        /* rows (route); the prediction's length before its first -1 (prefetch) */
    int32_t prefetch; /* 0 route, 1 prefetch, 2 prefetch whose prediction repeats an expert */
};

/* A vector whose new elements are left unset: the plan's packed rows are all written by the
 * packing (on the batch's threads) right after, so a zero fill before would only add a pass
 * over them on the calling thread. */
template <class T>
struct Unset : std::allocator<T> {
    template <class U>
    struct rebind {
        using other = Unset<U>;
    };
    Unset() = default;
    template <class U>
    Unset(const Unset<U> &) noexcept {}
    template <class U>
    void construct(U * p) noexcept {
        ::new (static_cast<void *>(p)) U;
    }
    template <class U, class... A>
    void construct(U * p, A &&... a) {
        ::new (static_cast<void *>(p)) U(std::forward<A>(a)...);
    }
#if defined(__linux__)
    /* a large array on huge pages where the kernel gives them on request (transparent
     * huge pages in "madvise" mode, the common default): one fault for 2 MiB instead of
     * 512 (measured: the plan of 10,000 tokens 18% less CPU, 0.60 -> 0.49 s on one
     * thread; the loop reading it unchanged) */
    T * allocate(size_t n) {
        constexpr size_t kHuge = size_t{2} << 20;
        const size_t bytes = n * sizeof(T);
        if (bytes < 4 * kHuge) {
            return std::allocator<T>::allocate(n);
        }
        void * p = std::aligned_alloc(kHuge, (bytes + kHuge - 1) & ~(kHuge - 1));
        if (p == nullptr) {
            throw std::bad_alloc();
        }
        madvise(p, (bytes + kHuge - 1) & ~(kHuge - 1), MADV_HUGEPAGE);
        return static_cast<T *>(p);
    }
    void deallocate(T * p, size_t n) noexcept {
        if (n * sizeof(T) < 4 * (size_t{2} << 20)) {
            std::allocator<T>::deallocate(p, n);
        } else {
            std::free(p);
        }
    }
#endif
};
template <class T>
using PackedVec = std::vector<T, Unset<T>>;

/* What every configuration of a batch shares: each layer's work in trace order (its route
 * calls, and the PSR prefetches other calls aim at it), and the rows the loop reads packed
 * in that order, so that a layer's pass reads them as one stream rather than a row every
 * layer's width apart (a page apart for the ranking). */
struct FastPlan {
    std::vector<PlanEvent> events;
    std::vector<int64_t> layer_start; /* [n_layers + 1] into events */
    std::vector<int64_t> call_token;  /* [n_calls] */
    PackedVec<int32_t> ids;
    PackedVec<float> weights; /* normalized gate weights, w / (the row's sum), as route.cpp */
    PackedVec<float> selected;
    PackedVec<float> selected_sum; /* [rows] the routing bonus's sum of selected probabilities */
    PackedVec<uint8_t> bonus_order; /* [rows * k] the row's selections by probability up, the
                                     * later first on ties (0xFF first: a NaN, sort per call) */
    PackedVec<uint16_t> ranks; /* [rows * MOECACHE_RANK_WIDTH] the trace's ranking of each row
                                * without the row's own selections */
    PackedVec<uint8_t> counts; /* [rows] how many: loop::kRankCount, | loop::kRankedAll */
    PackedVec<float> rank_p; /* [rows * loop::kRankP] probabilities of each row's first ranked
                              * (only the first rank_count are set and read) */
    PackedVec<int32_t> predicted;
    /* frequency eviction's key of each selection's expert after it (the key record_selection
     * and key_of give: a selection's count and key depend only on the trace), for the
     * half-life key_half_life (0: none kept) */
    PackedVec<double> keys;
    float key_half_life = 0.0f;
};

FastPlan * fast_plan_new(const moecache_replay_trace & t, const moecache_replay_config * configs,
                         int32_t n_configs, bool ids_valid, int32_t n_threads) {
    bool substitutes = false, bonus = false, prefetches = false;
    float half_life = 0.0f; /* the frequency configurations' (the first one's) */
    for (int32_t i = 0; i < n_configs; ++i) {
        if (!fast_covers(t, configs[i], ids_valid, false)) {
            continue;
        }
        const moecache_policy & p = configs[i].follow_policy ? t.start_policy : configs[i].policy;
        substitutes |= p.miss_rule != MOECACHE_FETCH_ALL;
        bonus |= p.miss_rule == MOECACHE_ROUTING_BONUS;
        prefetches |= p.prefetch != 0 && t.pred_width > 0;
        if (p.eviction == MOECACHE_EVICT_FREQUENCY && half_life == 0.0f) {
            half_life = p.half_life;
        }
    }
    return fast_plan_pack(t, substitutes, bonus, prefetches, half_life, n_threads);
}

FastPlan * fast_plan_pack(const moecache_replay_trace & t, bool substitutes, bool bonus,
                          bool prefetches, float half_life, int32_t n_threads) {
    std::unique_ptr<FastPlan> plan(new FastPlan());
    const size_t k = static_cast<size_t>(t.top_k);
    plan->call_token.resize(static_cast<size_t>(t.n_calls));
    std::vector<int64_t> count(static_cast<size_t>(t.n_layers), 0);
    std::vector<int64_t> rows(static_cast<size_t>(t.n_layers), 0);
    std::vector<int64_t> preds(static_cast<size_t>(t.n_layers), 0);
    for (int64_t tok = 0; tok < t.n_tokens; ++tok) {
        for (int64_t c = t.token_calls[tok]; c < t.token_calls[tok + 1]; ++c) {
            plan->call_token[static_cast<size_t>(c)] = tok;
            if (t.call_stop[c] == t.call_start[c]) {
                continue;
            }
            count[static_cast<size_t>(t.call_layer[c])] += 1;
            rows[static_cast<size_t>(t.call_layer[c])] += t.call_stop[c] - t.call_start[c];
            if (t.pred_width > 0 && t.next_layer[t.call_stop[c] - 1] >= 0) {
                count[static_cast<size_t>(t.next_layer[t.call_stop[c] - 1])] += 1;
                preds[static_cast<size_t>(t.next_layer[t.call_stop[c] - 1])] += 1;
            }
        }
    }
    plan->layer_start.assign(static_cast<size_t>(t.n_layers) + 1, 0);
    std::vector<int64_t> at(static_cast<size_t>(t.n_layers)), row_at(at.size()), pred_at(at.size());
    int64_t total_rows = 0, total_preds = 0;
    for (size_t l = 0; l < at.size(); ++l) {
        plan->layer_start[l + 1] = plan->layer_start[l] + count[l];
        at[l] = plan->layer_start[l];
        row_at[l] = total_rows;
        pred_at[l] = total_preds;
        total_rows += rows[l];
        total_preds += preds[l];
    }
    plan->events.resize(static_cast<size_t>(plan->layer_start.back()));
    const size_t nr = static_cast<size_t>(total_rows);
    plan->ids.resize(nr * k);
    plan->weights.resize(substitutes ? nr * k : 0);
    plan->ranks.resize(substitutes ? nr * MOECACHE_RANK_WIDTH : 0);
    plan->counts.resize(substitutes ? nr : 0);
    plan->selected.resize(bonus ? nr * k : 0);
    plan->selected_sum.resize(bonus ? nr : 0);
    plan->bonus_order.resize(bonus ? nr * k : 0);
    plan->rank_p.resize(bonus ? nr * loop::kRankP : 0);
    plan->predicted.resize(prefetches ? static_cast<size_t>(total_preds) * t.pred_width : 0);
    plan->key_half_life = half_life;
    plan->keys.resize(half_life > 0.0f ? nr * k : 0);
    /* each trace row's packed place (-1: a row of no route call) */
    std::vector<int64_t> packed_of(bonus ? static_cast<size_t>(t.n_rows) : 0, -1);
    /* the events and the rows themselves, on the batch's threads, each a group of layers
     * whose events and packed rows are its own: made in the trace's order (a token's rows
     * of the group's layers lie side by side; read a layer at a time, each row was a cache
     * and TLB miss) */
    const int32_t workers = std::max(1, std::min(n_threads, t.n_layers));
    std::atomic<int32_t> next_group{0};
    auto pack = [&]() {
        FastPlan & P = *plan;
        std::vector<int64_t> seen(prefetches ? static_cast<size_t>(t.n_experts) : 0, -1);
        std::vector<int64_t> own_mark(substitutes ? static_cast<size_t>(t.n_experts) : 0, -1);
        int64_t stamp = -1;
        const bool keys = half_life > 0.0f;
        const loop::Decay decay(keys ? half_life : 1.0f);
        for (int32_t g = next_group++; g < workers; g = next_group++) {
            const int32_t l0 = static_cast<int32_t>(static_cast<int64_t>(t.n_layers) * g / workers);
            const int32_t l1 =
                static_cast<int32_t>(static_cast<int64_t>(t.n_layers) * (g + 1) / workers);
            /* each layer's counts (its keys) and its next event */
            std::vector<loop::Fq> fq_group(
                keys ? static_cast<size_t>(l1 - l0) * t.n_experts : 0, loop::Fq{0.0, 0, 0});
            /* each layer's next event, packed row and packed prediction */
            std::vector<int64_t> ev_at(at.begin() + l0, at.begin() + l1);
            std::vector<int64_t> rows_at(row_at.begin() + l0, row_at.begin() + l1);
            std::vector<int64_t> preds_at(pred_at.begin() + l0, pred_at.begin() + l1);
            auto in_group = [&](int64_t layer) { return layer >= l0 && layer < l1; };
            int64_t step = t.initial_step;
            for (int64_t c = 0; c < t.n_calls; ++c) {
                step = std::max(step, t.call_step[c]);
                const int64_t first = t.call_start[c];
                const int64_t n_rows = t.call_stop[c] - first;
                if (n_rows == 0) {
                    continue; /* no event */
                }
                const int64_t tok = P.call_token[static_cast<size_t>(c)];
                int64_t evs[2];
                int32_t n_evs = 0;
                const int64_t cl = t.call_layer[c];
                if (in_group(cl)) {
                    const size_t g_l = static_cast<size_t>(cl - l0);
                    const int64_t packed = rows_at[g_l];
                    rows_at[g_l] += n_rows;
                    if (bonus) {
                        for (int64_t i = 0; i < n_rows; ++i) {
                            packed_of[static_cast<size_t>(first + i)] = packed + i;
                        }
                    }
                    const int64_t ev = ev_at[g_l]++;
                    P.events[static_cast<size_t>(ev)] = PlanEvent{
                        first, packed, tok, step, c, static_cast<int32_t>(n_rows), 0};
                    evs[n_evs++] = ev;
                }
                const int64_t last = t.call_stop[c] - 1;
                const int64_t nl = t.pred_width > 0 ? t.next_layer[last] : -1;
                if (nl >= 0 && in_group(nl)) {
                    const size_t g_l = static_cast<size_t>(nl - l0);
                    const int64_t ev = ev_at[g_l]++;
                    P.events[static_cast<size_t>(ev)] =
                        PlanEvent{last, preds_at[g_l]++, tok, step, c, 1, 1};
                    evs[n_evs++] = ev;
                }
                for (int32_t at_ev = 0; at_ev < n_evs; ++at_ev) {
                    const int64_t ev = evs[at_ev];
                    PlanEvent & e = P.events[static_cast<size_t>(ev)];
                    const int64_t l = e.prefetch ? nl : cl;
                    loop::Fq * fq = keys ? fq_group.data() + (l - l0) * t.n_experts : nullptr;
                    if (e.prefetch) {
                        if (prefetches) {
                            const size_t w = static_cast<size_t>(t.pred_width);
                            const int32_t * pred = t.predicted + e.row * t.pred_width;
                            std::memcpy(P.predicted.data() + static_cast<size_t>(e.packed) * w,
                                        pred, w * sizeof(int32_t));
                            /* what every configuration's prefetch would count first */
                            int32_t len = 0;
                            bool repeats = false;
                            while (len < t.pred_width && pred[len] >= 0) {
                                repeats |= seen[static_cast<size_t>(pred[len])] == ev;
                                seen[static_cast<size_t>(pred[len])] = ev;
                                ++len;
                            }
                            e.n = len;
                            e.prefetch = repeats ? 2 : 1;
                        }
                        continue;
                    }
                    const int64_t r0 = e.row, p0 = e.packed, n = e.n;
                    const size_t pk = static_cast<size_t>(p0) * k;
                    const size_t rk = static_cast<size_t>(r0) * k;
                    const size_t nk = static_cast<size_t>(n) * k;
                    std::memcpy(P.ids.data() + pk, t.ids + rk, nk * sizeof(int32_t));
                    if (keys) { /* every selection counted in order, as the loop records them */
                        for (size_t i = 0; i < nk; ++i) {
                            loop::Fq & x = fq[static_cast<size_t>(t.ids[rk + i])];
                            decay.record(x, e.step);
                            P.keys[pk + i] = decay.key(x);
                        }
                    }
                    if (substitutes) {
                        /* every configuration's normalization, once (the same floats: the same
                         * sum in the same order, the same division) */
                        for (int64_t i = 0; i < n; ++i) {
                            const float * w = t.weights + rk + static_cast<size_t>(i) * k;
                            float * dst = P.weights.data() + pk + static_cast<size_t>(i) * k;
                            float sum = 0.0f;
                            for (size_t j = 0; j < k; ++j) {
                                sum += w[j];
                            }
                            for (size_t j = 0; j < k; ++j) {
                                dst[j] = sum > 0.0f ? w[j] / sum : 0.0f;
                            }
                        }
                        /* each row's ranking without the row's own selections: a substitute is
                         * never one of them, so every configuration's walk would only pass them */
                        for (int64_t i = 0; i < n; ++i) {
                            const int32_t * own = t.ids + rk + static_cast<size_t>(i) * k;
                            ++stamp;
                            for (size_t j = 0; j < k; ++j) {
                                own_mark[static_cast<size_t>(own[j])] = stamp;
                            }
                            const uint16_t * src = t.ranks + (r0 + i) * MOECACHE_RANK_WIDTH;
                            uint16_t * dst = P.ranks.data() + (p0 + i) * MOECACHE_RANK_WIDTH;
                            const int32_t named = t.rank_counts[r0 + i]; /* ranking_valid's */
                            int32_t m = 0;
                            for (int32_t j = 0; j < named; ++j) {
                                dst[m] = src[j];
                                m += own_mark[src[j]] != stamp;
                            }
                            /* the ranking named every expert: no resident is outside it */
                            P.counts[static_cast<size_t>(p0 + i)] = static_cast<uint8_t>(
                                m | (named >= t.n_experts ? loop::kRankedAll : 0));
                        }
                    }
                    if (bonus) {
                        std::memcpy(P.selected.data() + pk, t.selected_probs + rk,
                                    nk * sizeof(float));
                        /* the routing bonus compares a substitute's probability: read from each
                         * row once here, not once per configuration; and it takes a row's misses
                         * least probable first: the order of all its selections, made here, is
                         * that order filtered, where no probability is NaN (a total order) */
                        for (int64_t i = 0; i < n; ++i) {
                            const float * sp = t.selected_probs + rk + static_cast<size_t>(i) * k;
                            float sum = 0.0f;
                            bool nan = false;
                            for (size_t j = 0; j < k; ++j) {
                                sum += sp[j];
                                nan |= sp[j] != sp[j];
                            }
                            P.selected_sum[static_cast<size_t>(p0 + i)] = sum;
                            uint8_t * order =
                                P.bonus_order.data() + pk + static_cast<size_t>(i) * k;
                            for (size_t j = 0; j < k; ++j) {
                                order[j] = static_cast<uint8_t>(j);
                            }
                            std::sort(order, order + k, [&](uint8_t a, uint8_t b) {
                                return sp[a] != sp[b] ? sp[a] < sp[b] : a > b;
                            });
                            if (nan) {
                                order[0] = 0xFF;
                            }
                        }
                    }
                }
            }
        }
    };
    /* then the ranked experts' probabilities, read from the rows in the trace's order (a
     * layer's rows lie a layer's width apart: read in a layer's order, each row was a TLB
     * miss and its lines each a cache miss the hardware could not see coming) */
    std::atomic<int64_t> next_row{0};
    constexpr int64_t kRowChunk = 4096;
    auto gather = [&]() {
        FastPlan & P = *plan;
        for (int64_t a = next_row.fetch_add(kRowChunk); a < t.n_rows;
             a = next_row.fetch_add(kRowChunk)) {
            for (int64_t r = a; r < std::min(t.n_rows, a + kRowChunk); ++r) {
                const int64_t p = packed_of[static_cast<size_t>(r)];
                if (p < 0) {
                    continue;
                }
                const float * row = t.probs + r * t.n_experts;
                const uint16_t * rank = P.ranks.data() + p * MOECACHE_RANK_WIDTH;
                float * dst = P.rank_p.data() + p * loop::kRankP;
                const int32_t m = std::min<int32_t>(
                    loop::kRankP, P.counts[static_cast<size_t>(p)] & loop::kRankCount);
                for (int32_t j = 0; j < m; ++j) {
                    dst[j] = row[rank[j]];
                }
            }
        }
    };
    auto on_threads = [&](auto & fn) {
        std::vector<std::thread> pool;
        const int32_t helpers = std::min(n_threads, t.n_layers) - 1;
        try {
            for (int32_t w = 0; w < helpers; ++w) {
                pool.emplace_back([&fn]() { fn(); });
            }
        } catch (...) {  // no thread could be started: this one does the rest
        }
        fn();
        for (std::thread & th : pool) {
            th.join();
        }
    };
    on_threads(pack);
    if (bonus) {
        on_threads(gather);
    }
    return plan.release();
}

void fast_plan_free(FastPlan * plan) {
    delete plan;
}

int64_t fast_plan_bytes(const FastPlan & plan) {
    return static_cast<int64_t>(
        plan.events.capacity() * sizeof(PlanEvent) +
        (plan.layer_start.capacity() + plan.call_token.capacity()) * sizeof(int64_t) +
        (plan.ids.capacity() + plan.predicted.capacity()) * sizeof(int32_t) +
        plan.keys.capacity() * sizeof(double) +
        (plan.weights.capacity() + plan.selected.capacity() + plan.selected_sum.capacity() +
         plan.rank_p.capacity()) *
            sizeof(float) +
        plan.bonus_order.capacity() +
        plan.ranks.capacity() * sizeof(uint16_t) + plan.counts.capacity() + sizeof(FastPlan));
}

/* The loop's buffers, kept by a worker thread from one configuration to the next. */
struct FastWorkspace {
    std::vector<loop::Expert> ex;
    std::vector<loop::Fq> fq;
    std::vector<float> lost;
    std::vector<int32_t> expert_of;
    std::vector<double> cum_mass;
    std::vector<int64_t> pin, mark;
    std::vector<int32_t> bq_head, bq_next;
    std::vector<uint64_t> bq_occ;
    std::unique_ptr<bool[]> bq_stale; /* bool, not a byte: a store to it aliases nothing else */
    size_t bq_stale_n = 0;
    std::vector<double> kkey;
    std::vector<uint32_t> kkver;
    std::vector<uint32_t> fetch_bits, subst_bits; /* [rows of a call] */
    std::vector<int32_t> used_ids, fetched, chosen, fetch_list, last_place;
    std::vector<int32_t> pending; /* PSR's prefetches not yet in the bucket queue */
};

FastWorkspace * fast_workspace_new() {
    return new FastWorkspace();
}

void fast_workspace_free(FastWorkspace * w) {
    delete w;
}

namespace loop { /* named: the engine compiles the core as one unit */

/* One configuration, one layer after another: a layer's decisions depend only on its own
 * route calls and the prefetches into it, in trace order (recency compares within a layer,
 * so a clock per layer orders as the core's one clock), so its state stays in cache. */
class FastReplay {
public:
    FastReplay(const moecache_replay_trace & t, const FastPlan & plan, const moecache_policy & p,
               int32_t slots, moecache_replay_token * out, FastWorkspace & w,
               ReplayTicker * ticker)
        : t_(t), plan_(plan), p_(p), S_(slots), E_(t.n_experts), k_(t.top_k), out_(out),
          w_(w), ticker_(ticker) {}

    int32_t run() {
        const bool f = p_.eviction == MOECACHE_EVICT_FREQUENCY;
        switch (p_.miss_rule) {
            case MOECACHE_FETCH_ALL:
                return f ? go<MOECACHE_FETCH_ALL, true>() : go<MOECACHE_FETCH_ALL, false>();
            case MOECACHE_THRESHOLD:
                return f ? go<MOECACHE_THRESHOLD, true>() : go<MOECACHE_THRESHOLD, false>();
            case MOECACHE_FIRST_CHOICE:
                return f ? go<MOECACHE_FIRST_CHOICE, true>() : go<MOECACHE_FIRST_CHOICE, false>();
            case MOECACHE_SUBSTITUTE_ALL:
                return f ? go<MOECACHE_SUBSTITUTE_ALL, true>()
                         : go<MOECACHE_SUBSTITUTE_ALL, false>();
            default:
                return f ? go<MOECACHE_ROUTING_BONUS, true>()
                         : go<MOECACHE_ROUTING_BONUS, false>();
        }
    }

    /* whether a slot was ever wanted with every slot full */
    bool evicted() const {
        return full_;
    }

private:
    const moecache_replay_trace & t_;
    const FastPlan & plan_;
    const moecache_policy p_;
    const int32_t S_, E_, k_;
    moecache_replay_token * out_;
    FastWorkspace & w_;
    ReplayTicker * ticker_;

    Expert * X_ = nullptr;
    Fq * F_ = nullptr;
    int32_t * slots_ = nullptr;
    int64_t * pin_ = nullptr;
    int32_t n_res_ = 0;
    int64_t pin_epoch_ = 0, mark_epoch_ = 0;
    int32_t clock_ = 0;
    int64_t step_ = 0;
    /* frequency */
    double h_ = 1.0;
    std::unique_ptr<Decay> decay_;
    const double * pkeys_ = nullptr; /* the plan's keys of each selection (or none) */
    /* small layers under many victims a call: the next victims from one scan of the slots
     * instead of the bucket queue (scan_), as many as the call is expected to need (hint_) */
    bool scan_ = false;
    int32_t hint_ = 1;
    int64_t q_epoch_ = -1;
    int32_t q_n_ = 0, q_at_ = 0;
    int32_t q_[kQueue];
    double q_key_[kQueue];
    int32_t q_lu_[kQueue];
    /* frequency victims from a bucket queue (bq_): each resident is listed in the bucket
     * floor(key * bq_q_) it had when listed (a lower bound: a selection only raises a key,
     * so a stale listing is moved up when its bucket is reached). The buckets of a window
     * [bq_top_ - kRing + 1, bq_top_] sliding with the step sit in a ring; anything outside
     * it is on the LOW list, which every victim search compares in full. The least
     * unpinned (key, recency, id) is then LOW's least or that of the first ring bucket
     * holding an unpinned resident, whichever is less: exactly the scan's victim. */
#ifdef MOECACHE_SELFCHECK
    static constexpr int32_t kRing = 64; /* short traces slide it and fill LOW too */
#else
    static constexpr int32_t kRing = 8192;
#endif
    static constexpr int64_t kLow = std::numeric_limits<int64_t>::min();
    bool bq_ = false;
    bool evicts_ = true;
    bool full_ = false; /* a slot was wanted with every slot full, or (fill_free) a miss was
                         * substituted that a free slot would have taken: either way a larger
                         * budget may decide otherwise */
    double bq_q_ = 1.0;
    int64_t bq_top_ = kLow;
    int64_t bq_step_ = kLow; /* the step bq_top_ was last brought to */
    int32_t * pending_ = nullptr; /* PSR's prefetches since the layer's last event, not yet
                                   * listed: listed at its next one (pinned until then) */
    int32_t n_pending_ = 0;
    int64_t bq_cur_ = 0; /* no ring bucket of the window below it lists a resident */
    int32_t bq_low_ = -1;
    int64_t bq_from_epoch_ = -1, bq_from_ = 0; /* where this epoch's next search starts */
    int32_t * bq_head_ = nullptr;  /* [kRing] */
    uint64_t * bq_occ_ = nullptr;  /* [kRing / 64] a bit per non-empty ring bucket */
    int32_t * bq_next_ = nullptr;  /* [E] the next in its list (singly linked) */
    int64_t bq_vlist_ = 0;         /* the last victim's list (kLow: LOW) */
    int32_t bq_vpred_ = -1;        /* and the entry before it there (-1: its head) */
    bool * bq_stale_ = nullptr; /* [E] its count changed since it was listed */
    double * kkey_ = nullptr;  /* [E] each expert's key: with the plan's keys always, else
                                * as of its count version kkver_ */
    uint32_t * kkver_ = nullptr;

    double key_of(const Fq & x) const {
        return decay_->key(x);
    }

    /* A selection of e, the i-th of the plan's packed selections: its count, and its key
     * from the plan where the plan has them for this half-life */
    void record_selection(int32_t e, int64_t i) {
        Fq & x = F_[e];
        bq_stale_[e] = true;
        if (pkeys_ == nullptr) {
            decay_->record(x, step_);
            return;
        }
#ifdef MOECACHE_SELFCHECK
        decay_->record(x, step_);
        if (!(decay_->key(x) == pkeys_[i])) {
            std::abort();
        }
        kkver_[e] = x.kver;
#else
        (void)x; /* the count is never read: only the key (kkver_ and kver stay 0) */
#endif
        kkey_[e] = pkeys_[i];
    }

    /* The key of a resident as the scan compares it (cached per count version). */
    double scan_key(int32_t e) {
        if (pkeys_ != nullptr) { /* the plan's keys: kkey_ is every expert's key */
            return kkey_[e];
        }
        const uint32_t v = F_[e].kver;
        if (kkver_[e] != v) {
            kkver_[e] = v;
            kkey_[e] = key_of(F_[e]);
        }
        return kkey_[e];
    }

    /* The epoch's next victims in order, from one scan of the unpinned residents (within a
     * pin epoch an unpinned resident's key and recency do not change, and a new resident is
     * pinned, so they stay in order; one pinned since is skipped when taken). */
    void scan_fill() {
        const int32_t m = std::min(hint_, kQueue);
        int32_t n = 0;
        const Expert * X = X_;
        for (int32_t s = 0; s < n_res_; ++s) {
            const int32_t e = slots_[s];
            if (pin_[e] == pin_epoch_) {
                continue;
            }
            const double ke = scan_key(e);
            const int32_t lu = X[e].last_use;
            auto before = [&](int32_t i) {
                return ke != q_key_[i] ? ke < q_key_[i] : lu != q_lu_[i] ? lu < q_lu_[i] : e < q_[i];
            };
            if (n == m && !before(m - 1)) {
                continue;
            }
            int32_t at = n == m ? m - 1 : n++;
            while (at > 0 && before(at - 1)) {
                q_[at] = q_[at - 1];
                q_key_[at] = q_key_[at - 1];
                q_lu_[at] = q_lu_[at - 1];
                --at;
            }
            q_[at] = e;
            q_key_[at] = ke;
            q_lu_[at] = lu;
        }
        q_n_ = n;
        q_at_ = 0;
        q_epoch_ = pin_epoch_;
    }

    /* the bucket a resident's current key lists it in (kLow: the LOW list); a selected
     * expert's key is at least 0 (f >= 1, step >= 0), so the cast floors it; anything
     * else goes to LOW, where it is compared in full */
    int64_t bq_bucket(int32_t e) {
        const double b = scan_key(e) * bq_q_;
        int64_t idx = kLow;
        if (b >= 0.0 && b <= static_cast<double>(bq_top_)) {
            idx = static_cast<int64_t>(b);
            if (idx < bq_top_ - kRing + 1) {
                idx = kLow;
            }
        }
        return idx;
    }

    /* e at the head of list idx (singly linked: each list is only ever walked from its
     * head, so a walk knows the node before the one it takes out) */
    void bq_push(int32_t e, int64_t idx) {
        if (idx == kLow) {
            bq_next_[e] = bq_low_;
            bq_low_ = e;
            return;
        }
        const int64_t slot = idx & (kRing - 1);
        bq_next_[e] = bq_head_[slot];
        bq_head_[slot] = e;
        bq_occ_[slot >> 6] |= uint64_t{1} << (slot & 63);
        bq_cur_ = std::min(bq_cur_, idx);
    }

    /* list e under its current key */
    void bq_place(int32_t e) {
        bq_stale_[e] = false;
        bq_push(e, bq_bucket(e));
    }

    /* e, after `pred` (-1: the head) in the list whose head is `head`, taken out */
    void bq_cut(int32_t & head, int32_t pred, int32_t e) {
        if (pred < 0) {
            head = bq_next_[e];
        } else {
            bq_next_[pred] = bq_next_[e];
        }
    }

    void place_pending() {
        for (int32_t i = 0; i < n_pending_; ++i) {
            bq_place(pending_[i]);
        }
        n_pending_ = 0;
    }

    /* the last victim (bq_victim's), out of its list */
    void bq_take_victim(int32_t v) {
        const bool low = bq_vlist_ == kLow;
        const int64_t slot = bq_vlist_ & (kRing - 1);
        int32_t & head = low ? bq_low_ : bq_head_[slot];
        int32_t pred = bq_vpred_;
        if (pred < 0 ? head != v : bq_next_[pred] != v) {
            /* an entry pushed ahead of it (to LOW's head, from a ring walk: not met in the
             * tests, where no key outgrows the window's top; kept so that one would be right) */
            pred = -1;
            for (int32_t e = head; e != v; e = bq_next_[e]) {
                pred = e;
            }
        }
        bq_cut(head, pred, v);
        if (!low && head < 0) {
            bq_occ_[slot >> 6] &= ~(uint64_t{1} << (slot & 63));
        }
    }

    /* the window follows the step: buckets that leave it go to the LOW list */
    void bq_advance(int64_t step) {
        if (step == bq_step_) { /* a token's route call and the prefetch into it share one */
            return;
        }
        bq_step_ = step;
        const double b = static_cast<double>(step) / h_ * bq_q_;
        /* floor (a libm call here) only where truncation differs: below zero */
        const int64_t top = (b >= 0.0 ? static_cast<int64_t>(b)
                                      : static_cast<int64_t>(std::floor(b))) +
                            kRing / 2;
        if (top <= bq_top_) {
            return;
        }
        if (bq_top_ != kLow) {
            const int64_t from = bq_top_ - kRing + 1;
            const int64_t to = std::min(top - kRing + 1, from + kRing);
            for (int64_t i = std::max(from, bq_cur_); i < to; ++i) {
                const int64_t slot = i & (kRing - 1);
                int32_t & head = bq_head_[slot];
                while (head >= 0) {
                    const int32_t e = head;
                    head = bq_next_[e];
                    bq_next_[e] = bq_low_;
                    bq_low_ = e;
                }
                bq_occ_[slot >> 6] &= ~(uint64_t{1} << (slot & 63));
            }
        }
        bq_top_ = top;
        bq_cur_ = std::max(bq_cur_, top - kRing + 1);
    }

    bool bq_before(int32_t a, int32_t b) const {
        const double ka = kkey_[a], kb = kkey_[b];
        if (ka != kb) {
            return ka < kb;
        }
        const int32_t la = X_[a].last_use, lb = X_[b].last_use;
        return la != lb ? la < lb : a < b;
    }

    /* least: e where it is unpinned and evicts before least (-1: none yet) */
    bool bq_less(int32_t e, int32_t least) const {
        return pin_[e] != pin_epoch_ && (least < 0 || bq_before(e, least));
    }

    int32_t bq_victim() {
        int32_t low = -1, low_pred = -1;
        {
            int32_t pred = -1;
            for (int32_t e = bq_low_; e >= 0;) {
                const int32_t nx = bq_next_[e];
                if (bq_stale_[e]) {
                    bq_stale_[e] = false;
                    const int64_t now = bq_bucket(e);
                    if (now != kLow) { /* into the window: met there */
                        bq_cut(bq_low_, pred, e);
                        bq_push(e, now);
                        e = nx;
                        continue;
                    }
                }
                if (bq_less(e, low)) {
                    low = e;
                    low_pred = pred;
                }
                pred = e;
                e = nx;
            }
        }
        const int64_t top = bq_top_;
        /* a later search of the same pin epoch goes on from the last one's victim's bucket:
         * below it every resident was pinned, and is still (a pin lasts the epoch, a
         * resident placed since is pinned, and one pinned whose count changes stays so) */
        const int64_t from = bq_from_epoch_ == pin_epoch_ ? std::max(bq_cur_, bq_from_) : bq_cur_;
        bool empty_below = from == bq_cur_;
        for (int64_t idx = from; idx <= top;) {
            const int64_t slot = idx & (kRing - 1);
            const uint64_t word = bq_occ_[slot >> 6] >> (slot & 63);
            if (word == 0) {
                idx += 64 - (slot & 63);
                if (empty_below) {
                    bq_cur_ = idx;
                }
                continue;
            }
            idx += __builtin_ctzll(word);
            if (idx > top) {
                break;
            }
            if (empty_below) {
                bq_cur_ = idx;
            }
            const int64_t at = idx & (kRing - 1);
            int32_t & head = bq_head_[at];
            int32_t best = -1, best_pred = -1, pred = -1;
            for (int32_t e = head; e >= 0;) {
                const int32_t nx = bq_next_[e];
                if (bq_stale_[e]) {
                    bq_stale_[e] = false;
                    const int64_t now = bq_bucket(e);
                    if (now != idx) { /* a selection raised it: a later bucket, or LOW */
                        bq_cut(head, pred, e);
                        bq_push(e, now);
                        if (now == kLow && bq_less(e, low)) { /* its key left the window (not
                                                              * met in the tests) */
                            low = e;
                            low_pred = -1;
                        }
                        e = nx;
                        continue;
                    }
                }
                if (bq_less(e, best)) {
                    best = e;
                    best_pred = pred;
                }
                pred = e;
                e = nx;
            }
            if (best >= 0) {
                bq_from_epoch_ = pin_epoch_;
                bq_from_ = idx;
                if (low >= 0 && bq_before(low, best)) {
                    bq_vlist_ = kLow;
                    bq_vpred_ = low_pred;
                    return low;
                }
                bq_vlist_ = idx;
                bq_vpred_ = best_pred;
                return best;
            }
            if (head >= 0) {
                empty_below = false; /* its residents are all pinned */
            } else {
                bq_occ_[at >> 6] &= ~(uint64_t{1} << (at & 63));
            }
            ++idx;
        }
        if (empty_below) {
            bq_cur_ = top + 1;
        }
        bq_vlist_ = kLow;
        bq_vpred_ = low_pred;
        return low;
    }

    template <bool Freq>
    int32_t victim() {
        int32_t v = -1;
        const Expert * X = X_;
        if (Freq && scan_) {
            for (;;) {
                if (q_epoch_ != pin_epoch_ || q_at_ == q_n_) {
                    if (q_epoch_ == pin_epoch_ && q_n_ < std::min(hint_, kQueue)) {
                        break; /* the last scan found fewer: every other resident is pinned */
                    }
                    scan_fill();
                    if (q_n_ == 0) {
                        break;
                    }
                }
                const int32_t e = q_[q_at_++];
                if (pin_[e] != pin_epoch_ && X[e].slot >= 0) {
                    v = e;
                    break;
                }
            }
        } else if (!Freq) {
            for (int32_t e = X[E_].next; e != E_; e = X[e].next) {
                if (pin_[e] != pin_epoch_) {
                    v = e;
                    break;
                }
            }
        } else {
            v = bq_victim();
        }
#ifdef MOECACHE_SELFCHECK
        if (v != victim_scan<Freq>()) {
            std::abort();
        }
#endif
        return v;
    }

#ifdef MOECACHE_SELFCHECK
    /* pick_victim_scan over this loop's state */
    template <bool Freq>
    int32_t victim_scan() const {
        const Expert * X = X_;
        int32_t best = -1;
        for (int32_t s = 0; s < S_; ++s) {
            const int32_t e = slots_[s];
            if (e < 0 || pin_[e] == pin_epoch_) {
                continue;
            }
            if (best < 0) {
                best = e;
                continue;
            }
            if (Freq) {
                const double ke = key_of(F_[e]);
                const double kb = key_of(F_[best]);
                if (ke != kb) {
                    if (ke < kb) {
                        best = e;
                    }
                    continue;
                }
            }
            if (X[e].last_use != X[best].last_use ? X[e].last_use < X[best].last_use
                                                  : e < best) {
                best = e;
            }
        }
        return best;
    }
#endif

    /* LRU's list is a ring through a sentinel (the entry after the last expert), so that
     * neither end needs a branch; an inserted expert is linked at its first use (until
     * then it is pinned, so no victim search needs it listed), its links meanwhile the
     * entry after the sentinel, which unlinking it then only writes to */
    void unlink(int32_t e) {
        Expert * X = X_;
        const int32_t p = X[e].prev;
        const int32_t n = X[e].next;
        X[p].next = static_cast<int16_t>(n);
        X[n].prev = static_cast<int16_t>(p);
    }

    void link_tail(int32_t e) {
        Expert * X = X_;
        Expert & end = X[E_];
        const int32_t last = end.prev;
        X[e].prev = static_cast<int16_t>(last);
        X[e].next = static_cast<int16_t>(E_);
        X[last].next = static_cast<int16_t>(e);
        end.prev = static_cast<int16_t>(e);
    }

    /* A use: a fresh recency (the LRU list's tail). */
    template <bool Freq>
    void used(int32_t e) {
#ifndef MOECACHE_SELFCHECK
        if (Freq) /* LRU's order is its list's (the selfcheck's scan reads the clock) */
#endif
        {
            X_[e].last_use = ++clock_;
        }
        if (!Freq) { /* the last already: unlinked and linked back where it was */
            unlink(e);
            link_tail(e);
        }
    }

    /* acquire_slot + layer_insert: -1 when every resident is pinned. Place: list it in the
     * bucket queue now (else the caller does later: a fetch after its selection sets its
     * key, a prefetch at its layer's next event, after that call's selection if it selects
     * it, else before that call's first search; pinned until then, so no victim search
     * misses it, and a listing is not stale at once). */
    template <bool Freq, bool Place = true>
    int32_t insert(int32_t e) {
        int32_t slot;
        if (n_res_ < S_) {
            slot = n_res_++; /* no resize: the slots below n_res are the full ones */
        } else {
            full_ = true;
            const int32_t v = victim<Freq>();
            if (v < 0) {
                return -1;
            }
            slot = X_[v].slot;
            X_[v].slot = -1;
            if (!Freq) {
                unlink(v);
            } else if (bq_) {
                bq_take_victim(v);
            }
        }
        X_[e].slot = static_cast<int16_t>(slot);
        slots_[slot] = e;
        if (!Freq) {
            X_[e].prev = X_[e].next = static_cast<int16_t>(E_ + 1);
        } else if (Place && bq_) {
            bq_place(e);
        }
        return slot;
    }

    template <int Rule, bool Freq>
    int32_t go();
};

template <int Rule, bool Freq>
int32_t FastReplay::go() {
    const int32_t n_layers = t_.n_layers;
    const int32_t k = k_;
    int64_t max_call = 1;
    for (int64_t c = 0; c < t_.n_calls; ++c) {
        max_call = std::max(max_call, t_.call_stop[c] - t_.call_start[c]);
    }
    const size_t sel = static_cast<size_t>(max_call) * k;
    FastWorkspace & w = w_;
    w.ex.resize(static_cast<size_t>(E_) + 2); /* and LRU's sentinel, and the unlinked's */
    w.expert_of.resize(static_cast<size_t>(S_));
    w.pin.assign(static_cast<size_t>(E_), 0);
    w.mark.assign(static_cast<size_t>(E_), 0);
    w.fetch_bits.resize(static_cast<size_t>(max_call));
    w.subst_bits.resize(static_cast<size_t>(max_call));
    w.used_ids.resize(sel);
    w.fetched.resize(sel);
    w.chosen.resize(static_cast<size_t>(E_));
    w.fetch_list.resize(static_cast<size_t>(E_));
    w.last_place.resize(static_cast<size_t>(std::max(t_.pred_width, 1)));
    w.cum_mass.resize(static_cast<size_t>(t_.n_tokens) * n_layers);
    X_ = w.ex.data();
    slots_ = w.expert_of.data();
    pin_ = w.pin.data();
    int64_t * mark = w.mark.data();
    if (Freq) {
        w.fq.resize(static_cast<size_t>(E_));
        F_ = w.fq.data();
        h_ = static_cast<double>(p_.half_life);
        w.kkey.resize(static_cast<size_t>(E_));
        w.kkver.resize(static_cast<size_t>(E_));
        if (w.bq_stale_n < static_cast<size_t>(E_)) {
            w.bq_stale.reset(new bool[static_cast<size_t>(E_)]());
            w.bq_stale_n = static_cast<size_t>(E_);
        }
        bq_stale_ = w.bq_stale.get();
        kkey_ = w.kkey.data();
        kkver_ = w.kkver.data();
        decay_.reset(new Decay(p_.half_life));
        if (plan_.key_half_life == p_.half_life && !plan_.keys.empty()) {
            pkeys_ = plan_.keys.data();
        }
    }
    const bool admission = p_.admission != 0;
    const bool fill = p_.fill_free != 0; /* a free slot takes a miss whatever the rule */
    if (admission) {
        w.lost.resize(static_cast<size_t>(E_));
    }
    float * lost = w.lost.data();
    uint32_t * fetch_bits = w.fetch_bits.data();
    uint32_t * subst_bits = w.subst_bits.data();
    int32_t * used_ids = w.used_ids.data();
    int32_t * fetched = w.fetched.data();
    int32_t * chosen = w.chosen.data();
    int32_t * fetch_list = w.fetch_list.data();
    double * cum_mass = w.cum_mass.data();

    const int32_t per_token = prefetch_per_token(t_, p_, S_);
    w.pending.resize(static_cast<size_t>(std::max(per_token, 1)));
    pending_ = w.pending.data();
    const bool prefetching = per_token > 0;
    /* PSR's prefetches evict several experts a call: at few slots one scan for them beats a
     * bucket search each (measured: 26 slots scan 1.25x faster, 51 slots 1.1x slower) */
    scan_ = Freq && prefetching && S_ <= kScanSlots;
    if (scan_) {
        replay_scan_configs.fetch_add(1, std::memory_order_relaxed);
    }
    /* with a slot for every expert nothing is ever evicted: recency and counts unread */
    evicts_ = S_ < E_;
    bq_ = Freq && !scan_ && evicts_;
    if (bq_) {
        w.bq_head.resize(kRing);
        w.bq_occ.resize(kRing / 64);
        w.bq_next.resize(static_cast<size_t>(E_));
        bq_head_ = w.bq_head.data();
        bq_occ_ = w.bq_occ.data();
        bq_next_ = w.bq_next.data();
        /* a step a bucket (measured against 1/2, 2 and 4: within the noise, this the
         * least), and the window's upper half above every key: a key
         * is at most step / h + log2(f), f <= rows + 1 (fast_covers) */
        const double log_f = std::log2(static_cast<double>(t_.n_rows) + 1.0) + 1.0;
        bq_q_ = std::min(static_cast<double>(p_.half_life), (kRing / 2 - 2) / log_f);
    }
    const float beta = p_.beta;
    const float theta = p_.theta;
    const float bonus_w = p_.bonus;
    const uint16_t * ranks = plan_.ranks.data();
    const uint8_t * rank_counts = plan_.counts.data();
    const float * selp = plan_.selected.data();
    const int64_t n_tokens = t_.n_tokens;
    int64_t fail_call = t_.n_calls; /* the first call that found every slot pinned */

    for (int32_t layer = 0; layer < n_layers; ++layer) {
        std::fill(w.ex.begin(), w.ex.end(), Expert{0, -1, -1, -1, false, false});
        std::fill(w.expert_of.begin(), w.expert_of.end(), -1);
        if (Freq) {
            std::fill(w.fq.begin(), w.fq.end(), Fq{0.0, 0, 0});
            if (pkeys_ != nullptr) {
                /* the plan's keys: kkey_ is each expert's key throughout (a count version
                 * never changes), the count-less one until its first selection */
                std::fill(w.kkver.begin(), w.kkver.end(), 0u);
                std::fill(w.kkey.begin(), w.kkey.end(), kNoCount);
            } else {
                std::fill(w.kkver.begin(), w.kkver.end(), ~0u);
            }
            q_epoch_ = -1;
        } else {
            w.ex[static_cast<size_t>(E_)].prev = w.ex[static_cast<size_t>(E_)].next =
                static_cast<int16_t>(E_);
        }
        if (bq_) {
            std::fill(w.bq_head.begin(), w.bq_head.end(), -1);
            std::fill(w.bq_occ.begin(), w.bq_occ.end(), uint64_t{0});
            bq_low_ = -1;
            bq_top_ = kLow;
            bq_step_ = kLow;
            bq_cur_ = std::numeric_limits<int64_t>::max();
            bq_from_epoch_ = -1;
            n_pending_ = 0;
        }
        if (admission) {
            std::fill(w.lost.begin(), w.lost.end(), 0.0f);
        }
        Expert * X = X_;
        n_res_ = 0;
        clock_ = 0;
        const int64_t eb = t_.expert_bytes[layer];
        /* rows of this layer that read their probabilities among those that might: ask for
         * a later row's ahead only while that is common (decayed every kAheadWindow) */
        int64_t row_reads = 0, row_visits = 0;
        Substitutes subst_{X, slots_, &n_res_, E_, mark, &row_reads};
        subst_.k = k;
        double layer_mass = 0.0;
        int64_t filled = 0; /* tokens whose cumulative mass of this layer is written */
        const PlanEvent * ev = plan_.events.data();
        const int64_t x_end = plan_.layer_start[static_cast<size_t>(layer) + 1];
        for (int64_t x = plan_.layer_start[static_cast<size_t>(layer)]; x < x_end; ++x) {
            const PlanEvent & e_ = ev[x];
            const int64_t c = e_.call;
            if (c >= fail_call) {
                break;
            }
            if (Freq && bq_) {
                bq_advance(e_.step);
            }
            const int64_t tok = e_.token;
            if (filled < tok) {
                /* mostly one token (the next): a store, not the memset call the compiler
                 * makes of the loop (31 instructions a row) */
                double * cm = cum_mass + layer * n_tokens;
                cm[filled] = layer_mass;
                for (int64_t f = filled + 1; f < tok; ++f) {
                    cm[f] = layer_mass;
                }
                filled = tok;
            }
            moecache_replay_token & o = out_[tok];
            const int64_t r0 = e_.row;
            const int32_t n = e_.n;
            if (e_.prefetch != 0) {
                if (!prefetching || n_res_ == E_) { /* every expert resident: nothing to do */
                    continue;
                }
                /* PSR into this layer after call c (prefetch_ranked, or prefetch for a
                 * ranking that repeats an expert) */
                const int32_t * ranked = plan_.predicted.data() + e_.packed * t_.pred_width;
                const int32_t count = e_.n; /* counted by the plan */
                int32_t m = 0;
                const int32_t * pick = chosen;
                if (e_.prefetch == 1 && count >= per_token) {
                    pick = ranked; /* its first per_token, distinct */
                } else {
                    const int64_t me = ++mark_epoch_;
                    const bool repeats = e_.prefetch == 2;
                    for (int32_t j = 0; j < count; ++j) {
                        mark[ranked[j]] = me;
                    }
                    if (!repeats) {
                        for (; m < per_token && m < count; ++m) {
                            chosen[m] = ranked[m];
                        }
                    } else {
                        /* scored count - j, a later repeat overwriting: the distinct experts in
                         * the order of their last places */
                        const int64_t me2 = ++mark_epoch_;
                        int32_t n_order = 0;
                        for (int32_t j = count - 1; j >= 0; --j) {
                            if (mark[ranked[j]] != me2) {
                                mark[ranked[j]] = me2;
                                w.last_place[static_cast<size_t>(n_order++)] = j;
                            }
                        }
                        std::sort(w.last_place.begin(), w.last_place.begin() + n_order);
                        for (int32_t i = 0; i < n_order && m < per_token; ++i) {
                            chosen[m++] = ranked[w.last_place[static_cast<size_t>(i)]];
                        }
                    }
                    for (int32_t e = 0; m < per_token && e < E_; ++e) {
                        if (mark[e] != mark_epoch_) { /* the unranked tie: lower id first */
                            chosen[m++] = e;
                        }
                    }
                }
                if (bq_) {
                    place_pending();
                }
                const int64_t ppin = ++pin_epoch_;
                int32_t absent = 0; /* the picks not resident, in order (distinct: each
                                     * stays absent until its own insert) */
                for (int32_t j = 0; j < per_token; ++j) {
                    const int32_t e = pick[j];
                    const bool in = X[e].slot >= 0;
                    pin_[e] = ppin; /* an absent one is pinned at its insert anyway */
                    fetch_list[absent] = e;
                    absent += !in;
                }
                hint_ = std::max(absent, 1);
                for (int32_t j = 0; j < absent; ++j) {
                    const int32_t e = fetch_list[j];
                    /* listed at the layer's next event: a route call lists it after its
                     * selection there if it selects it (pinned meanwhile), else before its
                     * first search; a prefetch lists it first (place_pending) */
                    if (insert<Freq, false>(e) < 0) {
                        break;
                    }
                    if (bq_) {
                        pending_[n_pending_++] = e;
                    }
                    pin_[e] = ppin;
                    used<Freq>(e);
                    if (admission) {
                        lost[e] = 0.0f;
                    }
                    X[e].prefetched = true;
                    o.prefetches += 1;
                    o.bytes_async += eb;
                }
                continue;
            }
            /* a route call (route.cpp) */
            if (n_res_ == E_) {
                /* every expert resident, and no resize: every selection hits from now on,
                 * so recency, counts and lost mass are never read again */
                const int32_t * ids = plan_.ids.data() + e_.packed * k;
                const int32_t nk = n * k;
                if (prefetching) {
                    for (int32_t i = 0; i < nk; ++i) {
                        const int32_t u = ids[i];
                        o.prefetch_hits += X[u].prefetched;
                        X[u].prefetched = false;
                    }
                }
                o.hits += nk;
                o.rows += n;
                o.selections += static_cast<int64_t>(nk);
                continue;
            }
            if (Rule == MOECACHE_SUBSTITUTE_ALL && !admission && !prefetching && n_res_ >= k &&
                (!fill || n_res_ == S_)) {
                /* substitute-all holding k or more residents (and with fill_free, every slot
                 * full: before, a miss fills a free slot): a row's unmarked residents
                 * (n_res - its hits) are at least its misses (k - hits), so every miss is
                 * substituted and nothing is fetched, now and after (the residents never
                 * change). Without admission or prefetch nothing reads which resident
                 * stands in, nor recency (no eviction is ever looked for): only the counts
                 * and the missed selections' mass remain. */
                const int32_t * ids = plan_.ids.data() + e_.packed * k;
                const float * wt = plan_.weights.data() + e_.packed * k;
                for (int32_t r = 0; r < n; ++r) {
                    const int32_t base = r * k;
                    int32_t hits = 0;
                    float mass = 0.0f;
                    for (int32_t j = 0; j < k; ++j) {
                        const bool in = X[ids[base + j]].slot >= 0;
                        hits += in;
                        mass += in ? 0.0f : wt[base + j];
                    }
                    o.hits += hits;
                    o.substitutions += k - hits;
                    full_ |= fill && hits < k; /* every slot full: a larger budget fetches it */
                    layer_mass += static_cast<double>(mass);
                }
                o.rows += n;
                o.selections += static_cast<int64_t>(n) * k;
                continue;
            }
            if (Rule != MOECACHE_FETCH_ALL && n_res_ <= 32 && x + kRowAhead < x_end) {
                /* few residents: a substitute is found by reading their probabilities from
                 * the row, so ask for those of a later call's row now (unless few rows do:
                 * the ranking's walk then finds them, e.g. under PSR's prefetches) */
                if (++row_visits == kAheadWindow) {
                    row_visits /= 2;
                    row_reads /= 2;
                }
                if (row_reads * kAheadShare >= row_visits) {
                    const float * ahead = t_.probs + ev[x + kRowAhead].row * E_;
                    for (int32_t s = 0; s < n_res_; ++s) {
                        __builtin_prefetch(ahead + slots_[s]);
                    }
                }
            }
            step_ = e_.step;
            const int64_t p0 = e_.packed;
            const int32_t * ids = plan_.ids.data() + p0 * k;
            const float * wt = plan_.weights.data() + p0 * k;
            const int32_t nk = n * k;
            const int64_t pin = ++pin_epoch_;
            /* each row's selections as bits (top_k <= 32): its misses, then those it fetches
             * and those it substitutes, in selection order (the bits' order) */
            /* Every selection is pinned, the absent ones too: only residents are ever
             * victims, and an absent selection is pinned when it is inserted (fetched or
             * admitted) in this epoch, so pinning it beforehand changes no victim and
             * saves a load and a select a selection. */
            uint32_t miss0 = 0; /* the first row's misses, found with the pins */
            int32_t absent = 0;
            for (int32_t j = k - 1; j >= 0; --j) { /* the bits shifted in: no shift by j */
                const int32_t e = ids[j];
                const uint32_t out = static_cast<uint32_t>(static_cast<uint16_t>(X[e].slot)) >> 15;
                pin_[e] = pin; /* see the note above */
                miss0 = (miss0 << 1) | out;
                absent += static_cast<int32_t>(out);
            }
            for (int32_t i = k; i < nk; ++i) {
                const int32_t e = ids[i];
                const bool in = X[e].slot >= 0;
                pin_[e] = pin;
                absent += !in;
            }
            hint_ = std::max(absent, 1);
            /* the prefetches before this call: those it selects (pinned) are listed after
             * its commit, the others now, before its first search */
            int32_t n_late = 0;
            for (int32_t i = 0; i < n_pending_; ++i) {
                const int32_t e = pending_[i];
                if (pin_[e] == pin) {
                    pending_[n_late++] = e;
                } else {
                    bq_place(e);
                }
            }
            n_pending_ = 0;
            if (Rule != MOECACHE_FETCH_ALL) {
                std::memcpy(used_ids, ids, static_cast<size_t>(nk) * sizeof(int32_t));
            }
            int32_t n_fetched = 0;
            bool failed = false;
            for (int32_t r = 0; r < n && !failed; ++r) {
                const int32_t base = r * k;
                const int64_t row = r0 + r;
                uint32_t miss = miss0;
                if (r > 0) { /* an earlier row of the call may have fetched some */
                    miss = 0;
                    for (int32_t j = 0; j < k; ++j) {
                        miss |= static_cast<uint32_t>(X[ids[base + j]].slot < 0) << j;
                    }
                }
                uint32_t fetch = miss, subst = 0;
                if (Rule != MOECACHE_FETCH_ALL) {
                    uint32_t may = 0; /* the selections the rule would fetch */
                    if (Rule == MOECACHE_THRESHOLD) {
                        may = at_least(wt + base, k, theta) | 1u; /* the first always */
                    } else if (Rule == MOECACHE_FIRST_CHOICE) {
                        may = 1;
                    }
                    if (fill && n_res_ < S_) { /* decide_token's free_slots */
                        may |= lowest_bits(miss, S_ - n_res_);
                    }
                    fetch = miss & may;
                    subst = miss & ~may;
                    full_ |= fill && subst != 0;
                    if (subst != 0) {
                        /* the row's own selections are no substitutes (marked with `me` where
                         * the search reads marks) */
                        const int64_t me = ++mark_epoch_;
                        subst_.own = ids + base;
                        const float * prow = t_.probs + row * E_;
                        const uint16_t * rank_row = ranks + (p0 + r) * MOECACHE_RANK_WIDTH;
                        const int32_t rank_count = rank_counts[p0 + r] & kRankCount;
                        const bool ranked_all = (rank_counts[p0 + r] & kRankedAll) != 0;
                        int32_t best[MOECACHE_MAX_K];
                        int32_t subs[MOECACHE_MAX_K]; /* the row's substituting selections */
                        int32_t n_sub = 0;
                        for (uint32_t b = subst; b != 0; b &= b - 1) {
                            subs[n_sub++] = base + __builtin_ctz(b);
                        }
                        if (Rule == MOECACHE_ROUTING_BONUS) {
                            const float * p_sel = selp + (p0 + r) * k;
                            int32_t order[MOECACHE_MAX_K];
                            const int32_t m = n_sub;
                            const float selected = plan_.selected_sum[static_cast<size_t>(p0 + r)];
                            const float bonus = bonus_w * (selected > 0.0f ? selected : 1.0f);
                            const uint8_t * sorted = plan_.bonus_order.data() + (p0 + r) * k;
                            if (sorted[0] != 0xFF) {
                                /* the plan's order of the row's selections, its misses kept */
                                int32_t m2 = 0;
                                for (int32_t j = 0; j < k; ++j) {
                                    order[m2] = base + sorted[j];
                                    m2 += static_cast<int32_t>((subst >> sorted[j]) & 1u);
                                }
                            } else { /* a NaN: std::sort's own order, as route.cpp's */
                                std::copy(subs, subs + n_sub, order);
                                std::sort(order, order + m, [&](int32_t a, int32_t b) {
                                    const float pa = p_sel[a - base];
                                    const float pb = p_sel[b - base];
                                    return pa != pb ? pa < pb : a > b;
                                });
                            }
                            int32_t at_rank[MOECACHE_MAX_K];
                            const float * ranked_p = plan_.rank_p.data() + (p0 + r) * kRankP;
                            float need[MOECACHE_MAX_K];
                            for (int32_t i2 = 0; i2 < m; ++i2) {
                                need[i2] = p_sel[order[i2] - base];
                            }
                            /* an unranked expert's probability is at most any ranked one's */
                            const float floor =
                                rank_count > 0 ? ranked_p[std::min(rank_count, kRankP) - 1] : 0.0f;
                            const int32_t n_best =
                                subst_.pick(prow, me, m, best, rank_row, rank_count, ranked_all, n_res_,
                                            at_rank, rank_count > 0 ? need : nullptr, floor, bonus);
                            /* substitutes in order while the bonus steers the miss to its
                             * pick; from the first that it does not on, every miss is fetched */
                            int32_t i2 = 0;
                            for (const int32_t lim = std::min(m, n_best); i2 < lim; ++i2) {
                                const int32_t i = order[i2];
                                const int32_t s = best[i2];
                                const int32_t j = at_rank[i2];
                                const bool ranked = j >= 0 && j < kRankP;
                                row_reads += !ranked;
                                const float p_s = ranked ? ranked_p[j] : prow[s];
                                if (!(p_s + bonus > p_sel[i - base])) {
                                    break;
                                }
                                used_ids[i] = s;
                                pin_[s] = pin;
                            }
                            for (; i2 < m; ++i2) {
                                const uint32_t bit = 1u << (order[i2] - base);
                                subst &= ~bit;
                                fetch |= bit;
                            }
                        } else {
                            const int32_t n_best =
                                subst_.pick(prow, me, n_sub, best, rank_row, rank_count,
                                            ranked_all, n_res_);
                            for (int32_t x2 = 0; x2 < n_sub; ++x2) {
                                const int32_t i = subs[x2];
                                if (x2 >= n_best) {
                                    const uint32_t bit = 1u << (i - base);
                                    subst &= ~bit;
                                    fetch |= bit;
                                    continue;
                                }
                                const int32_t s = best[x2];
                                used_ids[i] = s;
                                pin_[s] = pin;
                            }
                        }
                    }
                }
                fetch_bits[r] = fetch;
                subst_bits[r] = subst;
                for (uint32_t b = fetch; b != 0; b &= b - 1) {
                    const int32_t e = ids[base + __builtin_ctz(b)];
                    if (insert<Freq, false>(e) < 0) { /* listed after the commit */
                        failed = true;
                        break;
                    }
                    pin_[e] = pin;
                    fetched[n_fetched++] = e;
                }
            }
            if (failed) {
                fail_call = c;
                break;
            }
            /* commit: recency and counts, then PSR's prefetch hits (independent of them);
             * each loop under its own test, not a test a selection */
            const int32_t * uses = Rule == MOECACHE_FETCH_ALL ? ids : used_ids;
            if (evicts_) {
#ifndef MOECACHE_SELFCHECK
                if (Freq && pkeys_ != nullptr) { /* record_selection with the plan's keys */
                    const double * keys = pkeys_ + p0 * k;
                    /* the clock in a register: a store to last_use may alias the member */
                    int32_t clock = clock_;
                    Expert * X2 = X_;
                    bool * stale = bq_stale_;
                    double * kkey = kkey_;
                    for (int32_t i = 0; i < nk; ++i) {
                        X2[uses[i]].last_use = ++clock;
                        const int32_t e = ids[i];
                        stale[e] = true;
                        kkey[e] = keys[i];
                    }
                    clock_ = clock;
                } else
#endif
                if (!Freq) {
                    /* every use to the tail (an expert there already stays), the tail kept
                     * in a register: no store and load of the sentinel's link a use */
                    Expert * X2 = X_;
                    int32_t last = X2[E_].prev;
                    for (int32_t i = 0; i < nk; ++i) {
                        const int32_t e = uses[i];
#ifdef MOECACHE_SELFCHECK
                        X2[e].last_use = ++clock_;
#endif
                        if (e == last) {
                            continue;
                        }
                        const int32_t p = X2[e].prev;
                        const int32_t nx = X2[e].next; /* not the sentinel: e is not the tail */
                        X2[p].next = static_cast<int16_t>(nx);
                        X2[nx].prev = static_cast<int16_t>(p);
                        X2[e].prev = static_cast<int16_t>(last);
                        X2[e].next = static_cast<int16_t>(E_);
                        X2[last].next = static_cast<int16_t>(e);
                        last = e;
                    }
                    X2[E_].prev = static_cast<int16_t>(last);
                } else {
                    for (int32_t i = 0; i < nk; ++i) {
                        used<Freq>(uses[i]);
                        record_selection(ids[i], p0 * k + i);
                    }
                }
                if (Freq && bq_) { /* the fetches and the prefetches selected, under the keys
                                    * their selections gave */
                    for (int32_t f = 0; f < n_fetched; ++f) {
                        bq_place(fetched[f]);
                    }
                    for (int32_t i = 0; i < n_late; ++i) {
                        bq_place(pending_[i]);
                    }
                }
            }
            if (prefetching && n == 1) {
                /* one row: a resident selection (not a miss) is a hit, a missed one is
                 * fetched (its flag cleared below) or stands in by its substitute: the flags
                 * read as bits, only the set ones written */
                uint32_t pf = 0;
                for (int32_t j = 0; j < k; ++j) {
                    pf |= static_cast<uint32_t>(X[ids[j]].prefetched) << j;
                }
                for (uint32_t b = pf & ~miss0; b != 0; b &= b - 1) { /* the hits */
                    X[ids[__builtin_ctz(b)]].prefetched = false;
                    o.prefetch_hits += 1;
                }
                for (uint32_t b = subst_bits[0]; b != 0; b &= b - 1) {
                    const int32_t u = uses[__builtin_ctz(b)];
                    o.prefetch_hits += X[u].prefetched;
                    X[u].prefetched = false;
                }
            } else if (prefetching) {
                for (int32_t r = 0; r < n; ++r) {
                    const int32_t base = r * k;
                    const uint32_t fetch = fetch_bits[r];
                    for (int32_t j = 0; j < k; ++j) {
                        const int32_t u = uses[base + j];
                        const uint32_t was = X[u].prefetched;
                        const uint32_t hit = was & ~(fetch >> j) & 1u;
                        X[u].prefetched = (was & ~hit) != 0;
                        o.prefetch_hits += hit;
                    }
                }
            }
            if (admission || prefetching) { /* else neither is ever set */
                for (int32_t f = 0; f < n_fetched; ++f) {
                    if (admission) {
                        lost[fetched[f]] = 0.0f;
                    }
                    X[fetched[f]].prefetched = 0;
                }
            }
            /* admission, then the call's counts (admit_lost_mass, record_token): every
             * fetch bit was fetched (n_fetched), the substitutions are counted in the walk
             * of their bits that sums their mass, a row at a time (the core's order) */
            int32_t n_subst = 0, n_admit = 0;
            if (Rule != MOECACHE_FETCH_ALL) { /* else nothing is substituted */
                for (int32_t r = 0; r < n; ++r) {
                    const int32_t base = r * k;
                    float mass = 0.0f;
                    for (uint32_t b = subst_bits[r]; b != 0; b &= b - 1) {
                        const int32_t i = base + __builtin_ctz(b);
                        mass += wt[i];
                        n_subst += 1;
                        if (!admission) {
                            continue;
                        }
                        const int32_t e = ids[i];
                        if (X[e].slot >= 0) {
                            continue;
                        }
                        lost[e] += wt[i];
                        if (lost[e] < beta) {
                            continue;
                        }
                        if (insert<Freq>(e) < 0) {
                            continue;
                        }
                        pin_[e] = pin;
                        used<Freq>(e);
                        lost[e] = 0.0f;
                        X[e].prefetched = 0;
                        n_admit += 1;
                    }
                    layer_mass += static_cast<double>(mass);
                }
            }
            o.hits += nk - n_fetched - n_subst;
            o.fetches += n_fetched;
            o.substitutions += n_subst;
            o.admissions += n_admit;
            o.bytes_sync += n_fetched * eb;
            o.bytes_async += n_admit * eb;
            o.rows += n;
            o.selections += static_cast<int64_t>(nk);
        }
        for (; filled < n_tokens; ++filled) {
            cum_mass[layer * n_tokens + filled] = layer_mass;
        }
        if (ticker_ != nullptr && !ticker_->layer_done()) {
            return MOECACHE_E_CANCELLED;
        }
    }
    const int64_t fail_token =
        fail_call < t_.n_calls ? plan_.call_token[static_cast<size_t>(fail_call)] : t_.n_tokens;
    double before_mass = 0.0;
    for (int64_t tok = 0; tok < t_.n_tokens; ++tok) {
        moecache_replay_token & o = out_[tok];
        if (tok >= fail_token) {
            std::memset(&o, 0, sizeof(o)); /* the core stops at its first error */
            continue;
        }
        double now_mass = 0.0;
        for (int32_t l = 0; l < n_layers; ++l) {
            now_mass += cum_mass[l * n_tokens + tok];
        }
        o.substituted_mass = now_mass - before_mass;
        o.n_sync = o.fetches;
        o.n_async = o.admissions + o.prefetches;
        before_mass = now_mass;
    }
    return fail_call < t_.n_calls ? MOECACHE_E_NO_SLOT : MOECACHE_OK;
}

}  // namespace loop

bool fast_covers(const moecache_replay_trace & t, const moecache_replay_config & cfg,
                 bool ids_valid, bool events) {
    const moecache_policy & p = cfg.follow_policy ? t.start_policy : cfg.policy;
    const bool ranked = t.ranks != nullptr && t.rank_counts != nullptr &&
                        t.selected_probs != nullptr;
    if (events || !ids_valid || (!ranked && p.miss_rule != MOECACHE_FETCH_ALL)) {
        return false;
    }
    int32_t slots = cfg.slots == 0 ? t.start_slots : cfg.slots;
    for (int64_t i = 0; i < t.n_changes; ++i) {
        const int32_t to = t.change_slots[i];
        if ((to == 0 && cfg.follow_policy) || (to > 0 && cfg.slots == 0 && to != slots)) {
            return false; /* a policy or budget change: the per-call core follows it */
        }
    }
    /* the clock (a tick per use, admission and prefetch), steps and slots fit the loop's
     * narrower integers */
    const double ticks = 2.0 * static_cast<double>(t.n_rows) * t.top_k +
                         static_cast<double>(t.n_calls) * prefetch_per_token(t, p, slots);
    int64_t max_step = t.initial_step;
    for (int64_t c = 0; c < t.n_calls; ++c) {
        max_step = std::max(max_step, t.call_step[c]);
    }
    const int64_t kInt32 = std::numeric_limits<int32_t>::max();
    if (ticks >= static_cast<double>(kInt32) || max_step >= kInt32 ||
        t.n_experts >= std::numeric_limits<int16_t>::max()) { /* LRU's entries E, E + 1 */
        return false;
    }
    if (p.eviction == MOECACHE_EVICT_FREQUENCY) {
        /* the bucket queue needs every key to rise with a selection: mathematically it rises by
         * log2(1 + 1/f) >= 0.72 / f; its doubles round by a few ulps of log2(f) + step / h.
         * With f <= rows and this margin (~400x) the rise always wins */
        const double f = static_cast<double>(t.n_rows) + 1.0;
        const double bound =
            f * (64.0 + std::log2(f) + 4.0 * static_cast<double>(max_step) /
                                           static_cast<double>(p.half_life));
        if (!(bound < 1099511627776.0)) { /* 2^40 */
            return false;
        }
    }
    return true;
}

int32_t prefetch_per_token(const moecache_replay_trace & t, const moecache_policy & p,
                           int32_t slots) {
    const int32_t want = p.prefetch == MOECACHE_PREFETCH_TOP_K ? t.top_k : p.prefetch;
    return t.pred_width > 0 ? std::max(std::min({want, t.n_experts, slots}), 0) : 0;
}

int32_t replay_fast(const moecache_replay_trace & t, const FastPlan & plan,
                    const moecache_replay_config & cfg, moecache_replay_token * out,
                    FastWorkspace & w, ReplayTicker * ticker, bool * evicted) {
    const moecache_policy & p = cfg.follow_policy ? t.start_policy : cfg.policy;
    const int32_t slots = cfg.slots == 0 ? t.start_slots : cfg.slots;
    loop::FastReplay replay(t, plan, p, slots, out, w, ticker);
    replay_fast_configs.fetch_add(1, std::memory_order_relaxed);
    const int32_t code = replay.run();
    if (evicted != nullptr) {
        *evicted = replay.evicted();
    }
    return code;
}

}  // namespace moecache_core
