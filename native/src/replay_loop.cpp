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
 * route.cpp and prefetch.cpp decide, in the same order:
 *   - victims: LRU from a queue of (expert, recency) in use order, stale entries skipped;
 *     frequency from a heap of (key, recency, id) whose entries are lower bounds of the
 *     residents' current keys (a use or a selection only raises a key), refreshed when one
 *     reaches the top; pinned experts are set aside for the call;
 *   - the frequency key log2(f) + step / h is computed only when the heap needs it, from
 *     the same doubles record_selection keeps;
 *   - substitutes from the trace's shared ranking, as pick_substitutes.
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
#include <vector>

namespace moecache_core {

std::atomic<int64_t> replay_fast_configs{0};

namespace {

constexpr double kNeverSelected = -1e300;

/* One (layer, expert): what every selection reads, 8 bytes (a layer's 512 in 4 kB, so
 * that 48 layers stay in cache; the clock and the steps are bounded in fast_covers). */
struct Expert {
    int32_t last_use;  /* the clock of its last use, 0 never */
    int16_t slot;      /* -1: not resident */
    int8_t prefetched; /* brought in by PSR and not used since */
    int8_t unused;
};

/* Frequency eviction's count of one (layer, expert). */
struct Fq {
    double freq;   /* decayed selection count as of step */
    int32_t step;
    uint32_t ver;  /* changes with its key or recency (an older heap entry is stale) */
};

struct HeapEntry {
    double key;
    int32_t last_use;
    int32_t e;
    uint32_t ver;
};

inline bool heap_before(const HeapEntry & a, const HeapEntry & b) {
    if (a.key != b.key) {
        return a.key < b.key;
    }
    if (a.last_use != b.last_use) {
        return a.last_use < b.last_use;
    }
    return a.e < b.e;
}

struct LruEntry {
    int32_t last_use; /* -1: taken */
    int32_t e;
};

/* A row's first `want` substitutes, as pick_substitutes (rules.cpp) picks them. */
struct Substitutes {
    const Expert * X;
    const int32_t * expert_of; /* the layer's slots */
    int32_t slots;
    int32_t n_experts;
    int64_t * mark;

    /* pick_substitute: the reference scan in slot order (a NaN row) */
    int32_t one(const float * row, int64_t token) const {
        int32_t best = -1;
        float best_p = 0.0f;
        for (int32_t s = 0; s < slots; ++s) {
            const int32_t e = expert_of[s];
            if (e < 0 || mark[e] == token) {
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

    int32_t pick(const float * row, int64_t token, int32_t want, int32_t * out,
                 const uint16_t * rank_row, int32_t rank_count) const {
        if (want <= 0) {
            return 0;
        }
        int32_t n = 0;
        if (rank_count > 0) {
            for (int32_t j = 0; j < rank_count && n < want; ++j) {
                const int32_t e = rank_row[j];
                if (X[e].slot >= 0 && mark[e] != token) {
                    mark[e] = token;
                    out[n++] = e;
                }
            }
            if (n == want || rank_count >= n_experts) {
                return n;
            }
            return n + best_of_rest(row, token, want - n, out + n);
        }
        float best_p[MOECACHE_MAX_K];
        bool nan = false;
        for (int32_t s = 0; s < slots; ++s) {
            const int32_t e = expert_of[s];
            if (e < 0) {
                continue;
            }
            const float p = row[e];
            if (p != p) {
                nan = true;
                continue;
            }
            if (n == want && (p < best_p[want - 1] || (p == best_p[want - 1] && e > out[want - 1]))) {
                continue;
            }
            if (mark[e] == token) {
                continue;
            }
            int32_t at = n == want ? want - 1 : n++;
            while (at > 0 && (p > best_p[at - 1] || (p == best_p[at - 1] && e < out[at - 1]))) {
                best_p[at] = best_p[at - 1];
                out[at] = out[at - 1];
                --at;
            }
            best_p[at] = p;
            out[at] = e;
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

    /* The best `need` unmarked residents of a row without NaN (any order of meeting them). */
    int32_t best_of_rest(const float * row, int64_t token, int32_t need, int32_t * rest) const {
        float best_p[MOECACHE_MAX_K];
        int32_t m = 0;
        for (int32_t s = 0; s < slots; ++s) {
            const int32_t e = expert_of[s];
            if (e < 0) {
                continue;
            }
            const float p = row[e];
            if (m == need && (p < best_p[need - 1] || (p == best_p[need - 1] && e > rest[need - 1]))) {
                continue;
            }
            if (mark[e] == token) {
                continue;
            }
            int32_t at = m == need ? need - 1 : m++;
            while (at > 0 && (p > best_p[at - 1] || (p == best_p[at - 1] && e < rest[at - 1]))) {
                best_p[at] = best_p[at - 1];
                rest[at] = rest[at - 1];
                --at;
            }
            best_p[at] = p;
            rest[at] = e;
        }
        for (int32_t i = 0; i < m; ++i) {
            mark[rest[i]] = token;
        }
        return m;
    }
};

}  // namespace

/* The loop's buffers, kept by a worker thread from one configuration to the next (a fresh
 * megabyte per configuration cost more in page faults than the loop itself). */
struct FastWorkspace {
    std::vector<Expert> ex;
    std::vector<Fq> fq;
    std::vector<float> lost;
    std::vector<int32_t> expert_of, n_res, heap_n;
    std::vector<double> mass, decay;
    std::vector<int64_t> pin, mark, q_head, q_tail;
    std::vector<LruEntry> q;
    std::vector<HeapEntry> heap, stash;
};

FastWorkspace * fast_workspace_new() {
    return new FastWorkspace();
}

void fast_workspace_free(FastWorkspace * w) {
    delete w;
}

namespace {

class FastReplay {
public:
    FastReplay(const moecache_replay_trace & t, const moecache_policy & p, int32_t slots,
               moecache_replay_token * out, FastWorkspace & w)
        : t_(t), p_(p), S_(slots), E_(t.n_experts), k_(t.top_k), out_(out), w_(w) {
        swap_buffers();
    }
    ~FastReplay() { swap_buffers(); }
    FastReplay(const FastReplay &) = delete;
    FastReplay & operator=(const FastReplay &) = delete;

    int32_t run() {
        switch (p_.miss_rule) {
            case MOECACHE_FETCH_ALL:
                return p_.eviction == MOECACHE_EVICT_FREQUENCY ? go<MOECACHE_FETCH_ALL, true>()
                                                               : go<MOECACHE_FETCH_ALL, false>();
            case MOECACHE_THRESHOLD:
                return p_.eviction == MOECACHE_EVICT_FREQUENCY ? go<MOECACHE_THRESHOLD, true>()
                                                               : go<MOECACHE_THRESHOLD, false>();
            case MOECACHE_FIRST_CHOICE:
                return p_.eviction == MOECACHE_EVICT_FREQUENCY
                           ? go<MOECACHE_FIRST_CHOICE, true>()
                           : go<MOECACHE_FIRST_CHOICE, false>();
            case MOECACHE_SUBSTITUTE_ALL:
                return p_.eviction == MOECACHE_EVICT_FREQUENCY
                           ? go<MOECACHE_SUBSTITUTE_ALL, true>()
                           : go<MOECACHE_SUBSTITUTE_ALL, false>();
            default:
                return p_.eviction == MOECACHE_EVICT_FREQUENCY
                           ? go<MOECACHE_ROUTING_BONUS, true>()
                           : go<MOECACHE_ROUTING_BONUS, false>();
        }
    }

private:
    const moecache_replay_trace & t_;
    const moecache_policy p_;
    const int32_t S_, E_, k_;
    moecache_replay_token * out_;
    FastWorkspace & w_;

    void swap_buffers() {
        ex_.swap(w_.ex);
        fq_.swap(w_.fq);
        lost_.swap(w_.lost);
        expert_of_.swap(w_.expert_of);
        n_res_.swap(w_.n_res);
        heap_n_.swap(w_.heap_n);
        mass_.swap(w_.mass);
        decay_.swap(w_.decay);
        pin_.swap(w_.pin);
        mark_.swap(w_.mark);
        q_head_.swap(w_.q_head);
        q_tail_.swap(w_.q_tail);
        q_.swap(w_.q);
        heap_.swap(w_.heap);
        stash_.swap(w_.stash);
    }

    std::vector<Expert> ex_;          /* [n_layers * E] */
    std::vector<Fq> fq_;              /* [n_layers * E] frequency eviction only */
    std::vector<float> lost_;         /* [n_layers * E] admission only */
    std::vector<int32_t> expert_of_;  /* [n_layers * S] */
    std::vector<int32_t> n_res_;      /* [n_layers] */
    std::vector<double> mass_;        /* [n_layers] the layer's substituted mass so far */
    std::vector<int64_t> pin_, mark_; /* [E] */
    int64_t pin_epoch_ = 0, mark_epoch_ = 0;
    int32_t clock_ = 0;
    int64_t step_ = 0;
    /* LRU: per layer a queue of uses, oldest first */
    std::vector<LruEntry> q_;
    std::vector<int64_t> q_head_, q_tail_;
    int64_t q_cap_ = 0;
    /* frequency */
    std::vector<HeapEntry> heap_;     /* [n_layers * S] */
    std::vector<int32_t> heap_n_;
    std::vector<HeapEntry> stash_;    /* pinned entries set aside for this pin epoch */
    int32_t stash_layer_ = -1;
    int64_t stash_epoch_ = -1;
    std::vector<double> decay_;
    double h_ = 1.0;

    Fq * fq_of(int32_t layer) { return fq_.data() + static_cast<size_t>(layer) * E_; }

    double key_of(const Fq & x) const {
        return x.freq > 0.0 ? std::log2(x.freq) + static_cast<double>(x.step) / h_
                            : kNeverSelected;
    }

    /* record_selection with the memoized decay factors (the same doubles) */
    void record_selection(Fq & x) {
        constexpr int64_t kTable = 4096;
        const int64_t a = step_ - x.step;
        double f;
        if (a < 0 || a >= kTable) {
            const double age = static_cast<double>(a);
            f = x.freq * std::exp2(-age / h_) + 1.0;
        } else {
            f = x.freq * decay_[static_cast<size_t>(a)] + 1.0;
        }
        x.freq = f;
        x.step = static_cast<int32_t>(step_);
        x.ver += 1;
    }

    void heap_push(int32_t layer, const HeapEntry & en) {
        HeapEntry * h = heap_.data() + static_cast<size_t>(layer) * S_;
        int32_t i = heap_n_[layer]++;
        while (i > 0) {
            const int32_t up = (i - 1) / 2;
            if (!heap_before(en, h[up])) {
                break;
            }
            h[i] = h[up];
            i = up;
        }
        h[i] = en;
    }

    void heap_pop(int32_t layer) {
        HeapEntry * h = heap_.data() + static_cast<size_t>(layer) * S_;
        const int32_t n = --heap_n_[layer];
        if (n == 0) {
            return;
        }
        const HeapEntry en = h[n];
        int32_t i = 0;
        for (;;) {
            int32_t c = 2 * i + 1;
            if (c >= n) {
                break;
            }
            if (c + 1 < n && heap_before(h[c + 1], h[c])) {
                ++c;
            }
            if (!heap_before(h[c], en)) {
                break;
            }
            h[i] = h[c];
            i = c;
        }
        h[i] = en;
    }

    HeapEntry entry_of(int32_t layer, const Expert * X, int32_t e) {
        const Fq & f = fq_of(layer)[e];
        return HeapEntry{key_of(f), X[e].last_use, e, f.ver};
    }

    void unstash() {
        if (stash_layer_ >= 0) {
            for (const HeapEntry & en : stash_) {
                heap_push(stash_layer_, en);
            }
            stash_.clear();
            stash_layer_ = -1;
        }
    }

    template <bool Freq>
    int32_t victim(int32_t layer, Expert * X) {
        int32_t v = -1;
        if (!Freq) {
            LruEntry * q = q_.data() + static_cast<size_t>(layer) * q_cap_;
            int64_t & head = q_head_[layer];
            const int64_t tail = q_tail_[layer];
            for (int64_t i = head; i < tail; ++i) {
                const LruEntry en = q[i];
                const bool live = en.last_use >= 0 && X[en.e].slot >= 0 &&
                                  X[en.e].last_use == en.last_use;
                if (!live) {
                    if (i == head) {
                        ++head;
                    }
                    continue;
                }
                if (pin_[en.e] == pin_epoch_) {
                    continue;
                }
                v = en.e;
                if (i == head) {
                    ++head;
                } else {
                    q[i].last_use = -1;
                }
                break;
            }
        } else {
            if (stash_layer_ != layer || stash_epoch_ != pin_epoch_) {
                unstash();
            }
            while (heap_n_[layer] > 0) {
                const HeapEntry top = heap_[static_cast<size_t>(layer) * S_];
                if (top.ver != fq_of(layer)[top.e].ver) {
                    heap_pop(layer);
                    heap_push(layer, entry_of(layer, X, top.e));
                    continue;
                }
                heap_pop(layer);
                if (pin_[top.e] == pin_epoch_) {
                    stash_.push_back(top);
                    stash_layer_ = layer;
                    stash_epoch_ = pin_epoch_;
                    continue;
                }
                v = top.e;
                break;
            }
        }
#ifdef MOECACHE_SELFCHECK
        if (v != victim_scan<Freq>(layer, X)) {
            std::abort();
        }
#endif
        return v;
    }

#ifdef MOECACHE_SELFCHECK
    /* pick_victim_scan over this loop's state */
    template <bool Freq>
    int32_t victim_scan(int32_t layer, const Expert * X) {
        const int32_t * slots = expert_of_.data() + static_cast<size_t>(layer) * S_;
        int32_t best = -1;
        for (int32_t s = 0; s < S_; ++s) {
            const int32_t e = slots[s];
            if (e < 0 || pin_[e] == pin_epoch_) {
                continue;
            }
            if (best < 0) {
                best = e;
                continue;
            }
            if (Freq) {
                const double ke = key_of(fq_of(layer)[e]);
                const double kb = key_of(fq_of(layer)[best]);
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

    /* A new resident's recency: a use (the LRU queue's tail) or a changed key. */
    template <bool Freq>
    void used(int32_t layer, Expert & x, int32_t e) {
        x.last_use = ++clock_;
        if (Freq) {
            fq_of(layer)[e].ver += 1;
        } else {
            LruEntry * q = q_.data() + static_cast<size_t>(layer) * q_cap_;
            int64_t & tail = q_tail_[layer];
            if (tail == q_cap_) {
                compact(layer, q);
            }
            q[tail++] = LruEntry{x.last_use, e};
        }
    }

    void compact(int32_t layer, LruEntry * q) {
        const Expert * X = ex_.data() + static_cast<size_t>(layer) * E_;
        int64_t n = 0;
        for (int64_t i = q_head_[layer]; i < q_tail_[layer]; ++i) {
            const LruEntry en = q[i];
            if (en.last_use >= 0 && X[en.e].slot >= 0 && X[en.e].last_use == en.last_use) {
                q[n++] = en;
            }
        }
        q_head_[layer] = 0;
        q_tail_[layer] = n;
    }

    /* acquire_slot + layer_insert: -1 when every resident is pinned. */
    template <bool Freq>
    int32_t insert(int32_t layer, Expert * X, int32_t e) {
        int32_t & n_res = n_res_[layer];
        int32_t slot;
        if (n_res < S_) {
            slot = n_res++; /* no resize: the slots below n_res are the full ones */
        } else {
            const int32_t v = victim<Freq>(layer, X);
            if (v < 0) {
                return -1;
            }
            slot = X[v].slot;
            X[v].slot = -1;
        }
        X[e].slot = static_cast<int16_t>(slot);
        expert_of_[static_cast<size_t>(layer) * S_ + slot] = e;
        if (Freq) {
            heap_push(layer, entry_of(layer, X, e));
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
    const size_t nE = static_cast<size_t>(n_layers) * E_;
    int64_t max_call = 1;
    for (int64_t c = 0; c < t_.n_calls; ++c) {
        max_call = std::max(max_call, t_.call_stop[c] - t_.call_start[c]);
    }
    const size_t sel = static_cast<size_t>(max_call) * k;
    ex_.assign(nE, Expert{0, -1, 0, 0});
    if (Freq) {
        fq_.assign(nE, Fq{0.0, 0, 0});
    }
    if (p_.admission != 0) {
        lost_.assign(nE, 0.0f);
    }
    expert_of_.assign(static_cast<size_t>(n_layers) * S_, -1);
    n_res_.assign(n_layers, 0);
    mass_.assign(n_layers, 0.0);
    pin_.assign(E_, 0);
    mark_.assign(E_, 0);
    if (Freq) {
        heap_.resize(static_cast<size_t>(n_layers) * S_);
        heap_n_.assign(n_layers, 0);
        stash_.clear();
        stash_.reserve(static_cast<size_t>(S_));
        h_ = static_cast<double>(p_.half_life);
        decay_.resize(4096);
        for (int64_t i = 0; i < 4096; ++i) {
            decay_[static_cast<size_t>(i)] = std::exp2(-static_cast<double>(i) / h_);
        }
    } else {
        q_cap_ = 2 * static_cast<int64_t>(S_) + 2 * static_cast<int64_t>(sel) + 64;
        q_.resize(static_cast<size_t>(n_layers) * static_cast<size_t>(q_cap_));
        q_head_.assign(n_layers, 0);
        q_tail_.assign(n_layers, 0);
    }
    std::vector<int8_t> action(sel);
    std::vector<float> wnorm(sel);
    std::vector<int32_t> used_ids(sel);
    std::vector<int32_t> fetched(sel);
    std::vector<int32_t> chosen(static_cast<size_t>(E_));
    std::vector<int32_t> last_place(static_cast<size_t>(std::max(t_.pred_width, 1)));

    const bool admission = p_.admission != 0;
    const int32_t want_pf = p_.prefetch == MOECACHE_PREFETCH_TOP_K ? k : p_.prefetch;
    const int32_t per_token = std::min({want_pf, E_, S_});
    const bool prefetching = per_token > 0 && t_.pred_width > 0;
    const float beta = p_.beta;
    const float theta = p_.theta;
    const float bonus_w = p_.bonus;
    const uint16_t * ranks = t_.ranks;
    const uint8_t * rank_counts = t_.rank_counts;
    const float * selp = t_.selected_probs;

    step_ = t_.initial_step;
    double before_mass = 0.0;
    for (int64_t tok = 0; tok < t_.n_tokens; ++tok) {
        int64_t rows = 0, hits = 0, fetches = 0, subs = 0, admits = 0;
        int64_t bytes_sync = 0, bytes_async = 0, prefetches = 0, pf_hits = 0;
        for (int64_t c = t_.token_calls[tok]; c < t_.token_calls[tok + 1]; ++c) {
            step_ = std::max(step_, t_.call_step[c]);
            const int64_t r0 = t_.call_start[c];
            const int32_t n = static_cast<int32_t>(t_.call_stop[c] - r0);
            if (n == 0) {
                continue;
            }
            const int32_t layer = t_.call_layer[c];
            Expert * X = ex_.data() + static_cast<size_t>(layer) * E_;
            const int64_t eb = t_.expert_bytes[layer];
            const int32_t * ids = t_.ids + r0 * k;
            const float * w = t_.weights + r0 * k;
            const int32_t nk = n * k;
            const int64_t pin = ++pin_epoch_;
            for (int32_t i = 0; i < nk; ++i) {
                if (X[ids[i]].slot >= 0) {
                    pin_[ids[i]] = pin;
                }
            }
            int32_t n_fetched = 0;
            Substitutes subst{X, expert_of_.data() + static_cast<size_t>(layer) * S_, S_, E_,
                              mark_.data()};
            /* decide, row by row (decide_token) */
            for (int32_t r = 0; r < n; ++r) {
                const int32_t base = r * k;
                const int64_t row = r0 + r;
                int32_t n_sub = 0;
                if (Rule == MOECACHE_FETCH_ALL) {
                    for (int32_t j = 0; j < k; ++j) {
                        const int32_t i = base + j;
                        used_ids[i] = ids[i];
                        action[i] = X[ids[i]].slot >= 0 ? MOECACHE_HIT : MOECACHE_FETCH;
                    }
                } else {
                    const int64_t me = ++mark_epoch_;
                    float sum = 0.0f;
                    for (int32_t j = 0; j < k; ++j) {
                        sum += w[base + j];
                    }
                    for (int32_t j = 0; j < k; ++j) {
                        const int32_t i = base + j;
                        const int32_t e = ids[i];
                        const float wn = sum > 0.0f ? w[i] / sum : 0.0f;
                        wnorm[i] = wn;
                        mark_[e] = me;
                        used_ids[i] = e;
                        int8_t a;
                        if (X[e].slot >= 0) {
                            a = MOECACHE_HIT;
                        } else if (Rule == MOECACHE_THRESHOLD) {
                            a = j == 0 || wn >= theta ? MOECACHE_FETCH : MOECACHE_SUBSTITUTE;
                        } else if (Rule == MOECACHE_FIRST_CHOICE) {
                            a = j == 0 ? MOECACHE_FETCH : MOECACHE_SUBSTITUTE;
                        } else {
                            a = MOECACHE_SUBSTITUTE;
                        }
                        action[i] = a;
                        n_sub += a == MOECACHE_SUBSTITUTE;
                    }
                    if (n_sub > 0) {
                        const float * prow = t_.probs + row * E_;
                        const uint16_t * rank_row = ranks + row * MOECACHE_RANK_WIDTH;
                        const int32_t rank_count = rank_counts[row];
                        int32_t best[MOECACHE_MAX_K];
                        if (Rule == MOECACHE_ROUTING_BONUS) {
                            const float * p_sel = selp + row * k;
                            int32_t order[MOECACHE_MAX_K];
                            int32_t m = 0;
                            float selected = 0.0f;
                            for (int32_t i = base; i < base + k; ++i) {
                                selected += p_sel[i - base];
                                if (action[i] == MOECACHE_SUBSTITUTE) {
                                    order[m++] = i;
                                }
                            }
                            const float bonus = bonus_w * (selected > 0.0f ? selected : 1.0f);
                            std::sort(order, order + m, [&](int32_t a, int32_t b) {
                                const float pa = p_sel[a - base];
                                const float pb = p_sel[b - base];
                                return pa != pb ? pa < pb : a > b;
                            });
                            const int32_t n_best =
                                subst.pick(prow, me, m, best, rank_row, rank_count);
                            bool steering = true;
                            for (int32_t o = 0; o < m; ++o) {
                                const int32_t i = order[o];
                                const int32_t s = steering && o < n_best ? best[o] : -1;
                                if (s >= 0 && prow[s] + bonus > p_sel[i - base]) {
                                    used_ids[i] = s;
                                    pin_[s] = pin;
                                } else {
                                    action[i] = MOECACHE_FETCH;
                                    steering = false;
                                }
                            }
                        } else {
                            const int32_t n_best =
                                subst.pick(prow, me, n_sub, best, rank_row, rank_count);
                            int32_t next = 0;
                            for (int32_t i = base; i < base + k; ++i) {
                                if (action[i] != MOECACHE_SUBSTITUTE) {
                                    continue;
                                }
                                if (next == n_best) {
                                    action[i] = MOECACHE_FETCH;
                                    continue;
                                }
                                const int32_t s = best[next++];
                                used_ids[i] = s;
                                pin_[s] = pin;
                            }
                        }
                    }
                }
                for (int32_t i = base; i < base + k; ++i) {
                    if (action[i] != MOECACHE_FETCH) {
                        continue;
                    }
                    if (insert<Freq>(layer, X, ids[i]) < 0) {
                        return MOECACHE_E_NO_SLOT;
                    }
                    pin_[ids[i]] = pin;
                    fetched[n_fetched++] = ids[i];
                }
            }
            /* commit */
            for (int32_t i = 0; i < nk; ++i) {
                const int32_t o = used_ids[i];
                Expert & xo = X[o];
                used<Freq>(layer, xo, o);
                if (Freq) {
                    record_selection(fq_of(layer)[ids[i]]);
                }
                if (prefetching && action[i] != MOECACHE_FETCH && xo.prefetched) {
                    xo.prefetched = 0;
                    pf_hits += 1;
                }
            }
            float * lost = admission ? lost_.data() + static_cast<size_t>(layer) * E_ : nullptr;
            for (int32_t f = 0; f < n_fetched; ++f) {
                if (admission) {
                    lost[fetched[f]] = 0.0f;
                }
                X[fetched[f]].prefetched = 0;
            }
            /* admission, then each row's counts (admit_lost_mass, record_token) */
            for (int32_t r = 0; r < n; ++r) {
                const int32_t base = r * k;
                int32_t n_hit = 0, n_fetch = 0, n_subst = 0, n_admit = 0;
                float mass = 0.0f;
                for (int32_t i = base; i < base + k; ++i) {
                    n_hit += action[i] == MOECACHE_HIT;
                    n_fetch += action[i] == MOECACHE_FETCH;
                    if (Rule != MOECACHE_FETCH_ALL && action[i] == MOECACHE_SUBSTITUTE) {
                        n_subst += 1;
                        mass += wnorm[i];
                    }
                }
                if (Rule != MOECACHE_FETCH_ALL && admission && n_subst > 0) {
                    for (int32_t i = base; i < base + k; ++i) {
                        if (action[i] != MOECACHE_SUBSTITUTE) {
                            continue;
                        }
                        const int32_t e = ids[i];
                        Expert & x = X[e];
                        if (x.slot >= 0) {
                            continue;
                        }
                        lost[e] += wnorm[i];
                        if (lost[e] < beta) {
                            continue;
                        }
                        if (insert<Freq>(layer, X, e) < 0) {
                            continue;
                        }
                        pin_[e] = pin;
                        used<Freq>(layer, x, e);
                        lost[e] = 0.0f;
                        x.prefetched = 0;
                        n_admit += 1;
                    }
                }
                rows += 1;
                hits += n_hit;
                fetches += n_fetch;
                subs += n_subst;
                admits += n_admit;
                mass_[layer] += static_cast<double>(mass);
                bytes_sync += n_fetch * eb;
                bytes_async += n_admit * eb;
            }
            /* PSR (prefetch_ranked, or prefetch for a ranking that repeats an expert) */
            if (!prefetching) {
                continue;
            }
            const int64_t last = r0 + n - 1;
            const int32_t nl = t_.next_layer[last];
            if (nl < 0) {
                continue;
            }
            const int32_t * ranked = t_.predicted + last * t_.pred_width;
            int32_t count = 0;
            while (count < t_.pred_width && ranked[count] >= 0) {
                ++count;
            }
            const int64_t me = ++mark_epoch_;
            bool repeats = false;
            for (int32_t j = 0; j < count; ++j) {
                repeats |= mark_[ranked[j]] == me;
                mark_[ranked[j]] = me;
            }
            int32_t m = 0;
            if (!repeats) {
                for (; m < per_token && m < count; ++m) {
                    chosen[m] = ranked[m];
                }
            } else {
                /* scored count - j, a later repeat overwriting (prefetch): the distinct
                 * experts in the order of their last places */
                const int64_t me2 = ++mark_epoch_;
                int32_t n_order = 0;
                for (int32_t j = count - 1; j >= 0; --j) {
                    if (mark_[ranked[j]] != me2) {
                        mark_[ranked[j]] = me2;
                        last_place[n_order++] = j;
                    }
                }
                std::sort(last_place.begin(), last_place.begin() + n_order);
                for (int32_t o = 0; o < n_order && m < per_token; ++o) {
                    chosen[m++] = ranked[last_place[o]];
                }
            }
            for (int32_t e = 0; m < per_token && e < E_; ++e) {
                if (mark_[e] != mark_epoch_) { /* the unranked tie: lower id first */
                    chosen[m++] = e;
                }
            }
            Expert * Y = ex_.data() + static_cast<size_t>(nl) * E_;
            const int64_t ppin = ++pin_epoch_;
            for (int32_t j = 0; j < per_token; ++j) {
                if (Y[chosen[j]].slot >= 0) {
                    pin_[chosen[j]] = ppin;
                }
            }
            const int64_t ebn = t_.expert_bytes[nl];
            for (int32_t j = 0; j < per_token; ++j) {
                const int32_t e = chosen[j];
                if (Y[e].slot >= 0) {
                    continue;
                }
                if (insert<Freq>(nl, Y, e) < 0) {
                    break;
                }
                pin_[e] = ppin;
                used<Freq>(nl, Y[e], e);
                if (admission) {
                    lost_[static_cast<size_t>(nl) * E_ + e] = 0.0f;
                }
                Y[e].prefetched = 1;
                prefetches += 1;
                bytes_async += ebn;
            }
        }
        double now_mass = 0.0;
        for (int32_t l = 0; l < n_layers; ++l) {
            now_mass += mass_[l];
        }
        moecache_replay_token & o = out_[tok];
        o.rows = rows;
        o.selections = rows * k;
        o.hits = hits;
        o.fetches = fetches;
        o.substitutions = subs;
        o.admissions = admits;
        o.substituted_mass = now_mass - before_mass;
        o.bytes_sync = bytes_sync;
        o.bytes_async = bytes_async;
        o.n_sync = fetches;
        o.n_async = admits + prefetches;
        o.prefetches = prefetches;
        o.prefetch_hits = pf_hits;
        before_mass = now_mass;
    }
    return MOECACHE_OK;
}

}  // namespace

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
    const int32_t per_token = std::min({p.prefetch == MOECACHE_PREFETCH_TOP_K ? t.top_k
                                                                              : p.prefetch,
                                        t.n_experts, slots});
    const double ticks = 2.0 * static_cast<double>(t.n_rows) * t.top_k +
                         static_cast<double>(t.n_calls) * std::max(per_token, 0);
    int64_t max_step = t.initial_step;
    for (int64_t c = 0; c < t.n_calls; ++c) {
        max_step = std::max(max_step, t.call_step[c]);
    }
    const int64_t kInt32 = std::numeric_limits<int32_t>::max();
    if (ticks >= static_cast<double>(kInt32) || max_step >= kInt32 ||
        t.n_experts > std::numeric_limits<int16_t>::max()) {
        return false;
    }
    if (p.eviction == MOECACHE_EVICT_FREQUENCY) {
        /* the heap needs every key to rise with a selection: mathematically it rises by
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

int32_t replay_fast(const moecache_replay_trace & t, const moecache_replay_config & cfg,
                    moecache_replay_token * out, FastWorkspace & w) {
    const moecache_policy & p = cfg.follow_policy ? t.start_policy : cfg.policy;
    const int32_t slots = cfg.slots == 0 ? t.start_slots : cfg.slots;
    FastReplay loop(t, p, slots, out, w);
    replay_fast_configs.fetch_add(1, std::memory_order_relaxed);
    return loop.run();
}

}  // namespace moecache_core
