/*
 * test_moecache.cpp — the basics of the C API, with no Python in the way.
 * The behaviour-by-behaviour acceptance tests live in tests/native/ (pytest, through ctypes).
 */
#include "moecache.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

static int g_failures = 0;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            g_failures += 1;                                                     \
        }                                                                        \
    } while (0)

namespace {

constexpr int kExperts = 16;
constexpr int kTopK = 2;

/* One token's router output: ids in router order with their weights; probs decrease with
 * expert id unless given. */
struct Token {
    std::vector<float> probs = std::vector<float>(kExperts, 0.0f);
    std::vector<int32_t> ids;
    std::vector<float> weights;
};

Token token(int32_t a, float wa, int32_t b, float wb) {
    Token t;
    for (int e = 0; e < kExperts; ++e) {
        t.probs[e] = 0.01f * static_cast<float>(kExperts - e);
    }
    t.ids = {a, b};
    t.weights = {wa, wb};
    t.probs[a] = wa;
    t.probs[b] = wb;
    return t;
}

struct Result {
    int32_t rc;
    std::vector<int32_t> out_ids, out_slots;
    std::vector<float> weights;
    std::vector<moecache_copy> plan;
};

Result route(moecache * c, int32_t layer, const Token & t) {
    Result r;
    r.out_ids.resize(kTopK);
    r.out_slots.resize(kTopK);
    r.weights = t.weights;
    r.plan.resize(kExperts);
    int32_t n_plan = 0;
    r.rc = moecache_route(c, layer, 1, t.probs.data(), t.ids.data(), r.weights.data(),
                          r.out_ids.data(), r.out_slots.data(), r.plan.data(), kExperts, &n_plan);
    r.plan.resize(n_plan);
    return r;
}

moecache_policy preset(const char * name) {
    moecache_policy p{};
    CHECK(moecache_preset(name, &p) == MOECACHE_OK);
    return p;
}

void test_presets() {
    const char * names[] = {"exact", "quality-first", "speed-first", "substitute-all",
                            "threshold", "first-choice"};
    for (const char * n : names) {
        moecache_policy p{};
        CHECK(moecache_preset(n, &p) == MOECACHE_OK);
    }
    moecache_policy p{};
    CHECK(moecache_preset("nonsense", &p) == MOECACHE_E_ARG);
    CHECK(preset("quality-first").miss_rule == MOECACHE_THRESHOLD);
    CHECK(preset("quality-first").admission == 1);
    CHECK(preset("speed-first").miss_rule == MOECACHE_FIRST_CHOICE);
    CHECK(preset("exact").eviction == MOECACHE_EVICT_LRU);
}

void test_create_rejects_bad_shapes() {
    CHECK(moecache_create(0, kExperts, kTopK, 4, nullptr) == nullptr);
    CHECK(moecache_create(1, kExperts, kTopK, 1, nullptr) == nullptr);  /* slots < k */
    CHECK(moecache_create(1, kExperts, 40, kExperts, nullptr) == nullptr);
    moecache_policy bad = preset("exact");
    bad.half_life = 0.0f;
    CHECK(moecache_create(1, kExperts, kTopK, 4, &bad) == nullptr);
}

void test_fetch_then_hit() {
    moecache * c = moecache_create(2, kExperts, kTopK, 4, nullptr);
    moecache_set_expert_bytes(c, 1, 100);
    moecache_begin_step(c);
    Result r = route(c, 1, token(3, 0.7f, 5, 0.3f));
    CHECK(r.rc == MOECACHE_OK);
    CHECK(r.plan.size() == 2);
    CHECK(r.plan[0].expert == 3 && r.plan[0].slot == 0 && r.plan[0].async == 0);
    CHECK(r.plan[1].expert == 5 && r.plan[1].slot == 1 && r.plan[1].layer == 1);
    CHECK(r.out_ids[0] == 3 && r.out_slots[0] == 0);
    moecache_begin_step(c);
    r = route(c, 1, token(5, 0.6f, 3, 0.4f));
    CHECK(r.rc == MOECACHE_OK && r.plan.empty());
    CHECK(r.out_slots[0] == 1 && r.out_slots[1] == 0);
    moecache_layer_stats s{};
    moecache_get_layer_stats(c, 1, &s);
    CHECK(s.tokens == 2 && s.hits == 2 && s.fetches == 2 && s.substitutions == 0);
    CHECK(s.bytes_sync == 200);
    moecache_destroy(c);
}

void test_threshold_substitutes_small_miss() {
    moecache_policy p = preset("threshold");
    moecache * c = moecache_create(1, kExperts, kTopK, 4, &p);
    route(c, 0, token(0, 0.5f, 1, 0.5f));
    route(c, 0, token(2, 0.5f, 3, 0.5f));
    /* expert 9 is missing with weight 0.1 < 0.15: substituted by the resident expert with
     * the highest probability that the token does not use (0 is used, 1 has 0.15). */
    Token t = token(0, 0.9f, 9, 0.1f);
    t.probs[1] = 0.15f;
    Result r = route(c, 0, t);
    CHECK(r.rc == MOECACHE_OK && r.plan.empty());
    CHECK(r.out_ids[0] == 0 && r.out_ids[1] == 1);
    CHECK(std::fabs(r.weights[1] - 0.1f) < 1e-7f);
    moecache_layer_stats s{};
    moecache_get_layer_stats(c, 0, &s);
    CHECK(s.substitutions == 1);
    CHECK(std::fabs(s.substituted_mass - 0.1) < 1e-6);
    moecache_destroy(c);
}

void test_lru_evicts_least_recent() {
    moecache * c = moecache_create(1, kExperts, kTopK, 4, nullptr);
    route(c, 0, token(0, 0.5f, 1, 0.5f));
    route(c, 0, token(2, 0.5f, 3, 0.5f));
    route(c, 0, token(0, 0.5f, 1, 0.5f)); /* 2, 3 are now least recent */
    Result r = route(c, 0, token(4, 0.5f, 5, 0.5f));
    std::vector<int32_t> slot_of(kExperts);
    moecache_layer_experts(c, 0, slot_of.data());
    CHECK(slot_of[2] < 0 && slot_of[3] < 0);
    CHECK(slot_of[0] >= 0 && slot_of[1] >= 0 && slot_of[4] >= 0 && slot_of[5] >= 0);
    CHECK(r.plan.size() == 2);
    moecache_destroy(c);
}

void test_batch_without_room_changes_nothing() {
    moecache * c = moecache_create(1, kExperts, kTopK, 2, nullptr);
    route(c, 0, token(0, 0.5f, 1, 0.5f));
    Token a = token(2, 0.5f, 3, 0.5f);
    Token b = token(4, 0.5f, 5, 0.5f);
    std::vector<float> probs(a.probs);
    probs.insert(probs.end(), b.probs.begin(), b.probs.end());
    std::vector<int32_t> ids = {2, 3, 4, 5};
    std::vector<float> w = {0.5f, 0.5f, 0.5f, 0.5f};
    std::vector<int32_t> out_ids(4), out_slots(4);
    std::vector<moecache_copy> plan(4);
    int32_t n_plan = 0;
    int32_t rc = moecache_route(c, 0, 2, probs.data(), ids.data(), w.data(), out_ids.data(),
                                out_slots.data(), plan.data(), 1, &n_plan);
    CHECK(rc == MOECACHE_E_PLAN_CAP);
    rc = moecache_route(c, 0, 2, probs.data(), ids.data(), w.data(), out_ids.data(),
                        out_slots.data(), plan.data(), 4, &n_plan);
    CHECK(rc == MOECACHE_E_NO_SLOT);
    std::vector<int32_t> expert_of(2);
    moecache_layer_slots(c, 0, expert_of.data());
    CHECK(expert_of[0] == 0 && expert_of[1] == 1);
    moecache_layer_stats s{};
    moecache_get_layer_stats(c, 0, &s);
    CHECK(s.tokens == 1);
    moecache_destroy(c);
}

void test_resize_compacts() {
    moecache * c = moecache_create(1, kExperts, kTopK, 6, nullptr);
    route(c, 0, token(0, 0.5f, 1, 0.5f));
    route(c, 0, token(2, 0.5f, 3, 0.5f));
    route(c, 0, token(4, 0.5f, 5, 0.5f));
    route(c, 0, token(4, 0.5f, 5, 0.5f));
    route(c, 0, token(0, 0.5f, 1, 0.5f)); /* LRU now: 2, 3 oldest */
    CHECK(moecache_set_slots(c, 4) == MOECACHE_OK);
    CHECK(moecache_get_slots(c) == 4);
    std::vector<int32_t> expert_of(4);
    moecache_layer_slots(c, 0, expert_of.data());
    CHECK(expert_of[0] == 0 && expert_of[1] == 1 && expert_of[2] == 4 && expert_of[3] == 5);
    CHECK(moecache_set_slots(c, 1) == MOECACHE_E_ARG);
    CHECK(moecache_set_slots(c, 8) == MOECACHE_OK);
    std::vector<int32_t> grown(8);
    moecache_layer_slots(c, 0, grown.data());
    CHECK(grown[4] == -1 && grown[7] == -1 && grown[3] == 5);
    moecache_destroy(c);
}

void test_events_match_stats() {
    moecache_policy p = preset("substitute-all");
    moecache * c = moecache_create(1, kExperts, kTopK, 4, &p);
    for (int i = 0; i < 6; ++i) {
        moecache_begin_step(c);
        route(c, 0, token(i, 0.6f, i + 5, 0.4f));
    }
    std::vector<moecache_event> rows(16);
    const int32_t n = moecache_drain_events(c, rows.data(), 16);
    CHECK(n == 6);
    double mass = 0.0;
    int64_t subs = 0;
    for (int i = 0; i < n; ++i) {
        mass += static_cast<double>(rows[i].substituted_mass);
        subs += rows[i].n_substitute;
        CHECK(rows[i].step == i + 1);
    }
    moecache_layer_stats s{};
    moecache_get_layer_stats(c, 0, &s);
    CHECK(s.substituted_mass == mass);
    CHECK(s.substitutions == subs);
    CHECK(moecache_drain_events(c, rows.data(), 16) == 0);
    moecache_destroy(c);
}

}  // namespace

int main() {
    test_presets();
    test_create_rejects_bad_shapes();
    test_fetch_then_hit();
    test_threshold_substitutes_small_miss();
    test_lru_evicts_least_recent();
    test_batch_without_room_changes_nothing();
    test_resize_compacts();
    test_events_match_stats();
    if (g_failures != 0) {
        std::fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("test_moecache: all checks passed (%s)\n", moecache_version());
    return 0;
}
