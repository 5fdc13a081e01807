"""XTC and mirostat in the engine's sampler chain, as llama.cpp's chain has them: XTC after
min-p, also before a greedy pick; mirostat after the temperature (llama-cpp-python left
the temperature out)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from moescope.engine import Engine, Sampling
from moescope.util.errors import MoEScopeError
from moescope.util.resources import demo_model_path

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def demo() -> Iterator[Engine]:
    e = Engine()
    e.load(demo_model_path(), n_ctx=256, n_threads=1, policy="exact")
    yield e
    e.close()


def _text(e: Engine, **kw: object) -> list[int]:
    kw.setdefault("seed", 3)
    return [t.token_id for t in e.generate("ROMEO:", Sampling(max_tokens=12, **kw))]  # type: ignore[arg-type]


def test_xtc_leaves_the_top_choices_out_of_a_greedy_pick(demo: Engine) -> None:
    greedy = _text(demo, temperature=0)
    assert _text(demo, temperature=0, xtc_probability=1.0, xtc_threshold=0.01) != greedy
    # a threshold above 0.5 or a probability of 0 leaves it off, as in llama.cpp
    assert _text(demo, temperature=0, xtc_probability=1.0, xtc_threshold=0.6) == greedy
    assert _text(demo, temperature=0, xtc_probability=0.0, xtc_threshold=0.01) == greedy
    # the same again: XTC's draw is seeded (and at probability 1 always happens)
    assert _text(demo, temperature=0, xtc_probability=1.0, xtc_threshold=0.01) == \
        _text(demo, temperature=0, xtc_probability=1.0, xtc_threshold=0.01)


def test_xtc_applies_when_sampling_too(demo: Engine) -> None:
    plain = {tuple(_text(demo, temperature=0.7, seed=s)) for s in range(4)}
    xtc = {tuple(_text(demo, temperature=0.7, seed=s, xtc_probability=1.0,
                       xtc_threshold=0.01)) for s in range(4)}
    assert not plain & xtc


def test_mirostat_follows_the_temperature(demo: Engine) -> None:
    """A near-zero temperature before mirostat makes its pick the likeliest token (it
    was ignored: mirostat at a high target sampled freely)."""
    greedy = _text(demo, temperature=0)
    assert _text(demo, temperature=0.01, mirostat=2, mirostat_tau=9.0) == greedy
    assert _text(demo, temperature=0.01, mirostat=1, mirostat_tau=9.0) == greedy
    free = {tuple(_text(demo, temperature=1.0, mirostat=2, mirostat_tau=9.0, seed=s))
            for s in range(4)}
    assert free - {tuple(greedy)}


@pytest.mark.parametrize(("field", "value"), [
    ("xtc_probability", 1.5), ("xtc_probability", float("nan")), ("xtc_threshold", -0.1),
    ("mirostat", 3), ("mirostat", 1.0), ("mirostat_tau", 1e9), ("mirostat_eta", 2.0)])
def test_out_of_bounds_values_are_one_line_errors(demo: Engine, field: str,
                                                  value: float) -> None:
    with pytest.raises(MoEScopeError) as err:
        _text(demo, temperature=0, **{field: value})
    assert field in str(err.value) and "\n" not in str(err.value)
