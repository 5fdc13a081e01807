/*
 * batch_replay.cpp — the router-logit simulator's fast path: a whole trace, many policies
 * and budgets, one call.
 *
 * "Which Expert Misses Are Worth Waiting For?" compares policies by replaying recorded
 * router decisions. Driving moecache_route from Python costs microseconds per call, so a
 * policy x budget what-if over a long chat took seconds; here each configuration walks the
 * trace in C++ on its own cache, in the exact order a caller of the per-call API would
 * (steps, policy and budget changes, one route call per recorded (step, layer) group, then
 * PSR's prefetch with the row's recorded prediction), so it decides exactly what that
 * caller, and the engine that recorded the trace, decided. Configurations share nothing
 * but the read-only trace, so they run on parallel threads without locks.
 */
#include "moecache_internal.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <thread>
#include <vector>

#if defined(__SSE2__) && defined(__GNUC__) /* x86-64 GCC and Clang */
#include <emmintrin.h>
#define MOECACHE_RANK_SSE2 1
#else
#define MOECACHE_RANK_SSE2 0
#endif

/* The caller's view of a batch (moecache_replay_control): written by the workers, read and
 * cancelled from any thread. */
struct moecache_replay_control {
    std::atomic<int64_t> configs_done{0};
    std::atomic<int64_t> units_done{0};
    std::atomic<int64_t> units_total{0};
    std::atomic<int32_t> cancel{0};
};

namespace moecache_core {

bool ReplayTicker::layer_done(int64_t n) {
    if (ctl == nullptr) {
        return true;
    }
    if (n > 0) {
        units += n;
        ctl->units_done.fetch_add(n, std::memory_order_relaxed);
    }
    return ctl->cancel.load(std::memory_order_relaxed) == 0;
}

bool ReplayTicker::cancelled() const {
    return ctl != nullptr && ctl->cancel.load(std::memory_order_relaxed) != 0;
}

}  // namespace moecache_core

namespace {

using moecache_core::LayerState;

struct Totals {
    int64_t rows = 0, selections = 0, hits = 0, fetches = 0, substitutions = 0;
    int64_t admissions = 0, bytes_sync = 0, bytes_async = 0, prefetches = 0;
    int64_t prefetch_hits = 0;
    double mass = 0.0;
};

Totals sum_stats(const moecache & c) {
    Totals t;
    for (const LayerState & L : c.layers) {
        const moecache_layer_stats & s = L.stats;
        t.rows += s.tokens;
        t.selections += s.selections;
        t.hits += s.hits;
        t.fetches += s.fetches;
        t.substitutions += s.substitutions;
        t.admissions += s.admissions;
        t.bytes_sync += s.bytes_sync;
        t.bytes_async += s.bytes_async;
        t.prefetches += s.prefetches;
        t.prefetch_hits += s.prefetch_hits;
        t.mass += s.substituted_mass;
    }
    return t;
}

/* Whether the trace's shape is one a batch can walk: its dimensions, pointers, calls,
 * tokens and changes (linear in calls and changes, not rows; preds_valid checks the rows). */
bool shape_valid(const moecache_replay_trace & t) {
    if (t.n_layers < 1 || t.n_experts < 1 || t.top_k < 1 || t.top_k > MOECACHE_MAX_K ||
        t.top_k > t.n_experts || t.n_rows < 0 || t.n_calls < 0 || t.n_tokens < 0 ||
        t.n_changes < 0 || t.pred_width < 0 || t.initial_step < 0 ||
        t.expert_bytes == nullptr || t.token_calls == nullptr) {
        return false;
    }
    if (t.n_rows > 0 && (t.probs == nullptr || t.ids == nullptr || t.weights == nullptr)) {
        return false;
    }
    if (t.n_calls > 0 && (!t.call_step || !t.call_layer || !t.call_start || !t.call_stop)) {
        return false;
    }
    if (t.n_changes > 0 && (!t.change_token || !t.change_slots || !t.change_policy)) {
        return false;
    }
    if (t.pred_width > 0 && (t.predicted == nullptr || t.next_layer == nullptr)) {
        return false;
    }
    if (t.token_calls[0] != 0 || t.token_calls[t.n_tokens] != t.n_calls) {
        return false;
    }
    for (int64_t i = 0; i < t.n_tokens; ++i) {
        if (t.token_calls[i + 1] < t.token_calls[i]) {
            return false;
        }
    }
    for (int64_t c = 0; c < t.n_calls; ++c) {
        if (t.call_layer[c] < 0 || t.call_layer[c] >= t.n_layers || t.call_start[c] < 0 ||
            t.call_stop[c] < t.call_start[c] || t.call_stop[c] > t.n_rows ||
            t.call_step[c] < 0 ||
            t.call_stop[c] - t.call_start[c] > std::numeric_limits<int32_t>::max() / MOECACHE_MAX_K) {
            return false;
        }
    }
    for (int64_t i = 0; i < t.n_changes; ++i) {
        const bool ordered = i == 0 || t.change_token[i] >= t.change_token[i - 1];
        if (!ordered || t.change_token[i] < 0 || t.change_token[i] >= t.n_tokens ||
            t.change_slots[i] < 0 || t.change_slots[i] > t.n_experts ||
            (t.change_slots[i] > 0 && t.change_slots[i] < t.top_k) ||
            (t.change_slots[i] == 0 && !moecache_core::policy_valid(t.change_policy[i]))) {
            return false;
        }
    }
    return moecache_core::policy_valid(t.start_policy) && t.start_slots >= t.top_k &&
           t.start_slots <= t.n_experts;
}

/* Whether every row's prediction names a layer and experts that exist. */
bool preds_valid(const moecache_replay_trace & t) {
    if (t.pred_width > 0) {
        for (int64_t r = 0; r < t.n_rows; ++r) {
            const int32_t nl = t.next_layer[r];
            if (nl < -1 || nl >= t.n_layers) {
                return false;
            }
            for (int32_t j = 0; j < t.pred_width; ++j) {
                const int32_t e = t.predicted[r * t.pred_width + j];
                if (e < -1 || e >= t.n_experts) {
                    return false;
                }
            }
        }
    }
    return true;
}

/* Whether a caller's ranking (moecache_rank_rows' contract) names at most
 * MOECACHE_RANK_WIDTH experts a row, each one that exists. */
bool ranking_valid(const moecache_replay_trace & t) {
    if (t.ranks == nullptr || t.rank_counts == nullptr) {
        return true;
    }
    for (int64_t r = 0; r < t.n_rows; ++r) {
        const int32_t n = t.rank_counts[r];
        if (n > MOECACHE_RANK_WIDTH) {
            return false;
        }
        const uint16_t * rank = t.ranks + r * MOECACHE_RANK_WIDTH;
        uint16_t most = 0;
        for (int32_t j = 0; j < n; ++j) {
            most = std::max(most, rank[j]);
        }
        if (n > 0 && most >= t.n_experts) {
            return false;
        }
    }
    return true;
}

bool trace_valid(const moecache_replay_trace & t) {
    return shape_valid(t) && preds_valid(t) && ranking_valid(t);
}

/* Whether every row's ids are distinct experts (what each route call checks first): only
 * then may a configuration skip the per-call core. */
bool rows_valid(const moecache_replay_trace & t) {
    std::vector<int64_t> mark(static_cast<size_t>(t.n_experts), -1);
    for (int64_t r = 0; r < t.n_rows; ++r) {
        for (int32_t j = 0; j < t.top_k; ++j) {
            const int32_t e = t.ids[r * t.top_k + j];
            if (e < 0 || e >= t.n_experts || mark[static_cast<size_t>(e)] == r) {
                return false;
            }
            mark[static_cast<size_t>(e)] = r;
        }
    }
    return true;
}

/* Whether any configuration could substitute (only then are the rows ranked). */
bool may_substitute(const moecache_replay_trace & t, const moecache_replay_config * configs,
                    int32_t n_configs) {
    for (int32_t i = 0; i < n_configs; ++i) {
        if (configs[i].follow_policy ? t.start_policy.miss_rule != MOECACHE_FETCH_ALL ||
                                           t.n_changes > 0
                                     : configs[i].policy.miss_rule != MOECACHE_FETCH_ALL) {
            return true;
        }
    }
    return false;
}

template <typename Work>
void run_workers(int32_t workers, Work work) {
    if (workers <= 1) {
        work();
        return;
    }
    std::vector<std::thread> pool;
    try {
        for (int32_t w = 0; w < workers; ++w) {
            pool.emplace_back(work);
        }
    } catch (...) {  // no thread could be started: the ones running finish the work
    }
    if (pool.empty()) {
        work();
    }
    for (std::thread & th : pool) {
        th.join();
    }
}

int32_t worker_count(int32_t n_threads, int64_t jobs) {
    const int32_t hw = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
    return static_cast<int32_t>(
        std::max<int64_t>(1, std::min<int64_t>(jobs, n_threads > 0 ? n_threads : hw)));
}

/* pick_substitute's order as one integer: the probability's bits made unsigned-ordered and
 * inverted (higher first) over the id (lower first); -0.0 counts as 0.0, as the scan's
 * float comparison does. */
uint64_t rank_key(float p, int32_t e) {
    if (p == 0.0f) {
        p = 0.0f;
    }
    uint32_t u;
    std::memcpy(&u, &p, sizeof(u));
    u = (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
    return (static_cast<uint64_t>(~u) << 32) | static_cast<uint32_t>(e);
}

/* The first (at most MOECACHE_RANK_WIDTH) of m candidates' keys in order, as ids into out;
 * returns how many. */
int32_t ranked_ids(uint64_t * keys, int32_t m, uint16_t * out) {
    constexpr int32_t width = MOECACHE_RANK_WIDTH;
    if (m > width) {
        std::nth_element(keys, keys + width, keys + m);
        m = width;
    }
    std::sort(keys, keys + m);
    for (int32_t j = 0; j < m; ++j) {
        out[j] = static_cast<uint16_t>(keys[j] & 0xFFFFu);
    }
    return m;
}

/* Whether the row holds a NaN (no order exists: the row is left to the scan). */
bool holds_nan(const float * row, int32_t n) {
    uint32_t nan = 0;
    for (int32_t e = 0; e < n; ++e) {
        uint32_t u;
        std::memcpy(&u, row + e, sizeof(u));
        nan |= static_cast<uint32_t>((u & 0x7fffffffu) > 0x7f800000u);
    }
    return nan != 0;
}

/* A threshold's sample of a row of n experts: up to 64 evenly spaced values into sample;
 * returns how many, and in q the threshold's rank among them, descending (about seven
 * eighths of the width down). */
int32_t take_sample(const float * row, int32_t n, float * sample, int32_t * q) {
    int32_t ns = 0;
    const int32_t stride = std::max(1, n / 64);
    for (int32_t e = 0; e < n && ns < 64; e += stride) {
        sample[ns++] = row[e];
    }
    *q = std::max(0, ns * MOECACHE_RANK_WIDTH * 7 / (8 * n) - 1);
    return ns;
}

/* The threshold of a row of n > MOECACHE_RANK_WIDTH experts without NaN: the value ranked
 * about seven eighths of the width down a sample of 64 of them. */
float sampled_threshold(const float * row, int32_t n) {
    float sample[64];
    int32_t q = 0;
    const int32_t ns = take_sample(row, n, sample, &q);
    std::nth_element(sample, sample + q, sample + ns, std::greater<float>());
    return sample[q];
}

}  // namespace

namespace moecache_core {

/* The scalar ranking of a row (see rank_row): the experts at or above a threshold sampled
 * from the row (about seven eighths of the width of them, at most the width), sorted; so
 * the ranked ones are exactly the row's best, whatever the threshold. Returns how many (0
 * for a row holding a NaN). */
int32_t rank_row_reference(const float * row, int32_t n, RankScratch & s, uint16_t * out) {
    constexpr int32_t width = MOECACHE_RANK_WIDTH;
    uint64_t * keys = s.keys.data();
    int32_t * idx = s.idx.data();
    if (holds_nan(row, n)) {
        return 0;
    }
    const float threshold =
        n > width ? sampled_threshold(row, n) : -std::numeric_limits<float>::infinity();
    int32_t m = 0;
    for (int32_t e = 0; e < n; ++e) {
        idx[m] = e;
        m += row[e] >= threshold;
    }
    for (int32_t j = 0; j < m; ++j) {
        keys[j] = rank_key(row[idx[j]], idx[j]);
    }
    return ranked_ids(keys, m, out);
}

}  // namespace moecache_core

#if MOECACHE_RANK_SSE2
namespace rank_sse2 { /* named: the engine compiles the core as one unit (its functions static:
                      * llama.cpp builds with -Wmissing-declarations) */

/* (prev[3], v[0], v[1], v[2]): a sorted list of four lanes shifted up by one. */
inline __m128 shift_in(__m128 v, __m128 prev) {
    const __m128 rot = _mm_shuffle_ps(v, v, _MM_SHUFFLE(2, 1, 0, 3));
    return _mm_move_ss(rot, _mm_shuffle_ps(prev, prev, _MM_SHUFFLE(2, 1, 0, 3)));
}

/* x into an ascending list of the 4 * V smallest seen (+inf where empty), without a
 * branch: lane i becomes min(a[i], max(a[i - 1], x)). */
template <int V>
inline void keep_smallest(__m128 (&a)[V], __m128 x) {
    __m128 prev = _mm_set1_ps(-std::numeric_limits<float>::infinity());
    for (int v = 0; v < V; ++v) {
        const __m128 shifted = shift_in(a[v], prev);
        prev = a[v];
        a[v] = _mm_min_ps(a[v], _mm_max_ps(shifted, x));
    }
}

/* The kth smallest (0-based, kth < 4 * V) of s[0..ns), ns >= 8 * V: two interleaved
 * lists (independent chains) merged; the value nth_element would place there. */
template <int V>
float kth_smallest(const float * s, int32_t ns, int32_t kth) {
    __m128 a[V], c[V];
    for (int v = 0; v < V; ++v) {
        a[v] = c[v] = _mm_set1_ps(std::numeric_limits<float>::infinity());
    }
    int32_t i = 0;
    for (; i + 2 <= ns; i += 2) {
        keep_smallest<V>(a, _mm_set1_ps(s[i]));
        keep_smallest<V>(c, _mm_set1_ps(s[i + 1]));
    }
    if (i < ns) {
        keep_smallest<V>(a, _mm_set1_ps(s[i]));
    }
    alignas(16) float x[4 * V], y[4 * V];
    for (int v = 0; v < V; ++v) {
        _mm_store_ps(x + 4 * v, a[v]);
        _mm_store_ps(y + 4 * v, c[v]);
    }
    int32_t p = 0, q = 0;
    float r = 0.0f;
    for (int32_t k = 0; k <= kth; ++k) {
        r = x[p] <= y[q] ? x[p++] : y[q++];
    }
    return r;
}

/* The kth smallest of the sample (kth < 32, ns = 64) by the shortest list holding it. */
static float kth_of_sample(const float * s, int32_t ns, int32_t kth) {
    return kth < 12 ? kth_smallest<3>(s, ns, kth)
           : kth < 16 ? kth_smallest<4>(s, ns, kth) : kth_smallest<8>(s, ns, kth);
}

/* The reference's sampled threshold (sampled_threshold) of a row of n > 64 experts (so 64
 * samples), found by the vector selection from whichever end of the sample its rank is
 * nearer (within 32). A NaN makes it meaningless, never undefined behaviour (nth_element's
 * would be): the filter then finds the NaN. */
static float sample_threshold(const float * row, int32_t n) {
    float sample[64];
    int32_t q = 0;
    const int32_t ns = take_sample(row, n, sample, &q);
    if (ns - 1 - q <= q) {
        return kth_of_sample(sample, ns, ns - 1 - q);
    }
    for (int32_t i = 0; i < ns; ++i) {
        sample[i] = -sample[i];
    }
    return -kth_of_sample(sample, ns, q);
}

/* The row's experts at or above `threshold` (values at vals, ids at idx, in id order), from
 * a bit mask per 64 experts: the loop over them branches once per candidate, not once per
 * expert. Returns how many, or -1 if the row holds a NaN. */
static int32_t candidates(const float * row, int32_t n, float threshold, float * vals,
                          int32_t * idx) {
    const __m128 t = _mm_set1_ps(threshold);
    __m128 unordered = _mm_setzero_ps();
    int32_t m = 0;
    int32_t e0 = 0;
    for (; e0 + 64 <= n; e0 += 64) {
        uint64_t mask = 0;
        for (int32_t c = 0; c < 64; c += 16) {
            const float * p = row + e0 + c;
            const __m128 x0 = _mm_loadu_ps(p), x1 = _mm_loadu_ps(p + 4);
            const __m128 x2 = _mm_loadu_ps(p + 8), x3 = _mm_loadu_ps(p + 12);
            unordered = _mm_or_ps(unordered, _mm_or_ps(_mm_cmpunord_ps(x0, x1),
                                                       _mm_cmpunord_ps(x2, x3)));
            const uint32_t bits =
                static_cast<uint32_t>(_mm_movemask_ps(_mm_cmpge_ps(x0, t))) |
                static_cast<uint32_t>(_mm_movemask_ps(_mm_cmpge_ps(x1, t))) << 4 |
                static_cast<uint32_t>(_mm_movemask_ps(_mm_cmpge_ps(x2, t))) << 8 |
                static_cast<uint32_t>(_mm_movemask_ps(_mm_cmpge_ps(x3, t))) << 12;
            mask |= static_cast<uint64_t>(bits) << c;
        }
        while (mask != 0) {
            const int32_t e = e0 + static_cast<int32_t>(__builtin_ctzll(mask));
            mask &= mask - 1;
            vals[m] = row[e];
            idx[m++] = e;
        }
    }
    bool nan = _mm_movemask_ps(unordered) != 0;
    for (int32_t e = e0; e < n; ++e) {
        nan |= std::isnan(row[e]);
        vals[m] = row[e];
        idx[m] = e;
        m += row[e] >= threshold;
    }
    return nan ? -1 : m;
}

/* Each candidate's place in the order, as the number of candidates with a higher value
 * (vals padded with -inf to a multiple of 8, NaN-free); those placed below the width are
 * written to out (width + 1 entries: the last takes the rest). False where two values tie
 * (the places then collide: the caller sorts instead), found by the places' sum. */
static bool place_by_count(float * vals, const int32_t * idx, int32_t m, uint16_t * out) {
    constexpr int32_t width = MOECACHE_RANK_WIDTH;
    const int32_t padded = (m + 7) & ~7;
    for (int32_t j = m; j < padded; ++j) {
        vals[j] = -std::numeric_limits<float>::infinity();
    }
    int64_t total = 0;
    for (int32_t i = 0; i < m; i += 2) {
        const __m128 x = _mm_set1_ps(vals[i]), y = _mm_set1_ps(vals[i + 1]);
        __m128i a0 = _mm_setzero_si128(), a1 = a0, b0 = a0, b1 = a0;
        for (int32_t j = 0; j < padded; j += 8) {
            const __m128 p = _mm_loadu_ps(vals + j), q = _mm_loadu_ps(vals + j + 4);
            a0 = _mm_sub_epi32(a0, _mm_castps_si128(_mm_cmpgt_ps(p, x)));
            a1 = _mm_sub_epi32(a1, _mm_castps_si128(_mm_cmpgt_ps(q, x)));
            b0 = _mm_sub_epi32(b0, _mm_castps_si128(_mm_cmpgt_ps(p, y)));
            b1 = _mm_sub_epi32(b1, _mm_castps_si128(_mm_cmpgt_ps(q, y)));
        }
        __m128i lo = _mm_unpacklo_epi32(_mm_add_epi32(a0, a1), _mm_add_epi32(b0, b1));
        lo = _mm_add_epi32(lo, _mm_unpackhi_epi32(_mm_add_epi32(a0, a1), _mm_add_epi32(b0, b1)));
        lo = _mm_add_epi32(lo, _mm_shuffle_epi32(lo, _MM_SHUFFLE(1, 0, 3, 2)));
        const int32_t px = _mm_cvtsi128_si32(lo);
        const int32_t py = _mm_cvtsi128_si32(_mm_shuffle_epi32(lo, _MM_SHUFFLE(1, 1, 1, 1)));
        total += px;
        out[std::min(px, width)] = static_cast<uint16_t>(idx[i]);
        if (i + 1 < m) {
            total += py;
            out[std::min(py, width)] = static_cast<uint16_t>(idx[i + 1]);
        }
    }
    return total == static_cast<int64_t>(m) * (m - 1) / 2;
}

}  // namespace rank_sse2
#endif

namespace moecache_core {

/* One row of moecache_rank_rows, the reference's result (the selfcheck compares them) in a
 * third to a half of its time: where SSE2 is there (every x86-64; elsewhere the reference
 * itself), the sampled threshold by a branch-free selection instead of nth_element, the
 * candidates from bit masks, and up to 128 of them placed by counting instead of sorted
 * (ties and more candidates sort, as the reference does). */
int32_t rank_row(const float * row, int32_t n, RankScratch & s, uint16_t * out) {
#if MOECACHE_RANK_SSE2
    using namespace rank_sse2;
    constexpr int32_t width = MOECACHE_RANK_WIDTH;
    static_assert(width == 64, "sample_threshold takes 64 samples of a row wider than this");
    const float threshold =
        n > width ? sample_threshold(row, n) : -std::numeric_limits<float>::infinity();
    float * vals = s.vals.data();
    int32_t * idx = s.idx.data();
    int32_t m = candidates(row, n, threshold, vals, idx);
    if (m < 0) {
        return 0;
    }
    if (m <= 2 * width) {
        uint16_t placed[width + 1];
        if (place_by_count(vals, idx, m, placed)) {
            m = std::min(m, width);
            std::memcpy(out, placed, static_cast<size_t>(m) * sizeof(uint16_t));
            return m;
        }
    }
    uint64_t * keys = s.keys.data();
    for (int32_t j = 0; j < m; ++j) {
        keys[j] = rank_key(vals[j], idx[j]);
    }
    return ranked_ids(keys, m, out);
#else
    return rank_row_reference(row, n, s, out);
#endif
}

/* The trace's ranking, or one made for this call or plan (none where it cannot be: then
 * scans). Named, not in the anonymous namespace: a kept plan holds one. */
struct BatchRanking {
    std::vector<uint16_t> own_ranks;
    std::vector<uint8_t> own_counts;
    std::vector<float> own_selected;
    const uint16_t * ranks = nullptr;
    const uint8_t * counts = nullptr;
    const float * selected = nullptr;
};

}  // namespace moecache_core

namespace {

using Ranking = moecache_core::BatchRanking;

/* One configuration, start to end. Returns MOECACHE_OK or the first error. */
int32_t replay_one(const moecache_replay_trace & t, const moecache_replay_config & cfg,
                   const Ranking & ranking, const moecache_replay_trace & with_ranking,
                   const moecache_core::FastPlan * fast_plan, bool ids_valid,
                   moecache_replay_token * out, moecache_event * events,
                   moecache_core::FastWorkspace & workspace, moecache_core::ReplayTicker & ticker) {
    if (fast_plan != nullptr &&
        moecache_core::fast_covers(with_ranking, cfg, ids_valid, events != nullptr)) {
        return moecache_core::replay_fast(with_ranking, *fast_plan, cfg, out, workspace,
                                          &ticker);
    }
    const bool follow_slots = cfg.slots == 0;
    const moecache_policy & start = cfg.follow_policy ? t.start_policy : cfg.policy;
    const int32_t slots = follow_slots ? t.start_slots : cfg.slots;
    int64_t max_rows = 1;
    for (int64_t i = 0; i < t.n_tokens; ++i) {
        int64_t rows = 0;
        for (int64_t k = t.token_calls[i]; k < t.token_calls[i + 1]; ++k) {
            rows += t.call_stop[k] - t.call_start[k];
        }
        max_rows = std::max(max_rows, rows);
    }
    int64_t max_call = 1;
    for (int64_t k = 0; k < t.n_calls; ++k) {
        max_call = std::max(max_call, t.call_stop[k] - t.call_start[k]);
    }
    std::unique_ptr<moecache, void (*)(moecache *)> owner(
        moecache_core::create(
            t.n_layers, t.n_experts, t.top_k, slots, &start,
            events != nullptr ? static_cast<int32_t>(std::min<int64_t>(max_rows, 1 << 30)) : 0),
        moecache_destroy);
    if (!owner) {
        return MOECACHE_E_ARG;
    }
    moecache & c = *owner;
    /* a fixed LRU policy never reads the decayed counts (only a policy change could) */
    c.track_frequency = cfg.follow_policy || start.eviction == MOECACHE_EVICT_FREQUENCY;
    for (int32_t l = 0; l < t.n_layers; ++l) {
        moecache_set_expert_bytes(&c, l, t.expert_bytes[l]);
    }
    const size_t sel = static_cast<size_t>(max_call) * static_cast<size_t>(t.top_k);
    std::vector<float> weights(sel);
    std::vector<int32_t> out_ids(sel), out_slots(sel);
    std::vector<moecache_copy> plan(std::max<size_t>(sel, 1));
    std::vector<moecache_copy> pplan(static_cast<size_t>(t.n_experts));
    std::vector<float> scores(static_cast<size_t>(t.n_experts));
    const float none = -std::numeric_limits<float>::infinity();

    for (int64_t s = 0; s < t.initial_step; ++s) {
        moecache_begin_step(&c);
    }
    int64_t step = c.step;
    int64_t change = 0;
    int64_t drained = 0;
    Totals before = sum_stats(c);
    for (int64_t tok = 0; tok < t.n_tokens; ++tok) {
        for (; change < t.n_changes && t.change_token[change] == tok; ++change) {
            const int32_t to = t.change_slots[change];
            if (to == 0 && cfg.follow_policy) {
                moecache_set_policy(&c, &t.change_policy[change]);
            } else if (to > 0 && follow_slots && to != c.slots) {
                if (moecache_set_slots(&c, to) != MOECACHE_OK) {
                    return MOECACHE_E_ARG;
                }
            }
        }
        int64_t prefetched = 0;
        for (int64_t k = t.token_calls[tok]; k < t.token_calls[tok + 1]; ++k) {
            for (; step < t.call_step[k]; ++step) {
                moecache_begin_step(&c);
            }
            const int64_t r0 = t.call_start[k];
            const int32_t n = static_cast<int32_t>(t.call_stop[k] - r0);
            if (n == 0) {
                continue;
            }
            const size_t kk = static_cast<size_t>(n) * static_cast<size_t>(t.top_k);
            std::memcpy(weights.data(), t.weights + r0 * t.top_k, kk * sizeof(float));
            int32_t n_plan = 0;
            if (ranking.ranks != nullptr) {
                c.scratch.sub_rank = ranking.ranks + r0 * MOECACHE_RANK_WIDTH;
                c.scratch.sub_rank_count = ranking.counts + r0;
                c.scratch.sel_probs = ranking.selected + r0 * t.top_k;
            }
            int32_t code = moecache_core::route(
                c, t.call_layer[k], n, t.probs + r0 * t.n_experts, t.ids + r0 * t.top_k,
                weights.data(), out_ids.data(), out_slots.data(), plan.data(),
                static_cast<int32_t>(plan.size()), &n_plan);
            if (code != MOECACHE_OK) {
                return code;
            }
            const int64_t last = r0 + n - 1;
            /* a policy that does not prefetch leaves the prediction unread (prefetch would
             * do nothing with it) */
            if (t.pred_width > 0 && moecache_core::prefetch_per_token(c) > 0 &&
                t.next_layer[last] >= 0) {
                const int32_t * ranked = t.predicted + last * t.pred_width;
                int32_t count = 0;
                while (count < t.pred_width && ranked[count] >= 0) {
                    ++count;
                }
                if (!moecache_core::prefetch_ranked(c, t.next_layer[last], ranked, count,
                                                    pplan.data(),
                                                    static_cast<int32_t>(pplan.size()),
                                                    &n_plan)) {
                    /* a ranking that repeats an expert: score it as the engine's caller
                     * would (a later repeat lowers the score) */
                    std::fill(scores.begin(), scores.end(), none);
                    for (int32_t j = 0; j < count; ++j) {
                        scores[static_cast<size_t>(ranked[j])] = static_cast<float>(count - j);
                    }
                    code = moecache_core::prefetch(c, t.next_layer[last], 1, scores.data(),
                                                   pplan.data(),
                                                   static_cast<int32_t>(pplan.size()), &n_plan);
                    if (code != MOECACHE_OK) {
                        return code;
                    }
                }
                prefetched += n_plan;
            }
        }
        const Totals now = sum_stats(c);
        moecache_replay_token & o = out[tok];
        o.rows = now.rows - before.rows;
        o.selections = now.selections - before.selections;
        o.hits = now.hits - before.hits;
        o.fetches = now.fetches - before.fetches;
        o.substitutions = now.substitutions - before.substitutions;
        o.admissions = now.admissions - before.admissions;
        o.substituted_mass = now.mass - before.mass;
        o.bytes_sync = now.bytes_sync - before.bytes_sync;
        o.bytes_async = now.bytes_async - before.bytes_async;
        o.n_sync = o.fetches;
        o.n_async = o.admissions + prefetched;
        o.prefetches = now.prefetches - before.prefetches;
        o.prefetch_hits = now.prefetch_hits - before.prefetch_hits;
        before = now;
        if (events != nullptr) {
            drained += moecache_drain_events(&c, events + drained,
                                             static_cast<int32_t>(std::min<int64_t>(
                                                 t.n_rows - drained, 1 << 30)));
        }
        /* a token's share of the layers, so that a slow configuration moves the bar too */
        if (!ticker.layer_done((tok + 1) * t.n_layers / t.n_tokens - ticker.units)) {
            return MOECACHE_E_CANCELLED;
        }
    }
    return MOECACHE_OK;
}

bool configs_valid(const moecache_replay_trace & t, const moecache_replay_config * configs,
                   int32_t n_configs) {
    for (int32_t i = 0; i < n_configs; ++i) {
        const moecache_replay_config & cfg = configs[i];
        const bool slots_ok = cfg.slots == 0 || (cfg.slots >= t.top_k && cfg.slots <= t.n_experts);
        if (!slots_ok || (!cfg.follow_policy && !moecache_core::policy_valid(cfg.policy))) {
            return false;
        }
    }
    return true;
}

/* A batch that will run: `out` cleared and the control's counts started again. */
moecache_core::ReplayTicker start_batch(const moecache_replay_trace & t, int32_t n_configs,
                                        moecache_replay_token * out,
                                        moecache_replay_control * ctl) {
    std::memset(out, 0, sizeof(moecache_replay_token) * static_cast<size_t>(t.n_tokens) *
                            static_cast<size_t>(n_configs));
    if (ctl != nullptr) {
        ctl->configs_done.store(0);
        ctl->units_done.store(0);
        ctl->units_total.store(static_cast<int64_t>(n_configs) * t.n_layers);
    }
    return moecache_core::ReplayTicker{ctl};
}

/* The rows ranked for this call or plan (left unranked where they cannot be: then scans). */
void rank_own(const moecache_replay_trace & t, int32_t n_threads, Ranking & ranking) {
    if (t.n_rows <= 0 || t.n_experts >= 0xFFFF) {
        return;
    }
    try {
        const size_t rows = static_cast<size_t>(t.n_rows);
        ranking.own_ranks.resize(rows * MOECACHE_RANK_WIDTH);
        ranking.own_counts.resize(rows);
        ranking.own_selected.resize(rows * static_cast<size_t>(t.top_k));
        if (moecache_rank_rows(t.probs, t.ids, t.n_rows, t.n_experts, t.top_k, n_threads,
                               ranking.own_ranks.data(), ranking.own_counts.data(),
                               ranking.own_selected.data()) == MOECACHE_OK) {
            ranking.ranks = ranking.own_ranks.data();
            ranking.counts = ranking.own_counts.data();
            ranking.selected = ranking.own_selected.data();
        }
    } catch (...) {  // bad_alloc: the configurations scan instead
        ranking = Ranking();
    }
}

moecache_replay_trace with_ranking(const moecache_replay_trace & t, const Ranking & ranking) {
    moecache_replay_trace ranked = t;
    ranked.ranks = ranking.ranks;
    ranked.rank_counts = ranking.counts;
    ranked.selected_probs = ranking.selected;
    return ranked;
}

/* Every configuration of a validated batch, on `workers` threads, with the trace's ranking,
 * whether its ids are valid, and the replay loop's plan (NULL: the per-call core only). */
int32_t run_batch(const moecache_replay_trace & trace, const moecache_replay_config * configs,
                  int32_t n_configs, int32_t workers, moecache_replay_token * out,
                  moecache_event * events, moecache_replay_control * ctl,
                  const Ranking & ranking, bool ids_valid, const moecache_core::FastPlan * plan) {
    const moecache_core::ReplayTicker watch{ctl};
    const size_t n_tokens = static_cast<size_t>(trace.n_tokens);
    const moecache_replay_trace ranked = with_ranking(trace, ranking);
    /* the likely longest first, so that the threads finish together: fewer slots, then
     * frequency eviction, prefetching and substitution (each result keeps its place) */
    std::vector<int32_t> order(static_cast<size_t>(n_configs));
    std::vector<double> cost(order.size());
    for (int32_t i = 0; i < n_configs; ++i) {
        const moecache_replay_config & cfg = configs[i];
        const moecache_policy & p = cfg.follow_policy ? trace.start_policy : cfg.policy;
        const int32_t slots = cfg.slots != 0 ? cfg.slots : trace.start_slots;
        cost[static_cast<size_t>(i)] =
            (p.miss_rule != MOECACHE_FETCH_ALL ? 2.0 : 1.0) *
            (p.eviction == MOECACHE_EVICT_FREQUENCY ? 1.5 : 1.0) *
            (p.prefetch != 0 && trace.pred_width > 0 ? 1.5 : 1.0) *
            (p.miss_rule == MOECACHE_ROUTING_BONUS ? 1.3 : 1.0) /
            std::sqrt(static_cast<double>(std::max(slots, 1)));
        order[static_cast<size_t>(i)] = i;
    }
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return cost[static_cast<size_t>(a)] > cost[static_cast<size_t>(b)];
    });
    if (watch.cancelled()) {
        return MOECACHE_E_CANCELLED;
    }
    /* Results one run gives several configurations: the loop's run of a policy that never
     * wanted a slot with every slot full is its run at any larger budget prefetching as many
     * experts (nothing it decided read the budget), and a configuration equal to another is
     * that one's. from[i]: the configuration whose results i takes if it has finished by then
     * (the nearest smaller budget of the same policy, or an equal one listed before). A run
     * taken is copied, so the results never depend on which ran. */
    std::vector<uint8_t> covered(order.size(), 0);
    for (int32_t i = 0; i < n_configs; ++i) {
        covered[static_cast<size_t>(i)] =
            plan != nullptr && moecache_core::fast_covers(ranked, configs[i], ids_valid,
                                                          events != nullptr);
    }
    auto policy_of = [&](int32_t i) -> const moecache_policy & {
        return configs[i].follow_policy ? trace.start_policy : configs[i].policy;
    };
    auto slots_of = [&](int32_t i) {
        return configs[i].slots != 0 ? configs[i].slots : trace.start_slots;
    };
    /* the covered configurations by (policy bytes, budget, place in the list): each one's
     * predecessor there, if of the same policy and prefetching as many experts, is the one
     * it may take (one sort, not a comparison of every pair of a long list) */
    std::vector<int32_t> by_policy;
    for (int32_t i = 0; i < n_configs; ++i) {
        if (covered[static_cast<size_t>(i)]) {
            by_policy.push_back(i);
        }
    }
    std::sort(by_policy.begin(), by_policy.end(), [&](int32_t a, int32_t b) {
        const int c = std::memcmp(&policy_of(a), &policy_of(b), sizeof(moecache_policy));
        return c != 0 ? c < 0 : slots_of(a) != slots_of(b) ? slots_of(a) < slots_of(b) : a < b;
    });
    std::vector<int32_t> from(order.size(), -1);
    for (size_t x = 1; x < by_policy.size(); ++x) {
        const int32_t i = by_policy[x], j = by_policy[x - 1];
        if (std::memcmp(&policy_of(i), &policy_of(j), sizeof(moecache_policy)) == 0 &&
            moecache_core::prefetch_per_token(ranked, policy_of(j), slots_of(j)) ==
                moecache_core::prefetch_per_token(ranked, policy_of(i), slots_of(i))) {
            from[static_cast<size_t>(i)] = j;
        }
    }
    /* per configuration: 0 not finished, 1 finished without wanting a slot beyond its budget,
     * 2 finished otherwise (or by the per-call core) */
    std::unique_ptr<std::atomic<int32_t>[]> state(new std::atomic<int32_t>[order.size()]);
    for (size_t i = 0; i < order.size(); ++i) {
        state[i].store(0, std::memory_order_relaxed);
    }
    std::atomic<int32_t> next{0};
    std::atomic<int32_t> finished{0};
    std::vector<int32_t> codes(static_cast<size_t>(std::max(n_configs, 1)), MOECACHE_OK);
    auto work = [&]() {
        std::unique_ptr<moecache_core::FastWorkspace, void (*)(moecache_core::FastWorkspace *)>
            workspace(nullptr, moecache_core::fast_workspace_free);
        for (int32_t at = next++; at < n_configs && !watch.cancelled(); at = next++) {
            const int32_t i = order[static_cast<size_t>(at)];
            moecache_replay_token * mine = out + static_cast<size_t>(i) * n_tokens;
            moecache_core::ReplayTicker ticker{ctl};
            const int32_t b = from[static_cast<size_t>(i)];
            const int32_t b_state = b >= 0 ? state[b].load(std::memory_order_acquire) : 0;
            if (b_state == 1 || (b_state == 2 && slots_of(b) == slots_of(i))) {
                std::memcpy(mine, out + static_cast<size_t>(b) * n_tokens,
                            n_tokens * sizeof(moecache_replay_token));
                codes[static_cast<size_t>(i)] = codes[static_cast<size_t>(b)];
                moecache_core::replay_reused_configs.fetch_add(1, std::memory_order_relaxed);
                state[i].store(b_state, std::memory_order_release);
            } else {
                bool evicted = true;
                try {
                    if (!workspace) {
                        workspace.reset(moecache_core::fast_workspace_new());
                    }
                    if (covered[static_cast<size_t>(i)]) {
                        codes[static_cast<size_t>(i)] = moecache_core::replay_fast(
                            ranked, *plan, configs[i], mine, *workspace, &ticker, &evicted);
                    } else {
                        codes[static_cast<size_t>(i)] = replay_one(
                            trace, configs[i], ranking, ranked, plan, ids_valid, mine,
                            events != nullptr ? events + static_cast<int64_t>(i) * trace.n_rows
                                              : nullptr,
                            *workspace, ticker);
                    }
                } catch (...) {  // bad_alloc: this configuration fails, the others go on
                    codes[static_cast<size_t>(i)] = MOECACHE_E_ARG;
                }
                if (codes[static_cast<size_t>(i)] == MOECACHE_E_CANCELLED) {
                    break;
                }
                state[i].store(evicted || codes[static_cast<size_t>(i)] != MOECACHE_OK ? 2 : 1,
                               std::memory_order_release);
            }
            /* a configuration that failed early (or was copied) still counts whole */
            ticker.layer_done(trace.n_layers - ticker.units);
            ++finished;
            if (ctl != nullptr) {
                ctl->configs_done.fetch_add(1, std::memory_order_relaxed);
            }
        }
    };
    run_workers(workers, work);
    if (finished.load() < n_configs) {  // only a cancel leaves a configuration undone
        return MOECACHE_E_CANCELLED;
    }
    for (const int32_t code : codes) {
        if (code != MOECACHE_OK) {
            return code;
        }
    }
    return MOECACHE_OK;
}

}  // namespace

/* A trace's kept plan (moecache_replay_plan_new): the trace as it was planned (dimensions
 * and array addresses, to recognise it), its ranking, whether its ids are valid, and the
 * replay loop's packed rows (NULL where the loop can take no configuration). */
struct moecache_replay_plan {
    moecache_replay_trace key{};
    moecache_core::BatchRanking ranking;
    bool ids_valid = false;
    std::unique_ptr<moecache_core::FastPlan, void (*)(moecache_core::FastPlan *)> fast{
        nullptr, moecache_core::fast_plan_free};
};

namespace {

/* Whether `plan` was made for `t`: the same dimensions, initial step and row and call
 * arrays (the ranking's included); constant time. */
bool plan_matches(const moecache_replay_plan & plan, const moecache_replay_trace & t) {
    const moecache_replay_trace & k = plan.key;
    return k.n_layers == t.n_layers && k.n_experts == t.n_experts && k.top_k == t.top_k &&
           k.pred_width == t.pred_width && k.initial_step == t.initial_step &&
           k.n_rows == t.n_rows && k.n_calls == t.n_calls && k.n_tokens == t.n_tokens &&
           k.probs == t.probs && k.ids == t.ids && k.weights == t.weights &&
           k.next_layer == t.next_layer && k.predicted == t.predicted &&
           k.call_step == t.call_step && k.call_layer == t.call_layer &&
           k.call_start == t.call_start && k.call_stop == t.call_stop &&
           k.token_calls == t.token_calls && k.ranks == t.ranks &&
           k.rank_counts == t.rank_counts && k.selected_probs == t.selected_probs;
}

}  // namespace

extern "C" {

int32_t moecache_rank_rows(const float * probs, const int32_t * ids, int64_t n_rows,
                           int32_t n_experts, int32_t top_k, int32_t n_threads, uint16_t * ranks,
                           uint8_t * rank_counts, float * selected_probs) {
    if (n_rows < 0 || n_experts < 1 || n_experts >= 0xFFFF || top_k < 1 ||
        top_k > MOECACHE_MAX_K ||
        (n_rows > 0 && (probs == nullptr || ids == nullptr || ranks == nullptr ||
                        rank_counts == nullptr || selected_probs == nullptr))) {
        return MOECACHE_E_ARG;
    }
    constexpr int64_t kChunk = 1024;
    std::atomic<int64_t> next{0};
    std::atomic<bool> failed{false};
    auto work = [&]() {
        try {
            moecache_core::RankScratch scratch(n_experts);
            for (int64_t r0 = next.fetch_add(kChunk); r0 < n_rows; r0 = next.fetch_add(kChunk)) {
                for (int64_t r = r0; r < std::min(n_rows, r0 + kChunk); ++r) {
                    /* the row after next on its way while this one is ranked: the pass is
                     * bound by reading the rows */
#if defined(__GNUC__)
                    if (r + 2 < n_rows) {
                        const float * ahead = probs + (r + 2) * n_experts;
                        for (int32_t e = 0; e < n_experts; e += 16) {
                            __builtin_prefetch(ahead + e);
                        }
                    }
#endif
                    for (int64_t i = r * top_k; i < (r + 1) * top_k; ++i) {
                        const bool ok = ids[i] >= 0 && ids[i] < n_experts;
                        selected_probs[i] = ok ? probs[r * n_experts + ids[i]] : 0.0f;
                    }
                    rank_counts[r] = static_cast<uint8_t>(moecache_core::rank_row(
                        probs + r * n_experts, n_experts, scratch,
                        ranks + r * MOECACHE_RANK_WIDTH));
                }
            }
        } catch (...) {
            failed = true;
        }
    };
    run_workers(worker_count(n_threads, (n_rows + kChunk - 1) / kChunk), work);
    if (failed) {  // bad_alloc: no row is ranked, so every configuration scans
        std::fill(rank_counts, rank_counts + n_rows, static_cast<uint8_t>(0));
    }
    return MOECACHE_OK;
}

moecache_replay_control * moecache_replay_control_new(void) {
    return new (std::nothrow) moecache_replay_control();
}

void moecache_replay_control_free(moecache_replay_control * ctl) {
    delete ctl;
}

void moecache_replay_cancel(moecache_replay_control * ctl) {
    if (ctl != nullptr) {
        ctl->cancel.store(1, std::memory_order_relaxed);
    }
}

void moecache_replay_progress(const moecache_replay_control * ctl, int64_t * configs_done,
                              int64_t * units_done, int64_t * units_total) {
    const bool on = ctl != nullptr;
    if (configs_done != nullptr) {
        *configs_done = on ? ctl->configs_done.load(std::memory_order_relaxed) : 0;
    }
    if (units_done != nullptr) {
        *units_done = on ? ctl->units_done.load(std::memory_order_relaxed) : 0;
    }
    if (units_total != nullptr) {
        *units_total = on ? ctl->units_total.load(std::memory_order_relaxed) : 0;
    }
}

int32_t moecache_replay_batch(const moecache_replay_trace * trace,
                              const moecache_replay_config * configs, int32_t n_configs,
                              int32_t n_threads, moecache_replay_token * out,
                              moecache_event * events) {
    return moecache_replay_batch_ctl(trace, configs, n_configs, n_threads, out, events,
                                     nullptr);
}

int32_t moecache_replay_batch_ctl(const moecache_replay_trace * trace,
                                  const moecache_replay_config * configs, int32_t n_configs,
                                  int32_t n_threads, moecache_replay_token * out,
                                  moecache_event * events, moecache_replay_control * ctl) {
    if (trace == nullptr || configs == nullptr || out == nullptr || n_configs < 0 ||
        !trace_valid(*trace) || !configs_valid(*trace, configs, n_configs)) {
        return MOECACHE_E_ARG;
    }
    const moecache_core::ReplayTicker watch = start_batch(*trace, n_configs, out, ctl);
    if (watch.cancelled()) {
        return MOECACHE_E_CANCELLED;
    }
    const int32_t workers = worker_count(n_threads, n_configs);
    Ranking ranking;
    if (trace->ranks != nullptr && trace->rank_counts != nullptr &&
        trace->selected_probs != nullptr) {
        ranking.ranks = trace->ranks;
        ranking.counts = trace->rank_counts;
        ranking.selected = trace->selected_probs;
    } else if (may_substitute(*trace, configs, n_configs)) {
        rank_own(*trace, n_threads, ranking);
    }
    if (watch.cancelled()) {
        return MOECACHE_E_CANCELLED;
    }
    /* the trace with its ranking, and the replay loop's plan where a configuration takes it */
    const moecache_replay_trace ranked = with_ranking(*trace, ranking);
    const bool ids_valid = events == nullptr && rows_valid(*trace);
    std::unique_ptr<moecache_core::FastPlan, void (*)(moecache_core::FastPlan *)> plan(
        nullptr, moecache_core::fast_plan_free);
    for (int32_t i = 0; i < n_configs && !plan; ++i) {
        if (moecache_core::fast_covers(ranked, configs[i], ids_valid, events != nullptr)) {
            try {
                plan.reset(moecache_core::fast_plan_new(ranked, configs, n_configs, ids_valid,
                                                        workers));
            } catch (...) {  // bad_alloc: the per-call core replays every configuration
                break;
            }
        }
    }
    return run_batch(*trace, configs, n_configs, workers, out, events, ctl, ranking, ids_valid,
                     plan.get());
}

moecache_replay_plan * moecache_replay_plan_new(const moecache_replay_trace * trace,
                                                int32_t n_threads) {
    if (trace == nullptr || !trace_valid(*trace)) {
        return nullptr;
    }
    try {
        std::unique_ptr<moecache_replay_plan> plan(new moecache_replay_plan());
        plan->key = *trace;
        if (trace->ranks != nullptr && trace->rank_counts != nullptr &&
            trace->selected_probs != nullptr) {
            plan->ranking.ranks = trace->ranks;
            plan->ranking.counts = trace->rank_counts;
            plan->ranking.selected = trace->selected_probs;
        } else {
            rank_own(*trace, n_threads, plan->ranking);
        }
        plan->ids_valid = rows_valid(*trace);
        const moecache_replay_trace ranked = with_ranking(*trace, plan->ranking);
        /* whatever any configuration the loop covers could read (fast_covers' cheapest
         * conditions: a trace failing them is never replayed by the loop) */
        const bool ranked_rows = plan->ranking.ranks != nullptr;
        const double min_ticks = 2.0 * static_cast<double>(trace->n_rows) * trace->top_k;
        if (plan->ids_valid && trace->n_experts <= std::numeric_limits<int16_t>::max() &&
            min_ticks < static_cast<double>(std::numeric_limits<int32_t>::max())) {
            /* frequency keys for the presets' half-life (another one computes its own) */
            plan->fast.reset(moecache_core::fast_plan_pack(
                ranked, ranked_rows, ranked_rows, trace->pred_width > 0,
                MOECACHE_DEFAULT_HALF_LIFE, worker_count(n_threads, trace->n_layers)));
        }
        return plan.release();
    } catch (...) {  // bad_alloc
        return nullptr;
    }
}

void moecache_replay_plan_free(moecache_replay_plan * plan) {
    delete plan;
}

int64_t moecache_replay_plan_bytes(const moecache_replay_plan * plan) {
    if (plan == nullptr) {
        return 0;
    }
    const Ranking & r = plan->ranking;
    return static_cast<int64_t>(sizeof(moecache_replay_plan) + r.own_ranks.capacity() *
                                sizeof(uint16_t) + r.own_counts.capacity() +
                                r.own_selected.capacity() * sizeof(float)) +
           (plan->fast ? moecache_core::fast_plan_bytes(*plan->fast) : 0);
}

int32_t moecache_replay_batch_plan(const moecache_replay_trace * trace,
                                   const moecache_replay_plan * plan,
                                   const moecache_replay_config * configs, int32_t n_configs,
                                   int32_t n_threads, moecache_replay_token * out,
                                   moecache_event * events, moecache_replay_control * ctl) {
    if (trace == nullptr || plan == nullptr || configs == nullptr || out == nullptr ||
        n_configs < 0 || !plan_matches(*plan, *trace) || !shape_valid(*trace) ||
        !configs_valid(*trace, configs, n_configs)) {
        return MOECACHE_E_ARG;
    }
    const moecache_core::ReplayTicker watch = start_batch(*trace, n_configs, out, ctl);
    if (watch.cancelled()) {
        return MOECACHE_E_CANCELLED;
    }
    const bool ids_valid = events == nullptr && plan->ids_valid;
    return run_batch(*trace, configs, n_configs, worker_count(n_threads, n_configs), out,
                     events, ctl, plan->ranking, ids_valid, plan->fast.get());
}

}  // extern "C"
