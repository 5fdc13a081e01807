"""What streaming an answer costs the GUI thread: Markdown, code colours and thoughts.

The chat view renders a streaming answer at most once per display frame; every
millisecond it spends there is a millisecond the window cannot repaint plots or take
keys. This benchmark streams the same long answer (headings, lists, nine fenced code
blocks in Python, JavaScript and bash) through the real ``ChatView`` in three variants,
round-robin so that machine noise hits all alike:

* ``plain``: code colours off (``highlight_runs`` returns nothing), no thoughts;
* ``coloured``: as the app runs, code colours on;
* ``thinking``: code colours on, and the answer preceded by 2,000 characters of
  ``<think>`` thoughts (streamed under "Thinking…", then folded).

Per variant: the whole stream's render time, the median and the worst single frame, and
the final render of the finished message (what "answer finished" costs). Medians over
``--reps`` runs; ratios to ``plain``. Usage::

    QT_QPA_PLATFORM=offscreen .venv/bin/python bench/chat_render_bench.py --reps 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

PY = '''import os
from dataclasses import dataclass

@dataclass
class Budget:
    """Slots per layer."""
    slots: int = 4
    name: str = "quality-first"

    def halve(self, factor: float = 0.5) -> int:
        if self.slots <= 1:
            return 1  # never zero
        return int(self.slots * factor) + len(os.sep)
'''
JS = '''const cache = new Map();
function fetchExpert(layer, expert) {
  const key = `${layer}:${expert}`;
  if (cache.has(key)) { return cache.get(key); }
  return { layer, expert, bytes: 4096 * 2 };
}
'''
SH = '''#!/usr/bin/env bash
set -euo pipefail
for model in "$HOME"/models/*.gguf; do
  moescope bench "$model" --budget 25% | tee -a log.txt
done
'''


def answer() -> str:
    parts = []
    for i in range(3):
        parts += [f"## Part {i}\n\nHere is **how** it works, with `inline` code and a "
                  "[link](https://example.com).\n\n- one\n- two\n\n",
                  "```python\n" + PY * 3 + "```\n\n", "Then:\n\n```js\n" + JS * 2 + "```\n\n",
                  "And run it:\n\n```bash\n" + SH + "```\n\n"]
    return "".join(parts) + "Done.\n"


THOUGHTS = ("The user wants to know how the cache works. I should explain slots, then "
            "show code in three languages, and keep it short. ") * 16


def stream(view: object, text: str, chunk: int) -> tuple[float, float, float]:
    """Stream ``text`` in ``chunk``-character frames; (total, median frame, worst)."""
    view.begin_answer()  # type: ignore[attr-defined]
    costs = []
    for start in range(0, len(text), chunk):
        view.append_text(text[start:start + chunk])  # type: ignore[attr-defined]
        view._render_after = 0.0  # type: ignore[attr-defined]  # every frame renders here
        t = time.perf_counter()
        view.flush()  # type: ignore[attr-defined]
        view.transcript.document().size()  # type: ignore[attr-defined]  # layout too
        costs.append(time.perf_counter() - t)
    return sum(costs), statistics.median(costs), max(costs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--chunk", type=int, default=120, help="characters per frame")
    args = parser.parse_args()

    from moescope.gui.app import create_app
    from moescope.gui.chat import highlight, markdown
    from moescope.gui.chat.chat_view import ChatView
    from moescope.session.store import ChatStore

    create_app([])
    coloured_runs = markdown.highlight_runs
    store = ChatStore(Path(tempfile.mkdtemp()) / "bench.db")
    chat = store.create_chat("bench", "", "")
    text = answer()
    variants = {"plain": text, "coloured": text,
                "thinking": f"<think>\n{THOUGHTS}\n</think>\n\n{text}"}
    results: dict[str, list[tuple[float, float, float, float]]] = {v: [] for v in variants}
    for rep in range(args.reps + 1):  # the first round warms up (fonts, lexers)
        order = list(variants)[rep % 3:] + list(variants)[:rep % 3]
        for name in order:
            markdown.highlight_runs = ((lambda _lang, _code: ()) if name == "plain"
                                       else coloured_runs)
            highlight.highlight_runs.cache_clear()
            view = ChatView()
            view.resize(900, 700)
            total, median, worst = stream(view, variants[name], args.chunk)
            message = store.add_message(chat.id, "assistant", variants[name])
            t = time.perf_counter()
            view.render([message])
            view.transcript.document().size()
            final = time.perf_counter() - t
            if rep:
                results[name].append((total, median, worst, final))
            view.deleteLater()
    markdown.highlight_runs = coloured_runs
    frames = -(-len(text) // args.chunk)
    print(f"answer: {len(text)} characters, {text.count('```') // 2} code blocks, "
          f"{frames} frames of {args.chunk} characters (thinking: +{len(THOUGHTS)} "
          f"characters of thoughts); medians of {args.reps} runs, round-robin")
    print("| variant | stream total ms | median frame ms | worst frame ms | final render ms "
          "| total vs plain |")
    print("|---|---|---|---|---|---|")
    base = statistics.median(r[0] for r in results["plain"])
    for name, rows in results.items():
        med = [statistics.median(r[i] for r in rows) * 1e3 for i in range(4)]
        print(f"| {name} | {med[0]:.1f} | {med[1]:.2f} | {med[2]:.1f} | {med[3]:.1f} "
              f"| {med[0] / (base * 1e3):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
