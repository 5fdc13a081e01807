/*
 * events.cpp — the event ring: one row per (step, layer, token) that the caller drains.
 *
 * The GUI and the trace writer read decisions in bulk after each token instead of taking a
 * callback per layer. When nobody drains, the newest rows win: a new row overwrites the
 * oldest, and each overwritten row is counted so a reader knows what it missed.
 */
#include "moecache_internal.h"

#include <algorithm>

namespace moecache_core {

moecache_event * EventRing::push() {
    const int64_t capacity = static_cast<int64_t>(rows.size());
    if (capacity == 0) {
        return nullptr;
    }
    if (count == capacity) {
        head = (head + 1) % capacity;
        count -= 1;
        dropped += 1;
    }
    moecache_event * row = &rows[(head + count) % capacity];
    count += 1;
    return row;
}

int32_t EventRing::drain(moecache_event * out, int32_t cap) {
    if (out == nullptr || cap <= 0 || count == 0) {
        return 0;
    }
    const int64_t capacity = static_cast<int64_t>(rows.size());
    const int32_t n = static_cast<int32_t>(std::min<int64_t>(cap, count));
    for (int32_t i = 0; i < n; ++i) {
        out[i] = rows[(head + i) % capacity];
    }
    head = (head + n) % capacity;
    count -= n;
    return n;
}

void EventRing::set_capacity(int32_t capacity) {
    const int64_t keep = std::min<int64_t>(count, std::max(capacity, 0));
    std::vector<moecache_event> kept(static_cast<size_t>(std::max(capacity, 0)));
    const int64_t old_capacity = static_cast<int64_t>(rows.size());
    const int64_t skip = count - keep;
    for (int64_t i = 0; i < keep; ++i) {
        kept[i] = rows[(head + skip + i) % old_capacity];
    }
    dropped += skip;
    rows.swap(kept);
    head = 0;
    count = keep;
}

}  // namespace moecache_core
