/*
 * test_replay_layouts.cpp — the batch replay's decision loop (replay_loop.cpp) against the
 * per-call core (the same batch asked for its event rows, which only the core writes) on
 * traces laid out irregularly, as a recorder may leave them and test_selfcheck's
 * workloads never do: tokens with fewer or more route calls than layers, calls of 0-3
 * rows, steps that repeat or jump, PSR predictions aimed at any layer (several in a row
 * into one layer, one as a layer's last event), predictions cut short or repeating an
 * expert, NaN rows; and random policies, mostly frequency eviction at budgets around the
 * loop's switch from a scan to its bucket queue, with half-lives from 0.05 to 10,000
 * steps (the plan's keys, and the counts' own where a batch's half-lives differ).
 *
 * Each configuration alone, then all of a trace's in one batch: every token's totals must
 * equal the core's. Compiled twice (CMakeLists.txt): with MOECACHE_SELFCHECK, where the
 * loop also aborts on any victim that differs from a scan of the slots, and as the
 * library builds it.
 *
 * Usage: test_replay_layouts [ROUNDS [SEED]]
 */
#include "moecache.h"
#include "moecache_internal.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

struct Trace {
    std::vector<float> probs, weights;
    std::vector<int32_t> ids, next_layer, predicted, call_layer;
    std::vector<int64_t> call_step, call_start, call_stop, token_calls{0};
    std::vector<int64_t> expert_bytes;
    moecache_replay_trace t{};
};

/* A trace of irregular layout (see the file's comment). */
void make_trace(std::mt19937 & rng, Trace & d) {
    const int32_t n_layers = 1 + static_cast<int32_t>(rng() % 3);
    const int32_t n_experts = 45 + static_cast<int32_t>(rng() % 120);
    const int32_t k = 1 + static_cast<int32_t>(rng() % 8);
    const int32_t width = 1 + static_cast<int32_t>(rng() % 12);
    const int64_t n_tokens = 60 + static_cast<int64_t>(rng() % 120);
    d.expert_bytes.assign(static_cast<size_t>(n_layers), 100);
    int64_t rows = 0, step = rng() % 3;
    const int step_mode = static_cast<int>(rng() % 3);
    const int target_mode = static_cast<int>(rng() % 3);
    /* the experts a layer's rows choose among (a working set, or all of them) */
    const int32_t pool = std::max<int32_t>(k, n_experts / (1 + static_cast<int32_t>(rng() % 4)));
    std::vector<int32_t> perm(static_cast<size_t>(n_experts));
    for (int64_t tok = 0; tok < n_tokens; ++tok) {
        const int32_t n_calls = rng() % 5 == 0 ? static_cast<int32_t>(rng() % 5) : n_layers;
        for (int32_t c = 0; c < n_calls; ++c) {
            const int32_t layer = n_calls == n_layers ? c : static_cast<int32_t>(rng() % n_layers);
            if (step_mode == 1 || rng() % 4 == 0) { /* the same step, the next, or a jump */
                step += rng() % 3 == 0 ? 0 : (rng() % 10 == 0 ? 30 + rng() % 400 : 1);
            }
            d.call_step.push_back(step);
            d.call_layer.push_back(layer);
            d.call_start.push_back(rows);
            const int32_t n_rows = rng() % 6 == 0 ? static_cast<int32_t>(rng() % 4) : 1;
            for (int32_t i = 0; i < n_rows; ++i, ++rows) {
                for (int32_t e = 0; e < n_experts; ++e) {
                    d.probs.push_back(static_cast<float>(rng() % 16) /
                                      static_cast<float>(1 + e % 7));
                }
                if (rng() % 200 == 0) {
                    d.probs[static_cast<size_t>(rows * n_experts + rng() % n_experts)] =
                        std::nanf("");
                }
                for (int32_t e = 0; e < n_experts; ++e) {
                    perm[static_cast<size_t>(e)] = e;
                }
                for (int32_t j = 0; j < k; ++j) { /* k distinct experts of the pool */
                    const int32_t pick = j + static_cast<int32_t>(rng() % (pool - j));
                    std::swap(perm[static_cast<size_t>(j)], perm[static_cast<size_t>(pick)]);
                    d.ids.push_back(perm[static_cast<size_t>(j)]);
                    d.weights.push_back(0.05f + static_cast<float>(rng() % 10) / 10.0f);
                }
                int32_t target; /* the layer this row's prediction is for (-1: none) */
                if (target_mode == 0) {
                    target = layer + 1 < n_layers ? layer + 1 : -1;
                } else if (target_mode == 1) {
                    target = static_cast<int32_t>(rng() % (n_layers + 1)) - 1;
                } else {
                    target = (layer + 1) % n_layers;
                }
                d.next_layer.push_back(target);
                const int shape = static_cast<int>(rng() % 10);
                const int32_t stop = shape == 0 ? static_cast<int32_t>(rng() % (width + 1)) : width;
                for (int32_t j = 0; j < width; ++j) {
                    int32_t e = rng() % 3 == 0 ? perm[static_cast<size_t>((k + j) % n_experts)]
                                               : perm[rng() % n_experts];
                    if (shape == 1 && j > 0 && rng() % 3 == 0) { /* a repeat of an earlier one */
                        e = d.predicted[d.predicted.size() - 1 - rng() % j];
                    }
                    d.predicted.push_back(j < stop ? e : -1);
                }
            }
            d.call_stop.push_back(rows);
        }
        d.token_calls.push_back(static_cast<int64_t>(d.call_start.size()));
    }
    moecache_replay_trace & t = d.t;
    t.n_layers = n_layers;
    t.n_experts = n_experts;
    t.top_k = k;
    t.pred_width = width;
    t.initial_step = 0;
    t.start_slots = n_experts;
    moecache_preset("exact", &t.start_policy);
    t.expert_bytes = d.expert_bytes.data();
    t.n_rows = rows;
    t.probs = d.probs.data();
    t.ids = d.ids.data();
    t.weights = d.weights.data();
    t.next_layer = d.next_layer.data();
    t.predicted = d.predicted.data();
    t.n_calls = static_cast<int64_t>(d.call_start.size());
    t.call_step = d.call_step.data();
    t.call_layer = d.call_layer.data();
    t.call_start = d.call_start.data();
    t.call_stop = d.call_stop.data();
    t.n_tokens = n_tokens;
    t.token_calls = d.token_calls.data();
}

moecache_replay_config random_config(std::mt19937 & rng, int32_t n_experts, int32_t k) {
    moecache_replay_config cfg{};
    moecache_policy & p = cfg.policy;
    moecache_preset("exact", &p);
    p.miss_rule = static_cast<int32_t>(rng() % 5);
    p.eviction = rng() % 3 == 0 ? MOECACHE_EVICT_LRU : MOECACHE_EVICT_FREQUENCY;
    p.admission = static_cast<int32_t>(rng() % 2);
    p.substitute_weight = static_cast<int32_t>(rng() % 2);
    p.theta = static_cast<float>(rng() % 11) / 10.0f;
    p.beta = 0.05f + static_cast<float>(rng() % 10) / 10.0f;
    const float half_lives[] = {0.5f, 3.0f, 64.0f, 1e4f, 0.05f};
    p.half_life = half_lives[rng() % 5];
    const float bonuses[] = {0.0f, 0.05f, 0.3f, 2.0f};
    p.bonus = bonuses[rng() % 4];
    p.prefetch = rng() % 4 == 0 ? 0 : static_cast<int32_t>(rng() % 10) - 1; /* -1: top-k */
    p.fill_free = static_cast<int32_t>(rng() % 2);
    int32_t slots;
    switch (rng() % 4) {
        case 0: slots = k + static_cast<int32_t>(rng() % (n_experts - k + 1)); break;
        case 1: slots = 41 + static_cast<int32_t>(rng() % 30); break; /* the bucket queue */
        case 2: slots = n_experts - 1 - static_cast<int32_t>(rng() % 5); break;
        default: slots = 38 + static_cast<int32_t>(rng() % 8); break; /* around the switch */
    }
    cfg.slots = std::max(k, std::min(slots, n_experts));
    return cfg;
}

const char * differs(const std::vector<moecache_replay_token> & a,
                     const std::vector<moecache_replay_token> & b, size_t from, size_t n) {
    for (size_t i = from; i < from + n; ++i) {
        if (std::memcmp(&a[i], &b[i], sizeof(a[i])) != 0) {
            static char where[64];
            std::snprintf(where, sizeof(where), "token %zu", i - from);
            return where;
        }
    }
    return nullptr;
}

}  // namespace

int main(int argc, char ** argv) {
    const int rounds = argc > 1 ? std::atoi(argv[1]) : 20;
    std::mt19937 rng(argc > 2 ? static_cast<unsigned>(std::atoi(argv[2])) : 1u);
    constexpr int kConfigs = 40;
    int64_t compared = 0;
    const int64_t fast_before = moecache_core::replay_fast_configs.load();
    for (int round = 0; round < rounds; ++round) {
        Trace d;
        make_trace(rng, d);
        const moecache_replay_trace & t = d.t;
        const auto n_tok = static_cast<size_t>(t.n_tokens);
        std::vector<moecache_replay_config> configs;
        std::vector<moecache_replay_token> core_all;
        for (int i = 0; i < kConfigs; ++i) {
            const moecache_replay_config cfg = random_config(rng, t.n_experts, t.top_k);
            configs.push_back(cfg);
            std::vector<moecache_replay_token> core(n_tok), loop(n_tok);
            std::vector<moecache_event> events(static_cast<size_t>(std::max<int64_t>(t.n_rows, 1)));
            /* asked for its event rows, the batch runs the per-call core */
            const int32_t c_core = moecache_replay_batch(&t, &cfg, 1, 1, core.data(), events.data());
            const int32_t c_loop = moecache_replay_batch(&t, &cfg, 1, 1, loop.data(), nullptr);
            const char * where = differs(core, loop, 0, n_tok);
            if (c_core != c_loop || where != nullptr) {
                const moecache_policy & p = cfg.policy;
                std::fprintf(stderr,
                             "round %d config %d: the loop differs from the core (codes %d / "
                             "%d, %s): rule %d eviction %d admission %d prefetch %d slots %d "
                             "experts %d k %d half-life %g fill_free %d\n",
                             round, i, c_core, c_loop, where ? where : "totals equal",
                             p.miss_rule, p.eviction, p.admission, p.prefetch, cfg.slots,
                             t.n_experts, t.top_k, static_cast<double>(p.half_life),
                             p.fill_free);
                return 1;
            }
            core_all.insert(core_all.end(), core.begin(), core.end());
            ++compared;
        }
        /* all of them in one batch (one plan, keys for the first frequency half-life) */
        std::vector<moecache_replay_token> batch(core_all.size());
        moecache_replay_batch(&t, configs.data(), kConfigs, 1, batch.data(), nullptr);
        for (int i = 0; i < kConfigs; ++i) {
            const char * where = differs(core_all, batch, static_cast<size_t>(i) * n_tok, n_tok);
            if (where != nullptr) {
                std::fprintf(stderr, "round %d config %d: differs in the batch (%s)\n", round,
                             i, where);
                return 1;
            }
        }
    }
    const int64_t fast = moecache_core::replay_fast_configs.load() - fast_before;
    if (fast < compared) { /* every configuration alone, and again in its batch */
        std::fprintf(stderr, "the loop ran %lld of %lld configurations\n",
                     static_cast<long long>(fast), static_cast<long long>(compared));
        return 1;
    }
#ifdef MOECACHE_SELFCHECK
    const char * picks = "every victim equal to a scan of the slots";
#else
    const char * picks = "release build: totals only";
#endif
    std::printf("replay layouts: %lld configurations over %d irregular traces equal to the "
                "per-call core, alone and batched; %s\n",
                static_cast<long long>(compared), rounds, picks);
    return 0;
}
