"""A new user's reading of the trace window (review 9): every number in the what-if table
is explained where it is shown, a stopped sweep says which cost model its points were
priced with, and an export's status line is short enough to be read whole."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from gui_helpers import export_shown
from PySide6.QtGui import QFontMetrics

from moescope.display.whatif_model import COLUMNS
from moescope.gui.cache.memory_view import TRACE_NOTE
from moescope.gui.cache.panel import CachePanel
from moescope.gui.traces.trace_export import saved_message
from moescope.gui.traces.trace_window import TraceWindow
from moescope.gui.traces.whatif_view import REPLAY_TEXT, WhatIfView
from moescope.trace import read_trace


def _open_whatif(qtbot: Any, window: TraceWindow) -> WhatIfView:
    view = window.whatif
    with qtbot.waitSignal(view.sweepFinished, timeout=15_000):
        window.tabs.setCurrentWidget(view)
    return view


def test_every_column_of_the_what_if_table_says_what_its_numbers_are(
        qtbot: Any, trace_window: TraceWindow, trace_path: Path) -> None:
    view = _open_whatif(qtbot, trace_window)
    n_layers = read_trace(trace_path).header.model.n_layers
    tips = {key: view.table.horizontalHeaderItem(c).toolTip()
            for c, (key, _) in enumerate(COLUMNS)}
    assert all(len(line) <= 64 for tip in tips.values() for line in tip.split("\n"))
    tips = {key: tip.replace("\n", " ") for key, tip in tips.items()}
    assert all(tips.values()), tips
    assert len(set(tips.values())) == len(COLUMNS)
    # the column whose values exceed 1: it sums the layers, and says how many
    assert f"summed over the {n_layers} MoE layers" in tips["mass_per_token"]
    masses = [r.mass_per_token for r in view.result.points()] if view.result else []
    assert masses and max(masses) <= n_layers
    axis = view.plot.getPlotItem().getAxis("bottom").labelText
    assert axis == f"substituted gate mass / token (summed over {n_layers} MoE layers)"
    assert "empty cache" in tips["budget"]  # why a 100% budget still misses
    assert "cost model" in tips["est_ms_per_token"]


def test_a_stopped_sweep_names_the_cost_model_of_the_points_it_left(
        qtbot: Any, trace_window: TraceWindow) -> None:
    view = _open_whatif(qtbot, trace_window)
    assert view.result is not None and view.result.cost_name == "pcie4"
    shown = view.table.item(0, [k for k, _ in COLUMNS].index("est_ms_per_token")).text()
    # picking pcie5 starts its sweep; stopped before its answer can arrive (queued to this
    # thread, which has not returned to its event loop)
    view.cost.setCurrentIndex(view.cost.findData("pcie5"))
    assert view.running
    view.stop()
    assert view.stop_button.text() == REPLAY_TEXT
    said = view.status.text()
    assert "priced by the pcie4 cost model, not pcie5" in said, said
    assert view.status.toolTip()  # the modelled-vs-measured explanation stays
    qtbot.wait(300)  # a stale answer, if any came, changes nothing
    assert view.result.cost_name == "pcie4"
    assert view.table.item(0, [k for k, _ in COLUMNS].index("est_ms_per_token")).text() == shown
    # stopping a sweep of the cost model the points have says no "not"
    view.start("pcie4")
    assert view.running
    view.stop()
    assert view.status.text().endswith("priced by the pcie4 cost model."), view.status.text()


def test_the_saved_line_of_a_journal_copy_fits_a_laptop_status_bar(
        trace_window: TraceWindow) -> None:
    """A session's default name spelt three times pushed the journal's hint (how to get
    Parquet) past the right edge of a 1366-pixel screen, where a status bar clips it."""
    stem = "20261201-233603-moescope-demo-qwen3moe"
    folder = Path("/home/alice/Documents")
    files = (folder / f"{stem}.arrows", folder / f"{stem}.perfetto.json",
             folder / f"{stem}.tokens.csv")
    said = saved_message(Path(f"/data/traces/{stem}.parquet"), files)  # still a journal
    assert said.startswith(f"Saved {files[0]} with its .perfetto.json and "
                           ".tokens.csv (an Arrow stream"), said
    assert "`moescope trace compact` makes it Parquet)" in said
    width = QFontMetrics(trace_window.statusBar().font()).horizontalAdvance(said)
    assert width <= 1366 - 40, (width, said)
    # a finished trace's copy: no hint; side files named otherwise are spelt out
    plain = saved_message(Path(f"{stem}.parquet"), (folder / "a.parquet",
                                                    folder / "b.perfetto.json",
                                                    folder / "b.tokens.csv"))
    assert plain == (f"Saved {folder / 'a.parquet'} with its b.perfetto.json and "
                     "b.tokens.csv")


def test_the_status_says_how_many_tokens_the_rows_average(
        qtbot: Any, trace_window: TraceWindow, trace_path: Path) -> None:
    """The window's header counts every token; the rows average decode tokens only, as
    ``moescope replay`` says under its table ("397 decode tokens of 399")."""
    view = _open_whatif(qtbot, trace_window)
    trace = read_trace(trace_path)
    decode = sum(t.phase == "decode" for t in trace.tokens)
    assert 0 < decode < len(trace.tokens)  # a chat's answers begin with their prompts
    assert view.result is not None
    assert {r.tokens for r in view.result.points()} == {decode}
    assert (f"Every row averages the trace's {decode} decode tokens (of "
            f"{len(trace.tokens)})." in view.status.text()), view.status.text()


def test_a_reopened_traces_memory_tab_shows_the_trace_not_this_machine(
        qtbot: Any, trace_window: TraceWindow) -> None:
    """The trace window's Memory tab drew two empty charts (a trace records no memory
    samples) under this machine's engine build ("CPU build: no GPU found"), as if they
    described the recording."""
    panel = trace_window.panel
    view = panel.memory_view
    panel.tabs.setCurrentWidget(view)
    trace_window.show()
    qtbot.waitExposed(trace_window)
    panel.draw(force=True)
    assert not view.graphics.isVisible() and not view.backend_label.isVisible()
    assert view.label.isVisible() and view.label.text() == TRACE_NOTE
    assert view.tiers_label.isVisible()  # the trace's own numbers stay
    assert "VRAM slots:" in view.tiers_label.text()
    assert panel.memory.samples.count == 0  # nothing was sampled for it
    # a live panel over the same model keeps its charts and build line
    live = CachePanel(live=True)
    qtbot.addWidget(live)
    try:
        live.set_model(trace_window.reopened.model)
        view = live.memory_view
        assert not view.graphics.isHidden() and not view.backend_label.isHidden()
        assert view.label.text() != TRACE_NOTE
    finally:
        live.stop()


def test_an_export_whose_trace_went_bad_since_opening_blames_the_trace_not_the_output(
        qtbot: Any, open_trace_window: Any, trace_path: Path, tmp_path: Path) -> None:
    """A trace deleted after its window opened was reported as "OUT: No such file or
    directory" (the output was fine), and one cut short as "OUT: not a readable ..."."""
    shown = tmp_path / "shown.jsonl"
    shutil.copyfile(trace_path, shown)
    window = open_trace_window(shown)
    out = tmp_path / "out"
    out.mkdir()
    shown.unlink()
    assert export_shown(qtbot, window, out / "copy.jsonl") is None
    said = window.statusBar().currentMessage()
    assert said == (f"Could not export the trace: the trace {shown} can no longer be read "
                    "(No such file or directory). Nothing was written."), said
    assert list(out.iterdir()) == []

    shown.write_text('{"not a trace": 1}\n', encoding="utf-8")
    assert export_shown(qtbot, window, out / "copy.jsonl") is None
    said = window.statusBar().currentMessage()
    assert said.startswith("Could not export the trace: shown.jsonl: "), said
    assert "copy" not in said and "\n" not in said
    assert list(out.iterdir()) == []


def test_the_legend_sits_beside_the_points_not_over_them(
        qtbot: Any, trace_window: TraceWindow) -> None:
    """Inside the plot, the legend hid the points under its corner (substitute-all's, far
    right, at 1024x600); beside it, it hides none, and takes two columns when one would be
    taller than a laptop's plot."""
    trace_window.resize(980, 552)  # a 1024x600 screen's room
    view = _open_whatif(qtbot, trace_window)
    vb = view.plot.getPlotItem().vb

    def apart() -> bool:  # to the right of the points' box (a pixel's rounding aside)
        return view.legend.sceneBoundingRect().left() >= vb.sceneBoundingRect().right() - 1

    qtbot.waitUntil(apart, timeout=5_000)
    assert view.legend.columnCount == 1
    entries = len(view.legend.items)
    with qtbot.waitSignal(view.sweepFinished, timeout=15_000):
        view.set_policies(list(view.policy_actions))
    assert len(view.legend.items) > entries and view.legend.columnCount == 2
    qtbot.waitUntil(apart, timeout=5_000)
    bottom = view.plot.getPlotItem().getAxis("bottom")
    shown = view.plot.mapToScene(view.plot.viewport().rect()).boundingRect()
    assert shown.contains(bottom.sceneBoundingRect().center())  # the mass axis stays in view


def test_the_trace_windows_heatmap_gets_its_rows_height_once_shown(
        qtbot: Any, open_trace_window: Any, trace_path: Path) -> None:
    """The panel is filled before the window has a size, so the heatmap's fit was skipped
    and the splitter split half and half: at 1366x768 a 6-layer heatmap's rows were 7 px,
    their labels on top of each other."""
    window = open_trace_window(trace_path)
    window.resize(980, 720)
    panel = window.panel
    qtbot.waitExposed(window)

    def wanted() -> int:
        total = sum(panel.splitter.sizes())
        want = min(panel.heatmap.sizeHint().height(),
                   total - panel.tabs.minimumSizeHint().height())
        return max(want, panel.heatmap.minimumSizeHint().height())

    qtbot.waitUntil(lambda: panel.splitter.sizes()[0] == wanted(), timeout=5_000)


def test_exporting_onto_the_shown_trace_says_so_in_the_windows_words(
        qtbot: Any, open_trace_window: Any, trace_path: Path, tmp_path: Path) -> None:
    """Refused, as before, but said as "is an input of this command" (a command line's
    words) and naming the name typed, not the suffixed one that clashed."""
    shown = tmp_path / "shown.jsonl"
    shutil.copyfile(trace_path, shown)
    window = open_trace_window(shown)
    before = shown.read_bytes()
    link = tmp_path / "link.jsonl"
    link.symlink_to(shown)
    for typed, clash in ((shown, shown), (tmp_path / "shown.arrows", shown), (link, link)):
        assert export_shown(qtbot, window, typed) is None
        said = window.statusBar().currentMessage()
        assert said == (f"Could not export the trace: {clash} is the trace this window shows "
                        "(or a link to it); refusing to overwrite it. Nothing was written "
                        "there."), said
    assert shown.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.jsonl", "shown.jsonl"]
