"""The recorder keeps a token's router inputs as blocks (``RouteBlock``): the Arrow writer
copies them at once, everything else reads them as the row -> ``RouterInput`` mapping they
stand for. Both readings must give the same trace, byte for byte."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from moescope.trace import RouteBlock, TraceRecorder, read_trace
from moescope.trace.arrow_format import row_schema, token_batch

PROMPT = "The quick brown fox jumps over the lazy dog and keeps on running."


def _live_records(synth_model: Callable[..., Path], tmp_path: Path, policy: str) -> list[Any]:
    """A session's records as the recorder hands them to its writer."""
    from moescope.engine import Engine, Sampling

    engine = Engine()
    records: list[Any] = []
    try:
        engine.load(synth_model("qwen3moe"), budget="25%", policy=policy, n_ctx=256,
                    n_threads=1)
        recorder = TraceRecorder.for_engine(tmp_path / "t.arrows", engine)
        sampling = Sampling(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0,
                            repeat_penalty=1.0, max_tokens=12, seed=3)
        for stats in engine.generate(PROMPT, sampling):
            records.append(recorder.record(stats, engine))
        recorder.close()
        return records
    finally:
        engine.close()


@pytest.mark.usefixtures("engine_required")
@pytest.mark.parametrize("policy", ["quality-first", "psr"])
def test_a_block_writes_the_same_batch_as_its_rows(synth_model: Callable[..., Path],
                                                   tmp_path: Path, policy: str) -> None:
    records = _live_records(synth_model, tmp_path, policy)
    header = read_trace(tmp_path / "t.arrows").header  # what the writer had
    schema = row_schema(header)
    blocks = [r for r in records if isinstance(r.routes, RouteBlock) and len(r.routes)]
    assert len(blocks) >= 10  # every decode token's layers are blocks
    predicted = 0
    for record in blocks:
        as_block, meta = token_batch(record, header, schema)
        rows = dict(record.routes.items())  # the same inputs, one RouterInput a row
        for row, route in rows.items():
            assert record.events["layer"][row] >= 0
            assert route.probs.shape == (header.model.n_expert,)
            predicted += route.predicted is not None
        record.routes = rows
        as_rows, meta_rows = token_batch(record, header, schema)
        assert as_block.equals(as_rows)
        assert meta == meta_rows
    assert predicted > 0  # recorded whatever the policy: a what-if may prefetch


def test_the_mapping_reads_each_row_and_only_those() -> None:
    rows = np.array([1, 4], dtype=np.intp)
    block = RouteBlock(rows, np.ones((2, 8), np.float32), np.full((2, 2), 0.5, np.float32),
                       np.array([[0, 1], [2, 3]], np.int32), np.array([-1, 5], np.int32),
                       np.array([[0, 0, 0], [7, 6, 5]], np.int32), np.array([0, 3], np.int32))
    assert list(block) == [1, 4] and len(block) == 2 and 4 in block and 0 not in block
    assert block[1].predicted is None and block[1].next_layer == -1
    assert block[4].predicted.tolist() == [7, 6, 5] and block[4].next_layer == 5
    assert block[4].ids.tolist() == [2, 3] and block[4].row == 4
    with pytest.raises(KeyError):
        block[2]
