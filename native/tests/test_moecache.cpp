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

/* fill_free: while a slot is free a miss is fetched into it whatever the rule; at a budget
 * holding every expert nothing is ever substituted. Off, the rule alone decides. */
void test_free_slots_fill_first() {
    for (const int32_t fill : {1, 0}) {
        moecache_policy p = preset("first-choice");
        CHECK(p.fill_free == 1);
        p.fill_free = fill;
        moecache * c = moecache_create(1, kExperts, kTopK, 4, &p);
        route(c, 0, token(0, 0.9f, 1, 0.1f)); /* nothing resident: both fetched either way */
        Result r = route(c, 0, token(2, 0.9f, 3, 0.1f));
        moecache_layer_stats s{};
        moecache_get_layer_stats(c, 0, &s);
        if (fill) { /* two slots free: 3 is fetched */
            CHECK(r.plan.size() == 2 && r.out_ids[1] == 3 && s.substitutions == 0);
        } else { /* 3 is not the first choice: a resident stands in */
            CHECK(r.plan.size() == 1 && r.out_ids[1] != 3 && s.substitutions == 1);
        }
        moecache_destroy(c);
    }
    moecache_policy p = preset("speed-first");
    moecache * c = moecache_create(1, kExperts, kTopK, kExperts, &p);
    for (int i = 0; i < 40; ++i) {
        moecache_begin_step(c);
        route(c, 0, token((i * 7) % kExperts, 0.8f, (i * 7 + 3) % kExperts, 0.2f));
    }
    moecache_layer_stats s{};
    moecache_get_layer_stats(c, 0, &s);
    CHECK(s.substitutions == 0 && s.fetches == kExperts && s.hits == 80 - kExperts);
    moecache_destroy(c);
    p.fill_free = 2;
    CHECK(moecache_create(1, kExperts, kTopK, 4, &p) == nullptr);
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

void test_ram_tier_off_by_default() {
    moecache * c = moecache_create(1, kExperts, kTopK, 4, nullptr);
    CHECK(moecache_get_ram_slots(c) == 0);
    Result r = route(c, 0, token(3, 0.7f, 5, 0.3f));
    CHECK(r.plan.size() == 2 && r.plan[0].ram_slot == -1 && r.plan[0].from_disk == 0);
    CHECK(moecache_set_ram_slots(c, 1) == MOECACHE_E_ARG); /* below top-k */
    CHECK(moecache_set_ram_slots(c, kExperts + 1) == MOECACHE_E_ARG);
    moecache_destroy(c);
}

/* Slots 2, RAM tier 3: a miss not in RAM is read from disk into a RAM slot; after the slot
 * evicted it, the next miss of it is served from RAM; the RAM tier evicts by LRU. */
void test_ram_tier_serves_and_evicts() {
    moecache * c = moecache_create(1, kExperts, kTopK, 2, nullptr);
    moecache_set_expert_bytes(c, 0, 10);
    CHECK(moecache_set_ram_slots(c, 3) == MOECACHE_OK);
    Result r = route(c, 0, token(0, 0.5f, 1, 0.5f));
    CHECK(r.plan.size() == 2);
    CHECK(r.plan[0].from_disk == 1 && r.plan[0].ram_slot == 0);
    CHECK(r.plan[1].from_disk == 1 && r.plan[1].ram_slot == 1);
    r = route(c, 0, token(2, 0.5f, 3, 0.5f)); /* 2 -> RAM slot 2, 3 evicts 0 (LRU) */
    CHECK(r.plan.size() == 2 && r.plan[0].from_disk == 1 && r.plan[0].ram_slot == 2);
    CHECK(r.plan[1].from_disk == 1 && r.plan[1].ram_slot == 0);
    std::vector<int32_t> ram(kExperts);
    moecache_layer_ram(c, 0, ram.data());
    CHECK(ram[0] == -1 && ram[1] == 1 && ram[2] == 2 && ram[3] == 0);
    /* 1 is in RAM (a copy); 0 is read again, into the least recent unpinned RAM slot (2's) */
    r = route(c, 0, token(1, 0.5f, 0, 0.5f));
    CHECK(r.plan.size() == 2 && r.plan[0].from_disk == 0 && r.plan[0].ram_slot == 1);
    CHECK(r.plan[1].from_disk == 1 && r.plan[1].ram_slot == 2);
    moecache_layer_stats s{};
    moecache_get_layer_stats(c, 0, &s);
    CHECK(s.disk_fills == 5 && s.ram_fills == 1 && s.bytes_disk == 50 && s.ram_evictions == 2);
    moecache_event rows[8];
    const int32_t n = moecache_drain_events(c, rows, 8);
    CHECK(n == 3 && rows[0].n_disk == 2 && rows[0].bytes_disk == 20 && rows[2].n_disk == 1);
    CHECK(rows[2].tier[0] == 1 && rows[2].tier[1] == 2 && rows[0].tier[0] == 2);
    /* shrinking drops the least recent (3) and compacts 0 into RAM slot 0 */
    CHECK(moecache_set_ram_slots(c, 2) == MOECACHE_OK);
    moecache_layer_ram(c, 0, ram.data());
    CHECK(ram[0] == 0 && ram[1] == 1 && ram[2] == -1 && ram[3] == -1);
    moecache_clear(c);
    moecache_layer_ram(c, 0, ram.data());
    CHECK(ram[1] == -1 && ram[2] == -1);
    moecache_destroy(c);
}

/* The threshold rule with a disk threshold (0.3): a disk-only miss below it is substituted
 * where a miss in RAM with the same weight (>= theta 0.15) is fetched. Quality-first itself
 * keeps theta for both. */
void test_theta_disk() {
    CHECK(preset("quality-first").theta_disk == MOECACHE_THETA_DISK_AS_THETA);
    moecache_policy p = preset("quality-first");
    p.theta_disk = MOECACHE_SUGGESTED_THETA_DISK;
    moecache * c = moecache_create(1, kExperts, kTopK, 2, &p);
    CHECK(moecache_set_ram_slots(c, 4) == MOECACHE_OK);
    route(c, 0, token(0, 0.5f, 1, 0.5f));
    route(c, 0, token(2, 0.5f, 3, 0.5f)); /* RAM: 0 1 2 3; slots: 2 3 */
    Result r = route(c, 0, token(2, 0.8f, 9, 0.2f)); /* 9 only on disk: substituted */
    CHECK(r.plan.empty() && r.out_ids[1] == 3);
    r = route(c, 0, token(2, 0.8f, 0, 0.2f)); /* 0 in RAM: fetched */
    CHECK(r.plan.size() == 1 && r.plan[0].expert == 0 && r.plan[0].from_disk == 0);
    p.theta_disk = 1.5f;
    CHECK(moecache_set_policy(c, &p) == MOECACHE_E_ARG);
    p.theta_disk = MOECACHE_THETA_DISK_AS_THETA;
    CHECK(moecache_set_policy(c, &p) == MOECACHE_OK);
    moecache_destroy(c);
}

/* The audit route fetches every miss into scratch slots and changes nothing. */
void test_audit_route_changes_nothing() {
    moecache_policy p;
    moecache_preset("speed-first", &p);
    p.fill_free = 0; /* the rule alone: a free slot would take the small miss below */
    moecache * c = moecache_create(1, kExperts, kTopK, 4, &p);
    moecache_begin_step(c);
    route(c, 0, token(0, 0.5f, 1, 0.5f));
    moecache_layer_stats before{};
    moecache_get_layer_stats(c, 0, &before);
    std::vector<int32_t> slots_before(kExperts);
    moecache_layer_experts(c, 0, slots_before.data());
    const int32_t pending = moecache_events_pending(c);
    const int32_t ids[kTopK] = {1, 7};
    int32_t out_slots[kTopK] = {-9, -9};
    moecache_copy plan[kTopK];
    int32_t n_plan = -1;
    CHECK(moecache_audit_route(c, 0, 1, ids, out_slots, plan, kTopK, &n_plan) == MOECACHE_OK);
    CHECK(n_plan == 1 && plan[0].expert == 7 && plan[0].slot == 4 && plan[0].async == 0);
    CHECK(plan[0].ram_slot == -1 && plan[0].from_disk == 0);
    CHECK(out_slots[0] == slots_before[1] && out_slots[1] == 4);
    moecache_layer_stats after{};
    moecache_get_layer_stats(c, 0, &after);
    std::vector<int32_t> slots_after(kExperts);
    moecache_layer_experts(c, 0, slots_after.data());
    CHECK(std::memcmp(&before, &after, sizeof before) == 0);
    CHECK(slots_before == slots_after && moecache_events_pending(c) == pending);
    CHECK(moecache_step(c) == 1);
    /* the policy's next decision is what it would have been without the audit */
    Result r = route(c, 0, token(1, 0.8f, 7, 0.2f));
    CHECK(r.out_ids[1] != 7); /* speed-first substitutes the small miss */
    const int32_t bad[kTopK] = {1, kExperts};
    CHECK(moecache_audit_route(c, 0, 1, bad, out_slots, plan, kTopK, &n_plan) == MOECACHE_E_ARG);
    CHECK(moecache_audit_route(c, 0, 1, ids, out_slots, plan, 0, &n_plan) == MOECACHE_E_PLAN_CAP);
    moecache_destroy(c);
}

int main() {
    /* the Python mirror (moescope.core.native) checks the same sizes */
    static_assert(sizeof(moecache_event) == 912, "moecache_event layout");
    static_assert(sizeof(moecache_copy) == 24, "moecache_copy layout");
    static_assert(sizeof(moecache_layer_stats) == 17 * 8, "moecache_layer_stats layout");
    test_presets();
    test_create_rejects_bad_shapes();
    test_fetch_then_hit();
    test_threshold_substitutes_small_miss();
    test_free_slots_fill_first();
    test_lru_evicts_least_recent();
    test_batch_without_room_changes_nothing();
    test_resize_compacts();
    test_events_match_stats();
    test_ram_tier_off_by_default();
    test_ram_tier_serves_and_evicts();
    test_theta_disk();
    test_audit_route_changes_nothing();
    if (g_failures != 0) {
        std::fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("test_moecache: all checks passed (%s)\n", moecache_version());
    return 0;
}
