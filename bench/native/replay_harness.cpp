/*
 * replay_harness.cpp: the batch replay's decision loop timed natively, for
 * bench/replay_loop_bench.py (which builds it against the core's sources of two revisions
 * and runs them side by side). Reads a routing dumped by that script (DIR/meta.json is
 * read there; the dimensions come as arguments), makes the replay plan once, then times
 * moecache_replay_batch_plan over the given configurations on one thread.
 *
 *   replay_harness DIR N_LAYERS N_EXPERTS TOP_K PRED_WIDTH POLICIES SLOTS REPS
 *
 * POLICIES: comma-separated preset names, all at SLOTS. Prints
 *   ns_per_row=<best CPU time / (configurations * rows)> check=<a sum of the results>
 * so that two builds can be compared for speed and, through `check`, for equal results.
 */
#include "moecache.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

namespace {

template <class T>
std::vector<T> load(const std::string & dir, const char * name) {
    const std::string path = dir + "/" + name + ".bin";
    FILE * f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) {
        std::perror(path.c_str());
        std::exit(2);
    }
    std::fseek(f, 0, SEEK_END);
    const long n = std::ftell(f);
    std::fseek(f, 0, SEEK_SET);
    std::vector<T> v(static_cast<size_t>(n) / sizeof(T));
    if (std::fread(v.data(), 1, static_cast<size_t>(n), f) != static_cast<size_t>(n)) {
        std::fprintf(stderr, "%s: short read\n", path.c_str());
        std::exit(2);
    }
    std::fclose(f);
    return v;
}

double cpu_seconds() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc != 9) {
        std::fprintf(stderr, "usage: %s DIR N_LAYERS N_EXPERTS TOP_K PRED_WIDTH POLICIES SLOTS REPS\n",
                     argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    const auto expert_bytes = load<int64_t>(dir, "expert_bytes");
    const auto probs = load<float>(dir, "probs");
    const auto ids = load<int32_t>(dir, "ids");
    const auto weights = load<float>(dir, "weights");
    const auto next_layer = load<int32_t>(dir, "next_layer");
    const auto predicted = load<int32_t>(dir, "predicted");
    const auto call_step = load<int64_t>(dir, "call_step");
    const auto call_layer = load<int32_t>(dir, "call_layer");
    const auto call_start = load<int64_t>(dir, "call_start");
    const auto call_stop = load<int64_t>(dir, "call_stop");
    const auto token_calls = load<int64_t>(dir, "token_calls");
    const auto ranks = load<uint16_t>(dir, "ranks");
    const auto rank_counts = load<uint8_t>(dir, "rank_counts");
    const auto selected = load<float>(dir, "selected_probs");
    moecache_replay_trace t{};
    t.n_layers = std::atoi(argv[2]);
    t.n_experts = std::atoi(argv[3]);
    t.top_k = std::atoi(argv[4]);
    t.pred_width = std::atoi(argv[5]);
    t.start_slots = t.n_experts;
    moecache_preset("exact", &t.start_policy);
    t.expert_bytes = expert_bytes.data();
    t.n_rows = static_cast<int64_t>(next_layer.size());
    t.probs = probs.data();
    t.ids = ids.data();
    t.weights = weights.data();
    t.next_layer = next_layer.data();
    t.predicted = t.pred_width > 0 ? predicted.data() : nullptr;
    t.n_calls = static_cast<int64_t>(call_step.size());
    t.call_step = call_step.data();
    t.call_layer = call_layer.data();
    t.call_start = call_start.data();
    t.call_stop = call_stop.data();
    t.n_tokens = static_cast<int64_t>(token_calls.size()) - 1;
    t.token_calls = token_calls.data();
    t.ranks = ranks.data();
    t.rank_counts = rank_counts.data();
    t.selected_probs = selected.data();
    std::vector<moecache_replay_config> configs;
    const std::string names = argv[6];
    for (size_t a = 0; a <= names.size();) {
        size_t b = names.find(',', a);
        if (b == std::string::npos) {
            b = names.size();
        }
        moecache_replay_config c{};
        if (moecache_preset(names.substr(a, b - a).c_str(), &c.policy) != MOECACHE_OK) {
            std::fprintf(stderr, "unknown policy %s\n", names.substr(a, b - a).c_str());
            return 2;
        }
        c.slots = std::atoi(argv[7]);
        configs.push_back(c);
        a = b + 1;
    }
    const int reps = std::max(1, std::atoi(argv[8]));
    moecache_replay_plan * plan = moecache_replay_plan_new(&t, 1);
    if (plan == nullptr) {
        std::fprintf(stderr, "the core refused the trace\n");
        return 1;
    }
    std::vector<moecache_replay_token> out(configs.size() * static_cast<size_t>(t.n_tokens));
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
        const double t0 = cpu_seconds();
        const int32_t code = moecache_replay_batch_plan(&t, plan, configs.data(),
                                                        static_cast<int32_t>(configs.size()), 1,
                                                        out.data(), nullptr, nullptr);
        const double dt = cpu_seconds() - t0;
        if (code != MOECACHE_OK) {
            std::fprintf(stderr, "replay failed: %d\n", code);
            return 1;
        }
        best = std::min(best, dt);
    }
    long long check = 0;
    for (const moecache_replay_token & o : out) {
        check += o.hits * 3 + o.fetches * 7 + o.substitutions * 11 + o.admissions * 13 +
                 o.prefetches * 17 + o.prefetch_hits * 19 +
                 static_cast<long long>(o.substituted_mass * 1e6);
    }
    std::printf("ns_per_row=%.1f check=%lld\n",
                best / (static_cast<double>(configs.size()) * static_cast<double>(t.n_rows)) * 1e9,
                check);
    moecache_replay_plan_free(plan);
    return 0;
}
