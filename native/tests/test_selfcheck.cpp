/*
 * test_selfcheck.cpp — the core's fast paths against its reference scans.
 *
 * Built from the core's sources with MOECACHE_SELFCHECK, under which every victim and every
 * substitute the indexed paths pick (LRU order list, frequency victim queue, one-scan
 * substitutes) is compared with a full scan of the layer's slots, aborting on the first
 * difference. This drives random routing through every preset, budget shrinks and growths,
 * policy changes between LRU and frequency, multi-token calls, prefetches, ties and NaN
 * probabilities, so that any decision the indexes would change fails the test.
 */
#include "moecache.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main() {
    const char * names[] = {"exact", "quality-first", "speed-first", "cache-prior", "psr",
                            "substitute-all", "threshold", "first-choice"};
    std::mt19937 rng(12345);
    int64_t decisions = 0;
    for (int round = 0; round < 48; ++round) {
        const int32_t n_layers = 2;
        const int32_t n_experts = 16 + static_cast<int32_t>(rng() % 48);
        const int32_t k = 1 + static_cast<int32_t>(rng() % 8);
        const int32_t slots = k + static_cast<int32_t>(rng() % (n_experts - k + 1));
        moecache_policy p{};
        moecache_preset(names[round % 8], &p);
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
    std::printf("selfcheck: %lld route rows, every pick equal to the reference scan\n",
                static_cast<long long>(decisions));
    return 0;
}
