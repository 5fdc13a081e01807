/*
 * test_selfcheck.cpp — the core's fast paths against its reference scans.
 *
 * Built from the core's sources with MOECACHE_SELFCHECK, under which every victim and every
 * substitute the indexed paths pick (LRU order list, frequency victim queue, one-scan
 * substitutes) is compared with a full scan of the layer's slots, aborting on the first
 * difference. This drives random routing through every preset, budget shrinks and growths,
 * policy changes between LRU and frequency, multi-token calls, prefetches, ties and NaN
 * probabilities, so that any decision the indexes would change fails the test. Layers with
 * more residents than the kept frequency order holds, and the batch replay with its shared
 * substitute ranking (each ranking checked against the probabilities), too. Built a second
 * time without MOECACHE_SELFCHECK (test_selfcheck_release): the replay loop as the library
 * has it, whose totals are still compared with the per-call core's.
 */
#include "moecache.h"
#include "moecache_internal.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

/* Every row's ranking names its best experts in substitution order, every other expert
 * ranking below the last named (0 named for a row holding a NaN). */
bool ranking_ok(const std::vector<float> & probs, int64_t n_rows, int32_t n_experts,
                const std::vector<uint16_t> & ranks, const std::vector<uint8_t> & counts) {
    auto before = [](float pa, int32_t a, float pb, int32_t b) {
        return pa > pb || (pa == pb && a < b);
    };
    for (int64_t r = 0; r < n_rows; ++r) {
        const float * row = probs.data() + r * n_experts;
        const bool nan = std::any_of(row, row + n_experts, [](float p) { return p != p; });
        const int32_t n = counts[static_cast<size_t>(r)];
        if (nan || n == 0) {
            if (nan != (n == 0)) {
                return false;
            }
            continue;
        }
        std::vector<char> named(static_cast<size_t>(n_experts), 0);
        const uint16_t * rank = ranks.data() + r * MOECACHE_RANK_WIDTH;
        for (int32_t j = 0; j < n; ++j) {
            if (rank[j] >= n_experts || named[rank[j]] ||
                (j > 0 && !before(row[rank[j - 1]], rank[j - 1], row[rank[j]], rank[j]))) {
                return false;
            }
            named[rank[j]] = 1;
        }
        for (int32_t e = 0; e < n_experts; ++e) {
            if (!named[static_cast<size_t>(e)] && before(row[e], e, row[rank[n - 1]], rank[n - 1])) {
                return false;
            }
        }
    }
    return true;
}

/* A random policy: any rule, eviction, admission, weight, bonus, prefetch count, with
 * half-lives from far below a step (keys the replay loop cannot order: per-call core) up. */
moecache_policy custom_policy(std::mt19937 & rng) {
    moecache_policy p{};
    moecache_preset("exact", &p);
    p.miss_rule = static_cast<int32_t>(rng() % 5);
    p.eviction = static_cast<int32_t>(rng() % 2);
    p.admission = static_cast<int32_t>(rng() % 2);
    p.substitute_weight = static_cast<int32_t>(rng() % 2);
    p.theta = static_cast<float>(rng() % 11) / 10.0f;
    p.beta = 0.05f + static_cast<float>(rng() % 10) / 10.0f;
    const float half_lives[] = {1e-4f, 0.5f, 3.0f, 64.0f, 1e4f};
    p.half_life = half_lives[rng() % 5];
    const float bonuses[] = {0.0f, 0.05f, 0.3f, 2.0f};
    p.bonus = bonuses[rng() % 4];
    p.prefetch = static_cast<int32_t>(rng() % 8) - 1;
    p.fill_free = static_cast<int32_t>(rng() % 2);
    return p;
}

bool same_tokens(const std::vector<moecache_replay_token> & x,
                 const std::vector<moecache_replay_token> & y) {
    return x.size() == y.size() &&
           std::memcmp(x.data(), y.data(), x.size() * sizeof(moecache_replay_token)) == 0;
}

/* A synthetic trace's arrays, and the moecache_replay_trace over them. */
struct TraceData {
    std::vector<float> probs, weights;
    std::vector<int32_t> ids, next_layer, predicted, call_layer;
    std::vector<int64_t> call_step, call_start, call_stop, token_calls{0};
    std::vector<int64_t> expert_bytes;
    std::vector<uint16_t> ranks;
    std::vector<uint8_t> counts;
    std::vector<float> selected;

    /* a row's probabilities: coarse values (ties), popular low ids */
    void push_probs(std::mt19937 & rng, int32_t n_experts) {
        for (int32_t e = 0; e < n_experts; ++e) {
            probs.push_back(static_cast<float>(rng() % 16) / static_cast<float>(1 + e % 7));
        }
    }

    /* a row's k selections drawn from perm's first `pool` (shuffled as drawn), their gate
     * weights, and the layer its prediction is for (the next; none after the last) */
    void push_selection(std::mt19937 & rng, std::vector<int32_t> & perm, int32_t pool,
                        int32_t k, int32_t layer, int32_t n_layers) {
        for (int32_t j = 0; j < k; ++j) {
            const int32_t pick = j + static_cast<int32_t>(rng() % (pool - j));
            std::swap(perm[static_cast<size_t>(j)], perm[static_cast<size_t>(pick)]);
            ids.push_back(perm[static_cast<size_t>(j)]);
            weights.push_back(0.05f + static_cast<float>(rng() % 10) / 10.0f);
        }
        next_layer.push_back(layer + 1 < n_layers ? layer + 1 : -1);
    }

    /* a route call of `layer` at token t from row `rows`, its end, a token's end */
    void begin_call(int64_t t, int32_t layer, int64_t rows) {
        call_step.push_back(t + 1);
        call_layer.push_back(layer);
        call_start.push_back(rows);
    }
    void end_call(int64_t rows) {
        call_stop.push_back(rows);
    }
    void end_token() {
        token_calls.push_back(static_cast<int64_t>(call_start.size()));
    }

    /* the rows ranked for substitution (moecache_rank_rows) on `threads` threads */
    int32_t rank(int64_t rows, int32_t n_experts, int32_t k, int32_t threads) {
        ranks.assign(static_cast<size_t>(rows) * MOECACHE_RANK_WIDTH, 0);
        counts.assign(static_cast<size_t>(rows), 0);
        selected.assign(ids.size(), 0.0f);
        return moecache_rank_rows(probs.data(), ids.data(), rows, n_experts, k, threads,
                                  ranks.data(), counts.data(), selected.data());
    }

    /* the trace over these arrays (its start slots and policy are the caller's) */
    moecache_replay_trace trace(int32_t n_layers, int32_t n_experts, int32_t k, int32_t width,
                                int64_t rows, int64_t n_tokens) {
        expert_bytes.assign(static_cast<size_t>(n_layers), 1000);
        moecache_replay_trace tr{};
        tr.n_layers = n_layers;
        tr.n_experts = n_experts;
        tr.top_k = k;
        tr.pred_width = width;
        tr.expert_bytes = expert_bytes.data();
        tr.n_rows = rows;
        tr.probs = probs.data();
        tr.ids = ids.data();
        tr.weights = weights.data();
        tr.next_layer = next_layer.data();
        tr.predicted = predicted.data();
        tr.n_calls = static_cast<int64_t>(call_start.size());
        tr.call_step = call_step.data();
        tr.call_layer = call_layer.data();
        tr.call_start = call_start.data();
        tr.call_stop = call_stop.data();
        tr.n_tokens = n_tokens;
        tr.token_calls = token_calls.data();
        return tr;
    }
};

/* A random trace replayed in one batch under every preset, custom policies, the trace's
 * own policy and budget (with its changes) and several budgets: with and without a ranking
 * made beforehand, and through the per-call core (event rows asked for) against the replay
 * loop (none asked for; MOECACHE_SELFCHECK also checks its every victim against a scan),
 * whose per-token totals must be equal to the bit. Returns the rows decided, or -1. */
int64_t batch_replays(std::mt19937 & rng, const char * const * names) {
    int64_t decisions = 0;
    int64_t fast_expected = 0;
    const int64_t fast_before = moecache_core::replay_fast_configs.load();
    const int64_t scan_before = moecache_core::replay_scan_configs.load();
    int64_t reused_one = 0; /* runs taken in the batches on one thread */
    for (int round = 0; round < 12; ++round) {
        const int32_t n_layers = 3;
        const int32_t n_experts = round % 2 == 0 ? 40 + static_cast<int32_t>(rng() % 40)
                                                 : 200 + static_cast<int32_t>(rng() % 200);
        const int32_t k = 2 + static_cast<int32_t>(rng() % 8);
        const int64_t n_tokens = 120;
        TraceData data;
        auto & probs = data.probs;
        auto & ids = data.ids;
        auto & predicted = data.predicted;
        const int32_t width = 12;
        int64_t rows = 0;
        for (int64_t t = 0; t < n_tokens; ++t) {
            for (int32_t layer = 0; layer < n_layers; ++layer) {
                const int32_t n_tok = rng() % 8 == 0 ? 2 + static_cast<int32_t>(rng() % 3) : 1;
                data.begin_call(t, layer, rows);
                for (int32_t i = 0; i < n_tok; ++i, ++rows) {
                    std::vector<int32_t> perm(static_cast<size_t>(n_experts));
                    for (int32_t e = 0; e < n_experts; ++e) {
                        perm[static_cast<size_t>(e)] = e;
                    }
                    data.push_probs(rng, n_experts);
                    if (rng() % 150 == 0) { /* now and then a NaN */
                        probs[static_cast<size_t>(rows * n_experts + rng() % n_experts)] =
                            std::nanf("");
                    }
                    data.push_selection(rng, perm, n_experts, k, layer, n_layers);
                    /* now and then a ranking that repeats an expert, or a short one */
                    const int32_t shape = static_cast<int32_t>(rng() % 10);
                    const int32_t stop = shape == 0 ? static_cast<int32_t>(rng() % width) : width;
                    for (int32_t j = 0; j < width; ++j) {
                        int32_t e = perm[static_cast<size_t>(k + j) % n_experts];
                        if (shape == 1 && j > 0 && rng() % 3 == 0) {
                            e = predicted[predicted.size() - 1 - rng() % j];
                        }
                        predicted.push_back(j < stop ? e : -1);
                    }
                }
                data.end_call(rows);
            }
            data.end_token();
        }
        auto & ranks = data.ranks;
        auto & counts = data.counts;
        auto & selected = data.selected;
        if (data.rank(rows, n_experts, k, 2) != MOECACHE_OK ||
            !ranking_ok(probs, rows, n_experts, ranks, counts)) {
            std::fprintf(stderr, "ranking differs from the probabilities\n");
            return -1;
        }
        for (size_t i = 0; i < ids.size(); ++i) {
            const float p = probs[(i / static_cast<size_t>(k)) * static_cast<size_t>(n_experts) +
                                  static_cast<size_t>(ids[i])];
            if (std::memcmp(&p, &selected[i], sizeof(p)) != 0) {
                std::fprintf(stderr, "a selected probability differs from its row's\n");
                return -1;
            }
        }
        moecache_replay_trace tr = data.trace(n_layers, n_experts, k, width, rows, n_tokens);
        tr.start_slots = std::min(n_experts, k + static_cast<int32_t>(rng() % 8));
        moecache_preset(names[rng() % 8], &tr.start_policy);
        /* the trace's changes: none, budget changes that keep its budget, or real policy
         * and budget changes (the last followed by the per-call core) */
        std::vector<int64_t> change_token;
        std::vector<int32_t> change_slots;
        std::vector<moecache_policy> change_policy;
        const int32_t changes = round % 3;
        for (int64_t t = 5; changes > 0 && t < n_tokens; t += 20 + static_cast<int64_t>(rng() % 20)) {
            moecache_policy p{};
            moecache_preset(names[rng() % 8], &p);
            const bool policy_change = changes == 2 && rng() % 2 == 0;
            const int32_t to = changes == 1 ? tr.start_slots
                                            : k + static_cast<int32_t>(rng() % (n_experts - k + 1));
            change_token.push_back(t);
            change_slots.push_back(policy_change ? 0 : to);
            change_policy.push_back(p);
        }
        tr.n_changes = static_cast<int64_t>(change_token.size());
        tr.change_token = change_token.data();
        tr.change_slots = change_slots.data();
        tr.change_policy = change_policy.data();
        std::vector<moecache_replay_config> configs;
        for (int i = 0; i < 8; ++i) {
            for (const int32_t slots : {k, k + 3, n_experts / 4, n_experts / 2 + 1, n_experts}) {
                moecache_replay_config cfg{};
                moecache_preset(names[i], &cfg.policy);
                cfg.slots = std::max(k, std::min(slots, n_experts));
                configs.push_back(cfg);
            }
        }
        /* substitute-all by its rule alone (no free slot filled first) at the same budgets:
         * its run at k slots is its run at every budget (the reuse below) */
        for (const int32_t slots : {k, k + 3, n_experts / 4, n_experts / 2 + 1, n_experts}) {
            moecache_replay_config cfg{};
            moecache_preset("substitute-all", &cfg.policy);
            cfg.policy.fill_free = 0;
            cfg.slots = std::max(k, std::min(slots, n_experts));
            configs.push_back(cfg);
        }
        for (int i = 0; i < 12; ++i) {
            moecache_replay_config cfg{};
            cfg.policy = custom_policy(rng);
            cfg.slots = i % 4 == 0 ? 0 : k + static_cast<int32_t>(rng() % (n_experts - k + 1));
            configs.push_back(cfg);
        }
        for (const int32_t slots : {0, k + 1}) {
            moecache_replay_config cfg{};
            cfg.follow_policy = 1;
            cfg.slots = std::min(slots, n_experts);
            configs.push_back(cfg);
        }
        const int32_t n_cfg = static_cast<int32_t>(configs.size());
        std::vector<moecache_replay_token> a(configs.size() * static_cast<size_t>(n_tokens));
        std::vector<moecache_replay_token> b(a.size());
        std::vector<moecache_event> ea(configs.size() * static_cast<size_t>(rows));
        std::vector<moecache_event> eb(ea.size());
        const int32_t own = moecache_replay_batch(&tr, configs.data(), n_cfg, 2, a.data(),
                                                  ea.data());
        tr.ranks = ranks.data();
        tr.rank_counts = counts.data();
        tr.selected_probs = selected.data();
        const int32_t shared = moecache_replay_batch(&tr, configs.data(), n_cfg, 2, b.data(),
                                                     eb.data());
        if (rows > 0) { /* a ranking past moecache_rank_rows' contract is refused */
            const int64_t r = rows / 2; /* (no draw: the later scenarios' draws unchanged) */
            std::vector<uint8_t> bad_counts(counts);
            bad_counts[static_cast<size_t>(r)] = MOECACHE_RANK_WIDTH + 1;
            std::vector<uint16_t> bad_ranks(ranks);
            bad_ranks[static_cast<size_t>(r) * MOECACHE_RANK_WIDTH] =
                static_cast<uint16_t>(n_experts);
            moecache_replay_trace bad = tr;
            bad.rank_counts = bad_counts.data();
            const int32_t too_many = moecache_replay_batch(&bad, configs.data(), n_cfg, 1,
                                                           b.data(), nullptr);
            moecache_replay_plan * too_many_plan = moecache_replay_plan_new(&bad, 1);
            bad.rank_counts = counts.data();
            bad.ranks = bad_ranks.data();
            const bool named = counts[static_cast<size_t>(r)] > 0;
            const int32_t unknown = moecache_replay_batch(&bad, configs.data(), n_cfg, 1,
                                                          b.data(), nullptr);
            if (too_many != MOECACHE_E_ARG || too_many_plan != nullptr ||
                (named && unknown != MOECACHE_E_ARG)) {
                std::fprintf(stderr, "round %d: a bad ranking was taken (%d, %d)\n", round,
                             too_many, unknown);
                moecache_replay_plan_free(too_many_plan);
                return -1;
            }
            const int32_t again = moecache_replay_batch(&tr, configs.data(), n_cfg, 2, b.data(),
                                                        eb.data());
            if (again != shared) {
                std::fprintf(stderr, "round %d: the good ranking after a bad one: %d\n", round,
                             again);
                return -1;
            }
        }
        for (size_t i = 0; i < ea.size(); ++i) {
            const moecache_event & x = ea[i];
            const moecache_event & y = eb[i];
            if (!std::equal(x.used_ids, x.used_ids + x.k, y.used_ids) ||
                !std::equal(x.slots, x.slots + x.k, y.slots) || x.n_admit != y.n_admit ||
                x.n_evict != y.n_evict) {
                std::fprintf(stderr, "a batch with its own ranking decided otherwise\n");
                return -1;
            }
        }
        if (own != shared) {
            std::fprintf(stderr, "batch replay codes differ: %d, %d\n", own, shared);
            return -1;
        }
        /* the replay loop (no event rows) against the per-call core, configuration by
         * configuration (one that runs out of slots stops the batch at its first error) */
        for (int32_t i = 0; i < n_cfg; ++i) {
            std::vector<moecache_replay_token> ref(static_cast<size_t>(n_tokens));
            std::vector<moecache_replay_token> fast(ref.size());
            std::vector<moecache_event> ev(static_cast<size_t>(rows));
            const int32_t c_ref = moecache_replay_batch(&tr, &configs[i], 1, 1, ref.data(),
                                                        ev.data());
            const int32_t c_fast = moecache_replay_batch(&tr, &configs[i], 1, 1, fast.data(),
                                                         nullptr);
            if (c_ref != c_fast || !same_tokens(ref, fast)) {
                std::fprintf(stderr, "the replay loop differs from the per-call core: round %d, "
                             "configuration %d (codes %d, %d)\n", round, i, c_ref, c_fast);
                return -1;
            }
            fast_expected += moecache_core::fast_covers(tr, configs[i], true, false);
        }
        /* and a whole batch with its own ranking, on 2 threads */
        std::vector<moecache_replay_token> c(a.size());
        tr.ranks = nullptr;
        tr.rank_counts = nullptr;
        tr.selected_probs = nullptr;
        const int32_t own_fast = moecache_replay_batch(&tr, configs.data(), n_cfg, 2, c.data(),
                                                       nullptr);
        if (own_fast != own || !same_tokens(a, c)) {
            std::fprintf(stderr, "a batch through the replay loop differs\n");
            return -1;
        }
        /* on one thread each configuration's smaller budgets have finished before it: the
         * runs it takes are certain (substitute-all without fill_free keeps the first row's k
         * experts, so its run at k slots is its run at every budget here) */
        {
            std::vector<moecache_replay_token> one(a.size());
            const int64_t before = moecache_core::replay_reused_configs.load();
            const int32_t code = moecache_replay_batch(&tr, configs.data(), n_cfg, 1,
                                                       one.data(), nullptr);
            const int64_t took = moecache_core::replay_reused_configs.load() - before;
            if (code != own || !same_tokens(a, one) || took < 4) {
                std::fprintf(stderr, "a batch on one thread differs (code %d) or reused %lld "
                             "runs\n", code, static_cast<long long>(took));
                return -1;
            }
            reused_one += took;
        }
        /* the same batch counted on a control: the same totals and code, and every
         * configuration and layer counted (one that failed counts whole) */
        moecache_replay_control * ctl = moecache_replay_control_new();
        std::vector<moecache_replay_token> d(a.size());
        const int32_t counted = moecache_replay_batch_ctl(&tr, configs.data(), n_cfg, 2,
                                                          d.data(), nullptr, ctl);
        int64_t done = -1, units = -1, total = -1;
        moecache_replay_progress(ctl, &done, &units, &total);
        moecache_replay_control_free(ctl);
        if (counted != own_fast || !same_tokens(c, d) ||
            done != n_cfg || units != total || total != static_cast<int64_t>(n_cfg) * n_layers) {
            std::fprintf(stderr, "a counted batch differs: code %d, %lld configurations, "
                         "%lld of %lld units\n", counted, static_cast<long long>(done),
                         static_cast<long long>(units), static_cast<long long>(total));
            return -1;
        }
        /* a kept plan (moecache_replay_plan_new), made with the trace's ranking and with its
         * own: the same codes and totals, event rows included, and refused for a trace it
         * was not made for (here: the same rows at another address) */
        const std::vector<int32_t> ids_copy = ids;
        for (const bool shared_ranks : {true, false}) {
            tr.ranks = shared_ranks ? ranks.data() : nullptr;
            tr.rank_counts = shared_ranks ? counts.data() : nullptr;
            tr.selected_probs = shared_ranks ? selected.data() : nullptr;
            moecache_replay_plan * plan = moecache_replay_plan_new(&tr, 2);
            std::vector<moecache_replay_token> e(a.size()), f(a.size());
            std::vector<moecache_event> ee(ea.size());
            const int32_t kept = moecache_replay_batch_plan(&tr, plan, configs.data(), n_cfg, 2,
                                                            e.data(), nullptr, nullptr);
            const int32_t kept_rows = moecache_replay_batch_plan(
                &tr, plan, configs.data(), n_cfg, 2, f.data(), ee.data(), nullptr);
            moecache_replay_trace other = tr;
            other.ids = ids_copy.data();
            const int32_t refused = moecache_replay_batch_plan(&other, plan, configs.data(),
                                                               n_cfg, 2, f.data(), nullptr,
                                                               nullptr);
            const bool rows_same =
                kept_rows != MOECACHE_OK ||
                std::equal(ea.begin(), ea.end(), ee.begin(), [](const moecache_event & x,
                                                                 const moecache_event & y) {
                    return std::equal(x.used_ids, x.used_ids + x.k, y.used_ids) &&
                           std::equal(x.slots, x.slots + x.k, y.slots) &&
                           x.n_admit == y.n_admit && x.n_evict == y.n_evict;
                });
            if (plan == nullptr || moecache_replay_plan_bytes(plan) <= 0 || kept != own_fast ||
                !same_tokens(c, e) || kept_rows != own || !rows_same ||
                !same_tokens(a, f) ||
                refused != MOECACHE_E_ARG) {
                std::fprintf(stderr, "a batch over a kept plan differs: round %d, codes %d, "
                             "%d, %d\n", round, kept, kept_rows, refused);
                moecache_replay_plan_free(plan);
                return -1;
            }
            moecache_replay_plan_free(plan);
        }
        decisions += rows * n_cfg * 4;
    }
    /* the loop ran (most configurations qualify); counted without the last batches */
    const int64_t ran = moecache_core::replay_fast_configs.load() - fast_before;
    if (fast_expected < 100 || ran < fast_expected) {
        std::fprintf(stderr, "the replay loop ran %lld configurations, expected %lld\n",
                     static_cast<long long>(ran), static_cast<long long>(fast_expected));
        return -1;
    }
    /* psr and random prefetching policies at few slots took the victim scan */
    const int64_t scanned = moecache_core::replay_scan_configs.load() - scan_before;
    if (scanned < 20) {
        std::fprintf(stderr, "the replay loop's victim scan ran %lld configurations\n",
                     static_cast<long long>(scanned));
        return -1;
    }
    std::printf("replay loop: %lld configurations against the per-call core (%lld by victim "
                "scan; the batches on one thread took %lld runs from smaller budgets or equal "
                "configurations)\n", static_cast<long long>(fast_expected),
                static_cast<long long>(scanned), static_cast<long long>(reused_one));
    return decisions;
}

/* The vector ranking (moecache_core::rank_row) against the scalar reference, entry for entry,
 * over rows that take each of its paths: every expert count from 1 to 600 (thresholds found
 * by the selection or by nth_element, tails beyond a multiple of 64), softmax-like rows,
 * coarse values with ties (sorted instead of placed), rows mostly of one value (more than
 * 128 candidates), +-0, negatives, infinities and NaNs. Returns the rows compared, -1 on a
 * difference. */
int64_t rankings_equal(std::mt19937 & rng) {
    int64_t rows = 0;
    std::vector<uint16_t> a(MOECACHE_RANK_WIDTH), b(MOECACHE_RANK_WIDTH);
    for (int32_t n = 1; n <= 600; ++n) {
        moecache_core::RankScratch sa(n), sb(n);
        std::vector<float> row(static_cast<size_t>(n));
        for (int kind = 0; kind < 8; ++kind) {
            for (int rep = 0; rep < (n % 64 == 0 ? 40 : 4); ++rep) {
                std::normal_distribution<float> logit(0.0f, 1.0f + static_cast<float>(kind));
                for (int32_t e = 0; e < n; ++e) {
                    float & v = row[static_cast<size_t>(e)];
                    switch (kind) {
                        case 0: case 1: v = std::exp(logit(rng)); break;          // distinct
                        case 2: v = static_cast<float>(rng() % 16) / 16.0f; break; // ties
                        case 3: v = rng() % 8 == 0 ? 0.5f : 0.0f; break;          // one value
                        case 4: v = logit(rng); break;                            // negatives
                        case 5: v = rng() % 2 ? 0.0f : -0.0f; break;              // +-0 only
                        default: v = std::exp(logit(rng)) * (rng() % 3 == 0 ? 0.0f : 1.0f);
                    }
                }
                if (kind == 6) {
                    row[rng() % static_cast<uint32_t>(n)] = std::numeric_limits<float>::infinity();
                    row[rng() % static_cast<uint32_t>(n)] = -std::numeric_limits<float>::infinity();
                }
                if (kind == 7 || rng() % 50 == 0) {
                    row[rng() % static_cast<uint32_t>(n)] = std::nanf("");
                }
                const int32_t ca = moecache_core::rank_row(row.data(), n, sa, a.data());
                const int32_t cb = moecache_core::rank_row_reference(row.data(), n, sb, b.data());
                if (ca != cb || !std::equal(a.begin(), a.begin() + ca, b.begin())) {
                    std::fprintf(stderr, "rank_row differs from its reference (%d experts, "
                                 "kind %d: %d vs %d ranked)\n", n, kind, ca, cb);
                    return -1;
                }
                ++rows;
            }
        }
    }
    return rows;
}


/* Traces whose layers each route to a working set of m of their experts (predictions drawn
 * from it too): every policy, frequency and PSR ones included, has budgets (m and up) it never
 * fills, so a batch takes runs across budgets for all of them. Each configuration of a batch
 * on one and on two threads (runs taken) must equal the per-call core's run of it alone
 * (event rows asked for), code included. Returns the runs taken on one thread, or -1. */
int64_t batch_reuse(std::mt19937 & rng, const char * const * names) {
    int64_t took_total = 0;
    for (int round = 0; round < 6; ++round) {
        const int32_t n_layers = 3;
        const int32_t n_experts = 48 + static_cast<int32_t>(rng() % 32);
        const int32_t k = 2 + static_cast<int32_t>(rng() % 4);
        const int32_t m = k + 4 + static_cast<int32_t>(rng() % 10);
        const int64_t n_tokens = 90;
        const int32_t width = 8;
        /* odd rounds: the working set is the lowest ids and no row predicts: PSR then takes
         * the lowest ids (the unranked tie), so a policy prefetching more than m experts
         * prefetches more at each budget above m (a run at m is not its run there) */
        const bool low = round % 2 == 1;
        std::vector<std::vector<int32_t>> work(static_cast<size_t>(n_layers));
        for (auto & ws : work) {
            std::vector<int32_t> perm(static_cast<size_t>(n_experts));
            for (int32_t e = 0; e < n_experts; ++e) {
                perm[static_cast<size_t>(e)] = e;
            }
            if (!low) {
                std::shuffle(perm.begin(), perm.end(), rng);
            }
            ws.assign(perm.begin(), perm.begin() + m);
        }
        TraceData data;
        auto & predicted = data.predicted;
        int64_t rows = 0;
        for (int64_t t = 0; t < n_tokens; ++t) {
            for (int32_t layer = 0; layer < n_layers; ++layer) {
                const int32_t n_tok = rng() % 8 == 0 ? 2 : 1;
                data.begin_call(t, layer, rows);
                for (int32_t i = 0; i < n_tok; ++i, ++rows) {
                    const std::vector<int32_t> & ws = work[static_cast<size_t>(layer)];
                    std::vector<int32_t> perm = ws;
                    data.push_probs(rng, n_experts);
                    data.push_selection(rng, perm, m, k, layer, n_layers);
                    const std::vector<int32_t> & nws =
                        work[static_cast<size_t>((layer + 1) % n_layers)];
                    const int32_t stop = low ? 0
                                         : rng() % 6 == 0 ? static_cast<int32_t>(rng() % width)
                                                          : width;
                    for (int32_t j = 0; j < width; ++j) {
                        predicted.push_back(j < stop ? nws[rng() % static_cast<uint32_t>(m)]
                                                     : -1);
                    }
                }
                data.end_call(rows);
            }
            data.end_token();
        }
        if (data.rank(rows, n_experts, k, 1) != MOECACHE_OK) {
            std::fprintf(stderr, "reuse: ranking failed\n");
            return -1;
        }
        moecache_replay_trace tr = data.trace(n_layers, n_experts, k, width, rows, n_tokens);
        tr.start_slots = m;
        moecache_preset(names[rng() % 8], &tr.start_policy);
        tr.ranks = data.ranks.data();
        tr.rank_counts = data.counts.data();
        tr.selected_probs = data.selected.data();
        std::vector<moecache_replay_config> configs;
        auto add = [&](const moecache_policy & p, int32_t slots) {
            moecache_replay_config cfg{};
            cfg.policy = p;
            cfg.slots = slots;
            configs.push_back(cfg);
        };
        for (int i = 0; i < 8; ++i) {
            moecache_policy p{};
            moecache_preset(names[i], &p);
            for (const int32_t slots : {k, m - 1, m, m + 1, m + 7, n_experts - 1, n_experts}) {
                add(p, std::max(k, std::min(slots, n_experts)));
            }
        }
        for (int i = 0; i < 10; ++i) {
            const moecache_policy p = custom_policy(rng);
            for (const int32_t slots : {m - 2, m, m + 3, n_experts}) {
                add(p, std::max(k, std::min(slots, n_experts)));
            }
        }
        for (const char * name : {"exact", "substitute-all", "speed-first"}) {
            moecache_policy p{};
            moecache_preset(name, &p);
            p.prefetch = m + 3;
            for (const int32_t slots : {m, m + 1, m + 3, m + 5, n_experts}) {
                add(p, std::min(slots, n_experts));
            }
        }
        for (const int32_t slots : {0, m + 2}) {
            moecache_replay_config cfg{};
            cfg.follow_policy = 1;
            cfg.slots = slots;
            configs.push_back(cfg);
        }
        const int32_t n_cfg = static_cast<int32_t>(configs.size());
        const size_t nt = static_cast<size_t>(n_tokens);
        std::vector<moecache_replay_token> one(nt * configs.size()), two(one.size());
        const int64_t before = moecache_core::replay_reused_configs.load();
        const int32_t c_one = moecache_replay_batch(&tr, configs.data(), n_cfg, 1, one.data(),
                                                    nullptr);
        const int64_t took = moecache_core::replay_reused_configs.load() - before;
        const int32_t c_two = moecache_replay_batch(&tr, configs.data(), n_cfg, 2, two.data(),
                                                    nullptr);
        int32_t first_error = MOECACHE_OK;
        for (int32_t i = 0; i < n_cfg; ++i) {
            std::vector<moecache_replay_token> ref(nt);
            std::vector<moecache_event> ev(static_cast<size_t>(rows));
            const int32_t c_ref = moecache_replay_batch(&tr, &configs[i], 1, 1, ref.data(),
                                                        ev.data());
            if (first_error == MOECACHE_OK) {
                first_error = c_ref;
            }
            /* every configuration's totals are compared, a batch that ran out of slots
             * somewhere included: each configuration's are its own (zero from its error on) */
            const std::vector<moecache_replay_token> a(one.begin() + i * nt,
                                                       one.begin() + (i + 1) * nt);
            const std::vector<moecache_replay_token> b(two.begin() + i * nt,
                                                       two.begin() + (i + 1) * nt);
            if (!same_tokens(ref, a) || !same_tokens(ref, b)) {
                std::fprintf(stderr, "reuse: round %d configuration %d (slots %d of %d, working "
                             "set %d, rule %d, eviction %d, prefetch %d, admission %d) differs "
                             "from the per-call core\n", round, i, configs[i].slots, n_experts,
                             m, configs[i].policy.miss_rule, configs[i].policy.eviction,
                             configs[i].policy.prefetch, configs[i].policy.admission);
                return -1;
            }
        }
        if (c_one != first_error || c_two != first_error || took < 8 * 3) {
            std::fprintf(stderr, "reuse: round %d codes %d, %d (per-call %d), %lld runs taken\n",
                         round, c_one, c_two, first_error, static_cast<long long>(took));
            return -1;
        }
        took_total += took;
    }
    return took_total;
}


/* Traces routed as a router routes: each row's selections are its own top-k (probability
 * descending, ties by lower id; now and then the router order shuffled), so the shared
 * ranking's head is the row's own selections and the replay loop's copy of it (without
 * them) is short or empty. Top-k 32 and 31, n_experts == top_k and just above it, rows
 * whose sampled threshold ranks fewer experts than the row selects (a filtered count of 0
 * that did not name every expert), NaN rows, prompts (one call of many rows, repeating
 * experts across its rows) and short multi-row calls; frequency configurations of several
 * half-lives in one batch, the first not the default one (the plan's keys then fit some
 * configurations and not others). Each configuration alone, the whole batch (own ranking
 * and the trace's, two threads) and a kept plan must equal the per-call core's run to the
 * bit. Returns the configurations compared, or -1. */
int64_t batch_routed(std::mt19937 & rng, const char * const * names) {
    int64_t compared = 0;
    int64_t short_rows = 0; /* ranked rows whose ranking holds only the row's own */
    int64_t all_rows = 0;   /* rows ranked in full, some of the ranking the row's own */
    for (int round = 0; round < 8; ++round) {
        const int32_t n_layers = 2;
        int32_t k = 0, n_experts = 0;
        switch (round) {
            case 0: k = 32; n_experts = 32; break;
            case 1: k = 32; n_experts = 33; break;
            case 2: k = 32; n_experts = 40 + static_cast<int32_t>(rng() % 30); break;
            case 3: k = 31; n_experts = 100 + static_cast<int32_t>(rng() % 150); break;
            case 4: k = 2 + static_cast<int32_t>(rng() % 10); n_experts = k; break;
            case 5: k = 4 + static_cast<int32_t>(rng() % 8);
                    n_experts = 65 + static_cast<int32_t>(rng() % 200); break;
            case 6: k = 1; n_experts = 20 + static_cast<int32_t>(rng() % 100); break;
            default: k = 16 + static_cast<int32_t>(rng() % 16);
                     n_experts = 200 + static_cast<int32_t>(rng() % 200);
        }
        const int64_t n_tokens = 50;
        const int32_t width = 8;
        TraceData data;
        auto & probs = data.probs;
        int64_t rows = 0;
        std::normal_distribution<float> logit(0.0f, 2.0f);
        std::vector<int32_t> order(static_cast<size_t>(n_experts));
        for (int64_t t = 0; t < n_tokens; ++t) {
            for (int32_t layer = 0; layer < n_layers; ++layer) {
                const int32_t n_tok = t == 0 ? 3 + static_cast<int32_t>(rng() % 12)
                                      : rng() % 8 == 0 ? 2 + static_cast<int32_t>(rng() % 3)
                                                       : 1;
                data.begin_call(t, layer, rows);
                for (int32_t i = 0; i < n_tok; ++i, ++rows) {
                    const size_t at = probs.size();
                    const int32_t shape = static_cast<int32_t>(rng() % 4);
                    const int32_t stride = std::max(1, n_experts / 64);
                    for (int32_t e = 0; e < n_experts; ++e) {
                        float v;
                        if (shape == 0) {
                            v = std::exp(logit(rng)) / static_cast<float>(1 + e % 7);
                        } else if (shape == 1) {
                            v = static_cast<float>(rng() % 8) / static_cast<float>(1 + e % 5);
                        } else if (shape == 2 && n_experts > 64) {
                            /* big only where the threshold's sample looks: it ranks few */
                            v = e % stride == 0 && e / stride < 20
                                    ? 4.0f + static_cast<float>(rng() % 6)
                                    : static_cast<float>(rng() % 3) / 64.0f;
                        } else {
                            v = rng() % 6 == 0 ? 0.5f : 0.25f; /* mostly one value */
                        }
                        probs.push_back(v);
                    }
                    const float * row = probs.data() + at;
                    for (int32_t e = 0; e < n_experts; ++e) {
                        order[static_cast<size_t>(e)] = e;
                    }
                    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                                      [&](int32_t a, int32_t b) {
                                          return row[a] != row[b] ? row[a] > row[b] : a < b;
                                      });
                    if (rng() % 6 == 0) {
                        std::shuffle(order.begin(), order.begin() + k, rng);
                    }
                    for (int32_t j = 0; j < k; ++j) {
                        const int32_t e = order[static_cast<size_t>(j)];
                        data.ids.push_back(e);
                        data.weights.push_back(row[e] + 0.01f * static_cast<float>(rng() % 3));
                    }
                    if (rng() % 80 == 0) { /* now and then a NaN, after the selection */
                        probs[at + rng() % static_cast<uint32_t>(n_experts)] = std::nanf("");
                    }
                    data.next_layer.push_back(layer + 1 < n_layers ? layer + 1 : -1);
                    const int32_t stop = rng() % 5 == 0 ? static_cast<int32_t>(rng() % width)
                                                        : width;
                    for (int32_t j = 0; j < width; ++j) {
                        int32_t e = static_cast<int32_t>(rng() % static_cast<uint32_t>(
                            std::min(n_experts, 2 * k + 4)));
                        if (j > 0 && rng() % 7 == 0) {
                            e = data.predicted[data.predicted.size() - 1];
                        }
                        data.predicted.push_back(j < stop ? e : -1);
                    }
                }
                data.end_call(rows);
            }
            data.end_token();
        }
        if (data.rank(rows, n_experts, k, 2) != MOECACHE_OK ||
            !ranking_ok(probs, rows, n_experts, data.ranks, data.counts)) {
            std::fprintf(stderr, "routed: ranking differs from the probabilities\n");
            return -1;
        }
        for (int64_t r = 0; r < rows; ++r) {
            const int32_t named = data.counts[static_cast<size_t>(r)];
            int32_t own = 0;
            for (int32_t j = 0; j < named; ++j) {
                const int32_t e = data.ranks[static_cast<size_t>(r) * MOECACHE_RANK_WIDTH + j];
                own += std::count(data.ids.begin() + r * k, data.ids.begin() + (r + 1) * k, e) > 0;
            }
            short_rows += named > 0 && own == named && named < n_experts;
            all_rows += named >= n_experts && own > 0;
        }
        moecache_replay_trace tr = data.trace(n_layers, n_experts, k, width, rows, n_tokens);
        tr.start_slots = std::min(n_experts, k + static_cast<int32_t>(rng() % 8));
        moecache_preset(names[rng() % 8], &tr.start_policy);
        std::vector<moecache_replay_config> configs;
        auto add = [&](const moecache_policy & p, int32_t slots) {
            moecache_replay_config cfg{};
            cfg.policy = p;
            cfg.slots = std::max(k, std::min(slots, n_experts));
            configs.push_back(cfg);
        };
        /* frequency first at a half-life that is not the presets' */
        for (const float h : {7.0f, 0.75f, MOECACHE_DEFAULT_HALF_LIFE}) {
            moecache_policy p{};
            moecache_preset(rng() % 2 ? "psr" : "quality-first", &p);
            p.half_life = h;
            add(p, k + static_cast<int32_t>(rng() % (n_experts - k + 1)));
        }
        for (int i = 0; i < 8; ++i) {
            moecache_policy p{};
            moecache_preset(names[i], &p);
            for (const int32_t slots : {k, k + 1, k + 3, n_experts / 4, n_experts / 2 + 1,
                                        n_experts - 1, n_experts}) {
                add(p, slots);
            }
        }
        for (int i = 0; i < 8; ++i) {
            add(custom_policy(rng), k + static_cast<int32_t>(rng() % (n_experts - k + 1)));
        }
        {
            moecache_replay_config cfg{};
            cfg.follow_policy = 1;
            configs.push_back(cfg);
        }
        const int32_t n_cfg = static_cast<int32_t>(configs.size());
        const size_t nt = static_cast<size_t>(n_tokens);
        /* each configuration alone: the per-call core (event rows) against the loop */
        std::vector<moecache_replay_token> ref(nt * configs.size());
        std::vector<int32_t> codes(configs.size());
        std::vector<moecache_event> ev(static_cast<size_t>(rows));
        for (const bool shared : {false, true}) {
            tr.ranks = shared ? data.ranks.data() : nullptr;
            tr.rank_counts = shared ? data.counts.data() : nullptr;
            tr.selected_probs = shared ? data.selected.data() : nullptr;
            for (int32_t i = 0; i < n_cfg; ++i) {
                std::vector<moecache_replay_token> one(nt), fast(nt);
                const int32_t c_ref = moecache_replay_batch(&tr, &configs[i], 1, 1, one.data(),
                                                            ev.data());
                const int32_t c_fast = moecache_replay_batch(&tr, &configs[i], 1, 1,
                                                             fast.data(), nullptr);
                if (c_ref != c_fast || !same_tokens(one, fast) ||
                    (shared && (c_ref != codes[static_cast<size_t>(i)] ||
                                std::memcmp(one.data(), ref.data() + i * nt,
                                            nt * sizeof(moecache_replay_token)) != 0))) {
                    std::fprintf(stderr, "routed: round %d configuration %d (k %d of %d experts, "
                                 "slots %d, rule %d, eviction %d, half-life %g, prefetch %d) "
                                 "differs from the per-call core (codes %d, %d)\n", round, i, k,
                                 n_experts, configs[i].slots, configs[i].policy.miss_rule,
                                 configs[i].policy.eviction,
                                 static_cast<double>(configs[i].policy.half_life),
                                 configs[i].policy.prefetch, c_ref, c_fast);
                    return -1;
                }
                std::memcpy(ref.data() + i * nt, one.data(), nt * sizeof(moecache_replay_token));
                codes[static_cast<size_t>(i)] = c_ref;
                compared += moecache_core::fast_covers(tr, configs[i], true, false);
            }
            /* the whole batch (one plan, its keys for the first frequency half-life) and a
             * kept plan (keys for the presets' half-life) */
            std::vector<moecache_replay_token> all(ref.size()), kept(ref.size());
            const int32_t c_all = moecache_replay_batch(&tr, configs.data(), n_cfg, 2,
                                                        all.data(), nullptr);
            moecache_replay_plan * plan = moecache_replay_plan_new(&tr, 2);
            const bool planned = plan != nullptr;
            const int32_t c_kept = moecache_replay_batch_plan(&tr, plan, configs.data(), n_cfg,
                                                              2, kept.data(), nullptr, nullptr);
            moecache_replay_plan_free(plan);
            int32_t first_error = MOECACHE_OK;
            for (const int32_t c : codes) {
                first_error = first_error == MOECACHE_OK ? c : first_error;
            }
            if (!planned || c_all != first_error || c_kept != first_error ||
                !same_tokens(ref, all) || !same_tokens(ref, kept)) {
                std::fprintf(stderr, "routed: round %d: a batch (codes %d, %d; per-call %d) "
                             "differs from its configurations alone\n", round, c_all, c_kept,
                             first_error);
                return -1;
            }
        }
    }
    if (short_rows < 50 || all_rows < 50) {
        std::fprintf(stderr, "routed: %lld rows ranked only their own, %lld ranked in full\n",
                     static_cast<long long>(short_rows), static_cast<long long>(all_rows));
        return -1;
    }
    std::printf("routed: %lld configurations over top-k routed rows (%lld rows ranking only "
                "their own selections, %lld ranked in full) equal to the per-call core\n",
                static_cast<long long>(compared), static_cast<long long>(short_rows),
                static_cast<long long>(all_rows));
    return compared;
}

}  // namespace

int main() {
    const char * names[] = {"exact", "quality-first", "speed-first", "cache-prior", "psr",
                            "substitute-all", "threshold", "first-choice"};
    std::mt19937 rng(12345);
    int64_t decisions = 0;
    for (int round = 0; round < 64; ++round) {
        const int32_t n_layers = 2;
        /* the last rounds: more residents than the kept frequency order holds */
        const int32_t n_experts = round < 48 ? 16 + static_cast<int32_t>(rng() % 48)
                                             : 80 + static_cast<int32_t>(rng() % 120);
        const int32_t k = 1 + static_cast<int32_t>(rng() % 8);
        const int32_t slots = k + static_cast<int32_t>(rng() % (n_experts - k + 1));
        moecache_policy p{};
        moecache_preset(names[round % 8], &p);
        if (round >= 48 && slots < 40) {
            continue;
        }
        moecache * c = moecache_create(n_layers, n_experts, k, slots, &p);
        if (c == nullptr) {
            std::fprintf(stderr, "create failed\n");
            return 1;
        }
        moecache_set_event_capacity(c, 0);
        std::vector<float> probs, weights, scores(static_cast<size_t>(n_experts));
        std::vector<int32_t> ids, out_ids, out_slots;
        std::vector<moecache_copy> plan(static_cast<size_t>(n_experts) * 8);
        for (int step = 0; step < 300; ++step) {
            moecache_begin_step(c);
            if (rng() % 50 == 0) {
                moecache_preset(names[rng() % 8], &p);
                moecache_set_policy(c, &p);
            }
            if (rng() % 60 == 0) {
                moecache_set_slots(c, k + static_cast<int32_t>(rng() % (n_experts - k + 1)));
            }
            for (int32_t layer = 0; layer < n_layers; ++layer) {
                const int32_t n_tok = rng() % 10 == 0 ? 1 + static_cast<int32_t>(rng() % 4) : 1;
                probs.assign(static_cast<size_t>(n_tok) * n_experts, 0.0f);
                ids.clear();
                for (int32_t t = 0; t < n_tok; ++t) {
                    float * row = probs.data() + static_cast<size_t>(t) * n_experts;
                    for (int32_t e = 0; e < n_experts; ++e) {
                        /* coarse values so that ties happen; popular low ids */
                        row[e] = static_cast<float>(rng() % 8) / static_cast<float>(1 + e % 5);
                    }
                    if (rng() % 200 == 0) {
                        row[rng() % n_experts] = std::nanf("");
                    }
                    std::vector<int32_t> perm(static_cast<size_t>(n_experts));
                    for (int32_t e = 0; e < n_experts; ++e) {
                        perm[static_cast<size_t>(e)] = e;
                    }
                    for (int32_t j = 0; j < k; ++j) {
                        const int32_t pick = j + static_cast<int32_t>(rng() % (n_experts - j));
                        std::swap(perm[static_cast<size_t>(j)], perm[static_cast<size_t>(pick)]);
                        ids.push_back(perm[static_cast<size_t>(j)]);
                    }
                }
                weights.resize(ids.size());
                for (size_t i = 0; i < ids.size(); ++i) {
                    weights[i] = 0.05f + static_cast<float>(rng() % 10) / 10.0f;
                }
                out_ids.resize(ids.size());
                out_slots.resize(ids.size());
                int32_t n_plan = 0;
                moecache_route(c, layer, n_tok, probs.data(), ids.data(), weights.data(),
                               out_ids.data(), out_slots.data(), plan.data(),
                               static_cast<int32_t>(plan.size()), &n_plan);
                decisions += n_tok;
                if (rng() % 2 == 0) {
                    for (float & s : scores) {
                        s = static_cast<float>(rng() % 6);
                    }
                    moecache_prefetch(c, (layer + 1) % n_layers, 1, scores.data(), plan.data(),
                                      static_cast<int32_t>(plan.size()), &n_plan);
                }
            }
        }
        moecache_destroy(c);
    }
    const int64_t ranked = rankings_equal(rng);
    if (ranked < 0) {
        return 1;
    }
    const int64_t replayed = batch_replays(rng, names);
    if (replayed < 0) {
        return 1;
    }
    const int64_t reused = batch_reuse(rng, names);
    if (reused < 0) {
        return 1;
    }
    if (batch_routed(rng, names) < 0) {
        return 1;
    }
    std::printf("reuse: %lld runs taken over working-set traces, each equal to the per-call "
                "core's\n", static_cast<long long>(reused));
#ifdef MOECACHE_SELFCHECK
    const char * picks = "every pick equal to the reference scan";
#else
    const char * picks = "release build: totals only, picks unchecked";
#endif
    std::printf("selfcheck: %lld route rows and %lld batch-replayed rows, %s; %lld rows ranked "
                "as the reference ranks them\n",
                static_cast<long long>(decisions), static_cast<long long>(replayed), picks,
                static_cast<long long>(ranked));
    return 0;
}
